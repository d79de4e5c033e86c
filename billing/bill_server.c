/*  bill_server - see bill_server.h */
#include "bill_server.h"
#include "bill_funds.h"
#include "sbx_dqproxy.h"
#include "sbx_secret.h"
#include "sbx_metrics.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

struct _bill_server_t {
    sbx_config_t *config; //  borrowed
    bill_store_t *store;
    bill_meter_t *meter;
    bill_funds_t *funds; //  the accounts' funds, for the check each second
    sbx_tapreader_t *reader;
    sbx_peer_t *peer;     //  borrowed, from start
    zloop_t *loop;        //  borrowed, from start
    zhashx_t *exhausted;  //  account id → "1"/"0": what the broker was last told
    unsigned funds_ticks; //  every tenth tick repeats the state (a message may be lost)
    bool failed;
    //  A cluster's billing (control.nodes set): its store is the cluster's, shared with
    //  the billing processes of the other control nodes; the one holding the lease
    //  follows the log, the others stand by (and answer usage.get all the same).
    sbx_dqproxy_t *proxy;
    char **nodes;
    char *holder; //  this process, in the lease
    bool leads;
    uint64_t retry_at; //  monotonic ms: a reader that stopped on a store failure restarts
};

//  How often wallets are checked against running time, and repeated to the broker.
#define S_FUNDS_TICK_MS 1000
#define S_FUNDS_REPEAT  10
//  The billing lease: renewed every second for three; a holder that stops renewing is
//  replaced within three seconds.
#define S_LEASE_TICK_MS 1000
#define S_LEASE_MS      3000
#define S_RETRY_MS      1000
#define S_STORE_WAIT_MS 15000

//  A cluster's store, through the cluster key's TLS to control.nodes. NULL (logged).
static bill_store_t *s_cluster_store (bill_server_t *self)
{
    sbx_dqlite_cluster_t where;
    if (sbx_dqproxy_cluster (self->config, &self->nodes, &self->proxy, &where))
        return NULL;
    self->holder = sbx_secret_id ("bill_");
    //  At a cluster's first start its nodes may still be electing a leader: wait a while
    //  rather than fail (and be restarted) at once.
    bill_store_t *store = NULL;
    uint64_t until = sbx_clock_mono_ms () + S_STORE_WAIT_MS;
    while (self->holder && !(store = bill_store_new_cluster (&where)) &&
           sbx_clock_mono_ms () < until && !zsys_interrupted)
        zclock_sleep (500);
    if (store)
        sbx_info ("billing on the cluster's database (control.nodes %s)",
                  sbx_config_get (self->config, "control.nodes", ""));
    //  The first node of a cluster made from one machine: its ledger is copied in once.
    char *file = sbx_config_path (self->config, "billing/billing.db");
    char err[512] = "";
    int copied = store && file && access (file, F_OK) == 0
                     ? bill_store_import (store, file, err, sizeof err)
                     : 0;
    if (copied < 0) {
        sbx_error ("cannot copy this machine's billing into the cluster: %s", err);
        bill_store_destroy (&store);
    } else if (copied > 0) {
        char aside[PATH_MAX];
        const char *suffixes[] = {"", "-wal", "-shm"};
        for (size_t i = 0; i < 3; i++) {
            char from[PATH_MAX];
            snprintf (from, sizeof from, "%s%s", file, suffixes[i]);
            snprintf (aside, sizeof aside, "%s.imported%s", file, suffixes[i]);
            rename (from, aside);
        }
        sbx_info ("this machine's billing is in the cluster now: %s set aside as %s.imported", file,
                  file);
    }
    free (file);
    return store;
}

bill_server_t *bill_server_new (sbx_config_t *config)
{
    assert (config);
    bill_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->exhausted = zhashx_new ();
    zhashx_set_destructor (self->exhausted, (zhashx_destructor_fn *) zstr_free);
    zhashx_set_duplicator (self->exhausted, (zhashx_duplicator_fn *) strdup);
    char *dir = sbx_config_path (config, "billing");
    char *path = sbx_config_path (config, "billing/billing.db");
    if (dir && mkdir (dir, 0700) && errno != EEXIST)
        sbx_error ("cannot make %s: %s", dir, strerror (errno));
    bill_rates_t rates;
    bill_meter_rates_from_config (config, &rates);
    const char *nodes = sbx_config_get (config, "control.nodes", NULL);
    self->store = nodes && *nodes ? s_cluster_store (self) : path ? bill_store_new (path) : NULL;
    self->meter = self->store ? bill_meter_new (self->store, &rates) : NULL;
    self->funds = self->meter ? bill_funds_new (self->meter, self->store) : NULL;
    if (self->meter)
        sbx_info ("billing %s: last applied event %llu; rates µ$/s small %llu, medium %llu, "
                  "large %llu",
                  path, (unsigned long long) bill_store_last_seq (self->store),
                  (unsigned long long) rates.small, (unsigned long long) rates.medium,
                  (unsigned long long) rates.large);
    free (dir);
    free (path);
    if (!self->funds)
        bill_server_destroy (&self);
    return self;
}

