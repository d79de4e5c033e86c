/*  gw_exec_stream - a REST exec whose output streams as Server-Sent Events while it runs
    (POST /v1/sandboxes/{sandboxId}/exec with Accept: text/event-stream).

    The command starts in the guest as a detached process that keeps exec's timeout
    (agent.exec, detached, timeout_ms), and its output is read from the agent by offset
    (agent.status) every S_POLL_MS, or at once while there is more, and sent on as
    events, each `data:` one line of JSON:
      event: start   {"processId": N}
      event: stdout  {"text": "..."}          (as it arrives; UTF-8, or \ufffd for what
      event: stderr  {"text": "..."}           is not)
      event: exit    the Output shape of a waited exec, without the text already sent
      event: error   {"error": {"code", "message"}} when it cannot go on
    A stream the client reads slowly is not read ahead of: the next poll waits for the
    buffer to drain. A client that leaves ends the process (SIGKILL to its group), as
    Ctrl-C would. Nothing blocks; each step finishes from the loop.
*/
#ifndef GW_EXEC_STREAM_H_INCLUDED
#define GW_EXEC_STREAM_H_INCLUDED

#include "gw_auth.h"
#include "gw_http.h"
#include "sbx_common.h"

#include <jansson.h>

typedef struct gw_exec_stream_t gw_exec_stream_t;
typedef struct gw_ctx_s gw_ctx_t;

//  Uses the context's loop, broker client and HTTP server (borrowed).
gw_exec_stream_t *gw_exec_stream_new (gw_ctx_t *ctx);

//  Ends the streams still open (their processes are killed).
void gw_exec_stream_destroy (gw_exec_stream_t **self_p);

//  True when req asks for exec's output as a stream.
bool gw_exec_stream_wanted (gw_request_t *req);

//  Runs exec with args (REST's, checked; borrowed) for caller (copied), answering req:
//  a JSON error when it cannot start, else the stream.
void gw_exec_stream_start (gw_exec_stream_t *self, gw_request_t *req, const sbx_caller_t *caller,
                           json_t *args);

void gw_exec_stream_test (bool verbose);

#endif
