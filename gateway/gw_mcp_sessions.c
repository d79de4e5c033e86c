/*  gw_mcp_sessions - see gw_mcp_sessions.h */
#include "gw_mcp_sessions.h"
#include "gw_auth.h"
#include "gw_broker.h"
#include "sbx_clock.h"
#include "sbx_idmap.h"
#include "sbx_tapreader.h"

#include <assert.h>

#define S_TIMEOUT_MS 10000
#define S_COPIES_MAX 100000
#define S_IDLE_MS    (3600 * 1000ULL) //  a copy unused this long goes when room is needed

typedef struct {
    char *account_id;
    gw_tools_state_t *state;
    uint64_t used_mono;
} s_copy_t;

struct gw_mcp_sessions_t {
    sbx_peer_t *peer;
    gw_broker_t *broker; //  borrowed
    zhashx_t *ops;       //  serial → s_op_t in flight
    uint64_t next_serial;
    sbx_tapreader_t *reader; //  mcp.session.changed
    zhashx_t *copies;        //  id → s_copy_t
    bool welcomed;
};

//  One request in flight.
typedef struct {
    gw_mcp_sessions_t *self;
    uint64_t serial;
    uint64_t handle; //  the broker request in flight
    sbx_caller_t *caller;
    char *id;
    gw_tools_state_t *state; //  sync: the state whose changes go out
    gw_mcp_sessions_fn *fn;
    void *arg;
} s_op_t;

static void s_copy_free (void **item)
{
    s_copy_t *copy = *item;
    if (copy) {
        free (copy->account_id);
        gw_tools_state_unref (&copy->state);
        free (copy);
    }
    *item = NULL;
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    gw_mcp_sessions_t *self = arg;
    if (event->type && event->subject && streq (event->type, "mcp.session.changed"))
        zhashx_delete (self->copies, event->subject);
    return 0;
}

static void s_op_free (s_op_t **op_p);

gw_mcp_sessions_t *gw_mcp_sessions_new (sbx_config_t *config, sbx_peer_t *peer, gw_broker_t *broker)
{
    gw_mcp_sessions_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->broker = broker;
    self->ops = sbx_idmap_new ();
    self->next_serial = 1;
    self->copies = zhashx_new ();
    if (peer)
        self->reader = sbx_tapreader_new (config, peer, SBX_TAPREADER_NOW, s_on_event, self);
    if (!self->broker || !self->ops || !self->copies || (peer && !self->reader)) {
        gw_mcp_sessions_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->copies, s_copy_free);
    return self;
}

void gw_mcp_sessions_destroy (gw_mcp_sessions_t **self_p)
{
    assert (self_p);
    gw_mcp_sessions_t *self = *self_p;
    if (!self)
        return;
    //  Requests in flight are cancelled: their callbacks would use what follows.
    if (self->ops) {
        for (s_op_t *op = zhashx_first (self->ops); op; op = zhashx_next (self->ops)) {
            gw_broker_cancel (self->broker, op->handle);
            s_op_free (&op);
        }
        zhashx_destroy (&self->ops);
    }
    sbx_tapreader_destroy (&self->reader);
    zhashx_destroy (&self->copies);
    free (self);
    *self_p = NULL;
}

int gw_mcp_sessions_start (gw_mcp_sessions_t *self, zloop_t *loop)
{
    assert (self);
    return self->reader ? sbx_tapreader_start (self->reader, loop) : 0;
}

//  Copies may answer only while no change can have gone unseen (see gw_auth).
static bool s_trusted (gw_mcp_sessions_t *self)
{
    if (!self->reader)
        return true; //  self-tests
    bool welcomed = sbx_peer_welcomed (self->peer);
    if (welcomed != self->welcomed) {
        zhashx_purge (self->copies);
        self->welcomed = welcomed;
    }
    return welcomed && sbx_tapreader_caught_up (self->reader);
}

gw_tools_state_t *gw_mcp_sessions_find (gw_mcp_sessions_t *self, const char *id,
                                        const char *account_id)
{
    assert (self);
    if (!id || !s_trusted (self))
        return NULL;
    s_copy_t *copy = zhashx_lookup (self->copies, id);
    if (!copy || !account_id || !streq (copy->account_id, account_id))
        return NULL;
    copy->used_mono = sbx_clock_mono_ms ();
    return copy->state;
}

