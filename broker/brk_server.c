/*  brk_server - see brk_server.h */
#include "brk_server.h"
#include "brk_accounts.h"
#include "brk_admin.h"
#include "brk_oauth.h"
#include "brk_ctx.h"
#include "brk_events.h"
#include "brk_fork.h"
#include "brk_hosts.h"
#include "brk_limits.h"
#include "brk_pending.h"
#include "brk_registry.h"
#include "brk_metrics.h"
#include "brk_ports.h"
#include "brk_hostloss.h"
#include "brk_move.h"
#include "brk_replica.h"
#include "sbx_dqproxy.h"
#include "brk_reconcile.h"
#include "brk_rates.h"
#include "brk_sandbox.h"
#include "brk_sessions.h"
#include "brk_snapshot.h"
#include "brk_store.h"
#include "brk_testkit.h"
#include "sbx_stall.h"
#include "sbx_metrics.h"
#include "sbx_secret.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <unistd.h>

#define S_MAX_TIMEOUT_MS   (20u * 60 * 1000) //  exec waits up to 600 s; leave room
#define S_SEGMENT_SIZE     100000u           //  events.segment_size
#define S_SEGMENT_CHUNK    5000u             //  events copied or deleted per 100 ms tick
#define S_REPLAY_MAX       10000u
#define S_REPLAY_DEFAULT   1000u
#define S_REPLAY_MAX_BYTES (8u * 1024 * 1024) //  well under the frame limit

typedef struct {
    sbx_config_t *config; //  borrowed
    const char *node;     //  a cluster's: this control node's address (borrowed)
    zsock_t *pipe;        //  borrowed
    zloop_t *loop;
    zsock_t *router;
    zsock_t *tap;
    zactor_t *auth;
    int lock_fd;
    brk_store_t *store;
    brk_events_t *events;
    brk_registry_t *registry;
    brk_pending_t *pending;
    brk_rates_t *rates; //  gateways' shares of each key's plan rate
    brk_reconcile_t *reconcile;
    brk_hostloss_t *hostloss;
    brk_move_t *move;
    brk_replica_t *replica;
    brk_ctx_t ctx;
    char *instance;     //  random per run, so peers can tell a restart
    char ports_key[65]; //  a cluster's: the published ports' relay key (hex), for welcomes
    uint64_t heartbeat_ms;
    uint64_t default_timeout_ms;
    uint64_t started_ms;
    sbx_stall_t stall; //  the broker itself not running for a while (sbx_stall.h)
} s_server_t;

//  A cluster's relay key for published ports, from the cluster key (every control node
//  makes the same): handed to gateways and vmds in their welcome.
static void s_ports_key (s_server_t *self, sbx_config_t *config)
{
    unsigned char key[SBX_DQPROXY_KEY_SIZE], ports[SBX_DQPROXY_KEY_SIZE];
    char *path = sbx_config_path (config, "keys/cluster.key");
    if (path && sbx_dqproxy_key_load (path, false, key) == 0 &&
        sbx_dqproxy_derive (key, "sbx ports relay", ports) == 0)
        for (size_t i = 0; i < sizeof ports; i++)
            snprintf (self->ports_key + 2 * i, 3, "%02x", ports[i]);
    else
        sbx_warn ("no cluster key: published ports are not relayed between hosts");
    sbx_secret_wipe_bytes (key, sizeof key);
    sbx_secret_wipe_bytes (ports, sizeof ports);
    free (path);
}

static void s_server_destroy (s_server_t **self_p)
{
    s_server_t *self = *self_p;
    if (!self)
        return;
    zloop_destroy (&self->loop);
    brk_reconcile_destroy (&self->reconcile);
    brk_hostloss_destroy (&self->hostloss);
    brk_move_destroy (&self->move);
    brk_replica_destroy (&self->replica);
    zhashx_destroy (&self->ctx.in_flight);
    brk_pending_destroy (&self->pending);
    brk_rates_destroy (&self->rates);
    brk_registry_destroy (&self->registry);
    brk_events_destroy (&self->events);
    brk_store_destroy (&self->store);
    zsock_destroy (&self->router);
    zsock_destroy (&self->tap);
    zactor_destroy (&self->auth);
    if (self->lock_fd >= 0)
        close (self->lock_fd);
    sbx_secret_wipe_bytes (self->ports_key, sizeof self->ports_key);
    free (self->instance);
    free (self);
    *self_p = NULL;
}

//  One broker per data directory: a second one would steal the first one's sockets.
static int s_lock (s_server_t *self)
{
    char *path = sbx_config_path (self->config, "run/broker.lock");
    self->lock_fd = path ? open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    int rc = -1;
    if (self->lock_fd < 0)
        sbx_error ("cannot open %s: %s", path, strerror (errno));
    else if (flock (self->lock_fd, LOCK_EX | LOCK_NB))
        sbx_error ("another sbx-broker is running on %s (it holds %s)",
                   sbx_config_data_dir (self->config), path);
    else
        rc = 0;
    free (path);
    return rc;
}

static int s_bind (s_server_t *self, zsock_t *sock, const char *key)
{
    const char *endpoint = sbx_config_get (self->config, key, NULL);
    if (sbx_curve_needed (endpoint)) {
        if (!self->auth)
            self->auth = sbx_curve_auth_new (self->config);
        if (!self->auth || sbx_curve_server (self->config, sock))
            return -1;
    }
    if (zsock_bind (sock, "%s", endpoint) < 0) {
        sbx_error ("cannot bind %s to %s: %s", key, endpoint, zmq_strerror (zmq_errno ()));
        return -1;
    }
    sbx_info ("%s: %s%s", key, endpoint, sbx_curve_needed (endpoint) ? " (CURVE)" : "");
    return 0;
}

static int s_ctx_call (brk_ctx_t *ctx, sbx_role_t role, const char *instance, sbx_msg_t **request_p,
                       uint32_t timeout_ms, brk_call_fn *fn, void *arg);
static void s_ctx_send (brk_ctx_t *ctx, zframe_t *address, sbx_msg_t **msg_p);

//  A one-machine control plane copied into a cluster: its files renamed *.imported,
//  kept for a person to look at or remove, never read again.
static void s_set_aside (const char *file, const char *segments)
{
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        char from[PATH_MAX], to[PATH_MAX];
        snprintf (from, sizeof from, "%s%s", file, suffixes[i]);
        snprintf (to, sizeof to, "%s.imported%s", file, suffixes[i]);
        if (rename (from, to) && errno != ENOENT)
            sbx_warn ("cannot rename %s: %s", from, strerror (errno));
    }
    char to[PATH_MAX];
    snprintf (to, sizeof to, "%s.imported", segments);
    if (rename (segments, to) && errno != ENOENT)
        sbx_warn ("cannot rename %s: %s", segments, strerror (errno));
    sbx_info ("this machine's control plane is in the cluster now: %s set aside as "
              "%s.imported",
              file, file);
}

