/*  sbx_dqlite - a client of dqlite's wire protocol: one connection to one dqlite node.

    dqlite (libdqlite, Raft-replicated SQLite) offers the node in its library and no
    client API: applications speak its documented wire protocol to a node, as go-dqlite
    does. This module is that client, and the only code that knows the protocol's bytes.
    It is blocking with a deadline per call: a store calls it from its loop as it would
    call SQLite (a write waits for a quorum as SQLite's waits for fsync), and a node that
    falls silent fails the call after the connection's timeout instead of hanging it.

        sbx_dqlite_t *c = sbx_dqlite_connect ("10.0.0.1:9001", 2000, NULL, NULL);
        sbx_dqlite_open (c, "control");
        uint32_t stmt;
        sbx_dqlite_prepare (c, "INSERT INTO t (a) VALUES (?1)", &stmt, NULL);
        sbx_dqlite_value_t v = {.type = SBX_DQ_INTEGER, .integer = 7};
        sbx_dqlite_exec (c, stmt, &v, 1, &result);
        sbx_dqlite_destroy (&c);

    Requests on one connection are strictly one at a time (the node asserts so), and a
    query's rows are read to their end before the call returns. Every answer is checked
    before it is believed: sizes against the message, types against the protocol; a
    malformed one fails the call (and the connection, which is then unusable).

    Errors: -1, with sbx_dqlite_errcode (SQLite's extended result code from the node's
    FAILURE, or SBX_DQ_EIO when the connection failed, SBX_DQ_EPROTO for an answer that
    breaks the protocol) and sbx_dqlite_errmsg.
*/
#ifndef SBX_DQLITE_H_INCLUDED
#define SBX_DQLITE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct _sbx_dqlite_t sbx_dqlite_t;

//  Value types: SQLite's codes, and dqlite's three of its own (answers only).
typedef enum {
    SBX_DQ_INTEGER = 1,
    SBX_DQ_FLOAT = 2,
    SBX_DQ_TEXT = 3,
    SBX_DQ_BLOB = 4,
    SBX_DQ_NULL = 5,
    SBX_DQ_UNIXTIME = 9,
    SBX_DQ_ISO8601 = 10,
    SBX_DQ_BOOLEAN = 11,
} sbx_dqlite_type_t;

//  Error codes beyond SQLite's (SQLite's are below 2^16 with extended codes).
#define SBX_DQ_EIO    0x10001 // the connection failed or timed out: it is unusable now
#define SBX_DQ_EPROTO 0x10002 // the node answered something the protocol does not allow

//  SQLite's SQLITE_IOERR_NOT_LEADER and SQLITE_IOERR_LEADERSHIP_LOST, as dqlite's patched
//  SQLite defines them (Debian's plain sqlite3.h does not): the statement was not run,
//  or its transaction is gone, because this node does not lead (any more).
#define SBX_DQ_NOT_LEADER      (10 | (40 << 8))
#define SBX_DQ_LEADERSHIP_LOST (10 | (41 << 8))

//  Node roles in the cluster's configuration.
typedef enum { SBX_DQ_VOTER = 0, SBX_DQ_STANDBY = 1, SBX_DQ_SPARE = 2 } sbx_dqlite_role_t;

//  A parameter (text and blob borrowed for the call) or a value of a row (text and
//  blob point into the rows' buffers, valid while the rows live).
typedef struct {
    int type; // sbx_dqlite_type_t
    int64_t integer;
    double real;
    const void *data; //  text (NUL-terminated) or blob bytes
    size_t size;      //  bytes of data, the NUL not counted
} sbx_dqlite_value_t;

//  A query's answer: column names and rows of values, row-major.
typedef struct {
    size_t columns;
    char **names;
    size_t rows;
    sbx_dqlite_value_t *values; //  rows * columns
    void *priv_;
} sbx_dqlite_rows_t;

//  An EXEC's answer.
typedef struct {
    uint64_t last_insert_id;
    uint64_t rows_affected;
} sbx_dqlite_result_t;

//  A member of the cluster's configuration.
typedef struct {
    uint64_t id;
    char *address;
    int role; // sbx_dqlite_role_t
} sbx_dqlite_server_t;

//  Opens a connection: dial gives a connected stream socket for address (for a node
//  reached through a tunnel); NULL dials address itself: "host:port" over TCP, or
//  "@name", an abstract Unix socket (a node of this process). Then the protocol's
//  handshake and CLIENT. timeout_ms bounds each call on the connection (0: 5000).
//  NULL (logged at debug: callers decide what a refused connection means) on failure.
typedef int (sbx_dqlite_dial_fn) (const char *address, int timeout_ms, void *arg);
sbx_dqlite_t *sbx_dqlite_connect (const char *address, int timeout_ms, sbx_dqlite_dial_fn *dial,
                                  void *arg);

//  The dialing sbx_dqlite_connect does without a dial function: a connected stream
//  socket to "host:port" (TCP) or "@name" (an abstract socket), or -1.
int sbx_dqlite_dial (const char *address, int timeout_ms);

