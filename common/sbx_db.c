/*  sbx_db - see sbx_db.h. This file: SQLite, and what both engines share;
    sbx_db_cluster.c: dqlite. */
#include "sbx_db_priv.h"
#include "sbx_clock.h"
#include "sbx_log.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

//  Long enough to ride out a checkpoint or a CLI reading the file; short enough that a
//  wedged peer shows up as an error rather than a hung daemon.
#define BUSY_TIMEOUT_MS 5000

const char *sbx_db_tx_sql[SBX_DB_TX_COUNT] = {"BEGIN IMMEDIATE", "COMMIT", "ROLLBACK",
                                              "BEGIN DEFERRED"};

//  --------------------------------------------------------------------------
//  Helpers

bool sbx_db_nonempty (const char *text)
{
    return text && *text;
}

bool sbx_db_fits (uint64_t value)
{
    return value <= (uint64_t) INT64_MAX;
}

uint64_t sbx_db_column_u64 (sbx_stmt_t *stmt, int column)
{
    int64_t value = sbx_stmt_column_int64 (stmt, column);
    return value < 0 ? 0 : (uint64_t) value;
}

char *sbx_db_column_dup (sbx_stmt_t *stmt, int column, bool *failed)
{
    const char *text = sbx_stmt_column_text (stmt, column);
    //  SQLite answers NULL both for SQL NULL and when it could not convert the value.
    if (!text) {
        if (failed && stmt->lite &&
            sqlite3_errcode (sqlite3_db_handle (stmt->lite)) == SQLITE_NOMEM)
            *failed = true;
        return NULL;
    }
    char *copy = strdup (text);
    if (!copy && failed)
        *failed = true;
    return copy;
}

//  --------------------------------------------------------------------------
//  Statements: SQLite's own calls, or the dqlite engine's

int sbx_db_bind_text (sbx_stmt_t *stmt, int index, const char *text)
{
    if (!text)
        return sbx_stmt_bind_null (stmt, index);
    if (stmt->lite)
        return sqlite3_bind_text (stmt->lite, index, text, -1, SQLITE_STATIC);
    sbx_dqlite_value_t v = {.type = SBX_DQ_TEXT, .data = text, .size = strlen (text)};
    return sbx_db_cl_bind (stmt, index, &v);
}

int sbx_stmt_bind_int64 (sbx_stmt_t *stmt, int index, int64_t value)
{
    if (stmt->lite)
        return sqlite3_bind_int64 (stmt->lite, index, value);
    sbx_dqlite_value_t v = {.type = SBX_DQ_INTEGER, .integer = value};
    return sbx_db_cl_bind (stmt, index, &v);
}

int sbx_stmt_bind_int (sbx_stmt_t *stmt, int index, int value)
{
    return sbx_stmt_bind_int64 (stmt, index, value);
}

int sbx_stmt_bind_null (sbx_stmt_t *stmt, int index)
{
    if (stmt->lite)
        return sqlite3_bind_null (stmt->lite, index);
    sbx_dqlite_value_t v = {.type = SBX_DQ_NULL};
    return sbx_db_cl_bind (stmt, index, &v);
}

int sbx_stmt_bind_blob (sbx_stmt_t *stmt, int index, const void *data, size_t size)
{
    if (size > INT_MAX)
        return SQLITE_TOOBIG;
    if (stmt->lite)
        return sqlite3_bind_blob (stmt->lite, index, data, (int) size, SQLITE_STATIC);
    sbx_dqlite_value_t v = {.type = SBX_DQ_BLOB, .data = data, .size = size};
    return sbx_db_cl_bind (stmt, index, &v);
}

int sbx_stmt_step (sbx_stmt_t *stmt)
{
    if (stmt->lite) {
        int rc = sqlite3_step (stmt->lite);
        if (rc != SQLITE_DONE && rc != SQLITE_ROW)
            rc = sqlite3_extended_errcode (stmt->db->db);
        return rc;
    }
    return sbx_db_cl_step (stmt);
}

const char *sbx_stmt_column_text (sbx_stmt_t *stmt, int column)
{
    if (stmt->lite)
        return (const char *) sqlite3_column_text (stmt->lite, column);
    return sbx_db_cl_column_text (stmt, column);
}

int64_t sbx_stmt_column_int64 (sbx_stmt_t *stmt, int column)
{
    if (stmt->lite)
        return sqlite3_column_int64 (stmt->lite, column);
    const sbx_dqlite_value_t *v = sbx_db_cl_column (stmt, column);
    if (!v)
        return 0;
    switch (v->type) {
    case SBX_DQ_INTEGER:
    case SBX_DQ_UNIXTIME:
    case SBX_DQ_BOOLEAN:
        return v->integer;
    case SBX_DQ_FLOAT:
        return (int64_t) v->real;
    case SBX_DQ_TEXT:
    case SBX_DQ_ISO8601:
        return strtoll (v->data, NULL, 10);
    default:
        return 0;
    }
}

int sbx_stmt_column_int (sbx_stmt_t *stmt, int column)
{
    if (stmt->lite)
        return sqlite3_column_int (stmt->lite, column);
    //  As SQLite: the low 32 bits.
    return (int) (uint32_t) (uint64_t) sbx_stmt_column_int64 (stmt, column);
}

