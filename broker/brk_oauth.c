/*  brk_oauth - see brk_oauth.h */
#include "brk_oauth.h"
#include "brk_accounts.h"
#include "brk_limits.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "sbx_secret.h"
#include "sbx_urls.h"

#include <assert.h>

#define S_CODE_TTL_MS       60000ULL
#define S_ACCESS_TTL_S      3600ULL
#define S_REFRESH_TTL_S     (30ULL * 86400)
#define S_SECRET_CHARS      43 //  base62: ~256 bits
#define S_MAX_REDIRECT_URIS 10
//  Expired codes and tokens are deleted a day after they expire (a rotated refresh
//  token must be kept until then to recognise its reuse), at most once an hour.
#define S_PURGE_AFTER_MS (86400ULL * 1000)
#define S_PURGE_EVERY_MS (3600ULL * 1000)

static sbx_msg_t *s_untrusted (sbx_msg_t *request)
{
    return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                              "%s is answered to gateways only", sbx_msg_type_name (request->type));
}

//  One refusal for every bad code or token at the token endpoint: the gateway answers
//  invalid_grant with the message, so it says what went wrong without revealing secrets.
static sbx_msg_t *s_refuse (sbx_msg_t *request, const char *message)
{
    return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s", message);
}

//  A client name people will read on the consent page and in the key list: 1 to 100
//  printable characters (UTF-8 allowed), no control characters.
static bool s_name_ok (const char *name)
{
    size_t len = name ? strlen (name) : 0;
    if (len == 0 || len > 100)
        return false;
    for (const unsigned char *p = (const unsigned char *) name; *p; p++)
        if (*p < ' ' || *p == 0x7f)
            return false;
    return true;
}

sbx_msg_t *brk_oauth_client_register (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    sbx_oauth_client_register_t *args = sbx_msg_oauth_client_register (request);
    if (!s_name_ok (args->name))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "client_name must be 1 to 100 printable characters");
    if (args->redirect_uris.count == 0 || args->redirect_uris.count > S_MAX_REDIRECT_URIS)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "redirect_uris must list 1 to %d URIs", S_MAX_REDIRECT_URIS);
    //  Stored one per line: a URI can hold no newline (checked here).
    size_t total = 1;
    for (size_t i = 0; i < args->redirect_uris.count; i++) {
        char why[300];
        if (sbx_urls_redirect_check (args->redirect_uris.items[i], why, sizeof why))
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "%s", why);
        total += strlen (args->redirect_uris.items[i]) + 1;
    }
    char *uris = calloc (1, total);
    char *client_id = sbx_secret_id ("cli_");
    if (!uris || !client_id) {
        free (uris);
        free (client_id);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < args->redirect_uris.count; i++) {
        if (i)
            strcat (uris, "\n");
        strcat (uris, args->redirect_uris.items[i]);
    }
    brk_oauth_client_t client = {.client_id = client_id,
                                 .name = args->name,
                                 .redirect_uris = uris,
                                 .created_ms = sbx_clock_now_ms ()};
    sbx_msg_t *reply;
    if (brk_store_begin (ctx->store) || brk_store_oauth_client_insert (ctx->store, &client) ||
        brk_store_commit (ctx->store)) {
        brk_store_rollback (ctx->store);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store the client");
    } else {
        reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_CLIENT_REGISTER_OK);
        sbx_oauth_client_register_ok_t *ok = sbx_msg_oauth_client_register_ok (reply);
        sbx_str_set (&ok->client_id, client_id);
        sbx_str_set (&ok->name, args->name);
        for (size_t i = 0; i < args->redirect_uris.count; i++)
            sbx_strlist_append (&ok->redirect_uris, args->redirect_uris.items[i]);
        ok->created_ms = client.created_ms;
        sbx_info ("rid=%llu oauth client %s registered (%s)", (unsigned long long) request->rid,
                  client_id, args->name);
    }
    free (uris);
    free (client_id);
    return reply;
}

sbx_msg_t *brk_oauth_client_get (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    const char *client_id = sbx_msg_oauth_client_get (request)->client_id;
    brk_oauth_client_t client;
    int rc = brk_store_oauth_client_find (ctx->store, client_id, &client);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "client lookup failed");
    if (rc == 1)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no OAuth client '%.100s' is registered here", client_id);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_CLIENT_GET_OK);
    sbx_oauth_client_get_ok_t *ok = sbx_msg_oauth_client_get_ok (reply);
    sbx_str_set (&ok->client_id, client.client_id);
    sbx_str_set (&ok->name, client.name);
    ok->created_ms = client.created_ms;
    for (char *uri = client.redirect_uris, *next; uri && *uri; uri = next) {
        next = strchr (uri, '\n');
        if (next)
            *next++ = 0;
        sbx_strlist_append (&ok->redirect_uris, uri);
    }
    brk_oauth_client_clear (&client);
    return reply;
}

