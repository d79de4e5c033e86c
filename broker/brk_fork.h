/*  brk_fork - fork_sandbox: running copies of a ready sandbox, with its memory
    (docs/snapshots.md, "Fork").

    One capture of the source, then count restores of it. The broker checks the caller
    may see the source and create sandboxes, that the source is ready, and that the
    account's plan (running, starts per day) and the source's vmd (its room) take count
    more; it chooses the copies' ids, and snapshotd records a snapshot of kind fork with
    the copies standing on it already (snap.begin with users). The source's vmd captures
    it live (vm.snapshot with live: the memory copied while the guest runs, the guest
    paused only for the last pages, the devices and the copy of its disk), snapshotd
    checks the files (snap.finish), and each copy is created from them on that vmd as a
    create from a snapshot is (brk_sandbox_create_copy: its own record, label and
    hostname, start and sandbox.changed events, so it is limited and billed as any
    create; vmd gives it its own MAC and fresh entropy).

    All or nothing: limits and room are checked when the fork is asked and again when
    the copies are made (in one turn of the loop, so nothing starts between the check and
    the creates); a copy that fails makes the fork fail, and the copies made are deleted
    (the error names them). The fork snapshot is never listed to users: it goes, files
    and all, with the last sandbox (or snapshot) standing on it.
*/
#ifndef BRK_FORK_H_INCLUDED
#define BRK_FORK_H_INCLUDED

#include "brk_ctx.h"

//  At most this many copies a fork.
#define BRK_FORK_MAX 10

//  sandbox.fork: the error reply at once, or NULL (answered through ctx->send once every
//  copy is ready, or the fork failed).
sbx_msg_t *brk_fork (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

#endif
