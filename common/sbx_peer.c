/*  sbx_peer - see sbx_peer.h */
#include "sbx_peer.h"
#include "sbx_secret.h"
#include "sbx_idmap.h"
#include "sbx_clock.h"
#include "sbx_curve.h"
#include "sbx_log.h"
#include "sbx_metrics.h"
#include "sbx_msg_meta.h"
#include "sbx_stall.h"

#include <assert.h>
#include <unistd.h>

typedef struct {
    uint64_t rid;
    uint64_t deadline; //  monotonic ms
    sbx_peer_reply_fn *fn;
    void *arg;
    //  With several broker endpoints (a cluster's control nodes): the request as sent,
    //  and the connection it went out on, so that a broker that stands by and did
    //  nothing with it (peer.standby) has it sent again to the one that leads.
    uint64_t gen;
    uint8_t *data;
    size_t size;
    bool resend;
} s_pending_t;

//  How long a worker waits for a welcome, and a client for any word from a broker while
//  its requests wait, before trying the next control node's broker.
#define S_SWITCH_MS 1000
//  Moves from one endpoint to the next, at most this often (answers from the one left
//  may still be arriving).
#define S_MOVE_MS 100

struct sbx_peer_t {
    sbx_config_t *config; //  borrowed
    sbx_role_t role;
    char *instance;
    char *process; //  random, one per peer: its hellos on every connection carry it
    zsock_t *sock;
    //  broker.endpoint: one broker, or every control node's (comma-separated). The
    //  socket is connected to one of them at a time: endpoints[current], since gen.
    char **endpoints;
    size_t count, current;
    uint64_t gen;
    uint64_t moved_at; //  monotonic ms
    uint64_t pinged_at;
    //  A cluster's control nodes, as the last welcome named them (NULL-terminated).
    char **nodes;
    zloop_t *loop;
    int sweep_timer;
    int beat_timer;
    int hello_timer;
    uint64_t heartbeat_ms;
    uint32_t default_timeout_ms;
    uint64_t next_rid;
    zhashx_t *pending; //  rid → s_pending_t, keyed by the rid as uint64
    bool welcomed;
    bool ever_welcomed;
    bool refused; //  the broker refused our hello for good (name in use)
    uint64_t last_heard;
    sbx_stall_t stall; //  this process's loop not running for a while (sbx_stall.h)
    uint64_t capacity, used;
    sbx_peer_request_fn *request_fn;
    void *request_arg;
    sbx_peer_welcome_fn *welcome_fn;
    void *welcome_arg;
    char *relay;        //  a vmd's vmd.relay, said in its hello
    char ports_key[65]; //  hex, from a cluster broker's welcome; "" without
};

static void s_pending_free (void **item)
{
    s_pending_t *pending = *item;
    if (pending)
        free (pending->data);
    free (pending);
    *item = NULL;
}

static const char *s_endpoint (sbx_peer_t *self)
{
    return self->count ? self->endpoints[self->current] : "?";
}

static bool s_is_worker (sbx_role_t role)
{
    return role != SBX_ROLE_CLI && role != SBX_ROLE__UNSET;
}

//  A DEALER connected to endpoints[current] (CURVE when any endpoint is tcp://; control
//  nodes share the broker's key pair, so one server key is right for all of them).
//  With check, every endpoint is tried first, so that a typo is said at the start and not
//  at a failover. NULL (logged) on failure.
static zsock_t *s_socket (sbx_peer_t *self, bool check)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    if (!sock)
        return NULL;
    zsock_set_linger (sock, 0);
    zsock_set_sndtimeo (sock, 0);
    zsock_set_sndhwm (sock, 10000);
    //  Workers drop what can't be sent at once (hello is repeated anyway); a CLI queues
    //  its request until the broker is there, within the request's deadline.
    zsock_set_immediate (sock, s_is_worker (self->role) ? 1 : 0);
    bool curve = false;
    for (size_t i = 0; i < self->count; i++)
        curve |= sbx_curve_needed (self->endpoints[i]);
    if (curve && sbx_curve_client (self->config, sock)) {
        zsock_destroy (&sock);
        return NULL;
    }
    for (size_t i = 0; check && i < self->count; i++)
        if (i != self->current) {
            if (zsock_connect (sock, "%s", self->endpoints[i])) {
                sbx_error ("cannot connect to broker at %s", self->endpoints[i]);
                zsock_destroy (&sock);
                return NULL;
            }
            zsock_disconnect (sock, "%s", self->endpoints[i]);
        }
    if (zsock_connect (sock, "%s", self->endpoints[self->current])) {
        sbx_error ("cannot connect to broker at %s", self->endpoints[self->current]);
        zsock_destroy (&sock);
    }
    return sock;
}

static int s_on_socket (zloop_t *loop, zsock_t *sock, void *arg);

//  A connection that a broker refused at its CURVE handshake (this host's key not
//  admitted yet: a host just joined) is not tried again by libzmq: a worker that stays
//  unwelcomed starts over with a new socket. 0, or -1 (logged; tried again later).
static int s_renew (sbx_peer_t *self)
{
    zsock_t *sock = s_socket (self, false);
    if (!sock)
        return -1;
    if (self->loop)
        zloop_reader_end (self->loop, self->sock);
    zsock_destroy (&self->sock);
    self->sock = sock;
    if (self->loop && zloop_reader (self->loop, self->sock, s_on_socket, self))
        return -1;
    self->moved_at = sbx_clock_mono_ms ();
    return 0;
}

