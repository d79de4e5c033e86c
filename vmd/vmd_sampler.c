/*  vmd_sampler - see vmd_sampler.h */
#include "vmd_sampler.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "vmd_guest.h"
#include "vmd_qemu.h"
#include "vmd_samples.h"

#include <unistd.h>

#define S_ASK_MS 4000 //  agent.stats's deadline, at least (a busy guest under TCG)

struct _vmd_sampler_t {
    zloop_t *loop;
    zhashx_t *guests; //  the server's
    const char *vms_dir;
    uint32_t interval_ms;
    long ticks_per_s;
    int timer;
    zhashx_t *states; //  sandbox id -> s_state_t
};

//  One guest's samples, and the one being taken.
typedef struct {
    vmd_sampler_t *sampler;
    char id[72];
    vmd_samples_t *ring;
    pid_t pid; //  the QEMU last read, and what it had used then
    uint64_t ticks;
    uint64_t ticks_mono; //  when (0: no reading yet)
    bool asking;         //  agent.stats is out; the sample waits for it
    uint64_t asked_mono;
    sbx_metrics_sample_t pending;
    bool warned; //  its agent's figures were refused once (logged once)
} s_state_t;

static void s_state_destroy (s_state_t **self_p)
{
    s_state_t *self = *self_p;
    if (!self)
        return;
    vmd_samples_destroy (&self->ring);
    free (self);
    *self_p = NULL;
}

static void s_state_destructor (void **item)
{
    s_state_destroy ((s_state_t **) item);
}

static void s_path (vmd_sampler_t *self, const char *id, char *path, size_t size)
{
    snprintf (path, size, "%s/%s/metrics.bin", self->vms_dir, id);
}

//  The guest's state, made (with what a vmd before this one saved) when asked to.
static s_state_t *s_state (vmd_sampler_t *self, const char *id, bool make)
{
    s_state_t *state = zhashx_lookup (self->states, id);
    if (state || !make)
        return state;
    state = calloc (1, sizeof *state);
    if (!state || !(state->ring = vmd_samples_new (VMD_SAMPLES_KEPT))) {
        free (state);
        return NULL;
    }
    state->sampler = self;
    snprintf (state->id, sizeof state->id, "%s", id);
    char path[4200];
    s_path (self, id, path, sizeof path);
    if (vmd_samples_load (state->ring, path) == 0)
        sbx_debug ("sandbox=%s %zu samples read back from %s", id, vmd_samples_size (state->ring),
                   path);
    zhashx_insert (self->states, id, state);
    return state;
}

static void s_on_stats (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    s_state_t *state = arg;
    sbx_msg_t *answer = *reply_p;
    state->asking = false;
    sbx_metrics_sample_t sample = state->pending;
    vmd_guest_t *guest = zhashx_lookup (state->sampler->guests, state->id);
    const vmd_qemu_type_t *type =
        guest ? vmd_qemu_type (sbx_sandbox_type_name (vmd_guest_type (guest))) : NULL;
    uint64_t memory_limit = (uint64_t) (type ? type->memory_mib : 2048) << 20;
    if (answer->type == SBX_MSG_AGENT_STATS_OK) {
        if (vmd_samples_check (sbx_msg_agent_stats_ok (answer), memory_limit, &sample) &&
            !state->warned) {
            sbx_warn ("sandbox=%s the agent's figures cannot be a guest's: CPU only", state->id);
            state->warned = true;
        }
    } else
        sbx_debug ("sandbox=%s agent.stats: %s (CPU only)", state->id,
                   answer->type == SBX_MSG_ERROR ? sbx_msg_error (answer)->message : "?");
    vmd_samples_add (state->ring, &sample);
}

