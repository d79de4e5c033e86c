/*  vmd_guest - see vmd_guest.h

    Everything here runs from vmd's loop and never waits: QEMU's exit is seen by a tick
    (waitpid WNOHANG for our children, kill (pid, 0) for adopted ones) and by its QMP
    connection closing; the migration of a stop is polled from the tick; timers carry
    every deadline. The only blocking calls are the ~20 ms qemu-img of a create and the
    fsync of a saved memory state.
*/
#include "vmd_guest.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "vmd_qemu.h"
#include "vmd_qmp.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_TICK_MS       25     //  exit checks, migration polls, deadlines
#define S_KILL_GRACE_MS 2000   //  after QMP quit, before SIGKILL
#define S_DEFAULT_OP_MS 120000 //  an operation without its own deadline
#define S_SETUP_MS      10000  //  agent.setup's answer
#define S_MAX_BANDWIDTH (8LL << 30)
#define S_ENTROPY_BYTES 64 //  fresh host randomness with every agent.setup

typedef enum {
    EV_CREATE,      //  vm.create: QEMU spawned
    EV_STOP,        //  vm.stop
    EV_RESUME,      //  vm.resume
    EV_DELETE,      //  vm.delete
    EV_AGENT_READY, //  the agent said hello and took agent.setup
    EV_SAVED,       //  memory state saved and QEMU gone
    EV_GONE,        //  QEMU gone and the directory removed
    EV_FAIL,        //  the operation failed or passed its deadline
    EV_DIED,        //  QEMU or the agent went away on its own
} s_event_t;

static const char *s_event_names[] = {"create", "stop", "resume", "delete", "agent ready",
                                      "saved",  "gone", "fail",   "died"};

typedef void (s_action_fn) (vmd_guest_t *self);
static s_action_fn s_start_create, s_start_stop, s_start_resume, s_start_delete, s_op_ok,
    s_op_failed, s_died, s_cleanup;

typedef struct {
    sbx_sandbox_state_t from;
    s_event_t event;
    sbx_sandbox_state_t to;
    s_action_fn *action; //  run after the state changed
} s_transition_t;

#define S_CREATING SBX_SANDBOX_STATE_CREATING
#define S_READY    SBX_SANDBOX_STATE_READY
#define S_STOPPING SBX_SANDBOX_STATE_STOPPING
#define S_STOPPED  SBX_SANDBOX_STATE_STOPPED
#define S_RESUMING SBX_SANDBOX_STATE_RESUMING
#define S_DELETING SBX_SANDBOX_STATE_DELETING
#define S_DELETED  SBX_SANDBOX_STATE_DELETED
#define S_ERROR    SBX_SANDBOX_STATE_ERROR

//  The lifecycle. An event missing here is ignored (logged) or, for a request,
//  refused with failed_precondition. A failed create is cleaned up like a delete.
// clang-format off
static const s_transition_t s_table[] = {
    {S_CREATING, EV_CREATE,      S_CREATING, s_start_create},
    {S_CREATING, EV_AGENT_READY, S_READY,    s_op_ok},
    {S_CREATING, EV_FAIL,        S_DELETING, s_start_delete},
    {S_CREATING, EV_DIED,        S_DELETING, s_start_delete},
    {S_CREATING, EV_DELETE,      S_DELETING, s_start_delete},
    {S_READY,    EV_STOP,        S_STOPPING, s_start_stop},
    {S_READY,    EV_DELETE,      S_DELETING, s_start_delete},
    {S_READY,    EV_DIED,        S_ERROR,    s_died},
    {S_STOPPING, EV_SAVED,       S_STOPPED,  s_op_ok},
    {S_STOPPING, EV_FAIL,        S_ERROR,    s_op_failed},
    {S_STOPPING, EV_DIED,        S_ERROR,    s_op_failed},
    {S_STOPPING, EV_DELETE,      S_DELETING, s_start_delete},
    {S_STOPPED,  EV_RESUME,      S_RESUMING, s_start_resume},
    {S_STOPPED,  EV_DELETE,      S_DELETING, s_start_delete},
    {S_RESUMING, EV_AGENT_READY, S_READY,    s_op_ok},
    {S_RESUMING, EV_FAIL,        S_ERROR,    s_op_failed},
    {S_RESUMING, EV_DIED,        S_ERROR,    s_op_failed},
    {S_RESUMING, EV_DELETE,      S_DELETING, s_start_delete},
    {S_ERROR,    EV_DELETE,      S_DELETING, s_start_delete},
    {S_ERROR,    EV_DIED,        S_ERROR,    NULL},
    {S_DELETING, EV_GONE,        S_DELETED,  s_cleanup},
};
// clang-format on

struct _vmd_guest_t {
    const vmd_guest_env_t *env;
    char *id;
    char *hostname;
    char *dir;
    char *image_dir; //  the base this guest's overlay names
    sbx_sandbox_type_t type;
    bool no_network;
    sbx_sandbox_state_t state;
    char *reason; //  why in error
    pid_t pid;    //  QEMU, 0 when none
    bool is_child;
    int exit_status; //  of our child, when reaped; -1 unknown
    vmd_qmp_t *qmp;
    vmd_agentlink_t *link;
    bool close_qmp, close_link; //  destroyed by the next tick (never inside their callbacks)
    int tick;
    //  The operation in progress: its request, deadline and outcome.
    bool op;
    uint64_t op_rid;
    uint64_t op_deadline;
    uint32_t op_timeout;
    sbx_code_t op_code;
    char op_message[1024];
    uint64_t op_started; //  mono ms, for the log
    //  Stop: the state file being written, the migration's progress.
    int state_fd;
    bool migrating, query_pending, quit_sent;
    //  Resume: waiting for QEMU to leave inmigrate.
    bool incoming, status_pending;
    uint64_t restore_deadline; //  a restore must be answered by then (mono ms), 0: none
    uint64_t kill_at;          //  delete: SIGKILL QEMU after this (mono ms)
    bool setup_pending;
    char qmp_lost[300]; //  QMP closed on its own: why, and when (mono ms)
    uint64_t qmp_lost_at;
    //  Re-adopted ready: make sure it runs (a snapshot may have been cut mid-way).
    bool unpause, unpause_pending;
    //  Made from a snapshot: its directory, and whether its memory is restored.
    char *origin_dir;
    bool origin_restore;
    //  A snapshot being taken (vm.snapshot).
    struct {
        bool active;
        sbx_sandbox_state_t from; //  ready (QEMU paused meanwhile) or stopped
        bool paused, migrating, query_pending;
        char *dir;
        int fd;       //  memory.state.tmp while QEMU writes it
        pid_t helper; //  the child that copies and fsyncs
        uint64_t deadline;
        vmd_guest_snapshot_fn *fn;
        void *arg;
        uint64_t disk_bytes, memory_bytes;
        //  A stop or resume that came meanwhile: it starts when the capture ended.
        bool deferred;
        s_event_t deferred_event;
        uint64_t deferred_rid;
        uint32_t deferred_timeout;
        //  Another snapshot asked for meanwhile (a user's after a stop's automatic one).
        char *next_dir;
        uint32_t next_timeout;
        vmd_guest_snapshot_fn *next_fn;
        void *next_arg;
    } snap;
    //  Port forwards: guest port → host port on VMD_GUEST_FWD_HOST.
    struct {
        int port, host_port;
    } fwd[VMD_GUEST_MAX_FWD];
    size_t fwd_count;
};

static void s_fire (vmd_guest_t *self, s_event_t event, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 4, 5)));
static void s_snap_fail (vmd_guest_t *self, sbx_code_t code, const char *message);
static void s_snap_deferred (vmd_guest_t *self, bool drop);

//  --------------------------------------------------------------------------
//  Files

static char *s_path (vmd_guest_t *self, const char *name)
{
    return zsys_sprintf ("%s/%s", self->dir, name);
}

