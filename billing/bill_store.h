/*  bill_store - billing's SQLite database (billing.db): accounts seen in the log, their
    wallets, each sandbox's running intervals and rate bookkeeping, the ledger of
    charges, and the sequence number of the last event applied.

    The only billing module that includes sqlite3.h. One bill_store_t per process, used
    from one thread. Every event is applied inside bill_store_begin / bill_store_commit
    together with bill_store_set_last_seq, so the charges an event produced and the
    record that it was applied are committed (or lost) together: that is what makes a
    replay after a crash apply each event exactly once.

        bill_store_begin (store);
        if (... intervals, charges, wallet ... == 0
            && bill_store_set_last_seq (store, event->seq) == 0
            && bill_store_commit (store) == 0)
            ... applied ...
        else
            bill_store_rollback (store);

    Every write refuses (-1) to run outside a transaction. Money is integer
    micro-dollars; times are ms since the epoch taken from the events, never the clock.
*/
#ifndef BILL_STORE_H_INCLUDED
#define BILL_STORE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_dqlite.h"

typedef struct _bill_store_t bill_store_t;

//  A sandbox's billing record. Strings are copies released by bill_sandbox_clear when
//  filled in by bill_store_sandbox_find; the caller's own strings for put.
typedef struct {
    char *id;
    char *account;
    char *type;           //  small, medium, large
    char *state;          //  as of the last event applied
    uint64_t rate;        //  µ$ per second its last charge used (0 before any)
    uint64_t rate_ms;     //  ms charged at that rate: the base of the rounding (see bill_meter)
    uint64_t total_ms;    //  ms charged in all
    uint64_t total_micro; //  µ$ charged in all
} bill_sandbox_t;

void bill_sandbox_clear (bill_sandbox_t *sandbox);

//  One interval in ready as bill_store_intervals hands it out; strings borrowed for the
//  duration of the callback. end_seq is 0 while it is open.
typedef struct {
    int64_t id;
    const char *sandbox_id;
    const char *type;
    const char *state; //  the sandbox's state now
    uint64_t start_seq, start_ms;
    uint64_t end_seq, end_ms;
    uint64_t rate;                          //  closed: the rate charged; open: 0
    uint64_t rate_ms_before;                //  closed: the sandbox's rate_ms before this interval
    uint64_t micro;                         //  closed: the charge
    uint64_t sandbox_rate, sandbox_rate_ms; //  the sandbox's current rate bookkeeping
} bill_interval_row_t;

typedef void (bill_store_interval_fn) (const bill_interval_row_t *row, void *arg);

//  Opens (creating and migrating) the database at path, mode 0600, WAL,
//  synchronous=FULL. Returns NULL (logged) on failure.
bill_store_t *bill_store_new (const char *path);
void bill_store_destroy (bill_store_t **self_p);

//  The same store as database "billing" of a dqlite cluster (sbx_db_new_cluster,
//  following the leader): the control plane's billing, replicated.
bill_store_t *bill_store_new_cluster (const sbx_dqlite_cluster_t *cluster);
bool bill_store_is_cluster (bill_store_t *self);

//  A cluster's first node (sbx cluster init): copies the one-machine billing.db at path
//  into this cluster store once (as brk_store_import: only into a fresh store, finishing
//  a copy that stopped midway). 1 copied now, 0 nothing to do, -1 with err.
int bill_store_import (bill_store_t *self, const char *path, char *err, size_t err_size);

//  Takes or keeps the billing lease for holder until until_ms, when it is free, ours, or
//  expired by now_ms: 1 when holder has it now, 0 when another holds it, -1 on a store
//  error. Several billing processes share a cluster's store; the one with the lease
//  applies the log (each event's seq is checked inside its transaction too, so two
//  that overlap for a moment still apply it once).
int bill_store_lease (bill_store_t *self, const char *holder, uint64_t now_ms, uint64_t until_ms);

int bill_store_schema_version (bill_store_t *self);

int bill_store_begin (bill_store_t *self);
int bill_store_commit (bill_store_t *self);
int bill_store_rollback (bill_store_t *self);
//  A run of reads in one read transaction (sbx_db_read_begin / sbx_db_read_end).
int bill_store_read_begin (bill_store_t *self);
void bill_store_read_end (bill_store_t *self, int opened);

//  The seq of the last event applied (0 for none).
uint64_t bill_store_last_seq (bill_store_t *self);
int bill_store_set_last_seq (bill_store_t *self, uint64_t seq);

