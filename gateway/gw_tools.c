/*  gw_tools - see gw_tools.h */
#include "gw_tools.h"
#include "gw_cache.h"
#include "gw_ctx.h"
#include "sbx_ops_gen.h"
#include "sbx_idmap.h"
#include "gw_auth.h"
#include "gw_ops.h"
#include "gw_text.h"
#include "sbx_args.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <assert.h>
#include <strings.h>

struct gw_tools_state_t {
    int refs;
    char *last;        //  the sandbox created or used last
    zhashx_t *env;     //  sandbox id → json_t object: create_sandbox's env
    zlistx_t *changes; //  gw_tools_change_t not yet taken, oldest first
};

void gw_tools_change_destroy (gw_tools_change_t **change_p)
{
    assert (change_p);
    gw_tools_change_t *change = *change_p;
    if (change) {
        free (change->sandbox_id);
        json_decref (change->env);
        free (change);
    }
    *change_p = NULL;
}

static void s_change_free (void **item)
{
    gw_tools_change_destroy ((gw_tools_change_t **) item);
}

gw_tools_state_t *gw_tools_state_new (void)
{
    gw_tools_state_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->refs = 1;
    self->env = zhashx_new ();
    self->changes = zlistx_new ();
    if (!self->env || !self->changes) {
        zhashx_destroy (&self->env);
        zlistx_destroy (&self->changes);
        free (self);
        return NULL;
    }
    zlistx_set_destructor (self->changes, s_change_free);
    return self;
}

//  Notes a change for whoever keeps the state elsewhere (gw_mcp: the broker's copy).
static void s_state_change (gw_tools_state_t *state, const char *sandbox_id, bool forget,
                            json_t *env)
{
    gw_tools_change_t *change = calloc (1, sizeof *change);
    if (!change || !(change->sandbox_id = strdup (sandbox_id))) {
        free (change);
        return;
    }
    change->forget = forget;
    change->env = json_incref (env);
    zlistx_add_end (state->changes, change);
}

gw_tools_change_t *gw_tools_state_take (gw_tools_state_t *state)
{
    if (!state || !zlistx_first (state->changes))
        return NULL;
    return zlistx_detach_cur (state->changes);
}

void gw_tools_state_set_default (gw_tools_state_t *state, const char *sandbox_id)
{
    if (state)
        sbx_str_set (&state->last, sandbox_id && *sandbox_id ? sandbox_id : NULL);
}

void gw_tools_state_set_env (gw_tools_state_t *state, const char *sandbox_id, json_t *env)
{
    if (!state || !sandbox_id)
        return;
    json_t *keep = json_is_object (env) && json_object_size (env) ? json_incref (env) : NULL;
    json_decref (zhashx_lookup (state->env, sandbox_id));
    zhashx_delete (state->env, sandbox_id);
    if (keep)
        zhashx_insert (state->env, sandbox_id, keep);
}

gw_tools_state_t *gw_tools_state_ref (gw_tools_state_t *state)
{
    if (state)
        state->refs++;
    return state;
}

void gw_tools_state_unref (gw_tools_state_t **state_p)
{
    assert (state_p);
    gw_tools_state_t *self = *state_p;
    *state_p = NULL;
    if (!self || --self->refs > 0)
        return;
    for (json_t *env = zhashx_first (self->env); env; env = zhashx_next (self->env))
        json_decref (env);
    zhashx_destroy (&self->env);
    zlistx_destroy (&self->changes);
    free (self->last);
    free (self);
}

const char *gw_tools_state_default (gw_tools_state_t *state)
{
    return state ? state->last : NULL;
}

static void s_state_use (gw_tools_state_t *state, const char *sandbox_id)
{
    if (state && sandbox_id && (!state->last || !streq (state->last, sandbox_id))) {
        sbx_str_set (&state->last, sandbox_id);
        s_state_change (state, sandbox_id, false, NULL);
    }
}

//  --------------------------------------------------------------------------
//  Calls: the arguments go to gw_ops (the operation, once for REST and MCP); what
//  comes back is worded here for a model, with the answer as structuredContent.

