/*  gw_session - browser sessions for the sign-in, consent and account pages: signed
    cookies, CSRF tokens, and form parsing.

    A secret made at first run in DIR/gateway/secret (mode 0600, shared by the gateways
    of a host) signs two cookies with sbx_secret_mac (HMAC-SHA-512-256):
      __Host-sbx_session  account id, expiry and email, signed: who signed in (12 hours)
      __Host-sbx_csrf     a random value; forms carry MAC("csrf:" + value + ":" + the
                          signed-in account id, or the sign-in form's mark) as their csrf
                          field: a token is good only in the browser it was made for and
                          only for the person it was made for, so a cookie and token pair
                          planted from elsewhere (another person's) is useless
    Both are HttpOnly, SameSite=Lax, Path=/, Secure, and __Host- cookies: the browser
    refuses them from any other host, so a sandbox's port URL on a sibling name cannot
    set or shadow them (docs/oauth.md, "Sandboxes and the sign-in pages"). State-changing
    POSTs also check Origin (gw_session_origin_ok). Nothing is kept in memory: any
    gateway of the host can check them. */
#ifndef GW_SESSION_H_INCLUDED
#define GW_SESSION_H_INCLUDED

#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_session_t gw_session_t;

//  Loads (or makes) the secret. NULL when it can be neither read nor written.
gw_session_t *gw_session_new (sbx_config_t *config);
void gw_session_destroy (gw_session_t **self_p);

//  application/x-www-form-urlencoded (a query string or a POST body) as a hash of
//  name → decoded value; the first of repeated names wins. NULL when text is not valid
//  (bad escapes, NUL bytes). Destroy with zhashx_destroy.
zhashx_t *gw_session_form (const char *text);

//  The value of a cookie of the request, fresh, or NULL.
char *gw_session_cookie (gw_request_t *req, const char *name);

//  The signed-in account: 0 with *account_id and *email (fresh) set, or -1.
int gw_session_account (gw_session_t *self, gw_request_t *req, char **account_id, char **email);

//  Adds the Set-Cookie header that signs account in (or, with NULL, out).
void gw_session_sign_in (gw_session_t *self, gw_request_t *req, const char *account_id,
                         const char *email);

//  The CSRF token to put in this request's forms (fresh), for account_id (the account
//  the page is shown to) or, with NULL, for a sign-in form. Sets the __Host-sbx_csrf
//  cookie on the response when the browser has none yet.
char *gw_session_csrf (gw_session_t *self, gw_request_t *req, const char *account_id);

//  True when token matches the request's __Host-sbx_csrf cookie and account_id (the
//  signed-in account the form acts for; NULL: a sign-in form).
bool gw_session_csrf_ok (gw_session_t *self, gw_request_t *req, const char *account_id,
                         const char *token);

//  Whether a state-changing request may come from where it says it comes from: true
//  when its Origin is the gateway's own (scheme://domain[:port] as sbx_urls_base says),
//  or, without Origin, when Sec-Fetch-Site is same-origin or none, or when it sends
//  neither (a client that is not a browser). Origin: null, a sandbox's host and any
//  other site are refused, with why (for the 403 page) in why.
bool gw_session_origin_ok (gw_session_t *self, gw_request_t *req, char *why, size_t why_size);

//  A sandbox's owner link: the token (fresh) that shows account_id the owner's page of
//  the sandbox labelled label at its URL (https://<label>.<box_domain>/?sbx_owner=TOKEN,
//  gw_box). ACCOUNT.EXPIRY.MAC, good for an hour and for that label only. The box host
//  never sees the session cookie (it is host-only on the gateway's name), so the
//  console hands the owner this instead.
char *gw_session_owner_token (gw_session_t *self, const char *label, const char *account_id);

//  The account (fresh) that token was made for with label, while it is good; else NULL.
char *gw_session_owner_check (gw_session_t *self, const char *label, const char *token);

void gw_session_test (bool verbose);

#endif
