/*  vmd_lifecycle - a guest's lifecycle as data: given where a guest is and what happened,
    where it goes and what vmd does then. It only reads the tables that schemas/gen.py
    makes from schemas/lifecycle.json (docs/lifecycle.md): no QEMU, no files, no loop.
    vmd_guest performs the actions; this decides.

    A guest is in three states at once: its own (the sandbox's), and those of two
    sub-machines that work inside some of its states: capture (a stop's memory save, a
    snapshot, the clean-up of one that a vmd restart cut) and restore (QEMU loading a
    memory state). An event goes to the capture first, then the restore, then the guest:
    the first whose state has a row for it takes it. No row anywhere: the event is
    refused (vmd answers a request with failed_precondition, ignores anything else).

        vmd_lifecycle_t now = vmd_lifecycle_start (SBX_SANDBOX_STATE_READY);
        vmd_lifecycle_step_t step;
        if (vmd_lifecycle_next (&now, SBX_VMD_EV_STOP, &step) == 0)
            now = step.next; // then perform step.actions in order, then fire step.then
*/
#ifndef VMD_LIFECYCLE_H_INCLUDED
#define VMD_LIFECYCLE_H_INCLUDED

#include "sbx_lifecycle_gen.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    VMD_LIFECYCLE_GUEST,
    VMD_LIFECYCLE_CAPTURE,
    VMD_LIFECYCLE_RESTORE,
} vmd_lifecycle_machine_t;

//  Where a guest is.
typedef struct {
    sbx_sandbox_state_t guest;
    sbx_vmd_capture_state_t capture;
    sbx_vmd_restore_state_t restore;
} vmd_lifecycle_t;

//  What an event does: the machine that took it, where the guest is after it, the
//  actions to perform in order (borrowed from the table), and the event fired after
//  them (SBX_VMD_EV__NONE: none).
typedef struct {
    vmd_lifecycle_machine_t machine;
    vmd_lifecycle_t next;
    const sbx_vmd_action_t *actions;
    size_t action_count;
    sbx_vmd_event_t then;
} vmd_lifecycle_step_t;

//  A guest in state, its sub-machines idle.
vmd_lifecycle_t vmd_lifecycle_start (sbx_sandbox_state_t state);

//  The step event takes from now: 0 and *step, or -1 when no machine takes it there
//  (*step untouched). Any values, in range or not, get one of these answers.
int vmd_lifecycle_next (const vmd_lifecycle_t *now, sbx_vmd_event_t event,
                        vmd_lifecycle_step_t *step);

//  Whether step performs action.
bool vmd_lifecycle_does (const vmd_lifecycle_step_t *step, sbx_vmd_action_t action);

//  "guest", "capture", "restore"; and machine's state in self ("?" when out of range).
const char *vmd_lifecycle_machine_name (vmd_lifecycle_machine_t machine);
const char *vmd_lifecycle_state_name (const vmd_lifecycle_t *self, vmd_lifecycle_machine_t machine);

//  Self-test (vmd_lifecycle_test.c): every row, every refusal, the sub-machines'
//  stories, and the broker's table against vmd's.
void vmd_lifecycle_test (bool verbose);

#endif
