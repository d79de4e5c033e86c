/*  bill_store - see bill_store.h */
#include "bill_store.h"
#include "sbx_common.h"
#include "sbx_db.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

//  --------------------------------------------------------------------------
//  Schema migrations. Entry i brings the schema from version i to i + 1, in one
//  transaction together with its schema_version row. To change the schema, APPEND an
//  entry; never edit or reorder a shipped one.

static const char *s_migrations[] = {
    //  1: accounts and wallets, sandboxes, intervals in ready, the ledger, meta.
    "CREATE TABLE meta ("
    "  key TEXT NOT NULL PRIMARY KEY,"
    "  value TEXT NOT NULL);"
    "CREATE TABLE accounts ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  email TEXT COLLATE NOCASE,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX accounts_by_email ON accounts (email);"
    "CREATE TABLE wallets ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  name TEXT NOT NULL,"
    "  balance_micro INTEGER NOT NULL,"
    "  active INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL);"
    //  Charges go to exactly one wallet per account.
    "CREATE UNIQUE INDEX wallets_active ON wallets (account) WHERE active;"
    "CREATE TABLE sandboxes ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  type TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  rate INTEGER NOT NULL DEFAULT 0,"
    "  rate_ms INTEGER NOT NULL DEFAULT 0,"
    "  total_ms INTEGER NOT NULL DEFAULT 0,"
    "  total_micro INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX sandboxes_by_account ON sandboxes (account);"
    //  end_seq NULL: open (the sandbox is in ready). At most one open per sandbox.
    "CREATE TABLE intervals ("
    "  id INTEGER PRIMARY KEY,"
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),"
    "  start_seq INTEGER NOT NULL UNIQUE,"
    "  start_ms INTEGER NOT NULL,"
    "  end_seq INTEGER UNIQUE,"
    "  end_ms INTEGER,"
    "  ms INTEGER,"
    "  rate INTEGER,"
    "  rate_ms_before INTEGER,"
    "  micro INTEGER);"
    "CREATE UNIQUE INDEX intervals_open ON intervals (sandbox_id) WHERE end_seq IS NULL;"
    "CREATE INDEX intervals_by_sandbox ON intervals (sandbox_id, start_seq);"
    //  seq UNIQUE: one event closes one interval, and is charged once.
    "CREATE TABLE ledger ("
    "  id INTEGER PRIMARY KEY,"
    "  account TEXT NOT NULL,"
    "  wallet TEXT NOT NULL REFERENCES wallets (id),"
    "  sandbox_id TEXT NOT NULL,"
    "  interval_id INTEGER NOT NULL REFERENCES intervals (id),"
    "  seq INTEGER NOT NULL UNIQUE,"
    "  ts_ms INTEGER NOT NULL,"
    "  seconds INTEGER NOT NULL,"
    "  ms INTEGER NOT NULL,"
    "  micro INTEGER NOT NULL);"
    "CREATE INDEX ledger_by_account ON ledger (account, seq);",
    //  2: what the ledger took from each wallet, kept with it: the funds check reads one
    //  row a second, not the account's whole ledger.
    "ALTER TABLE wallets ADD COLUMN charged_micro INTEGER NOT NULL DEFAULT 0;"
    "UPDATE wallets SET charged_micro = "
    "  (SELECT coalesce (sum (micro), 0) FROM ledger WHERE ledger.wallet = wallets.id);",
    //  3: an account's wallets by its index (usage.get lists them), not by reading all.
    "CREATE INDEX wallets_by_account ON wallets (account, created_ms);",
};

#define MIGRATION_COUNT ((int) (sizeof s_migrations / sizeof s_migrations[0]))

typedef enum {
    ST_META_GET,
    ST_META_SET,
    ST_LEASE_TAKE,
    ST_ACCOUNT_INSERT,
    ST_ACCOUNT_RESOLVE,
    ST_WALLET_INSERT,
    ST_WALLET_ACTIVE,
    ST_WALLET_DEBIT,
    ST_WALLET_CREDIT,
    ST_WALLET_ENSURE,
    ST_WALLET_DEACTIVATE,
    ST_WALLET_SET_ACTIVE,
    ST_WALLETS,
    ST_WALLET_CHARGED,
    ST_SANDBOX_FIND,
    ST_SANDBOX_PUT,
    ST_INTERVAL_OPEN_FIND,
    ST_INTERVAL_OPEN,
    ST_INTERVAL_CLOSE,
    ST_CHARGE_ADD,
    ST_WALLET_CHARGE,
    ST_LEDGER_TOTALS,
    ST_INTERVALS,
    ST_INTERVALS_OPEN,
    ST_ACCOUNTS,
    ST_COUNT
} stmt_id_t;

