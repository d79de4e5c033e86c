/*  cli_supervisor - see cli_supervisor.h */
#include "cli_supervisor.h"
#include "sbx_clock.h"
#include "sbx_log.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

//  The descriptor a child gets the ready pipe on, and the variable that says so.
#define READY_FD 3
static char s_ready_env[] = "SBX_READY_FD=3";

typedef enum {
    STATE_STOPPED,  //  no process: its turn has not come, or it was stopped
    STATE_STARTING, //  spawned, has not said "ready" yet
    STATE_READY,    //  said "ready"
    STATE_BACKOFF,  //  exited; waits out the backoff before the next spawn
    STATE_STOPPING, //  sent SIGTERM or SIGKILL; waits for the exit
    STATE_COUNT
} state_t;

static const char *s_state_names[STATE_COUNT] = {"stopped", "starting", "ready", "backoff",
                                                 "stopping"};

typedef enum {
    EVENT_SPAWN,  //  its turn in the start order has come
    EVENT_READY,  //  it wrote "ready\n" on its pipe
    EVENT_EXITED, //  waitpid reaped it
    EVENT_TIMER,  //  its one timer fired (what it meant depends on the state)
    EVENT_STOP,   //  its turn in the stop order has come
    EVENT_KILL,   //  the supervisor was told to stop a second time
    EVENT_COUNT
} event_t;

static const char *s_event_names[EVENT_COUNT] = {"spawn", "ready", "exited",
                                                 "timer", "stop",  "kill"};

typedef struct {
    cli_supervisor_t *owner;
    char *name;
    char **argv;
    char *log_path;
    char *log_env; //  "SBX_LOG_FILE=<log_path>": the daemon opens its log itself
    state_t state;
    pid_t pid;           //  the running process, 0 when none
    pid_t last_pid;      //  the process that exited last
    int wait_status;     //  its waitpid status, -1 when unknown
    int ready_fd;        //  read end of the ready pipe, -1 when closed
    char line[8];        //  the line being read from the pipe
    size_t line_len;     //  may exceed sizeof line: then the line is not "ready"
    int timer_id;        //  its one pending timer, -1 when none
    bool ever_ready;     //  for the start order and the ready callback
    bool timed_out;      //  killed for not getting ready: explains its exit
    unsigned restarts;   //  for the status file and the log
    unsigned backoff;    //  msecs before the next restart
    uint64_t spawn_mono; //  when it was spawned, for "ready after N ms"
    uint64_t started_ms; //  the same on the wall clock, for the status file
    off_t log_start;     //  the size of its log when it was spawned
    ino_t log_ino;       //  and which file that was (a rotation makes a new one)
    bool hup_pending;    //  its log was reopened while it started: SIGHUP it once ready
    unsigned failed;     //  exits in a row before it got ready
} child_t;

struct _cli_supervisor_t {
    char *log_dir;
    char *status_path;
    child_t **children;
    size_t count;
    size_t next;       //  the next child in the start order
    zloop_t *loop;     //  set by start
    int signal_fd;     //  -1 until start
    sigset_t old_mask; //  restored by destroy
    bool stopping;
    bool done; //  stopped: every child is gone
    bool ready_fired;
    int end_timer_id; //  ends the loop once done
    uint64_t started_ms;
    uint64_t started_mono;
    unsigned start_timeout;
    unsigned stop_grace;
    unsigned backoff_min, backoff_max, backoff_reset;
    cli_supervisor_ready_fn *ready_fn;
    void *ready_arg;
    cli_supervisor_event_fn *event_fn;
    void *event_arg;
    unsigned give_up; //  failed starts in a row that end it all; 0: never
    char *failure;    //  why it gave up, or NULL
    int give_up_timer_id;
    bool logs_reopen;       //  the children reopen their logs on SIGHUP (set_logs)
    uint64_t log_max_bytes; //  rotate a log this big; 0: never
    unsigned log_keep;      //  rotated files kept: <log>.1 .. <log>.<keep>
    unsigned log_check_ms;  //  how often sizes are checked
    int log_timer_id;
};

static void s_dispatch (child_t *child, event_t event);
static void s_stop_next (cli_supervisor_t *self);
static void s_begin_stop (cli_supervisor_t *self);

//  --------------------------------------------------------------------------
//  Small helpers

//  Creates path and its missing parents, like mkdir -p.
static int s_mkdir_p (const char *path, mode_t mode)
{
    char *copy = strdup (path);
    if (!copy)
        return -1;
    int rc = 0;
    for (char *slash = copy + 1; rc == 0; slash++) {
        if (*slash != '/' && *slash != 0)
            continue;
        char saved = *slash;
        *slash = 0;
        if (mkdir (copy, mode) == -1 && errno != EEXIST)
            rc = -1;
        *slash = saved;
        if (saved == 0)
            break;
    }
    free (copy);
    struct stat st;
    return rc == 0 && stat (path, &st) == 0 && S_ISDIR (st.st_mode) ? 0 : -1;
}

//  Moves fd above 3 so the child's dup2 calls onto 0..3 cannot overwrite a source
//  before it is used. Keeps close-on-exec.
static int s_fd_above_3 (int fd)
{
    if (fd < 0 || fd > READY_FD)
        return fd;
    int moved = fcntl (fd, F_DUPFD_CLOEXEC, READY_FD + 1);
    close (fd);
    return moved;
}

static void s_describe_exit (child_t *child, char *buf, size_t size)
{
    int status = child->wait_status;
    if (child->timed_out)
        snprintf (buf, size, "was not ready within %.3g s and was killed",
                  child->owner->start_timeout / 1000.0);
    else if (status == -1)
        snprintf (buf, size, "is gone (exit status unknown)");
    else if (WIFEXITED (status))
        snprintf (buf, size, "exited with status %d", WEXITSTATUS (status));
    else if (WIFSIGNALED (status)) {
        const char *abbrev = sigabbrev_np (WTERMSIG (status));
        snprintf (buf, size, "killed by signal %d (SIG%s)", WTERMSIG (status),
                  abbrev ? abbrev : "?");
    } else
        snprintf (buf, size, "ended with wait status 0x%x", (unsigned) status);
}

//  --------------------------------------------------------------------------
//  Status file: rewritten whole after every change, so readers never see half of it.

static int s_write_all (int fd, const char *data, size_t size)
{
    while (size > 0) {
        ssize_t n = write (fd, data, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        size -= (size_t) n;
    }
    return 0;
}

static void s_status_write (cli_supervisor_t *self)
{
    if (!self->status_path)
        return;
    json_t *daemons = json_array ();
    for (size_t i = 0; i < self->count; i++) {
        child_t *child = self->children[i];
        //  No pid is null, not 0: kill (0, 0) would test our whole process group.
        json_array_append_new (
            daemons, json_pack ("{s:s, s:o, s:b, s:s, s:I, s:I, s:s}", "name", child->name, "pid",
                                child->pid ? json_integer (child->pid) : json_null (), "ready",
                                child->state == STATE_READY, "state", s_state_names[child->state],
                                "restarts", (json_int_t) child->restarts, "started_ms",
                                (json_int_t) child->started_ms, "log", child->log_path));
    }
    json_t *root =
        json_pack ("{s:I, s:I, s:b, s:o}", "supervisor_pid", (json_int_t) getpid (), "started_ms",
                   (json_int_t) self->started_ms, "stopping", self->stopping, "daemons", daemons);
    char *text = root ? json_dumps (root, JSON_INDENT (2)) : NULL;
    json_decref (root);

    char tmp[PATH_MAX];
    int fd = -1;
    int rc = -1;
    if (text && snprintf (tmp, sizeof tmp, "%s.tmp", self->status_path) < (int) sizeof tmp) {
        fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0 && s_write_all (fd, text, strlen (text)) == 0 &&
            s_write_all (fd, "\n", 1) == 0 && fsync (fd) == 0)
            rc = 0;
        if (fd >= 0 && close (fd) == -1)
            rc = -1;
        if (rc == 0)
            rc = rename (tmp, self->status_path);
    }
    if (rc == -1)
        sbx_warn ("cannot write status file %s: %s", self->status_path, strerror (errno));
    free (text);
}

//  --------------------------------------------------------------------------
//  Per-child resources: the one timer and the ready pipe

static int s_on_child_timer (zloop_t *loop, int timer_id, void *arg);
static int s_on_ready_pipe (zloop_t *loop, zmq_pollitem_t *item, void *arg);

