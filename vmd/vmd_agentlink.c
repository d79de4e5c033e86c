/*  vmd_agentlink - see vmd_agentlink.h */
#include "vmd_agentlink.h"
#include "agent_frame.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "sbx_stall.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define S_RETRY_MS        100   //  between connect attempts
#define S_TICK_MS         50    //  deadline checks
#define S_DEFAULT_TIMEOUT 60000 //  a request without its own
//  What waits for a guest that does not read its channel: encoded output up to this
//  (then requests stay queued, unencoded), and at most this many queued requests (then
//  new ones are refused with unavailable at once).
#define S_OUT_HIGH   (4u * 1024 * 1024)
#define S_MAX_QUEUED 64

typedef struct s_req_s {
    struct s_req_s *next;
    uint64_t rid;      //  ours, on the wire
    uint64_t orig_rid; //  the caller's, restored in the answer
    sbx_msg_type_t type;
    sbx_msg_t *msg; //  not sent yet (queued while disconnected)
    bool sent;
    uint64_t deadline; //  mono ms
    uint32_t timeout_ms;
    sbx_msg_t *answer; //  made by the link (encode failure), delivered at the next tick
    vmd_agentlink_reply_fn *fn;
    void *arg;
} s_req_t;

struct _vmd_agentlink_t {
    zloop_t *loop;
    char *path;
    char *name;
    int fd;
    short events; //  registered with the loop, 0 when none
    agent_frame_t *frame;
    s_req_t *reqs;
    uint64_t next_rid;
    int connect_timeout;
    uint64_t connect_deadline;
    int retry_timer;
    int tick_timer;
    size_t hellos;
    uint32_t frame_timeout; //  ms a frame may take to arrive whole
    size_t dropped;         //  incomplete frames given up on
    sbx_stall_t stall;      //  this loop not running for a while (sbx_stall.h)
    bool lost;
    vmd_agentlink_hello_fn *hello_fn;
    vmd_agentlink_lost_fn *lost_fn;
    void *arg;
};

static void s_connect (vmd_agentlink_t *self);

static void s_req_destroy (s_req_t **req_p)
{
    s_req_t *req = *req_p;
    if (!req)
        return;
    sbx_msg_destroy (&req->msg);
    sbx_msg_destroy (&req->answer);
    free (req);
    *req_p = NULL;
}

//  Unlinks a request and hands it its answer (taken).
static void s_answer (vmd_agentlink_t *self, s_req_t *req, sbx_msg_t **answer_p)
{
    for (s_req_t **at = &self->reqs; *at; at = &(*at)->next)
        if (*at == req) {
            *at = req->next;
            break;
        }
    (*answer_p)->rid = req->orig_rid;
    if (req->fn)
        req->fn (self, answer_p, req->arg);
    sbx_msg_destroy (answer_p);
    s_req_destroy (&req);
}

static int s_on_io (zloop_t *loop, zmq_pollitem_t *item, void *arg);

//  Registers the fd for what we need: input always, output while some is queued.
static void s_poll (vmd_agentlink_t *self)
{
    short want = 0;
    if (self->fd >= 0)
        want = ZMQ_POLLIN | (agent_frame_pending (self->frame) ? ZMQ_POLLOUT : 0);
    if (want == self->events)
        return;
    zmq_pollitem_t item = {NULL, self->fd, 0, 0};
    if (self->events) {
        item.events = self->events;
        zloop_poller_end (self->loop, &item);
    }
    self->events = want;
    if (want) {
        item.events = want;
        zloop_poller (self->loop, &item, s_on_io, self);
        zloop_poller_set_tolerant (self->loop, &item);
    }
}

static void s_send_queued (vmd_agentlink_t *self)
{
    for (s_req_t *req = self->reqs; req; req = req->next) {
        if (req->sent || !req->msg)
            continue;
        if (agent_frame_pending (self->frame) >= S_OUT_HIGH)
            break; //  the rest goes out as the guest reads (s_on_io)
        sbx_err_t err;
        if (agent_frame_send (self->frame, req->msg, &err) == 0) {
            req->sent = true;
            sbx_msg_destroy (&req->msg);
        } else if (!req->answer)
            req->answer = sbx_msg_new_error (0, err.code, "%s", err.message);
    }
    if (agent_frame_flush (self->frame) == -1)
        sbx_debug ("sandbox=%s agent write failed: %s", self->name, strerror (errno));
}

