/*  gw_terminal - see gw_terminal.h */
#include "gw_terminal.h"
#include "gw_ctx.h"
#include "sbx_api.h"
#include "sbx_args.h"
#include "sbx_idmap.h"
#include "sbx_ws.h"

#include <signal.h>
#include <sys/socket.h>

#define S_WAIT_MS     20000       //  how long the agent may hold an output poll
#define S_CALL_MS     30000       //  the wait for one agent answer (above S_WAIT_MS)
#define S_CHUNK_MAX   (64 * 1024) //  output asked for per poll; input sent per agent.input
#define S_OUT_MAX     (1 << 20)   //  queued for a slow client before polling pauses
#define S_IN_MAX      (1 << 20)   //  keystrokes queued before the socket is not read
#define S_MESSAGE_MAX (1 << 20)   //  the largest message a client may send
#define S_RETRY_MS    20          //  the terminal's buffer was full: try the rest again
#define S_PING_MS     20000       //  keep-alive pings
#define S_CLOSE_MS    5000        //  a closing client that does not read is cut off

struct gw_terminal_t {
    zloop_t *loop;
    gw_http_t *http;
    gw_broker_t *broker;
    zhashx_t *sessions; //  serial → s_session_t
    uint64_t next_serial;
};

//  Bytes waiting to go somewhere: appended at the end, taken from the front.
typedef struct {
    uint8_t *data;
    size_t size, cap;
} s_buf_t;

static void s_buf_add (s_buf_t *b, const void *data, size_t size)
{
    if (b->size + size > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->size + size)
            cap *= 2;
        uint8_t *grown = realloc (b->data, cap);
        if (!grown)
            return; //  out of memory: the bytes are lost, the session goes on
        b->data = grown;
        b->cap = cap;
    }
    memcpy (b->data + b->size, data, size);
    b->size += size;
}

static void s_buf_drop (s_buf_t *b, size_t size)
{
    memmove (b->data, b->data + size, b->size - size);
    b->size -= size;
}

typedef struct {
    gw_terminal_t *owner;
    uint64_t serial;
    uint64_t req_id;
    gw_request_t *req; //  held until gw_request_upgrade_close; NULL when the client left
    sbx_caller_t *caller;
    char *sandbox_id;
    char accept[SBX_WS_ACCEPT_SIZE];
    uint64_t pid;
    int fd;     //  the upgraded socket (not ours to close); -1 before
    int events; //  what its poller waits for
    sbx_ws_t *ws;
    s_buf_t out;   //  frames not yet taken by the socket
    s_buf_t input; //  keystrokes not yet taken by the terminal
    uint64_t out_offset;
    uint64_t start_h, status_h, input_h, resize_h; //  agent requests in flight
    uint64_t input_sent;                           //  bytes in the agent.input in flight
    bool resize_wanted;
    uint64_t cols, rows;
    int retry_timer, ping_timer, close_timer;
    bool exited;  //  the process ended (or never started): nothing to kill
    bool closing; //  the close frame is queued; the socket goes when it is sent
    bool ended;   //  freed as soon as no callback of ours is on the stack
    int busy;
} s_session_t;

static void s_watch (s_session_t *s);
static void s_poll_output (s_session_t *s);
static void s_pump_input (s_session_t *s);
static void s_pump_resize (s_session_t *s);

//  --------------------------------------------------------------------------
//  The session's life

static void s_free (s_session_t *s)
{
    gw_terminal_t *self = s->owner;
    if (s->events) {
        zmq_pollitem_t item = {NULL, s->fd, 0, 0};
        zloop_poller_end (self->loop, &item);
    }
    if (s->retry_timer)
        zloop_timer_end (self->loop, s->retry_timer);
    if (s->ping_timer)
        zloop_timer_end (self->loop, s->ping_timer);
    if (s->close_timer)
        zloop_timer_end (self->loop, s->close_timer);
    gw_broker_cancel (self->broker, s->start_h);
    gw_broker_cancel (self->broker, s->status_h);
    gw_broker_cancel (self->broker, s->input_h);
    gw_broker_cancel (self->broker, s->resize_h);
    if (s->req) {
        gw_request_set_closed_fn (s->req, NULL, NULL);
        if (s->fd >= 0)
            gw_request_upgrade_close (s->req);
        else
            gw_request_respond (s->req, 503, NULL, NULL, 0);
    }
    sbx_ws_destroy (&s->ws);
    free (s->out.data);
    free (s->input.data);
    gw_auth_caller_destroy (&s->caller);
    free (s->sandbox_id);
    zhashx_delete (self->sessions, SBX_ID (s->serial));
    free (s);
}