static const char *s_sql[ST_COUNT] = {
    [ST_ACCOUNTS] = "SELECT id FROM accounts ORDER BY id",
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    //  The lease ("holder until_ms"): taken when free, expired or already ours; the row
    //  changes (changes = 1) only then.
    [ST_LEASE_TAKE] = "INSERT INTO meta (key, value) VALUES ('lease', ?1 || ' ' || ?2) "
                      "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
                      "WHERE substr (meta.value, 1, instr (meta.value, ' ') - 1) = ?1 "
                      "OR CAST (substr (meta.value, instr (meta.value, ' ') + 1) AS INTEGER) < ?3",
    [ST_META_SET] = "INSERT INTO meta (key, value) VALUES (?1, ?2) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    [ST_ACCOUNT_INSERT] = "INSERT INTO accounts (id, email, created_ms) VALUES (?1, ?2, ?3) "
                          "ON CONFLICT (id) DO UPDATE SET email = coalesce (excluded.email, email)",
    [ST_ACCOUNT_RESOLVE] = "SELECT id, email FROM accounts WHERE id = ?1 OR email = ?1 "
                           "ORDER BY id = ?1 DESC LIMIT 1",
    [ST_WALLET_INSERT] =
        "INSERT INTO wallets (id, account, name, balance_micro, active, created_ms) "
        "SELECT ?1, ?2, 'main', ?3, 1, ?4 WHERE NOT EXISTS "
        "(SELECT 1 FROM wallets WHERE account = ?2 AND active)",
    [ST_WALLET_ACTIVE] = "SELECT id, balance_micro FROM wallets WHERE account = ?1 AND active",
    [ST_WALLET_DEBIT] = "UPDATE wallets SET balance_micro = balance_micro - ?2 WHERE id = ?1",
    [ST_WALLET_CREDIT] = "UPDATE wallets SET balance_micro = balance_micro + ?2 WHERE id = ?1",
    [ST_WALLET_ENSURE] =
        "INSERT INTO wallets (id, account, name, balance_micro, active, created_ms) "
        "VALUES (?1, ?2, ?3, 0, 0, ?4) ON CONFLICT (id) DO NOTHING",
    [ST_WALLET_DEACTIVATE] = "UPDATE wallets SET active = 0 WHERE account = ?1 AND active",
    [ST_WALLET_SET_ACTIVE] = "UPDATE wallets SET active = 1 WHERE id = ?1",
    [ST_WALLETS] = "SELECT name, balance_micro, active FROM wallets WHERE account = ?1 "
                   "ORDER BY created_ms, name",
    [ST_WALLET_CHARGED] = "SELECT coalesce ((SELECT charged_micro FROM wallets "
                          "WHERE account = ?1 AND id = ?2), 0)",
    [ST_SANDBOX_FIND] = "SELECT id, account, type, state, rate, rate_ms, total_ms, total_micro "
                        "FROM sandboxes WHERE id = ?1",
    [ST_SANDBOX_PUT] =
        "INSERT INTO sandboxes (id, account, type, state, rate, rate_ms, total_ms, total_micro) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (id) DO UPDATE SET "
        "account = excluded.account, type = excluded.type, state = excluded.state, "
        "rate = excluded.rate, rate_ms = excluded.rate_ms, total_ms = excluded.total_ms, "
        "total_micro = excluded.total_micro",
    [ST_INTERVAL_OPEN_FIND] =
        "SELECT id, start_ms FROM intervals WHERE sandbox_id = ?1 AND end_seq IS NULL",
    [ST_INTERVAL_OPEN] =
        "INSERT INTO intervals (sandbox_id, start_seq, start_ms) VALUES (?1, ?2, ?3)",
    [ST_INTERVAL_CLOSE] = "UPDATE intervals SET end_seq = ?2, end_ms = ?3, ms = ?4, rate = ?5, "
                          "rate_ms_before = ?6, micro = ?7 WHERE id = ?1 AND end_seq IS NULL",
    [ST_CHARGE_ADD] = "INSERT INTO ledger (account, wallet, sandbox_id, interval_id, seq, ts_ms, "
                      "seconds, ms, micro) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [ST_WALLET_CHARGE] = "UPDATE wallets SET charged_micro = charged_micro + ?2 WHERE id = ?1",
    [ST_LEDGER_TOTALS] = "SELECT coalesce (sum (ms), 0), coalesce (sum (micro), 0) FROM ledger "
                         "WHERE account = ?1",
    [ST_INTERVALS] =
        "SELECT i.id, i.sandbox_id, s.type, s.state, i.start_seq, i.start_ms, "
        "coalesce (i.end_seq, 0), coalesce (i.end_ms, 0), coalesce (i.rate, 0), "
        "coalesce (i.rate_ms_before, 0), coalesce (i.micro, 0), s.rate, s.rate_ms "
        "FROM intervals i JOIN sandboxes s ON s.id = i.sandbox_id "
        "WHERE s.account = ?1 AND (?2 IS NULL OR s.id = ?2) ORDER BY s.rowid, i.start_seq",
    //  The same columns, only the open ones (intervals_open): as many as sandboxes run.
    [ST_INTERVALS_OPEN] =
        "SELECT i.id, i.sandbox_id, s.type, s.state, i.start_seq, i.start_ms, 0, 0, 0, 0, 0, "
        //  CROSS JOIN keeps the account's sandboxes outside: else SQLite walks every open
        //  interval of every account (the funds check, each second, for each account).
        "s.rate, s.rate_ms FROM sandboxes s CROSS JOIN intervals i ON i.sandbox_id = s.id AND "
        "i.end_seq IS NULL WHERE s.account = ?1 AND (?2 IS NULL OR s.id = ?2) ORDER BY s.rowid",
};