const void *sbx_stmt_column_blob (sbx_stmt_t *stmt, int column)
{
    if (stmt->lite)
        return sqlite3_column_blob (stmt->lite, column);
    const sbx_dqlite_value_t *v = sbx_db_cl_column (stmt, column);
    if (v && v->type == SBX_DQ_BLOB)
        return v->size ? v->data : NULL;
    return sbx_db_cl_column_text (stmt, column);
}

int sbx_stmt_column_bytes (sbx_stmt_t *stmt, int column)
{
    if (stmt->lite)
        return sqlite3_column_bytes (stmt->lite, column);
    const sbx_dqlite_value_t *v = sbx_db_cl_column (stmt, column);
    if (v && (v->type == SBX_DQ_BLOB || v->type == SBX_DQ_TEXT || v->type == SBX_DQ_ISO8601))
        return (int) v->size;
    const char *text = sbx_db_cl_column_text (stmt, column);
    return text ? (int) strlen (text) : 0;
}

bool sbx_stmt_busy (sbx_stmt_t *stmt)
{
    if (stmt->lite)
        return sqlite3_stmt_busy (stmt->lite) != 0;
    return stmt->ran && !stmt->done && stmt->row > 0;
}

void sbx_db_reset (sbx_stmt_t *stmt)
{
    if (stmt->lite) {
        sqlite3_reset (stmt->lite);
        sqlite3_clear_bindings (stmt->lite);
        return;
    }
    sbx_db_cl_reset (stmt);
}

void sbx_db_log_error (sbx_db_t *self, const char *what)
{
    if (self->cluster)
        sbx_error ("store %s: %s: %s (%d)", self->path, what, self->errmsg, self->errcode);
    else
        sbx_error ("store %s: %s: %s (%d)", self->path, what, sqlite3_errmsg (self->db),
                   sqlite3_extended_errcode (self->db));
}

const char *sbx_db_path (sbx_db_t *self)
{
    return self->path;
}

int sbx_db_schema_version (sbx_db_t *self)
{
    return self ? self->version : -1;
}

sqlite3 *sbx_db_handle (sbx_db_t *self)
{
    return self ? self->db : NULL;
}

bool sbx_db_is_cluster (sbx_db_t *self)
{
    return self && self->cluster;
}

bool sbx_db_not_leader (sbx_db_t *self)
{
    return self && self->cluster &&
           (self->errcode == SBX_DQ_NOT_LEADER || self->errcode == SBX_DQ_LEADERSHIP_LOST);
}

sbx_stmt_t *sbx_db_stmt (sbx_db_t *self, int index)
{
    assert (index >= 0 && index < self->statements);
    return &self->stmt[index];
}

//  The rows of "EXPLAIN QUERY PLAN sql", each step's detail (column 3) to fn.
typedef void (s_plan_fn) (const char *detail, void *arg);
static int s_query_plan (sbx_db_t *self, const char *sql, s_plan_fn *fn, void *arg)
{
    char *explain = NULL;
    if (asprintf (&explain, "EXPLAIN QUERY PLAN %s", sql) < 0)
        return -1;
    int rc = 0;
    if (self->cluster) {
        sbx_dqlite_rows_t rows;
        rc = sbx_db_cl_query (self, explain, &rows);
        for (size_t r = 0; rc == 0 && r < rows.rows; r++) {
            const sbx_dqlite_value_t *v = &rows.values[r * rows.columns + 3];
            if (rows.columns > 3 && v->type == SBX_DQ_TEXT)
                fn (v->data, arg);
        }
        if (rc == 0)
            sbx_dqlite_rows_free (&rows);
    } else {
        sqlite3_stmt *plan = NULL;
        if (sqlite3_prepare_v2 (self->db, explain, -1, &plan, NULL) != SQLITE_OK)
            rc = -1;
        while (rc == 0 && sqlite3_step (plan) == SQLITE_ROW)
            fn ((const char *) sqlite3_column_text (plan, 3), arg);
        sqlite3_finalize (plan);
    }
    free (explain);
    return rc;
}

typedef struct {
    sbx_db_t *db;
    int index;
    sbx_db_allow_fn *allow;
    int found;
} s_scan_t;

static void s_scan_step (const char *step, void *arg)
{
    s_scan_t *scan = arg;
    //  "SCAN t" reads all of t; "SCAN t USING INDEX i" all of an index: as bad.
    //  A covering index scan with a range, or a SEARCH, is what an index is for.
    char table[128];
    if (!step || sscanf (step, "SCAN %127s", table) != 1 || strcmp (table, "CONSTANT") == 0 ||
        strcmp (table, "sqlite_sequence") == 0)
        return;
    if (scan->allow && scan->allow (scan->index, table))
        return;
    fprintf (stderr, "%s: statement %d reads all of %s (%s):\n  %s\n", scan->db->path, scan->index,
             table, step, scan->db->stmt[scan->index].sql);
    scan->found++;
}

int sbx_db_whole_reads (sbx_db_t *self, sbx_db_allow_fn *allow)
{
    if (!self)
        return -1;
    s_scan_t scan = {self, 0, allow, 0};
    for (int i = 0; i < self->statements; i++) {
        scan.index = i;
        if (s_query_plan (self, self->stmt[i].sql, s_scan_step, &scan))
            return -1;
    }
    return scan.found;
}

int sbx_db_changes (sbx_db_t *self)
{
    return self->cluster ? self->changes : sqlite3_changes (self->db);
}

