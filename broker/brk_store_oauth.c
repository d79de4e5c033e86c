/*  brk_store_oauth - brk_store's OAuth tables: registered clients, and authorization
    codes, access and refresh tokens (see brk_store.h; shared parts in brk_store_priv.h). */
#include "brk_store_priv.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int brk_store_oauth_client_insert (brk_store_t *self, const brk_oauth_client_t *client)
{
    if (!self || !client || !sbx_db_nonempty (client->client_id) ||
        !sbx_db_nonempty (client->name) || !client->redirect_uris ||
        !sbx_db_fits (client->created_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "oauth client insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_CLIENT_INSERT);
    sbx_db_bind_text (stmt, 1, client->client_id);
    sbx_db_bind_text (stmt, 2, client->name);
    sbx_db_bind_text (stmt, 3, client->redirect_uris);
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) client->created_ms);
    return sbx_db_try (self->db, ST_CLIENT_INSERT, "oauth client insert") == SQLITE_DONE ? 0 : -1;
}

static int s_client_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_oauth_client_t *out = row;
    bool failed = false;
    out->client_id = sbx_db_column_dup (stmt, 0, &failed);
    out->name = sbx_db_column_dup (stmt, 1, &failed);
    out->redirect_uris = sbx_db_column_dup (stmt, 2, &failed);
    out->created_ms = sbx_db_column_u64 (stmt, 3);
    if (failed)
        brk_oauth_client_clear (out);
    return failed ? -1 : 0;
}

int brk_store_oauth_client_find (brk_store_t *self, const char *client_id, brk_oauth_client_t *out)
{
    return brk_store_find (self, ST_CLIENT_FIND, client_id, s_client_from_row, out, sizeof *out,
                           "oauth client find");
}

void brk_oauth_client_clear (brk_oauth_client_t *self)
{
    if (!self)
        return;
    free (self->client_id);
    free (self->name);
    free (self->redirect_uris);
    memset (self, 0, sizeof *self);
}

static const char *s_token_kinds[] = {"code", "access", "refresh", NULL};

int brk_store_oauth_token_insert (brk_store_t *self, const brk_oauth_token_t *token)
{
    if (!self || !token || !sbx_db_nonempty (token->hash) ||
        !brk_store_one_of (token->kind, s_token_kinds) || !sbx_db_nonempty (token->grant_id) ||
        !sbx_db_nonempty (token->client_id) || !sbx_db_nonempty (token->resource) ||
        !sbx_db_fits (token->created_ms) || !sbx_db_fits (token->expires_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "oauth token insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_TOKEN_INSERT);
    sbx_db_bind_text (stmt, 1, token->hash);
    sbx_db_bind_text (stmt, 2, token->kind);
    sbx_db_bind_text (stmt, 3, token->grant_id);
    sbx_db_bind_text (stmt, 4, token->client_id);
    sbx_db_bind_text (stmt, 5, token->redirect_uri);
    sbx_db_bind_text (stmt, 6, token->challenge);
    sbx_db_bind_text (stmt, 7, token->resource);
    sbx_db_bind_text (stmt, 8, token->scope);
    sbx_stmt_bind_int64 (stmt, 9, (sqlite3_int64) token->created_ms);
    sbx_stmt_bind_int64 (stmt, 10, (sqlite3_int64) token->expires_ms);
    sbx_stmt_bind_int64 (stmt, 11, 0);
    sbx_stmt_bind_int64 (stmt, 12, 0);
    return sbx_db_try (self->db, ST_TOKEN_INSERT, "oauth token insert") == SQLITE_DONE ? 0 : -1;
}

static int s_token_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_oauth_token_t *out = row;
    bool failed = false;
    out->hash = sbx_db_column_dup (stmt, 0, &failed);
    out->kind = sbx_db_column_dup (stmt, 1, &failed);
    out->grant_id = sbx_db_column_dup (stmt, 2, &failed);
    out->client_id = sbx_db_column_dup (stmt, 3, &failed);
    out->redirect_uri = sbx_db_column_dup (stmt, 4, &failed);
    out->challenge = sbx_db_column_dup (stmt, 5, &failed);
    out->resource = sbx_db_column_dup (stmt, 6, &failed);
    out->scope = sbx_db_column_dup (stmt, 7, &failed);
    out->created_ms = sbx_db_column_u64 (stmt, 8);
    out->expires_ms = sbx_db_column_u64 (stmt, 9);
    out->used_ms = sbx_db_column_u64 (stmt, 10);
    out->revoked_ms = sbx_db_column_u64 (stmt, 11);
    if (failed)
        brk_oauth_token_clear (out);
    return failed ? -1 : 0;
}

int brk_store_oauth_token_find (brk_store_t *self, const char *hash, brk_oauth_token_t *out)
{
    return brk_store_find (self, ST_TOKEN_FIND, hash, s_token_from_row, out, sizeof *out,
                           "oauth token find");
}

//  One UPDATE keyed by text with a time: 0 when a row changed, 1 when none did.
static int s_update_at (brk_store_t *self, stmt_id_t id, const char *key, uint64_t now_ms,
                        const char *what)
{
    if (!self || !key || now_ms == 0 || !sbx_db_fits (now_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, what))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, id);
    sbx_db_bind_text (stmt, 1, key);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) now_ms);
    if (sbx_db_try (self->db, id, what) != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) > 0 ? 0 : 1;
}

