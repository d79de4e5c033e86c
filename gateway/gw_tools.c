/*  gw_tools - see gw_tools.h */
#include "gw_tools.h"
#include "gw_cache.h"
#include "gw_ctx.h"
#include "sbx_ops_gen.h"
#include "sbx_idmap.h"
#include "gw_auth.h"
#include "gw_broker.h"

#include <assert.h>

#define S_CHUNK        (1024 * 1024)      //  the agent's per-request file limit
#define S_READ_MAX     (10 * 1024 * 1024) //  read_file's limit
#define S_OUTPUT_MAX   (1024 * 1024)      //  output bytes of each stream in one answer
#define S_EXEC_DEFAULT 120
#define S_EXEC_MAX     600
#define S_MARGIN_MS    30000 //  broker, vmd and agent time on top of a tool's own wait
#define S_USAGE_MS     30000 //  billing's figures for get_sandbox and list_sandboxes

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

typedef struct s_call_t s_call_t;
typedef void (s_reply_fn) (s_call_t *call, sbx_msg_t *reply);

struct gw_tools_t {
    sbx_config_t *config;
    json_t *list;
    gw_broker_t *broker; //  the gateway's (ctx)
    zhashx_t *calls;     //  serial → s_call_t waiting for the broker
    uint64_t next_serial;
    gw_cache_t *cache; //  the gateway's copy of sandboxes, or NULL
};

struct s_call_t {
    gw_tools_t *tools;
    uint64_t serial, handle;
    sbx_op_t op;
    char *name;
    sbx_caller_t *caller;
    gw_tools_state_t *state;
    json_t *args;
    char *sandbox_id;
    gw_tools_done_fn *done;
    void *arg;
    s_reply_fn *on_reply;
    bool errors_to_reply; //  on_reply gets errors too (as a NULL reply)
    json_t *pending;      //  a result waiting for billing's figures
    uint64_t tick;        //  get_sandbox: the cache's drops when it began
    //  Per tool.
    uint64_t pid;
    int signal;
    unsigned timeout_s;
    bool base64;
    uint8_t *data; //  read_file: what was read; write_file: what to write
    size_t size, done_bytes;
    uint64_t mode;
};

static void s_call_free (s_call_t *call)
{
    free (call->name);
    gw_auth_caller_destroy (&call->caller);
    gw_tools_state_unref (&call->state);
    json_decref (call->args);
    json_decref (call->pending);
    free (call->sandbox_id);
    free (call->data);
    free (call);
}

//  Ends the call with a CallToolResult.
static void s_finish (s_call_t *call, json_t *result)
{
    call->done (result, 0, NULL, call->arg);
    s_call_free (call);
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

//  A tool error: "<message> (<code>)".
static void s_fail (s_call_t *call, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));
static void s_fail (s_call_t *call, sbx_code_t code, const char *format, ...)
{
    char message[600], text[700];
    va_list args;
    va_start (args, format);
    vsnprintf (message, sizeof message, format, args);
    va_end (args);
    snprintf (text, sizeof text, "%s (%s)", message, sbx_code_name (code));
    //  The message may quote the caller's arguments, cut at a limit: JSON needs UTF-8.
    sbx_utf8_sanitize (text);
    s_finish (call, s_text_result (text, NULL, true));
}

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_call_t *call = arg;
    zhashx_delete (call->tools->calls, (void *) (uintptr_t) call->serial);
    call->handle = 0;
    if (!reply && !call->errors_to_reply)
        s_fail (call, code, "%s", message ? message : sbx_code_name (code));
    else
        call->on_reply (call, reply);
}

//  Sends a request for the call (taking it); on_reply gets the answer unless it is an
//  error, which ends the call as a tool error. With sandbox_id, request is an agent
//  request for that sandbox.
static void s_send_to (s_call_t *call, const char *sandbox_id, sbx_msg_t **request_p,
                       uint32_t timeout_ms, s_reply_fn *on_reply)
{
    gw_tools_t *self = call->tools;
    call->on_reply = on_reply;
    call->serial = self->next_serial++;
    uint64_t serial = call->serial;
    zhashx_insert (self->calls, (void *) (uintptr_t) serial, call);
    uint64_t handle = sandbox_id ? gw_broker_send_agent (self->broker, call->caller, sandbox_id,
                                                         request_p, timeout_ms, s_on_answer, call)
                                 : gw_broker_send (self->broker, call->caller, request_p,
                                                   timeout_ms, s_on_answer, call);
    //  A request that could not go out is answered (and the call ended) at once.
    s_call_t *still = zhashx_lookup (self->calls, (void *) (uintptr_t) serial);
    if (still)
        still->handle = handle;
}

static void s_send (s_call_t *call, sbx_msg_t **request_p, uint32_t timeout_ms,
                    s_reply_fn *on_reply)
{
    s_send_to (call, NULL, request_p, timeout_ms, on_reply);
}

//  Sends an agent request to the call's sandbox.
static void s_send_agent (s_call_t *call, sbx_msg_t **inner_p, uint32_t timeout_ms,
                          s_reply_fn *on_reply)
{
    s_send_to (call, call->sandbox_id, inner_p, timeout_ms, on_reply);
}

//  How long the call's operation waits for its answer (schemas/operations.json).
static uint32_t s_deadline (s_call_t *call)
{
    return sbx_ops[call->op].deadline_ms;
}

//  --------------------------------------------------------------------------
//  JSON helpers

static char *s_base64 (const uint8_t *data, size_t size)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc ((size + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < size; i += 3) {
        uint32_t v = (uint32_t) data[i] << 16;
        if (i + 1 < size)
            v |= (uint32_t) data[i + 1] << 8;
        if (i + 2 < size)
            v |= data[i + 2];
        out[o++] = alphabet[(v >> 18) & 63];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < size ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < size ? alphabet[v & 63] : '=';
    }
    out[o] = 0;
    return out;
}

