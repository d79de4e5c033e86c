/*  brk_sessions - see brk_sessions.h */
#include "brk_sessions.h"
#include "brk_testkit.h"
#include "sbx_clock.h"
#include "sbx_secret.h"

#include <assert.h>

#define S_IDLE_MS     (24ULL * 3600 * 1000) //  an idle session is forgotten after this
#define S_PER_ACCOUNT 1000                  //  more forgets the least recently used
#define S_TOUCH_MS    (60ULL * 1000)        //  used_ms is written at most this often
#define S_ENVS_MAX    1000                  //  schemas/mcp.json: mcp_session.envs
#define S_SWEEP_BATCH 50

static sbx_msg_t *s_refuse (sbx_msg_t *request, bool from_gateway)
{
    if (!from_gateway)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "%s is the gateway's: MCP sessions are opened through /mcp",
                                  sbx_msg_type_name (request->type));
    if (!request->caller || !request->caller->account_id || !*request->caller->account_id)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "%s carries no caller account",
                                  sbx_msg_type_name (request->type));
    return NULL;
}

static sbx_msg_t *s_not_found (sbx_msg_t *request)
{
    return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                              "Session not found (ended, idle for a day, or another account's): "
                              "initialize a new one");
}

//  The session id's row when it is the caller's: 0, 1 (none, or another account's), -1.
static int s_find (brk_ctx_t *ctx, sbx_msg_t *request, const char *id, brk_mcp_session_t *out)
{
    int rc = brk_store_mcp_session_find (ctx->store, id, out);
    if (rc == 0 && strcmp (out->account_id, request->caller->account_id) != 0) {
        brk_mcp_session_clear (out);
        rc = 1;
    }
    return rc;
}

typedef struct {
    sbx_mcp_env_list_t *envs;
    size_t dropped;
} s_fill_t;

static void s_add_env (const char *sandbox_id, const char *name, const char *value, void *arg)
{
    s_fill_t *fill = arg;
    sbx_mcp_env_list_t *envs = fill->envs;
    sbx_mcp_env_t *last = envs->count ? &envs->items[envs->count - 1] : NULL;
    if (!last || strcmp (last->sandbox_id, sandbox_id) != 0) {
        if (envs->count >= S_ENVS_MAX) {
            fill->dropped++;
            return;
        }
        last = sbx_mcp_env_list_append (envs);
        if (!last)
            return;
        sbx_str_set (&last->sandbox_id, sandbox_id);
    }
    sbx_strmap_set (&last->env, name, value);
}

//  A reply of `type` carrying the session as stored, env included.
static sbx_msg_t *s_reply (brk_ctx_t *ctx, sbx_msg_t *request, sbx_msg_type_t type,
                           const brk_mcp_session_t *row)
{
    sbx_msg_t *reply = sbx_msg_new_reply (request, type);
    sbx_mcp_session_t *session = calloc (1, sizeof *session);
    if (!reply || !session) {
        free (session);
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    if (type == SBX_MSG_MCP_SESSION_OPEN_OK)
        sbx_msg_mcp_session_open_ok (reply)->session = session;
    else if (type == SBX_MSG_MCP_SESSION_GET_OK)
        sbx_msg_mcp_session_get_ok (reply)->session = session;
    else
        sbx_msg_mcp_session_use_ok (reply)->session = session;
    sbx_str_set (&session->id, row->id);
    sbx_str_set (&session->account_id, row->account_id);
    sbx_str_set (&session->key_id, row->key_id);
    sbx_str_set (&session->protocol, row->protocol);
    sbx_str_set (&session->client, row->client);
    sbx_str_set (&session->sandbox_id, row->sandbox_id);
    session->created_ms = row->created_ms;
    session->used_ms = row->used_ms;
    s_fill_t fill = {.envs = &session->envs};
    brk_store_mcp_env_list (ctx->store, row->id, s_add_env, &fill);
    if (fill.dropped)
        sbx_warn ("mcp session %.12s… keeps env for more than %d sandboxes; %zu not sent", row->id,
                  S_ENVS_MAX, fill.dropped);
    return reply;
}

//  Adds an mcp.session.changed event to the open transaction.
static int s_changed (brk_ctx_t *ctx, const char *session_id, const char *account_id, bool ended)
{
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_MCP_SESSION_CHANGED);
    if (!event)
        return -1;
    sbx_str_set (&sbx_msg_mcp_session_changed (event)->session_id, session_id);
    sbx_msg_mcp_session_changed (event)->ended = ended;
    return brk_events_add (ctx->events, &event, account_id, session_id);
}

