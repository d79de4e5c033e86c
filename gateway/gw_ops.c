/*  gw_ops - see gw_ops.h */
#include "gw_ops.h"
#include "sbx_metrics.h"
#include "sbx_args.h"
#include "sbx_idmap.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <assert.h>
#include <signal.h>

#define S_USAGE_MS 30000 //  billing's figures for get_sandbox and list_sandboxes
#define S_KILL_MS  10000 //  an abandoned exec's kill

struct gw_ops_t {
    sbx_api_t *api;
    gw_broker_t *broker;
    gw_cache_t *cache;
    gw_auth_t *auth;
    zhashx_t *calls; //  serial → s_call_t
    uint64_t next_serial;
    char *instance; //  names this gateway's foreground execs (their tags): unique per run
};

typedef struct s_call_t s_call_t;

//  A file chunk in flight: its broker request and its offset in the file.
typedef struct {
    s_call_t *call;
    uint64_t handle; //  0: the slot is free
    uint64_t offset;
} s_chunk_t;

struct s_call_t {
    gw_ops_t *ops;
    uint64_t serial;
    uint64_t handle; //  the broker request in flight
    sbx_op_t op;
    sbx_caller_t *caller;
    json_t *args;
    char *tag;                         //  a foreground exec's, for agent.kill when abandoned
    sbx_xfer_t *xfer;                  //  read_file, write_file
    s_chunk_t chunks[SBX_XFER_WINDOW]; //  its chunks in flight
    json_t *answer;                    //  made, waiting for billing's figures
    sbx_msg_t *reply;                  //  what it was made from, meanwhile
    uint64_t tick;                     //  get_sandbox: the read copy's drops when it began
    uint32_t deadline;                 //  each file chunk's
    uint64_t started_mono;
    gw_ops_read_fn *on_read; //  gw_ops_follow_read
    void *on_read_arg;
    gw_ops_done_fn *done;
    void *arg;
};

gw_ops_t *gw_ops_new (sbx_api_t *api, gw_broker_t *broker, gw_cache_t *cache, gw_auth_t *auth)
{
    assert (api && broker);
    gw_ops_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->api = api;
    self->broker = broker;
    self->cache = cache;
    self->auth = auth;
    self->next_serial = 1;
    self->calls = sbx_idmap_new ();
    self->instance = sbx_secret_token ("gw", 12);
    if (!self->calls || !self->instance)
        gw_ops_destroy (&self);
    return self;
}

//  Forgets the call's requests in flight (their answers will be dropped).
static void s_call_cancel (s_call_t *call)
{
    gw_broker_cancel (call->ops->broker, call->handle);
    call->handle = 0;
    for (int i = 0; i < SBX_XFER_WINDOW; i++) {
        gw_broker_cancel (call->ops->broker, call->chunks[i].handle);
        call->chunks[i].handle = 0;
    }
}

static void s_call_free (s_call_t *call)
{
    gw_auth_caller_destroy (&call->caller);
    json_decref (call->args);
    free (call->tag);
    sbx_xfer_destroy (&call->xfer);
    json_decref (call->answer);
    sbx_msg_destroy (&call->reply);
    free (call);
}

void gw_ops_destroy (gw_ops_t **self_p)
{
    assert (self_p);
    gw_ops_t *self = *self_p;
    if (!self)
        return;
    if (self->calls) {
        for (s_call_t *call = zhashx_first (self->calls); call; call = zhashx_next (self->calls)) {
            s_call_cancel (call);
            s_call_free (call);
        }
        zhashx_destroy (&self->calls);
    }
    free (self->instance);
    free (self);
    *self_p = NULL;
}

void gw_ops_cancel (gw_ops_t *self, uint64_t handle)
{
    s_call_t *call = handle ? zhashx_lookup (self->calls, (void *) (uintptr_t) handle) : NULL;
    if (!call)
        return;
    zhashx_delete (self->calls, (void *) (uintptr_t) handle);
    s_call_cancel (call);
    s_call_free (call);
}

static void s_on_killed (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    char *tag = arg;
    if (reply)
        sbx_info ("exec %s abandoned by its client: process %llu killed", tag,
                  (unsigned long long) (reply->type == SBX_MSG_AGENT_KILL_OK
                                            ? sbx_msg_agent_kill_ok (reply)->pid
                                            : 0));
    else //  it ended meanwhile (not_found), or the sandbox is gone
        sbx_info ("exec %s abandoned by its client: not killed: %s (%s)", tag,
                  message ? message : "", sbx_code_name (code));
    free (tag);
}