static void s_timer_clear (child_t *child)
{
    if (child->timer_id != -1)
        zloop_timer_end (child->owner->loop, child->timer_id);
    child->timer_id = -1;
}

static void s_timer_set (child_t *child, unsigned msecs)
{
    s_timer_clear (child);
    child->timer_id = zloop_timer (child->owner->loop, msecs, 1, s_on_child_timer, child);
    if (child->timer_id == -1)
        sbx_error ("%s: cannot set a timer", child->name);
}

static void s_pipe_close (child_t *child)
{
    if (child->ready_fd == -1)
        return;
    zmq_pollitem_t item = {NULL, child->ready_fd, ZMQ_POLLIN, 0};
    zloop_poller_end (child->owner->loop, &item);
    close (child->ready_fd);
    child->ready_fd = -1;
}

//  Each change of state goes out to the status file and the event callback. Actions
//  arm a state's timer only after this, so that the fsync here cannot make a timer
//  look shorter than it is to whoever watches the status or the events.
static void s_set_state (child_t *child, state_t state)
{
    cli_supervisor_t *self = child->owner;
    child->state = state;
    s_status_write (self);
    if (self->event_fn) {
        bool exited = state == STATE_BACKOFF || state == STATE_STOPPED;
        cli_supervisor_event_t event = {
            .name = child->name,
            .state = s_state_names[state],
            .pid = child->pid ? child->pid : child->last_pid,
            .wait_status = exited ? child->wait_status : -1,
            .restarts = child->restarts,
        };
        self->event_fn (&event, self->event_arg);
    }
}

//  --------------------------------------------------------------------------
//  Spawning: everything that allocates happens before fork, because the child of a
//  threaded process may only make async-signal-safe calls until it execs.

static char **s_child_env (child_t *child)
{
    size_t count = 0;
    while (environ[count])
        count++;
    char **envp = calloc (count + 3, sizeof *envp);
    if (!envp)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < count; i++)
        if (strncmp (environ[i], "SBX_READY_FD=", 13) != 0 &&
            strncmp (environ[i], "SBX_LOG_FILE=", 13) != 0)
            envp[j++] = environ[i];
    envp[j++] = s_ready_env;
    envp[j] = child->log_env;
    return envp;
}

