/*  gw_cache - see gw_cache.h */
#include "gw_cache.h"
#include "sbx_tapreader.h"

#include <assert.h>

//  Past this many sandboxes the copy starts again empty, rather than grow.
#define S_MAX_ENTRIES 100000

enum { S_NONE, S_GET, S_USAGE, S_CHANGE };

typedef struct {
    char *account; //  the sandbox's account, from its sandbox.get answer
    uint8_t *sandbox;
    size_t sandbox_size;
    char *usage_account; //  whose usage.get it answered
    uint8_t *usage;
    size_t usage_size;
    uint64_t usage_ms; //  when it was answered
    json_t *result;    //  the get_sandbox result made of both, until result_until
    uint64_t result_until;
} s_entry_t;

struct gw_cache_t {
    sbx_peer_t *peer;
    sbx_tapreader_t *reader;
    bool enabled;
    bool welcomed;      //  the broker's welcome, as last seen
    uint64_t usage_ttl; //  ms
    zhashx_t *entries;  //  sandbox id → s_entry_t
    uint64_t tick;      //  counts drops
    uint64_t dropped;   //  the tick of the last drop
    size_t inflight;    //  answers on their way that may be stored
    uint64_t hits, misses;
};

static void s_entry_destroy (void **item_p)
{
    s_entry_t *entry = *item_p;
    if (!entry)
        return;
    free (entry->account);
    free (entry->sandbox);
    free (entry->usage_account);
    free (entry->usage);
    json_decref (entry->result);
    free (entry);
    *item_p = NULL;
}

static int s_on_event (const sbx_event_t *event, void *arg)
{
    if (event->subject && strncmp (event->subject, "sb_", 3) == 0)
        gw_cache_event ((gw_cache_t *) arg, event->subject);
    return 0;
}

gw_cache_t *gw_cache_new (sbx_config_t *config, sbx_peer_t *peer)
{
    gw_cache_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->peer = peer;
    self->enabled = !config || !streq (sbx_config_get (config, "gateway.read_cache", "on"), "off");
    const char *ttl = config ? sbx_config_get (config, "gateway.usage_cache_ms", "1000") : "1000";
    char *end;
    self->usage_ttl = strtoull (ttl, &end, 10);
    if (*end || *ttl == '-') {
        sbx_warn ("gateway.usage_cache_ms: '%s' is not a number of milliseconds: 1000", ttl);
        self->usage_ttl = 1000;
    }
    self->entries = zhashx_new ();
    if (self->entries)
        zhashx_set_destructor (self->entries, s_entry_destroy);
    if (peer && self->enabled)
        self->reader = sbx_tapreader_new (config, peer, SBX_TAPREADER_NOW, s_on_event, self);
    if (!self->entries || (peer && self->enabled && !self->reader))
        gw_cache_destroy (&self);
    return self;
}

void gw_cache_destroy (gw_cache_t **self_p)
{
    assert (self_p);
    gw_cache_t *self = *self_p;
    if (!self)
        return;
    sbx_tapreader_destroy (&self->reader);
    zhashx_destroy (&self->entries);
    free (self);
    *self_p = NULL;
}

int gw_cache_start (gw_cache_t *self, zloop_t *loop)
{
    assert (self);
    return self->reader ? sbx_tapreader_start (self->reader, loop) : 0;
}

static void s_drop (gw_cache_t *self, const char *sandbox)
{
    s_entry_t *entry = zhashx_lookup (self->entries, sandbox);
    if (!entry && !self->inflight)
        return;
    if (entry)
        zhashx_delete (self->entries, sandbox);
    self->dropped = ++self->tick;
}

static void s_drop_all (gw_cache_t *self)
{
    zhashx_purge (self->entries);
    self->dropped = ++self->tick;
}

//  True when the copy can be trusted: it follows the log (no replay in flight) and the
//  broker it follows is the one answering.
static bool s_live (gw_cache_t *self)
{
    if (!self->enabled)
        return false;
    if (!self->peer)
        return true;
    bool welcomed = sbx_peer_welcomed (self->peer);
    if (welcomed != self->welcomed) {
        //  A broker that restarted may have changed things the tap has not told yet.
        s_drop_all (self);
        self->welcomed = welcomed;
    }
    return welcomed && sbx_tapreader_caught_up (self->reader);
}

