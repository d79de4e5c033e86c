/*  gw_cache - the gateway's read copy of sandboxes (sandbox.get answers) and of their
    usage (usage.get answers for one sandbox), so that agents polling get_sandbox cost
    no broker or billing round trip.

    Kept exact by the broker's event tap: every committed change to a sandbox is an
    event whose subject is the sandbox (sandbox.changed, sandbox.updated,
    sandbox.port_changed, ttl.expired), and each one drops that sandbox's entry. An
    answer is stored only if no event (nor a change sent by this gateway) touched a
    sandbox while it was in flight, so a stale read can never be stored after the
    event that made it stale. The copy is used only while the tap reader is caught up
    (no replay in flight). Changes this gateway sends (stop, resume, delete, extend,
    update, port) drop the entry when sent and when answered: its own clients read
    their writes; another gateway's clients see them once the event arrives (a few
    milliseconds on one machine).

    Usage figures move with the clock while a sandbox runs, so a usage answer is kept
    for gateway.usage_cache_ms (default 1000; 0 keeps none): runningSeconds and the
    cost may lag the clock by that much, never a state change.

    Only a caller of the sandbox's own account (an API key, an OAuth connection, a
    signed-in page) reads from the copy: operators and ci keys (which see only what
    they created) always ask the broker, which stays the judge of visibility.
*/
#ifndef GW_CACHE_H_INCLUDED
#define GW_CACHE_H_INCLUDED

#include "sbx_common.h"

#include <jansson.h>

typedef struct gw_cache_t gw_cache_t;

//  What a request sent on a miss must tell the cache when its answer comes.
typedef struct {
    int kind; //  0: nothing
    uint64_t tick;
    char sandbox[72];
    char account[72];
} gw_cache_ticket_t;

//  config and peer are borrowed. config "gateway.read_cache" = off disables it. Without
//  a peer (self-tests) there is no tap: the copy is used at once and gw_cache_event
//  feeds it.
gw_cache_t *gw_cache_new (sbx_config_t *config, sbx_peer_t *peer);
void gw_cache_destroy (gw_cache_t **self_p);

//  Starts following the tap.
int gw_cache_start (gw_cache_t *self, zloop_t *loop);

//  The answer to request for caller when the copy has it (a fresh message the caller
//  owns), else NULL with ticket filled for gw_cache_answer. A change request drops the
//  entry of its sandbox here.
sbx_msg_t *gw_cache_lookup (gw_cache_t *self, const sbx_caller_t *caller, const sbx_msg_t *request,
                            gw_cache_ticket_t *ticket);

//  The answer to a request looked up with ticket (NULL: it failed or was cancelled).
void gw_cache_answer (gw_cache_t *self, const gw_cache_ticket_t *ticket, const sbx_msg_t *reply);

//  Drops so far: take it before a lookup whose answers make a result to keep.
uint64_t gw_cache_tick (gw_cache_t *self);

//  A tool's finished result made of a sandbox's answer and its usage answer (the
//  get_sandbox result): kept (a reference is taken) with them, as long as both are, if
//  nothing was dropped since tick. It must not change afterwards.
void gw_cache_keep_result (gw_cache_t *self, const sbx_caller_t *caller, const char *sandbox,
                           uint64_t tick, json_t *result);

//  That result (a new reference) while it holds, else NULL.
json_t *gw_cache_result (gw_cache_t *self, const sbx_caller_t *caller, const char *sandbox);

//  Something about subject (a sandbox id) changed.
void gw_cache_event (gw_cache_t *self, const char *subject);

//  Lookups answered from the copy, and lookups that went to the broker.
void gw_cache_counts (gw_cache_t *self, uint64_t *hits, uint64_t *misses);

void gw_cache_test (bool verbose);

#endif
