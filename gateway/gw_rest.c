/*  gw_rest - see gw_rest.h */
#include "gw_rest.h"
#include "sbx_args.h"
#include "sbx_idmap.h"
#include "gw_auth.h"
#include "gw_builds.h"
#include "gw_exec_stream.h"
#include "gw_terminal.h"
#include "gw_ops.h"
#include "sbx_ops_gen.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <strings.h>

#define S_PARAMS    3   //  {x} segments a route may have
#define S_PARAM_MAX 128 //  the longest {x} segment taken
//  A GET of a file larger than this is streamed as its chunks come (s_on_read); a
//  smaller one, or one whose size the guest does not know (/proc, a pipe), is sent whole.
#define S_STREAM_MIN SBX_XFER_CHUNK

//  docs/openapi.json, embedded by the build (gateway/CMakeLists.txt).
extern const char gw_rest_openapi[];
extern const size_t gw_rest_openapi_size;

//  The routes and their operations are schemas/operations.json's (sbx_ops_gen): paths
//  as in the OpenAPI document, each {name} one segment, the argument of that name.
typedef sbx_ops_route_t s_route_t;

//  One request from route to answer.
typedef struct {
    gw_rest_t *rest;
    uint64_t serial;
    uint64_t handle; //  the gw_ops call in flight, for cancel
    uint64_t find;   //  the gw_others ask in flight (a build another gateway runs)
    char *not_found; //  then, the answer if none runs it
    uint64_t req_id;
    sbx_op_t op;
    char params[S_PARAMS][S_PARAM_MAX]; //  the path's {x} values, in order
    sbx_caller_t *caller;
    //  A file GET streamed (s_on_read): the request, held until the body ends or the
    //  client leaves; the transfer while the call runs, then the bytes it read.
    gw_request_t *stream;
    sbx_xfer_t *xfer;
    uint8_t *body;
    size_t length, sent; //  the length promised, and sent so far
    bool no_stream;      //  decided: sent whole at the end
} s_job_t;

struct gw_rest_t {
    gw_http_t *http;
    gw_auth_t *auth; //  the gateway's (ctx)
    gw_ops_t *ops;   //  the gateway's (ctx)
    zhashx_t *jobs;  //  serial → s_job_t
    uint64_t next_serial;
    gw_exec_stream_t *streams; //  execs answered as SSE
    gw_terminal_t *terminals;  //  terminals over WebSockets
    gw_builds_t *builds;       //  template builds run by the service
    gw_others_t *others;       //  the gateway's (ctx): asks for builds another runs
};

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (job) {
        gw_auth_caller_destroy (&job->caller);
        free (job->body);
        free (job->not_found);
        free (job);
    }
    *job_p = NULL;
}

static void s_on_route (gw_request_t *req, void *arg)
{
    gw_rest_handle ((gw_rest_t *) arg, req);
}

