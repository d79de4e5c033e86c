/*  vmd_qmp - see vmd_qmp.h */
#include "vmd_qmp.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sbx_log.h"

#define RETRY_MSECS 50
#define READ_CHUNK  65536

typedef enum { S_CONNECTING, S_GREETING, S_NEGOTIATING, S_READY, S_CLOSED } s_state_t;

//  A command that waits for its reply.
typedef struct {
    vmd_qmp_t *owner;
    int64_t id;
    int timer_id; //  reply timeout, -1 once fired
    vmd_qmp_reply_fn *fn;
    void *arg;
    bool arg_owned; //  a helper's context: freed with the command if never answered
} s_cmd_t;

//  Bytes on their way to QEMU, with an fd to pass alongside their first byte.
typedef struct {
    char *data;
    size_t size, sent;
    int fd;
} s_out_t;

struct _vmd_qmp_t {
    zloop_t *loop;
    char *path;
    s_state_t state;
    int fd;
    int poll_events;    //  events registered with zloop, 0 when none
    int connect_timer;  //  retry timer, -1 when none
    int deadline_timer; //  connect + handshake deadline, -1 when none
    int connect_msecs;
    int timeout_msecs;
    size_t max_line;
    char *rbuf;
    size_t rlen, rcap;
    int64_t next_id;
    zlist_t *pending; //  s_cmd_t awaiting replies
    zlist_t *out;     //  s_out_t being written
    zlist_t *held;    //  s_out_t of commands issued before ready
    vmd_qmp_ready_fn *ready_fn;
    vmd_qmp_event_fn *event_fn;
    vmd_qmp_closed_fn *closed_fn;
    void *handler_arg;
    int depth; //  loop handlers of ours on the stack
    bool dead; //  destroyed from a callback, freed when depth is back to 0
};

static int s_on_socket (zloop_t *loop, zmq_pollitem_t *item, void *arg);
static void s_try_connect (vmd_qmp_t *self);
static void s_enter (vmd_qmp_t *self);
static void s_leave (vmd_qmp_t *self);

static void s_out_destroy (s_out_t **out_p)
{
    if (*out_p) {
        if ((*out_p)->fd >= 0)
            close ((*out_p)->fd);
        free ((*out_p)->data);
        free (*out_p);
        *out_p = NULL;
    }
}

static void s_cmd_destroy (s_cmd_t **cmd_p)
{
    s_cmd_t *cmd = *cmd_p;
    if (cmd) {
        if (cmd->timer_id >= 0)
            zloop_timer_end (cmd->owner->loop, cmd->timer_id);
        if (cmd->arg_owned)
            free (cmd->arg);
        free (cmd);
        *cmd_p = NULL;
    }
}

//  zloop can't change a poller's events, so a change means end + re-register.
static void s_poll (vmd_qmp_t *self, int events)
{
    if (self->poll_events == events)
        return;
    zmq_pollitem_t item = {NULL, self->fd, 0, 0};
    if (self->poll_events)
        zloop_poller_end (self->loop, &item);
    self->poll_events = events;
    if (events) {
        item.events = (short) events;
        if (zloop_poller (self->loop, &item, s_on_socket, self) == 0)
            //  POLLERR must reach our handler (as a closed peer), not just unregister us.
            zloop_poller_set_tolerant (self->loop, &item);
        else {
            sbx_error ("qmp %s: cannot register with the loop", self->path);
            self->poll_events = 0;
        }
    }
}

static void s_timer_cancel (vmd_qmp_t *self, int *timer_id)
{
    if (*timer_id >= 0)
        zloop_timer_end (self->loop, *timer_id);
    *timer_id = -1;
}

//  The end: every pending command fails, then the owner hears why. Safe to reach
//  twice; only the first call does anything.
static void s_close (vmd_qmp_t *self, const char *reason)
{
    if (self->state == S_CLOSED)
        return;
    sbx_warn ("qmp %s: closed: %s", self->path, reason);
    self->state = S_CLOSED;
    s_poll (self, 0);
    if (self->fd >= 0)
        close (self->fd);
    self->fd = -1;
    s_timer_cancel (self, &self->connect_timer);
    s_timer_cancel (self, &self->deadline_timer);
    s_out_t *out;
    while ((out = (s_out_t *) zlist_pop (self->out)))
        s_out_destroy (&out);
    while ((out = (s_out_t *) zlist_pop (self->held)))
        s_out_destroy (&out);
    char error[256];
    snprintf (error, sizeof error, "connection closed: %s", reason);
    s_cmd_t *cmd;
    while ((cmd = (s_cmd_t *) zlist_pop (self->pending))) {
        if (cmd->fn)
            cmd->fn (self, NULL, error, cmd->arg);
        cmd->arg_owned = false; //  the callback had it
        s_cmd_destroy (&cmd);
    }
    if (self->closed_fn)
        self->closed_fn (self, reason, self->handler_arg);
}

static int s_on_deadline (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    vmd_qmp_t *self = (vmd_qmp_t *) arg;
    self->deadline_timer = -1;
    s_enter (self);
    s_close (self, self->state == S_CONNECTING ? "cannot connect" : "no QMP handshake");
    s_leave (self);
    return 0;
}

