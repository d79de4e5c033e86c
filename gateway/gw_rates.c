/*  gw_rates - see gw_rates.h */
#include "gw_rates.h"

#include <assert.h>

//  How often demand goes to the broker and shares come back (gateway.rate_report_ms).
#define S_REPORT_MS 250
//  Keys in one rate.report (schemas/rate.json): past that, the least active wait.
#define S_REPORT_MAX 4096
//  A broker share is kept while its key has requests and this long after (or four report
//  periods when those are longer); then the key is back at the even split. The broker
//  forgets this gateway's figure for the key after as long.
#define S_HOLD_MS 1000
//  One request, in the bucket's millionths.
#define S_ONE 1000000ULL
//  Plans faster than this are taken as this: keeps the bucket's products in 64 bits.
#define S_RATE_MAX 1000000000ULL

//  A key's token bucket, in millionths of a request so integer arithmetic is enough at a
//  share of the rate too. With N gateways behind a balancer each refills it at its share
//  of the plan (brk_rates.h), so together they allow the plan, not N times it.
typedef struct {
    uint64_t rate;      //  the plan's requests per second; 0: none
    uint64_t micro;     //  budget left, in 1/1000000 requests
    uint64_t last_mono; //  when it was last refilled
    uint64_t share;     //  this gateway's thousandths of the rate, from the broker; 0: none
    uint64_t used_mono; //  its last request
    uint64_t demand;    //  requests attempted since the last report
    uint64_t guess;     //  the even split it was at, while the broker's first share was more
} s_bucket_t;

struct gw_rates_t {
    zhashx_t *buckets; //  key id → s_bucket_t
    sbx_peer_t *peer;
    zloop_t *loop;
    int report_timer;      //  -1 while not started
    uint64_t report_ms;    //  gateway.rate_report_ms
    uint64_t window_mono;  //  when the demand being counted began
    bool reporting;        //  a report is in flight (report_rid once sent)
    uint64_t report_rid;   //  to cancel it
    uint64_t gateways;     //  as the broker last counted them; 1 before it said
    uint64_t counted_mono; //  when it last said
};

static void s_bucket_free (void **item)
{
    free (*item);
    *item = NULL;
}

gw_rates_t *gw_rates_new (sbx_config_t *config, sbx_peer_t *peer)
{
    gw_rates_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->report_ms =
        sbx_config_get_range (config, "gateway.rate_report_ms", S_REPORT_MS, 10, 10000);
    self->report_timer = -1;
    self->gateways = 1;
    self->buckets = zhashx_new ();
    if (!self->buckets) {
        free (self);
        return NULL;
    }
    zhashx_set_destructor (self->buckets, s_bucket_free);
    return self;
}

void gw_rates_destroy (gw_rates_t **self_p)
{
    assert (self_p);
    gw_rates_t *self = *self_p;
    if (!self)
        return;
    if (self->loop && self->report_timer != -1)
        zloop_timer_end (self->loop, self->report_timer);
    if (self->peer && self->report_rid)
        sbx_peer_cancel (self->peer, self->report_rid);
    zhashx_destroy (&self->buckets);
    free (self);
    *self_p = NULL;
}

static int s_on_report_timer (zloop_t *loop, int timer_id, void *arg);

int gw_rates_start (gw_rates_t *self, zloop_t *loop)
{
    assert (self);
    if (!self->peer)
        return 0; //  self-tests: no broker to report to
    self->loop = loop;
    self->window_mono = sbx_clock_mono_ms ();
    self->report_timer = zloop_timer (loop, (size_t) self->report_ms, 0, s_on_report_timer, self);
    return self->report_timer == -1 ? -1 : 0;
}

static uint64_t s_hold_ms (gw_rates_t *self)
{
    return self->report_ms * 4 > S_HOLD_MS ? self->report_ms * 4 : S_HOLD_MS;
}

//  This gateway's thousandths of the key's rate now: the broker's share while the key
//  has requests, else the even split over the gateways the broker last counted (1000
//  for a single gateway: exactly the plan). A lapsed share is dropped here.
static uint64_t s_share (gw_rates_t *self, s_bucket_t *bucket, uint64_t now)
{
    if (bucket->share && now - bucket->used_mono > s_hold_ms (self))
        bucket->share = 0;
    if (bucket->share)
        return bucket->share;
    return self->gateways < 1000 ? 1000 / self->gateways : 1;
}

