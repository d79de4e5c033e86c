/*  brk_ports - see brk_ports.h */
#include "brk_ports.h"
#include "brk_sandbox.h"

#include <assert.h>

#define S_VM_PORT_MS 15000u //  a QMP hostfwd round trip, with room for a busy host

//  The sandbox as its record says now, in wire form (published ports included).
static sbx_sandbox_info_t *s_info (brk_ctx_t *ctx, const char *sandbox_id)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, sandbox_id, &record) != 0)
        return NULL;
    sbx_sandbox_info_t *info = brk_sandbox_info (ctx, &record);
    brk_sandbox_clear (&record);
    return info;
}

//  A sandbox.port waiting on vmd.
typedef struct {
    zframe_t *client;
    uint64_t rid;
    char *sandbox_id;
    char *account;
    uint64_t port;
    bool public, remove;
} s_op_t;

static void s_op_destroy (s_op_t **op_p)
{
    s_op_t *op = *op_p;
    if (!op)
        return;
    zframe_destroy (&op->client);
    free (op->sandbox_id);
    free (op->account);
    free (op);
    *op_p = NULL;
}

//  Records what vmd did, with its event, in one transaction.
static int s_record (brk_ctx_t *ctx, s_op_t *op, const char *host, uint64_t host_port)
{
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_SANDBOX_PORT_CHANGED);
    sbx_sandbox_port_changed_t *body = sbx_msg_sandbox_port_changed (event);
    sbx_str_set (&body->sandbox_id, op->sandbox_id);
    body->port = op->port;
    body->public = op->public && !op->remove;
    body->removed = op->remove;
    sbx_str_set (&body->host, op->remove ? NULL : host);
    body->host_port = op->remove ? 0 : host_port;
    brk_port_t row = {.sandbox_id = op->sandbox_id,
                      .port = op->port,
                      .host = (char *) host,
                      .host_port = host_port,
                      .public = op->public,
                      .created_ms = sbx_clock_now_ms ()};
    int rc = brk_events_begin (ctx->events);
    if (rc == 0)
        rc = op->remove
                 ? (brk_store_port_delete (ctx->store, op->sandbox_id, op->port) < 0 ? -1 : 0)
                 : brk_store_port_set (ctx->store, &row);
    if (rc == 0)
        rc = brk_events_add (ctx->events, &event, op->account, op->sandbox_id);
    if (rc == 0)
        rc = brk_events_commit (ctx->events);
    if (rc) {
        brk_events_rollback (ctx->events);
        sbx_msg_destroy (&event);
    }
    return rc;
}

static void s_on_vm_port (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_op_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *reply = NULL;
    //  A guest vmd no longer has has no forward either: a removal is done.
    bool gone = answer->type == SBX_MSG_ERROR && sbx_msg_error (answer)->code == SBX_E_NOT_FOUND &&
                op->remove;
    if (answer->type == SBX_MSG_ERROR && !gone)
        reply = sbx_msg_new_error (op->rid, sbx_msg_error (answer)->code, "%s",
                                   sbx_msg_error (answer)->message);
    else {
        const char *host = gone ? NULL : sbx_msg_vm_port_ok (answer)->host;
        uint64_t host_port = gone ? 0 : sbx_msg_vm_port_ok (answer)->host_port;
        if (!op->remove && (!host || !*host || host_port == 0 || host_port > 65535))
            reply = sbx_msg_new_error (op->rid, SBX_E_INTERNAL,
                                       "vmd answered vm.port without a usable host endpoint");
        else if (s_record (ctx, op, host, host_port))
            reply = sbx_msg_new_error (op->rid, SBX_E_INTERNAL, "cannot record port %llu of %s",
                                       (unsigned long long) op->port, op->sandbox_id);
        else {
            sbx_info ("rid=%llu sandbox=%s port %llu %s%s", (unsigned long long) op->rid,
                      op->sandbox_id, (unsigned long long) op->port,
                      op->remove ? "removed" : "published at ", op->remove ? "" : host);
            sbx_sandbox_info_t *info = s_info (ctx, op->sandbox_id);
            if (!info)
                reply = sbx_msg_new_error (op->rid, SBX_E_INTERNAL, "sandbox %s vanished",
                                           op->sandbox_id);
            else {
                reply = sbx_msg_new (SBX_MSG_SANDBOX_PORT_OK);
                reply->rid = op->rid;
                sbx_sandbox_port_ok_t *ok = sbx_msg_sandbox_port_ok (reply);
                ok->sandbox = info;
                ok->port = op->port;
                ok->public = op->public && !op->remove;
                ok->removed = op->remove;
            }
        }
    }
    ctx->send (ctx, op->client, &reply);
    s_op_destroy (&op);
}

