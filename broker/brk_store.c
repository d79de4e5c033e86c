/*  brk_store - see brk_store.h */
#include "brk_store_priv.h"
#include "sbx_log.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

//  --------------------------------------------------------------------------
//  Schema migrations. Entry i brings the schema from version i to i + 1, in one
//  transaction together with its schema_version row; a database is at version N
//  when it has rows 1..N.
//
//  To change the schema, APPEND a new entry (never edit or reorder a shipped one:
//  databases in the field have already run it), then prepare its statements in
//  s_sql below. SQLite cannot alter constraints in place: to change a table,
//  create the new one, copy, drop the old and rename, all in the same entry.

//  The states that hold a place on their vmd (its capacity counts them).
#define VMD_ACTIVE "('creating', 'ready', 'stopping', 'resuming', 'deleting')"

static const char *s_migrations[] = {
    //  1: accounts, API keys, the event log, meta.
    "CREATE TABLE accounts ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  email TEXT NOT NULL UNIQUE COLLATE NOCASE,"
    "  password_hash TEXT,"
    "  plan TEXT NOT NULL,"
    "  admin INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE TABLE api_keys ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account_id TEXT NOT NULL REFERENCES accounts (id),"
    "  kind TEXT NOT NULL,"
    "  name TEXT,"
    "  preset TEXT,"
    "  prefix TEXT,"
    "  hash TEXT NOT NULL UNIQUE,"
    "  created_ms INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL DEFAULT 0,"
    "  last_used_ms INTEGER NOT NULL DEFAULT 0,"
    "  revoked_ms INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX api_keys_by_account ON api_keys (account_id, created_ms);"
    //  AUTOINCREMENT: a seq is never reused, even after old events are deleted.
    "CREATE TABLE events ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  ts_ms INTEGER NOT NULL,"
    "  type TEXT NOT NULL,"
    "  account TEXT,"
    "  subject TEXT,"
    "  payload BLOB);"
    "CREATE TABLE meta ("
    "  key TEXT NOT NULL PRIMARY KEY,"
    "  value TEXT NOT NULL);",
    //  2: sandboxes and their labels. Deleted sandboxes stay (audit) but free their
    //  readable label for reuse.
    "CREATE TABLE sandboxes ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account_id TEXT NOT NULL REFERENCES accounts (id),"
    "  name TEXT,"
    "  label TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  type TEXT NOT NULL,"
    "  vmd TEXT,"
    "  no_network INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL DEFAULT 0,"
    "  ttl_s INTEGER NOT NULL DEFAULT 0,"
    "  changed_ms INTEGER NOT NULL,"
    "  reason TEXT,"
    "  key_id TEXT);" //  the key that created it (the ci preset acts on those only)
    "CREATE UNIQUE INDEX sandboxes_label ON sandboxes (label) WHERE state != 'deleted';"
    "CREATE INDEX sandboxes_by_account ON sandboxes (account_id, created_ms);"
    "CREATE INDEX sandboxes_by_vmd ON sandboxes (vmd, state);"
    "CREATE TABLE sandbox_labels ("
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),"
    "  key TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY (sandbox_id, key));",
    //  3: published guest ports (host_port) and where their forwards listen.
    "CREATE TABLE sandbox_ports ("
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),"
    "  port INTEGER NOT NULL,"
    "  host TEXT NOT NULL,"
    "  host_port INTEGER NOT NULL,"
    "  public INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (sandbox_id, port));",
    //  4: plan limits. Every start (create or resume) is a row, so starts per day are
    //  counted from the store after a restart; funds_exhausted is billing's last word
    //  on the account's wallet.
    "CREATE TABLE sandbox_starts ("
    "  account_id TEXT NOT NULL,"
    "  sandbox_id TEXT NOT NULL,"
    "  ts_ms INTEGER NOT NULL);"
    "CREATE INDEX sandbox_starts_by_account ON sandbox_starts (account_id, ts_ms);"
    "ALTER TABLE accounts ADD COLUMN funds_exhausted INTEGER NOT NULL DEFAULT 0;",
    //  5: OAuth. Registered (DCR) clients; authorization codes, access and refresh
    //  tokens in one table, found by the SHA-256 of their secret. A grant is a
    //  connection row of api_keys: revoking it there stops its tokens.
    "CREATE TABLE oauth_clients ("
    "  client_id TEXT NOT NULL PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  redirect_uris TEXT NOT NULL," //  one per line
    "  created_ms INTEGER NOT NULL);"
    "CREATE TABLE oauth_tokens ("
    "  hash TEXT NOT NULL PRIMARY KEY,"
    "  kind TEXT NOT NULL," //  code, access, refresh
    "  grant_id TEXT NOT NULL REFERENCES api_keys (id),"
    "  client_id TEXT NOT NULL,"
    "  redirect_uri TEXT,"
    "  challenge TEXT,"
    "  resource TEXT NOT NULL,"
    "  scope TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL,"
    "  used_ms INTEGER NOT NULL DEFAULT 0," //  a code exchanged, a refresh token rotated
    "  revoked_ms INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX oauth_tokens_by_grant ON oauth_tokens (grant_id);",
    //  6: MCP sessions, here so that every gateway serves every session: the default
    //  sandbox of each, and the env its create_sandbox gave a sandbox (one row a name).
    "CREATE TABLE mcp_sessions ("
    "  id TEXT NOT NULL PRIMARY KEY,"
    "  account_id TEXT NOT NULL REFERENCES accounts (id),"
    "  key_id TEXT,"
    "  protocol TEXT,"
    "  client TEXT,"
    "  sandbox_id TEXT," //  the default; NULL for none
    "  created_ms INTEGER NOT NULL,"
    "  used_ms INTEGER NOT NULL);"
    "CREATE INDEX mcp_sessions_by_account ON mcp_sessions (account_id, used_ms);"
    "CREATE INDEX mcp_sessions_by_use ON mcp_sessions (used_ms);"
    "CREATE TABLE mcp_session_env ("
    "  session_id TEXT NOT NULL REFERENCES mcp_sessions (id) ON DELETE CASCADE,"
    "  sandbox_id TEXT NOT NULL,"
    "  name TEXT NOT NULL,"
    "  value TEXT NOT NULL,"
    "  PRIMARY KEY (session_id, sandbox_id, name));",
    //  7: operators disable and delete accounts. A deleted account stays as a tombstone
    //  (its sandboxes' records and the log name it) that lookups skip.
    "ALTER TABLE accounts ADD COLUMN disabled_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE accounts ADD COLUMN deleted_ms INTEGER NOT NULL DEFAULT 0;",
    //  8: autoResume off (a request to a port URL does not wake the sandbox).
    "ALTER TABLE sandboxes ADD COLUMN no_auto_resume INTEGER NOT NULL DEFAULT 0;",
    //  9: egress rules, each list its entries one per line (an entry has no newline).
    "ALTER TABLE sandboxes ADD COLUMN egress_allow TEXT;"
    "ALTER TABLE sandboxes ADD COLUMN egress_deny TEXT;",
    //  10: what the broker's sweeps ask each second found by index, not by reading every
    //  sandbox, account or token (bench/scale.py: 10,000 sandboxes).
    "CREATE INDEX sandboxes_expiring ON sandboxes (expires_ms) "
    "  WHERE state = 'ready' AND expires_ms > 0;"
    "CREATE INDEX accounts_exhausted ON accounts (id) WHERE funds_exhausted;"
    "CREATE INDEX accounts_disabled ON accounts (id) WHERE disabled_ms > 0;"
    "CREATE INDEX oauth_tokens_by_expiry ON oauth_tokens (expires_ms);"
    "CREATE INDEX sandboxes_live ON sandboxes (created_ms) WHERE state != 'deleted';"
    "CREATE INDEX sandboxes_live_by_account ON sandboxes (account_id, created_ms) "
    "  WHERE state != 'deleted';",
    //  11: each vmd's active sandboxes, counted as they change (the triggers) rather than
    //  by reading them all at every create: placement asks for each vmd each time.
    "CREATE TABLE vmd_load ("
    "  vmd TEXT NOT NULL PRIMARY KEY,"
    "  active INTEGER NOT NULL);"
    "INSERT INTO vmd_load SELECT vmd, count(*) FROM sandboxes WHERE vmd IS NOT NULL AND "
    "  state IN " VMD_ACTIVE " GROUP BY vmd;"
    "CREATE TRIGGER vmd_load_insert AFTER INSERT ON sandboxes "
    "  WHEN NEW.vmd IS NOT NULL AND NEW.state IN " VMD_ACTIVE " BEGIN "
    "  INSERT INTO vmd_load (vmd, active) VALUES (NEW.vmd, 1) "
    "    ON CONFLICT (vmd) DO UPDATE SET active = active + 1; END;"
    "CREATE TRIGGER vmd_load_update AFTER UPDATE OF state, vmd ON sandboxes BEGIN "
    "  UPDATE vmd_load SET active = active - 1 "
    "    WHERE vmd = OLD.vmd AND OLD.state IN " VMD_ACTIVE ";"
    "  INSERT INTO vmd_load (vmd, active) SELECT NEW.vmd, 1 "
    "    WHERE NEW.vmd IS NOT NULL AND NEW.state IN " VMD_ACTIVE " "
    "    ON CONFLICT (vmd) DO UPDATE SET active = active + 1; END;"
    "CREATE TRIGGER vmd_load_delete AFTER DELETE ON sandboxes "
    "  WHEN OLD.vmd IS NOT NULL AND OLD.state IN " VMD_ACTIVE " BEGIN "
    "  UPDATE vmd_load SET active = active - 1 WHERE vmd = OLD.vmd; END;",
    //  12: the hosts a join token admitted (brk_hosts): every control node admits their
    //  CurveZMQ keys (brk_control writes them into keys/allowed).
    "CREATE TABLE hosts ("
    "  name TEXT NOT NULL PRIMARY KEY,"
    "  roles TEXT NOT NULL,"
    "  public_key TEXT NOT NULL UNIQUE,"
    "  created_ms INTEGER NOT NULL,"
    "  removed_ms INTEGER NOT NULL DEFAULT 0);",
    //  13: vmds being drained (sbx host drain): nothing new is placed there, their stopped
    //  sandboxes move to other hosts (brk_move).
    "CREATE TABLE drains ("
    "  vmd TEXT NOT NULL PRIMARY KEY,"
    "  since_ms INTEGER NOT NULL);",
};

#define MIGRATION_COUNT ((int) (sizeof s_migrations / sizeof s_migrations[0]))

//  --------------------------------------------------------------------------
//  Statements, prepared once at open (after the migrations) and reused; numbered by
//  stmt_id_t in brk_store_priv.h (brk_store_oauth.c uses the OAuth ones).

#define ACCOUNT_COLUMNS "id, email, password_hash, plan, admin, created_ms, disabled_ms"

#define KEY_COLUMNS                                                                                \
    "id, account_id, kind, name, preset, prefix, hash, created_ms, expires_ms, last_used_ms, "     \
    "revoked_ms"

#define SANDBOX_COLUMNS                                                                            \
    "id, account_id, name, label, state, type, vmd, no_network, created_ms, expires_ms, "          \
    "changed_ms, reason, key_id, ttl_s, no_auto_resume, egress_allow, egress_deny"

#define TOKEN_COLUMNS                                                                              \
    "hash, kind, grant_id, client_id, redirect_uri, challenge, resource, scope, created_ms, "      \
    "expires_ms, used_ms, revoked_ms"

#define MCP_COLUMNS "id, account_id, key_id, protocol, client, sandbox_id, created_ms, used_ms"