//  The bucket's depth at a share: that part of one second's worth, and at least one
//  request, or a small share of a small plan would allow nothing at all.
static uint64_t s_depth (s_bucket_t *bucket, uint64_t share)
{
    uint64_t depth = bucket->rate * share * 1000;
    return depth < S_ONE ? S_ONE : depth;
}

//  Refills the bucket up to now at the share in force; returns that share.
static uint64_t s_refill (gw_rates_t *self, s_bucket_t *bucket, uint64_t now)
{
    uint64_t share = s_share (self, bucket, now);
    uint64_t elapsed = now > bucket->last_mono ? now - bucket->last_mono : 0;
    if (elapsed > 60000)
        elapsed = 60000; //  full long before, bar the tiniest shares; keeps 64 bits enough
    //  rate * share / 1000 requests per second: rate * share millionths per ms.
    bucket->micro += elapsed * bucket->rate * share;
    if (bucket->micro > s_depth (bucket, share))
        bucket->micro = s_depth (bucket, share);
    bucket->last_mono = now;
    return share;
}

//  Notes a key's plan rate (from auth.key); a new key starts with a full bucket.
static void s_bucket_set (gw_rates_t *self, const char *key_id, uint64_t rate, uint64_t now)
{
    s_bucket_t *bucket = zhashx_lookup (self->buckets, key_id);
    if (!bucket && (bucket = calloc (1, sizeof *bucket))) {
        bucket->rate = rate < S_RATE_MAX ? rate : S_RATE_MAX;
        bucket->micro = s_depth (bucket, s_share (self, bucket, now));
        bucket->last_mono = now;
        zhashx_insert (self->buckets, key_id, bucket);
    }
    if (bucket) {
        s_refill (self, bucket, now); //  what it earned at the old rate
        bucket->rate = rate < S_RATE_MAX ? rate : S_RATE_MAX;
    }
}

static int s_take (gw_rates_t *self, s_bucket_t *bucket, uint64_t now, gw_rates_limit_t *limit)
{
    uint64_t share = s_refill (self, bucket, now);
    bucket->used_mono = now;
    bucket->demand++;
    limit->limit = bucket->rate;
    int rc = -1;
    if (bucket->micro >= S_ONE) {
        bucket->micro -= S_ONE;
        rc = 0;
    }
    limit->remaining = bucket->micro / S_ONE;
    //  Seconds until a whole request is back (at least 1: the header counts seconds).
    uint64_t short_by = bucket->micro >= S_ONE ? 0 : S_ONE - bucket->micro;
    uint64_t per_ms = bucket->rate * share;
    limit->reset_s = ((short_by + per_ms - 1) / per_ms + 999) / 1000;
    if (limit->reset_s == 0)
        limit->reset_s = 1;
    return rc;
}

typedef struct {
    const char *key_id;
    s_bucket_t *bucket;
} s_active_t;

static int s_more_demand (const void *a, const void *b)
{
    uint64_t x = ((const s_active_t *) a)->bucket->demand;
    uint64_t y = ((const s_active_t *) b)->bucket->demand;
    return x < y ? 1 : x > y ? -1 : 0;
}

//  The rate.report for the window ending now, or NULL when there is nothing to say: no
//  key had requests, and the broker counted the gateways less than a second ago. An
//  idle gateway still asks once a second (an empty report), so a key that arrives
//  finds the even split over the right count: otherwise every idle gateway would start
//  a key at the whole plan. A key without requests is not reported: its figure at the
//  broker lapses, and the other gateways take it over. Starts the next window.
static sbx_msg_t *s_report_new (gw_rates_t *self, uint64_t now)
{
    size_t active = 0;
    for (s_bucket_t *b = zhashx_first (self->buckets); b; b = zhashx_next (self->buckets))
        active += b->demand && b->rate;
    if (!active && self->counted_mono && now - self->counted_mono < S_HOLD_MS) {
        self->window_mono = now;
        return NULL;
    }
    s_active_t *keys = active ? calloc (active, sizeof *keys) : NULL;
    size_t count = 0;
    for (s_bucket_t *b = zhashx_first (self->buckets); b; b = zhashx_next (self->buckets)) {
        if (keys && b->demand && b->rate && count < active)
            keys[count++] = (s_active_t){zhashx_cursor (self->buckets), b};
    }
    //  Over what one report holds: the busiest keys go, the others keep what they hold
    //  until it lapses (at worst the even split).
    if (count > S_REPORT_MAX) {
        qsort (keys, count, sizeof *keys, s_more_demand);
        count = S_REPORT_MAX;
    }
    sbx_msg_t *report = sbx_msg_new (SBX_MSG_RATE_REPORT);
    sbx_rate_report_t *body = report ? sbx_msg_rate_report (report) : NULL;
    if (body)
        body->window_ms = now > self->window_mono ? now - self->window_mono : 1;
    for (size_t i = 0; body && i < count; i++) {
        sbx_rate_demand_t *item = sbx_rate_demand_list_append (&body->keys);
        if (!item || sbx_str_set (&item->key_id, keys[i].key_id)) {
            sbx_msg_destroy (&report);
            break;
        }
        item->rate = keys[i].bucket->rate;
        item->demand = keys[i].bucket->demand;
    }
    free (keys);
    for (s_bucket_t *b = zhashx_first (self->buckets); b; b = zhashx_next (self->buckets))
        b->demand = 0;
    self->window_mono = now;
    return report;
}