//  How far the meter is behind the broker's log, for sbx_billing_lag_seconds.
static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    bill_server_t *self = arg;
    sbx_metrics_set (metrics, SBX_METRIC_BILLING_LAG_SECONDS,
                     self->reader ? (double) sbx_tapreader_behind_ms (self->reader) / 1000.0 : 0);
}

void bill_server_destroy (bill_server_t **self_p)
{
    assert (self_p);
    bill_server_t *self = *self_p;
    if (!self)
        return;
    if (self->peer)
        sbx_metrics_off_collect (sbx_metrics_here (), s_collect, self);
    sbx_tapreader_destroy (&self->reader);
    zhashx_destroy (&self->exhausted);
    bill_funds_destroy (&self->funds);
    bill_meter_destroy (&self->meter);
    bill_store_destroy (&self->store);
    sbx_dqproxy_destroy (&self->proxy);
    sbx_config_list_free (&self->nodes);
    free (self->holder);
    free (self);
    *self_p = NULL;
}

void bill_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    bill_server_t *self = arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    switch (request->type) {
    case SBX_MSG_USAGE_GET:
        reply = bill_meter_usage (self->meter, request, sbx_clock_now_ms ());
        break;
    default:
        reply =
            sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                               "sbx-billing does not handle %s", sbx_msg_type_name (request->type));
        break;
    }
    sbx_peer_send (peer, &reply);
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    bill_server_t *self = arg;
    if (bill_meter_apply (self->meter, event) == 0)
        return 0;
    if (bill_store_is_cluster (self->store)) {
        //  The cluster's leader changed, or was out of reach: the reader stops (its loop
        //  goes on), and starts again from the last seq committed, once the store
        //  answers. A commit whose answer was lost is found there, never done twice.
        sbx_warn ("billing pauses at event %llu: the cluster's store failed; following the "
                  "log again from the last event committed in %d ms",
                  (unsigned long long) event->seq, S_RETRY_MS);
        self->retry_at = sbx_clock_mono_ms () + S_RETRY_MS;
        return 1;
    }
    self->failed = true;
    sbx_error ("billing stops at event %llu: its store failed; a restart replays from %llu",
               (unsigned long long) event->seq,
               (unsigned long long) bill_store_last_seq (self->store));
    return -1;
}

//  One account's wallet against its running time: tells the broker when it runs out
//  (the broker stops its sandboxes and refuses starts) or has funds again. False when the
//  broker could not be told: asked again at the next tick.
static bool s_check_funds (const char *account, bool prepaid, int64_t balance, void *arg)
{
    bill_server_t *self = arg;
    if (!prepaid)
        return true; //  post-paid: never funded, never stopped
    bool exhausted = balance <= 0;
    const char *told = zhashx_lookup (self->exhausted, account);
    bool changed = !told || streq (told, "1") != exhausted;
    if (!changed && self->funds_ticks % S_FUNDS_REPEAT)
        return true;
    sbx_msg_t *funds = sbx_msg_new (SBX_MSG_ACCOUNT_FUNDS);
    sbx_str_set (&sbx_msg_account_funds (funds)->account_id, account);
    sbx_msg_account_funds (funds)->exhausted = exhausted;
    sbx_msg_account_funds (funds)->balance_micro_usd = balance;
    bool sent = sbx_peer_send (self->peer, &funds) == 0;
    if (sent) {
        zhashx_update (self->exhausted, account, exhausted ? "1" : "0");
        if (changed)
            sbx_info ("account=%s wallet %s (%lld µ$ with running time)", account,
                      exhausted ? "empty" : "has funds", (long long) balance);
    }
    sbx_msg_destroy (&funds);
    return sent;
}

static int s_on_funds_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    bill_server_t *self = arg;
    //  Only once the log is replayed: figures from behind would send false alarms.
    if (self->failed || !self->reader || !sbx_peer_welcomed (self->peer) ||
        !sbx_tapreader_caught_up (self->reader))
        return 0;
    //  The accounts running sandboxes or changed since the last tick (bill_funds), and
    //  every tenth tick all of them.
    bill_funds_check (self->funds, sbx_clock_now_ms (), self->funds_ticks % S_FUNDS_REPEAT == 0,
                      s_check_funds, self);
    self->funds_ticks++;
    return 0;
}

//  Follows the log from the last event the store has applied.
static int s_reader_start (bill_server_t *self)
{
    //  Others may have written a cluster's store since: the funds are read again.
    bill_funds_reload (self->funds);
    self->reader = sbx_tapreader_new (self->config, self->peer, bill_store_last_seq (self->store),
                                      s_on_event, self);
    return self->reader ? sbx_tapreader_start (self->reader, self->loop) : -1;
}

