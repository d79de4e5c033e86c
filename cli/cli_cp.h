/*  cli_cp - `sbx sandbox cp`: files and directories into a sandbox and out of it, as tar
    archives through write_file, read_file and exec (so 16 MiB is the limit each way), on
    whichever side the command works (cli_where). What comes out is unpacked by
    cli_tar_extract, which trusts nothing in it. */
#ifndef CLI_CP_H_INCLUDED
#define CLI_CP_H_INCLUDED

#include "cli_where.h"

//  cp SRC DST, exactly one of them ID:/PATH (the sandbox's side). 0, or the exit code
//  with the failure said.
int cli_cp (cli_where_t *w, const char *src, const char *dst);

#endif