//  guest.json, atomically: a crash leaves the old or the new file, never half of one.
static void s_save (vmd_guest_t *self)
{
    if (self->state == S_DELETED)
        return;
    json_t *root = json_pack ("{s:s, s:s, s:s, s:b, s:s, s:s}", "sandbox_id", self->id, "hostname",
                              self->hostname, "type", sbx_sandbox_type_name (self->type),
                              "no_network", self->no_network, "state",
                              sbx_sandbox_state_name (self->state), "image", self->image_dir);
    if (root && self->reason)
        json_object_set_new (root, "reason", json_string (self->reason));
    json_t *forwards = json_array ();
    for (size_t i = 0; forwards && i < self->fwd_count; i++)
        json_array_append_new (forwards, json_pack ("{s:i, s:i}", "port", self->fwd[i].port,
                                                    "host_port", self->fwd[i].host_port));
    if (root && forwards && self->fwd_count)
        json_object_set (root, "forwards", forwards);
    json_decref (forwards);
    char *text = root ? json_dumps (root, JSON_INDENT (2)) : NULL;
    json_decref (root);
    char *tmp = s_path (self, "guest.json.tmp"), *path = s_path (self, "guest.json");
    int fd = text && tmp ? open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    bool ok = fd >= 0;
    if (ok) {
        size_t size = strlen (text);
        ok =
            write (fd, text, size) == (ssize_t) size && write (fd, "\n", 1) == 1 && fsync (fd) == 0;
        ok = close (fd) == 0 && ok;
        ok = ok && rename (tmp, path) == 0;
        int dir = open (self->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0) {
            fsync (dir);
            close (dir);
        }
    }
    if (!ok)
        sbx_error ("sandbox=%s cannot write %s: %s", self->id, path ? path : "guest.json",
                   strerror (errno));
    free (text);
    free (tmp);
    free (path);
}

//  Removes a directory tree (no symlinks followed). Returns 0, or -1.
static int s_remove_tree (const char *path)
{
    DIR *dir = opendir (path);
    if (!dir)
        return errno == ENOENT ? 0 : -1;
    struct dirent *entry;
    int rc = 0;
    while ((entry = readdir (dir))) {
        if (streq (entry->d_name, ".") || streq (entry->d_name, ".."))
            continue;
        char *child = zsys_sprintf ("%s/%s", path, entry->d_name);
        struct stat st;
        if (!child || lstat (child, &st) == -1)
            rc = -1;
        else if (S_ISDIR (st.st_mode))
            rc |= s_remove_tree (child);
        else if (unlink (child) == -1)
            rc = -1;
        free (child);
    }
    closedir (dir);
    if (rmdir (path) == -1)
        rc = -1;
    return rc;
}

//  The last `lines` lines of a log of the guest's, one line, for error messages.
static void s_tail (vmd_guest_t *self, const char *name, int lines, char *out, size_t size)
{
    out[0] = 0;
    char *path = s_path (self, name);
    int fd = path ? open (path, O_RDONLY | O_CLOEXEC) : -1;
    free (path);
    if (fd < 0)
        return;
    char buf[2048];
    off_t end = lseek (fd, 0, SEEK_END);
    off_t from = end > (off_t) sizeof buf - 1 ? end - (off_t) sizeof buf + 1 : 0;
    ssize_t got = pread (fd, buf, sizeof buf - 1, from);
    close (fd);
    if (got <= 0)
        return;
    buf[got] = 0;
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r'))
        buf[--got] = 0;
    char *start = buf + got;
    for (int seen = 0; start > buf; start--)
        if (start[-1] == '\n' && ++seen == lines)
            break;
    size_t at = 0;
    for (char *c = start; *c && at + 4 < size; c++) {
        unsigned char ch = (unsigned char) *c;
        if (ch == '\n')
            out[at++] = '|', out[at++] = ' ';
        else if (ch >= 0x20 && ch < 0x7f)
            out[at++] = (char) ch;
    }
    out[at] = 0;
}

//  "QEMU exited (status 1); qemu.log: ...; console: ..."
static void s_death_note (vmd_guest_t *self, const char *what, char *out, size_t size)
{
    char qemu[300], console[300];
    s_tail (self, "qemu.log", 3, qemu, sizeof qemu);
    s_tail (self, "console.log", 4, console, sizeof console);
    snprintf (out, size, "%s%s%s%s%s", what, *qemu ? "; qemu.log: " : "", qemu,
              *console ? "; console: " : "", console);
}

//  --------------------------------------------------------------------------
//  The state machine

static void s_fire (vmd_guest_t *self, s_event_t event, sbx_code_t code, const char *format, ...)
{
    const s_transition_t *t = NULL;
    for (size_t i = 0; i < sizeof s_table / sizeof s_table[0] && !t; i++)
        if (s_table[i].from == self->state && s_table[i].event == event)
            t = &s_table[i];
    char message[1024] = "";
    if (format) {
        va_list args;
        va_start (args, format);
        vsnprintf (message, sizeof message, format, args);
        va_end (args);
    }
    if (!t) {
        sbx_debug ("sandbox=%s %s ignored in state %s%s%s", self->id, s_event_names[event],
                   sbx_sandbox_state_name (self->state), *message ? ": " : "", message);
        return;
    }
    if (code != SBX_OK && self->op && self->op_code == SBX_OK) {
        //  The first failure is the one the requester hears about.
        self->op_code = code;
        snprintf (self->op_message, sizeof self->op_message, "%s", message);
    }
    if ((event == EV_DIED || event == EV_FAIL) && *message) {
        free (self->reason);
        self->reason = strdup (message);
    }
    sbx_info ("sandbox=%s rid=%llu %s -> %s on %s%s%s", self->id, (unsigned long long) self->op_rid,
              sbx_sandbox_state_name (self->state), sbx_sandbox_state_name (t->to),
              s_event_names[event], *message ? ": " : "", message);
    self->state = t->to;
    if (self->state != S_CREATING && self->state != S_RESUMING)
        self->restore_deadline = 0; //  the restore ended (ready, or failed)
    if (self->state != S_ERROR) {
        free (self->reason);
        self->reason = NULL;
    }
    s_save (self);
    if (t->action)
        t->action (self);
}

//  Answers the operation in progress, once.
static void s_op_end (vmd_guest_t *self, sbx_code_t code, const char *message)
{
    if (!self->op)
        return;
    self->op = false;
    sbx_info ("sandbox=%s rid=%llu %s after %.2f s%s%s", self->id,
              (unsigned long long) self->op_rid, code == SBX_OK ? "done" : "failed",
              (sbx_clock_mono_ms () - self->op_started) / 1000.0, message ? ": " : "",
              message ? message : "");
    if (self->env->done)
        self->env->done (self, self->op_rid, code, message, self->env->arg);
}

static void s_op_begin (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms)
{
    if (self->op)
        s_op_end (self, SBX_E_FAILED_PRECONDITION, "superseded by a later request");
    self->op = true;
    self->op_rid = rid;
    self->op_timeout = timeout_ms ? timeout_ms : S_DEFAULT_OP_MS;
    self->op_started = sbx_clock_mono_ms ();
    self->op_deadline = self->op_started + self->op_timeout;
    self->op_code = SBX_OK;
    self->op_message[0] = 0;
}

static void s_op_ok (vmd_guest_t *self)
{
    if (self->state == S_READY) {
        //  Resumed: the memory lives in QEMU again; the file is only kept while stopped.
        char *path = s_path (self, "memory.state");
        if (path)
            unlink (path);
        free (path);
    }
    s_op_end (self, SBX_OK, NULL);
}

static void s_op_failed (vmd_guest_t *self)
{
    //  Nothing of QEMU should linger for a guest in error but what delete removes.
    if (self->pid > 0 && self->is_child)
        kill (self->pid, SIGKILL);
    if (self->op)
        s_op_end (self, self->op_code != SBX_OK ? self->op_code : SBX_E_INTERNAL, self->op_message);
    else if (self->env->failed)
        self->env->failed (self, self->reason ? self->reason : "failed", self->env->arg);
}

static void s_died (vmd_guest_t *self)
{
    self->close_link = true;
    if (self->env->failed)
        self->env->failed (self, self->reason ? self->reason : "the guest died", self->env->arg);
}

//  --------------------------------------------------------------------------
//  QMP and agent events

static void s_on_qmp_closed (vmd_qmp_t *qmp, const char *reason, void *arg)
{
    (void) qmp;
    vmd_guest_t *self = arg;
    self->close_qmp = true;
    if (self->quit_sent || self->state == S_DELETING || self->state == S_DELETED)
        return; //  we asked for it
    //  Usually QEMU is exiting: give the tick a moment to see how, for the reason.
    snprintf (self->qmp_lost, sizeof self->qmp_lost, "QEMU's monitor connection closed (%s)",
              reason);
    self->qmp_lost_at = sbx_clock_mono_ms ();
}

