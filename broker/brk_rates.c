/*  brk_rates - see brk_rates.h */
#include "brk_rates.h"

#include <assert.h>

//  A gateway's figure for a key counts this long after its report (or four of its
//  windows when those are longer): a gateway whose clients left stops taking a share.
#define S_FRESH_MS 1000
//  Keys followed at once; a report naming more gets the even split for the rest.
#define S_KEYS_MAX 100000
//  How often stale figures and keys nobody reports are swept out.
#define S_SWEEP_MS 1000
//  Longest window taken from a report: a longer one would keep a figure for minutes.
#define S_WINDOW_MAX_MS 60000

//  One gateway's latest demand for one key.
typedef struct {
    char *peer;           //  its routing id (hex)
    uint64_t milli_per_s; //  demand, in 1/1000 requests per second
    uint64_t until_mono;  //  counts until then
} s_figure_t;

typedef struct {
    uint64_t rate; //  the plan's requests per second, as last reported
    s_figure_t *figures;
    size_t count;
} s_key_t;

struct brk_rates_t {
    brk_registry_t *registry; //  borrowed
    zhashx_t *keys;           //  key id → s_key_t
    uint64_t swept_mono;
};

static void s_key_free (void **item_p)
{
    s_key_t *key = *item_p;
    if (key) {
        for (size_t i = 0; i < key->count; i++)
            free (key->figures[i].peer);
        free (key->figures);
        free (key);
    }
    *item_p = NULL;
}

brk_rates_t *brk_rates_new (brk_registry_t *registry)
{
    brk_rates_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->registry = registry;
    self->keys = zhashx_new ();
    if (!self->keys) {
        free (self);
        return NULL;
    }
    zhashx_set_destructor (self->keys, s_key_free);
    return self;
}

void brk_rates_destroy (brk_rates_t **self_p)
{
    assert (self_p);
    brk_rates_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->keys);
    free (self);
    *self_p = NULL;
}

static void s_drop_figure (s_key_t *key, size_t i)
{
    free (key->figures[i].peer);
    key->figures[i] = key->figures[--key->count];
}

//  Drops figures that are too old (now_mono) or whose peer is `peer` (when not NULL).
static void s_prune (s_key_t *key, uint64_t now_mono, const char *peer)
{
    for (size_t i = 0; i < key->count;)
        if (key->figures[i].until_mono <= now_mono || (peer && streq (key->figures[i].peer, peer)))
            s_drop_figure (key, i);
        else
            i++;
}

//  Drops every key (with its figures) that no gateway reported recently.
static void s_sweep (brk_rates_t *self, uint64_t now_mono, const char *peer)
{
    zlistx_t *empty = zlistx_new ();
    for (s_key_t *key = zhashx_first (self->keys); key; key = zhashx_next (self->keys)) {
        s_prune (key, now_mono, peer);
        if (key->count == 0 && empty)
            zlistx_add_end (empty, (void *) zhashx_cursor (self->keys));
    }
    //  Deleted after the walk: a zhashx must not change while it is walked.
    for (const char *id = empty ? zlistx_first (empty) : NULL; id; id = zlistx_next (empty))
        zhashx_delete (self->keys, id);
    zlistx_destroy (&empty);
    self->swept_mono = now_mono;
}

