/*  brk_admin - see brk_admin.h */
#include "brk_admin.h"
#include "brk_accounts.h"
#include "sbx_clock.h"
#include "sbx_log.h"

#include <assert.h>

static sbx_msg_t *s_refuse_user (const sbx_msg_t *request)
{
    if (!request->caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "%s carries no caller identity",
                                  sbx_msg_type_name (request->type));
    if (!brk_accounts_operator (request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "%s is the operator's (sbx account, on the sbx host)",
                                  sbx_msg_type_name (request->type));
    return NULL;
}

//  The account named by id or email, or the error reply.
static sbx_msg_t *s_find (brk_ctx_t *ctx, const sbx_msg_t *request, const char *which,
                          brk_account_t *account)
{
    int rc = brk_store_account_find (ctx->store, which, account);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "account lookup failed");
    if (rc == 1)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no account '%s' (give its id acc_… or its email; sbx account "
                                  "list shows them)",
                                  which);
    return NULL;
}

//  Fills the wire form of an account, with its counts. 0 or -1.
static int s_info (brk_ctx_t *ctx, const brk_account_t *account, sbx_account_info_t *info)
{
    brk_account_counts_t counts;
    if (brk_store_account_counts (ctx->store, account->id, sbx_clock_now_ms (), &counts))
        return -1;
    if (sbx_str_set (&info->account_id, account->id) ||
        sbx_str_set (&info->email, account->email) || sbx_str_set (&info->plan, account->plan))
        return -1;
    info->admin = account->admin;
    info->state = account->disabled_ms ? SBX_ACCOUNT_STATE_DISABLED : SBX_ACCOUNT_STATE_ACTIVE;
    info->password = account->password_hash != NULL;
    info->created_ms = account->created_ms;
    info->disabled_ms = account->disabled_ms;
    info->sandboxes = counts.sandboxes;
    info->keys = counts.keys;
    return 0;
}

//  A reply of `type` (account.get.ok, account.update.ok) carrying the account as it is.
static sbx_msg_t *s_reply (brk_ctx_t *ctx, const sbx_msg_t *request, sbx_msg_type_t type,
                           const brk_account_t *account)
{
    sbx_msg_t *reply = sbx_msg_new_reply (request, type);
    sbx_account_info_t **slot = !reply ? NULL
                                : type == SBX_MSG_ACCOUNT_GET_OK
                                    ? &sbx_msg_account_get_ok (reply)->account
                                    : &sbx_msg_account_update_ok (reply)->account;
    if (slot)
        *slot = calloc (1, sizeof (sbx_account_info_t));
    if (!slot || !*slot || s_info (ctx, account, *slot)) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot read the account");
    }
    return reply;
}

typedef struct {
    brk_ctx_t *ctx;
    sbx_account_info_list_t *list;
    bool failed;
} s_list_t;

static void s_list_one (const brk_account_t *account, void *arg)
{
    s_list_t *list = arg;
    sbx_account_info_t *info = sbx_account_info_list_append (list->list);
    if (!info || s_info (list->ctx, account, info))
        list->failed = true;
}

sbx_msg_t *brk_admin_list (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse_user (request);
    if (reply)
        return reply;
    reply = sbx_msg_new_reply (request, SBX_MSG_ACCOUNT_LIST_OK);
    s_list_t list = {ctx, &sbx_msg_account_list_ok (reply)->accounts, false};
    if (brk_store_account_list (ctx->store, s_list_one, &list) < 0 || list.failed) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list the accounts");
    }
    return reply;
}

sbx_msg_t *brk_admin_get (brk_ctx_t *ctx, sbx_msg_t *request)
{
    brk_account_t account;
    sbx_msg_t *reply = s_refuse_user (request);
    if (!reply)
        reply = s_find (ctx, request, sbx_msg_account_get (request)->account, &account);
    if (reply)
        return reply;
    reply = s_reply (ctx, request, SBX_MSG_ACCOUNT_GET_OK, &account);
    brk_account_clear (&account);
    return reply;
}

