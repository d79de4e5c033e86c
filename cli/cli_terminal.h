/*  cli_terminal - `sbx sandbox shell`: a guest's terminal on this one.

    Away from the host (a profile): a WebSocket to GET /v1/sandboxes/{id}/terminal
    (docs/rest.md), framed by sbx_ws over cli_http's bare connection. On the sbx host
    (the broker's socket, which carries no streams): the same agent requests the gateway
    makes (agent.exec with pty, agent.input, agent.resize), the output read with
    agent.status held for a short wait, between looks at the keyboard.
    Either way, while it runs: our terminal in raw mode (restored on every way out, a
    signal's included), so every key, Ctrl-C too, goes to the guest's terminal; its size
    sent at the start and on each SIGWINCH. The exit code is the guest command's.
*/
#ifndef CLI_TERMINAL_H_INCLUDED
#define CLI_TERMINAL_H_INCLUDED

#include "cli_where.h"

//  Runs op (open_terminal, its arguments set; cols and rows are filled in from our
//  terminal) where w says. Returns the command's exit code, or the CLI's for a failure
//  (said on stderr).
int cli_terminal_run (cli_where_t *w, cli_op_t *op);

//  The HTTP/1.1 handshake for a WebSocket at url + target (a path and query), with
//  auth's header line and key: a fresh string. NULL for a url that is not http(s).
char *cli_terminal_handshake (const char *url, const char *target, const char *auth,
                              const char *key);

void cli_terminal_test (bool verbose);

#endif
