/*  vmd_guest - see vmd_guest.h

    vmd_lifecycle decides (state, event -> next state, actions; docs/lifecycle.md); this
    performs: everything here that changes a guest's state is an event fired through
    s_fire, and everything it then does is an action of that table, in s_perform.
    Callbacks and the tick only observe (QMP answers, the agent, QEMU's exit, deadlines)
    and turn what they saw into events.

    Everything runs from vmd's loop and never waits: QEMU's exit is seen by a tick
    (waitpid WNOHANG for our children, kill (pid, 0) for adopted ones) and by its QMP
    connection closing; migrations and restores are polled from the tick; timers carry
    every deadline. The only blocking call is the ~20 ms qemu-img of a create: the fsyncs
    of a stop's memory state and of a snapshot's copies are children's work.
*/
#include "vmd_guest.h"
#include "sbx_files.h"
#include "sbx_metrics.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "vmd_lifecycle.h"
#include "vmd_qemu.h"
#include "vmd_qmp.h"

#include <assert.h>
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_TICK_MS       25     //  exit checks, migration polls, deadlines
#define S_KILL_GRACE_MS 2000   //  after QMP quit, before SIGKILL
#define S_DEFAULT_OP_MS 120000 //  an operation without its own deadline
#define S_SETUP_MS      10000  //  agent.setup's answer
#define S_MAX_BANDWIDTH (8LL << 30)
#define S_ENTROPY_BYTES 64 //  fresh host randomness with every agent.setup
//  A live capture's pause for the memory QEMU has left to copy (QEMU's downtime-limit;
//  its default is 300): what it estimates, at the rate it writes the file.
#define S_LIVE_DOWNTIME_MS 10

#define S_CREATING SBX_SANDBOX_STATE_CREATING
#define S_READY    SBX_SANDBOX_STATE_READY
#define S_STOPPING SBX_SANDBOX_STATE_STOPPING
#define S_STOPPED  SBX_SANDBOX_STATE_STOPPED
#define S_RESUMING SBX_SANDBOX_STATE_RESUMING
#define S_DELETING SBX_SANDBOX_STATE_DELETING
#define S_DELETED  SBX_SANDBOX_STATE_DELETED
#define S_ERROR    SBX_SANDBOX_STATE_ERROR

//  A request, as it travels with its event to the actions that take it.
typedef struct {
    uint64_t rid;
    uint32_t timeout_ms;
    const char *dir; //  a snapshot's
    bool live;       //  a fork's capture (vmd_guest_snapshot)
    vmd_guest_snapshot_fn *fn;
    void *arg;
} s_asked_t;

//  An event being fired: its outcome (a failure's code and message) and, for a request,
//  the request.
typedef struct {
    sbx_vmd_event_t event;
    sbx_code_t code;
    const char *message;
    const s_asked_t *asked;
} s_event_t;

