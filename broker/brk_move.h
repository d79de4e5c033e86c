/*  brk_move - stopped sandboxes moved off a vmd host being drained (sbx host drain).

    Every second, for each vmd being drained (brk_store_drain_list) that is connected and
    not moving one already: its next stopped sandbox goes to the connected vmd, not being
    drained, with the fewest active sandboxes. One move is three requests, each answered
    before the next goes:

        vm.ship.offer  to the vmd that has it: its files made ready (the disk as one
                       overlay on the image), offered to a ticket the broker made
        vm.ship.take   to the other: fetch them host to host (common/sbx_ship) and take
                       the guest over, stopped
        (recorded)     the sandbox's vmd is the other one now, its published ports are
                       unpublished (the new host has no forwards), sandbox.moved
        vm.delete      to the first: its copy goes

    While a sandbox moves, a stop, resume or delete of it is refused `unavailable` (try
    again in a moment): brk_sandbox_in_flight says so. A move that fails leaves the
    sandbox where it was, whole, and is tried again 30 s later; the reason is logged.
*/
#ifndef BRK_MOVE_H_INCLUDED
#define BRK_MOVE_H_INCLUDED

#include "brk_ctx.h"

typedef struct _brk_move_t brk_move_t;

brk_move_t *brk_move_new (brk_ctx_t *ctx);
void brk_move_destroy (brk_move_t **self_p);

//  From the loop, every second.
void brk_move_tick (brk_move_t *self);

void brk_move_test (bool verbose);

#endif