struct _bill_store_t {
    sbx_db_t *db;
};

//  --------------------------------------------------------------------------
//  Opening and transactions: sbx_db's

bill_store_t *bill_store_new (const char *path)
{
    bill_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    //  FULL (sbx_db's): a committed charge and its last_seq survive a power cut together.
    self->db = sbx_db_new (path, "sbx-billing", s_migrations, MIGRATION_COUNT, s_sql, ST_COUNT);
    if (!self->db)
        bill_store_destroy (&self);
    return self;
}

bill_store_t *bill_store_new_cluster (const sbx_dqlite_cluster_t *cluster)
{
    bill_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->db = sbx_db_new_cluster (cluster, "billing", "sbx-billing", s_migrations, MIGRATION_COUNT,
                                   s_sql, ST_COUNT);
    if (!self->db)
        bill_store_destroy (&self);
    return self;
}

//  The meta row of the copy: "started" while it runs, "done" after.
static char *s_meta (bill_store_t *self, const char *key)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_GET);
    sbx_db_bind_text (stmt, 1, key);
    char *value = NULL;
    if (sbx_stmt_step (stmt) == SQLITE_ROW)
        value = sbx_db_column_dup (stmt, 0, NULL);
    sbx_db_reset (stmt);
    return value;
}

static int s_meta_set (bill_store_t *self, const char *key, const char *value)
{
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_SET);
    sbx_db_bind_text (stmt, 1, key);
    sbx_db_bind_text (stmt, 2, value);
    return sbx_db_run (self->db, ST_META_SET, "meta set");
}

int bill_store_import (bill_store_t *self, const char *path, char *err, size_t err_size)
{
    char *state = s_meta (self, "import");
    bool resume = state && strcmp (state, "started") == 0, done = state && !resume;
    free (state);
    if (done)
        return 0;
    if (!resume && bill_store_last_seq (self) > 0) {
        sbx_warn ("store %s: %s is not copied in: the cluster has billing already (this node "
                  "joined one; move the file away)",
                  sbx_db_path (self->db), path);
        return 0;
    }
    bill_store_t *file = bill_store_new (path); //  at this billing's schema first
    if (!file) {
        snprintf (err, err_size, "cannot open %s (its log says why)", path);
        return -1;
    }
    bill_store_destroy (&file);
    uint64_t rows = 0;
    //  The lease is this cluster's, not the file's.
    const char *skip[] = {NULL};
    if (s_meta_set (self, "import", "started") ||
        sbx_db_import (self->db, path, skip, &rows, err, err_size) ||
        sbx_db_exec (self->db, "DELETE FROM meta WHERE key = 'lease'", "lease") ||
        s_meta_set (self, "import", "done")) {
        if (!*err)
            snprintf (err, err_size, "the cluster's store does not answer");
        return -1;
    }
    sbx_info ("store %s: %llu rows of %s copied in", sbx_db_path (self->db),
              (unsigned long long) rows, path);
    return 1;
}

bool bill_store_is_cluster (bill_store_t *self)
{
    return self && sbx_db_is_cluster (self->db);
}

int bill_store_lease (bill_store_t *self, const char *holder, uint64_t now_ms, uint64_t until_ms)
{
    if (!self || !sbx_db_nonempty (holder) || strchr (holder, ' ') || !sbx_db_fits (until_ms))
        return -1;
    char until[32];
    snprintf (until, sizeof until, "%llu", (unsigned long long) until_ms);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_LEASE_TAKE);
    sbx_db_bind_text (stmt, 1, holder);
    sbx_db_bind_text (stmt, 2, until);
    sbx_stmt_bind_int64 (stmt, 3, (int64_t) now_ms);
    if (sbx_db_run (self->db, ST_LEASE_TAKE, "lease"))
        return -1;
    return sbx_db_changes (self->db) == 1 ? 1 : 0;
}

void bill_store_destroy (bill_store_t **self_p)
{
    assert (self_p);
    bill_store_t *self = *self_p;
    if (!self)
        return;
    sbx_db_destroy (&self->db);
    free (self);
    *self_p = NULL;
}

int bill_store_schema_version (bill_store_t *self)
{
    return self ? sbx_db_schema_version (self->db) : -1;
}

int bill_store_begin (bill_store_t *self)
{
    return self ? sbx_db_begin (self->db) : -1;
}

int bill_store_commit (bill_store_t *self)
{
    return self ? sbx_db_commit (self->db) : -1;
}

int bill_store_rollback (bill_store_t *self)
{
    return self ? sbx_db_rollback (self->db) : -1;
}

int bill_store_read_begin (bill_store_t *self)
{
    return self ? sbx_db_read_begin (self->db) : 0;
}

void bill_store_read_end (bill_store_t *self, int opened)
{
    if (self)
        sbx_db_read_end (self->db, opened);
}

//  --------------------------------------------------------------------------
//  Last applied seq