struct _vmd_guest_t {
    const vmd_guest_env_t *env;
    char *id;
    char *hostname;
    char mac[18]; //  eth0's, made from the id (vmd_qemu_mac)
    char *dir;
    char *image_dir; //  the base this guest's overlay names
    sbx_sandbox_type_t type;
    bool no_network;
    uid_t uid;          //  its QEMU's own (0: env's qemu_user)
    vmd_lifecycle_t lc; //  where it is: its state, and its capture's and restore's
    unsigned moves[3];  //  transitions per machine (vmd_lifecycle_machine_t)
    char *reason;       //  why in error
    pid_t pid;          //  QEMU, 0 when none
    bool is_child;      //  spawned by this vmd (else adopted after a restart)
    int exit_status;    //  of our child, when reaped; -1 unknown
    vmd_qmp_t *qmp;
    vmd_agentlink_t *link;
    bool close_qmp, close_link; //  destroyed by the next collect (never inside their callbacks)
    int tick;
    //  The request in progress: whether one waits for its answer, its deadline, and the
    //  first failure it met (its answer unless the guest ends well).
    struct {
        bool pending;
        uint64_t rid;
        uint64_t started; //  mono ms, for the log
        uint64_t deadline;
        uint32_t timeout;
        sbx_code_t code;
        char message[1024];
    } op;
    int state_fd;              //  a stop's memory.state.tmp while QEMU writes it
    uint64_t restore_deadline; //  a restore must be answered by then (mono ms)
    uint64_t kill_at;          //  SIGKILL QEMU after this (mono ms), once it was asked to quit
    char qmp_lost[300];        //  QMP closed on its own: why, and when (mono ms)
    uint64_t qmp_lost_at;
    //  QEMU's start, until the agent is set up: sbx_vm_boot_seconds (how: cold, template,
    //  snapshot) or, for a resume, sbx_vm_resume_seconds.
    uint64_t spawned_mono;
    const char *spawn_how;
    //  Made from a snapshot: its directory, and whether its memory is restored.
    char *origin_dir;
    bool origin_restore;
    //  Guest RAM in a memfd (vmd_guest_set_ram): the fd, borrowed for the next spawn
    //  only; shared for a template's own guest (its memory states leave the RAM out),
    //  else a clone that maps it copy-on-write; ram_clone until the clone continues.
    int ram_fd;
    bool ram_shared;
    bool ram_clone;
    //  The snapshot the capture takes (vm.snapshot), and what waits for its end.
    struct {
        char *dir;
        bool live;     //  a fork's: memory copied while the guest runs, no fsync while paused
        int fd;        //  memory.state.tmp while QEMU writes it
        pid_t helper;  //  the child that copies and fsyncs (a stop's keeper too)
        int helper_fd; //  its pidfd, readable when it exits (-1: the tick finds out)
        pid_t syncer;  //  a live capture's fsync, after the guest runs again (reaped at a tick)
        uint64_t deadline;
        //  The guest's pause for the capture: QEMU's STOP event, then its RESUME.
        uint64_t stopped_mono;
        uint64_t paused_ms;
        vmd_guest_snapshot_fn *fn;
        void *arg;
        uint64_t disk_bytes, memory_bytes;
        //  A stop or resume that came meanwhile (SBX_VMD_EV__NONE: none).
        sbx_vmd_event_t deferred;
        uint64_t deferred_rid;
        uint32_t deferred_timeout;
        //  Another snapshot asked for meanwhile (a user's after a stop's automatic one).
        char *next_dir;
        bool next_live;
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

static int s_fire (vmd_guest_t *self, sbx_vmd_event_t event, sbx_code_t code, const char *format,
                   ...) __attribute__ ((format (printf, 4, 5)));
static int s_request (vmd_guest_t *self, sbx_vmd_event_t event, uint64_t rid, uint32_t timeout_ms,
                      sbx_err_t *err);

//  --------------------------------------------------------------------------
//  Files

static char *s_path (vmd_guest_t *self, const char *name)
{
    return zsys_sprintf ("%s/%s", self->dir, name);
}

//  guest.json, atomically: a crash leaves the old or the new file, never half of one.
static void s_save (vmd_guest_t *self)
{
    if (self->lc.guest == S_DELETED)
        return;
    json_t *root = json_pack ("{s:s, s:s, s:s, s:b, s:s, s:s}", "sandbox_id", self->id, "hostname",
                              self->hostname, "type", sbx_sandbox_type_name (self->type),
                              "no_network", self->no_network, "state",
                              sbx_sandbox_state_name (self->lc.guest), "image", self->image_dir);
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
    //  The directory is QEMU's user's: a guest.json.tmp there may be its link or FIFO,
    //  so a new file is made (O_EXCL never follows a link) after whatever was there goes.
    if (tmp)
        unlink (tmp);
    int fd =
        text && tmp ? open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
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
//  The state machine: vmd_lifecycle's step, then its actions (s_perform)

static void s_perform (vmd_guest_t *self, sbx_vmd_action_t action, const s_event_t *ev);

//  Takes event where the lifecycle lets it: the guest's failure becomes its reason (and
//  the request's first failure), guest.json follows the state, the actions run in order,
//  then the step's then. An action that moves its own machine under the list ends the
//  list: the rest was meant for a state it left. Returns 0, or -1 when refused.
static int s_apply (vmd_guest_t *self, const s_event_t *ev)
{
    vmd_lifecycle_step_t step;
    sbx_lifecycle_kind_t kind = sbx_vmd_event_kind (ev->event);
    const char *message = ev->message ? ev->message : "";
    if (vmd_lifecycle_next (&self->lc, ev->event, &step)) {
        if (kind != SBX_LIFECYCLE_PERIODIC)
            sbx_debug ("sandbox=%s %s ignored in state %s%s%s", self->id,
                       sbx_vmd_event_name (ev->event), sbx_sandbox_state_name (self->lc.guest),
                       *message ? ": " : "", message);
        return -1;
    }
    vmd_lifecycle_machine_t machine = step.machine;
    const char *from = vmd_lifecycle_state_name (&self->lc, machine);
    const char *to = vmd_lifecycle_state_name (&step.next, machine);
    if (machine == VMD_LIFECYCLE_GUEST) {
        if (kind == SBX_LIFECYCLE_FAILURE && ev->code != SBX_OK && self->op.pending &&
            self->op.code == SBX_OK) {
            //  The first failure is the one the requester hears about.
            self->op.code = ev->code;
            snprintf (self->op.message, sizeof self->op.message, "%s", message);
        }
        if (kind == SBX_LIFECYCLE_FAILURE && *message) {
            free (self->reason);
            self->reason = strdup (message);
        }
        if (kind != SBX_LIFECYCLE_PERIODIC)
            sbx_info ("sandbox=%s rid=%llu %s -> %s on %s%s%s", self->id,
                      (unsigned long long) self->op.rid, from, to, sbx_vmd_event_name (ev->event),
                      *message ? ": " : "", message);
    } else if (kind != SBX_LIFECYCLE_PERIODIC || step.next.capture != self->lc.capture ||
               step.next.restore != self->lc.restore) {
        //  Where a sub-machine begins and ends its work is worth the log; its polls not.
        bool idle =
            self->lc.capture == SBX_VMD_CAPTURE_IDLE && self->lc.restore == SBX_VMD_RESTORE_IDLE;
        bool ends =
            step.next.capture == SBX_VMD_CAPTURE_IDLE && step.next.restore == SBX_VMD_RESTORE_IDLE;
        if (idle || ends)
            sbx_info ("sandbox=%s %s %s -> %s on %s%s%s", self->id,
                      vmd_lifecycle_machine_name (machine), from, to,
                      sbx_vmd_event_name (ev->event), *message ? ": " : "", message);
        else
            sbx_debug ("sandbox=%s %s %s -> %s on %s", self->id,
                       vmd_lifecycle_machine_name (machine), from, to,
                       sbx_vmd_event_name (ev->event));
    }
    bool moved = step.next.guest != self->lc.guest;
    self->lc = step.next;
    unsigned moves = ++self->moves[machine];
    if (machine == VMD_LIFECYCLE_GUEST) {
        if (self->lc.guest != S_ERROR) {
            free (self->reason);
            self->reason = NULL;
        }
        if (moved || kind == SBX_LIFECYCLE_FAILURE)
            s_save (self);
    }
    for (size_t i = 0; i < step.action_count; i++) {
        s_perform (self, step.actions[i], ev);
        if (self->moves[machine] != moves) {
            sbx_debug ("sandbox=%s %s moved on during %s: the rest is dropped", self->id,
                       vmd_lifecycle_machine_name (machine), sbx_vmd_action_name (step.actions[i]));
            return 0;
        }
    }
    if (step.then != SBX_VMD_EV__NONE) {
        //  A failure passes its outcome on (a capture's to the stop it served).
        bool failure = sbx_vmd_event_kind (step.then) == SBX_LIFECYCLE_FAILURE;
        s_event_t then = {step.then, failure ? ev->code : SBX_OK, failure ? message : NULL, NULL};
        s_apply (self, &then);
    }
    return 0;
}

static int s_fire (vmd_guest_t *self, sbx_vmd_event_t event, sbx_code_t code, const char *format,
                   ...)
{
    char message[1024] = "";
    if (format) {
        va_list args;
        va_start (args, format);
        vsnprintf (message, sizeof message, format, args);
        va_end (args);
    }
    s_event_t ev = {event, code, message, NULL};
    return s_apply (self, &ev);
}

//  Answers the request in progress, once.
static void s_op_end (vmd_guest_t *self, sbx_code_t code, const char *message)
{
    if (!self->op.pending)
        return;
    self->op.pending = false;
    sbx_info ("sandbox=%s rid=%llu %s after %.2f s%s%s", self->id,
              (unsigned long long) self->op.rid, code == SBX_OK ? "done" : "failed",
              (sbx_clock_mono_ms () - self->op.started) / 1000.0, message ? ": " : "",
              message ? message : "");
    if (self->env->done)
        self->env->done (self, self->op.rid, code, message, self->env->arg);
}

static void s_accept (vmd_guest_t *self, const s_event_t *ev)
{
    assert (ev->asked); //  only request rows accept
    if (self->op.pending)
        s_op_end (self, SBX_E_FAILED_PRECONDITION,
                  ev->event == SBX_VMD_EV_DELETE ? "the sandbox is being deleted"
                                                 : "superseded by a later request");
    self->op.pending = true;
    self->op.rid = ev->asked->rid;
    self->op.timeout = ev->asked->timeout_ms ? ev->asked->timeout_ms : S_DEFAULT_OP_MS;
    self->op.started = sbx_clock_mono_ms ();
    self->op.deadline = self->op.started + self->op.timeout;
    self->op.code = SBX_OK;
    self->op.message[0] = 0;
}

//  --------------------------------------------------------------------------
//  What QMP and the agent say, as events

static void s_on_qmp_closed (vmd_qmp_t *qmp, const char *reason, void *arg)
{
    (void) qmp;
    vmd_guest_t *self = arg;
    self->close_qmp = true;
    s_fire (self, SBX_VMD_EV_QMP_CLOSED, SBX_OK, "QEMU's monitor connection closed (%s)", reason);
}

static void s_on_qmp_event (vmd_qmp_t *qmp, const char *event, json_t *data, void *arg)
{
    (void) qmp;
    vmd_guest_t *self = arg;
    sbx_debug ("sandbox=%s QMP event %s", self->id, event);
    //  How long a capture keeps the guest paused (vm.snapshot.ok's paused_ms): from the
    //  STOP that QMP stop (or a live migration's last phase) causes to cont's RESUME.
    bool capturing = self->snap.dir && self->lc.capture != SBX_VMD_CAPTURE_IDLE;
    const char *status = json_string_value (json_object_get (data, "status"));
    if (streq (event, "STOP") && capturing && !self->snap.stopped_mono)
        self->snap.stopped_mono = sbx_clock_mono_ms ();
    //  A live capture's migration ended (the events capability): ask how now, not at the
    //  next 25 ms poll, since the guest waits paused meanwhile.
    else if (streq (event, "MIGRATION") && capturing && status && streq (status, "completed"))
        s_fire (self, SBX_VMD_EV_POLL, SBX_OK, NULL);
    else if (streq (event, "RESUME") && self->snap.stopped_mono) {
        self->snap.paused_ms = sbx_clock_mono_ms () - self->snap.stopped_mono;
        self->snap.stopped_mono = 0;
    }
}

static void s_on_setup (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    sbx_msg_t *reply = *reply_p;
    if (reply->type == SBX_MSG_AGENT_SETUP_OK) {
        sbx_debug ("sandbox=%s agent.setup: clock moved %lld ms", self->id,
                   (long long) sbx_msg_agent_setup_ok (reply)->clock_adjust_ms);
        const char *mac = sbx_msg_agent_setup_ok (reply)->mac;
        if (mac && !streq (mac, self->mac))
            sbx_warn ("sandbox=%s eth0 has MAC %s, not its own %s (the agent could not set it)",
                      self->id, mac, self->mac);
        if (self->spawned_mono) {
            double seconds = (double) (sbx_clock_mono_ms () - self->spawned_mono) / 1000.0;
            if (streq (self->spawn_how, "resume"))
                sbx_metrics_observe (sbx_metrics_here (), SBX_METRIC_VM_RESUME_SECONDS, seconds);
            else
                sbx_metrics_observe (sbx_metrics_here (), SBX_METRIC_VM_BOOT_SECONDS, seconds,
                                     self->spawn_how);
            self->spawned_mono = 0;
        }
        s_fire (self, SBX_VMD_EV_AGENT_READY, SBX_OK, NULL);
    } else if (reply->type == SBX_MSG_ERROR && self->lc.guest != S_READY)
        //  The connection broke mid-setup: the next hello sends it again.
        sbx_warn ("sandbox=%s agent.setup failed: %s", self->id, sbx_msg_error (reply)->message);
}

//  The agent is there (boot, resume, or reattach after a vmd restart).
static void s_on_hello (vmd_agentlink_t *link, sbx_agent_hello_t *hello, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    sbx_info ("sandbox=%s agent hello (uptime %.1f s, %llu processes)", self->id,
              hello->uptime_ms / 1000.0, (unsigned long long) hello->processes);
    s_fire (self, SBX_VMD_EV_HELLO, SBX_OK, NULL);
}

static void s_on_link_lost (vmd_agentlink_t *link, const char *reason, void *arg)
{
    (void) link;
    vmd_guest_t *self = arg;
    self->close_link = true;
    s_fire (self, SBX_VMD_EV_AGENT_LOST, SBX_E_INTERNAL, "the guest agent is gone: %s", reason);
}

//  QMP stop and migrate, for a stop's capture and a snapshot's alike.
static void s_on_paused (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    if (error)
        s_fire (arg, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL, "could not pause the guest: %s",
                error);
}

//  A template's guest saves its devices only (x-ignore-shared): without it the state
//  would carry the RAM too and clones would load it for nothing.
static void s_on_ignore_shared (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    if (error)
        s_fire (arg, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "could not leave the template's RAM out of its memory state: %s", error);
}

static void s_on_migrate (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    if (error)
        s_fire (arg, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "could not save the guest's memory: %s", error);
    else
        s_fire (arg, SBX_VMD_EV_MIGRATE_STARTED, SBX_OK, NULL);
}

static void s_on_query_migrate (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    const char *status = error ? NULL : json_string_value (json_object_get (result, "status"));
    if (error)
        s_fire (arg, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "saving the guest's memory failed: %s", error);
    else if (!status) //  a failure for a capture; all is well for a recovery
        s_fire (arg, SBX_VMD_EV_MIGRATE_NONE, SBX_E_INTERNAL,
                "query-migrate: no migration since QEMU started");
    else if (streq (status, "failed") || streq (status, "cancelled")) {
        const char *why = json_string_value (json_object_get (result, "error-desc"));
        s_fire (arg, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "saving the guest's memory failed: %s", why ? why : status);
    } else if (streq (status, "completed")) {
        //  What the capture cost, as QEMU counts it (total, the guest's downtime in it,
        //  passes over its dirty memory, what it wrote).
        vmd_guest_t *self = arg;
        json_t *ram = json_object_get (result, "ram");
        sbx_info ("sandbox=%s memory saved: %lld ms (downtime %lld ms, setup %lld ms), %lld "
                  "passes, %.1f MiB written",
                  self->id, (long long) json_integer_value (json_object_get (result, "total-time")),
                  (long long) json_integer_value (json_object_get (result, "downtime")),
                  (long long) json_integer_value (json_object_get (result, "setup-time")),
                  (long long) json_integer_value (json_object_get (ram, "dirty-sync-count")),
                  (double) json_integer_value (json_object_get (ram, "transferred")) / 1048576.0);
        s_fire (arg, SBX_VMD_EV_MIGRATED, SBX_OK, NULL);
    } else
        s_fire (arg, SBX_VMD_EV_MIGRATE_ACTIVE, SBX_OK, NULL);
}

static void s_on_query_status (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    const char *status = error ? NULL : json_string_value (json_object_get (result, "status"));
    if (!status)
        s_fire (arg, SBX_VMD_EV_FAIL, SBX_E_INTERNAL, "could not restore the guest: %s",
                error ? error : "no status");
    else if (streq (status, "inmigrate"))
        s_fire (arg, SBX_VMD_EV_INMIGRATE, SBX_OK, NULL);
    else if (streq (status, "paused") || streq (status, "prelaunch"))
        s_fire (arg, SBX_VMD_EV_LOADED, SBX_OK, NULL);
    else if (streq (status, "running"))
        s_fire (arg, SBX_VMD_EV_RUNNING, SBX_OK, NULL);
    else
        s_fire (arg, SBX_VMD_EV_FAIL, SBX_E_INTERNAL, "restoring the guest's memory ended in %s",
                status);
}

static void s_on_cont (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    vmd_guest_t *self = arg;
    if (error) {
        sbx_warn ("sandbox=%s cannot continue the guest: %s", self->id, error);
        s_fire (self, SBX_VMD_EV_CONT_FAILED, SBX_E_INTERNAL, "the guest did not continue: %s",
                error);
    } else
        s_fire (self, SBX_VMD_EV_CONTINUED, SBX_OK, NULL);
}

//  --------------------------------------------------------------------------
//  Port forwards

size_t vmd_guest_forwards (vmd_guest_t *self, int *host_ports, size_t max)
{
    for (size_t i = 0; i < self->fwd_count && i < max; i++)
        host_ports[i] = self->fwd[i].host_port;
    return self->fwd_count;
}

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
    bool running = self->lc.guest == S_READY && self->qmp && !vmd_qmp_closed (self->qmp);
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
                            sbx_sandbox_state_name (self->lc.guest),
                            self->lc.guest == S_STOPPED ? "; resume it first" : "");
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

//  --------------------------------------------------------------------------
//  QEMU and its channels

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

static void s_on_incoming (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    (void) result;
    if (error)
        s_fire (arg, SBX_VMD_EV_FAIL, SBX_E_INTERNAL, "could not restore the guest: %s", error);
}

static int s_spawn (vmd_guest_t *self, int incoming_fd)
{
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    //  A clone loads its device state only once x-ignore-shared is on (QEMU 7.2 has no
    //  command-line switch for it): -incoming defer, then the capability, then the fd.
    bool clone = self->ram_fd >= 0 && !self->ram_shared && incoming_fd >= 0;
    config.mem_fd = self->ram_fd;
    config.mem_shared = self->ram_shared;
    config.incoming_defer = clone;
    self->ram_fd = -1;
    config.image_dir = self->image_dir;
    config.dir = self->dir;
    config.hostname = self->hostname;
    config.mac = self->mac;
    config.type = vmd_qemu_type (sbx_sandbox_type_name (self->type));
    config.no_network = self->no_network;
    config.incoming_fd = clone ? -1 : incoming_fd;
    config.user = self->env->qemu_user;
    config.uid = self->uid;
    config.gid = self->env->gid;
    self->kill_at = 0;
    self->exit_status = -1;
    self->qmp_lost_at = 0;
    self->pid = vmd_qemu_spawn (&config);
    if (self->pid <= 0) {
        self->pid = 0;
        return -1;
    }
    self->is_child = true;
    self->spawned_mono = sbx_clock_mono_ms ();
    sbx_info ("sandbox=%s QEMU pid %d%s", self->id, (int) self->pid,
              clone ? " (RAM copy-on-write from its template)" : "");
    int rc = s_open_channels (self);
    //  Queued until QMP is up; before the restore's first status poll.
    if (rc == 0 && clone) {
        self->ram_clone = true;
        vmd_qmp_set_capability (self->qmp, "x-ignore-shared", true, s_on_incoming, self);
        vmd_qmp_migrate_incoming_fd (self->qmp, incoming_fd, s_on_incoming, self);
    }
    return rc;
}

//  --------------------------------------------------------------------------
//  Actions: what the lifecycle's rows do (schemas/lifecycle.json says each one)

static void s_send_setup (vmd_guest_t *self)
{
    sbx_msg_t *setup = self->link ? sbx_msg_new (SBX_MSG_AGENT_SETUP) : NULL;
    if (!setup)
        return;
    sbx_agent_setup_t *body = sbx_msg_agent_setup (setup);
    sbx_str_set (&body->hostname, self->hostname);
    //  Its own MAC: one restored from another guest's memory still has that one's.
    sbx_str_set (&body->mac, self->mac);
    body->time_ms = sbx_clock_now_ms (); //  the clock stood still while stopped
    body->no_network = self->no_network;
    //  Fresh randomness every time: a guest restored from a snapshot (or resumed) must
    //  not go on from the random state its siblings share.
    uint8_t entropy[S_ENTROPY_BYTES];
    if (getrandom (entropy, sizeof entropy, 0) == (ssize_t) sizeof entropy)
        sbx_bytes_set (&body->entropy, entropy, sizeof entropy);
    vmd_agentlink_request (self->link, &setup, S_SETUP_MS, s_on_setup, self);
}

static void s_close_agent (vmd_guest_t *self)
{
    if (!self->link)
        return;
    vmd_agentlink_fail_all (self->link, self->lc.guest == S_STOPPING
                                            ? "the sandbox is stopping"
                                            : "the sandbox is being deleted");
    self->close_link = true;
}

static void s_kill_qemu (vmd_guest_t *self)
{
    //  An adopted pid may have gone and been reused: only ever this guest's QEMU.
    if (self->pid > 0 && (self->is_child || vmd_qemu_adopt (self->dir) == self->pid))
        kill (self->pid, SIGKILL);
}

static void s_quit_qemu (vmd_guest_t *self)
{
    if (self->pid > 0 && self->qmp && vmd_qmp_ready (self->qmp)) {
        vmd_qmp_quit (self->qmp, NULL, NULL);
        self->kill_at = sbx_clock_mono_ms () + S_KILL_GRACE_MS;
    } else
        self->kill_at = sbx_clock_mono_ms ();
}

static void s_remove_when_gone (vmd_guest_t *self)
{
    if (self->pid > 0)
        return;
    self->close_link = self->close_qmp = true;
    if (sbx_files_remove_tree (self->dir) == -1)
        sbx_error ("sandbox=%s cannot remove %s: %s", self->id, self->dir, strerror (errno));
    s_fire (self, SBX_VMD_EV_GONE, SBX_OK, NULL);
}

//  The capture or restore at work ends: a snapshot is answered with why.
static void s_end_work (vmd_guest_t *self)
{
    if (self->lc.guest == S_DELETING)
        s_fire (self, SBX_VMD_EV_END, SBX_E_FAILED_PRECONDITION, "the sandbox is being deleted");
    else if (self->lc.capture != SBX_VMD_CAPTURE_IDLE)
        s_fire (self, SBX_VMD_EV_END, SBX_E_FAILED_PRECONDITION,
                "the sandbox became %s during the snapshot%s%s",
                sbx_sandbox_state_name (self->lc.guest), self->reason ? ": " : "",
                self->reason ? self->reason : "");
    else
        s_fire (self, SBX_VMD_EV_END, SBX_OK, NULL);
}

static uint32_t s_restore_ms (vmd_guest_t *self)
{
    return self->env->restore_ms ? self->env->restore_ms : VMD_GUEST_RESTORE_MS;
}

//  QEMU started paused, loading memory.state on fd 3 (the restore takes it from there).
static void s_spawn_from_memory (vmd_guest_t *self)
{
    char *path = s_path (self, "memory.state");
    int fd = path ? open (path, O_RDONLY | O_CLOEXEC) : -1;
    free (path);
    if (fd < 0) {
        s_fire (self, SBX_VMD_EV_FAIL, SBX_E_INTERNAL, "cannot open the memory state: %s",
                strerror (errno));
        return;
    }
    int rc = s_spawn (self, fd);
    close (fd);
    if (rc == 0)
        self->spawn_how = "resume";
    if (rc) {
        char note[900];
        s_death_note (self, "QEMU did not start", note, sizeof note);
        s_fire (self, SBX_VMD_EV_FAIL, SBX_E_INTERNAL, "%s", note);
    }
}

static void s_cont (vmd_guest_t *self)
{
    //  A clone's own states carry all its RAM (they load without the template's memfd):
    //  x-ignore-shared off again (it sticks after an incoming migration).
    if (self->qmp && self->ram_clone)
        vmd_qmp_set_capability (self->qmp, "x-ignore-shared", false, NULL, NULL);
    self->ram_clone = false;
    if (!self->qmp || vmd_qmp_cont (self->qmp, s_on_cont, self))
        s_fire (self, SBX_VMD_EV_CONT_FAILED, SBX_E_INTERNAL,
                "the guest did not continue: no QEMU monitor connection");
}

//  Memory and devices into path through an fd (QEMU's seccomp forbids it to open or
//  spawn anything), QEMU paused first; s_on_migrate and the polls say how it goes. Live
//  (a fork's capture): not paused first; QEMU copies the memory while the guest runs,
//  again what it wrote meanwhile, and pauses it (STOP) only for what is left once that
//  fits S_LIVE_DOWNTIME_MS at the rate it writes, then the devices. It stays paused
//  (postmigrate) until cont, as after a stop.
static void s_migrate_out (vmd_guest_t *self, char *path, mode_t mode, int *fd, bool live)
{
    *fd = path ? open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode) : -1;
    int error = errno;
    if (*fd < 0 || !self->qmp || vmd_qmp_closed (self->qmp)) {
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL, "cannot write %s: %s",
                path ? path : "the memory state",
                *fd < 0 ? strerror (error) : "no QEMU monitor connection");
        free (path);
        return;
    }
    free (path);
    vmd_qmp_set_max_bandwidth (self->qmp, S_MAX_BANDWIDTH, NULL, NULL);
    //  A template's guest: its RAM stays in the memfd, the state holds the devices.
    if (self->ram_shared)
        vmd_qmp_set_capability (self->qmp, "x-ignore-shared", true, s_on_ignore_shared, self);
    if (live) {
        vmd_qmp_execute (self->qmp, "migrate-set-parameters",
                         json_pack ("{s:I}", "downtime-limit", (json_int_t) S_LIVE_DOWNTIME_MS),
                         s_on_paused, self);
        //  MIGRATION events: its end is heard at once (s_on_qmp_event).
        vmd_qmp_set_capability (self->qmp, "events", true, s_on_paused, self);
    } else
        vmd_qmp_stop (self->qmp, s_on_paused, self);
    vmd_qmp_migrate_to_fd (self->qmp, *fd, s_on_migrate, self);
}

