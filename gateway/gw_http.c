/*  gw_http - see gw_http.h

    How libmicrohttpd (0.9.75) is driven:
    - MHD_USE_EPOLL without an internal thread: MHD keeps one epoll fd, which the
      zloop polls as a plain fd; MHD_run does the work, never blocking.
    - MHD has timeouts (idle connections) and work it already read but did not finish
      (TLS records, "eready" connections); MHD_get_timeout says when to run again, and
      one timerfd is kept at that deadline (see s_arm). Not a zloop timer: czmq 4.2.1
      ends timers lazily, so a cancelled one can still fire after gw_http_destroy.
    - A request is made in the URI log callback (the earliest hook, which also gives
      the request target as sent) and freed in the completion callback, which MHD
      calls once for every request it told us about, however it ended.
    - MHD only accepts a response from inside its access callback. A handler that
      answers later leaves the connection suspended; respond stores the response and
      resumes it, MHD calls the access callback again, and it is queued then.
    - MHD does not watch suspended connections, so a client that leaves would go
      unnoticed until the answer: each suspended socket sits in a second epoll set of
      ours (EPOLLRDHUP, beside the timerfd) that the loop also polls. A hang-up
      resumes the connection as gone; MHD closes it and the owner's closed callback
      follows.
    - Streams are callback responses: the reader copies from our buffer, or suspends
      the connection when the buffer is empty; a write resumes it.
    - MHD's connection timeout is an idle timeout, started again by every byte, so a
      client that trickles a byte every few seconds (slowloris) would hold its
      connection for ever. Each connection gets a record (MHD's connection notifier)
      with our own deadlines: headers complete by a fixed time, a body that keeps
      growing; a sweep, run from the same timerfd at the earliest deadline, shuts the
      socket of a connection past one, and MHD, reading EOF, closes it as usual.
    - MHD 0.9.75 accepts a response only before the body starts or after it ends, so
      a chunked body found too large on the way is read to its end and dropped (for a
      bounded time) before its 413 goes out. A Transfer-Encoding other than chunked
      would make MHD read the body until the client closes: it is refused (501) as
      soon as the headers are in.
    - Upgraded HTTPS connections reach the owner through a socketpair that MHD feeds.
      When the TLS client hangs up, MHD 0.9.75 stops reading but does not tell the
      owner's end; the client's socket is watched too, and the owner's end is shut
      for reading, so the owner reads EOF as it would on a plain connection.
*/
#include "gw_http.h"
#include "sbx_idmap.h"
#include "sbx_log.h"
#include "sbx_metrics.h"
#include "sbx_xfer.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define GW_HTTP_MAX_BODY      (16 * 1024 * 1024)
#define GW_HTTP_TIMEOUT_S     60
#define GW_HTTP_MAX_CONNS     1024
#define GW_HTTP_MEMORY_LIMIT  (64 * 1024)
#define GW_HTTP_STREAM_BUFFER (1024 * 1024)
#define GW_HTTP_STREAM_BLOCK  (32 * 1024)
//  A body of known length (a file): read from the stream buffer in larger blocks, as
//  each block is one round of MHD_run and of the loop's timer (timerfd_settime was a
//  quarter of the gateway's CPU for a 10 MiB GET in 32 KiB blocks).
#define GW_HTTP_SIZED_BLOCK  (256 * 1024)
#define GW_HTTP_RUN_ROUNDS   4 //  MHD_run rounds in a row while it has more to do at once
#define GW_HTTP_MAX_HEADERS  64
#define GW_HTTP_WATCH_EVENTS 64
#define GW_HTTP_HEADER_MS    30000
#define GW_HTTP_BODY_MS      30000
#define GW_HTTP_BODY_MIN     1024 //  bytes a body must grow by in each body window

//  A connection and its deadlines (zclock_mono ms, 0 = none). Made and freed by MHD's
//  connection notifier; MHD closes the socket only after telling us.
typedef struct {
    void *item; //  in gw_http_t.conns
    int fd;
    int64_t header_deadline;     //  the next request's headers must be in by then
    int64_t body_window;         //  when the body's current window began
    uint64_t body_bytes;         //  received so far (kept or dropped)
    uint64_t body_at_window;     //  body_bytes when the window began
    int64_t discard_deadline;    //  an oversized body must have ended by then
    bool upgraded;               //  the socket is the owner's: no deadlines
    bool cut;                    //  shut by the sweep, MHD is closing it
    char peer[INET6_ADDRSTRLEN]; //  for the log
} s_conn_t;

struct gw_http_t {
    zloop_t *loop;
    struct MHD_Daemon *daemon;
    gw_http_handler_fn *handler;
    void *handler_arg;
    int epoll_fd; //  MHD's, polled by the loop
    int watch_fd; //  ours, polled by the loop: timer_fd and suspended sockets
    int timer_fd; //  runs MHD at its next deadline
    bool timer_armed;
    int64_t timer_when; //  that deadline, zclock_mono ms
    int port;
    bool tls;
    bool starting; //  inside MHD_start_daemon: its messages are warnings
    size_t max_body;
    size_t stream_buffer;
    int64_t header_ms;
    int64_t body_ms;
    zlistx_t *conns;   //  s_conn_t of every open connection
    int64_t sweep_due; //  the earliest deadline of conns, or 0
    char *cert_pem;    //  MHD keeps pointers to these while it runs
    char *key_pem;
    zhashx_t *requests; //  id (as the key pointer) → gw_request_t, every live request
    zlistx_t *drained;  //  ids of streams whose drain callback is due
    bool count_responses;
};

//  Request ids are unique in the process, across servers, for the logs.
static atomic_uint_fast64_t s_next_id = 1;

typedef struct {
    char *name;
    char *value;
} header_t;

struct gw_request_t {
    gw_http_t *server;
    struct MHD_Connection *conn;
    uint64_t id;
    s_conn_t *cx;             //  its connection's deadlines, or NULL (out of memory)
    int fd;                   //  the connection's socket, for the hang-up watch
    int64_t started;          //  zclock_mono ms, for the access log
    char *target;             //  as sent: path and query
    const char *query_string; //  in target, after '?', or ""
    char *method;
    char *path; //  decoded, without the query
    char *version;
    char *host;      //  made on first use
    zhashx_t *query; //  parsed on first use: name → decoded value
    char peer[INET6_ADDRSTRLEN];
    byte *body;
    size_t body_size;
    size_t body_cap;
    size_t discarded; //  bytes dropped once the body was too large
    bool too_large;
    bool handled;    //  the handler was called
    bool in_handler; //  the handler is running: respond must not resume
    bool owned;      //  the owner holds it: the closed callback is due on its end
    bool suspended;  //  suspended by us (waiting for an answer or stream data)
    bool watched;    //  fd is in the hang-up watch set
    bool gone;       //  client gone or answer failed: close, refuse writes
    bool queued;     //  a response was handed to MHD
    int status;
    struct MHD_Response *response; //  built, to be queued from the access callback
    header_t headers[GW_HTTP_MAX_HEADERS];
    size_t header_count;
    gw_request_closed_fn *closed_fn;
    void *closed_arg;
    //  Streaming
    bool streaming;
    bool stream_eof;
    bool stream_failed; //  gw_request_stream_fail: the body ends with an error
    bool want_drain;    //  a write was refused: drain callback when there is room
    byte *sbuf;
    size_t shead; //  unread data is sbuf [shead .. shead + sused)
    size_t sused;
    gw_request_drain_fn *drain_fn;
    void *drain_arg;
    //  Upgrade
    gw_http_upgrade_fn *upgrade_fn;
    void *upgrade_arg;
    struct MHD_UpgradeResponseHandle *urh;
    int up_fd; //  the owner's socket
};

static void s_run (gw_http_t *self);
static void s_sweep (gw_http_t *self);

//  --------------------------------------------------------------------------
//  Keys of the request table are the ids themselves, no allocation.

//  --------------------------------------------------------------------------
//  Running MHD from the loop

//  Makes sure MHD runs again no later than `ms` from now. A deadline already set
//  earlier is kept: running MHD early is harmless, it just finds nothing to do.
static void s_arm (gw_http_t *self, uint64_t ms)
{
    if (ms > 3600 * 1000)
        ms = 3600 * 1000;
    int64_t when = zclock_mono () + (int64_t) ms;
    if (self->timer_armed && self->timer_when <= when)
        return;
    struct itimerspec spec = {
        .it_value = {.tv_sec = (time_t) (ms / 1000), .tv_nsec = (long) (ms % 1000) * 1000000}};
    if (ms == 0)
        spec.it_value.tv_nsec = 1; //  zero would disarm it
    if (timerfd_settime (self->timer_fd, 0, &spec, NULL) == 0) {
        self->timer_armed = true;
        self->timer_when = when;
    }
}

static int s_epoll_event (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    s_run ((gw_http_t *) arg);
    return 0;
}

//  Runs MHD for whatever is ready, then the drain callbacks it made due, then sets the
//  timer for MHD's next deadline. While MHD wants to run again at once (a large body
//  going out: each round sends what the socket takes), a few rounds run here rather
//  than each through the timer: timerfd_settime per round was a quarter of the
//  gateway's CPU for a 10 MiB GET (a costly call on a virtualised host).
static void s_run (gw_http_t *self)
{
    MHD_UNSIGNED_LONG_LONG ms = 0;
    bool timed = false;
    for (int round = 0; round < GW_HTTP_RUN_ROUNDS; round++) {
        if (MHD_run (self->daemon) == MHD_NO)
            sbx_debug ("http: MHD_run failed");
        void *key;
        while ((key = zlistx_detach (self->drained, NULL))) {
            gw_request_t *req = (gw_request_t *) zhashx_lookup (self->requests, key);
            //  Looked up again: the request may have ended since it was listed.
            if (req && req->owned && req->streaming && !req->gone && req->drain_fn)
                req->drain_fn (req, req->drain_arg);
        }
        timed = MHD_get_timeout (self->daemon, &ms) == MHD_YES;
        if (!timed || ms > 0)
            break;
    }
    if (self->sweep_due && zclock_mono () >= self->sweep_due) {
        s_sweep (self);
        timed = MHD_get_timeout (self->daemon, &ms) == MHD_YES;
    }
    if (timed)
        s_arm (self, (uint64_t) ms);
    if (self->sweep_due) {
        int64_t left = self->sweep_due - zclock_mono ();
        s_arm (self, left > 0 ? (uint64_t) left : 0);
    }
}

//  --------------------------------------------------------------------------
//  Deadlines against slow clients

static void s_due (gw_http_t *self, int64_t when)
{
    if (!self->sweep_due || when < self->sweep_due)
        self->sweep_due = when;
}

//  The connection waits for a request: its headers must be in within header_ms.
static void s_expect_headers (gw_http_t *self, s_conn_t *cx)
{
    cx->header_deadline = zclock_mono () + self->header_ms;
    cx->body_window = 0;
    cx->discard_deadline = 0;
    s_due (self, cx->header_deadline);
}

//  The client's address, numeric ("203.0.113.7", "2001:db8::1"), or "".
static void s_peer_name (struct MHD_Connection *conn, char *peer, size_t size)
{
    peer[0] = 0;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info && info->client_addr) {
        socklen_t len = info->client_addr->sa_family == AF_INET6 ? sizeof (struct sockaddr_in6)
                                                                 : sizeof (struct sockaddr_in);
        if (getnameinfo (info->client_addr, len, peer, (socklen_t) size, NULL, 0, NI_NUMERICHOST) !=
            0)
            peer[0] = 0;
    }
}

