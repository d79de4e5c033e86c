/*  gw_auth - who is calling: Bearer API keys checked with the broker, and the 401.

    `Authorization: Bearer sbx_…` is checked with the broker's auth.key, from the loop,
    never blocking. Answers are cached by the key's SHA-256 for a few seconds (and never
    past the key's expiry), so a busy MCP session costs the broker one lookup per few
    seconds. Refusals are not cached. Keys never reach the logs: only their hash is
    kept, and only in memory.
    Revocation is at once: one gw_auth serves every front end of a gateway, a front end
    that revoked a key (or an OAuth token) forgets it before it answers, and the broker's
    tap (key.revoked, oauth.revoked) makes every other gateway forget it within the
    tap's delivery time. A disabled or deleted account (account.disabled,
    account.deleted) makes it forget every credential of that account the same way, and
    the broker refuses them from then on ("account disabled: …", which the MCP 401 says).
    The cache answers only while the tap reader is caught up and
    the broker is the one it follows; otherwise every credential is asked again.
    OAuth access tokens (sbx_at_…) are checked the same way (the broker answers auth.key
    for them too) with the caller's kind oauth; they are accepted only when bound to this
    gateway's MCP resource (<base>/mcp), and cached for one second at most. Callers decide
    where OAuth callers may go (/mcp only).
    Each key is held to its plan's request rate here, at this gateway's share of it, so
    that N gateways behind a balancer allow the plan together (gw_auth_take, gw_rates).
*/
#ifndef GW_AUTH_H_INCLUDED
#define GW_AUTH_H_INCLUDED

#include "gw_http.h"
#include "gw_rates.h"
#include "sbx_common.h"

typedef struct gw_auth_t gw_auth_t;

//  The result of a check: caller (borrowed for the call; sbx_caller_dup to keep it) is
//  the identity to put on broker requests, or NULL when the key was refused (code is
//  then unauthenticated, or unavailable/timeout when the broker could not say).
typedef void (gw_auth_fn) (const sbx_caller_t *caller, sbx_code_t code, const char *message,
                           void *arg);

//  config and peer are borrowed. The public base URL (for the 401) is built from the
//  listen, domain and tls settings, like `sbx status` does.
gw_auth_t *gw_auth_new (sbx_config_t *config, sbx_peer_t *peer);

//  Forgets pending checks (their callbacks are not called) and the cache.
void gw_auth_destroy (gw_auth_t **self_p);

//  Starts following the broker's tap for revocations and reporting key rates (with no
//  peer: nothing to follow, nothing to report).
int gw_auth_start (gw_auth_t *self, zloop_t *loop);
//  Forgets every cached answer for this key (an OAuth connection's tokens included), and
//  keeps none of the answers in flight now: the next request with it asks the broker.
//  Called when this gateway revoked it, and for key.revoked / oauth.revoked from the tap.
void gw_auth_forget_key (gw_auth_t *self, const char *key_id);
//  The same for every credential of an account (account.disabled, account.deleted).
void gw_auth_forget_account (gw_auth_t *self, const char *account_id);

//  Whether a refusal's message is about the account rather than the credential (the
//  broker's "account disabled: …"): worth showing to the caller, who can do something.
bool gw_auth_account_refusal (const char *message);
//  The public base URL: "https://DOMAIN[:PORT]" (no trailing slash).
const char *gw_auth_base_url (gw_auth_t *self);

//  The bearer token of an Authorization header value ("Bearer X", scheme matched
//  case-insensitively), or NULL when there is none. Returns a pointer into header.
const char *gw_auth_bearer (const char *header);

//  Checks token and calls fn once with the result: at once when the answer is cached
//  or the token can't be a key, else when the broker answers. After destroy, fn is
//  never called.
void gw_auth_check (gw_auth_t *self, const char *token, gw_auth_fn *fn, void *arg);

//  Answers req with 401, the WWW-Authenticate header pointing at the protected
//  resource metadata, and a JSON-RPC error body (code -32001) saying how to sign in.
void gw_auth_respond_401 (gw_auth_t *self, gw_request_t *req);
//  The same, saying why in the body when the refusal's message is an account refusal
//  (gw_auth_account_refusal); else exactly gw_auth_respond_401's.
void gw_auth_respond_refused (gw_auth_t *self, gw_request_t *req, const char *message);

//  A key's request budget (IETF RateLimit fields; gw_rates.h).
typedef gw_rates_limit_t gw_auth_limit_t;

//  Spends one request of the caller's key budget (its plan's requests_per_second, as
//  auth.key said, at this gateway's share of it: gw_rates.h). Returns 0 when the
//  request may go, -1 when the key is over its rate; limit is filled either way (limit
//  0: no rate for this key). Never waits for the broker.
int gw_auth_take (gw_auth_t *self, const sbx_caller_t *caller, gw_auth_limit_t *limit);

//  For /healthz: gw_rates_counts of the gateway's one rate keeper.
void gw_auth_rate_counts (gw_auth_t *self, uint64_t *gateways, uint64_t *keys, uint64_t *shared);

//  Adds RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset and Retry-After.
void gw_auth_rate_headers (gw_request_t *req, const gw_auth_limit_t *limit);

//  Deep copy of a caller, or NULL.
sbx_caller_t *gw_auth_caller_dup (const sbx_caller_t *caller);
void gw_auth_caller_destroy (sbx_caller_t **caller_p);

void gw_auth_test (bool verbose);

#endif
