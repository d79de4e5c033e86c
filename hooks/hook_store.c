/*  hook_store - see hook_store.h */
#include "hook_store.h"
#include "sbx_db.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

//  Entry i brings the schema from version i to i + 1. APPEND to change it.
static const char *s_migrations[] = {
    //  1: meta (last_seq), webhooks, deliveries.
    "CREATE TABLE meta ("
    "  key TEXT NOT NULL PRIMARY KEY,"
    "  value TEXT NOT NULL);"
    "CREATE TABLE webhooks ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  url TEXT NOT NULL,"
    "  events TEXT NOT NULL,"
    "  secret TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX webhooks_by_account ON webhooks (account, created_ms);"
    "CREATE TABLE deliveries ("
    "  id INTEGER PRIMARY KEY,"
    "  webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,"
    "  event_id TEXT NOT NULL,"
    "  event_type TEXT NOT NULL,"
    "  body TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  status_code INTEGER NOT NULL DEFAULT 0,"
    "  last_error TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  next_ms INTEGER NOT NULL,"
    "  done_ms INTEGER NOT NULL DEFAULT 0,"
    "  UNIQUE (webhook_id, event_id));"
    "CREATE INDEX deliveries_due ON deliveries (next_ms) WHERE state = 'pending';"
    "CREATE INDEX deliveries_by_webhook ON deliveries (webhook_id, id);",
    //  2: the pending deliveries by webhook: the due query reads those, not the whole
    //  delivery log.
    "CREATE INDEX deliveries_pending ON deliveries (webhook_id, id) WHERE state = 'pending';",
};

#define MIGRATION_COUNT ((int) (sizeof s_migrations / sizeof s_migrations[0]))

typedef enum {
    ST_META_SET,
    ST_FANOUT,
    ST_CREATE,
    ST_COUNT_ACCOUNT,
    ST_GET,
    ST_LIST,
    ST_DELETE,
    ST_DELETE_ACCOUNT,
    ST_DELIVERIES,
    ST_DUE,
    ST_RECORD,
    ST__COUNT
} s_stmt_t;

#define S_INFO_COLUMNS                                                                             \
    "w.id, w.account, w.url, w.events, w.created_ms,"                                              \
    " (SELECT count(*) FROM deliveries d WHERE d.webhook_id = w.id AND d.state = 'delivered'),"    \
    " (SELECT count(*) FROM deliveries d WHERE d.webhook_id = w.id AND d.state = 'failed'),"       \
    " (SELECT count(*) FROM deliveries d WHERE d.webhook_id = w.id AND d.state = 'pending')"

static const char *s_sql[ST__COUNT] = {
    [ST_META_SET] = "INSERT INTO meta (key, value) VALUES ('last_seq', ?1) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    //  The fan-out: every webhook of the account that takes this type and existed when
    //  the event was committed (a replay of old events tells a new webhook nothing).
    [ST_FANOUT] = "INSERT OR IGNORE INTO deliveries (webhook_id, event_id, event_type, body, "
                  "state, created_ms, next_ms) "
                  "SELECT id, ?3, ?2, ?4, 'pending', ?5, ?5 FROM webhooks WHERE account = ?1 "
                  "AND created_ms <= ?5 "
                  "AND (events = '' OR instr (' ' || events || ' ', ' ' || ?2 || ' ') > 0)",
    [ST_CREATE] = "INSERT INTO webhooks (id, account, url, events, secret, created_ms) "
                  "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [ST_COUNT_ACCOUNT] = "SELECT count(*) FROM webhooks WHERE account = ?1",
    [ST_GET] = "SELECT " S_INFO_COLUMNS " FROM webhooks w WHERE w.id = ?1",
    [ST_LIST] = "SELECT " S_INFO_COLUMNS " FROM webhooks w WHERE w.account = ?1 "
                "ORDER BY w.created_ms, w.id",
    [ST_DELETE] = "DELETE FROM webhooks WHERE id = ?1",
    [ST_DELETE_ACCOUNT] = "DELETE FROM webhooks WHERE account = ?1",
    [ST_DELIVERIES] = "SELECT event_id, event_type, state, attempts, status_code, last_error, "
                      "created_ms, next_ms, done_ms FROM deliveries WHERE webhook_id = ?1 "
                      "ORDER BY id DESC LIMIT ?2",
    //  Each webhook's first due delivery only (the lowest id: the log's order): the next
    //  one becomes due for sending when this one is done, or waits for a retry.
    [ST_DUE] = "SELECT d.id, d.webhook_id, w.url, w.secret, d.event_id, d.body, d.attempts "
               "FROM deliveries d JOIN webhooks w ON w.id = d.webhook_id "
               "WHERE d.id IN (SELECT min (id) FROM deliveries INDEXED BY deliveries_pending "
               "WHERE state = 'pending' AND next_ms <= ?1 GROUP BY webhook_id) "
               "ORDER BY d.next_ms, d.id LIMIT ?2",
    [ST_RECORD] = "UPDATE deliveries SET state = ?2, attempts = ?3, status_code = ?4, "
                  "last_error = ?5, next_ms = ?6, done_ms = ?7 WHERE id = ?1",
};