static void s_enter (s_session_t *s)
{
    s->busy++;
}

static void s_leave (s_session_t *s)
{
    if (--s->busy == 0 && s->ended)
        s_free (s);
}

static void s_end (s_session_t *s)
{
    s->ended = true;
    if (s->busy == 0)
        s_free (s);
}

static void s_on_killed (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) reply;
    (void) code;
    (void) message;
    (void) arg; //  the process is gone either way, or was already
}

//  The client is gone or closed: the terminal's process goes too, as on a hangup.
static void s_kill (s_session_t *s)
{
    if (!s->pid || s->exited)
        return;
    s->exited = true;
    sbx_msg_t *kill = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (kill)->pid = s->pid;
    sbx_msg_agent_kill (kill)->signal = SIGKILL;
    gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &kill, S_CALL_MS, s_on_killed,
                          NULL);
}

//  --------------------------------------------------------------------------
//  The socket

//  Sends what it takes now; the rest waits for POLLOUT. -1 when the socket failed.
static int s_flush (s_session_t *s)
{
    size_t size = s->out.size;
    size_t sent = 0;
    while (sent < size) {
        ssize_t n = send (s->fd, s->out.data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            sent += (size_t) n;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        else
            return -1;
    }
    s_buf_drop (&s->out, sent);
    return 0;
}

static void s_after_flush (s_session_t *s)
{
    if (s->closing && s->out.size == 0) {
        s_end (s); //  the close frame is out
        return;
    }
    s_watch (s);
    //  Room again: the output poll that paused for a slow client goes on.
    if (!s->status_h && !s->exited && !s->closing && s->out.size < S_OUT_MAX / 2)
        s_poll_output (s);
}

//  size is read after frame was made (an argument's order of evaluation is not fixed).
static void s_queue (s_session_t *s, uint8_t *frame, const size_t *size)
{
    if (!frame)
        return;
    s_buf_add (&s->out, frame, *size);
    free (frame);
}

static void s_send_frame (s_session_t *s, sbx_ws_op_t op, const void *data, size_t size)
{
    size_t fsize = 0;
    s_queue (s, sbx_ws_frame (op, data, size, false, &fsize), &fsize);
}

static void s_send_json (s_session_t *s, json_t *body)
{
    char *text = json_dumps (body, JSON_COMPACT);
    json_decref (body);
    if (text)
        s_send_frame (s, SBX_WS_TEXT, text, strlen (text));
    free (text);
}

static void s_send_error (s_session_t *s, sbx_code_t code, const char *message)
{
    s_send_json (s, json_pack ("{s:s, s:{s:s, s:s}}", "type", "error", "error", "code",
                               sbx_code_name (code), "message", message));
}

static int s_on_close_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_session_t *s = arg;
    s->close_timer = 0;
    s_end (s);
    return 0;
}

//  Queues the close frame; the socket closes once it is sent (or after S_CLOSE_MS).
static void s_close (s_session_t *s, uint16_t code, const char *reason)
{
    if (s->closing)
        return;
    size_t fsize = 0;
    s_queue (s, sbx_ws_close_frame (code, reason, false, &fsize), &fsize);
    s->closing = true;
    s->close_timer = zloop_timer (s->owner->loop, S_CLOSE_MS, 1, s_on_close_timer, s);
    if (s_flush (s)) {
        s_end (s);
        return;
    }
    s_after_flush (s);
}

static int s_on_socket (zloop_t *loop, zmq_pollitem_t *item, void *arg);

//  Polls for what the session can take: input while its queues have room, output
//  while frames wait.
static void s_watch (s_session_t *s)
{
    if (s->ended || s->fd < 0)
        return;
    int want = 0;
    if (!s->closing && s->input.size < S_IN_MAX)
        want |= ZMQ_POLLIN;
    if (s->out.size)
        want |= ZMQ_POLLOUT;
    if (want == s->events)
        return;
    zmq_pollitem_t item = {NULL, s->fd, 0, 0};
    if (s->events)
        zloop_poller_end (s->owner->loop, &item);
    s->events = 0;
    if (want) {
        item.events = (short) want;
        if (zloop_poller (s->owner->loop, &item, s_on_socket, s) == 0) {
            zloop_poller_set_tolerant (s->owner->loop, &item);
            s->events = want;
        }
    }
}