sbx_msg_t *brk_ports_port (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_port_t *args = sbx_msg_sandbox_port (request);
    if (!request->caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "sandbox.port carries no caller identity");
    if (args->port < 1 || args->port > 65535)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "port must be between 1 and 65535");
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (brk_sandbox_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply; //  not_found for what the caller may not see
    if (request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot publish ports");
    else if (!args->remove && !streq (record.state, "ready"))
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s",
                                   record.id, record.state,
                                   streq (record.state, "stopped") ? "; resume it first" : "");
    s_op_t *op = reply ? NULL : calloc (1, sizeof *op);
    sbx_msg_t *vm = reply ? NULL : sbx_msg_new (SBX_MSG_VM_PORT);
    if (!reply && (!op || !vm)) {
        free (op);
        sbx_msg_destroy (&vm);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    if (reply) {
        brk_sandbox_clear (&record);
        return reply;
    }
    op->client = zframe_dup (client);
    op->rid = request->rid;
    op->sandbox_id = strdup (record.id);
    op->account = record.account_id ? strdup (record.account_id) : NULL;
    op->port = args->port;
    op->public = args->public;
    op->remove = args->remove;
    sbx_vm_port_t *body = sbx_msg_vm_port (vm);
    sbx_str_set (&body->sandbox_id, record.id);
    body->port = args->port;
    body->remove = args->remove;
    if (ctx->call (ctx, SBX_ROLE_VMD, record.vmd, &vm, S_VM_PORT_MS, s_on_vm_port, op) != 0) {
        s_op_destroy (&op);
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s is on vmd %s, which is not connected; retry when "
                                   "it is back",
                                   record.id, record.vmd ? record.vmd : "(none)");
    }
    brk_sandbox_clear (&record);
    return reply;
}

sbx_msg_t *brk_ports_resolve (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted)
{
    sbx_sandbox_resolve_t *args = sbx_msg_sandbox_resolve (request);
    const sbx_caller_t *caller = request->caller;
    if (!trusted && !(caller && (caller->kind == SBX_CALLER_KIND_ADMIN ||
                                 caller->kind == SBX_CALLER_KIND_SYSTEM)))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "sandbox.resolve is for gateways and operators");
    if (!args->label || !*args->label || args->port < 1 || args->port > 65535)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "a label and a port between 1 and 65535 are needed");
    brk_sandbox_t record;
    int rc = brk_store_sandbox_find_by_label (ctx->store, args->label, &record);
    if (rc != 0)
        return sbx_msg_new_error (request->rid, rc < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                  "no sandbox is at %s", args->label);
    brk_port_t port;
    rc = brk_store_port_find (ctx->store, record.id, args->port, &port);
    sbx_msg_t *reply;
    if (rc != 0)
        reply = sbx_msg_new_error (request->rid, rc < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                   "port %llu of sandbox %s is not published",
                                   (unsigned long long) args->port, record.id);
    else {
        reply = sbx_msg_new_reply (request, SBX_MSG_SANDBOX_RESOLVE_OK);
        sbx_sandbox_resolve_ok_t *ok = sbx_msg_sandbox_resolve_ok (reply);
        sbx_str_set (&ok->sandbox_id, record.id);
        sbx_str_set (&ok->account, record.account_id);
        sbx_sandbox_state_from_name (record.state, &ok->state);
        ok->public = port.public;
        ok->auto_resume = !record.no_auto_resume;
        sbx_str_set (&ok->host, port.host);
        ok->host_port = port.host_port;
        //  Its vmd's relay, for a gateway on another host (the forward is on loopback).
        brk_peer_t *vmd = record.vmd && ctx->registry
                              ? brk_registry_find (ctx->registry, SBX_ROLE_VMD, record.vmd)
                              : NULL;
        if (vmd && vmd->relay)
            sbx_str_set (&ok->relay, vmd->relay);
        brk_port_clear (&port);
    }
    brk_sandbox_clear (&record);
    return reply;
}