struct _hook_store_t {
    sbx_db_t *db;
};

hook_store_t *hook_store_new (const char *path)
{
    assert (path);
    hook_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->db = sbx_db_new (path, "sbx-hookd", s_migrations, MIGRATION_COUNT, s_sql, ST__COUNT);
    if (!self->db)
        hook_store_destroy (&self);
    return self;
}

void hook_store_destroy (hook_store_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        sbx_db_destroy (&(*self_p)->db);
        free (*self_p);
        *self_p = NULL;
    }
}

uint64_t hook_store_last_seq (hook_store_t *self)
{
    int64_t seq = sbx_db_query_int (self->db,
                                    "SELECT coalesce ((SELECT CAST (value AS INTEGER) FROM meta "
                                    "WHERE key = 'last_seq'), 0)",
                                    "last seq");
    return seq > 0 ? (uint64_t) seq : 0;
}

int hook_store_apply (hook_store_t *self, uint64_t seq, const char *account, const char *type,
                      const char *event_id, const char *body, uint64_t ts_ms)
{
    if (!sbx_db_fits (seq) || !sbx_db_fits (ts_ms) || sbx_db_begin (self->db))
        return -1;
    int rc = 0;
    if (type && account) {
        sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_FANOUT);
        sbx_db_bind_text (stmt, 1, account);
        sbx_db_bind_text (stmt, 2, type);
        sbx_db_bind_text (stmt, 3, event_id);
        sbx_db_bind_text (stmt, 4, body);
        sbx_stmt_bind_int64 (stmt, 5, (int64_t) ts_ms);
        rc = sbx_db_run (self->db, ST_FANOUT, "deliveries of an event");
    }
    char text[24];
    snprintf (text, sizeof text, "%llu", (unsigned long long) seq);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_META_SET), 1, text);
    if (rc || sbx_db_run (self->db, ST_META_SET, "last seq") || sbx_db_commit (self->db)) {
        sbx_db_rollback (self->db);
        return -1;
    }
    return 0;
}

int hook_store_create (hook_store_t *self, const char *id, const char *account, const char *url,
                       const char *events, const char *secret, uint64_t now_ms)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_CREATE);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, account);
    sbx_db_bind_text (stmt, 3, url);
    sbx_db_bind_text (stmt, 4, events ? events : "");
    sbx_db_bind_text (stmt, 5, secret);
    sbx_stmt_bind_int64 (stmt, 6, (int64_t) now_ms);
    return sbx_db_run (self->db, ST_CREATE, "webhook create");
}

int hook_store_count (hook_store_t *self, const char *account)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_COUNT_ACCOUNT);
    sbx_db_bind_text (stmt, 1, account);
    int count = sbx_stmt_step (stmt) == SQLITE_ROW ? sbx_stmt_column_int (stmt, 0) : -1;
    sbx_db_reset (stmt);
    return count;
}

static int s_fill_info (sbx_stmt_t *stmt, void *out)
{
    sbx_webhook_info_t *info = out;
    bool failed = false;
    info->webhook_id = sbx_db_column_dup (stmt, 0, &failed);
    info->account_id = sbx_db_column_dup (stmt, 1, &failed);
    info->url = sbx_db_column_dup (stmt, 2, &failed);
    const char *events = (const char *) sbx_stmt_column_text (stmt, 3);
    char *copy = strdup (events ? events : "");
    char *save = NULL;
    for (char *name = copy ? strtok_r (copy, " ", &save) : NULL; name;
         name = strtok_r (NULL, " ", &save))
        failed |= sbx_strlist_append (&info->events, name) != 0;
    free (copy);
    info->created_ms = sbx_db_column_u64 (stmt, 4);
    info->delivered = sbx_db_column_u64 (stmt, 5);
    info->failed = sbx_db_column_u64 (stmt, 6);
    info->pending = sbx_db_column_u64 (stmt, 7);
    return failed || !copy ? -1 : 0;
}

int hook_store_get (hook_store_t *self, const char *id, sbx_webhook_info_t *out)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_GET), 1, id);
    return sbx_db_row (self->db, ST_GET, s_fill_info, out, "webhook get");
}

int hook_store_list (hook_store_t *self, const char *account, sbx_webhook_info_list_t *out)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_LIST);
    sbx_db_bind_text (stmt, 1, account);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        sbx_webhook_info_t *info = sbx_webhook_info_list_append (out);
        if (!info || s_fill_info (stmt, info))
            break;
    }
    sbx_db_reset (stmt);
    if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "webhook list");
        return -1;
    }
    return 0;
}