static int s_on_retry (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    vmd_qmp_t *self = (vmd_qmp_t *) arg;
    self->connect_timer = -1;
    s_enter (self);
    s_try_connect (self);
    s_leave (self);
    return 0;
}

//  A missing or refusing socket is normal while QEMU starts: try again shortly, until
//  the deadline timer gives up.
static void s_try_connect (vmd_qmp_t *self)
{
    int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd == -1) {
        s_close (self, strerror (errno));
        return;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy (addr.sun_path, self->path); //  length checked in the constructor
    if (connect (fd, (struct sockaddr *) &addr, sizeof addr) == 0) {
        self->fd = fd;
        self->state = S_GREETING;
        s_poll (self, ZMQ_POLLIN);
        return;
    }
    int err = errno;
    close (fd);
    if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR) {
        self->connect_timer = zloop_timer (self->loop, RETRY_MSECS, 1, s_on_retry, self);
        return;
    }
    s_close (self, strerror (err));
}

vmd_qmp_t *vmd_qmp_new (zloop_t *loop, const char *socket_path)
{
    if (!loop || !socket_path ||
        strlen (socket_path) >= sizeof ((struct sockaddr_un *) 0)->sun_path)
        return NULL;
    vmd_qmp_t *self = (vmd_qmp_t *) zmalloc (sizeof (vmd_qmp_t));
    self->loop = loop;
    self->path = strdup (socket_path);
    self->fd = -1;
    self->connect_timer = -1;
    self->deadline_timer = -1;
    self->connect_msecs = 10000;
    self->timeout_msecs = 10000;
    self->max_line = 1024 * 1024;
    self->next_id = 1;
    self->pending = zlist_new ();
    self->out = zlist_new ();
    self->held = zlist_new ();
    self->state = S_CONNECTING;
    //  First attempt from the loop, so no callback ever runs inside this constructor, at
    //  once (fuzz/fuzz_qmp.c makes one connection per input).
    self->connect_timer = zloop_timer (loop, 0, 1, s_on_retry, self);
    self->deadline_timer = zloop_timer (loop, (size_t) self->connect_msecs, 1, s_on_deadline, self);
    return self;
}

//  Lets go of the connection, timers and commands, without callbacks.
static void s_release (vmd_qmp_t *self)
{
    s_poll (self, 0);
    if (self->fd >= 0)
        close (self->fd);
    self->fd = -1;
    self->state = S_CLOSED;
    self->ready_fn = NULL;
    self->event_fn = NULL;
    self->closed_fn = NULL;
    s_timer_cancel (self, &self->connect_timer);
    s_timer_cancel (self, &self->deadline_timer);
    s_cmd_t *cmd;
    while ((cmd = (s_cmd_t *) zlist_pop (self->pending)))
        s_cmd_destroy (&cmd);
    s_out_t *out;
    while ((out = (s_out_t *) zlist_pop (self->out)))
        s_out_destroy (&out);
    while ((out = (s_out_t *) zlist_pop (self->held)))
        s_out_destroy (&out);
}

static void s_free (vmd_qmp_t *self)
{
    zlist_destroy (&self->pending);
    zlist_destroy (&self->out);
    zlist_destroy (&self->held);
    free (self->rbuf);
    free (self->path);
    free (self);
}

//  Every loop handler runs between s_enter and s_leave, so that a callback may destroy
//  the object: the memory goes only once the handler has unwound.
static void s_enter (vmd_qmp_t *self)
{
    self->depth++;
}

static void s_leave (vmd_qmp_t *self)
{
    if (--self->depth == 0 && self->dead)
        s_free (self);
}

void vmd_qmp_destroy (vmd_qmp_t **self_p)
{
    assert (self_p);
    vmd_qmp_t *self = *self_p;
    if (!self)
        return;
    *self_p = NULL;
    if (self->dead)
        return;
    s_release (self);
    if (self->depth > 0)
        self->dead = true;
    else
        s_free (self);
}

void vmd_qmp_set_handlers (vmd_qmp_t *self, vmd_qmp_ready_fn *ready, vmd_qmp_event_fn *event,
                           vmd_qmp_closed_fn *closed, void *arg)
{
    assert (self);
    self->ready_fn = ready;
    self->event_fn = event;
    self->closed_fn = closed;
    self->handler_arg = arg;
}

void vmd_qmp_set_connect_timeout (vmd_qmp_t *self, int msecs)
{
    assert (self);
    self->connect_msecs = msecs > 0 ? msecs : 1;
    if (self->deadline_timer >= 0) {
        s_timer_cancel (self, &self->deadline_timer);
        self->deadline_timer =
            zloop_timer (self->loop, (size_t) self->connect_msecs, 1, s_on_deadline, self);
    }
}

void vmd_qmp_set_timeout (vmd_qmp_t *self, int msecs)
{
    assert (self);
    self->timeout_msecs = msecs > 0 ? msecs : 1;
}

void vmd_qmp_set_max_line (vmd_qmp_t *self, size_t bytes)
{
    assert (self);
    self->max_line = bytes > 64 ? bytes : 64;
}

bool vmd_qmp_ready (vmd_qmp_t *self)
{
    return self && self->state == S_READY;
}

bool vmd_qmp_closed (vmd_qmp_t *self)
{
    return !self || self->state == S_CLOSED;
}

