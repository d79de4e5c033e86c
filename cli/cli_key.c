/*  cli_key - `sbx key create|list|revoke`: an account's API keys, on the sbx host as the
    operator (any account, --account), or through a service (sbx login) as the key's own
    account (list and revoke). */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"
#include "sbx_api.h"

#include <getopt.h>
#include <jansson.h>

#define S_TIMEOUT_MS 10000

static void s_key_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx key create --account ACCOUNT --preset full|ci|read-only|no-delete\n"
             "                      [--expires DURATION] [--name NAME] [--data-dir DIR] [--json]\n"
             "       sbx key list --account ACCOUNT [--data-dir DIR] [--json]\n"
             "       sbx key revoke KEY_ID [--data-dir DIR] [--json]\n\n"
             "ACCOUNT is an account id (acc_…) or email. DURATION is seconds or a number with\n"
             "s, m, h or d (90d). Presets: full (everything), ci (creates, uses and deletes\n"
             "only the sandboxes it created), read-only (read-only tools only), no-delete.\n"
             "The key is shown once; sbx stores only its hash.\n");
}

//  key list's answer (REST's, taken): as it is with --json, else a line per key.
static void s_print_keys (json_t *answer, bool json)
{
    if (json) {
        cli_print_json (answer);
        return;
    }
    printf ("%-16s %-10s %-10s %-10s %-24s %s\n", "KEY", "KIND", "PRESET", "PREFIX", "EXPIRES",
            "NAME");
    size_t i;
    json_t *k;
    json_array_foreach (json_object_get (answer, "keys"), i, k)
    {
        printf ("%-16s %-10s %-10s %-10s %-24s %s%s\n", cli_json_str (k, "id", "?"),
                cli_json_str (k, "kind", "?"), cli_json_str (k, "preset", "-"),
                cli_json_str (k, "prefix", "-"), cli_json_str (k, "expiresAt", "never"),
                cli_json_str (k, "name", ""),
                json_is_true (json_object_get (k, "revoked")) ? " (revoked)" : "");
    }
    json_decref (answer);
}

static void s_print_revoked (json_t *answer, bool json)
{
    if (json)
        cli_print_json (answer);
    else {
        printf ("key %s revoked\n", cli_json_str (answer, "id", "?"));
        json_decref (answer);
    }
}

//  key list and revoke through a remote service: the key's own account.
static int s_key_remote (cli_rest_t *remote, const char *verb, const char *account, int rest,
                         char **positional, bool json)
{
    int rc = 2;
    sbx_err_t err;
    json_t *answer = NULL;
    if (account)
        fprintf (stderr,
                 "sbx key %s: --account is the operator's, on the sbx host; through %s "
                 "these are the API key's account's keys\n",
                 verb, cli_rest_url (remote));
    else if (streq (verb, "list") && rest)
        fprintf (stderr, "sbx key list: takes no arguments\n");
    else if (streq (verb, "revoke") && rest != 1)
        fprintf (stderr, "sbx key revoke: give exactly one KEY_ID\n");
    else {
        json_t *args =
            streq (verb, "list") ? json_object () : json_pack ("{s:s}", "keyId", positional[0]);
        rc = cli_rest_call (remote, streq (verb, "list") ? SBX_OP_LIST_KEYS : SBX_OP_REVOKE_KEY,
                            args, NULL, 0, &answer, NULL, NULL, &err)
                 ? cli_fail (&err)
                 : 0;
        json_decref (args);
        if (rc == 0 && streq (verb, "list"))
            s_print_keys (answer, json);
        else if (rc == 0)
            s_print_revoked (answer, json);
    }
    cli_rest_destroy (&remote);
    return rc;
}

