/*  bill_meter - see bill_meter.h */
#include "bill_meter.h"

#include <time.h>

struct _bill_meter_t {
    bill_store_t *store; //  borrowed
    bill_rates_t rates;
    bill_meter_touch_fn *touch_fn;
    void *touch_arg;
    char *touched; //  the account the event being applied changed
};

#define S_DAY_MS 86400000ULL

//  --------------------------------------------------------------------------
//  Rates and rounding

static uint64_t s_config_rate (sbx_config_t *config, const char *key, uint64_t dflt)
{
    return sbx_config_get_uint (config, key, dflt);
}

void bill_meter_rates_from_config (sbx_config_t *config, bill_rates_t *rates)
{
    assert (config && rates);
    rates->small = s_config_rate (config, "rate.small", 10);
    rates->medium = s_config_rate (config, "rate.medium", 20);
    rates->large = s_config_rate (config, "rate.large", 40);
    const char *initial = sbx_config_get (config, "wallet.initial", "0");
    char *end = NULL;
    long long value = initial ? strtoll (initial, &end, 10) : 0;
    rates->wallet_initial = initial && end != initial && !*end ? value : 0;
}

uint64_t bill_meter_cost (uint64_t before, uint64_t ms, uint64_t rate)
{
    //  128 bits: ms × rate can't overflow whatever the inputs.
    unsigned __int128 after = ((unsigned __int128) before + ms) * rate / 1000;
    unsigned __int128 prior = (unsigned __int128) before * rate / 1000;
    return (uint64_t) (after - prior);
}

uint64_t bill_meter_rate (bill_meter_t *self, sbx_sandbox_type_t type)
{
    switch (type) {
    case SBX_SANDBOX_TYPE_MEDIUM:
        return self->rates.medium;
    case SBX_SANDBOX_TYPE_LARGE:
        return self->rates.large;
    default:
        return self->rates.small;
    }
}

static uint64_t s_rate_of (bill_meter_t *self, const char *type_name)
{
    sbx_sandbox_type_t type = SBX_SANDBOX_TYPE_SMALL;
    if (type_name)
        sbx_sandbox_type_from_name (type_name, &type);
    return bill_meter_rate (self, type);
}

bill_meter_t *bill_meter_new (bill_store_t *store, const bill_rates_t *rates)
{
    if (!store || !rates)
        return NULL;
    bill_meter_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->store = store;
    self->rates = *rates;
    return self;
}

void bill_meter_destroy (bill_meter_t **self_p)
{
    assert (self_p);
    if (*self_p)
        free ((*self_p)->touched);
    free (*self_p);
    *self_p = NULL;
}

void bill_meter_set_touch (bill_meter_t *self, bill_meter_touch_fn *fn, void *arg)
{
    assert (self);
    self->touch_fn = fn;
    self->touch_arg = arg;
}

//  Notes the account whose funds the event being applied changes (told after its commit).
static void s_touch (bill_meter_t *self, const char *account)
{
    free (self->touched);
    self->touched = account ? strdup (account) : NULL;
}

//  Tells the listener, once the event is committed.
static void s_touched (bill_meter_t *self, uint64_t after_seq, uint64_t seq)
{
    if (self->touch_fn)
        self->touch_fn (self->touched, after_seq, seq, self->touch_arg);
    s_touch (self, NULL);
}

//  --------------------------------------------------------------------------
//  Applying events

//  Closes the sandbox's open interval at end_ms (the event's time, or earlier when the
//  change took effect before: a host lost): charges it to the account's active wallet
//  (made when the account has none) and adds it to the sandbox's totals.
static int s_close (bill_meter_t *self, const sbx_event_t *event, bill_sandbox_t *sandbox,
                    int64_t interval, uint64_t start_ms, uint64_t end_ms)
{
    //  ts_ms is the broker's commit time and follows seq; guard anyway.
    uint64_t ms = end_ms > start_ms ? end_ms - start_ms : 0;
    uint64_t rate = s_rate_of (self, sandbox->type);
    if (rate != sandbox->rate) {
        //  A new rate starts a new rounding base.
        sandbox->rate = rate;
        sandbox->rate_ms = 0;
    }
    uint64_t before = sandbox->rate_ms;
    uint64_t micro = bill_meter_cost (before, ms, rate);
    char *wallet = NULL;
    int rc = bill_store_wallet_active (self->store, sandbox->account, &wallet, NULL);
    if (rc == 1) {
        rc = bill_store_account_add (self->store, sandbox->account, NULL,
                                     self->rates.wallet_initial, event->ts_ms) ||
                     bill_store_wallet_active (self->store, sandbox->account, &wallet, NULL)
                 ? -1
                 : 0;
    }
    bill_charge_t charge = {.account = sandbox->account,
                            .wallet = wallet,
                            .sandbox_id = sandbox->id,
                            .interval = interval,
                            .seq = event->seq,
                            .ts_ms = event->ts_ms,
                            .ms = ms,
                            .micro = micro};
    if (rc == 0)
        rc = bill_store_interval_close (self->store, interval, event->seq, end_ms, ms, rate, before,
                                        micro) ||
                     bill_store_charge_add (self->store, &charge) ||
                     bill_store_wallet_debit (self->store, wallet, micro)
                 ? -1
                 : 0;
    free (wallet);
    if (rc == 0) {
        sandbox->rate_ms += ms;
        sandbox->total_ms += ms;
        sandbox->total_micro += micro;
        sbx_debug ("sandbox=%s charged %llu ms = %llu µ$ (seq %llu)", sandbox->id,
                   (unsigned long long) ms, (unsigned long long) micro,
                   (unsigned long long) event->seq);
    }
    return rc;
}