static void s_query_migrate (vmd_guest_t *self)
{
    if (!self->qmp || vmd_qmp_query_migrate (self->qmp, s_on_query_migrate, self))
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "saving the guest's memory failed: no QEMU monitor connection");
}

static void s_watch_helper (vmd_guest_t *self);

//  Durable before it gets its final name, a crash leaving no half state file: a child
//  fsyncs memory.state.tmp, renames it and fsyncs the directory (QEMU stays, paused,
//  until it has). Seconds on a busy disk that vmd's loop must not stand still: the broker
//  would take vmd for gone. (mv -T: a directory QEMU's user put at memory.state is not
//  moved into, as rename(2) would refuse it.)
static void s_keep_memory_state (vmd_guest_t *self)
{
    char *tmp = s_path (self, "memory.state.tmp"), *path = s_path (self, "memory.state");
    char *log = s_path (self, "qemu.log");
    char *argv[] = {"sh",
                    "-c",
                    "sync -- \"$1\" && mv -fT -- \"$1\" \"$2\" && sync -- \"$3\"",
                    "sbx-keep-state",
                    tmp,
                    path,
                    self->dir,
                    NULL};
    self->snap.helper = tmp && path && log ? vmd_qemu_helper_spawn (argv, log) : -1;
    free (tmp);
    free (path);
    free (log);
    if (self->snap.helper <= 0) {
        self->snap.helper = 0;
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "cannot start keeping the memory state file");
    } else
        s_watch_helper (self);
}

