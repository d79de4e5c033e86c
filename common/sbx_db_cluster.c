/*  sbx_db's dqlite engine (see sbx_db.h): the store's statements run on the cluster's
    leader through one sbx_dqlite connection.

    A statement is prepared on the node the first time it runs on a connection (each new
    connection is a new generation, and every statement prepares again). Binds are kept
    here, copied, and sent with the run: all of the statement's parameters every time,
    the unbound ones as NULL, since the node keeps a statement's old binds. A statement
    that returns rows is run whole at its first step; its rows are then read from memory.

    Reconnecting: a store that follows the leader (sbx_dqlite_cluster_t.follow) reconnects
    between transactions when its connection failed or its node said it does not lead,
    and runs the statement there once more only in the second case: a statement whose
    connection broke while it ran may have been committed, and running it again could do
    it twice, so that failure goes to the store. Inside a transaction nothing reconnects:
    the transaction was the node's, and is gone with it.
*/
#include "sbx_db_priv.h"
#include "sbx_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

//  Keeps the connection's error as the database's, in SQLite's terms.
static int s_error (sbx_db_t *self)
{
    int code = self->conn ? sbx_dqlite_errcode (self->conn) : SBX_DQ_EIO;
    const char *message = self->conn ? sbx_dqlite_errmsg (self->conn) : "no connection";
    snprintf (self->errmsg, sizeof self->errmsg, "%s", message);
    self->errcode = code == SBX_DQ_EIO      ? SQLITE_IOERR
                    : code == SBX_DQ_EPROTO ? SQLITE_PROTOCOL
                    : code                  ? code
                                            : SQLITE_ERROR;
    //  The node's codes for "not the leader" are kept as they are: the store asks.
    if (code == SBX_DQ_NOT_LEADER || code == SBX_DQ_LEADERSHIP_LOST)
        self->errcode = code;
    return self->errcode;
}

//  A connection to the leader (or to addresses[0] when not following), with the database
//  open on it. 0, or -1 with the error kept.
static int s_connect (sbx_db_t *self)
{
    sbx_dqlite_destroy (&self->conn);
    if (self->follow)
        self->conn = sbx_dqlite_connect_leader ((const char *const *) self->addresses, self->count,
                                                self->timeout_ms, self->dial, self->dial_arg);
    else
        self->conn =
            sbx_dqlite_connect (self->addresses[0], self->timeout_ms, self->dial, self->dial_arg);
    if (!self->conn) {
        snprintf (self->errmsg, sizeof self->errmsg, "%s",
                  self->follow ? "no node of the cluster leads, or none answers"
                               : "the node does not answer");
        self->errcode = SQLITE_IOERR;
        return -1;
    }
    if (sbx_dqlite_open (self->conn, self->name)) {
        s_error (self);
        sbx_dqlite_destroy (&self->conn);
        return -1;
    }
    self->gen++;
    sbx_debug ("store %s: connected to %s", self->path, sbx_dqlite_address (self->conn));
    return 0;
}

//  Between transactions: a connection that failed, or a node that no longer leads, is
//  replaced (when following). Inside one, or when the connection is fine, nothing.
static int s_ensure (sbx_db_t *self)
{
    bool broken = !sbx_dqlite_usable (self->conn);
    bool moved = self->follow && self->conn && sbx_dqlite_not_leader (self->conn);
    if (!broken && !moved)
        return 0;
    if (self->in_tx) {
        snprintf (self->errmsg, sizeof self->errmsg, "%s",
                  "the connection to the leader failed inside a transaction");
        self->errcode = SQLITE_IOERR;
        return -1;
    }
    return s_connect (self);
}

int sbx_db_cl_open (sbx_db_t *self, const sbx_dqlite_cluster_t *cluster, const char *name)
{
    self->name = strdup (name);
    self->addresses = calloc (cluster->count, sizeof *self->addresses);
    if (!self->name || !self->addresses)
        return -1;
    self->count = cluster->count;
    for (size_t i = 0; i < cluster->count; i++)
        if (!(self->addresses[i] = strdup (cluster->addresses[i])))
            return -1;
    self->dial = cluster->dial;
    self->dial_arg = cluster->dial_arg;
    self->timeout_ms = cluster->timeout_ms > 0 ? cluster->timeout_ms : 5000;
    self->follow = cluster->follow;
    if (s_connect (self)) {
        sbx_error ("store %s: %s", self->path, self->errmsg);
        return -1;
    }
    return 0;
}

