/*  brk_store_mcp - brk_store's MCP sessions: one row a session, and the env its
    create_sandbox gave each sandbox, one row a variable (see brk_store.h; shared parts
    in brk_store_priv.h). */
#include "brk_store_priv.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_bind_opt (sbx_stmt_t *stmt, int index, const char *text)
{
    if (text && *text)
        sbx_db_bind_text (stmt, index, text);
    else
        sbx_stmt_bind_null (stmt, index);
}

int brk_store_mcp_session_insert (brk_store_t *self, const brk_mcp_session_t *session)
{
    if (!self || !session || !sbx_db_nonempty (session->id) ||
        !sbx_db_nonempty (session->account_id) || !sbx_db_fits (session->created_ms) ||
        !sbx_db_fits (session->used_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "mcp session insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_MCP_INSERT);
    sbx_db_bind_text (stmt, 1, session->id);
    sbx_db_bind_text (stmt, 2, session->account_id);
    s_bind_opt (stmt, 3, session->key_id);
    s_bind_opt (stmt, 4, session->protocol);
    s_bind_opt (stmt, 5, session->client);
    s_bind_opt (stmt, 6, session->sandbox_id);
    sbx_stmt_bind_int64 (stmt, 7, (sqlite3_int64) session->created_ms);
    sbx_stmt_bind_int64 (stmt, 8, (sqlite3_int64) session->used_ms);
    return sbx_db_try (self->db, ST_MCP_INSERT, "mcp session insert") == SQLITE_DONE ? 0 : -1;
}

static int s_session_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_mcp_session_t *out = row;
    bool failed = false;
    out->id = sbx_db_column_dup (stmt, 0, &failed);
    out->account_id = sbx_db_column_dup (stmt, 1, &failed);
    out->key_id = sbx_db_column_dup (stmt, 2, &failed);
    out->protocol = sbx_db_column_dup (stmt, 3, &failed);
    out->client = sbx_db_column_dup (stmt, 4, &failed);
    out->sandbox_id = sbx_db_column_dup (stmt, 5, &failed);
    out->created_ms = sbx_db_column_u64 (stmt, 6);
    out->used_ms = sbx_db_column_u64 (stmt, 7);
    if (failed || !out->id || !out->account_id)
        brk_mcp_session_clear (out);
    return out->id ? 0 : -1;
}

int brk_store_mcp_session_find (brk_store_t *self, const char *id, brk_mcp_session_t *out)
{
    return brk_store_find (self, ST_MCP_FIND, id, s_session_from_row, out, sizeof *out,
                           "mcp session find");
}

int brk_store_mcp_session_use (brk_store_t *self, const char *id, const char *sandbox_id,
                               uint64_t used_ms)
{
    if (!self || !sbx_db_nonempty (id) || !sbx_db_fits (used_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "mcp session use"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_MCP_USE);
    sbx_db_bind_text (stmt, 1, id);
    s_bind_opt (stmt, 2, sandbox_id);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) used_ms);
    return sbx_db_run (self->db, ST_MCP_USE, "mcp session use");
}

int brk_store_mcp_session_delete (brk_store_t *self, const char *id)
{
    if (!self || !sbx_db_nonempty (id))
        return -1;
    if (!sbx_db_require_transaction (self->db, "mcp session delete"))
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_MCP_DELETE), 1, id);
    if (sbx_db_run (self->db, ST_MCP_DELETE, "mcp session delete"))
        return -1;
    return sbx_db_changes (self->db) ? 0 : 1;
}

static int s_u64_from_row (sbx_stmt_t *stmt, void *out)
{
    *(uint64_t *) out = sbx_db_column_u64 (stmt, 0);
    return 0;
}

int brk_store_mcp_session_count (brk_store_t *self, const char *account_id, uint64_t *count)
{
    if (!self || !account_id || !count)
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_MCP_COUNT), 1, account_id);
    return sbx_db_row (self->db, ST_MCP_COUNT, s_u64_from_row, count, "mcp session count") == 0
               ? 0
               : -1;
}

int brk_store_mcp_session_oldest (brk_store_t *self, const char *account_id, char **id)
{
    if (id)
        *id = NULL;
    return brk_store_find (self, ST_MCP_OLDEST, account_id, brk_store_text_from_row, id, sizeof *id,
                           "mcp session oldest");
}

int brk_store_mcp_session_idle (brk_store_t *self, uint64_t before_ms, char **id)
{
    if (id)
        *id = NULL;
    if (!self || !id || !sbx_db_fits (before_ms))
        return -1;
    sbx_stmt_bind_int64 (sbx_db_stmt (self->db, ST_MCP_IDLE), 1, (sqlite3_int64) before_ms);
    return sbx_db_row (self->db, ST_MCP_IDLE, brk_store_text_from_row, id, "mcp session idle");
}

