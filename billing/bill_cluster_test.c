/*  bill_cluster_test - billing's store on a real dqlite cluster of three nodes (this
    process), as the billing processes of three control nodes share it: one lease at a
    time, taken over when its holder stops renewing; the same events applied by two
    meters at once are charged once; a leader that stops in the middle loses nothing
    committed and charges nothing twice. Test runner only.
*/
#include "bill_meter.h"
#include "bill_store.h"
#include "sbx_testcluster.h"

#include <assert.h>
#include <unistd.h>

static bill_store_t *s_open (sbx_testcluster_t *cluster)
{
    const char *addresses[SBX_TESTCLUSTER_MAX];
    size_t count = sbx_testcluster_addresses (cluster, addresses);
    sbx_dqlite_cluster_t where = {addresses, count, NULL, NULL, 2000, true};
    return bill_store_new_cluster (&where);
}

//  An event as the broker's log holds it.
static int s_apply (bill_meter_t *meter, uint64_t seq, uint64_t ts, const char *account,
                    sbx_msg_t *msg)
{
    sbx_event_t event = {.seq = seq, .ts_ms = ts, .account = (char *) account};
    event.type = (char *) sbx_msg_type_name (msg->type);
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (msg, &data, &size, &err) == 0);
    event.payload.data = data;
    event.payload.size = size;
    int rc = bill_meter_apply (meter, &event);
    free (data);
    return rc;
}

static sbx_msg_t *s_changed (const char *id, sbx_sandbox_state_t to)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (msg)->sandbox_id, id);
    sbx_msg_sandbox_changed (msg)->to = to;
    sbx_msg_sandbox_changed (msg)->type = SBX_SANDBOX_TYPE_SMALL;
    return msg;
}

static uint64_t s_charged_ms (bill_store_t *store, const char *account)
{
    uint64_t ms = 0, micro = 0;
    assert (bill_store_ledger_totals (store, account, &ms, &micro) == 0);
    return ms;
}

void bill_cluster_test (bool verbose)
{
    (void) verbose;
    sbx_testcluster_t *cluster = sbx_testcluster_new (3);
    assert (cluster);
    bill_store_t *a = s_open (cluster), *b = s_open (cluster);
    assert (a && b && bill_store_is_cluster (a));

    //  The lease: one holder; renewed by it; taken by another only once it expired.
    assert (bill_store_lease (a, "bill_a", 1000, 4000) == 1);
    assert (bill_store_lease (b, "bill_b", 1500, 4500) == 0);
    assert (bill_store_lease (a, "bill_a", 2000, 5000) == 1);
    assert (bill_store_lease (b, "bill_b", 4900, 7900) == 0);
    assert (bill_store_lease (b, "bill_b", 5001, 8001) == 1);
    assert (bill_store_lease (a, "bill_a", 5002, 8002) == 0);
    assert (bill_store_lease (a, "has space", 1, 2) == -1);

    //  Two meters apply the same log at once (an overlap of two holders): once each.
    bill_rates_t rates = {.small = 10, .medium = 20, .large = 40};
    bill_meter_t *ma = bill_meter_new (a, &rates), *mb = bill_meter_new (b, &rates);
    sbx_msg_t *created = sbx_msg_new (SBX_MSG_ACCOUNT_CREATED);
    sbx_str_set (&sbx_msg_account_created (created)->account_id, "acc_1");
    sbx_str_set (&sbx_msg_account_created (created)->email, "a@example.com");
    sbx_str_set (&sbx_msg_account_created (created)->plan, "free");
    sbx_msg_t *ready = s_changed ("sb_1", SBX_SANDBOX_STATE_READY);
    sbx_msg_t *stopped = s_changed ("sb_1", SBX_SANDBOX_STATE_STOPPED);
    assert (s_apply (ma, 1, 1000, "acc_1", created) == 0);
    assert (s_apply (mb, 1, 1000, "acc_1", created) == 0);
    assert (s_apply (mb, 2, 2000, "acc_1", ready) == 0);
    assert (s_apply (ma, 2, 2000, "acc_1", ready) == 0);
    assert (s_apply (ma, 3, 12000, "acc_1", stopped) == 0);
    assert (s_apply (mb, 3, 12000, "acc_1", stopped) == 0);
    assert (bill_store_last_seq (a) == 3 && bill_store_last_seq (b) == 3);
    assert (s_charged_ms (a, "acc_1") == 10000); //  10 s, once

    //  The leader stops between two events: the next one is applied on the new leader,
    //  after the store finds it (a failure in between is the caller's to retry).
    int leader = sbx_testcluster_leader (cluster);
    sbx_testcluster_stop (cluster, leader);
    int tries = 0, rc;
    while ((rc = s_apply (ma, 4, 20000, "acc_1", ready)) != 0) {
        assert (++tries < 50);
        usleep (100 * 1000);
    }
    assert (s_apply (mb, 4, 20000, "acc_1", ready) == 0); //  found applied
    assert (s_apply (ma, 5, 25000, "acc_1", stopped) == 0);
    assert (bill_store_last_seq (b) == 5 && s_charged_ms (b, "acc_1") == 15000);

    sbx_msg_destroy (&created);
    sbx_msg_destroy (&ready);
    sbx_msg_destroy (&stopped);
    bill_meter_destroy (&ma);
    bill_meter_destroy (&mb);
    bill_store_destroy (&a);
    bill_store_destroy (&b);
    sbx_testcluster_destroy (&cluster);
}
