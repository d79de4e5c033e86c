/*  gw_verify - see gw_verify.h */
#include "gw_verify.h"
#include "sbx_clock.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>

#define S_MAX_WRONG   10
#define S_WINDOW_MS   (15 * 60 * 1000)
#define S_MAX_TRACKED 10000

typedef struct {
    gw_verify_fn *fn;
    void *arg;
    char who[256];
    bool throttled;
} s_pending_t;

//  Wrong passwords for one name since window_mono.
typedef struct {
    uint64_t wrong;
    uint64_t window_mono;
} s_guesses_t;

struct gw_verify_t {
    zloop_t *loop;
    zactor_t *worker;
    zhashx_t *pending; //  handle → s_pending_t
    zhashx_t *guesses; //  lower-case name → s_guesses_t
    uint64_t next_handle;
};

//  The worker: [handle, hash, password] in, [handle, "1" | "0"] out, until $TERM.
static void s_worker (zsock_t *pipe, void *args)
{
    (void) args;
    zsock_signal (pipe, 0);
    while (true) {
        zmsg_t *msg = zmsg_recv (pipe);
        if (!msg)
            break;
        char *first = zmsg_popstr (msg);
        if (!first || streq (first, "$TERM")) {
            zstr_free (&first);
            zmsg_destroy (&msg);
            break;
        }
        char *hash = zmsg_popstr (msg);
        char *password = zmsg_popstr (msg);
        //  An empty hash: a throttled attempt, answered without the work.
        bool match = hash && *hash && sbx_secret_password_verify (hash, password);
        if (password)
            sbx_secret_wipe (password);
        zsock_send (pipe, "ss", first, match ? "1" : "0");
        zstr_free (&first);
        zstr_free (&hash);
        zstr_free (&password);
        zmsg_destroy (&msg);
    }
}

static int s_on_answer (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    gw_verify_t *self = arg;
    char *handle = NULL, *match = NULL;
    if (zsock_recv (sock, "ss", &handle, &match) == 0 && handle && match) {
        uint64_t h = strtoull (handle, NULL, 10);
        s_pending_t *p = zhashx_lookup (self->pending, (void *) (uintptr_t) h);
        if (p) {
            s_pending_t copy = *p;
            zhashx_delete (self->pending, (void *) (uintptr_t) h);
            gw_verify_result_t result = copy.throttled       ? GW_VERIFY_THROTTLED
                                        : streq (match, "1") ? GW_VERIFY_MATCH
                                                             : GW_VERIFY_WRONG;
            s_guesses_t *guesses = zhashx_lookup (self->guesses, copy.who);
            if (result == GW_VERIFY_MATCH)
                zhashx_delete (self->guesses, copy.who);
            else if (result == GW_VERIFY_WRONG) {
                if (!guesses && (guesses = calloc (1, sizeof *guesses))) {
                    if (zhashx_size (self->guesses) >= S_MAX_TRACKED)
                        zhashx_purge (self->guesses);
                    guesses->window_mono = sbx_clock_mono_ms ();
                    zhashx_insert (self->guesses, copy.who, guesses);
                }
                if (guesses)
                    guesses->wrong++;
            }
            copy.fn (result, copy.arg);
        }
    }
    zstr_free (&handle);
    zstr_free (&match);
    return 0;
}

static size_t s_handle_hash (const void *key)
{
    return (size_t) (uintptr_t) key;
}

static int s_handle_cmp (const void *a, const void *b)
{
    return (uintptr_t) a < (uintptr_t) b ? -1 : (uintptr_t) a > (uintptr_t) b;
}

static void s_pending_free (void **item)
{
    free (*item);
    *item = NULL;
}

static void s_guesses_free (void **item)
{
    free (*item);
    *item = NULL;
}

gw_verify_t *gw_verify_new (zloop_t *loop)
{
    gw_verify_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->next_handle = 1;
    self->pending = zhashx_new ();
    self->guesses = zhashx_new ();
    self->worker = zactor_new (s_worker, NULL);
    if (!self->pending || !self->guesses || !self->worker ||
        zloop_reader (loop, (zsock_t *) zactor_sock (self->worker), s_on_answer, self)) {
        gw_verify_destroy (&self);
        return NULL;
    }
    zhashx_set_key_hasher (self->pending, s_handle_hash);
    zhashx_set_key_comparator (self->pending, s_handle_cmp);
    zhashx_set_key_duplicator (self->pending, NULL);
    zhashx_set_key_destructor (self->pending, NULL);
    zhashx_set_destructor (self->pending, s_pending_free);
    zhashx_set_destructor (self->guesses, s_guesses_free);
    return self;
}

