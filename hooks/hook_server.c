/*  hook_server - see hook_server.h */
#include "hook_server.h"
#include "hook_sender.h"
#include "hook_store.h"
#include "sbx_api.h"
#include "sbx_netaddr.h"
#include "sbx_secret.h"
#include "sbx_tapreader.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <sys/stat.h>

#define S_TICK_MS        250     //  how often due deliveries are looked for
#define S_MAX_IN_FLIGHT  32      //  POSTs under way at once
#define S_FIRST_RETRY_MS 1000    //  doubled after each failure …
#define S_MAX_RETRY_MS   3600000 //  … up to an hour
#define S_MAX_WEBHOOKS   20      //  per account
#define S_DEFAULT_LIMIT  100
#define S_MAX_LIMIT      1000

//  The event types a webhook may take, as its deliveries name them.
static const char *s_types[] = {"sandbox.created",     "sandbox.ready",
                                "sandbox.stopped",     "sandbox.resumed",
                                "sandbox.deleted",     "sandbox.error",
                                "sandbox.ttl_expired", "snapshot.saved",
                                "snapshot.deleted",    NULL};

struct _hook_server_t {
    sbx_config_t *config; //  borrowed
    hook_store_t *store;
    hook_sender_t *sender;
    sbx_tapreader_t *reader;
    zloop_t *loop;
    zhashx_t *in_flight; //  delivery id ("%lld") → attempts made before this one (uint64_t *)
    bool allow_private;
    bool failed;
    bool kicked; //  a scan for due deliveries is coming on the next loop turn
};

hook_server_t *hook_server_new (sbx_config_t *config)
{
    assert (config);
    hook_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->allow_private =
        streq (sbx_config_get (config, "webhooks.allow_private", "false"), "true");
    self->in_flight = zhashx_new ();
    if (self->in_flight)
        zhashx_set_destructor (self->in_flight, (zhashx_destructor_fn *) zstr_free);
    char *dir = sbx_config_path (config, "hooks");
    char *path = sbx_config_path (config, "hooks/hooks.db");
    if (dir && mkdir (dir, 0700) && errno != EEXIST)
        sbx_error ("cannot make %s: %s", dir, strerror (errno));
    self->store = path ? hook_store_new (path) : NULL;
    if (self->store)
        sbx_info ("webhooks %s: last applied event %llu%s", path,
                  (unsigned long long) hook_store_last_seq (self->store),
                  self->allow_private ? "; private addresses ALLOWED (webhooks.allow_private)"
                                      : "");
    free (dir);
    free (path);
    if (!self->store || !self->in_flight)
        hook_server_destroy (&self);
    return self;
}

void hook_server_destroy (hook_server_t **self_p)
{
    assert (self_p);
    hook_server_t *self = *self_p;
    if (!self)
        return;
    sbx_tapreader_destroy (&self->reader);
    hook_sender_destroy (&self->sender);
    hook_store_destroy (&self->store);
    zhashx_destroy (&self->in_flight);
    free (self);
    *self_p = NULL;
}

bool hook_server_failed (hook_server_t *self)
{
    return self && self->failed;
}

//  --------------------------------------------------------------------------
//  Requests

//  The account a request acts for: a key's or session's own; an operator names one.
//  NULL with *reply set when it may not.
static const char *s_account (const sbx_msg_t *request, const char *asked, bool change,
                              sbx_msg_t **reply)
{
    const sbx_caller_t *caller = request->caller;
    if (caller &&
        (caller->kind == SBX_CALLER_KIND_SYSTEM || caller->kind == SBX_CALLER_KIND_ADMIN)) {
        if (asked && *asked)
            return asked;
        if (caller->account_id && *caller->account_id)
            return caller->account_id;
        *reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                    "name the account (its id, acc_…) whose webhooks these are");
        return NULL;
    }
    if (!caller || !caller->account_id || !*caller->account_id ||
        caller->kind == SBX_CALLER_KIND_OAUTH) {
        *reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                    "webhooks are managed with an API key of the account");
        return NULL;
    }
    if (change && caller->kind == SBX_CALLER_KIND_API_KEY &&
        caller->preset != SBX_KEY_PRESET_FULL) {
        *reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                    "only a full key may create or delete webhooks; this key is "
                                    "%s",
                                    sbx_key_preset_name (caller->preset));
        return NULL;
    }
    return caller->account_id;
}