//  A cluster's billing: takes or keeps the lease, follows the log while it has it, and
//  starts following again after a store failure paused it.
static int s_on_lease (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    bill_server_t *self = arg;
    uint64_t now = sbx_clock_now_ms ();
    int held = bill_store_lease (self->store, self->holder, now, now + S_LEASE_MS);
    if (held == 1 && !self->leads) {
        self->leads = true;
        sbx_info ("billing %s holds the lease: follows the log from event %llu", self->holder,
                  (unsigned long long) bill_store_last_seq (self->store));
    } else if (held != 1 && self->leads) {
        self->leads = false;
        sbx_warn ("billing %s stands by: %s", self->holder,
                  held == 0 ? "another billing process holds the lease"
                            : "the cluster's store does not answer");
    }
    if (self->reader && (!self->leads || sbx_tapreader_stopped (self->reader)))
        sbx_tapreader_destroy (&self->reader);
    if (self->leads && !self->reader && sbx_clock_mono_ms () >= self->retry_at &&
        s_reader_start (self))
        sbx_tapreader_destroy (&self->reader);
    return 0;
}

int bill_server_start (bill_server_t *self, sbx_peer_t *peer, zloop_t *loop)
{
    assert (self && peer && loop && !self->reader);
    self->peer = peer;
    self->loop = loop;
    sbx_metrics_on_collect (sbx_metrics_here (), s_collect, self);
    if (zloop_timer (loop, S_FUNDS_TICK_MS, 0, s_on_funds_tick, self) < 0)
        return -1;
    if (bill_store_is_cluster (self->store)) {
        if (zloop_timer (loop, S_LEASE_TICK_MS, 0, s_on_lease, self) < 0)
            return -1;
        return s_on_lease (loop, 0, self);
    }
    return s_reader_start (self);
}

uint64_t bill_server_last_seq (bill_server_t *self)
{
    return self ? bill_store_last_seq (self->store) : 0;
}

bool bill_server_failed (bill_server_t *self)
{
    return self && self->failed;
}

//  --------------------------------------------------------------------------
//  The actor

typedef struct {
    zsock_t *pipe;
    bill_server_t *server;
    sbx_peer_t *peer;
    bool terminated; //  $TERM came: nothing more to wait for
} s_actor_t;

static int s_on_pipe (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    s_actor_t *actor = arg;
    zmsg_t *msg = zmsg_recv (pipe);
    if (!msg)
        return -1;
    char *command = zmsg_popstr (msg);
    int rc = 0;
    if (!command || streq (command, "$TERM")) {
        actor->terminated = true;
        rc = -1;
    } else if (streq (command, "SEQ"))
        zstr_sendf (pipe, "%llu", (unsigned long long) bill_server_last_seq (actor->server));
    else if (streq (command, "USAGE")) {
        char *account = zmsg_popstr (msg);
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
        request->caller = calloc (1, sizeof (sbx_caller_t));
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
        sbx_str_set (&sbx_msg_usage_get (request)->account, account ? account : "");
        sbx_msg_t *reply = bill_meter_usage (actor->server->meter, request, sbx_clock_now_ms ());
        uint8_t *data = NULL;
        size_t size = 0;
        sbx_err_t err;
        if (sbx_msg_encode (reply, &data, &size, &err))
            size = 0;
        zsock_send (pipe, "b", data, size);
        free (data);
        free (account);
        sbx_msg_destroy (&reply);
        sbx_msg_destroy (&request);
    }
    free (command);
    zmsg_destroy (&msg);
    return rc;
}

void bill_server_actor (zsock_t *pipe, void *args)
{
    sbx_config_t *config = args;
    s_actor_t actor = {.pipe = pipe, .server = bill_server_new (config)};
    zloop_t *loop = zloop_new ();
    actor.peer = actor.server ? sbx_peer_new (config, SBX_ROLE_BILLING, NULL) : NULL;
    if (actor.peer)
        sbx_peer_set_request_fn (actor.peer, bill_server_on_request, actor.server);
    if (!actor.peer || sbx_peer_start (actor.peer, loop) ||
        bill_server_start (actor.server, actor.peer, loop)) {
        zsock_signal (pipe, 0);
        zstr_send (pipe, "FAILED");
    } else {
        zsock_signal (pipe, 0);
        zstr_send (pipe, "READY");
        zloop_reader (loop, pipe, s_on_pipe, &actor);
        zloop_set_nonstop (loop, true); //  signals are the main thread's business
        zloop_start (loop);
    }
    //  No bye: a test that destroys billing mid-stream plays a crash.
    bill_server_destroy (&actor.server);
    sbx_peer_destroy (&actor.peer);
    zloop_destroy (&loop);
    //  Wait for $TERM so the caller's zactor_destroy completes.
    while (!actor.terminated) {
        char *command = zstr_recv (pipe);
        bool term = !command || streq (command, "$TERM");
        free (command);
        if (term)
            actor.terminated = true;
    }
}
