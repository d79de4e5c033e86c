/*  gw_mcp - see gw_mcp.h */
#include "gw_mcp.h"
#include "gw_b64_stream.h"
#include "gw_jsonload.h"
#include "sbx_idmap.h"
#include "sbx_xfer.h"
#include "gw_auth.h"
#include "gw_mcp_era.h"
#include "gw_mcp_sessions.h"
#include "gw_tools.h"

#include <assert.h>
#include <jansson.h>

#define S_LATEST "2025-06-18"
//  Progress on a streamed tools/call: the first soon, so a client sees the call is
//  alive, then at twice the time so far (1, 2, 4, 8 s), at most every S_PROGRESS_EVERY_MS.
#ifndef S_PROGRESS_FIRST_MS
#define S_PROGRESS_FIRST_MS 1000
#endif
#ifndef S_PROGRESS_EVERY_MS
#define S_PROGRESS_EVERY_MS 5000
#endif

static const char *s_versions[] = {"2025-06-18", "2025-03-26", "2025-11-25", NULL};

static const char *s_instructions =
    "Tools for sbx sandboxes: Linux microVMs with root and network access.\n"
    "Call create_sandbox first; every other tool then defaults to the sandbox this session "
    "created or used last (delete_sandbox always needs the exact sandboxId). exec runs a shell "
    "command and waits up to 120 s (timeout, at most 600); for servers and long jobs use "
    "detached: true and poll command_status with the offsets it returns (list_commands lists "
    "them all). Sandboxes stop by "
    "themselves after ttlSeconds (default 1 hour); stop_sandbox keeps memory and "
    "resume_sandbox continues where it was.";

//  The same for the stateless era, whose default sandbox is the credential's.
static const char *s_instructions_modern =
    "Tools for sbx sandboxes: Linux microVMs with root and network access.\n"
    "Call create_sandbox first; every other tool then defaults to the sandbox this API key "
    "(or connection) created or used last (delete_sandbox always needs the exact sandboxId). "
    "exec runs a shell command and waits up to 120 s (timeout, at most 600); for servers and "
    "long jobs use detached: true and poll command_status with the offsets it returns "
    "(list_commands lists them all). "
    "Sandboxes stop by themselves after ttlSeconds (default 1 hour); stop_sandbox keeps memory "
    "and resume_sandbox continues where it was.";

//  How long a stateless client may keep discover's and tools/list's answers: they change
//  only with the gateway's version, and they are the same for every caller.
#define S_LIST_TTL_MS 3600000

//  A request waiting for gw_auth, for its session (fetched, opened or ended), for a
//  tool call, then for the call's changes to reach the broker.
typedef struct {
    gw_mcp_t *mcp;
    uint64_t serial;
    uint64_t req_id;
    json_t *rpc_id;
    char *tool;
    sbx_caller_t *caller;    //  kept while the request waits for its session
    char *session_id;        //  a tools/call of a session: its changes are synced
    gw_tools_state_t *state; //  that session's state
    bool modern;             //  a 2026-07-28 request: results carry resultType
    uint64_t call;           //  the tool call in flight (gw_tools), 0 when none
    json_t *params;          //  a stateless tools/call waiting for its credential's state
    //  The call's answer, held while its changes go to the broker.
    json_t *result;
    int rpc_code;
    char *rpc_message;
    //  A tools/call answered as SSE (see s_stream_start): the request, held until the
    //  stream ends or the client leaves (then NULL), and what still has to go out.
    bool sse;
    gw_request_t *stream;
    json_t *progress_token;
    int timer_id;    //  0: none armed
    unsigned due_ms; //  when the armed progress is due, from the start
    uint64_t started_mono;
    json_int_t progress;
    bool finished; //  the response is queued: end the stream once it is written
    char *out;
    size_t out_size;
    size_t out_sent;
    //  A read_file answered as application/json while the file is read (s_on_read).
    gw_b64_stream_t *b64;
} s_job_t;

#define S_SENT     32   //  tool results remembered with their text
#define S_SENT_MAX 8192 //  longer ones are not

struct gw_mcp_t {
    sbx_config_t *config;
    zloop_t *loop;
    gw_http_t *http;
    gw_auth_t *auth; //  the gateway's (ctx)
    gw_tools_t *tools;
    gw_mcp_sessions_t *sessions; //  the gateway's copies of the broker's MCP sessions (ctx)
    zhashx_t *jobs;              //  serial → s_job_t
    uint64_t next_serial;
    char *own_origin;
    zlistx_t *origins;       //  allowed Origin values besides our own
    char *tools_json;        //  {"tools":[...]} serialised once: the list never changes
    char *tools_modern_json; //  the same for 2026-07-28, with resultType and cache hints
    //  Tool results lately sent and their text: the read copy (gw_cache) hands out one
    //  get_sandbox result object per sandbox again and again, serialised once here. A
    //  reference is held, so an address is never another object's while it is listed.
    struct {
        json_t *result;
        char *text;
    } sent[S_SENT];
    size_t sent_next;
};

const char *gw_mcp_instructions (void)
{
    return s_instructions;
}

const char *gw_mcp_negotiate (const char *requested)
{
    for (int i = 0; requested && s_versions[i]; i++)
        if (streq (requested, s_versions[i]))
            return s_versions[i];
    return S_LATEST;
}

static bool s_version_known (const char *version)
{
    for (int i = 0; s_versions[i]; i++)
        if (streq (version, s_versions[i]))
            return true;
    return false;
}

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (job) {
        if (job->timer_id)
            zloop_timer_end (job->mcp->loop, job->timer_id);
        json_decref (job->rpc_id);
        json_decref (job->progress_token);
        json_decref (job->result);
        json_decref (job->params);
        free (job->rpc_message);
        gw_auth_caller_destroy (&job->caller);
        free (job->session_id);
        gw_tools_state_unref (&job->state);
        free (job->tool);
        free (job->out);
        gw_b64_stream_end (&job->b64, false, NULL); //  unfinished: the body is cut
        free (job);
    }
    *job_p = NULL;
}

static void s_route (gw_request_t *req, void *arg)
{
    gw_mcp_handle ((gw_mcp_t *) arg, req);
}

gw_mcp_t *gw_mcp_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_mcp_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    sbx_config_t *config = ctx->config;
    self->config = config;
    self->loop = ctx->loop;
    self->http = ctx->http;
    self->next_serial = 1;
    self->auth = ctx->auth;
    self->sessions = ctx->mcp_sessions;
    self->tools = gw_tools_new (ctx);
    self->jobs = sbx_idmap_new ();
    self->origins = zlistx_new ();
    if (!self->tools || !self->jobs || !self->origins ||
        gw_router_add (ctx->router, "/mcp", false, s_route, self)) {
        gw_mcp_destroy (&self);
        return NULL;
    }
    zlistx_set_destructor (self->origins, (czmq_destructor *) zstr_free);
    zlistx_set_duplicator (self->origins, (czmq_duplicator *) strdup);
    self->own_origin = strdup (gw_auth_base_url (self->auth));
    const char *list = config ? sbx_config_get (config, "mcp.origins", "") : "";
    char *copy = strdup (list ? list : "");
    for (char *save = NULL, *word = strtok_r (copy, " ,", &save); word;
         word = strtok_r (NULL, " ,", &save))
        zlistx_add_end (self->origins, word);
    free (copy);
    return self;
}