static void s_unwatch_helper (vmd_guest_t *self);

//  The keeper exited: the state is kept, or the stop fails.
static void s_reap_state_keeper (vmd_guest_t *self)
{
    int status;
    if (self->snap.helper <= 0 ||
        waitpid (self->snap.helper, &status, WNOHANG) != self->snap.helper)
        return;
    self->snap.helper = 0;
    s_unwatch_helper (self);
    if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
        s_fire (self, SBX_VMD_EV_STATE_KEPT, SBX_OK, NULL);
    else {
        char note[900];
        s_death_note (self, "cannot keep the memory state file", note, sizeof note);
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL, "%s", note);
    }
}

//  The stop ended otherwise (a failure, a delete, its deadline): the keeper goes, and
//  its temporary file.
static void s_stop_state_keeper (vmd_guest_t *self)
{
    s_unwatch_helper (self);
    if (self->snap.helper > 0) {
        kill (self->snap.helper, SIGKILL);
        waitpid (self->snap.helper, NULL, 0); //  killed: at once
        self->snap.helper = 0;
    }
    char *tmp = s_path (self, "memory.state.tmp");
    if (tmp)
        unlink (tmp);
    free (tmp);
}

static void s_close_state_file (vmd_guest_t *self)
{
    if (self->state_fd >= 0)
        close (self->state_fd);
    self->state_fd = -1;
}