sbx_peer_t *sbx_peer_new (sbx_config_t *config, sbx_role_t role, const char *instance)
{
    assert (config);
    sbx_peer_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->role = role;
    self->instance = strdup (instance ? instance : sbx_config_get (config, "instance", "local"));
    self->process = sbx_secret_id ("prc_");
    self->heartbeat_ms = sbx_config_get_uint (config, "heartbeat_ms", 1000);
    self->stall = sbx_stall_init (100, self->heartbeat_ms); //  (the sweep's tick)
    if (self->heartbeat_ms < 50)
        self->heartbeat_ms = 50;
    self->default_timeout_ms = (uint32_t) sbx_config_get_uint (config, "request_timeout_ms", 30000);
    self->next_rid = 1;
    self->pending = sbx_idmap_new ();
    self->endpoints = sbx_config_list (config, "broker.endpoint", &self->count);
    //  A vmd says where its relay for published ports listens (gateways elsewhere use it).
    const char *relay = sbx_config_get (config, "vmd.relay", NULL);
    if (role == SBX_ROLE_VMD && relay && *relay)
        self->relay = strdup (relay);
    if (!self->instance || !self->process || !self->pending || !self->endpoints) {
        if (!self->endpoints)
            sbx_error ("no broker.endpoint to connect to");
        sbx_peer_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->pending, s_pending_free);
    //  Endpoints are checked at once, so that a typo is said now and not at a failover.
    if (!(self->sock = s_socket (self, true))) {
        sbx_peer_destroy (&self);
        return NULL;
    }
    self->moved_at = sbx_clock_mono_ms ();
    return self;
}

//  Leaves the broker connected now for another endpoint (a cluster's control node that
//  may lead): the one at index to, or the next (-1). Nothing when there is one
//  endpoint, or when the last move was too recent (answers from the broker just left
//  are still coming in). True when it moved.
static bool s_move_to (sbx_peer_t *self, int to, const char *why)
{
    uint64_t now = sbx_clock_mono_ms ();
    if (self->count < 2 || now - self->moved_at < S_MOVE_MS || (size_t) to == self->current)
        return false;
    const char *from = self->endpoints[self->current];
    zsock_disconnect (self->sock, "%s", from);
    self->current = to >= 0 ? (size_t) to : (self->current + 1) % self->count;
    self->gen++;
    self->moved_at = now;
    self->last_heard = now;
    if (zsock_connect (self->sock, "%s", self->endpoints[self->current]))
        sbx_error ("cannot connect to broker at %s", self->endpoints[self->current]);
    sbx_info ("broker at %s %s: trying %s", from, why, self->endpoints[self->current]);
    return true;
}

static bool s_move (sbx_peer_t *self, const char *why)
{
    return s_move_to (self, -1, why);
}

//  Requests waiting on the broker: a queue that grows means a slow or stuck peer.
static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    sbx_peer_t *self = arg;
    sbx_metrics_set (metrics, SBX_METRIC_REQUESTS_PENDING, (double) zhashx_size (self->pending));
}

void sbx_peer_destroy (sbx_peer_t **self_p)
{
    assert (self_p);
    sbx_peer_t *self = *self_p;
    if (!self)
        return;
    if (self->loop) {
        if (s_is_worker (self->role))
            sbx_metrics_off_collect (sbx_metrics_here (), s_collect, self);
        zloop_reader_end (self->loop, self->sock);
        zloop_timer_end (self->loop, self->sweep_timer);
        zloop_timer_end (self->loop, self->beat_timer);
        zloop_timer_end (self->loop, self->hello_timer);
    }
    zsock_destroy (&self->sock);
    zhashx_destroy (&self->pending);
    sbx_config_list_free (&self->endpoints);
    sbx_config_list_free (&self->nodes);
    free (self->instance);
    free (self->process);
    free (self->relay);
    sbx_secret_wipe_bytes (self->ports_key, sizeof self->ports_key);
    free (self);
    *self_p = NULL;
}

void sbx_peer_set_request_fn (sbx_peer_t *self, sbx_peer_request_fn *fn, void *arg)
{
    self->request_fn = fn;
    self->request_arg = arg;
}

void sbx_peer_set_welcome_fn (sbx_peer_t *self, sbx_peer_welcome_fn *fn, void *arg)
{
    self->welcome_fn = fn;
    self->welcome_arg = arg;
}

void sbx_peer_set_capacity (sbx_peer_t *self, uint64_t capacity, uint64_t used)
{
    self->capacity = capacity;
    self->used = used;
}

bool sbx_peer_welcomed (sbx_peer_t *self)
{
    return self->welcomed;
}

bool sbx_peer_refused (sbx_peer_t *self)
{
    return self->refused;
}

sbx_role_t sbx_peer_role (sbx_peer_t *self)
{
    return self->role;
}

const char *sbx_peer_instance (sbx_peer_t *self)
{
    return self->instance;
}

//  Sends encoded bytes on the connection of now. 0, or -1 with err unavailable.
static int s_send_bytes (sbx_peer_t *self, const uint8_t *data, size_t size, uint64_t rid,
                         sbx_err_t *err)
{
    zframe_t *frame = zframe_new (data, size);
    int rc = frame ? zframe_send (&frame, self->sock, ZFRAME_DONTWAIT) : -1;
    zframe_destroy (&frame);
    if (rc) {
        sbx_debug ("rid=%llu not sent: no broker connection", (unsigned long long) rid);
        sbx_err_set (err, SBX_E_UNAVAILABLE, "no broker connection");
    }
    return rc;
}

static void s_free_sent (void *data, void *hint)
{
    (void) hint;
    free (data);
}

//  The same with the bytes (malloc'd) handed to ZeroMQ instead of copied: a 1 MiB file
//  chunk is not copied again on its way out (zframe_new's copy, and the page faults of
//  its fresh buffer, were a quarter of the broker's CPU in a 10 MiB PUT). *data_p is
//  NULL after, sent or not.
static int s_send_taken (sbx_peer_t *self, uint8_t **data_p, size_t size, uint64_t rid,
                         sbx_err_t *err)
{
    uint8_t *data = *data_p;
    *data_p = NULL;
    zmq_msg_t part;
    if (zmq_msg_init_data (&part, data, size, s_free_sent, NULL)) {
        free (data);
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    }
    if (zmq_msg_send (&part, zsock_resolve (self->sock), ZMQ_DONTWAIT) < 0) {
        zmq_msg_close (&part); //  frees data
        sbx_debug ("rid=%llu not sent: no broker connection", (unsigned long long) rid);
        return sbx_err_set (err, SBX_E_UNAVAILABLE, "no broker connection");
    }
    return 0;
}

