/*  gw_others - a request this gateway cannot answer, asked of the other gateways in turn.

    Some things live on one gateway: the template builds it runs (gw_builds) and the
    legacy transport's event streams (gw_mcp_sse). Behind a balancer a request about one
    may reach any gateway; one that does not hold it lists the gateways the broker knows
    (broker.peers) and sends the request to each other one in turn (routed by instance,
    schemas/gateways.json) until one answers with anything but not_found. A gateway that
    is gone, silent, or too old to know the request is passed over. Nothing blocks: the
    requests go through gw_broker, and the callback is called once, from the loop.

    Where each thing was found is remembered (by key, a bounded map): the next ask about
    it goes to that gateway first, one hop (a legacy stream's every POST, a build's log
    polls). Should that one say not_found, or not answer, the walk above follows.
*/
#ifndef GW_OTHERS_H_INCLUDED
#define GW_OTHERS_H_INCLUDED

#include "gw_broker.h"
#include "sbx_common.h"

typedef struct gw_others_t gw_others_t;

//  The end of one ask: the first other gateway's reply that was not not_found (borrowed
//  for the call: a success, or an error message the front end words), or NULL with
//  not_found (none holds it), or another code (the others cannot be asked) and a message.
typedef void (gw_others_fn) (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg);

//  Asks through broker (borrowed) as the gateway named instance (copied: it is not asked).
gw_others_t *gw_others_new (gw_broker_t *broker, const char *instance);

//  Cancels the asks in flight: their callbacks are not called.
void gw_others_destroy (gw_others_t **self_p);

//  Sends request (taken; its instance is set for each gateway) for caller (copied) to
//  the other gateways in turn. key is what it is about, unique ("build:bld_…"): where
//  it was found is remembered under it. what names it in messages ("template build
//  bld_…"). Returns a handle for gw_others_cancel, or 0 when fn was already called
//  (GW_KEEP).
uint64_t gw_others_ask (gw_others_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                        const char *key, const char *what, gw_others_fn *fn, void *arg);

//  The gateway where key was found last, or NULL (for tests and logs).
const char *gw_others_where (gw_others_t *self, const char *key);

//  Forgets an ask in flight: its callback is not called. 0 or a finished handle is ignored.
void gw_others_cancel (gw_others_t *self, uint64_t handle);

void gw_others_test (bool verbose);
void gw_others_peers_test (bool verbose); //  gw_others_test.c: through a real broker

#endif