sbx_msg_t *brk_oauth_password (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    const char *email = sbx_msg_oauth_password (request)->email;
    brk_account_t account;
    //  Emails only: an account id typed in the form is not a sign-in name.
    int rc = strchr (email, '@') ? brk_store_account_find (ctx->store, email, &account) : 1;
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "account lookup failed");
    if (rc == 1 || !account.password_hash) {
        if (rc == 0)
            brk_account_clear (&account);
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no account with a password has this email");
    }
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_PASSWORD_OK);
    sbx_oauth_password_ok_t *ok = sbx_msg_oauth_password_ok (reply);
    sbx_str_set (&ok->account_id, account.id);
    sbx_str_set (&ok->email, account.email);
    sbx_str_set (&ok->password_hash, account.password_hash);
    ok->disabled = account.disabled_ms != 0;
    brk_account_clear (&account);
    return reply;
}

//  Makes a secret with prefix, stores its hash as a token of `kind` (in the open
//  transaction) and returns it, or NULL.
static char *s_issue (brk_ctx_t *ctx, const char *prefix, const brk_oauth_token_t *model)
{
    char *secret = sbx_secret_token (prefix, S_SECRET_CHARS);
    if (!secret)
        return NULL;
    char hash[65];
    sbx_secret_hash (secret, hash);
    brk_oauth_token_t token = *model;
    token.hash = hash;
    if (brk_store_oauth_token_insert (ctx->store, &token)) {
        free (secret);
        return NULL;
    }
    return secret;
}

sbx_msg_t *brk_oauth_authorize (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    sbx_oauth_authorize_t *args = sbx_msg_oauth_authorize (request);
    if (strlen (args->code_challenge) != 43)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "code_challenge must be a base64url SHA-256 (43 characters)");
    if (!s_name_ok (args->client_name))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "client_name must be 1 to 100 printable characters");
    brk_account_t account;
    int rc = brk_store_account_find (ctx->store, args->account_id, &account);
    if (rc)
        return sbx_msg_new_error (request->rid, rc < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                  "no account %.64s", args->account_id);
    //  Signed in before it was disabled: nothing new is granted to it.
    sbx_msg_t *refused = brk_accounts_refuse_disabled (ctx, account.id, request->rid);
    if (refused) {
        brk_account_clear (&account);
        return refused;
    }
    uint64_t now = sbx_clock_now_ms ();
    char name[128];
    snprintf (name, sizeof name, "%s (MCP)", args->client_name);
    //  Allowing a client again reuses its live connection: one line per client in the
    //  key list, however often its tokens are renewed by signing in.
    char *grant_id = NULL;
    int found = brk_store_oauth_grant_find (ctx->store, account.id, args->client_id, &grant_id);
    if (found < 0) {
        brk_account_clear (&account);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "grant lookup failed");
    }
    if (found == 1)
        grant_id = sbx_secret_id ("key_");
    //  The grant's row in api_keys needs a unique hash: one of a secret nobody keeps.
    char *unused = sbx_secret_token ("sbx_", S_SECRET_CHARS);
    char hash[65];
    sbx_secret_hash (unused, hash);
    brk_key_t key = {.id = grant_id,
                     .account_id = account.id,
                     .kind = "connection",
                     .name = name,
                     .preset = "full",
                     .hash = hash,
                     .created_ms = now};
    brk_oauth_token_t model = {.kind = "code",
                               .grant_id = grant_id,
                               .client_id = args->client_id,
                               .redirect_uri = args->redirect_uri,
                               .challenge = args->code_challenge,
                               .resource = args->resource,
                               .scope = args->scope,
                               .created_ms = now,
                               .expires_ms = now + S_CODE_TTL_MS};
    char *code = NULL;
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_KEY_CREATED);
    if (event) {
        sbx_key_created_t *body = sbx_msg_key_created (event);
        sbx_str_set (&body->key_id, grant_id);
        sbx_str_set (&body->account_id, account.id);
        body->preset = SBX_KEY_PRESET_FULL;
        sbx_str_set (&body->name, name);
    }
    sbx_msg_t *reply = NULL;
    if (!grant_id || !unused || !event || brk_events_begin (ctx->events))
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot start a transaction");
    else if ((found == 1 && (brk_store_key_insert (ctx->store, &key) ||
                             brk_events_add (ctx->events, &event, account.id, grant_id))) ||
             !(code = s_issue (ctx, "sbx_ac_", &model)) || brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store the grant");
    } else {
        reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_AUTHORIZE_OK);
        sbx_oauth_authorize_ok_t *ok = sbx_msg_oauth_authorize_ok (reply);
        sbx_str_set (&ok->code, code);
        sbx_str_set (&ok->grant_id, grant_id);
        ok->expires_ms = model.expires_ms;
        sbx_info ("rid=%llu account=%s connection %s for client %.100s (%s)",
                  (unsigned long long) request->rid, account.id, grant_id, args->client_id, name);
    }
    sbx_msg_destroy (&event);
    if (code)
        sbx_secret_wipe (code);
    free (code);
    if (unused)
        sbx_secret_wipe (unused);
    free (unused);
    free (grant_id);
    brk_account_clear (&account);
    return reply;
}