void gw_mcp_destroy (gw_mcp_t **self_p)
{
    assert (self_p);
    gw_mcp_t *self = *self_p;
    if (!self)
        return;
    //  Pending callbacks are forgotten first, then what they would have used.
    gw_tools_destroy (&self->tools);
    if (self->jobs) {
        for (s_job_t *job = zhashx_first (self->jobs); job; job = zhashx_next (self->jobs)) {
            //  A stream still held (http outlives us) is ended, so no callback finds us.
            if (job->stream)
                gw_request_stream_end (job->stream);
            else if (job->modern && self->http) {
                //  A 2026 call's request watches for its client leaving: not any more.
                gw_request_t *req = gw_http_request (self->http, job->req_id);
                if (req)
                    gw_request_set_closed_fn (req, NULL, NULL);
            }
            s_job_free (&job);
        }
        zhashx_destroy (&self->jobs);
    }
    zlistx_destroy (&self->origins);
    free (self->own_origin);
    for (size_t i = 0; i < S_SENT; i++) {
        json_decref (self->sent[i].result);
        free (self->sent[i].text);
    }
    free (self->tools_json);
    free (self->tools_modern_json);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Answers

static void s_send_json (gw_request_t *req, int status, json_t *body)
{
    char *text = json_dumps (body, JSON_COMPACT);
    json_decref (body);
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_respond (req, status, "application/json", text, text ? strlen (text) : 0);
    free (text);
}

static void s_send_result (gw_request_t *req, json_t *id, json_t *result)
{
    s_send_json (req, 200,
                 json_pack ("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null (),
                            "result", result));
}

//  tools/list: 18 definitions that never change, serialised once rather than per call
//  (it was most of the gateway's time under load, see docs/benchmarks.md).
//  A result already serialised, around the request's id.
static void s_send_result_text (gw_request_t *req, json_t *id, const char *result)
{
    char *id_text = json_dumps (id ? id : json_null (), JSON_COMPACT | JSON_ENCODE_ANY);
    char *text = NULL;
    if (!result || !id_text ||
        asprintf (&text, "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}", id_text, result) < 0)
        text = NULL;
    free (id_text);
    gw_request_add_header (req, "Cache-Control", "no-store");
    if (text)
        gw_request_respond (req, 200, "application/json", text, strlen (text));
    else
        gw_request_respond (req, 500, "application/json", "{}", 2);
    free (text);
}

//  What every 2026-07-28 result carries first: resultType and who answers.
#define S_MODERN_HEAD                                                                              \
    "\"resultType\":\"complete\",\"_meta\":{\"" GW_MCP_META_SERVER                                 \
    "\":{\"name\":\"sbx\",\"title\":\"sbx\",\"version\":\"" SBX_VERSION "\"}}"

//  A result serialised for the 2025 era, as the stateless era has it (a fresh string).
static char *s_modern_text (const char *result)
{
    char *text = NULL;
    if (!result || result[0] != '{')
        return NULL;
    bool empty = streq (result, "{}");
    if (asprintf (&text, "{" S_MODERN_HEAD "%s%s", empty ? "" : ",", result + 1) < 0)
        return NULL;
    return text;
}

//  A result (borrowed) as the stateless era has it: a shallow copy with its head.
static json_t *s_modern_result (json_t *result)
{
    json_t *copy = json_copy (result);
    json_object_set_new (copy, "resultType", json_string ("complete"));
    json_object_set_new (copy, "_meta",
                         json_pack ("{s:{s:s, s:s, s:s}}", GW_MCP_META_SERVER, "name", "sbx",
                                    "title", "sbx", "version", SBX_VERSION));
    return copy;
}

static void s_send_result_modern (gw_request_t *req, json_t *id, json_t *result)
{
    json_t *modern = s_modern_result (result);
    json_decref (result);
    s_send_result (req, id, modern);
}

static void s_send_tools (gw_mcp_t *self, gw_request_t *req, json_t *id)
{
    if (!self->tools_json) {
        json_t *result = json_pack ("{s:O}", "tools", gw_tools_list (self->tools));
        self->tools_json = json_dumps (result, JSON_COMPACT);
        json_decref (result);
    }
    s_send_result_text (req, id, self->tools_json);
}

//  tools/list in the stateless era: the same list, with resultType and cache hints.
static void s_send_tools_modern (gw_mcp_t *self, gw_request_t *req, json_t *id)
{
    if (!self->tools_modern_json) {
        json_t *result = json_pack ("{s:O, s:i, s:s}", "tools", gw_tools_list (self->tools),
                                    "ttlMs", S_LIST_TTL_MS, "cacheScope", "public");
        char *text = json_dumps (result, JSON_COMPACT);
        self->tools_modern_json = s_modern_text (text);
        free (text);
        json_decref (result);
    }
    s_send_result_text (req, id, self->tools_modern_json);
}

//  json_dumps (value, JSON_COMPACT), byte for byte, made faster for long strings: jansson
//  escapes a string one code point at a time through a callback per piece (most of the
//  gateway's CPU for a command_status with 1 MiB of stdout or a 10 MiB read_file, where
//  the result holds the bytes twice); here runs of bytes that need no escape are copied
//  whole (jansson's strings are valid UTF-8, which goes out as it is).
//  Written to a buffer that realloc doubles: glibc moves a large block by remapping its
//  pages, where open_memstream and asprintf copied and zero-filled the text at every
//  growth (half of a 10 MiB read_file's gateway CPU, in page faults: docs/benchmarks.md).
typedef struct {
    char *data; //  NUL-terminated
    size_t size;
    size_t cap;
    bool failed; //  out of memory, or a number that could not be written
} s_buf_t;

static void s_put (s_buf_t *out, const char *data, size_t size)
{
    if (!size || out->failed)
        return;
    if (out->size + size + 1 > out->cap) {
        size_t cap = out->cap ? out->cap : 4096;
        while (cap < out->size + size + 1)
            cap *= 2;
        char *grown = realloc (out->data, cap);
        if (!grown) {
            out->failed = true;
            return;
        }
        out->data = grown;
        out->cap = cap;
        sbx_xfer_advise_huge (grown, cap); //  a read_file's answer: megabytes
    }
    memcpy (out->data + out->size, data, size);
    out->size += size;
    out->data[out->size] = 0;
}

static void s_put_string (s_buf_t *out, const char *text, size_t size)
{
    s_put (out, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char) text[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        s_put (out, text + run, i - run);
        run = i + 1;
        char escape[8];
        const char *named = c == '"'    ? "\\\""
                            : c == '\\' ? "\\\\"
                            : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f"
                            : c == '\n' ? "\\n"
                            : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t"
                                        : NULL;
        if (!named) {
            snprintf (escape, sizeof escape, "\\u%04X", c);
            named = escape;
        }
        s_put (out, named, strlen (named));
    }
    s_put (out, text + run, size - run);
    s_put (out, "\"", 1);
}

static void s_put_value (s_buf_t *out, json_t *value)
{
    switch (json_typeof (value)) {
    case JSON_OBJECT: {
        s_put (out, "{", 1);
        const char *key;
        json_t *member;
        bool first = true;
        json_object_foreach (value, key, member)
        {
            if (!first)
                s_put (out, ",", 1);
            first = false;
            s_put_string (out, key, strlen (key));
            s_put (out, ":", 1);
            s_put_value (out, member);
        }
        s_put (out, "}", 1);
        break;
    }
    case JSON_ARRAY:
        s_put (out, "[", 1);
        for (size_t i = 0; i < json_array_size (value); i++) {
            if (i)
                s_put (out, ",", 1);
            s_put_value (out, json_array_get (value, i));
        }
        s_put (out, "]", 1);
        break;
    case JSON_STRING:
        s_put_string (out, json_string_value (value), json_string_length (value));
        break;
    default: {
        //  Numbers, true, false, null: as jansson writes them.
        char *text = json_dumps (value, JSON_COMPACT | JSON_ENCODE_ANY);
        if (text)
            s_put (out, text, strlen (text));
        else
            out->failed = true;
        free (text);
    }
    }
}

//  The text (the caller frees it), or NULL when out of memory.
static char *s_dump (json_t *value)
{
    s_buf_t out = {0};
    s_put_value (&out, value);
    s_put (&out, "", 0);
    if (out.failed || !out.data) {
        free (out.data);
        return NULL;
    }
    return out.data;
}

//  A tool's response, serialised into out: {"jsonrpc":"2.0","id":…,"result":…}, the
//  result as 2026-07-28 has it when modern. listed: a short result is listed with its
//  text (see sent). A new result is written once, inside its envelope, and handed to
//  the server as it is: a 10 MiB read_file is not copied again on its way out.
static void s_tool_response (gw_mcp_t *self, s_buf_t *out, json_t *id, json_t *result, bool modern,
                             bool listed)
{
    char *id_text = json_dumps (id ? id : json_null (), JSON_COMPACT | JSON_ENCODE_ANY);
    if (!id_text)
        out->failed = true;
    s_put (out, "{\"jsonrpc\":\"2.0\",\"id\":", 22);
    s_put (out, id_text ? id_text : "", id_text ? strlen (id_text) : 0);
    s_put (out, ",\"result\":", 10);
    free (id_text);
    size_t at = out->size;
    s_put_value (out, result);
    size_t end = out->size;
    if (listed && !out->failed && end - at <= S_SENT_MAX) {
        //  Listed as the 2025 era has it (resent with its head when modern).
        size_t slot = self->sent_next++ % S_SENT;
        char *text = strndup (out->data + at, end - at);
        if (text) {
            json_decref (self->sent[slot].result);
            free (self->sent[slot].text);
            self->sent[slot].result = json_incref (result);
            self->sent[slot].text = text;
        }
    }
    if (modern && !out->failed) {
        //  The head goes first inside the result object: moved up once, rare and short
        //  when large (modern clients' tool results).
        bool empty = end - at == 2;
        const char *head = empty ? S_MODERN_HEAD : S_MODERN_HEAD ",";
        size_t len = strlen (head);
        s_put (out, head, len); //  grows the buffer; the bytes are placed below
        if (!out->failed) {
            memmove (out->data + at + 1 + len, out->data + at + 1, end - at - 1);
            memcpy (out->data + at + 1, head, len);
        }
    }
    s_put (out, "}", 1);
}

//  A tool's result (taken): its text from the sent list when the same object went out
//  lately, else serialised (and listed when short). modern: as 2026-07-28 has it.
static void s_send_tool_result (gw_mcp_t *self, gw_request_t *req, json_t *id, json_t *result,
                                bool modern)
{
    for (size_t i = 0; i < S_SENT; i++)
        if (self->sent[i].result == result) {
            char *head = modern ? s_modern_text (self->sent[i].text) : NULL;
            s_send_result_text (req, id, modern ? head : self->sent[i].text);
            free (head);
            json_decref (result);
            return;
        }
    s_buf_t out = {0};
    s_tool_response (self, &out, id, result, modern, true);
    json_decref (result);
    gw_request_add_header (req, "Cache-Control", "no-store");
    if (out.failed || !out.data) {
        free (out.data);
        gw_request_respond (req, 500, "application/json", "{}", 2);
        return;
    }
    void *body = out.data;
    gw_request_respond_take (req, 200, "application/json", &body, out.size);
}

//  A JSON-RPC error response. Messages quote the client (a header, a method, a tool
//  name, a parse error near its bytes), cut at a limit: they are made UTF-8 first, or
//  json_pack refuses them and the answer goes out empty (fuzz_mcp found that).
static json_t *s_error_response (json_t *id, int code, const char *message)
{
    char text[700];
    snprintf (text, sizeof text, "%s", message ? message : "error");
    sbx_utf8_sanitize (text);
    return json_pack ("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null (),
                      "error", "code", code, "message", text);
}

static void s_send_error (gw_request_t *req, int status, json_t *id, int code, const char *message)
{
    s_send_json (req, status, s_error_response (id, code, message));
}

//  --------------------------------------------------------------------------
//  Methods

//  --------------------------------------------------------------------------
//  A tools/call answered as an SSE stream: the client sent a progressToken and accepts
//  text/event-stream. Each JSON-RPC message is one `message` event: progress
//  notifications while the call runs, then the response, then the stream ends.

static bool s_accepts_sse (const char *accept)
{
    return accept && strcasestr (accept, "text/event-stream");
}

//  The delay before the next progress after one due `due_ms` after the start.
static unsigned s_progress_next (unsigned due_ms)
{
    return due_ms < S_PROGRESS_EVERY_MS ? due_ms : S_PROGRESS_EVERY_MS;
}

//  "event: message\ndata: <json>\n\n" (compact JSON has no raw newline), or NULL.
static char *s_sse_event (json_t *msg)
{
    char *json = json_dumps (msg, JSON_COMPACT);
    char *event = json ? zsys_sprintf ("event: message\ndata: %s\n\n", json) : NULL;
    free (json);
    return event;
}

static void s_stream_done (s_job_t *job)
{
    zhashx_delete (job->mcp->jobs, (void *) (uintptr_t) job->serial);
    s_job_free (&job);
}

//  Writes what fits; the drain callback brings the rest (a large result can exceed the
//  stream buffer). Ends the stream once the response is out.
static void s_stream_flush (s_job_t *job)
{
    while (job->stream && job->out_sent < job->out_size) {
        size_t left = job->out_size - job->out_sent;
        size_t n = gw_request_stream_space (job->stream);
        if (n == 0 || n > left)
            n = left; //  when refused, the write asks for the drain callback
        if (gw_request_stream_write (job->stream, job->out + job->out_sent, n) != 0)
            return; //  drain or closed callback follows
        job->out_sent += n;
    }
    if (job->stream && job->finished) {
        gw_request_stream_end (job->stream);
        job->stream = NULL;
        s_stream_done (job);
    }
}

static void s_stream_emit (s_job_t *job, json_t *msg)
{
    char *event = s_sse_event (msg);
    json_decref (msg);
    if (!event) {
        s_stream_flush (job); //  a finished stream still ends
        return;
    }
    size_t size = strlen (event);
    if (job->out_sent == job->out_size)
        job->out_sent = job->out_size = 0;
    char *out = realloc (job->out, job->out_size + size);
    if (out) {
        memcpy (out + job->out_size, event, size);
        job->out = out;
        job->out_size += size;
    }
    zstr_free (&event);
    s_stream_flush (job);
}

static int s_on_progress_timer (zloop_t *loop, int timer_id, void *arg);

static void s_progress_arm (s_job_t *job, unsigned delay_ms)
{
    job->due_ms += delay_ms;
    job->timer_id = zloop_timer (job->mcp->loop, delay_ms, 1, s_on_progress_timer, job);
    if (job->timer_id < 0)
        job->timer_id = 0;
}

static int s_on_progress_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_job_t *job = arg;
    job->timer_id = 0; //  a one-shot timer: zloop has dropped it
    if (!job->stream || job->finished)
        return 0;
    json_int_t elapsed = (json_int_t) ((sbx_clock_mono_ms () - job->started_mono + 500) / 1000);
    job->progress = elapsed > job->progress ? elapsed : job->progress + 1;
    char message[120];
    snprintf (message, sizeof message, "%.60s still running after %lld s", job->tool,
              (long long) job->progress);
    s_stream_emit (job,
                   json_pack ("{s:s, s:s, s:{s:O, s:I, s:s}}", "jsonrpc", "2.0", "method",
                              "notifications/progress", "params", "progressToken",
                              job->progress_token, "progress", job->progress, "message", message));
    s_progress_arm (job, s_progress_next (job->due_ms));
    return 0;
}