static void s_child_exec (char **argv, char **envp, int null_fd, int log_fd, int ready_fd,
                          long max_fd)
{
    //  Handlers do not survive exec but ignored signals and the mask do: the daemon
    //  must start as if from a clean shell. Dispositions first, so nothing pending
    //  can run a handler of ours once unblocked.
    struct sigaction dfl;
    memset (&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction (sig, &dfl, NULL);
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    //  A supervisor killed outright (SIGKILL) must not leave daemons behind that the
    //  next `sbx up` would collide with: they get SIGTERM and stop cleanly. (vmd's
    //  guests run in sessions of their own and are not affected.)
    prctl (PR_SET_PDEATHSIG, SIGTERM);

    if (dup2 (null_fd, STDIN_FILENO) == -1 || dup2 (log_fd, STDOUT_FILENO) == -1 ||
        dup2 (log_fd, STDERR_FILENO) == -1 || dup2 (ready_fd, READY_FD) == -1)
        _exit (126);
    if (close_range (READY_FD + 1, ~0U, 0) == -1)
        for (long fd = READY_FD + 1; fd < max_fd; fd++)
            close (fd);
    execve (argv[0], argv, envp);
    static const char prefix[] = "sbx supervisor: cannot execute ";
    ssize_t rc = write (STDERR_FILENO, prefix, sizeof prefix - 1);
    rc = write (STDERR_FILENO, argv[0], strlen (argv[0]));
    rc = write (STDERR_FILENO, "\n", 1);
    (void) rc;
    _exit (127);
}

static int s_spawn (child_t *child)
{
    cli_supervisor_t *self = child->owner;
    int log_fd = open (child->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    int null_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
    int pipe_fd[2] = {-1, -1};
    char **envp = s_child_env (child);
    pid_t pid = -1;
    const char *what = "fork";
    struct stat st;
    if (log_fd != -1) {
        child->log_start = lseek (log_fd, 0, SEEK_END);
        child->log_ino = fstat (log_fd, &st) == 0 ? st.st_ino : 0;
    }
    if (log_fd == -1)
        what = child->log_path;
    else if (null_fd == -1)
        what = "/dev/null";
    else if (pipe2 (pipe_fd, O_CLOEXEC) == -1)
        what = "pipe";
    else if (!envp)
        what = "environment";
    else {
        log_fd = s_fd_above_3 (log_fd);
        null_fd = s_fd_above_3 (null_fd);
        pipe_fd[1] = s_fd_above_3 (pipe_fd[1]);
        long max_fd = sysconf (_SC_OPEN_MAX);
        if (log_fd != -1 && null_fd != -1 && pipe_fd[1] != -1) {
            pid = fork ();
            if (pid == 0)
                s_child_exec (child->argv, envp, null_fd, log_fd, pipe_fd[1], max_fd);
        }
    }
    int saved_errno = errno;
    free (envp);
    if (log_fd != -1)
        close (log_fd);
    if (null_fd != -1)
        close (null_fd);
    if (pipe_fd[1] != -1)
        close (pipe_fd[1]);
    if (pid == -1) {
        if (pipe_fd[0] != -1)
            close (pipe_fd[0]);
        sbx_error ("cannot start %s: %s: %s", child->name, what, strerror (saved_errno));
        return -1;
    }
    child->pid = pid;
    child->spawn_mono = sbx_clock_mono_ms ();
    child->started_ms = sbx_clock_now_ms ();
    child->timed_out = false;
    child->hup_pending = false;
    child->line_len = 0;
    child->ready_fd = pipe_fd[0];
    fcntl (child->ready_fd, F_SETFL, O_NONBLOCK);
    zmq_pollitem_t item = {NULL, child->ready_fd, ZMQ_POLLIN, 0};
    if (zloop_poller (self->loop, &item, s_on_ready_pipe, child) == 0)
        //  EOF shows as POLLERR; the handler must see it to close the pipe.
        zloop_poller_set_tolerant (self->loop, &item);
    else
        sbx_error ("%s: cannot poll its ready pipe", child->name);
    sbx_info ("started %s (pid %d): %s", child->name, (int) pid, child->argv[0]);
    return 0;
}

//  An error line of log.format = json, as its text would read: the context fields
//  (key=value, in their order) and the message. Other lines leave out alone.
static void s_last_error_json (const char *line, char *out, size_t size)
{
    json_t *root = json_loads (line, 0, NULL);
    const char *level = json_string_value (json_object_get (root, "level"));
    if (level && streq (level, "error")) {
        size_t len = 0;
        out[0] = 0;
        const char *key;
        json_t *value;
        json_object_foreach (root, key, value)
        {
            if (streq (key, "ts") || streq (key, "level") || streq (key, "daemon") ||
                streq (key, "pid") || streq (key, "msg"))
                continue;
            char *text = json_is_string (value) ? strdup (json_string_value (value))
                                                : json_dumps (value, JSON_ENCODE_ANY);
            int n = snprintf (out + len, size - len, "%s=%s ",
                              streq (key, "request_id") ? "rid" : key, text ? text : "");
            free (text);
            if (n > 0)
                len = len + (size_t) n < size ? len + (size_t) n : size - 1;
        }
        const char *msg = json_string_value (json_object_get (root, "msg"));
        snprintf (out + len, size - len, "%s", msg ? msg : "");
    }
    json_decref (root);
}

//  The last ERROR line the child logged since it was spawned, without its time and
//  name prefix, in out ("" when none): so that `sbx up` says why a daemon keeps
//  exiting, not only that it does.
//  A log rotated since then is a new file, all of it written since: read it from
//  its start.
static void s_last_error (child_t *child, char *out, size_t size)
{
    out[0] = 0;
    int fd = open (child->log_path, O_RDONLY | O_CLOEXEC);
    if (fd == -1)
        return;
    char tail[8192];
    off_t end = lseek (fd, 0, SEEK_END);
    struct stat st;
    off_t start = child->log_start;
    if (fstat (fd, &st) == -1 || st.st_ino != child->log_ino || end < start)
        start = 0;
    off_t from = end - (off_t) sizeof tail + 1 > start ? end - (off_t) sizeof tail + 1 : start;
    ssize_t got = end > from ? pread (fd, tail, (size_t) (end - from), from) : 0;
    close (fd);
    if (got <= 0)
        return;
    tail[got] = 0;
    for (char *line = tail, *next; line && *line; line = next) {
        next = strchr (line, '\n');
        if (next)
            *next++ = 0;
        if (*line == '{') {
            s_last_error_json (line, out, size);
            continue;
        }
        const char *level = strstr (line, " ERROR ");
        const char *text = level ? strstr (level, "] ") : NULL;
        if (text)
            snprintf (out, size, "%s", text + 2);
    }
}

static void s_schedule_restart (child_t *child, const char *why)
{
    cli_supervisor_t *self = child->owner;
    unsigned delay = child->backoff;
    child->backoff = delay > self->backoff_max / 2 ? self->backoff_max : delay * 2;
    child->restarts++;
    char pid[24] = "";
    if (child->last_pid)
        snprintf (pid, sizeof pid, " (pid %d)", (int) child->last_pid);
    char error[600];
    s_last_error (child, error, sizeof error);
    sbx_warn ("%s %s%s%s%s; restarting in %g s (restart #%u)", child->name, why, pid,
              *error ? ": " : "", error, delay / 1000.0, child->restarts);
    s_set_state (child, STATE_BACKOFF);
    s_timer_set (child, delay);
}

//  --------------------------------------------------------------------------
//  Actions: what an event does to a child in a given state (the table below)

static void a_nop (child_t *child)
{
    (void) child;
}

//  Its turn in the start order, or its backoff is over.
static void a_spawn (child_t *child)
{
    if (child->owner->stopping) {
        s_timer_clear (child);
        s_set_state (child, STATE_STOPPED);
    } else if (s_spawn (child) == 0) {
        s_set_state (child, STATE_STARTING);
        s_timer_set (child, child->owner->start_timeout);
    } else {
        child->last_pid = 0;
        child->wait_status = -1;
        s_schedule_restart (child, "could not be started");
    }
}

static void a_ready (child_t *child)
{
    //  One line is all a child may say: the pipe has done its job.
    s_pipe_close (child);
    child->ever_ready = true;
    child->failed = 0;
    //  Its log was reopened while it started, before it could take a SIGHUP.
    if (child->hup_pending)
        kill (child->pid, SIGHUP);
    child->hup_pending = false;
    sbx_info ("%s ready after %llu ms (pid %d)", child->name,
              (unsigned long long) (sbx_clock_mono_ms () - child->spawn_mono), (int) child->pid);
    s_set_state (child, STATE_READY);
    //  Ready long enough means healthy: the timer then resets the backoff.
    s_timer_set (child, child->owner->backoff_reset);
}

static void a_stopped (child_t *child)
{
    char why[96];
    s_describe_exit (child, why, sizeof why);
    s_pipe_close (child);
    s_timer_clear (child);
    sbx_info ("%s stopped: %s (pid %d)", child->name, why, (int) child->last_pid);
    s_set_state (child, STATE_STOPPED);
}

static int s_on_give_up (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    cli_supervisor_t *self = arg;
    self->give_up_timer_id = 0;
    s_begin_stop (self);
    return 0;
}

//  A crash or an exit on its own; while stopping, that is just one fewer to stop. One
//  that never got ready that many times in a row fails the same way each time (a port
//  in use, a bad setting, a missing file): restarting it for ever helps nobody.
static void a_exited (child_t *child)
{
    cli_supervisor_t *self = child->owner;
    if (self->stopping) {
        a_stopped (child);
        return;
    }
    char why[96];
    s_describe_exit (child, why, sizeof why);
    s_pipe_close (child);
    s_timer_clear (child);
    if (child->state == STATE_STARTING && self->give_up && ++child->failed >= self->give_up) {
        char error[600];
        s_last_error (child, error, sizeof error);
        free (self->failure);
        self->failure = zsys_sprintf ("%s %s %u times in a row before it was ready%s%s",
                                      child->name, why, child->failed, *error ? ": " : "", error);
        sbx_error ("%s; giving up", self->failure);
        s_set_state (child, STATE_STOPPED);
        //  From the loop, not from inside this child's action.
        if (self->loop && !self->give_up_timer_id)
            self->give_up_timer_id = zloop_timer (self->loop, 1, 1, s_on_give_up, self);
        return;
    }
    s_schedule_restart (child, why);
}

//  The start timeout: it stays STARTING until its exit, which restarts it.
static void a_start_timeout (child_t *child)
{
    sbx_warn ("%s (pid %d) not ready within %g s; killing it", child->name, (int) child->pid,
              child->owner->start_timeout / 1000.0);
    child->timed_out = true;
    kill (child->pid, SIGKILL);
}

static void a_stable (child_t *child)
{
    child->backoff = child->owner->backoff_min;
}

static void a_term (child_t *child)
{
    sbx_info ("stopping %s (pid %d): SIGTERM, SIGKILL in %g s", child->name, (int) child->pid,
              child->owner->stop_grace / 1000.0);
    kill (child->pid, SIGTERM);
    s_set_state (child, STATE_STOPPING);
    s_timer_set (child, child->owner->stop_grace);
}

static void a_kill (child_t *child)
{
    sbx_warn ("killing %s (pid %d)", child->name, (int) child->pid);
    kill (child->pid, SIGKILL);
    s_timer_clear (child);
    s_set_state (child, STATE_STOPPING);
}

static void a_grace_over (child_t *child)
{
    sbx_warn ("%s (pid %d) still runs %g s after SIGTERM", child->name, (int) child->pid,
              child->owner->stop_grace / 1000.0);
    a_kill (child);
}

//  Not running, so stopping it only cancels the pending restart.
static void a_cancel (child_t *child)
{
    s_timer_clear (child);
    s_set_state (child, STATE_STOPPED);
}

typedef void (action_fn) (child_t *child);

//  A child's whole lifecycle. Events a state cannot receive, or need not react to,
//  are a_nop: a late "ready" from a child being stopped, a stop for one never started.
// clang-format off
static action_fn *const s_actions[STATE_COUNT][EVENT_COUNT] = {
    //                  spawn    ready    exited     timer            stop      kill
    [STATE_STOPPED]  = {a_spawn, a_nop,   a_nop,     a_nop,           a_nop,    a_nop},
    [STATE_STARTING] = {a_nop,   a_ready, a_exited,  a_start_timeout, a_term,   a_kill},
    [STATE_READY]    = {a_nop,   a_nop,   a_exited,  a_stable,        a_term,   a_kill},
    [STATE_BACKOFF]  = {a_nop,   a_nop,   a_nop,     a_spawn,         a_cancel, a_cancel},
    [STATE_STOPPING] = {a_nop,   a_nop,   a_stopped, a_grace_over,    a_nop,    a_kill},
};
// clang-format on

static void s_dispatch (child_t *child, event_t event)
{
    sbx_debug ("%s: %s while %s", child->name, s_event_names[event], s_state_names[child->state]);
    s_actions[child->state][event](child);
}

//  --------------------------------------------------------------------------
//  The supervisor: start order, stop order, and the loop handlers

//  After a child got ready: start the next in order, and tell the caller once all are.
static void s_after_ready (cli_supervisor_t *self)
{
    if (self->stopping)
        return;
    if (self->next < self->count && self->children[self->next - 1]->ever_ready)
        s_dispatch (self->children[self->next++], EVENT_SPAWN);
    if (self->ready_fired)
        return;
    for (size_t i = 0; i < self->count; i++)
        if (!self->children[i]->ever_ready)
            return;
    self->ready_fired = true;
    sbx_info ("all %zu daemons ready after %llu ms", self->count,
              (unsigned long long) (sbx_clock_mono_ms () - self->started_mono));
    if (self->ready_fn)
        self->ready_fn (self, self->ready_arg);
}

static int s_on_end (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return -1;
}

//  Stops children one at a time from the last: the broker, started first, goes last,
//  so the others can still reach it while they shut down.
static void s_stop_next (cli_supervisor_t *self)
{
    for (size_t i = self->count; i-- > 0;) {
        child_t *child = self->children[i];
        if (child->state == STATE_STOPPING)
            return;
        if (child->state != STATE_STOPPED) {
            s_dispatch (child, EVENT_STOP);
            if (child->state == STATE_STOPPING)
                return;
        }
    }
    if (self->done)
        return;
    self->done = true;
    sbx_info ("all daemons stopped");
    //  Our handlers may run from the caller's code (cli_supervisor_stop), so the loop is
    //  ended by a timer of our own rather than by whichever handler got here.
    if (self->loop)
        self->end_timer_id = zloop_timer (self->loop, 1, 1, s_on_end, self);
}

static void s_begin_stop (cli_supervisor_t *self)
{
    if (self->stopping)
        return;
    self->stopping = true;
    s_status_write (self);
    //  Those waiting for a restart have nothing to stop; drop them now so no restart
    //  fires while the others are being stopped.
    for (size_t i = 0; i < self->count; i++)
        if (self->children[i]->state == STATE_BACKOFF)
            s_dispatch (self->children[i], EVENT_STOP);
    s_stop_next (self);
}

//  Reaps our own children by pid, not waitpid (-1): it must not steal the exit status
//  of a process some other part of `sbx up` started.
static void s_reap (cli_supervisor_t *self)
{
    for (size_t i = 0; i < self->count; i++) {
        child_t *child = self->children[i];
        if (child->pid <= 0)
            continue;
        int status;
        pid_t rc = waitpid (child->pid, &status, WNOHANG);
        if (rc == 0)
            continue;
        if (rc == -1) {
            sbx_warn ("%s (pid %d): waitpid: %s", child->name, (int) child->pid, strerror (errno));
            status = -1;
        }
        child->last_pid = child->pid;
        child->pid = 0;
        child->wait_status = status;
        s_dispatch (child, EVENT_EXITED);
    }
    if (self->stopping)
        s_stop_next (self);
}

//  --------------------------------------------------------------------------
//  Logs: reopened on SIGHUP (an outside logrotate renamed them), rotated by size

//  Tells a child to reopen its log: now if it runs its loop, once ready if it starts
//  (before its loop runs, SIGHUP would end it).
static void s_child_reopen (child_t *child)
{
    if (child->state == STATE_READY)
        kill (child->pid, SIGHUP);
    else if (child->state == STATE_STARTING)
        child->hup_pending = true;
}

static void s_reopen_logs (cli_supervisor_t *self)
{
    if (sbx_log_file ())
        sbx_log_reopen ();
    for (size_t i = 0; i < self->count; i++)
        s_child_reopen (self->children[i]);
}

//  <path> becomes <path>.1, <path>.1 becomes .2 and so on; the one past keep goes.
static int s_rotate (const char *path, unsigned keep)
{
    char from[PATH_MAX], to[PATH_MAX];
    for (unsigned i = keep; i > 1; i--) {
        snprintf (from, sizeof from, "%s.%u", path, i - 1);
        snprintf (to, sizeof to, "%s.%u", path, i);
        if (rename (from, to) == -1 && errno != ENOENT)
            return -1;
    }
    snprintf (to, sizeof to, "%s.1", path);
    return rename (path, to);
}

static bool s_too_big (cli_supervisor_t *self, const char *path)
{
    struct stat st;
    return stat (path, &st) == 0 && (uint64_t) st.st_size >= self->log_max_bytes;
}

//  A starting child is left alone: its fd still points at the file it was spawned
//  with, where `sbx up` looks for its last error should it fail. Its log waits for
//  the next check.
static int s_on_log_check (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    cli_supervisor_t *self = arg;
    const char *own = sbx_log_file ();
    if (own && s_too_big (self, own)) {
        if (s_rotate (own, self->log_keep) == 0 && sbx_log_reopen () == 0)
            sbx_info ("rotated %s", own);
        else
            sbx_warn ("cannot rotate %s: %s", own, strerror (errno));
    }
    for (size_t i = 0; i < self->count; i++) {
        child_t *child = self->children[i];
        if (child->state == STATE_STARTING || child->state == STATE_STOPPING ||
            !s_too_big (self, child->log_path))
            continue;
        if (s_rotate (child->log_path, self->log_keep) == -1) {
            sbx_warn ("cannot rotate %s: %s", child->log_path, strerror (errno));
            continue;
        }
        sbx_info ("rotated %s", child->log_path);
        s_child_reopen (child);
    }
    return 0;
}

static int s_on_signal (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    cli_supervisor_t *self = (cli_supervisor_t *) arg;
    struct signalfd_siginfo info;
    bool child_exited = false;
    while (read (self->signal_fd, &info, sizeof info) == (ssize_t) sizeof info) {
        int sig = (int) info.ssi_signo;
        if (sig == SIGCHLD)
            child_exited = true; //  one reap covers them all: SIGCHLDs coalesce anyway
        else if (sig == SIGHUP && self->logs_reopen) {
            //  Said after the reopen: in the new file, where whoever rotated looks.
            s_reopen_logs (self);
            sbx_info ("SIGHUP from pid %u: logs reopened", info.ssi_pid);
        } else if (sig == SIGHUP)
            sbx_info ("SIGHUP from pid %u ignored", info.ssi_pid);
        else if (!self->stopping) {
            sbx_info ("SIG%s from pid %u: stopping all daemons", sigabbrev_np (sig), info.ssi_pid);
            s_begin_stop (self);
        } else {
            sbx_warn ("SIG%s again: killing all daemons", sigabbrev_np (sig));
            for (size_t i = 0; i < self->count; i++)
                s_dispatch (self->children[i], EVENT_KILL);
        }
    }
    if (child_exited)
        s_reap (self);
    return 0;
}

static int s_on_ready_pipe (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    child_t *child = (child_t *) arg;
    char buf[64];
    ssize_t n = read (child->ready_fd, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        //  EOF without "ready": not ready; the start timeout decides what happens.
        sbx_debug ("%s closed its ready pipe without saying ready", child->name);
        s_pipe_close (child);
        return 0;
    }
    bool ready = false;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            ready |= child->line_len == 5 && memcmp (child->line, "ready", 5) == 0;
            child->line_len = 0;
        } else if (child->line_len++ < sizeof child->line)
            child->line[child->line_len - 1] = buf[i];
    }
    if (ready) {
        s_dispatch (child, EVENT_READY);
        if (child->state == STATE_READY)
            s_after_ready (child->owner);
    }
    return 0;
}

