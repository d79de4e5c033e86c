/*  gw_account - see gw_account.h */
#include "gw_account.h"
#include "sbx_idmap.h"
#include "gw_broker.h"
#include "gw_pages.h"
#include "gw_session.h"
#include "gw_signin.h"
#include "sbx_secret.h"

#include <assert.h>
#include <time.h>

#define S_BROKER_MS 10000

struct gw_account_t {
    gw_http_t *http;
    gw_auth_t *auth; //  the gateway's (borrowed): a revoke forgets its cached answers
    gw_broker_t *broker;
    gw_session_t *session;
    gw_signin_t *signin;
    zhashx_t *jobs; //  serial → s_job_t
    uint64_t next_serial;
};

//  One request waiting for the broker or the sign-in.
typedef struct {
    gw_account_t *account;
    uint64_t serial;
    uint64_t req_id;
    zhashx_t *form;
    sbx_caller_t caller; //  the signed-in account (kind session)
    char *account_id;
    char *email;
    char *new_key;    //  a key just created, shown once
    char *usage_html; //  billing's part of the page, made before the key list is asked for
    uint64_t broker_handle;
    uint64_t signin_handle;
} s_job_t;

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (!job)
        return;
    gw_broker_cancel (job->account->broker, job->broker_handle);
    gw_signin_cancel (job->account->signin, job->signin_handle);
    zhashx_destroy (&job->form);
    free (job->account_id);
    free (job->email);
    if (job->new_key)
        sbx_secret_wipe (job->new_key);
    free (job->new_key);
    free (job->usage_html);
    free (job);
    *job_p = NULL;
}

static void s_job_end (s_job_t *job)
{
    zhashx_delete (job->account->jobs, (void *) (uintptr_t) job->serial);
    s_job_free (&job);
}

static gw_request_t *s_job_req (s_job_t *job)
{
    gw_request_t *req = gw_http_request (job->account->http, job->req_id);
    if (!req)
        s_job_end (job);
    return req;
}

//  A broker answer came: its handle is spent. The job's request, or NULL (job ended).
static gw_request_t *s_job_answered (s_job_t *job)
{
    job->broker_handle = 0;
    return s_job_req (job);
}

//  Sends request (taken) for the signed-in account; fn gets the job.
static void s_job_send (s_job_t *job, sbx_msg_t **request_p, gw_broker_fn *fn)
{
    GW_KEEP (job->broker_handle,
             gw_broker_send (job->account->broker, &job->caller, request_p, S_BROKER_MS, fn, job));
}

static const char *s_field (s_job_t *job, const char *name)
{
    const char *value = job->form ? zhashx_lookup (job->form, name) : NULL;
    return value && *value ? value : NULL;
}

//  A broker error on an error page: "<lead>: <message> (<code>)."
static void s_broker_error (gw_request_t *req, int status, const char *title, const char *lead,
                            sbx_code_t code, const char *message)
{
    char text[600];
    snprintf (text, sizeof text, "%s: %s (%s).", lead, message ? message : "",
              sbx_code_name (code));
    gw_pages_respond_error (req, status, title, text);
}

//  Back to the page with a GET (POST, redirect, GET: a reload never repeats a change).
static void s_back (gw_request_t *req)
{
    gw_request_add_header (req, "Location", "/account");
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_respond (req, 303, "text/plain", "see /account\n", 13);
}

static void s_signin_page (gw_account_t *self, gw_request_t *req, int status, const char *error)
{
    char *csrf = gw_session_csrf (self->session, req, NULL);
    gw_pages_field_t fields[] = {{"csrf", csrf}};
    gw_pages_respond (req, status, gw_pages_signin ("/account", fields, 1, NULL, error));
    free (csrf);
}

static void s_time (uint64_t ms, char *out, size_t size)
{
    if (!ms) {
        snprintf (out, size, "never");
        return;
    }
    time_t t = (time_t) (ms / 1000);
    struct tm tm;
    gmtime_r (&t, &tm);
    strftime (out, size, "%Y-%m-%d %H:%M UTC", &tm);
}