static void s_on_qmp_event (vmd_qmp_t *qmp, const char *event, json_t *data, void *arg)
{
    (void) qmp;
    (void) data;
    vmd_guest_t *self = arg;
    sbx_debug ("sandbox=%s QMP event %s", self->id, event);
}

static void s_on_setup (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    sbx_msg_t *reply = *reply_p;
    self->setup_pending = false;
    if (reply->type == SBX_MSG_AGENT_SETUP_OK) {
        sbx_debug ("sandbox=%s agent.setup: clock moved %lld ms", self->id,
                   (long long) sbx_msg_agent_setup_ok (reply)->clock_adjust_ms);
        s_fire (self, EV_AGENT_READY, SBX_OK, NULL);
    } else if (reply->type == SBX_MSG_ERROR && self->state != S_READY)
        //  The connection broke mid-setup: the next hello sends it again.
        sbx_warn ("sandbox=%s agent.setup failed: %s", self->id, sbx_msg_error (reply)->message);
}

static void s_send_setup (vmd_guest_t *self)
{
    sbx_msg_t *setup = self->link ? sbx_msg_new (SBX_MSG_AGENT_SETUP) : NULL;
    if (!setup)
        return;
    sbx_agent_setup_t *body = sbx_msg_agent_setup (setup);
    sbx_str_set (&body->hostname, self->hostname);
    body->time_ms = sbx_clock_now_ms (); //  the clock stood still while stopped
    body->no_network = self->no_network;
    //  Fresh randomness every time: a guest restored from a snapshot (or resumed) must
    //  not go on from the random state its siblings share.
    uint8_t entropy[S_ENTROPY_BYTES];
    if (getrandom (entropy, sizeof entropy, 0) == (ssize_t) sizeof entropy)
        sbx_bytes_set (&body->entropy, entropy, sizeof entropy);
    self->setup_pending = true;
    vmd_agentlink_request (self->link, &setup, S_SETUP_MS, s_on_setup, self);
}

//  --------------------------------------------------------------------------
//  Port forwards

//  A free TCP port on the forwards' address, or 0. QEMU binds it a moment later; the
//  rare loser of that race gets an error from hostfwd_add and the caller retries.
static int s_free_port (void)
{
    int fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    socklen_t size = sizeof addr;
    int port = 0;
    if (bind (fd, (struct sockaddr *) &addr, sizeof addr) == 0 &&
        getsockname (fd, (struct sockaddr *) &addr, &size) == 0)
        port = ntohs (addr.sin_port);
    close (fd);
    return port;
}

static int s_fwd_find (vmd_guest_t *self, int port)
{
    for (size_t i = 0; i < self->fwd_count; i++)
        if (self->fwd[i].port == port)
            return (int) i;
    return -1;
}

static void s_fwd_drop (vmd_guest_t *self, int port)
{
    int i = s_fwd_find (self, port);
    if (i < 0)
        return;
    self->fwd[i] = self->fwd[--self->fwd_count];
}

//  One hostfwd request in flight.
typedef struct {
    vmd_guest_t *guest;
    int port, host_port;
    int tries;
    vmd_guest_port_fn *fn; //  NULL: a renewal nobody waits for
    void *arg;
} s_fwd_op_t;

static void s_on_fwd_added (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) result;
    s_fwd_op_t *op = arg;
    vmd_guest_t *self = op->guest;
    int i = s_fwd_find (self, op->port);
    if (!error) {
        sbx_info ("sandbox=%s port %d forwarded from %s:%d", self->id, op->port, VMD_GUEST_FWD_HOST,
                  op->host_port);
        if (op->fn)
            op->fn (self, SBX_OK, NULL, op->host_port, op->arg);
        free (op);
        return;
    }
    //  Lost the race for the host port (or it was taken while stopped): another one.
    int next = op->tries < 3 && i >= 0 && !vmd_qmp_closed (qmp) ? s_free_port () : 0;
    if (next && vmd_qmp_hostfwd_add (qmp, "n0", VMD_GUEST_FWD_HOST, next, op->port, s_on_fwd_added,
                                     op) == 0) {
        sbx_warn ("sandbox=%s port %d: host port %d refused (%s); trying %d", self->id, op->port,
                  op->host_port, error, next);
        op->tries++;
        op->host_port = self->fwd[i].host_port = next;
        s_save (self);
        return;
    }
    sbx_error ("sandbox=%s cannot forward port %d: %s", self->id, op->port, error);
    if (op->fn) {
        //  A new forward that failed is forgotten; a renewed one is kept for next time.
        s_fwd_drop (self, op->port);
        s_save (self);
        char message[600];
        snprintf (message, sizeof message, "cannot forward port %d of sandbox %s: %s", op->port,
                  self->id, error);
        op->fn (self, SBX_E_INTERNAL, message, 0, op->arg);
    }
    free (op);
}

static void s_on_fwd_removed (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    s_fwd_op_t *op = arg;
    if (error) //  QEMU had no such rule (e.g. it was never re-added): gone all the same
        sbx_warn ("sandbox=%s hostfwd_remove of port %d: %s", op->guest->id, op->port, error);
    if (op->fn)
        op->fn (op->guest, SBX_OK, NULL, 0, op->arg);
    free (op);
}

static int s_fwd_add (vmd_guest_t *self, int port, int host_port, vmd_guest_port_fn *fn, void *arg)
{
    s_fwd_op_t *op = calloc (1, sizeof *op);
    if (!op)
        return -1;
    *op = (s_fwd_op_t){self, port, host_port, 0, fn, arg};
    if (vmd_qmp_hostfwd_add (self->qmp, "n0", VMD_GUEST_FWD_HOST, host_port, port, s_on_fwd_added,
                             op) == 0)
        return 0;
    free (op);
    return -1;
}

//  Puts the recorded forwards into a (new or re-adopted) QEMU. A re-adopted one may
//  have them already, or not (vmd died between guest.json and QMP): remove, then add.
static void s_forwards_renew (vmd_guest_t *self, bool adopted)
{
    for (size_t i = 0; self->qmp && i < self->fwd_count; i++) {
        if (adopted)
            vmd_qmp_hostfwd_remove (self->qmp, "n0", VMD_GUEST_FWD_HOST, self->fwd[i].host_port,
                                    NULL, NULL);
        s_fwd_add (self, self->fwd[i].port, self->fwd[i].host_port, NULL, NULL);
    }
}

int vmd_guest_port (vmd_guest_t *self, int guest_port, bool remove, int *host_port,
                    vmd_guest_port_fn *fn, void *arg, sbx_err_t *err)
{
    *host_port = 0;
    if (guest_port < 1 || guest_port > 65535)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "port must be between 1 and 65535");
    int i = s_fwd_find (self, guest_port);
    bool running = self->state == S_READY && self->qmp && !vmd_qmp_closed (self->qmp);
    if (remove) {
        if (i < 0)
            return 1;
        int old = self->fwd[i].host_port;
        s_fwd_drop (self, guest_port);
        s_save (self);
        s_fwd_op_t *op = running ? calloc (1, sizeof *op) : NULL;
        if (!op)
            return 1; //  no QEMU (stopped): the forward is gone with it
        *op = (s_fwd_op_t){self, guest_port, old, 0, fn, arg};
        if (vmd_qmp_hostfwd_remove (self->qmp, "n0", VMD_GUEST_FWD_HOST, old, s_on_fwd_removed,
                                    op) == 0)
            return 0;
        free (op);
        return 1;
    }
    if (i >= 0) {
        *host_port = self->fwd[i].host_port;
        return 1;
    }
    if (!running)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s", self->id,
                            sbx_sandbox_state_name (self->state),
                            self->state == S_STOPPED ? "; resume it first" : "");
    if (self->fwd_count == VMD_GUEST_MAX_FWD)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "sandbox %s forwards %d ports already",
                            self->id, VMD_GUEST_MAX_FWD);
    int chosen = s_free_port ();
    if (!chosen)
        return sbx_err_set (err, SBX_E_UNAVAILABLE, "no free host port: %s", strerror (errno));
    self->fwd[self->fwd_count].port = guest_port;
    self->fwd[self->fwd_count++].host_port = chosen;
    s_save (self); //  first: a vmd that dies now re-adds it at re-adoption
    if (s_fwd_add (self, guest_port, chosen, fn, arg)) {
        s_fwd_drop (self, guest_port);
        s_save (self);
        return sbx_err_set (err, SBX_E_UNAVAILABLE, "sandbox %s: QEMU's monitor is gone", self->id);
    }
    return 0;
}

