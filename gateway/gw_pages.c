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

void gw_pages_put (FILE *out, const char *text)
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
        gw_pages_put (out, hidden[i].name);
        fputs ("\" value=\"", out);
        gw_pages_put (out, hidden[i].value);
        fputs ("\">\n", out);
    }
}

FILE *gw_pages_open (char **page, size_t *size, const char *title)
{
    FILE *out = open_memstream (page, size);
    if (!out)
        return NULL;
    char *escaped = gw_pages_escape (title);
    fprintf (out, s_head, escaped ? escaped : "");
    free (escaped);
    return out;
}

char *gw_pages_close (FILE *out, char **page)
{
    fputs ("</body></html>\n", out);
    if (fclose (out) != 0) {
        free (*page);
        return NULL;
    }
    return *page;
}

char *gw_pages_signin (const char *action, const gw_pages_field_t *hidden, size_t count,
                       const char *client_name, const char *email, const char *error)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = gw_pages_open (&page, &size, "Sign in to sbx");
    if (!out)
        return NULL;
    fputs ("<h1>Sign in to sbx</h1>\n", out);
    if (client_name) {
        fputs ("<p>to connect <strong>", out);
        gw_pages_put (out, client_name);
        fputs ("</strong> to your account.</p>\n", out);
    }
    if (error) {
        fputs ("<p class=\"error\" role=\"alert\">", out);
        gw_pages_put (out, error);
        fputs ("</p>\n", out);
    }
    fputs ("<form method=\"post\" action=\"", out);
    gw_pages_put (out, action);
    fputs ("\">\n", out);
    s_hidden (out, hidden, count);
    //  A failed sign-in keeps the email typed (escaped like every value).
    fputs ("<label for=\"email\">Email</label>"
           "<input type=\"email\" id=\"email\" name=\"email\" autocomplete=\"username\" "
           "required value=\"",
           out);
    gw_pages_put (out, email);
    fputs ("\">\n<label for=\"password\">Password</label>"
           "<input type=\"password\" id=\"password\" name=\"password\" "
           "autocomplete=\"current-password\" required>\n"
           "<button type=\"submit\" name=\"action\" value=\"signin\">Sign in</button>\n"
           "</form>\n",
           out);
    return gw_pages_close (out, &page);
}

char *gw_pages_consent (const char *action, const gw_pages_field_t *hidden, size_t count,
                        const char *client_name, const char *client_id, const char *redirect_host,
                        const char *email)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = gw_pages_open (&page, &size, "Allow access to sbx?");
    if (!out)
        return NULL;
    fputs ("<h1><strong>", out);
    gw_pages_put (out, client_name);
    fputs ("</strong> wants to use your sbx account</h1>\n<p>Signed in as <strong>", out);
    gw_pages_put (out, email);
    fputs ("</strong>.</p>\n<p>If you allow it, it can, through sbx's MCP tools:</p>\n<ul>"
           "<li>create, stop, resume and delete your sandboxes</li>"
           "<li>run commands and read and write files in them</li>"
           "<li>publish their ports at public URLs</li></ul>\n"
           "<p>Sandbox time it uses is billed to your account. It cannot see your password "
           "or your API keys. You can disconnect it at any time from your account page or "
           "with <code>sbx key revoke</code>.</p>\n<p class=\"muted\">Client: <code>",
           out);
    gw_pages_put (out, client_id);
    fputs ("</code><br>You will be sent back to <strong>", out);
    gw_pages_put (out, redirect_host);
    fputs ("</strong>.</p>\n<form method=\"post\" action=\"", out);
    gw_pages_put (out, action);
    fputs ("\">\n", out);
    s_hidden (out, hidden, count);
    fputs ("<button type=\"submit\" name=\"action\" value=\"allow\">Allow</button>"
           "<button type=\"submit\" name=\"action\" value=\"deny\">Deny</button>\n</form>\n",
           out);
    return gw_pages_close (out, &page);
}

char *gw_pages_error (const char *title, const char *message)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = gw_pages_open (&page, &size, title);
    if (!out)
        return NULL;
    fputs ("<h1>", out);
    gw_pages_put (out, title);
    fputs ("</h1>\n<p class=\"error\">", out);
    gw_pages_put (out, message);
    fputs ("</p>\n", out);
    return gw_pages_close (out, &page);
}

static void s_respond (gw_request_t *req, int status, char *page, const char *csp)
{
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_add_header (req, "X-Frame-Options", "DENY");
    //  same-origin, not no-referrer: under no-referrer browsers send "Origin: null" with
    //  our own forms, and the forms' Origin check (gw_session_origin_ok) needs the real
    //  one. Other sites still get no referrer (the authorization request stays ours).
    gw_request_add_header (req, "Referrer-Policy", "same-origin");
    //  No form-action: browsers apply it to the redirect after the consent form, which
    //  goes to the client's own redirect URI.
    gw_request_add_header (req, "Content-Security-Policy", csp);
    if (page)
        gw_request_respond (req, status, "text/html; charset=utf-8", page, strlen (page));
    else
        gw_request_respond (req, 500, "text/plain", "out of memory", 13);
    free (page);
}

void gw_pages_respond (gw_request_t *req, int status, char *page)
{
    s_respond (req, status, page,
               "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'");
}

void gw_pages_respond_script (gw_request_t *req, int status, char *page)
{
    //  Scripts from this origin only (the console's one file), never inline ones.
    s_respond (req, status, page,
               "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; "
               "connect-src 'self'; frame-ancestors 'none'");
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
    char *page = gw_pages_signin ("/oauth/authorize", hidden, 2, "Evil <b>", "a\"@<x>", "wrong");
    assert (page);
    assert (strstr (page, "value=\"&quot;&gt;&lt;script&gt;\""));
    assert (strstr (page, "Evil &lt;b&gt;"));
    assert (!strstr (page, "<script>"));
    assert (!strstr (page, "name=\"skip\""));
    assert (strstr (page, "value=\"a&quot;@&lt;x&gt;\""));
    free (page);
    page = gw_pages_consent ("/oauth/authorize", hidden, 1, "Claude", "cli_x", "claude.ai",
                             "a@example.com");
    assert (strstr (page, "value=\"allow\"") && strstr (page, "value=\"deny\""));
    free (page);
}