//  Writes what the socket takes now; the rest waits for POLLOUT.
static void s_flush (vmd_qmp_t *self)
{
    s_out_t *out;
    while ((out = (s_out_t *) zlist_first (self->out))) {
        ssize_t n;
        if (out->fd >= 0 && out->sent == 0) {
            struct iovec iov = {out->data, out->size};
            union {
                char buf[CMSG_SPACE (sizeof (int))];
                struct cmsghdr align;
            } control;
            memset (&control, 0, sizeof control);
            struct msghdr msg = {.msg_iov = &iov,
                                 .msg_iovlen = 1,
                                 .msg_control = control.buf,
                                 .msg_controllen = sizeof control.buf};
            struct cmsghdr *cmsg = CMSG_FIRSTHDR (&msg);
            cmsg->cmsg_level = SOL_SOCKET;
            cmsg->cmsg_type = SCM_RIGHTS;
            cmsg->cmsg_len = CMSG_LEN (sizeof (int));
            memcpy (CMSG_DATA (cmsg), &out->fd, sizeof (int));
            n = sendmsg (self->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                close (out->fd);
                out->fd = -1;
            }
        } else
            n = send (self->fd, out->data + out->sent, out->size - out->sent,
                      MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            s_poll (self, ZMQ_POLLIN | ZMQ_POLLOUT);
            return;
        }
        if (n < 0) {
            s_close (self, strerror (errno));
            return;
        }
        out->sent += (size_t) n;
        if (out->sent < out->size)
            continue;
        zlist_pop (self->out);
        s_out_destroy (&out);
    }
    s_poll (self, ZMQ_POLLIN);
}

static int s_on_timeout (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    s_cmd_t *cmd = (s_cmd_t *) arg;
    vmd_qmp_t *self = cmd->owner;
    cmd->timer_id = -1;
    zlist_remove (self->pending, cmd);
    //  The command may still be answered; that reply then has an unknown id and is dropped.
    sbx_warn ("qmp %s: command id=%" PRId64 " timed out", self->path, cmd->id);
    s_enter (self);
    if (cmd->fn)
        cmd->fn (self, NULL, "timeout", cmd->arg);
    cmd->arg_owned = false;
    s_cmd_destroy (&cmd);
    s_leave (self);
    return 0;
}

static int s_send (vmd_qmp_t *self, const char *command, json_t *arguments, int fd,
                   vmd_qmp_reply_fn *fn, void *arg, bool arg_owned, bool internal)
{
    if (self->state == S_CLOSED || !command) {
        json_decref (arguments);
        if (arg_owned)
            free (arg);
        return -1;
    }
    int64_t id = self->next_id++;
    json_t *msg = json_pack ("{s:s, s:I}", "execute", command, "id", (json_int_t) id);
    if (arguments && json_is_object (arguments))
        json_object_set (msg, "arguments", arguments);
    json_decref (arguments);
    char *text = msg ? json_dumps (msg, JSON_COMPACT) : NULL;
    json_decref (msg);
    if (!text) {
        if (arg_owned)
            free (arg);
        return -1;
    }
    s_out_t *out = (s_out_t *) zmalloc (sizeof (s_out_t));
    out->size = strlen (text) + 2;
    out->data = (char *) malloc (out->size + 1);
    snprintf (out->data, out->size + 1, "%s\r\n", text);
    free (text);
    out->fd = fd >= 0 ? fcntl (fd, F_DUPFD_CLOEXEC, 3) : -1;

    s_cmd_t *cmd = (s_cmd_t *) zmalloc (sizeof (s_cmd_t));
    cmd->owner = self;
    cmd->id = id;
    cmd->fn = fn;
    cmd->arg = arg;
    cmd->arg_owned = arg_owned;
    cmd->timer_id = zloop_timer (self->loop, (size_t) self->timeout_msecs, 1, s_on_timeout, cmd);
    zlist_append (self->pending, cmd);

    if (self->state == S_READY || internal) {
        zlist_append (self->out, out);
        //  Written from the loop, so a write error can't call back into our caller.
        if (self->fd >= 0)
            s_poll (self, ZMQ_POLLIN | ZMQ_POLLOUT);
    } else
        zlist_append (self->held, out);
    return 0;
}

int vmd_qmp_execute (vmd_qmp_t *self, const char *command, json_t *arguments, vmd_qmp_reply_fn *fn,
                     void *arg)
{
    assert (self);
    return s_send (self, command, arguments, -1, fn, arg, false, false);
}

int vmd_qmp_execute_fd (vmd_qmp_t *self, const char *command, json_t *arguments, int fd,
                        vmd_qmp_reply_fn *fn, void *arg)
{
    assert (self);
    if (fd < 0) {
        json_decref (arguments);
        return -1;
    }
    return s_send (self, command, arguments, fd, fn, arg, false, false);
}

static void s_on_capabilities (vmd_qmp_t *self, json_t *result, const char *error, void *arg)
{
    (void) result, (void) arg;
    if (self->state == S_CLOSED)
        return;
    if (error) {
        s_close (self, "qmp_capabilities refused");
        return;
    }
    self->state = S_READY;
    s_timer_cancel (self, &self->deadline_timer);
    s_out_t *out;
    while ((out = (s_out_t *) zlist_pop (self->held)))
        zlist_append (self->out, out);
    if (zlist_size (self->out))
        s_poll (self, ZMQ_POLLIN | ZMQ_POLLOUT);
    if (self->ready_fn)
        self->ready_fn (self, self->handler_arg);
}

