/*  cli_remote - one MCP session with a remote sbx's /mcp (see cli_remote.h). */
#include "cli_remote.h"
#include "cli_http.h"
#include "cli_sse.h"
#include "sbx_common.h"

//  tools/call waits for exec's longest timeout (600 s) and the service's margin; the
//  rest answer at once.
#define S_CALL_TIMEOUT_S  700
#define S_OTHER_TIMEOUT_S 60

struct cli_remote_t {
    char *url;
    char *authorization; //  "Authorization: Bearer sbx_…"
    char *protocol;
    cli_http_t *http;
    char *session_id;
    json_int_t next_id;
};

cli_remote_t *cli_remote_new (const char *mcp_url, const char *api_key, const char *ca_cert)
{
    cli_remote_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->url = strdup (mcp_url);
    self->authorization = zsys_sprintf ("Authorization: Bearer %s", api_key);
    self->protocol = strdup ("2025-06-18");
    self->http = cli_http_new (ca_cert);
    self->next_id = 1;
    if (!self->url || !self->authorization || !self->protocol || !self->http)
        cli_remote_destroy (&self);
    return self;
}

const char *cli_remote_session_id (cli_remote_t *self)
{
    return self->session_id;
}

const char *cli_remote_url (cli_remote_t *self)
{
    return self->url;
}

void cli_remote_set_protocol (cli_remote_t *self, const char *version)
{
    free (self->protocol);
    self->protocol = strdup (version);
}

void cli_remote_set_abort (cli_remote_t *self, volatile sig_atomic_t *flag)
{
    cli_http_set_abort (self->http, flag);
}

static json_t *s_error (int code, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    char message[1024];
    vsnprintf (message, sizeof message, format, args);
    va_end (args);
    return json_pack ("{s:i, s:s}", "code", code, "message", message);
}

typedef struct {
    cli_sse_t *sse;
    json_t *response; //  the stream's message with an id
    cli_remote_notify_fn *notify;
    void *notify_arg;
} s_stream_t;

static void s_on_event (void *arg, const char *event, const char *data)
{
    (void) event; //  MCP's are all "message"
    s_stream_t *s = arg;
    json_t *message = json_loads (data, 0, NULL);
    if (!json_is_object (message)) {
        sbx_warn ("the service sent an event that is not a JSON-RPC message: %.200s", data);
        json_decref (message);
        return;
    }
    if (json_object_get (message, "id") && !json_object_get (message, "method")) {
        json_decref (s->response);
        s->response = message;
        return;
    }
    if (!json_object_get (message, "id") && s->notify)
        s->notify (s->notify_arg, message);
    //  A request from the service: sbx sends none (docs/mcp.md), so it is dropped.
    json_decref (message);
}

static void s_on_body (void *arg, const char *content_type, const char *data, size_t size)
{
    s_stream_t *s = arg;
    if (strncasecmp (content_type, "text/event-stream", 17) == 0) {
        if (!s->sse)
            s->sse = cli_sse_new (s_on_event, s);
        if (s->sse)
            cli_sse_feed (s->sse, data, size);
    }
}

//  A message from the service's answer body (JSON-RPC error body on 4xx included), or NULL.
static json_t *s_body_message (const cli_http_answer_t *answer)
{
    json_t *message = json_loads (answer->body, 0, NULL);
    if (!json_is_object (message)) {
        json_decref (message);
        return NULL;
    }
    return message;
}

//  Says what went wrong with an answer that is not 2xx, as *error.
static json_t *s_status_error (cli_remote_t *self, const cli_http_answer_t *answer)
{
    json_t *message = s_body_message (answer);
    json_t *error = json_object_get (message, "error");
    const char *said = json_string_value (json_object_get (error, "message"));
    json_t *out;
    if (answer->status == 401)
        out = s_error (-32001,
                       "the service at %s refused the API key (401 Unauthorized): check "
                       "SBX_API_KEY (an sbx_… key of an account there: sbx key create --account "
                       "EMAIL)",
                       self->url);
    else if (said)
        out = s_error ((int) json_integer_value (json_object_get (error, "code")),
                       "%s (HTTP %ld from %s)", said, answer->status, self->url);
    else if (answer->status == 404)
        out = s_error (-32000,
                       "%s answered 404 Not Found: check SBX_URL (the service's base "
                       "URL, or its /mcp URL)",
                       self->url);
    else
        out = s_error (-32000, "%s answered HTTP %ld: %.200s", self->url, answer->status,
                       answer->body);
    json_decref (message);
    return out;
}

