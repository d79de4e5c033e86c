/*  cli_snapshot - `sbx snapshot list|save|get|delete`: an operator's hands on the
    snapshot store, through the broker (docs/snapshots.md). Acts as an operator: sees
    every account's snapshots, or one account's with --account. */
#include "cli_call.h"
#include "cli_commands.h"

#include <getopt.h>

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx snapshot list [--account ACCOUNT]\n"
                  "       sbx snapshot save SANDBOX [--name N] [--label K=V]...\n"
                  "       sbx snapshot get ID\n"
                  "       sbx snapshot delete ID\n"
                  "every subcommand takes --data-dir DIR and --json.\n\n"
                  "list: every account's snapshots (or ACCOUNT's, by id or email), newest first.\n"
                  "save: saves a ready or stopped sandbox's disk and memory (a running guest is\n"
                  "paused only during the capture) and prints the snapshot once it is ready.\n"
                  "get: one snapshot, with the sandboxes made from it.\n"
                  "delete: removes it and its files; refused (conflict) while a sandbox made from\n"
                  "it is not deleted, or another snapshot stands on it.\n"
                  "New sandboxes from a snapshot: sbx sandbox create --account A --snapshot ID.\n");
}

static json_t *s_snapshot_json (const sbx_snapshot_info_t *s, bool users)
{
    json_t *labels = json_object ();
    for (size_t i = 0; i < s->labels.count; i++)
        json_object_set_new (labels, s->labels.keys[i], json_string (s->labels.values[i]));
    json_t *out = json_pack (
        "{s:s, s:s?, s:s?, s:s?, s:s, s:s, s:s, s:o, s:I, s:I, s:s?, s:s?, s:o, s:s?}", "id", s->id,
        "name", s->name, "account", s->account, "sandbox_id", s->sandbox_id, "type",
        sbx_sandbox_type_name (s->type ? s->type : SBX_SANDBOX_TYPE_SMALL), "state",
        sbx_snapshot_state_name (s->state), "kind",
        sbx_snapshot_kind_name (s->kind ? s->kind : SBX_SNAPSHOT_KIND_USER), "labels", labels,
        "disk_bytes", (json_int_t) s->disk_bytes, "memory_bytes", (json_int_t) s->memory_bytes,
        "parent", s->parent, "qemu_version", s->qemu_version, "created_at",
        cli_json_time (s->created_ms), "reason", s->reason);
    if (users) {
        json_t *list = json_array ();
        for (size_t i = 0; i < s->users.count; i++)
            json_array_append_new (list, json_string (s->users.items[i]));
        json_object_set_new (out, "users", list);
    }
    return out;
}

static void s_print (const sbx_snapshot_info_t *s, bool json, bool users)
{
    if (json) {
        cli_print_json (s_snapshot_json (s, users));
        return;
    }
    double mib = (double) (s->disk_bytes + s->memory_bytes) / (1024.0 * 1024.0);
    printf ("%s  %-6s %-9s %-6s %8.1f MiB  %s  %s%s%s\n", s->id, sbx_snapshot_state_name (s->state),
            sbx_snapshot_kind_name (s->kind ? s->kind : SBX_SNAPSHOT_KIND_USER),
            sbx_sandbox_type_name (s->type ? s->type : SBX_SANDBOX_TYPE_SMALL), mib,
            s->sandbox_id ? s->sandbox_id : "-", s->name ? s->name : "", s->reason ? "  " : "",
            s->reason ? s->reason : "");
    for (size_t i = 0; users && i < s->users.count; i++)
        printf ("  made from it: %s\n", s->users.items[i]);
}

//  An operator's caller, naming the account when given.
static sbx_caller_t *s_operator (const char *account)
{
    sbx_caller_t *caller = calloc (1, sizeof *caller);
    if (caller) {
        caller->kind = SBX_CALLER_KIND_ADMIN;
        sbx_str_set (&caller->account_id, account);
    }
    return caller;
}

static int s_list (sbx_config_t *config, const char *account, bool json)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
    request->caller = s_operator (account);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 30000, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
    if (json) {
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (all, s_snapshot_json (&list->items[i], false));
        cli_print_json (json_pack ("{s:o}", "snapshots", all));
    } else
        for (size_t i = 0; i < list->count; i++)
            s_print (&list->items[i], false, false);
    sbx_msg_destroy (&reply);
    return 0;
}