int brk_store_oauth_token_use (brk_store_t *self, const char *hash, uint64_t now_ms)
{
    return s_update_at (self, ST_TOKEN_USE, hash, now_ms, "oauth token use");
}

int brk_store_oauth_token_revoke (brk_store_t *self, const char *hash, uint64_t now_ms)
{
    return s_update_at (self, ST_TOKEN_REVOKE, hash, now_ms, "oauth token revoke");
}

int brk_store_oauth_grant_revoke (brk_store_t *self, const char *grant_id, uint64_t now_ms)
{
    int rc = s_update_at (self, ST_TOKEN_REVOKE_GRANT, grant_id, now_ms, "oauth grant revoke");
    return rc < 0 ? -1 : 0;
}

int brk_store_oauth_purge (brk_store_t *self, uint64_t before_ms)
{
    if (!self || !sbx_db_fits (before_ms) || !sbx_db_require_transaction (self->db, "oauth purge"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_TOKEN_PURGE);
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) before_ms);
    return sbx_db_try (self->db, ST_TOKEN_PURGE, "oauth purge") == SQLITE_DONE ? 0 : -1;
}

int brk_store_oauth_grant_find (brk_store_t *self, const char *account_id, const char *client_id,
                                char **grant_id)
{
    if (grant_id)
        *grant_id = NULL;
    if (!self || !account_id || !client_id || !grant_id)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_GRANT_FIND);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_db_bind_text (stmt, 2, client_id);
    return sbx_db_row (self->db, ST_GRANT_FIND, brk_store_text_from_row, grant_id,
                       "oauth grant find");
}

void brk_oauth_token_clear (brk_oauth_token_t *self)
{
    if (!self)
        return;
    free (self->hash);
    free (self->kind);
    free (self->grant_id);
    free (self->client_id);
    free (self->redirect_uri);
    free (self->challenge);
    free (self->resource);
    free (self->scope);
    memset (self, 0, sizeof *self);
}

//  --------------------------------------------------------------------------
//  Self-test

