/*  brk_snapshot - saving and deleting snapshots: the broker's side of the store that
    sbx-snapshotd keeps (docs/snapshots.md).

    snapshot.save is orchestrated here because only the broker knows both who owns a
    sandbox and which vmd hosts it: the sandbox must be the caller's and ready or
    stopped; snapshotd makes a saving record and a directory (snap.begin), the
    sandbox's vmd captures the guest into it (vm.snapshot: a running guest is paused only
    while its memory and disk are captured), and snapshotd checks the files and marks
    the record ready or failed (snap.finish). Any failure on the way ends in snap.finish
    with the reason, so a save is never left saving by the broker; a snapshotd that dies
    in the middle fails its saving records when it starts again.

    Automatic snapshots: every stop keeps one (kind automatic) through the same save,
    and the previous one of that sandbox goes; delete_sandbox removes them all (never
    the user's, nor one that something stands on).

    snapshot.delete asks snapshotd which sandboxes were made from the snapshot and
    refuses with conflict while one of them is not deleted (its disk stands on the
    snapshot's), naming it. snapshot.list and snapshot.get are routed to snapshotd (an operator's
   account named by email resolved first).

    Several hosts: a save goes to the snapshotd of the sandbox's host (the files are
    written there), the catalog is the cluster's, and a sandbox made from a snapshot goes
    to a host that keeps a whole copy (brk_replica makes the second).
*/
#ifndef BRK_SNAPSHOT_H_INCLUDED
#define BRK_SNAPSHOT_H_INCLUDED

#include "brk_ctx.h"

//  sandbox.create with a snapshot_id: snapshotd checks the snapshot is the account's and
//  ready and records the new sandbox as standing on it (snap.use), then the sandbox is
//  created from its files (brk_sandbox_create_from). The error reply at once, or NULL.
sbx_msg_t *brk_snapshot_create (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  snapshot.save and snapshot.delete: the error reply at once, or NULL (answered later
//  through ctx->send).
sbx_msg_t *brk_snapshot_save (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);
sbx_msg_t *brk_snapshot_delete (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  snapshot.list from an operator naming an account (by id or email, as `sbx snapshot
//  list --account` does): the caller's account becomes its id, which snapshotd
//  filters on. NULL when the request may go on to snapshotd, else the error reply.
sbx_msg_t *brk_snapshot_list_account (brk_ctx_t *ctx, sbx_msg_t *request);

//  The snapshotd that keeps the files of a save on vmd: the one of the same host (its
//  instance name) when it is connected, else NULL (any: one machine, where they share
//  the data directory). A save's snap.begin and snap.finish go there.
const char *brk_snapshot_store_of (brk_ctx_t *ctx, const char *vmd);

//  A sandbox just stopped: keep an automatic snapshot of it (its memory state and disk,
//  saved as a user's would be, nobody waiting), then remove its older automatic ones.
void brk_snapshot_automatic (brk_ctx_t *ctx, const brk_sandbox_t *sandbox);

//  A sandbox was deleted: its automatic snapshots go (best effort: a snapshotd that is
//  not connected keeps them).
void brk_snapshot_release (brk_ctx_t *ctx, const char *sandbox_id);

//  Follows sandboxes through the event log (brk_events_listen): a sandbox.changed to
//  stopped keeps an automatic snapshot, one to deleted releases them. The sandbox code
//  never calls here for it. 0 or -1.
int brk_snapshot_start (brk_ctx_t *ctx);

#endif
