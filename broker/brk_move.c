/*  brk_move - see brk_move.h */
#include "brk_move.h"
#include "brk_sandbox.h"
#include "sbx_secret.h"

#define S_RETRY_MS      30000            //  a failed move is tried again after this
#define S_OFFER_TIMEOUT (10 * 60 * 1000) //  flattening a big disk takes a while
#define S_TAKE_TIMEOUT  (60 * 60 * 1000) //  GiBs of memory state over the network

struct _brk_move_t {
    brk_ctx_t *ctx;      //  borrowed
    zhashx_t *moving;    //  source vmd → the s_move_t under way from it
    zhashx_t *failed;    //  sandbox id → when its last move failed (mono ms, as text)
    zlistx_t *names;     //  scratch: vmds, sandbox ids
    zhashx_t *connected; //  scratch: vmd instance → active count (as text)
};

typedef struct {
    brk_move_t *self;
    char *id;
    char *account;
    char *from;
    char *to;
    char *ticket;
    uint64_t started_mono;
    uint64_t bytes;
} s_move_t;

brk_move_t *brk_move_new (brk_ctx_t *ctx)
{
    brk_move_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->moving = zhashx_new ();
    self->failed = zhashx_new ();
    self->names = zlistx_new ();
    self->connected = zhashx_new ();
    if (!self->moving || !self->failed || !self->names || !self->connected) {
        brk_move_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->failed, (zhashx_destructor_fn *) zstr_free);
    zhashx_set_destructor (self->connected, (zhashx_destructor_fn *) zstr_free);
    zlistx_set_destructor (self->names, (zlistx_destructor_fn *) zstr_free);
    return self;
}

static void s_move_free (s_move_t **move_p)
{
    s_move_t *move = *move_p;
    if (!move)
        return;
    free (move->id);
    free (move->account);
    free (move->from);
    free (move->to);
    if (move->ticket)
        sbx_secret_wipe (move->ticket);
    free (move->ticket);
    free (move);
    *move_p = NULL;
}

void brk_move_destroy (brk_move_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    brk_move_t *self = *self_p;
    //  Moves under way are dropped: their answers come back to nobody (the calls' args
    //  leak with the pending requests, as brk_reconcile's do).
    zhashx_destroy (&self->moving);
    zhashx_destroy (&self->failed);
    zlistx_destroy (&self->names);
    zhashx_destroy (&self->connected);
    free (self);
    *self_p = NULL;
}

//  The move is over, well or not: the sandbox is free again, its source may move the next.
static void s_end (s_move_t *move, const char *failure)
{
    brk_move_t *self = move->self;
    if (self->ctx->in_flight)
        zhashx_delete (self->ctx->in_flight, move->id);
    if (failure) {
        sbx_warn ("sandbox=%s move from vmd %s to %s failed: %s; tried again in %d s", move->id,
                  move->from, move->to ? move->to : "(none)", failure, S_RETRY_MS / 1000);
        char *when = zsys_sprintf ("%llu", (unsigned long long) sbx_clock_mono_ms ());
        if (when)
            zhashx_update (self->failed, move->id, when);
    }
    zhashx_delete (self->moving, move->from);
    s_move_free (&move);
}

static const char *s_error_text (sbx_msg_t *answer)
{
    return answer->type == SBX_MSG_ERROR ? sbx_msg_error (answer)->message : "an unexpected answer";
}

static void s_collect_port (const brk_port_t *port, void *arg)
{
    char *text = zsys_sprintf ("%llu", (unsigned long long) port->port);
    if (text)
        zlistx_add_end (arg, text);
}

