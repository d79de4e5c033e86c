/*  gw_auth - see gw_auth.h */
#include "gw_auth.h"
#include "sbx_metrics.h"
#include "gw_rates.h"
#include "sbx_idmap.h"
#include "sbx_tapreader.h"
#include "sbx_urls.h"

#include <assert.h>
#include <jansson.h>

//  How long a good key is trusted without asking the broker again (gateway.auth_cache_ms);
//  revocations reach the cache through the tap, so this bounds only the broker's load.
#define S_CACHE_MS 5000
//  OAuth access tokens: at most a second, so a token the tap could not tell about (a
//  tap that fell behind unnoticed) is still asked again soon.
#define S_OAUTH_CACHE_MS 1000
#define S_CACHE_MAX      10000
typedef struct {
    sbx_caller_t *caller;
    uint64_t until_mono; //  trusted until then
} s_entry_t;

//  One check waiting for the broker.
typedef struct {
    gw_auth_t *auth;
    uint64_t serial;
    uint64_t rid;
    char hash[65];
    uint64_t forgets; //  self->forgets when it was asked: a later forget makes it stale
    gw_auth_fn *fn;
    void *arg;
} s_check_t;

struct gw_auth_t {
    gw_rates_t *rates; //  each key's plan rate, shared with the other gateways
    sbx_peer_t *peer;
    char *base_url;
    char *mcp_url;     //  the audience OAuth access tokens must be bound to
    zhashx_t *cache;   //  key hash → s_entry_t
    zhashx_t *pending; //  serial → s_check_t, so destroy can cancel them
    uint64_t next_serial;
    sbx_tapreader_t *reader; //  key.revoked and oauth.revoked, from every gateway and the CLI
    bool welcomed;           //  the broker's welcome, as last seen
    uint64_t forgets;        //  counts forgets, so an answer in flight across one is not kept
    uint64_t cache_ms;       //  gateway.auth_cache_ms
};

sbx_caller_t *gw_auth_caller_dup (const sbx_caller_t *caller)
{
    if (!caller)
        return NULL;
    sbx_caller_t *copy = calloc (1, sizeof *copy);
    if (!copy)
        return NULL;
    copy->kind = caller->kind;
    copy->preset = caller->preset;
    if (sbx_str_set (&copy->account_id, caller->account_id) ||
        sbx_str_set (&copy->key_id, caller->key_id))
        gw_auth_caller_destroy (&copy);
    return copy;
}

void gw_auth_caller_destroy (sbx_caller_t **caller_p)
{
    if (!caller_p || !*caller_p)
        return;
    free ((*caller_p)->account_id);
    free ((*caller_p)->key_id);
    free (*caller_p);
    *caller_p = NULL;
}

static void s_entry_free (void **item_p)
{
    s_entry_t *entry = *item_p;
    if (entry) {
        gw_auth_caller_destroy (&entry->caller);
        free (entry);
    }
    *item_p = NULL;
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    //  Both name the key (or the OAuth connection) as the event's subject.
    if (event->subject && event->type &&
        (streq (event->type, "key.revoked") || streq (event->type, "oauth.revoked")))
        gw_auth_forget_key ((gw_auth_t *) arg, event->subject);
    //  These name the account.
    if (event->account && event->type &&
        (streq (event->type, "account.disabled") || streq (event->type, "account.deleted")))
        gw_auth_forget_account ((gw_auth_t *) arg, event->account);
    return 0;
}

gw_auth_t *gw_auth_new (sbx_config_t *config, sbx_peer_t *peer)
{
    gw_auth_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->cache_ms = sbx_config_get_range (config, "gateway.auth_cache_ms", S_CACHE_MS, 0, 3600000);
    self->base_url = config ? sbx_urls_base (config) : strdup ("https://localhost:8443");
    if (self->base_url && asprintf (&self->mcp_url, "%s/mcp", self->base_url) < 0)
        self->mcp_url = NULL;
    self->cache = zhashx_new ();
    self->pending = sbx_idmap_new ();
    self->rates = gw_rates_new (config, peer);
    if (peer)
        self->reader = sbx_tapreader_new (config, peer, SBX_TAPREADER_NOW, s_on_event, self);
    if (!self->base_url || !self->mcp_url || !self->cache || !self->pending || !self->rates ||
        (peer && !self->reader)) {
        gw_auth_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->cache, s_entry_free);
    self->next_serial = 1;
    return self;
}