void sbx_db_cl_close (sbx_db_t *self)
{
    sbx_dqlite_destroy (&self->conn);
    if (self->addresses)
        for (size_t i = 0; i < self->count; i++)
            free (self->addresses[i]);
    free (self->addresses);
    free (self->name);
}

//  --------------------------------------------------------------------------
//  Statements

static void s_free_values (sbx_stmt_t *stmt)
{
    for (size_t i = 0; i < stmt->values_cap; i++) {
        sbx_dqlite_value_t *v = &stmt->values[i];
        if (v->type == SBX_DQ_TEXT || v->type == SBX_DQ_BLOB)
            free ((void *) v->data);
        memset (v, 0, sizeof *v);
    }
}

void sbx_db_cl_stmt_free (sbx_stmt_t *stmt)
{
    s_free_values (stmt);
    free (stmt->values);
    stmt->values = NULL;
    stmt->values_cap = 0;
    sbx_dqlite_rows_free (&stmt->rows);
    free (stmt->scratch);
    stmt->scratch = NULL;
}

int sbx_db_cl_bind (sbx_stmt_t *stmt, int index, const sbx_dqlite_value_t *value)
{
    if (index < 1 || index > 255)
        return SQLITE_RANGE;
    size_t at = (size_t) index - 1;
    if (at >= stmt->values_cap) {
        size_t cap = (size_t) index < 8 ? 8 : (size_t) index;
        sbx_dqlite_value_t *grown = realloc (stmt->values, cap * sizeof *grown);
        if (!grown)
            return SQLITE_NOMEM;
        memset (grown + stmt->values_cap, 0, (cap - stmt->values_cap) * sizeof *grown);
        stmt->values = grown;
        stmt->values_cap = cap;
    }
    sbx_dqlite_value_t *v = &stmt->values[at];
    if (v->type == SBX_DQ_TEXT || v->type == SBX_DQ_BLOB)
        free ((void *) v->data);
    *v = *value;
    if (value->type == SBX_DQ_TEXT || value->type == SBX_DQ_BLOB) {
        //  A text keeps its NUL; a blob of no bytes still has a buffer.
        char *copy = malloc (value->size + 1);
        if (!copy) {
            memset (v, 0, sizeof *v);
            return SQLITE_NOMEM;
        }
        if (value->size)
            memcpy (copy, value->data, value->size);
        copy[value->size] = 0;
        v->data = copy;
    }
    return SQLITE_OK;
}

//  The parameters to send: all the statement has, unbound ones NULL.
static sbx_dqlite_value_t *s_params (sbx_stmt_t *stmt, size_t *count)
{
    *count = stmt->params;
    if (stmt->params > stmt->values_cap) {
        sbx_dqlite_value_t *grown = realloc (stmt->values, stmt->params * sizeof *grown);
        if (!grown)
            return NULL;
        memset (grown + stmt->values_cap, 0, (stmt->params - stmt->values_cap) * sizeof *grown);
        stmt->values = grown;
        stmt->values_cap = stmt->params;
    }
    for (size_t i = 0; i < stmt->params; i++)
        if (stmt->values[i].type == 0)
            stmt->values[i].type = SBX_DQ_NULL;
    return stmt->values;
}

//  Runs the statement once on the current connection: SQLITE_DONE or the error.
static int s_run_once (sbx_stmt_t *stmt)
{
    sbx_db_t *self = stmt->db;
    if (stmt->gen != self->gen) {
        uint64_t params = 0;
        if (sbx_dqlite_prepare (self->conn, stmt->sql, &stmt->id, &params))
            return s_error (self);
        stmt->params = (size_t) params;
        stmt->gen = self->gen;
    }
    size_t count = 0;
    sbx_dqlite_value_t *params = s_params (stmt, &count);
    if (count && !params)
        return SQLITE_NOMEM;
    if (stmt->returns_rows) {
        if (sbx_dqlite_query (self->conn, stmt->id, params, count, &stmt->rows))
            return s_error (self);
        return SQLITE_DONE;
    }
    sbx_dqlite_result_t result;
    if (sbx_dqlite_exec (self->conn, stmt->id, params, count, &result))
        return s_error (self);
    self->changes = (int) result.rows_affected;
    self->last_id = (int64_t) result.last_insert_id;
    return SQLITE_DONE;
}

