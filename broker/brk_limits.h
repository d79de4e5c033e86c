/*  brk_limits - plan limits and wallet state, checked by the broker before a sandbox
    starts.

    An account's plan (accounts.plan, default free) sets, from sbx.conf:
        plan.P.starts_per_day   creates + resumes per UTC day     daily_limit_reached
                                (a fork's copies count one each)
        plan.P.running          sandboxes creating/ready/resuming  limit_exceeded
        plan.P.ttl_max_s        the longest TTL create/extend may ask   invalid_argument
        plan.P.ttl_default_s    the TTL of a create that asks none
        plan.P.requests_per_second  per API key (the gateway's)     rate_limited
        plan.P.snapshots        user snapshots kept (saving, ready)  limit_exceeded
                                (checked by brk_snapshot when a save begins)
        plan.P.template_bytes   bytes of templates and cached build  limit_exceeded
                                steps (snapshots labelled sbx.template or
                                sbx.template.cache) before a save of one begins
    A field a plan leaves unset takes the free plan's value; 0 means no limit (no TTL
    for ttl_default_s). Plan `unlimited` and admin accounts have no plan limits. Limits
    follow the account, whoever asks (an operator creating for it included).

    Counts come from the store (sandbox_starts, sandboxes), so they survive restarts.
    Wallets: billing sends account.funds when an account's wallet runs out or has funds
    again; the broker records it with an account.funds_exhausted/_restored event, and
    refuses the account's starts with insufficient_funds while it is out (admins too: the
    wallet is not a plan limit). brk_sandbox_tick stops its ready sandboxes.
*/
#ifndef BRK_LIMITS_H_INCLUDED
#define BRK_LIMITS_H_INCLUDED

#include "brk_ctx.h"

typedef struct {
    bool unlimited;               //  plan unlimited or an admin account: no plan limits
    uint64_t starts_per_day;      //  0: no limit
    uint64_t running;             //  0: no limit
    uint64_t ttl_max_s;           //  0: no limit
    uint64_t ttl_default_s;       //  0: no TTL
    uint64_t requests_per_second; //  per API key, enforced by the gateway; 0: no limit
    uint64_t snapshots;           //  user snapshots per account; 0: no limit
    uint64_t template_bytes;      //  templates' and cached steps' bytes; 0: no limit
} brk_plan_t;

//  The limits of the account's plan, from config.
void brk_limits_plan (sbx_config_t *config, const brk_account_t *account, brk_plan_t *plan);

//  May the account start a sandbox (create, or resume a stopped one) now? NULL when it
//  may, else the error reply (failed_precondition for a disabled account,
//  insufficient_funds, daily_limit_reached, limit_exceeded).
sbx_msg_t *brk_limits_check_start (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid);

//  The same for `starts` sandboxes at once (a fork's copies): each counts as a start and
//  as a running sandbox, and all must fit (the refusal says how many do).
sbx_msg_t *brk_limits_check_starts (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid,
                                    uint64_t starts);

//  Applies the plan's TTL bounds to *ttl_s: 0 on a create becomes the plan's default;
//  more than the maximum is invalid_argument naming it. NULL when *ttl_s is fine.
sbx_msg_t *brk_limits_ttl (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid,
                           uint64_t *ttl_s, bool extend);

//  account.funds from billing: records a change of the account's wallet state.
void brk_limits_funds (brk_ctx_t *ctx, sbx_msg_t *msg);

void brk_limits_test (bool verbose);

#endif
