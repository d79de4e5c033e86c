/*  brk_store - the broker's SQLite database (control.db): accounts, API keys, a
    key/value meta table, the append-only event log, sandboxes, their labels and
    published ports, OAuth clients, codes and tokens.

    The only broker module that uses SQLite (through sbx_db). The OAuth functions are
    in brk_store_oauth.c; what both files share is in brk_store_priv.h. One brk_store_t
    per process, used from one thread (the broker actor). Payloads are opaque bytes:
    encoding them is the caller's business.

    Every state change happens inside brk_store_begin / brk_store_commit, together
    with the event(s) describing it, so the log and the state can never disagree:

        brk_store_begin (store);
        if (brk_store_account_insert (store, &account) == 0
            && brk_store_event_append (store, "account.created", account.id, NULL,
                                       payload, size, now_ms, &seq) == 0
            && brk_store_commit (store) == 0)
            ... publish seq on the tap ...
        else
            brk_store_rollback (store);

    account_insert, key_insert, key_revoke and event_append refuse (-1) to run
    outside a transaction. key_touch and meta_set are bookkeeping without events and
    run in the open transaction if there is one, else commit on their own.

    Integers are stored as SQLite's signed 64-bit: times above INT64_MAX are refused.
*/
#ifndef BRK_STORE_H_INCLUDED
#define BRK_STORE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_dqlite.h"

#include "sbx_msg_gen.h"

//  Limits of an event's fields, as in schemas/events.json; longer is refused.
#define BRK_EVENT_TYPE_MAX    64
#define BRK_EVENT_ACCOUNT_MAX 64
#define BRK_EVENT_SUBJECT_MAX 128
#define BRK_EVENT_PAYLOAD_MAX 65536

typedef struct _brk_store_t brk_store_t;

//  One event, as brk_store_events_after hands it out. Every pointer is borrowed
//  for the duration of the callback only; account, subject and payload may be NULL.
typedef struct {
    uint64_t seq;
    uint64_t ts_ms;
    const char *type;
    const char *account;
    const char *subject;
    const uint8_t *payload;
    size_t payload_size;
} brk_event_row_t;

typedef void (brk_store_event_fn) (const brk_event_row_t *row, void *arg);

//  An account. Filled in by brk_store_account_find with copies the caller
//  releases with brk_account_clear; for insert, the caller's own strings.
typedef struct {
    char *id;            //  "acc_…"
    char *email;         //  unique, compared case-insensitively (ASCII)
    char *password_hash; //  sbx_secret_password_hash, or NULL: no password sign-in
    char *plan;
    bool admin;
    uint64_t created_ms;
    uint64_t disabled_ms; //  0: active; else when an operator disabled it
} brk_account_t;

//  What an account has, for the operator's account list: sandboxes that are not
//  deleted, and API keys and connections that still work at now_ms.
typedef struct {
    uint64_t sandboxes;
    uint64_t keys;
} brk_account_counts_t;

//  The account is borrowed for the call.
typedef void (brk_store_account_fn) (const brk_account_t *account, void *arg);

//  An API key or OAuth connection, without its secret. Same ownership as brk_account_t.
typedef struct {
    char *id;         //  "key_…"
    char *account_id; //  must name an existing account
    char *kind;       //  "api_key" or "connection"
    char *name;       //  label, may be NULL
    char *preset;     //  "full", "ci", "read-only", "no-delete", or NULL
    char *prefix;     //  first characters of the secret, to recognise it; may be NULL
    char *hash;       //  sbx_secret_hash of the secret: how the key is found
    uint64_t created_ms;
    uint64_t expires_ms;   //  0 = never
    uint64_t last_used_ms; //  0 = never
    uint64_t revoked_ms;   //  0 = active
} brk_key_t;

//  The key is borrowed for the call.
typedef void (brk_store_key_fn) (const brk_key_t *key, void *arg);

