/*  gw_gateway - see gw_gateway.h */
#include "gw_gateway.h"
#include "gw_account.h"
#include "gw_cache.h"
#include "gw_ctx.h"
#include "gw_http.h"
#include "gw_mcp.h"
#include "gw_mcp_sse.h"
#include "gw_metrics.h"
#include "gw_oauth.h"
#include "gw_proxy.h"
#include "gw_rest.h"
#include "gw_tls.h"
#include "sbx_urls.h"
#include "gw_verify.h"

#include <assert.h>
#include <jansson.h>

struct gw_gateway_t {
    sbx_config_t *config;
    sbx_peer_t *peer;
    gw_http_t *http;
    gw_mcp_t *mcp;
    gw_mcp_sse_t *sse;     //  the legacy HTTP+SSE transport (/sse, /messages)
    gw_oauth_t *oauth;     //  the OAuth endpoints, metadata and sign-in pages
    gw_account_t *account; //  /account, the account web page
    gw_proxy_t *proxy;     //  <label>-<port>.box.<domain> hosts
    gw_rest_t *rest;
    gw_metrics_t *metrics; //  /metrics on metrics.listen, or NULL when off
    gw_ctx_t *ctx;         //  what the front ends share: auth, broker client, read copy, router…
    uint64_t started_ms;
};