struct gw_tools_t {
    json_t *list;
    gw_text_t *text;     //  the answers in words
    json_t *kept_answer; //  get_sandbox's last answer (a reference held: never reused)
    json_t *kept_result; //  and the result made of it (results are never changed)
    gw_ops_t *ops;       //  the gateway's (ctx)
    zhashx_t *calls;     //  serial → s_call_t in flight
    uint64_t next_serial;
};

typedef struct {
    gw_tools_t *tools;
    uint64_t serial, handle;
    sbx_op_t op;
    gw_tools_state_t *state;
    json_t *args; //  as sent to gw_ops: with the session's defaults
    bool base64;  //  read_file's encoding
    gw_tools_done_fn *done;
    void *arg;
    //  A read_file answered as it is read (gw_tools_follow_read): who is told, and once
    //  the first chunk came, the result around the content and the file's length.
    gw_tools_read_fn *read_fn;
    void *read_arg;
    json_t *streamed;
    size_t length;
} s_call_t;

static void s_call_free (s_call_t *call)
{
    gw_tools_state_unref (&call->state);
    json_decref (call->args);
    json_decref (call->streamed);
    free (call);
}

static json_t *s_text_result (const char *text, json_t *structured, bool is_error)
{
    json_t *result = json_pack ("{s:[{s:s, s:s}]}", "content", "type", "text", "text", text);
    if (structured)
        json_object_set_new (result, "structuredContent", structured);
    if (is_error)
        json_object_set_new (result, "isError", json_true ());
    return result;
}

//  Ends the call with a CallToolResult (taken by done).
static void s_finish (s_call_t *call, json_t *result)
{
    if (call->serial)
        zhashx_delete (call->tools->calls, (void *) (uintptr_t) call->serial);
    call->done (result, 0, NULL, call->arg);
    s_call_free (call);
}

//  A tool error: "<message> (<code>)".
static void s_fail (s_call_t *call, sbx_code_t code, const char *message)
{
    char text[700];
    snprintf (text, sizeof text, "%s (%s)", message, sbx_code_name (code));
    //  The message may quote the caller's arguments, cut at a limit: JSON needs UTF-8.
    sbx_utf8_sanitize (text);
    s_finish (call, s_text_result (text, NULL, true));
}

static const char *s_str (json_t *answer, const char *key)
{
    return json_string_value (json_object_get (answer, key));
}

//  --------------------------------------------------------------------------
//  What a call did to the session: the sandbox it used becomes the default, create's
//  env is kept, a deleted sandbox is forgotten. (Its words are schemas/operations.json's,
//  gw_text.)

static void s_follow (s_call_t *call, json_t *answer)
{
    const char *sandbox = sbx_api_sandbox_id (call->args);
    switch (call->op) {
    case SBX_OP_CREATE_SANDBOX: {
        json_t *env = json_object_get (call->args, "env");
        if (json_is_object (env) && json_object_size (env)) {
            gw_tools_state_set_env (call->state, s_str (answer, "id"), env);
            s_state_change (call->state, s_str (answer, "id"), false, env);
        }
        s_state_use (call->state, s_str (answer, "id"));
        break;
    }
    case SBX_OP_DELETE_SANDBOX: {
        const char *id = s_str (answer, "id");
        if (call->state->last && id && streq (call->state->last, id))
            zstr_free (&call->state->last);
        gw_tools_state_set_env (call->state, id, NULL);
        s_state_change (call->state, id, true, NULL);
        break;
    }
    case SBX_OP_FORK_SANDBOX: {
        //  The copies run the source's processes: they take its env too. The source
        //  stays the default (the copies are named in the answer).
        json_t *env = sandbox ? zhashx_lookup (call->state->env, sandbox) : NULL;
        size_t i;
        json_t *copy;
        json_array_foreach (env ? json_object_get (answer, "sandboxes") : NULL, i, copy)
        {
            const char *id = s_str (copy, "id");
            if (!id)
                continue;
            gw_tools_state_set_env (call->state, id, env);
            s_state_change (call->state, id, false, env); //  (the broker's default moves…)
        }
        if (sandbox) { //  (…back to the source, last)
            sbx_str_set (&call->state->last, sandbox);
            s_state_change (call->state, sandbox, false, NULL);
        }
        break;
    }
    case SBX_OP_SAVE_SNAPSHOT:
        if (s_str (answer, "sandboxId"))
            s_state_use (call->state, s_str (answer, "sandboxId"));
        break;
    case SBX_OP_LIST_SANDBOXES:
    case SBX_OP_LIST_SNAPSHOTS:
    case SBX_OP_DELETE_SNAPSHOT:
        break;
    default:
        //  Every other tool acts on one sandbox: it is the session's default now.
        if (sandbox)
            s_state_use (call->state, sandbox);
        break;
    }
}

