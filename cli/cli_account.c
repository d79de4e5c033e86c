/*  cli_account - `sbx account create|list|get|passwd|disable|enable|delete`: the
    operator's accounts, through the broker on the sbx host (schemas/accounts.json).

    Passwords are hashed here (cli_password), never sent. delete is a sequence of the
    usual requests, each step said on stderr: a dry run (the last admin account is
    refused before anything goes), the account disabled (nothing of it starts
    meanwhile), each sandbox deleted as `sbx sandbox delete` does (vmd frees the guest,
    billing closes its meter), each snapshot deleted, then account.delete (its keys and
    connections revoked, the account removed; the log and billing's ledger keep its
    history). Run again after a failure, it goes on where it stopped.
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_password.h"
#include "cli_rest.h"

#include <getopt.h>
#include <jansson.h>
#include <unistd.h>

#define S_TIMEOUT_MS 10000
//  A sandbox's delete waits for its vmd (a guest that was still starting, under TCG).
#define S_DELETE_MS 150000
//  How long delete waits for sandboxes and snapshots on their way somewhere.
#define S_SETTLE_MS (10 * 60 * 1000)

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx account create --email EMAIL [--password-stdin] [--plan PLAN] [--admin]\n"
             "                          [--no-key] [--json]\n"
             "       sbx account list [--json]\n"
             "       sbx account get ACCOUNT [--json]\n"
             "       sbx account passwd ACCOUNT [--password-stdin] [--json]\n"
             "       sbx account disable ACCOUNT [--json]\n"
             "       sbx account enable ACCOUNT [--json]\n"
             "       sbx account delete ACCOUNT [--json]\n"
             "  each takes --data-dir DIR\n\n"
             "ACCOUNT is an account's id (acc_...) or email. These are the operator's commands:\n"
             "they work on the sbx host (as root, or with --data-dir), not through a profile.\n\n"
             "  create   makes an account and, unless --no-key, a first API key with the full\n"
             "           preset (shown once). --password-stdin reads a sign-in password from\n"
             "           the first line of standard input; without it the account signs in\n"
             "           with API keys only.\n"
             "  list     every account: plan, state, admin, sandboxes (not deleted), keys.\n"
             "  get      one account.\n"
             "  passwd   sets the sign-in password (/account, /oauth/authorize), typed twice\n"
             "           at the terminal without echo, or the first line of standard input\n"
             "           with --password-stdin. Passwords have at least 8 characters.\n"
             "  disable  refuses the account's API keys, OAuth connections and sign-ins at once\n"
             "           (unauthenticated, saying the account is disabled), stops its running\n"
             "           sandboxes with their memory kept, and refuses creating or resuming\n"
             "           any. Nothing is deleted.\n"
             "  enable   undoes disable; stopped sandboxes stay stopped until resumed.\n"
             "  delete   disables the account, deletes its sandboxes and snapshots, revokes its\n"
             "           keys and connections and removes it (its email is free again); its\n"
             "           usage stays in billing's ledger (sbx usage --account ACC_ID) and its\n"
             "           events in the log. The last admin account is not deleted. Progress\n"
             "           goes to stderr; run it again if it stopped half way.\n\n"
             "--json prints one line: create {\"account_id\",\"email\",\"plan\",\"key_id\","
             "\"api_key\"};\n"
             "list {\"accounts\":[A,...]}; get, passwd, disable and enable A = {\"account_id\",\n"
             "\"email\",\"plan\",\"admin\",\"state\",\"password\",\"created_at\",\"disabled_at\","
             "\"sandboxes\",\n"
             "\"keys\"}; delete {\"account_id\",\"email\",\"sandboxes\",\"snapshots\","
             "\"keys_revoked\"}.\n");
}

typedef struct {
    const char *verb;
    const char *account; //  the positional ACCOUNT
    const char *email, *plan, *data_dir;
    bool password_stdin, admin, no_key, json;
    char command[48]; //  "sbx account VERB", for messages
} s_args_t;

//  The request as the operator, with the account a listing is for (NULL: none).
static sbx_msg_t *s_request (sbx_msg_type_t type, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    if (request && account) {
        request->caller = calloc (1, sizeof (sbx_caller_t));
        if (request->caller) {
            request->caller->kind = SBX_CALLER_KIND_ADMIN;
            sbx_str_set (&request->caller->account_id, account);
        }
    }
    return request;
}

static json_t *s_account_json (const sbx_account_info_t *a)
{
    return json_pack ("{s:s, s:s, s:s, s:b, s:s, s:b, s:o, s:o, s:I, s:I}", "account_id",
                      a->account_id, "email", a->email, "plan", a->plan, "admin", a->admin, "state",
                      sbx_account_state_name (a->state), "password", a->password, "created_at",
                      cli_json_time (a->created_ms), "disabled_at", cli_json_time (a->disabled_ms),
                      "sandboxes", (json_int_t) a->sandboxes, "keys", (json_int_t) a->keys);
}

static void s_print_account (const sbx_account_info_t *a)
{
    char created[32] = "-", disabled[32] = "";
    if (a->created_ms)
        sbx_clock_iso8601 (a->created_ms, created, sizeof created);
    if (a->disabled_ms)
        sbx_clock_iso8601 (a->disabled_ms, disabled, sizeof disabled);
    printf ("account %s\n"
            "  email:      %s\n"
            "  plan:       %s%s\n"
            "  state:      %s%s%s\n"
            "  sign-in:    %s\n"
            "  sandboxes:  %llu (not deleted)\n"
            "  keys:       %llu (API keys and connections that work)\n"
            "  created:    %s\n",
            a->account_id, a->email, a->plan, a->admin ? " (admin)" : "",
            sbx_account_state_name (a->state), *disabled ? " since " : "", disabled,
            a->password ? "password or API keys" : "API keys only",
            (unsigned long long) a->sandboxes, (unsigned long long) a->keys, created);
}

//  The reply's account, as --json or lines.
static void s_show (const sbx_account_info_t *a, bool json)
{
    if (json)
        cli_print_json (s_account_json (a));
    else
        s_print_account (a);
}

static int s_create (sbx_config_t *config, s_args_t *args)
{
    if (!args->email || args->account) {
        fprintf (stderr, "%s: give --email EMAIL (and no other argument)\n", args->command);
        return 2;
    }
    char *hash = NULL;
    int rc = 0;
    if (args->password_stdin && !(hash = cli_password_hash_new (args->command, true, &rc)))
        return rc;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_account_create_t *body = sbx_msg_account_create (request);
    sbx_str_set (&body->email, args->email);
    sbx_str_set (&body->plan, args->plan);
    body->password_hash = hash;
    body->admin = args->admin;
    body->with_key = !args->no_key;
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_account_create_ok_t *ok = sbx_msg_account_create_ok (reply);
    if (args->json)
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

static int s_list (sbx_config_t *config, s_args_t *args)
{
    if (args->account) {
        fprintf (stderr, "%s: takes no arguments (sbx account get ACCOUNT for one)\n",
                 args->command);
        return 2;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_LIST);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_account_info_list_t *list = &sbx_msg_account_list_ok (reply)->accounts;
    if (args->json) {
        json_t *accounts = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (accounts, s_account_json (&list->items[i]));
        cli_print_json (json_pack ("{s:o}", "accounts", accounts));
    } else {
        printf ("%-16s %-32s %-10s %-9s %-6s %9s %5s  %s\n", "ACCOUNT", "EMAIL", "PLAN", "STATE",
                "ADMIN", "SANDBOXES", "KEYS", "CREATED");
        for (size_t i = 0; i < list->count; i++) {
            sbx_account_info_t *a = &list->items[i];
            char created[32] = "-";
            if (a->created_ms)
                sbx_clock_iso8601 (a->created_ms, created, sizeof created);
            printf ("%-16s %-32s %-10s %-9s %-6s %9llu %5llu  %s\n", a->account_id, a->email,
                    a->plan, sbx_account_state_name (a->state), a->admin ? "yes" : "-",
                    (unsigned long long) a->sandboxes, (unsigned long long) a->keys, created);
        }
    }
    sbx_msg_destroy (&reply);
    return 0;
}

static int s_get (sbx_config_t *config, s_args_t *args)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, args->account);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    if (!reply)
        return cli_fail (&err);
    s_show (sbx_msg_account_get_ok (reply)->account, args->json);
    sbx_msg_destroy (&reply);
    return 0;
}

//  account.update with a new hash (taken) or a state: the account as it is now, or NULL.
static sbx_msg_t *s_update (sbx_config_t *config, const char *account, char *hash,
                            sbx_account_state_t state, sbx_err_t *err)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_UPDATE);
    sbx_account_update_t *body = sbx_msg_account_update (request);
    sbx_str_set (&body->account, account);
    body->password_hash = hash;
    body->state = state;
    return cli_call (config, &request, S_TIMEOUT_MS, err);
}

static int s_passwd (sbx_config_t *config, s_args_t *args)
{
    //  The account first: nobody types a password twice for a typo in the email.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_GET);
    sbx_str_set (&sbx_msg_account_get (request)->account, args->account);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    if (!reply)
        return cli_fail (&err);
    char *id = strdup (sbx_msg_account_get_ok (reply)->account->account_id);
    sbx_msg_destroy (&reply);
    int rc = 0;
    char *hash = id ? cli_password_hash_new (args->command, args->password_stdin, &rc) : NULL;
    if (!hash) {
        free (id);
        return id ? rc : 1;
    }
    reply = s_update (config, id, hash, SBX_ACCOUNT_STATE__UNSET, &err);
    free (id);
    if (!reply)
        return cli_fail (&err);
    sbx_account_info_t *a = sbx_msg_account_update_ok (reply)->account;
    if (args->json)
        s_show (a, true);
    else
        printf ("the sign-in password of %s (%s) is changed: it signs in on /account and "
                "/oauth/authorize with it\n",
                a->email, a->account_id);
    sbx_msg_destroy (&reply);
    return 0;
}

static int s_set_state (sbx_config_t *config, s_args_t *args, bool disable)
{
    sbx_err_t err;
    sbx_msg_t *reply =
        s_update (config, args->account, NULL,
                  disable ? SBX_ACCOUNT_STATE_DISABLED : SBX_ACCOUNT_STATE_ACTIVE, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_account_info_t *a = sbx_msg_account_update_ok (reply)->account;
    if (args->json)
        s_show (a, true);
    else if (disable)
        printf ("account %s (%s) is disabled: its API keys, OAuth connections and sign-ins are "
                "refused, its running sandboxes are stopped (memory kept) and none starts.\n"
                "sbx account enable %s undoes it.\n",
                a->account_id, a->email, a->email);
    else
        printf ("account %s (%s) is enabled: its keys, connections and sign-ins work again; "
                "its stopped sandboxes stay stopped until resumed (sbx sandbox resume ID)\n",
                a->account_id, a->email);
    sbx_msg_destroy (&reply);
    return 0;
}

//  How a delete step went: 0 done, 1 try again later (on its way somewhere), -1 failed
//  (err says why).
static int s_step (sbx_config_t *config, sbx_msg_t **request_p, int timeout_ms, sbx_err_t *err)
{
    sbx_msg_t *reply = cli_call (config, request_p, timeout_ms, err);
    if (reply) {
        sbx_msg_destroy (&reply);
        return 0;
    }
    if (err->code == SBX_E_NOT_FOUND) //  gone meanwhile (an automatic snapshot released)
        return 0;
    if (err->code == SBX_E_FAILED_PRECONDITION || err->code == SBX_E_CONFLICT)
        return 1;
    return -1;
}

static int s_stopped (const s_args_t *args, const char *what, const sbx_err_t *err)
{
    fprintf (stderr,
             "%s: stopped at %s: %s (%s). The account stays disabled; run the command again "
             "to go on.\n",
             args->command, what, err->message, sbx_code_name (err->code));
    return err->code == SBX_E_UNAVAILABLE || err->code == SBX_E_TIMEOUT ? 3 : 1;
}

//  Deletes what `type` (sandbox.list, snapshot.list) lists of the account, until none is
//  left; *deleted counts them. 0, or the exit code.
static int s_delete_all (sbx_config_t *config, s_args_t *args, const char *id, bool sandboxes,
                         uint64_t *deleted)
{
    const char *noun = sandboxes ? "sandbox" : "snapshot";
    uint64_t deadline = sbx_clock_mono_ms () + S_SETTLE_MS;
    zhashx_t *seen = zhashx_new (); //  said once each
    int rc = 0;
    while (rc == 0) {
        sbx_msg_t *request =
            s_request (sandboxes ? SBX_MSG_SANDBOX_LIST : SBX_MSG_SNAPSHOT_LIST, id);
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
        if (!reply) {
            rc = s_stopped (args, sandboxes ? "listing its sandboxes" : "listing its snapshots",
                            &err);
            break;
        }
        size_t count = sandboxes ? sbx_msg_sandbox_list_ok (reply)->sandboxes.count
                                 : sbx_msg_snapshot_list_ok (reply)->snapshots.count;
        bool waiting = false;
        for (size_t i = 0; rc == 0 && i < count; i++) {
            const char *item, *state, *label;
            if (sandboxes) {
                sbx_sandbox_info_t *s = &sbx_msg_sandbox_list_ok (reply)->sandboxes.items[i];
                item = s->id, state = sbx_sandbox_state_name (s->state), label = s->label;
            } else {
                sbx_snapshot_info_t *s = &sbx_msg_snapshot_list_ok (reply)->snapshots.items[i];
                item = s->id, state = sbx_snapshot_state_name (s->state),
                label = sbx_snapshot_kind_name (s->kind);
            }
            const char *was = zhashx_lookup (seen, item);
            if (!was) {
                zhashx_insert (seen, item, (void *) "asked");
                fprintf (stderr, "%s: deleting %s %s (%s, %s)...\n", args->command, noun, item,
                         label ? label : "-", state ? state : "?");
            }
            sbx_msg_t *del =
                sbx_msg_new (sandboxes ? SBX_MSG_SANDBOX_DELETE : SBX_MSG_SNAPSHOT_DELETE);
            if (sandboxes)
                sbx_str_set (&sbx_msg_sandbox_delete (del)->sandbox_id, item);
            else
                sbx_str_set (&sbx_msg_snapshot_delete (del)->snapshot_id, item);
            int step = s_step (config, &del, sandboxes ? S_DELETE_MS : S_TIMEOUT_MS * 3, &err);
            if (step == 0 && !(was && streq (was, "deleted"))) {
                zhashx_update (seen, item, (void *) "deleted"); //  counted once
                (*deleted)++;
            } else if (step == 1)
                waiting = true; //  stopping, saving...: again in a moment
            else {
                char what[120];
                snprintf (what, sizeof what, "%s %s", noun, item);
                rc = s_stopped (args, what, &err);
            }
        }
        sbx_msg_destroy (&reply);
        if (rc || count == 0)
            break;
        //  Listed again until none is left: one on its way (stopping, saving) is asked
        //  again in a moment, and so is one deleted meanwhile that is still listed.
        if (sbx_clock_mono_ms () > deadline) {
            sbx_err_t late;
            sbx_err_set (&late, SBX_E_TIMEOUT, "some %s%s were still there after %d minutes", noun,
                         sandboxes ? "es" : "s", S_SETTLE_MS / 60000);
            rc = s_stopped (args, sandboxes ? "its sandboxes" : "its snapshots", &late);
        } else if (waiting)
            zclock_sleep (1000);
        else
            zclock_sleep (100);
    }
    zhashx_destroy (&seen);
    return rc;
}

static int s_delete (sbx_config_t *config, s_args_t *args)
{
    //  1. May it go at all? (The last admin may not: said before anything is deleted.)
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_DELETE);
    sbx_str_set (&sbx_msg_account_delete (request)->account, args->account);
    sbx_msg_account_delete (request)->dry_run = true;
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    if (!reply)
        return cli_fail (&err);
    char *id = strdup (sbx_msg_account_delete_ok (reply)->account_id);
    char *email = strdup (sbx_msg_account_delete_ok (reply)->email);
    sbx_msg_destroy (&reply);
    int rc = id && email ? 0 : 1;
    //  2. Disabled: nothing of it starts while its sandboxes go.
    if (rc == 0 && !(reply = s_update (config, id, NULL, SBX_ACCOUNT_STATE_DISABLED, &err)))
        rc = s_stopped (args, "disabling it", &err);
    sbx_msg_destroy (&reply);
    if (rc == 0)
        fprintf (stderr, "%s: %s (%s) is disabled: its keys are refused, nothing of it starts\n",
                 args->command, id, email);
    //  3. Its sandboxes and snapshots, through the usual requests.
    uint64_t sandboxes = 0, snapshots = 0;
    if (rc == 0)
        rc = s_delete_all (config, args, id, true, &sandboxes);
    if (rc == 0)
        rc = s_delete_all (config, args, id, false, &snapshots);
    //  4. The account: its keys and connections, its row.
    if (rc == 0) {
        request = sbx_msg_new (SBX_MSG_ACCOUNT_DELETE);
        sbx_str_set (&sbx_msg_account_delete (request)->account, id);
        if (!(reply = cli_call (config, &request, S_TIMEOUT_MS, &err)))
            rc = s_stopped (args, "deleting the account", &err);
    }
    if (rc == 0) {
        uint64_t keys = sbx_msg_account_delete_ok (reply)->keys_revoked;
        if (args->json)
            cli_print_json (json_pack ("{s:s, s:s, s:I, s:I, s:I}", "account_id", id, "email",
                                       email, "sandboxes", (json_int_t) sandboxes, "snapshots",
                                       (json_int_t) snapshots, "keys_revoked", (json_int_t) keys));
        else
            printf ("account %s (%s) is deleted: %llu sandbox%s, %llu snapshot%s, %llu keys and "
                    "connections revoked. Its usage stays in billing's ledger (sbx usage "
                    "--account %s).\n",
                    id, email, (unsigned long long) sandboxes, sandboxes == 1 ? "" : "es",
                    (unsigned long long) snapshots, snapshots == 1 ? "" : "s",
                    (unsigned long long) keys, id);
    }
    sbx_msg_destroy (&reply);
    free (id);
    free (email);
    return rc;
}

int cli_account_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    s_args_t args = {.verb = argv[1]};
    const char *verbs[] = {"create", "list", "get", "passwd", "disable", "enable", "delete", NULL};
    bool known = false;
    for (const char **v = verbs; *v; v++)
        known |= streq (*v, args.verb);
    if (!known) {
        fprintf (stderr, "sbx account: unknown subcommand '%s'\n", args.verb);
        s_usage (stderr);
        return 2;
    }
    snprintf (args.command, sizeof args.command, "sbx account %s", args.verb);
    static struct option options[] = {{"email", required_argument, 0, 'e'},
                                      {"password-stdin", no_argument, 0, 'p'},
                                      {"plan", required_argument, 0, 'P'},
                                      {"admin", no_argument, 0, 'a'},
                                      {"no-key", no_argument, 0, 'n'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'e':
            args.email = optarg;
            break;
        case 'p':
            args.password_stdin = true;
            break;
        case 'P':
            args.plan = optarg;
            break;
        case 'a':
            args.admin = true;
            break;
        case 'n':
            args.no_key = true;
            break;
        case 'd':
            args.data_dir = optarg;
            break;
        case 'j':
            args.json = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    int rest = argc - 1 - optind;
    if (rest > 1) {
        fprintf (stderr, "%s: one ACCOUNT at most (got '%s' too)\n", args.command,
                 argv[1 + optind + 1]);
        return 2;
    }
    args.account = rest ? argv[1 + optind] : NULL;
    bool create = streq (args.verb, "create"), list = streq (args.verb, "list");
    if (!create && !list && !args.account) {
        fprintf (stderr, "%s: give the ACCOUNT (its id acc_... or its email)\n", args.command);
        return 2;
    }
    if (!create && (args.email || args.plan || args.admin || args.no_key)) {
        fprintf (stderr, "%s: --email, --plan, --admin and --no-key are create's\n", args.command);
        return 2;
    }
    if (args.password_stdin && !create && !streq (args.verb, "passwd")) {
        fprintf (stderr, "%s: --password-stdin is create's and passwd's\n", args.command);
        return 2;
    }
    //  Before any password is asked for: away from the host, none of this works.
    if (cli_rest_local_only (args.command, args.data_dir))
        return 2;
    sbx_config_t *config = sbx_config_new (args.data_dir);
    if (!config)
        return 1;
    int rc = create                         ? s_create (config, &args)
             : list                         ? s_list (config, &args)
             : streq (args.verb, "get")     ? s_get (config, &args)
             : streq (args.verb, "passwd")  ? s_passwd (config, &args)
             : streq (args.verb, "disable") ? s_set_state (config, &args, true)
             : streq (args.verb, "enable")  ? s_set_state (config, &args, false)
                                            : s_delete (config, &args);
    sbx_config_destroy (&config);
    return rc;
}
