/*  gw_tools - the 21 MCP tools: their handlers, which map each call to broker messages.
    Their definitions (schemas, annotations) are schemas/operations.json's, generated
    into sbx_ops_gen (sbx_ops_tools_json, the sbx_op_t table).

    Definitions follow the reference documents: names and order, inputSchema,
    outputSchema (structuredContent conforms to it), and annotations: readOnlyHint true
    on list_sandboxes, get_sandbox, get_sandbox_metrics, command_status, list_commands,
    read_file and list_snapshots,
    destructiveHint true on exec, kill_command, write_file, delete_sandbox and
    delete_snapshot, readOnlyHint false on every other.

    A call never blocks: it sends its broker request(s) through the peer and finishes
    from the loop when the answers come. Failures are tool results (isError true) whose
    text is "<the API's message> (<code>)", so a model can read what went wrong. Tools
    the broker has no messages for yet (host_port, extend, rename, label, snapshots)
    answer `unavailable` plainly.

    Each MCP session has a state (gw_tools_state_t): the sandbox it created or used
    last, the default for every tool but delete_sandbox, and the env given at create
    for each sandbox, applied to its execs. Calls hold a reference to it, so a session
    deleted mid-call leaves nothing dangling.
*/
#ifndef GW_TOOLS_H_INCLUDED
#define GW_TOOLS_H_INCLUDED

#include <jansson.h>

#include "sbx_common.h"

//  read_file with encoding base64: up to this many bytes of file, the text content
//  repeats the base64 of structuredContent.content (clients that read only the text get
//  it); beyond, the text says where it is instead of doubling the answer.
#define GW_TOOLS_BASE64_TEXT_MAX (48 * 1024)

typedef struct gw_tools_t gw_tools_t;
typedef struct gw_tools_state_t gw_tools_state_t;

//  The end of one tools/call, called once: result is a CallToolResult (the callee owns
//  it), or NULL with a JSON-RPC error (rpc_code -32602 for an unknown tool or
//  malformed params).
typedef void (gw_tools_done_fn) (json_t *result, int rpc_code, const char *rpc_message, void *arg);

//  Uses the gateway's shared services (gw_ctx.h: its broker client and read copy;
//  borrowed, they outlive it).
typedef struct gw_ctx_s gw_ctx_t;
gw_tools_t *gw_tools_new (gw_ctx_t *ctx);

//  Cancels calls in flight (their done is not called).
void gw_tools_destroy (gw_tools_t **self_p);

//  The tool definitions for tools/list, in the reference's order (borrowed).
json_t *gw_tools_list (gw_tools_t *self);

//  True for a tool annotated readOnlyHint (list_sandboxes, get_sandbox, …).
bool gw_tools_read_only (gw_tools_t *self, const char *name);

//  Runs tool `name` with `arguments` (borrowed; NULL means {}) for caller (copied), in
//  the session's state (a reference is taken). done may be called before this returns
//  (argument errors) or later from the loop. Returns a handle for gw_tools_abandon, or
//  0 when done was called already.
uint64_t gw_tools_call (gw_tools_t *self, const sbx_caller_t *caller, gw_tools_state_t *state,
                        const char *name, json_t *arguments, gw_tools_done_fn *done, void *arg);

//  read_file with encoding base64 of a file over GW_TOOLS_STREAM_MIN bytes may be
//  answered as it is read (gw_mcp streams it; gw_b64_stream): fn is told at each chunk
//  that comes in order. result is the CallToolResult that will be sent, whose
//  structuredContent.content, its last member, is "" where the base64 goes (borrowed);
//  the file's first ready bytes are in data (borrowed, valid until the next call);
//  length is fixed from the first chunk on. The last call has take: all length bytes,
//  for fn to take. fn returns 0 to go on, or -1 to have the result made whole instead.
//  Once fn returned 0 the call's done gets that same result, or an error result.
#define GW_TOOLS_STREAM_MIN (1024 * 1024)
typedef struct {
    json_t *result;
    const uint8_t *data;
    size_t ready;
    size_t length;
    uint8_t **take;
} gw_tools_read_t;
typedef int (gw_tools_read_fn) (const gw_tools_read_t *read, void *arg);
//  Follows the call of handle (from gw_tools_call) if it is such a read; else nothing.
void gw_tools_follow_read (gw_tools_t *self, uint64_t handle, gw_tools_read_fn *fn, void *arg);

//  The client cancelled the call (MCP cancellation): done is not called, and a
//  foreground exec is killed in the guest (gw_ops_abandon). 0 or a finished handle is
//  ignored.
void gw_tools_abandon (gw_tools_t *self, uint64_t handle);

//  Session state, reference counted.
gw_tools_state_t *gw_tools_state_new (void);
gw_tools_state_t *gw_tools_state_ref (gw_tools_state_t *state);
void gw_tools_state_unref (gw_tools_state_t **state_p);
//  The session's default sandbox, or NULL.
const char *gw_tools_state_default (gw_tools_state_t *state);
//  Loads what a session's copy says: the default (NULL or "": none), and a sandbox's
//  env (borrowed; NULL or {} drops it). Neither is a change.
void gw_tools_state_set_default (gw_tools_state_t *state, const char *sandbox_id);
void gw_tools_state_set_env (gw_tools_state_t *state, const char *sandbox_id, json_t *env);

//  What a call changed in the state, for whoever keeps it elsewhere: the sandbox that
//  became the default (env: create_sandbox's, when it gave one), or one deleted
//  (forget). Taken oldest first; NULL when there is none.
typedef struct {
    char *sandbox_id;
    bool forget;
    json_t *env; //  or NULL
} gw_tools_change_t;
gw_tools_change_t *gw_tools_state_take (gw_tools_state_t *state);
void gw_tools_change_destroy (gw_tools_change_t **change_p);

void gw_tools_test (bool verbose);

#endif