void brk_store_oauth_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_store_oauth_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/control.db", dir);
    brk_store_t *store = brk_store_new (path);
    assert (store);

    //  A grant is a connection of an account; clients and tokens are written in a
    //  transaction only.
    brk_account_t account = {.id = "acc_a", .email = "a@example.com", .plan = "free"};
    brk_key_t grant = {
        .id = "key_g", .account_id = "acc_a", .kind = "connection", .hash = "hg", .created_ms = 1};
    brk_oauth_client_t client = {
        .client_id = "cli_1", .name = "Claude", .redirect_uris = "https://a/cb", .created_ms = 5};
    assert (brk_store_oauth_client_insert (store, &client) == -1);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_insert (store, &account) == 0);
    assert (brk_store_key_insert (store, &grant) == 0);
    assert (brk_store_oauth_client_insert (store, &client) == 0);
    assert (brk_store_oauth_client_insert (store, &client) == -1); //  duplicate
    assert (brk_store_commit (store) == 0);
    brk_oauth_client_t found_client;
    assert (brk_store_oauth_client_find (store, "cli_1", &found_client) == 0);
    assert (strcmp (found_client.name, "Claude") == 0 && found_client.created_ms == 5);
    assert (strcmp (found_client.redirect_uris, "https://a/cb") == 0);
    brk_oauth_client_clear (&found_client);
    assert (brk_store_oauth_client_find (store, "cli_2", &found_client) == 1);
    assert (!found_client.client_id);
    assert (brk_store_oauth_client_find (store, NULL, &found_client) == -1);

    //  A code, then the tokens it was exchanged for.
    char *grant_id = NULL;
    assert (brk_store_oauth_grant_find (store, "acc_a", "cli_1", &grant_id) == 1 && !grant_id);
    brk_oauth_token_t code = {.hash = "hc",
                              .kind = "code",
                              .grant_id = "key_g",
                              .client_id = "cli_1",
                              .redirect_uri = "https://a/cb",
                              .challenge = "S256x",
                              .resource = "https://sbx/mcp",
                              .created_ms = 10,
                              .expires_ms = 100};
    brk_oauth_token_t access = {.hash = "ha",
                                .kind = "access",
                                .grant_id = "key_g",
                                .client_id = "cli_1",
                                .resource = "https://sbx/mcp",
                                .created_ms = 20,
                                .expires_ms = 2000};
    assert (brk_store_begin (store) == 0);
    assert (brk_store_oauth_token_insert (store, &code) == 0);
    assert (brk_store_oauth_token_insert (store, &access) == 0);
    access.hash = "hx", access.grant_id = "key_none";
    assert (brk_store_oauth_token_insert (store, &access) == -1); //  unknown grant
    access.grant_id = "key_g", access.kind = "cookie";
    assert (brk_store_oauth_token_insert (store, &access) == -1);
    assert (brk_store_oauth_token_use (store, "hc", 30) == 0);
    assert (brk_store_oauth_token_use (store, "hc", 31) == 1); //  once
    assert (brk_store_commit (store) == 0);
    assert (brk_store_oauth_grant_find (store, "acc_a", "cli_1", &grant_id) == 0);
    assert (grant_id && strcmp (grant_id, "key_g") == 0);
    free (grant_id);
    assert (brk_store_oauth_grant_find (store, "acc_b", "cli_1", &grant_id) == 1);
    brk_oauth_token_t token;
    assert (brk_store_oauth_token_find (store, "hc", &token) == 0);
    assert (strcmp (token.kind, "code") == 0 && strcmp (token.challenge, "S256x") == 0);
    assert (token.used_ms == 30 && token.revoked_ms == 0 && token.expires_ms == 100);
    assert (!token.scope);
    brk_oauth_token_clear (&token);
    assert (brk_store_oauth_token_find (store, "hz", &token) == 1 && !token.hash);

    //  Revoked one by one or by grant; expired ones purged.
    assert (brk_store_begin (store) == 0);
    assert (brk_store_oauth_token_revoke (store, "ha", 40) == 0);
    assert (brk_store_oauth_token_revoke (store, "ha", 41) == 1);
    assert (brk_store_oauth_grant_revoke (store, "key_g", 50) == 0);
    assert (brk_store_oauth_purge (store, 1000) == 0);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_oauth_token_find (store, "hc", &token) == 1); //  expired at 100
    assert (brk_store_oauth_token_find (store, "ha", &token) == 0 && token.revoked_ms == 40);
    brk_oauth_token_clear (&token);
    assert (brk_store_oauth_token_use (store, "ha", 60) == -1); //  no transaction

    brk_store_destroy (&store);
    snprintf (path, sizeof path, "rm -rf '%s'", dir);
    assert (system (path) == 0);
}