static void s_on_list (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_request_t *req = s_job_answered (job);
    if (!req)
        return;
    if (!reply) {
        s_broker_error (req, code == SBX_E_NOT_FOUND ? 404 : 503, "Try again later",
                        "Your keys cannot be listed now", code, message);
        s_job_end (job);
        return;
    }
    sbx_key_info_list_t *list = &sbx_msg_key_list_ok (reply)->keys;
    gw_pages_key_t *keys = calloc (list->count + 1, sizeof *keys);
    char (*times)[2][40] = calloc (list->count + 1, sizeof *times);
    if (!keys || !times) {
        free (keys);
        free (times);
        gw_pages_respond (req, 500, NULL);
        s_job_end (job);
        return;
    }
    for (size_t i = 0; i < list->count; i++) {
        sbx_key_info_t *k = &list->items[i];
        s_time (k->created_ms, times[i][0], sizeof times[i][0]);
        s_time (k->last_used_ms, times[i][1], sizeof times[i][1]);
        keys[i] = (gw_pages_key_t){.key_id = k->key_id,
                                   .kind = sbx_key_kind_name (k->kind),
                                   .name = k->name,
                                   .preset = sbx_key_preset_name (k->preset),
                                   .prefix = k->prefix,
                                   .created = times[i][0],
                                   .last_used = times[i][1],
                                   .revoked = k->revoked};
    }
    char *csrf = gw_session_csrf (job->account->session, req, job->account_id);
    gw_pages_respond (req, 200,
                      gw_pages_account (csrf, job->email, job->usage_html, keys, list->count,
                                        job->new_key, job->new_key ? "Key created." : NULL));
    free (csrf);
    free (keys);
    free (times);
    s_job_end (job);
}

static void s_money (char *out, size_t size, int64_t micro)
{
    uint64_t magnitude = micro < 0 ? (uint64_t) 0 - (uint64_t) micro : (uint64_t) micro;
    snprintf (out, size, "%s$%llu.%06llu", micro < 0 ? "-" : "",
              (unsigned long long) (magnitude / 1000000),
              (unsigned long long) (magnitude % 1000000));
}

//  Billing's figures (or why there are none: the page still shows the keys), then the
//  key list.
static void s_on_usage (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    if (!s_job_answered (job))
        return;
    gw_pages_usage_t usage = {0};
    char note[600], cost[48], balance[48];
    gw_pages_wallet_t *wallets = NULL;
    gw_pages_day_t *days = NULL;
    char (*money)[48] = NULL;
    sbx_usage_get_ok_t *ok = reply ? sbx_msg_usage_get_ok (reply) : NULL;
    if (ok) {
        wallets = calloc (ok->wallets.count + 1, sizeof *wallets);
        days = calloc (ok->days.count + 1, sizeof *days);
        money = calloc (ok->wallets.count + ok->days.count + 1, sizeof *money);
    }
    if (!ok || !wallets || !days || !money) {
        snprintf (note, sizeof note, "Usage is not available right now: %s (%s).",
                  ok        ? "out of memory"
                  : message ? message
                            : "",
                  sbx_code_name (code));
        usage.unavailable = note;
    } else {
        s_money (cost, sizeof cost, (int64_t) ok->micro_usd);
        s_money (balance, sizeof balance, ok->balance_micro_usd);
        usage.seconds = ok->running_ms / 1000;
        usage.cost = cost;
        usage.balance = balance;
        for (size_t i = 0; i < ok->wallets.count; i++) {
            s_money (money[i], sizeof money[i], ok->wallets.items[i].balance_micro_usd);
            wallets[i] = (gw_pages_wallet_t){ok->wallets.items[i].name, money[i],
                                             ok->wallets.items[i].active};
        }
        for (size_t i = 0; i < ok->days.count; i++) {
            char *m = money[ok->wallets.count + i];
            s_money (m, 48, (int64_t) ok->days.items[i].micro_usd);
            days[i] = (gw_pages_day_t){ok->days.items[i].day, ok->days.items[i].seconds, m};
        }
        usage.wallets = wallets;
        usage.wallet_count = ok->wallets.count;
        usage.days = days;
        usage.day_count = ok->days.count;
    }
    job->usage_html = gw_pages_usage (&usage);
    free (wallets);
    free (days);
    free (money);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_KEY_LIST);
    sbx_str_set (&sbx_msg_key_list (request)->account, job->account_id);
    s_job_send (job, &request, s_on_list);
}

