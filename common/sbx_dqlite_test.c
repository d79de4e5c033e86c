/*  sbx_dqlite_test - the wire client against real dqlite nodes (a cluster of three of
    this process: membership, statements, every value type, rows over many batches,
    errors with SQLite's codes, a leader that stops), and against a node that answers
    what the protocol does not allow (a thread on a socket pair): each such answer fails
    the call cleanly and never crashes or over-reads. Test runner only.
*/
#include "sbx_dqlite.h"
#include "sbx_testcluster.h"

#include <assert.h>
#include <endian.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define streq(a, b) (strcmp ((a), (b)) == 0)

//  --------------------------------------------------------------------------
//  A node that misbehaves: reads whatever comes, answers with the bytes it is given.

typedef struct {
    int fd;
    const uint8_t *answer;
    size_t size;
} s_liar_t;

static void *s_liar (void *arg)
{
    s_liar_t *liar = arg;
    uint8_t buffer[4096];
    //  The version word and CLIENT: welcome them honestly (type 2, one word).
    ssize_t n = read (liar->fd, buffer, sizeof buffer);
    (void) n;
    uint8_t welcome[16] = {1, 0, 0, 0, 2, 0, 0, 0, 0x10, 0x27, 0, 0, 0, 0, 0, 0};
    if (write (liar->fd, welcome, sizeof welcome) != (ssize_t) sizeof welcome)
        return NULL;
    n = read (liar->fd, buffer, sizeof buffer);
    if (liar->size && write (liar->fd, liar->answer, liar->size) != (ssize_t) liar->size)
        return NULL;
    //  Then hang up (the client may be waiting for more).
    shutdown (liar->fd, SHUT_WR);
    while (read (liar->fd, buffer, sizeof buffer) > 0)
        ;
    return NULL;
}

static int s_dial_liar (const char *address, int timeout_ms, void *arg)
{
    (void) address;
    (void) timeout_ms;
    int *fd = arg;
    return *fd;
}