//  "Sandbox sb_… is ready. URL: …. Stops automatically at …."
static char *s_sandbox_text (json_t *sandbox, const char *state_words)
{
    const char *expires = json_string_value (json_object_get (sandbox, "expiresAt"));
    const char *reason = json_string_value (json_object_get (sandbox, "reason"));
    char *text;
    if (asprintf (&text, "Sandbox %s %s. URL: %s.%s%s%s%s%s",
                  json_string_value (json_object_get (sandbox, "id")), state_words,
                  json_string_value (json_object_get (sandbox, "url")),
                  expires ? " Stops automatically at " : "", expires ? expires : "",
                  expires ? "." : "", reason ? " Reason: " : "", reason ? reason : "") < 0)
        return NULL;
    return text;
}

static const char *s_state_words (const char *state)
{
    return streq (state, "ready")      ? "is ready"
           : streq (state, "stopped")  ? "is stopped (memory kept; resume_sandbox starts it)"
           : streq (state, "creating") ? "is being created"
           : streq (state, "stopping") ? "is stopping"
           : streq (state, "resuming") ? "is resuming"
           : streq (state, "deleting") ? "is being deleted"
           : streq (state, "deleted")  ? "is deleted"
                                       : "is in error";
}

//  --------------------------------------------------------------------------
//  Argument access: each returns 0, or -1 after ending the call with a tool error.

static int s_arg_string (s_call_t *call, const char *key, const char **value, bool required)
{
    json_t *v = json_object_get (call->args, key);
    *value = NULL;
    if (!v || json_is_null (v)) {
        if (!required)
            return 0;
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s is required", key);
        return -1;
    }
    if (!json_is_string (v)) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s must be a string", key);
        return -1;
    }
    *value = json_string_value (v);
    return 0;
}

static int s_arg_int (s_call_t *call, const char *key, json_int_t *value, json_int_t dflt,
                      json_int_t min, json_int_t max, bool required)
{
    json_t *v = json_object_get (call->args, key);
    *value = dflt;
    if (!v || json_is_null (v)) {
        if (!required)
            return 0;
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s is required", key);
        return -1;
    }
    double real = json_is_real (v) ? json_real_value (v) : 0;
    if (json_is_real (v) && real == (double) (json_int_t) real)
        *value = (json_int_t) real; //  some clients send 3.0
    else if (json_is_integer (v))
        *value = json_integer_value (v);
    else {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s must be an integer", key);
        return -1;
    }
    if (*value < min || *value > max) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s must be between %lld and %lld", key,
                (long long) min, (long long) max);
        return -1;
    }
    return 0;
}

static int s_arg_bool (s_call_t *call, const char *key, bool *value, bool dflt)
{
    json_t *v = json_object_get (call->args, key);
    *value = dflt;
    if (!v || json_is_null (v))
        return 0;
    if (!json_is_boolean (v)) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "%s must be true or false", key);
        return -1;
    }
    *value = json_is_true (v);
    return 0;
}

static int s_arg_map (s_call_t *call, const char *key, sbx_strmap_t *map)
{
    json_t *v = json_object_get (call->args, key);
    if (!v || json_is_null (v))
        return 0;
    const char *k;
    json_t *item;
    if (!json_is_object (v))
        goto bad;
    json_object_foreach (v, k, item)
    {
        if (!json_is_string (item) || !*k)
            goto bad;
        sbx_strmap_set (map, k, json_string_value (item));
    }
    return 0;
bad:
    s_fail (call, SBX_E_INVALID_ARGUMENT, "%s must be an object of string values", key);
    return -1;
}

//  The sandbox the call acts on: sandboxId, else the session's default.
static int s_arg_sandbox (s_call_t *call)
{
    const char *id;
    if (s_arg_string (call, "sandboxId", &id, false))
        return -1;
    if (!id || !*id)
        id = gw_tools_state_default (call->state);
    if (!id) {
        s_fail (call, SBX_E_INVALID_ARGUMENT,
                "no sandbox yet in this session: call create_sandbox first, or pass sandboxId");
        return -1;
    }
    call->sandbox_id = strdup (id);
    return 0;
}

//  --------------------------------------------------------------------------
//  Sandboxes

//  Billing's figures for the sandboxes in a get or list result: runningSeconds,
//  costMicroUsd and costUsd ("0.000120") on each, and a line in get's text. Without
//  billing (down, or not yet caught up) the result goes out without them.
static void s_on_usage (s_call_t *call, sbx_msg_t *reply)
{
    json_t *result = call->pending;
    call->pending = NULL;
    json_t *structured = json_object_get (result, "structuredContent");
    json_t *sandboxes = json_object_get (structured, "sandboxes");
    bool single = !sandboxes;
    for (size_t i = 0; reply && i < sbx_msg_usage_get_ok (reply)->sandboxes.count; i++) {
        sbx_usage_sandbox_t *u = &sbx_msg_usage_get_ok (reply)->sandboxes.items[i];
        json_t *target = NULL;
        if (single) {
            if (streq (json_string_value (json_object_get (structured, "id")), u->sandbox_id))
                target = structured;
        } else {
            size_t j;
            json_t *item;
            json_array_foreach (sandboxes, j,
                                item) if (streq (json_string_value (json_object_get (item, "id")),
                                                 u->sandbox_id)) target = item;
        }
        if (!target)
            continue;
        char usd[32];
        snprintf (usd, sizeof usd, "%llu.%06llu", (unsigned long long) (u->micro_usd / 1000000),
                  (unsigned long long) (u->micro_usd % 1000000));
        json_object_set_new (target, "runningSeconds", json_integer ((json_int_t) u->seconds));
        json_object_set_new (target, "costMicroUsd", json_integer ((json_int_t) u->micro_usd));
        json_object_set_new (target, "costUsd", json_string (usd));
        if (single) {
            json_t *content = json_array_get (json_object_get (result, "content"), 0);
            char *text = NULL;
            if (asprintf (&text, "%s Running time so far: %llu s, $%s.",
                          json_string_value (json_object_get (content, "text")),
                          (unsigned long long) u->seconds, usd) > 0) {
                json_object_set_new (content, "text", json_string (text));
                free (text);
            }
            if (call->tools->cache)
                gw_cache_keep_result (call->tools->cache, call->caller, u->sandbox_id, call->tick,
                                      result);
        }
    }
    s_finish (call, result);
}