void gw_auth_destroy (gw_auth_t **self_p)
{
    assert (self_p);
    gw_auth_t *self = *self_p;
    if (!self)
        return;
    if (self->pending) {
        for (s_check_t *check = zhashx_first (self->pending); check;
             check = zhashx_next (self->pending)) {
            if (self->peer && check->rid)
                sbx_peer_cancel (self->peer, check->rid);
            free (check);
        }
        zhashx_destroy (&self->pending);
    }
    gw_rates_destroy (&self->rates);
    sbx_tapreader_destroy (&self->reader);
    zhashx_destroy (&self->cache);
    free (self->base_url);
    free (self->mcp_url);
    free (self);
    *self_p = NULL;
}

int gw_auth_start (gw_auth_t *self, zloop_t *loop)
{
    assert (self);
    if (!self->reader)
        return 0; //  self-tests: no broker to follow or to report to
    if (gw_rates_start (self->rates, loop))
        return -1;
    return sbx_tapreader_start (self->reader, loop);
}

//  Forgets the cached answers whose caller has this key id (by_account false) or this
//  account id (true), and keeps none of the answers in flight.
static void s_forget (gw_auth_t *self, const char *id, bool by_account)
{
    assert (self);
    self->forgets++;
    if (!id)
        return;
    //  Collected first: a zhashx must not change while it is walked.
    zlistx_t *stale = zlistx_new ();
    for (s_entry_t *entry = zhashx_first (self->cache); entry && stale;
         entry = zhashx_next (self->cache)) {
        const char *have = !entry->caller ? NULL
                           : by_account   ? entry->caller->account_id
                                          : entry->caller->key_id;
        if (have && streq (have, id))
            zlistx_add_end (stale, (void *) zhashx_cursor (self->cache));
    }
    if (!stale) {
        zhashx_purge (self->cache); //  out of memory: forget everything rather than too little
        return;
    }
    for (const char *hash = zlistx_first (stale); hash; hash = zlistx_next (stale))
        zhashx_delete (self->cache, hash);
    zlistx_destroy (&stale);
}

void gw_auth_forget_key (gw_auth_t *self, const char *key_id)
{
    s_forget (self, key_id, false);
}

void gw_auth_forget_account (gw_auth_t *self, const char *account_id)
{
    s_forget (self, account_id, true);
}

bool gw_auth_account_refusal (const char *message)
{
    return message && strncmp (message, "account disabled: ", 18) == 0;
}

//  The cache may answer only while nothing can have been revoked unseen: the tap reader
//  follows the log and the broker it follows is the one answering. Otherwise every
//  credential is asked again (a broker restart, a tap that fell behind).
static bool s_cache_trusted (gw_auth_t *self)
{
    if (!self->reader)
        return true; //  self-tests: no broker, no tap
    bool welcomed = sbx_peer_welcomed (self->peer);
    if (welcomed != self->welcomed) {
        zhashx_purge (self->cache);
        self->forgets++;
        self->welcomed = welcomed;
    }
    return welcomed && sbx_tapreader_caught_up (self->reader);
}

const char *gw_auth_base_url (gw_auth_t *self)
{
    return self->base_url;
}

const char *gw_auth_bearer (const char *header)
{
    if (!header)
        return NULL;
    while (*header == ' ')
        header++;
    if (strncasecmp (header, "Bearer ", 7) != 0)
        return NULL;
    const char *token = header + 7;
    while (*token == ' ')
        token++;
    return *token ? token : NULL;
}

