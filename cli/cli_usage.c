/*  cli_usage - `sbx usage --account E`: an account's running time and cost per sandbox
    and per UTC day, and its wallet balance, as billing metered them (usage.get, routed
    by the broker to sbx-billing).

    Money is printed from integer micro-dollars: micro_usd fields as they are, and usd
    as a decimal string with six places, never through floating point.
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx usage --account ACCOUNT [--sandbox ID] [--since DURATION] [--json]\n"
             "                 [--data-dir DIR]\n"
             "       sbx usage [--sandbox ID] [--json]   (after `sbx login`: your account's)\n\n"
             "Shows an account's (id or email) running time and cost per sandbox and per UTC\n"
             "day, and its wallet balance, as sbx-billing metered them from the event log.\n"
             "Running sandboxes count up to now. --since 24h shows the last 24 hours only.\n"
             "--json prints {\"account_id\",\"email\",\"sandboxes\":[{\"sandbox_id\",\"type\",\n"
             "\"state\",\"running_ms\",\"seconds\",\"micro_usd\",\"usd\",\"running\"}],\"days\":[{"
             "\"day\",\n"
             "\"running_ms\",\"seconds\",\"micro_usd\",\"usd\"}],\"running_ms\",\"seconds\","
             "\"micro_usd\",\n"
             "\"usd\",\"wallet\",\"balance_micro_usd\",\"balance_usd\",\"as_of\",\"last_seq\"}.\n"
             "Through a remote service (sbx login) --json prints REST's GET /v1/usage instead.\n");
}

//  "1.234567" from micro-dollars, exactly.
static const char *s_usd (int64_t micro, char *buf, size_t size)
{
    uint64_t magnitude = micro < 0 ? (uint64_t) 0 - (uint64_t) micro : (uint64_t) micro;
    snprintf (buf, size, "%s%" PRIu64 ".%06" PRIu64, micro < 0 ? "-" : "", magnitude / 1000000,
              magnitude % 1000000);
    return buf;
}

static json_t *s_json (sbx_usage_get_ok_t *ok)
{
    char usd[48];
    json_t *sandboxes = json_array ();
    for (size_t i = 0; i < ok->sandboxes.count; i++) {
        sbx_usage_sandbox_t *s = &ok->sandboxes.items[i];
        json_array_append_new (
            sandboxes,
            json_pack ("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:b}", "sandbox_id", s->sandbox_id,
                       "type", sbx_sandbox_type_name (s->type), "state",
                       sbx_sandbox_state_name (s->state), "running_ms", (json_int_t) s->running_ms,
                       "seconds", (json_int_t) s->seconds, "micro_usd", (json_int_t) s->micro_usd,
                       "usd", s_usd ((int64_t) s->micro_usd, usd, sizeof usd), "running",
                       s->running));
    }
    json_t *days = json_array ();
    for (size_t i = 0; i < ok->days.count; i++) {
        sbx_usage_day_t *d = &ok->days.items[i];
        json_array_append_new (days, json_pack ("{s:s, s:I, s:I, s:I, s:s}", "day", d->day,
                                                "running_ms", (json_int_t) d->running_ms, "seconds",
                                                (json_int_t) d->seconds, "micro_usd",
                                                (json_int_t) d->micro_usd, "usd",
                                                s_usd ((int64_t) d->micro_usd, usd, sizeof usd)));
    }
    char balance[48];
    return json_pack ("{s:s, s:s?, s:o, s:o, s:I, s:I, s:I, s:s, s:s?, s:I, s:s, s:o, s:I}",
                      "account_id", ok->account_id, "email", ok->email, "sandboxes", sandboxes,
                      "days", days, "running_ms", (json_int_t) ok->running_ms, "seconds",
                      (json_int_t) (ok->running_ms / 1000), "micro_usd", (json_int_t) ok->micro_usd,
                      "usd", s_usd ((int64_t) ok->micro_usd, usd, sizeof usd), "wallet", ok->wallet,
                      "balance_micro_usd", (json_int_t) ok->balance_micro_usd, "balance_usd",
                      s_usd (ok->balance_micro_usd, balance, sizeof balance), "as_of",
                      cli_json_time (ok->as_of_ms), "last_seq", (json_int_t) ok->last_seq);
}

static void s_print (sbx_usage_get_ok_t *ok)
{
    char usd[48], balance[48];
    printf ("account %s%s%s%s\n", ok->account_id, ok->email ? " (" : "", ok->email ? ok->email : "",
            ok->email ? ")" : "");
    printf ("%-14s %-7s %-9s %10s %14s\n", "SANDBOX", "TYPE", "STATE", "SECONDS", "USD");
    for (size_t i = 0; i < ok->sandboxes.count; i++) {
        sbx_usage_sandbox_t *s = &ok->sandboxes.items[i];
        printf ("%-14s %-7s %-9s %10" PRIu64 " %14s%s\n", s->sandbox_id,
                sbx_sandbox_type_name (s->type), sbx_sandbox_state_name (s->state), s->seconds,
                s_usd ((int64_t) s->micro_usd, usd, sizeof usd), s->running ? "  (running)" : "");
    }
    printf ("\n%-10s %10s %14s\n", "DAY (UTC)", "SECONDS", "USD");
    for (size_t i = 0; i < ok->days.count; i++)
        printf ("%-10s %10" PRIu64 " %14s\n", ok->days.items[i].day, ok->days.items[i].seconds,
                s_usd ((int64_t) ok->days.items[i].micro_usd, usd, sizeof usd));
    printf ("\ntotal %" PRIu64 " s, $%s; wallet %s balance $%s\n", ok->running_ms / 1000,
            s_usd ((int64_t) ok->micro_usd, usd, sizeof usd), ok->wallet ? ok->wallet : "-",
            s_usd (ok->balance_micro_usd, balance, sizeof balance));
}

//  Through a remote service: REST's usage of the key's account (GET /v1/usage), as it is
//  with --json, else in the same lines as on the host.
static int s_remote (cli_rest_t *remote, const char *sandbox, bool as_json)
{
    json_t *args = sandbox ? json_pack ("{s:s}", "sandboxId", sandbox) : json_object ();
    json_t *answer = NULL;
    sbx_err_t err;
    int rc = cli_rest_call (remote, SBX_OP_GET_USAGE, args, NULL, 0, &answer, NULL, NULL, &err)
                 ? cli_fail (&err)
                 : 0;
    json_decref (args);
    if (rc == 0 && as_json)
        cli_print_json (answer);
    else if (rc == 0) {
        char usd[48], balance[48];
        printf ("account %s\n", json_string_value (json_object_get (answer, "accountId")));
        printf ("%-14s %-7s %10s %14s\n", "SANDBOX", "TYPE", "SECONDS", "USD");
        size_t i;
        json_t *x;
        json_array_foreach (json_object_get (answer, "sandboxes"), i, x)
        {
            printf (
                "%-14s %-7s %10lld %14s%s\n", json_string_value (json_object_get (x, "id")),
                json_string_value (json_object_get (x, "type")),
                (long long) json_integer_value (json_object_get (x, "runningSeconds")),
                s_usd (json_integer_value (json_object_get (x, "costMicroUsd")), usd, sizeof usd),
                json_is_true (json_object_get (x, "running")) ? "  (running)" : "");
        }
        printf ("\n%-10s %10s %14s\n", "DAY (UTC)", "SECONDS", "USD");
        json_array_foreach (json_object_get (answer, "days"), i, x)
        {
            printf (
                "%-10s %10lld %14s\n", json_string_value (json_object_get (x, "day")),
                (long long) json_integer_value (json_object_get (x, "runningSeconds")),
                s_usd (json_integer_value (json_object_get (x, "costMicroUsd")), usd, sizeof usd));
        }
        printf (
            "\ntotal %lld s, $%s; balance $%s\n",
            (long long) json_integer_value (json_object_get (answer, "runningSeconds")),
            s_usd (json_integer_value (json_object_get (answer, "costMicroUsd")), usd, sizeof usd),
            s_usd (json_integer_value (json_object_get (answer, "balanceMicroUsd")), balance,
                   sizeof balance));
        json_decref (answer);
    }
    cli_rest_destroy (&remote);
    return rc;
}

int cli_usage_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"account", required_argument, 0, 'a'},
                                      {"sandbox", required_argument, 0, 's'},
                                      {"since", required_argument, 0, 'S'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL, *account = NULL, *sandbox = NULL, *since = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'a':
            account = optarg;
            break;
        case 's':
            sandbox = optarg;
            break;
        case 'S':
            since = optarg;
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
    cli_rest_t *remote = NULL;
    if (cli_rest_for ("sbx usage", data_dir, &remote))
        return 2;
    if (remote && (account || since)) {
        fprintf (stderr,
                 "sbx usage: through %s it is the API key's account's usage, in "
                 "full: --account and --since are the operator's, on the sbx host\n",
                 cli_rest_url (remote));
        cli_rest_destroy (&remote);
        return 2;
    }
    if (remote && optind == argc)
        return s_remote (remote, sandbox, as_json);
    cli_rest_destroy (&remote);
    if (!account || optind < argc) {
        s_usage (stderr);
        return 2;
    }
    int64_t ago = since ? sbx_clock_parse_duration (since) : 0;
    if (ago < 0) {
        fprintf (stderr, "sbx usage: --since '%s' is not a duration (e.g. 24h)\n", since);
        return 2;
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&request->route, "billing");
    sbx_usage_get_t *args = sbx_msg_usage_get (request);
    sbx_str_set (&args->account, account);
    sbx_str_set (&args->sandbox_id, sandbox);
    uint64_t now = sbx_clock_now_ms ();
    if (ago > 0)
        args->since_ms = now > (uint64_t) ago * 1000 ? now - (uint64_t) ago * 1000 : 0;
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 30000, &err);
    int rc = 0;
    if (!reply)
        rc = cli_fail (&err);
    else if (as_json)
        cli_print_json (s_json (sbx_msg_usage_get_ok (reply)));
    else
        s_print (sbx_msg_usage_get_ok (reply));
    sbx_msg_destroy (&reply);
    sbx_config_destroy (&config);
    return rc;
}