//  The sandbox a request may change: its subject, unless it only reads (an agent request
//  changes the guest, not what sandbox.get answers).
static const char *s_change_subject (const sbx_msg_t *request)
{
    if (request->type == SBX_MSG_SANDBOX_GET || request->type == SBX_MSG_USAGE_GET ||
        request->type == SBX_MSG_SANDBOX_AGENT)
        return NULL;
    return sbx_msg_subject (request);
}

//  Callers that may read their own account's sandboxes from the copy.
static bool s_reader (const sbx_caller_t *caller)
{
    if (!caller || !caller->account_id || !*caller->account_id)
        return false;
    if (caller->kind != SBX_CALLER_KIND_API_KEY && caller->kind != SBX_CALLER_KIND_OAUTH &&
        caller->kind != SBX_CALLER_KIND_SESSION)
        return false;
    return caller->preset != SBX_KEY_PRESET_CI;
}

static sbx_msg_t *s_decode (const uint8_t *data, size_t size, uint64_t rid)
{
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (data, size, &err);
    if (msg)
        msg->rid = rid;
    return msg;
}

static int s_ticket (gw_cache_ticket_t *ticket, int kind, const char *sandbox, const char *account)
{
    if (!sandbox || strlen (sandbox) >= sizeof ticket->sandbox || !account ||
        strlen (account) >= sizeof ticket->account)
        return -1;
    ticket->kind = kind;
    strcpy (ticket->sandbox, sandbox);
    strcpy (ticket->account, account);
    return 0;
}

//  The sandbox whose totals a usage.get asks for: sandbox_ids of one, what get_sandbox
//  sends. Other forms are not kept (sandbox_id's answer has days, a totals one has none:
//  one entry must not answer for the other).
static const char *s_usage_sandbox (const sbx_usage_get_t *args)
{
    bool one = args->sandbox_ids.count == 1 && !(args->sandbox_id && *args->sandbox_id) &&
               !args->since_ms && !args->until_ms;
    return one ? args->sandbox_ids.items[0] : NULL;
}

sbx_msg_t *gw_cache_lookup (gw_cache_t *self, const sbx_caller_t *caller, const sbx_msg_t *request,
                            gw_cache_ticket_t *ticket)
{
    assert (self && request && ticket);
    memset (ticket, 0, sizeof *ticket);
    const char *changed = s_change_subject (request);
    if (changed) {
        s_drop (self, changed);
        if (s_ticket (ticket, S_CHANGE, changed, ""))
            ticket->kind = S_NONE;
        return NULL;
    }
    bool get = request->type == SBX_MSG_SANDBOX_GET;
    bool usage = request->type == SBX_MSG_USAGE_GET;
    if ((!get && !usage) || !s_live (self) || !s_reader (caller))
        return NULL;
    const char *sandbox = get ? sbx_msg_sandbox_get ((sbx_msg_t *) request)->sandbox_id
                              : s_usage_sandbox (sbx_msg_usage_get ((sbx_msg_t *) request));
    if (!sandbox || !*sandbox)
        return NULL;
    //  Usage of the caller's own account only (operators name others).
    if (usage && !streq (sbx_msg_usage_get ((sbx_msg_t *) request)->account, caller->account_id))
        return NULL;
    s_entry_t *entry = zhashx_lookup (self->entries, sandbox);
    sbx_msg_t *answer = NULL;
    if (entry && get && entry->sandbox && streq (entry->account, caller->account_id))
        answer = s_decode (entry->sandbox, entry->sandbox_size, request->rid);
    else if (entry && usage && entry->usage && streq (entry->usage_account, caller->account_id) &&
             sbx_clock_now_ms () - entry->usage_ms < self->usage_ttl)
        answer = s_decode (entry->usage, entry->usage_size, request->rid);
    if (answer) {
        self->hits++;
        return answer;
    }
    self->misses++;
    if (s_ticket (ticket, get ? S_GET : S_USAGE, sandbox, caller->account_id) == 0) {
        ticket->tick = self->tick;
        self->inflight++;
    }
    return NULL;
}

