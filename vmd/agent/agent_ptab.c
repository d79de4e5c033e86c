/*  agent_ptab - the processes the agent started. See agent_ptab.h. */
#include "agent_ptab.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK (64u * 1024)

struct agent_ptab_s {
    agent_proc_t **procs; //  start order
    size_t count;
    size_t alloc;
    size_t buf_limit;
    size_t max_finished;
    size_t budget;
    int64_t pty_idle_ms;
};

int64_t agent_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t agent_mono_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

agent_ptab_t *agent_ptab_new (size_t buf_limit, size_t max_finished, size_t budget)
{
    agent_ptab_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->buf_limit = buf_limit;
    self->max_finished = max_finished;
    self->budget = budget;
    self->pty_idle_ms = AGENT_PTY_IDLE_MS;
    return self;
}

void agent_ptab_set_pty_idle (agent_ptab_t *self, int64_t idle_ms)
{
    self->pty_idle_ms = idle_ms > 0 ? idle_ms : 0;
    for (size_t i = 0; i < self->count; i++)
        agent_ptab_touch (self, self->procs[i]);
}

void agent_ptab_touch (agent_ptab_t *self, agent_proc_t *proc)
{
    if (proc->pty && proc->running && !proc->hung_up)
        proc->hangup_mono = self->pty_idle_ms ? agent_mono_ms () + self->pty_idle_ms : 0;
}

static void s_close (int *fd)
{
    if (*fd >= 0) {
        close (*fd);
        *fd = -1;
    }
}

static void s_proc_destroy (agent_proc_t **proc_p)
{
    agent_proc_t *proc = *proc_p;
    if (proc) {
        s_close (&proc->out_fd);
        s_close (&proc->err_fd);
        s_close (&proc->pty_fd);
        agent_buf_destroy (&proc->out);
        agent_buf_destroy (&proc->err);
        free (proc->command);
        free (proc->tag);
        free (proc);
        *proc_p = NULL;
    }
}

void agent_ptab_destroy (agent_ptab_t **self_p, bool kill_running)
{
    if (!self_p || !*self_p)
        return;
    agent_ptab_t *self = *self_p;
    for (size_t i = 0; i < self->count; i++) {
        if (kill_running && self->procs[i]->running)
            kill (-self->procs[i]->pid, SIGKILL);
        s_proc_destroy (&self->procs[i]);
    }
    free (self->procs);
    free (self);
    *self_p = NULL;
}

//  What the child's 0, 1 and 2 become: three descriptors, or the terminal named tty.
typedef struct {
    int in, out, err;
    const char *tty;
} s_stdio_t;

//  Steps of the child that can fail, reported through the error pipe.
enum { S_STEP_STDIO, S_STEP_CWD, S_STEP_EXEC, S_STEP_TTY };

//  In the child, after setsid: the terminal becomes the session's controlling terminal
//  (opening it without O_NOCTTY does that on Linux; TIOCSCTTY says so explicitly).
//  Returns the descriptor, or -1.
static int s_child_tty (const char *tty)
{
    int fd = open (tty, O_RDWR | O_CLOEXEC);
    if (fd >= 0 && ioctl (fd, TIOCSCTTY, 0) != 0) {
        int saved = errno;
        close (fd);
        errno = saved; //  for the report
        return -1;
    }
    return fd;
}