//  read_file's CallToolResult: structuredContent with the content (taken) last, so
//  that a streamed answer can be cut where it goes (gw_tools_read_t). The text is the
//  content ("{content}" in schemas/operations.json): the same string, shared rather
//  than rendered and copied again. Base64 of a file over GW_TOOLS_BASE64_TEXT_MAX is not
//  repeated there: it would double the answer (a 10 MiB file: 26.7 MiB of JSON, which
//  the client takes longer to parse than the guest to read), and a model gets nothing
//  from megabytes of base64; the text says where the content is (docs/mcp.md,
//  "read_file").
static json_t *s_read_result (bool base64, const char *path, json_t *content, size_t size)
{
    json_t *structured =
        json_pack ("{s:s, s:s, s:I, s:O}", "path", path ? path : "", "encoding",
                   base64 ? "base64" : "utf-8", "size", (json_int_t) size, "content", content);
    json_t *text = content;
    if (base64 && size > GW_TOOLS_BASE64_TEXT_MAX) {
        char note[700];
        snprintf (note, sizeof note,
                  "Read %zu bytes of %.500s. Their base64 is in structuredContent.content "
                  "(not repeated here: over %d bytes).",
                  size, path ? path : "", GW_TOOLS_BASE64_TEXT_MAX);
        sbx_utf8_sanitize (note);
        text = json_string (note);
        json_decref (content);
    }
    return json_pack ("{s:[{s:s, s:o}], s:o}", "content", "type", "text", "text", text,
                      "structuredContent", structured);
}

//  A chunk of a followed read_file is in (gw_ops_follow_read). At the first, a file over
//  GW_TOOLS_STREAM_MIN gets its length fixed and its result made around an empty content.
static void s_on_read (sbx_xfer_t *xfer, void *arg)
{
    s_call_t *call = arg;
    if (!call->read_fn)
        return;
    if (!call->streamed) {
        int64_t length = sbx_xfer_expected (xfer) > GW_TOOLS_STREAM_MIN ? sbx_xfer_fix (xfer) : -1;
        if (length < 0) {
            call->read_fn = NULL; //  made whole at the end
            return;
        }
        call->length = (size_t) length;
        call->streamed = s_read_result (true, sbx_xfer_path (xfer), json_string (""), call->length);
    }
    gw_tools_read_t read = {.result = call->streamed,
                            .data = sbx_xfer_data (xfer),
                            .ready = sbx_xfer_ready (xfer),
                            .length = call->length};
    if (read.ready > read.length)
        read.ready = read.length;
    if (call->read_fn (&read, call->read_arg)) {
        call->read_fn = NULL;
        json_decref (call->streamed);
        call->streamed = NULL;
    }
}

void gw_tools_follow_read (gw_tools_t *self, uint64_t handle, gw_tools_read_fn *fn, void *arg)
{
    s_call_t *call = handle ? zhashx_lookup (self->calls, (void *) (uintptr_t) handle) : NULL;
    if (!call || call->op != SBX_OP_READ_FILE || !call->base64 || !call->handle)
        return;
    call->read_fn = fn;
    call->read_arg = arg;
    gw_ops_follow_read (self->ops, call->handle, s_on_read, call);
}

