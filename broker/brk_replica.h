/*  brk_replica - user snapshots kept on two hosts: the broker has a copy made on another
    host for each ready user snapshot that has one (docs/operations.md, "Snapshots on
    several hosts").

    Every two seconds, when no copy is under way and at least two hosts have both their
    vmd and their snapshotd connected (the same instance name: one host), snapshotd is
    asked which snapshot wants a copy next (snap.replica.next, with those hosts; drained
    ones may only give). One copy is four requests, each answered before the next goes:

        vm.ship.offer  (snapshot_id) to the giving host's vmd: snapshots/<id>/ flattened
                       onto the image and offered to a ticket the broker made
        vm.ship.take   (snapshot_id) to the taking host's vmd: fetched host to host
                       (common/sbx_ship) into its store, snapshots/<id>/
        snap.replica.done  to the taking host's snapshotd: the files checked and the
                       copy recorded in the catalog (which the cluster shares)

    Copies on a host that is gone (removed with `sbx host remove`, or not connected for
    vmd.lost_after_ms) do not count: a snapshot left with one copy gets a new second one.

    A copy that fails leaves nothing on the taker and is not tried again for 30 s (the
    reason is logged). On one machine (one host) nothing happens.
*/
#ifndef BRK_REPLICA_H_INCLUDED
#define BRK_REPLICA_H_INCLUDED

#include "brk_ctx.h"

typedef struct _brk_replica_t brk_replica_t;

brk_replica_t *brk_replica_new (brk_ctx_t *ctx);
void brk_replica_destroy (brk_replica_t **self_p);

//  From the loop, every second.
void brk_replica_tick (brk_replica_t *self);

#endif
