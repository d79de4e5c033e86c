/*  gw_verify - see gw_verify.h */
#include "gw_verify.h"
#include "sbx_metrics.h"
#include "gw_worker.h"
#include "sbx_idmap.h"
#include "sbx_clock.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define S_MAX_WRONG    10
#define S_WINDOW_MS    (15 * 60 * 1000)
#define S_MAX_TRACKED  10000
#define S_SUSPECT_NICE 10 //  added to the suspect thread's niceness (CFS weight / 9)

//  One attempt, from start to its answer. Waiting in its name's list, or on the pool.
typedef struct {
    gw_verify_t *verify;
    uint64_t handle;
    gw_verify_fn *fn; //  NULL once cancelled while on the pool: the result still counts
    void *arg;
    char who[256];
    char *hash; //  NULL: the dummy
    char *password;
    void *waiting; //  its place in the name's list, while it waits
} s_check_t;

//  A sign-in name: wrong passwords since window_mono, and the checks in flight.
typedef struct {
    uint64_t wrong;
    uint64_t window_mono;
    size_t inflight;   //  waiting or on the pool: counted as wrong by the throttle
    bool running;      //  one of them is on the pool
    zlistx_t *waiting; //  s_check_t, in order
} s_name_t;

//  What the pool carries back to s_on_answer (gw_worker copies it).
typedef struct {
    gw_verify_t *verify;
    uint64_t handle;
} s_context_t;

struct gw_verify_t {
    gw_worker_t *worker;  //  names without wrong guesses lately
    gw_worker_t *suspect; //  names with some: one thread, at a lower CPU priority
    zhashx_t *names;      //  lower-case name → s_name_t
    zhashx_t *checks;     //  handle → s_check_t
    uint64_t next_handle;
    char *dummy_hash;
    uint64_t checked;
    uint64_t throttled;
};

//  In a worker thread: [hash, password] in, ["1" | "0"] out.
static zmsg_t *s_work (zmsg_t *request, void *state)
{
    //  The suspect pool's thread lowers its own priority once (raising niceness needs
    //  no privilege), so guessing yields the CPU to everyone else's sign-ins and to the
    //  gateway's loop whenever the CPUs are contended.
    static __thread bool niced;
    if (state && !niced) {
        id_t tid = (id_t) syscall (SYS_gettid);
        errno = 0;
        int nice = getpriority (PRIO_PROCESS, tid);
        if (errno == 0) {
            nice = nice + S_SUSPECT_NICE > 19 ? 19 : nice + S_SUSPECT_NICE;
            if (setpriority (PRIO_PROCESS, tid, nice) != 0)
                sbx_debug ("verify: cannot lower the suspect thread's priority: %s",
                           strerror (errno));
        }
        niced = true;
    }
    char *hash = zmsg_popstr (request);
    char *password = zmsg_popstr (request);
    bool match = hash && password && sbx_secret_password_verify (hash, password);
    if (password)
        sbx_secret_wipe (password);
    zstr_free (&hash);
    zstr_free (&password);
    zmsg_t *answer = zmsg_new ();
    zmsg_addstr (answer, match ? "1" : "0");
    return answer;
}

static void s_check_free (s_check_t **check_p)
{
    s_check_t *check = *check_p;
    if (!check)
        return;
    if (check->password) {
        sbx_secret_wipe (check->password);
        free (check->password);
    }
    free (check->hash);
    free (check);
    *check_p = NULL;
}

static void s_name_free (void **item)
{
    s_name_t *name = *item;
    if (name) {
        zlistx_destroy (&name->waiting);
        free (name);
    }
    *item = NULL;
}

static void s_finish (s_check_t *check, gw_verify_result_t result);
static void s_on_answer (zmsg_t *answer, void *context);

//  Puts the check on the pool: its name's one check there.
static void s_run (s_check_t *check, s_name_t *name)
{
    gw_verify_t *self = check->verify;
    name->running = true;
    zmsg_t *request = zmsg_new ();
    if (request) {
        zmsg_addstr (request, check->hash ? check->hash : self->dummy_hash);
        zmsg_addstr (request, check->password);
    }
    s_context_t context = {self, check->handle};
    gw_worker_t *pool = name->wrong ? self->suspect : self->worker;
    if (gw_worker_start (pool, &request, s_on_answer, &context, sizeof context))
        self->checked++;
    else
        s_finish (check, GW_VERIFY_WRONG);
}