//  Asks billing for the account's usage, then lists its keys, then renders the page.
static void s_list (s_job_t *job)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&sbx_msg_usage_get (request)->account, job->account_id);
    s_job_send (job, &request, s_on_usage);
}

static void s_on_created (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_request_t *req = s_job_answered (job);
    if (!req)
        return;
    if (!reply) {
        s_broker_error (req, sbx_code_http_status (code), "Key not created",
                        "The key was not created", code, message);
        s_job_end (job);
        return;
    }
    job->new_key = strdup (sbx_msg_key_create_ok (reply)->key);
    s_list (job);
}

static void s_on_revoked (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    //  Disconnected: refused by this gateway from the next request on.
    if (reply && job->account->auth)
        gw_auth_forget_key (job->account->auth, sbx_msg_key_revoke_ok (reply)->key_id);
    gw_request_t *req = s_job_answered (job);
    if (!req)
        return;
    if (!reply)
        s_broker_error (req, sbx_code_http_status (code), "Not revoked", "Nothing was revoked",
                        code, message);
    else {
        sbx_info ("account=%s revoked %s on the account page", job->account_id,
                  sbx_msg_key_revoke_ok (reply)->key_id);
        s_back (req);
    }
    s_job_end (job);
}

static void s_on_signin (const char *account_id, const char *email, int status, const char *error,
                         void *arg)
{
    s_job_t *job = arg;
    job->signin_handle = 0;
    gw_request_t *req = s_job_req (job);
    if (!req)
        return;
    if (account_id) {
        gw_session_sign_in (job->account->session, req, account_id, email);
        s_back (req);
    } else
        s_signin_page (job->account, req, status, error);
    s_job_end (job);
}

static s_job_t *s_job_new (gw_account_t *self, gw_request_t *req, zhashx_t **form_p)
{
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        zhashx_destroy (form_p);
        return NULL;
    }
    job->account = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    job->form = form_p ? *form_p : NULL;
    if (form_p)
        *form_p = NULL;
    job->caller.kind = SBX_CALLER_KIND_SESSION;
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    return job;
}

static void s_post (gw_account_t *self, gw_request_t *req, char *account_id, char *email)
{
    char why[300];
    if (!gw_session_origin_ok (self->session, req, why, sizeof why)) {
        free (account_id);
        free (email);
        sbx_warn ("account: a form was refused: %s", why);
        gw_pages_respond_foreign (req, why);
        return;
    }
    zhashx_t *form = gw_session_form ((const char *) gw_request_body (req));
    const char *csrf = form ? zhashx_lookup (form, "csrf") : NULL;
    const char *asked = form ? zhashx_lookup (form, "action") : NULL;
    bool signin = asked && streq (asked, "signin");
    if (form && !signin && !account_id) {
        //  Signed out meanwhile: nothing is done, the sign-in page needs no token.
        zhashx_destroy (&form);
        free (email);
        s_signin_page (self, req, 200, "Your session has ended; sign in again.");
        return;
    }
    //  The sign-in form's token is the browser's; the others' the signed-in person's too.
    if (!form || !gw_session_csrf_ok (self->session, req, signin ? NULL : account_id, csrf)) {
        zhashx_destroy (&form);
        free (account_id);
        free (email);
        gw_pages_respond_error (req, 403, "This form has expired",
                                "The form was not sent from this site's page for you, or it "
                                "is too old (permission_denied). Open /account again.");
        return;
    }
    s_job_t *job = s_job_new (self, req, &form);
    if (!job) {
        free (account_id);
        free (email);
        gw_pages_respond (req, 500, NULL);
        return;
    }
    job->account_id = account_id;
    job->email = email;
    job->caller.account_id = account_id;
    const char *action = s_field (job, "action");
    action = action ? action : "";
    if (streq (action, "signin")) {
        GW_KEEP (job->signin_handle, gw_signin_start (self->signin, s_field (job, "email"),
                                                      s_field (job, "password"), s_on_signin, job));
        return;
    }
    if (streq (action, "signout")) {
        gw_session_sign_in (self->session, req, NULL, NULL);
        s_back (req);
        s_job_end (job);
        return;
    }
    if (streq (action, "revoke") && s_field (job, "key_id")) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_KEY_REVOKE);
        sbx_str_set (&sbx_msg_key_revoke (request)->key_id, s_field (job, "key_id"));
        s_job_send (job, &request, s_on_revoked);
    } else if (streq (action, "create")) {
        sbx_key_preset_t preset = SBX_KEY_PRESET_FULL;
        const char *name = s_field (job, "name");
        if ((s_field (job, "preset") &&
             sbx_key_preset_from_name (s_field (job, "preset"), &preset)) ||
            (name && strlen (name) > 100)) {
            gw_pages_respond_error (req, 400, "Key not created",
                                    "Pick a preset from the list and a name of at most 100 "
                                    "characters.");
            s_job_end (job);
            return;
        }
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_KEY_CREATE);
        sbx_key_create_t *args = sbx_msg_key_create (request);
        sbx_str_set (&args->account, job->account_id);
        args->preset = preset;
        sbx_str_set (&args->name, name ? name : "created on the account page");
        s_job_send (job, &request, s_on_created);
    } else {
        gw_pages_respond_error (req, 400, "Unknown action", "Use the buttons of the page.");
        s_job_end (job);
    }
}

