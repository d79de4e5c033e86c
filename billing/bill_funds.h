/*  bill_funds - every account's funds in memory, for the wallet check each second.

    Each second billing asks, for every account, whether its wallet has run out counting
    its running sandboxes' time so far. Reading the store for every account each second
    costs the accounts ever seen, busy or not. This keeps what the store says of each
    (bill_meter_funds_read: the active wallet's balance, whether it was ever funded, the
    open intervals with what prices them) and reads an account again only after the
    meter applied an event to it. So a pass costs the accounts that run sandboxes or
    changed since the last pass, and no store read but those changes'. It holds the
    store's own rows, priced by bill_account_funds_at as bill_meter_funds prices them:
    its figures are the store's, to the micro-dollar.

        bill_funds_t *funds = bill_funds_new (meter, store); //  takes the meter's touch
        ...each second:
        bill_funds_check (funds, sbx_clock_now_ms (), every_tenth, s_tell, arg);

    It reads every account once, at its first pass, and again after bill_funds_reload
    (a cluster's billing that starts following the log, whose store others wrote) or an
    event the meter found applied already (another billing process applied it).
*/
#ifndef BILL_FUNDS_H_INCLUDED
#define BILL_FUNDS_H_INCLUDED

#include "bill_meter.h"

typedef struct _bill_funds_t bill_funds_t;

//  An account's funds at the pass's now_ms: prepaid (funds were ever put in) and the
//  balance less its running sandboxes' time so far. Returns true when that is dealt with,
//  false to be called for it again at the next pass (e.g. the broker could not be told).
typedef bool (bill_funds_fn) (const char *account, bool prepaid, int64_t balance, void *arg);

//  Meter and store are borrowed and must outlive it; it sets the meter's touch hook.
bill_funds_t *bill_funds_new (bill_meter_t *meter, bill_store_t *store);
void bill_funds_destroy (bill_funds_t **self_p);

//  Forgets what it holds: the next pass reads every account from the store.
void bill_funds_reload (bill_funds_t *self);

//  One pass: reads the accounts changed since the last, then calls fn for each account
//  billing knows (one with an active wallet) that runs sandboxes, changed, or was not
//  dealt with at the last pass; for every one when `all`. An account whose rows could not
//  be read is left out and read at the next pass. Returns how many fn was called for, or
//  -1 when the store failed.
int bill_funds_check (bill_funds_t *self, uint64_t now_ms, bool all, bill_funds_fn *fn, void *arg);

//  How many accounts it holds (those read so far).
size_t bill_funds_size (bill_funds_t *self);

void bill_funds_test (bool verbose);

#endif