//  Encodes and sends; takes the message. -1 with err's code invalid_argument when the
//  message could not be encoded (a value out of its schema's bounds: the caller's input,
//  so only a debug line), unavailable when there is no connection to send it on. With
//  keep, the encoded bytes are handed to *kept (the caller's), sent or not.
static int s_send_keep (sbx_peer_t *self, sbx_msg_t **msg_p, sbx_err_t *err, uint8_t **kept,
                        size_t *kept_size)
{
    assert (msg_p);
    sbx_msg_t *msg = *msg_p;
    err->code = SBX_OK;
    if (!msg)
        return sbx_err_set (err, SBX_E_INTERNAL, "no message");
    *msg_p = NULL;
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = sbx_msg_encode (msg, &data, &size, err);
    if (rc) {
        sbx_debug ("rid=%llu cannot encode %s: %s", (unsigned long long) msg->rid,
                   sbx_msg_type_name (msg->type), err->message);
        err->code = SBX_E_INVALID_ARGUMENT;
    } else if (!kept)
        rc = s_send_taken (self, &data, size, msg->rid, err);
    else
        rc = s_send_bytes (self, data, size, msg->rid, err);
    if (kept && (rc == 0 || err->code == SBX_E_UNAVAILABLE)) {
        *kept = data;
        *kept_size = size;
        data = NULL;
    }
    free (data);
    sbx_msg_destroy (&msg);
    return rc;
}

static int s_send (sbx_peer_t *self, sbx_msg_t **msg_p, sbx_err_t *err)
{
    return s_send_keep (self, msg_p, err, NULL, NULL);
}

int sbx_peer_send (sbx_peer_t *self, sbx_msg_t **msg_p)
{
    if (*msg_p && (*msg_p)->type == SBX_MSG_ERROR)
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_ERRORS_TOTAL, 1,
                         sbx_code_name (sbx_msg_error (*msg_p)->code));
    sbx_err_t err;
    return s_send (self, msg_p, &err);
}

//  Calls a pending request's callback with an error made here, and forgets it.
static void s_fail (sbx_peer_t *self, s_pending_t *pending, sbx_code_t code, const char *why)
{
    sbx_msg_t *error = sbx_msg_new_error (pending->rid, code, "%s", why);
    sbx_peer_reply_fn *fn = pending->fn;
    void *arg = pending->arg;
    zhashx_delete (self->pending, (void *) (uintptr_t) pending->rid);
    if (fn)
        fn (self, &error, arg);
    sbx_msg_destroy (&error);
}

uint64_t sbx_peer_request (sbx_peer_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                           sbx_peer_reply_fn *fn, void *arg)
{
    assert (request_p && *request_p);
    sbx_msg_t *request = *request_p;
    uint64_t rid = self->next_rid++;
    request->rid = rid;
    if (timeout_ms == 0)
        timeout_ms = self->default_timeout_ms;
    request->timeout_ms = timeout_ms;
    s_pending_t *pending = calloc (1, sizeof *pending);
    if (!pending) {
        sbx_msg_destroy (request_p);
        return 0;
    }
    pending->rid = rid;
    pending->deadline = sbx_clock_mono_ms () + timeout_ms;
    pending->fn = fn;
    pending->arg = arg;
    pending->gen = self->gen;
    zhashx_insert (self->pending, (void *) (uintptr_t) rid, pending);
    char what[600];
    snprintf (what, sizeof what, "%s could not be sent: the broker is not reachable at %s",
              sbx_msg_type_name (request->type), s_endpoint (self));
    sbx_err_t err;
    //  Several control nodes: the bytes are kept, to go to the next broker if this one
    //  stands by (or is not connected yet: it goes out with the next sweep).
    bool keep = self->count > 1;
    int rc = s_send_keep (self, request_p, &err, keep ? &pending->data : NULL, &pending->size);
    if (rc == 0)
        return rid;
    if (err.code == SBX_E_INVALID_ARGUMENT) {
        //  The encoder names the message and the field ("sandbox.create: field 'name' is
        //  longer than 128 bytes"); the caller knows the field, not our message names.
        const char *colon = strstr (err.message, ": ");
        s_fail (self, pending, SBX_E_INVALID_ARGUMENT, colon ? colon + 2 : err.message);
    } else if (keep && pending->data)
        pending->resend = true;
    else
        s_fail (self, pending, SBX_E_UNAVAILABLE, what);
    return rid;
}

void sbx_peer_cancel (sbx_peer_t *self, uint64_t rid)
{
    zhashx_delete (self->pending, (void *) (uintptr_t) rid);
}

static void s_send_hello (sbx_peer_t *self)
{
    //  Refused for good: a hello now (to a broker's "unknown", say, sent before the refusal
    //  came) would take the name from the worker that holds it, until it speaks again.
    if (self->refused)
        return;
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_PEER_HELLO);
    sbx_peer_hello_t *hello = sbx_msg_peer_hello (msg);
    hello->role = self->role;
    sbx_str_set (&hello->instance, self->instance);
    hello->pid = (uint64_t) getpid ();
    sbx_str_set (&hello->process, self->process);
    hello->capacity = self->capacity;
    hello->used = self->used;
    sbx_str_set (&hello->version, SBX_VERSION);
    if (self->relay)
        sbx_str_set (&hello->relay, self->relay);
    sbx_peer_send (self, &msg);
}

void sbx_peer_bye (sbx_peer_t *self, const char *reason)
{
    if (!s_is_worker (self->role) || !self->welcomed)
        return;
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_PEER_BYE);
    sbx_str_set (&sbx_msg_peer_bye (msg)->reason, reason);
    sbx_peer_send (self, &msg);
    self->welcomed = false;
    //  We are about to exit: give the bye a moment to leave before the socket closes.
    zsock_set_linger (self->sock, 500);
}

//  Fails, with code and why, the requests in flight that a broker may have acted on:
//  all but those a standby refused (they go to the next broker). Collected first:
//  failing a request runs its callback, which may add requests.
static void s_fail_sent (sbx_peer_t *self, sbx_code_t code, const char *why)
{
    zlistx_t *lost = zlistx_new ();
    for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
        if (!p->resend)
            zlistx_add_end (lost, (void *) (uintptr_t) p->rid);
    for (void *key = zlistx_first (lost); key; key = zlistx_next (lost)) {
        s_pending_t *p = zhashx_lookup (self->pending, key);
        if (p)
            s_fail (self, p, code, why);
    }
    zlistx_destroy (&lost);
}

