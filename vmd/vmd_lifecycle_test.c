/*  vmd_lifecycle_test - vmd_lifecycle's self-test, without QEMU: every row of the three
    tables is taken where it should be, every (state, event) without a row is refused,
    values outside the tables are refused too, every state can be reached, the stories
    of a guest (boot, restore, stop, snapshot, recovery, failures, delete) go as
    docs/vmd.md tells them, and what the broker asks of vmd is what vmd takes. */
#include "vmd_lifecycle.h"

#include <assert.h>
#include <czmq.h>
#include <string.h>

#define S_CAPTURE_STATES SBX_VMD_CAPTURE__COUNT
#define S_RESTORE_STATES SBX_VMD_RESTORE__COUNT
#define S_GUEST_FIRST    SBX_SANDBOX_STATE_CREATING
#define S_GUEST_LAST     SBX_SANDBOX_STATE_ERROR

static bool s_verbose;

//  The rows of each machine, with the step each should give.
static void s_test_rows (void)
{
    vmd_lifecycle_step_t step;
    for (size_t i = 0; i < SBX_VMD_TRANSITIONS; i++) {
        const sbx_vmd_transition_t *row = &sbx_vmd_transitions[i];
        //  With both sub-machines idle, the guest's own row decides: no idle sub-machine
        //  may take (and so hide) one of the guest's events.
        vmd_lifecycle_t now = vmd_lifecycle_start (row->from);
        assert (vmd_lifecycle_next (&now, row->event, &step) == 0);
        assert (step.machine == VMD_LIFECYCLE_GUEST);
        assert (step.next.guest == row->to);
        assert (step.next.capture == SBX_VMD_CAPTURE_IDLE);
        assert (step.next.restore == SBX_VMD_RESTORE_IDLE);
        assert (step.actions == row->actions && step.action_count == row->action_count);
        assert (step.then == row->then);
        assert (sbx_vmd_transition (row->from, row->event) == row);
    }
    for (size_t i = 0; i < SBX_VMD_CAPTURE_TRANSITIONS; i++) {
        const sbx_vmd_capture_transition_t *row = &sbx_vmd_capture_transitions[i];
        //  The capture goes first, whatever the guest's state and the restore's.
        for (int g = S_GUEST_FIRST; g <= S_GUEST_LAST; g++) {
            vmd_lifecycle_t now = {(sbx_sandbox_state_t) g, row->from, SBX_VMD_RESTORE_LOADING};
            assert (vmd_lifecycle_next (&now, row->event, &step) == 0);
            assert (step.machine == VMD_LIFECYCLE_CAPTURE);
            assert (step.next.capture == row->to);
            assert (step.next.guest == now.guest && step.next.restore == now.restore);
            assert (step.actions == row->actions && step.then == row->then);
        }
    }
    for (size_t i = 0; i < SBX_VMD_RESTORE_TRANSITIONS; i++) {
        const sbx_vmd_restore_transition_t *row = &sbx_vmd_restore_transitions[i];
        //  The restore goes before the guest, after an idle capture (which must not take
        //  any of its events).
        vmd_lifecycle_t now = {SBX_SANDBOX_STATE_RESUMING, SBX_VMD_CAPTURE_IDLE, row->from};
        assert (vmd_lifecycle_next (&now, row->event, &step) == 0);
        assert (step.machine == VMD_LIFECYCLE_RESTORE);
        assert (step.next.restore == row->to && step.next.guest == now.guest);
        assert (step.actions == row->actions && step.then == row->then);
    }
    //  No row names an action or event outside the tables, nor more actions than fit.
    for (size_t i = 0; i < SBX_VMD_TRANSITIONS; i++) {
        assert (sbx_vmd_transitions[i].action_count <= SBX_VMD_MAX_ACTIONS);
        for (size_t a = 0; a < sbx_vmd_transitions[i].action_count; a++)
            assert (sbx_vmd_action_name (sbx_vmd_transitions[i].actions[a]));
    }
}

