/*  gw_mcp - /mcp: the MCP Streamable HTTP transport (protocol 2025-06-18) and JSON-RPC.

    POST /mcp carries one JSON-RPC message. Requests are answered as application/json:
    initialize (version negotiation, serverInfo, capabilities.tools, instructions, and
    a new Mcp-Session-Id bound to the caller's account), ping, tools/list, tools/call
    (gw_tools; the HTTP request stays suspended while the broker works, and the answer
    is dropped if the client left). Notifications and responses are accepted with 202.
    DELETE /mcp ends the session; later use of it is 404.

    A tools/call with params._meta.progressToken from a client whose Accept includes
    text/event-stream is answered as an SSE stream instead (200, text/event-stream):
    one `message` event per JSON-RPC message, notifications/progress {progressToken,
    progress: seconds elapsed, message: "<tool> still running after N s"} after 1 s,
    2 s, 4 s, 8 s, then every 5 s, so a long foreground exec keeps the client's request
    alive (SDKs reset their timeout on progress); the response is the last event. A
    client that leaves mid-stream stops the progress; the call finishes and its result
    is dropped.

    GET /mcp is 405: the server sends no requests or notifications outside a POST's
    answer, so there is nothing for a standalone stream to carry, and the protocol
    lets a server without one answer 405.

    Every request needs `Authorization: Bearer <API key>` (gw_auth; else 401). An
    Origin header, when present, must be the server's own origin or one listed in the
    `mcp.origins` setting (space or comma separated), else 403: a browser page can't
    drive the sandboxes of a key it doesn't hold, and can't ride a DNS rebinding.
    A bad MCP-Protocol-Version header is 400. A request without Mcp-Session-Id is
    served without session state (no default sandbox).

    Sessions are the broker's (gw_mcp_sessions): every gateway serves every session,
    and a restarted gateway serves them on.
*/
#ifndef GW_MCP_H_INCLUDED
#define GW_MCP_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_mcp_t gw_mcp_t;

//  Serves /mcp with the gateway's shared services (ctx, borrowed: it outlives this) and
//  registers the route. Without a loop (self-tests) no call is streamed.
gw_mcp_t *gw_mcp_new (gw_ctx_t *ctx);
void gw_mcp_destroy (gw_mcp_t **self_p);

//  Serves one request to /mcp (answers now, or suspends it and answers later).
void gw_mcp_handle (gw_mcp_t *self, gw_request_t *req);

//  The two halves of gw_mcp_handle, public so that fuzz/fuzz_mcp.c runs the same path
//  on hostile requests. admit: the checks before the key's, Origin (403) and method
//  (405); it answers and returns false when the request may not go on. serve: one
//  request from caller, whom gw_auth has named: the JSON-RPC message and what it asks.
bool gw_mcp_admit (gw_mcp_t *self, gw_request_t *req);
void gw_mcp_serve (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller);

//  The protocol version answered to a client that asked for `requested` (NULL: none).
const char *gw_mcp_negotiate (const char *requested);

//  Whether a browser's Origin (NULL: not a browser) may use MCP: the server's own, or
//  one of the mcp.origins setting (gw_mcp_sse checks the same).
bool gw_mcp_origin_allowed (gw_mcp_t *self, const char *origin);

//  What initialize tells a 2025-era client about the tools.
const char *gw_mcp_instructions (void);

void gw_mcp_test (bool verbose);

#endif