//  A sandbox's record. Same ownership as brk_account_t; states and types as text
//  (the wire enums' names: "creating"…"error", "small"…).
typedef struct {
    char *id; //  "sb_…"
    char *account_id;
    char *name;
    char *label; //  unique among sandboxes that are not deleted
    char *state;
    char *type;
    char *vmd;    //  the vmd instance hosting it
    char *reason; //  why it is in error, or NULL
    char *key_id; //  the API key that created it, or NULL
    bool no_network;
    bool no_auto_resume; //  autoResume off: port requests do not wake it
    char *egress_allow;  //  egress rules, an entry a line (brk_egress); NULL: none
    char *egress_deny;
    uint64_t created_ms;
    uint64_t expires_ms; //  0: never
    uint64_t changed_ms; //  when it entered its state
    uint64_t ttl_s;      //  its TTL, given again at every resume; 0: none
} brk_sandbox_t;

typedef void (brk_store_sandbox_fn) (const brk_sandbox_t *sandbox, void *arg);
//  A name (a vmd instance), for the lists of names.
typedef void (brk_store_name_fn) (const char *name, void *arg);
typedef void (brk_store_label_fn) (const char *key, const char *value, void *arg);

//  Opens or creates the database at path (mode 0600), in WAL mode with
//  synchronous=FULL and foreign keys on, and brings its schema up to date.
//  Returns NULL (and logs why) if the file cannot be opened, is not a database,
//  or was written by a newer broker (its schema version is unknown here).
brk_store_t *brk_store_new (const char *path);

//  The same store as database "control" of a dqlite cluster (sbx_db_new_cluster): the
//  broker of a control node opens it on its own node, without following the leader, so
//  that its writes fail once that node no longer leads. No sealed segments there: the
//  whole log stays in the replicated database.
brk_store_t *brk_store_new_cluster (const sbx_dqlite_cluster_t *cluster);

//  A cluster's first node (sbx cluster init): copies what the one-machine control.db at
//  path held (and the sealed segments in segments, when not NULL) into this cluster
//  store, once: only into a store that is fresh (no account, no event) or whose copy
//  stopped midway (it is finished then), never again once done, and never into a store
//  that holds a control plane (a joined node's leftover file: warned). 1 copied now, 0
//  nothing to do, -1 with a message in err (the copy can be run again).
int brk_store_import (brk_store_t *self, const char *path, const char *segments, char *err,
                      size_t err_size);

//  Rolls back an open transaction, closes the database, sets *self_p to NULL.
void brk_store_destroy (brk_store_t **self_p);

//  The schema version the database is at (the number of migrations applied).
int brk_store_schema_version (brk_store_t *self);

//  BEGIN IMMEDIATE: takes the write lock now, so the transaction cannot fail later
//  for want of it. Transactions do not nest. Returns 0, or -1 (one already open,
//  or the database is busy beyond the busy timeout).
int brk_store_begin (brk_store_t *self);

//  Returns 0, or -1 when no transaction is open or the commit failed; after a
//  failed commit call brk_store_rollback.
int brk_store_commit (brk_store_t *self);

//  Returns 0, or -1 when no transaction is open.
int brk_store_rollback (brk_store_t *self);
//  A run of reads in one read transaction (sbx_db_read_begin / sbx_db_read_end).
int brk_store_read_begin (brk_store_t *self);
void brk_store_read_end (brk_store_t *self, int opened);

//  True between brk_store_begin and commit/rollback.
bool brk_store_in_transaction (brk_store_t *self);

//  Appends an event inside the open transaction and returns its sequence number
//  in *seq_p (if not NULL). Sequence numbers start at 1 and the committed log has
//  no gaps: a rolled-back append gives its number to the next one. type is
//  required; account, subject and payload are optional (payload may be NULL when
//  size is 0). Returns 0, or -1 (no transaction, bad argument, database error).
int brk_store_event_append (brk_store_t *self, const char *type, const char *account,
                            const char *subject, const uint8_t *payload, size_t size,
                            uint64_t ts_ms, uint64_t *seq_p);

//  The highest sequence number ever assigned (0 for an empty log, or on error).
//  Inside a transaction this includes its own appends.
uint64_t brk_store_last_seq (brk_store_t *self);

