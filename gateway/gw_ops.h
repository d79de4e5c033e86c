/*  gw_ops - the operations of schemas/operations.json, run once for every door.

    REST and MCP hand an operation its arguments as operations.json names them; gw_ops
    checks them against their one definition (sbx_args: the same limits on both doors),
    builds the message (sbx_api_request), sends it through the gateway's broker client
    (to the broker, or to the sandbox's guest agent), moves files chunk by chunk
    (sbx_xfer), adds billing's figures to the sandboxes it shows, and answers with the
    operation's output shape (sbx_api_answer). The doors only say it their own way:
    REST with status codes and raw file bytes, MCP with a text and structuredContent.

    A call never blocks: it finishes from the loop when the answers come.
*/
#ifndef GW_OPS_H_INCLUDED
#define GW_OPS_H_INCLUDED

#include <jansson.h>

#include "gw_auth.h"
#include "gw_broker.h"
#include "gw_cache.h"
#include "sbx_api.h"
#include "sbx_common.h"
#include "sbx_xfer.h"

typedef struct gw_ops_t gw_ops_t;

//  How a call ended: code SBX_OK with the answer, or the failure's code and message.
typedef struct {
    sbx_code_t code;
    const char *message;    //  the failure's, for a person or a model to act on
    json_t *answer;         //  the output shape (borrowed: take a reference to keep it)
    const sbx_msg_t *reply; //  the reply it was made from (borrowed), or NULL (kept, files)
    const uint8_t *data;    //  read_file: the bytes (size of them; one NUL past them)
    size_t size;
    uint8_t **take; //  read_file: where data is held; a consumer keeping the bytes
                    //  (malloc'd) takes *take and sets it NULL, so none copies them
} gw_ops_result_t;

typedef void (gw_ops_done_fn) (const gw_ops_result_t *result, void *arg);

//  The services are the gateway's (gw_ctx), borrowed; cache and auth may be NULL.
gw_ops_t *gw_ops_new (sbx_api_t *api, gw_broker_t *broker, gw_cache_t *cache, gw_auth_t *auth);

//  Cancels the calls in flight: their done is not called.
void gw_ops_destroy (gw_ops_t **self_p);

//  Runs op for caller (copied) with args (borrowed; NULL is {}) as surface (SBX_OPS_MCP
//  or SBX_OPS_REST) passes them; write_file's bytes are data (copied). Returns a handle
//  for gw_ops_cancel, or 0 when done was already called (refused at once).
uint64_t gw_ops_call (gw_ops_t *self, sbx_op_t op, unsigned surface, const sbx_caller_t *caller,
                      json_t *args, const void *data, size_t size, gw_ops_done_fn *done, void *arg);

//  The same with write_file's bytes taken (malloc'd; *data_p set to NULL once the
//  transfer has them; left to the caller when the call is refused before that).
uint64_t gw_ops_call_take (gw_ops_t *self, sbx_op_t op, unsigned surface,
                           const sbx_caller_t *caller, json_t *args, uint8_t **data_p, size_t size,
                           gw_ops_done_fn *done, void *arg);

//  read_file: told after each chunk is taken, with the transfer (borrowed, only during
//  the call: sbx_xfer_fix, sbx_xfer_ready and sbx_xfer_data), so that a door may send
//  the bytes as they come (REST's GET) rather than once all are in. done still ends the
//  call. fn may not cancel the call.
typedef void (gw_ops_read_fn) (sbx_xfer_t *xfer, void *arg);
void gw_ops_follow_read (gw_ops_t *self, uint64_t handle, gw_ops_read_fn *fn, void *arg);

//  Forgets a call in flight: done is not called. 0 or a finished handle is ignored.
void gw_ops_cancel (gw_ops_t *self, uint64_t handle);

//  Forgets a call in flight because its client gave up on it (MCP cancellation): as
//  cancel, and a foreground exec is killed in the guest too (SIGKILL to its group,
//  found by the tag it was started with, as its pid is not known until it ends).
void gw_ops_abandon (gw_ops_t *self, uint64_t handle);

void gw_ops_test (bool verbose);

#endif