//  The URL's scheme and host, as create takes them: http(s), and no private host named
//  outright (names that resolve to one are refused at each delivery's connect).
static int s_check_url (hook_server_t *self, const char *url, char *why, size_t why_size)
{
    CURLU *u = curl_url ();
    char *scheme = NULL, *host = NULL;
    int rc = -1;
    if (!u || curl_url_set (u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get (u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get (u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !*host)
        snprintf (why, why_size, "url '%.200s' is not an absolute http(s) URL", url);
    else if (!streq (scheme, "http") && !streq (scheme, "https"))
        snprintf (why, why_size, "url must be http or https, not %s", scheme);
    else {
        char ip[256];
        size_t n = strlen (host);
        //  [v6] literals lose their brackets.
        snprintf (ip, sizeof ip, "%.*s", host[0] == '[' && n > 2 ? (int) n - 2 : (int) n,
                  host[0] == '[' ? host + 1 : host);
        uint8_t addr[16];
        bool literal = inet_pton (AF_INET, ip, addr) == 1 || inet_pton (AF_INET6, ip, addr) == 1;
        bool local = strcasecmp (ip, "localhost") == 0 ||
                     (n > 10 && strcasecmp (ip + strlen (ip) - 10, ".localhost") == 0);
        if (!self->allow_private && (local || (literal && !sbx_netaddr_public (ip))))
            snprintf (why, why_size,
                      "url's host %s is a private or loopback address: webhooks go to public "
                      "addresses only (an operator may allow private ones for tests with "
                      "webhooks.allow_private = true)",
                      ip);
        else
            rc = 0;
    }
    curl_free (scheme);
    curl_free (host);
    curl_url_cleanup (u);
    return rc;
}

static bool s_known_type (const char *type)
{
    for (int i = 0; s_types[i]; i++)
        if (streq (s_types[i], type))
            return true;
    return false;
}

static sbx_msg_t *s_create (hook_server_t *self, sbx_msg_t *request)
{
    sbx_webhook_create_t *args = sbx_msg_webhook_create (request);
    sbx_msg_t *reply = NULL;
    const char *account = s_account (request, args->account, true, &reply);
    if (!account)
        return reply;
    char why[512];
    if (!args->url || s_check_url (self, args->url, why, sizeof why))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "%s",
                                  args->url ? why : "url is required");
    char events[1024] = "";
    for (size_t i = 0; i < args->events.count; i++) {
        const char *type = args->events.items[i];
        if (!s_known_type (type)) {
            char known[512] = "";
            for (int k = 0; s_types[k]; k++)
                snprintf (known + strlen (known), sizeof known - strlen (known), "%s%s",
                          k ? ", " : "", s_types[k]);
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "unknown event type '%.64s'; known: %s", type, known);
        }
        char padded[80];
        snprintf (padded, sizeof padded, " %s ", type);
        char spaced[1030];
        snprintf (spaced, sizeof spaced, " %s ", events);
        if (!strstr (spaced, padded))
            snprintf (events + strlen (events), sizeof events - strlen (events), "%s%s",
                      *events ? " " : "", type);
    }
    int count = hook_store_count (self->store, account);
    if (count >= S_MAX_WEBHOOKS)
        return sbx_msg_new_error (request->rid, SBX_E_LIMIT_EXCEEDED,
                                  "the account has %d webhooks, the most it may have; delete one "
                                  "first",
                                  count);
    char *id = sbx_secret_id ("wh_");
    char *secret = sbx_secret_token ("whsec_", 43);
    if (count < 0 || !id || !secret ||
        hook_store_create (self->store, id, account, args->url, events, secret,
                           sbx_clock_now_ms ())) {
        free (id);
        sbx_secret_wipe (secret);
        free (secret);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot store the webhook");
    }
    reply = sbx_msg_new_reply (request, SBX_MSG_WEBHOOK_CREATE_OK);
    sbx_webhook_create_ok_t *ok = sbx_msg_webhook_create_ok (reply);
    ok->webhook = calloc (1, sizeof *ok->webhook);
    if (!ok->webhook || hook_store_get (self->store, id, ok->webhook) ||
        sbx_str_set (&ok->secret, secret))
        sbx_msg_destroy (&reply);
    else
        sbx_info ("account=%s webhook %s created for %s", account, id, args->url);
    free (id);
    sbx_secret_wipe (secret);
    free (secret);
    return reply ? reply : sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
}

//  The webhook, when the caller's account owns it: into info (0), else *reply set.
static int s_owned (hook_server_t *self, sbx_msg_t *request, const char *id, bool change,
                    sbx_webhook_info_t *info, sbx_msg_t **reply)
{
    int rc = id ? hook_store_get (self->store, id, info) : 1;
    if (rc < 0) {
        *reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot read webhooks");
        return -1;
    }
    const sbx_caller_t *caller = request->caller;
    bool operator_ =
        caller && (caller->kind == SBX_CALLER_KIND_SYSTEM || caller->kind == SBX_CALLER_KIND_ADMIN);
    if (rc == 0 && !operator_ && !s_account (request, NULL, change, reply))
        return -1;
    if (rc == 1 || (!operator_ && !streq (info->account_id, caller->account_id))) {
        *reply =
            sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "no webhook '%.64s'", id ? id : "");
        return -1;
    }
    return 0;
}