//  The agent is there (boot, resume, or reattach after a vmd restart): set it up.
static void s_on_hello (vmd_agentlink_t *link, sbx_agent_hello_t *hello, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    sbx_info ("sandbox=%s agent hello (uptime %.1f s, %llu processes)", self->id,
              hello->uptime_ms / 1000.0, (unsigned long long) hello->processes);
    if (self->state == S_CREATING || self->state == S_RESUMING)
        s_send_setup (self);
}

static void s_on_link_lost (vmd_agentlink_t *link, const char *reason, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    self->close_link = true;
    s_fire (self, self->state == S_CREATING ? EV_FAIL : EV_DIED, SBX_E_INTERNAL,
            "the guest agent is gone: %s", reason);
}

static int s_open_channels (vmd_guest_t *self)
{
    //  Leftovers of the previous QEMU (the tick had not dropped them yet).
    if (self->close_qmp)
        vmd_qmp_destroy (&self->qmp);
    if (self->close_link)
        vmd_agentlink_destroy (&self->link);
    char *qmp = s_path (self, "qmp.sock"), *agent = s_path (self, "agent.sock");
    if (qmp && !self->qmp)
        self->qmp = vmd_qmp_new (self->env->loop, qmp);
    if (agent && !self->link)
        self->link = vmd_agentlink_new (self->env->loop, agent, self->id);
    free (qmp);
    free (agent);
    if (!self->qmp || !self->link)
        return -1;
    self->close_qmp = self->close_link = false;
    vmd_qmp_set_handlers (self->qmp, NULL, s_on_qmp_event, s_on_qmp_closed, self);
    vmd_agentlink_set_handlers (self->link, s_on_hello, s_on_link_lost, self);
    vmd_agentlink_set_frame_timeout (self->link, self->env->frame_timeout_ms);
    return 0;
}

static int s_spawn (vmd_guest_t *self, int incoming_fd)
{
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.image_dir = self->image_dir;
    config.dir = self->dir;
    config.hostname = self->hostname;
    config.type = vmd_qemu_type (sbx_sandbox_type_name (self->type));
    config.no_network = self->no_network;
    config.incoming_fd = incoming_fd;
    config.user = self->env->qemu_user;
    self->quit_sent = self->migrating = self->query_pending = false;
    self->exit_status = -1;
    self->qmp_lost_at = 0;
    self->pid = vmd_qemu_spawn (&config);
    if (self->pid <= 0) {
        self->pid = 0;
        return -1;
    }
    self->is_child = true;
    sbx_info ("sandbox=%s QEMU pid %d", self->id, (int) self->pid);
    return s_open_channels (self);
}

//  --------------------------------------------------------------------------
//  Actions

static void s_start_create (vmd_guest_t *self)
{
    //  Nothing: vmd_guest_create did the work before firing (it can fail at once).
    (void) self;
}

static void s_on_migrate (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error)
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "could not save the guest's memory: %s", error);
    else
        self->migrating = true;
}

static void s_on_paused (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error)
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "could not pause the guest: %s", error);
}

//  Saves memory and devices into memory.state.tmp through an fd (QEMU's seccomp
//  forbids it to open or spawn anything), then quits; the tick sees QEMU go.
static void s_start_stop (vmd_guest_t *self)
{
    if (self->link) {
        vmd_agentlink_fail_all (self->link, "the sandbox is stopping");
        self->close_link = true;
    }
    char *tmp = s_path (self, "memory.state.tmp");
    self->state_fd = tmp ? open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    free (tmp);
    if (self->state_fd < 0 || !self->qmp || vmd_qmp_closed (self->qmp)) {
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "cannot save the guest: %s",
                self->state_fd < 0 ? strerror (errno) : "no QEMU monitor connection");
        return;
    }
    vmd_qmp_set_max_bandwidth (self->qmp, S_MAX_BANDWIDTH, NULL, NULL);
    vmd_qmp_stop (self->qmp, s_on_paused, self);
    vmd_qmp_migrate_to_fd (self->qmp, self->state_fd, s_on_migrate, self);
}

static void s_on_query_migrate (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    vmd_guest_t *self = arg;
    self->query_pending = false;
    if (self->state != S_STOPPING || !self->migrating)
        return;
    const char *status = error ? NULL : json_string_value (json_object_get (result, "status"));
    if (error || !status || streq (status, "failed") || streq (status, "cancelled")) {
        const char *why =
            error ? error : json_string_value (json_object_get (result, "error-desc"));
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "saving the guest's memory failed: %s",
                why      ? why
                : status ? status
                         : "no status");
        return;
    }
    if (!streq (status, "completed"))
        return;
    self->migrating = false;
    //  Durable before it gets its final name: a crash leaves no half state file.
    char *tmp = s_path (self, "memory.state.tmp"), *path = s_path (self, "memory.state");
    bool ok = fsync (self->state_fd) == 0;
    ok = close (self->state_fd) == 0 && ok;
    self->state_fd = -1;
    ok = ok && tmp && path && rename (tmp, path) == 0;
    free (tmp);
    free (path);
    if (!ok) {
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "cannot keep the memory state file: %s",
                strerror (errno));
        return;
    }
    int dir = open (self->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync (dir);
        close (dir);
    }
    self->quit_sent = true;
    self->kill_at = sbx_clock_mono_ms () + S_KILL_GRACE_MS;
    vmd_qmp_quit (qmp, NULL, NULL);
}

static void s_on_cont (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error)
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "could not continue the restored guest: %s", error);
    else
        //  The restored agent may never see the host leave and come back (the stop
        //  paused it first), so no hello is promised: ask it straight away. If it does
        //  reattach, it drops this and says hello, which sends another.
        s_send_setup (self);
}

static void s_on_query_status (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    vmd_guest_t *self = arg;
    self->status_pending = false;
    if ((self->state != S_RESUMING && self->state != S_CREATING) || !self->incoming)
        return;
    const char *status = error ? NULL : json_string_value (json_object_get (result, "status"));
    if (!status) {
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "could not restore the guest: %s",
                error ? error : "no status");
        return;
    }
    if (streq (status, "inmigrate"))
        return;
    self->incoming = false;
    //  Before cont (QMP answers in order): the ports answer once the guest runs.
    s_forwards_renew (self, false);
    if (streq (status, "paused") || streq (status, "prelaunch"))
        vmd_qmp_cont (qmp, s_on_cont, self);
    else if (!streq (status, "running"))
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "restoring the guest's memory ended in %s", status);
}

static uint32_t s_restore_ms (vmd_guest_t *self)
{
    return self->env->restore_ms ? self->env->restore_ms : VMD_GUEST_RESTORE_MS;
}

static void s_restore_begin (vmd_guest_t *self)
{
    self->restore_deadline = sbx_clock_mono_ms () + s_restore_ms (self);
}

//  QEMU started paused, loading memory.state on fd 3; the tick waits for it to
//  leave inmigrate, then continues it; the agent's hello gets its clock set.
static void s_start_resume (vmd_guest_t *self)
{
    char *path = s_path (self, "memory.state");
    int fd = path ? open (path, O_RDONLY | O_CLOEXEC) : -1;
    free (path);
    if (fd < 0) {
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "cannot open the memory state: %s",
                strerror (errno));
        return;
    }
    int rc = s_spawn (self, fd);
    close (fd);
    if (rc) {
        char note[900];
        s_death_note (self, "QEMU did not start", note, sizeof note);
        s_fire (self, EV_FAIL, SBX_E_INTERNAL, "%s", note);
        return;
    }
    self->incoming = true;
    s_restore_begin (self);
}

static void s_start_delete (vmd_guest_t *self)
{
    s_snap_deferred (self, true);
    if (self->snap.next_fn) {
        vmd_guest_snapshot_fn *next_fn = self->snap.next_fn;
        self->snap.next_fn = NULL;
        zstr_free (&self->snap.next_dir);
        next_fn (self, SBX_E_FAILED_PRECONDITION, "the sandbox is being deleted", 0, 0,
                 self->snap.next_arg);
    }
    self->snap.paused = false; //  QEMU goes: nothing to continue
    s_snap_fail (self, SBX_E_FAILED_PRECONDITION, "the sandbox is being deleted");
    if (self->link) {
        vmd_agentlink_fail_all (self->link, "the sandbox is being deleted");
        self->close_link = true;
    }
    if (self->state_fd >= 0) {
        close (self->state_fd);
        self->state_fd = -1;
    }
    self->migrating = self->incoming = false;
    //  A failed create ends at once; a delete lets QEMU quit first.
    bool failed_create = self->op && self->op_code != SBX_OK;
    if (self->pid > 0 && self->qmp && vmd_qmp_ready (self->qmp) && !failed_create) {
        self->quit_sent = true;
        vmd_qmp_quit (self->qmp, NULL, NULL);
        self->kill_at = sbx_clock_mono_ms () + S_KILL_GRACE_MS;
    } else
        self->kill_at = sbx_clock_mono_ms ();
    //  The tick removes the directory once QEMU is gone.
}