//  Records peer's demand for one key and returns its share in thousandths.
static uint64_t s_share (brk_rates_t *self, const char *peer, const sbx_rate_demand_t *demand,
                         uint64_t window_ms, size_t gateways, uint64_t now_mono)
{
    if (demand->rate == 0)
        return 1000; //  no limit to share
    s_key_t *key = zhashx_lookup (self->keys, demand->key_id);
    if (!key && zhashx_size (self->keys) < S_KEYS_MAX && (key = calloc (1, sizeof *key)))
        zhashx_insert (self->keys, demand->key_id, key);
    if (!key)
        return 1000 / gateways; //  too many keys followed: the even split, as a gateway guesses
    key->rate = demand->rate;
    s_prune (key, now_mono, NULL);
    s_figure_t *mine = NULL;
    for (size_t i = 0; i < key->count && !mine; i++)
        if (streq (key->figures[i].peer, peer))
            mine = &key->figures[i];
    if (!mine) {
        s_figure_t *grown = realloc (key->figures, (key->count + 1) * sizeof *grown);
        char *name = strdup (peer);
        if (grown)
            key->figures = grown;
        if (!grown || !name) {
            free (name);
            return 1000 / gateways;
        }
        mine = &key->figures[key->count++];
        mine->peer = name;
    }
    //  Per second, so gateways with different report periods compare.
    mine->milli_per_s = demand->demand * 1000 * 1000 / window_ms;
    mine->until_mono = now_mono + (window_ms * 4 > S_FRESH_MS ? window_ms * 4 : S_FRESH_MS);
    double sum = 0;
    for (size_t i = 0; i < key->count; i++)
        sum += (double) key->figures[i].milli_per_s;
    double most = sum > (double) key->rate * 1000 ? sum : (double) key->rate * 1000;
    double n = (double) key->count;
    double share = 0.9 * (double) mine->milli_per_s / most + (1 - 0.9 * sum / most) / n;
    uint64_t milli = (uint64_t) (share * 1000 + 0.5);
    return milli < 1 ? 1 : milli > 1000 ? 1000 : milli;
}

static size_t s_gateways (brk_rates_t *self)
{
    size_t count = 0;
    for (brk_peer_t *p = brk_registry_first (self->registry); p;
         p = brk_registry_next (self->registry))
        count += p->role == SBX_ROLE_GATEWAY;
    return count;
}

static sbx_msg_t *s_report (brk_rates_t *self, const char *peer, size_t gateways,
                            sbx_msg_t *request, uint64_t now_mono)
{
    sbx_rate_report_t *report = sbx_msg_rate_report (request);
    uint64_t window_ms = report->window_ms;
    if (window_ms < 1)
        window_ms = 1;
    if (window_ms > S_WINDOW_MAX_MS)
        window_ms = S_WINDOW_MAX_MS;
    if (gateways < 1)
        gateways = 1; //  the one reporting
    if (now_mono - self->swept_mono >= S_SWEEP_MS)
        s_sweep (self, now_mono, NULL);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_RATE_REPORT_OK);
    if (!reply)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    sbx_rate_report_ok_t *ok = sbx_msg_rate_report_ok (reply);
    ok->gateways = gateways;
    for (size_t i = 0; i < report->keys.count; i++) {
        sbx_rate_share_t *share = sbx_rate_share_list_append (&ok->shares);
        if (!share || sbx_str_set (&share->key_id, report->keys.items[i].key_id)) {
            sbx_msg_destroy (&reply);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
        }
        share->share_milli =
            s_share (self, peer, &report->keys.items[i], window_ms, gateways, now_mono);
    }
    return reply;
}

sbx_msg_t *brk_rates_report (brk_rates_t *self, brk_peer_t *peer, sbx_msg_t *request)
{
    assert (self && request);
    if (!peer || peer->role != SBX_ROLE_GATEWAY)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "rate.report is answered to gateways only");
    return s_report (self, peer->routing_id, s_gateways (self), request, sbx_clock_mono_ms ());
}

void brk_rates_forget (brk_rates_t *self, const char *routing_id)
{
    assert (self);
    if (routing_id)
        s_sweep (self, 0, routing_id);
}

//  --------------------------------------------------------------------------
//  Self test: shares as gateways would get them, on a clock the test moves.

static sbx_msg_t *s_test_report (uint64_t window_ms, const char *key_id, uint64_t rate,
                                 uint64_t demand)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_RATE_REPORT);
    assert (msg);
    sbx_msg_rate_report (msg)->window_ms = window_ms;
    sbx_rate_demand_t *item = sbx_rate_demand_list_append (&sbx_msg_rate_report (msg)->keys);
    assert (item && sbx_str_set (&item->key_id, key_id) == 0);
    item->rate = rate;
    item->demand = demand;
    return msg;
}

