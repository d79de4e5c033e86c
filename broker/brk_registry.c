/*  brk_registry - see brk_registry.h */
#include "brk_registry.h"

#include <assert.h>

struct brk_registry_t {
    zhashx_t *peers;     //  routing id hex → brk_peer_t
    zlistx_t *displaced; //  copies of workers replaced from another connection, oldest first
    zlistx_t *refused;   //  routing ids (hex) of newcomers refused a name, oldest first
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
    free (self->process);
    free (self->metrics);
    free (self->relay);
    free (self);
    *self_p = NULL;
}

static void s_peer_free (void **item)
{
    brk_peer_destroy ((brk_peer_t **) item);
}

//  A copy of a worker's entry, to remember it once it is replaced. NULL when out of memory.
static brk_peer_t *s_peer_dup (const brk_peer_t *peer)
{
    brk_peer_t *copy = malloc (sizeof *copy);
    if (!copy)
        return NULL;
    *copy = *peer;
    copy->address = zframe_dup (peer->address);
    copy->routing_id = strdup (peer->routing_id);
    copy->instance = strdup (peer->instance);
    copy->process = peer->process ? strdup (peer->process) : NULL;
    copy->metrics = NULL; //  a displaced worker's figures are not served
    copy->relay = peer->relay ? strdup (peer->relay) : NULL;
    if (!copy->address || !copy->routing_id || !copy->instance ||
        (peer->process && !copy->process) || (peer->relay && !copy->relay))
        brk_peer_destroy (&copy);
    return copy;
}

brk_registry_t *brk_registry_new (void)
{
    brk_registry_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peers = zhashx_new ();
    self->displaced = zlistx_new ();
    self->refused = zlistx_new ();
    if (!self->peers || !self->displaced || !self->refused) {
        brk_registry_destroy (&self);
        return NULL;
    }
    //  No destructor: entries leave the table by remove/expire and their caller owns them.
    //  The displaced copies are the registry's own.
    zlistx_set_destructor (self->displaced, s_peer_free);
    zlistx_set_destructor (self->refused, (zlistx_destructor_fn *) zstr_free);
    return self;
}

void brk_registry_destroy (brk_registry_t **self_p)
{
    assert (self_p);
    brk_registry_t *self = *self_p;
    if (!self)
        return;
    brk_peer_t *peer;
    while (self->peers && (peer = zhashx_first (self->peers))) {
        zhashx_delete (self->peers, peer->routing_id);
        brk_peer_destroy (&peer);
    }
    zhashx_destroy (&self->peers);
    zlistx_destroy (&self->displaced);
    zlistx_destroy (&self->refused);
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

//  Forgets the displaced entries of connection `key`, of `like`'s role and instance, or
//  silent since before `mono_cutoff` (a criterion given as NULL or 0 matches none).
static void s_forget (brk_registry_t *self, const char *key, const brk_peer_t *like,
                      uint64_t mono_cutoff)
{
    brk_peer_t *p = zlistx_first (self->displaced);
    while (p) {
        bool match = (key && streq (p->routing_id, key)) ||
                     (like && p->role == like->role && streq (p->instance, like->instance)) ||
                     p->last_seen_mono < mono_cutoff;
        void *handle = zlistx_cursor (self->displaced);
        p = zlistx_next (self->displaced);
        if (match)
            zlistx_delete (self->displaced, handle);
    }
}

//  Remembers a copy of a worker a hello from another connection replaced, in case its
//  connection speaks again. Best effort: out of memory, the restart is taken as before.
static void s_displace (brk_registry_t *self, const brk_peer_t *peer)
{
    brk_peer_t *copy = s_peer_dup (peer);
    if (!copy || !zlistx_add_end (self->displaced, copy)) {
        brk_peer_destroy (&copy);
        return;
    }
    while (zlistx_size (self->displaced) > BRK_REGISTRY_DISPLACED_MAX) {
        brk_peer_t *oldest = zlistx_detach (self->displaced, NULL);
        brk_peer_destroy (&oldest);
    }
}

brk_peer_t *brk_registry_hello (brk_registry_t *self, zframe_t *address, sbx_role_t role,
                                const char *instance, uint64_t pid, const char *process,
                                uint64_t capacity, uint64_t used, brk_peer_t **replaced)
{
    *replaced = NULL;
    brk_peer_t *peer = brk_registry_seen (self, address);
    if (peer && (peer->role != role || strcmp (peer->instance, instance))) {
        //  Same connection, new identity: treat it as a new worker.
        *replaced = brk_registry_remove (self, address);
        peer = NULL;
    }
    if (!peer) {
        //  A restarted worker reconnects with a new routing id: its old entry goes at
        //  once, and is remembered in case it was no restart but a second live worker.
        for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers))
            if (p->role == role && strcmp (p->instance, instance) == 0) {
                brk_peer_t *old = p;
                zhashx_delete (self->peers, old->routing_id);
                //  The same process on a new connection is no second worker.
                if (!(process && *process && old->process && streq (old->process, process)))
                    s_displace (self, old);
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
        s_forget (self, peer->routing_id, NULL, 0);
    }
    peer->pid = pid;
    if (process && *process && !(peer->process && streq (peer->process, process))) {
        free (peer->process);
        peer->process = strdup (process); //  (out of memory: NULL, as an older worker's)
    }
    peer->capacity = capacity;
    peer->used = used;
    return peer;
}