int brk_oauth_grant_revoke (brk_ctx_t *ctx, const char *grant_id, uint64_t now_ms)
{
    return brk_store_oauth_grant_revoke (ctx->store, grant_id, now_ms);
}

//  Logs oauth.revoked for a connection whose tokens were revoked (inside the caller's
//  transaction): the tap tells every gateway to forget what it cached of them.
static int s_revoked_event (brk_ctx_t *ctx, const char *grant_id, const char *reason)
{
    brk_key_t key;
    if (brk_store_key_find (ctx->store, grant_id, &key) != 0)
        return 0; //  no connection: nothing a gateway could have cached
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_OAUTH_REVOKED);
    int rc = event ? 0 : -1;
    if (rc == 0) {
        sbx_oauth_revoked_t *body = sbx_msg_oauth_revoked (event);
        if (sbx_str_set (&body->key_id, grant_id) ||
            sbx_str_set (&body->account_id, key.account_id) || sbx_str_set (&body->reason, reason))
            rc = -1;
    }
    if (rc == 0)
        rc = brk_events_add (ctx->events, &event, key.account_id, grant_id);
    sbx_msg_destroy (&event);
    brk_key_clear (&key);
    return rc;
}

//  Revokes a grant whose secrets leaked (a code replayed, a rotated refresh token
//  reused): its tokens, and with revoke_connection the connection itself (logged as
//  key.revoked). Its own transaction.
static void s_revoke_grant (brk_ctx_t *ctx, const char *grant_id, bool revoke_connection,
                            const char *why)
{
    uint64_t now = sbx_clock_now_ms ();
    brk_key_t key;
    if (brk_store_key_find (ctx->store, grant_id, &key) != 0)
        return;
    int rc = brk_events_begin (ctx->events);
    if (rc == 0)
        rc = brk_store_oauth_grant_revoke (ctx->store, grant_id, now);
    if (rc == 0 && !revoke_connection)
        rc = s_revoked_event (ctx, grant_id, why);
    if (rc == 0 && revoke_connection && key.revoked_ms == 0) {
        rc = brk_store_key_revoke (ctx->store, grant_id, now);
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_KEY_REVOKED);
        sbx_str_set (&sbx_msg_key_revoked (event)->key_id, grant_id);
        sbx_str_set (&sbx_msg_key_revoked (event)->account_id, key.account_id);
        if (rc == 0)
            rc = brk_events_add (ctx->events, &event, key.account_id, grant_id);
        sbx_msg_destroy (&event);
    }
    if (rc || brk_events_commit (ctx->events))
        brk_events_rollback (ctx->events);
    else
        sbx_warn ("account=%s connection %s: %s; its tokens are revoked%s", key.account_id,
                  grant_id, why, revoke_connection ? " and it is disconnected" : "");
    brk_key_clear (&key);
}

//  The connection behind a token, if it is still live. 0 or -1.
static int s_live_grant (brk_ctx_t *ctx, const char *grant_id, brk_key_t *key)
{
    if (brk_store_key_find (ctx->store, grant_id, key) != 0)
        return -1;
    if (key->revoked_ms || strcmp (key->kind, "connection") != 0) {
        brk_key_clear (key);
        return -1;
    }
    return 0;
}

