/*  gw_verify - see gw_verify.h */
#include "gw_verify.h"
#include "gw_worker.h"
#include "sbx_clock.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>

#define S_MAX_WRONG   10
#define S_WINDOW_MS   (15 * 60 * 1000)
#define S_MAX_TRACKED 10000

//  A check's context, carried through the worker (gw_worker copies it).
typedef struct {
    gw_verify_t *verify;
    gw_verify_fn *fn;
    void *arg;
    char who[256];
    bool throttled;
} s_check_t;

//  Wrong passwords for one name since window_mono.
typedef struct {
    uint64_t wrong;
    uint64_t window_mono;
} s_guesses_t;

struct gw_verify_t {
    gw_worker_t *worker;
    zhashx_t *guesses; //  lower-case name → s_guesses_t
};

//  In the worker: [hash, password] in, ["1" | "0"] out.
static zmsg_t *s_work (zmsg_t *request, void *state)
{
    (void) state;
    char *hash = zmsg_popstr (request);
    char *password = zmsg_popstr (request);
    //  An empty hash: a throttled attempt, answered without the work.
    bool match = hash && *hash && password && sbx_secret_password_verify (hash, password);
    if (password)
        sbx_secret_wipe (password);
    zstr_free (&hash);
    zstr_free (&password);
    zmsg_t *answer = zmsg_new ();
    zmsg_addstr (answer, match ? "1" : "0");
    return answer;
}

static void s_on_answer (zmsg_t *answer, void *context)
{
    s_check_t *check = context;
    gw_verify_t *self = check->verify;
    char *match = zmsg_popstr (answer);
    gw_verify_result_t result = check->throttled              ? GW_VERIFY_THROTTLED
                                : match && streq (match, "1") ? GW_VERIFY_MATCH
                                                              : GW_VERIFY_WRONG;
    zstr_free (&match);
    s_guesses_t *guesses = zhashx_lookup (self->guesses, check->who);
    if (result == GW_VERIFY_MATCH)
        zhashx_delete (self->guesses, check->who);
    else if (result == GW_VERIFY_WRONG) {
        if (!guesses && (guesses = calloc (1, sizeof *guesses))) {
            if (zhashx_size (self->guesses) >= S_MAX_TRACKED)
                zhashx_purge (self->guesses);
            guesses->window_mono = sbx_clock_mono_ms ();
            zhashx_insert (self->guesses, check->who, guesses);
        }
        if (guesses)
            guesses->wrong++;
    }
    check->fn (result, check->arg);
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
    self->guesses = zhashx_new ();
    self->worker = gw_worker_new (loop, s_work, NULL, NULL);
    if (!self->guesses || !self->worker) {
        gw_verify_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->guesses, s_guesses_free);
    return self;
}

void gw_verify_destroy (gw_verify_t **self_p)
{
    assert (self_p);
    gw_verify_t *self = *self_p;
    if (!self)
        return;
    gw_worker_destroy (&self->worker);
    zhashx_destroy (&self->guesses);
    free (self);
    *self_p = NULL;
}

uint64_t gw_verify_start (gw_verify_t *self, const char *who, const char *hash,
                          const char *password, gw_verify_fn *fn, void *arg)
{
    if (!hash || !password) {
        fn (GW_VERIFY_WRONG, arg);
        return 0;
    }
    s_check_t check = {.verify = self, .fn = fn, .arg = arg};
    size_t i = 0;
    for (; who && who[i] && i < sizeof check.who - 1; i++)
        check.who[i] = (char) tolower ((unsigned char) who[i]);
    check.who[i] = 0;
    s_guesses_t *guesses = zhashx_lookup (self->guesses, check.who);
    if (guesses && sbx_clock_mono_ms () - guesses->window_mono >= S_WINDOW_MS) {
        zhashx_delete (self->guesses, check.who); //  the window is over: start afresh
        guesses = NULL;
    }
    check.throttled = guesses && guesses->wrong >= S_MAX_WRONG;
    zmsg_t *request = zmsg_new ();
    if (request) {
        zmsg_addstr (request, check.throttled ? "" : hash);
        zmsg_addstr (request, check.throttled ? "" : password);
    }
    uint64_t handle = gw_worker_start (self->worker, &request, s_on_answer, &check, sizeof check);
    if (!handle)
        fn (GW_VERIFY_WRONG, arg);
    return handle;
}

void gw_verify_cancel (gw_verify_t *self, uint64_t handle)
{
    if (self)
        gw_worker_cancel (self->worker, handle);
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
