/*  gw_pages - see gw_pages.h */
#include "gw_pages.h"

#include <assert.h>

//  One stylesheet inline: the pages must work under a strict CSP with no other request.
static const char s_head[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
    "<title>%s</title><style>"
    "body{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;"
    "color:#222}h1{font-size:1.4rem}label{display:block;margin:.8rem 0 .2rem}"
    "input[type=email],input[type=password],input[type=text]{width:100%%;padding:.4rem;"
    "box-sizing:border-box}button{padding:.5rem 1.2rem;margin:1rem .5rem 0 0}"
    ".error{color:#a00}.muted{color:#666}table{border-collapse:collapse;width:100%%}"
    "td,th{text-align:left;padding:.3rem;border-bottom:1px solid #ddd}code{word-break:break-all}"
    "</style></head><body>\n";

char *gw_pages_escape (const char *text)
{
    if (!text)
        text = "";
    size_t size = 1;
    for (const char *p = text; *p; p++)
        size += *p == '&' ? 5 : *p == '<' || *p == '>' ? 4 : *p == '"' || *p == '\'' ? 6 : 1;
    char *out = malloc (size), *o = out;
    if (!out)
        return NULL;
    for (const char *p = text; *p; p++) {
        const char *rep = *p == '&'    ? "&amp;"
                          : *p == '<'  ? "&lt;"
                          : *p == '>'  ? "&gt;"
                          : *p == '"'  ? "&quot;"
                          : *p == '\'' ? "&#39;"
                                       : NULL;
        if (rep) {
            strcpy (o, rep);
            o += strlen (rep);
        } else
            *o++ = *p;
    }
    *o = 0;
    return out;
}

//  Writes text escaped.
static void s_put (FILE *out, const char *text)
{
    char *escaped = gw_pages_escape (text);
    if (escaped)
        fputs (escaped, out);
    free (escaped);
}

static void s_hidden (FILE *out, const gw_pages_field_t *hidden, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (!hidden[i].value)
            continue;
        fputs ("<input type=\"hidden\" name=\"", out);
        s_put (out, hidden[i].name);
        fputs ("\" value=\"", out);
        s_put (out, hidden[i].value);
        fputs ("\">\n", out);
    }
}

static FILE *s_open (char **page, size_t *size, const char *title)
{
    FILE *out = open_memstream (page, size);
    if (!out)
        return NULL;
    char *escaped = gw_pages_escape (title);
    fprintf (out, s_head, escaped ? escaped : "");
    free (escaped);
    return out;
}

static char *s_close (FILE *out, char **page)
{
    fputs ("</body></html>\n", out);
    if (fclose (out) != 0) {
        free (*page);
        return NULL;
    }
    return *page;
}

char *gw_pages_signin (const char *action, const gw_pages_field_t *hidden, size_t count,
                       const char *client_name, const char *error)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = s_open (&page, &size, "Sign in to sbx");
    if (!out)
        return NULL;
    fputs ("<h1>Sign in to sbx</h1>\n", out);
    if (client_name) {
        fputs ("<p>to connect <strong>", out);
        s_put (out, client_name);
        fputs ("</strong> to your account.</p>\n", out);
    }
    if (error) {
        fputs ("<p class=\"error\" role=\"alert\">", out);
        s_put (out, error);
        fputs ("</p>\n", out);
    }
    fputs ("<form method=\"post\" action=\"", out);
    s_put (out, action);
    fputs ("\">\n", out);
    s_hidden (out, hidden, count);
    fputs ("<label for=\"email\">Email</label>"
           "<input type=\"email\" id=\"email\" name=\"email\" autocomplete=\"username\" required>\n"
           "<label for=\"password\">Password</label>"
           "<input type=\"password\" id=\"password\" name=\"password\" "
           "autocomplete=\"current-password\" required>\n"
           "<button type=\"submit\" name=\"action\" value=\"signin\">Sign in</button>\n"
           "</form>\n",
           out);
    return s_close (out, &page);
}