static void s_notify (void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    gw_http_t *self = cls;
    s_conn_t *cx = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        //  Without a record (out of memory) only MHD's idle timeout applies.
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        cx = info ? calloc (1, sizeof *cx) : NULL;
        if (cx && (cx->item = zlistx_add_end (self->conns, cx))) {
            cx->fd = info->connect_fd;
            s_peer_name (conn, cx->peer, sizeof cx->peer);
            *socket_context = cx;
            s_expect_headers (self, cx);
        } else
            free (cx);
    } else if (cx) {
        zlistx_delete (self->conns, cx->item);
        free (cx);
        *socket_context = NULL;
    }
}

//  Shuts the socket of every connection past a deadline (MHD then reads EOF and closes
//  it, telling owners as for any client that leaves), and finds the next deadline.
static void s_sweep (gw_http_t *self)
{
    int64_t now = zclock_mono ();
    int64_t next = 0;
    for (s_conn_t *cx = zlistx_first (self->conns); cx; cx = zlistx_next (self->conns)) {
        if (cx->cut || cx->upgraded)
            continue;
        const char *why = NULL;
        if (cx->header_deadline && now >= cx->header_deadline)
            why = "request headers not complete in time";
        else if (cx->discard_deadline && now >= cx->discard_deadline)
            why = "an oversized body still arriving";
        else if (cx->body_window && now - cx->body_window >= self->body_ms) {
            if (cx->body_bytes - cx->body_at_window < GW_HTTP_BODY_MIN)
                why = "the body stalled";
            else {
                cx->body_window = now;
                cx->body_at_window = cx->body_bytes;
            }
        }
        if (why) {
            sbx_info ("http: closing a slow connection from %s: %s", cx->peer, why);
            shutdown (cx->fd, SHUT_RDWR);
            cx->cut = true;
            continue;
        }
        int64_t whens[] = {cx->header_deadline, cx->discard_deadline,
                           cx->body_window ? cx->body_window + self->body_ms : 0};
        for (size_t i = 0; i < sizeof whens / sizeof whens[0]; i++)
            if (whens[i] && (!next || whens[i] < next))
                next = whens[i];
    }
    self->sweep_due = next;
}

//  Makes MHD run soon, from the loop: after a resume, MHD must call the access
//  callback or the stream reader again.
static void s_kick (gw_http_t *self)
{
    s_arm (self, 0);
}

//  --------------------------------------------------------------------------
//  Suspend, resume and the hang-up watch

static void s_unwatch (gw_request_t *req)
{
    if (req->watched) {
        epoll_ctl (req->server->watch_fd, EPOLL_CTL_DEL, req->fd, NULL);
        req->watched = false;
    }
}

//  Watches the client's socket for a hang-up (or an error).
static void s_watch (gw_request_t *req)
{
    struct epoll_event event = {.events = EPOLLRDHUP, .data.ptr = req};
    if (req->fd != -1 && epoll_ctl (req->server->watch_fd, EPOLL_CTL_ADD, req->fd, &event) == 0)
        req->watched = true;
    else
        sbx_debug ("rid=%llu http: cannot watch for hang-up: %s", (unsigned long long) req->id,
                   strerror (errno));
}

static void s_suspend (gw_request_t *req)
{
    MHD_suspend_connection (req->conn);
    req->suspended = true;
    s_watch (req);
}

static void s_resume (gw_request_t *req)
{
    if (!req->suspended)
        return;
    s_unwatch (req);
    req->suspended = false;
    MHD_resume_connection (req->conn);
    s_kick (req->server);
}

