/*  bill_selftest - billing's self-tests (see sbx_testrun.h). bill_server's test lives
    here, not in bill_server.c: it runs a real broker and its test kit, which the
    sbx-billing executable must not link. */
#include "bill_funds.h"
#include "bill_meter.h"
#include "bill_server.h"
#include "bill_store.h"
#include "brk_server.h"
#include "brk_testkit.h"
#include "sbx_testrun.h"

void bill_cluster_test (bool verbose); //  bill_cluster_test.c

static uint64_t s_rid = 5000;

//  Plays vmd at the protocol level: every vm.* succeeds at once.
static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    reply = brk_testkit_vm_ok (request);
    if (!reply)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not a vm request");
    sbx_peer_send (peer, &reply);
}

static zactor_t *s_start (zactor_fn *fn, sbx_config_t *config)
{
    zactor_t *actor = zactor_new (fn, config);
    char *status = zstr_recv (actor);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    return actor;
}

//  Asks the broker for a sandbox change (create when id is NULL); returns its id.
static char *s_sandbox (zsock_t *client, const char *account, sbx_msg_type_t type, const char *id)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = brk_testkit_caller (account, "key_test", SBX_KEY_PRESET_FULL);
    switch (type) {
    case SBX_MSG_SANDBOX_STOP:
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, id);
        break;
    case SBX_MSG_SANDBOX_RESUME:
        sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, id);
        break;
    case SBX_MSG_SANDBOX_DELETE:
        sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, id);
        break;
    default:
        break;
    }
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    char *made = NULL;
    if (type == SBX_MSG_SANDBOX_CREATE) {
        assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
        made = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    } else
        assert (reply->type != SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    return made;
}

//  The log's own figures: ms in ready per account, from sandbox.changed ts_ms alone.
static uint64_t s_log_ready_ms (zsock_t *client, const char *account, uint64_t *last_seq_p)
{
    zhashx_t *since = zhashx_new (); //  sandbox → start ts (as a uintptr)
    uint64_t total = 0, after = 0;
    bool more = true;
    while (more) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
        sbx_msg_events_replay (request)->after_seq = after;
        sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
        assert (reply->type == SBX_MSG_EVENTS_REPLAY_OK);
        sbx_events_replay_ok_t *ok = sbx_msg_events_replay_ok (reply);
        *last_seq_p = ok->last_seq;
        for (size_t i = 0; i < ok->events.count; i++) {
            sbx_event_t *event = &ok->events.items[i];
            after = event->seq;
            if (!streq (event->type, "sandbox.changed") || !streq (event->account, account))
                continue;
            sbx_err_t err;
            sbx_msg_t *msg = sbx_msg_decode (event->payload.data, event->payload.size, &err);
            assert (msg);
            sbx_sandbox_changed_t *changed = sbx_msg_sandbox_changed (msg);
            void *start = zhashx_lookup (since, changed->sandbox_id);
            if (changed->to == SBX_SANDBOX_STATE_READY && !start)
                zhashx_insert (since, changed->sandbox_id, (void *) (uintptr_t) event->ts_ms);
            else if (changed->to != SBX_SANDBOX_STATE_READY && start) {
                total += event->ts_ms - (uint64_t) (uintptr_t) start;
                zhashx_delete (since, changed->sandbox_id);
            }
            sbx_msg_destroy (&msg);
        }
        more = ok->more && ok->events.count > 0;
        sbx_msg_destroy (&reply);
    }
    assert (zhashx_size (since) == 0); //  the test ends with nothing running
    zhashx_destroy (&since);
    return total;
}

static uint64_t s_billing_seq (zactor_t *billing)
{
    zstr_send (billing, "SEQ");
    char *text = zstr_recv (billing);
    assert (text);
    uint64_t seq = strtoull (text, NULL, 10);
    zstr_free (&text);
    return seq;
}

//  Waits (polling, at most 10 s) until billing has applied the log up to seq (peers
//  joining add events of their own after it).
static void s_wait_seq (zactor_t *billing, uint64_t seq)
{
    for (int tries = 0; tries < 500 && s_billing_seq (billing) < seq; tries++)
        zclock_sleep (20);
    assert (s_billing_seq (billing) >= seq);
}

static sbx_msg_t *s_usage (zactor_t *billing, const char *account)
{
    zstr_sendx (billing, "USAGE", account, NULL);
    zframe_t *frame = zframe_recv (billing);
    assert (frame && zframe_size (frame) > 0);
    sbx_err_t err;
    sbx_msg_t *reply = sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err);
    zframe_destroy (&frame);
    assert (reply);
    return reply;
}

static void s_wait_vmd (zsock_t *client)
{
    for (int tries = 0; tries < 500; tries++) {
        if (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) > 0)
            return;
        zclock_sleep (20);
    }
    assert (false);
}

