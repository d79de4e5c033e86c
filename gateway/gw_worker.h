/*  gw_worker - runs a function off the loop and calls back in the loop with its answer.

    For work too slow for the loop (argon2id checks in gw_verify, HTTPS fetches in
    gw_fetch): a small pool of worker threads (zactors) runs the work function, each on
    one request at a time; requests wait in the loop, in order, until a thread is free
    (one thread: strictly in order), and each answer comes back to the loop, where the
    request's callback is called. A request cancelled while it waits is never worked. A request
   carries a small context (copied), handed back to its callback, so callers need not allocate per
   request nor free on cancel. */
#ifndef GW_WORKER_H_INCLUDED
#define GW_WORKER_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_worker_t gw_worker_t;

//  Runs in a worker thread: answers request (borrowed) with a fresh message (NULL is
//  sent as an empty one). state is gw_worker_new's, shared by the threads: with more
//  than one, work must be safe to run on it at once.
typedef zmsg_t *(gw_worker_work_fn) (zmsg_t *request, void *state);

//  Frees gw_worker_new's state once every thread has stopped.
typedef void (gw_worker_free_fn) (void *state);

//  Called once from the loop: answer (borrowed for the call) and the request's context
//  (its copy, writable, valid for the call).
typedef void (gw_worker_fn) (zmsg_t *answer, void *context);

//  Starts `threads` threads (1 to 64) and reads their answers from loop (borrowed).
//  state (may be NULL) is the worker's from here, freed with state_free (may be NULL)
//  when it stops, or at once when this fails (NULL).
gw_worker_t *gw_worker_new (zloop_t *loop, size_t threads, gw_worker_work_fn *work, void *state,
                            gw_worker_free_fn *state_free);

//  Stops the worker (waits for the work in hand); callbacks of pending requests are not
//  called.
void gw_worker_destroy (gw_worker_t **self_p);

//  Queues request (taken) with context_size bytes of context (copied); it goes to a
//  free thread now, or when one is free.
//  Returns a handle for cancel, or 0 when it could not be queued (fn is not called).
uint64_t gw_worker_start (gw_worker_t *self, zmsg_t **request_p, gw_worker_fn *fn,
                          const void *context, size_t context_size);

//  Forgets a pending request: its callback is not called, and if no thread has taken
//  it yet it is never worked. 0 is ignored.
void gw_worker_cancel (gw_worker_t *self, uint64_t handle);

//  Requests waiting for a free thread (not those being worked).
size_t gw_worker_waiting (gw_worker_t *self);

void gw_worker_test (bool verbose);

#endif