int cli_key_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_key_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    if (!streq (verb, "create") && !streq (verb, "list") && !streq (verb, "revoke")) {
        fprintf (stderr, "sbx key: unknown subcommand '%s'\n", verb);
        s_key_usage (stderr);
        return 2;
    }
    static struct option options[] = {
        {"account", required_argument, 0, 'a'},  {"preset", required_argument, 0, 'p'},
        {"expires", required_argument, 0, 'e'},  {"name", required_argument, 0, 'n'},
        {"data-dir", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *account = NULL, *preset = NULL, *expires = NULL, *name = NULL, *data_dir = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'a':
            account = optarg;
            break;
        case 'p':
            preset = optarg;
            break;
        case 'e':
            expires = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            s_key_usage (stdout);
            return 0;
        default:
            s_key_usage (stderr);
            return 2;
        }
    }
    int rest = argc - 1 - optind; //  positional arguments left
    char **positional = argv + 1 + optind;
    char command[32];
    snprintf (command, sizeof command, "sbx key %s", verb);
    //  list and revoke work through a remote service too (REST's keys of the key's
    //  account); create is the operator's.
    cli_rest_t *remote = NULL;
    if (streq (verb, "create") ? cli_rest_local_only (command, data_dir)
                               : cli_rest_for (command, data_dir, &remote))
        return 2;
    if (remote)
        return s_key_remote (remote, verb, account, rest, positional, json);
    sbx_msg_t *request = NULL;
    if (streq (verb, "create")) {
        sbx_key_preset_t value;
        if (!account || !preset || rest) {
            fprintf (stderr, "sbx key create: --account and --preset are required\n");
            return 2;
        }
        if (sbx_key_preset_from_name (preset, &value)) {
            fprintf (stderr, "sbx key create: preset must be full, ci, read-only or no-delete\n");
            return 2;
        }
        int64_t seconds = expires ? sbx_clock_parse_duration (expires) : 0;
        if (seconds < 0 || (expires && seconds == 0)) {
            fprintf (stderr, "sbx key create: --expires '%s' is not a duration (90d, 12h, 3600)\n",
                     expires);
            return 2;
        }
        request = sbx_msg_new (SBX_MSG_KEY_CREATE);
        sbx_key_create_t *args = sbx_msg_key_create (request);
        sbx_str_set (&args->account, account);
        args->preset = value;
        sbx_str_set (&args->name, name);
        args->expires_in_s = (uint64_t) seconds;
    } else if (streq (verb, "list")) {
        if (!account || rest) {
            fprintf (stderr, "sbx key list: --account is required\n");
            return 2;
        }
        request = sbx_msg_new (SBX_MSG_KEY_LIST);
        sbx_str_set (&sbx_msg_key_list (request)->account, account);
    } else {
        if (rest != 1) {
            fprintf (stderr, "sbx key revoke: give exactly one KEY_ID\n");
            return 2;
        }
        request = sbx_msg_new (SBX_MSG_KEY_REVOKE);
        sbx_str_set (&sbx_msg_key_revoke (request)->key_id, positional[0]);
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config) {
        sbx_msg_destroy (&request);
        return 1;
    }
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    sbx_config_destroy (&config);
    if (!reply)
        return cli_fail (&err);
    if (reply->type == SBX_MSG_KEY_CREATE_OK) {
        sbx_key_create_ok_t *ok = sbx_msg_key_create_ok (reply);
        if (json)
            cli_print_json (json_pack ("{s:s, s:s, s:s, s:s, s:s?, s:o}", "key_id", ok->key_id,
                                       "key", ok->key, "account_id", ok->account_id, "preset",
                                       sbx_key_preset_name (ok->preset), "name", ok->name,
                                       "expires_at", cli_json_time (ok->expires_ms)));
        else
            printf ("key %s (%s) for %s, shown only now:\n%s\n", ok->key_id,
                    sbx_key_preset_name (ok->preset), ok->account_id, ok->key);
    } else if (reply->type == SBX_MSG_KEY_LIST_OK) {
        sbx_key_list_ok_t *ok = sbx_msg_key_list_ok (reply);
        //  REST's shape (GET /v1/keys): one definition for both (sbx_api).
        json_t *keys = json_array ();
        for (size_t i = 0; i < ok->keys.count; i++)
            json_array_append_new (keys, sbx_api_key (&ok->keys.items[i]));
        s_print_keys (json_pack ("{s:o}", "keys", keys), json);
    } else
        s_print_revoked (
            json_pack ("{s:s, s:b}", "id", sbx_msg_key_revoke_ok (reply)->key_id, "revoked", 1),
            json);
    sbx_msg_destroy (&reply);
    return 0;
}
