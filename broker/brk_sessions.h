/*  brk_sessions - handlers for mcp.session.* requests: MCP sessions kept where every
    gateway finds them.

    A session is its account's: another account, or a session that ended, is told
    not_found. It remembers the sandbox its tool calls created or used last (the default
    of calls without sandboxId) and the env create_sandbox gave each sandbox it made.
    Every change that a gateway's copy would miss is written with an mcp.session.changed
    event, so gateways drop their copies from the tap. Only gateways may ask: sessions
    are MCP's, and the gateway is what speaks MCP.
*/
#ifndef BRK_SESSIONS_H_INCLUDED
#define BRK_SESSIONS_H_INCLUDED

#include "brk_ctx.h"

//  Each takes the decoded request and returns its reply, never NULL.
sbx_msg_t *brk_sessions_open (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway);
sbx_msg_t *brk_sessions_get (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway);
sbx_msg_t *brk_sessions_use (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway);
sbx_msg_t *brk_sessions_end (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway);

//  Forgets sessions idle for a day (a few per call, so a timer may call it often).
void brk_sessions_sweep (brk_ctx_t *ctx);

void brk_sessions_test (bool verbose);

#endif
