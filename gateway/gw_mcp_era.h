/*  gw_mcp_era - which MCP revision a request on /mcp speaks, and the checks the
    2026-07-28 revision makes of every request.

    2026-07-28 has no sessions and no initialize: every request carries its protocol
    version and the client's capabilities in params._meta, and the MCP-Protocol-Version,
    Mcp-Method and (for tools/call) Mcp-Name headers repeat what the body says. A request
    claiming it (params._meta["io.modelcontextprotocol/protocolVersion"]), or naming a
    2026 version in MCP-Protocol-Version, is served statelessly; anything else is the
    2025 era (initialize, Mcp-Session-Id), as before. The checks are the spec's, in the
    order its conformance suite asks: a malformed envelope 400 -32602, a header that
    disagrees with the body 400 -32020, an unsupported version 400 -32022 (with
    data.supported and data.requested).
*/
#ifndef GW_MCP_ERA_H_INCLUDED
#define GW_MCP_ERA_H_INCLUDED

#include <jansson.h>

#include "sbx_common.h"

//  The revision of the stateless era this gateway speaks.
#define GW_MCP_MODERN            "2026-07-28"
#define GW_MCP_META_VERSION      "io.modelcontextprotocol/protocolVersion"
#define GW_MCP_META_CAPABILITIES "io.modelcontextprotocol/clientCapabilities"
#define GW_MCP_META_SERVER       "io.modelcontextprotocol/serverInfo"

//  Reads a header of the request (the caller's accessor).
typedef const char *(gw_mcp_era_header_fn) (void *source, const char *name);

//  True when the request is one of the stateless era: msg (the parsed body, may be NULL)
//  claims it in params._meta, or the MCP-Protocol-Version header names 2026-07-28 or
//  later.
bool gw_mcp_era_modern (json_t *msg, gw_mcp_era_header_fn *header, void *source);

//  A refusal: HTTP status, JSON-RPC code and message, and data (or NULL; the caller
//  owns it).
typedef struct {
    int status;
    int code;
    char message[300];
    json_t *data;
} gw_mcp_era_refusal_t;

//  Checks a stateless-era request (msg, a JSON-RPC request object): 0, or -1 with why
//  filled in.
int gw_mcp_era_check (json_t *msg, gw_mcp_era_header_fn *header, void *source,
                      gw_mcp_era_refusal_t *why);

//  A header value as the spec compares it: spaces and tabs around it trimmed, and
//  "=?base64?…?=" decoded (non-ASCII names). A fresh string, or NULL when it is not
//  valid.
char *gw_mcp_era_header_value (const char *raw);

void gw_mcp_era_test (bool verbose);

#endif
