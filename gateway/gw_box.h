/*  gw_box - the page at a sandbox's own URL, https://<label>.<box_domain>/ (the "url"
    every create answers with), when port 80 is not published publicly there (then the
    port proxy serves the guest's port 80 at that URL, gw_proxy).

    Never a bare 404: its owner sees the sandbox (state, type) and its published ports
    with their URLs; anyone else a short page saying what this address is and how its
    owner sees more, and nothing else (not even whether such a sandbox exists).

    The owner is recognised without the account's session cookie, which never reaches a
    sandbox's host (it is a __Host- cookie of the gateway's own name; a cookie on the
    parent domain would go to every sandbox's HTTP server through the proxy):
      ?sbx_owner=TOKEN   the link the console gives its owner (gw_session_owner_token:
                         signed, for this label and account, an hour)
      Authorization: Bearer <API key>   as private ports take it (curl, agents)
    Either is then asked for the account's sandboxes as REST's list_sandboxes would
    (gw_ops), and the one with this label is shown. */
#ifndef GW_BOX_H_INCLUDED
#define GW_BOX_H_INCLUDED

#include "gw_ctx.h"
#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_box_t gw_box_t;

//  With the gateway's shared services (ctx, borrowed: it outlives this).
gw_box_t *gw_box_new (gw_ctx_t *ctx);
//  Forgets the pages in flight (their requests are the server's to end).
void gw_box_destroy (gw_box_t **self_p);

//  Splits a lower-case host "<label>.<box_domain>" (no :port): 0 with the label (at most
//  label_size - 1 characters of [a-z0-9-]), or -1 when it is not one.
int gw_box_parse_host (const char *host, const char *box_domain, char *label, size_t label_size);

//  Whether req asks for its owner's page (?sbx_owner=): then the page answers even where
//  port 80 is public, and the token never reaches the guest.
bool gw_box_wants_owner (gw_request_t *req);

//  Answers req (held by the caller until now; no closed callback set) with the page for
//  the sandbox labelled label.
void gw_box_serve (gw_box_t *self, gw_request_t *req, const char *label);

//  The page, fresh (NULL when out of memory): sandbox (a list_sandboxes item) for its
//  owner, or NULL for anyone else, with a note (NULL: none) saying why not the owner's.
char *gw_box_page (const char *label, const char *box_url, const char *console_url,
                   const json_t *sandbox, const char *note);

void gw_box_test (bool verbose);

#endif