//  Issues an access and a refresh token for the grant of `from`, marks `from` (the
//  code or the old refresh token) used, all in one transaction.
static sbx_msg_t *s_tokens (brk_ctx_t *ctx, sbx_msg_t *request, const brk_oauth_token_t *from)
{
    uint64_t now = sbx_clock_now_ms ();
    uint64_t access_ttl = sbx_config_get_uint (ctx->config, "oauth.access_ttl_s", S_ACCESS_TTL_S);
    uint64_t refresh_ttl =
        sbx_config_get_uint (ctx->config, "oauth.refresh_ttl_s", S_REFRESH_TTL_S);
    if (access_ttl == 0 || access_ttl > 86400)
        access_ttl = S_ACCESS_TTL_S;
    if (refresh_ttl == 0 || refresh_ttl > 365 * 86400ULL)
        refresh_ttl = S_REFRESH_TTL_S;
    brk_oauth_token_t model = {.grant_id = from->grant_id,
                               .client_id = from->client_id,
                               .resource = from->resource,
                               .scope = from->scope,
                               .created_ms = now};
    char *access = NULL, *refresh = NULL;
    sbx_msg_t *reply = NULL;
    if (brk_events_begin (ctx->events))
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot start a transaction");
    int rc = brk_store_oauth_token_use (ctx->store, from->hash, now);
    static uint64_t s_purged_ms; //  one broker per process: when this last purged
    if (rc == 0 && now - s_purged_ms > S_PURGE_EVERY_MS) {
        brk_store_oauth_purge (ctx->store, now - S_PURGE_AFTER_MS); //  housekeeping only
        s_purged_ms = now;
    }
    if (rc == 0) {
        model.kind = "access";
        model.expires_ms = now + access_ttl * 1000;
        access = s_issue (ctx, "sbx_at_", &model);
        model.kind = "refresh";
        model.expires_ms = now + refresh_ttl * 1000;
        refresh = s_issue (ctx, "sbx_rt_", &model);
    }
    if (rc == 0 && access && refresh && brk_events_commit (ctx->events) == 0) {
        reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_TOKEN_OK);
        sbx_oauth_token_ok_t *ok = sbx_msg_oauth_token_ok (reply);
        sbx_str_set (&ok->access_token, access);
        sbx_str_set (&ok->refresh_token, refresh);
        ok->expires_in_s = access_ttl;
        sbx_str_set (&ok->scope, from->scope);
        sbx_str_set (&ok->grant_id, from->grant_id);
    } else {
        brk_events_rollback (ctx->events);
        reply = rc == 1 ? s_refuse (request, "this code or refresh token was used already")
                        : sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store tokens");
    }
    if (access)
        sbx_secret_wipe (access);
    if (refresh)
        sbx_secret_wipe (refresh);
    free (access);
    free (refresh);
    return reply;
}

//  PKCE verifiers are 43 to 128 of [A-Za-z0-9-._~] (RFC 7636 section 4.1).
static bool s_verifier_ok (const char *verifier)
{
    size_t len = verifier ? strlen (verifier) : 0;
    if (len < 43 || len > 128)
        return false;
    return strspn (verifier,
                   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~") == len;
}

static sbx_msg_t *s_code_grant (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_oauth_token_t *args = sbx_msg_oauth_token (request);
    if (!args->code || !*args->code)
        return s_refuse (request, "code is required");
    if (!s_verifier_ok (args->code_verifier))
        return s_refuse (request, "code_verifier is required: 43 to 128 characters of "
                                  "A-Z a-z 0-9 - . _ ~ (PKCE, RFC 7636)");
    char hash[65];
    sbx_secret_hash (args->code, hash);
    brk_oauth_token_t code;
    int rc = brk_store_oauth_token_find (ctx->store, hash, &code);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "code lookup failed");
    if (rc == 1 || strcmp (code.kind, "code") != 0) {
        if (rc == 0)
            brk_oauth_token_clear (&code);
        return s_refuse (request, "the authorization code is not valid");
    }
    sbx_msg_t *reply = NULL;
    char challenge[44];
    sbx_secret_s256 (args->code_verifier, challenge);
    brk_key_t grant;
    if (code.used_ms) {
        //  Someone holds a copy of the code: nothing issued from it can be trusted.
        s_revoke_grant (ctx, code.grant_id, false, "authorization code replayed");
        reply = s_refuse (request, "the authorization code was used already; the tokens "
                                   "issued for it are revoked");
    } else if (code.expires_ms <= sbx_clock_now_ms ())
        reply = s_refuse (request, "the authorization code expired (codes live a minute): "
                                   "authorize again");
    else if (strcmp (code.client_id, args->client_id) != 0)
        reply = s_refuse (request, "the authorization code was issued to another client");
    else if (args->redirect_uri && *args->redirect_uri &&
             strcmp (args->redirect_uri, code.redirect_uri ? code.redirect_uri : "") != 0)
        reply = s_refuse (request, "redirect_uri differs from the authorization request's");
    else if (!sbx_secret_equal (challenge, code.challenge))
        reply = s_refuse (request, "code_verifier does not match the code_challenge");
    else if (s_live_grant (ctx, code.grant_id, &grant))
        reply = s_refuse (request, "the connection was revoked: authorize again");
    else {
        reply = brk_accounts_refuse_disabled (ctx, grant.account_id, request->rid);
        brk_key_clear (&grant);
        if (!reply)
            reply = s_tokens (ctx, request, &code);
    }
    brk_oauth_token_clear (&code);
    return reply;
}

