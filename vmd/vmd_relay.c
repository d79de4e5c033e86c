/*  vmd_relay - see vmd_relay.h */
#include "vmd_relay.h"
#include "sbx_dqproxy.h"
#include "vmd_guest.h"

#include <stdatomic.h>

#define S_WORDS (65536 / 64)

struct _vmd_relay_t {
    char *address; //  vmd.relay, or NULL
    char *bind;    //  every address, its port
    sbx_dqproxy_t *proxy;
    bool failed; //  the listener could not start: said once
    //  The forwards' host ports, one bit each: written by the loop, read by the relay
    //  thread (each word on its own: a port that stays admitted is never cleared).
    _Atomic uint64_t admitted[S_WORDS];
    uint64_t next[S_WORDS]; //  the loop's scratch
};

vmd_relay_t *vmd_relay_new (sbx_config_t *config)
{
    vmd_relay_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    const char *address = sbx_config_get (config, "vmd.relay", NULL);
    const char *colon = address ? strrchr (address, ':') : NULL;
    if (address && *address && colon) {
        self->address = strdup (address);
        self->bind = zsys_sprintf ("0.0.0.0:%s", colon + 1);
        if (!self->address || !self->bind)
            vmd_relay_destroy (&self);
    }
    return self;
}

void vmd_relay_destroy (vmd_relay_t **self_p)
{
    vmd_relay_t *self = *self_p;
    if (!self)
        return;
    sbx_dqproxy_destroy (&self->proxy);
    free (self->address);
    free (self->bind);
    free (self);
    *self_p = NULL;
}

bool vmd_relay_admits (vmd_relay_t *self, int host_port)
{
    if (host_port <= 0 || host_port > 65535)
        return false;
    uint64_t word = atomic_load_explicit (&self->admitted[host_port / 64], memory_order_acquire);
    return (word >> (host_port % 64)) & 1;
}

//  The relay thread's question: the line is a host port; admitted ones go to loopback.
static char *s_route (const char *line, void *arg)
{
    vmd_relay_t *self = arg;
    char *end = NULL;
    long port = strtol (line, &end, 10);
    if (!*line || !end || *end || port <= 0 || port > 65535 || !vmd_relay_admits (self, (int) port))
        return NULL;
    return zsys_sprintf ("%s:%ld", VMD_GUEST_FWD_HOST, port);
}

void vmd_relay_tick (vmd_relay_t *self, const char *key, zhashx_t *guests)
{
    if (!self->address)
        return;
    if (!self->proxy && key && !self->failed) {
        unsigned char bytes[SBX_DQPROXY_KEY_SIZE];
        if (sbx_dqproxy_key_hex (key, bytes) == 0)
            self->proxy = sbx_dqproxy_new (bytes, sizeof bytes);
        sbx_secret_wipe_bytes (bytes, sizeof bytes);
        if (self->proxy && sbx_dqproxy_listen_routed (self->proxy, self->bind, s_route, self)) {
            sbx_dqproxy_destroy (&self->proxy);
            sbx_error ("vmd.relay = %s: cannot listen on %s; gateways on other hosts cannot "
                       "reach this host's published ports",
                       self->address, self->bind);
            self->failed = true;
        } else if (self->proxy)
            sbx_info ("published ports are relayed to gateways on other hosts at %s (vmd.relay)",
                      self->address);
    }
    memset (self->next, 0, sizeof self->next);
    int ports[16];
    for (vmd_guest_t *guest = zhashx_first (guests); guest; guest = zhashx_next (guests)) {
        size_t count = vmd_guest_forwards (guest, ports, 16);
        for (size_t i = 0; i < count && i < 16; i++)
            if (ports[i] > 0 && ports[i] <= 65535)
                self->next[ports[i] / 64] |= 1ull << (ports[i] % 64);
    }
    for (size_t i = 0; i < S_WORDS; i++)
        if (atomic_load_explicit (&self->admitted[i], memory_order_relaxed) != self->next[i])
            atomic_store_explicit (&self->admitted[i], self->next[i], memory_order_release);
}

void vmd_relay_test (bool verbose)
{
    (void) verbose;
    //  Unset: idle, admits nothing.
    char dir[] = "/tmp/vmd_relay_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    vmd_relay_t *relay = vmd_relay_new (config);
    assert (relay && !relay->address && !vmd_relay_admits (relay, 80));
    zhashx_t *guests = zhashx_new ();
    vmd_relay_tick (relay, "00", guests);
    assert (!relay->proxy);
    vmd_relay_destroy (&relay);
    //  The route: a host port the relay admits, nothing else.
    assert (sbx_config_set (config, "vmd.relay", "127.0.0.1:1") == 0);
    relay = vmd_relay_new (config);
    assert (relay && relay->address && streq (relay->bind, "0.0.0.0:1"));
    atomic_store (&relay->admitted[40000 / 64], 1ull << (40000 % 64));
    char *target = s_route ("40000", relay);
    assert (target && streq (target, "127.0.0.1:40000"));
    free (target);
    const char *refused[] = {"40001", "", "40000x", "-1", "65536", "0", "99999999999999999999"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        assert (!s_route (refused[i], relay));
    //  A tick with no guests withdraws it.
    vmd_relay_tick (relay, NULL, guests);
    assert (!vmd_relay_admits (relay, 40000));
    vmd_relay_destroy (&relay);
    zhashx_destroy (&guests);
    sbx_config_destroy (&config);
    rmdir (dir);
}
