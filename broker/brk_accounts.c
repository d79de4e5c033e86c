/*  brk_accounts - see brk_accounts.h */
#include "brk_accounts.h"
#include "brk_limits.h"
#include "brk_oauth.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>

#define S_TEN_YEARS_S (10ULL * 365 * 86400)

bool brk_accounts_operator (const sbx_caller_t *caller)
{
    return caller &&
           (caller->kind == SBX_CALLER_KIND_ADMIN || caller->kind == SBX_CALLER_KIND_SYSTEM);
}

//  Only operators (admin, system) may act on any account; a user's credentials act on
//  their own account, and anything else looks like it does not exist.
static bool s_may_act_on (const sbx_caller_t *caller, const char *account_id)
{
    if (brk_accounts_operator (caller))
        return true;
    return caller->account_id && strcmp (caller->account_id, account_id) == 0;
}

sbx_msg_t *brk_accounts_refuse_disabled (brk_ctx_t *ctx, const char *account_id, uint64_t rid)
{
    bool disabled = false;
    int rc = brk_store_account_disabled (ctx->store, account_id, &disabled);
    if (rc < 0)
        return sbx_msg_new_error (rid, SBX_E_INTERNAL, "account lookup failed");
    if (rc == 1)
        return sbx_msg_new_error (rid, SBX_E_UNAUTHENTICATED,
                                  "account deleted: the account of this credential no longer "
                                  "exists");
    if (!disabled)
        return NULL;
    brk_account_t account;
    bool found = brk_store_account_find (ctx->store, account_id, &account) == 0;
    sbx_msg_t *refusal = sbx_msg_new_error (
        rid, SBX_E_UNAUTHENTICATED,
        "account disabled: the account of this credential (%s) is disabled; its API keys, "
        "connections and sign-ins are refused until the operator of this service enables it "
        "again",
        found ? account.email : account_id);
    if (found)
        brk_account_clear (&account);
    return refusal;
}

static sbx_msg_t *s_no_caller (sbx_msg_t *request)
{
    return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s carries no caller identity",
                              sbx_msg_type_name (request->type));
}

//  An email is one @ with text on both sides, printable ASCII without spaces; stored in
//  lower case so lookups are exact.
static int s_normalize_email (const char *in, char *out, size_t size)
{
    size_t len = strlen (in);
    if (len < 3 || len >= size)
        return -1;
    int ats = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char) in[i];
        if (c <= ' ' || c >= 0x7f)
            return -1;
        if (c == '@')
            ats++;
        out[i] = (char) tolower (c);
    }
    out[len] = 0;
    const char *at = strchr (out, '@');
    if (ats != 1 || at == out || at[1] == 0)
        return -1;
    return 0;
}

static bool s_valid_plan (const char *plan)
{
    size_t len = strlen (plan);
    if (len == 0 || len > 32)
        return false;
    for (const char *p = plan; *p; p++)
        if (!islower ((unsigned char) *p) && !isdigit ((unsigned char) *p) && *p != '-')
            return false;
    return true;
}

//  Finds an account by id or email. Returns NULL with *error set when it isn't there,
//  or when the caller may not see it (answered as not found: no probing other accounts).
static int s_find_account (brk_ctx_t *ctx, sbx_msg_t *request, const char *which,
                           brk_account_t *account, sbx_msg_t **error)
{
    int rc = brk_store_account_find (ctx->store, which, account);
    if (rc == 0 && s_may_act_on (request->caller, account->id))
        return 0;
    if (rc == 0)
        brk_account_clear (account);
    *error = rc < 0 ? sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "account lookup failed")
                    : sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                         "no account '%s' (give its id acc_… or its email)", which);
    return -1;
}