//  The stream broke: fail what was sent on it, and connect again.
static void s_break (vmd_agentlink_t *self, const char *why)
{
    if (self->fd < 0)
        return;
    sbx_info ("sandbox=%s agent connection closed: %s", self->name, why);
    self->fd = -1; //  s_poll drops the poller for the old fd first
    zmq_pollitem_t item = {NULL, agent_frame_fd (self->frame), self->events, 0};
    if (self->events)
        zloop_poller_end (self->loop, &item);
    self->events = 0;
    close (item.fd);
    agent_frame_reset (self->frame, -1);
    s_req_t *req = self->reqs;
    while (req) {
        s_req_t *next = req->next;
        if (req->sent) {
            sbx_msg_t *answer = sbx_msg_new_error (0, SBX_E_UNAVAILABLE,
                                                   "the guest agent's connection broke (%s) "
                                                   "before it answered",
                                                   why);
            s_answer (self, req, &answer);
        }
        req = next;
    }
    self->connect_deadline = sbx_clock_mono_ms () + (uint64_t) self->connect_timeout;
    s_connect (self);
}

static void s_on_msg (vmd_agentlink_t *self, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    if (msg->type == SBX_MSG_AGENT_HELLO) {
        self->hellos++;
        sbx_agent_hello_t *hello = sbx_msg_agent_hello (msg);
        sbx_debug ("sandbox=%s agent hello: version %s boot %s uptime %llu ms", self->name,
                   hello->version, hello->boot_id ? hello->boot_id : "?",
                   (unsigned long long) hello->uptime_ms);
        if (self->hello_fn)
            self->hello_fn (self, hello, self->arg);
        return;
    }
    for (s_req_t *req = self->reqs; req; req = req->next)
        if (req->sent && req->rid == msg->rid) {
            s_answer (self, req, msg_p);
            return;
        }
    if (msg->type == SBX_MSG_ERROR && msg->rid == 0) {
        //  The agent lost its place in the stream: reset it (agent/README.md).
        sbx_warn ("sandbox=%s agent: %s; reconnecting", self->name, sbx_msg_error (msg)->message);
        s_break (self, "the agent could not read our stream");
        return;
    }
    sbx_debug ("sandbox=%s agent rid=%llu %s for no pending request dropped", self->name,
               (unsigned long long) msg->rid, sbx_msg_type_name (msg->type));
}

static int s_on_io (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    vmd_agentlink_t *self = arg;
    if (self->fd < 0 || item->fd != self->fd)
        return 0;
    if (item->revents & ZMQ_POLLOUT) {
        if (agent_frame_flush (self->frame) == -1) {
            s_break (self, strerror (errno));
            return 0;
        }
        if (agent_frame_pending (self->frame) < S_OUT_HIGH)
            s_send_queued (self);
    }
    if (item->revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        ssize_t got = agent_frame_read (self->frame);
        int fd = self->fd;
        while (self->fd == fd) {
            sbx_msg_t *msg = NULL;
            sbx_err_t err = {0};
            int rc = agent_frame_next (self->frame, &msg, &err);
            if (rc == 0)
                break;
            if (rc == 1) {
                s_on_msg (self, &msg);
                sbx_msg_destroy (&msg);
            } else {
                sbx_warn ("sandbox=%s bad frame from the agent: %s", self->name, err.message);
                bool answered = false;
                for (s_req_t *req = self->reqs; err.rid && req; req = req->next)
                    if (req->sent && req->rid == err.rid) {
                        sbx_msg_t *answer = sbx_msg_new_error (
                            0, SBX_E_INTERNAL, "the agent's answer did not decode: %s",
                            err.message);
                        s_answer (self, req, &answer);
                        answered = true;
                        break;
                    }
                if (!answered && !err.rid)
                    s_break (self, "the agent's stream did not decode");
            }
        }
        if (got == -1 && self->fd == fd)
            s_break (self, errno ? strerror (errno) : "end of stream");
    }
    if (self->fd >= 0)
        s_poll (self);
    return 0;
}

static int s_on_retry (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_agentlink_t *self = arg;
    self->retry_timer = -1;
    s_connect (self);
    return 0;
}