//  In the child, between fork and exec: only async-signal-safe calls. On failure it
//  reports errno and the step through the error pipe and exits 127.
static void s_child (int errfd, s_stdio_t stdio, const char *cwd, const char *command,
                     char *const envp[])
{
    int step = S_STEP_STDIO;
    setsid ();
    //  The agent blocks SIGCHLD (signalfd) and ignores SIGPIPE: undo both.
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal (sig, SIG_DFL);
    if (stdio.tty) {
        step = S_STEP_TTY;
        if ((stdio.in = stdio.out = stdio.err = s_child_tty (stdio.tty)) < 0)
            goto fail;
        step = S_STEP_STDIO;
    }
    if (dup2 (stdio.in, 0) < 0 || dup2 (stdio.out, 1) < 0 || dup2 (stdio.err, 2) < 0)
        goto fail;
    //  dup2 onto itself (a descriptor that already was 0, 1 or 2) keeps close-on-exec.
    for (int fd = 0; fd < 3; fd++)
        fcntl (fd, F_SETFD, 0);
    step = S_STEP_CWD;
    if (chdir (cwd) != 0)
        goto fail;
    step = S_STEP_EXEC;
    char *argv[] = {"sh", "-c", (char *) command, NULL};
    execve ("/bin/sh", argv, envp);
fail:;
    int report[2] = {step, errno};
    if (write (errfd, report, sizeof report) < 0) {
        //  Nothing more can be done; the exit status tells.
    }
    _exit (127);
}

//  The error a child's report stands for.
static void s_child_error (sbx_err_t *err, const int report[2], const char *cwd, const char *tty)
{
    sbx_code_t code = report[1] == ENOENT   ? SBX_E_NOT_FOUND
                      : report[1] == EACCES ? SBX_E_PERMISSION_DENIED
                                            : SBX_E_INTERNAL;
    const char *why = strerror (report[1]);
    if (report[0] == S_STEP_EXEC)
        sbx_err_set (err, code, "cannot run /bin/sh: %s", why);
    else if (report[0] == S_STEP_CWD)
        sbx_err_set (err, code, "cannot enter %s: %s", cwd, why);
    else if (report[0] == S_STEP_TTY)
        sbx_err_set (err, SBX_E_INTERNAL, "cannot open the terminal %s: %s", tty, why);
    else
        sbx_err_set (err, code, "cannot set up standard input and output: %s", why);
}