static const char *s_sql[ST_COUNT] = {
    [ST_EVENT_APPEND] = "INSERT INTO events (ts_ms, type, account, subject, payload) "
                        "VALUES (?1, ?2, ?3, ?4, ?5)",
    //  sqlite_sequence, not max(seq): the last number handed out, even if deleted since.
    [ST_LAST_SEQ] = "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
    //  substr, not LIKE: LIKE treats _ and % as wildcards and ignores ASCII case.
    [ST_EVENTS_AFTER] = "SELECT seq, ts_ms, type, account, subject, payload FROM events "
                        "WHERE seq > ?1 AND (?2 IS NULL OR substr (type, 1, length (?2)) = ?2) "
                        "ORDER BY seq LIMIT ?3",
    [ST_ACCOUNT_INSERT] =
        "INSERT INTO accounts (id, email, password_hash, plan, admin, created_ms) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    //  email = ?1 uses the column's NOCASE collation (and its unique index).
    [ST_ACCOUNT_FIND] = "SELECT " ACCOUNT_COLUMNS " FROM accounts "
                        "WHERE (id = ?1 OR email = ?1) AND deleted_ms = 0 "
                        "ORDER BY id = ?1 DESC LIMIT 1",
    [ST_ACCOUNT_COUNT] = "SELECT count(*) FROM accounts WHERE deleted_ms = 0",
    [ST_ACCOUNT_LIST] = "SELECT " ACCOUNT_COLUMNS " FROM accounts WHERE deleted_ms = 0 "
                        "ORDER BY created_ms, rowid",
    [ST_ACCOUNT_SANDBOXES] =
        "SELECT count(*) FROM sandboxes WHERE account_id = ?1 AND state != 'deleted'",
    [ST_ACCOUNT_KEYS] = "SELECT count(*) FROM api_keys WHERE account_id = ?1 AND revoked_ms = 0 "
                        "AND (expires_ms = 0 OR expires_ms > ?2)",
    [ST_ACCOUNT_DISABLED] = "SELECT disabled_ms FROM accounts WHERE id = ?1 AND deleted_ms = 0",
    [ST_ADMIN_COUNT] = "SELECT count(*) FROM accounts WHERE admin AND deleted_ms = 0",
    [ST_ACCOUNT_PASSWORD] =
        "UPDATE accounts SET password_hash = ?2 WHERE id = ?1 AND deleted_ms = 0",
    [ST_ACCOUNT_DISABLE] = "UPDATE accounts SET disabled_ms = ?2 WHERE id = ?1 AND deleted_ms = 0",
    //  The id for the email: no email is one (it has no @), so it frees the address.
    [ST_ACCOUNT_TOMBSTONE] = "UPDATE accounts SET deleted_ms = ?2, email = id, "
                             "password_hash = NULL WHERE id = ?1 AND deleted_ms = 0",
    [ST_ACCOUNT_REVOKE_KEYS] =
        "UPDATE api_keys SET revoked_ms = ?2 WHERE account_id = ?1 AND revoked_ms = 0",
    [ST_ACCOUNT_REVOKE_TOKENS] = "UPDATE oauth_tokens SET revoked_ms = ?2 WHERE revoked_ms = 0 "
                                 "AND grant_id IN (SELECT id FROM api_keys WHERE account_id = ?1)",
    [ST_ACCOUNT_END_SESSIONS] = "DELETE FROM mcp_sessions WHERE account_id = ?1",
    [ST_KEY_INSERT] = "INSERT INTO api_keys (" KEY_COLUMNS ") "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [ST_KEY_FIND_BY_HASH] = "SELECT " KEY_COLUMNS " FROM api_keys WHERE hash = ?1",
    [ST_KEY_FIND] = "SELECT " KEY_COLUMNS " FROM api_keys WHERE id = ?1",
    //  rowid breaks ties between keys made in the same millisecond.
    [ST_KEY_LIST] = "SELECT " KEY_COLUMNS " FROM api_keys WHERE account_id = ?1 "
                    "ORDER BY created_ms DESC, rowid DESC",
    [ST_KEY_REVOKE] = "UPDATE api_keys SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms = 0",
    [ST_KEY_EXISTS] = "SELECT 1 FROM api_keys WHERE id = ?1",
    [ST_KEY_TOUCH] = "UPDATE api_keys SET last_used_ms = ?2 WHERE id = ?1 AND last_used_ms < ?2",
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    [ST_META_SET] = "INSERT INTO meta (key, value) VALUES (?1, ?2) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    [ST_META_DELETE] = "DELETE FROM meta WHERE key = ?1",
    //  A host's name is free again once it is removed: a new token replaces the record.
    [ST_HOST_INSERT] =
        "INSERT INTO hosts (name, roles, public_key, created_ms) VALUES (?1, ?2, ?3, ?4) "
        "ON CONFLICT (name) DO UPDATE SET roles = excluded.roles, public_key = "
        "excluded.public_key, created_ms = excluded.created_ms, removed_ms = 0 "
        "WHERE hosts.removed_ms != 0",
    [ST_HOST_FIND] =
        "SELECT name, roles, public_key, created_ms, removed_ms FROM hosts WHERE name = ?1",
    [ST_HOST_LIST] =
        "SELECT name, roles, public_key, created_ms, removed_ms FROM hosts ORDER BY created_ms",
    [ST_HOST_REMOVE] = "UPDATE hosts SET removed_ms = ?2 WHERE name = ?1 AND removed_ms = 0",
    [ST_DRAIN_SET] =
        "INSERT INTO drains (vmd, since_ms) VALUES (?1, ?2) ON CONFLICT (vmd) DO NOTHING",
    [ST_DRAIN_UNSET] = "DELETE FROM drains WHERE vmd = ?1",
    [ST_DRAIN_GET] = "SELECT since_ms FROM drains WHERE vmd = ?1",
    [ST_DRAIN_LIST] = "SELECT vmd FROM drains ORDER BY since_ms LIMIT 1000",
    [ST_SANDBOX_ON_VMD] = "SELECT count(*) FROM sandboxes WHERE vmd = ?1 AND state = ?2",
    [ST_SANDBOX_INSERT] =
        "INSERT INTO sandboxes (" SANDBOX_COLUMNS ") "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    [ST_SANDBOX_FIND] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE id = ?1",
//  Newest first, not deleted; keyset pages: before (?3, ?4) (the largest values for the
//  first page), at most ?5. The live-only indexes, named, keep a page costing its size:
//  not what came before it, nor the deleted sandboxes of a long history.
#define SANDBOX_PAGE_TAIL                                                                          \
    " AND (?2 IS NULL OR key_id = ?2) AND state != 'deleted' AND created_ms <= ?3 AND "            \
    "(created_ms < ?3 OR rowid < ?4) ORDER BY created_ms DESC, rowid DESC LIMIT ?5"
    [ST_SANDBOX_PAGE] = "SELECT " SANDBOX_COLUMNS ", rowid FROM sandboxes INDEXED BY "
                        "sandboxes_live_by_account WHERE account_id = ?1" SANDBOX_PAGE_TAIL,
    [ST_SANDBOX_PAGE_ALL] = "SELECT " SANDBOX_COLUMNS ", rowid FROM sandboxes INDEXED BY "
                            "sandboxes_live WHERE ?1 IS NULL" SANDBOX_PAGE_TAIL,
    [ST_SANDBOX_STATE] = "UPDATE sandboxes SET state = ?2, vmd = coalesce (?3, vmd), reason = ?4, "
                         "changed_ms = ?5 WHERE id = ?1",
    //  What occupies a vmd: guests that run or are on their way in or out.
    [ST_SANDBOX_ACTIVE] = "SELECT coalesce ((SELECT active FROM vmd_load WHERE vmd = ?1), 0)",
    [ST_SANDBOX_COUNTS] = "SELECT state, type, count(*) FROM sandboxes WHERE state != 'deleted' "
                          "GROUP BY state, type ORDER BY state, type",
    //  Oldest deadline first: the one most overdue is stopped first.
    [ST_SANDBOX_EXPIRED] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE state = 'ready' "
                           "AND expires_ms > 0 AND expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2",
    [ST_SANDBOX_EXPIRY] = "UPDATE sandboxes SET expires_ms = ?2, ttl_s = ?3 WHERE id = ?1",
    //  A vmd's sandboxes on their way (sandboxes_by_vmd): after a restart of the broker,
    //  or a failover, what each became is asked of vmd (brk_reconcile).
    [ST_SANDBOX_MOVING] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE vmd = ?1 AND state IN "
                          "('creating', 'stopping', 'resuming', 'deleting') LIMIT 100",
    //  What a lost host takes along: its guests, and records on their way to or from them
    //  (a request cut by the vmd's going or a broker's restart; brk_hostloss skips those
    //  with a request in flight).
    [ST_SANDBOX_HELD] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE vmd = ?1 AND state IN "
                        "('ready', 'stopped', 'creating', 'stopping', 'resuming', 'deleting') "
                        "LIMIT 100",
    [ST_SANDBOX_STOPPED_ON] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE vmd = ?1 AND "
                              "state = 'stopped' LIMIT 100",
    [ST_SANDBOX_LOST] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE vmd = ?1 AND state = "
                        "'error' AND reason LIKE 'host lost%' LIMIT 100",
    [ST_SANDBOX_LOST_ANY] = "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE vmd = ?1 AND "
                            "((state = 'error' AND reason LIKE 'host lost%') OR (state = "
                            "'deleted' AND reason = 'deleted while its host was lost')))",
    //  Every vmd named by a record, an index seek each (a skip scan of sandboxes_by_vmd).
    [ST_SANDBOX_VMDS] = "WITH RECURSIVE v (vmd) AS (SELECT min (vmd) FROM sandboxes UNION ALL "
                        "SELECT (SELECT min (vmd) FROM sandboxes WHERE vmd > v.vmd) FROM v "
                        "WHERE v.vmd IS NOT NULL) SELECT vmd FROM v WHERE vmd IS NOT NULL",
    [ST_SANDBOX_NAME] = "UPDATE sandboxes SET name = ?2 WHERE id = ?1",
    [ST_SANDBOX_AUTO_RESUME] = "UPDATE sandboxes SET no_auto_resume = ?2 WHERE id = ?1",
    [ST_SANDBOX_EGRESS] = "UPDATE sandboxes SET egress_allow = ?2, egress_deny = ?3 WHERE id = ?1",
    [ST_LABEL_SET] = "INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT (sandbox_id, key) DO UPDATE SET value = excluded.value",
    [ST_LABEL_DELETE] = "DELETE FROM sandbox_labels WHERE sandbox_id = ?1 AND key = ?2",
    [ST_LABEL_LIST] = "SELECT key, value FROM sandbox_labels WHERE sandbox_id = ?1 ORDER BY key",
    //  The label's unique index covers sandboxes that are not deleted: at most one row.
    [ST_SANDBOX_BY_LABEL] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes "
                            "WHERE label = ?1 AND state != 'deleted'",
    [ST_PORT_SET] = "INSERT INTO sandbox_ports (sandbox_id, port, host, host_port, public, "
                    "created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (sandbox_id, port) "
                    "DO UPDATE SET host = excluded.host, host_port = excluded.host_port, "
                    "public = excluded.public",
    [ST_PORT_DELETE] = "DELETE FROM sandbox_ports WHERE sandbox_id = ?1 AND port = ?2",
    [ST_PORT_FIND] = "SELECT sandbox_id, port, host, host_port, public, created_ms "
                     "FROM sandbox_ports WHERE sandbox_id = ?1 AND port = ?2",
    [ST_PORT_LIST] = "SELECT sandbox_id, port, host, host_port, public, created_ms "
                     "FROM sandbox_ports WHERE sandbox_id = ?1 ORDER BY port",
    [ST_START_ADD] =
        "INSERT INTO sandbox_starts (account_id, sandbox_id, ts_ms) VALUES (?1, ?2, ?3)",
    [ST_STARTS_SINCE] = "SELECT count(*) FROM sandbox_starts WHERE account_id = ?1 AND ts_ms >= ?2",
    //  What a plan's running limit counts: guests that run or are on their way up.
    [ST_ACCOUNT_RUNNING] = "SELECT count(*) FROM sandboxes WHERE account_id = ?1 AND state IN "
                           "('creating', 'ready', 'resuming')",
    [ST_FUNDS_SET] = "UPDATE accounts SET funds_exhausted = ?2 WHERE id = ?1",
    [ST_FUNDS_GET] = "SELECT funds_exhausted FROM accounts WHERE id = ?1",
    [ST_SANDBOX_UNFUNDED] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE state = 'ready' "
                            "AND account_id IN (SELECT id FROM accounts WHERE funds_exhausted) "
                            "ORDER BY changed_ms LIMIT ?1",
    [ST_SANDBOX_DISABLED] = "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE state = 'ready' "
                            "AND account_id IN (SELECT id FROM accounts WHERE disabled_ms > 0) "
                            "ORDER BY changed_ms LIMIT ?1",
    [ST_CLIENT_INSERT] = "INSERT INTO oauth_clients (client_id, name, redirect_uris, created_ms) "
                         "VALUES (?1, ?2, ?3, ?4)",
    [ST_CLIENT_FIND] = "SELECT client_id, name, redirect_uris, created_ms FROM oauth_clients "
                       "WHERE client_id = ?1",
    [ST_TOKEN_INSERT] = "INSERT INTO oauth_tokens (" TOKEN_COLUMNS ") "
                        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [ST_TOKEN_FIND] = "SELECT " TOKEN_COLUMNS " FROM oauth_tokens WHERE hash = ?1",
    [ST_TOKEN_USE] = "UPDATE oauth_tokens SET used_ms = ?2 WHERE hash = ?1 AND used_ms = 0",
    [ST_TOKEN_REVOKE] =
        "UPDATE oauth_tokens SET revoked_ms = ?2 WHERE hash = ?1 AND revoked_ms = 0",
    [ST_TOKEN_REVOKE_GRANT] =
        "UPDATE oauth_tokens SET revoked_ms = ?2 WHERE grant_id = ?1 AND revoked_ms = 0",
    //  The account's live connection for a client: the one its codes were issued under.
    [ST_GRANT_FIND] = "SELECT k.id FROM api_keys k WHERE k.account_id = ?1 AND "
                      "k.kind = 'connection' AND k.revoked_ms = 0 AND EXISTS (SELECT 1 FROM "
                      "oauth_tokens t WHERE t.grant_id = k.id AND t.client_id = ?2) "
                      "ORDER BY k.created_ms DESC, k.rowid DESC LIMIT 1",
    [ST_TOKEN_PURGE] = "DELETE FROM oauth_tokens WHERE expires_ms < ?1",
    [ST_MCP_INSERT] = "INSERT INTO mcp_sessions (" MCP_COLUMNS ") "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [ST_MCP_FIND] = "SELECT " MCP_COLUMNS " FROM mcp_sessions WHERE id = ?1",
    [ST_MCP_USE] = "UPDATE mcp_sessions SET sandbox_id = ?2, used_ms = ?3 WHERE id = ?1",
    [ST_MCP_DELETE] = "DELETE FROM mcp_sessions WHERE id = ?1",
    [ST_MCP_COUNT] = "SELECT count(*) FROM mcp_sessions WHERE account_id = ?1",
    [ST_MCP_OLDEST] = "SELECT id FROM mcp_sessions WHERE account_id = ?1 "
                      "ORDER BY used_ms, rowid LIMIT 1",
    [ST_MCP_IDLE] = "SELECT id FROM mcp_sessions WHERE used_ms < ?1 ORDER BY used_ms LIMIT 1",
    [ST_MCP_ENV_CLEAR] = "DELETE FROM mcp_session_env WHERE session_id = ?1 AND sandbox_id = ?2",
    [ST_MCP_ENV_SET] = "INSERT OR REPLACE INTO mcp_session_env (session_id, sandbox_id, name, "
                       "value) VALUES (?1, ?2, ?3, ?4)",
    [ST_MCP_ENV_LIST] = "SELECT sandbox_id, name, value FROM mcp_session_env "
                        "WHERE session_id = ?1 ORDER BY sandbox_id, name",
};

static const char *s_key_kinds[] = {"api_key", "connection", NULL};
static const char *s_key_presets[] = {"full", "ci", "read-only", "no-delete", NULL};

//  --------------------------------------------------------------------------
//  Helpers

bool brk_store_one_of (const char *text, const char **names)
{
    for (; *names; names++)
        if (strcmp (text, *names) == 0)
            return true;
    return false;
}

int brk_store_find (brk_store_t *self, stmt_id_t id, const char *key, sbx_db_row_fn *fill,
                    void *out, size_t size, const char *what)
{
    if (out)
        memset (out, 0, size);
    if (!self || !out || !key)
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, id), 1, key);
    return sbx_db_row (self->db, id, fill, out, what);
}

//  Row functions for one-column rows. A text that is NULL counts as a failure.
int brk_store_text_from_row (sbx_stmt_t *stmt, void *out)
{
    bool failed = false;
    char **text = out;
    *text = sbx_db_column_dup (stmt, 0, &failed);
    return failed || !*text ? -1 : 0;
}

static int s_u64_from_row (sbx_stmt_t *stmt, void *out)
{
    *(uint64_t *) out = sbx_db_column_u64 (stmt, 0);
    return 0;
}

static int s_flag_from_row (sbx_stmt_t *stmt, void *out)
{
    *(bool *) out = sbx_stmt_column_int (stmt, 0) != 0;
    return 0;
}

