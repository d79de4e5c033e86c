/*  gw_proxy - the port proxy: https://<label>-<port>.<box_domain> → that guest port
    (<box_domain>: the box_domain setting, by default box.<domain>).

    A request whose Host is <label>-<port>.<box_domain> is resolved with the broker
    (sandbox.resolve, cached for two seconds), checked (unknown host 404; a sandbox that
    is not ready 503 with what to do; a private port needs `Authorization: Bearer <API
    key>` of the sandbox's owner, else 401/403), then sent to the forward vmd made for
    that port (a TCP endpoint on the vmd's host) from the gateway's loop, never
    blocking. The response streams back as it comes (chunked or SSE responses arrive a
    piece at a time; a slow client slows the upstream reads down). `Upgrade: websocket`
    requests are piped byte for byte both ways once the guest said 101. Hop-by-hop
    headers are dropped; X-Forwarded-For, -Proto and -Host are added.

    What proves who the visitor is never reaches a guest: Authorization (public and
    private ports alike) and the gateway's cookies are not passed on. And a guest's
    Set-Cookie loses its Domain attribute, so its cookies stay on its own host and can
    never be planted on the gateway's pages or another sandbox (docs/oauth.md).
*/
#ifndef GW_PROXY_H_INCLUDED
#define GW_PROXY_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_proxy_t gw_proxy_t;

//  Serves guest ports with the gateway's shared services (ctx, borrowed: it outlives
//  this) and claims their hosts in its router. The hosts it takes come from the
//  box_domain setting (sbx_urls_box_domain).
gw_proxy_t *gw_proxy_new (gw_ctx_t *ctx);

//  Drops every proxied connection. Destroy the HTTP server first (its requests end).
void gw_proxy_destroy (gw_proxy_t **self_p);

//  Takes the request when its Host is a port host and returns true; false otherwise
//  (the caller serves it as usual).
bool gw_proxy_handle (gw_proxy_t *self, gw_request_t *req);

//  Splits a lower-case host "<label>-<port>.<box_domain>" (no :port). Returns 0 with
//  the label (at most label_size - 1 characters) and port, or -1 when it is not one.
int gw_proxy_parse_host (const char *host, const char *box_domain, char *label, size_t label_size,
                         int *port);

void gw_proxy_test (bool verbose);

#endif
