/*  gw_worker - runs a function off the loop and calls back in the loop with its answer.

    For work too slow for the loop (argon2id checks in gw_verify, HTTPS fetches in
    gw_fetch): a worker thread (a zactor) runs the work function on one request at a
    time, in order, and each answer comes back to the loop, where the request's callback
    is called. A request carries a small context (copied), handed back to its callback,
    so callers need not allocate per request nor free on cancel. */
#ifndef GW_WORKER_H_INCLUDED
#define GW_WORKER_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_worker_t gw_worker_t;

//  Runs in the worker thread: answers request (borrowed) with a fresh message (NULL is
//  sent as an empty one). state is gw_worker_new's.
typedef zmsg_t *(gw_worker_work_fn) (zmsg_t *request, void *state);

//  Frees gw_worker_new's state, in the worker thread when it stops.
typedef void (gw_worker_free_fn) (void *state);

//  Called once from the loop: answer (borrowed for the call) and the request's context
//  (its copy, writable, valid for the call).
typedef void (gw_worker_fn) (zmsg_t *answer, void *context);

//  Starts the thread and reads its answers from loop (borrowed). state (may be NULL) is
//  the worker's from here, freed with state_free (may be NULL) when it stops.
gw_worker_t *gw_worker_new (zloop_t *loop, gw_worker_work_fn *work, void *state,
                            gw_worker_free_fn *state_free);

//  Stops the worker (waits for the work in hand); callbacks of pending requests are not
//  called.
void gw_worker_destroy (gw_worker_t **self_p);

//  Queues request (taken) with context_size bytes of context (copied).
//  Returns a handle for cancel, or 0 when it could not be queued (fn is not called).
uint64_t gw_worker_start (gw_worker_t *self, zmsg_t **request_p, gw_worker_fn *fn,
                          const void *context, size_t context_size);

//  Forgets a pending request: its callback is not called. 0 is ignored.
void gw_worker_cancel (gw_worker_t *self, uint64_t handle);

void gw_worker_test (bool verbose);

#endif
