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
#include <sys/stat.h>
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

int sbx_ready_notify (void)
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

void sbx_ready_test (bool verbose)
{
    (void) verbose;
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
