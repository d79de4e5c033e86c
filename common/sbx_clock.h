/*  sbx_clock - wall and monotonic time in milliseconds, and ISO 8601 text. */
#ifndef SBX_CLOCK_H_INCLUDED
#define SBX_CLOCK_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Milliseconds since the Unix epoch (UTC), from CLOCK_REALTIME.
uint64_t sbx_clock_now_ms (void);

//  Milliseconds from CLOCK_MONOTONIC: for deadlines and durations, never for records.
uint64_t sbx_clock_mono_ms (void);

//  Writes "2026-11-30T01:23:45.123Z" into buf (at least 25 bytes). Returns buf.
char *sbx_clock_iso8601 (uint64_t ms, char *buf, size_t size);

//  Parses a duration such as "90s", "15m", "2h", "7d" or plain seconds. Returns
//  seconds, or -1 when the text is not a duration.
int64_t sbx_clock_parse_duration (const char *text);

void sbx_clock_test (bool verbose);

#endif
