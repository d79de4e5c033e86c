/*  snap_store - see snap_store.h */
#include "snap_store.h"
#include "sbx_common.h"
#include "sbx_db.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

//  --------------------------------------------------------------------------
//  Schema migrations. Entry i brings the schema from version i to i + 1, in one
//  transaction with its schema_version row. APPEND to change the schema.

//  Every column, as migration 5 copies them.
#define S_COLUMNS_5                                                                                \
    "id, account, name, sandbox_id, type, state, kind, image, qemu_version, parent, reason, "      \
    "disk_bytes, memory_bytes, created_ms, sandbox_deleted, key_id"

static const char *s_migrations[] = {
    //  1: snapshots, their labels, and the sandboxes made from them.
    "CREATE TABLE snapshots ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  name TEXT,"
    "  sandbox_id TEXT NOT NULL,"
    "  type TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('saving', 'ready', 'failed')),"
    "  kind TEXT NOT NULL CHECK (kind IN ('user', 'automatic')),"
    "  image TEXT,"
    "  qemu_version TEXT,"
    "  parent TEXT,"
    "  reason TEXT,"
    "  disk_bytes INTEGER NOT NULL DEFAULT 0,"
    "  memory_bytes INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX snapshots_by_account ON snapshots (account, created_ms);"
    "CREATE INDEX snapshots_by_parent ON snapshots (parent);"
    "CREATE TABLE labels ("
    "  snapshot_id TEXT NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,"
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY (snapshot_id, key));"
    "CREATE TABLE uses ("
    "  snapshot_id TEXT NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,"
    "  sandbox_id TEXT NOT NULL PRIMARY KEY);"
    "CREATE INDEX uses_by_snapshot ON uses (snapshot_id);",
    //  2: the sandbox a snapshot was saved from is deleted: its automatic snapshots go
    //  once nothing stands on them.
    "ALTER TABLE snapshots ADD COLUMN sandbox_deleted INTEGER NOT NULL DEFAULT 0;",
    //  3: the API key that created the sandbox it was saved from: a ci key sees only
    //  snapshots of its own sandboxes (older rows: NULL, seen by no ci key).
    "ALTER TABLE snapshots ADD COLUMN key_id TEXT;",
    //  4: a sandbox's snapshots (its automatic ones; marking them when it is deleted) by
    //  index, not by reading the whole catalog.
    "CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_ms);",
    //  5: kind fork (fork_sandbox's captures). SQLite cannot change a CHECK in place: the
    //  three tables are copied (rowids kept: uses are listed in their order), the old ones
    //  dropped (labels and uses first, so no cascade fires) and the copies renamed (the
    //  references follow the rename).
    "CREATE TABLE snapshots_5 ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  name TEXT,"
    "  sandbox_id TEXT NOT NULL,"
    "  type TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('saving', 'ready', 'failed')),"
    "  kind TEXT NOT NULL CHECK (kind IN ('user', 'automatic', 'fork')),"
    "  image TEXT,"
    "  qemu_version TEXT,"
    "  parent TEXT,"
    "  reason TEXT,"
    "  disk_bytes INTEGER NOT NULL DEFAULT 0,"
    "  memory_bytes INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  sandbox_deleted INTEGER NOT NULL DEFAULT 0,"
    "  key_id TEXT);"
    "INSERT INTO snapshots_5 (rowid, " S_COLUMNS_5 ") SELECT rowid, " S_COLUMNS_5 " FROM snapshots;"
    "CREATE TABLE labels_5 ("
    "  snapshot_id TEXT NOT NULL REFERENCES snapshots_5 (id) ON DELETE CASCADE,"
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY (snapshot_id, key));"
    "INSERT INTO labels_5 (rowid, snapshot_id, key, value) "
    "SELECT rowid, snapshot_id, key, value FROM labels;"
    "CREATE TABLE uses_5 ("
    "  snapshot_id TEXT NOT NULL REFERENCES snapshots_5 (id) ON DELETE CASCADE,"
    "  sandbox_id TEXT NOT NULL PRIMARY KEY);"
    "INSERT INTO uses_5 (rowid, snapshot_id, sandbox_id) "
    "SELECT rowid, snapshot_id, sandbox_id FROM uses;"
    "DROP TABLE uses;"
    "DROP TABLE labels;"
    "DROP TABLE snapshots;"
    "ALTER TABLE snapshots_5 RENAME TO snapshots;"
    "ALTER TABLE labels_5 RENAME TO labels;"
    "ALTER TABLE uses_5 RENAME TO uses;"
    "CREATE INDEX snapshots_by_account ON snapshots (account, created_ms);"
    "CREATE INDEX snapshots_by_parent ON snapshots (parent);"
    "CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_ms);"
    "CREATE INDEX uses_by_snapshot ON uses (snapshot_id);"
    //  The forks' captures, which snapshotd looks over when it starts.
    "CREATE INDEX snapshots_forks ON snapshots (state) WHERE kind = 'fork';",
    //  6: several hosts (a cluster's catalog is shared): the host that saves a snapshot,
    //  the hosts that keep a whole copy of its files (replicas counts them, so that the
    //  user snapshots wanting a second copy are found by index), each host's queue of
    //  files to remove (a delete on one host for copies on others), and what was copied
    //  in from a one-machine catalog. Older rows have no host: the snapshotd that opens
    //  the catalog first takes them as its own (snap_store_adopt).
    "ALTER TABLE snapshots ADD COLUMN host TEXT;"
    "ALTER TABLE snapshots ADD COLUMN replicas INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX snapshots_wanting ON snapshots (created_ms) "
    "  WHERE kind = 'user' AND state = 'ready' AND replicas < 2;"
    "CREATE INDEX snapshots_by_host ON snapshots (host, state);"
    "CREATE TABLE copies ("
    "  snapshot_id TEXT NOT NULL,"
    "  host TEXT NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (snapshot_id, host));"
    "CREATE INDEX copies_by_host ON copies (host);"
    "CREATE TABLE removals ("
    "  host TEXT NOT NULL,"
    "  snapshot_id TEXT NOT NULL,"
    "  PRIMARY KEY (host, snapshot_id));"
    "CREATE TABLE meta (key TEXT NOT NULL PRIMARY KEY, value TEXT);",
};

