/*  cli_template - `sbx template build|list|delete`: templates from a Dockerfile, built in
    a sandbox and kept as the account's snapshots (see cli_template.c). */
#ifndef CLI_TEMPLATE_H_INCLUDED
#define CLI_TEMPLATE_H_INCLUDED

#include "cli_where.h"

int cli_template_main (int argc, char **argv);

#endif
