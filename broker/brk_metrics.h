/*  brk_metrics - a sandbox's resource samples: sandbox.metrics (get_sandbox_metrics).

    The samples are vmd's: it samples each ready guest every vmd.metrics_interval_ms and
    keeps an hour of them (vmd/vmd_samples). sandbox.metrics checks the caller like
    sandbox.get (another account's sandbox or a deleted one is not_found; a read-only
    key may read) and asks the sandbox's vmd for vm.metrics in any live state: a stopped
    sandbox answers the samples of when it last ran. Nothing is kept in the broker.
*/
#ifndef BRK_METRICS_H_INCLUDED
#define BRK_METRICS_H_INCLUDED

#include "brk_ctx.h"

//  sandbox.metrics: the reply (an error) at once, or NULL when it waits on vmd.
sbx_msg_t *brk_metrics_get (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

void brk_metrics_test (bool verbose);

#endif