int64_t sbx_db_last_insert_rowid (sbx_db_t *self)
{
    return self->cluster ? self->last_id : sqlite3_last_insert_rowid (self->db);
}

static int s_step (sbx_db_t *self, sbx_stmt_t *stmt, bool quiet_constraints, const char *what)
{
    int rc = sbx_stmt_step (stmt);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW &&
        !(quiet_constraints && (rc & 0xff) == SQLITE_CONSTRAINT))
        sbx_db_log_error (self, what);
    sbx_db_reset (stmt);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

int sbx_db_run (sbx_db_t *self, int index, const char *what)
{
    return s_step (self, sbx_db_stmt (self, index), false, what) == SQLITE_DONE ? 0 : -1;
}

int sbx_db_try (sbx_db_t *self, int index, const char *what)
{
    return s_step (self, sbx_db_stmt (self, index), true, what);
}

int sbx_db_row (sbx_db_t *self, int index, sbx_db_row_fn *fill, void *out, const char *what)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self, index);
    int rc = sbx_stmt_step (stmt);
    int result = -1;
    if (rc == SQLITE_ROW)
        result = fill (stmt, out);
    else if (rc == SQLITE_DONE)
        result = 1;
    else
        sbx_db_log_error (self, what);
    sbx_db_reset (stmt);
    return result;
}

int sbx_db_exec (sbx_db_t *self, const char *sql, const char *what)
{
    if (self->cluster) {
        if (sbx_db_cl_exec (self, sql) == 0)
            return 0;
        sbx_db_log_error (self, what);
        return -1;
    }
    char *message = NULL;
    if (sqlite3_exec (self->db, sql, NULL, NULL, &message) == SQLITE_OK)
        return 0;
    sbx_error ("store %s: %s: %s", self->path, what, message ? message : "failed");
    sqlite3_free (message);
    return -1;
}

int64_t sbx_db_query_int (sbx_db_t *self, const char *sql, const char *what)
{
    int64_t value = -1;
    if (self->cluster) {
        sbx_dqlite_rows_t rows;
        if (sbx_db_cl_query (self, sql, &rows) == 0) {
            if (rows.rows > 0 && rows.values[0].type == SBX_DQ_INTEGER)
                value = rows.values[0].integer;
            sbx_dqlite_rows_free (&rows);
        }
        if (value < 0)
            sbx_db_log_error (self, what);
        return value;
    }
    sqlite3_stmt *stmt = NULL;
    if (sqlite3_prepare_v2 (self->db, sql, -1, &stmt, NULL) == SQLITE_OK &&
        sqlite3_step (stmt) == SQLITE_ROW)
        value = sqlite3_column_int64 (stmt, 0);
    else
        sbx_db_log_error (self, what);
    sqlite3_finalize (stmt);
    return value;
}

//  SQL run for its effect alone, its failure not logged (a rollback after a failure).
static void s_exec_quiet (sbx_db_t *self, const char *sql)
{
    if (self->cluster)
        sbx_db_cl_exec (self, sql);
    else
        sqlite3_exec (self->db, sql, NULL, NULL, NULL);
}

//  --------------------------------------------------------------------------
//  Transactions

bool sbx_db_in_transaction (sbx_db_t *self)
{
    if (!self)
        return false;
    return self->cluster ? self->in_tx : sqlite3_get_autocommit (self->db) == 0;
}

bool sbx_db_require_transaction (sbx_db_t *self, const char *what)
{
    if (sbx_db_in_transaction (self))
        return true;
    sbx_warn ("store %s: %s outside a transaction refused", self->path, what);
    return false;
}

//  Steps one of the transaction statements: 0, or -1 (logged).
static int s_tx (sbx_db_t *self, int which, const char *what)
{
    if (self->cluster) {
        int rc = which == SBX_DB_TX_BEGIN ? sbx_db_cl_begin (self, sbx_db_tx_sql[which])
                                          : sbx_db_cl_end (self, sbx_db_tx_sql[which]);
        if (rc)
            sbx_db_log_error (self, what);
        return rc;
    }
    sbx_stmt_t *stmt = &self->stmt[self->statements + which];
    //  During the migrations the statements are not prepared yet.
    if (!stmt->lite)
        return sbx_db_exec (self, sbx_db_tx_sql[which], what);
    return s_step (self, stmt, false, what) == SQLITE_DONE ? 0 : -1;
}

int sbx_db_begin (sbx_db_t *self)
{
    if (!self)
        return -1;
    if (sbx_db_in_transaction (self)) {
        sbx_warn ("store %s: begin inside a transaction refused", self->path);
        return -1;
    }
    return s_tx (self, SBX_DB_TX_BEGIN, "begin");
}

int sbx_db_commit (sbx_db_t *self)
{
    return sbx_db_in_transaction (self) ? s_tx (self, SBX_DB_TX_COMMIT, "commit") : -1;
}

int sbx_db_rollback (sbx_db_t *self)
{
    return sbx_db_in_transaction (self) ? s_tx (self, SBX_DB_TX_ROLLBACK, "rollback") : -1;
}

int sbx_db_read_begin (sbx_db_t *self)
{
    if (!self || self->cluster || sbx_db_in_transaction (self))
        return 0;
    return s_tx (self, SBX_DB_TX_BEGIN_READ, "begin read") == 0 ? 1 : -1;
}