//  An account.disabled or account.enabled event.
static sbx_msg_t *s_state_event (const brk_account_t *account, bool disabled)
{
    sbx_msg_t *event = sbx_msg_new (disabled ? SBX_MSG_ACCOUNT_DISABLED : SBX_MSG_ACCOUNT_ENABLED);
    if (!event)
        return NULL;
    char **id = disabled ? &sbx_msg_account_disabled (event)->account_id
                         : &sbx_msg_account_enabled (event)->account_id;
    char **email = disabled ? &sbx_msg_account_disabled (event)->email
                            : &sbx_msg_account_enabled (event)->email;
    if (sbx_str_set (id, account->id) || sbx_str_set (email, account->email))
        sbx_msg_destroy (&event);
    return event;
}

sbx_msg_t *brk_admin_update (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_account_update_t *args = sbx_msg_account_update (request);
    sbx_msg_t *reply = s_refuse_user (request);
    if (reply)
        return reply;
    if (!args->password_hash && !args->state)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "account.update changes nothing: give a password_hash or a "
                                  "state (active or disabled)");
    if (args->password_hash && strncmp (args->password_hash, "$argon2id$", 10) != 0)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "password_hash must be an argon2id hash ($argon2id$…)");
    brk_account_t account;
    reply = s_find (ctx, request, args->account, &account);
    if (reply)
        return reply;
    bool disable = args->state == SBX_ACCOUNT_STATE_DISABLED;
    //  A state it has already is no change (and no event).
    bool change_state = args->state && disable != (account.disabled_ms != 0);
    uint64_t now = sbx_clock_now_ms ();
    int rc = brk_events_begin (ctx->events);
    if (rc == 0 && args->password_hash) {
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_ACCOUNT_PASSWORD_CHANGED);
        rc = event ? sbx_str_set (&sbx_msg_account_password_changed (event)->account_id, account.id)
                   : -1;
        if (rc == 0)
            rc = brk_store_account_set_password (ctx->store, account.id, args->password_hash);
        if (rc == 0)
            rc = brk_events_add (ctx->events, &event, account.id, account.id);
        sbx_msg_destroy (&event);
    }
    if (rc == 0 && change_state) {
        sbx_msg_t *event = s_state_event (&account, disable);
        rc =
            event ? brk_store_account_set_disabled (ctx->store, account.id, disable ? now : 0) : -1;
        if (rc == 0)
            rc = brk_events_add (ctx->events, &event, account.id, account.id);
        sbx_msg_destroy (&event);
    }
    if (rc || brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        brk_account_clear (&account);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot change the account");
    }
    sbx_info ("rid=%llu account=%s (%s)%s%s", (unsigned long long) request->rid, account.id,
              account.email, args->password_hash ? " password changed" : "",
              !change_state ? ""
              : disable     ? " disabled: its credentials are refused, its sandboxes stop"
                            : " enabled");
    char *id = strdup (account.id);
    brk_account_clear (&account);
    //  Read again: the reply shows what is stored now.
    reply = id ? s_find (ctx, request, id, &account) : NULL;
    if (id && !reply) {
        reply = s_reply (ctx, request, SBX_MSG_ACCOUNT_UPDATE_OK, &account);
        brk_account_clear (&account);
    }
    free (id);
    return reply ? reply : sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
}

typedef struct {
    brk_ctx_t *ctx;
    int rc;
    uint64_t revoked;
} s_revoke_t;

//  A key.revoked event for each key the delete revokes: gateways forget it by its id.
static void s_revoke_one (const brk_key_t *key, void *arg)
{
    s_revoke_t *revoke = arg;
    if (revoke->rc || key->revoked_ms)
        return;
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_KEY_REVOKED);
    revoke->rc = event ? 0 : -1;
    if (revoke->rc == 0 &&
        (sbx_str_set (&sbx_msg_key_revoked (event)->key_id, key->id) ||
         sbx_str_set (&sbx_msg_key_revoked (event)->account_id, key->account_id)))
        revoke->rc = -1;
    if (revoke->rc == 0)
        revoke->rc = brk_events_add (revoke->ctx->events, &event, key->account_id, key->id);
    sbx_msg_destroy (&event);
    revoke->revoked++;
}