brk_peer_t *brk_registry_revive (brk_registry_t *self, zframe_t *address, brk_peer_t **refused)
{
    *refused = NULL;
    char *key = zframe_strhex (address);
    brk_peer_t *peer = NULL;
    for (brk_peer_t *p = zlistx_first (self->displaced); key && p;
         p = zlistx_next (self->displaced))
        if (streq (p->routing_id, key)) {
            peer = zlistx_detach_cur (self->displaced);
            break;
        }
    free (key);
    if (!peer)
        return NULL;
    for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers))
        if (p->role == peer->role && streq (p->instance, peer->instance)) {
            zhashx_delete (self->peers, p->routing_id);
            *refused = p;
            break;
        }
    //  The newcomer's hellos sent before it heard of its refusal must not take the name
    //  again: remembered (the latest BRK_REGISTRY_DISPLACED_MAX), see brk_registry_refused.
    char *refused_id = *refused ? strdup ((*refused)->routing_id) : NULL;
    if (refused_id && zlistx_add_end (self->refused, refused_id))
        while (zlistx_size (self->refused) > BRK_REGISTRY_DISPLACED_MAX)
            zlistx_delete (self->refused, NULL); //  the oldest
    else
        free (refused_id);
    //  Others displaced under this name came after it: only the first may come back.
    s_forget (self, NULL, peer, 0);
    peer->last_seen_ms = sbx_clock_now_ms ();
    peer->last_seen_mono = sbx_clock_mono_ms ();
    zhashx_insert (self->peers, peer->routing_id, peer);
    return peer;
}

bool brk_registry_refused (brk_registry_t *self, zframe_t *address)
{
    char *key = zframe_strhex (address);
    bool found = false;
    for (char *id = zlistx_first (self->refused); key && id && !found;
         id = zlistx_next (self->refused))
        found = streq (id, key);
    free (key);
    return found;
}

