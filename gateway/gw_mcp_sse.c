/*  gw_mcp_sse - see gw_mcp_sse.h */
#include "gw_mcp_sse.h"
#include "gw_jsonload.h"
#include "gw_auth.h"
#include "gw_tools.h"
#include "sbx_idmap.h"
#include "sbx_secret.h"

#include <assert.h>
#include <jansson.h>

#define S_KEEPALIVE_MS 15000
#define S_PER_ACCOUNT  100 //  streams one account may hold open on a gateway

//  One open event stream: the legacy transport's session.
typedef struct {
    gw_mcp_sse_t *sse;
    char *id;
    gw_request_t *stream; //  NULL once the client left
    sbx_caller_t *caller;
    gw_tools_state_t *state; //  its default sandbox and env
    zchunk_t *out;           //  events not yet taken by the stream buffer
    int timer_id;
} s_stream_t;

//  A POST waiting for its credentials, or a tool call waiting for its result.
typedef struct {
    gw_mcp_sse_t *sse;
    uint64_t serial;
    uint64_t req_id;
    char *stream_id;
    json_t *rpc_id;
    uint64_t call; //  the tool call in flight (gw_tools), 0 when none
    uint64_t ask;  //  the POST sent to the other gateways (gw_others), 0 when none
    bool open;     //  GET /sse (else POST /messages)
} s_job_t;

struct gw_mcp_sse_t {
    gw_http_t *http;
    gw_auth_t *auth;
    zloop_t *loop;
    gw_mcp_t *mcp;
    gw_tools_t *tools;
    gw_others_t *others; //  the gateway's (ctx): a POST for a stream another holds
    zhashx_t *streams;   //  id → s_stream_t
    zhashx_t *jobs;      //  serial → s_job_t
    uint64_t next_serial;
    char *tools_json; //  {"tools":[...]}
};

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (job) {
        free (job->stream_id);
        json_decref (job->rpc_id);
        free (job);
        *job_p = NULL;
    }
}

static void s_stream_free (s_stream_t **stream_p)
{
    s_stream_t *s = *stream_p;
    if (s) {
        if (s->timer_id && s->sse->loop)
            zloop_timer_end (s->sse->loop, s->timer_id);
        free (s->id);
        gw_auth_caller_destroy (&s->caller);
        gw_tools_state_unref (&s->state);
        zchunk_destroy (&s->out);
        free (s);
        *stream_p = NULL;
    }
}

//  Writes what the stream buffer takes; the drain callback brings the rest.
static void s_flush (s_stream_t *s)
{
    while (s->stream && zchunk_size (s->out)) {
        size_t n = gw_request_stream_space (s->stream);
        if (n == 0)
            return;
        if (n > zchunk_size (s->out))
            n = zchunk_size (s->out);
        if (gw_request_stream_write (s->stream, zchunk_data (s->out), n) != 0)
            return;
        size_t left = zchunk_size (s->out) - n;
        memmove (zchunk_data (s->out), zchunk_data (s->out) + n, left);
        zchunk_set (s->out, zchunk_data (s->out), left);
    }
}

static void s_emit_text (s_stream_t *s, const char *text)
{
    if (!s->stream || !text)
        return;
    zchunk_extend (s->out, text, strlen (text));
    s_flush (s);
}

//  One JSON-RPC message as a `message` event (compact JSON has no raw newline).
static void s_emit (s_stream_t *s, json_t *msg)
{
    char *json = json_dumps (msg, JSON_COMPACT);
    json_decref (msg);
    char *event = json ? zsys_sprintf ("event: message\ndata: %s\n\n", json) : NULL;
    free (json);
    s_emit_text (s, event);
    zstr_free (&event);
}

static json_t *s_error (json_t *id, int code, const char *message)
{
    char text[700];
    snprintf (text, sizeof text, "%s", message ? message : "error");
    sbx_utf8_sanitize (text);
    return json_pack ("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null (),
                      "error", "code", code, "message", text);
}

static json_t *s_result (json_t *id, json_t *result)
{
    return json_pack ("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

static void s_send_plain (gw_request_t *req, int status, const char *text)
{
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_respond (req, status, "text/plain; charset=utf-8", text, strlen (text));
}

//  --------------------------------------------------------------------------
//  The stream

static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_stream_t *s = arg;
    sbx_info ("mcp sse %.12s… closed by the client", s->id);
    s->stream = NULL;
    zhashx_delete (s->sse->streams, s->id); //  frees it
}

static void s_on_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_flush ((s_stream_t *) arg);
}