uint64_t bill_store_last_seq (bill_store_t *self)
{
    if (!self)
        return 0;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_GET);
    sbx_db_bind_text (stmt, 1, "last_seq");
    uint64_t seq = 0;
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        const char *text = (const char *) sbx_stmt_column_text (stmt, 0);
        seq = text ? strtoull (text, NULL, 10) : 0;
    } else if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "last seq");
    sbx_db_reset (stmt);
    return seq;
}

int bill_store_set_last_seq (bill_store_t *self, uint64_t seq)
{
    if (!self || !sbx_db_require_transaction (self->db, "set last seq"))
        return -1;
    char text[32];
    snprintf (text, sizeof text, "%llu", (unsigned long long) seq);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_META_SET);
    sbx_db_bind_text (stmt, 1, "last_seq");
    sbx_db_bind_text (stmt, 2, text);
    return sbx_db_run (self->db, ST_META_SET, "set last seq");
}

//  --------------------------------------------------------------------------
//  Accounts and wallets

int bill_store_account_add (bill_store_t *self, const char *id, const char *email, int64_t initial,
                            uint64_t ts_ms)
{
    if (!self || !sbx_db_nonempty (id) || !sbx_db_fits (ts_ms) ||
        !sbx_db_require_transaction (self->db, "account add"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_INSERT);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, email);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) ts_ms);
    if (sbx_db_run (self->db, ST_ACCOUNT_INSERT, "account add"))
        return -1;
    //  The wallet id derives from the account: a replay makes the same one.
    char wallet[96];
    snprintf (wallet, sizeof wallet, "wal_%s_main", id);
    stmt = sbx_db_stmt (self->db, ST_WALLET_INSERT);
    sbx_db_bind_text (stmt, 1, wallet);
    sbx_db_bind_text (stmt, 2, id);
    sbx_stmt_bind_int64 (stmt, 3, initial);
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) ts_ms);
    return sbx_db_run (self->db, ST_WALLET_INSERT, "wallet add");
}

char *bill_store_account_resolve (bill_store_t *self, const char *id_or_email, char **email_p)
{
    if (email_p)
        *email_p = NULL;
    if (!self || !sbx_db_nonempty (id_or_email))
        return NULL;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_RESOLVE);
    sbx_db_bind_text (stmt, 1, id_or_email);
    char *id = NULL;
    bool failed = false;
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        id = sbx_db_column_dup (stmt, 0, &failed);
        if (email_p)
            *email_p = sbx_db_column_dup (stmt, 1, &failed);
    } else if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "account resolve");
    sbx_db_reset (stmt);
    return id;
}

int bill_store_wallet_active (bill_store_t *self, const char *account, char **wallet_p,
                              int64_t *balance_p)
{
    if (!self || !sbx_db_nonempty (account))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLET_ACTIVE);
    sbx_db_bind_text (stmt, 1, account);
    int result = 1;
    bool failed = false;
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        if (wallet_p)
            *wallet_p = sbx_db_column_dup (stmt, 0, &failed);
        if (balance_p)
            *balance_p = sbx_stmt_column_int64 (stmt, 1);
        result = failed ? -1 : 0;
    } else if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "wallet active");
        result = -1;
    }
    sbx_db_reset (stmt);
    return result;
}

int bill_store_wallet_debit (bill_store_t *self, const char *wallet, uint64_t micro)
{
    if (!self || !sbx_db_nonempty (wallet) || !sbx_db_fits (micro) ||
        !sbx_db_require_transaction (self->db, "wallet debit"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLET_DEBIT);
    sbx_db_bind_text (stmt, 1, wallet);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) micro);
    if (sbx_db_run (self->db, ST_WALLET_DEBIT, "wallet debit"))
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : -1;
}

int bill_store_wallet_credit (bill_store_t *self, const char *wallet, uint64_t micro)
{
    if (!self || !sbx_db_nonempty (wallet) || !sbx_db_fits (micro) ||
        !sbx_db_require_transaction (self->db, "wallet credit"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLET_CREDIT);
    sbx_db_bind_text (stmt, 1, wallet);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) micro);
    if (sbx_db_run (self->db, ST_WALLET_CREDIT, "wallet credit"))
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : -1;
}

int bill_store_wallet_ensure (bill_store_t *self, const char *account, const char *name,
                              uint64_t ts_ms, char **wallet_p)
{
    *wallet_p = NULL;
    if (!self || !sbx_db_nonempty (account) || !sbx_db_nonempty (name) || !sbx_db_fits (ts_ms) ||
        !sbx_db_require_transaction (self->db, "wallet ensure"))
        return -1;
    //  The id derives from account and name (as "main"'s does): a replay makes the same.
    char *wallet = zsys_sprintf ("wal_%s_%s", account, name);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLET_ENSURE);
    sbx_db_bind_text (stmt, 1, wallet);
    sbx_db_bind_text (stmt, 2, account);
    sbx_db_bind_text (stmt, 3, name);
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) ts_ms);
    if (!wallet || sbx_db_run (self->db, ST_WALLET_ENSURE, "wallet ensure")) {
        zstr_free (&wallet);
        return -1;
    }
    *wallet_p = strdup (wallet);
    zstr_free (&wallet);
    return *wallet_p ? 0 : -1;
}