static void s_json (gw_request_t *req, int status, json_t *body)
{
    char *text = json_dumps (body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref (body);
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_respond (req, status, "application/json", text, text ? strlen (text) : 0);
    free (text);
}

static void s_error (gw_request_t *req, sbx_code_t code, const char *message)
{
    s_json (
        req, sbx_code_http_status (code),
        json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message", message));
}

static void s_healthz (gw_request_t *req, void *arg)
{
    gw_gateway_t *self = arg;
    gw_ctx_t *ctx = self->ctx;
    if (!streq (gw_request_method (req), "GET") && !streq (gw_request_method (req), "HEAD")) {
        gw_request_add_header (req, "Allow", "GET, HEAD");
        s_error (req, SBX_E_INVALID_ARGUMENT, "use GET /healthz");
        return;
    }
    bool broker = sbx_peer_welcomed (self->peer);
    uint64_t hits = 0, misses = 0, checked = 0, throttled = 0;
    if (ctx->cache)
        gw_cache_counts (ctx->cache, &hits, &misses);
    if (ctx->verify)
        gw_verify_counts (ctx->verify, &checked, &throttled);
    uint64_t gateways = 1, keys = 0, shared = 0;
    gw_auth_rate_counts (ctx->auth, &gateways, &keys, &shared);
    s_json (req, broker ? 200 : 503,
            json_pack ("{s:s, s:b, s:s, s:s, s:I, s:{s:b, s:I, s:I}, s:{s:I, s:I}, "
                       "s:{s:I, s:I, s:I}, s:{s:I}}",
                       "status", broker ? "ok" : "degraded", "broker", broker, "instance",
                       sbx_peer_instance (self->peer), "version", SBX_VERSION, "uptime_s",
                       (json_int_t) ((sbx_clock_now_ms () - self->started_ms) / 1000), "read_cache",
                       "enabled", ctx->cache != NULL, "hits", (json_int_t) hits, "misses",
                       (json_int_t) misses, "signin", "checked", (json_int_t) checked, "throttled",
                       (json_int_t) throttled, "rates", "gateways", (json_int_t) gateways, "keys",
                       (json_int_t) keys, "shared", (json_int_t) shared, "mcp_sessions", "copies",
                       (json_int_t) gw_mcp_sessions_size (ctx->mcp_sessions)));
}

//  Metrics are for the operator, on an address of their own (gw_metrics): not here.
static void s_metrics_elsewhere (gw_request_t *req, void *arg)
{
    (void) arg;
    s_error (req, SBX_E_NOT_FOUND,
             "metrics are not served on this listener: the operator sets metrics.listen "
             "(docs/metrics.md)");
}

static void s_on_request (gw_request_t *req, void *arg)
{
    gw_gateway_t *self = arg;
    const char *path = gw_request_path (req);
    sbx_debug ("http rid=%llu %s %s", (unsigned long long) gw_request_id (req),
               gw_request_method (req), path);
    //  The front ends registered what they serve (gw_router.h).
    if (gw_router_route (self->ctx->router, req))
        return;
    char message[300];
    snprintf (message, sizeof message, "nothing is served at %s on this gateway", path);
    s_error (req, SBX_E_NOT_FOUND, message);
}

//  A deadline setting, 1 ms to 1 hour; 0 (and why, logged) when it is not one.
static unsigned s_ms_setting (sbx_config_t *config, const char *key, const char *fallback)
{
    const char *text = sbx_config_get (config, key, fallback);
    char *end = NULL;
    unsigned long ms = strtoul (text, &end, 10);
    if (end == text || *end || ms < 1 || ms > 3600000) {
        sbx_error ("%s must be a number of milliseconds, 1 to 3600000 (not '%s')", key, text);
        return 0;
    }
    return (unsigned) ms;
}

gw_gateway_t *gw_gateway_new (sbx_config_t *config, zloop_t *loop, sbx_peer_t *peer)
{
    gw_gateway_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->peer = peer;
    self->started_ms = sbx_clock_now_ms ();
    char why[400];
    if (sbx_urls_check (config, why, sizeof why)) {
        //  Every URL the gateway names (resource metadata, audiences, sandboxes) stems
        //  from it: refuse to start rather than hand out wrong ones.
        sbx_error ("%s", why);
        free (self);
        return NULL;
    }
    gw_http_options_t options = {
        .listen = sbx_config_get (config, "listen", "127.0.0.1:8443"),
        .header_timeout_ms = s_ms_setting (config, "gateway.header_timeout_ms", "30000"),
        .body_timeout_ms = s_ms_setting (config, "gateway.body_timeout_ms", "30000"),
        .count_responses = true};
    if (!options.header_timeout_ms || !options.body_timeout_ms) {
        gw_gateway_destroy (&self);
        return NULL;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    const char *tls = sbx_config_get (config, "tls", "on");
    if (streq (tls, "off"))
        options.plain = true;
    else if (sbx_config_get (config, "tls.cert", NULL)) {
        options.cert_file = sbx_config_get (config, "tls.cert", NULL);
        options.key_file = sbx_config_get (config, "tls.key", NULL);
        if (!options.key_file)
            sbx_error ("tls.cert is set but tls.key is not");
    } else {
        char *dir = sbx_config_path (config, "tls");
        const char *box = sbx_config_get (config, "box_domain", NULL);
        if (dir && gw_tls_ensure_ca_box (dir, sbx_config_get (config, "domain", "localhost"),
                                         box && *box ? box : NULL, &cert, &key, &ca) == 0) {
            options.cert_file = cert;
            options.key_file = key;
        } else
            sbx_error ("cannot create the local CA in %s", dir ? dir : "DIR/tls");
        free (dir);
    }
    if (options.plain || (options.cert_file && options.key_file))
        self->http = gw_http_new (loop, &options, s_on_request, self);
    if (self->http) {
        //  One of each service for every front end (gw_ctx.h): a revoke through any of
        //  them (or the tap) is seen by all, and a key's rate is one budget across MCP,
        //  REST and ports.
        self->ctx = gw_ctx_new (config, loop, self->http, peer);
        if (self->ctx) {
            self->proxy = gw_proxy_new (self->ctx);
            self->mcp = gw_mcp_new (self->ctx);
            self->sse = self->mcp ? gw_mcp_sse_new (self->ctx, self->mcp) : NULL;
            self->rest = gw_rest_new (self->ctx);
            self->oauth = gw_oauth_new (self->ctx);
            self->account = gw_account_new (self->ctx);
        }
        if (!self->ctx || !self->mcp || !self->sse || !self->rest || !self->proxy || !self->oauth ||
            !self->account ||
            gw_router_add (self->ctx->router, "/healthz", false, s_healthz, self) ||
            gw_router_add (self->ctx->router, "/metrics", false, s_metrics_elsewhere, self))
            gw_http_destroy (&self->http);
    }
    if (self->http && !streq (sbx_config_get (config, "metrics.listen", "off"), "off")) {
        self->metrics = gw_metrics_new (config, loop, peer, self->http);
        if (!self->metrics) //  asked for and not possible: say so by not starting
            gw_http_destroy (&self->http);
    }
    if (self->http)
        sbx_info ("serving %s on %s (port %d)%s%s", options.plain ? "HTTP" : "HTTPS",
                  options.listen, gw_http_port (self->http), ca ? ", clients trust " : "",
                  ca ? ca : "");
    free (cert);
    free (key);
    free (ca);
    if (!self->http)
        gw_gateway_destroy (&self);
    return self;
}

void gw_gateway_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    gw_gateway_t *self = *(gw_gateway_t **) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply;
    if (!self || !self->rest || !self->sse)
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "this gateway is starting; ask again");
    else if (request->type == SBX_MSG_SSE_MESSAGE)
        reply = gw_mcp_sse_serve (self->sse, request);
    else
        reply = gw_rest_serve (self->rest, request);
    sbx_peer_send (peer, &reply);
    sbx_msg_destroy (&reply); //  (left when it could not go out)
}

void gw_gateway_destroy (gw_gateway_t **self_p)
{
    assert (self_p);
    gw_gateway_t *self = *self_p;
    if (!self)
        return;
    //  The servers first: their open requests are released before MCP forgets them.
    gw_metrics_destroy (&self->metrics);
    gw_http_destroy (&self->http);
    //  The front ends cancel their requests in flight; then what they borrowed goes (no
    //  loop turns in between, so nothing calls back into them).
    gw_mcp_sse_destroy (&self->sse);
    gw_mcp_destroy (&self->mcp);
    gw_proxy_destroy (&self->proxy);
    gw_rest_destroy (&self->rest);
    gw_oauth_destroy (&self->oauth);
    gw_account_destroy (&self->account);
    gw_ctx_destroy (&self->ctx);
    free (self);
    *self_p = NULL;
}
