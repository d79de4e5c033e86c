/*  gw_others_test - gw_others through a real broker: this gateway (an sbx_peer in the
    test's loop) asks two other gateways, played at the protocol level by workers in
    threads of their own (brk_testkit), each counting the asks it gets. Where a build was
    found is asked first next time (one hop), whatever the broker's list order; a gateway
    that lost it, or is gone, is passed over, and a build nobody holds is forgotten. */
#include "brk_testkit.h"
#include "gw_auth.h"
#include "gw_others.h"

#include <assert.h>
#include <stdatomic.h>

typedef struct {
    atomic_int asked;   //  build.get requests that reached this gateway
    atomic_bool holds;  //  it answers build.get.ok (else not_found)
    const char *caller; //  the account it expects on each request
} s_gateway_t;

static void s_play_gateway (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    s_gateway_t *gw = arg;
    sbx_msg_t *request = *request_p, *reply;
    if (request->type != SBX_MSG_BUILD_GET)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not played");
    else {
        atomic_fetch_add (&gw->asked, 1);
        assert (request->caller && streq (request->caller->account_id, gw->caller));
        assert (streq (sbx_msg_build_get (request)->build_id, "bld_0123456789"));
        if (atomic_load (&gw->holds)) {
            reply = sbx_msg_new_reply (request, SBX_MSG_BUILD_GET_OK);
            sbx_str_set (&sbx_msg_build_get_ok (reply)->build, sbx_peer_instance (peer));
        } else
            reply = sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "no such build here");
    }
    sbx_peer_send (peer, &reply);
}

typedef struct {
    bool done;
    char *build; //  the build.get.ok's text (the instance that answered)
    sbx_code_t code;
} s_answer_t;

static void s_on_welcome (sbx_peer_t *peer, bool first, void *arg)
{
    (void) peer;
    (void) first;
    *(bool *) arg = true;
}

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) message;
    s_answer_t *answer = arg;
    answer->done = true;
    answer->code = code;
    if (reply && reply->type == SBX_MSG_BUILD_GET_OK)
        answer->build = strdup (sbx_msg_build_get_ok (reply)->build);
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    return *(bool *) arg ? -1 : 0;
}

//  Runs the loop until *flag (asserts it comes within 20 s).
static void s_run_until (zloop_t *loop, bool *flag)
{
    int64_t deadline = zclock_mono () + 20000;
    int timer = zloop_timer (loop, 10, 0, s_on_tick, flag);
    while (!*flag && zclock_mono () < deadline)
        zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (*flag);
}

static void s_ask (zloop_t *loop, gw_others_t *others, sbx_caller_t *caller, s_answer_t *answer)
{
    memset (answer, 0, sizeof *answer);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_BUILD_GET);
    sbx_str_set (&sbx_msg_build_get (request)->build_id, "bld_0123456789");
    uint64_t handle = gw_others_ask (others, caller, &request, "build:bld_0123456789",
                                     "template build bld_0123456789", s_on_answer, answer);
    assert (!request && (handle || answer->done));
    s_run_until (loop, &answer->done);
}

void gw_others_peers_test (bool verbose)
{
    (void) verbose;
    brk_testkit_broker_t broker;
    brk_testkit_broker_start (&broker, "gw_others_test", NULL);
    char *account = brk_testkit_account (broker.client, "others@example.com", 1);
    sbx_caller_t *caller = brk_testkit_caller (account, "key_others", SBX_KEY_PRESET_FULL);
    //  Both other gateways hold the build to begin with; each answers with its name.
    s_gateway_t gws[2] = {{.caller = account}, {.caller = account}};
    const char *names[2] = {"gw-two", "gw-three"};
    zactor_t *workers[2];
    for (int i = 0; i < 2; i++) {
        atomic_store (&gws[i].holds, true);
        workers[i] = brk_testkit_worker (broker.config, SBX_ROLE_GATEWAY, names[i], 0,
                                         s_play_gateway, &gws[i]);
    }
    uint64_t rid = 10;
    for (int tries = 0; tries < 200; tries++) {
        if (brk_testkit_peer_count (broker.client, SBX_ROLE_GATEWAY, ++rid) == 2)
            break;
        zclock_sleep (25);
    }

    //  This gateway, in the test's loop.
    zloop_t *loop = zloop_new ();
    sbx_peer_t *peer = sbx_peer_new (broker.config, SBX_ROLE_GATEWAY, "gw-one");
    bool welcomed = false;
    sbx_peer_set_welcome_fn (peer, s_on_welcome, &welcomed);
    assert (peer && sbx_peer_start (peer, loop) == 0);
    s_run_until (loop, &welcomed);
    gw_broker_t *gw_broker = gw_broker_new (peer);
    gw_others_t *others = gw_others_new (gw_broker, "gw-one");
    const char *key = "build:bld_0123456789";
    assert (others && !gw_others_where (others, key));

    //  The first ask walks the broker's list: x, the first in it, answers.
    s_answer_t answer;
    s_ask (loop, others, caller, &answer);
    assert (answer.code == SBX_OK && answer.build);
    int x = streq (answer.build, names[0]) ? 0 : 1, y = 1 - x;
    assert (streq (answer.build, names[x]));
    free (answer.build);
    assert (atomic_load (&gws[x].asked) == 1 && atomic_load (&gws[y].asked) == 0);
    assert (streq (gw_others_where (others, key), names[x]));

    //  x no longer holds it: after its not_found the others are asked (x not twice), and y
    //  answers. The next asks go to y alone, one hop, though x comes first in the list.
    atomic_store (&gws[x].holds, false);
    s_ask (loop, others, caller, &answer);
    assert (answer.code == SBX_OK && streq (answer.build, names[y]));
    free (answer.build);
    assert (atomic_load (&gws[x].asked) == 2 && atomic_load (&gws[y].asked) == 1);
    assert (streq (gw_others_where (others, key), names[y]));
    for (int i = 0; i < 3; i++) {
        s_ask (loop, others, caller, &answer);
        assert (answer.code == SBX_OK && streq (answer.build, names[y]));
        free (answer.build);
    }
    assert (atomic_load (&gws[x].asked) == 2 && atomic_load (&gws[y].asked) == 4);

    //  Nobody holds it: y, then the others, are asked, and it is forgotten.
    atomic_store (&gws[y].holds, false);
    s_ask (loop, others, caller, &answer);
    assert (!answer.build && answer.code == SBX_E_NOT_FOUND);
    assert (atomic_load (&gws[x].asked) == 3 && atomic_load (&gws[y].asked) == 5);
    assert (!gw_others_where (others, key));

    //  Found on y again; then y's gateway is gone: it is passed over, the walk follows.
    atomic_store (&gws[y].holds, true);
    s_ask (loop, others, caller, &answer);
    assert (answer.code == SBX_OK && streq (answer.build, names[y]));
    free (answer.build);
    zactor_destroy (&workers[y]);
    s_ask (loop, others, caller, &answer);
    assert (!answer.build && answer.code == SBX_E_NOT_FOUND);
    assert (atomic_load (&gws[x].asked) == 5);
    assert (!gw_others_where (others, key));

    gw_others_destroy (&others);
    gw_broker_destroy (&gw_broker);
    sbx_peer_destroy (&peer);
    zloop_destroy (&loop);
    zactor_destroy (&workers[x]);
    gw_auth_caller_destroy (&caller);
    free (account);
    brk_testkit_broker_stop (&broker);
}
