/*  gw_auth - see gw_auth.h */
#include "gw_auth.h"
#include "sbx_idmap.h"
#include "sbx_tapreader.h"
#include "sbx_urls.h"

#include <assert.h>
#include <jansson.h>

//  How long a good key is trusted without asking the broker again (gateway.auth_cache_ms);
//  revocations reach the cache through the tap, so this bounds only the broker's load.
#define S_CACHE_MS 5000
//  OAuth access tokens: at most a second, so a token the tap could not tell about (a
//  tap that fell behind unnoticed) is still asked again soon.
#define S_OAUTH_CACHE_MS 1000
#define S_CACHE_MAX      10000
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

typedef struct {
    sbx_caller_t *caller;
    uint64_t until_mono; //  trusted until then
} s_entry_t;

//  One check waiting for the broker.
typedef struct {
    gw_auth_t *auth;
    uint64_t serial;
    uint64_t rid;
    char hash[65];
    uint64_t forgets; //  self->forgets when it was asked: a later forget makes it stale
    gw_auth_fn *fn;
    void *arg;
} s_check_t;

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

struct gw_auth_t {
    zhashx_t *buckets; //  key id → s_bucket_t; they outlive cache entries
    sbx_peer_t *peer;
    char *base_url;
    char *mcp_url;     //  the audience OAuth access tokens must be bound to
    zhashx_t *cache;   //  key hash → s_entry_t
    zhashx_t *pending; //  serial → s_check_t, so destroy can cancel them
    uint64_t next_serial;
    sbx_tapreader_t *reader; //  key.revoked and oauth.revoked, from every gateway and the CLI
    bool welcomed;           //  the broker's welcome, as last seen
    uint64_t forgets;        //  counts forgets, so an answer in flight across one is not kept
    uint64_t cache_ms;       //  gateway.auth_cache_ms
    //  Rate sharing with the other gateways (brk_rates.h).
    zloop_t *loop;
    int report_timer;      //  -1 while not started
    uint64_t report_ms;    //  gateway.rate_report_ms
    uint64_t window_mono;  //  when the demand being counted began
    bool reporting;        //  a report is in flight (report_rid once sent)
    uint64_t report_rid;   //  to cancel it
    uint64_t gateways;     //  as the broker last counted them; 1 before it said
    uint64_t counted_mono; //  when it last said
};

sbx_caller_t *gw_auth_caller_dup (const sbx_caller_t *caller)
{
    if (!caller)
        return NULL;
    sbx_caller_t *copy = calloc (1, sizeof *copy);
    if (!copy)
        return NULL;
    copy->kind = caller->kind;
    copy->preset = caller->preset;
    if (sbx_str_set (&copy->account_id, caller->account_id) ||
        sbx_str_set (&copy->key_id, caller->key_id))
        gw_auth_caller_destroy (&copy);
    return copy;
}

void gw_auth_caller_destroy (sbx_caller_t **caller_p)
{
    if (!caller_p || !*caller_p)
        return;
    free ((*caller_p)->account_id);
    free ((*caller_p)->key_id);
    free (*caller_p);
    *caller_p = NULL;
}

static void s_entry_free (void **item_p)
{
    s_entry_t *entry = *item_p;
    if (entry) {
        gw_auth_caller_destroy (&entry->caller);
        free (entry);
    }
    *item_p = NULL;
}

static void s_bucket_free (void **item)
{
    free (*item);
    *item = NULL;
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    //  Both name the key (or the OAuth connection) as the event's subject.
    if (event->subject && event->type &&
        (streq (event->type, "key.revoked") || streq (event->type, "oauth.revoked")))
        gw_auth_forget_key ((gw_auth_t *) arg, event->subject);
    return 0;
}

//  A setting in milliseconds, min to max; fallback (and a warning) when it is not one.
static uint64_t s_ms_setting (sbx_config_t *config, const char *key, uint64_t fallback,
                              uint64_t min, uint64_t max)
{
    const char *text = config ? sbx_config_get (config, key, NULL) : NULL;
    if (!text)
        return fallback;
    char *end;
    unsigned long long ms = strtoull (text, &end, 10);
    if (*end || *text == '-' || ms < min || ms > max) {
        sbx_warn ("%s: '%s' is not %llu-%llu milliseconds: %llu", key, text,
                  (unsigned long long) min, (unsigned long long) max,
                  (unsigned long long) fallback);
        return fallback;
    }
    return ms;
}