#define MIGRATION_COUNT ((int) (sizeof s_migrations / sizeof s_migrations[0]))
#define S_COLUMNS                                                                                  \
    "id, account, name, sandbox_id, type, state, kind, image, qemu_version, parent, reason, "      \
    "disk_bytes, memory_bytes, created_ms, sandbox_deleted, key_id"

#define S_READ S_COLUMNS ", host"

typedef enum {
    ST_INSERT,
    ST_LABEL_SET,
    ST_FIND,
    ST_FINISH,
    ST_DELETE,
    ST_LIST,
    ST_LIST_ALL,
    ST_LABELS,
    ST_USE_ADD,
    ST_USE_DROP,
    ST_USERS,
    ST_ORIGIN,
    ST_CHILD,
    ST_SAVING,
    ST_AUTOMATIC,
    ST_SANDBOX_DELETED,
    ST_FORKS,
    ST_COPY_ADD,
    ST_COPY_COUNT,
    ST_COPIES,
    ST_HAS_COPY,
    ST_QUEUE_REMOVALS,
    ST_COPIES_DROP,
    ST_REMOVALS,
    ST_REMOVAL_DONE,
    ST_WANTING,
    ST_ADOPT_COPIES,
    ST_ADOPT,
    ST_META_GET,
    ST_META_SET,
    ST_ANY,
    ST_COPIES_ON,
    ST_COUNT
} stmt_id_t;