//  The broker is gone (silent), forgot us, or stopped leading: every request in flight
//  is lost with it. It may or may not have been done: the caller is told so, and never
//  is it sent again (it could be done twice).
static void s_lost_broker (sbx_peer_t *self, const char *why)
{
    self->welcomed = false;
    s_fail_sent (self, SBX_E_UNAVAILABLE, why);
}

//  The limit of peer.heartbeat's metrics, as schemas/peer.json sets it.
static size_t s_metrics_max (void)
{
    const sbx_meta_struct_t *body = sbx_meta_msgs[SBX_MSG_PEER_HEARTBEAT].body;
    for (size_t i = 0; i < body->field_count; i++)
        if (streq (body->fields[i].name, "metrics"))
            return sbx_meta_field_max (&body->fields[i]);
    return 0;
}

//  From the sweep and the beat, first: after a stall of this process's own loop
//  (sbx_stall.h) the broker's silence and the requests' waiting are its own doing. The
//  broker has three heartbeats again and each deadline moves by the stall, so that what
//  came meanwhile is read before the broker is taken for gone or a request for lost.
static void s_check_stall (sbx_peer_t *self)
{
    uint64_t now = sbx_clock_mono_ms ();
    uint64_t gap = sbx_stall_check (&self->stall, now);
    if (!gap)
        return;
    sbx_warn ("this %s did not run for %llu ms (its process stopped, or its machine paused or "
              "starved): the broker is heard from anew and %zu requests in flight get that "
              "time back",
              sbx_role_name (self->role), (unsigned long long) gap, zhashx_size (self->pending));
    self->last_heard = now;
    for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
        p->deadline += gap;
}

static int s_on_beat (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    sbx_peer_t *self = arg;
    s_check_stall (self);
    if (!s_is_worker (self->role) || self->refused)
        return 0;
    uint64_t now = sbx_clock_mono_ms ();
    if (self->welcomed && now - self->last_heard > 3 * self->heartbeat_ms) {
        sbx_warn ("broker at %s silent for %llu ms; saying hello again", s_endpoint (self),
                  (unsigned long long) (now - self->last_heard));
        s_lost_broker (self, self->count > 1
                                 ? "the control plane's leader stopped answering while this was "
                                   "in flight: it may or may not have been done; check, then "
                                   "retry"
                                 : "the broker stopped answering (restarting?); retry shortly");
        s_move (self, "is silent");
    } else if (!self->welcomed && now - self->moved_at > S_SWITCH_MS) {
        if (!s_move (self, "does not welcome this worker") && self->count == 1 &&
            now - self->moved_at > 3 * S_SWITCH_MS && s_renew (self) == 0)
            sbx_info ("broker at %s does not welcome this worker: connecting anew",
                      s_endpoint (self));
    }
    if (self->welcomed) {
        sbx_msg_t *beat = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
        sbx_msg_peer_heartbeat (beat)->used = self->used;
        //  The broker keeps the latest for sys.metrics: a scrape never waits on us. Past
        //  the field's limit (schemas/peer.json) the beat would not encode: it goes
        //  without them rather than not at all.
        char *metrics = sbx_metrics_samples (sbx_metrics_here ());
        if (metrics && strlen (metrics) > s_metrics_max ()) {
            sbx_warn ("metrics: %zu bytes, over %zu: not sent to the broker", strlen (metrics),
                      s_metrics_max ());
            zstr_free (&metrics);
        }
        sbx_msg_peer_heartbeat (beat)->metrics = metrics;
        sbx_peer_send (self, &beat);
    }
    return 0;
}

//  Until welcomed, hello goes out ten times a second: the first ones are dropped while
//  the connection is being made (sends never wait), and readiness should not wait for
//  a heartbeat period.
static int s_on_hello (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    sbx_peer_t *self = arg;
    if (s_is_worker (self->role) && !self->welcomed && !self->refused)
        s_send_hello (self);
    return 0;
}

static int s_on_sweep (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    sbx_peer_t *self = arg;
    s_check_stall (self);
    uint64_t now = sbx_clock_mono_ms ();
    //  Collect first: failing a request runs its callback, which may add requests.
    zlistx_t *expired = zlistx_new ();
    for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
        if (p->deadline <= now)
            zlistx_add_end (expired, (void *) (uintptr_t) p->rid);
    for (void *key = zlistx_first (expired); key; key = zlistx_next (expired)) {
        s_pending_t *p = zhashx_lookup (self->pending, key);
        if (p)
            s_fail (self, p, SBX_E_TIMEOUT, "no answer before the request's deadline");
    }
    zlistx_destroy (&expired);
    if (self->count < 2)
        return 0;
    //  A client waiting on a broker that says nothing asks whether it is there (any
    //  answer will do: peer.unknown from a leader, peer.standby from the others), and
    //  moves on when it is not.
    if (!s_is_worker (self->role) && zhashx_size (self->pending) > 0) {
        if (now - self->last_heard > S_SWITCH_MS) {
            s_fail_sent (self, SBX_E_UNAVAILABLE,
                         "the control plane's leader stopped answering while this was in flight: "
                         "it may or may not have been done; check, then retry");
            s_move (self, "is silent");
        } else if (now - self->last_heard > S_SWITCH_MS / 2 && now - self->pinged_at > 200) {
            self->pinged_at = now;
            sbx_msg_t *ping = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
            sbx_peer_send (self, &ping);
        }
    }
    //  What a standby refused goes to the broker of now, once a worker is welcomed there
    //  (a client needs no welcome), and once the connection had a moment to be made.
    if ((s_is_worker (self->role) && !self->welcomed) || now - self->moved_at < 20)
        return 0;
    for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending))
        if (p->resend && p->data) {
            sbx_err_t err;
            if (s_send_bytes (self, p->data, p->size, p->rid, &err) == 0) {
                p->resend = false;
                p->gen = self->gen;
            }
        }
    return 0;
}

