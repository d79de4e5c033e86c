/*  gw_ratelimit - at most N events per key in a window, e.g. dynamic client
    registrations per client address per minute.

    A fixed window per key: the first event opens it, and until it ends at most
    `limit` events are allowed; a refused one is told how long until the window ends
    (for Retry-After). Kept in memory, per gateway: N gateways behind a balancer allow N
    times as many. At most 10000 keys are kept: when full, ended windows are dropped,
    and if none has ended, all of them (an attacker's spray of addresses must not grow
    memory; it then gets a fresh window, as everyone else does). */
#ifndef GW_RATELIMIT_H_INCLUDED
#define GW_RATELIMIT_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_ratelimit_t gw_ratelimit_t;

//  limit events per window_ms for each key; limit 0 allows everything.
gw_ratelimit_t *gw_ratelimit_new (size_t limit, uint64_t window_ms);

void gw_ratelimit_destroy (gw_ratelimit_t **self_p);

//  Counts an event for key at now_mono (ms, sbx_clock_mono_ms). Returns 0 when it is
//  allowed, -1 when refused; then *retry_ms (may be NULL) says when the window ends.
int gw_ratelimit_take (gw_ratelimit_t *self, const char *key, uint64_t now_mono,
                       uint64_t *retry_ms);

//  The key for a client address: an IPv4 address as it is, an IPv6 one as its /64
//  ("2001:db8:1:2::/64"), since one host commonly holds a whole /64 to rotate through.
//  Anything else is copied as it is.
void gw_ratelimit_address_key (const char *address, char *key, size_t size);

void gw_ratelimit_test (bool verbose);

#endif
