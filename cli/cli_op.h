/*  cli_op - one operation of schemas/operations.json from the command line, as REST has it.

    A command's options become the operation's arguments, named as REST names them
    (sandboxId, ttlSeconds, processId, ...), and are checked with REST's limits
    (sbx_args_check), so the CLI has no limit of its own. sbx_api_request builds the
    message, the broker answers (agent requests relayed to the guest as sandbox.agent),
    and sbx_api_answer gives REST's JSON for --json (docs/openapi.json).

    Every refusal is said on stderr as "<command>: <why> (<option>)", naming the argument
    as REST does and the option it came from.
*/
#ifndef CLI_OP_H_INCLUDED
#define CLI_OP_H_INCLUDED

#include "sbx_api.h"
#include "sbx_common.h"

#include <jansson.h>

typedef struct cli_op_t cli_op_t;

//  command: what the person ran ("sbx sandbox create"), for messages.
cli_op_t *cli_op_new (const char *command, sbx_op_t op);
void cli_op_destroy (cli_op_t **self_p);

//  Sets the argument called name from option text, turned into the argument's JSON type
//  (sbx_args_from_text); option is what was typed ("--stdout-offset"), named when the
//  value is refused. 0, or -1 said on stderr.
int cli_op_set_text (cli_op_t *self, const char *name, const char *text, const char *option);

//  Sets the argument to a duration in seconds: "90", "90s", "15m", "2h" or "7d".
int cli_op_set_duration (cli_op_t *self, const char *name, const char *text, const char *option);

//  Sets an object argument from "KEY=VALUE" items (a list of char *).
int cli_op_set_pairs (cli_op_t *self, const char *name, zlist_t *pairs, const char *option);

//  Names the option an argument comes from before it is given, for "X is required".
void cli_op_option (cli_op_t *self, const char *name, const char *option);

//  Sets the argument to value (taken).
void cli_op_set (cli_op_t *self, const char *name, json_t *value);

//  The arguments so far (borrowed).
json_t *cli_op_args (cli_op_t *self);

//  Checks the arguments as REST checks them. 0, or -1 said on stderr.
int cli_op_check (cli_op_t *self);

//  The message the operation becomes (sbx_api_request), after cli_op_check; NULL when a
//  value is refused beyond its schema (said on stderr).
sbx_msg_t *cli_op_request (cli_op_t *self);

//  Sends *request_p (taking it) as an operator, for account when given (create on an
//  account's behalf), waiting as long as REST would; an agent request goes to the guest
//  of the sandbox the arguments name. Returns the reply (the agent's, for an agent
//  request), or NULL with err set.
sbx_msg_t *cli_op_call (cli_op_t *self, sbx_config_t *config, const char *account,
                        sbx_msg_t **request_p, sbx_err_t *err);

//  One agent request for the guest of sandbox_id, relayed by the broker (taking
//  *inner_p): the agent's reply, or NULL with err set (the broker's, vmd's or the
//  agent's error).
sbx_msg_t *cli_op_agent (sbx_config_t *config, const char *sandbox_id, sbx_msg_t **inner_p,
                         int timeout_ms, sbx_err_t *err);

//  REST's answer to the reply (sbx_api_answer), or NULL said on stderr.
json_t *cli_op_answer (cli_op_t *self, sbx_api_t *api, sbx_msg_t *reply);

void cli_op_test (bool verbose);

#endif
