/*  sbx_stall - see sbx_stall.h */
#include "sbx_stall.h"

#include <assert.h>

sbx_stall_t sbx_stall_init (uint64_t tick_ms, uint64_t threshold_ms)
{
    //  A busy loop that is merely late by a few ticks is no stall.
    return (sbx_stall_t){.last_ms = 0,
                         .threshold_ms = threshold_ms > 10 * tick_ms ? threshold_ms : 10 * tick_ms};
}

uint64_t sbx_stall_check (sbx_stall_t *self, uint64_t now_ms)
{
    uint64_t gap = self->last_ms && now_ms > self->last_ms ? now_ms - self->last_ms : 0;
    self->last_ms = now_ms;
    return gap > self->threshold_ms ? gap : 0;
}

void sbx_stall_test (bool verbose)
{
    (void) verbose;
    sbx_stall_t stall = sbx_stall_init (100, 1000);
    assert (stall.threshold_ms == 1000);
    assert (sbx_stall_check (&stall, 5000) == 0); //  the first check has nothing to compare
    assert (sbx_stall_check (&stall, 5100) == 0);
    assert (sbx_stall_check (&stall, 6000) == 0); //  late, under the threshold
    assert (sbx_stall_check (&stall, 13000) == 7000);
    assert (sbx_stall_check (&stall, 13100) == 0); //  once
    assert (sbx_stall_check (&stall, 13000) == 0); //  a clock that goes back is no stall
    assert (sbx_stall_init (500, 1000).threshold_ms == 5000);
}
