/*  brk_store_hosts - the hosts a join token admitted (brk_store.h, "Hosts"). */
#include "brk_store_priv.h"
#include "sbx_log.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void brk_host_clear (brk_host_t *self)
{
    if (!self)
        return;
    free (self->name);
    free (self->roles);
    free (self->public_key);
    memset (self, 0, sizeof *self);
}

static int s_host_from_row (sbx_stmt_t *stmt, void *out)
{
    brk_host_t *host = out;
    bool failed = false;
    host->name = sbx_db_column_dup (stmt, 0, &failed);
    host->roles = sbx_db_column_dup (stmt, 1, &failed);
    host->public_key = sbx_db_column_dup (stmt, 2, &failed);
    host->created_ms = sbx_db_column_u64 (stmt, 3);
    host->removed_ms = sbx_db_column_u64 (stmt, 4);
    if (failed || !host->name || !host->public_key) {
        brk_host_clear (host);
        return -1;
    }
    return 0;
}

int brk_store_host_insert (brk_store_t *self, const brk_host_t *host)
{
    if (!self || !host || !sbx_db_nonempty (host->name) || !sbx_db_nonempty (host->public_key) ||
        !sbx_db_fits (host->created_ms))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_HOST_INSERT);
    sbx_db_bind_text (stmt, 1, host->name);
    sbx_db_bind_text (stmt, 2, host->roles ? host->roles : "");
    sbx_db_bind_text (stmt, 3, host->public_key);
    sbx_stmt_bind_int64 (stmt, 4, (int64_t) host->created_ms);
    int rc = sbx_db_try (self->db, ST_HOST_INSERT, "host insert");
    if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY)
        return 1;
    if (rc != SQLITE_DONE)
        return -1;
    //  No row changed: the name is an admitted host's (the update's WHERE said no).
    return sbx_db_changes (self->db) == 1 ? 0 : 1;
}

int brk_store_host_find (brk_store_t *self, const char *name, brk_host_t *out)
{
    return brk_store_find (self, ST_HOST_FIND, name, s_host_from_row, out, sizeof *out,
                           "host find");
}

int brk_store_host_list (brk_store_t *self, brk_store_host_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_HOST_LIST);
    if (sbx_stmt_busy (stmt)) {
        sbx_warn ("store %s: host_list called from its own callback", sbx_db_path (self->db));
        return -1;
    }
    int count = 0, rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_host_t host = {0};
        if (s_host_from_row (stmt, &host)) {
            rc = SQLITE_NOMEM;
            break;
        }
        fn (&host, arg);
        brk_host_clear (&host);
        if (++count == INT_MAX) {
            rc = SQLITE_DONE;
            break;
        }
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "host list");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int brk_store_host_remove (brk_store_t *self, const char *name, uint64_t now_ms)
{
    if (!self || !sbx_db_nonempty (name) || !sbx_db_fits (now_ms) || now_ms == 0)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_HOST_REMOVE);
    sbx_db_bind_text (stmt, 1, name);
    sbx_stmt_bind_int64 (stmt, 2, (int64_t) now_ms);
    if (sbx_db_try (self->db, ST_HOST_REMOVE, "host remove") != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : 1;
}

//  --------------------------------------------------------------------------
//  Drains

static int s_since_from_row (sbx_stmt_t *stmt, void *out)
{
    *(uint64_t *) out = sbx_db_column_u64 (stmt, 0);
    return 0;
}

int brk_store_drain_set (brk_store_t *self, const char *vmd, uint64_t now_ms)
{
    if (!self || !sbx_db_nonempty (vmd) || !sbx_db_fits (now_ms))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_DRAIN_SET);
    sbx_db_bind_text (stmt, 1, vmd);
    sbx_stmt_bind_int64 (stmt, 2, (int64_t) now_ms);
    return sbx_db_try (self->db, ST_DRAIN_SET, "drain set") == SQLITE_DONE ? 0 : -1;
}

int brk_store_drain_unset (brk_store_t *self, const char *vmd)
{
    if (!self || !sbx_db_nonempty (vmd))
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_DRAIN_UNSET), 1, vmd);
    if (sbx_db_try (self->db, ST_DRAIN_UNSET, "drain unset") != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : 1;
}

int brk_store_drain_since (brk_store_t *self, const char *vmd, uint64_t *since_ms)
{
    *since_ms = 0;
    if (!vmd)
        return 0;
    uint64_t since = 0;
    int rc = brk_store_find (self, ST_DRAIN_GET, vmd, s_since_from_row, &since, sizeof since,
                             "drain get");
    if (rc < 0)
        return -1;
    *since_ms = rc == 0 ? since : 0;
    return 0;
}

int brk_store_drain_list (brk_store_t *self, brk_store_name_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    return brk_store_names (sbx_db_stmt (self->db, ST_DRAIN_LIST), fn, arg);
}

int brk_store_sandbox_count_on (brk_store_t *self, const char *vmd, const char *state,
                                uint64_t *count)
{
    *count = 0;
    if (!self || !sbx_db_nonempty (vmd) || !sbx_db_nonempty (state))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_ON_VMD);
    sbx_db_bind_text (stmt, 1, vmd);
    sbx_db_bind_text (stmt, 2, state);
    return sbx_db_row (self->db, ST_SANDBOX_ON_VMD, s_since_from_row, count, "sandbox count on") ==
                   0
               ? 0
               : -1;
}