//  A new terminal's master, non-blocking and close-on-exec, its window size set; the
//  slave's name goes into name. Returns the descriptor, or -1 with errno.
static int s_pty_open (const struct winsize *size, char *name, size_t name_size)
{
    int fd = posix_openpt (O_RDWR | O_NOCTTY);
    if (fd < 0)
        return -1;
    if (fcntl (fd, F_SETFD, FD_CLOEXEC) != 0 || fcntl (fd, F_SETFL, O_NONBLOCK) != 0 ||
        grantpt (fd) != 0 || unlockpt (fd) != 0 || ptsname_r (fd, name, name_size) != 0 ||
        ioctl (fd, TIOCSWINSZ, size) != 0) {
        int saved = errno;
        close (fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static int s_stdin_fd (const sbx_bytes_t *data)
{
    if (!data || !data->data)
        return open ("/dev/null", O_RDONLY | O_CLOEXEC);
    //  A memfd holds all of stdin at once: the child reads it at its own pace and the
    //  agent never blocks on a pipe to it.
    int fd = memfd_create ("sbx-stdin", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < data->size) {
        ssize_t n = write (fd, data->data + done, data->size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close (fd);
            return -1;
        }
        done += (size_t) n;
    }
    lseek (fd, 0, SEEK_SET);
    return fd;
}

//  The pipes (or the terminal) a new process writes to; the child's ends go in stdio.
//  Returns 0, or -1 with err set.
static int s_spawn_io (agent_proc_t *proc, const sbx_bytes_t *stdin_data, const struct winsize *pty,
                       s_stdio_t *stdio, char *tty, size_t tty_size, sbx_err_t *err)
{
    if (pty) {
        proc->pty = true;
        //  The master is read through a duplicate, closed at end of output as a pipe
        //  is, while pty_fd stays for input and resize until the process is reaped.
        if ((proc->pty_fd = s_pty_open (pty, tty, tty_size)) < 0 ||
            (proc->out_fd = fcntl (proc->pty_fd, F_DUPFD_CLOEXEC, 3)) < 0) {
            sbx_err_set (err, SBX_E_INTERNAL, "cannot make a terminal: %s", strerror (errno));
            return -1;
        }
        stdio->tty = tty;
        return 0;
    }
    int out[2], errp[2];
    if ((stdio->in = s_stdin_fd (stdin_data)) < 0 || pipe2 (out, O_CLOEXEC) != 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot make pipes: %s", strerror (errno));
        return -1;
    }
    proc->out_fd = out[0];
    stdio->out = out[1];
    if (pipe2 (errp, O_CLOEXEC) != 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot make pipes: %s", strerror (errno));
        return -1;
    }
    proc->err_fd = errp[0];
    stdio->err = errp[1];
    fcntl (proc->out_fd, F_SETFL, O_NONBLOCK);
    fcntl (proc->err_fd, F_SETFL, O_NONBLOCK);
    return 0;
}

static void s_stdio_close (s_stdio_t *stdio)
{
    s_close (&stdio->in);
    s_close (&stdio->out);
    s_close (&stdio->err);
}

static bool s_table_grow (agent_ptab_t *self)
{
    if (self->count < self->alloc)
        return true;
    size_t alloc = self->alloc ? self->alloc * 2 : 64;
    agent_proc_t **procs = realloc (self->procs, alloc * sizeof *procs);
    if (!procs)
        return false;
    self->procs = procs;
    self->alloc = alloc;
    return true;
}

agent_proc_t *agent_ptab_spawn (agent_ptab_t *self, const char *command, char *const envp[],
                                const char *cwd, const sbx_bytes_t *stdin_data, uint64_t timeout_ms,
                                bool detached, const struct winsize *pty, sbx_err_t *err)
{
    struct stat st;
    if (stat (cwd, &st) != 0) {
        sbx_err_set (err, errno == ENOENT ? SBX_E_NOT_FOUND : SBX_E_PERMISSION_DENIED,
                     "working directory %s: %s", cwd, strerror (errno));
        return NULL;
    }
    if (!S_ISDIR (st.st_mode)) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "working directory %s is not a directory", cwd);
        return NULL;
    }
    s_stdio_t stdio = {-1, -1, -1, NULL};
    int rep[2] = {-1, -1};
    char tty[64] = "";
    agent_proc_t *proc = s_table_grow (self) ? calloc (1, sizeof *proc) : NULL;
    if (!proc)
        goto oom;
    proc->out_fd = proc->err_fd = proc->pty_fd = -1;
    proc->command = strdup (command);
    proc->out = agent_buf_new (self->buf_limit);
    proc->err = agent_buf_new (self->buf_limit);
    if (!proc->command || !proc->out || !proc->err)
        goto oom;
    if (s_spawn_io (proc, stdin_data, pty, &stdio, tty, sizeof tty, err) != 0)
        goto fail;
    if (pipe2 (rep, O_CLOEXEC) != 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot make pipes: %s", strerror (errno));
        goto fail;
    }
    pid_t pid = fork ();
    if (pid < 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "fork: %s", strerror (errno));
        goto fail;
    }
    if (pid == 0)
        s_child (rep[1], stdio, cwd, command, envp);
    s_close (&rep[1]);
    s_stdio_close (&stdio);
    //  The error pipe closes at exec: a short wait, and the only way to tell a missing
    //  shell or an unusable cwd from a command that fails. (It also means a terminal's
    //  slave is open before the master is read: no end of output before the start.)
    int report[2];
    ssize_t n;
    do
        n = read (rep[0], report, sizeof report);
    while (n < 0 && errno == EINTR);
    s_close (&rep[0]);
    if (n == (ssize_t) sizeof report) {
        waitpid (pid, NULL, 0);
        s_child_error (err, report, cwd, tty);
        goto fail;
    }
    proc->pid = pid;
    proc->running = true;
    proc->detached = detached;
    proc->started_ms = agent_now_ms ();
    proc->started_mono = agent_mono_ms ();
    //  Beyond a century is no limit (and must not overflow into the past).
    proc->deadline_mono =
        timeout_ms && timeout_ms < 3153600000000ull ? proc->started_mono + (int64_t) timeout_ms : 0;
    self->procs[self->count++] = proc;
    agent_ptab_touch (self, proc);
    return proc;
oom:
    sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
fail:
    s_stdio_close (&stdio);
    s_close (&rep[0]);
    s_close (&rep[1]);
    s_proc_destroy (&proc);
    return NULL;
}