//  Run, stop, resume, delete with billing killed in the middle and the broker restarted
//  in the middle: billing's figures equal the log's, and equal those of a billing that
//  read the whole log in one go.
static void s_server_test (bool verbose)
{
    char dir[] = "/tmp/bill_server_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    zactor_t *broker = s_start (brk_server_actor, config);
    zsock_t *client = brk_testkit_dealer (config);
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 8, s_test_vmd, NULL);
    s_wait_vmd (client);
    zactor_t *billing = s_start (bill_server_actor, config);
    char *alice = brk_testkit_account (client, "alice@example.com", ++s_rid);

    //  One: runs ~2 s, stops; billing dies while it is stopped and while two runs.
    char *one = s_sandbox (client, alice, SBX_MSG_SANDBOX_CREATE, NULL);
    char *two = s_sandbox (client, alice, SBX_MSG_SANDBOX_CREATE, NULL);
    zclock_sleep (2000);
    s_sandbox (client, alice, SBX_MSG_SANDBOX_STOP, one);
    zactor_destroy (&billing); //  gone without a bye, two's interval open
    s_sandbox (client, alice, SBX_MSG_SANDBOX_RESUME, one);
    billing = s_start (bill_server_actor, config);

    //  The broker restarts while both run: nothing is lost.
    zactor_destroy (&broker);
    broker = s_start (brk_server_actor, config);
    //  A new client: the old one's pipe may not have noticed the restart yet.
    zsock_destroy (&client);
    client = brk_testkit_dealer (config);
    s_wait_vmd (client);
    zclock_sleep (1000);
    s_sandbox (client, alice, SBX_MSG_SANDBOX_DELETE, one);
    s_sandbox (client, alice, SBX_MSG_SANDBOX_STOP, two);

    uint64_t last_seq = 0;
    uint64_t ms = s_log_ready_ms (client, alice, &last_seq);
    s_wait_seq (billing, last_seq);
    sbx_msg_t *reply = s_usage (billing, "alice@example.com");
    assert (reply->type == SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
    if (verbose)
        printf ("log: %llu ms in ready; billing: %llu ms, %llu µ$\n", (unsigned long long) ms,
                (unsigned long long) ok->running_ms, (unsigned long long) ok->micro_usd);
    assert (ms >= 2 * 2000 + 1000 && ok->running_ms == ms);
    assert (ok->sandboxes.count == 2 && !ok->sandboxes.items[0].running);
    //  Per sandbox rounding: each sandbox's µ$ is floor (its ms × 10 / 1000).
    uint64_t micro = 0;
    for (size_t i = 0; i < ok->sandboxes.count; i++)
        micro += bill_meter_cost (0, ok->sandboxes.items[i].running_ms, 10);
    assert (ok->micro_usd == micro && ok->balance_micro_usd == -(int64_t) micro);

    //  An uninterrupted billing (its own data dir, the same broker) reads the whole log
    //  in one go and comes to the same figures.
    char other[] = "/tmp/bill_server_test2.XXXXXX";
    assert (mkdtemp (other));
    sbx_config_t *fresh = sbx_config_new (other);
    sbx_config_set (fresh, "broker.endpoint", sbx_config_get (config, "broker.endpoint", NULL));
    sbx_config_set (fresh, "tap.endpoint", sbx_config_get (config, "tap.endpoint", NULL));
    sbx_config_set (fresh, "heartbeat_ms", "100");
    sbx_config_set (fresh, "instance", "billing-fresh");
    zactor_t *again = s_start (bill_server_actor, fresh);
    s_wait_seq (again, last_seq);
    sbx_msg_t *same = s_usage (again, alice);
    sbx_usage_get_ok_t *check = sbx_msg_usage_get_ok (same);
    assert (same->type == SBX_MSG_USAGE_GET_OK);
    assert (check->running_ms == ok->running_ms && check->micro_usd == ok->micro_usd);
    assert (check->balance_micro_usd == ok->balance_micro_usd);
    assert (check->sandboxes.count == 2 && check->days.count == ok->days.count);
    for (size_t i = 0; i < 2; i++) {
        assert (streq (check->sandboxes.items[i].sandbox_id, ok->sandboxes.items[i].sandbox_id));
        assert (check->sandboxes.items[i].running_ms == ok->sandboxes.items[i].running_ms);
        assert (check->sandboxes.items[i].micro_usd == ok->sandboxes.items[i].micro_usd);
    }
    sbx_msg_destroy (&same);
    sbx_msg_destroy (&reply);
    zactor_destroy (&again);

    //  usage.get through the broker, when it routes it (route billing).
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&request->route, "billing");
    sbx_str_set (&sbx_msg_usage_get (request)->account, alice);
    reply = brk_testkit_call (client, request, ++s_rid);
    if (reply->type == SBX_MSG_USAGE_GET_OK)
        assert (sbx_msg_usage_get_ok (reply)->running_ms == ms);
    else if (verbose)
        printf ("broker does not route usage.get yet: %s\n", sbx_msg_error (reply)->message);
    sbx_msg_destroy (&reply);

    zactor_destroy (&billing);
    zactor_destroy (&vmd);
    zsock_destroy (&client);
    zactor_destroy (&broker);
    free (alice);
    free (one);
    free (two);
    sbx_config_destroy (&fresh);
    sbx_config_destroy (&config);
    const char *dirs[] = {dir, other};
    for (int i = 0; i < 2; i++) {
        zdir_t *tree = zdir_new (dirs[i], NULL);
        zdir_remove (tree, true);
        zdir_destroy (&tree);
    }
}

static const sbx_test_t s_tests[] = {
    {"bill_store", bill_store_test},     {"bill_meter", bill_meter_test},
    {"bill_funds", bill_funds_test},     {"bill_server", s_server_test},
    {"bill_cluster", bill_cluster_test}, {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
