/*  sbx_log - one line per event on stderr, saying which process, sandbox and request.

    2026-11-30T01:23:45.123Z INFO  sbx-broker[4242] rid=17 sandbox=sb_x0n1a2hf96 created

    The supervisor sends each daemon's stderr to <data-dir>/logs/<daemon>.log, so a
    daemon only ever writes to stderr. Context (sandbox, rid) is part of the format
    string by convention: "rid=%llu sandbox=%s ...".
*/
#ifndef SBX_LOG_H_INCLUDED
#define SBX_LOG_H_INCLUDED

#include <stdbool.h>

typedef enum { SBX_LOG_DEBUG, SBX_LOG_INFO, SBX_LOG_WARN, SBX_LOG_ERROR } sbx_log_level_t;

//  Names the process in every line (e.g. "sbx-broker") and sets the lowest level
//  printed. The level can also be set with SBX_LOG_LEVEL=debug|info|warn|error.
void sbx_log_init (const char *process, sbx_log_level_t level);

void sbx_log (sbx_log_level_t level, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));

#define sbx_debug(...) sbx_log (SBX_LOG_DEBUG, __VA_ARGS__)
#define sbx_info(...)  sbx_log (SBX_LOG_INFO, __VA_ARGS__)
#define sbx_warn(...)  sbx_log (SBX_LOG_WARN, __VA_ARGS__)
#define sbx_error(...) sbx_log (SBX_LOG_ERROR, __VA_ARGS__)

void sbx_log_test (bool verbose);

#endif