void gw_verify_destroy (gw_verify_t **self_p)
{
    assert (self_p);
    gw_verify_t *self = *self_p;
    if (!self)
        return;
    if (self->worker) {
        zloop_reader_end (self->loop, (zsock_t *) zactor_sock (self->worker));
        zactor_destroy (&self->worker);
    }
    zhashx_destroy (&self->pending);
    zhashx_destroy (&self->guesses);
    free (self);
    *self_p = NULL;
}

uint64_t gw_verify_start (gw_verify_t *self, const char *who, const char *hash,
                          const char *password, gw_verify_fn *fn, void *arg)
{
    s_pending_t *p = calloc (1, sizeof *p);
    if (!p || !hash || !password) {
        free (p);
        fn (GW_VERIFY_WRONG, arg);
        return 0;
    }
    p->fn = fn;
    p->arg = arg;
    size_t i = 0;
    for (; who && who[i] && i < sizeof p->who - 1; i++)
        p->who[i] = (char) tolower ((unsigned char) who[i]);
    p->who[i] = 0;
    s_guesses_t *guesses = zhashx_lookup (self->guesses, p->who);
    if (guesses && sbx_clock_mono_ms () - guesses->window_mono >= S_WINDOW_MS) {
        zhashx_delete (self->guesses, p->who); //  the window is over: start afresh
        guesses = NULL;
    }
    p->throttled = guesses && guesses->wrong >= S_MAX_WRONG;
    uint64_t handle = self->next_handle++;
    char text[24];
    snprintf (text, sizeof text, "%llu", (unsigned long long) handle);
    zhashx_insert (self->pending, (void *) (uintptr_t) handle, p);
    if (zsock_send (self->worker, "sss", text, p->throttled ? "" : hash,
                    p->throttled ? "" : password)) {
        zhashx_delete (self->pending, (void *) (uintptr_t) handle);
        fn (GW_VERIFY_WRONG, arg);
        return 0;
    }
    return handle;
}

void gw_verify_cancel (gw_verify_t *self, uint64_t handle)
{
    if (self && handle)
        zhashx_delete (self->pending, (void *) (uintptr_t) handle);
}

//  --------------------------------------------------------------------------
//  Self test: a right and a wrong password through the worker, from a loop.

typedef struct {
    int answers;
    int expect;
    gw_verify_result_t results[16];
} s_probe_t;

static void s_probe (gw_verify_result_t result, void *arg)
{
    s_probe_t *probe = arg;
    probe->results[probe->answers++] = result;
}

static int s_stop_at (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_probe_t *probe = arg;
    return probe->answers == probe->expect ? -1 : 0;
}

static int s_give_up (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return -1;
}

//  Runs the loop until `expect` answers came (or 10 s passed).
static void s_wait (zloop_t *loop, s_probe_t *probe, int expect)
{
    probe->expect = expect;
    int t1 = zloop_timer (loop, 5, 0, s_stop_at, probe);
    int t2 = zloop_timer (loop, 10000, 1, s_give_up, NULL); //  a bound, not a wait
    zloop_start (loop);
    zloop_timer_end (loop, t1);
    zloop_timer_end (loop, t2);
}

void gw_verify_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    gw_verify_t *verify = gw_verify_new (loop);
    assert (verify);
    char *hash = sbx_secret_password_hash ("correct horse");
    s_probe_t probe = {0};
    assert (gw_verify_start (verify, "a@x", hash, "correct horse", s_probe, &probe));
    assert (gw_verify_start (verify, "a@x", hash, "wrong horse", s_probe, &probe));
    //  A cancelled check never calls back.
    uint64_t gone = gw_verify_start (verify, "a@x", hash, "x", s_probe, &probe);
    gw_verify_cancel (verify, gone);
    s_wait (loop, &probe, 2);
    assert (probe.answers == 2);
    assert (probe.results[0] == GW_VERIFY_MATCH && probe.results[1] == GW_VERIFY_WRONG);
    //  Ten wrong guesses for a name, and even the right password is not checked for it;
    //  other names are not affected.
    probe.answers = 0;
    for (int i = 0; i < 9; i++)
        gw_verify_start (verify, "A@X", hash, "guess", s_probe, &probe);
    s_wait (loop, &probe, 9);
    assert (probe.answers == 9 && probe.results[8] == GW_VERIFY_WRONG);
    probe.answers = 0;
    gw_verify_start (verify, "a@x", hash, "correct horse", s_probe, &probe);
    gw_verify_start (verify, "b@x", hash, "correct horse", s_probe, &probe);
    s_wait (loop, &probe, 2);
    assert (probe.results[0] == GW_VERIFY_THROTTLED && probe.results[1] == GW_VERIFY_MATCH);
    gw_verify_destroy (&verify);
    free (hash);
    zloop_destroy (&loop);
}