//  For "is there a row?" queries.
static int s_any_row (sbx_stmt_t *stmt, void *out)
{
    (void) stmt;
    (void) out;
    return 0;
}

//  Runs a one-row count query bound by the caller; its first column into *count.
static int s_count (brk_store_t *self, stmt_id_t id, uint64_t *count, const char *what)
{
    return sbx_db_row (self->db, id, s_u64_from_row, count, what) == 0 ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  Opening and transactions: sbx_db's (0600, WAL, FULL, foreign keys, migrations)

brk_store_t *brk_store_new (const char *path)
{
    brk_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->db = sbx_db_new (path, "sbx-broker", s_migrations, MIGRATION_COUNT, s_sql, ST_COUNT);
    if (!self->db)
        brk_store_destroy (&self);
    return self;
}

brk_store_t *brk_store_new_cluster (const sbx_dqlite_cluster_t *cluster)
{
    brk_store_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->db = sbx_db_new_cluster (cluster, "control", "sbx-broker", s_migrations, MIGRATION_COUNT,
                                   s_sql, ST_COUNT);
    if (!self->db)
        brk_store_destroy (&self);
    return self;
}

int brk_store_import (brk_store_t *self, const char *path, const char *segments, char *err,
                      size_t err_size)
{
    char *state = brk_store_meta_get (self, "import");
    bool resume = state && strcmp (state, "started") == 0;
    bool done = state && !resume;
    free (state);
    if (done)
        return 0;
    uint64_t accounts = 0;
    if (!resume && brk_store_account_count (self, &accounts)) {
        snprintf (err, err_size, "the cluster's store does not answer");
        return -1;
    }
    if (!resume && (accounts > 0 || brk_store_last_seq (self) > 0)) {
        sbx_warn ("store %s: %s is not copied in: the cluster holds a control plane already "
                  "(this node joined one; move the file away)",
                  sbx_db_path (self->db), path);
        return 0;
    }
    //  The file first at this broker's schema, as the cluster's store is.
    brk_store_t *file = brk_store_new (path);
    if (!file) {
        snprintf (err, err_size, "cannot open %s (its log says why)", path);
        return -1;
    }
    brk_store_destroy (&file);
    if (brk_store_meta_set (self, "import", "started")) {
        snprintf (err, err_size, "the cluster's store does not answer");
        return -1;
    }
    uint64_t rows = 0, more = 0;
    //  The sealed segments hold the oldest events, named in order: copied first.
    struct dirent **names = NULL;
    int count = segments ? scandir (segments, &names, NULL, alphasort) : 0;
    int rc = 0;
    for (int i = 0; i < count; i++) {
        const char *name = names[i]->d_name;
        size_t len = strlen (name);
        if (rc == 0 && len > 3 && strcmp (name + len - 3, ".db") == 0 &&
            strncmp (name, "events-", 7) == 0) {
            char file_path[PATH_MAX];
            snprintf (file_path, sizeof file_path, "%s/%s", segments, name);
            rc = sbx_db_import (self->db, file_path, NULL, &more, err, err_size);
            rows += more;
        }
        free (names[i]);
    }
    free (names);
    //  Every table of the file but vmd_load, which the sandboxes' triggers count anew.
    const char *skip[] = {"vmd_load", NULL};
    if (rc == 0)
        rc = sbx_db_import (self->db, path, skip, &more, err, err_size);
    rows += more;
    if (rc == 0 && brk_store_meta_set (self, "import", "done")) {
        snprintf (err, err_size, "the cluster's store does not answer");
        rc = -1;
    }
    if (rc == 0)
        sbx_info ("store %s: %llu rows of %s copied in", sbx_db_path (self->db),
                  (unsigned long long) rows, path);
    return rc == 0 ? 1 : -1;
}

void brk_store_destroy (brk_store_t **self_p)
{
    assert (self_p);
    brk_store_t *self = *self_p;
    if (!self)
        return;
    brk_store_segments_close (self);
    sbx_db_destroy (&self->db);
    free (self);
    *self_p = NULL;
}

int brk_store_schema_version (brk_store_t *self)
{
    return self ? sbx_db_schema_version (self->db) : -1;
}

int brk_store_begin (brk_store_t *self)
{
    return self ? sbx_db_begin (self->db) : -1;
}

int brk_store_commit (brk_store_t *self)
{
    return self ? sbx_db_commit (self->db) : -1;
}

int brk_store_rollback (brk_store_t *self)
{
    return self ? sbx_db_rollback (self->db) : -1;
}

int brk_store_read_begin (brk_store_t *self)
{
    return self ? sbx_db_read_begin (self->db) : 0;
}

void brk_store_read_end (brk_store_t *self, int opened)
{
    if (self)
        sbx_db_read_end (self->db, opened);
}

bool brk_store_in_transaction (brk_store_t *self)
{
    return self && sbx_db_in_transaction (self->db);
}

//  --------------------------------------------------------------------------
//  Events

int brk_store_event_append (brk_store_t *self, const char *type, const char *account,
                            const char *subject, const uint8_t *payload, size_t size,
                            uint64_t ts_ms, uint64_t *seq_p)
{
    if (!self || !sbx_db_nonempty (type) || strlen (type) > BRK_EVENT_TYPE_MAX ||
        (account && strlen (account) > BRK_EVENT_ACCOUNT_MAX) ||
        (subject && strlen (subject) > BRK_EVENT_SUBJECT_MAX) || (!payload && size > 0) ||
        size > BRK_EVENT_PAYLOAD_MAX || !sbx_db_fits (ts_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "event append"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_EVENT_APPEND);
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) ts_ms);
    sbx_db_bind_text (stmt, 2, type);
    sbx_db_bind_text (stmt, 3, account);
    sbx_db_bind_text (stmt, 4, subject);
    if (size > 0)
        sbx_stmt_bind_blob (stmt, 5, payload, size);
    else
        sbx_stmt_bind_null (stmt, 5);
    if (sbx_db_try (self->db, ST_EVENT_APPEND, "event append") != SQLITE_DONE)
        return -1;
    if (seq_p)
        *seq_p = (uint64_t) sbx_db_last_insert_rowid (self->db);
    return 0;
}

uint64_t brk_store_last_seq (brk_store_t *self)
{
    uint64_t seq = 0;
    if (self)
        sbx_db_row (self->db, ST_LAST_SEQ, s_u64_from_row, &seq, "last seq");
    return seq;
}

int brk_store_events_after (brk_store_t *self, uint64_t after_seq, size_t limit,
                            const char *type_prefix, brk_store_event_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_EVENTS_AFTER);
    if (sbx_stmt_busy (stmt)) {
        sbx_warn ("store %s: events_after called from its own callback", sbx_db_path (self->db));
        return -1;
    }
    if (!sbx_db_fits (after_seq))
        return 0;
    //  The count is returned as an int.
    if (limit == 0 || limit > INT_MAX)
        limit = INT_MAX;
    //  Sealed events first (brk_store_segments.c); the live table after the newest
    //  segment (rows a move has not deleted yet are read from their segment).
    int sealed = 0;
    if (self->seg_count) {
        sealed = brk_store_segments_after (self, &after_seq, limit, type_prefix, fn, arg);
        if (sealed < 0)
            return -1;
        if ((size_t) sealed >= limit)
            return sealed;
        limit -= (size_t) sealed;
        if (after_seq < self->segs[self->seg_count - 1].last)
            after_seq = self->segs[self->seg_count - 1].last;
    }
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) after_seq);
    sbx_db_bind_text (stmt, 2, type_prefix && *type_prefix ? type_prefix : NULL);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) limit);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_event_row_t row = {
            .seq = sbx_db_column_u64 (stmt, 0),
            .ts_ms = sbx_db_column_u64 (stmt, 1),
            .type = (const char *) sbx_stmt_column_text (stmt, 2),
            .account = (const char *) sbx_stmt_column_text (stmt, 3),
            .subject = (const char *) sbx_stmt_column_text (stmt, 4),
            .payload = sbx_stmt_column_blob (stmt, 5),
        };
        row.payload_size = (size_t) sbx_stmt_column_bytes (stmt, 5);
        if (!row.type || (!row.payload && row.payload_size > 0)) {
            rc = SQLITE_NOMEM;
            break;
        }
        count++;
        fn (&row, arg);
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "events after");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? sealed + count : -1;
}

//  --------------------------------------------------------------------------
//  Accounts

int brk_store_account_insert (brk_store_t *self, const brk_account_t *account)
{
    if (!self || !account || !sbx_db_nonempty (account->id) || !sbx_db_nonempty (account->email) ||
        !sbx_db_nonempty (account->plan) || !sbx_db_fits (account->created_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "account insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_INSERT);
    sbx_db_bind_text (stmt, 1, account->id);
    sbx_db_bind_text (stmt, 2, account->email);
    sbx_db_bind_text (stmt, 3, account->password_hash);
    sbx_db_bind_text (stmt, 4, account->plan);
    sbx_stmt_bind_int (stmt, 5, account->admin ? 1 : 0);
    sbx_stmt_bind_int64 (stmt, 6, (sqlite3_int64) account->created_ms);
    int rc = sbx_db_try (self->db, ST_ACCOUNT_INSERT, "account insert");
    //  email is the table's only UNIQUE constraint; a duplicate id is PRIMARYKEY.
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        return 1;
    if (rc != SQLITE_DONE && (rc & 0xff) == SQLITE_CONSTRAINT)
        sbx_db_log_error (self->db, "account insert");
    return rc == SQLITE_DONE ? 0 : -1;
}

static int s_account_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_account_t *out = row;
    bool failed = false;
    out->id = sbx_db_column_dup (stmt, 0, &failed);
    out->email = sbx_db_column_dup (stmt, 1, &failed);
    out->password_hash = sbx_db_column_dup (stmt, 2, &failed);
    out->plan = sbx_db_column_dup (stmt, 3, &failed);
    out->admin = sbx_stmt_column_int (stmt, 4) != 0;
    out->created_ms = sbx_db_column_u64 (stmt, 5);
    out->disabled_ms = sbx_db_column_u64 (stmt, 6);
    if (failed)
        brk_account_clear (out);
    return failed ? -1 : 0;
}

int brk_store_account_find (brk_store_t *self, const char *id_or_email, brk_account_t *out)
{
    return brk_store_find (self, ST_ACCOUNT_FIND, id_or_email, s_account_from_row, out, sizeof *out,
                           "account find");
}

int brk_store_account_count (brk_store_t *self, uint64_t *count)
{
    if (!self || !count)
        return -1;
    return s_count (self, ST_ACCOUNT_COUNT, count, "account count");
}

int brk_store_account_list (brk_store_t *self, brk_store_account_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_LIST);
    if (sbx_stmt_busy (stmt)) {
        sbx_warn ("store %s: account_list called from its own callback", sbx_db_path (self->db));
        return -1;
    }
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_account_t account = {0};
        if (s_account_from_row (stmt, &account)) {
            rc = SQLITE_NOMEM;
            break;
        }
        count++;
        fn (&account, arg);
        brk_account_clear (&account);
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "account list");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int brk_store_account_counts (brk_store_t *self, const char *account_id, uint64_t now_ms,
                              brk_account_counts_t *counts)
{
    if (counts)
        memset (counts, 0, sizeof *counts);
    if (!self || !account_id || !counts || !sbx_db_fits (now_ms))
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_ACCOUNT_SANDBOXES), 1, account_id);
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_ACCOUNT_KEYS), 1, account_id);
    sbx_stmt_bind_int64 (sbx_db_stmt (self->db, ST_ACCOUNT_KEYS), 2, (sqlite3_int64) now_ms);
    if (s_count (self, ST_ACCOUNT_SANDBOXES, &counts->sandboxes, "account sandboxes") ||
        s_count (self, ST_ACCOUNT_KEYS, &counts->keys, "account keys")) {
        sbx_db_reset (sbx_db_stmt (self->db, ST_ACCOUNT_KEYS));
        return -1;
    }
    return 0;
}

int brk_store_account_disabled (brk_store_t *self, const char *account_id, bool *disabled)
{
    if (disabled)
        *disabled = false;
    uint64_t disabled_ms = 0;
    if (!disabled)
        return -1;
    int rc = brk_store_find (self, ST_ACCOUNT_DISABLED, account_id, s_u64_from_row, &disabled_ms,
                             sizeof disabled_ms, "account disabled");
    *disabled = rc == 0 && disabled_ms != 0;
    return rc;
}

int brk_store_admin_count (brk_store_t *self, uint64_t *count)
{
    if (!self || !count)
        return -1;
    return s_count (self, ST_ADMIN_COUNT, count, "admin count");
}

//  Runs an UPDATE of one account bound by the caller (inside a transaction): 0 when it
//  changed a row, 1 when there was none, -1 error.
static int s_account_update (brk_store_t *self, stmt_id_t id, const char *what)
{
    if (!sbx_db_require_transaction (self->db, what)) {
        sbx_db_reset (sbx_db_stmt (self->db, id));
        return -1;
    }
    if (sbx_db_try (self->db, id, what) != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) > 0 ? 0 : 1;
}

int brk_store_account_set_password (brk_store_t *self, const char *account_id,
                                    const char *password_hash)
{
    if (!self || !sbx_db_nonempty (account_id))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_PASSWORD);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_db_bind_text (stmt, 2, password_hash);
    return s_account_update (self, ST_ACCOUNT_PASSWORD, "account password");
}

int brk_store_account_set_disabled (brk_store_t *self, const char *account_id, uint64_t disabled_ms)
{
    if (!self || !sbx_db_nonempty (account_id) || !sbx_db_fits (disabled_ms))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_DISABLE);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) disabled_ms);
    return s_account_update (self, ST_ACCOUNT_DISABLE, "account disable");
}

int brk_store_account_delete (brk_store_t *self, const char *account_id, uint64_t now_ms)
{
    //  0 would read as "not deleted" (and as "active" for keys and tokens).
    if (!self || !sbx_db_nonempty (account_id) || now_ms == 0 || !sbx_db_fits (now_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "account delete"))
        return -1;
    //  Tokens before keys: the tokens are found through the account's keys.
    stmt_id_t steps[] = {ST_ACCOUNT_REVOKE_TOKENS, ST_ACCOUNT_REVOKE_KEYS, ST_ACCOUNT_END_SESSIONS};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        sbx_stmt_t *stmt = sbx_db_stmt (self->db, steps[i]);
        sbx_db_bind_text (stmt, 1, account_id);
        if (steps[i] != ST_ACCOUNT_END_SESSIONS)
            sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) now_ms);
        if (sbx_db_try (self->db, steps[i], "account delete") != SQLITE_DONE)
            return -1;
    }
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_ACCOUNT_TOMBSTONE);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) now_ms);
    return s_account_update (self, ST_ACCOUNT_TOMBSTONE, "account delete");
}

