/*  gw_worker - see gw_worker.h */
#include "gw_worker.h"
#include "sbx_idmap.h"

#include <assert.h>

#define S_MAX_THREADS 64

//  Freed by hand, not by the table: the answer's callback runs after its entry is gone.
typedef struct {
    gw_worker_fn *fn;
    max_align_t context[]; //  aligned for whatever struct the caller copies in
} s_pending_t;

//  One thread of the pool, as the loop sees it.
typedef struct {
    gw_worker_t *worker;
    zactor_t *actor;
    bool busy; //  has a request in hand
} s_thread_t;

struct gw_worker_t {
    zloop_t *loop;
    s_thread_t threads[S_MAX_THREADS];
    size_t thread_count;
    zlistx_t *waiting; //  [handle, request...] messages no thread has taken yet, in order
    zhashx_t *pending; //  handle → s_pending_t, waiting or in hand
    uint64_t next_handle;
    void *state;
    gw_worker_free_fn *state_free;
};

typedef struct {
    gw_worker_work_fn *work;
    void *state;
} s_thread_args_t;

//  A thread: [handle, request...] in, [handle, answer...] out, until $TERM.
static void s_thread (zsock_t *pipe, void *arg)
{
    s_thread_args_t args = *(s_thread_args_t *) arg;
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
        zmsg_t *answer = args.work (msg, args.state);
        if (!answer)
            answer = zmsg_new ();
        zmsg_pushstr (answer, handle);
        zmsg_send (&answer, pipe);
        zmsg_destroy (&answer); //  left only when it could not be sent
        zstr_free (&handle);
        zmsg_destroy (&msg);
    }
}

static uint64_t s_handle_of (zmsg_t *msg)
{
    zframe_t *frame = zmsg_first (msg);
    char text[24] = "";
    if (frame && zframe_size (frame) < sizeof text)
        memcpy (text, zframe_data (frame), zframe_size (frame));
    return strtoull (text, NULL, 10);
}

//  Hands waiting requests to free threads, skipping those cancelled meanwhile.
static void s_dispatch (gw_worker_t *self)
{
    for (size_t i = 0; i < self->thread_count && zlistx_size (self->waiting); i++) {
        s_thread_t *thread = &self->threads[i];
        while (!thread->busy && zlistx_size (self->waiting)) {
            zmsg_t *msg = zlistx_detach (self->waiting, NULL);
            uint64_t handle = s_handle_of (msg);
            if (!zhashx_lookup (self->pending, (void *) (uintptr_t) handle)) {
                zmsg_destroy (&msg); //  cancelled while it waited
                continue;
            }
            if (zmsg_send (&msg, thread->actor) == 0)
                thread->busy = true;
            else {
                zmsg_destroy (&msg);
                s_pending_t *p = zhashx_lookup (self->pending, (void *) (uintptr_t) handle);
                zhashx_delete (self->pending, (void *) (uintptr_t) handle);
                free (p); //  as if cancelled: the thread's pipe is broken
            }
        }
    }
}

static int s_on_answer (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    s_thread_t *thread = arg;
    gw_worker_t *self = thread->worker;
    zmsg_t *answer = zmsg_recv (sock);
    thread->busy = false;
    char *handle = answer ? zmsg_popstr (answer) : NULL;
    uint64_t h = handle ? strtoull (handle, NULL, 10) : 0;
    s_pending_t *p = h ? zhashx_lookup (self->pending, (void *) (uintptr_t) h) : NULL;
    //  The thread is free: the next request goes to it before the callback runs.
    s_dispatch (self);
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

static void s_message_destructor (void **item)
{
    zmsg_destroy ((zmsg_t **) item);
}

gw_worker_t *gw_worker_new (zloop_t *loop, size_t threads, gw_worker_work_fn *work, void *state,
                            gw_worker_free_fn *state_free)
{
    gw_worker_t *self = threads >= 1 && threads <= S_MAX_THREADS ? calloc (1, sizeof *self) : NULL;
    if (!self) {
        if (state_free)
            state_free (state);
        return NULL;
    }
    self->loop = loop;
    self->next_handle = 1;
    self->state = state;
    self->state_free = state_free;
    self->pending = sbx_idmap_new ();
    self->waiting = zlistx_new ();
    if (!self->pending || !self->waiting) {
        gw_worker_destroy (&self);
        return NULL;
    }
    zlistx_set_destructor (self->waiting, s_message_destructor);
    //  Each thread copies the arguments before it signals, so one copy here serves all.
    s_thread_args_t args = {work, state};
    for (size_t i = 0; i < threads; i++) {
        s_thread_t *thread = &self->threads[i];
        thread->worker = self;
        thread->actor = zactor_new (s_thread, &args);
        if (!thread->actor) {
            gw_worker_destroy (&self);
            return NULL;
        }
        self->thread_count++;
        if (zloop_reader (loop, (zsock_t *) zactor_sock (thread->actor), s_on_answer, thread)) {
            gw_worker_destroy (&self);
            return NULL;
        }
    }
    return self;
}

void gw_worker_destroy (gw_worker_t **self_p)
{
    assert (self_p);
    gw_worker_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->thread_count; i++) {
        s_thread_t *thread = &self->threads[i];
        zloop_reader_end (self->loop, (zsock_t *) zactor_sock (thread->actor));
        zactor_destroy (&thread->actor); //  waits for the work in hand
    }
    if (self->pending)
        for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
            free (p);
    zhashx_destroy (&self->pending);
    zlistx_destroy (&self->waiting);
    if (self->state_free)
        self->state_free (self->state);
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
    if (!zlistx_add_end (self->waiting, *request_p)) {
        zmsg_destroy (request_p);
        free (p);
        return 0;
    }
    *request_p = NULL;
    zhashx_insert (self->pending, (void *) (uintptr_t) handle, p);
    s_dispatch (self);
    //  A pipe that failed dropped it, as if cancelled.
    return zhashx_lookup (self->pending, (void *) (uintptr_t) handle) ? handle : 0;
}