//  Deletes a session with its event, inside the open transaction.
static int s_delete (brk_ctx_t *ctx, const char *id, const char *account_id)
{
    return brk_store_mcp_session_delete (ctx->store, id) < 0 ||
                   s_changed (ctx, id, account_id, true)
               ? -1
               : 0;
}

sbx_msg_t *brk_sessions_open (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway)
{
    sbx_msg_t *refused = s_refuse (request, from_gateway);
    if (refused)
        return refused;
    sbx_mcp_session_open_t *args = sbx_msg_mcp_session_open (request);
    const sbx_caller_t *caller = request->caller;
    uint64_t now = sbx_clock_now_ms ();
    char *id = NULL;
    if (args->credential) {
        //  One per credential, named after it: the same one from every gateway, made by
        //  whichever asks first (a second insert finds it).
        if (!caller->key_id || !*caller->key_id)
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "a credential session needs a key or connection");
        if (asprintf (&id, "mcpc_%s", caller->key_id) < 0)
            id = NULL;
        brk_mcp_session_t found;
        int rc = id ? s_find (ctx, request, id, &found) : -1;
        if (rc == 0) {
            free (id);
            sbx_msg_t *reply = s_reply (ctx, request, SBX_MSG_MCP_SESSION_OPEN_OK, &found);
            brk_mcp_session_clear (&found);
            return reply;
        }
        if (rc < 0) {
            free (id);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "session lookup failed");
        }
    } else
        id = sbx_secret_token ("mcps_", 32);
    brk_mcp_session_t row = {.id = id,
                             .account_id = caller->account_id,
                             .key_id = caller->key_id,
                             .protocol = args->protocol,
                             .client = args->client,
                             .created_ms = now,
                             .used_ms = now};
    uint64_t count = 0;
    char *oldest = NULL;
    int rc =
        id && brk_store_mcp_session_count (ctx->store, caller->account_id, &count) == 0 ? 0 : -1;
    if (rc == 0 && count >= S_PER_ACCOUNT &&
        brk_store_mcp_session_oldest (ctx->store, caller->account_id, &oldest) < 0)
        rc = -1;
    if (rc == 0 && brk_events_begin (ctx->events))
        rc = -1;
    else if (rc == 0) {
        //  The account's least recently used goes first: clients that never send DELETE
        //  must not lock an account out of new sessions.
        if (oldest && s_delete (ctx, oldest, caller->account_id))
            rc = -1;
        else if (brk_store_mcp_session_insert (ctx->store, &row))
            rc = -1;
        if (rc || brk_events_commit (ctx->events)) {
            brk_events_rollback (ctx->events);
            rc = -1;
        }
    }
    sbx_msg_t *reply;
    if (rc) {
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot open an MCP session");
    } else {
        if (oldest)
            sbx_info ("account=%s mcp session %.12s… forgotten: %d sessions is the most",
                      caller->account_id, oldest, S_PER_ACCOUNT);
        reply = s_reply (ctx, request, SBX_MSG_MCP_SESSION_OPEN_OK, &row);
    }
    free (oldest);
    free (id);
    return reply;
}

sbx_msg_t *brk_sessions_get (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway)
{
    sbx_msg_t *refused = s_refuse (request, from_gateway);
    if (refused)
        return refused;
    brk_mcp_session_t row;
    int rc = s_find (ctx, request, sbx_msg_mcp_session_get (request)->session_id, &row);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "session lookup failed");
    if (rc == 1)
        return s_not_found (request);
    //  Use keeps a session alive; written a minute at a time, not on every request.
    uint64_t now = sbx_clock_now_ms ();
    if (now > row.used_ms + S_TOUCH_MS && brk_store_begin (ctx->store) == 0) {
        if (brk_store_mcp_session_use (ctx->store, row.id, row.sandbox_id, now) == 0 &&
            brk_store_commit (ctx->store) == 0)
            row.used_ms = now;
        else
            brk_store_rollback (ctx->store);
    }
    sbx_msg_t *reply = s_reply (ctx, request, SBX_MSG_MCP_SESSION_GET_OK, &row);
    brk_mcp_session_clear (&row);
    return reply;
}

