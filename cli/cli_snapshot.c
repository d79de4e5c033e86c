/*  cli_snapshot - `sbx snapshot list|save|get|delete`: the snapshot store, on the sbx host
    through the broker (docs/snapshots.md) as an operator, who sees every account's
    snapshots (or one account's with --account), or from anywhere through a service's
    REST API after `sbx login` (cli_rest), as the key's account. The operations are
    REST's (cli_op): its arguments and limits, and with --json its JSON, with what only
    an operator sees added (account, qemuVersion; users for get). */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_op.h"
#include "cli_rest.h"

#include <getopt.h>

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx snapshot list [--account ACCOUNT]\n"
                  "       sbx snapshot save SANDBOX [--name N] [--label K=V]...\n"
                  "       sbx snapshot get ID\n"
                  "       sbx snapshot delete ID\n"
                  "every subcommand takes --data-dir DIR and --json.\n"
                  "After `sbx login URL` (or with SBX_URL and SBX_API_KEY) they go to that\n"
                  "service as the key's account, without --account; on the sbx host without a\n"
                  "profile, or with --data-dir, to the local broker as an operator.\n\n"
                  "list: every account's snapshots (or ACCOUNT's, by id or email), newest first.\n"
                  "save: saves a ready or stopped sandbox's disk and memory (a running guest is\n"
                  "paused only during the capture) and prints the snapshot once it is ready.\n"
                  "get: one snapshot, with the sandboxes made from it.\n"
                  "delete: removes it and its files; refused (conflict) while a sandbox made from\n"
                  "it is not deleted, or another snapshot stands on it.\n"
                  "New sandboxes from a snapshot: sbx sandbox create --account A --snapshot ID.\n"
                  "These are the REST API's operations (docs/openapi.json) with its limits (a\n"
                  "name of at most 128 characters); --json prints REST's JSON (camelCase:\n"
                  "sandboxId, sizeBytes, createdAt, parentId...), one line, with account and\n"
                  "qemuVersion added, and users (the sandboxes made from it) for get.\n");
}

//  REST's snapshot and what only an operator sees: whose it is, the QEMU that saved it,
//  and (get) the sandboxes made from it.
static void s_add_operator (json_t *snapshot, const sbx_snapshot_info_t *s, bool users)
{
    if (!snapshot || !s)
        return;
    if (s->account)
        json_object_set_new (snapshot, "account", json_string (s->account));
    if (s->qemu_version)
        json_object_set_new (snapshot, "qemuVersion", json_string (s->qemu_version));
    if (users) {
        json_t *list = json_array ();
        for (size_t i = 0; i < s->users.count; i++)
            json_array_append_new (list, json_string (s->users.items[i]));
        json_object_set_new (snapshot, "users", list);
    }
}

//  A line of REST's snapshot (and, from get on the host, the sandboxes made from it).
static void s_print (json_t *s)
{
    double mib = (double) json_integer_value (json_object_get (s, "sizeBytes")) / (1024.0 * 1024.0);
    const char *reason = cli_json_str (s, "reason", NULL);
    printf ("%s  %-6s %-9s %-6s %8.1f MiB  %s  %s%s%s\n", cli_json_str (s, "id", "?"),
            cli_json_str (s, "state", "?"), cli_json_str (s, "kind", "user"),
            cli_json_str (s, "type", "small"), mib, cli_json_str (s, "sandboxId", "-"),
            cli_json_str (s, "name", ""), reason ? "  " : "", reason ? reason : "");
    size_t i;
    json_t *user;
    json_array_foreach (json_object_get (s, "users"), i, user)
        printf ("  made from it: %s\n", json_string_value (user));
}

//  The snapshot a save, get or delete answers with.
static sbx_snapshot_info_t *s_info (sbx_msg_t *reply)
{
    return reply->type == SBX_MSG_SNAPSHOT_SAVE_OK  ? sbx_msg_snapshot_save_ok (reply)->snapshot
           : reply->type == SBX_MSG_SNAPSHOT_GET_OK ? sbx_msg_snapshot_get_ok (reply)->snapshot
           : reply->type == SBX_MSG_SNAPSHOT_DELETE_OK
               ? sbx_msg_snapshot_delete_ok (reply)->snapshot
               : NULL;
}