static int s_on_changed (bill_meter_t *self, const sbx_event_t *event, sbx_msg_t *msg)
{
    sbx_sandbox_changed_t *changed = sbx_msg_sandbox_changed (msg);
    const char *account = event->account;
    bill_sandbox_t sandbox;
    int found = bill_store_sandbox_find (self->store, changed->sandbox_id, &sandbox);
    if (found < 0)
        return -1;
    if (found == 1) {
        if (!account || !*account) {
            sbx_warn ("event %llu: sandbox.changed without an account: not billed",
                      (unsigned long long) event->seq);
            return 0;
        }
        sandbox.id = strdup (changed->sandbox_id);
        sandbox.account = strdup (account);
        sandbox.type = strdup (sbx_sandbox_type_name (changed->type));
    }
    free (sandbox.state);
    sandbox.state = strdup (sbx_sandbox_state_name (changed->to));
    if (!sandbox.id || !sandbox.account || !sandbox.type || !sandbox.state) {
        bill_sandbox_clear (&sandbox);
        return -1;
    }
    s_touch (self, sandbox.account);
    int64_t interval = 0;
    uint64_t start_ms = 0;
    int open = bill_store_interval_open_find (self->store, sandbox.id, &interval, &start_ms);
    int rc = open < 0 ? -1 : 0;
    //  Put first: intervals reference the sandbox.
    if (rc == 0)
        rc = bill_store_sandbox_put (self->store, &sandbox);
    if (rc == 0 && changed->to == SBX_SANDBOX_STATE_READY && open == 1)
        rc = bill_store_interval_open (self->store, sandbox.id, event->seq, event->ts_ms);
    else if (rc == 0 && changed->to != SBX_SANDBOX_STATE_READY && open == 0)
        rc = s_close (self, event, &sandbox, interval, start_ms,
                      changed->at_ms && changed->at_ms < event->ts_ms ? changed->at_ms
                                                                      : event->ts_ms) ||
                     bill_store_sandbox_put (self->store, &sandbox)
                 ? -1
                 : 0;
    bill_sandbox_clear (&sandbox);
    return rc;
}

//  A top-up: into the named wallet (made when new) or the account's active one. An
//  unknown account's credit is logged and dropped: there is no wallet to put it in.
static int s_on_credited (bill_meter_t *self, const sbx_event_t *event, sbx_msg_t *msg)
{
    sbx_wallet_credited_t *credit = sbx_msg_wallet_credited (msg);
    char *wallet = NULL;
    int rc;
    if (credit->wallet && *credit->wallet) {
        char *known = bill_store_account_resolve (self->store, credit->account_id, NULL);
        rc = !known ? 1
                    : bill_store_wallet_ensure (self->store, credit->account_id, credit->wallet,
                                                event->ts_ms, &wallet);
        free (known);
    } else
        rc = bill_store_wallet_active (self->store, credit->account_id, &wallet, NULL);
    if (rc == 1) {
        sbx_warn ("account=%s credit of %llu µ$ for an account billing doesn't know",
                  credit->account_id, (unsigned long long) credit->micro_usd);
        return 0;
    }
    if (rc == 0)
        rc = bill_store_wallet_credit (self->store, wallet, credit->micro_usd);
    free (wallet);
    s_touch (self, credit->account_id);
    return rc;
}

//  Charges go to another wallet from now on (made, empty, when new).
static int s_on_activated (bill_meter_t *self, const sbx_event_t *event, sbx_msg_t *msg)
{
    sbx_wallet_activated_t *activated = sbx_msg_wallet_activated (msg);
    char *known = bill_store_account_resolve (self->store, activated->account_id, NULL);
    if (!known) {
        sbx_warn ("account=%s wallet %s activated for an account billing doesn't know",
                  activated->account_id, activated->wallet);
        return 0;
    }
    free (known);
    char *wallet = NULL;
    int rc = bill_store_wallet_ensure (self->store, activated->account_id, activated->wallet,
                                       event->ts_ms, &wallet) ||
                     bill_store_wallet_activate (self->store, activated->account_id, wallet)
                 ? -1
                 : 0;
    free (wallet);
    s_touch (self, activated->account_id);
    return rc;
}

int bill_meter_apply (bill_meter_t *self, const sbx_event_t *event)
{
    assert (self && event);
    s_touch (self, NULL);
    if (event->seq <= bill_store_last_seq (self->store))
        return 0; //  applied before (the reader shouldn't send it, the store decides)
    sbx_msg_t *msg = NULL;
    if (event->type &&
        (streq (event->type, "sandbox.changed") || streq (event->type, "account.created") ||
         streq (event->type, "wallet.credited") || streq (event->type, "wallet.activated"))) {
        sbx_err_t err;
        msg = sbx_msg_decode (event->payload.data, event->payload.size, &err);
        if (!msg)
            sbx_error ("event %llu (%s) does not decode, not billed: %s",
                       (unsigned long long) event->seq, event->type, err.message);
    }
    if (bill_store_begin (self->store)) {
        sbx_msg_destroy (&msg);
        return -1;
    }
    //  Again under the write lock: another billing process of a cluster may have applied
    //  it since the check above (sbx_db's BEGIN IMMEDIATE serializes them).
    uint64_t after_seq = bill_store_last_seq (self->store);
    if (event->seq <= after_seq) {
        sbx_msg_destroy (&msg);
        return bill_store_rollback (self->store) == 0 ? 0 : -1;
    }
    int rc = 0;
    if (msg && msg->type == SBX_MSG_SANDBOX_CHANGED)
        rc = s_on_changed (self, event, msg);
    else if (msg && msg->type == SBX_MSG_ACCOUNT_CREATED) {
        rc = bill_store_account_add (self->store, sbx_msg_account_created (msg)->account_id,
                                     sbx_msg_account_created (msg)->email,
                                     self->rates.wallet_initial, event->ts_ms);
        s_touch (self, sbx_msg_account_created (msg)->account_id);
    } else if (msg && msg->type == SBX_MSG_WALLET_CREDITED)
        rc = s_on_credited (self, event, msg);
    else if (msg && msg->type == SBX_MSG_WALLET_ACTIVATED)
        rc = s_on_activated (self, event, msg);
    sbx_msg_destroy (&msg);
    if (rc == 0 && bill_store_set_last_seq (self->store, event->seq) == 0 &&
        bill_store_commit (self->store) == 0) {
        s_touched (self, after_seq, event->seq);
        return 0;
    }
    s_touch (self, NULL); //  nothing of it was applied
    bill_store_rollback (self->store);
    sbx_error ("event %llu (%s) could not be applied", (unsigned long long) event->seq,
               event->type ? event->type : "?");
    return -1;
}