static int s_on_keepalive (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_emit_text ((s_stream_t *) arg, ": keepalive\n\n");
    return 0;
}

static size_t s_count (gw_mcp_sse_t *self, const char *account_id)
{
    size_t n = 0;
    for (s_stream_t *s = zhashx_first (self->streams); s; s = zhashx_next (self->streams))
        n += account_id && s->caller->account_id && streq (s->caller->account_id, account_id);
    return n;
}

static void s_open (gw_mcp_sse_t *self, gw_request_t *req, const sbx_caller_t *caller)
{
    if (s_count (self, caller->account_id) >= S_PER_ACCOUNT) {
        s_send_plain (req, 429, "too many open /sse streams for this account; close some");
        return;
    }
    s_stream_t *s = calloc (1, sizeof *s);
    if (!s) {
        s_send_plain (req, 500, "out of memory");
        return;
    }
    s->sse = self;
    s->id = sbx_secret_token ("sse_", 24);
    s->caller = gw_auth_caller_dup (caller);
    s->state = gw_tools_state_new ();
    s->out = zchunk_new (NULL, 0);
    gw_request_add_header (req, "Cache-Control", "no-cache, no-transform");
    gw_request_add_header (req, "X-Accel-Buffering", "no");
    if (!s->id || !s->caller || !s->state || !s->out ||
        gw_request_stream_start (req, 200, "text/event-stream") != 0) {
        s_stream_free (&s);
        gw_request_stream_end (req);
        return;
    }
    s->stream = req;
    zhashx_insert (self->streams, s->id, s);
    gw_request_set_closed_fn (req, s_on_closed, s);
    gw_request_set_drain_fn (req, s_on_drain, s);
    if (self->loop)
        s->timer_id = zloop_timer (self->loop, S_KEEPALIVE_MS, 0, s_on_keepalive, s);
    char *event = zsys_sprintf ("event: endpoint\ndata: /messages?sessionId=%s\n\n", s->id);
    s_emit_text (s, event);
    zstr_free (&event);
    sbx_info ("mcp sse %.12s… opened for %s", s->id, caller->account_id ? caller->account_id : "?");
}

//  --------------------------------------------------------------------------
//  Messages

static void s_on_tool_done (json_t *result, int rpc_code, const char *rpc_message, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_sse_t *self = job->sse;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    s_stream_t *s = zhashx_lookup (self->streams, job->stream_id);
    if (s) {
        //  The stream is the session, on this gateway: nothing is kept elsewhere.
        for (gw_tools_change_t *change; (change = gw_tools_state_take (s->state));)
            gw_tools_change_destroy (&change);
        s_emit (s, result ? s_result (job->rpc_id, json_incref (result))
                          : s_error (job->rpc_id, rpc_code, rpc_message));
    } else
        sbx_info ("mcp sse: a result for a stream that is gone; dropped");
    json_decref (result);
    s_job_free (&job);
}

//  notifications/cancelled: the call with that id on stream s ends unanswered (a
//  foreground exec is killed). An id unknown or answered already is ignored, as the
//  spec lets a receiver do.
static void s_cancel (gw_mcp_sse_t *self, s_stream_t *s, json_t *request_id)
{
    for (s_job_t *job = zhashx_first (self->jobs); job && request_id;
         job = zhashx_next (self->jobs)) {
        if (job->call && job->stream_id && streq (job->stream_id, s->id) &&
            json_equal (job->rpc_id, request_id)) {
            sbx_info ("mcp sse %.12s… the client cancelled a tool call", s->id);
            zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
            gw_tools_abandon (self->tools, job->call);
            s_job_free (&job);
            return;
        }
    }
}

