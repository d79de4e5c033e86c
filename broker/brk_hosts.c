/*  brk_hosts - see brk_hosts.h */
#include "brk_hosts.h"
#include "brk_accounts.h"
#include "sbx_dqlite.h"

#include <ctype.h>

//  The roles a host can be admitted for (cli_up's).
static const char *s_roles[] = {"control", "gateway", "vmd", "snapshotd", "billing", "hooks", NULL};

static bool s_role (const char *name)
{
    for (const char **role = s_roles; *role; role++)
        if (streq (*role, name))
            return true;
    return false;
}

static sbx_msg_t *s_refuse (brk_ctx_t *ctx, const sbx_msg_t *request)
{
    if (!request->caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "%s carries no caller identity",
                                  sbx_msg_type_name (request->type));
    if (!brk_accounts_operator (request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "%s is the operator's (sbx cluster, on a member host)",
                                  sbx_msg_type_name (request->type));
    if (!ctx->control_node)
        return sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                  "this sbx is one machine, not a cluster: `sbx cluster init "
                                  "--address HOST:PORT` makes it the first node of one "
                                  "(docs/operations.md, \"Several hosts\")");
    return NULL;
}

bool brk_hosts_valid_name (const char *name)
{
    size_t len = name ? strlen (name) : 0;
    if (len == 0 || len > 64 || name[0] == '-' || name[0] == '.')
        return false;
    for (const char *c = name; *c; c++)
        if (!isalnum ((unsigned char) *c) && *c != '-' && *c != '.')
            return false;
    return true;
}

static int s_info (const brk_host_t *host, sbx_host_info_t *info)
{
    if (sbx_str_set (&info->name, host->name) || sbx_str_set (&info->public_key, host->public_key))
        return -1;
    info->created_ms = host->created_ms;
    info->removed_ms = host->removed_ms;
    //  The record keeps them comma-separated.
    const char *start = host->roles ? host->roles : "";
    while (*start) {
        const char *end = strchr (start, ',');
        size_t len = end ? (size_t) (end - start) : strlen (start);
        char role[32];
        if (len && len < sizeof role) {
            memcpy (role, start, len);
            role[len] = 0;
            if (sbx_strlist_append (&info->roles, role))
                return -1;
        }
        if (!end)
            break;
        start = end + 1;
    }
    return 0;
}

//  The cluster's members as this node knows them, into nodes (and the leader), through
//  a connection to the node of this process. 0 or -1.
static int s_members (brk_ctx_t *ctx, sbx_control_node_list_t *nodes, sbx_strlist_t *addresses,
                      char **leader)
{
    sbx_dqlite_t *local = sbx_dqlite_connect (ctx->control_local, 2000, NULL, NULL);
    sbx_dqlite_server_t *servers = NULL;
    size_t count = 0;
    int rc = local ? sbx_dqlite_cluster (local, &servers, &count) : -1;
    static const char *roles[] = {"voter", "standby", "spare"};
    for (size_t i = 0; rc == 0 && i < count; i++) {
        if (addresses && sbx_strlist_append (addresses, servers[i].address))
            rc = -1;
        sbx_control_node_t *node = nodes ? sbx_control_node_list_append (nodes) : NULL;
        if (nodes && (!node || sbx_str_set (&node->address, servers[i].address) ||
                      sbx_str_set (&node->role, roles[servers[i].role])))
            rc = -1;
        if (node)
            node->id = servers[i].id;
    }
    uint64_t id;
    if (rc == 0 && leader && sbx_dqlite_leader (local, &id, leader))
        rc = -1;
    sbx_dqlite_servers_free (&servers, count);
    sbx_dqlite_destroy (&local);
    return rc;
}

int brk_hosts_members (brk_ctx_t *ctx, sbx_strlist_t *addresses)
{
    return ctx->control_local ? s_members (ctx, NULL, addresses, NULL) : 0;
}