//  Calls fn for each event with seq > after_seq, in seq order, at most limit of
//  them (0 = no limit), only those whose type starts with type_prefix (NULL or ""
//  = all; the match is literal and case-sensitive: '_' and '%' are ordinary
//  characters). Returns the number of rows handed to fn, or -1 (rows handed out
//  before an error stay handed out). fn may call other store functions but not
//  brk_store_events_after.
int brk_store_events_after (brk_store_t *self, uint64_t after_seq, size_t limit,
                            const char *type_prefix, brk_store_event_fn *fn, void *arg);

//  The event log's sealed segments. Once the live table holds 2 × segment_size events,
//  the oldest segment_size move, a chunk at a time, to dir/events-<first>-<last>.db (a
//  SQLite file written once, then only read): control.db stays the size of the recent
//  log, whatever the history. brk_store_events_after reads segments as if their events
//  were still in the live table. Open finds the segments there, drops a half-written
//  one and finishes a move a crash interrupted. segment_size 0: nothing more is sealed
//  (segments made before are still read). Returns 0, or -1 (dir unusable).
int brk_store_segments_open (brk_store_t *self, const char *dir, uint64_t segment_size);
//  One step of sealing: at most chunk events copied or deleted, outside any transaction.
//  Returns 1 when more work waits, 0 when none, -1 on error (logged; the next step
//  starts that segment again).
int brk_store_segments_step (brk_store_t *self, size_t chunk);
//  How many sealed segments there are, and the events they hold in *events_p.
size_t brk_store_segments_count (brk_store_t *self, uint64_t *events_p);

//  Inserts an account (inside a transaction). id, email and plan are required.
//  Returns 0 inserted, 1 an account with this email (any case) exists, -1 error
//  (bad argument, no transaction, duplicate id, database error).
int brk_store_account_insert (brk_store_t *self, const brk_account_t *account);

//  Finds an account by id or by email (case-insensitive); an id match wins. Deleted
//  accounts are not found. Returns 0 and fills *out (release with brk_account_clear),
//  1 not found, -1 error. *out is zeroed unless 0 is returned.
int brk_store_account_find (brk_store_t *self, const char *id_or_email, brk_account_t *out);

//  Sets *count to the number of accounts (deleted ones excepted). Returns 0 or -1.
int brk_store_account_count (brk_store_t *self, uint64_t *count);

//  Calls fn for each account that is not deleted, oldest first. Returns how many, or -1.
//  fn may call other store functions but not brk_store_account_list.
int brk_store_account_list (brk_store_t *self, brk_store_account_fn *fn, void *arg);

//  The account's counts (see brk_account_counts_t). Returns 0 or -1.
int brk_store_account_counts (brk_store_t *self, const char *account_id, uint64_t now_ms,
                              brk_account_counts_t *counts);

//  Whether the account is disabled, by id, cheaply (every user request asks). Returns
//  0 with *disabled, 1 no such account (or a deleted one), -1 error.
int brk_store_account_disabled (brk_store_t *self, const char *account_id, bool *disabled);

//  How many admin accounts are not deleted. Returns 0 or -1.
int brk_store_admin_count (brk_store_t *self, uint64_t *count);

//  Sets the password hash (NULL: API keys only) / disables (at disabled_ms; 0 enables),
//  in a transaction. 0, 1 no such account, -1 error.
int brk_store_account_set_password (brk_store_t *self, const char *account_id,
                                    const char *password_hash);
int brk_store_account_set_disabled (brk_store_t *self, const char *account_id,
                                    uint64_t disabled_ms);

//  Deletes an account at now_ms (in a transaction): revokes its keys and connections and
//  their OAuth tokens, deletes its MCP sessions, and keeps its row as a tombstone (so
//  its sandboxes' records stay) whose email becomes its id: the email is free for a new
//  account, and the deleted one is found no more. The caller checks that no sandbox of
//  it is live. 0, 1 no such account, -1 error.
int brk_store_account_delete (brk_store_t *self, const char *account_id, uint64_t now_ms);

//  Frees the strings of an account filled in by the store and zeroes it.
void brk_account_clear (brk_account_t *self);

//  Inserts a key (inside a transaction). id, account_id, kind and hash are
//  required; kind and preset must be one of the names above. Returns 0 inserted,
//  1 a key with this hash exists, -1 error (bad argument, no transaction, unknown
//  account, duplicate id, database error).
int brk_store_key_insert (brk_store_t *self, const brk_key_t *key);