//  One JSON-RPC message of stream s (its answer, if any, goes to the stream).
static void s_message (gw_mcp_sse_t *self, s_stream_t *s, json_t *msg)
{
    json_t *id = json_object_get (msg, "id");
    const char *method = json_string_value (json_object_get (msg, "method"));
    json_t *params = json_object_get (msg, "params");
    if (!method)
        return; //  a response to us (we send no requests) or a notification without name
    if (!id) {
        if (streq (method, "notifications/cancelled"))
            s_cancel (self, s, json_object_get (params, "requestId"));
        return; //  notifications/initialized and the others: nothing to answer
    }
    if (!json_is_string (id) && !json_is_integer (id)) {
        s_emit (s, s_error (NULL, -32600, "Invalid Request: id must be a string or number"));
        return;
    }
    if (params && !json_is_object (params)) {
        s_emit (s, s_error (id, -32602, "Invalid params: params must be an object"));
        return;
    }
    if (streq (method, "initialize")) {
        //  The legacy transport's clients may speak 2024-11-05: it is answered as asked.
        const char *asked = json_string_value (json_object_get (params, "protocolVersion"));
        const char *version =
            asked && streq (asked, "2024-11-05") ? asked : gw_mcp_negotiate (asked);
        s_emit (s, s_result (id, json_pack ("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}",
                                            "protocolVersion", version, "capabilities", "tools",
                                            "listChanged", 0, "serverInfo", "name", "sbx", "title",
                                            "sbx", "version", SBX_VERSION, "instructions",
                                            gw_mcp_instructions ())));
    } else if (streq (method, "ping"))
        s_emit (s, s_result (id, json_object ()));
    else if (streq (method, "tools/list"))
        s_emit (s, s_result (id, json_pack ("{s:O}", "tools", gw_tools_list (self->tools))));
    else if (streq (method, "tools/call")) {
        json_t *tool = json_object_get (params, "name");
        gw_auth_limit_t limit;
        if (!json_is_string (tool)) {
            s_emit (s, s_error (id, -32602, "Invalid params: name is required"));
            return;
        }
        if (gw_auth_take (self->auth, s->caller, &limit)) {
            char text[200];
            snprintf (text, sizeof text,
                      "this key may make %llu requests per second; retry in %llu s "
                      "(rate_limited)",
                      (unsigned long long) limit.limit, (unsigned long long) limit.reset_s);
            s_emit (s, s_result (id, json_pack ("{s:[{s:s, s:s}], s:b}", "content", "type", "text",
                                                "text", text, "isError", 1)));
            return;
        }
        s_job_t *job = calloc (1, sizeof *job);
        if (!job) {
            s_emit (s, s_error (id, -32603, "out of memory"));
            return;
        }
        job->sse = self;
        job->serial = self->next_serial++;
        job->stream_id = strdup (s->id);
        job->rpc_id = json_incref (id);
        zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
        sbx_log (gw_tools_read_only (self->tools, json_string_value (tool)) ? SBX_LOG_DEBUG
                                                                            : SBX_LOG_INFO,
                 "mcp sse %.12s… %s tools/call %s", s->id,
                 s->caller->account_id ? s->caller->account_id : "?", json_string_value (tool));
        uint64_t serial = job->serial;
        uint64_t call = gw_tools_call (self->tools, s->caller, s->state, json_string_value (tool),
                                       json_object_get (params, "arguments"), s_on_tool_done, job);
        if (call && (job = zhashx_lookup (self->jobs, (void *) (uintptr_t) serial)))
            job->call = call; //  still running: cancellable
    } else {
        char text[200];
        snprintf (text, sizeof text, "Method not found: %.100s", method);
        s_emit (s, s_error (id, -32601, text));
    }
}

#define S_NO_STREAM "no such stream: open one with GET /sse"

static bool s_same_account (s_stream_t *s, const sbx_caller_t *caller)
{
    return s->caller->account_id && caller && caller->account_id &&
           streq (s->caller->account_id, caller->account_id);
}

//  One JSON-RPC 2.0 message, or NULL.
static json_t *s_load_message (const char *text, size_t size)
{
    json_t *msg = gw_jsonload (text, size, NULL);
    const char *version = json_string_value (json_object_get (msg, "jsonrpc"));
    if (json_is_object (msg) && version && streq (version, "2.0"))
        return msg;
    json_decref (msg);
    return NULL;
}

//  A POST for a stream another gateway holds: taken there (202), or none holds it (404).
static void s_on_others (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_sse_t *self = job->sse;
    zhashx_delete (self->jobs, SBX_ID (job->serial));
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    s_job_free (&job);
    if (!req)
        return; //  the client left meanwhile
    if (reply && reply->type == SBX_MSG_SSE_MESSAGE_OK)
        s_send_plain (req, 202, "Accepted");
    else if (code == SBX_E_NOT_FOUND)
        s_send_plain (req, 404, S_NO_STREAM);
    else if (code == SBX_E_INVALID_ARGUMENT)
        s_send_plain (req, 400, message ? message : "the message was refused");
    else
        s_send_plain (req, 503,
                      "the gateway that holds this stream cannot be reached now; "
                      "retry later");
}

