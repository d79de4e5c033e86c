/*  sbx_tapreader - see sbx_tapreader.h */
#include "sbx_tapreader.h"
#include "sbx_curve.h"
#include "sbx_log.h"
#include "sbx_clock.h"
#include "sbx_metrics.h"

#include <assert.h>
#include <pthread.h>

#define S_HELD_MAX 10000 //  live events held during a replay; beyond, replay covers them
#define S_POLL_MS  1000
#define S_RETRY_MS 500
#define S_BATCH    1000

struct sbx_tapreader_t {
    sbx_config_t *config;
    sbx_peer_t *peer;
    zsock_t *sub;
    zloop_t *loop;
    sbx_tapreader_fn *fn;
    void *arg;
    uint64_t last;  //  last seq delivered
    bool from_now;  //  last is not known yet: learn it from the first replay
    bool replaying; //  a replay request is in flight
    uint64_t replay_rid;
    zlistx_t *held; //  live events (sbx_msg_t) that came during a replay
    int poll_timer;
    bool stopped;          //  the callback asked to stop
    bool end_loop;         //  ... and to end the loop (it said -1, not 1)
    bool caught_up;        //  a replay reached the end of the log
    uint64_t head;         //  the newest seq heard of: a replay's last_seq, a live event's
    uint64_t behind_since; //  monotonic ms since last < head, or 0 while level
    zhashx_t *taps;        //  the tap endpoints subscribed to
};

//  Every reader of the process, for sbx_tap_lag_events: the most behind one counts.
static pthread_mutex_t s_readers_lock = PTHREAD_MUTEX_INITIALIZER;
static zlistx_t *s_readers;

static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    (void) arg;
    uint64_t worst = 0;
    pthread_mutex_lock (&s_readers_lock);
    for (sbx_tapreader_t *r = s_readers ? zlistx_first (s_readers) : NULL; r;
         r = zlistx_next (s_readers))
        if (sbx_tapreader_lag (r) > worst)
            worst = sbx_tapreader_lag (r);
    pthread_mutex_unlock (&s_readers_lock);
    sbx_metrics_set (metrics, SBX_METRIC_TAP_LAG_EVENTS, (double) worst);
}

//  Where the reader stands against the head: when it fell behind.
static void s_track (sbx_tapreader_t *self, uint64_t seen)
{
    if (seen > self->head)
        self->head = seen;
    if (self->last >= self->head)
        self->behind_since = 0;
    else if (!self->behind_since)
        self->behind_since = sbx_clock_mono_ms ();
}

uint64_t sbx_tapreader_lag (sbx_tapreader_t *self)
{
    return self->from_now || self->last >= self->head ? 0 : self->head - self->last;
}

uint64_t sbx_tapreader_behind_ms (sbx_tapreader_t *self)
{
    return self->behind_since && !self->from_now ? sbx_clock_mono_ms () - self->behind_since : 0;
}

static void s_msg_free (void **item)
{
    sbx_msg_destroy ((sbx_msg_t **) item);
}

sbx_tapreader_t *sbx_tapreader_new (sbx_config_t *config, sbx_peer_t *peer, uint64_t after_seq,
                                    sbx_tapreader_fn *fn, void *arg)
{
    sbx_tapreader_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->peer = peer;
    self->fn = fn;
    self->arg = arg;
    self->from_now = after_seq == SBX_TAPREADER_NOW;
    self->last = self->from_now ? 0 : after_seq;
    self->held = zlistx_new ();
    self->sub = zsock_new (ZMQ_SUB);
    if (!self->held || !self->sub) {
        sbx_tapreader_destroy (&self);
        return NULL;
    }
    zlistx_set_destructor (self->held, s_msg_free);
    zsock_set_rcvhwm (self->sub, 100000);
    zsock_set_rcvtimeo (self->sub, 0);
    //  A cluster's control nodes each have a tap: only the broker that leads publishes,
    //  so the reader listens to all of them and takes what comes (seq tells any gap).
    char **endpoints = sbx_config_list (config, "tap.endpoint", NULL);
    bool curve = false;
    for (char **e = endpoints; e && *e; e++)
        curve |= sbx_curve_needed (*e);
    if (!endpoints || (curve && sbx_curve_client (config, self->sub))) {
        sbx_config_list_free (&endpoints);
        sbx_tapreader_destroy (&self);
        return NULL;
    }
    //  All topics: gaps are found by seq, which needs every event; filtering is the
    //  callback's business.
    zsock_set_subscribe (self->sub, "");
    self->taps = zhashx_new ();
    if (!self->taps)
        sbx_tapreader_destroy (&self);
    for (char **e = endpoints; self && *e; e++)
        if (zsock_connect (self->sub, "%s", *e)) {
            sbx_error ("cannot connect to the tap at %s", *e);
            sbx_tapreader_destroy (&self);
        } else
            zhashx_insert (self->taps, *e, (void *) 1);
    sbx_config_list_free (&endpoints);
    return self;
}