size_t gw_mcp_sessions_size (gw_mcp_sessions_t *self)
{
    return self ? zhashx_size (self->copies) : 0;
}

//  Room for one more copy: those idle for an hour go; if none is, any one.
static void s_make_room (gw_mcp_sessions_t *self)
{
    if (zhashx_size (self->copies) < S_COPIES_MAX)
        return;
    uint64_t now = sbx_clock_mono_ms ();
    zlistx_t *old = zlistx_new ();
    for (s_copy_t *copy = zhashx_first (self->copies); copy && old;
         copy = zhashx_next (self->copies))
        if (now - copy->used_mono > S_IDLE_MS)
            zlistx_add_end (old, (void *) zhashx_cursor (self->copies));
    if (old && zlistx_size (old) == 0 && zhashx_first (self->copies))
        zlistx_add_end (old, (void *) zhashx_cursor (self->copies));
    for (const char *id = old ? zlistx_first (old) : NULL; id; id = zlistx_next (old))
        zhashx_delete (self->copies, id);
    zlistx_destroy (&old);
}

//  The copy of what the broker answered (replacing any), or NULL.
static s_copy_t *s_keep (gw_mcp_sessions_t *self, const sbx_mcp_session_t *session)
{
    s_copy_t *copy = calloc (1, sizeof *copy);
    if (!copy)
        return NULL;
    copy->account_id = strdup (session->account_id);
    copy->state = gw_tools_state_new ();
    copy->used_mono = sbx_clock_mono_ms ();
    if (!copy->account_id || !copy->state) {
        void *item = copy;
        s_copy_free (&item);
        return NULL;
    }
    gw_tools_state_set_default (copy->state, session->sandbox_id);
    for (size_t i = 0; i < session->envs.count; i++) {
        const sbx_mcp_env_t *item = &session->envs.items[i];
        json_t *env = json_object ();
        for (size_t k = 0; env && k < item->env.count; k++)
            json_object_set_new (env, item->env.keys[k], json_string (item->env.values[k]));
        gw_tools_state_set_env (copy->state, item->sandbox_id, env);
        json_decref (env);
    }
    zhashx_delete (self->copies, session->id);
    s_make_room (self);
    zhashx_insert (self->copies, session->id, copy);
    return copy;
}

static s_op_t *s_op_new (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                         gw_mcp_sessions_fn *fn, void *arg)
{
    s_op_t *op = calloc (1, sizeof *op);
    if (!op)
        return NULL;
    op->self = self;
    op->serial = self->next_serial++;
    op->caller = gw_auth_caller_dup (caller);
    op->id = id ? strdup (id) : NULL;
    op->fn = fn;
    op->arg = arg;
    if (!op->caller || (id && !op->id)) {
        gw_auth_caller_destroy (&op->caller);
        free (op->id);
        free (op);
        return NULL;
    }
    zhashx_insert (self->ops, SBX_ID (op->serial), op);
    return op;
}

static void s_op_free (s_op_t **op_p)
{
    s_op_t *op = *op_p;
    gw_auth_caller_destroy (&op->caller);
    gw_tools_state_unref (&op->state);
    free (op->id);
    free (op);
    *op_p = NULL;
}

//  An op that never went out: dropped without its callback.
static void s_op_forget (s_op_t **op_p)
{
    if (*op_p) {
        zhashx_delete ((*op_p)->self->ops, SBX_ID ((*op_p)->serial));
        s_op_free (op_p);
    }
}

static void s_op_done (s_op_t **op_p, gw_tools_state_t *state, sbx_code_t code, const char *message)
{
    s_op_t *op = *op_p;
    zhashx_delete (op->self->ops, SBX_ID (op->serial));
    op->fn (state, op->id, code, message, op->arg);
    s_op_free (op_p);
}

//  open, get and use answer the session: kept as the copy, handed to fn.
static void s_on_session (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_op_t *op = arg;
    sbx_mcp_session_t *session =
        !reply                                       ? NULL
        : reply->type == SBX_MSG_MCP_SESSION_OPEN_OK ? sbx_msg_mcp_session_open_ok (reply)->session
        : reply->type == SBX_MSG_MCP_SESSION_GET_OK  ? sbx_msg_mcp_session_get_ok (reply)->session
                                                     : NULL;
    if (!session) {
        s_op_done (&op, NULL, reply ? SBX_E_INTERNAL : code, reply ? "unexpected answer" : message);
        return;
    }
    if (!op->id)
        op->id = strdup (session->id);
    s_copy_t *copy = s_keep (op->self, session);
    if (!copy) {
        s_op_done (&op, NULL, SBX_E_INTERNAL, "out of memory");
        return;
    }
    s_op_done (&op, copy->state, SBX_OK, NULL);
}

