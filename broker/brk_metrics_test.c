/*  brk_metrics_test - brk_metrics's self-test: a real broker, a vmd played by a thread. */
#include "brk_metrics.h"
#include "brk_server.h"
#include "brk_testkit.h"

#include <assert.h>

static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    if (request->type == SBX_MSG_VM_METRICS) {
        sbx_vm_metrics_t *args = sbx_msg_vm_metrics (request);
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_METRICS_OK);
        sbx_vm_metrics_ok_t *ok = sbx_msg_vm_metrics_ok (reply);
        sbx_str_set (&ok->sandbox_id, args->sandbox_id);
        ok->state = SBX_SANDBOX_STATE_READY;
        ok->vcpus = 1;
        ok->interval_ms = 5000;
        //  Three samples, 5 s apart; since_ms and limit as vmd_samples applies them.
        for (uint64_t t = 1; t <= 3; t++) {
            if (t * 5000 <= args->since_ms)
                continue;
            sbx_metrics_sample_t *s = sbx_metrics_sample_list_append (&ok->samples);
            s->time_ms = t * 5000;
            s->cpu_permille = t * 100;
            s->memory_total_bytes = 512u << 20;
            s->memory_used_bytes = t << 20;
        }
    } else if (!(reply = brk_testkit_vm_ok (request)))
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not played");
    sbx_peer_send (peer, &reply);
}

static uint64_t s_rid = 7000;

static sbx_msg_t *s_test_metrics (zsock_t *client, sbx_caller_t *caller, const char *id,
                                  uint64_t since_ms, uint64_t limit)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_METRICS);
    request->caller = caller;
    sbx_sandbox_metrics_t *args = sbx_msg_sandbox_metrics (request);
    sbx_str_set (&args->sandbox_id, id);
    args->since_ms = since_ms;
    args->limit = limit;
    return brk_testkit_call (client, request, ++s_rid);
}

void brk_metrics_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_metrics_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    char *alice = brk_testkit_account (client, "metrics@example.com", ++s_rid);
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-m", 4, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
#define ALICE brk_testkit_caller (alice, "key_alice", SBX_KEY_PRESET_FULL)
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = ALICE;
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *id = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);

    //  The owner reads vmd's samples, oldest first; since_ms reaches vmd.
    reply = s_test_metrics (client, ALICE, id, 0, 0);
    assert (reply->type == SBX_MSG_SANDBOX_METRICS_OK);
    sbx_sandbox_metrics_ok_t *ok = sbx_msg_sandbox_metrics_ok (reply);
    assert (streq (ok->sandbox_id, id) && ok->state == SBX_SANDBOX_STATE_READY);
    assert (ok->vcpus == 1 && ok->interval_ms == 5000 && ok->samples.count == 3);
    assert (ok->samples.items[0].time_ms == 5000 && ok->samples.items[2].cpu_permille == 300);
    assert (ok->samples.items[2].memory_used_bytes == 3u << 20);
    sbx_msg_destroy (&reply);
    reply = s_test_metrics (client, ALICE, id, 5000, 0);
    assert (sbx_msg_sandbox_metrics_ok (reply)->samples.count == 2);
    sbx_msg_destroy (&reply);
    //  A read-only key may read; another account may not see it; bad limits are refused.
    reply = s_test_metrics (client, brk_testkit_caller (alice, "key_ro", SBX_KEY_PRESET_READ_ONLY),
                            id, 0, 10);
    assert (reply->type == SBX_MSG_SANDBOX_METRICS_OK);
    sbx_msg_destroy (&reply);
    char *other = brk_testkit_account (client, "other-metrics@example.com", ++s_rid);
    reply =
        s_test_metrics (client, brk_testkit_caller (other, "key_o", SBX_KEY_PRESET_FULL), id, 0, 0);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    free (other);
    reply = s_test_metrics (client, ALICE, id, 0, 721);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    reply = s_test_metrics (client, ALICE, "sb_nosuchthing", 0, 0);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  Its vmd gone: unavailable, said at once.
    zactor_destroy (&vmd);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) > 0)
        zclock_sleep (50);
    reply = s_test_metrics (client, ALICE, id, 0, 0);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    sbx_msg_destroy (&reply);

    free (id);
    free (alice);
    zsock_destroy (&client);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
