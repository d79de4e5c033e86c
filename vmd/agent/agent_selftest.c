/*  agent_selftest - tests of the guest agent, run on the host.

        agent_selftest TEST PATH-TO-SBX-AGENT

    agent_buf and agent_frame are the module self-tests. The others start the real
    static sbx-agent on one end of a socketpair (--port-fd) and drive it through
    agent_frame, as vmd does: agent_exec, agent_pty, agent_files, agent_malformed, agent_fuzz and
    agent_setup (both run the agent in new UTS and network namespaces, so the host's hostname and
    interfaces stay untouched; without the privilege to do that they fail, never skip).
*/
#include "agent_buf.h"
#include "agent_frame.h"
#include "agent_stats.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 10000

static const char *s_agent_path;

//  --- a client of one agent

#define MAX_STASH 64

typedef struct {
    pid_t pid;
    int fd;
    agent_frame_t *frame;
    uint64_t next_rid;
    sbx_msg_t *stash[MAX_STASH]; //  replies that came while another was awaited
    sbx_msg_t *hello;
} client_t;

static int64_t s_mono_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

//  Starts an agent; namespaces: also in new UTS and network namespaces (returns NULL
//  when that is not allowed).
static client_t *s_start (bool namespaces, const char *extra1, const char *extra2)
{
    int sv[2];
    int rc = socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    assert (rc == 0);
    int ready[2];
    rc = pipe2 (ready, O_CLOEXEC);
    assert (rc == 0);
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        if (namespaces && unshare (CLONE_NEWUTS | CLONE_NEWNET) != 0) {
            if (write (ready[1], "n", 1) < 0)
                _exit (3);
            _exit (3);
        }
        dup2 (sv[1], 3); //  dup2 clears close-on-exec on 3
        char *argv[] = {(char *) s_agent_path, "--port-fd",     "3", "--no-clock", "--netdev", "lo",
                        (char *) extra1,       (char *) extra2, NULL};
        execv (s_agent_path, argv);
        _exit (127);
    }
    close (sv[1]);
    close (ready[1]);
    char c;
    ssize_t n = read (ready[0], &c, 1);
    close (ready[0]);
    if (n == 1) {
        waitpid (pid, NULL, 0);
        close (sv[0]);
        return NULL;
    }
    client_t *self = calloc (1, sizeof *self);
    assert (self);
    self->pid = pid;
    self->fd = sv[0];
    fcntl (self->fd, F_SETFL, O_NONBLOCK);
    self->frame = agent_frame_new (self->fd);
    self->next_rid = 1;
    sbx_err_t err;
    self->hello = agent_frame_recv (self->frame, WAIT_MS, &err);
    assert (self->hello && self->hello->type == SBX_MSG_AGENT_HELLO);
    assert (sbx_msg_agent_hello (self->hello)->pid == (uint64_t) pid || namespaces);
    assert (sbx_msg_agent_hello (self->hello)->version);
    return self;
}

static void s_stop (client_t **self_p)
{
    client_t *self = *self_p;
    agent_frame_destroy (&self->frame);
    close (self->fd); //  end of stream: the agent kills what runs and exits
    int status = 0;
    pid_t rc = waitpid (self->pid, &status, 0);
    assert (rc == self->pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    for (int i = 0; i < MAX_STASH; i++)
        sbx_msg_destroy (&self->stash[i]);
    sbx_msg_destroy (&self->hello);
    free (self);
    *self_p = NULL;
}

//  Sends msg (taking it) with a new rid; returns the rid.
static uint64_t s_send (client_t *self, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    msg->rid = self->next_rid++;
    sbx_err_t err;
    int rc = agent_frame_send (self->frame, msg, &err);
    assert (rc == 0);
    rc = agent_frame_flush_wait (self->frame, WAIT_MS);
    assert (rc == 0);
    uint64_t rid = msg->rid;
    sbx_msg_destroy (msg_p);
    return rid;
}

static void s_send_raw (client_t *self, const void *data, size_t size)
{
    agent_frame_send_raw (self->frame, data, size);
    int rc = agent_frame_flush_wait (self->frame, WAIT_MS);
    assert (rc == 0);
}

//  The reply to rid; others that arrive meanwhile are kept for later.
static sbx_msg_t *s_wait (client_t *self, uint64_t rid)
{
    for (int i = 0; i < MAX_STASH; i++)
        if (self->stash[i] && self->stash[i]->rid == rid) {
            sbx_msg_t *msg = self->stash[i];
            self->stash[i] = NULL;
            return msg;
        }
    int64_t deadline = s_mono_ms () + WAIT_MS;
    while (true) {
        int left = (int) (deadline - s_mono_ms ());
        sbx_err_t err = {0};
        sbx_msg_t *msg = agent_frame_recv (self->frame, left > 0 ? left : 0, &err);
        if (!msg) {
            fprintf (stderr, "no reply to rid %llu: %s\n", (unsigned long long) rid,
                     err.code ? err.message : strerror (errno));
            assert (false);
        }
        if (msg->rid == rid)
            return msg;
        int i = 0;
        while (i < MAX_STASH && self->stash[i])
            i++;
        assert (i < MAX_STASH);
        self->stash[i] = msg;
    }
}

static sbx_msg_t *s_call (client_t *self, sbx_msg_t **msg_p)
{
    return s_wait (self, s_send (self, msg_p));
}

//  Expects an error reply with that code; prints the message (a person reads it).
static void s_expect_error (sbx_msg_t **reply_p, sbx_code_t code, const char *contains)
{
    sbx_msg_t *reply = *reply_p;
    assert (reply);
    if (reply->type != SBX_MSG_ERROR || sbx_msg_error (reply)->code != code) {
        fprintf (stderr, "expected error %s, got %s\n", sbx_code_name (code),
                 sbx_msg_type_name (reply->type));
        assert (false);
    }
    const char *message = sbx_msg_error (reply)->message;
    if (contains && !strstr (message, contains)) {
        fprintf (stderr, "error '%s' does not say '%s'\n", message, contains);
        assert (false);
    }
    sbx_msg_destroy (reply_p);
}

static sbx_msg_t *s_exec_msg (const char *command, bool detached, uint64_t timeout_ms)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_agent_exec_t *exec = sbx_msg_agent_exec (msg);
    sbx_str_set (&exec->command, command);
    exec->detached = detached;
    exec->timeout_ms = timeout_ms;
    return msg;
}

static sbx_msg_t *s_status (client_t *self, uint64_t pid, uint64_t out_off, uint64_t err_off)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = pid;
    sbx_msg_agent_status (msg)->stdout_offset = out_off;
    sbx_msg_agent_status (msg)->stderr_offset = err_off;
    sbx_msg_t *reply = s_call (self, &msg);
    assert (reply->type == SBX_MSG_AGENT_STATUS_OK);
    return reply;
}

static bool s_bytes_is (const sbx_bytes_t *bytes, const char *text)
{
    return bytes->size == strlen (text) &&
           memcmp (bytes->data ? (void *) bytes->data : "", text, bytes->size) == 0;
}

static void s_ping (client_t *self)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    sbx_msg_t *reply = s_call (self, &msg);
    assert (reply->type == SBX_MSG_AGENT_PING_OK);
    sbx_msg_destroy (&reply);
}

//  --- agent_exec