//  Makes a key for an account inside the open transaction, with its event. Fills the
//  reply fields. Returns 0 or -1.
static int s_make_key (brk_ctx_t *ctx, const char *account_id, sbx_key_preset_t preset,
                       const char *name, uint64_t expires_ms, char **key_id_p, char **secret_p)
{
    char *key_id = sbx_secret_id ("key_");
    char *secret = sbx_secret_token ("sbx_", 43);
    if (!key_id || !secret) {
        free (key_id);
        free (secret);
        return -1;
    }
    char hash[65];
    sbx_secret_hash (secret, hash);
    char prefix[9];
    snprintf (prefix, sizeof prefix, "%s", secret);
    brk_key_t key = {
        .id = key_id,
        .account_id = (char *) account_id,
        .kind = "api_key",
        .name = (char *) name,
        .preset = (char *) sbx_key_preset_name (preset),
        .prefix = prefix,
        .hash = hash,
        .created_ms = sbx_clock_now_ms (),
        .expires_ms = expires_ms,
    };
    int rc = brk_store_key_insert (ctx->store, &key);
    if (rc == 0) {
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_KEY_CREATED);
        sbx_key_created_t *body = sbx_msg_key_created (event);
        sbx_str_set (&body->key_id, key_id);
        sbx_str_set (&body->account_id, account_id);
        body->preset = preset;
        sbx_str_set (&body->name, name);
        body->expires_ms = expires_ms;
        rc = brk_events_add (ctx->events, &event, account_id, key_id);
    }
    if (rc) {
        free (key_id);
        free (secret);
        return -1;
    }
    *key_id_p = key_id;
    *secret_p = secret;
    return 0;
}

sbx_msg_t *brk_accounts_create (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_account_create_t *args = sbx_msg_account_create (request);
    if (!request->caller)
        return s_no_caller (request);
    if (!brk_accounts_operator (request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "only an operator can create accounts");
    char email[256];
    if (s_normalize_email (args->email, email, sizeof email))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "'%s' is not an email address (name@domain)", args->email);
    const char *plan = args->plan && *args->plan ? args->plan : "free";
    if (!s_valid_plan (plan))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "plan '%s' is not a plan name (a-z, 0-9, -)", plan);
    if (args->password_hash && strncmp (args->password_hash, "$argon2id$", 10) != 0)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "password_hash must be an argon2id hash ($argon2id$…)");

    char *account_id = sbx_secret_id ("acc_");
    brk_account_t account = {.id = account_id,
                             .email = email,
                             .password_hash = args->password_hash,
                             .plan = (char *) plan,
                             .admin = args->admin,
                             .created_ms = sbx_clock_now_ms ()};
    char *key_id = NULL, *secret = NULL;
    sbx_msg_t *reply = NULL;
    if (!account_id || brk_events_begin (ctx->events)) {
        free (account_id);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot start a transaction");
    }
    int rc = brk_store_account_insert (ctx->store, &account);
    if (rc == 1)
        reply = sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                   "an account with email %s exists already", email);
    else if (rc == 0) {
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_ACCOUNT_CREATED);
        sbx_account_created_t *body = sbx_msg_account_created (event);
        sbx_str_set (&body->account_id, account_id);
        sbx_str_set (&body->email, email);
        sbx_str_set (&body->plan, plan);
        body->admin = args->admin;
        rc = brk_events_add (ctx->events, &event, account_id, account_id);
        if (rc == 0 && args->with_key)
            rc =
                s_make_key (ctx, account_id, SBX_KEY_PRESET_FULL, "first key", 0, &key_id, &secret);
    }
    if (!reply && (rc || brk_events_commit (ctx->events)))
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store the account");
    if (reply)
        brk_events_rollback (ctx->events);
    else {
        reply = sbx_msg_new_reply (request, SBX_MSG_ACCOUNT_CREATE_OK);
        sbx_account_create_ok_t *ok = sbx_msg_account_create_ok (reply);
        sbx_str_set (&ok->account_id, account_id);
        sbx_str_set (&ok->email, email);
        sbx_str_set (&ok->plan, plan);
        sbx_str_set (&ok->key_id, key_id);
        sbx_str_set (&ok->api_key, secret);
        sbx_info ("rid=%llu account=%s created (%s, plan %s)", (unsigned long long) request->rid,
                  account_id, email, plan);
    }
    if (secret)
        sbx_secret_wipe (secret);
    free (secret);
    free (key_id);
    free (account_id);
    return reply;
}