//  Sends the result on after asking billing for the figures of `sandbox_id` (NULL: all
//  of the caller's).
static void s_with_usage (s_call_t *call, json_t *result, const char *sandbox_id)
{
    if (!call->caller || !call->caller->account_id) {
        s_finish (call, result);
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&sbx_msg_usage_get (request)->account, call->caller->account_id);
    sbx_str_set (&sbx_msg_usage_get (request)->sandbox_id, sandbox_id);
    call->pending = result;
    call->errors_to_reply = true;
    s_send (call, &request, S_USAGE_MS, s_on_usage);
}

static void s_on_sandbox (s_call_t *call, sbx_msg_t *reply)
{
    sbx_sandbox_info_t *info = gw_broker_sandbox_info (reply);
    if (!info) {
        s_fail (call, SBX_E_INTERNAL, "unexpected answer %s", sbx_msg_type_name (reply->type));
        return;
    }
    json_t *sandbox = gw_broker_sandbox_json (call->tools->broker, info);
    char *text = NULL;
    gw_tools_state_t *state = call->state;
    if (reply->type == SBX_MSG_SANDBOX_DELETE_OK) {
        if (asprintf (&text, "Deleting %s: its disk, memory and automatic snapshots are removed.",
                      info->id) < 0)
            text = NULL;
        if (state->last && streq (state->last, info->id))
            zstr_free (&state->last);
        gw_tools_state_set_env (state, info->id, NULL);
        s_state_change (state, info->id, true, NULL);
    } else {
        s_state_use (state, info->id);
        if (reply->type == SBX_MSG_SANDBOX_CREATE_OK) {
            json_t *env = json_object_get (call->args, "env");
            if (json_is_object (env) && json_object_size (env)) {
                gw_tools_state_set_env (state, info->id, env);
                s_state_change (state, info->id, false, env);
            }
        }
        const char *words = s_state_words (sbx_sandbox_state_name (info->state));
        if (reply->type == SBX_MSG_SANDBOX_RESUME_OK && info->state == SBX_SANDBOX_STATE_READY)
            words = "is ready again";
        if (reply->type == SBX_MSG_SANDBOX_STOP_OK && info->state == SBX_SANDBOX_STATE_STOPPED)
            words = "is stopped with its memory kept; it bills no running time until "
                    "resume_sandbox";
        if (reply->type == SBX_MSG_SANDBOX_EXTEND_OK)
            words = "has a new deadline";
        if (reply->type == SBX_MSG_SANDBOX_UPDATE_OK)
            words = "is updated";
        text = s_sandbox_text (sandbox, words);
    }
    const char *note =
        reply->type == SBX_MSG_SANDBOX_CREATE_OK ? sbx_msg_sandbox_create_ok (reply)->note : NULL;
    if (note && *note) {
        //  Made from a snapshot that could not be restored as it was: say how it started.
        char *more = NULL;
        if (asprintf (&more, "%s Note: %s.", text ? text : "", note) >= 0) {
            free (text);
            text = more;
        }
    }
    if (reply->type == SBX_MSG_SANDBOX_CREATE_OK) {
        //  The reference's create answer carries these six.
        json_t *brief = json_pack (
            "{s:O, s:O, s:O, s:O, s:O, s:O}", "id", json_object_get (sandbox, "id"), "name",
            json_object_get (sandbox, "name"), "state", json_object_get (sandbox, "state"), "type",
            json_object_get (sandbox, "type"), "url", json_object_get (sandbox, "url"), "expiresAt",
            json_object_get (sandbox, "expiresAt"));
        json_decref (sandbox);
        sandbox = brief;
        if (note && *note)
            json_object_set_new (sandbox, "note", json_string (note));
    }
    json_t *result = s_text_result (text ? text : "", sandbox, false);
    free (text);
    if (reply->type == SBX_MSG_SANDBOX_GET_OK)
        s_with_usage (call, result, info->id);
    else
        s_finish (call, result);
}

static void s_on_list (s_call_t *call, sbx_msg_t *reply)
{
    sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
    json_t *all = json_array ();
    zchunk_t *text = zchunk_new (NULL, 0);
    if (list->count == 0)
        zchunk_extend (text, "No sandboxes.", 13);
    else {
        char line[600];
        int n = snprintf (line, sizeof line, "%zu sandbox%s:", list->count,
                          list->count == 1 ? "" : "es");
        zchunk_extend (text, line, (size_t) n);
    }
    for (size_t i = 0; i < list->count; i++) {
        json_t *sandbox = gw_broker_sandbox_json (call->tools->broker, &list->items[i]);
        char line[800];
        const char *expires = json_string_value (json_object_get (sandbox, "expiresAt"));
        int n = snprintf (line, sizeof line, "\n%s  %s  %s  %s  %s%s%s",
                          json_string_value (json_object_get (sandbox, "id")),
                          json_string_value (json_object_get (sandbox, "state")),
                          json_string_value (json_object_get (sandbox, "name")),
                          json_string_value (json_object_get (sandbox, "type")),
                          json_string_value (json_object_get (sandbox, "url")),
                          expires ? "  stops at " : "", expires ? expires : "");
        zchunk_extend (text, line, (size_t) n < sizeof line ? (size_t) n : sizeof line - 1);
        json_array_append_new (all, sandbox);
    }
    zchunk_extend (text, "", 1);
    json_t *result =
        s_text_result ((char *) zchunk_data (text), json_pack ("{s:o}", "sandboxes", all), false);
    zchunk_destroy (&text);
    if (list->count)
        s_with_usage (call, result, NULL);
    else
        s_finish (call, result);
}

