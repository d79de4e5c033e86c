/*  gw_box - see gw_box.h */
#include "gw_box.h"
#include "gw_pages.h"
#include "sbx_idmap.h"
#include "sbx_urls.h"

#include <assert.h>
#include <ctype.h>

struct gw_box_t {
    gw_http_t *http;
    gw_auth_t *auth;
    gw_ops_t *ops;
    sbx_api_t *api;
    gw_session_t *session;
    char *console_url; //  "https://DOMAIN[:PORT]/account"
    zhashx_t *jobs;    //  serial → s_job_t
    uint64_t next_serial;
};

//  One page waiting for the key check or the sandbox list.
typedef struct {
    gw_box_t *box;
    uint64_t serial, req_id;
    char label[64];
    uint64_t ops_handle;
} s_job_t;

static void s_job_end (s_job_t *job)
{
    gw_ops_cancel (job->box->ops, job->ops_handle);
    zhashx_delete (job->box->jobs, (void *) (uintptr_t) job->serial);
    free (job);
}

static void s_respond (s_job_t *job, gw_request_t *req, int status, const json_t *sandbox,
                       const char *note)
{
    char *url = sbx_api_url (job->box->api, job->label);
    gw_pages_respond (req, status,
                      gw_box_page (job->label, url, job->box->console_url, sandbox, note));
    free (url);
}

static void s_on_list (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->ops_handle = 0;
    gw_request_t *req = gw_http_request (job->box->http, job->req_id);
    if (req) {
        const json_t *found = NULL;
        size_t i;
        const json_t *s;
        json_array_foreach (json_object_get (result->answer, "sandboxes"), i, s)
        {
            const char *label = json_string_value (json_object_get (s, "label"));
            if (label && streq (label, job->label))
                found = s;
        }
        char note[400];
        snprintf (note, sizeof note, "Your sandboxes cannot be listed now: %s (%s).",
                  result->message ? result->message : "", sbx_code_name (result->code));
        s_respond (job, req, result->code == SBX_OK ? 200 : sbx_code_http_status (result->code),
                   found,
                   found                    ? NULL
                   : result->code == SBX_OK ? "No sandbox of yours has this address."
                                            : note);
    }
    s_job_end (job);
}

//  The visitor is known: their sandboxes, as REST lists them for them.
static void s_list (s_job_t *job, const sbx_caller_t *caller)
{
    GW_KEEP (job->ops_handle, gw_ops_call (job->box->ops, SBX_OP_LIST_SANDBOXES, SBX_OPS_REST,
                                           caller, NULL, NULL, 0, s_on_list, job));
}

static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    if (caller) {
        s_list (job, caller);
        return;
    }
    gw_request_t *req = gw_http_request (job->box->http, job->req_id);
    if (req) {
        char note[400];
        snprintf (note, sizeof note, "The API key was refused: %s (%s).", message ? message : "",
                  sbx_code_name (code));
        s_respond (job, req, code == SBX_E_UNAUTHENTICATED ? 401 : sbx_code_http_status (code),
                   NULL, note);
    }
    s_job_end (job);
}

void gw_box_serve (gw_box_t *self, gw_request_t *req, const char *label)
{
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        gw_pages_respond (req, 500, NULL);
        return;
    }
    job->box = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    snprintf (job->label, sizeof job->label, "%s", label);
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    const char *method = gw_request_method (req);
    if (!streq (method, "GET") && !streq (method, "HEAD")) {
        gw_request_add_header (req, "Allow", "GET, HEAD");
        s_respond (job, req, 405, NULL,
                   "Only GET is served here: nothing is published publicly on port 80.");
        s_job_end (job);
        return;
    }
    const char *token = gw_request_query (req, "sbx_owner");
    const char *bearer = gw_auth_bearer (gw_request_header (req, "Authorization"));
    if (token) {
        char *account_id = gw_session_owner_check (self->session, label, token);
        if (account_id) {
            sbx_caller_t caller = {.kind = SBX_CALLER_KIND_SESSION, .account_id = account_id};
            s_list (job, &caller);
            free (account_id);
            return;
        }
        s_respond (job, req, 403, NULL,
                   "This owner link has expired or is not for this sandbox: open the sandbox "
                   "from your account page again.");
        s_job_end (job);
    } else if (bearer)
        gw_auth_check (self->auth, bearer, s_on_auth, job);
    else {
        s_respond (job, req, 200, NULL, NULL);
        s_job_end (job);
    }
}

bool gw_box_wants_owner (gw_request_t *req)
{
    return gw_request_query (req, "sbx_owner") != NULL;
}

