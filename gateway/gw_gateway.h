/*  gw_gateway - the gateway's HTTP(S) front: TLS setup and request routing.

    Serves HTTPS on the `listen` address with the operator's certificate (tls.cert,
    tls.key) or, by default, one signed by the local CA it creates at first run in
    DIR/tls/ (clients trust DIR/tls/ca.crt, which `sbx status --json` reports as
    ca_cert); plain HTTP only with tls = off. Routes each request by path to its
    handler. What it serves today:
      GET /healthz   200 {"status":"ok","broker":true|false,...}: liveness, and whether
                     this gateway is connected to the broker (503 when it is not)
      /mcp           MCP Streamable HTTP with API keys or OAuth access tokens (gw_mcp)
      /v1/...        the REST API with API keys (gw_rest)
      /.well-known/oauth-..., /oauth/...   the OAuth authorization server (gw_oauth)
      /account       the account web page: keys and connections (gw_account)
      <label>-<port>.box.<domain>      the port proxy (gw_proxy), any path
    Anything else: 404 with {"error":{"code":"not_found","message":...}}.
*/
#ifndef GW_GATEWAY_H_INCLUDED
#define GW_GATEWAY_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_gateway_t gw_gateway_t;

//  Starts serving on the loop. The peer (borrowed) is the broker connection. Returns
//  NULL (and logs why) when TLS material can't be made or the address can't be bound.
gw_gateway_t *gw_gateway_new (sbx_config_t *config, zloop_t *loop, sbx_peer_t *peer);
void gw_gateway_destroy (gw_gateway_t **self_p);

//  A request the broker routed to this gateway (sbx_peer_request_fn; arg: a gw_gateway_t **,
//  NULL until the gateway is made): answered now.
void gw_gateway_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

#endif