static void s_cleanup (vmd_guest_t *self)
{
    self->env->wake (self->env->arg); //  the server drops deleted guests
    if (self->op)
        s_op_end (self, self->op_code, self->op_code == SBX_OK ? NULL : self->op_message);
}

//  --------------------------------------------------------------------------
//  Snapshots: capture into snapshotd's directory while the guest stays this guest

static char *s_snap_path (vmd_guest_t *self, const char *name)
{
    return zsys_sprintf ("%s/%s", self->snap.dir, name);
}

static int s_request (vmd_guest_t *self, s_event_t event, uint64_t rid, uint32_t timeout_ms,
                      sbx_err_t *err);

//  Answers a stop or resume that waited for the capture: now started, or refused.
static void s_snap_deferred (vmd_guest_t *self, bool drop)
{
    if (!self->snap.deferred)
        return;
    self->snap.deferred = false;
    sbx_err_t err = {0};
    if (drop)
        sbx_err_set (&err, SBX_E_FAILED_PRECONDITION, "sandbox %s is being deleted", self->id);
    if (drop || s_request (self, self->snap.deferred_event, self->snap.deferred_rid,
                           self->snap.deferred_timeout, &err))
        if (self->env->done)
            self->env->done (self, self->snap.deferred_rid, err.code, err.message, self->env->arg);
}

static void s_snap_end (vmd_guest_t *self, sbx_code_t code, const char *message)
{
    if (!self->snap.active)
        return;
    self->snap.active = false;
    sbx_info ("sandbox=%s snapshot into %s %s%s%s", self->id, self->snap.dir,
              code == SBX_OK ? "done" : "failed", message ? ": " : "", message ? message : "");
    vmd_guest_snapshot_fn *fn = self->snap.fn;
    void *arg = self->snap.arg;
    uint64_t disk = self->snap.disk_bytes, memory = self->snap.memory_bytes;
    zstr_free (&self->snap.dir);
    if (fn)
        fn (self, code, message, disk, memory, arg);
    if (self->snap.next_fn) {
        //  The snapshot that waited goes first; a waiting stop or resume after it.
        char *dir = self->snap.next_dir;
        vmd_guest_snapshot_fn *next_fn = self->snap.next_fn;
        void *next_arg = self->snap.next_arg;
        self->snap.next_dir = NULL;
        self->snap.next_fn = NULL;
        sbx_err_t err = {0};
        if (vmd_guest_snapshot (self, dir, self->snap.next_timeout, next_fn, next_arg, &err))
            next_fn (self, err.code, err.message, 0, 0, next_arg);
        free (dir);
        if (self->snap.active)
            return;
    }
    if (self->state != S_DELETING && self->state != S_DELETED)
        s_snap_deferred (self, false);
}

static void s_snap_resumed (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error)
        sbx_error ("sandbox=%s cannot continue after the snapshot: %s", self->id, error);
    else
        s_send_setup (self); //  the guest's clock stood still while paused
}

//  Gives up: no partial file stays, a paused guest runs again.
static void s_snap_fail (vmd_guest_t *self, sbx_code_t code, const char *message)
{
    if (!self->snap.active)
        return;
    if (self->snap.fd >= 0)
        close (self->snap.fd);
    self->snap.fd = -1;
    if (self->snap.helper > 0) {
        kill (self->snap.helper, SIGKILL);
        waitpid (self->snap.helper, NULL, 0); //  killed: at once
        self->snap.helper = 0;
    }
    const char *names[] = {"disk.qcow2.tmp", "memory.state.tmp", "disk.qcow2", "memory.state"};
    for (int i = 0; i < 4; i++) {
        char *path = s_snap_path (self, names[i]);
        if (path)
            unlink (path);
        free (path);
    }
    if (self->snap.paused && self->state == S_READY && self->qmp && !vmd_qmp_closed (self->qmp))
        vmd_qmp_cont (self->qmp, s_snap_resumed, self);
    self->snap.paused = self->snap.migrating = false;
    s_snap_end (self, code, message);
}

static void s_snap_continued (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    s_snap_resumed (qmp, result, error, arg);
    vmd_guest_t *self = arg;
    if (error) {
        char message[600];
        snprintf (message, sizeof message,
                  "the snapshot is saved but the guest did not continue: "
                  "%s",
                  error);
        s_snap_end (self, SBX_E_INTERNAL, message);
    } else
        s_snap_end (self, SBX_OK, NULL);
}

//  The child copied and fsynced: final names, then the guest goes on.
static void s_snap_files_done (vmd_guest_t *self)
{
    const char *tmp[] = {"disk.qcow2.tmp", "memory.state.tmp"};
    const char *final[] = {"disk.qcow2", "memory.state"};
    uint64_t *sizes[] = {&self->snap.disk_bytes, &self->snap.memory_bytes};
    gid_t gid;
    bool share = vmd_qemu_group (self->env->qemu_user, &gid) == 0;
    for (int i = 0; i < 2; i++) {
        char *from = s_snap_path (self, tmp[i]), *to = s_snap_path (self, final[i]);
        struct stat st;
        //  Clones' QEMUs (their own user) read the disk as a backing file; nobody writes.
        bool ok = from && to && chmod (from, 0640) == 0 && (!share || chown (from, 0, gid) == 0) &&
                  stat (from, &st) == 0 && rename (from, to) == 0;
        *sizes[i] = ok ? (uint64_t) st.st_size : 0;
        free (from);
        free (to);
        if (!ok) {
            char message[300];
            snprintf (message, sizeof message, "cannot keep %s: %s", final[i], strerror (errno));
            s_snap_fail (self, SBX_E_INTERNAL, message);
            return;
        }
    }
    int dir = open (self->snap.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync (dir);
        close (dir);
    }
    if (self->snap.paused && self->qmp && !vmd_qmp_closed (self->qmp)) {
        self->snap.paused = false;
        if (vmd_qmp_cont (self->qmp, s_snap_continued, self) == 0)
            return;
    }
    s_snap_end (self, SBX_OK, NULL);
}

//  A child copies the overlay (and a stopped guest's memory state) and fsyncs the
//  copies: seconds for a large disk, which the loop must not spend.
static void s_snap_copy (vmd_guest_t *self)
{
    char *overlay = s_path (self, "overlay.qcow2"), *memory = s_path (self, "memory.state");
    char *disk_tmp = s_snap_path (self, "disk.qcow2.tmp");
    char *memory_tmp = s_snap_path (self, "memory.state.tmp");
    char *log = s_path (self, "qemu.log");
    char *running[] = {
        "sh",           "-c",    "cp --sparse=always -- \"$1\" \"$2\" && sync -- \"$2\" \"$3\"",
        "sbx-snapshot", overlay, disk_tmp,
        memory_tmp,     NULL};
    char *stopped[] = {"sh", "-c",
                       //  The memory state is never written in place (a stop renames a new
                       //  one over it): a hard link shares it with the sandbox.
                       "cp --sparse=always -- \"$1\" \"$2\" && { ln -f -- \"$3\" \"$4\" || "
                       "cp --sparse=always -- \"$3\" \"$4\"; } && sync -- \"$2\" \"$4\"",
                       "sbx-snapshot", overlay, disk_tmp, memory, memory_tmp, NULL};
    bool ok = overlay && memory && disk_tmp && memory_tmp && log;
    self->snap.helper =
        ok ? vmd_qemu_helper_spawn (self->snap.from == S_READY ? running : stopped, log) : -1;
    free (overlay);
    free (memory);
    free (disk_tmp);
    free (memory_tmp);
    free (log);
    if (self->snap.helper <= 0) {
        self->snap.helper = 0;
        s_snap_fail (self, SBX_E_INTERNAL, "cannot start the copy of the disk");
    }
}