static sbx_msg_t *s_refresh_grant (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_oauth_token_t *args = sbx_msg_oauth_token (request);
    if (!args->refresh_token || !*args->refresh_token)
        return s_refuse (request, "refresh_token is required");
    char hash[65];
    sbx_secret_hash (args->refresh_token, hash);
    brk_oauth_token_t token;
    int rc = brk_store_oauth_token_find (ctx->store, hash, &token);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "token lookup failed");
    if (rc == 1 || strcmp (token.kind, "refresh") != 0) {
        if (rc == 0)
            brk_oauth_token_clear (&token);
        return s_refuse (request, "the refresh token is not valid");
    }
    sbx_msg_t *reply = NULL;
    brk_key_t grant;
    if (strcmp (token.client_id, args->client_id) != 0)
        reply = s_refuse (request, "the refresh token was issued to another client");
    else if (token.used_ms) {
        //  Rotated already: this is a copy, the client's or a thief's.
        s_revoke_grant (ctx, token.grant_id, true, "rotated refresh token reused");
        reply = s_refuse (request, "the refresh token was used already; the connection is "
                                   "revoked: sign in again");
    } else if (token.revoked_ms)
        reply = s_refuse (request, "the refresh token was revoked");
    else if (token.expires_ms <= sbx_clock_now_ms ())
        reply = s_refuse (request, "the refresh token expired: sign in again");
    else if (s_live_grant (ctx, token.grant_id, &grant))
        reply = s_refuse (request, "the connection was revoked: sign in again");
    else {
        //  Refused while the account is disabled, not revoked: it works again once enabled.
        reply = brk_accounts_refuse_disabled (ctx, grant.account_id, request->rid);
        brk_key_clear (&grant);
        if (!reply)
            reply = s_tokens (ctx, request, &token);
    }
    brk_oauth_token_clear (&token);
    return reply;
}

sbx_msg_t *brk_oauth_token (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    const char *grant_type = sbx_msg_oauth_token (request)->grant_type;
    if (streq (grant_type, "authorization_code"))
        return s_code_grant (ctx, request);
    if (streq (grant_type, "refresh_token"))
        return s_refresh_grant (ctx, request);
    return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                              "grant_type must be authorization_code or refresh_token");
}

sbx_msg_t *brk_oauth_revoke (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    if (!trusted)
        return s_untrusted (request);
    char hash[65];
    sbx_secret_hash (sbx_msg_oauth_revoke (request)->token, hash);
    brk_oauth_token_t token;
    int rc = brk_store_oauth_token_find (ctx->store, hash, &token);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "token lookup failed");
    bool revoked = false;
    //  Codes are not revocable here (RFC 7009 covers tokens); unknown ones are fine.
    if (rc == 0 && strcmp (token.kind, "code") != 0 && !token.revoked_ms) {
        uint64_t now = sbx_clock_now_ms ();
        //  A refresh token stands for the grant: its access tokens go with it.
        int done = brk_events_begin (ctx->events);
        if (done == 0 && streq (token.kind, "refresh"))
            done = brk_store_oauth_grant_revoke (ctx->store, token.grant_id, now);
        else if (done == 0)
            done = brk_store_oauth_token_revoke (ctx->store, hash, now) < 0 ? -1 : 0;
        if (done == 0)
            done = s_revoked_event (ctx, token.grant_id, "revoked");
        if (done || brk_events_commit (ctx->events)) {
            brk_events_rollback (ctx->events);
            brk_oauth_token_clear (&token);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot revoke the token");
        }
        revoked = true;
        sbx_info ("rid=%llu connection %s: %s token revoked", (unsigned long long) request->rid,
                  token.grant_id, token.kind);
    }
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_OAUTH_REVOKE_OK);
    sbx_msg_oauth_revoke_ok (reply)->revoked = revoked;
    if (revoked)
        sbx_str_set (&sbx_msg_oauth_revoke_ok (reply)->key_id, token.grant_id);
    if (rc == 0)
        brk_oauth_token_clear (&token);
    return reply;
}

