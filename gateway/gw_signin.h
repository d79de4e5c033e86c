/*  gw_signin - signs a person in from a POSTed form, for the OAuth sign-in page and the
    account page.

    Looks the email's password hash up with the broker (oauth.password), verifies the
    password off the loop (gw_verify, which also throttles guessing; an email the broker
    does not know costs a dummy check, so it answers as slowly as a known one), and
    answers once
    through a callback: with the account when the password matched, else with the
    status and the sentence the sign-in page shows (wrong email or password, throttled,
    the account disabled by the operator: 403, said only once the password matched, the
    broker unavailable). Setting the session cookie and what page follows are the
    caller's. */
#ifndef GW_SIGNIN_H_INCLUDED
#define GW_SIGNIN_H_INCLUDED

#include "gw_broker.h"
#include "gw_verify.h"
#include "sbx_common.h"

typedef struct gw_signin_t gw_signin_t;

//  Called once from the loop: account_id and email (borrowed for the call) when the
//  password matched; else both NULL, with the sign-in page's status and error.
typedef void (gw_signin_fn) (const char *account_id, const char *email, int status,
                             const char *error, void *arg);

//  loop and broker are borrowed; the verifier (its thread, its count of wrong guesses)
//  is this sign-in's own until gw_signin_set_verify. who names the page in logs
//  ("oauth", "account").
gw_signin_t *gw_signin_new (zloop_t *loop, gw_broker_t *broker, const char *who);

//  Uses verify (borrowed) instead of its own: the gateway's one pool and throttle,
//  shared by every sign-in page, so guesses spread over the pages count together.
//  Before any attempt starts.
void gw_signin_set_verify (gw_signin_t *self, gw_verify_t *verify);

//  Cancels attempts in flight: their callbacks are not called.
void gw_signin_destroy (gw_signin_t **self_p);

//  Signs in with the form's email and password (either may be NULL or empty: answered
//  at once). Returns a handle for cancel, or 0 when fn was already called.
uint64_t gw_signin_start (gw_signin_t *self, const char *email, const char *password,
                          gw_signin_fn *fn, void *arg);

//  Forgets an attempt in flight: its callback is not called. 0 is ignored.
void gw_signin_cancel (gw_signin_t *self, uint64_t handle);

void gw_signin_test (bool verbose);

#endif