int gw_box_parse_host (const char *host, const char *box_domain, char *label, size_t label_size)
{
    if (!host || !box_domain || !*box_domain)
        return -1;
    size_t size = strlen (host), domain_size = strlen (box_domain);
    if (size <= domain_size + 1 || host[size - domain_size - 1] != '.' ||
        strcasecmp (host + size - domain_size, box_domain) != 0)
        return -1;
    size_t first = size - domain_size - 1;
    if (first >= label_size || host[0] == '-' || host[first - 1] == '-')
        return -1;
    for (size_t i = 0; i < first; i++)
        if (!islower ((unsigned char) host[i]) && !isdigit ((unsigned char) host[i]) &&
            host[i] != '-')
            return -1; //  one DNS label of [a-z0-9-]
    memcpy (label, host, first);
    label[first] = 0;
    return 0;
}

char *gw_box_page (const char *label, const char *box_url, const char *console_url,
                   const json_t *sandbox, const char *note)
{
    char *page = NULL;
    size_t size = 0;
    FILE *out = gw_pages_open (&page, &size, sandbox ? label : "An sbx sandbox");
    if (!out)
        return NULL;
    if (!sandbox) {
        //  Anyone: what this is, nothing of the sandbox (not even that it exists).
        fputs ("<h1>An sbx sandbox's address</h1>\n<p><code>", out);
        gw_pages_put (out, box_url);
        fputs ("</code> is where an sbx sandbox publishes its web server on port 80. Nothing "
               "is published publicly there now.</p>\n",
               out);
        if (note) {
            fputs ("<p class=\"error\" role=\"alert\">", out);
            gw_pages_put (out, note);
            fputs ("</p>\n", out);
        }
        fputs ("<p>If this sandbox is yours, open it from <a href=\"", out);
        gw_pages_put (out, console_url);
        fputs ("\">your account page</a>: its link there shows you its published ports and "
               "their addresses (or send <code>Authorization: Bearer</code> with an API key of "
               "yours). Each published port has an address of its own, "
               "<code>https://LABEL-PORT.…</code>; a private one answers only its owner's API "
               "keys.</p>\n",
               out);
        return gw_pages_close (out, &page);
    }
    fputs ("<h1>Sandbox <code>", out);
    gw_pages_put (out, label);
    fputs ("</code></h1>\n<p id=\"owner\">Only you see this page: it is yours (<code>", out);
    gw_pages_put (out, json_string_value (json_object_get (sandbox, "id")));
    fputs ("</code>, ", out);
    gw_pages_put (out, json_string_value (json_object_get (sandbox, "name")));
    fputs ("). State: <strong id=\"state\">", out);
    gw_pages_put (out, json_string_value (json_object_get (sandbox, "state")));
    fputs ("</strong>, type ", out);
    gw_pages_put (out, json_string_value (json_object_get (sandbox, "type")));
    fputs (".</p>\n<h2>Published ports</h2>\n", out);
    const json_t *ports = json_object_get (sandbox, "ports");
    if (!json_array_size (ports))
        fputs ("<p id=\"no-ports\">None yet. Publish one with <code>host_port</code> (MCP), "
               "<code>POST /v1/sandboxes/{id}/ports</code> or <code>sbx sandbox port</code>; "
               "port 80 published publicly is served at this address.</p>\n",
               out);
    else {
        fputs ("<table><tr><th>Port</th><th>URL</th><th>Who may open it</th></tr>\n", out);
        size_t i;
        const json_t *port;
        json_array_foreach (ports, i, port)
        {
            bool public = json_is_true (json_object_get (port, "public"));
            long long number = (long long) json_integer_value (json_object_get (port, "port"));
            fprintf (out, "<tr class=\"port\" data-port=\"%lld\"><td>%lld</td><td><a href=\"",
                     number, number);
            gw_pages_put (out, json_string_value (json_object_get (port, "url")));
            fputs ("\">", out);
            gw_pages_put (out, json_string_value (json_object_get (port, "url")));
            fprintf (out, "</a></td><td>%s</td></tr>\n",
                     public ? "anyone (public)" : "your API keys (private: Authorization: Bearer)");
        }
        fputs ("</table>\n", out);
    }
    size_t i;
    const json_t *port;
    json_array_foreach (ports, i,
                        port) if (json_integer_value (json_object_get (port, "port")) == 80 &&
                                  json_is_true (json_object_get (port, "public")))
    {
        fputs ("<p id=\"port-80\">Port 80 is public: <a href=\"", out);
        gw_pages_put (out, box_url);
        fputs ("\">this address</a> serves its page to everyone.</p>\n", out);
    }
    fputs ("<p><a href=\"", out);
    gw_pages_put (out, console_url);
    fputs ("\">Your account page</a> stops, resumes and deletes it.</p>\n", out);
    return gw_pages_close (out, &page);
}

