/*  fuzz_qmp - libFuzzer harness for the QMP reply parser (vmd_qmp).

    QEMU's QMP socket is read by vmd_qmp: line splitting, the greeting, capability
    negotiation, replies matched by id, events, HMP output. QEMU runs the guest, so
    what it says is not trusted. The harness plays QEMU on a real unix socket: a real
    vmd_qmp connects from a real zloop, with commands already issued (query-status,
    hostfwd_add and _remove through HMP, a plain HMP command, migrate_to_fd's getfd
    chain, migrate-set-parameters), and the input is everything QEMU sends before it
    hangs up. Properties: every command gets exactly one answer, a result or an error
    and never both; events have names; the connection ends with the closed callback
    and nothing is left behind (ASan's leak check). Seeds: real QMP sessions (greeting,
    capabilities, replies and events as QEMU 7.2 writes them), ids in issue order:
    1 query-status, 2 hostfwd_add, 3 hostfwd_remove, 4 HMP, 5 getfd, 6 bandwidth,
    7 qmp_capabilities, 8 the migrate after getfd, 9 query-status sent once ready.
*/
#include "vmd_qmp.h"
#include "sbx_common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_qmp"
#include "fuzz_check.h"

static struct {
    zloop_t *loop;
    char dir[64];
    char path[128];
    int listener;
    int devnull;
    //  This input's.
    const uint8_t *data;
    size_t size;
    int conn;
    int issued, answered;
    bool closed;
    bool done; //  QEMU's end saw vmd_qmp hang up
    bool hung;
} s;

static void s_on_reply (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp, (void) arg;
    CHECK ((result == NULL) != (error == NULL), "an answer must be a result or an error");
    s.answered++;
    CHECK (s.answered <= s.issued, "more answers than commands");
}

static void s_on_ready (vmd_qmp_t *qmp, void *arg)
{
    (void) arg;
    if (vmd_qmp_query_status (qmp, s_on_reply, NULL) == 0)
        s.issued++;
}

static void s_on_event (vmd_qmp_t *qmp, const char *event, json_t *data, void *arg)
{
    (void) qmp, (void) data, (void) arg;
    CHECK (event, "an event without a name");
}

static void s_on_closed (vmd_qmp_t *qmp, const char *reason, void *arg)
{
    (void) qmp, (void) arg;
    CHECK (reason && *reason, "closed without a reason");
    CHECK (!s.closed, "closed twice");
    s.closed = true;
}

//  QEMU's end: reads and drops what vmd_qmp writes; the loop ends when vmd_qmp hangs up.
static int s_on_conn (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop, (void) arg;
    char buf[4096];
    ssize_t n = read (item->fd, buf, sizeof buf);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return 0;
    s.done = true;
    return -1;
}

//  vmd_qmp connected: QEMU says all it has to say, then stops sending.
static int s_on_accept (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) arg;
    int conn = accept4 (item->fd, NULL, NULL, SOCK_CLOEXEC);
    CHECK (conn >= 0 && s.conn < 0, "accept");
    s.conn = conn;
    for (size_t sent = 0; sent < s.size;) {
        ssize_t n = send (conn, s.data + sent, s.size - sent, MSG_NOSIGNAL);
        CHECK (n > 0, "send to vmd_qmp");
        sent += (size_t) n;
    }
    shutdown (conn, SHUT_WR);
    fcntl (conn, F_SETFL, O_NONBLOCK);
    zmq_pollitem_t poll = {NULL, conn, ZMQ_POLLIN, 0};
    CHECK (zloop_poller (loop, &poll, s_on_conn, NULL) == 0, "poller");
    //  The hang-up (POLLHUP, an error to zloop) must reach the handler.
    zloop_poller_set_tolerant (loop, &poll);
    return 0;
}

static int s_on_stuck (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id, (void) arg;
    s.hung = true;
    return -1;
}

//  Nothing stays behind in /tmp.
static void s_cleanup (void)
{
    unlink (s.path);
    rmdir (s.dir);
}

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_qmp", SBX_LOG_ERROR);
    zsys_init ();
    zsys_handler_set (NULL); //  libFuzzer handles the signals
    s.loop = zloop_new ();
    snprintf (s.dir, sizeof s.dir, "/tmp/fuzz_qmp.XXXXXX");
    CHECK (s.loop && mkdtemp (s.dir), "setup");
    snprintf (s.path, sizeof s.path, "%s/qmp.sock", s.dir);
    s.listener = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s", s.path);
    CHECK (s.listener >= 0 && bind (s.listener, (struct sockaddr *) &addr, sizeof addr) == 0 &&
               listen (s.listener, 4) == 0,
           "listen");
    atexit (s_cleanup);
    s.devnull = open ("/dev/null", O_WRONLY | O_CLOEXEC);
    CHECK (s.devnull >= 0, "/dev/null");
    zmq_pollitem_t poll = {NULL, s.listener, ZMQ_POLLIN, 0};
    CHECK (zloop_poller (s.loop, &poll, s_on_accept, NULL) == 0, "poller");
    return 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    s.data = data;
    s.size = size;
    s.conn = -1;
    s.issued = s.answered = 0;
    s.closed = s.done = s.hung = false;
    vmd_qmp_t *qmp = vmd_qmp_new (s.loop, s.path);
    CHECK (qmp, "vmd_qmp_new");
    vmd_qmp_set_handlers (qmp, s_on_ready, s_on_event, s_on_closed, NULL);
    //  Small enough that the fuzzer reaches the limit.
    vmd_qmp_set_max_line (qmp, 4096);
    s.issued += vmd_qmp_query_status (qmp, s_on_reply, NULL) == 0;
    s.issued += vmd_qmp_hostfwd_add (qmp, "net0", "127.0.0.1", 40000, 8080, s_on_reply, NULL) == 0;
    s.issued += vmd_qmp_hostfwd_remove (qmp, "net0", "127.0.0.1", 40000, s_on_reply, NULL) == 0;
    s.issued += vmd_qmp_hmp (qmp, "info status", s_on_reply, NULL) == 0;
    s.issued += vmd_qmp_migrate_to_fd (qmp, s.devnull, s_on_reply, NULL) == 0;
    s.issued += vmd_qmp_set_max_bandwidth (qmp, 1 << 30, s_on_reply, NULL) == 0;
    CHECK (s.issued == 6, "commands refused before the connection");
    int stuck = zloop_timer (s.loop, 5000, 1, s_on_stuck, NULL);
    //  zloop_start also returns when a signal interrupts its poll (libFuzzer's timer).
    while (!s.done && !s.hung)
        zloop_start (s.loop);
    CHECK (!s.hung, "vmd_qmp did not close the connection QEMU hung up");
    zloop_timer_end (s.loop, stuck);
    CHECK (s.closed, "the closed callback did not come");
    CHECK (s.answered == s.issued, "a command without an answer");
    vmd_qmp_destroy (&qmp);
    zmq_pollitem_t poll = {NULL, s.conn, 0, 0};
    zloop_poller_end (s.loop, &poll);
    close (s.conn);
    return 0;
}