//  The entry of a sandbox, made if needed; NULL when the copy is full.
static s_entry_t *s_entry (gw_cache_t *self, const char *sandbox)
{
    s_entry_t *entry = zhashx_lookup (self->entries, sandbox);
    if (entry)
        return entry;
    if (zhashx_size (self->entries) >= S_MAX_ENTRIES)
        zhashx_purge (self->entries);
    entry = calloc (1, sizeof *entry);
    if (entry)
        zhashx_insert (self->entries, sandbox, entry);
    return entry;
}

static void s_store (uint8_t **data_p, size_t *size_p, const sbx_msg_t *reply)
{
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    if (sbx_msg_encode (reply, &data, &size, &err))
        return;
    free (*data_p);
    *data_p = data;
    *size_p = size;
}

void gw_cache_answer (gw_cache_t *self, const gw_cache_ticket_t *ticket, const sbx_msg_t *reply)
{
    assert (self && ticket);
    if (ticket->kind == S_CHANGE) {
        s_drop (self, ticket->sandbox);
        return;
    }
    if (ticket->kind != S_GET && ticket->kind != S_USAGE)
        return;
    assert (self->inflight > 0);
    self->inflight--;
    //  Anything dropped while it was on its way may be older than the drop.
    if (!reply || self->dropped > ticket->tick || !s_live (self))
        return;
    if (ticket->kind == S_GET) {
        if (reply->type != SBX_MSG_SANDBOX_GET_OK)
            return;
        sbx_sandbox_info_t *info = sbx_msg_sandbox_get_ok ((sbx_msg_t *) reply)->sandbox;
        //  Asked by label: the copy is by id only.
        if (!info || !info->id || !streq (info->id, ticket->sandbox) || !info->account ||
            !streq (info->account, ticket->account))
            return;
        s_entry_t *entry = s_entry (self, ticket->sandbox);
        if (!entry)
            return;
        s_store (&entry->sandbox, &entry->sandbox_size, reply);
        if (!entry->account || !streq (entry->account, ticket->account)) {
            free (entry->account);
            entry->account = strdup (ticket->account);
        }
    } else {
        if (reply->type != SBX_MSG_USAGE_GET_OK)
            return;
        s_entry_t *entry = s_entry (self, ticket->sandbox);
        if (!entry)
            return;
        s_store (&entry->usage, &entry->usage_size, reply);
        entry->usage_ms = sbx_clock_now_ms ();
        if (!entry->usage_account || !streq (entry->usage_account, ticket->account)) {
            free (entry->usage_account);
            entry->usage_account = strdup (ticket->account);
        }
    }
}

uint64_t gw_cache_tick (gw_cache_t *self)
{
    assert (self);
    return self->tick;
}

void gw_cache_keep_result (gw_cache_t *self, const sbx_caller_t *caller, const char *sandbox,
                           uint64_t tick, json_t *result)
{
    assert (self);
    if (!sandbox || !result || self->dropped > tick || !s_live (self) || !s_reader (caller))
        return;
    s_entry_t *entry = zhashx_lookup (self->entries, sandbox);
    if (!entry || !entry->sandbox || !entry->usage || !streq (entry->account, caller->account_id) ||
        !streq (entry->usage_account, caller->account_id))
        return;
    json_decref (entry->result);
    entry->result = json_incref (result);
    //  Its running time and cost are the usage answer's: no older than that may be.
    entry->result_until = entry->usage_ms + self->usage_ttl;
}

json_t *gw_cache_result (gw_cache_t *self, const sbx_caller_t *caller, const char *sandbox)
{
    assert (self);
    if (!sandbox || !s_live (self) || !s_reader (caller))
        return NULL;
    s_entry_t *entry = zhashx_lookup (self->entries, sandbox);
    if (!entry || !entry->result || !streq (entry->account, caller->account_id) ||
        sbx_clock_now_ms () >= entry->result_until)
        return NULL;
    self->hits++;
    return json_incref (entry->result);
}

void gw_cache_event (gw_cache_t *self, const char *subject)
{
    assert (self);
    if (subject)
        s_drop (self, subject);
}

void gw_cache_counts (gw_cache_t *self, uint64_t *hits, uint64_t *misses)
{
    assert (self);
    if (hits)
        *hits = self->hits;
    if (misses)
        *misses = self->misses;
}

//  --------------------------------------------------------------------------
//  Self-test

