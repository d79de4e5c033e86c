/*  brk_testkit - see brk_testkit.h */
#include "brk_testkit.h"
#include "brk_server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <assert.h>

sbx_msg_t *brk_testkit_recv (zsock_t *sock, int timeout_ms)
{
    zsock_set_rcvtimeo (sock, timeout_ms);
    zframe_t *frame = zframe_recv (sock);
    if (!frame)
        return NULL;
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err);
    zframe_destroy (&frame);
    assert (msg);
    return msg;
}

void brk_testkit_send (zsock_t *sock, sbx_msg_t **msg_p)
{
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &data, &size, &err) == 0);
    zframe_t *frame = zframe_new (data, size);
    free (data);
    assert (zframe_send (&frame, sock, 0) == 0);
    sbx_msg_destroy (msg_p);
}

sbx_msg_t *brk_testkit_call (zsock_t *sock, sbx_msg_t *request, uint64_t rid)
{
    request->rid = rid;
    if (!request->caller) {
        request->caller = calloc (1, sizeof (sbx_caller_t));
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
    }
    brk_testkit_send (sock, &request);
    while (true) {
        //  Generous: a real guest's first create under TCG on a loaded 2-core host can
        //  take well over 10 s (unit.vmd_server).
        sbx_msg_t *reply = brk_testkit_recv (sock, 60000);
        assert (reply);
        if (reply->rid == rid)
            return reply;
        sbx_msg_destroy (&reply);
    }
}

zsock_t *brk_testkit_dealer (sbx_config_t *config)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    assert (zsock_connect (sock, "%s", sbx_config_get (config, "broker.endpoint", NULL)) == 0);
    return sock;
}

typedef struct {
    sbx_config_t *config;
    sbx_role_t role;
    const char *instance;
    uint64_t capacity;
    sbx_peer_request_fn *fn;
    void *arg;
} s_worker_args_t;

static void s_status (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *reply = sbx_msg_new_reply (*request_p, SBX_MSG_SYS_STATUS_OK);
    sbx_msg_sys_status_ok (reply)->role = sbx_peer_role (peer);
    sbx_str_set (&sbx_msg_sys_status_ok (reply)->instance, sbx_peer_instance (peer));
    sbx_peer_send (peer, &reply);
}

//  "SEND" + a frame: the worker sends that message to the broker (an unsolicited
//  report, as vmd's vm.failed). Anything else ($TERM) ends the worker.
static int s_on_pipe (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    sbx_peer_t *peer = arg;
    zmsg_t *command = zmsg_recv (pipe);
    char *verb = command ? zmsg_popstr (command) : NULL;
    int rc = -1;
    if (verb && streq (verb, "SEND")) {
        zframe_t *frame = zmsg_pop (command);
        sbx_err_t err;
        sbx_msg_t *msg = sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err);
        assert (msg);
        sbx_peer_send (peer, &msg);
        zframe_destroy (&frame);
        rc = 0;
    }
    zstr_free (&verb);
    zmsg_destroy (&command);
    return rc;
}

void brk_testkit_worker_send (zactor_t *worker, sbx_msg_t **msg_p)
{
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &data, &size, &err) == 0);
    zsock_send (worker, "sb", "SEND", data, size);
    free (data);
    sbx_msg_destroy (msg_p);
}

static void s_worker (zsock_t *pipe, void *args)
{
    s_worker_args_t *w = args;
    zloop_t *loop = zloop_new ();
    sbx_peer_t *peer = sbx_peer_new (w->config, w->role, w->instance);
    assert (peer);
    sbx_peer_set_capacity (peer, w->capacity, 0);
    sbx_peer_set_request_fn (peer, w->fn ? w->fn : s_status, w->arg);
    assert (sbx_peer_start (peer, loop) == 0);
    zloop_reader (loop, pipe, s_on_pipe, peer);
    zsock_signal (pipe, 0);
    zloop_start (loop);
    sbx_peer_bye (peer, "test over");
    sbx_peer_destroy (&peer);
    zloop_destroy (&loop);
    free (w);
}

zactor_t *brk_testkit_worker (sbx_config_t *config, sbx_role_t role, const char *instance,
                              uint64_t capacity, sbx_peer_request_fn *fn, void *arg)
{
    s_worker_args_t *w = calloc (1, sizeof *w);
    *w = (s_worker_args_t){config, role, instance, capacity, fn, arg};
    return zactor_new (s_worker, w);
}

