/*  brk_admin - the operator's account commands: account.list, account.get,
    account.update (a new password, disable, enable) and account.delete.

    Operators only (the CLI on the host: callers of kind admin or system); anyone else is
    permission_denied. Every change is written with its event in one transaction.

    Disabling logs account.disabled, which every gateway follows (gw_auth) to forget the
    account's cached credentials at once; from then on the broker refuses the account's
    API keys, OAuth tokens and signed-in pages (brk_accounts_refuse_disabled, asked by
    brk_server for every request such a caller makes), the gateway its sign-ins, and
    brk_limits its creates and resumes, while brk_sandbox_tick stops its ready sandboxes
    (memory kept). Enabling undoes all of it but the stops.

    Deleting is refused for the last admin account, and while a sandbox of the account
    is not deleted: the CLI (`sbx account delete`) disables the account, deletes its
    sandboxes and snapshots through the usual requests (so vmd frees the guests, billing
    closes the meters, snapshotd removes the files), then sends account.delete, which
    revokes the keys and connections (a key.revoked event each) and their tokens, ends
    the MCP sessions and leaves a tombstone (brk_store_account_delete). The event log and
    billing's ledger keep the account's history.
*/
#ifndef BRK_ADMIN_H_INCLUDED
#define BRK_ADMIN_H_INCLUDED

#include "brk_ctx.h"

//  Each returns its reply (the .ok message or a catalogued error), never NULL.
sbx_msg_t *brk_admin_list (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_admin_get (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_admin_update (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_admin_delete (brk_ctx_t *ctx, sbx_msg_t *request);

void brk_admin_test (bool verbose);

#endif
