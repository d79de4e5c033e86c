/*  gw_broker - the gateway's requests to the broker, shared by the MCP tools and REST.

    gw_broker_send puts the caller on a request, sends it through the peer and calls
    back once from the loop with the answer, never blocking. Agent requests (exec,
    status, kill, file read and write) travel wrapped in sandbox.agent; the callback
    gets the agent's own answer, already decoded. Errors, the broker's or the agent's,
    reach the callback as a catalogued code and a message, so each front end words
    them its own way (a tool result, an HTTP status). What the answers look like as
    JSON is sbx_api's; gw_ops runs whole operations on top of this.
*/
#ifndef GW_BROKER_H_INCLUDED
#define GW_BROKER_H_INCLUDED

#include <jansson.h>

#include "sbx_common.h"

typedef struct gw_broker_t gw_broker_t;

//  The answer to one request, called once: reply (borrowed for the call) when it
//  succeeded, for agent requests the agent's answer; else NULL with code and message.
typedef void (gw_broker_fn) (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg);

//  peer is borrowed; NULL for self-tests (requests then fail unavailable).
gw_broker_t *gw_broker_new (sbx_peer_t *peer);

//  Cancels requests in flight: their callbacks are not called.
void gw_broker_destroy (gw_broker_t **self_p);

//  Reads sandbox.get and usage.get answers from cache (borrowed; NULL: none) when it
//  has them, and tells it what is sent and answered (gw_cache.h).
typedef struct gw_cache_t gw_cache_t;
void gw_broker_set_cache (gw_broker_t *self, gw_cache_t *cache);

//  Keeps the handle a start function returns (gw_broker_send and the others that return
//  0 when fn was already called) unless it is 0: then the callback ran already, at once,
//  and may have freed what holds field, which must not be touched again.
#define GW_KEEP(field, call)                                                                       \
    do {                                                                                           \
        uint64_t handle_ = (call);                                                                 \
        if (handle_)                                                                               \
            field = handle_;                                                                       \
    } while (0)

//  Sends request (taken) for caller (copied onto it) with a deadline. Returns a handle
//  for gw_broker_cancel, or 0 when fn was already called (the request could not go out).
uint64_t gw_broker_send (gw_broker_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                         uint32_t timeout_ms, gw_broker_fn *fn, void *arg);

//  Sends an agent request (inner, taken) to a sandbox, wrapped in sandbox.agent. Same
//  return as gw_broker_send.
uint64_t gw_broker_send_agent (gw_broker_t *self, const sbx_caller_t *caller,
                               const char *sandbox_id, sbx_msg_t **inner_p, uint32_t timeout_ms,
                               gw_broker_fn *fn, void *arg);

//  Forgets a request in flight: its callback is not called. 0 or a finished handle is
//  ignored.
void gw_broker_cancel (gw_broker_t *self, uint64_t handle);

void gw_broker_test (bool verbose);

#endif