static int s_learn_node (sbx_peer_t *self, const char *node);

//  A broker that stands by answered: nothing was done. A request goes again to the next
//  one (the sweep sends it), a worker's hello or heartbeat moves the worker there.
static void s_on_standby (sbx_peer_t *self, sbx_msg_t *msg)
{
    sbx_peer_standby_t *standby = sbx_msg_peer_standby (msg);
    s_pending_t *pending =
        msg->rid ? zhashx_lookup (self->pending, (void *) (uintptr_t) msg->rid) : NULL;
    //  The leader it names is followed, in the settings or not (a host whose
    //  control.nodes is older than the cluster).
    int to = s_learn_node (self, standby->leader);
    if (self->count < 2) {
        char why[600];
        snprintf (why, sizeof why,
                  "the broker at %s stands by (control node %s of a cluster, which does not "
                  "lead%s%s): give every control node's broker endpoint in broker.endpoint",
                  s_endpoint (self), standby->node, standby->leader ? "; the leader is " : "",
                  standby->leader ? standby->leader : "");
        if (pending)
            s_fail (self, pending, SBX_E_UNAVAILABLE, why);
        else if (!self->welcomed)
            sbx_warn ("%s", why);
        return;
    }
    if (pending) {
        pending->resend = true;
        if (pending->gen == self->gen)
            s_move_to (self, to, "stands by");
        return;
    }
    if (!s_is_worker (self->role))
        return;
    if (self->welcomed)
        s_lost_broker (self, "the control plane's leader changed while this was in flight: it "
                             "may or may not have been done; check, then retry");
    s_move_to (self, to, "stands by");
}

//  The broker refused our hello for good: another live worker of our role has our name,
//  and saying hello again would only take it from that one. No hello or heartbeat goes
//  out any more; the process is to exit (sbx_peer_refused) and a person to rename one.
static void s_refuse (sbx_peer_t *self, const char *why)
{
    sbx_error ("the broker refused %s %s: %s", sbx_role_name (self->role), self->instance, why);
    self->refused = true;
    s_lost_broker (self, "this worker was refused by the broker (its instance name is in use)");
}

//  The broker of control node HOST:PORT (at PORT+1, sbx_config) among the endpoints:
//  its index, added when it was not there; -1 when node is no HOST:PORT.
static int s_learn_node (sbx_peer_t *self, const char *node)
{
    const char *colon = node ? strrchr (node, ':') : NULL;
    long port = colon ? strtol (colon + 1, NULL, 10) : 0;
    if (!colon || colon == node || port < 1 || port >= 65535)
        return -1;
    char endpoint[300];
    snprintf (endpoint, sizeof endpoint, "tcp://%.*s:%ld", (int) (colon - node), node, port + 1);
    for (size_t e = 0; e < self->count; e++)
        if (streq (self->endpoints[e], endpoint))
            return (int) e;
    char **grown = realloc (self->endpoints, (self->count + 2) * sizeof *grown);
    if (!grown)
        return -1;
    self->endpoints = grown;
    if (!(self->endpoints[self->count] = strdup (endpoint)))
        return -1;
    self->endpoints[self->count + 1] = NULL;
    sbx_info ("control node %s learned: its broker %s is followed too", node, endpoint);
    return (int) self->count++;
}

//  A welcome names a cluster's control nodes: their brokers join the endpoints this
//  worker moves between, so that it follows a leader its settings did not name (a
//  control node added since), and the nodes are kept for sbx_peer_nodes.
static void s_learn_nodes (sbx_peer_t *self, const sbx_strlist_t *nodes)
{
    if (nodes->count == 0)
        return;
    char **kept = calloc (nodes->count + 1, sizeof *kept);
    for (size_t i = 0; kept && i < nodes->count; i++)
        kept[i] = strdup (nodes->items[i]);
    sbx_config_list_free (&self->nodes);
    self->nodes = kept;
    for (size_t i = 0; i < nodes->count; i++)
        s_learn_node (self, nodes->items[i]);
}

const char *sbx_peer_ports_key (sbx_peer_t *self)
{
    return *self->ports_key ? self->ports_key : NULL;
}

const char *const *sbx_peer_nodes (sbx_peer_t *self)
{
    return (const char *const *) self->nodes;
}

//  Returns -1 when the message ends the loop (we were refused), else 0.
static int s_handle (sbx_peer_t *self, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    if (self->refused)
        return 0;
    switch (msg->type) {
    case SBX_MSG_PEER_WELCOME: {
        bool first = !self->ever_welcomed;
        self->welcomed = true;
        self->ever_welcomed = true;
        sbx_peer_welcome_t *welcome = sbx_msg_peer_welcome (msg);
        if (welcome->heartbeat_ms >= 50 && welcome->heartbeat_ms != self->heartbeat_ms) {
            self->heartbeat_ms = welcome->heartbeat_ms;
            zloop_timer_end (self->loop, self->beat_timer);
            self->beat_timer = zloop_timer (self->loop, self->heartbeat_ms, 0, s_on_beat, self);
        }
        sbx_info ("welcomed by broker %s as %s %s", welcome->broker_instance,
                  sbx_role_name (self->role), self->instance);
        s_learn_nodes (self, &welcome->nodes);
        if (welcome->ports_key && strlen (welcome->ports_key) == 64)
            snprintf (self->ports_key, sizeof self->ports_key, "%s", welcome->ports_key);
        if (self->welcome_fn)
            self->welcome_fn (self, first, self->welcome_arg);
        return 0;
    }
    case SBX_MSG_PEER_HEARTBEAT:
        return 0;
    case SBX_MSG_PEER_STANDBY:
        s_on_standby (self, msg);
        return 0;
    case SBX_MSG_PEER_UNKNOWN:
        if (s_is_worker (self->role)) {
            if (self->welcomed)
                s_lost_broker (self, "the broker restarted; retry");
            s_send_hello (self);
        }
        return 0;
    case SBX_MSG_ERROR:
        //  rid 0 is our hello's (it has none): a conflict there means our name is taken,
        //  possibly after a welcome, when the worker that had it first spoke again.
        if (msg->rid == 0 && s_is_worker (self->role) &&
            sbx_msg_error (msg)->code == SBX_E_CONFLICT) {
            s_refuse (self, sbx_msg_error (msg)->message);
            return -1;
        }
        break;
    default:
        break;
    }
    s_pending_t *pending =
        msg->rid ? zhashx_lookup (self->pending, (void *) (uintptr_t) msg->rid) : NULL;
    if (pending && sbx_msg_type_is_reply (msg->type)) {
        sbx_peer_reply_fn *fn = pending->fn;
        void *arg = pending->arg;
        zhashx_delete (self->pending, (void *) (uintptr_t) msg->rid);
        if (fn)
            fn (self, msg_p, arg);
    } else if (sbx_msg_type_is_reply (msg->type))
        sbx_debug ("rid=%llu late or unknown %s dropped", (unsigned long long) msg->rid,
                   sbx_msg_type_name (msg->type));
    else if (self->request_fn)
        self->request_fn (self, msg_p, self->request_arg);
    else {
        sbx_msg_t *error = sbx_msg_new_error (
            msg->rid, SBX_E_INVALID_ARGUMENT, "%s %s does not handle %s",
            sbx_role_name (self->role), self->instance, sbx_msg_type_name (msg->type));
        sbx_peer_send (self, &error);
    }
    return 0;
}