gw_auth_t *gw_auth_new (sbx_config_t *config, sbx_peer_t *peer)
{
    gw_auth_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->cache_ms = s_ms_setting (config, "gateway.auth_cache_ms", S_CACHE_MS, 0, 3600000);
    self->report_ms = s_ms_setting (config, "gateway.rate_report_ms", S_REPORT_MS, 10, 10000);
    self->report_timer = -1;
    self->gateways = 1;
    self->base_url = config ? sbx_urls_base (config) : strdup ("https://localhost:8443");
    if (self->base_url && asprintf (&self->mcp_url, "%s/mcp", self->base_url) < 0)
        self->mcp_url = NULL;
    self->cache = zhashx_new ();
    self->pending = sbx_idmap_new ();
    self->buckets = zhashx_new ();
    if (peer)
        self->reader = sbx_tapreader_new (config, peer, SBX_TAPREADER_NOW, s_on_event, self);
    if (!self->base_url || !self->mcp_url || !self->cache || !self->pending || !self->buckets ||
        (peer && !self->reader)) {
        gw_auth_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->cache, s_entry_free);
    zhashx_set_destructor (self->buckets, s_bucket_free);
    self->next_serial = 1;
    return self;
}

void gw_auth_destroy (gw_auth_t **self_p)
{
    assert (self_p);
    gw_auth_t *self = *self_p;
    if (!self)
        return;
    if (self->pending) {
        for (s_check_t *check = zhashx_first (self->pending); check;
             check = zhashx_next (self->pending)) {
            if (self->peer && check->rid)
                sbx_peer_cancel (self->peer, check->rid);
            free (check);
        }
        zhashx_destroy (&self->pending);
    }
    if (self->loop && self->report_timer != -1)
        zloop_timer_end (self->loop, self->report_timer);
    if (self->peer && self->report_rid)
        sbx_peer_cancel (self->peer, self->report_rid);
    sbx_tapreader_destroy (&self->reader);
    zhashx_destroy (&self->cache);
    zhashx_destroy (&self->buckets);
    free (self->base_url);
    free (self->mcp_url);
    free (self);
    *self_p = NULL;
}

static int s_on_report_timer (zloop_t *loop, int timer_id, void *arg);

int gw_auth_start (gw_auth_t *self, zloop_t *loop)
{
    assert (self);
    if (!self->reader)
        return 0; //  self-tests: no broker to follow or to report to
    self->loop = loop;
    self->window_mono = sbx_clock_mono_ms ();
    self->report_timer = zloop_timer (loop, (size_t) self->report_ms, 0, s_on_report_timer, self);
    if (self->report_timer == -1)
        return -1;
    return sbx_tapreader_start (self->reader, loop);
}

void gw_auth_forget_key (gw_auth_t *self, const char *key_id)
{
    assert (self);
    self->forgets++;
    if (!key_id)
        return;
    //  Collected first: a zhashx must not change while it is walked.
    zlistx_t *stale = zlistx_new ();
    for (s_entry_t *entry = zhashx_first (self->cache); entry && stale;
         entry = zhashx_next (self->cache))
        if (entry->caller && entry->caller->key_id && streq (entry->caller->key_id, key_id))
            zlistx_add_end (stale, (void *) zhashx_cursor (self->cache));
    if (!stale) {
        zhashx_purge (self->cache); //  out of memory: forget everything rather than too little
        return;
    }
    for (const char *hash = zlistx_first (stale); hash; hash = zlistx_next (stale))
        zhashx_delete (self->cache, hash);
    zlistx_destroy (&stale);
}

//  The cache may answer only while nothing can have been revoked unseen: the tap reader
//  follows the log and the broker it follows is the one answering. Otherwise every
//  credential is asked again (a broker restart, a tap that fell behind).
static bool s_cache_trusted (gw_auth_t *self)
{
    if (!self->reader)
        return true; //  self-tests: no broker, no tap
    bool welcomed = sbx_peer_welcomed (self->peer);
    if (welcomed != self->welcomed) {
        zhashx_purge (self->cache);
        self->forgets++;
        self->welcomed = welcomed;
    }
    return welcomed && sbx_tapreader_caught_up (self->reader);
}