//  One message of the client's.
static void s_on_message (s_session_t *s, sbx_ws_op_t op, const uint8_t *data, size_t size)
{
    if (op == SBX_WS_BINARY) {
        s_buf_add (&s->input, data, size);
        s_pump_input (s);
    } else if (op == SBX_WS_TEXT) {
        json_error_t jerr;
        json_t *m = json_loadb ((const char *) data, size, 0, &jerr);
        const char *type = json_string_value (json_object_get (m, "type"));
        json_t *cols = json_object_get (m, "cols"), *rows = json_object_get (m, "rows");
        if (type && streq (type, "resize") && json_is_integer (cols) && json_is_integer (rows) &&
            json_integer_value (cols) >= 1 && json_integer_value (cols) <= 1000 &&
            json_integer_value (rows) >= 1 && json_integer_value (rows) <= 1000) {
            s->cols = (uint64_t) json_integer_value (cols);
            s->rows = (uint64_t) json_integer_value (rows);
            s->resize_wanted = true;
            s_pump_resize (s);
        } else if (type && streq (type, "resize"))
            s_send_error (s, SBX_E_INVALID_ARGUMENT,
                          "resize needs cols and rows, integers from 1 to 1000");
        else
            s_send_error (s, SBX_E_INVALID_ARGUMENT,
                          "a text message is one JSON object {\"type\": \"resize\", \"cols\": N, "
                          "\"rows\": N}; keystrokes go in binary messages");
        json_decref (m);
    } else if (op == SBX_WS_PING)
        s_send_frame (s, SBX_WS_PONG, data, size);
    else if (op == SBX_WS_CLOSE) {
        sbx_info ("rest rid=%llu terminal %s process %llu: the client closed (%u)",
                  (unsigned long long) s->req_id, s->sandbox_id, (unsigned long long) s->pid,
                  sbx_ws_close_code (data, size));
        s_kill (s);
        s_close (s, SBX_WS_CLOSE_NORMAL, "closed");
    }
}

//  Takes the messages the parser holds.
static void s_take_messages (s_session_t *s)
{
    sbx_ws_op_t op;
    const uint8_t *data;
    size_t size;
    uint16_t code;
    char why[200];
    int rc;
    while (!s->ended && !s->closing &&
           (rc = sbx_ws_next (s->ws, &op, &data, &size, &code, why, sizeof why)) != 0) {
        if (rc < 0) {
            sbx_info ("rest rid=%llu terminal %s: %s; closed (%u)", (unsigned long long) s->req_id,
                      s->sandbox_id, why, code);
            s_kill (s);
            s_close (s, code, why);
            return;
        }
        s_on_message (s, op, data, size);
    }
}

//  Sends what waits; the session ends when the socket failed.
static void s_send_now (s_session_t *s)
{
    if (s->ended)
        return;
    if (s_flush (s) == 0)
        s_after_flush (s);
    else {
        s_kill (s);
        s_end (s);
    }
}

static int s_on_socket (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    s_session_t *s = arg;
    s_enter (s);
    if (item->revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        uint8_t buf[16384];
        ssize_t n = recv (s->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            sbx_info ("rest rid=%llu terminal %s process %llu: the client left; killed",
                      (unsigned long long) s->req_id, s->sandbox_id, (unsigned long long) s->pid);
            s_kill (s);
            s_end (s);
        } else if (n > 0 && !s->closing) {
            sbx_ws_feed (s->ws, buf, (size_t) n);
            s_take_messages (s);
        }
    }
    s_send_now (s);
    s_leave (s);
    return 0;
}

//  --------------------------------------------------------------------------
//  The agent