int bill_store_wallet_activate (bill_store_t *self, const char *account, const char *wallet)
{
    if (!self || !sbx_db_nonempty (account) || !sbx_db_nonempty (wallet) ||
        !sbx_db_require_transaction (self->db, "wallet activate"))
        return -1;
    //  Off first: the unique index allows one active wallet per account at any moment.
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_WALLET_DEACTIVATE), 1, account);
    if (sbx_db_run (self->db, ST_WALLET_DEACTIVATE, "wallet deactivate"))
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_WALLET_SET_ACTIVE), 1, wallet);
    if (sbx_db_run (self->db, ST_WALLET_SET_ACTIVE, "wallet activate"))
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : -1;
}

int bill_store_wallets (bill_store_t *self, const char *account, bill_store_wallet_fn *fn,
                        void *arg)
{
    if (!self || !sbx_db_nonempty (account) || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLETS);
    sbx_db_bind_text (stmt, 1, account);
    int rc, count = 0;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        const char *name = (const char *) sbx_stmt_column_text (stmt, 0);
        fn (name ? name : "", sbx_stmt_column_int64 (stmt, 1), sbx_stmt_column_int (stmt, 2) != 0,
            arg);
        count++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "wallets");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int bill_store_wallet_charged (bill_store_t *self, const char *account, const char *wallet,
                               uint64_t *micro_p)
{
    if (!self || !sbx_db_nonempty (account) || !sbx_db_nonempty (wallet))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_WALLET_CHARGED);
    sbx_db_bind_text (stmt, 1, account);
    sbx_db_bind_text (stmt, 2, wallet);
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW)
        *micro_p = sbx_db_column_u64 (stmt, 0);
    else
        sbx_db_log_error (self->db, "wallet charged");
    sbx_db_reset (stmt);
    return rc == SQLITE_ROW ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  Sandboxes and intervals

void bill_sandbox_clear (bill_sandbox_t *sandbox)
{
    if (!sandbox)
        return;
    free (sandbox->id);
    free (sandbox->account);
    free (sandbox->type);
    free (sandbox->state);
    memset (sandbox, 0, sizeof *sandbox);
}

int bill_store_sandbox_find (bill_store_t *self, const char *id, bill_sandbox_t *out)
{
    if (!self || !sbx_db_nonempty (id) || !out)
        return -1;
    memset (out, 0, sizeof *out);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_FIND);
    sbx_db_bind_text (stmt, 1, id);
    int result = 1;
    bool failed = false;
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        out->id = sbx_db_column_dup (stmt, 0, &failed);
        out->account = sbx_db_column_dup (stmt, 1, &failed);
        out->type = sbx_db_column_dup (stmt, 2, &failed);
        out->state = sbx_db_column_dup (stmt, 3, &failed);
        out->rate = sbx_db_column_u64 (stmt, 4);
        out->rate_ms = sbx_db_column_u64 (stmt, 5);
        out->total_ms = sbx_db_column_u64 (stmt, 6);
        out->total_micro = sbx_db_column_u64 (stmt, 7);
        result = failed ? -1 : 0;
    } else if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "sandbox find");
        result = -1;
    }
    sbx_db_reset (stmt);
    if (result == -1)
        bill_sandbox_clear (out);
    return result;
}

int bill_store_sandbox_put (bill_store_t *self, const bill_sandbox_t *s)
{
    if (!self || !s || !sbx_db_nonempty (s->id) || !sbx_db_nonempty (s->account) ||
        !sbx_db_nonempty (s->type) || !sbx_db_nonempty (s->state) || !sbx_db_fits (s->rate) ||
        !sbx_db_fits (s->rate_ms) || !sbx_db_fits (s->total_ms) || !sbx_db_fits (s->total_micro) ||
        !sbx_db_require_transaction (self->db, "sandbox put"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_PUT);
    sbx_db_bind_text (stmt, 1, s->id);
    sbx_db_bind_text (stmt, 2, s->account);
    sbx_db_bind_text (stmt, 3, s->type);
    sbx_db_bind_text (stmt, 4, s->state);
    sbx_stmt_bind_int64 (stmt, 5, (sqlite3_int64) s->rate);
    sbx_stmt_bind_int64 (stmt, 6, (sqlite3_int64) s->rate_ms);
    sbx_stmt_bind_int64 (stmt, 7, (sqlite3_int64) s->total_ms);
    sbx_stmt_bind_int64 (stmt, 8, (sqlite3_int64) s->total_micro);
    return sbx_db_run (self->db, ST_SANDBOX_PUT, "sandbox put");
}

int bill_store_interval_open_find (bill_store_t *self, const char *sandbox_id, int64_t *id_p,
                                   uint64_t *start_ms_p)
{
    if (!self || !sbx_db_nonempty (sandbox_id))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_INTERVAL_OPEN_FIND);
    sbx_db_bind_text (stmt, 1, sandbox_id);
    int result = 1;
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        if (id_p)
            *id_p = sbx_stmt_column_int64 (stmt, 0);
        if (start_ms_p)
            *start_ms_p = sbx_db_column_u64 (stmt, 1);
        result = 0;
    } else if (rc != SQLITE_DONE) {
        sbx_db_log_error (self->db, "open interval");
        result = -1;
    }
    sbx_db_reset (stmt);
    return result;
}

