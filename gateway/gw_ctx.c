/*  gw_ctx - see gw_ctx.h */
#include "gw_ctx.h"

#include <assert.h>

gw_ctx_t *gw_ctx_new (sbx_config_t *config, zloop_t *loop, gw_http_t *http, sbx_peer_t *peer)
{
    gw_ctx_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->loop = loop;
    self->peer = peer;
    self->http = http;
    self->auth = gw_auth_new (config, peer);
    self->broker = gw_broker_new (peer);
    self->mcp_sessions = gw_mcp_sessions_new (config, peer, self->broker);
    self->signin = gw_session_new (config);
    self->router = gw_router_new ();
    self->api = sbx_api_new (config);
    self->others =
        self->broker ? gw_others_new (self->broker, peer ? sbx_peer_instance (peer) : NULL) : NULL;
    bool ok = self->auth && self->broker && self->mcp_sessions && self->signin && self->router &&
              self->api && self->others;
    if (ok && loop && peer) {
        //  One pool and one throttle for both sign-in pages: guesses spread over the two
        //  count together, and a burst holds at most one of the threads (gw_verify.h).
        uint64_t threads = config ? sbx_config_get_uint (config, "gateway.signin_threads", 2) : 2;
        self->verify =
            threads >= 1 && threads <= 64 ? gw_verify_new (loop, (size_t) threads) : NULL;
        if (!self->verify)
            sbx_error ("gateway.signin_threads must be 1 to 64");
        ok = self->verify != NULL;
    }
    if (ok && loop)
        ok = gw_auth_start (self->auth, loop) == 0 &&
             gw_mcp_sessions_start (self->mcp_sessions, loop) == 0;
    if (ok && peer &&
        !streq (config ? sbx_config_get (config, "gateway.read_cache", "on") : "on", "off")) {
        self->cache = gw_cache_new (config, peer);
        ok = self->cache && (!loop || gw_cache_start (self->cache, loop) == 0);
        if (ok)
            gw_broker_set_cache (self->broker, self->cache);
    }
    if (ok) {
        self->ops = gw_ops_new (self->api, self->broker, self->cache, self->auth);
        ok = self->ops != NULL;
    }
    if (!ok) {
        sbx_error ("gateway: cannot make its shared services");
        gw_ctx_destroy (&self);
    }
    return self;
}

void gw_ctx_destroy (gw_ctx_t **self_p)
{
    assert (self_p);
    gw_ctx_t *self = *self_p;
    if (!self)
        return;
    //  The sessions cancel their own requests; then the broker client cancels the rest
    //  (telling the read copy, which goes after it).
    gw_mcp_sessions_destroy (&self->mcp_sessions);
    gw_others_destroy (&self->others);
    gw_ops_destroy (&self->ops);
    gw_broker_destroy (&self->broker);
    sbx_api_destroy (&self->api);
    gw_auth_destroy (&self->auth);
    gw_verify_destroy (&self->verify);
    gw_cache_destroy (&self->cache);
    gw_session_destroy (&self->signin);
    gw_router_destroy (&self->router);
    free (self);
    *self_p = NULL;
}
