/*  sbx_db - one database as every store module opens it, on one of two engines:

    - SQLite, a file of this host (sbx_db_new): the file made 0600 before SQLite touches
      it, WAL (required), synchronous=FULL, foreign keys, a busy timeout;
    - dqlite, a database replicated by a cluster of dqlite nodes (sbx_db_new_cluster):
      the same SQL, run on the cluster's leader through dqlite's wire protocol
      (sbx_dqlite), each commit on a quorum of the nodes' disks.

    Either way: numbered migrations recorded in schema_version, the store's statements
    prepared once, and the statement, column and bind functions the stores share, so a
    store's code does not know which engine it runs on. Only store modules (brk_store,
    bill_store, snap_store, hook_store) include this header: it brings sqlite3.h for
    SQLite's result codes (SQLITE_DONE, SQLITE_CONSTRAINT_UNIQUE…), which both engines
    answer. A store keeps its own migrations, statement enum and row functions, and binds
    and steps its statements itself:

        static const char *s_migrations[] = {"CREATE TABLE t (...)", ...};
        enum { ST_FIND, ST_COUNT };
        static const char *s_sql[ST_COUNT] = {[ST_FIND] = "SELECT ... WHERE id = ?1"};

        sbx_db_t *db = sbx_db_new (path, "sbx-billing", s_migrations, 1, s_sql, ST_COUNT);
        sbx_stmt_t *stmt = sbx_db_stmt (db, ST_FIND);
        sbx_db_bind_text (stmt, 1, id);
        ... sbx_stmt_step, sbx_db_reset (stmt) ...
        sbx_db_destroy (&db);

    One sbx_db_t per process and database, used from one thread (NOMUTEX).

    On dqlite a statement that returns rows (SELECT, WITH, VALUES, EXPLAIN, PRAGMA: the
    first word says) is run whole at its first step and its rows read from memory after;
    any other runs at its first step. RETURNING is refused there (dqlite 1.11 would not
    replicate a write that returns rows). A database may be open on one connection at a
    time per node, and a cluster database has no file: what works on the file (copy,
    paths moved, EXPLAIN QUERY PLAN checks, ATTACH through the handle) is SQLite's only.
*/
#ifndef SBX_DB_H_INCLUDED
#define SBX_DB_H_INCLUDED

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_dqlite.h"

typedef struct _sbx_db_t sbx_db_t;
//  A prepared statement of a store, on either engine.
typedef struct _sbx_stmt_t sbx_stmt_t;

//  Opens or creates the database at path and brings its schema up to date:
//  migrations[i] takes it from version i to i + 1, each in its own transaction with its
//  schema_version row; then prepares sql[0..statements-1] (sbx_db_stmt gets them by
//  index). daemon ("sbx-broker") names the program in messages, as the one to upgrade
//  when the file's schema is newer than it knows. NULL (logged) when the file cannot be
//  opened, is not a regular file or not a database, cannot use WAL, a migration or a
//  statement fails, or the schema is newer.
sbx_db_t *sbx_db_new (const char *path, const char *daemon, const char *const *migrations,
                      int migration_count, const char *const *sql, int statements);

//  Rolls back an open transaction (with a warning), finalizes the statements, closes
//  the database and sets *self_p to NULL. Safe on NULL.
void sbx_db_destroy (sbx_db_t **self_p);

//  Opens (or creates) database name of the cluster and brings its schema up to date, as
//  sbx_db_new does for a file; daemon names the program as there. NULL (logged) when no
//  leader answers, a migration or a statement fails, or the schema is newer.
sbx_db_t *sbx_db_new_cluster (const sbx_dqlite_cluster_t *cluster, const char *name,
                              const char *daemon, const char *const *migrations,
                              int migration_count, const char *const *sql, int statements);

//  True on a cluster database whose last failure said its node does not lead (or lost
//  the lead): nothing of that statement or its transaction was kept.
bool sbx_db_not_leader (sbx_db_t *self);
//  True when the database is a cluster's (dqlite), false for a file.
bool sbx_db_is_cluster (sbx_db_t *self);

//  The path given to new (a cluster database: "dqlite:<name>"), for messages.
const char *sbx_db_path (sbx_db_t *self);