int hook_store_delete (hook_store_t *self, const char *id)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_DELETE), 1, id);
    return sbx_db_run (self->db, ST_DELETE, "webhook delete");
}

int hook_store_delete_account (hook_store_t *self, const char *account)
{
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_DELETE_ACCOUNT), 1, account);
    return sbx_db_run (self->db, ST_DELETE_ACCOUNT, "webhooks of an account delete");
}

int hook_store_deliveries (hook_store_t *self, const char *webhook_id, uint64_t limit,
                           sbx_webhook_delivery_list_t *out)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_DELIVERIES);
    sbx_db_bind_text (stmt, 1, webhook_id);
    sbx_stmt_bind_int64 (stmt, 2, (int64_t) limit);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        sbx_webhook_delivery_t *d = sbx_webhook_delivery_list_append (out);
        if (!d)
            break;
        bool failed = false;
        d->event_id = sbx_db_column_dup (stmt, 0, &failed);
        d->event_type = sbx_db_column_dup (stmt, 1, &failed);
        d->state = sbx_db_column_dup (stmt, 2, &failed);
        d->attempts = sbx_db_column_u64 (stmt, 3);
        d->status_code = sbx_db_column_u64 (stmt, 4);
        d->last_error = sbx_db_column_dup (stmt, 5, &failed);
        d->created_ms = sbx_db_column_u64 (stmt, 6);
        d->next_ms = sbx_db_column_u64 (stmt, 7);
        d->done_ms = sbx_db_column_u64 (stmt, 8);
        if (failed)
            break;
    }
    sbx_db_reset (stmt);
    if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "webhook deliveries");
        return -1;
    }
    return 0;
}

int hook_store_due (hook_store_t *self, uint64_t now_ms, int limit, hook_due_fn *fn, void *arg)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_DUE);
    sbx_stmt_bind_int64 (stmt, 1, (int64_t) now_ms);
    sbx_stmt_bind_int (stmt, 2, limit);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        hook_due_t due = {
            .id = sbx_stmt_column_int64 (stmt, 0),
            .webhook_id = (const char *) sbx_stmt_column_text (stmt, 1),
            .url = (const char *) sbx_stmt_column_text (stmt, 2),
            .secret = (const char *) sbx_stmt_column_text (stmt, 3),
            .event_id = (const char *) sbx_stmt_column_text (stmt, 4),
            .body = (const char *) sbx_stmt_column_text (stmt, 5),
            .attempts = sbx_db_column_u64 (stmt, 6),
        };
        fn (&due, arg);
    }
    sbx_db_reset (stmt);
    if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "due deliveries");
        return -1;
    }
    return 0;
}

int hook_store_record (hook_store_t *self, int64_t id, const char *state, uint64_t attempts,
                       uint64_t status_code, const char *error, uint64_t next_ms, uint64_t done_ms)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_RECORD);
    sbx_stmt_bind_int64 (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, state);
    sbx_stmt_bind_int64 (stmt, 3, (int64_t) attempts);
    sbx_stmt_bind_int64 (stmt, 4, (int64_t) status_code);
    sbx_db_bind_text (stmt, 5, error);
    sbx_stmt_bind_int64 (stmt, 6, (int64_t) next_ms);
    sbx_stmt_bind_int64 (stmt, 7, (int64_t) done_ms);
    return sbx_db_run (self->db, ST_RECORD, "delivery record");
}

//  --------------------------------------------------------------------------
//  Self test

typedef struct {
    int count;
    int64_t ids[4];
    char events[4][16];
} s_due_seen_t;

static void s_count_due (const hook_due_t *due, void *arg)
{
    assert (streq (due->secret, "whsec_x"));
    s_due_seen_t *seen = arg;
    if (seen->count < 4) {
        seen->ids[seen->count] = due->id;
        snprintf (seen->events[seen->count], sizeof seen->events[0], "%s", due->event_id);
    }
    seen->count++;
}

//  The due query goes through every pending delivery (deliveries_pending holds only
//  those), each webhook's oldest first.
static bool s_test_allow (int index, const char *table)
{
    return index == ST_DUE && streq (table, "deliveries");
}