static void s_create (s_call_t *call)
{
    const char *name, *type, *snapshot;
    json_int_t ttl;
    bool network;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    sbx_sandbox_create_t *args = sbx_msg_sandbox_create (request);
    sbx_strmap_t env = {0};
    int rc = s_arg_string (call, "name", &name, false) ||
             s_arg_string (call, "type", &type, false) ||
             s_arg_string (call, "snapshotId", &snapshot, false) ||
             s_arg_int (call, "ttlSeconds", &ttl, 3600, 60, 30LL * 86400, false) ||
             s_arg_bool (call, "network", &network, true) ||
             s_arg_map (call, "labels", &args->labels) || s_arg_map (call, "env", &env);
    //  env is only checked here; the session keeps the JSON.
    for (size_t i = 0; i < env.count; i++) {
        free (env.keys[i]);
        free (env.values[i]);
    }
    free (env.keys);
    free (env.values);
    if (rc) {
        sbx_msg_destroy (&request);
        return;
    }
    sbx_str_set (&args->snapshot_id, snapshot && *snapshot ? snapshot : NULL);
    if (type && sbx_sandbox_type_from_name (type, &args->type)) {
        sbx_msg_destroy (&request);
        s_fail (call, SBX_E_INVALID_ARGUMENT, "type is small, medium or large");
        return;
    }
    sbx_str_set (&args->name, name);
    args->ttl_s = (uint64_t) ttl;
    args->no_network = !network;
    s_send (call, &request, s_deadline (call), s_on_sandbox);
}

//  --------------------------------------------------------------------------
//  Snapshots: save_snapshot, list_snapshots, delete_snapshot

static double s_mib (uint64_t bytes)
{
    return bytes / (1024.0 * 1024.0);
}

static void s_on_snapshot_saved (s_call_t *call, sbx_msg_t *reply)
{
    sbx_snapshot_info_t *info = sbx_msg_snapshot_save_ok (reply)->snapshot;
    char *text = NULL;
    if (asprintf (&text,
                  "Saved snapshot %s of %s (%.1f MiB). Start new sandboxes from it with "
                  "create_sandbox and snapshotId %s.",
                  info->id, info->sandbox_id ? info->sandbox_id : "the sandbox",
                  s_mib (info->disk_bytes + info->memory_bytes), info->id) < 0)
        text = NULL;
    if (info->sandbox_id)
        s_state_use (call->state, info->sandbox_id);
    json_t *structured = gw_broker_snapshot_json (info);
    json_object_set_new (structured, "snapshotId", json_string (info->id));
    s_finish (call, s_text_result (text ? text : "", structured, false));
    free (text);
}

static void s_save_snapshot (s_call_t *call)
{
    const char *name;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_SAVE);
    sbx_snapshot_save_t *args = sbx_msg_snapshot_save (request);
    if (s_arg_string (call, "name", &name, false) || s_arg_map (call, "labels", &args->labels) ||
        s_arg_sandbox (call)) {
        sbx_msg_destroy (&request);
        return;
    }
    sbx_str_set (&args->name, name);
    sbx_str_set (&args->sandbox_id, call->sandbox_id);
    s_send (call, &request, s_deadline (call), s_on_snapshot_saved);
}

static void s_on_snapshot_list (s_call_t *call, sbx_msg_t *reply)
{
    sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
    json_t *all = json_array ();
    zchunk_t *text = zchunk_new (NULL, 0);
    char line[800];
    int n = list->count ? snprintf (line, sizeof line, "%zu snapshot%s:", list->count,
                                    list->count == 1 ? "" : "s")
                        : snprintf (line, sizeof line, "No snapshots.");
    zchunk_extend (text, line, (size_t) n);
    for (size_t i = 0; i < list->count; i++) {
        sbx_snapshot_info_t *info = &list->items[i];
        json_t *snapshot = gw_broker_snapshot_json (info);
        n = snprintf (line, sizeof line, "\n%s  %s  %s  from %s  %.1f MiB  %s%s%s", info->id,
                      sbx_snapshot_state_name (info->state), info->name ? info->name : "-",
                      info->sandbox_id ? info->sandbox_id : "-",
                      s_mib (info->disk_bytes + info->memory_bytes),
                      json_string_value (json_object_get (snapshot, "createdAt")),
                      info->reason ? "  " : "", info->reason ? info->reason : "");
        zchunk_extend (text, line, (size_t) n < sizeof line ? (size_t) n : sizeof line - 1);
        json_array_append_new (all, snapshot);
    }
    zchunk_extend (text, "", 1);
    s_finish (call, s_text_result ((char *) zchunk_data (text),
                                   json_pack ("{s:o}", "snapshots", all), false));
    zchunk_destroy (&text);
}

static void s_on_snapshot_deleted (s_call_t *call, sbx_msg_t *reply)
{
    sbx_snapshot_info_t *info = sbx_msg_snapshot_delete_ok (reply)->snapshot;
    char *text = NULL;
    if (asprintf (&text, "Deleted snapshot %s.", info->id) < 0)
        text = NULL;
    s_finish (call, s_text_result (text ? text : "",
                                   json_pack ("{s:s, s:b}", "snapshotId", info->id, "deleted", 1),
                                   false));
    free (text);
}

static void s_delete_snapshot (s_call_t *call)
{
    const char *id;
    if (s_arg_string (call, "snapshotId", &id, false))
        return;
    if (!id || !*id) {
        s_fail (call, SBX_E_INVALID_ARGUMENT,
                "snapshotId is required: the exact id (snap_…) of one snapshot; list_snapshots "
                "shows them");
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_DELETE);
    sbx_str_set (&sbx_msg_snapshot_delete (request)->snapshot_id, id);
    s_send (call, &request, s_deadline (call), s_on_snapshot_deleted);
}

static void s_simple (s_call_t *call, sbx_msg_type_t type)
{
    sbx_msg_t *request = sbx_msg_new (type);
    //  Each of these is { sandbox_id } (schemas/sandbox.json).
    if (type == SBX_MSG_SANDBOX_GET)
        sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, call->sandbox_id);
    else if (type == SBX_MSG_SANDBOX_STOP)
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, call->sandbox_id);
    else if (type == SBX_MSG_SANDBOX_RESUME)
        sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, call->sandbox_id);
    else
        sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, call->sandbox_id);
    s_send (call, &request, s_deadline (call), s_on_sandbox);
}

//  extend_sandbox: a new deadline ttlSeconds from now (also its TTL at later resumes).
static void s_extend (s_call_t *call)
{
    json_int_t ttl;
    if (s_arg_int (call, "ttlSeconds", &ttl, 0, 60, 30LL * 86400, true) || s_arg_sandbox (call))
        return;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_EXTEND);
    sbx_str_set (&sbx_msg_sandbox_extend (request)->sandbox_id, call->sandbox_id);
    sbx_msg_sandbox_extend (request)->ttl_s = (uint64_t) ttl;
    s_send (call, &request, s_deadline (call), s_on_sandbox);
}

