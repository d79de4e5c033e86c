/*  brk_control_test - three control nodes of one cluster, each a brk_control actor with
    its own data directory, dqlite node and broker endpoint, in this process: one leads
    and serves, the others stand by; an account made through the leader is there after
    the leader stops (handing over) and after the next one is cut off without a word;
    a stopped node comes back, as a follower, with its data.
*/
#include "brk_control.h"
#include "brk_server.h"
#include "brk_testkit.h"
#include "sbx_dqlite.h"
#include "sbx_dqproxy.h"
#include "sbx_testcluster.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define S_NODES 3

typedef struct {
    char dir[48];
    char address[64];
    sbx_config_t *config;
    zactor_t *actor;
    zsock_t *client;
} s_node_t;

static void s_start (s_node_t *node)
{
    node->actor = zactor_new (brk_control_actor, node->config);
    char *status = zstr_recv (node->actor);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    node->client = brk_testkit_dealer (node->config);
}

static void s_stop (s_node_t *node)
{
    zsock_destroy (&node->client);
    zactor_destroy (&node->actor);
}

//  What a node's broker answers a status: 1 leads, 0 stands by, -1 nothing in time.
static int s_leads (s_node_t *node, uint64_t rid)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_STATUS);
    request->rid = rid;
    brk_testkit_send (node->client, &request);
    sbx_msg_t *reply;
    while ((reply = brk_testkit_recv (node->client, 1000))) {
        if (reply->rid == rid)
            break;
        sbx_msg_destroy (&reply);
    }
    if (!reply)
        return -1;
    assert (reply->type == SBX_MSG_SYS_STATUS_OK);
    sbx_sys_status_ok_t *status = sbx_msg_sys_status_ok (reply);
    assert (status->control && status->node && streq (status->node, node->address));
    int leads = streq (status->control, "leader") ? 1 : 0;
    sbx_msg_destroy (&reply);
    return leads;
}

//  The node that serves, waiting up to 10 s for one; asserts the others stand by.
static int s_leader (s_node_t *nodes, uint64_t *rid)
{
    for (int tries = 0; tries < 100; tries++) {
        int leader = -1, standing = 0;
        for (int i = 0; i < S_NODES; i++) {
            if (!nodes[i].actor)
                continue;
            int leads = s_leads (&nodes[i], ++*rid);
            if (leads == 1) {
                assert (leader < 0); //  never two
                leader = i;
            } else if (leads == 0)
                standing++;
        }
        if (leader >= 0)
            return leader;
        zclock_sleep (100);
    }
    return -1;
}

//  Whether every running node's keys/allowed/<name>.cert holds public_key (NULL: has
//  no such file), within 10 s.
static bool s_allowed_everywhere (s_node_t *nodes, const char *name, const char *public_key)
{
    for (int tries = 0; tries < 100; tries++) {
        int good = 0, running = 0;
        for (int i = 0; i < S_NODES; i++) {
            if (!nodes[i].actor)
                continue;
            running++;
            char *path = zsys_sprintf ("%s/keys/allowed/%s.cert", nodes[i].dir, name);
            zcert_t *cert = zcert_load (path);
            if (public_key ? cert && streq (zcert_public_txt (cert), public_key) : !cert)
                good++;
            zcert_destroy (&cert);
            zstr_free (&path);
        }
        if (good == running)
            return true;
        zclock_sleep (100);
    }
    return false;
}

//  A connection to the cluster's leader through a node (NULL if none answers).
static sbx_dqlite_t *s_dqlite (s_node_t *node, sbx_dqproxy_t **proxy)
{
    char *path = zsys_sprintf ("%s/keys/cluster.key", node->dir);
    unsigned char key[SBX_DQPROXY_KEY_SIZE];
    assert (path && sbx_dqproxy_key_load (path, false, key) == 0);
    zstr_free (&path);
    *proxy = sbx_dqproxy_new (key, sizeof key);
    assert (*proxy);
    const char *addresses[] = {node->address};
    return sbx_dqlite_connect_leader (addresses, 1, 2000, sbx_dqproxy_dial, *proxy);
}

//  Sets the control database's schema version row beyond this broker's (version), or
//  drops it again (0), through the leader.
static void s_schema_bump (s_node_t *node, int version)
{
    sbx_dqproxy_t *proxy = NULL;
    sbx_dqlite_t *client = NULL;
    for (int tries = 0; tries < 100 && !client; tries++) {
        client = s_dqlite (node, &proxy);
        if (!client) {
            sbx_dqproxy_destroy (&proxy);
            zclock_sleep (100);
        }
    }
    assert (client && sbx_dqlite_open (client, "control") == 0);
    char *sql = version ? zsys_sprintf ("INSERT INTO schema_version VALUES (%d, 0)", version)
                        : zsys_sprintf ("DELETE FROM schema_version WHERE version = 99");
    sbx_dqlite_result_t result;
    assert (sql && sbx_dqlite_exec_sql (client, sql, &result) == 0);
    zstr_free (&sql);
    sbx_dqlite_destroy (&client);
    sbx_dqproxy_destroy (&proxy);
}