//  Finds a key by the hash of its secret / by its id. Revoked and expired keys are
//  found too: the caller decides. Returns 0 and fills *out (release with
//  brk_key_clear), 1 not found, -1 error. *out is zeroed unless 0 is returned.
int brk_store_key_find_by_hash (brk_store_t *self, const char *hash, brk_key_t *out);
int brk_store_key_find (brk_store_t *self, const char *key_id, brk_key_t *out);

//  Calls fn for each key of the account, revoked ones included, newest first.
//  Returns the number of keys handed to fn, or -1. fn may call other store
//  functions but not brk_store_key_list.
int brk_store_key_list (brk_store_t *self, const char *account_id, brk_store_key_fn *fn, void *arg);

//  Revokes a key as of now_ms (inside a transaction). Returns 0 revoked or already
//  revoked (the first revocation time is kept), 1 not found, -1 error.
int brk_store_key_revoke (brk_store_t *self, const char *key_id, uint64_t now_ms);

//  Records that a key was used at now_ms; never moves last_used_ms backwards.
//  Each call outside a transaction is a synchronous commit: throttle the calls.
//  Returns 0 (also when the key does not exist), or -1.
int brk_store_key_touch (brk_store_t *self, const char *key_id, uint64_t now_ms);

//  Frees the strings of a key filled in by the store and zeroes it.
void brk_key_clear (brk_key_t *self);

//  Returns the value stored under key (the caller frees it), or NULL if absent
//  or on error.
char *brk_store_meta_get (brk_store_t *self, const char *key);

//  Stores value under key, replacing any old value; a NULL value deletes the key.
//  Returns 0 or -1.
int brk_store_meta_set (brk_store_t *self, const char *key, const char *value);

//  Hosts admitted by a join token (brk_store_hosts.c). Strings are the store's copies
//  (brk_host_clear), or the caller's for insert.
typedef struct {
    char *name;
    char *roles; //  comma-separated
    char *public_key;
    uint64_t created_ms;
    uint64_t removed_ms; //  0 while admitted
} brk_host_t;
void brk_host_clear (brk_host_t *self);
typedef void (brk_store_host_fn) (const brk_host_t *host, void *arg);
//  0 recorded, 1 when the name is an admitted host's (or the key is taken), -1 error.
//  A removed host's record is replaced.
int brk_store_host_insert (brk_store_t *self, const brk_host_t *host);
//  0 found, 1 not found, -1 error.
int brk_store_host_find (brk_store_t *self, const char *name, brk_host_t *out);
//  Every host, oldest first: how many, or -1.
int brk_store_host_list (brk_store_t *self, brk_store_host_fn *fn, void *arg);
//  0 removed now, 1 not admitted (unknown, or removed before), -1 error.
int brk_store_host_remove (brk_store_t *self, const char *name, uint64_t now_ms);

//  vmds being drained (sbx host drain). Set (kept if set: 0), unset (0; 1 when it was
//  not), and since when (0: it is not; -1 on error, then *since_ms is 0).
int brk_store_drain_set (brk_store_t *self, const char *vmd, uint64_t now_ms);
int brk_store_drain_unset (brk_store_t *self, const char *vmd);
int brk_store_drain_since (brk_store_t *self, const char *vmd, uint64_t *since_ms);
//  fn for every vmd being drained, oldest drain first: how many, or -1.
int brk_store_drain_list (brk_store_t *self, brk_store_name_fn *fn, void *arg);
//  How many sandboxes of vmd are in state (a sandbox state's name). 0 or -1.
int brk_store_sandbox_count_on (brk_store_t *self, const char *vmd, const char *state,
                                uint64_t *count);

//  Sandboxes. insert: 0, 1 when the label is taken, -1 (in a transaction).
int brk_store_sandbox_insert (brk_store_t *self, const brk_sandbox_t *sandbox);
//  0 found, 1 not found, -1 error.
int brk_store_sandbox_find (brk_store_t *self, const char *id, brk_sandbox_t *out);
//  The account's sandboxes that are not deleted (every account's when NULL), newest
//  first. Returns how many, or -1.
int brk_store_sandbox_list (brk_store_t *self, const char *account_id, brk_store_sandbox_fn *fn,
                            void *arg);
