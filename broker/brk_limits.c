/*  brk_limits - see brk_limits.h */
#include "brk_limits.h"

static uint64_t s_field (sbx_config_t *config, const char *plan, const char *field)
{
    char key[160];
    snprintf (key, sizeof key, "plan.free.%s", field);
    uint64_t free_value = sbx_config_get_uint (config, key, 0);
    snprintf (key, sizeof key, "plan.%s.%s", plan, field);
    return sbx_config_get_uint (config, key, free_value);
}

void brk_limits_plan (sbx_config_t *config, const brk_account_t *account, brk_plan_t *plan)
{
    memset (plan, 0, sizeof *plan);
    const char *name = account->plan && *account->plan ? account->plan : "free";
    if (account->admin || streq (name, "unlimited")) {
        plan->unlimited = true;
        return;
    }
    plan->starts_per_day = s_field (config, name, "starts_per_day");
    plan->running = s_field (config, name, "running");
    plan->ttl_max_s = s_field (config, name, "ttl_max_s");
    plan->ttl_default_s = s_field (config, name, "ttl_default_s");
    plan->requests_per_second = s_field (config, name, "requests_per_second");
    plan->snapshots = s_field (config, name, "snapshots");
    plan->template_bytes = s_field (config, name, "template_bytes");
    //  A default above the maximum would refuse every create that asks for none.
    if (plan->ttl_max_s && plan->ttl_default_s > plan->ttl_max_s)
        plan->ttl_default_s = plan->ttl_max_s;
}

static const char *s_plan_name (const brk_account_t *account)
{
    return account->plan && *account->plan ? account->plan : "free";
}

sbx_msg_t *brk_limits_check_start (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid)
{
    return brk_limits_check_starts (ctx, account, rid, 1);
}

sbx_msg_t *brk_limits_check_starts (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid,
                                    uint64_t starts)
{
    if (account->disabled_ms)
        return sbx_msg_new_error (rid, SBX_E_FAILED_PRECONDITION,
                                  "account %s is disabled: none of its sandboxes start until the "
                                  "operator enables it (sbx account enable %s)",
                                  account->email, account->email);
    bool exhausted = false;
    if (brk_store_account_funds_exhausted (ctx->store, account->id, &exhausted) < 0)
        return sbx_msg_new_error (rid, SBX_E_INTERNAL, "cannot read the account's wallet state");
    if (exhausted)
        return sbx_msg_new_error (rid, SBX_E_INSUFFICIENT_FUNDS,
                                  "the account's wallet is empty; add funds");
    brk_plan_t plan;
    brk_limits_plan (ctx->config, account, &plan);
    if (plan.unlimited)
        return NULL;
    uint64_t now = sbx_clock_now_ms ();
    uint64_t count = 0;
    if (plan.starts_per_day) {
        //  The UTC day: epoch milliseconds have no leap seconds.
        uint64_t midnight = now - now % 86400000ULL;
        if (brk_store_starts_since (ctx->store, account->id, midnight, &count))
            return sbx_msg_new_error (rid, SBX_E_INTERNAL, "cannot count the account's starts");
        if (count >= plan.starts_per_day)
            return sbx_msg_new_error (rid, SBX_E_DAILY_LIMIT_REACHED,
                                      "the %s plan allows %llu starts per day; the count resets "
                                      "at 00:00 UTC",
                                      s_plan_name (account),
                                      (unsigned long long) plan.starts_per_day);
        if (count + starts > plan.starts_per_day)
            return sbx_msg_new_error (
                rid, SBX_E_DAILY_LIMIT_REACHED,
                "the %s plan allows %llu starts per day; %llu left today, "
                "%llu asked for; the count resets at 00:00 UTC",
                s_plan_name (account), (unsigned long long) plan.starts_per_day,
                (unsigned long long) (plan.starts_per_day - count), (unsigned long long) starts);
    }
    if (plan.running) {
        if (brk_store_account_running (ctx->store, account->id, &count))
            return sbx_msg_new_error (rid, SBX_E_INTERNAL, "cannot count the account's sandboxes");
        if (count >= plan.running)
            return sbx_msg_new_error (rid, SBX_E_LIMIT_EXCEEDED,
                                      "the %s plan allows %llu running sandboxes at once; stop or "
                                      "delete one first",
                                      s_plan_name (account), (unsigned long long) plan.running);
        if (count + starts > plan.running)
            return sbx_msg_new_error (rid, SBX_E_LIMIT_EXCEEDED,
                                      "the %s plan allows %llu running sandboxes at once and %llu "
                                      "%s running, so %llu more do not fit; stop or delete some "
                                      "first, or ask for fewer",
                                      s_plan_name (account), (unsigned long long) plan.running,
                                      (unsigned long long) count, count == 1 ? "is" : "are",
                                      (unsigned long long) starts);
    }
    return NULL;
}