//  The node answers SQLITE_BUSY, having run nothing, while it checkpoints its WAL (and
//  while another connection writes): that passes in milliseconds, so it is waited out
//  here, up to about a second, as SQLite's busy timeout does for a file.
static bool s_busy_wait (sbx_db_t *self, int rc, int *tries)
{
    if ((rc & 0xff) != SQLITE_BUSY || *tries >= 200)
        return false;
    (*tries)++;
    usleep (*tries < 10 ? 1000 : 5000);
    (void) self;
    return true;
}

static int s_run (sbx_stmt_t *stmt)
{
    sbx_db_t *self = stmt->db;
    if (s_ensure (self))
        return self->errcode;
    int rc, tries = 0;
    do
        rc = s_run_once (stmt);
    while (s_busy_wait (self, rc, &tries));
    //  Refused as not the leader: nothing ran; once more on the one that leads now.
    if (rc == SBX_DQ_NOT_LEADER && self->follow && !self->in_tx && s_connect (self) == 0)
        rc = s_run_once (stmt);
    if (rc == SQLITE_DONE) {
        self->errcode = 0;
        self->errmsg[0] = 0;
    }
    return rc;
}

int sbx_db_cl_step (sbx_stmt_t *stmt)
{
    //  As SQLite: a step after the end starts the statement again.
    if (stmt->done)
        sbx_db_cl_reset (stmt);
    if (!stmt->ran) {
        stmt->ran = true;
        int rc = s_run (stmt);
        if (rc != SQLITE_DONE) {
            stmt->done = true;
            return rc;
        }
    }
    if (stmt->returns_rows && stmt->row < stmt->rows.rows) {
        stmt->row++;
        return SQLITE_ROW;
    }
    stmt->done = true;
    return SQLITE_DONE;
}

void sbx_db_cl_reset (sbx_stmt_t *stmt)
{
    sbx_dqlite_rows_free (&stmt->rows);
    stmt->ran = stmt->done = false;
    stmt->row = 0;
    s_free_values (stmt);
}

const sbx_dqlite_value_t *sbx_db_cl_column (sbx_stmt_t *stmt, int column)
{
    if (stmt->row == 0 || column < 0 || (size_t) column >= stmt->rows.columns)
        return NULL;
    return &stmt->rows.values[(stmt->row - 1) * stmt->rows.columns + (size_t) column];
}

const char *sbx_db_cl_column_text (sbx_stmt_t *stmt, int column)
{
    const sbx_dqlite_value_t *v = sbx_db_cl_column (stmt, column);
    if (!v || v->type == SBX_DQ_NULL)
        return NULL;
    if (v->type == SBX_DQ_TEXT || v->type == SBX_DQ_ISO8601)
        return v->data;
    //  Another type read as text: SQLite's conversion, into the statement's scratch.
    size_t need = v->type == SBX_DQ_BLOB ? v->size + 1 : 32;
    if (need > stmt->scratch_cap) {
        char *grown = realloc (stmt->scratch, need);
        if (!grown)
            return NULL;
        stmt->scratch = grown;
        stmt->scratch_cap = need;
    }
    if (v->type == SBX_DQ_BLOB) {
        if (v->size)
            memcpy (stmt->scratch, v->data, v->size);
        stmt->scratch[v->size] = 0;
    } else if (v->type == SBX_DQ_FLOAT)
        snprintf (stmt->scratch, stmt->scratch_cap, "%.17g", v->real);
    else
        snprintf (stmt->scratch, stmt->scratch_cap, "%lld", (long long) v->integer);
    return stmt->scratch;
}

//  --------------------------------------------------------------------------
//  SQL text and transactions

int sbx_db_cl_exec (sbx_db_t *self, const char *sql)
{
    if (s_ensure (self))
        return -1;
    sbx_dqlite_result_t result;
    int tries = 0;
    while (sbx_dqlite_exec_sql (self->conn, sql, &result)) {
        if (!s_busy_wait (self, s_error (self), &tries))
            return -1;
    }
    self->changes = (int) result.rows_affected;
    self->last_id = (int64_t) result.last_insert_id;
    return 0;
}