static s_server_t *s_server_new (sbx_config_t *config, const brk_server_args_t *cluster,
                                 zsock_t *pipe)
{
    s_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->pipe = pipe;
    self->lock_fd = -1;
    self->instance = sbx_secret_id ("brk_");
    self->started_ms = sbx_clock_now_ms ();
    self->heartbeat_ms = sbx_config_get_uint (config, "heartbeat_ms", 1000);
    if (self->heartbeat_ms < 50)
        self->heartbeat_ms = 50;
    //  Checked by the 100 ms deadline timer among others: a second or a heartbeat without
    //  running, whichever is longer, is a stall.
    self->stall = sbx_stall_init (100, self->heartbeat_ms);
    self->default_timeout_ms = sbx_config_get_uint (config, "request_timeout_ms", 30000);
    if (cluster) {
        //  A control node's broker (brk_control holds the data directory's lock): the
        //  store is the cluster's, on this node, while it leads.
        self->node = cluster->node;
        self->store = brk_store_new_cluster (cluster->cluster);
        //  The first node of a cluster made from one machine (sbx cluster init): what
        //  that machine had is copied in once, then its files are set aside.
        char *file = sbx_config_path (config, "broker/control.db");
        char *segments = sbx_config_path (config, "broker/events");
        char err[512];
        int copied = self->store && file && access (file, F_OK) == 0
                         ? brk_store_import (self->store, file, segments, err, sizeof err)
                         : 0;
        if (copied < 0) {
            sbx_error ("cannot copy this machine's control plane into the cluster: %s", err);
            brk_store_destroy (&self->store);
        } else if (copied > 0)
            s_set_aside (file, segments);
        free (file);
        free (segments);
    } else if (s_lock (self)) {
        s_server_destroy (&self);
        return NULL;
    } else {
        char *dir = sbx_config_path (config, "broker");
        char *db = sbx_config_path (config, "broker/control.db");
        if (dir)
            mkdir (dir, 0700);
        self->store = db ? brk_store_new (db) : NULL;
        //  The event log's sealed segments (brk_store.h): control.db holds the recent log.
        char *segments = sbx_config_path (config, "broker/events");
        if (self->store &&
            (!segments || brk_store_segments_open (
                              self->store, segments,
                              sbx_config_get_uint (config, "events.segment_size", S_SEGMENT_SIZE))))
            brk_store_destroy (&self->store);
        free (segments);
        free (dir);
        free (db);
    }
    self->router = zsock_new (ZMQ_ROUTER);
    self->tap = zsock_new (ZMQ_PUB);
    self->registry = brk_registry_new ();
    self->pending = brk_pending_new ();
    self->rates = brk_rates_new (self->registry);
    self->loop = zloop_new ();
    if (!self->store || !self->router || !self->tap || !self->registry || !self->pending ||
        !self->rates || !self->loop || !self->instance) {
        s_server_destroy (&self);
        return NULL;
    }
    zsock_set_linger (self->router, 0);
    zsock_set_sndtimeo (self->router, 0);
    zsock_set_rcvtimeo (self->router, 0);
    zsock_set_router_mandatory (self->router, 1);
    zsock_set_sndhwm (self->router, 100000);
    zsock_set_rcvhwm (self->router, 100000);
    zsock_set_linger (self->tap, 0);
    zsock_set_sndhwm (self->tap, 100000);
    if (s_bind (self, self->router, "broker.bind") || s_bind (self, self->tap, "tap.bind")) {
        s_server_destroy (&self);
        return NULL;
    }
    self->events = brk_events_new (self->store, self->tap);
    if (!self->events) {
        s_server_destroy (&self);
        return NULL;
    }
    self->ctx.config = config;
    if (cluster)
        s_ports_key (self, config);
    self->ctx.control_node = cluster ? cluster->node : NULL;
    self->ctx.control_local = cluster ? cluster->local : NULL;
    self->ctx.store = self->store;
    self->ctx.events = self->events;
    self->ctx.registry = self->registry;
    self->ctx.server = self;
    self->ctx.call = s_ctx_call;
    self->ctx.send = s_ctx_send;
    self->ctx.in_flight = zhashx_new ();
    self->reconcile = brk_reconcile_new (&self->ctx);
    self->hostloss = brk_hostloss_new (&self->ctx);
    self->move = brk_move_new (&self->ctx);
    self->replica = brk_replica_new (&self->ctx);
    if (!self->ctx.in_flight || !self->reconcile || !self->hostloss || !self->move ||
        !self->replica || brk_snapshot_start (&self->ctx)) {
        s_server_destroy (&self);
        return NULL;
    }
    return self;
}

static void s_free_sent (void *data, void *hint)
{
    (void) hint;
    free (data);
}

//  Sends a message to one peer. A peer that went away meanwhile is not an error worth
//  more than a debug line: its requests die with it. An error of the broker's own is
//  counted (sbx_errors_total); one it passes on from a worker was counted there.
static void s_send_ex (s_server_t *self, zframe_t *address, sbx_msg_t **msg_p, bool own)
{
    sbx_msg_t *msg = *msg_p;
    if (!msg)
        return;
    if (own && msg->type == SBX_MSG_ERROR)
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_ERRORS_TOTAL, 1,
                         sbx_code_name (sbx_msg_error (msg)->code));
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    if (sbx_msg_encode (msg, &data, &size, &err))
        sbx_error ("rid=%llu cannot encode %s: %s", (unsigned long long) msg->rid,
                   sbx_msg_type_name (msg->type), err.message);
    else {
        //  The bytes are handed to ZeroMQ, not copied (zmsg_addmem's copy and the page
        //  faults of its fresh buffer were a quarter of the broker's CPU in a 10 MiB PUT).
        void *router = zsock_resolve (self->router);
        zmq_msg_t part;
        bool sent = false;
        if (zmq_msg_init_data (&part, data, size, s_free_sent, NULL) == 0) {
            data = NULL; //  ZeroMQ's now: freed once sent, or by the close below
            if (zmq_send (router, zframe_data (address), zframe_size (address), ZMQ_SNDMORE) >= 0)
                sent = zmq_msg_send (&part, router, 0) >= 0;
            if (!sent)
                zmq_msg_close (&part);
        }
        if (!sent)
            sbx_debug ("rid=%llu %s not delivered: peer gone or full",
                       (unsigned long long) msg->rid, sbx_msg_type_name (msg->type));
    }
    free (data);
    sbx_msg_destroy (msg_p);
}

static void s_send (s_server_t *self, zframe_t *address, sbx_msg_t **msg_p)
{
    s_send_ex (self, address, msg_p, true);
}

static void s_reply_error (s_server_t *self, zframe_t *address, uint64_t rid, sbx_code_t code,
                           const char *message)
{
    sbx_msg_t *error = sbx_msg_new_error (rid, code, "%s", message);
    s_send (self, address, &error);
}

//  Logs a peer.joined or peer.left event. These are audit records of the control plane:
//  which workers served when.
static void s_peer_event (s_server_t *self, brk_peer_t *peer, const char *left_reason)
{
    sbx_msg_t *event;
    if (left_reason) {
        event = sbx_msg_new (SBX_MSG_PEER_LEFT);
        sbx_peer_left_t *body = sbx_msg_peer_left (event);
        body->role = peer->role;
        sbx_str_set (&body->instance, peer->instance);
        sbx_str_set (&body->reason, left_reason);
    } else {
        event = sbx_msg_new (SBX_MSG_PEER_JOINED);
        sbx_peer_joined_t *body = sbx_msg_peer_joined (event);
        body->role = peer->role;
        sbx_str_set (&body->instance, peer->instance);
        body->pid = peer->pid;
        body->capacity = peer->capacity;
    }
    char subject[200];
    snprintf (subject, sizeof subject, "%s/%s", sbx_role_name (peer->role), peer->instance);
    if (brk_events_begin (self->events) || brk_events_add (self->events, &event, NULL, subject) ||
        brk_events_commit (self->events)) {
        brk_events_rollback (self->events);
        sbx_error ("cannot log %s of %s", left_reason ? "peer.left" : "peer.joined", subject);
    }
    sbx_msg_destroy (&event);
}

//  Hands the answer to a routed request to whoever asked: a client (with its own rid)
//  or the broker's own callback. Destroys the request.
static void s_resolve (s_server_t *self, brk_request_t **request_p, sbx_msg_t **answer_p, bool own)
{
    brk_request_t *request = *request_p;
    if (request->fn) {
        self->ctx.answer_is_own = own;
        request->fn (answer_p, request->arg);
        self->ctx.answer_is_own = false;
        sbx_msg_destroy (answer_p);
    } else {
        (*answer_p)->rid = request->client_rid;
        //  A worker's answer, or an error the broker made up for it (a timeout, a
        //  worker gone): those are the broker's own.
        s_send_ex (self, request->client, answer_p, own);
    }
    brk_request_destroy (request_p);
}

static void s_resolve_error (s_server_t *self, brk_request_t **request_p, sbx_code_t code,
                             const char *message)
{
    sbx_msg_t *error = sbx_msg_new_error ((*request_p)->client_rid, code, "%s", message);
    s_resolve (self, request_p, &error, true);
}

//  Answers `unavailable` to every request routed to a worker that is gone; a gateway's
//  rate figures go with it, so the others' shares grow back at once.
static void s_fail_worker_requests (s_server_t *self, brk_peer_t *peer)
{
    if (peer->role == SBX_ROLE_GATEWAY)
        brk_rates_forget (self->rates, peer->routing_id);
    brk_request_t *request;
    while ((request = brk_pending_take_worker (self->pending, peer->routing_id))) {
        char message[400];
        snprintf (message, sizeof message, "%s failed: the worker went away; retry", request->what);
        s_resolve_error (self, &request, SBX_E_UNAVAILABLE, message);
    }
}