sbx_msg_t *brk_limits_ttl (brk_ctx_t *ctx, const brk_account_t *account, uint64_t rid,
                           uint64_t *ttl_s, bool extend)
{
    brk_plan_t plan;
    brk_limits_plan (ctx->config, account, &plan);
    if (plan.unlimited)
        return NULL;
    if (*ttl_s == 0 && !extend)
        *ttl_s = plan.ttl_default_s;
    if (plan.ttl_max_s && *ttl_s > plan.ttl_max_s)
        return sbx_msg_new_error (rid, SBX_E_INVALID_ARGUMENT,
                                  "ttl_s %llu is over the %s plan's maximum of %llu seconds",
                                  (unsigned long long) *ttl_s, s_plan_name (account),
                                  (unsigned long long) plan.ttl_max_s);
    return NULL;
}

void brk_limits_funds (brk_ctx_t *ctx, sbx_msg_t *msg)
{
    sbx_account_funds_t *funds = sbx_msg_account_funds (msg);
    bool was = false;
    int found = brk_store_account_funds_exhausted (ctx->store, funds->account_id, &was);
    if (found != 0) {
        sbx_warn ("billing reports the wallet of unknown account %s", funds->account_id);
        return;
    }
    if (was == funds->exhausted)
        return; //  billing repeats itself every few seconds: only a change is news
    sbx_msg_t *event;
    if (funds->exhausted) {
        event = sbx_msg_new (SBX_MSG_ACCOUNT_FUNDS_EXHAUSTED);
        sbx_str_set (&sbx_msg_account_funds_exhausted (event)->account_id, funds->account_id);
        sbx_msg_account_funds_exhausted (event)->balance_micro_usd = funds->balance_micro_usd;
    } else {
        event = sbx_msg_new (SBX_MSG_ACCOUNT_FUNDS_RESTORED);
        sbx_str_set (&sbx_msg_account_funds_restored (event)->account_id, funds->account_id);
        sbx_msg_account_funds_restored (event)->balance_micro_usd = funds->balance_micro_usd;
    }
    if (brk_events_begin (ctx->events) ||
        brk_store_account_funds_set (ctx->store, funds->account_id, funds->exhausted) != 0 ||
        brk_events_add (ctx->events, &event, funds->account_id, funds->account_id) ||
        brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        sbx_msg_destroy (&event);
        sbx_error ("account=%s cannot record its wallet state", funds->account_id);
        return;
    }
    sbx_info ("account=%s wallet %s (balance %lld µ$)", funds->account_id,
              funds->exhausted ? "empty: starts refused, running sandboxes stop"
                               : "has funds again",
              (long long) funds->balance_micro_usd);
}

//  --------------------------------------------------------------------------
//  Self test: a real broker with a tiny plan; vmd and billing played at the protocol
//  level. Each limit with its code and message, the TTL default and bound, counts that
//  survive a broker restart, and a wallet running out.

#include "brk_server.h"
#include "brk_testkit.h"

#include <assert.h>

//  A vmd that does whatever it is asked at once.
static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    reply = brk_testkit_vm_ok (request);
    if (!reply)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not a vm request");
    sbx_peer_send (peer, &reply);
}

static uint64_t s_rid = 5000;

static char *s_test_account (zsock_t *client, const char *email, const char *plan, bool admin)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, email);
    sbx_str_set (&sbx_msg_account_create (request)->plan, plan);
    sbx_msg_account_create (request)->admin = admin;
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    char *id = strdup (sbx_msg_account_create_ok (reply)->account_id);
    sbx_msg_destroy (&reply);
    return id;
}

//  Creates for `account` as an operator would (the CLI's way), with a TTL.
static sbx_msg_t *s_test_create (zsock_t *client, const char *account, uint64_t ttl_s)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&request->caller->account_id, account);
    sbx_msg_sandbox_create (request)->ttl_s = ttl_s;
    return brk_testkit_call (client, request, ++s_rid);
}

static sbx_msg_t *s_test_ask (zsock_t *client, sbx_msg_type_t type, const char *id, uint64_t ttl_s)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    if (type == SBX_MSG_SANDBOX_STOP)
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, id);
    else if (type == SBX_MSG_SANDBOX_RESUME)
        sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, id);
    else if (type == SBX_MSG_SANDBOX_GET)
        sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, id);
    else {
        sbx_str_set (&sbx_msg_sandbox_extend (request)->sandbox_id, id);
        sbx_msg_sandbox_extend (request)->ttl_s = ttl_s;
    }
    return brk_testkit_call (client, request, ++s_rid);
}

