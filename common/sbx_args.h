/*  sbx_args - an operation's arguments checked against their one definition.

    Every door (MCP's tools/call, REST's path, query and body, the CLI's options) hands
    the operation a JSON object of arguments named as schemas/operations.json names them;
    sbx_args checks it against the generated table (sbx_ops_gen: types, bounds, lengths,
    patterns, choices, required, unknown names refused) and reads values with their
    defaults, so no door has limits of its own.
*/
#ifndef SBX_ARGS_H_INCLUDED
#define SBX_ARGS_H_INCLUDED

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_ops_gen.h"

//  The argument of op called name, or NULL.
const sbx_op_arg_t *sbx_args_find (sbx_op_t op, const char *name);

//  Checks args (a JSON object; NULL is {}) as surface (SBX_OPS_MCP or SBX_OPS_REST)
//  passes them to op: every name one of the operation's on that surface, each value of
//  its types and within its limits (null counts as absent), the required ones given
//  (sandboxId may be missing on MCP: the session's default). Returns 0, or -1 with a
//  message that names the argument in why.
int sbx_args_check (sbx_op_t op, unsigned surface, json_t *args, char *why, size_t why_size);

//  REST's JSON body for op: 0 when every key is one of its body fields; else -1 with
//  "unknown field ..." naming them.
int sbx_args_check_body (sbx_op_t op, json_t *body, char *why, size_t why_size);

//  The argument's value as a JSON value of its type, from text (REST's path and query,
//  the CLI's options): integers parsed (decimal, no sign unless the minimum is
//  negative), booleans true/false, strings as they are. NULL with why when the text is
//  not of that type.
json_t *sbx_args_from_text (const sbx_op_arg_t *arg, const char *text, char *why, size_t why_size);

//  Values after sbx_args_check: the given one, else the default, else NULL / 0 / false.
const char *sbx_args_string (sbx_op_t op, json_t *args, const char *name);
int64_t sbx_args_int (sbx_op_t op, json_t *args, const char *name);
bool sbx_args_bool (sbx_op_t op, json_t *args, const char *name);
//  The object argument (borrowed), or NULL when absent or null.
json_t *sbx_args_object (json_t *args, const char *name);

void sbx_args_test (bool verbose);

#endif
