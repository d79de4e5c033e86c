/*  sbx_clock - see sbx_clock.h */
#include "sbx_clock.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t sbx_clock_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

uint64_t sbx_clock_mono_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

char *sbx_clock_iso8601 (uint64_t ms, char *buf, size_t size)
{
    time_t secs = (time_t) (ms / 1000);
    struct tm tm;
    gmtime_r (&secs, &tm);
    snprintf (buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1,
              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned) (ms % 1000));
    return buf;
}

int64_t sbx_clock_parse_duration (const char *text)
{
    if (!text || !*text)
        return -1;
    errno = 0;
    char *end;
    long long value = strtoll (text, &end, 10);
    if (errno || end == text || value < 0)
        return -1;
    long long unit = 1;
    if (*end == 's')
        unit = 1, end++;
    else if (*end == 'm')
        unit = 60, end++;
    else if (*end == 'h')
        unit = 3600, end++;
    else if (*end == 'd')
        unit = 86400, end++;
    if (*end)
        return -1;
    //  Ten years is more than any key or TTL needs and keeps products far from overflow.
    if (value > 10LL * 365 * 86400 / unit)
        return -1;
    return value * unit;
}

void sbx_clock_test (bool verbose)
{
    (void) verbose;
    char buf[32];
    assert (strcmp (sbx_clock_iso8601 (0, buf, sizeof buf), "1970-01-01T00:00:00.000Z") == 0);
    assert (strcmp (sbx_clock_iso8601 (1790000000123ULL, buf, sizeof buf),
                    "2026-09-21T14:13:20.123Z") == 0);
    assert (sbx_clock_now_ms () > 1700000000000ULL);
    uint64_t a = sbx_clock_mono_ms ();
    assert (sbx_clock_mono_ms () >= a);
    assert (sbx_clock_parse_duration ("90") == 90);
    assert (sbx_clock_parse_duration ("90s") == 90);
    assert (sbx_clock_parse_duration ("15m") == 900);
    assert (sbx_clock_parse_duration ("2h") == 7200);
    assert (sbx_clock_parse_duration ("7d") == 604800);
    assert (sbx_clock_parse_duration ("") == -1);
    assert (sbx_clock_parse_duration ("x") == -1);
    assert (sbx_clock_parse_duration ("5y") == -1);
    assert (sbx_clock_parse_duration ("-5") == -1);
    assert (sbx_clock_parse_duration ("99999999999d") == -1);
}
