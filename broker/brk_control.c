/*  brk_control - see brk_control.h */
#include "brk_control.h"
#include "brk_server.h"
#include "brk_store.h"
#include "sbx_dqlite.h"
#include "sbx_dqnode.h"
#include "sbx_dqproxy.h"
#include "sbx_secret.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_POLL_MS  100  //  how often the node is asked who leads
#define S_JOIN_MS  1000 //  how often a new node asks to be added
#define S_CALL_MS  2000 //  a call to this host's node
#define S_RETRY_MS 1000 //  after a server that could not start

typedef struct {
    sbx_config_t *config; //  borrowed
    zsock_t *pipe;        //  borrowed
    zloop_t *loop;
    int lock_fd;
    //  This node
    uint64_t id;
    char address[256];
    bool joined;
    char **join; //  addresses to join through, NULL-terminated (NULL: none)
    sbx_dqnode_t *node;
    sbx_dqproxy_t *proxy; //  TLS with the cluster key, in front of the node and to peers
    char bind[128];       //  the node's own socket (abstract: this process only)
    sbx_dqlite_t *local;  //  to this node, for LEADER
    char leader[256];     //  the leader's address, as the node last said ("" none)
    //  Standing by: broker.bind, answered here
    zsock_t *router;
    char *instance;
    uint64_t started_ms;
    //  Leading: the broker, on the cluster's database
    zactor_t *server;
    sbx_dqlite_cluster_t cluster;
    const char *cluster_addresses[1];
    brk_server_args_t server_args;
    uint64_t retry_after; //  monotonic ms: a server that failed is not tried again before
    uint64_t leads;       //  terms led, for the log
    uint64_t last_join;   //  monotonic ms of the last request to be added
    zactor_t *auth;       //  CURVE's authenticator while standing by on tcp://
    //  The hosts admitted by token, read from the cluster's database (following its
    //  leader, wherever it is) into keys/allowed, every node alike.
    brk_store_t *hosts;
    sbx_dqlite_cluster_t hosts_where;
    uint64_t synced_at; //  monotonic ms
    bool registered;    //  this host's own client key is in the hosts table
} s_control_t;

#define S_SYNC_MS 2000 //  how often keys/allowed follows the hosts table

//  --------------------------------------------------------------------------
//  The node's identity: DIR/control/node, three lines (id, address, joined)

static char *s_identity_path (s_control_t *self)
{
    return sbx_config_path (self->config, "control/node");
}

static int s_identity_save (s_control_t *self)
{
    char *path = s_identity_path (self);
    char tmp[PATH_MAX];
    snprintf (tmp, sizeof tmp, "%s.tmp", path ? path : "");
    FILE *file = path ? fopen (tmp, "w") : NULL;
    int rc = -1;
    if (file) {
        fprintf (file, "id %llu\naddress %s\njoined %d\n", (unsigned long long) self->id,
                 self->address, self->joined ? 1 : 0);
        rc = fflush (file) == 0 && fsync (fileno (file)) == 0 ? 0 : -1;
        rc = fclose (file) == 0 ? rc : -1;
        if (rc == 0)
            rc = rename (tmp, path);
    }
    if (rc)
        sbx_error ("control: cannot save %s: %s", path ? path : "the node's identity",
                   strerror (errno));
    free (path);
    return rc;
}

