/*  walletbench - billing's wallet check, one pass over every account, at a given history.

    walletbench DIR ACCOUNTS INTERVALS [PASSES]

    Makes DIR/billing.db through billing's own meter (bill_meter_apply, the events the
    daemon applies from the broker's log): ACCOUNTS accounts with funds, INTERVALS closed
    intervals spread over them (ten sandboxes each, ready then stopped), and one running
    sandbox per account. Then times one check pass (CPU time of this process) with three
    algorithms on the same store, PASSES times each, and prints one JSON line:
    - whole: the check before cdb7a45: each account's whole usage (every interval, cut by
      day) and its ledger's totals;
    - rows: the check from cdb7a45 to aca0ddc: every account's active wallet, its
      charged total and its open intervals, read from the store (bill_meter_funds);
    - memory: bill_funds, this tree's: a tick (the accounts running sandboxes or changed)
      and every tenth tick's pass over all accounts, from memory; and its first pass,
      which reads every account once.
    Every pass's figures are checked against each other (the sum of the balances).
*/
#include "bill_funds.h"
#include "bill_meter.h"
#include "bill_store.h"

#include <time.h>

static uint64_t s_seq = 0;

static void s_apply (bill_meter_t *meter, uint64_t ts, const char *account, sbx_msg_t *msg)
{
    sbx_event_t event = {.seq = ++s_seq, .ts_ms = ts, .account = (char *) account};
    event.type = (char *) sbx_msg_type_name (msg->type);
    sbx_err_t err;
    if (sbx_msg_encode (msg, &event.payload.data, &event.payload.size, &err) ||
        bill_meter_apply (meter, &event)) {
        fprintf (stderr, "walletbench: event %llu not applied\n", (unsigned long long) s_seq);
        exit (1);
    }
    free (event.payload.data);
    sbx_msg_destroy (&msg);
}

static void s_change (bill_meter_t *meter, uint64_t ts, const char *account, const char *sandbox,
                      sbx_sandbox_state_t to)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (msg)->sandbox_id, sandbox);
    sbx_msg_sandbox_changed (msg)->to = to;
    sbx_msg_sandbox_changed (msg)->type = SBX_SANDBOX_TYPE_SMALL;
    s_apply (meter, ts, account, msg);
}

static double s_cpu_ms (void)
{
    struct timespec t;
    clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double) t.tv_sec * 1e3 + (double) t.tv_nsec / 1e6;
}

typedef struct {
    bill_meter_t *meter;
    bill_store_t *store;
    uint64_t now;
    int64_t sum; //  of the balances of the funded accounts
    int told;
} s_pass_t;

//  The check before cdb7a45 (bill_meter_funds at cdb7a45^): the account's whole usage,
//  less its ledger.
static void s_whole (const char *account, void *arg)
{
    s_pass_t *p = arg;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_SYSTEM;
    sbx_str_set (&sbx_msg_usage_get (request)->account, account);
    sbx_msg_t *reply = bill_meter_usage (p->meter, request, p->now);
    uint64_t charged = 0, charged_active = 0;
    sbx_usage_get_ok_t *ok =
        reply->type == SBX_MSG_USAGE_GET_OK ? sbx_msg_usage_get_ok (reply) : NULL;
    if (ok && ok->wallet && bill_store_ledger_totals (p->store, account, NULL, &charged) == 0 &&
        bill_store_wallet_charged (p->store, account, ok->wallet, &charged_active) == 0 &&
        ok->balance_micro_usd + (int64_t) charged_active > 0) {
        p->sum += ok->balance_micro_usd - ((int64_t) ok->micro_usd - (int64_t) charged);
        p->told++;
    }
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
}

//  The check from cdb7a45 to aca0ddc: every account's rows from the store.
static void s_rows (const char *account, void *arg)
{
    s_pass_t *p = arg;
    bool prepaid = false;
    int64_t balance = 0;
    if (bill_meter_funds (p->meter, account, p->now, &prepaid, &balance) == 0 && prepaid) {
        p->sum += balance;
        p->told++;
    }
}

