/*  gw_pages - the HTML pages people see: sign-in, consent, errors, the account page.

    Plain HTML forms that work without JavaScript; every value is escaped. Each function
    returns a page the caller frees (NULL when out of memory). Forms POST back to the
    page's own path with the CSRF token as a hidden field; the fields that carry an
    authorization request through sign-in and consent are passed as `hidden`. */
#ifndef GW_PAGES_H_INCLUDED
#define GW_PAGES_H_INCLUDED

#include "gw_http.h"
#include "sbx_common.h"

typedef struct {
    const char *name;
    const char *value; //  NULL: the field is left out
} gw_pages_field_t;

//  "Sign in to sbx" (to connect `client_name` when it is not NULL), with an error line.
char *gw_pages_signin (const char *action, const gw_pages_field_t *hidden, size_t count,
                       const char *client_name, const char *error);

//  "<client> wants to use your sbx account": what it may do, where it sends you back,
//  Allow and Deny (action=allow|deny).
char *gw_pages_consent (const char *action, const gw_pages_field_t *hidden, size_t count,
                        const char *client_name, const char *client_id, const char *redirect_host,
                        const char *email);

//  An error page with a title and a sentence saying what to do.
char *gw_pages_error (const char *title, const char *message);

//  One row of the account page's list.
typedef struct {
    const char *key_id;
    const char *kind; //  "api_key" or "connection"
    const char *name;
    const char *preset;
    const char *prefix;
    const char *created; //  "2026-11-30 04:00 UTC"
    const char *last_used;
    bool revoked;
} gw_pages_key_t;

//  Billing's figures for the account page (money already formatted, "$0.000120").
typedef struct {
    const char *name;
    const char *balance;
    bool active;
} gw_pages_wallet_t;

typedef struct {
    const char *day; //  "2026-11-30"
    uint64_t seconds;
    const char *cost;
} gw_pages_day_t;

typedef struct {
    const char *unavailable; //  non-NULL: why there are no figures (the rest is ignored)
    uint64_t seconds;
    const char *cost;
    const char *balance; //  the active wallet's
    const gw_pages_wallet_t *wallets;
    size_t wallet_count;
    const gw_pages_day_t *days; //  oldest first
    size_t day_count;
} gw_pages_usage_t;

//  The "Usage and wallets" part of the account page, as an HTML fragment.
char *gw_pages_usage (const gw_pages_usage_t *usage);

//  The account page: usage (a gw_pages_usage fragment, or NULL), API keys and
//  connections with Revoke/Disconnect buttons, a form to create a key, and new_key
//  (shown once) when one was just made.
char *gw_pages_account (const char *csrf, const char *email, const char *usage_html,
                        const gw_pages_key_t *keys, size_t count, const char *new_key,
                        const char *notice);

//  Answers req with page (taken; NULL, out of memory, answers 500) and the headers every
//  page wants: not cached, not framed, no referrer to other sites, a CSP allowing the
//  inline style only.
void gw_pages_respond (gw_request_t *req, int status, char *page);

//  Answers req with an error page (gw_pages_error), as gw_pages_respond.
void gw_pages_respond_error (gw_request_t *req, int status, const char *title, const char *message);

//  The 403 page for a form POSTed from another origin (why: gw_session_origin_ok's).
void gw_pages_respond_foreign (gw_request_t *req, const char *why);

//  Escapes & < > " ' for HTML text and attribute values. Caller frees.
char *gw_pages_escape (const char *text);

void gw_pages_test (bool verbose);

#endif
