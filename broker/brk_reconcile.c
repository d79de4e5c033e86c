/*  brk_reconcile - see brk_reconcile.h */
#include "brk_reconcile.h"
#include "brk_sandbox.h"

struct _brk_reconcile_t {
    brk_ctx_t *ctx;    //  borrowed
    zhashx_t *asking;  //  vmd instance → 1 while its vm.list is in flight
    zlistx_t *orphans; //  ids, while a vmd's records are gathered
};

typedef struct {
    brk_reconcile_t *self;
    char *vmd;
} s_ask_t;

brk_reconcile_t *brk_reconcile_new (brk_ctx_t *ctx)
{
    brk_reconcile_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->asking = zhashx_new ();
    self->orphans = zlistx_new ();
    if (!self->asking || !self->orphans) {
        brk_reconcile_destroy (&self);
        return NULL;
    }
    zlistx_set_destructor (self->orphans, (zlistx_destructor_fn *) zstr_free);
    return self;
}

void brk_reconcile_destroy (brk_reconcile_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    brk_reconcile_t *self = *self_p;
    zhashx_destroy (&self->asking);
    zlistx_destroy (&self->orphans);
    free (self);
    *self_p = NULL;
}

static void s_orphan (const brk_sandbox_t *record, void *arg)
{
    brk_reconcile_t *self = arg;
    if (!brk_sandbox_in_flight (self->ctx, record->id))
        zlistx_add_end (self->orphans, strdup (record->id));
}

//  vmd's guests: each orphan of its settled by them.
static void s_on_list (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_ask_t *ask = arg;
    brk_reconcile_t *self = ask->self;
    sbx_msg_t *answer = *answer_p;
    zhashx_delete (self->asking, ask->vmd);
    if (answer->type == SBX_MSG_VM_LIST_OK) {
        zlistx_purge (self->orphans);
        brk_store_sandbox_moving (ctx->store, ask->vmd, s_orphan, self);
        sbx_vm_info_list_t *vms = &sbx_msg_vm_list_ok (answer)->vms;
        for (char *id = zlistx_first (self->orphans); id; id = zlistx_next (self->orphans)) {
            sbx_vm_info_t *guest = NULL;
            for (size_t i = 0; i < vms->count && !guest; i++)
                if (vms->items[i].sandbox_id && streq (vms->items[i].sandbox_id, id))
                    guest = &vms->items[i];
            brk_sandbox_settle (ctx, id, ask->vmd, guest != NULL,
                                guest ? guest->state : SBX_SANDBOX_STATE__UNSET,
                                guest ? guest->reason : NULL);
        }
        zlistx_purge (self->orphans);
    } else
        sbx_debug ("vmd %s: vm.list: %s", ask->vmd,
                   answer->type == SBX_MSG_ERROR ? sbx_msg_error (answer)->message : "?");
    free (ask->vmd);
    free (ask);
}

void brk_reconcile_tick (brk_reconcile_t *self)
{
    brk_ctx_t *ctx = self->ctx;
    //  The connected vmds first: a call walks the registry too (one cursor).
    zlistx_t *vmds = zlistx_new ();
    if (!vmds)
        return;
    zlistx_set_destructor (vmds, (zlistx_destructor_fn *) zstr_free);
    for (brk_peer_t *p = brk_registry_first (ctx->registry); p;
         p = brk_registry_next (ctx->registry))
        if (p->role == SBX_ROLE_VMD)
            zlistx_add_end (vmds, strdup (p->instance));
    for (const char *vmd = zlistx_first (vmds); vmd; vmd = zlistx_next (vmds)) {
        if (zhashx_lookup (self->asking, vmd))
            continue;
        zlistx_purge (self->orphans);
        brk_store_sandbox_moving (ctx->store, vmd, s_orphan, self);
        if (zlistx_size (self->orphans) == 0)
            continue;
        s_ask_t *ask = calloc (1, sizeof *ask);
        sbx_msg_t *list = sbx_msg_new (SBX_MSG_VM_LIST);
        if (!ask || !(ask->vmd = strdup (vmd))) {
            free (ask);
            sbx_msg_destroy (&list);
            continue;
        }
        ask->self = self;
        sbx_info ("vmd %s: %zu sandbox(es) left on their way (by a broker before this one, or a "
                  "vmd that went away with the request): asking what it has",
                  vmd, zlistx_size (self->orphans));
        zhashx_insert (self->asking, vmd, (void *) 1);
        if (ctx->call (ctx, SBX_ROLE_VMD, vmd, &list, 5000, s_on_list, ask)) {
            zhashx_delete (self->asking, vmd);
            free (ask->vmd);
            free (ask);
        }
    }
    zlistx_purge (self->orphans);
    zlistx_destroy (&vmds);
}