int sbx_db_cl_query (sbx_db_t *self, const char *sql, sbx_dqlite_rows_t *rows)
{
    memset (rows, 0, sizeof *rows);
    if (s_ensure (self))
        return -1;
    int tries = 0;
    while (sbx_dqlite_query_sql (self->conn, sql, rows)) {
        if (!s_busy_wait (self, s_error (self), &tries))
            return -1;
    }
    return 0;
}

int sbx_db_cl_begin (sbx_db_t *self, const char *sql)
{
    if (s_ensure (self))
        return -1;
    int tries = 0;
    int failed;
    while ((failed = sbx_dqlite_exec_sql (self->conn, sql, NULL)) &&
           s_busy_wait (self, s_error (self), &tries))
        ;
    if (failed) {
        s_error (self);
        //  Not the leader: the transaction can begin on the one that does.
        if (!(sbx_dqlite_not_leader (self->conn) && self->follow && s_connect (self) == 0 &&
              sbx_dqlite_exec_sql (self->conn, sql, NULL) == 0))
            return -1;
    }
    self->in_tx = true;
    return 0;
}

//  COMMIT or ROLLBACK. Either way the transaction is over: a commit that failed was
//  rolled back by the node (or is gone with the connection or the leadership).
int sbx_db_cl_end (sbx_db_t *self, const char *sql)
{
    bool rollback = strcmp (sql, "ROLLBACK") == 0;
    int rc = 0;
    if (sbx_dqlite_usable (self->conn) && sbx_dqlite_exec_sql (self->conn, sql, NULL)) {
        s_error (self);
        rc = -1;
        if (!rollback && sbx_dqlite_usable (self->conn))
            sbx_dqlite_exec_sql (self->conn, "ROLLBACK", NULL);
    } else if (!sbx_dqlite_usable (self->conn) && !rollback) {
        s_error (self);
        rc = -1;
    }
    self->in_tx = false;
    //  A rollback on a broken connection is still a rollback: the node dropped it.
    return rollback ? 0 : rc;
}

//  --------------------------------------------------------------------------
//  Import: a one-machine database into a cluster's (sbx db_import)

#define S_IMPORT_CHUNK 1000

//  The value of a file's column as a parameter (text and blobs borrowed from the step).
static void s_import_value (sqlite3_stmt *row, int column, sbx_dqlite_value_t *v)
{
    memset (v, 0, sizeof *v);
    switch (sqlite3_column_type (row, column)) {
    case SQLITE_INTEGER:
        v->type = SBX_DQ_INTEGER;
        v->integer = sqlite3_column_int64 (row, column);
        break;
    case SQLITE_FLOAT:
        v->type = SBX_DQ_FLOAT;
        v->real = sqlite3_column_double (row, column);
        break;
    case SQLITE_TEXT:
        v->type = SBX_DQ_TEXT;
        v->data = sqlite3_column_text (row, column);
        v->size = (size_t) sqlite3_column_bytes (row, column);
        break;
    case SQLITE_BLOB:
        v->type = SBX_DQ_BLOB;
        v->data = sqlite3_column_blob (row, column);
        v->size = (size_t) sqlite3_column_bytes (row, column);
        break;
    default:
        v->type = SBX_DQ_NULL;
    }
}