int brk_store_mcp_env_set (brk_store_t *self, const char *session_id, const char *sandbox_id,
                           const sbx_strmap_t *env)
{
    if (!self || !sbx_db_nonempty (session_id) || !sbx_db_nonempty (sandbox_id))
        return -1;
    if (!sbx_db_require_transaction (self->db, "mcp env set"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_MCP_ENV_CLEAR);
    sbx_db_bind_text (stmt, 1, session_id);
    sbx_db_bind_text (stmt, 2, sandbox_id);
    if (sbx_db_run (self->db, ST_MCP_ENV_CLEAR, "mcp env clear"))
        return -1;
    for (size_t i = 0; env && i < env->count; i++) {
        if (!sbx_db_nonempty (env->keys[i]) || !env->values[i])
            return -1;
        stmt = sbx_db_stmt (self->db, ST_MCP_ENV_SET);
        sbx_db_bind_text (stmt, 1, session_id);
        sbx_db_bind_text (stmt, 2, sandbox_id);
        sbx_db_bind_text (stmt, 3, env->keys[i]);
        sbx_db_bind_text (stmt, 4, env->values[i]);
        if (sbx_db_try (self->db, ST_MCP_ENV_SET, "mcp env set") != SQLITE_DONE)
            return -1; //  no such session
    }
    return 0;
}

int brk_store_mcp_env_list (brk_store_t *self, const char *session_id, brk_store_env_fn *fn,
                            void *arg)
{
    if (!self || !session_id || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_MCP_ENV_LIST);
    sbx_db_bind_text (stmt, 1, session_id);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        fn ((const char *) sbx_stmt_column_text (stmt, 0),
            (const char *) sbx_stmt_column_text (stmt, 1),
            (const char *) sbx_stmt_column_text (stmt, 2), arg);
        count++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "mcp env list");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

void brk_mcp_session_clear (brk_mcp_session_t *self)
{
    if (!self)
        return;
    free (self->id);
    free (self->account_id);
    free (self->key_id);
    free (self->protocol);
    free (self->client);
    free (self->sandbox_id);
    memset (self, 0, sizeof *self);
}

//  --------------------------------------------------------------------------
//  Self test

static void s_env_count (const char *sandbox_id, const char *name, const char *value, void *arg)
{
    (void) sandbox_id;
    (void) name;
    (void) value;
    (*(int *) arg)++;
}

void brk_store_mcp_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_store_mcp_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/control.db", dir);
    brk_store_t *store = brk_store_new (path);
    assert (store);

    brk_account_t account = {.id = "acc_a", .email = "a@example.com", .plan = "free"};
    brk_mcp_session_t one = {.id = "mcps_1",
                             .account_id = "acc_a",
                             .key_id = "key_1",
                             .protocol = "2025-06-18",
                             .created_ms = 10,
                             .used_ms = 10};
    brk_mcp_session_t two = {
        .id = "mcps_2", .account_id = "acc_a", .created_ms = 20, .used_ms = 20};
    assert (brk_store_mcp_session_insert (store, &one) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_insert (store, &account) == 0);
    assert (brk_store_mcp_session_insert (store, &one) == 0);
    assert (brk_store_mcp_session_insert (store, &two) == 0);
    assert (brk_store_mcp_session_insert (store, &two) == -1); //  duplicate
    two.id = "mcps_3", two.account_id = "acc_none";
    assert (brk_store_mcp_session_insert (store, &two) == -1); //  unknown account
    assert (brk_store_commit (store) == 0);

    brk_mcp_session_t found;
    assert (brk_store_mcp_session_find (store, "mcps_1", &found) == 0);
    assert (strcmp (found.account_id, "acc_a") == 0 && strcmp (found.key_id, "key_1") == 0);
    assert (strcmp (found.protocol, "2025-06-18") == 0 && !found.client && !found.sandbox_id);
    brk_mcp_session_clear (&found);
    assert (brk_store_mcp_session_find (store, "mcps_9", &found) == 1 && !found.id);
    uint64_t count = 0;
    assert (brk_store_mcp_session_count (store, "acc_a", &count) == 0 && count == 2);
    char *id = NULL;
    assert (brk_store_mcp_session_oldest (store, "acc_a", &id) == 0 && strcmp (id, "mcps_1") == 0);
    free (id);
    assert (brk_store_mcp_session_idle (store, 15, &id) == 0 && strcmp (id, "mcps_1") == 0);
    free (id);
    assert (brk_store_mcp_session_idle (store, 5, &id) == 1 && !id);

    //  The default and env; deleting the session drops its env.
    char *keys[] = {"A", "B"}, *values[] = {"1", "two words"};
    sbx_strmap_t env = {.count = 2, .keys = keys, .values = values};
    assert (brk_store_begin (store) == 0);
    assert (brk_store_mcp_session_use (store, "mcps_1", "sb_a", 30) == 0);
    assert (brk_store_mcp_env_set (store, "mcps_1", "sb_a", &env) == 0);
    assert (brk_store_mcp_env_set (store, "mcps_1", "sb_b", &env) == 0);
    assert (brk_store_mcp_env_set (store, "mcps_9", "sb_a", &env) == -1); //  no session
    assert (brk_store_commit (store) == 0);
    assert (brk_store_mcp_session_find (store, "mcps_1", &found) == 0);
    assert (strcmp (found.sandbox_id, "sb_a") == 0 && found.used_ms == 30);
    brk_mcp_session_clear (&found);
    int vars = 0;
    assert (brk_store_mcp_env_list (store, "mcps_1", s_env_count, &vars) == 4 && vars == 4);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_mcp_env_set (store, "mcps_1", "sb_b", NULL) == 0);
    assert (brk_store_mcp_session_use (store, "mcps_1", NULL, 40) == 0);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_mcp_env_list (store, "mcps_1", s_env_count, &vars) == 2);
    assert (brk_store_mcp_session_find (store, "mcps_1", &found) == 0 && !found.sandbox_id);
    brk_mcp_session_clear (&found);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_mcp_session_delete (store, "mcps_1") == 0);
    assert (brk_store_mcp_session_delete (store, "mcps_1") == 1);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_mcp_env_list (store, "mcps_1", s_env_count, &vars) == 0);
    assert (brk_store_mcp_session_count (store, "acc_a", &count) == 0 && count == 1);

    brk_store_destroy (&store);
    snprintf (path, sizeof path, "rm -rf '%s'", dir);
    assert (system (path) == 0);
}