//  Takes the broker's shares. A key that was at the even split (a guess: the broker had
//  not seen it here) and gets more, twice running, is paid the difference in its bucket,
//  so a client that sticks to one gateway loses nothing to the guess. Twice: the first
//  gateway to report a key always looks alone. Other rises are not paid: shares that
//  wobble with demand must not mint requests.
static void s_apply (gw_rates_t *self, const sbx_rate_report_ok_t *ok, uint64_t now)
{
    for (size_t i = 0; i < ok->shares.count; i++) {
        const sbx_rate_share_t *item = &ok->shares.items[i];
        s_bucket_t *bucket = zhashx_lookup (self->buckets, item->key_id);
        if (!bucket || !bucket->rate)
            continue;
        uint64_t share = item->share_milli < 1      ? 1
                         : item->share_milli > 1000 ? 1000
                                                    : item->share_milli;
        uint64_t before = s_refill (self, bucket, now);
        if (!bucket->share)
            bucket->guess = share > before ? before : 0;
        else {
            uint64_t low = share < bucket->share ? share : bucket->share;
            if (bucket->guess && low > bucket->guess)
                bucket->micro += (low - bucket->guess) * bucket->rate * 1000;
            bucket->guess = 0;
        }
        bucket->share = share;
        if (bucket->micro > s_depth (bucket, share))
            bucket->micro = s_depth (bucket, share);
    }
    //  After the keys: their guesses were made with the count as it was.
    self->gateways = ok->gateways ? ok->gateways : 1;
    self->counted_mono = now;
}

static void s_on_report_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    gw_rates_t *self = arg;
    self->reporting = false;
    self->report_rid = 0;
    sbx_msg_t *reply = *reply_p;
    if (reply->type == SBX_MSG_RATE_REPORT_OK)
        s_apply (self, sbx_msg_rate_report_ok (reply), sbx_clock_mono_ms ());
    else //  the broker away or restarting: the shares held stay (they err toward the plan)
        sbx_debug ("rate.report: %s", reply->type == SBX_MSG_ERROR
                                          ? sbx_msg_error (reply)->message
                                          : sbx_msg_type_name (reply->type));
}

static int s_on_report_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    gw_rates_t *self = arg;
    if (self->reporting)
        return 0; //  one at a time: this window runs on into the next
    sbx_msg_t *report = s_report_new (self, sbx_clock_mono_ms ());
    if (!report)
        return 0;
    self->reporting = true;
    uint64_t timeout = self->report_ms * 4 > 1000 ? self->report_ms * 4 : 1000;
    uint64_t rid =
        sbx_peer_request (self->peer, &report, (uint32_t) timeout, s_on_report_reply, self);
    //  The reply may already have come (a send that failed is answered at once).
    if (self->reporting)
        self->report_rid = rid;
    return 0;
}

static void s_rate_counts (gw_rates_t *self, uint64_t now, uint64_t *gateways, uint64_t *keys,
                           uint64_t *shared)
{
    *gateways = self->gateways;
    *keys = *shared = 0;
    for (s_bucket_t *b = zhashx_first (self->buckets); b; b = zhashx_next (self->buckets)) {
        if (!b->rate || !b->used_mono || now - b->used_mono > s_hold_ms (self))
            continue;
        (*keys)++;
        *shared += s_share (self, b, now) < 1000;
    }
}

void gw_rates_counts (gw_rates_t *self, uint64_t *gateways, uint64_t *keys, uint64_t *shared)
{
    assert (self && gateways && keys && shared);
    s_rate_counts (self, sbx_clock_mono_ms (), gateways, keys, shared);
}

