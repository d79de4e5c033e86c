/*  gw_mcp_sessions - MCP sessions as every gateway sees them: the broker keeps them
    (broker/brk_sessions), this keeps copies.

    A session opened on one gateway is served by all: a request naming a session this
    gateway has no copy of asks the broker (mcp.session.get), and the copy then serves
    the session's next requests with no broker round trip, as long as nothing changed:
    the broker's tap says mcp.session.changed when a session's default sandbox or env
    changed or it ended, and the copy is dropped. Copies answer only while the tap
    reader is caught up and the broker it follows is the one answering (as gw_auth's
    cache), so a change can be missed only for the tap's delivery time.
    A tool call's changes (gw_tools_state_take) reach the broker with sync before the
    call is answered, so the client's next request, on any gateway, sees them.
*/
#ifndef GW_MCP_SESSIONS_H_INCLUDED
#define GW_MCP_SESSIONS_H_INCLUDED

#include "gw_tools.h"
#include "sbx_common.h"

typedef struct gw_mcp_sessions_t gw_mcp_sessions_t;

//  The end of one request: state (borrowed for the call; gw_tools_state_ref to keep)
//  is the session's, or NULL with code (not_found for a session that is not, or not
//  the caller's; unavailable or timeout when the broker could not say). id is the
//  session's id (borrowed).
typedef void (gw_mcp_sessions_fn) (gw_tools_state_t *state, const char *id, sbx_code_t code,
                                   const char *message, void *arg);

//  config, peer and broker (the gateway's one broker client) are borrowed; peer NULL:
//  self-tests (requests fail unavailable).
typedef struct gw_broker_t gw_broker_t;
gw_mcp_sessions_t *gw_mcp_sessions_new (sbx_config_t *config, sbx_peer_t *peer,
                                        gw_broker_t *broker);
//  Forgets requests in flight (their callbacks are not called) and every copy.
void gw_mcp_sessions_destroy (gw_mcp_sessions_t **self_p);
//  Starts following the tap.
int gw_mcp_sessions_start (gw_mcp_sessions_t *self, zloop_t *loop);

//  The copy's state of session id when it is account's and the copy may answer, else
//  NULL (then fetch). Borrowed.
gw_tools_state_t *gw_mcp_sessions_find (gw_mcp_sessions_t *self, const char *id,
                                        const char *account_id);

//  Each calls fn once, from the loop or before it returns.
//  open: initialize (protocol agreed, client name); fetch: the broker's copy of id;
//  sync: sends what state's calls changed (gw_tools_state_take), then fn with state;
//  end: DELETE (fn's state is NULL, code SBX_OK when ended).
void gw_mcp_sessions_open (gw_mcp_sessions_t *self, const sbx_caller_t *caller,
                           const char *protocol, const char *client, gw_mcp_sessions_fn *fn,
                           void *arg);
void gw_mcp_sessions_fetch (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                            gw_mcp_sessions_fn *fn, void *arg);
//  credential: the state of the caller's credential (MCP 2026-07-28, which has no
//  sessions: the API key's or OAuth connection's default sandbox and env), session id
//  mcpc_<key id>: the copy, or the broker's (made on first use).
void gw_mcp_sessions_credential (gw_mcp_sessions_t *self, const sbx_caller_t *caller,
                                 gw_mcp_sessions_fn *fn, void *arg);
void gw_mcp_sessions_sync (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                           gw_tools_state_t *state, gw_mcp_sessions_fn *fn, void *arg);
void gw_mcp_sessions_end (gw_mcp_sessions_t *self, const sbx_caller_t *caller, const char *id,
                          gw_mcp_sessions_fn *fn, void *arg);

//  Copies held now (for /healthz).
size_t gw_mcp_sessions_size (gw_mcp_sessions_t *self);

void gw_mcp_sessions_test (bool verbose);

#endif