//  Why the account cannot be deleted now, or NULL.
static sbx_msg_t *s_refuse_delete (brk_ctx_t *ctx, const sbx_msg_t *request,
                                   const brk_account_t *account, bool dry_run)
{
    uint64_t admins = 0;
    brk_account_counts_t counts;
    if (brk_store_admin_count (ctx->store, &admins) ||
        brk_store_account_counts (ctx->store, account->id, sbx_clock_now_ms (), &counts))
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot count the accounts");
    if (account->admin && admins <= 1)
        return sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                  "%s is the only admin account: it is not deleted. Make another "
                                  "first (sbx account create --email E --admin) if this one must "
                                  "go, or disable it (sbx account disable %s)",
                                  account->email, account->email);
    if (counts.sandboxes && !dry_run)
        return sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                  "%s still has %llu sandbox%s that %s not deleted: delete them "
                                  "first (sbx account delete %s does, and the snapshots)",
                                  account->email, (unsigned long long) counts.sandboxes,
                                  counts.sandboxes == 1 ? "" : "es",
                                  counts.sandboxes == 1 ? "is" : "are", account->email);
    return NULL;
}

sbx_msg_t *brk_admin_delete (brk_ctx_t *ctx, sbx_msg_t *request)
{
    brk_account_t account;
    sbx_msg_t *reply = s_refuse_user (request);
    if (!reply)
        reply = s_find (ctx, request, sbx_msg_account_delete (request)->account, &account);
    if (reply)
        return reply;
    bool dry_run = sbx_msg_account_delete (request)->dry_run;
    reply = s_refuse_delete (ctx, request, &account, dry_run);
    if (reply || dry_run) {
        if (!reply) {
            reply = sbx_msg_new_reply (request, SBX_MSG_ACCOUNT_DELETE_OK);
            sbx_str_set (&sbx_msg_account_delete_ok (reply)->account_id, account.id);
            sbx_str_set (&sbx_msg_account_delete_ok (reply)->email, account.email);
        }
        brk_account_clear (&account);
        return reply;
    }
    s_revoke_t revoke = {ctx, 0, 0};
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_ACCOUNT_DELETED);
    int rc = event ? brk_events_begin (ctx->events) : -1;
    if (rc == 0 && brk_store_key_list (ctx->store, account.id, s_revoke_one, &revoke) < 0)
        rc = -1;
    if (rc == 0)
        rc = revoke.rc;
    if (rc == 0)
        rc = brk_store_account_delete (ctx->store, account.id, sbx_clock_now_ms ());
    if (rc == 0) {
        sbx_account_deleted_t *body = sbx_msg_account_deleted (event);
        body->keys_revoked = revoke.revoked;
        if (sbx_str_set (&body->account_id, account.id) ||
            sbx_str_set (&body->email, account.email))
            rc = -1;
    }
    if (rc == 0)
        rc = brk_events_add (ctx->events, &event, account.id, account.id);
    if (rc || brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot delete the account");
    } else {
        reply = sbx_msg_new_reply (request, SBX_MSG_ACCOUNT_DELETE_OK);
        sbx_account_delete_ok_t *ok = sbx_msg_account_delete_ok (reply);
        sbx_str_set (&ok->account_id, account.id);
        sbx_str_set (&ok->email, account.email);
        ok->keys_revoked = revoke.revoked;
        sbx_info ("rid=%llu account=%s (%s) deleted; %llu keys and connections revoked",
                  (unsigned long long) request->rid, account.id, account.email,
                  (unsigned long long) revoke.revoked);
    }
    sbx_msg_destroy (&event);
    brk_account_clear (&account);
    return reply;
}

//  --------------------------------------------------------------------------
//  Self test: a real broker, vmd played at the protocol level. Listing and reading,
//  a password, disabling (keys refused with their reason, whatever the caller, creates
//  refused, a ready sandbox stopped by the broker, and back), deleting (refused with a
//  live sandbox and for the last admin), and the events of each.