static s_cmd_t *s_take_pending (vmd_qmp_t *self, int64_t id)
{
    for (s_cmd_t *cmd = (s_cmd_t *) zlist_first (self->pending); cmd;
         cmd = (s_cmd_t *) zlist_next (self->pending))
        if (cmd->id == id) {
            zlist_remove (self->pending, cmd);
            return cmd;
        }
    return NULL;
}

//  One line from QEMU. Nothing in it is trusted: wrong shapes are logged and dropped.
static void s_handle_line (vmd_qmp_t *self, const char *line, size_t size)
{
    json_error_t jerr;
    json_t *msg = json_loadb (line, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object (msg)) {
        sbx_warn ("qmp %s: dropped a line that is no JSON object (%.60s)", self->path, line);
        json_decref (msg);
        return;
    }
    json_t *event = json_object_get (msg, "event");
    json_t *id = json_object_get (msg, "id");
    if (self->state == S_GREETING) {
        if (json_object_get (msg, "QMP")) {
            self->state = S_NEGOTIATING;
            s_send (self, "qmp_capabilities", NULL, -1, s_on_capabilities, NULL, false, true);
        } else
            sbx_warn ("qmp %s: dropped a line before the greeting", self->path);
    } else if (json_is_string (event)) {
        if (self->event_fn)
            self->event_fn (self, json_string_value (event), json_object_get (msg, "data"),
                            self->handler_arg);
    } else if (json_is_integer (id)) {
        s_cmd_t *cmd = s_take_pending (self, json_integer_value (id));
        json_t *ret = json_object_get (msg, "return");
        json_t *err = json_object_get (msg, "error");
        if (!cmd)
            sbx_warn ("qmp %s: dropped a reply to unknown id=%" JSON_INTEGER_FORMAT, self->path,
                      json_integer_value (id));
        else {
            char error[512];
            const char *why = NULL;
            if (ret)
                why = NULL;
            else if (json_is_object (err)) {
                const char *class = json_string_value (json_object_get (err, "class"));
                const char *desc = json_string_value (json_object_get (err, "desc"));
                snprintf (error, sizeof error, "%s: %s", class ? class : "Error",
                          desc ? desc : "(no description)");
                why = error;
            } else
                why = "malformed reply";
            if (cmd->fn)
                cmd->fn (self, why ? NULL : ret, why, cmd->arg);
            cmd->arg_owned = false;
            s_cmd_destroy (&cmd);
        }
    } else
        sbx_warn ("qmp %s: dropped a message with neither event nor id (%.60s)", self->path, line);
    json_decref (msg);
}

static void s_read (vmd_qmp_t *self)
{
    if (self->rcap - self->rlen < READ_CHUNK) {
        size_t cap = self->rlen + READ_CHUNK;
        char *buf = (char *) realloc (self->rbuf, cap);
        if (!buf) {
            s_close (self, "out of memory");
            return;
        }
        self->rbuf = buf;
        self->rcap = cap;
    }
    ssize_t n = recv (self->fd, self->rbuf + self->rlen, self->rcap - self->rlen, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        s_close (self, n == 0 ? "QEMU closed the connection" : strerror (errno));
        return;
    }
    self->rlen += (size_t) n;
    size_t start = 0;
    while (self->state != S_CLOSED) {
        char *nl = (char *) memchr (self->rbuf + start, '\n', self->rlen - start);
        if (!nl)
            break;
        size_t end = (size_t) (nl - self->rbuf);
        if (end - start > self->max_line) {
            s_close (self, "line over the size limit");
            return;
        }
        size_t len = end - start;
        if (len > 0 && self->rbuf[start + len - 1] == '\r')
            len--;
        self->rbuf[start + len] = 0; //  for the log's %s; json_loadb takes the size
        if (len > 0)
            s_handle_line (self, self->rbuf + start, len);
        start = end + 1;
    }
    if (self->state == S_CLOSED)
        return;
    memmove (self->rbuf, self->rbuf + start, self->rlen - start);
    self->rlen -= start;
    if (self->rlen > self->max_line)
        s_close (self, "line over the size limit");
    else if (self->rcap > 4 * READ_CHUNK && self->rlen < READ_CHUNK) {
        //  Give back what one long line took.
        char *buf = (char *) realloc (self->rbuf, READ_CHUNK);
        if (buf) {
            self->rbuf = buf;
            self->rcap = READ_CHUNK;
        }
    }
}

static int s_on_socket (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    vmd_qmp_t *self = (vmd_qmp_t *) arg;
    s_enter (self);
    if (item->revents & ZMQ_POLLOUT)
        s_flush (self);
    if (self->state != S_CLOSED && (item->revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
        s_read (self);
    s_leave (self);
    return 0;
}

//  --------------------------------------------------------------------------
//  Helpers

int vmd_qmp_query_status (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "query-status", NULL, fn, arg);
}

int vmd_qmp_stop (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "stop", NULL, fn, arg);
}

int vmd_qmp_cont (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "cont", NULL, fn, arg);
}