//  The schema version the database is at: the number of migrations applied.
int sbx_db_schema_version (sbx_db_t *self);

//  The SQLite handle, for what a store does beyond its prepared statements (attaching
//  another file). Stores only. NULL on a cluster database.
sqlite3 *sbx_db_handle (sbx_db_t *self);
//  The store's prepared statement number index.
sbx_stmt_t *sbx_db_stmt (sbx_db_t *self, int index);

//  A statement's binds (index from 1), as sqlite3_bind_*: SQLITE_OK or an error code.
//  On SQLite text and blobs are not copied (they must outlive the step); dqlite copies.
int sbx_stmt_bind_int64 (sbx_stmt_t *stmt, int index, int64_t value);
int sbx_stmt_bind_int (sbx_stmt_t *stmt, int index, int value);
int sbx_stmt_bind_null (sbx_stmt_t *stmt, int index);
int sbx_stmt_bind_blob (sbx_stmt_t *stmt, int index, const void *data, size_t size);
//  Runs the statement, or moves to its next row: SQLITE_ROW, SQLITE_DONE, or an extended
//  error code (sbx_db_log_error says more).
int sbx_stmt_step (sbx_stmt_t *stmt);
//  The current row's columns (from 0), as sqlite3_column_*: text and blobs valid until
//  the next step or reset; NULL for SQL NULL.
const char *sbx_stmt_column_text (sbx_stmt_t *stmt, int column);
int64_t sbx_stmt_column_int64 (sbx_stmt_t *stmt, int column);
int sbx_stmt_column_int (sbx_stmt_t *stmt, int column);
const void *sbx_stmt_column_blob (sbx_stmt_t *stmt, int column);
int sbx_stmt_column_bytes (sbx_stmt_t *stmt, int column);
//  True between a step that gave a row and the reset: the statement is being read.
bool sbx_stmt_busy (sbx_stmt_t *stmt);

//  For the stores' self tests: how many steps of the statements' query plans (EXPLAIN
//  QUERY PLAN) read a whole table ("SCAN t", with or without an index), each printed
//  with its statement, leaving out those allow says are meant (the statement's index,
//  the table; allow may be NULL). -1 when a plan could not be made. A statement that a
//  sweep runs each second over a table that grows with use is what this catches.
typedef bool (sbx_db_allow_fn) (int index, const char *table);
int sbx_db_whole_reads (sbx_db_t *self, sbx_db_allow_fn *allow);

//  BEGIN IMMEDIATE: takes the write lock now, so the transaction cannot fail later for
//  want of it. Transactions do not nest. 0, or -1 (one is open: warned; busy: logged).
int sbx_db_begin (sbx_db_t *self);
//  0, or -1 when none is open or the commit failed (then roll back).
int sbx_db_commit (sbx_db_t *self);
//  0, or -1 when none is open.
int sbx_db_rollback (sbx_db_t *self);
//  True between begin and commit/rollback (and sbx_db_read_begin and sbx_db_read_end).
bool sbx_db_in_transaction (sbx_db_t *self);
//  One read transaction for a run of reads (a request that only reads): its statements
//  share one snapshot, and SQLite takes the file locks once (BEGIN DEFERRED) instead of
//  for each statement, which takes and drops them (four fcntl calls a statement). 1 when
//  one was opened, 0 when there is none to open (inside a transaction already, or a
//  cluster store, whose statements go to the leader one at a time), -1 when it failed
//  (logged; the reads then run one by one as before). Nothing may write inside it.
int sbx_db_read_begin (sbx_db_t *self);
//  Ends the read transaction that sbx_db_read_begin opened (opened: what it returned).
void sbx_db_read_end (sbx_db_t *self, int opened);
//  True inside a transaction; else warns "<what> outside a transaction refused".
bool sbx_db_require_transaction (sbx_db_t *self, const char *what);

//  Steps statement index once (a statement that returns no rows; a row counts as done)
//  and resets it. sbx_db_run returns 0, or -1 with the error logged with what.
//  sbx_db_try returns SQLITE_DONE or the extended error code, and leaves constraint
//  violations to the caller (they are often an answer: "that email is taken"); it logs
//  the other errors.
int sbx_db_run (sbx_db_t *self, int index, const char *what);
int sbx_db_try (sbx_db_t *self, int index, const char *what);

