/*  gw_account - see gw_account.h */
#include "gw_account.h"
#include "gw_broker.h"
#include "gw_console.h"
#include "gw_pages.h"
#include "gw_session.h"
#include "gw_signin.h"
#include "sbx_idmap.h"
#include "sbx_secret.h"
#include "sbx_urls.h"

#include <assert.h>
#include <time.h>

#define S_BROKER_MS 10000

struct gw_account_t {
    gw_http_t *http;
    gw_auth_t *auth; //  the gateway's (borrowed): a revoke forgets its cached answers
    gw_broker_t *broker;
    gw_session_t *session;
    gw_signin_t *signin;
    gw_ops_t *ops;  //  the sandbox and snapshot operations, as REST runs them
    char *base_url; //  where clients reach this service (the Connect snippets)
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
    char *new_key; //  a key just created, shown once
    //  The page's parts as they come (usage, keys, sandboxes, snapshots), each its
    //  figures or {"error": why}.
    json_t *usage, *keys, *sandboxes, *snapshots;
    size_t metrics_next; //  the sandbox whose samples are asked for next (s_next_metrics)
    uint64_t broker_handle;
    uint64_t signin_handle;
    uint64_t ops_handle;
} s_job_t;

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (!job)
        return;
    gw_broker_cancel (job->account->broker, job->broker_handle);
    gw_signin_cancel (job->account->signin, job->signin_handle);
    gw_ops_cancel (job->account->ops, job->ops_handle);
    zhashx_destroy (&job->form);
    free (job->account_id);
    free (job->email);
    if (job->new_key)
        sbx_secret_wipe (job->new_key);
    free (job->new_key);
    json_decref (job->usage);
    json_decref (job->keys);
    json_decref (job->sandboxes);
    json_decref (job->snapshots);
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

