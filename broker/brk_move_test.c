/*  brk_move_test - a real broker and two vmds played at the protocol level: a stopped
    sandbox on host-a moves to host-b when host-a is drained (offer, take with the offer's
    ticket, the record follows, sandbox.moved, host-a deletes its copy), and while it
    moves its changes are refused; nothing new is placed on a drained vmd; a take that
    fails leaves the sandbox where it was (host-b's partial copy deleted), and it resumes
    there; --undo places there again.
*/
#include "brk_move.h"
#include "brk_server.h"
#include "brk_testkit.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t s_rid = 7000;

//  What the test vmds saw and how host-b answers takes: 0 at once, 1 an error, 2 held
//  (the test answers through the worker).
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static char s_seen[4096];
static int s_take_mode;
static uint64_t s_held_rid;
static char s_offered_ticket[300];

static void s_note (const char *fmt, const char *vmd, const char *what)
{
    snprintf (s_seen + strlen (s_seen), sizeof s_seen - strlen (s_seen), fmt, vmd, what);
}

static void s_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    const char *name = arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    pthread_mutex_lock (&s_lock);
    if (request->type == SBX_MSG_VM_SHIP_OFFER) {
        sbx_vm_ship_offer_t *args = sbx_msg_vm_ship_offer (request);
        snprintf (s_offered_ticket, sizeof s_offered_ticket, "%s", args->ticket);
        s_note ("%s offer %s;", name, args->sandbox_id);
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_SHIP_OFFER_OK);
        sbx_vm_ship_offer_ok_t *ok = sbx_msg_vm_ship_offer_ok (reply);
        sbx_str_set (&ok->sandbox_id, args->sandbox_id);
        ok->offer = calloc (1, sizeof *ok->offer);
        sbx_str_set (&ok->offer->endpoint, "tcp://10.0.0.1:7300");
        sbx_str_set (&ok->offer->public_key, "0123456789012345678901234567890123456789");
        sbx_strlist_append (&ok->offer->files, "x/ship/overlay.qcow2");
        sbx_str_set (&ok->offer->image, "abc123");
        sbx_str_set (&ok->offer->hostname, "h");
        ok->offer->type = SBX_SANDBOX_TYPE_SMALL;
        ok->offer->bytes = 4096;
    } else if (request->type == SBX_MSG_VM_SHIP_TAKE) {
        sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take (request);
        //  The offer and its ticket came through whole.
        assert (streq (args->ticket, s_offered_ticket) && streq (args->from, "host-a"));
        assert (streq (args->offer->endpoint, "tcp://10.0.0.1:7300") && args->offer->bytes == 4096);
        s_note ("%s take %s;", name, args->sandbox_id);
        if (s_take_mode == 1)
            reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE, "the fetch failed");
        else if (s_take_mode == 2)
            s_held_rid = request->rid;
        else {
            reply = sbx_msg_new_reply (request, SBX_MSG_VM_SHIP_TAKE_OK);
            sbx_str_set (&sbx_msg_vm_ship_take_ok (reply)->sandbox_id, args->sandbox_id);
            sbx_msg_vm_ship_take_ok (reply)->bytes = 4096;
        }
    } else {
        if (request->type == SBX_MSG_VM_DELETE)
            s_note ("%s delete %s;", name, sbx_msg_vm_delete (request)->sandbox_id);
        reply = brk_testkit_vm_ok (request);
    }
    pthread_mutex_unlock (&s_lock);
    if (reply)
        sbx_peer_send (peer, &reply);
}

static bool s_saw (const char *what)
{
    if (getenv ("BRK_MOVE_DEBUG"))
        fprintf (stderr, "waiting for %s\n", what);
    for (int tries = 0; tries < 500; tries++) {
        pthread_mutex_lock (&s_lock);
        bool seen = strstr (s_seen, what) != NULL;
        pthread_mutex_unlock (&s_lock);
        if (seen)
            return true;
        zclock_sleep (20);
    }
    fprintf (stderr, "brk_move_test: never saw '%s'; saw: %s\n", what, s_seen);
    return false;
}

static sbx_sandbox_info_t *s_info (sbx_msg_t *reply)
{
    switch (reply->type) {
    case SBX_MSG_SANDBOX_GET_OK:
        return sbx_msg_sandbox_get_ok (reply)->sandbox;
    case SBX_MSG_SANDBOX_CREATE_OK:
        return sbx_msg_sandbox_create_ok (reply)->sandbox;
    case SBX_MSG_SANDBOX_STOP_OK:
        return sbx_msg_sandbox_stop_ok (reply)->sandbox;
    case SBX_MSG_SANDBOX_RESUME_OK:
        return sbx_msg_sandbox_resume_ok (reply)->sandbox;
    default:
        assert (!"not a sandbox answer");
        return NULL;
    }
}

static sbx_msg_t *s_ask (zsock_t *client, sbx_msg_type_t type, const char *id, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    if (id)
        assert (sbx_msg_set_subject (request, id) == 0);
    return brk_testkit_call (client, request, ++s_rid);
}

//  A stopped sandbox of account's; its id and vmd (fresh strings).
static char *s_stopped (zsock_t *client, const char *account, char **vmd)
{
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, NULL, account);
    char *id = strdup (s_info (reply)->id);
    *vmd = strdup (s_info (reply)->vmd);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_STOP, id, account);
    assert (s_info (reply)->state == SBX_SANDBOX_STATE_STOPPED);
    sbx_msg_destroy (&reply);
    return id;
}

static char *s_vmd_of (zsock_t *client, const char *id, const char *account)
{
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SANDBOX_GET, id, account);
    char *vmd = strdup (s_info (reply)->vmd);
    sbx_msg_destroy (&reply);
    return vmd;
}