static void s_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_check_t *check = arg;
    gw_auth_t *self = check->auth;
    zhashx_delete (self->pending, (void *) (uintptr_t) check->serial);
    sbx_msg_t *reply = *reply_p;
    sbx_auth_key_ok_t *ok = reply->type == SBX_MSG_AUTH_KEY_OK ? sbx_msg_auth_key_ok (reply) : NULL;
    bool oauth = ok && ok->caller && ok->caller->kind == SBX_CALLER_KIND_OAUTH;
    if (oauth && (!ok->resource || !streq (ok->resource, self->mcp_url))) {
        //  A token for another resource (RFC 8707 audience) is not good here.
        check->fn (NULL, SBX_E_UNAUTHENTICATED, "this access token was issued for another resource",
                   check->arg);
    } else if (ok && ok->caller) {
        s_entry_t *entry = calloc (1, sizeof *entry);
        uint64_t now = sbx_clock_now_ms ();
        uint64_t ttl = oauth ? S_OAUTH_CACHE_MS : self->cache_ms;
        if (ttl > self->cache_ms)
            ttl = self->cache_ms;
        if (ok->expires_ms && ok->expires_ms < now + ttl)
            ttl = ok->expires_ms > now ? ok->expires_ms - now : 0;
        //  A revocation seen while this answer was on its way may concern it: use it for
        //  this request (it was asked before), keep it for none after.
        if (entry && ttl && check->forgets == self->forgets && s_cache_trusted (self)) {
            entry->caller = gw_auth_caller_dup (ok->caller);
            entry->until_mono = sbx_clock_mono_ms () + ttl;
            if (zhashx_size (self->cache) >= S_CACHE_MAX)
                zhashx_purge (self->cache);
            zhashx_update (self->cache, check->hash, entry);
        } else
            free (entry);
        if (ok->caller->key_id)
            gw_rates_set (self->rates, ok->caller->key_id, ok->requests_per_second);
        check->fn (ok->caller, SBX_OK, NULL, check->arg);
    } else if (reply->type == SBX_MSG_ERROR)
        check->fn (NULL, sbx_msg_error (reply)->code, sbx_msg_error (reply)->message, check->arg);
    else
        check->fn (NULL, SBX_E_INTERNAL, "unexpected answer to auth.key", check->arg);
    free (check);
}

void gw_auth_check (gw_auth_t *self, const char *token, gw_auth_fn *fn, void *arg)
{
    assert (self && fn);
    //  Keys are "sbx_" + 43 base62: anything else is refused without asking.
    for (const char *p = token; p && *p; p++)
        if ((unsigned char) *p <= 0x20 || (unsigned char) *p >= 0x7f) {
            //  Not a wrong key but a malformed header (RFC 6750 invalid_request).
            fn (NULL, SBX_E_INVALID_ARGUMENT,
                "the Authorization header's token holds spaces, control characters or bytes "
                "beyond ASCII; an sbx credential is sbx_ followed by letters, digits and _",
                arg);
            return;
        }
    if (!token || strncmp (token, "sbx_", 4) != 0 || strlen (token) > 128) {
        fn (NULL, SBX_E_UNAUTHENTICATED, "this API key is not valid", arg);
        return;
    }
    char hash[65];
    sbx_secret_hash (token, hash);
    s_entry_t *entry = s_cache_trusted (self) ? zhashx_lookup (self->cache, hash) : NULL;
    if (entry && entry->until_mono > sbx_clock_mono_ms () && entry->caller) {
        fn (entry->caller, SBX_OK, NULL, arg);
        return;
    }
    if (entry)
        zhashx_delete (self->cache, hash);
    s_check_t *check = calloc (1, sizeof *check);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_AUTH_KEY);
    if (!check || !request || sbx_str_set (&sbx_msg_auth_key (request)->key, token)) {
        free (check);
        sbx_msg_destroy (&request);
        fn (NULL, SBX_E_INTERNAL, "out of memory", arg);
        return;
    }
    check->auth = self;
    check->serial = self->next_serial++;
    memcpy (check->hash, hash, sizeof hash);
    check->fn = fn;
    check->arg = arg;
    check->forgets = self->forgets;
    zhashx_insert (self->pending, (void *) (uintptr_t) check->serial, check);
    uint64_t serial = check->serial;
    uint64_t rid = sbx_peer_request (self->peer, &request, 10000, s_on_reply, check);
    //  The reply may already have come (a send that failed is answered at once).
    s_check_t *still = zhashx_lookup (self->pending, (void *) (uintptr_t) serial);
    if (still)
        still->rid = rid;
}

