/*  gw_others - see gw_others.h */
#include "gw_others.h"
#include "gw_auth.h"

#define S_PEERS_MS 5000  //  broker.peers: the broker's own answer
#define S_ASK_MS   10000 //  one gateway's answer (it reads a few files, or queues a message)
//  Where things were found: bounded, so a flood of ids cannot grow it. When full it is
//  emptied; what it forgot costs one walk each.
#define S_WHERE_MAX 4096

struct gw_others_t {
    gw_broker_t *broker;
    char *instance;
    zhashx_t *asks;  //  handle → s_ask_t
    zhashx_t *where; //  key → the instance where it was found last (string)
    uint64_t next_handle;
};

typedef struct {
    gw_others_t *others;
    uint64_t handle;
    sbx_caller_t *caller;
    sbx_msg_t *request; //  sent as a copy to each gateway
    char *key;
    char *what;
    zlist_t *gateways; //  the instances still to ask (strings, owned)
    char *asking;      //  the instance asked now
    char *first;       //  the one asked first, where key was found last (NULL: none)
    bool walking;      //  the broker's list of gateways was asked for
    uint64_t sent;     //  the gw_broker request in flight
    gw_others_fn *fn;
    void *arg;
} s_ask_t;

static void s_ask_free (void **item)
{
    s_ask_t *ask = *item;
    if (ask) {
        gw_auth_caller_destroy (&ask->caller);
        sbx_msg_destroy (&ask->request);
        free (ask->key);
        free (ask->what);
        zlist_destroy (&ask->gateways);
        free (ask->asking);
        free (ask->first);
        free (ask);
    }
    *item = NULL;
}

gw_others_t *gw_others_new (gw_broker_t *broker, const char *instance)
{
    gw_others_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->broker = broker;
    self->instance = strdup (instance ? instance : "");
    self->asks = sbx_idmap_new ();
    self->where = zhashx_new ();
    self->next_handle = 1;
    if (!self->instance || !self->asks || !self->where) {
        gw_others_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->asks, s_ask_free);
    zhashx_set_destructor (self->where, (zhashx_destructor_fn *) zstr_free);
    zhashx_set_duplicator (self->where, (zhashx_duplicator_fn *) strdup);
    return self;
}

void gw_others_destroy (gw_others_t **self_p)
{
    gw_others_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    if (self->asks) {
        for (s_ask_t *ask = zhashx_first (self->asks); ask; ask = zhashx_next (self->asks))
            gw_broker_cancel (self->broker, ask->sent);
        zhashx_destroy (&self->asks);
    }
    zhashx_destroy (&self->where);
    free (self->instance);
    free (self);
    *self_p = NULL;
}

//  Calls back once and forgets the ask; remembers where it was found (a gateway's answer
//  that is not not_found), or that it is nowhere known.
static void s_end (s_ask_t *ask, sbx_msg_t *reply, sbx_code_t code, const char *message)
{
    zhashx_t *where = ask->others->where;
    if (reply && code == SBX_OK && ask->asking) {
        if (zhashx_size (where) >= S_WHERE_MAX && !zhashx_lookup (where, ask->key))
            zhashx_purge (where);
        zhashx_update (where, ask->key, ask->asking);
    } else if (code == SBX_E_NOT_FOUND)
        zhashx_delete (where, ask->key);
    gw_others_fn *fn = ask->fn;
    void *arg = ask->arg;
    zhashx_delete (ask->others->asks, SBX_ID (ask->handle)); //  frees ask
    fn (reply, code, message, arg);
}

static void s_ask_next (s_ask_t *ask);
static void s_walk (s_ask_t *ask);

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_ask_t *ask = arg;
    ask->sent = 0;
    if (reply) {
        s_end (ask, reply, SBX_OK, NULL);
        return;
    }
    //  Not there, gone, silent, or too old to know it: the next one may hold it. An answer
    //  that is a refusal of the request itself ends the ask (the front end words it).
    if (code == SBX_E_INVALID_ARGUMENT || code == SBX_E_PERMISSION_DENIED) {
        sbx_msg_t *error = sbx_msg_new_error (0, code, "%s", message ? message : "");
        s_end (ask, error, code, message);
        sbx_msg_destroy (&error);
        return;
    }
    if (code != SBX_E_NOT_FOUND)
        sbx_info ("%s: a gateway could not be asked: %s", ask->what,
                  message ? message : sbx_code_name (code));
    s_ask_next (ask);
}

static void s_ask_next (s_ask_t *ask)
{
    char *instance = zlist_pop (ask->gateways);
    if (!instance && !ask->walking) { //  where it was last is not where it is now
        s_walk (ask);
        return;
    }
    if (!instance) {
        char message[300];
        snprintf (message, sizeof message, "no gateway of this service holds %s", ask->what);
        s_end (ask, NULL, SBX_E_NOT_FOUND, message);
        return;
    }
    sbx_msg_t *request = sbx_msg_dup (ask->request);
    if (!request) {
        free (instance);
        s_end (ask, NULL, SBX_E_INTERNAL, "out of memory");
        return;
    }
    free (request->instance);
    request->instance = instance;
    free (ask->asking);
    ask->asking = strdup (instance);
    GW_KEEP (ask->sent, gw_broker_send (ask->others->broker, ask->caller, &request, S_ASK_MS,
                                        s_on_answer, ask));
}

