/*  brk_hostloss_test - a real broker (vmd.lost_after_ms 600) and a vmd played at the
    protocol level: its host goes away with a ready sandbox, a stopped one and a third;
    all three go to error, host lost, their events saying the last heartbeat; one is
    deleted meanwhile. The host comes back with the first running and the second
    stopped: they return to ready and stopped, the third (gone with the host) stays in
    error saying so, and the deleted one's guest is deleted there. A fifth was being
    stopped as the host went: it stays stopping, then is lost as well, and comes back
    stopped.
*/
#include "brk_hostloss.h"
#include "brk_sandbox.h"
#include "brk_server.h"
#include "brk_testkit.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t s_rid = 5000;

//  What the test vmd says it has at vm.list (ids, states), and the vm.delete it got.
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static char s_guests[5][32];
static sbx_sandbox_state_t s_states[5];
static size_t s_guest_count;
static char s_deleted[256];
static char s_held[32]; //  a sandbox whose vm.stop the test vmd leaves unanswered

static void s_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    pthread_mutex_lock (&s_lock);
    if (request->type == SBX_MSG_VM_LIST) {
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_LIST_OK);
        for (size_t i = 0; i < s_guest_count; i++) {
            sbx_vm_info_t *vm = sbx_vm_info_list_append (&sbx_msg_vm_list_ok (reply)->vms);
            sbx_str_set (&vm->sandbox_id, s_guests[i]);
            vm->state = s_states[i];
        }
    } else if (request->type == SBX_MSG_VM_STOP && streq (sbx_msg_subject (request), s_held)) {
        pthread_mutex_unlock (&s_lock);
        return;
    } else {
        if (request->type == SBX_MSG_VM_DELETE)
            snprintf (s_deleted + strlen (s_deleted), sizeof s_deleted - strlen (s_deleted), "%s ",
                      sbx_msg_vm_delete (request)->sandbox_id);
        reply = brk_testkit_vm_ok (request);
    }
    pthread_mutex_unlock (&s_lock);
    assert (reply);
    sbx_peer_send (peer, &reply);
}