static int s_on_socket (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    sbx_peer_t *self = arg;
    //  Drain what is there now, bounded so one busy peer can't starve the loop.
    for (int i = 0; i < 256; i++) {
        zframe_t *frame = zframe_recv_nowait (sock);
        if (!frame)
            break;
        self->last_heard = sbx_clock_mono_ms ();
        sbx_err_t err;
        sbx_msg_t *msg = sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err);
        zframe_destroy (&frame);
        if (!msg) {
            sbx_warn ("rid=%llu bad frame from broker dropped: %s", (unsigned long long) err.rid,
                      err.message);
            continue;
        }
        int rc = s_handle (self, &msg);
        sbx_msg_destroy (&msg);
        if (rc)
            return rc; //  ends zloop_start: the daemon exits (sbx_daemon_run)
    }
    return 0;
}

int sbx_peer_start (sbx_peer_t *self, zloop_t *loop)
{
    assert (!self->loop);
    self->loop = loop;
    self->last_heard = sbx_clock_mono_ms ();
    if (zloop_reader (loop, self->sock, s_on_socket, self))
        return -1;
    self->sweep_timer = zloop_timer (loop, 100, 0, s_on_sweep, self);
    self->beat_timer = zloop_timer (loop, self->heartbeat_ms, 0, s_on_beat, self);
    self->hello_timer = zloop_timer (loop, 100, 0, s_on_hello, self);
    if (s_is_worker (self->role)) {
        sbx_metrics_on_collect (sbx_metrics_here (), s_collect, self);
        s_send_hello (self);
    }
    return 0;
}

//  Self test: a fake broker, a ROUTER in the worker's own loop, welcomes a worker,
//  answers one of its requests with a conflict (an answer like any other), then refuses
//  its hello with one: the loop ends, and the worker says hello no more.

typedef struct {
    zsock_t *router;
    zframe_t *worker; //  its routing id, from its last message
    int hellos, beats, requests;
} s_fake_t;

static void s_fake_send (s_fake_t *fake, sbx_msg_t **msg_p)
{
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &data, &size, &err) == 0);
    zmsg_t *out = zmsg_new ();
    zmsg_append (out, &(zframe_t *){zframe_dup (fake->worker)});
    zmsg_addmem (out, data, size);
    assert (zmsg_send (&out, fake->router) == 0);
    free (data);
    sbx_msg_destroy (msg_p);
}

static int s_fake_on_router (zloop_t *loop, zsock_t *router, void *arg)
{
    (void) loop;
    s_fake_t *fake = arg;
    zmsg_t *in = zmsg_recv (router);
    assert (in && zmsg_size (in) == 2);
    zframe_destroy (&fake->worker);
    fake->worker = zmsg_pop (in);
    zframe_t *body = zmsg_pop (in);
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (zframe_data (body), zframe_size (body), &err);
    assert (msg);
    if (msg->type == SBX_MSG_PEER_HELLO) {
        fake->hellos++;
        assert (msg->rid == 0 && streq (sbx_msg_peer_hello (msg)->instance, "w1"));
        sbx_msg_t *welcome = sbx_msg_new_reply (msg, SBX_MSG_PEER_WELCOME);
        sbx_str_set (&sbx_msg_peer_welcome (welcome)->broker_instance, "fake");
        sbx_msg_peer_welcome (welcome)->heartbeat_ms = 100;
        s_fake_send (fake, &welcome);
    } else if (msg->type == SBX_MSG_PEER_HEARTBEAT)
        fake->beats++;
    else {
        fake->requests++;
        sbx_msg_t *error = sbx_msg_new_error (msg->rid, SBX_E_CONFLICT, "exists already");
        s_fake_send (fake, &error);
    }
    sbx_msg_destroy (&msg);
    zframe_destroy (&body);
    zmsg_destroy (&in);
    return 0;
}

static void s_test_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    s_fake_t *fake = arg;
    sbx_msg_t *reply = *reply_p;
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_CONFLICT);
    assert (sbx_peer_welcomed (peer) && !sbx_peer_refused (peer));
    //  Now the worker that had the name first speaks again: the broker refuses this one.
    sbx_msg_t *refusal =
        sbx_msg_new_error (0, SBX_E_CONFLICT, "instance name 'w1' of role vmd is in use by pid 1");
    s_fake_send (fake, &refusal);
}

static void s_test_on_welcome (sbx_peer_t *peer, bool first, void *arg)
{
    assert (first);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    assert (sbx_peer_request (peer, &request, 2000, s_test_on_reply, arg));
}

static int s_test_on_deadline (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return -1;
}

//  Two brokers of a cluster, in the test's loop: the first stands by (peer.standby to
//  everything), the second leads (welcomes, answers requests, counts them). A worker
//  given both moves to the leader; a request the standby refused is sent again to the
//  leader and done there once; when the leader falls silent the worker moves on and its
//  request in flight fails unavailable (never sent again: it may have been done).