//  One non-blocking attempt; on failure another in S_RETRY_MS, until the deadline.
static void s_connect (vmd_agentlink_t *self)
{
    if (self->fd >= 0 || self->lost || self->retry_timer != -1)
        return;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s", self->path);
    int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect (fd, (struct sockaddr *) &addr, sizeof addr) == 0) {
        self->fd = fd;
        agent_frame_reset (self->frame, fd);
        sbx_debug ("sandbox=%s agent socket connected", self->name);
        s_send_queued (self);
        s_poll (self);
        return;
    }
    int error = errno;
    if (fd >= 0)
        close (fd);
    if (sbx_clock_mono_ms () >= self->connect_deadline) {
        self->lost = true;
        char reason[300];
        snprintf (reason, sizeof reason, "cannot reach the agent socket %s: %s", self->path,
                  strerror (error));
        sbx_warn ("sandbox=%s %s", self->name, reason);
        if (self->lost_fn)
            self->lost_fn (self, reason, self->arg);
        return;
    }
    self->retry_timer = zloop_timer (self->loop, S_RETRY_MS, 1, s_on_retry, self);
}

//  A frame the guest began and did not finish would hold the stream (and its buffer)
//  until it did: past the deadline it is dropped with the connection, and the reconnect
//  makes both ends start clean (the agent says hello again).
static void s_check_partial (vmd_agentlink_t *self)
{
    int64_t waited = agent_frame_waiting_ms (self->frame);
    if (self->fd < 0 || waited < (int64_t) self->frame_timeout)
        return;
    self->dropped++;
    sbx_warn ("sandbox=%s agent frame incomplete after %lld ms (%zu bytes arrived): dropped, "
              "resetting the channel (vmd.agent_frame_timeout_ms = %u)",
              self->name, (long long) waited, agent_frame_held (self->frame), self->frame_timeout);
    s_break (self, "an incomplete frame from the agent was dropped");
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_agentlink_t *self = arg;
    uint64_t now = sbx_clock_mono_ms ();
    //  After a stall of vmd's own loop (sbx_stall.h) the agent's answers may be waiting
    //  to be read: the deadlines get the time back, and a partial frame is not judged
    //  before the bytes that came meanwhile are read.
    uint64_t gap = sbx_stall_check (&self->stall, now);
    if (gap) {
        sbx_info ("sandbox=%s vmd did not run for %llu ms: the agent's requests get that time "
                  "back",
                  self->name, (unsigned long long) gap);
        for (s_req_t *req = self->reqs; req; req = req->next)
            req->deadline += gap;
        self->connect_deadline += gap;
    } else
        s_check_partial (self);
    //  One answer per pass through the list: a callback may add or cancel requests.
    bool again = true;
    while (again) {
        again = false;
        for (s_req_t *req = self->reqs; req; req = req->next) {
            sbx_msg_t *answer = NULL;
            if (req->answer) {
                answer = req->answer;
                req->answer = NULL;
            } else if (now >= req->deadline)
                answer = sbx_msg_new_error (
                    0, SBX_E_TIMEOUT, "the guest agent did not answer %s within %.1f s",
                    sbx_msg_type_name (req->type), req->timeout_ms / 1000.0);
            if (!answer)
                continue;
            s_answer (self, req, &answer);
            again = true;
            break;
        }
    }
    return 0;
}

vmd_agentlink_t *vmd_agentlink_new (zloop_t *loop, const char *socket_path, const char *name)
{
    if (!loop || !socket_path ||
        strlen (socket_path) >= sizeof ((struct sockaddr_un *) 0)->sun_path)
        return NULL;
    vmd_agentlink_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->path = strdup (socket_path);
    self->name = strdup (name ? name : "?");
    self->fd = -1;
    self->frame = agent_frame_new (-1);
    self->next_rid = 1;
    self->connect_timeout = 30000;
    self->frame_timeout = VMD_AGENTLINK_FRAME_TIMEOUT;
    self->stall = sbx_stall_init (S_TICK_MS, 1000);
    self->retry_timer = -1;
    self->connect_deadline = sbx_clock_mono_ms () + (uint64_t) self->connect_timeout;
    self->tick_timer = zloop_timer (loop, S_TICK_MS, 0, s_on_tick, self);
    if (!self->path || !self->name || !self->frame || self->tick_timer == -1) {
        vmd_agentlink_destroy (&self);
        return NULL;
    }
    //  The first attempt from the loop, so that callbacks never run inside new.
    self->retry_timer = zloop_timer (loop, 0, 1, s_on_retry, self);
    return self;
}