static void s_on_status (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_session_t *s = arg;
    s->status_h = 0;
    if (s->ended || s->closing)
        return;
    s_enter (s);
    if (!reply || reply->type != SBX_MSG_AGENT_STATUS_OK) {
        sbx_info ("rest rid=%llu terminal %s process %llu: %s", (unsigned long long) s->req_id,
                  s->sandbox_id, (unsigned long long) s->pid,
                  reply ? "unexpected answer" : message);
        s_send_error (s, reply ? SBX_E_INTERNAL : code, reply ? "unexpected answer" : message);
        s_kill (s);
        s_close (s, SBX_WS_CLOSE_INTERNAL, "the terminal cannot go on");
        s_leave (s);
        return;
    }
    sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
    if (ok->stdout.size)
        s_send_frame (s, SBX_WS_BINARY, ok->stdout.data, ok->stdout.size);
    s->out_offset = ok->stdout_next_offset;
    if (!ok->running && !ok->stdout_more) {
        s->exited = true;
        sbx_info ("rest rid=%llu terminal %s process %llu ended: exit %lld",
                  (unsigned long long) s->req_id, s->sandbox_id, (unsigned long long) s->pid,
                  (long long) ok->exit_code);
        s_send_json (s, json_pack ("{s:s, s:I, s:I, s:I}", "type", "exit", "processId",
                                   (json_int_t) s->pid, "exitCode", (json_int_t) ok->exit_code,
                                   "signal", (json_int_t) ok->signal));
        s_close (s, SBX_WS_CLOSE_NORMAL, "the command ended");
        s_leave (s);
        return;
    }
    s_send_now (s); //  and polls again, unless the client is behind
    s_leave (s);
}

static void s_poll_output (s_session_t *s)
{
    sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_agent_status_t *m = sbx_msg_agent_status (status);
    m->pid = s->pid;
    m->stdout_offset = s->out_offset;
    m->max_bytes = S_CHUNK_MAX;
    m->wait_ms = S_WAIT_MS;
    GW_KEEP (s->status_h, gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &status,
                                                S_CALL_MS, s_on_status, s));
}

static int s_on_retry (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_session_t *s = arg;
    s->retry_timer = 0;
    s_enter (s);
    s_pump_input (s);
    s_leave (s);
    return 0;
}

static void s_on_input (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) code;
    (void) message;
    s_session_t *s = arg;
    s->input_h = 0;
    if (s->ended)
        return;
    s_enter (s);
    size_t taken = s->input_sent;
    bool full = false;
    if (reply && reply->type == SBX_MSG_AGENT_INPUT_OK) {
        uint64_t written = sbx_msg_agent_input_ok (reply)->written;
        full = written < taken;
        taken = written < taken ? (size_t) written : taken;
    }
    //  Refused (the process ended: its exit comes with the output): the keys go.
    s_buf_drop (&s->input, taken);
    s->input_sent = 0;
    if (full)
        s->retry_timer = zloop_timer (s->owner->loop, S_RETRY_MS, 1, s_on_retry, s);
    else
        s_pump_input (s);
    s_watch (s); //  room again for the client's keystrokes
    s_leave (s);
}

static void s_pump_input (s_session_t *s)
{
    if (s->input_h || s->retry_timer || !s->pid || s->exited || !s->input.size)
        return;
    size_t size = s->input.size;
    s->input_sent = size < S_CHUNK_MAX ? size : S_CHUNK_MAX;
    sbx_msg_t *input = sbx_msg_new (SBX_MSG_AGENT_INPUT);
    sbx_msg_agent_input (input)->pid = s->pid;
    sbx_bytes_set (&sbx_msg_agent_input (input)->data, s->input.data, s->input_sent);
    GW_KEEP (s->input_h, gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &input,
                                               S_CALL_MS, s_on_input, s));
}

static void s_on_resized (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) reply;
    (void) code;
    (void) message;
    s_session_t *s = arg;
    s->resize_h = 0;
    if (s->ended)
        return;
    s_enter (s);
    s_pump_resize (s); //  the window changed again meanwhile
    s_leave (s);
}

//  Only the latest size matters: one agent.resize in flight, the newest size next.
static void s_pump_resize (s_session_t *s)
{
    if (s->resize_h || !s->resize_wanted || !s->pid || s->exited)
        return;
    s->resize_wanted = false;
    sbx_msg_t *resize = sbx_msg_new (SBX_MSG_AGENT_RESIZE);
    sbx_msg_agent_resize (resize)->pid = s->pid;
    sbx_msg_agent_resize (resize)->cols = s->cols;
    sbx_msg_agent_resize (resize)->rows = s->rows;
    GW_KEEP (s->resize_h, gw_broker_send_agent (s->owner->broker, s->caller, s->sandbox_id, &resize,
                                                S_CALL_MS, s_on_resized, s));
}