static sbx_msg_t *s_drain (zsock_t *client, const char *name, bool undo)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_HOST_DRAIN);
    sbx_str_set (&sbx_msg_host_drain (request)->name, name);
    sbx_msg_host_drain (request)->undo = undo;
    return brk_testkit_call (client, request, ++s_rid);
}

void brk_move_test (bool verbose)
{
    (void) verbose;
    brk_testkit_broker_t broker;
    brk_testkit_broker_start (&broker, "brk_move_test", NULL);
    sbx_config_t *config = broker.config;
    zsock_t *client = broker.client;
    char *alice = brk_testkit_account (client, "alice@example.com", ++s_rid);
    zactor_t *a = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 8, s_vmd, "host-a");
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    char *vmd = NULL;
    char *one = s_stopped (client, alice, &vmd);
    assert (streq (vmd, "host-a"));
    free (vmd);
    zactor_t *b = brk_testkit_worker (config, SBX_ROLE_VMD, "host-b", 8, s_vmd, "host-b");
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 2)
        zclock_sleep (20);

    //  A vmd nobody knows is not drained; a user may not drain.
    sbx_msg_t *reply = s_drain (client, "host-x", false);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_HOST_DRAIN);
    request->caller = brk_testkit_caller (alice, "key_a", SBX_KEY_PRESET_FULL);
    sbx_str_set (&sbx_msg_host_drain (request)->name, "host-a");
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);

    //  Drained, with the take held: while it moves, a resume is refused.
    s_take_mode = 2;
    reply = s_drain (client, "host-a", false);
    assert (reply->type == SBX_MSG_HOST_DRAIN_OK);
    assert (sbx_msg_host_drain_ok (reply)->stopped == 1 &&
            sbx_msg_host_drain_ok (reply)->host->draining_ms);
    sbx_msg_destroy (&reply);
    char want[200];
    snprintf (want, sizeof want, "host-b take %s;", one);
    assert (s_saw (want));
    reply = s_ask (client, SBX_MSG_SANDBOX_RESUME, one, alice);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    assert (strstr (sbx_msg_error (reply)->message, "moving to another host"));
    sbx_msg_destroy (&reply);
    //  Nothing new goes to host-a now, though it has room.
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, NULL, alice);
    assert (streq (s_info (reply)->vmd, "host-b"));
    char *two = strdup (s_info (reply)->id);
    sbx_msg_destroy (&reply);
    //  host-b answers the take: the sandbox is host-b's, host-a deletes its copy.
    pthread_mutex_lock (&s_lock);
    reply = sbx_msg_new (SBX_MSG_VM_SHIP_TAKE_OK);
    reply->rid = s_held_rid;
    s_take_mode = 0;
    pthread_mutex_unlock (&s_lock);
    sbx_str_set (&sbx_msg_vm_ship_take_ok (reply)->sandbox_id, one);
    sbx_msg_vm_ship_take_ok (reply)->bytes = 4096;
    brk_testkit_worker_send (b, &reply);
    snprintf (want, sizeof want, "host-a delete %s;", one);
    assert (s_saw (want));
    vmd = s_vmd_of (client, one, alice);
    assert (streq (vmd, "host-b"));
    free (vmd);
    request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, "sandbox.moved");
    reply = brk_testkit_call (client, request, ++s_rid);
    sbx_events_replay_ok_t *log = sbx_msg_events_replay_ok (reply);
    assert (log->events.count == 1 && streq (log->events.items[0].subject, one));
    sbx_err_t err;
    sbx_msg_t *moved =
        sbx_msg_decode (log->events.items[0].payload.data, log->events.items[0].payload.size, &err);
    assert (moved && streq (sbx_msg_sandbox_moved (moved)->from, "host-a") &&
            streq (sbx_msg_sandbox_moved (moved)->to, "host-b") &&
            sbx_msg_sandbox_moved (moved)->bytes == 4096);
    sbx_msg_destroy (&moved);
    sbx_msg_destroy (&reply);
    //  It resumes where it is now.
    reply = s_ask (client, SBX_MSG_SANDBOX_RESUME, one, alice);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK && streq (s_info (reply)->vmd, "host-b"));
    sbx_msg_destroy (&reply);

    //  Undrained, host-a takes sandboxes again (it has the most room).
    reply = s_drain (client, "host-a", true);
    assert (reply->type == SBX_MSG_HOST_DRAIN_OK &&
            !sbx_msg_host_drain_ok (reply)->host->draining_ms);
    sbx_msg_destroy (&reply);
    char *three = s_stopped (client, alice, &vmd);
    assert (streq (vmd, "host-a"));
    free (vmd);
    //  A take that fails: the sandbox stays on host-a, host-b's copy goes, it resumes.
    s_take_mode = 1;
    reply = s_drain (client, "host-a", false);
    sbx_msg_destroy (&reply);
    snprintf (want, sizeof want, "host-b delete %s;", three);
    assert (s_saw (want));
    reply = s_drain (client, "host-a", true);
    sbx_msg_destroy (&reply);
    for (int tries = 0; tries < 100; tries++) {
        reply = s_ask (client, SBX_MSG_SANDBOX_RESUME, three, alice);
        bool done = reply->type == SBX_MSG_SANDBOX_RESUME_OK;
        if (done)
            assert (streq (s_info (reply)->vmd, "host-a"));
        sbx_msg_destroy (&reply);
        if (done)
            break;
        assert (tries < 99);
        zclock_sleep (50);
    }

    zactor_destroy (&a);
    zactor_destroy (&b);
    free (one);
    free (two);
    free (three);
    free (alice);
    brk_testkit_broker_stop (&broker);
}
