/*  gw_console - the account console, /account's page for a signed-in person: their
    sandboxes (state, type, URL, CPU and memory sparklines of their last 5 minutes'
    samples, running time, cost so far; Stop, Resume, Delete), their
    snapshots (Delete), usage over the last 14 and 30 days (gw_chart) with the wallets,
    API keys and OAuth connections (Create, Revoke, Disconnect; a new key shown once
    with a Copy button), and "Connect": copy-ready snippets for Claude, ChatGPT, Claude
    Code, Cursor and the Python and TypeScript SDKs, filled with this service's URL.

    Server-rendered HTML whose every value is escaped; its buttons are plain forms that
    POST back to /account with the CSRF token (gw_account runs them), so the page works
    without JavaScript. console.js (embedded, served from this origin at
    /account/console.js under a CSP that allows no other script) only adds the Copy
    buttons (navigator.clipboard) and a confirmation before deletes. */
#ifndef GW_CONSOLE_H_INCLUDED
#define GW_CONSOLE_H_INCLUDED

#include <jansson.h>

#include "gw_chart.h"
#include "sbx_common.h"

//  One row of the keys and connections list.
typedef struct {
    const char *key_id;
    const char *kind; //  "api_key" or "connection"
    const char *name;
    const char *preset;
    const char *prefix;
    const char *created; //  "2026-11-30 04:00 UTC"
    const char *last_used;
    bool revoked;
} gw_console_key_t;

//  Billing's figures (money already formatted, "$0.000120").
typedef struct {
    const char *name;
    const char *balance;
    bool active;
} gw_console_wallet_t;

typedef struct {
    const char *unavailable; //  non-NULL: why there are no figures (the rest is ignored)
    uint64_t seconds;
    const char *cost;
    const char *balance; //  the active wallet's
    const gw_console_wallet_t *wallets;
    size_t wallet_count;
    const gw_chart_day_t *days; //  per UTC day with running time
    size_t day_count;
} gw_console_usage_t;

//  What the page shows; every pointer is borrowed. A list that could not be had is NULL
//  with its _error saying why (the rest of the page still shows).
typedef struct {
    const char *csrf;
    const char *email;
    const char *base_url; //  where clients reach this service: "https://sbx.example.com"
    const char *today;    //  "2026-11-30" (UTC): the charts' last day
    const gw_console_usage_t *usage;
    //  list_sandboxes' items; "ownerUrl": where the URL links, "metrics": the ready ones'
    //  get_sandbox_metrics answers (absent: no sparkline)
    const json_t *sandboxes;
    bool sandboxes_more; //  its first page only: there are more (nextCursor)
    const char *sandboxes_error;
    const json_t *snapshots; //  list_snapshots' items
    const char *snapshots_error;
    const gw_console_key_t *keys;
    size_t key_count;
    const char *keys_error;
    const char *new_key; //  just created: shown once
    const char *notice;  //  what the last action did
} gw_console_page_t;

//  The page (fresh; NULL when out of memory).
char *gw_console_page (const gw_console_page_t *page);

//  console.js, embedded from gateway/console.js.
extern const char gw_console_js[];
extern const size_t gw_console_js_size;

void gw_console_test (bool verbose);

#endif