//  host_port: "Port 8000 of sb_… is at https://LABEL-8000.BOX_DOMAIN (public)."
static void s_on_port (s_call_t *call, sbx_msg_t *reply)
{
    sbx_sandbox_port_ok_t *ok = sbx_msg_sandbox_port_ok (reply);
    char host[96];
    snprintf (host, sizeof host, "%s-%llu", ok->sandbox->label ? ok->sandbox->label : "-",
              (unsigned long long) ok->port);
    char *url = gw_broker_sandbox_url (call->tools->broker, host);
    char *text = NULL;
    if (ok->removed) {
        if (asprintf (&text, "Port %llu of %s is no longer published.",
                      (unsigned long long) ok->port, ok->sandbox->id) < 0)
            text = NULL;
    } else if (asprintf (&text, "Port %llu of %s is at %s (%s).", (unsigned long long) ok->port,
                         ok->sandbox->id, url ? url : "", ok->public ? "public" : "private") < 0)
        text = NULL;
    json_t *structured = json_pack ("{s:I, s:s, s:b}", "port", (json_int_t) ok->port, "url",
                                    url ? url : "", "public", ok->public);
    if (ok->removed)
        json_object_set_new (structured, "removed", json_true ());
    s_state_use (call->state, ok->sandbox->id);
    s_finish (call, s_text_result (text ? text : "", structured, false));
    free (text);
    free (url);
}

static void s_port (s_call_t *call)
{
    json_int_t port;
    bool public, remove;
    if (s_arg_int (call, "port", &port, 0, 1, 65535, true) ||
        s_arg_bool (call, "public", &public, false) ||
        s_arg_bool (call, "remove", &remove, false) || s_arg_sandbox (call))
        return;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_PORT);
    sbx_sandbox_port_t *args = sbx_msg_sandbox_port (request);
    sbx_str_set (&args->sandbox_id, call->sandbox_id);
    args->port = (uint64_t) port;
    args->public = public;
    args->remove = remove;
    s_send (call, &request, s_deadline (call), s_on_port);
}

//  rename_sandbox (name) and label_sandbox (labels: a null value removes one).
static void s_update (s_call_t *call, bool labels)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    sbx_sandbox_update_t *args = sbx_msg_sandbox_update (request);
    const char *name = NULL;
    int rc = 0;
    if (!labels)
        rc = s_arg_string (call, "name", &name, true);
    else {
        json_t *map = json_object_get (call->args, "labels");
        const char *key;
        json_t *value;
        if (!json_is_object (map)) {
            s_fail (call, SBX_E_INVALID_ARGUMENT, "labels must be an object");
            rc = -1;
        } else
            json_object_foreach (map, key, value)
            {
                if (json_is_null (value))
                    sbx_strlist_append (&args->remove_labels, key);
                else if (json_is_string (value) && *key)
                    sbx_strmap_set (&args->labels, key, json_string_value (value));
                else {
                    s_fail (call, SBX_E_INVALID_ARGUMENT,
                            "labels maps keys to strings (or null to remove one)");
                    rc = -1;
                    break;
                }
            }
    }
    if (rc || s_arg_sandbox (call)) {
        sbx_msg_destroy (&request);
        return;
    }
    sbx_str_set (&args->sandbox_id, call->sandbox_id);
    sbx_str_set (&args->name, name);
    s_send (call, &request, s_deadline (call), s_on_sandbox);
}

//  --------------------------------------------------------------------------
//  Processes

//  Appends "\n<name>:\n<text>" without one trailing newline, when there is output.
static void s_append_stream (zchunk_t *text, const char *name, json_t *value)
{
    size_t size = json_string_length (value);
    if (!size)
        return;
    const char *data = json_string_value (value);
    if (data[size - 1] == '\n')
        size--;
    zchunk_extend (text, "\n", 1);
    zchunk_extend (text, name, strlen (name));
    zchunk_extend (text, ":\n", 2);
    zchunk_extend (text, data, size);
}

static json_t *s_output (s_call_t *call, zchunk_t *text, bool running, int64_t exit_code,
                         bool timed_out, const sbx_bytes_t *out, const sbx_bytes_t *err,
                         uint64_t out_next, uint64_t err_next, bool out_cut, bool err_cut)
{
    json_t *structured = json_pack (
        "{s:o, s:o, s:o, s:I, s:I, s:b, s:b, s:b, s:I}", "exitCode",
        running ? json_null () : json_integer (exit_code), "stdout",
        gw_broker_lossy_json (out->data, out->size), "stderr",
        gw_broker_lossy_json (err->data, err->size), "stdoutNextOffset", (json_int_t) out_next,
        "stderrNextOffset", (json_int_t) err_next, "stdoutTruncated", out_cut, "stderrTruncated",
        err_cut, "timedOut", timed_out, "processId", (json_int_t) call->pid);
    s_append_stream (text, "stdout", json_object_get (structured, "stdout"));
    s_append_stream (text, "stderr", json_object_get (structured, "stderr"));
    if (out_cut || err_cut) {
        char note[300];
        int n = snprintf (note, sizeof note,
                          "\n(Output was cut: call command_status with processId %llu, "
                          "stdoutOffset %llu and stderrOffset %llu for more.)",
                          (unsigned long long) call->pid, (unsigned long long) out_next,
                          (unsigned long long) err_next);
        zchunk_extend (text, note, (size_t) n);
    }
    zchunk_extend (text, "", 1);
    json_t *result = s_text_result ((char *) zchunk_data (text), structured, false);
    zchunk_destroy (&text);
    return result;
}