void hook_store_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/hook_store_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/hooks.db", dir);
    hook_store_t *store = hook_store_new (path);
    //  No statement reads the whole delivery log (s_test_allow: the pending part only).
    assert (sbx_db_whole_reads (store->db, s_test_allow) == 0);
    assert (store);
    assert (hook_store_last_seq (store) == 0);
    assert (hook_store_create (store, "wh_a", "acc_1", "http://h/a", "sandbox.ready", "whsec_x",
                               10) == 0);
    assert (hook_store_create (store, "wh_b", "acc_1", "http://h/b", "", "whsec_x", 11) == 0);
    assert (hook_store_count (store, "acc_1") == 2);
    //  An event of the type both take, one only wh_b takes, one of another account.
    assert (hook_store_apply (store, 5, "acc_1", "sandbox.ready", "evt_5", "{}", 100) == 0);
    assert (hook_store_apply (store, 6, "acc_1", "sandbox.stopped", "evt_6", "{}", 100) == 0);
    assert (hook_store_apply (store, 7, "acc_2", "sandbox.ready", "evt_7", "{}", 100) == 0);
    //  A replayed event adds nothing; one from before a webhook existed is not its.
    assert (hook_store_apply (store, 5, "acc_1", "sandbox.ready", "evt_5", "{}", 100) == 0);
    assert (hook_store_apply (store, 4, "acc_1", "sandbox.ready", "evt_4", "{}", 9) == 0);
    assert (hook_store_apply (store, 8, NULL, NULL, NULL, NULL, 0) == 0);
    assert (hook_store_last_seq (store) == 8);
    s_due_seen_t due = {0};
    assert (hook_store_due (store, 99, 10, s_count_due, &due) == 0 && due.count == 0);
    //  Three pending, but one at a time per webhook, in the log's order: wh_b's evt_6
    //  waits for its evt_5 (sent together, the receiver could see evt_6 first).
    assert (hook_store_due (store, 100, 10, s_count_due, &due) == 0 && due.count == 2);
    assert (streq (due.events[0], "evt_5") && streq (due.events[1], "evt_5"));
    int64_t wh_b_first = due.ids[1];
    //  Still pending (in flight, say): still the only one of wh_b.
    due = (s_due_seen_t){0};
    assert (hook_store_due (store, 100, 10, s_count_due, &due) == 0 && due.count == 2);
    assert (due.ids[1] == wh_b_first);
    //  Delivered: evt_6 is next.
    assert (hook_store_record (store, wh_b_first, "delivered", 1, 200, NULL, 0, 101) == 0);
    due = (s_due_seen_t){0};
    assert (hook_store_due (store, 101, 10, s_count_due, &due) == 0 && due.count == 2);
    assert (streq (due.events[1], "evt_6"));
    //  A failed first attempt waits for its retry; the ones after it go on meanwhile.
    int64_t wh_a_first = due.ids[0];
    assert (hook_store_record (store, wh_a_first, "pending", 1, 500, "HTTP 500", 1101, 0) == 0);
    due = (s_due_seen_t){0};
    assert (hook_store_due (store, 101, 10, s_count_due, &due) == 0 && due.count == 1);
    assert (streq (due.events[0], "evt_6"));
    //  Back as it was for the counts below: wh_a's evt_5 and wh_b's evt_6 pending.
    assert (hook_store_record (store, wh_a_first, "pending", 0, 0, NULL, 100, 0) == 0);
    //  The lists live in messages, which own and free them.
    sbx_msg_t *got = sbx_msg_new (SBX_MSG_WEBHOOK_GET_OK);
    sbx_webhook_info_t *info = calloc (1, sizeof *info);
    sbx_msg_webhook_get_ok (got)->webhook = info;
    assert (hook_store_get (store, "wh_a", info) == 0);
    assert (info->events.count == 1 && info->pending == 1 && streq (info->account_id, "acc_1"));
    sbx_msg_destroy (&got);
    sbx_msg_t *list = sbx_msg_new (SBX_MSG_WEBHOOK_LIST_OK);
    sbx_webhook_info_list_t *hooks = &sbx_msg_webhook_list_ok (list)->webhooks;
    assert (hook_store_list (store, "acc_1", hooks) == 0 && hooks->count == 2);
    assert (streq (hooks->items[0].webhook_id, "wh_a"));
    sbx_msg_destroy (&list);
    sbx_msg_t *log = sbx_msg_new (SBX_MSG_WEBHOOK_DELIVERIES_OK);
    sbx_webhook_delivery_list_t *deliveries = &sbx_msg_webhook_deliveries_ok (log)->deliveries;
    assert (hook_store_deliveries (store, "wh_b", 10, deliveries) == 0 && deliveries->count == 2);
    assert (streq (deliveries->items[0].event_id, "evt_6"));
    sbx_msg_destroy (&log);
    assert (hook_store_delete (store, "wh_b") == 0);
    assert (hook_store_create (store, "wh_c", "acc_2", "http://h/c", "", "whsec_x", 12) == 0);
    assert (hook_store_delete_account (store, "acc_2") == 0 &&
            hook_store_count (store, "acc_2") == 0);
    hook_store_destroy (&store);
    //  What was written survives a reopen.
    store = hook_store_new (path);
    assert (store && hook_store_last_seq (store) == 8 && hook_store_count (store, "acc_1") == 1);
    hook_store_destroy (&store);
    char command[160];
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
}