int cli_snapshot_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    if (!streq (verb, "list") && !streq (verb, "save") && !streq (verb, "get") &&
        !streq (verb, "delete")) {
        fprintf (stderr, "sbx snapshot: unknown subcommand '%s' (list, save, get or delete)\n",
                 verb);
        return 2;
    }
    static struct option options[] = {{"account", required_argument, 0, 'a'},
                                      {"name", required_argument, 0, 'n'},
                                      {"label", required_argument, 0, 'l'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *account = NULL, *name = NULL, *data_dir = NULL;
    zlist_t *labels = zlist_new (); //  "K=V", checked as they come
    bool json = false;
    int c, rc = -1;
    optind = 1;
    while (rc < 0 && (c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        const char *eq = c == 'l' ? strchr (optarg, '=') : NULL;
        switch (c) {
        case 'a':
            account = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'l':
            if (!eq || eq == optarg) {
                fprintf (stderr, "sbx snapshot: label '%s' is not KEY=VALUE\n", optarg);
                rc = 2;
                break;
            }
            zlist_append (labels, optarg);
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            s_usage (stdout);
            rc = 0;
            break;
        default:
            s_usage (stderr);
            rc = 2;
            break;
        }
    }
    //  What getopt left: the positional arguments (none for list, one id otherwise).
    int npos = argc - 1 - optind;
    const char *id = npos == 1 ? argv[1 + optind] : NULL;
    if (rc < 0 && (streq (verb, "list") ? npos != 0 : npos != 1)) {
        fprintf (stderr, "sbx snapshot %s: %s\n", verb,
                 streq (verb, "list")   ? "takes no arguments (see --help)"
                 : streq (verb, "save") ? "give the sandbox's id"
                                        : "give the snapshot's id");
        rc = 2;
    }
    if (rc < 0 && account && !streq (verb, "list")) {
        fprintf (stderr, "sbx snapshot %s: --account goes with list\n", verb);
        rc = 2;
    }
    sbx_config_t *config = rc < 0 ? sbx_config_new (data_dir) : NULL;
    if (rc < 0 && !config)
        rc = 1;
    if (rc < 0 && streq (verb, "list"))
        rc = s_list (config, account, json);
    else if (rc < 0) {
        sbx_msg_t *request;
        if (streq (verb, "save")) {
            request = sbx_msg_new (SBX_MSG_SNAPSHOT_SAVE);
            sbx_str_set (&sbx_msg_snapshot_save (request)->sandbox_id, id);
            sbx_str_set (&sbx_msg_snapshot_save (request)->name, name);
            for (char *kv = zlist_first (labels); kv; kv = zlist_next (labels)) {
                char *eq = strchr (kv, '=');
                *eq = 0;
                sbx_strmap_set (&sbx_msg_snapshot_save (request)->labels, kv, eq + 1);
                *eq = '=';
            }
        } else if (streq (verb, "get")) {
            request = sbx_msg_new (SBX_MSG_SNAPSHOT_GET);
            sbx_str_set (&sbx_msg_snapshot_get (request)->snapshot_id, id);
        } else {
            request = sbx_msg_new (SBX_MSG_SNAPSHOT_DELETE);
            sbx_str_set (&sbx_msg_snapshot_delete (request)->snapshot_id, id);
        }
        request->caller = s_operator (NULL);
        sbx_err_t err;
        //  A save waits for the capture: a memory save and a disk copy.
        sbx_msg_t *reply = cli_call (config, &request, streq (verb, "save") ? 600000 : 30000, &err);
        if (!reply)
            rc = cli_fail (&err);
        else {
            sbx_snapshot_info_t *info = reply->type == SBX_MSG_SNAPSHOT_SAVE_OK
                                            ? sbx_msg_snapshot_save_ok (reply)->snapshot
                                        : reply->type == SBX_MSG_SNAPSHOT_GET_OK
                                            ? sbx_msg_snapshot_get_ok (reply)->snapshot
                                            : sbx_msg_snapshot_delete_ok (reply)->snapshot;
            if (!json && streq (verb, "delete"))
                printf ("deleted snapshot %s\n", info->id);
            else
                s_print (info, json, streq (verb, "get"));
            sbx_msg_destroy (&reply);
            rc = 0;
        }
    }
    sbx_config_destroy (&config);
    zlist_destroy (&labels);
    return rc;
}