//  Input and resize need a terminal, and a process that still runs.
static int s_terminal_check (agent_proc_t *proc, sbx_err_t *err)
{
    if (!proc->pty)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "process %d has no terminal (start it with pty)", (int) proc->pid);
    if (!proc->running || proc->pty_fd < 0)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION, "process %d has ended",
                            (int) proc->pid);
    return 0;
}

ssize_t agent_ptab_input (agent_ptab_t *self, agent_proc_t *proc, const void *data, size_t size,
                          sbx_err_t *err)
{
    (void) self;
    if (s_terminal_check (proc, err) != 0)
        return -1;
    if (size == 0)
        return 0;
    ssize_t n;
    do
        n = write (proc->pty_fd, data, size);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0; //  the terminal's buffer is full: the caller sends it again later
    if (n < 0) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot write to the terminal of process %d: %s",
                     (int) proc->pid, strerror (errno));
        return -1;
    }
    return n;
}

int agent_ptab_resize (agent_ptab_t *self, agent_proc_t *proc, const struct winsize *size,
                       sbx_err_t *err)
{
    (void) self;
    if (s_terminal_check (proc, err) != 0)
        return -1;
    if (ioctl (proc->pty_fd, TIOCSWINSZ, size) != 0)
        return sbx_err_set (err, SBX_E_INTERNAL, "cannot resize the terminal of process %d: %s",
                            (int) proc->pid, strerror (errno));
    return 0;
}

agent_proc_t *agent_ptab_find (agent_ptab_t *self, pid_t pid)
{
    for (size_t i = 0; i < self->count; i++)
        if (self->procs[i]->pid == pid)
            return self->procs[i];
    return NULL;
}

agent_proc_t *agent_ptab_find_tag (agent_ptab_t *self, const char *tag)
{
    for (size_t i = 0; tag && *tag && i < self->count; i++)
        if (self->procs[i]->running && self->procs[i]->tag &&
            strcmp (self->procs[i]->tag, tag) == 0)
            return self->procs[i];
    return NULL;
}

size_t agent_ptab_size (const agent_ptab_t *self)
{
    return self->count;
}

agent_proc_t *agent_ptab_at (agent_ptab_t *self, size_t index)
{
    return index < self->count ? self->procs[index] : NULL;
}

size_t agent_ptab_pollfds (agent_ptab_t *self, struct pollfd *fds, agent_proc_t **owners,
                           size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < self->count && n + 2 <= max; i++) {
        agent_proc_t *proc = self->procs[i];
        int pipes[2] = {proc->out_fd, proc->err_fd};
        for (int k = 0; k < 2; k++)
            if (pipes[k] >= 0) {
                fds[n] = (struct pollfd){.fd = pipes[k], .events = POLLIN};
                owners[n++] = proc;
            }
    }
    return n;
}

//  One read; returns false when the pipe has nothing more now (or closed).
static bool s_read_once (agent_proc_t *proc, int *fd, agent_buf_t *buf)
{
    static uint8_t chunk[READ_CHUNK];
    ssize_t n = read (*fd, chunk, sizeof chunk);
    if (n > 0) {
        agent_buf_append (buf, chunk, (size_t) n);
        return true;
    }
    if (n < 0 && (errno == EINTR))
        return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return false;
    (void) proc;
    //  EOF, or an error that will not go away; on a terminal's master EIO is its EOF:
    //  every descriptor of the slave was closed.
    s_close (fd);
    return false;
}