//  --------------------------------------------------------------------------
//  Self-test: a real broker, a vmd played by a thread.

#include "brk_server.h"
#include "brk_testkit.h"

static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    switch (request->type) {
    case SBX_MSG_VM_PORT: {
        sbx_vm_port_t *args = sbx_msg_vm_port (request);
        if (args->port == 666) {
            reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "hostfwd refused");
            break;
        }
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_PORT_OK);
        sbx_str_set (&sbx_msg_vm_port_ok (reply)->sandbox_id, args->sandbox_id);
        if (!args->remove) {
            sbx_str_set (&sbx_msg_vm_port_ok (reply)->host, "127.0.0.1");
            sbx_msg_vm_port_ok (reply)->host_port = 40000 + args->port;
        }
        break;
    }
    default:
        reply = brk_testkit_vm_ok (request);
        if (!reply)
            reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not played");
        break;
    }
    sbx_peer_send (peer, &reply);
}

static uint64_t s_rid = 5000;

static sbx_msg_t *s_test_port (zsock_t *client, sbx_caller_t *caller, const char *id, uint64_t port,
                               bool public, bool remove)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_PORT);
    request->caller = caller;
    sbx_sandbox_port_t *args = sbx_msg_sandbox_port (request);
    sbx_str_set (&args->sandbox_id, id);
    args->port = port;
    args->public = public;
    args->remove = remove;
    return brk_testkit_call (client, request, ++s_rid);
}

static sbx_msg_t *s_test_resolve (zsock_t *client, const char *label, uint64_t port,
                                  sbx_caller_t *caller)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_RESOLVE);
    request->caller = caller; //  NULL: brk_testkit_call makes it an operator
    sbx_str_set (&sbx_msg_sandbox_resolve (request)->label, label);
    sbx_msg_sandbox_resolve (request)->port = port;
    return brk_testkit_call (client, request, ++s_rid);
}

