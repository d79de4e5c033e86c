/*  sbx_log - see sbx_log.h */
#include "sbx_log.h"
#include "sbx_clock.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static char s_process[64] = "sbx";
static sbx_log_level_t s_level = SBX_LOG_INFO;

static const char *s_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void sbx_log_init (const char *process, sbx_log_level_t level)
{
    snprintf (s_process, sizeof s_process, "%s", process ? process : "sbx");
    s_level = level;
    const char *env = getenv ("SBX_LOG_LEVEL");
    if (env) {
        if (strcasecmp (env, "debug") == 0)
            s_level = SBX_LOG_DEBUG;
        else if (strcasecmp (env, "info") == 0)
            s_level = SBX_LOG_INFO;
        else if (strcasecmp (env, "warn") == 0)
            s_level = SBX_LOG_WARN;
        else if (strcasecmp (env, "error") == 0)
            s_level = SBX_LOG_ERROR;
    }
}

void sbx_log (sbx_log_level_t level, const char *format, ...)
{
    if (level < s_level || level > SBX_LOG_ERROR)
        return;
    char ts[32];
    sbx_clock_iso8601 (sbx_clock_now_ms (), ts, sizeof ts);
    //  Build the whole line first: one write() keeps lines from interleaving.
    char line[4096];
    int n = snprintf (line, sizeof line, "%s %s %s[%d] ", ts, s_names[level], s_process,
                      (int) getpid ());
    va_list args;
    va_start (args, format);
    int m = vsnprintf (line + n, sizeof line - n - 1, format, args);
    va_end (args);
    size_t len = (size_t) n + (m < 0 ? 0 : (size_t) m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t rc = write (STDERR_FILENO, line, len);
    (void) rc;
}

void sbx_log_test (bool verbose)
{
    sbx_log_init ("sbx_log_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    sbx_debug ("rid=%d a debug line", 1);
    //  A line longer than the buffer is cut, not overflowed.
    char big[8000];
    memset (big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sbx_debug ("%s", big);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