static void s_test_exec (void)
{
    client_t *agent = s_start (false, NULL, NULL);
    int64_t t0 = s_mono_ms ();

    //  Detached processes first, so they run while the rest is tested.
    sbx_msg_t *msg = s_exec_msg ("sleep 3; echo done", true, 0);
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_EXEC_OK && sbx_msg_agent_exec_ok (reply)->running);
    uint64_t sleeper = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    reply = s_status (agent, sleeper, 0, 0);
    assert (sbx_msg_agent_status_ok (reply)->running);
    assert (sbx_msg_agent_status_ok (reply)->stdout.size == 0);
    sbx_msg_destroy (&reply);

    //  A foreground exec: exact output and exit code.
    msg = s_exec_msg ("python3 -c 'print(2**100)'", false, 10000);
    reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_EXEC_OK);
    sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
    assert (!ok->running && ok->exit_code == 0 && ok->signal == 0 && !ok->timed_out);
    assert (s_bytes_is (&ok->stdout, "1267650600228229401496703205376\n"));
    assert (s_bytes_is (&ok->stderr, ""));
    assert (ok->stdout_next_offset == 32 && !ok->stdout_truncated);
    sbx_msg_destroy (&reply);

    //  Exit codes, stderr, stdin.
    msg = s_exec_msg ("echo oops >&2; exit 3", false, 0);
    reply = s_call (agent, &msg);
    ok = sbx_msg_agent_exec_ok (reply);
    assert (ok->exit_code == 3 && s_bytes_is (&ok->stderr, "oops\n") &&
            ok->stderr_next_offset == 5);
    sbx_msg_destroy (&reply);
    msg = s_exec_msg ("tr a-z A-Z", false, 0);
    sbx_bytes_set (&sbx_msg_agent_exec (msg)->stdin, "hello stdin", 11);
    reply = s_call (agent, &msg);
    assert (s_bytes_is (&sbx_msg_agent_exec_ok (reply)->stdout, "HELLO STDIN"));
    sbx_msg_destroy (&reply);

    //  env and cwd.
    msg = s_exec_msg ("echo \"$FOO|$(pwd)|$HOME\"", false, 0);
    sbx_strmap_set (&sbx_msg_agent_exec (msg)->env, "FOO", "bar baz");
    sbx_str_set (&sbx_msg_agent_exec (msg)->cwd, "/tmp");
    reply = s_call (agent, &msg);
    assert (s_bytes_is (&sbx_msg_agent_exec_ok (reply)->stdout, "bar baz|/tmp|/root\n"));
    sbx_msg_destroy (&reply);
    msg = s_exec_msg ("true", false, 0);
    sbx_str_set (&sbx_msg_agent_exec (msg)->cwd, "/no/such/dir");
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "/no/such/dir");
    msg = s_exec_msg ("true", false, 0);
    sbx_strmap_set (&sbx_msg_agent_exec (msg)->env, "A=B", "x");
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "A=B");

    //  Several requests in flight: a slow foreground exec does not hold up the others.
    msg = s_exec_msg ("sleep 1; echo slow", false, 0);
    uint64_t slow_rid = s_send (agent, &msg);
    msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
    sbx_str_set (&sbx_msg_agent_file_read (msg)->path, "/proc/self/stat");
    uint64_t read_rid = s_send (agent, &msg);
    msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    uint64_t ping_rid = s_send (agent, &msg);
    int64_t t = s_mono_ms ();
    sbx_err_t err;
    sbx_msg_t *first = agent_frame_recv (agent->frame, WAIT_MS, &err);
    sbx_msg_t *second = agent_frame_recv (agent->frame, WAIT_MS, &err);
    assert (first && first->rid == read_rid && first->type == SBX_MSG_AGENT_FILE_READ_OK);
    assert (second && second->rid == ping_rid && second->type == SBX_MSG_AGENT_PING_OK);
    assert (s_mono_ms () - t < 500);
    sbx_msg_destroy (&first);
    sbx_msg_destroy (&second);
    reply = s_wait (agent, slow_rid);
    assert (s_bytes_is (&sbx_msg_agent_exec_ok (reply)->stdout, "slow\n"));
    assert (sbx_msg_agent_exec_ok (reply)->duration_ms >= 1000);
    sbx_msg_destroy (&reply);

    //  A foreground timeout kills the whole group.
    t = s_mono_ms ();
    msg = s_exec_msg ("sleep 20 & sleep 30; echo never", false, 300);
    reply = s_call (agent, &msg);
    ok = sbx_msg_agent_exec_ok (reply);
    assert (ok->timed_out && ok->signal == SIGKILL && ok->exit_code == 128 + SIGKILL);
    assert (s_bytes_is (&ok->stdout, ""));
    assert (s_mono_ms () - t < 3000);
    sbx_msg_destroy (&reply);

    //  Kill with SIGTERM, and with SIGKILL a process that ignores SIGTERM.
    msg = s_exec_msg ("sleep 30", true, 0);
    reply = s_call (agent, &msg);
    uint64_t termed = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    msg = s_exec_msg ("trap '' TERM; echo ready; while :; do sleep 0.05; done", true, 0);
    reply = s_call (agent, &msg);
    uint64_t stubborn = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    //  The trap must be set before the TERM is sent.
    while (true) {
        reply = s_status (agent, stubborn, 0, 0);
        bool ready = sbx_msg_agent_status_ok (reply)->stdout.size > 0;
        sbx_msg_destroy (&reply);
        if (ready)
            break;
        usleep (20000);
    }
    uint64_t victims[2] = {termed, stubborn};
    int signals[3] = {SIGTERM, SIGTERM, SIGKILL};
    for (int i = 0; i < 3; i++) {
        msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
        sbx_msg_agent_kill (msg)->pid = victims[i ? 1 : 0];
        sbx_msg_agent_kill (msg)->signal = signals[i];
        reply = s_call (agent, &msg);
        assert (reply->type == SBX_MSG_AGENT_KILL_OK);
        sbx_msg_destroy (&reply);
        if (i == 1) {
            usleep (300000);
            reply = s_status (agent, stubborn, 0, 0);
            assert (sbx_msg_agent_status_ok (reply)->running); //  TERM was ignored
            sbx_msg_destroy (&reply);
        }
    }
    for (int i = 0; i < 2; i++) {
        int64_t deadline = s_mono_ms () + WAIT_MS;
        while (true) {
            reply = s_status (agent, victims[i], 0, 0);
            if (!sbx_msg_agent_status_ok (reply)->running)
                break;
            assert (s_mono_ms () < deadline);
            sbx_msg_destroy (&reply);
            usleep (20000);
        }
        assert (sbx_msg_agent_status_ok (reply)->signal == (i ? SIGKILL : SIGTERM));
        sbx_msg_destroy (&reply);
    }
    msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (msg)->pid = termed;
    sbx_msg_agent_kill (msg)->signal = 0;
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "signal");
    msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (msg)->pid = 999999999;
    sbx_msg_agent_kill (msg)->signal = 9;
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "process 999999999 not found");
    //  A foreground exec killed by its tag (its waiter gave up before it knew the pid):
    //  the waiter's answer still comes, with the signal.
    msg = s_exec_msg ("sleep 30", false, 60000);
    sbx_str_set (&sbx_msg_agent_exec (msg)->tag, "gw:test:7");
    uint64_t tagged_rid = s_send (agent, &msg);
    msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_str_set (&sbx_msg_agent_kill (msg)->tag, "gw:test:7");
    sbx_msg_agent_kill (msg)->signal = SIGKILL;
    reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_KILL_OK);
    uint64_t tagged = sbx_msg_agent_kill_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    reply = s_wait (agent, tagged_rid);
    ok = sbx_msg_agent_exec_ok (reply);
    assert (ok->pid == tagged && ok->signal == SIGKILL && !ok->timed_out);
    sbx_msg_destroy (&reply);
    //  Only a running process answers to its tag.
    msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_str_set (&sbx_msg_agent_kill (msg)->tag, "gw:test:7");
    sbx_msg_agent_kill (msg)->signal = SIGKILL;
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "no running process has the tag gw:test:7");
    msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = 4242424;
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "process 4242424 not found");

    //  A huge output: the newest 8 MiB are kept, and the loss is reported.
    msg = s_exec_msg ("head -c 20000000 /dev/zero; echo end", false, 20000);
    reply = s_call (agent, &msg);
    ok = sbx_msg_agent_exec_ok (reply);
    assert (ok->exit_code == 0 && ok->stdout_truncated);
    assert (ok->stdout_next_offset == 20000004 && ok->stdout.size == 8u * 1024 * 1024);
    assert (ok->stdout_offset == 20000004 - 8u * 1024 * 1024);
    assert (memcmp (ok->stdout.data + ok->stdout.size - 4, "end\n", 4) == 0);
    uint64_t big = ok->pid;
    sbx_msg_destroy (&reply);
    reply = s_status (agent, big, 100, 0);
    sbx_agent_status_ok_t *st = sbx_msg_agent_status_ok (reply);
    assert (st->stdout_truncated && st->stdout_offset == 20000004 - 8u * 1024 * 1024);
    assert (st->stdout.size == 1024 * 1024 && st->stdout_more);
    sbx_msg_destroy (&reply);

    //  Offsets: each poll from the last next_offset gets only new output.
    msg = s_exec_msg ("echo one; sleep 0.4; echo two >&2; sleep 0.4; echo three; "
                      "sleep 0.4; printf four",
                      true, 0);
    reply = s_call (agent, &msg);
    uint64_t stepper = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    char out[64] = "", errs[64] = "";
    uint64_t out_off = 0, err_off = 0;
    int polls_with_data = 0;
    int64_t deadline = s_mono_ms () + WAIT_MS;
    while (true) {
        reply = s_status (agent, stepper, out_off, err_off);
        st = sbx_msg_agent_status_ok (reply);
        assert (st->stdout_offset == out_off && !st->stdout_truncated);
        assert (st->stderr_offset == err_off && !st->stderr_truncated);
        assert (strlen (out) == out_off && strlen (errs) == err_off);
        if (st->stdout.size)
            polls_with_data++;
        strncat (out, (char *) st->stdout.data, st->stdout.size);
        strncat (errs, (char *) st->stderr.data, st->stderr.size);
        out_off = st->stdout_next_offset;
        err_off = st->stderr_next_offset;
        bool running = st->running;
        sbx_msg_destroy (&reply);
        if (!running)
            break;
        assert (s_mono_ms () < deadline);
        usleep (100000);
    }
    assert (strcmp (out, "one\nthree\nfour") == 0 && strcmp (errs, "two\n") == 0);
    assert (polls_with_data >= 3);

    //  The detached sleeper ends with its output.
    deadline = s_mono_ms () + WAIT_MS;
    while (true) {
        reply = s_status (agent, sleeper, 0, 0);
        if (!sbx_msg_agent_status_ok (reply)->running)
            break;
        assert (s_mono_ms () < deadline);
        sbx_msg_destroy (&reply);
        usleep (100000);
    }
    st = sbx_msg_agent_status_ok (reply);
    assert (st->exit_code == 0 && s_bytes_is (&st->stdout, "done\n"));
    assert (st->stdout_next_offset == 5 && st->ended_ms >= st->started_ms + 2900);
    sbx_msg_destroy (&reply);
    //  A poll from there on gets nothing new.
    reply = s_status (agent, sleeper, 5, 0);
    assert (sbx_msg_agent_status_ok (reply)->stdout.size == 0);
    sbx_msg_destroy (&reply);

    //  ps lists them all, finished ones too.
    msg = sbx_msg_new (SBX_MSG_AGENT_PS);
    reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_PS_OK);
    sbx_agent_proc_list_t *procs = &sbx_msg_agent_ps_ok (reply)->processes;
    int seen = 0;
    for (size_t i = 0; i < procs->count; i++) {
        sbx_agent_proc_t *p = &procs->items[i];
        if (p->pid == sleeper)
            seen += !strcmp (p->command, "sleep 3; echo done") && !p->running && p->detached;
        if (p->pid == termed)
            seen += p->signal == SIGTERM && p->ended_ms > 0;
        if (p->pid == stubborn)
            seen += p->signal == SIGKILL;
        if (p->pid == tagged)
            seen += p->tag && !strcmp (p->tag, "gw:test:7") && !p->detached;
        assert (!p->running);
    }
    if (seen != 4 || procs->count != 12)
        fprintf (stderr, "seen %d count %zu\n", seen, procs->count);
    assert (seen == 4 && procs->count == 12);
    sbx_msg_destroy (&reply);
    s_stop (&agent);
    printf ("   agent_exec: %lld ms\n", (long long) (s_mono_ms () - t0));
}