static void s_on_stream_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_stream_flush (arg);
}

//  The call ends unanswered: the client cancelled it. A foreground exec is killed.
static void s_abandon (s_job_t *job, const char *why)
{
    sbx_info ("mcp rid=%llu %s: %s; the call is cancelled", (unsigned long long) job->req_id,
              job->tool, why);
    gw_tools_abandon (job->mcp->tools, job->call);
    job->call = 0;
    zhashx_delete (job->mcp->jobs, (void *) (uintptr_t) job->serial);
    s_job_free (&job);
}

//  The client left. At 2026-07-28 closing the stream is the cancellation of the
//  request; before, a disconnect is not (the spec's words): the call runs on, its
//  result is dropped, and a foreground exec can be found with list_commands.
static void s_on_stream_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_job_t *job = arg;
    job->stream = NULL;
    if (job->timer_id)
        zloop_timer_end (job->mcp->loop, job->timer_id);
    job->timer_id = 0;
    if (job->modern && job->call && !job->finished) {
        s_abandon (job, "the client closed the stream");
        return;
    }
    sbx_info ("mcp rid=%llu %s: the client left the stream", (unsigned long long) job->req_id,
              job->tool);
    if (job->finished)
        s_stream_done (job);
}

//  The same for a 2026-07-28 call answered as application/json: the client hung up.
static void s_on_request_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_job_t *job = arg;
    if (job->call)
        s_abandon (job, "the client closed the connection");
    //  Else its answer is on its way (its changes are being stored): it finds no request.
}