sbx_msg_t *brk_sessions_use (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway)
{
    sbx_msg_t *refused = s_refuse (request, from_gateway);
    if (refused)
        return refused;
    sbx_mcp_session_use_t *args = sbx_msg_mcp_session_use (request);
    if (strncmp (args->sandbox_id, "sb_", 3) != 0)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "sandbox_id must be a sandbox id (sb_…)");
    brk_mcp_session_t row;
    int rc = s_find (ctx, request, args->session_id, &row);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "session lookup failed");
    if (rc == 1)
        return s_not_found (request);
    //  What becomes of the default: the sandbox used; or none when the default is the
    //  sandbox that went.
    const char *now_default = row.sandbox_id;
    if (!args->forget)
        now_default = args->sandbox_id;
    else if (row.sandbox_id && streq (row.sandbox_id, args->sandbox_id))
        now_default = NULL;
    bool moved = (now_default == NULL) != (row.sandbox_id == NULL) ||
                 (now_default && !streq (now_default, row.sandbox_id));
    bool env = args->forget || args->env.count > 0;
    uint64_t now = sbx_clock_now_ms ();
    if (moved || env || now > row.used_ms + S_TOUCH_MS) {
        rc = brk_events_begin (ctx->events);
        if (rc == 0 && brk_store_mcp_session_use (ctx->store, row.id, now_default, now))
            rc = -1;
        if (rc == 0 && env &&
            brk_store_mcp_env_set (ctx->store, row.id, args->sandbox_id,
                                   args->forget ? NULL : &args->env))
            rc = -1;
        //  Only what another gateway's copy would get wrong makes an event.
        if (rc == 0 && (moved || env) && s_changed (ctx, row.id, row.account_id, false))
            rc = -1;
        if (rc == 0 && brk_events_commit (ctx->events))
            rc = -1;
        if (rc) {
            brk_events_rollback (ctx->events);
            brk_mcp_session_clear (&row);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot update the session");
        }
        sbx_str_set (&row.sandbox_id, now_default);
        row.used_ms = now;
    }
    sbx_msg_t *reply = s_reply (ctx, request, SBX_MSG_MCP_SESSION_USE_OK, &row);
    brk_mcp_session_clear (&row);
    return reply;
}

sbx_msg_t *brk_sessions_end (brk_ctx_t *ctx, sbx_msg_t *request, bool from_gateway)
{
    sbx_msg_t *refused = s_refuse (request, from_gateway);
    if (refused)
        return refused;
    const char *id = sbx_msg_mcp_session_end (request)->session_id;
    brk_mcp_session_t row;
    int rc = s_find (ctx, request, id, &row);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "session lookup failed");
    if (rc == 1)
        return s_not_found (request);
    rc = brk_events_begin (ctx->events) || s_delete (ctx, row.id, row.account_id) ||
                 brk_events_commit (ctx->events)
             ? -1
             : 0;
    brk_mcp_session_clear (&row);
    if (rc) {
        brk_events_rollback (ctx->events);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot end the session");
    }
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_MCP_SESSION_END_OK);
    sbx_str_set (&sbx_msg_mcp_session_end_ok (reply)->session_id, id);
    return reply;
}

void brk_sessions_sweep (brk_ctx_t *ctx)
{
    uint64_t now = sbx_clock_now_ms ();
    if (now < S_IDLE_MS)
        return;
    for (int i = 0; i < S_SWEEP_BATCH; i++) {
        char *id = NULL;
        brk_mcp_session_t row;
        if (brk_store_mcp_session_idle (ctx->store, now - S_IDLE_MS, &id) != 0 ||
            brk_store_mcp_session_find (ctx->store, id, &row) != 0) {
            free (id);
            return;
        }
        int rc = brk_events_begin (ctx->events) || s_delete (ctx, row.id, row.account_id) ||
                         brk_events_commit (ctx->events)
                     ? -1
                     : 0;
        if (rc)
            brk_events_rollback (ctx->events);
        else
            sbx_debug ("mcp session %.12s… of %s forgotten after a day idle", row.id,
                       row.account_id);
        brk_mcp_session_clear (&row);
        free (id);
        if (rc)
            return;
    }
}