static void s_ask_others (gw_mcp_sse_t *self, gw_request_t *req, const sbx_caller_t *caller,
                          const char *stream_id)
{
    s_job_t *job = calloc (1, sizeof *job);
    sbx_msg_t *ask = sbx_msg_new (SBX_MSG_SSE_MESSAGE);
    char *text = malloc (gw_request_body_size (req) + 1);
    if (!job || !ask || !text) {
        free (job);
        free (text);
        sbx_msg_destroy (&ask);
        s_send_plain (req, 500, "out of memory");
        return;
    }
    memcpy (text, gw_request_body (req), gw_request_body_size (req));
    text[gw_request_body_size (req)] = 0;
    sbx_msg_sse_message (ask)->message = text;
    sbx_str_set (&sbx_msg_sse_message (ask)->stream_id, stream_id);
    job->sse = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    zhashx_insert (self->jobs, SBX_ID (job->serial), job);
    char what[100], key[80];
    snprintf (what, sizeof what, "MCP stream %.12s…", stream_id);
    snprintf (key, sizeof key, "sse:%s", stream_id);
    GW_KEEP (job->ask, gw_others_ask (self->others, caller, &ask, key, what, s_on_others, job));
}

sbx_msg_t *gw_mcp_sse_serve (gw_mcp_sse_t *self, const sbx_msg_t *request)
{
    assert (request->type == SBX_MSG_SSE_MESSAGE);
    sbx_sse_message_t *args = sbx_msg_sse_message ((sbx_msg_t *) request);
    s_stream_t *s = args->stream_id ? zhashx_lookup (self->streams, args->stream_id) : NULL;
    if (!s || !s_same_account (s, request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, S_NO_STREAM);
    //  The other gateway checked the message; a peer is untrusted all the same.
    json_t *msg = args->message ? s_load_message (args->message, strlen (args->message)) : NULL;
    if (!msg)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "the body must be one JSON-RPC 2.0 message");
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SSE_MESSAGE_OK);
    s_message (self, s, msg);
    json_decref (msg);
    return reply ? reply : sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
}

//  A POST whose credentials were checked: to its stream here, or to the gateway that
//  holds it.
static void s_post (gw_mcp_sse_t *self, gw_request_t *req, const sbx_caller_t *caller,
                    const char *stream_id)
{
    s_stream_t *s = stream_id ? zhashx_lookup (self->streams, stream_id) : NULL;
    //  Another account's stream is as good as none.
    if (s && !s_same_account (s, caller)) {
        s_send_plain (req, 404, S_NO_STREAM);
        return;
    }
    json_t *msg = s_load_message ((const char *) gw_request_body (req), gw_request_body_size (req));
    if (!msg) {
        s_send_plain (req, 400, "the body must be one JSON-RPC 2.0 message");
        return;
    }
    if (s) {
        s_send_plain (req, 202, "Accepted");
        s_message (self, s, msg);
    } else if (stream_id && strlen (stream_id) <= 64) //  (the longest id gateways.json takes)
        s_ask_others (self, req, caller, stream_id);
    else
        s_send_plain (req, 404, S_NO_STREAM);
    json_decref (msg);
}

//  --------------------------------------------------------------------------
//  Routes

//  GET /sse or POST /messages, once its credentials were checked.
static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    (void) message;
    s_job_t *job = arg;
    gw_mcp_sse_t *self = job->sse;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (req) { //  (else the client left meanwhile)
        if (!caller && code == SBX_E_UNAUTHENTICATED)
            gw_auth_respond_401 (self->auth, req);
        else if (!caller)
            s_send_plain (req, code == SBX_E_INVALID_ARGUMENT ? 400 : 503,
                          "cannot check credentials now; retry later");
        else if (job->open)
            s_open (self, req, caller);
        else
            s_post (self, req, caller, job->stream_id);
    }
    s_job_free (&job);
}

static void s_route (gw_request_t *req, void *arg)
{
    gw_mcp_sse_t *self = arg;
    bool open = streq (gw_request_path (req), "/sse");
    const char *method = gw_request_method (req);
    if (!gw_mcp_origin_allowed (self->mcp, gw_request_header (req, "Origin"))) {
        s_send_plain (req, 403, "Forbidden: this Origin may not use MCP (see mcp.origins)");
        return;
    }
    if (!streq (method, open ? "GET" : "POST")) {
        gw_request_add_header (req, "Allow", open ? "GET" : "POST");
        s_send_plain (req, 405, open ? "use GET /sse" : "use POST /messages?sessionId=…");
        return;
    }
    const char *token = gw_auth_bearer (gw_request_header (req, "Authorization"));
    if (!token) {
        gw_auth_respond_401 (self->auth, req);
        return;
    }
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        s_send_plain (req, 500, "out of memory");
        return;
    }
    job->sse = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    const char *id = gw_request_query (req, "sessionId");
    job->stream_id = open || !id ? NULL : strndup (id, 64);
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    job->open = open;
    gw_auth_check (self->auth, token, s_on_auth, job);
}