//  --- agent_pty: terminals (agent.exec pty, agent.input, agent.resize) and agent.status
//  wait_ms

static uint64_t s_exec_pty (client_t *agent, const char *command, uint64_t rows, uint64_t cols)
{
    sbx_msg_t *msg = s_exec_msg (command, false, 20000);
    sbx_msg_agent_exec (msg)->pty = true;
    sbx_msg_agent_exec (msg)->rows = rows;
    sbx_msg_agent_exec (msg)->cols = cols;
    sbx_msg_t *reply = s_call (agent, &msg);
    //  pty implies detached: answered at once, running.
    assert (reply->type == SBX_MSG_AGENT_EXEC_OK && sbx_msg_agent_exec_ok (reply)->running);
    uint64_t pid = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    return pid;
}

static sbx_msg_t *s_status_wait (client_t *agent, uint64_t pid, uint64_t out_off, uint64_t wait_ms)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = pid;
    sbx_msg_agent_status (msg)->stdout_offset = out_off;
    sbx_msg_agent_status (msg)->wait_ms = wait_ms;
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_STATUS_OK);
    return reply;
}

//  What a pty process printed from *offset until `want` shows (or, want NULL, until it
//  ended), read with held status requests; *offset moves on. The last status goes in
//  *last_p when asked for.
static char s_seen[65536];
static const char *s_pty_until (client_t *agent, uint64_t pid, uint64_t *offset, const char *want,
                                sbx_msg_t **last_p)
{
    size_t len = 0;
    s_seen[0] = 0;
    int64_t deadline = s_mono_ms () + WAIT_MS;
    while (true) {
        sbx_msg_t *reply = s_status_wait (agent, pid, *offset, 2000);
        sbx_agent_status_ok_t *st = sbx_msg_agent_status_ok (reply);
        assert (st->stderr.size == 0); //  the terminal carries both streams
        size_t room = sizeof s_seen - 1 - len;
        size_t n = st->stdout.size < room ? st->stdout.size : room;
        memcpy (s_seen + len, st->stdout.data, n);
        s_seen[len += n] = 0;
        *offset = st->stdout_next_offset;
        bool done = want ? strstr (s_seen, want) != NULL : !st->running;
        if (done || !st->running) {
            if (!done)
                fprintf (stderr, "pty %llu ended without '%s': '%s'\n", (unsigned long long) pid,
                         want, s_seen);
            assert (done);
            if (last_p)
                *last_p = reply;
            else
                sbx_msg_destroy (&reply);
            return s_seen;
        }
        sbx_msg_destroy (&reply);
        if (s_mono_ms () >= deadline)
            fprintf (stderr, "pty %llu: no '%s' in '%s'\n", (unsigned long long) pid,
                     want ? want : "(end)", s_seen);
        assert (s_mono_ms () < deadline);
    }
}