void vmd_agentlink_destroy (vmd_agentlink_t **self_p)
{
    vmd_agentlink_t *self = *self_p;
    if (!self)
        return;
    if (self->fd >= 0) {
        zmq_pollitem_t item = {NULL, self->fd, self->events, 0};
        if (self->events)
            zloop_poller_end (self->loop, &item);
        close (self->fd);
    }
    if (self->retry_timer != -1)
        zloop_timer_end (self->loop, self->retry_timer);
    if (self->tick_timer != -1)
        zloop_timer_end (self->loop, self->tick_timer);
    while (self->reqs) {
        s_req_t *req = self->reqs;
        self->reqs = req->next;
        s_req_destroy (&req);
    }
    agent_frame_destroy (&self->frame);
    free (self->path);
    free (self->name);
    free (self);
    *self_p = NULL;
}

void vmd_agentlink_set_handlers (vmd_agentlink_t *self, vmd_agentlink_hello_fn *hello,
                                 vmd_agentlink_lost_fn *lost, void *arg)
{
    self->hello_fn = hello;
    self->lost_fn = lost;
    self->arg = arg;
}

void vmd_agentlink_set_connect_timeout (vmd_agentlink_t *self, int msecs)
{
    self->connect_timeout = msecs;
    if (self->fd < 0)
        self->connect_deadline = sbx_clock_mono_ms () + (uint64_t) msecs;
}

void vmd_agentlink_set_frame_timeout (vmd_agentlink_t *self, uint32_t msecs)
{
    self->frame_timeout = msecs ? msecs : VMD_AGENTLINK_FRAME_TIMEOUT;
}

size_t vmd_agentlink_frames_dropped (vmd_agentlink_t *self)
{
    return self->dropped;
}

uint64_t vmd_agentlink_request (vmd_agentlink_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                                vmd_agentlink_reply_fn *fn, void *arg)
{
    sbx_msg_t *msg = *request_p;
    *request_p = NULL;
    s_req_t *req = calloc (1, sizeof *req);
    if (!req || !msg) {
        free (req);
        sbx_msg_destroy (&msg);
        return 0;
    }
    req->rid = self->next_rid++;
    req->orig_rid = msg->rid;
    msg->rid = req->rid;
    req->msg = msg;
    req->type = msg->type;
    req->timeout_ms = timeout_ms ? timeout_ms : S_DEFAULT_TIMEOUT;
    req->deadline = sbx_clock_mono_ms () + req->timeout_ms;
    req->fn = fn;
    req->arg = arg;
    //  Appended: requests go out in the order they were made.
    size_t queued = 0;
    s_req_t **at = &self->reqs;
    for (; *at; at = &(*at)->next)
        queued += (*at)->msg != NULL;
    *at = req;
    if (queued >= S_MAX_QUEUED) {
        sbx_msg_destroy (&req->msg);
        req->answer = sbx_msg_new_error (0, SBX_E_UNAVAILABLE,
                                         "the guest agent is not taking requests: %zu wait "
                                         "already (it reads none, or is not connected)",
                                         queued);
        sbx_warn ("sandbox=%s agent request %s refused: %zu requests wait already", self->name,
                  sbx_msg_type_name (req->type), queued);
        return 0;
    }
    if (self->fd >= 0) {
        s_send_queued (self);
        s_poll (self);
    }
    return req->answer ? 0 : req->rid;
}

void vmd_agentlink_cancel (vmd_agentlink_t *self, uint64_t rid)
{
    for (s_req_t **at = &self->reqs; *at; at = &(*at)->next)
        if ((*at)->rid == rid) {
            s_req_t *req = *at;
            *at = req->next;
            s_req_destroy (&req);
            return;
        }
}

void vmd_agentlink_fail_all (vmd_agentlink_t *self, const char *why)
{
    while (self->reqs) {
        sbx_msg_t *answer = sbx_msg_new_error (0, SBX_E_UNAVAILABLE, "%s", why);
        s_answer (self, self->reqs, &answer);
    }
}

bool vmd_agentlink_connected (vmd_agentlink_t *self)
{
    return self->fd >= 0;
}

size_t vmd_agentlink_hellos (vmd_agentlink_t *self)
{
    return self->hellos;
}

//  --------------------------------------------------------------------------
//  Self test: a fake agent on a unix socket (blocking, in this thread, between turns
//  of the loop): hello, rid correlation, a timeout, a broken stream and the reconnect,
//  garbage, a partial frame dropped at its deadline, a header above the limit. Then the
//  real sbx-agent (SBX_AGENT_BIN, set by ctest) behind a link: held agent.status.