static bool s_memory (const char *account, bool prepaid, int64_t balance, void *arg)
{
    (void) account;
    s_pass_t *p = arg;
    if (prepaid) {
        p->sum += balance;
        p->told++;
    }
    return true;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

//  Prints "name": {n, median, min, max (ms of CPU per pass), told, sum}.
static void s_report (const char *name, double *ms, int n, const s_pass_t *p, bool last)
{
    qsort (ms, (size_t) n, sizeof *ms, s_cmp);
    printf ("\"%s\": {\"n\": %d, \"median_ms\": %.6f, \"min_ms\": %.6f, \"max_ms\": %.6f, "
            "\"told\": %d, \"sum\": %lld}%s",
            name, n, ms[n / 2], ms[0], ms[n - 1], p->told, (long long) p->sum, last ? "" : ", ");
}

int main (int argc, char **argv)
{
    if (argc < 4) {
        fprintf (stderr, "usage: walletbench DIR ACCOUNTS INTERVALS [PASSES]\n");
        return 2;
    }
    const char *dir = argv[1];
    unsigned accounts = (unsigned) atoi (argv[2]);
    unsigned intervals = (unsigned) atoi (argv[3]);
    int passes = argc > 4 ? atoi (argv[4]) : 20;
    if (!accounts || passes < 1 || passes > 10000)
        return 2;
    sbx_log_init ("walletbench", SBX_LOG_WARN);
    char path[4096];
    snprintf (path, sizeof path, "%s/billing.db", dir);
    bill_rates_t rates = {.small = 10, .medium = 20, .large = 40, .wallet_initial = 1000000000};
    bill_store_t *store = bill_store_new (path);
    bill_meter_t *meter = store ? bill_meter_new (store, &rates) : NULL;
    if (!meter)
        return 1;

    //  The history: accounts, closed intervals, then one running sandbox per account.
    double t0 = s_cpu_ms ();
    uint64_t ts = 1000;
    char account[32], sandbox[48];
    for (unsigned a = 0; a < accounts; a++) {
        snprintf (account, sizeof account, "acc_%05u", a);
        sbx_msg_t *msg = sbx_msg_new (SBX_MSG_ACCOUNT_CREATED);
        sbx_str_set (&sbx_msg_account_created (msg)->account_id, account);
        sbx_str_set (&sbx_msg_account_created (msg)->email, account);
        sbx_str_set (&sbx_msg_account_created (msg)->plan, "free");
        s_apply (meter, ts++, account, msg);
    }
    for (unsigned k = 0; k < intervals; k++) {
        snprintf (account, sizeof account, "acc_%05u", k % accounts);
        snprintf (sandbox, sizeof sandbox, "sb_%05u_%u", k % accounts, (k / accounts) % 10);
        s_change (meter, ts, account, sandbox, SBX_SANDBOX_STATE_READY);
        ts += 1000 + k % 700;
        s_change (meter, ts, account, sandbox, SBX_SANDBOX_STATE_STOPPED);
        ts += 10;
    }
    for (unsigned a = 0; a < accounts; a++) {
        snprintf (account, sizeof account, "acc_%05u", a);
        snprintf (sandbox, sizeof sandbox, "sb_%05u_run", a);
        s_change (meter, ts++, account, sandbox, SBX_SANDBOX_STATE_READY);
    }
    double build_ms = s_cpu_ms () - t0;

    double *ms = calloc ((size_t) passes, sizeof *ms);
    printf ("{\"accounts\": %u, \"intervals\": %u, \"running\": %u, \"events\": %llu, "
            "\"build_cpu_ms\": %.1f, ",
            accounts, intervals, accounts, (unsigned long long) s_seq, build_ms);
    s_pass_t whole = {.meter = meter, .store = store, .now = ts + 5000};
    s_pass_t rows = whole, tick = whole, every = whole, first = whole;
    //  whole at a large history is slow: fewer passes there.
    int whole_passes = intervals >= 100000 && passes > 5 ? 5 : passes;
    for (int i = 0; i < whole_passes; i++) {
        whole.sum = whole.told = 0;
        double t = s_cpu_ms ();
        bill_store_accounts (store, s_whole, &whole);
        ms[i] = s_cpu_ms () - t;
    }
    s_report ("whole", ms, whole_passes, &whole, false);
    for (int i = 0; i < passes; i++) {
        rows.sum = rows.told = 0;
        double t = s_cpu_ms ();
        bill_store_accounts (store, s_rows, &rows);
        ms[i] = s_cpu_ms () - t;
    }
    s_report ("rows", ms, passes, &rows, false);
    bill_funds_t *funds = bill_funds_new (meter, store);
    double t = s_cpu_ms ();
    bill_funds_check (funds, first.now, true, s_memory, &first);
    ms[0] = s_cpu_ms () - t;
    s_report ("memory_first", ms, 1, &first, false);
    for (int i = 0; i < passes; i++) {
        tick.sum = tick.told = 0;
        t = s_cpu_ms ();
        bill_funds_check (funds, tick.now, false, s_memory, &tick);
        ms[i] = s_cpu_ms () - t;
    }
    s_report ("memory_tick", ms, passes, &tick, false);
    for (int i = 0; i < passes; i++) {
        every.sum = every.told = 0;
        t = s_cpu_ms ();
        bill_funds_check (funds, every.now, true, s_memory, &every);
        ms[i] = s_cpu_ms () - t;
    }
    s_report ("memory_all", ms, passes, &every, false);
    //  Every algorithm told the same accounts the same balances.
    bool agree = whole.sum == rows.sum && rows.sum == first.sum && first.sum == tick.sum &&
                 tick.sum == every.sum && whole.told == rows.told && rows.told == tick.told;
    printf ("\"agree\": %s}\n", agree ? "true" : "false");
    free (ms);
    bill_funds_destroy (&funds);
    bill_meter_destroy (&meter);
    bill_store_destroy (&store);
    return agree ? 0 : 1;
}