static const char *s_sql[ST_COUNT] = {
    [ST_INSERT] = "INSERT INTO snapshots (" S_COLUMNS ", host) VALUES "
                  "(?1, ?2, ?3, ?4, ?5, 'saving', ?6, ?7, ?8, ?9, NULL, 0, 0, ?10, 0, ?11, ?12)",
    [ST_LABEL_SET] = "INSERT INTO labels (snapshot_id, key, value) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT (snapshot_id, key) DO UPDATE SET value = excluded.value",
    [ST_FIND] = "SELECT " S_READ " FROM snapshots WHERE id = ?1",
    [ST_FINISH] = "UPDATE snapshots SET state = CASE WHEN ?2 IS NULL THEN 'ready' ELSE 'failed' "
                  "END, reason = ?2, disk_bytes = ?3, memory_bytes = ?4, "
                  "image = coalesce (?5, image), qemu_version = coalesce (?6, qemu_version) "
                  "WHERE id = ?1 AND state = 'saving'",
    [ST_DELETE] = "DELETE FROM snapshots WHERE id = ?1",
    //  (Two statements: "?1 IS NULL OR account = ?1" would read the whole catalog.)
    [ST_LIST] = "SELECT " S_READ " FROM snapshots WHERE account = ?1 "
                "ORDER BY created_ms DESC, rowid DESC",
    [ST_LIST_ALL] = "SELECT " S_READ " FROM snapshots ORDER BY created_ms DESC, rowid DESC",
    [ST_LABELS] = "SELECT key, value FROM labels WHERE snapshot_id = ?1 ORDER BY key",
    [ST_USE_ADD] = "INSERT INTO uses (snapshot_id, sandbox_id) VALUES (?1, ?2) "
                   "ON CONFLICT (sandbox_id) DO UPDATE SET snapshot_id = excluded.snapshot_id",
    [ST_USE_DROP] = "DELETE FROM uses WHERE sandbox_id = ?1",
    [ST_USERS] = "SELECT sandbox_id FROM uses WHERE snapshot_id = ?1 ORDER BY rowid",
    [ST_ORIGIN] = "SELECT snapshot_id FROM uses WHERE sandbox_id = ?1",
    [ST_CHILD] = "SELECT id FROM snapshots WHERE parent = ?1 AND state != 'failed' LIMIT 1",
    //  This host's saves (a cluster's other hosts save their own meanwhile).
    [ST_SAVING] = "SELECT id FROM snapshots WHERE host = ?1 AND state = 'saving'",
    [ST_AUTOMATIC] = "SELECT id FROM snapshots WHERE sandbox_id = ?1 AND kind = 'automatic' "
                     "AND state != 'saving' ORDER BY created_ms DESC, rowid DESC",
    [ST_SANDBOX_DELETED] = "UPDATE snapshots SET sandbox_deleted = 1 WHERE sandbox_id = ?1",
    [ST_FORKS] = "SELECT id FROM snapshots WHERE kind = 'fork' AND state = 'ready'",
    //  A copy of a ready snapshot (none of one that is gone or failed).
    [ST_COPY_ADD] = "INSERT INTO copies (snapshot_id, host, at_ms) SELECT id, ?2, ?3 FROM "
                    "snapshots WHERE id = ?1 AND state = 'ready' ON CONFLICT DO NOTHING",
    [ST_COPY_COUNT] = "UPDATE snapshots SET replicas = (SELECT count(*) FROM copies WHERE "
                      "snapshot_id = ?1) WHERE id = ?1",
    [ST_COPIES] = "SELECT host FROM copies WHERE snapshot_id = ?1 ORDER BY at_ms, host",
    [ST_HAS_COPY] = "SELECT 1 FROM copies WHERE snapshot_id = ?1 AND host = ?2",
    [ST_QUEUE_REMOVALS] = "INSERT INTO removals (host, snapshot_id) SELECT host, snapshot_id FROM "
                          "copies WHERE snapshot_id = ?1 AND host != ?2 ON CONFLICT DO NOTHING",
    [ST_COPIES_DROP] = "DELETE FROM copies WHERE snapshot_id = ?1",
    [ST_REMOVALS] = "SELECT snapshot_id FROM removals WHERE host = ?1 LIMIT 64",
    [ST_REMOVAL_DONE] = "DELETE FROM removals WHERE host = ?1 AND snapshot_id = ?2",
    [ST_WANTING] = "SELECT id FROM snapshots WHERE kind = 'user' AND state = 'ready' AND "
                   "replicas < 2 ORDER BY created_ms LIMIT 64",
    //  Rows of a catalog from before hosts (or copied in from one machine): this host's.
    [ST_ADOPT_COPIES] = "INSERT INTO copies (snapshot_id, host, at_ms) SELECT id, ?1, created_ms "
                        "FROM snapshots WHERE host IS NULL AND state = 'ready' "
                        "ON CONFLICT DO NOTHING",
    [ST_ADOPT] = "UPDATE snapshots SET host = ?1, replicas = (SELECT count(*) FROM copies WHERE "
                 "snapshot_id = snapshots.id) WHERE host IS NULL",
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    [ST_META_SET] = "INSERT INTO meta (key, value) VALUES (?1, ?2) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    [ST_ANY] = "SELECT id FROM snapshots LIMIT 1",
    [ST_COPIES_ON] = "SELECT snapshot_id FROM copies WHERE host = ?1 ORDER BY snapshot_id LIMIT 64",
};

struct _snap_store_t {
    sbx_db_t *db;
    char *host; //  this snapshotd's host: its saves and copies are recorded as its
};

static void s_record_read (sbx_stmt_t *stmt, snap_record_t *record)
{
    char **strings[] = {&record->id,         &record->account, &record->name,
                        &record->sandbox_id, &record->type,    &record->state,
                        &record->kind,       &record->image,   &record->qemu_version,
                        &record->parent,     &record->reason};
    for (int i = 0; i < 11; i++)
        *strings[i] = sbx_db_column_dup (stmt, i, NULL);
    record->disk_bytes = sbx_db_column_u64 (stmt, 11);
    record->memory_bytes = sbx_db_column_u64 (stmt, 12);
    record->created_ms = sbx_db_column_u64 (stmt, 13);
    record->sandbox_deleted = sbx_stmt_column_int (stmt, 14) != 0;
    record->key_id = sbx_db_column_dup (stmt, 15, NULL);
    record->host = sbx_db_column_dup (stmt, 16, NULL);
}

void snap_record_clear (snap_record_t *record)
{
    if (!record)
        return;
    free (record->id);
    free (record->account);
    free (record->name);
    free (record->sandbox_id);
    free (record->type);
    free (record->state);
    free (record->kind);
    free (record->image);
    free (record->qemu_version);
    free (record->parent);
    free (record->reason);
    free (record->key_id);
    free (record->host);
    memset (record, 0, sizeof *record);
}

//  --------------------------------------------------------------------------
//  Opening

snap_store_t *snap_store_new (const char *path, const char *host)
{
    snap_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    //  Private (0600): the catalog names every account's snapshots. FULL: a record that
    //  says ready survives a power cut, as its files do.
    self->db = sbx_db_new (path, "sbx-snapshotd", s_migrations, MIGRATION_COUNT, s_sql, ST_COUNT);
    self->host = strdup (host && *host ? host : "local");
    if (!self->db || !self->host)
        snap_store_destroy (&self);
    return self;
}

