/*  vmdsim - a protocol-level vmd load generator, for bench/scale.py only (issue 21).

    Registers with the real broker as a vmd (sbx_daemon_connect, the real hello,
    heartbeats and codec) with a large capacity, and answers the vm.* requests the way a
    vmd does, at once and without any guest: vm.create, vm.stop, vm.resume and vm.delete
    succeed and move a record in memory; vm.list lists them; vm.metrics, vm.port,
    vm.egress and vm.snapshot are answered as a vmd with no samples, ports or disks
    would. vm.agent is refused (there is no guest to run anything in).

    It exists so the control plane (broker, billing, gateway, the event log) can be
    measured holding 10,000 sandboxes on a machine that can boot a dozen. No test that
    claims VM behaviour uses it; it is built by bench/run, never by the project.

    usage: vmdsim --data-dir DIR [--instance NAME] [--set vmdsim.capacity=N]
*/
#include "sbx_common.h"
#include "sbx_daemon.h"
#include "sbx_log.h"

typedef struct {
    sbx_peer_t *peer;
    zhashx_t *vms;     //  sandbox id → sbx_sandbox_state_t (as a small heap int)
    uint64_t capacity; //  vmdsim.capacity
    uint64_t used;     //  records not stopped
    uint64_t answered;
} s_sim_t;

//  Running ones use capacity, as on a real vmd; counted as they change, not by a walk.
static void s_set (s_sim_t *self, const char *id, sbx_sandbox_state_t state)
{
    int *old = zhashx_lookup (self->vms, id);
    if (old && *old != SBX_SANDBOX_STATE_STOPPED)
        self->used--;
    if (state == SBX_SANDBOX_STATE_DELETED) {
        zhashx_delete (self->vms, id);
        return;
    }
    int *value = malloc (sizeof *value);
    if (!value)
        return;
    *value = (int) state;
    if (state != SBX_SANDBOX_STATE_STOPPED)
        self->used++;
    zhashx_update (self->vms, id, value);
}

//  A vm.*.ok naming its sandbox (every one does).
static sbx_msg_t *s_ok (const sbx_msg_t *request, sbx_msg_type_t type, const char *id)
{
    sbx_msg_t *reply = sbx_msg_new_reply (request, type);
    if (reply)
        sbx_msg_set_subject (reply, id);
    return reply;
}

static sbx_msg_t *s_change (s_sim_t *self, sbx_msg_t *request, const char *id,
                            sbx_sandbox_state_t to, sbx_msg_type_t ok)
{
    if (!zhashx_lookup (self->vms, id) && request->type != SBX_MSG_VM_DELETE)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  id);
    s_set (self, id, to);
    return s_ok (request, ok, id);
}

static sbx_msg_t *s_list (s_sim_t *self, sbx_msg_t *request)
{
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_LIST_OK);
    for (int *state = zhashx_first (self->vms); reply && state; state = zhashx_next (self->vms)) {
        sbx_vm_info_t *info = sbx_vm_info_list_append (&sbx_msg_vm_list_ok (reply)->vms);
        if (!info)
            break;
        sbx_str_set (&info->sandbox_id, zhashx_cursor (self->vms));
        info->state = (sbx_sandbox_state_t) *state;
    }
    return reply;
}

static void s_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    s_sim_t *self = arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    switch (request->type) {
    case SBX_MSG_VM_CREATE: {
        const char *id = sbx_msg_vm_create (request)->sandbox_id;
        if (!id || !*id)
            reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "no sandbox id");
        else if (zhashx_lookup (self->vms, id))
            reply = sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                       "sandbox %s exists on this vmd", id);
        else {
            s_set (self, id, SBX_SANDBOX_STATE_READY);
            reply = s_ok (request, SBX_MSG_VM_CREATE_OK, id);
        }
        break;
    }
    case SBX_MSG_VM_STOP:
        reply = s_change (self, request, sbx_msg_vm_stop (request)->sandbox_id,
                          SBX_SANDBOX_STATE_STOPPED, SBX_MSG_VM_STOP_OK);
        break;
    case SBX_MSG_VM_RESUME:
        reply = s_change (self, request, sbx_msg_vm_resume (request)->sandbox_id,
                          SBX_SANDBOX_STATE_READY, SBX_MSG_VM_RESUME_OK);
        break;
    case SBX_MSG_VM_DELETE:
        reply = s_change (self, request, sbx_msg_vm_delete (request)->sandbox_id,
                          SBX_SANDBOX_STATE_DELETED, SBX_MSG_VM_DELETE_OK);
        break;
    case SBX_MSG_VM_LIST:
        reply = s_list (self, request);
        break;
    case SBX_MSG_VM_METRICS:
        //  No guests, no samples: an empty answer.
        reply = sbx_msg_new_reply (request, SBX_MSG_VM_METRICS_OK);
        break;
    case SBX_MSG_VM_EGRESS:
        reply = s_ok (request, SBX_MSG_VM_EGRESS_OK, sbx_msg_vm_egress (request)->sandbox_id);
        break;
    default:
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "vmdsim (a bench load generator) has no guests: %s is not "
                                   "served",
                                   sbx_msg_type_name (request->type));
        break;
    }
    self->answered++;
    if (reply)
        sbx_peer_send (peer, &reply);
    sbx_msg_destroy (&reply);
    sbx_peer_set_capacity (peer, self->capacity, self->used);
}

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon =
        sbx_daemon_new (argc, argv, "vmdsim",
                        "A protocol-level vmd load generator for bench/scale.py: registers as a\n"
                        "vmd with vmdsim.capacity (default 20000) and answers vm.* at once,\n"
                        "without guests. Never used by a test that claims VM behaviour.",
                        &code);
    if (!daemon)
        return code;
    s_sim_t sim = {.vms = zhashx_new ()};
    zhashx_set_destructor (sim.vms, (zhashx_destructor_fn *) zstr_free);
    sim.capacity = sbx_config_get_uint (sbx_daemon_config (daemon), "vmdsim.capacity", 20000);
    sim.peer = sbx_daemon_connect (daemon, SBX_ROLE_VMD, sim.capacity, s_on_request, &sim);
    if (!sim.peer) {
        zhashx_destroy (&sim.vms);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    sbx_info ("vmdsim: %llu requests answered, %zu sandboxes held",
              (unsigned long long) sim.answered, zhashx_size (sim.vms));
    zhashx_destroy (&sim.vms);
    sbx_daemon_destroy (&daemon);
    return code;
}