int vmd_qmp_migrate_cancel (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "migrate_cancel", NULL, fn, arg);
}

int vmd_qmp_quit (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "quit", NULL, fn, arg);
}

int vmd_qmp_query_migrate (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg)
{
    return vmd_qmp_execute (self, "query-migrate", NULL, fn, arg);
}

int vmd_qmp_set_max_bandwidth (vmd_qmp_t *self, int64_t bytes_per_sec, vmd_qmp_reply_fn *fn,
                               void *arg)
{
    return vmd_qmp_execute (self, "migrate-set-parameters",
                            json_pack ("{s:I}", "max-bandwidth", (json_int_t) bytes_per_sec), fn,
                            arg);
}

int vmd_qmp_set_capability (vmd_qmp_t *self, const char *capability, bool state,
                            vmd_qmp_reply_fn *fn, void *arg)
{
    if (!capability)
        return -1;
    return vmd_qmp_execute (
        self, "migrate-set-capabilities",
        json_pack ("{s:[{s:s, s:b}]}", "capabilities", "capability", capability, "state", state),
        fn, arg);
}

//  A helper's own context: the caller's callback, answered after one or two commands.
typedef struct {
    vmd_qmp_reply_fn *fn;
    void *arg;
    const char *next; //  the migration command after getfd; for HMP, see s_on_hmp
} s_chain_t;

static s_chain_t *s_chain_new (vmd_qmp_reply_fn *fn, void *arg, const char *next)
{
    s_chain_t *chain = (s_chain_t *) zmalloc (sizeof (s_chain_t));
    chain->fn = fn;
    chain->arg = arg;
    chain->next = next;
    return chain;
}

//  HMP has no error replies: each command prints its own text. expect NULL means
//  silence is success (hostfwd_add); otherwise success is output containing expect
//  (hostfwd_remove prints "host forwarding rule for ... removed"); "" passes the text on.
static void s_on_hmp (vmd_qmp_t *self, json_t *result, const char *error, void *arg)
{
    s_chain_t chain = *(s_chain_t *) arg;
    free (arg);
    const char *text = json_string_value (result);
    char message[512];
    if (!error && !text) {
        error = "malformed reply";
        result = NULL;
    } else if (!error && chain.next && !*chain.next)
        ; //  raw
    else if (!error && (chain.next ? !strstr (text, chain.next) : *text != 0)) {
        snprintf (message, sizeof message, "%s", *text ? text : "no output");
        size_t len = strlen (message);
        while (len > 0 && (message[len - 1] == '\n' || message[len - 1] == '\r'))
            message[--len] = 0;
        error = message;
        result = NULL;
    }
    if (chain.fn)
        chain.fn (self, result, error, chain.arg);
}

static int s_hmp (vmd_qmp_t *self, const char *command_line, const char *expect,
                  vmd_qmp_reply_fn *fn, void *arg)
{
    assert (self);
    if (!command_line)
        return -1;
    return s_send (self, "human-monitor-command", json_pack ("{s:s}", "command-line", command_line),
                   -1, s_on_hmp, s_chain_new (fn, arg, expect), true, false);
}

int vmd_qmp_hmp (vmd_qmp_t *self, const char *command_line, vmd_qmp_reply_fn *fn, void *arg)
{
    return s_hmp (self, command_line, "", fn, arg);
}

//  Only what hostfwd's parser takes unquoted may reach the HMP command line.
static bool s_hmp_word (const char *text)
{
    if (!text || !*text || strlen (text) > 64)
        return false;
    for (const char *c = text; *c; c++)
        if (!(isalnum ((unsigned char) *c) || *c == '.' || *c == '_' || *c == '-' || *c == ':'))
            return false;
    return true;
}

int vmd_qmp_hostfwd_add (vmd_qmp_t *self, const char *netdev, const char *host_addr, int host_port,
                         int guest_port, vmd_qmp_reply_fn *fn, void *arg)
{
    if (!s_hmp_word (netdev) || !s_hmp_word (host_addr) || host_port < 0 || host_port > 65535 ||
        guest_port < 1 || guest_port > 65535)
        return -1;
    char line[256];
    snprintf (line, sizeof line, "hostfwd_add %s tcp:%s:%d-:%d", netdev, host_addr, host_port,
              guest_port);
    return s_hmp (self, line, NULL, fn, arg);
}

int vmd_qmp_hostfwd_remove (vmd_qmp_t *self, const char *netdev, const char *host_addr,
                            int host_port, vmd_qmp_reply_fn *fn, void *arg)
{
    if (!s_hmp_word (netdev) || !s_hmp_word (host_addr) || host_port < 1 || host_port > 65535)
        return -1;
    char line[256];
    snprintf (line, sizeof line, "hostfwd_remove %s tcp:%s:%d", netdev, host_addr, host_port);
    return s_hmp (self, line, "removed", fn, arg);
}

#define S_MIGRATION_FD "sbx-migration"

static void s_on_getfd (vmd_qmp_t *self, json_t *result, const char *error, void *arg)
{
    (void) result;
    s_chain_t chain = *(s_chain_t *) arg;
    free (arg);
    if (error || self->dead) {
        if (chain.fn && !self->dead)
            chain.fn (self, NULL, error, chain.arg);
        return;
    }
    if (s_send (self, chain.next, json_pack ("{s:s}", "uri", "fd:" S_MIGRATION_FD), -1, chain.fn,
                chain.arg, false, false) == -1 &&
        chain.fn)
        chain.fn (self, NULL, "connection closed", chain.arg);
}