//  The check is over: counts it, starts its name's next one, then answers.
static void s_finish (s_check_t *check, gw_verify_result_t result)
{
    gw_verify_t *self = check->verify;
    char who[sizeof check->who];
    memcpy (who, check->who, sizeof who);
    s_name_t *name = zhashx_lookup (self->names, who);
    assert (name); //  kept while it has checks in flight
    name->running = false;
    name->inflight--;
    if (result == GW_VERIFY_MATCH)
        name->wrong = 0;
    else {
        if (name->wrong == 0)
            name->window_mono = sbx_clock_mono_ms ();
        name->wrong++;
    }
    zhashx_delete (self->checks, (void *) (uintptr_t) check->handle);
    gw_verify_fn *fn = check->fn;
    void *arg = check->arg;
    s_check_free (&check);
    s_check_t *next = zlistx_detach (name->waiting, NULL);
    if (next) {
        next->waiting = NULL;
        s_run (next, name); //  may finish it (and free name's entry) at once
    } else if (name->inflight == 0 && name->wrong == 0)
        zhashx_delete (self->names, who); //  a right password: nothing to remember
    if (fn)
        fn (result, arg);
}

static void s_on_answer (zmsg_t *answer, void *context)
{
    s_context_t *c = context;
    s_check_t *check = zhashx_lookup (c->verify->checks, (void *) (uintptr_t) c->handle);
    if (!check)
        return;
    char *match = zmsg_popstr (answer);
    //  The dummy answers wrong whatever it finds.
    bool right = check->hash && match && streq (match, "1");
    zstr_free (&match);
    s_finish (check, right ? GW_VERIFY_MATCH : GW_VERIFY_WRONG);
}

//  Forgets names with nothing in flight once too many are kept (an attacker's spray of
//  names must not grow memory without bound).
static void s_purge (gw_verify_t *self)
{
    zlistx_t *idle = zlistx_new ();
    if (!idle)
        return;
    for (s_name_t *name = zhashx_first (self->names); name; name = zhashx_next (self->names))
        if (name->inflight == 0)
            zlistx_add_end (idle, (void *) zhashx_cursor (self->names));
    for (const char *key = zlistx_first (idle); key; key = zlistx_next (idle))
        zhashx_delete (self->names, key);
    zlistx_destroy (&idle);
}

gw_verify_t *gw_verify_new (zloop_t *loop, size_t threads)
{
    gw_verify_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->names = zhashx_new ();
    self->checks = sbx_idmap_new ();
    self->worker = gw_worker_new (loop, threads, s_work, NULL, NULL);
    self->suspect = gw_worker_new (loop, 1, s_work, (void *) "suspect", NULL);
    //  A password nobody knows, hashed like any account's.
    char *secret = sbx_secret_token ("", 32);
    self->dummy_hash = secret ? sbx_secret_password_hash (secret) : NULL;
    if (secret) {
        sbx_secret_wipe (secret);
        free (secret);
    }
    if (!self->names || !self->checks || !self->worker || !self->suspect || !self->dummy_hash) {
        gw_verify_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->names, s_name_free);
    self->next_handle = 1;
    return self;
}

void gw_verify_destroy (gw_verify_t **self_p)
{
    assert (self_p);
    gw_verify_t *self = *self_p;
    if (!self)
        return;
    gw_worker_destroy (&self->worker); //  first: no answer comes after this
    gw_worker_destroy (&self->suspect);
    if (self->checks) {
        for (s_check_t *check = zhashx_first (self->checks); check;
             check = zhashx_next (self->checks))
            s_check_free (&check);
        zhashx_destroy (&self->checks);
    }
    zhashx_destroy (&self->names);
    free (self->dummy_hash);
    free (self);
    *self_p = NULL;
}