void brk_account_clear (brk_account_t *self)
{
    if (!self)
        return;
    free (self->id);
    free (self->email);
    free (self->password_hash);
    free (self->plan);
    memset (self, 0, sizeof *self);
}

//  --------------------------------------------------------------------------
//  API keys

int brk_store_key_insert (brk_store_t *self, const brk_key_t *key)
{
    if (!self || !key || !sbx_db_nonempty (key->id) || !sbx_db_nonempty (key->account_id) ||
        !sbx_db_nonempty (key->kind) || !sbx_db_nonempty (key->hash) ||
        !brk_store_one_of (key->kind, s_key_kinds) ||
        (key->preset && !brk_store_one_of (key->preset, s_key_presets)) ||
        !sbx_db_fits (key->created_ms) || !sbx_db_fits (key->expires_ms) ||
        !sbx_db_fits (key->last_used_ms) || !sbx_db_fits (key->revoked_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "key insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_KEY_INSERT);
    sbx_db_bind_text (stmt, 1, key->id);
    sbx_db_bind_text (stmt, 2, key->account_id);
    sbx_db_bind_text (stmt, 3, key->kind);
    sbx_db_bind_text (stmt, 4, key->name);
    sbx_db_bind_text (stmt, 5, key->preset);
    sbx_db_bind_text (stmt, 6, key->prefix);
    sbx_db_bind_text (stmt, 7, key->hash);
    sbx_stmt_bind_int64 (stmt, 8, (sqlite3_int64) key->created_ms);
    sbx_stmt_bind_int64 (stmt, 9, (sqlite3_int64) key->expires_ms);
    sbx_stmt_bind_int64 (stmt, 10, (sqlite3_int64) key->last_used_ms);
    sbx_stmt_bind_int64 (stmt, 11, (sqlite3_int64) key->revoked_ms);
    int rc = sbx_db_try (self->db, ST_KEY_INSERT, "key insert");
    //  hash is the only UNIQUE constraint; an unknown account is FOREIGNKEY.
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        return 1;
    if (rc != SQLITE_DONE && (rc & 0xff) == SQLITE_CONSTRAINT)
        sbx_db_log_error (self->db, "key insert");
    return rc == SQLITE_DONE ? 0 : -1;
}

//  Fills *out from the current row (columns in KEY_COLUMNS order). Returns 0 or -1.
static int s_key_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_key_t *out = row;
    bool failed = false;
    out->id = sbx_db_column_dup (stmt, 0, &failed);
    out->account_id = sbx_db_column_dup (stmt, 1, &failed);
    out->kind = sbx_db_column_dup (stmt, 2, &failed);
    out->name = sbx_db_column_dup (stmt, 3, &failed);
    out->preset = sbx_db_column_dup (stmt, 4, &failed);
    out->prefix = sbx_db_column_dup (stmt, 5, &failed);
    out->hash = sbx_db_column_dup (stmt, 6, &failed);
    out->created_ms = sbx_db_column_u64 (stmt, 7);
    out->expires_ms = sbx_db_column_u64 (stmt, 8);
    out->last_used_ms = sbx_db_column_u64 (stmt, 9);
    out->revoked_ms = sbx_db_column_u64 (stmt, 10);
    if (failed)
        brk_key_clear (out);
    return failed ? -1 : 0;
}

int brk_store_key_find_by_hash (brk_store_t *self, const char *hash, brk_key_t *out)
{
    return brk_store_find (self, ST_KEY_FIND_BY_HASH, hash, s_key_from_row, out, sizeof *out,
                           "key find");
}

int brk_store_key_find (brk_store_t *self, const char *key_id, brk_key_t *out)
{
    return brk_store_find (self, ST_KEY_FIND, key_id, s_key_from_row, out, sizeof *out, "key find");
}

int brk_store_key_list (brk_store_t *self, const char *account_id, brk_store_key_fn *fn, void *arg)
{
    if (!self || !account_id || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_KEY_LIST);
    if (sbx_stmt_busy (stmt)) {
        sbx_warn ("store %s: key_list called from its own callback", sbx_db_path (self->db));
        return -1;
    }
    sbx_db_bind_text (stmt, 1, account_id);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_key_t key = {0};
        if (s_key_from_row (stmt, &key)) {
            rc = SQLITE_NOMEM;
            break;
        }
        count++;
        fn (&key, arg);
        brk_key_clear (&key);
        if (count == INT_MAX) {
            rc = SQLITE_DONE;
            break;
        }
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "key list");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int brk_store_key_revoke (brk_store_t *self, const char *key_id, uint64_t now_ms)
{
    //  0 would read as "active".
    if (!self || !key_id || now_ms == 0 || !sbx_db_fits (now_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "key revoke"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_KEY_REVOKE);
    sbx_db_bind_text (stmt, 1, key_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) now_ms);
    if (sbx_db_try (self->db, ST_KEY_REVOKE, "key revoke") != SQLITE_DONE)
        return -1;
    if (sbx_db_changes (self->db) > 0)
        return 0;
    //  Nothing changed: already revoked, or no such key.
    char none;
    return brk_store_find (self, ST_KEY_EXISTS, key_id, s_any_row, &none, 0, "key exists");
}

int brk_store_key_touch (brk_store_t *self, const char *key_id, uint64_t now_ms)
{
    if (!self || !key_id || !sbx_db_fits (now_ms))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_KEY_TOUCH);
    sbx_db_bind_text (stmt, 1, key_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) now_ms);
    return sbx_db_try (self->db, ST_KEY_TOUCH, "key touch") == SQLITE_DONE ? 0 : -1;
}

void brk_key_clear (brk_key_t *self)
{
    if (!self)
        return;
    free (self->id);
    free (self->account_id);
    free (self->kind);
    free (self->name);
    free (self->preset);
    free (self->prefix);
    free (self->hash);
    memset (self, 0, sizeof *self);
}

//  --------------------------------------------------------------------------
//  Meta

char *brk_store_meta_get (brk_store_t *self, const char *key)
{
    char *value = NULL;
    brk_store_find (self, ST_META_GET, key, brk_store_text_from_row, &value, sizeof value,
                    "meta get");
    return value;
}

int brk_store_meta_set (brk_store_t *self, const char *key, const char *value)
{
    if (!self || !key)
        return -1;
    stmt_id_t id = value ? ST_META_SET : ST_META_DELETE;
    sbx_db_bind_text (sbx_db_stmt (self->db, id), 1, key);
    if (value)
        sbx_db_bind_text (sbx_db_stmt (self->db, id), 2, value);
    return sbx_db_try (self->db, id, "meta set") == SQLITE_DONE ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  Sandboxes

static const char *s_sandbox_states[] = {"creating", "ready",   "stopping", "stopped", "resuming",
                                         "deleting", "deleted", "error",    NULL};

int brk_store_sandbox_insert (brk_store_t *self, const brk_sandbox_t *sandbox)
{
    if (!self || !sandbox || !sbx_db_nonempty (sandbox->id) ||
        !sbx_db_nonempty (sandbox->account_id) || !sbx_db_nonempty (sandbox->label) ||
        !brk_store_one_of (sandbox->state, s_sandbox_states) || !sbx_db_nonempty (sandbox->type) ||
        !sbx_db_fits (sandbox->created_ms) || !sbx_db_fits (sandbox->expires_ms) ||
        !sbx_db_fits (sandbox->changed_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox insert"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_INSERT);
    sbx_db_bind_text (stmt, 1, sandbox->id);
    sbx_db_bind_text (stmt, 2, sandbox->account_id);
    sbx_db_bind_text (stmt, 3, sandbox->name);
    sbx_db_bind_text (stmt, 4, sandbox->label);
    sbx_db_bind_text (stmt, 5, sandbox->state);
    sbx_db_bind_text (stmt, 6, sandbox->type);
    sbx_db_bind_text (stmt, 7, sandbox->vmd);
    sbx_stmt_bind_int (stmt, 8, sandbox->no_network ? 1 : 0);
    sbx_stmt_bind_int64 (stmt, 9, (sqlite3_int64) sandbox->created_ms);
    sbx_stmt_bind_int64 (stmt, 10, (sqlite3_int64) sandbox->expires_ms);
    sbx_stmt_bind_int64 (stmt, 11, (sqlite3_int64) sandbox->changed_ms);
    sbx_db_bind_text (stmt, 12, sandbox->reason);
    sbx_db_bind_text (stmt, 13, sandbox->key_id);
    sbx_stmt_bind_int64 (stmt, 14, (sqlite3_int64) sandbox->ttl_s);
    sbx_stmt_bind_int (stmt, 15, sandbox->no_auto_resume ? 1 : 0);
    sbx_db_bind_text (stmt, 16, sandbox->egress_allow);
    sbx_db_bind_text (stmt, 17, sandbox->egress_deny);
    int rc = sbx_db_try (self->db, ST_SANDBOX_INSERT, "sandbox insert");
    //  The label's unique index is the only UNIQUE constraint (the id is the key).
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        return 1;
    return rc == SQLITE_DONE ? 0 : -1;
}

static int s_sandbox_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_sandbox_t *out = row;
    bool failed = false;
    out->id = sbx_db_column_dup (stmt, 0, &failed);
    out->account_id = sbx_db_column_dup (stmt, 1, &failed);
    out->name = sbx_db_column_dup (stmt, 2, &failed);
    out->label = sbx_db_column_dup (stmt, 3, &failed);
    out->state = sbx_db_column_dup (stmt, 4, &failed);
    out->type = sbx_db_column_dup (stmt, 5, &failed);
    out->vmd = sbx_db_column_dup (stmt, 6, &failed);
    out->no_network = sbx_stmt_column_int (stmt, 7) != 0;
    out->created_ms = sbx_db_column_u64 (stmt, 8);
    out->expires_ms = sbx_db_column_u64 (stmt, 9);
    out->changed_ms = sbx_db_column_u64 (stmt, 10);
    out->reason = sbx_db_column_dup (stmt, 11, &failed);
    out->key_id = sbx_db_column_dup (stmt, 12, &failed);
    out->ttl_s = sbx_db_column_u64 (stmt, 13);
    out->no_auto_resume = sbx_stmt_column_int (stmt, 14) != 0;
    out->egress_allow = sbx_db_column_dup (stmt, 15, &failed);
    out->egress_deny = sbx_db_column_dup (stmt, 16, &failed);
    if (failed)
        brk_sandbox_clear (out);
    return failed ? -1 : 0;
}

int brk_store_sandbox_find (brk_store_t *self, const char *id, brk_sandbox_t *out)
{
    return brk_store_find (self, ST_SANDBOX_FIND, id, s_sandbox_from_row, out, sizeof *out,
                           "sandbox find");
}

int brk_store_sandbox_list (brk_store_t *self, const char *account_id, brk_store_sandbox_fn *fn,
                            void *arg)
{
    brk_store_mark_t from_newest = {0};
    return brk_store_sandbox_page (self, account_id, NULL, INT32_MAX, &from_newest, fn, arg);
}

int brk_store_sandbox_page (brk_store_t *self, const char *account_id, const char *key_id,
                            size_t limit, brk_store_mark_t *mark, brk_store_sandbox_fn *fn,
                            void *arg)
{
    if (!self || !fn || !mark || !sbx_db_fits (mark->created_ms) || limit > INT32_MAX)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, account_id ? ST_SANDBOX_PAGE : ST_SANDBOX_PAGE_ALL);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_db_bind_text (stmt, 2, key_id);
    bool first = mark->created_ms == 0;
    sbx_stmt_bind_int64 (stmt, 3, first ? INT64_MAX : (sqlite3_int64) mark->created_ms);
    sbx_stmt_bind_int64 (stmt, 4, first ? INT64_MAX : mark->row);
    sbx_stmt_bind_int64 (stmt, 5, (sqlite3_int64) limit);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_sandbox_t sandbox = {0};
        if (s_sandbox_from_row (stmt, &sandbox)) {
            rc = SQLITE_NOMEM;
            break;
        }
        mark->created_ms = sandbox.created_ms;
        mark->row = sbx_stmt_column_int64 (stmt, 17);
        fn (&sandbox, arg);
        brk_sandbox_clear (&sandbox);
        count++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "sandbox page");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int brk_store_sandbox_set_state (brk_store_t *self, const char *id, const char *state,
                                 const char *vmd, const char *reason, uint64_t changed_ms)
{
    if (!self || !id || !brk_store_one_of (state, s_sandbox_states) || !sbx_db_fits (changed_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox state"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_STATE);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, state);
    sbx_db_bind_text (stmt, 3, vmd);
    sbx_db_bind_text (stmt, 4, reason);
    sbx_stmt_bind_int64 (stmt, 5, (sqlite3_int64) changed_ms);
    if (sbx_db_try (self->db, ST_SANDBOX_STATE, "sandbox state") != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : 1;
}

int brk_store_sandbox_active (brk_store_t *self, const char *vmd, uint64_t *count)
{
    if (!self || !vmd || !count)
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_SANDBOX_ACTIVE), 1, vmd);
    return s_count (self, ST_SANDBOX_ACTIVE, count, "sandbox active");
}

int brk_store_sandbox_counts (brk_store_t *self, brk_store_count_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_COUNTS);
    int groups = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        fn ((const char *) sbx_stmt_column_text (stmt, 0),
            (const char *) sbx_stmt_column_text (stmt, 1),
            (uint64_t) sbx_stmt_column_int64 (stmt, 2), arg);
        groups++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "sandbox counts");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? groups : -1;
}

//  Hands the rows of a bound sandbox query to fn, at most 100.
static int s_sandbox_collect (sbx_stmt_t *stmt, brk_store_sandbox_fn *fn, void *arg);