static int s_on_ping (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_session_t *s = arg;
    s_enter (s);
    if (!s->closing) {
        s_send_frame (s, SBX_WS_PING, "sbx", 3);
        s_send_now (s);
    }
    s_leave (s);
    return 0;
}

//  --------------------------------------------------------------------------
//  Opening

static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_session_t *s = arg;
    s->req = NULL;
    if (s->events) {
        zmq_pollitem_t item = {NULL, s->fd, 0, 0};
        zloop_poller_end (s->owner->loop, &item);
        s->events = 0;
    }
    s->fd = -1; //  the server closes it with the request
    s_kill (s);
    s_end (s);
}

//  The session's start, from the loop: inside the upgrade callback libmicrohttpd has
//  not yet taken the socket's other end into its poll (HTTPS), and would miss bytes
//  written there now.
static int s_on_open (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_session_t *s = arg;
    s->retry_timer = 0;
    s_enter (s);
    s_send_json (s, json_pack ("{s:s, s:I}", "type", "start", "processId", (json_int_t) s->pid));
    s->ping_timer = zloop_timer (s->owner->loop, S_PING_MS, 0, s_on_ping, s);
    s_take_messages (s); //  what the client sent right after its request
    if (!s->ended && !s->closing)
        s_poll_output (s);
    s_send_now (s);
    s_leave (s);
    return 0;
}

static void s_on_upgraded (gw_request_t *req, int fd, const void *extra, size_t extra_size,
                           void *arg)
{
    (void) req;
    s_session_t *s = arg;
    s->fd = fd;
    sbx_info ("rest rid=%llu terminal %s process %llu opened", (unsigned long long) s->req_id,
              s->sandbox_id, (unsigned long long) s->pid);
    if (extra_size)
        sbx_ws_feed (s->ws, extra, extra_size);
    s->retry_timer = zloop_timer (s->owner->loop, 1, 1, s_on_open, s);
}

static void s_respond_error (gw_request_t *req, sbx_code_t code, const char *message)
{
    json_t *body = json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message",
                              message ? message : sbx_code_name (code));
    char *text = json_dumps (body, JSON_COMPACT);
    json_decref (body);
    gw_request_respond (req, sbx_code_http_status (code), "application/json", text,
                        text ? strlen (text) : 0);
    free (text);
}

static void s_on_started (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_session_t *s = arg;
    s->start_h = 0;
    s_enter (s);
    if (reply && reply->type == SBX_MSG_AGENT_EXEC_OK)
        s->pid = sbx_msg_agent_exec_ok (reply)->pid;
    if (!s->req) {
        s_kill (s); //  gone before it started
        s_end (s);
    } else if (!s->pid) {
        gw_request_t *req = s->req;
        gw_request_set_closed_fn (req, NULL, NULL);
        s->req = NULL;
        s_respond_error (req, reply ? SBX_E_INTERNAL : code, reply ? "unexpected answer" : message);
        s->exited = true;
        s_end (s);
    } else {
        gw_request_add_header (s->req, "Sec-WebSocket-Accept", s->accept);
        if (gw_request_upgrade (s->req, "websocket", s_on_upgraded, s) != 0) {
            gw_request_t *req = s->req;
            gw_request_set_closed_fn (req, NULL, NULL);
            s->req = NULL;
            s_respond_error (req, SBX_E_INVALID_ARGUMENT,
                             "the WebSocket upgrade failed (it needs HTTP/1.1)");
            s_kill (s);
            s_end (s);
        }
    }
    s_leave (s);
}

//  True when a header's comma-separated tokens include token (any case).
static bool s_has_token (const char *header, const char *token)
{
    size_t len = strlen (token);
    for (const char *p = header; p && *p;) {
        p += strspn (p, " \t,");
        size_t n = strcspn (p, " \t,");
        if (n == len && strncasecmp (p, token, len) == 0)
            return true;
        p += n;
    }
    return false;
}

