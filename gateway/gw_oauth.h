/*  gw_oauth - the OAuth 2.1 authorization server's HTTP endpoints (docs/oauth.md).

    What Claude's and ChatGPT's connectors walk after the 401 from /mcp:
      GET  /.well-known/oauth-protected-resource[/mcp]  RFC 9728: the resource (<base>/mcp)
                                                        and its authorization server
      GET  /.well-known/oauth-authorization-server      RFC 8414: endpoints and methods
      POST /oauth/register   RFC 7591 dynamic registration of public clients
      GET  /oauth/authorize  the sign-in page, or the consent page when signed in
      POST /oauth/authorize  the forms: action=signin (email, password), allow, deny
      POST /oauth/token      authorization_code with PKCE, refresh_token (rotated)
      POST /oauth/revoke     RFC 7009
    A client_id that is an https URL is a client ID metadata document: fetched (gw_fetch,
    off the loop), checked (its client_id must be its URL), cached 10 minutes; only its
    redirect_uris are accepted. Sign-in is gw_signin's (passwords verified off the loop). The
    state lives in the broker (oauth.* messages, broker/brk_oauth.c); the issuer, the
    resource and the 401's resource_metadata all derive from gw_auth_base_url's rule
    (sbx_urls_base), so they agree byte for byte.
*/
#ifndef GW_OAUTH_H_INCLUDED
#define GW_OAUTH_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "gw_verify.h"
#include "sbx_common.h"

typedef struct gw_oauth_t gw_oauth_t;

//  Serves the OAuth endpoints and metadata with the gateway's shared services (ctx,
//  borrowed: it outlives this) and registers their routes.
gw_oauth_t *gw_oauth_new (gw_ctx_t *ctx);

//  Cancels what is in flight (their requests are the HTTP server's to close).
void gw_oauth_destroy (gw_oauth_t **self_p);

//  Serves req when its path is one of the above, and returns true; else false.
bool gw_oauth_handle (gw_oauth_t *self, gw_request_t *req);

//  Client ID metadata documents, as s_authorize and the fetch callback check them
//  (public for fuzz/fuzz_cimd.c, which runs the same code on hostile input).
//  True when a client_id may be a metadata document's URL: https with a path, without
//  fragment or credentials, printable ASCII, at most 2000 characters, with a host and
//  port sbx_urls_redirect_check accepts.
bool gw_oauth_client_url_ok (const char *url);

//  The client a document fetched from url describes, or NULL with the reason in why:
//  a JSON object whose client_id is url, 1 to 10 redirect_uris that pass
//  sbx_urls_redirect_check, an optional one-line client_name (else url's host).
typedef struct gw_oauth_client_t gw_oauth_client_t;
gw_oauth_client_t *gw_oauth_client_parse (const char *url, const char *body, size_t size, char *why,
                                          size_t why_size);
void gw_oauth_client_destroy (gw_oauth_client_t **client_p);
//  The name the consent page shows.
const char *gw_oauth_client_name (const gw_oauth_client_t *client);

void gw_oauth_test (bool verbose);

#endif
