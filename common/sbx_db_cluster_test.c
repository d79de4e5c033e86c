/*  sbx_db_cluster_test - sbx_db on a real dqlite cluster: three nodes of this process on
    loopback, a store's life on it (migrations, statements, constraints, transactions),
    a store that does not follow the leader, and a failover in the middle of it all.
    Built into the test runner only (it links libdqlite through sbx_dqnode).
*/
#include "sbx_db.h"
#include "sbx_dqlite.h"
#include "sbx_dqnode.h"
#include "sbx_testcluster.h"

#include <assert.h>
#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *s_migrations[] = {
    "CREATE TABLE items (id TEXT NOT NULL PRIMARY KEY, size INTEGER NOT NULL);",
    "ALTER TABLE items ADD COLUMN note TEXT; ALTER TABLE items ADD COLUMN data BLOB;",
};

enum { T_INSERT, T_FIND, T_SIZES, T_BLOB, T_COUNT };
static const char *s_sql[T_COUNT] = {
    [T_INSERT] = "INSERT INTO items (id, size, note) VALUES (?1, ?2, ?3)",
    [T_FIND] = "SELECT id, size, note FROM items WHERE id = ?1",
    [T_SIZES] = "SELECT id, size FROM items WHERE size >= ?1 ORDER BY size",
    [T_BLOB] = "UPDATE items SET data = ?2 WHERE id = ?1",
};

static sbx_db_t *s_open (sbx_testcluster_t *cluster, bool follow, int migrations)
{
    const char *addresses[SBX_TESTCLUSTER_MAX];
    size_t count = sbx_testcluster_addresses (cluster, addresses);
    sbx_dqlite_cluster_t where = {addresses, count, NULL, NULL, 2000, follow};
    return sbx_db_new_cluster (&where, "items", "sbx-test", s_migrations, migrations, s_sql,
                               migrations == 2 ? T_COUNT : 0);
}

static int s_insert (sbx_db_t *db, const char *id, int64_t size, const char *note)
{
    sbx_stmt_t *stmt = sbx_db_stmt (db, T_INSERT);
    sbx_db_bind_text (stmt, 1, id);
    sbx_stmt_bind_int64 (stmt, 2, size);
    sbx_db_bind_text (stmt, 3, note);
    return sbx_db_try (db, T_INSERT, "insert");
}

typedef struct {
    char *id;
    uint64_t size;
    char *note;
} s_item_t;

static int s_item (sbx_stmt_t *stmt, void *arg)
{
    s_item_t *item = arg;
    bool failed = false;
    item->id = sbx_db_column_dup (stmt, 0, &failed);
    item->size = sbx_db_column_u64 (stmt, 1);
    item->note = sbx_db_column_dup (stmt, 2, &failed);
    return failed ? -1 : 0;
}

static int s_find (sbx_db_t *db, const char *id, s_item_t *item)
{
    memset (item, 0, sizeof *item);
    sbx_db_bind_text (sbx_db_stmt (db, T_FIND), 1, id);
    return sbx_db_row (db, T_FIND, s_item, item, "find");
}

static void s_item_free (s_item_t *item)
{
    free (item->id);
    free (item->note);
    memset (item, 0, sizeof *item);
}