sbx_msg_t *brk_accounts_key_create (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_key_create_t *args = sbx_msg_key_create (request);
    if (!request->caller)
        return s_no_caller (request);
    if (args->expires_in_s > S_TEN_YEARS_S)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "expires_in_s is at most ten years (%llu s)",
                                  (unsigned long long) S_TEN_YEARS_S);
    brk_account_t account;
    sbx_msg_t *reply = NULL;
    if (s_find_account (ctx, request, args->account, &account, &reply))
        return reply;
    uint64_t expires_ms = args->expires_in_s ? sbx_clock_now_ms () + args->expires_in_s * 1000 : 0;
    char *key_id = NULL, *secret = NULL;
    if (brk_events_begin (ctx->events) ||
        s_make_key (ctx, account.id, args->preset, args->name, expires_ms, &key_id, &secret) ||
        brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store the key");
    } else {
        reply = sbx_msg_new_reply (request, SBX_MSG_KEY_CREATE_OK);
        sbx_key_create_ok_t *ok = sbx_msg_key_create_ok (reply);
        sbx_str_set (&ok->key_id, key_id);
        sbx_str_set (&ok->key, secret);
        sbx_str_set (&ok->account_id, account.id);
        ok->preset = args->preset;
        sbx_str_set (&ok->name, args->name);
        ok->expires_ms = expires_ms;
        sbx_info ("rid=%llu account=%s key=%s created (%s)", (unsigned long long) request->rid,
                  account.id, key_id, sbx_key_preset_name (args->preset));
    }
    if (secret)
        sbx_secret_wipe (secret);
    free (secret);
    free (key_id);
    brk_account_clear (&account);
    return reply;
}

typedef struct {
    sbx_key_info_list_t *list;
    int failed;
} s_list_ctx_t;

static void s_add_key (const brk_key_t *key, void *arg)
{
    s_list_ctx_t *ctx = arg;
    sbx_key_info_t *info = sbx_key_info_list_append (ctx->list);
    if (!info) {
        ctx->failed = 1;
        return;
    }
    sbx_str_set (&info->key_id, key->id);
    sbx_key_kind_from_name (key->kind, &info->kind);
    sbx_str_set (&info->name, key->name);
    if (key->preset)
        sbx_key_preset_from_name (key->preset, &info->preset);
    sbx_str_set (&info->prefix, key->prefix);
    info->created_ms = key->created_ms;
    info->expires_ms = key->expires_ms;
    info->last_used_ms = key->last_used_ms;
    info->revoked = key->revoked_ms != 0;
}

sbx_msg_t *brk_accounts_key_list (brk_ctx_t *ctx, sbx_msg_t *request)
{
    if (!request->caller)
        return s_no_caller (request);
    brk_account_t account;
    sbx_msg_t *reply = NULL;
    if (s_find_account (ctx, request, sbx_msg_key_list (request)->account, &account, &reply))
        return reply;
    reply = sbx_msg_new_reply (request, SBX_MSG_KEY_LIST_OK);
    s_list_ctx_t list = {&sbx_msg_key_list_ok (reply)->keys, 0};
    if (brk_store_key_list (ctx->store, account.id, s_add_key, &list) < 0 || list.failed) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list keys");
    }
    brk_account_clear (&account);
    return reply;
}

