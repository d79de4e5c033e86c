/*  vmd_sampler - samples every ready guest of this vmd each vmd.metrics_interval_ms
    (5 s; 0 turns it off) from the loop, and answers vm.metrics.

    Each tick reads each ready guest's QEMU /proc/<pid>/stat (CPU: utime + stime since
    the tick before, as thousandths of the sandbox's vCPUs) and asks its agent for
    agent.stats (memory, root filesystem, network), answered later: the sample goes into
    the guest's ring (vmd_samples) when the agent answers, with CPU only when it does
    not (an agent older than agent.stats, a guest too busy to answer in an interval).
    Nothing waits: a guest whose last ask is still out is not asked again. The first
    sample comes one interval after a guest is ready (CPU needs two readings); stopped
    guests are not sampled and keep their samples.

    The rings are written to each guest's directory (metrics.bin) when vmd stops and
    read back when a restarted vmd first needs them, so a vmd restart keeps the history
    (with a gap for the time it was down); a vmd that crashed restarts with what the
    last clean stop wrote.

        vmd_sampler_t *sampler = vmd_sampler_new (loop, guests, vms_dir, 5000);
        reply = vmd_sampler_answer (sampler, request);   //  vm.metrics
        vmd_sampler_forget (sampler, id);                //  after the guest is dropped
*/
#ifndef VMD_SAMPLER_H_INCLUDED
#define VMD_SAMPLER_H_INCLUDED

#include <czmq.h>

#include "sbx_msg.h"

typedef struct _vmd_sampler_t vmd_sampler_t;

//  guests (id -> vmd_guest_t) and vms_dir are the server's and outlive the sampler; the
//  guests must be dropped before it (their pending agent requests point into it).
vmd_sampler_t *vmd_sampler_new (zloop_t *loop, zhashx_t *guests, const char *vms_dir,
                                uint32_t interval_ms);
//  Saves every ring to its guest's directory, then forgets them.
void vmd_sampler_destroy (vmd_sampler_t **self_p);

//  A guest was dropped (deleted): its samples go with it.
void vmd_sampler_forget (vmd_sampler_t *self, const char *id);

//  vm.metrics: the answer (vm.metrics.ok, or not_found for a guest not here).
sbx_msg_t *vmd_sampler_answer (vmd_sampler_t *self, sbx_msg_t *request);

#endif