static void s_on_snap_query (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    vmd_guest_t *self = arg;
    self->snap.query_pending = false;
    if (!self->snap.active || !self->snap.migrating)
        return;
    const char *status = error ? NULL : json_string_value (json_object_get (result, "status"));
    if (error || !status || streq (status, "failed") || streq (status, "cancelled")) {
        const char *why =
            error ? error : json_string_value (json_object_get (result, "error-desc"));
        char message[600];
        snprintf (message, sizeof message, "saving the guest's memory failed: %s",
                  why      ? why
                  : status ? status
                           : "no status");
        s_snap_fail (self, SBX_E_INTERNAL, message);
        return;
    }
    if (!streq (status, "completed"))
        return;
    //  QEMU stays, paused (its disk flushed by the stop and the migration's end).
    self->snap.migrating = false;
    close (self->snap.fd);
    self->snap.fd = -1;
    s_snap_copy (self);
}

static void s_on_snap_migrate (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (!self->snap.active)
        return;
    if (error) {
        char message[600];
        snprintf (message, sizeof message, "could not save the guest's memory: %s", error);
        s_snap_fail (self, SBX_E_INTERNAL, message);
    } else
        self->snap.migrating = true;
}

static void s_on_snap_paused (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error && self->snap.active) {
        char message[600];
        snprintf (message, sizeof message, "could not pause the guest: %s", error);
        s_snap_fail (self, SBX_E_INTERNAL, message);
    }
}

static void s_on_unpause_status (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    vmd_guest_t *self = arg;
    self->unpause_pending = false;
    if (error || self->state != S_READY) {
        self->unpause = false;
        return;
    }
    //  No status: no migration since QEMU started.
    const char *status = json_string_value (json_object_get (result, "status"));
    if (!status)
        status = "none";
    //  Still writing a snapshot nobody will take: stop that first, look again next tick.
    if (streq (status, "active") || streq (status, "setup") || streq (status, "device") ||
        streq (status, "pre-switchover")) {
        vmd_qmp_migrate_cancel (qmp, NULL, NULL);
        return;
    }
    if (streq (status, "cancelling"))
        return;
    self->unpause = false;
    //  Paused or after a completed migration: cont runs it (a running guest ignores it).
    sbx_info ("sandbox=%s re-adopted: continuing it (migration %s)", self->id, status);
    vmd_qmp_cont (qmp, s_snap_resumed, self);
}

//  From the tick: the migration's progress, the child's exit, the deadline.
static void s_snap_tick (vmd_guest_t *self, uint64_t now)
{
    if (self->unpause && !self->unpause_pending && self->qmp && vmd_qmp_ready (self->qmp)) {
        self->unpause_pending = true;
        vmd_qmp_query_migrate (self->qmp, s_on_unpause_status, self);
    }
    if (!self->snap.active)
        return;
    if (self->state != self->snap.from) {
        char message[300];
        snprintf (message, sizeof message, "the sandbox became %s during the snapshot%s%s",
                  sbx_sandbox_state_name (self->state), self->reason ? ": " : "",
                  self->reason ? self->reason : "");
        s_snap_fail (self, SBX_E_FAILED_PRECONDITION, message);
        return;
    }
    if (self->snap.migrating && !self->snap.query_pending && self->qmp) {
        self->snap.query_pending = true;
        vmd_qmp_query_migrate (self->qmp, s_on_snap_query, self);
    }
    if (self->snap.helper > 0) {
        int status;
        pid_t rc = waitpid (self->snap.helper, &status, WNOHANG);
        if (rc == self->snap.helper) {
            self->snap.helper = 0;
            if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
                s_snap_files_done (self);
            else {
                char note[900];
                s_death_note (self, "copying the disk failed", note, sizeof note);
                s_snap_fail (self, SBX_E_INTERNAL, note);
            }
            return;
        }
    }
    if (now >= self->snap.deadline)
        s_snap_fail (self, SBX_E_TIMEOUT, "the snapshot did not end in time");
}

int vmd_guest_snapshot (vmd_guest_t *self, const char *dir, uint32_t timeout_ms,
                        vmd_guest_snapshot_fn *fn, void *arg, sbx_err_t *err)
{
    if (self->snap.active && (self->snap.next_fn || !dir))
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "sandbox %s: snapshots of it are being taken; retry when they ended",
                            self->id);
    if (self->snap.active) {
        //  One waits (say, a user's right after the automatic one of a stop).
        self->snap.next_dir = strdup (dir);
        self->snap.next_timeout = timeout_ms;
        self->snap.next_fn = fn;
        self->snap.next_arg = arg;
        sbx_info ("sandbox=%s snapshot into %s waits for the one in progress", self->id, dir);
        return 0;
    }
    if (self->state != S_READY && self->state != S_STOPPED)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "cannot snapshot sandbox %s: it is %s (ready or stopped only)",
                            self->id, sbx_sandbox_state_name (self->state));
    if (self->state == S_READY && (!self->qmp || vmd_qmp_closed (self->qmp)))
        return sbx_err_set (err, SBX_E_UNAVAILABLE, "sandbox %s: no QEMU monitor connection",
                            self->id);
    struct stat st;
    if (!dir || dir[0] != '/' || strstr (dir, "..") || stat (dir, &st) || !S_ISDIR (st.st_mode))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "snapshot directory %s is not usable",
                            dir ? dir : "(none)");
    //  A fresh capture; what waits for it (a stop, a resume) stays.
    self->snap.paused = self->snap.migrating = self->snap.query_pending = false;
    self->snap.helper = 0;
    self->snap.disk_bytes = self->snap.memory_bytes = 0;
    self->snap.fd = -1;
    self->snap.dir = strdup (dir);
    self->snap.from = self->state;
    self->snap.fn = fn;
    self->snap.arg = arg;
    self->snap.deadline = sbx_clock_mono_ms () + (timeout_ms ? timeout_ms : S_DEFAULT_OP_MS);
    self->snap.active = true;
    sbx_info ("sandbox=%s snapshot into %s (%s)", self->id, dir,
              sbx_sandbox_state_name (self->state));
    if (self->state == S_STOPPED) {
        s_snap_copy (self);
        return 0;
    }
    //  Memory first, as a stop does it, but QEMU stays: paused, its state in the file.
    char *tmp = s_snap_path (self, "memory.state.tmp");
    self->snap.fd = tmp ? open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640) : -1;
    free (tmp);
    if (self->snap.fd < 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot write into %s: %s", dir, strerror (errno));
        self->snap.fn = NULL; //  answered by the caller, not through fn
        s_snap_fail (self, SBX_E_INTERNAL, err->message);
        return -1;
    }
    self->snap.paused = true;
    vmd_qmp_set_max_bandwidth (self->qmp, S_MAX_BANDWIDTH, NULL, NULL);
    vmd_qmp_stop (self->qmp, s_on_snap_paused, self);
    vmd_qmp_migrate_to_fd (self->qmp, self->snap.fd, s_on_snap_migrate, self);
    return 0;
}

int vmd_guest_set_origin (vmd_guest_t *self, const char *dir, const char *image_dir, bool restore)
{
    if (!dir || dir[0] != '/' || strstr (dir, "..") || strlen (dir) > 180)
        return -1;
    if (image_dir) {
        if (image_dir[0] != '/' || strstr (image_dir, "..") || strlen (image_dir) > 180)
            return -1;
        char *kernel = zsys_sprintf ("%s/vmlinux", image_dir);
        bool there = kernel && access (kernel, R_OK) == 0;
        free (kernel);
        if (!there)
            return -1;
        free (self->image_dir);
        self->image_dir = strdup (image_dir);
    }
    free (self->origin_dir);
    self->origin_dir = strdup (dir);
    self->origin_restore = restore;
    return self->origin_dir && self->image_dir ? 0 : -1;
}

const char *vmd_guest_image (vmd_guest_t *self)
{
    return self->image_dir;
}

//  --------------------------------------------------------------------------
//  The tick: QEMU's exit, migration and restore progress, deadlines

