/*  gw_verify - password verification off the loop.

    argon2id is slow on purpose (tens of milliseconds, 64 MiB): done in the loop it would
    stall every other request. A worker thread (gw_worker) verifies one password at a time
    and the answer comes back to the loop, where the callback is called.

    Guessing is throttled: after 10 wrong passwords for one sign-in name within 15
    minutes, further attempts for it are refused without being checked until the window
    ends (answered throttled, from the worker like any answer). Kept in memory, per
    gateway. */
#ifndef GW_VERIFY_H_INCLUDED
#define GW_VERIFY_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_verify_t gw_verify_t;

typedef enum {
    GW_VERIFY_MATCH,
    GW_VERIFY_WRONG,
    GW_VERIFY_THROTTLED, //  too many wrong passwords for this name lately: not checked
} gw_verify_result_t;

//  Called once from the loop with the result.
typedef void (gw_verify_fn) (gw_verify_result_t result, void *arg);

//  Starts the worker and reads its answers from the loop (borrowed).
gw_verify_t *gw_verify_new (zloop_t *loop);

//  Stops the worker; callbacks of pending checks are not called.
void gw_verify_destroy (gw_verify_t **self_p);

//  Checks password against an argon2id hash string; `who` (the sign-in name, compared
//  case-insensitively) is what wrong guesses are counted against. Returns a handle for
//  cancel, or 0 when fn was already called (wrong: the check could not start).
uint64_t gw_verify_start (gw_verify_t *self, const char *who, const char *hash,
                          const char *password, gw_verify_fn *fn, void *arg);

//  Forgets a pending check: its callback is not called.
void gw_verify_cancel (gw_verify_t *self, uint64_t handle);

void gw_verify_test (bool verbose);

#endif