//  The error code of a reply (SBX_OK for a success); checks the message when given.
static bool s_refused (sbx_msg_t **reply_p, sbx_code_t code, const char *text)
{
    sbx_msg_t *reply = *reply_p;
    bool match = reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == code &&
                 (!text || strstr (sbx_msg_error (reply)->message, text));
    if (!match && reply->type == SBX_MSG_ERROR)
        printf ("unexpected: %s\n", sbx_msg_error (reply)->message);
    sbx_msg_destroy (reply_p);
    return match;
}

//  The id of the sandbox a create answered (the reply is destroyed).
static char *s_created (sbx_msg_t **reply_p, uint64_t *expires_p)
{
    sbx_msg_t *reply = *reply_p;
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    sbx_sandbox_info_t *info = sbx_msg_sandbox_create_ok (reply)->sandbox;
    assert (info->state == SBX_SANDBOX_STATE_READY);
    if (expires_p)
        *expires_p = info->expires_ms;
    char *id = strdup (info->id);
    sbx_msg_destroy (reply_p);
    return id;
}

static sbx_sandbox_state_t s_state (zsock_t *client, const char *id, char **reason_p)
{
    sbx_msg_t *reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, id, 0);
    assert (reply->type == SBX_MSG_SANDBOX_GET_OK);
    sbx_sandbox_info_t *info = sbx_msg_sandbox_get_ok (reply)->sandbox;
    sbx_sandbox_state_t state = info->state;
    if (reason_p)
        *reason_p = info->reason ? strdup (info->reason) : NULL;
    sbx_msg_destroy (&reply);
    return state;
}

static size_t s_events (zsock_t *client, const char *prefix)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, prefix);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    size_t count = sbx_msg_events_replay_ok (reply)->events.count;
    sbx_msg_destroy (&reply);
    return count;
}

static zactor_t *s_test_broker (sbx_config_t *config)
{
    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    return server;
}

static void s_funds (zactor_t *billing, const char *account, bool exhausted, int64_t balance)
{
    sbx_msg_t *funds = sbx_msg_new (SBX_MSG_ACCOUNT_FUNDS);
    sbx_str_set (&sbx_msg_account_funds (funds)->account_id, account);
    sbx_msg_account_funds (funds)->exhausted = exhausted;
    sbx_msg_account_funds (funds)->balance_micro_usd = balance;
    brk_testkit_worker_send (billing, &funds);
}