int bill_store_interval_open (bill_store_t *self, const char *sandbox_id, uint64_t start_seq,
                              uint64_t start_ms)
{
    if (!self || !sbx_db_nonempty (sandbox_id) || !sbx_db_fits (start_seq) ||
        !sbx_db_fits (start_ms) || !sbx_db_require_transaction (self->db, "interval open"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_INTERVAL_OPEN);
    sbx_db_bind_text (stmt, 1, sandbox_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) start_seq);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) start_ms);
    return sbx_db_run (self->db, ST_INTERVAL_OPEN, "interval open");
}

int bill_store_interval_close (bill_store_t *self, int64_t id, uint64_t end_seq, uint64_t end_ms,
                               uint64_t ms, uint64_t rate, uint64_t rate_ms_before, uint64_t micro)
{
    if (!self || !sbx_db_fits (end_seq) || !sbx_db_fits (end_ms) || !sbx_db_fits (ms) ||
        !sbx_db_fits (rate) || !sbx_db_fits (rate_ms_before) || !sbx_db_fits (micro) ||
        !sbx_db_require_transaction (self->db, "interval close"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_INTERVAL_CLOSE);
    sbx_stmt_bind_int64 (stmt, 1, id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) end_seq);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) end_ms);
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) ms);
    sbx_stmt_bind_int64 (stmt, 5, (sqlite3_int64) rate);
    sbx_stmt_bind_int64 (stmt, 6, (sqlite3_int64) rate_ms_before);
    sbx_stmt_bind_int64 (stmt, 7, (sqlite3_int64) micro);
    if (sbx_db_run (self->db, ST_INTERVAL_CLOSE, "interval close"))
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : -1;
}

int bill_store_charge_add (bill_store_t *self, const bill_charge_t *c)
{
    if (!self || !c || !sbx_db_nonempty (c->account) || !sbx_db_nonempty (c->wallet) ||
        !sbx_db_nonempty (c->sandbox_id) || !sbx_db_fits (c->seq) || !sbx_db_fits (c->ts_ms) ||
        !sbx_db_fits (c->ms) || !sbx_db_fits (c->micro) ||
        !sbx_db_require_transaction (self->db, "charge add"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_CHARGE_ADD);
    sbx_db_bind_text (stmt, 1, c->account);
    sbx_db_bind_text (stmt, 2, c->wallet);
    sbx_db_bind_text (stmt, 3, c->sandbox_id);
    sbx_stmt_bind_int64 (stmt, 4, c->interval);
    sbx_stmt_bind_int64 (stmt, 5, (sqlite3_int64) c->seq);
    sbx_stmt_bind_int64 (stmt, 6, (sqlite3_int64) c->ts_ms);
    sbx_stmt_bind_int64 (stmt, 7, (sqlite3_int64) (c->ms / 1000));
    sbx_stmt_bind_int64 (stmt, 8, (sqlite3_int64) c->ms);
    sbx_stmt_bind_int64 (stmt, 9, (sqlite3_int64) c->micro);
    if (sbx_db_run (self->db, ST_CHARGE_ADD, "charge add"))
        return -1;
    stmt = sbx_db_stmt (self->db, ST_WALLET_CHARGE);
    sbx_db_bind_text (stmt, 1, c->wallet);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) c->micro);
    return sbx_db_run (self->db, ST_WALLET_CHARGE, "wallet charge");
}

int bill_store_ledger_totals (bill_store_t *self, const char *account, uint64_t *ms_p,
                              uint64_t *micro_p)
{
    if (!self || !sbx_db_nonempty (account))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_LEDGER_TOTALS);
    sbx_db_bind_text (stmt, 1, account);
    int rc = sbx_stmt_step (stmt);
    if (rc == SQLITE_ROW) {
        if (ms_p)
            *ms_p = sbx_db_column_u64 (stmt, 0);
        if (micro_p)
            *micro_p = sbx_db_column_u64 (stmt, 1);
    } else
        sbx_db_log_error (self->db, "ledger totals");
    sbx_db_reset (stmt);
    return rc == SQLITE_ROW ? 0 : -1;
}

int bill_store_accounts (bill_store_t *self, bill_store_account_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    //  Collected first, so fn may use the store.
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNTS);
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW)
        zlist_append (ids, (void *) sbx_stmt_column_text (stmt, 0));
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "accounts");
    sbx_db_reset (stmt);
    int count = 0;
    for (char *id = zlist_first (ids); id; id = zlist_next (ids), count++)
        fn (id, arg);
    zlist_destroy (&ids);
    return rc == SQLITE_DONE ? count : -1;
}