sbx_msg_t *brk_accounts_key_revoke (brk_ctx_t *ctx, sbx_msg_t *request)
{
    if (!request->caller)
        return s_no_caller (request);
    //  A narrowed key (ci, read-only, no-delete) or an OAuth connection must not revoke
    //  the account's other credentials; a full key, the account page and operators may.
    const sbx_caller_t *caller = request->caller;
    if (caller->kind == SBX_CALLER_KIND_OAUTH ||
        (caller->kind == SBX_CALLER_KIND_API_KEY && caller->preset != SBX_KEY_PRESET_FULL))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "only a full key can revoke keys; this credential is narrower");
    const char *key_id = sbx_msg_key_revoke (request)->key_id;
    brk_key_t key;
    int rc = brk_store_key_find (ctx->store, key_id, &key);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "key lookup failed");
    if (rc == 1 || !s_may_act_on (request->caller, key.account_id)) {
        if (rc == 0)
            brk_key_clear (&key);
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no key '%s' (see `sbx key list --account EMAIL`)", key_id);
    }
    sbx_msg_t *reply = NULL;
    bool was_active = key.revoked_ms == 0;
    if (brk_events_begin (ctx->events) ||
        brk_store_key_revoke (ctx->store, key_id, sbx_clock_now_ms ()) != 0)
        rc = -1;
    else if (streq (key.kind, "connection") &&
             brk_oauth_grant_revoke (ctx, key_id, sbx_clock_now_ms ()))
        rc = -1; //  Disconnect: the connection's tokens stop with it
    else if (was_active) {
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_KEY_REVOKED);
        sbx_str_set (&sbx_msg_key_revoked (event)->key_id, key_id);
        sbx_str_set (&sbx_msg_key_revoked (event)->account_id, key.account_id);
        rc = brk_events_add (ctx->events, &event, key.account_id, key_id);
    }
    if (rc || brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot revoke the key");
    } else {
        reply = sbx_msg_new_reply (request, SBX_MSG_KEY_REVOKE_OK);
        sbx_str_set (&sbx_msg_key_revoke_ok (reply)->key_id, key_id);
        sbx_info ("rid=%llu account=%s key=%s revoked", (unsigned long long) request->rid,
                  key.account_id, key_id);
    }
    brk_key_clear (&key);
    return reply;
}

sbx_msg_t *brk_accounts_auth_key (brk_ctx_t *ctx, sbx_msg_t *request)
{
    const char *secret = sbx_msg_auth_key (request)->key;
    if (strncmp (secret, "sbx_at_", 7) == 0)
        return brk_oauth_auth_token (ctx, request);
    //  One message for every kind of bad key: no hint which part was wrong.
    const char *refusal = "this API key is not valid (unknown, expired or revoked)";
    if (strncmp (secret, "sbx_", 4) != 0)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s", refusal);
    char hash[65];
    sbx_secret_hash (secret, hash);
    brk_key_t key;
    int rc = brk_store_key_find_by_hash (ctx->store, hash, &key);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "key lookup failed");
    uint64_t now = sbx_clock_now_ms ();
    if (rc == 1 || key.revoked_ms || (key.expires_ms && key.expires_ms <= now) ||
        strcmp (key.kind, "api_key") != 0) {
        if (rc == 0)
            brk_key_clear (&key);
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s", refusal);
    }
    //  A good key of a disabled account: said so, so its holder knows whom to ask.
    sbx_msg_t *refused = brk_accounts_refuse_disabled (ctx, key.account_id, request->rid);
    if (refused) {
        brk_key_clear (&key);
        return refused;
    }
    //  last_used is advisory: at most one write a minute per key, not one per request.
    if (now - key.last_used_ms > 60000)
        brk_store_key_touch (ctx->store, key.id, now);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_AUTH_KEY_OK);
    sbx_auth_key_ok_t *ok = sbx_msg_auth_key_ok (reply);
    ok->caller = calloc (1, sizeof (sbx_caller_t));
    if (ok->caller) {
        ok->caller->kind = SBX_CALLER_KIND_API_KEY;
        sbx_str_set (&ok->caller->account_id, key.account_id);
        sbx_str_set (&ok->caller->key_id, key.id);
        if (key.preset)
            sbx_key_preset_from_name (key.preset, &ok->caller->preset);
    }
    ok->expires_ms = key.expires_ms;
    //  The gateway enforces the plan's request rate per key; it learns it here.
    brk_account_t account;
    if (brk_store_account_find (ctx->store, key.account_id, &account) == 0) {
        brk_plan_t plan;
        brk_limits_plan (ctx->config, &account, &plan);
        ok->requests_per_second = plan.unlimited ? 0 : plan.requests_per_second;
        brk_account_clear (&account);
    }
    brk_key_clear (&key);
    return reply;
}

//  A wallet's name: what billing's ids and an operator's shell take without quoting.
static bool s_wallet_name_ok (const char *name)
{
    size_t length = name ? strlen (name) : 0;
    if (length < 1 || length > 32)
        return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_'))
            return false;
    return true;
}