void gw_terminal_start (gw_terminal_t *self, gw_request_t *req, const sbx_caller_t *caller,
                        json_t *args)
{
    const char *upgrade = gw_request_header (req, "Upgrade");
    const char *connection = gw_request_header (req, "Connection");
    const char *version = gw_request_header (req, "Sec-WebSocket-Version");
    char accept[SBX_WS_ACCEPT_SIZE];
    if (!upgrade || strcasecmp (upgrade, "websocket") || !connection ||
        !s_has_token (connection, "upgrade")) {
        s_respond_error (req, SBX_E_INVALID_ARGUMENT,
                         "this route is a WebSocket: send GET with Upgrade: websocket, "
                         "Connection: Upgrade, Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key "
                         "(RFC 6455); `sbx sandbox shell` does");
        return;
    }
    if (!version || !streq (version, "13")) {
        gw_request_add_header (req, "Sec-WebSocket-Version", "13");
        s_respond_error (req, SBX_E_INVALID_ARGUMENT,
                         "Sec-WebSocket-Version must be 13 (RFC 6455)");
        return;
    }
    if (sbx_ws_accept (gw_request_header (req, "Sec-WebSocket-Key"), accept)) {
        s_respond_error (req, SBX_E_INVALID_ARGUMENT,
                         "Sec-WebSocket-Key must be the base64 of 16 random bytes (RFC 6455)");
        return;
    }
    bool agent;
    uint32_t deadline;
    char why[400];
    sbx_msg_t *exec = sbx_api_request (SBX_OP_OPEN_TERMINAL, args, caller->account_id, &agent,
                                       &deadline, why, sizeof why);
    if (!exec) {
        s_respond_error (req, SBX_E_INVALID_ARGUMENT, why);
        return;
    }
    s_session_t *s = calloc (1, sizeof *s);
    s->owner = self;
    s->serial = self->next_serial++;
    s->req_id = gw_request_id (req);
    s->req = req;
    s->fd = -1;
    s->caller = gw_auth_caller_dup (caller);
    s->sandbox_id = strdup (sbx_api_sandbox_id (args));
    snprintf (s->accept, sizeof s->accept, "%s", accept);
    s->ws = sbx_ws_new (true, S_MESSAGE_MAX);
    zhashx_insert (self->sessions, SBX_ID (s->serial), s);
    gw_request_set_closed_fn (req, s_on_closed, s);
    s_enter (s);
    GW_KEEP (s->start_h, gw_broker_send_agent (self->broker, caller, s->sandbox_id, &exec,
                                               S_CALL_MS, s_on_started, s));
    s_leave (s);
}

//  --------------------------------------------------------------------------
//  The service

gw_terminal_t *gw_terminal_new (gw_ctx_t *ctx)
{
    gw_terminal_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = ctx->loop;
    self->http = ctx->http;
    self->broker = ctx->broker;
    self->next_serial = 1;
    self->sessions = sbx_idmap_new ();
    if (!self->sessions) {
        free (self);
        return NULL;
    }
    return self;
}

void gw_terminal_destroy (gw_terminal_t **self_p)
{
    gw_terminal_t *self = *self_p;
    if (!self)
        return;
    //  A gateway that stops says so to each client, best effort, and kills its process.
    s_session_t *s;
    while ((s = zhashx_first (self->sessions))) {
        if (s->fd >= 0 && !s->closing) {
            size_t fsize = 0;
            s_queue (s,
                     sbx_ws_close_frame (SBX_WS_CLOSE_GOING_AWAY, "the gateway is stopping", false,
                                         &fsize),
                     &fsize);
            s_flush (s);
        }
        s_kill (s);
        s->busy = 0;
        s_free (s);
    }
    zhashx_destroy (&self->sessions);
    free (self);
    *self_p = NULL;
}

void gw_terminal_test (bool verbose)
{
    (void) verbose;
    assert (s_has_token ("keep-alive, Upgrade", "upgrade"));
    assert (s_has_token ("Upgrade", "upgrade"));
    assert (!s_has_token ("keep-alive, upgrades", "upgrade"));
    assert (!s_has_token (NULL, "upgrade"));
    //  Without a peer nothing can start; what needs a guest is
    //  tests/integration/test_remote_cli.py's shell test.
    gw_ctx_t ctx = {0};
    ctx.broker = gw_broker_new (NULL);
    gw_terminal_t *terminals = gw_terminal_new (&ctx);
    assert (terminals);
    gw_terminal_destroy (&terminals);
    assert (!terminals);
    gw_broker_destroy (&ctx.broker);
}
