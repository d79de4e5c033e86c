/*  gw_account - /account, the account console: sign in with email and password; then
    the person's sandboxes (Stop, Resume, Delete), snapshots (Delete), usage, API keys
    (Create, shown once; Revoke) and OAuth connections (Disconnect), and how to connect
    clients (the page is gw_console's); sign out. /account/console.js is its script.

    Plain HTML forms behind a signed session cookie and CSRF tokens (gw_session), as on
    the OAuth sign-in page; signing in is gw_signin's (passwords verified off the loop;
    a failed attempt shows the form again with the email kept). Requests go to the
    broker as the signed-in account (caller kind session), and sandbox and snapshot
    actions run as the REST operations (gw_ops) for it, so the broker applies the same
    rules as for an API key of that account. Changes answer with a redirect back to the
    page (POST, redirect, GET), except key creation, whose page shows the new key once.
    Each sandbox's URL links to its owner page (gw_box) with an owner token
    (gw_session_owner_token): the session cookie never goes to a sandbox's host. */
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