//  Tells a worker at `address` that `holder` has its role and instance: what to do.
static void s_refuse_name (s_server_t *self, zframe_t *address, const brk_peer_t *holder)
{
    char since[32];
    sbx_clock_iso8601 (holder->joined_ms, since, sizeof since);
    char message[600];
    snprintf (message, sizeof message,
              "instance name '%s' of role %s is in use by pid %llu (since %s): start this one "
              "with --instance OTHER (or set instance = OTHER in its sbx.conf)",
              holder->instance, sbx_role_name (holder->role), (unsigned long long) holder->pid,
              since);
    s_reply_error (self, address, 0, SBX_E_CONFLICT, message);
}

static void s_on_hello (s_server_t *self, zframe_t *address, sbx_msg_t *msg)
{
    sbx_peer_hello_t *hello = sbx_msg_peer_hello (msg);
    if (hello->role == SBX_ROLE_BROKER || hello->role == SBX_ROLE_CLI) {
        s_reply_error (self, address, msg->rid, SBX_E_INVALID_ARGUMENT,
                       "only gateway, vmd, snapshotd and billing register as workers");
        return;
    }
    //  A newcomer refused its name sends hellos until it hears so: those must not take
    //  the name again from the worker that holds it.
    const brk_peer_t *holder = brk_registry_find (self->registry, hello->role, hello->instance);
    if (holder && brk_registry_refused (self->registry, address)) {
        s_refuse_name (self, address, holder);
        return;
    }
    bool known = brk_registry_seen (self->registry, address) != NULL;
    brk_peer_t *replaced = NULL;
    brk_peer_t *peer =
        brk_registry_hello (self->registry, address, hello->role, hello->instance, hello->pid,
                            hello->process, hello->capacity, hello->used, &replaced);
    if (replaced) {
        sbx_info ("%s %s reconnected (pid %llu → %llu)", sbx_role_name (replaced->role),
                  replaced->instance, (unsigned long long) replaced->pid,
                  (unsigned long long) hello->pid);
        s_fail_worker_requests (self, replaced);
        brk_peer_destroy (&replaced);
    }
    if (!peer) {
        s_reply_error (self, address, msg->rid, SBX_E_INTERNAL, "cannot register");
        return;
    }
    free (peer->relay);
    peer->relay = hello->relay && *hello->relay ? strdup (hello->relay) : NULL;
    if (!known) {
        sbx_info ("%s %s joined (pid %llu, capacity %llu)", sbx_role_name (peer->role),
                  peer->instance, (unsigned long long) peer->pid,
                  (unsigned long long) peer->capacity);
        s_peer_event (self, peer, NULL);
    }
    sbx_msg_t *reply = sbx_msg_new_reply (msg, SBX_MSG_PEER_WELCOME);
    sbx_peer_welcome_t *welcome = sbx_msg_peer_welcome (reply);
    sbx_str_set (&welcome->broker_instance, self->instance);
    welcome->heartbeat_ms = self->heartbeat_ms;
    welcome->last_seq = brk_store_last_seq (self->store);
    //  A cluster's control nodes as they are now: a worker follows every one of them.
    brk_hosts_members (&self->ctx, &welcome->nodes);
    //  Gateways and vmds: the relay's key, over this (CurveZMQ) connection only.
    if (*self->ports_key && (peer->role == SBX_ROLE_GATEWAY || peer->role == SBX_ROLE_VMD))
        sbx_str_set (&welcome->ports_key, self->ports_key);
    s_send (self, address, &reply);
}

//  A message from a connection that a hello from another one displaced: its worker is
//  alive, so this was no restart but two live workers with one name. The first one
//  keeps the name (it never stopped serving); the newcomer is refused, with what to do,
//  and what was routed to it fails as if it had left. Returns the worker, or NULL when
//  `address` was not displaced.
static brk_peer_t *s_revive (s_server_t *self, zframe_t *address)
{
    brk_peer_t *refused = NULL;
    brk_peer_t *peer = brk_registry_revive (self->registry, address, &refused);
    if (!refused)
        return peer;
    char since[32];
    sbx_clock_iso8601 (peer->joined_ms, since, sizeof since);
    sbx_warn ("%s %s: pid %llu took the name of pid %llu (since %s), which still runs: two "
              "live workers, one name; pid %llu is refused",
              sbx_role_name (peer->role), peer->instance, (unsigned long long) refused->pid,
              (unsigned long long) peer->pid, since, (unsigned long long) refused->pid);
    s_refuse_name (self, refused->address, peer);
    s_fail_worker_requests (self, refused);
    s_peer_event (self, refused, "conflict");
    brk_peer_destroy (&refused);
    return peer;
}

static void s_on_bye (s_server_t *self, zframe_t *address, sbx_msg_t *msg)
{
    brk_peer_t *peer = brk_registry_remove (self->registry, address);
    if (!peer)
        return;
    const char *reason = sbx_msg_peer_bye (msg)->reason;
    sbx_info ("%s %s left: %s", sbx_role_name (peer->role), peer->instance,
              reason ? reason : "bye");
    s_fail_worker_requests (self, peer);
    s_peer_event (self, peer, "bye");
    brk_peer_destroy (&peer);
}

static void s_on_status (s_server_t *self, zframe_t *address, sbx_msg_t *msg)
{
    sbx_msg_t *reply = sbx_msg_new_reply (msg, SBX_MSG_SYS_STATUS_OK);
    sbx_sys_status_ok_t *status = sbx_msg_sys_status_ok (reply);
    status->role = SBX_ROLE_BROKER;
    sbx_str_set (&status->instance, self->instance);
    status->pid = (uint64_t) getpid ();
    status->started_ms = self->started_ms;
    sbx_str_set (&status->version, SBX_VERSION);
    if (self->node) {
        sbx_str_set (&status->control, "leader");
        sbx_str_set (&status->node, self->node);
        sbx_str_set (&status->leader, self->node);
    }
    s_send (self, address, &reply);
}

static void s_on_peers (s_server_t *self, zframe_t *address, sbx_msg_t *msg)
{
    sbx_msg_t *reply = sbx_msg_new_reply (msg, SBX_MSG_BROKER_PEERS_OK);
    sbx_broker_peers_ok_t *ok = sbx_msg_broker_peers_ok (reply);
    ok->last_seq = brk_store_last_seq (self->store);
    for (brk_peer_t *p = brk_registry_first (self->registry); p;
         p = brk_registry_next (self->registry)) {
        sbx_peer_info_t *info = sbx_peer_info_list_append (&ok->peers);
        if (!info)
            break;
        info->role = p->role;
        sbx_str_set (&info->instance, p->instance);
        info->pid = p->pid;
        info->capacity = p->capacity;
        info->used = p->used;
        info->joined_ms = p->joined_ms;
        info->last_seen_ms = p->last_seen_ms;
    }
    s_send (self, address, &reply);
}

static void s_count_sandboxes (const char *state, const char *type, uint64_t count, void *arg)
{
    sbx_metrics_set (arg, SBX_METRIC_SANDBOXES, (double) count, state, type);
}

//  The broker's gauges, read when asked rather than tracked: the store and the
//  registry know them already.
static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    s_server_t *self = arg;
    //  Zero for every state and type there is none of: a series does not come and go.
    sbx_metrics_clear (metrics, SBX_METRIC_SANDBOXES);
    for (int state = SBX_SANDBOX_STATE_CREATING; state <= SBX_SANDBOX_STATE_ERROR; state++)
        for (int type = SBX_SANDBOX_TYPE_SMALL; type <= SBX_SANDBOX_TYPE_LARGE; type++)
            if (state != SBX_SANDBOX_STATE_DELETED)
                sbx_metrics_set (metrics, SBX_METRIC_SANDBOXES, 0,
                                 sbx_sandbox_state_name ((sbx_sandbox_state_t) state),
                                 sbx_sandbox_type_name ((sbx_sandbox_type_t) type));
    brk_store_sandbox_counts (self->store, s_count_sandboxes, metrics);
    sbx_metrics_clear (metrics, SBX_METRIC_PEERS_CONNECTED);
    static const sbx_role_t roles[] = {SBX_ROLE_GATEWAY, SBX_ROLE_VMD, SBX_ROLE_SNAPSHOTD,
                                       SBX_ROLE_BILLING};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        size_t n = 0;
        for (brk_peer_t *p = brk_registry_first (self->registry); p;
             p = brk_registry_next (self->registry))
            n += p->role == roles[i];
        sbx_metrics_set (metrics, SBX_METRIC_PEERS_CONNECTED, (double) n, sbx_role_name (roles[i]));
    }
    sbx_metrics_set (metrics, SBX_METRIC_REQUESTS_PENDING,
                     (double) brk_pending_size (self->pending));
}