uint64_t gw_verify_start (gw_verify_t *self, const char *who, const char *hash,
                          const char *password, gw_verify_fn *fn, void *arg)
{
    if (!password) {
        fn (GW_VERIFY_WRONG, arg);
        return 0;
    }
    char key[256];
    size_t i = 0;
    for (; who && who[i] && i < sizeof key - 1; i++)
        key[i] = (char) tolower ((unsigned char) who[i]);
    key[i] = 0;
    s_name_t *name = zhashx_lookup (self->names, key);
    if (name && name->wrong && sbx_clock_mono_ms () - name->window_mono >= S_WINDOW_MS)
        name->wrong = 0; //  the window is over: start afresh
    //  Checks in flight count as wrong: a burst cannot all pass before the first fails.
    if (name && name->wrong + name->inflight >= S_MAX_WRONG) {
        self->throttled++;
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_RATE_LIMITED_TOTAL, 1, "signin");
        fn (GW_VERIFY_THROTTLED, arg);
        return 0;
    }
    s_check_t *check = calloc (1, sizeof *check);
    if (check) {
        *check = (s_check_t){.verify = self, .handle = self->next_handle++, .fn = fn, .arg = arg};
        memcpy (check->who, key, i + 1);
        check->password = strdup (password);
        check->hash = hash ? strdup (hash) : NULL;
    }
    if (!name && check) {
        if (zhashx_size (self->names) >= S_MAX_TRACKED)
            s_purge (self);
        name = calloc (1, sizeof *name);
        if (name && !(name->waiting = zlistx_new ())) {
            free (name);
            name = NULL;
        }
        if (name)
            zhashx_insert (self->names, key, name);
    }
    if (!check || !check->password || (hash && !check->hash) || !name) {
        s_check_free (&check);
        fn (GW_VERIFY_WRONG, arg);
        return 0;
    }
    uint64_t handle = check->handle;
    zhashx_insert (self->checks, (void *) (uintptr_t) handle, check);
    name->inflight++;
    if (name->running)
        check->waiting = zlistx_add_end (name->waiting, check);
    else
        s_run (check, name);
    return zhashx_lookup (self->checks, (void *) (uintptr_t) handle) ? handle : 0;
}

void gw_verify_cancel (gw_verify_t *self, uint64_t handle)
{
    s_check_t *check =
        self && handle ? zhashx_lookup (self->checks, (void *) (uintptr_t) handle) : NULL;
    if (!check)
        return;
    if (!check->waiting) {
        //  On the pool: it finishes and counts, like any guess, but answers nobody.
        check->fn = NULL;
        return;
    }
    s_name_t *name = zhashx_lookup (self->names, check->who);
    assert (name);
    zlistx_delete (name->waiting, check->waiting);
    name->inflight--;
    zhashx_delete (self->checks, (void *) (uintptr_t) handle);
    s_check_free (&check);
}

void gw_verify_counts (gw_verify_t *self, uint64_t *checked, uint64_t *throttled)
{
    assert (self);
    if (checked)
        *checked = self->checked;
    if (throttled)
        *throttled = self->throttled;
}

//  --------------------------------------------------------------------------
//  Self test: right and wrong passwords through the pool, from a loop; the throttle
//  under a burst; unknown names.

typedef struct {
    int answers;
    int expect;
    gw_verify_result_t results[64];
} s_probe_t;

static void s_probe (gw_verify_result_t result, void *arg)
{
    s_probe_t *probe = arg;
    assert (probe->answers < 64);
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

//  Runs the loop until `expect` answers came (or 60 s passed: the suspect thread is slow
//  on a loaded machine, by design).
static void s_wait (zloop_t *loop, s_probe_t *probe, int expect)
{
    probe->expect = expect;
    int t1 = zloop_timer (loop, 5, 0, s_stop_at, probe);
    int t2 = zloop_timer (loop, 60000, 1, s_give_up, NULL); //  a bound, not a wait
    zloop_start (loop);
    zloop_timer_end (loop, t1);
    zloop_timer_end (loop, t2);
}

//  Threads of this process nicer than the one calling (the test's).
static int s_niced_threads (void)
{
    int count = 0;
    errno = 0;
    int mine = getpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid));
    assert (errno == 0);
    DIR *tasks = opendir ("/proc/self/task");
    assert (tasks);
    for (struct dirent *task = readdir (tasks); task; task = readdir (tasks)) {
        if (task->d_name[0] == '.')
            continue;
        char path[300], line[1024];
        snprintf (path, sizeof path, "/proc/self/task/%s/stat", task->d_name);
        FILE *file = fopen (path, "r");
        if (!file)
            continue;
        //  Field 19 is the niceness; the name (field 2) may hold spaces, so count from ')'.
        char *after = fgets (line, sizeof line, file) ? strrchr (line, ')') : NULL;
        int nice = 0;
        if (after &&
            sscanf (after + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %d",
                    &nice) == 1 &&
            nice > mine)
            count++;
        fclose (file);
    }
    closedir (tasks);
    return count;
}