void gw_rates_set (gw_rates_t *self, const char *key_id, uint64_t rate)
{
    assert (self);
    if (key_id)
        s_bucket_set (self, key_id, rate, sbx_clock_mono_ms ());
}

int gw_rates_take (gw_rates_t *self, const char *key_id, gw_rates_limit_t *limit)
{
    memset (limit, 0, sizeof *limit);
    s_bucket_t *bucket = key_id ? zhashx_lookup (self->buckets, key_id) : NULL;
    if (!bucket || bucket->rate == 0)
        return 0;
    return s_take (self, bucket, sbx_clock_mono_ms (), limit);
}

//  Takes requests from bucket at now until one is refused; returns how many went.
static int s_test_burst (gw_rates_t *auth, s_bucket_t *bucket, uint64_t now)
{
    gw_rates_limit_t limit;
    int count = 0;
    while (count < 100000 && s_take (auth, bucket, now, &limit) == 0)
        count++;
    return count;
}

//  The broker's answer: gateways, and one key's share.
static void s_test_answer (gw_rates_t *auth, uint64_t gateways, const char *key_id, uint64_t share,
                           uint64_t now)
{
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_RATE_REPORT_OK);
    sbx_rate_report_ok_t *ok = sbx_msg_rate_report_ok (reply);
    ok->gateways = gateways;
    if (key_id) {
        sbx_rate_share_t *item = sbx_rate_share_list_append (&ok->shares);
        assert (item && sbx_str_set (&item->key_id, key_id) == 0);
        item->share_milli = share;
    }
    s_apply (auth, ok, now);
    sbx_msg_destroy (&reply);
}

//  --------------------------------------------------------------------------
//  Self test: no broker; the test plays its answers, on a clock it moves.

