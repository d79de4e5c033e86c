/*  sbx_ready - see sbx_ready.h */
#include "sbx_ready.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

//  Writes all of data to fd with SIGPIPE blocked, so a supervisor that went away costs
//  an error return instead of the daemon's life. A SIGPIPE this write raised is taken
//  off the pending set before the old mask comes back.
static int s_write_nosigpipe (int fd, const char *data, size_t size)
{
    sigset_t pipe_set, old_set;
    sigemptyset (&pipe_set);
    sigaddset (&pipe_set, SIGPIPE);
    sigset_t pending;
    sigpending (&pending);
    bool was_pending = sigismember (&pending, SIGPIPE) == 1;
    pthread_sigmask (SIG_BLOCK, &pipe_set, &old_set);

    int rc = 0;
    while (size > 0) {
        ssize_t n = write (fd, data, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = -1;
            break;
        }
        data += n;
        size -= (size_t) n;
    }
    if (rc == -1 && errno == EPIPE && !was_pending) {
        int saved = errno;
        const struct timespec zero = {0, 0};
        while (sigtimedwait (&pipe_set, NULL, &zero) == -1 && errno == EINTR)
            ;
        errno = saved;
    }
    pthread_sigmask (SIG_SETMASK, &old_set, NULL);
    return rc;
}

//  NOTIFY_SOCKET's value, once taken out of the environment ("" when unset).
static char s_notify_socket[sizeof ((struct sockaddr_un *) 0)->sun_path + 1];

void sbx_ready_init (void)
{
    const char *text = getenv (SBX_READY_NOTIFY_ENV);
    if (text) {
        //  A value too long for sun_path cannot name a socket: kept as unusable ("?").
        if (strlen (text) < sizeof s_notify_socket)
            strcpy (s_notify_socket, text);
        else
            strcpy (s_notify_socket, "?");
        unsetenv (SBX_READY_NOTIFY_ENV);
    }
}

//  Sends one sd_notify datagram ("READY=1") to NOTIFY_SOCKET; 0 when there is none.
static int s_notify_send (const char *text)
{
    sbx_ready_init ();
    const char *name = s_notify_socket;
    if (!*name)
        return 0;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t length = strlen (name);
    if ((name[0] != '/' && name[0] != '@') || length < 2 || length > sizeof addr.sun_path)
        return -1;
    memcpy (addr.sun_path, name, length);
    if (name[0] == '@')
        addr.sun_path[0] = 0; //  an abstract name: no file, not NUL-terminated
    else if (length == sizeof addr.sun_path)
        return -1; //  a path needs its NUL
    socklen_t size =
        (socklen_t) (offsetof (struct sockaddr_un, sun_path) + length + (name[0] == '/' ? 1 : 0));
    int fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    ssize_t sent = sendto (fd, text, strlen (text), MSG_NOSIGNAL, (struct sockaddr *) &addr, size);
    close (fd);
    return sent == (ssize_t) strlen (text) ? 0 : -1;
}

int sbx_ready_stopping (void)
{
    return s_notify_send ("STOPPING=1");
}

//  The supervisor's pipe (SBX_READY_FD), if there is one.
static int s_pipe_notify (void)
{
    const char *text = getenv (SBX_READY_ENV);
    if (!text)
        return 0;
    char *end;
    errno = 0;
    long fd = strtol (text, &end, 10);
    bool valid = errno == 0 && end != text && *end == 0 && fd >= 0 && fd <= INT_MAX;
    //  Whatever happens, this is the only notification: children must not see it.
    unsetenv (SBX_READY_ENV);
    if (!valid)
        return -1;

    //  An inherited variable could name a descriptor that is now a file or a tty;
    //  writing "ready" into that would do harm, so only pipes and sockets qualify.
    struct stat st;
    if (fstat ((int) fd, &st) == -1 || !(S_ISFIFO (st.st_mode) || S_ISSOCK (st.st_mode)))
        return -1;
    int rc = s_write_nosigpipe ((int) fd, "ready\n", 6);
    close ((int) fd);
    return rc;
}

int sbx_ready_notify (void)
{
    int rc = s_pipe_notify ();
    if (s_notify_send ("READY=1"))
        rc = -1;
    return rc;
}

//  Binds a datagram socket at name (a path, or "@abstract") for the test's systemd.
static int s_test_listener (const char *name)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t length = strlen (name);
    memcpy (addr.sun_path, name, length);
    if (name[0] == '@')
        addr.sun_path[0] = 0;
    int fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert (fd >= 0);
    socklen_t size =
        (socklen_t) (offsetof (struct sockaddr_un, sun_path) + length + (name[0] == '/' ? 1 : 0));
    assert (bind (fd, (struct sockaddr *) &addr, size) == 0);
    struct timeval timeout = {5, 0};
    setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return fd;
}

static void s_test_expect (int fd, const char *text)
{
    char buf[64] = {0};
    ssize_t n = recv (fd, buf, sizeof buf - 1, 0);
    assert (n == (ssize_t) strlen (text));
    assert (memcmp (buf, text, (size_t) n) == 0);
}