//  The deadline passed, or a watched client hung up (or its socket failed). A suspended
//  request is resumed as gone, so MHD closes it and the owner is told. The owner of an
//  upgraded HTTPS connection gets EOF on its socket, once MHD has run and forwarded
//  what the client sent before it left.
static int s_watch_event (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    gw_http_t *self = arg;
    struct epoll_event events[GW_HTTP_WATCH_EVENTS];
    uint64_t upgraded[GW_HTTP_WATCH_EVENTS];
    int upgraded_count = 0;
    int n = epoll_wait (self->watch_fd, events, GW_HTTP_WATCH_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        if (events[i].data.ptr == self) {
            uint64_t expired;
            if (read (self->timer_fd, &expired, sizeof expired) < 0 && errno != EAGAIN)
                sbx_debug ("http: timerfd: %s", strerror (errno));
            self->timer_armed = false;
            continue;
        }
        gw_request_t *req = events[i].data.ptr;
        s_unwatch (req); //  once is enough
        if (req->urh)
            upgraded[upgraded_count++] = req->id;
        else {
            sbx_debug ("rid=%llu http: client hung up while waiting", (unsigned long long) req->id);
            req->gone = true;
            s_resume (req);
        }
    }
    s_run (self);
    for (int i = 0; i < upgraded_count; i++) {
        gw_request_t *req = gw_http_request (self, upgraded[i]);
        if (req && req->urh) {
            sbx_debug ("rid=%llu http: upgraded client hung up", (unsigned long long) req->id);
            shutdown (req->up_fd, SHUT_RD);
        }
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Requests

static void s_request_destroy (gw_request_t **self_p)
{
    gw_request_t *self = *self_p;
    if (!self)
        return;
    if (self->response)
        MHD_destroy_response (self->response);
    for (size_t i = 0; i < self->header_count; i++) {
        free (self->headers[i].name);
        free (self->headers[i].value);
    }
    zhashx_destroy (&self->query);
    free (self->target);
    free (self->method);
    free (self->path);
    free (self->version);
    free (self->host);
    free (self->body);
    free (self->sbuf);
    free (self);
    *self_p = NULL;
}

//  MHD's earliest hook on a request, with the target as sent: the request starts here.
static void *s_uri_log (void *cls, const char *uri, struct MHD_Connection *conn)
{
    gw_http_t *self = cls;
    gw_request_t *req = calloc (1, sizeof *req);
    if (!req)
        return NULL;
    req->server = self;
    req->conn = conn;
    req->id = (uint64_t) atomic_fetch_add (&s_next_id, 1);
    req->started = zclock_mono ();
    req->fd = -1;
    const union MHD_ConnectionInfo *context =
        MHD_get_connection_info (conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    req->cx = context ? context->socket_context : NULL;
    req->target = strdup (uri ? uri : "");
    if (!req->target) {
        free (req);
        return NULL;
    }
    char *mark = strchr (req->target, '?');
    req->query_string = mark ? mark + 1 : "";
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info)
        req->fd = info->connect_fd;
    s_peer_name (conn, req->peer, sizeof req->peer);
    zhashx_insert (self->requests, (void *) (uintptr_t) req->id, req);
    return req;
}

//  MHD is done with a request, whatever the reason: tell the owner if it still holds
//  it, and free it.
static void s_completed (void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void) conn;
    gw_http_t *self = cls;
    gw_request_t *req = *con_cls;
    if (!req)
        return;
    *con_cls = NULL;
    s_unwatch (req);
    req->gone = true;
    zhashx_delete (self->requests, (void *) (uintptr_t) req->id);
    if (self->count_responses && req->queued) {
        char status[16];
        snprintf (status, sizeof status, "%d", req->status);
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_HTTP_RESPONSES_TOTAL, 1, status);
    }
    //  Kept alive for the next request (a cut or upgraded one closes instead).
    if (req->cx && !req->cx->upgraded && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        s_expect_headers (self, req->cx);
    sbx_debug ("rid=%llu http: %s %s %d %s %lldms peer=%s", (unsigned long long) req->id,
               req->method ? req->method : "-", req->target, req->queued ? req->status : 0,
               toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "ok" : "cut",
               (long long) (zclock_mono () - req->started), req->peer);
    if (req->owned) {
        req->owned = false;
        if (req->closed_fn)
            req->closed_fn (req, req->closed_arg);
    }
    s_request_destroy (&req);
}

//  The owner gives the request up: no callback will reach it any more.
static void s_release (gw_request_t *req)
{
    req->owned = false;
    req->closed_fn = NULL;
    req->drain_fn = NULL;
}

static int s_apply_headers (gw_request_t *req, struct MHD_Response *response,
                            const char *content_type)
{
    if (content_type &&
        MHD_add_response_header (response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type) == MHD_NO)
        return -1;
    for (size_t i = 0; i < req->header_count; i++)
        if (MHD_add_response_header (response, req->headers[i].name, req->headers[i].value) ==
            MHD_NO)
            return -1;
    return 0;
}

//  Answers the request now, from inside the access callback, as the server itself.
static enum MHD_Result s_queue_error (gw_request_t *req, unsigned status, const char *code,
                                      const char *message)
{
    char body[512];
    int size = snprintf (body, sizeof body, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}",
                         code, message);
    struct MHD_Response *response =
        MHD_create_response_from_buffer ((size_t) size, body, MHD_RESPMEM_MUST_COPY);
    if (!response)
        return MHD_NO;
    MHD_add_response_header (response, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header (response, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result rc = MHD_queue_response (req->conn, status, response);
    MHD_destroy_response (response);
    req->queued = true;
    req->status = (int) status;
    return rc;
}

static enum MHD_Result s_too_large (gw_request_t *req)
{
    char message[128];
    snprintf (message, sizeof message, "request body exceeds %zu bytes", req->server->max_body);
    sbx_info ("rid=%llu http: %s %s from %s: %s", (unsigned long long) req->id, req->method,
              req->path, req->peer, message);
    return s_queue_error (req, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", message);
}

static int s_body_append (gw_request_t *req, const char *data, size_t size)
{
    if (req->body_size + size + 1 > req->body_cap) {
        size_t cap = req->body_cap ? req->body_cap : 4096;
        while (cap < req->body_size + size + 1)
            cap *= 2;
        byte *body = realloc (req->body, cap);
        if (!body)
            return -1;
        req->body = body;
        req->body_cap = cap;
    }
    memcpy (req->body + req->body_size, data, size);
    req->body_size += size;
    req->body[req->body_size] = 0;
    return 0;
}

//  After the handler: queue what it answered, or suspend until it does.
static enum MHD_Result s_dispatch (gw_request_t *req)
{
    if (req->response) {
        struct MHD_Response *response = req->response;
        req->response = NULL;
        enum MHD_Result rc = MHD_queue_response (req->conn, (unsigned) req->status, response);
        MHD_destroy_response (response);
        req->queued = true;
        if (rc == MHD_NO)
            sbx_warn ("rid=%llu http: cannot queue a %d response", (unsigned long long) req->id,
                      req->status);
        return rc; //  MHD_NO closes the connection
    }
    if (req->gone)
        return MHD_NO;
    s_suspend (req);
    return MHD_YES;
}

static enum MHD_Result s_count_coding (void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value)
{
    (void) kind;
    (void) value;
    if (strcasecmp (key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
        (*(int *) cls)++;
    return MHD_YES;
}

//  MHD's access callback: called when the headers are in, for each piece of body, once
//  more when the body is complete, and again after each resume.
static enum MHD_Result s_access (void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    gw_http_t *self = cls;
    gw_request_t *req = *con_cls;
    if (!req)
        return MHD_NO; //  s_uri_log could not allocate it
    if (!req->method) {
        req->method = strdup (method);
        req->path = strdup (url);
        req->version = strdup (version);
        if (!req->method || !req->path || !req->version)
            return MHD_NO;
        s_conn_t *cx = req->cx;
        if (cx)
            cx->header_deadline = 0; //  the headers are in
        const char *length =
            MHD_lookup_connection_value (conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        //  MHD decodes chunked only; any other coding it would read until the client
        //  closes. Several Transfer-Encoding headers make one list: refused too. With a
        //  Content-Length as well, two parsers could disagree on where the body ends.
        const char *coding =
            MHD_lookup_connection_value (conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if (coding) {
            int codings = 0;
            MHD_get_connection_values (conn, MHD_HEADER_KIND, s_count_coding, &codings);
            if (codings != 1 || strcasecmp (coding, "chunked") != 0) {
                sbx_info ("rid=%llu http: %s %s from %s: Transfer-Encoding '%.60s' (%d header%s) "
                          "refused",
                          (unsigned long long) req->id, req->method, req->path, req->peer, coding,
                          codings, codings == 1 ? "" : "s");
                return s_queue_error (req, MHD_HTTP_NOT_IMPLEMENTED, "not_implemented",
                                      "the only Transfer-Encoding accepted is chunked");
            }
            if (length)
                return s_queue_error (req, MHD_HTTP_BAD_REQUEST, "invalid_argument",
                                      "send Transfer-Encoding or Content-Length, not both");
        }
        if (cx && (coding || (length && strtoull (length, NULL, 10) > 0))) {
            cx->body_window = zclock_mono (); //  a body follows: it must keep coming
            cx->body_bytes = cx->body_at_window = 0;
            s_due (self, cx->body_window + self->body_ms);
        }
        //  Refuse a declared oversized body before reading it; MHD then closes.
        if (length) {
            unsigned long long declared = strtoull (length, NULL, 10);
            if (declared > self->max_body)
                return s_too_large (req);
            if (declared > 0) {
                req->body = malloc ((size_t) declared + 1);
                if (!req->body)
                    return MHD_NO;
                sbx_xfer_advise_huge (req->body, (size_t) declared + 1);
                req->body_cap = (size_t) declared + 1;
            }
        }
        return MHD_YES;
    }
    if (!req->handled) {
        if (*upload_data_size > 0) {
            size_t size = *upload_data_size;
            *upload_data_size = 0;
            if (req->cx)
                req->cx->body_bytes += size;
            if (!req->too_large && req->body_size + size > self->max_body) {
                req->too_large = true; //  chunked, no length said: found out on the way
                free (req->body);
                req->body = NULL;
                req->body_size = req->body_cap = 0;
                //  MHD cannot answer before the body ends: it is read and dropped, for a
                //  bounded time, so the 413 can be sent.
                if (req->cx) {
                    req->cx->discard_deadline = zclock_mono () + self->body_ms;
                    s_due (self, req->cx->discard_deadline);
                }
            }
            if (req->too_large) {
                req->discarded += size;
                return MHD_YES;
            }
            return s_body_append (req, upload_data, size) == 0 ? MHD_YES : MHD_NO;
        }
        if (req->cx)
            req->cx->body_window = req->cx->discard_deadline = 0; //  the body is in
        if (req->too_large)
            return s_too_large (req);
        if (!req->body && s_body_append (req, "", 0) != 0)
            return MHD_NO; //  the body is always a string, even empty
        req->handled = true;
        req->owned = true;
        req->in_handler = true;
        self->handler (req, self->handler_arg);
        req->in_handler = false;
    }
    return s_dispatch (req);
}

//  Routes MHD's messages to our log: failures to start are warnings, the chatter
//  about clients that misbehave or leave is debug.
static void s_mhd_log (void *cls, const char *format, va_list args)
{
    gw_http_t *self = cls;
    char line[512];
    vsnprintf (line, sizeof line, format, args);
    size_t len = strlen (line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        line[--len] = 0;
    if (self->starting)
        sbx_warn ("http: %s", line);
    else
        sbx_debug ("http: %s", line);
}

//  --------------------------------------------------------------------------
//  The server

//  Reads a whole PEM file as a string.
static char *s_slurp (const char *path)
{
    FILE *file = fopen (path, "re");
    if (!file)
        return NULL;
    char *data = NULL;
    size_t size = 0, cap = 0;
    while (true) {
        if (size + 4097 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *bigger = realloc (data, cap);
            if (!bigger)
                break;
            data = bigger;
        }
        size_t n = fread (data + size, 1, cap - size - 1, file);
        size += n;
        if (n == 0)
            break;
    }
    bool ok = data && !ferror (file) && cap > size;
    fclose (file);
    if (!ok) {
        free (data);
        return NULL;
    }
    data[size] = 0;
    return data;
}

//  Creates the listening socket for "HOST:PORT" ([v6]:PORT for IPv6, "localhost" is
//  127.0.0.1). IPv6 sockets are IPv6-only: one address, one family, no surprises.
//  Returns the socket, or -1 after logging why.
static int s_listen (const char *listen_at)
{
    char host[256] = "";
    const char *port = NULL;
    const char *end = listen_at[0] == '[' ? strchr (listen_at, ']') : strrchr (listen_at, ':');
    size_t host_len = end ? (size_t) (end - listen_at) : 0;
    if (listen_at[0] == '[' && end && end[1] == ':' && host_len - 1 < sizeof host) {
        memcpy (host, listen_at + 1, host_len - 1);
        host[host_len - 1] = 0;
        port = end + 2;
    } else if (listen_at[0] != '[' && end && host_len < sizeof host) {
        memcpy (host, listen_at, host_len);
        host[host_len] = 0;
        port = end + 1;
    }
    if (!port || !*port || strspn (port, "0123456789") != strlen (port) || strlen (port) > 5 ||
        atoi (port) > 65535) {
        sbx_error ("http: cannot listen on '%s': not HOST:PORT", listen_at);
        return -1;
    }
    if (streq (host, "localhost"))
        strcpy (host, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *addrs = NULL;
    int rc = getaddrinfo (*host ? host : NULL, port, &hints, &addrs);
    if (rc != 0 || !addrs) {
        sbx_error ("http: cannot listen on '%s': %s", listen_at, gai_strerror (rc));
        return -1;
    }
    int fd = socket (addrs->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    if (fd == -1 || setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        (addrs->ai_family == AF_INET6 &&
         setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) != 0) ||
        bind (fd, addrs->ai_addr, addrs->ai_addrlen) != 0 || listen (fd, SOMAXCONN) != 0) {
        sbx_error ("http: cannot listen on '%s': %s", listen_at, strerror (errno));
        if (fd != -1)
            close (fd);
        fd = -1;
    }
    freeaddrinfo (addrs);
    return fd;
}

gw_http_t *gw_http_new (zloop_t *loop, const gw_http_options_t *options,
                        gw_http_handler_fn *handler, void *arg)
{
    assert (loop && options && handler);
    const char *listen_at = options->listen ? options->listen : "";
    bool tls = options->cert_file || options->key_file;
    if (tls && (!options->cert_file || !options->key_file)) {
        sbx_error ("http: TLS needs both a certificate and a key");
        return NULL;
    }
    if (!tls && !options->plain) {
        sbx_error ("http: no certificate for %s, and plain HTTP was not asked for", listen_at);
        return NULL;
    }
    gw_http_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->handler = handler;
    self->handler_arg = arg;
    self->epoll_fd = -1;
    self->watch_fd = -1;
    self->timer_fd = -1;
    self->tls = tls;
    self->max_body = options->max_body ? options->max_body : GW_HTTP_MAX_BODY;
    self->stream_buffer = options->stream_buffer ? options->stream_buffer : GW_HTTP_STREAM_BUFFER;
    self->header_ms = options->header_timeout_ms ? options->header_timeout_ms : GW_HTTP_HEADER_MS;
    self->body_ms = options->body_timeout_ms ? options->body_timeout_ms : GW_HTTP_BODY_MS;
    self->count_responses = options->count_responses;
    self->requests = sbx_idmap_new ();
    self->drained = zlistx_new ();
    self->conns = zlistx_new ();
    if (!self->requests || !self->drained || !self->conns)
        goto fail;

    if (tls) {
        self->cert_pem = s_slurp (options->cert_file);
        self->key_pem = s_slurp (options->key_file);
        if (!self->cert_pem || !self->key_pem) {
            sbx_error ("http: cannot read %s or %s", options->cert_file, options->key_file);
            goto fail;
        }
    }
    int listen_fd = s_listen (listen_at);
    if (listen_fd == -1)
        goto fail;
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    if (getsockname (listen_fd, (struct sockaddr *) &bound, &bound_len) == 0)
        self->port =
            ntohs (bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &bound)->sin6_port
                                               : ((struct sockaddr_in *) &bound)->sin_port);

    //  Without TLS the list ends at once.
    struct MHD_OptionItem tls_options[] = {
        {tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, self->cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, self->key_pem},
        {MHD_OPTION_END, 0, NULL}};
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE |
                     MHD_USE_ERROR_LOG | (tls ? MHD_USE_TLS : 0);
    self->starting = true;
    //  On failure MHD has closed the listening socket itself (and on the few paths where
    //  it does not, closing it here could close someone else's descriptor).
    self->daemon = MHD_start_daemon (
        flags, 0, NULL, NULL, s_access, self, MHD_OPTION_EXTERNAL_LOGGER, s_mhd_log, self,
        MHD_OPTION_LISTEN_SOCKET, listen_fd,
        //  Strict: HTTP/1.1 without Host gets 400, a target with a space is refused.
        //  Handlers route on Host (the port proxy) and forward the target as sent.
        MHD_OPTION_STRICT_FOR_CLIENT, (int) 1, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned) (options->timeout_s ? options->timeout_s : GW_HTTP_TIMEOUT_S),
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned) (options->max_connections ? options->max_connections : GW_HTTP_MAX_CONNS),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t) (options->memory_limit ? options->memory_limit : GW_HTTP_MEMORY_LIMIT),
        MHD_OPTION_URI_LOG_CALLBACK, s_uri_log, self, MHD_OPTION_NOTIFY_COMPLETED, s_completed,
        self, MHD_OPTION_NOTIFY_CONNECTION, s_notify, self, MHD_OPTION_ARRAY, tls_options,
        MHD_OPTION_END);
    self->starting = false;
    if (!self->daemon) {
        sbx_error ("http: cannot start the server on %s", listen_at);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info (self->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    self->epoll_fd = info ? info->epoll_fd : -1;
    self->watch_fd = epoll_create1 (EPOLL_CLOEXEC);
    self->timer_fd = timerfd_create (CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event timer_event = {.events = EPOLLIN, .data.ptr = self};
    if (self->epoll_fd == -1 || self->watch_fd == -1 || self->timer_fd == -1 ||
        epoll_ctl (self->watch_fd, EPOLL_CTL_ADD, self->timer_fd, &timer_event) != 0)
        goto fail;
    zmq_pollitem_t mhd_item = {NULL, self->epoll_fd, ZMQ_POLLIN, 0};
    zmq_pollitem_t watch_item = {NULL, self->watch_fd, ZMQ_POLLIN, 0};
    if (zloop_poller (loop, &mhd_item, s_epoll_event, self) != 0)
        goto fail;
    zloop_poller_set_tolerant (loop, &mhd_item);
    if (zloop_poller (loop, &watch_item, s_watch_event, self) != 0)
        goto fail;
    zloop_poller_set_tolerant (loop, &watch_item);
    s_kick (self);
    sbx_info ("http: serving %s on %s (port %d)", tls ? "HTTPS" : "plain HTTP", listen_at,
              self->port);
    return self;
fail:
    gw_http_destroy (&self);
    return NULL;
}

void gw_http_destroy (gw_http_t **self_p)
{
    assert (self_p);
    gw_http_t *self = *self_p;
    if (!self)
        return;
    if (self->epoll_fd != -1) {
        zmq_pollitem_t item = {NULL, self->epoll_fd, ZMQ_POLLIN, 0};
        zloop_poller_end (self->loop, &item);
    }
    if (self->watch_fd != -1) {
        zmq_pollitem_t item = {NULL, self->watch_fd, ZMQ_POLLIN, 0};
        zloop_poller_end (self->loop, &item);
    }
    if (self->daemon) {
        //  MHD refuses to stop with suspended connections: resume them all as gone.
        //  Stopping then completes every request, and owners hear of theirs.
        gw_request_t *req = (gw_request_t *) zhashx_first (self->requests);
        while (req) {
            req->gone = true;
            s_unwatch (req);
            if (req->suspended) {
                req->suspended = false;
                MHD_resume_connection (req->conn);
            }
            req = (gw_request_t *) zhashx_next (self->requests);
        }
        MHD_stop_daemon (self->daemon);
    }
    if (self->watch_fd != -1)
        close (self->watch_fd);
    if (self->timer_fd != -1)
        close (self->timer_fd);
    zhashx_destroy (&self->requests);
    zlistx_destroy (&self->drained);
    //  MHD told us of every close when it stopped; a record left means it did not start.
    for (s_conn_t *cx = self->conns ? zlistx_first (self->conns) : NULL; cx;
         cx = zlistx_next (self->conns))
        free (cx);
    zlistx_destroy (&self->conns);
    free (self->cert_pem);
    if (self->key_pem) {
        memset (self->key_pem, 0, strlen (self->key_pem));
        free (self->key_pem);
    }
    free (self);
    *self_p = NULL;
}

int gw_http_port (gw_http_t *self)
{
    assert (self);
    return self->port;
}

size_t gw_http_requests (gw_http_t *self)
{
    return self ? zhashx_size (self->requests) : 0;
}

gw_request_t *gw_http_request (gw_http_t *self, uint64_t id)
{
    assert (self);
    gw_request_t *req = (gw_request_t *) zhashx_lookup (self->requests, (void *) (uintptr_t) id);
    return req && req->owned ? req : NULL;
}

//  --------------------------------------------------------------------------
//  Request accessors

uint64_t gw_request_id (gw_request_t *req)
{
    assert (req);
    return req->id;
}

const char *gw_request_method (gw_request_t *req)
{
    assert (req);
    return req->method;
}

const char *gw_request_path (gw_request_t *req)
{
    assert (req);
    return req->path;
}

const char *gw_request_target (gw_request_t *req)
{
    assert (req);
    return req->target;
}

const char *gw_request_query_string (gw_request_t *req)
{
    assert (req);
    return req->query_string;
}

static int s_hex (char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

//  Decodes a form-encoded piece ('+' is a space). Broken escapes, and %00, which would
//  cut the string short, are kept as they were sent.
static char *s_form_decode (const char *text, size_t len)
{
    char *out = malloc (len + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (text[i] == '+')
            out[n++] = ' ';
        else if (text[i] == '%' && i + 2 < len && (hi = s_hex (text[i + 1])) >= 0 &&
                 (lo = s_hex (text[i + 2])) >= 0 && (hi || lo)) {
            out[n++] = (char) (hi * 16 + lo);
            i += 2;
        } else
            out[n++] = text[i];
    }
    out[n] = 0;
    return out;
}

const char *gw_request_query (gw_request_t *req, const char *name)
{
    assert (req && name);
    if (!req->query) {
        req->query = zhashx_new ();
        if (!req->query)
            return NULL;
        zhashx_set_destructor (req->query, (zhashx_destructor_fn *) zstr_free);
        const char *p = req->query_string;
        while (*p) {
            size_t len = strcspn (p, "&");
            const char *eq = memchr (p, '=', len);
            size_t name_len = eq ? (size_t) (eq - p) : len;
            char *key = s_form_decode (p, name_len);
            char *value = eq ? s_form_decode (eq + 1, len - name_len - 1) : strdup ("");
            //  The first of repeated names wins.
            if (key && value && *key && zhashx_insert (req->query, key, value) == 0)
                value = NULL;
            free (key);
            free (value);
            p += len;
            if (*p == '&')
                p++;
        }
    }
    return (const char *) zhashx_lookup (req->query, name);
}

const char *gw_request_header (gw_request_t *req, const char *name)
{
    assert (req && name);
    return MHD_lookup_connection_value (req->conn, MHD_HEADER_KIND, name);
}

typedef struct {
    gw_request_header_fn *fn;
    void *arg;
} s_headers_t;

static enum MHD_Result s_each_header (void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void) kind;
    s_headers_t *walk = cls;
    walk->fn (key, value ? value : "", walk->arg);
    return MHD_YES;
}

void gw_request_headers (gw_request_t *req, gw_request_header_fn *fn, void *arg)
{
    assert (req && fn);
    s_headers_t walk = {fn, arg};
    MHD_get_connection_values (req->conn, MHD_HEADER_KIND, s_each_header, &walk);
}

const char *gw_request_host (gw_request_t *req)
{
    assert (req);
    if (!req->host) {
        const char *value = gw_request_header (req, MHD_HTTP_HEADER_HOST);
        if (!value)
            value = "";
        const char *start = value, *end;
        if (*value == '[') {
            start = value + 1;
            end = strchr (start, ']');
            if (!end)
                end = start + strlen (start);
        } else {
            end = strchr (value, ':');
            if (!end)
                end = value + strlen (value);
        }
        req->host = strndup (start, (size_t) (end - start));
        if (!req->host)
            return "";
        for (char *c = req->host; *c; c++)
            *c = (char) tolower ((unsigned char) *c);
    }
    return req->host;
}

const byte *gw_request_body (gw_request_t *req)
{
    assert (req);
    return req->body ? req->body : (const byte *) "";
}

byte *gw_request_body_take (gw_request_t *req, size_t *size_p)
{
    assert (req && size_p);
    byte *body = req->body;
    *size_p = body ? req->body_size : 0;
    req->body = NULL;
    req->body_size = req->body_cap = 0;
    return body;
}

size_t gw_request_body_size (gw_request_t *req)
{
    assert (req);
    return req->body_size;
}

const char *gw_request_peer (gw_request_t *req)
{
    assert (req);
    return req->peer;
}

bool gw_request_tls (gw_request_t *req)
{
    assert (req);
    return req->server->tls;
}

//  --------------------------------------------------------------------------
//  Answering

void gw_request_set_closed_fn (gw_request_t *req, gw_request_closed_fn *fn, void *arg)
{
    assert (req);
    req->closed_fn = fn;
    req->closed_arg = arg;
}

void gw_request_set_drain_fn (gw_request_t *req, gw_request_drain_fn *fn, void *arg)
{
    assert (req);
    req->drain_fn = fn;
    req->drain_arg = arg;
}

int gw_request_add_header (gw_request_t *req, const char *name, const char *value)
{
    assert (req && name && value);
    if (!req->owned || req->response || req->queued || req->header_count == GW_HTTP_MAX_HEADERS)
        return -1;
    //  A token for the name; no CR or LF anywhere, which would let a value forge
    //  headers or a second response.
    if (!*name || name[strcspn (name, " \t:\r\n()<>@,;\\\"/[]?={}")] || strpbrk (value, "\r\n"))
        return -1;
    if (!*value)
        return -1; //  MHD refuses empty values when the response is built
    if (strcasecmp (name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0 ||
        strcasecmp (name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
        return -1;
    header_t *header = &req->headers[req->header_count];
    header->name = strdup (name);
    header->value = strdup (value);
    if (!header->name || !header->value) {
        free (header->name);
        free (header->value);
        return -1;
    }
    req->header_count++;
    return 0;
}

//  True when the owner may still answer: it holds the request, nothing was answered.
static bool s_can_answer (gw_request_t *req)
{
    return req->owned && !req->response && !req->queued && !req->streaming && !req->upgrade_fn;
}

//  Hands a built response to the connection: queued by the access callback, now if the
//  handler is running, else once the resumed connection calls it again. A NULL
//  response means the answer failed: the connection is closed instead.
static int s_answer (gw_request_t *req, struct MHD_Response *response, int status)
{
    if (response) {
        req->response = response;
        req->status = status;
    } else
        req->gone = true;
    if (!req->in_handler)
        s_resume (req);
    return response ? 0 : -1;
}

//  body: copied (mode MHD_RESPMEM_MUST_COPY), or taken (MHD_RESPMEM_MUST_FREE: freed
//  here when no response is made).
static int s_respond (gw_request_t *req, int status, const char *content_type, void *body,
                      size_t size, enum MHD_ResponseMemoryMode mode)
{
    assert (req);
    bool take = mode == MHD_RESPMEM_MUST_FREE;
    struct MHD_Response *response = NULL;
    bool can = s_can_answer (req);
    if (can)
        s_release (req);
    if (!can || req->gone) {
        if (take)
            free (body);
        return -1;
    }
    if (status >= 200 && status <= 599)
        response = MHD_create_response_from_buffer (size, body, mode);
    else
        sbx_error ("rid=%llu http: refusing to answer status %d", (unsigned long long) req->id,
                   status);
    if (!response && take)
        free (body);
    if (response && s_apply_headers (req, response, content_type) != 0) {
        MHD_destroy_response (response);
        response = NULL;
    }
    return s_answer (req, response, status);
}

int gw_request_respond (gw_request_t *req, int status, const char *content_type, const void *body,
                        size_t size)
{
    return s_respond (req, status, content_type, (void *) body, size, MHD_RESPMEM_MUST_COPY);
}

int gw_request_respond_take (gw_request_t *req, int status, const char *content_type, void **body_p,
                             size_t size)
{
    assert (body_p);
    void *body = *body_p;
    *body_p = NULL;
    if (!body) //  libmicrohttpd takes no NULL body with a size; an empty one
        return s_respond (req, status, content_type, "", 0, MHD_RESPMEM_PERSISTENT);
    return s_respond (req, status, content_type, body, size, MHD_RESPMEM_MUST_FREE);
}

//  MHD asks for more of a streaming body.
static ssize_t s_stream_read (void *cls, uint64_t pos, char *buf, size_t max)
{
    (void) pos;
    gw_request_t *req = cls;
    if (req->gone || req->stream_failed)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (req->sused > 0) {
        size_t n = req->sused < max ? req->sused : max;
        memcpy (buf, req->sbuf + req->shead, n);
        req->shead += n;
        req->sused -= n;
        if (req->sused == 0)
            req->shead = 0;
        //  Half empty: the owner may write again. Called after MHD_run, not from here.
        if (req->want_drain && req->sused <= req->server->stream_buffer / 2) {
            req->want_drain = false;
            zlistx_add_end (req->server->drained, (void *) (uintptr_t) req->id);
        }
        return (ssize_t) n;
    }
    if (req->stream_eof)
        return MHD_CONTENT_READER_END_OF_STREAM;
    s_suspend (req); //  until the next write or the end
    return 0;
}

static int s_stream_start (gw_request_t *req, int status, const char *content_type, uint64_t size)
{
    assert (req);
    if (!s_can_answer (req) || req->gone || status < 200 || status > 599)
        return -1;
    req->sbuf = malloc (req->server->stream_buffer);
    struct MHD_Response *response =
        req->sbuf ? MHD_create_response_from_callback (
                        size, size == MHD_SIZE_UNKNOWN ? GW_HTTP_STREAM_BLOCK : GW_HTTP_SIZED_BLOCK,
                        s_stream_read, req, NULL)
                  : NULL;
    if (!response || s_apply_headers (req, response, content_type) != 0) {
        if (response)
            MHD_destroy_response (response);
        return -1;
    }
    req->streaming = true;
    return s_answer (req, response, status);
}

int gw_request_stream_start (gw_request_t *req, int status, const char *content_type)
{
    return s_stream_start (req, status, content_type, MHD_SIZE_UNKNOWN);
}

int gw_request_stream_start_sized (gw_request_t *req, int status, const char *content_type,
                                   uint64_t size)
{
    return size == MHD_SIZE_UNKNOWN ? -1 : s_stream_start (req, status, content_type, size);
}

int gw_request_stream_write (gw_request_t *req, const void *data, size_t size)
{
    assert (req);
    if (!req->owned || !req->streaming || req->stream_eof || req->gone)
        return -1;
    if (size == 0)
        return 0;
    size_t cap = req->server->stream_buffer;
    if (size > cap - req->sused) {
        req->want_drain = true;
        return -1;
    }
    if (req->shead + req->sused + size > cap) {
        memmove (req->sbuf, req->sbuf + req->shead, req->sused);
        req->shead = 0;
    }
    memcpy (req->sbuf + req->shead + req->sused, data, size);
    req->sused += size;
    s_resume (req); //  the reader waits for data when suspended
    return 0;
}

size_t gw_request_stream_space (gw_request_t *req)
{
    assert (req);
    if (!req->owned || !req->streaming || req->stream_eof || req->gone)
        return 0;
    return req->server->stream_buffer - req->sused;
}

int gw_request_stream_fail (gw_request_t *req)
{
    assert (req);
    if (!req->owned || !req->streaming)
        return -1;
    req->stream_failed = true; //  MHD closes the connection, the body short
    return gw_request_stream_end (req);
}

int gw_request_stream_end (gw_request_t *req)
{
    assert (req);
    if (!req->owned || !req->streaming)
        return -1;
    s_release (req);
    if (req->gone)
        return -1;
    req->stream_eof = true;
    s_resume (req);
    return 0;
}

//  MHD has sent the 101: the socket is the owner's now.
static void s_upgraded (void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in,
                        size_t extra_in_size, MHD_socket sock,
                        struct MHD_UpgradeResponseHandle *urh)
{
    (void) conn;
    (void) con_cls;
    gw_request_t *req = cls;
    req->urh = urh;
    req->up_fd = sock;
    if (req->cx)
        req->cx->upgraded = true; //  the owner's now, with the owner's own deadlines
    if (!req->owned) {
        MHD_upgrade_action (urh, MHD_UPGRADE_ACTION_CLOSE);
        return;
    }
    if (req->server->tls)
        s_watch (req); //  MHD would not tell the owner when the client leaves
    req->upgrade_fn (req, sock, extra_in, extra_in_size, req->upgrade_arg);
}

int gw_request_upgrade (gw_request_t *req, const char *protocol, gw_http_upgrade_fn *fn, void *arg)
{
    assert (req && protocol && fn);
    //  MHD upgrades HTTP/1.1 only; the protocol becomes a header value.
    if (!s_can_answer (req) || req->gone || !streq (req->version, MHD_HTTP_VERSION_1_1) ||
        !*protocol || strpbrk (protocol, "\r\n"))
        return -1;
    struct MHD_Response *response = MHD_create_response_for_upgrade (s_upgraded, req);
    if (!response ||
        MHD_add_response_header (response, MHD_HTTP_HEADER_CONNECTION, "Upgrade") == MHD_NO ||
        MHD_add_response_header (response, MHD_HTTP_HEADER_UPGRADE, protocol) == MHD_NO ||
        s_apply_headers (req, response, NULL) != 0) {
        if (response)
            MHD_destroy_response (response);
        return -1;
    }
    req->upgrade_fn = fn;
    req->upgrade_arg = arg;
    return s_answer (req, response, MHD_HTTP_SWITCHING_PROTOCOLS);
}

int gw_request_upgrade_close (gw_request_t *req)
{
    assert (req);
    if (!req->owned || !req->urh)
        return -1;
    s_release (req);
    s_unwatch (req);
    MHD_upgrade_action (req->urh, MHD_UPGRADE_ACTION_CLOSE);
    s_kick (req->server);
    return 0;
}

//  --------------------------------------------------------------------------
//  Self-test: a real HTTPS server and a plain one on the test thread's zloop, and
//  clients (libcurl, raw TCP, a GnuTLS client) on a second thread.

#include "gw_tls.h"

#include <curl/curl.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>

#define TEST_MAX_BODY   (1024 * 1024)
#define TEST_STREAM_BUF (256 * 1024)
#define TEST_BIG_SIZE   (2 * 1024 * 1024)
#define TEST_DEADLINE   30000 //  a bound, not a wait
#define TEST_SLOW_MS    1000  //  the plain server's header and body deadlines

typedef struct {
    zloop_t *loop;
    gw_http_t *https;
    gw_http_t *plain;
    gw_http_t *v6; //  when the host has IPv6 loopback
    int https_port, plain_port, v6_port;
    char *ca_path;
    bool timed_out;
    int done_pipe[2];
    //  Server side, touched by the loop thread; atomics are read by the client thread.
    atomic_int echo_calls;
    atomic_int slow_seen;
    uint64_t slow_id;
    atomic_int hang_held;
    atomic_int hang_closed;
    gw_request_t *hang;
    gw_request_t *sse;
    int sse_n;
    atomic_int drip_closed;
    gw_request_t *drip;
    int drip_timer;
    size_t big_sent;
    atomic_int big_drains;
    gw_request_t *up;
    int up_fd;
    atomic_int up_ready;
    atomic_int up_closed;
} test_t;

static test_t *s_test_signal_arg;

//  ---- server side

static void s_test_hang_closed (gw_request_t *req, void *arg)
{
    test_t *t = arg;
    assert (req == t->hang);
    //  Gone: lookups by id find nothing while the callback runs.
    assert (gw_http_request (req->server, gw_request_id (req)) == NULL);
    assert (gw_request_respond (req, 200, NULL, "", 0) == -1);
    t->hang = NULL;
    atomic_fetch_add (&t->hang_closed, 1);
}

static void s_test_never_closed (gw_request_t *req, void *arg)
{
    (void) req;
    (void) arg;
    assert (!"the closed callback of an answered request was called");
}

static int s_test_slow_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    test_t *t = arg;
    gw_request_t *req = gw_http_request (t->https, t->slow_id);
    assert (req);
    assert (gw_request_add_header (req, "X-Deferred", "yes") == 0);
    assert (gw_request_respond (req, 200, "text/plain", "slow", 4) == 0);
    assert (gw_http_request (t->https, t->slow_id) == NULL);
    return 0;
}

static int s_test_sse_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    test_t *t = arg;
    char event[32];
    int size = snprintf (event, sizeof event, "data: %d\n\n", ++t->sse_n);
    assert (gw_request_stream_write (t->sse, event, (size_t) size) == 0);
    if (t->sse_n == 3) {
        assert (gw_request_stream_end (t->sse) == 0);
        t->sse = NULL;
    }
    return 0;
}

static int s_test_drip_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    test_t *t = arg;
    //  Refused once the client is known gone; the closed callback follows. zloop may
    //  still run a timer ended in this pass.
    if (t->drip)
        gw_request_stream_write (t->drip, "tick\n", 5);
    return 0;
}

static void s_test_drip_closed (gw_request_t *req, void *arg)
{
    test_t *t = arg;
    assert (req == t->drip);
    zloop_timer_end (t->loop, t->drip_timer);
    t->drip = NULL;
    atomic_fetch_add (&t->drip_closed, 1);
}

//  Writes the big body until the buffer is full, then again from each drain callback.
static void s_test_big_fill (gw_request_t *req, void *arg)
{
    test_t *t = arg;
    byte block[16 * 1024];
    while (t->big_sent < TEST_BIG_SIZE) {
        size_t size = sizeof block;
        if (size > TEST_BIG_SIZE - t->big_sent)
            size = TEST_BIG_SIZE - t->big_sent;
        for (size_t i = 0; i < size; i++)
            block[i] = (byte) ((t->big_sent + i) % 251);
        if (gw_request_stream_space (req) < size) {
            assert (gw_request_stream_write (req, block, size) == -1);
            atomic_fetch_add (&t->big_drains, 1);
            return; //  until the drain callback
        }
        assert (gw_request_stream_write (req, block, size) == 0);
        t->big_sent += size;
    }
    assert (gw_request_stream_end (req) == 0);
}

static int s_test_echo (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    test_t *t = arg;
    char buf[4096];
    ssize_t n = recv (item->fd, buf, sizeof buf, 0);
    if (n > 0 && !(n == 4 && memcmp (buf, "quit", 4) == 0)) {
        assert (send (item->fd, buf, (size_t) n, MSG_NOSIGNAL) == n);
        return 0;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    //  The client went, or asked us to close: stop polling the socket before the server
    //  closes it.
    zloop_poller_end (loop, item);
    assert (gw_request_upgrade_close (t->up) == 0);
    assert (gw_request_upgrade_close (t->up) == -1);
    t->up = NULL;
    atomic_fetch_add (&t->up_closed, 1);
    return 0;
}

static void s_test_up_closed (gw_request_t *req, void *arg)
{
    test_t *t = arg;
    assert (req == t->up);
    zmq_pollitem_t item = {NULL, t->up_fd, ZMQ_POLLIN, 0};
    zloop_poller_end (t->loop, &item);
    t->up = NULL;
    atomic_fetch_add (&t->up_closed, 1);
}

static void s_test_upgraded (gw_request_t *req, int fd, const void *extra, size_t extra_size,
                             void *arg)
{
    test_t *t = arg;
    assert (!t->up);
    t->up = req;
    t->up_fd = fd;
    gw_request_set_closed_fn (req, s_test_up_closed, t);
    if (extra_size > 0)
        assert (send (fd, extra, extra_size, MSG_NOSIGNAL) == (ssize_t) extra_size);
    zmq_pollitem_t item = {NULL, fd, ZMQ_POLLIN, 0};
    assert (zloop_poller (t->loop, &item, s_test_echo, t) == 0);
    atomic_fetch_add (&t->up_ready, 1);
}

static void s_test_handler (gw_request_t *req, void *arg)
{
    test_t *t = arg;
    const char *path = gw_request_path (req);
    if (streq (path, "/hello")) {
        assert (gw_request_add_header (req, "X-Test", "yes") == 0);
        assert (gw_request_add_header (req, "Bad Name", "x") == -1);
        assert (gw_request_add_header (req, "X-Split", "a\r\nSet-Cookie: x=1") == -1);
        assert (gw_request_add_header (req, "Content-Length", "5") == -1);
        assert (gw_request_respond (req, 200, "text/plain", "hello", 5) == 0);
        //  Answered: a second answer is refused (the handler still runs, so req lives).
        assert (gw_request_respond (req, 200, "text/plain", "again", 5) == -1);
        assert (gw_request_stream_start (req, 200, "text/plain") == -1);
    } else if (streq (path, "/echo")) {
        atomic_fetch_add (&t->echo_calls, 1);
        const char *y = gw_request_query (req, "y");
        const char *custom = gw_request_header (req, "x-CUSTOM");
        assert (gw_request_body (req)[gw_request_body_size (req)] == 0);
        assert (gw_request_add_header (req, "X-Method", gw_request_method (req)) == 0);
        assert (gw_request_add_header (req, "X-Y", y ? y : "(none)") == 0);
        assert (gw_request_add_header (req, "X-Flag",
                                       gw_request_query (req, "flag") ? "set" : "unset") == 0);
        assert (gw_request_add_header (req, "X-Missing",
                                       gw_request_query (req, "nope") ? "set" : "unset") == 0);
        assert (gw_request_add_header (req, "X-Host", gw_request_host (req)) == 0);
        assert (gw_request_add_header (req, "X-Peer", gw_request_peer (req)) == 0);
        assert (gw_request_add_header (req, "X-Target", gw_request_target (req)) == 0);
        assert (gw_request_add_header (req, "X-Path", gw_request_path (req)) == 0);
        const char *query = gw_request_query_string (req);
        assert (gw_request_add_header (req, "X-Query", *query ? query : "(none)") == 0);
        assert (gw_request_add_header (req, "X-Empty", "") == -1);
        assert (gw_request_add_header (req, "X-Custom", custom ? custom : "(none)") == 0);
        assert (gw_request_add_header (req, "X-TLS", gw_request_tls (req) ? "yes" : "no") == 0);
        gw_request_set_closed_fn (req, s_test_never_closed, t);
        assert (gw_request_respond (req, 200, gw_request_header (req, "content-type"),
                                    gw_request_body (req), gw_request_body_size (req)) == 0);
    } else if (streq (path, "/slow")) {
        t->slow_id = gw_request_id (req);
        assert (gw_http_request (t->https, t->slow_id) == req);
        gw_request_set_closed_fn (req, s_test_never_closed, t);
        assert (zloop_timer (t->loop, 200, 1, s_test_slow_timer, t) != -1);
        atomic_store (&t->slow_seen, 1);
    } else if (streq (path, "/hang")) {
        assert (!t->hang);
        t->hang = req;
        gw_request_set_closed_fn (req, s_test_hang_closed, t);
        atomic_fetch_add (&t->hang_held, 1);
    } else if (streq (path, "/sse")) {
        assert (gw_request_add_header (req, "Cache-Control", "no-cache") == 0);
        assert (gw_request_stream_start (req, 200, "text/event-stream") == 0);
        assert (gw_request_respond (req, 200, NULL, "", 0) == -1);
        assert (gw_request_stream_write (req, "data: 1\n\n", 9) == 0);
        gw_request_set_closed_fn (req, s_test_never_closed, t);
        t->sse = req;
        t->sse_n = 1;
        assert (zloop_timer (t->loop, 100, 2, s_test_sse_timer, t) != -1);
    } else if (streq (path, "/drip")) {
        assert (gw_request_stream_start (req, 200, "text/plain") == 0);
        assert (gw_request_stream_write (req, "tick\n", 5) == 0);
        gw_request_set_closed_fn (req, s_test_drip_closed, t);
        t->drip = req;
        t->drip_timer = zloop_timer (t->loop, 30, 0, s_test_drip_timer, t);
    } else if (streq (path, "/big")) {
        assert (gw_request_stream_start (req, 200, "application/octet-stream") == 0);
        //  A write larger than the whole buffer can never fit.
        byte *huge = calloc (1, TEST_STREAM_BUF + 1);
        assert (gw_request_stream_write (req, huge, TEST_STREAM_BUF + 1) == -1);
        free (huge);
        t->big_sent = 0;
        gw_request_set_drain_fn (req, s_test_big_fill, t);
        s_test_big_fill (req, t);
    } else if (streq (path, "/ws")) {
        assert (gw_request_upgrade (req, "echo", s_test_upgraded, t) == 0);
    } else
        assert (gw_request_respond (req, 404, "application/json",
                                    "{\"error\":{\"code\":\"not_found\"}}", 30) == 0);
}

static int s_test_done (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    (void) arg;
    return -1; //  the client thread finished: end the loop
}

static int s_test_deadline (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    ((test_t *) arg)->timed_out = true;
    return -1;
}

//  ---- client side

static void s_wait_for (atomic_int *value, int want)
{
    int64_t until = zclock_mono () + 3000;
    while (atomic_load (value) < want) {
        assert (zclock_mono () < until);
        zclock_sleep (5);
    }
    assert (atomic_load (value) == want);
}

static size_t s_curl_collect (char *data, size_t size, size_t count, void *arg)
{
    zchunk_extend ((zchunk_t *) arg, data, size * count);
    return size * count;
}

static struct curl_slist *s_resolve;

static CURL *s_curl_new (test_t *t, zchunk_t *body, zchunk_t *headers)
{
    CURL *curl = curl_easy_init ();
    assert (curl);
    curl_easy_setopt (curl, CURLOPT_CAINFO, t->ca_path);
    curl_easy_setopt (curl, CURLOPT_RESOLVE, s_resolve);
    curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_curl_collect);
    curl_easy_setopt (curl, CURLOPT_WRITEDATA, body);
    curl_easy_setopt (curl, CURLOPT_HEADERFUNCTION, s_curl_collect);
    curl_easy_setopt (curl, CURLOPT_HEADERDATA, headers);
    return curl;
}

//  Performs a request; returns the status, or -1 with the curl error in *rc.
static long s_curl_do (CURL *curl, const char *url, zchunk_t *body, zchunk_t *headers, CURLcode *rc)
{
    zchunk_set (body, "", 0);
    zchunk_set (headers, "", 0);
    curl_easy_setopt (curl, CURLOPT_URL, url);
    CURLcode code = curl_easy_perform (curl);
    if (rc)
        *rc = code;
    if (code != CURLE_OK)
        return -1;
    long status = 0;
    curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

//  True when the text received contains `text` (case-insensitively).
static bool s_has (zchunk_t *chunk, const char *text)
{
    char *string = zchunk_strdup (chunk);
    bool found = strcasestr (string, text) != NULL;
    free (string);
    return found;
}

static long s_connects (CURL *curl)
{
    long connects = -1;
    curl_easy_getinfo (curl, CURLINFO_NUM_CONNECTS, &connects);
    return connects;
}

//  A raw client connection, plain or TLS (GnuTLS, checking the chain and the name).
typedef struct {
    int fd;
    gnutls_session_t tls;
    gnutls_certificate_credentials_t cred;
} conn_t;

static void s_conn_open (conn_t *c, int port, const char *ca_path)
{
    memset (c, 0, sizeof *c);
    c->fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert (c->fd != -1);
    struct timeval tv = {3, 0};
    setsockopt (c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt (c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons ((uint16_t) port)};
    addr.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
    assert (connect (c->fd, (struct sockaddr *) &addr, sizeof addr) == 0);
    if (!ca_path)
        return;
    assert (gnutls_certificate_allocate_credentials (&c->cred) == 0);
    assert (gnutls_certificate_set_x509_trust_file (c->cred, ca_path, GNUTLS_X509_FMT_PEM) == 1);
    assert (gnutls_init (&c->tls, GNUTLS_CLIENT) == 0);
    assert (gnutls_set_default_priority (c->tls) == 0);
    assert (gnutls_credentials_set (c->tls, GNUTLS_CRD_CERTIFICATE, c->cred) == 0);
    assert (gnutls_server_name_set (c->tls, GNUTLS_NAME_DNS, "localhost", 9) == 0);
    gnutls_session_set_verify_cert (c->tls, "localhost", 0);
    gnutls_transport_set_int (c->tls, c->fd);
    int rc;
    do
        rc = gnutls_handshake (c->tls);
    while (rc < 0 && !gnutls_error_is_fatal (rc));
    assert (rc == 0);
}

static void s_conn_send (conn_t *c, const char *data)
{
    size_t size = strlen (data);
    if (c->tls)
        assert (gnutls_record_send (c->tls, data, size) == (ssize_t) size);
    else
        assert (send (c->fd, data, size, MSG_NOSIGNAL) == (ssize_t) size);
}

//  Returns bytes read, 0 at the end of the stream (or a reset), never a timeout.
static size_t s_conn_recv (conn_t *c, char *buf, size_t size)
{
    while (true) {
        ssize_t n;
        if (c->tls) {
            n = gnutls_record_recv (c->tls, buf, size);
            if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
                continue;
            if (n == GNUTLS_E_PREMATURE_TERMINATION)
                n = 0;
            assert (n >= 0);
        } else {
            n = recv (c->fd, buf, size, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == ECONNRESET)
                n = 0;
            assert (n >= 0); //  EAGAIN here is the 3 s receive timeout
        }
        return (size_t) n;
    }
}

//  Reads until `mark` is in the text (NULL: until the end). Returns the length.
static size_t s_conn_read_until (conn_t *c, char *buf, size_t cap, const char *mark)
{
    size_t have = 0;
    buf[0] = 0;
    while (!mark || !strstr (buf, mark)) {
        assert (have < cap - 1);
        size_t n = s_conn_recv (c, buf + have, cap - 1 - have);
        if (n == 0)
            break;
        have += n;
        buf[have] = 0;
    }
    return have;
}

static void s_conn_close (conn_t *c)
{
    if (c->tls) {
        gnutls_bye (c->tls, GNUTLS_SHUT_WR);
        gnutls_deinit (c->tls);
        gnutls_certificate_free_credentials (c->cred);
    }
    close (c->fd);
}

//  Upgrade: bytes sent with the request come back first (extra bytes), then an echo.
//  Then the client hangs up (and the server notices), or asks the server to close it
//  (and reads EOF), or keeps it open.
typedef enum { UP_CLIENT_CLOSES, UP_SERVER_CLOSES, UP_KEEP } up_end_t;

static void s_test_upgrade (test_t *t, int port, const char *ca_path, up_end_t end, conn_t *c)
{
    int closed = atomic_load (&t->up_closed);
    s_conn_open (c, port, ca_path);
    s_conn_send (c, "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                    "Upgrade: echo\r\n\r\nearly");
    char buf[4096];
    size_t have = s_conn_read_until (c, buf, sizeof buf, "\r\n\r\n");
    assert (strncmp (buf, "HTTP/1.1 101", 12) == 0);
    assert (strcasestr (buf, "\r\nUpgrade: echo\r\n"));
    char *rest = strstr (buf, "\r\n\r\n") + 4;
    size_t got = have - (size_t) (rest - buf);
    memmove (buf, rest, got + 1);
    while (got < 5)
        got += s_conn_recv (c, buf + got, sizeof buf - 1 - got);
    assert (got == 5 && memcmp (buf, "early", 5) == 0);
    s_conn_send (c, "ping-pong");
    got = 0;
    while (got < 9) {
        size_t n = s_conn_recv (c, buf + got, sizeof buf - 1 - got);
        assert (n > 0);
        got += n;
    }
    assert (got == 9 && memcmp (buf, "ping-pong", 9) == 0);
    if (end == UP_KEEP)
        return;
    if (end == UP_SERVER_CLOSES) {
        s_conn_send (c, "quit");
        assert (s_conn_recv (c, buf, sizeof buf) == 0);
    }
    s_conn_close (c);
    s_wait_for (&t->up_closed, closed + 1);
}

static size_t s_drip_write (char *data, size_t size, size_t count, void *arg)
{
    (void) data;
    (void) arg;
    (void) size;
    (void) count;
    return 0; //  abort after the first piece
}

static int64_t s_sse_times[16];
static int s_sse_pieces;

static size_t s_sse_write (char *data, size_t size, size_t count, void *arg)
{
    if (s_sse_pieces < 16)
        s_sse_times[s_sse_pieces++] = zclock_mono ();
    return s_curl_collect (data, size, count, arg);
}

static size_t s_chunked_left;

static size_t s_chunked_read (char *buf, size_t size, size_t count, void *arg)
{
    (void) arg;
    size_t n = size * count < s_chunked_left ? size * count : s_chunked_left;
    memset (buf, 'z', n);
    s_chunked_left -= n;
    return n;
}

//  Sends `piece` every `every_ms` until the server closes the connection; returns the
//  ms that took, or -1 when it answered something or max_ms passed first.
static int64_t s_trickle (conn_t *c, const char *piece, int every_ms, int max_ms)
{
    int64_t start = zclock_mono ();
    while (zclock_mono () - start < max_ms) {
        if (send (c->fd, piece, strlen (piece), MSG_NOSIGNAL) < 0)
            return zclock_mono () - start; //  reset: closed
        struct pollfd item = {.fd = c->fd, .events = POLLIN};
        if (poll (&item, 1, every_ms) == 1) {
            char buf[512];
            ssize_t n = recv (c->fd, buf, sizeof buf, 0);
            return n > 0 ? -1 : zclock_mono () - start;
        }
    }
    return -1;
}

//  Slow and odd requests on the plain server (deadlines of TEST_SLOW_MS).
static void s_test_slow_clients (test_t *t)
{
    conn_t conn;
    char reply[4096];
    //  Headers trickled a line every 100 ms (each resets MHD's idle timeout): cut at
    //  the header deadline, counted from the accept.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "GET /hello HTTP/1.1\r\nHost: a\r\n");
    int64_t took = s_trickle (&conn, "X-Slow: 1\r\n", 100, 10 * TEST_SLOW_MS);
    assert (took >= TEST_SLOW_MS / 2 && took < 8 * TEST_SLOW_MS);
    s_conn_close (&conn);
    //  The same before the request line is even complete.
    s_conn_open (&conn, t->plain_port, NULL);
    took = s_trickle (&conn, "G", 100, 10 * TEST_SLOW_MS);
    assert (took >= TEST_SLOW_MS / 2 && took < 8 * TEST_SLOW_MS);
    s_conn_close (&conn);
    //  A body trickled a byte every 100 ms: cut when a window passes with under 1 KiB.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n");
    took = s_trickle (&conn, "x", 100, 10 * TEST_SLOW_MS);
    assert (took >= TEST_SLOW_MS / 2 && took < 8 * TEST_SLOW_MS);
    s_conn_close (&conn);
    //  A body that keeps coming, slower than the deadline in all but progress, is served;
    //  and a kept-alive connection's next request starts a fresh header deadline.
    s_conn_open (&conn, t->plain_port, NULL);
    size_t steady = 12 * 2048;
    char head[128];
    snprintf (head, sizeof head, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %zu\r\n\r\n",
              steady);
    s_conn_send (&conn, head);
    char piece[2049];
    memset (piece, 'y', 2048);
    piece[2048] = 0;
    for (size_t sent = 0; sent < steady; sent += 2048) {
        s_conn_send (&conn, piece);
        zclock_sleep (TEST_SLOW_MS / 5); //  the slow client itself
    }
    s_conn_read_until (&conn, reply, sizeof reply, "\r\n\r\n");
    assert (strncmp (reply, "HTTP/1.1 200", 12) == 0);
    s_conn_close (&conn);
    //  Transfer codings MHD cannot decode: 501 at once, whether listed or repeated; with
    //  a Content-Length as well: 400.
    const char *codings[] = {"Transfer-Encoding: gzip, chunked\r\n",
                             "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                             "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
                             "Transfer-Encoding: identity\r\n"};
    for (size_t i = 0; i < sizeof codings / sizeof codings[0]; i++) {
        s_conn_open (&conn, t->plain_port, NULL);
        char request[256];
        snprintf (request, sizeof request, "POST /echo HTTP/1.1\r\nHost: a\r\n%s\r\n", codings[i]);
        s_conn_send (&conn, request);
        s_conn_read_until (&conn, reply, sizeof reply, NULL); //  and the server closes
        assert (strncmp (reply, "HTTP/1.1 501", 12) == 0);
        assert (strstr (reply, "{\"error\":{\"code\":\"not_implemented\""));
        s_conn_close (&conn);
    }
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                        "Content-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    assert (strncmp (reply, "HTTP/1.1 400", 12) == 0 && strstr (reply, "invalid_argument"));
    s_conn_close (&conn);
    //  Plain chunked, any case, is served.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n"
                        "Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    assert (strncmp (reply, "HTTP/1.1 200", 12) == 0 && strstr (reply, "\r\n\r\nhello"));
    s_conn_close (&conn);
}

static void *s_test_client (void *arg)
{
    test_t *t = arg;
    char base[64], url[256];
    snprintf (base, sizeof base, "https://localhost:%d", t->https_port);
    zchunk_t *body = zchunk_new (NULL, 0), *headers = zchunk_new (NULL, 0);
    CURLcode rc;

    //  Immediate answers over HTTPS, verified against the local CA, on one connection.
    CURL *curl = s_curl_new (t, body, headers);
    snprintf (url, sizeof url, "%s/hello", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_streq (body, "hello"));
    assert (s_has (headers, "\r\nX-Test: yes\r\n"));
    assert (s_has (headers, "\r\nContent-Type: text/plain\r\n"));
    assert (!s_has (headers, "Set-Cookie"));
    assert (s_connects (curl) == 1);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (s_connects (curl) == 0); //  kept alive, reused
    snprintf (url, sizeof url, "%s/nothing", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 404);
    assert (s_connects (curl) == 0);

    //  A POST body comes back intact, with the request's details as seen by handlers.
    size_t post_size = 100 * 1000;
    byte *post = malloc (post_size);
    for (size_t i = 0; i < post_size; i++)
        post[i] = (byte) (i * 31 + 7);
    struct curl_slist *post_headers = curl_slist_append (NULL, "Content-Type: application/x-test");
    post_headers = curl_slist_append (post_headers, "X-Custom: Mixed Case");
    curl_easy_setopt (curl, CURLOPT_HTTPHEADER, post_headers);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDS, post);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE, (long) post_size);
    snprintf (url, sizeof url, "%s/%%65cho?y=a%%20b+c&flag&x=1&y=second", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_size (body) == post_size && memcmp (zchunk_data (body), post, post_size) == 0);
    assert (s_has (headers, "\r\nContent-Type: application/x-test\r\n"));
    assert (s_has (headers, "\r\nX-Method: POST\r\n"));
    assert (s_has (headers, "\r\nX-Y: a b c\r\n"));
    assert (s_has (headers, "\r\nX-Flag: set\r\n"));
    assert (s_has (headers, "\r\nX-Missing: unset\r\n"));
    assert (s_has (headers, "\r\nX-Host: localhost\r\n"));
    assert (s_has (headers, "\r\nX-Peer: 127.0.0.1\r\n"));
    assert (s_has (headers, "\r\nX-Path: /echo\r\n"));
    assert (s_has (headers, "\r\nX-Target: /%65cho?y=a%20b+c&flag&x=1&y=second\r\n"));
    assert (s_has (headers, "\r\nX-Query: y=a%20b+c&flag&x=1&y=second\r\n"));
    assert (s_has (headers, "\r\nX-Custom: Mixed Case\r\n"));
    assert (s_has (headers, "\r\nX-TLS: yes\r\n"));
    assert (s_connects (curl) == 0);
    curl_easy_cleanup (curl);
    assert (atomic_load (&t->echo_calls) == 1);

    //  Without the local CA the chain does not verify: TLS is real.
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_CAINFO, "/dev/null");
    snprintf (url, sizeof url, "%s/hello", base);
    assert (s_curl_do (curl, url, body, headers, &rc) == -1);
    assert (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE);
    curl_easy_cleanup (curl);

    //  A deferred answer does not hold up another client: /slow is answered by a timer
    //  200 ms later, /hello on a second connection in between.
    CURLM *multi = curl_multi_init ();
    zchunk_t *slow_body = zchunk_new (NULL, 0), *slow_headers = zchunk_new (NULL, 0);
    CURL *slow = s_curl_new (t, slow_body, slow_headers);
    CURL *quick = s_curl_new (t, body, headers);
    snprintf (url, sizeof url, "%s/slow", base);
    curl_easy_setopt (slow, CURLOPT_URL, url);
    snprintf (url, sizeof url, "%s/hello", base);
    curl_easy_setopt (quick, CURLOPT_URL, url);
    int64_t start = zclock_mono (), quick_done = 0, slow_done = 0;
    curl_multi_add_handle (multi, slow);
    bool quick_added = false;
    while (!quick_done || !slow_done) {
        int running;
        curl_multi_perform (multi, &running);
        if (!quick_added && atomic_load (&t->slow_seen)) {
            curl_multi_add_handle (multi, quick);
            quick_added = true;
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read (multi, &left))) {
            assert (msg->msg == CURLMSG_DONE && msg->data.result == CURLE_OK);
            if (msg->easy_handle == slow)
                slow_done = zclock_mono ();
            else
                quick_done = zclock_mono ();
        }
        curl_multi_poll (multi, NULL, 0, 10, NULL);
        assert (zclock_mono () - start < 5000);
    }
    assert (quick_done < slow_done);
    assert (slow_done - start >= 190);
    assert (zchunk_size (slow_body) == 4 && memcmp (zchunk_data (slow_body), "slow", 4) == 0);
    assert (s_has (slow_headers, "\r\nX-Deferred: yes\r\n"));
    assert (zchunk_size (body) == 5 && memcmp (zchunk_data (body), "hello", 5) == 0);
    assert (s_connects (quick) == 1);
    curl_multi_remove_handle (multi, slow);
    curl_multi_remove_handle (multi, quick);
    curl_easy_cleanup (slow);
    curl_easy_cleanup (quick);
    curl_multi_cleanup (multi);
    zchunk_destroy (&slow_body);
    zchunk_destroy (&slow_headers);

    //  Bodies over the limit get 413 and never reach the handler: one declared by
    //  Content-Length (refused before it is sent), one chunked (found out on the way).
    size_t over = TEST_MAX_BODY + TEST_MAX_BODY / 2;
    byte *big_post = calloc (1, over);
    curl = s_curl_new (t, body, headers);
    struct curl_slist *expect = curl_slist_append (NULL, "Expect: 100-continue");
    curl_easy_setopt (curl, CURLOPT_HTTPHEADER, expect);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDS, big_post);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE, (long) over);
    snprintf (url, sizeof url, "%s/echo", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 413);
    assert (s_has (body, "{\"error\":{\"code\":\"too_large\",\"message\":"));
    assert (s_has (headers, "\r\nContent-Type: application/json\r\n"));
    curl_easy_cleanup (curl);
    curl = s_curl_new (t, body, headers);
    struct curl_slist *chunked = curl_slist_append (NULL, "Transfer-Encoding: chunked");
    curl_easy_setopt (curl, CURLOPT_HTTPHEADER, chunked);
    curl_easy_setopt (curl, CURLOPT_POST, 1L);
    curl_easy_setopt (curl, CURLOPT_READFUNCTION, s_chunked_read);
    s_chunked_left = over;
    assert (s_curl_do (curl, url, body, headers, NULL) == 413);
    //  Far over (three times the limit): still read to its end, and answered 413.
    s_chunked_left = 3 * TEST_MAX_BODY;
    assert (s_curl_do (curl, url, body, headers, NULL) == 413);
    assert (s_has (body, "\"too_large\"") && s_chunked_left == 0);
    assert (s_has (body, "\"too_large\""));
    curl_easy_cleanup (curl);
    //  Exactly the limit is fine.
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDS, big_post);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE, (long) TEST_MAX_BODY);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_size (body) == TEST_MAX_BODY);
    curl_easy_cleanup (curl);
    assert (atomic_load (&t->echo_calls) == 2);
    free (big_post);

    //  A client that gives up while its request is suspended: the owner is told.
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, 300L);
    snprintf (url, sizeof url, "%s/hang", base);
    assert (s_curl_do (curl, url, body, headers, &rc) == -1);
    assert (rc == CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup (curl);
    s_wait_for (&t->hang_closed, 1);

    //  Server-sent events: three pieces, 100 ms apart, each delivered as written.
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_sse_write);
    snprintf (url, sizeof url, "%s/sse", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_streq (body, "data: 1\n\ndata: 2\n\ndata: 3\n\n"));
    assert (s_has (headers, "\r\nContent-Type: text/event-stream\r\n"));
    assert (s_has (headers, "\r\nTransfer-Encoding: chunked\r\n"));
    assert (s_sse_pieces >= 3);
    assert (s_sse_times[s_sse_pieces - 1] - s_sse_times[0] >= 150);
    //  The stream ended cleanly, so the connection is kept.
    snprintf (url, sizeof url, "%s/hello", base);
    curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_curl_collect);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (s_connects (curl) == 0);
    curl_easy_cleanup (curl);

    //  A client that leaves in the middle of a stream: the owner is told.
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_drip_write);
    snprintf (url, sizeof url, "%s/drip", base);
    assert (s_curl_do (curl, url, body, headers, &rc) == -1);
    assert (rc == CURLE_WRITE_ERROR);
    curl_easy_cleanup (curl);
    s_wait_for (&t->drip_closed, 1);

    //  A large stream through a small buffer: the writer waits on drain callbacks.
    curl = s_curl_new (t, body, headers);
    snprintf (url, sizeof url, "%s/big", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_size (body) == TEST_BIG_SIZE);
    byte *data = zchunk_data (body);
    for (size_t i = 0; i < TEST_BIG_SIZE; i++)
        assert (data[i] == (byte) (i % 251));
    assert (atomic_load (&t->big_drains) > 0);
    curl_easy_cleanup (curl);

    //  Upgrade over TLS: the server encrypts and forwards through a socketpair.
    conn_t conn;
    s_test_upgrade (t, t->https_port, t->ca_path, UP_CLIENT_CLOSES, &conn);
    s_test_upgrade (t, t->https_port, t->ca_path, UP_SERVER_CLOSES, &conn);

    //  The plain server: upgrade on the raw socket, garbage, malformed requests.
    snprintf (url, sizeof url, "http://127.0.0.1:%d/echo?x=1", t->plain_port);
    curl = s_curl_new (t, body, headers);
    curl_easy_setopt (curl, CURLOPT_POSTFIELDS, "plain");
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    assert (zchunk_streq (body, "plain"));
    assert (s_has (headers, "\r\nX-TLS: no\r\n"));
    assert (s_has (headers, "\r\nX-Host: 127.0.0.1\r\n"));
    curl_easy_cleanup (curl);
    s_test_upgrade (t, t->plain_port, NULL, UP_CLIENT_CLOSES, &conn);
    s_test_upgrade (t, t->plain_port, NULL, UP_SERVER_CLOSES, &conn);

    char reply[4096];
    //  A request line MHD cannot parse: libmicrohttpd 0.9.75 closes without a reply.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "GARBAGE\r\n\r\n");
    size_t size = s_conn_read_until (&conn, reply, sizeof reply, NULL);
    assert (size == 0 || strncmp (reply, "HTTP/1.1 400", 12) == 0);
    s_conn_close (&conn);
    //  A malformed header line gets a 400.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "GET /hello HTTP/1.1\r\nHost: x\r\nnot a header\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    assert (strncmp (reply, "HTTP/1.1 400", 12) == 0);
    s_conn_close (&conn);
    //  HTTP/1.1 without Host gets a 400.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "GET /hello HTTP/1.1\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    assert (strncmp (reply, "HTTP/1.1 400", 12) == 0);
    s_conn_close (&conn);
    //  TLS-level garbage on the HTTPS port.
    s_conn_open (&conn, t->https_port, NULL);
    s_conn_send (&conn, "GARBAGE\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    s_conn_close (&conn);
    s_test_slow_clients (t);
    //  Both servers still serve; the client's pipelined keep-alive works on raw TCP.
    s_conn_open (&conn, t->plain_port, NULL);
    s_conn_send (&conn, "GET /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\n"
                        "Connection: close\r\n\r\n");
    s_conn_read_until (&conn, reply, sizeof reply, NULL);
    char *second = strstr (reply + 1, "HTTP/1.1 200");
    assert (strncmp (reply, "HTTP/1.1 200", 12) == 0 && second && strstr (second, "hello"));
    s_conn_close (&conn);
    curl = s_curl_new (t, body, headers);
    snprintf (url, sizeof url, "%s/hello", base);
    assert (s_curl_do (curl, url, body, headers, NULL) == 200);
    curl_easy_cleanup (curl);

    //  IPv6 loopback, when the host has it.
    if (t->v6) {
        curl = s_curl_new (t, body, headers);
        snprintf (url, sizeof url, "http://[::1]:%d/echo", t->v6_port);
        curl_easy_setopt (curl, CURLOPT_POSTFIELDS, "six");
        assert (s_curl_do (curl, url, body, headers, NULL) == 200);
        assert (s_has (headers, "\r\nX-Peer: ::1\r\n"));
        assert (s_has (headers, "\r\nX-Host: ::1\r\n"));
        curl_easy_cleanup (curl);
    }

    curl_slist_free_all (post_headers);
    curl_slist_free_all (expect);
    curl_slist_free_all (chunked);
    free (post);
    zchunk_destroy (&body);
    zchunk_destroy (&headers);
    assert (write (t->done_pipe[1], "x", 1) == 1);
    return NULL;
}

