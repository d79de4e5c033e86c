/*  gw_account - the account web page, /account: sign in with email and password, list,
    create and revoke API keys, list and disconnect OAuth connections, sign out.

    Plain HTML forms (gw_pages) behind a signed session cookie and CSRF tokens
    (gw_session), as on the OAuth sign-in page; signing in is gw_signin's (passwords
    verified off the loop). Requests go to the broker as the signed-in account (caller kind
   session), so the broker applies the same rules as for the CLI: an account acts on its own keys.
    Changes answer with a redirect back to the page (POST, redirect, GET), except key
    creation, whose page shows the new key once. */
#ifndef GW_ACCOUNT_H_INCLUDED
#define GW_ACCOUNT_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_account_t gw_account_t;

//  Serves /account with the gateway's shared services (ctx, borrowed: it outlives this;
//  its sign-in cookies, broker client and password checker) and registers the route.
gw_account_t *gw_account_new (gw_ctx_t *ctx);
void gw_account_destroy (gw_account_t **self_p);

//  Serves /account (GET, POST) and returns true; false for any other path.
bool gw_account_handle (gw_account_t *self, gw_request_t *req);

void gw_account_test (bool verbose);

#endif