static sbx_msg_t *s_handle (hook_server_t *self, sbx_msg_t *request)
{
    sbx_msg_t *reply = NULL;
    switch (request->type) {
    case SBX_MSG_WEBHOOK_CREATE:
        return s_create (self, request);
    case SBX_MSG_WEBHOOK_LIST: {
        const char *account =
            s_account (request, sbx_msg_webhook_list (request)->account, false, &reply);
        if (!account)
            return reply;
        reply = sbx_msg_new_reply (request, SBX_MSG_WEBHOOK_LIST_OK);
        if (hook_store_list (self->store, account, &sbx_msg_webhook_list_ok (reply)->webhooks)) {
            sbx_msg_destroy (&reply);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot read webhooks");
        }
        return reply;
    }
    case SBX_MSG_WEBHOOK_GET: {
        reply = sbx_msg_new_reply (request, SBX_MSG_WEBHOOK_GET_OK);
        sbx_webhook_get_ok_t *ok = sbx_msg_webhook_get_ok (reply);
        ok->webhook = calloc (1, sizeof *ok->webhook);
        sbx_msg_t *refusal = NULL;
        if (s_owned (self, request, sbx_msg_webhook_get (request)->webhook_id, false, ok->webhook,
                     &refusal)) {
            sbx_msg_destroy (&reply);
            return refusal;
        }
        return reply;
    }
    case SBX_MSG_WEBHOOK_DELETE:
    case SBX_MSG_WEBHOOK_DELIVERIES: {
        bool delete = request->type == SBX_MSG_WEBHOOK_DELETE;
        const char *id = delete ? sbx_msg_webhook_delete (request)->webhook_id
                                : sbx_msg_webhook_deliveries (request)->webhook_id;
        sbx_msg_t *info_msg = sbx_msg_new (SBX_MSG_WEBHOOK_GET_OK);
        sbx_webhook_info_t *info = calloc (1, sizeof *info);
        sbx_msg_webhook_get_ok (info_msg)->webhook = info;
        if (s_owned (self, request, id, delete, info, &reply)) {
            sbx_msg_destroy (&info_msg);
            return reply;
        }
        sbx_msg_destroy (&info_msg);
        if (delete) {
            if (hook_store_delete (self->store, id))
                return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot delete");
            sbx_info ("webhook %s deleted", id);
            reply = sbx_msg_new_reply (request, SBX_MSG_WEBHOOK_DELETE_OK);
            sbx_str_set (&sbx_msg_webhook_delete_ok (reply)->webhook_id, id);
            return reply;
        }
        uint64_t limit = sbx_msg_webhook_deliveries (request)->limit;
        limit = !limit ? S_DEFAULT_LIMIT : limit > S_MAX_LIMIT ? S_MAX_LIMIT : limit;
        reply = sbx_msg_new_reply (request, SBX_MSG_WEBHOOK_DELIVERIES_OK);
        if (hook_store_deliveries (self->store, id, limit,
                                   &sbx_msg_webhook_deliveries_ok (reply)->deliveries)) {
            sbx_msg_destroy (&reply);
            return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot read deliveries");
        }
        return reply;
    }
    default:
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "sbx-hookd does not handle %s",
                                  sbx_msg_type_name (request->type));
    }
}