//  --------------------------------------------------------------------------
//  Usage

typedef struct {
    uint64_t day; //  days since the epoch
    uint64_t ms, micro;
} s_day_t;

typedef struct {
    bill_meter_t *meter;
    sbx_usage_get_ok_t *ok;
    uint64_t since, until, now;
    sbx_usage_sandbox_t *current; //  the entry of the sandbox being walked
    s_day_t *days;
    size_t day_count, day_max;
    bool failed;
} s_usage_t;

static void s_add_day (s_usage_t *u, uint64_t day, uint64_t ms, uint64_t micro)
{
    for (size_t i = 0; i < u->day_count; i++)
        if (u->days[i].day == day) {
            u->days[i].ms += ms;
            u->days[i].micro += micro;
            return;
        }
    if (u->day_count == u->day_max) {
        size_t max = u->day_max ? u->day_max * 2 : 16;
        s_day_t *days = realloc (u->days, max * sizeof *days);
        if (!days) {
            u->failed = true;
            return;
        }
        u->days = days;
        u->day_max = max;
    }
    u->days[u->day_count++] = (s_day_t){day, ms, micro};
}

//  Walks one interval: its part inside [since, until), cut at UTC midnights, each piece
//  priced on the sandbox's cumulative line (so closed intervals add up to their charge).
static void s_on_interval (const bill_interval_row_t *row, void *arg)
{
    s_usage_t *u = arg;
    bool open = row->end_seq == 0;
    uint64_t end = open ? (u->now > row->start_ms ? u->now : row->start_ms) : row->end_ms;
    uint64_t rate = row->rate, before = row->rate_ms_before;
    if (open) {
        rate = s_rate_of (u->meter, row->type);
        before = rate == row->sandbox_rate ? row->sandbox_rate_ms : 0;
    }
    if (!u->current || !streq (u->current->sandbox_id, row->sandbox_id)) {
        u->current = sbx_usage_sandbox_list_append (&u->ok->sandboxes);
        if (!u->current || sbx_str_set (&u->current->sandbox_id, row->sandbox_id)) {
            u->failed = true;
            return;
        }
        sbx_sandbox_type_from_name (row->type, &u->current->type);
        sbx_sandbox_state_from_name (row->state, &u->current->state);
    }
    if (open)
        u->current->running = true;
    uint64_t from = row->start_ms > u->since ? row->start_ms : u->since;
    uint64_t to = end < u->until ? end : u->until;
    while (from < to) {
        uint64_t day = from / S_DAY_MS;
        uint64_t cut = (day + 1) * S_DAY_MS < to ? (day + 1) * S_DAY_MS : to;
        uint64_t ms = cut - from;
        uint64_t micro = bill_meter_cost (before + (from - row->start_ms), ms, rate);
        u->current->running_ms += ms;
        u->current->micro_usd += micro;
        s_add_day (u, day, ms, micro);
        from = cut;
    }
}

static int s_day_cmp (const void *a, const void *b)
{
    const s_day_t *x = a, *y = b;
    return x->day < y->day ? -1 : x->day > y->day;
}

//  May this caller see this account's usage? Operators see all; keys and OAuth
//  tokens see their own account only.
static bool s_allowed (const sbx_caller_t *caller, const char *account_id)
{
    if (!caller)
        return false;
    if (caller->kind == SBX_CALLER_KIND_SYSTEM || caller->kind == SBX_CALLER_KIND_ADMIN)
        return true;
    return caller->account_id && streq (caller->account_id, account_id);
}

static void s_on_wallet (const char *name, int64_t balance, bool active, void *arg)
{
    sbx_wallet_info_t *info = sbx_wallet_info_list_append (&((sbx_usage_get_ok_t *) arg)->wallets);
    if (info && sbx_str_set (&info->name, name) == 0) {
        info->balance_micro_usd = balance;
        info->active = active;
    }
}