static void s_on_exec (s_call_t *call, sbx_msg_t *reply)
{
    sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
    call->pid = ok->pid;
    s_state_use (call->state, call->sandbox_id);
    char line[400];
    if (ok->running) {
        snprintf (line, sizeof line,
                  "Started process %llu in %s. Call command_status with processId %llu for its "
                  "output and exit code.",
                  (unsigned long long) ok->pid, call->sandbox_id, (unsigned long long) ok->pid);
        s_finish (call, s_text_result (line,
                                       json_pack ("{s:I, s:b}", "processId", (json_int_t) ok->pid,
                                                  "running", 1),
                                       false));
        return;
    }
    zchunk_t *text = zchunk_new (NULL, 0);
    int n = snprintf (line, sizeof line, "Exit code %lld.", (long long) ok->exit_code);
    zchunk_extend (text, line, (size_t) n);
    if (ok->timed_out) {
        n = snprintf (line, sizeof line,
                      " The command ran longer than %u s and was killed; use detached: true for "
                      "long commands.",
                      call->timeout_s);
        zchunk_extend (text, line, (size_t) n);
    }
    s_finish (call, s_output (call, text, false, ok->exit_code, ok->timed_out, &ok->stdout,
                              &ok->stderr, ok->stdout_next_offset, ok->stderr_next_offset,
                              ok->stdout_truncated, ok->stderr_truncated));
}

static void s_exec (s_call_t *call)
{
    const char *command, *cwd;
    json_int_t timeout;
    bool detached;
    if (s_arg_string (call, "command", &command, true) || s_arg_string (call, "cwd", &cwd, false) ||
        s_arg_bool (call, "detached", &detached, false) ||
        s_arg_int (call, "timeout", &timeout, S_EXEC_DEFAULT, 1, S_EXEC_MAX, false) ||
        s_arg_sandbox (call))
        return;
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_agent_exec_t *args = sbx_msg_agent_exec (inner);
    //  The session's env for this sandbox first, then the call's own.
    json_t *env = zhashx_lookup (call->state->env, call->sandbox_id);
    const char *k;
    json_t *v;
    json_object_foreach (env, k, v) sbx_strmap_set (&args->env, k, json_string_value (v));
    if (s_arg_map (call, "env", &args->env)) {
        sbx_msg_destroy (&inner);
        return;
    }
    sbx_str_set (&args->command, command);
    sbx_str_set (&args->cwd, cwd);
    args->detached = detached;
    call->timeout_s = (unsigned) timeout;
    args->timeout_ms = detached ? 0 : (uint64_t) timeout * 1000;
    args->max_bytes = S_OUTPUT_MAX;
    s_send_agent (call, &inner,
                  detached ? s_deadline (call) : (uint32_t) timeout * 1000 + S_MARGIN_MS,
                  s_on_exec);
}

static void s_on_status (s_call_t *call, sbx_msg_t *reply)
{
    sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
    s_state_use (call->state, call->sandbox_id);
    char line[200];
    int n = ok->running ? snprintf (line, sizeof line, "Process %llu is running.",
                                    (unsigned long long) ok->pid)
                        : snprintf (line, sizeof line, "Process %llu exited with code %lld.",
                                    (unsigned long long) ok->pid, (long long) ok->exit_code);
    zchunk_t *text = zchunk_new (line, (size_t) n);
    if (ok->timed_out)
        zchunk_extend (text, " It was killed when its timeout passed.", 39);
    json_t *result =
        s_output (call, text, ok->running, ok->exit_code, ok->timed_out, &ok->stdout, &ok->stderr,
                  ok->stdout_next_offset, ok->stderr_next_offset,
                  ok->stdout_truncated || ok->stdout_more, ok->stderr_truncated || ok->stderr_more);
    json_object_set_new (json_object_get (result, "structuredContent"), "running",
                         json_boolean (ok->running));
    s_finish (call, result);
}

static void s_status (s_call_t *call)
{
    json_int_t pid, out, err;
    if (s_arg_int (call, "processId", &pid, 0, 1, INT32_MAX, true) ||
        s_arg_int (call, "stdoutOffset", &out, 0, 0, INT64_MAX, false) ||
        s_arg_int (call, "stderrOffset", &err, 0, 0, INT64_MAX, false) || s_arg_sandbox (call))
        return;
    call->pid = (uint64_t) pid;
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (inner)->pid = (uint64_t) pid;
    sbx_msg_agent_status (inner)->stdout_offset = (uint64_t) out;
    sbx_msg_agent_status (inner)->stderr_offset = (uint64_t) err;
    sbx_msg_agent_status (inner)->max_bytes = S_OUTPUT_MAX;
    s_send_agent (call, &inner, s_deadline (call), s_on_status);
}

static void s_on_kill (s_call_t *call, sbx_msg_t *reply)
{
    (void) reply;
    s_state_use (call->state, call->sandbox_id);
    char text[300];
    const char *name = gw_broker_signal_name (call->signal);
    if (name)
        snprintf (text, sizeof text,
                  "Sent SIG%s to process %llu in %s. Call command_status for its exit code.", name,
                  (unsigned long long) call->pid, call->sandbox_id);
    else
        snprintf (text, sizeof text,
                  "Sent signal %d to process %llu in %s. Call command_status for its exit code.",
                  call->signal, (unsigned long long) call->pid, call->sandbox_id);
    s_finish (call, s_text_result (text,
                                   json_pack ("{s:I, s:i}", "processId", (json_int_t) call->pid,
                                              "signal", call->signal),
                                   false));
}

static void s_kill (s_call_t *call)
{
    json_int_t pid;
    if (s_arg_int (call, "processId", &pid, 0, 1, INT32_MAX, true))
        return;
    call->signal = gw_broker_signal_number (json_object_get (call->args, "signal"));
    if (call->signal < 0) {
        s_fail (call, SBX_E_INVALID_ARGUMENT,
                "signal is a name such as SIGTERM or SIGKILL, or a number from 1 to 64");
        return;
    }
    if (s_arg_sandbox (call))
        return;
    call->pid = (uint64_t) pid;
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_KILL);
    sbx_msg_agent_kill (inner)->pid = (uint64_t) pid;
    sbx_msg_agent_kill (inner)->signal = call->signal;
    s_send_agent (call, &inner, s_deadline (call), s_on_kill);
}

//  --------------------------------------------------------------------------
//  Files: 1 MiB per agent request, one after the other.

static void s_read_next (s_call_t *call);