//  Where a page of that list ends: its last sandbox's creation time and row.
typedef struct {
    uint64_t created_ms; //  0: before the newest (the first page)
    int64_t row;
} brk_store_mark_t;
//  A page of brk_store_sandbox_list: at most limit sandboxes after *mark, only those made
//  with key_id when it is set (a CI key's own); *mark then names the last one given.
//  Returns how many, or -1.
int brk_store_sandbox_page (brk_store_t *self, const char *account_id, const char *key_id,
                            size_t limit, brk_store_mark_t *mark, brk_store_sandbox_fn *fn,
                            void *arg);
//  Moves a sandbox to `state` (vmd NULL keeps the current one; reason NULL clears it).
//  0, 1 when there is no such sandbox, -1 (in a transaction).
int brk_store_sandbox_set_state (brk_store_t *self, const char *id, const char *state,
                                 const char *vmd, const char *reason, uint64_t changed_ms);
//  How many sandboxes occupy a vmd (creating, ready, stopping, resuming, deleting).
int brk_store_sandbox_active (brk_store_t *self, const char *vmd, uint64_t *count);
//  How many sandboxes that are not deleted there are by state and type: fn per group
//  (strings borrowed for the call). The number of groups, or -1.
typedef void (brk_store_count_fn) (const char *state, const char *type, uint64_t count, void *arg);
int brk_store_sandbox_counts (brk_store_t *self, brk_store_count_fn *fn, void *arg);
//  Ready sandboxes whose deadline is at or before now_ms, most overdue first (at most
//  `limit`, and 100). Returns how many, or -1.
int brk_store_sandbox_expired (brk_store_t *self, uint64_t now_ms, size_t limit,
                               brk_store_sandbox_fn *fn, void *arg);
//  The sandboxes of vmd in creating, stopping, resuming or deleting (at most 100).
//  Returns how many, or -1.
int brk_store_sandbox_moving (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                              void *arg);
//  The sandboxes of vmd that its host holds for their users: ready or stopped, or on their
//  way (creating, stopping, resuming, deleting) (at most 100).
int brk_store_sandbox_held (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                            void *arg);
//  The stopped sandboxes of vmd (at most 100).
int brk_store_sandbox_stopped_on (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                                  void *arg);
//  The sandboxes of vmd in error because its host was lost (reason "host lost…"; at most
//  100).
int brk_store_sandbox_lost (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                            void *arg);
//  Whether vmd has sandboxes lost with its host, or deleted while it was lost: 1, 0, -1.
int brk_store_sandbox_lost_any (brk_store_t *self, const char *vmd);
//  fn for every vmd instance a sandbox record names (at most 1000): how many, or -1.
int brk_store_sandbox_vmds (brk_store_t *self, brk_store_name_fn *fn, void *arg);
//  Ready sandboxes of accounts whose wallet is empty, longest ready first (at most
//  `limit`, and 100). Returns how many, or -1.
int brk_store_sandbox_unfunded (brk_store_t *self, size_t limit, brk_store_sandbox_fn *fn,
                                void *arg);
//  Ready sandboxes of disabled accounts, longest ready first (at most `limit`, and 100).
//  Returns how many, or -1.
int brk_store_sandbox_disabled (brk_store_t *self, size_t limit, brk_store_sandbox_fn *fn,
                                void *arg);
//  Plan limits. start_add records a start (create or resume) in a transaction;
//  starts_since counts the account's starts at or after since_ms; account_running counts
//  its sandboxes in creating, ready or resuming. 0 or -1.
int brk_store_start_add (brk_store_t *self, const char *account_id, const char *sandbox_id,
                         uint64_t ts_ms);
int brk_store_starts_since (brk_store_t *self, const char *account_id, uint64_t since_ms,
                            uint64_t *count);