char *gw_pages_consent (const char *action, const gw_pages_field_t *hidden, size_t count,
                        const char *client_name, const char *client_id, const char *redirect_host,
                        const char *email)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = s_open (&page, &size, "Allow access to sbx?");
    if (!out)
        return NULL;
    fputs ("<h1><strong>", out);
    s_put (out, client_name);
    fputs ("</strong> wants to use your sbx account</h1>\n<p>Signed in as <strong>", out);
    s_put (out, email);
    fputs ("</strong>.</p>\n<p>If you allow it, it can, through sbx's MCP tools:</p>\n<ul>"
           "<li>create, stop, resume and delete your sandboxes</li>"
           "<li>run commands and read and write files in them</li>"
           "<li>publish their ports at public URLs</li></ul>\n"
           "<p>Sandbox time it uses is billed to your account. It cannot see your password "
           "or your API keys. You can disconnect it at any time from your account page or "
           "with <code>sbx key revoke</code>.</p>\n<p class=\"muted\">Client: <code>",
           out);
    s_put (out, client_id);
    fputs ("</code><br>You will be sent back to <strong>", out);
    s_put (out, redirect_host);
    fputs ("</strong>.</p>\n<form method=\"post\" action=\"", out);
    s_put (out, action);
    fputs ("\">\n", out);
    s_hidden (out, hidden, count);
    fputs ("<button type=\"submit\" name=\"action\" value=\"allow\">Allow</button>"
           "<button type=\"submit\" name=\"action\" value=\"deny\">Deny</button>\n</form>\n",
           out);
    return s_close (out, &page);
}

char *gw_pages_error (const char *title, const char *message)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = s_open (&page, &size, title);
    if (!out)
        return NULL;
    fputs ("<h1>", out);
    s_put (out, title);
    fputs ("</h1>\n<p class=\"error\">", out);
    s_put (out, message);
    fputs ("</p>\n", out);
    return s_close (out, &page);
}

char *gw_pages_usage (const gw_pages_usage_t *usage)
{
    char *html = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&html, &size);
    if (!out)
        return NULL;
    fputs ("<h2>Usage and wallets</h2>\n", out);
    if (usage->unavailable) {
        fputs ("<p class=\"muted\">", out);
        s_put (out, usage->unavailable);
        fputs ("</p>\n", out);
    } else {
        fprintf (out, "<p id=\"usage-total\">Running time: %llu s, costing ",
                 (unsigned long long) usage->seconds);
        s_put (out, usage->cost);
        fputs (". Balance of the active wallet: <strong id=\"balance\">", out);
        s_put (out, usage->balance);
        fputs ("</strong>.</p>\n<table><tr><th>Wallet</th><th>Balance</th><th></th></tr>\n", out);
        for (size_t i = 0; i < usage->wallet_count; i++) {
            fputs ("<tr><td>", out);
            s_put (out, usage->wallets[i].name);
            fputs ("</td><td>", out);
            s_put (out, usage->wallets[i].balance);
            fprintf (out, "</td><td>%s</td></tr>\n",
                     usage->wallets[i].active ? "active: charges go here" : "");
        }
        fputs ("</table>\n", out);
        if (usage->day_count) {
            fputs ("<table><tr><th>Day (UTC)</th><th>Running time</th><th>Cost</th></tr>\n", out);
            //  The newest first, two weeks at most.
            for (size_t n = 0; n < usage->day_count && n < 14; n++) {
                const gw_pages_day_t *d = &usage->days[usage->day_count - 1 - n];
                fputs ("<tr><td>", out);
                s_put (out, d->day);
                fprintf (out, "</td><td>%llu s</td><td>", (unsigned long long) d->seconds);
                s_put (out, d->cost);
                fputs ("</td></tr>\n", out);
            }
            fputs ("</table>\n", out);
        }
    }
    if (fclose (out) != 0) {
        free (html);
        return NULL;
    }
    return html;
}

