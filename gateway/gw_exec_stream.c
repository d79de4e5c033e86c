/*  gw_exec_stream - see gw_exec_stream.h */
#include "gw_exec_stream.h"
#include "gw_ctx.h"
#include "sbx_api.h"
#include "sbx_args.h"
#include "sbx_idmap.h"

#include <signal.h>

#define S_POLL_MS   200         //  how often a running command's output is asked for
#define S_CHUNK_MAX (64 * 1024) //  output asked for per poll, per stream
#define S_STATUS_MS 30000       //  the wait for one agent answer

struct gw_exec_stream_t {
    zloop_t *loop;
    gw_http_t *http;
    gw_broker_t *broker;
    zhashx_t *streams; //  serial → s_stream_t
    uint64_t next_serial;
};

typedef struct {
    gw_exec_stream_t *owner;
    uint64_t serial;
    uint64_t req_id;
    gw_request_t *req; //  once the stream started; NULL when the client left
    sbx_caller_t *caller;
    char *sandbox_id;
    uint64_t pid;
    uint64_t out_offset, err_offset;
    uint64_t handle; //  the agent request in flight
    int timer_id;    //  0: none armed
    bool waiting;    //  for the drain callback
    bool done;
} s_stream_t;

static void s_stream_free (s_stream_t *s)
{
    if (s->timer_id)
        zloop_timer_end (s->owner->loop, s->timer_id);
    gw_broker_cancel (s->owner->broker, s->handle);
    gw_auth_caller_destroy (&s->caller);
    free (s->sandbox_id);
    free (s);
}

static void s_forget (s_stream_t *s)
{
    zhashx_delete (s->owner->streams, (void *) (uintptr_t) s->serial);
    s_stream_free (s);
}

gw_exec_stream_t *gw_exec_stream_new (gw_ctx_t *ctx)
{
    gw_exec_stream_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = ctx->loop;
    self->http = ctx->http;
    self->broker = ctx->broker;
    self->next_serial = 1;
    self->streams = sbx_idmap_new ();
    if (!self->streams) {
        free (self);
        return NULL;
    }
    return self;
}

static void s_kill (s_stream_t *s);

void gw_exec_stream_destroy (gw_exec_stream_t **self_p)
{
    gw_exec_stream_t *self = *self_p;
    if (!self)
        return;
    for (s_stream_t *s = zhashx_first (self->streams); s; s = zhashx_next (self->streams)) {
        if (s->req)
            gw_request_set_closed_fn (s->req, NULL, NULL);
        s_kill (s);
        s_stream_free (s);
    }
    zhashx_destroy (&self->streams);
    free (self);
    *self_p = NULL;
}

bool gw_exec_stream_wanted (gw_request_t *req)
{
    const char *accept = gw_request_header (req, "Accept");
    return accept && strcasestr (accept, "text/event-stream");
}

//  "event: NAME\ndata: <json>\n\n" onto the stream (body taken). -1 when the buffer is
//  full (the drain callback follows) or the client is gone.
static int s_event (s_stream_t *s, const char *name, json_t *body)
{
    char *json = json_dumps (body, JSON_COMPACT);
    json_decref (body);
    if (!json)
        return 0;
    char *event = zsys_sprintf ("event: %s\ndata: %s\n\n", name, json);
    free (json);
    int rc = s->req ? gw_request_stream_write (s->req, event, strlen (event)) : -1;
    free (event);
    return rc;
}

static void s_on_killed (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) reply;
    (void) code;
    (void) message;
    (void) arg; //  the process is gone either way, or was already
}

//  The client is gone: its command goes too.
static void s_kill (s_stream_t *s)
{
    if (!s->pid || s->done)
        return;
    sbx_msg_t *kill = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (kill)->pid = s->pid;
    sbx_msg_agent_kill (kill)->signal = SIGKILL;
    gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &kill, S_STATUS_MS,
                          s_on_killed, NULL);
}

static void s_end (s_stream_t *s)
{
    if (s->req) {
        gw_request_set_closed_fn (s->req, NULL, NULL);
        gw_request_set_drain_fn (s->req, NULL, NULL);
        gw_request_stream_end (s->req);
        s->req = NULL;
    }
    s_forget (s);
}

static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_stream_t *s = arg;
    s->req = NULL;
    sbx_info ("rest rid=%llu exec stream of process %llu in %s: the client left; killed",
              (unsigned long long) s->req_id, (unsigned long long) s->pid, s->sandbox_id);
    s_kill (s);
    s_forget (s);
}

static void s_poll (s_stream_t *s);

static int s_on_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_stream_t *s = arg;
    s->timer_id = 0;
    s_poll (s);
    return 0;
}

static void s_on_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_stream_t *s = arg;
    if (s->waiting) {
        s->waiting = false;
        s_poll (s);
    }
}

static void s_fail (s_stream_t *s, sbx_code_t code, const char *message)
{
    s_event (s, "error",
             json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message",
                        message ? message : sbx_code_name (code)));
    s_end (s);
}

