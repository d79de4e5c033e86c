/*  cli_wallet - `sbx wallet add`: an operator tops up an account's wallet. */
#include "cli_call.h"
#include "cli_commands.h"

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
    fprintf (out, "usage: sbx wallet add --account ACCOUNT --usd AMOUNT [--note TEXT]\n"
                  "                      [--data-dir DIR] [--json]\n\n"
                  "Adds AMOUNT US dollars (e.g. 5 or 0.25, to the micro-dollar) to the account's\n"
                  "active wallet. The credit is an event in the broker's log (wallet.credited):\n"
                  "billing applies it, and an account whose wallet had run out may start\n"
                  "sandboxes again a moment later.\n");
}

int cli_wallet_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!streq (argv[1], "add")) {
        fprintf (stderr, "sbx wallet: unknown subcommand '%s'\n", argv[1]);
        return 2;
    }
    static struct option options[] = {{"account", required_argument, 0, 'a'},
                                      {"usd", required_argument, 0, 'u'},
                                      {"note", required_argument, 0, 'n'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *account = NULL, *usd = NULL, *note = NULL, *data_dir = NULL;
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
    if (!account || micro <= 0) {
        fprintf (stderr, "sbx wallet add: --account and --usd (a positive amount such as 5 or "
                         "0.25) are required\n");
        return 2;
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_WALLET_CREDIT);
    sbx_str_set (&sbx_msg_wallet_credit (request)->account, account);
    sbx_msg_wallet_credit (request)->micro_usd = (uint64_t) micro;
    sbx_str_set (&sbx_msg_wallet_credit (request)->note, note);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 10000, &err);
    sbx_config_destroy (&config);
    if (!reply)
        return cli_fail (&err);
    sbx_wallet_credit_ok_t *ok = sbx_msg_wallet_credit_ok (reply);
    if (json)
        cli_print_json (json_pack ("{s:s, s:I, s:I}", "account_id", ok->account_id, "micro_usd",
                                   (json_int_t) ok->micro_usd, "seq", (json_int_t) ok->seq));
    else
        printf ("added $%llu.%06llu to %s's wallet (event %llu)\n",
                (unsigned long long) (ok->micro_usd / 1000000),
                (unsigned long long) (ok->micro_usd % 1000000), ok->account_id,
                (unsigned long long) ok->seq);
    sbx_msg_destroy (&reply);
    return 0;
}
