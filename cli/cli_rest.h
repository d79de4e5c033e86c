/*  cli_rest - the operations of schemas/operations.json over a remote sbx's REST API, for
    the CLI away from the sbx host (a profile: `sbx login`, or SBX_URL and SBX_API_KEY).

    The request is made from the operation's one definition (sbx_ops: method, path, and
    where each argument goes: path, query or JSON body), with the arguments as cli_op
    named and checked them; the answer is REST's JSON, the same that --json prints on
    the host. Failures come back as the service's catalogued code and message.
*/
#ifndef CLI_REST_H_INCLUDED
#define CLI_REST_H_INCLUDED

#include "cli_profile.h"
#include "sbx_common.h"
#include "sbx_ops_gen.h"

#include <jansson.h>
#include <signal.h>

typedef struct cli_rest_t cli_rest_t;

//  profile is copied.
cli_rest_t *cli_rest_new (const cli_profile_t *profile);
void cli_rest_destroy (cli_rest_t **self_p);

//  Where command ("sbx sandbox") works: on the local installation (*rest_p NULL) when
//  data_dir was given or no service is named, else on the service of the profile (or
//  SBX_URL). 0, or 2 with a broken profile said on stderr.
int cli_rest_for (const char *command, const char *data_dir, cli_rest_t **rest_p);

//  For an operator's command ("sbx account"), which only works on the sbx host: when no
//  data_dir was given, a service is named and this user cannot reach a local
//  installation, says so on stderr and returns 2; else 0 (go on locally).
int cli_rest_local_only (const char *command, const char *data_dir);

//  The service's base URL (borrowed).
const char *cli_rest_url (cli_rest_t *self);

//  The "Authorization: Bearer …" header line, and the CA file to trust (or NULL), for
//  a connection made outside cli_rest (a terminal's WebSocket). Borrowed.
const char *cli_rest_auth (cli_rest_t *self);
const char *cli_rest_ca_cert (cli_rest_t *self);

//  Runs op with args (borrowed; REST's names). data, size: write_file's bytes. On
//  success returns 0 with *answer (REST's JSON, the caller's), or for read_file *bytes
//  (malloc'd, NUL past the end) and *bytes_size; else -1 with err (the service's code
//  and message, or unavailable when it could not be reached).
int cli_rest_call (cli_rest_t *self, sbx_op_t op, json_t *args, const void *data, size_t size,
                   json_t **answer, char **bytes, size_t *bytes_size, sbx_err_t *err);

//  Runs op asking for its answer as Server-Sent Events (exec's output as it comes:
//  docs/rest.md): each event goes to on_event (cli_sse's) as it arrives. 0 when the
//  stream ended, or -1 with err (the service's error answer, or unreachable).
typedef void (cli_rest_event_fn) (void *arg, const char *event, const char *data);
int cli_rest_stream (cli_rest_t *self, sbx_op_t op, json_t *args, cli_rest_event_fn *on_event,
                     void *arg, sbx_err_t *err);

//  When *flag becomes nonzero, a transfer in progress is abandoned (a signal came).
void cli_rest_set_abort (cli_rest_t *self, volatile sig_atomic_t *flag);

//  The request line op would make: "GET /v1/sandboxes/sb_x/processes?stdoutOffset=2"
//  (fresh), or NULL when an argument the path needs is missing. For the self-test.
char *cli_rest_target (sbx_op_t op, json_t *args);

void cli_rest_test (bool verbose);

#endif
