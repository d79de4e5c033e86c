/*  gw_router - see gw_router.h */
#include "gw_router.h"

#include <assert.h>

#define S_ROUTES_MAX 32

typedef struct {
    char *path;
    bool prefix;
    gw_router_fn *fn;
    void *arg;
} s_route_t;

struct gw_router_t {
    gw_router_claim_fn *claim;
    void *claim_arg;
    s_route_t routes[S_ROUTES_MAX];
    size_t count;
};

gw_router_t *gw_router_new (void)
{
    return calloc (1, sizeof (gw_router_t));
}

void gw_router_destroy (gw_router_t **self_p)
{
    assert (self_p);
    gw_router_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->count; i++)
        free (self->routes[i].path);
    free (self);
    *self_p = NULL;
}

int gw_router_claim (gw_router_t *self, gw_router_claim_fn *fn, void *arg)
{
    assert (self);
    if (self->claim || !fn)
        return -1;
    self->claim = fn;
    self->claim_arg = arg;
    return 0;
}

int gw_router_add (gw_router_t *self, const char *path, bool prefix, gw_router_fn *fn, void *arg)
{
    assert (self);
    if (!path || path[0] != '/' || !fn || self->count == S_ROUTES_MAX)
        return -1;
    for (size_t i = 0; i < self->count; i++)
        if (streq (self->routes[i].path, path) && self->routes[i].prefix == prefix)
            return -1;
    char *copy = strdup (path);
    if (!copy)
        return -1;
    //  Kept in the order they are tried: exact ones first, then longer prefixes first.
    size_t at = self->count;
    while (at > 0) {
        s_route_t *before = &self->routes[at - 1];
        bool after = prefix && (!before->prefix || strlen (before->path) >= strlen (path));
        if (after || (!prefix && !before->prefix))
            break;
        self->routes[at] = *before;
        at--;
    }
    self->routes[at] = (s_route_t){copy, prefix, fn, arg};
    self->count++;
    return 0;
}

static bool s_matches (const s_route_t *route, const char *path)
{
    if (!route->prefix)
        return streq (route->path, path);
    size_t len = strlen (route->path);
    return strncmp (path, route->path, len) == 0 && (path[len] == 0 || path[len] == '/');
}

bool gw_router_route (gw_router_t *self, gw_request_t *req)
{
    assert (self);
    if (self->claim && self->claim (req, self->claim_arg))
        return true;
    const char *path = gw_request_path (req);
    for (size_t i = 0; path && i < self->count; i++)
        if (s_matches (&self->routes[i], path)) {
            self->routes[i].fn (req, self->routes[i].arg);
            return true;
        }
    return false;
}

//  --------------------------------------------------------------------------
//  Self test: the table's order and matching, without requests.

static void s_noop (gw_request_t *req, void *arg)
{
    (void) req;
    (void) arg;
}

static const s_route_t *s_find (gw_router_t *self, const char *path)
{
    for (size_t i = 0; i < self->count; i++)
        if (s_matches (&self->routes[i], path))
            return &self->routes[i];
    return NULL;
}

void gw_router_test (bool verbose)
{
    (void) verbose;
    gw_router_t *router = gw_router_new ();
    assert (router);
    int a, b, c, d;
    assert (gw_router_add (router, "/v1", true, s_noop, &a) == 0);
    assert (gw_router_add (router, "/mcp", false, s_noop, &b) == 0);
    assert (gw_router_add (router, "/v1/openapi.json", false, s_noop, &c) == 0);
    assert (gw_router_add (router, "/v1/sandboxes", true, s_noop, &d) == 0);
    assert (gw_router_add (router, "/mcp", false, s_noop, &b) == -1); //  taken
    assert (gw_router_add (router, "relative", false, s_noop, &b) == -1);
    //  Exact before prefixes, the longer prefix first.
    assert (!router->routes[0].prefix && !router->routes[1].prefix);
    assert (streq (router->routes[2].path, "/v1/sandboxes") &&
            streq (router->routes[3].path, "/v1"));
    assert (s_find (router, "/mcp")->arg == &b);
    assert (s_find (router, "/mcp/") == NULL && s_find (router, "/mcpx") == NULL);
    assert (s_find (router, "/v1")->arg == &a && s_find (router, "/v1/usage")->arg == &a);
    assert (s_find (router, "/v1/openapi.json")->arg == &c);
    assert (s_find (router, "/v1/sandboxes/sb_1/exec")->arg == &d);
    assert (s_find (router, "/v10") == NULL && s_find (router, "/") == NULL);
    assert (gw_router_claim (router, NULL, NULL) == -1);
    gw_router_destroy (&router);
}
