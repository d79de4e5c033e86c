/*  bill_funds - see bill_funds.h */
#include "bill_funds.h"

typedef struct {
    char *id;
    bill_account_funds_t funds; //  the store's rows as of the last event applied to it
    bool due;                   //  fn is called for it at the next pass
} s_account_t;

struct _bill_funds_t {
    bill_meter_t *meter; //  borrowed
    bill_store_t *store; //  borrowed
    zhashx_t *accounts;  //  id → s_account_t, owned: those with an active wallet
    zhashx_t *watched;   //  id → s_account_t, borrowed: running sandboxes, or due
    zhashx_t *changed;   //  id → (unused): to read again at the next pass
    uint64_t seq;        //  the store's last applied event that it holds
    bool stale;          //  read every account at the next pass
};

static void s_account_destroy (s_account_t **self_p)
{
    s_account_t *self = *self_p;
    if (self) {
        bill_account_funds_clear (&self->funds);
        free (self->id);
        free (self);
        *self_p = NULL;
    }
}

//  The meter applied event seq, changing account's funds (NULL: none). Events it did not
//  apply (a gap after the last it told of) were another billing process's: any account
//  may have changed.
static void s_on_touch (const char *account, uint64_t after_seq, uint64_t seq, void *arg)
{
    bill_funds_t *self = arg;
    if (after_seq != self->seq)
        self->stale = true;
    self->seq = seq;
    if (account && !self->stale)
        zhashx_update (self->changed, account, self);
}

bill_funds_t *bill_funds_new (bill_meter_t *meter, bill_store_t *store)
{
    if (!meter || !store)
        return NULL;
    bill_funds_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->meter = meter;
    self->store = store;
    self->accounts = zhashx_new ();
    self->watched = zhashx_new ();
    self->changed = zhashx_new ();
    if (!self->accounts || !self->watched || !self->changed) {
        bill_funds_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->accounts, (zhashx_destructor_fn *) s_account_destroy);
    self->stale = true;
    bill_meter_set_touch (meter, s_on_touch, self);
    return self;
}

void bill_funds_destroy (bill_funds_t **self_p)
{
    assert (self_p);
    bill_funds_t *self = *self_p;
    if (!self)
        return;
    bill_meter_set_touch (self->meter, NULL, NULL);
    zhashx_destroy (&self->watched);
    zhashx_destroy (&self->changed);
    zhashx_destroy (&self->accounts);
    free (self);
    *self_p = NULL;
}

void bill_funds_reload (bill_funds_t *self)
{
    assert (self);
    self->stale = true;
}

size_t bill_funds_size (bill_funds_t *self)
{
    return self ? zhashx_size (self->accounts) : 0;
}

static void s_forget (bill_funds_t *self, const char *id)
{
    zhashx_delete (self->watched, id);
    zhashx_delete (self->accounts, id);
}

//  Reads one account's rows again: 0, or -1 when the store failed (then it is left out
//  until it is read).
static int s_read (bill_funds_t *self, const char *id)
{
    bill_account_funds_t funds;
    int rc = bill_meter_funds_read (self->meter, id, &funds);
    if (rc) {
        s_forget (self, id); //  unknown (no active wallet), or not readable now
        return rc < 0 ? -1 : 0;
    }
    s_account_t *account = zhashx_lookup (self->accounts, id);
    if (!account) {
        account = calloc (1, sizeof *account);
        if (account)
            account->id = strdup (id);
        if (!account || !account->id || zhashx_insert (self->accounts, id, account)) {
            s_account_destroy (&account);
            bill_account_funds_clear (&funds);
            return -1;
        }
    }
    bill_account_funds_clear (&account->funds);
    account->funds = funds;
    account->due = true;
    zhashx_update (self->watched, id, account);
    return 0;
}

static void s_on_account (const char *id, void *arg)
{
    bill_funds_t *self = arg;
    if (s_read (self, id))
        zhashx_update (self->changed, id, self); //  tried again at the next pass
}

//  Brings what it holds up to the store: every account after a reload, else those
//  changed since the last pass. -1 when some could not be read.
static int s_refresh (bill_funds_t *self)
{
    //  One row: did another billing process apply events this one has not seen yet?
    uint64_t last = bill_store_last_seq (self->store);
    if (last != self->seq)
        self->stale = true;
    if (self->stale) {
        self->seq = last; //  read first: what is applied during the reading shows next pass
        zhashx_purge (self->watched);
        zhashx_purge (self->accounts);
        zhashx_purge (self->changed);
        if (bill_store_accounts (self->store, s_on_account, self) < 0)
            return -1;
        self->stale = false;
        return zhashx_size (self->changed) ? -1 : 0;
    }
    int rc = 0;
    zlistx_t *ids = zhashx_keys (self->changed);
    for (const char *id = ids ? zlistx_first (ids) : NULL; id; id = zlistx_next (ids)) {
        if (s_read (self, id) == 0)
            zhashx_delete (self->changed, id);
        else
            rc = -1;
    }
    zlistx_destroy (&ids);
    return ids || !zhashx_size (self->changed) ? rc : -1;
}