gw_mcp_sse_t *gw_mcp_sse_new (gw_ctx_t *ctx, gw_mcp_t *mcp)
{
    assert (ctx && mcp);
    gw_mcp_sse_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = ctx->http;
    self->auth = ctx->auth;
    self->loop = ctx->loop;
    self->mcp = mcp;
    self->others = ctx->others;
    self->next_serial = 1;
    self->tools = gw_tools_new (ctx);
    self->streams = zhashx_new ();
    self->jobs = sbx_idmap_new ();
    if (!self->tools || !self->streams || !self->jobs ||
        gw_router_add (ctx->router, "/sse", false, s_route, self) ||
        gw_router_add (ctx->router, "/messages", false, s_route, self)) {
        gw_mcp_sse_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->streams, (czmq_destructor *) s_stream_free);
    return self;
}

void gw_mcp_sse_destroy (gw_mcp_sse_t **self_p)
{
    assert (self_p);
    gw_mcp_sse_t *self = *self_p;
    if (!self)
        return;
    //  Calls first (their callbacks must find nothing), then the streams.
    gw_tools_destroy (&self->tools);
    if (self->jobs) {
        for (s_job_t *job = zhashx_first (self->jobs); job; job = zhashx_next (self->jobs)) {
            gw_others_cancel (self->others, job->ask);
            s_job_free (&job);
        }
        zhashx_destroy (&self->jobs);
    }
    if (self->streams) {
        for (s_stream_t *s = zhashx_first (self->streams); s; s = zhashx_next (self->streams))
            if (s->stream) {
                gw_request_set_closed_fn (s->stream, NULL, NULL);
                gw_request_stream_end (s->stream);
                s->stream = NULL;
            }
        zhashx_destroy (&self->streams);
    }
    free (self->tools_json);
    free (self);
    *self_p = NULL;
}

size_t gw_mcp_sse_size (gw_mcp_sse_t *self)
{
    return self ? zhashx_size (self->streams) : 0;
}

//  --------------------------------------------------------------------------
//  Self test: what needs no socket.

void gw_mcp_sse_test (bool verbose)
{
    (void) verbose;
    gw_ctx_t *ctx = gw_ctx_new (NULL, NULL, NULL, NULL);
    gw_mcp_t *mcp = ctx ? gw_mcp_new (ctx) : NULL;
    assert (mcp);
    gw_mcp_sse_t *sse = gw_mcp_sse_new (ctx, mcp);
    assert (sse && gw_mcp_sse_size (sse) == 0);
    //  A message's answers land on its stream's buffer (no client here to take them).
    s_stream_t *s = calloc (1, sizeof *s);
    s->sse = sse;
    s->id = strdup ("sse_test");
    s->out = zchunk_new (NULL, 0);
    s->stream = NULL;
    json_t *ping = json_pack ("{s:s, s:i, s:s}", "jsonrpc", "2.0", "id", 3, "method", "ping");
    s_message (sse, s, ping); //  no stream: nothing is written, nothing breaks
    assert (zchunk_size (s->out) == 0);
    json_decref (ping);

    //  A message another gateway sends on (sse.message): for the stream's account only,
    //  and one JSON-RPC message.
    s->caller = calloc (1, sizeof (sbx_caller_t));
    sbx_str_set (&s->caller->account_id, "acc_a");
    zhashx_insert (sse->streams, s->id, s);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SSE_MESSAGE);
    request->rid = 7;
    request->caller = calloc (1, sizeof (sbx_caller_t));
    sbx_str_set (&request->caller->account_id, "acc_b");
    sbx_str_set (&sbx_msg_sse_message (request)->stream_id, "sse_test");
    sbx_str_set (&sbx_msg_sse_message (request)->message,
                 "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}");
    sbx_msg_t *reply = gw_mcp_sse_serve (sse, request);
    assert (reply->type == SBX_MSG_ERROR && reply->rid == 7 &&
            sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    sbx_str_set (&request->caller->account_id, "acc_a");
    reply = gw_mcp_sse_serve (sse, request);
    assert (reply->type == SBX_MSG_SSE_MESSAGE_OK && reply->rid == 7);
    sbx_msg_destroy (&reply);
    sbx_str_set (&sbx_msg_sse_message (request)->message, "[1]");
    reply = gw_mcp_sse_serve (sse, request);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    zhashx_delete (sse->streams, "sse_test"); //  frees it
    gw_mcp_sse_destroy (&sse);
    gw_mcp_destroy (&mcp);
    gw_ctx_destroy (&ctx);
    assert (!sse);
}