#include <assert.h>
#include <poll.h>
#include <sys/wait.h>

typedef struct {
    size_t hellos;
    sbx_msg_t *answer;
} s_test_t;

static void s_test_hello (vmd_agentlink_t *link, sbx_agent_hello_t *hello, void *arg)
{
    (void) link;
    assert (streq (hello->version, "test"));
    ((s_test_t *) arg)->hellos++;
}

static void s_test_hello_real (vmd_agentlink_t *link, sbx_agent_hello_t *hello, void *arg)
{
    (void) link;
    (void) hello;
    ((s_test_t *) arg)->hellos++;
}

static void s_test_reply (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    s_test_t *test = arg;
    assert (!test->answer);
    test->answer = *reply_p;
    *reply_p = NULL;
}

static int s_test_stop (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return -1;
}

//  Runs the loop for msecs.
static void s_test_run (zloop_t *loop, int msecs)
{
    zloop_timer (loop, (size_t) msecs, 1, s_test_stop, NULL);
    zloop_start (loop);
}

static int s_test_accept (int listener)
{
    struct pollfd pfd = {listener, POLLIN, 0};
    assert (poll (&pfd, 1, 2000) == 1);
    int fd = accept4 (listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    assert (fd >= 0);
    return fd;
}

static void s_test_hello_send (agent_frame_t *frame)
{
    sbx_msg_t *hello = sbx_msg_new (SBX_MSG_AGENT_HELLO);
    sbx_str_set (&sbx_msg_agent_hello (hello)->version, "test");
    assert (agent_frame_send (frame, hello, NULL) == 0);
    assert (agent_frame_flush_wait (frame, 1000) == 0);
    sbx_msg_destroy (&hello);
}

//  Counts answers: [0] unavailable, [1] anything else.
static void s_test_count (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    size_t *counts = arg;
    bool unavailable =
        (*reply_p)->type == SBX_MSG_ERROR && sbx_msg_error (*reply_p)->code == SBX_E_UNAVAILABLE;
    counts[unavailable ? 0 : 1]++;
}

//  The link reconnected after a reset: take the new connection and say hello on it.
static int s_test_reattach (int listener, agent_frame_t *agent, int old_fd)
{
    close (old_fd);
    int fd = s_test_accept (listener);
    agent_frame_reset (agent, fd);
    s_test_hello_send (agent);
    return fd;
}

//  A ping through the link, answered by the test's agent: the channel works.
static void s_test_ping (zloop_t *loop, vmd_agentlink_t *link, agent_frame_t *agent, s_test_t *test)
{
    sbx_msg_t *ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    ping->rid = 9;
    vmd_agentlink_request (link, &ping, 5000, s_test_reply, test);
    sbx_err_t err;
    sbx_msg_t *got = NULL;
    for (int i = 0; i < 100 && !got; i++) {
        s_test_run (loop, 20);
        got = agent_frame_recv (agent, 0, &err);
    }
    assert (got && got->type == SBX_MSG_AGENT_PING);
    sbx_msg_t *pong = sbx_msg_new_reply (got, SBX_MSG_AGENT_PING_OK);
    sbx_str_set (&sbx_msg_agent_ping_ok (pong)->version, "test");
    assert (agent_frame_send (agent, pong, NULL) == 0 && agent_frame_flush_wait (agent, 1000) == 0);
    sbx_msg_destroy (&pong);
    sbx_msg_destroy (&got);
    for (int i = 0; i < 100 && !test->answer; i++)
        s_test_run (loop, 20);
    assert (test->answer && test->answer->type == SBX_MSG_AGENT_PING_OK && test->answer->rid == 9);
    sbx_msg_destroy (&test->answer);
}

//  Answers by request: each arg is a slot for one.
static void s_test_slot (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    sbx_msg_t **slot = arg;
    assert (!*slot);
    *slot = *reply_p;
    *reply_p = NULL;
}

//  Runs the loop until *slot is filled (or ms pass).
static void s_test_until (zloop_t *loop, sbx_msg_t **slot, int ms)
{
    for (int i = 0; i < ms / 10 && !*slot; i++)
        s_test_run (loop, 10);
    assert (*slot);
}

static uint64_t s_test_status (vmd_agentlink_t *link, uint64_t pid, uint64_t offset,
                               uint64_t wait_ms, uint32_t timeout_ms, sbx_msg_t **slot)
{
    sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (status)->pid = pid;
    sbx_msg_agent_status (status)->stdout_offset = offset;
    sbx_msg_agent_status (status)->wait_ms = wait_ms;
    return vmd_agentlink_request (link, &status, timeout_ms, s_test_slot, slot);
}

//  The real agent behind a link, as in a guest: a status held for output (wait_ms under
//  the request's timeout) is answered when the output comes, requests made meanwhile are
//  answered at once, and one whose wait passes is answered at its deadline (not failed
//  as a timeout).
static void s_test_real_agent (zloop_t *loop, const char *dir)
{
    const char *agent_bin = getenv ("SBX_AGENT_BIN");
    if (!agent_bin || !*agent_bin) {
        printf (" (SBX_AGENT_BIN not set: the real agent's part left out)");
        return;
    }
    char *path = zsys_sprintf ("%s/real.sock", dir);
    int listener = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s", path);
    assert (bind (listener, (struct sockaddr *) &addr, sizeof addr) == 0);
    assert (listen (listener, 1) == 0);
    s_test_t test = {0};
    vmd_agentlink_t *link = vmd_agentlink_new (loop, path, "sb_real");
    vmd_agentlink_set_handlers (link, s_test_hello_real, NULL, &test);
    s_test_run (loop, 50);
    int fd = s_test_accept (listener);
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        dup2 (fd, 3);
        execl (agent_bin, agent_bin, "--port-fd", "3", "--no-clock", (char *) NULL);
        _exit (127);
    }
    close (fd);
    for (int i = 0; i < 500 && !test.hellos; i++)
        s_test_run (loop, 10);
    assert (test.hellos == 1);

    sbx_msg_t *exec = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_str_set (&sbx_msg_agent_exec (exec)->command, "sleep 1; echo late; sleep 30");
    sbx_msg_agent_exec (exec)->detached = true;
    sbx_msg_t *started = NULL;
    vmd_agentlink_request (link, &exec, 5000, s_test_slot, &started);
    s_test_until (loop, &started, 5000);
    assert (started->type == SBX_MSG_AGENT_EXEC_OK);
    uint64_t proc = sbx_msg_agent_exec_ok (started)->pid;
    sbx_msg_destroy (&started);

    sbx_msg_t *held = NULL, *pong = NULL;
    uint64_t t0 = sbx_clock_mono_ms ();
    s_test_status (link, proc, 0, 5000, 8000, &held);
    sbx_msg_t *ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    vmd_agentlink_request (link, &ping, 1000, s_test_slot, &pong);
    s_test_until (loop, &pong, 1000);
    assert (pong->type == SBX_MSG_AGENT_PING_OK && !held);
    sbx_msg_destroy (&pong);
    s_test_until (loop, &held, 5000);
    uint64_t waited = sbx_clock_mono_ms () - t0;
    assert (held->type == SBX_MSG_AGENT_STATUS_OK && sbx_msg_agent_status_ok (held)->running);
    assert (sbx_msg_agent_status_ok (held)->stdout.size == 5 && waited >= 900);
    sbx_msg_destroy (&held);
    t0 = sbx_clock_mono_ms ();
    s_test_status (link, proc, 5, 700, 3000, &held);
    s_test_until (loop, &held, 3000);
    waited = sbx_clock_mono_ms () - t0;
    assert (held->type == SBX_MSG_AGENT_STATUS_OK &&
            sbx_msg_agent_status_ok (held)->stdout.size == 0);
    assert (waited >= 650 && waited < 2500);
    sbx_msg_destroy (&held);

    vmd_agentlink_destroy (&link); //  end of stream: the agent kills what runs and exits
    int status = 0;
    assert (waitpid (pid, &status, 0) == pid && WIFEXITED (status) && WEXITSTATUS (status) == 0);
    close (listener);
    unlink (path);
    free (path);
}

