/*  gw_terminal - GET /v1/sandboxes/{sandboxId}/terminal: a guest's pseudo-terminal over
    a WebSocket (RFC 6455, framed by sbx_ws).

    One session per socket. The command starts on a new pty in the guest (agent.exec with
    pty, through the broker); then the 101, and from the loop, at once:
      - the client's frames are read: binary ones are keystrokes, queued and written with
        agent.input (what the terminal did not take is sent again shortly); a text one is
        {"type": "resize", "cols", "rows"} (agent.resize); pings are answered;
      - the output is long-polled (agent.status with wait_ms: the agent answers as soon as
        there is output) and sent as binary messages; a client that reads slowly is not
        read ahead of, nor is one that types faster than the terminal takes;
      - a ping every S_PING_MS keeps proxies from timing the socket out.
    When the process ends: {"type": "exit", ...}, then close 1000. When the client closes
    or leaves: SIGKILL to the process group (its jobs get SIGHUP from the hangup). A
    message the client should not have sent gets {"type": "error"} and the terminal goes
    on; a broken frame gets the close code sbx_ws names. Nothing blocks.
*/
#ifndef GW_TERMINAL_H_INCLUDED
#define GW_TERMINAL_H_INCLUDED

#include "gw_auth.h"
#include "gw_http.h"
#include "sbx_common.h"

#include <jansson.h>

typedef struct gw_terminal_t gw_terminal_t;
typedef struct gw_ctx_s gw_ctx_t;

//  Uses the context's loop, broker client and HTTP server (borrowed).
gw_terminal_t *gw_terminal_new (gw_ctx_t *ctx);

//  Ends the terminals still open (close 1001; their processes are killed).
void gw_terminal_destroy (gw_terminal_t **self_p);

//  Opens a terminal with args (REST's open_terminal, checked; borrowed) for caller
//  (copied), answering req: 400 when it is not a WebSocket handshake, a JSON error when
//  the command cannot start, else the 101 and the session.
void gw_terminal_start (gw_terminal_t *self, gw_request_t *req, const sbx_caller_t *caller,
                        json_t *args);

void gw_terminal_test (bool verbose);

#endif