void gw_ops_abandon (gw_ops_t *self, uint64_t handle)
{
    s_call_t *call = handle ? zhashx_lookup (self->calls, (void *) (uintptr_t) handle) : NULL;
    const char *sandbox_id = call ? sbx_api_sandbox_id (call->args) : NULL;
    if (call && call->tag && sandbox_id) {
        sbx_msg_t *kill = sbx_msg_new (SBX_MSG_AGENT_KILL);
        if (kill) {
            sbx_str_set (&sbx_msg_agent_kill (kill)->tag, call->tag);
            sbx_msg_agent_kill (kill)->signal = SIGKILL;
            //  Its own request: the call is forgotten below, the kill goes on alone.
            char *tag = strdup (call->tag);
            if (tag)
                gw_broker_send_agent (self->broker, call->caller, sandbox_id, &kill, S_KILL_MS,
                                      s_on_killed, tag);
        }
        sbx_msg_destroy (&kill);
    }
    gw_ops_cancel (self, handle);
}

//  An operation answered: sbx_operations_total by code, and how long it took.
static void s_measure (sbx_op_t op, sbx_code_t code, uint64_t started_mono)
{
    sbx_metrics_t *metrics = sbx_metrics_here ();
    sbx_metrics_add (metrics, SBX_METRIC_OPERATIONS_TOTAL, 1, sbx_ops[op].name,
                     code == SBX_OK ? "ok" : sbx_code_name (code));
    sbx_metrics_observe (metrics, SBX_METRIC_OPERATION_SECONDS,
                         (double) (sbx_clock_mono_ms () - started_mono) / 1000.0, sbx_ops[op].name);
}

//  Ends the call: done once, then the call is gone.
static void s_end (s_call_t *call, const gw_ops_result_t *result)
{
    s_measure (call->op, result->code, call->started_mono);
    zhashx_delete (call->ops->calls, (void *) (uintptr_t) call->serial);
    call->done (result, call->arg);
    s_call_free (call);
}

static void s_fail (s_call_t *call, sbx_code_t code, const char *message)
{
    gw_ops_result_t result = {.code = code, .message = message ? message : sbx_code_name (code)};
    s_end (call, &result);
}

static void s_succeed (s_call_t *call, json_t *answer, const sbx_msg_t *reply)
{
    gw_ops_result_t result = {.code = SBX_OK, .answer = answer, .reply = reply};
    uint8_t *read = NULL; //  what was read, held here so that done may take it
    if (call->xfer && call->op == SBX_OP_READ_FILE) {
        read = sbx_xfer_take_data (call->xfer, &result.size);
        result.data = read ? read : (const uint8_t *) "";
        result.take = &read;
    } else if (call->xfer) {
        result.data = sbx_xfer_data (call->xfer);
        result.size = sbx_xfer_size (call->xfer);
    }
    s_end (call, &result);
    free (read);
}

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg);

//  Sends a request for the call (taken): to the broker, or to the guest when agent.
static void s_send (s_call_t *call, sbx_msg_t **request_p, bool agent, uint32_t deadline_ms)
{
    gw_ops_t *self = call->ops;
    const char *sandbox_id = sbx_api_sandbox_id (call->args);
    call->handle = 0;
    if (agent)
        GW_KEEP (call->handle, gw_broker_send_agent (self->broker, call->caller, sandbox_id,
                                                     request_p, deadline_ms, s_on_answer, call));
    else
        GW_KEEP (call->handle, gw_broker_send (self->broker, call->caller, request_p, deadline_ms,
                                               s_on_answer, call));
}

static void s_on_chunk (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg);

static void s_on_cut (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    char *path = arg;
    if (!reply)
        sbx_info ("write of %s failed, and cutting it back to what was written without a gap "
                  "failed too: %s (%s)",
                  path, message ? message : "", sbx_code_name (code));
    free (path);
}

