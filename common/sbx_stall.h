/*  sbx_stall - notices that this process's loop did not run for a while: the process was
    stopped (SIGSTOP, a debugger), its machine paused (a VM's live migration, a host's
    suspend) or starved. Its timers then all fire at once, before it reads what its peers
    sent meanwhile: judged by the clock alone, every peer would look silent for as long
    as the stall. The broker would drop its workers (a vmd's sandboxes lost with it) and
    fail requests whose answers may be waiting; a worker would take the broker for gone.
    A timer asks check first; a gap says how long the loop did not run, and the caller
    gives its peers (and deadlines) that time back.
*/
#ifndef SBX_STALL_H_INCLUDED
#define SBX_STALL_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint64_t last_ms;      //  monotonic: when check was last called (0: never)
    uint64_t threshold_ms; //  a longer gap between two checks is a stall
} sbx_stall_t;

//  A stall detector for a loop whose timers run every tick_ms at most: a gap of more
//  than threshold_ms (at least 10 ticks) between checks counts.
sbx_stall_t sbx_stall_init (uint64_t tick_ms, uint64_t threshold_ms);

//  Called by each timer with the monotonic time: how long the loop did not run, when
//  that is over the threshold, else 0.
uint64_t sbx_stall_check (sbx_stall_t *self, uint64_t now_ms);

void sbx_stall_test (bool verbose);

#endif