void sbx_db_read_end (sbx_db_t *self, int opened)
{
    if (opened == 1 && sbx_db_in_transaction (self))
        s_tx (self, SBX_DB_TX_COMMIT, "end read");
}

//  --------------------------------------------------------------------------
//  Opening

//  Creates the file with mode 0600 before SQLite does (SQLite would use 0644 less the
//  umask); sets *loose when an existing file is readable by others. SQLite gives -wal
//  and -shm the main file's mode.
static int s_create_private (const char *path, bool *loose)
{
    int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0) {
        sbx_error ("store %s: cannot open: %s", path, strerror (errno));
        return -1;
    }
    struct stat st;
    int rc = fstat (fd, &st);
    if (rc == 0 && !S_ISREG (st.st_mode)) {
        sbx_error ("store %s: not a regular file", path);
        rc = -1;
    } else if (rc == 0 && st.st_size > 0 && st.st_size < 512) {
        //  Databases are whole pages of 512 bytes or more. SQLite would take some such
        //  stubs for an empty database and overwrite them.
        sbx_error ("store %s: not a database (%lld bytes)", path, (long long) st.st_size);
        rc = -1;
    } else if (rc == 0)
        *loose = (st.st_mode & 077) != 0;
    close (fd);
    return rc;
}

static int s_configure (sbx_db_t *self)
{
    sqlite3_extended_result_codes (self->db, 1);
    sqlite3_busy_timeout (self->db, BUSY_TIMEOUT_MS);
    //  The first statement reads the header: a file that is not a database fails here.
    sqlite3_stmt *stmt = NULL;
    bool wal = false;
    if (sqlite3_prepare_v2 (self->db, "PRAGMA journal_mode=WAL", -1, &stmt, NULL) == SQLITE_OK &&
        sqlite3_step (stmt) == SQLITE_ROW) {
        const char *mode = (const char *) sqlite3_column_text (stmt, 0);
        wal = mode && strcmp (mode, "wal") == 0;
        if (!wal)
            sbx_error ("store %s: cannot use WAL (journal mode stays %s)", self->path,
                       mode ? mode : "?");
    } else
        sbx_db_log_error (self, "cannot read the database");
    sqlite3_finalize (stmt);
    if (!wal)
        return -1;
    //  FULL: a commit survives a power cut (an event, a charge, a snapshot that says
    //  ready). NORMAL in WAL mode may lose the last commits.
    return sbx_db_exec (self, "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", "pragmas");
}

//  Applies the migrations the database lacks, each in its own transaction. Reads the
//  version under the write lock, so two openers cannot both apply one.
static int s_migrate (sbx_db_t *self, const char *daemon, const char *const *migrations, int count)
{
    while (true) {
        if (s_tx (self, SBX_DB_TX_BEGIN, "begin migration"))
            return -1;
        int64_t version = -1;
        //  This text is stored in the file's schema: never change it.
        if (sbx_db_exec (self,
                         "CREATE TABLE IF NOT EXISTS schema_version ("
                         "  version INTEGER NOT NULL PRIMARY KEY, applied_ms INTEGER NOT NULL)",
                         "create schema_version") == 0)
            version =
                sbx_db_query_int (self, "SELECT coalesce (max (version), 0) FROM schema_version",
                                  "read schema_version");
        if (version < 0) {
            sbx_db_rollback (self);
            return -1;
        }
        if (version > count) {
            sbx_error ("store %s: schema version %lld is newer than this %s knows (%d); "
                       "refusing to open (run a newer %s)",
                       self->path, (long long) version, daemon, count, daemon);
            sbx_db_rollback (self);
            return -1;
        }
        if (version == count) {
            self->version = (int) version;
            return s_tx (self, SBX_DB_TX_COMMIT, "commit");
        }
        char record[128];
        snprintf (record, sizeof record,
                  "INSERT INTO schema_version (version, applied_ms) VALUES (%d, %llu)",
                  (int) version + 1, (unsigned long long) sbx_clock_now_ms ());
        if (sbx_db_exec (self, migrations[version], "migration") ||
            sbx_db_exec (self, record, "record migration") ||
            s_tx (self, SBX_DB_TX_COMMIT, "commit migration")) {
            if (sbx_db_in_transaction (self))
                sbx_db_rollback (self);
            sbx_error ("store %s: migration to version %d failed", self->path, (int) version + 1);
            return -1;
        }
        sbx_info ("store %s: schema migrated to version %d", self->path, (int) version + 1);
    }
}

static int s_prepare (sbx_db_t *self, sbx_stmt_t *stmt, const char *sql)
{
    assert (sql);
    stmt->db = self;
    stmt->sql = sql;
    if (self->cluster) {
        //  Prepared on the node when first run (and again on each new connection).
        const char *word = sql + strspn (sql, " \t\r\n(");
        static const char *const readers[] = {"SELECT", "WITH", "VALUES", "EXPLAIN", "PRAGMA"};
        for (size_t i = 0; i < sizeof readers / sizeof *readers; i++)
            if (strncasecmp (word, readers[i], strlen (readers[i])) == 0)
                stmt->returns_rows = true;
        if (strcasestr (sql, "RETURNING")) {
            sbx_error ("store %s: RETURNING is not replicated by dqlite: %s", self->path, sql);
            return -1;
        }
        return 0;
    }
    if (sqlite3_prepare_v3 (self->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt->lite, NULL) ==
        SQLITE_OK)
        return 0;
    sbx_db_log_error (self, "prepare");
    return -1;
}