//  POSTs one message. For a request: its answer message (new reference) or NULL with
//  *error. For a notification: json_null () on 202 (or 200). *gone: the session named
//  was not found (404), so the caller opens a new one.
static json_t *s_post (cli_remote_t *self, json_t *message, bool with_session,
                       cli_remote_notify_fn *notify, void *notify_arg, bool *gone, json_t **error)
{
    *gone = false;
    *error = NULL;
    char *body = json_dumps (message, JSON_COMPACT);
    char *session = with_session && self->session_id
                        ? zsys_sprintf ("Mcp-Session-Id: %s", self->session_id)
                        : NULL;
    char *protocol =
        with_session ? zsys_sprintf ("MCP-Protocol-Version: %s", self->protocol) : NULL;
    const char *headers[] = {self->authorization,
                             "Content-Type: application/json",
                             "Accept: application/json, text/event-stream",
                             session ? session : protocol,
                             session ? protocol : NULL,
                             NULL};
    const char *method = json_string_value (json_object_get (message, "method"));
    s_stream_t stream = {NULL, NULL, notify, notify_arg};
    cli_http_answer_t answer;
    char why[1024];
    int rc = cli_http_request (self->http, "POST", self->url, headers, body, strlen (body),
                               streq (method, "tools/call") ? S_CALL_TIMEOUT_S : S_OTHER_TIMEOUT_S,
                               s_on_body, &stream, &answer, why, sizeof why);
    free (body);
    zstr_free (&session);
    zstr_free (&protocol);
    json_t *out = NULL;
    if (rc) {
        *error = s_error (-32000, "%s; check SBX_URL%s", why,
                          strstr (why, "certificate") || strstr (why, "SSL")
                              ? " and SBX_CA_CERT (the service's CA certificate, PEM)"
                              : "");
    } else if (answer.status == 404 && with_session && self->session_id) {
        *gone = true;
        *error = s_error (-32000, "the service forgot the session");
    } else if (answer.status < 200 || answer.status > 299)
        *error = s_status_error (self, &answer);
    else if (!json_object_get (message, "id"))
        out = json_null ();
    else if (stream.sse) {
        cli_sse_end (stream.sse);
        out = stream.response, stream.response = NULL;
        if (!out)
            *error = s_error (-32000, "%s ended its event stream without an answer", self->url);
    } else {
        out = s_body_message (&answer);
        if (!out)
            *error = s_error (-32000, "%s answered something that is not JSON-RPC (%s): %.200s",
                              self->url, answer.content_type ? answer.content_type : "no type",
                              answer.body);
    }
    if (out && !*error && answer.session_id && streq (method, "initialize")) {
        free (self->session_id);
        self->session_id = strdup (answer.session_id);
    }
    cli_sse_destroy (&stream.sse);
    json_decref (stream.response);
    if (rc == 0)
        cli_http_answer_free (&answer);
    return out;
}

static int s_open (cli_remote_t *self, json_t **error)
{
    json_t *init = json_pack ("{s:s, s:I, s:s, s:{s:s, s:{}, s:{s:s, s:s}}}", "jsonrpc", "2.0",
                              "id", self->next_id++, "method", "initialize", "params",
                              "protocolVersion", self->protocol, "capabilities", "clientInfo",
                              "name", "sbx-mcp", "version", SBX_VERSION);
    bool gone;
    zstr_free (&self->session_id);
    json_t *answer = s_post (self, init, false, NULL, NULL, &gone, error);
    json_decref (init);
    if (!answer)
        return -1;
    json_t *rpc_error = json_object_get (answer, "error");
    if (rpc_error || !self->session_id) {
        *error = rpc_error ? json_incref (rpc_error)
                           : s_error (-32000,
                                      "%s gave no Mcp-Session-Id on initialize; is SBX_URL "
                                      "an sbx service?",
                                      self->url);
        json_decref (answer);
        return -1;
    }
    const char *version =
        json_string_value (json_object_get (json_object_get (answer, "result"), "protocolVersion"));
    if (version)
        cli_remote_set_protocol (self, version);
    json_decref (answer);
    json_t *initialized =
        json_pack ("{s:s, s:s}", "jsonrpc", "2.0", "method", "notifications/initialized");
    answer = s_post (self, initialized, true, NULL, NULL, &gone, error);
    json_decref (initialized);
    if (!answer)
        return -1;
    json_decref (answer);
    sbx_info ("remote session %s opened on %s", self->session_id, self->url);
    return 0;
}