//  A file call failed: the chunks still in flight forgotten, a write cut back to what it
//  wrote without a gap (sbx_xfer_cut: its own request, after them on the same path).
static void s_file_fail (s_call_t *call, sbx_code_t code, const char *message)
{
    s_call_cancel (call);
    sbx_msg_t *cut = sbx_xfer_cut (call->xfer);
    const char *sandbox_id = sbx_api_sandbox_id (call->args);
    char *path = cut ? strdup (sbx_xfer_path (call->xfer)) : NULL;
    if (cut && path && sandbox_id)
        gw_broker_send_agent (call->ops->broker, call->caller, sandbox_id, &cut, call->deadline,
                              s_on_cut, path);
    else
        free (path);
    sbx_msg_destroy (&cut);
    s_fail (call, code, message);
}

//  Sends every chunk that may go now (up to SBX_XFER_WINDOW in flight); ends the call
//  once all are answered.
static void s_file_step (s_call_t *call)
{
    for (int i = 0; i < SBX_XFER_WINDOW; i++) {
        s_chunk_t *slot = &call->chunks[i];
        if (slot->handle)
            continue;
        uint64_t offset;
        sbx_msg_t *chunk = sbx_xfer_next (call->xfer, &offset);
        if (!chunk)
            break;
        slot->call = call;
        slot->offset = offset;
        //  A send that fails answers at once (s_on_chunk, with the call failed and freed).
        uint64_t serial = call->serial;
        gw_ops_t *ops = call->ops;
        uint64_t handle =
            gw_broker_send_agent (ops->broker, call->caller, sbx_api_sandbox_id (call->args),
                                  &chunk, call->deadline, s_on_chunk, slot);
        if (!zhashx_lookup (ops->calls, (void *) (uintptr_t) serial))
            return;
        slot->handle = handle;
    }
    if (!sbx_xfer_done (call->xfer))
        return;
    json_t *answer = json_pack ("{s:s, s:I}", "path", sbx_xfer_path (call->xfer), "size",
                                (json_int_t) sbx_xfer_size (call->xfer));
    s_succeed (call, answer, NULL);
    //  s_succeed freed the call; answer was borrowed by done.
    json_decref (answer);
}

static void s_on_chunk (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_chunk_t *slot = arg;
    s_call_t *call = slot->call;
    slot->handle = 0;
    char why[400];
    if (!reply)
        s_file_fail (call, code, message);
    else if (sbx_xfer_take (call->xfer, slot->offset, reply, &code, why, sizeof why))
        s_file_fail (call, code, why);
    else {
        if (call->on_read)
            call->on_read (call->xfer, call->on_read_arg);
        s_file_step (call);
    }
}

void gw_ops_follow_read (gw_ops_t *self, uint64_t handle, gw_ops_read_fn *fn, void *arg)
{
    s_call_t *call = handle ? zhashx_lookup (self->calls, (void *) (uintptr_t) handle) : NULL;
    if (call && call->op == SBX_OP_READ_FILE) {
        call->on_read = fn;
        call->on_read_arg = arg;
    }
}

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_call_t *call = arg;
    call->handle = 0;
    gw_ops_t *self = call->ops;
    char why[400];
    if (call->answer) {
        //  Billing's figures, when it answered: the sandbox goes out either way.
        sbx_api_add_usage (call->answer, reply);
        const char *id = sbx_api_sandbox_id (call->args);
        if (reply && self->cache && call->op == SBX_OP_GET_SANDBOX && id)
            gw_cache_keep_result (self->cache, call->caller, id, call->tick, call->answer);
        json_t *answer = json_incref (call->answer);
        sbx_msg_t *made_from = call->reply;
        call->reply = NULL;
        s_succeed (call, answer, made_from);
        json_decref (answer);
        sbx_msg_destroy (&made_from);
        return;
    }
    if (!reply) {
        s_fail (call, code, message);
        return;
    }
    json_t *answer = sbx_api_answer (self->api, call->op, call->args, reply, why, sizeof why);
    if (!answer) {
        s_fail (call, SBX_E_INTERNAL, why);
        return;
    }
    //  Revoked: refused here from the next request on, whether or not the client waits.
    if (reply->type == SBX_MSG_KEY_REVOKE_OK && self->auth)
        gw_auth_forget_key (self->auth, sbx_msg_key_revoke_ok (reply)->key_id);
    if (sbx_api_wants_usage (call->op) && call->caller && call->caller->account_id &&
        (call->op != SBX_OP_LIST_SANDBOXES ||
         json_array_size (json_object_get (answer, "sandboxes")))) {
        sbx_msg_t *usage = sbx_msg_new (SBX_MSG_USAGE_GET);
        sbx_str_set (&sbx_msg_usage_get (usage)->account, call->caller->account_id);
        if (call->op == SBX_OP_GET_SANDBOX)
            sbx_strlist_append (&sbx_msg_usage_get (usage)->sandbox_ids,
                                sbx_api_sandbox_id (call->args));
        else {
            //  The page's sandboxes only (or the one asked for), from billing's running
            //  totals: a get or a list costs its size, not the sandboxes' history.
            size_t i;
            json_t *item;
            json_array_foreach (json_object_get (answer, "sandboxes"), i, item)
            {
                const char *id = json_string_value (json_object_get (item, "id"));
                if (id)
                    sbx_strlist_append (&sbx_msg_usage_get (usage)->sandbox_ids, id);
            }
        }
        call->answer = answer;
        call->reply = sbx_msg_dup (reply);
        s_send (call, &usage, false, S_USAGE_MS);
        return;
    }
    s_succeed (call, answer, reply);
    json_decref (answer);
}

