/*  cli_account - `sbx account create` and `sbx key create|list|revoke`. */
#include "cli_call.h"
#include "sbx_api.h"
#include "cli_commands.h"
#include "cli_rest.h"

#include <getopt.h>
#include <jansson.h>
#include <termios.h>
#include <unistd.h>

#define S_TIMEOUT_MS 10000

//  Reads one line from stdin without its newline. Returns a string the caller frees.
static char *s_read_password (void)
{
    char buf[1025];
    if (!fgets (buf, sizeof buf, stdin))
        return NULL;
    buf[strcspn (buf, "\r\n")] = 0;
    return strdup (buf);
}

static void s_account_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx account create --email EMAIL [--password-stdin] [--plan PLAN]\n"
             "                          [--admin] [--no-key] [--data-dir DIR] [--json]\n\n"
             "Creates an account and, unless --no-key, a first API key with the full preset\n"
             "(shown once). --password-stdin reads a sign-in password (at least 8 characters)\n"
             "from the first line of standard input; without it the account signs in with\n"
             "API keys only.\n"
             "--json prints {\"account_id\",\"email\",\"plan\",\"key_id\",\"api_key\"}.\n");
}

int cli_account_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_account_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!streq (argv[1], "create")) {
        fprintf (stderr, "sbx account: unknown subcommand '%s'\n", argv[1]);
        s_account_usage (stderr);
        return 2;
    }
    static struct option options[] = {{"email", required_argument, 0, 'e'},
                                      {"password-stdin", no_argument, 0, 'p'},
                                      {"plan", required_argument, 0, 'P'},
                                      {"admin", no_argument, 0, 'a'},
                                      {"no-key", no_argument, 0, 'n'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *email = NULL, *plan = NULL, *data_dir = NULL;
    bool password_stdin = false, admin = false, no_key = false, json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'e':
            email = optarg;
            break;
        case 'p':
            password_stdin = true;
            break;
        case 'P':
            plan = optarg;
            break;
        case 'a':
            admin = true;
            break;
        case 'n':
            no_key = true;
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            s_account_usage (stdout);
            return 0;
        default:
            s_account_usage (stderr);
            return 2;
        }
    }
    if (!email) {
        fprintf (stderr, "sbx account create: --email is required\n");
        return 2;
    }
    char *hash = NULL;
    if (password_stdin) {
        char *password = s_read_password ();
        if (!password || strlen (password) < 8) {
            fprintf (stderr, "sbx account create: the password on stdin must have at least 8 "
                             "characters\n");
            free (password);
            return 2;
        }
        hash = sbx_secret_password_hash (password);
        sbx_secret_wipe (password);
        free (password);
        if (!hash) {
            fprintf (stderr, "sbx account create: cannot hash the password (out of memory?)\n");
            return 1;
        }
    }
    if (cli_rest_local_only ("sbx account create", data_dir))
        return 2;
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config) {
        free (hash);
        return 1;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_account_create_t *args = sbx_msg_account_create (request);
    sbx_str_set (&args->email, email);
    sbx_str_set (&args->plan, plan);
    args->password_hash = hash;
    args->admin = admin;
    args->with_key = !no_key;
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    sbx_config_destroy (&config);
    if (!reply)
        return cli_fail (&err);
    sbx_account_create_ok_t *ok = sbx_msg_account_create_ok (reply);
    if (json)
        cli_print_json (json_pack ("{s:s, s:s, s:s, s:s?, s:s?}", "account_id", ok->account_id,
                                   "email", ok->email, "plan", ok->plan, "key_id", ok->key_id,
                                   "api_key", ok->api_key));
    else {
        printf ("account %s created for %s (plan %s)\n", ok->account_id, ok->email, ok->plan);
        if (ok->api_key)
            printf ("API key %s (shown only now): %s\n", ok->key_id, ok->api_key);
    }
    sbx_msg_destroy (&reply);
    return 0;
}

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

static const char *s_str (json_t *object, const char *key, const char *none)
{
    const char *value = json_string_value (json_object_get (object, key));
    return value ? value : none;
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
        printf ("%-16s %-10s %-10s %-10s %-24s %s%s\n", s_str (k, "id", "?"),
                s_str (k, "kind", "?"), s_str (k, "preset", "-"), s_str (k, "prefix", "-"),
                s_str (k, "expiresAt", "never"), s_str (k, "name", ""),
                json_is_true (json_object_get (k, "revoked")) ? " (revoked)" : "");
    }
    json_decref (answer);
}

static void s_print_revoked (json_t *answer, bool json)
{
    if (json)
        cli_print_json (answer);
    else {
        printf ("key %s revoked\n", s_str (answer, "id", "?"));
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