//  Asks each of addresses[0..count-1] in turn which node leads and connects to that
//  one (a node that names no leader, or names one that does not answer, is passed
//  over). NULL when no leader could be reached within about timeout_ms per address.
sbx_dqlite_t *sbx_dqlite_connect_leader (const char *const *addresses, size_t count, int timeout_ms,
                                         sbx_dqlite_dial_fn *dial, void *arg);

//  Closes the connection. Safe on NULL and twice.
void sbx_dqlite_destroy (sbx_dqlite_t **self_p);

//  The address this connection reached.
const char *sbx_dqlite_address (sbx_dqlite_t *self);
//  False once a call failed with SBX_DQ_EIO or SBX_DQ_EPROTO.
bool sbx_dqlite_usable (sbx_dqlite_t *self);
//  The last call's error code (0 after a success) and message ("" after a success).
int sbx_dqlite_errcode (sbx_dqlite_t *self);
const char *sbx_dqlite_errmsg (sbx_dqlite_t *self);
//  True when the last error says the node does not lead (the statement did not run):
//  reconnect to the leader and run it there.
bool sbx_dqlite_not_leader (sbx_dqlite_t *self);

//  The leader as this node knows it: *id 0 and *address NULL when it knows none.
//  *address is the caller's to free.
int sbx_dqlite_leader (sbx_dqlite_t *self, uint64_t *id, char **address);

//  Opens database name on the connection (one per connection, as dqlite allows).
int sbx_dqlite_open (sbx_dqlite_t *self, const char *name);

//  Prepares one statement: its id on this connection and its parameter count.
int sbx_dqlite_prepare (sbx_dqlite_t *self, const char *sql, uint32_t *stmt_id, uint64_t *params);
//  Runs a prepared statement that returns no rows (on the leader; a write waits for its
//  quorum). result may be NULL. At most 255 parameters.
int sbx_dqlite_exec (sbx_dqlite_t *self, uint32_t stmt_id, const sbx_dqlite_value_t *params,
                     size_t count, sbx_dqlite_result_t *result);
//  Runs a prepared statement that returns rows, reading all of them into *rows (the
//  caller's: sbx_dqlite_rows_free). A statement without result columns is refused by
//  the node: run it with sbx_dqlite_exec.
int sbx_dqlite_query (sbx_dqlite_t *self, uint32_t stmt_id, const sbx_dqlite_value_t *params,
                      size_t count, sbx_dqlite_rows_t *rows);
int sbx_dqlite_finalize (sbx_dqlite_t *self, uint32_t stmt_id);

//  SQL text run at once: exec runs every statement of it (no rows), query the one.
int sbx_dqlite_exec_sql (sbx_dqlite_t *self, const char *sql, sbx_dqlite_result_t *result);
int sbx_dqlite_query_sql (sbx_dqlite_t *self, const char *sql, sbx_dqlite_rows_t *rows);

void sbx_dqlite_rows_free (sbx_dqlite_rows_t *rows);

//  The cluster's configuration as this node knows it: *servers (the caller's:
//  sbx_dqlite_servers_free) and *count.
int sbx_dqlite_cluster (sbx_dqlite_t *self, sbx_dqlite_server_t **servers, size_t *count);
void sbx_dqlite_servers_free (sbx_dqlite_server_t **servers_p, size_t count);

//  Membership, on the leader: add a node (as a spare), give it a role, remove it, hand
//  leadership to another voter (id 0: dqlite chooses).
int sbx_dqlite_add (sbx_dqlite_t *self, uint64_t id, const char *address);
int sbx_dqlite_assign (sbx_dqlite_t *self, uint64_t id, sbx_dqlite_role_t role);
int sbx_dqlite_remove (sbx_dqlite_t *self, uint64_t id);
int sbx_dqlite_transfer (sbx_dqlite_t *self, uint64_t id);

//  A consistent copy of database name as its files: the main file and its WAL, as the
//  node holds them. *files is the caller's (sbx_dqlite_files_free).
typedef struct {
    char *name;
    void *data;
    size_t size;
} sbx_dqlite_file_t;
int sbx_dqlite_dump (sbx_dqlite_t *self, const char *name, sbx_dqlite_file_t **files,
                     size_t *count);
void sbx_dqlite_files_free (sbx_dqlite_file_t **files_p, size_t count);

//  Where a cluster's databases are, for sbx_db_new_cluster: the nodes to ask (the first is tried
//  first), how to reach them, and whether the store follows a new leader. A store that follows
//  reconnects to whichever node leads, between transactions, when its node does not
//  lead or its connection failed (a statement the node refused as not the leader is
//  then run on the new one). One that does not (the broker, which leads only while its
//  own node does) stays on addresses[0], and its statements fail while that node does
//  not lead (sbx_db_not_leader).
typedef struct {
    const char *const *addresses;
    size_t count;
    sbx_dqlite_dial_fn *dial; //  NULL: TCP "host:port", or "@name" in this process
    void *dial_arg;
    int timeout_ms; //  each call's deadline; 0: 5000
    bool follow;
} sbx_dqlite_cluster_t;

void sbx_dqlite_test (bool verbose);

#endif