sbx_msg_t *brk_hosts_token (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse (ctx, request);
    if (reply)
        return reply;
    sbx_cluster_token_t *args = sbx_msg_cluster_token (request);
    if (!brk_hosts_valid_name (args->name))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "a host's name is 1 to 64 letters, digits, - and ., starting "
                                  "with a letter or digit (its instance name)");
    char roles[200] = "";
    for (size_t i = 0; i < args->roles.count; i++) {
        if (!s_role (args->roles.items[i]))
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "'%s' is not a role: control, gateway, vmd, snapshotd, "
                                      "billing or hooks",
                                      args->roles.items[i]);
        if (!strstr (roles, args->roles.items[i]))
            snprintf (roles + strlen (roles), sizeof roles - strlen (roles), "%s%s",
                      *roles ? "," : "", args->roles.items[i]);
    }
    if (!*roles)
        snprintf (roles, sizeof roles, "control,gateway,vmd,snapshotd,billing,hooks");
    //  The new host's key pair: made here, its public half recorded, both handed out.
    zcert_t *cert = zcert_new ();
    if (!cert)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot make a key pair");
    brk_host_t host = {args->name, roles, (char *) zcert_public_txt (cert), sbx_clock_now_ms (), 0};
    int rc = brk_store_host_insert (ctx->store, &host);
    if (rc == 1) {
        zcert_destroy (&cert);
        return sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                  "host %s is admitted already (sbx host list); remove it first "
                                  "(sbx host remove %s) to admit a host of that name again",
                                  args->name, args->name);
    }
    reply = rc ? NULL : sbx_msg_new_reply (request, SBX_MSG_CLUSTER_TOKEN_OK);
    sbx_cluster_token_ok_t *ok = reply ? sbx_msg_cluster_token_ok (reply) : NULL;
    if (ok && (!(ok->host = calloc (1, sizeof *ok->host)) || s_info (&host, ok->host) ||
               sbx_str_set (&ok->secret_key, zcert_secret_txt (cert)) ||
               s_members (ctx, NULL, &ok->nodes, NULL)))
        sbx_msg_destroy (&reply);
    zcert_destroy (&cert);
    if (!reply)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                  "cannot record the host (the broker's log says why)");
    sbx_info ("rid=%llu host %s admitted (%s)", (unsigned long long) request->rid, args->name,
              roles);
    return reply;
}

typedef struct {
    sbx_host_info_list_t *list;
    bool failed;
} s_list_t;

static void s_list_one (const brk_host_t *host, void *arg)
{
    s_list_t *list = arg;
    sbx_host_info_t *info = sbx_host_info_list_append (list->list);
    if (!info || s_info (host, info))
        list->failed = true;
}

sbx_msg_t *brk_hosts_list (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse (ctx, request);
    if (reply)
        return reply;
    reply = sbx_msg_new_reply (request, SBX_MSG_HOST_LIST_OK);
    s_list_t list = {&sbx_msg_host_list_ok (reply)->hosts, false};
    if (brk_store_host_list (ctx->store, s_list_one, &list) < 0 || list.failed) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list the hosts");
    }
    //  Drains after the list: its statement is done stepping.
    sbx_host_info_list_t *hosts = &sbx_msg_host_list_ok (reply)->hosts;
    for (size_t i = 0; i < hosts->count; i++)
        brk_store_drain_since (ctx->store, hosts->items[i].name, &hosts->items[i].draining_ms);
    return reply;
}

sbx_msg_t *brk_hosts_remove (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse (ctx, request);
    if (reply)
        return reply;
    const char *name = sbx_msg_host_remove (request)->name;
    int rc = brk_store_host_remove (ctx->store, name, sbx_clock_now_ms ());
    if (rc == 1)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no admitted host named %s (sbx host list)", name);
    brk_host_t host = {0};
    if (rc || brk_store_host_find (ctx->store, name, &host))
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot remove the host");
    reply = sbx_msg_new_reply (request, SBX_MSG_HOST_REMOVE_OK);
    sbx_host_info_t **slot = &sbx_msg_host_remove_ok (reply)->host;
    if (!(*slot = calloc (1, sizeof **slot)) || s_info (&host, *slot)) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot read the host");
    } else
        sbx_info ("rid=%llu host %s removed: its key is no longer admitted",
                  (unsigned long long) request->rid, name);
    brk_host_clear (&host);
    return reply;
}

//  Whether any sandbox record names vmd (it is one the broker has known).
static void s_is (const char *name, void *arg)
{
    const char **want = arg;
    if (*want && streq (name, *want))
        *want = NULL;
}