//  usage.get with sandbox_ids: each one's whole figures from its running totals (the
//  closed intervals, as the ledger charged them) and its open interval, if any; a page
//  of a list costs its size, not the account's history.
static int s_usage_totals (bill_meter_t *self, const char *account, const sbx_strlist_t *ids,
                           uint64_t now_ms, sbx_usage_get_ok_t *ok)
{
    for (size_t i = 0; i < ids->count; i++) {
        bill_sandbox_t sandbox = {0};
        int rc = bill_store_sandbox_find (self->store, ids->items[i], &sandbox);
        if (rc < 0)
            return -1;
        if (rc == 1 || !streq (sandbox.account, account)) {
            bill_sandbox_clear (&sandbox);
            continue;
        }
        uint64_t start_ms = 0;
        rc = bill_store_interval_open_find (self->store, sandbox.id, NULL, &start_ms);
        sbx_usage_sandbox_t *u = rc >= 0 ? sbx_usage_sandbox_list_append (&ok->sandboxes) : NULL;
        if (!u || sbx_str_set (&u->sandbox_id, sandbox.id)) {
            bill_sandbox_clear (&sandbox);
            return -1;
        }
        sbx_sandbox_type_from_name (sandbox.type, &u->type);
        sbx_sandbox_state_from_name (sandbox.state, &u->state);
        u->running_ms = sandbox.total_ms;
        u->micro_usd = sandbox.total_micro;
        if (rc == 0) {
            //  Priced as s_on_open prices it.
            uint64_t rate = s_rate_of (self, sandbox.type);
            uint64_t before = rate == sandbox.rate ? sandbox.rate_ms : 0;
            uint64_t ms = now_ms > start_ms ? now_ms - start_ms : 0;
            u->running = true;
            u->running_ms += ms;
            u->micro_usd += bill_meter_cost (before, ms, rate);
        }
        bill_sandbox_clear (&sandbox);
    }
    return 0;
}

static sbx_msg_t *s_usage (bill_meter_t *self, sbx_msg_t *request, uint64_t now_ms);

sbx_msg_t *bill_meter_usage (bill_meter_t *self, sbx_msg_t *request, uint64_t now_ms)
{
    assert (self && request && request->type == SBX_MSG_USAGE_GET);
    //  The answer's reads in one read transaction: one snapshot, and the file locks taken
    //  once, not by each of its statements (a list's page: two a sandbox).
    int opened = bill_store_read_begin (self->store);
    sbx_msg_t *reply = s_usage (self, request, now_ms);
    bill_store_read_end (self->store, opened);
    return reply;
}

static sbx_msg_t *s_usage (bill_meter_t *self, sbx_msg_t *request, uint64_t now_ms)
{
    sbx_usage_get_t *args = sbx_msg_usage_get (request);
    char *email = NULL;
    char *account = bill_store_account_resolve (self->store, args->account, &email);
    //  An account billing never saw and a stranger's look the same: not found.
    if (!account || !s_allowed (request->caller, account)) {
        free (account);
        free (email);
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                  "no account '%s' is known to billing", args->account);
    }
    bool totals = args->sandbox_ids.count > 0;
    if (totals && (args->since_ms || args->until_ms || (args->sandbox_id && *args->sandbox_id))) {
        free (account);
        free (email);
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "usage.get: sandbox_ids gives whole figures; leave since_ms, "
                                  "until_ms and sandbox_id unset with it");
    }
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *ok = reply ? sbx_msg_usage_get_ok (reply) : NULL;
    s_usage_t u = {.meter = self,
                   .ok = ok,
                   .since = args->since_ms,
                   .until = args->until_ms ? args->until_ms : UINT64_MAX,
                   .now = now_ms};
    int64_t balance = 0;
    bool failed = !ok || sbx_str_set (&ok->account_id, account) ||
                  sbx_str_set (&ok->email, email) ||
                  bill_store_wallet_active (self->store, account, &ok->wallet, &balance) < 0 ||
                  bill_store_wallets (self->store, account, s_on_wallet, ok) < 0 ||
                  (totals ? s_usage_totals (self, account, &args->sandbox_ids, now_ms, ok) < 0
                          : bill_store_intervals (self->store, account, args->sandbox_id,
                                                  s_on_interval, &u) < 0) ||
                  u.failed;
    if (!failed) {
        ok->balance_micro_usd = balance;
        ok->as_of_ms = now_ms;
        ok->last_seq = bill_store_last_seq (self->store);
        for (size_t i = 0; i < ok->sandboxes.count; i++) {
            sbx_usage_sandbox_t *s = &ok->sandboxes.items[i];
            s->seconds = s->running_ms / 1000;
            ok->running_ms += s->running_ms;
            ok->micro_usd += s->micro_usd;
        }
        if (u.day_count) //  qsort wants a non-NULL array even for none
            qsort (u.days, u.day_count, sizeof *u.days, s_day_cmp);
        for (size_t i = 0; i < u.day_count && !failed; i++) {
            sbx_usage_day_t *day = sbx_usage_day_list_append (&ok->days);
            char text[16];
            time_t t = (time_t) (u.days[i].day * 86400);
            struct tm tm;
            if (!day || !gmtime_r (&t, &tm) || !strftime (text, sizeof text, "%Y-%m-%d", &tm) ||
                sbx_str_set (&day->day, text)) {
                failed = true;
                break;
            }
            day->running_ms = u.days[i].ms;
            day->seconds = day->running_ms / 1000;
            day->micro_usd = u.days[i].micro;
        }
    }
    free (u.days);
    free (account);
    free (email);
    if (failed) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                  "billing could not read its ledger");
    }
    return reply;
}

void bill_account_funds_clear (bill_account_funds_t *funds)
{
    assert (funds);
    free (funds->running);
    *funds = (bill_account_funds_t){0};
}

typedef struct {
    bill_meter_t *meter;
    bill_account_funds_t *out;
    bool failed;
} s_read_t;

//  An open interval with what prices it as usage prices it (s_on_interval): the pieces it
//  cuts at midnights add up to its cost from start, the cost being cumulative.
static void s_on_open (const bill_interval_row_t *row, void *arg)
{
    s_read_t *r = arg;
    bill_account_funds_t *out = r->out;
    bill_running_t *running =
        r->failed ? NULL : realloc (out->running, (out->running_count + 1) * sizeof *running);
    if (!running) {
        r->failed = true;
        return;
    }
    out->running = running;
    uint64_t rate = s_rate_of (r->meter, row->type);
    out->running[out->running_count++] = (bill_running_t){
        .start_ms = row->start_ms,
        .rate = rate,
        .before = rate == row->sandbox_rate ? row->sandbox_rate_ms : 0,
    };
}