typedef struct {
    zsock_t *standby, *leader;
    int standby_answers, requests, welcomes;
    bool silent; //  the leader stops answering
    sbx_peer_t *peer;
    uint64_t rid; //  the request in flight
    int replies, unavailable;
} s_cluster_t;

static void s_cluster_send (zsock_t *router, zframe_t *to, sbx_msg_t **msg_p)
{
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &data, &size, &err) == 0);
    zmsg_t *out = zmsg_new ();
    zmsg_append (out, &(zframe_t *){zframe_dup (to)});
    zmsg_addmem (out, data, size);
    assert (zmsg_send (&out, router) == 0);
    free (data);
    sbx_msg_destroy (msg_p);
}

static int s_cluster_on_router (zloop_t *loop, zsock_t *router, void *arg)
{
    (void) loop;
    s_cluster_t *cluster = arg;
    zmsg_t *in = zmsg_recv (router);
    zframe_t *from = zmsg_pop (in);
    zframe_t *body = zmsg_pop (in);
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (zframe_data (body), zframe_size (body), &err);
    assert (msg);
    sbx_msg_t *reply = NULL;
    if (router == cluster->standby) {
        cluster->standby_answers++;
        reply = sbx_msg_new (SBX_MSG_PEER_STANDBY);
        reply->rid = msg->rid;
        sbx_str_set (&sbx_msg_peer_standby (reply)->node, "10.0.0.1:9001");
    } else if (cluster->silent)
        cluster->requests += msg->type == SBX_MSG_SYS_STATUS;
    else if (msg->type == SBX_MSG_PEER_HELLO) {
        cluster->welcomes++;
        reply = sbx_msg_new_reply (msg, SBX_MSG_PEER_WELCOME);
        sbx_str_set (&sbx_msg_peer_welcome (reply)->broker_instance, "leader");
        sbx_msg_peer_welcome (reply)->heartbeat_ms = 100;
    } else if (msg->type == SBX_MSG_SYS_STATUS) {
        cluster->requests++;
        reply = sbx_msg_new_reply (msg, SBX_MSG_SYS_STATUS_OK);
        sbx_msg_sys_status_ok (reply)->role = SBX_ROLE_BROKER;
        sbx_str_set (&sbx_msg_sys_status_ok (reply)->instance, "leader");
    }
    if (reply)
        s_cluster_send (router, from, &reply);
    sbx_msg_destroy (&msg);
    zframe_destroy (&from);
    zframe_destroy (&body);
    zmsg_destroy (&in);
    return 0;
}

static void s_cluster_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_cluster_t *cluster = arg;
    if ((*reply_p)->type == SBX_MSG_SYS_STATUS_OK)
        cluster->replies++;
    else if ((*reply_p)->type == SBX_MSG_ERROR &&
             sbx_msg_error (*reply_p)->code == SBX_E_UNAVAILABLE)
        cluster->unavailable++;
}

static int s_cluster_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_cluster_t *cluster = arg;
    //  Welcomed by the leader: one request, which goes out to the leader directly.
    if (sbx_peer_welcomed (cluster->peer) && !cluster->rid) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
        cluster->rid = sbx_peer_request (cluster->peer, &request, 5000, s_cluster_on_reply, arg);
    }
    if (cluster->replies == 1 && !cluster->silent) {
        //  The leader falls silent with a second request in flight.
        cluster->silent = true;
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
        sbx_peer_request (cluster->peer, &request, 5000, s_cluster_on_reply, arg);
    }
    return cluster->unavailable ? -1 : 0;
}

static void s_test_cluster (const char *dir)
{
    sbx_config_t *config = sbx_config_new (dir);
    char standby[200], leader[200], both[420];
    snprintf (standby, sizeof standby, "ipc://%s/standby.sock", dir);
    snprintf (leader, sizeof leader, "ipc://%s/leader.sock", dir);
    snprintf (both, sizeof both, "%s, %s", standby, leader);
    sbx_config_set (config, "broker.endpoint", both);
    sbx_config_set (config, "heartbeat_ms", "100");
    s_cluster_t cluster = {.standby = zsock_new (ZMQ_ROUTER), .leader = zsock_new (ZMQ_ROUTER)};
    assert (zsock_bind (cluster.standby, "%s", standby) == 0);
    assert (zsock_bind (cluster.leader, "%s", leader) == 0);
    zloop_t *loop = zloop_new ();
    zloop_reader (loop, cluster.standby, s_cluster_on_router, &cluster);
    zloop_reader (loop, cluster.leader, s_cluster_on_router, &cluster);
    cluster.peer = sbx_peer_new (config, SBX_ROLE_VMD, "w1");
    assert (cluster.peer && sbx_peer_start (cluster.peer, loop) == 0);
    int tick = zloop_timer (loop, 20, 0, s_cluster_on_tick, &cluster);
    int deadline = zloop_timer (loop, 8000, 1, s_test_on_deadline, NULL);
    zloop_start (loop);
    zloop_timer_end (loop, tick);
    zloop_timer_end (loop, deadline);
    //  The standby refused the hello (and nothing else reached it); the leader welcomed
    //  the worker, answered its first request once, and the one in flight when it fell
    //  silent failed unavailable, never answered twice.
    assert (cluster.standby_answers >= 1 && cluster.welcomes == 1);
    assert (cluster.replies == 1 && cluster.requests == 2 && cluster.unavailable == 1);

    //  A client (no hello) whose request the standby refuses: sent again to the leader,
    //  answered once there.
    sbx_peer_destroy (&cluster.peer);
    cluster.silent = false;
    cluster.standby_answers = cluster.requests = cluster.replies = cluster.unavailable = 0;
    sbx_peer_t *client = sbx_peer_new (config, SBX_ROLE_CLI, NULL);
    assert (client && sbx_peer_start (client, loop) == 0);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_peer_request (client, &request, 5000, s_cluster_on_reply, &cluster);
    int64_t start = zclock_mono ();
    while (cluster.replies == 0 && zclock_mono () - start < 5000) {
        zloop_timer (loop, 50, 1, s_test_on_deadline, NULL);
        zloop_start (loop);
    }
    //  (The standby may also have answered what the worker sent it before it went.)
    assert (cluster.replies == 1 && cluster.standby_answers >= 1 && cluster.requests == 1);
    sbx_peer_destroy (&client);
    zloop_destroy (&loop);
    zsock_destroy (&cluster.standby);
    zsock_destroy (&cluster.leader);
    sbx_config_destroy (&config);
}