static void s_on_done (const gw_ops_result_t *result, void *arg)
{
    s_call_t *call = arg;
    call->handle = 0;
    if (result->code != SBX_OK) {
        s_fail (call, result->code, result->message);
        return;
    }
    if (call->op == SBX_OP_READ_FILE && call->streamed) {
        //  Streamed: the caller takes the bytes; done gets the result it sent around them.
        if (result->size != call->length || !result->take) {
            s_fail (call, SBX_E_UNAVAILABLE,
                    "the file changed size while it was read; read it again");
            return;
        }
        gw_tools_read_t read = {.result = call->streamed,
                                .data = result->data,
                                .ready = result->size,
                                .length = call->length,
                                .take = result->take};
        call->read_fn (&read, call->read_arg);
        s_follow (call, NULL);
        s_finish (call, json_incref (call->streamed));
        return;
    }
    if (call->op == SBX_OP_READ_FILE) {
        //  MCP carries files as JSON text: the text itself, or base64.
        const char *path = s_str (result->answer, "path");
        json_t *content;
        if (call->base64) {
            //  Encoded once; base64 is ASCII, so jansson need not check it again.
            char *b64 = sbx_secret_base64 (result->data, result->size);
            content = b64 ? json_stringn_nocheck (b64, strlen (b64)) : NULL;
            free (b64);
            if (!content) {
                s_fail (call, SBX_E_INTERNAL, "out of memory");
                return;
            }
        } else if (!(content = json_stringn ((const char *) result->data, result->size))) {
            char why[600];
            snprintf (why, sizeof why, "%.500s is not UTF-8 text; read it with encoding \"base64\"",
                      path);
            s_fail (call, SBX_E_INVALID_ARGUMENT, why);
            return;
        }
        s_follow (call, NULL);
        s_finish (call, s_read_result (call->base64, path, content, result->size));
        return;
    }
    //  The answer goes out as it is (shared: nothing changes it from here on).
    json_t *answer = json_incref (result->answer);
    s_follow (call, answer);
    gw_tools_t *self = call->tools;
    if (call->op == SBX_OP_GET_SANDBOX && !result->reply && self->kept_answer == answer) {
        //  The read copy's kept answer again (an agent polling its sandbox): the same
        //  result as last time, whose serialised text gw_mcp still has.
        json_decref (answer);
        s_finish (call, json_incref (self->kept_result));
        return;
    }
    char *text = gw_text_render (self->text, call->op, answer, call->args);
    json_t *made = s_text_result (text ? text : "", answer, false);
    free (text);
    if (call->op == SBX_OP_GET_SANDBOX) {
        json_decref (self->kept_answer);
        json_decref (self->kept_result);
        self->kept_answer = json_incref (answer);
        self->kept_result = json_incref (made);
    }
    s_finish (call, made);
}

//  --------------------------------------------------------------------------
//  The tools: defined by sbx_ops_gen (schemas/operations.json), run by gw_ops

