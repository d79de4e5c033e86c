/*  cli_password - see cli_password.h */
#include "cli_password.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

char *cli_password_read_line (FILE *file, bool *too_long)
{
    char buf[CLI_PASSWORD_MAX + 2];
    *too_long = false;
    if (!fgets (buf, sizeof buf, file))
        return NULL;
    size_t len = strcspn (buf, "\r\n");
    if (len > CLI_PASSWORD_MAX) {
        *too_long = true;
        sbx_secret_wipe (buf);
        return NULL;
    }
    buf[len] = 0;
    char *line = strdup (buf);
    sbx_secret_wipe (buf);
    return line;
}

const char *cli_password_refusal (const char *password)
{
    if (!password || strlen (password) < CLI_PASSWORD_MIN)
        return "the password must have at least 8 characters";
    for (const char *p = password; *p; p++)
        if ((unsigned char) *p < 0x20 || *p == 0x7f)
            return "the password must not hold control characters";
    return NULL;
}

//  Asks on the terminal with echo off; the answer, or NULL (no terminal, end of input).
static char *s_ask (FILE *tty, const char *prompt)
{
    fprintf (tty, "%s", prompt);
    fflush (tty);
    struct termios saved, quiet;
    int fd = fileno (tty);
    bool restore = tcgetattr (fd, &saved) == 0;
    if (restore) {
        quiet = saved;
        quiet.c_lflag &= ~(tcflag_t) ECHO;
        quiet.c_lflag |= ECHONL;
        tcsetattr (fd, TCSAFLUSH, &quiet);
    }
    bool too_long;
    char *answer = cli_password_read_line (tty, &too_long);
    if (restore)
        tcsetattr (fd, TCSAFLUSH, &saved);
    return answer;
}

static void s_free (char **password_p)
{
    if (*password_p) {
        sbx_secret_wipe (*password_p);
        free (*password_p);
        *password_p = NULL;
    }
}

char *cli_password_hash_new (const char *command, bool from_stdin, int *rc)
{
    *rc = 2;
    char *password = NULL;
    if (from_stdin) {
        bool too_long = false;
        password = cli_password_read_line (stdin, &too_long);
        if (!password) {
            fprintf (stderr, "%s: %s\n", command,
                     too_long ? "the password on standard input is over 1024 characters"
                              : "--password-stdin: standard input holds no line");
            return NULL;
        }
    } else {
        FILE *tty = fopen ("/dev/tty", "r+");
        if (!tty) {
            fprintf (stderr,
                     "%s: no terminal to type the password on (%s): give it on standard input "
                     "with --password-stdin\n",
                     command, strerror (errno));
            return NULL;
        }
        password = s_ask (tty, "New password: ");
        char *again = password ? s_ask (tty, "Same password again: ") : NULL;
        fclose (tty);
        bool same = password && again && streq (password, again);
        s_free (&again);
        if (!same) {
            fprintf (stderr, "%s: %s; nothing was changed\n", command,
                     password ? "the two passwords differ" : "no password was typed");
            s_free (&password);
            return NULL;
        }
    }
    const char *refusal = cli_password_refusal (password);
    if (refusal) {
        fprintf (stderr, "%s: %s (invalid_argument)\n", command, refusal);
        s_free (&password);
        return NULL;
    }
    char *hash = sbx_secret_password_hash (password);
    s_free (&password);
    if (!hash) {
        fprintf (stderr, "%s: cannot hash the password (out of memory?)\n", command);
        *rc = 1;
    }
    return hash;
}

char *cli_password_generate (void)
{
    return sbx_secret_token ("", 20);
}

void cli_password_test (bool verbose)
{
    (void) verbose;
    assert (cli_password_refusal ("1234567") && strstr (cli_password_refusal ("short"), "8"));
    assert (cli_password_refusal (NULL));
    assert (cli_password_refusal ("tab\there!"));
    assert (cli_password_refusal ("correct horse") == NULL);
    //  Lines: without their newline, CR LF too; too long is refused, not cut.
    char text[CLI_PASSWORD_MAX + 64];
    memset (text, 'x', sizeof text);
    memcpy (text, "first one\r\nsecond\n", 18);
    text[18 + CLI_PASSWORD_MAX + 1] = '\n';
    FILE *file = fmemopen (text, 18 + CLI_PASSWORD_MAX + 2, "r");
    assert (file);
    bool too_long = true;
    char *line = cli_password_read_line (file, &too_long);
    assert (line && streq (line, "first one") && !too_long);
    free (line);
    line = cli_password_read_line (file, &too_long);
    assert (line && streq (line, "second"));
    free (line);
    assert (cli_password_read_line (file, &too_long) == NULL && too_long);
    fclose (file);
    //  Generated: 20 base62 characters, a different one each time, good as a password.
    char *one = cli_password_generate ();
    char *two = cli_password_generate ();
    assert (one && two && strlen (one) == 20 && !streq (one, two));
    assert (cli_password_refusal (one) == NULL);
    for (const char *p = one; *p; p++)
        assert (isalnum ((unsigned char) *p));
    free (one);
    free (two);
}
