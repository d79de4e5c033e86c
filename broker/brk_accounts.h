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

#endif