static void s_sample (vmd_sampler_t *self, vmd_guest_t *guest, uint64_t now_mono)
{
    pid_t pid = vmd_guest_pid (guest);
    s_state_t *state = pid > 0 ? s_state (self, vmd_guest_id (guest), true) : NULL;
    if (!state)
        return;
    char path[64], text[1024];
    snprintf (path, sizeof path, "/proc/%d/stat", (int) pid);
    FILE *file = fopen (path, "re");
    size_t size = file ? fread (text, 1, sizeof text - 1, file) : 0;
    if (file)
        fclose (file);
    text[size] = 0;
    uint64_t ticks;
    if (vmd_samples_stat_ticks (text, &ticks))
        return; //  QEMU just went: the guest's own news will say so
    bool baseline = state->ticks_mono && state->pid == pid && ticks >= state->ticks;
    const vmd_qemu_type_t *type = vmd_qemu_type (sbx_sandbox_type_name (vmd_guest_type (guest)));
    sbx_metrics_sample_t sample = {
        .time_ms = sbx_clock_now_ms (),
        .cpu_permille = baseline ? vmd_samples_cpu_permille (
                                       ticks - state->ticks, self->ticks_per_s,
                                       now_mono - state->ticks_mono, type ? type->vcpus : 1)
                                 : 0};
    state->pid = pid;
    state->ticks = ticks;
    state->ticks_mono = now_mono;
    if (!baseline)
        return; //  the first reading: CPU needs two
    //  A guest slower than that to answer gives fewer samples, not CPU-only ones; an ask
    //  the link dropped (it reconnected) never answers, and is not waited on forever.
    uint32_t timeout = self->interval_ms < S_ASK_MS ? S_ASK_MS : self->interval_ms;
    if (state->asking &&
        now_mono - state->asked_mono < (uint64_t) timeout + self->interval_ms + 1000)
        return;
    state->asking = true;
    state->asked_mono = now_mono;
    state->pending = sample;
    sbx_msg_t *ask = sbx_msg_new (SBX_MSG_AGENT_STATS);
    sbx_err_t err = {0};
    if (!ask || vmd_guest_agent (guest, &ask, timeout, s_on_stats, state, &err)) {
        state->asking = false;
        vmd_samples_add (state->ring, &sample);
    }
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_sampler_t *self = arg;
    uint64_t now = sbx_clock_mono_ms ();
    for (vmd_guest_t *g = zhashx_first (self->guests); g; g = zhashx_next (self->guests))
        if (vmd_guest_state (g) == SBX_SANDBOX_STATE_READY)
            s_sample (self, g, now);
    return 0;
}

vmd_sampler_t *vmd_sampler_new (zloop_t *loop, zhashx_t *guests, const char *vms_dir,
                                uint32_t interval_ms)
{
    vmd_sampler_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->guests = guests;
    self->vms_dir = vms_dir;
    self->interval_ms = interval_ms;
    self->ticks_per_s = sysconf (_SC_CLK_TCK);
    self->states = zhashx_new ();
    if (!self->states) {
        vmd_sampler_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->states, s_state_destructor);
    if (interval_ms > 0)
        self->timer = zloop_timer (loop, interval_ms, 0, s_on_tick, self);
    sbx_info ("guests sampled every %u ms%s", interval_ms, interval_ms ? "" : " (off)");
    return self;
}

void vmd_sampler_destroy (vmd_sampler_t **self_p)
{
    vmd_sampler_t *self = *self_p;
    if (!self)
        return;
    if (self->timer > 0)
        zloop_timer_end (self->loop, self->timer);
    for (s_state_t *s = zhashx_first (self->states); s; s = zhashx_next (self->states)) {
        char path[4200];
        s_path (self, s->id, path, sizeof path);
        if (vmd_samples_size (s->ring) && vmd_samples_save (s->ring, path))
            sbx_warn ("sandbox=%s cannot keep its samples in %s", s->id, path);
    }
    zhashx_destroy (&self->states);
    free (self);
    *self_p = NULL;
}

void vmd_sampler_forget (vmd_sampler_t *self, const char *id)
{
    zhashx_delete (self->states, id);
}

sbx_msg_t *vmd_sampler_answer (vmd_sampler_t *self, sbx_msg_t *request)
{
    sbx_vm_metrics_t *args = sbx_msg_vm_metrics (request);
    vmd_guest_t *guest = args->sandbox_id ? zhashx_lookup (self->guests, args->sandbox_id) : NULL;
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    const vmd_qemu_type_t *type = vmd_qemu_type (sbx_sandbox_type_name (vmd_guest_type (guest)));
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_METRICS_OK);
    sbx_vm_metrics_ok_t *ok = sbx_msg_vm_metrics_ok (reply);
    sbx_str_set (&ok->sandbox_id, args->sandbox_id);
    ok->state = vmd_guest_state (guest);
    ok->vcpus = (uint64_t) (type ? type->vcpus : 1);
    ok->interval_ms = self->interval_ms;
    s_state_t *state = s_state (self, args->sandbox_id, true);
    size_t limit = args->limit > VMD_SAMPLES_KEPT ? VMD_SAMPLES_KEPT : (size_t) args->limit;
    if (state && vmd_samples_copy (state->ring, args->since_ms, limit, &ok->samples)) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    return reply;
}