int bill_meter_funds_read (bill_meter_t *self, const char *account, bill_account_funds_t *out)
{
    assert (self && account && out);
    *out = (bill_account_funds_t){0};
    //  Rows that stay few whatever the history (the active wallet, its charged total, the
    //  open intervals), never the whole ledger.
    char *wallet = NULL;
    uint64_t charged_active = 0;
    s_read_t read = {.meter = self, .out = out};
    int rc = bill_store_wallet_active (self->store, account, &wallet, &out->held);
    if (rc == 0)
        rc = bill_store_wallet_charged (self->store, account, wallet, &charged_active) == 0 &&
                     bill_store_intervals_open (self->store, account, s_on_open, &read) >= 0 &&
                     !read.failed
                 ? 0
                 : -1;
    free (wallet);
    //  What was ever put in the active wallet: its balance plus what the ledger took from
    //  it.
    out->prepaid = out->held + (int64_t) charged_active > 0;
    if (rc)
        bill_account_funds_clear (out);
    return rc;
}

int64_t bill_account_funds_at (const bill_account_funds_t *funds, uint64_t now_ms)
{
    assert (funds);
    //  What running sandboxes used so far is not charged yet: it will be, to the active
    //  wallet.
    uint64_t micro = 0;
    for (size_t i = 0; i < funds->running_count; i++) {
        const bill_running_t *r = &funds->running[i];
        uint64_t ms = now_ms > r->start_ms ? now_ms - r->start_ms : 0;
        micro += bill_meter_cost (r->before, ms, r->rate);
    }
    return funds->held - (int64_t) micro;
}

int bill_meter_funds (bill_meter_t *self, const char *account, uint64_t now_ms, bool *prepaid,
                      int64_t *balance)
{
    assert (self && account && prepaid && balance);
    bill_account_funds_t funds;
    if (bill_meter_funds_read (self, account, &funds))
        return -1;
    *prepaid = funds.prepaid;
    *balance = bill_account_funds_at (&funds, now_ms);
    bill_account_funds_clear (&funds);
    return 0;
}

//  --------------------------------------------------------------------------
//  Self test

static uint64_t s_test_seq = 0;

static int s_test_apply (bill_meter_t *meter, uint64_t ts, const char *account, sbx_msg_t **msg_p)
{
    sbx_event_t event = {.seq = ++s_test_seq, .ts_ms = ts, .account = (char *) account};
    event.type = (char *) sbx_msg_type_name ((*msg_p)->type);
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &data, &size, &err) == 0);
    event.payload.data = data;
    event.payload.size = size;
    int rc = bill_meter_apply (meter, &event);
    free (data);
    sbx_msg_destroy (msg_p);
    return rc;
}

static void s_test_change (bill_meter_t *meter, uint64_t ts, const char *account, const char *id,
                           sbx_sandbox_type_t type, sbx_sandbox_state_t to)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (msg)->sandbox_id, id);
    sbx_msg_sandbox_changed (msg)->to = to;
    sbx_msg_sandbox_changed (msg)->type = type;
    assert (s_test_apply (meter, ts, account, &msg) == 0);
}

static sbx_msg_t *s_test_usage (bill_meter_t *meter, const char *account, const char *sandbox,
                                uint64_t since, uint64_t until, sbx_caller_t *caller, uint64_t now)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    request->rid = 9;
    request->caller = caller;
    sbx_str_set (&sbx_msg_usage_get (request)->account, account);
    sbx_str_set (&sbx_msg_usage_get (request)->sandbox_id, sandbox);
    sbx_msg_usage_get (request)->since_ms = since;
    sbx_msg_usage_get (request)->until_ms = until;
    sbx_msg_t *reply = bill_meter_usage (meter, request, now);
    sbx_msg_destroy (&request);
    assert (reply && reply->rid == 9);
    return reply;
}

static sbx_caller_t *s_test_caller (sbx_caller_kind_t kind, const char *account)
{
    sbx_caller_t *caller = calloc (1, sizeof *caller);
    caller->kind = kind;
    sbx_str_set (&caller->account_id, account);
    return caller;
}