int brk_store_sandbox_expired (brk_store_t *self, uint64_t now_ms, size_t limit,
                               brk_store_sandbox_fn *fn, void *arg)
{
    if (!self || !fn || !sbx_db_fits (now_ms))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_EXPIRED);
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) now_ms);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) (limit ? limit : 100));
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_moving (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                              void *arg)
{
    if (!self || !fn || !sbx_db_nonempty (vmd))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_MOVING);
    sbx_db_bind_text (stmt, 1, vmd);
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_held (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn, void *arg)
{
    if (!self || !fn || !sbx_db_nonempty (vmd))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_HELD);
    sbx_db_bind_text (stmt, 1, vmd);
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_stopped_on (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn,
                                  void *arg)
{
    if (!self || !fn || !sbx_db_nonempty (vmd))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_STOPPED_ON);
    sbx_db_bind_text (stmt, 1, vmd);
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_lost (brk_store_t *self, const char *vmd, brk_store_sandbox_fn *fn, void *arg)
{
    if (!self || !fn || !sbx_db_nonempty (vmd))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_LOST);
    sbx_db_bind_text (stmt, 1, vmd);
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_lost_any (brk_store_t *self, const char *vmd)
{
    if (!self || !sbx_db_nonempty (vmd))
        return -1;
    uint64_t count = 0;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_SANDBOX_LOST_ANY), 1, vmd);
    return s_count (self, ST_SANDBOX_LOST_ANY, &count, "sandbox lost any") ? -1 : count > 0;
}

int brk_store_names (sbx_stmt_t *stmt, brk_store_name_fn *fn, void *arg)
{
    //  Collected first, as s_sandbox_collect does: fn may use the store.
    char *names[1000];
    int rc = SQLITE_DONE, count = 0;
    while (count < 1000 && (rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        const char *name = sbx_stmt_column_text (stmt, 0);
        if (name && (names[count] = strdup (name)))
            count++;
    }
    sbx_db_reset (stmt);
    for (int i = 0; i < count; i++) {
        fn (names[i], arg);
        free (names[i]);
    }
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? count : -1;
}

int brk_store_sandbox_vmds (brk_store_t *self, brk_store_name_fn *fn, void *arg)
{
    if (!self || !fn)
        return -1;
    return brk_store_names (sbx_db_stmt (self->db, ST_SANDBOX_VMDS), fn, arg);
}

int brk_store_sandbox_unfunded (brk_store_t *self, size_t limit, brk_store_sandbox_fn *fn,
                                void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_UNFUNDED);
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) (limit && limit < 100 ? limit : 100));
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_sandbox_disabled (brk_store_t *self, size_t limit, brk_store_sandbox_fn *fn,
                                void *arg)
{
    if (!self || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_DISABLED);
    sbx_stmt_bind_int64 (stmt, 1, (sqlite3_int64) (limit && limit < 100 ? limit : 100));
    return s_sandbox_collect (stmt, fn, arg);
}

int brk_store_start_add (brk_store_t *self, const char *account_id, const char *sandbox_id,
                         uint64_t ts_ms)
{
    if (!self || !sbx_db_nonempty (account_id) || !sbx_db_nonempty (sandbox_id) ||
        !sbx_db_fits (ts_ms) || !sbx_db_require_transaction (self->db, "start add"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_START_ADD);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_db_bind_text (stmt, 2, sandbox_id);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) ts_ms);
    return sbx_db_try (self->db, ST_START_ADD, "start add") == SQLITE_DONE ? 0 : -1;
}

int brk_store_starts_since (brk_store_t *self, const char *account_id, uint64_t since_ms,
                            uint64_t *count)
{
    if (!self || !account_id || !count || !sbx_db_fits (since_ms))
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_STARTS_SINCE), 1, account_id);
    sbx_stmt_bind_int64 (sbx_db_stmt (self->db, ST_STARTS_SINCE), 2, (sqlite3_int64) since_ms);
    return s_count (self, ST_STARTS_SINCE, count, "starts since");
}

int brk_store_account_running (brk_store_t *self, const char *account_id, uint64_t *count)
{
    if (!self || !account_id || !count)
        return -1;
    sbx_db_bind_text (sbx_db_stmt (self->db, ST_ACCOUNT_RUNNING), 1, account_id);
    return s_count (self, ST_ACCOUNT_RUNNING, count, "account running");
}

int brk_store_account_funds_set (brk_store_t *self, const char *account_id, bool exhausted)
{
    if (!self || !sbx_db_nonempty (account_id) ||
        !sbx_db_require_transaction (self->db, "funds set"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_FUNDS_SET);
    sbx_db_bind_text (stmt, 1, account_id);
    sbx_stmt_bind_int (stmt, 2, exhausted ? 1 : 0);
    if (sbx_db_try (self->db, ST_FUNDS_SET, "funds set") != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) ? 0 : 1;
}

int brk_store_account_funds_exhausted (brk_store_t *self, const char *account_id, bool *exhausted)
{
    return exhausted ? brk_store_find (self, ST_FUNDS_GET, account_id, s_flag_from_row, exhausted,
                                       sizeof *exhausted, "funds get")
                     : -1;
}

static int s_sandbox_collect (sbx_stmt_t *stmt, brk_store_sandbox_fn *fn, void *arg)
{
    //  Collect first: the callback changes these rows, and SQLite must not be stepping
    //  over them meanwhile.
    brk_sandbox_t found[100];
    int count = 0;
    int rc;
    while (count < 100 && (rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        memset (&found[count], 0, sizeof found[count]);
        if (s_sandbox_from_row (stmt, &found[count]) == 0)
            count++;
    }
    sbx_db_reset (stmt);
    for (int i = 0; i < count; i++) {
        fn (&found[i], arg);
        brk_sandbox_clear (&found[i]);
    }
    return count;
}

int brk_store_sandbox_set_expiry (brk_store_t *self, const char *id, uint64_t expires_ms,
                                  uint64_t ttl_s)
{
    if (!self || !id || !sbx_db_fits (expires_ms) || !sbx_db_fits (ttl_s))
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox expiry"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_EXPIRY);
    sbx_db_bind_text (stmt, 1, id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) expires_ms);
    sbx_stmt_bind_int64 (stmt, 3, (sqlite3_int64) ttl_s);
    return sbx_db_try (self->db, ST_SANDBOX_EXPIRY, "sandbox expiry") == SQLITE_DONE ? 0 : -1;
}

int brk_store_sandbox_set_auto_resume (brk_store_t *self, const char *id, bool on)
{
    if (!self || !id)
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox autoResume"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_AUTO_RESUME);
    sbx_db_bind_text (stmt, 1, id);
    sbx_stmt_bind_int (stmt, 2, on ? 0 : 1);
    return sbx_db_try (self->db, ST_SANDBOX_AUTO_RESUME, "sandbox autoResume") == SQLITE_DONE ? 0
                                                                                              : -1;
}

int brk_store_sandbox_set_egress (brk_store_t *self, const char *id, const char *allow,
                                  const char *deny)
{
    if (!self || !id)
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox egress"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_EGRESS);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, allow && *allow ? allow : NULL);
    sbx_db_bind_text (stmt, 3, deny && *deny ? deny : NULL);
    return sbx_db_try (self->db, ST_SANDBOX_EGRESS, "sandbox egress") == SQLITE_DONE ? 0 : -1;
}

int brk_store_sandbox_set_name (brk_store_t *self, const char *id, const char *name)
{
    if (!self || !id)
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox name"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_SANDBOX_NAME);
    sbx_db_bind_text (stmt, 1, id);
    sbx_db_bind_text (stmt, 2, name);
    return sbx_db_try (self->db, ST_SANDBOX_NAME, "sandbox name") == SQLITE_DONE ? 0 : -1;
}

int brk_store_sandbox_label_set (brk_store_t *self, const char *id, const char *key,
                                 const char *value)
{
    if (!self || !id || !sbx_db_nonempty (key))
        return -1;
    if (!sbx_db_require_transaction (self->db, "sandbox label"))
        return -1;
    stmt_id_t st = value ? ST_LABEL_SET : ST_LABEL_DELETE;
    sbx_db_bind_text (sbx_db_stmt (self->db, st), 1, id);
    sbx_db_bind_text (sbx_db_stmt (self->db, st), 2, key);
    if (value)
        sbx_db_bind_text (sbx_db_stmt (self->db, st), 3, value);
    return sbx_db_try (self->db, st, "sandbox label") == SQLITE_DONE ? 0 : -1;
}

int brk_store_sandbox_labels (brk_store_t *self, const char *id, brk_store_label_fn *fn, void *arg)
{
    if (!self || !id || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_LABEL_LIST);
    sbx_db_bind_text (stmt, 1, id);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        fn ((const char *) sbx_stmt_column_text (stmt, 0),
            (const char *) sbx_stmt_column_text (stmt, 1), arg);
        count++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "sandbox labels");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

int brk_store_sandbox_find_by_label (brk_store_t *self, const char *label, brk_sandbox_t *out)
{
    return brk_store_find (self, ST_SANDBOX_BY_LABEL, label, s_sandbox_from_row, out, sizeof *out,
                           "sandbox by label");
}

static bool s_port_valid (uint64_t port)
{
    return port >= 1 && port <= 65535;
}

int brk_store_port_set (brk_store_t *self, const brk_port_t *port)
{
    if (!self || !port || !sbx_db_nonempty (port->sandbox_id) || !s_port_valid (port->port) ||
        !sbx_db_nonempty (port->host) || !s_port_valid (port->host_port) ||
        !sbx_db_fits (port->created_ms))
        return -1;
    if (!sbx_db_require_transaction (self->db, "port set"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_PORT_SET);
    sbx_db_bind_text (stmt, 1, port->sandbox_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) port->port);
    sbx_db_bind_text (stmt, 3, port->host);
    sbx_stmt_bind_int64 (stmt, 4, (sqlite3_int64) port->host_port);
    sbx_stmt_bind_int (stmt, 5, port->public ? 1 : 0);
    sbx_stmt_bind_int64 (stmt, 6, (sqlite3_int64) port->created_ms);
    return sbx_db_try (self->db, ST_PORT_SET, "port set") == SQLITE_DONE ? 0 : -1;
}

int brk_store_port_delete (brk_store_t *self, const char *sandbox_id, uint64_t port)
{
    if (!self || !sandbox_id || !s_port_valid (port))
        return -1;
    if (!sbx_db_require_transaction (self->db, "port delete"))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_PORT_DELETE);
    sbx_db_bind_text (stmt, 1, sandbox_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) port);
    if (sbx_db_try (self->db, ST_PORT_DELETE, "port delete") != SQLITE_DONE)
        return -1;
    return sbx_db_changes (self->db) == 1 ? 0 : 1;
}

static int s_port_from_row (sbx_stmt_t *stmt, void *row)
{
    brk_port_t *out = row;
    bool failed = false;
    out->sandbox_id = sbx_db_column_dup (stmt, 0, &failed);
    out->port = sbx_db_column_u64 (stmt, 1);
    out->host = sbx_db_column_dup (stmt, 2, &failed);
    out->host_port = sbx_db_column_u64 (stmt, 3);
    out->public = sbx_stmt_column_int (stmt, 4) != 0;
    out->created_ms = sbx_db_column_u64 (stmt, 5);
    if (failed)
        brk_port_clear (out);
    return failed ? -1 : 0;
}

int brk_store_port_find (brk_store_t *self, const char *sandbox_id, uint64_t port, brk_port_t *out)
{
    if (out)
        memset (out, 0, sizeof *out);
    if (!self || !out || !sandbox_id || !s_port_valid (port))
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_PORT_FIND);
    sbx_db_bind_text (stmt, 1, sandbox_id);
    sbx_stmt_bind_int64 (stmt, 2, (sqlite3_int64) port);
    return sbx_db_row (self->db, ST_PORT_FIND, s_port_from_row, out, "port find");
}

int brk_store_ports (brk_store_t *self, const char *sandbox_id, brk_store_port_fn *fn, void *arg)
{
    if (!self || !sandbox_id || !fn)
        return -1;
    sbx_stmt_t *stmt = sbx_db_stmt (self->db, ST_PORT_LIST);
    sbx_db_bind_text (stmt, 1, sandbox_id);
    int count = 0;
    int rc;
    while ((rc = sbx_stmt_step (stmt)) == SQLITE_ROW) {
        brk_port_t port = {0};
        if (s_port_from_row (stmt, &port)) {
            rc = SQLITE_NOMEM;
            break;
        }
        fn (&port, arg);
        brk_port_clear (&port);
        count++;
    }
    if (rc != SQLITE_DONE)
        sbx_db_log_error (self->db, "ports");
    sbx_db_reset (stmt);
    return rc == SQLITE_DONE ? count : -1;
}

void brk_port_clear (brk_port_t *self)
{
    if (!self)
        return;
    free (self->sandbox_id);
    free (self->host);
    memset (self, 0, sizeof *self);
}

void brk_sandbox_clear (brk_sandbox_t *self)
{
    if (!self)
        return;
    free (self->id);
    free (self->account_id);
    free (self->name);
    free (self->label);
    free (self->state);
    free (self->type);
    free (self->vmd);
    free (self->reason);
    free (self->key_id);
    free (self->egress_allow);
    free (self->egress_deny);
    memset (self, 0, sizeof *self);
}

//  --------------------------------------------------------------------------
//  Self-test

typedef struct {
    uint64_t next_seq; //  the seq the next row must have
    int rows;
    const char *prefix;
    brk_store_t *store;
    int nested_rc;
} test_walk_t;

static void s_test_event (const brk_event_row_t *row, void *arg)
{
    test_walk_t *walk = (test_walk_t *) arg;
    //  Gapless unless filtered, increasing always.
    if (walk->next_seq)
        assert (walk->prefix ? row->seq >= walk->next_seq : row->seq == walk->next_seq);
    walk->next_seq = row->seq + 1;
    assert (row->type);
    if (walk->prefix)
        assert (strncmp (row->type, walk->prefix, strlen (walk->prefix)) == 0);
    //  The test writes seq-derived payloads: ts_ms = 1000 + seq, payload "p<seq>".
    char expected[32];
    snprintf (expected, sizeof expected, "p%llu", (unsigned long long) row->seq);
    if (row->seq <= 1000) {
        assert (row->ts_ms == 1000 + row->seq);
        assert (row->payload_size == strlen (expected));
        assert (memcmp (row->payload, expected, row->payload_size) == 0);
        assert (row->account && strcmp (row->account, "acc_test") == 0);
    }
    if (walk->store)
        walk->nested_rc = brk_store_events_after (walk->store, 0, 1, NULL, s_test_event, arg);
    walk->rows++;
}

static void s_test_count (const brk_event_row_t *row, void *arg)
{
    (void) row;
    (*(int *) arg)++;
}

typedef struct {
    const char *ids[8];
    int count;
} test_keys_t;

typedef struct {
    char text[256];
} test_labels_t;

static void s_test_label (const char *key, const char *value, void *arg)
{
    test_labels_t *labels = arg;
    size_t len = strlen (labels->text);
    snprintf (labels->text + len, sizeof labels->text - len, "%s=%s;", key, value);
}