void brk_control_test (bool verbose)
{
    sbx_log_init ("brk_control_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    s_node_t nodes[S_NODES];
    char first[sizeof ((s_node_t *) 0)->address] = "";
    for (int i = 0; i < S_NODES; i++) {
        s_node_t *node = &nodes[i];
        memset (node, 0, sizeof *node);
        snprintf (node->dir, sizeof node->dir, "/tmp/brk_control_test.XXXXXX");
        assert (mkdtemp (node->dir));
        snprintf (node->address, sizeof node->address, "127.0.0.1:%d",
                  sbx_testcluster_free_port ());
        node->config = sbx_config_new (node->dir);
        assert (node->config);
        sbx_config_set (node->config, "heartbeat_ms", "100");
        sbx_config_set (node->config, "control.address", node->address);
        sbx_config_set (node->config, "control.latency_ms", "15");
        //  One process: its brokers on ipc:// (CURVE's authenticator is one a process).
        char *endpoint = zsys_sprintf ("ipc://%s/run/broker.sock", node->dir);
        char *tap = zsys_sprintf ("ipc://%s/run/tap.sock", node->dir);
        sbx_config_set (node->config, "broker.endpoint", endpoint);
        sbx_config_set (node->config, "broker.bind", endpoint);
        sbx_config_set (node->config, "tap.endpoint", tap);
        sbx_config_set (node->config, "tap.bind", tap);
        zstr_free (&endpoint);
        zstr_free (&tap);
        if (i == 0)
            memcpy (first, node->address, sizeof first);
        else {
            sbx_config_set (node->config, "control.join", first);
            //  The cluster's key, as a join token hands it over.
            char *command =
                zsys_sprintf ("cp %s/keys/cluster.key %s/keys/", nodes[0].dir, node->dir);
            assert (command && system (command) == 0);
            zstr_free (&command);
        }
        if (i == 0) {
            //  The first node was one machine before (sbx cluster init): an account and
            //  the events of its making, in its own control.db.
            sbx_config_t *alone = sbx_config_new (node->dir);
            sbx_config_set (alone, "heartbeat_ms", "100");
            zactor_t *broker = zactor_new (brk_server_actor, alone);
            char *status = zstr_recv (broker);
            assert (status && streq (status, "READY"));
            zstr_free (&status);
            zsock_t *client = brk_testkit_dealer (alone);
            char *old = brk_testkit_account (client, "old@example.com", 1);
            free (old);
            zsock_destroy (&client);
            zactor_destroy (&broker);
            sbx_config_destroy (&alone);
        }
        assert (brk_control_enabled (node->config));
        s_start (node);
    }
    uint64_t rid = 1000;
    int leader = s_leader (nodes, &rid);
    assert (leader >= 0); //  the first node, usually; under load an election may move it

    //  What the first node had as one machine is the cluster's now; its file set aside.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, "old@example.com");
    sbx_msg_t *reply = brk_testkit_call (nodes[leader].client, request, ++rid);
    assert (reply->type == SBX_MSG_ACCOUNT_GET_OK);
    sbx_msg_destroy (&reply);
    char *aside = zsys_sprintf ("%s/broker/control.db.imported", nodes[0].dir);
    char *gone = zsys_sprintf ("%s/broker/control.db", nodes[0].dir);
    assert (access (aside, F_OK) == 0 && access (gone, F_OK) != 0);
    zstr_free (&aside);
    zstr_free (&gone);

    //  Anything but a status sent to a node that stands by: peer.standby, same rid.
    int standby = leader == 0 ? 1 : 0;
    request = sbx_msg_new (SBX_MSG_ACCOUNT_LIST);
    reply = brk_testkit_call (nodes[standby].client, request, ++rid);
    assert (reply->type == SBX_MSG_PEER_STANDBY);
    assert (streq (sbx_msg_peer_standby (reply)->node, nodes[standby].address));
    assert (streq (sbx_msg_peer_standby (reply)->leader, nodes[leader].address));
    sbx_msg_destroy (&reply);

    //  A join token admits a host: its key reaches every node's keys/allowed, standbys
    //  too; removed, it leaves them all. The cluster's members, as its leader says.
    request = sbx_msg_new (SBX_MSG_CLUSTER_TOKEN);
    sbx_str_set (&sbx_msg_cluster_token (request)->name, "gw-9");
    sbx_strlist_append (&sbx_msg_cluster_token (request)->roles, "gateway");
    reply = brk_testkit_call (nodes[leader].client, request, ++rid);
    assert (reply->type == SBX_MSG_CLUSTER_TOKEN_OK);
    sbx_cluster_token_ok_t *token = sbx_msg_cluster_token_ok (reply);
    assert (strlen (token->secret_key) == 40 && token->nodes.count == S_NODES);
    assert (token->host->roles.count == 1 && streq (token->host->roles.items[0], "gateway"));
    char public_key[41];
    snprintf (public_key, sizeof public_key, "%s", token->host->public_key);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_CLUSTER_TOKEN);
    sbx_str_set (&sbx_msg_cluster_token (request)->name, "gw-9");
    reply = brk_testkit_call (nodes[leader].client, request, ++rid);
    assert (brk_testkit_code (reply) == SBX_E_CONFLICT);
    sbx_msg_destroy (&reply);
    assert (s_allowed_everywhere (nodes, "host-gw-9", public_key));
    reply = brk_testkit_call (nodes[leader].client, sbx_msg_new (SBX_MSG_CLUSTER_NODES), ++rid);
    assert (reply->type == SBX_MSG_CLUSTER_NODES_OK);
    assert (sbx_msg_cluster_nodes_ok (reply)->nodes.count == S_NODES);
    assert (streq (sbx_msg_cluster_nodes_ok (reply)->leader, nodes[leader].address));
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_HOST_REMOVE);
    sbx_str_set (&sbx_msg_host_remove (request)->name, "gw-9");
    reply = brk_testkit_call (nodes[leader].client, request, ++rid);
    assert (reply->type == SBX_MSG_HOST_REMOVE_OK &&
            sbx_msg_host_remove_ok (reply)->host->removed_ms);
    sbx_msg_destroy (&reply);
    assert (s_allowed_everywhere (nodes, "host-gw-9", NULL));

    //  The leader serves: an account is made, on the cluster's database.
    char *account = brk_testkit_account (nodes[leader].client, "a@example.com", ++rid);
    assert (account);

    //  The leader stops (handing over): another serves, with the account.
    s_stop (&nodes[leader]);
    int next = s_leader (nodes, &rid);
    assert (next >= 0 && next != leader);
    request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, "a@example.com");
    reply = brk_testkit_call (nodes[next].client, request, ++rid);
    assert (reply->type == SBX_MSG_ACCOUNT_GET_OK);
    assert (streq (sbx_msg_account_get_ok (reply)->account->account_id, account));
    sbx_msg_destroy (&reply);

    //  It comes back: a follower, with its data; the one leading now stops too: the third
    //  serves, both accounts and all.
    s_start (&nodes[leader]);
    char *second = brk_testkit_account (nodes[next].client, "b@example.com", ++rid);
    assert (second);
    s_stop (&nodes[next]);
    int third = s_leader (nodes, &rid);
    assert (third >= 0 && third != next);
    request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, "b@example.com");
    reply = brk_testkit_call (nodes[third].client, request, ++rid);
    assert (reply->type == SBX_MSG_ACCOUNT_GET_OK);
    sbx_msg_destroy (&reply);

    //  The stopped node, lost for good: taken out of the cluster; the others go on.
    request = sbx_msg_new (SBX_MSG_CLUSTER_REMOVE);
    sbx_str_set (&sbx_msg_cluster_remove (request)->address, nodes[next].address);
    reply = brk_testkit_call (nodes[third].client, request, ++rid);
    assert (reply->type == SBX_MSG_CLUSTER_NODES_OK);
    assert (sbx_msg_cluster_nodes_ok (reply)->nodes.count == S_NODES - 1);
    sbx_msg_destroy (&reply);
    request = sbx_msg_new (SBX_MSG_CLUSTER_REMOVE);
    sbx_str_set (&sbx_msg_cluster_remove (request)->address, "10.9.9.9:1");
    reply = brk_testkit_call (nodes[third].client, request, ++rid);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    char *third_account = brk_testkit_account (nodes[third].client, "c@example.com", ++rid);
    assert (third_account);
    free (third_account);

    //  A database a newer broker migrated (a rolling upgrade's old node elected): the
    //  leader's broker cannot start on it; it says why and stands by, and so does every
    //  node: nothing is served on a database it does not know. Back to a version this
    //  broker knows, one serves again.
    s_schema_bump (&nodes[third], 99);
    request = sbx_msg_new (SBX_MSG_ACCOUNT_LIST);
    reply = brk_testkit_call (nodes[third].client, request, ++rid);
    assert (reply->type == SBX_MSG_ACCOUNT_LIST_OK); //  the running broker goes on
    sbx_msg_destroy (&reply);
    s_stop (&nodes[third]); //  hands over to nodes[leader], whose broker cannot start
    s_start (&nodes[third]);
    int served = 0;
    for (int tries = 0; tries < 30; tries++) {
        served += s_leads (&nodes[leader], ++rid) == 1 || s_leads (&nodes[third], ++rid) == 1;
        zclock_sleep (100);
    }
    assert (served == 0);
    s_schema_bump (&nodes[third], 0);
    assert (s_leader (nodes, &rid) >= 0);

    free (account);
    free (second);
    for (int i = 0; i < S_NODES; i++) {
        s_stop (&nodes[i]);
        sbx_config_destroy (&nodes[i].config);
        char *command = zsys_sprintf ("rm -rf '%s'", nodes[i].dir);
        assert (command && system (command) == 0);
        zstr_free (&command);
    }
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