snap_store_t *snap_store_new_cluster (const sbx_dqlite_cluster_t *cluster, const char *host)
{
    snap_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->db = sbx_db_new_cluster (cluster, "snapshots", "sbx-snapshotd", s_migrations,
                                   MIGRATION_COUNT, s_sql, ST_COUNT);
    self->host = strdup (host && *host ? host : "local");
    if (!self->db || !self->host)
        snap_store_destroy (&self);
    return self;
}

bool snap_store_is_cluster (snap_store_t *self)
{
    return self && sbx_db_is_cluster (self->db);
}

const char *snap_store_host (snap_store_t *self)
{
    return self->host;
}

int snap_store_adopt (snap_store_t *self)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_ADOPT_COPIES), 1, self->host);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_ADOPT), 1, self->host);
    if (sbx_db_begin (self->db))
        return -1;
    if (sbx_db_run (self->db, ST_ADOPT_COPIES, "adopt copies") ||
        sbx_db_run (self->db, ST_ADOPT, "adopt snapshots")) {
        sbx_db_rollback (self->db);
        return -1;
    }
    int count = sbx_db_changes (self->db);
    return sbx_db_commit (self->db) == 0 ? count : -1;
}

static char *s_meta (snap_store_t *self, const char *key)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_GET);
    sbx_db_bind_text (stmt, 1, key);
    char *value = NULL;
    if (sbx_stmt_step (stmt) == SQLITE_ROW)
        value = sbx_db_column_dup (stmt, 0, NULL);
    sbx_db_reset (stmt);
    return value;
}

static int s_meta_set (snap_store_t *self, const char *key, const char *value)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_SET);
    sbx_db_bind_text (stmt, 1, key);
    sbx_db_bind_text (stmt, 2, value);
    return sbx_db_run (self->db, ST_META_SET, "meta set");
}

int snap_store_import (snap_store_t *self, const char *path, char *err, size_t err_size)
{
    char *state = s_meta (self, "import");
    bool resume = state && streq (state, "started"), done = state && !resume;
    free (state);
    if (done)
        return 0;
    char *any = NULL;
    if (!resume) {
        sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ANY);
        if (sbx_stmt_step (stmt) == SQLITE_ROW)
            any = sbx_db_column_dup (stmt, 0, NULL);
        sbx_db_reset (stmt);
    }
    if (any) {
        free (any);
        sbx_warn ("store %s: %s is not copied in: the cluster has a catalog already (this "
                  "node joined one; move the file away)",
                  sbx_db_path (self->db), path);
        return 0;
    }
    snap_store_t *file = snap_store_new (path, self->host); //  at this schema first
    if (!file) {
        snprintf (err, err_size, "cannot open %s (its log says why)", path);
        return -1;
    }
    //  Its rows of no host are this host's: the files are here.
    int adopted = snap_store_adopt (file);
    snap_store_destroy (&file);
    if (adopted < 0) {
        snprintf (err, err_size, "cannot read %s", path);
        return -1;
    }
    uint64_t rows = 0;
    const char *skip[] = {"meta", NULL};
    if (s_meta_set (self, "import", "started") ||
        sbx_db_import (self->db, path, skip, &rows, err, err_size) ||
        s_meta_set (self, "import", "done")) {
        if (!*err)
            snprintf (err, err_size, "the cluster's store does not answer");
        return -1;
    }
    sbx_info ("store %s: %llu rows of %s copied in", sbx_db_path (self->db),
              (unsigned long long) rows, path);
    return 1;
}

void snap_store_destroy (snap_store_t **self_p)
{
    snap_store_t *self = *self_p;
    if (!self)
        return;
    sbx_db_destroy (&self->db);
    free (self->host);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Records

//  Inside a transaction: the copy, and the snapshot's count of them. 0, or -1.
static int s_copy_add (snap_store_t *self, const char *id, const char *host, uint64_t at_ms)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_COPY_ADD);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, host);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) (at_ms & INT64_MAX));
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_COPY_COUNT), 1, id);
    return sbx_db_run (self->db, ST_COPY_ADD, "add copy") ||
                   sbx_db_run (self->db, ST_COPY_COUNT, "count copies")
               ? -1
               : 0;
}

int snap_store_insert (snap_store_t *self, const snap_record_t *record, char **keys, char **values,
                       size_t labels)
{
    if (sbx_db_begin (self->db))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_INSERT);
    sbx_db_bind_text (stmt, 1, record->id);
    sbx_db_bind_text (stmt, 2, record->account);
    sbx_db_bind_text (stmt, 3, record->name);
    sbx_db_bind_text (stmt, 4, record->sandbox_id);
    sbx_db_bind_text (stmt, 5, record->type);
    sbx_db_bind_text (stmt, 6, record->kind ? record->kind : "user");
    sbx_db_bind_text (stmt, 7, record->image);
    sbx_db_bind_text (stmt, 8, record->qemu_version);
    sbx_db_bind_text (stmt, 9, record->parent);
    sbx_stmt_bind_int64 (stmt, 10, (sqlite3_int64) record->created_ms);
    sbx_db_bind_text (stmt, 11, record->key_id);
    sbx_db_bind_text (stmt, 12, self->host);
    int rc = sbx_db_run (self->db, ST_INSERT, "insert snapshot");
    for (size_t i = 0; rc == 0 && i < labels; i++) {
        stmt = sbx_db_stmt (self->db, ST_LABEL_SET);
        sbx_db_bind_text (stmt, 1, record->id);
        sbx_db_bind_text (stmt, 2, keys[i]);
        sbx_db_bind_text (stmt, 3, values[i]);
        rc = sbx_db_run (self->db, ST_LABEL_SET, "set label");
    }
    if (rc == 0 && sbx_db_commit (self->db) == 0)
        return 0;
    sbx_db_rollback (self->db);
    return -1;
}