static sbx_sandbox_info_t *s_info (sbx_msg_t *reply)
{
    assert (reply->type == SBX_MSG_SANDBOX_GET_OK || reply->type == SBX_MSG_SANDBOX_CREATE_OK ||
            reply->type == SBX_MSG_SANDBOX_STOP_OK || reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    return reply->type == SBX_MSG_SANDBOX_GET_OK      ? sbx_msg_sandbox_get_ok (reply)->sandbox
           : reply->type == SBX_MSG_SANDBOX_CREATE_OK ? sbx_msg_sandbox_create_ok (reply)->sandbox
           : reply->type == SBX_MSG_SANDBOX_STOP_OK   ? sbx_msg_sandbox_stop_ok (reply)->sandbox
                                                      : sbx_msg_sandbox_delete_ok (reply)->sandbox;
}

static char *s_create (zsock_t *client, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    char *id = strdup (s_info (reply)->id);
    sbx_msg_destroy (&reply);
    return id;
}

static sbx_msg_t *s_ask (zsock_t *client, sbx_msg_type_t type, const char *id, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    assert (sbx_msg_set_subject (request, id) == 0);
    return brk_testkit_call (client, request, ++s_rid);
}

//  Waits (10 s at most) until the sandbox is in state; returns its reason (fresh).
static char *s_wait (zsock_t *client, const char *id, const char *account,
                     sbx_sandbox_state_t state)
{
    for (int tries = 0; tries < 500; tries++) {
        sbx_msg_t *reply = s_ask (client, SBX_MSG_SANDBOX_GET, id, account);
        sbx_sandbox_info_t *info = s_info (reply);
        if (info->state == state) {
            char *reason = strdup (info->reason ? info->reason : "");
            sbx_msg_destroy (&reply);
            return reason;
        }
        sbx_msg_destroy (&reply);
        zclock_sleep (20);
    }
    assert (!"the sandbox never got there");
    return NULL;
}

void brk_hostloss_test (bool verbose)
{
    (void) verbose;
    brk_testkit_broker_t broker;
    brk_testkit_broker_start (&broker, "brk_hostloss_test", "vmd.lost_after_ms", "600", NULL);
    sbx_config_t *config = broker.config;
    zsock_t *client = broker.client;
    char *alice = brk_testkit_account (client, "alice@example.com", ++s_rid);

    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-x", 8, s_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    char *running = s_create (client, alice);
    char *stopped = s_create (client, alice);
    char *gone = s_create (client, alice);
    char *deleted = s_create (client, alice);
    char *cut = s_create (client, alice);
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SANDBOX_STOP, stopped, alice);
    assert (s_info (reply)->state == SBX_SANDBOX_STATE_STOPPED);
    sbx_msg_destroy (&reply);
    pthread_mutex_lock (&s_lock);
    snprintf (s_held, sizeof s_held, "%s", cut);
    pthread_mutex_unlock (&s_lock);
    sbx_msg_t *stop = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
    stop->caller = brk_testkit_caller (alice, "key_a", SBX_KEY_PRESET_FULL);
    stop->rid = ++s_rid;
    assert (sbx_msg_set_subject (stop, cut) == 0);
    brk_testkit_send (client, &stop);
    zclock_sleep (200); //  at the vmd, unanswered

    //  The host goes away: after its three heartbeats and vmd.lost_after_ms, host lost.
    //  The stop in flight hears that the vmd went away, and its sandbox stays stopping
    //  until then.
    uint64_t away = sbx_clock_now_ms ();
    zactor_destroy (&vmd);
    while ((reply = brk_testkit_recv (client, 10000)) && reply->rid != s_rid)
        sbx_msg_destroy (&reply);
    assert (reply && brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    assert (strstr (sbx_msg_error (reply)->message, "it stays stopping"));
    sbx_msg_destroy (&reply);
    const char *lost[] = {running, stopped, gone, deleted, cut};
    for (int i = 0; i < 5; i++) {
        char *reason = s_wait (client, lost[i], alice, SBX_SANDBOX_STATE_ERROR);
        assert (strncmp (reason, "host lost: vmd host-x has not answered since ", 45) == 0);
        free (reason);
    }
    assert (sbx_clock_now_ms () - away >= 600);

    //  Their events say when the host was last heard: before the event, after the
    //  sandboxes were made. Billing ends the running one there.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, "sandbox.changed");
    reply = brk_testkit_call (client, request, ++s_rid);
    size_t seen = 0;
    sbx_events_replay_ok_t *log = sbx_msg_events_replay_ok (reply);
    for (size_t i = 0; i < log->events.count; i++) {
        sbx_event_t *event = &log->events.items[i];
        sbx_err_t err;
        sbx_msg_t *msg = sbx_msg_decode (event->payload.data, event->payload.size, &err);
        sbx_sandbox_changed_t *changed = sbx_msg_sandbox_changed (msg);
        if (changed->to == SBX_SANDBOX_STATE_ERROR) {
            assert (changed->at_ms && changed->at_ms < event->ts_ms);
            assert (changed->at_ms + 2000 > away && changed->at_ms <= away + 200);
            assert (changed->from ==
                    (streq (changed->sandbox_id, stopped) ? SBX_SANDBOX_STATE_STOPPED
                     : streq (changed->sandbox_id, cut)   ? SBX_SANDBOX_STATE_STOPPING
                                                          : SBX_SANDBOX_STATE_READY));
            seen++;
        } else
            assert (!changed->at_ms);
        sbx_msg_destroy (&msg);
    }
    assert (seen == 5);
    sbx_msg_destroy (&reply);

    //  A lost sandbox is deleted at once: nothing to ask of a host that is gone. Stop and
    //  resume are refused, saying only delete works.
    reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, deleted, alice);
    assert (s_info (reply)->state == SBX_SANDBOX_STATE_DELETED);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_RESUME, stopped, alice);
    assert (brk_testkit_code (reply) == SBX_E_FAILED_PRECONDITION);
    assert (strstr (sbx_msg_error (reply)->message, "only delete works"));
    sbx_msg_destroy (&reply);

    //  The host comes back with the first running, the second stopped, the deleted one's
    //  guest still there, the cut one stopped after all, and without the third.
    pthread_mutex_lock (&s_lock);
    snprintf (s_guests[0], sizeof s_guests[0], "%s", running);
    s_states[0] = SBX_SANDBOX_STATE_READY;
    snprintf (s_guests[1], sizeof s_guests[1], "%s", stopped);
    s_states[1] = SBX_SANDBOX_STATE_STOPPED;
    snprintf (s_guests[2], sizeof s_guests[2], "%s", deleted);
    s_states[2] = SBX_SANDBOX_STATE_READY;
    snprintf (s_guests[3], sizeof s_guests[3], "%s", cut);
    s_states[3] = SBX_SANDBOX_STATE_STOPPED;
    s_guest_count = 4;
    pthread_mutex_unlock (&s_lock);
    vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-x", 8, s_vmd, NULL);
    free (s_wait (client, running, alice, SBX_SANDBOX_STATE_READY));
    free (s_wait (client, stopped, alice, SBX_SANDBOX_STATE_STOPPED));
    free (s_wait (client, cut, alice, SBX_SANDBOX_STATE_STOPPED));
    char *reason = s_wait (client, gone, alice, SBX_SANDBOX_STATE_ERROR);
    for (int tries = 0; tries < 250 && !strstr (reason, "came back without"); tries++) {
        free (reason);
        zclock_sleep (20);
        reason = s_wait (client, gone, alice, SBX_SANDBOX_STATE_ERROR);
    }
    assert (streq (reason, "its host came back without its guest; delete it"));
    free (reason);
    bool told = false;
    for (int tries = 0; tries < 250 && !told; tries++) {
        pthread_mutex_lock (&s_lock);
        told = strstr (s_deleted, deleted) != NULL;
        pthread_mutex_unlock (&s_lock);
        zclock_sleep (20);
    }
    assert (told);
    //  Back, they work: the stopped one resumes.
    reply = s_ask (client, SBX_MSG_SANDBOX_RESUME, stopped, alice);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
    sbx_msg_destroy (&reply);

    zactor_destroy (&vmd);
    free (running);
    free (stopped);
    free (gone);
    free (deleted);
    free (cut);
    free (alice);
    brk_testkit_broker_stop (&broker);
}
