/*  vmd_lifecycle - see vmd_lifecycle.h */
#include "vmd_lifecycle.h"

vmd_lifecycle_t vmd_lifecycle_start (sbx_sandbox_state_t state)
{
    return (vmd_lifecycle_t){state, SBX_VMD_CAPTURE_IDLE, SBX_VMD_RESTORE_IDLE};
}

//  The three row types differ only in their states' type: one filler for each.
#define S_FILL(step_, machine_, row_)                                                              \
    do {                                                                                           \
        (step_)->machine = (machine_);                                                             \
        (step_)->actions = (row_)->actions;                                                        \
        (step_)->action_count = (row_)->action_count;                                              \
        (step_)->then = (row_)->then;                                                              \
    } while (0)

int vmd_lifecycle_next (const vmd_lifecycle_t *now, sbx_vmd_event_t event,
                        vmd_lifecycle_step_t *step)
{
    //  The generated lookups scan their tables: values outside them match nothing.
    vmd_lifecycle_step_t taken = {.next = *now};
    const sbx_vmd_capture_transition_t *capture = sbx_vmd_capture_transition (now->capture, event);
    const sbx_vmd_restore_transition_t *restore =
        capture ? NULL : sbx_vmd_restore_transition (now->restore, event);
    const sbx_vmd_transition_t *guest =
        capture || restore ? NULL : sbx_vmd_transition (now->guest, event);
    if (capture) {
        S_FILL (&taken, VMD_LIFECYCLE_CAPTURE, capture);
        taken.next.capture = capture->to;
    } else if (restore) {
        S_FILL (&taken, VMD_LIFECYCLE_RESTORE, restore);
        taken.next.restore = restore->to;
    } else if (guest) {
        S_FILL (&taken, VMD_LIFECYCLE_GUEST, guest);
        taken.next.guest = guest->to;
    } else
        return -1;
    *step = taken;
    return 0;
}

bool vmd_lifecycle_does (const vmd_lifecycle_step_t *step, sbx_vmd_action_t action)
{
    for (size_t i = 0; i < step->action_count; i++)
        if (step->actions[i] == action)
            return true;
    return false;
}

const char *vmd_lifecycle_machine_name (vmd_lifecycle_machine_t machine)
{
    return machine == VMD_LIFECYCLE_GUEST     ? "guest"
           : machine == VMD_LIFECYCLE_CAPTURE ? "capture"
           : machine == VMD_LIFECYCLE_RESTORE ? "restore"
                                              : "?";
}

const char *vmd_lifecycle_state_name (const vmd_lifecycle_t *self, vmd_lifecycle_machine_t machine)
{
    const char *name =
        machine == VMD_LIFECYCLE_GUEST     ? sbx_sandbox_state_name (self->guest)
        : machine == VMD_LIFECYCLE_CAPTURE ? sbx_vmd_capture_state_name (self->capture)
        : machine == VMD_LIFECYCLE_RESTORE ? sbx_vmd_restore_state_name (self->restore)
                                           : NULL;
    return name ? name : "?";
}