void gw_mcp_sessions_open (gw_mcp_sessions_t *self, const sbx_caller_t *caller,
                           const char *protocol, const char *client, gw_mcp_sessions_fn *fn,
                           void *arg)
{
    s_op_t *op = s_op_new (self, caller, NULL, fn, arg);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_MCP_SESSION_OPEN);
    if (!op || !request) {
        s_op_forget (&op);
        sbx_msg_destroy (&request);
        fn (NULL, NULL, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    sbx_str_set (&sbx_msg_mcp_session_open (request)->protocol, protocol);
    //  clientInfo.name is the client's: cut to what the message carries.
    char name[129];
    snprintf (name, sizeof name, "%s", client ? client : "");
    sbx_utf8_sanitize (name);
    sbx_str_set (&sbx_msg_mcp_session_open (request)->client, *name ? name : NULL);
    GW_KEEP (op->handle,
             gw_broker_send (self->broker, op->caller, &request, S_TIMEOUT_MS, s_on_session, op));
}

void gw_mcp_sessions_credential (gw_mcp_sessions_t *self, const sbx_caller_t *caller,
                                 gw_mcp_sessions_fn *fn, void *arg)
{
    char id[160];
    snprintf (id, sizeof id, "mcpc_%s", caller && caller->key_id ? caller->key_id : "");
    gw_tools_state_t *state = caller ? gw_mcp_sessions_find (self, id, caller->account_id) : NULL;
    if (state) {
        fn (state, id, SBX_OK, NULL, arg);
        return;
    }
    s_op_t *op = s_op_new (self, caller, NULL, fn, arg);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_MCP_SESSION_OPEN);
    if (!op || !request) {
        s_op_forget (&op);
        sbx_msg_destroy (&request);
        fn (NULL, NULL, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    //  The broker answers the one that exists, or makes it: either way a copy here.
    sbx_msg_mcp_session_open (request)->credential = true;
    sbx_str_set (&sbx_msg_mcp_session_open (request)->protocol, "2026-07-28");
    GW_KEEP (op->handle,
             gw_broker_send (self->broker, op->caller, &request, S_TIMEOUT_MS, s_on_session, op));
}

void gw_mcp_sessions_fetch (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                            gw_mcp_sessions_fn *fn, void *arg)
{
    s_op_t *op = s_op_new (self, caller, id, fn, arg);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_MCP_SESSION_GET);
    if (!op || !request) {
        s_op_forget (&op);
        sbx_msg_destroy (&request);
        fn (NULL, id, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    sbx_str_set (&sbx_msg_mcp_session_get (request)->session_id, id);
    GW_KEEP (op->handle,
             gw_broker_send (self->broker, op->caller, &request, S_TIMEOUT_MS, s_on_session, op));
}

static void s_sync_next (s_op_t *op);

static void s_on_used (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_op_t *op = arg;
    if (!reply) {
        //  The call itself succeeded: it is answered; other gateways may not see it.
        sbx_warn ("mcp session %.12s…: the broker did not store a change: %s", op->id,
                  message ? message : sbx_code_name (code));
        zhashx_delete (op->self->copies, op->id);
    }
    s_sync_next (op);
}

static void s_sync_next (s_op_t *op)
{
    gw_tools_change_t *change = gw_tools_state_take (op->state);
    if (!change) {
        s_op_done (&op, op->state, SBX_OK, NULL);
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_MCP_SESSION_USE);
    if (request) {
        sbx_mcp_session_use_t *use = sbx_msg_mcp_session_use (request);
        sbx_str_set (&use->session_id, op->id);
        sbx_str_set (&use->sandbox_id, change->sandbox_id);
        use->forget = change->forget;
        const char *name;
        json_t *value;
        json_object_foreach (change->env, name, value)
            sbx_strmap_set (&use->env, name, json_string_value (value));
    }
    gw_tools_change_destroy (&change);
    if (!request) {
        s_on_used (NULL, SBX_E_INTERNAL, "out of memory", op);
        return;
    }
    GW_KEEP (op->handle,
             gw_broker_send (op->self->broker, op->caller, &request, S_TIMEOUT_MS, s_on_used, op));
}

void gw_mcp_sessions_sync (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                           gw_tools_state_t *state, gw_mcp_sessions_fn *fn, void *arg)
{
    s_op_t *op = s_op_new (self, caller, id, fn, arg);
    if (!op) {
        fn (state, id, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    op->state = gw_tools_state_ref (state);
    s_sync_next (op);
}

static void s_on_ended (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_op_t *op = arg;
    if (reply)
        zhashx_delete (op->self->copies, op->id);
    s_op_done (&op, NULL, reply ? SBX_OK : code, message);
}

void gw_mcp_sessions_end (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                          gw_mcp_sessions_fn *fn, void *arg)
{
    s_op_t *op = s_op_new (self, caller, id, fn, arg);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_MCP_SESSION_END);
    if (!op || !request) {
        s_op_forget (&op);
        sbx_msg_destroy (&request);
        fn (NULL, id, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    sbx_str_set (&sbx_msg_mcp_session_end (request)->session_id, id);
    GW_KEEP (op->handle,
             gw_broker_send (self->broker, op->caller, &request, S_TIMEOUT_MS, s_on_ended, op));
}

//  --------------------------------------------------------------------------
//  Self test: copies and changes, without a broker.

static void s_expect (gw_tools_state_t *state, const char *id, sbx_code_t code, const char *message,
                      void *arg)
{
    (void) id;
    (void) message;
    sbx_code_t *out = arg;
    *out = state ? SBX_OK : code;
}

void gw_mcp_sessions_test (bool verbose)
{
    (void) verbose;
    gw_broker_t *broker = gw_broker_new (NULL);
    gw_mcp_sessions_t *self = gw_mcp_sessions_new (NULL, NULL, broker);
    assert (self);
    sbx_caller_t caller = {.kind = SBX_CALLER_KIND_API_KEY, .account_id = "acc_a"};

    //  A copy answers its own account only; the broker's word replaces it.
    char *keys[] = {"TOKEN"}, *values[] = {"s3cret"};
    sbx_mcp_session_t session = {.id = "mcps_1", .account_id = "acc_a", .sandbox_id = "sb_1"};
    sbx_mcp_env_t env = {.sandbox_id = "sb_1", .env = {.count = 1, .keys = keys, .values = values}};
    session.envs.items = &env;
    session.envs.count = 1;
    assert (s_keep (self, &session));
    assert (!gw_mcp_sessions_find (self, "mcps_1", "acc_b"));
    assert (!gw_mcp_sessions_find (self, "mcps_2", "acc_a"));
    gw_tools_state_t *state = gw_mcp_sessions_find (self, "mcps_1", "acc_a");
    assert (state && streq (gw_tools_state_default (state), "sb_1"));
    assert (!gw_tools_state_take (state)); //  loading is no change
    session.sandbox_id = NULL;
    session.envs.count = 0;
    assert (s_keep (self, &session) && gw_mcp_sessions_size (self) == 1);
    state = gw_mcp_sessions_find (self, "mcps_1", "acc_a");
    assert (state && !gw_tools_state_default (state));

    //  The tap's word drops it.
    sbx_event_t event = {.type = "mcp.session.changed", .subject = "mcps_1"};
    s_on_event (&event, self);
    assert (!gw_mcp_sessions_find (self, "mcps_1", "acc_a") && gw_mcp_sessions_size (self) == 0);

    //  Without a broker every request answers unavailable, once.
    sbx_code_t code = SBX_OK;
    gw_mcp_sessions_fetch (self, &caller, "mcps_1", s_expect, &code);
    assert (code == SBX_E_UNAVAILABLE);
    code = SBX_OK;
    gw_mcp_sessions_open (self, &caller, "2025-06-18", "client \xff", s_expect, &code);
    assert (code == SBX_E_UNAVAILABLE);
    //  A sync with nothing to send answers at once; with changes, each is tried.
    state = gw_tools_state_new ();
    code = SBX_E_INTERNAL;
    gw_mcp_sessions_sync (self, &caller, "mcps_1", state, s_expect, &code);
    assert (code == SBX_OK);
    gw_tools_state_set_default (state, "sb_9");
    gw_tools_state_unref (&state);
    gw_mcp_sessions_destroy (&self);
    gw_broker_destroy (&broker);
}