static int s_on_child_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    child_t *child = (child_t *) arg;
    //  A timer cancelled during this loop pass may still fire in it: ignore it.
    if (timer_id != child->timer_id)
        return 0;
    child->timer_id = -1; //  one-shot: zloop drops it after we return
    s_dispatch (child, EVENT_TIMER);
    return 0;
}

//  --------------------------------------------------------------------------
//  Public API

cli_supervisor_t *cli_supervisor_new (const char *log_dir, const char *status_path)
{
    assert (log_dir);
    //  czmq's SIGINT/SIGTERM handlers would set zsys_interrupted and end every zloop;
    //  here those signals are read from a signalfd instead.
    zsys_handler_set (NULL);
    if (s_mkdir_p (log_dir, 0750) == -1) {
        sbx_error ("cannot create log directory %s: %s", log_dir, strerror (errno));
        return NULL;
    }
    cli_supervisor_t *self = (cli_supervisor_t *) calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->log_dir = strdup (log_dir);
    self->status_path = status_path ? strdup (status_path) : NULL;
    self->signal_fd = -1;
    self->end_timer_id = -1;
    self->start_timeout = 60000;
    self->stop_grace = 10000;
    self->backoff_min = 250;
    self->backoff_max = 30000;
    self->backoff_reset = 60000;
    self->log_check_ms = 1000;
    if (!self->log_dir || (status_path && !self->status_path))
        cli_supervisor_destroy (&self);
    return self;
}

static void s_child_destroy (child_t **child_p)
{
    child_t *child = *child_p;
    if (!child)
        return;
    free (child->name);
    if (child->argv)
        for (char **arg = child->argv; *arg; arg++)
            free (*arg);
    free (child->argv);
    free (child->log_path);
    free (child->log_env);
    free (child);
    *child_p = NULL;
}