//  Reads the identity, or makes it the first time. -1 (logged) when the file says
//  another address than control.address: the node's address is its name in the
//  cluster, and changing it needs a person (docs/operations.md).
static int s_identity_load (s_control_t *self)
{
    char *path = s_identity_path (self);
    FILE *file = path ? fopen (path, "r") : NULL;
    if (!file) {
        free (path);
        //  First start: the first node of a new cluster, or one that will join.
        self->id = self->join ? sbx_dqnode_new_id (self->address) : 1;
        self->joined = !self->join;
        sbx_info ("control: node %llu at %s, %s", (unsigned long long) self->id, self->address,
                  self->join ? "joining the cluster" : "the first of a new cluster");
        return s_identity_save (self);
    }
    unsigned long long id = 0;
    char address[256] = "";
    int joined = 0;
    int fields = fscanf (file, "id %llu address %255s joined %d", &id, address, &joined);
    fclose (file);
    if (fields != 3 || id == 0) {
        sbx_error ("control: %s is damaged; restore it from a backup, or remove this node from "
                   "the cluster and join it again (docs/operations.md)",
                   path);
        free (path);
        return -1;
    }
    if (strcmp (address, self->address) != 0) {
        sbx_error ("control: this node is %s in the cluster (%s), not control.address %s: set "
                   "control.address back, or remove the node and join it again "
                   "(docs/operations.md)",
                   address, path, self->address);
        free (path);
        return -1;
    }
    free (path);
    self->id = id;
    self->joined = joined != 0;
    return 0;
}

//  --------------------------------------------------------------------------
//  Standing by

static int s_on_standby (zloop_t *loop, zsock_t *sock, void *arg);

static void s_standby_send (s_control_t *self, zframe_t *address, sbx_msg_t **msg_p)
{
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    if (sbx_msg_encode (*msg_p, &data, &size, &err) == 0) {
        zmsg_t *out = zmsg_new ();
        zmsg_append (out, &(zframe_t *){zframe_dup (address)});
        zmsg_addmem (out, data, size);
        zmsg_send (&out, self->router);
        zmsg_destroy (&out);
    }
    free (data);
    sbx_msg_destroy (msg_p);
}

static void s_standby_answer (s_control_t *self, zframe_t *address, sbx_msg_t *msg)
{
    sbx_msg_t *reply;
    if (msg->type == SBX_MSG_SYS_STATUS && !msg->route) {
        reply = sbx_msg_new_reply (msg, SBX_MSG_SYS_STATUS_OK);
        sbx_sys_status_ok_t *status = sbx_msg_sys_status_ok (reply);
        status->role = SBX_ROLE_BROKER;
        sbx_str_set (&status->instance, self->instance);
        status->pid = (uint64_t) getpid ();
        status->started_ms = self->started_ms;
        sbx_str_set (&status->version, SBX_VERSION);
        sbx_str_set (&status->control, "standby");
        sbx_str_set (&status->node, self->address);
        if (*self->leader)
            sbx_str_set (&status->leader, self->leader);
    } else if (sbx_msg_type_is_reply (msg->type) || msg->type == SBX_MSG_PEER_HEARTBEAT ||
               msg->type == SBX_MSG_PEER_BYE)
        //  Heartbeats and late answers: a peer that sends them believes this broker leads;
        //  the standby answer moves it on.
        reply = sbx_msg_new (SBX_MSG_PEER_STANDBY);
    else
        reply = sbx_msg_new_reply (msg, SBX_MSG_PEER_STANDBY);
    if (reply->type == SBX_MSG_PEER_STANDBY) {
        reply->rid = msg->type == SBX_MSG_PEER_HELLO ? 0 : msg->rid;
        sbx_peer_standby_t *standby = sbx_msg_peer_standby (reply);
        sbx_str_set (&standby->node, self->address);
        if (*self->leader)
            sbx_str_set (&standby->leader, self->leader);
    }
    s_standby_send (self, address, &reply);
}

static int s_on_standby (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    s_control_t *self = arg;
    for (int i = 0; i < 1000; i++) {
        zmsg_t *in = zmsg_recv_nowait (sock);
        if (!in)
            break;
        zframe_t *address = zmsg_pop (in);
        zframe_t *body = zmsg_pop (in);
        if (address && body && zmsg_size (in) == 0) {
            sbx_err_t err;
            sbx_msg_t *msg = sbx_msg_decode (zframe_data (body), zframe_size (body), &err);
            if (msg)
                s_standby_answer (self, address, msg);
            sbx_msg_destroy (&msg);
        }
        zframe_destroy (&address);
        zframe_destroy (&body);
        zmsg_destroy (&in);
    }
    return 0;
}