static sbx_msg_t *s_input (client_t *agent, uint64_t pid, const void *data, size_t size)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_INPUT);
    sbx_msg_agent_input (msg)->pid = pid;
    sbx_bytes_set (&sbx_msg_agent_input (msg)->data, data, size);
    return s_call (agent, &msg);
}

static void s_type (client_t *agent, uint64_t pid, const char *text)
{
    sbx_msg_t *reply = s_input (agent, pid, text, strlen (text));
    assert (reply->type == SBX_MSG_AGENT_INPUT_OK);
    assert (sbx_msg_agent_input_ok (reply)->pid == pid);
    assert (sbx_msg_agent_input_ok (reply)->written == strlen (text));
    sbx_msg_destroy (&reply);
}

static sbx_msg_t *s_resize (client_t *agent, uint64_t pid, uint64_t rows, uint64_t cols)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_RESIZE);
    sbx_msg_agent_resize (msg)->pid = pid;
    sbx_msg_agent_resize (msg)->rows = rows;
    sbx_msg_agent_resize (msg)->cols = cols;
    return s_call (agent, &msg);
}

static void s_kill (client_t *agent, uint64_t pid, int signal)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (msg)->pid = pid;
    sbx_msg_agent_kill (msg)->signal = signal;
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_KILL_OK);
    sbx_msg_destroy (&reply);
}

//  How many of the agent's descriptors are terminal masters.
static int s_masters_open (pid_t agent_pid)
{
    char dir[64], path[320], link[256];
    snprintf (dir, sizeof dir, "/proc/%d/fd", (int) agent_pid);
    DIR *d = opendir (dir);
    assert (d);
    int masters = 0;
    struct dirent *e;
    while ((e = readdir (d)) != NULL) {
        snprintf (path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t n = readlink (path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            masters += strstr (link, "ptmx") != NULL;
        }
    }
    closedir (d);
    return masters;
}

//  Waits until process pid runs the program `comm` (the harness shares the agent's pids).
static void s_wait_comm (uint64_t pid, const char *comm)
{
    char path[64], name[64];
    snprintf (path, sizeof path, "/proc/%llu/comm", (unsigned long long) pid);
    for (int i = 0; i < 500; i++) {
        FILE *f = fopen (path, "r");
        bool there = f && fgets (name, sizeof name, f) && !strncmp (name, comm, strlen (comm));
        if (f)
            fclose (f);
        if (there)
            return;
        usleep (10000);
    }
    fprintf (stderr, "process %llu does not run %s\n", (unsigned long long) pid, comm);
    assert (false);
}

//  A terminal of the size asked, its output as stdout, TERM; input, ^D, resize, SIGWINCH.
static void s_test_pty_terminal (client_t *agent)
{
    uint64_t off = 0;
    sbx_msg_t *last = NULL;
    uint64_t pid =
        s_exec_pty (agent, "tty; stty size; echo \"T=$TERM\" >&2; ls -l /proc/self/fd/", 30, 100);
    const char *out = s_pty_until (agent, pid, &off, NULL, &last);
    assert (!strncmp (out, "/dev/pts/", 9));
    assert (strstr (out, "\r\n30 100\r\n") && strstr (out, "T=xterm-256color\r\n"));
    //  0, 1 and 2 are the terminal; no master leaked into the process.
    assert (strstr (out, " 2 -> /dev/pts/") && !strstr (out, "ptmx"));
    sbx_agent_status_ok_t *st = sbx_msg_agent_status_ok (last);
    assert (!st->running && st->exit_code == 0 && st->stdout_next_offset == strlen (out));
    sbx_msg_destroy (&last);
    //  Defaults 24x80; the request's TERM wins.
    sbx_msg_t *msg = s_exec_msg ("stty size; echo \"T=$TERM\"", false, 0);
    sbx_msg_agent_exec (msg)->pty = true;
    sbx_strmap_set (&sbx_msg_agent_exec (msg)->env, "TERM", "vt100");
    sbx_msg_t *reply = s_call (agent, &msg);
    pid = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    off = 0;
    out = s_pty_until (agent, pid, &off, NULL, NULL);
    assert (!strcmp (out, "24 80\r\nT=vt100\r\n"));

    //  Input reaches the program through the line discipline (echoed, then read); ^D at
    //  the start of a line is its end of file.
    pid = s_exec_pty (agent, "tr a-z A-Z", 0, 0);
    off = 0;
    s_type (agent, pid, "hello pty\n");
    out = s_pty_until (agent, pid, &off, "HELLO PTY\r\n", NULL);
    assert (!strcmp (out, "hello pty\r\nHELLO PTY\r\n"));
    s_type (agent, pid, "\x04");
    s_pty_until (agent, pid, &off, NULL, &last);
    assert (sbx_msg_agent_status_ok (last)->exit_code == 0);
    sbx_msg_destroy (&last);

    //  Resize: the program sees the new size, and its group gets SIGWINCH.
    pid = s_exec_pty (agent, "read x; stty size", 24, 80);
    reply = s_resize (agent, pid, 50, 132);
    assert (reply->type == SBX_MSG_AGENT_RESIZE_OK && sbx_msg_agent_resize_ok (reply)->pid == pid);
    sbx_msg_destroy (&reply);
    s_type (agent, pid, "go\n");
    off = 0;
    out = s_pty_until (agent, pid, &off, NULL, NULL);
    assert (!strcmp (out, "go\r\n50 132\r\n"));
    pid = s_exec_pty (
        agent, "trap 'stty size; exit 7' WINCH; echo ready; while :; do sleep 0.05; done", 10, 10);
    off = 0;
    s_pty_until (agent, pid, &off, "ready\r\n", NULL);
    reply = s_resize (agent, pid, 11, 12);
    sbx_msg_destroy (&reply);
    out = s_pty_until (agent, pid, &off, NULL, &last);
    assert (!strcmp (out, "11 12\r\n") && sbx_msg_agent_status_ok (last)->exit_code == 7);
    sbx_msg_destroy (&last);

    //  Ctrl-C: the 0x03 byte becomes SIGINT for the foreground group. Sent once sleep
    //  runs: the shell before it catches SIGINT (sh -c), and acts on one that comes
    //  before it forks a command only when that command ends.
    pid = s_exec_pty (agent, "exec sleep 100", 0, 0);
    s_wait_comm (pid, "sleep");
    int64_t t = s_mono_ms ();
    s_type (agent, pid, "\x03");
    off = 0;
    out = s_pty_until (agent, pid, &off, NULL, &last);
    st = sbx_msg_agent_status_ok (last);
    assert (st->signal == SIGINT && st->exit_code == 128 + SIGINT && !st->timed_out);
    assert (!strcmp (out, "^C"));
    assert (s_mono_ms () - t < 3000);
    sbx_msg_destroy (&last);
}

//  A full terminal: written says how much it took, and the agent does not block. Returns
//  the process, still running.
static uint64_t s_test_pty_full (client_t *agent)
{
    uint64_t pid = s_exec_pty (agent, "stty -echo; echo ready; sleep 100", 0, 0);
    uint64_t off = 0;
    s_pty_until (agent, pid, &off, "ready", NULL);
    char *lines = malloc (65536);
    for (size_t i = 0; i < 65536; i++)
        lines[i] = i % 64 == 63 ? '\n' : 'y';
    uint64_t written = 65536;
    for (int i = 0; i < 64 && written == 65536; i++) {
        sbx_msg_t *reply = s_input (agent, pid, lines, 65536);
        assert (reply->type == SBX_MSG_AGENT_INPUT_OK);
        written = sbx_msg_agent_input_ok (reply)->written;
        sbx_msg_destroy (&reply);
    }
    assert (written < 65536);
    free (lines);
    s_ping (agent);
    //  A pipe process sees no terminal master, this one's or another's.
    sbx_msg_t *msg = s_exec_msg ("ls -l /proc/self/fd/; tty", false, 0);
    sbx_msg_t *reply = s_call (agent, &msg);
    sbx_bytes_t *text = &sbx_msg_agent_exec_ok (reply)->stdout;
    assert (!memmem (text->data, text->size, "ptmx", 4));
    assert (!memmem (text->data, text->size, "/dev/pts", 8));
    assert (memmem (text->data, text->size, "not a tty", 9));
    sbx_msg_destroy (&reply);
    return pid;
}

//  agent.status wait_ms: answered when output comes, at the deadline, at the end.
static void s_test_pty_wait (client_t *agent)
{
    uint64_t pid = s_exec_pty (agent, "sleep 0.7; echo late; sleep 100", 0, 0);
    uint64_t rids[2];
    int64_t t = s_mono_ms ();
    for (int i = 0; i < 2; i++) { //  two on one process: both answered
        sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
        sbx_msg_agent_status (msg)->pid = pid;
        sbx_msg_agent_status (msg)->wait_ms = 8000;
        rids[i] = s_send (agent, &msg);
    }
    s_ping (agent); //  served meanwhile
    assert (s_mono_ms () - t < 400);
    sbx_msg_t *reply = s_wait (agent, rids[0]);
    int64_t waited = s_mono_ms () - t;
    sbx_agent_status_ok_t *st = sbx_msg_agent_status_ok (reply);
    assert (st->running && s_bytes_is (&st->stdout, "late\r\n"));
    assert (waited >= 600 && waited < 4000);
    uint64_t off = st->stdout_next_offset;
    sbx_msg_destroy (&reply);
    reply = s_wait (agent, rids[1]);
    assert (s_bytes_is (&sbx_msg_agent_status_ok (reply)->stdout, "late\r\n"));
    sbx_msg_destroy (&reply);
    //  Nothing comes: the answer at the deadline, without new bytes.
    t = s_mono_ms ();
    reply = s_status_wait (agent, pid, off, 400);
    waited = s_mono_ms () - t;
    st = sbx_msg_agent_status_ok (reply);
    assert (st->running && st->stdout.size == 0 && st->stdout_next_offset == off);
    assert (waited >= 350 && waited < 3000);
    sbx_msg_destroy (&reply);
    //  The process ends (killed here): answered with the end.
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = pid;
    sbx_msg_agent_status (msg)->stdout_offset = off;
    sbx_msg_agent_status (msg)->wait_ms = 30000;
    uint64_t held = s_send (agent, &msg);
    usleep (100000);
    t = s_mono_ms ();
    s_kill (agent, pid, SIGKILL);
    reply = s_wait (agent, held);
    st = sbx_msg_agent_status_ok (reply);
    assert (!st->running && st->signal == SIGKILL && st->stdout.size == 0);
    assert (s_mono_ms () - t < 2000);
    sbx_msg_destroy (&reply);
    //  A finished process is answered at once.
    t = s_mono_ms ();
    reply = s_status_wait (agent, pid, off, 5000);
    assert (!sbx_msg_agent_status_ok (reply)->running && s_mono_ms () - t < 500);
    sbx_msg_destroy (&reply);
    //  Pipes too.
    msg = s_exec_msg ("sleep 0.3; echo piped", true, 0);
    reply = s_call (agent, &msg);
    uint64_t piped = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    reply = s_status_wait (agent, piped, 0, 8000);
    assert (s_bytes_is (&sbx_msg_agent_status_ok (reply)->stdout, "piped\n"));
    sbx_msg_destroy (&reply);
}

//  The errors: wait_ms, sizes, stdin with pty, no terminal, ended, unknown.
static void s_test_pty_errors (client_t *agent, uint64_t running)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = running;
    sbx_msg_agent_status (msg)->wait_ms = 60001;
    sbx_msg_t *reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "wait_ms");
    msg = s_exec_msg ("sleep 30", true, 0);
    reply = s_call (agent, &msg);
    uint64_t piped = sbx_msg_agent_exec_ok (reply)->pid;
    sbx_msg_destroy (&reply);
    char want[128];
    snprintf (want, sizeof want, "process %llu has no terminal (start it with pty)",
              (unsigned long long) piped);
    reply = s_input (agent, piped, "x", 1);
    s_expect_error (&reply, SBX_E_FAILED_PRECONDITION, want);
    reply = s_resize (agent, piped, 10, 10);
    s_expect_error (&reply, SBX_E_FAILED_PRECONDITION, want);
    s_kill (agent, piped, SIGKILL);
    uint64_t ended = s_exec_pty (agent, "true", 0, 0);
    uint64_t off = 0;
    s_pty_until (agent, ended, &off, NULL, NULL);
    snprintf (want, sizeof want, "process %llu has ended", (unsigned long long) ended);
    reply = s_input (agent, ended, "x", 1);
    s_expect_error (&reply, SBX_E_FAILED_PRECONDITION, want);
    reply = s_resize (agent, ended, 10, 10);
    s_expect_error (&reply, SBX_E_FAILED_PRECONDITION, want);
    reply = s_input (agent, 4242424, "x", 1);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "process 4242424 not found");
    reply = s_resize (agent, 4242424, 10, 10);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "process 4242424 not found");
    reply = s_resize (agent, running, 0, 10);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "rows");
    reply = s_resize (agent, running, 10, 1001);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "cols");
    const uint64_t sizes[][2] = {{1001, 80}, {24, 5000}};
    for (int i = 0; i < 2; i++) {
        msg = s_exec_msg ("true", false, 0);
        sbx_msg_agent_exec (msg)->pty = true;
        sbx_msg_agent_exec (msg)->rows = sizes[i][0];
        sbx_msg_agent_exec (msg)->cols = sizes[i][1];
        reply = s_call (agent, &msg);
        s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, i ? "cols" : "rows");
    }
    msg = s_exec_msg ("cat", false, 0);
    sbx_msg_agent_exec (msg)->pty = true;
    sbx_bytes_set (&sbx_msg_agent_exec (msg)->stdin, "x", 1);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "stdin");
}