int brk_store_account_running (brk_store_t *self, const char *account_id, uint64_t *count);
//  Whether the account's wallet is empty (billing says): set in a transaction; 0, 1 no
//  such account, -1 error.
int brk_store_account_funds_set (brk_store_t *self, const char *account_id, bool exhausted);
int brk_store_account_funds_exhausted (brk_store_t *self, const char *account_id, bool *exhausted);
//  Sets the deadline and TTL; renames (in a transaction).
int brk_store_sandbox_set_expiry (brk_store_t *self, const char *id, uint64_t expires_ms,
                                  uint64_t ttl_s);
int brk_store_sandbox_set_name (brk_store_t *self, const char *id, const char *name);

//  Switches autoResume (a request to a published port wakes the stopped sandbox).
//  Inside the caller's transaction. 0 or -1.
int brk_store_sandbox_set_auto_resume (brk_store_t *self, const char *id, bool on);
//  Replaces the egress lists (an entry a line; NULL or "" for none). In a transaction.
int brk_store_sandbox_set_egress (brk_store_t *self, const char *id, const char *allow,
                                  const char *deny);
//  Sets a label (value NULL removes it), in a transaction; lists them by key.
int brk_store_sandbox_label_set (brk_store_t *self, const char *id, const char *key,
                                 const char *value);
int brk_store_sandbox_labels (brk_store_t *self, const char *id, brk_store_label_fn *fn, void *arg);
void brk_sandbox_clear (brk_sandbox_t *self);
//  The live (not deleted) sandbox with this label: 0 found, 1 not found, -1 error.
int brk_store_sandbox_find_by_label (brk_store_t *self, const char *label, brk_sandbox_t *out);

//  A published guest port and where its forward listens. Same ownership as brk_account_t.
typedef struct {
    char *sandbox_id;
    uint64_t port;      //  the guest's, 1-65535
    char *host;         //  the forward's address on the vmd's host
    uint64_t host_port; //  1-65535
    bool public;        //  anyone with the URL; else the owner's credentials
    uint64_t created_ms;
} brk_port_t;

typedef void (brk_store_port_fn) (const brk_port_t *port, void *arg);

//  Publishes or updates a port (in a transaction; created_ms is kept on update).
//  0 or -1 (bad argument, no transaction, no such sandbox, database error).
int brk_store_port_set (brk_store_t *self, const brk_port_t *port);
//  Unpublishes (in a transaction): 0 removed, 1 there was none, -1 error.
int brk_store_port_delete (brk_store_t *self, const char *sandbox_id, uint64_t port);
//  0 found (release with brk_port_clear), 1 not found, -1 error.
int brk_store_port_find (brk_store_t *self, const char *sandbox_id, uint64_t port, brk_port_t *out);
//  A sandbox's ports by port number: how many, or -1. fn may call other store functions
//  but not brk_store_ports.
int brk_store_ports (brk_store_t *self, const char *sandbox_id, brk_store_port_fn *fn, void *arg);
void brk_port_clear (brk_port_t *self);

//  OAuth. A client registered with RFC 7591 (clients identified by a metadata document
//  URL are the gateway's to fetch and are not stored). Same ownership as brk_account_t.
typedef struct {
    char *client_id;     //  "cli_…"
    char *name;          //  client_name
    char *redirect_uris; //  one per line, matched exactly
    uint64_t created_ms;
} brk_oauth_client_t;

//  Inserts a client (in a transaction): 0 or -1. Finds one: 0, 1 not found, -1.
int brk_store_oauth_client_insert (brk_store_t *self, const brk_oauth_client_t *client);
int brk_store_oauth_client_find (brk_store_t *self, const char *client_id, brk_oauth_client_t *out);
void brk_oauth_client_clear (brk_oauth_client_t *self);

//  An authorization code, access token or refresh token, found by the sbx_secret_hash of
//  its secret. grant_id is the connection (api_keys row, kind connection) it belongs to.
typedef struct {
    char *hash;
    char *kind; //  "code", "access" or "refresh"
    char *grant_id;
    char *client_id;
    char *redirect_uri; //  codes: the authorization request's
    char *challenge;    //  codes: the PKCE S256 challenge
    char *resource;     //  the audience
    char *scope;
    uint64_t created_ms;
    uint64_t expires_ms;
    uint64_t used_ms;    //  a code exchanged, a refresh token rotated; 0 = not yet
    uint64_t revoked_ms; //  0 = live
} brk_oauth_token_t;