static sbx_db_t *s_new (const char *path, int statements)
{
    sbx_db_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->path = strdup (path);
    self->statements = statements;
    self->stmt = calloc ((size_t) statements + SBX_DB_TX_COUNT, sizeof *self->stmt);
    if (!self->path || !self->stmt)
        sbx_db_destroy (&self);
    return self;
}

//  The store's statements and the transaction ones, once the schema is up to date.
static int s_ready (sbx_db_t *self, const char *const *sql)
{
    for (int i = 0; i < self->statements; i++)
        if (s_prepare (self, &self->stmt[i], sql[i]))
            return -1;
    for (int i = 0; i < SBX_DB_TX_COUNT; i++)
        if (s_prepare (self, &self->stmt[self->statements + i], sbx_db_tx_sql[i]))
            return -1;
    sbx_debug ("store %s: open at schema version %d", self->path, self->version);
    return 0;
}

sbx_db_t *sbx_db_new (const char *path, const char *daemon, const char *const *migrations,
                      int migration_count, const char *const *sql, int statements)
{
    assert (daemon && migration_count >= 0 && statements >= 0);
    if (!sbx_db_nonempty (path))
        return NULL;
    sbx_db_t *self = s_new (path, statements);
    bool loose = false;
    if (!self || s_create_private (path, &loose))
        goto failed;
    int rc = sqlite3_open_v2 (path, &self->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sbx_error ("store %s: cannot open: %s", path,
                   self->db ? sqlite3_errmsg (self->db) : sqlite3_errstr (rc));
        goto failed;
    }
    if (s_configure (self))
        goto failed;
    //  The schema is brought up to date before the mode is tightened, so that only a file
    //  known to be a database of ours is touched: stores hold what only their daemon may
    //  read (password hashes, balances, every account's snapshots).
    if (s_migrate (self, daemon, migrations, migration_count))
        goto failed;
    if (loose) {
        sbx_warn ("store %s: was readable by others, now mode 0600", path);
        if (chmod (path, 0600))
            sbx_warn ("store %s: chmod: %s", path, strerror (errno));
    }
    if (s_ready (self, sql))
        goto failed;
    return self;

failed:
    sbx_db_destroy (&self);
    return NULL;
}

sbx_db_t *sbx_db_new_cluster (const sbx_dqlite_cluster_t *cluster, const char *name,
                              const char *daemon, const char *const *migrations,
                              int migration_count, const char *const *sql, int statements)
{
    assert (daemon && migration_count >= 0 && statements >= 0);
    if (!cluster || cluster->count == 0 || !sbx_db_nonempty (name))
        return NULL;
    char path[256];
    snprintf (path, sizeof path, "dqlite:%s", name);
    sbx_db_t *self = s_new (path, statements);
    if (!self)
        return NULL;
    self->cluster = true;
    if (sbx_db_cl_open (self, cluster, name) ||
        s_migrate (self, daemon, migrations, migration_count) || s_ready (self, sql)) {
        sbx_db_destroy (&self);
        return NULL;
    }
    return self;
}

void sbx_db_destroy (sbx_db_t **self_p)
{
    assert (self_p);
    sbx_db_t *self = *self_p;
    if (!self)
        return;
    if (self->db && sqlite3_get_autocommit (self->db) == 0) {
        sbx_warn ("store %s: closed inside a transaction; rolled back", self->path);
        sqlite3_exec (self->db, "ROLLBACK", NULL, NULL, NULL);
    }
    if (self->cluster && self->in_tx) {
        sbx_warn ("store %s: closed inside a transaction; rolled back", self->path);
        s_exec_quiet (self, "ROLLBACK");
    }
    if (self->stmt)
        for (int i = 0; i < self->statements + SBX_DB_TX_COUNT; i++) {
            sqlite3_finalize (self->stmt[i].lite); //  NULL (never prepared) is harmless
            sbx_db_cl_stmt_free (&self->stmt[i]);
        }
    if (self->db && sqlite3_close (self->db) != SQLITE_OK)
        sbx_db_log_error (self, "close");
    sbx_db_cl_close (self);
    free (self->stmt);
    free (self->path);
    free (self);
    *self_p = NULL;
}

//  Self-test

#define streq(a, b) (strcmp ((a), (b)) == 0)

static const char *s_test_migrations[] = {
    "CREATE TABLE items (id TEXT NOT NULL PRIMARY KEY, size INTEGER NOT NULL);",
    "ALTER TABLE items ADD COLUMN note TEXT;",
};

enum { TEST_INSERT, TEST_FIND, TEST_COUNT };
static const char *s_test_sql[TEST_COUNT] = {
    [TEST_INSERT] = "INSERT INTO items (id, size, note) VALUES (?1, ?2, ?3)",
    [TEST_FIND] = "SELECT id, size, note FROM items WHERE id = ?1",
};

typedef struct {
    char *id;
    uint64_t size;
    char *note;
} test_item_t;