gw_rest_t *gw_rest_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_rest_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = ctx->http;
    self->next_serial = 1;
    self->auth = ctx->auth;
    self->ops = ctx->ops;
    self->jobs = sbx_idmap_new ();
    self->streams = gw_exec_stream_new (ctx);
    self->terminals = gw_terminal_new (ctx);
    self->builds = gw_builds_new (ctx->config);
    self->others = ctx->others;
    if (!self->jobs || !self->streams || !self->terminals || !self->builds ||
        gw_router_add (ctx->router, "/v1", true, s_on_route, self)) {
        gw_rest_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_rest_destroy (gw_rest_t **self_p)
{
    assert (self_p);
    gw_rest_t *self = *self_p;
    if (!self)
        return;
    //  Calls in flight are cancelled first (the runner is the gateway's).
    if (self->jobs) {
        for (s_job_t *job = zhashx_first (self->jobs); job; job = zhashx_next (self->jobs)) {
            gw_ops_cancel (self->ops, job->handle);
            gw_others_cancel (self->others, job->find);
            if (job->stream) {
                gw_request_set_closed_fn (job->stream, NULL, NULL);
                gw_request_stream_fail (job->stream);
            }
            s_job_free (&job);
        }
        zhashx_destroy (&self->jobs);
    }
    gw_exec_stream_destroy (&self->streams);
    gw_terminal_destroy (&self->terminals);
    gw_builds_destroy (&self->builds);
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

static void s_send_error (gw_request_t *req, sbx_code_t code, const char *message)
{
    if (code == SBX_E_UNAUTHENTICATED)
        gw_request_add_header (req, "WWW-Authenticate", "Bearer realm=\"sbx\"");
    s_send_json (
        req, sbx_code_http_status (code),
        json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message", message));
}

//  --------------------------------------------------------------------------
//  Routing

//  True when path matches pattern segment by segment; {x} takes one non-empty segment
//  into params (in order).
static bool s_match (const char *pattern, const char *path, char params[S_PARAMS][S_PARAM_MAX])
{
    int n = 0;
    while (*pattern && *path) {
        if (*pattern != '/' || *path != '/')
            return false;
        pattern++;
        path++;
        size_t plen = strcspn (pattern, "/");
        size_t len = strcspn (path, "/");
        if (*pattern == '{') {
            if (len == 0 || len >= S_PARAM_MAX || n >= S_PARAMS)
                return false;
            memcpy (params[n], path, len);
            params[n++][len] = 0;
        } else if (plen != len || memcmp (pattern, path, len) != 0)
            return false;
        pattern += plen;
        path += len;
    }
    return !*pattern && !*path;
}

//  The route of method and path: 0 and *route when one serves it; 404 when no route
//  has that path; 405 when some do with other methods (listed in allow).
static int s_route (const char *method, const char *path, const s_route_t **route,
                    char params[S_PARAMS][S_PARAM_MAX], char *allow, size_t allow_size)
{
    *route = NULL;
    *allow = 0;
    bool path_known = false;
    for (const s_route_t *r = sbx_ops_routes; r->method; r++) {
        char scratch[S_PARAMS][S_PARAM_MAX];
        if (!s_match (r->path, path, scratch))
            continue;
        path_known = true;
        if (streq (r->method, method)) {
            *route = r;
            memcpy (params, scratch, sizeof scratch);
            return 0;
        }
        size_t used = strlen (allow);
        snprintf (allow + used, allow_size - used, "%s%s", used ? ", " : "", r->method);
    }
    return path_known ? 405 : 404;
}

//  --------------------------------------------------------------------------
//  Arguments: the path's {x}, the query and the JSON body, named as the operation
//  names them, for gw_ops (which checks them against their one definition).

typedef struct {
    const char *body;
    size_t body_size;
    const char *(*query) (void *source, const char *name);
    void *source;
} s_input_t;

static const char *s_request_query (void *source, const char *name)
{
    return gw_request_query ((gw_request_t *) source, name);
}

static int s_fail (char *why, size_t why_size, const char *text)
{
    snprintf (why, why_size, "%s", text);
    return -1;
}

//  Adds name = text (converted to the argument's type) to args.
static int s_add_text (sbx_op_t op, json_t *args, const char *name, const char *text, char *why,
                       size_t why_size)
{
    const sbx_op_arg_t *arg = sbx_args_find (op, name);
    if (!arg)
        return s_fail (why, why_size, "this route names an argument its operation lacks");
    json_t *value = sbx_args_from_text (arg, text, why, why_size);
    if (!value)
        return -1;
    json_object_set_new (args, name, value);
    return 0;
}

//  The operation's arguments from the request, or NULL with the refusal in why.
static json_t *s_arguments (s_job_t *job, const s_input_t *in, char *why, size_t why_size)
{
    const sbx_op_info_t *op = &sbx_ops[job->op];
    json_t *args = json_object ();
    //  Path: {name} segments in order.
    int n = 0;
    for (const char *p = strchr (op->path, '{'); p; p = strchr (p + 1, '{'), n++) {
        char name[64];
        size_t len = strcspn (p + 1, "}");
        snprintf (name, sizeof name, "%.*s", (int) (len < sizeof name ? len : sizeof name - 1),
                  p + 1);
        if (s_add_text (job->op, args, name, job->params[n], why, why_size))
            goto fail;
    }
    //  Query: the arguments REST takes from there.
    for (unsigned i = 0; i < op->arg_count; i++) {
        const sbx_op_arg_t *a = &op->args[i];
        const char *text = a->in == SBX_ARG_IN_QUERY ? in->query (in->source, a->name) : NULL;
        if (text && s_add_text (job->op, args, a->name, text, why, why_size))
            goto fail;
    }
    if (op->rest_body != SBX_OPS_BODY_JSON && op->rest_body != SBX_OPS_BODY_JSON_REQUIRED)
        return args;
    //  Body: a JSON object of body fields; empty means {} unless one is required.
    size_t blank = 0;
    const char *text = in->body ? in->body : "";
    while (blank < in->body_size && memchr (" \t\r\n", text[blank], 4))
        blank++;
    if (blank == in->body_size) {
        if (op->rest_body == SBX_OPS_BODY_JSON)
            return args;
        s_fail (why, why_size, "a JSON object body is required");
        goto fail;
    }
    json_error_t jerr;
    json_t *body = json_loadb (text, in->body_size, 0, &jerr);
    if (!body) {
        snprintf (why, why_size, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                  jerr.line, jerr.column);
        goto fail;
    }
    if (sbx_args_check_body (job->op, body, why, why_size)) {
        json_decref (body);
        goto fail;
    }
    json_object_update (args, body);
    json_decref (body);
    return args;
fail:
    json_decref (args);
    return NULL;
}

//  --------------------------------------------------------------------------
//  Serving

static void s_job_end (s_job_t *job)
{
    zhashx_delete (job->rest->jobs, (void *) (uintptr_t) job->serial);
    s_job_free (&job);
}

//  A streamed GET: writes what is ready and fits (the drain callback brings the rest),
//  ends the body once all of it is out.
static void s_stream_pump (s_job_t *job)
{
    const uint8_t *data = job->body ? job->body : job->xfer ? sbx_xfer_data (job->xfer) : NULL;
    size_t ready = job->body ? job->length : job->xfer ? sbx_xfer_ready (job->xfer) : 0;
    if (ready > job->length)
        ready = job->length;
    while (job->stream && job->sent < ready) {
        size_t left = ready - job->sent;
        size_t n = gw_request_stream_space (job->stream);
        if (n == 0 || n > left)
            n = left; //  when refused, the write asks for the drain callback
        if (gw_request_stream_write (job->stream, data + job->sent, n) != 0)
            return; //  drain or closed callback follows
        job->sent += n;
    }
    if (job->stream && job->body && job->sent == job->length) {
        gw_request_set_closed_fn (job->stream, NULL, NULL);
        gw_request_stream_end (job->stream);
        job->stream = NULL;
        s_job_end (job);
    }
}

static void s_on_stream_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_stream_pump (arg);
}

//  The client left a streamed GET: the read is cancelled if it still runs.
static void s_on_stream_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_job_t *job = arg;
    job->stream = NULL;
    sbx_info ("rest rid=%llu the client left a file download after %zu of %zu bytes",
              (unsigned long long) job->req_id, job->sent, job->length);
    gw_ops_cancel (job->rest->ops, job->handle);
    s_job_end (job);
}

//  A GET's chunk is in (gw_ops_follow_read). At the first, a file larger than
//  S_STREAM_MIN is answered with its length from that answer (the read is fixed at it:
//  sbx_xfer_fix) and its bytes follow as the chunks before them come, so that sending
//  to the client overlaps reading from the guest instead of following it.
static void s_on_read (sbx_xfer_t *xfer, void *arg)
{
    s_job_t *job = arg;
    if (!job->stream && !job->no_stream) {
        gw_request_t *req = gw_http_request (job->rest->http, job->req_id);
        job->no_stream = true;
        if (!req || sbx_xfer_expected (xfer) <= S_STREAM_MIN)
            return;
        int64_t length = sbx_xfer_fix (xfer);
        if (length < 0)
            return;
        gw_request_add_header (req, "Cache-Control", "no-store");
        if (gw_request_stream_start_sized (req, 200, "application/octet-stream",
                                           (uint64_t) length) != 0)
            return; //  s_on_done finds the client gone, or answers
        job->no_stream = false;
        job->stream = req;
        job->xfer = xfer;
        job->length = (size_t) length;
        gw_request_set_closed_fn (req, s_on_stream_closed, job);
        gw_request_set_drain_fn (req, s_on_stream_drain, job);
    }
    if (job->stream)
        s_stream_pump (job);
}

//  A build another gateway holds (or none does): its answer, as ours would be.
static void s_on_build_found (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    job->find = 0;
    gw_request_t *req = gw_http_request (job->rest->http, job->req_id);
    json_t *build = reply && reply->type == SBX_MSG_BUILD_GET_OK
                        ? json_loads (sbx_msg_build_get_ok (reply)->build, 0, NULL)
                        : NULL;
    if (!req) //  the client left meanwhile
        json_decref (build);
    else if (json_is_object (build))
        s_send_json (req, 200, build);
    else {
        json_decref (build);
        if (code == SBX_OK) //  an answer that is not a build: the holder's fault
            s_send_error (req, SBX_E_INTERNAL,
                          "another gateway's answer for this build was "
                          "not a build; ask again");
        else
            s_send_error (req, code,
                          code == SBX_E_NOT_FOUND && job->not_found ? job->not_found : message);
    }
    s_job_end (job);
}

static void s_on_done (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->handle = 0;
    job->xfer = NULL; //  gone with the call
    if (job->stream) {
        //  Streamed: the rest of the bytes, or the body cut short (the status and length
        //  went out already; a client sees a short body, never a wrong one).
        if (result->code == SBX_OK && result->size == job->length && result->take &&
            *result->take) {
            job->body = *result->take;
            *result->take = NULL;
            s_stream_pump (job);
            return;
        }
        sbx_info ("rest rid=%llu file download cut after %zu of %zu bytes: %s",
                  (unsigned long long) job->req_id, job->sent, job->length,
                  result->code == SBX_OK ? "the file shrank while read" : result->message);
        gw_request_set_closed_fn (job->stream, NULL, NULL);
        gw_request_stream_fail (job->stream);
        job->stream = NULL;
        s_job_end (job);
        return;
    }
    gw_request_t *req = gw_http_request (job->rest->http, job->req_id);
    if (!req) {
        //  The client left: nothing more to do for it.
        sbx_info ("rest rid=%llu answered after the client left; dropped",
                  (unsigned long long) job->req_id);
        s_job_end (job);
        return;
    }
    if (result->code != SBX_OK) {
        s_send_error (req, result->code, result->message);
        s_job_end (job);
        return;
    }
    if (job->op == SBX_OP_READ_FILE) {
        //  Files travel raw.
        gw_request_add_header (req, "Cache-Control", "no-store");
        if (result->take && *result->take) {
            //  Sent as read, not copied again.
            void *body = *result->take;
            *result->take = NULL;
            gw_request_respond_take (req, 200, "application/octet-stream", &body, result->size);
        } else
            gw_request_respond (req, 200, "application/octet-stream",
                                result->data ? (const void *) result->data : "", result->size);
        s_job_end (job);
        return;
    }
    //  Its success status as schemas/operations.json says (201: it made something).
    int status = sbx_ops[job->op].rest_status ? sbx_ops[job->op].rest_status : 200;
    const char *id = json_string_value (json_object_get (result->answer, "id"));
    if ((job->op == SBX_OP_CREATE_SANDBOX || job->op == SBX_OP_SAVE_SNAPSHOT ||
         job->op == SBX_OP_CREATE_WEBHOOK) &&
        id) {
        char location[200];
        snprintf (location, sizeof location, "/v1/%s/%s",
                  job->op == SBX_OP_CREATE_SANDBOX   ? "sandboxes"
                  : job->op == SBX_OP_CREATE_WEBHOOK ? "webhooks"
                                                     : "snapshots",
                  id);
        gw_request_add_header (req, "Location", location);
    }
    if (job->op == SBX_OP_EXEC && json_is_true (json_object_get (result->answer, "running")))
        status = 202; //  detached: poll GET …/processes/{processId}
    s_send_json (req, status, json_incref (result->answer));
    s_job_end (job);
}

static void s_serve (s_job_t *job, gw_request_t *req)
{
    const sbx_caller_t *caller = job->caller;
    const sbx_op_info_t *op = &sbx_ops[job->op];
    //  Keys only: OAuth tokens are for /mcp, and a leaked one must not reach the API.
    if (caller->kind != SBX_CALLER_KIND_API_KEY) {
        s_send_error (req, SBX_E_UNAUTHENTICATED, "the REST API takes API keys only");
        s_job_end (job);
        return;
    }
    //  Keys are the account's own business: only a full key may revoke one (the broker
    //  holds to that too).
    if (job->op == SBX_OP_REVOKE_KEY && caller->preset != SBX_KEY_PRESET_FULL) {
        s_send_error (req, SBX_E_PERMISSION_DENIED,
                      "only a full key can revoke keys; this key's preset is narrower");
        s_job_end (job);
        return;
    }
    //  The broker decides too; refusing here spares it the request and says why plainly.
    if (caller->preset == SBX_KEY_PRESET_READ_ONLY && !op->read_only) {
        char text[300];
        snprintf (text, sizeof text, "this key is read-only: it cannot use %s %s", op->method,
                  op->path);
        s_send_error (req, SBX_E_PERMISSION_DENIED, text);
        s_job_end (job);
        return;
    }
    s_input_t in = {.body = (const char *) gw_request_body (req),
                    .body_size = gw_request_body_size (req),
                    .query = s_request_query,
                    .source = req};
    char why[400];
    json_t *args = s_arguments (job, &in, why, sizeof why);
    if (!args) {
        s_send_error (req, SBX_E_INVALID_ARGUMENT, why);
        s_job_end (job);
        return;
    }
    const char *sandbox = sbx_api_sandbox_id (args);
    if (!op->read_only)
        sbx_info ("rest rid=%llu %s %s %s%s%s", (unsigned long long) job->req_id,
                  caller->account_id ? caller->account_id : "?", op->method, op->path,
                  sandbox ? " " : "", sandbox ? sandbox : "");
    if (job->op == SBX_OP_EXEC && !sbx_args_bool (SBX_OP_EXEC, args, "detached") &&
        gw_exec_stream_wanted (req)) {
        //  Its output as it comes (gw_exec_stream), checked as gw_ops would.
        if (sbx_args_check (SBX_OP_EXEC, SBX_OPS_REST, args, why, sizeof why))
            s_send_error (req, SBX_E_INVALID_ARGUMENT, why);
        else
            gw_exec_stream_start (job->rest->streams, req, caller, args);
        json_decref (args);
        s_job_end (job);
        return;
    }
    if (job->op == SBX_OP_OPEN_TERMINAL) {
        if (sbx_args_check (SBX_OP_OPEN_TERMINAL, SBX_OPS_REST, args, why, sizeof why))
            s_send_error (req, SBX_E_INVALID_ARGUMENT, why);
        else
            gw_terminal_start (job->rest->terminals, req, caller, args);
        json_decref (args);
        s_job_end (job);
        return;
    }
    if (job->op == SBX_OP_BUILD_TEMPLATE || job->op == SBX_OP_GET_TEMPLATE_BUILD) {
        //  The gateway's own (gw_builds): no broker request.
        json_t *answer = NULL;
        sbx_code_t code = SBX_E_INVALID_ARGUMENT;
        if (sbx_args_check (job->op, SBX_OPS_REST, args, why, sizeof why) == 0)
            code = job->op == SBX_OP_BUILD_TEMPLATE
                       ? gw_builds_start (job->rest->builds, caller->account_id, args, in.body,
                                          in.body_size, &answer, why, sizeof why)
                       : gw_builds_get (job->rest->builds, caller->account_id, args, &answer, why,
                                        sizeof why);
        if (code == SBX_E_NOT_FOUND && job->op == SBX_OP_GET_TEMPLATE_BUILD) {
            //  Not one of ours: behind a balancer, another gateway may run it.
            int64_t offset = sbx_args_int (SBX_OP_GET_TEMPLATE_BUILD, args, "logOffset");
            const char *id = sbx_args_string (SBX_OP_GET_TEMPLATE_BUILD, args, "buildId");
            sbx_msg_t *ask = sbx_msg_new (SBX_MSG_BUILD_GET);
            sbx_str_set (&sbx_msg_build_get (ask)->build_id, id);
            sbx_msg_build_get (ask)->log_offset = offset > 0 ? (uint64_t) offset : 0;
            job->not_found = strdup (why);
            char what[64], key[64];
            snprintf (what, sizeof what, "template build %s", id);
            snprintf (key, sizeof key, "build:%s", id);
            GW_KEEP (job->find, gw_others_ask (job->rest->others, caller, &ask, key, what,
                                               s_on_build_found, job));
            json_decref (args);
            return;
        }
        if (code != SBX_OK)
            s_send_error (req, code, why);
        else {
            if (job->op == SBX_OP_BUILD_TEMPLATE) {
                char location[100];
                snprintf (location, sizeof location, "/v1/templates/builds/%s",
                          json_string_value (json_object_get (answer, "id")));
                gw_request_add_header (req, "Location", location);
            }
            s_send_json (req, job->op == SBX_OP_BUILD_TEMPLATE ? 202 : 200, answer);
        }
        json_decref (args);
        s_job_end (job);
        return;
    }
    bool raw = op->rest_body == SBX_OPS_BODY_RAW;
    sbx_op_t which = job->op;
    //  A raw body (PUT's file) goes to the transfer as it came, not copied again.
    size_t size = 0;
    uint8_t *body = raw ? gw_request_body_take (req, &size) : NULL;
    uint64_t handle = gw_ops_call_take (job->rest->ops, which, SBX_OPS_REST, caller, args, &body,
                                        size, s_on_done, job);
    free (body);
    if (handle) { //  still running (else done came, and the job is gone)
        job->handle = handle;
        if (which == SBX_OP_READ_FILE)
            gw_ops_follow_read (job->rest->ops, handle, s_on_read, job);
    }
    json_decref (args);
}

sbx_msg_t *gw_rest_serve (gw_rest_t *self, const sbx_msg_t *request)
{
    if (request->type == SBX_MSG_BUILD_GET)
        return gw_builds_serve (self->builds, request);
    return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "a gateway does not serve %s",
                              sbx_msg_type_name (request->type));
}