//  Inserts (in a transaction): 0 or -1 (bad argument, unknown grant, duplicate).
int brk_store_oauth_token_insert (brk_store_t *self, const brk_oauth_token_t *token);
//  0 found (release with brk_oauth_token_clear), 1 not found, -1 error.
int brk_store_oauth_token_find (brk_store_t *self, const char *hash, brk_oauth_token_t *out);
//  Marks a code or refresh token used, revokes one token, or every token of a grant
//  (in a transaction). use and revoke: 0 done, 1 it was already (or does not exist), -1
//  error; grant_revoke: 0 or -1.
int brk_store_oauth_token_use (brk_store_t *self, const char *hash, uint64_t now_ms);
int brk_store_oauth_token_revoke (brk_store_t *self, const char *hash, uint64_t now_ms);
int brk_store_oauth_grant_revoke (brk_store_t *self, const char *grant_id, uint64_t now_ms);
//  Deletes codes and tokens that expired before before_ms (in a transaction): 0 or -1.
int brk_store_oauth_purge (brk_store_t *self, uint64_t before_ms);
//  The account's live connection (grant) for a client, found through the codes issued
//  under it: 0 with *grant_id (fresh), 1 none, -1 error.
int brk_store_oauth_grant_find (brk_store_t *self, const char *account_id, const char *client_id,
                                char **grant_id);
void brk_oauth_token_clear (brk_oauth_token_t *self);

//  An MCP session (see schemas/mcp.json). Same ownership as brk_account_t.
typedef struct {
    char *id; //  "mcps_…"
    char *account_id;
    char *key_id;
    char *protocol;
    char *client;
    char *sandbox_id; //  the default; NULL for none
    uint64_t created_ms;
    uint64_t used_ms;
} brk_mcp_session_t;

//  Inserts (in a transaction): 0 or -1 (bad argument, unknown account, duplicate).
int brk_store_mcp_session_insert (brk_store_t *self, const brk_mcp_session_t *session);
//  0 found (release with brk_mcp_session_clear), 1 not found, -1 error.
int brk_store_mcp_session_find (brk_store_t *self, const char *id, brk_mcp_session_t *out);
//  Sets the default sandbox (NULL: none) and the time of use (in a transaction): 0 or -1.
int brk_store_mcp_session_use (brk_store_t *self, const char *id, const char *sandbox_id,
                               uint64_t used_ms);
//  Deletes a session and its env (in a transaction): 0, 1 there was none, -1 error.
int brk_store_mcp_session_delete (brk_store_t *self, const char *id);
//  How many sessions an account has: 0 or -1.
int brk_store_mcp_session_count (brk_store_t *self, const char *account_id, uint64_t *count);
//  The account's least recently used session, or one used before before_ms by anyone:
//  0 with *id (fresh), 1 none, -1 error.
int brk_store_mcp_session_oldest (brk_store_t *self, const char *account_id, char **id);
int brk_store_mcp_session_idle (brk_store_t *self, uint64_t before_ms, char **id);
//  Replaces the env a session keeps for a sandbox (NULL or empty env: drops it), in a
//  transaction: 0 or -1.
int brk_store_mcp_env_set (brk_store_t *self, const char *session_id, const char *sandbox_id,
                           const sbx_strmap_t *env);
//  Calls fn for each variable a session keeps, by sandbox then name: the count, or -1.
typedef void (brk_store_env_fn) (const char *sandbox_id, const char *name, const char *value,
                                 void *arg);
int brk_store_mcp_env_list (brk_store_t *self, const char *session_id, brk_store_env_fn *fn,
                            void *arg);
void brk_mcp_session_clear (brk_mcp_session_t *self);

void brk_store_test (bool verbose);
//  The MCP sessions' self-test (brk_store_mcp.c).
void brk_store_mcp_test (bool verbose);
//  The OAuth functions' self-test (brk_store_oauth.c).
void brk_store_oauth_test (bool verbose);

#endif