static sbx_agent_status_ok_t s_pty_state (client_t *agent, uint64_t pid)
{
    sbx_msg_t *reply = s_status_wait (agent, pid, 1u << 30, 0);
    sbx_agent_status_ok_t st = *sbx_msg_agent_status_ok (reply);
    sbx_msg_destroy (&reply);
    return st;
}

//  A terminal nobody asks after hangs up (--pty-idle-ms): SIGHUP to its group, as a
//  dropped line; one that is asked after lives on, and so does one that ignores SIGHUP.
static void s_test_pty_hangup (void)
{
    client_t *agent = s_start (false, "--pty-idle-ms", "600");
    uint64_t left = s_exec_pty (agent, "sleep 100", 0, 0);
    uint64_t used = s_exec_pty (agent, "sleep 100", 0, 0);
    uint64_t nohup = s_exec_pty (agent, "trap '' HUP; sleep 100", 0, 0);
    int64_t t = s_mono_ms ();
    while (s_mono_ms () - t < 1500) {
        assert (s_pty_state (agent, used).running); //  a touch, each time
        usleep (150000);
    }
    sbx_agent_status_ok_t st = s_pty_state (agent, left);
    assert (!st.running && st.signal == SIGHUP);
    assert (s_pty_state (agent, used).running);
    assert (s_pty_state (agent, nohup).running);
    s_kill (agent, used, SIGKILL);
    s_kill (agent, nohup, SIGKILL);
    s_stop (&agent);
}