#include "brk_server.h"
#include "brk_testkit.h"

static uint64_t s_rid = 9000;

static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *reply = brk_testkit_vm_ok (*request_p);
    if (!reply)
        reply = sbx_msg_new_error ((*request_p)->rid, SBX_E_INVALID_ARGUMENT, "not a vm request");
    sbx_peer_send (peer, &reply);
}

//  The account, as an operator asks for it (NULL reply when refused: code in *code).
static sbx_msg_t *s_test_get (zsock_t *client, const char *which)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, which);
    return brk_testkit_call (client, request, ++s_rid);
}

static sbx_msg_t *s_test_update (zsock_t *client, const char *which, const char *hash,
                                 sbx_account_state_t state)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_UPDATE);
    sbx_str_set (&sbx_msg_account_update (request)->account, which);
    sbx_str_set (&sbx_msg_account_update (request)->password_hash, hash);
    sbx_msg_account_update (request)->state = state;
    return brk_testkit_call (client, request, ++s_rid);
}

static sbx_msg_t *s_test_delete (zsock_t *client, const char *which)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_DELETE);
    sbx_str_set (&sbx_msg_account_delete (request)->account, which);
    return brk_testkit_call (client, request, ++s_rid);
}

static sbx_msg_t *s_test_auth (zsock_t *client, const char *key)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_AUTH_KEY);
    sbx_str_set (&sbx_msg_auth_key (request)->key, key);
    return brk_testkit_call (client, request, ++s_rid);
}

//  A sandbox request as an operator (caller for ACCOUNT, when given, names the owner).
static sbx_msg_t *s_test_sandbox (zsock_t *client, sbx_msg_type_t type, const char *id,
                                  const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&request->caller->account_id, account);
    if (type == SBX_MSG_SANDBOX_GET)
        sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, id);
    else if (type == SBX_MSG_SANDBOX_RESUME)
        sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, id);
    else if (type == SBX_MSG_SANDBOX_DELETE)
        sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, id);
    return brk_testkit_call (client, request, ++s_rid);
}

static bool s_refused (sbx_msg_t **reply_p, sbx_code_t code, const char *text)
{
    sbx_msg_t *reply = *reply_p;
    bool match = reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == code &&
                 (!text || strstr (sbx_msg_error (reply)->message, text));
    if (!match)
        printf ("unexpected: %s\n", reply->type == SBX_MSG_ERROR ? sbx_msg_error (reply)->message
                                                                 : sbx_msg_type_name (reply->type));
    sbx_msg_destroy (reply_p);
    return match;
}

static size_t s_events (zsock_t *client, const char *type)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, type);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    size_t count = 0;
    sbx_event_list_t *events = &sbx_msg_events_replay_ok (reply)->events;
    for (size_t i = 0; i < events->count; i++)
        count += streq (events->items[i].type, type);
    sbx_msg_destroy (&reply);
    return count;
}

static char *s_test_account_key (zsock_t *client, const char *email, bool admin, char **key)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, email);
    sbx_msg_account_create (request)->admin = admin;
    sbx_msg_account_create (request)->with_key = key != NULL;
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    char *id = strdup (sbx_msg_account_create_ok (reply)->account_id);
    if (key)
        *key = strdup (sbx_msg_account_create_ok (reply)->api_key);
    sbx_msg_destroy (&reply);
    return id;
}