int bill_funds_check (bill_funds_t *self, uint64_t now_ms, bool all, bill_funds_fn *fn, void *arg)
{
    assert (self && fn);
    int rc = s_refresh (self);
    if (self->stale)
        return -1;
    //  A pass over every account starts the watch list again from what it finds.
    zhashx_t *visit = all ? self->accounts : self->watched;
    zlistx_t *settled = zlistx_new (); //  accounts to stop watching, after the walk
    if (all)
        zhashx_purge (self->watched);
    int told = 0;
    for (s_account_t *a = zhashx_first (visit); a; a = zhashx_next (visit), told++) {
        a->due = !fn (a->id, a->funds.prepaid, bill_account_funds_at (&a->funds, now_ms), arg);
        bool watch = a->due || a->funds.running_count > 0;
        if (all && watch)
            zhashx_insert (self->watched, a->id, a);
        else if (!all && !watch && settled)
            zlistx_add_end (settled, a->id);
    }
    for (const char *id = settled ? zlistx_first (settled) : NULL; id; id = zlistx_next (settled))
        zhashx_delete (self->watched, id);
    zlistx_destroy (&settled);
    return rc ? -1 : told;
}

//  --------------------------------------------------------------------------
//  Self test

static void s_test_apply (bill_meter_t *meter, uint64_t seq, uint64_t ts, const char *account,
                          sbx_msg_t **msg_p)
{
    sbx_event_t event = {.seq = seq, .ts_ms = ts, .account = (char *) account};
    event.type = (char *) sbx_msg_type_name ((*msg_p)->type);
    sbx_err_t err;
    assert (sbx_msg_encode (*msg_p, &event.payload.data, &event.payload.size, &err) == 0);
    assert (bill_meter_apply (meter, &event) == 0);
    free (event.payload.data);
    sbx_msg_destroy (msg_p);
}

//  A deterministic stream of events over a few accounts: creations, sandboxes moving in
//  and out of ready (a host lost now and then), top-ups, wallets made active. Returns the
//  event's time; `seq` is the next sequence number.
static uint64_t s_test_event (bill_meter_t *meter, uint64_t seq, uint64_t ts, unsigned r)
{
    char account[32], sandbox[32], wallet[32];
    snprintf (account, sizeof account, "acc_%u", r % 7);
    snprintf (sandbox, sizeof sandbox, "sb_%u_%u", r % 7, (r / 7) % 4);
    snprintf (wallet, sizeof wallet, "w%u", (r / 3) % 2);
    sbx_msg_t *msg = NULL;
    unsigned kind = (r / 11) % 20;
    if (kind == 0) {
        msg = sbx_msg_new (SBX_MSG_ACCOUNT_CREATED);
        sbx_str_set (&sbx_msg_account_created (msg)->account_id, account);
        sbx_str_set (&sbx_msg_account_created (msg)->email, account);
        sbx_str_set (&sbx_msg_account_created (msg)->plan, "free");
    } else if (kind == 1) {
        msg = sbx_msg_new (SBX_MSG_WALLET_CREDITED);
        sbx_str_set (&sbx_msg_wallet_credited (msg)->account_id, account);
        if (r % 2)
            sbx_str_set (&sbx_msg_wallet_credited (msg)->wallet, wallet);
        sbx_msg_wallet_credited (msg)->micro_usd = r % 5000;
    } else if (kind == 2) {
        msg = sbx_msg_new (SBX_MSG_WALLET_ACTIVATED);
        sbx_str_set (&sbx_msg_wallet_activated (msg)->account_id, account);
        sbx_str_set (&sbx_msg_wallet_activated (msg)->wallet, r % 3 ? wallet : "main");
    } else {
        const sbx_sandbox_state_t to[] = {SBX_SANDBOX_STATE_READY,    SBX_SANDBOX_STATE_READY,
                                          SBX_SANDBOX_STATE_STOPPING, SBX_SANDBOX_STATE_STOPPED,
                                          SBX_SANDBOX_STATE_ERROR,    SBX_SANDBOX_STATE_DELETED};
        msg = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
        sbx_str_set (&sbx_msg_sandbox_changed (msg)->sandbox_id, sandbox);
        sbx_msg_sandbox_changed (msg)->to = to[(r / 5) % 6];
        sbx_msg_sandbox_changed (msg)->type =
            (sbx_sandbox_type_t) (SBX_SANDBOX_TYPE_SMALL + (r / 28) % 3);
        if (to[(r / 5) % 6] == SBX_SANDBOX_STATE_ERROR)
            sbx_msg_sandbox_changed (msg)->at_ms = ts - r % 3000; //  a host lost
    }
    s_test_apply (meter, seq, ts, account, &msg);
    return ts;
}