static void s_test_pty (void)
{
    client_t *agent = s_start (false, NULL, NULL);
    int64_t t0 = s_mono_ms ();
    assert (s_masters_open (agent->pid) == 0);
    s_test_pty_terminal (agent);
    uint64_t full = s_test_pty_full (agent);
    s_test_pty_wait (agent);
    s_test_pty_errors (agent, full);

    //  Masters are closed once their processes are finished and drained.
    s_kill (agent, full, SIGKILL);
    sbx_msg_t *reply = s_status_wait (agent, full, 1u << 30, 5000);
    assert (!sbx_msg_agent_status_ok (reply)->running);
    sbx_msg_destroy (&reply);
    for (int i = 0; i < 100 && s_masters_open (agent->pid) > 0; i++)
        usleep (20000); //  the end of output may come a moment after the reap
    assert (s_masters_open (agent->pid) == 0);

    //  A request still held when the host goes: the agent ends cleanly (s_stop checks).
    uint64_t pid = s_exec_pty (agent, "sleep 100", 0, 0);
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (msg)->pid = pid;
    sbx_msg_agent_status (msg)->wait_ms = 60000;
    s_send (agent, &msg);
    s_ping (agent);
    s_stop (&agent);
    s_test_pty_hangup ();
    printf ("   agent_pty: %lld ms\n", (long long) (s_mono_ms () - t0));
}

//  --- agent_files

static sbx_msg_t *s_write_msg (const char *path, const void *data, size_t size, uint64_t offset)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
    sbx_agent_file_write_t *w = sbx_msg_agent_file_write (msg);
    sbx_str_set (&w->path, path);
    sbx_bytes_set (&w->data, data, size);
    w->offset = offset;
    return msg;
}

static sbx_msg_t *s_read_msg (const char *path, uint64_t offset, uint64_t length)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
    sbx_str_set (&sbx_msg_agent_file_read (msg)->path, path);
    sbx_msg_agent_file_read (msg)->offset = offset;
    sbx_msg_agent_file_read (msg)->length = length;
    return msg;
}

//  agent.stats from the real agent, on this host: memory and the root filesystem's
//  figures, and lo's bytes (the test runs it with --netdev lo).
static void s_test_stats (void)
{
    client_t *agent = s_start (false, NULL, NULL);
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATS);
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_STATS_OK);
    sbx_agent_stats_ok_t *ok = sbx_msg_agent_stats_ok (reply);
    assert (ok->memory_total_bytes > 0 && ok->memory_used_bytes <= ok->memory_total_bytes);
    assert (ok->disk_total_bytes > 0 && ok->disk_used_bytes <= ok->disk_total_bytes);
    sbx_msg_destroy (&reply);
    s_stop (&agent);
}

static void s_test_files (void)
{
    client_t *agent = s_start (false, NULL, NULL);
    int64_t t0 = s_mono_ms ();
    char dir[] = "/tmp/sbx-agent-test-XXXXXX";
    char *made = mkdtemp (dir);
    assert (made);
    char path[256];
    snprintf (path, sizeof path, "%s/new/parent/dirs/random.bin", dir);

    //  1 MiB of random bytes, written in uneven chunks, mode 0600.
    size_t size = 1024 * 1024;
    uint8_t *data = malloc (size);
    srand (12345);
    for (size_t i = 0; i < size; i++)
        data[i] = (uint8_t) rand ();
    size_t chunk = 300 * 1000;
    for (size_t off = 0; off < size; off += chunk) {
        size_t n = size - off < chunk ? size - off : chunk;
        sbx_msg_t *msg = s_write_msg (path, data + off, n, off);
        sbx_msg_agent_file_write (msg)->truncate = off == 0;
        sbx_msg_agent_file_write (msg)->mode = 0600;
        sbx_msg_t *reply = s_call (agent, &msg);
        assert (reply->type == SBX_MSG_AGENT_FILE_WRITE_OK);
        assert (sbx_msg_agent_file_write_ok (reply)->size == off + n);
        sbx_msg_destroy (&reply);
    }
    struct stat st;
    int rc = stat (path, &st);
    assert (rc == 0 && (st.st_mode & 07777) == 0600 && (size_t) st.st_size == size);
    //  Read back in chunks of another size.
    uint8_t *back = malloc (size);
    size_t got = 0;
    while (true) {
        sbx_msg_t *msg = s_read_msg (path, got, 250000);
        sbx_msg_t *reply = s_call (agent, &msg);
        assert (reply->type == SBX_MSG_AGENT_FILE_READ_OK);
        sbx_agent_file_read_ok_t *r = sbx_msg_agent_file_read_ok (reply);
        assert (r->size == size && got + r->data.size <= size);
        memcpy (back + got, r->data.data, r->data.size);
        got += r->data.size;
        bool eof = r->eof;
        sbx_msg_destroy (&reply);
        if (eof)
            break;
    }
    assert (got == size && memcmp (data, back, size) == 0);
    //  One whole-MiB read too.
    sbx_msg_t *msg = s_read_msg (path, 0, 0);
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (sbx_msg_agent_file_read_ok (reply)->data.size == size);
    assert (memcmp (sbx_msg_agent_file_read_ok (reply)->data.data, data, size) == 0);
    assert (sbx_msg_agent_file_read_ok (reply)->eof);
    sbx_msg_destroy (&reply);

    //  Truncate, append, an executable mode, an empty file.
    snprintf (path, sizeof path, "%s/script.sh", dir);
    msg = s_write_msg (path, "#!/bin/sh\necho hi", 17, 0);
    sbx_msg_agent_file_write (msg)->mode = 0755;
    reply = s_call (agent, &msg);
    sbx_msg_destroy (&reply);
    msg = s_write_msg (path, "\necho there\n", 12, 0);
    sbx_msg_agent_file_write (msg)->append = true;
    reply = s_call (agent, &msg);
    assert (sbx_msg_agent_file_write_ok (reply)->size == 29);
    sbx_msg_destroy (&reply);
    msg = s_exec_msg (path, false, 0);
    reply = s_call (agent, &msg);
    assert (s_bytes_is (&sbx_msg_agent_exec_ok (reply)->stdout, "hi\nthere\n"));
    sbx_msg_destroy (&reply);
    msg = s_write_msg (path, "", 0, 3);
    sbx_msg_agent_file_write (msg)->truncate = true;
    reply = s_call (agent, &msg);
    assert (sbx_msg_agent_file_write_ok (reply)->size == 3);
    sbx_msg_destroy (&reply);
    msg = s_read_msg (path, 10, 5);
    reply = s_call (agent, &msg);
    assert (sbx_msg_agent_file_read_ok (reply)->data.size == 0);
    assert (sbx_msg_agent_file_read_ok (reply)->eof);
    sbx_msg_destroy (&reply);

    //  Errors a person can act on.
    msg = s_read_msg ("/no/such/file", 0, 0);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_NOT_FOUND, "no such file: /no/such/file");
    msg = s_read_msg ("relative/path", 0, 0);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "absolute");
    msg = s_read_msg (dir, 0, 0);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "directory");
    msg = s_read_msg (path, 0, 2 * 1024 * 1024);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "limit");
    snprintf (path, sizeof path, "%s/huge.bin", dir);
    msg = s_write_msg (path, data, 100, 1024u * 1024 * 1024 - 10);
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_TOO_LARGE, "limited to 1073741824 bytes");
    assert (stat (path, &st) != 0); //  refused before anything was made
    msg = s_write_msg (path, data, 100, 0);
    sbx_msg_agent_file_write (msg)->mode = 010000;
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "mode");

    char cmd[300];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    rc = system (cmd);
    assert (rc == 0);
    free (data);
    free (back);
    s_stop (&agent);
    printf ("   agent_files: %lld ms\n", (long long) (s_mono_ms () - t0));
}

