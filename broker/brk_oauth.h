/*  brk_oauth - handlers for oauth.* requests: the authorization server's state.

    The gateway serves the OAuth endpoints (gateway/gw_oauth.c) and asks the broker,
    which owns the data in control.db: registered clients, grants, codes and tokens.
    A grant is a connection: an api_keys row of kind "connection" named
    "<client name> (MCP)", so it shows in the account's key list and `key.revoke` on it
    (Disconnect) stops its tokens. Codes and tokens are random secrets returned once and
    stored as SHA-256 hashes: codes live a minute and are single use (a replayed code
    revokes every token of its grant), access tokens an hour (oauth.access_ttl_s),
    refresh tokens 30 days (oauth.refresh_ttl_s) and are rotated at each use (a rotated
    one presented again revokes the grant: someone holds a copy).

    Only gateway peers are answered (`trusted`): these messages mint credentials for any
    account. Each handler returns its reply, never NULL.
*/
#ifndef BRK_OAUTH_H_INCLUDED
#define BRK_OAUTH_H_INCLUDED

#include "brk_ctx.h"

sbx_msg_t *brk_oauth_client_register (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);
sbx_msg_t *brk_oauth_client_get (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);
sbx_msg_t *brk_oauth_password (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);
sbx_msg_t *brk_oauth_authorize (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);
sbx_msg_t *brk_oauth_token (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);
sbx_msg_t *brk_oauth_revoke (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);

//  auth.key for an OAuth access token (sbx_at_…): the caller (kind oauth, the grant as
//  key id) and the token's resource, or unauthenticated.
sbx_msg_t *brk_oauth_auth_token (brk_ctx_t *ctx, sbx_msg_t *request);

//  Revokes every token of a grant, inside the caller's transaction (key.revoke on a
//  connection). Returns 0 or -1.
int brk_oauth_grant_revoke (brk_ctx_t *ctx, const char *grant_id, uint64_t now_ms);

void brk_oauth_test (bool verbose);

#endif
