/*  cli_mcp_server - the MCP server `sbx mcp` is on stdio: one JSON-RPC message per line.

    What needs no service is answered here: initialize (the protocol version negotiated
    as the gateway does), ping, notifications (no answer), unknown methods (-32601),
    parse errors and invalid requests. tools/list and tools/call go to the remote
    session (cli_remote), with handoff_session (cli_handoff) added to the list and run
    here. Messages are handled one at a time, in order.
*/
#ifndef CLI_MCP_SERVER_H_INCLUDED
#define CLI_MCP_SERVER_H_INCLUDED

#include "cli_remote.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct cli_mcp_server_t cli_mcp_server_t;

//  remote: the session requests go to (borrowed). dir: what handoff_session copies.
//  out: where answers are written, one line each.
cli_mcp_server_t *cli_mcp_server_new (cli_remote_t *remote, const char *dir, FILE *out);
void cli_mcp_server_destroy (cli_mcp_server_t **self_p);

//  Handles one message (a line, without its newline). -1 when out can't be written (the
//  client has gone), else 0.
int cli_mcp_server_handle (cli_mcp_server_t *self, const char *line);

//  Answers a line that was too long to read (a parse error, id null).
int cli_mcp_server_too_long (cli_mcp_server_t *self, size_t max);

void cli_mcp_server_test (bool verbose);

#endif