//  --- agent_malformed

static void s_expect_bad_frame (client_t *agent, uint64_t rid)
{
    sbx_err_t err;
    sbx_msg_t *reply = agent_frame_recv (agent->frame, WAIT_MS, &err);
    assert (reply && reply->rid == rid);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, NULL);
}

static void s_send_framed (client_t *agent, const uint8_t *data, size_t size)
{
    uint8_t head[4] = {(uint8_t) (size >> 24), (uint8_t) (size >> 16), (uint8_t) (size >> 8),
                       (uint8_t) size};
    s_send_raw (agent, head, 4);
    s_send_raw (agent, data, size);
}

static void s_test_malformed (void)
{
    client_t *agent = s_start (false, NULL, NULL);
    int64_t t0 = s_mono_ms ();
    srand (777);
    //  Random payloads with right lengths: one error each, the stream stays in step.
    for (int i = 0; i < 200; i++) {
        uint8_t junk[300];
        size_t n = 1 + (size_t) rand () % sizeof junk;
        for (size_t k = 0; k < n; k++)
            junk[k] = (uint8_t) rand ();
        s_send_framed (agent, junk, n);
        s_expect_bad_frame (agent, 0);
    }
    s_ping (agent);

    //  A huge length prefix followed by garbage: one error, then the agent finds the next
    //  frame. (Garbage that looks like a header would stall it until the host resets the
    //  stream by reconnecting; this garbage does not.)
    uint8_t huge[4] = {0x7f, 0xff, 0xff, 0xff};
    s_send_raw (agent, huge, 4);
    uint8_t garbage[1000];
    for (size_t k = 0; k < sizeof garbage; k++)
        garbage[k] = (uint8_t) (0x03 + rand () % 0x7c); //  no small length byte, no map
    s_send_raw (agent, garbage, sizeof garbage);
    s_expect_bad_frame (agent, 0);
    s_ping (agent);
    uint8_t zero[4] = {0, 0, 0, 0};
    s_send_raw (agent, zero, 4);
    s_expect_bad_frame (agent, 0);
    s_ping (agent);

    //  Valid frames of types the agent does not serve: answered by rid.
    sbx_msg_type_t wrong[] = {SBX_MSG_AGENT_EXEC_OK, SBX_MSG_PEER_HELLO, SBX_MSG_AGENT_HELLO};
    for (size_t i = 0; i < 3; i++) {
        sbx_msg_t *msg = sbx_msg_new (wrong[i]);
        sbx_err_t err;
        //  Bodies with their required fields, so the codec sends them.
        if (wrong[i] == SBX_MSG_PEER_HELLO) {
            sbx_msg_peer_hello (msg)->role = SBX_ROLE_VMD;
            sbx_str_set (&sbx_msg_peer_hello (msg)->instance, "x");
        }
        if (wrong[i] == SBX_MSG_AGENT_HELLO)
            sbx_str_set (&sbx_msg_agent_hello (msg)->version, "x");
        msg->rid = 500 + i;
        uint8_t *enc;
        size_t size;
        int rc = sbx_msg_encode (msg, &enc, &size, &err);
        assert (rc == 0);
        s_send_framed (agent, enc, size);
        sbx_msg_t *reply = s_wait (agent, 500 + i);
        s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "does not handle");
        //  The same frame cut short, with a length that matches the cut.
        s_send_framed (agent, enc, size - 2);
        s_expect_bad_frame (agent, 0);
        free (enc);
        sbx_msg_destroy (&msg);
    }
    //  A request missing a required field: the error names it, with the rid.
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    msg->rid = 9001;
    uint8_t *enc;
    size_t size;
    sbx_err_t err;
    int rc = sbx_msg_encode (msg, &enc, &size, &err);
    assert (rc == 0);
    //  Turn "agent.ping" into "agent.exec" on the wire: same length, no command.
    uint8_t *at = memmem (enc, size, "agent.ping", 10);
    assert (at);
    memcpy (at, "agent.exec", 10);
    s_send_framed (agent, enc, size);
    sbx_msg_t *reply = agent_frame_recv (agent->frame, WAIT_MS, &err);
    assert (reply && reply->rid == 9001);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "command");
    free (enc);
    sbx_msg_destroy (&msg);

    //  A partial frame, then the rest: nothing lost.
    msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    msg->rid = 77;
    rc = sbx_msg_encode (msg, &enc, &size, &err);
    assert (rc == 0);
    uint8_t head[4] = {0, 0, 0, (uint8_t) size};
    s_send_raw (agent, head, 3);
    usleep (50000);
    s_send_raw (agent, head + 3, 1);
    s_send_raw (agent, enc, 2);
    usleep (50000);
    s_send_raw (agent, enc + 2, size - 2);
    reply = agent_frame_recv (agent->frame, WAIT_MS, &err);
    assert (reply && reply->rid == 77 && reply->type == SBX_MSG_AGENT_PING_OK);
    sbx_msg_destroy (&reply);
    free (enc);
    sbx_msg_destroy (&msg);

    s_ping (agent);
    s_stop (&agent);
    printf ("   agent_malformed: %lld ms\n", (long long) (s_mono_ms () - t0));
}

//  --- agent_fuzz: valid requests with random bytes changed, framed with the right
//  length. Whatever decodes is served (in namespaces, so a mangled setup cannot touch
//  the host; mangled paths are only read); the agent must answer a ping afterwards.

static void s_test_fuzz (void)
{
    client_t *agent = s_start (true, NULL, NULL);
    if (!agent) {
        //  Never a silent pass: the suite runs as root (README), where this works.
        fprintf (stderr,
                 "agent_fuzz: cannot make UTS and network namespaces (run the tests as root)\n");
        exit (1);
    }
    int64_t t0 = s_mono_ms ();
    sbx_msg_t *seeds[9];
    seeds[0] = s_exec_msg ("true", false, 1000);
    sbx_strmap_set (&sbx_msg_agent_exec (seeds[0])->env, "K", "V");
    seeds[1] = s_read_msg ("/proc/self/status", 0, 100);
    seeds[2] = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (seeds[2])->pid = 1;
    seeds[3] = sbx_msg_new (SBX_MSG_AGENT_PS);
    seeds[4] = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_str_set (&sbx_msg_agent_setup (seeds[4])->hostname, "fuzz");
    seeds[5] = sbx_msg_new (SBX_MSG_AGENT_PING);
    seeds[6] = sbx_msg_new (SBX_MSG_AGENT_INPUT);
    sbx_msg_agent_input (seeds[6])->pid = 1;
    sbx_bytes_set (&sbx_msg_agent_input (seeds[6])->data, "ls\n", 3);
    seeds[7] = sbx_msg_new (SBX_MSG_AGENT_RESIZE);
    *sbx_msg_agent_resize (seeds[7]) = (sbx_agent_resize_t){.pid = 1, .rows = 24, .cols = 80};
    seeds[8] = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (seeds[8])->pid = 1;
    sbx_msg_agent_status (seeds[8])->wait_ms = 20;
    srand (4242);
    int answered = 0;
    for (int i = 0; i < 3000; i++) {
        sbx_msg_t *seed = seeds[rand () % 9];
        seed->rid = 100000 + (uint64_t) i;
        uint8_t *enc;
        size_t size;
        sbx_err_t err;
        int rc = sbx_msg_encode (seed, &enc, &size, &err);
        assert (rc == 0);
        int flips = 1 + rand () % 4;
        for (int k = 0; k < flips; k++)
            enc[rand () % size] = (uint8_t) rand ();
        s_send_framed (agent, enc, size);
        free (enc);
        //  Every frame gets exactly one answer (a reply or an error), except those
        //  whose type was mangled into error, and foreground execs of mangled
        //  commands answer later: collect what comes without waiting for each.
        sbx_msg_t *reply;
        while ((reply = agent_frame_recv (agent->frame, 0, &err)) != NULL) {
            answered++;
            sbx_msg_destroy (&reply);
        }
    }
    //  Late answers (mangled foreground execs) may still come: read up to the ping's.
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    uint64_t rid = s_send (agent, &msg);
    while (true) {
        sbx_err_t err;
        sbx_msg_t *reply = agent_frame_recv (agent->frame, WAIT_MS, &err);
        assert (reply);
        bool done = reply->rid == rid && reply->type == SBX_MSG_AGENT_PING_OK;
        answered += !done;
        sbx_msg_destroy (&reply);
        if (done)
            break;
    }
    for (int i = 0; i < 9; i++)
        sbx_msg_destroy (&seeds[i]);
    s_stop (&agent);
    printf ("   agent_fuzz: %d answers, %lld ms\n", answered, (long long) (s_mono_ms () - t0));
}

