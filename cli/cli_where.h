/*  cli_where - where a CLI command's operations go: to the local broker, as the sbx
    host's operator (cli_call, cli_op), or to a remote service's REST API as an API key's
    account (cli_rest, after `sbx login`). Either way an operation's answer is REST's JSON,
    and a file moves whole (16 MiB at most): in 1 MiB chunks through the broker, or in one
    request. */
#ifndef CLI_WHERE_H_INCLUDED
#define CLI_WHERE_H_INCLUDED

#include "cli_op.h"
#include "cli_rest.h"
#include "sbx_api.h"

#include <stdio.h>

typedef struct {
    sbx_config_t *config; //  local
    sbx_api_t *api;
    cli_rest_t *rest; //  remote
} cli_where_t;

//  Decides for command ("sbx sandbox exec") and sets w up: remote with a profile (or
//  SBX_URL) unless data_dir was given. 0, or the exit code with the failure said.
int cli_where_open (cli_where_t *w, const char *command, const char *data_dir);
void cli_where_close (cli_where_t *w);

//  op's answer as REST's JSON (*answer), for account (the operator's create on its
//  behalf; NULL otherwise); plan_ttl: create without ttlSeconds, so that the plan's
//  default applies. Locally *reply_p (when given) keeps the broker's reply, for what
//  only an operator sees. 0, or the exit code with the failure said on stderr.
int cli_where_call (cli_where_t *w, cli_op_t *op, sbx_op_t id, const char *account, bool plan_ttl,
                    json_t **answer, sbx_msg_t **reply_p);

//  data (at most 16 MiB) to the guest's path with mode bits (0: the default). 0, or the
//  exit code with the failure said.
int cli_where_put (cli_where_t *w, const char *sandbox_id, const char *path, const void *data,
                   size_t size, unsigned bits);

//  The guest's file at path (at most 16 MiB): 0 with *data (malloc'd) and *size.
int cli_where_get (cli_where_t *w, const char *sandbox_id, const char *path, uint8_t **data,
                   size_t *size);

//  At most limit bytes from f: 0 with *data (malloc'd, NUL past it), or -1 when over.
int cli_where_slurp (FILE *f, size_t limit, uint8_t **data, size_t *size);

#endif
