/*  brk_accounts - handlers for account.* and key.* requests.

    Each handler takes the decoded request and returns its reply (the typed .ok message,
    or an error message with a catalogued code), never NULL. Every change is written
    with its event in one transaction. API key secrets are made here, returned once and
    stored as SHA-256 hashes.
*/
#ifndef BRK_ACCOUNTS_H_INCLUDED
#define BRK_ACCOUNTS_H_INCLUDED

#include "brk_ctx.h"

sbx_msg_t *brk_accounts_create (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_accounts_key_create (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_accounts_key_list (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_accounts_key_revoke (brk_ctx_t *ctx, sbx_msg_t *request);

//  wallet.credit: an operator's top-up, logged as wallet.credited for billing.
sbx_msg_t *brk_accounts_wallet_credit (brk_ctx_t *ctx, sbx_msg_t *request);
//  wallet.activate: charges of the account go to the named wallet from now on (an event).
sbx_msg_t *brk_accounts_wallet_activate (brk_ctx_t *ctx, sbx_msg_t *request);

//  auth.key: the caller an API key acts for, or unauthenticated.
sbx_msg_t *brk_accounts_auth_key (brk_ctx_t *ctx, sbx_msg_t *request);

//  The refusal of a credential of account_id (an API key, an OAuth token, a signed-in
//  page) while that account is disabled or deleted: unauthenticated, its message
//  beginning "account disabled:" (gateways show it), or NULL when the account is active.
sbx_msg_t *brk_accounts_refuse_disabled (brk_ctx_t *ctx, const char *account_id, uint64_t rid);

//  Whether caller is an operator (the CLI on the host, or the broker itself).
bool brk_accounts_operator (const sbx_caller_t *caller);

#endif
