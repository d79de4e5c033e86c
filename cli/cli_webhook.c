/*  cli_webhook - `sbx webhook create|list|get|delete|deliveries`: an account's webhooks
    (sbx-hookd), through a service (sbx login) as the API key's account, or on the sbx
    host as the operator (--account ACCOUNT_ID for create and list). Both ways build the
    REST operation's arguments and print its answer (sbx_api): one shape everywhere. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"
#include "sbx_api.h"
#include "sbx_args.h"

#include <getopt.h>
#include <jansson.h>

#define S_TIMEOUT_MS 10000

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx webhook create URL [--events TYPE,TYPE…] [--account ACCOUNT_ID]\n"
             "       sbx webhook list [--account ACCOUNT_ID]\n"
             "       sbx webhook get WEBHOOK_ID\n"
             "       sbx webhook delete WEBHOOK_ID\n"
             "       sbx webhook deliveries WEBHOOK_ID [--limit N]\n"
             "       (each also takes [--data-dir DIR] [--json])\n\n"
             "Each event of the account that a webhook takes is POSTed to its URL as JSON,\n"
             "signed with its secret (shown once, at create): Sbx-Signature: t=<unix\n"
             "seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">, and Sbx-Event-Id, the same in\n"
             "every retry. Types: sandbox.created, sandbox.ready, sandbox.stopped,\n"
             "sandbox.resumed, sandbox.deleted, sandbox.error, sandbox.ttl_expired,\n"
             "snapshot.saved, snapshot.deleted (default: all). Failures are retried with backoff (1 s, 2 s, 4 s … up to 1 h, 16 attempts);\n"
             "deliveries shows the log. On the sbx host --account names the account (acc_…);\n"
             "after sbx login it is the API key's. See docs/webhooks.md.\n");
}

static void s_print_hook (json_t *h)
{
    char events[512] = "";
    size_t i;
    json_t *e;
    json_array_foreach (json_object_get (h, "events"), i, e)
    {
        snprintf (events + strlen (events), sizeof events - strlen (events), "%s%s", i ? "," : "",
                  json_string_value (e));
    }
    printf ("%-16s %-9lld %-6lld %-7lld %-20s %s\n", cli_json_str (h, "id", "?"),
            (long long) json_integer_value (json_object_get (h, "delivered")),
            (long long) json_integer_value (json_object_get (h, "failed")),
            (long long) json_integer_value (json_object_get (h, "pending")),
            *events ? events : "all", cli_json_str (h, "url", "?"));
}

//  The answer, as it is with --json, else for people.
static void s_print (sbx_op_t op, json_t *answer, bool json)
{
    if (json) {
        cli_print_json (answer);
        return;
    }
    const char *head = "%-16s %-9s %-6s %-7s %-20s %s\n";
    size_t i;
    json_t *item;
    switch (op) {
    case SBX_OP_CREATE_WEBHOOK:
        printf ("webhook %s for %s; its signing secret, shown only now:\n%s\n",
                cli_json_str (answer, "id", "?"), cli_json_str (answer, "url", "?"),
                cli_json_str (answer, "secret", "?"));
        break;
    case SBX_OP_DELETE_WEBHOOK:
        printf ("webhook %s deleted\n", cli_json_str (answer, "id", "?"));
        break;
    case SBX_OP_LIST_WEBHOOK_DELIVERIES:
        printf ("%-14s %-20s %-10s %-8s %-6s %s\n", "EVENT", "TYPE", "STATE", "ATTEMPTS", "HTTP",
                "LAST ERROR");
        json_array_foreach (json_object_get (answer, "deliveries"), i, item)
        {
            json_t *code = json_object_get (item, "statusCode");
            printf ("%-14s %-20s %-10s %-8lld %-6lld %s\n", cli_json_str (item, "eventId", "?"),
                    cli_json_str (item, "eventType", "?"), cli_json_str (item, "state", "?"),
                    (long long) json_integer_value (json_object_get (item, "attempts")),
                    (long long) (code ? json_integer_value (code) : 0),
                    cli_json_str (item, "lastError", ""));
        }
        break;
    case SBX_OP_LIST_WEBHOOKS:
        printf (head, "WEBHOOK", "DELIVERED", "FAILED", "PENDING", "EVENTS", "URL");
        json_array_foreach (json_object_get (answer, "webhooks"), i, item)
        {
            s_print_hook (item);
        }
        break;
    default:
        printf (head, "WEBHOOK", "DELIVERED", "FAILED", "PENDING", "EVENTS", "URL");
        s_print_hook (answer);
        break;
    }
    json_decref (answer);
}

//  On the sbx host: the operation's message through the broker, as the operator.
static int s_local (const char *data_dir, sbx_op_t op, json_t *args, const char *account,
                    json_t **answer)
{
    char why[300];
    uint32_t deadline = S_TIMEOUT_MS;
    bool agent = false;
    sbx_msg_t *request = sbx_api_request (op, args, NULL, &agent, &deadline, why, sizeof why);
    if (!request) {
        fprintf (stderr, "sbx webhook: %s\n", why);
        return 2;
    }
    if (op == SBX_OP_CREATE_WEBHOOK)
        sbx_str_set (&sbx_msg_webhook_create (request)->account, account);
    else if (op == SBX_OP_LIST_WEBHOOKS)
        sbx_str_set (&sbx_msg_webhook_list (request)->account, account);
    sbx_config_t *config = sbx_config_new (data_dir);
    sbx_api_t *api = sbx_api_new (config);
    if (!config || !api) {
        sbx_api_destroy (&api);
        sbx_config_destroy (&config);
        sbx_msg_destroy (&request);
        return 1;
    }
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, S_TIMEOUT_MS, &err);
    int rc = reply ? 0 : cli_fail (&err);
    if (reply && !(*answer = sbx_api_answer (api, op, args, reply, why, sizeof why))) {
        fprintf (stderr, "sbx webhook: %s\n", why);
        rc = 1;
    }
    sbx_msg_destroy (&reply);
    sbx_api_destroy (&api);
    sbx_config_destroy (&config);
    return rc;
}

int cli_webhook_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static const struct {
        const char *verb;
        sbx_op_t op;
        int positional; //  URL or WEBHOOK_ID
    } s_verbs[] = {{"create", SBX_OP_CREATE_WEBHOOK, 1},
                   {"list", SBX_OP_LIST_WEBHOOKS, 0},
                   {"get", SBX_OP_GET_WEBHOOK, 1},
                   {"delete", SBX_OP_DELETE_WEBHOOK, 1},
                   {"deliveries", SBX_OP_LIST_WEBHOOK_DELIVERIES, 1},
                   {NULL, 0, 0}};
    int v = 0;
    while (s_verbs[v].verb && !streq (s_verbs[v].verb, argv[1]))
        v++;
    if (!s_verbs[v].verb) {
        fprintf (stderr, "sbx webhook: unknown subcommand '%s'\n", argv[1]);
        s_usage (stderr);
        return 2;
    }
    static struct option options[] = {{"events", required_argument, 0, 'e'},
                                      {"account", required_argument, 0, 'a'},
                                      {"limit", required_argument, 0, 'l'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *events = NULL, *account = NULL, *limit = NULL, *data_dir = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'e':
            events = optarg;
            break;
        case 'a':
            account = optarg;
            break;
        case 'l':
            limit = optarg;
            break;
        case 'd':
            data_dir = optarg;
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
    sbx_op_t op = s_verbs[v].op;
    int rest = argc - 1 - optind;
    char **positional = argv + 1 + optind;
    char command[40];
    snprintf (command, sizeof command, "sbx webhook %s", s_verbs[v].verb);
    if (rest != s_verbs[v].positional) {
        fprintf (stderr, "%s: give %s\n", command,
                 s_verbs[v].positional
                     ? (op == SBX_OP_CREATE_WEBHOOK ? "exactly one URL" : "exactly one WEBHOOK_ID")
                     : "no arguments");
        return 2;
    }
    if ((events && op != SBX_OP_CREATE_WEBHOOK) ||
        (limit && op != SBX_OP_LIST_WEBHOOK_DELIVERIES) ||
        (account && op != SBX_OP_CREATE_WEBHOOK && op != SBX_OP_LIST_WEBHOOKS)) {
        fprintf (stderr,
                 "%s: --events is create's, --limit deliveries', --account create's and "
                 "list's\n",
                 command);
        return 2;
    }
    //  The REST operation's arguments, checked as the gateway checks them.
    json_t *args = json_object ();
    if (op == SBX_OP_CREATE_WEBHOOK) {
        json_object_set_new (args, "url", json_string (positional[0]));
        if (events) {
            json_t *list = json_array ();
            char *copy = strdup (events), *save = NULL;
            for (char *t = copy ? strtok_r (copy, ",", &save) : NULL; t;
                 t = strtok_r (NULL, ",", &save))
                json_array_append_new (list, json_string (t));
            free (copy);
            json_object_set_new (args, "events", list);
        }
    } else if (s_verbs[v].positional)
        json_object_set_new (args, "webhookId", json_string (positional[0]));
    if (limit) {
        char *end;
        long long n = strtoll (limit, &end, 10);
        json_object_set_new (args, "limit",
                             *end || !*limit ? json_string (limit) : json_integer (n));
    }
    char why[300];
    if (sbx_args_check (op, SBX_OPS_REST, args, why, sizeof why)) {
        fprintf (stderr, "%s: %s\n", command, why);
        json_decref (args);
        return 2;
    }
    cli_rest_t *remote = NULL;
    if (cli_rest_for (command, data_dir, &remote)) {
        json_decref (args);
        return 2;
    }
    json_t *answer = NULL;
    int rc;
    if (remote) {
        sbx_err_t err;
        if (account) {
            fprintf (stderr,
                     "%s: --account is the operator's, on the sbx host; through %s the "
                     "webhooks are the API key's account's\n",
                     command, cli_rest_url (remote));
            rc = 2;
        } else
            rc = cli_rest_call (remote, op, args, NULL, 0, &answer, NULL, NULL, &err)
                     ? cli_fail (&err)
                     : 0;
        cli_rest_destroy (&remote);
    } else
        rc = s_local (data_dir, op, args, account, &answer);
    if (rc == 0)
        s_print (op, answer, json);
    json_decref (args);
    return rc;
}
