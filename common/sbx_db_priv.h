/*  sbx_db's two engines share these structures: sbx_db.c (SQLite, and what both do)
    and sbx_db_cluster.c (dqlite). Nothing outside the two includes this.
*/
#ifndef SBX_DB_PRIV_H_INCLUDED
#define SBX_DB_PRIV_H_INCLUDED

#include "sbx_db.h"

//  The transaction statements, prepared after the store's own (BEGIN_READ: SQLite only).
enum {
    SBX_DB_TX_BEGIN,
    SBX_DB_TX_COMMIT,
    SBX_DB_TX_ROLLBACK,
    SBX_DB_TX_BEGIN_READ,
    SBX_DB_TX_COUNT
};
extern const char *sbx_db_tx_sql[SBX_DB_TX_COUNT];

struct _sbx_stmt_t {
    sbx_db_t *db;
    const char *sql; //  the store's text (static)
    sqlite3_stmt *lite;
    //  dqlite: the statement's id on the connection of generation gen, its parameter
    //  count, the values bound (texts and blobs copied), and the rows of its run.
    bool returns_rows;
    uint32_t id;
    unsigned gen;
    size_t params;
    sbx_dqlite_value_t *values;
    size_t values_cap;
    bool ran, done;
    sbx_dqlite_rows_t rows;
    size_t row;    //  1-based: the current row; 0 before the first
    char *scratch; //  a column read as text that is not one
    size_t scratch_cap;
};

struct _sbx_db_t {
    char *path;
    int version;
    int statements;   //  the store's; the transaction ones follow
    sbx_stmt_t *stmt; //  statements + SBX_DB_TX_COUNT
    //  SQLite
    sqlite3 *db;
    //  dqlite
    bool cluster;
    char *name;
    char **addresses;
    size_t count;
    sbx_dqlite_dial_fn *dial;
    void *dial_arg;
    int timeout_ms;
    bool follow;
    sbx_dqlite_t *conn;
    unsigned gen; //  bumped at every new connection: statements prepare again
    bool in_tx;
    int errcode;
    char errmsg[256];
    int changes;
    int64_t last_id;
};

//  The dqlite engine (sbx_db_cluster.c).
int sbx_db_cl_open (sbx_db_t *self, const sbx_dqlite_cluster_t *cluster, const char *name);
void sbx_db_cl_close (sbx_db_t *self);
void sbx_db_cl_stmt_free (sbx_stmt_t *stmt);
int sbx_db_cl_bind (sbx_stmt_t *stmt, int index, const sbx_dqlite_value_t *value);
int sbx_db_cl_step (sbx_stmt_t *stmt);
void sbx_db_cl_reset (sbx_stmt_t *stmt);
const sbx_dqlite_value_t *sbx_db_cl_column (sbx_stmt_t *stmt, int column);
const char *sbx_db_cl_column_text (sbx_stmt_t *stmt, int column);
int sbx_db_cl_exec (sbx_db_t *self, const char *sql);
int sbx_db_cl_query (sbx_db_t *self, const char *sql, sbx_dqlite_rows_t *rows);
int sbx_db_cl_begin (sbx_db_t *self, const char *sql);
int sbx_db_cl_end (sbx_db_t *self, const char *sql);

#endif