static void s_signin_page (gw_account_t *self, gw_request_t *req, int status, const char *email,
                           const char *error)
{
    char *csrf = gw_session_csrf (self->session, req, NULL);
    gw_pages_field_t fields[] = {{"csrf", csrf}};
    gw_pages_respond (req, status, gw_pages_signin ("/account", fields, 1, NULL, email, error));
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

//  "<lead>: <message> (<code>)." as the part's {"error": …}.
static json_t *s_part_error (const char *lead, sbx_code_t code, const char *message)
{
    char text[600];
    snprintf (text, sizeof text, "%s: %s (%s).", lead, message ? message : "",
              sbx_code_name (code));
    return json_pack ("{s:s}", "error", text);
}

static const char *s_part_why (const json_t *part)
{
    const char *why = json_string_value (json_object_get (part, "error"));
    return why ? why : part ? NULL : "Not available right now (out of memory).";
}

static void s_money (char *out, size_t size, int64_t micro)
{
    uint64_t magnitude = micro < 0 ? (uint64_t) 0 - (uint64_t) micro : (uint64_t) micro;
    snprintf (out, size, "%s$%llu.%06llu", micro < 0 ? "-" : "",
              (unsigned long long) (magnitude / 1000000),
              (unsigned long long) (magnitude % 1000000));
}

//  Where a sandbox's URL links on the console: its owner page (gw_box), with the owner
//  token that page needs (the box host never sees the session cookie), unless port 80
//  is published publicly: then the URL serves the guest's own page, which gets no token.
static void s_owner_urls (s_job_t *job, json_t *sandboxes)
{
    size_t i;
    json_t *s;
    json_array_foreach (sandboxes, i, s)
    {
        size_t k;
        json_t *port;
        bool public80 = false;
        json_array_foreach (json_object_get (s, "ports"), k, port) public80 |=
            json_integer_value (json_object_get (port, "port")) == 80 &&
            json_is_true (json_object_get (port, "public"));
        const char *label = json_string_value (json_object_get (s, "label"));
        const char *url = json_string_value (json_object_get (s, "url"));
        char *token = public80 || !label || !url
                          ? NULL
                          : gw_session_owner_token (job->account->session, label, job->account_id);
        char *owner_url = NULL;
        if (token && asprintf (&owner_url, "%s/?sbx_owner=%s", url, token) > 0)
            json_object_set_new (s, "ownerUrl", json_string (owner_url));
        free (owner_url);
        free (token);
    }
}

//  Everything has come: the console.
static void s_render (s_job_t *job, gw_request_t *req)
{
    //  Usage: billing's figures as gw_console takes them (strings borrowed from the JSON).
    gw_console_usage_t usage = {.unavailable = s_part_why (job->usage)};
    size_t wallet_count = json_array_size (json_object_get (job->usage, "wallets"));
    size_t day_count = json_array_size (json_object_get (job->usage, "days"));
    size_t key_count = json_array_size (json_object_get (job->keys, "keys"));
    gw_console_wallet_t *wallets = calloc (wallet_count + 1, sizeof *wallets);
    gw_chart_day_t *days = calloc (day_count + 1, sizeof *days);
    gw_console_key_t *keys = calloc (key_count + 1, sizeof *keys);
    if (!wallets || !days || !keys) {
        free (wallets);
        free (days);
        free (keys);
        gw_pages_respond (req, 500, NULL);
        return;
    }
    json_t *u = job->usage;
    usage.seconds = (uint64_t) json_integer_value (json_object_get (u, "seconds"));
    usage.cost = json_string_value (json_object_get (u, "cost"));
    usage.balance = json_string_value (json_object_get (u, "balance"));
    for (size_t i = 0; i < wallet_count; i++) {
        json_t *w = json_array_get (json_object_get (u, "wallets"), i);
        wallets[i] = (gw_console_wallet_t){json_string_value (json_object_get (w, "name")),
                                           json_string_value (json_object_get (w, "balance")),
                                           json_is_true (json_object_get (w, "active"))};
    }
    for (size_t i = 0; i < day_count; i++) {
        json_t *d = json_array_get (json_object_get (u, "days"), i);
        days[i] = (gw_chart_day_t){json_string_value (json_object_get (d, "day")),
                                   (uint64_t) json_integer_value (json_object_get (d, "seconds")),
                                   json_string_value (json_object_get (d, "cost"))};
    }
    usage.wallets = wallets;
    usage.wallet_count = wallet_count;
    usage.days = days;
    usage.day_count = day_count;
    for (size_t i = 0; i < key_count; i++) {
        json_t *k = json_array_get (json_object_get (job->keys, "keys"), i);
        keys[i] =
            (gw_console_key_t){.key_id = json_string_value (json_object_get (k, "id")),
                               .kind = json_string_value (json_object_get (k, "kind")),
                               .name = json_string_value (json_object_get (k, "name")),
                               .preset = json_string_value (json_object_get (k, "preset")),
                               .prefix = json_string_value (json_object_get (k, "prefix")),
                               .created = json_string_value (json_object_get (k, "created")),
                               .last_used = json_string_value (json_object_get (k, "lastUsed")),
                               .revoked = json_is_true (json_object_get (k, "revoked"))};
    }
    json_t *sandboxes = json_object_get (job->sandboxes, "sandboxes");
    if (sandboxes)
        s_owner_urls (job, sandboxes);
    char today[16];
    time_t now = (time_t) (sbx_clock_now_ms () / 1000);
    struct tm tm;
    gmtime_r (&now, &tm);
    strftime (today, sizeof today, "%Y-%m-%d", &tm);
    char *csrf = gw_session_csrf (job->account->session, req, job->account_id);
    gw_console_page_t page = {.csrf = csrf,
                              .email = job->email,
                              .base_url = job->account->base_url,
                              .today = today,
                              .usage = &usage,
                              .sandboxes = sandboxes,
                              .sandboxes_more =
                                  json_object_get (job->sandboxes, "nextCursor") != NULL,
                              .sandboxes_error = s_part_why (job->sandboxes),
                              .snapshots = json_object_get (job->snapshots, "snapshots"),
                              .snapshots_error = s_part_why (job->snapshots),
                              .keys = keys,
                              .key_count = key_count,
                              .keys_error = s_part_why (job->keys),
                              .new_key = job->new_key,
                              .notice = job->new_key ? "Key created." : NULL};
    gw_pages_respond_script (req, 200, gw_console_page (&page));
    free (csrf);
    free (wallets);
    free (days);
    free (keys);
}

static void s_on_snapshots (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->ops_handle = 0;
    gw_request_t *req = s_job_req (job);
    if (!req)
        return;
    job->snapshots = result->code == SBX_OK ? json_incref (result->answer)
                                            : s_part_error ("Snapshots cannot be listed now",
                                                            result->code, result->message);
    s_render (job, req);
    s_job_end (job);
}

//  The snapshots, after the sandboxes and their samples.
static void s_snapshots (s_job_t *job)
{
    GW_KEEP (job->ops_handle, gw_ops_call (job->account->ops, SBX_OP_LIST_SNAPSHOTS, SBX_OPS_REST,
                                           &job->caller, NULL, NULL, 0, s_on_snapshots, job));
}

static void s_on_metrics (const gw_ops_result_t *result, void *arg);

//  The next ready sandbox's last 5 minutes of samples (60 at 5 s; S_SPARKS of them at
//  most), for its sparklines; then the snapshots. A sandbox whose samples cannot be had
//  shows none.
#define S_SPARKS 20
static void s_next_metrics (s_job_t *job)
{
    json_t *list = json_object_get (job->sandboxes, "sandboxes");
    for (; job->metrics_next < json_array_size (list) && job->metrics_next < S_SPARKS;
         job->metrics_next++) {
        json_t *s = json_array_get (list, job->metrics_next);
        const char *state = json_string_value (json_object_get (s, "state"));
        if (!state || !streq (state, "ready"))
            continue;
        json_t *args =
            json_pack ("{s:O, s:i}", "sandboxId", json_object_get (s, "id"), "limit", 60);
        uint64_t handle = gw_ops_call (job->account->ops, SBX_OP_GET_SANDBOX_METRICS, SBX_OPS_REST,
                                       &job->caller, args, NULL, 0, s_on_metrics, job);
        json_decref (args);
        GW_KEEP (job->ops_handle, handle);
        return;
    }
    s_snapshots (job);
}

static void s_on_metrics (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->ops_handle = 0;
    if (!s_job_req (job))
        return;
    json_t *s = json_array_get (json_object_get (job->sandboxes, "sandboxes"), job->metrics_next);
    if (s && result->code == SBX_OK)
        json_object_set (s, "metrics", result->answer);
    job->metrics_next++;
    s_next_metrics (job);
}

static void s_on_sandboxes (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->ops_handle = 0;
    if (!s_job_req (job))
        return;
    //  A copy: the console adds where each URL links, and the samples.
    job->sandboxes = result->code == SBX_OK ? json_deep_copy (result->answer)
                                            : s_part_error ("Sandboxes cannot be listed now",
                                                            result->code, result->message);
    job->metrics_next = 0;
    s_next_metrics (job);
}

static void s_on_list (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    if (!s_job_answered (job))
        return;
    if (!reply)
        job->keys = s_part_error ("Your keys cannot be listed now", code, message);
    else {
        sbx_key_info_list_t *list = &sbx_msg_key_list_ok (reply)->keys;
        json_t *keys = json_array ();
        for (size_t i = 0; i < list->count; i++) {
            sbx_key_info_t *k = &list->items[i];
            char created[40], used[40];
            s_time (k->created_ms, created, sizeof created);
            s_time (k->last_used_ms, used, sizeof used);
            json_t *key = json_pack ("{s:s, s:s, s:s, s:s, s:s, s:s, s:b}", "id", k->key_id, "kind",
                                     sbx_key_kind_name (k->kind), "name", k->name ? k->name : "",
                                     "preset", sbx_key_preset_name (k->preset), "created", created,
                                     "lastUsed", used, "revoked", k->revoked);
            if (key && k->prefix)
                json_object_set_new (key, "prefix", json_string (k->prefix));
            json_array_append_new (keys, key);
        }
        job->keys = json_pack ("{s:o}", "keys", keys);
    }
    GW_KEEP (job->ops_handle, gw_ops_call (job->account->ops, SBX_OP_LIST_SANDBOXES, SBX_OPS_REST,
                                           &job->caller, NULL, NULL, 0, s_on_sandboxes, job));
}

//  Billing's figures (or why there are none: the page still shows the rest), then the
//  key list.
static void s_on_usage (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    if (!s_job_answered (job))
        return;
    sbx_usage_get_ok_t *ok = reply ? sbx_msg_usage_get_ok (reply) : NULL;
    if (!ok)
        job->usage = s_part_error ("Usage is not available right now", code, message);
    else {
        char money[48], balance[48];
        s_money (money, sizeof money, (int64_t) ok->micro_usd);
        s_money (balance, sizeof balance, ok->balance_micro_usd);
        json_t *wallets = json_array (), *days = json_array ();
        for (size_t i = 0; i < ok->wallets.count; i++) {
            char m[48];
            s_money (m, sizeof m, ok->wallets.items[i].balance_micro_usd);
            json_array_append_new (wallets,
                                   json_pack ("{s:s, s:s, s:b}", "name", ok->wallets.items[i].name,
                                              "balance", m, "active", ok->wallets.items[i].active));
        }
        for (size_t i = 0; i < ok->days.count; i++) {
            char m[48];
            s_money (m, sizeof m, (int64_t) ok->days.items[i].micro_usd);
            json_array_append_new (
                days, json_pack ("{s:s, s:I, s:s}", "day", ok->days.items[i].day, "seconds",
                                 (json_int_t) ok->days.items[i].seconds, "cost", m));
        }
        job->usage =
            json_pack ("{s:I, s:s, s:s, s:o, s:o}", "seconds", (json_int_t) (ok->running_ms / 1000),
                       "cost", money, "balance", balance, "wallets", wallets, "days", days);
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_KEY_LIST);
    sbx_str_set (&sbx_msg_key_list (request)->account, job->account_id);
    s_job_send (job, &request, s_on_list);
}

//  The console's parts one after the other (usage, keys, sandboxes and the ready ones'
//  samples, snapshots), then
//  the page: one request in flight per job, cancelled with it.
static void s_list (s_job_t *job)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&sbx_msg_usage_get (request)->account, job->account_id);
    s_job_send (job, &request, s_on_usage);
}