void brk_limits_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/brk_limits_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    assert (sbx_config_set (config, "plan.free.starts_per_day", "3") == 0);
    assert (sbx_config_set (config, "plan.free.running", "2") == 0);
    assert (sbx_config_set (config, "plan.free.ttl_max_s", "600") == 0);
    assert (sbx_config_set (config, "plan.free.ttl_default_s", "60") == 0);
    assert (sbx_config_set (config, "plan.pro.running", "10") == 0);
    assert (sbx_config_set (config, "plan.pro.starts_per_day", "50") == 0);
    assert (sbx_config_set (config, "plan.pro.nonsense", "1") == -1);

    //  Plans from config: pro takes free's TTL bounds; admins and unlimited have none.
    brk_plan_t plan;
    brk_account_t account = {.id = "acc_x", .plan = "pro"};
    brk_limits_plan (config, &account, &plan);
    assert (!plan.unlimited && plan.running == 10 && plan.starts_per_day == 50);
    assert (plan.ttl_max_s == 600 && plan.ttl_default_s == 60);
    account.plan = "unlimited";
    brk_limits_plan (config, &account, &plan);
    assert (plan.unlimited);
    account.plan = "free";
    account.admin = true;
    brk_limits_plan (config, &account, &plan);
    assert (plan.unlimited);

    zactor_t *server = s_test_broker (config);
    zsock_t *client = brk_testkit_dealer (config);
    char *alice = s_test_account (client, "alice@example.com", NULL, false); //  free
    char *bob = s_test_account (client, "bob@example.com", "pro", false);
    char *root = s_test_account (client, "root@example.com", NULL, true);
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 50, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);

    //  TTL: none asked gets the plan's default; over the maximum is refused, naming it.
    uint64_t before = sbx_clock_now_ms ();
    uint64_t expires = 0;
    sbx_msg_t *reply = s_test_create (client, alice, 601);
    assert (s_refused (&reply, SBX_E_INVALID_ARGUMENT, "over the free plan's maximum of 600"));
    reply = s_test_create (client, alice, 0);
    char *one = s_created (&reply, &expires);
    assert (expires >= before + 60000 && expires <= sbx_clock_now_ms () + 60000);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_EXTEND, one, 601);
    assert (s_refused (&reply, SBX_E_INVALID_ARGUMENT, "maximum of 600 seconds"));
    reply = s_test_ask (client, SBX_MSG_SANDBOX_EXTEND, one, 600);
    assert (reply->type == SBX_MSG_SANDBOX_EXTEND_OK);
    sbx_msg_destroy (&reply);

    //  Running: two at once (creating, ready and resuming count; stopped doesn't).
    reply = s_test_create (client, alice, 0);
    char *two = s_created (&reply, NULL);
    reply = s_test_create (client, alice, 0);
    assert (s_refused (&reply, SBX_E_LIMIT_EXCEEDED,
                       "the free plan allows 2 running sandboxes at once; stop or delete one"));
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, one, 0);
    sbx_msg_destroy (&reply);
    //  Starts per day: two creates and this resume make three.
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, one, 0);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, two, 0);
    sbx_msg_destroy (&reply);
    reply = s_test_create (client, alice, 0);
    assert (s_refused (&reply, SBX_E_DAILY_LIMIT_REACHED,
                       "the free plan allows 3 starts per day; the count resets at 00:00 UTC"));
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, two, 0);
    assert (s_refused (&reply, SBX_E_DAILY_LIMIT_REACHED, "3 starts per day"));
    //  Another account's plan is its own; an admin account has no plan limits.
    reply = s_test_create (client, bob, 0);
    char *three = s_created (&reply, NULL);
    for (int i = 0; i < 4; i++) {
        reply = s_test_create (client, root, 0);
        char *id = s_created (&reply, &expires);
        assert (expires == 0); //  no TTL unless asked
        free (id);
    }

    //  A restart: the counts come from the store, not memory.
    zsock_destroy (&client);
    zactor_destroy (&server);
    server = s_test_broker (config);
    client = brk_testkit_dealer (config);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    reply = s_test_create (client, alice, 0);
    assert (s_refused (&reply, SBX_E_DAILY_LIMIT_REACHED, "3 starts per day"));
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, two, 0);
    assert (s_refused (&reply, SBX_E_DAILY_LIMIT_REACHED, NULL));

    //  Bob's wallet runs out: his ready sandbox stops with the reason, his creates and
    //  resumes are refused, one event per change however often billing repeats itself.
    zactor_t *billing = brk_testkit_worker (config, SBX_ROLE_BILLING, "bill-a", 1, NULL, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_BILLING, ++s_rid) < 1)
        zclock_sleep (20);
    s_funds (billing, bob, true, -3);
    s_funds (billing, bob, true, -4);
    char *reason = NULL;
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE_READY;
    for (int tries = 0; tries < 200 && state != SBX_SANDBOX_STATE_STOPPED; tries++) {
        zclock_sleep (20);
        state = s_state (client, three, NULL);
    }
    assert (state == SBX_SANDBOX_STATE_STOPPED);
    s_state (client, three, &reason);
    assert (reason && streq (reason, "wallet empty"));
    free (reason);
    reply = s_test_create (client, bob, 0);
    assert (
        s_refused (&reply, SBX_E_INSUFFICIENT_FUNDS, "the account's wallet is empty; add funds"));
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, three, 0);
    assert (s_refused (&reply, SBX_E_INSUFFICIENT_FUNDS, NULL));
    assert (s_events (client, "account.funds_exhausted") == 1);
    assert (s_state (client, one, NULL) == SBX_SANDBOX_STATE_READY); //  alice's: untouched
    //  The flag survives a restart too.
    zsock_destroy (&client);
    zactor_destroy (&server);
    server = s_test_broker (config);
    client = brk_testkit_dealer (config);
    reply = s_test_create (client, bob, 0);
    assert (s_refused (&reply, SBX_E_INSUFFICIENT_FUNDS, NULL));
    //  Funds again: starts are allowed.
    while (brk_testkit_peer_count (client, SBX_ROLE_BILLING, ++s_rid) < 1 ||
           brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    s_funds (billing, bob, false, 5000000);
    for (int tries = 0; tries < 200 && s_events (client, "account.funds_restored") == 0; tries++)
        zclock_sleep (20);
    assert (s_events (client, "account.funds_restored") == 1);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, three, 0);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
    sbx_msg_destroy (&reply);

    zactor_destroy (&billing);
    zactor_destroy (&vmd);
    free (one);
    free (two);
    free (three);
    free (alice);
    free (bob);
    free (root);
    zsock_destroy (&client);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