void brk_ports_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_ports_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, "ports@example.com");
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    char *alice = strdup (sbx_msg_account_create_ok (reply)->account_id);
    sbx_msg_destroy (&reply);
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-p", 4, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
#define ALICE brk_testkit_caller (alice, "key_alice", SBX_KEY_PRESET_FULL)
    request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = ALICE;
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *id = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    char *label = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->label);
    sbx_msg_destroy (&reply);

    //  Bad port, another account, a read-only key: refused, nothing asked of vmd.
    reply = s_test_port (client, ALICE, id, 0, true, false);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    reply = s_test_port (client, ALICE, id, 65536, true, false);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    //  (An account of its own: a caller of no account is refused before that.)
    char *other = brk_testkit_account (client, "other-ports@example.com", ++s_rid);
    reply = s_test_port (client, brk_testkit_caller (other, "key_o", SBX_KEY_PRESET_FULL), id, 8000,
                         true, false);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    free (other);
    reply = s_test_port (client, brk_testkit_caller (alice, "key_ro", SBX_KEY_PRESET_READ_ONLY), id,
                         8000, true, false);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, label, 8000, NULL);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  Publish: vmd's endpoint is recorded, the sandbox lists the port, resolve finds it.
    reply = s_test_port (client, ALICE, id, 8000, true, false);
    assert (reply->type == SBX_MSG_SANDBOX_PORT_OK);
    sbx_sandbox_port_ok_t *ok = sbx_msg_sandbox_port_ok (reply);
    assert (ok->port == 8000 && ok->public && !ok->removed && streq (ok->sandbox->id, id));
    assert (ok->sandbox->ports.count == 1 && ok->sandbox->ports.items[0].port == 8000);
    sbx_msg_destroy (&reply);
    reply = s_test_port (client, ALICE, id, 3000, false, false);
    assert (reply->type == SBX_MSG_SANDBOX_PORT_OK);
    assert (sbx_msg_sandbox_port_ok (reply)->sandbox->ports.count == 2);
    sbx_msg_destroy (&reply);
    reply = s_test_port (client, ALICE, id, 666, false, false);
    assert (brk_testkit_code (reply) == SBX_E_INTERNAL &&
            streq (sbx_msg_error (reply)->message, "hostfwd refused"));
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, label, 8000, NULL);
    assert (reply->type == SBX_MSG_SANDBOX_RESOLVE_OK);
    sbx_sandbox_resolve_ok_t *where = sbx_msg_sandbox_resolve_ok (reply);
    assert (streq (where->sandbox_id, id) && streq (where->account, alice));
    assert (where->public && streq (where->host, "127.0.0.1") && where->host_port == 48000);
    assert (where->state == SBX_SANDBOX_STATE_READY);
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, label, 3000, NULL);
    assert (reply->type == SBX_MSG_SANDBOX_RESOLVE_OK &&
            !sbx_msg_sandbox_resolve_ok (reply)->public);
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, "no-such-label", 8000, NULL);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    //  Users don't learn where forwards listen.
    reply = s_test_resolve (client, label, 8000, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);

    //  Stopped: resolve says so (the proxy answers 503); publishing waits for a resume.
    request = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
    request->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, id);
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_STOP_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, label, 8000, NULL);
    assert (sbx_msg_sandbox_resolve_ok (reply)->state == SBX_SANDBOX_STATE_STOPPED);
    assert (sbx_msg_sandbox_resolve_ok (reply)->auto_resume); //  the default
    sbx_msg_destroy (&reply);
    //  Only a gateway's port proxy may wake it (tests/integration/test_ports.py wakes one).
    request = sbx_msg_new (SBX_MSG_SANDBOX_WAKE);
    sbx_str_set (&sbx_msg_sandbox_wake (request)->sandbox_id, id);
    sbx_msg_sandbox_wake (request)->port = 8000;
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    //  autoResume switched off and on again (sandbox.update): the sandbox and resolve say so.
    for (int off = 1; off >= 0; off--) {
        request = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
        request->caller = ALICE;
        sbx_str_set (&sbx_msg_sandbox_update (request)->sandbox_id, id);
        sbx_msg_sandbox_update (request)->auto_resume = off ? SBX_TOGGLE_OFF : SBX_TOGGLE_ON;
        reply = brk_testkit_call (client, request, ++s_rid);
        assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK);
        assert (sbx_msg_sandbox_update_ok (reply)->sandbox->no_auto_resume == (bool) off);
        sbx_msg_destroy (&reply);
        reply = s_test_resolve (client, label, 8000, NULL);
        assert (sbx_msg_sandbox_resolve_ok (reply)->auto_resume == !off);
        sbx_msg_destroy (&reply);
    }
    reply = s_test_port (client, ALICE, id, 9000, true, false);
    assert (brk_testkit_code (reply) == SBX_E_FAILED_PRECONDITION &&
            strstr (sbx_msg_error (reply)->message, "resume it first"));
    sbx_msg_destroy (&reply);

    //  Remove (works while stopped): gone from resolve and from the sandbox.
    reply = s_test_port (client, ALICE, id, 8000, false, true);
    assert (reply->type == SBX_MSG_SANDBOX_PORT_OK && sbx_msg_sandbox_port_ok (reply)->removed);
    assert (sbx_msg_sandbox_port_ok (reply)->sandbox->ports.count == 1);
    sbx_msg_destroy (&reply);
    reply = s_test_resolve (client, label, 8000, NULL);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  Each change is a sandbox.port_changed event.
    request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, "sandbox.port_changed");
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (sbx_msg_events_replay_ok (reply)->events.count == 3);
    sbx_msg_destroy (&reply);

    zactor_destroy (&vmd);
    free (id);
    free (label);
    free (alice);
    zsock_destroy (&client);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
