/*  gw_broker - see gw_broker.h */
#include "gw_broker.h"
#include "sbx_idmap.h"
#include "sbx_urls.h"
#include "gw_auth.h"
#include "gw_cache.h"

#include <assert.h>
#include <signal.h>

struct gw_broker_t {
    sbx_peer_t *peer;
    zhashx_t *pending; //  handle → s_pending_t
    uint64_t next_handle;
    gw_cache_t *cache; //  the gateway's read copy, or NULL
};

typedef struct {
    gw_broker_t *broker;
    uint64_t handle, rid;
    bool agent; //  the reply is a sandbox.agent.ok whose inner message is the answer
    gw_broker_fn *fn;
    void *arg;
    gw_cache_ticket_t ticket;
} s_pending_t;

gw_broker_t *gw_broker_new (sbx_peer_t *peer)
{
    gw_broker_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->next_handle = 1;
    //  Sandbox URLs: https://LABEL.box.DOMAIN, with the listen port when it is not 443.
    self->pending = sbx_idmap_new ();
    if (!self->pending) {
        gw_broker_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_broker_destroy (gw_broker_t **self_p)
{
    assert (self_p);
    gw_broker_t *self = *self_p;
    if (!self)
        return;
    if (self->pending) {
        for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending)) {
            if (self->peer && p->rid)
                sbx_peer_cancel (self->peer, p->rid);
            if (self->cache)
                gw_cache_answer (self->cache, &p->ticket, NULL);
            free (p);
        }
        zhashx_destroy (&self->pending);
    }
    free (self);
    *self_p = NULL;
}

static void s_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_pending_t *p = arg;
    zhashx_delete (p->broker->pending, (void *) (uintptr_t) p->handle);
    gw_broker_fn *fn = p->fn;
    void *fn_arg = p->arg;
    bool agent = p->agent;
    sbx_msg_t *reply = *reply_p;
    if (p->broker->cache)
        gw_cache_answer (p->broker->cache, &p->ticket, reply);
    free (p);
    if (reply->type == SBX_MSG_ERROR) {
        fn (NULL, sbx_msg_error (reply)->code, sbx_msg_error (reply)->message, fn_arg);
        return;
    }
    if (!agent) {
        fn (reply, SBX_OK, NULL, fn_arg);
        return;
    }
    sbx_err_t err;
    sbx_bytes_t *bytes = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *inner = sbx_msg_decode (bytes->data, bytes->size, &err);
    if (!inner) {
        char message[600];
        snprintf (message, sizeof message, "the guest agent's answer does not decode: %.500s",
                  err.message);
        fn (NULL, SBX_E_INTERNAL, message, fn_arg);
    } else if (inner->type == SBX_MSG_ERROR)
        fn (NULL, sbx_msg_error (inner)->code, sbx_msg_error (inner)->message, fn_arg);
    else
        fn (inner, SBX_OK, NULL, fn_arg);
    sbx_msg_destroy (&inner);
}

static uint64_t s_send (gw_broker_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                        uint32_t timeout_ms, bool agent, gw_broker_fn *fn, void *arg)
{
    if (!self->peer) {
        sbx_msg_destroy (request_p);
        fn (NULL, SBX_E_UNAVAILABLE, "no broker connection", arg);
        return 0;
    }
    gw_cache_ticket_t ticket = {0};
    sbx_msg_t *copy =
        self->cache && !agent ? gw_cache_lookup (self->cache, caller, *request_p, &ticket) : NULL;
    if (copy) {
        //  Answered from the gateway's copy: no round trip.
        sbx_msg_destroy (request_p);
        fn (copy, SBX_OK, NULL, arg);
        sbx_msg_destroy (&copy);
        return 0;
    }
    s_pending_t *p = calloc (1, sizeof *p);
    if (!p) {
        sbx_msg_destroy (request_p);
        if (self->cache)
            gw_cache_answer (self->cache, &ticket, NULL);
        fn (NULL, SBX_E_INTERNAL, "out of memory", arg);
        return 0;
    }
    p->ticket = ticket;
    p->broker = self;
    p->handle = self->next_handle++;
    p->agent = agent;
    p->fn = fn;
    p->arg = arg;
    uint64_t handle = p->handle;
    (*request_p)->caller = gw_auth_caller_dup (caller);
    zhashx_insert (self->pending, (void *) (uintptr_t) handle, p);
    uint64_t rid = sbx_peer_request (self->peer, request_p, timeout_ms, s_on_reply, p);
    //  A request that could not go out is answered (and p freed) at once.
    s_pending_t *still = zhashx_lookup (self->pending, (void *) (uintptr_t) handle);
    if (!still)
        return 0;
    still->rid = rid;
    return handle;
}

uint64_t gw_broker_send (gw_broker_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                         uint32_t timeout_ms, gw_broker_fn *fn, void *arg)
{
    return s_send (self, caller, request_p, timeout_ms, false, fn, arg);
}

uint64_t gw_broker_send_agent (gw_broker_t *self, const sbx_caller_t *caller,
                               const char *sandbox_id, sbx_msg_t **inner_p, uint32_t timeout_ms,
                               gw_broker_fn *fn, void *arg)
{
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    int rc = sbx_msg_encode (*inner_p, &data, &size, &err);
    sbx_msg_destroy (inner_p);
    if (rc) {
        fn (NULL, err.code, err.message, arg);
        return 0;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    sbx_str_set (&sbx_msg_sandbox_agent (request)->sandbox_id, sandbox_id);
    sbx_msg_sandbox_agent (request)->request.data = data;
    sbx_msg_sandbox_agent (request)->request.size = size;
    return s_send (self, caller, &request, timeout_ms, true, fn, arg);
}

void gw_broker_cancel (gw_broker_t *self, uint64_t handle)
{
    s_pending_t *p = handle ? zhashx_lookup (self->pending, (void *) (uintptr_t) handle) : NULL;
    if (!p)
        return;
    zhashx_delete (self->pending, (void *) (uintptr_t) handle);
    if (self->peer && p->rid)
        sbx_peer_cancel (self->peer, p->rid);
    if (self->cache)
        gw_cache_answer (self->cache, &p->ticket, NULL);
    free (p);
}

void gw_broker_set_cache (gw_broker_t *self, gw_cache_t *cache)
{
    assert (self);
    self->cache = cache;
}

//  --------------------------------------------------------------------------
//  Self test

typedef struct {
    sbx_code_t code;
    int calls;
} s_probe_t;

static void s_probe (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) message;
    s_probe_t *probe = arg;
    assert (!reply);
    probe->code = code;
    probe->calls++;
}

void gw_broker_test (bool verbose)
{
    (void) verbose;
    gw_broker_t *broker = gw_broker_new (NULL);
    assert (broker);
    //  Without a peer a request fails at once, and nothing stays pending.
    s_probe_t probe = {0};
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    assert (gw_broker_send (broker, NULL, &request, 1000, s_probe, &probe) == 0);
    assert (!request && probe.calls == 1 && probe.code == SBX_E_UNAVAILABLE);
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    assert (gw_broker_send_agent (broker, NULL, "sb_x", &inner, 1000, s_probe, &probe) == 0);
    assert (!inner && probe.calls == 2);
    gw_broker_cancel (broker, 0);
    gw_broker_cancel (broker, 42);
    gw_broker_destroy (&broker);
    assert (!broker);
}