//  gw_ops_call, with write_file's bytes either data (copied) or *take (taken).
static uint64_t s_call (gw_ops_t *self, sbx_op_t op, unsigned surface, const sbx_caller_t *caller,
                        json_t *args, const void *data, uint8_t **take, size_t size,
                        gw_ops_done_fn *done, void *arg)
{
    assert (self && done);
    char why[400];
    gw_ops_result_t refused = {.code = SBX_E_INVALID_ARGUMENT, .message = why};
    if (sbx_args_check (op, surface, args, why, sizeof why)) {
        s_measure (op, refused.code, sbx_clock_mono_ms ());
        done (&refused, arg);
        return 0;
    }
    const char *id = sbx_api_sandbox_id (args);
    uint64_t tick = 0;
    if (op == SBX_OP_GET_SANDBOX && self->cache && id) {
        //  The same sandbox and figures as last time: the same answer, made once (the
        //  hot path of an agent polling its sandbox: nothing else is made for it).
        json_t *kept = gw_cache_result (self->cache, caller, id);
        if (kept) {
            s_measure (op, SBX_OK, sbx_clock_mono_ms ());
            gw_ops_result_t result = {.code = SBX_OK, .answer = kept};
            done (&result, arg);
            json_decref (kept);
            return 0;
        }
        tick = gw_cache_tick (self->cache);
    }
    s_call_t *call = calloc (1, sizeof *call);
    if (!call) {
        gw_ops_result_t result = {.code = SBX_E_INTERNAL, .message = "out of memory"};
        done (&result, arg);
        return 0;
    }
    call->ops = self;
    call->serial = self->next_serial++;
    call->op = op;
    call->caller = caller ? gw_auth_caller_dup (caller) : NULL;
    call->args = args ? json_incref (args) : json_object ();
    call->tick = tick;
    call->started_mono = sbx_clock_mono_ms ();
    call->done = done;
    call->arg = arg;
    uint64_t serial = call->serial;
    zhashx_insert (self->calls, (void *) (uintptr_t) serial, call);
    if (op == SBX_OP_READ_FILE || op == SBX_OP_WRITE_FILE) {
        const char *path = sbx_args_string (op, call->args, "path");
        if (op == SBX_OP_READ_FILE)
            call->xfer = sbx_xfer_new_read (path);
        else {
            const char *mode = sbx_args_string (op, call->args, "mode");
            if (size > SBX_XFER_MAX) {
                snprintf (why, sizeof why, "the file is %zu bytes; write_file takes at most %d MiB",
                          size, SBX_XFER_MAX / (1024 * 1024));
                s_fail (call, SBX_E_TOO_LARGE, why);
                return 0;
            }
            uint64_t bits = mode ? strtoull (mode, NULL, 8) : 0;
            call->xfer = take ? sbx_xfer_new_write_take (path, take, size, bits)
                              : sbx_xfer_new_write (path, data, size, bits);
        }
        if (!call->xfer) {
            s_fail (call, SBX_E_INTERNAL, "out of memory");
            return 0;
        }
        call->deadline = sbx_ops[op].deadline_ms;
        s_file_step (call);
        return zhashx_lookup (self->calls, (void *) (uintptr_t) serial) ? serial : 0;
    }
    bool agent;
    uint32_t deadline;
    sbx_msg_t *request = sbx_api_request (op, call->args, caller ? caller->account_id : NULL,
                                          &agent, &deadline, why, sizeof why);
    if (!request) {
        s_fail (call, SBX_E_INVALID_ARGUMENT, why);
        return 0;
    }
    if (op == SBX_OP_EXEC && !sbx_args_bool (op, call->args, "detached")) {
        //  Named, so that it can be killed before its pid is known (gw_ops_abandon).
        call->tag = zsys_sprintf ("%s-%llu", self->instance, (unsigned long long) serial);
        sbx_str_set (&sbx_msg_agent_exec (request)->tag, call->tag);
    }
    s_send (call, &request, agent, deadline);
    return zhashx_lookup (self->calls, (void *) (uintptr_t) serial) ? serial : 0;
}