//  A sandbox or snapshot action ran: back to the page, or why not.
static void s_on_action (const gw_ops_result_t *result, void *arg)
{
    s_job_t *job = arg;
    job->ops_handle = 0;
    gw_request_t *req = s_job_req (job);
    if (!req)
        return;
    if (result->code != SBX_OK) {
        char text[700];
        snprintf (text, sizeof text, "%s (%s). Open /account again to see where things stand.",
                  result->message ? result->message : "it failed", sbx_code_name (result->code));
        gw_pages_respond_error (req, sbx_code_http_status (result->code), "Not done", text);
    } else {
        sbx_info ("account=%s %s on the account page", job->account_id, s_field (job, "action"));
        s_back (req);
    }
    s_job_end (job);
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
        s_signin_page (job->account, req, status, s_field (job, "email"), error);
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
        s_signin_page (self, req, 200, NULL, "Your session has ended; sign in again.");
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
    //  Sandbox and snapshot actions run as the REST operations do, for this account.
    const char *arg = NULL;
    sbx_op_t op = SBX_OP__COUNT;
    if (streq (action, "stop") || streq (action, "resume") || streq (action, "delete")) {
        op = streq (action, "stop")     ? SBX_OP_STOP_SANDBOX
             : streq (action, "resume") ? SBX_OP_RESUME_SANDBOX
                                        : SBX_OP_DELETE_SANDBOX;
        arg = "sandbox_id";
    } else if (streq (action, "delete_snapshot")) {
        op = SBX_OP_DELETE_SNAPSHOT;
        arg = "snapshot_id";
    }
    if (arg) {
        if (!s_field (job, arg)) {
            gw_pages_respond_error (req, 400, "Nothing chosen", "Use the buttons of the page.");
            s_job_end (job);
            return;
        }
        json_t *args = json_pack ("{s:s}", streq (arg, "sandbox_id") ? "sandboxId" : "snapshotId",
                                  s_field (job, arg));
        GW_KEEP (job->ops_handle, gw_ops_call (self->ops, op, SBX_OPS_REST, &job->caller, args,
                                               NULL, 0, s_on_action, job));
        json_decref (args);
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
        s_signin_page (self, req, 200, NULL, NULL);
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

static void s_script (gw_request_t *req, void *arg)
{
    (void) arg;
    if (!streq (gw_request_method (req), "GET") && !streq (gw_request_method (req), "HEAD")) {
        gw_request_add_header (req, "Allow", "GET");
        gw_pages_respond_error (req, 405, "Method not allowed", "Use GET.");
        return;
    }
    gw_request_add_header (req, "Cache-Control", "no-cache");
    gw_request_add_header (req, "X-Content-Type-Options", "nosniff");
    gw_request_respond (req, 200, "text/javascript; charset=utf-8", gw_console_js,
                        gw_console_js_size);
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
    self->ops = ctx->ops;
    self->base_url = ctx->config ? sbx_urls_base (ctx->config) : strdup ("https://localhost:8443");
    self->signin = gw_signin_new (ctx->loop, self->broker, "account");
    self->jobs = sbx_idmap_new ();
    if (!self->signin || !self->jobs || !self->base_url ||
        gw_router_add (ctx->router, "/account", false, s_route, self) ||
        gw_router_add (ctx->router, "/account/console.js", false, s_script, self)) {
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
    free (self->base_url);
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