static int s_test_item (sbx_stmt_t *stmt, void *arg)
{
    test_item_t *item = arg;
    bool failed = false;
    item->id = sbx_db_column_dup (stmt, 0, &failed);
    item->size = sbx_db_column_u64 (stmt, 1);
    item->note = sbx_db_column_dup (stmt, 2, &failed);
    return failed ? -1 : 0;
}

//  The statements need the second migration's column: an older daemon has none.
static sbx_db_t *s_test_open (const char *path, int migrations)
{
    return sbx_db_new (path, "sbx-test", s_test_migrations, migrations, s_test_sql,
                       migrations == 2 ? TEST_COUNT : 0);
}

static int s_test_insert (sbx_db_t *db, const char *id, int64_t size)
{
    sbx_stmt_t *stmt = sbx_db_stmt (db, TEST_INSERT);
    sbx_db_bind_text (stmt, 1, id);
    sbx_stmt_bind_int64 (stmt, 2, size);
    sbx_db_bind_text (stmt, 3, NULL);
    return sbx_db_try (db, TEST_INSERT, "insert");
}

static int s_test_find (sbx_db_t *db, const char *id, test_item_t *item)
{
    memset (item, 0, sizeof *item);
    sbx_db_bind_text (sbx_db_stmt (db, TEST_FIND), 1, id);
    return sbx_db_row (db, TEST_FIND, s_test_item, item, "find");
}

static void s_test_write (const char *path, const char *text)
{
    FILE *file = fopen (path, "w");
    assert (file);
    fputs (text, file);
    fclose (file);
}