//  Fills a row from a stepped statement into out. 0, or -1 (out of memory: out cleared).
typedef int (sbx_db_row_fn) (sbx_stmt_t *stmt, void *out);

//  Steps statement index (bound by the caller) for one row and resets it. Returns 0
//  when fill took the row, 1 when there is none, -1 when fill failed or on a database
//  error (logged with what).
int sbx_db_row (sbx_db_t *self, int index, sbx_db_row_fn *fill, void *out, const char *what);

//  Runs SQL text (no parameters, any number of statements). 0, or -1 (logged).
int sbx_db_exec (sbx_db_t *self, const char *sql, const char *what);
//  Runs a one-row query with no parameters: its first column, or -1 (logged).
int64_t sbx_db_query_int (sbx_db_t *self, const char *sql, const char *what);

//  Rows changed by the last statement; the rowid of the last insert.
int sbx_db_changes (sbx_db_t *self);
int64_t sbx_db_last_insert_rowid (sbx_db_t *self);

//  Logs "store PATH: WHAT: the engine's message (extended code)".
void sbx_db_log_error (sbx_db_t *self, const char *what);

//  A required text argument: not NULL and not empty.
bool sbx_db_nonempty (const char *text);
//  Every uint64 stored must fit SQLite's signed 64-bit integers.
bool sbx_db_fits (uint64_t value);

//  A text column's copy (caller frees), NULL for SQL NULL. Sets *failed (when not NULL)
//  when out of memory.
char *sbx_db_column_dup (sbx_stmt_t *stmt, int column, bool *failed);
//  An integer column, negatives read as 0.
uint64_t sbx_db_column_u64 (sbx_stmt_t *stmt, int column);
//  Binds text, NULL as SQL NULL. On SQLite not copied: the text must outlive the step.
int sbx_db_bind_text (sbx_stmt_t *stmt, int index, const char *text);
//  Resets a statement after use, so it holds no read snapshot (which would keep WAL
//  checkpoints from finishing), no rows and no pointers to the caller's strings.
void sbx_db_reset (sbx_stmt_t *stmt);

//  For backups (cli_backup, the one user outside the stores): copies the database at
//  from into a new file to (made 0600; it must not exist), consistent even while its
//  daemon writes (SQLite's online backup), and gives the copy's schema version in
//  *version (0 when it has none). 0, or -1 with a message in err.
int sbx_db_copy (const char *from, const char *to, int *version, char *err, size_t err_size);
//  After a data directory moved (sbx restore): in every table of the database file at
//  path, every text value that is from or starts with from + "/" gets to in its place.
//  The number of values changed, or -1 with a message in err.
int sbx_db_file_move_paths (const char *path, const char *from, const char *to, char *err,
                            size_t err_size);

//  Copies into self, a cluster's database, every row of every table of the SQLite file
//  at path that self has too (but schema_version and the tables skip names, NULL-
//  terminated), in the file's creation order, rowids kept: INSERT OR IGNORE, a thousand
//  rows a transaction, so a copy that stopped midway and is run again completes it
//  without doubling a row. Both must be at the same schema version (open the file with
//  its store first: that migrates it). *rows gets how many were copied. 0, or -1 with a
//  message in err.
int sbx_db_import (sbx_db_t *self, const char *path, const char *const *skip, uint64_t *rows,
                   char *err, size_t err_size);

//  The other way: database name of the cluster where says, as its leader holds it now,
//  into a new SQLite file at path (0600; it must not exist): dqlite's dump (the database
//  and its WAL) checkpointed into one file. 0, or -1 with a message in err.
int sbx_db_dump (const sbx_dqlite_cluster_t *where, const char *name, const char *path, char *err,
                 size_t err_size);

void sbx_db_test (bool verbose);
//  The same store tests on a database of a cluster of three dqlite nodes of this process,
//  with a failover (sbx_db_cluster_test.c: it links libdqlite, for the test runner only).
void sbx_db_cluster_test (bool verbose);

#endif