//  --------------------------------------------------------------------------
//  Snapshot actions: a capture into snapshotd's directory while the guest stays this guest

static char *s_snap_path (vmd_guest_t *self, const char *name)
{
    return zsys_sprintf ("%s/%s", self->snap.dir, name);
}

static void s_take_snapshot (vmd_guest_t *self, const s_asked_t *asked)
{
    assert (asked); //  only the snapshot request's rows take one
    free (self->snap.dir);
    self->snap.dir = strdup (asked->dir);
    self->snap.fn = asked->fn;
    self->snap.arg = asked->arg;
    self->snap.live = asked->live;
    self->snap.stopped_mono = self->snap.paused_ms = 0;
    self->snap.fd = -1;
    self->snap.helper = 0;
    self->snap.disk_bytes = self->snap.memory_bytes = 0;
    self->snap.deadline =
        sbx_clock_mono_ms () + (asked->timeout_ms ? asked->timeout_ms : S_DEFAULT_OP_MS);
    sbx_info ("sandbox=%s snapshot into %s (%s%s)", self->id, asked->dir,
              sbx_sandbox_state_name (self->lc.guest), asked->live ? ", live" : "");
}

static void s_unwatch_helper (vmd_guest_t *self)
{
    if (self->snap.helper_fd < 0)
        return;
    zmq_pollitem_t item = {NULL, self->snap.helper_fd, ZMQ_POLLIN, 0};
    zloop_poller_end (self->env->loop, &item);
    close (self->snap.helper_fd);
    self->snap.helper_fd = -1;
}

//  The copying child (or a stop's keeper) exited: reaped now rather than at the next tick
//  (the guest waits for it, paused).
static int s_on_helper_exit (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    vmd_guest_t *self = arg;
    s_unwatch_helper (self);
    if (self->lc.capture == SBX_VMD_CAPTURE_SNAP_COPYING ||
        self->lc.capture == SBX_VMD_CAPTURE_STOPPED_COPYING ||
        self->lc.capture == SBX_VMD_CAPTURE_SAVE_KEEPING)
        s_fire (self, SBX_VMD_EV_TICK, SBX_OK, NULL);
    return 0;
}

//  Watches the copying child through a pidfd (Linux 5.3); without one, ticks do.
static void s_watch_helper (vmd_guest_t *self)
{
    int fd = (int) syscall (SYS_pidfd_open, self->snap.helper, 0);
    if (fd < 0)
        return;
    zmq_pollitem_t item = {NULL, fd, ZMQ_POLLIN, 0};
    if (zloop_poller (self->env->loop, &item, s_on_helper_exit, self) == 0)
        self->snap.helper_fd = fd;
    else
        close (fd);
}

//  A child copies the overlay (and a stopped guest's memory state) and fsyncs the
//  copies: seconds for a large disk, which the loop must not spend.
static void s_snap_copy (vmd_guest_t *self, bool running)
{
    if (self->snap.fd >= 0)
        close (self->snap.fd); //  QEMU is done with it
    self->snap.fd = -1;
    char *overlay = s_path (self, "overlay.qcow2"), *memory = s_path (self, "memory.state");
    char *disk_tmp = self->snap.dir ? s_snap_path (self, "disk.qcow2.tmp") : NULL;
    char *memory_tmp = self->snap.dir ? s_snap_path (self, "memory.state.tmp") : NULL;
    char *log = s_path (self, "qemu.log");
    char *with_memory[] = {
        "sh",           "-c",    "cp --sparse=always -- \"$1\" \"$2\" && sync -- \"$2\" \"$3\"",
        "sbx-snapshot", overlay, disk_tmp,
        memory_tmp,     NULL};
    //  Live: the guest waits for this copy, not for the disk (s_answer_snapshot syncs once
    //  it runs again); a file system that shares extents (btrfs, XFS) copies none.
    char *live[] = {"cp", "--sparse=always", "--reflink=auto", "--", overlay, disk_tmp, NULL};
    char *stopped[] = {"sh", "-c",
                       //  The memory state is never written in place (a stop renames a new
                       //  one over it): a hard link shares it with the sandbox.
                       "cp --sparse=always -- \"$1\" \"$2\" && { ln -f -- \"$3\" \"$4\" || "
                       "cp --sparse=always -- \"$3\" \"$4\"; } && sync -- \"$2\" \"$4\"",
                       "sbx-snapshot", overlay, disk_tmp, memory, memory_tmp, NULL};
    bool ok = overlay && memory && disk_tmp && memory_tmp && log;
    char **argv = !running ? stopped : self->snap.live ? live : with_memory;
    self->snap.helper = ok ? vmd_qemu_helper_spawn (argv, log) : -1;
    free (overlay);
    free (memory);
    free (disk_tmp);
    free (memory_tmp);
    free (log);
    if (self->snap.helper <= 0) {
        self->snap.helper = 0;
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL,
                "cannot start the copy of the disk");
    } else
        s_watch_helper (self);
}

//  The child copied and fsynced: the files get their final names.
static int s_snap_keep_files (vmd_guest_t *self)
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
            s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL, "cannot keep %s: %s", final[i],
                    strerror (errno));
            return -1;
        }
    }
    int dir = self->snap.live ? -1 : open (self->snap.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync (dir);
        close (dir);
    }
    return 0;
}

static void s_reap_helper (vmd_guest_t *self)
{
    int status;
    if (self->snap.helper <= 0 ||
        waitpid (self->snap.helper, &status, WNOHANG) != self->snap.helper)
        return;
    self->snap.helper = 0;
    s_unwatch_helper (self);
    if (!WIFEXITED (status) || WEXITSTATUS (status) != 0) {
        char note[900];
        s_death_note (self, "copying the disk failed", note, sizeof note);
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_INTERNAL, "%s", note);
    } else if (s_snap_keep_files (self) == 0)
        s_fire (self, SBX_VMD_EV_COPIED, SBX_OK, NULL);
}

//  No partial file stays.
static void s_discard_snapshot (vmd_guest_t *self)
{
    if (self->snap.fd >= 0)
        close (self->snap.fd);
    self->snap.fd = -1;
    s_unwatch_helper (self);
    if (self->snap.helper > 0) {
        kill (self->snap.helper, SIGKILL);
        waitpid (self->snap.helper, NULL, 0); //  killed: at once
        self->snap.helper = 0;
    }
    const char *names[] = {"disk.qcow2.tmp", "memory.state.tmp", "disk.qcow2", "memory.state"};
    for (int i = 0; self->snap.dir && i < 4; i++) {
        char *path = s_snap_path (self, names[i]);
        if (path)
            unlink (path);
        free (path);
    }
}

//  A live capture's files reach the disk while the guest runs again: a child syncs them
//  and their directory, reaped by a later tick. Nobody waits for it (the copies made
//  from them read the page cache); a power cut in those seconds may leave them short.
static void s_sync_later (vmd_guest_t *self)
{
    if (self->snap.syncer > 0)
        return; //  the last one's still at it: the next capture's files wait for no one
    char *disk = s_snap_path (self, "disk.qcow2"), *memory = s_snap_path (self, "memory.state");
    char *log = s_path (self, "qemu.log");
    char *argv[] = {"sync", "--", disk, memory, self->snap.dir, NULL};
    pid_t pid = disk && memory && log ? vmd_qemu_helper_spawn (argv, log) : -1;
    self->snap.syncer = pid > 0 ? pid : 0;
    if (pid <= 0)
        sbx_warn ("sandbox=%s cannot sync the capture in %s", self->id, self->snap.dir);
    free (disk);
    free (memory);
    free (log);
}

static void s_reap_syncer (vmd_guest_t *self)
{
    int status;
    if (self->snap.syncer <= 0 ||
        waitpid (self->snap.syncer, &status, WNOHANG) != self->snap.syncer)
        return;
    self->snap.syncer = 0;
    if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
        sbx_warn ("sandbox=%s the sync of its last capture failed (status %d)", self->id, status);
}

