/*  brk_registry - the workers connected to the broker now.

    A worker is known by its ZeroMQ routing id from its hello until it says bye or stays
    silent for three heartbeat periods. One (role, instance) pair has one entry: a hello
    from a new connection with the same pair replaces the old one at once (a worker
    restarted after kill -9, whose old connection is dead but not yet expired).

    The replaced entry is kept aside, "displaced", for as long as it would have stayed
    registered (until three heartbeat periods of silence; at most
    BRK_REGISTRY_DISPLACED_MAX of them). If its connection speaks again, its worker is
    alive: two workers share one name. brk_registry_revive then puts the first one back
    and hands over the newcomer, to be refused.
*/
#ifndef BRK_REGISTRY_H_INCLUDED
#define BRK_REGISTRY_H_INCLUDED

#include "sbx_common.h"

typedef struct {
    char *routing_id;  //  hex of the routing id frame
    zframe_t *address; //  the routing id frame itself, to send to
    sbx_role_t role;
    char *instance;
    uint64_t pid;
    char *process; //  its hello's random process id, or NULL (an older worker)
    uint64_t capacity;
    uint64_t used;
    uint64_t joined_ms;    //  wall clock
    uint64_t last_seen_ms; //  wall clock
    uint64_t last_seen_mono;
    uint64_t routed; //  requests routed to it, for round-robin fairness
    char *metrics;   //  its latest metrics (heartbeat), sample lines, or NULL
    char *relay;     //  a vmd's relay for published ports (its hello), or NULL
} brk_peer_t;

typedef struct brk_registry_t brk_registry_t;

//  How many displaced workers are remembered; beyond, the oldest are forgotten.
#define BRK_REGISTRY_DISPLACED_MAX 64

brk_registry_t *brk_registry_new (void);
void brk_registry_destroy (brk_registry_t **self_p);

//  Registers (or refreshes) the worker behind `address`. Sets *replaced to the entry
//  it replaced (same role and instance, other connection; caller destroys with
//  brk_peer_destroy) or NULL; the registry remembers that one as displaced, unless it
//  gave the same process id (that worker, reconnected: what its old connection still
//  says is stale). Returns the entry, owned by the registry.
brk_peer_t *brk_registry_hello (brk_registry_t *self, zframe_t *address, sbx_role_t role,
                                const char *instance, uint64_t pid, const char *process,
                                uint64_t capacity, uint64_t used, brk_peer_t **replaced);

//  The worker behind a routing id, or NULL. Marks it seen when found.
brk_peer_t *brk_registry_seen (brk_registry_t *self, zframe_t *address);

//  For a message from an `address` that is not registered: when a hello displaced it,
//  its worker is alive and was there first. Registers it again (seen now) and returns
//  it, owned by the registry; sets *refused to the worker that holds its role and
//  instance now (caller refuses it and destroys it with brk_peer_destroy), or NULL when
//  none does. Returns NULL and sets *refused NULL when `address` was not displaced.
brk_peer_t *brk_registry_revive (brk_registry_t *self, zframe_t *address, brk_peer_t **refused);

//  Whether brk_registry_revive refused the worker behind `address` (one of the latest
//  BRK_REGISTRY_DISPLACED_MAX): its hellos sent before it heard so are refused at once,
//  or they would take the name from the worker that holds it until it speaks again.
bool brk_registry_refused (brk_registry_t *self, zframe_t *address);

//  Removes the worker and returns it (caller destroys), or NULL.
brk_peer_t *brk_registry_remove (brk_registry_t *self, zframe_t *address);

//  Removes and returns one worker silent since before `mono_cutoff`, or NULL. Forgets
//  the displaced workers silent since before then too (their restart is taken).
brk_peer_t *brk_registry_expire_one (brk_registry_t *self, uint64_t mono_cutoff);

//  Picks a worker of `role` (a given instance when not NULL): the least loaded one,
//  then the one routed to least. Returns NULL when none is connected.
brk_peer_t *brk_registry_pick (brk_registry_t *self, sbx_role_t role, const char *instance);

//  The worker of `role` named `instance`, or NULL; nothing counted (brk_registry_pick
//  counts what it picks).
brk_peer_t *brk_registry_find (brk_registry_t *self, sbx_role_t role, const char *instance);

//  Iteration over every worker, in no particular order.
brk_peer_t *brk_registry_first (brk_registry_t *self);
brk_peer_t *brk_registry_next (brk_registry_t *self);
size_t brk_registry_size (brk_registry_t *self);

void brk_peer_destroy (brk_peer_t **self_p);

void brk_registry_test (bool verbose);

#endif
