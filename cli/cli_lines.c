/*  cli_lines - newline-delimited messages from a file descriptor (see cli_lines.h). */
#include "cli_lines.h"
#include "sbx_common.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

struct cli_lines_t {
    int fd;
    size_t max_line;
    char *buf; //  bytes read and not yet returned start at buf + start
    size_t start, end, capacity;
    bool skipping; //  inside a line over the limit, dropping it
    bool eof;
};

cli_lines_t *cli_lines_new (int fd, size_t max_line)
{
    cli_lines_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->fd = fd;
    self->max_line = max_line;
    self->capacity = 65536;
    self->buf = malloc (self->capacity);
    if (!self->buf)
        free (self), self = NULL;
    return self;
}

void cli_lines_destroy (cli_lines_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free ((*self_p)->buf);
    free (*self_p);
    *self_p = NULL;
}

const char *cli_lines_next (cli_lines_t *self, bool *too_long)
{
    *too_long = false;
    while (true) {
        char *nl = memchr (self->buf + self->start, '\n', self->end - self->start);
        if (nl) {
            char *line = self->buf + self->start;
            self->start = nl - self->buf + 1;
            if (self->skipping || (size_t) (nl - line) > self->max_line) {
                self->skipping = false;
                *too_long = true;
                return "";
            }
            *nl = 0;
            if (nl > line && nl[-1] == '\r')
                nl[-1] = 0;
            if (*line)
                return line;
            continue;
        }
        if (self->eof)
            return NULL; //  a last line without "\n" is an unfinished message
        //  Keep the unfinished line at the front, then make room for more.
        if (self->start) {
            memmove (self->buf, self->buf + self->start, self->end - self->start);
            self->end -= self->start;
            self->start = 0;
        }
        if (self->end > self->max_line) {
            self->skipping = true; //  drop what we have; the rest goes up to its "\n"
            self->end = 0;
        }
        if (self->end == self->capacity) {
            char *grown = realloc (self->buf, self->capacity * 2);
            if (!grown)
                return NULL;
            self->buf = grown;
            self->capacity *= 2;
        }
        ssize_t n = read (self->fd, self->buf + self->end, self->capacity - self->end);
        if (n < 0 && errno == EINTR)
            return NULL; //  a signal: the caller stops as at end of input
        if (n <= 0)
            self->eof = true;
        else
            self->end += (size_t) n;
    }
}

void cli_lines_test (bool verbose)
{
    (void) verbose;
    int fds[2];
    assert (pipe (fds) == 0);
    //  Pieces that split lines anywhere, CRLF, empty lines, a line over the limit.
    const char *input = "{\"a\":1}\n\r\n\n{\"b\":\r\n{\"c\":3}\n";
    assert (write (fds[1], input, 5) == 5);
    assert (write (fds[1], input + 5, strlen (input) - 5) == (ssize_t) (strlen (input) - 5));
    char big[200];
    memset (big, 'x', sizeof big);
    assert (write (fds[1], big, sizeof big) == sizeof big);
    assert (write (fds[1], "\nlast\nunfinished", 16) == 16);
    close (fds[1]);
    cli_lines_t *lines = cli_lines_new (fds[0], 100);
    bool too_long;
    assert (streq (cli_lines_next (lines, &too_long), "{\"a\":1}") && !too_long);
    assert (streq (cli_lines_next (lines, &too_long), "{\"b\":") && !too_long);
    assert (streq (cli_lines_next (lines, &too_long), "{\"c\":3}"));
    assert (streq (cli_lines_next (lines, &too_long), "") && too_long);
    assert (streq (cli_lines_next (lines, &too_long), "last") && !too_long);
    assert (cli_lines_next (lines, &too_long) == NULL);
    cli_lines_destroy (&lines);
    close (fds[0]);

    //  A long line within the limit grows the buffer.
    assert (pipe (fds) == 0);
    cli_lines_t *big_lines = cli_lines_new (fds[0], 1 << 20);
    char *long_line = malloc (200001);
    memset (long_line, 'y', 200000);
    long_line[200000] = '\n';
    //  The pipe holds 64 KiB: write from a child so the reader can drain it.
    pid_t pid = fork ();
    if (pid == 0) {
        close (fds[0]);
        ssize_t at = 0;
        while (at < 200001) {
            ssize_t n = write (fds[1], long_line + at, 200001 - at);
            if (n <= 0)
                _exit (1);
            at += n;
        }
        _exit (0);
    }
    close (fds[1]);
    const char *got = cli_lines_next (big_lines, &too_long);
    assert (got && strlen (got) == 200000 && !too_long);
    assert (cli_lines_next (big_lines, &too_long) == NULL);
    int status;
    waitpid (pid, &status, 0);
    assert (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    free (long_line);
    cli_lines_destroy (&big_lines);
    close (fds[0]);
}
