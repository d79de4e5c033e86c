/*  cli_cluster - see cli_cluster.h */
#include "cli_cluster.h"
#include "cli_call.h"
#include "cli_commands.h"
#include "sbx_dqproxy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_TOKEN_PREFIX "sbxjoin1:"

static const char *s_all_roles[] = {"control", "gateway", "vmd", "snapshotd",
                                    "billing", "hooks",   NULL};

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx cluster init --address HOST:PORT [--data-dir DIR]\n"
                  "       sbx cluster token --name HOST [--roles LIST] [--data-dir DIR] [--json]\n"
                  "       sbx cluster nodes [--data-dir DIR] [--json]\n"
                  "       sbx cluster remove --address HOST:PORT [--data-dir DIR] [--json]\n\n"
                  "init: makes this data directory the first control node of a new cluster, at\n"
                  "HOST:PORT (its dqlite node behind TLS there; its broker at PORT+1, its tap at\n"
                  "PORT+2). Run it while sbx up is stopped; at the next sbx up the broker and\n"
                  "billing copy what this machine had (accounts, keys, sandboxes, the event log,\n"
                  "the ledger) into the cluster's replicated databases, once.\n"
                  "token: admits a new host named HOST for LIST (control, gateway, vmd,\n"
                  "snapshotd, billing, hooks; default all) and prints the token that joins it:\n"
                  "`sbx up --join TOKEN [--address HOST:PORT]` there (--address for a control\n"
                  "node). The token is a secret; `sbx host remove HOST` takes the host out again.\n"
                  "nodes: the control nodes and which one leads.\n"
                  "remove: takes a control node out of the cluster (stop its sbx up first when\n"
                  "its host is lost for good; a majority of the voters must answer).\n"
                  "Several hosts: docs/operations.md.\n");
}