void gw_rates_test (bool verbose)
{
    (void) verbose;
    gw_rates_t *auth = gw_rates_new (NULL, NULL);
    assert (auth);
    uint64_t t = 1000000;
    auth->window_mono = t;
    gw_rates_limit_t limit;

    //  Before any report: one gateway, the whole plan (20/s, 20 deep), as ever.
    s_bucket_set (auth, "key_a", 20, t);
    s_bucket_t *a = zhashx_lookup (auth->buckets, "key_a");
    assert (a && s_test_burst (auth, a, t) == 20);
    assert (s_take (auth, a, t + 49, &limit) == -1);
    assert (limit.limit == 20 && limit.remaining == 0 && limit.reset_s == 1);
    assert (s_take (auth, a, t + 50, &limit) == 0);
    //  The report counts every attempt, refused ones too, over the window.
    sbx_msg_t *report = s_report_new (auth, t + 250);
    assert (report && report->type == SBX_MSG_RATE_REPORT);
    sbx_rate_report_t *body = sbx_msg_rate_report (report);
    assert (body->window_ms == 250 && body->keys.count == 1);
    assert (streq (body->keys.items[0].key_id, "key_a"));
    assert (body->keys.items[0].rate == 20 && body->keys.items[0].demand == 23);
    sbx_msg_destroy (&report);
    //  No requests since, and the gateway count not heard yet: an empty report asks.
    report = s_report_new (auth, t + 500);
    assert (report && sbx_msg_rate_report (report)->keys.count == 0);
    sbx_msg_destroy (&report);
    s_test_answer (auth, 1, NULL, 0, t + 500);
    //  Heard: nothing to say until requests come or the count is a second old.
    assert (s_report_new (auth, t + 750) == NULL);
    report = s_report_new (auth, t + 1500);
    assert (report && sbx_msg_rate_report (report)->keys.count == 0);
    sbx_msg_destroy (&report);

    //  The broker says there are two gateways and this one has half of key_a: it refills
    //  at 10/s (one request per 100 ms) and holds 10 at most.
    t += 2000;
    s_test_answer (auth, 2, "key_a", 500, t);
    assert (a->share == 500);
    assert (s_test_burst (auth, a, t) == 10);
    assert (s_take (auth, a, t + 99, &limit) == -1 && limit.limit == 20);
    assert (s_take (auth, a, t + 100, &limit) == 0);
    report = s_report_new (auth, t + 250);
    assert (report && sbx_msg_rate_report (report)->keys.count == 1);
    assert (sbx_msg_rate_report (report)->keys.items[0].demand == 13);
    sbx_msg_destroy (&report);
    uint64_t gateways, keys, shared;
    s_rate_counts (auth, t + 750, &gateways, &keys, &shared);
    assert (gateways == 2 && keys == 1 && shared == 1);
    //  A second without requests: the share lapses, key_a is back at the even split.
    s_rate_counts (auth, t + 1101, &gateways, &keys, &shared);
    assert (keys == 0 && shared == 0);
    assert (s_share (auth, a, t + 1101) == 500 && a->share == 0);

    //  A new key with two gateways known: 1/2 before any share, 10 deep at 10/s.
    t += 5000;
    s_bucket_set (auth, "key_b", 20, t);
    s_bucket_t *b = zhashx_lookup (auth->buckets, "key_b");
    assert (s_test_burst (auth, b, t) == 10);
    assert (s_take (auth, b, t + 99, &limit) == -1);
    assert (s_take (auth, b, t + 100, &limit) == 0);
    //  The broker finds it is this gateway's alone, and says so again: the guess is paid
    //  back, so a client that sticks to one gateway gets the plan's whole burst.
    s_test_answer (auth, 2, "key_b", 1000, t + 100);
    assert (s_test_burst (auth, b, t + 100) == 0);
    s_test_answer (auth, 2, "key_b", 1000, t + 100);
    assert (s_test_burst (auth, b, t + 100) == 10);
    assert (s_take (auth, b, t + 149, &limit) == -1);
    assert (s_take (auth, b, t + 150, &limit) == 0);
    //  Later changes are not paid: down to a quarter (5/s, 5 deep), back up to all.
    s_test_answer (auth, 2, "key_b", 250, t + 150);
    assert (s_take (auth, b, t + 349, &limit) == -1);
    assert (limit.reset_s == 1 && limit.remaining == 0);
    assert (s_take (auth, b, t + 350, &limit) == 0);
    s_test_answer (auth, 2, "key_b", 1000, t + 350);
    assert (s_take (auth, b, t + 350, &limit) == -1);
    //  Full again in a second at its whole share (held: it had a request a second ago).
    assert (s_test_burst (auth, b, t + 1350) == 20);
    //  Alone at the first answer, half at the next (the other gateway reported the key
    //  just after this one): nothing is paid back.
    s_bucket_set (auth, "key_d", 20, t + 1350);
    s_bucket_t *d = zhashx_lookup (auth->buckets, "key_d");
    assert (s_test_burst (auth, d, t + 1350) == 10);
    s_test_answer (auth, 2, "key_d", 1000, t + 1350);
    s_test_answer (auth, 2, "key_d", 500, t + 1350);
    assert (s_test_burst (auth, d, t + 1350) == 0);
    //  The broker away: an error keeps the shares held (they err toward the plan).
    sbx_msg_t *error = sbx_msg_new_error (1, SBX_E_UNAVAILABLE, "no broker");
    auth->reporting = true;
    s_on_report_reply (NULL, &error, auth);
    sbx_msg_destroy (&error);
    assert (!auth->reporting && b->share == 1000 && auth->gateways == 2);
    //  Three gateways: a third each before a share. A tiny plan still allows one
    //  request (the bucket is at least one deep), at its share of the rate.
    s_test_answer (auth, 3, NULL, 0, t + 2000);
    s_bucket_set (auth, "key_c", 1, t + 2000);
    s_bucket_t *c = zhashx_lookup (auth->buckets, "key_c");
    assert (s_test_burst (auth, c, t + 2000) == 1);
    assert (s_take (auth, c, t + 5000, &limit) == -1 && limit.reset_s == 1);
    assert (s_take (auth, c, t + 5004, &limit) == 0); //  3003 ms a request at 333/1000
    gw_rates_destroy (&auth);

    //  More active keys than a report holds: the busiest go.
    auth = gw_rates_new (NULL, NULL);
    auth->window_mono = t;
    for (int i = 0; i < S_REPORT_MAX + 4; i++) {
        char key_id[32];
        snprintf (key_id, sizeof key_id, "key_%d", i);
        s_bucket_set (auth, key_id, 20, t);
        s_bucket_t *bucket = zhashx_lookup (auth->buckets, key_id);
        for (int n = 0; n < (i < 4 ? 1 : 2); n++)
            s_take (auth, bucket, t, &limit);
    }
    report = s_report_new (auth, t + 250);
    body = sbx_msg_rate_report (report);
    assert (body->keys.count == S_REPORT_MAX);
    for (size_t i = 0; i < body->keys.count; i++)
        assert (body->keys.items[i].demand == 2);
    sbx_msg_destroy (&report);
    gw_rates_destroy (&auth);
}
