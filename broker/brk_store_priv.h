/*  brk_store_priv - what the two halves of brk_store share: brk_store.c (accounts, keys,
    events, meta, sandboxes, ports, the self-test), brk_store_oauth.c (OAuth clients,
    codes and tokens) and brk_store_mcp.c (MCP sessions). Private to them: everyone else
    includes brk_store.h.

    The migrations and the statements' SQL stay in brk_store.c, in one array indexed by
    stmt_id_t, so the schema is read in one place and prepared once at open.
*/
#ifndef BRK_STORE_PRIV_H_INCLUDED
#define BRK_STORE_PRIV_H_INCLUDED

#include "brk_store.h"
#include "sbx_db.h"

//  The prepared statements, by number (their SQL: s_sql in brk_store.c).
typedef enum {
    ST_EVENT_APPEND,
    ST_LAST_SEQ,
    ST_EVENTS_AFTER,
    ST_ACCOUNT_INSERT,
    ST_ACCOUNT_FIND,
    ST_ACCOUNT_COUNT,
    ST_ACCOUNT_LIST,
    ST_ACCOUNT_SANDBOXES,
    ST_ACCOUNT_KEYS,
    ST_ACCOUNT_DISABLED,
    ST_ADMIN_COUNT,
    ST_ACCOUNT_PASSWORD,
    ST_ACCOUNT_DISABLE,
    ST_ACCOUNT_TOMBSTONE,
    ST_ACCOUNT_REVOKE_KEYS,
    ST_ACCOUNT_REVOKE_TOKENS,
    ST_ACCOUNT_END_SESSIONS,
    ST_KEY_INSERT,
    ST_KEY_FIND_BY_HASH,
    ST_KEY_FIND,
    ST_KEY_LIST,
    ST_KEY_REVOKE,
    ST_KEY_EXISTS,
    ST_KEY_TOUCH,
    ST_META_GET,
    ST_META_SET,
    ST_META_DELETE,
    ST_HOST_INSERT,
    ST_HOST_FIND,
    ST_HOST_LIST,
    ST_HOST_REMOVE,
    ST_DRAIN_SET,
    ST_DRAIN_UNSET,
    ST_DRAIN_GET,
    ST_DRAIN_LIST,
    ST_SANDBOX_ON_VMD,
    ST_SANDBOX_INSERT,
    ST_SANDBOX_FIND,
    ST_SANDBOX_PAGE,
    ST_SANDBOX_PAGE_ALL,
    ST_SANDBOX_STATE,
    ST_SANDBOX_ACTIVE,
    ST_SANDBOX_COUNTS,
    ST_SANDBOX_EXPIRED,
    ST_SANDBOX_EXPIRY,
    ST_SANDBOX_MOVING,
    ST_SANDBOX_HELD,
    ST_SANDBOX_STOPPED_ON,
    ST_SANDBOX_LOST,
    ST_SANDBOX_LOST_ANY,
    ST_SANDBOX_VMDS,
    ST_SANDBOX_NAME,
    ST_SANDBOX_AUTO_RESUME,
    ST_SANDBOX_EGRESS,
    ST_LABEL_SET,
    ST_LABEL_DELETE,
    ST_LABEL_LIST,
    ST_SANDBOX_BY_LABEL,
    ST_PORT_SET,
    ST_PORT_DELETE,
    ST_PORT_FIND,
    ST_PORT_LIST,
    ST_START_ADD,
    ST_STARTS_SINCE,
    ST_ACCOUNT_RUNNING,
    ST_FUNDS_SET,
    ST_FUNDS_GET,
    ST_SANDBOX_UNFUNDED,
    ST_SANDBOX_DISABLED,
    ST_CLIENT_INSERT,
    ST_CLIENT_FIND,
    ST_TOKEN_INSERT,
    ST_TOKEN_FIND,
    ST_TOKEN_USE,
    ST_TOKEN_REVOKE,
    ST_TOKEN_REVOKE_GRANT,
    ST_GRANT_FIND,
    ST_TOKEN_PURGE,
    ST_MCP_INSERT,
    ST_MCP_FIND,
    ST_MCP_USE,
    ST_MCP_DELETE,
    ST_MCP_COUNT,
    ST_MCP_OLDEST,
    ST_MCP_IDLE,
    ST_MCP_ENV_CLEAR,
    ST_MCP_ENV_SET,
    ST_MCP_ENV_LIST,
    ST_COUNT
} stmt_id_t;

//  A sealed segment of the event log: events first..last (brk_store_segments.c).
typedef struct {
    uint64_t first, last;
} brk_segment_t;

struct _brk_store_t {
    sbx_db_t *db;
    //  The event log's sealed segments, oldest first, and the sealing under way.
    char *seg_dir;     //  NULL: no segments (brk_store_segments_open not called)
    uint64_t seg_size; //  events per segment; 0: no sealing
    brk_segment_t *segs;
    size_t seg_count, seg_max;
    int seal_phase; //  0 idle, 1 copying into the .part file, 2 deleting from live
    uint64_t seal_first, seal_last, seal_done; //  the segment's range; done up to seal_done
};

//  The part of brk_store_events_after that reads sealed segments: hands fn the events
//  after *after_seq that they hold (up to limit), moves *after_seq past them, and
//  returns how many (-1 on error). brk_store_segments.c.
int brk_store_segments_after (brk_store_t *self, uint64_t *after_seq, size_t limit,
                              const char *type_prefix, brk_store_event_fn *fn, void *arg);
void brk_store_segments_close (brk_store_t *self);

//  True when text is one of the NULL-terminated names.
bool brk_store_one_of (const char *text, const char **names);

//  Finds the one row statement id has for a text key (its only parameter). *out (size
//  bytes) is zeroed, then filled by fill, which clears it when it fails. 0 found, 1 not
//  found, -1 error (logged with what) or a NULL argument.
//  fn for each first-column text of stmt's rows (at most 1000, collected before fn runs,
//  so fn may use the store): how many, or -1.
int brk_store_names (sbx_stmt_t *stmt, brk_store_name_fn *fn, void *arg);
int brk_store_find (brk_store_t *self, stmt_id_t id, const char *key, sbx_db_row_fn *fill,
                    void *out, size_t size, const char *what);

//  Row function: a one-column text row into *(char **) out (fresh; NULL text fails).
int brk_store_text_from_row (sbx_stmt_t *stmt, void *out);

#endif
