/*  hook_store - sbx-hookd's database (hooks/hooks.db, 0600): the webhooks with their
    signing secrets (kept, not hashed: each delivery is signed with one), the delivery
    log, and the seq of the last event of the broker's log it applied.

    An event's deliveries and its seq are written in one transaction, one delivery per
    webhook and event id (UNIQUE): replaying an event after a crash adds nothing, and an
    event the reader never recorded is replayed. The only SQLite user of sbx-hookd.
*/
#ifndef HOOK_STORE_H_INCLUDED
#define HOOK_STORE_H_INCLUDED

#include "sbx_common.h"

typedef struct _hook_store_t hook_store_t;

//  A delivery that is due: what an attempt needs.
typedef struct {
    int64_t id;
    const char *webhook_id;
    const char *url;
    const char *secret;
    const char *event_id;
    const char *body;
    uint64_t attempts;
} hook_due_t;

typedef void (hook_due_fn) (const hook_due_t *due, void *arg);

hook_store_t *hook_store_new (const char *path);
void hook_store_destroy (hook_store_t **self_p);

uint64_t hook_store_last_seq (hook_store_t *self);

//  Applies event seq: one pending delivery (due at ts_ms) of body for each webhook of
//  account made by ts_ms whose event list is empty or names type, and last_seq = seq, in one
//  transaction. type NULL: nothing to deliver, only the seq. 0, or -1 (rolled back).
int hook_store_apply (hook_store_t *self, uint64_t seq, const char *account, const char *type,
                      const char *event_id, const char *body, uint64_t ts_ms);

//  A new webhook; events is a space-separated list ("" for all). 0 or -1.
int hook_store_create (hook_store_t *self, const char *id, const char *account, const char *url,
                       const char *events, const char *secret, uint64_t now_ms);
//  How many webhooks account has.
int hook_store_count (hook_store_t *self, const char *account);
//  One webhook (counts included) into out: 0, 1 when there is none, -1 on error.
int hook_store_get (hook_store_t *self, const char *id, sbx_webhook_info_t *out);
//  The account's webhooks, oldest first. 0 or -1.
int hook_store_list (hook_store_t *self, const char *account, sbx_webhook_info_list_t *out);
//  Deletes a webhook and its delivery log. 0 or -1.
int hook_store_delete (hook_store_t *self, const char *id);
//  Deletes every webhook of account (it was deleted) and their logs. 0 or -1.
int hook_store_delete_account (hook_store_t *self, const char *account);
//  The webhook's deliveries, newest first. 0 or -1.
int hook_store_deliveries (hook_store_t *self, const char *webhook_id, uint64_t limit,
                           sbx_webhook_delivery_list_t *out);

//  Calls fn for up to limit pending deliveries due at now_ms, oldest first, at most one
//  per webhook: its due delivery of the lowest id (the earliest event), so that sending
//  only what this returns (and not what is in flight again) delivers a webhook's events
//  one at a time, in order; one waiting for a retry lets the next go.
int hook_store_due (hook_store_t *self, uint64_t now_ms, int limit, hook_due_fn *fn, void *arg);
//  Records an attempt's outcome: state "pending" (again at next_ms), "delivered" or
//  "failed". 0 or -1.
int hook_store_record (hook_store_t *self, int64_t id, const char *state, uint64_t attempts,
                       uint64_t status_code, const char *error, uint64_t next_ms, uint64_t done_ms);

void hook_store_test (bool verbose);

#endif
