/*  gw_oauth - see gw_oauth.h */
#include "gw_oauth.h"
#include "sbx_metrics.h"
#include "sbx_idmap.h"
#include "gw_auth.h"
#include "gw_broker.h"
#include "gw_fetch.h"
#include "gw_pages.h"
#include "gw_ratelimit.h"
#include "gw_session.h"
#include "gw_signin.h"
#include "sbx_secret.h"
#include "sbx_urls.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>

#define S_BROKER_MS 10000

#define S_CIMD_CACHE_MS (10 * 60 * 1000)
#define S_CIMD_MAX      1000
#define S_SCOPE         "sbx"
#define S_MAX_URIS      10

//  A client as the authorization page needs it: from the broker (registered) or from
//  its metadata document (cached here).
typedef struct gw_oauth_client_t {
    char *client_id;
    char *name;
    char *uris[S_MAX_URIS];
    size_t uri_count;
    uint64_t until_mono; //  metadata documents: trusted until then
} s_client_t;

typedef enum { OP_AUTHORIZE, OP_REGISTER, OP_TOKEN, OP_REVOKE } s_op_t;

//  One request in progress, waiting for the broker, the fetcher or the sign-in.
typedef struct {
    gw_oauth_t *oauth;
    uint64_t serial;
    uint64_t req_id;
    s_op_t op;
    bool post;
    zhashx_t *params; //  query or form
    s_client_t *client;
    const char *redirect_uri; //  the effective one, borrowed from client
    char *account_id;         //  signed in (session or this sign-in)
    char *email;
    uint64_t broker_handle;
    uint64_t signin_handle;
    uint64_t fetch_handle;
} s_flow_t;

struct gw_oauth_t {
    sbx_config_t *config;
    gw_auth_t *auth; //  the gateway's (borrowed): a revoke forgets its cached answers
    gw_http_t *http;
    gw_broker_t *broker;
    gw_session_t *session;
    gw_signin_t *signin;
    gw_fetch_t *fetch;
    char *issuer;    //  <base>
    char *resource;  //  <base>/mcp
    zhashx_t *flows; //  serial → s_flow_t
    zhashx_t *cimd;  //  URL → s_client_t
    uint64_t next_serial;
    gw_ratelimit_t *registrations; //  /oauth/register, per client address per minute
};

//  --------------------------------------------------------------------------
//  Small helpers

static void s_client_free (s_client_t **client_p)
{
    s_client_t *client = *client_p;
    if (!client)
        return;
    free (client->client_id);
    free (client->name);
    for (size_t i = 0; i < client->uri_count; i++)
        free (client->uris[i]);
    free (client);
    *client_p = NULL;
}

static void s_client_destructor (void **item)
{
    s_client_free ((s_client_t **) item);
}

static s_client_t *s_client_dup (const s_client_t *from)
{
    s_client_t *client = calloc (1, sizeof *client);
    if (!client)
        return NULL;
    client->client_id = strdup (from->client_id);
    client->name = strdup (from->name);
    for (size_t i = 0; i < from->uri_count; i++)
        client->uris[client->uri_count++] = strdup (from->uris[i]);
    client->until_mono = from->until_mono;
    return client;
}

void gw_oauth_client_destroy (gw_oauth_client_t **client_p)
{
    s_client_free (client_p);
}

const char *gw_oauth_client_name (const gw_oauth_client_t *client)
{
    return client->name;
}

static const char *s_param (s_flow_t *flow, const char *name)
{
    const char *value = flow->params ? zhashx_lookup (flow->params, name) : NULL;
    return value && *value ? value : NULL;
}