sbx_msg_t *brk_oauth_auth_token (brk_ctx_t *ctx, sbx_msg_t *request)
{
    const char *refusal = "this access token is not valid (unknown, expired or revoked)";
    char hash[65];
    sbx_secret_hash (sbx_msg_auth_key (request)->key, hash);
    brk_oauth_token_t token;
    int rc = brk_store_oauth_token_find (ctx->store, hash, &token);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "token lookup failed");
    uint64_t now = sbx_clock_now_ms ();
    brk_key_t grant;
    if (rc == 1 || strcmp (token.kind, "access") != 0 || token.revoked_ms ||
        token.expires_ms <= now || s_live_grant (ctx, token.grant_id, &grant)) {
        if (rc == 0)
            brk_oauth_token_clear (&token);
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s", refusal);
    }
    sbx_msg_t *refused = brk_accounts_refuse_disabled (ctx, grant.account_id, request->rid);
    if (refused) {
        brk_key_clear (&grant);
        brk_oauth_token_clear (&token);
        return refused;
    }
    if (now - grant.last_used_ms > 60000)
        brk_store_key_touch (ctx->store, grant.id, now);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_AUTH_KEY_OK);
    sbx_auth_key_ok_t *ok = sbx_msg_auth_key_ok (reply);
    ok->caller = calloc (1, sizeof (sbx_caller_t));
    if (ok->caller) {
        ok->caller->kind = SBX_CALLER_KIND_OAUTH;
        sbx_str_set (&ok->caller->account_id, grant.account_id);
        sbx_str_set (&ok->caller->key_id, grant.id);
        ok->caller->preset = SBX_KEY_PRESET_FULL;
    }
    ok->expires_ms = token.expires_ms;
    sbx_str_set (&ok->resource, token.resource);
    brk_account_t account;
    if (brk_store_account_find (ctx->store, grant.account_id, &account) == 0) {
        brk_plan_t plan;
        brk_limits_plan (ctx->config, &account, &plan);
        ok->requests_per_second = plan.unlimited ? 0 : plan.requests_per_second;
        brk_account_clear (&account);
    }
    brk_key_clear (&grant);
    brk_oauth_token_clear (&token);
    return reply;
}

//  --------------------------------------------------------------------------
//  Self test: the handlers on a real store, as a gateway would call them.

static sbx_msg_t *s_test_token (brk_ctx_t *ctx, const char *grant_type, const char *client_id,
                                const char *code, const char *verifier, const char *refresh)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_TOKEN);
    request->rid = 1;
    sbx_oauth_token_t *args = sbx_msg_oauth_token (request);
    sbx_str_set (&args->grant_type, grant_type);
    sbx_str_set (&args->client_id, client_id);
    sbx_str_set (&args->code, code);
    sbx_str_set (&args->code_verifier, verifier);
    sbx_str_set (&args->refresh_token, refresh);
    sbx_msg_t *reply = brk_oauth_token (ctx, request, true);
    sbx_msg_destroy (&request);
    return reply;
}

static sbx_msg_t *s_test_auth (brk_ctx_t *ctx, const char *token)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_AUTH_KEY);
    sbx_str_set (&sbx_msg_auth_key (request)->key, token);
    sbx_msg_t *reply = brk_oauth_auth_token (ctx, request);
    sbx_msg_destroy (&request);
    return reply;
}

static char *s_test_code (brk_ctx_t *ctx, const char *account_id, const char *client_id,
                          const char *challenge, char **grant_id)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_AUTHORIZE);
    sbx_oauth_authorize_t *args = sbx_msg_oauth_authorize (request);
    sbx_str_set (&args->account_id, account_id);
    sbx_str_set (&args->client_id, client_id);
    sbx_str_set (&args->client_name, "Test Client");
    sbx_str_set (&args->redirect_uri, "http://127.0.0.1:9/cb");
    sbx_str_set (&args->code_challenge, challenge);
    sbx_str_set (&args->resource, "https://localhost:8443/mcp");
    sbx_str_set (&args->scope, "sbx");
    sbx_msg_t *reply = brk_oauth_authorize (ctx, request, true);
    sbx_msg_destroy (&request);
    assert (reply->type == SBX_MSG_OAUTH_AUTHORIZE_OK);
    char *code = strdup (sbx_msg_oauth_authorize_ok (reply)->code);
    if (grant_id)
        *grant_id = strdup (sbx_msg_oauth_authorize_ok (reply)->grant_id);
    sbx_msg_destroy (&reply);
    return code;
}