//  The client left a read_file being streamed: the read is cancelled (it changes
//  nothing; its answer could not go anywhere), in either era.
static void s_on_read_closed (void *arg)
{
    s_job_t *job = arg;
    gw_b64_stream_end (&job->b64, false, NULL);
    if (job->call)
        s_abandon (job, "the client left the file's answer");
    else //  the file was all read: only the rest of its answer is lost
        sbx_info ("mcp rid=%llu %s: the client left the file's answer before its end",
                  (unsigned long long) job->req_id, job->tool);
}

//  A chunk of a large read_file is in (gw_tools_follow_read). At the first, the answer
//  starts: the envelope around an empty content is cut where the base64 goes, and the
//  base64 follows as the chunks come instead of after the last one.
static int s_on_read (const gw_tools_read_t *read, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    if (!job->b64) {
        gw_request_t *req = gw_http_request (self->http, job->req_id);
        if (!req)
            return -1;
        s_buf_t out = {0};
        s_tool_response (self, &out, job->rpc_id, read->result, job->modern, false);
        //  …,"content":""}}} : the head ends with the opening quote, the tail is "}}}.
        static const char end[] = "\"\"}}}";
        size_t n = strlen (end);
        if (!out.failed && out.data && out.size > n &&
            memcmp (out.data + out.size - n, end, n) == 0) {
            gw_request_add_header (req, "Cache-Control", "no-store");
            job->b64 = gw_b64_stream_new (req, "application/json", out.data, out.size - n + 1,
                                          read->length, out.data + out.size - n + 1, n - 1,
                                          s_on_read_closed, job);
        }
        free (out.data);
        if (!job->b64)
            return -1;
    }
    if (read->take)
        gw_b64_stream_take (job->b64, read->take);
    else
        gw_b64_stream_feed (job->b64, read->data, read->ready);
    return 0;
}

//  notifications/cancelled of a 2025 session: that call ends unanswered (its POST gets
//  202, or its stream ends). An id unknown or answered already is ignored, as the spec
//  lets a receiver do.
static void s_cancel (gw_mcp_t *self, const char *session_id, json_t *request_id)
{
    s_job_t *job = zhashx_first (self->jobs);
    while (job && !(request_id && job->call && !job->modern && job->session_id &&
                    streq (job->session_id, session_id) && json_equal (job->rpc_id, request_id)))
        job = zhashx_next (self->jobs);
    if (!job)
        return;
    gw_request_t *stream = job->sse ? job->stream : NULL;
    gw_request_t *req = job->sse ? NULL : gw_http_request (self->http, job->req_id);
    if (stream)
        gw_request_set_closed_fn (stream, NULL, NULL);
    s_abandon (job, "the client sent notifications/cancelled");
    if (stream)
        gw_request_stream_end (stream);
    else if (req)
        gw_request_respond (req, 202, NULL, "", 0);
}