static void s_answer_snapshot (vmd_guest_t *self, const s_event_t *ev)
{
    bool ok = ev->code == SBX_OK;
    const char *message = ok ? NULL : ev->message;
    //  No RESUME seen (cont failed, or the guest went): paused until now.
    if (self->snap.stopped_mono) {
        self->snap.paused_ms = sbx_clock_mono_ms () - self->snap.stopped_mono;
        self->snap.stopped_mono = 0;
    }
    if (ok && self->snap.live && self->snap.dir)
        s_sync_later (self);
    sbx_info ("sandbox=%s snapshot into %s %s%s%s (paused %llu ms)", self->id,
              self->snap.dir ? self->snap.dir : "?", ok ? "done" : "failed", message ? ": " : "",
              message ? message : "", (unsigned long long) self->snap.paused_ms);
    vmd_guest_snapshot_fn *fn = self->snap.fn;
    void *arg = self->snap.arg;
    self->snap.fn = NULL;
    self->snap.deadline = 0;
    zstr_free (&self->snap.dir);
    if (fn)
        fn (self, ev->code, message, self->snap.disk_bytes, self->snap.memory_bytes, arg);
}

//  The snapshot that waited goes first; a waiting stop or resume after it.
static void s_start_waiting (vmd_guest_t *self)
{
    if (self->snap.next_fn) {
        char *dir = self->snap.next_dir;
        vmd_guest_snapshot_fn *next_fn = self->snap.next_fn;
        void *next_arg = self->snap.next_arg;
        self->snap.next_dir = NULL;
        self->snap.next_fn = NULL;
        sbx_err_t err = {0};
        if (vmd_guest_snapshot (self, dir, self->snap.next_live, self->snap.next_timeout, next_fn,
                                next_arg, &err))
            next_fn (self, err.code, err.message, 0, 0, next_arg);
        free (dir);
        if (self->lc.capture != SBX_VMD_CAPTURE_IDLE)
            return; //  it runs: what else waits, waits for it
    }
    if (self->snap.deferred != SBX_VMD_EV__NONE) {
        sbx_vmd_event_t event = self->snap.deferred;
        self->snap.deferred = SBX_VMD_EV__NONE;
        sbx_err_t err = {0};
        if (s_request (self, event, self->snap.deferred_rid, self->snap.deferred_timeout, &err) &&
            self->env->done)
            self->env->done (self, self->snap.deferred_rid, err.code, err.message, self->env->arg);
    }
}

static void s_perform (vmd_guest_t *self, sbx_vmd_action_t action, const s_event_t *ev)
{
    switch (action) {
    case SBX_VMD_DO_ACCEPT:
        s_accept (self, ev);
        break;
    case SBX_VMD_DO_SEND_SETUP:
        s_send_setup (self);
        break;
    case SBX_VMD_DO_CLOSE_AGENT:
        s_close_agent (self);
        break;
    case SBX_VMD_DO_DROP_AGENT:
        self->close_link = true;
        break;
    case SBX_VMD_DO_REPLY:
        s_op_end (self, self->op.code, self->op.code == SBX_OK ? NULL : self->op.message);
        break;
    case SBX_VMD_DO_REPLY_FAILURE:
        if (self->op.pending)
            s_op_end (self, self->op.code != SBX_OK ? self->op.code : SBX_E_INTERNAL,
                      self->op.message);
        else if (self->env->failed)
            self->env->failed (self, self->reason ? self->reason : "failed", self->env->arg);
        break;
    case SBX_VMD_DO_REPORT:
        if (self->env->failed)
            self->env->failed (self, self->reason ? self->reason : "the guest died",
                               self->env->arg);
        break;
    case SBX_VMD_DO_END_WORK:
        s_end_work (self);
        break;
    case SBX_VMD_DO_KILL_QEMU:
        s_kill_qemu (self);
        break;
    case SBX_VMD_DO_QUIT_QEMU:
        s_quit_qemu (self);
        break;
    case SBX_VMD_DO_REMOVE_WHEN_GONE:
        s_remove_when_gone (self);
        break;
    case SBX_VMD_DO_SWEEP:
        self->env->wake (self->env->arg); //  the server drops deleted guests
        break;
    case SBX_VMD_DO_NOTE_QMP_LOST:
        //  Usually QEMU is exiting: give the tick a moment to see how, for the reason.
        snprintf (self->qmp_lost, sizeof self->qmp_lost, "%s", ev->message ? ev->message : "");
        self->qmp_lost_at = sbx_clock_mono_ms ();
        break;
    case SBX_VMD_DO_DROP_MEMORY_STATE: {
        //  The memory lives in QEMU again; the file is only kept while stopped.
        char *path = s_path (self, "memory.state");
        if (path)
            unlink (path);
        free (path);
        break;
    }
    case SBX_VMD_DO_SPAWN_FROM_MEMORY:
        s_spawn_from_memory (self);
        break;
    case SBX_VMD_DO_ARM_RESTORE:
        self->restore_deadline = sbx_clock_mono_ms () + s_restore_ms (self);
        break;
    case SBX_VMD_DO_QUERY_STATUS:
        if (!self->qmp || vmd_qmp_query_status (self->qmp, s_on_query_status, self))
            s_fire (self, SBX_VMD_EV_FAIL, SBX_E_INTERNAL,
                    "could not restore the guest: no QEMU monitor connection");
        break;
    case SBX_VMD_DO_RENEW_FORWARDS:
        s_forwards_renew (self, false);
        break;
    case SBX_VMD_DO_CONT:
        s_cont (self);
        break;
    case SBX_VMD_DO_SAVE_MEMORY:
        s_migrate_out (self, s_path (self, "memory.state.tmp"), 0600, &self->state_fd, false);
        break;
    case SBX_VMD_DO_QUERY_MIGRATE:
        s_query_migrate (self);
        break;
    case SBX_VMD_DO_KEEP_MEMORY_STATE:
        s_keep_memory_state (self);
        break;
    case SBX_VMD_DO_REAP_STATE_KEEPER:
        s_reap_state_keeper (self);
        break;
    case SBX_VMD_DO_STOP_STATE_KEEPER:
        s_stop_state_keeper (self);
        break;
    case SBX_VMD_DO_CLOSE_STATE_FILE:
        s_close_state_file (self);
        break;
    case SBX_VMD_DO_TAKE_SNAPSHOT:
        s_take_snapshot (self, ev->asked);
        break;
    case SBX_VMD_DO_SNAP_MEMORY:
        s_migrate_out (self, self->snap.dir ? s_snap_path (self, "memory.state.tmp") : NULL, 0640,
                       &self->snap.fd, self->snap.live);
        break;
    case SBX_VMD_DO_COPY_DISK:
        s_snap_copy (self, true);
        break;
    case SBX_VMD_DO_COPY_STOPPED:
        s_snap_copy (self, false);
        break;
    case SBX_VMD_DO_REAP_HELPER:
        s_reap_helper (self);
        break;
    case SBX_VMD_DO_DISCARD_SNAPSHOT:
        s_discard_snapshot (self);
        break;
    case SBX_VMD_DO_ANSWER_SNAPSHOT:
        s_answer_snapshot (self, ev);
        break;
    case SBX_VMD_DO_START_WAITING:
        s_start_waiting (self);
        break;
    case SBX_VMD_DO_QUEUE_SNAPSHOT:
        assert (ev->asked);
        free (self->snap.next_dir);
        self->snap.next_dir = strdup (ev->asked->dir);
        self->snap.next_live = ev->asked->live;
        self->snap.next_timeout = ev->asked->timeout_ms;
        self->snap.next_fn = ev->asked->fn;
        self->snap.next_arg = ev->asked->arg;
        sbx_info ("sandbox=%s snapshot into %s waits for the one in progress", self->id,
                  ev->asked->dir);
        break;
    case SBX_VMD_DO_DEFER_REQUEST:
        assert (ev->asked);
        self->snap.deferred = ev->event;
        self->snap.deferred_rid = ev->asked->rid;
        self->snap.deferred_timeout = ev->asked->timeout_ms;
        sbx_info ("sandbox=%s rid=%llu %s waits for the snapshot in progress", self->id,
                  (unsigned long long) ev->asked->rid, sbx_vmd_event_name (ev->event));
        break;
    case SBX_VMD_DO_CANCEL_MIGRATION:
        if (self->qmp)
            vmd_qmp_migrate_cancel (self->qmp, NULL, NULL);
        break;
    case SBX_VMD_DO_ANSWER_DONE:
        assert (ev->asked); //  only request rows answer
        sbx_info ("sandbox=%s rid=%llu %s: it is %s already", self->id,
                  (unsigned long long) ev->asked->rid, sbx_vmd_event_name (ev->event),
                  sbx_sandbox_state_name (self->lc.guest));
        if (self->env->done)
            self->env->done (self, ev->asked->rid, SBX_OK, NULL, self->env->arg);
        break;
    case SBX_VMD_DO__COUNT:
        break;
    }
}

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