void brk_oauth_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_oauth_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[300];
    snprintf (path, sizeof path, "%s/control.db", dir);
    brk_store_t *store = brk_store_new (path);
    assert (store);
    zsock_t *tap = zsock_new_pub ("inproc://brk_oauth_test");
    brk_events_t *events = brk_events_new (store, tap);
    sbx_config_t *config = sbx_config_new (dir);
    brk_ctx_t ctx = {.config = config, .store = store, .events = events};

    //  An account with a password.
    char *hash = sbx_secret_password_hash ("correct horse");
    brk_account_t account = {.id = "acc_test000001",
                             .email = "a@example.com",
                             .password_hash = hash,
                             .plan = "free",
                             .created_ms = 1};
    assert (brk_store_begin (store) == 0 && brk_store_account_insert (store, &account) == 0 &&
            brk_store_commit (store) == 0);

    //  Only gateways are answered.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_PASSWORD);
    sbx_str_set (&sbx_msg_oauth_password (request)->email, "A@example.com");
    sbx_msg_t *reply = brk_oauth_password (&ctx, request, false);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    reply = brk_oauth_password (&ctx, request, true);
    assert (reply->type == SBX_MSG_OAUTH_PASSWORD_OK);
    assert (sbx_secret_password_verify (sbx_msg_oauth_password_ok (reply)->password_hash,
                                        "correct horse"));
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);

    //  Registration: validated, stored, found again with its URIs.
    request = sbx_msg_new (SBX_MSG_OAUTH_CLIENT_REGISTER);
    sbx_str_set (&sbx_msg_oauth_client_register (request)->name, "Test Client");
    sbx_strlist_append (&sbx_msg_oauth_client_register (request)->redirect_uris,
                        "http://evil.example/cb");
    reply = brk_oauth_client_register (&ctx, request, true);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    request = sbx_msg_new (SBX_MSG_OAUTH_CLIENT_REGISTER);
    sbx_str_set (&sbx_msg_oauth_client_register (request)->name, "Test Client");
    sbx_strlist_append (&sbx_msg_oauth_client_register (request)->redirect_uris,
                        "http://127.0.0.1:9/cb");
    sbx_strlist_append (&sbx_msg_oauth_client_register (request)->redirect_uris,
                        "https://app.example/cb");
    reply = brk_oauth_client_register (&ctx, request, true);
    assert (reply->type == SBX_MSG_OAUTH_CLIENT_REGISTER_OK);
    char *client_id = strdup (sbx_msg_oauth_client_register_ok (reply)->client_id);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    request = sbx_msg_new (SBX_MSG_OAUTH_CLIENT_GET);
    sbx_str_set (&sbx_msg_oauth_client_get (request)->client_id, client_id);
    reply = brk_oauth_client_get (&ctx, request, true);
    assert (reply->type == SBX_MSG_OAUTH_CLIENT_GET_OK);
    assert (sbx_msg_oauth_client_get_ok (reply)->redirect_uris.count == 2);
    assert (streq (sbx_msg_oauth_client_get_ok (reply)->redirect_uris.items[1],
                   "https://app.example/cb"));
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);

    //  The code flow: a wrong verifier is refused, the right one gets tokens once.
    const char *verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const char *challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
    char *grant_id = NULL;
    char *code = s_test_code (&ctx, account.id, client_id, challenge, &grant_id);
    reply = s_test_token (&ctx, "authorization_code", client_id, code,
                          "wrong-verifier-wrong-verifier-wrong-verifier-x", NULL);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_UNAUTHENTICATED);
    sbx_msg_destroy (&reply);
    reply = s_test_token (&ctx, "authorization_code", "cli_other", code, verifier, NULL);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    reply = s_test_token (&ctx, "authorization_code", client_id, code, verifier, NULL);
    assert (reply->type == SBX_MSG_OAUTH_TOKEN_OK);
    char *access = strdup (sbx_msg_oauth_token_ok (reply)->access_token);
    char *refresh = strdup (sbx_msg_oauth_token_ok (reply)->refresh_token);
    assert (strncmp (access, "sbx_at_", 7) == 0 && strncmp (refresh, "sbx_rt_", 7) == 0);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (&ctx, access);
    assert (reply->type == SBX_MSG_AUTH_KEY_OK);
    assert (sbx_msg_auth_key_ok (reply)->caller->kind == SBX_CALLER_KIND_OAUTH);
    assert (streq (sbx_msg_auth_key_ok (reply)->caller->key_id, grant_id));
    assert (streq (sbx_msg_auth_key_ok (reply)->resource, "https://localhost:8443/mcp"));
    sbx_msg_destroy (&reply);

    //  Allowing the same client again reuses its connection.
    char *again_grant = NULL;
    char *again = s_test_code (&ctx, account.id, client_id, challenge, &again_grant);
    assert (streq (again_grant, grant_id));
    free (again);
    free (again_grant);

    //  Replaying the code revokes what it produced.
    reply = s_test_token (&ctx, "authorization_code", client_id, code, verifier, NULL);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_UNAUTHENTICATED);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (&ctx, access);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    free (access);
    free (refresh);
    free (code);
    free (grant_id);

    //  Refresh rotates; the old one reused revokes the grant.
    code = s_test_code (&ctx, account.id, client_id, challenge, &grant_id);
    reply = s_test_token (&ctx, "authorization_code", client_id, code, verifier, NULL);
    assert (reply->type == SBX_MSG_OAUTH_TOKEN_OK);
    refresh = strdup (sbx_msg_oauth_token_ok (reply)->refresh_token);
    sbx_msg_destroy (&reply);
    reply = s_test_token (&ctx, "refresh_token", client_id, NULL, NULL, refresh);
    assert (reply->type == SBX_MSG_OAUTH_TOKEN_OK);
    access = strdup (sbx_msg_oauth_token_ok (reply)->access_token);
    char *refresh2 = strdup (sbx_msg_oauth_token_ok (reply)->refresh_token);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (&ctx, access);
    assert (reply->type == SBX_MSG_AUTH_KEY_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_token (&ctx, "refresh_token", client_id, NULL, NULL, refresh);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    reply = s_test_auth (&ctx, access);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    reply = s_test_token (&ctx, "refresh_token", client_id, NULL, NULL, refresh2);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    brk_key_t grant;
    assert (brk_store_key_find (store, grant_id, &grant) == 0);
    assert (grant.revoked_ms && streq (grant.kind, "connection"));
    assert (streq (grant.name, "Test Client (MCP)"));
    brk_key_clear (&grant);
    free (access);
    free (refresh);
    free (refresh2);
    free (code);
    free (grant_id);

    //  Revocation: unknown tokens are fine; a revoked access token stops.
    code = s_test_code (&ctx, account.id, client_id, challenge, NULL);
    reply = s_test_token (&ctx, "authorization_code", client_id, code, verifier, NULL);
    access = strdup (sbx_msg_oauth_token_ok (reply)->access_token);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_OAUTH_REVOKE);
    sbx_str_set (&sbx_msg_oauth_revoke (request)->token, "sbx_at_unknown");
    reply = brk_oauth_revoke (&ctx, request, true);
    assert (reply->type == SBX_MSG_OAUTH_REVOKE_OK && !sbx_msg_oauth_revoke_ok (reply)->revoked);
    sbx_msg_destroy (&reply);
    sbx_str_set (&sbx_msg_oauth_revoke (request)->token, access);
    reply = brk_oauth_revoke (&ctx, request, true);
    assert (reply->type == SBX_MSG_OAUTH_REVOKE_OK && sbx_msg_oauth_revoke_ok (reply)->revoked);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    reply = s_test_auth (&ctx, access);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    free (access);

    //  Housekeeping: tokens long expired are deleted, live ones kept.
    char *grant2 = NULL;
    char *code2 = s_test_code (&ctx, account.id, client_id, challenge, &grant2);
    char hash_old[65], hash_live[65];
    sbx_secret_hash ("sbx_at_old", hash_old);
    sbx_secret_hash ("sbx_at_live", hash_live);
    brk_oauth_token_t old = {.hash = hash_old,
                             .kind = "access",
                             .grant_id = grant2,
                             .client_id = client_id,
                             .resource = "r",
                             .created_ms = 1,
                             .expires_ms = 2};
    brk_oauth_token_t live = old;
    live.hash = hash_live;
    live.expires_ms = sbx_clock_now_ms () + 60000;
    assert (brk_store_begin (store) == 0 && brk_store_oauth_token_insert (store, &old) == 0 &&
            brk_store_oauth_token_insert (store, &live) == 0 &&
            brk_store_oauth_purge (store, sbx_clock_now_ms ()) == 0 &&
            brk_store_commit (store) == 0);
    brk_oauth_token_t found;
    assert (brk_store_oauth_token_find (store, hash_old, &found) == 1);
    assert (brk_store_oauth_token_find (store, hash_live, &found) == 0);
    brk_oauth_token_clear (&found);
    free (code2);
    free (grant2);
    free (code);
    free (client_id);
    free (hash);

    brk_events_destroy (&events);
    zsock_destroy (&tap);
    brk_store_destroy (&store);
    sbx_config_destroy (&config);
    char cmd[400];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