//  Every combination of states and every event: taken exactly when one of the machines
//  has a row for it, by the first of them in order, and refused otherwise.
static void s_test_refusals (void)
{
    vmd_lifecycle_step_t step, untouched;
    memset (&untouched, 0x5a, sizeof untouched);
    size_t taken = 0, refused = 0;
    for (int g = S_GUEST_FIRST; g <= S_GUEST_LAST; g++)
        for (int c = 0; c < S_CAPTURE_STATES; c++)
            for (int r = 0; r < S_RESTORE_STATES; r++)
                for (int e = 0; e < SBX_VMD_EV__COUNT; e++) {
                    vmd_lifecycle_t now = {(sbx_sandbox_state_t) g, (sbx_vmd_capture_state_t) c,
                                           (sbx_vmd_restore_state_t) r};
                    sbx_vmd_event_t event = (sbx_vmd_event_t) e;
                    bool capture = sbx_vmd_capture_transition (now.capture, event);
                    bool restore = sbx_vmd_restore_transition (now.restore, event);
                    bool guest = sbx_vmd_transition (now.guest, event);
                    step = untouched;
                    int rc = vmd_lifecycle_next (&now, event, &step);
                    if (!capture && !restore && !guest) {
                        assert (rc == -1);
                        assert (memcmp (&step, &untouched, sizeof step) == 0);
                        refused++;
                        continue;
                    }
                    assert (rc == 0);
                    assert (step.machine == (capture   ? VMD_LIFECYCLE_CAPTURE
                                             : restore ? VMD_LIFECYCLE_RESTORE
                                                       : VMD_LIFECYCLE_GUEST));
                    taken++;
                }
    if (s_verbose)
        zsys_info ("vmd_lifecycle: %zu combinations taken, %zu refused", taken, refused);

    //  The requests a guest refuses, as the broker sees it (failed_precondition).
    struct {
        sbx_sandbox_state_t state;
        sbx_vmd_event_t event;
    } refusals[] = {
        {SBX_SANDBOX_STATE_CREATING, SBX_VMD_EV_STOP},
        {SBX_SANDBOX_STATE_CREATING, SBX_VMD_EV_SNAPSHOT},
        {SBX_SANDBOX_STATE_READY, SBX_VMD_EV_CREATE},
        {SBX_SANDBOX_STATE_STOPPING, SBX_VMD_EV_SNAPSHOT},
        {SBX_SANDBOX_STATE_RESUMING, SBX_VMD_EV_SNAPSHOT},
        {SBX_SANDBOX_STATE_DELETING, SBX_VMD_EV_DELETE},
        {SBX_SANDBOX_STATE_DELETED, SBX_VMD_EV_DELETE},
        {SBX_SANDBOX_STATE_ERROR, SBX_VMD_EV_STOP},
        {SBX_SANDBOX_STATE_ERROR, SBX_VMD_EV_RESUME},
        {SBX_SANDBOX_STATE_ERROR, SBX_VMD_EV_SNAPSHOT},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        vmd_lifecycle_t now = vmd_lifecycle_start (refusals[i].state);
        assert (vmd_lifecycle_next (&now, refusals[i].event, &step) == -1);
        assert (sbx_vmd_event_kind (refusals[i].event) == SBX_LIFECYCLE_REQUEST);
    }
    //  Asked to go where it is (a resume of a running guest, a stop of a stopped one: a
    //  request sent again after a broker's restart): done at once, nothing else moves.
    sbx_sandbox_state_t there[] = {SBX_SANDBOX_STATE_READY, SBX_SANDBOX_STATE_STOPPED};
    sbx_vmd_event_t asked[] = {SBX_VMD_EV_RESUME, SBX_VMD_EV_STOP};
    for (size_t i = 0; i < 2; i++) {
        vmd_lifecycle_t now = vmd_lifecycle_start (there[i]);
        assert (vmd_lifecycle_next (&now, asked[i], &step) == 0);
        assert (step.machine == VMD_LIFECYCLE_GUEST && step.next.guest == there[i]);
        assert (vmd_lifecycle_does (&step, SBX_VMD_DO_ANSWER_DONE));
        assert (!vmd_lifecycle_does (&step, SBX_VMD_DO_ACCEPT));
    }
    //  Asked again on its way: the later request takes over (the earlier one's broker is
    //  gone when its settling sends it again), nothing else moves.
    sbx_sandbox_state_t going[] = {SBX_SANDBOX_STATE_RESUMING, SBX_SANDBOX_STATE_STOPPING};
    for (size_t i = 0; i < 2; i++) {
        vmd_lifecycle_t now = vmd_lifecycle_start (going[i]);
        assert (vmd_lifecycle_next (&now, asked[i], &step) == 0);
        assert (step.machine == VMD_LIFECYCLE_GUEST && step.next.guest == going[i]);
        assert (step.action_count == 1 && vmd_lifecycle_does (&step, SBX_VMD_DO_ACCEPT));
    }
    //  A deleted guest takes nothing, but the events that start an idle sub-machine
    //  (which vmd_guest fires only in the states those work in).
    for (int e = 0; e < SBX_VMD_EV__COUNT; e++) {
        vmd_lifecycle_t now = vmd_lifecycle_start (SBX_SANDBOX_STATE_DELETED);
        if (vmd_lifecycle_next (&now, (sbx_vmd_event_t) e, &step) == 0)
            assert (step.machine != VMD_LIFECYCLE_GUEST);
    }

    //  Values outside the tables: refused, never read past an array.
    int bad_events[] = {SBX_VMD_EV__NONE, SBX_VMD_EV__COUNT, 1000, -7};
    for (size_t i = 0; i < sizeof bad_events / sizeof bad_events[0]; i++) {
        vmd_lifecycle_t now = vmd_lifecycle_start (SBX_SANDBOX_STATE_READY);
        assert (vmd_lifecycle_next (&now, (sbx_vmd_event_t) bad_events[i], &step) == -1);
        assert (sbx_vmd_event_name ((sbx_vmd_event_t) bad_events[i]) == NULL);
        assert (sbx_vmd_event_kind ((sbx_vmd_event_t) bad_events[i]) == SBX_LIFECYCLE_NOTICE);
    }
    vmd_lifecycle_t odd[] = {
        {SBX_SANDBOX_STATE__UNSET, (sbx_vmd_capture_state_t) 99, (sbx_vmd_restore_state_t) -1},
        {(sbx_sandbox_state_t) 99, (sbx_vmd_capture_state_t) -1, (sbx_vmd_restore_state_t) 99},
        {(sbx_sandbox_state_t) -1, SBX_VMD_CAPTURE__COUNT, SBX_VMD_RESTORE__COUNT},
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        for (int e = 0; e < SBX_VMD_EV__COUNT; e++)
            assert (vmd_lifecycle_next (&odd[i], (sbx_vmd_event_t) e, &step) == -1);
    assert (sbx_vmd_action_name (SBX_VMD_DO__COUNT) == NULL);
    assert (sbx_vmd_capture_state_name ((sbx_vmd_capture_state_t) 99) == NULL);
    assert (sbx_vmd_restore_state_name ((sbx_vmd_restore_state_t) -1) == NULL);
    assert (streq (vmd_lifecycle_state_name (&odd[2], VMD_LIFECYCLE_CAPTURE), "?"));
}

//  Every state of every machine is reachable from a new guest or a re-adopted one, by
//  the tables alone (then events included; end follows end_work, as vmd_guest does).
static void s_test_reachable (void)
{
    enum { S_MAX = 9 * S_CAPTURE_STATES * S_RESTORE_STATES };
    bool seen[S_MAX] = {false};
    vmd_lifecycle_t queue[S_MAX];
    size_t head = 0, tail = 0;
#define S_INDEX(l)                                                                                 \
    (((size_t) (l).guest * S_CAPTURE_STATES + (l).capture) * S_RESTORE_STATES + (l).restore)
    for (int g = S_GUEST_FIRST; g <= S_GUEST_LAST; g++) {
        vmd_lifecycle_t start = vmd_lifecycle_start ((sbx_sandbox_state_t) g);
        seen[S_INDEX (start)] = true;
        queue[tail++] = start;
    }
    bool guest[9] = {false}, capture[S_CAPTURE_STATES] = {false},
         restore[S_RESTORE_STATES] = {false};
    while (head < tail) {
        vmd_lifecycle_t now = queue[head++];
        guest[now.guest] = capture[now.capture] = restore[now.restore] = true;
        for (int e = 0; e < SBX_VMD_EV__COUNT; e++) {
            vmd_lifecycle_step_t step;
            if (vmd_lifecycle_next (&now, (sbx_vmd_event_t) e, &step))
                continue;
            vmd_lifecycle_t next = step.next;
            if (!seen[S_INDEX (next)]) {
                seen[S_INDEX (next)] = true;
                assert (tail < S_MAX);
                queue[tail++] = next;
            }
        }
    }
#undef S_INDEX
    for (int g = S_GUEST_FIRST; g <= S_GUEST_LAST; g++)
        assert (guest[g]);
    for (int c = 0; c < S_CAPTURE_STATES; c++)
        assert (capture[c]);
    for (int r = 0; r < S_RESTORE_STATES; r++)
        assert (restore[r]);
}

//  A story: events in order, each with the then events (and ends) it brings, as
//  vmd_guest fires them. It collects the actions performed.
typedef struct {
    vmd_lifecycle_t now;
    sbx_vmd_action_t done[64];
    size_t count;
} s_story_t;

static s_story_t s_story (sbx_sandbox_state_t state)
{
    s_story_t story = {.now = vmd_lifecycle_start (state)};
    return story;
}

static int s_fire (s_story_t *story, sbx_vmd_event_t event)
{
    vmd_lifecycle_step_t step;
    if (vmd_lifecycle_next (&story->now, event, &step))
        return -1;
    if (s_verbose)
        zsys_info ("  %s %s -> %s on %s", vmd_lifecycle_machine_name (step.machine),
                   vmd_lifecycle_state_name (&story->now, step.machine),
                   vmd_lifecycle_state_name (&step.next, step.machine), sbx_vmd_event_name (event));
    story->now = step.next;
    for (size_t i = 0; i < step.action_count; i++) {
        assert (story->count < 64);
        story->done[story->count++] = step.actions[i];
        if (step.actions[i] == SBX_VMD_DO_END_WORK)
            s_fire (story, SBX_VMD_EV_END); //  refused when nothing works: fine
    }
    if (step.then != SBX_VMD_EV__NONE)
        assert (s_fire (story, step.then) == 0);
    return 0;
}

//  Fires event (which must be taken); true when it performed all the actions listed.
static bool s_step (s_story_t *story, sbx_vmd_event_t event, ...)
{
    story->count = 0;
    if (s_fire (story, event))
        return false;
    va_list args;
    va_start (args, event);
    bool all = true;
    for (int action = va_arg (args, int); action != -1; action = va_arg (args, int)) {
        bool found = false;
        for (size_t i = 0; i < story->count; i++)
            found |= story->done[i] == (sbx_vmd_action_t) action;
        all &= found;
    }
    va_end (args);
    return all;
}

//  A stop of a ready guest, its memory migrated: the child keeps the state now.
static s_story_t s_story_keeping (void)
{
    s_story_t story = s_story (SBX_SANDBOX_STATE_READY);
    sbx_vmd_event_t events[] = {SBX_VMD_EV_STOP, SBX_VMD_EV_MIGRATE_STARTED, SBX_VMD_EV_POLL,
                                SBX_VMD_EV_MIGRATED};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        assert (s_fire (&story, events[i]) == 0);
    assert (story.now.capture == SBX_VMD_CAPTURE_SAVE_KEEPING);
    story.count = 0;
    return story;
}

#define S_AT(story, g, c, r)                                                                       \
    assert ((story).now.guest == SBX_SANDBOX_STATE_##g &&                                          \
            (story).now.capture == SBX_VMD_CAPTURE_##c &&                                          \
            (story).now.restore == SBX_VMD_RESTORE_##r)
#define DO(a) SBX_VMD_DO_##a
#define EV(e) SBX_VMD_EV_##e

static void s_test_stories (void)
{
    //  Boot: the agent's hello gets agent.setup, its answer makes the guest ready.
    s_story_t s = s_story (SBX_SANDBOX_STATE_CREATING);
    assert (s_step (&s, EV (CREATE), DO (ACCEPT), -1));
    assert (s_step (&s, EV (HELLO), DO (SEND_SETUP), -1));
    assert (s_step (&s, EV (STOP), -1) == false); //  refused while creating
    assert (s_step (&s, EV (AGENT_READY), DO (REPLY), -1));
    S_AT (s, READY, IDLE, IDLE);
    assert (s_step (&s, EV (TICK), -1) == false); //  a running guest has no ticking work

    //  A create from a template's memory: loaded, continued, set up.
    s = s_story (SBX_SANDBOX_STATE_CREATING);
    assert (s_step (&s, EV (CREATE_FROM_MEMORY), DO (ACCEPT), DO (ARM_RESTORE), -1));
    S_AT (s, CREATING, IDLE, LOADING);
    assert (s_step (&s, EV (POLL), DO (QUERY_STATUS), -1));
    assert (s_step (&s, EV (POLL), -1) == false); //  one query at a time
    assert (s_step (&s, EV (INMIGRATE), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_STATUS), -1));
    assert (s_step (&s, EV (LOADED), DO (RENEW_FORWARDS), DO (CONT), -1));
    assert (s_step (&s, EV (HELLO), DO (SEND_SETUP), -1)); //  the guest's, from creating
    assert (s_step (&s, EV (CONTINUED), DO (SEND_SETUP), -1));
    S_AT (s, CREATING, IDLE, SETTING_UP);
    assert (s_step (&s, EV (AGENT_READY), DO (END_WORK), DO (REPLY), -1));
    S_AT (s, READY, IDLE, IDLE);

    //  The restore passes its deadline: a create is cleaned up, a resume is in error.
    s = s_story (SBX_SANDBOX_STATE_CREATING);
    assert (s_step (&s, EV (CREATE_FROM_MEMORY), -1));
    assert (s_step (&s, EV (FAIL), DO (KILL_QEMU), DO (CLOSE_AGENT), -1));
    S_AT (s, DELETING, IDLE, IDLE);
    assert (s_step (&s, EV (TICK), DO (REMOVE_WHEN_GONE), -1));
    assert (s_step (&s, EV (GONE), DO (SWEEP), DO (REPLY), -1));
    S_AT (s, DELETED, IDLE, IDLE);
    s = s_story (SBX_SANDBOX_STATE_STOPPED);
    assert (s_step (&s, EV (RESUME), DO (ACCEPT), DO (SPAWN_FROM_MEMORY), DO (ARM_RESTORE), -1));
    S_AT (s, RESUMING, IDLE, LOADING);
    assert (s_step (&s, EV (POLL), -1));
    assert (s_step (&s, EV (CONT_FAILED), -1) == false); //  no cont asked yet
    assert (s_step (&s, EV (FAIL), DO (KILL_QEMU), DO (REPLY_FAILURE), -1));
    S_AT (s, ERROR, IDLE, IDLE);

    //  Resume: loaded running (no cont needed), set up on hello, memory.state dropped.
    s = s_story (SBX_SANDBOX_STATE_STOPPED);
    assert (s_step (&s, EV (RESUME), -1));
    assert (s_step (&s, EV (POLL), -1));
    assert (s_step (&s, EV (RUNNING), DO (RENEW_FORWARDS), -1));
    assert (s_step (&s, EV (HELLO), DO (SEND_SETUP), -1));
    assert (s_step (&s, EV (AGENT_READY), DO (DROP_MEMORY_STATE), DO (REPLY), -1));
    S_AT (s, READY, IDLE, IDLE);

    //  Stop: the capture saves the memory, QEMU quits, its exit is the guest's saved.
    assert (s_step (&s, EV (STOP), DO (ACCEPT), DO (CLOSE_AGENT), DO (SAVE_MEMORY), -1));
    S_AT (s, STOPPING, SAVE_PAUSING, IDLE);
    assert (s_step (&s, EV (SNAPSHOT), -1) == false);
    assert (s_step (&s, EV (POLL), -1) == false); //  not before migrate's answer
    assert (s_step (&s, EV (MIGRATE_STARTED), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_MIGRATE), -1));
    assert (s_step (&s, EV (MIGRATE_ACTIVE), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_MIGRATE), -1));
    //  The memory state made durable by a child, QEMU waiting paused meanwhile.
    assert (s_step (&s, EV (MIGRATED), DO (CLOSE_STATE_FILE), DO (KEEP_MEMORY_STATE), -1));
    S_AT (s, STOPPING, SAVE_KEEPING, IDLE);
    assert (s_step (&s, EV (TICK), DO (REAP_STATE_KEEPER), -1));
    assert (s_step (&s, EV (STATE_KEPT), DO (QUIT_QEMU), -1));
    S_AT (s, STOPPING, SAVE_QUITTING, IDLE);
    assert (s_step (&s, EV (QMP_CLOSED), -1)); //  asked for: nothing noted
    assert (s.count == 0);
    assert (s_step (&s, EV (KILL_DUE), DO (KILL_QEMU), -1));
    assert (s_step (&s, EV (QEMU_GONE), DO (REPLY), -1));
    S_AT (s, STOPPED, IDLE, IDLE);

    //  A stop whose capture fails: the stop fails, the guest is in error.
    s = s_story (SBX_SANDBOX_STATE_READY);
    assert (s_step (&s, EV (STOP), -1));
    assert (s_step (&s, EV (MIGRATE_STARTED), -1));
    assert (s_step (&s, EV (POLL), -1));
    assert (s_step (&s, EV (CAPTURE_FAILED), DO (CLOSE_STATE_FILE), DO (KILL_QEMU),
                    DO (REPLY_FAILURE), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    //  A stop whose memory state could not be kept (the child failed): error, the child
    //  and its file gone; the same when QEMU dies meanwhile.
    s = s_story_keeping ();
    assert (s_step (&s, EV (CAPTURE_FAILED), DO (STOP_STATE_KEEPER), DO (KILL_QEMU),
                    DO (REPLY_FAILURE), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    s = s_story_keeping ();
    assert (s_step (&s, EV (QEMU_GONE), DO (STOP_STATE_KEEPER), DO (REPLY_FAILURE), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    //  A stop whose QEMU dies while saving.
    s = s_story (SBX_SANDBOX_STATE_READY);
    assert (s_step (&s, EV (STOP), -1));
    assert (s_step (&s, EV (QEMU_GONE), DO (CLOSE_STATE_FILE), DO (REPLY_FAILURE), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    assert (s_step (&s, EV (DELETE), DO (ACCEPT), DO (QUIT_QEMU), -1));
    S_AT (s, DELETING, IDLE, IDLE);

    //  A snapshot of a running guest, with a stop and another snapshot waiting for it.
    s = s_story (SBX_SANDBOX_STATE_READY);
    assert (s_step (&s, EV (SNAPSHOT), DO (TAKE_SNAPSHOT), DO (SNAP_MEMORY), -1));
    S_AT (s, READY, SNAP_PAUSING, IDLE);
    assert (s_step (&s, EV (STOP), DO (DEFER_REQUEST), -1));
    assert (s_step (&s, EV (SNAPSHOT), DO (QUEUE_SNAPSHOT), -1));
    assert (s_step (&s, EV (MIGRATE_STARTED), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_MIGRATE), -1));
    assert (s_step (&s, EV (MIGRATED), DO (COPY_DISK), -1));
    assert (s_step (&s, EV (TICK), DO (REAP_HELPER), -1));
    assert (s_step (&s, EV (COPIED), DO (CONT), -1));
    S_AT (s, READY, SNAP_CONTINUING, IDLE);
    assert (
        s_step (&s, EV (CONTINUED), DO (SEND_SETUP), DO (ANSWER_SNAPSHOT), DO (START_WAITING), -1));
    S_AT (s, READY, IDLE, IDLE);
    //  A snapshot that fails: no file stays, the paused guest runs again.
    assert (s_step (&s, EV (SNAPSHOT), -1));
    assert (s_step (&s, EV (CAPTURE_FAILED), DO (DISCARD_SNAPSHOT), DO (CONT), DO (ANSWER_SNAPSHOT),
                    DO (START_WAITING), -1));
    assert (s_step (&s, EV (CONTINUED), DO (SEND_SETUP), -1)); //  the guest's row now
    S_AT (s, READY, IDLE, IDLE);
    //  The guest dies during a snapshot: the snapshot ends, answered; the guest is in error.
    assert (s_step (&s, EV (SNAPSHOT), -1));
    assert (s_step (&s, EV (MIGRATE_STARTED), -1));
    assert (s_step (&s, EV (QEMU_GONE), DO (REPORT), DO (DISCARD_SNAPSHOT), DO (ANSWER_SNAPSHOT),
                    DO (START_WAITING), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    //  A delete during a snapshot ends it first.
    s = s_story (SBX_SANDBOX_STATE_READY);
    assert (s_step (&s, EV (SNAPSHOT), -1));
    assert (s_step (&s, EV (DELETE), DO (ACCEPT), DO (DISCARD_SNAPSHOT), DO (ANSWER_SNAPSHOT),
                    DO (QUIT_QEMU), -1));
    S_AT (s, DELETING, IDLE, IDLE);
    assert (s_step (&s, EV (COPIED), -1) == false); //  a late answer of the ended capture
    assert (s_step (&s, EV (KILL_DUE), DO (KILL_QEMU), -1));

    //  A stopped guest's snapshot: files copied, a resume waits for it.
    s = s_story (SBX_SANDBOX_STATE_STOPPED);
    assert (s_step (&s, EV (SNAPSHOT), DO (TAKE_SNAPSHOT), DO (COPY_STOPPED), -1));
    S_AT (s, STOPPED, STOPPED_COPYING, IDLE);
    assert (s_step (&s, EV (RESUME), DO (DEFER_REQUEST), -1));
    assert (s_step (&s, EV (TICK), DO (REAP_HELPER), -1));
    assert (s_step (&s, EV (COPIED), DO (ANSWER_SNAPSHOT), DO (START_WAITING), -1));
    S_AT (s, STOPPED, IDLE, IDLE);

    //  Re-adopted after a vmd restart that cut a snapshot: its migration is cancelled,
    //  the guest continued; a stop asked meanwhile waits for that.
    s = s_story (SBX_SANDBOX_STATE_READY);
    assert (s_step (&s, EV (RECOVER), -1));
    S_AT (s, READY, RECOVERING, IDLE);
    assert (s_step (&s, EV (STOP), DO (DEFER_REQUEST), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_MIGRATE), -1));
    assert (s_step (&s, EV (MIGRATE_ACTIVE), DO (CANCEL_MIGRATION), -1));
    assert (s_step (&s, EV (POLL), DO (QUERY_MIGRATE), -1));
    assert (s_step (&s, EV (MIGRATE_NONE), DO (CONT), DO (START_WAITING), -1));
    assert (s_step (&s, EV (CONTINUED), DO (SEND_SETUP), -1));
    S_AT (s, READY, IDLE, IDLE);

    //  QMP lost on its own: noted, then QEMU (still there) killed and the guest failed.
    assert (s_step (&s, EV (QMP_CLOSED), DO (NOTE_QMP_LOST), -1));
    assert (s_step (&s, EV (MONITOR_LOST), DO (DROP_AGENT), DO (KILL_QEMU), DO (REPORT), -1));
    S_AT (s, ERROR, IDLE, IDLE);
    assert (s_step (&s, EV (AGENT_LOST), -1)); //  only the reason changes
    assert (s.count == 0);
}

//  What the broker asks of vmd (its table's asks) is a request vmd takes in the same
//  state, going where the broker's record goes; and each transient state the broker waits
//  out (vm_ok) has a guest row that ends it that way.
static void s_test_broker (void)
{
    size_t asks = 0;
    for (size_t i = 0; i < SBX_BROKER_TRANSITIONS; i++) {
        const sbx_broker_transition_t *row = &sbx_broker_transitions[i];
        assert (sbx_broker_transition (row->from, row->event) == row);
        if (row->ask != SBX_MSG__UNKNOWN) {
            const char *name = sbx_msg_type_name (row->ask); //  "vm.stop"
            assert (name && strncmp (name, "vm.", 3) == 0);
            sbx_vmd_event_t event = SBX_VMD_EV__NONE;
            for (int e = 0; e < SBX_VMD_EV__COUNT; e++)
                if (streq (sbx_vmd_event_name ((sbx_vmd_event_t) e), name + 3))
                    event = (sbx_vmd_event_t) e;
            assert (sbx_vmd_event_kind (event) == SBX_LIFECYCLE_REQUEST);
            vmd_lifecycle_t now = vmd_lifecycle_start (row->from);
            vmd_lifecycle_step_t step;
            assert (vmd_lifecycle_next (&now, event, &step) == 0);
            assert (step.next.guest == row->to);
            asks++;
        }
        if (row->event == SBX_BROKER_EV_VM_OK) {
            bool ends = false;
            for (size_t j = 0; j < SBX_VMD_TRANSITIONS; j++)
                ends |= sbx_vmd_transitions[j].from == row->from &&
                        sbx_vmd_transitions[j].to == row->to;
            assert (ends);
        }
    }
    assert (asks == 5);
    //  The broker refuses what its table lacks, and out-of-range values.
    assert (sbx_broker_transition (SBX_SANDBOX_STATE_STOPPED, SBX_BROKER_EV_STOP) == NULL);
    assert (sbx_broker_transition (SBX_SANDBOX_STATE_READY, (sbx_broker_event_t) 99) == NULL);
    assert (sbx_broker_transition ((sbx_sandbox_state_t) 99, SBX_BROKER_EV_DELETE) == NULL);
    assert (streq (sbx_broker_event_name (SBX_BROKER_EV_VM_OK), "vm_ok"));
}

void vmd_lifecycle_test (bool verbose)
{
    s_verbose = verbose;
    if (verbose)
        zsys_info ("vmd_lifecycle: %d guest, %d capture and %d restore rows; %d events",
                   SBX_VMD_TRANSITIONS, SBX_VMD_CAPTURE_TRANSITIONS, SBX_VMD_RESTORE_TRANSITIONS,
                   SBX_VMD_EV__COUNT);
    s_test_rows ();
    s_test_refusals ();
    s_test_reachable ();
    s_test_stories ();
    s_test_broker ();
}