//  --------------------------------------------------------------------------
//  The tick: QEMU's exit, lost monitors, polls, deadlines, as events

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
        char note[900];
        s_death_note (self, what, note, sizeof note);
        s_fire (self, SBX_VMD_EV_QEMU_GONE, SBX_E_INTERNAL, "%s", note);
    }
    if (self->qmp_lost_at && self->pid > 0 && now >= self->qmp_lost_at + 1000) {
        //  QEMU still there without its monitor: we can't drive it any more.
        char note[900];
        s_death_note (self, self->qmp_lost, note, sizeof note);
        self->qmp_lost_at = 0;
        s_fire (self, SBX_VMD_EV_MONITOR_LOST, SBX_E_INTERNAL, "%s", note);
    }
    if (self->pid > 0 && self->kill_at && now >= self->kill_at)
        s_fire (self, SBX_VMD_EV_KILL_DUE, SBX_OK, NULL);
    if (self->qmp && vmd_qmp_ready (self->qmp))
        s_fire (self, SBX_VMD_EV_POLL, SBX_OK, NULL);
    s_fire (self, SBX_VMD_EV_TICK, SBX_OK, NULL);
    s_reap_syncer (self);

    if (self->snap.deadline && now >= self->snap.deadline)
        s_fire (self, SBX_VMD_EV_CAPTURE_FAILED, SBX_E_TIMEOUT, "the snapshot did not end in time");
    if (self->lc.restore != SBX_VMD_RESTORE_IDLE && now >= self->restore_deadline) {
        //  Failing kills QEMU (a create is deleted, a resume ends in error); vmd_server
        //  boots a template's sandbox cold instead.
        bool loading = self->lc.restore == SBX_VMD_RESTORE_LOADING ||
                       self->lc.restore == SBX_VMD_RESTORE_POLLING;
        char note[900], what[300];
        snprintf (what, sizeof what,
                  "the restore did not end within %g s (%s); QEMU (pid %d) is killed",
                  s_restore_ms (self) / 1000.0,
                  loading ? "QEMU was still loading the memory state"
                          : "the agent did not answer after it",
                  (int) self->pid);
        s_death_note (self, what, note, sizeof note);
        sbx_warn ("sandbox=%s %s", self->id, what);
        s_fire (self, SBX_VMD_EV_FAIL, SBX_E_TIMEOUT, "%s", note);
    }
    //  (A delete has no deadline: it ends on its own, SIGKILL at worst.)
    if (self->op.pending && now >= self->op.deadline && self->lc.guest != S_DELETING) {
        char note[900], what[200];
        snprintf (what, sizeof what, "no answer within %.0f s", self->op.timeout / 1000.0);
        if (self->lc.guest == S_CREATING || self->lc.guest == S_RESUMING)
            snprintf (what, sizeof what, "the guest's agent did not answer within %.0f s",
                      self->op.timeout / 1000.0);
        s_death_note (self, what, note, sizeof note);
        s_fire (self, SBX_VMD_EV_FAIL, SBX_E_TIMEOUT, "%s", note);
    }
    return 0;
}

void vmd_guest_set_ram (vmd_guest_t *self, int fd, bool shared)
{
    self->ram_fd = fd;
    self->ram_shared = fd >= 0 && shared;
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
//  Construction

bool vmd_guest_id_valid (const char *id)
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
    if (!vmd_guest_id_valid (id))
        return NULL;
    vmd_guest_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->env = env;
    self->id = strdup (id);
    vmd_qemu_mac (id, self->mac);
    self->dir = zsys_sprintf ("%s/%s", env->vms_dir, id);
    self->state_fd = -1;
    self->ram_fd = -1;
    self->snap.fd = -1;
    self->snap.helper_fd = -1;
    self->snap.deferred = SBX_VMD_EV__NONE;
    self->exit_status = -1;
    self->tick = zloop_timer (env->loop, S_TICK_MS, 0, s_on_tick, self);
    if (!self->id || !self->dir || self->tick == -1)
        vmd_guest_destroy (&self);
    return self;
}

const char *vmd_guest_env_image (const vmd_guest_env_t *env, sbx_sandbox_type_t type)
{
    return type > 0 && type < VMD_GUEST_TYPES && env->type_image[type] ? env->type_image[type]
                                                                       : env->image_dir;
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
    self->image_dir = strdup (vmd_guest_env_image (env, type));
    self->type = type;
    self->no_network = no_network;
    self->lc = vmd_lifecycle_start (S_CREATING);
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
    //  Not through a link (QEMU's user owns the directory), nor a FIFO that never ends.
    int fd = path ? open (path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    struct stat fst;
    json_t *root = NULL;
    if (fd >= 0 && fstat (fd, &fst) == 0 && S_ISREG (fst.st_mode))
        root = json_loadfd (fd, 0, &jerr);
    else
        snprintf (jerr.text, sizeof jerr.text, "%s",
                  fd >= 0 ? "not a regular file" : strerror (errno));
    if (fd >= 0)
        close (fd);
    const char *sid = NULL, *hostname = NULL, *type = NULL, *state = NULL, *image = NULL,
               *reason = NULL;
    int no_network = 0;
    sbx_sandbox_state_t was = SBX_SANDBOX_STATE__UNSET;
    if (!root ||
        json_unpack_ex (root, &jerr, 0, "{s:s, s:s, s:s, s?b, s:s, s:s, s?s}", "sandbox_id", &sid,
                        "hostname", &hostname, "type", &type, "no_network", &no_network, "state",
                        &state, "image", &image, "reason", &reason) ||
        !streq (sid, id) || sbx_sandbox_type_from_name (type, &self->type) ||
        sbx_sandbox_state_from_name (state, &was)) {
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

    //  Only root can give a directory away: its owner is the uid vmd gave the guest.
    struct stat st;
    if (env->uid_count && stat (self->dir, &st) == 0 && st.st_uid >= env->uid_first &&
        st.st_uid - env->uid_first < env->uid_count)
        self->uid = st.st_uid;
    pid_t pid = vmd_qemu_adopt (self->dir);
    char *state_path = s_path (self, "memory.state");
    bool saved = state_path && access (state_path, F_OK) == 0;
    free (state_path);
    self->lc = vmd_lifecycle_start (was);
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
                //  migrating still: the capture cancels that and continues it.
                if (was == S_READY)
                    s_fire (self, SBX_VMD_EV_RECOVER, SBX_OK, NULL);
            }
        } else {
            //  Caught mid-way: nobody waits for that answer any more.
            kill (pid, SIGKILL);
            why = "vmd restarted while the guest was changing state";
        }
    } else if (was == S_STOPPED || (was == S_STOPPING && saved))
        self->lc.guest = S_STOPPED;
    else if (was == S_READY || was == S_CREATING || was == S_RESUMING || was == S_STOPPING)
        why = "its QEMU exited while vmd was not running";
    if (was == S_DELETING) {
        //  The delete was under way: finish it (its answer is owed to no one now).
        self->lc.guest = S_DELETING;
        self->kill_at = sbx_clock_mono_ms ();
    } else if (was == S_STOPPING && self->lc.guest == S_STOPPED) {
        s_save (self);
    } else if (why) {
        free (self->reason);
        char note[900];
        s_death_note (self, why, note, sizeof note);
        self->reason = strdup (note);
        self->lc.guest = S_ERROR;
        s_save (self);
    }
    sbx_info ("sandbox=%s found in state %s (was %s)%s%s", id,
              sbx_sandbox_state_name (self->lc.guest), sbx_sandbox_state_name (was),
              self->pid ? ", QEMU re-adopted" : "", self->reason ? "" : "");
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
    s_unwatch_helper (self);
    s_reap_syncer (self);
    if (self->snap.syncer > 0) //  init reaps it once this vmd is gone; rare: the capture
        sbx_info ("sandbox=%s goes while its last capture is being synced (pid %d)", self->id,
                  (int) self->snap.syncer); //  was a moment ago
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
//  Operations: requests, refused here when the lifecycle does not take them