void sbx_tapreader_destroy (sbx_tapreader_t **self_p)
{
    assert (self_p);
    sbx_tapreader_t *self = *self_p;
    if (!self)
        return;
    if (self->loop) {
        zloop_reader_end (self->loop, self->sub);
        zloop_timer_end (self->loop, self->poll_timer);
        pthread_mutex_lock (&s_readers_lock);
        void *handle = s_readers ? zlistx_find (s_readers, self) : NULL;
        if (handle)
            zlistx_delete (s_readers, handle);
        if (s_readers && zlistx_size (s_readers) == 0) {
            zlistx_destroy (&s_readers);
            sbx_metrics_off_collect (sbx_metrics_here (), s_collect, NULL);
        }
        pthread_mutex_unlock (&s_readers_lock);
    }
    if (self->replaying)
        sbx_peer_cancel (self->peer, self->replay_rid);
    zsock_destroy (&self->sub);
    zlistx_destroy (&self->held);
    zhashx_destroy (&self->taps);
    free (self);
    *self_p = NULL;
}

uint64_t sbx_tapreader_last_seq (sbx_tapreader_t *self)
{
    return self->last;
}

bool sbx_tapreader_caught_up (sbx_tapreader_t *self)
{
    return self->caught_up && !self->replaying;
}

bool sbx_tapreader_stopped (sbx_tapreader_t *self)
{
    return self->stopped;
}

static void s_replay (sbx_tapreader_t *self);

static void s_deliver (sbx_tapreader_t *self, const sbx_event_t *event)
{
    if (self->stopped || event->seq <= self->last)
        return;
    self->last = event->seq;
    s_track (self, event->seq);
    int rc = self->fn (event, self->arg);
    if (rc) {
        self->stopped = true;
        self->end_loop = rc < 0;
    }
}

//  Applies a live event: the next one is delivered, an old one dropped, one past a gap
//  starts a replay (and is held until the replay has filled the gap).
static void s_live (sbx_tapreader_t *self, sbx_msg_t **event_p)
{
    sbx_event_t *event = sbx_msg_event (*event_p);
    s_track (self, event->seq);
    if (self->replaying || self->from_now) {
        if (zlistx_size (self->held) < S_HELD_MAX) {
            zlistx_add_end (self->held, *event_p);
            *event_p = NULL;
        }
        return;
    }
    if (event->seq <= self->last)
        return;
    if (event->seq == self->last + 1) {
        s_deliver (self, event);
        return;
    }
    sbx_debug ("tap: gap after seq %llu (got %llu): replaying", (unsigned long long) self->last,
               (unsigned long long) event->seq);
    zlistx_add_end (self->held, *event_p);
    *event_p = NULL;
    s_replay (self);
}

static void s_drain_held (sbx_tapreader_t *self)
{
    sbx_msg_t *event;
    while (!self->replaying && (event = zlistx_detach (self->held, NULL))) {
        s_live (self, &event);
        sbx_msg_destroy (&event);
    }
}

static int s_on_retry (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_replay (arg);
    return 0;
}