static int s_intervals (bill_store_t *self, stmt_id_t id, const char *account,
                        const char *sandbox_id, bill_store_interval_fn *fn, void *arg)
{
    if (!self || !sbx_db_nonempty (account) || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, id);
    if (sbx_stmt_busy (stmt)) {
        sbx_warn ("store %s: intervals called from its own callback", sbx_db_path (self->db));
        return -1;
    }
    sbx_db_bind_text (stmt, 1, account);
    sbx_db_bind_text (stmt, 2, sandbox_id && *sandbox_id ? sandbox_id : NULL);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        bill_interval_row_t row = {
            .id = sbx_stmt_column_int64 (stmt, 0),
            .sandbox_id = (const char *) sbx_stmt_column_text (stmt, 1),
            .type = (const char *) sbx_stmt_column_text (stmt, 2),
            .state = (const char *) sbx_stmt_column_text (stmt, 3),
            .start_seq = sbx_db_column_u64 (stmt, 4),
            .start_ms = sbx_db_column_u64 (stmt, 5),
            .end_seq = sbx_db_column_u64 (stmt, 6),
            .end_ms = sbx_db_column_u64 (stmt, 7),
            .rate = sbx_db_column_u64 (stmt, 8),
            .rate_ms_before = sbx_db_column_u64 (stmt, 9),
            .micro = sbx_db_column_u64 (stmt, 10),
            .sandbox_rate = sbx_db_column_u64 (stmt, 11),
            .sandbox_rate_ms = sbx_db_column_u64 (stmt, 12),
        };
        if (!row.sandbox_id || !row.type || !row.state) {
            rc = SQLITE_NOMEM;
            break;
        }
        count++;
        fn (&row, arg);
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "intervals");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int bill_store_intervals (bill_store_t *self, const char *account, const char *sandbox_id,
                          bill_store_interval_fn *fn, void *arg)
{
    return s_intervals (self, ST_INTERVALS, account, sandbox_id, fn, arg);
}

int bill_store_intervals_open (bill_store_t *self, const char *account, bill_store_interval_fn *fn,
                               void *arg)
{
    return s_intervals (self, ST_INTERVALS_OPEN, account, NULL, fn, arg);
}

//  --------------------------------------------------------------------------
//  Self test

static void s_count_row (const bill_interval_row_t *row, void *arg)
{
    (void) row;
    (*(int *) arg)++;
}

//  The whole tables statements may read: every account, for the funds check each second;
//  and the ledger that inserting a wallet plans to scan for its foreign key, which SQLite
//  runs only while deferred violations are outstanding (sbx's keys are immediate).
static bool s_test_allow (int index, const char *table)
{
    return (index == ST_ACCOUNTS && streq (table, "accounts")) ||
           (index == ST_WALLET_INSERT && streq (table, "ledger"));
}