char *brk_testkit_account (zsock_t *client, const char *email, uint64_t rid)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, email);
    sbx_msg_t *reply = brk_testkit_call (client, request, rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    char *id = strdup (sbx_msg_account_create_ok (reply)->account_id);
    sbx_msg_destroy (&reply);
    return id;
}

sbx_code_t brk_testkit_code (const sbx_msg_t *reply)
{
    return reply->type == SBX_MSG_ERROR ? sbx_msg_error ((sbx_msg_t *) reply)->code : SBX_OK;
}

size_t brk_testkit_peer_count (zsock_t *client, sbx_role_t role, uint64_t rid)
{
    sbx_msg_t *reply = brk_testkit_call (client, sbx_msg_new (SBX_MSG_BROKER_PEERS), rid);
    assert (reply->type == SBX_MSG_BROKER_PEERS_OK);
    size_t count = 0;
    sbx_broker_peers_ok_t *ok = sbx_msg_broker_peers_ok (reply);
    for (size_t i = 0; i < ok->peers.count; i++)
        if (ok->peers.items[i].role == role)
            count++;
    sbx_msg_destroy (&reply);
    return count;
}

sbx_caller_t *brk_testkit_caller (const char *account, const char *key_id, sbx_key_preset_t preset)
{
    sbx_caller_t *caller = calloc (1, sizeof *caller);
    caller->kind = SBX_CALLER_KIND_API_KEY;
    sbx_str_set (&caller->account_id, account);
    sbx_str_set (&caller->key_id, key_id);
    caller->preset = preset;
    return caller;
}

sbx_msg_t *brk_testkit_vm_ok (const sbx_msg_t *request)
{
    sbx_msg_t *reply = NULL;
    sbx_msg_t *in = (sbx_msg_t *) request; //  the typed accessors take non-const
    switch (request->type) {
    case SBX_MSG_VM_CREATE:
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_CREATE_OK);
        sbx_str_set (&sbx_msg_vm_create_ok (reply)->sandbox_id, sbx_msg_vm_create (in)->sandbox_id);
        break;
    case SBX_MSG_VM_STOP:
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_STOP_OK);
        sbx_str_set (&sbx_msg_vm_stop_ok (reply)->sandbox_id, sbx_msg_vm_stop (in)->sandbox_id);
        break;
    case SBX_MSG_VM_RESUME:
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_RESUME_OK);
        sbx_str_set (&sbx_msg_vm_resume_ok (reply)->sandbox_id, sbx_msg_vm_resume (in)->sandbox_id);
        break;
    case SBX_MSG_VM_DELETE:
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_DELETE_OK);
        sbx_str_set (&sbx_msg_vm_delete_ok (reply)->sandbox_id, sbx_msg_vm_delete (in)->sandbox_id);
        break;
    case SBX_MSG_VM_EGRESS:
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_EGRESS_OK);
        sbx_str_set (&sbx_msg_vm_egress_ok (reply)->sandbox_id, sbx_msg_vm_egress (in)->sandbox_id);
        break;
    default:
        break;
    }
    return reply;
}

void brk_testkit_broker_start (brk_testkit_broker_t *self, const char *name, ...)
{
    memset (self, 0, sizeof *self);
    snprintf (self->dir, sizeof self->dir, "/tmp/%s.XXXXXX", name);
    assert (mkdtemp (self->dir));
    self->config = sbx_config_new (self->dir);
    assert (self->config);
    sbx_config_set (self->config, "heartbeat_ms", "100");
    va_list args;
    va_start (args, name);
    const char *key;
    while ((key = va_arg (args, const char *))) {
        const char *value = va_arg (args, const char *);
        assert (sbx_config_set (self->config, key, value) == 0);
    }
    va_end (args);
    self->server = zactor_new (brk_server_actor, self->config);
    char *status = zstr_recv (self->server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    self->client = brk_testkit_dealer (self->config);
}

void brk_testkit_broker_stop (brk_testkit_broker_t *self)
{
    zsock_destroy (&self->client);
    zactor_destroy (&self->server);
    sbx_config_destroy (&self->config);
    char command[160];
    snprintf (command, sizeof command, "rm -rf '%s'", self->dir);
    assert (system (command) == 0);
}
