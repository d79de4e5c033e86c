/*  bill_meter - turns the broker's events into running intervals and charges, and
    answers usage questions from them.

    Applied in seq order, one transaction per event (with the event's seq as billing's
    last applied): a sandbox.changed into ready opens an interval at the event's ts_ms;
    one out of ready (stopping, deleting, error, deleted...) closes it at its ts_ms and
    charges its type's rate to the account's active wallet; account.created records the
    account, its email and its wallet. Times come only from the events, so a replay
    computes the same figures to the micro-dollar.

    Rounding: each sandbox charges whole milliseconds. With R µ$ per second and B ms
    already charged to the sandbox at that rate, an interval of M ms costs
        floor ((B + M) × R / 1000) − floor (B × R / 1000)
    so a sandbox's charges always add up to floor (its ms × R / 1000): splitting time
    into intervals never gains or loses a micro-dollar. Usage figures per day and per
    window are cut from the same cumulative line, so they add up to the same total.
*/
#ifndef BILL_METER_H_INCLUDED
#define BILL_METER_H_INCLUDED

#include "bill_store.h"
#include "sbx_common.h"

//  Rates in µ$ per second of each sandbox type, and what a new wallet starts with.
typedef struct {
    uint64_t small;         //  rate.small, default 10 ($0.036 an hour)
    uint64_t medium;        //  rate.medium, default 20 ($0.072 an hour)
    uint64_t large;         //  rate.large, default 40 ($0.144 an hour)
    int64_t wallet_initial; //  wallet.initial µ$, default 0
} bill_rates_t;

typedef struct _bill_meter_t bill_meter_t;

//  Reads the rates from config (keys above; defaults when unset or not numbers).
void bill_meter_rates_from_config (sbx_config_t *config, bill_rates_t *rates);

//  The store is borrowed and must outlive the meter.
bill_meter_t *bill_meter_new (bill_store_t *store, const bill_rates_t *rates);
void bill_meter_destroy (bill_meter_t **self_p);

//  Applies one event (and records its seq) in one transaction. An event at or below the
//  last applied seq is skipped. Returns 0, or -1 when the store failed (nothing of the
//  event was applied; the caller should stop and replay later).
int bill_meter_apply (bill_meter_t *self, const sbx_event_t *event);

//  Answers a usage.get: usage.get.ok or an error. now_ms bounds open intervals (the one
//  use of the clock: it is not stored).
sbx_msg_t *bill_meter_usage (bill_meter_t *self, sbx_msg_t *request, uint64_t now_ms);

//  The rate of a sandbox type in µ$ per second.
uint64_t bill_meter_rate (bill_meter_t *self, sbx_sandbox_type_t type);

//  µ$ for `ms` more milliseconds after `before` ms at `rate` µ$/s (see above).
uint64_t bill_meter_cost (uint64_t before, uint64_t ms, uint64_t rate);

//  An account's wallet as of now_ms: *balance is its balance less what its running
//  sandboxes have used and not been charged yet; *prepaid says whether funds were ever
//  put in (wallet.initial or a top-up). A wallet that was never funded is post-paid:
//  it goes negative and nothing stops. Returns 0, or -1 (unknown account, store error).
//  Reads the store (bill_meter_funds_read, then bill_account_funds_at).
int bill_meter_funds (bill_meter_t *self, const char *account, uint64_t now_ms, bool *prepaid,
                      int64_t *balance);

//  A running sandbox's open interval, with what prices it: it will be charged at `rate`
//  µ$/s after `before` ms already charged at that rate (the rounding base).
typedef struct {
    uint64_t start_ms;
    uint64_t rate;
    uint64_t before;
} bill_running_t;

//  What an account's funds depend on, as the store has them: the active wallet's balance,
//  whether it was ever funded, and its running sandboxes. Only an event applied to the
//  account changes it; time only adds to the running sandboxes' cost.
typedef struct {
    int64_t held; //  the active wallet's balance
    bool prepaid;
    size_t running_count;
    bill_running_t *running; //  owned: bill_account_funds_clear frees it
} bill_account_funds_t;

void bill_account_funds_clear (bill_account_funds_t *funds);

//  Reads *out (cleared first) from the store: 0, 1 when the account has no active wallet
//  (unknown to billing), -1 on a store error.
int bill_meter_funds_read (bill_meter_t *self, const char *account, bill_account_funds_t *out);

//  The balance at now_ms: held less what the running sandboxes used so far, priced as
//  usage prices them.
int64_t bill_account_funds_at (const bill_account_funds_t *funds, uint64_t now_ms);

//  Called after each event the meter committed, with its seq, the seq it followed (the
//  last applied, read under the store's write lock: a gap from the previous call's seq
//  means another billing process of a cluster applied events in between) and the account
//  whose funds it may have changed (NULL: none). Not called for an event it found applied
//  already.
typedef void (bill_meter_touch_fn) (const char *account, uint64_t after_seq, uint64_t seq,
                                    void *arg);
void bill_meter_set_touch (bill_meter_t *self, bill_meter_touch_fn *fn, void *arg);

void bill_meter_test (bool verbose);

#endif