static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_request_t *req = gw_http_request (job->rest->http, job->req_id);
    if (!req) {
        s_job_end (job); //  the client left meanwhile
        return;
    }
    gw_auth_limit_t limit;
    if (caller && gw_auth_take (job->rest->auth, caller, &limit)) {
        //  Over the key's rate: 429 with the IETF RateLimit fields and Retry-After.
        char text[200];
        snprintf (text, sizeof text, "this key may make %llu requests per second; retry in %llu s",
                  (unsigned long long) limit.limit, (unsigned long long) limit.reset_s);
        gw_auth_rate_headers (req, &limit);
        s_send_error (req, SBX_E_RATE_LIMITED, text);
        s_job_end (job);
        return;
    }
    if (caller && caller->kind == SBX_CALLER_KIND_OAUTH) {
        //  OAuth tokens are the connectors' (bound to the /mcp resource); code uses keys.
        s_send_error (req, SBX_E_UNAUTHENTICATED,
                      "OAuth access tokens work on /mcp only; create an API key with `sbx key "
                      "create` (or on your account page) for the REST API");
        s_job_end (job);
        return;
    }
    if (caller) {
        job->caller = gw_auth_caller_dup (caller);
        s_serve (job, req);
        return;
    }
    if (code == SBX_E_UNAUTHENTICATED)
        s_send_error (req, code,
                      gw_auth_account_refusal (message)
                          ? message //  the account is disabled: say so, the operator can help
                          : "the API key is unknown, expired or revoked");
    else if (code == SBX_E_INVALID_ARGUMENT)
        s_send_error (req, code, message ? message : "malformed credentials");
    else {
        //  The broker could not say: not the client's fault, and not a 401.
        char text[600];
        snprintf (text, sizeof text, "cannot check credentials now: %s",
                  message ? message : sbx_code_name (code));
        s_send_error (req, code, text);
    }
    s_job_end (job);
}