brk_peer_t *brk_registry_expire_one (brk_registry_t *self, uint64_t mono_cutoff)
{
    s_forget (self, NULL, NULL, mono_cutoff);
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

brk_peer_t *brk_registry_find (brk_registry_t *self, sbx_role_t role, const char *instance)
{
    for (brk_peer_t *p = zhashx_first (self->peers); p; p = zhashx_next (self->peers))
        if (p->role == role && instance && streq (p->instance, instance))
            return p;
    return NULL;
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
    brk_peer_t *pa =
        brk_registry_hello (registry, a, SBX_ROLE_VMD, "host-a", 1, NULL, 8, 3, &replaced);
    assert (pa && !replaced);
    brk_peer_t *pb =
        brk_registry_hello (registry, b, SBX_ROLE_VMD, "host-b", 2, NULL, 8, 1, &replaced);
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
    //  host-a restarts and comes back on connection c: its old entry is replaced at once.
    brk_peer_t *pc =
        brk_registry_hello (registry, c, SBX_ROLE_VMD, "host-a", 9, NULL, 8, 0, &replaced);
    assert (pc && replaced && replaced->pid == 1);
    brk_peer_destroy (&replaced);
    assert (brk_registry_size (registry) == 2);
    assert (brk_registry_seen (registry, a) == NULL);
    assert (brk_registry_seen (registry, c) == pc);
    assert (brk_registry_pick (registry, SBX_ROLE_VMD, "host-a") == pc);
    //  a stays remembered while it could still speak; a restart's old connection never
    //  does, and after three silent periods it is forgotten (expiry below).
    assert (zlistx_size (registry->displaced) == 1);
    //  Expiry takes the silent one only, and forgets a, silent as long.
    pb->last_seen_mono = 0;
    ((brk_peer_t *) zlistx_first (registry->displaced))->last_seen_mono = 0;
    brk_peer_t *gone = brk_registry_expire_one (registry, 1);
    assert (gone == pb);
    brk_peer_destroy (&gone);
    assert (brk_registry_expire_one (registry, 1) == NULL);
    assert (zlistx_size (registry->displaced) == 0);
    assert (brk_registry_revive (registry, a, &replaced) == NULL && !replaced);
    assert (brk_registry_seen (registry, c) == pc);

    //  Two live gateways named gw: d was there, e says hello and takes the name, then d
    //  speaks again. d is registered again as it was; e is handed over to be refused.
    zframe_t *d = zframe_new ("\x00\x04", 2);
    zframe_t *e = zframe_new ("\x00\x05", 2);
    brk_peer_t *pd =
        brk_registry_hello (registry, d, SBX_ROLE_GATEWAY, "gw", 10, NULL, 0, 0, &replaced);
    assert (pd && !replaced);
    uint64_t d_joined = pd->joined_ms;
    brk_peer_t *pe =
        brk_registry_hello (registry, e, SBX_ROLE_GATEWAY, "gw", 11, NULL, 0, 0, &replaced);
    assert (pe && replaced && replaced->pid == 10);
    brk_peer_destroy (&replaced);
    assert (brk_registry_seen (registry, d) == NULL);
    brk_peer_t *refused;
    pd = brk_registry_revive (registry, d, &refused);
    assert (pd && pd->pid == 10 && pd->joined_ms == d_joined);
    assert (refused && refused->pid == 11 && zframe_eq (refused->address, e));
    brk_peer_destroy (&refused);
    assert (brk_registry_seen (registry, d) == pd);
    assert (brk_registry_seen (registry, e) == NULL);
    assert (brk_registry_pick (registry, SBX_ROLE_GATEWAY, "gw") == pd);
    //  e is remembered as refused (the server refuses its later hellos at once); d not.
    assert (brk_registry_refused (registry, e) && !brk_registry_refused (registry, d));
    //  Once back, d is no longer displaced; e, refused, never was.
    assert (brk_registry_revive (registry, d, &refused) == NULL && !refused);
    assert (brk_registry_revive (registry, e, &refused) == NULL && !refused);

    //  Two newcomers in a row: only the first of the three comes back.
    zframe_t *f = zframe_new ("\x00\x06", 2);
    assert (brk_registry_hello (registry, e, SBX_ROLE_GATEWAY, "gw", 11, NULL, 0, 0, &replaced));
    brk_peer_destroy (&replaced);
    assert (brk_registry_hello (registry, f, SBX_ROLE_GATEWAY, "gw", 12, NULL, 0, 0, &replaced));
    assert (replaced && replaced->pid == 11);
    brk_peer_destroy (&replaced);
    pd = brk_registry_revive (registry, d, &refused);
    assert (pd && pd->pid == 10 && refused && refused->pid == 12);
    brk_peer_destroy (&refused);
    assert (brk_registry_revive (registry, e, &refused) == NULL && !refused);
    assert (zlistx_size (registry->displaced) == 0);
    brk_peer_t *removed = brk_registry_remove (registry, d);
    assert (removed == pd);
    brk_peer_destroy (&removed);

    //  One process on a new connection (it said hello again when the broker seemed
    //  silent): the old connection is not displaced, so its late words take nothing back.
    zframe_t *g = zframe_new ("\x00\x07", 2), *h = zframe_new ("\x00\x08", 2);
    brk_peer_t *pg =
        brk_registry_hello (registry, g, SBX_ROLE_VMD, "host-g", 20, "prc_one", 8, 0, &replaced);
    assert (pg && !replaced && streq (pg->process, "prc_one"));
    pg->relay = strdup ("10.0.0.7:9443");
    brk_peer_t *ph =
        brk_registry_hello (registry, h, SBX_ROLE_VMD, "host-g", 20, "prc_one", 8, 0, &replaced);
    assert (ph && replaced && replaced->pid == 20);
    brk_peer_destroy (&replaced);
    assert (zlistx_size (registry->displaced) == 0);
    assert (brk_registry_revive (registry, g, &refused) == NULL && !refused);
    assert (brk_registry_seen (registry, h) == ph);
    //  Another process under that name is displaced as before (its copy has its own relay).
    ph->relay = strdup ("10.0.0.8:9443");
    assert (
        brk_registry_hello (registry, g, SBX_ROLE_VMD, "host-g", 21, "prc_two", 8, 0, &replaced));
    assert (replaced && replaced->pid == 20);
    brk_peer_destroy (&replaced);
    assert (zlistx_size (registry->displaced) == 1);
    removed = brk_registry_remove (registry, g);
    assert (removed && streq (removed->process, "prc_two"));
    brk_peer_destroy (&removed);
    s_forget (registry, NULL, NULL, UINT64_MAX);
    assert (zlistx_size (registry->displaced) == 0);
    zframe_destroy (&g);
    zframe_destroy (&h);

    //  Bounded: a name taken by connection after connection remembers the latest ones.
    zframe_t *churn = NULL;
    for (uint8_t i = 0; i <= BRK_REGISTRY_DISPLACED_MAX + 1; i++) {
        zframe_destroy (&churn);
        churn = zframe_new ((uint8_t[]){0x01, i}, 2);
        assert (brk_registry_hello (registry, churn, SBX_ROLE_GATEWAY, "gw", 100 + i, NULL, 0, 0,
                                    &replaced));
        assert (i == 0 ? !replaced : replaced && replaced->pid == 100u + i - 1);
        brk_peer_destroy (&replaced);
    }
    assert (zlistx_size (registry->displaced) == BRK_REGISTRY_DISPLACED_MAX);
    zframe_t *oldest = zframe_new ((uint8_t[]){0x01, 0}, 2);
    zframe_t *kept = zframe_new ((uint8_t[]){0x01, 1}, 2);
    assert (brk_registry_revive (registry, oldest, &refused) == NULL && !refused);
    brk_peer_t *back = brk_registry_revive (registry, kept, &refused);
    assert (back && back->pid == 101 && refused && zframe_eq (refused->address, churn));
    brk_peer_destroy (&refused);
    removed = brk_registry_remove (registry, kept);
    assert (removed == back);
    brk_peer_destroy (&removed);
    zframe_destroy (&oldest);
    zframe_destroy (&kept);
    zframe_destroy (&churn);
    zframe_destroy (&d);
    zframe_destroy (&e);
    zframe_destroy (&f);
    removed = brk_registry_remove (registry, c);
    assert (removed == pc);
    brk_peer_destroy (&removed);
    assert (brk_registry_size (registry) == 0);
    zframe_destroy (&a);
    zframe_destroy (&b);
    zframe_destroy (&c);
    brk_registry_destroy (&registry);
    assert (registry == NULL);
}