static sbx_msg_t *s_test_get_ok (const char *id, const char *account, sbx_sandbox_state_t state)
{
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_SANDBOX_GET_OK);
    sbx_sandbox_info_t *info = calloc (1, sizeof *info);
    assert (info);
    sbx_str_set (&info->id, id);
    sbx_str_set (&info->account, account);
    sbx_str_set (&info->label, "calm-brave-otter");
    info->state = state;
    info->type = SBX_SANDBOX_TYPE_SMALL;
    sbx_msg_sandbox_get_ok (reply)->sandbox = info;
    return reply;
}

static sbx_msg_t *s_test_get (const char *id)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_GET);
    sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, id);
    return request;
}

static sbx_sandbox_state_t s_test_state (sbx_msg_t *answer)
{
    assert (answer && answer->type == SBX_MSG_SANDBOX_GET_OK);
    return sbx_msg_sandbox_get_ok (answer)->sandbox->state;
}

void gw_cache_test (bool verbose)
{
    sbx_caller_t alice = {.kind = SBX_CALLER_KIND_API_KEY,
                          .account_id = "acc_alice",
                          .key_id = "key_a",
                          .preset = SBX_KEY_PRESET_FULL};
    sbx_caller_t bob = {.kind = SBX_CALLER_KIND_API_KEY,
                        .account_id = "acc_bob",
                        .key_id = "key_b",
                        .preset = SBX_KEY_PRESET_FULL};
    sbx_caller_t ci = alice;
    ci.preset = SBX_KEY_PRESET_CI;
    sbx_caller_t admin = {.kind = SBX_CALLER_KIND_ADMIN};

    gw_cache_t *cache = gw_cache_new (NULL, NULL);
    assert (cache);
    gw_cache_ticket_t ticket;
    sbx_msg_t *request = s_test_get ("sb_one");

    //  A miss, then the answer is stored and read back as a copy.
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    assert (ticket.kind == S_GET);
    sbx_msg_t *reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    sbx_msg_t *answer = gw_cache_lookup (cache, &alice, request, &ticket);
    assert (s_test_state (answer) == SBX_SANDBOX_STATE_READY);
    assert (streq (sbx_msg_sandbox_get_ok (answer)->sandbox->label, "calm-brave-otter"));
    sbx_msg_destroy (&answer);

    //  Another account, a ci key and an operator go to the broker.
    assert (!gw_cache_lookup (cache, &bob, request, &ticket));
    gw_cache_answer (cache, &ticket, NULL);
    assert (!gw_cache_lookup (cache, &ci, request, &ticket));
    assert (ticket.kind == S_NONE);
    assert (!gw_cache_lookup (cache, &admin, request, &ticket));
    assert (!gw_cache_lookup (cache, NULL, request, &ticket));

    //  An event drops it.
    gw_cache_event (cache, "sb_one");
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    gw_cache_ticket_t slow = ticket;

    //  An answer that was on its way when an event came is not stored: it may be older.
    gw_cache_ticket_t other;
    sbx_msg_t *request_two = s_test_get ("sb_two");
    assert (!gw_cache_lookup (cache, &alice, request_two, &other));
    gw_cache_event (cache, "sb_one");
    reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &slow, reply);
    sbx_msg_destroy (&reply);
    reply = s_test_get_ok ("sb_two", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &other, reply);
    sbx_msg_destroy (&reply);
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    gw_cache_answer (cache, &ticket, NULL);
    assert (!gw_cache_lookup (cache, &alice, request_two, &ticket));
    gw_cache_answer (cache, &ticket, NULL);

    //  A change sent through this gateway drops the entry when sent and when answered.
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    sbx_msg_t *stop = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
    sbx_str_set (&sbx_msg_sandbox_stop (stop)->sandbox_id, "sb_one");
    gw_cache_ticket_t change;
    assert (!gw_cache_lookup (cache, &alice, stop, &change));
    assert (change.kind == S_CHANGE);
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    //  A get answered before the stop was is stored, then the stop's answer drops it.
    reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    gw_cache_answer (cache, &change, NULL);
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_STOPPED);
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    answer = gw_cache_lookup (cache, &alice, request, &ticket);
    assert (s_test_state (answer) == SBX_SANDBOX_STATE_STOPPED);
    sbx_msg_destroy (&answer);
    sbx_msg_destroy (&stop);

    //  An answer for a label, or for another account, is not stored under the id asked.
    sbx_msg_t *by_label = s_test_get ("calm-brave-otter");
    assert (!gw_cache_lookup (cache, &alice, by_label, &ticket));
    reply = s_test_get_ok ("sb_one", "acc_alice", SBX_SANDBOX_STATE_READY);
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    assert (!gw_cache_lookup (cache, &alice, by_label, &ticket));
    gw_cache_answer (cache, &ticket, NULL);
    sbx_msg_destroy (&by_label);

    //  Usage: the caller's own account, kept for usage_cache_ms.
    sbx_msg_t *usage = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&sbx_msg_usage_get (usage)->account, "acc_alice");
    sbx_strlist_append (&sbx_msg_usage_get (usage)->sandbox_ids, "sb_one");
    assert (!gw_cache_lookup (cache, &alice, usage, &ticket));
    assert (ticket.kind == S_USAGE);
    reply = sbx_msg_new (SBX_MSG_USAGE_GET_OK);
    sbx_str_set (&sbx_msg_usage_get_ok (reply)->account_id, "acc_alice");
    sbx_msg_usage_get_ok (reply)->running_ms = 4200;
    gw_cache_answer (cache, &ticket, reply);
    sbx_msg_destroy (&reply);
    answer = gw_cache_lookup (cache, &alice, usage, &ticket);
    assert (answer && answer->type == SBX_MSG_USAGE_GET_OK);
    assert (sbx_msg_usage_get_ok (answer)->running_ms == 4200);
    sbx_msg_destroy (&answer);
    assert (!gw_cache_lookup (cache, &bob, usage, &ticket));
    gw_cache_answer (cache, &ticket, NULL);
    //  The same sandbox asked by sandbox_id (with days) is not answered from the copy.
    sbx_msg_t *days = sbx_msg_new (SBX_MSG_USAGE_GET);
    sbx_str_set (&sbx_msg_usage_get (days)->account, "acc_alice");
    sbx_str_set (&sbx_msg_usage_get (days)->sandbox_id, "sb_one");
    assert (!gw_cache_lookup (cache, &alice, days, &ticket) && ticket.kind == S_NONE);
    sbx_msg_destroy (&days);
    //  The sandbox's own answer is still there next to it.
    answer = gw_cache_lookup (cache, &alice, request, &ticket);
    assert (s_test_state (answer) == SBX_SANDBOX_STATE_STOPPED);
    sbx_msg_destroy (&answer);
    sbx_msg_destroy (&usage);

    //  A result made of both is kept with them, for its account only, and goes with them.
    uint64_t tick = gw_cache_tick (cache);
    json_t *result = json_pack ("{s:s}", "state", "stopped");
    gw_cache_keep_result (cache, &alice, "sb_one", tick, result);
    json_t *kept = gw_cache_result (cache, &alice, "sb_one");
    assert (kept == result);
    json_decref (kept);
    assert (!gw_cache_result (cache, &bob, "sb_one"));
    assert (!gw_cache_result (cache, &ci, "sb_one"));
    gw_cache_event (cache, "sb_one");
    assert (!gw_cache_result (cache, &alice, "sb_one"));
    //  Nor is it kept when something was dropped while it was being made.
    gw_cache_keep_result (cache, &alice, "sb_one", tick, result);
    assert (!gw_cache_result (cache, &alice, "sb_one"));
    json_decref (result);

    uint64_t hits, misses;
    gw_cache_counts (cache, &hits, &misses);
    assert (hits == 5 && misses >= 8);
    if (verbose)
        printf ("hits %llu, misses %llu ", (unsigned long long) hits, (unsigned long long) misses);
    sbx_msg_destroy (&request);
    sbx_msg_destroy (&request_two);
    gw_cache_destroy (&cache);
    assert (!cache);

    //  Off: nothing is kept.
    sbx_config_t *config = sbx_config_new (NULL);
    assert (config);
    sbx_config_set (config, "gateway.read_cache", "off");
    cache = gw_cache_new (config, NULL);
    request = s_test_get ("sb_one");
    assert (!gw_cache_lookup (cache, &alice, request, &ticket));
    assert (ticket.kind == S_NONE);
    sbx_msg_destroy (&request);
    gw_cache_destroy (&cache);
    sbx_config_destroy (&config);
}
