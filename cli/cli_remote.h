/*  cli_remote - one MCP session with a remote sbx's /mcp (Streamable HTTP, 2025 era).

    The session is opened on first need (initialize, then notifications/initialized,
    keeping Mcp-Session-Id) and ended with DELETE by cli_remote_destroy. A session the
    service no longer knows (404) is opened again once, and the request retried. Answers
    may be application/json or an SSE stream; a stream's notifications (progress) are
    handed to the caller as they arrive.

    Every failure becomes a JSON-RPC error object whose message a person can act on: the
    service unreachable (naming the URL and SBX_URL), the key refused (SBX_API_KEY), or
    the service's own error.
*/
#ifndef CLI_REMOTE_H_INCLUDED
#define CLI_REMOTE_H_INCLUDED

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>

typedef struct cli_remote_t cli_remote_t;

//  A notification from the service while a request runs (borrowed).
typedef void (cli_remote_notify_fn) (void *arg, json_t *notification);

//  mcp_url: the service's /mcp URL. ca_cert: a PEM file to trust, or NULL.
cli_remote_t *cli_remote_new (const char *mcp_url, const char *api_key, const char *ca_cert);
//  Ends the remote session (DELETE) when one is open.
void cli_remote_destroy (cli_remote_t **self_p);

//  The protocol version to open the session with (the one the local client chose).
void cli_remote_set_protocol (cli_remote_t *self, const char *version);
//  Transfers stop when *flag becomes nonzero (a signal).
void cli_remote_set_abort (cli_remote_t *self, volatile sig_atomic_t *flag);
//  The open session's id, or NULL.
const char *cli_remote_session_id (cli_remote_t *self);
const char *cli_remote_url (cli_remote_t *self);

//  One request: its result (new reference), or NULL with *error (a JSON-RPC error object,
//  new reference). notify: NULL, or called with each notification a stream carries.
json_t *cli_remote_request (cli_remote_t *self, const char *method, json_t *params,
                            cli_remote_notify_fn *notify, void *notify_arg, json_t **error);

//  tools/call of name with args (borrowed) for a local tool's own use: the result's
//  structuredContent (new reference), or NULL with why (an error, or the tool's isError
//  text).
json_t *cli_remote_tool (cli_remote_t *self, const char *name, json_t *args, char *why,
                         size_t why_size);

#endif