static void s_on_peers (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_ask_t *ask = arg;
    ask->sent = 0;
    if (!reply || reply->type != SBX_MSG_BROKER_PEERS_OK) {
        char text[400];
        snprintf (text, sizeof text,
                  "%s is not on this gateway, and the others cannot be asked now (%s); try again",
                  ask->what, message ? message : sbx_code_name (code));
        s_end (ask, NULL, SBX_E_UNAVAILABLE, text);
        return;
    }
    sbx_broker_peers_ok_t *ok = sbx_msg_broker_peers_ok (reply);
    for (size_t i = 0; i < ok->peers.count; i++) {
        sbx_peer_info_t *peer = &ok->peers.items[i];
        if (peer->role == SBX_ROLE_GATEWAY && peer->instance &&
            !streq (peer->instance, ask->others->instance) &&
            !(ask->first && streq (peer->instance, ask->first)))
            zlist_append (ask->gateways, peer->instance); //  (a copy: autofree)
    }
    s_ask_next (ask);
}

//  Asks the broker for the gateways it knows; s_on_peers asks them in turn.
static void s_walk (s_ask_t *ask)
{
    ask->walking = true;
    sbx_msg_t *peers = sbx_msg_new (SBX_MSG_BROKER_PEERS);
    if (!peers) {
        s_end (ask, NULL, SBX_E_INTERNAL, "out of memory");
        return;
    }
    GW_KEEP (ask->sent, gw_broker_send (ask->others->broker, ask->caller, &peers, S_PEERS_MS,
                                        s_on_peers, ask));
}

const char *gw_others_where (gw_others_t *self, const char *key)
{
    return self && key ? zhashx_lookup (self->where, key) : NULL;
}

uint64_t gw_others_ask (gw_others_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                        const char *key, const char *what, gw_others_fn *fn, void *arg)
{
    s_ask_t *ask = calloc (1, sizeof *ask);
    const char *first = gw_others_where (self, key);
    if (ask) {
        ask->others = self;
        ask->handle = self->next_handle++;
        ask->caller = caller ? gw_auth_caller_dup (caller) : NULL;
        ask->request = *request_p;
        *request_p = NULL;
        ask->key = strdup (key ? key : "");
        ask->what = strdup (what ? what : "it");
        ask->first = first ? strdup (first) : NULL;
        ask->gateways = zlist_new ();
        if (ask->gateways)
            zlist_autofree (ask->gateways);
        ask->fn = fn;
        ask->arg = arg;
    }
    sbx_msg_destroy (request_p);
    if (!ask || !ask->request || !ask->key || !ask->what || !ask->gateways ||
        (first && (!ask->first || zlist_append (ask->gateways, (void *) first) != 0)) ||
        (caller && !ask->caller) || zhashx_insert (self->asks, SBX_ID (ask->handle), ask) != 0) {
        void *item = ask;
        s_ask_free (&item);
        fn (NULL, SBX_E_INTERNAL, "out of memory", arg);
        return 0;
    }
    uint64_t handle = ask->handle;
    s_ask_next (ask); //  the gateway where it was last, else the walk
    //  The ask may have ended already (the broker could not be reached).
    return zhashx_lookup (self->asks, SBX_ID (handle)) ? handle : 0;
}

void gw_others_cancel (gw_others_t *self, uint64_t handle)
{
    s_ask_t *ask = handle ? zhashx_lookup (self->asks, SBX_ID (handle)) : NULL;
    if (!ask)
        return;
    gw_broker_cancel (self->broker, ask->sent);
    zhashx_delete (self->asks, SBX_ID (handle));
}

//  --------------------------------------------------------------------------
//  Self test: without a broker, an ask ends at once, unavailable, and says why.

static void s_test_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    int *calls = arg;
    (*calls)++;
    assert (!reply && code == SBX_E_UNAVAILABLE);
    assert (strstr (message, "template build bld_0123456789 is not on this gateway"));
}

void gw_others_test (bool verbose)
{
    (void) verbose;
    gw_broker_t *broker = gw_broker_new (NULL);
    gw_others_t *self = gw_others_new (broker, "gw-one");
    assert (self);
    int calls = 0;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_BUILD_GET);
    sbx_str_set (&sbx_msg_build_get (request)->build_id, "bld_0123456789");
    assert (gw_others_ask (self, NULL, &request, "build:bld_0123456789",
                           "template build bld_0123456789", s_test_answer, &calls) == 0);
    assert (!gw_others_where (self, "build:bld_0123456789"));
    assert (!request && calls == 1 && zhashx_size (self->asks) == 0);
    gw_others_cancel (self, 1); //  finished: ignored
    gw_others_destroy (&self);
    assert (!self);
    gw_broker_destroy (&broker);
}