//  Blocking, for destroy only: the loop no longer runs, so wait with sigtimedwait on
//  the still-blocked SIGCHLD.
static void s_terminate_all (cli_supervisor_t *self)
{
    size_t running = 0;
    for (size_t i = self->count; i-- > 0;)
        if (self->children[i]->pid > 0) {
            kill (self->children[i]->pid, SIGTERM);
            running++;
        }
    if (running == 0)
        return;
    sbx_info ("stopping %zu daemons still running", running);
    sigset_t chld;
    sigemptyset (&chld);
    sigaddset (&chld, SIGCHLD);
    uint64_t deadline = sbx_clock_mono_ms () + self->stop_grace;
    bool killed = false;
    while (true) {
        running = 0;
        for (size_t i = 0; i < self->count; i++) {
            child_t *child = self->children[i];
            int status;
            if (child->pid <= 0)
                continue;
            pid_t rc = waitpid (child->pid, &status, killed ? 0 : WNOHANG);
            if (rc == 0 || (rc == -1 && errno == EINTR)) {
                running++;
                continue;
            }
            child->last_pid = child->pid;
            child->pid = 0;
            child->wait_status = rc == child->last_pid ? status : -1;
            char why[96];
            s_describe_exit (child, why, sizeof why);
            sbx_info ("%s stopped: %s (pid %d)", child->name, why, (int) child->last_pid);
        }
        uint64_t now = sbx_clock_mono_ms ();
        if (running == 0)
            break;
        if (now >= deadline) {
            for (size_t i = 0; i < self->count; i++)
                if (self->children[i]->pid > 0) {
                    sbx_warn ("killing %s (pid %d)", self->children[i]->name,
                              (int) self->children[i]->pid);
                    kill (self->children[i]->pid, SIGKILL);
                }
            killed = true; //  the next pass waits for each
            continue;
        }
        struct timespec wait = {(time_t) ((deadline - now) / 1000),
                                (long) ((deadline - now) % 1000) * 1000000};
        sigtimedwait (&chld, NULL, &wait);
    }
}

void cli_supervisor_destroy (cli_supervisor_t **self_p)
{
    assert (self_p);
    cli_supervisor_t *self = *self_p;
    if (!self)
        return;
    s_terminate_all (self);
    for (size_t i = 0; i < self->count; i++) {
        child_t *child = self->children[i];
        if (self->loop) {
            s_pipe_close (child);
            s_timer_clear (child);
        }
        child->state = STATE_STOPPED;
    }
    if (self->loop) {
        self->stopping = true;
        s_status_write (self);
        if (self->end_timer_id != -1)
            zloop_timer_end (self->loop, self->end_timer_id);
        if (self->give_up_timer_id)
            zloop_timer_end (self->loop, self->give_up_timer_id);
        if (self->log_timer_id)
            zloop_timer_end (self->loop, self->log_timer_id);
        zmq_pollitem_t item = {NULL, self->signal_fd, ZMQ_POLLIN, 0};
        zloop_poller_end (self->loop, &item);
    }
    if (self->signal_fd != -1) {
        //  A signal that came after the stop has been answered by it: drop it rather
        //  than let the restored mask deliver it.
        struct signalfd_siginfo info;
        while (read (self->signal_fd, &info, sizeof info) == (ssize_t) sizeof info)
            ;
        close (self->signal_fd);
        pthread_sigmask (SIG_SETMASK, &self->old_mask, NULL);
    }
    for (size_t i = 0; i < self->count; i++)
        s_child_destroy (&self->children[i]);
    free (self->children);
    free (self->log_dir);
    free (self->status_path);
    free (self->failure);
    free (self);
    *self_p = NULL;
}

static bool s_name_valid (const char *name)
{
    if (!name || !*name || streq (name, ".") || streq (name, "..") || strlen (name) > 64)
        return false;
    for (const char *c = name; *c; c++)
        if (!(isalnum ((unsigned char) *c) || *c == '-' || *c == '_' || *c == '.'))
            return false;
    return true;
}

int cli_supervisor_add (cli_supervisor_t *self, const char *name, char *const argv[])
{
    assert (self);
    assert (argv);
    if (self->loop || !s_name_valid (name) || !argv[0]) {
        sbx_error ("cannot add daemon '%s'", name ? name : "");
        return -1;
    }
    for (size_t i = 0; i < self->count; i++)
        if (streq (self->children[i]->name, name)) {
            sbx_error ("daemon %s added twice", name);
            return -1;
        }
    //  A typo in a path is cheaper to report now than as a restart loop later.
    if (access (argv[0], X_OK) == -1) {
        sbx_error ("daemon %s: cannot execute %s: %s", name, argv[0], strerror (errno));
        return -1;
    }
    child_t **children = realloc (self->children, (self->count + 1) * sizeof *children);
    if (!children)
        return -1;
    self->children = children;
    child_t *child = (child_t *) calloc (1, sizeof *child);
    if (!child)
        return -1;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    child->owner = self;
    child->name = strdup (name);
    child->argv = (char **) calloc (argc + 1, sizeof (char *));
    bool ok = child->name && child->argv;
    for (size_t i = 0; ok && i < argc; i++)
        ok = (child->argv[i] = strdup (argv[i])) != NULL;
    ok = ok && asprintf (&child->log_path, "%s/%s.log", self->log_dir, name) != -1;
    ok = ok && asprintf (&child->log_env, "SBX_LOG_FILE=%s", child->log_path) != -1;
    if (!ok) {
        child->log_env = NULL;
        s_child_destroy (&child);
        return -1;
    }
    child->state = STATE_STOPPED;
    child->wait_status = -1;
    child->ready_fd = -1;
    child->timer_id = -1;
    child->backoff = self->backoff_min;
    self->children[self->count++] = child;
    return 0;
}

void cli_supervisor_set_start_timeout (cli_supervisor_t *self, unsigned msecs)
{
    assert (self);
    self->start_timeout = msecs;
}

void cli_supervisor_set_stop_grace (cli_supervisor_t *self, unsigned msecs)
{
    assert (self);
    self->stop_grace = msecs;
}

void cli_supervisor_set_backoff (cli_supervisor_t *self, unsigned min_msecs, unsigned max_msecs,
                                 unsigned reset_msecs)
{
    assert (self);
    assert (min_msecs > 0 && min_msecs <= max_msecs);
    self->backoff_min = min_msecs;
    self->backoff_max = max_msecs;
    self->backoff_reset = reset_msecs;
    for (size_t i = 0; i < self->count; i++)
        self->children[i]->backoff = min_msecs;
}

void cli_supervisor_set_ready_fn (cli_supervisor_t *self, cli_supervisor_ready_fn *fn, void *arg)
{
    assert (self);
    self->ready_fn = fn;
    self->ready_arg = arg;
}

void cli_supervisor_set_event_fn (cli_supervisor_t *self, cli_supervisor_event_fn *fn, void *arg)
{
    assert (self);
    self->event_fn = fn;
    self->event_arg = arg;
}