char *gw_pages_account (const char *csrf, const char *email, const char *usage_html,
                        const gw_pages_key_t *keys, size_t count, const char *new_key,
                        const char *notice)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = s_open (&page, &size, "Your sbx account");
    if (!out)
        return NULL;
    fputs ("<h1>Your sbx account</h1>\n<p>Signed in as <strong>", out);
    s_put (out, email);
    fputs ("</strong>.</p>\n", out);
    if (notice) {
        fputs ("<p role=\"status\">", out);
        s_put (out, notice);
        fputs ("</p>\n", out);
    }
    if (new_key) {
        fputs ("<p>Your new API key (shown only now, copy it): <code id=\"new-key\">", out);
        s_put (out, new_key);
        fputs ("</code></p>\n", out);
    }
    if (usage_html)
        fputs (usage_html, out);
    fputs ("<h2>API keys and connections</h2>\n<table><tr><th>Name</th><th>Kind</th>"
           "<th>Created</th><th>Last used</th><th></th></tr>\n",
           out);
    for (size_t i = 0; i < count; i++) {
        const gw_pages_key_t *k = &keys[i];
        bool connection = k->kind && streq (k->kind, "connection");
        fputs ("<tr><td>", out);
        s_put (out, k->name && *k->name ? k->name : k->key_id);
        fputs (" <span class=\"muted\"><code>", out);
        s_put (out, k->key_id);
        if (k->prefix) {
            fputs (" ", out);
            s_put (out, k->prefix);
            fputs ("…", out);
        }
        fputs ("</code></span></td><td>", out);
        s_put (out, connection ? "connection" : k->preset ? k->preset : "api key");
        fputs ("</td><td>", out);
        s_put (out, k->created);
        fputs ("</td><td>", out);
        s_put (out, k->last_used);
        fputs ("</td><td>", out);
        if (k->revoked)
            fputs (connection ? "disconnected" : "revoked", out);
        else {
            fputs ("<form method=\"post\" action=\"/account\">"
                   "<input type=\"hidden\" name=\"csrf\" value=\"",
                   out);
            s_put (out, csrf);
            fputs ("\"><input type=\"hidden\" name=\"key_id\" value=\"", out);
            s_put (out, k->key_id);
            fprintf (out,
                     "\"><button type=\"submit\" name=\"action\" value=\"revoke\">%s</button>"
                     "</form>",
                     connection ? "Disconnect" : "Revoke");
        }
        fputs ("</td></tr>\n", out);
    }
    fputs ("</table>\n<h2>Create an API key</h2>\n"
           "<form method=\"post\" action=\"/account\"><input type=\"hidden\" name=\"csrf\" "
           "value=\"",
           out);
    s_put (out, csrf);
    fputs ("\"><label for=\"name\">Name</label><input type=\"text\" id=\"name\" name=\"name\" "
           "maxlength=\"100\">\n<label for=\"preset\">What it may do</label>"
           "<select id=\"preset\" name=\"preset\"><option value=\"full\">full</option>"
           "<option value=\"ci\">ci</option><option value=\"read-only\">read-only</option>"
           "<option value=\"no-delete\">no-delete</option></select>\n"
           "<button type=\"submit\" name=\"action\" value=\"create\">Create key</button></form>\n"
           "<form method=\"post\" action=\"/account\"><input type=\"hidden\" name=\"csrf\" "
           "value=\"",
           out);
    s_put (out, csrf);
    fputs ("\"><button type=\"submit\" name=\"action\" value=\"signout\">Sign out</button>"
           "</form>\n",
           out);
    return s_close (out, &page);
}