int sbx_db_copy (const char *from, const char *to, int *version, char *err, size_t err_size)
{
    assert (from && to && version && err);
    *version = 0;
    int fd = open (to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd == -1) {
        snprintf (err, err_size, "cannot create %s: %s", to, strerror (errno));
        return -1;
    }
    close (fd);
    sqlite3 *src = NULL, *dst = NULL;
    int rc = sqlite3_open_v2 (from, &src, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_open_v2 (to, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout (src, 5000);
        sqlite3_busy_timeout (dst, 5000);
        //  One step: the copy is of one instant, whatever the daemon commits meanwhile.
        sqlite3_backup *backup = sqlite3_backup_init (dst, "main", src, "main");
        if (!backup)
            rc = sqlite3_errcode (dst);
        else {
            rc = sqlite3_backup_step (backup, -1);
            int finish = sqlite3_backup_finish (backup);
            rc = rc == SQLITE_DONE ? finish : rc;
        }
    }
    if (rc == SQLITE_OK) {
        sqlite3_stmt *stmt = NULL;
        //  A store without schema_version (not one of ours) has version 0.
        if (sqlite3_prepare_v2 (dst, "SELECT coalesce (max (version), 0) FROM schema_version", -1,
                                &stmt, NULL) == SQLITE_OK &&
            sqlite3_step (stmt) == SQLITE_ROW)
            *version = sqlite3_column_int (stmt, 0);
        sqlite3_finalize (stmt);
    }
    if (rc != SQLITE_OK)
        snprintf (err, err_size, "cannot copy the database %s: %s", from, sqlite3_errstr (rc));
    sqlite3_close (src);
    if (sqlite3_close (dst) != SQLITE_OK && rc == SQLITE_OK) {
        snprintf (err, err_size, "cannot close the copy %s", to);
        rc = SQLITE_ERROR;
    }
    if (rc != SQLITE_OK)
        unlink (to);
    return rc == SQLITE_OK ? 0 : -1;
}

//  Quotes an SQL identifier ("a""b"): table and column names come from the file.
static char *s_ident (const char *name)
{
    size_t n = strlen (name), quotes = 0;
    for (const char *c = name; *c; c++)
        quotes += *c == '"';
    char *out = malloc (n + quotes + 3), *o = out;
    if (!out)
        return NULL;
    *o++ = '"';
    for (const char *c = name; *c; c++) {
        if (*c == '"')
            *o++ = '"';
        *o++ = *c;
    }
    *o++ = '"';
    *o = 0;
    return out;
}

//  Rewrites one column's values; the changes, or -1.
static int s_move_column (sqlite3 *db, const char *table, const char *column, const char *from,
                          const char *to)
{
    char *t = s_ident (table), *c = s_ident (column), *sql = NULL;
    int changes = -1;
    if (t && c &&
        asprintf (&sql,
                  "UPDATE %s SET %s = ?2 || substr (%s, length (?1) + 1) WHERE typeof (%s) = "
                  "'text' AND (%s = ?1 OR substr (%s, 1, length (?1) + 1) = ?1 || '/')",
                  t, c, c, c, c, c) > 0) {
        sqlite3_stmt *stmt = NULL;
        if (sqlite3_prepare_v2 (db, sql, -1, &stmt, NULL) == SQLITE_OK &&
            sqlite3_bind_text (stmt, 1, from, -1, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_bind_text (stmt, 2, to, -1, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_step (stmt) == SQLITE_DONE)
            changes = sqlite3_changes (db);
        sqlite3_finalize (stmt);
    }
    free (sql);
    free (t);
    free (c);
    return changes;
}

int sbx_db_file_move_paths (const char *path, const char *from, const char *to, char *err,
                            size_t err_size)
{
    assert (path && from && to && err);
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2 (path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout (db, 5000);
        rc = sqlite3_exec (db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    }
    sqlite3_stmt *columns = NULL;
    //  Every column of every table of ours (not SQLite's own, not virtual tables).
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2 (db,
                                 "SELECT m.name, c.name FROM sqlite_schema AS m, "
                                 "pragma_table_info (m.name) AS c WHERE m.type = 'table' AND "
                                 "m.name NOT LIKE 'sqlite_%' AND m.sql NOT LIKE 'CREATE VIRTUAL%'",
                                 -1, &columns, NULL);
    int total = 0;
    while (rc == SQLITE_OK) {
        int step = sqlite3_step (columns);
        if (step == SQLITE_DONE)
            break;
        if (step != SQLITE_ROW) {
            rc = step;
            break;
        }
        //  Copies: the UPDATE may not run while this statement's row is read.
        char *table = strdup ((const char *) sqlite3_column_text (columns, 0));
        char *column = strdup ((const char *) sqlite3_column_text (columns, 1));
        int changes = table && column ? s_move_column (db, table, column, from, to) : -1;
        free (table);
        free (column);
        if (changes < 0)
            rc = SQLITE_ERROR;
        else
            total += changes;
    }
    sqlite3_finalize (columns);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec (db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        snprintf (err, err_size, "cannot rewrite the paths in %s: %s", path,
                  db ? sqlite3_errmsg (db) : sqlite3_errstr (rc));
        sqlite3_exec (db, "ROLLBACK", NULL, NULL, NULL);
    }
    sqlite3_close (db);
    return rc == SQLITE_OK ? total : -1;
}

void sbx_db_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/sbx_db_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/test.db", dir);

    //  A new file: private, WAL, FULL, foreign keys; the first migration applied.
    sbx_db_t *db = s_test_open (path, 1);
    assert (db);
    assert (sbx_db_schema_version (db) == 1);
    assert (streq (sbx_db_path (db), path));
    struct stat st;
    assert (stat (path, &st) == 0 && S_ISREG (st.st_mode) && (st.st_mode & 0777) == 0600);
    sqlite3_stmt *stmt = NULL;
    assert (sqlite3_prepare_v2 (db->db, "PRAGMA journal_mode", -1, &stmt, NULL) == SQLITE_OK);
    assert (sqlite3_step (stmt) == SQLITE_ROW);
    assert (streq ((const char *) sqlite3_column_text (stmt, 0), "wal"));
    sqlite3_finalize (stmt);
    assert (sbx_db_query_int (db, "PRAGMA synchronous", "synchronous") == 2);
    assert (sbx_db_query_int (db, "PRAGMA foreign_keys", "foreign keys") == 1);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM schema_version", "") == 1);
    sbx_db_destroy (&db);
    assert (db == NULL);
    sbx_db_destroy (&db);

    //  A newer daemon's second migration: applied once, recorded, never again.
    db = s_test_open (path, 2);
    assert (db && sbx_db_schema_version (db) == 2);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM schema_version", "") == 2);
    assert (sbx_db_query_int (db, "SELECT max (version) FROM schema_version", "") == 2);
    sbx_db_destroy (&db);
    db = s_test_open (path, 2);
    assert (db && sbx_db_query_int (db, "SELECT count(*) FROM schema_version", "") == 2);

    //  Transactions: writes outside one refused where the store asks; no nesting.
    assert (!sbx_db_in_transaction (db));
    assert (!sbx_db_require_transaction (db, "test write"));
    assert (sbx_db_commit (db) == -1 && sbx_db_rollback (db) == -1);
    assert (sbx_db_begin (db) == 0 && sbx_db_in_transaction (db));
    assert (sbx_db_require_transaction (db, "test write"));
    assert (sbx_db_begin (db) == -1);
    assert (s_test_insert (db, "a", 10) == SQLITE_DONE);
    assert (sbx_db_changes (db) == 1 && sbx_db_last_insert_rowid (db) == 1);
    assert (s_test_insert (db, "a", 11) == SQLITE_CONSTRAINT_PRIMARYKEY); //  the caller's
    sbx_stmt_t *insert = sbx_db_stmt (db, TEST_INSERT);
    sbx_db_bind_text (insert, 1, "a");
    sbx_stmt_bind_int64 (insert, 2, 12);
    assert (sbx_db_run (db, TEST_INSERT, "insert") == -1); //  logged
    sbx_db_bind_text (insert, 1, "d");
    sbx_stmt_bind_int64 (insert, 2, 12);
    assert (sbx_db_run (db, TEST_INSERT, "insert") == 0 && sbx_db_changes (db) == 1);
    assert (sbx_db_commit (db) == 0 && !sbx_db_in_transaction (db));
    assert (sbx_db_begin (db) == 0);
    assert (s_test_insert (db, "b", 20) == SQLITE_DONE);
    assert (sbx_db_rollback (db) == 0);
    test_item_t item;
    assert (s_test_find (db, "a", &item) == 0);
    assert (streq (item.id, "a") && item.size == 10 && !item.note);
    free (item.id);
    assert (s_test_find (db, "b", &item) == 1 && !item.id);

    //  A read transaction: one snapshot for its reads (another connection's write is
    //  seen after it ends, not inside); none opened inside a transaction.
    int opened = sbx_db_read_begin (db);
    assert (opened == 1 && sbx_db_in_transaction (db));
    assert (s_test_find (db, "a", &item) == 0);
    free (item.id);
    sqlite3 *writer = NULL;
    assert (sqlite3_open (path, &writer) == SQLITE_OK);
    assert (sqlite3_exec (writer, "INSERT INTO items (id, size) VALUES ('e', 50)", NULL, NULL,
                          NULL) == SQLITE_OK);
    assert (s_test_find (db, "e", &item) == 1);
    sbx_db_read_end (db, opened);
    assert (!sbx_db_in_transaction (db));
    assert (s_test_find (db, "e", &item) == 0 && item.size == 50);
    free (item.id);
    assert (sqlite3_exec (writer, "DELETE FROM items WHERE id = 'e'", NULL, NULL, NULL) ==
            SQLITE_OK);
    sqlite3_close (writer);
    assert (sbx_db_begin (db) == 0);
    assert (sbx_db_read_begin (db) == 0);
    sbx_db_read_end (db, 0);
    assert (sbx_db_in_transaction (db) && sbx_db_rollback (db) == 0);
    assert (sbx_db_read_begin (NULL) == 0);

    //  Closed inside a transaction: rolled back.
    assert (sbx_db_begin (db) == 0);
    assert (s_test_insert (db, "c", 30) == SQLITE_DONE);
    sbx_db_destroy (&db);
    db = s_test_open (path, 2);
    assert (db && s_test_find (db, "c", &item) == 1);
    assert (sbx_db_query_int (db, "SELECT count(*) FROM items", "") == 2);

    //  A copy while the store is open, its version, a statement run on the copy.
    char copy[PATH_MAX], err[256];
    snprintf (copy, sizeof copy, "%s/copy.db", dir);
    int version = -1;
    assert (sbx_db_copy (path, copy, &version, err, sizeof err) == 0 && version == 2);
    assert (stat (copy, &st) == 0 && (st.st_mode & 0777) == 0600);
    assert (sbx_db_copy (path, copy, &version, err, sizeof err) == -1); //  exists
    assert (strstr (err, copy));
    //  Paths moved: the directory itself and what is under it; a longer name is not.
    sbx_db_t *other = s_test_open (copy, 2);
    assert (other);
    assert (sbx_db_exec (other,
                         "INSERT INTO items (id, size, note) VALUES ('/old/x', 1, '/old'), "
                         "('/older', 2, '/old/'), ('k', 3, 'x/old/y')",
                         "") == 0);
    sbx_db_destroy (&other);
    assert (sbx_db_file_move_paths (copy, "/old", "/n\"ew", err, sizeof err) == 3);
    other = s_test_open (copy, 2);
    assert (other);
    assert (sbx_db_query_int (other,
                              "SELECT count(*) FROM items WHERE (id, note) IN (VALUES "
                              "('/n\"ew/x', '/n\"ew'), ('/older', '/n\"ew/'), ('k', 'x/old/y'))",
                              "") == 3);
    sbx_db_destroy (&other);
    assert (s_test_find (db, "a", &item) == 0); //  the original is untouched
    free (item.id);
    snprintf (copy, sizeof copy, "%s/missing.db", dir);
    assert (sbx_db_file_move_paths (copy, "/a", "/b", err, sizeof err) == -1);
    assert (strstr (err, "missing.db"));
    assert (sbx_db_copy (copy, path, &version, err, sizeof err) == -1);

    //  A schema newer than this daemon knows: refused, and the file left as it is.
    sbx_db_destroy (&db);
    assert (s_test_open (path, 1) == NULL);
    db = s_test_open (path, 2);
    assert (db);
    assert (sbx_db_exec (db, "INSERT INTO schema_version VALUES (99, 0)", "") == 0);
    sbx_db_destroy (&db);
    assert (s_test_open (path, 2) == NULL);

    //  Not databases: a stub SQLite would overwrite, text, a directory; never crashed.
    snprintf (path, sizeof path, "%s/tiny.db", dir);
    s_test_write (path, "junk");
    assert (s_test_open (path, 2) == NULL);
    assert (stat (path, &st) == 0 && st.st_size == 4); //  untouched
    snprintf (path, sizeof path, "%s/text.db", dir);
    char text[1024];
    memset (text, 'x', sizeof text - 1);
    text[sizeof text - 1] = 0;
    s_test_write (path, text);
    assert (s_test_open (path, 2) == NULL);
    assert (s_test_open (dir, 2) == NULL);
    snprintf (path, sizeof path, "%s/missing/test.db", dir);
    assert (s_test_open (path, 2) == NULL);
    assert (s_test_open ("", 2) == NULL && s_test_open (NULL, 2) == NULL);

    //  A loose file of ours is made private once it is known to be a database.
    snprintf (path, sizeof path, "%s/loose.db", dir);
    db = s_test_open (path, 2);
    assert (db);
    sbx_db_destroy (&db);
    assert (chmod (path, 0644) == 0);
    db = s_test_open (path, 2);
    assert (db && stat (path, &st) == 0 && (st.st_mode & 0777) == 0600);
    sbx_db_destroy (&db);

    DIR *handle = opendir (dir);
    assert (handle);
    struct dirent *entry;
    while ((entry = readdir (handle)))
        if (!streq (entry->d_name, ".") && !streq (entry->d_name, "..")) {
            snprintf (path, sizeof path, "%s/%s", dir, entry->d_name);
            assert (unlink (path) == 0);
        }
    closedir (handle);
    assert (rmdir (dir) == 0);
}