//  Percent-encodes everything but RFC 3986's unreserved characters. Caller frees.
static char *s_urlencode (const char *text)
{
    static const char s_hexdigits[] = "0123456789ABCDEF";
    char *out = malloc (strlen (text) * 3 + 1), *o = out;
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *) text; *p; p++) {
        if (isalnum (*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~')
            *o++ = (char) *p;
        else {
            *o++ = '%';
            *o++ = s_hexdigits[*p >> 4];
            *o++ = s_hexdigits[*p & 15];
        }
    }
    *o = 0;
    return out;
}

static void s_append_param (FILE *out, bool *first, const char *name, const char *value)
{
    if (!value)
        return;
    char *encoded = s_urlencode (value);
    fprintf (out, "%c%s=%s", *first ? '?' : '&', name, encoded ? encoded : "");
    free (encoded);
    *first = false;
}

static void s_json (gw_request_t *req, int status, json_t *body)
{
    char *text = json_dumps (body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref (body);
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_add_header (req, "Pragma", "no-cache");
    //  Browser-based clients (the MCP inspector) call these endpoints from their origin;
    //  nothing here relies on cookies, so any origin may read the answers.
    gw_request_add_header (req, "Access-Control-Allow-Origin", "*");
    gw_request_respond (req, status, "application/json", text, text ? strlen (text) : 0);
    free (text);
}

//  RFC 6749 section 5.2 (and RFC 7591 section 3.2.2): {"error","error_description"}.
static void s_oauth_error (gw_request_t *req, int status, const char *error,
                           const char *description)
{
    s_json (req, status,
            json_pack ("{s:s, s:s}", "error", error, "error_description", description));
}

//  --------------------------------------------------------------------------
//  Flows

static void s_flow_free (s_flow_t **flow_p)
{
    s_flow_t *flow = *flow_p;
    if (!flow)
        return;
    gw_oauth_t *self = flow->oauth;
    gw_broker_cancel (self->broker, flow->broker_handle);
    gw_signin_cancel (self->signin, flow->signin_handle);
    gw_fetch_cancel (self->fetch, flow->fetch_handle);
    zhashx_destroy (&flow->params);
    s_client_free (&flow->client);
    free (flow->account_id);
    free (flow->email);
    free (flow);
    *flow_p = NULL;
}

static s_flow_t *s_flow_new (gw_oauth_t *self, gw_request_t *req, s_op_t op, zhashx_t **params_p)
{
    s_flow_t *flow = calloc (1, sizeof *flow);
    if (!flow) {
        zhashx_destroy (params_p);
        return NULL;
    }
    flow->oauth = self;
    flow->serial = self->next_serial++;
    flow->req_id = gw_request_id (req);
    flow->op = op;
    flow->post = streq (gw_request_method (req), "POST");
    flow->params = *params_p;
    *params_p = NULL;
    zhashx_insert (self->flows, (void *) (uintptr_t) flow->serial, flow);
    return flow;
}

//  Done with a flow: forgets it.
static void s_flow_end (s_flow_t *flow)
{
    gw_oauth_t *self = flow->oauth;
    zhashx_delete (self->flows, (void *) (uintptr_t) flow->serial);
    s_flow_free (&flow);
}

//  The flow's request, or NULL (and the flow ended) when the client left meanwhile.
static gw_request_t *s_flow_req (s_flow_t *flow)
{
    gw_request_t *req = gw_http_request (flow->oauth->http, flow->req_id);
    if (!req)
        s_flow_end (flow);
    return req;
}

//  A broker answer came: its handle is spent. The flow's request, or NULL (flow ended).
static gw_request_t *s_flow_answered (s_flow_t *flow)
{
    flow->broker_handle = 0;
    return s_flow_req (flow);
}

//  Sends request (taken) to the broker; fn gets the flow.
static void s_flow_send (s_flow_t *flow, sbx_msg_t **request_p, gw_broker_fn *fn)
{
    GW_KEEP (flow->broker_handle,
             gw_broker_send (flow->oauth->broker, NULL, request_p, S_BROKER_MS, fn, flow));
}

//  --------------------------------------------------------------------------
//  Metadata (RFC 9728, RFC 8414)

static void s_protected_resource (gw_oauth_t *self, gw_request_t *req)
{
    s_json (req, 200,
            json_pack ("{s:s, s:[s], s:[s], s:[s], s:s}", "resource", self->resource,
                       "authorization_servers", self->issuer, "bearer_methods_supported", "header",
                       "scopes_supported", S_SCOPE, "resource_name", "sbx"));
}

static void s_server_metadata (gw_oauth_t *self, gw_request_t *req)
{
    char authorize[600], token[600], registration[600], revocation[600];
    snprintf (authorize, sizeof authorize, "%s/oauth/authorize", self->issuer);
    snprintf (token, sizeof token, "%s/oauth/token", self->issuer);
    snprintf (registration, sizeof registration, "%s/oauth/register", self->issuer);
    snprintf (revocation, sizeof revocation, "%s/oauth/revoke", self->issuer);
    s_json (req, 200,
            json_pack ("{s:s, s:s, s:s, s:s, s:s, s:[s], s:[s], s:[s, s], s:[s], s:[s], s:[s], "
                       "s:b, s:b}",
                       "issuer", self->issuer, "authorization_endpoint", authorize,
                       "token_endpoint", token, "registration_endpoint", registration,
                       "revocation_endpoint", revocation, "scopes_supported", S_SCOPE,
                       "response_types_supported", "code", "grant_types_supported",
                       "authorization_code", "refresh_token", "code_challenge_methods_supported",
                       "S256", "token_endpoint_auth_methods_supported", "none",
                       "revocation_endpoint_auth_methods_supported", "none",
                       "client_id_metadata_document_supported", 1,
                       "authorization_response_iss_parameter_supported", 1));
}

//  --------------------------------------------------------------------------
//  Registration (RFC 7591)

static void s_on_registered (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_flow_t *flow = arg;
    gw_request_t *req = s_flow_answered (flow);
    if (!req)
        return;
    if (!reply)
        s_oauth_error (req, code == SBX_E_INVALID_ARGUMENT ? 400 : 503,
                       code == SBX_E_INVALID_ARGUMENT ? "invalid_client_metadata"
                                                      : "temporarily_unavailable",
                       message ? message : sbx_code_name (code));
    else {
        sbx_oauth_client_register_ok_t *ok = sbx_msg_oauth_client_register_ok (reply);
        json_t *uris = json_array ();
        for (size_t i = 0; i < ok->redirect_uris.count; i++)
            json_array_append_new (uris, json_string (ok->redirect_uris.items[i]));
        s_json (req, 201,
                json_pack ("{s:s, s:I, s:s, s:o, s:[s, s], s:[s], s:s, s:s}", "client_id",
                           ok->client_id, "client_id_issued_at",
                           (json_int_t) (ok->created_ms / 1000), "client_name", ok->name,
                           "redirect_uris", uris, "grant_types", "authorization_code",
                           "refresh_token", "response_types", "code", "token_endpoint_auth_method",
                           "none", "scope", S_SCOPE));
    }
    s_flow_end (flow);
}

//  True when every string of a JSON array field is one of `allowed` (absent is fine).
static bool s_all_of (json_t *body, const char *field, const char **allowed)
{
    json_t *list = json_object_get (body, field);
    if (!list)
        return true;
    if (!json_is_array (list))
        return false;
    size_t i;
    json_t *item;
    json_array_foreach (list, i, item)
    {
        bool found = false;
        for (const char **a = allowed; *a; a++)
            if (json_is_string (item) && streq (json_string_value (item), *a))
                found = true;
        if (!found)
            return false;
    }
    return true;
}

//  Checks client metadata (RFC 7591 section 2): NULL when it may be registered, else the
//  error code, with the description in why.
static const char *s_register_check (json_t *body, char *why, size_t size)
{
    static const char *s_grants[] = {"authorization_code", "refresh_token", NULL};
    static const char *s_responses[] = {"code", NULL};
    json_t *uris = json_object_get (body, "redirect_uris");
    json_t *name = json_object_get (body, "client_name");
    json_t *auth = json_object_get (body, "token_endpoint_auth_method");
    if (!json_is_array (uris) || json_array_size (uris) == 0 ||
        json_array_size (uris) > S_MAX_URIS) {
        snprintf (why, size, "redirect_uris must be an array of 1 to %d URIs", S_MAX_URIS);
        return "invalid_redirect_uri";
    }
    size_t i;
    json_t *uri;
    json_array_foreach (uris, i, uri)
    {
        if (!json_is_string (uri)) {
            snprintf (why, size, "redirect_uris must hold strings");
            return "invalid_redirect_uri";
        }
        if (sbx_urls_redirect_check (json_string_value (uri), why, size))
            return "invalid_redirect_uri";
    }
    if (!json_is_string (name) || json_string_length (name) == 0 || json_string_length (name) > 100)
        snprintf (why, size,
                  "client_name is required: 1 to 100 characters people will recognise on the "
                  "consent page");
    else if (strpbrk (json_string_value (name), "\r\n\t"))
        snprintf (why, size, "client_name must be one line of text");
    else if (auth && (!json_is_string (auth) || !streq (json_string_value (auth), "none")))
        snprintf (why, size,
                  "token_endpoint_auth_method must be none: this server registers public "
                  "clients, which prove themselves with PKCE");
    else if (!s_all_of (body, "grant_types", s_grants))
        snprintf (why, size, "grant_types may hold authorization_code and refresh_token");
    else if (!s_all_of (body, "response_types", s_responses))
        snprintf (why, size, "response_types may hold code only");
    else
        return NULL;
    return "invalid_client_metadata";
}

static void s_register (gw_oauth_t *self, gw_request_t *req)
{
    //  Every attempt counts, valid or not: each costs a parse and most a broker write.
    uint64_t retry_ms = 0;
    char address[80];
    gw_ratelimit_address_key (gw_request_peer (req), address, sizeof address);
    if (gw_ratelimit_take (self->registrations, address, sbx_clock_mono_ms (), &retry_ms)) {
        char seconds[24], text[200];
        snprintf (seconds, sizeof seconds, "%llu", (unsigned long long) (retry_ms + 999) / 1000);
        snprintf (text, sizeof text,
                  "too many client registrations from this address: try again in %s s", seconds);
        sbx_info ("oauth: registration from %s refused (rate limited)", gw_request_peer (req));
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_RATE_LIMITED_TOTAL, 1, "register");
        gw_request_add_header (req, "Retry-After", seconds);
        s_oauth_error (req, 429, "rate_limited", text);
        return;
    }
    json_error_t jerr;
    json_t *body =
        json_loadb ((const char *) gw_request_body (req), gw_request_body_size (req), 0, &jerr);
    if (!json_is_object (body)) {
        json_decref (body);
        s_oauth_error (req, 400, "invalid_client_metadata",
                       "the body must be a JSON object of client metadata (RFC 7591)");
        return;
    }
    char why[400];
    const char *error = s_register_check (body, why, sizeof why);
    if (error) {
        json_decref (body);
        s_oauth_error (req, 400, error, why);
        return;
    }
    json_t *uris = json_object_get (body, "redirect_uris");
    json_t *name = json_object_get (body, "client_name");
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_CLIENT_REGISTER);
    sbx_oauth_client_register_t *args = sbx_msg_oauth_client_register (request);
    sbx_str_set (&args->name, json_string_value (name));
    size_t i;
    json_t *uri;
    json_array_foreach (uris, i, uri)
        sbx_strlist_append (&args->redirect_uris, json_string_value (uri));
    json_decref (body);
    zhashx_t *none = NULL;
    s_flow_t *flow = s_flow_new (self, req, OP_REGISTER, &none);
    if (!flow) {
        sbx_msg_destroy (&request);
        s_oauth_error (req, 500, "server_error", "out of memory");
        return;
    }
    s_flow_send (flow, &request, s_on_registered);
}