//  Answers req as an SSE stream if the call asked for progress and the client takes
//  it; false leaves req to be answered as application/json.
static bool s_stream_start (gw_mcp_t *self, s_job_t *job, gw_request_t *req, json_t *params)
{
    json_t *token = json_object_get (json_object_get (params, "_meta"), "progressToken");
    if (!self->loop || !(json_is_string (token) || json_is_integer (token)) ||
        !s_accepts_sse (gw_request_header (req, "Accept")))
        return false;
    gw_request_add_header (req, "Cache-Control", "no-cache");
    if (gw_request_stream_start (req, 200, "text/event-stream") != 0)
        return false; //  the JSON path finds the client gone, or answers
    job->sse = true;
    job->stream = req;
    job->progress_token = json_incref (token);
    job->started_mono = sbx_clock_mono_ms ();
    gw_request_set_closed_fn (req, s_on_stream_closed, job);
    gw_request_set_drain_fn (req, s_on_stream_drain, job);
    s_progress_arm (job, S_PROGRESS_FIRST_MS);
    return true;
}

//  The call's answer, now that its changes are stored: to the stream or the request.
static void s_deliver (s_job_t *job)
{
    gw_mcp_t *self = job->mcp;
    json_t *result = job->result;
    job->result = NULL;
    if (job->sse) {
        if (job->timer_id)
            zloop_timer_end (self->loop, job->timer_id);
        job->timer_id = 0;
        job->finished = true;
        json_t *id = job->rpc_id;
        if (!job->stream) {
            sbx_info ("mcp rid=%llu %s answered after the client left; dropped",
                      (unsigned long long) job->req_id, job->tool);
            s_stream_done (job);
        } else if (result)
            s_stream_emit (
                job, json_pack ("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result",
                                job->modern ? s_modern_result (result) : json_incref (result)));
        else
            s_stream_emit (job, s_error_response (id, job->rpc_code, job->rpc_message));
        json_decref (result);
        return;
    }
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    if (job->b64) {
        //  Streamed: its tail now, or the body cut short (the length went out already).
        bool ok = result && !json_is_true (json_object_get (result, "isError"));
        if (!ok)
            sbx_info ("mcp rid=%llu %s answer cut short: %s", (unsigned long long) job->req_id,
                      job->tool,
                      result ? json_string_value (json_object_get (
                                   json_array_get (json_object_get (result, "content"), 0), "text"))
                             : job->rpc_message);
        char left[200];
        snprintf (left, sizeof left,
                  "mcp rid=%llu %s: the client left the file's answer before its end",
                  (unsigned long long) job->req_id, job->tool);
        gw_b64_stream_end (&job->b64, ok, left);
        json_decref (result);
        s_job_free (&job);
        return;
    }
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (req)
        gw_request_set_closed_fn (req, NULL, NULL); //  the job goes now
    if (!req)
        sbx_info ("mcp rid=%llu %s answered after the client left; dropped",
                  (unsigned long long) job->req_id, job->tool);
    else if (result)
        s_send_tool_result (self, req, job->rpc_id, json_incref (result), job->modern);
    else
        s_send_error (req, 200, job->rpc_id, job->rpc_code, job->rpc_message);
    json_decref (result);
    s_job_free (&job);
}

static void s_on_synced (gw_tools_state_t *state, const char *id, sbx_code_t code,
                         const char *message, void *arg)
{
    (void) state;
    (void) id;
    (void) code;
    (void) message;
    s_deliver (arg);
}

static void s_on_tool_done (json_t *result, int rpc_code, const char *rpc_message, void *arg)
{
    s_job_t *job = arg;
    job->call = 0;
    job->result = result; //  ours (gw_tools_done_fn)
    job->rpc_code = rpc_code;
    job->rpc_message = rpc_message ? strdup (rpc_message) : NULL;
    //  A session's new default (or env) is stored before the answer goes: the client's
    //  next request may reach another gateway.
    if (job->session_id && job->state)
        gw_mcp_sessions_sync (job->mcp->sessions, job->caller, job->session_id, job->state,
                              s_on_synced, job);
    else
        s_deliver (job);
}

static void s_on_opened (gw_tools_state_t *state, const char *session_id, sbx_code_t code,
                         const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (!req) {
        s_job_free (&job);
        return;
    }
    if (!state) {
        char text[600];
        snprintf (text, sizeof text, "cannot open an MCP session now: %s (%s); retry later",
                  message ? message : "", sbx_code_name (code));
        s_send_error (req, 503, job->rpc_id, -32000, text);
        s_job_free (&job);
        return;
    }
    const char *version = job->tool; //  the version agreed, kept in tool
    gw_request_add_header (req, "Mcp-Session-Id", session_id);
    sbx_info ("mcp session %.12s… opened for %s (client %s, protocol %s)", session_id,
              job->caller->account_id ? job->caller->account_id : "?",
              job->rpc_message ? job->rpc_message : "?", version);
    s_send_result (req, job->rpc_id,
                   json_pack ("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion",
                              version, "capabilities", "tools", "listChanged", 0, "serverInfo",
                              "name", "sbx", "title", "sbx", "version", SBX_VERSION, "instructions",
                              s_instructions));
    s_job_free (&job);
}

//  A job for req that waits for the broker (with the caller kept), or NULL.
static s_job_t *s_job_wait (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller)
{
    s_job_t *job = calloc (1, sizeof *job);
    if (!job)
        return NULL;
    job->mcp = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    job->caller = gw_auth_caller_dup (caller);
    if (!job->caller) {
        free (job);
        return NULL;
    }
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    return job;
}

static void s_initialize (gw_mcp_t *self, gw_request_t *req, json_t *id, json_t *params,
                          const sbx_caller_t *caller)
{
    const char *asked = json_string_value (json_object_get (params, "protocolVersion"));
    const char *client =
        json_string_value (json_object_get (json_object_get (params, "clientInfo"), "name"));
    s_job_t *job = s_job_wait (self, req, caller);
    if (!job) {
        s_send_error (req, 500, id, -32603, "out of memory");
        return;
    }
    job->rpc_id = json_incref (id);
    job->tool = strdup (gw_mcp_negotiate (asked));
    job->rpc_message = client ? strndup (client, 128) : NULL;
    //  The broker keeps it, so every gateway serves it.
    gw_mcp_sessions_open (self->sessions, caller, job->tool, client, s_on_opened, job);
}

