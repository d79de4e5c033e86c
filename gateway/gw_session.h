/*  gw_session - browser sessions for the sign-in, consent and account pages: signed
    cookies, CSRF tokens, and form parsing.

    A secret made at first run in DIR/gateway/secret (mode 0600, shared by the gateways
    of a host) signs two cookies with sbx_secret_mac (HMAC-SHA-512-256):
      sbx_session  account id, expiry and email, signed: who signed in (12 hours)
      sbx_csrf     a random value; forms carry MAC("csrf:" + value) as their csrf field,
                   so a POST from another site, which cannot read our cookie or page,
                   cannot carry a matching token (double-submit, bound by the MAC)
    Both are HttpOnly, SameSite=Lax, Path=/ and Secure over HTTPS. Nothing is kept in
    memory: any gateway of the host can check them. */
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

//  The CSRF token to put in this request's forms (fresh). Sets the sbx_csrf cookie on
//  the response when the browser has none yet.
char *gw_session_csrf (gw_session_t *self, gw_request_t *req);

//  True when token matches the request's sbx_csrf cookie.
bool gw_session_csrf_ok (gw_session_t *self, gw_request_t *req, const char *token);

void gw_session_test (bool verbose);

#endif