//  --------------------------------------------------------------------------
//  Authorization: the client, then the request's checks, then sign-in and consent.

static void s_client_ready (s_flow_t *flow, gw_request_t *req);

//  Sends the browser back to the client's (trusted) redirect URI with `pairs` (name,
//  value, ..., NULL; NULL values are left out), then state and iss (RFC 9207).
static void s_redirect (s_flow_t *flow, gw_request_t *req, const char *const *pairs)
{
    char *location = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&location, &size);
    if (!out) {
        gw_pages_respond_error (req, 500, "Something went wrong", "out of memory");
        return;
    }
    fputs (flow->redirect_uri, out);
    bool first = !strchr (flow->redirect_uri, '?');
    for (size_t i = 0; pairs[i]; i += 2)
        s_append_param (out, &first, pairs[i], pairs[i + 1]);
    s_append_param (out, &first, "state", s_param (flow, "state"));
    s_append_param (out, &first, "iss", flow->oauth->issuer);
    if (fclose (out) == 0) {
        gw_request_add_header (req, "Location", location);
        gw_request_add_header (req, "Cache-Control", "no-store");
        gw_request_respond (req, 302, "text/plain", "redirecting\n", 12);
    } else
        gw_pages_respond_error (req, 500, "Something went wrong", "out of memory");
    free (location);
}

//  An error for the client, by redirect (RFC 6749 4.1.2.1).
static void s_redirect_error (s_flow_t *flow, gw_request_t *req, const char *error,
                              const char *description)
{
    const char *pairs[] = {"error", error, "error_description", description, NULL};
    s_redirect (flow, req, pairs);
}

//  Fields that carry the authorization request through the forms.
static const char *s_carried[] = {
    "client_id", "redirect_uri", "response_type", "code_challenge", "code_challenge_method",
    "state",     "scope",        "resource"};
#define S_CARRIED (sizeof s_carried / sizeof s_carried[0])

static void s_hidden (s_flow_t *flow, const char *csrf, gw_pages_field_t *fields)
{
    for (size_t i = 0; i < S_CARRIED; i++) {
        fields[i].name = s_carried[i];
        fields[i].value = s_param (flow, s_carried[i]);
    }
    fields[S_CARRIED].name = "csrf";
    fields[S_CARRIED].value = csrf;
}

static void s_signin_page (s_flow_t *flow, gw_request_t *req, int status, const char *error)
{
    char *csrf = gw_session_csrf (flow->oauth->session, req, NULL);
    gw_pages_field_t fields[S_CARRIED + 1];
    s_hidden (flow, csrf, fields);
    gw_pages_respond (req, status,
                      gw_pages_signin ("/oauth/authorize", fields, S_CARRIED + 1,
                                       flow->client->name, s_param (flow, "email"), error));
    free (csrf);
}

static void s_consent_page (s_flow_t *flow, gw_request_t *req)
{
    //  The token is this person's: a consent form made for someone else (an attacker's
    //  own, planted in this browser) cannot be sent as this one.
    char *csrf = gw_session_csrf (flow->oauth->session, req, flow->account_id);
    gw_pages_field_t fields[S_CARRIED + 1];
    s_hidden (flow, csrf, fields);
    //  Where the code will go: the redirect URI's host, which people can judge.
    char host[256];
    const char *start = strstr (flow->redirect_uri, "://");
    start = start ? start + 3 : flow->redirect_uri;
    snprintf (host, sizeof host, "%.*s", (int) strcspn (start, "/?#"), start);
    gw_pages_respond (req, 200,
                      gw_pages_consent ("/oauth/authorize", fields, S_CARRIED + 1,
                                        flow->client->name, flow->client->client_id, host,
                                        flow->email));
    free (csrf);
}

