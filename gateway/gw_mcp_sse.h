/*  gw_mcp_sse - MCP's legacy HTTP+SSE transport (2024-11-05), for clients that speak
    nothing newer.

    GET /sse (with the same credentials as /mcp: 401 and its WWW-Authenticate without)
    opens an event stream whose first event, `endpoint`, names where to POST messages:
    /messages?sessionId=<id>. Each POST is answered 202 at once; the JSON-RPC answer goes
    out on the stream as a `message` event. The tools, their texts, limits and rate are
    those of /mcp (gw_tools); the stream is the session: its default sandbox and env
    live as long as it stays open, on the gateway that holds it. A POST that reaches
    another gateway (behind a balancer) is sent on to the holder through the broker
    (gw_others, sse.message) and answered as the holder answers. A comment line every
    S_KEEPALIVE_MS keeps idle streams from being cut by proxies.
*/
#ifndef GW_MCP_SSE_H_INCLUDED
#define GW_MCP_SSE_H_INCLUDED

#include "gw_ctx.h"
#include "gw_mcp.h"
#include "sbx_common.h"

typedef struct gw_mcp_sse_t gw_mcp_sse_t;

//  Serves /sse and /messages with the gateway's services (ctx) and /mcp's checks (mcp:
//  Origin, version negotiation), both borrowed.
gw_mcp_sse_t *gw_mcp_sse_new (gw_ctx_t *ctx, gw_mcp_t *mcp);

//  Ends the open streams and forgets the calls in flight.
void gw_mcp_sse_destroy (gw_mcp_sse_t **self_p);

//  Streams open now (for /healthz).
size_t gw_mcp_sse_size (gw_mcp_sse_t *self);

//  sse.message routed here from another gateway (schemas/gateways.json): taken for its
//  stream, as a POST here would be. The reply (sse.message.ok, or an error echoing the
//  request's rid: not_found when no stream of that id and the caller's account is here).
sbx_msg_t *gw_mcp_sse_serve (gw_mcp_sse_t *self, const sbx_msg_t *request);

void gw_mcp_sse_test (bool verbose);

#endif