//  --------------------------------------------------------------------------
//  Self test

static sbx_msg_t *s_request (sbx_msg_type_t type, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->rid = 7;
    request->caller = brk_testkit_caller (account, "key_t", SBX_KEY_PRESET_FULL);
    return request;
}

//  The session a reply carries, or NULL for an error.
static sbx_mcp_session_t *s_session (sbx_msg_t *reply)
{
    return reply->type == SBX_MSG_MCP_SESSION_OPEN_OK ? sbx_msg_mcp_session_open_ok (reply)->session
           : reply->type == SBX_MSG_MCP_SESSION_GET_OK ? sbx_msg_mcp_session_get_ok (reply)->session
           : reply->type == SBX_MSG_MCP_SESSION_USE_OK ? sbx_msg_mcp_session_use_ok (reply)->session
                                                       : NULL;
}

static sbx_msg_t *s_use (brk_ctx_t *ctx, const char *account, const char *id,
                         const char *sandbox_id, bool forget, const char *env_value)
{
    sbx_msg_t *request = s_request (SBX_MSG_MCP_SESSION_USE, account);
    sbx_str_set (&sbx_msg_mcp_session_use (request)->session_id, id);
    sbx_str_set (&sbx_msg_mcp_session_use (request)->sandbox_id, sandbox_id);
    sbx_msg_mcp_session_use (request)->forget = forget;
    if (env_value)
        sbx_strmap_set (&sbx_msg_mcp_session_use (request)->env, "TOKEN", env_value);
    sbx_msg_t *reply = brk_sessions_use (ctx, request, true);
    sbx_msg_destroy (&request);
    return reply;
}

static sbx_msg_t *s_get (brk_ctx_t *ctx, const char *account, const char *id)
{
    sbx_msg_t *request = s_request (SBX_MSG_MCP_SESSION_GET, account);
    sbx_str_set (&sbx_msg_mcp_session_get (request)->session_id, id);
    sbx_msg_t *reply = brk_sessions_get (ctx, request, true);
    sbx_msg_destroy (&request);
    return reply;
}