//  peer's share of key_id after it reports demand requests in window_ms.
static uint64_t s_test_share (brk_rates_t *self, const char *peer, size_t gateways,
                              const char *key_id, uint64_t demand, uint64_t window_ms, uint64_t now)
{
    sbx_msg_t *request = s_test_report (window_ms, key_id, 20, demand);
    sbx_msg_t *reply = s_report (self, peer, gateways, request, now);
    assert (reply && reply->type == SBX_MSG_RATE_REPORT_OK);
    sbx_rate_report_ok_t *ok = sbx_msg_rate_report_ok (reply);
    assert (ok->gateways == gateways && ok->shares.count == 1);
    assert (streq (ok->shares.items[0].key_id, key_id));
    uint64_t share = ok->shares.items[0].share_milli;
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    return share;
}

static bool s_near (uint64_t value, uint64_t expect)
{
    return value + 2 >= expect && value <= expect + 2; //  rounding
}

void brk_rates_test (bool verbose)
{
    (void) verbose;
    brk_rates_t *rates = brk_rates_new (NULL);
    assert (rates);
    uint64_t t = 100000;

    //  A gateway alone gets the whole plan, busy or not, whatever the others' count.
    assert (s_test_share (rates, "a", 1, "key_1", 60, 1000, t) == 1000);
    assert (s_test_share (rates, "a", 3, "key_1", 1, 1000, t) == 1000);

    //  Two gateways, even demand over the plan (30/s each, plan 20): half each.
    assert (s_test_share (rates, "a", 2, "key_2", 30, 1000, t) == 1000); //  b not heard yet
    assert (s_test_share (rates, "b", 2, "key_2", 30, 1000, t) == 500);
    assert (s_test_share (rates, "a", 2, "key_2", 30, 1000, t) == 500);
    //  Different report periods compare per second: 6 in 200 ms is 30/s too.
    assert (s_test_share (rates, "b", 2, "key_2", 6, 200, t) == 500);

    //  Uneven demand over the plan (a 90/s, b 10/s): 0.9 d/D + 0.1/N.
    assert (s_test_share (rates, "a", 2, "key_3", 90, 1000, t) == 1000);
    assert (s_near (s_test_share (rates, "b", 2, "key_3", 10, 1000, t), 140));
    assert (s_near (s_test_share (rates, "a", 2, "key_3", 90, 1000, t), 860));
    //  Under the plan (a 8/s, b 2/s of 20): each gets its demand's 0.9 and an even part
    //  of what is left, so the shares still sum to 1000.
    assert (s_test_share (rates, "a", 2, "key_4", 8, 1000, t) == 1000);
    uint64_t b4 = s_test_share (rates, "b", 2, "key_4", 2, 1000, t);
    uint64_t a4 = s_test_share (rates, "a", 2, "key_4", 8, 1000, t);
    assert (s_near (a4, 360 + 275) && s_near (b4, 90 + 275) && s_near (a4 + b4, 1000));

    //  Three gateways: even (21/s each) and uneven (60, 30, 10 per second).
    s_test_share (rates, "a", 3, "key_5", 21, 1000, t);
    s_test_share (rates, "b", 3, "key_5", 21, 1000, t);
    assert (s_near (s_test_share (rates, "c", 3, "key_5", 21, 1000, t), 333));
    assert (s_near (s_test_share (rates, "a", 3, "key_5", 21, 1000, t), 333));
    s_test_share (rates, "a", 3, "key_6", 60, 1000, t);
    s_test_share (rates, "b", 3, "key_6", 30, 1000, t);
    uint64_t c6 = s_test_share (rates, "c", 3, "key_6", 10, 1000, t);
    uint64_t b6 = s_test_share (rates, "b", 3, "key_6", 30, 1000, t);
    uint64_t a6 = s_test_share (rates, "a", 3, "key_6", 60, 1000, t);
    assert (s_near (a6, 573) && s_near (b6, 303) && s_near (c6, 123));
    assert (s_near (a6 + b6 + c6, 1000));
    //  A gateway whose clients just arrived is not starved: a tenth over N at least.
    assert (s_test_share (rates, "c", 3, "key_6", 0, 1000, t) >= 33);

    //  Expiry (250 ms windows: a figure counts for 1 s): b stops reporting, and a second
    //  later a has the key to itself again.
    t += 10000;
    s_test_share (rates, "a", 2, "key_10", 15, 250, t);
    assert (s_test_share (rates, "b", 2, "key_10", 7, 250, t) < 500);
    assert (s_test_share (rates, "a", 2, "key_10", 15, 250, t + 999) > 500);
    assert (s_test_share (rates, "a", 2, "key_10", 15, 250, t + 999) < 1000);
    assert (s_test_share (rates, "a", 2, "key_10", 15, 250, t + 1001) == 1000);
    //  A long window keeps a figure for four windows, not one second.
    t += 2000;
    s_test_share (rates, "a", 2, "key_7", 30, 2000, t);
    assert (s_test_share (rates, "b", 2, "key_7", 30, 2000, t + 7000) == 500);
    assert (s_test_share (rates, "b", 2, "key_7", 30, 2000, t + 8001) == 1000);

    //  A peer leaving: its figures go at once, the other's share grows back.
    t += 20000;
    s_test_share (rates, "a", 2, "key_8", 30, 1000, t);
    s_test_share (rates, "a", 2, "key_8a", 30, 1000, t);
    assert (s_test_share (rates, "b", 2, "key_8", 30, 1000, t) == 500);
    brk_rates_forget (rates, "a");
    assert (zhashx_lookup (rates->keys, "key_8a") == NULL); //  only a reported it
    assert (s_test_share (rates, "b", 1, "key_8", 30, 1000, t) == 1000);

    //  The sweep drops keys nobody reports any more.
    t += 20000;
    s_test_share (rates, "b", 1, "key_9", 1, 1000, t);
    assert (zhashx_size (rates->keys) == 1 && zhashx_lookup (rates->keys, "key_9"));

    //  A key without a rate is not limited: the whole of nothing.
    sbx_msg_t *request = s_test_report (250, "key_free", 0, 50);
    sbx_msg_t *reply = s_report (rates, "b", 2, request, t);
    assert (sbx_msg_rate_report_ok (reply)->shares.items[0].share_milli == 1000);
    sbx_msg_destroy (&reply);
    brk_rates_destroy (&rates);
    assert (rates == NULL);

    //  Through the registry: only gateways are answered, and they learn how many there are.
    brk_registry_t *registry = brk_registry_new ();
    rates = brk_rates_new (registry);
    assert (registry && rates);
    zframe_t *addresses[] = {zframe_new ("\x00\x01", 2), zframe_new ("\x00\x02", 2),
                             zframe_new ("\x00\x03", 2)};
    brk_peer_t *replaced, *peers[3];
    peers[0] = brk_registry_hello (registry, addresses[0], SBX_ROLE_GATEWAY, "gw-1", 1, NULL, 0, 0,
                                   &replaced);
    peers[1] = brk_registry_hello (registry, addresses[1], SBX_ROLE_GATEWAY, "gw-2", 2, NULL, 0, 0,
                                   &replaced);
    peers[2] = brk_registry_hello (registry, addresses[2], SBX_ROLE_VMD, "host-a", 3, NULL, 4, 0,
                                   &replaced);
    assert (peers[0] && peers[1] && peers[2]);
    reply = brk_rates_report (rates, peers[2], request);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    reply = brk_rates_report (rates, NULL, request);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    reply = brk_rates_report (rates, peers[0], request);
    assert (reply->type == SBX_MSG_RATE_REPORT_OK && reply->rid == request->rid);
    assert (sbx_msg_rate_report_ok (reply)->gateways == 2);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    for (int i = 0; i < 3; i++) {
        brk_peer_t *peer = brk_registry_remove (registry, addresses[i]);
        brk_peer_destroy (&peer);
        zframe_destroy (&addresses[i]);
    }
    brk_rates_destroy (&rates);
    brk_registry_destroy (&registry);
}