int snap_store_find (snap_store_t *self, const char *id, snap_record_t *record)
{
    memset (record, 0, sizeof *record);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_FIND);
    sbx_db_bind_text (stmt, 1, id);
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW)
        s_record_read (stmt, record);
    else if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "find snapshot");
    sbx_db_reset (stmt);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

int snap_store_finish (snap_store_t *self, const char *id, const char *reason, uint64_t disk_bytes,
                       uint64_t memory_bytes, const char *image, const char *qemu_version)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_FINISH);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, reason);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) (disk_bytes & INT64_MAX));
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) (memory_bytes & INT64_MAX));
    sbx_db_bind_text (stmt, 5, image);
    sbx_db_bind_text (stmt, 6, qemu_version);
    if (sbx_db_begin (self->db))
        return -1;
    int rc = sbx_db_run (self->db, ST_FINISH, "finish snapshot");
    bool finished = rc == 0 && sbx_db_changes (self->db) == 1;
    //  Ready: its files are this host's, the first copy.
    if (finished && !reason)
        rc = s_copy_add (self, id, self->host, sbx_clock_now_ms ());
    if (rc || sbx_db_commit (self->db)) {
        sbx_db_rollback (self->db);
        return -1;
    }
    return finished ? 0 : 1;
}

int snap_store_delete (snap_store_t *self, const char *id)
{
    //  The files of copies on other hosts are theirs to remove: queued for them, in the
    //  same transaction that forgets the copies.
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_QUEUE_REMOVALS), 1, id);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_QUEUE_REMOVALS), 2, self->host);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_COPIES_DROP), 1, id);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_DELETE), 1, id);
    if (sbx_db_begin (self->db))
        return -1;
    if (sbx_db_run (self->db, ST_QUEUE_REMOVALS, "queue removals") ||
        sbx_db_run (self->db, ST_COPIES_DROP, "drop copies") ||
        sbx_db_run (self->db, ST_DELETE, "delete snapshot") || sbx_db_commit (self->db)) {
        sbx_db_rollback (self->db);
        return -1;
    }
    return 0;
}

int snap_store_copy_add (snap_store_t *self, const char *id, const char *host, uint64_t at_ms)
{
    if (sbx_db_begin (self->db))
        return -1;
    int rc = s_copy_add (self, id, host, at_ms);
    if (rc || sbx_db_commit (self->db)) {
        sbx_db_rollback (self->db);
        return -1;
    }
    return snap_store_has_copy (self, id, host) == 1 ? 0 : 1;
}

int snap_store_has_copy (snap_store_t *self, const char *id, const char *host)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_HAS_COPY);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, host ? host : self->host);
    int rc = sbx_stmt_step (stmt);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "has copy");
    sbx_db_reset (stmt);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

int snap_store_removal_done (snap_store_t *self, const char *id)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_REMOVAL_DONE);
    sbx_db_bind_text (stmt, 1, self->host);
    sbx_db_bind_text (stmt, 2, id);
    return sbx_db_run (self->db, ST_REMOVAL_DONE, "removal done");
}

int snap_store_list (snap_store_t *self, const char *account, snap_store_record_fn *fn, void *arg)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, account ? ST_LIST : ST_LIST_ALL);
    if (account)
        sbx_db_bind_text (stmt, 1, account);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        snap_record_t record = {0};
        s_record_read (stmt, &record);
        fn (&record, arg);
        snap_record_clear (&record);
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "list snapshots");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? 0 : -1;
}

int snap_store_labels (snap_store_t *self, const char *id, snap_store_pair_fn *fn, void *arg)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_LABELS);
    sbx_db_bind_text (stmt, 1, id);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW)
        fn ((const char *) sbx_stmt_column_text (stmt, 0),
            (const char *) sbx_stmt_column_text (stmt, 1), arg);
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "labels");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? 0 : -1;
}

int snap_store_use_add (snap_store_t *self, const char *snapshot_id, const char *sandbox_id)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_USE_ADD);
    sbx_db_bind_text (stmt, 1, snapshot_id);
    sbx_db_bind_text (stmt, 2, sandbox_id);
    return sbx_db_run (self->db, ST_USE_ADD, "add use");
}

int snap_store_use_drop (snap_store_t *self, const char *sandbox_id)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_USE_DROP), 1, sandbox_id);
    return sbx_db_run (self->db, ST_USE_DROP, "drop use");
}

int snap_store_sandbox_deleted (snap_store_t *self, const char *sandbox_id)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_SANDBOX_DELETED), 1, sandbox_id);
    return sbx_db_run (self->db, ST_SANDBOX_DELETED, "mark sandbox deleted");
}