void gw_rest_handle (gw_rest_t *self, gw_request_t *req)
{
    char params[S_PARAMS][S_PARAM_MAX];
    const s_route_t *route;
    char allow[100];
    int rc = s_route (gw_request_method (req), gw_request_path (req), &route, params, allow,
                      sizeof allow);
    if (rc == 405) {
        gw_request_add_header (req, "Allow", allow);
        char text[400];
        snprintf (text, sizeof text, "%.20s is not allowed on %.200s (use %s)",
                  gw_request_method (req), gw_request_path (req), allow);
        s_send_json (
            req, 405,
            json_pack ("{s:{s:s, s:s}}", "error", "code", "method_not_allowed", "message", text));
        return;
    }
    if (rc == 404) {
        char text[300];
        snprintf (text, sizeof text, "no such API route: %.200s (see /v1/openapi.json)",
                  gw_request_path (req));
        s_send_error (req, SBX_E_NOT_FOUND, text);
        return;
    }
    if (route->op == SBX_OP_GET_OPENAPI) {
        gw_request_add_header (req, "Cache-Control", "no-cache");
        gw_request_respond (req, 200, "application/json", gw_rest_openapi, gw_rest_openapi_size);
        return;
    }
    const char *token = gw_auth_bearer (gw_request_header (req, "Authorization"));
    if (!token) {
        s_send_error (req, SBX_E_UNAUTHENTICATED,
                      "an API key is required: Authorization: Bearer sbx_…");
        return;
    }
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        s_send_error (req, SBX_E_INTERNAL, "out of memory");
        return;
    }
    job->rest = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    job->op = route->op;
    memcpy (job->params, params, sizeof params);
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    //  May answer at once (cached key); otherwise the request waits, suspended.
    gw_auth_check (self->auth, token, s_on_auth, job);
}