void sbx_db_cluster_test (bool verbose)
{
    (void) verbose;
    sbx_testcluster_t *cluster = sbx_testcluster_new (3);
    assert (cluster);

    //  A new database: both migrations, recorded; opened again, none applied twice.
    sbx_db_t *db = s_open (cluster, true, 1);
    assert (db && sbx_db_is_cluster (db) && sbx_db_schema_version (db) == 1);
    assert (streq (sbx_db_path (db), "dqlite:items"));
    assert (sbx_db_handle (db) == NULL);
    sbx_db_destroy (&db);
    db = s_open (cluster, true, 2);
    assert (db && sbx_db_schema_version (db) == 2);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM schema_version", "") == 2);
    assert (sbx_db_query_int (db, "PRAGMA foreign_keys", "") == 1);

    //  Statements and their codes, as on SQLite.
    assert (s_insert (db, "a", 10, NULL) == SQLITE_DONE);
    assert (sbx_db_changes (db) == 1 && sbx_db_last_insert_rowid (db) == 1);
    assert (s_insert (db, "a", 11, NULL) == SQLITE_CONSTRAINT_PRIMARYKEY);
    assert (!sbx_db_not_leader (db));
    assert (s_insert (db, "b", 20, "two\nlines ünïcode") == SQLITE_DONE);
    s_item_t item;
    assert (s_find (db, "b", &item) == 0);
    assert (streq (item.id, "b") && item.size == 20 && streq (item.note, "two\nlines ünïcode"));
    s_item_free (&item);
    assert (s_find (db, "zz", &item) == 1 && !item.id);
    //  A parameter left unbound is NULL, as on SQLite.
    sbx_stmt_t *stmt = sbx_db_stmt (db, T_INSERT);
    sbx_db_bind_text (stmt, 1, "c");
    sbx_stmt_bind_int64 (stmt, 2, 1);
    assert (sbx_db_run (db, T_INSERT, "insert") == 0);
    //  Blobs round trip byte for byte, an empty one too.
    unsigned char bytes[300];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char) (i * 7);
    stmt = sbx_db_stmt (db, T_BLOB);
    sbx_db_bind_text (stmt, 1, "a");
    sbx_stmt_bind_blob (stmt, 2, bytes, sizeof bytes);
    assert (sbx_db_run (db, T_BLOB, "blob") == 0 && sbx_db_changes (db) == 1);
    assert (sbx_db_query_int (db, "SELECT length (data) FROM items WHERE id = 'a'", "") == 300);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM items WHERE data IS NULL", "") == 2);

    //  Many rows: read across the node's batches, in order, the statement busy meanwhile.
    assert (sbx_db_begin (db) == 0 && sbx_db_in_transaction (db));
    assert (sbx_db_begin (db) == -1);
    for (int i = 0; i < 600; i++) {
        char id[32];
        snprintf (id, sizeof id, "bulk-%03d", i);
        assert (s_insert (db, id, 1000 + i, "a note long enough to fill pages of rows") ==
                SQLITE_DONE);
    }
    assert (sbx_db_commit (db) == 0 && !sbx_db_in_transaction (db));
    stmt = sbx_db_stmt (db, T_SIZES);
    sbx_stmt_bind_int64 (stmt, 1, 1000);
    int rows = 0, rc;
    assert (!sbx_stmt_busy (stmt));
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        assert (sbx_stmt_busy (stmt));
        assert (sbx_stmt_column_int64 (stmt, 1) == 1000 + rows);
        //  A number read as text, as SQLite converts it.
        char expect[16];
        snprintf (expect, sizeof expect, "%d", 1000 + rows);
        assert (streq (sbx_stmt_column_text (stmt, 1), expect));
        rows++;
    }
    assert (rc == SQLITE_DONE && rows == 600);
    sbx_db_reset (stmt);
    assert (!sbx_stmt_busy (stmt));

    //  Rolled back: gone. Closed inside a transaction: rolled back.
    assert (sbx_db_begin (db) == 0);
    assert (s_insert (db, "r", 1, NULL) == SQLITE_DONE);
    assert (sbx_db_rollback (db) == 0);
    assert (s_find (db, "r", &item) == 1);
    assert (sbx_db_begin (db) == 0);
    assert (s_insert (db, "r", 1, NULL) == SQLITE_DONE);
    sbx_db_destroy (&db);
    db = s_open (cluster, true, 2);
    assert (db && s_find (db, "r", &item) == 1);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM items", "") == 603);
    assert (sbx_db_whole_reads (db, NULL) == 1); //  T_SIZES scans items

    //  A store that does not follow, on a node that does not lead: refused, and says so.
    int follower = sbx_testcluster_follower (cluster);
    assert (follower >= 0);
    const char *addresses[1] = {sbx_testcluster_address (cluster, follower)};
    sbx_dqlite_cluster_t on_follower = {addresses, 1, NULL, NULL, 2000, false};
    sbx_db_t *standby =
        sbx_db_new_cluster (&on_follower, "items", "sbx-test", s_migrations, 2, s_sql, T_COUNT);
    assert (standby == NULL); //  its migrations cannot even be checked
    int leader = sbx_testcluster_leader (cluster);
    assert (leader >= 0);
    addresses[0] = sbx_testcluster_address (cluster, leader);
    sbx_dqlite_cluster_t on_leader = {addresses, 1, NULL, NULL, 2000, false};
    sbx_db_t *fixed =
        sbx_db_new_cluster (&on_leader, "items", "sbx-test", s_migrations, 2, s_sql, T_COUNT);
    assert (fixed && s_insert (fixed, "fixed", 4, NULL) == SQLITE_DONE);

    //  Failover: the leader's node stops. A transaction open on it is lost; the store
    //  that follows finds the new leader at its next statement and sees everything that
    //  was committed; the one that does not follow says its node does not lead (or is
    //  gone) instead of writing anywhere else.
    assert (sbx_db_begin (db) == 0);
    assert (s_insert (db, "lost", 1, NULL) == SQLITE_DONE);
    sbx_testcluster_stop (cluster, leader);
    assert (sbx_db_commit (db) == -1 && !sbx_db_in_transaction (db));
    int tries = 0;
    while (s_insert (db, "after", 2, NULL) != SQLITE_DONE) {
        assert (++tries < 50);
        usleep (100 * 1000);
    }
    assert (s_find (db, "lost", &item) == 1);
    assert (s_find (db, "b", &item) == 0 && item.size == 20);
    s_item_free (&item);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM items", "") == 605);
    assert (s_insert (fixed, "nowhere", 3, NULL) != SQLITE_DONE);
    assert (s_find (db, "nowhere", &item) == 1);
    sbx_db_destroy (&fixed);

    //  A one-machine database copied in: its rows (rowids kept, blobs whole), and again
    //  without a row doubled.
    char dir[] = "/tmp/sbx_db_import.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/items.db", dir);
    sbx_db_t *file = sbx_db_new (path, "sbx-test", s_migrations, 2, s_sql, T_COUNT);
    assert (file);
    assert (s_insert (file, "from-file-1", 7, "a note") == SQLITE_DONE);
    assert (s_insert (file, "from-file-2", 8, NULL) == SQLITE_DONE);
    stmt = sbx_db_stmt (file, T_BLOB);
    sbx_db_bind_text (stmt, 1, "from-file-2");
    sbx_stmt_bind_blob (stmt, 2, bytes, 100);
    assert (sbx_db_run (file, T_BLOB, "blob") == 0);
    sbx_db_destroy (&file);
    //  Into a fresh database of the cluster, as `sbx cluster init` leads to.
    const char *addresses_all[SBX_TESTCLUSTER_MAX];
    size_t all = sbx_testcluster_addresses (cluster, addresses_all);
    sbx_dqlite_cluster_t where = {addresses_all, all, NULL, NULL, 2000, true};
    sbx_db_t *fresh =
        sbx_db_new_cluster (&where, "imported", "sbx-test", s_migrations, 2, s_sql, T_COUNT);
    assert (fresh);
    uint64_t copied = 0;
    char err[256];
    const char *skip[] = {"nothing", NULL};
    assert (sbx_db_import (fresh, path, skip, &copied, err, sizeof err) == 0 && copied == 2);
    assert (s_find (fresh, "from-file-1", &item) == 0 && item.size == 7 &&
            streq (item.note, "a note"));
    s_item_free (&item);
    assert (sbx_db_query_int (fresh, "SELECT length (data) FROM items WHERE id = 'from-file-2'",
                              "") == 100);
    assert (sbx_db_query_int (fresh, "SELECT rowid FROM items WHERE id = 'from-file-2'", "") == 2);
    assert (sbx_db_import (fresh, path, NULL, &copied, err, sizeof err) == 0 && copied == 2);
    assert (sbx_db_query_int (fresh, "SELECT count(*) FROM items", "") == 2);
    assert (sbx_db_import (fresh, "/nonexistent/x.db", NULL, &copied, err, sizeof err) == -1);
    assert (sbx_db_import (file, path, NULL, &copied, err, sizeof err) == -1); //  not a cluster's
    sbx_db_destroy (&fresh);
    //  And out again as one file (a backup): the same rows, a database SQLite opens.
    char dumped[160];
    snprintf (dumped, sizeof dumped, "%s/dumped.db", dir);
    assert (sbx_db_dump (&where, "imported", dumped, err, sizeof err) == 0);
    assert (sbx_db_dump (&where, "imported", dumped, err, sizeof err) == -1); //  exists
    sbx_db_t *back = sbx_db_new (dumped, "sbx-test", s_migrations, 2, s_sql, T_COUNT);
    assert (back && sbx_db_query_int (back, "SELECT count(*) FROM items", "") == 2);
    assert (s_find (back, "from-file-1", &item) == 0 && streq (item.note, "a note"));
    s_item_free (&item);
    sbx_db_destroy (&back);
    char *command = zsys_sprintf ("rm -rf '%s'", dir);
    assert (command && system (command) == 0);
    zstr_free (&command);

    //  The stopped node comes back with its data and catches up; a schema newer than
    //  this program knows is refused.
    assert (sbx_testcluster_start (cluster, leader) == 0);
    assert (sbx_db_exec (db, "INSERT INTO schema_version VALUES (99, 0)", "") == 0);
    sbx_db_destroy (&db);
    assert (s_open (cluster, true, 2) == NULL);

    sbx_testcluster_destroy (&cluster);
}
