/*  gw_ratelimit - see gw_ratelimit.h */
#include "gw_ratelimit.h"

#include <arpa/inet.h>
#include <assert.h>

#define S_MAX_KEYS 10000

typedef struct {
    uint64_t start; //  when the window opened
    size_t count;
} s_window_t;

struct gw_ratelimit_t {
    size_t limit;
    uint64_t window_ms;
    zhashx_t *windows; //  key → s_window_t
};

static void s_window_free (void **item)
{
    free (*item);
    *item = NULL;
}

gw_ratelimit_t *gw_ratelimit_new (size_t limit, uint64_t window_ms)
{
    gw_ratelimit_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->limit = limit;
    self->window_ms = window_ms ? window_ms : 1;
    self->windows = zhashx_new ();
    if (!self->windows) {
        free (self);
        return NULL;
    }
    zhashx_set_destructor (self->windows, s_window_free);
    return self;
}

void gw_ratelimit_destroy (gw_ratelimit_t **self_p)
{
    assert (self_p);
    gw_ratelimit_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->windows);
    free (self);
    *self_p = NULL;
}

//  Drops ended windows; all of them if none has ended.
static void s_prune (gw_ratelimit_t *self, uint64_t now)
{
    zlistx_t *ended = zlistx_new ();
    if (ended) {
        for (s_window_t *w = zhashx_first (self->windows); w; w = zhashx_next (self->windows))
            if (now - w->start >= self->window_ms)
                zlistx_add_end (ended, (void *) zhashx_cursor (self->windows));
        for (const char *key = zlistx_first (ended); key; key = zlistx_next (ended))
            zhashx_delete (self->windows, key);
        zlistx_destroy (&ended);
    }
    if (zhashx_size (self->windows) >= S_MAX_KEYS)
        zhashx_purge (self->windows);
}

int gw_ratelimit_take (gw_ratelimit_t *self, const char *key, uint64_t now_mono, uint64_t *retry_ms)
{
    assert (self && key);
    if (self->limit == 0)
        return 0;
    s_window_t *w = zhashx_lookup (self->windows, key);
    if (w && now_mono - w->start >= self->window_ms) {
        w->start = now_mono; //  the window ended: a fresh one
        w->count = 0;
    }
    if (!w) {
        if (zhashx_size (self->windows) >= S_MAX_KEYS)
            s_prune (self, now_mono);
        w = calloc (1, sizeof *w);
        if (!w)
            return 0; //  out of memory: let it through rather than refuse everyone
        w->start = now_mono;
        zhashx_insert (self->windows, key, w);
    }
    if (w->count >= self->limit) {
        if (retry_ms)
            *retry_ms = w->start + self->window_ms - now_mono;
        return -1;
    }
    w->count++;
    return 0;
}

void gw_ratelimit_address_key (const char *address, char *key, size_t size)
{
    assert (address && key && size);
    struct in6_addr v6;
    char text[INET6_ADDRSTRLEN];
    if (strchr (address, ':') && inet_pton (AF_INET6, address, &v6) == 1) {
        memset (v6.s6_addr + 8, 0, 8);
        if (inet_ntop (AF_INET6, &v6, text, sizeof text)) {
            snprintf (key, size, "%s/64", text);
            return;
        }
    }
    snprintf (key, size, "%s", address);
}

//  --------------------------------------------------------------------------
//  Self test: a window per key, its end, the bound on keys.

void gw_ratelimit_test (bool verbose)
{
    (void) verbose;
    gw_ratelimit_t *limit = gw_ratelimit_new (3, 60000);
    assert (limit);
    uint64_t retry = 0;
    for (int i = 0; i < 3; i++)
        assert (gw_ratelimit_take (limit, "192.0.2.1", 1000 + (uint64_t) i, &retry) == 0);
    assert (gw_ratelimit_take (limit, "192.0.2.1", 11000, &retry) == -1);
    assert (retry == 50000);
    assert (gw_ratelimit_take (limit, "192.0.2.2", 11000, NULL) == 0); //  its own window
    //  The window ends: three more.
    assert (gw_ratelimit_take (limit, "192.0.2.1", 61000, &retry) == 0);
    assert (gw_ratelimit_take (limit, "192.0.2.1", 61001, &retry) == 0);
    assert (gw_ratelimit_take (limit, "192.0.2.1", 61002, &retry) == 0);
    assert (gw_ratelimit_take (limit, "192.0.2.1", 61003, &retry) == -1 && retry == 59997);
    //  A spray of keys stays bounded.
    char key[32];
    for (int i = 0; i < S_MAX_KEYS + 10; i++) {
        snprintf (key, sizeof key, "10.0.%d.%d", i / 256, i % 256);
        assert (gw_ratelimit_take (limit, key, 70000, NULL) == 0);
    }
    assert (zhashx_size (limit->windows) <= S_MAX_KEYS);
    gw_ratelimit_destroy (&limit);
    gw_ratelimit_destroy (&limit);
    //  Addresses: IPv6 by its /64.
    char key6[64];
    gw_ratelimit_address_key ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", key6, sizeof key6);
    assert (streq (key6, "2001:db8:1:2::/64"));
    gw_ratelimit_address_key ("2001:db8:1:2::1", key6, sizeof key6);
    assert (streq (key6, "2001:db8:1:2::/64"));
    gw_ratelimit_address_key ("::1", key6, sizeof key6);
    assert (streq (key6, "::/64"));
    gw_ratelimit_address_key ("192.0.2.7", key6, sizeof key6);
    assert (streq (key6, "192.0.2.7"));
    gw_ratelimit_address_key ("", key6, sizeof key6);
    assert (streq (key6, ""));
    //  0 allows everything.
    limit = gw_ratelimit_new (0, 60000);
    for (int i = 0; i < 100; i++)
        assert (gw_ratelimit_take (limit, "a", 0, NULL) == 0);
    gw_ratelimit_destroy (&limit);
}