//  The funds as the whole history has them (what bill_meter_funds did before it read
//  only the open intervals): the balance less all usage not in the ledger yet.
static int64_t s_test_funds_whole (bill_meter_t *meter, bill_store_t *store, const char *account,
                                   uint64_t now)
{
    sbx_msg_t *reply = s_test_usage (meter, account, NULL, 0, 0,
                                     s_test_caller (SBX_CALLER_KIND_SYSTEM, NULL), now);
    assert (reply->type == SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
    uint64_t charged = 0;
    assert (bill_store_ledger_totals (store, account, NULL, &charged) == 0);
    int64_t funds = ok->balance_micro_usd - ((int64_t) ok->micro_usd - (int64_t) charged);
    sbx_msg_destroy (&reply);
    return funds;
}

void bill_meter_test (bool verbose)
{
    (void) verbose;
    //  Rounding: pieces always add up to the whole.
    assert (bill_meter_cost (0, 1000, 10) == 10);
    assert (bill_meter_cost (0, 150, 10) == 1);
    assert (bill_meter_cost (150, 150, 10) == 2);
    assert (bill_meter_cost (0, 3600000, 10) == 36000); //  $0.036 an hour
    assert (bill_meter_cost (UINT64_MAX / 2, 1000, 40) == 40);
    uint64_t before = 0, sum = 0;
    for (uint64_t i = 1; i < 2000; i++) {
        uint64_t ms = (i * 7919) % 1237;
        sum += bill_meter_cost (before, ms, 10);
        before += ms;
    }
    assert (sum == before * 10 / 1000);

    char dir[] = "/tmp/bill_meter_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/billing.db", dir);
    bill_store_t *store = bill_store_new (path);
    assert (store);
    bill_rates_t rates = {.small = 10, .medium = 20, .large = 40, .wallet_initial = 1000000};
    bill_meter_t *meter = bill_meter_new (store, &rates);
    assert (meter && bill_meter_rate (meter, SBX_SANDBOX_TYPE_LARGE) == 40);

    sbx_msg_t *created = sbx_msg_new (SBX_MSG_ACCOUNT_CREATED);
    sbx_str_set (&sbx_msg_account_created (created)->account_id, "acc_a");
    sbx_str_set (&sbx_msg_account_created (created)->email, "a@example.com");
    sbx_str_set (&sbx_msg_account_created (created)->plan, "free");
    assert (s_test_apply (meter, 1000, NULL, &created) == 0);

    //  created, ready 2345 ms, stopped, resumed, ready 1001 ms, deleted: 3346 ms, 33 µ$.
    const sbx_sandbox_type_t SMALL = SBX_SANDBOX_TYPE_SMALL;
    s_test_change (meter, 9000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_CREATING);
    s_test_change (meter, 10000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_READY);
    s_test_change (meter, 12345, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_STOPPING);
    s_test_change (meter, 13000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_STOPPED);
    s_test_change (meter, 19000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_RESUMING);
    s_test_change (meter, 20000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_READY);
    s_test_change (meter, 21001, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_DELETING);
    s_test_change (meter, 21500, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_DELETED);
    uint64_t ms = 0, micro = 0;
    assert (bill_store_ledger_totals (store, "acc_a", &ms, &micro) == 0);
    assert (ms == 3346 && micro == 33);
    int64_t balance = 0;
    assert (bill_store_wallet_active (store, "acc_a", NULL, &balance) == 0);
    assert (balance == 1000000 - 33);
    assert (bill_store_last_seq (store) == s_test_seq);

    //  The same events again (a replay overlapping what was applied): nothing changes.
    uint64_t last = s_test_seq;
    s_test_seq = 2;
    s_test_change (meter, 10000, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_READY);
    s_test_change (meter, 12345, "acc_a", "sb_1", SMALL, SBX_SANDBOX_STATE_STOPPING);
    s_test_seq = last;
    assert (bill_store_ledger_totals (store, "acc_a", &ms, &micro) == 0);
    assert (ms == 3346 && micro == 33 && bill_store_last_seq (store) == last);

    //  Across midnight (UTC): two days, priced on one line, adding up to the whole.
    s_test_change (meter, S_DAY_MS - 500, "acc_a", "sb_2", SBX_SANDBOX_TYPE_MEDIUM,
                   SBX_SANDBOX_STATE_READY);
    s_test_change (meter, S_DAY_MS + 1500, "acc_a", "sb_2", SBX_SANDBOX_TYPE_MEDIUM,
                   SBX_SANDBOX_STATE_ERROR);
    //  Still running: measured up to the request.
    s_test_change (meter, S_DAY_MS + 5000, "acc_a", "sb_3", SMALL, SBX_SANDBOX_STATE_READY);

    sbx_msg_t *reply = s_test_usage (meter, "A@example.com", NULL, 0, 0,
                                     s_test_caller (SBX_CALLER_KIND_ADMIN, NULL), S_DAY_MS + 8000);
    assert (reply->type == SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
    assert (streq (ok->account_id, "acc_a") && streq (ok->email, "a@example.com"));
    assert (ok->sandboxes.count == 3);
    sbx_usage_sandbox_t *one = &ok->sandboxes.items[0];
    assert (streq (one->sandbox_id, "sb_1") && one->running_ms == 3346 && one->micro_usd == 33);
    assert (one->seconds == 3 && !one->running && one->state == SBX_SANDBOX_STATE_DELETED);
    sbx_usage_sandbox_t *two = &ok->sandboxes.items[1];
    assert (two->running_ms == 2000 && two->micro_usd == 40 &&
            two->type == SBX_SANDBOX_TYPE_MEDIUM);
    sbx_usage_sandbox_t *three = &ok->sandboxes.items[2];
    assert (three->running && three->running_ms == 3000 && three->micro_usd == 30);
    assert (ok->days.count == 2);
    assert (streq (ok->days.items[0].day, "1970-01-01") && ok->days.items[0].running_ms == 3846);
    assert (ok->days.items[0].micro_usd == 33 + 10);
    assert (streq (ok->days.items[1].day, "1970-01-02") && ok->days.items[1].running_ms == 4500);
    assert (ok->days.items[1].micro_usd == 30 + 30);
    assert (ok->running_ms == 3346 + 2000 + 3000 && ok->micro_usd == 33 + 40 + 30);
    assert (streq (ok->wallet, "wal_acc_a_main") && ok->balance_micro_usd == 1000000 - 73);
    assert (ok->last_seq == s_test_seq && ok->as_of_ms == S_DAY_MS + 8000);
    sbx_msg_destroy (&reply);

    //  sandbox_ids (a list's page): each sandbox's figures from its totals are the walk's,
    //  in the order asked, a stranger's or unknown id left out; not with a window.
    for (uint64_t t = S_DAY_MS + 8000; t < S_DAY_MS + 8000 + 2 * S_DAY_MS; t += S_DAY_MS / 5) {
        sbx_msg_t *walk = s_test_usage (meter, "acc_a", NULL, 0, 0,
                                        s_test_caller (SBX_CALLER_KIND_ADMIN, NULL), t);
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
        request->rid = 9;
        request->caller = s_test_caller (SBX_CALLER_KIND_API_KEY, "acc_a");
        sbx_str_set (&sbx_msg_usage_get (request)->account, "acc_a");
        const char *ids[] = {"sb_3", "sb_nope", "sb_1", "sb_2"};
        for (size_t i = 0; i < 4; i++)
            sbx_strlist_append (&sbx_msg_usage_get (request)->sandbox_ids, ids[i]);
        sbx_msg_t *page = bill_meter_usage (meter, request, t);
        assert (page->type == SBX_MSG_USAGE_GET_OK);
        sbx_usage_get_ok_t *w = sbx_msg_usage_get_ok (walk), *p = sbx_msg_usage_get_ok (page);
        assert (p->sandboxes.count == 3 && p->days.count == 0);
        const size_t order[] = {2, 0, 1}; //  sb_3, sb_1, sb_2 in the walk's order
        for (size_t i = 0; i < 3; i++) {
            sbx_usage_sandbox_t *a = &p->sandboxes.items[i], *b = &w->sandboxes.items[order[i]];
            assert (streq (a->sandbox_id, b->sandbox_id) && a->running_ms == b->running_ms &&
                    a->micro_usd == b->micro_usd && a->running == b->running &&
                    a->type == b->type && a->state == b->state && a->seconds == b->seconds);
        }
        assert (p->running_ms == w->running_ms && p->micro_usd == w->micro_usd);
        sbx_msg_destroy (&page);
        sbx_msg_destroy (&walk);
        sbx_msg_usage_get (request)->since_ms = 1;
        page = bill_meter_usage (meter, request, t);
        assert (page->type == SBX_MSG_ERROR &&
                sbx_msg_error (page)->code == SBX_E_INVALID_ARGUMENT);
        sbx_msg_destroy (&page);
        sbx_msg_destroy (&request);
    }

    //  The wallet as the broker hears of it: the balance less the running sandbox's time
    //  so far (30 µ$, not charged yet); funded, so it is not post-paid.
    bool prepaid = false;
    int64_t funds = 0;
    assert (bill_meter_funds (meter, "acc_a", S_DAY_MS + 8000, &prepaid, &funds) == 0);
    assert (prepaid && funds == 1000000 - 73 - 30);
    assert (s_test_funds_whole (meter, store, "acc_a", S_DAY_MS + 8000) == funds);
    for (uint64_t t = S_DAY_MS + 8000; t < S_DAY_MS + 8000 + 3 * S_DAY_MS; t += S_DAY_MS / 7) {
        assert (bill_meter_funds (meter, "acc_a", t, &prepaid, &funds) == 0);
        assert (s_test_funds_whole (meter, store, "acc_a", t) == funds);
    }
    assert (bill_meter_funds (meter, "acc_nobody", S_DAY_MS, &prepaid, &funds) == -1);

    //  A window and one sandbox; the account's own key; a stranger's key sees nothing.
    reply = s_test_usage (meter, "acc_a", "sb_2", S_DAY_MS, 0,
                          s_test_caller (SBX_CALLER_KIND_API_KEY, "acc_a"), S_DAY_MS + 8000);
    assert (reply->type == SBX_MSG_USAGE_GET_OK);
    ok = sbx_msg_usage_get_ok (reply);
    assert (ok->sandboxes.count == 1 && ok->running_ms == 1500 && ok->micro_usd == 30);
    assert (ok->days.count == 1);
    sbx_msg_destroy (&reply);
    reply = s_test_usage (meter, "acc_a", NULL, 0, 0,
                          s_test_caller (SBX_CALLER_KIND_API_KEY, "acc_b"), S_DAY_MS);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_test_usage (meter, "nobody@example.com", NULL, 0, 0,
                          s_test_caller (SBX_CALLER_KIND_ADMIN, NULL), S_DAY_MS);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  An account billing never saw created still gets a wallet at its first charge.
    s_test_change (meter, 100, "acc_z", "sb_z", SBX_SANDBOX_TYPE_LARGE, SBX_SANDBOX_STATE_READY);
    s_test_change (meter, 1100, "acc_z", "sb_z", SBX_SANDBOX_TYPE_LARGE, SBX_SANDBOX_STATE_STOPPED);
    assert (bill_store_wallet_active (store, "acc_z", NULL, &balance) == 0);
    assert (balance == 1000000 - 40);

    //  Several wallets: a credit to a new name makes it (inactive); charges follow the
    //  active wallet; usage lists them all; funds are the active wallet's.
    sbx_msg_t *credit = sbx_msg_new (SBX_MSG_WALLET_CREDITED);
    sbx_str_set (&sbx_msg_wallet_credited (credit)->account_id, "acc_a");
    sbx_str_set (&sbx_msg_wallet_credited (credit)->wallet, "promo");
    sbx_msg_wallet_credited (credit)->micro_usd = 500;
    assert (s_test_apply (meter, S_DAY_MS + 8000, "acc_a", &credit) == 0);
    sbx_msg_t *activate = sbx_msg_new (SBX_MSG_WALLET_ACTIVATED);
    sbx_str_set (&sbx_msg_wallet_activated (activate)->account_id, "acc_a");
    sbx_str_set (&sbx_msg_wallet_activated (activate)->wallet, "promo");
    assert (s_test_apply (meter, S_DAY_MS + 8500, "acc_a", &activate) == 0);
    //  sb_3 stops: 4000 ms, 40 µ$, all to promo (active when the interval closed).
    s_test_change (meter, S_DAY_MS + 9000, "acc_a", "sb_3", SMALL, SBX_SANDBOX_STATE_STOPPED);
    reply = s_test_usage (meter, "acc_a", NULL, 0, 0, s_test_caller (SBX_CALLER_KIND_ADMIN, NULL),
                          S_DAY_MS + 9000);
    ok = sbx_msg_usage_get_ok (reply);
    assert (streq (ok->wallet, "wal_acc_a_promo") && ok->balance_micro_usd == 460);
    assert (ok->wallets.count == 2);
    assert (streq (ok->wallets.items[0].name, "main") && !ok->wallets.items[0].active &&
            ok->wallets.items[0].balance_micro_usd == 1000000 - 73);
    assert (streq (ok->wallets.items[1].name, "promo") && ok->wallets.items[1].active &&
            ok->wallets.items[1].balance_micro_usd == 460);
    sbx_msg_destroy (&reply);
    assert (bill_meter_funds (meter, "acc_a", S_DAY_MS + 9000, &prepaid, &funds) == 0);
    assert (prepaid && funds == 460);
    assert (s_test_funds_whole (meter, store, "acc_a", S_DAY_MS + 9000) == funds);
    //  Unnamed credits go to the active wallet; wallets of unknown accounts are dropped.
    credit = sbx_msg_new (SBX_MSG_WALLET_CREDITED);
    sbx_str_set (&sbx_msg_wallet_credited (credit)->account_id, "acc_a");
    sbx_msg_wallet_credited (credit)->micro_usd = 40;
    assert (s_test_apply (meter, S_DAY_MS + 9100, "acc_a", &credit) == 0);
    assert (bill_store_wallet_active (store, "acc_a", NULL, &balance) == 0 && balance == 500);
    credit = sbx_msg_new (SBX_MSG_WALLET_CREDITED);
    sbx_str_set (&sbx_msg_wallet_credited (credit)->account_id, "acc_nobody");
    sbx_str_set (&sbx_msg_wallet_credited (credit)->wallet, "x");
    sbx_msg_wallet_credited (credit)->micro_usd = 40;
    assert (s_test_apply (meter, S_DAY_MS + 9200, NULL, &credit) == 0);
    activate = sbx_msg_new (SBX_MSG_WALLET_ACTIVATED);
    sbx_str_set (&sbx_msg_wallet_activated (activate)->account_id, "acc_nobody");
    sbx_str_set (&sbx_msg_wallet_activated (activate)->wallet, "x");
    assert (s_test_apply (meter, S_DAY_MS + 9300, NULL, &activate) == 0);
    assert (bill_store_wallet_active (store, "acc_nobody", NULL, &balance) == 1);

    //  A host lost: the running interval ends at its vmd's last heartbeat (at_ms), not at
    //  the event; back with its host, it runs (and bills) again from then. An at_ms before
    //  the interval began, or not before the event, counts as the event.
    const uint64_t T = 3 * S_DAY_MS;
    s_test_change (meter, T, "acc_l", "sb_l", SMALL, SBX_SANDBOX_STATE_READY);
    sbx_msg_t *lost = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (lost)->sandbox_id, "sb_l");
    sbx_msg_sandbox_changed (lost)->from = SBX_SANDBOX_STATE_READY;
    sbx_msg_sandbox_changed (lost)->to = SBX_SANDBOX_STATE_ERROR;
    sbx_msg_sandbox_changed (lost)->type = SMALL;
    sbx_msg_sandbox_changed (lost)->at_ms = T + 2500;
    assert (s_test_apply (meter, T + 40000, "acc_l", &lost) == 0);
    assert (bill_store_ledger_totals (store, "acc_l", &ms, &micro) == 0 && ms == 2500);
    s_test_change (meter, T + 50000, "acc_l", "sb_l", SMALL, SBX_SANDBOX_STATE_READY);
    lost = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (lost)->sandbox_id, "sb_l");
    sbx_msg_sandbox_changed (lost)->to = SBX_SANDBOX_STATE_ERROR;
    sbx_msg_sandbox_changed (lost)->type = SMALL;
    sbx_msg_sandbox_changed (lost)->at_ms = T + 1000; //  before it ran again: nothing
    assert (s_test_apply (meter, T + 51000, "acc_l", &lost) == 0);
    assert (bill_store_ledger_totals (store, "acc_l", &ms, &micro) == 0 && ms == 2500);
    s_test_change (meter, T + 60000, "acc_l", "sb_l", SMALL, SBX_SANDBOX_STATE_READY);
    lost = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_str_set (&sbx_msg_sandbox_changed (lost)->sandbox_id, "sb_l");
    sbx_msg_sandbox_changed (lost)->to = SBX_SANDBOX_STATE_DELETED;
    sbx_msg_sandbox_changed (lost)->type = SMALL;
    sbx_msg_sandbox_changed (lost)->at_ms = T + 70000; //  not before the event: the event
    assert (s_test_apply (meter, T + 61000, "acc_l", &lost) == 0);
    assert (bill_store_ledger_totals (store, "acc_l", &ms, &micro) == 0 && ms == 3500);

    //  Garbage payloads are skipped (logged), and their seq recorded.
    sbx_event_t junk = {.seq = ++s_test_seq, .ts_ms = 5, .type = "sandbox.changed"};
    junk.payload.data = (uint8_t *) "\xc1";
    junk.payload.size = 1;
    assert (bill_meter_apply (meter, &junk) == 0 && bill_store_last_seq (store) == s_test_seq);

    bill_meter_destroy (&meter);
    bill_meter_destroy (&meter);
    bill_store_destroy (&store);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}
