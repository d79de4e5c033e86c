/*  gw_rest - the REST API under /v1: the sandbox operations of the MCP tools for code.

    JSON in and out; every failure is {"error":{"code","message"}} with the HTTP status
    of its code (schemas/errors.json). Routes, methods and bodies are described by
    docs/openapi.json, which the build embeds and GET /v1/openapi.json serves verbatim
    (no credentials needed); it and the route table (sbx_ops_gen) are generated from
    schemas/operations.json, and the self-test checks that they list the same paths
    and methods.

    Every other route needs `Authorization: Bearer sbx_…` (an API key, gw_auth); none or
    a bad one is 401 with `WWW-Authenticate: Bearer`. Only API keys: OAuth access
    tokens, when they come, are refused here (401) as they are meant for /mcp. A
    read-only key may only GET (the gateway refuses early; the broker decides anyway).
    A request waiting for the broker is suspended, never blocking the loop; an answer
    for a client that left is dropped.

    Files travel raw: PUT …/files?path=/abs sends the body (application/octet-stream)
    to the guest in 1 MiB agent requests; GET …/files?path=/abs reads it back the same
    way, up to the gateway's body limit (16 MiB; 413 beyond).
*/
#ifndef GW_REST_H_INCLUDED
#define GW_REST_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_rest_t gw_rest_t;

//  Serves /v1 with the gateway's shared services (ctx, borrowed: it outlives this; its
//  parts may be NULL in self-tests) and registers the route.
gw_rest_t *gw_rest_new (gw_ctx_t *ctx);

//  Forgets requests in flight (their clients get no answer: the server goes too).
void gw_rest_destroy (gw_rest_t **self_p);

//  Serves one request whose path is /v1 or under /v1/ (answers now, or suspends it).
void gw_rest_handle (gw_rest_t *self, gw_request_t *req);

//  A request another gateway routed here through the broker (build.get): the reply,
//  never NULL.
sbx_msg_t *gw_rest_serve (gw_rest_t *self, const sbx_msg_t *request);

void gw_rest_test (bool verbose);

#endif
