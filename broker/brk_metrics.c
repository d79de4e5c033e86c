/*  brk_metrics - see brk_metrics.h */
#include "brk_metrics.h"
#include "brk_sandbox.h"

#include <assert.h>

#define S_VM_METRICS_MS 10000u //  vmd answers from memory; room for a busy host

//  A sandbox.metrics waiting on vmd.
typedef struct {
    zframe_t *client;
    uint64_t rid;
} s_op_t;

static void s_on_vm_metrics (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_op_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *reply;
    if (answer->type == SBX_MSG_ERROR)
        reply = sbx_msg_new_error (op->rid, sbx_msg_error (answer)->code, "%s",
                                   sbx_msg_error (answer)->message);
    else {
        //  The same fields: the samples move over, not copied.
        sbx_vm_metrics_ok_t *from = sbx_msg_vm_metrics_ok (answer);
        reply = sbx_msg_new (SBX_MSG_SANDBOX_METRICS_OK);
        reply->rid = op->rid;
        sbx_sandbox_metrics_ok_t *ok = sbx_msg_sandbox_metrics_ok (reply);
        sbx_str_set (&ok->sandbox_id, from->sandbox_id);
        ok->state = from->state;
        ok->vcpus = from->vcpus;
        ok->interval_ms = from->interval_ms;
        ok->samples = from->samples;
        from->samples = (sbx_metrics_sample_list_t){0};
    }
    ctx->send (ctx, op->client, &reply);
    zframe_destroy (&op->client);
    free (op);
}

sbx_msg_t *brk_metrics_get (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_metrics_t *args = sbx_msg_sandbox_metrics (request);
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (brk_sandbox_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply; //  not_found for what the caller may not see
    if (args->limit > 720)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                   "limit must be between 1 and 720 (0: all)");
    s_op_t *op = reply ? NULL : calloc (1, sizeof *op);
    sbx_msg_t *vm = reply ? NULL : sbx_msg_new (SBX_MSG_VM_METRICS);
    if (!reply && (!op || !vm)) {
        free (op);
        sbx_msg_destroy (&vm);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    if (reply) {
        brk_sandbox_clear (&record);
        return reply;
    }
    op->client = zframe_dup (client);
    op->rid = request->rid;
    sbx_vm_metrics_t *body = sbx_msg_vm_metrics (vm);
    sbx_str_set (&body->sandbox_id, record.id);
    body->since_ms = args->since_ms;
    body->limit = args->limit;
    if (ctx->call (ctx, SBX_ROLE_VMD, record.vmd, &vm, S_VM_METRICS_MS, s_on_vm_metrics, op) != 0) {
        zframe_destroy (&op->client);
        free (op);
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s is on vmd %s, which is not connected; retry when "
                                   "it is back",
                                   record.id, record.vmd ? record.vmd : "(none)");
    }
    brk_sandbox_clear (&record);
    return reply;
}