//  Copies one table. 0, or -1 with err.
static int s_import_table (sbx_db_t *self, sqlite3 *file, const char *table, uint64_t *rows,
                           char *err, size_t err_size)
{
    //  Columns, and whether the rowid is one of them (INTEGER PRIMARY KEY) or apart.
    char *sql = sqlite3_mprintf ("SELECT name, type, pk FROM pragma_table_info (%Q)", table);
    sqlite3_stmt *info = NULL;
    char columns[4096] = "";
    int count = 0, pks = 0;
    bool int_pk = false;
    if (sql && sqlite3_prepare_v2 (file, sql, -1, &info, NULL) == SQLITE_OK)
        while (sqlite3_step (info) == SQLITE_ROW) {
            char *quoted = sqlite3_mprintf ("%s%w", count ? "\", \"" : "\"",
                                            (const char *) sqlite3_column_text (info, 0));
            snprintf (columns + strlen (columns), sizeof columns - strlen (columns), "%s", quoted);
            sqlite3_free (quoted);
            count++;
            if (sqlite3_column_int (info, 2) > 0) {
                pks++;
                const char *type = (const char *) sqlite3_column_text (info, 1);
                int_pk = type && strcasecmp (type, "INTEGER") == 0;
            }
        }
    sqlite3_finalize (info);
    sqlite3_free (sql);
    if (count == 0 || count > 250 || strlen (columns) + 2 >= sizeof columns) {
        snprintf (err, err_size, "table %s: cannot read its columns", table);
        return -1;
    }
    strcat (columns, "\"");
    //  A rowid of its own (not an alias of the primary key) is kept too.
    bool rowid = !(pks == 1 && int_pk);
    sqlite3_stmt *probe = NULL;
    char *select = sqlite3_mprintf ("SELECT rowid FROM \"%w\" LIMIT 0", table);
    if (rowid && (sqlite3_prepare_v2 (file, select, -1, &probe, NULL) != SQLITE_OK))
        rowid = false; //  WITHOUT ROWID
    sqlite3_finalize (probe);
    sqlite3_free (select);
    select = sqlite3_mprintf ("SELECT %s%s FROM \"%w\" ORDER BY %s", rowid ? "rowid, " : "",
                              columns, table, rowid ? "rowid" : "1");
    char placeholders[4096] = "";
    for (int i = 0; i < count + (rowid ? 1 : 0); i++)
        snprintf (placeholders + strlen (placeholders), sizeof placeholders - strlen (placeholders),
                  "%s?", i ? ", " : "");
    char *insert = sqlite3_mprintf ("INSERT OR IGNORE INTO \"%w\" (%s%s) VALUES (%s)", table,
                                    rowid ? "rowid, " : "", columns, placeholders);
    sqlite3_stmt *rows_of = NULL;
    uint32_t stmt = 0;
    int rc = -1;
    if (!select || !insert || sqlite3_prepare_v2 (file, select, -1, &rows_of, NULL) != SQLITE_OK) {
        snprintf (err, err_size, "table %s: cannot read it: %s", table, sqlite3_errmsg (file));
        goto done;
    }
    if (s_ensure (self) || sbx_dqlite_prepare (self->conn, insert, &stmt, NULL)) {
        snprintf (err, err_size, "table %s: the cluster refuses it: %s", table,
                  self->conn ? sbx_dqlite_errmsg (self->conn) : "no connection");
        goto done;
    }
    int width = count + (rowid ? 1 : 0);
    sbx_dqlite_value_t values[251];
    int step, in_chunk = 0;
    rc = 0;
    while (rc == 0 && (step = sqlite3_step (rows_of)) == SQLITE_ROW) {
        if (in_chunk == 0 && sbx_dqlite_exec_sql (self->conn, "BEGIN", NULL))
            rc = -1;
        for (int i = 0; rc == 0 && i < width; i++)
            s_import_value (rows_of, i, &values[i]);
        if (rc == 0 && sbx_dqlite_exec (self->conn, stmt, values, (size_t) width, NULL))
            rc = -1;
        if (rc == 0 && ++in_chunk == S_IMPORT_CHUNK) {
            rc = sbx_dqlite_exec_sql (self->conn, "COMMIT", NULL);
            in_chunk = 0;
        }
        (*rows)++;
    }
    if (rc == 0 && in_chunk && sbx_dqlite_exec_sql (self->conn, "COMMIT", NULL))
        rc = -1;
    if (rc) {
        snprintf (err, err_size, "table %s: %s", table, sbx_dqlite_errmsg (self->conn));
        if (sbx_dqlite_usable (self->conn))
            sbx_dqlite_exec_sql (self->conn, "ROLLBACK", NULL);
    }
    sbx_dqlite_finalize (self->conn, stmt);
done:
    sqlite3_finalize (rows_of);
    sqlite3_free (select);
    sqlite3_free (insert);
    return rc;
}

