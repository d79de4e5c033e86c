/*  brk_hostloss - see brk_hostloss.h */
#include "brk_hostloss.h"
#include "brk_sandbox.h"

#define S_LIST_EVERY_MS 5000 //  how often the vmds holding sandboxes are read from the store

struct _brk_hostloss_t {
    brk_ctx_t *ctx; //  borrowed
    uint64_t started_ms;
    uint64_t lost_after_ms;
    zhashx_t *seen;    //  vmd instance → last heard (wall ms, as uint64_t *)
    zhashx_t *checked; //  vmd instance → the connection (joined ms) whose guests were read
    zhashx_t *asking;  //  vmd instance → 1 while its vm.list is in flight
    zlistx_t *vmds;    //  the vmds that hold sandboxes, as the store last said
    uint64_t listed_mono;
    zlistx_t *ids; //  sandbox ids, gathered before each is moved
};

typedef struct {
    brk_hostloss_t *self;
    char *vmd;
    uint64_t joined_ms;
} s_ask_t;

brk_hostloss_t *brk_hostloss_new (brk_ctx_t *ctx)
{
    brk_hostloss_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->started_ms = sbx_clock_now_ms ();
    self->lost_after_ms =
        sbx_config_get_range (ctx->config, "vmd.lost_after_ms", 30000, 0, 24 * 3600 * 1000ull);
    self->seen = zhashx_new ();
    self->checked = zhashx_new ();
    self->asking = zhashx_new ();
    self->vmds = zlistx_new ();
    self->ids = zlistx_new ();
    if (!self->seen || !self->checked || !self->asking || !self->vmds || !self->ids) {
        brk_hostloss_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->seen, (zhashx_destructor_fn *) zstr_free);
    zhashx_set_destructor (self->checked, (zhashx_destructor_fn *) zstr_free);
    zlistx_set_destructor (self->vmds, (zlistx_destructor_fn *) zstr_free);
    zlistx_set_destructor (self->ids, (zlistx_destructor_fn *) zstr_free);
    return self;
}

void brk_hostloss_destroy (brk_hostloss_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    brk_hostloss_t *self = *self_p;
    zhashx_destroy (&self->seen);
    zhashx_destroy (&self->checked);
    zhashx_destroy (&self->asking);
    zlistx_destroy (&self->vmds);
    zlistx_destroy (&self->ids);
    free (self);
    *self_p = NULL;
}

//  A number kept in a hash as a string the hash frees (czmq hashes hold pointers).
static void s_put (zhashx_t *hash, const char *key, uint64_t value)
{
    char *text = zsys_sprintf ("%llu", (unsigned long long) value);
    if (text)
        zhashx_update (hash, key, text);
}

static uint64_t s_get (zhashx_t *hash, const char *key)
{
    const char *text = zhashx_lookup (hash, key);
    return text ? strtoull (text, NULL, 10) : 0;
}

static void s_add_name (const char *name, void *arg)
{
    zlistx_add_end (arg, strdup (name));
}

static void s_gather (const brk_sandbox_t *record, void *arg)
{
    zlistx_add_end (arg, strdup (record->id));
}

//  --------------------------------------------------------------------------
//  A vmd back: what it has

static void s_on_list (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_ask_t *ask = arg;
    brk_hostloss_t *self = ask->self;
    sbx_msg_t *answer = *answer_p;
    zhashx_delete (self->asking, ask->vmd);
    if (answer->type != SBX_MSG_VM_LIST_OK) {
        sbx_debug ("vmd %s: vm.list: %s (asked again in a second)", ask->vmd,
                   answer->type == SBX_MSG_ERROR ? sbx_msg_error (answer)->message : "?");
        free (ask->vmd);
        free (ask);
        return;
    }
    sbx_vm_info_list_t *vms = &sbx_msg_vm_list_ok (answer)->vms;
    //  Its lost sandboxes follow their guests (100 at a time: the rest at its next answer).
    zlistx_purge (self->ids);
    int lost = brk_store_sandbox_lost (ctx->store, ask->vmd, s_gather, self->ids);
    for (char *id = zlistx_first (self->ids); id; id = zlistx_next (self->ids)) {
        sbx_vm_info_t *guest = NULL;
        for (size_t i = 0; i < vms->count && !guest; i++)
            if (vms->items[i].sandbox_id && streq (vms->items[i].sandbox_id, id))
                guest = &vms->items[i];
        brk_sandbox_host_back (ctx, id, ask->vmd, guest != NULL,
                               guest ? guest->state : SBX_SANDBOX_STATE__UNSET);
    }
    zlistx_purge (self->ids);
    //  Guests whose sandboxes were deleted while their host was away.
    for (size_t i = 0; i < vms->count; i++) {
        brk_sandbox_t record;
        const char *id = vms->items[i].sandbox_id;
        if (!id || brk_store_sandbox_find (ctx->store, id, &record) != 0)
            continue;
        if (streq (record.state, "deleted") && record.vmd && streq (record.vmd, ask->vmd)) {
            sbx_msg_t *remove = sbx_msg_new (SBX_MSG_VM_DELETE);
            if (remove && sbx_msg_set_subject (remove, id) == 0 &&
                ctx->call (ctx, SBX_ROLE_VMD, ask->vmd, &remove, 60000, NULL, NULL) == 0)
                sbx_info ("sandbox=%s deleted while its host was lost: vmd %s deletes its guest "
                          "now",
                          id, ask->vmd);
            sbx_msg_destroy (&remove);
        }
        brk_sandbox_clear (&record);
    }
    //  Done for this connection, unless there were more lost ones than one answer takes.
    if (lost < 100)
        s_put (self->checked, ask->vmd, ask->joined_ms);
    free (ask->vmd);
    free (ask);
}