int vmd_qmp_migrate_to_fd (vmd_qmp_t *self, int fd, vmd_qmp_reply_fn *fn, void *arg)
{
    assert (self);
    if (fd < 0)
        return -1;
    return s_send (self, "getfd", json_pack ("{s:s}", "fdname", S_MIGRATION_FD), fd, s_on_getfd,
                   s_chain_new (fn, arg, "migrate"), true, false);
}

int vmd_qmp_migrate_incoming_fd (vmd_qmp_t *self, int fd, vmd_qmp_reply_fn *fn, void *arg)
{
    assert (self);
    if (fd < 0)
        return -1;
    return s_send (self, "getfd", json_pack ("{s:s}", "fdname", S_MIGRATION_FD), fd, s_on_getfd,
                   s_chain_new (fn, arg, "migrate-incoming"), true, false);
}

//  --------------------------------------------------------------------------
//  Self-test against a fake QMP server on a real unix socket, driven by the same loop.
//  The test against a real QEMU is in vmd_qemu_test.

typedef struct {
    int listener;
    int conn;
    char buf[4096];
    size_t len;
    int replies_ok, replies_err, timeouts, closed_fails, events, ready, closed;
    char last_closed[128];
    int seen_fd; //  fd received with getfd
    bool splitting;
    char held[4096];
    vmd_qmp_t *qmp;
    bool destroy_on_close; //  the closed callback destroys the object
    int split_id;          //  query-status, answered in two writes
    int recv_fd;           //  fd received, not yet claimed by a getfd
    char hmp_error[128];
    zloop_t *loop;
} s_fake_t;

static void s_fake_send (s_fake_t *fake, const char *text)
{
    //  QEMU never interleaves inside a line: hold other replies while one is split.
    if (fake->splitting) {
        size_t len = strlen (fake->held);
        size_t add = strlen (text);
        if (add > sizeof fake->held - len - 1)
            add = sizeof fake->held - len - 1;
        memmove (fake->held + len, text, add); //  text may be part of held
        fake->held[len + add] = 0;
        return;
    }
    ssize_t n = send (fake->conn, text, strlen (text), MSG_NOSIGNAL);
    assert (n == (ssize_t) strlen (text));
}

static int s_fake_later (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    s_fake_t *fake = (s_fake_t *) arg;
    //  The second half of a reply split across two writes.
    char text[64];
    snprintf (text, sizeof text, "\"status\":\"running\"},\"id\":%d}\r\n", fake->split_id);
    fake->splitting = false;
    s_fake_send (fake, text);
    s_fake_send (fake, fake->held);
    return 0;
}

//  Answers by command: the test's script lives here.
static void s_fake_command (s_fake_t *fake, json_t *msg)
{
    const char *cmd = json_string_value (json_object_get (msg, "execute"));
    json_int_t id = json_integer_value (json_object_get (msg, "id"));
    char reply[512];
    assert (cmd);
    if (streq (cmd, "qmp_capabilities")) {
        snprintf (reply, sizeof reply, "{\"return\": {}, \"id\": %" JSON_INTEGER_FORMAT "}\r\n",
                  id);
        s_fake_send (fake, reply);
    } else if (streq (cmd, "query-status")) {
        fake->split_id = (int) id;
        //  Garbage and events first, then the reply in two writes.
        s_fake_send (fake, "this is not json\r\n");
        s_fake_send (fake, "[1,2,3]\r\n{\"foo\": 1}\r\n{\"return\": {}, \"id\": 999}\r\n");
        s_fake_send (fake, "{\"return\": {}, \"id\": \"2\"}\r\n{\"event\": 7}\r\n\r\n");
        s_fake_send (fake, "{\"event\": \"STOP\", \"data\": {}, \"timestamp\": {}}\r\n");
        s_fake_send (fake, "{\"event\": \"RESUME\"}\n{\"return\": {\"running\": true, ");
        fake->splitting = true;
        zloop_timer (fake->loop, 20, 1, s_fake_later, fake);
    } else if (streq (cmd, "stop")) {
        snprintf (reply, sizeof reply,
                  "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}, \"id\": "
                  "%" JSON_INTEGER_FORMAT "}\r\n",
                  id);
        s_fake_send (fake, reply);
    } else if (streq (cmd, "cont")) {
        snprintf (reply, sizeof reply, "{\"id\": %" JSON_INTEGER_FORMAT "}\r\n", id);
        s_fake_send (fake, reply); //  neither return nor error
    } else if (streq (cmd, "human-monitor-command")) {
        const char *line = json_string_value (
            json_object_get (json_object_get (msg, "arguments"), "command-line"));
        assert (line);
        bool good = streq (line, "hostfwd_add n0 tcp:127.0.0.1:4000-:8000");
        snprintf (reply, sizeof reply, "{\"return\": \"%s\", \"id\": %" JSON_INTEGER_FORMAT "}\r\n",
                  good ? "" : "Could not set up host forwarding rule\\r\\n", id);
        s_fake_send (fake, reply);
    } else if (streq (cmd, "getfd")) {
        fake->seen_fd = fake->recv_fd;
        fake->recv_fd = -1;
        snprintf (reply, sizeof reply, "{\"return\": {}, \"id\": %" JSON_INTEGER_FORMAT "}\r\n",
                  id);
        s_fake_send (fake, reply);
    } else if (streq (cmd, "migrate")) {
        assert (
            streq (json_string_value (json_object_get (json_object_get (msg, "arguments"), "uri")),
                   "fd:" S_MIGRATION_FD));
        snprintf (reply, sizeof reply, "{\"return\": {}, \"id\": %" JSON_INTEGER_FORMAT "}\r\n",
                  id);
        s_fake_send (fake, reply);
    } else if (streq (cmd, "query-migrate")) {
        //  Never answered: times out.
    } else if (streq (cmd, "quit")) {
        //  A line far over the limit, in pieces: the connection must be reset.
        char big[1024];
        memset (big, 'x', sizeof big);
        big[sizeof big - 1] = 0;
        for (int i = 0; i < 80; i++)
            s_fake_send (fake, big);
    }
}