void gw_verify_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    gw_verify_t *verify = gw_verify_new (loop, 2);
    assert (verify);
    char *hash = sbx_secret_password_hash ("correct horse");
    s_probe_t probe = {0};
    assert (gw_verify_start (verify, "a@x", hash, "correct horse", s_probe, &probe));
    assert (gw_verify_start (verify, "a@x", hash, "wrong horse", s_probe, &probe));
    //  A cancelled check never calls back (this one waits its turn: it never runs).
    uint64_t gone = gw_verify_start (verify, "a@x", hash, "x", s_probe, &probe);
    gw_verify_cancel (verify, gone);
    s_wait (loop, &probe, 2);
    assert (probe.answers == 2);
    assert (probe.results[0] == GW_VERIFY_MATCH && probe.results[1] == GW_VERIFY_WRONG);
    uint64_t checked, throttled;
    gw_verify_counts (verify, &checked, &throttled);
    assert (checked == 2 && throttled == 0);
    //  Ten wrong guesses for a name, and even the right password is not checked for it;
    //  other names are not affected.
    probe.answers = 0;
    for (int i = 0; i < 9; i++)
        assert (gw_verify_start (verify, "A@X", hash, "guess", s_probe, &probe));
    s_wait (loop, &probe, 9);
    assert (probe.answers == 9 && probe.results[8] == GW_VERIFY_WRONG);
    //  Those after the first wrong one ran on the suspect thread, at its lower priority
    //  (unless the test itself runs at the lowest already: nothing is lower).
    errno = 0;
    int mine = getpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid));
    assert (errno == 0 && (mine >= 19 || s_niced_threads () == 1));
    probe.answers = 0;
    assert (gw_verify_start (verify, "a@x", hash, "correct horse", s_probe, &probe) == 0);
    assert (probe.answers == 1 && probe.results[0] == GW_VERIFY_THROTTLED); //  at once
    gw_verify_start (verify, "b@x", hash, "correct horse", s_probe, &probe);
    s_wait (loop, &probe, 2);
    assert (probe.results[1] == GW_VERIFY_MATCH);
    //  A burst: checks in flight count, so 40 at once start 10 checks and refuse 30
    //  without checking; one whose client left still counts when it ends.
    probe = (s_probe_t){0};
    gw_verify_counts (verify, &checked, &throttled);
    uint64_t first = 0;
    int refused = 0;
    for (int i = 0; i < 40; i++) {
        uint64_t handle = gw_verify_start (verify, "c@x", hash, "guess", s_probe, &probe);
        if (i == 0)
            first = handle;
        refused += handle == 0;
    }
    assert (refused == 30 && probe.answers == 30);
    gw_verify_cancel (verify, first); //  on the pool: runs, counts, answers nobody
    s_wait (loop, &probe, 39);
    assert (probe.answers == 39);
    uint64_t checked2, throttled2;
    gw_verify_counts (verify, &checked2, &throttled2);
    assert (checked2 - checked == 10 && throttled2 - throttled == 30);
    probe.answers = 0;
    assert (gw_verify_start (verify, "c@x", hash, "correct horse", s_probe, &probe) == 0);
    assert (probe.results[0] == GW_VERIFY_THROTTLED);
    //  An unknown name costs a check against the dummy, answers wrong, and is throttled
    //  like a known one.
    probe = (s_probe_t){0};
    for (int i = 0; i < 10; i++)
        assert (gw_verify_start (verify, "nobody@x", NULL, "correct horse", s_probe, &probe));
    s_wait (loop, &probe, 10);
    assert (probe.answers == 10 && probe.results[0] == GW_VERIFY_WRONG);
    assert (gw_verify_start (verify, "nobody@x", NULL, "x", s_probe, &probe) == 0);
    assert (probe.results[10] == GW_VERIFY_THROTTLED);
    gw_verify_destroy (&verify);
    gw_verify_destroy (&verify);
    free (hash);
    zloop_destroy (&loop);
}