static void s_on_read (s_call_t *call, sbx_msg_t *reply)
{
    sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok (reply);
    if (ok->size > S_READ_MAX || call->size + ok->data.size > S_READ_MAX) {
        s_fail (call, SBX_E_TOO_LARGE,
                "%s is %llu bytes; read_file returns at most %d MiB (use exec with head, tail or "
                "split for larger files)",
                json_string_value (json_object_get (call->args, "path")),
                (unsigned long long) ok->size, S_READ_MAX / (1024 * 1024));
        return;
    }
    if (ok->data.size) {
        uint8_t *grown = realloc (call->data, call->size + ok->data.size + 1);
        if (!grown) {
            s_fail (call, SBX_E_INTERNAL, "out of memory");
            return;
        }
        call->data = grown;
        memcpy (call->data + call->size, ok->data.data, ok->data.size);
        call->size += ok->data.size;
    }
    if (!ok->eof && ok->data.size > 0) {
        s_read_next (call);
        return;
    }
    s_state_use (call->state, call->sandbox_id);
    const char *path = json_string_value (json_object_get (call->args, "path"));
    json_t *content;
    if (call->base64) {
        char *b64 = s_base64 (call->data ? call->data : (uint8_t *) "", call->size);
        content = json_string (b64 ? b64 : "");
        free (b64);
    } else {
        content = json_stringn (call->data ? (char *) call->data : "", call->size);
        if (!content) {
            s_fail (call, SBX_E_INVALID_ARGUMENT,
                    "%s is not UTF-8 text; read it with encoding \"base64\"", path);
            return;
        }
    }
    json_t *structured =
        json_pack ("{s:s, s:o, s:s, s:I}", "path", path, "content", content, "encoding",
                   call->base64 ? "base64" : "utf-8", "size", (json_int_t) call->size);
    s_finish (call, s_text_result (json_string_value (json_object_get (structured, "content")),
                                   structured, false));
}

static void s_read_next (s_call_t *call)
{
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
    sbx_str_set (&sbx_msg_agent_file_read (inner)->path,
                 json_string_value (json_object_get (call->args, "path")));
    sbx_msg_agent_file_read (inner)->offset = call->size;
    sbx_msg_agent_file_read (inner)->length = S_CHUNK;
    s_send_agent (call, &inner, s_deadline (call), s_on_read);
}

static int s_arg_encoding (s_call_t *call)
{
    const char *encoding;
    if (s_arg_string (call, "encoding", &encoding, false))
        return -1;
    if (encoding && strcasecmp (encoding, "base64") == 0)
        call->base64 = true;
    else if (encoding && strcasecmp (encoding, "utf-8") != 0 &&
             strcasecmp (encoding, "utf8") != 0 && strcasecmp (encoding, "text") != 0) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "encoding is \"utf-8\" or \"base64\"");
        return -1;
    }
    return 0;
}

static void s_read (s_call_t *call)
{
    const char *path;
    if (s_arg_string (call, "path", &path, true) || s_arg_encoding (call) || s_arg_sandbox (call))
        return;
    s_read_next (call);
}

static void s_write_next (s_call_t *call);

static void s_on_write (s_call_t *call, sbx_msg_t *reply)
{
    (void) reply;
    if (call->done_bytes < call->size) {
        s_write_next (call);
        return;
    }
    s_state_use (call->state, call->sandbox_id);
    const char *path = json_string_value (json_object_get (call->args, "path"));
    char text[4300];
    snprintf (text, sizeof text, "Wrote %zu bytes to %s in %s.", call->size, path,
              call->sandbox_id);
    s_finish (
        call,
        s_text_result (
            text, json_pack ("{s:s, s:I}", "path", path, "size", (json_int_t) call->size), false));
}

static void s_write_next (s_call_t *call)
{
    size_t n = call->size - call->done_bytes;
    if (n > S_CHUNK)
        n = S_CHUNK;
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
    sbx_agent_file_write_t *args = sbx_msg_agent_file_write (inner);
    sbx_str_set (&args->path, json_string_value (json_object_get (call->args, "path")));
    sbx_bytes_set (&args->data, call->data + call->done_bytes, n);
    args->offset = call->done_bytes;
    args->truncate = call->done_bytes == 0;
    args->mode = call->done_bytes == 0 ? call->mode : 0;
    call->done_bytes += n;
    s_send_agent (call, &inner, s_deadline (call), s_on_write);
}

static void s_write (s_call_t *call)
{
    const char *path, *content;
    if (s_arg_string (call, "path", &path, true) ||
        s_arg_string (call, "content", &content, true) || s_arg_encoding (call))
        return;
    json_t *mode = json_object_get (call->args, "mode");
    if (json_is_integer (mode))
        call->mode = (uint64_t) json_integer_value (mode);
    else if (json_is_string (mode)) {
        char *end;
        call->mode = strtoull (json_string_value (mode), &end, 8);
        if (*end || end == json_string_value (mode))
            call->mode = UINT64_MAX;
    } else if (mode && !json_is_null (mode))
        call->mode = UINT64_MAX;
    if (call->mode > 07777) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, "mode is octal text such as \"0755\"");
        return;
    }
    if (call->base64) {
        call->data = *content ? sbx_secret_base64_decode (content, &call->size) : calloc (1, 1);
        if (!call->data) {
            s_fail (call, SBX_E_INVALID_ARGUMENT, "content is not valid base64");
            return;
        }
    } else {
        call->size = json_string_length (json_object_get (call->args, "content"));
        call->data = malloc (call->size + 1);
        memcpy (call->data, content, call->size);
    }
    if (s_arg_sandbox (call))
        return;
    s_write_next (call);
}

//  --------------------------------------------------------------------------
//  The tools: defined by sbx_ops_gen (schemas/operations.json), dispatched here

gw_tools_t *gw_tools_new (gw_ctx_t *ctx)
{
    gw_tools_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = ctx->config;
    self->next_serial = 1;
    json_error_t error;
    self->list = json_loads (sbx_ops_tools_json, 0, &error);
    if (!self->list)
        sbx_error ("tool definitions: %s at %d", error.text, error.position);
    self->broker = ctx->broker;
    self->cache = ctx->cache;
    self->calls = sbx_idmap_new ();
    if (!self->list || !self->broker || !self->calls) {
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
            gw_broker_cancel (self->broker, call->handle);
            s_call_free (call);
        }
        zhashx_destroy (&self->calls);
    }
    json_decref (self->list);
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