//  sys.metrics: the broker's own figures and the latest each worker sent, at once (a
//  slow worker is never waited on). The asking worker's own are left out: it adds
//  fresh ones.
static void s_on_metrics (s_server_t *self, zframe_t *address, sbx_msg_t *msg, brk_peer_t *asker)
{
    sbx_metrics_t *metrics = sbx_metrics_here ();
    zchunk_t *text = zchunk_new (NULL, 64 * 1024);
    char *line = sbx_metrics_line (SBX_METRIC_UP, "broker",
                                   sbx_config_get (self->config, "instance", "local"), 1);
    char *own = sbx_metrics_samples (metrics);
    bool ok = text && line && own;
    if (ok) {
        zchunk_extend (text, line, strlen (line));
        zchunk_extend (text, own, strlen (own));
    }
    for (brk_peer_t *p = brk_registry_first (self->registry); ok && p;
         p = brk_registry_next (self->registry)) {
        free (line);
        line = sbx_metrics_line (SBX_METRIC_UP, sbx_role_name (p->role), p->instance, 1);
        ok = line != NULL;
        if (ok)
            zchunk_extend (text, line, strlen (line));
        if (ok && p->metrics && p != asker)
            zchunk_extend (text, p->metrics, strlen (p->metrics));
    }
    free (line);
    free (own);
    if (!ok) {
        zchunk_destroy (&text);
        s_reply_error (self, address, msg->rid, SBX_E_INTERNAL, "out of memory for the metrics");
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (msg, SBX_MSG_SYS_METRICS_OK);
    sbx_msg_sys_metrics_ok (reply)->samples =
        strndup ((char *) zchunk_data (text), zchunk_size (text));
    zchunk_destroy (&text);
    s_send (self, address, &reply);
}

typedef struct {
    sbx_event_list_t *list;
    size_t bytes;
    bool cut;
} s_replay_t;

static void s_replay_row (const brk_event_row_t *row, void *arg)
{
    s_replay_t *replay = arg;
    if (replay->cut)
        return;
    size_t cost = row->payload_size + 128;
    if (replay->list->count > 0 && replay->bytes + cost > S_REPLAY_MAX_BYTES) {
        replay->cut = true;
        return;
    }
    sbx_event_t *event = sbx_event_list_append (replay->list);
    if (!event) {
        replay->cut = true;
        return;
    }
    replay->bytes += cost;
    event->seq = row->seq;
    event->ts_ms = row->ts_ms;
    sbx_str_set (&event->type, row->type);
    sbx_str_set (&event->account, row->account);
    sbx_str_set (&event->subject, row->subject);
    if (row->payload)
        sbx_bytes_set (&event->payload, row->payload, row->payload_size);
}

static void s_on_replay (s_server_t *self, zframe_t *address, sbx_msg_t *msg)
{
    sbx_events_replay_t *args = sbx_msg_events_replay (msg);
    size_t limit = args->limit ? args->limit : S_REPLAY_DEFAULT;
    if (limit > S_REPLAY_MAX)
        limit = S_REPLAY_MAX;
    sbx_msg_t *reply = sbx_msg_new_reply (msg, SBX_MSG_EVENTS_REPLAY_OK);
    sbx_events_replay_ok_t *ok = sbx_msg_events_replay_ok (reply);
    s_replay_t replay = {&ok->events, 0, false};
    ok->last_seq = brk_store_last_seq (self->store);
    int rows = brk_store_events_after (self->store, args->after_seq, limit, args->prefix,
                                       s_replay_row, &replay);
    if (rows < 0) {
        sbx_msg_destroy (&reply);
        s_reply_error (self, address, msg->rid, SBX_E_INTERNAL, "cannot read the event log");
        return;
    }
    ok->more = replay.cut || (size_t) rows == limit;
    s_send (self, address, &reply);
}

//  Routes a request to a worker of `role`, remembering who asked.
static void s_route (s_server_t *self, zframe_t *address, sbx_msg_t **msg_p, sbx_role_t role)
{
    sbx_msg_t *msg = *msg_p;
    brk_peer_t *worker = brk_registry_pick (self->registry, role, msg->instance);
    char message[400];
    if (!worker) {
        if (msg->instance)
            snprintf (message, sizeof message, "no %s named '%s' is connected to the broker",
                      sbx_role_name (role), msg->instance);
        else
            snprintf (message, sizeof message, "no %s is connected to the broker; is it running?",
                      sbx_role_name (role));
        s_reply_error (self, address, msg->rid, SBX_E_UNAVAILABLE, message);
        return;
    }
    uint64_t timeout = msg->timeout_ms ? msg->timeout_ms : self->default_timeout_ms;
    if (timeout > S_MAX_TIMEOUT_MS)
        timeout = S_MAX_TIMEOUT_MS;
    char what[300];
    snprintf (what, sizeof what, "%s to %s %s", sbx_msg_type_name (msg->type), sbx_role_name (role),
              worker->instance);
    uint64_t rid = brk_pending_add (self->pending, address, msg->rid, worker->routing_id, what,
                                    sbx_clock_mono_ms () + timeout);
    if (!rid) {
        s_reply_error (self, address, msg->rid, SBX_E_INTERNAL, "out of memory");
        return;
    }
    sbx_debug ("rid=%llu routed %s as rid=%llu", (unsigned long long) msg->rid, what,
               (unsigned long long) rid);
    msg->rid = rid;
    msg->timeout_ms = (uint32_t) timeout;
    zframe_t *to = zframe_dup (worker->address);
    s_send (self, to, msg_p);
    zframe_destroy (&to);
}

static void s_on_worker_reply (s_server_t *self, zframe_t *address, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    char *worker = zframe_strhex (address);
    brk_request_t *request = worker ? brk_pending_take (self->pending, msg->rid, worker) : NULL;
    free (worker);
    if (!request) {
        sbx_debug ("rid=%llu late or unexpected %s dropped", (unsigned long long) msg->rid,
                   sbx_msg_type_name (msg->type));
        return;
    }
    s_resolve (self, &request, msg_p, false);
}

typedef struct {
    brk_ctx_t *ctx;
    brk_call_fn *fn;
    void *arg;
} s_call_t;

static void s_on_call_answer (sbx_msg_t **reply_p, void *arg)
{
    s_call_t *call = arg;
    if (call->fn) //  NULL: nobody waits for the answer
        call->fn (call->ctx, reply_p, call->arg);
    free (call);
}

static int s_ctx_call (brk_ctx_t *ctx, sbx_role_t role, const char *instance, sbx_msg_t **request_p,
                       uint32_t timeout_ms, brk_call_fn *fn, void *arg)
{
    s_server_t *self = ctx->server;
    brk_peer_t *worker = brk_registry_pick (self->registry, role, instance);
    if (!worker) {
        sbx_msg_destroy (request_p);
        return -1;
    }
    s_call_t *call = calloc (1, sizeof *call);
    sbx_msg_t *request = *request_p;
    char what[300];
    snprintf (what, sizeof what, "%s to %s %s", sbx_msg_type_name (request->type),
              sbx_role_name (role), worker->instance);
    uint64_t timeout = timeout_ms ? timeout_ms : self->default_timeout_ms;
    uint64_t rid =
        call ? brk_pending_add_call (self->pending, worker->routing_id, what,
                                     sbx_clock_mono_ms () + timeout, s_on_call_answer, call)
             : 0;
    if (!rid) {
        free (call);
        sbx_msg_destroy (request_p);
        return -1;
    }
    call->ctx = ctx;
    call->fn = fn;
    call->arg = arg;
    request->rid = rid;
    request->timeout_ms = (uint32_t) timeout;
    if (!request->caller) {
        request->caller = calloc (1, sizeof (sbx_caller_t));
        if (request->caller)
            request->caller->kind = SBX_CALLER_KIND_SYSTEM;
    }
    zframe_t *to = zframe_dup (worker->address);
    s_send (self, to, request_p);
    zframe_destroy (&to);
    return 0;
}

static void s_ctx_send (brk_ctx_t *ctx, zframe_t *address, sbx_msg_t **msg_p)
{
    s_send (ctx->server, address, msg_p);
}

static bool s_is_gateway (brk_peer_t *peer)
{
    return peer && peer->role == SBX_ROLE_GATEWAY;
}

//  A person's credential: an API key, an OAuth token, a signed-in page.
static bool s_user_caller (const sbx_caller_t *caller)
{
    return caller && caller->account_id &&
           (caller->kind == SBX_CALLER_KIND_API_KEY || caller->kind == SBX_CALLER_KIND_OAUTH ||
            caller->kind == SBX_CALLER_KIND_SESSION);
}

//  One switch from message type to handler: grep a name from schemas/ to land here.
static void s_dispatch (s_server_t *self, zframe_t *address, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    brk_peer_t *peer = brk_registry_seen (self->registry, address);
    if (!peer && msg->type != SBX_MSG_PEER_BYE)
        peer = s_revive (self, address); //  (a displaced worker that leaves just goes)
    sbx_msg_t *reply = NULL;
    //  sandbox.get and sandbox.list only read: their statements, the check below's too,
    //  in one read transaction rather than one each (each takes and drops the file locks).
    int reading = msg->type == SBX_MSG_SANDBOX_GET || msg->type == SBX_MSG_SANDBOX_LIST
                      ? brk_store_read_begin (self->store)
                      : 0;
    //  A disabled (or deleted) account acts no more, whatever a gateway still holds of its
    //  credentials: the broker has the last word on every request such a caller makes.
    if (s_user_caller (msg->caller) && !sbx_msg_type_is_reply (msg->type)) {
        reply = brk_accounts_refuse_disabled (&self->ctx, msg->caller->account_id, msg->rid);
        if (reply) {
            brk_store_read_end (self->store, reading);
            s_send (self, address, &reply);
            return;
        }
    }
    switch (msg->type) {
    case SBX_MSG_PEER_HELLO:
        s_on_hello (self, address, msg);
        return;
    case SBX_MSG_PEER_HEARTBEAT:
        if (peer) {
            sbx_peer_heartbeat_t *beat = sbx_msg_peer_heartbeat (msg);
            peer->used = beat->used;
            if (beat->metrics) {
                free (peer->metrics);
                peer->metrics = beat->metrics;
                beat->metrics = NULL;
            }
        } else {
            //  A worker we don't know (we restarted, or dropped it): have it hello again.
            sbx_msg_t *unknown = sbx_msg_new (SBX_MSG_PEER_UNKNOWN);
            s_send (self, address, &unknown);
        }
        return;
    case SBX_MSG_PEER_BYE:
        s_on_bye (self, address, msg);
        return;
    case SBX_MSG_SYS_STATUS:
        if (!msg->route || streq (msg->route, "broker"))
            s_on_status (self, address, msg);
        else {
            sbx_role_t role;
            if (sbx_role_from_name (msg->route, &role) || role == SBX_ROLE_CLI)
                s_reply_error (self, address, msg->rid, SBX_E_INVALID_ARGUMENT,
                               "route must be broker, gateway, vmd, snapshotd or billing");
            else
                s_route (self, address, msg_p, role);
        }
        return;
    case SBX_MSG_BROKER_PEERS:
        s_on_peers (self, address, msg);
        return;
    case SBX_MSG_SYS_METRICS:
        s_on_metrics (self, address, msg, peer);
        return;
    case SBX_MSG_EVENTS_REPLAY:
        s_on_replay (self, address, msg);
        return;
    case SBX_MSG_ACCOUNT_CREATE:
        reply = brk_accounts_create (&self->ctx, msg);
        break;
    case SBX_MSG_KEY_CREATE:
        reply = brk_accounts_key_create (&self->ctx, msg);
        break;
    case SBX_MSG_KEY_LIST:
        reply = brk_accounts_key_list (&self->ctx, msg);
        break;
    case SBX_MSG_KEY_REVOKE:
        reply = brk_accounts_key_revoke (&self->ctx, msg);
        break;
    case SBX_MSG_ACCOUNT_LIST:
        reply = brk_admin_list (&self->ctx, msg);
        break;
    case SBX_MSG_CLUSTER_TOKEN:
        reply = brk_hosts_token (&self->ctx, msg);
        break;
    case SBX_MSG_HOST_LIST:
        reply = brk_hosts_list (&self->ctx, msg);
        break;
    case SBX_MSG_HOST_REMOVE:
        reply = brk_hosts_remove (&self->ctx, msg);
        break;
    case SBX_MSG_HOST_DRAIN:
        reply = brk_hosts_drain (&self->ctx, msg);
        break;
    case SBX_MSG_CLUSTER_NODES:
        reply = brk_hosts_nodes (&self->ctx, msg);
        break;
    case SBX_MSG_CLUSTER_REMOVE:
        reply = brk_hosts_remove_node (&self->ctx, msg);
        break;
    case SBX_MSG_ACCOUNT_GET:
        reply = brk_admin_get (&self->ctx, msg);
        break;
    case SBX_MSG_ACCOUNT_UPDATE:
        reply = brk_admin_update (&self->ctx, msg);
        break;
    case SBX_MSG_ACCOUNT_DELETE:
        reply = brk_admin_delete (&self->ctx, msg);
        break;
    case SBX_MSG_WALLET_CREDIT:
        reply = brk_accounts_wallet_credit (&self->ctx, msg);
        break;
    case SBX_MSG_WALLET_ACTIVATE:
        reply = brk_accounts_wallet_activate (&self->ctx, msg);
        break;
    case SBX_MSG_AUTH_KEY:
        reply = brk_accounts_auth_key (&self->ctx, msg);
        break;
    //  OAuth: credentials for any account are minted here, so gateways only.
    case SBX_MSG_OAUTH_CLIENT_REGISTER:
        reply = brk_oauth_client_register (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_OAUTH_CLIENT_GET:
        reply = brk_oauth_client_get (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_OAUTH_PASSWORD:
        reply = brk_oauth_password (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_OAUTH_AUTHORIZE:
        reply = brk_oauth_authorize (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_OAUTH_TOKEN:
        reply = brk_oauth_token (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_OAUTH_REVOKE:
        reply = brk_oauth_revoke (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_MCP_SESSION_OPEN:
        reply = brk_sessions_open (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_MCP_SESSION_GET:
        reply = brk_sessions_get (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_MCP_SESSION_USE:
        reply = brk_sessions_use (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_MCP_SESSION_END:
        reply = brk_sessions_end (&self->ctx, msg, s_is_gateway (peer));
        break;
    case SBX_MSG_SANDBOX_CREATE:
        reply = sbx_msg_sandbox_create (msg)->snapshot_id || sbx_msg_sandbox_create (msg)->template
                    ? brk_snapshot_create (&self->ctx, address, msg)
                    : brk_sandbox_create (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_GET:
        reply = brk_sandbox_get (&self->ctx, msg);
        brk_store_read_end (self->store, reading);
        break;
    case SBX_MSG_SANDBOX_LIST:
        reply = brk_sandbox_list (&self->ctx, msg);
        brk_store_read_end (self->store, reading);
        break;
    case SBX_MSG_SANDBOX_STOP:
    case SBX_MSG_SANDBOX_RESUME:
    case SBX_MSG_SANDBOX_DELETE:
        reply = brk_sandbox_change (&self->ctx, address, msg);
        break;
    case SBX_MSG_USAGE_GET:
        //  Billing's figures: routed by type (a client's `route` steers nothing else).
        s_route (self, address, msg_p, SBX_ROLE_BILLING);
        return;
    case SBX_MSG_WEBHOOK_CREATE:
    case SBX_MSG_WEBHOOK_LIST:
    case SBX_MSG_WEBHOOK_GET:
    case SBX_MSG_WEBHOOK_DELETE:
    case SBX_MSG_WEBHOOK_DELIVERIES:
        //  sbx-hookd owns webhooks; it checks the caller's account itself.
        s_route (self, address, msg_p, SBX_ROLE_HOOKS);
        return;
    case SBX_MSG_SNAPSHOT_LIST:
        reply = brk_snapshot_list_account (&self->ctx, msg);
        if (reply)
            break;
        s_route (self, address, msg_p, SBX_ROLE_SNAPSHOTD);
        return;
    case SBX_MSG_BUILD_GET:
    case SBX_MSG_SSE_MESSAGE:
        //  A gateway asks another about what lives there (schemas/gateways.json): from a
        //  gateway, to the one the instance names, never to whichever gateway.
        if (!peer || peer->role != SBX_ROLE_GATEWAY)
            s_reply_error (self, address, msg->rid, SBX_E_PERMISSION_DENIED,
                           "this request is between gateways: use the REST API or MCP");
        else if (!msg->instance || !*msg->instance)
            s_reply_error (self, address, msg->rid, SBX_E_INVALID_ARGUMENT,
                           "a request between gateways names the gateway to ask (instance)");
        else
            s_route (self, address, msg_p, SBX_ROLE_GATEWAY);
        return;
    case SBX_MSG_SNAPSHOT_GET:
        //  snapshotd's catalog answers these; it checks the caller's account itself.
        s_route (self, address, msg_p, SBX_ROLE_SNAPSHOTD);
        return;
    case SBX_MSG_SNAPSHOT_SAVE:
        reply = brk_snapshot_save (&self->ctx, address, msg);
        break;
    case SBX_MSG_SNAPSHOT_DELETE:
        reply = brk_snapshot_delete (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_FORK:
        reply = brk_fork (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_EXTEND:
        reply = brk_sandbox_extend (&self->ctx, msg);
        break;
    case SBX_MSG_SANDBOX_UPDATE:
        reply = brk_sandbox_update (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_AGENT:
        reply = brk_sandbox_agent (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_PORT:
        reply = brk_ports_port (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_METRICS:
        reply = brk_metrics_get (&self->ctx, address, msg);
        break;
    case SBX_MSG_SANDBOX_RESOLVE:
        reply = brk_ports_resolve (&self->ctx, msg, peer && peer->role == SBX_ROLE_GATEWAY);
        break;
    case SBX_MSG_SANDBOX_WAKE:
        reply = brk_sandbox_wake (&self->ctx, address, msg, peer && peer->role == SBX_ROLE_GATEWAY);
        break;
    case SBX_MSG_VM_FAILED:
        if (peer && peer->role == SBX_ROLE_VMD)
            brk_sandbox_vm_failed (&self->ctx, peer->instance, msg);
        return;
    case SBX_MSG_RATE_REPORT:
        reply = brk_rates_report (self->rates, s_is_gateway (peer) ? peer : NULL, msg);
        break;
    case SBX_MSG_ACCOUNT_FUNDS:
        if (peer && peer->role == SBX_ROLE_BILLING)
            brk_limits_funds (&self->ctx, msg);
        return;
    default:
        if (sbx_msg_type_is_reply (msg->type)) {
            if (peer)
                s_on_worker_reply (self, address, msg_p);
            return;
        }
        reply = sbx_msg_new_error (msg->rid, SBX_E_INVALID_ARGUMENT,
                                   "the broker does not handle %s", sbx_msg_type_name (msg->type));
        break;
    }
    s_send (self, address, &reply);
}

static int s_on_router (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    s_server_t *self = arg;
    //  Bounded batch: a flood from one peer must not starve timers.
    for (int i = 0; i < 1000; i++) {
        zmsg_t *in = zmsg_recv (sock);
        if (!in)
            break;
        zframe_t *address = zmsg_pop (in);
        zframe_t *body = zmsg_pop (in);
        if (!address || !body || zmsg_size (in) != 0) {
            sbx_warn ("malformed multipart message dropped (%zu extra frames)", zmsg_size (in));
        } else {
            sbx_err_t err;
            sbx_msg_t *msg = sbx_msg_decode (zframe_data (body), zframe_size (body), &err);
            if (msg) {
                s_dispatch (self, address, &msg);
                sbx_msg_destroy (&msg);
            } else {
                sbx_warn ("rid=%llu bad frame: %s", (unsigned long long) err.rid, err.message);
                if (err.rid)
                    s_reply_error (self, address, err.rid, err.code, err.message);
            }
        }
        zframe_destroy (&address);
        zframe_destroy (&body);
        zmsg_destroy (&in);
    }
    return 0;
}

//  From each timer, first: after a stall of the broker itself (sbx_stall.h) its workers'
//  silence and its requests' waiting are the broker's doing. Each worker is heard from
//  anew (it has three heartbeats to show it is there) and each deadline moves by the
//  stall, so that what they sent meanwhile is read before anyone is judged.
static void s_check_stall (s_server_t *self)
{
    uint64_t now = sbx_clock_mono_ms ();
    uint64_t gap = sbx_stall_check (&self->stall, now);
    if (!gap)
        return;
    sbx_warn ("the broker did not run for %llu ms (its process stopped, or its machine paused "
              "or starved): its %zu workers are heard from anew and %zu requests in flight "
              "get that time back",
              (unsigned long long) gap, brk_registry_size (self->registry),
              brk_pending_size (self->pending));
    for (brk_peer_t *p = brk_registry_first (self->registry); p;
         p = brk_registry_next (self->registry))
        p->last_seen_mono = now;
    brk_pending_postpone (self->pending, gap);
}

static int s_on_heartbeat (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    s_check_stall (self);
    uint64_t now = sbx_clock_mono_ms ();
    uint64_t cutoff = now > 3 * self->heartbeat_ms ? now - 3 * self->heartbeat_ms : 0;
    brk_peer_t *gone;
    while ((gone = brk_registry_expire_one (self->registry, cutoff))) {
        sbx_warn ("%s %s silent for %llu ms: dropped", sbx_role_name (gone->role), gone->instance,
                  (unsigned long long) (now - gone->last_seen_mono));
        s_fail_worker_requests (self, gone);
        s_peer_event (self, gone, "silent");
        brk_peer_destroy (&gone);
    }
    for (brk_peer_t *p = brk_registry_first (self->registry); p;
         p = brk_registry_next (self->registry)) {
        sbx_msg_t *beat = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
        s_send (self, p->address, &beat);
    }
    return 0;
}

static int s_on_deadlines (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    s_check_stall (self);
    uint64_t now = sbx_clock_mono_ms ();
    brk_request_t *request;
    while ((request = brk_pending_take_expired (self->pending, now))) {
        char message[400];
        snprintf (message, sizeof message, "%s got no answer before its deadline", request->what);
        sbx_warn ("rid=%llu %s", (unsigned long long) request->client_rid, message);
        s_resolve_error (self, &request, SBX_E_TIMEOUT, message);
    }
    return 0;
}

//  Housekeeping: MCP sessions idle for a day, a few a minute.
//  Sealing the event log's oldest events into a segment, a chunk per tick, so the loop
//  never stops for long.
static int s_on_seal (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    brk_store_segments_step (self->store, S_SEGMENT_CHUNK);
    return 0;
}

static int s_on_sweep (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    brk_sessions_sweep (&self->ctx);
    return 0;
}

//  TTL deadlines: four times a second, so a sandbox stops within a second of its time.
static int s_on_ttl (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    brk_sandbox_tick (&self->ctx);
    return 0;
}

//  Sandboxes a broker before this one left on their way, settled by their vmds.
static int s_on_reconcile (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_server_t *self = arg;
    s_check_stall (self); //  before hostloss judges a vmd by its silence
    brk_reconcile_tick (self->reconcile);
    brk_hostloss_tick (self->hostloss);
    brk_move_tick (self->move);
    brk_replica_tick (self->replica);
    return 0;
}

static int s_on_pipe (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    (void) arg;
    char *command = zstr_recv (pipe);
    bool term = !command || streq (command, "$TERM");
    zstr_free (&command);
    return term ? -1 : 0;
}

static void s_actor (zsock_t *pipe, sbx_config_t *config, const brk_server_args_t *cluster)
{
    s_server_t *self = s_server_new (config, cluster, pipe);
    zsock_signal (pipe, 0); //  zactor_new returns; the status line says how it went
    if (!self) {
        zstr_send (pipe, "FAILED");
        //  Wait for $TERM so the caller's zactor_destroy completes.
        char *command = zstr_recv (pipe);
        zstr_free (&command);
        return;
    }
    zloop_reader (self->loop, self->router, s_on_router, self);
    zloop_reader (self->loop, pipe, s_on_pipe, self);
    sbx_metrics_on_collect (sbx_metrics_here (), s_collect, self);
    zloop_timer (self->loop, self->heartbeat_ms, 0, s_on_heartbeat, self);
    zloop_timer (self->loop, 100, 0, s_on_deadlines, self);
    zloop_timer (self->loop, 250, 0, s_on_ttl, self);
    zloop_timer (self->loop, 1000, 0, s_on_reconcile, self);
    zloop_timer (self->loop, 10000, 0, s_on_sweep, self);
    zloop_timer (self->loop, 100, 0, s_on_seal, self);
    sbx_info ("broker %s ready: %llu events in the log", self->instance,
              (unsigned long long) brk_store_last_seq (self->store));
    zstr_send (pipe, "READY");
    //  Interrupts (SIGINT/SIGTERM) are the main thread's business: keep looping until
    //  the pipe says $TERM.
    zloop_set_nonstop (self->loop, true);
    zloop_start (self->loop);
    sbx_metrics_off_collect (sbx_metrics_here (), s_collect, self);
    s_server_destroy (&self);
}

void brk_server_actor (zsock_t *pipe, void *args)
{
    s_actor (pipe, args, NULL);
}

void brk_server_cluster_actor (zsock_t *pipe, void *args)
{
    brk_server_args_t *server = args;
    s_actor (pipe, server->config, server);
}

//  --------------------------------------------------------------------------
//  Self test: a real broker actor on ipc:// sockets in a temporary directory, driven
//  by raw DEALER sockets (clients, a worker that never answers) and by sbx_peer
//  workers in a zloop thread.

void brk_server_test (bool verbose)
{
    sbx_log_init ("brk_server_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    char dir[] = "/tmp/brk_server_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    sbx_config_set (config, "heartbeat_ms", "100");
    sbx_config_set (config, "request_timeout_ms", "2000");

    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);

    //  A second broker on the same data directory refuses to start.
    zactor_t *second = zactor_new (brk_server_actor, config);
    status = zstr_recv (second);
    assert (status && streq (status, "FAILED"));
    zstr_free (&status);
    zactor_destroy (&second);

    zsock_t *tap = zsock_new_sub (sbx_config_get (config, "tap.endpoint", NULL), "");
    zsock_t *client = brk_testkit_dealer (config);
    uint64_t rid = 100;

    //  The broker's own status.
    sbx_msg_t *reply = brk_testkit_call (client, sbx_msg_new (SBX_MSG_SYS_STATUS), ++rid);
    assert (reply->type == SBX_MSG_SYS_STATUS_OK);
    assert (sbx_msg_sys_status_ok (reply)->role == SBX_ROLE_BROKER);
    sbx_msg_destroy (&reply);

    //  Routing to a role nobody serves: unavailable, at once.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_str_set (&request->route, "vmd");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_UNAVAILABLE);
    sbx_msg_destroy (&reply);

    //  Two vmds and two gateways register at once (sbx_peer in threads).
    zactor_t *workers[] = {brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 4, NULL, NULL),
                           brk_testkit_worker (config, SBX_ROLE_VMD, "host-b", 4, NULL, NULL),
                           brk_testkit_worker (config, SBX_ROLE_GATEWAY, "gw-1", 0, NULL, NULL),
                           brk_testkit_worker (config, SBX_ROLE_GATEWAY, "gw-2", 0, NULL, NULL)};
    for (int tries = 0; tries < 100; tries++) {
        if (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++rid) == 2 &&
            brk_testkit_peer_count (client, SBX_ROLE_GATEWAY, ++rid) == 2)
            break;
        zclock_sleep (50);
    }
    assert (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++rid) == 2);
    assert (brk_testkit_peer_count (client, SBX_ROLE_GATEWAY, ++rid) == 2);

    //  A request routed to a named vmd comes back from that vmd, with our rid.
    request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_str_set (&request->route, "vmd");
    sbx_str_set (&request->instance, "host-b");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_SYS_STATUS_OK && reply->rid == rid);
    assert (streq (sbx_msg_sys_status_ok (reply)->instance, "host-b"));
    sbx_msg_destroy (&reply);
    //  And to some gateway.
    request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_str_set (&request->route, "gateway");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_SYS_STATUS_OK);
    assert (sbx_msg_sys_status_ok (reply)->role == SBX_ROLE_GATEWAY);
    sbx_msg_destroy (&reply);
    //  A worker that isn't there by name.
    request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_str_set (&request->route, "vmd");
    sbx_str_set (&request->instance, "host-z");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_UNAVAILABLE);
    sbx_msg_destroy (&reply);

    //  Between gateways (schemas/gateways.json): from a gateway that names the one to ask,
    //  to that one only. Anyone else is refused, and so is a request naming no gateway.
    zsock_t *gw3 = brk_testkit_dealer (config);
    request = sbx_msg_new (SBX_MSG_PEER_HELLO);
    sbx_msg_peer_hello (request)->role = SBX_ROLE_GATEWAY;
    sbx_str_set (&sbx_msg_peer_hello (request)->instance, "gw-3");
    request->rid = 1;
    brk_testkit_send (gw3, &request);
    reply = brk_testkit_recv (gw3, 5000);
    assert (reply && reply->type == SBX_MSG_PEER_WELCOME);
    sbx_msg_destroy (&reply);
    for (int i = 0; i < 4; i++) {
        bool from_gateway = i >= 2, named = i % 2 == 1;
        request = sbx_msg_new (i % 2 ? SBX_MSG_BUILD_GET : SBX_MSG_SSE_MESSAGE);
        if (request->type == SBX_MSG_BUILD_GET)
            sbx_str_set (&sbx_msg_build_get (request)->build_id, "bld_0123456789");
        else {
            sbx_str_set (&sbx_msg_sse_message (request)->stream_id, "sse_0123456789");
            sbx_str_set (&sbx_msg_sse_message (request)->message, "{\"jsonrpc\":\"2.0\"}");
        }
        sbx_str_set (&request->route, "gateway");
        if (named)
            sbx_str_set (&request->instance, "gw-2");
        if (from_gateway) { //  it beats, or it is dropped after 300 ms and is nobody
            sbx_msg_t *beat = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
            brk_testkit_send (gw3, &beat);
        }
        reply = brk_testkit_call (from_gateway ? gw3 : client, request, ++rid);
        if (!from_gateway)
            assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
        else if (!named)
            assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
        else //  gw-2 (a worker that answers everything with its status) had it
            assert (reply->type == SBX_MSG_SYS_STATUS_OK &&
                    streq (sbx_msg_sys_status_ok (reply)->instance, "gw-2"));
        sbx_msg_destroy (&reply);
    }
    zsock_destroy (&gw3);

    //  A worker that registers but never answers: the request times out.
    zsock_t *mute = brk_testkit_dealer (config);
    request = sbx_msg_new (SBX_MSG_PEER_HELLO);
    sbx_peer_hello_t *hello = sbx_msg_peer_hello (request);
    hello->role = SBX_ROLE_SNAPSHOTD;
    sbx_str_set (&hello->instance, "mute");
    request->rid = 1;
    brk_testkit_send (mute, &request);
    reply = brk_testkit_recv (mute, 5000);
    assert (reply && reply->type == SBX_MSG_PEER_WELCOME && reply->rid == 1);
    assert (sbx_msg_peer_welcome (reply)->heartbeat_ms == 100);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    sbx_str_set (&request->route, "snapshotd");
    request->timeout_ms = 150; //  under the 300 ms it takes to drop a silent worker
    int64_t start = zclock_mono ();
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_TIMEOUT);
    assert (zclock_mono () - start >= 140);
    sbx_msg_destroy (&reply);
    //  The mute worker got the request with the broker's own rid, not ours.
    sbx_msg_t *routed = brk_testkit_recv (mute, 1000);
    while (routed && routed->type == SBX_MSG_PEER_HEARTBEAT) {
        sbx_msg_destroy (&routed);
        routed = brk_testkit_recv (mute, 1000);
    }
    assert (routed && routed->type == SBX_MSG_SYS_STATUS);
    //  Its late answer is dropped, not delivered.
    sbx_msg_t *late = sbx_msg_new_reply (routed, SBX_MSG_SYS_STATUS_OK);
    sbx_msg_sys_status_ok (late)->role = SBX_ROLE_SNAPSHOTD;
    sbx_str_set (&sbx_msg_sys_status_ok (late)->instance, "mute");
    brk_testkit_send (mute, &late);
    sbx_msg_destroy (&routed);
    //  Silent for three heartbeats: dropped, with a peer.left event.
    zclock_sleep (600);
    assert (brk_testkit_peer_count (client, SBX_ROLE_SNAPSHOTD, ++rid) == 0);
    //  Its next heartbeat is answered peer.unknown.
    sbx_msg_t *beat = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
    brk_testkit_send (mute, &beat);
    sbx_msg_t *unknown = brk_testkit_recv (mute, 2000);
    while (unknown && unknown->type != SBX_MSG_PEER_UNKNOWN) {
        sbx_msg_destroy (&unknown);
        unknown = brk_testkit_recv (mute, 2000);
    }
    assert (unknown);
    sbx_msg_destroy (&unknown);
    zsock_destroy (&mute);

    //  Bad input: garbage, an unknown type with a readable rid, extra frames.
    zframe_t *garbage = zframe_new ("\xc1\xff\x00garbage", 10);
    zframe_send (&garbage, client, 0);
    zmsg_t *multi = zmsg_new ();
    zmsg_addstr (multi, "one");
    zmsg_addstr (multi, "two");
    zmsg_send (&multi, client);
    //  {"type": "no.such", "rid": 7}
    const uint8_t unknown_type[] = {0x82, 0xa4, 't', 'y', 'p',  'e', 0xa7, 'n', 'o', '.',
                                    's',  'u',  'c', 'h', 0xa3, 'r', 'i',  'd', 0x07};
    zframe_t *frame = zframe_new (unknown_type, sizeof unknown_type);
    zframe_send (&frame, client, 0);
    reply = brk_testkit_recv (client, 2000);
    assert (reply && reply->type == SBX_MSG_ERROR && reply->rid == 7);
    assert (sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    //  A request the broker doesn't serve.
    reply = brk_testkit_call (client, sbx_msg_new (SBX_MSG_PEER_UNKNOWN), ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);

    //  Accounts and keys, with their events.
    request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, "Bob@Example.COM");
    sbx_msg_account_create (request)->with_key = true;
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    sbx_account_create_ok_t *created = sbx_msg_account_create_ok (reply);
    assert (streq (created->email, "bob@example.com"));
    assert (strncmp (created->api_key, "sbx_", 4) == 0 && strlen (created->api_key) == 47);
    char *account_id = strdup (created->account_id);
    sbx_msg_destroy (&reply);
    //  Same email again: conflict. A bad email: invalid_argument. No caller: refused.
    request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, "bob@example.com");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_CONFLICT);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, "not an email");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    //  A user's key can't create accounts, nor see another account's keys.
    char *eve = brk_testkit_account (client, "eve@example.com", ++rid);
    request = sbx_msg_new (SBX_MSG_KEY_LIST);
    sbx_str_set (&sbx_msg_key_list (request)->account, account_id);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_API_KEY;
    sbx_str_set (&request->caller->account_id, eve);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    //  A caller of an account that is not there (none, or deleted) is nobody.
    request = sbx_msg_new (SBX_MSG_KEY_LIST);
    sbx_str_set (&sbx_msg_key_list (request)->account, account_id);
    request->caller = brk_testkit_caller ("acc_someoneelse", "key_x", SBX_KEY_PRESET_FULL);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_UNAUTHENTICATED);
    sbx_msg_destroy (&reply);
    free (eve);

    request = sbx_msg_new (SBX_MSG_KEY_CREATE);
    sbx_str_set (&sbx_msg_key_create (request)->account, "bob@example.com");
    sbx_msg_key_create (request)->preset = SBX_KEY_PRESET_READ_ONLY;
    sbx_msg_key_create (request)->expires_in_s = 3600;
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_KEY_CREATE_OK);
    char *key_id = strdup (sbx_msg_key_create_ok (reply)->key_id);
    char *secret = strdup (sbx_msg_key_create_ok (reply)->key);
    assert (sbx_msg_key_create_ok (reply)->expires_ms > sbx_clock_now_ms ());
    sbx_msg_destroy (&reply);
    //  The key authenticates (as its account, with its preset) until it is revoked.
    request = sbx_msg_new (SBX_MSG_AUTH_KEY);
    sbx_str_set (&sbx_msg_auth_key (request)->key, secret);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_AUTH_KEY_OK);
    assert (streq (sbx_msg_auth_key_ok (reply)->caller->account_id, account_id));
    assert (sbx_msg_auth_key_ok (reply)->caller->preset == SBX_KEY_PRESET_READ_ONLY);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_KEY_REVOKE);
    sbx_str_set (&sbx_msg_key_revoke (request)->key_id, key_id);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_KEY_REVOKE_OK);
    sbx_msg_destroy (&reply);
    const char *bad_keys[] = {secret, "sbx_nonsense", "not-a-key", ""};
    for (int i = 0; i < 4; i++) {
        request = sbx_msg_new (SBX_MSG_AUTH_KEY);
        sbx_str_set (&sbx_msg_auth_key (request)->key, bad_keys[i]);
        reply = brk_testkit_call (client, request, ++rid);
        assert (reply->type == SBX_MSG_ERROR);
        assert (sbx_msg_error (reply)->code == SBX_E_UNAUTHENTICATED);
        sbx_msg_destroy (&reply);
    }
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_KEY_LIST);
    sbx_str_set (&sbx_msg_key_list (request)->account, account_id);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_KEY_LIST_OK);
    assert (sbx_msg_key_list_ok (reply)->keys.count == 2);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_KEY_REVOKE);
    sbx_str_set (&sbx_msg_key_revoke (request)->key_id, "key_nonexistent");
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  The log: replay returns seq 1..N in order, and the tap published the same ones.
    request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    reply = brk_testkit_call (client, request, ++rid);
    assert (reply->type == SBX_MSG_EVENTS_REPLAY_OK);
    sbx_events_replay_ok_t *replay = sbx_msg_events_replay_ok (reply);
    assert (replay->events.count == replay->last_seq && !replay->more);
    bool saw_left = false, saw_revoked = false;
    for (size_t i = 0; i < replay->events.count; i++) {
        assert (replay->events.items[i].seq == i + 1);
        saw_left |= streq (replay->events.items[i].type, "peer.left");
        saw_revoked |= streq (replay->events.items[i].type, "key.revoked");
    }
    assert (saw_left && saw_revoked);
    uint64_t last_seq = replay->last_seq;
    sbx_msg_destroy (&reply);
    uint64_t expect = 1;
    while (expect <= last_seq) {
        zsock_set_rcvtimeo (tap, 2000);
        zmsg_t *published = zmsg_recv (tap);
        assert (published && zmsg_size (published) == 2);
        char *topic = zmsg_popstr (published);
        zframe_t *body = zmsg_pop (published);
        sbx_err_t err;
        sbx_msg_t *event = sbx_msg_decode (zframe_data (body), zframe_size (body), &err);
        assert (event && sbx_msg_event (event)->seq == expect);
        assert (streq (topic, sbx_msg_event (event)->type));
        expect++;
        sbx_msg_destroy (&event);
        zframe_destroy (&body);
        zstr_free (&topic);
        zmsg_destroy (&published);
    }
    //  Replay with a limit says there is more; a prefix filters.
    request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_msg_events_replay (request)->limit = 2;
    reply = brk_testkit_call (client, request, ++rid);
    assert (sbx_msg_events_replay_ok (reply)->events.count == 2);
    assert (sbx_msg_events_replay_ok (reply)->more);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, "key.");
    reply = brk_testkit_call (client, request, ++rid);
    assert (sbx_msg_events_replay_ok (reply)->events.count == 3);
    sbx_msg_destroy (&reply);

    for (int i = 0; i < 4; i++)
        zactor_destroy (&workers[i]);
    free (account_id);
    free (key_id);
    free (secret);
    zsock_destroy (&client);
    zsock_destroy (&tap);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
