/*  gw_ctx - what a gateway's front ends share: one of each service, made once.

    MCP, REST, the port proxy, the OAuth pages and the account page each borrow from one
    context rather than building their own: one credential cache and rate keeper
    (gw_auth, with gw_rates), one broker client (gw_broker), one runner of the
    operations (gw_ops) for REST and MCP, one read copy of sandboxes
    (gw_cache), one MCP session service (gw_mcp_sessions), one sign-in cookie service
    (gw_session), one password checker (gw_verify), one router, and one way to ask the
    other gateways (gw_others). So a key's rate is one
    budget across the front ends, a revoke is seen by all at once, and requests in
    flight are cancelled in one place. gw_gateway makes the context for the gateway;
    self-tests make one with no peer (every broker request then fails unavailable).
*/
#ifndef GW_CTX_H_INCLUDED
#define GW_CTX_H_INCLUDED

#include "gw_auth.h"
#include "gw_broker.h"
#include "gw_cache.h"
#include "gw_http.h"
#include "gw_mcp_sessions.h"
#include "gw_ops.h"
#include "gw_others.h"
#include "gw_router.h"
#include "gw_session.h"
#include "gw_verify.h"
#include "sbx_common.h"

typedef struct gw_ctx_s {
    sbx_config_t *config; //  borrowed; NULL in self-tests (defaults)
    zloop_t *loop;        //  borrowed; NULL in self-tests that run no loop
    sbx_peer_t *peer;     //  borrowed; NULL: no broker
    gw_http_t *http;      //  borrowed; NULL in self-tests
    gw_auth_t *auth;
    gw_broker_t *broker;
    sbx_api_t *api;    //  where sandbox URLs point; the answers' shapes
    gw_ops_t *ops;     //  runs the operations for REST and MCP
    gw_cache_t *cache; //  NULL with gateway.read_cache = off, and in self-tests
    gw_mcp_sessions_t *mcp_sessions;
    gw_session_t *signin;
    gw_verify_t *verify; //  NULL without a loop and a peer (each sign-in page has its own)
    gw_router_t *router;
    gw_others_t *others; //  asks the other gateways what lives on one (gw_others.h)
} gw_ctx_t;

//  Makes and starts the services (with a loop and a peer: following the tap, reporting
//  rates). NULL when one cannot be made (logged).
gw_ctx_t *gw_ctx_new (sbx_config_t *config, zloop_t *loop, gw_http_t *http, sbx_peer_t *peer);
//  After the front ends that borrow from it: cancels what is in flight, then frees.
void gw_ctx_destroy (gw_ctx_t **self_p);

#endif