void brk_admin_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_admin_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 8, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    char *ann_key = NULL;
    char *root = s_test_account_key (client, "root@example.com", true, NULL);
    char *ann = s_test_account_key (client, "ann@example.com", false, &ann_key);

    //  Operators only.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_LIST);
    request->caller = brk_testkit_caller (ann, "key_x", SBX_KEY_PRESET_FULL);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (s_refused (&reply, SBX_E_PERMISSION_DENIED, "the operator's"));

    //  The list (oldest first) and one account, by email or id, with its counts.
    reply = brk_testkit_call (client, sbx_msg_new (SBX_MSG_ACCOUNT_LIST), ++s_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_LIST_OK);
    sbx_account_info_list_t *all = &sbx_msg_account_list_ok (reply)->accounts;
    assert (all->count == 2 && streq (all->items[0].account_id, root));
    assert (all->items[0].admin && !all->items[1].admin);
    assert (all->items[1].keys == 1 && all->items[1].sandboxes == 0);
    assert (all->items[1].state == SBX_ACCOUNT_STATE_ACTIVE && !all->items[1].password);
    sbx_msg_destroy (&reply);
    reply = s_test_get (client, "ANN@example.com");
    assert (reply->type == SBX_MSG_ACCOUNT_GET_OK);
    assert (streq (sbx_msg_account_get_ok (reply)->account->account_id, ann));
    sbx_msg_destroy (&reply);
    reply = s_test_get (client, "nobody@example.com");
    assert (s_refused (&reply, SBX_E_NOT_FOUND, "sbx account list shows them"));

    //  A password: an argon2id hash, or nothing changes.
    reply = s_test_update (client, ann, NULL, SBX_ACCOUNT_STATE__UNSET);
    assert (s_refused (&reply, SBX_E_INVALID_ARGUMENT, "changes nothing"));
    reply = s_test_update (client, ann, "plain text", SBX_ACCOUNT_STATE__UNSET);
    assert (s_refused (&reply, SBX_E_INVALID_ARGUMENT, "argon2id"));
    reply = s_test_update (client, ann, "$argon2id$v=19$fake", SBX_ACCOUNT_STATE__UNSET);
    assert (reply->type == SBX_MSG_ACCOUNT_UPDATE_OK);
    assert (sbx_msg_account_update_ok (reply)->account->password);
    sbx_msg_destroy (&reply);
    assert (s_events (client, "account.password_changed") == 1);

    //  A ready sandbox of ann's, and her key works.
    sbx_msg_t *create = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    create->caller = calloc (1, sizeof (sbx_caller_t));
    create->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&create->caller->account_id, ann);
    sbx_msg_t *create_again = sbx_msg_dup (create);
    reply = brk_testkit_call (client, create, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *sandbox = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (client, ann_key);
    assert (reply->type == SBX_MSG_AUTH_KEY_OK);
    sbx_msg_destroy (&reply);

    //  Disabled: the key is refused saying why, and so is any request a gateway still
    //  makes for her; nothing of hers starts; the broker stops her ready sandbox.
    reply = s_test_update (client, "ann@example.com", NULL, SBX_ACCOUNT_STATE_DISABLED);
    assert (reply->type == SBX_MSG_ACCOUNT_UPDATE_OK);
    sbx_account_info_t *info = sbx_msg_account_update_ok (reply)->account;
    assert (info->state == SBX_ACCOUNT_STATE_DISABLED && info->disabled_ms > 0);
    assert (info->sandboxes == 1);
    sbx_msg_destroy (&reply);
    reply = s_test_update (client, ann, NULL, SBX_ACCOUNT_STATE_DISABLED); //  no change
    assert (reply->type == SBX_MSG_ACCOUNT_UPDATE_OK);
    sbx_msg_destroy (&reply);
    assert (s_events (client, "account.disabled") == 1);
    reply = s_test_auth (client, ann_key);
    assert (s_refused (&reply, SBX_E_UNAUTHENTICATED, "account disabled: "));
    request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    request->caller = brk_testkit_caller (ann, "key_x", SBX_KEY_PRESET_FULL);
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (s_refused (&reply, SBX_E_UNAUTHENTICATED, "ann@example.com) is disabled"));
    reply = brk_testkit_call (client, create_again, ++s_rid);
    assert (s_refused (&reply, SBX_E_FAILED_PRECONDITION, "sbx account enable ann@example.com"));
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE_READY;
    for (int tries = 0; tries < 200 && state != SBX_SANDBOX_STATE_STOPPED; tries++) {
        zclock_sleep (20);
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_GET, sandbox, NULL);
        state = sbx_msg_sandbox_get_ok (reply)->sandbox->state;
        if (state == SBX_SANDBOX_STATE_STOPPED)
            assert (streq (sbx_msg_sandbox_get_ok (reply)->sandbox->reason, "account disabled"));
        sbx_msg_destroy (&reply);
    }
    assert (state == SBX_SANDBOX_STATE_STOPPED);
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_RESUME, sandbox, NULL);
    assert (s_refused (&reply, SBX_E_FAILED_PRECONDITION, "is disabled"));

    //  Enabled: the key works again.
    reply = s_test_update (client, ann, NULL, SBX_ACCOUNT_STATE_ACTIVE);
    assert (reply->type == SBX_MSG_ACCOUNT_UPDATE_OK);
    assert (sbx_msg_account_update_ok (reply)->account->state == SBX_ACCOUNT_STATE_ACTIVE);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (client, ann_key);
    assert (reply->type == SBX_MSG_AUTH_KEY_OK);
    sbx_msg_destroy (&reply);
    assert (s_events (client, "account.enabled") == 1);

    //  Deleted: not while her sandbox is there, nor the only admin; then gone, her key
    //  with her, her email free again.
    reply = s_test_delete (client, ann);
    assert (s_refused (&reply, SBX_E_CONFLICT, "still has 1 sandbox that is not deleted"));
    //  A dry run asks only what deleting the sandboxes would not change.
    request = sbx_msg_new (SBX_MSG_ACCOUNT_DELETE);
    sbx_str_set (&sbx_msg_account_delete (request)->account, ann);
    sbx_msg_account_delete (request)->dry_run = true;
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_DELETE_OK);
    sbx_msg_destroy (&reply);
    assert (s_events (client, "account.deleted") == 0);
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_DELETE, sandbox, NULL);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_delete (client, "ann@example.com");
    assert (reply->type == SBX_MSG_ACCOUNT_DELETE_OK);
    assert (sbx_msg_account_delete_ok (reply)->keys_revoked == 1);
    assert (streq (sbx_msg_account_delete_ok (reply)->email, "ann@example.com"));
    sbx_msg_destroy (&reply);
    reply = s_test_auth (client, ann_key);
    assert (s_refused (&reply, SBX_E_UNAUTHENTICATED, "not valid"));
    reply = s_test_get (client, ann);
    assert (s_refused (&reply, SBX_E_NOT_FOUND, NULL));
    reply = s_test_delete (client, ann);
    assert (s_refused (&reply, SBX_E_NOT_FOUND, NULL));
    request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    request->caller = brk_testkit_caller (ann, "key_x", SBX_KEY_PRESET_FULL);
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (s_refused (&reply, SBX_E_UNAUTHENTICATED, "account deleted: "));
    assert (s_events (client, "account.deleted") == 1);
    assert (s_events (client, "key.revoked") == 1);
    char *ann2 = s_test_account_key (client, "ann@example.com", false, NULL);
    assert (!streq (ann2, ann));
    reply = s_test_delete (client, root);
    assert (s_refused (&reply, SBX_E_CONFLICT, "only admin account"));
    request = sbx_msg_new (SBX_MSG_ACCOUNT_DELETE);
    sbx_str_set (&sbx_msg_account_delete (request)->account, root);
    sbx_msg_account_delete (request)->dry_run = true;
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (s_refused (&reply, SBX_E_CONFLICT, "only admin account"));
    char *other = s_test_account_key (client, "other-admin@example.com", true, NULL);
    reply = s_test_delete (client, root);
    assert (reply->type == SBX_MSG_ACCOUNT_DELETE_OK);
    sbx_msg_destroy (&reply);
    reply = brk_testkit_call (client, sbx_msg_new (SBX_MSG_ACCOUNT_LIST), ++s_rid);
    all = &sbx_msg_account_list_ok (reply)->accounts;
    assert (all->count == 2 && streq (all->items[0].account_id, ann2));
    assert (streq (all->items[1].account_id, other));
    sbx_msg_destroy (&reply);

    free (other);
    free (ann2);
    free (sandbox);
    free (ann_key);
    free (ann);
    free (root);
    zactor_destroy (&vmd);
    zsock_destroy (&client);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