//  Runs query_sql against a liar answering bytes: the call's return and error code.
static int s_lie (const uint8_t *answer, size_t size, int *code)
{
    int pair[2];
    assert (socketpair (AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    s_liar_t liar = {pair[1], answer, size};
    pthread_t thread;
    assert (pthread_create (&thread, NULL, s_liar, &liar) == 0);
    sbx_dqlite_t *c = sbx_dqlite_connect ("liar", 500, s_dial_liar, &pair[0]);
    assert (c);
    sbx_dqlite_rows_t rows;
    int rc = sbx_dqlite_query_sql (c, "SELECT 1", &rows);
    *code = sbx_dqlite_errcode (c);
    if (rc == 0)
        sbx_dqlite_rows_free (&rows);
    else
        assert (!sbx_dqlite_usable (c) || *code < 0x10000);
    sbx_dqlite_destroy (&c); //  closes pair[0]
    pthread_join (thread, NULL);
    close (pair[1]);
    return rc;
}

static size_t s_word (uint8_t *at, uint64_t value)
{
    uint64_t le = htole64 (value);
    memcpy (at, &le, 8);
    return 8;
}

static size_t s_header (uint8_t *at, uint32_t words, uint8_t type)
{
    memset (at, 0, 8);
    uint32_t le = htole32 (words);
    memcpy (at, &le, 4);
    at[4] = type;
    return 8;
}

static void s_test_hostile (void)
{
    uint8_t m[256];
    int code;
    size_t n;

    //  An honest answer first: one row, one integer column, done.
    n = s_header (m, 4, 7);
    n += s_word (m + n, 1);               //  columns
    memcpy (m + n, "x\0\0\0\0\0\0\0", 8); //  name
    n += 8;
    m[n] = 1; //  row header: integer
    memset (m + n + 1, 0, 7);
    n += 8;
    n += s_word (m + n, 42);
    assert (s_lie (m, n, &code) == -1); //  no end word: 4 words said, the body is 4 words
    n = s_header (m, 5, 7);
    n += s_word (m + n, 1);
    memcpy (m + n, "x\0\0\0\0\0\0\0", 8);
    n += 8;
    m[n] = 1;
    memset (m + n + 1, 0, 7);
    n += 8;
    n += s_word (m + n, 42);
    n += s_word (m + n, 0xffffffffffffffffULL);
    assert (s_lie (m, n, &code) == 0 && code == 0);

    //  A body longer than anything allowed: refused before it is read.
    n = s_header (m, 0x7fffffff, 7);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    //  A body cut short by the hang-up.
    n = s_header (m, 10, 7);
    n += s_word (m + n, 1);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EIO);
    //  Zero columns; a column name without its NUL; an unknown value type.
    n = s_header (m, 2, 7);
    n += s_word (m + n, 0);
    n += s_word (m + n, 0xffffffffffffffffULL);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    n = s_header (m, 2, 7);
    n += s_word (m + n, 1);
    memcpy (m + n, "xxxxxxxx", 8);
    n += 8;
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    n = s_header (m, 5, 7);
    n += s_word (m + n, 1);
    memcpy (m + n, "x\0\0\0\0\0\0\0", 8);
    n += 8;
    m[n] = 14;
    memset (m + n + 1, 0, 7);
    n += 8;
    n += s_word (m + n, 42);
    n += s_word (m + n, 0xffffffffffffffffULL);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    //  A blob whose length runs past the message; a text that runs past it.
    n = s_header (m, 5, 7);
    n += s_word (m + n, 1);
    memcpy (m + n, "x\0\0\0\0\0\0\0", 8);
    n += 8;
    m[n] = 4;
    memset (m + n + 1, 0, 7);
    n += 8;
    n += s_word (m + n, 1000);
    n += s_word (m + n, 0xffffffffffffffffULL);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    n = s_header (m, 4, 7);
    n += s_word (m + n, 1);
    memcpy (m + n, "x\0\0\0\0\0\0\0", 8);
    n += 8;
    m[n] = 3;
    memset (m + n + 1, 0, 7);
    n += 8;
    memcpy (m + n, "abcdefgh", 8);
    n += 8;
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    //  An answer of another type; a failure whose code is out of range; a real failure.
    n = s_header (m, 1, 8);
    n += s_word (m + n, 0);
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    n = s_header (m, 2, 0);
    n += s_word (m + n, 0x123456789ULL);
    memcpy (m + n, "bad\0\0\0\0\0", 8);
    n += 8;
    assert (s_lie (m, n, &code) == -1 && code == SBX_DQ_EPROTO);
    n = s_header (m, 2, 0);
    n += s_word (m + n, 1555);
    memcpy (m + n, "dup\0\0\0\0\0", 8);
    n += 8;
    assert (s_lie (m, n, &code) == -1 && code == 1555);
    //  A hang-up instead of an answer.
    assert (s_lie (m, 0, &code) == -1 && code == SBX_DQ_EIO);
}

//  --------------------------------------------------------------------------

void sbx_dqlite_test (bool verbose)
{
    (void) verbose;
    s_test_hostile ();

    sbx_testcluster_t *cluster = sbx_testcluster_new (3);
    assert (cluster);
    const char *addresses[SBX_TESTCLUSTER_MAX];
    size_t count = sbx_testcluster_addresses (cluster, addresses);
    assert (count == 3);
    assert (sbx_dqlite_connect ("127.0.0.1:1", 500, NULL, NULL) == NULL);
    assert (sbx_dqlite_connect ("no port", 500, NULL, NULL) == NULL);
    assert (sbx_dqlite_connect ("", 500, NULL, NULL) == NULL);

    sbx_dqlite_t *c = sbx_dqlite_connect_leader (addresses, count, 2000, NULL, NULL);
    assert (c && sbx_dqlite_usable (c));
    uint64_t id;
    char *leader;
    assert (sbx_dqlite_leader (c, &id, &leader) == 0 && id == 1 && streq (leader, addresses[0]));
    free (leader);
    sbx_dqlite_server_t *servers;
    size_t n;
    assert (sbx_dqlite_cluster (c, &servers, &n) == 0 && n == 3);
    for (size_t i = 0; i < n; i++)
        assert (servers[i].role == SBX_DQ_VOTER &&
                servers[i].id == sbx_testcluster_id (cluster, (int) i));
    sbx_dqlite_servers_free (&servers, n);

    //  Statements: every type a parameter can have, back as a row.
    assert (sbx_dqlite_open (c, "test") == 0);
    assert (sbx_dqlite_open (c, "test") == -1); //  one database a connection
    assert (sbx_dqlite_usable (c));
    assert (sbx_dqlite_exec_sql (c,
                                 "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE, "
                                 "data BLOB, x REAL, flag BOOLEAN, at DATETIME)",
                                 NULL) == 0);
    uint32_t insert;
    uint64_t params;
    assert (sbx_dqlite_prepare (c, "INSERT INTO t (name, data, x, flag, at) VALUES (?, ?, ?, ?, ?)",
                                &insert, &params) == 0 &&
            params == 5);
    const char blob[3] = {0, 1, 2};
    sbx_dqlite_value_t v[5] = {
        {.type = SBX_DQ_TEXT, .data = "first", .size = 5},
        {.type = SBX_DQ_BLOB, .data = blob, .size = 3},
        {.type = SBX_DQ_FLOAT, .real = 2.5},
        {.type = SBX_DQ_INTEGER, .integer = 1},
        {.type = SBX_DQ_INTEGER, .integer = 1700000000},
    };
    sbx_dqlite_result_t result;
    assert (sbx_dqlite_exec (c, insert, v, 5, &result) == 0 && result.last_insert_id == 1 &&
            result.rows_affected == 1);
    //  The same name: SQLite's extended code, and the connection still works.
    assert (sbx_dqlite_exec (c, insert, v, 5, &result) == -1);
    assert (sbx_dqlite_errcode (c) == 2067 /* SQLITE_CONSTRAINT_UNIQUE */);
    assert (strstr (sbx_dqlite_errmsg (c), "UNIQUE"));
    assert (sbx_dqlite_usable (c) && !sbx_dqlite_not_leader (c));
    //  A NUL inside a text is refused here, not cut by the node.
    v[0].data = "a\0b";
    v[0].size = 3;
    assert (sbx_dqlite_exec (c, insert, v, 5, &result) == -1 && sbx_dqlite_usable (c));
    assert (sbx_dqlite_prepare (c, "SELEKT", &insert, NULL) == -1 && sbx_dqlite_usable (c));

    sbx_dqlite_rows_t rows;
    assert (sbx_dqlite_query_sql (c, "SELECT id, name, data, x, flag, at, NULL FROM t", &rows) ==
            0);
    assert (rows.rows == 1 && rows.columns == 7 && streq (rows.names[1], "name"));
    assert (rows.values[0].type == SBX_DQ_INTEGER && rows.values[0].integer == 1);
    assert (rows.values[1].type == SBX_DQ_TEXT && streq (rows.values[1].data, "first"));
    assert (rows.values[2].type == SBX_DQ_BLOB && rows.values[2].size == 3 &&
            memcmp (rows.values[2].data, blob, 3) == 0);
    assert (rows.values[3].type == SBX_DQ_FLOAT && rows.values[3].real == 2.5);
    assert (rows.values[4].type == SBX_DQ_BOOLEAN && rows.values[4].integer == 1);
    assert (rows.values[5].type == SBX_DQ_UNIXTIME && rows.values[5].integer == 1700000000);
    assert (rows.values[6].type == SBX_DQ_NULL);
    sbx_dqlite_rows_free (&rows);

    //  Thousands of rows come in many messages; all arrive, in order.
    assert (sbx_dqlite_exec_sql (c, "BEGIN", NULL) == 0);
    assert (sbx_dqlite_prepare (c, "INSERT INTO t (name, x) VALUES (?, ?)", &insert, NULL) == 0);
    for (int i = 0; i < 3000; i++) {
        char name[32];
        snprintf (name, sizeof name, "row %d with a longer name", i);
        sbx_dqlite_value_t row[2] = {{.type = SBX_DQ_TEXT, .data = name, .size = strlen (name)},
                                     {.type = SBX_DQ_FLOAT, .real = i}};
        assert (sbx_dqlite_exec (c, insert, row, 2, NULL) == 0);
    }
    assert (sbx_dqlite_exec_sql (c, "COMMIT", NULL) == 0);
    assert (sbx_dqlite_finalize (c, insert) == 0);
    uint32_t select;
    assert (sbx_dqlite_prepare (c, "SELECT x, name FROM t WHERE id > ? ORDER BY x", &select,
                                NULL) == 0);
    sbx_dqlite_value_t from = {.type = SBX_DQ_INTEGER, .integer = 1};
    assert (sbx_dqlite_query (c, select, &from, 1, &rows) == 0 && rows.rows == 3000);
    for (size_t i = 0; i < rows.rows; i++)
        assert (rows.values[i * 2].real == (double) i);
    sbx_dqlite_rows_free (&rows);
    //  A statement without rows asked as a query is the node's error, not a hang.
    assert (sbx_dqlite_query_sql (c, "DELETE FROM t WHERE id < 0", &rows) == -1);
    //  A dump of the database: its file, as the node holds it.
    sbx_dqlite_file_t *files;
    assert (sbx_dqlite_dump (c, "test", &files, &n) == 0 && n == 2);
    assert (streq (files[0].name, "test") && files[0].size >= 4096);
    assert (memcmp (files[0].data, "SQLite format 3", 15) == 0);
    sbx_dqlite_files_free (&files, n);

    //  A follower refuses writes as not the leader; the leader stops, another leads.
    int follower = sbx_testcluster_follower (cluster);
    sbx_dqlite_t *f = sbx_dqlite_connect (addresses[follower], 2000, NULL, NULL);
    assert (f && sbx_dqlite_open (f, "test") == 0);
    assert (sbx_dqlite_exec_sql (f, "DELETE FROM t", NULL) == -1 && sbx_dqlite_not_leader (f));
    sbx_dqlite_destroy (&f);
    sbx_dqlite_destroy (&c);
    sbx_testcluster_stop (cluster, 0);
    int next = sbx_testcluster_leader (cluster);
    assert (next == 1 || next == 2);
    c = sbx_dqlite_connect_leader (addresses, count, 2000, NULL, NULL);
    assert (c && streq (sbx_dqlite_address (c), addresses[next]));
    assert (sbx_dqlite_open (c, "test") == 0);
    assert (sbx_dqlite_query_sql (c, "SELECT count(*) FROM t", &rows) == 0);
    assert (rows.values[0].integer == 3001);
    sbx_dqlite_rows_free (&rows);
    //  Leadership handed to the other voter on request.
    int other = next == 1 ? 2 : 1;
    assert (sbx_dqlite_transfer (c, sbx_testcluster_id (cluster, other)) == 0);
    assert (sbx_testcluster_leader (cluster) == other);
    sbx_dqlite_destroy (&c);
    sbx_testcluster_destroy (&cluster);
}