int cli_supervisor_start (cli_supervisor_t *self, zloop_t *loop)
{
    assert (self);
    assert (loop);
    if (self->loop || self->count == 0 || self->stopping)
        return -1;
    sigset_t set;
    sigemptyset (&set);
    sigaddset (&set, SIGCHLD);
    sigaddset (&set, SIGTERM);
    sigaddset (&set, SIGINT);
    sigaddset (&set, SIGHUP);
    //  Blocked, these stay pending until the signalfd read takes them, in the loop.
    if (pthread_sigmask (SIG_BLOCK, &set, &self->old_mask) != 0)
        return -1;
    self->signal_fd = signalfd (-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    zmq_pollitem_t item = {NULL, self->signal_fd, ZMQ_POLLIN, 0};
    if (self->signal_fd == -1 || zloop_poller (loop, &item, s_on_signal, self) == -1) {
        sbx_error ("cannot watch signals: %s", strerror (errno));
        if (self->signal_fd != -1)
            close (self->signal_fd);
        self->signal_fd = -1;
        pthread_sigmask (SIG_SETMASK, &self->old_mask, NULL);
        return -1;
    }
    self->loop = loop;
    self->started_ms = sbx_clock_now_ms ();
    self->started_mono = sbx_clock_mono_ms ();
    sbx_info ("supervising %zu daemons; logs in %s", self->count, self->log_dir);
    s_status_write (self);
    if (self->logs_reopen && self->log_max_bytes)
        self->log_timer_id = zloop_timer (loop, self->log_check_ms, 0, s_on_log_check, self);
    self->next = 1;
    s_dispatch (self->children[0], EVENT_SPAWN);
    return 0;
}

void cli_supervisor_set_logs (cli_supervisor_t *self, uint64_t max_bytes, unsigned keep)
{
    assert (self);
    self->logs_reopen = true;
    self->log_max_bytes = max_bytes;
    self->log_keep = keep ? keep : 1;
}

void cli_supervisor_set_give_up (cli_supervisor_t *self, unsigned failed_starts)
{
    self->give_up = failed_starts;
}

const char *cli_supervisor_failure (cli_supervisor_t *self)
{
    return self->failure;
}

void cli_supervisor_stop (cli_supervisor_t *self)
{
    assert (self);
    if (!self->loop) {
        self->stopping = true;
        self->done = true;
        return;
    }
    s_begin_stop (self);
}

//  --------------------------------------------------------------------------
//  Self-test: real children (small shell scripts), driven only by the loop

typedef struct {
    char name[16];
    char state[16];
    int pid;
    int wait_status;
    unsigned restarts;
    uint64_t mono;
} test_event_t;

typedef struct _test_t test_t;
struct _test_t {
    char dir[256];
    char log_dir[300];
    char status_path[300];
    zloop_t *loop;
    cli_supervisor_t *sup;
    test_event_t events[256];
    size_t count;
    int ready_calls;
    bool deadline_hit;
    void (*on_event) (test_t *test, const test_event_t *event);
    void (*on_ready) (test_t *test);
};

static void s_test_event_fn (const cli_supervisor_event_t *event, void *arg)
{
    test_t *test = (test_t *) arg;
    assert (test->count < sizeof test->events / sizeof test->events[0]);
    test_event_t *copy = &test->events[test->count++];
    snprintf (copy->name, sizeof copy->name, "%s", event->name);
    snprintf (copy->state, sizeof copy->state, "%s", event->state);
    copy->pid = event->pid;
    copy->wait_status = event->wait_status;
    copy->restarts = event->restarts;
    copy->mono = sbx_clock_mono_ms ();
    if (test->on_event)
        test->on_event (test, copy);
}

static void s_test_ready_fn (cli_supervisor_t *self, void *arg)
{
    test_t *test = (test_t *) arg;
    assert (self == test->sup);
    test->ready_calls++;
    if (test->on_ready)
        test->on_ready (test);
}

static int s_test_deadline (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    ((test_t *) arg)->deadline_hit = true;
    return -1;
}

static int s_test_stop (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    cli_supervisor_stop (((test_t *) arg)->sup);
    return 0;
}

//  Index of the nth (from 0) event for name in state, or -1.
static int s_test_find (test_t *test, const char *name, const char *state, int nth)
{
    for (size_t i = 0; i < test->count; i++)
        if (streq (test->events[i].name, name) && streq (test->events[i].state, state) &&
            nth-- == 0)
            return (int) i;
    return -1;
}

static int s_test_tally (test_t *test, const char *name, const char *state)
{
    int tally = 0;
    while (s_test_find (test, name, state, tally) != -1)
        tally++;
    return tally;
}

static bool s_test_killed_by (int wait_status, int sig)
{
    return wait_status != -1 && WIFSIGNALED (wait_status) && WTERMSIG (wait_status) == sig;
}

static void s_test_setup (test_t *test, const char *root, const char *scenario)
{
    memset (test, 0, sizeof *test);
    snprintf (test->dir, sizeof test->dir, "%s/%s", root, scenario);
    snprintf (test->log_dir, sizeof test->log_dir, "%s/logs", test->dir);
    snprintf (test->status_path, sizeof test->status_path, "%s/status.json", test->dir);
    assert (mkdir (test->dir, 0700) == 0);
    test->loop = zloop_new ();
    assert (test->loop);
    test->sup = cli_supervisor_new (test->log_dir, test->status_path);
    assert (test->sup);
    cli_supervisor_set_event_fn (test->sup, s_test_event_fn, test);
    cli_supervisor_set_ready_fn (test->sup, s_test_ready_fn, test);
}

//  Writes <dir>/<name>.sh and adds it as a child, with arg as $1 when given.
static void s_test_add (test_t *test, const char *name, const char *body, const char *arg)
{
    char path[PATH_MAX + 16];
    snprintf (path, sizeof path, "%s/%s.sh", test->dir, name);
    FILE *file = fopen (path, "w");
    assert (file);
    fprintf (file, "#!/bin/sh\n%s\n", body);
    fclose (file);
    assert (chmod (path, 0755) == 0);
    char *argv[] = {path, (char *) arg, NULL};
    assert (cli_supervisor_add (test->sup, name, argv) == 0);
}

//  Runs the loop until the supervisor ends it, within a deadline far above need.
static void s_test_run (test_t *test)
{
    zloop_timer (test->loop, 8000, 1, s_test_deadline, test);
    assert (cli_supervisor_start (test->sup, test->loop) == 0);
    int rc = zloop_start (test->loop);
    assert (!test->deadline_hit);
    assert (rc == -1);
}

static void s_test_teardown (test_t *test)
{
    cli_supervisor_destroy (&test->sup);
    assert (test->sup == NULL);
    cli_supervisor_destroy (&test->sup); //  twice is harmless
    zloop_destroy (&test->loop);
}

static char *s_test_slurp (const char *path)
{
    FILE *file = fopen (path, "r");
    assert (file);
    static char text[8192];
    size_t size = fread (text, 1, sizeof text - 1, file);
    text[size] = 0;
    fclose (file);
    return text;
}

//  Checks the status file: every daemon listed in order, in the given states.
static json_t *s_test_status (test_t *test, const char *const names[], const char *const states[],
                              size_t count)
{
    json_error_t error;
    json_t *root = json_load_file (test->status_path, 0, &error);
    assert (root);
    assert (json_integer_value (json_object_get (root, "supervisor_pid")) == getpid ());
    assert (json_integer_value (json_object_get (root, "started_ms")) > 1700000000000LL);
    json_t *daemons = json_object_get (root, "daemons");
    assert (json_array_size (daemons) == count);
    for (size_t i = 0; i < count; i++) {
        json_t *daemon = json_array_get (daemons, i);
        assert (streq (json_string_value (json_object_get (daemon, "name")), names[i]));
        assert (streq (json_string_value (json_object_get (daemon, "state")), states[i]));
        bool running = !streq (states[i], "stopped") && !streq (states[i], "backoff");
        assert (json_is_integer (json_object_get (daemon, "pid")) == running);
        assert (json_is_null (json_object_get (daemon, "pid")) == !running);
        assert (json_is_true (json_object_get (daemon, "ready")) == streq (states[i], "ready"));
        const char *log = json_string_value (json_object_get (daemon, "log"));
        char expected[PATH_MAX + 80];
        snprintf (expected, sizeof expected, "%s/%s.log", test->log_dir, names[i]);
        assert (log && streq (log, expected));
    }
    return root;
}

//  Scenario "order": ordered start, one ready callback, a crashing child restarted with
//  a growing backoff while the others keep their pids, logs, status, reverse stop.

static const char *const s_order_names[] = {"first", "second", "third"};

//  What a child inherits, seen from /proc once it runs `sleep`: descriptors 0-3 only
//  (the log on 1 and 2, the ready pipe on 3), SBX_READY_FD=3, no blocked or ignored
//  signals.
static void s_check_child_inheritance (test_t *test, int pid, const char *name)
{
    char path[64], link[PATH_MAX];
    int fds = 0;
    for (int fd = 0; fd < 64; fd++) {
        snprintf (path, sizeof path, "/proc/%d/fd/%d", pid, fd);
        ssize_t size = readlink (path, link, sizeof link - 1);
        if (size < 0)
            continue;
        link[size] = 0;
        fds++;
        if (fd == 1 || fd == 2) {
            char log[PATH_MAX + 80];
            snprintf (log, sizeof log, "%s/%s.log", test->log_dir, name);
            assert (streq (link, log));
        }
        if (fd == 3)
            assert (strncmp (link, "pipe:", 5) == 0);
    }
    assert (fds == 4);
    snprintf (path, sizeof path, "/proc/%d/environ", pid);
    FILE *file = fopen (path, "r");
    assert (file);
    char env[8192];
    size_t size = fread (env, 1, sizeof env - 1, file);
    fclose (file);
    char log_env[PATH_MAX + 100];
    snprintf (log_env, sizeof log_env, "SBX_LOG_FILE=%s/%s.log", test->log_dir, name);
    int found = 0;
    for (size_t at = 0; at < size; at += strlen (env + at) + 1)
        found += streq (env + at, "SBX_READY_FD=3") + streq (env + at, log_env);
    assert (found == 2);
    snprintf (path, sizeof path, "/proc/%d/status", pid);
    file = fopen (path, "r");
    assert (file);
    char line[256];
    int masks = 0;
    while (fgets (line, sizeof line, file))
        if (strncmp (line, "SigBlk:", 7) == 0 || strncmp (line, "SigIgn:", 7) == 0) {
            assert (strspn (line + 7, "\t0") == strlen (line + 7) - 1);
            masks++;
        }
    fclose (file);
    assert (masks == 2);
}

static void s_order_on_ready (test_t *test)
{
    (void) test;
    //  SIGHUP is logged and otherwise ignored: the counts of starts below show it.
    raise (SIGHUP);
}

static void s_order_on_event (test_t *test, const test_event_t *event)
{
    if (!streq (event->name, "second") || !streq (event->state, "ready") || event->restarts != 2)
        return;
    //  The status file is written before the event goes out: it shows this state.
    const char *const states[] = {"ready", "ready", "ready"};
    json_t *root = s_test_status (test, s_order_names, states, 3);
    assert (json_is_false (json_object_get (root, "stopping")));
    json_t *second = json_array_get (json_object_get (root, "daemons"), 1);
    assert (json_integer_value (json_object_get (second, "restarts")) == 2);
    assert (json_integer_value (json_object_get (second, "pid")) == event->pid);
    json_decref (root);
    int first_pid = test->events[s_test_find (test, "first", "starting", 0)].pid;
    s_check_child_inheritance (test, first_pid, "first");
    //  Stop as `kill <supervisor>` would.
    raise (SIGTERM);
}

static void s_test_order (const char *root)
{
    test_t test;
    s_test_setup (&test, root, "order");
    test.on_event = s_order_on_event;
    test.on_ready = s_order_on_ready;
    s_test_add (&test, "first",
                "echo hello-out\necho hello-err >&2\nsleep 0.2\necho ready >&3\nexec sleep 30",
                NULL);
    char counter[PATH_MAX + 16];
    snprintf (counter, sizeof counter, "%s/second.count", test.dir);
    s_test_add (&test, "second",
                "n=$(cat \"$1\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n >\"$1\"\n"
                "echo \"second run $n\"\necho ready >&3\n"
                "if [ $n -le 2 ]; then sleep 0.3; kill -9 $$; fi\nexec sleep 30",
                counter);
    s_test_add (&test, "third", "echo ready >&3\nexec sleep 30", NULL);
    s_test_run (&test);

    //  Each started only once the one before was ready; all ready once reported once.
    assert (s_test_find (&test, "first", "ready", 0) <
            s_test_find (&test, "second", "starting", 0));
    assert (s_test_find (&test, "second", "ready", 0) <
            s_test_find (&test, "third", "starting", 0));
    assert (test.ready_calls == 1);

    //  second crashed twice and was restarted after 0.25 s, then 0.5 s; the others
    //  were started once and kept their pids throughout.
    assert (s_test_tally (&test, "second", "starting") == 3);
    assert (s_test_tally (&test, "first", "starting") == 1);
    assert (s_test_tally (&test, "third", "starting") == 1);
    for (int k = 0; k < 2; k++) {
        test_event_t *crash = &test.events[s_test_find (&test, "second", "backoff", k)];
        test_event_t *respawn = &test.events[s_test_find (&test, "second", "starting", k + 1)];
        assert (s_test_killed_by (crash->wait_status, SIGKILL));
        assert (crash->restarts == (unsigned) k + 1);
        uint64_t delay = respawn->mono - crash->mono;
        //  Lower bounds only: a loaded machine adds delay, never removes it.
        assert (delay >= (k == 0 ? 250u : 500u));
    }
    int first_pid = test.events[s_test_find (&test, "first", "starting", 0)].pid;
    assert (test.events[s_test_find (&test, "first", "stopped", 0)].pid == first_pid);

    //  Stopped one at a time, in reverse order, each by its SIGTERM.
    assert (s_test_find (&test, "third", "stopped", 0) <
            s_test_find (&test, "second", "stopping", 0));
    assert (s_test_find (&test, "second", "stopped", 0) <
            s_test_find (&test, "first", "stopping", 0));
    for (size_t i = 0; i < 3; i++) {
        int stopped = s_test_find (&test, s_order_names[i], "stopped", 0);
        assert (stopped != -1);
        assert (s_test_killed_by (test.events[stopped].wait_status, SIGTERM));
    }
    const char *const stopped[] = {"stopped", "stopped", "stopped"};
    json_t *status = s_test_status (&test, s_order_names, stopped, 3);
    assert (json_is_true (json_object_get (status, "stopping")));
    json_decref (status);

    //  Children's stdout and stderr went to their logs, appended across restarts.
    char path[PATH_MAX + 16];
    snprintf (path, sizeof path, "%s/first.log", test.log_dir);
    char *text = s_test_slurp (path);
    assert (strstr (text, "hello-out") && strstr (text, "hello-err"));
    snprintf (path, sizeof path, "%s/second.log", test.log_dir);
    text = s_test_slurp (path);
    assert (strstr (text, "second run 1") && strstr (text, "second run 3"));
    s_test_teardown (&test);
}

//  Scenario "grace": a child that ignores SIGTERM is killed once the grace is over,
//  and only then is the one before it stopped.

static void s_grace_on_ready (test_t *test)
{
    (void) test;
    raise (SIGTERM);
}

static void s_test_grace (const char *root)
{
    test_t test;
    s_test_setup (&test, root, "grace");
    test.on_ready = s_grace_on_ready;
    cli_supervisor_set_stop_grace (test.sup, 300);
    s_test_add (&test, "steady", "echo ready >&3\nexec sleep 30", NULL);
    //  An ignored signal stays ignored across exec: sleep itself ignores SIGTERM.
    s_test_add (&test, "stubborn", "trap '' TERM\necho ready >&3\nexec sleep 30", NULL);
    s_test_run (&test);

    test_event_t *term = &test.events[s_test_find (&test, "stubborn", "stopping", 0)];
    test_event_t *gone = &test.events[s_test_find (&test, "stubborn", "stopped", 0)];
    assert (s_test_killed_by (gone->wait_status, SIGKILL));
    assert (gone->mono - term->mono >= 300);
    int steady = s_test_find (&test, "steady", "stopped", 0);
    assert (steady > s_test_find (&test, "stubborn", "stopped", 0));
    assert (s_test_killed_by (test.events[steady].wait_status, SIGTERM));
    s_test_teardown (&test);
}

//  Scenario "twice": a second SIGINT does not wait for the grace period.

static void s_twice_on_event (test_t *test, const test_event_t *event)
{
    if (streq (event->state, "stopping") && s_test_tally (test, event->name, "stopping") == 1)
        raise (SIGINT);
}

static void s_test_twice (const char *root)
{
    test_t test;
    s_test_setup (&test, root, "twice");
    test.on_ready = s_grace_on_ready;
    test.on_event = s_twice_on_event;
    cli_supervisor_set_stop_grace (test.sup, 20000);
    s_test_add (&test, "stubborn", "trap '' TERM\necho ready >&3\nexec sleep 30", NULL);
    s_test_run (&test);
    test_event_t *term = &test.events[s_test_find (&test, "stubborn", "stopping", 0)];
    test_event_t *gone = &test.events[s_test_find (&test, "stubborn", "stopped", 0)];
    assert (s_test_killed_by (gone->wait_status, SIGKILL));
    assert (gone->mono - term->mono < 5000);
    s_test_teardown (&test);
}

//  Scenario "timeout": a child that closes its ready pipe without a word is not
//  ready; at the start timeout it is killed and restarted, and the child after it
//  never starts. Stopped from code with cli_supervisor_stop.

static void s_timeout_on_event (test_t *test, const test_event_t *event)
{
    if (!streq (event->name, "mute") || !streq (event->state, "starting") || event->restarts != 1)
        return;
    const char *const names[] = {"mute", "after"};
    const char *const states[] = {"starting", "stopped"};
    json_decref (s_test_status (test, names, states, 2));
    //  The event callback may not call into the supervisor: go through the loop.
    zloop_timer (test->loop, 1, 1, s_test_stop, test);
}

static void s_test_timeout (const char *root)
{
    test_t test;
    s_test_setup (&test, root, "timeout");
    test.on_event = s_timeout_on_event;
    cli_supervisor_set_start_timeout (test.sup, 300);
    cli_supervisor_set_backoff (test.sup, 100, 1000, 60000);
    s_test_add (&test, "mute", "exec 3>&-\nexec sleep 30", NULL);
    s_test_add (&test, "after", "echo ready >&3\nexec sleep 30", NULL);
    s_test_run (&test);
    assert (s_test_tally (&test, "mute", "ready") == 0);
    assert (s_test_tally (&test, "mute", "starting") == 2);
    test_event_t *spawn = &test.events[s_test_find (&test, "mute", "starting", 0)];
    test_event_t *killed = &test.events[s_test_find (&test, "mute", "backoff", 0)];
    assert (s_test_killed_by (killed->wait_status, SIGKILL));
    assert (killed->mono - spawn->mono >= 300);
    assert (s_test_tally (&test, "after", "starting") == 0);
    assert (test.ready_calls == 0);
    s_test_teardown (&test);
}

//  Scenario "rotate": a child writing numbered lines, its log rotated by size every
//  time it is over the cap: the files stay near the cap, the oldest past keep goes,
//  and across the files kept no line is lost, repeated or cut.

//  Stops once a third rotation has dropped the first file (writer.log.2 no longer
//  starts with line 1) and the child has reopened its log since (writer.log is back).
static int s_rotate_poll (zloop_t *loop, int timer_id, void *arg)
{
    test_t *test = (test_t *) arg;
    char path[PATH_MAX + 32], line[64] = "";
    snprintf (path, sizeof path, "%s/writer.log.2", test->log_dir);
    FILE *file = fopen (path, "r");
    bool first = !file || !fgets (line, sizeof line, file) || strncmp (line, "line 1 ", 7) == 0;
    if (file)
        fclose (file);
    snprintf (path, sizeof path, "%s/writer.log", test->log_dir);
    if (!first && access (path, F_OK) == 0) {
        zloop_timer_end (loop, timer_id);
        cli_supervisor_stop (test->sup);
    }
    return 0;
}

static void s_rotate_on_ready (test_t *test)
{
    zloop_timer (test->loop, 50, 0, s_rotate_poll, test);
}

//  Appends the numbers of path's "line N" lines to numbers; each line must be whole.
static void s_test_line_numbers (const char *path, long *numbers, size_t *count, size_t max)
{
    FILE *file = fopen (path, "r");
    assert (file);
    char line[256];
    while (fgets (line, sizeof line, file)) {
        assert (line[strlen (line) - 1] == '\n');
        long n;
        char pad[64];
        if (sscanf (line, "line %ld %63s", &n, pad) == 2) {
            assert (streq (pad, "padding-padding-padding"));
            assert (*count < max);
            numbers[(*count)++] = n;
        } else
            assert (streq (line, "reopened\n"));
    }
    fclose (file);
}

static void s_test_rotate (const char *root)
{
    test_t test;
    s_test_setup (&test, root, "rotate");
    test.on_ready = s_rotate_on_ready;
    cli_supervisor_set_logs (test.sup, 2000, 2);
    test.sup->log_check_ms = 100;
    s_test_add (&test, "writer",
                "trap 'exec >>\"$SBX_LOG_FILE\" 2>&1; echo reopened' HUP\necho ready >&3\ni=0\n"
                "while [ $i -lt 100000 ]; do i=$((i+1)); echo \"line $i padding-padding-padding\";"
                " sleep 0.005; done",
                NULL);
    s_test_run (&test);
    char path[3][PATH_MAX + 32];
    for (int i = 0; i < 3; i++) {
        snprintf (path[i], sizeof path[i], "%s/writer.log%s", test.log_dir,
                  i == 0   ? ".2"
                  : i == 1 ? ".1"
                           : "");
        struct stat st;
        assert (stat (path[i], &st) == 0);
        //  The cap, and what a check period adds on a slow machine.
        assert (st.st_size < 2000 + 6000);
    }
    char gone[PATH_MAX + 32];
    snprintf (gone, sizeof gone, "%s/writer.log.3", test.log_dir);
    assert (access (gone, F_OK) == -1);
    static long numbers[20000];
    size_t count = 0;
    for (int i = 0; i < 3; i++)
        s_test_line_numbers (path[i], numbers, &count, sizeof numbers / sizeof numbers[0]);
    assert (count > 20);
    for (size_t i = 1; i < count; i++)
        assert (numbers[i] == numbers[i - 1] + 1);
    assert (numbers[0] > 1); //  the oldest went
    assert (s_test_tally (&test, "writer", "starting") == 1);
    s_test_teardown (&test);
}

static int s_test_remove (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void) st;
    (void) flag;
    (void) ftw;
    return remove (path);
}