void bill_store_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/bill_store_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/billing.db", dir);
    bill_store_t *store = bill_store_new (path);
    assert (store && bill_store_schema_version (store) == MIGRATION_COUNT);
    //  No statement reads a table that grows with history from end to end.
    assert (sbx_db_whole_reads (store->db, s_test_allow) == 0);
    struct stat st;
    assert (stat (path, &st) == 0 && (st.st_mode & 077) == 0);
    assert (bill_store_last_seq (store) == 0);

    //  Writes outside a transaction are refused.
    assert (bill_store_set_last_seq (store, 1) == -1);
    assert (bill_store_account_add (store, "acc_a", "a@example.com", 0, 1) == -1);

    //  An account gets one active wallet; adding it again changes nothing.
    assert (bill_store_begin (store) == 0);
    assert (bill_store_account_add (store, "acc_a", "a@example.com", 5000000, 1000) == 0);
    assert (bill_store_account_add (store, "acc_a", "a@example.com", 7, 1001) == 0);
    assert (bill_store_set_last_seq (store, 1) == 0);
    assert (bill_store_commit (store) == 0);
    char *email = NULL;
    char *id = bill_store_account_resolve (store, "A@Example.com", &email);
    assert (id && streq (id, "acc_a") && streq (email, "a@example.com"));
    free (id);
    free (email);
    assert (bill_store_account_resolve (store, "nobody", &email) == NULL && !email);
    char *wallet = NULL;
    int64_t balance = 0;
    assert (bill_store_wallet_active (store, "acc_a", &wallet, &balance) == 0);
    assert (balance == 5000000 && streq (wallet, "wal_acc_a_main"));

    //  An interval opens, can't open twice, closes once, and is charged once.
    bill_sandbox_t sandbox = {.id = "sb_1", .account = "acc_a", .type = "small", .state = "ready"};
    assert (bill_store_begin (store) == 0);
    assert (bill_store_sandbox_put (store, &sandbox) == 0);
    assert (bill_store_interval_open (store, "sb_1", 2, 10000) == 0);
    assert (bill_store_interval_open (store, "sb_1", 3, 10001) == -1);
    assert (bill_store_set_last_seq (store, 2) == 0);
    assert (bill_store_commit (store) == 0);
    int64_t open_id = 0;
    uint64_t start = 0;
    assert (bill_store_interval_open_find (store, "sb_1", &open_id, &start) == 0);
    assert (start == 10000);
    assert (bill_store_begin (store) == 0);
    assert (bill_store_interval_close (store, open_id, 4, 12500, 2500, 10, 0, 25) == 0);
    assert (bill_store_interval_close (store, open_id, 5, 12600, 2600, 10, 0, 26) == -1);
    bill_charge_t charge = {.account = "acc_a",
                            .wallet = wallet,
                            .sandbox_id = "sb_1",
                            .interval = open_id,
                            .seq = 4,
                            .ts_ms = 12500,
                            .ms = 2500,
                            .micro = 25};
    assert (bill_store_charge_add (store, &charge) == 0);
    assert (bill_store_charge_add (store, &charge) == -1); //  one charge per closing event
    assert (bill_store_wallet_debit (store, wallet, 25) == 0);
    sandbox.state = "stopped";
    sandbox.rate = 10;
    sandbox.rate_ms = sandbox.total_ms = 2500;
    sandbox.total_micro = 25;
    assert (bill_store_sandbox_put (store, &sandbox) == 0);
    assert (bill_store_set_last_seq (store, 4) == 0);
    assert (bill_store_commit (store) == 0);
    assert (bill_store_interval_open_find (store, "sb_1", NULL, NULL) == 1);

    //  A rolled-back transaction leaves nothing, last_seq included.
    assert (bill_store_begin (store) == 0);
    assert (bill_store_interval_open (store, "sb_1", 6, 20000) == 0);
    assert (bill_store_set_last_seq (store, 6) == 0);
    assert (bill_store_rollback (store) == 0);
    assert (bill_store_last_seq (store) == 4);
    assert (bill_store_interval_open_find (store, "sb_1", NULL, NULL) == 1);
    free (wallet);

    //  Reopened: everything is there.
    bill_store_destroy (&store);
    store = bill_store_new (path);
    assert (store && bill_store_last_seq (store) == 4);
    bill_sandbox_t found;
    assert (bill_store_sandbox_find (store, "sb_1", &found) == 0);
    assert (found.total_ms == 2500 && found.total_micro == 25 && streq (found.state, "stopped"));
    bill_sandbox_clear (&found);
    assert (bill_store_sandbox_find (store, "sb_2", &found) == 1);
    uint64_t ms = 0, micro = 0;
    assert (bill_store_ledger_totals (store, "acc_a", &ms, &micro) == 0);
    assert (ms == 2500 && micro == 25);
    assert (bill_store_wallet_active (store, "acc_a", NULL, &balance) == 0 && balance == 4999975);
    int rows = 0;
    assert (bill_store_intervals (store, "acc_a", NULL, s_count_row, &rows) == 1 && rows == 1);
    uint64_t charged = 0;
    assert (bill_store_wallet_charged (store, "acc_a", "wal_acc_a_main", &charged) == 0 &&
            charged == 25);
    assert (bill_store_wallet_charged (store, "acc_a", "wal_none", &charged) == 0 && charged == 0);
    rows = 0;
    assert (bill_store_intervals_open (store, "acc_a", s_count_row, &rows) == 0 && rows == 0);
    bill_store_destroy (&store);
    bill_store_destroy (&store);

    //  Migration 2 on a store of version 1: each wallet's charged total from its ledger.
    snprintf (path, sizeof path, "%s/v1.db", dir);
    sbx_db_t *v1 = sbx_db_new (path, "sbx-billing", s_migrations, 1, NULL, 0);
    assert (v1);
    assert (sbx_db_exec (v1,
                         "INSERT INTO wallets VALUES ('wal_a', 'acc_a', 'main', 70, 1, 1), "
                         "('wal_b', 'acc_a', 'old', 0, 0, 1);"
                         "INSERT INTO sandboxes (id, account, type, state) VALUES "
                         "('sb_1', 'acc_a', 'small', 'stopped');"
                         "INSERT INTO intervals (id, sandbox_id, start_seq, start_ms, end_seq) "
                         "VALUES (1, 'sb_1', 1, 0, 2), (2, 'sb_1', 3, 0, 4), (3, 'sb_1', 5, 0, 6);"
                         "INSERT INTO ledger (account, wallet, sandbox_id, interval_id, seq, "
                         "ts_ms, seconds, ms, micro) VALUES ('acc_a', 'wal_a', 'sb_1', 1, 2, 0, "
                         "0, 0, 10), ('acc_a', 'wal_a', 'sb_1', 2, 4, 0, 0, 0, 20), ('acc_a', "
                         "'wal_b', 'sb_1', 3, 6, 0, 0, 0, 5)",
                         "v1 rows") == 0);
    sbx_db_destroy (&v1);
    store = bill_store_new (path);
    assert (store && bill_store_schema_version (store) == MIGRATION_COUNT);
    assert (bill_store_wallet_charged (store, "acc_a", "wal_a", &charged) == 0 && charged == 30);
    assert (bill_store_wallet_charged (store, "acc_a", "wal_b", &charged) == 0 && charged == 5);
    bill_store_destroy (&store);

    //  Not a database: refused.
    snprintf (path, sizeof path, "%s/junk.db", dir);
    FILE *junk = fopen (path, "w");
    fputs ("junk", junk);
    fclose (junk);
    assert (bill_store_new (path) == NULL);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}