json_t *cli_remote_request (cli_remote_t *self, const char *method, json_t *params,
                            cli_remote_notify_fn *notify, void *notify_arg, json_t **error)
{
    *error = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!self->session_id && s_open (self, error))
            return NULL;
        json_t *request = json_pack ("{s:s, s:I, s:s}", "jsonrpc", "2.0", "id", self->next_id++,
                                     "method", method);
        if (params)
            json_object_set (request, "params", params);
        bool gone;
        json_t *answer = s_post (self, request, true, notify, notify_arg, &gone, error);
        json_decref (request);
        if (gone && attempt == 0) {
            sbx_info ("remote session %s is gone; opening a new one", self->session_id);
            zstr_free (&self->session_id);
            json_decref (*error);
            *error = NULL;
            continue;
        }
        if (!answer)
            return NULL;
        json_t *result = json_object_get (answer, "result");
        if (result)
            json_incref (result);
        else {
            json_t *rpc_error = json_object_get (answer, "error");
            *error = rpc_error
                         ? json_incref (rpc_error)
                         : s_error (-32000, "%s answered neither a result nor an error", self->url);
        }
        json_decref (answer);
        return result;
    }
    return NULL;
}

json_t *cli_remote_tool (cli_remote_t *self, const char *name, json_t *args, char *why,
                         size_t why_size)
{
    json_t *params = json_pack ("{s:s, s:O}", "name", name, "arguments", args);
    json_t *error;
    json_t *result = cli_remote_request (self, "tools/call", params, NULL, NULL, &error);
    json_decref (params);
    if (!result) {
        snprintf (why, why_size, "%s: %s", name,
                  json_string_value (json_object_get (error, "message")));
        json_decref (error);
        return NULL;
    }
    const char *text = json_string_value (
        json_object_get (json_array_get (json_object_get (result, "content"), 0), "text"));
    json_t *structured = json_object_get (result, "structuredContent");
    json_t *out = NULL;
    if (json_is_true (json_object_get (result, "isError")) || !json_is_object (structured))
        snprintf (why, why_size, "%s: %s", name, text ? text : "failed without a message");
    else
        out = json_incref (structured);
    json_decref (result);
    return out;
}

void cli_remote_destroy (cli_remote_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    cli_remote_t *self = *self_p;
    if (self->session_id && self->http) {
        char *session = zsys_sprintf ("Mcp-Session-Id: %s", self->session_id);
        char *protocol = zsys_sprintf ("MCP-Protocol-Version: %s", self->protocol);
        const char *headers[] = {self->authorization, session, protocol, NULL};
        cli_http_answer_t answer;
        char why[1024];
        //  A signal may have stopped the last transfer; the DELETE must still go.
        cli_http_set_abort (self->http, NULL);
        if (cli_http_request (self->http, "DELETE", self->url, headers, NULL, 0, 10, NULL, NULL,
                              &answer, why, sizeof why) == 0) {
            sbx_info ("remote session %s ended (HTTP %ld)", self->session_id, answer.status);
            cli_http_answer_free (&answer);
        } else
            sbx_warn ("could not end the remote session: %s", why);
        zstr_free (&session);
        zstr_free (&protocol);
    }
    cli_http_destroy (&self->http);
    free (self->url);
    free (self->authorization);
    free (self->protocol);
    free (self->session_id);
    free (self);
    *self_p = NULL;
}