static void s_check (brk_hostloss_t *self, const char *vmd, uint64_t joined_ms)
{
    if (zhashx_lookup (self->asking, vmd) || s_get (self->checked, vmd) == joined_ms)
        return;
    //  Nothing of it lost: nothing to ask.
    int any = brk_store_sandbox_lost_any (self->ctx->store, vmd);
    if (any == 0)
        s_put (self->checked, vmd, joined_ms);
    if (any != 1)
        return;
    s_ask_t *ask = calloc (1, sizeof *ask);
    sbx_msg_t *list = sbx_msg_new (SBX_MSG_VM_LIST);
    if (!ask || !list || !(ask->vmd = strdup (vmd))) {
        free (ask);
        sbx_msg_destroy (&list);
        return;
    }
    ask->self = self;
    ask->joined_ms = joined_ms;
    zhashx_insert (self->asking, vmd, (void *) 1);
    if (self->ctx->call (self->ctx, SBX_ROLE_VMD, vmd, &list, 5000, s_on_list, ask)) {
        zhashx_delete (self->asking, vmd);
        free (ask->vmd);
        free (ask);
    }
}

//  --------------------------------------------------------------------------
//  A vmd away

static void s_lose (brk_hostloss_t *self, const char *vmd, uint64_t since)
{
    zlistx_purge (self->ids);
    if (brk_store_sandbox_held (self->ctx->store, vmd, s_gather, self->ids) <= 0)
        return;
    char when[40];
    sbx_clock_iso8601 (since, when, sizeof when);
    char reason[512];
    snprintf (reason, sizeof reason,
              BRK_HOST_LOST ": vmd %s has not answered since %s; the sandbox comes back as it "
                            "was if its host returns with it, or delete it",
              vmd, when);
    sbx_warn ("vmd %s silent since %s (over vmd.lost_after_ms = %llu): %zu sandbox(es) to error, "
              "host lost",
              vmd, when, (unsigned long long) self->lost_after_ms, zlistx_size (self->ids));
    for (char *id = zlistx_first (self->ids); id; id = zlistx_next (self->ids))
        brk_sandbox_host_lost (self->ctx, id, vmd, since, reason);
    zlistx_purge (self->ids);
}

void brk_hostloss_tick (brk_hostloss_t *self)
{
    brk_ctx_t *ctx = self->ctx;
    uint64_t now = sbx_clock_now_ms ();
    //  The connected vmds first: a call walks the registry too (one cursor).
    zhashx_t *connected = zhashx_new ();
    if (!connected)
        return;
    zhashx_set_destructor (connected, (zhashx_destructor_fn *) zstr_free);
    for (brk_peer_t *p = brk_registry_first (ctx->registry); p;
         p = brk_registry_next (ctx->registry)) {
        if (p->role != SBX_ROLE_VMD)
            continue;
        s_put (self->seen, p->instance, p->last_seen_ms ? p->last_seen_ms : now);
        s_put (connected, p->instance, p->joined_ms);
    }
    for (char *joined = zhashx_first (connected); joined; joined = zhashx_next (connected))
        s_check (self, zhashx_cursor (connected), strtoull (joined, NULL, 10));
    zhashx_destroy (&connected);
    if (!self->lost_after_ms)
        return;
    uint64_t mono = sbx_clock_mono_ms ();
    if (!self->listed_mono || mono - self->listed_mono >= S_LIST_EVERY_MS) {
        zlistx_purge (self->vmds);
        if (brk_store_sandbox_vmds (ctx->store, s_add_name, self->vmds) >= 0)
            self->listed_mono = mono;
    }
    for (char *vmd = zlistx_first (self->vmds); vmd; vmd = zlistx_next (self->vmds)) {
        if (brk_registry_find (ctx->registry, SBX_ROLE_VMD, vmd))
            continue;
        uint64_t since = s_get (self->seen, vmd);
        if (!since)
            since = self->started_ms;
        if (now - since >= self->lost_after_ms)
            s_lose (self, vmd, since);
    }
}