static bool s_hostport (const char *value, int room)
{
    const char *colon = value ? strrchr (value, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol (colon + 1, &end, 10) : 0;
    return colon && colon != value && end && !*end && port > 0 && port + room <= 65535 &&
           strlen (value) < 200;
}

//  The host part of address (HOST, HOST:PORT or [V6]:PORT) into out; false when there is
//  none or it will not do (letters, digits, '.', '-', ':' only).
static bool s_host_of (const char *address, char *out, size_t size)
{
    if (!address || !*address || strlen (address) >= size)
        return false;
    const char *start = address, *end = address + strlen (address);
    if (*start == '[') {
        const char *close = strchr (start, ']');
        if (!close || (close[1] && close[1] != ':'))
            return false;
        start++;
        end = close;
    } else if (strchr (address, ':') == strrchr (address, ':') && strchr (address, ':'))
        end = strchr (address, ':'); //  HOST:PORT (one colon; more: a bare IPv6 address)
    if (end == start)
        return false;
    for (const char *c = start; c < end; c++)
        if (!isalnum ((unsigned char) *c) && !strchr (".-:", *c))
            return false;
    bool v6 = strchr (start, ':') && strchr (start, ':') < end;
    snprintf (out, size, v6 ? "[%.*s]" : "%.*s", (int) (end - start), start);
    return true;
}

//  A role list (comma-separated) whose items are all roles, each once; into out.
static int s_roles (const char *list, char *out, size_t size, char *why, size_t why_size)
{
    *out = 0;
    char copy[256];
    snprintf (copy, sizeof copy, "%s", list ? list : "");
    for (char *save = NULL, *item = strtok_r (copy, ", ", &save); item;
         item = strtok_r (NULL, ", ", &save)) {
        bool known = false;
        for (const char **role = s_all_roles; *role; role++)
            known |= streq (*role, item);
        if (!known) {
            snprintf (why, why_size,
                      "'%s' is not a role: control, gateway, vmd, snapshotd, billing, hooks", item);
            return -1;
        }
        char padded[80];
        snprintf (padded, sizeof padded, ",%s,", item);
        char within[300];
        snprintf (within, sizeof within, ",%s,", out);
        if (!strstr (within, padded))
            snprintf (out + strlen (out), size - strlen (out), "%s%s", *out ? "," : "", item);
    }
    return 0;
}

static char *s_read_text (const char *path)
{
    FILE *file = fopen (path, "r");
    if (!file)
        return NULL;
    char line[256] = "";
    char *got = fgets (line, sizeof line, file);
    fclose (file);
    if (!got)
        return NULL;
    line[strcspn (line, "\r\n")] = 0;
    return strdup (line);
}

//  --------------------------------------------------------------------------
//  init

static int s_init (sbx_config_t *config, const char *address)
{
    if (!s_hostport (address, 2)) {
        fprintf (stderr, "sbx cluster init: --address takes HOST:PORT, a port from 1 to 65533 "
                         "(its broker takes PORT+1, its tap PORT+2), e.g. 10.0.0.1:7000\n");
        return 2;
    }
    const char *already = sbx_config_get (config, "control.address", NULL);
    if (already && *already) {
        fprintf (stderr,
                 "sbx cluster init: %s is already control node %s of a cluster (its sbx.conf "
                 "says so); nothing was changed\n",
                 sbx_config_data_dir (config), already);
        return 1;
    }
    char *lock_path = sbx_config_path (config, "run/up.lock");
    int lock = lock_path ? open (lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    free (lock_path);
    if (lock < 0 || flock (lock, LOCK_EX | LOCK_NB)) {
        fprintf (stderr,
                 "sbx cluster init: sbx up runs for %s: stop it first (sbx down, or Ctrl-C), "
                 "then init, then sbx up again; nothing was changed\n",
                 sbx_config_data_dir (config));
        if (lock >= 0)
            close (lock);
        return 1;
    }
    sbx_config_set (config, "control.address", address);
    sbx_config_set (config, "control.nodes", address);
    int rc = sbx_config_save (config);
    close (lock);
    if (rc) {
        fprintf (stderr, "sbx cluster init: cannot write %s/sbx.conf: %s\n",
                 sbx_config_data_dir (config), strerror (errno));
        return 1;
    }
    char *db = sbx_config_path (config, "broker/control.db");
    bool had = db && access (db, F_OK) == 0;
    free (db);
    printf ("%s is now the first control node of a cluster, at %s\n"
            "  broker:  %s\n"
            "  tap:     %s\n"
            "%s"
            "next:\n"
            "  sbx up --data-dir %s       (starts the cluster, as its only node)\n"
            "  sbx cluster token --name HOST --roles control,billing   (for each new host;\n"
            "                             then on it: sbx up --join TOKEN --address HOST:PORT)\n"
            "A cluster of 3 or 5 control nodes survives the loss of 1 or 2 (docs/operations.md).\n",
            sbx_config_data_dir (config), address, sbx_config_get (config, "broker.bind", ""),
            sbx_config_get (config, "tap.bind", ""),
            had ? "  data:    this machine's accounts, sandboxes, event log and ledger are "
                  "copied into\n           the cluster at the next sbx up\n"
                : "",
            sbx_config_data_dir (config));
    return 0;
}

//  --------------------------------------------------------------------------
//  token

//  The token for what the broker answered and this member holds. NULL with why.
static char *s_token (sbx_config_t *config, sbx_cluster_token_ok_t *ok, char *why, size_t why_size)
{
    bool control = false, billing = false;
    json_t *roles = json_array ();
    for (size_t i = 0; i < ok->host->roles.count; i++) {
        control |= streq (ok->host->roles.items[i], "control");
        //  billing and snapshotd keep their data in the cluster's database too.
        billing |= streq (ok->host->roles.items[i], "billing") ||
                   streq (ok->host->roles.items[i], "snapshotd");
        json_array_append_new (roles, json_string (ok->host->roles.items[i]));
    }
    json_t *nodes = json_array ();
    for (size_t i = 0; i < ok->nodes.count; i++)
        json_array_append_new (nodes, json_string (ok->nodes.items[i]));
    char *broker_cert = sbx_config_path (config, "keys/broker.cert");
    zcert_t *broker = broker_cert ? zcert_load (broker_cert) : NULL;
    free (broker_cert);
    json_t *token =
        json_pack ("{s:i, s:s, s:o, s:o, s:s, s:s, s:s}", "v", 1, "name", ok->host->name, "roles",
                   roles, "nodes", nodes, "public", ok->host->public_key, "secret", ok->secret_key,
                   "broker_public", broker ? zcert_public_txt (broker) : "");
    char *text = NULL;
    if (!broker)
        snprintf (why, why_size,
                  "no broker key pair in %s/keys (run this on a control node of the cluster)",
                  sbx_config_data_dir (config));
    else if (control || billing) {
        //  The dqlite cluster's TLS key; a control node also serves as the broker.
        char *key_path = sbx_config_path (config, "keys/cluster.key");
        char *key = key_path ? s_read_text (key_path) : NULL;
        free (key_path);
        if (!key)
            snprintf (why, why_size, "no cluster key in %s/keys (run this on a control node)",
                      sbx_config_data_dir (config));
        else {
            json_object_set_new (token, "cluster_key", json_string (key));
            if (control)
                json_object_set_new (token, "broker_secret",
                                     json_string (zcert_secret_txt (broker)));
        }
        free (key);
        if (!json_object_get (token, "cluster_key"))
            goto done;
    }
    char *body = json_dumps (token, JSON_COMPACT);
    char *encoded = body ? sbx_secret_base64 ((const uint8_t *) body, strlen (body)) : NULL;
    if (encoded && asprintf (&text, "%s%s", S_TOKEN_PREFIX, encoded) < 0)
        text = NULL;
    if (body)
        sbx_secret_wipe (body);
    free (body);
    free (encoded);
done:
    zcert_destroy (&broker);
    json_decref (token);
    return text;
}

static int s_token_main (sbx_config_t *config, const char *name, const char *roles, bool json)
{
    char list[256], why[512];
    if (!name) {
        fprintf (stderr, "sbx cluster token: --name HOST is required (the new host's name)\n");
        return 2;
    }
    if (s_roles (roles ? roles : "control,gateway,vmd,snapshotd,billing,hooks", list, sizeof list,
                 why, sizeof why)) {
        fprintf (stderr, "sbx cluster token: %s\n", why);
        return 2;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_CLUSTER_TOKEN);
    sbx_str_set (&sbx_msg_cluster_token (request)->name, name);
    char copy[256];
    snprintf (copy, sizeof copy, "%s", list);
    for (char *save = NULL, *item = strtok_r (copy, ",", &save); item;
         item = strtok_r (NULL, ",", &save))
        sbx_strlist_append (&sbx_msg_cluster_token (request)->roles, item);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 10000, &err);
    if (!reply)
        return cli_fail (&err);
    char *token = s_token (config, sbx_msg_cluster_token_ok (reply), why, sizeof why);
    sbx_msg_destroy (&reply);
    if (!token) {
        fprintf (stderr, "sbx cluster token: %s (the host was admitted: sbx host remove %s)\n", why,
                 name);
        return 1;
    }
    if (json)
        cli_print_json (json_pack ("{s:s, s:s, s:s}", "name", name, "roles", list, "token", token));
    else
        printf ("%s\n\nJoins host %s (%s): on it, as root,\n"
                "  sbx up --join TOKEN%s\n"
                "This token is a secret: it admits whoever holds it.\n",
                token, name, list,
                strstr (list, "control") ? " --address HOST:PORT   (its control node address)"
                                         : "");
    sbx_secret_wipe (token);
    free (token);
    return 0;
}

//  --------------------------------------------------------------------------
//  join

//  z85 text into 32 bytes.
static bool s_z85 (const char *text, byte *out)
{
    return text && strlen (text) == 40 && zmq_z85_decode (out, text) != NULL;
}

static int s_save_pair (sbx_config_t *config, const char *name, const char *public_txt,
                        const char *secret_txt)
{
    byte public_key[32], secret_key[32] = {0};
    if (!s_z85 (public_txt, public_key) || (secret_txt && !s_z85 (secret_txt, secret_key)))
        return -1;
    zcert_t *cert = zcert_new_from (public_key, secret_key);
    char relative[64];
    snprintf (relative, sizeof relative, "keys/%s.cert", name);
    char *path = sbx_config_path (config, relative);
    int rc =
        cert && path ? (secret_txt ? zcert_save (cert, path) : zcert_save_public (cert, path)) : -1;
    sbx_secret_wipe_bytes (secret_key, sizeof secret_key);
    zcert_destroy (&cert);
    free (path);
    return rc;
}

int cli_cluster_join (sbx_config_t *config, const char *token, const char *address,
                      const char *roles, char *why, size_t why_size)
{
    if (!token || strncmp (token, S_TOKEN_PREFIX, strlen (S_TOKEN_PREFIX)) != 0) {
        snprintf (why, why_size,
                  "not a join token (it starts %s): make one with `sbx cluster "
                  "token --name HOST` on a member",
                  S_TOKEN_PREFIX);
        return -1;
    }
    size_t size = 0;
    uint8_t *body = sbx_secret_base64_decode (token + strlen (S_TOKEN_PREFIX), &size);
    json_t *t = body ? json_loadb ((const char *) body, size, 0, NULL) : NULL;
    if (body)
        sbx_secret_wipe_bytes (body, size);
    free (body);
    const char *name = json_string_value (json_object_get (t, "name"));
    const char *public_txt = json_string_value (json_object_get (t, "public"));
    const char *secret_txt = json_string_value (json_object_get (t, "secret"));
    const char *broker_public = json_string_value (json_object_get (t, "broker_public"));
    const char *broker_secret = json_string_value (json_object_get (t, "broker_secret"));
    const char *cluster_key = json_string_value (json_object_get (t, "cluster_key"));
    json_t *nodes = json_object_get (t, "nodes");
    json_t *token_roles = json_object_get (t, "roles");
    int rc = -1;
    if (!t || json_integer_value (json_object_get (t, "v")) != 1 || !name || !public_txt ||
        !secret_txt || !broker_public || !json_is_array (nodes) || !json_array_size (nodes) ||
        !json_is_array (token_roles)) {
        snprintf (why, why_size, "the token is damaged or not of this sbx (make a new one)");
        goto done;
    }
    //  The roles: the token's, or a part of them.
    char granted[256] = "", chosen[256];
    for (size_t i = 0; i < json_array_size (token_roles); i++)
        snprintf (granted + strlen (granted), sizeof granted - strlen (granted), "%s%s",
                  *granted ? "," : "", json_string_value (json_array_get (token_roles, i)));
    if (s_roles (roles ? roles : granted, chosen, sizeof chosen, why, why_size))
        goto done;
    char within[300];
    snprintf (within, sizeof within, ",%s,", granted);
    char copy[256];
    snprintf (copy, sizeof copy, "%s", chosen);
    for (char *save = NULL, *item = strtok_r (copy, ",", &save); item;
         item = strtok_r (NULL, ",", &save)) {
        char padded[80];
        snprintf (padded, sizeof padded, ",%s,", item);
        if (!strstr (within, padded)) {
            snprintf (why, why_size, "the token admits %s for %s, not %s", name, granted, item);
            goto done;
        }
    }
    bool control = strstr (within, ",control,") && strstr (chosen, "control");
    //  billing and snapshotd keep their data in the cluster's database too.
    bool billing = strstr (chosen, "billing") != NULL || strstr (chosen, "snapshotd") != NULL;
    bool guests = strstr (chosen, "vmd") != NULL;
    char host[256] = "";
    if (address && !control && (!guests || !s_host_of (address, host, sizeof host))) {
        snprintf (why, why_size,
                  guests ? "--address takes this host's address on the cluster's network: HOST "
                           "or HOST:PORT"
                         : "--address is for a control node or a guest host (vmd), not %s",
                  chosen);
        goto done;
    }
    if (control && !s_hostport (address, 2)) {
        snprintf (why, why_size,
                  "a control node needs --address HOST:PORT: where this host's dqlite node is "
                  "reached by the others (its broker at PORT+1, its tap at PORT+2)");
        goto done;
    }
    if ((control && !broker_secret) || ((control || billing) && !cluster_key)) {
        snprintf (why, why_size,
                  "the token carries no keys for the control, billing or snapshotd role");
        goto done;
    }
    //  The keys: this host's pair, the brokers' public key (and secret, to be one), the
    //  cluster's TLS key.
    unsigned char key[SBX_DQPROXY_KEY_SIZE];
    if (s_save_pair (config, "client", public_txt, secret_txt) ||
        s_save_pair (config, "broker", broker_public, control ? broker_secret : NULL)) {
        snprintf (why, why_size, "cannot write the keys into %s/keys",
                  sbx_config_data_dir (config));
        goto done;
    }
    if (control || billing) {
        char *path = sbx_config_path (config, "keys/cluster.key");
        int fd = path ? open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
        bool written =
            fd >= 0 && strlen (cluster_key) == 2 * SBX_DQPROXY_KEY_SIZE &&
            write (fd, cluster_key, strlen (cluster_key)) == (ssize_t) strlen (cluster_key) &&
            write (fd, "\n", 1) == 1 && fsync (fd) == 0;
        if (fd >= 0)
            close (fd);
        written = written && sbx_dqproxy_key_load (path, false, key) == 0;
        sbx_secret_wipe_bytes (key, sizeof key);
        free (path);
        if (!written) {
            snprintf (why, why_size, "cannot write the cluster key into %s/keys",
                      sbx_config_data_dir (config));
            goto done;
        }
    }
    //  The settings.
    char list[1024] = "";
    for (size_t i = 0; i < json_array_size (nodes); i++)
        snprintf (list + strlen (list), sizeof list - strlen (list), "%s%s", *list ? "," : "",
                  json_string_value (json_array_get (nodes, i)));
    sbx_config_set (config, "instance", name);
    sbx_config_set (config, "roles", chosen);
    if (control) {
        sbx_config_set (config, "control.address", address);
        sbx_config_set (config, "control.join", list);
        if (!strstr (list, address))
            snprintf (list + strlen (list), sizeof list - strlen (list), ",%s", address);
    }
    sbx_config_set (config, "control.nodes", list);
    //  A guest host's two addresses for the other hosts, unless sbx.conf names them:
    //  where its sandboxes and snapshots are fetched, and where its ports are relayed.
    if (guests && (*host || s_host_of (address, host, sizeof host))) {
        char value[300];
        if (!sbx_config_get (config, "vmd.ship", NULL)) {
            snprintf (value, sizeof value, "%s:%d", host, CLI_CLUSTER_SHIP_PORT);
            sbx_config_set (config, "vmd.ship", value);
        }
        if (!sbx_config_get (config, "vmd.relay", NULL)) {
            snprintf (value, sizeof value, "%s:%d", host, CLI_CLUSTER_RELAY_PORT);
            sbx_config_set (config, "vmd.relay", value);
        }
    }
    if (sbx_config_save (config)) {
        snprintf (why, why_size, "cannot write %s/sbx.conf", sbx_config_data_dir (config));
        goto done;
    }
    rc = 0;
done:
    json_decref (t);
    return rc;
}

//  --------------------------------------------------------------------------
//  nodes, hosts

static int s_nodes (sbx_config_t *config, bool json, const char *remove)
{
    sbx_err_t err;
    sbx_msg_t *request = sbx_msg_new (remove ? SBX_MSG_CLUSTER_REMOVE : SBX_MSG_CLUSTER_NODES);
    if (remove)
        sbx_str_set (&sbx_msg_cluster_remove (request)->address, remove);
    sbx_msg_t *reply = cli_call (config, &request, 10000, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_cluster_nodes_ok_t *ok = sbx_msg_cluster_nodes_ok (reply);
    json_t *list = json_array ();
    if (!json)
        printf ("%-22s %-24s %-8s %s\n", "ID", "ADDRESS", "ROLE", "LEADS");
    for (size_t i = 0; i < ok->nodes.count; i++) {
        sbx_control_node_t *node = &ok->nodes.items[i];
        bool leads = ok->leader && streq (ok->leader, node->address);
        if (json)
            json_array_append_new (list, json_pack ("{s:I, s:s, s:s, s:b}", "id",
                                                    (json_int_t) node->id, "address", node->address,
                                                    "role", node->role, "leader", leads));
        else
            printf ("%-22llu %-24s %-8s %s\n", (unsigned long long) node->id, node->address,
                    node->role, leads ? "yes" : "");
    }
    if (json)
        cli_print_json (json_pack ("{s:o, s:s?}", "nodes", list, "leader", ok->leader));
    else
        json_decref (list);
    sbx_msg_destroy (&reply);
    return 0;
}

int cli_cluster_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"address", required_argument, 0, 'a'},
                                      {"name", required_argument, 0, 'n'},
                                      {"roles", required_argument, 0, 'r'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    const char *data_dir = NULL, *address = NULL, *name = NULL, *roles = NULL;
    bool json = false;
    int c;
    optind = 2;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'a':
            address = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'r':
            roles = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "sbx cluster: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    int rc;
    if (streq (verb, "init"))
        rc = s_init (config, address);
    else if (streq (verb, "token"))
        rc = s_token_main (config, name, roles, json);
    else if (streq (verb, "nodes"))
        rc = s_nodes (config, json, NULL);
    else if (streq (verb, "remove")) {
        if (!address) {
            fprintf (stderr, "sbx cluster remove: --address HOST:PORT names the node\n");
            rc = 2;
        } else
            rc = s_nodes (config, json, address);
    } else {
        fprintf (stderr, "sbx cluster: unknown subcommand '%s' (init, token, nodes, remove)\n",
                 verb);
        rc = 2;
    }
    sbx_config_destroy (&config);
    return rc;
}

static void s_host_usage (FILE *out)
{
    fprintf (out, "usage: sbx host list [--data-dir DIR] [--json]\n"
                  "       sbx host remove NAME [--data-dir DIR] [--json]\n"
                  "       sbx host drain NAME [--undo] [--data-dir DIR] [--json]\n\n"
                  "The hosts join tokens admitted to the cluster (sbx cluster token). remove:\n"
                  "its key is refused by every control node within seconds (its processes\n"
                  "at their next connection); the record stays, marked removed.\n"
                  "drain: no new sandbox goes to vmd NAME, and its stopped sandboxes move to\n"
                  "other vmd hosts, memory and disk, one at a time (each host needs vmd.ship);\n"
                  "running ones stay until stopped (then they move) or deleted. --undo ends it.\n"
                  "Several hosts: docs/operations.md.\n");
}

static json_t *s_host_json (sbx_host_info_t *host)
{
    json_t *roles = json_array ();
    for (size_t i = 0; i < host->roles.count; i++)
        json_array_append_new (roles, json_string (host->roles.items[i]));
    return json_pack ("{s:s, s:o, s:s, s:o, s:o, s:o}", "name", host->name, "roles", roles,
                      "publicKey", host->public_key, "createdAt", cli_json_time (host->created_ms),
                      "removedAt", cli_json_time (host->removed_ms), "drainingSince",
                      cli_json_time (host->draining_ms));
}

int cli_host_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"undo", no_argument, 0, 'u'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_host_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1], *data_dir = NULL;
    bool json = false, undo = false;
    int c;
    optind = 2;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        if (c == 'd')
            data_dir = optarg;
        else if (c == 'j')
            json = true;
        else if (c == 'u')
            undo = true;
        else if (c == 'h') {
            s_host_usage (stdout);
            return 0;
        } else {
            s_host_usage (stderr);
            return 2;
        }
    }
    const char *name = optind < argc ? argv[optind] : NULL;
    bool remove = streq (verb, "remove"), drain = streq (verb, "drain");
    if (!remove && !drain && !streq (verb, "list")) {
        fprintf (stderr, "sbx host: unknown subcommand '%s' (list, remove, drain)\n", verb);
        return 2;
    }
    if ((remove || drain) != (name != NULL) || (name && optind + 1 < argc) || (undo && !drain)) {
        s_host_usage (stderr);
        return 2;
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    sbx_msg_t *request = sbx_msg_new (remove  ? SBX_MSG_HOST_REMOVE
                                      : drain ? SBX_MSG_HOST_DRAIN
                                              : SBX_MSG_HOST_LIST);
    if (remove)
        sbx_str_set (&sbx_msg_host_remove (request)->name, name);
    if (drain) {
        sbx_str_set (&sbx_msg_host_drain (request)->name, name);
        sbx_msg_host_drain (request)->undo = undo;
    }
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 10000, &err);
    sbx_config_destroy (&config);
    if (!reply)
        return cli_fail (&err);
    if (drain) {
        sbx_host_drain_ok_t *ok = sbx_msg_host_drain_ok (reply);
        if (json) {
            json_t *host = s_host_json (ok->host);
            json_object_set_new (host, "stopped", json_integer ((json_int_t) ok->stopped));
            json_object_set_new (host, "running", json_integer ((json_int_t) ok->running));
            cli_print_json (host);
        } else if (undo)
            printf ("vmd %s takes new sandboxes again\n", ok->host->name);
        else
            printf ("vmd %s drains: no new sandbox goes there; %llu stopped sandbox(es) move to "
                    "other hosts, one at a time (sbx host list shows it); %llu running stay "
                    "until stopped or deleted\n",
                    ok->host->name, (unsigned long long) ok->stopped,
                    (unsigned long long) ok->running);
    } else if (remove) {
        sbx_host_info_t *host = sbx_msg_host_remove_ok (reply)->host;
        if (json)
            cli_print_json (s_host_json (host));
        else
            printf ("host %s removed: its key is no longer admitted\n", host->name);
    } else {
        sbx_host_info_list_t *hosts = &sbx_msg_host_list_ok (reply)->hosts;
        json_t *list = json_array ();
        if (!json)
            printf ("%-24s %-40s %s\n", "NAME", "ROLES", "STATE");
        for (size_t i = 0; i < hosts->count; i++) {
            sbx_host_info_t *host = &hosts->items[i];
            if (json)
                json_array_append_new (list, s_host_json (host));
            else {
                char roles[256] = "";
                for (size_t r = 0; r < host->roles.count; r++)
                    snprintf (roles + strlen (roles), sizeof roles - strlen (roles), "%s%s",
                              r ? "," : "", host->roles.items[r]);
                printf ("%-24s %-40s %s\n", host->name, roles,
                        host->removed_ms    ? "removed"
                        : host->draining_ms ? "admitted, draining"
                                            : "admitted");
            }
        }
        if (json)
            cli_print_json (json_pack ("{s:o}", "hosts", list));
        else
            json_decref (list);
    }
    sbx_msg_destroy (&reply);
    return 0;
}