void gw_worker_cancel (gw_worker_t *self, uint64_t handle)
{
    s_pending_t *p =
        self && handle ? zhashx_lookup (self->pending, (void *) (uintptr_t) handle) : NULL;
    if (p) {
        //  A waiting request stays listed, and is dropped when its turn comes.
        zhashx_delete (self->pending, (void *) (uintptr_t) handle);
        free (p);
    }
}

size_t gw_worker_waiting (gw_worker_t *self)
{
    size_t count = 0;
    for (zmsg_t *msg = zlistx_first (self->waiting); msg; msg = zlistx_next (self->waiting))
        if (zhashx_lookup (self->pending, (void *) (uintptr_t) s_handle_of (msg)))
            count++;
    return count;
}

//  --------------------------------------------------------------------------
//  Self test: work runs off the loop in order, answers come back with their context,
//  cancelled requests never call back (and, while they wait, are never worked); with a
//  pool, a slow request does not hold up the next one.

#include <stdatomic.h>

static zmsg_t *s_double (zmsg_t *request, void *state)
{
    atomic_int *calls = state; //  shared by the pool's threads
    atomic_fetch_add (calls, 1);
    char *number = zmsg_popstr (request);
    if (number && streq (number, "slow")) {
        zclock_sleep (400); //  stands for an argon2 check
        strcpy (number, "0");
    }
    zmsg_t *answer = zmsg_new ();
    zmsg_addstrf (answer, "%d", number ? 2 * atoi (number) : -1);
    zstr_free (&number);
    return answer;
}

typedef struct {
    int answers;
    int ticks;
    int sum;
    int order[8]; //  weights, in the order answered
} s_probe_t;

typedef struct {
    s_probe_t *probe;
    int weight;
} s_context_t;

static void s_on_double (zmsg_t *answer, void *context)
{
    s_context_t *c = context;
    char *number = zmsg_popstr (answer);
    if (c->probe->answers < 8)
        c->probe->order[c->probe->answers] = c->weight;
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

static uint64_t s_send (gw_worker_t *worker, const char *text, s_probe_t *probe, int weight)
{
    zmsg_t *request = zmsg_new ();
    zmsg_addstr (request, text);
    s_context_t context = {probe, weight};
    uint64_t handle = gw_worker_start (worker, &request, s_on_double, &context, sizeof context);
    assert (handle && !request);
    return handle;
}

void gw_worker_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    atomic_int *calls = calloc (1, sizeof *calls);
    gw_worker_t *worker = gw_worker_new (loop, 1, s_double, calls, free);
    assert (worker);
    s_probe_t probe = {0};
    //  One thread: in order. A slow one first, so the others wait in the loop.
    s_send (worker, "slow", &probe, 1);
    s_send (worker, "1", &probe, 1);
    s_send (worker, "2", &probe, 10);
    uint64_t gone = s_send (worker, "4", &probe, 1000);
    assert (gw_worker_waiting (worker) == 3);
    gw_worker_cancel (worker, gone); //  never answered, never worked: 1000 × 8 stays out
    gw_worker_cancel (worker, 0);
    assert (gw_worker_waiting (worker) == 2);
    int timer = zloop_timer (loop, 5, 0, s_tick, &probe);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (probe.answers == 3 && probe.sum == 0 + 2 + 40);
    assert (probe.order[0] == 1 && probe.order[1] == 1 && probe.order[2] == 10);
    assert (atomic_load (calls) == 3);
    //  No request, no handle.
    zmsg_t *none = NULL;
    assert (gw_worker_start (worker, &none, s_on_double, NULL, 0) == 0);
    gw_worker_destroy (&worker);
    gw_worker_destroy (&worker);
    //  A pool of two: a quick request passes a slow one.
    calls = calloc (1, sizeof *calls);
    worker = gw_worker_new (loop, 2, s_double, calls, free);
    assert (worker);
    probe = (s_probe_t){0};
    s_send (worker, "slow", &probe, 1);
    s_send (worker, "3", &probe, 100);
    s_send (worker, "5", &probe, 1000);
    timer = zloop_timer (loop, 5, 0, s_tick, &probe);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (probe.answers == 3 && probe.order[0] == 100 && probe.order[1] == 1000);
    gw_worker_destroy (&worker);
    //  Bad sizes: no worker, and the state is freed.
    assert (!gw_worker_new (loop, 0, s_double, calloc (1, sizeof (atomic_int)), free));
    assert (!gw_worker_new (loop, 65, s_double, NULL, NULL));
    zloop_destroy (&loop);
}
