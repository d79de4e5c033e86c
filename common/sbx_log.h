/*  sbx_log - one line per event on stderr, saying which process, sandbox and request.

    2026-11-30T01:23:45.123Z INFO  sbx-broker[4242] rid=17 sandbox=sb_x0n1a2hf96 created

    Context (sandbox, rid) is part of the format string by convention: the message starts
    with "key=value" words ("rid=%llu sandbox=%s ..."), optionally after one bare word
    naming the part ("mcp rid=%llu ..."). With the json format (log.format = json) the
    same event is one JSON object per line, the context words pulled out as fields:

    {"ts":"2026-11-30T01:23:45.123Z","level":"info","daemon":"sbx-broker","pid":4242,
     "request_id":17,"sandbox":"sb_x0n1a2hf96","msg":"created"}

    rid becomes request_id (a number); other keys keep their names. Either way one event
    is one line: control characters in the text are escaped, and in JSON invalid UTF-8 is
    replaced by U+FFFD.

    A daemon writes to stderr. Under `sbx up` it is told its log file (SBX_LOG_FILE) and
    opens it itself, so that after a rotation it can open it again (sbx_log_reopen, on
    SIGHUP); see docs/operations.md, "Logs".
*/
#ifndef SBX_LOG_H_INCLUDED
#define SBX_LOG_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef enum { SBX_LOG_DEBUG, SBX_LOG_INFO, SBX_LOG_WARN, SBX_LOG_ERROR } sbx_log_level_t;

//  Names the process in every line (e.g. "sbx-broker") and sets the lowest level
//  printed. The level can also be set with SBX_LOG_LEVEL=debug|info|warn|error, the
//  format with SBX_LOG_FORMAT=text|json (else text).
void sbx_log_init (const char *process, sbx_log_level_t level);

//  "text" or "json". Returns 0, or -1 (and changes nothing) for anything else.
int sbx_log_set_format (const char *format);

//  Appends every line to path (created 0640), opened O_APPEND so that writers sharing
//  it never overwrite each other. With own_stderr the file becomes the process's stdout
//  and stderr (a daemon: stray writes land there too); without, lines go to stderr and
//  to the file (sbx up: the terminal and its own log); NULL stops the copy. Returns 0,
//  or -1 (and logs why) when the file cannot be opened: lines then go where they went.
int sbx_log_set_file (const char *path, bool own_stderr);

//  Opens the file of sbx_log_set_file again, for a rotation that renamed it: lines
//  written until then went to the renamed file, whole. 0, or -1 when there is no file
//  or it cannot be opened (lines keep going to the old one).
int sbx_log_reopen (void);

//  The path given to sbx_log_set_file, or NULL.
const char *sbx_log_file (void);

void sbx_log (sbx_log_level_t level, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));

#define sbx_debug(...) sbx_log (SBX_LOG_DEBUG, __VA_ARGS__)
#define sbx_info(...)  sbx_log (SBX_LOG_INFO, __VA_ARGS__)
#define sbx_warn(...)  sbx_log (SBX_LOG_WARN, __VA_ARGS__)
#define sbx_error(...) sbx_log (SBX_LOG_ERROR, __VA_ARGS__)

void sbx_log_test (bool verbose);

#endif