//  Records an account (from account.created) and gives it an active wallet "main" with
//  `initial` µ$ when it has none. Repeating it changes nothing.
int bill_store_account_add (bill_store_t *self, const char *id, const char *email, int64_t initial,
                            uint64_t ts_ms);

//  The account id for an id or an email (case-insensitive), as a string the caller
//  frees, and its email in *email_p (caller frees; may be NULL). NULL when unknown:
//  then *email_p is NULL too.
char *bill_store_account_resolve (bill_store_t *self, const char *id_or_email, char **email_p);

//  The account's active wallet: its id (caller frees) and balance. Returns 0, 1 when it
//  has none, -1 on error.
int bill_store_wallet_active (bill_store_t *self, const char *account, char **wallet_p,
                              int64_t *balance_p);

//  Takes micro µ$ from a wallet.
int bill_store_wallet_debit (bill_store_t *self, const char *wallet, uint64_t micro);
//  Adds micro µ$ to a wallet (a top-up).
int bill_store_wallet_credit (bill_store_t *self, const char *wallet, uint64_t micro);

//  The account's wallet called name, made (empty, inactive) when it has none: its id in
//  *wallet_p (caller frees). In a transaction.
int bill_store_wallet_ensure (bill_store_t *self, const char *account, const char *name,
                              uint64_t ts_ms, char **wallet_p);
//  Charges of account go to wallet (an id of the account's) from now on. In a transaction.
int bill_store_wallet_activate (bill_store_t *self, const char *account, const char *wallet);

//  Calls fn for each of the account's wallets, oldest first; returns how many, or -1.
typedef void (bill_store_wallet_fn) (const char *name, int64_t balance, bool active, void *arg);
int bill_store_wallets (bill_store_t *self, const char *account, bill_store_wallet_fn *fn,
                        void *arg);

//  What the ledger ever took from one of the account's wallets, µ$.
int bill_store_wallet_charged (bill_store_t *self, const char *account, const char *wallet,
                               uint64_t *micro_p);

//  0 and *out filled in when known, 1 when not, -1 on error.
int bill_store_sandbox_find (bill_store_t *self, const char *id, bill_sandbox_t *out);
//  Inserts or updates the record.
int bill_store_sandbox_put (bill_store_t *self, const bill_sandbox_t *sandbox);

//  The sandbox's open interval: 0 with its row id and start, 1 when none, -1 on error.
int bill_store_interval_open_find (bill_store_t *self, const char *sandbox_id, int64_t *id_p,
                                   uint64_t *start_ms_p);
int bill_store_interval_open (bill_store_t *self, const char *sandbox_id, uint64_t start_seq,
                              uint64_t start_ms);
int bill_store_interval_close (bill_store_t *self, int64_t id, uint64_t end_seq, uint64_t end_ms,
                               uint64_t ms, uint64_t rate, uint64_t rate_ms_before, uint64_t micro);

//  One charge in the ledger: the interval `interval` closed by event `seq`.
typedef struct {
    const char *account;
    const char *wallet;
    const char *sandbox_id;
    int64_t interval;
    uint64_t seq;
    uint64_t ts_ms;
    uint64_t ms;
    uint64_t micro;
} bill_charge_t;

int bill_store_charge_add (bill_store_t *self, const bill_charge_t *charge);

//  Calls fn with each account's id (ids are collected first: fn may use the store).
//  Returns how many, or -1.
typedef void (bill_store_account_fn) (const char *account, void *arg);
int bill_store_accounts (bill_store_t *self, bill_store_account_fn *fn, void *arg);

//  Sum of an account's ledger: ms and µ$. Returns 0, or -1 (no account, store error).
int bill_store_ledger_totals (bill_store_t *self, const char *account, uint64_t *ms_p,
                              uint64_t *micro_p);

//  Calls fn for each interval of the account's sandboxes (or of sandbox_id only, when
//  not NULL), sandbox by sandbox in the order billing first saw them, each sandbox's
//  intervals in order. Returns the number of rows, or -1.
int bill_store_intervals (bill_store_t *self, const char *account, const char *sandbox_id,
                          bill_store_interval_fn *fn, void *arg);
//  The same for the account's open intervals only (its running sandboxes).
int bill_store_intervals_open (bill_store_t *self, const char *account, bill_store_interval_fn *fn,
                               void *arg);

void bill_store_test (bool verbose);

#endif