typedef struct {
    bill_meter_t *meter;
    bill_store_t *store;
    uint64_t now;
    zhashx_t *told;     //  accounts fn was called for
    const char *refuse; //  an account fn does not deal with
} s_test_pass_t;

//  The funds as the whole history has them (as bill_meter_funds did before it read only
//  what stays few): the active wallet's balance less all usage not in the ledger yet.
static int64_t s_test_whole (bill_meter_t *meter, bill_store_t *store, const char *account,
                             uint64_t now)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_SYSTEM;
    sbx_str_set (&sbx_msg_usage_get (request)->account, account);
    sbx_msg_t *reply = bill_meter_usage (meter, request, now);
    assert (reply->type == SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
    uint64_t charged = 0;
    assert (bill_store_ledger_totals (store, account, NULL, &charged) == 0);
    int64_t funds = ok->balance_micro_usd - ((int64_t) ok->micro_usd - (int64_t) charged);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    return funds;
}

static bool s_test_fn (const char *account, bool prepaid, int64_t balance, void *arg)
{
    s_test_pass_t *t = arg;
    bool store_prepaid = false;
    int64_t store_balance = 0;
    assert (bill_meter_funds (t->meter, account, t->now, &store_prepaid, &store_balance) == 0);
    assert (prepaid == store_prepaid && balance == store_balance);
    assert (balance == s_test_whole (t->meter, t->store, account, t->now));
    zhashx_update (t->told, account, t);
    return !t->refuse || !streq (t->refuse, account);
}

static void s_test_count_open (const bill_interval_row_t *row, void *arg)
{
    (void) row;
    (*(size_t *) arg)++;
}

static void s_test_known (const char *account, void *arg)
{
    s_test_pass_t *t = arg;
    bool prepaid;
    int64_t balance;
    if (bill_meter_funds (t->meter, account, t->now, &prepaid, &balance) == 0)
        zhashx_update (t->told, account, t);
}

//  A pass at now: every account fn hears of agrees with the store and with the whole
//  history; returns how many it heard of. A pass that is not `all` hears at least of every
//  account running sandboxes; `all` hears of every one billing knows.
static int s_test_pass (bill_funds_t *funds, s_test_pass_t *t, uint64_t now, bool all)
{
    t->now = now;
    zhashx_purge (t->told);
    int told = bill_funds_check (funds, now, all, s_test_fn, t);
    assert (told >= 0 && (size_t) told == zhashx_size (t->told));
    zhashx_t *heard = t->told;
    t->told = zhashx_new ();
    bill_store_accounts (t->store, s_test_known, t);
    for (void *item = zhashx_first (t->told); item; item = zhashx_next (t->told)) {
        const char *account = zhashx_cursor (t->told);
        size_t open = 0;
        assert (bill_store_intervals_open (t->store, account, s_test_count_open, &open) >= 0);
        if (all || open)
            assert (zhashx_lookup (heard, account));
    }
    assert (zhashx_size (t->told) == bill_funds_size (funds));
    zhashx_destroy (&t->told);
    t->told = heard;
    return told;
}