const char *gw_auth_base_url (gw_auth_t *self)
{
    return self->base_url;
}

const char *gw_auth_bearer (const char *header)
{
    if (!header)
        return NULL;
    while (*header == ' ')
        header++;
    if (strncasecmp (header, "Bearer ", 7) != 0)
        return NULL;
    const char *token = header + 7;
    while (*token == ' ')
        token++;
    return *token ? token : NULL;
}

//  --------------------------------------------------------------------------
//  Key rates: a token bucket per key, refilled at this gateway's share of the plan.

static uint64_t s_hold_ms (gw_auth_t *self)
{
    return self->report_ms * 4 > S_HOLD_MS ? self->report_ms * 4 : S_HOLD_MS;
}

//  This gateway's thousandths of the key's rate now: the broker's share while the key
//  has requests, else the even split over the gateways the broker last counted (1000
//  for a single gateway: exactly the plan). A lapsed share is dropped here.
static uint64_t s_share (gw_auth_t *self, s_bucket_t *bucket, uint64_t now)
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
static uint64_t s_refill (gw_auth_t *self, s_bucket_t *bucket, uint64_t now)
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
static void s_bucket_set (gw_auth_t *self, const char *key_id, uint64_t rate, uint64_t now)
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

static int s_take (gw_auth_t *self, s_bucket_t *bucket, uint64_t now, gw_auth_limit_t *limit)
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
static sbx_msg_t *s_report_new (gw_auth_t *self, uint64_t now)
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
static void s_apply (gw_auth_t *self, const sbx_rate_report_ok_t *ok, uint64_t now)
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
    gw_auth_t *self = arg;
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
    gw_auth_t *self = arg;
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

static void s_rate_counts (gw_auth_t *self, uint64_t now, uint64_t *gateways, uint64_t *keys,
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

void gw_auth_rate_counts (gw_auth_t *self, uint64_t *gateways, uint64_t *keys, uint64_t *shared)
{
    assert (self && gateways && keys && shared);
    s_rate_counts (self, sbx_clock_mono_ms (), gateways, keys, shared);
}

static void s_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_check_t *check = arg;
    gw_auth_t *self = check->auth;
    zhashx_delete (self->pending, (void *) (uintptr_t) check->serial);
    sbx_msg_t *reply = *reply_p;
    sbx_auth_key_ok_t *ok = reply->type == SBX_MSG_AUTH_KEY_OK ? sbx_msg_auth_key_ok (reply) : NULL;
    bool oauth = ok && ok->caller && ok->caller->kind == SBX_CALLER_KIND_OAUTH;
    if (oauth && (!ok->resource || !streq (ok->resource, self->mcp_url))) {
        //  A token for another resource (RFC 8707 audience) is not good here.
        check->fn (NULL, SBX_E_UNAUTHENTICATED, "this access token was issued for another resource",
                   check->arg);
    } else if (ok && ok->caller) {
        s_entry_t *entry = calloc (1, sizeof *entry);
        uint64_t now = sbx_clock_now_ms ();
        uint64_t ttl = oauth ? S_OAUTH_CACHE_MS : self->cache_ms;
        if (ttl > self->cache_ms)
            ttl = self->cache_ms;
        if (ok->expires_ms && ok->expires_ms < now + ttl)
            ttl = ok->expires_ms > now ? ok->expires_ms - now : 0;
        //  A revocation seen while this answer was on its way may concern it: use it for
        //  this request (it was asked before), keep it for none after.
        if (entry && ttl && check->forgets == self->forgets && s_cache_trusted (self)) {
            entry->caller = gw_auth_caller_dup (ok->caller);
            entry->until_mono = sbx_clock_mono_ms () + ttl;
            if (zhashx_size (self->cache) >= S_CACHE_MAX)
                zhashx_purge (self->cache);
            zhashx_update (self->cache, check->hash, entry);
        } else
            free (entry);
        if (ok->caller->key_id)
            s_bucket_set (self, ok->caller->key_id, ok->requests_per_second, sbx_clock_mono_ms ());
        check->fn (ok->caller, SBX_OK, NULL, check->arg);
    } else if (reply->type == SBX_MSG_ERROR)
        check->fn (NULL, sbx_msg_error (reply)->code, sbx_msg_error (reply)->message, check->arg);
    else
        check->fn (NULL, SBX_E_INTERNAL, "unexpected answer to auth.key", check->arg);
    free (check);
}