//  The reason `sbx up` prints for a daemon that exits: the last ERROR line of this run
//  of it, not of an earlier one.
static void s_test_last_error (const char *root)
{
    char path[256];
    snprintf (path, sizeof path, "%s/last_error.log", root);
    FILE *file = fopen (path, "w");
    assert (file);
    fputs ("2026-11-30T04:00:00.000Z ERROR sbx-vmd[1] an old run's error\n", file);
    long start = ftell (file);
    fputs ("2026-11-30T04:00:01.000Z INFO  sbx-vmd[2] starting\n"
           "2026-11-30T04:00:01.100Z ERROR sbx-vmd[2] first: cannot go on\n"
           "2026-11-30T04:00:01.200Z ERROR sbx-vmd[2] vmd.network = isolated needs root\n"
           "2026-11-30T04:00:01.300Z INFO  sbx-vmd[2] stopped\n",
           file);
    fclose (file);
    struct stat st;
    assert (stat (path, &st) == 0);
    child_t child = {.log_path = path, .log_start = (off_t) start, .log_ino = st.st_ino};
    char error[128];
    s_last_error (&child, error, sizeof error);
    assert (streq (error, "vmd.network = isolated needs root"));
    child.log_start = 0;
    truncate (path, start);
    s_last_error (&child, error, sizeof error);
    assert (streq (error, "an old run's error"));
    child.log_start = (off_t) start;
    s_last_error (&child, error, sizeof error); //  nothing new since the spawn
    assert (streq (error, ""));

    //  log.format = json: read as its text would be. After a rotation the log is a new
    //  file, all of it since the spawn (whose offset was in the old one).
    char rotated[300];
    snprintf (rotated, sizeof rotated, "%s.1", path);
    assert (rename (path, rotated) == 0);
    file = fopen (path, "w");
    assert (file);
    fputs ("{\"ts\":\"2026-11-30T04:00:02.000Z\",\"level\":\"error\",\"daemon\":\"sbx-vmd\","
           "\"pid\":2,\"request_id\":9,\"sandbox\":\"sb_1\",\"msg\":\"no disk\"}\n"
           "{\"ts\":\"2026-11-30T04:00:02.100Z\",\"level\":\"info\",\"daemon\":\"sbx-vmd\","
           "\"pid\":2,\"msg\":\"stopped\"}\n{not json\n",
           file);
    fclose (file);
    s_last_error (&child, error, sizeof error);
    assert (streq (error, "rid=9 sandbox=sb_1 no disk"));
    unlink (rotated);
    child.log_path = "/nonexistent/log";
    s_last_error (&child, error, sizeof error);
    assert (streq (error, ""));
}

