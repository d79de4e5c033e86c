/*  gw_router - which front end serves a request: one table, filled by the front ends.

    Each front end registers what it serves when it is made: a Host it claims (the port
    proxy: <label>-<port>.<box domain>), exact paths (/mcp, /healthz, /account, the
    OAuth endpoints and metadata) and path prefixes (/v1 and everything under /v1/).
    A claim is asked first; then the path, exact routes before prefixes, longest first.
    Methods are the handler's to check (it answers 405 with its Allow).
*/
#ifndef GW_ROUTER_H_INCLUDED
#define GW_ROUTER_H_INCLUDED

#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_router_t gw_router_t;

//  Serves req. A claim returns true when it took req (it answers), false to pass.
typedef void (gw_router_fn) (gw_request_t *req, void *arg);
typedef bool (gw_router_claim_fn) (gw_request_t *req, void *arg);

gw_router_t *gw_router_new (void);
void gw_router_destroy (gw_router_t **self_p);

//  Asks fn first for every request (one claim per router). 0 or -1.
int gw_router_claim (gw_router_t *self, gw_router_claim_fn *fn, void *arg);
//  Routes path (prefix: path itself and all under path + "/") to fn. 0, or -1 when the
//  path is taken already or is no absolute path.
int gw_router_add (gw_router_t *self, const char *path, bool prefix, gw_router_fn *fn, void *arg);
//  Hands req to what serves it: true, or false when nothing does (the caller answers 404).
bool gw_router_route (gw_router_t *self, gw_request_t *req);

void gw_router_test (bool verbose);

#endif