//  Phase two: requests still open when the servers are destroyed.
static void *s_test_client_shutdown (void *arg)
{
    test_t *t = arg;
    conn_t conn;
    s_test_upgrade (t, t->plain_port, NULL, UP_KEEP, &conn); //  left open
    zchunk_t *body = zchunk_new (NULL, 0), *headers = zchunk_new (NULL, 0);
    CURL *curl = s_curl_new (t, body, headers);
    char url[128];
    snprintf (url, sizeof url, "https://localhost:%d/hang", t->https_port);
    CURLcode rc;
    assert (s_curl_do (curl, url, body, headers, &rc) == -1); //  cut by the destroy
    assert (rc != CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup (curl);
    char buf[64];
    assert (s_conn_recv (&conn, buf, sizeof buf) == 0); //  the upgraded socket closed too
    s_conn_close (&conn);
    zchunk_destroy (&body);
    zchunk_destroy (&headers);
    return NULL;
}

static int s_test_poll_ready (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    test_t *t = arg;
    return atomic_load (&t->hang_held) == 2 && atomic_load (&t->up_ready) == 5 ? -1 : 0;
}

void gw_http_test (bool verbose)
{
    sbx_log_init ("gw_http_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR + 1);
    s_test_signal_arg = NULL;
    char base[] = "/tmp/gw_http_test.XXXXXX";
    assert (mkdtemp (base));
    char *cert = NULL, *key = NULL, *ca = NULL;
    assert (gw_tls_ensure_ca (base, "sbx.test", &cert, &key, &ca) == 0);
    assert (curl_global_init (CURL_GLOBAL_DEFAULT) == CURLE_OK);
    int64_t test_start = zclock_mono ();

    test_t *t = calloc (1, sizeof *t);
    t->loop = zloop_new ();
    t->ca_path = ca;
    assert (pipe2 (t->done_pipe, O_CLOEXEC) == 0);

    //  Options that must not start a server.
    gw_http_options_t bad = {.listen = "127.0.0.1:0"};
    assert (!gw_http_new (t->loop, &bad, s_test_handler, t)); //  no TLS, plain not asked
    bad.cert_file = cert;
    assert (!gw_http_new (t->loop, &bad, s_test_handler, t)); //  certificate without key
    bad.key_file = "/nonexistent/key.pem";
    assert (!gw_http_new (t->loop, &bad, s_test_handler, t));
    bad = (gw_http_options_t){.listen = "127.0.0.1", .plain = true};
    assert (!gw_http_new (t->loop, &bad, s_test_handler, t));
    const char *bad_listen[] = {"127.0.0.1:99999", "[::1:0",      "nonsense:0",
                                "1.2.3.4.5:80",    "127.0.0.1:x", NULL};
    for (int i = 0; bad_listen[i]; i++) {
        bad.listen = bad_listen[i];
        assert (!gw_http_new (t->loop, &bad, s_test_handler, t));
    }
    gw_http_options_t options = {.listen = "localhost:0", .plain = true};
    gw_http_t *local = gw_http_new (t->loop, &options, s_test_handler, t);
    assert (local && gw_http_port (local) > 0);
    bad.listen = "127.0.0.1:0";
    char taken[32];
    snprintf (taken, sizeof taken, "127.0.0.1:%d", gw_http_port (local));
    bad.listen = taken;
    assert (!gw_http_new (t->loop, &bad, s_test_handler, t)); //  port in use
    gw_http_destroy (&local);
    gw_http_destroy (&local);
    assert (!local);

    options = (gw_http_options_t){.listen = "127.0.0.1:0",
                                  .cert_file = cert,
                                  .key_file = key,
                                  .max_body = TEST_MAX_BODY,
                                  .stream_buffer = TEST_STREAM_BUF,
                                  .timeout_s = 5};
    t->https = gw_http_new (t->loop, &options, s_test_handler, t);
    assert (t->https);
    t->https_port = gw_http_port (t->https);
    options = (gw_http_options_t){.listen = "127.0.0.1:0",
                                  .plain = true,
                                  .header_timeout_ms = TEST_SLOW_MS,
                                  .body_timeout_ms = TEST_SLOW_MS};
    t->plain = gw_http_new (t->loop, &options, s_test_handler, t);
    assert (t->plain);
    t->plain_port = gw_http_port (t->plain);
    options.listen = "[::1]:0";
    t->v6 = gw_http_new (t->loop, &options, s_test_handler, t); //  NULL without IPv6
    if (t->v6)
        t->v6_port = gw_http_port (t->v6);
    char resolve[64];
    snprintf (resolve, sizeof resolve, "localhost:%d:127.0.0.1", t->https_port);
    s_resolve = curl_slist_append (NULL, resolve);

    zmq_pollitem_t done = {NULL, t->done_pipe[0], ZMQ_POLLIN, 0};
    assert (zloop_poller (t->loop, &done, s_test_done, t) == 0);
    int deadline = zloop_timer (t->loop, TEST_DEADLINE, 1, s_test_deadline, t);
    pthread_t client;
    assert (pthread_create (&client, NULL, s_test_client, t) == 0);
    zloop_start (t->loop);
    assert (!t->timed_out);
    pthread_join (client, NULL);
    zloop_poller_end (t->loop, &done);
    assert (!t->hang && !t->sse && !t->drip && !t->up);
    assert (zhashx_size (t->https->requests) == 0); //  every request freed
    if (verbose)
        printf ("(phase 1: %lld ms) ", (long long) (zclock_mono () - test_start));

    //  Destroying the servers with a suspended request and an upgraded connection
    //  open: their owners hear of it, and MHD is not left with suspended connections.
    zloop_timer_end (t->loop, deadline);
    t->timed_out = false;
    deadline = zloop_timer (t->loop, TEST_DEADLINE, 1, s_test_deadline, t);
    int poll_ready = zloop_timer (t->loop, 5, 0, s_test_poll_ready, t);
    assert (pthread_create (&client, NULL, s_test_client_shutdown, t) == 0);
    zloop_start (t->loop);
    assert (!t->timed_out);
    assert (t->hang && t->up);
    zloop_timer_end (t->loop, poll_ready);
    zloop_timer_end (t->loop, deadline);
    gw_http_destroy (&t->https);
    assert (!t->hang && atomic_load (&t->hang_closed) == 2);
    gw_http_destroy (&t->plain);
    assert (!t->up);
    gw_http_destroy (&t->v6);
    pthread_join (client, NULL);
    if (verbose)
        printf ("(total: %lld ms) ", (long long) (zclock_mono () - test_start));

    zloop_destroy (&t->loop);
    close (t->done_pipe[0]);
    close (t->done_pipe[1]);
    curl_slist_free_all (s_resolve);
    s_resolve = NULL;
    free (t);
    curl_global_cleanup ();
    const char *names[] = {"ca.crt", "ca.key", "server.crt", "server.key", ".lock"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[128];
        snprintf (path, sizeof path, "%s/%s", base, names[i]);
        assert (unlink (path) == 0);
    }
    assert (rmdir (base) == 0);
    free (cert);
    free (key);
    free (ca);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