static void s_on_replay (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    sbx_tapreader_t *self = arg;
    sbx_msg_t *reply = *reply_p;
    self->replaying = false;
    if (reply->type != SBX_MSG_EVENTS_REPLAY_OK) {
        sbx_error_t *error = sbx_msg_error (reply);
        sbx_debug ("tap: replay failed (%s: %s); retrying", sbx_code_name (error->code),
                   error->message);
        zloop_timer (self->loop, S_RETRY_MS, 1, s_on_retry, self);
        return;
    }
    sbx_events_replay_ok_t *ok = sbx_msg_events_replay_ok (reply);
    if (self->from_now) {
        self->from_now = false;
        self->last = ok->last_seq;
    }
    s_track (self, ok->last_seq);
    for (size_t i = 0; i < ok->events.count; i++)
        s_deliver (self, &ok->events.items[i]);
    if (ok->more && ok->events.count > 0)
        s_replay (self);
    else {
        self->caught_up = true;
        s_drain_held (self);
    }
}

static void s_replay (sbx_tapreader_t *self)
{
    if (self->replaying)
        return;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_events_replay_t *args = sbx_msg_events_replay (request);
    //  From now: ask past any seq (SQLite integers are signed) just to learn last_seq.
    args->after_seq = self->from_now ? (uint64_t) INT64_MAX : self->last;
    args->limit = S_BATCH;
    self->replaying = true;
    self->replay_rid = sbx_peer_request (self->peer, &request, 10000, s_on_replay, self);
}

static int s_on_sub (zloop_t *loop, zsock_t *sub, void *arg)
{
    (void) loop;
    sbx_tapreader_t *self = arg;
    for (int i = 0; i < 1000 && !self->stopped; i++) {
        zmsg_t *in = zmsg_recv (sub);
        if (!in)
            break;
        zframe_t *topic = zmsg_first (in);
        zframe_t *body = zmsg_next (in);
        sbx_err_t err;
        sbx_msg_t *event = topic && body && zmsg_size (in) == 2
                               ? sbx_msg_decode (zframe_data (body), zframe_size (body), &err)
                               : NULL;
        if (event && event->type == SBX_MSG_EVENT)
            s_live (self, &event);
        else
            sbx_warn ("tap: malformed event dropped");
        sbx_msg_destroy (&event);
        zmsg_destroy (&in);
    }
    return self->end_loop ? -1 : 0;
}

//  A cluster's control nodes named since (sbx_peer_nodes): their taps (at PORT+2) are
//  listened to as well, so that a leader the settings did not name is heard.
static void s_learn_taps (sbx_tapreader_t *self)
{
    const char *const *nodes = sbx_peer_nodes (self->peer);
    for (size_t i = 0; nodes && nodes[i]; i++) {
        const char *colon = strrchr (nodes[i], ':');
        long port = colon ? strtol (colon + 1, NULL, 10) : 0;
        if (!colon || port < 1 || port > 65533)
            continue;
        char tap[300];
        snprintf (tap, sizeof tap, "tcp://%.*s:%ld", (int) (colon - nodes[i]), nodes[i], port + 2);
        if (zhashx_lookup (self->taps, tap) || zsock_connect (self->sub, "%s", tap))
            continue;
        zhashx_insert (self->taps, tap, (void *) 1);
        sbx_info ("tap of control node %s followed too: %s", nodes[i], tap);
    }
}

static int s_on_poll (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    //  czmq still calls a timer its loop ended in this same pass (a reader destroyed by
    //  another timer's handler, as billing does when it loses its lease): a reader that
    //  is gone is not touched.
    pthread_mutex_lock (&s_readers_lock);
    bool alive = s_readers && zlistx_find (s_readers, arg);
    pthread_mutex_unlock (&s_readers_lock);
    if (!alive)
        return 0;
    sbx_tapreader_t *self = arg;
    s_learn_taps (self);
    if (!self->replaying && !self->stopped)
        s_replay (self);
    return self->end_loop ? -1 : 0;
}

int sbx_tapreader_start (sbx_tapreader_t *self, zloop_t *loop)
{
    self->loop = loop;
    if (zloop_reader (loop, self->sub, s_on_sub, self))
        return -1;
    pthread_mutex_lock (&s_readers_lock);
    if (!s_readers && (s_readers = zlistx_new ()))
        sbx_metrics_on_collect (sbx_metrics_here (), s_collect, NULL);
    if (s_readers)
        zlistx_add_end (s_readers, self);
    pthread_mutex_unlock (&s_readers_lock);
    self->poll_timer = zloop_timer (loop, S_POLL_MS, 0, s_on_poll, self);
    s_replay (self);
    return 0;
}