void cli_supervisor_test (bool verbose)
{
    sbx_log_init ("cli_supervisor_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    char root[] = "/tmp/cli_supervisor_test.XXXXXX";
    assert (mkdtemp (root));

    //  What add refuses, before anything runs.
    char logs[sizeof root + 8];
    snprintf (logs, sizeof logs, "%s/logs", root);
    cli_supervisor_t *sup = cli_supervisor_new (logs, NULL);
    assert (sup);
    char *sh[] = {"/bin/sh", "-c", "exit 0", NULL};
    char *missing[] = {"/nonexistent/sbx-daemon", NULL};
    assert (cli_supervisor_add (sup, "a/b", sh) == -1);
    assert (cli_supervisor_add (sup, "..", sh) == -1);
    assert (cli_supervisor_add (sup, "gone", missing) == -1);
    zloop_t *loop = zloop_new ();
    assert (cli_supervisor_start (sup, loop) == -1); //  nothing to run
    assert (cli_supervisor_add (sup, "sh", sh) == 0);
    assert (cli_supervisor_add (sup, "sh", sh) == -1);
    cli_supervisor_destroy (&sup);
    zloop_destroy (&loop);

    s_test_order (root);
    s_test_grace (root);
    s_test_twice (root);
    s_test_timeout (root);
    s_test_last_error (root);
    s_test_rotate (root);

    nftw (root, s_test_remove, 16, FTW_DEPTH | FTW_PHYS);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
