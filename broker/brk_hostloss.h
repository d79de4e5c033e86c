/*  brk_hostloss - vmd hosts that went silent, and came back.

    A vmd whose host stops answering leaves the registry after three heartbeats; its
    guests may be running still, or gone with the host. Once it has been away for
    vmd.lost_after_ms (default 30 s; 0: never), its ready and stopped sandboxes go to
    error with reason "host lost: …" (brk_sandbox_host_lost), their events saying when
    its last heartbeat was, where billing ends their running time. A vmd this broker has
    not seen since it started (a new leader after a failover) counts from that start.

    When a vmd connects (each new connection, once) while it has lost sandboxes, or ones
    deleted while it was lost, it is asked what it has (vm.list):
    each lost sandbox follows its guest back to ready or stopped, or stays in error
    saying the host came back without it (brk_sandbox_host_back); a guest whose sandbox
    was deleted meanwhile is deleted there (vm.delete).
*/
#ifndef BRK_HOSTLOSS_H_INCLUDED
#define BRK_HOSTLOSS_H_INCLUDED

#include "brk_ctx.h"

typedef struct _brk_hostloss_t brk_hostloss_t;

brk_hostloss_t *brk_hostloss_new (brk_ctx_t *ctx);
void brk_hostloss_destroy (brk_hostloss_t **self_p);

//  From the loop, every second.
void brk_hostloss_tick (brk_hostloss_t *self);

void brk_hostloss_test (bool verbose);

#endif