//  The sandbox is on its new vmd: its record follows, its forwards are gone. One
//  transaction with its events. 0, or -1 (nothing changed).
static int s_record (brk_move_t *self, s_move_t *move)
{
    brk_ctx_t *ctx = self->ctx;
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, move->id, &record) != 0)
        return -1;
    bool still = record.state && streq (record.state, "stopped") && record.vmd &&
                 streq (record.vmd, move->from);
    brk_sandbox_clear (&record);
    if (!still)
        return -1;
    zlistx_purge (self->names);
    if (brk_store_ports (ctx->store, move->id, s_collect_port, self->names) < 0)
        return -1;
    sbx_msg_t *moved = sbx_msg_new (SBX_MSG_SANDBOX_MOVED);
    sbx_sandbox_moved_t *body = sbx_msg_sandbox_moved (moved);
    sbx_str_set (&body->sandbox_id, move->id);
    sbx_str_set (&body->from, move->from);
    sbx_str_set (&body->to, move->to);
    body->bytes = move->bytes;
    body->ms = sbx_clock_mono_ms () - move->started_mono;
    int rc = brk_events_begin (ctx->events);
    if (rc == 0)
        rc = brk_store_sandbox_set_state (ctx->store, move->id, "stopped", move->to, NULL,
                                          sbx_clock_now_ms ()) == 0
                 ? 0
                 : -1;
    for (char *port = zlistx_first (self->names); rc == 0 && port;
         port = zlistx_next (self->names)) {
        uint64_t number = strtoull (port, NULL, 10);
        sbx_msg_t *unpublished = sbx_msg_new (SBX_MSG_SANDBOX_PORT_CHANGED);
        sbx_sandbox_port_changed_t *change = sbx_msg_sandbox_port_changed (unpublished);
        sbx_str_set (&change->sandbox_id, move->id);
        change->port = number;
        change->removed = true;
        rc = brk_store_port_delete (ctx->store, move->id, number) < 0 ||
                     brk_events_add (ctx->events, &unpublished, move->account, move->id)
                 ? -1
                 : 0;
        sbx_msg_destroy (&unpublished);
    }
    if (rc == 0)
        rc = brk_events_add (ctx->events, &moved, move->account, move->id);
    if (rc == 0)
        rc = brk_events_commit (ctx->events);
    if (rc)
        brk_events_rollback (ctx->events);
    sbx_msg_destroy (&moved);
    zlistx_purge (self->names);
    return rc;
}

static void s_on_deleted (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    (void) ctx;
    char *what = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_VM_DELETE_OK)
        sbx_warn ("%s: the old copy stays: %s", what, s_error_text (answer));
    free (what);
}

static void s_on_take (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_move_t *move = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_VM_SHIP_TAKE_OK) {
        char why[600];
        snprintf (why, sizeof why, "vmd %s could not take it: %s", move->to, s_error_text (answer));
        //  Whatever it fetched goes; the sandbox stays on its first vmd.
        sbx_msg_t *remove = sbx_msg_new (SBX_MSG_VM_DELETE);
        if (remove && sbx_msg_set_subject (remove, move->id) == 0)
            ctx->call (ctx, SBX_ROLE_VMD, move->to, &remove, 60000, NULL, NULL);
        sbx_msg_destroy (&remove);
        s_end (move, why);
        return;
    }
    move->bytes = sbx_msg_vm_ship_take_ok (answer)->bytes;
    if (s_record (move->self, move)) {
        //  The record moved on meanwhile (it cannot: changes were refused), or the store
        //  failed: the sandbox stays where it was, the new copy goes.
        sbx_msg_t *remove = sbx_msg_new (SBX_MSG_VM_DELETE);
        if (remove && sbx_msg_set_subject (remove, move->id) == 0)
            ctx->call (ctx, SBX_ROLE_VMD, move->to, &remove, 60000, NULL, NULL);
        sbx_msg_destroy (&remove);
        s_end (move, "cannot record the move");
        return;
    }
    sbx_info ("sandbox=%s moved from vmd %s to %s: %llu bytes in %llu ms", move->id, move->from,
              move->to, (unsigned long long) move->bytes,
              (unsigned long long) (sbx_clock_mono_ms () - move->started_mono));
    //  The old copy goes.
    sbx_msg_t *remove = sbx_msg_new (SBX_MSG_VM_DELETE);
    char *what = zsys_sprintf ("sandbox=%s moved off vmd %s", move->id, move->from);
    if (remove && what && sbx_msg_set_subject (remove, move->id) == 0 &&
        ctx->call (ctx, SBX_ROLE_VMD, move->from, &remove, 120000, s_on_deleted, what) == 0)
        what = NULL;
    else
        sbx_warn ("sandbox=%s moved off vmd %s, which is gone: its old copy stays there", move->id,
                  move->from);
    sbx_msg_destroy (&remove);
    free (what);
    s_end (move, NULL);
}

static void s_on_offer (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_move_t *move = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type != SBX_MSG_VM_SHIP_OFFER_OK) {
        char why[600];
        snprintf (why, sizeof why, "vmd %s could not offer it: %s", move->from,
                  s_error_text (answer));
        s_end (move, why);
        return;
    }
    //  The offer goes on to the taker as it came.
    sbx_vm_ship_offer_ok_t *ok = sbx_msg_vm_ship_offer_ok (answer);
    sbx_msg_t *take = sbx_msg_new (SBX_MSG_VM_SHIP_TAKE);
    sbx_vm_ship_take_t *args = take ? sbx_msg_vm_ship_take (take) : NULL;
    if (!args || sbx_str_set (&args->sandbox_id, move->id) ||
        sbx_str_set (&args->from, move->from) || sbx_str_set (&args->ticket, move->ticket)) {
        sbx_msg_destroy (&take);
        s_end (move, "out of memory");
        return;
    }
    args->offer = ok->offer;
    ok->offer = NULL;
    if (ctx->call (ctx, SBX_ROLE_VMD, move->to, &take, S_TAKE_TIMEOUT, s_on_take, move))
        s_end (move, "its new vmd went away");
}

