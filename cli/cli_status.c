/*  cli_status - `sbx status`: what runs and where clients connect. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"
#include "sbx_urls.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>

char *cli_base_url (sbx_config_t *config)
{
    return sbx_urls_base (config);
}

char *cli_ca_cert (sbx_config_t *config)
{
    if (streq (sbx_config_get (config, "tls", "on"), "off") ||
        sbx_config_get (config, "tls.cert", NULL))
        return NULL;
    return sbx_config_path (config, "tls/ca.crt");
}

static bool s_alive (json_int_t pid)
{
    return pid > 0 && (kill ((pid_t) pid, 0) == 0 || errno == EPERM);
}

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx status [--data-dir DIR] [--json]\n\n"
                  "Shows whether `sbx up` runs for this data directory, each daemon's pid and\n"
                  "readiness, the workers connected to the broker, and where clients connect.\n"
                  "--json prints {\"running\",\"mcp_url\",\"rest_url\",\"ca_cert\",\"data_dir\",\n"
                  "\"metrics_url\" (Prometheus, null with metrics.listen = off; no token: its\n"
                  "address is its access control, docs/metrics.md),\n"
                  "\"daemons\":[{\"name\",\"pid\",\"ready\",\"state\",\"restarts\",\"log\"}],"
                  "\"peers\":[...]}; on a cluster's host also \"cluster\":{\"leader\",\n"
                  "\"nodes\":[{\"id\",\"address\",\"role\",\"broker\",\"state\"}],\n"
                  "\"hosts\":[{\"name\",\"roles\",\"last_seen_ms_ago\"}]} (docs/operations.md).\n"
                  "Exit code 0 when sbx up runs and every daemon is ready, 1 otherwise.\n");
}

//  Where the gateway serves Prometheus metrics (metrics.listen), or NULL: off, or port 0
//  (a port chosen at start, which only the gateway's log says). A wildcard address is
//  reached on loopback.
static char *s_metrics_url (sbx_config_t *config)
{
    const char *listen = sbx_config_get (config, "metrics.listen", "off");
    const char *colon = strrchr (listen, ':');
    if (streq (listen, "off") || !colon || streq (colon, ":0"))
        return NULL;
    char host[256];
    snprintf (host, sizeof host, "%.*s", (int) (colon - listen), listen);
    const char *reach = streq (host, "0.0.0.0") ? "127.0.0.1"
                        : streq (host, "[::]")  ? "[::1]"
                                                : host;
    return zsys_sprintf ("http://%s%s/metrics", reach, colon);
}

//  The profile in use (cli_profile) and what its service says to its key, or NULL.
static json_t *s_profile (void)
{
    char why[1200];
    cli_profile_t *profile = cli_profile_load (why, sizeof why);
    if (!profile)
        return *why ? json_pack ("{s:s}", "state", why) : NULL;
    json_t *out = json_pack ("{s:s, s:s}", "url", profile->url, "from", profile->from);
    cli_rest_t *rest = cli_rest_new (profile);
    json_t *usage = NULL;
    sbx_err_t err;
    if (rest &&
        cli_rest_call (rest, SBX_OP_GET_USAGE, NULL, NULL, 0, &usage, NULL, NULL, &err) == 0) {
        json_object_set (out, "account", json_object_get (usage, "accountId"));
        json_object_set_new (
            out, "state",
            json_sprintf ("reachable, account %s",
                          json_string_value (json_object_get (usage, "accountId"))));
    } else
        json_object_set_new (out, "state",
                             json_sprintf ("%s (%s)", rest ? err.message : "out of memory",
                                           rest ? sbx_code_name (err.code) : "internal"));
    json_decref (usage);
    cli_rest_destroy (&rest);
    cli_profile_destroy (&profile);
    return out;
}

//  A cluster's view: every control node (its dqlite membership, its broker's own word:
//  leader, standby or unreachable), which one leads, and every host with the roles its
//  workers play and how long ago the leader heard from each.
static json_t *s_cluster (sbx_config_t *config, json_t *peers)
{
    json_t *out = json_object ();
    json_t *nodes = json_array ();
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_CLUSTER_NODES);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 3000, &err);
    if (!reply)
        json_object_set_new (out, "error", json_string (err.message));
    sbx_cluster_nodes_ok_t *ok = reply ? sbx_msg_cluster_nodes_ok (reply) : NULL;
    json_object_set_new (out, "leader", ok && ok->leader ? json_string (ok->leader) : json_null ());
    for (size_t i = 0; ok && i < ok->nodes.count; i++) {
        sbx_control_node_t *node = &ok->nodes.items[i];
        //  Its broker, as it answers itself (a second at most).
        const char *colon = strrchr (node->address, ':');
        char *endpoint = colon ? zsys_sprintf ("tcp://%.*s:%ld", (int) (colon - node->address),
                                               node->address, strtol (colon + 1, NULL, 10) + 1)
                               : NULL;
        char state[16] = "unreachable";
        if (endpoint) {
            sbx_config_t *one = sbx_config_new (sbx_config_data_dir (config));
            sbx_config_set (one, "broker.endpoint", endpoint);
            sbx_msg_t *status = sbx_msg_new (SBX_MSG_SYS_STATUS);
            sbx_msg_t *answer = one ? cli_call (one, &status, 1000, &err) : NULL;
            sbx_msg_destroy (&status);
            const char *said = answer && answer->type == SBX_MSG_SYS_STATUS_OK
                                   ? sbx_msg_sys_status_ok (answer)->control
                                   : NULL;
            if (answer && answer->type == SBX_MSG_SYS_STATUS_OK)
                snprintf (state, sizeof state, "%s", said ? said : "leader");
            sbx_msg_destroy (&answer);
            sbx_config_destroy (&one);
        }
        json_array_append_new (nodes,
                               json_pack ("{s:I, s:s, s:s, s:s?, s:s}", "id", (json_int_t) node->id,
                                          "address", node->address, "role", node->role, "broker",
                                          endpoint, "state", state));
        zstr_free (&endpoint);
    }
    sbx_msg_destroy (&reply);
    json_object_set_new (out, "nodes", nodes);
    //  Hosts: the workers connected now, by instance (a host's name).
    json_t *hosts = json_object ();
    json_t *peer;
    size_t i;
    json_array_foreach (peers, i, peer)
    {
        const char *name = json_string_value (json_object_get (peer, "instance"));
        json_t *host = json_object_get (hosts, name);
        if (!host) {
            host = json_pack ("{s:s, s:[], s:I}", "name", name, "roles", "last_seen_ms_ago",
                              (json_int_t) 0);
            json_object_set_new (hosts, name, host);
        }
        json_array_append (json_object_get (host, "roles"), json_object_get (peer, "role"));
        json_int_t ago = json_integer_value (json_object_get (peer, "last_seen_ms_ago"));
        if (ago > json_integer_value (json_object_get (host, "last_seen_ms_ago")))
            json_object_set_new (host, "last_seen_ms_ago", json_integer (ago));
    }
    json_t *list = json_array ();
    const char *key;
    json_t *host;
    json_object_foreach (hosts, key, host) json_array_append (list, host);
    json_decref (hosts);
    json_object_set_new (out, "hosts", list);
    return out;
}

int cli_status_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    char *base = cli_base_url (config);
    char *ca = cli_ca_cert (config);
    char *status_path = sbx_config_path (config, "run/up.json");
    json_t *status = json_load_file (status_path, 0, NULL);
    free (status_path);

    json_t *out = json_object ();
    bool running =
        status && s_alive (json_integer_value (json_object_get (status, "supervisor_pid")));
    bool all_ready = running;
    json_object_set_new (out, "running", json_boolean (running));
    json_object_set_new (out, "data_dir", json_string (sbx_config_data_dir (config)));
    json_object_set_new (out, "mcp_url", json_sprintf ("%s/mcp", base));
    json_object_set_new (out, "rest_url", json_sprintf ("%s/v1", base));
    json_object_set_new (out, "ca_cert", ca ? json_string (ca) : json_null ());
    char *metrics = s_metrics_url (config);
    json_object_set_new (out, "metrics_url", metrics ? json_string (metrics) : json_null ());
    json_t *daemons = json_array ();
    json_t *entry;
    size_t i;
    json_array_foreach (json_object_get (status, "daemons"), i, entry)
    {
        json_int_t pid = json_integer_value (json_object_get (entry, "pid"));
        bool alive = running && s_alive (pid);
        bool ready = alive && json_is_true (json_object_get (entry, "ready"));
        all_ready = all_ready && ready;
        json_array_append_new (
            daemons,
            json_pack ("{s:O, s:o, s:b, s:O, s:O, s:O}", "name", json_object_get (entry, "name"),
                       "pid", alive ? json_integer (pid) : json_null (), "ready", ready, "state",
                       json_object_get (entry, "state"), "restarts",
                       json_object_get (entry, "restarts"), "log", json_object_get (entry, "log")));
    }
    if (json_array_size (daemons) == 0)
        all_ready = false;
    json_object_set_new (out, "daemons", daemons);

    //  The broker's own view, when it answers quickly. On a cluster's host it is the
    //  leader's, wherever it runs: sbx up need not run here.
    json_t *peers = json_array ();
    uint64_t now = sbx_clock_now_ms ();
    const char *nodes = sbx_config_get (config, "control.nodes", NULL);
    bool cluster = nodes && *nodes;
    if (running || cluster) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_BROKER_PEERS);
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, 2000, &err);
        if (reply) {
            sbx_broker_peers_ok_t *ok = sbx_msg_broker_peers_ok (reply);
            for (size_t p = 0; p < ok->peers.count; p++) {
                sbx_peer_info_t *peer = &ok->peers.items[p];
                json_array_append_new (
                    peers,
                    json_pack ("{s:s, s:s, s:I, s:I, s:I, s:I}", "role", sbx_role_name (peer->role),
                               "instance", peer->instance, "pid", (json_int_t) peer->pid,
                               "capacity", (json_int_t) peer->capacity, "used",
                               (json_int_t) peer->used, "last_seen_ms_ago",
                               (json_int_t) (peer->last_seen_ms && now > peer->last_seen_ms
                                                 ? now - peer->last_seen_ms
                                                 : 0)));
            }
            json_object_set_new (out, "last_seq", json_integer ((json_int_t) ok->last_seq));
            sbx_msg_destroy (&reply);
        }
    }
    json_object_set_new (out, "peers", peers);
    if (cluster) {
        json_t *view = s_cluster (config, peers);
        json_object_set_new (out, "cluster", view);
        all_ready = all_ready && json_is_string (json_object_get (view, "leader"));
    }
    //  What the CLI uses away from the host (sbx login, SBX_URL): whether it answers.
    json_t *profile = data_dir ? NULL : s_profile ();
    if (profile)
        json_object_set_new (out, "profile", profile);

    if (as_json) {
        char *text = json_dumps (out, JSON_INDENT (2) | JSON_PRESERVE_ORDER);
        printf ("%s\n", text);
        free (text);
    } else {
        printf ("sbx %s (data dir %s)\n", running ? "is up" : "is not running here",
                sbx_config_data_dir (config));
        printf ("  MCP endpoint:   %s/mcp\n  REST API:       %s/v1\n  CA certificate: %s\n", base,
                base, ca ? ca : "(none)");
        printf ("  metrics:        %s\n", metrics ? metrics : "off (metrics.listen)");
        if (profile)
            printf ("  profile:        %s (%s): %s\n",
                    json_string_value (json_object_get (profile, "url")),
                    json_string_value (json_object_get (profile, "from")),
                    json_string_value (json_object_get (profile, "state")));
        json_t *view = json_object_get (out, "cluster");
        if (view) {
            printf ("  cluster:        leader %s\n",
                    json_string_value (json_object_get (view, "leader"))
                        ? json_string_value (json_object_get (view, "leader"))
                        : "(none: no quorum, or no control node answers)");
            json_t *node;
            size_t n;
            json_array_foreach (json_object_get (view, "nodes"), n, node) printf (
                "    node %-24s %-8s %s\n", json_string_value (json_object_get (node, "address")),
                json_string_value (json_object_get (node, "role")),
                json_string_value (json_object_get (node, "state")));
            json_array_foreach (json_object_get (view, "hosts"), n, node)
            {
                char roles[256] = "";
                json_t *role;
                size_t r;
                json_array_foreach (json_object_get (node, "roles"), r, role)
                    snprintf (roles + strlen (roles), sizeof roles - strlen (roles), "%s%s",
                              r ? "," : "", json_string_value (role));
                printf (
                    "    host %-24s %-36s heard %lld ms ago\n",
                    json_string_value (json_object_get (node, "name")), roles,
                    (long long) json_integer_value (json_object_get (node, "last_seen_ms_ago")));
            }
        }
        json_array_foreach (json_object_get (out, "daemons"), i, entry)
        {
            char pid[32] = "-";
            if (json_is_integer (json_object_get (entry, "pid")))
                snprintf (pid, sizeof pid, "%lld",
                          (long long) json_integer_value (json_object_get (entry, "pid")));
            printf ("  %-14s %-9s pid %-8s restarts %lld\n",
                    json_string_value (json_object_get (entry, "name")),
                    json_string_value (json_object_get (entry, "state")), pid,
                    (long long) json_integer_value (json_object_get (entry, "restarts")));
        }
    }
    json_decref (out);
    json_decref (status);
    free (base);
    free (ca);
    zstr_free (&metrics);
    sbx_config_destroy (&config);
    return all_ready ? 0 : 1;
}