//  broker.bind, answered by this actor. The same endpoint as the server's: one or the
//  other holds it. CURVE on tcp:// as the server does it (one authenticator a process:
//  the server starts its own once this one is gone).
static int s_standby_start (s_control_t *self)
{
    if (self->router)
        return 0;
    const char *endpoint = sbx_config_get (self->config, "broker.bind", NULL);
    self->router = zsock_new (ZMQ_ROUTER);
    if (!self->router)
        return -1;
    zsock_set_linger (self->router, 0);
    zsock_set_sndtimeo (self->router, 0);
    zsock_set_rcvtimeo (self->router, 0);
    zsock_set_router_mandatory (self->router, 1);
    if (sbx_curve_needed (endpoint)) {
        if (!self->auth)
            self->auth = sbx_curve_auth_new (self->config);
        if (!self->auth || sbx_curve_server (self->config, self->router)) {
            zsock_destroy (&self->router);
            return -1;
        }
    }
    //  The server that held the endpoint a moment ago may still be releasing it.
    int tries = 0;
    while (zsock_bind (self->router, "%s", endpoint) < 0) {
        if (++tries == 50) {
            sbx_error ("control: cannot bind broker.bind %s: %s", endpoint,
                       zmq_strerror (zmq_errno ()));
            zsock_destroy (&self->router);
            return -1;
        }
        zclock_sleep (20);
    }
    zloop_reader (self->loop, self->router, s_on_standby, self);
    return 0;
}

static void s_standby_stop (s_control_t *self)
{
    if (!self->router)
        return;
    zloop_reader_end (self->loop, self->router);
    zsock_destroy (&self->router);
    zactor_destroy (&self->auth);
}

//  --------------------------------------------------------------------------
//  Leading

static void s_server_stop (s_control_t *self, const char *why)
{
    if (!self->server)
        return;
    sbx_warn ("control: node %s %s: the broker stops serving and stands by", self->address, why);
    zloop_reader_end (self->loop, zactor_sock (self->server));
    zactor_destroy (&self->server);
}

static int s_on_server (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    (void) pipe;
    s_control_t *self = arg;
    //  The server only speaks if it fails: stand by, and let the next poll decide.
    char *message = zstr_recv (zactor_sock (self->server));
    zstr_free (&message);
    s_server_stop (self, "had its broker fail");
    self->retry_after = zclock_mono () + S_RETRY_MS;
    s_standby_start (self);
    return 0;
}

static void s_server_start (s_control_t *self)
{
    if (self->server || (uint64_t) zclock_mono () < self->retry_after)
        return;
    s_standby_stop (self);
    self->server = zactor_new (brk_server_cluster_actor, &self->server_args);
    char *status = self->server ? zstr_recv (self->server) : NULL;
    bool ready = status && streq (status, "READY");
    zstr_free (&status);
    if (!ready) {
        //  It keeps the lead and tries again: handing it over here (dqlite's transfer)
        //  crashed dqlite 1.11's loop under load. An older sbx on a database a newer one
        //  migrated is the upgrade order's to avoid (docs/operations.md): the leader last.
        sbx_error ("control: node %s leads, but the broker could not start on the cluster's "
                   "database (its log says why: an older sbx than the database? upgrade this "
                   "node, or stop it so that another leads); trying again in %d ms",
                   self->address, S_RETRY_MS);
        zactor_destroy (&self->server);
        self->retry_after = zclock_mono () + S_RETRY_MS;
        s_standby_start (self);
        return;
    }
    self->leads++;
    sbx_info ("control: node %s leads (term %llu here): the broker serves", self->address,
              (unsigned long long) self->leads);
    zloop_reader (self->loop, zactor_sock (self->server), s_on_server, self);
}

//  --------------------------------------------------------------------------
//  The node

