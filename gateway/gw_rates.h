/*  gw_rates - a key's plan rate, held together by every gateway.

    Each key has a token bucket here (one second of its plan deep), refilled at this
    gateway's share of the plan, so that N gateways behind a balancer allow the plan
    together, not N times it. Every gateway.rate_report_ms (250) the gateway tells the
    broker how many requests each key made here (rate.report) and gets its shares back
    (broker/brk_rates.h). A key without a share yet starts at 1/gateways (the whole plan
    with one gateway); a share lapses when its key has had no requests here for 1 s (or
    four report periods); while the broker is away the shares held stay (they err toward
    the plan). Taking is synchronous: no request waits for the broker.
*/
#ifndef GW_RATES_H_INCLUDED
#define GW_RATES_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_rates_t gw_rates_t;

//  A key's request budget (IETF RateLimit fields): the plan's requests per second, what
//  is left of this gateway's part, and seconds until a request is back.
typedef struct {
    uint64_t limit;
    uint64_t remaining;
    uint64_t reset_s;
} gw_rates_limit_t;

//  config and peer are borrowed; peer NULL: self-tests (nothing is reported).
gw_rates_t *gw_rates_new (sbx_config_t *config, sbx_peer_t *peer);
void gw_rates_destroy (gw_rates_t **self_p);
//  Starts reporting to the broker (with no peer: nothing to do). 0 or -1.
int gw_rates_start (gw_rates_t *self, zloop_t *loop);

//  Notes a key's plan rate (from auth.key; 0: none); a new key starts with a full bucket.
void gw_rates_set (gw_rates_t *self, const char *key_id, uint64_t rate);

//  Spends one request of the key's budget: 0 when it may go, -1 when the key is over its
//  rate. limit is filled either way (limit 0: no rate for this key).
int gw_rates_take (gw_rates_t *self, const char *key_id, gw_rates_limit_t *limit);

//  For /healthz: the gateways the broker last counted (1 before it said), the keys with
//  requests here in the last second, and how many of those this gateway holds to less
//  than their whole plan (a share below 1000).
void gw_rates_counts (gw_rates_t *self, uint64_t *gateways, uint64_t *keys, uint64_t *shared);

void gw_rates_test (bool verbose);

#endif