//  --- agent_setup

static void s_test_setup (void)
{
    client_t *agent = s_start (true, NULL, NULL);
    if (!agent) {
        //  Never a silent pass: the suite runs as root (README), where this works.
        fprintf (stderr,
                 "agent_setup: cannot make UTS and network namespaces (run the tests as root)\n");
        exit (1);
    }
    int64_t t0 = s_mono_ms ();
    char host_before[256];
    gethostname (host_before, sizeof host_before);

    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_agent_setup_t *setup = sbx_msg_agent_setup (msg);
    sbx_str_set (&setup->hostname, "sbx-agent-test");
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    setup->time_ms = (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000 + 60000;
    sbx_strmap_set (&setup->env, "A", "1");
    sbx_strmap_set (&setup->env, "B", "2");
    sbx_msg_t *reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_SETUP_OK);
    assert (!strcmp (sbx_msg_agent_setup_ok (reply)->hostname, "sbx-agent-test"));
    int64_t adjust = sbx_msg_agent_setup_ok (reply)->clock_adjust_ms;
    assert (adjust > 59000 && adjust <= 60000); //  --no-clock: computed, not applied
    sbx_msg_destroy (&reply);

    msg = s_exec_msg ("hostname; echo \"$A$B\"; ip -o link show lo", false, 0);
    sbx_strmap_set (&sbx_msg_agent_exec (msg)->env, "B", "3");
    reply = s_call (agent, &msg);
    sbx_bytes_t *out = &sbx_msg_agent_exec_ok (reply)->stdout;
    assert (out->size > 20 && !memcmp (out->data, "sbx-agent-test\n13\n", 18));
    assert (memmem (out->data, out->size, ",UP", 3)); //  network on: lo brought up
    sbx_msg_destroy (&reply);

    msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_msg_agent_setup (msg)->no_network = true;
    reply = s_call (agent, &msg);
    assert (reply->type == SBX_MSG_AGENT_SETUP_OK);
    assert (!strcmp (sbx_msg_agent_setup_ok (reply)->hostname, "sbx-agent-test"));
    sbx_msg_destroy (&reply);
    msg = s_exec_msg ("echo \"[$A]\"; ip -o link show lo", false, 0);
    reply = s_call (agent, &msg);
    out = &sbx_msg_agent_exec_ok (reply)->stdout;
    assert (!memcmp (out->data, "[]\n", 3)); //  the default env was replaced
    assert (!memmem (out->data, out->size, ",UP", 3));
    sbx_msg_destroy (&reply);

    msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_str_set (&sbx_msg_agent_setup (msg)->hostname, "");
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "hostname");
    msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_strmap_set (&sbx_msg_agent_setup (msg)->env, "", "x");
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "env");

    msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    sbx_str_set (&sbx_msg_agent_setup (msg)->mac, "53:54:00:00:00:01"); //  multicast
    reply = s_call (agent, &msg);
    s_expect_error (&reply, SBX_E_INVALID_ARGUMENT, "mac");
    char host_after[256];
    gethostname (host_after, sizeof host_after);
    assert (!strcmp (host_before, host_after));
    s_stop (&agent);

    //  The sandbox's own MAC, set on an interface that has another (a dummy, else one end
    //  of a veth pair, made in the agent's namespace), announced (arp_notify), said.
    agent = s_start (true, "--netdev", "sbxmac0");
    assert (agent);
    msg = s_exec_msg ("ip link add sbxmac0 type dummy 2>/dev/null || "
                      "ip link add sbxmac0 type veth peer name sbxmac1",
                      false, 0);
    reply = s_call (agent, &msg);
    bool made = sbx_msg_agent_exec_ok (reply)->exit_code == 0;
    sbx_msg_destroy (&reply);
    if (made) {
        msg = sbx_msg_new (SBX_MSG_AGENT_SETUP);
        sbx_str_set (&sbx_msg_agent_setup (msg)->mac, "52:54:00:0a:0b:0c");
        reply = s_call (agent, &msg);
        assert (reply->type == SBX_MSG_AGENT_SETUP_OK);
        assert (!strcmp (sbx_msg_agent_setup_ok (reply)->mac, "52:54:00:0a:0b:0c"));
        sbx_msg_destroy (&reply);
        //  (ip, not /sys/class/net: sysfs is the host's network namespace's here.)
        msg = s_exec_msg ("cat /proc/sys/net/ipv4/conf/sbxmac0/arp_notify; ip -o link show sbxmac0",
                          false, 0);
        reply = s_call (agent, &msg);
        out = &sbx_msg_agent_exec_ok (reply)->stdout;
        assert (out->size > 2 && !memcmp (out->data, "1\n", 2));
        assert (memmem (out->data, out->size, "link/ether 52:54:00:0a:0b:0c ", 29));
        sbx_msg_destroy (&reply);
    } else
        printf ("   agent_setup: no dummy or veth interface here: the MAC is not set\n");
    s_stop (&agent);
    printf ("   agent_setup: %lld ms\n", (long long) (s_mono_ms () - t0));
}

int main (int argc, char *argv[])
{
    if (argc < 2) {
        fprintf (stderr, "usage: agent_selftest TEST [PATH-TO-SBX-AGENT]\n");
        return 2;
    }
    const char *test = argv[1];
    s_agent_path = argc > 2 ? argv[2] : "sbx-agent";
    signal (SIGPIPE, SIG_IGN);
    printf ("Running agent test %s:\n", test);
    if (!strcmp (test, "agent_buf"))
        agent_buf_test (true);
    else if (!strcmp (test, "agent_frame"))
        agent_frame_test (true);
    else if (!strcmp (test, "agent_exec"))
        s_test_exec ();
    else if (!strcmp (test, "agent_pty"))
        s_test_pty ();
    else if (!strcmp (test, "agent_files"))
        s_test_files ();
    else if (!strcmp (test, "agent_malformed"))
        s_test_malformed ();
    else if (!strcmp (test, "agent_fuzz"))
        s_test_fuzz ();
    else if (!strcmp (test, "agent_setup"))
        s_test_setup ();
    else if (!strcmp (test, "agent_stats")) {
        agent_stats_test (true);
        s_test_stats ();
    } else {
        fprintf (stderr, "unknown test %s\n", test);
        return 2;
    }
    printf ("OK\n");
    return 0;
}