gw_box_t *gw_box_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_box_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = ctx->http;
    self->auth = ctx->auth;
    self->ops = ctx->ops;
    self->api = ctx->api;
    self->session = ctx->signin;
    char *base = ctx->config ? sbx_urls_base (ctx->config) : strdup ("https://localhost:8443");
    if (base && asprintf (&self->console_url, "%s/account", base) < 0)
        self->console_url = NULL;
    free (base);
    self->jobs = sbx_idmap_new ();
    self->next_serial = 1;
    if (!self->console_url || !self->jobs)
        gw_box_destroy (&self);
    return self;
}

void gw_box_destroy (gw_box_t **self_p)
{
    assert (self_p);
    gw_box_t *self = *self_p;
    if (!self)
        return;
    //  Checks in flight are the shared auth's: it is destroyed after, without calling back.
    if (self->jobs) {
        s_job_t *job;
        while ((job = zhashx_first (self->jobs)))
            s_job_end (job);
        zhashx_destroy (&self->jobs);
    }
    free (self->console_url);
    free (self);
    *self_p = NULL;
}

void gw_box_test (bool verbose)
{
    (void) verbose;
    char label[64];
    assert (gw_box_parse_host ("calm-brisk-otter.box.example.com", "box.example.com", label,
                               sizeof label) == 0);
    assert (streq (label, "calm-brisk-otter"));
    assert (gw_box_parse_host ("box.example.com", "box.example.com", label, sizeof label) == -1);
    assert (gw_box_parse_host ("a.b.box.example.com", "box.example.com", label, sizeof label) ==
            -1);
    assert (gw_box_parse_host ("-a.box.example.com", "box.example.com", label, sizeof label) == -1);
    assert (gw_box_parse_host ("a.box.example.org", "box.example.com", label, sizeof label) == -1);
    assert (gw_box_parse_host ("xbox.example.com", "box.example.com", label, sizeof label) == -1);

    //  Anyone: no details; the owner: the ports, escaped.
    char *page = gw_box_page ("calm-otter", "https://calm-otter.box.localhost",
                              "https://localhost/account", NULL, "expired <link>");
    assert (page && strstr (page, "Nothing is published publicly there now"));
    assert (strstr (page, "expired &lt;link&gt;") && !strstr (page, "Published ports"));
    free (page);
    json_t *sandbox = json_pack ("{s:s, s:s, s:s, s:s, s:s, s:[{s:i, s:s, s:b}, {s:i, s:s, s:b}]}",
                                 "id", "sb_0123456789", "name", "<demo>", "label", "calm-otter",
                                 "state", "ready", "type", "small", "ports", "port", 8000, "url",
                                 "https://calm-otter-8000.box.localhost", "public", 1, "port", 9000,
                                 "url", "https://calm-otter-9000.box.localhost", "public", 0);
    page = gw_box_page ("calm-otter", "https://calm-otter.box.localhost",
                        "https://localhost/account", sandbox, NULL);
    assert (strstr (page, "&lt;demo&gt;") && !strstr (page, "<demo>"));
    assert (strstr (page, "data-port=\"8000\"") && strstr (page, "anyone (public)"));
    assert (strstr (page, "href=\"https://calm-otter-9000.box.localhost\""));
    assert (strstr (page, "your API keys (private") && !strstr (page, "Port 80 is public"));
    free (page);
    json_array_append_new (json_object_get (sandbox, "ports"),
                           json_pack ("{s:i, s:s, s:b}", "port", 80, "url",
                                      "https://calm-otter-80.box.localhost", "public", 1));
    page = gw_box_page ("calm-otter", "https://calm-otter.box.localhost",
                        "https://localhost/account", sandbox, NULL);
    assert (strstr (page, "Port 80 is public: <a href=\"https://calm-otter.box.localhost\">"));
    free (page);
    json_decref (sandbox);

    zloop_t *loop = zloop_new ();
    gw_ctx_t *ctx = gw_ctx_new (NULL, loop, NULL, NULL);
    gw_box_t *box = ctx ? gw_box_new (ctx) : NULL;
    assert (box && streq (box->console_url, "https://localhost:8443/account"));
    gw_box_destroy (&box);
    gw_box_destroy (&box);
    gw_ctx_destroy (&ctx);
    zloop_destroy (&loop);
}