//  A stall of the worker's own loop (the test does not run it for 1.5 s, as a stopped
//  process or a paused machine would not): the fake broker beat all along and answers the
//  request sent before it at once. The worker takes the broker for there (no new hello)
//  and the request's answer for its answer, not a timeout (its deadline was 0.5 s).
typedef struct {
    s_fake_t fake;
    bool welcomed;
    sbx_code_t code; //  the request's answer (SBX_OK until it comes)
    bool answered;
} s_stall_t;

static void s_stall_on_welcome (sbx_peer_t *peer, bool first, void *arg)
{
    (void) peer;
    (void) first;
    ((s_stall_t *) arg)->welcomed = true;
}

static void s_stall_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_stall_t *stall = arg;
    stall->answered = true;
    stall->code = (*reply_p)->type == SBX_MSG_ERROR ? sbx_msg_error (*reply_p)->code : SBX_OK;
}

static int s_stall_on_beat (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_stall_t *stall = arg;
    if (stall->fake.worker) {
        sbx_msg_t *beat = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
        s_fake_send (&stall->fake, &beat);
    }
    return 0;
}

static void s_test_stall (const char *dir)
{
    sbx_config_t *config = sbx_config_new (dir);
    char endpoint[200];
    snprintf (endpoint, sizeof endpoint, "ipc://%s/stall.sock", dir);
    assert (config && sbx_config_set (config, "broker.endpoint", endpoint) == 0);
    sbx_config_set (config, "heartbeat_ms", "100");
    s_stall_t stall = {.fake = {zsock_new (ZMQ_ROUTER), NULL, 0, 0, 0}};
    assert (stall.fake.router && zsock_bind (stall.fake.router, "%s", endpoint) == 0);
    zloop_t *loop = zloop_new ();
    assert (zloop_reader (loop, stall.fake.router, s_fake_on_router, &stall.fake) == 0);
    zloop_timer (loop, 100, 0, s_stall_on_beat, &stall);
    sbx_peer_t *peer = sbx_peer_new (config, SBX_ROLE_VMD, "w1");
    sbx_peer_set_welcome_fn (peer, s_stall_on_welcome, &stall);
    assert (peer && sbx_peer_start (peer, loop) == 0);
    for (int i = 0; i < 50 && !stall.welcomed; i++) {
        zloop_timer (loop, 100, 1, s_test_on_deadline, NULL);
        zloop_start (loop);
    }
    assert (stall.welcomed && stall.fake.hellos == 1);
    zloop_timer (loop, 300, 1, s_test_on_deadline, NULL); //  a few beats, a few sweeps
    zloop_start (loop);

    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    assert (sbx_peer_request (peer, &request, 500, s_stall_on_reply, &stall));
    zclock_sleep (1500); //  the stall: the loop does not run
    zloop_timer (loop, 400, 1, s_test_on_deadline, NULL);
    zloop_start (loop);
    assert (stall.answered && stall.code == SBX_E_CONFLICT);
    assert (stall.fake.hellos == 1 && sbx_peer_welcomed (peer));

    sbx_peer_destroy (&peer);
    zloop_destroy (&loop);
    zframe_destroy (&stall.fake.worker);
    zsock_destroy (&stall.fake.router);
    sbx_config_destroy (&config);
}

void sbx_peer_test (bool verbose)
{
    sbx_log_init ("sbx_peer_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    //  The heartbeat's metrics field is found (a rename in the schema would drop them all).
    assert (s_metrics_max () >= 64 * 1024);
    char dir[] = "/tmp/sbx_peer_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    char endpoint[200];
    snprintf (endpoint, sizeof endpoint, "ipc://%s/broker.sock", dir);
    assert (sbx_config_set (config, "broker.endpoint", endpoint) == 0);
    sbx_config_set (config, "heartbeat_ms", "100");

    s_fake_t fake = {zsock_new (ZMQ_ROUTER), NULL, 0, 0, 0};
    assert (fake.router && zsock_bind (fake.router, "%s", endpoint) == 0);
    zloop_t *loop = zloop_new ();
    assert (zloop_reader (loop, fake.router, s_fake_on_router, &fake) == 0);
    sbx_peer_t *peer = sbx_peer_new (config, SBX_ROLE_VMD, "w1");
    assert (peer);
    sbx_peer_set_welcome_fn (peer, s_test_on_welcome, &fake);
    assert (sbx_peer_start (peer, loop) == 0);
    //  A deadline, so that a worker that is not refused fails here rather than hangs.
    int deadline = zloop_timer (loop, 5000, 1, s_test_on_deadline, NULL);
    int64_t start = zclock_mono ();
    assert (zloop_start (loop) == -1);
    assert (zclock_mono () - start < 4000);
    assert (sbx_peer_refused (peer) && !sbx_peer_welcomed (peer));
    assert (fake.hellos == 1 && fake.requests == 1);
    zloop_timer_end (loop, deadline);

    //  Refused, it stays quiet: no heartbeat, and no hello even when told peer.unknown.
    fake.hellos = fake.beats = 0;
    sbx_msg_t *unknown = sbx_msg_new (SBX_MSG_PEER_UNKNOWN);
    s_fake_send (&fake, &unknown);
    zloop_timer (loop, 350, 1, s_test_on_deadline, NULL);
    zloop_start (loop);
    assert (fake.hellos == 0 && fake.beats == 0);
    sbx_peer_bye (peer, "test"); //  not welcomed: nothing goes out

    sbx_peer_destroy (&peer);
    zloop_destroy (&loop);
    zframe_destroy (&fake.worker);
    zsock_destroy (&fake.router);
    sbx_config_destroy (&config);

    s_test_cluster (dir);
    s_test_stall (dir);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