bool gw_account_handle (gw_account_t *self, gw_request_t *req)
{
    if (!streq (gw_request_path (req), "/account"))
        return false;
    const char *method = gw_request_method (req);
    char *account_id = NULL, *email = NULL;
    gw_session_account (self->session, req, &account_id, &email);
    if (streq (method, "POST")) {
        s_post (self, req, account_id, email);
        return true;
    }
    if (!streq (method, "GET") && !streq (method, "HEAD")) {
        gw_request_add_header (req, "Allow", "GET, POST");
        gw_pages_respond_error (req, 405, "Method not allowed", "Use GET or POST on /account.");
    } else if (!account_id)
        s_signin_page (self, req, 200, NULL);
    else {
        s_job_t *job = s_job_new (self, req, NULL);
        if (job) {
            job->account_id = account_id;
            job->email = email;
            job->caller.account_id = account_id;
            account_id = email = NULL;
            s_list (job);
        } else
            gw_pages_respond (req, 500, NULL);
    }
    free (account_id);
    free (email);
    return true;
}

static void s_route (gw_request_t *req, void *arg)
{
    gw_account_handle ((gw_account_t *) arg, req);
}

gw_account_t *gw_account_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_account_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = ctx->http;
    self->auth = ctx->auth;
    self->broker = ctx->broker;
    self->session = ctx->signin;
    self->signin = gw_signin_new (ctx->loop, self->broker, "account");
    self->jobs = sbx_idmap_new ();
    if (!self->signin || !self->jobs ||
        gw_router_add (ctx->router, "/account", false, s_route, self)) {
        gw_account_destroy (&self);
        return NULL;
    }
    //  One pool and throttle for both sign-in pages (gw_verify.h).
    if (ctx->verify)
        gw_signin_set_verify (self->signin, ctx->verify);
    self->next_serial = 1;
    return self;
}

void gw_account_destroy (gw_account_t **self_p)
{
    assert (self_p);
    gw_account_t *self = *self_p;
    if (!self)
        return;
    if (self->jobs) {
        for (s_job_t *job = zhashx_first (self->jobs); job; job = zhashx_next (self->jobs))
            s_job_free (&job);
        zhashx_destroy (&self->jobs);
    }
    gw_signin_destroy (&self->signin);
    free (self);
    *self_p = NULL;
}

void gw_account_test (bool verbose)
{
    (void) verbose;
    char text[40];
    s_time (0, text, sizeof text);
    assert (streq (text, "never"));
    s_time (1796011555000ULL, text, sizeof text);
    assert (streq (text, "2026-11-30 04:05 UTC"));
    zloop_t *loop = zloop_new ();
    gw_ctx_t *ctx = gw_ctx_new (NULL, loop, NULL, NULL);
    gw_account_t *account = ctx ? gw_account_new (ctx) : NULL;
    assert (account);
    gw_account_destroy (&account);
    gw_account_destroy (&account);
    gw_ctx_destroy (&ctx);
    zloop_destroy (&loop);
}