void bill_funds_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/bill_funds_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/billing.db", dir);
    bill_rates_t rates = {.small = 10, .medium = 20, .large = 40, .wallet_initial = 20000};
    bill_store_t *store = bill_store_new (path);
    bill_meter_t *meter = bill_meter_new (store, &rates);
    bill_funds_t *funds = bill_funds_new (meter, store);
    assert (funds && bill_funds_size (funds) == 0);
    s_test_pass_t t = {.meter = meter, .store = store, .told = zhashx_new ()};
    assert (s_test_pass (funds, &t, 0, false) == 0);

    //  A stream of events, a pass now and then (across midnights: the pricing cuts days).
    uint64_t ts = 86400000ULL - 600000, seq = 0;
    unsigned r = 12345;
    for (int i = 0; i < 1500; i++) {
        r = r * 1103515245u + 12345u;
        ts += (r >> 8) % 2000;
        s_test_event (meter, ++seq, ts, r >> 4);
        if (i % 37 == 0) {
            s_test_pass (funds, &t, ts + (r >> 12) % 5000, i % 74 == 0);
            //  Nothing changed since: a pass hears of the running accounts only, each
            //  second as its running time grows.
            s_test_pass (funds, &t, ts + 86400000ULL / 3, false);
        }
    }
    assert (bill_funds_size (funds) > 0);
    s_test_pass (funds, &t, ts + 1000, true);

    //  Idle accounts are not visited; one not dealt with is, until it is.
    size_t running = 0;
    for (void *item = zhashx_first (t.told); item; item = zhashx_next (t.told)) {
        size_t open = 0;
        assert (bill_store_intervals_open (store, zhashx_cursor (t.told), s_test_count_open,
                                           &open) >= 0);
        running += open > 0;
    }
    assert (running > 0 && running < bill_funds_size (funds));
    assert ((size_t) s_test_pass (funds, &t, ts + 2000, false) == running);
    const char *idle = NULL;
    for (void *item = zhashx_first (t.told); item && !idle; item = zhashx_next (t.told)) {
        size_t open = 0;
        bill_store_intervals_open (store, zhashx_cursor (t.told), s_test_count_open, &open);
        if (!open)
            idle = zhashx_cursor (t.told);
    }
    //  (Every account fn heard of is running here: find an idle one in the store.)
    bill_funds_destroy (&funds);
    funds = bill_funds_new (meter, store);
    s_test_pass (funds, &t, ts + 2500, false); //  first pass: every account, all due
    for (void *item = zhashx_first (t.told); item && !idle; item = zhashx_next (t.told)) {
        size_t open = 0;
        bill_store_intervals_open (store, zhashx_cursor (t.told), s_test_count_open, &open);
        if (!open)
            idle = zhashx_cursor (t.told);
    }
    assert (idle);
    char *refused = strdup (idle);
    t.refuse = refused;
    assert ((size_t) s_test_pass (funds, &t, ts + 3000, true) == bill_funds_size (funds));
    assert ((size_t) s_test_pass (funds, &t, ts + 4000, false) == running + 1);
    assert (zhashx_lookup (t.told, refused));
    t.refuse = NULL;
    assert ((size_t) s_test_pass (funds, &t, ts + 5000, false) == running + 1);
    assert ((size_t) s_test_pass (funds, &t, ts + 6000, false) == running);
    free (refused);

    //  Billing killed and started again: it reads every account from the store once and
    //  comes to the same figures; the stream goes on.
    bill_funds_destroy (&funds);
    bill_meter_destroy (&meter);
    bill_store_destroy (&store);
    store = bill_store_new (path);
    meter = bill_meter_new (store, &rates);
    funds = bill_funds_new (meter, store);
    t.meter = meter;
    t.store = store;
    s_test_pass (funds, &t, ts + 7000, false);
    assert (zhashx_size (t.told) == bill_funds_size (funds));
    for (int i = 0; i < 300; i++) {
        r = r * 1103515245u + 12345u;
        ts += (r >> 8) % 5000;
        s_test_event (meter, ++seq, ts, r >> 4);
        if (i % 5 == 0)
            s_test_pass (funds, &t, ts + (r >> 12) % 5000, false);
    }

    //  Another billing process (a cluster's, for a moment) applies events on the same
    //  store; this one finds them applied already and reads every account again.
    bill_meter_t *other = bill_meter_new (store, &rates);
    for (int i = 0; i < 20; i++) {
        r = r * 1103515245u + 12345u;
        ts += (r >> 8) % 5000;
        s_test_event (other, seq + 1 + (uint64_t) i, ts, r >> 4);
    }
    s_test_pass (funds, &t, ts, false);
    assert (zhashx_size (t.told) == bill_funds_size (funds));
    s_test_event (meter, seq + 20, ts, r >> 4); //  the last of them, applied already
    s_test_pass (funds, &t, ts + 10, false);
    //  Its own events again, and one of the other's between two of them.
    seq += 20;
    for (int i = 0; i < 40; i++) {
        r = r * 1103515245u + 12345u;
        ts += (r >> 8) % 5000;
        s_test_event (i == 20 ? other : meter, ++seq, ts, r >> 4);
        s_test_pass (funds, &t, ts + (r >> 12) % 5000, false);
        if (i == 20)
            assert (zhashx_size (t.told) == bill_funds_size (funds));
    }
    s_test_pass (funds, &t, ts + 86400000ULL, true);
    bill_meter_destroy (&other);

    zhashx_destroy (&t.told);
    bill_funds_destroy (&funds);
    bill_funds_destroy (&funds);
    bill_meter_destroy (&meter);
    bill_store_destroy (&store);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}