static void s_on_code (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_flow_t *flow = arg;
    gw_request_t *req = s_flow_answered (flow);
    if (!req)
        return;
    if (!reply) {
        char text[600];
        snprintf (text, sizeof text, "The authorization could not be recorded: %s (%s). Try again.",
                  message ? message : "", sbx_code_name (code));
        if (code == SBX_E_NOT_FOUND) {
            //  The session names an account that is gone: sign in again.
            gw_session_sign_in (flow->oauth->session, req, NULL, NULL);
            s_signin_page (flow, req, 200, "Your session has ended; sign in again.");
        } else
            s_redirect_error (flow, req, "temporarily_unavailable", text);
    } else {
        const char *pairs[] = {"code", sbx_msg_oauth_authorize_ok (reply)->code, NULL};
        s_redirect (flow, req, pairs);
        sbx_info ("oauth account=%s allowed client %.200s (connection %s)", flow->account_id,
                  flow->client->client_id, sbx_msg_oauth_authorize_ok (reply)->grant_id);
    }
    s_flow_end (flow);
}

static void s_allow (s_flow_t *flow)
{
    gw_oauth_t *self = flow->oauth;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_AUTHORIZE);
    sbx_oauth_authorize_t *args = sbx_msg_oauth_authorize (request);
    sbx_str_set (&args->account_id, flow->account_id);
    sbx_str_set (&args->client_id, flow->client->client_id);
    sbx_str_set (&args->client_name, flow->client->name);
    sbx_str_set (&args->redirect_uri, flow->redirect_uri);
    sbx_str_set (&args->code_challenge, s_param (flow, "code_challenge"));
    sbx_str_set (&args->resource, self->resource);
    sbx_str_set (&args->scope, S_SCOPE);
    s_flow_send (flow, &request, s_on_code);
}

static void s_on_signin (const char *account_id, const char *email, int status, const char *error,
                         void *arg)
{
    s_flow_t *flow = arg;
    flow->signin_handle = 0;
    gw_request_t *req = s_flow_req (flow);
    if (!req)
        return;
    if (account_id) {
        gw_session_sign_in (flow->oauth->session, req, account_id, email);
        free (flow->account_id);
        free (flow->email);
        flow->account_id = strdup (account_id);
        flow->email = strdup (email);
        s_consent_page (flow, req);
    } else
        s_signin_page (flow, req, status, error);
    s_flow_end (flow);
}