int gw_auth_take (gw_auth_t *self, const sbx_caller_t *caller, gw_auth_limit_t *limit)
{
    int rc = gw_rates_take (self->rates, caller ? caller->key_id : NULL, limit);
    if (rc)
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_RATE_LIMITED_TOTAL, 1, "key");
    return rc;
}

void gw_auth_rate_counts (gw_auth_t *self, uint64_t *gateways, uint64_t *keys, uint64_t *shared)
{
    gw_rates_counts (self->rates, gateways, keys, shared);
}

void gw_auth_rate_headers (gw_request_t *req, const gw_auth_limit_t *limit)
{
    char value[32];
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->limit);
    gw_request_add_header (req, "RateLimit-Limit", value);
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->remaining);
    gw_request_add_header (req, "RateLimit-Remaining", value);
    snprintf (value, sizeof value, "%llu", (unsigned long long) limit->reset_s);
    gw_request_add_header (req, "RateLimit-Reset", value);
    gw_request_add_header (req, "Retry-After", value);
}

//  The 401's JSON-RPC body saying why (keys sorted, as the standard one), or NULL.
static char *s_refused_body (const char *message)
{
    json_t *error = json_pack ("{s:{s:i, s:s+}, s:n, s:s}", "error", "code", -32001, "message",
                               "Unauthorized: ", message, "id", "jsonrpc", "2.0");
    char *body = error ? json_dumps (error, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref (error);
    return body;
}

void gw_auth_respond_401 (gw_auth_t *self, gw_request_t *req)
{
    gw_auth_respond_refused (self, req, NULL);
}

void gw_auth_respond_refused (gw_auth_t *self, gw_request_t *req, const char *message)
{
    char header[600];
    snprintf (header, sizeof header,
              "Bearer resource_metadata=\"%s/.well-known/oauth-protected-resource/mcp\", "
              "scope=\"sbx\"",
              self->base_url);
    gw_request_add_header (req, "WWW-Authenticate", header);
    gw_request_add_header (req, "Cache-Control", "no-store");
    //  Keys sorted, as the reference server sends it.
    const char *body = "{\"error\":{\"code\":-32001,\"message\":\"Unauthorized: send "
                       "Authorization: Bearer <sbx API key>, or sign in with "
                       "OAuth.\"},\"id\":null,\"jsonrpc\":\"2.0\"}";
    if (!gw_auth_account_refusal (message)) {
        gw_request_respond (req, 401, "application/json", body, strlen (body));
        return;
    }
    //  The account, not the credential: say so, the holder can ask the operator.
    char *why = s_refused_body (message);
    if (why)
        gw_request_respond (req, 401, "application/json", why, strlen (why));
    else
        gw_request_respond (req, 401, "application/json", body, strlen (body));
    free (why);
}

//  --------------------------------------------------------------------------
//  Self test: what needs no broker.

typedef struct {
    int *calls;
    sbx_code_t *code;
} s_probe_t;

static void s_probe (const sbx_caller_t *caller, sbx_code_t c, const char *message, void *arg)
{
    (void) message;
    s_probe_t *probe = arg;
    assert (caller == NULL);
    (*probe->calls)++;
    *probe->code = c;
}

void gw_auth_test (bool verbose)
{
    (void) verbose;
    assert (streq (gw_auth_bearer ("Bearer sbx_abc"), "sbx_abc"));
    assert (streq (gw_auth_bearer ("bearer   sbx_abc"), "sbx_abc"));
    assert (gw_auth_bearer ("Basic dXNlcjpwYXNz") == NULL);
    assert (gw_auth_bearer ("Bearer ") == NULL);
    assert (gw_auth_bearer (NULL) == NULL);

    //  The base URL follows listen, domain and tls like `sbx status`.
    char dir[] = "/tmp/gw_auth_test_XXXXXX";
    assert (mkdtemp (dir));
    char path[300];
    snprintf (path, sizeof path, "%s/sbx.conf", dir);
    FILE *file = fopen (path, "w");
    assert (file);
    fprintf (file, "listen = 0.0.0.0:443\ndomain = sbx.example.com\n");
    fclose (file);
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    gw_auth_t *auth = gw_auth_new (config, NULL);
    assert (auth);
    assert (streq (gw_auth_base_url (auth), "https://sbx.example.com"));
    gw_auth_destroy (&auth);
    sbx_config_destroy (&config);
    file = fopen (path, "w");
    fprintf (file, "listen = 127.0.0.1:8443\n");
    fclose (file);
    config = sbx_config_new (dir);
    auth = gw_auth_new (config, NULL);
    assert (streq (gw_auth_base_url (auth), "https://localhost:8443"));

    //  Tokens that can't be keys are refused at once, without the broker.
    int calls = 0;
    sbx_code_t code = SBX_OK;
    s_probe_t probe = {&calls, &code};
    gw_auth_check (auth, "not-a-key", s_probe, &probe);
    assert (calls == 1 && code == SBX_E_UNAUTHENTICATED);
    //  Bytes no credential has are the request's fault, not a wrong key.
    gw_auth_check (auth, "sbx_\xff\xfe", s_probe, &probe);
    assert (calls == 2 && code == SBX_E_INVALID_ARGUMENT);
    gw_auth_check (auth, "sbx_a\x01b", s_probe, &probe);
    assert (calls == 3 && code == SBX_E_INVALID_ARGUMENT);

    //  A disabled account: every cached credential of it goes, the others' stay.
    const char *accounts[] = {"acc_ann", "acc_ann", "acc_bob"};
    const char *hashes[] = {"h-key", "h-oauth", "h-bob"};
    for (int i = 0; i < 3; i++) {
        s_entry_t *entry = calloc (1, sizeof *entry);
        sbx_caller_t caller = {.kind = SBX_CALLER_KIND_API_KEY,
                               .account_id = (char *) accounts[i],
                               .key_id = (char *) hashes[i]};
        entry->caller = gw_auth_caller_dup (&caller);
        entry->until_mono = sbx_clock_mono_ms () + 60000;
        zhashx_insert (auth->cache, hashes[i], entry);
    }
    uint64_t forgets = auth->forgets;
    sbx_event_t disabled = {.type = "account.disabled", .account = "acc_ann", .subject = "acc_ann"};
    s_on_event (&disabled, auth);
    assert (zhashx_size (auth->cache) == 1 && zhashx_lookup (auth->cache, "h-bob"));
    assert (auth->forgets == forgets + 1); //  answers in flight are not kept either
    gw_auth_forget_key (auth, "h-bob");
    assert (zhashx_size (auth->cache) == 0);
    assert (gw_auth_account_refusal ("account disabled: the account of this credential"));
    assert (!gw_auth_account_refusal ("this API key is not valid"));
    assert (!gw_auth_account_refusal (NULL));
    gw_auth_destroy (&auth);
    char *body = s_refused_body ("account disabled: \"x\" is");
    assert (body && streq (body, "{\"error\":{\"code\":-32001,\"message\":\"Unauthorized: "
                                 "account disabled: \\\"x\\\" is\"},\"id\":null,"
                                 "\"jsonrpc\":\"2.0\"}"));
    free (body);
    sbx_config_destroy (&config);
    zsys_dir_delete ("%s/run", dir);
    zsys_dir_delete ("%s/logs", dir);
    zsys_dir_delete ("%s/keys", dir);
    unlink (path);
    rmdir (dir);
}
