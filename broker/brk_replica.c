/*  brk_replica - see brk_replica.h */
#include "brk_replica.h"
#include "sbx_secret.h"

#define S_EVERY_MS      2000
#define S_RETRY_MS      30000            //  a failed copy is tried again after this
#define S_ASK_TIMEOUT   10000            //  snapshotd answers from its catalog
#define S_OFFER_TIMEOUT (10 * 60 * 1000) //  flattening a big disk takes a while
#define S_TAKE_TIMEOUT  (60 * 60 * 1000) //  GiBs of memory state over the network

typedef struct {
    brk_replica_t *self;
    char *id;
    char *sandbox_id;
    char *from;
    char *to;
    char *ticket;
    sbx_sandbox_type_t type;
    uint64_t started_mono;
    uint64_t bytes;
} s_copy_t;

struct _brk_replica_t {
    brk_ctx_t *ctx;    //  borrowed
    s_copy_t *copying; //  the copy under way, or NULL
    bool asking;       //  snap.replica.next is out
    uint64_t next_mono;
    zhashx_t *failed; //  snapshot id → when its last copy failed (mono ms, as text)
    zhashx_t *seen;   //  host → when it was last connected (mono ms, as text)
    uint64_t started_mono;
    uint64_t lost_after_ms; //  vmd.lost_after_ms: a host away this long is gone (0: never)
};

brk_replica_t *brk_replica_new (brk_ctx_t *ctx)
{
    brk_replica_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->failed = zhashx_new ();
    self->seen = zhashx_new ();
    self->started_mono = sbx_clock_mono_ms ();
    self->lost_after_ms =
        sbx_config_get_range (ctx->config, "vmd.lost_after_ms", 30000, 0, 24 * 3600 * 1000ull);
    if (!self->failed || !self->seen) {
        brk_replica_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->failed, (zhashx_destructor_fn *) zstr_free);
    zhashx_set_destructor (self->seen, (zhashx_destructor_fn *) zstr_free);
    return self;
}

static void s_copy_free (s_copy_t **copy_p)
{
    s_copy_t *copy = *copy_p;
    if (!copy)
        return;
    free (copy->id);
    free (copy->sandbox_id);
    free (copy->from);
    free (copy->to);
    if (copy->ticket)
        sbx_secret_wipe (copy->ticket);
    free (copy->ticket);
    free (copy);
    *copy_p = NULL;
}

void brk_replica_destroy (brk_replica_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    brk_replica_t *self = *self_p;
    //  A copy under way is dropped: its answers come back to nobody (the calls' args
    //  leak with the pending requests, as brk_move's do).
    zhashx_destroy (&self->failed);
    zhashx_destroy (&self->seen);
    free (self);
    *self_p = NULL;
}

static const char *s_error_text (sbx_msg_t *answer)
{
    return answer->type == SBX_MSG_ERROR ? sbx_msg_error (answer)->message : "an unexpected answer";
}

//  The copy is over, well or not: the next may start.
static void s_end (s_copy_t *copy, const char *failure)
{
    brk_replica_t *self = copy->self;
    if (failure) {
        sbx_warn ("snapshot=%s copy from host %s to %s failed: %s; tried again in %d s", copy->id,
                  copy->from, copy->to, failure, S_RETRY_MS / 1000);
        char *when = zsys_sprintf ("%llu", (unsigned long long) sbx_clock_mono_ms ());
        if (when)
            zhashx_update (self->failed, copy->id, when);
    }
    self->copying = NULL;
    s_copy_free (&copy);
}

static void s_on_done (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    (void) ctx;
    s_copy_t *copy = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_SNAP_REPLICA_DONE_OK) {
        s_end (copy, s_error_text (answer));
        return;
    }
    sbx_info ("snapshot=%s (of sandbox %s) copied from host %s to %s: %llu bytes in %llu ms",
              copy->id, copy->sandbox_id ? copy->sandbox_id : "?", copy->from, copy->to,
              (unsigned long long) copy->bytes,
              (unsigned long long) (sbx_clock_mono_ms () - copy->started_mono));
    s_end (copy, NULL);
}

