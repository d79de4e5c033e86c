/*  gw_broker - see gw_broker.h */
#include "gw_broker.h"
#include "sbx_idmap.h"
#include "sbx_urls.h"
#include "gw_auth.h"
#include "gw_cache.h"

#include <assert.h>
#include <signal.h>

struct gw_broker_t {
    sbx_peer_t *peer;
    char *box_suffix; //  ".box.DOMAIN[:PORT]"
    bool tls;
    zhashx_t *pending; //  handle → s_pending_t
    uint64_t next_handle;
    gw_cache_t *cache; //  the gateway's read copy, or NULL
};

typedef struct {
    gw_broker_t *broker;
    uint64_t handle, rid;
    bool agent; //  the reply is a sandbox.agent.ok whose inner message is the answer
    gw_broker_fn *fn;
    void *arg;
    gw_cache_ticket_t ticket;
} s_pending_t;

gw_broker_t *gw_broker_new (sbx_config_t *config, sbx_peer_t *peer)
{
    gw_broker_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->next_handle = 1;
    //  Sandbox URLs: https://LABEL.box.DOMAIN, with the listen port when it is not 443.
    self->tls = !config || sbx_urls_https (config);
    self->box_suffix = config ? sbx_urls_box_suffix (config) : strdup (".box.localhost");
    self->pending = sbx_idmap_new ();
    if (!self->box_suffix || !self->pending) {
        gw_broker_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_broker_destroy (gw_broker_t **self_p)
{
    assert (self_p);
    gw_broker_t *self = *self_p;
    if (!self)
        return;
    if (self->pending) {
        for (s_pending_t *p = zhashx_first (self->pending); p; p = zhashx_next (self->pending)) {
            if (self->peer && p->rid)
                sbx_peer_cancel (self->peer, p->rid);
            if (self->cache)
                gw_cache_answer (self->cache, &p->ticket, NULL);
            free (p);
        }
        zhashx_destroy (&self->pending);
    }
    free (self->box_suffix);
    free (self);
    *self_p = NULL;
}

static void s_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_pending_t *p = arg;
    zhashx_delete (p->broker->pending, (void *) (uintptr_t) p->handle);
    gw_broker_fn *fn = p->fn;
    void *fn_arg = p->arg;
    bool agent = p->agent;
    sbx_msg_t *reply = *reply_p;
    if (p->broker->cache)
        gw_cache_answer (p->broker->cache, &p->ticket, reply);
    free (p);
    if (reply->type == SBX_MSG_ERROR) {
        fn (NULL, sbx_msg_error (reply)->code, sbx_msg_error (reply)->message, fn_arg);
        return;
    }
    if (!agent) {
        fn (reply, SBX_OK, NULL, fn_arg);
        return;
    }
    sbx_err_t err;
    sbx_bytes_t *bytes = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *inner = sbx_msg_decode (bytes->data, bytes->size, &err);
    if (!inner) {
        char message[600];
        snprintf (message, sizeof message, "the guest agent's answer does not decode: %.500s",
                  err.message);
        fn (NULL, SBX_E_INTERNAL, message, fn_arg);
    } else if (inner->type == SBX_MSG_ERROR)
        fn (NULL, sbx_msg_error (inner)->code, sbx_msg_error (inner)->message, fn_arg);
    else
        fn (inner, SBX_OK, NULL, fn_arg);
    sbx_msg_destroy (&inner);
}

static uint64_t s_send (gw_broker_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                        uint32_t timeout_ms, bool agent, gw_broker_fn *fn, void *arg)
{
    if (!self->peer) {
        sbx_msg_destroy (request_p);
        fn (NULL, SBX_E_UNAVAILABLE, "no broker connection", arg);
        return 0;
    }
    gw_cache_ticket_t ticket = {0};
    sbx_msg_t *copy =
        self->cache && !agent ? gw_cache_lookup (self->cache, caller, *request_p, &ticket) : NULL;
    if (copy) {
        //  Answered from the gateway's copy: no round trip.
        sbx_msg_destroy (request_p);
        fn (copy, SBX_OK, NULL, arg);
        sbx_msg_destroy (&copy);
        return 0;
    }
    s_pending_t *p = calloc (1, sizeof *p);
    if (!p) {
        sbx_msg_destroy (request_p);
        if (self->cache)
            gw_cache_answer (self->cache, &ticket, NULL);
        fn (NULL, SBX_E_INTERNAL, "out of memory", arg);
        return 0;
    }
    p->ticket = ticket;
    p->broker = self;
    p->handle = self->next_handle++;
    p->agent = agent;
    p->fn = fn;
    p->arg = arg;
    uint64_t handle = p->handle;
    (*request_p)->caller = gw_auth_caller_dup (caller);
    zhashx_insert (self->pending, (void *) (uintptr_t) handle, p);
    uint64_t rid = sbx_peer_request (self->peer, request_p, timeout_ms, s_on_reply, p);
    //  A request that could not go out is answered (and p freed) at once.
    s_pending_t *still = zhashx_lookup (self->pending, (void *) (uintptr_t) handle);
    if (!still)
        return 0;
    still->rid = rid;
    return handle;
}

uint64_t gw_broker_send (gw_broker_t *self, const sbx_caller_t *caller, sbx_msg_t **request_p,
                         uint32_t timeout_ms, gw_broker_fn *fn, void *arg)
{
    return s_send (self, caller, request_p, timeout_ms, false, fn, arg);
}

uint64_t gw_broker_send_agent (gw_broker_t *self, const sbx_caller_t *caller,
                               const char *sandbox_id, sbx_msg_t **inner_p, uint32_t timeout_ms,
                               gw_broker_fn *fn, void *arg)
{
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    int rc = sbx_msg_encode (*inner_p, &data, &size, &err);
    sbx_msg_destroy (inner_p);
    if (rc) {
        fn (NULL, err.code, err.message, arg);
        return 0;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    sbx_str_set (&sbx_msg_sandbox_agent (request)->sandbox_id, sandbox_id);
    sbx_msg_sandbox_agent (request)->request.data = data;
    sbx_msg_sandbox_agent (request)->request.size = size;
    return s_send (self, caller, &request, timeout_ms, true, fn, arg);
}

void gw_broker_cancel (gw_broker_t *self, uint64_t handle)
{
    s_pending_t *p = handle ? zhashx_lookup (self->pending, (void *) (uintptr_t) handle) : NULL;
    if (!p)
        return;
    zhashx_delete (self->pending, (void *) (uintptr_t) handle);
    if (self->peer && p->rid)
        sbx_peer_cancel (self->peer, p->rid);
    if (self->cache)
        gw_cache_answer (self->cache, &p->ticket, NULL);
    free (p);
}

void gw_broker_set_cache (gw_broker_t *self, gw_cache_t *cache)
{
    assert (self);
    self->cache = cache;
}

//  --------------------------------------------------------------------------
//  JSON

sbx_sandbox_info_t *gw_broker_sandbox_info (sbx_msg_t *reply)
{
    sbx_sandbox_info_t **slot = sbx_msg_sandbox_slot (reply);
    return slot ? *slot : NULL;
}

static void s_snapshot_labels (json_t *labels, const sbx_strmap_t *map)
{
    for (size_t i = 0; i < map->count; i++)
        json_object_set_new (labels, map->keys[i], json_string (map->values[i]));
}

json_t *gw_broker_snapshot_json (const sbx_snapshot_info_t *info)
{
    json_t *labels = json_object ();
    s_snapshot_labels (labels, &info->labels);
    json_t *snapshot = json_pack (
        "{s:s, s:s?, s:s, s:s, s:s?, s:s, s:I, s:I, s:I, s:o, s:o}", "id", info->id, "name",
        info->name, "state", sbx_snapshot_state_name (info->state), "kind",
        info->kind ? sbx_snapshot_kind_name (info->kind) : "user", "sandboxId", info->sandbox_id,
        "type", info->type ? sbx_sandbox_type_name (info->type) : "small", "sizeBytes",
        (json_int_t) (info->disk_bytes + info->memory_bytes), "diskBytes",
        (json_int_t) info->disk_bytes, "memoryBytes", (json_int_t) info->memory_bytes, "createdAt",
        gw_broker_time_json (info->created_ms), "labels", labels);
    if (snapshot && info->reason)
        json_object_set_new (snapshot, "reason", json_string (info->reason));
    if (snapshot && info->parent)
        json_object_set_new (snapshot, "parentId", json_string (info->parent));
    return snapshot;
}

json_t *gw_broker_time_json (uint64_t ms)
{
    if (!ms)
        return json_null ();
    char buf[32];
    sbx_clock_iso8601 (ms, buf, sizeof buf);
    //  Seconds are enough for people: "2026-10-27T02:26:10Z".
    char *dot = strchr (buf, '.');
    if (dot)
        strcpy (dot, "Z");
    return json_string (buf);
}

//  Output that is not text must never break the answer.
json_t *gw_broker_lossy_json (const uint8_t *data, size_t size)
{
    if (!data || !size)
        return json_string ("");
    json_t *text = json_stringn ((const char *) data, size);
    if (text)
        return text;
    char *out = malloc (size * 3 + 1);
    if (!out)
        return json_string ("");
    size_t o = 0;
    for (size_t i = 0; i < size;) {
        uint8_t c = data[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= size && (n != 1 || c != 0);
        for (size_t k = 1; ok && k < n; k++)
            ok = (data[i + k] & 0xc0) == 0x80;
        if (ok && n > 1) {
            //  Overlong forms, surrogates: let jansson judge.
            json_t *probe = json_stringn ((const char *) data + i, n);
            ok = probe != NULL;
            json_decref (probe);
        }
        if (ok) {
            memcpy (out + o, data + i, n);
            o += n;
            i += n;
        } else {
            memcpy (out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    text = json_stringn (out, o);
    free (out);
    return text ? text : json_string ("");
}

char *gw_broker_sandbox_url (gw_broker_t *self, const char *label)
{
    char *url;
    if (asprintf (&url, "%s://%s%s", self->tls ? "https" : "http", label ? label : "-",
                  self->box_suffix) < 0)
        return NULL;
    return url;
}

json_t *gw_broker_sandbox_json (gw_broker_t *self, const sbx_sandbox_info_t *s)
{
    json_t *labels = json_object ();
    for (size_t i = 0; i < s->labels.count; i++)
        json_object_set_new (labels, s->labels.keys[i], json_string (s->labels.values[i]));
    char *url = gw_broker_sandbox_url (self, s->label);
    json_t *json = json_pack (
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o}", "id", s->id, "name",
        s->name ? s->name : (s->label ? s->label : s->id), "label", s->label ? s->label : "",
        "state", sbx_sandbox_state_name (s->state), "type", sbx_sandbox_type_name (s->type), "url",
        url ? url : "", "network", !s->no_network, "labels", labels, "createdAt",
        gw_broker_time_json (s->created_ms), "expiresAt", gw_broker_time_json (s->expires_ms));
    if (json && s->reason)
        json_object_set_new (json, "reason", json_string (s->reason));
    //  Published ports, each with its URL (https://<label>-<port>.box.<domain>).
    if (json && s->ports.count) {
        json_t *ports = json_array ();
        for (size_t i = 0; i < s->ports.count; i++) {
            char host[96];
            snprintf (host, sizeof host, "%s-%llu", s->label ? s->label : "-",
                      (unsigned long long) s->ports.items[i].port);
            char *port_url = gw_broker_sandbox_url (self, host);
            json_array_append_new (ports, json_pack ("{s:I, s:s, s:b}", "port",
                                                     (json_int_t) s->ports.items[i].port, "url",
                                                     port_url ? port_url : "", "public",
                                                     s->ports.items[i].public));
            free (port_url);
        }
        json_object_set_new (json, "ports", ports);
    }
    free (url);
    return json;
}

static const struct {
    const char *name;
    int number;
} s_signals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                 {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"STOP", SIGSTOP},
                 {"CONT", SIGCONT}, {"ABRT", SIGABRT}, {"ALRM", SIGALRM}, {NULL, 0}};

int gw_broker_signal_number (json_t *value)
{
    if (!value || json_is_null (value))
        return SIGTERM;
    if (json_is_integer (value)) {
        json_int_t n = json_integer_value (value);
        return n >= 1 && n <= 64 ? (int) n : -1;
    }
    if (!json_is_string (value))
        return -1;
    const char *text = json_string_value (value);
    char *end;
    long n = strtol (text, &end, 10);
    if (*text && !*end)
        return n >= 1 && n <= 64 ? (int) n : -1;
    if (strncasecmp (text, "SIG", 3) == 0)
        text += 3;
    for (int i = 0; s_signals[i].name; i++)
        if (strcasecmp (text, s_signals[i].name) == 0)
            return s_signals[i].number;
    return -1;
}

const char *gw_broker_signal_name (int number)
{
    for (int i = 0; s_signals[i].name; i++)
        if (s_signals[i].number == number)
            return s_signals[i].name;
    return NULL;
}

//  --------------------------------------------------------------------------
//  Self test

typedef struct {
    sbx_code_t code;
    int calls;
} s_probe_t;

static void s_probe (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    (void) message;
    s_probe_t *probe = arg;
    assert (!reply);
    probe->code = code;
    probe->calls++;
}

void gw_broker_test (bool verbose)
{
    (void) verbose;
    assert (gw_broker_signal_number (NULL) == SIGTERM);
    json_t *v = json_string ("SIGKILL");
    assert (gw_broker_signal_number (v) == SIGKILL);
    json_decref (v);
    v = json_string ("int");
    assert (gw_broker_signal_number (v) == SIGINT);
    json_decref (v);
    v = json_string ("9");
    assert (gw_broker_signal_number (v) == 9);
    json_decref (v);
    v = json_integer (65);
    assert (gw_broker_signal_number (v) == -1);
    json_decref (v);
    assert (streq (gw_broker_signal_name (SIGTERM), "TERM"));
    assert (gw_broker_signal_name (63) == NULL);
    json_t *lossy = gw_broker_lossy_json ((const uint8_t *) "a\xff"
                                                            "b",
                                          3);
    assert (streq (json_string_value (lossy), "a\xef\xbf\xbd"
                                              "b"));
    json_decref (lossy);
    json_t *t = gw_broker_time_json (1790000000123ULL);
    assert (streq (json_string_value (t), "2026-09-21T14:13:20Z"));
    json_decref (t);
    t = gw_broker_time_json (0);
    assert (json_is_null (t));
    json_decref (t);

    gw_broker_t *broker = gw_broker_new (NULL, NULL);
    assert (broker);
    char *url = gw_broker_sandbox_url (broker, "calm-brave-otter");
    assert (streq (url, "https://calm-brave-otter.box.localhost"));
    free (url);
    sbx_sandbox_info_t info = {.id = "sb_0123456789",
                               .label = "calm-brave-otter",
                               .state = SBX_SANDBOX_STATE_READY,
                               .type = SBX_SANDBOX_TYPE_SMALL,
                               .created_ms = 1790000000123ULL};
    json_t *json = gw_broker_sandbox_json (broker, &info);
    assert (streq (json_string_value (json_object_get (json, "name")), "calm-brave-otter"));
    assert (streq (json_string_value (json_object_get (json, "state")), "ready"));
    assert (json_is_true (json_object_get (json, "network")));
    assert (json_is_null (json_object_get (json, "expiresAt")));
    assert (!json_object_get (json, "reason"));
    json_decref (json);
    //  Without a peer a request fails at once, and nothing stays pending.
    s_probe_t probe = {0};
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    assert (gw_broker_send (broker, NULL, &request, 1000, s_probe, &probe) == 0);
    assert (!request && probe.calls == 1 && probe.code == SBX_E_UNAVAILABLE);
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    assert (gw_broker_send_agent (broker, NULL, "sb_x", &inner, 1000, s_probe, &probe) == 0);
    assert (!inner && probe.calls == 2);
    gw_broker_cancel (broker, 0);
    gw_broker_cancel (broker, 42);
    gw_broker_destroy (&broker);
    assert (!broker);
}