void gw_pages_respond (gw_request_t *req, int status, char *page)
{
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_add_header (req, "X-Frame-Options", "DENY");
    //  same-origin, not no-referrer: under no-referrer browsers send "Origin: null" with
    //  our own forms, and the forms' Origin check (gw_session_origin_ok) needs the real
    //  one. Other sites still get no referrer (the authorization request stays ours).
    gw_request_add_header (req, "Referrer-Policy", "same-origin");
    //  No form-action: browsers apply it to the redirect after the consent form, which
    //  goes to the client's own redirect URI.
    gw_request_add_header (req, "Content-Security-Policy",
                           "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'");
    if (page)
        gw_request_respond (req, status, "text/html; charset=utf-8", page, strlen (page));
    else
        gw_request_respond (req, 500, "text/plain", "out of memory", 13);
    free (page);
}

void gw_pages_respond_error (gw_request_t *req, int status, const char *title, const char *message)
{
    gw_pages_respond (req, status, gw_pages_error (title, message));
}

void gw_pages_respond_foreign (gw_request_t *req, const char *why)
{
    char text[600];
    snprintf (text, sizeof text,
              "This form was refused (permission_denied): %s. Only this site's own pages may "
              "sign in, allow an app or change your account. If you did not mean to do "
              "this, another site tried to act for you: nothing was changed.",
              why);
    gw_pages_respond_error (req, 403, "Refused: sent from another site", text);
}

void gw_pages_test (bool verbose)
{
    (void) verbose;
    char *escaped = gw_pages_escape ("<a href=\"x\">'&'</a>");
    assert (streq (escaped, "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"));
    free (escaped);
    gw_pages_field_t hidden[] = {{"state", "\"><script>"}, {"skip", NULL}};
    char *page = gw_pages_signin ("/oauth/authorize", hidden, 2, "Evil <b>", "wrong");
    assert (page);
    assert (strstr (page, "value=\"&quot;&gt;&lt;script&gt;\""));
    assert (strstr (page, "Evil &lt;b&gt;"));
    assert (!strstr (page, "<script>"));
    assert (!strstr (page, "name=\"skip\""));
    free (page);
    page = gw_pages_consent ("/oauth/authorize", hidden, 1, "Claude", "cli_x", "claude.ai",
                             "a@example.com");
    assert (strstr (page, "value=\"allow\"") && strstr (page, "value=\"deny\""));
    free (page);
    gw_pages_key_t keys[] = {{"key_1", "connection", "Claude (MCP)", "full", NULL, "c", "u", false},
                             {"key_2", "api_key", "ci", "ci", "sbx_abcd", "c", "", true}};
    gw_pages_wallet_t wallets[] = {{"main", "$0.000000", false}, {"<team>", "$4.990000", true}};
    gw_pages_day_t days[] = {{"2026-11-29", 10, "$0.000100"}, {"2026-11-30", 20, "$0.000200"}};
    gw_pages_usage_t usage = {.seconds = 30,
                              .cost = "$0.000300",
                              .balance = "$4.990000",
                              .wallets = wallets,
                              .wallet_count = 2,
                              .days = days,
                              .day_count = 2};
    char *fragment = gw_pages_usage (&usage);
    assert (strstr (fragment, "Running time: 30 s, costing $0.000300"));
    assert (strstr (fragment, "&lt;team&gt;") && strstr (fragment, "active: charges go here"));
    assert (strstr (fragment, "2026-11-30") < strstr (fragment, "2026-11-29")); //  newest first
    page = gw_pages_account ("tok", "a@example.com", fragment, keys, 2, "sbx_new", NULL);
    assert (strstr (page, "Disconnect") && strstr (page, "revoked") && strstr (page, "sbx_new"));
    assert (strstr (page, "<strong id=\"balance\">$4.990000</strong>"));
    free (page);
    free (fragment);
    fragment = gw_pages_usage (&(gw_pages_usage_t){.unavailable = "Billing is down <now>."});
    assert (strstr (fragment, "Billing is down &lt;now&gt;.") && !strstr (fragment, "balance"));
    free (fragment);
}
