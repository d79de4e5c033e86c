/*  brk_reconcile - sandboxes that a broker before this one left on their way.

    A broker that stops (a crash, a restart, a failover to another control node) takes
    with it the vm.* requests it had in flight: their answers come back to nobody, and
    the records stay creating, stopping, resuming or deleting. Every second this asks
    each connected vmd that holds such a record (one whose request is not this broker's:
    brk_sandbox_in_flight) what it has (vm.list), and settles each record by it
    (brk_sandbox_settle): what the request led to, the request again, or error.
*/
#ifndef BRK_RECONCILE_H_INCLUDED
#define BRK_RECONCILE_H_INCLUDED

#include "brk_ctx.h"

typedef struct _brk_reconcile_t brk_reconcile_t;

brk_reconcile_t *brk_reconcile_new (brk_ctx_t *ctx);
void brk_reconcile_destroy (brk_reconcile_t **self_p);

//  Asks the vmds that hold such records (once the last answer came). From the loop.
void brk_reconcile_tick (brk_reconcile_t *self);

#endif
