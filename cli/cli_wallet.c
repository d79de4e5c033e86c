/*  cli_wallet - `sbx wallet add|use|list`: an operator funds an account's wallets and
    picks the one its charges go to. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"

#include <ctype.h>
#include <getopt.h>

//  "5", "5.25", "0.000010" → micro-dollars, exactly (no floating point). -1 if not that.
static int64_t s_parse_usd (const char *text)
{
    int64_t whole = 0, micro = 0;
    const char *p = text;
    if (!isdigit ((unsigned char) *p))
        return -1;
    for (; isdigit ((unsigned char) *p); p++) {
        whole = whole * 10 + (*p - '0');
        if (whole > 1000000)
            return -1;
    }
    if (*p == '.') {
        int digits = 0;
        for (p++; isdigit ((unsigned char) *p); p++, digits++) {
            if (digits == 6)
                return -1; //  finer than a micro-dollar
            micro = micro * 10 + (*p - '0');
        }
        for (; digits < 6; digits++)
            micro *= 10;
    }
    return *p ? -1 : whole * 1000000 + micro;
}

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx wallet add --account ACCOUNT --usd AMOUNT [--wallet NAME] [--note TEXT]\n"
             "       sbx wallet use --account ACCOUNT --wallet NAME\n"
             "       sbx wallet list --account ACCOUNT\n"
             "every subcommand takes --data-dir DIR and --json.\n\n"
             "An account has wallets; charges go to its active one (\"main\" at first).\n"
             "add: adds AMOUNT US dollars (e.g. 5 or 0.25, to the micro-dollar) to the active\n"
             "wallet, or to the one named (made, inactive, when new).\n"
             "use: makes the named wallet the active one (made, empty, when new).\n"
             "list: each wallet with its balance, as billing has it.\n"
             "add and use are events in the broker's log (wallet.credited, wallet.activated):\n"
             "billing applies them a moment later, and an account whose wallet had run out\n"
             "may start sandboxes again once its active wallet has funds.\n");
}

static void s_money (char *text, size_t size, int64_t micro)
{
    uint64_t magnitude = micro < 0 ? (uint64_t) 0 - (uint64_t) micro : (uint64_t) micro;
    snprintf (text, size, "%s$%llu.%06llu", micro < 0 ? "-" : "",
              (unsigned long long) (magnitude / 1000000),
              (unsigned long long) (magnitude % 1000000));
}

static int s_list (sbx_config_t *config, const char *account, bool json)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&request->route, "billing");
    sbx_str_set (&sbx_msg_usage_get (request)->account, account);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 30000, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
    json_t *list = json_array ();
    for (size_t i = 0; i < ok->wallets.count; i++) {
        sbx_wallet_info_t *w = &ok->wallets.items[i];
        char money[48];
        s_money (money, sizeof money, w->balance_micro_usd);
        if (json)
            json_array_append_new (
                list, json_pack ("{s:s, s:I, s:b}", "name", w->name, "balance_micro_usd",
                                 (json_int_t) w->balance_micro_usd, "active", w->active));
        else
            printf ("%-32s %16s%s\n", w->name, money, w->active ? "  (active)" : "");
    }
    if (json)
        cli_print_json (json_pack ("{s:s, s:o}", "account_id", ok->account_id, "wallets", list));
    else
        json_decref (list);
    sbx_msg_destroy (&reply);
    return 0;
}

int cli_wallet_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    if (!streq (verb, "add") && !streq (verb, "use") && !streq (verb, "list")) {
        fprintf (stderr, "sbx wallet: unknown subcommand '%s' (add, use or list)\n", verb);
        return 2;
    }
    static struct option options[] = {
        {"account", required_argument, 0, 'a'},  {"usd", required_argument, 0, 'u'},
        {"wallet", required_argument, 0, 'w'},   {"note", required_argument, 0, 'n'},
        {"data-dir", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *account = NULL, *usd = NULL, *wallet = NULL, *note = NULL, *data_dir = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'a':
            account = optarg;
            break;
        case 'u':
            usd = optarg;
            break;
        case 'w':
            wallet = optarg;
            break;
        case 'n':
            note = optarg;
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
    int64_t micro = usd ? s_parse_usd (usd) : -1;
    if (!account || (streq (verb, "add") && micro <= 0) || (streq (verb, "use") && !wallet)) {
        fprintf (stderr, "sbx wallet %s: %s are required\n", verb,
                 streq (verb, "add")   ? "--account and --usd (a positive amount such as 5 or "
                                         "0.25)"
                 : streq (verb, "use") ? "--account and --wallet"
                                       : "--account");
        return 2;
    }
    if (cli_rest_local_only ("sbx wallet", data_dir))
        return 2;
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    if (streq (verb, "list")) {
        int rc = s_list (config, account, json);
        sbx_config_destroy (&config);
        return rc;
    }
    sbx_msg_t *request;
    if (streq (verb, "add")) {
        request = sbx_msg_new (SBX_MSG_WALLET_CREDIT);
        sbx_str_set (&sbx_msg_wallet_credit (request)->account, account);
        sbx_msg_wallet_credit (request)->micro_usd = (uint64_t) micro;
        sbx_str_set (&sbx_msg_wallet_credit (request)->note, note);
        sbx_str_set (&sbx_msg_wallet_credit (request)->wallet, wallet);
    } else {
        request = sbx_msg_new (SBX_MSG_WALLET_ACTIVATE);
        sbx_str_set (&sbx_msg_wallet_activate (request)->account, account);
        sbx_str_set (&sbx_msg_wallet_activate (request)->wallet, wallet);
    }
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 10000, &err);
    sbx_config_destroy (&config);
    if (!reply)
        return cli_fail (&err);
    if (reply->type == SBX_MSG_WALLET_ACTIVATE_OK) {
        sbx_wallet_activate_ok_t *ok = sbx_msg_wallet_activate_ok (reply);
        if (json)
            cli_print_json (json_pack ("{s:s, s:s, s:I}", "account_id", ok->account_id, "wallet",
                                       ok->wallet, "seq", (json_int_t) ok->seq));
        else
            printf ("%s's charges now go to wallet %s (event %llu)\n", ok->account_id, ok->wallet,
                    (unsigned long long) ok->seq);
    } else {
        sbx_wallet_credit_ok_t *ok = sbx_msg_wallet_credit_ok (reply);
        char money[48];
        s_money (money, sizeof money, (int64_t) ok->micro_usd);
        if (json)
            cli_print_json (json_pack ("{s:s, s:s?, s:I, s:I}", "account_id", ok->account_id,
                                       "wallet", ok->wallet, "micro_usd",
                                       (json_int_t) ok->micro_usd, "seq", (json_int_t) ok->seq));
        else
            printf ("added %s to %s's %s wallet (event %llu)\n", money, ok->account_id,
                    ok->wallet ? ok->wallet : "active", (unsigned long long) ok->seq);
    }
    sbx_msg_destroy (&reply);
    return 0;
}
