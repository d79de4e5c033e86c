/*  gw_pages - the HTML pages people see: sign-in, consent, errors, and the pieces every
    page is made of (the head and its stylesheet, escaping, the answer's headers); the
    account console is gw_console's, the sandbox URL page gw_box's.

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

//  "Sign in to sbx" (to connect `client_name` when it is not NULL), with an error line
//  and the email field filled with email (NULL: empty), as after a failed attempt.
char *gw_pages_signin (const char *action, const gw_pages_field_t *hidden, size_t count,
                       const char *client_name, const char *email, const char *error);

//  "<client> wants to use your sbx account": what it may do, where it sends you back,
//  Allow and Deny (action=allow|deny).
char *gw_pages_consent (const char *action, const gw_pages_field_t *hidden, size_t count,
                        const char *client_name, const char *client_id, const char *redirect_host,
                        const char *email);

//  An error page with a title and a sentence saying what to do.
char *gw_pages_error (const char *title, const char *message);

//  A page under construction: the head with title (escaped) written to a memory stream
//  over *page; gw_pages_close ends it and returns the page (NULL, freed, on failure).
FILE *gw_pages_open (char **page, size_t *size, const char *title);
char *gw_pages_close (FILE *out, char **page);

//  Writes text (NULL: nothing) HTML-escaped.
void gw_pages_put (FILE *out, const char *text);

//  Answers req with page (taken; NULL, out of memory, answers 500) and the headers every
//  page wants: not cached, not framed, no referrer to other sites, a CSP allowing the
//  inline style only.
void gw_pages_respond (gw_request_t *req, int status, char *page);

//  As gw_pages_respond, the CSP also allowing scripts from this origin (not inline ones):
//  the console's /account/console.js.
void gw_pages_respond_script (gw_request_t *req, int status, char *page);

//  Answers req with an error page (gw_pages_error), as gw_pages_respond.
void gw_pages_respond_error (gw_request_t *req, int status, const char *title, const char *message);

//  The 403 page for a form POSTed from another origin (why: gw_session_origin_ok's).
void gw_pages_respond_foreign (gw_request_t *req, const char *why);

//  Escapes & < > " ' for HTML text and attribute values. Caller frees.
char *gw_pages_escape (const char *text);

void gw_pages_test (bool verbose);

#endif