static void s_on_take (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_copy_t *copy = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_VM_SHIP_TAKE_OK) {
        s_end (copy, s_error_text (answer));
        return;
    }
    copy->bytes = sbx_msg_vm_ship_take_ok (answer)->bytes;
    sbx_msg_t *done = sbx_msg_new (SBX_MSG_SNAP_REPLICA_DONE);
    sbx_snap_replica_done_t *body = done ? sbx_msg_snap_replica_done (done) : NULL;
    if (!body || sbx_str_set (&body->snapshot_id, copy->id) ||
        sbx_str_set (&body->from, copy->from)) {
        sbx_msg_destroy (&done);
        s_end (copy, "out of memory");
        return;
    }
    body->bytes = copy->bytes;
    body->ms = sbx_clock_mono_ms () - copy->started_mono;
    //  The taker's snapshotd: the files are in its store.
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, copy->to, &done, S_ASK_TIMEOUT, s_on_done, copy))
        s_end (copy, "the taking host's snapshotd went away (its next start removes the files)");
}

static void s_on_offer (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_copy_t *copy = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_VM_SHIP_OFFER_OK) {
        s_end (copy, s_error_text (answer));
        return;
    }
    sbx_msg_t *take = sbx_msg_new (SBX_MSG_VM_SHIP_TAKE);
    sbx_vm_ship_take_t *args = take ? sbx_msg_vm_ship_take (take) : NULL;
    if (!args || sbx_str_set (&args->sandbox_id, copy->sandbox_id) ||
        sbx_str_set (&args->snapshot_id, copy->id) || sbx_str_set (&args->from, copy->from) ||
        sbx_str_set (&args->ticket, copy->ticket)) {
        sbx_msg_destroy (&take);
        s_end (copy, "out of memory");
        return;
    }
    args->offer = sbx_msg_vm_ship_offer_ok (answer)->offer;
    sbx_msg_vm_ship_offer_ok (answer)->offer = NULL;
    if (ctx->call (ctx, SBX_ROLE_VMD, copy->to, &take, S_TAKE_TIMEOUT, s_on_take, copy))
        s_end (copy, "the taking vmd went away");
}

//  snapshotd's choice: a copy to make, or none.
static void s_on_next (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    brk_replica_t *self = arg;
    sbx_msg_t *answer = *answer_p;
    self->asking = false;
    sbx_snap_replica_next_ok_t *next =
        answer->type == SBX_MSG_SNAP_REPLICA_NEXT_OK ? sbx_msg_snap_replica_next_ok (answer) : NULL;
    if (!next) {
        sbx_debug ("no snapshot copy now: %s", s_error_text (answer));
        return;
    }
    if (!next->snapshot_id || !next->from || !next->to || self->copying)
        return;
    s_copy_t *copy = calloc (1, sizeof *copy);
    if (!copy)
        return;
    copy->self = self;
    copy->id = strdup (next->snapshot_id);
    copy->sandbox_id = strdup (next->sandbox_id ? next->sandbox_id : "sb_unknown");
    copy->from = strdup (next->from);
    copy->to = strdup (next->to);
    copy->ticket = sbx_secret_token ("", 48);
    copy->type = next->type;
    copy->started_mono = sbx_clock_mono_ms ();
    sbx_msg_t *offer = sbx_msg_new (SBX_MSG_VM_SHIP_OFFER);
    sbx_vm_ship_offer_t *args = offer ? sbx_msg_vm_ship_offer (offer) : NULL;
    if (!copy->id || !copy->sandbox_id || !copy->from || !copy->to || !copy->ticket || !args ||
        sbx_str_set (&args->sandbox_id, copy->sandbox_id) ||
        sbx_str_set (&args->snapshot_id, copy->id) || sbx_str_set (&args->ticket, copy->ticket)) {
        sbx_msg_destroy (&offer);
        s_copy_free (&copy);
        return;
    }
    args->type = copy->type;
    self->copying = copy;
    sbx_info ("snapshot=%s (of sandbox %s) is copied from host %s to %s: user snapshots are "
              "kept on two hosts",
              copy->id, copy->sandbox_id, copy->from, copy->to);
    if (ctx->call (ctx, SBX_ROLE_VMD, copy->from, &offer, S_OFFER_TIMEOUT, s_on_offer, copy))
        s_end (copy, "the giving vmd went away");
}