int sbx_db_import (sbx_db_t *self, const char *path, const char *const *skip, uint64_t *rows,
                   char *err, size_t err_size)
{
    *rows = 0;
    if (!self || !self->cluster || self->in_tx) {
        snprintf (err, err_size, "only into a cluster's database, outside a transaction");
        return -1;
    }
    sqlite3 *file = NULL;
    if (sqlite3_open_v2 (path, &file, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf (err, err_size, "cannot open %s: %s", path,
                  file ? sqlite3_errmsg (file) : "out of memory");
        sqlite3_close (file);
        return -1;
    }
    sqlite3_busy_timeout (file, 5000);
    //  The tables of the file, in the order they were made (parents before the tables
    //  whose foreign keys name them), that the cluster's database has too.
    sqlite3_stmt *tables = NULL;
    int rc = sqlite3_prepare_v2 (file,
                                 "SELECT name FROM sqlite_schema WHERE type = 'table' AND name "
                                 "NOT LIKE 'sqlite_%' AND name != 'schema_version' ORDER BY rowid",
                                 -1, &tables, NULL) == SQLITE_OK
                 ? 0
                 : -1;
    if (rc)
        snprintf (err, err_size, "%s is not a database: %s", path, sqlite3_errmsg (file));
    while (rc == 0 && sqlite3_step (tables) == SQLITE_ROW) {
        const char *table = (const char *) sqlite3_column_text (tables, 0);
        bool skipped = false;
        for (const char *const *s = skip; s && *s; s++)
            skipped |= strcmp (*s, table) == 0;
        char *exists = sqlite3_mprintf (
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = %Q", table);
        sbx_dqlite_rows_t there;
        if (skipped || !exists)
            ;
        else if (sbx_db_cl_query (self, exists, &there)) {
            snprintf (err, err_size, "the cluster does not answer: %s", self->errmsg);
            rc = -1;
        } else {
            bool has = there.rows == 1 && there.values[0].integer == 1;
            sbx_dqlite_rows_free (&there);
            if (has)
                rc = s_import_table (self, file, table, rows, err, err_size);
        }
        sqlite3_free (exists);
    }
    sqlite3_finalize (tables);
    sqlite3_close (file);
    return rc;
}

//  --------------------------------------------------------------------------
//  Dump: a cluster's database as one SQLite file (sbx backup)

static int s_write_file (const char *path, const void *data, size_t size, bool exclusive)
{
    int fd = open (path, O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0600);
    if (fd < 0)
        return -1;
    const char *p = data;
    size_t left = size;
    while (left > 0) {
        ssize_t n = write (fd, p, left);
        if (n <= 0) {
            close (fd);
            return -1;
        }
        p += n;
        left -= (size_t) n;
    }
    int rc = fsync (fd);
    return close (fd) == 0 ? rc : -1;
}

int sbx_db_dump (const sbx_dqlite_cluster_t *where, const char *name, const char *path, char *err,
                 size_t err_size)
{
    sbx_dqlite_t *leader = sbx_dqlite_connect_leader (
        where->addresses, where->count, where->timeout_ms > 0 ? where->timeout_ms : 5000,
        where->dial, where->dial_arg);
    if (!leader) {
        snprintf (err, err_size, "no control node leads, or none answers");
        return -1;
    }
    sbx_dqlite_file_t *files = NULL;
    size_t count = 0;
    if (sbx_dqlite_dump (leader, name, &files, &count) || count != 2) {
        snprintf (err, err_size, "cannot dump %s: %s", name, sbx_dqlite_errmsg (leader));
        sbx_dqlite_files_free (&files, count);
        sbx_dqlite_destroy (&leader);
        return -1;
    }
    sbx_dqlite_destroy (&leader);
    //  The database, then its WAL beside it: SQLite checkpoints the one into the other.
    char wal[PATH_MAX];
    snprintf (wal, sizeof wal, "%s-wal", path);
    int rc = -1;
    //  Never over a file that is there: anything made here goes again on a failure.
    bool exists = access (path, F_OK) == 0;
    if (exists)
        snprintf (err, err_size, "%s exists", path);
    else if (s_write_file (path, files[0].data, files[0].size, true))
        snprintf (err, err_size, "cannot write %s: %s", path, strerror (errno));
    else if (files[1].size && s_write_file (wal, files[1].data, files[1].size, false))
        snprintf (err, err_size, "cannot write %s: %s", wal, strerror (errno));
    else {
        sqlite3 *db = NULL;
        if (sqlite3_open_v2 (path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) ==
                SQLITE_OK &&
            sqlite3_exec (db, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;", NULL,
                          NULL, NULL) == SQLITE_OK &&
            sqlite3_exec (db, "PRAGMA quick_check", NULL, NULL, NULL) == SQLITE_OK)
            rc = 0;
        else
            snprintf (err, err_size, "the dump of %s does not open as a database: %s", name,
                      db ? sqlite3_errmsg (db) : "out of memory");
        sqlite3_close (db);
    }
    if (!exists) {
        unlink (wal);
        if (rc)
            unlink (path);
    }
    sbx_dqlite_files_free (&files, count);
    return rc;
}