typedef struct {
    char ids[256];
} test_list_t;

static void s_test_sandbox (const brk_sandbox_t *sandbox, void *arg)
{
    test_list_t *list = arg;
    size_t len = strlen (list->ids);
    snprintf (list->ids + len, sizeof list->ids - len, "%s;", sandbox->id);
}

static void s_test_account (const brk_account_t *account, void *arg)
{
    test_list_t *list = arg;
    size_t len = strlen (list->ids);
    snprintf (list->ids + len, sizeof list->ids - len, "%s;", account->id);
}

static void s_test_port (const brk_port_t *port, void *arg)
{
    ((brk_port_t *) arg)->port = port->port;
}

static void s_test_key (const brk_key_t *key, void *arg)
{
    test_keys_t *keys = (test_keys_t *) arg;
    assert (keys->count < 8);
    keys->ids[keys->count] = strcmp (key->id, "key_1") == 0   ? "key_1"
                             : strcmp (key->id, "key_2") == 0 ? "key_2"
                             : strcmp (key->id, "key_3") == 0 ? "key_3"
                                                              : "other";
    keys->count++;
}

//  Event types cycle through these; the first two tell a literal '_' from LIKE's wildcard.
static const char *s_test_types[] = {"sandbox_x.created", "sandboxAx.created", "account.created"};

static void s_test_write_file (const char *path, const void *data, size_t size)
{
    FILE *file = fopen (path, "wb");
    assert (file);
    assert (fwrite (data, 1, size, file) == size);
    fclose (file);
}

static void s_test_remove_dir (const char *dir)
{
    DIR *handle = opendir (dir);
    assert (handle);
    struct dirent *entry;
    char path[PATH_MAX];
    while ((entry = readdir (handle))) {
        if (strcmp (entry->d_name, ".") == 0 || strcmp (entry->d_name, "..") == 0)
            continue;
        snprintf (path, sizeof path, "%s/%s", dir, entry->d_name);
        struct stat st;
        if (lstat (path, &st) == 0 && S_ISDIR (st.st_mode))
            rmdir (path);
        else
            unlink (path);
    }
    closedir (handle);
    assert (rmdir (dir) == 0);
}

static void s_test_by_state (const char *state, const char *type, uint64_t count, void *arg)
{
    uint64_t *by_state = arg;
    assert (type && strcmp (type, "small") == 0);
    by_state[strcmp (state, "ready") == 0 ? 0 : 1] += count;
}

//  The whole tables statements may read: the accounts where an operator counts or lists
//  them all (sbx account list, the accounts gauge); the sweeps' accounts without funds
//  or disabled, through partial indexes that hold only those; and the live sandboxes
//  that the sandboxes gauge counts when /metrics is scraped.
static bool s_test_allow (int index, const char *table)
{
    //  The hosts of a cluster: a handful, listed by an operator.
    if (strcmp (table, "hosts") == 0 && index == ST_HOST_LIST)
        return true;
    //  The vmds being drained: a handful, every second (brk_move).
    if (strcmp (table, "drains") == 0 && index == ST_DRAIN_LIST)
        return true;
    //  The vmds a record names: the walk over its own recursive table, one row a vmd.
    if (strcmp (table, "v") == 0 && index == ST_SANDBOX_VMDS)
        return true;
    return (strcmp (table, "accounts") == 0 &&
            (index == ST_ACCOUNT_COUNT || index == ST_ACCOUNT_LIST || index == ST_ADMIN_COUNT ||
             index == ST_SANDBOX_UNFUNDED || index == ST_SANDBOX_DISABLED)) ||
           (strcmp (table, "sandboxes") == 0 && index == ST_SANDBOX_COUNTS);
}

//  vmd_load (kept by triggers) says what counting the sandboxes says, vmd by vmd.
//  Pages while sandboxes come and go between them (brk_store_sandbox_page): each one
//  there from the first page to the last is given once, in order, whatever is created
//  (newer: before the first page's start) or deleted meanwhile; ties in created_ms too.
static void s_test_pages (brk_store_t *store)
{
    assert (brk_store_begin (store) == 0);
    //  created_ms: a 500, b c d 400 (a tie, rowid orders them), e 300; then the account's
    //  sb_two 200 and sb_one 100.
    const char *ids[] = {"sb_pa", "sb_pb", "sb_pc", "sb_pd", "sb_pe"};
    const uint64_t ms[] = {500, 400, 400, 400, 300};
    char label[32];
    for (size_t i = 0; i < 5; i++) {
        snprintf (label, sizeof label, "page-label-%zu", i);
        brk_sandbox_t sb = {.id = (char *) ids[i],
                            .account_id = "acc_ada",
                            .label = label,
                            .state = "ready",
                            .type = "small",
                            .created_ms = ms[i],
                            .changed_ms = ms[i]};
        assert (brk_store_sandbox_insert (store, &sb) == 0);
    }
    assert (brk_store_commit (store) == 0);
    test_list_t listed = {0};
    assert (brk_store_sandbox_list (store, "acc_ada", s_test_sandbox, &listed) == 7);
    assert (strcmp (listed.ids, "sb_pa;sb_pd;sb_pc;sb_pb;sb_pe;sb_two;sb_one;") == 0);
    memset (&listed, 0, sizeof listed);
    brk_store_mark_t mark = {0};
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 2, &mark, s_test_sandbox, &listed) ==
            2);
    assert (mark.created_ms == 400); //  the page ends inside the tie
    //  Between pages: two new ones (one in the tie's millisecond), one given deleted,
    //  one not yet given deleted.
    assert (brk_store_begin (store) == 0);
    brk_sandbox_t late = {.id = "sb_pf",
                          .account_id = "acc_ada",
                          .label = "page-label-f",
                          .state = "ready",
                          .type = "small",
                          .created_ms = 400,
                          .changed_ms = 600};
    assert (brk_store_sandbox_insert (store, &late) == 0);
    late.id = "sb_pg";
    late.label = "page-label-g";
    late.created_ms = 600;
    assert (brk_store_sandbox_insert (store, &late) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_pa", "deleted", NULL, NULL, 600) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_pb", "deleted", NULL, NULL, 600) == 0);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 2, &mark, s_test_sandbox, &listed) ==
            2);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 2, &mark, s_test_sandbox, &listed) ==
            2);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 2, &mark, s_test_sandbox, &listed) ==
            0);
    assert (strcmp (listed.ids, "sb_pa;sb_pd;sb_pc;sb_pe;sb_two;sb_one;") == 0);
    //  A fresh start sees the new ones, newest first, and not the deleted.
    memset (&listed, 0, sizeof listed);
    assert (brk_store_sandbox_list (store, "acc_ada", s_test_sandbox, &listed) == 7);
    assert (strcmp (listed.ids, "sb_pg;sb_pf;sb_pd;sb_pc;sb_pe;sb_two;sb_one;") == 0);
    //  These go, so that what the test checks next is as it was.
    assert (brk_store_begin (store) == 0);
    const char *left[] = {"sb_pc", "sb_pd", "sb_pe", "sb_pf", "sb_pg"};
    for (size_t i = 0; i < 5; i++)
        assert (brk_store_sandbox_set_state (store, left[i], "deleted", NULL, NULL, 700) == 0);
    assert (brk_store_commit (store) == 0);
}

static void s_test_vmd_load (brk_store_t *store)
{
    const char *recount =
        "SELECT vmd, count(*) FROM sandboxes WHERE vmd IS NOT NULL AND state IN " VMD_ACTIVE
        " GROUP BY vmd";
    char sql[512];
    snprintf (sql, sizeof sql,
              "SELECT (SELECT count(*) FROM (SELECT vmd, active FROM vmd_load WHERE active != 0 "
              "EXCEPT %s)) + (SELECT count(*) FROM (%s EXCEPT SELECT vmd, active FROM vmd_load))",
              recount, recount);
    assert (sbx_db_query_int (store->db, sql, "vmd load") == 0);
}

//  Sealed segments: events move out of the live table and read back the same, across a
//  reopen, a half-written segment and a move a crash interrupted.
static void s_test_append (brk_store_t *store, uint64_t n)
{
    assert (brk_store_begin (store) == 0);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t seq = brk_store_last_seq (store) + 1;
        char payload[32];
        snprintf (payload, sizeof payload, "p%llu", (unsigned long long) seq);
        assert (brk_store_event_append (store, seq % 3 ? "sandbox.changed" : "account.created",
                                        "acc_test", "sb_1", (const uint8_t *) payload,
                                        strlen (payload), 1000 + seq, NULL) == 0);
    }
    assert (brk_store_commit (store) == 0);
}

static int s_test_walk (brk_store_t *store, uint64_t after, size_t limit, const char *prefix,
                        uint64_t *first_p)
{
    test_walk_t walk = {.prefix = prefix, .next_seq = prefix ? 0 : after + 1};
    int rows = brk_store_events_after (store, after, limit, prefix, s_test_event, &walk);
    assert (rows == walk.rows);
    if (first_p)
        *first_p = walk.next_seq;
    return rows;
}

static void s_test_segments (const char *dir)
{
    char path[PATH_MAX], segs[PATH_MAX];
    snprintf (path, sizeof path, "%s/seg.db", dir);
    snprintf (segs, sizeof segs, "%s/events", dir);
    brk_store_t *store = brk_store_new (path);
    assert (store && brk_store_segments_open (store, segs, 100) == 0);
    s_test_append (store, 450);
    //  2 × 100 live or more: 1-100, 101-200, 201-300 sealed; 301-450 stay (150 < 200).
    int steps = 0, rc;
    while ((rc = brk_store_segments_step (store, 30)) == 1)
        steps++;
    assert (rc == 0 && steps > 3 * 2 * (100 / 30));
    uint64_t sealed = 0;
    assert (brk_store_segments_count (store, &sealed) == 3 && sealed == 300);
    assert (sbx_db_query_int (store->db, "SELECT count(*) FROM events", "") == 150);
    //  Read back whole, gapless, in order; from inside a segment; across the edge; a
    //  limit that ends in a segment; a type filter (every third is account.created).
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 450);
    uint64_t next = 0;
    assert (s_test_walk (store, 150, 10, NULL, &next) == 10 && next == 161);
    assert (s_test_walk (store, 295, 10, NULL, &next) == 10 && next == 306);
    assert (s_test_walk (store, 0, 0, "account.", NULL) == 150);
    assert (s_test_walk (store, 99, 5, "account.", &next) == 5 && next == 115);
    assert (s_test_walk (store, 450, 0, NULL, NULL) == 0);
    //  Reopened: the segments are found, the log reads the same.
    brk_store_destroy (&store);
    store = brk_store_new (path);
    assert (store && brk_store_segments_open (store, segs, 100) == 0);
    assert (brk_store_segments_count (store, NULL) == 3);
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 450);
    //  A crash while sealing 301-400: its .part is dropped, the rows stay live.
    s_test_append (store, 60);
    assert (brk_store_segments_step (store, 30) == 1); //  copying has begun
    brk_store_destroy (&store);
    char part[PATH_MAX + 64];
    snprintf (part, sizeof part, "%s/events-%020d-%020d.db.part", segs, 301, 400);
    assert (access (part, F_OK) == 0);
    store = brk_store_new (path);
    assert (store && brk_store_segments_open (store, segs, 100) == 0);
    assert (access (part, F_OK) != 0 && brk_store_segments_count (store, NULL) == 3);
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 510);
    //  A crash after the seal, with its rows half deleted: open finishes the move, and
    //  meanwhile nothing is read twice.
    while (store->seal_phase != 2 || store->seal_done < 330)
        assert (brk_store_segments_step (store, 30) == 1);
    brk_store_destroy (&store);
    store = brk_store_new (path);
    assert (store && brk_store_segments_open (store, segs, 100) == 0);
    assert (brk_store_segments_count (store, NULL) == 4 && store->seal_phase == 2);
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 510);
    while ((rc = brk_store_segments_step (store, 30)) == 1)
        ;
    assert (rc == 0 && sbx_db_query_int (store->db, "SELECT min (seq) FROM events", "") == 401);
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 510);
    //  Sealing off: nothing more moves, the segments are still read.
    brk_store_destroy (&store);
    store = brk_store_new (path);
    assert (store && brk_store_segments_open (store, segs, 0) == 0);
    s_test_append (store, 300);
    assert (brk_store_segments_step (store, 30) == 0);
    assert (s_test_walk (store, 0, 0, NULL, NULL) == 810);
    brk_store_destroy (&store);
    s_test_remove_dir (segs);
}