static void s_on_status (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_stream_t *s = arg;
    s->handle = 0;
    if (!reply || reply->type != SBX_MSG_AGENT_STATUS_OK) {
        s_fail (s, reply ? SBX_E_INTERNAL : code, reply ? "unexpected answer" : message);
        return;
    }
    sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
    //  An offset moves on only once its text is queued: a full buffer loses nothing.
    int refused = 0;
    if (ok->stdout.size)
        refused =
            s_event (s, "stdout",
                     json_pack ("{s:o}", "text", sbx_api_text (ok->stdout.data, ok->stdout.size)));
    if (!refused)
        s->out_offset = ok->stdout_next_offset;
    if (!refused && ok->stderr.size)
        refused =
            s_event (s, "stderr",
                     json_pack ("{s:o}", "text", sbx_api_text (ok->stderr.data, ok->stderr.size)));
    if (!refused)
        s->err_offset = ok->stderr_next_offset;
    if (refused) {
        if (s->req)
            s->waiting = true; //  the drain callback asks again from there
        return;                //  else the client is gone: s_on_closed follows
    }
    bool more = ok->stdout_more || ok->stderr_more;
    if (!ok->running && !more) {
        int rc = s_event (
            s, "exit",
            json_pack ("{s:I, s:I, s:s, s:s, s:I, s:I, s:b, s:b, s:b, s:b}", "processId",
                       (json_int_t) s->pid, "exitCode", (json_int_t) ok->exit_code, "stdout", "",
                       "stderr", "", "stdoutNextOffset", (json_int_t) ok->stdout_next_offset,
                       "stderrNextOffset", (json_int_t) ok->stderr_next_offset, "stdoutTruncated",
                       ok->stdout_truncated, "stderrTruncated", ok->stderr_truncated, "timedOut",
                       ok->timed_out, "running", false));
        if (rc && s->req) {
            s->waiting = true; //  the last event waits for room too
            return;
        }
        s->done = true;
        s_end (s);
        return;
    }
    if (more)
        s_poll (s);
    else
        s->timer_id = zloop_timer (s->owner->loop, S_POLL_MS, 1, s_on_timer, s);
}

static void s_poll (s_stream_t *s)
{
    sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_agent_status_t *m = sbx_msg_agent_status (status);
    m->pid = s->pid;
    m->stdout_offset = s->out_offset;
    m->stderr_offset = s->err_offset;
    m->max_bytes = S_CHUNK_MAX;
    GW_KEEP (s->handle, gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &status,
                                              S_STATUS_MS, s_on_status, s));
}

static void s_on_started (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_stream_t *s = arg;
    s->handle = 0;
    gw_request_t *req = gw_http_request (s->owner->http, s->req_id);
    if (reply && reply->type == SBX_MSG_AGENT_EXEC_OK)
        s->pid = sbx_msg_agent_exec_ok (reply)->pid;
    if (!req) {
        s_kill (s); //  gone before it started
        s_forget (s);
        return;
    }
    if (!s->pid) {
        json_t *body = json_pack ("{s:{s:s, s:s}}", "error", "code",
                                  sbx_code_name (reply ? SBX_E_INTERNAL : code), "message",
                                  reply     ? "unexpected answer"
                                  : message ? message
                                            : "");
        char *text = json_dumps (body, JSON_COMPACT);
        json_decref (body);
        gw_request_respond (req, sbx_code_http_status (reply ? SBX_E_INTERNAL : code),
                            "application/json", text, strlen (text));
        free (text);
        s_forget (s);
        return;
    }
    gw_request_add_header (req, "Cache-Control", "no-cache");
    gw_request_stream_start (req, 200, "text/event-stream");
    s->req = req;
    gw_request_set_closed_fn (req, s_on_closed, s);
    gw_request_set_drain_fn (req, s_on_drain, s);
    sbx_info ("rest rid=%llu exec in %s streams process %llu", (unsigned long long) s->req_id,
              s->sandbox_id, (unsigned long long) s->pid);
    if (s_event (s, "start", json_pack ("{s:I}", "processId", (json_int_t) s->pid)) && s->req)
        s->waiting = true;
    else if (s->req)
        s_poll (s);
}

void gw_exec_stream_start (gw_exec_stream_t *self, gw_request_t *req, const sbx_caller_t *caller,
                           json_t *args)
{
    bool agent;
    uint32_t deadline;
    char why[400];
    sbx_msg_t *exec =
        sbx_api_request (SBX_OP_EXEC, args, caller->account_id, &agent, &deadline, why, sizeof why);
    if (!exec) {
        json_t *body =
            json_pack ("{s:{s:s, s:s}}", "error", "code", "invalid_argument", "message", why);
        char *text = json_dumps (body, JSON_COMPACT);
        json_decref (body);
        gw_request_respond (req, 400, "application/json", text, strlen (text));
        free (text);
        return;
    }
    //  Detached, so that its output can be read while it runs, but with exec's timeout.
    sbx_agent_exec_t *m = sbx_msg_agent_exec (exec);
    m->detached = true;
    m->timeout_ms = (uint64_t) sbx_args_int (SBX_OP_EXEC, args, "timeout") * 1000;
    s_stream_t *s = calloc (1, sizeof *s);
    s->owner = self;
    s->serial = self->next_serial++;
    s->req_id = gw_request_id (req);
    s->caller = gw_auth_caller_dup (caller);
    s->sandbox_id = strdup (sbx_api_sandbox_id (args));
    zhashx_insert (self->streams, (void *) (uintptr_t) s->serial, s);
    GW_KEEP (s->handle, gw_broker_send_agent (self->broker, caller, s->sandbox_id, &exec,
                                              S_STATUS_MS, s_on_started, s));
}

void gw_exec_stream_test (bool verbose)
{
    (void) verbose;
    //  Without a peer the start fails unavailable at once; what needs a guest is
    //  tests/integration/test_remote_cli.py's and test_rest.py's.
    gw_ctx_t ctx = {0};
    ctx.broker = gw_broker_new (NULL);
    gw_exec_stream_t *streams = gw_exec_stream_new (&ctx);
    assert (streams);
    gw_exec_stream_destroy (&streams);
    assert (!streams);
    gw_broker_destroy (&ctx.broker);
}