void gw_auth_check (gw_auth_t *self, const char *token, gw_auth_fn *fn, void *arg)
{
    assert (self && fn);
    //  Keys are "sbx_" + 43 base62: anything else is refused without asking.
    for (const char *p = token; p && *p; p++)
        if ((unsigned char) *p <= 0x20 || (unsigned char) *p >= 0x7f) {
            //  Not a wrong key but a malformed header (RFC 6750 invalid_request).
            fn (NULL, SBX_E_INVALID_ARGUMENT,
                "the Authorization header's token holds spaces, control characters or bytes "
                "beyond ASCII; an sbx credential is sbx_ followed by letters, digits and _",
                arg);
            return;
        }
    if (!token || strncmp (token, "sbx_", 4) != 0 || strlen (token) > 128) {
        fn (NULL, SBX_E_UNAUTHENTICATED, "this API key is not valid", arg);
        return;
    }
    char hash[65];
    sbx_secret_hash (token, hash);
    s_entry_t *entry = s_cache_trusted (self) ? zhashx_lookup (self->cache, hash) : NULL;
    if (entry && entry->until_mono > sbx_clock_mono_ms () && entry->caller) {
        fn (entry->caller, SBX_OK, NULL, arg);
        return;
    }
    if (entry)
        zhashx_delete (self->cache, hash);
    s_check_t *check = calloc (1, sizeof *check);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_AUTH_KEY);
    if (!check || !request || sbx_str_set (&sbx_msg_auth_key (request)->key, token)) {
        free (check);
        sbx_msg_destroy (&request);
        fn (NULL, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    check->auth = self;
    check->serial = self->next_serial++;
    memcpy (check->hash, hash, sizeof hash);
    check->fn = fn;
    check->arg = arg;
    check->forgets = self->forgets;
    zhashx_insert (self->pending, (void *) (uintptr_t) check->serial, check);
    uint64_t serial = check->serial;
    uint64_t rid = sbx_peer_request (self->peer, &request, 10000, s_on_reply, check);
    //  The reply may already have come (a send that failed is answered at once).
    s_check_t *still = zhashx_lookup (self->pending, (void *) (uintptr_t) serial);
    if (still)
        still->rid = rid;
}

int gw_auth_take (gw_auth_t *self, const sbx_caller_t *caller, gw_auth_limit_t *limit)
{
    memset (limit, 0, sizeof *limit);
    s_bucket_t *bucket =
        caller && caller->key_id ? zhashx_lookup (self->buckets, caller->key_id) : NULL;
    if (!bucket || bucket->rate == 0)
        return 0;
    return s_take (self, bucket, sbx_clock_mono_ms (), limit);
}

void gw_auth_rate_headers (gw_request_t *req, const gw_auth_limit_t *limit)
{
    char value[32];
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->limit);
    gw_request_add_header (req, "RateLimit-Limit", value);
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->remaining);
    gw_request_add_header (req, "RateLimit-Remaining", value);
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->reset_s);
    gw_request_add_header (req, "RateLimit-Reset", value);
    gw_request_add_header (req, "Retry-After", value);
}

void gw_auth_respond_401 (gw_auth_t *self, gw_request_t *req)
{
    char header[600];
    snprintf (header, sizeof header,
              "Bearer resource_metadata=\"%s/.well-known/oauth-protected-resource/mcp\", "
              "scope=\"sbx\"",
              self->base_url);
    gw_request_add_header (req, "WWW-Authenticate", header);
    gw_request_add_header (req, "Cache-Control", "no-store");
    //  Keys sorted, as the reference server sends it.
    const char *body = "{\"error\":{\"code\":-32001,\"message\":\"Unauthorized: send "
                       "Authorization: Bearer <sbx API key>, or sign in with "
                       "OAuth.\"},\"id\":null,\"jsonrpc\":\"2.0\"}";
    gw_request_respond (req, 401, "application/json", body, strlen (body));
}