//  --------------------------------------------------------------------------
//  Self test: routing, arguments and the OpenAPI document; no broker, no socket.

typedef struct {
    const char *names[4], *values[4];
} s_query_t;

static const char *s_test_query (void *source, const char *name)
{
    s_query_t *q = source;
    for (int i = 0; i < 4 && q->names[i]; i++)
        if (streq (q->names[i], name))
            return q->values[i];
    return NULL;
}

//  The arguments of method path (with body and query), as JSON text; NULL with why.
static char *s_try (const char *method, const char *path, const char *body, s_query_t *query,
                    char *why)
{
    const s_route_t *route;
    char allow[100];
    s_job_t job = {0};
    if (s_route (method, path, &route, job.params, allow, sizeof allow)) {
        snprintf (why, 400, "no route");
        return NULL;
    }
    job.op = route->op;
    s_query_t none = {{0}, {0}};
    s_input_t in = {.body = body,
                    .body_size = body ? strlen (body) : 0,
                    .query = s_test_query,
                    .source = query ? query : &none};
    json_t *args = s_arguments (&job, &in, why, 400);
    if (!args)
        return NULL;
    //  What gw_ops checks next, with the table.
    if (sbx_args_check (job.op, SBX_OPS_REST, args, why, 400)) {
        json_decref (args);
        return NULL;
    }
    char *text = json_dumps (args, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref (args);
    return text;
}

static void s_expect (const char *method, const char *path, const char *body, s_query_t *query,
                      const char *expected)
{
    char why[400] = "";
    char *got = s_try (method, path, body, query, why);
    const char *seen = got ? got : why;
    if (!streq (seen, expected))
        fprintf (stderr, "%s %s %s: got %s, expected %s\n", method, path, body ? body : "", seen,
                 expected);
    assert (streq (seen, expected));
    free (got);
}

void gw_rest_test (bool verbose)
{
    (void) verbose;
    //  Path matching.
    char params[S_PARAMS][S_PARAM_MAX];
    assert (s_match ("/v1/sandboxes", "/v1/sandboxes", params));
    assert (!s_match ("/v1/sandboxes", "/v1/sandboxes/", params));
    assert (!s_match ("/v1/sandboxes", "/v1/sandbox", params));
    assert (!s_match ("/v1/sandboxes/{id}", "/v1/sandboxes", params));
    assert (!s_match ("/v1/sandboxes/{id}", "/v1/sandboxes//", params));
    assert (
        s_match ("/v1/sandboxes/{id}/processes/{pid}", "/v1/sandboxes/sb_1/processes/42", params));
    assert (streq (params[0], "sb_1") && streq (params[1], "42"));
    assert (!s_match ("/v1/sandboxes/{id}/processes/{pid}", "/v1/sandboxes/sb_1/processes/42/x",
                      params));

    //  Routing and methods.
    const s_route_t *route;
    char allow[100];
    assert (s_route ("GET", "/v1/sandboxes", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_LIST_SANDBOXES);
    assert (s_route ("POST", "/v1/sandboxes", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_CREATE_SANDBOX);
    assert (s_route ("DELETE", "/v1/sandboxes", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "GET, POST"));
    assert (s_route ("POST", "/v1/sandboxes/sb_x", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "GET, PATCH, DELETE"));
    assert (s_route ("PATCH", "/v1/sandboxes/sb_x", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_UPDATE_SANDBOX && streq (params[0], "sb_x"));
    assert (s_route ("GET", "/v1/sandboxes/sb_x/exec", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "POST"));
    assert (s_route ("PUT", "/v1/sandboxes/sb_x/files", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_WRITE_FILE);
    assert (s_route ("GET", "/v1/nothing", &route, params, allow, sizeof allow) == 404);
    assert (s_route ("GET", "/v1", &route, params, allow, sizeof allow) == 404);
    assert (s_route ("GET", "/v1/openapi.json", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_GET_OPENAPI);

    //  Arguments from path, query and body, checked by the operations' table.
    s_expect ("POST", "/v1/sandboxes", NULL, NULL, "{}");
    s_expect ("POST", "/v1/sandboxes",
              "{\"name\":\"demo\",\"type\":\"medium\",\"ttlSeconds\":600,"
              "\"labels\":{\"team\":\"a\"},\"network\":false}",
              NULL,
              "{\"labels\":{\"team\":\"a\"},\"name\":\"demo\",\"network\":false,"
              "\"ttlSeconds\":600,\"type\":\"medium\"}");
    s_expect ("POST", "/v1/sandboxes", "{\"name\":", NULL,
              "the body is not valid JSON: unexpected token near end of file (line 1, column 8)");
    s_expect ("POST", "/v1/sandboxes", "[1]", NULL, "the body must be a JSON object");
    s_expect ("POST", "/v1/sandboxes", "{\"ttl\":60}", NULL,
              "unknown field \"ttl\" (this operation takes: name, type, ttlSeconds, snapshotId, "
              "template, labels, network, autoResume, egress)");
    s_expect ("POST", "/v1/sandboxes", "{\"ttlSeconds\":\"60\"}", NULL,
              "ttlSeconds must be an integer");
    s_expect ("POST", "/v1/sandboxes", "{\"ttlSeconds\":5}", NULL,
              "ttlSeconds must be between 60 and 2592000");
    s_expect ("POST", "/v1/sandboxes", "{\"env\":{}}", NULL,
              "unknown field \"env\" (this operation takes: name, type, ttlSeconds, snapshotId, "
              "template, labels, network, autoResume, egress)");
    s_expect ("POST", "/v1/sandboxes/sb_x/extend", NULL, NULL, "a JSON object body is required");
    s_expect ("POST", "/v1/sandboxes/sb_x/extend", "{}", NULL, "ttlSeconds is required");
    s_expect ("POST", "/v1/sandboxes/sb_x/extend", "{\"ttlSeconds\":120}", NULL,
              "{\"sandboxId\":\"sb_x\",\"ttlSeconds\":120}");
    //  A body names no path argument.
    s_expect ("POST", "/v1/sandboxes/sb_x/exec", "{\"command\":\"ls\",\"sandboxId\":\"sb_y\"}",
              NULL,
              "unknown field \"sandboxId\" (this operation takes: command, detached, timeout, "
              "cwd, env, stdin, stdinEncoding)");
    s_expect ("POST", "/v1/sandboxes/sb_x/ports", "{\"port\":0}", NULL,
              "port must be between 1 and 65535");
    s_expect ("DELETE", "/v1/sandboxes/sb_x/ports/8000", NULL, NULL,
              "{\"port\":8000,\"sandboxId\":\"sb_x\"}");
    s_expect ("DELETE", "/v1/sandboxes/sb_x/ports/65536", NULL, NULL,
              "port must be between 1 and 65535");
    s_expect ("DELETE", "/v1/sandboxes/sb_x/ports/x", NULL, NULL, "port must be an integer");
    s_expect ("GET", "/v1/sandboxes/sb_x/processes/0", NULL, NULL,
              "processId must be between 1 and 2147483647");
    s_query_t q = {{"stdoutOffset", NULL}, {"12", NULL}};
    s_expect ("GET", "/v1/sandboxes/sb_x/processes/7", NULL, &q,
              "{\"processId\":7,\"sandboxId\":\"sb_x\",\"stdoutOffset\":12}");
    q = (s_query_t){{"stderrOffset"}, {"-1"}};
    s_expect ("GET", "/v1/sandboxes/sb_x/processes/7", NULL, &q, "stderrOffset must be an integer");
    s_expect ("PUT", "/v1/sandboxes/sb_x/files", "bytes", NULL, "path is required");
    q = (s_query_t){{"path", "mode"}, {"/root/a", "0755"}};
    s_expect ("PUT", "/v1/sandboxes/sb_x/files", "bytes", &q,
              "{\"mode\":\"0755\",\"path\":\"/root/a\",\"sandboxId\":\"sb_x\"}");
    q = (s_query_t){{"path", "mode"}, {"/root/a", "999"}};
    s_expect ("PUT", "/v1/sandboxes/sb_x/files", "", &q, "mode must match ^[0-7]{1,4}$");
    q = (s_query_t){{"path"}, {"relative"}};
    s_expect ("GET", "/v1/sandboxes/sb_x/files", NULL, &q,
              "path must be an absolute path such as /root/x");
    s_expect ("PATCH", "/v1/sandboxes/sb_x", "{\"labels\":{\"a\":\"1\",\"b\":null}}", NULL,
              "{\"labels\":{\"a\":\"1\",\"b\":null},\"sandboxId\":\"sb_x\"}");
    s_expect ("DELETE", "/v1/keys/key_1", NULL, NULL, "{\"keyId\":\"key_1\"}");

    //  The OpenAPI document parses and describes exactly the routes served.
    json_error_t jerr;
    json_t *doc = json_loadb (gw_rest_openapi, gw_rest_openapi_size, 0, &jerr);
    if (!doc)
        fprintf (stderr, "docs/openapi.json: %s at line %d\n", jerr.text, jerr.line);
    assert (doc);
    assert (strncmp (json_string_value (json_object_get (doc, "openapi")), "3.1", 3) == 0);
    json_t *paths = json_object_get (doc, "paths");
    assert (json_is_object (paths));
    for (const s_route_t *r = sbx_ops_routes; r->method; r++) {
        char method[10];
        for (size_t i = 0; i <= strlen (r->method); i++)
            method[i] = (char) tolower ((unsigned char) r->method[i]);
        json_t *operation = json_object_get (json_object_get (paths, r->path), method);
        if (!operation)
            fprintf (stderr, "docs/openapi.json lacks %s %s\n", r->method, r->path);
        assert (json_is_object (operation));
        assert (json_is_object (json_object_get (operation, "responses")));
    }
    const char *path;
    json_t *item;
    json_object_foreach (paths, path, item)
    {
        const char *method;
        json_t *operation;
        json_object_foreach (item, method, operation)
        {
            if (streq (method, "parameters") || streq (method, "summary") ||
                streq (method, "description"))
                continue;
            bool served = false;
            for (const s_route_t *r = sbx_ops_routes; r->method && !served; r++)
                served = streq (r->path, path) && strcasecmp (r->method, method) == 0;
            if (!served)
                fprintf (stderr, "docs/openapi.json lists %s %s, not served\n", method, path);
            assert (served);
        }
    }
    json_decref (doc);

    //  A request needs no broker to be refused.
    gw_ctx_t *ctx = gw_ctx_new (NULL, NULL, NULL, NULL);
    gw_rest_t *rest = ctx ? gw_rest_new (ctx) : NULL;
    assert (rest);
    gw_rest_destroy (&rest);
    gw_ctx_destroy (&ctx);
    assert (!rest);
}