static bool s_qemu_gone (vmd_guest_t *self)
{
    if (self->pid <= 0)
        return true;
    int status;
    pid_t rc = waitpid (self->pid, &status, WNOHANG);
    if (rc == self->pid) {
        self->exit_status = status;
        return true;
    }
    if (rc == 0)
        return false;
    //  Not our child (adopted after a restart): is it still there, and still QEMU?
    if (kill (self->pid, 0) == -1 && errno == ESRCH)
        return true;
    return vmd_qemu_adopt (self->dir) != self->pid;
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_guest_t *self = arg;
    uint64_t now = sbx_clock_mono_ms ();
    if ((self->close_link && self->link) || (self->close_qmp && self->qmp))
        self->env->wake (self->env->arg);

    if (self->pid > 0 && s_qemu_gone (self)) {
        char what[200];
        if (self->exit_status == -1)
            snprintf (what, sizeof what, "QEMU (pid %d) exited", (int) self->pid);
        else if (WIFSIGNALED (self->exit_status))
            snprintf (what, sizeof what, "QEMU (pid %d) was killed by signal %d", (int) self->pid,
                      WTERMSIG (self->exit_status));
        else
            snprintf (what, sizeof what, "QEMU (pid %d) exited with status %d", (int) self->pid,
                      WEXITSTATUS (self->exit_status));
        sbx_info ("sandbox=%s %s", self->id, what);
        self->pid = 0;
        self->qmp_lost_at = 0;
        self->close_qmp = self->close_link = true;
        if (self->state == S_STOPPING && self->quit_sent)
            s_fire (self, EV_SAVED, SBX_OK, NULL);
        else if (self->state != S_DELETING) {
            char note[900];
            s_death_note (self, what, note, sizeof note);
            s_fire (self, self->state == S_CREATING ? EV_FAIL : EV_DIED, SBX_E_INTERNAL, "%s",
                    note);
        }
    }
    if (self->qmp_lost_at && self->pid > 0 && now >= self->qmp_lost_at + 1000) {
        //  QEMU still there without its monitor: we can't drive it any more.
        char note[900];
        s_death_note (self, self->qmp_lost, note, sizeof note);
        self->qmp_lost_at = 0;
        if (self->is_child || vmd_qemu_adopt (self->dir) == self->pid)
            kill (self->pid, SIGKILL);
        s_fire (self, self->state == S_CREATING ? EV_FAIL : EV_DIED, SBX_E_INTERNAL, "%s", note);
    }
    switch (self->state) {
    case S_STOPPING:
        if (self->migrating && !self->query_pending && self->qmp) {
            self->query_pending = true;
            vmd_qmp_query_migrate (self->qmp, s_on_query_migrate, self);
        }
        if (self->quit_sent && self->pid > 0 && now >= self->kill_at)
            kill (self->pid, SIGKILL); //  saved already; QEMU just won't leave
        break;
    case S_CREATING: //  from a snapshot's memory, as a resume
    case S_RESUMING:
        if (self->incoming && !self->status_pending && self->qmp && vmd_qmp_ready (self->qmp)) {
            self->status_pending = true;
            vmd_qmp_query_status (self->qmp, s_on_query_status, self);
        }
        break;
    case S_DELETING:
        if (self->pid > 0 && now >= self->kill_at &&
            (self->is_child || vmd_qemu_adopt (self->dir) == self->pid))
            kill (self->pid, SIGKILL);
        if (self->pid == 0) {
            self->close_link = self->close_qmp = true;
            if (s_remove_tree (self->dir) == -1)
                sbx_error ("sandbox=%s cannot remove %s: %s", self->id, self->dir,
                           strerror (errno));
            s_fire (self, EV_GONE, SBX_OK, NULL);
            return 0;
        }
        break;
    default:
        break;
    }
    s_snap_tick (self, now);
    if (self->restore_deadline && now >= self->restore_deadline) {
        //  Failing kills QEMU (a create is deleted, a resume ends in error); vmd_server
        //  boots a template's sandbox cold instead.
        self->restore_deadline = 0;
        char note[900], what[300];
        snprintf (what, sizeof what,
                  "the restore did not end within %g s (%s); QEMU (pid %d) is killed",
                  s_restore_ms (self) / 1000.0,
                  self->incoming ? "QEMU was still loading the memory state"
                                 : "the agent did not answer after it",
                  (int) self->pid);
        s_death_note (self, what, note, sizeof note);
        sbx_warn ("sandbox=%s %s", self->id, what);
        s_fire (self, EV_FAIL, SBX_E_TIMEOUT, "%s", note);
    }
    if (self->op && now >= self->op_deadline && self->state != S_DELETING) {
        char note[900], what[200];
        snprintf (what, sizeof what, "no answer within %.0f s", self->op_timeout / 1000.0);
        if (self->state == S_CREATING || self->state == S_RESUMING)
            snprintf (what, sizeof what, "the guest's agent did not answer within %.0f s",
                      self->op_timeout / 1000.0);
        s_death_note (self, what, note, sizeof note);
        s_fire (self, EV_FAIL, SBX_E_TIMEOUT, "%s", note);
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Construction

static bool s_id_valid (const char *id)
{
    size_t size = id ? strlen (id) : 0;
    if (size == 0 || size > 64)
        return false;
    for (const char *c = id; *c; c++)
        if (!isalnum ((unsigned char) *c) && *c != '_' && *c != '-')
            return false;
    return true;
}

static vmd_guest_t *s_new (const vmd_guest_env_t *env, const char *id)
{
    if (!s_id_valid (id))
        return NULL;
    vmd_guest_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->env = env;
    self->id = strdup (id);
    self->dir = zsys_sprintf ("%s/%s", env->vms_dir, id);
    self->state_fd = -1;
    self->snap.fd = -1;
    self->exit_status = -1;
    self->tick = zloop_timer (env->loop, S_TICK_MS, 0, s_on_tick, self);
    if (!self->id || !self->dir || self->tick == -1)
        vmd_guest_destroy (&self);
    return self;
}

vmd_guest_t *vmd_guest_new (const vmd_guest_env_t *env, const char *id, const char *hostname,
                            sbx_sandbox_type_t type, bool no_network)
{
    if (!hostname || !*hostname || strlen (hostname) > 63)
        return NULL;
    for (const char *c = hostname; *c; c++)
        if (!islower ((unsigned char) *c) && !isdigit ((unsigned char) *c) && *c != '-')
            return NULL;
    if (!vmd_qemu_type (sbx_sandbox_type_name (type)))
        return NULL;
    vmd_guest_t *self = s_new (env, id);
    if (!self)
        return NULL;
    self->hostname = strdup (hostname);
    self->image_dir = strdup (env->image_dir);
    self->type = type;
    self->no_network = no_network;
    self->state = S_CREATING;
    if (!self->hostname || !self->image_dir)
        vmd_guest_destroy (&self);
    return self;
}

vmd_guest_t *vmd_guest_load (const vmd_guest_env_t *env, const char *id)
{
    vmd_guest_t *self = s_new (env, id);
    if (!self)
        return NULL;
    char *path = s_path (self, "guest.json");
    json_error_t jerr;
    json_t *root = path ? json_load_file (path, 0, &jerr) : NULL;
    const char *sid = NULL, *hostname = NULL, *type = NULL, *state = NULL, *image = NULL,
               *reason = NULL;
    int no_network = 0;
    if (!root ||
        json_unpack_ex (root, &jerr, 0, "{s:s, s:s, s:s, s?b, s:s, s:s, s?s}", "sandbox_id", &sid,
                        "hostname", &hostname, "type", &type, "no_network", &no_network, "state",
                        &state, "image", &image, "reason", &reason) ||
        !streq (sid, id) || sbx_sandbox_type_from_name (type, &self->type) ||
        sbx_sandbox_state_from_name (state, &self->state)) {
        sbx_error ("sandbox=%s %s is unusable (%s); leaving it alone", id, path ? path : "?",
                   root ? "bad fields" : jerr.text);
        json_decref (root);
        free (path);
        vmd_guest_destroy (&self);
        return NULL;
    }
    free (path);
    self->hostname = strdup (hostname);
    self->image_dir = strdup (image);
    self->no_network = no_network;
    self->reason = reason ? strdup (reason) : NULL;
    json_t *forwards = json_object_get (root, "forwards");
    for (size_t i = 0; i < json_array_size (forwards) && self->fwd_count < VMD_GUEST_MAX_FWD; i++) {
        json_t *f = json_array_get (forwards, i);
        json_int_t port = json_integer_value (json_object_get (f, "port"));
        json_int_t host_port = json_integer_value (json_object_get (f, "host_port"));
        if (port < 1 || port > 65535 || host_port < 1 || host_port > 65535) {
            sbx_warn ("sandbox=%s guest.json: forward %zu is unusable; dropped", id, i);
            continue;
        }
        self->fwd[self->fwd_count].port = (int) port;
        self->fwd[self->fwd_count++].host_port = (int) host_port;
    }
    json_decref (root);

    pid_t pid = vmd_qemu_adopt (self->dir);
    char *state_path = s_path (self, "memory.state");
    bool saved = state_path && access (state_path, F_OK) == 0;
    free (state_path);
    sbx_sandbox_state_t was = self->state;
    const char *why = NULL;
    if (pid > 0) {
        self->pid = pid;
        self->is_child = false;
        if (was == S_READY || was == S_ERROR) {
            if (s_open_channels (self))
                why = "cannot reconnect to its QEMU";
            else {
                s_forwards_renew (self, true);
                //  A vmd that died during a snapshot left its guest paused, perhaps
                //  migrating still: the tick cancels that and continues it.
                self->unpause = was == S_READY;
            }
        } else {
            //  Caught mid-way: nobody waits for that answer any more.
            kill (pid, SIGKILL);
            why = "vmd restarted while the guest was changing state";
        }
    } else if (was == S_STOPPED || (was == S_STOPPING && saved))
        self->state = S_STOPPED;
    else if (was == S_READY || was == S_CREATING || was == S_RESUMING || was == S_STOPPING)
        why = "its QEMU exited while vmd was not running";
    if (was == S_DELETING) {
        //  The delete was under way: finish it (its answer is owed to no one now).
        self->state = S_DELETING;
        self->kill_at = sbx_clock_mono_ms ();
    } else if (was == S_STOPPING && self->state == S_STOPPED) {
        s_save (self);
    } else if (why) {
        free (self->reason);
        char note[900];
        s_death_note (self, why, note, sizeof note);
        self->reason = strdup (note);
        self->state = S_ERROR;
        s_save (self);
    }
    sbx_info ("sandbox=%s found in state %s (was %s)%s%s", id, sbx_sandbox_state_name (self->state),
              sbx_sandbox_state_name (was), self->pid ? ", QEMU re-adopted" : "",
              self->reason ? "" : "");
    return self;
}

void vmd_guest_collect (vmd_guest_t *self)
{
    if (self->close_link)
        vmd_agentlink_destroy (&self->link);
    if (self->close_qmp)
        vmd_qmp_destroy (&self->qmp);
    self->close_link = self->close_qmp = false;
}

void vmd_guest_destroy (vmd_guest_t **self_p)
{
    vmd_guest_t *self = *self_p;
    if (!self)
        return;
    if (self->tick != -1)
        zloop_timer_end (self->env->loop, self->tick);
    vmd_agentlink_destroy (&self->link);
    vmd_qmp_destroy (&self->qmp);
    if (self->state_fd >= 0)
        close (self->state_fd);
    if (self->snap.fd >= 0)
        close (self->snap.fd);
    free (self->snap.dir);
    free (self->snap.next_dir);
    free (self->origin_dir);
    free (self->id);
    free (self->hostname);
    free (self->dir);
    free (self->image_dir);
    free (self->reason);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Operations

static int s_refuse (vmd_guest_t *self, s_event_t event, sbx_err_t *err)
{
    for (size_t i = 0; i < sizeof s_table / sizeof s_table[0]; i++)
        if (s_table[i].from == self->state && s_table[i].event == event)
            return 0;
    return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "cannot %s sandbox %s: it is %s%s%s",
                        s_event_names[event], self->id, sbx_sandbox_state_name (self->state),
                        self->reason ? ": " : "", self->reason ? self->reason : "");
}

int vmd_guest_create (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    if (s_refuse (self, EV_CREATE, err))
        return -1;
    if (mkdir (self->dir, 0700) == -1)
        return sbx_err_set (err, errno == EEXIST ? SBX_E_CONFLICT : SBX_E_INTERNAL,
                            "cannot make %s: %s", self->dir, strerror (errno));
    s_op_begin (self, rid, timeout_ms);
    s_save (self);
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.image_dir = self->image_dir;
    config.dir = self->dir;
    char *backing = self->origin_dir ? zsys_sprintf ("%s/disk.qcow2", self->origin_dir) : NULL;
    config.backing = backing;
    int incoming = -1;
    if (self->origin_dir && self->origin_restore) {
        char *memory = zsys_sprintf ("%s/memory.state", self->origin_dir);
        incoming = memory ? open (memory, O_RDONLY | O_CLOEXEC) : -1;
        free (memory);
    }
    //  ≈ 20 ms of qemu-img: short enough for the loop (there is no async variant).
    int overlay = vmd_qemu_overlay_create (&config);
    free (backing);
    if (self->origin_dir && self->origin_restore && incoming < 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot open the snapshot's memory state: %s",
                     strerror (errno));
    } else if (overlay != 0) {
        char note[900];
        s_death_note (self, "cannot create the disk overlay", note, sizeof note);
        sbx_err_set (err, SBX_E_INTERNAL, "%s", note);
    } else if (s_spawn (self, incoming) != 0) {
        char note[900];
        s_death_note (self, "cannot start QEMU", note, sizeof note);
        sbx_err_set (err, SBX_E_INTERNAL, "%s", note);
    } else {
        if (incoming >= 0)
            close (incoming);
        //  Restoring: the tick waits for the memory to load, continues, sets it up.
        self->incoming = incoming >= 0;
        s_fire (self, EV_CREATE, SBX_OK, NULL);
        if (self->incoming)
            s_restore_begin (self);
        return 0;
    }
    if (incoming >= 0)
        close (incoming);
    self->op = false;
    if (self->pid > 0)
        kill (self->pid, SIGKILL), waitpid (self->pid, NULL, 0); //  just spawned: ms
    self->pid = 0;
    vmd_agentlink_destroy (&self->link);
    vmd_qmp_destroy (&self->qmp);
    s_remove_tree (self->dir);
    return -1;
}

static int s_request (vmd_guest_t *self, s_event_t event, uint64_t rid, uint32_t timeout_ms,
                      sbx_err_t *err)
{
    if (s_refuse (self, event, err))
        return -1;
    if (self->op && event == EV_DELETE)
        s_op_end (self, SBX_E_FAILED_PRECONDITION, "the sandbox is being deleted");
    s_op_begin (self, rid, timeout_ms);
    s_fire (self, event, SBX_OK, NULL);
    return 0;
}

//  During a capture a stop or resume waits for its end (one at a time): refusing it
//  would put the broker's sandbox in error for a request that is merely early.
static int s_defer (vmd_guest_t *self, s_event_t event, uint64_t rid, uint32_t timeout_ms,
                    sbx_err_t *err)
{
    if (self->snap.deferred)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "sandbox %s: a snapshot is being taken and a request waits for it; "
                            "retry in a moment",
                            self->id);
    self->snap.deferred = true;
    self->snap.deferred_event = event;
    self->snap.deferred_rid = rid;
    self->snap.deferred_timeout = timeout_ms;
    sbx_info ("sandbox=%s rid=%llu %s waits for the snapshot in progress", self->id,
              (unsigned long long) rid, s_event_names[event]);
    return 0;
}