//  --------------------------------------------------------------------------
//  Self-test: a token made from a member's keys joins another data directory.

void cli_cluster_test (bool verbose)
{
    (void) verbose;
    char member_dir[] = "/tmp/cli_cluster_test.XXXXXX", new_dir[] = "/tmp/cli_cluster_new.XXXXXX";
    assert (mkdtemp (member_dir) && mkdtemp (new_dir));
    char *command = NULL;
    sbx_config_t *member = sbx_config_new (member_dir);
    assert (member);
    //  A member's keys: the brokers' pair and the cluster key.
    zcert_t *broker = zcert_new ();
    char *path = sbx_config_path (member, "keys/broker.cert");
    assert (zcert_save (broker, path) == 0);
    free (path);
    path = sbx_config_path (member, "keys/cluster.key");
    unsigned char key[SBX_DQPROXY_KEY_SIZE];
    assert (sbx_dqproxy_key_load (path, true, key) == 0);
    free (path);
    //  What the broker answers cluster.token.
    zcert_t *pair = zcert_new ();
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_CLUSTER_TOKEN_OK);
    sbx_cluster_token_ok_t *ok = sbx_msg_cluster_token_ok (reply);
    ok->host = calloc (1, sizeof *ok->host);
    sbx_str_set (&ok->host->name, "cp-2");
    sbx_str_set (&ok->host->public_key, zcert_public_txt (pair));
    sbx_strlist_append (&ok->host->roles, "control");
    sbx_strlist_append (&ok->host->roles, "billing");
    sbx_str_set (&ok->secret_key, zcert_secret_txt (pair));
    sbx_strlist_append (&ok->nodes, "10.0.0.1:7000");
    char why[512];
    char *token = s_token (member, ok, why, sizeof why);
    assert (token && strncmp (token, S_TOKEN_PREFIX, strlen (S_TOKEN_PREFIX)) == 0);

    sbx_config_t *fresh = sbx_config_new (new_dir);
    //  Refused: not a token; a role it does not grant; a control node without address.
    assert (cli_cluster_join (fresh, "sbxjoin1:AAAA", NULL, NULL, why, sizeof why) == -1);
    assert (cli_cluster_join (fresh, token, "10.0.0.2:7000", "vmd", why, sizeof why) == -1);
    assert (strstr (why, "not vmd"));
    assert (cli_cluster_join (fresh, token, NULL, NULL, why, sizeof why) == -1);
    assert (strstr (why, "--address"));
    //  Joined: the keys and the settings.
    assert (cli_cluster_join (fresh, token, "10.0.0.2:7000", NULL, why, sizeof why) == 0);
    assert (streq (sbx_config_get (fresh, "control.nodes", ""), "10.0.0.1:7000,10.0.0.2:7000"));
    assert (streq (sbx_config_get (fresh, "control.join", ""), "10.0.0.1:7000"));
    assert (streq (sbx_config_get (fresh, "roles", ""), "control,billing"));
    assert (streq (sbx_config_get (fresh, "instance", ""), "cp-2"));
    assert (streq (sbx_config_get (fresh, "broker.bind", ""), "tcp://10.0.0.2:7001"));
    path = sbx_config_path (fresh, "keys/client.cert");
    zcert_t *client = zcert_load (path);
    free (path);
    assert (client && streq (zcert_public_txt (client), zcert_public_txt (pair)));
    assert (streq (zcert_secret_txt (client), zcert_secret_txt (pair)));
    path = sbx_config_path (fresh, "keys/broker.cert");
    zcert_t *shared = zcert_load (path);
    free (path);
    assert (shared && streq (zcert_secret_txt (shared), zcert_secret_txt (broker)));
    unsigned char copied[SBX_DQPROXY_KEY_SIZE];
    path = sbx_config_path (fresh, "keys/cluster.key");
    assert (sbx_dqproxy_key_load (path, false, copied) == 0 &&
            memcmp (copied, key, sizeof key) == 0);
    struct stat st;
    assert (stat (path, &st) == 0 && (st.st_mode & 077) == 0);
    free (path);
    sbx_config_destroy (&fresh);
    //  Saved: read back by a new start.
    fresh = sbx_config_new (new_dir);
    assert (streq (sbx_config_get (fresh, "control.address", ""), "10.0.0.2:7000"));
    sbx_config_destroy (&fresh);

    //  A guest host: --address (HOST, or HOST:PORT) gives vmd.ship and vmd.relay on its
    //  host part, unless sbx.conf names them; an address that will not do is refused.
    sbx_msg_t *guest_reply = sbx_msg_new (SBX_MSG_CLUSTER_TOKEN_OK);
    sbx_cluster_token_ok_t *guest = sbx_msg_cluster_token_ok (guest_reply);
    guest->host = calloc (1, sizeof *guest->host);
    sbx_str_set (&guest->host->name, "box-1");
    sbx_str_set (&guest->host->public_key, zcert_public_txt (pair));
    sbx_strlist_append (&guest->host->roles, "vmd");
    sbx_strlist_append (&guest->host->roles, "snapshotd");
    sbx_str_set (&guest->secret_key, zcert_secret_txt (pair));
    sbx_strlist_append (&guest->nodes, "10.0.0.1:7000");
    char *guest_token = s_token (member, guest, why, sizeof why);
    assert (guest_token);
    const char *dirs[] = {"/tmp/cli_cluster_g1.XXXXXX", "/tmp/cli_cluster_g2.XXXXXX",
                          "/tmp/cli_cluster_g3.XXXXXX"};
    const char *addresses[] = {"10.0.0.5", "[fd00::5]:7000", "10.0.0.5"};
    for (int i = 0; i < 3; i++) {
        char dir[64];
        snprintf (dir, sizeof dir, "%s", dirs[i]);
        assert (mkdtemp (dir));
        sbx_config_t *host = sbx_config_new (dir);
        if (i == 2)
            sbx_config_set (host, "vmd.ship", "192.0.2.1:9000"); //  the operator's own
        assert (cli_cluster_join (host, guest_token, "not an address", NULL, why, sizeof why) ==
                -1);
        assert (strstr (why, "HOST or HOST:PORT"));
        assert (cli_cluster_join (host, guest_token, addresses[i], NULL, why, sizeof why) == 0);
        sbx_config_destroy (&host);
        host = sbx_config_new (dir);
        const char *ship[] = {"10.0.0.5:7300", "[fd00::5]:7300", "192.0.2.1:9000"};
        const char *relay[] = {"10.0.0.5:7400", "[fd00::5]:7400", "10.0.0.5:7400"};
        assert (streq (sbx_config_get (host, "vmd.ship", ""), ship[i]));
        assert (streq (sbx_config_get (host, "vmd.relay", ""), relay[i]));
        assert (streq (sbx_config_get (host, "roles", ""), "vmd,snapshotd"));
        sbx_config_destroy (&host);
        command = zsys_sprintf ("rm -rf '%s'", dir);
        assert (system (command) == 0);
        zstr_free (&command);
    }
    sbx_secret_wipe (guest_token);
    free (guest_token);
    sbx_msg_destroy (&guest_reply);

    zcert_destroy (&client);
    zcert_destroy (&shared);
    zcert_destroy (&pair);
    zcert_destroy (&broker);
    sbx_secret_wipe (token);
    free (token);
    sbx_msg_destroy (&reply);
    sbx_config_destroy (&member);
    command = zsys_sprintf ("rm -rf '%s' '%s'", member_dir, new_dir);
    assert (system (command) == 0);
    zstr_free (&command);
}