//  The leader as this node sees it: 1 (this node), 0 (another or none), -1 (no answer).
static int s_ask_leader (s_control_t *self)
{
    if (!sbx_dqlite_usable (self->local)) {
        sbx_dqlite_destroy (&self->local);
        self->local = sbx_dqlite_connect (self->bind, S_CALL_MS, NULL, NULL);
        if (!self->local)
            return -1;
    }
    uint64_t id = 0;
    char *address = NULL;
    if (sbx_dqlite_leader (self->local, &id, &address)) {
        sbx_dqlite_destroy (&self->local);
        return -1;
    }
    snprintf (self->leader, sizeof self->leader, "%s", address ? address : "");
    free (address);
    return id == self->id ? 1 : 0;
}

//  A new node asks the cluster to add it, as a voter: once, and again at every start
//  until it is one (an add that went through before a crash is found in the
//  configuration, not repeated).
static void s_join (s_control_t *self)
{
    size_t count = 0;
    while (self->join[count])
        count++;
    sbx_dqlite_t *leader = sbx_dqlite_connect_leader ((const char *const *) self->join, count,
                                                      S_CALL_MS, sbx_dqproxy_dial, self->proxy);
    if (!leader) {
        sbx_warn ("control: node %s: no node of %s leads or answers; will ask again", self->address,
                  sbx_config_get (self->config, "control.join", ""));
        return;
    }
    sbx_dqlite_server_t *servers = NULL;
    size_t n = 0;
    int role = -1;
    if (sbx_dqlite_cluster (leader, &servers, &n) == 0)
        for (size_t i = 0; i < n; i++)
            if (servers[i].id == self->id)
                role = servers[i].role;
    sbx_dqlite_servers_free (&servers, n);
    if ((role < 0 && sbx_dqlite_add (leader, self->id, self->address)) ||
        (role != SBX_DQ_VOTER && sbx_dqlite_assign (leader, self->id, SBX_DQ_VOTER))) {
        sbx_warn ("control: node %s: the leader %s did not add it: %s; will ask again",
                  self->address, sbx_dqlite_address (leader), sbx_dqlite_errmsg (leader));
        sbx_dqlite_destroy (&leader);
        return;
    }
    sbx_info ("control: node %s joined the cluster through %s as a voter", self->address,
              sbx_dqlite_address (leader));
    sbx_dqlite_destroy (&leader);
    self->joined = true;
    s_identity_save (self);
}

//  The node of this process directly; the others through the proxy.
static int s_dial (const char *address, int timeout_ms, void *arg)
{
    s_control_t *self = arg;
    return address[0] == '@' ? sbx_dqlite_dial (address, timeout_ms)
                             : sbx_dqproxy_dial (address, timeout_ms, self->proxy);
}

static void s_sync_one (const brk_host_t *host, void *arg)
{
    s_control_t *self = arg;
    char name[80];
    snprintf (name, sizeof name, "host-%s", host->name);
    if (host->removed_ms)
        sbx_curve_disallow (self->config, name);
    else
        sbx_curve_allow (self->config, host->public_key, name);
}

//  keys/allowed follows the hosts table: an admitted host's key in, a removed one's out.
static void s_sync_hosts (s_control_t *self)
{
    if (!self->hosts) {
        self->hosts_where =
            (sbx_dqlite_cluster_t){self->cluster_addresses, 1, s_dial, self, S_CALL_MS, true};
        self->hosts = brk_store_new_cluster (&self->hosts_where);
        if (!self->hosts)
            return;
    }
    //  This node's own processes (its billing, its CLI) reach the other control nodes'
    //  brokers with this host's client key: recorded as a host too (the first node was
    //  admitted by no token; a joined one is already, under its name).
    if (!self->registered) {
        char *path = sbx_config_path (self->config, "keys/client.cert");
        zcert_t *own = path ? zcert_load (path) : NULL;
        free (path);
        if (own) {
            brk_host_t host = {(char *) sbx_config_get (self->config, "instance", "control"),
                               (char *) sbx_config_get (self->config, "roles", ""),
                               (char *) zcert_public_txt (own), sbx_clock_now_ms (), 0};
            int rc = brk_store_host_insert (self->hosts, &host);
            self->registered = rc >= 0;
            if (rc == 0)
                sbx_info ("control: this host (%s) admitted to every control node", host.name);
        }
        zcert_destroy (&own);
    }
    if (brk_store_host_list (self->hosts, s_sync_one, self) < 0)
        sbx_debug ("control: the hosts table cannot be read now; again in %d ms", S_SYNC_MS);
}

