/*  gw_verify - password verification off the loop, on a small pool of threads.

    argon2id is slow on purpose (tens of milliseconds, 64 MiB): done in the loop it would
    stall every other request. A pool of worker threads (gw_worker) verifies passwords
    and each answer comes back to the loop, where the callback is called. One sign-in
    name has at most one check on the pool at a time (the others wait in the loop), so a
    burst of guesses for one account holds one thread and other people's sign-ins pass it
    on the others. A name with wrong guesses in its window is checked on a thread of its
    own instead, at a lower CPU priority (niceness + 10), so on busy CPUs guessing slows neither
    other people's sign-ins nor the gateway's loop.

    Guessing is throttled: a name may have at most 10 wrong passwords within 15 minutes,
    counting checks still in flight as wrong, so 40 attempts at once start 10 checks and
    the other 30 are refused without argon2 running at all (answered throttled at once)
    until the window ends. A right password clears the count. Kept in memory, per
    gateway, shared by its sign-in pages.

    A name the broker does not know is checked against a dummy hash made at start, with
    the same cost and the same throttle, so neither the time an answer takes nor when
    the throttle starts tells which emails have accounts. */
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

//  Starts `threads` worker threads (1 to 64), and the suspect one, and reads their
//  answers from the loop (borrowed). Makes the dummy hash (one argon2id hash, tens of
//  milliseconds).
gw_verify_t *gw_verify_new (zloop_t *loop, size_t threads);

//  Stops the workers; callbacks of pending checks are not called.
void gw_verify_destroy (gw_verify_t **self_p);

//  Checks password against an argon2id hash string, or, when hash is NULL (the name is
//  unknown), against the dummy hash, answering wrong whatever it finds. `who` (the
//  sign-in name, compared case-insensitively) is what wrong guesses are counted against.
//  Returns a handle for cancel, or 0 when fn was already called (throttled, or wrong
//  when the check could not start).
uint64_t gw_verify_start (gw_verify_t *self, const char *who, const char *hash,
                          const char *password, gw_verify_fn *fn, void *arg);

//  Forgets a pending check: its callback is not called (and a check still waiting for
//  its turn never runs).
void gw_verify_cancel (gw_verify_t *self, uint64_t handle);

//  Checks started on the pool (dummy ones too) and attempts refused as throttled, since
//  start (for /healthz).
void gw_verify_counts (gw_verify_t *self, uint64_t *checked, uint64_t *throttled);

void gw_verify_test (bool verbose);

#endif