void gw_tools_call (gw_tools_t *self, const sbx_caller_t *caller, gw_tools_state_t *state,
                    const char *name, json_t *arguments, gw_tools_done_fn *done, void *arg)
{
    sbx_op_t op;
    char message[300];
    if (sbx_ops_tool (name, &op)) {
        snprintf (message, sizeof message, "Unknown tool: %.200s", name ? name : "(none)");
        done (NULL, -32602, message, arg);
        return;
    }
    if (arguments && !json_is_object (arguments)) {
        done (NULL, -32602, "arguments must be an object", arg);
        return;
    }
    s_call_t *call = calloc (1, sizeof *call);
    if (!call) {
        done (NULL, -32603, "out of memory", arg);
        return;
    }
    call->tools = self;
    call->op = op;
    call->name = strdup (name);
    call->caller = gw_auth_caller_dup (caller);
    call->state = gw_tools_state_ref (state);
    call->args = arguments ? json_incref (arguments) : json_object ();
    call->done = done;
    call->arg = arg;
    //  The broker decides too; refusing here spares it the request and says why plainly.
    if (caller && caller->preset == SBX_KEY_PRESET_READ_ONLY && !sbx_ops[op].read_only) {
        s_fail (call, SBX_E_PERMISSION_DENIED, "this key is read-only: it cannot use %s", name);
        return;
    }
    switch (op) {
    case SBX_OP_CREATE_SANDBOX:
        s_create (call);
        break;
    case SBX_OP_LIST_SANDBOXES: {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        s_send (call, &request, s_deadline (call), s_on_list);
        break;
    }
    case SBX_OP_GET_SANDBOX: {
        if (s_arg_sandbox (call))
            break;
        //  The same sandbox and figures as last time: the same result, made once.
        json_t *kept =
            self->cache ? gw_cache_result (self->cache, call->caller, call->sandbox_id) : NULL;
        if (kept) {
            s_state_use (call->state, call->sandbox_id);
            s_finish (call, kept);
            break;
        }
        call->tick = self->cache ? gw_cache_tick (self->cache) : 0;
        s_simple (call, SBX_MSG_SANDBOX_GET);
        break;
    }
    case SBX_OP_STOP_SANDBOX:
        if (s_arg_sandbox (call) == 0)
            s_simple (call, SBX_MSG_SANDBOX_STOP);
        break;
    case SBX_OP_RESUME_SANDBOX:
        if (s_arg_sandbox (call) == 0)
            s_simple (call, SBX_MSG_SANDBOX_RESUME);
        break;
    case SBX_OP_DELETE_SANDBOX: {
        //  Never the default: a model must name exactly what it deletes.
        const char *id;
        if (s_arg_string (call, "sandboxId", &id, false))
            break;
        if (!id || !*id) {
            s_finish (call, s_text_result ("sandboxId is required: the exact id (sb_…) of one "
                                           "sandbox; delete_sandbox has no default",
                                           NULL, true));
            break;
        }
        call->sandbox_id = strdup (id);
        s_simple (call, SBX_MSG_SANDBOX_DELETE);
        break;
    }
    case SBX_OP_EXEC:
        s_exec (call);
        break;
    case SBX_OP_COMMAND_STATUS:
        s_status (call);
        break;
    case SBX_OP_KILL_COMMAND:
        s_kill (call);
        break;
    case SBX_OP_READ_FILE:
        s_read (call);
        break;
    case SBX_OP_WRITE_FILE:
        s_write (call);
        break;
    case SBX_OP_EXTEND_SANDBOX:
        s_extend (call);
        break;
    case SBX_OP_SAVE_SNAPSHOT:
        s_save_snapshot (call);
        break;
    case SBX_OP_LIST_SNAPSHOTS: {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
        s_send (call, &request, s_deadline (call), s_on_snapshot_list);
        break;
    }
    case SBX_OP_DELETE_SNAPSHOT:
        s_delete_snapshot (call);
        break;
    case SBX_OP_RENAME_SANDBOX:
    case SBX_OP_LABEL_SANDBOX:
        s_update (call, op == SBX_OP_LABEL_SANDBOX);
        break;
    case SBX_OP_HOST_PORT:
        s_port (call);
        break;
    case SBX_OP_UNPUBLISH_PORT: //  REST only: sbx_ops_tool never names these
    case SBX_OP_UPDATE_SANDBOX:
    case SBX_OP_GET_SNAPSHOT:
    case SBX_OP_GET_USAGE:
    case SBX_OP_LIST_KEYS:
    case SBX_OP_REVOKE_KEY:
    case SBX_OP_GET_OPENAPI:
        s_fail (call, SBX_E_UNAVAILABLE, "%s is not available yet on this server", name);
        break;
    }
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
    static const char *names[] = {
        "create_sandbox", "list_sandboxes", "get_sandbox",    "exec",          "command_status",
        "kill_command",   "read_file",      "write_file",     "host_port",     "stop_sandbox",
        "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox", "delete_sandbox",
        "save_snapshot",  "list_snapshots", "delete_snapshot"};
    static const char *read_only[] = {"list_sandboxes", "get_sandbox", "command_status",
                                      "read_file", "list_snapshots"};
    static const char *destructive[] = {"exec", "kill_command", "write_file", "delete_sandbox",
                                        "delete_snapshot"};
    assert (json_array_size (list) == 18);
    for (size_t i = 0; i < 18; i++) {
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
                json_object_get (json_object_get (in, "properties"), "sandboxId"));
        json_t *annotations = json_object_get (tool, "annotations");
        bool ro = false, destroys = false;
        for (size_t k = 0; k < 5; k++) {
            ro |= streq (name, read_only[k]);
            destroys |= streq (name, destructive[k]);
        }
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
    assert (streq (json_string_value (json_array_get (
                       json_object_get (json_object_get (json_array_get (list, 14), "inputSchema"),
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

    //  Helpers (the shared ones are tested in gw_broker).
    char *b64 = s_base64 ((const uint8_t *) "hello", 5);
    assert (streq (b64, "aGVsbG8="));
    free (b64);

    gw_tools_state_unref (&state);
    gw_tools_destroy (&tools);
    gw_ctx_destroy (&ctx);
}