sbx_msg_t *brk_hosts_drain (brk_ctx_t *ctx, sbx_msg_t *request)
{
    if (!request->caller || !brk_accounts_operator (request->caller))
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "host.drain is the operator's (sbx host drain, on a member "
                                  "host)");
    sbx_host_drain_t *args = sbx_msg_host_drain (request);
    const char *name = args->name;
    //  A vmd connected now, or one a sandbox record names: drains are by vmd instance.
    const char *unknown = name;
    if (!brk_registry_find (ctx->registry, SBX_ROLE_VMD, name))
        brk_store_sandbox_vmds (ctx->store, s_is, &unknown);
    else
        unknown = NULL;
    if (unknown && !args->undo)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no vmd named %s is connected or has sandboxes (sbx status "
                                  "lists the vmds)",
                                  name);
    uint64_t now = sbx_clock_now_ms (), stopped = 0, ready = 0, active = 0;
    int rc = args->undo ? brk_store_drain_unset (ctx->store, name)
                        : brk_store_drain_set (ctx->store, name, now);
    if (rc < 0 || brk_store_sandbox_count_on (ctx->store, name, "stopped", &stopped) ||
        brk_store_sandbox_count_on (ctx->store, name, "ready", &ready) ||
        brk_store_sandbox_active (ctx->store, name, &active))
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record the drain");
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_HOST_DRAIN_OK);
    sbx_host_drain_ok_t *ok = sbx_msg_host_drain_ok (reply);
    ok->stopped = stopped;
    ok->running = active;
    brk_host_t host = {0};
    sbx_host_info_t **slot = &ok->host;
    *slot = calloc (1, sizeof **slot);
    bool known = brk_store_host_find (ctx->store, name, &host) == 0;
    if (!*slot || (known ? s_info (&host, *slot)
                         : sbx_str_set (&(*slot)->name, name) ||
                               sbx_str_set (&(*slot)->public_key, "(not joined by token)"))) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    } else {
        brk_store_drain_since (ctx->store, name, &(*slot)->draining_ms);
        sbx_info ("rid=%llu vmd %s %s: %llu stopped sandbox(es) to move, %llu running stay",
                  (unsigned long long) request->rid, name,
                  args->undo ? "no longer drained" : "drained", (unsigned long long) ok->stopped,
                  (unsigned long long) ok->running);
    }
    brk_host_clear (&host);
    return reply;
}

sbx_msg_t *brk_hosts_nodes (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse (ctx, request);
    if (reply)
        return reply;
    reply = sbx_msg_new_reply (request, SBX_MSG_CLUSTER_NODES_OK);
    sbx_cluster_nodes_ok_t *ok = sbx_msg_cluster_nodes_ok (reply);
    if (s_members (ctx, &ok->nodes, NULL, &ok->leader)) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                  "this control node's dqlite node does not answer");
    }
    return reply;
}

sbx_msg_t *brk_hosts_remove_node (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_msg_t *reply = s_refuse (ctx, request);
    if (reply)
        return reply;
    const char *address = sbx_msg_cluster_remove (request)->address;
    sbx_dqlite_t *local = sbx_dqlite_connect (ctx->control_local, 5000, NULL, NULL);
    sbx_dqlite_server_t *servers = NULL;
    size_t count = 0;
    uint64_t id = 0, leader = 0;
    char *leading = NULL;
    if (!local || sbx_dqlite_cluster (local, &servers, &count) ||
        sbx_dqlite_leader (local, &leader, &leading)) {
        sbx_dqlite_destroy (&local);
        return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                  "this control node's dqlite node does not answer");
    }
    for (size_t i = 0; i < count; i++)
        if (streq (servers[i].address, address))
            id = servers[i].id;
    sbx_dqlite_servers_free (&servers, count);
    free (leading);
    if (!id) {
        sbx_dqlite_destroy (&local);
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no control node at %s (sbx cluster nodes lists them)", address);
    }
    //  The leader leaves last: it hands leadership over first, and this broker (which
    //  serves on the leader) stops serving once the new leader takes over.
    int rc = 0;
    if (id == leader) {
        rc = sbx_dqlite_transfer (local, 0);
        if (rc == 0) {
            sbx_dqlite_destroy (&local);
            return sbx_msg_new_error (
                request->rid, SBX_E_UNAVAILABLE,
                "%s led: leadership was handed over to another node; ask again (the new "
                "leader removes it)",
                address);
        }
    } else
        rc = sbx_dqlite_remove (local, id);
    if (rc) {
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION, "cannot remove %s: %s",
                                   address, sbx_dqlite_errmsg (local));
        sbx_dqlite_destroy (&local);
        return reply;
    }
    sbx_dqlite_destroy (&local);
    sbx_info ("rid=%llu control node %s removed from the cluster",
              (unsigned long long) request->rid, address);
    reply = sbx_msg_new_reply (request, SBX_MSG_CLUSTER_NODES_OK);
    sbx_cluster_nodes_ok_t *ok = sbx_msg_cluster_nodes_ok (reply);
    s_members (ctx, &ok->nodes, NULL, &ok->leader);
    return reply;
}