uint64_t gw_ops_call (gw_ops_t *self, sbx_op_t op, unsigned surface, const sbx_caller_t *caller,
                      json_t *args, const void *data, size_t size, gw_ops_done_fn *done, void *arg)
{
    return s_call (self, op, surface, caller, args, data, NULL, size, done, arg);
}

uint64_t gw_ops_call_take (gw_ops_t *self, sbx_op_t op, unsigned surface,
                           const sbx_caller_t *caller, json_t *args, uint8_t **data_p, size_t size,
                           gw_ops_done_fn *done, void *arg)
{
    assert (data_p);
    return s_call (self, op, surface, caller, args, *data_p, data_p, size, done, arg);
}

//  --------------------------------------------------------------------------
//  Self test: what needs no broker (refusals; without a peer every request fails
//  unavailable, at once).

typedef struct {
    sbx_code_t code;
    char message[400];
    int calls;
} s_probe_t;

static void s_probe (const gw_ops_result_t *result, void *arg)
{
    s_probe_t *probe = arg;
    probe->code = result->code;
    snprintf (probe->message, sizeof probe->message, "%s", result->message ? result->message : "");
    probe->calls++;
}

void gw_ops_test (bool verbose)
{
    (void) verbose;
    sbx_api_t *api = sbx_api_new (NULL);
    gw_broker_t *broker = gw_broker_new (NULL);
    gw_ops_t *ops = gw_ops_new (api, broker, NULL, NULL);
    assert (ops);
    s_probe_t probe = {0};
    json_t *args = json_pack ("{s:i}", "ttlSeconds", 5);
    //  The same limits whichever door: refused before any request.
    for (unsigned surface = SBX_OPS_MCP; surface <= SBX_OPS_REST; surface++) {
        assert (gw_ops_call (ops, SBX_OP_CREATE_SANDBOX, surface, NULL, args, NULL, 0, s_probe,
                             &probe) == 0);
        assert (probe.code == SBX_E_INVALID_ARGUMENT);
        assert (streq (probe.message, "ttlSeconds must be between 60 and 2592000"));
    }
    json_decref (args);
    //  Beyond the schema: an unknown signal.
    args = json_pack ("{s:s, s:i, s:s}", "sandboxId", "sb_0123456789", "processId", 3, "signal",
                      "NOPE");
    gw_ops_call (ops, SBX_OP_KILL_COMMAND, SBX_OPS_REST, NULL, args, NULL, 0, s_probe, &probe);
    assert (probe.calls == 3 && strstr (probe.message, "signal is a name"));
    json_decref (args);
    //  No broker: unavailable, answered at once, for requests and file chunks alike.
    args = json_pack ("{s:s}", "sandboxId", "sb_0123456789");
    gw_ops_call (ops, SBX_OP_GET_SANDBOX, SBX_OPS_REST, NULL, args, NULL, 0, s_probe, &probe);
    assert (probe.calls == 4 && probe.code == SBX_E_UNAVAILABLE);
    json_object_set_new (args, "path", json_string ("/root/a"));
    gw_ops_call (ops, SBX_OP_WRITE_FILE, SBX_OPS_REST, NULL, args, "abc", 3, s_probe, &probe);
    assert (probe.calls == 5 && probe.code == SBX_E_UNAVAILABLE);
    gw_ops_call (ops, SBX_OP_READ_FILE, SBX_OPS_REST, NULL, args, NULL, 0, s_probe, &probe);
    assert (probe.calls == 6 && probe.code == SBX_E_UNAVAILABLE);
    json_decref (args);
    gw_ops_cancel (ops, 0);
    gw_ops_cancel (ops, 12345);
    gw_ops_destroy (&ops);
    gw_broker_destroy (&broker);
    sbx_api_destroy (&api);
    assert (!ops);
}