static int s_fake_on_conn (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop, (void) item;
    s_fake_t *fake = (s_fake_t *) arg;
    char data[4096];
    struct iovec iov = {data, sizeof data};
    union {
        char buf[CMSG_SPACE (sizeof (int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t n = recvmsg (fake->conn, &msg, 0);
    if (n <= 0) {
        zmq_pollitem_t conn_item = {NULL, fake->conn, ZMQ_POLLIN, 0};
        zloop_poller_end (loop, &conn_item);
        return 0;
    }
    struct cmsghdr *cmsg = CMSG_FIRSTHDR (&msg);
    if (cmsg && cmsg->cmsg_type == SCM_RIGHTS)
        memcpy (&fake->recv_fd, CMSG_DATA (cmsg), sizeof (int));
    assert ((size_t) n + fake->len < sizeof fake->buf);
    memcpy (fake->buf + fake->len, data, (size_t) n);
    fake->len += (size_t) n;
    char *nl;
    while ((nl = (char *) memchr (fake->buf, '\n', fake->len))) {
        size_t line = (size_t) (nl - fake->buf) + 1;
        json_t *json = json_loadb (fake->buf, line, 0, NULL);
        assert (json);
        s_fake_command (fake, json);
        json_decref (json);
        memmove (fake->buf, fake->buf + line, fake->len - line);
        fake->len -= line;
    }
    return 0;
}

static int s_fake_on_accept (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) item;
    s_fake_t *fake = (s_fake_t *) arg;
    fake->conn = accept4 (fake->listener, NULL, NULL, SOCK_CLOEXEC);
    assert (fake->conn >= 0);
    s_fake_send (fake, "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n");
    zmq_pollitem_t conn_item = {NULL, fake->conn, ZMQ_POLLIN, 0};
    zloop_poller (loop, &conn_item, s_fake_on_conn, fake);
    return 0;
}

static const char *s_test_path;

//  The socket appears only after the client started trying: connect must retry.
static int s_fake_listen (zloop_t *loop, int timer_id, void *arg)
{
    (void) timer_id;
    s_fake_t *fake = (s_fake_t *) arg;
    fake->listener = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy (addr.sun_path, s_test_path);
    int rc = bind (fake->listener, (struct sockaddr *) &addr, sizeof addr);
    assert (rc == 0);
    rc = listen (fake->listener, 4);
    assert (rc == 0);
    zmq_pollitem_t item = {NULL, fake->listener, ZMQ_POLLIN, 0};
    zloop_poller (loop, &item, s_fake_on_accept, fake);
    return 0;
}

static void s_test_reply (vmd_qmp_t *self, json_t *result, const char *error, void *arg)
{
    (void) self;
    s_fake_t *fake = (s_fake_t *) arg;
    if (!error)
        fake->replies_ok++;
    else if (streq (error, "timeout"))
        fake->timeouts++;
    else if (strncmp (error, "connection closed", 17) == 0)
        fake->closed_fails++;
    else {
        fake->replies_err++;
        snprintf (fake->hmp_error, sizeof fake->hmp_error, "%s", error);
    }
    if (!error && json_is_object (result) && json_object_get (result, "status"))
        assert (streq (json_string_value (json_object_get (result, "status")), "running"));
}

static void s_test_event (vmd_qmp_t *self, const char *event, json_t *data, void *arg)
{
    (void) self, (void) data;
    s_fake_t *fake = (s_fake_t *) arg;
    assert (streq (event, "STOP") || streq (event, "RESUME"));
    fake->events++;
}

static void s_test_ready (vmd_qmp_t *self, void *arg)
{
    (void) self;
    ((s_fake_t *) arg)->ready++;
}

static void s_test_closed (vmd_qmp_t *self, const char *reason, void *arg)
{
    (void) self;
    s_fake_t *fake = (s_fake_t *) arg;
    fake->closed++;
    snprintf (fake->last_closed, sizeof fake->last_closed, "%s", reason);
    if (fake->destroy_on_close)
        vmd_qmp_destroy (&fake->qmp);
}

//  Ends zloop_start once *watch reaches until, or after 5 s.
typedef struct {
    int *watch;
    int until;
    int64_t deadline;
} s_until_t;

static int s_test_check (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    s_until_t *until = (s_until_t *) arg;
    return *until->watch >= until->until || zclock_mono () > until->deadline ? -1 : 0;
}

static void s_run_until (zloop_t *loop, int *watch, int value)
{
    s_until_t until = {watch, value, zclock_mono () + 5000};
    int timer = zloop_timer (loop, 10, 0, s_test_check, &until);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
}

void vmd_qmp_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/vmd_qmp_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[256];
    snprintf (path, sizeof path, "%s/qmp.sock", dir);
    s_test_path = path;

    zloop_t *loop = zloop_new ();
    s_fake_t fake = {.listener = -1, .conn = -1, .seen_fd = -1, .recv_fd = -1, .loop = loop};

    //  Bad arguments.
    assert (vmd_qmp_new (NULL, path) == NULL);
    char long_path[200];
    memset (long_path, 'a', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = 0;
    assert (vmd_qmp_new (loop, long_path) == NULL);

    vmd_qmp_t *qmp = vmd_qmp_new (loop, path);
    assert (qmp);
    vmd_qmp_set_handlers (qmp, s_test_ready, s_test_event, s_test_closed, &fake);
    vmd_qmp_set_timeout (qmp, 300);
    vmd_qmp_set_max_line (qmp, 16 * 1024);
    assert (!vmd_qmp_ready (qmp));
    zloop_timer (loop, 150, 1, s_fake_listen, &fake);

    //  Queued before ready, sent after.
    assert (vmd_qmp_query_status (qmp, s_test_reply, &fake) == 0); //  id 2: garbage + split
    assert (vmd_qmp_stop (qmp, s_test_reply, &fake) == 0);         //  QMP error
    assert (vmd_qmp_cont (qmp, s_test_reply, &fake) == 0);         //  malformed reply
    assert (vmd_qmp_hostfwd_add (qmp, "n0", "127.0.0.1", 4000, 8000, s_test_reply, &fake) == 0);
    assert (vmd_qmp_hostfwd_add (qmp, "n0", "127.0.0.1", 4001, 8000, s_test_reply, &fake) == 0);
    assert (vmd_qmp_hostfwd_add (qmp, "n0", "1.2.3.4 x", 4001, 8000, s_test_reply, &fake) == -1);
    int pipefd[2];
    assert (pipe (pipefd) == 0);
    assert (vmd_qmp_migrate_to_fd (qmp, pipefd[1], s_test_reply, &fake) == 0);
    assert (vmd_qmp_query_migrate (qmp, s_test_reply, &fake) == 0); //  never answered
    s_run_until (loop, &fake.timeouts, 1);
    if (verbose)
        fprintf (stderr, "ok=%d err=%d timeouts=%d events=%d\n", fake.replies_ok, fake.replies_err,
                 fake.timeouts, fake.events);
    assert (fake.ready == 1);
    assert (vmd_qmp_ready (qmp));
    assert (fake.events == 2);
    assert (fake.replies_ok == 3);  //  query-status, hostfwd 4000, migrate (after getfd)
    assert (fake.replies_err == 3); //  stop, cont, hostfwd 4001
    assert (streq (fake.hmp_error, "Could not set up host forwarding rule"));
    assert (fake.timeouts == 1);
    assert (fake.seen_fd >= 0);
    //  The fd passed is the pipe: writing into it reaches our read end.
    assert (write (fake.seen_fd, "m", 1) == 1);
    char c;
    assert (read (pipefd[0], &c, 1) == 1 && c == 'm');
    close (fake.seen_fd);
    close (pipefd[0]);
    close (pipefd[1]);

    //  A huge line resets the connection and fails what was pending.
    assert (vmd_qmp_quit (qmp, s_test_reply, &fake) == 0);
    s_run_until (loop, &fake.closed, 1);
    assert (fake.closed == 1);
    assert (streq (fake.last_closed, "line over the size limit"));
    assert (fake.closed_fails == 1);
    assert (vmd_qmp_closed (qmp));
    assert (vmd_qmp_stop (qmp, s_test_reply, &fake) == -1);
    vmd_qmp_destroy (&qmp);
    vmd_qmp_destroy (&qmp);
    assert (qmp == NULL);

    //  Nothing listening: the connect deadline closes it, and the closed callback
    //  destroys it (ASan checks nothing touches it afterwards).
    unlink (path);
    fake.qmp = vmd_qmp_new (loop, path);
    fake.destroy_on_close = true;
    vmd_qmp_set_handlers (fake.qmp, s_test_ready, s_test_event, s_test_closed, &fake);
    vmd_qmp_set_connect_timeout (fake.qmp, 200);
    assert (vmd_qmp_execute (fake.qmp, "query-status", NULL, s_test_reply, &fake) == 0);
    assert (vmd_qmp_migrate_to_fd (fake.qmp, 0, s_test_reply, &fake) == 0);
    s_run_until (loop, &fake.closed, 2);
    assert (fake.closed == 2);
    assert (streq (fake.last_closed, "cannot connect"));
    assert (fake.closed_fails == 3);
    assert (fake.qmp == NULL);

    if (fake.conn >= 0)
        close (fake.conn);
    if (fake.listener >= 0)
        close (fake.listener);
    zloop_destroy (&loop);
    unlink (path);
    rmdir (dir);
}