void vmd_agentlink_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/vmd_agentlink_test.XXXXXX";
    assert (mkdtemp (dir));
    char *path = zsys_sprintf ("%s/agent.sock", dir);
    zloop_t *loop = zloop_new ();
    s_test_t test = {0};
    vmd_agentlink_t *link = vmd_agentlink_new (loop, path, "sb_test");
    assert (link);
    vmd_agentlink_set_handlers (link, s_test_hello, NULL, &test);
    //  No socket yet: the link keeps trying; a request waits for the connection.
    s_test_run (loop, 150);
    assert (!vmd_agentlink_connected (link));
    sbx_msg_t *ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    ping->rid = 5;
    uint64_t rid = vmd_agentlink_request (link, &ping, 5000, s_test_reply, &test);
    assert (rid > 0 && !ping);

    int listener = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s", path);
    assert (bind (listener, (struct sockaddr *) &addr, sizeof addr) == 0);
    assert (listen (listener, 4) == 0);
    s_test_run (loop, 200);
    assert (vmd_agentlink_connected (link));
    int fd = s_test_accept (listener);
    agent_frame_t *agent = agent_frame_new (fd);
    s_test_hello_send (agent);
    //  The queued ping went out under the link's rid; the answer comes back under 5.
    sbx_err_t err;
    sbx_msg_t *got = agent_frame_recv (agent, 2000, &err);
    assert (got && got->type == SBX_MSG_AGENT_PING && got->rid == rid);
    sbx_msg_t *pong = sbx_msg_new_reply (got, SBX_MSG_AGENT_PING_OK);
    sbx_str_set (&sbx_msg_agent_ping_ok (pong)->version, "test");
    assert (agent_frame_send (agent, pong, NULL) == 0 && agent_frame_flush_wait (agent, 1000) == 0);
    sbx_msg_destroy (&pong);
    sbx_msg_destroy (&got);
    for (int i = 0; i < 20 && !test.answer; i++)
        s_test_run (loop, 20);
    assert (test.hellos == 1);
    assert (test.answer && test.answer->type == SBX_MSG_AGENT_PING_OK && test.answer->rid == 5);
    sbx_msg_destroy (&test.answer);

    //  No answer: timeout, said as such.
    ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    vmd_agentlink_request (link, &ping, 100, s_test_reply, &test);
    for (int i = 0; i < 20 && !test.answer; i++)
        s_test_run (loop, 20);
    assert (test.answer && test.answer->type == SBX_MSG_ERROR);
    assert (sbx_msg_error (test.answer)->code == SBX_E_TIMEOUT);
    sbx_msg_destroy (&test.answer);

    //  vmd's loop stands still (a stopped process, a paused machine) while the answer
    //  comes: it is delivered, not a timeout (the deadline, 0.4 s, got the time back).
    ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    ping->rid = 6;
    rid = vmd_agentlink_request (link, &ping, 400, s_test_reply, &test);
    s_test_run (loop, 20);
    //  (the unanswered ping above comes first)
    while ((got = agent_frame_recv (agent, 2000, &err)) && got->rid != rid)
        sbx_msg_destroy (&got);
    assert (got && got->type == SBX_MSG_AGENT_PING);
    pong = sbx_msg_new_reply (got, SBX_MSG_AGENT_PING_OK);
    sbx_str_set (&sbx_msg_agent_ping_ok (pong)->version, "test");
    assert (agent_frame_send (agent, pong, NULL) == 0 && agent_frame_flush_wait (agent, 1000) == 0);
    sbx_msg_destroy (&pong);
    sbx_msg_destroy (&got);
    zclock_sleep (1500);
    for (int i = 0; i < 20 && !test.answer; i++)
        s_test_run (loop, 20);
    assert (test.answer && test.answer->type == SBX_MSG_AGENT_PING_OK && test.answer->rid == 6);
    sbx_msg_destroy (&test.answer);

    //  The stream breaks with a request out: it fails, the link reconnects, hello again.
    ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    vmd_agentlink_request (link, &ping, 5000, s_test_reply, &test);
    s_test_run (loop, 50);
    got = agent_frame_recv (agent, 2000, &err);
    assert (got);
    sbx_msg_destroy (&got);
    close (fd);
    for (int i = 0; i < 20 && !test.answer; i++)
        s_test_run (loop, 20);
    assert (test.answer && sbx_msg_error (test.answer)->code == SBX_E_UNAVAILABLE);
    sbx_msg_destroy (&test.answer);
    s_test_run (loop, 200);
    fd = s_test_accept (listener);
    agent_frame_reset (agent, fd);
    s_test_hello_send (agent);
    for (int i = 0; i < 20 && test.hellos < 2; i++)
        s_test_run (loop, 20);
    assert (test.hellos == 2 && vmd_agentlink_hellos (link) == 2);

    //  Garbage from the agent: survived (the stream is reset), and the link carries on.
    assert (agent_frame_send_raw (agent, "\x00\x00\x00\x03\x01\x02\x03", 7) == 0);
    assert (agent_frame_flush_wait (agent, 1000) == 0);
    s_test_run (loop, 100);
    fd = s_test_reattach (listener, agent, fd);
    for (int i = 0; i < 50 && test.hellos < 3; i++)
        s_test_run (loop, 20);
    assert (test.hellos == 3);

    //  A partial frame: a header announcing 100 bytes, then 10. It holds the stream only
    //  until the frame timeout: the link drops it, fails what was sent, reconnects, and
    //  the next request works.
    vmd_agentlink_set_frame_timeout (link, 1000);
    ping = sbx_msg_new (SBX_MSG_AGENT_PING);
    vmd_agentlink_request (link, &ping, 30000, s_test_reply, &test);
    s_test_run (loop, 50);
    got = agent_frame_recv (agent, 2000, &err);
    assert (got && got->type == SBX_MSG_AGENT_PING);
    sbx_msg_destroy (&got);
    uint64_t sent_at = sbx_clock_mono_ms ();
    assert (agent_frame_send_raw (agent, "\x00\x00\x00\x64\x85\x01\x02\x03\x04\x05\x06\x07\x08\x09",
                                  14) == 0);
    assert (agent_frame_flush_wait (agent, 1000) == 0);
    s_test_run (loop, 100);
    //  Only asserted when the loop really ran for less than the timeout (a loaded host
    //  may stall the test longer).
    if (sbx_clock_mono_ms () - sent_at < 900)
        assert (vmd_agentlink_frames_dropped (link) == 0 && !test.answer);
    for (int i = 0; i < 200 && !test.answer; i++)
        s_test_run (loop, 20);
    assert (vmd_agentlink_frames_dropped (link) == 1);
    assert (test.answer && sbx_msg_error (test.answer)->code == SBX_E_UNAVAILABLE);
    sbx_msg_destroy (&test.answer);
    fd = s_test_reattach (listener, agent, fd);
    s_test_ping (loop, link, agent, &test);
    assert (test.hellos == 4);

    //  A header above the limit is refused as it comes (nothing is buffered for it): the
    //  link resets the channel at once, long before the frame timeout.
    vmd_agentlink_set_frame_timeout (link, 600000);
    assert (agent_frame_send_raw (agent, "\x7f\xff\xff\xff\x85\x00", 6) == 0);
    assert (agent_frame_flush_wait (agent, 1000) == 0);
    s_test_run (loop, 100);
    fd = s_test_reattach (listener, agent, fd);
    s_test_ping (loop, link, agent, &test);
    assert (test.hellos == 5 && vmd_agentlink_frames_dropped (link) == 1);

    //  A guest that stops reading: output waits up to 4 MiB, then requests queue, and
    //  past 64 queued the link refuses at once. When the guest reads again, what was
    //  taken goes out, in order.
    size_t counts[2] = {0, 0}; //  unavailable answers, other answers
    uint8_t *mib = calloc (1, 1 << 20);
    assert (mib);
    for (int i = 0; i < 100; i++) {
        sbx_msg_t *write = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
        sbx_str_set (&sbx_msg_agent_file_write (write)->path, "/x");
        sbx_msg_agent_file_write (write)->offset = (uint64_t) i;
        sbx_bytes_set (&sbx_msg_agent_file_write (write)->data, mib, 1 << 20);
        vmd_agentlink_request (link, &write, 60000, s_test_count, counts);
    }
    free (mib);
    s_test_run (loop, 100);
    size_t refused = counts[0];
    assert (counts[1] == 0 && refused > 0 && refused <= 100 - 64);
    uint64_t expect = 0;
    for (int i = 0; i < 5000 && expect < 100 - refused; i++) {
        s_test_run (loop, 2);
        got = agent_frame_recv (agent, 0, &err);
        if (got) {
            assert (got->type == SBX_MSG_AGENT_FILE_WRITE);
            assert (sbx_msg_agent_file_write (got)->offset == expect++);
            sbx_msg_destroy (&got);
        }
    }
    assert (expect == 100 - refused && counts[0] == refused);

    vmd_agentlink_destroy (&link);
    vmd_agentlink_destroy (&link);
    agent_frame_destroy (&agent);
    close (fd);
    close (listener);
    s_test_real_agent (loop, dir);
    zloop_destroy (&loop);
    unlink (path);
    free (path);
    rmdir (dir);
}