void agent_ptab_read (agent_ptab_t *self, agent_proc_t *proc, int fd)
{
    (void) self;
    if (fd >= 0 && fd == proc->out_fd)
        s_read_once (proc, &proc->out_fd, proc->out);
    else if (fd >= 0 && fd == proc->err_fd)
        s_read_once (proc, &proc->err_fd, proc->err);
}

void agent_ptab_drain (agent_ptab_t *self, agent_proc_t *proc)
{
    (void) self;
    //  Bounded: a grandchild writing without end must not hold the loop.
    for (int i = 0; i < 1024 && proc->out_fd >= 0 && s_read_once (proc, &proc->out_fd, proc->out);
         i++)
        ;
    for (int i = 0; i < 1024 && proc->err_fd >= 0 && s_read_once (proc, &proc->err_fd, proc->err);
         i++)
        ;
}

//  Drops the oldest finished processes beyond the count or the output budget.
static void s_shed (agent_ptab_t *self)
{
    size_t finished = 0, bytes = 0;
    for (size_t i = 0; i < self->count; i++)
        if (!self->procs[i]->running) {
            finished++;
            bytes += agent_buf_size (self->procs[i]->out) + agent_buf_size (self->procs[i]->err);
        }
    size_t i = 0;
    while (i < self->count && (finished > self->max_finished || bytes > self->budget)) {
        agent_proc_t *proc = self->procs[i];
        if (proc->running || proc->waiter) {
            i++;
            continue;
        }
        finished--;
        bytes -= agent_buf_size (proc->out) + agent_buf_size (proc->err);
        s_proc_destroy (&self->procs[i]);
        memmove (self->procs + i, self->procs + i + 1, (self->count - i - 1) * sizeof *self->procs);
        self->count--;
    }
}

void agent_ptab_reap (agent_ptab_t *self, agent_ptab_exit_fn *fn, void *arg)
{
    while (true) {
        int status;
        pid_t pid = waitpid (-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            break;
        agent_proc_t *proc = agent_ptab_find (self, pid);
        if (!proc || !proc->running)
            continue; //  an orphan that was reparented to us: reaped, nothing more
        proc->running = false;
        proc->ended_ms = agent_now_ms ();
        proc->ended_mono = agent_mono_ms ();
        proc->deadline_mono = 0;
        if (WIFSIGNALED (status)) {
            proc->signal = WTERMSIG (status);
            proc->exit_code = 128 + proc->signal;
        } else {
            proc->exit_code = WEXITSTATUS (status);
        }
        //  What it wrote before exiting is in the pipes now (a terminal's master read
        //  flushes what the slave side still queues first).
        agent_ptab_drain (self, proc);
        s_close (&proc->pty_fd); //  nothing can be typed to a finished process
        if (fn)
            fn (proc, arg);
        proc->waiter = false;
    }
    s_shed (self);
}

int agent_ptab_expire (agent_ptab_t *self)
{
    int64_t now = agent_mono_ms ();
    int64_t next = -1;
    for (size_t i = 0; i < self->count; i++) {
        agent_proc_t *proc = self->procs[i];
        if (proc->running && proc->hangup_mono && proc->hangup_mono <= now) {
            //  The group may ignore it (nohup): what a hangup does, nothing more.
            kill (-proc->pid, SIGHUP);
            proc->hung_up = true;
            proc->hangup_mono = 0;
        } else if (proc->running && proc->hangup_mono &&
                   (next < 0 || proc->hangup_mono - now < next))
            next = proc->hangup_mono - now;
        if (!proc->running || !proc->deadline_mono)
            continue;
        if (proc->deadline_mono <= now) {
            kill (-proc->pid, SIGKILL);
            proc->timed_out = true;
            proc->deadline_mono = 0;
            continue;
        }
        if (next < 0 || proc->deadline_mono - now < next)
            next = proc->deadline_mono - now;
    }
    return next > INT32_MAX ? INT32_MAX : (int) next;
}