//  Checks an authorization request's parameters, once its redirect URI is trusted: NULL
//  when it may go on, else the OAuth error code, with the description in text.
static const char *s_authorize_check (s_flow_t *flow, char *text, size_t size)
{
    const char *response_type = s_param (flow, "response_type");
    const char *challenge = s_param (flow, "code_challenge");
    const char *method = s_param (flow, "code_challenge_method");
    const char *resource = s_param (flow, "resource");
    const char *error = "invalid_request";
    if (!response_type || !streq (response_type, "code")) {
        snprintf (text, size, "response_type must be code");
        error = response_type ? "unsupported_response_type" : error;
    } else if (!challenge)
        snprintf (text, size, "code_challenge is required (PKCE with S256)");
    else if (!method || !streq (method, "S256"))
        snprintf (text, size, "code_challenge_method must be S256 (plain is not accepted)");
    else if (strlen (challenge) != 43 ||
             strspn (challenge,
                     "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != 43)
        snprintf (text, size,
                  "code_challenge must be the base64url SHA-256 of the verifier (43 characters)");
    else if (resource && !streq (resource, flow->oauth->resource)) {
        snprintf (text, size, "this server issues tokens for %s only", flow->oauth->resource);
        error = "invalid_target";
    } else
        error = NULL;
    return error;
}

//  The client is known: check the request, then serve the page or the form's action.
static void s_client_ready (s_flow_t *flow, gw_request_t *req)
{
    gw_oauth_t *self = flow->oauth;
    s_client_t *client = flow->client;
    //  The redirect URI first: until it is known to be the client's, errors go to a page,
    //  never to a URI an attacker chose.
    const char *asked = s_param (flow, "redirect_uri");
    for (size_t i = 0; asked && i < client->uri_count; i++)
        if (streq (asked, client->uris[i]))
            flow->redirect_uri = client->uris[i];
    if (!asked && client->uri_count == 1)
        flow->redirect_uri = client->uris[0];
    if (!flow->redirect_uri) {
        gw_pages_respond_error (
            req, 400, "This sign-in link is not valid",
            asked ? "The redirect_uri of this request is not one the client registered "
                    "(it must match exactly). Ask the app's developer to fix it."
                  : "This request has no redirect_uri, and the client registered more "
                    "than one.");
        s_flow_end (flow);
        return;
    }
    char text[300];
    const char *error = s_authorize_check (flow, text, sizeof text);
    if (error) {
        s_redirect_error (flow, req, error, text);
        s_flow_end (flow);
        return;
    }
    //  Any scope asked for is answered with what there is: sbx (RFC 6749 3.3 lets the
    //  server grant a different scope, and the token response says which).
    char *account_id = NULL, *email = NULL;
    bool signed_in = gw_session_account (self->session, req, &account_id, &email) == 0;
    if (signed_in) {
        flow->account_id = account_id;
        flow->email = email;
    }
    if (!flow->post) {
        if (signed_in)
            s_consent_page (flow, req);
        else
            s_signin_page (flow, req, 200, NULL);
        s_flow_end (flow);
        return;
    }
    const char *action = s_param (flow, "action");
    bool signin = action && streq (action, "signin");
    if (!signin && !signed_in && action && streq (action, "allow")) {
        //  Nothing can be allowed without a session: the sign-in page changes nothing.
        s_signin_page (flow, req, 200, "Your session has ended; sign in again.");
        s_flow_end (flow);
        return;
    }
    //  The sign-in form's token is the browser's; the consent form's is the signed-in
    //  person's too.
    if (!gw_session_csrf_ok (self->session, req, signin ? NULL : flow->account_id,
                             s_param (flow, "csrf"))) {
        gw_pages_respond_error (
            req, 403, "This form has expired",
            "The form was not sent from this site's page for you, or it is too old "
            "(permission_denied). Go back to the app and connect again.");
        s_flow_end (flow);
        return;
    }
    if (signin)
        GW_KEEP (flow->signin_handle,
                 gw_signin_start (self->signin, s_param (flow, "email"), s_param (flow, "password"),
                                  s_on_signin, flow));
    else if (action && streq (action, "deny")) {
        sbx_info ("oauth: access denied to client %.200s", client->client_id);
        s_redirect_error (flow, req, "access_denied", "the user did not allow access");
        s_flow_end (flow);
    } else if (action && streq (action, "allow"))
        s_allow (flow);
    else {
        s_signin_page (flow, req, 400, "Unknown action: use the buttons of this page.");
        s_flow_end (flow);
    }
}

static void s_on_client (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_flow_t *flow = arg;
    gw_request_t *req = s_flow_answered (flow);
    if (!req)
        return;
    if (!reply) {
        if (code == SBX_E_NOT_FOUND)
            gw_pages_respond_error (
                req, 400, "Unknown app",
                "The app that sent you here is not registered with this server "
                "(unknown client_id). Remove the connection in the app and add it "
                "again.");
        else {
            char text[600];
            snprintf (text, sizeof text, "Signing in is not possible right now: %s (%s).",
                      message ? message : "", sbx_code_name (code));
            gw_pages_respond_error (req, 503, "Try again later", text);
        }
        s_flow_end (flow);
        return;
    }
    sbx_oauth_client_get_ok_t *ok = sbx_msg_oauth_client_get_ok (reply);
    s_client_t *client = calloc (1, sizeof *client);
    if (client) {
        client->client_id = strdup (ok->client_id);
        client->name = strdup (ok->name);
        for (size_t i = 0; i < ok->redirect_uris.count && i < S_MAX_URIS; i++)
            client->uris[client->uri_count++] = strdup (ok->redirect_uris.items[i]);
    }
    flow->client = client;
    if (!client) {
        gw_pages_respond_error (req, 500, "Something went wrong", "out of memory");
        s_flow_end (flow);
        return;
    }
    s_client_ready (flow, req);
}

//  A client ID metadata document: checks and makes the client, or NULL with why.
s_client_t *gw_oauth_client_parse (const char *url, const char *body, size_t size, char *why,
                                   size_t why_size)
{
    json_error_t jerr;
    json_t *doc = json_loadb (body, size, 0, &jerr);
    s_client_t *client = NULL;
    json_t *id = json_object_get (doc, "client_id");
    json_t *name = json_object_get (doc, "client_name");
    json_t *uris = json_object_get (doc, "redirect_uris");
    if (!json_is_object (doc))
        snprintf (why, why_size, "it is not a JSON object");
    else if (!json_is_string (id) || !streq (json_string_value (id), url))
        snprintf (why, why_size, "its client_id is not its own URL");
    else if (!json_is_array (uris) || json_array_size (uris) == 0 ||
             json_array_size (uris) > S_MAX_URIS)
        snprintf (why, why_size, "its redirect_uris is not an array of 1 to %d URIs", S_MAX_URIS);
    else if (name &&
             (!json_is_string (name) || json_string_length (name) == 0 ||
              json_string_length (name) > 100 || strpbrk (json_string_value (name), "\r\n\t")))
        snprintf (why, why_size, "its client_name is not one line of 1 to 100 characters");
    else {
        client = calloc (1, sizeof *client);
        if (!client) {
            snprintf (why, why_size, "out of memory");
            json_decref (doc);
            return NULL;
        }
        client->client_id = strdup (url);
        if (name)
            client->name = strdup (json_string_value (name));
        else {
            //  No name: the host people can recognise, an IPv6 one whole ("[2001:db8::1]",
            //  not "[", as fuzz_url found).
            const char *host = url + 8;
            client->name =
                strndup (host, host[0] == '[' ? strcspn (host, "]") + 1 : strcspn (host, "/:?"));
        }
        size_t i;
        json_t *uri;
        json_array_foreach (uris, i, uri)
        {
            if (!json_is_string (uri) ||
                sbx_urls_redirect_check (json_string_value (uri), why, why_size)) {
                if (!json_is_string (uri))
                    snprintf (why, why_size, "its redirect_uris must hold strings");
                s_client_free (&client);
                break;
            }
            client->uris[client->uri_count++] = strdup (json_string_value (uri));
        }
    }
    json_decref (doc);
    return client;
}

static void s_on_fetched (int status, const char *body, size_t size, const char *error, void *arg)
{
    s_flow_t *flow = arg;
    flow->fetch_handle = 0;
    gw_oauth_t *self = flow->oauth;
    const char *url = s_param (flow, "client_id");
    char why[400] = "";
    s_client_t *client = NULL;
    if (error)
        snprintf (why, sizeof why, "%s", error);
    else if (status != 200)
        snprintf (why, sizeof why, "it answered HTTP %d", status);
    else
        client = gw_oauth_client_parse (url, body, size, why, sizeof why);
    if (client) {
        client->until_mono = sbx_clock_mono_ms () + S_CIMD_CACHE_MS;
        if (zhashx_size (self->cimd) >= S_CIMD_MAX)
            zhashx_purge (self->cimd);
        s_client_t *cached = s_client_dup (client);
        if (cached)
            zhashx_update (self->cimd, url, cached);
        sbx_info ("oauth: client metadata document %.300s fetched (%s)", url, client->name);
    } else
        sbx_warn ("oauth: client metadata document %.300s refused: %s", url, why);
    gw_request_t *req = s_flow_req (flow);
    if (!req) {
        s_client_free (&client);
        return;
    }
    if (!client) {
        char text[800];
        snprintf (text, sizeof text,
                  "The app's client ID metadata document at %.300s cannot be used: %s.", url, why);
        gw_pages_respond_error (req, 400, "Unknown app", text);
        s_flow_end (flow);
        return;
    }
    flow->client = client;
    s_client_ready (flow, req);
}

//  A client_id URL must be https with a path, without fragment or credentials.
bool gw_oauth_client_url_ok (const char *url)
{
    //  Its host and port as sbx_urls reads them, so the host fetched and shown on the
    //  consent page is the one libcurl connects to ("https://::1]:9/x" was let through).
    char why[400];
    if (strncmp (url, "https://", 8) != 0 || strlen (url) > 2000 || strchr (url, '#') ||
        sbx_urls_redirect_check (url, why, sizeof why) != 0)
        return false;
    const char *host = url + 8;
    size_t host_len = strcspn (host, "/");
    if (host_len == 0 || memchr (host, '@', host_len) || host[host_len] != '/' ||
        !host[host_len + 1])
        return false;
    for (const char *p = url; *p; p++)
        if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f)
            return false;
    return true;
}

static void s_authorize (gw_oauth_t *self, gw_request_t *req)
{
    bool post = streq (gw_request_method (req), "POST");
    char why[300];
    if (post && !gw_session_origin_ok (self->session, req, why, sizeof why)) {
        sbx_warn ("oauth: an authorization form was refused: %s", why);
        gw_pages_respond_foreign (req, why);
        return;
    }
    zhashx_t *params = gw_session_form (post ? (const char *) gw_request_body (req)
                                             : gw_request_query_string (req));
    if (!params) {
        gw_pages_respond_error (req, 400, "This sign-in link is not valid",
                                "Its parameters are not well-formed (bad % escapes).");
        return;
    }
    const char *client_id = zhashx_lookup (params, "client_id");
    if (!client_id || !*client_id) {
        zhashx_destroy (&params);
        gw_pages_respond_error (req, 400, "This sign-in link is not valid",
                                "It names no app (client_id is missing).");
        return;
    }
    s_flow_t *flow = s_flow_new (self, req, OP_AUTHORIZE, &params);
    if (!flow) {
        gw_pages_respond_error (req, 500, "Something went wrong", "out of memory");
        return;
    }
    client_id = s_param (flow, "client_id");
    if (strncmp (client_id, "https://", 8) == 0) {
        if (!gw_oauth_client_url_ok (client_id)) {
            gw_pages_respond_error (
                req, 400, "Unknown app",
                "The app's client_id is a URL this server cannot use: it must be "
                "https, with a path, without a fragment or credentials.");
            s_flow_end (flow);
            return;
        }
        s_client_t *cached = zhashx_lookup (self->cimd, client_id);
        if (cached && cached->until_mono > sbx_clock_mono_ms ()) {
            flow->client = s_client_dup (cached);
            s_client_ready (flow, req);
        } else
            GW_KEEP (flow->fetch_handle, gw_fetch_get (self->fetch, client_id, s_on_fetched, flow));
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_CLIENT_GET);
    sbx_str_set (&sbx_msg_oauth_client_get (request)->client_id, client_id);
    s_flow_send (flow, &request, s_on_client);
}

//  --------------------------------------------------------------------------
//  Token and revocation

static void s_on_token (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_flow_t *flow = arg;
    gw_request_t *req = s_flow_answered (flow);
    if (!req)
        return;
    if (!reply) {
        if (code == SBX_E_UNAUTHENTICATED)
            s_oauth_error (req, 400, "invalid_grant", message ? message : "invalid grant");
        else if (code == SBX_E_INVALID_ARGUMENT)
            s_oauth_error (req, 400, "invalid_request", message ? message : "invalid request");
        else {
            char text[600];
            snprintf (text, sizeof text, "cannot issue tokens now: %s (%s)", message ? message : "",
                      sbx_code_name (code));
            s_oauth_error (req, 503, "temporarily_unavailable", text);
        }
    } else {
        sbx_oauth_token_ok_t *ok = sbx_msg_oauth_token_ok (reply);
        s_json (req, 200,
                json_pack ("{s:s, s:s, s:I, s:s, s:s}", "access_token", ok->access_token,
                           "token_type", "Bearer", "expires_in", (json_int_t) ok->expires_in_s,
                           "refresh_token", ok->refresh_token, "scope",
                           ok->scope ? ok->scope : S_SCOPE));
    }
    s_flow_end (flow);
}

//  Public clients send client_id in the body; some send it as HTTP Basic with an empty
//  secret. Returns the client_id (fresh) or NULL.
static char *s_client_id (s_flow_t *flow, gw_request_t *req)
{
    const char *id = s_param (flow, "client_id");
    if (id)
        return strdup (id);
    const char *auth = gw_request_header (req, "Authorization");
    if (!auth || strncasecmp (auth, "Basic ", 6) != 0)
        return NULL;
    size_t size;
    char *decoded = (char *) sbx_secret_base64_decode (auth + 6, &size);
    if (!decoded)
        return NULL;
    char *colon = strchr (decoded, ':');
    if (colon)
        *colon = 0;
    //  Basic credentials are form-encoded (RFC 6749 2.3.1); ids here need no decoding.
    return decoded;
}

//  Checks a token request's parameters: NULL when it may go to the broker, else the
//  OAuth error code, with the description in text.
static const char *s_token_check (s_flow_t *flow, const char *client_id, char *text, size_t size)
{
    const char *grant_type = s_param (flow, "grant_type");
    const char *resource = s_param (flow, "resource");
    bool code_grant = grant_type && streq (grant_type, "authorization_code");
    const char *longest[] = {"code", "code_verifier", "refresh_token"};
    if (!grant_type) {
        snprintf (text, size, "grant_type is required");
        return "invalid_request";
    }
    if (!code_grant && !streq (grant_type, "refresh_token")) {
        snprintf (text, size, "grant_type must be authorization_code or refresh_token");
        return "unsupported_grant_type";
    }
    if (!client_id) {
        snprintf (text, size, "client_id is required");
        return "invalid_request";
    }
    const char *missing = code_grant && !s_param (flow, "code")             ? "code"
                          : code_grant && !s_param (flow, "code_verifier")  ? "code_verifier (PKCE)"
                          : !code_grant && !s_param (flow, "refresh_token") ? "refresh_token"
                                                                            : NULL;
    if (missing) {
        snprintf (text, size, "%s is required", missing);
        return "invalid_request";
    }
    if (resource && !streq (resource, flow->oauth->resource)) {
        snprintf (text, size, "this server issues tokens for %s only", flow->oauth->resource);
        return "invalid_target";
    }
    //  Longer than any of ours can't be one of ours (and would not fit the message).
    for (size_t i = 0; i < sizeof longest / sizeof longest[0]; i++)
        if (s_param (flow, longest[i]) && strlen (s_param (flow, longest[i])) > 128) {
            snprintf (text, size, "%s is not valid", longest[i]);
            return "invalid_grant";
        }
    if (strlen (client_id) > 2000 ||
        (s_param (flow, "redirect_uri") && strlen (s_param (flow, "redirect_uri")) > 2000)) {
        snprintf (text, size, "client_id or redirect_uri is longer than 2000 characters");
        return "invalid_request";
    }
    return NULL;
}

static void s_token (gw_oauth_t *self, gw_request_t *req)
{
    zhashx_t *params = gw_session_form ((const char *) gw_request_body (req));
    if (!params) {
        s_oauth_error (req, 400, "invalid_request",
                       "the body must be application/x-www-form-urlencoded");
        return;
    }
    s_flow_t *flow = s_flow_new (self, req, OP_TOKEN, &params);
    if (!flow) {
        s_oauth_error (req, 500, "server_error", "out of memory");
        return;
    }
    char *client_id = s_client_id (flow, req);
    char text[300];
    const char *error = s_token_check (flow, client_id, text, sizeof text);
    if (error) {
        s_oauth_error (req, 400, error, text);
        free (client_id);
        s_flow_end (flow);
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_TOKEN);
    sbx_oauth_token_t *args = sbx_msg_oauth_token (request);
    sbx_str_set (&args->grant_type, s_param (flow, "grant_type"));
    sbx_str_set (&args->client_id, client_id);
    sbx_str_set (&args->code, s_param (flow, "code"));
    sbx_str_set (&args->code_verifier, s_param (flow, "code_verifier"));
    sbx_str_set (&args->redirect_uri, s_param (flow, "redirect_uri"));
    sbx_str_set (&args->refresh_token, s_param (flow, "refresh_token"));
    free (client_id);
    s_flow_send (flow, &request, s_on_token);
}

static void s_on_revoked (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_flow_t *flow = arg;
    //  The connection's cached tokens go at once here; the tap tells the other gateways.
    if (reply && flow->oauth->auth && sbx_msg_oauth_revoke_ok (reply)->key_id)
        gw_auth_forget_key (flow->oauth->auth, sbx_msg_oauth_revoke_ok (reply)->key_id);
    gw_request_t *req = s_flow_answered (flow);
    if (!req)
        return;
    if (!reply && code != SBX_E_INVALID_ARGUMENT) {
        char text[600];
        snprintf (text, sizeof text, "cannot revoke now: %s (%s)", message ? message : "",
                  sbx_code_name (code));
        s_oauth_error (req, 503, "temporarily_unavailable", text);
    } else
        s_json (req, 200, json_object ()); //  RFC 7009: unknown tokens are fine too
    s_flow_end (flow);
}

static void s_revoke (gw_oauth_t *self, gw_request_t *req)
{
    zhashx_t *params = gw_session_form ((const char *) gw_request_body (req));
    const char *token = params ? zhashx_lookup (params, "token") : NULL;
    if (!token || !*token) {
        zhashx_destroy (&params);
        s_oauth_error (req, 400, "invalid_request", "token is required");
        return;
    }
    if (strlen (token) > 128) {
        zhashx_destroy (&params);
        s_json (req, 200, json_object ()); //  cannot be one of ours
        return;
    }
    s_flow_t *flow = s_flow_new (self, req, OP_REVOKE, &params);
    if (!flow) {
        s_oauth_error (req, 500, "server_error", "out of memory");
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_REVOKE);
    sbx_str_set (&sbx_msg_oauth_revoke (request)->token, s_param (flow, "token"));
    s_flow_send (flow, &request, s_on_revoked);
}

//  --------------------------------------------------------------------------
//  Routing

bool gw_oauth_handle (gw_oauth_t *self, gw_request_t *req)
{
    const char *path = gw_request_path (req);
    const char *method = gw_request_method (req);
    bool get = streq (method, "GET") || streq (method, "HEAD");
    bool post = streq (method, "POST");
    bool metadata = streq (path, "/.well-known/oauth-protected-resource") ||
                    streq (path, "/.well-known/oauth-protected-resource/mcp") ||
                    streq (path, "/.well-known/oauth-authorization-server");
    bool endpoint = streq (path, "/oauth/register") || streq (path, "/oauth/authorize") ||
                    streq (path, "/oauth/token") || streq (path, "/oauth/revoke");
    if (!metadata && !endpoint)
        return false;
    if (streq (method, "OPTIONS") && !streq (path, "/oauth/authorize")) {
        //  CORS preflight for browser-based clients.
        gw_request_add_header (req, "Access-Control-Allow-Origin", "*");
        gw_request_add_header (req, "Access-Control-Allow-Methods", metadata ? "GET" : "POST");
        gw_request_add_header (req, "Access-Control-Allow-Headers",
                               "Content-Type, Authorization, MCP-Protocol-Version");
        gw_request_add_header (req, "Access-Control-Max-Age", "86400");
        gw_request_respond (req, 204, NULL, "", 0);
        return true;
    }
    const char *allowed = metadata                           ? "GET"
                          : streq (path, "/oauth/authorize") ? "GET, POST"
                                                             : "POST";
    bool ok = metadata ? get : streq (path, "/oauth/authorize") ? get || post : post;
    if (!ok) {
        gw_request_add_header (req, "Allow", allowed);
        char text[200];
        snprintf (text, sizeof text, "use %s on %s", allowed, path);
        s_oauth_error (req, 405, "invalid_request", text);
        return true;
    }
    if (streq (path, "/.well-known/oauth-authorization-server"))
        s_server_metadata (self, req);
    else if (metadata)
        s_protected_resource (self, req);
    else if (streq (path, "/oauth/register"))
        s_register (self, req);
    else if (streq (path, "/oauth/authorize"))
        s_authorize (self, req);
    else if (streq (path, "/oauth/token"))
        s_token (self, req);
    else
        s_revoke (self, req);
    return true;
}

//  --------------------------------------------------------------------------
//  Construction

static void s_route (gw_request_t *req, void *arg)
{
    gw_oauth_handle ((gw_oauth_t *) arg, req);
}

//  The paths gw_oauth_handle serves.
static const char *s_paths[] = {"/.well-known/oauth-protected-resource",
                                "/.well-known/oauth-protected-resource/mcp",
                                "/.well-known/oauth-authorization-server",
                                "/oauth/register",
                                "/oauth/authorize",
                                "/oauth/token",
                                "/oauth/revoke",
                                NULL};

gw_oauth_t *gw_oauth_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_oauth_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    sbx_config_t *config = ctx->config;
    zloop_t *loop = ctx->loop;
    self->config = config;
    self->auth = ctx->auth;
    self->http = ctx->http;
    self->broker = ctx->broker;
    self->session = ctx->signin;
    self->signin = gw_signin_new (loop, self->broker, "oauth");
    const char *allow =
        config ? sbx_config_get (config, "gateway.oauth_allow_private_fetch", "false") : "false";
    gw_fetch_options_t options = {
        .allow_private = streq (allow, "true") || streq (allow, "on") || streq (allow, "1"),
        .ca_file = config ? sbx_config_get (config, "gateway.oauth_fetch_ca", NULL) : NULL};
    self->fetch = gw_fetch_new (loop, &options);
    const char *per_minute =
        config ? sbx_config_get (config, "gateway.register_per_minute", "10") : "10";
    char *end = NULL;
    unsigned long registrations = strtoul (per_minute, &end, 10);
    if (end != per_minute && !*end && *per_minute != '-')
        self->registrations = gw_ratelimit_new ((size_t) registrations, 60000);
    else
        sbx_error ("gateway.register_per_minute must be a number (0 = no limit), not '%s'",
                   per_minute);
    self->issuer = config ? sbx_urls_base (config) : strdup ("https://localhost:8443");
    if (self->issuer && asprintf (&self->resource, "%s/mcp", self->issuer) < 0)
        self->resource = NULL;
    self->flows = sbx_idmap_new ();
    self->cimd = zhashx_new ();
    bool routed = true;
    for (int i = 0; s_paths[i] && routed; i++)
        routed = gw_router_add (ctx->router, s_paths[i], false, s_route, self) == 0;
    if (!self->signin || !self->fetch || !self->registrations || !self->issuer || !self->resource ||
        !self->flows || !self->cimd || !routed) {
        gw_oauth_destroy (&self);
        return NULL;
    }
    //  One pool and throttle for both sign-in pages (gw_verify.h).
    if (ctx->verify)
        gw_signin_set_verify (self->signin, ctx->verify);
    zhashx_set_destructor (self->cimd, s_client_destructor);
    self->next_serial = 1;
    if (options.allow_private)
        sbx_warn ("gateway.oauth_allow_private_fetch is on: client metadata documents may be "
                  "fetched from private and loopback addresses (tests only)");
    return self;
}