//  Runs the operation (locally for account when given: list; or through remote) and
//  prints REST's answer: as it is with --json, else a line per snapshot.
static int s_run (sbx_config_t *config, cli_rest_t *remote, cli_op_t *op, sbx_op_t opcode,
                  const char *verb, const char *account, bool json)
{
    json_t *answer = NULL;
    sbx_err_t err;
    if (remote) {
        if (cli_rest_call (remote, opcode, cli_op_args (op), NULL, 0, &answer, NULL, NULL, &err))
            return cli_fail (&err);
    } else {
        sbx_msg_t *request = cli_op_request (op);
        if (!request)
            return 2;
        sbx_msg_t *reply = cli_op_call (op, config, account, &request, &err);
        if (!reply)
            return cli_fail (&err);
        sbx_api_t *api = sbx_api_new (config);
        answer = api ? cli_op_answer (op, api, reply) : NULL;
        sbx_api_destroy (&api);
        if (answer && reply->type == SBX_MSG_SNAPSHOT_LIST_OK) {
            sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
            //  sbx_api_answer keeps the broker's order, one for one (no sandboxId filter).
            json_t *all = json_object_get (answer, "snapshots");
            for (size_t i = 0; i < list->count; i++)
                s_add_operator (json_array_get (all, i), &list->items[i], false);
        } else if (answer)
            s_add_operator (answer, s_info (reply), streq (verb, "get"));
        sbx_msg_destroy (&reply);
        if (!answer)
            return 1;
    }
    if (json) {
        cli_print_json (answer);
        return 0;
    }
    json_t *all = json_object_get (answer, "snapshots");
    size_t i;
    json_t *one;
    if (all)
        json_array_foreach (all, i, one) s_print (one);
    else if (streq (verb, "delete"))
        printf ("deleted snapshot %s\n", cli_json_str (answer, "id", "?"));
    else
        s_print (answer);
    json_decref (answer);
    return 0;
}

int cli_snapshot_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    sbx_op_t opcode = streq (verb, "list")   ? SBX_OP_LIST_SNAPSHOTS
                      : streq (verb, "save") ? SBX_OP_SAVE_SNAPSHOT
                      : streq (verb, "get")  ? SBX_OP_GET_SNAPSHOT
                                             : SBX_OP_DELETE_SNAPSHOT;
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
    zlist_t *labels = zlist_new (); //  "K=V"
    bool json = false;
    int c, rc = -1;
    optind = 1;
    while (rc < 0 && (c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'a':
            account = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'l':
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
    cli_rest_t *remote = NULL;
    if (rc < 0 && cli_rest_for ("sbx snapshot", data_dir, &remote))
        rc = 2;
    if (rc < 0 && remote && account) {
        fprintf (stderr,
                 "sbx snapshot %s: through %s these are the API key's account's "
                 "snapshots: --account is the operator's, on the sbx host\n",
                 verb, cli_rest_url (remote));
        rc = 2;
    }
    //  The broker lets an operator list one account's; REST has no such field.
    if (rc < 0 && account && !streq (verb, "list")) {
        fprintf (stderr, "sbx snapshot %s: --account goes with list\n", verb);
        rc = 2;
    }
    //  The options as the operation's arguments, checked with REST's limits.
    char command[64];
    snprintf (command, sizeof command, "sbx snapshot %s", verb);
    cli_op_t *op = rc < 0 ? cli_op_new (command, opcode) : NULL;
    if (rc < 0 && !op)
        rc = 1;
    if (rc < 0 && id &&
        cli_op_set_text (op, opcode == SBX_OP_SAVE_SNAPSHOT ? "sandboxId" : "snapshotId", id,
                         opcode == SBX_OP_SAVE_SNAPSHOT ? "SANDBOX" : "ID"))
        rc = 2;
    if (rc < 0 && name && cli_op_set_text (op, "name", name, "--name"))
        rc = 2;
    if (rc < 0 && cli_op_set_pairs (op, "labels", labels, "--label"))
        rc = 2;
    if (rc < 0 && cli_op_check (op))
        rc = 2;
    sbx_config_t *config = rc < 0 && !remote ? sbx_config_new (data_dir) : NULL;
    if (rc < 0 && !remote && !config)
        rc = 1;
    if (rc < 0)
        rc = s_run (config, remote, op, opcode, verb, account, json);
    sbx_config_destroy (&config);
    cli_rest_destroy (&remote);
    cli_op_destroy (&op);
    zlist_destroy (&labels);
    return rc;
}
