/*  cli_handoff - the local tool handoff_session: the working directory into a sandbox.

    The files of the directory (cli_files: git's view in a work tree) are packed as one
    tar archive (cli_tar), written into the guest with the remote write_file (base64, in
    parts that each fit the service's request limit), and unpacked there with exec
    (`mkdir -p PATH && cat PARTS | tar -xf - -C PATH`). Without sandboxId a new sandbox is
    made with create_sandbox first. More than CLI_HANDOFF_MAX bytes of files are refused
    before anything is sent, naming the size and the limit.
*/
#ifndef CLI_HANDOFF_H_INCLUDED
#define CLI_HANDOFF_H_INCLUDED

#include "cli_remote.h"

#include <jansson.h>

//  The files' total, as write_file's (sbx_xfer's 16 MiB).
#define CLI_HANDOFF_MAX  (16 * 1024 * 1024)
#define CLI_HANDOFF_NAME "handoff_session"

//  The tool's definition for tools/list (new reference).
json_t *cli_handoff_tool (void);

//  Checks the arguments (an object: sandboxId?, path?): 0, or -1 with why.
int cli_handoff_check (json_t *args, char *why, size_t why_size);

//  Runs the tool for dir with max bytes allowed: a tools/call result (new reference),
//  isError with the reason when it fails.
json_t *cli_handoff_run (cli_remote_t *remote, const char *dir, json_t *args, size_t max);

void cli_handoff_test (bool verbose);

#endif