static int s_refuse (vmd_guest_t *self, const char *verb, sbx_err_t *err)
{
    return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "cannot %s sandbox %s: it is %s%s%s", verb,
                        self->id, sbx_sandbox_state_name (self->lc.guest), self->reason ? ": " : "",
                        self->reason ? self->reason : "");
}

static int s_fire_request (vmd_guest_t *self, sbx_vmd_event_t event, const s_asked_t *asked)
{
    s_event_t ev = {event, SBX_OK, NULL, asked};
    return s_apply (self, &ev);
}

int vmd_guest_create (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    sbx_vmd_event_t event = self->origin_dir && self->origin_restore ? SBX_VMD_EV_CREATE_FROM_MEMORY
                                                                     : SBX_VMD_EV_CREATE;
    vmd_lifecycle_step_t step;
    if (vmd_lifecycle_next (&self->lc, event, &step))
        return s_refuse (self, "create", err);
    if (mkdir (self->dir, 0700) == -1)
        return sbx_err_set (err, errno == EEXIST ? SBX_E_CONFLICT : SBX_E_INTERNAL,
                            "cannot make %s: %s", self->dir, strerror (errno));
    s_save (self);
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.image_dir = self->image_dir;
    config.dir = self->dir;
    char *backing = self->origin_dir ? zsys_sprintf ("%s/disk.qcow2", self->origin_dir) : NULL;
    config.backing = backing;
    int incoming = -1;
    if (event == SBX_VMD_EV_CREATE_FROM_MEMORY) {
        char *memory = zsys_sprintf ("%s/memory.state", self->origin_dir);
        incoming = memory ? open (memory, O_RDONLY | O_CLOEXEC) : -1;
        free (memory);
    }
    //  ≈ 20 ms of qemu-img: short enough for the loop (there is no async variant).
    int overlay = vmd_qemu_overlay_create (&config);
    free (backing);
    if (event == SBX_VMD_EV_CREATE_FROM_MEMORY && incoming < 0) {
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
        //  A booted template lives under DIR/templates, a snapshot under DIR/snapshots.
        self->spawn_how = event != SBX_VMD_EV_CREATE_FROM_MEMORY     ? "cold"
                          : strstr (self->origin_dir, "/snapshots/") ? "snapshot"
                                                                     : "template";
        //  Restoring: the restore waits for the memory to load, continues, sets it up.
        s_asked_t asked = {.rid = rid, .timeout_ms = timeout_ms};
        s_fire_request (self, event, &asked);
        return 0;
    }
    if (incoming >= 0)
        close (incoming);
    if (self->pid > 0)
        kill (self->pid, SIGKILL), waitpid (self->pid, NULL, 0); //  just spawned: ms
    self->pid = 0;
    vmd_agentlink_destroy (&self->link);
    vmd_qmp_destroy (&self->qmp);
    sbx_files_remove_tree (self->dir);
    return -1;
}

//  A stop, resume or delete; during a capture a stop or resume waits for its end (one
//  at a time).
static int s_request (vmd_guest_t *self, sbx_vmd_event_t event, uint64_t rid, uint32_t timeout_ms,
                      sbx_err_t *err)
{
    vmd_lifecycle_step_t step;
    if (vmd_lifecycle_next (&self->lc, event, &step))
        return s_refuse (self, sbx_vmd_event_name (event), err);
    if (vmd_lifecycle_does (&step, SBX_VMD_DO_DEFER_REQUEST) &&
        self->snap.deferred != SBX_VMD_EV__NONE)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "sandbox %s: a snapshot is being taken and a request waits for it; "
                            "retry in a moment",
                            self->id);
    s_asked_t asked = {.rid = rid, .timeout_ms = timeout_ms};
    s_fire_request (self, event, &asked);
    return 0;
}

int vmd_guest_stop (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    return s_request (self, SBX_VMD_EV_STOP, rid, timeout_ms, err);
}

int vmd_guest_resume (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    return s_request (self, SBX_VMD_EV_RESUME, rid, timeout_ms, err);
}

int vmd_guest_delete (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err)
{
    return s_request (self, SBX_VMD_EV_DELETE, rid, timeout_ms, err);
}

int vmd_guest_snapshot (vmd_guest_t *self, const char *dir, bool live, uint32_t timeout_ms,
                        vmd_guest_snapshot_fn *fn, void *arg, sbx_err_t *err)
{
    vmd_lifecycle_step_t step;
    if (vmd_lifecycle_next (&self->lc, SBX_VMD_EV_SNAPSHOT, &step))
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "cannot snapshot sandbox %s: it is %s (ready or stopped only)",
                            self->id, sbx_sandbox_state_name (self->lc.guest));
    struct stat st;
    if (vmd_lifecycle_does (&step, SBX_VMD_DO_QUEUE_SNAPSHOT)) {
        //  One waits (say, a user's right after the automatic one of a stop).
        if (self->snap.next_fn || !dir)
            return sbx_err_set (
                err, SBX_E_FAILED_PRECONDITION,
                "sandbox %s: snapshots of it are being taken; retry when they ended", self->id);
    } else if (self->lc.guest == S_READY && (!self->qmp || vmd_qmp_closed (self->qmp)))
        return sbx_err_set (err, SBX_E_UNAVAILABLE, "sandbox %s: no QEMU monitor connection",
                            self->id);
    else if (!dir || dir[0] != '/' || strstr (dir, "..") || stat (dir, &st) ||
             !S_ISDIR (st.st_mode))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "snapshot directory %s is not usable",
                            dir ? dir : "(none)");
    //  Under TCG a live capture pauses the guest first, as a save does: copies made from
    //  live captures under TCG were found corrupt twice in loaded test runs (a guest
    //  oops right after the restore, a segfault in a copy), never from paused ones; QEMU
    //  7.2's dirty tracking of TCG's writes during precopy is the suspect. KVM keeps the
    //  live capture (its dirty log is the kernel's).
    if (live && !vmd_qemu_kvm_usable ()) {
        sbx_debug ("sandbox=%s: a live capture pauses first under TCG", self->id);
        live = false;
    }
    s_asked_t asked = {.timeout_ms = timeout_ms, .dir = dir, .live = live, .fn = fn, .arg = arg};
    s_fire_request (self, SBX_VMD_EV_SNAPSHOT, &asked);
    return 0;
}

int vmd_guest_agent (vmd_guest_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                     vmd_agentlink_reply_fn *fn, void *arg, sbx_err_t *err)
{
    if (self->lc.guest != S_READY || !self->link) {
        sbx_msg_destroy (request_p);
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s%s", self->id,
                            sbx_sandbox_state_name (self->lc.guest), self->reason ? ": " : "",
                            self->reason ? self->reason : "");
    }
    vmd_agentlink_request (self->link, request_p, timeout_ms, fn, arg);
    return 0;
}

uint64_t vmd_guest_paused_ms (vmd_guest_t *self)
{
    return self->snap.paused_ms;
}

const char *vmd_guest_hostname (vmd_guest_t *self)
{
    return self->hostname;
}

bool vmd_guest_no_network (vmd_guest_t *self)
{
    return self->no_network;
}

int vmd_guest_taken (vmd_guest_t *self)
{
    struct stat st;
    char *memory = s_path (self, "memory.state");
    bool whole = memory && stat (memory, &st) == 0 && S_ISREG (st.st_mode);
    free (memory);
    if (!whole)
        return -1;
    self->lc = vmd_lifecycle_start (S_STOPPED);
    s_save (self);
    return 0;
}

void vmd_guest_set_uid (vmd_guest_t *self, uid_t uid)
{
    self->uid = uid;
}

uid_t vmd_guest_uid (vmd_guest_t *self)
{
    return self->uid;
}

const char *vmd_guest_id (vmd_guest_t *self)
{
    return self->id;
}

sbx_sandbox_state_t vmd_guest_state (vmd_guest_t *self)
{
    return self->lc.guest;
}

sbx_sandbox_type_t vmd_guest_type (vmd_guest_t *self)
{
    return self->type;
}

pid_t vmd_guest_pid (vmd_guest_t *self)
{
    return self->pid;
}

const char *vmd_guest_reason (vmd_guest_t *self)
{
    return self->reason;
}