//  Logs a wallet event for account_or_email (credit or activation). A log entry, not a
//  row here: billing applies it from the log like every charge, so a replay of the log
//  rebuilds balances and the active wallet. *account_id_p gets the account's id.
static sbx_msg_t *s_wallet_event (brk_ctx_t *ctx, sbx_msg_t *request, const char *account_or_email,
                                  const char *wallet, sbx_msg_t **event_p, char **account_id_p)
{
    if (!request->caller)
        return s_no_caller (request);
    if (!brk_accounts_operator (request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "only an operator can change an account's wallets");
    if (wallet && !s_wallet_name_ok (wallet))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "a wallet's name is 1 to 32 of a-z, 0-9, - and _");
    brk_account_t account;
    sbx_msg_t *reply = NULL;
    if (s_find_account (ctx, request, account_or_email, &account, &reply))
        return reply;
    sbx_msg_t *event = *event_p;
    if (event->type == SBX_MSG_WALLET_CREDITED)
        sbx_str_set (&sbx_msg_wallet_credited (event)->account_id, account.id);
    else
        sbx_str_set (&sbx_msg_wallet_activated (event)->account_id, account.id);
    if (brk_events_begin (ctx->events) ||
        brk_events_add (ctx->events, event_p, account.id, account.id) ||
        brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record the change");
    } else
        *account_id_p = strdup (account.id);
    brk_account_clear (&account);
    return reply;
}

sbx_msg_t *brk_accounts_wallet_credit (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_wallet_credit_t *args = sbx_msg_wallet_credit (request);
    if (args->micro_usd == 0 || args->micro_usd > 1000000ULL * 1000000ULL)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "the amount is more than 0 and at most 1,000,000 USD");
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_WALLET_CREDITED);
    sbx_wallet_credited_t *body = event ? sbx_msg_wallet_credited (event) : NULL;
    if (!body || sbx_str_set (&body->note, args->note) ||
        sbx_str_set (&body->wallet, args->wallet)) {
        sbx_msg_destroy (&event);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    body->micro_usd = args->micro_usd;
    char *account_id = NULL;
    sbx_msg_t *reply =
        s_wallet_event (ctx, request, args->account, args->wallet, &event, &account_id);
    if (!reply) {
        reply = sbx_msg_new_reply (request, SBX_MSG_WALLET_CREDIT_OK);
        sbx_wallet_credit_ok_t *ok = sbx_msg_wallet_credit_ok (reply);
        sbx_str_set (&ok->account_id, account_id);
        sbx_str_set (&ok->wallet, args->wallet);
        ok->micro_usd = args->micro_usd;
        ok->seq = brk_store_last_seq (ctx->store);
        sbx_info ("rid=%llu account=%s wallet %s credited %llu µ$",
                  (unsigned long long) request->rid, account_id,
                  args->wallet ? args->wallet : "(active)", (unsigned long long) args->micro_usd);
    }
    sbx_msg_destroy (&event);
    free (account_id);
    return reply;
}

sbx_msg_t *brk_accounts_wallet_activate (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_wallet_activate_t *args = sbx_msg_wallet_activate (request);
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_WALLET_ACTIVATED);
    if (!event || sbx_str_set (&sbx_msg_wallet_activated (event)->wallet, args->wallet)) {
        sbx_msg_destroy (&event);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    char *account_id = NULL;
    sbx_msg_t *reply =
        s_wallet_event (ctx, request, args->account, args->wallet, &event, &account_id);
    if (!reply) {
        reply = sbx_msg_new_reply (request, SBX_MSG_WALLET_ACTIVATE_OK);
        sbx_wallet_activate_ok_t *ok = sbx_msg_wallet_activate_ok (reply);
        sbx_str_set (&ok->account_id, account_id);
        sbx_str_set (&ok->wallet, args->wallet);
        ok->seq = brk_store_last_seq (ctx->store);
        sbx_info ("rid=%llu account=%s charges now go to wallet %s",
                  (unsigned long long) request->rid, account_id, args->wallet);
    }
    sbx_msg_destroy (&event);
    free (account_id);
    return reply;
}