//  tools/call of a caller whose session (or, in the stateless era, credential) state is
//  session (NULL: none, the call gets a state of its own); modern: 2026-07-28.
static void s_tools_call (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller, json_t *id,
                          json_t *params, gw_tools_state_t *session, const char *session_id,
                          bool modern)
{
    json_t *tool = json_object_get (params, "name");
    gw_auth_limit_t limit;
    if (!json_is_string (tool)) {
        s_send_error (req, 200, id, -32602, "Invalid params: name is required");
    } else if (gw_auth_take (self->auth, caller, &limit)) {
        //  Over the key's rate: a tool error the model can read, same code as REST.
        char text[200];
        snprintf (text, sizeof text,
                  "this key may make %llu requests per second; retry in %llu s "
                  "(rate_limited)",
                  (unsigned long long) limit.limit, (unsigned long long) limit.reset_s);
        gw_auth_rate_headers (req, &limit);
        json_t *refused = json_pack ("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
                                     text, "isError", 1);
        if (modern)
            s_send_result_modern (req, id, refused);
        else
            s_send_result (req, id, refused);
    } else {
        s_job_t *job = calloc (1, sizeof *job);
        job->mcp = self;
        job->serial = self->next_serial++;
        job->req_id = gw_request_id (req);
        job->rpc_id = json_incref (id);
        job->tool = strdup (json_string_value (tool));
        job->modern = modern;
        if (session) {
            job->session_id = strdup (session_id);
            job->caller = gw_auth_caller_dup (caller);
            job->state = gw_tools_state_ref (session);
        }
        zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
        bool sse = s_stream_start (self, job, req, params);
        //  Read-only calls at debug level: an agent polling get_sandbox or
        //  command_status would drown the log.
        sbx_log (gw_tools_read_only (self->tools, job->tool) ? SBX_LOG_DEBUG : SBX_LOG_INFO,
                 "mcp rid=%llu %s tools/call %s%s", (unsigned long long) job->req_id,
                 caller->account_id ? caller->account_id : "?", job->tool,
                 sse ? " (SSE, progress)" : "");
        //  Without a session the call gets a state of its own, forgotten after.
        gw_tools_state_t *state = session ? gw_tools_state_ref (session) : gw_tools_state_new ();
        uint64_t serial = job->serial;
        uint64_t call = gw_tools_call (self->tools, caller, state, job->tool,
                                       json_object_get (params, "arguments"), s_on_tool_done, job);
        gw_tools_state_unref (&state);
        if (call && (job = zhashx_lookup (self->jobs, (void *) (uintptr_t) serial))) {
            job->call = call; //  running: cancellable (s_cancel; at 2026-07-28 a hang-up)
            if (job->modern && !job->sse)
                gw_request_set_closed_fn (req, s_on_request_closed, job);
            if (!job->sse)
                gw_tools_follow_read (self->tools, call, s_on_read, job);
        }
    }
}

//  One JSON-RPC message of a caller whose session (if it named one) is state, or NULL
//  with lookup: not_found for a session that is not the caller's, else why the broker
//  could not say.
static void s_serve (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller,
                     gw_tools_state_t *session, const char *session_id, sbx_code_t lookup,
                     json_t *parsed)
{
    const char *version = gw_request_header (req, "MCP-Protocol-Version");
    if (version && !s_version_known (version)) {
        char message[200];
        snprintf (message, sizeof message,
                  "Bad Request: unsupported MCP-Protocol-Version %.40s (supported: %s, %s, %s)",
                  version, s_versions[0], s_versions[1], s_versions[2]);
        s_send_error (req, 400, NULL, -32600, message);
        return;
    }
    json_error_t error;
    //  The body as gw_mcp_serve parsed it, or parsed here (after a session lookup).
    json_t *msg = parsed ? json_incref (parsed)
                         : gw_jsonload ((const char *) gw_request_body (req),
                                        gw_request_body_size (req), &error);
    if (!msg) {
        char message[300];
        snprintf (message, sizeof message, "Parse error: %s", error.text);
        s_send_error (req, 400, NULL, -32700, message);
        return;
    }
    json_t *id = json_object_get (msg, "id");
    json_t *rpc_method = json_object_get (msg, "method");
    const char *name = json_string_value (rpc_method);
    if (json_is_array (msg))
        s_send_error (req, 400, NULL, -32600, "Invalid Request: batches are not supported");
    else if (!json_is_object (msg) || !json_is_string (json_object_get (msg, "jsonrpc")) ||
             !streq (json_string_value (json_object_get (msg, "jsonrpc")), "2.0"))
        s_send_error (req, 400, NULL, -32600, "Invalid Request: not a JSON-RPC 2.0 message");
    else if (name && !streq (name, "initialize") && session_id && !session &&
             lookup != SBX_E_NOT_FOUND) {
        //  The broker could not say: not the client's fault, and no reason to start over.
        char message[300];
        snprintf (message, sizeof message, "cannot check the MCP session now (%s); retry later",
                  sbx_code_name (lookup));
        s_send_error (req, 503, NULL, -32000, message);
    } else if (name && !streq (name, "initialize") && session_id && !session)
        s_send_error (req, 404, NULL, -32001, "Session not found");
    else if (!rpc_method) {
        //  A response to us (we send no requests) or junk.
        if (json_object_get (msg, "result") || json_object_get (msg, "error"))
            gw_request_respond (req, 202, NULL, "", 0);
        else
            s_send_error (req, 400, NULL, -32600, "Invalid Request: no method");
    } else if (!name)
        s_send_error (req, 400, id, -32600, "Invalid Request: method must be a string");
    else if (!id) {
        //  A notification (notifications/initialized, cancelled...): nothing to answer.
        if (streq (name, "notifications/cancelled") && session)
            s_cancel (self, session_id,
                      json_object_get (json_object_get (msg, "params"), "requestId"));
        gw_request_respond (req, 202, NULL, "", 0);
    } else if (!json_is_string (id) && !json_is_integer (id))
        s_send_error (req, 400, NULL, -32600, "Invalid Request: id must be a string or number");
    else {
        json_t *params = json_object_get (msg, "params");
        if (params && !json_is_object (params))
            s_send_error (req, 200, id, -32602, "Invalid params: params must be an object");
        else if (streq (name, "initialize"))
            s_initialize (self, req, id, params, caller);
        else if (streq (name, "ping"))
            s_send_result (req, id, json_object ());
        else if (streq (name, "tools/list"))
            s_send_tools (self, req, id);
        else if (streq (name, "tools/call"))
            s_tools_call (self, req, caller, id, params, session, session_id, false);
        else {
            char message[200];
            snprintf (message, sizeof message, "Method not found: %.100s", name);
            s_send_error (req, 200, id, -32601, message);
        }
    }
    json_decref (msg);
}

