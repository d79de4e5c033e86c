/*  brk_pending - see brk_pending.h */
#include "brk_pending.h"
#include "sbx_idmap.h"

#include <assert.h>

struct brk_pending_t {
    zhashx_t *requests; //  rid (as key pointer) → brk_request_t
    uint64_t next_rid;
};

void brk_request_destroy (brk_request_t **self_p)
{
    assert (self_p);
    brk_request_t *self = *self_p;
    if (!self)
        return;
    zframe_destroy (&self->client);
    free (self->worker);
    free (self->what);
    free (self);
    *self_p = NULL;
}

brk_pending_t *brk_pending_new (void)
{
    brk_pending_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->requests = sbx_idmap_new ();
    if (!self->requests) {
        free (self);
        return NULL;
    }
    self->next_rid = 1;
    return self;
}

void brk_pending_destroy (brk_pending_t **self_p)
{
    assert (self_p);
    brk_pending_t *self = *self_p;
    if (!self)
        return;
    brk_request_t *request;
    while ((request = zhashx_first (self->requests))) {
        zhashx_delete (self->requests, (void *) (uintptr_t) request->rid);
        brk_request_destroy (&request);
    }
    zhashx_destroy (&self->requests);
    free (self);
    *self_p = NULL;
}

uint64_t brk_pending_add (brk_pending_t *self, zframe_t *client, uint64_t client_rid,
                          const char *worker, const char *what, uint64_t deadline)
{
    brk_request_t *request = calloc (1, sizeof *request);
    if (!request)
        return 0;
    request->rid = self->next_rid++;
    request->client_rid = client_rid;
    request->client = zframe_dup (client);
    request->worker = strdup (worker);
    request->what = strdup (what);
    request->deadline = deadline;
    if (!request->client || !request->worker || !request->what) {
        brk_request_destroy (&request);
        return 0;
    }
    zhashx_insert (self->requests, (void *) (uintptr_t) request->rid, request);
    return request->rid;
}

uint64_t brk_pending_add_call (brk_pending_t *self, const char *worker, const char *what,
                               uint64_t deadline, brk_pending_fn *fn, void *arg)
{
    brk_request_t *request = calloc (1, sizeof *request);
    if (!request)
        return 0;
    request->rid = self->next_rid++;
    request->worker = strdup (worker);
    request->what = strdup (what);
    request->deadline = deadline;
    request->fn = fn;
    request->arg = arg;
    if (!request->worker || !request->what) {
        brk_request_destroy (&request);
        return 0;
    }
    zhashx_insert (self->requests, (void *) (uintptr_t) request->rid, request);
    return request->rid;
}

static brk_request_t *s_take (brk_pending_t *self, brk_request_t *request)
{
    zhashx_delete (self->requests, (void *) (uintptr_t) request->rid);
    return request;
}

brk_request_t *brk_pending_take (brk_pending_t *self, uint64_t rid, const char *worker)
{
    brk_request_t *request = zhashx_lookup (self->requests, (void *) (uintptr_t) rid);
    if (!request || strcmp (request->worker, worker))
        return NULL;
    return s_take (self, request);
}

brk_request_t *brk_pending_take_expired (brk_pending_t *self, uint64_t now)
{
    for (brk_request_t *r = zhashx_first (self->requests); r; r = zhashx_next (self->requests))
        if (r->deadline <= now)
            return s_take (self, r);
    return NULL;
}

brk_request_t *brk_pending_take_worker (brk_pending_t *self, const char *worker)
{
    for (brk_request_t *r = zhashx_first (self->requests); r; r = zhashx_next (self->requests))
        if (strcmp (r->worker, worker) == 0)
            return s_take (self, r);
    return NULL;
}

void brk_pending_postpone (brk_pending_t *self, uint64_t ms)
{
    for (brk_request_t *r = zhashx_first (self->requests); r; r = zhashx_next (self->requests))
        r->deadline += ms;
}

size_t brk_pending_size (brk_pending_t *self)
{
    return zhashx_size (self->requests);
}

void brk_pending_test (bool verbose)
{
    (void) verbose;
    brk_pending_t *pending = brk_pending_new ();
    zframe_t *client = zframe_new ("\x00\x07", 2);
    uint64_t r1 = brk_pending_add (pending, client, 5, "w1", "sys.status to vmd a", 1000);
    uint64_t r2 = brk_pending_add (pending, client, 5, "w2", "sys.status to vmd b", 2000);
    uint64_t r3 = brk_pending_add (pending, client, 6, "w1", "sys.status to vmd a", 3000);
    assert (r1 && r2 && r3 && r1 != r2 && r2 != r3);
    assert (brk_pending_size (pending) == 3);
    //  A reply from the wrong worker matches nothing.
    assert (brk_pending_take (pending, r1, "w2") == NULL);
    brk_request_t *request = brk_pending_take (pending, r1, "w1");
    assert (request && request->client_rid == 5 && zframe_eq (request->client, client));
    brk_request_destroy (&request);
    assert (brk_pending_take (pending, r1, "w1") == NULL); //  only once
    //  Deadlines, later by what a stall of the broker took.
    assert (brk_pending_take_expired (pending, 1500) == NULL);
    brk_pending_postpone (pending, 1000);
    assert (brk_pending_take_expired (pending, 2500) == NULL);
    request = brk_pending_take_expired (pending, 3500);
    assert (request && request->rid == r2);
    brk_request_destroy (&request);
    //  Losing a worker.
    request = brk_pending_take_worker (pending, "w1");
    assert (request && request->rid == r3);
    brk_request_destroy (&request);
    assert (brk_pending_size (pending) == 0);
    //  The broker's own requests carry a callback and no client.
    uint64_t r4 = brk_pending_add_call (pending, "w4", "vm.create to vmd a", 10, NULL, pending);
    request = brk_pending_take (pending, r4, "w4");
    assert (request && !request->client && request->arg == pending);
    brk_request_destroy (&request);
    //  Destroy with requests left frees them.
    brk_pending_add (pending, client, 9, "w3", "x", 1);
    zframe_destroy (&client);
    brk_pending_destroy (&pending);
    assert (pending == NULL);
}