void hook_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    sbx_msg_t *reply = s_handle (arg, *request_p);
    if (!reply)
        reply = sbx_msg_new_error ((*request_p)->rid, SBX_E_INTERNAL, "out of memory");
    sbx_peer_send (peer, &reply);
}

//  --------------------------------------------------------------------------
//  Events → deliveries

//  The webhook event an event of the log is, with its data; NULL type when none.
static const char *s_webhook_type (const sbx_msg_t *msg, json_t *data)
{
    if (msg->type == SBX_MSG_TTL_EXPIRED) {
        sbx_ttl_expired_t *t = sbx_msg_ttl_expired ((sbx_msg_t *) msg);
        json_object_set_new (data, "sandboxId", json_string (t->sandbox_id));
        json_object_set_new (data, "deadline", sbx_api_time (t->deadline_ms));
        json_object_set_new (data, "stoppedAt", sbx_api_time (t->actual_ms));
        return "sandbox.ttl_expired";
    }
    if (msg->type == SBX_MSG_SNAPSHOT_SAVED || msg->type == SBX_MSG_SNAPSHOT_DELETED) {
        bool saved = msg->type == SBX_MSG_SNAPSHOT_SAVED;
        sbx_snapshot_saved_t *s = saved ? sbx_msg_snapshot_saved ((sbx_msg_t *) msg) : NULL;
        sbx_snapshot_deleted_t *d = saved ? NULL : sbx_msg_snapshot_deleted ((sbx_msg_t *) msg);
        const char *sandbox = saved ? s->sandbox_id : d->sandbox_id;
        json_object_set_new (data, "snapshotId",
                             json_string (saved ? s->snapshot_id : d->snapshot_id));
        json_object_set_new (data, "sandboxId", sandbox ? json_string (sandbox) : json_null ());
        if (saved) {
            json_object_set_new (data, "name", s->name ? json_string (s->name) : json_null ());
            json_object_set_new (data, "sizeBytes",
                                 json_integer ((json_int_t) (s->disk_bytes + s->memory_bytes)));
        }
        return saved ? "snapshot.saved" : "snapshot.deleted";
    }
    if (msg->type != SBX_MSG_SANDBOX_CHANGED)
        return NULL;
    sbx_sandbox_changed_t *c = sbx_msg_sandbox_changed ((sbx_msg_t *) msg);
    const char *type = NULL;
    switch (c->to) {
    case SBX_SANDBOX_STATE_CREATING:
        type = c->from ? NULL : "sandbox.created";
        break;
    case SBX_SANDBOX_STATE_READY:
        type = c->from == SBX_SANDBOX_STATE_RESUMING ? "sandbox.resumed" : "sandbox.ready";
        break;
    case SBX_SANDBOX_STATE_STOPPED:
        type = "sandbox.stopped";
        break;
    case SBX_SANDBOX_STATE_DELETED:
        type = "sandbox.deleted";
        break;
    case SBX_SANDBOX_STATE_ERROR:
        type = "sandbox.error";
        break;
    default:
        break; //  the transient states are not told
    }
    if (!type)
        return NULL;
    json_object_set_new (data, "sandboxId", json_string (c->sandbox_id));
    json_object_set_new (data, "state", json_string (sbx_sandbox_state_name (c->to)));
    json_object_set_new (data, "previousState",
                         c->from ? json_string (sbx_sandbox_state_name (c->from)) : json_null ());
    if (c->type)
        json_object_set_new (data, "sandboxType", json_string (sbx_sandbox_type_name (c->type)));
    if (c->reason)
        json_object_set_new (data, "reason", json_string (c->reason));
    return type;
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    hook_server_t *self = arg;
    sbx_err_t err;
    sbx_msg_t *msg = event->account && event->payload.data
                         ? sbx_msg_decode (event->payload.data, event->payload.size, &err)
                         : NULL;
    //  A deleted account's webhooks go with it (again on a replay: a no-op then).
    if (msg && msg->type == SBX_MSG_ACCOUNT_DELETED &&
        hook_store_delete_account (self->store, sbx_msg_account_deleted (msg)->account_id) == 0)
        sbx_info ("account=%s deleted: its webhooks too",
                  sbx_msg_account_deleted (msg)->account_id);
    json_t *data = json_object ();
    const char *type = msg && data ? s_webhook_type (msg, data) : NULL;
    char id[32];
    snprintf (id, sizeof id, "evt_%llu", (unsigned long long) event->seq);
    char *body = NULL;
    if (type) {
        json_t *payload =
            json_pack ("{s:s, s:s, s:o, s:s, s:O}", "id", id, "type", type, "createdAt",
                       sbx_api_time (event->ts_ms), "accountId", event->account, "data", data);
        body = payload ? json_dumps (payload, JSON_COMPACT) : NULL;
        json_decref (payload);
    }
    json_decref (data);
    sbx_msg_destroy (&msg);
    int rc = hook_store_apply (self->store, event->seq, body ? event->account : NULL,
                               body ? type : NULL, id, body, event->ts_ms);
    free (body);
    if (rc) {
        self->failed = true;
        sbx_error ("webhooks stop at event %llu: the store failed; a restart replays from %llu",
                   (unsigned long long) event->seq,
                   (unsigned long long) hook_store_last_seq (self->store));
        return -1;
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Deliveries: one at a time per webhook, in the log's order (hook_store_due gives each
//  webhook's first due delivery only, and one in flight is not sent again), so a receiver
//  sees a webhook's events as they were committed unless one needed a retry.

static void s_send_due (const hook_due_t *due, void *arg)
{
    hook_server_t *self = arg;
    char key[24];
    snprintf (key, sizeof key, "%lld", (long long) due->id);
    if (zhashx_lookup (self->in_flight, key) || zhashx_size (self->in_flight) >= S_MAX_IN_FLIGHT)
        return;
    //  The signature: HMAC-SHA256 of "<t>.<body>" under the webhook's secret.
    long long t = (long long) (sbx_clock_now_ms () / 1000);
    size_t size = strlen (due->body) + 32;
    char *signed_ = malloc (size);
    if (!signed_)
        return;
    int n = snprintf (signed_, size, "%lld.%s", t, due->body);
    char mac[65];
    sbx_secret_hmac_sha256_hex (due->secret, signed_, (size_t) n, mac);
    free (signed_);
    char signature[128], event_id[96], webhook[96], attempt[48];
    snprintf (signature, sizeof signature, "Sbx-Signature: t=%lld,v1=%s", t, mac);
    snprintf (event_id, sizeof event_id, "Sbx-Event-Id: %s", due->event_id);
    snprintf (webhook, sizeof webhook, "Sbx-Webhook-Id: %s", due->webhook_id);
    snprintf (attempt, sizeof attempt, "Sbx-Attempt: %llu", (unsigned long long) due->attempts + 1);
    const char *headers[] = {signature, event_id, webhook, attempt, NULL};
    char *attempts = zsys_sprintf ("%llu", (unsigned long long) due->attempts);
    if (!attempts)
        return;
    if (hook_sender_post (self->sender, due->id, due->url, due->body, headers)) {
        //  Not even started (a URL curl refuses): counts as a failed attempt.
        uint64_t made = due->attempts + 1;
        bool last = made >= HOOK_SERVER_ATTEMPTS;
        uint64_t now = sbx_clock_now_ms ();
        hook_store_record (self->store, due->id, last ? "failed" : "pending", made, 0,
                           "the request could not be started", now + S_MAX_RETRY_MS,
                           last ? now : 0);
        zstr_free (&attempts);
        return;
    }
    zhashx_insert (self->in_flight, key, attempts);
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    hook_server_t *self = arg;
    if (self->failed)
        return 0;
    size_t busy = zhashx_size (self->in_flight);
    if (busy < S_MAX_IN_FLIGHT)
        hook_store_due (self->store, sbx_clock_now_ms (), (int) (busy + S_MAX_IN_FLIGHT),
                        s_send_due, self);
    return 0;
}

static int s_on_kick (zloop_t *loop, int timer_id, void *arg)
{
    hook_server_t *self = arg;
    self->kicked = false;
    return s_on_tick (loop, timer_id, arg);
}

static void s_on_sent (int64_t tag, long status, const char *error, void *arg)
{
    hook_server_t *self = arg;
    char key[24];
    snprintf (key, sizeof key, "%lld", (long long) tag);
    const char *before = zhashx_lookup (self->in_flight, key);
    uint64_t made = (before ? strtoull (before, NULL, 10) : 0) + 1;
    zhashx_delete (self->in_flight, key);
    uint64_t now = sbx_clock_now_ms ();
    char why[600] = "";
    if (error && *error)
        snprintf (why, sizeof why, "%s", error);
    else if (status < 200 || status > 299)
        snprintf (why, sizeof why, "the receiver answered HTTP %ld", status);
    int rc;
    if (!*why)
        rc = hook_store_record (self->store, tag, "delivered", made, (uint64_t) status, NULL, 0,
                                now);
    else if (made >= HOOK_SERVER_ATTEMPTS) {
        sbx_warn ("delivery %lld failed after %llu attempts: %s", (long long) tag,
                  (unsigned long long) made, why);
        rc = hook_store_record (self->store, tag, "failed", made, (uint64_t) status, why, 0, now);
    } else {
        uint64_t wait = S_FIRST_RETRY_MS << (made - 1 < 12 ? made - 1 : 12);
        if (wait > S_MAX_RETRY_MS)
            wait = S_MAX_RETRY_MS;
        sbx_debug ("delivery %lld attempt %llu: %s; again in %llu ms", (long long) tag,
                   (unsigned long long) made, why, (unsigned long long) wait);
        rc = hook_store_record (self->store, tag, "pending", made, (uint64_t) status, why,
                                now + wait, 0);
    }
    if (rc)
        sbx_error ("delivery %lld: its outcome could not be recorded", (long long) tag);
    //  The webhook's next delivery may go now, not at the next tick.
    if (!self->kicked && zloop_timer (self->loop, 1, 1, s_on_kick, self) >= 0)
        self->kicked = true;
}

int hook_server_start (hook_server_t *self, sbx_peer_t *peer, zloop_t *loop)
{
    assert (self && peer && loop && !self->reader);
    self->loop = loop;
    self->sender =
        hook_sender_new (loop, self->allow_private,
                         sbx_config_get (self->config, "webhooks.ca_file", NULL), s_on_sent, self);
    if (!self->sender || zloop_timer (loop, S_TICK_MS, 0, s_on_tick, self) < 0)
        return -1;
    self->reader =
        sbx_tapreader_new (self->config, peer, hook_store_last_seq (self->store), s_on_event, self);
    return self->reader ? sbx_tapreader_start (self->reader, loop) : -1;
}

//  --------------------------------------------------------------------------
//  Self test: the request side against a real store (deliveries: tests/integration).

void hook_server_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/hook_server_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    hook_server_t *self = hook_server_new (config);
    assert (self);
    sbx_msg_t *create = sbx_msg_new (SBX_MSG_WEBHOOK_CREATE);
    create->rid = 1;
    create->caller = calloc (1, sizeof (sbx_caller_t));
    create->caller->kind = SBX_CALLER_KIND_API_KEY;
    create->caller->preset = SBX_KEY_PRESET_FULL;
    sbx_str_set (&create->caller->account_id, "acc_1");
    sbx_webhook_create_t *args = sbx_msg_webhook_create (create);
    //  Private hosts are refused without webhooks.allow_private.
    const char *refused[] = {"http://127.0.0.1:8/x",
                             "https://localhost/x",
                             "http://[::1]/x",
                             "http://10.0.0.1/",
                             "ftp://example.com/",
                             "not a url",
                             NULL};
    for (int i = 0; refused[i]; i++) {
        sbx_str_set (&args->url, refused[i]);
        sbx_msg_t *reply = s_handle (self, create);
        assert (reply->type == SBX_MSG_ERROR);
        sbx_msg_destroy (&reply);
    }
    sbx_str_set (&args->url, "https://hooks.example.com/sbx");
    sbx_strlist_append (&args->events, "sandbox.nope");
    sbx_msg_t *reply = s_handle (self, create);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    sbx_msg_t *good = sbx_msg_dup (create);
    sbx_webhook_create_t *good_args = sbx_msg_webhook_create (good);
    sbx_str_set (&good_args->events.items[0], "sandbox.ready");
    reply = s_handle (self, good);
    sbx_msg_destroy (&good);
    assert (reply->type == SBX_MSG_WEBHOOK_CREATE_OK);
    char *id = strdup (sbx_msg_webhook_create_ok (reply)->webhook->webhook_id);
    assert (strncmp (sbx_msg_webhook_create_ok (reply)->secret, "whsec_", 6) == 0);
    sbx_msg_destroy (&reply);
    //  A read-only key may list but not delete; another account sees nothing.
    sbx_msg_t *del = sbx_msg_new (SBX_MSG_WEBHOOK_DELETE);
    del->caller = calloc (1, sizeof (sbx_caller_t));
    del->caller->kind = SBX_CALLER_KIND_API_KEY;
    del->caller->preset = SBX_KEY_PRESET_READ_ONLY;
    sbx_str_set (&del->caller->account_id, "acc_1");
    sbx_str_set (&sbx_msg_webhook_delete (del)->webhook_id, id);
    reply = s_handle (self, del);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    sbx_str_set (&del->caller->account_id, "acc_2");
    del->caller->preset = SBX_KEY_PRESET_FULL;
    reply = s_handle (self, del);
    assert (reply->type == SBX_MSG_ERROR);
    sbx_msg_destroy (&reply);
    sbx_str_set (&del->caller->account_id, "acc_1");
    reply = s_handle (self, del);
    assert (reply->type == SBX_MSG_WEBHOOK_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (id);
    sbx_msg_destroy (&del);
    sbx_msg_destroy (&create);
    hook_server_destroy (&self);
    sbx_config_destroy (&config);
    char command[160];
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
}
