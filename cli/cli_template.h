/*  cli_template - `sbx template build|list|delete`: templates from a Dockerfile, built in
    a sandbox and kept as the account's snapshots (see cli_template.c). */
#ifndef CLI_TEMPLATE_H_INCLUDED
#define CLI_TEMPLATE_H_INCLUDED

#include "cli_where.h"

int cli_template_main (int argc, char **argv);

//  The snapshot of the newest ready template called name of the account (w's, or
//  account's on the host): its id (static, until the next call), or NULL said on stderr.
const char *cli_template_snapshot (cli_where_t *w, const char *account, const char *name);

#endif