int vmd_guest_stop (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    if (self->snap.active)
        return s_defer (self, EV_STOP, rid, timeout_ms, err);
    return s_request (self, EV_STOP, rid, timeout_ms, err);
}

int vmd_guest_resume (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    if (self->snap.active)
        return s_defer (self, EV_RESUME, rid, timeout_ms, err);
    return s_request (self, EV_RESUME, rid, timeout_ms, err);
}

int vmd_guest_delete (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    return s_request (self, EV_DELETE, rid, timeout_ms, err);
}

int vmd_guest_agent (vmd_guest_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                     vmd_agentlink_reply_fn *fn, void *arg, sbx_err_t *err)
{
    if (self->state != S_READY || !self->link) {
        sbx_msg_destroy (request_p);
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s%s", self->id,
                            sbx_sandbox_state_name (self->state), self->reason ? ": " : "",
                            self->reason ? self->reason : "");
    }
    vmd_agentlink_request (self->link, request_p, timeout_ms, fn, arg);
    return 0;
}

const char *vmd_guest_id (vmd_guest_t *self)
{
    return self->id;
}

sbx_sandbox_state_t vmd_guest_state (vmd_guest_t *self)
{
    return self->state;
}

pid_t vmd_guest_pid (vmd_guest_t *self)
{
    return self->pid;
}

const char *vmd_guest_reason (vmd_guest_t *self)
{
    return self->reason;
}