static int s_on_poll (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_control_t *self = arg;
    if (!self->joined) {
        uint64_t now = (uint64_t) zclock_mono ();
        if (now - self->last_join >= S_JOIN_MS) {
            self->last_join = now;
            s_join (self);
        }
        return 0;
    }
    if ((uint64_t) zclock_mono () - self->synced_at >= S_SYNC_MS) {
        self->synced_at = (uint64_t) zclock_mono ();
        s_sync_hosts (self);
    }
    int leads = s_ask_leader (self);
    if (leads == 1)
        s_server_start (self);
    else if (self->server) {
        s_server_stop (self, leads < 0 ? "does not answer" : "no longer leads");
        s_standby_start (self);
    }
    return 0;
}

//  Hands leadership to another voter before stopping: the others go on at once instead
//  of after an election timeout.
static void s_hand_over (s_control_t *self)
{
    if (!self->server || !sbx_dqlite_usable (self->local))
        return;
    if (sbx_dqlite_transfer (self->local, 0) == 0)
        sbx_info ("control: node %s handed leadership over before stopping", self->address);
    else
        sbx_warn ("control: node %s could not hand leadership over: %s", self->address,
                  sbx_dqlite_errmsg (self->local));
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

//  --------------------------------------------------------------------------
//  The actor

static void s_control_destroy (s_control_t **self_p)
{
    s_control_t *self = *self_p;
    if (!self)
        return;
    if (self->loop && self->server)
        zloop_reader_end (self->loop, zactor_sock (self->server));
    zactor_destroy (&self->server);
    if (self->loop)
        s_standby_stop (self);
    zsock_destroy (&self->router);
    zactor_destroy (&self->auth);
    sbx_dqlite_destroy (&self->local);
    brk_store_destroy (&self->hosts);
    sbx_dqnode_destroy (&self->node);
    sbx_dqproxy_destroy (&self->proxy);
    zloop_destroy (&self->loop);
    sbx_config_list_free (&self->join);
    free (self->instance);
    if (self->lock_fd >= 0)
        close (self->lock_fd);
    free (self);
    *self_p = NULL;
}

static bool s_hostport (const char *value)
{
    const char *colon = value ? strrchr (value, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol (colon + 1, &end, 10) : 0;
    return colon && colon != value && end && !*end && port > 0 && port <= 65535 &&
           strlen (value) < 200;
}

static s_control_t *s_control_new (sbx_config_t *config, zsock_t *pipe)
{
    s_control_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->pipe = pipe;
    self->lock_fd = -1;
    self->instance = sbx_secret_id ("brk_");
    self->started_ms = sbx_clock_now_ms ();
    const char *address = sbx_config_get (config, "control.address", NULL);
    if (!s_hostport (address)) {
        sbx_error ("control.address '%s' is not HOST:PORT with a port from 1 to 65535",
                   address ? address : "");
        s_control_destroy (&self);
        return NULL;
    }
    snprintf (self->address, sizeof self->address, "%s", address);
    self->join = sbx_config_list (config, "control.join", NULL);
    if (self->join)
        for (char **a = self->join; *a; a++)
            if (!s_hostport (*a)) {
                sbx_error ("control.join: '%s' is not HOST:PORT", *a);
                s_control_destroy (&self);
                return NULL;
            }
    //  One broker per data directory, as brk_server's own lock (run/broker.lock).
    char *lock = sbx_config_path (config, "run/broker.lock");
    self->lock_fd = lock ? open (lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (self->lock_fd < 0 || flock (self->lock_fd, LOCK_EX | LOCK_NB)) {
        sbx_error ("another sbx-broker is running on %s (it holds %s)",
                   sbx_config_data_dir (config), lock ? lock : "run/broker.lock");
        free (lock);
        s_control_destroy (&self);
        return NULL;
    }
    free (lock);
    char *dir = sbx_config_path (config, "control");
    char *data = sbx_config_path (config, "control/dqlite");
    if (dir)
        mkdir (dir, 0700);
    //  A node's peers may go away while it writes to them.
    signal (SIGPIPE, SIG_IGN);
    unsigned latency = (unsigned) sbx_config_get_range (config, "control.latency_ms", 20, 1, 10000);
    //  The node listens only on a socket of this process; the proxy stands in front of it
    //  on control.address, and is how it reaches the others (sbx_dqproxy.h). The first
    //  node makes the cluster's key; the others are given it when they join.
    unsigned char key[SBX_DQPROXY_KEY_SIZE];
    char *key_path = sbx_config_path (config, "keys/cluster.key");
    int rc = !self->instance || !dir || !data || !key_path || s_identity_load (self) ||
             sbx_dqproxy_key_load (key_path, !self->join, key);
    if (rc == 0 && !(self->proxy = sbx_dqproxy_new (key, sizeof key)))
        rc = -1;
    sbx_secret_wipe_bytes (key, sizeof key);
    if (rc == 0 &&
        ((self->node = sbx_dqnode_new (self->id, self->address, data)) == NULL ||
         sbx_dqnode_set_bind (self->node, "@") ||
         sbx_dqnode_set_dial (self->node, sbx_dqproxy_node_dial, self->proxy) ||
         sbx_dqnode_set_latency_ms (self->node, latency) || sbx_dqnode_start (self->node)))
        rc = -1;
    if (rc == 0) {
        snprintf (self->bind, sizeof self->bind, "%s", sbx_dqnode_bind_address (self->node));
        rc = sbx_dqproxy_listen (self->proxy, self->address, self->bind);
    }
    free (key_path);
    free (dir);
    free (data);
    if (rc) {
        s_control_destroy (&self);
        return NULL;
    }
    //  The broker's own connection goes to the node directly, not through TLS.
    self->cluster_addresses[0] = self->bind;
    self->cluster = (sbx_dqlite_cluster_t){self->cluster_addresses, 1, NULL, NULL, 5000, false};
    self->server_args = (brk_server_args_t){config, &self->cluster, self->address, self->bind};
    self->loop = zloop_new ();
    if (!self->loop || s_standby_start (self)) {
        s_control_destroy (&self);
        return NULL;
    }
    return self;
}

bool brk_control_enabled (sbx_config_t *config)
{
    const char *address = sbx_config_get (config, "control.address", NULL);
    return address && *address;
}

void brk_control_actor (zsock_t *pipe, void *args)
{
    s_control_t *self = s_control_new (args, pipe);
    zsock_signal (pipe, 0);
    if (!self) {
        zstr_send (pipe, "FAILED");
        char *command = zstr_recv (pipe);
        zstr_free (&command);
        return;
    }
    zloop_reader (self->loop, pipe, s_on_pipe, self);
    zloop_timer (self->loop, S_POLL_MS, 0, s_on_poll, self);
    sbx_info ("control: node %llu at %s started (broker.bind %s)", (unsigned long long) self->id,
              self->address, sbx_config_get (self->config, "broker.bind", ""));
    //  Who leads is known within a poll or two: lead at once if this node does.
    s_on_poll (self->loop, 0, self);
    zstr_send (pipe, "READY");
    zloop_set_nonstop (self->loop, true);
    zloop_start (self->loop);
    s_hand_over (self);
    s_control_destroy (&self);
}