//  Hosts whose copies no longer count: admitted snapshotd hosts removed, or not connected
//  for lost_after_ms (since this broker started, for one it never saw).
typedef struct {
    brk_replica_t *self;
    zhashx_t *stores; //  snapshotd instances connected now
    sbx_strlist_t *away;
    uint64_t now;
} s_away_t;

static void s_host_away (const brk_host_t *host, void *arg)
{
    s_away_t *a = arg;
    if (!host->roles || !strstr (host->roles, "snapshotd") || zhashx_lookup (a->stores, host->name))
        return;
    const char *seen = zhashx_lookup (a->self->seen, host->name);
    uint64_t since = seen ? strtoull (seen, NULL, 10) : a->self->started_mono;
    bool gone =
        host->removed_ms || (a->self->lost_after_ms && a->now - since >= a->self->lost_after_ms);
    if (gone && a->away->count < 256)
        sbx_strlist_append (a->away, host->name);
}

void brk_replica_tick (brk_replica_t *self)
{
    brk_ctx_t *ctx = self->ctx;
    uint64_t now = sbx_clock_mono_ms ();
    if (self->copying || self->asking || now < self->next_mono)
        return;
    self->next_mono = now + S_EVERY_MS;
    //  Hosts: a vmd and a snapshotd of one instance name. Collected before any call (a
    //  call walks the registry too: one cursor).
    zhashx_t *vmds = zhashx_new (), *stores = zhashx_new ();
    sbx_msg_t *ask = sbx_msg_new (SBX_MSG_SNAP_REPLICA_NEXT);
    if (!vmds || !stores || !ask) {
        zhashx_destroy (&vmds);
        zhashx_destroy (&stores);
        sbx_msg_destroy (&ask);
        return;
    }
    for (brk_peer_t *p = brk_registry_first (ctx->registry); p;
         p = brk_registry_next (ctx->registry))
        if (p->instance && (p->role == SBX_ROLE_VMD || p->role == SBX_ROLE_SNAPSHOTD))
            zhashx_update (p->role == SBX_ROLE_VMD ? vmds : stores, p->instance, (void *) 1);
    sbx_snap_replica_next_t *body = sbx_msg_snap_replica_next (ask);
    for (void *v = zhashx_first (stores); v; v = zhashx_next (stores)) {
        char *when = zsys_sprintf ("%llu", (unsigned long long) now);
        if (when)
            zhashx_update (self->seen, zhashx_cursor (stores), when);
    }
    s_away_t away = {self, stores, &body->away, now};
    brk_store_host_list (ctx->store, s_host_away, &away);
    size_t hosts = 0;
    for (void *v = zhashx_first (vmds); v; v = zhashx_next (vmds)) {
        const char *host = zhashx_cursor (vmds);
        if (!zhashx_lookup (stores, host))
            continue;
        uint64_t since = 0;
        bool draining = brk_store_drain_since (ctx->store, host, &since) == 0 && since;
        sbx_strlist_append (draining ? &body->givers : &body->hosts, host);
        hosts++;
    }
    zhashx_destroy (&vmds);
    zhashx_destroy (&stores);
    //  Snapshots whose copy failed a moment ago wait.
    zlist_t *over = zlist_new ();
    for (char *when = zhashx_first (self->failed); when; when = zhashx_next (self->failed)) {
        if (now - strtoull (when, NULL, 10) >= S_RETRY_MS && over)
            zlist_append (over, (void *) zhashx_cursor (self->failed));
        else if (body->skip.count < 64)
            sbx_strlist_append (&body->skip, zhashx_cursor (self->failed));
    }
    for (char *id = over ? zlist_first (over) : NULL; id; id = zlist_next (over)) {
        char *key = strdup (id);
        zhashx_delete (self->failed, key);
        free (key);
    }
    zlist_destroy (&over);
    if (hosts < 2 || body->hosts.count < 1) {
        sbx_msg_destroy (&ask);
        return;
    }
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &ask, S_ASK_TIMEOUT, s_on_next, self) == 0)
        self->asking = true;
}
