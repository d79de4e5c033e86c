/*  brk_ctx - what the broker's request handlers share, and how they reach workers
    and clients later. Owned by brk_server. */
#ifndef BRK_CTX_H_INCLUDED
#define BRK_CTX_H_INCLUDED

#include "brk_events.h"
#include "brk_registry.h"
#include "brk_store.h"
#include "sbx_common.h"

typedef struct brk_ctx_t brk_ctx_t;

//  The answer to one of the broker's own requests: the worker's reply, or an error the
//  broker made (timeout, unavailable when the worker went away).
typedef void (brk_call_fn) (brk_ctx_t *ctx, sbx_msg_t **reply_p, void *arg);

struct brk_ctx_t {
    sbx_config_t *config;
    //  A control node's broker (brk_control): its node's cluster address, and the
    //  socket its node listens on in this process; both NULL on one machine.
    const char *control_node;
    const char *control_local;
    brk_store_t *store;
    brk_events_t *events;
    brk_registry_t *registry;
    //  The sandboxes with a vm.* request of this broker in flight (id → 1): a record on
    //  its way without one was left so by a broker before (brk_reconcile).
    zhashx_t *in_flight;
    void *server;
    //  Sends a request to the worker of `role` named `instance` (any when NULL) with a
    //  deadline; fn gets the answer, from the loop, exactly once (NULL: nobody waits for
    //  it). Takes the request.
    //  Returns 0, or -1 when no such worker is connected (fn is not called).
    int (*call) (brk_ctx_t *ctx, sbx_role_t role, const char *instance, sbx_msg_t **request_p,
                 uint32_t timeout_ms, brk_call_fn *fn, void *arg);
    //  Sends a message to a client (a reply that had to wait). Takes the message.
    void (*send) (brk_ctx_t *ctx, zframe_t *address, sbx_msg_t **msg_p);
    //  True while a brk_call_fn runs with an error the broker made itself (the deadline
    //  passed, the worker went away), not one the worker sent.
    bool answer_is_own;
};

#endif