//  Runs a one-column query with one text parameter; fn gets each row.
static int s_ids (snap_store_t *self, stmt_id_t id, const char *param, snap_store_id_fn *fn,
                  void *arg)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, id);
    sbx_db_bind_text (stmt, 1, param);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW)
        fn ((const char *) sbx_stmt_column_text (stmt, 0), arg);
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "query");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? 0 : -1;
}

static void s_keep_first (const char *id, void *arg)
{
    char **first = arg;
    if (!*first && id)
        *first = strdup (id);
}

int snap_store_users (snap_store_t *self, const char *snapshot_id, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_USERS, snapshot_id, fn, arg);
}

int snap_store_automatic (snap_store_t *self, const char *sandbox_id, snap_store_id_fn *fn,
                          void *arg)
{
    return s_ids (self, ST_AUTOMATIC, sandbox_id, fn, arg);
}

int snap_store_forks (snap_store_t *self, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_FORKS, NULL, fn, arg);
}

int snap_store_copies (snap_store_t *self, const char *id, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_COPIES, id, fn, arg);
}

int snap_store_removals (snap_store_t *self, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_REMOVALS, self->host, fn, arg);
}

int snap_store_copies_on (snap_store_t *self, const char *host, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_COPIES_ON, host, fn, arg);
}

int snap_store_wanting (snap_store_t *self, snap_store_id_fn *fn, void *arg)
{
    return s_ids (self, ST_WANTING, NULL, fn, arg);
}

char *snap_store_origin (snap_store_t *self, const char *sandbox_id)
{
    char *found = NULL;
    s_ids (self, ST_ORIGIN, sandbox_id, s_keep_first, &found);
    return found;
}

char *snap_store_child (snap_store_t *self, const char *snapshot_id)
{
    char *found = NULL;
    s_ids (self, ST_CHILD, snapshot_id, s_keep_first, &found);
    return found;
}

static void s_collect (const char *id, void *arg)
{
    zlist_append ((zlist_t *) arg, (void *) id); //  autofree: copied
}

int snap_store_fail_saving (snap_store_t *self, const char *reason, snap_store_id_fn *fn, void *arg)
{
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    if (s_ids (self, ST_SAVING, self->host, s_collect, ids)) {
        zlist_destroy (&ids);
        return -1;
    }
    int count = 0;
    for (char *id = zlist_first (ids); id; id = zlist_next (ids))
        if (snap_store_finish (self, id, reason, 0, 0, NULL, NULL) == 0) {
            count++;
            if (fn)
                fn (id, arg);
        }
    zlist_destroy (&ids);
    return count;
}

//  --------------------------------------------------------------------------
//  Self-test

static void s_count (const snap_record_t *record, void *arg)
{
    (void) record;
    (*(int *) arg)++;
}

static void s_count_id (const char *id, void *arg)
{
    (void) id;
    (*(int *) arg)++;
}

static void s_label_check (const char *key, const char *value, void *arg)
{
    (*(int *) arg)++;
    assert ((streq (key, "env") && streq (value, "prod")) ||
            (streq (key, "team") && streq (value, "web")));
}

//  Read whole on purpose: the operator's list of every snapshot, the one row an import
//  looks for, and the partial index of the snapshots wanting a copy (only those, at most
//  64, and asked only by a cluster of several hosts).
static bool s_test_allow (int index, const char *table)
{
    return streq (table, "snapshots") &&
           (index == ST_LIST_ALL || index == ST_ANY || index == ST_WANTING);
}