//  --------------------------------------------------------------------------
//  Self test: what needs no broker.

typedef struct {
    int *calls;
    sbx_code_t *code;
} s_probe_t;

static void s_probe (const sbx_caller_t *caller, sbx_code_t c, const char *message, void *arg)
{
    (void) message;
    s_probe_t *probe = arg;
    assert (caller == NULL);
    (*probe->calls)++;
    *probe->code = c;
}

//  Takes requests from bucket at now until one is refused; returns how many went.
static int s_test_burst (gw_auth_t *auth, s_bucket_t *bucket, uint64_t now)
{
    gw_auth_limit_t limit;
    int count = 0;
    while (count < 100000 && s_take (auth, bucket, now, &limit) == 0)
        count++;
    return count;
}

//  The broker's answer: gateways, and one key's share.
static void s_test_answer (gw_auth_t *auth, uint64_t gateways, const char *key_id, uint64_t share,
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

//  Key rates without a broker: the test plays its answers, on a clock it moves.
static void s_test_rates (void)
{
    gw_auth_t *auth = gw_auth_new (NULL, NULL);
    assert (auth);
    uint64_t t = 1000000;
    auth->window_mono = t;
    gw_auth_limit_t limit;

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
    gw_auth_destroy (&auth);

    //  More active keys than a report holds: the busiest go.
    auth = gw_auth_new (NULL, NULL);
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
    gw_auth_destroy (&auth);
}

void gw_auth_test (bool verbose)
{
    (void) verbose;
    assert (streq (gw_auth_bearer ("Bearer sbx_abc"), "sbx_abc"));
    assert (streq (gw_auth_bearer ("bearer   sbx_abc"), "sbx_abc"));
    assert (gw_auth_bearer ("Basic dXNlcjpwYXNz") == NULL);
    assert (gw_auth_bearer ("Bearer ") == NULL);
    assert (gw_auth_bearer (NULL) == NULL);

    //  The base URL follows listen, domain and tls like `sbx status`.
    char dir[] = "/tmp/gw_auth_test_XXXXXX";
    assert (mkdtemp (dir));
    char path[300];
    snprintf (path, sizeof path, "%s/sbx.conf", dir);
    FILE *file = fopen (path, "w");
    assert (file);
    fprintf (file, "listen = 0.0.0.0:443\ndomain = sbx.example.com\n");
    fclose (file);
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    gw_auth_t *auth = gw_auth_new (config, NULL);
    assert (auth);
    assert (streq (gw_auth_base_url (auth), "https://sbx.example.com"));
    gw_auth_destroy (&auth);
    sbx_config_destroy (&config);
    file = fopen (path, "w");
    fprintf (file, "listen = 127.0.0.1:8443\n");
    fclose (file);
    config = sbx_config_new (dir);
    auth = gw_auth_new (config, NULL);
    assert (streq (gw_auth_base_url (auth), "https://localhost:8443"));

    //  Tokens that can't be keys are refused at once, without the broker.
    int calls = 0;
    sbx_code_t code = SBX_OK;
    s_probe_t probe = {&calls, &code};
    gw_auth_check (auth, "not-a-key", s_probe, &probe);
    assert (calls == 1 && code == SBX_E_UNAUTHENTICATED);
    //  Bytes no credential has are the request's fault, not a wrong key.
    gw_auth_check (auth, "sbx_\xff\xfe", s_probe, &probe);
    assert (calls == 2 && code == SBX_E_INVALID_ARGUMENT);
    gw_auth_check (auth, "sbx_a\x01b", s_probe, &probe);
    assert (calls == 3 && code == SBX_E_INVALID_ARGUMENT);
    gw_auth_destroy (&auth);
    sbx_config_destroy (&config);
    s_test_rates ();
    zsys_dir_delete ("%s/run", dir);
    zsys_dir_delete ("%s/logs", dir);
    zsys_dir_delete ("%s/keys", dir);
    unlink (path);
    rmdir (dir);
}