void brk_store_test (bool verbose)
{
    char dir[] = "/tmp/brk_store_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/control.db", dir);
    if (verbose)
        printf ("\n   in %s", dir);

    //  Open: a new file, private, WAL, FULL, foreign keys, all migrations.
    brk_store_t *store = brk_store_new (path);
    assert (store);
    assert (brk_store_schema_version (store) == MIGRATION_COUNT);
    assert (sbx_db_whole_reads (store->db, s_test_allow) == 0);
    struct stat st;
    assert (stat (path, &st) == 0 && (st.st_mode & 0777) == 0600);
    assert (sbx_db_query_int (store->db, "SELECT journal_mode = 'wal' FROM pragma_journal_mode",
                              "") == 1);
    assert (sbx_db_query_int (store->db, "PRAGMA synchronous", "") == 2);
    assert (sbx_db_query_int (store->db, "PRAGMA foreign_keys", "") == 1);
    assert (sbx_db_query_int (store->db, "SELECT count(*) FROM schema_version", "") ==
            MIGRATION_COUNT);
    //  Hosts: a name is taken while its host is admitted, free again once removed.
    brk_host_t host = {"gw-2", "gateway,vmd", "key-one-z85-40-chars-long-enough-aaaaaaa", 10, 0};
    assert (brk_store_host_insert (store, &host) == 0);
    host.public_key = "key-two-z85-40-chars-long-enough-bbbbbbb";
    assert (brk_store_host_insert (store, &host) == 1);
    brk_host_t seen = {0};
    assert (brk_store_host_find (store, "gw-2", &seen) == 0);
    assert (strcmp (seen.roles, "gateway,vmd") == 0);
    assert (strncmp (seen.public_key, "key-one", 7) == 0 && seen.removed_ms == 0);
    brk_host_clear (&seen);
    assert (brk_store_host_remove (store, "gw-2", 20) == 0);
    assert (brk_store_host_remove (store, "gw-2", 21) == 1);
    assert (brk_store_host_remove (store, "nobody", 21) == 1);
    assert (brk_store_host_insert (store, &host) == 0);
    assert (brk_store_host_find (store, "gw-2", &seen) == 0 && seen.removed_ms == 0);
    assert (strncmp (seen.public_key, "key-two", 7) == 0);
    brk_host_clear (&seen);
    assert (brk_store_host_find (store, "nobody", &seen) == 1);

    brk_store_destroy (&store);
    assert (store == NULL);
    brk_store_destroy (&store);

    //  Reopen: nothing re-run (still one row per migration).
    store = brk_store_new (path);
    assert (store);
    assert (brk_store_schema_version (store) == MIGRATION_COUNT);
    assert (sbx_db_query_int (store->db, "SELECT count(*) FROM schema_version", "") ==
            MIGRATION_COUNT);

    //  Transactions do not nest; commit and rollback need one.
    assert (!brk_store_in_transaction (store));
    assert (brk_store_commit (store) == -1);
    assert (brk_store_rollback (store) == -1);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_in_transaction (store));
    assert (brk_store_begin (store) == -1);
    assert (brk_store_rollback (store) == 0);

    //  Accounts.
    brk_account_t ada = {.id = "acc_ada",
                         .email = "Ada@Example.com",
                         .password_hash = "$argon2id$fake",
                         .plan = "free",
                         .admin = true,
                         .created_ms = 1700000000000ULL};
    assert (brk_store_account_insert (store, &ada) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_insert (store, &ada) == 0);
    brk_account_t dup = {.id = "acc_other", .email = "ada@EXAMPLE.COM", .plan = "free"};
    assert (brk_store_account_insert (store, &dup) == 1);
    dup.email = "someone@example.com";
    dup.id = "acc_ada";
    assert (brk_store_account_insert (store, &dup) == -1); //  duplicate id
    dup.id = NULL;
    assert (brk_store_account_insert (store, &dup) == -1);
    dup.id = "acc_x";
    dup.plan = "";
    assert (brk_store_account_insert (store, &dup) == -1);
    dup.plan = "free";
    dup.created_ms = UINT64_MAX;
    assert (brk_store_account_insert (store, &dup) == -1);
    assert (brk_store_account_insert (store, NULL) == -1);
    brk_account_t test_account = {.id = "acc_test", .email = "test@example.com", .plan = "pro"};
    assert (brk_store_account_insert (store, &test_account) == 0);
    assert (brk_store_commit (store) == 0);
    uint64_t count = 0;
    assert (brk_store_account_count (store, &count) == 0 && count == 2);

    brk_account_t found;
    assert (brk_store_account_find (store, "acc_ada", &found) == 0);
    assert (strcmp (found.id, "acc_ada") == 0);
    assert (strcmp (found.email, "Ada@Example.com") == 0);
    assert (strcmp (found.password_hash, "$argon2id$fake") == 0);
    assert (strcmp (found.plan, "free") == 0);
    assert (found.admin && found.created_ms == 1700000000000ULL);
    brk_account_clear (&found);
    assert (found.id == NULL);
    brk_account_clear (&found);
    assert (brk_store_account_find (store, "ADA@example.COM", &found) == 0);
    assert (strcmp (found.id, "acc_ada") == 0);
    brk_account_clear (&found);
    assert (brk_store_account_find (store, "test@example.com", &found) == 0);
    assert (found.password_hash == NULL && !found.admin);
    brk_account_clear (&found);
    assert (brk_store_account_find (store, "nobody@example.com", &found) == 1);
    assert (found.id == NULL);
    assert (brk_store_account_find (store, NULL, &found) == -1);
    assert (brk_store_account_find (store, "acc_ada", NULL) == -1);

    //  API keys.
    brk_key_t key = {.id = "key_1",
                     .account_id = "acc_ada",
                     .kind = "api_key",
                     .name = "laptop",
                     .preset = "full",
                     .prefix = "sbx_abcd",
                     .hash = "h1",
                     .created_ms = 1000};
    assert (brk_store_key_insert (store, &key) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_key_insert (store, &key) == 0);
    key.id = "key_2", key.hash = "h2", key.created_ms = 2000, key.preset = "read-only";
    key.expires_ms = 9000;
    assert (brk_store_key_insert (store, &key) == 0);
    //  Same millisecond as key_2: inserted later, so listed first.
    key.id = "key_3", key.hash = "h3", key.kind = "connection", key.preset = NULL;
    key.name = NULL, key.prefix = NULL, key.expires_ms = 0;
    assert (brk_store_key_insert (store, &key) == 0);
    key.id = "key_4"; //  same hash as key_3
    assert (brk_store_key_insert (store, &key) == 1);
    key.hash = "h4", key.account_id = "acc_nobody";
    assert (brk_store_key_insert (store, &key) == -1); //  unknown account
    key.account_id = "acc_ada", key.kind = "password";
    assert (brk_store_key_insert (store, &key) == -1);
    key.kind = "api_key", key.preset = "admin";
    assert (brk_store_key_insert (store, &key) == -1);
    key.preset = "ci", key.hash = "";
    assert (brk_store_key_insert (store, &key) == -1);
    key.id = "key_1", key.hash = "h4"; //  duplicate id
    assert (brk_store_key_insert (store, &key) == -1);
    assert (brk_store_commit (store) == 0);

    brk_key_t got;
    assert (brk_store_key_find_by_hash (store, "h2", &got) == 0);
    assert (strcmp (got.id, "key_2") == 0 && strcmp (got.account_id, "acc_ada") == 0);
    assert (strcmp (got.kind, "api_key") == 0 && strcmp (got.preset, "read-only") == 0);
    assert (strcmp (got.name, "laptop") == 0 && strcmp (got.prefix, "sbx_abcd") == 0);
    assert (got.created_ms == 2000 && got.expires_ms == 9000);
    assert (got.last_used_ms == 0 && got.revoked_ms == 0);
    brk_key_clear (&got);
    assert (brk_store_key_find (store, "key_3", &got) == 0);
    assert (strcmp (got.kind, "connection") == 0);
    assert (got.preset == NULL && got.name == NULL && got.prefix == NULL);
    brk_key_clear (&got);
    assert (brk_store_key_find_by_hash (store, "h9", &got) == 1);
    assert (brk_store_key_find (store, "key_9", &got) == 1);
    assert (brk_store_key_find (store, NULL, &got) == -1);

    test_keys_t keys = {.count = 0};
    assert (brk_store_key_list (store, "acc_ada", s_test_key, &keys) == 3);
    assert (strcmp (keys.ids[0], "key_3") == 0);
    assert (strcmp (keys.ids[1], "key_2") == 0);
    assert (strcmp (keys.ids[2], "key_1") == 0);
    keys = (test_keys_t){.count = 0};
    assert (brk_store_key_list (store, "acc_test", s_test_key, &keys) == 0);
    assert (brk_store_key_list (store, "acc_ada", NULL, NULL) == -1);

    assert (brk_store_key_revoke (store, "key_1", 5000) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_key_revoke (store, "key_1", 5000) == 0);
    assert (brk_store_key_revoke (store, "key_1", 6000) == 0);
    assert (brk_store_key_revoke (store, "key_9", 6000) == 1);
    assert (brk_store_key_revoke (store, "key_2", 0) == -1);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_key_find (store, "key_1", &got) == 0 && got.revoked_ms == 5000);
    brk_key_clear (&got);

    assert (brk_store_key_touch (store, "key_2", 7000) == 0);
    assert (brk_store_key_touch (store, "key_2", 6500) == 0); //  never backwards
    assert (brk_store_key_touch (store, "key_9", 7000) == 0);
    assert (brk_store_key_find (store, "key_2", &got) == 0 && got.last_used_ms == 7000);
    brk_key_clear (&got);

    //  Sandboxes: insert, a taken label, state changes, counting per vmd, labels.
    brk_sandbox_t sb = {.id = "sb_one",
                        .account_id = "acc_ada",
                        .label = "calm-brisk-jay",
                        .state = "creating",
                        .type = "small",
                        .vmd = "host-a",
                        .created_ms = 100,
                        .expires_ms = 3700,
                        .changed_ms = 100};
    assert (brk_store_sandbox_insert (store, &sb) == -1); //  outside a transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_sandbox_insert (store, &sb) == 0);
    brk_sandbox_t twin = sb;
    twin.id = "sb_two";
    assert (brk_store_sandbox_insert (store, &twin) == 1); //  label taken
    twin.label = "quiet-green-owl";
    twin.state = "bogus";
    assert (brk_store_sandbox_insert (store, &twin) == -1);
    twin.state = "creating";
    twin.created_ms = 200;
    twin.egress_allow = "10.0.0.0/8\nexample.com";
    assert (brk_store_sandbox_insert (store, &twin) == 0);
    twin.egress_allow = NULL;
    assert (brk_store_sandbox_set_egress (store, "sb_one", "", "1.2.3.4") == 0);
    assert (brk_store_sandbox_label_set (store, "sb_one", "team", "red") == 0);
    assert (brk_store_sandbox_label_set (store, "sb_one", "team", "blue") == 0);
    assert (brk_store_sandbox_label_set (store, "sb_one", "env", "dev") == 0);
    assert (brk_store_sandbox_set_state (store, "sb_one", "ready", NULL, NULL, 150) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_none", "ready", NULL, NULL, 150) == 1);
    assert (brk_store_commit (store) == 0);
    uint64_t active = 0;
    assert (brk_store_sandbox_active (store, "host-a", &active) == 0 && active == 2);
    s_test_vmd_load (store);
    //  By state and type: one ready, one creating (sbx_sandboxes).
    uint64_t by_state[2] = {0, 0};
    assert (brk_store_sandbox_counts (store, s_test_by_state, by_state) == 2);
    assert (by_state[0] == 1 && by_state[1] == 1);
    brk_sandbox_t sbf;
    assert (brk_store_sandbox_find (store, "sb_one", &sbf) == 0);
    assert (strcmp (sbf.state, "ready") == 0 && strcmp (sbf.vmd, "host-a") == 0);
    assert (sbf.expires_ms == 3700 && sbf.changed_ms == 150 && !sbf.reason);
    assert (!sbf.egress_allow && strcmp (sbf.egress_deny, "1.2.3.4") == 0);
    brk_sandbox_clear (&sbf);
    assert (brk_store_sandbox_find (store, "sb_two", &sbf) == 0);
    assert (strcmp (sbf.egress_allow, "10.0.0.0/8\nexample.com") == 0 && !sbf.egress_deny);
    brk_sandbox_clear (&sbf);
    assert (brk_store_sandbox_find (store, "sb_none", &sbf) == 1);
    test_labels_t labels = {0};
    assert (brk_store_sandbox_labels (store, "sb_one", s_test_label, &labels) == 2);
    assert (strcmp (labels.text, "env=dev;team=blue;") == 0);
    //  Ports: set (twice: an update keeps one row), find, list, delete; by label.
    brk_port_t port = {.sandbox_id = "sb_one",
                       .port = 8000,
                       .host = "127.0.0.1",
                       .host_port = 40001,
                       .created_ms = 160};
    assert (brk_store_port_set (store, &port) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_port_set (store, &port) == 0);
    port.public = true;
    port.host_port = 40002;
    assert (brk_store_port_set (store, &port) == 0);
    port.port = 70000;
    assert (brk_store_port_set (store, &port) == -1);
    port.port = 22;
    assert (brk_store_port_set (store, &port) == 0);
    port.sandbox_id = "sb_none";
    assert (brk_store_port_set (store, &port) == -1); //  foreign key
    assert (brk_store_commit (store) == 0);
    brk_port_t pf;
    assert (brk_store_port_find (store, "sb_one", 8000, &pf) == 0);
    assert (pf.host_port == 40002 && pf.public && pf.created_ms == 160);
    assert (strcmp (pf.host, "127.0.0.1") == 0);
    brk_port_clear (&pf);
    assert (brk_store_port_find (store, "sb_one", 8001, &pf) == 1);
    assert (brk_store_ports (store, "sb_one", s_test_port, &pf) == 2);
    assert (pf.port == 8000); //  the last one handed out: by port number
    assert (brk_store_begin (store) == 0);
    assert (brk_store_port_delete (store, "sb_one", 22) == 0);
    assert (brk_store_port_delete (store, "sb_one", 22) == 1);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_ports (store, "sb_one", s_test_port, &pf) == 1);
    assert (brk_store_sandbox_find_by_label (store, sb.label, &sbf) == 0);
    assert (strcmp (sbf.id, "sb_one") == 0);
    brk_sandbox_clear (&sbf);
    assert (brk_store_sandbox_find_by_label (store, "no-such-label", &sbf) == 1);
    test_list_t listed = {0};
    assert (brk_store_sandbox_list (store, "acc_ada", s_test_sandbox, &listed) == 2);
    assert (strcmp (listed.ids, "sb_two;sb_one;") == 0); //  newest first
    //  The same a page at a time, then nothing; everyone's; another account's; a key's.
    brk_store_mark_t mark = {0};
    memset (&listed, 0, sizeof listed);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 1, &mark, s_test_sandbox, &listed) ==
            1);
    assert (mark.created_ms == 200 && mark.row > 0);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 1, &mark, s_test_sandbox, &listed) ==
            1);
    assert (mark.created_ms == 100);
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 1, &mark, s_test_sandbox, &listed) ==
            0);
    assert (strcmp (listed.ids, "sb_two;sb_one;") == 0);
    mark = (brk_store_mark_t){0};
    assert (brk_store_sandbox_page (store, NULL, NULL, 10, &mark, s_test_sandbox, &listed) == 2);
    mark = (brk_store_mark_t){0};
    assert (brk_store_sandbox_page (store, "acc_bob", NULL, 10, &mark, s_test_sandbox, &listed) ==
            0);
    assert (brk_store_sandbox_page (store, "acc_ada", "key_x", 10, &mark, s_test_sandbox,
                                    &listed) == 0);
    mark.created_ms = UINT64_MAX;
    assert (brk_store_sandbox_page (store, "acc_ada", NULL, 10, &mark, s_test_sandbox, &listed) ==
            -1);
    s_test_pages (store);
    //  A deleted sandbox leaves lists and counts, and frees its label.
    assert (brk_store_begin (store) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_two", "deleted", NULL, NULL, 300) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_one", "error", NULL, "qemu died", 300) == 0);
    assert (brk_store_commit (store) == 0);
    memset (&listed, 0, sizeof listed);
    assert (brk_store_sandbox_list (store, NULL, s_test_sandbox, &listed) == 1);
    assert (brk_store_sandbox_active (store, "host-a", &active) == 0 && active == 0);
    s_test_vmd_load (store);
    assert (brk_store_sandbox_find (store, "sb_one", &sbf) == 0);
    assert (sbf.reason && strcmp (sbf.reason, "qemu died") == 0);
    brk_sandbox_clear (&sbf);
    assert (brk_store_begin (store) == 0);
    twin.id = "sb_three";
    assert (brk_store_sandbox_insert (store, &twin) == 0); //  quiet-green-owl again
    assert (brk_store_commit (store) == 0);

    //  Operators' account changes: the list, counts, disabling, a password, deleting.
    test_list_t accounts = {0};
    assert (brk_store_account_list (store, s_test_account, &accounts) == 2);
    assert (strcmp (accounts.ids, "acc_test;acc_ada;") == 0); //  oldest first
    brk_account_counts_t counts;
    assert (brk_store_account_counts (store, "acc_ada", 8000, &counts) == 0);
    //  sb_one (error) and sb_three count, sb_two is deleted; key_1 is revoked, key_2
    //  expires at 9000, key_3 (a connection) never.
    assert (counts.sandboxes == 2 && counts.keys == 2);
    assert (brk_store_account_counts (store, "acc_ada", 9000, &counts) == 0 && counts.keys == 1);
    assert (brk_store_account_counts (store, "acc_test", 9000, &counts) == 0);
    assert (counts.sandboxes == 0 && counts.keys == 0);
    bool disabled = true;
    assert (brk_store_account_disabled (store, "acc_ada", &disabled) == 0 && !disabled);
    assert (brk_store_account_disabled (store, "acc_nobody", &disabled) == 1);
    assert (brk_store_account_set_disabled (store, "acc_ada", 4000) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_set_disabled (store, "acc_ada", 4000) == 0);
    assert (brk_store_account_set_disabled (store, "acc_nobody", 4000) == 1);
    assert (brk_store_sandbox_set_state (store, "sb_three", "ready", NULL, NULL, 400) == 0);
    assert (brk_store_account_set_password (store, "acc_ada", NULL) == 0);
    assert (brk_store_account_set_password (store, "acc_nobody", "$argon2id$x") == 1);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_account_disabled (store, "acc_ada", &disabled) == 0 && disabled);
    assert (brk_store_account_find (store, "acc_ada", &found) == 0);
    assert (found.disabled_ms == 4000 && found.password_hash == NULL);
    brk_account_clear (&found);
    //  The tick stops a disabled account's ready sandboxes: sb_three only (sb_one is in error).
    memset (&listed, 0, sizeof listed);
    assert (brk_store_sandbox_disabled (store, 100, s_test_sandbox, &listed) == 1);
    assert (strcmp (listed.ids, "sb_three;") == 0);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_set_disabled (store, "acc_ada", 0) == 0);
    assert (brk_store_account_set_password (store, "acc_ada", "$argon2id$fake") == 0);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_sandbox_disabled (store, 100, s_test_sandbox, &listed) == 0);
    uint64_t admins = 0;
    assert (brk_store_admin_count (store, &admins) == 0 && admins == 1);
    //  Deleted: its keys revoked (key_1 keeps its first revocation), not found by id nor
    //  email, not counted nor listed; the email is free again. Its sandboxes' rows stay.
    assert (brk_store_account_delete (store, "acc_ada", 7000) == -1); //  no transaction
    assert (brk_store_begin (store) == 0);
    assert (brk_store_account_delete (store, "acc_ada", 7000) == 0);
    assert (brk_store_account_delete (store, "acc_ada", 7000) == 1);
    assert (brk_store_account_delete (store, "acc_ada", 0) == -1);
    assert (brk_store_commit (store) == 0);
    assert (brk_store_key_find (store, "key_1", &got) == 0 && got.revoked_ms == 5000);
    brk_key_clear (&got);
    assert (brk_store_key_find (store, "key_3", &got) == 0 && got.revoked_ms == 7000);
    brk_key_clear (&got);
    assert (brk_store_account_find (store, "acc_ada", &found) == 1);
    assert (brk_store_account_find (store, "ada@example.com", &found) == 1);
    assert (brk_store_account_disabled (store, "acc_ada", &disabled) == 1);
    assert (brk_store_account_count (store, &count) == 0 && count == 1);
    assert (brk_store_admin_count (store, &admins) == 0 && admins == 0);
    assert (brk_store_sandbox_find (store, "sb_three", &sbf) == 0);
    brk_sandbox_clear (&sbf);
    assert (brk_store_begin (store) == 0);
    brk_account_t again = {.id = "acc_ada2",
                           .email = "ada@example.com",
                           .plan = "free",
                           .created_ms = 1700000000001ULL};
    assert (brk_store_account_insert (store, &again) == 0);
    assert (brk_store_sandbox_set_state (store, "sb_three", "deleted", NULL, NULL, 500) == 0);
    assert (brk_store_commit (store) == 0);
    memset (&accounts, 0, sizeof accounts);
    assert (brk_store_account_list (store, s_test_account, &accounts) == 2);
    assert (strcmp (accounts.ids, "acc_test;acc_ada2;") == 0);

    //  Meta.
    assert (brk_store_meta_get (store, "tap.epoch") == NULL);
    assert (brk_store_meta_set (store, "tap.epoch", "1") == 0);
    assert (brk_store_meta_set (store, "tap.epoch", "2") == 0);
    char *value = brk_store_meta_get (store, "tap.epoch");
    assert (value && strcmp (value, "2") == 0);
    free (value);
    assert (brk_store_meta_set (store, "gone", "x") == 0);
    assert (brk_store_meta_set (store, "gone", NULL) == 0);
    assert (brk_store_meta_get (store, "gone") == NULL);
    assert (brk_store_meta_set (store, NULL, "x") == -1);

    //  Events: 1000 in ten transactions, numbered 1..1000 without gaps.
    uint64_t seq = 0;
    assert (brk_store_last_seq (store) == 0);
    assert (brk_store_event_append (store, "x", NULL, NULL, NULL, 0, 1, &seq) == -1);
    uint64_t expected = 1;
    for (int tx = 0; tx < 10; tx++) {
        assert (brk_store_begin (store) == 0);
        for (int i = 0; i < 100; i++) {
            char payload[32];
            snprintf (payload, sizeof payload, "p%llu", (unsigned long long) expected);
            assert (brk_store_event_append (store, s_test_types[expected % 3], "acc_test", "sb_1",
                                            (const uint8_t *) payload, strlen (payload),
                                            1000 + expected, &seq) == 0);
            assert (seq == expected);
            expected++;
        }
        assert (brk_store_commit (store) == 0);
    }
    assert (brk_store_last_seq (store) == 1000);

    //  A rolled-back transaction leaves no events, and its numbers are handed out
    //  again: SQLite keeps the AUTOINCREMENT counter in sqlite_sequence, which the
    //  rollback restores. So the committed log stays gapless (what the tap and billing
    //  rely on); a number is only final once committed, so publish after commit.
    assert (brk_store_begin (store) == 0);
    for (int i = 0; i < 5; i++)
        assert (brk_store_event_append (store, "account.created", NULL, NULL, NULL, 0, 5, &seq) ==
                0);
    assert (seq == 1005);
    assert (brk_store_last_seq (store) == 1005); //  its own, uncommitted
    assert (brk_store_rollback (store) == 0);
    assert (brk_store_last_seq (store) == 1000);
    assert (brk_store_begin (store) == 0);
    assert (brk_store_event_append (store, "account.created", NULL, "key_1", NULL, 0, 3000, &seq) ==
            0);
    assert (seq == 1001);
    assert (brk_store_commit (store) == 0);

    //  Bad events.
    assert (brk_store_begin (store) == 0);
    char long_type[BRK_EVENT_TYPE_MAX + 2];
    memset (long_type, 'a', sizeof long_type - 1);
    long_type[sizeof long_type - 1] = 0;
    assert (brk_store_event_append (store, long_type, NULL, NULL, NULL, 0, 1, NULL) == -1);
    long_type[BRK_EVENT_TYPE_MAX] = 0; //  exactly the limit is fine
    assert (brk_store_event_append (store, NULL, NULL, NULL, NULL, 0, 1, NULL) == -1);
    assert (brk_store_event_append (store, "", NULL, NULL, NULL, 0, 1, NULL) == -1);
    assert (brk_store_event_append (store, "x", NULL, NULL, NULL, 1, 1, NULL) == -1);
    assert (brk_store_event_append (store, "x", NULL, NULL, (const uint8_t *) "x",
                                    BRK_EVENT_PAYLOAD_MAX + 1, 1, NULL) == -1);
    assert (brk_store_event_append (store, "x", NULL, NULL, NULL, 0, UINT64_MAX, NULL) == -1);
    assert (brk_store_event_append (store, long_type, NULL, NULL, NULL, 0, 1, &seq) == 0);
    assert (seq == 1002);
    assert (brk_store_rollback (store) == 0);

    //  Replay: all, limits, resumption, prefixes.
    test_walk_t walk = {.next_seq = 1};
    assert (brk_store_events_after (store, 0, 0, NULL, s_test_event, &walk) == 1001);
    assert (walk.rows == 1001 && walk.next_seq == 1002);
    walk = (test_walk_t){.next_seq = 1};
    assert (brk_store_events_after (store, 0, 10, NULL, s_test_event, &walk) == 10);
    assert (walk.next_seq == 11);
    walk = (test_walk_t){.next_seq = 996};
    assert (brk_store_events_after (store, 995, 100, "", s_test_event, &walk) == 6);
    assert (brk_store_events_after (store, 1001, 100, NULL, s_test_event, &walk) == 0);
    assert (brk_store_events_after (store, UINT64_MAX, 100, NULL, s_test_event, &walk) == 0);
    //  seq % 3 == 0 → "sandbox_x.created": 333 of them in 1..1000.
    walk = (test_walk_t){.prefix = "sandbox_"};
    assert (brk_store_events_after (store, 0, 0, "sandbox_", s_test_event, &walk) == 333);
    walk = (test_walk_t){.prefix = "sandbox"};
    assert (brk_store_events_after (store, 0, 0, "sandbox", s_test_event, &walk) == 667);
    walk = (test_walk_t){.prefix = "sandbox%"};
    assert (brk_store_events_after (store, 0, 0, "sandbox%", s_test_event, &walk) == 0);
    walk = (test_walk_t){.prefix = "SANDBOX"};
    assert (brk_store_events_after (store, 0, 0, "SANDBOX", s_test_event, &walk) == 0);
    walk = (test_walk_t){.prefix = "account."};
    assert (brk_store_events_after (store, 990, 2, "account.", s_test_event, &walk) == 2);
    //  A callback cannot restart the walk it is in.
    walk = (test_walk_t){.store = store};
    assert (brk_store_events_after (store, 0, 1, NULL, s_test_event, &walk) == 1);
    assert (walk.nested_rc == -1);
    assert (brk_store_events_after (store, 0, 0, NULL, NULL, NULL) == -1);
    brk_store_destroy (&store);

    //  Reopen: everything kept.
    store = brk_store_new (path);
    assert (store);
    assert (brk_store_last_seq (store) == 1001);
    walk = (test_walk_t){.next_seq = 1};
    assert (brk_store_events_after (store, 0, 0, NULL, s_test_event, &walk) == 1001);
    assert (brk_store_account_count (store, &count) == 0 && count == 2);
    assert (brk_store_key_find_by_hash (store, "h1", &got) == 0 && got.revoked_ms == 5000);
    brk_key_clear (&got);
    value = brk_store_meta_get (store, "tap.epoch");
    assert (value && strcmp (value, "2") == 0);
    free (value);
    //  Closing inside a transaction rolls it back.
    assert (brk_store_begin (store) == 0);
    assert (brk_store_event_append (store, "x", NULL, NULL, NULL, 0, 1, NULL) == 0);
    brk_store_destroy (&store);
    store = brk_store_new (path);
    assert (store);
    assert (brk_store_last_seq (store) == 1001);

    //  A database whose pages after the first are garbage: refused or failing, never a crash.
    //  (Closing checkpointed the WAL into the main file, so copying it copies everything.)
    brk_store_destroy (&store);
    char smashed[PATH_MAX];
    snprintf (smashed, sizeof smashed, "%s/smashed.db", dir);
    FILE *file = fopen (path, "rb");
    assert (file);
    static uint8_t image[1 << 20];
    size_t image_size = fread (image, 1, sizeof image, file);
    fclose (file);
    assert (image_size > 4096 && image_size < sizeof image);
    for (size_t i = 4096; i < image_size; i++)
        image[i] = (uint8_t) (i * 167 + 13);
    s_test_write_file (smashed, image, image_size);
    brk_store_t *broken = brk_store_new (smashed);
    if (broken) {
        int rows = 0;
        brk_store_events_after (broken, 0, 0, NULL, s_test_count, &rows);
        brk_store_account_find (broken, "acc_ada", &found);
        brk_account_clear (&found);
        brk_store_destroy (&broken);
    }
    store = brk_store_new (path);
    assert (store);

    //  A database from a newer broker is refused.
    assert (sbx_db_exec (store->db, "INSERT INTO schema_version VALUES (999, 0)", "") == 0);
    brk_store_destroy (&store);
    assert (brk_store_new (path) == NULL);

    //  Files that are not databases: NULL, never a crash.
    char bad[PATH_MAX];
    uint8_t junk[8192];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t) (i * 131 + 7);
    const size_t sizes[] = {1, 99, 4096, sizeof junk};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf (bad, sizeof bad, "%s/junk%zu.db", dir, i);
        s_test_write_file (bad, junk, sizes[i]);
        assert (brk_store_new (bad) == NULL);
    }
    //  A real header followed by garbage pages.
    snprintf (bad, sizeof bad, "%s/torn.db", dir);
    uint8_t torn[8192];
    memcpy (torn, junk, sizeof torn);
    memcpy (torn, "SQLite format 3", 16);
    s_test_write_file (bad, torn, sizeof torn);
    assert (brk_store_new (bad) == NULL);
    assert (brk_store_new (dir) == NULL); //  a directory
    snprintf (bad, sizeof bad, "%s/missing/control.db", dir);
    assert (brk_store_new (bad) == NULL);
    assert (brk_store_new (NULL) == NULL);
    assert (brk_store_new ("") == NULL);

    //  Calls on no store fail rather than crash.
    assert (brk_store_begin (NULL) == -1);
    assert (brk_store_last_seq (NULL) == 0);
    assert (brk_store_meta_get (NULL, "x") == NULL);

    s_test_segments (dir);
    s_test_remove_dir (dir);
    if (verbose)
        printf ("\n");
}