//  systemd's side: NOTIFY_SOCKET at a path and at an abstract name, with and without the
//  supervisor's pipe; bad values and a socket nobody listens on fail.
static void s_test_systemd (void)
{
    char path[64];
    snprintf (path, sizeof path, "/tmp/sbx-ready-test-%d.sock", (int) getpid ());
    unlink (path);
    int listener = s_test_listener (path);
    setenv (SBX_READY_NOTIFY_ENV, path, 1);
    sbx_ready_init ();
    assert (getenv (SBX_READY_NOTIFY_ENV) == NULL); //  children will not see it
    assert (sbx_ready_notify () == 0);
    s_test_expect (listener, "READY=1");
    assert (sbx_ready_stopping () == 0);
    s_test_expect (listener, "STOPPING=1");

    //  Both at once: the pipe gets its line, the socket its datagram.
    int fds[2];
    assert (pipe (fds) == 0);
    char value[16];
    snprintf (value, sizeof value, "%d", fds[1]);
    setenv (SBX_READY_ENV, value, 1);
    assert (sbx_ready_notify () == 0);
    s_test_expect (listener, "READY=1");
    char buf[16] = {0};
    assert (read (fds[0], buf, sizeof buf) == 6 && memcmp (buf, "ready\n", 6) == 0);
    close (fds[0]);
    close (listener);

    //  Nobody there any more: an error, the pipe's success notwithstanding.
    unlink (path);
    assert (sbx_ready_notify () == -1);

    //  An abstract name, as systemd itself uses at times.
    char abstract[64];
    snprintf (abstract, sizeof abstract, "@sbx-ready-test-%d", (int) getpid ());
    listener = s_test_listener (abstract);
    setenv (SBX_READY_NOTIFY_ENV, abstract, 1);
    sbx_ready_init ();
    assert (sbx_ready_notify () == 0);
    s_test_expect (listener, "READY=1");
    close (listener);

    //  Neither a path nor an abstract name, or too long: refused, nothing sent.
    setenv (SBX_READY_NOTIFY_ENV, "relative.sock", 1);
    sbx_ready_init ();
    assert (sbx_ready_notify () == -1);
    char long_name[200];
    memset (long_name, 'x', sizeof long_name - 1);
    long_name[0] = '/';
    long_name[sizeof long_name - 1] = 0;
    setenv (SBX_READY_NOTIFY_ENV, long_name, 1);
    sbx_ready_init ();
    assert (sbx_ready_stopping () == -1);

    //  Unset again: nothing to do.
    s_notify_socket[0] = 0;
    assert (sbx_ready_notify () == 0 && sbx_ready_stopping () == 0);
}

void sbx_ready_test (bool verbose)
{
    (void) verbose;
    unsetenv (SBX_READY_NOTIFY_ENV);
    s_test_systemd ();
    //  Not supervised: nothing to do, and that is success.
    unsetenv (SBX_READY_ENV);
    assert (sbx_ready_notify () == 0);

    //  Supervised: "ready\n" arrives, the descriptor is closed, the variable gone.
    int fds[2];
    assert (pipe (fds) == 0);
    char value[16];
    snprintf (value, sizeof value, "%d", fds[1]);
    setenv (SBX_READY_ENV, value, 1);
    assert (sbx_ready_notify () == 0);
    assert (getenv (SBX_READY_ENV) == NULL);
    assert (fcntl (fds[1], F_GETFD) == -1 && errno == EBADF);
    char buf[16] = {0};
    assert (read (fds[0], buf, sizeof buf) == 6);
    assert (memcmp (buf, "ready\n", 6) == 0);
    assert (read (fds[0], buf, sizeof buf) == 0); //  EOF: the write end is closed
    close (fds[0]);

    //  A malformed value fails and is still removed.
    setenv (SBX_READY_ENV, "3x", 1);
    assert (sbx_ready_notify () == -1);
    assert (getenv (SBX_READY_ENV) == NULL);

    //  A descriptor that is not a pipe is left alone.
    int null_fd = open ("/dev/null", O_WRONLY);
    assert (null_fd >= 0);
    snprintf (value, sizeof value, "%d", null_fd);
    setenv (SBX_READY_ENV, value, 1);
    assert (sbx_ready_notify () == -1);
    assert (fcntl (null_fd, F_GETFD) != -1);
    close (null_fd);

    //  The supervisor closed its end: an error, not a SIGPIPE death.
    assert (pipe (fds) == 0);
    close (fds[0]);
    snprintf (value, sizeof value, "%d", fds[1]);
    setenv (SBX_READY_ENV, value, 1);
    assert (sbx_ready_notify () == -1);
    sigset_t pending;
    sigpending (&pending);
    assert (sigismember (&pending, SIGPIPE) == 0);

    //  A real child process, as the supervisor runs a daemon: the descriptor is the
    //  child's, the parent reads the line.
    assert (pipe (fds) == 0);
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        close (fds[0]);
        snprintf (value, sizeof value, "%d", fds[1]);
        setenv (SBX_READY_ENV, value, 1);
        _exit (sbx_ready_notify () == 0 && getenv (SBX_READY_ENV) == NULL ? 0 : 1);
    }
    close (fds[1]);
    memset (buf, 0, sizeof buf);
    ssize_t got = 0, n;
    while ((n = read (fds[0], buf + got, sizeof buf - 1 - (size_t) got)) > 0)
        got += n;
    assert (got == 6 && memcmp (buf, "ready\n", 6) == 0);
    close (fds[0]);
    int status;
    assert (waitpid (pid, &status, 0) == pid);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
}
