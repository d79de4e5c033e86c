/*  cli_call - one request to the broker and its answer, for CLI commands.

    The CLI is the one place allowed to wait: it sends the request as an operator
    (caller kind admin: whoever can reach the broker's socket under the data directory
    is an operator) and waits up to the timeout for the reply with the same rid.
*/
#ifndef CLI_CALL_H_INCLUDED
#define CLI_CALL_H_INCLUDED

#include "sbx_common.h"

#include <jansson.h>

//  Sends *request_p (taking it) and returns the reply; NULL with err set when the
//  broker answered with an error, or did not answer in time (code unavailable, with a
//  message that says where the CLI looked for the broker).
sbx_msg_t *cli_call (sbx_config_t *config, sbx_msg_t **request_p, int timeout_ms, sbx_err_t *err);

//  Prints "sbx: <message> (<code>)" on stderr and returns the exit code for that error
//  class (1 for most, 3 for unavailable/timeout so scripts can retry).
int cli_fail (const sbx_err_t *err);

//  Prints JSON compactly (keys in insertion order) on one line, and releases it.
void cli_print_json (json_t *json);

//  An ISO 8601 time for JSON output, or null for 0 ("never").
json_t *cli_json_time (uint64_t ms);
//  The string member key of object (borrowed), or none when it is absent or not a string.
const char *cli_json_str (json_t *object, const char *key, const char *none);

#endif