void snap_store_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/snap_store_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/snapshots.db", dir);
    snap_store_t *store = snap_store_new (path, "h1");
    //  No statement reads the whole catalog but those meant to (s_test_allow).
    assert (sbx_db_whole_reads (store->db, s_test_allow) == 0);
    assert (store);
    struct stat st;
    assert (stat (path, &st) == 0 && (st.st_mode & 0777) == 0600);

    //  A save: saving, then ready with its sizes; labels kept.
    char *keys[] = {"env", "team"}, *values[] = {"prod", "web"};
    snap_record_t one = {.id = "snap_one",
                         .account = "acc_a",
                         .name = "configured",
                         .sandbox_id = "sb_1",
                         .type = "small",
                         .kind = "user",
                         .created_ms = 1000};
    assert (snap_store_insert (store, &one, keys, values, 2) == 0);
    assert (snap_store_insert (store, &one, NULL, NULL, 0) == -1); //  same id: refused
    snap_record_t found;
    assert (snap_store_find (store, "snap_one", &found) == 0);
    assert (streq (found.state, "saving") && streq (found.account, "acc_a") && !found.parent);
    snap_record_clear (&found);
    assert (snap_store_finish (store, "snap_one", NULL, 4096, 8192, "/img/h", "7.2.0") == 0);
    assert (snap_store_finish (store, "snap_one", "late", 0, 0, NULL, NULL) == 1); //  not saving
    assert (snap_store_find (store, "snap_one", &found) == 0);
    assert (streq (found.state, "ready") && found.disk_bytes == 4096 && found.memory_bytes == 8192);
    assert (streq (found.image, "/img/h") && streq (found.qemu_version, "7.2.0") && !found.reason);
    snap_record_clear (&found);
    int labels = 0;
    assert (snap_store_labels (store, "snap_one", s_label_check, &labels) == 0 && labels == 2);
    assert (snap_store_find (store, "snap_none", &found) == 1);

    //  A sandbox made from it, and a snapshot of that sandbox: its parent is one.
    assert (snap_store_use_add (store, "snap_one", "sb_2") == 0);
    char *origin = snap_store_origin (store, "sb_2");
    assert (origin && streq (origin, "snap_one"));
    free (origin);
    assert (!snap_store_origin (store, "sb_1"));
    int users = 0;
    assert (snap_store_users (store, "snap_one", s_count_id, &users) == 0 && users == 1);
    assert (snap_store_use_add (store, "snap_one", "sb_3") == 0 &&
            snap_store_use_drop (store, "sb_3") == 0);
    users = 0;
    assert (snap_store_users (store, "snap_one", s_count_id, &users) == 0 && users == 1);
    snap_record_t two = {.id = "snap_two",
                         .account = "acc_a",
                         .sandbox_id = "sb_2",
                         .type = "small",
                         .parent = "snap_one",
                         .created_ms = 2000};
    assert (snap_store_insert (store, &two, NULL, NULL, 0) == 0);
    char *child = snap_store_child (store, "snap_one");
    assert (child && streq (child, "snap_two"));
    free (child);
    snap_record_t other = {.id = "snap_b",
                           .account = "acc_b",
                           .sandbox_id = "sb_9",
                           .type = "large",
                           .kind = "automatic",
                           .created_ms = 3000};
    assert (snap_store_insert (store, &other, NULL, NULL, 0) == 0);
    int count = 0;
    assert (snap_store_automatic (store, "sb_9", s_count_id, &count) == 0 && count == 0); //  saving
    assert (snap_store_finish (store, "snap_b", NULL, 1, 1, NULL, NULL) == 0);
    assert (snap_store_automatic (store, "sb_9", s_count_id, &count) == 0 && count == 1);
    //  Its sandbox deleted: remembered on its snapshots.
    assert (snap_store_find (store, "snap_b", &found) == 0 && !found.sandbox_deleted);
    snap_record_clear (&found);
    assert (snap_store_sandbox_deleted (store, "sb_9") == 0);
    assert (snap_store_find (store, "snap_b", &found) == 0 && found.sandbox_deleted);
    snap_record_clear (&found);
    count = 0;
    assert (snap_store_list (store, "acc_a", s_count, &count) == 0 && count == 2);
    count = 0;
    assert (snap_store_list (store, NULL, s_count, &count) == 0 && count == 3);

    //  A restart finds a save that died with the process: it fails, with the reason.
    snap_store_destroy (&store);
    assert (store == NULL);
    store = snap_store_new (path, "h1");
    assert (store);
    int failed = 0;
    assert (snap_store_fail_saving (store, "snapshotd restarted", s_count_id, &failed) == 1);
    assert (failed == 1);
    assert (snap_store_find (store, "snap_two", &found) == 0);
    assert (streq (found.state, "failed") && streq (found.reason, "snapshotd restarted"));
    snap_record_clear (&found);
    assert (snap_store_fail_saving (store, "again", NULL, NULL) == 0);
    //  A failed child does not hold its parent; delete drops labels and uses too.
    assert (!snap_store_child (store, "snap_one"));
    assert (snap_store_delete (store, "snap_one") == 0);
    assert (snap_store_find (store, "snap_one", &found) == 1);
    users = 0;
    assert (snap_store_users (store, "snap_one", s_count_id, &users) == 0 && users == 0);
    labels = 0;
    assert (snap_store_labels (store, "snap_one", s_label_check, &labels) == 0 && labels == 0);
    snap_store_destroy (&store);
    snap_store_destroy (&store); //  twice is harmless

    //  Several hosts on one catalog: h1 saves, h2 copies it, a delete on h2 queues the
    //  removal on h1; another host's save in flight is not failed by h1's restart.
    snprintf (path, sizeof path, "%s/hosts.db", dir);
    snap_store_t *h1 = snap_store_new (path, "h1"), *h2 = snap_store_new (path, "h2");
    assert (h1 && h2 && streq (snap_store_host (h2), "h2") && !snap_store_is_cluster (h1));
    snap_record_t shared = one;
    shared.id = "snap_s";
    assert (snap_store_insert (h1, &shared, NULL, NULL, 0) == 0);
    assert (snap_store_copy_add (h2, "snap_s", "h2", 5) == 1); //  not ready yet: no copy
    int wanting = 0;
    assert (snap_store_wanting (h1, s_count_id, &wanting) == 0 && wanting == 0);
    assert (snap_store_finish (h1, "snap_s", NULL, 1, 2, NULL, NULL) == 0);
    assert (snap_store_has_copy (h1, "snap_s", NULL) == 1);
    assert (snap_store_has_copy (h2, "snap_s", NULL) == 0);
    char *wanted = NULL;
    assert (snap_store_wanting (h1, s_keep_first, &wanted) == 0 && streq (wanted, "snap_s"));
    free (wanted);
    uint64_t later = sbx_clock_now_ms () + 1000;
    assert (snap_store_copy_add (h2, "snap_s", "h2", later) == 0);
    assert (snap_store_copy_add (h2, "snap_s", "h2", later) == 0); //  twice: one copy
    wanting = 0;
    assert (snap_store_wanting (h1, s_count_id, &wanting) == 0 && wanting == 0);
    char *hosts[2] = {NULL, NULL};
    int hosts_seen = 0;
    assert (snap_store_copies (h1, "snap_s", s_count_id, &hosts_seen) == 0 && hosts_seen == 2);
    assert (snap_store_copies (h1, "snap_s", s_keep_first, &hosts[0]) == 0);
    assert (hosts[0] && streq (hosts[0], "h1"));
    free (hosts[0]);
    snap_record_t other_save = one;
    other_save.id = "snap_h2";
    assert (snap_store_insert (h2, &other_save, NULL, NULL, 0) == 0);
    assert (snap_store_fail_saving (h1, "h1 restarted", NULL, NULL) == 0); //  h2's goes on
    assert (snap_store_delete (h2, "snap_s") == 0);
    int queued = 0;
    assert (snap_store_removals (h2, s_count_id, &queued) == 0 && queued == 0);
    char *removal = NULL;
    assert (snap_store_removals (h1, s_keep_first, &removal) == 0 && streq (removal, "snap_s"));
    assert (snap_store_removal_done (h1, removal) == 0);
    free (removal);
    queued = 0;
    assert (snap_store_removals (h1, s_count_id, &queued) == 0 && queued == 0);
    assert (snap_store_has_copy (h1, "snap_s", NULL) == 0);
    assert (snap_store_fail_saving (h2, "h2 restarted", NULL, NULL) == 1);
    assert (sbx_db_whole_reads (h1->db, s_test_allow) == 0);
    snap_store_destroy (&h1);
    snap_store_destroy (&h2);

    //  Migration 5 (kind fork) keeps a catalog of version 4 whole: its rows, labels and
    //  uses (in their order), its indexes; a fork's capture fits after it.
    snprintf (path, sizeof path, "%s/version4.db", dir);
    sbx_db_t *old = sbx_db_new (path, "sbx-snapshotd", s_migrations, 4, s_sql, 0);
    assert (old);
    assert (sbx_db_exec (old,
                         "INSERT INTO snapshots (id, account, sandbox_id, type, state, kind, "
                         "created_ms, key_id) VALUES ('snap_old', 'acc_a', 'sb_1', 'small', "
                         "'ready', 'user', 5, 'key_1');"
                         "INSERT INTO labels VALUES ('snap_old', 'env', 'prod');"
                         "INSERT INTO uses (snapshot_id, sandbox_id) VALUES ('snap_old', 'sb_z'), "
                         "('snap_old', 'sb_a');",
                         "seed version 4") == 0);
    sbx_db_destroy (&old);
    store = snap_store_new (path, "h1");
    assert (store && sbx_db_schema_version (store->db) == MIGRATION_COUNT);
    //  Its rows had no host: this one's, the ready one its copy.
    assert (snap_store_adopt (store) == 1 && snap_store_has_copy (store, "snap_old", NULL) == 1);
    assert (snap_store_adopt (store) == 0);
    assert (sbx_db_whole_reads (store->db, s_test_allow) == 0);
    assert (snap_store_find (store, "snap_old", &found) == 0);
    assert (streq (found.kind, "user") && streq (found.key_id, "key_1") && found.created_ms == 5);
    snap_record_clear (&found);
    labels = 0;
    assert (snap_store_labels (store, "snap_old", s_label_check, &labels) == 0 && labels == 1);
    char *first = NULL;
    assert (snap_store_users (store, "snap_old", s_keep_first, &first) == 0);
    assert (first && streq (first, "sb_z"));
    free (first);
    snap_record_t capture = one; //  (its strings are this test's own)
    capture.id = "snap_fork";
    capture.kind = "fork";
    assert (snap_store_insert (store, &capture, NULL, NULL, 0) == 0);
    assert (snap_store_finish (store, "snap_fork", NULL, 1, 1, NULL, NULL) == 0);
    int forks = 0;
    assert (snap_store_forks (store, s_count_id, &forks) == 0 && forks == 1);
    //  Deleting a snapshot still takes its labels and uses along (the references moved).
    assert (snap_store_delete (store, "snap_old") == 0);
    users = 0;
    assert (snap_store_users (store, "snap_old", s_count_id, &users) == 0 && users == 0);
    snap_store_destroy (&store);

    //  Not a database: refused, not crashed.
    snprintf (path, sizeof path, "%s/junk.db", dir);
    FILE *junk = fopen (path, "w");
    fputs ("this is not a database, and it is long enough to be mistaken for one unless "
           "SQLite checks its header, which it does when the first statement runs. "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding padding padding ",
           junk);
    fclose (junk);
    assert (snap_store_new (path, "h1") == NULL);

    char cmd[160];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