gw_tools_t *gw_tools_new (gw_ctx_t *ctx)
{
    gw_tools_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->next_serial = 1;
    json_error_t error;
    self->list = json_loads (sbx_ops_tools_json, 0, &error);
    if (!self->list)
        sbx_error ("tool definitions: %s at %d", error.text, error.position);
    self->ops = ctx->ops;
    self->text = gw_text_new ();
    self->calls = sbx_idmap_new ();
    if (!self->list || !self->ops || !self->text || !self->calls) {
        gw_tools_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_tools_destroy (gw_tools_t **self_p)
{
    assert (self_p);
    gw_tools_t *self = *self_p;
    if (!self)
        return;
    if (self->calls) {
        for (s_call_t *call = zhashx_first (self->calls); call; call = zhashx_next (self->calls)) {
            gw_ops_cancel (self->ops, call->handle);
            s_call_free (call);
        }
        zhashx_destroy (&self->calls);
    }
    json_decref (self->list);
    json_decref (self->kept_answer);
    json_decref (self->kept_result);
    gw_text_destroy (&self->text);
    free (self);
    *self_p = NULL;
}

json_t *gw_tools_list (gw_tools_t *self)
{
    return self->list;
}

bool gw_tools_read_only (gw_tools_t *self, const char *name)
{
    (void) self;
    sbx_op_t op;
    return sbx_ops_tool (name, &op) == 0 && sbx_ops[op].read_only;
}

uint64_t gw_tools_call (gw_tools_t *self, const sbx_caller_t *caller, gw_tools_state_t *state,
                        const char *name, json_t *arguments, gw_tools_done_fn *done, void *arg)
{
    sbx_op_t op;
    char message[300];
    if (sbx_ops_tool (name, &op)) {
        snprintf (message, sizeof message, "Unknown tool: %.200s", name ? name : "(none)");
        done (NULL, -32602, message, arg);
        return 0;
    }
    if (arguments && !json_is_object (arguments)) {
        done (NULL, -32602, "arguments must be an object", arg);
        return 0;
    }
    s_call_t *call = calloc (1, sizeof *call);
    if (!call) {
        done (NULL, -32603, "out of memory", arg);
        return 0;
    }
    call->tools = self;
    call->op = op;
    call->state = gw_tools_state_ref (state);
    call->args = arguments ? json_copy (arguments) : json_object ();
    call->done = done;
    call->arg = arg;
    //  The broker decides too; refusing here spares it the request and says why plainly.
    if (caller && caller->preset == SBX_KEY_PRESET_READ_ONLY && !sbx_ops[op].read_only) {
        snprintf (message, sizeof message, "this key is read-only: it cannot use %s", name);
        s_fail (call, SBX_E_PERMISSION_DENIED, message);
        return 0;
    }
    const sbx_op_arg_t *sandbox = sbx_args_find (op, "sandboxId");
    json_t *given = json_object_get (call->args, "sandboxId");
    if (json_is_string (given) && !*json_string_value (given))
        json_object_del (call->args, "sandboxId"); //  "" as absent: some clients send it
    if (op == SBX_OP_DELETE_SANDBOX && !sbx_api_sandbox_id (call->args)) {
        //  Never the default: a model must name exactly what it deletes.
        s_finish (call, s_text_result ("sandboxId is required: the exact id (sb_…) of one "
                                       "sandbox; delete_sandbox has no default",
                                       NULL, true));
        return 0;
    }
    char why[400];
    if (sbx_args_check (op, SBX_OPS_MCP, call->args, why, sizeof why)) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, why);
        return 0;
    }
    //  The session's default sandbox for every tool that acts on one.
    if (sandbox && sandbox->mcp_optional && !sbx_api_sandbox_id (call->args)) {
        const char *last = gw_tools_state_default (state);
        if (!last) {
            s_fail (call, SBX_E_INVALID_ARGUMENT,
                    "no sandbox yet in this session: call create_sandbox first, or pass "
                    "sandboxId");
            return 0;
        }
        json_object_set_new (call->args, "sandboxId", json_string (last));
    }
    const char *id = sbx_api_sandbox_id (call->args);
    if (op == SBX_OP_EXEC && id) {
        //  The session's env for this sandbox first, then the call's own.
        json_t *env = zhashx_lookup (state->env, id);
        if (env) {
            json_t *merged = json_copy (env);
            json_object_update (merged, sbx_args_object (call->args, "env"));
            json_object_set_new (call->args, "env", merged);
        }
    }
    uint8_t *data = NULL;
    size_t size = 0;
    const char *encoding = sbx_args_string (op, call->args, "encoding");
    call->base64 = encoding && strcasecmp (encoding, "base64") == 0;
    if (op == SBX_OP_WRITE_FILE) {
        const char *content = sbx_args_string (op, call->args, "content");
        if (call->base64) {
            data = *content ? sbx_secret_base64_decode (content, &size) : calloc (1, 1);
            if (!data) {
                s_fail (call, SBX_E_INVALID_ARGUMENT, "content is not valid base64");
                return 0;
            }
        } else {
            size = json_string_length (json_object_get (call->args, "content"));
            data = malloc (size + 1);
            memcpy (data, content, size);
        }
    }
    call->serial = self->next_serial++;
    uint64_t serial = call->serial;
    zhashx_insert (self->calls, (void *) (uintptr_t) serial, call);
    //  write_file's decoded bytes go to the transfer as they are (not copied again).
    uint64_t handle = gw_ops_call_take (self->ops, op, SBX_OPS_MCP, caller, call->args, &data, size,
                                        s_on_done, call);
    free (data);
    //  Answered at once (refused): the call is gone already.
    if (!zhashx_lookup (self->calls, (void *) (uintptr_t) serial))
        return 0;
    call->handle = handle;
    return serial;
}