void gw_oauth_destroy (gw_oauth_t **self_p)
{
    assert (self_p);
    gw_oauth_t *self = *self_p;
    if (!self)
        return;
    if (self->flows) {
        for (s_flow_t *flow = zhashx_first (self->flows); flow; flow = zhashx_next (self->flows))
            s_flow_free (&flow);
        zhashx_destroy (&self->flows);
    }
    zhashx_destroy (&self->cimd);
    gw_fetch_destroy (&self->fetch);
    gw_ratelimit_destroy (&self->registrations);
    gw_signin_destroy (&self->signin);
    free (self->issuer);
    free (self->resource);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Self test: what needs neither a broker nor a socket (tests/integration/test_oauth.py
//  drives the endpoints for real).

void gw_oauth_test (bool verbose)
{
    (void) verbose;
    char *encoded = s_urlencode ("a b&c=d/é~");
    assert (streq (encoded, "a%20b%26c%3Dd%2F%C3%A9~"));
    free (encoded);
    assert (gw_oauth_client_url_ok ("https://claude.ai/oauth/claude-code-client-metadata"));
    assert (!gw_oauth_client_url_ok ("https://claude.ai"));
    assert (!gw_oauth_client_url_ok ("https://claude.ai/"));
    assert (!gw_oauth_client_url_ok ("http://claude.ai/client.json"));
    assert (!gw_oauth_client_url_ok ("https://u:p@claude.ai/client.json"));
    assert (!gw_oauth_client_url_ok ("https://claude.ai/client.json#x"));
    assert (!gw_oauth_client_url_ok ("https://::1]:9/cb?x=1")); //  found by fuzz_url
    assert (!gw_oauth_client_url_ok ("https://claude.ai:x/client.json"));
    assert (gw_oauth_client_url_ok ("https://claude.ai:443/client.json"));
    char why[400];
    const char *url = "https://app.example/client.json";
    const char *good = "{\"client_id\":\"https://app.example/client.json\",\"client_name\":\"App\","
                       "\"redirect_uris\":[\"https://app.example/cb\"]}";
    s_client_t *client = gw_oauth_client_parse (url, good, strlen (good), why, sizeof why);
    assert (client && streq (client->name, "App") && client->uri_count == 1);
    s_client_free (&client);
    const char *other = "{\"client_id\":\"https://evil.example/client.json\","
                        "\"redirect_uris\":[\"https://app.example/cb\"]}";
    assert (!gw_oauth_client_parse (url, other, strlen (other), why, sizeof why));
    assert (strstr (why, "not its own URL"));
    const char *bad_uri = "{\"client_id\":\"https://app.example/client.json\","
                          "\"redirect_uris\":[\"http://app.example/cb\"]}";
    assert (!gw_oauth_client_parse (url, bad_uri, strlen (bad_uri), why, sizeof why));
    const char *no_name = "{\"client_id\":\"https://app.example/client.json\","
                          "\"redirect_uris\":[\"https://app.example/cb\"]}";
    client = gw_oauth_client_parse (url, no_name, strlen (no_name), why, sizeof why);
    assert (client && streq (client->name, "app.example"));
    s_client_free (&client);
    assert (!gw_oauth_client_parse (url, "[1]", 3, why, sizeof why));
    const char *v6_url = "https://[2001:db8::1]:8443/client.json";
    const char *v6 = "{\"client_id\":\"https://[2001:db8::1]:8443/client.json\","
                     "\"redirect_uris\":[\"https://app.example/cb\"]}";
    client = gw_oauth_client_parse (v6_url, v6, strlen (v6), why, sizeof why);
    assert (client && streq (client->name, "[2001:db8::1]"));
    s_client_free (&client);
}