//  --------------------------------------------------------------------------
//  The stateless era (2026-07-28): no initialize, no session; each request carries its
//  version and the client's capabilities (gw_mcp_era). A tool without sandboxId uses the
//  credential's default sandbox, kept by the broker like a session's.

static const char *s_header_of (void *source, const char *name)
{
    return gw_request_header ((gw_request_t *) source, name);
}

static void s_send_refusal (gw_request_t *req, json_t *id, gw_mcp_era_refusal_t *why)
{
    json_t *error = s_error_response (id, why->code, why->message);
    if (why->data)
        json_object_set_new (json_object_get (error, "error"), "data", why->data);
    why->data = NULL;
    s_send_json (req, why->status, error);
}

//  The credential's state is here: the call goes on as a session's would.
static void s_on_credential (gw_tools_state_t *state, const char *session_id, sbx_code_t code,
                             const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (req && !state) {
        char text[600];
        snprintf (text, sizeof text,
                  "cannot find this credential's default sandbox now: %s (%s); retry later",
                  message ? message : "", sbx_code_name (code));
        s_send_error (req, 503, job->rpc_id, -32000, text);
    } else if (req)
        s_tools_call (self, req, job->caller, job->rpc_id, job->params, state, session_id, true);
    s_job_free (&job);
}

static void s_serve_modern (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller,
                            json_t *msg)
{
    json_t *id = json_is_object (msg) ? json_object_get (msg, "id") : NULL;
    if (id && !json_is_string (id) && !json_is_integer (id))
        id = NULL;
    if (!msg) {
        s_send_error (req, 400, NULL, -32700, "Parse error: the body is not JSON");
        return;
    }
    if (json_is_array (msg)) {
        s_send_error (req, 400, NULL, -32600, "Invalid Request: batches are not supported");
        return;
    }
    if (!json_is_object (msg) || !streq (json_string_value (json_object_get (msg, "jsonrpc"))
                                             ? json_string_value (json_object_get (msg, "jsonrpc"))
                                             : "",
                                         "2.0")) {
        s_send_error (req, 400, id, -32600, "Invalid Request: not a JSON-RPC 2.0 message");
        return;
    }
    json_t *rpc_method = json_object_get (msg, "method");
    if (!rpc_method) {
        //  A response to us (we send no requests) or junk.
        if (json_object_get (msg, "result") || json_object_get (msg, "error"))
            gw_request_respond (req, 202, NULL, "", 0);
        else
            s_send_error (req, 400, id, -32600, "Invalid Request: no method");
        return;
    }
    gw_mcp_era_refusal_t why;
    if (gw_mcp_era_check (msg, s_header_of, req, &why)) {
        s_send_refusal (req, id, &why);
        return;
    }
    const char *name = json_string_value (rpc_method);
    json_t *params = json_object_get (msg, "params");
    if (!json_object_get (msg, "id")) {
        gw_request_respond (req, 202, NULL, "", 0); //  a notification: nothing to answer
        return;
    }
    if (!id) {
        s_send_error (req, 400, NULL, -32600, "Invalid Request: id must be a string or number");
        return;
    }
    if (streq (name, "server/discover")) {
        json_t *result =
            json_pack ("{s:[s], s:{s:{}}, s:s, s:i, s:s}", "supportedVersions", GW_MCP_MODERN,
                       "capabilities", "tools", "instructions", s_instructions_modern, "ttlMs",
                       S_LIST_TTL_MS, "cacheScope", "public");
        s_send_result_modern (req, id, result);
    } else if (streq (name, "tools/list"))
        s_send_tools_modern (self, req, id);
    else if (streq (name, "tools/call")) {
        s_job_t *job = s_job_wait (self, req, caller);
        if (!job) {
            s_send_error (req, 500, id, -32603, "out of memory");
            return;
        }
        job->rpc_id = json_incref (id);
        job->params = json_incref (params);
        //  From the copy at once, or from the broker (made on first use).
        gw_mcp_sessions_credential (self->sessions, caller, s_on_credential, job);
    } else {
        //  initialize, ping and the rest are the 2025 era's (or nobody's).
        char message[200];
        snprintf (message, sizeof message, "Method not found: %.100s (MCP %s)", name,
                  GW_MCP_MODERN);
        s_send_error (req, 404, id, -32601, message);
    }
}

//  The session a request named, from the broker: now the request is served.
static void s_on_session (gw_tools_state_t *state, const char *session_id, sbx_code_t code,
                          const char *message, void *arg)
{
    (void) message;
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (req)
        s_serve (self, req, job->caller, state, session_id, state ? SBX_OK : code, NULL);
    s_job_free (&job);
}

static void s_on_ended (gw_tools_state_t *state, const char *session_id, sbx_code_t code,
                        const char *message, void *arg)
{
    (void) state;
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (!req)
        ;
    else if (code == SBX_OK) {
        sbx_info ("mcp session %.12s… ended by the client", session_id);
        gw_request_respond (req, 200, NULL, "", 0);
    } else if (code == SBX_E_NOT_FOUND)
        s_send_error (req, 404, NULL, -32001, "Session not found");
    else {
        char text[600];
        snprintf (text, sizeof text, "cannot end the MCP session now: %s (%s); retry later",
                  message ? message : "", sbx_code_name (code));
        s_send_error (req, 503, NULL, -32000, text);
    }
    s_job_free (&job);
}

//  One JSON-RPC message from an authenticated caller (see gw_mcp.h).
void gw_mcp_serve (gw_mcp_t *self, gw_request_t *req, const sbx_caller_t *caller)
{
    //  A request of the stateless era says so in its body or its version header.
    json_t *msg =
        streq (gw_request_method (req), "POST")
            ? gw_jsonload ((const char *) gw_request_body (req), gw_request_body_size (req), NULL)
            : NULL;
    if (msg && gw_mcp_era_modern (msg, s_header_of, req)) {
        s_serve_modern (self, req, caller, msg);
        json_decref (msg);
        return;
    }
    if (!msg && streq (gw_request_method (req), "POST") &&
        gw_mcp_era_modern (NULL, s_header_of, req)) {
        s_serve_modern (self, req, caller, NULL); //  unparsable, in the stateless era's words
        return;
    }
    const char *session_id = gw_request_header (req, "Mcp-Session-Id");
    //  Sessions are the broker's: ended, or looked up, on whichever gateway asks.
    bool ending = streq (gw_request_method (req), "DELETE");
    if (ending && !session_id) {
        s_send_error (req, 400, NULL, -32001, "Mcp-Session-Id is required");
        return;
    }
    gw_tools_state_t *session =
        session_id && !ending
            ? gw_mcp_sessions_find (self->sessions, session_id, caller->account_id)
            : NULL;
    if (!session_id || session) {
        s_serve (self, req, caller, session, session_id, SBX_OK, msg);
        json_decref (msg);
        return;
    }
    json_decref (msg);
    s_job_t *job = s_job_wait (self, req, caller);
    if (!job) {
        s_send_error (req, 500, NULL, -32603, "out of memory");
        return;
    }
    if (ending)
        gw_mcp_sessions_end (self->sessions, caller, session_id, s_on_ended, job);
    else
        gw_mcp_sessions_fetch (self->sessions, caller, session_id, s_on_session, job);
}

