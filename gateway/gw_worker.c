/*  gw_worker - see gw_worker.h */
#include "gw_worker.h"
#include "sbx_idmap.h"

#include <assert.h>

//  Freed by hand, not by the table: the answer's callback runs after its entry is gone.
typedef struct {
    gw_worker_fn *fn;
    max_align_t context[]; //  aligned for whatever struct the caller copies in
} s_pending_t;

struct gw_worker_t {
    zloop_t *loop;
    zactor_t *actor;
    zhashx_t *pending; //  handle → s_pending_t
    uint64_t next_handle;
};

typedef struct {
    gw_worker_work_fn *work;
    void *state;
    gw_worker_free_fn *state_free;
} s_thread_args_t;

//  The thread: [handle, request...] in, [handle, answer...] out, until $TERM.
static void s_thread (zsock_t *pipe, void *arg)
{
    s_thread_args_t *args = arg;
    zsock_signal (pipe, 0);
    while (true) {
        zmsg_t *msg = zmsg_recv (pipe);
        if (!msg)
            break;
        char *handle = zmsg_popstr (msg);
        if (!handle || streq (handle, "$TERM")) {
            zstr_free (&handle);
            zmsg_destroy (&msg);
            break;
        }
        zmsg_t *answer = args->work (msg, args->state);
        if (!answer)
            answer = zmsg_new ();
        zmsg_pushstr (answer, handle);
        zmsg_send (&answer, pipe);
        zmsg_destroy (&answer); //  left only when it could not be sent
        zstr_free (&handle);
        zmsg_destroy (&msg);
    }
    if (args->state_free)
        args->state_free (args->state);
    free (args);
}

static int s_on_answer (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    gw_worker_t *self = arg;
    zmsg_t *answer = zmsg_recv (sock);
    char *handle = answer ? zmsg_popstr (answer) : NULL;
    uint64_t h = handle ? strtoull (handle, NULL, 10) : 0;
    s_pending_t *p = h ? zhashx_lookup (self->pending, (void *) (uintptr_t) h) : NULL;
    if (p) {
        //  Forgotten before the call: the callback may start or cancel other requests.
        zhashx_delete (self->pending, (void *) (uintptr_t) h);
        p->fn (answer, p->context);
        free (p);
    }
    zstr_free (&handle);
    zmsg_destroy (&answer);
    return 0;
}

gw_worker_t *gw_worker_new (zloop_t *loop, gw_worker_work_fn *work, void *state,
                            gw_worker_free_fn *state_free)
{
    gw_worker_t *self = calloc (1, sizeof *self);
    s_thread_args_t *args = calloc (1, sizeof *args);
    if (!self || !args) {
        free (self);
        free (args);
        if (state_free)
            state_free (state);
        return NULL;
    }
    *args = (s_thread_args_t){work, state, state_free};
    self->loop = loop;
    self->next_handle = 1;
    self->pending = sbx_idmap_new ();
    self->actor = zactor_new (s_thread, args); //  the thread owns args from here
    if (!self->pending || !self->actor ||
        zloop_reader (loop, (zsock_t *) zactor_sock (self->actor), s_on_answer, self)) {
        gw_worker_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_worker_destroy (gw_worker_t **self_p)
{
    assert (self_p);
    gw_worker_t *self = *self_p;
    if (!self)
        return;
    if (self->actor) {
        zloop_reader_end (self->loop, (zsock_t *) zactor_sock (self->actor));
        zactor_destroy (&self->actor);
    }
    if (self->pending)
        for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
            free (p);
    zhashx_destroy (&self->pending);
    free (self);
    *self_p = NULL;
}

uint64_t gw_worker_start (gw_worker_t *self, zmsg_t **request_p, gw_worker_fn *fn,
                          const void *context, size_t context_size)
{
    assert (request_p);
    s_pending_t *p = calloc (1, sizeof *p + context_size);
    if (!p || !*request_p) {
        free (p);
        zmsg_destroy (request_p);
        return 0;
    }
    p->fn = fn;
    if (context_size)
        memcpy (p->context, context, context_size);
    uint64_t handle = self->next_handle++;
    char text[24];
    snprintf (text, sizeof text, "%llu", (unsigned long long) handle);
    zmsg_pushstr (*request_p, text);
    zhashx_insert (self->pending, (void *) (uintptr_t) handle, p);
    if (zmsg_send (request_p, self->actor)) {
        zmsg_destroy (request_p);
        zhashx_delete (self->pending, (void *) (uintptr_t) handle);
        free (p);
        return 0;
    }
    return handle;
}

void gw_worker_cancel (gw_worker_t *self, uint64_t handle)
{
    s_pending_t *p =
        self && handle ? zhashx_lookup (self->pending, (void *) (uintptr_t) handle) : NULL;
    if (p) {
        zhashx_delete (self->pending, (void *) (uintptr_t) handle);
        free (p);
    }
}

//  --------------------------------------------------------------------------
//  Self test: work runs off the loop in order, answers come back with their context,
//  cancelled requests never call back.

static zmsg_t *s_double (zmsg_t *request, void *state)
{
    int *calls = state; //  the thread's own: only it touches it
    (*calls)++;
    char *number = zmsg_popstr (request);
    zmsg_t *answer = zmsg_new ();
    zmsg_addstrf (answer, "%d", number ? 2 * atoi (number) : -1);
    zstr_free (&number);
    return answer;
}

typedef struct {
    int answers;
    int ticks;
    int sum;
} s_probe_t;

typedef struct {
    s_probe_t *probe;
    int weight;
} s_context_t;

static void s_on_double (zmsg_t *answer, void *context)
{
    s_context_t *c = context;
    char *number = zmsg_popstr (answer);
    c->probe->answers++;
    c->probe->sum += c->weight * (number ? atoi (number) : 0);
    zstr_free (&number);
}

//  Ends the loop once three answers came, or after 10 s (a bound, not a wait).
static int s_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_probe_t *probe = arg;
    return probe->answers == 3 || ++probe->ticks > 2000 ? -1 : 0;
}

void gw_worker_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    int *calls = calloc (1, sizeof *calls);
    gw_worker_t *worker = gw_worker_new (loop, s_double, calls, free);
    assert (worker);
    s_probe_t probe = {0};
    uint64_t handles[4];
    for (int i = 0; i < 4; i++) {
        zmsg_t *request = zmsg_new ();
        zmsg_addstrf (request, "%d", i + 1);
        s_context_t context = {&probe, i == 3 ? 1000 : 1};
        handles[i] = gw_worker_start (worker, &request, s_on_double, &context, sizeof context);
        assert (handles[i] && !request);
    }
    gw_worker_cancel (worker, handles[3]); //  never answered: 1000 × 8 stays out
    gw_worker_cancel (worker, 0);
    int timer = zloop_timer (loop, 5, 0, s_tick, &probe);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (probe.answers == 3 && probe.sum == 2 + 4 + 6);
    //  No request, no handle.
    zmsg_t *none = NULL;
    assert (gw_worker_start (worker, &none, s_on_double, NULL, 0) == 0);
    gw_worker_destroy (&worker);
    gw_worker_destroy (&worker);
    zloop_destroy (&loop);
}
