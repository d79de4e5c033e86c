/*  brk_registry - see brk_registry.h */
#include "brk_registry.h"

#include <assert.h>

struct brk_registry_t {
    zhashx_t *peers; //  routing id hex → brk_peer_t
};

void brk_peer_destroy (brk_peer_t **self_p)
{
    assert (self_p);
    brk_peer_t *self = *self_p;
    if (!self)
        return;
    zframe_destroy (&self->address);
    free (self->routing_id);
    free (self->instance);
    free (self);
    *self_p = NULL;
}

brk_registry_t *brk_registry_new (void)
{
    brk_registry_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peers = zhashx_new ();
    if (!self->peers) {
        free (self);
        return NULL;
    }
    //  No destructor: entries leave the table by remove/expire and their caller owns them.
    return self;
}

void brk_registry_destroy (brk_registry_t **self_p)
{
    assert (self_p);
    brk_registry_t *self = *self_p;
    if (!self)
        return;
    brk_peer_t *peer;
    while ((peer = zhashx_first (self->peers))) {
        zhashx_delete (self->peers, peer->routing_id);
        brk_peer_destroy (&peer);
    }
    zhashx_destroy (&self->peers);
    free (self);
    *self_p = NULL;
}

brk_peer_t *brk_registry_seen (brk_registry_t *self, zframe_t *address)
{
    char *key = zframe_strhex (address);
    brk_peer_t *peer = key ? zhashx_lookup (self->peers, key) : NULL;
    free (key);
    if (peer) {
        peer->last_seen_ms = sbx_clock_now_ms ();
        peer->last_seen_mono = sbx_clock_mono_ms ();
    }
    return peer;
}

brk_peer_t *brk_registry_remove (brk_registry_t *self, zframe_t *address)
{
    char *key = zframe_strhex (address);
    brk_peer_t *peer = key ? zhashx_lookup (self->peers, key) : NULL;
    if (peer)
        zhashx_delete (self->peers, key);
    free (key);
    return peer;
}

brk_peer_t *brk_registry_hello (brk_registry_t *self, zframe_t *address, sbx_role_t role,
                                const char *instance, uint64_t pid, uint64_t capacity,
                                uint64_t used, brk_peer_t **replaced)
{
    *replaced = NULL;
    brk_peer_t *peer = brk_registry_seen (self, address);
    if (peer && (peer->role != role || strcmp (peer->instance, instance))) {
        //  Same connection, new identity: treat it as a new worker.
        *replaced = brk_registry_remove (self, address);
        peer = NULL;
    }
    if (!peer) {
        //  A restarted worker reconnects with a new routing id: its old entry goes.
        for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers))
            if (p->role == role && strcmp (p->instance, instance) == 0) {
                brk_peer_t *old = p;
                zhashx_delete (self->peers, old->routing_id);
                if (*replaced)
                    brk_peer_destroy (&old);
                else
                    *replaced = old;
                break;
            }
        peer = calloc (1, sizeof *peer);
        if (!peer)
            return NULL;
        peer->address = zframe_dup (address);
        peer->routing_id = zframe_strhex (address);
        peer->instance = strdup (instance);
        peer->role = role;
        peer->joined_ms = sbx_clock_now_ms ();
        peer->last_seen_ms = peer->joined_ms;
        peer->last_seen_mono = sbx_clock_mono_ms ();
        if (!peer->address || !peer->routing_id || !peer->instance) {
            brk_peer_destroy (&peer);
            return NULL;
        }
        zhashx_insert (self->peers, peer->routing_id, peer);
    }
    peer->pid = pid;
    peer->capacity = capacity;
    peer->used = used;
    return peer;
}

brk_peer_t *brk_registry_expire_one (brk_registry_t *self, uint64_t mono_cutoff)
{
    for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers))
        if (p->last_seen_mono < mono_cutoff) {
            zhashx_delete (self->peers, p->routing_id);
            return p;
        }
    return NULL;
}

brk_peer_t *brk_registry_pick (brk_registry_t *self, sbx_role_t role, const char *instance)
{
    brk_peer_t *best = NULL;
    for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers)) {
        if (p->role != role || (instance && strcmp (p->instance, instance)))
            continue;
        if (!best || p->used < best->used || (p->used == best->used && p->routed < best->routed))
            best = p;
    }
    if (best)
        best->routed++;
    return best;
}

brk_peer_t *brk_registry_first (brk_registry_t *self)
{
    return zhashx_first (self->peers);
}

brk_peer_t *brk_registry_next (brk_registry_t *self)
{
    return zhashx_next (self->peers);
}

size_t brk_registry_size (brk_registry_t *self)
{
    return zhashx_size (self->peers);
}

void brk_registry_test (bool verbose)
{
    (void) verbose;
    brk_registry_t *registry = brk_registry_new ();
    assert (registry);
    zframe_t *a = zframe_new ("\x00\x01", 2);
    zframe_t *b = zframe_new ("\x00\x02", 2);
    zframe_t *c = zframe_new ("\x00\x03", 2);
    brk_peer_t *replaced;
    brk_peer_t *pa = brk_registry_hello (registry, a, SBX_ROLE_VMD, "host-a", 1, 8, 3, &replaced);
    assert (pa && !replaced);
    brk_peer_t *pb = brk_registry_hello (registry, b, SBX_ROLE_VMD, "host-b", 2, 8, 1, &replaced);
    assert (pb && !replaced);
    assert (brk_registry_size (registry) == 2);
    //  Least loaded first; a named instance wins over load.
    assert (brk_registry_pick (registry, SBX_ROLE_VMD, NULL) == pb);
    assert (brk_registry_pick (registry, SBX_ROLE_VMD, "host-a") == pa);
    assert (brk_registry_pick (registry, SBX_ROLE_GATEWAY, NULL) == NULL);
    assert (brk_registry_pick (registry, SBX_ROLE_VMD, "host-z") == NULL);
    //  Equal load alternates.
    pa->used = pb->used = 0;
    brk_peer_t *first = brk_registry_pick (registry, SBX_ROLE_VMD, NULL);
    brk_peer_t *second = brk_registry_pick (registry, SBX_ROLE_VMD, NULL);
    assert (first != second);
    //  host-a restarts and comes back on connection c: its old entry is replaced.
    brk_peer_t *pc = brk_registry_hello (registry, c, SBX_ROLE_VMD, "host-a", 9, 8, 0, &replaced);
    assert (pc && replaced && replaced->pid == 1);
    brk_peer_destroy (&replaced);
    assert (brk_registry_size (registry) == 2);
    assert (brk_registry_seen (registry, a) == NULL);
    assert (brk_registry_seen (registry, c) == pc);
    //  Expiry takes the silent one only.
    pb->last_seen_mono = 0;
    brk_peer_t *gone = brk_registry_expire_one (registry, 1);
    assert (gone == pb);
    brk_peer_destroy (&gone);
    assert (brk_registry_expire_one (registry, 1) == NULL);
    brk_peer_t *removed = brk_registry_remove (registry, c);
    assert (removed == pc);
    brk_peer_destroy (&removed);
    assert (brk_registry_size (registry) == 0);
    zframe_destroy (&a);
    zframe_destroy (&b);
    zframe_destroy (&c);
    brk_registry_destroy (&registry);
    assert (registry == NULL);
}