void brk_sessions_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_sessions_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[300];
    snprintf (path, sizeof path, "%s/control.db", dir);
    brk_store_t *store = brk_store_new (path);
    assert (store);
    zsock_t *tap = zsock_new_pub ("inproc://brk_sessions_test");
    zsock_t *sub = zsock_new_sub ("inproc://brk_sessions_test", "mcp.session.changed");
    brk_events_t *events = brk_events_new (store, tap);
    brk_ctx_t ctx = {.store = store, .events = events};
    brk_account_t a = {.id = "acc_a", .email = "a@example.com", .plan = "free", .created_ms = 1};
    brk_account_t b = {.id = "acc_b", .email = "b@example.com", .plan = "free", .created_ms = 1};
    assert (brk_store_begin (store) == 0 && brk_store_account_insert (store, &a) == 0 &&
            brk_store_account_insert (store, &b) == 0 && brk_store_commit (store) == 0);

    //  Gateways only; an account is needed.
    sbx_msg_t *request = s_request (SBX_MSG_MCP_SESSION_OPEN, "acc_a");
    sbx_str_set (&sbx_msg_mcp_session_open (request)->protocol, "2025-06-18");
    sbx_msg_t *reply = brk_sessions_open (&ctx, request, false);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    reply = brk_sessions_open (&ctx, request, true);
    sbx_msg_destroy (&request);
    sbx_mcp_session_t *session = s_session (reply);
    assert (session && strncmp (session->id, "mcps_", 5) == 0 && strlen (session->id) == 37);
    assert (streq (session->account_id, "acc_a") && streq (session->protocol, "2025-06-18"));
    assert (!session->sandbox_id && session->envs.count == 0);
    char *id = strdup (session->id);
    sbx_msg_destroy (&reply);

    //  A credential's own session (MCP 2026-07-28): named after the key, made once.
    for (int round = 0; round < 2; round++) {
        request = s_request (SBX_MSG_MCP_SESSION_OPEN, "acc_a");
        sbx_msg_mcp_session_open (request)->credential = true;
        sbx_str_set (&sbx_msg_mcp_session_open (request)->protocol, "2026-07-28");
        reply = brk_sessions_open (&ctx, request, true);
        sbx_msg_destroy (&request);
        session = s_session (reply);
        assert (session && streq (session->id, "mcpc_key_t"));
        if (round == 0) {
            sbx_msg_destroy (&reply);
            sbx_msg_t *used = s_use (&ctx, "acc_a", "mcpc_key_t", "sb_9", false, NULL);
            assert (s_session (used));
            sbx_msg_destroy (&used);
            zmsg_t *change = zmsg_recv (sub);
            zmsg_destroy (&change);
        } else
            assert (streq (session->sandbox_id, "sb_9")); //  as it was: not a new one
        sbx_msg_destroy (&reply);
    }

    //  Another account is told it does not exist.
    reply = s_get (&ctx, "acc_b", id);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_use (&ctx, "acc_b", id, "sb_1", false, NULL);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  A create with env, then a use of another sandbox: each change an event.
    reply = s_use (&ctx, "acc_a", id, "sb_1", false, "secret");
    session = s_session (reply);
    assert (session && streq (session->sandbox_id, "sb_1") && session->envs.count == 1);
    assert (streq (session->envs.items[0].sandbox_id, "sb_1"));
    assert (streq (session->envs.items[0].env.values[0], "secret"));
    sbx_msg_destroy (&reply);
    zmsg_t *event = zmsg_recv (sub);
    assert (event && zmsg_size (event) == 2);
    zmsg_destroy (&event);
    reply = s_use (&ctx, "acc_a", id, "sb_2", false, NULL);
    assert (streq (s_session (reply)->sandbox_id, "sb_2"));
    sbx_msg_destroy (&reply);
    event = zmsg_recv (sub);
    assert (event);
    zmsg_destroy (&event);
    //  The same again changes nothing: no event.
    reply = s_use (&ctx, "acc_a", id, "sb_2", false, NULL);
    assert (streq (s_session (reply)->sandbox_id, "sb_2"));
    sbx_msg_destroy (&reply);
    zsock_set_rcvtimeo (sub, 100);
    event = zmsg_recv (sub);
    assert (!event);
    reply = s_use (&ctx, "acc_a", id, "not-a-sandbox", false, NULL);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);

    //  A deleted sandbox that is not the default leaves the default; its env goes.
    reply = s_use (&ctx, "acc_a", id, "sb_1", true, NULL);
    session = s_session (reply);
    assert (streq (session->sandbox_id, "sb_2") && session->envs.count == 0);
    sbx_msg_destroy (&reply);
    reply = s_use (&ctx, "acc_a", id, "sb_2", true, NULL);
    assert (!s_session (reply)->sandbox_id);
    sbx_msg_destroy (&reply);
    reply = s_get (&ctx, "acc_a", id);
    assert (s_session (reply) && !s_session (reply)->sandbox_id);
    sbx_msg_destroy (&reply);

    //  Ended: gone for everyone, and once only.
    request = s_request (SBX_MSG_MCP_SESSION_END, "acc_a");
    sbx_str_set (&sbx_msg_mcp_session_end (request)->session_id, id);
    reply = brk_sessions_end (&ctx, request, true);
    assert (reply->type == SBX_MSG_MCP_SESSION_END_OK);
    sbx_msg_destroy (&reply);
    reply = brk_sessions_end (&ctx, request, true);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    reply = s_get (&ctx, "acc_a", id);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    free (id);

    //  The account's least recently used session makes room for a new one.
    char *first = NULL;
    for (int i = 0; i <= S_PER_ACCOUNT; i++) {
        request = s_request (SBX_MSG_MCP_SESSION_OPEN, "acc_b");
        reply = brk_sessions_open (&ctx, request, true);
        assert (s_session (reply));
        if (i == 0)
            first = strdup (s_session (reply)->id);
        sbx_msg_destroy (&reply);
        sbx_msg_destroy (&request);
    }
    uint64_t count = 0;
    assert (brk_store_mcp_session_count (store, "acc_b", &count) == 0 && count == S_PER_ACCOUNT);
    reply = s_get (&ctx, "acc_b", first);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    free (first);

    brk_events_destroy (&events);
    zsock_destroy (&sub);
    zsock_destroy (&tap);
    brk_store_destroy (&store);
    snprintf (path, sizeof path, "rm -rf '%s'", dir);
    assert (system (path) == 0);
}