//  The connected vmds not being drained, with their active sandboxes; the least busy
//  one but `not`, or NULL.
static char *s_target (brk_move_t *self, const char * not )
{
    brk_ctx_t *ctx = self->ctx;
    char *best = NULL;
    uint64_t best_active = UINT64_MAX;
    for (const char *vmd = zhashx_first (self->connected); vmd;
         vmd = zhashx_next (self->connected)) {
        const char *name = zhashx_cursor (self->connected);
        uint64_t since = 0, active = 0;
        if (streq (name, not ) || brk_store_drain_since (ctx->store, name, &since) || since ||
            brk_store_sandbox_active (ctx->store, name, &active))
            continue;
        if (active < best_active) {
            free (best);
            best = strdup (name);
            best_active = active;
        }
    }
    return best;
}

static void s_add_id (const brk_sandbox_t *record, void *arg)
{
    zlistx_add_end (arg, strdup (record->id));
}

static void s_add_name (const char *name, void *arg)
{
    zlistx_add_end (arg, strdup (name));
}

//  The next stopped sandbox of vmd `from` that is not moving nor failed lately, or NULL.
static char *s_next (brk_move_t *self, const char *from)
{
    zlistx_purge (self->names);
    brk_store_sandbox_stopped_on (self->ctx->store, from, s_add_id, self->names);
    uint64_t now = sbx_clock_mono_ms ();
    char *pick = NULL;
    for (char *id = zlistx_first (self->names); id && !pick; id = zlistx_next (self->names)) {
        const char *failed = zhashx_lookup (self->failed, id);
        if (failed && now - strtoull (failed, NULL, 10) < S_RETRY_MS)
            continue;
        if (!brk_sandbox_in_flight (self->ctx, id))
            pick = strdup (id);
    }
    zlistx_purge (self->names);
    return pick;
}

static void s_start (brk_move_t *self, const char *from)
{
    brk_ctx_t *ctx = self->ctx;
    char *id = s_next (self, from);
    if (!id)
        return;
    char *to = s_target (self, from);
    if (!to) {
        sbx_debug ("vmd %s drains, but no other vmd can take its sandboxes now", from);
        free (id);
        return;
    }
    brk_sandbox_t record;
    s_move_t *move = calloc (1, sizeof *move);
    if (!move || brk_store_sandbox_find (ctx->store, id, &record) != 0) {
        free (move);
        free (id);
        free (to);
        return;
    }
    move->self = self;
    move->id = id;
    move->account = record.account_id ? strdup (record.account_id) : NULL;
    move->from = strdup (from);
    move->to = to;
    move->ticket = sbx_secret_token ("", 48);
    move->started_mono = sbx_clock_mono_ms ();
    brk_sandbox_clear (&record);
    sbx_msg_t *offer = sbx_msg_new (SBX_MSG_VM_SHIP_OFFER);
    if (!move->from || !move->ticket || !offer ||
        sbx_str_set (&sbx_msg_vm_ship_offer (offer)->sandbox_id, id) ||
        sbx_str_set (&sbx_msg_vm_ship_offer (offer)->ticket, move->ticket)) {
        sbx_msg_destroy (&offer);
        s_move_free (&move);
        return;
    }
    zhashx_insert (self->moving, from, move);
    if (ctx->in_flight)
        zhashx_insert (ctx->in_flight, id, (void *) 1);
    sbx_info ("sandbox=%s moves from vmd %s (draining) to %s", id, from, to);
    if (ctx->call (ctx, SBX_ROLE_VMD, from, &offer, S_OFFER_TIMEOUT, s_on_offer, move))
        s_end (move, "its vmd went away");
}

void brk_move_tick (brk_move_t *self)
{
    brk_ctx_t *ctx = self->ctx;
    //  The connected vmds first: a call walks the registry too (one cursor).
    zhashx_purge (self->connected);
    for (brk_peer_t *p = brk_registry_first (ctx->registry); p;
         p = brk_registry_next (ctx->registry))
        if (p->role == SBX_ROLE_VMD)
            zhashx_update (self->connected, p->instance, strdup ("1"));
    zlistx_t *drains = zlistx_new ();
    if (!drains)
        return;
    zlistx_set_destructor (drains, (zlistx_destructor_fn *) zstr_free);
    brk_store_drain_list (ctx->store, s_add_name, drains);
    for (const char *from = zlistx_first (drains); from; from = zlistx_next (drains))
        if (zhashx_lookup (self->connected, from) && !zhashx_lookup (self->moving, from))
            s_start (self, from);
    zlistx_destroy (&drains);
}