void gw_tools_abandon (gw_tools_t *self, uint64_t handle)
{
    s_call_t *call = handle ? zhashx_lookup (self->calls, (void *) (uintptr_t) handle) : NULL;
    if (!call)
        return;
    zhashx_delete (self->calls, (void *) (uintptr_t) handle);
    gw_ops_abandon (self->ops, call->handle);
    s_call_free (call);
}

//  --------------------------------------------------------------------------
//  Self test: definitions and the paths that need no broker.

typedef struct {
    json_t *result;
    int code;
    int calls;
} s_probe_t;

static void s_probe (json_t *result, int rpc_code, const char *rpc_message, void *arg)
{
    (void) rpc_message;
    s_probe_t *probe = arg;
    json_decref (probe->result);
    probe->result = result;
    probe->code = rpc_code;
    probe->calls++;
}

static const char *s_probe_text (s_probe_t *probe)
{
    return json_string_value (
        json_object_get (json_array_get (json_object_get (probe->result, "content"), 0), "text"));
}

void gw_tools_test (bool verbose)
{
    (void) verbose;
    gw_ctx_t *ctx = gw_ctx_new (NULL, NULL, NULL, NULL);
    gw_tools_t *tools = ctx ? gw_tools_new (ctx) : NULL;
    assert (tools);
    json_t *list = gw_tools_list (tools);
    static const char *names[] = {"create_sandbox",
                                  "list_sandboxes",
                                  "get_sandbox",
                                  "get_sandbox_metrics",
                                  "exec",
                                  "command_status",
                                  "kill_command",
                                  "list_commands",
                                  "read_file",
                                  "write_file",
                                  "host_port",
                                  "stop_sandbox",
                                  "resume_sandbox",
                                  "extend_sandbox",
                                  "rename_sandbox",
                                  "label_sandbox",
                                  "delete_sandbox",
                                  "save_snapshot",
                                  "list_snapshots",
                                  "delete_snapshot",
                                  "set_sandbox_egress",
                                  "fork_sandbox"};
    static const char *read_only[] = {"list_sandboxes", "get_sandbox",   "get_sandbox_metrics",
                                      "command_status", "list_commands", "read_file",
                                      "list_snapshots"};
    static const char *destructive[] = {"exec", "kill_command", "write_file", "delete_sandbox",
                                        "delete_snapshot"};
    assert (json_array_size (list) == sizeof names / sizeof *names);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        json_t *tool = json_array_get (list, i);
        const char *name = json_string_value (json_object_get (tool, "name"));
        assert (streq (name, names[i]));
        assert (json_string_length (json_object_get (tool, "description")) > 10);
        //  Every schema is a JSON Schema object.
        json_t *in = json_object_get (tool, "inputSchema");
        json_t *out = json_object_get (tool, "outputSchema");
        assert (streq (json_string_value (json_object_get (in, "type")), "object"));
        assert (json_is_object (json_object_get (in, "properties")));
        assert (streq (json_string_value (json_object_get (out, "type")), "object"));
        assert (json_is_object (json_object_get (out, "properties")));
        //  Every tool that acts on one sandbox takes sandboxId.
        assert (streq (name, "list_sandboxes") || streq (name, "create_sandbox") ||
                streq (name, "delete_snapshot") ||
                json_object_get (json_object_get (in, "properties"), "sandboxId"));
        json_t *annotations = json_object_get (tool, "annotations");
        bool ro = false, destroys = false;
        for (size_t k = 0; k < sizeof read_only / sizeof *read_only; k++)
            ro |= streq (name, read_only[k]);
        for (size_t k = 0; k < sizeof destructive / sizeof *destructive; k++)
            destroys |= streq (name, destructive[k]);
        json_t *hint = json_object_get (annotations, "readOnlyHint");
        assert (json_is_boolean (hint) && json_is_true (hint) == ro);
        hint = json_object_get (annotations, "destructiveHint");
        if (ro)
            assert (hint == NULL);
        else
            assert (json_is_boolean (hint) && json_is_true (hint) == destroys);
        //  The dispatch table says the same (both come from schemas/operations.json).
        sbx_op_t op;
        assert (sbx_ops_tool (name, &op) == 0 && streq (sbx_ops[op].name, name));
        assert (sbx_ops[op].read_only == ro && sbx_ops[op].destructive == destroys);
        assert (gw_tools_read_only (tools, name) == ro);
    }
    assert (sbx_ops_tool ("update_sandbox", NULL) == -1); //  REST's, not a tool
    //  Setting egress rules twice is setting them once.
    json_t *egress_tool = json_array_get (list, 20);
    assert (json_is_true (
        json_object_get (json_object_get (egress_tool, "annotations"), "idempotentHint")));
    assert (
        streq (json_string_value (json_array_get (
                   json_object_get (json_object_get (egress_tool, "inputSchema"), "required"), 0)),
               "egress"));
    assert (streq (json_string_value (json_array_get (
                       json_object_get (json_object_get (json_array_get (list, 16), "inputSchema"),
                                        "required"),
                       0)),
                   "sandboxId"));

    gw_tools_state_t *state = gw_tools_state_new ();
    sbx_caller_t caller = {.kind = SBX_CALLER_KIND_API_KEY,
                           .account_id = "acc_test",
                           .key_id = "key_test",
                           .preset = SBX_KEY_PRESET_FULL};
    s_probe_t probe = {0};
    gw_tools_call (tools, &caller, state, "no_such_tool", NULL, s_probe, &probe);
    assert (probe.calls == 1 && probe.code == -32602 && !probe.result);
    json_t *args = json_object ();
    gw_tools_call (tools, &caller, state, "delete_sandbox", args, s_probe, &probe);
    assert (probe.calls == 2 && probe.code == 0);
    assert (json_is_true (json_object_get (probe.result, "isError")));
    assert (streq (s_probe_text (&probe), "sandboxId is required: the exact id (sb_…) of one "
                                          "sandbox; delete_sandbox has no default"));
    gw_tools_call (tools, &caller, state, "host_port", args, s_probe, &probe);
    assert (streq (s_probe_text (&probe), "port is required (invalid_argument)"));
    gw_tools_call (tools, &caller, state, "get_sandbox", args, s_probe, &probe);
    assert (json_is_true (json_object_get (probe.result, "isError")));
    assert (strstr (s_probe_text (&probe), "create_sandbox first"));
    //  delete_snapshot names exactly what it deletes too.
    gw_tools_call (tools, &caller, state, "delete_snapshot", args, s_probe, &probe);
    assert (json_is_true (json_object_get (probe.result, "isError")));
    assert (strstr (s_probe_text (&probe), "snapshotId is required"));
    json_object_clear (args);
    json_object_set_new (args, "command", json_integer (3));
    gw_tools_call (tools, &caller, state, "exec", args, s_probe, &probe);
    assert (streq (s_probe_text (&probe), "command must be a string (invalid_argument)"));
    json_object_set_new (args, "command", json_string ("true"));
    json_object_set_new (args, "timeout", json_integer (601));
    gw_tools_call (tools, &caller, state, "exec", args, s_probe, &probe);
    assert (streq (s_probe_text (&probe), "timeout must be between 1 and 600 (invalid_argument)"));
    json_t *bad = json_string ("x");
    gw_tools_call (tools, &caller, state, "exec", bad, s_probe, &probe);
    assert (probe.code == -32602);
    json_decref (bad);
    caller.preset = SBX_KEY_PRESET_READ_ONLY;
    gw_tools_call (tools, &caller, state, "exec", args, s_probe, &probe);
    assert (streq (s_probe_text (&probe),
                   "this key is read-only: it cannot use exec (permission_denied)"));
    json_decref (args);
    json_decref (probe.result);

    gw_tools_state_unref (&state);
    gw_tools_destroy (&tools);
    gw_ctx_destroy (&ctx);
}