static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_mcp_t *self = job->mcp;
    zhashx_delete (self->jobs, (void *) (uintptr_t) job->serial);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    uint64_t rid = job->req_id;
    s_job_free (&job);
    if (!req)
        return; //  the client left meanwhile
    if (caller)
        gw_mcp_serve (self, req, caller);
    else if (code == SBX_E_UNAUTHENTICATED)
        gw_auth_respond_refused (self->auth, req, message); //  a disabled account says so
    else if (code == SBX_E_INVALID_ARGUMENT)
        s_send_error (req, 400, NULL, -32600, message ? message : "malformed credentials");
    else {
        //  The broker could not say: not the client's fault, and not a 401.
        sbx_warn ("mcp rid=%llu: cannot check the API key: %s", (unsigned long long) rid,
                  message ? message : sbx_code_name (code));
        char text[600];
        snprintf (text, sizeof text, "cannot check credentials now: %s (%s)",
                  message ? message : "", sbx_code_name (code));
        s_send_error (req, 503, NULL, -32000, text);
    }
}

bool gw_mcp_origin_allowed (gw_mcp_t *self, const char *origin)
{
    if (!origin)
        return true; //  not a browser
    if (streq (origin, self->own_origin))
        return true;
    for (char *allowed = zlistx_first (self->origins); allowed;
         allowed = zlistx_next (self->origins))
        if (streq (allowed, "*") || strcasecmp (allowed, origin) == 0)
            return true;
    return false;
}

bool gw_mcp_admit (gw_mcp_t *self, gw_request_t *req)
{
    const char *method = gw_request_method (req);
    if (!gw_mcp_origin_allowed (self, gw_request_header (req, "Origin"))) {
        s_send_error (req, 403, NULL, -32000,
                      "Forbidden: this Origin may not use /mcp (see the mcp.origins setting)");
        return false;
    }
    if (streq (method, "GET") || (!streq (method, "POST") && !streq (method, "DELETE"))) {
        //  No server-initiated messages, so no standalone stream: clients then use POST
        //  answers only (the protocol allows 405 here).
        gw_request_add_header (req, "Allow", "POST, DELETE");
        s_send_error (req, 405, NULL, -32000, "Method Not Allowed: use POST (or DELETE)");
        return false;
    }
    return true;
}

void gw_mcp_handle (gw_mcp_t *self, gw_request_t *req)
{
    if (!gw_mcp_admit (self, req))
        return;
    const char *token = gw_auth_bearer (gw_request_header (req, "Authorization"));
    if (!token) {
        gw_auth_respond_401 (self->auth, req);
        return;
    }
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        s_send_error (req, 500, NULL, -32603, "out of memory");
        return;
    }
    job->mcp = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    //  May answer at once (cached key); otherwise the request waits, suspended.
    gw_auth_check (self->auth, token, s_on_auth, job);
}

//  --------------------------------------------------------------------------
//  Self test: what needs neither a broker nor a socket.

void gw_mcp_test (bool verbose)
{
    (void) verbose;
    assert (streq (gw_mcp_negotiate ("2025-06-18"), "2025-06-18"));
    //  s_dump writes what json_dumps writes, escapes and UTF-8 included.
    json_t *sample = json_pack (
        "{s:[{s:s, s:s}], s:{s:s, s:i, s:f, s:b, s:n, s:[], s:{}}}", "content", "type", "text",
        "text", "a \"q\" \\ \b\f\n\r\t \x01\x1f \x7f / \xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80 end",
        "structuredContent", "stdout", "", "n", -42, "x", 1.5, "t", 1, "nil", "a", "o");
    assert (sample);
    char *ours = s_dump (sample), *theirs = json_dumps (sample, JSON_COMPACT);
    assert (ours && theirs && streq (ours, theirs));
    free (ours);
    free (theirs);
    json_decref (sample);
    assert (streq (gw_mcp_negotiate ("2025-03-26"), "2025-03-26"));
    assert (streq (gw_mcp_negotiate ("2025-11-25"), "2025-11-25"));
    assert (streq (gw_mcp_negotiate ("2024-11-05"), "2025-06-18"));
    assert (streq (gw_mcp_negotiate ("junk"), "2025-06-18"));
    assert (streq (gw_mcp_negotiate (NULL), "2025-06-18"));
    assert (s_version_known ("2025-03-26") && !s_version_known ("2099-01-01"));

    assert (s_accepts_sse ("application/json, text/event-stream"));
    assert (s_accepts_sse ("Text/Event-Stream"));
    assert (!s_accepts_sse ("application/json") && !s_accepts_sse (NULL));
    unsigned due = S_PROGRESS_FIRST_MS;
    for (int i = 0; i < 10; i++)
        due += s_progress_next (due);
    assert (s_progress_next (1000) == 1000 && s_progress_next (2000) == 2000);
    assert (s_progress_next (due) == S_PROGRESS_EVERY_MS);
    json_t *note = json_pack ("{s:s, s:{s:s}}", "method", "m", "params", "t", "a\nb");
    char *event = s_sse_event (note);
    assert (
        streq (event, "event: message\ndata: {\"method\":\"m\",\"params\":{\"t\":\"a\\nb\"}}\n\n"));
    zstr_free (&event);
    json_decref (note);

    //  A message quoting bytes that are not UTF-8 still makes an answer (fuzz_mcp).
    json_t *error = s_error_response (NULL, -32600, "unsupported version \xff\xfe.");
    assert (error);
    assert (
        streq (json_string_value (json_object_get (json_object_get (error, "error"), "message")),
               "unsupported version ??."));
    json_decref (error);

    gw_ctx_t *ctx = gw_ctx_new (NULL, NULL, NULL, NULL);
    gw_mcp_t *mcp = ctx ? gw_mcp_new (ctx) : NULL;
    assert (mcp);
    assert (gw_mcp_origin_allowed (mcp, NULL));
    assert (gw_mcp_origin_allowed (mcp, "https://localhost:8443"));
    assert (!gw_mcp_origin_allowed (mcp, "https://evil.example"));
    zlistx_add_end (mcp->origins, "https://claude.ai");
    assert (gw_mcp_origin_allowed (mcp, "https://claude.ai"));
    gw_mcp_destroy (&mcp);
    gw_ctx_destroy (&ctx);
}
