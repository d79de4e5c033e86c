/*  brk_sandbox - see brk_sandbox.h */
#include "brk_sandbox.h"
#include "brk_egress.h"
#include "brk_limits.h"
#include "brk_names.h"
#include "sbx_lifecycle_gen.h"
#include "sbx_metrics.h"
#include "sbx_secret.h"

#include <assert.h>

//  What can happen to a sandbox, besides being created, and where it leads: the broker's
//  machine in schemas/lifecycle.json (docs/lifecycle.md), made into a table by gen.py. In
//  state `from`, event `event` leads to `to`, asking vmd for `ask` (when set). A user
//  event missing there is refused with failed_precondition.
typedef sbx_broker_event_t s_event_t;
#define S_EV_STOP      SBX_BROKER_EV_STOP      //  the user asks
#define S_EV_RESUME    SBX_BROKER_EV_RESUME    //  the user asks
#define S_EV_DELETE    SBX_BROKER_EV_DELETE    //  the user asks
#define S_EV_VM_OK     SBX_BROKER_EV_VM_OK     //  vmd did what was asked
#define S_EV_VM_FAILED SBX_BROKER_EV_VM_FAILED //  vmd could not, or the guest died

#define S_EV_HOST_LOST         SBX_BROKER_EV_HOST_LOST         //  its vmd silent too long
#define S_EV_HOST_BACK         SBX_BROKER_EV_HOST_BACK         //  its vmd back, the guest running
#define S_EV_HOST_BACK_STOPPED SBX_BROKER_EV_HOST_BACK_STOPPED //  … the guest stopped

static const char *s_event_names[] = {"stop",
                                      "resume",
                                      "delete",
                                      "vm ok",
                                      "vm failed",
                                      "host lost",
                                      "host back (running)",
                                      "host back (stopped)"};

typedef sbx_broker_transition_t s_transition_t;

static const s_transition_t *s_lookup (sbx_sandbox_state_t from, s_event_t event)
{
    return sbx_broker_transition (from, event);
}

//  How long vmd may take: a boot under TCG, a memory save, a restore.
#define S_VM_TIMEOUT_MS 120000u
#define S_LABEL_TRIES   8
#define S_MAX_LABELS    64

static bool s_operator (const sbx_caller_t *caller)
{
    return caller->kind == SBX_CALLER_KIND_ADMIN || caller->kind == SBX_CALLER_KIND_SYSTEM;
}

//  Another account's sandbox, or (for a ci key) one another key created, is not there.
static bool s_visible (const sbx_caller_t *caller, const brk_sandbox_t *sandbox)
{
    if (s_operator (caller))
        return true;
    if (!caller->account_id || strcmp (caller->account_id, sandbox->account_id) != 0)
        return false;
    if (caller->preset == SBX_KEY_PRESET_CI)
        return caller->key_id && sandbox->key_id && strcmp (caller->key_id, sandbox->key_id) == 0;
    return true;
}

//  What a key's preset allows (the gateway checks too; the broker is the last word).
static sbx_msg_t *s_refuse_preset (const sbx_msg_t *request, s_event_t event, bool create)
{
    sbx_key_preset_t preset = request->caller->preset;
    if (preset == SBX_KEY_PRESET_READ_ONLY)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "this key is read-only: it cannot %s sandboxes",
                                  create ? "create" : s_event_names[event]);
    if (preset == SBX_KEY_PRESET_NO_DELETE && !create && event == S_EV_DELETE)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "this key's preset is no-delete: it cannot delete sandboxes");
    return NULL;
}

//  Names, label keys and label values: text a person reads in lists and logs, so no
//  control characters. The schema's byte limits were checked by the codec already.
static bool s_has_control (const char *text)
{
    for (const char *p = text; p && *p; p++)
        if ((unsigned char) *p < 0x20 || *p == 0x7f)
            return true;
    return false;
}

//  The one check of a name and labels, for create and update: NULL or the error.
static sbx_msg_t *s_check_text (const sbx_msg_t *request, const char *name,
                                const sbx_strmap_t *labels)
{
    if (s_has_control (name))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "name must not contain control characters");
    if (labels->count > S_MAX_LABELS)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "at most %d labels",
                                  S_MAX_LABELS);
    for (size_t i = 0; i < labels->count; i++) {
        if (!*labels->keys[i] || strlen (labels->keys[i]) > 64 || strlen (labels->values[i]) > 256)
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "label keys are 1-64 characters, values at most 256");
        if (s_has_control (labels->keys[i]) || s_has_control (labels->values[i]))
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "labels must not contain control characters");
    }
    return NULL;
}

static void s_count_label (const char *key, const char *value, void *arg)
{
    (void) key;
    (void) value;
    (*(uint64_t *) arg)++;
}

static void s_add_label (const char *key, const char *value, void *arg)
{
    sbx_strmap_set ((sbx_strmap_t *) arg, key, value);
}

static void s_add_port (const brk_port_t *port, void *arg)
{
    sbx_port_info_t *info = sbx_port_info_list_append ((sbx_port_info_list_t *) arg);
    if (info) {
        info->port = port->port;
        info->public = port->public;
    }
}

//  Fills the wire form of a sandbox from its record (and its labels and ports).
static void s_info (brk_ctx_t *ctx, const brk_sandbox_t *record, sbx_sandbox_info_t *info)
{
    sbx_str_set (&info->id, record->id);
    sbx_str_set (&info->name, record->name);
    sbx_str_set (&info->label, record->label);
    sbx_sandbox_state_from_name (record->state, &info->state);
    sbx_sandbox_type_from_name (record->type, &info->type);
    sbx_str_set (&info->account, record->account_id);
    sbx_str_set (&info->vmd, record->vmd);
    info->no_network = record->no_network;
    info->no_auto_resume = record->no_auto_resume;
    brk_egress_split (record->egress_allow, &info->egress_allow);
    brk_egress_split (record->egress_deny, &info->egress_deny);
    info->created_ms = record->created_ms;
    info->expires_ms = record->expires_ms;
    info->changed_ms = record->changed_ms;
    sbx_str_set (&info->reason, record->reason);
    brk_store_sandbox_labels (ctx->store, record->id, s_add_label, &info->labels);
    brk_store_ports (ctx->store, record->id, s_add_port, &info->ports);
}

sbx_sandbox_info_t *brk_sandbox_info (brk_ctx_t *ctx, const brk_sandbox_t *record)
{
    sbx_sandbox_info_t *info = calloc (1, sizeof *info);
    if (info)
        s_info (ctx, record, info);
    return info;
}

//  A reply of `type` (a sandbox.*.ok but list) carrying the sandbox.
static sbx_msg_t *s_reply (brk_ctx_t *ctx, uint64_t rid, sbx_msg_type_t type,
                           const brk_sandbox_t *record)
{
    sbx_msg_t *reply = sbx_msg_new (type);
    if (!reply)
        return NULL;
    reply->rid = rid;
    sbx_sandbox_info_t **slot = sbx_msg_sandbox_slot (reply);
    assert (slot);
    *slot = calloc (1, sizeof (sbx_sandbox_info_t));
    if (*slot)
        s_info (ctx, record, *slot);
    return reply;
}

//  Moves a sandbox to `to` with its event, in one transaction with a new deadline (when
//  expires_ms is set) and one more event (when extra is given). Updates `record`.
//  at_ms, when set, is when the change took effect, before now (a host lost).
static int s_move_at (brk_ctx_t *ctx, brk_sandbox_t *record, sbx_sandbox_state_t to,
                      const char *vmd, const char *reason, uint64_t expires_ms, sbx_msg_t **extra_p,
                      uint64_t at_ms);

static int s_move_ex (brk_ctx_t *ctx, brk_sandbox_t *record, sbx_sandbox_state_t to,
                      const char *vmd, const char *reason, uint64_t expires_ms, sbx_msg_t **extra_p)
{
    return s_move_at (ctx, record, to, vmd, reason, expires_ms, extra_p, 0);
}

static int s_move_at (brk_ctx_t *ctx, brk_sandbox_t *record, sbx_sandbox_state_t to,
                      const char *vmd, const char *reason, uint64_t expires_ms, sbx_msg_t **extra_p,
                      uint64_t at_ms)
{
    sbx_sandbox_state_t from = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record->state, &from);
    sbx_sandbox_type_t type = SBX_SANDBOX_TYPE_SMALL;
    sbx_sandbox_type_from_name (record->type, &type);
    uint64_t now = sbx_clock_now_ms ();
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
    sbx_sandbox_changed_t *body = sbx_msg_sandbox_changed (event);
    sbx_str_set (&body->sandbox_id, record->id);
    body->from = from;
    body->to = to;
    body->type = type;
    sbx_str_set (&body->vmd, vmd ? vmd : record->vmd);
    sbx_str_set (&body->reason, reason);
    body->expires_ms = expires_ms ? expires_ms : record->expires_ms;
    body->at_ms = at_ms && at_ms < now ? at_ms : 0;
    const char *state = sbx_sandbox_state_name (to);
    if (brk_events_begin (ctx->events) ||
        (extra_p && *extra_p &&
         brk_events_add (ctx->events, extra_p, record->account_id, record->id)) ||
        brk_store_sandbox_set_state (ctx->store, record->id, state, vmd, reason, now) != 0 ||
        //  A resume is a start: the plan's starts per day count it.
        (to == SBX_SANDBOX_STATE_RESUMING &&
         brk_store_start_add (ctx->store, record->account_id, record->id, now)) ||
        (expires_ms &&
         brk_store_sandbox_set_expiry (ctx->store, record->id, expires_ms, record->ttl_s)) ||
        brk_events_add (ctx->events, &event, record->account_id, record->id) ||
        brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        sbx_msg_destroy (&event);
        if (extra_p)
            sbx_msg_destroy (extra_p);
        sbx_error ("sandbox=%s cannot record %s → %s", record->id, record->state, state);
        return -1;
    }
    sbx_info ("sandbox=%s %s → %s%s%s", record->id, record->state, state, reason ? ": " : "",
              reason ? reason : "");
    free (record->state);
    record->state = strdup (state);
    if (vmd) {
        free (record->vmd);
        record->vmd = strdup (vmd);
    }
    free (record->reason);
    record->reason = reason ? strdup (reason) : NULL;
    record->changed_ms = now;
    if (expires_ms)
        record->expires_ms = expires_ms;
    return 0;
}

static int s_move (brk_ctx_t *ctx, brk_sandbox_t *record, sbx_sandbox_state_t to, const char *vmd,
                   const char *reason)
{
    return s_move_ex (ctx, record, to, vmd, reason, 0, NULL);
}

//  A request waiting on vmd: who to answer, with what.
typedef struct {
    zframe_t *client;
    uint64_t rid;
    sbx_msg_type_t reply_type;
    char *sandbox_id;
    const char *verb; //  "start", "stop"… for messages
    const char *op;   //  "create", "stop"…: sbx_sandbox_ops_total's op
    uint64_t asked_mono;
    zhashx_t *in_flight;       //  ctx's, where the sandbox is while this op waits
    brk_sandbox_done_fn *done; //  takes the answer instead of a client (a fork's copies)
    void *done_arg;
} s_op_t;

//  An answered create, resume, stop or delete, for sbx_sandbox_ops_total: ok or the code.
static void s_count (const char *op, sbx_msg_t *reply)
{
    if (op && reply)
        sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_SANDBOX_OPS_TOTAL, 1, op,
                         reply->type == SBX_MSG_ERROR ? sbx_code_name (sbx_msg_error (reply)->code)
                                                      : "ok");
}

static void s_op_destroy (s_op_t **op_p)
{
    s_op_t *op = *op_p;
    if (!op)
        return;
    if (op->in_flight && op->sandbox_id)
        zhashx_delete (op->in_flight, op->sandbox_id);
    zframe_destroy (&op->client);
    free (op->sandbox_id);
    free (op);
    *op_p = NULL;
}

//  Creating, stopping, resuming or deleting: on its way (a record brk_reconcile settles
//  when no request of this broker is in flight for it; a guest vmd is still moving).
static bool s_moving (sbx_sandbox_state_t state)
{
    return state == SBX_SANDBOX_STATE_CREATING || state == SBX_SANDBOX_STATE_STOPPING ||
           state == SBX_SANDBOX_STATE_RESUMING || state == SBX_SANDBOX_STATE_DELETING;
}

static bool s_on_its_way (const brk_sandbox_t *record)
{
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record->state, &state);
    return record->vmd && s_moving (state);
}

//  vmd answered (or the broker gave up on it): apply the event, answer the user.
static void s_on_vm_answer (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_op_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    bool ok = answer->type != SBX_MSG_ERROR;
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (brk_store_sandbox_find (ctx->store, op->sandbox_id, &record) != 0)
        reply = sbx_msg_new_error (op->rid, SBX_E_INTERNAL, "sandbox %s vanished from the store",
                                   op->sandbox_id);
    else if (!ok && ctx->answer_is_own && sbx_msg_error (answer)->code == SBX_E_UNAVAILABLE &&
             s_on_its_way (&record)) {
        //  Its vmd went away with the request (a restart, a new connection): what it did is
        //  not known here. The record stays on its way, and once the vmd is back
        //  brk_reconcile settles it by what the vmd has (or asks again), as after a broker's
        //  restart; its loss for good makes it host lost (brk_hostloss).
        sbx_warn ("sandbox=%s vmd %s went away during its %s; it stays %s until the vmd says "
                  "what it did",
                  record.id, record.vmd, op->verb, record.state);
        reply = sbx_msg_new_error (op->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s: its vmd %s went away during the %s; it stays %s "
                                   "until that vmd is back and says what it did (get_sandbox "
                                   "shows it then)",
                                   record.id, record.vmd, op->verb, record.state);
        brk_sandbox_clear (&record);
    } else {
        sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
        sbx_sandbox_state_from_name (record.state, &state);
        const s_transition_t *t = s_lookup (state, ok ? S_EV_VM_OK : S_EV_VM_FAILED);
        char reason[1024] = "";
        if (!ok)
            snprintf (reason, sizeof reason, "could not %s: %s", op->verb,
                      sbx_msg_error (answer)->message);
        //  Back to ready after a resume: the TTL runs again from now.
        uint64_t expires = ok && t && state == SBX_SANDBOX_STATE_RESUMING && record.ttl_s
                               ? sbx_clock_now_ms () + record.ttl_s * 1000
                               : 0;
        //  A move the broker made itself (a TTL stop) keeps saying why.
        char kept[1024] = "";
        if (ok && !op->client && record.reason)
            snprintf (kept, sizeof kept, "%s", record.reason);
        const char *why = ok ? (*kept ? kept : NULL) : reason;
        if (t && s_move_ex (ctx, &record, t->to, NULL, why, expires, NULL)) {
            reply = sbx_msg_new_error (op->rid, SBX_E_INTERNAL, "cannot record sandbox %s",
                                       op->sandbox_id);
        } else if (ok && t) {
            //  A stop keeps an automatic snapshot and a delete takes them along: brk_snapshot
            //  follows the sandbox.changed the move logged.
            reply = s_reply (ctx, op->rid, op->reply_type, &record);
            //  A create from a snapshot that could only use its disk says so.
            if (reply && answer->type == SBX_MSG_VM_CREATE_OK &&
                reply->type == SBX_MSG_SANDBOX_CREATE_OK)
                sbx_str_set (&sbx_msg_sandbox_create_ok (reply)->note,
                             sbx_msg_vm_create_ok (answer)->note);
        } else if (ok) //  something else moved it meanwhile (it failed): say where it is
            reply = sbx_msg_new_error (op->rid, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s%s",
                                       record.id, record.state, record.reason ? ": " : "",
                                       record.reason ? record.reason : "");
        else
            reply = sbx_msg_new_error (op->rid, sbx_msg_error (answer)->code, "sandbox %s %s",
                                       record.id, reason);
        brk_sandbox_clear (&record);
    }
    s_count (op->op, reply);
    sbx_metrics_observe (sbx_metrics_here (), SBX_METRIC_SANDBOX_OP_SECONDS,
                         (double) (sbx_clock_mono_ms () - op->asked_mono) / 1000.0, op->op);
    if (op->done)
        op->done (ctx, &reply, op->done_arg);
    else if (op->client)
        ctx->send (ctx, op->client, &reply);
    sbx_msg_destroy (&reply); //  the broker's own move (a TTL stop): the log says how it went
    s_op_destroy (&op);
}

//  Who hears how a request to vmd ended: a client (its address), or a function.
typedef struct {
    zframe_t *client;
    brk_sandbox_done_fn *done;
    void *arg;
} s_notify_t;

//  Its vmd is not connected: the sandbox can't move now, and says so.
static sbx_msg_t *s_vmd_away (const sbx_msg_t *request, const brk_sandbox_t *record)
{
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "sandbox %s is on vmd %s, which is not connected; retry when it is "
                              "back",
                              record->id, record->vmd ? record->vmd : "(none)");
}

//  Where the record goes before vmd is asked (a stop, resume or delete): written first, so
//  that a broker killed right after the ask leaves the record on its way, which
//  brk_reconcile settles by what vmd has, and never behind a guest that already moved (a
//  stopped record over a resumed guest, whose next resume vmd refused).
typedef struct {
    sbx_sandbox_state_t to;
    const char *reason;
    sbx_msg_t **extra; //  one more event for the move's transaction (ttl.expired); taken
} s_ahead_t;

//  Asks vmd for `type` about a sandbox; the user's answer follows from s_on_vm_answer.
//  A create from a snapshot (origin) names its files. With `ahead`, the record moves first
//  (and back, should the ask then not go out).
static sbx_msg_t *s_ask_vmd_ex (brk_ctx_t *ctx, const s_notify_t *notify, const sbx_msg_t *request,
                                brk_sandbox_t *record, sbx_msg_type_t ask,
                                sbx_msg_type_t reply_type, const char *verb,
                                const brk_origin_t *origin, const s_ahead_t *ahead)
{
    if (!record->vmd || !brk_registry_find (ctx->registry, SBX_ROLE_VMD, record->vmd)) {
        if (ahead && ahead->extra)
            sbx_msg_destroy (ahead->extra);
        return s_vmd_away (request, record);
    }
    s_op_t *op = calloc (1, sizeof *op);
    sbx_msg_t *vm = sbx_msg_new (ask);
    if (!op || !vm) {
        free (op);
        sbx_msg_destroy (&vm);
        if (ahead && ahead->extra)
            sbx_msg_destroy (ahead->extra);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    op->client = notify->client ? zframe_dup (notify->client) : NULL;
    op->done = notify->done;
    op->done_arg = notify->arg;
    op->rid = request->rid;
    op->reply_type = reply_type;
    op->sandbox_id = strdup (record->id);
    op->verb = verb;
    op->op = ask == SBX_MSG_VM_CREATE   ? "create"
             : ask == SBX_MSG_VM_RESUME ? "resume"
             : ask == SBX_MSG_VM_STOP   ? "stop"
                                        : "delete";
    op->asked_mono = sbx_clock_mono_ms ();
    switch (ask) {
    case SBX_MSG_VM_CREATE: {
        sbx_vm_create_t *create = sbx_msg_vm_create (vm);
        sbx_str_set (&create->sandbox_id, record->id);
        sbx_str_set (&create->hostname, record->label);
        sbx_sandbox_type_from_name (record->type, &create->type);
        create->no_network = record->no_network;
        brk_egress_split (record->egress_allow, &create->egress_allow);
        brk_egress_split (record->egress_deny, &create->egress_deny);
        if (origin) {
            sbx_str_set (&create->snapshot_dir, origin->dir);
            sbx_str_set (&create->snapshot_qemu, origin->qemu_version);
            sbx_str_set (&create->image, origin->image);
        }
        break;
    }
    case SBX_MSG_VM_RESUME: {
        //  The rules of the record, which may have changed while it was stopped.
        sbx_vm_resume_t *resume = sbx_msg_vm_resume (vm);
        sbx_str_set (&resume->sandbox_id, record->id);
        brk_egress_split (record->egress_allow, &resume->egress_allow);
        brk_egress_split (record->egress_deny, &resume->egress_deny);
        break;
    }
    default:
        //  vm.stop, vm.delete: the sandbox is all they say.
        if (sbx_msg_set_subject (vm, record->id))
            assert (false);
    }
    uint32_t timeout = request->timeout_ms > 1000 ? request->timeout_ms - 500 : S_VM_TIMEOUT_MS;
    sbx_sandbox_state_t was = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record->state, &was);
    char *was_reason = record->reason ? strdup (record->reason) : NULL;
    if (ahead && s_move_ex (ctx, record, ahead->to, NULL, ahead->reason, 0, ahead->extra)) {
        free (was_reason);
        s_op_destroy (&op);
        sbx_msg_destroy (&vm);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                  "cannot record the %s of sandbox %s", verb, record->id);
    }
    if (ctx->in_flight && zhashx_insert (ctx->in_flight, record->id, (void *) 1) == 0)
        op->in_flight = ctx->in_flight;
    if (ctx->call (ctx, SBX_ROLE_VMD, record->vmd, &vm, timeout, s_on_vm_answer, op) == 0) {
        free (was_reason);
        return NULL;
    }
    //  It did not go out after all: the record goes back to where it was.
    s_op_destroy (&op);
    if (ahead)
        s_move (ctx, record, was, NULL, was_reason);
    free (was_reason);
    return s_vmd_away (request, record);
}

static sbx_msg_t *s_ask_vmd (brk_ctx_t *ctx, zframe_t *client, const sbx_msg_t *request,
                             brk_sandbox_t *record, sbx_msg_type_t ask, sbx_msg_type_t reply_type,
                             const char *verb, const s_ahead_t *ahead)
{
    s_notify_t notify = {.client = client};
    return s_ask_vmd_ex (ctx, &notify, request, record, ask, reply_type, verb, NULL, ahead);
}

//  The connected vmd with the most room (only `instance` when given), or NULL (with
//  *any telling whether such a vmd was connected at all, *room how many more it takes).
static brk_peer_t *s_pick_vmd (brk_ctx_t *ctx, const char *instance, bool *any, uint64_t *room_p)
{
    brk_peer_t *best = NULL;
    uint64_t best_free = 0;
    *any = false;
    for (brk_peer_t *p = brk_registry_first (ctx->registry); p;
         p = brk_registry_next (ctx->registry)) {
        if (p->role != SBX_ROLE_VMD || (instance && !streq (p->instance, instance)))
            continue;
        *any = true;
        uint64_t active = 0, draining = 0;
        //  A vmd being drained (sbx host drain) takes nothing new.
        if (brk_store_sandbox_active (ctx->store, p->instance, &active) ||
            brk_store_drain_since (ctx->store, p->instance, &draining) || draining)
            continue;
        uint64_t room = p->capacity > active ? p->capacity - active : 0;
        if (room > best_free) {
            best = p;
            best_free = room;
        }
    }
    *room_p = best_free;
    return best;
}

//  The account a create is for: operators name it by id or email; users' callers carry
//  their own id. NULL and *owner, or the error reply.
static sbx_msg_t *s_owner (brk_ctx_t *ctx, const sbx_msg_t *request, brk_account_t *owner)
{
    const sbx_caller_t *caller = request->caller;
    int found = brk_store_account_find (ctx->store, caller->account_id, owner);
    if (found == 0 && (s_operator (caller) || streq (owner->id, caller->account_id)))
        return NULL;
    if (found == 0)
        brk_account_clear (owner);
    return sbx_msg_new_error (request->rid, found < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                              "no account '%s'", caller->account_id);
}

//  Where a new sandbox goes: the vmd with the most room; one made from a snapshot, on
//  the vmd that saved the snapshot (the store is on that host: its disk is the new
//  sandbox's backing file). NULL and *error when there is none.
static brk_peer_t *s_place (brk_ctx_t *ctx, const sbx_msg_t *request, const brk_origin_t *origin,
                            sbx_msg_t **error)
{
    bool any = false;
    uint64_t room;
    const char *home = origin ? origin->vmd : NULL;
    brk_peer_t *vmd = s_pick_vmd (ctx, home, &any, &room);
    if (vmd)
        return vmd;
    if (home)
        *error = sbx_msg_new_error (
            request->rid, SBX_E_UNAVAILABLE,
            any ? "snapshot %s is on vmd %s's host, and that vmd is full or being drained; "
                  "stop or delete a sandbox there, or end the drain (sbx host drain --undo)"
                : "snapshot %s is on vmd %s's host, and that vmd is not connected; retry when "
                  "it is back",
            origin->snapshot_id, home);
    else
        *error = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                    any ? "every vmd is full or being drained; stop or delete a "
                                          "sandbox, or add a host"
                                        : "no vmd is connected to the broker; is sbx-vmd running?");
    return NULL;
}

static sbx_msg_t *s_create (brk_ctx_t *ctx, const s_notify_t *notify, sbx_msg_t *request,
                            const brk_origin_t *origin)
{
    sbx_sandbox_create_t *args = sbx_msg_sandbox_create (request);
    const sbx_caller_t *caller = request->caller;
    if (!caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "sandbox.create carries no caller identity");
    if (!caller->account_id)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "a sandbox belongs to an account: the caller names none");
    sbx_msg_t *refused = s_refuse_preset (request, S_EV_STOP, true);
    if (refused)
        return refused;
    refused = s_check_text (request, args->name, &args->labels);
    if (!refused)
        refused = brk_egress_check (request, &args->egress_allow, &args->egress_deny);
    if (refused)
        return refused;
    if (args->ttl_s > 10ULL * 365 * 86400)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "ttl_s is at most ten years");
    brk_account_t owner;
    refused = s_owner (ctx, request, &owner);
    if (refused)
        return refused;
    //  The account's plan, whoever asks: an operator creating for it included.
    uint64_t ttl_s = args->ttl_s;
    refused = brk_limits_check_start (ctx, &owner, request->rid);
    if (!refused)
        refused = brk_limits_ttl (ctx, &owner, request->rid, &ttl_s, false);
    if (refused) {
        brk_account_clear (&owner);
        return refused;
    }
    brk_peer_t *vmd = s_place (ctx, request, origin, &refused);
    if (!vmd) {
        brk_account_clear (&owner);
        return refused;
    }
    sbx_sandbox_type_t type = args->type ? args->type : SBX_SANDBOX_TYPE_SMALL;
    if (origin) //  its memory was saved from a guest of that size
        type = origin->type;
    uint64_t now = sbx_clock_now_ms ();
    char *id = origin ? strdup (origin->sandbox_id) : sbx_secret_id ("sb_");
    brk_sandbox_t record = {.id = id,
                            .account_id = owner.id,
                            .name = args->name,
                            .state = "creating",
                            .type = (char *) sbx_sandbox_type_name (type),
                            .vmd = vmd->instance,
                            .key_id = caller->key_id,
                            .no_network = args->no_network,
                            .no_auto_resume = args->no_auto_resume,
                            .egress_allow = brk_egress_join (&args->egress_allow),
                            .egress_deny = brk_egress_join (&args->egress_deny),
                            .created_ms = now,
                            .expires_ms = ttl_s ? now + ttl_s * 1000 : 0,
                            .ttl_s = ttl_s,
                            .changed_ms = now};
    //  A readable label, unique among live sandboxes: retry the rare collision.
    int rc = 1;
    for (int tries = 0; rc == 1 && tries < S_LABEL_TRIES; tries++) {
        free (record.label);
        record.label = brk_names_label ();
        record.name = args->name ? args->name : record.label;
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_SANDBOX_CHANGED);
        sbx_sandbox_changed_t *body = sbx_msg_sandbox_changed (event);
        sbx_str_set (&body->sandbox_id, id);
        body->to = SBX_SANDBOX_STATE_CREATING;
        body->type = type;
        body->expires_ms = record.expires_ms;
        sbx_str_set (&body->vmd, vmd->instance);
        rc = brk_events_begin (ctx->events) ? -1 : brk_store_sandbox_insert (ctx->store, &record);
        for (size_t i = 0; rc == 0 && i < args->labels.count; i++)
            rc = brk_store_sandbox_label_set (ctx->store, id, args->labels.keys[i],
                                              args->labels.values[i]);
        if (rc == 0)
            rc = brk_store_start_add (ctx->store, owner.id, id, now);
        if (rc == 0)
            rc = brk_events_add (ctx->events, &event, owner.id, id);
        if (rc == 0)
            rc = brk_events_commit (ctx->events);
        else
            brk_events_rollback (ctx->events);
        sbx_msg_destroy (&event);
    }
    sbx_msg_t *reply;
    if (rc != 0)
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record the sandbox");
    else {
        sbx_info ("rid=%llu sandbox=%s account=%s creating on vmd %s as %s",
                  (unsigned long long) request->rid, id, owner.id, vmd->instance, record.label);
        reply = s_ask_vmd_ex (ctx, notify, request, &record, SBX_MSG_VM_CREATE,
                              SBX_MSG_SANDBOX_CREATE_OK, "start", origin, NULL);
        brk_sandbox_t stored;
        if (reply && brk_store_sandbox_find (ctx->store, id, &stored) == 0) {
            //  Could not even ask vmd: the sandbox failed before it began.
            s_move (ctx, &stored, SBX_SANDBOX_STATE_ERROR, NULL, "its vmd went away");
            brk_sandbox_clear (&stored);
        }
    }
    free (record.label);
    free (record.egress_allow);
    free (record.egress_deny);
    free (id);
    brk_account_clear (&owner);
    return reply;
}

void brk_origin_destroy (brk_origin_t **origin_p)
{
    brk_origin_t *origin = *origin_p;
    if (!origin)
        return;
    free (origin->sandbox_id);
    free (origin->dir);
    free (origin->qemu_version);
    free (origin->image);
    free (origin->snapshot_id);
    free (origin->vmd);
    free (origin);
    *origin_p = NULL;
}

sbx_msg_t *brk_sandbox_create (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    if (sbx_msg_sandbox_create (request)->snapshot_id || sbx_msg_sandbox_create (request)->template)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                  "a create from a snapshot is brk_snapshot_create's");
    s_notify_t notify = {.client = client};
    sbx_msg_t *reply = s_create (ctx, &notify, request, NULL);
    s_count ("create", reply); //  refused at once (the others are counted when vmd answers)
    return reply;
}

sbx_msg_t *brk_sandbox_create_from (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request,
                                    const brk_origin_t *origin)
{
    s_notify_t notify = {.client = client};
    sbx_msg_t *reply = s_create (ctx, &notify, request, origin);
    s_count ("create", reply);
    return reply;
}

sbx_msg_t *brk_sandbox_create_copy (brk_ctx_t *ctx, sbx_msg_t *request, const brk_origin_t *origin,
                                    brk_sandbox_done_fn *done, void *arg)
{
    assert (done);
    s_notify_t notify = {.done = done, .arg = arg};
    sbx_msg_t *reply = s_create (ctx, &notify, request, origin);
    s_count ("create", reply);
    return reply;
}

int brk_sandbox_room (brk_ctx_t *ctx, const char *vmd, uint64_t *room)
{
    bool any = false;
    *room = 0;
    s_pick_vmd (ctx, vmd, &any, room);
    return any ? 0 : -1;
}

sbx_msg_t *brk_sandbox_owner (brk_ctx_t *ctx, const sbx_msg_t *request, brk_account_t *owner)
{
    return s_owner (ctx, request, owner);
}

sbx_msg_t *brk_sandbox_refuse_create (const sbx_msg_t *request)
{
    return s_refuse_preset (request, S_EV_STOP, true);
}

//  Finds a sandbox the caller may see; sets *error otherwise.
static int s_find (brk_ctx_t *ctx, const sbx_msg_t *request, const char *id, brk_sandbox_t *record,
                   sbx_msg_t **error)
{
    if (!request->caller) {
        *error =
            sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED, "%s carries no caller identity",
                               sbx_msg_type_name (request->type));
        return -1;
    }
    int rc = brk_store_sandbox_find (ctx->store, id, record);
    if (rc == 0 && s_visible (request->caller, record) && strcmp (record->state, "deleted") != 0)
        return 0;
    if (rc == 0)
        brk_sandbox_clear (record);
    *error = rc < 0 ? sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "sandbox lookup failed")
                    : sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "Sandbox not found");
    return -1;
}

int brk_sandbox_find (brk_ctx_t *ctx, const sbx_msg_t *request, const char *id,
                      brk_sandbox_t *record, sbx_msg_t **error)
{
    return s_find (ctx, request, id, record, error);
}

sbx_msg_t *brk_sandbox_get (brk_ctx_t *ctx, sbx_msg_t *request)
{
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (s_find (ctx, request, sbx_msg_sandbox_get (request)->sandbox_id, &record, &reply))
        return reply;
    reply = s_reply (ctx, request->rid, SBX_MSG_SANDBOX_GET_OK, &record);
    brk_sandbox_clear (&record);
    return reply;
}

typedef struct {
    brk_ctx_t *ctx;
    const sbx_caller_t *caller;
    sbx_sandbox_info_list_t *list;
    size_t limit;                 //  a page's: one more is read to know there are more
    const brk_store_mark_t *mark; //  the store's, at the row given
    brk_store_mark_t last;        //  the last one in the page
    bool more;
} s_list_t;

static void s_list_one (const brk_sandbox_t *record, void *arg)
{
    s_list_t *list = arg;
    if (!s_visible (list->caller, record))
        return;
    if (list->limit && list->list->count == list->limit) {
        list->more = true;
        return;
    }
    sbx_sandbox_info_t *info = sbx_sandbox_info_list_append (list->list);
    if (info)
        s_info (list->ctx, record, info);
    if (list->mark)
        list->last = *list->mark;
}

#define S_PAGE_MAX 1000

//  A page's cursor: base64url of "p1.<created_ms>.<row>" of its last sandbox, opaque so
//  that clients pass it back as it came rather than build one. Not a secret: it only says
//  where in the caller's own list the next page starts. "p1" versions the form.
static char *s_cursor_make (const brk_store_mark_t *mark)
{
    char text[64];
    snprintf (text, sizeof text, "p1.%llu.%lld", (unsigned long long) mark->created_ms,
              (long long) mark->row);
    return sbx_secret_base64url ((const uint8_t *) text, strlen (text));
}

//  0 and *mark when text is a cursor s_cursor_make made (exactly: one text a position),
//  -1 otherwise.
static int s_cursor_parse (const char *text, brk_store_mark_t *mark)
{
    size_t size = 0;
    char *plain = (char *) sbx_secret_base64url_decode (text, &size);
    unsigned long long ms = 0;
    long long row = 0;
    int used = 0;
    bool ok = plain && strlen (plain) == size &&
              sscanf (plain, "p1.%llu.%lld%n", &ms, &row, &used) == 2 && !plain[used] && ms > 0 &&
              ms <= INT64_MAX && row >= 0;
    if (ok) {
        mark->created_ms = ms;
        mark->row = row;
        char *again = s_cursor_make (mark);
        ok = again && streq (again, text); //  no sign, leading zero or space accepted
        free (again);
    }
    free (plain);
    return ok ? 0 : -1;
}

sbx_msg_t *brk_sandbox_list (brk_ctx_t *ctx, sbx_msg_t *request)
{
    if (!request->caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "sandbox.list carries no caller identity");
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SANDBOX_LIST_OK);
    s_list_t list = {
        .ctx = ctx, .caller = request->caller, .list = &sbx_msg_sandbox_list_ok (reply)->sandboxes};
    const char *account = s_operator (request->caller) ? NULL : request->caller->account_id;
    if (!s_operator (request->caller) && !account)
        return reply; //  no account, no sandboxes
    //  An operator who names an account (by id or email) sees that account's only.
    brk_account_t owner = {0};
    if (s_operator (request->caller) && request->caller->account_id) {
        sbx_msg_t *refused = s_owner (ctx, request, &owner);
        if (refused) {
            sbx_msg_destroy (&reply);
            return refused;
        }
        account = owner.id;
    }
    sbx_sandbox_list_t *args = sbx_msg_sandbox_list (request);
    if (args->cursor && !*args->cursor)
        sbx_str_set (&args->cursor, NULL); //  empty is none, as a loop may send it: page one
    brk_store_mark_t mark = {0};
    int rc = 0;
    if (args->limit > S_PAGE_MAX || (args->cursor && s_cursor_parse (args->cursor, &mark))) {
        brk_account_clear (&owner);
        sbx_msg_destroy (&reply);
        return args->limit > S_PAGE_MAX
                   ? sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                        "limit must be between 1 and %d", S_PAGE_MAX)
                   //  Not echoed: it may be anything, and it says nothing useful.
                   : sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                        "cursor is not one this service gave: pass an "
                                        "answer's nextCursor as it came, or no cursor for "
                                        "the first page");
    }
    if (args->limit || args->cursor) {
        //  A CI key sees its own sandboxes only: filtered in the query, so pages are full.
        const char *key =
            !s_operator (request->caller) && request->caller->preset == SBX_KEY_PRESET_CI
                ? request->caller->key_id
                : NULL;
        list.limit = args->limit ? args->limit : INT32_MAX - 1;
        list.mark = &mark;
        rc = brk_store_sandbox_page (ctx->store, account, key, list.limit + 1, &mark, s_list_one,
                                     &list);
        if (rc >= 0 && list.more) {
            char *next = s_cursor_make (&list.last);
            if (next)
                sbx_str_set (&sbx_msg_sandbox_list_ok (reply)->next_cursor, next);
            else
                rc = -1;
            free (next);
        }
    } else
        rc = brk_store_sandbox_list (ctx->store, account, s_list_one, &list);
    brk_account_clear (&owner);
    if (rc < 0) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list sandboxes");
    }
    return reply;
}

//  A resume is a start: the owner's plan and wallet must allow it.
static sbx_msg_t *s_refuse_start (brk_ctx_t *ctx, const sbx_msg_t *request,
                                  const brk_sandbox_t *record)
{
    brk_account_t owner;
    int found = brk_store_account_find (ctx->store, record->account_id, &owner);
    if (found != 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "sandbox %s has no account",
                                  record->id);
    sbx_msg_t *refused = brk_limits_check_start (ctx, &owner, request->rid);
    brk_account_clear (&owner);
    return refused;
}

static sbx_msg_t *s_change (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request, s_event_t event,
                            sbx_msg_type_t reply_type, const char *verb);

sbx_msg_t *brk_sandbox_change (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    s_event_t event;
    sbx_msg_type_t reply_type;
    const char *verb;
    switch (request->type) {
    case SBX_MSG_SANDBOX_STOP:
        event = S_EV_STOP, reply_type = SBX_MSG_SANDBOX_STOP_OK, verb = "stop";
        break;
    case SBX_MSG_SANDBOX_RESUME:
        event = S_EV_RESUME, reply_type = SBX_MSG_SANDBOX_RESUME_OK, verb = "resume";
        break;
    default:
        event = S_EV_DELETE, reply_type = SBX_MSG_SANDBOX_DELETE_OK, verb = "delete";
        break;
    }
    sbx_msg_t *reply = s_change (ctx, client, request, event, reply_type, verb);
    s_count (verb, reply); //  answered at once: refused, or already there
    return reply;
}

static sbx_msg_t *s_change (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request, s_event_t event,
                            sbx_msg_type_t reply_type, const char *verb)
{
    const char *id =
        request->type == SBX_MSG_SANDBOX_STOP     ? sbx_msg_sandbox_stop (request)->sandbox_id
        : request->type == SBX_MSG_SANDBOX_RESUME ? sbx_msg_sandbox_resume (request)->sandbox_id
                                                  : sbx_msg_sandbox_delete (request)->sandbox_id;
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (s_find (ctx, request, id, &record, &reply))
        return reply;
    reply = s_refuse_preset (request, event, false);
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    const s_transition_t *t = reply ? NULL : s_lookup (state, event);
    if (reply)
        ;
    else if (state == SBX_SANDBOX_STATE_STOPPED && brk_sandbox_in_flight (ctx, record.id))
        //  Only a move (brk_move) has a stopped sandbox in flight.
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s is moving to another host (its host is being "
                                   "drained); try again in a moment",
                                   record.id);
    else if (!t && ((event == S_EV_STOP && state == SBX_SANDBOX_STATE_STOPPED) ||
                    (event == S_EV_RESUME && state == SBX_SANDBOX_STATE_READY)))
        reply = s_reply (ctx, request->rid, reply_type, &record); //  already there
    else if (!t)
        reply =
            sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                               "cannot %s sandbox %s: it is %s%s", verb, record.id, record.state,
                               state == SBX_SANDBOX_STATE_STOPPED ? " (resume it first)"
                               : state == SBX_SANDBOX_STATE_ERROR ? " (only delete works now)"
                                                                  : " (try again in a moment)");
    else if (event == S_EV_RESUME && (reply = s_refuse_start (ctx, request, &record)))
        ;
    else if (event == S_EV_DELETE && brk_sandbox_is_lost (&record) &&
             !brk_registry_find (ctx->registry, SBX_ROLE_VMD, record.vmd)) {
        //  Its host is gone: nothing to ask. Should it come back, its vmd is told to
        //  delete the guest then (brk_hostloss).
        if (s_move (ctx, &record, SBX_SANDBOX_STATE_DELETED, NULL,
                    "deleted while its host was lost") == 0)
            reply = s_reply (ctx, request->rid, reply_type, &record);
        else
            reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                       "cannot record the delete of sandbox %s", record.id);
    } else {
        s_ahead_t ahead = {.to = t->to};
        reply = s_ask_vmd (ctx, client, request, &record, t->ask, reply_type, verb, &ahead);
    }
    brk_sandbox_clear (&record);
    return reply;
}

sbx_msg_t *brk_sandbox_wake (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request, bool trusted)
{
    sbx_sandbox_wake_t *args = sbx_msg_sandbox_wake (request);
    if (!trusted)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "sandbox.wake is for gateways (their port proxy)");
    brk_sandbox_t record;
    int rc = brk_store_sandbox_find (ctx->store, args->sandbox_id, &record);
    if (rc != 0)
        return sbx_msg_new_error (request->rid, rc < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                  "no sandbox %s", args->sandbox_id);
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    //  Only a published port wakes it: the proxy asks for the port it resolved.
    brk_port_t port;
    sbx_msg_t *reply = NULL;
    rc = brk_store_port_find (ctx->store, record.id, args->port, &port);
    if (rc == 0)
        brk_port_clear (&port);
    else
        reply = sbx_msg_new_error (request->rid, rc < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                   "port %llu of sandbox %s is not published",
                                   (unsigned long long) args->port, record.id);
    const s_transition_t *t = s_lookup (state, S_EV_RESUME);
    if (reply)
        ;
    else if (record.no_auto_resume)
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                   "sandbox %s has autoResume off: resume it (resume_sandbox), or "
                                   "switch autoResume on",
                                   record.id);
    else if (state == SBX_SANDBOX_STATE_READY)
        reply = s_reply (ctx, request->rid, SBX_MSG_SANDBOX_WAKE_OK, &record);
    else if (state == SBX_SANDBOX_STATE_STOPPED && brk_sandbox_in_flight (ctx, record.id))
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s is moving to another host; try again in a moment",
                                   record.id);
    else if (!t)
        reply = sbx_msg_new_error (
            request->rid, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s", record.id, record.state,
            state == SBX_SANDBOX_STATE_STOPPING || state == SBX_SANDBOX_STATE_RESUMING
                ? " (try again in a moment)"
                : "");
    else if ((reply = s_refuse_start (ctx, request, &record)))
        s_count ("resume", reply); //  the owner's plan or wallet says no
    else {
        char why[96];
        snprintf (why, sizeof why, "woken by a request to port %llu",
                  (unsigned long long) args->port);
        s_ahead_t ahead = {.to = t->to, .reason = why};
        reply = s_ask_vmd (ctx, client, request, &record, t->ask, SBX_MSG_SANDBOX_WAKE_OK, "resume",
                           &ahead);
        if (!reply)
            sbx_info ("rid=%llu sandbox=%s account=%s %s: resuming",
                      (unsigned long long) request->rid, record.id, record.account_id, why);
    }
    brk_sandbox_clear (&record);
    return reply;
}

//  sbx.updated carries the sandbox's name, labels and deadline as they are now.
static sbx_msg_t *s_updated_event (brk_ctx_t *ctx, const brk_sandbox_t *record)
{
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_SANDBOX_UPDATED);
    sbx_sandbox_updated_t *body = sbx_msg_sandbox_updated (event);
    sbx_str_set (&body->sandbox_id, record->id);
    sbx_str_set (&body->name, record->name);
    brk_store_sandbox_labels (ctx->store, record->id, s_add_label, &body->labels);
    body->expires_ms = record->expires_ms;
    body->ttl_s = record->ttl_s;
    return event;
}

//  Ends the open transaction of an extend or update with its event; answers.
static sbx_msg_t *s_commit_update (brk_ctx_t *ctx, sbx_msg_t *request, brk_sandbox_t *record,
                                   sbx_msg_type_t reply_type, int rc)
{
    if (rc == 0) {
        //  The event is made inside the transaction so it sees the new labels.
        sbx_msg_t *event = s_updated_event (ctx, record);
        rc = brk_events_add (ctx->events, &event, record->account_id, record->id);
    }
    if (rc || brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot update sandbox %s",
                                  record->id);
    }
    sbx_info ("rid=%llu sandbox=%s updated", (unsigned long long) request->rid, record->id);
    return s_reply (ctx, request->rid, reply_type, record);
}

sbx_msg_t *brk_sandbox_extend (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_sandbox_extend_t *args = sbx_msg_sandbox_extend (request);
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (s_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply;
    if (request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot extend sandboxes");
    else if (args->ttl_s == 0 || args->ttl_s > 10ULL * 365 * 86400)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                   "ttl_s is 1 second to ten years from now");
    else {
        //  The plan bounds an extension as it bounds a create.
        brk_account_t owner;
        uint64_t ttl_s = args->ttl_s;
        if (brk_store_account_find (ctx->store, record.account_id, &owner) == 0) {
            reply = brk_limits_ttl (ctx, &owner, request->rid, &ttl_s, true);
            brk_account_clear (&owner);
        }
    }
    if (!reply) {
        record.ttl_s = args->ttl_s;
        record.expires_ms = sbx_clock_now_ms () + args->ttl_s * 1000;
        int rc = brk_events_begin (ctx->events) ||
                         brk_store_sandbox_set_expiry (ctx->store, record.id, record.expires_ms,
                                                       record.ttl_s)
                     ? -1
                     : 0;
        reply = s_commit_update (ctx, request, &record, SBX_MSG_SANDBOX_EXTEND_OK, rc);
    }
    brk_sandbox_clear (&record);
    return reply;
}

//  The store's part of an update, in one transaction with its event; the answer.
static sbx_msg_t *s_update_apply (brk_ctx_t *ctx, sbx_msg_t *request, brk_sandbox_t *record)
{
    sbx_sandbox_update_t *args = sbx_msg_sandbox_update (request);
    sbx_msg_t *reply = NULL;
    int rc = brk_events_begin (ctx->events) ? -1 : 0;
    if (rc == 0 && args->name) {
        rc = brk_store_sandbox_set_name (ctx->store, record->id, args->name);
        free (record->name);
        record->name = strdup (args->name);
    }
    if (rc == 0 && args->auto_resume) {
        record->no_auto_resume = args->auto_resume == SBX_TOGGLE_OFF;
        rc = brk_store_sandbox_set_auto_resume (ctx->store, record->id, !record->no_auto_resume);
    }
    if (rc == 0 && args->egress_set) {
        free (record->egress_allow);
        free (record->egress_deny);
        record->egress_allow = brk_egress_join (&args->egress_allow);
        record->egress_deny = brk_egress_join (&args->egress_deny);
        rc = brk_store_sandbox_set_egress (ctx->store, record->id, record->egress_allow,
                                           record->egress_deny);
    }
    for (size_t i = 0; rc == 0 && i < args->remove_labels.count; i++)
        rc = brk_store_sandbox_label_set (ctx->store, record->id, args->remove_labels.items[i],
                                          NULL);
    for (size_t i = 0; rc == 0 && i < args->labels.count; i++)
        rc = brk_store_sandbox_label_set (ctx->store, record->id, args->labels.keys[i],
                                          args->labels.values[i]);
    uint64_t count = 0;
    if (rc == 0 &&
        brk_store_sandbox_labels (ctx->store, record->id, s_count_label, &count) > S_MAX_LABELS)
        rc = 1;
    if (rc == 1) {
        brk_events_rollback (ctx->events);
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "at most %d labels",
                                   S_MAX_LABELS);
    } else
        reply = s_commit_update (ctx, request, record, SBX_MSG_SANDBOX_UPDATE_OK, rc);
    return reply;
}

//  An update with new egress rules for a running guest, waiting for its vmd.
typedef struct {
    zframe_t *client;
    sbx_msg_t *request;
} s_egress_op_t;

static void s_on_egress_answer (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_egress_op_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    const char *id = sbx_msg_sandbox_update (op->request)->sandbox_id;
    sbx_msg_t *reply = NULL;
    brk_sandbox_t record;
    if (answer->type == SBX_MSG_ERROR) //  the rules in force are still the old ones
        reply = sbx_msg_new_error (op->request->rid, sbx_msg_error (answer)->code,
                                   "sandbox %s kept its egress rules: %s", id,
                                   sbx_msg_error (answer)->message);
    else if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        reply = sbx_msg_new_error (op->request->rid, SBX_E_INTERNAL,
                                   "sandbox %s vanished from the store", id);
    else {
        reply = s_update_apply (ctx, op->request, &record);
        if (reply && reply->type != SBX_MSG_ERROR)
            sbx_info ("rid=%llu sandbox=%s egress rules replaced (%zu allowed, %zu denied)",
                      (unsigned long long) op->request->rid, id,
                      sbx_msg_sandbox_update (op->request)->egress_allow.count,
                      sbx_msg_sandbox_update (op->request)->egress_deny.count);
        brk_sandbox_clear (&record);
    }
    ctx->send (ctx, op->client, &reply);
    zframe_destroy (&op->client);
    sbx_msg_destroy (&op->request);
    free (op);
}

//  Asks the guest's vmd to load the new rules; NULL when asked (the answer follows).
static sbx_msg_t *s_ask_egress (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request,
                                const brk_sandbox_t *record)
{
    sbx_sandbox_update_t *args = sbx_msg_sandbox_update (request);
    s_egress_op_t *op = calloc (1, sizeof *op);
    sbx_msg_t *vm = sbx_msg_new (SBX_MSG_VM_EGRESS);
    if (op) {
        op->client = zframe_dup (client);
        op->request = sbx_msg_dup (request);
    }
    sbx_vm_egress_t *body = vm ? sbx_msg_vm_egress (vm) : NULL;
    if (!op || !op->client || !op->request || !body ||
        sbx_str_set (&body->sandbox_id, record->id) ||
        brk_egress_copy (&args->egress_allow, &body->egress_allow) ||
        brk_egress_copy (&args->egress_deny, &body->egress_deny)) {
        sbx_msg_destroy (&vm);
        if (op) {
            zframe_destroy (&op->client);
            sbx_msg_destroy (&op->request);
        }
        free (op);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    uint32_t timeout = request->timeout_ms > 1000 ? request->timeout_ms - 500 : S_VM_TIMEOUT_MS;
    if (ctx->call (ctx, SBX_ROLE_VMD, record->vmd, &vm, timeout, s_on_egress_answer, op) == 0)
        return NULL;
    zframe_destroy (&op->client);
    sbx_msg_destroy (&op->request);
    free (op);
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "sandbox %s is on vmd %s, which is not connected; retry when it is "
                              "back",
                              record->id, record->vmd ? record->vmd : "(none)");
}

sbx_msg_t *brk_sandbox_update (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_update_t *args = sbx_msg_sandbox_update (request);
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (s_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply;
    if (request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot change sandboxes");
    if (!reply)
        reply = s_check_text (request, args->name, &args->labels);
    if (!reply && args->name && !*args->name)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "name is empty");
    if (!reply && !args->egress_set && (args->egress_allow.count || args->egress_deny.count))
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                   "egress lists without egress_set change nothing");
    if (!reply && args->egress_set)
        reply = brk_egress_check (request, &args->egress_allow, &args->egress_deny);
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    if (!reply && args->egress_set && state == SBX_SANDBOX_STATE_READY && client) {
        //  The firewall first: the record says what is in force.
        reply = s_ask_egress (ctx, client, request, &record);
        brk_sandbox_clear (&record);
        return reply;
    }
    if (!reply && args->egress_set && state != SBX_SANDBOX_STATE_STOPPED)
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                   "sandbox %s is %s: its egress rules change when it is ready "
                                   "or stopped; try again then",
                                   record.id, record.state);
    //  Stopped: the record alone; the next vm.resume carries the rules.
    if (!reply)
        reply = s_update_apply (ctx, request, &record);
    brk_sandbox_clear (&record);
    return reply;
}

//  Stops a ready sandbox on the broker's own account (memory kept), with `reason`; for a
//  TTL, the ttl.expired event (deadline, and the time the stop began) goes into the
//  transaction that moves it. A sandbox whose vmd is away is tried again next tick.
static void s_system_stop (brk_ctx_t *ctx, const char *id, const char *reason, bool ttl)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        return;
    uint64_t now = sbx_clock_now_ms ();
    uint64_t late = ttl && now > record.expires_ms ? now - record.expires_ms : 0;
    sbx_msg_t *expired = NULL;
    if (ttl) {
        expired = sbx_msg_new (SBX_MSG_TTL_EXPIRED);
        sbx_str_set (&sbx_msg_ttl_expired (expired)->sandbox_id, record.id);
        sbx_msg_ttl_expired (expired)->deadline_ms = record.expires_ms;
        sbx_msg_ttl_expired (expired)->actual_ms = now;
    }
    sbx_msg_t none = {.type = SBX_MSG_SANDBOX_STOP, .timeout_ms = 0};
    s_ahead_t ahead = {.to = SBX_SANDBOX_STATE_STOPPING, .reason = reason, .extra = &expired};
    sbx_msg_t *refused = s_ask_vmd (ctx, NULL, &none, &record, SBX_MSG_VM_STOP,
                                    SBX_MSG_SANDBOX_STOP_OK, "stop", &ahead);
    if (refused)
        sbx_debug ("sandbox=%s %s but it cannot be stopped now: %s", record.id, reason,
                   sbx_msg_error (refused)->message);
    else
        sbx_info ("sandbox=%s account=%s %s (%llu ms after its deadline): stopping", record.id,
                  record.account_id, reason, (unsigned long long) late);
    sbx_msg_destroy (&expired);
    sbx_msg_destroy (&refused);
    brk_sandbox_clear (&record);
}

int brk_sandbox_discard (brk_ctx_t *ctx, const char *id, const char *reason)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        return -1;
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    const s_transition_t *t = s_lookup (state, S_EV_DELETE);
    sbx_msg_t none = {.type = SBX_MSG_SANDBOX_DELETE, .timeout_ms = 0};
    s_ahead_t ahead = {.to = t ? t->to : SBX_SANDBOX_STATE__UNSET, .reason = reason};
    sbx_msg_t *refused = t ? s_ask_vmd (ctx, NULL, &none, &record, t->ask,
                                        SBX_MSG_SANDBOX_DELETE_OK, "delete", &ahead)
                           : NULL;
    int rc = t && !refused ? 0 : -1;
    if (rc)
        sbx_warn ("sandbox=%s (%s) is %s and cannot be deleted now%s%s", record.id, reason,
                  record.state, refused ? ": " : "",
                  refused ? sbx_msg_error (refused)->message : "");
    else
        sbx_info ("sandbox=%s account=%s %s: deleting", record.id, record.account_id, reason);
    sbx_msg_destroy (&refused);
    brk_sandbox_clear (&record);
    return rc;
}

static void s_expire (const brk_sandbox_t *found, void *arg)
{
    s_system_stop (arg, found->id, "TTL expired", true);
}

static void s_unfunded (const brk_sandbox_t *found, void *arg)
{
    s_system_stop (arg, found->id, "wallet empty", false);
}

static void s_disabled (const brk_sandbox_t *found, void *arg)
{
    s_system_stop (arg, found->id, "account disabled", false);
}

void brk_sandbox_tick (brk_ctx_t *ctx)
{
    brk_store_sandbox_expired (ctx->store, sbx_clock_now_ms (), 100, s_expire, ctx);
    brk_store_sandbox_unfunded (ctx->store, 100, s_unfunded, ctx);
    brk_store_sandbox_disabled (ctx->store, 100, s_disabled, ctx);
}

//  The agent requests users may send, and whether a read-only key may.
static bool s_agent_allowed (sbx_msg_type_t type, bool *read_only)
{
    *read_only =
        type == SBX_MSG_AGENT_STATUS || type == SBX_MSG_AGENT_PS || type == SBX_MSG_AGENT_FILE_READ;
    //  Typing into a terminal and resizing it act on the guest: not for read-only keys.
    return *read_only || type == SBX_MSG_AGENT_EXEC || type == SBX_MSG_AGENT_KILL ||
           type == SBX_MSG_AGENT_INPUT || type == SBX_MSG_AGENT_RESIZE ||
           type == SBX_MSG_AGENT_FILE_WRITE;
}

typedef struct {
    zframe_t *client;
    uint64_t rid;
    char request[32]; //  "exec", "file_read"…: sbx_agent_seconds's label
    uint64_t asked_mono;
} s_relay_t;

static void s_on_agent_answer (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_relay_t *relay = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *reply;
    if (answer->type == SBX_MSG_VM_AGENT_OK) {
        reply = sbx_msg_new (SBX_MSG_SANDBOX_AGENT_OK);
        reply->rid = relay->rid;
        sbx_bytes_t *inner = &sbx_msg_vm_agent_ok (answer)->reply;
        sbx_bytes_t *out = &sbx_msg_sandbox_agent_ok (reply)->reply;
        //  Hand the bytes over rather than copy megabytes of output.
        *out = *inner;
        inner->data = NULL;
        inner->size = 0;
    } else {
        reply = answer; //  the error, as vmd (or the broker's deadline) said it
        *answer_p = NULL;
        reply->rid = relay->rid;
    }
    sbx_metrics_observe (sbx_metrics_here (), SBX_METRIC_AGENT_SECONDS,
                         (double) (sbx_clock_mono_ms () - relay->asked_mono) / 1000.0,
                         relay->request);
    ctx->send (ctx, relay->client, &reply);
    zframe_destroy (&relay->client);
    free (relay);
}

sbx_msg_t *brk_sandbox_agent (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_agent_t *args = sbx_msg_sandbox_agent (request);
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (s_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply;
    sbx_err_t err;
    //  Its type is all the broker needs: the body (a file chunk: 1 MiB) goes on as it
    //  came, and vmd and the agent decode and check it.
    sbx_msg_type_t inner = SBX_MSG__UNKNOWN;
    bool known = sbx_msg_peek_type (args->request.data, args->request.size, &inner, &err) == 0;
    bool read_only = false;
    const char *kind = known ? sbx_msg_type_name (inner) : "";
    char request_name[32];
    snprintf (request_name, sizeof request_name, "%s",
              strncmp (kind, "agent.", 6) == 0 ? kind + 6 : kind);
    if (!known)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                   "the agent request does not decode: %s", err.message);
    else if (!s_agent_allowed (inner, &read_only))
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                   "%s is not an agent request users may send",
                                   sbx_msg_type_name (inner));
    else if (!read_only && request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot run %s",
                                   sbx_msg_type_name (inner));
    else if (strcmp (record.state, "ready") != 0)
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION, "sandbox %s is %s%s",
                                   record.id, record.state,
                                   streq (record.state, "stopped") ? "; resume it first" : "");
    if (reply) {
        brk_sandbox_clear (&record);
        return reply;
    }
    s_relay_t *relay = calloc (1, sizeof *relay);
    sbx_msg_t *vm = sbx_msg_new (SBX_MSG_VM_AGENT);
    sbx_str_set (&sbx_msg_vm_agent (vm)->sandbox_id, record.id);
    sbx_bytes_t *bytes = &sbx_msg_vm_agent (vm)->request;
    *bytes = args->request; //  moved, not copied
    args->request.data = NULL;
    args->request.size = 0;
    relay->client = zframe_dup (client);
    relay->rid = request->rid;
    snprintf (relay->request, sizeof relay->request, "%s", request_name);
    relay->asked_mono = sbx_clock_mono_ms ();
    uint32_t timeout = request->timeout_ms ? request->timeout_ms : 0;
    if (ctx->call (ctx, SBX_ROLE_VMD, record.vmd, &vm, timeout, s_on_agent_answer, relay)) {
        zframe_destroy (&relay->client);
        free (relay);
        reply = sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                   "sandbox %s is on vmd %s, which is not connected; retry when "
                                   "it is back",
                                   record.id, record.vmd ? record.vmd : "(none)");
    }
    brk_sandbox_clear (&record);
    return reply;
}

bool brk_sandbox_in_flight (brk_ctx_t *ctx, const char *id)
{
    return ctx->in_flight && zhashx_lookup (ctx->in_flight, id);
}

//  What a transient state asks of vmd, and its answer's type and verb.
static bool s_asks (sbx_sandbox_state_t state, sbx_msg_type_t *ask, sbx_msg_type_t *reply,
                    const char **verb)
{
    switch (state) {
    case SBX_SANDBOX_STATE_STOPPING:
        *ask = SBX_MSG_VM_STOP, *reply = SBX_MSG_SANDBOX_STOP_OK, *verb = "stop";
        return true;
    case SBX_SANDBOX_STATE_RESUMING:
        *ask = SBX_MSG_VM_RESUME, *reply = SBX_MSG_SANDBOX_RESUME_OK, *verb = "resume";
        return true;
    case SBX_SANDBOX_STATE_DELETING:
        *ask = SBX_MSG_VM_DELETE, *reply = SBX_MSG_SANDBOX_DELETE_OK, *verb = "delete";
        return true;
    default:
        return false;
    }
}

int brk_sandbox_settle (brk_ctx_t *ctx, const char *id, const char *vmd, bool found,
                        sbx_sandbox_state_t guest, const char *guest_reason)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        return -1;
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    int rc = 0;
    //  Still someone else's business (an op of this broker), or moved on meanwhile.
    if (brk_sandbox_in_flight (ctx, id) || !record.vmd || !streq (record.vmd, vmd) ||
        !s_moving (state)) {
        brk_sandbox_clear (&record);
        return 0;
    }
    //  Where the request that a broker before this one made would have taken it.
    sbx_sandbox_state_t done = state == SBX_SANDBOX_STATE_CREATING   ? SBX_SANDBOX_STATE_READY
                               : state == SBX_SANDBOX_STATE_STOPPING ? SBX_SANDBOX_STATE_STOPPED
                               : state == SBX_SANDBOX_STATE_RESUMING ? SBX_SANDBOX_STATE_READY
                                                                     : SBX_SANDBOX_STATE_DELETED;
    bool moving_guest = found && s_moving (guest);
    if (moving_guest)
        rc = 1; //  vmd is at it still: asked again later
    else if ((!found && done == SBX_SANDBOX_STATE_DELETED) || (found && guest == done)) {
        //  vmd did it: the record follows, as its answer would have made it.
        uint64_t expires =
            done == SBX_SANDBOX_STATE_READY && state == SBX_SANDBOX_STATE_RESUMING && record.ttl_s
                ? sbx_clock_now_ms () + record.ttl_s * 1000
                : 0;
        rc = s_move_ex (ctx, &record, done, NULL, NULL, expires, NULL);
        if (rc == 0)
            sbx_info ("sandbox=%s settled as vmd %s has it: %s (its request was cut by a "
                      "restart of the broker or of the vmd)",
                      id, vmd, record.state);
    } else if (found && guest == SBX_SANDBOX_STATE_ERROR)
        rc = s_move (ctx, &record, SBX_SANDBOX_STATE_ERROR, NULL, guest_reason);
    else if (!found)
        rc = s_move (ctx, &record, SBX_SANDBOX_STATE_ERROR, NULL,
                     "its guest is not on its vmd: the request that made or moved it was cut by "
                     "a restart of the control plane or of the vmd; delete it");
    else {
        //  vmd never got it, or was in the middle: the request goes again, for nobody to
        //  answer (the user's answer went with the broker before).
        sbx_msg_type_t ask, reply;
        const char *verb;
        if (s_asks (state, &ask, &reply, &verb)) {
            sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
            sbx_msg_t *refused = s_ask_vmd (ctx, NULL, request, &record, ask, reply, verb, NULL);
            sbx_info ("sandbox=%s %s asked of vmd %s again (its request was cut by a restart "
                      "of the broker or of the vmd)%s",
                      id, verb, vmd, refused ? ": not sent now" : "");
            rc = refused ? -1 : 0;
            sbx_msg_destroy (&refused);
            sbx_msg_destroy (&request);
        } else
            //  Created, yet the guest is not ready, nor on its way: it cannot be.
            rc = s_move (ctx, &record, SBX_SANDBOX_STATE_ERROR, NULL,
                         "its create was cut by a restart of the control plane or of the vmd; "
                         "delete it");
    }
    brk_sandbox_clear (&record);
    return rc;
}

bool brk_sandbox_is_lost (const brk_sandbox_t *record)
{
    return record->state && streq (record->state, "error") && record->reason &&
           strncmp (record->reason, BRK_HOST_LOST, strlen (BRK_HOST_LOST)) == 0;
}

int brk_sandbox_host_lost (brk_ctx_t *ctx, const char *id, const char *vmd, uint64_t at_ms,
                           const char *reason)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        return -1;
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    const s_transition_t *t = s_lookup (state, S_EV_HOST_LOST);
    int rc = 0;
    //  Moved on meanwhile, or on another vmd now: not this host's any more.
    if (t && record.vmd && streq (record.vmd, vmd) && !brk_sandbox_in_flight (ctx, id))
        rc = s_move_at (ctx, &record, t->to, NULL, reason, 0, NULL, at_ms);
    brk_sandbox_clear (&record);
    return rc;
}

int brk_sandbox_host_back (brk_ctx_t *ctx, const char *id, const char *vmd, bool found,
                           sbx_sandbox_state_t guest)
{
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, id, &record) != 0)
        return -1;
    int rc = 0;
    if (!brk_sandbox_is_lost (&record) || !record.vmd || !streq (record.vmd, vmd))
        ;
    else if (found && (guest == SBX_SANDBOX_STATE_READY || guest == SBX_SANDBOX_STATE_STOPPED)) {
        const s_transition_t *t =
            s_lookup (SBX_SANDBOX_STATE_ERROR,
                      guest == SBX_SANDBOX_STATE_READY ? S_EV_HOST_BACK : S_EV_HOST_BACK_STOPPED);
        rc = t ? s_move (ctx, &record, t->to, NULL, NULL) : -1;
        if (rc == 0)
            sbx_info ("sandbox=%s back with its host: vmd %s has it %s", id, vmd, record.state);
    } else
        rc = s_move (ctx, &record, SBX_SANDBOX_STATE_ERROR, NULL,
                     found ? "its host came back, but its guest had failed there; delete it"
                           : "its host came back without its guest; delete it");
    brk_sandbox_clear (&record);
    return rc;
}

void brk_sandbox_vm_failed (brk_ctx_t *ctx, const char *vmd, sbx_msg_t *msg)
{
    sbx_vm_failed_t *failed = sbx_msg_vm_failed (msg);
    brk_sandbox_t record;
    if (brk_store_sandbox_find (ctx->store, failed->sandbox_id, &record) != 0) {
        sbx_warn ("vmd %s reports unknown sandbox %s failed: %s", vmd, failed->sandbox_id,
                  failed->reason);
        return;
    }
    sbx_sandbox_state_t state = SBX_SANDBOX_STATE__UNSET;
    sbx_sandbox_state_from_name (record.state, &state);
    const s_transition_t *t = s_lookup (state, S_EV_VM_FAILED);
    if (!record.vmd || strcmp (record.vmd, vmd) != 0)
        sbx_warn ("sandbox=%s vmd %s reports it failed, but it lives on %s", record.id, vmd,
                  record.vmd ? record.vmd : "no vmd");
    else if (t && state != SBX_SANDBOX_STATE_DELETING)
        s_move (ctx, &record, t->to, NULL, failed->reason);
    brk_sandbox_clear (&record);
}

//  --------------------------------------------------------------------------
//  Self test: a real broker; vmd played at the protocol level by sbx_peer workers
//  whose answers the test scripts, so every transition and failure path shows.

#include "brk_server.h"
#include "brk_testkit.h"
#include "brk_store_priv.h"

//  How the test vmd answers: 0 ok, 1 an error, 2 not at all. Read in its thread.
static int s_vmd_mode = 0;
//  The egress lists of the last vm.create, vm.resume or vm.egress the test vmd got.
static char s_vmd_egress[512];
static int s_vmd_stops; //  vm.stop requests the test vmd got
//  The one guest a vm.list of the test vmd names (none while the id is empty).
static char s_vmd_guest[32];
static sbx_sandbox_state_t s_vmd_guest_state;

static void s_test_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    int mode = __atomic_load_n (&s_vmd_mode, __ATOMIC_SEQ_CST);
    sbx_strlist_t *allow = NULL, *deny = NULL;
    if (request->type == SBX_MSG_VM_CREATE)
        allow = &sbx_msg_vm_create (request)->egress_allow,
        deny = &sbx_msg_vm_create (request)->egress_deny;
    else if (request->type == SBX_MSG_VM_RESUME)
        allow = &sbx_msg_vm_resume (request)->egress_allow,
        deny = &sbx_msg_vm_resume (request)->egress_deny;
    else if (request->type == SBX_MSG_VM_EGRESS)
        allow = &sbx_msg_vm_egress (request)->egress_allow,
        deny = &sbx_msg_vm_egress (request)->egress_deny;
    if (allow) {
        //  What the guest was told, read by the test after the answer it waits for.
        char *a = brk_egress_join (allow), *d = brk_egress_join (deny);
        snprintf (s_vmd_egress, sizeof s_vmd_egress, "%s %s|%s", sbx_msg_type_name (request->type),
                  a ? a : "", d ? d : "");
        free (a);
        free (d);
    }
    if (request->type == SBX_MSG_VM_AGENT) {
        //  Play the agent: an exec answers with its command as stdout.
        sbx_bytes_t *bytes = &sbx_msg_vm_agent (request)->request;
        sbx_err_t err;
        sbx_msg_t *inner = sbx_msg_decode (bytes->data, bytes->size, &err);
        assert (inner && inner->type == SBX_MSG_AGENT_EXEC);
        sbx_msg_t *answer = sbx_msg_new_reply (inner, SBX_MSG_AGENT_EXEC_OK);
        sbx_msg_agent_exec_ok (answer)->pid = 42;
        const char *command = sbx_msg_agent_exec (inner)->command;
        sbx_bytes_set (&sbx_msg_agent_exec_ok (answer)->stdout, command, strlen (command));
        sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_AGENT_OK);
        uint8_t *data;
        size_t size;
        assert (sbx_msg_encode (answer, &data, &size, &err) == 0);
        sbx_msg_vm_agent_ok (reply)->reply.data = data;
        sbx_msg_vm_agent_ok (reply)->reply.size = size;
        sbx_msg_destroy (&answer);
        sbx_msg_destroy (&inner);
        sbx_peer_send (peer, &reply);
        return;
    }
    assert (request->caller && request->caller->kind == SBX_CALLER_KIND_SYSTEM);
    if (request->type == SBX_MSG_VM_LIST) {
        sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_LIST_OK);
        if (*s_vmd_guest) {
            sbx_vm_info_t *guest = sbx_vm_info_list_append (&sbx_msg_vm_list_ok (reply)->vms);
            assert (guest);
            sbx_str_set (&guest->sandbox_id, s_vmd_guest);
            guest->state = s_vmd_guest_state;
        }
        sbx_peer_send (peer, &reply);
        return;
    }
    if (request->type == SBX_MSG_VM_STOP)
        __atomic_add_fetch (&s_vmd_stops, 1, __ATOMIC_SEQ_CST);
    if (mode == 2)
        return;
    sbx_msg_t *reply = mode == 1
                           ? sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "migration failed")
                           : brk_testkit_vm_ok (request);
    assert (reply);
    sbx_peer_send (peer, &reply);
}

static uint64_t s_rid = 1000;

static sbx_msg_t *s_test_ask (zsock_t *client, sbx_msg_type_t type, const char *id,
                              sbx_caller_t *caller)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = caller;
    sbx_msg_set_subject (request, id);
    return brk_testkit_call (client, request, ++s_rid);
}

//  The sandbox a sandbox.*.ok carries.
static sbx_sandbox_info_t *s_sandbox (sbx_msg_t *reply)
{
    sbx_sandbox_info_t **slot = sbx_msg_sandbox_slot (reply);
    return slot ? *slot : NULL;
}

static sbx_msg_t *s_test_create (zsock_t *client, sbx_caller_t *caller, const char *name,
                                 uint32_t timeout_ms)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = caller;
    request->timeout_ms = timeout_ms;
    sbx_str_set (&sbx_msg_sandbox_create (request)->name, name);
    sbx_strmap_set (&sbx_msg_sandbox_create (request)->labels, "team", "red");
    return brk_testkit_call (client, request, ++s_rid);
}

void brk_sandbox_test (bool verbose)
{
    char dir[] = "/tmp/brk_sandbox_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    zactor_t *server = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (server);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    char *alice = brk_testkit_account (client, "alice@example.com", ++s_rid);
    char *bob = brk_testkit_account (client, "bob@example.com", ++s_rid);
#define ALICE brk_testkit_caller (alice, "key_alice", SBX_KEY_PRESET_FULL)

    //  No vmd: unavailable, said plainly.
    sbx_msg_t *reply = s_test_create (client, ALICE, NULL, 0);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    assert (strstr (sbx_msg_error (reply)->message, "no vmd is connected"));
    sbx_msg_destroy (&reply);

    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 2, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);

    //  Names and labels with control characters are the caller's error, said plainly.
    reply = s_test_create (client, ALICE, "tab\there", 0);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    sbx_msg_t *bad = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    bad->caller = ALICE;
    sbx_strmap_set (&sbx_msg_sandbox_create (bad)->labels, "team\n", "red");
    reply = brk_testkit_call (client, bad, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    assert (strstr (sbx_msg_error (reply)->message, "control characters"));
    sbx_msg_destroy (&reply);
    bad = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    bad->caller = ALICE;
    sbx_strmap_set (&sbx_msg_sandbox_create (bad)->labels, "team", "r\x1b[2Jed");
    reply = brk_testkit_call (client, bad, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);

    //  Create: ready, on host-a, with a readable label and the labels asked for.
    reply = s_test_create (client, ALICE, "demo", 0);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    sbx_sandbox_info_t *info = s_sandbox (reply);
    assert (info->state == SBX_SANDBOX_STATE_READY && info->type == SBX_SANDBOX_TYPE_SMALL);
    assert (strncmp (info->id, "sb_", 3) == 0 && strlen (info->id) == 13);
    assert (brk_names_dns_safe (info->label) && streq (info->name, "demo"));
    assert (streq (info->vmd, "host-a") && streq (info->account, alice));
    assert (streq (sbx_strmap_get (&info->labels, "team"), "red"));
    char *one = strdup (info->id);
    sbx_msg_destroy (&reply);
    if (verbose)
        printf ("created %s\n", one);

    //  Visibility: bob doesn't see it, a ci key sees only what it created.
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one, ALICE);
    assert (reply->type == SBX_MSG_SANDBOX_GET_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one,
                        brk_testkit_caller (bob, "key_bob", SBX_KEY_PRESET_FULL));
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    assert (streq (sbx_msg_error (reply)->message, "Sandbox not found"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one,
                        brk_testkit_caller (alice, "key_other", SBX_KEY_PRESET_CI));
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one,
                        brk_testkit_caller (alice, "key_alice", SBX_KEY_PRESET_CI));
    assert (reply->type == SBX_MSG_SANDBOX_GET_OK);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_LIST, NULL,
                        brk_testkit_caller (bob, "key_bob", SBX_KEY_PRESET_FULL));
    assert (sbx_msg_sandbox_list_ok (reply)->sandboxes.count == 0);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_LIST, NULL, ALICE);
    assert (sbx_msg_sandbox_list_ok (reply)->sandboxes.count == 1);
    sbx_msg_destroy (&reply);
    //  Pages: one of one has no next cursor; a cursor this service did not make, or a
    //  limit above 1000, is the caller's error.
    sbx_msg_t *page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    page->caller = ALICE;
    sbx_msg_sandbox_list (page)->limit = 1;
    reply = brk_testkit_call (client, page, ++s_rid);
    assert (sbx_msg_sandbox_list_ok (reply)->sandboxes.count == 1);
    assert (!sbx_msg_sandbox_list_ok (reply)->next_cursor);
    sbx_msg_destroy (&reply);
    //  Opaque: base64url of what only the broker reads, each position one way only.
    const char *plains[] = {"p1.x.1",  "p1.5",    "p2.5.1",  "p1.5.1 ",  "p1.0.1",  "p1.5.-1",
                            "p1.05.1", "p1.+5.1", "p1.5.01", "p1.5.1\n", "p1.5.1.2"};
    const char *raw[] = {"p1.5.1", "cDEuNS4x=", "cDEuNS4x!", "cDEuNS4", "cDEuNS4x\n"};
    size_t n_plains = sizeof plains / sizeof plains[0];
    for (size_t i = 0; i < n_plains + sizeof raw / sizeof raw[0]; i++) {
        char *cursor = i < n_plains
                           ? sbx_secret_base64url ((const uint8_t *) plains[i], strlen (plains[i]))
                           : strdup (raw[i - n_plains]);
        page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        page->caller = ALICE;
        sbx_str_set (&sbx_msg_sandbox_list (page)->cursor, cursor);
        free (cursor);
        reply = brk_testkit_call (client, page, ++s_rid);
        assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
        assert (strstr (sbx_msg_error (reply)->message, "nextCursor"));
        sbx_msg_destroy (&reply);
    }
    //  An empty cursor is none: the first page.
    page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    page->caller = ALICE;
    sbx_msg_sandbox_list (page)->limit = 1;
    sbx_str_set (&sbx_msg_sandbox_list (page)->cursor, "");
    reply = brk_testkit_call (client, page, ++s_rid);
    assert (sbx_msg_sandbox_list_ok (reply)->sandboxes.count == 1);
    sbx_msg_destroy (&reply);
    //  One that it made parses: the page before 1970's fifth millisecond is empty.
    page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    page->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_list (page)->cursor, "cDEuNS4x"); //  p1.5.1
    reply = brk_testkit_call (client, page, ++s_rid);
    assert (sbx_msg_sandbox_list_ok (reply)->sandboxes.count == 0);
    assert (!sbx_msg_sandbox_list_ok (reply)->next_cursor);
    sbx_msg_destroy (&reply);
    page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    page->caller = ALICE;
    sbx_msg_sandbox_list (page)->limit = 1001;
    reply = brk_testkit_call (client, page, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);

    //  Presets: read-only can't stop, no-delete can't delete.
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, one,
                        brk_testkit_caller (alice, "key_ro", SBX_KEY_PRESET_READ_ONLY));
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_DELETE, one,
                        brk_testkit_caller (alice, "key_nd", SBX_KEY_PRESET_NO_DELETE));
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);

    //  Agent requests are relayed through vmd, and come back as the agent said them.
    sbx_msg_t *exec = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    exec->rid = 77;
    sbx_str_set (&sbx_msg_agent_exec (exec)->command, "uname -a");
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (exec, &data, &size, &err) == 0);
    sbx_msg_t *relay = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    relay->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_agent (relay)->sandbox_id, one);
    sbx_bytes_set (&sbx_msg_sandbox_agent (relay)->request, data, size);
    sbx_msg_t *ro = sbx_msg_dup (relay);
    reply = brk_testkit_call (client, relay, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_AGENT_OK);
    sbx_bytes_t *answer = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *inner = sbx_msg_decode (answer->data, answer->size, &err);
    assert (inner && inner->type == SBX_MSG_AGENT_EXEC_OK && inner->rid == 77);
    assert (sbx_msg_agent_exec_ok (inner)->stdout.size == 8);
    sbx_msg_destroy (&inner);
    sbx_msg_destroy (&reply);
    //  A read-only key may not exec; garbage and non-user agent requests are refused.
    ro->caller->preset = SBX_KEY_PRESET_READ_ONLY;
    reply = brk_testkit_call (client, ro, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);
    //  Nor type into a terminal or resize it.
    sbx_msg_type_t terminal[] = {SBX_MSG_AGENT_INPUT, SBX_MSG_AGENT_RESIZE};
    for (int i = 0; i < 2; i++) {
        sbx_msg_t *term = sbx_msg_new (terminal[i]);
        if (i == 0)
            sbx_msg_agent_input (term)->pid = 42;
        else
            *sbx_msg_agent_resize (term) = (sbx_agent_resize_t){.pid = 42, .rows = 9, .cols = 9};
        uint8_t *term_data;
        size_t term_size;
        assert (sbx_msg_encode (term, &term_data, &term_size, &err) == 0);
        relay = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
        relay->caller = brk_testkit_caller (alice, "key_ro", SBX_KEY_PRESET_READ_ONLY);
        sbx_str_set (&sbx_msg_sandbox_agent (relay)->sandbox_id, one);
        sbx_bytes_set (&sbx_msg_sandbox_agent (relay)->request, term_data, term_size);
        reply = brk_testkit_call (client, relay, ++s_rid);
        assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
        assert (strstr (sbx_msg_error (reply)->message, sbx_msg_type_name (terminal[i])));
        sbx_msg_destroy (&reply);
        free (term_data);
        sbx_msg_destroy (&term);
    }
    sbx_msg_t *setup = sbx_msg_new (SBX_MSG_AGENT_SETUP);
    uint8_t *setup_data;
    size_t setup_size;
    assert (sbx_msg_encode (setup, &setup_data, &setup_size, &err) == 0);
    relay = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    relay->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_agent (relay)->sandbox_id, one);
    sbx_bytes_set (&sbx_msg_sandbox_agent (relay)->request, setup_data, setup_size);
    reply = brk_testkit_call (client, relay, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    relay = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    relay->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_agent (relay)->sandbox_id, one);
    sbx_bytes_set (&sbx_msg_sandbox_agent (relay)->request, "\xc1garbage", 8);
    reply = brk_testkit_call (client, relay, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    free (setup_data);
    sbx_msg_destroy (&setup);

    //  Stop and resume, each twice (the second time is a no-op, not an error).
    sbx_sandbox_state_t expect[] = {SBX_SANDBOX_STATE_STOPPED, SBX_SANDBOX_STATE_STOPPED,
                                    SBX_SANDBOX_STATE_READY, SBX_SANDBOX_STATE_READY};
    sbx_msg_type_t asks[] = {SBX_MSG_SANDBOX_STOP, SBX_MSG_SANDBOX_STOP, SBX_MSG_SANDBOX_RESUME,
                             SBX_MSG_SANDBOX_RESUME};
    for (int i = 0; i < 4; i++) {
        reply = s_test_ask (client, asks[i], one, ALICE);
        assert (s_sandbox (reply) && s_sandbox (reply)->state == expect[i]);
        sbx_msg_destroy (&reply);
    }
    //  A move that cannot be recorded (a full disk; a cluster's lost leadership) is not
    //  asked of vmd: the guest and the record stay as they were. A trigger refuses it. (The
    //  order matters beyond this: a broker killed between an ask and its record left a
    //  stopped record over a resumed guest, which the next resume then broke.)
    char *store_path = sbx_config_path (config, "broker/control.db");
    brk_store_t *saboteur = brk_store_new (store_path);
    free (store_path);
    assert (saboteur);
    assert (sbx_db_exec (saboteur->db,
                         "CREATE TRIGGER test_refuse BEFORE UPDATE OF state ON sandboxes WHEN "
                         "NEW.state = 'stopping' BEGIN SELECT RAISE (ABORT, 'refused'); END",
                         "test trigger") == 0);
    int stops = __atomic_load_n (&s_vmd_stops, __ATOMIC_SEQ_CST);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, one, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_INTERNAL);
    assert (strstr (sbx_msg_error (reply)->message, "cannot record the stop"));
    sbx_msg_destroy (&reply);
    assert (sbx_db_exec (saboteur->db, "DROP TRIGGER test_refuse", "test trigger") == 0);
    brk_store_destroy (&saboteur);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_READY);
    sbx_msg_destroy (&reply);
    assert (__atomic_load_n (&s_vmd_stops, __ATOMIC_SEQ_CST) == stops);

    //  A stopped sandbox runs nothing: agent requests wait for a resume.
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, one, ALICE);
    sbx_msg_destroy (&reply);
    relay = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    relay->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_agent (relay)->sandbox_id, one);
    sbx_bytes_set (&sbx_msg_sandbox_agent (relay)->request, data, size);
    reply = brk_testkit_call (client, relay, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_FAILED_PRECONDITION);
    assert (strstr (sbx_msg_error (reply)->message, "resume it first"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, one, ALICE);
    sbx_msg_destroy (&reply);
    free (data);
    sbx_msg_destroy (&exec);

    //  Egress rules: checked, carried at create, changed on a ready guest through its vmd
    //  (an error there keeps the old rules), stored alone while stopped, given at resume.
    sbx_msg_t *fenced = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    fenced->caller = ALICE;
    sbx_strlist_append (&sbx_msg_sandbox_create (fenced)->egress_deny, "bad..name");
    reply = brk_testkit_call (client, fenced, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INVALID_ARGUMENT);
    assert (strstr (sbx_msg_error (reply)->message, "egress.deny[0]"));
    sbx_msg_destroy (&reply);
    fenced = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    fenced->caller = ALICE;
    sbx_strlist_append (&sbx_msg_sandbox_create (fenced)->egress_allow, "203.0.113.0/24");
    sbx_strlist_append (&sbx_msg_sandbox_create (fenced)->egress_allow, "192.0.2.0/24");
    sbx_strlist_append (&sbx_msg_sandbox_create (fenced)->egress_deny, "198.51.100.7");
    sbx_strlist_append (&sbx_msg_sandbox_create (fenced)->egress_deny, "ads.example.com");
    reply = brk_testkit_call (client, fenced, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK); //  names too: vmd enforces them
    assert (streq (s_vmd_egress,
                   "vm.create 203.0.113.0/24\n192.0.2.0/24|198.51.100.7\nads.example.com"));
    info = s_sandbox (reply);
    assert (info->egress_allow.count == 2 && info->egress_deny.count == 2);
    assert (streq (info->egress_allow.items[1], "192.0.2.0/24"));
    char *walled = strdup (info->id);
    sbx_msg_destroy (&reply);
    sbx_msg_t *change = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    change->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_update (change)->sandbox_id, walled);
    sbx_msg_sandbox_update (change)->egress_set = true;
    sbx_strlist_append (&sbx_msg_sandbox_update (change)->egress_deny, "198.51.100.0/25");
    reply = brk_testkit_call (client, change, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK);
    assert (streq (s_vmd_egress, "vm.egress |198.51.100.0/25"));
    info = sbx_msg_sandbox_update_ok (reply)->sandbox;
    assert (info->egress_allow.count == 0 && info->egress_deny.count == 1);
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 1, __ATOMIC_SEQ_CST);
    change = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    change->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_update (change)->sandbox_id, walled);
    sbx_msg_sandbox_update (change)->egress_set = true;
    reply = brk_testkit_call (client, change, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_INTERNAL);
    assert (strstr (sbx_msg_error (reply)->message, "kept its egress rules"));
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, walled, ALICE);
    assert (s_sandbox (reply)->egress_deny.count == 1);
    assert (streq (s_sandbox (reply)->egress_deny.items[0], "198.51.100.0/25"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, walled, ALICE);
    sbx_msg_destroy (&reply);
    snprintf (s_vmd_egress, sizeof s_vmd_egress, "untouched");
    change = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    change->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_update (change)->sandbox_id, walled);
    sbx_msg_sandbox_update (change)->egress_set = true;
    sbx_strlist_append (&sbx_msg_sandbox_update (change)->egress_allow, "2001:db8::/32");
    reply = brk_testkit_call (client, change, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK && streq (s_vmd_egress, "untouched"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, walled, ALICE);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
    assert (streq (s_vmd_egress, "vm.resume 2001:db8::/32|"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_DELETE, walled, ALICE);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (walled);

    //  Capacity 2: a second fits, a third doesn't.
    reply = s_test_create (client, ALICE, NULL, 0);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *two = strdup (s_sandbox (reply)->id);
    assert (streq (s_sandbox (reply)->name, s_sandbox (reply)->label));
    sbx_msg_destroy (&reply);
    reply = s_test_create (client, ALICE, NULL, 0);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE &&
            strstr (sbx_msg_error (reply)->message, "full"));
    sbx_msg_destroy (&reply);
    //  Two, a page at a time: the newest, a cursor, the other, no cursor.
    const char *paged[2] = {NULL, NULL};
    char *cursor = NULL;
    for (int i = 0; i < 2; i++) {
        sbx_msg_t *page = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        page->caller = ALICE;
        sbx_msg_sandbox_list (page)->limit = 1;
        sbx_str_set (&sbx_msg_sandbox_list (page)->cursor, cursor);
        sbx_msg_t *got = brk_testkit_call (client, page, ++s_rid);
        sbx_sandbox_list_ok_t *ok = sbx_msg_sandbox_list_ok (got);
        assert (ok->sandboxes.count == 1);
        paged[i] = streq (ok->sandboxes.items[0].id, two) ? two : one;
        free (cursor);
        cursor = ok->next_cursor ? strdup (ok->next_cursor) : NULL;
        assert ((cursor != NULL) == (i == 0));
        sbx_msg_destroy (&got);
    }
    assert (paged[0] == two && paged[1] == one);

    //  vmd fails a stop: the user hears why, the sandbox is in error, only delete works.
    __atomic_store_n (&s_vmd_mode, 1, __ATOMIC_SEQ_CST);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_STOP, two, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_INTERNAL);
    assert (strstr (sbx_msg_error (reply)->message, "could not stop: migration failed"));
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, two, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_ERROR);
    assert (strstr (s_sandbox (reply)->reason, "migration failed"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, two, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_FAILED_PRECONDITION);
    assert (strstr (sbx_msg_error (reply)->message, "only delete works now"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_DELETE, two, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_DELETED);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, two, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  Extend and update: a new deadline, a new name, labels set and removed, each an event.
    sbx_msg_t *extend = sbx_msg_new (SBX_MSG_SANDBOX_EXTEND);
    extend->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_extend (extend)->sandbox_id, one);
    sbx_msg_sandbox_extend (extend)->ttl_s = 7200;
    reply = brk_testkit_call (client, extend, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_EXTEND_OK);
    uint64_t expires = sbx_msg_sandbox_extend_ok (reply)->sandbox->expires_ms;
    assert (expires > sbx_clock_now_ms () + 7100 * 1000 &&
            expires <= sbx_clock_now_ms () + 7200 * 1000);
    sbx_msg_destroy (&reply);
    sbx_msg_t *update = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    update->caller = ALICE;
    sbx_str_set (&sbx_msg_sandbox_update (update)->sandbox_id, one);
    sbx_str_set (&sbx_msg_sandbox_update (update)->name, "renamed");
    sbx_strmap_set (&sbx_msg_sandbox_update (update)->labels, "env", "prod");
    sbx_strlist_append (&sbx_msg_sandbox_update (update)->remove_labels, "team");
    reply = brk_testkit_call (client, update, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK);
    info = sbx_msg_sandbox_update_ok (reply)->sandbox;
    assert (streq (info->name, "renamed") && info->labels.count == 1);
    assert (streq (sbx_strmap_get (&info->labels, "env"), "prod"));
    sbx_msg_destroy (&reply);
    update = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    update->caller = brk_testkit_caller (alice, "key_ro", SBX_KEY_PRESET_READ_ONLY);
    sbx_str_set (&sbx_msg_sandbox_update (update)->sandbox_id, one);
    sbx_str_set (&sbx_msg_sandbox_update (update)->name, "nope");
    reply = brk_testkit_call (client, update, ++s_rid);
    assert (brk_testkit_code (reply) == SBX_E_PERMISSION_DENIED);
    sbx_msg_destroy (&reply);

    //  A TTL of one second: the broker stops it within a second of the deadline, logs
    //  ttl.expired with both times, and a resume gives it its TTL again.
    sbx_msg_t *brief = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    brief->caller = ALICE;
    sbx_msg_sandbox_create (brief)->ttl_s = 1;
    reply = brk_testkit_call (client, brief, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *three = strdup (s_sandbox (reply)->id);
    uint64_t deadline = s_sandbox (reply)->expires_ms;
    sbx_msg_destroy (&reply);
    sbx_sandbox_state_t now_state = SBX_SANDBOX_STATE_READY;
    for (int tries = 0; tries < 200 && now_state != SBX_SANDBOX_STATE_STOPPED; tries++) {
        zclock_sleep (20);
        reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, three, ALICE);
        now_state = s_sandbox (reply)->state;
        sbx_msg_destroy (&reply);
    }
    assert (now_state == SBX_SANDBOX_STATE_STOPPED);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, three, ALICE);
    assert (streq (s_sandbox (reply)->reason, "TTL expired"));
    sbx_msg_destroy (&reply);
    sbx_msg_t *ask_ttl = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (ask_ttl)->prefix, "ttl.");
    reply = brk_testkit_call (client, ask_ttl, ++s_rid);
    assert (sbx_msg_events_replay_ok (reply)->events.count == 1);
    sbx_event_t *ttl_event = &sbx_msg_events_replay_ok (reply)->events.items[0];
    sbx_msg_t *expired = sbx_msg_decode (ttl_event->payload.data, ttl_event->payload.size, &err);
    assert (expired && streq (sbx_msg_ttl_expired (expired)->sandbox_id, three));
    assert (sbx_msg_ttl_expired (expired)->deadline_ms == deadline);
    assert (sbx_msg_ttl_expired (expired)->actual_ms >= deadline);
    assert (sbx_msg_ttl_expired (expired)->actual_ms - deadline < 1000);
    sbx_msg_destroy (&expired);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_RESUME, three, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_READY);
    assert (s_sandbox (reply)->expires_ms > sbx_clock_now_ms ());
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_DELETE, three, ALICE);
    sbx_msg_destroy (&reply);
    free (three);

    //  The guest dies on its own: vmd says so, the sandbox goes to error with the reason.
    sbx_msg_t *failed = sbx_msg_new (SBX_MSG_VM_FAILED);
    sbx_str_set (&sbx_msg_vm_failed (failed)->sandbox_id, one);
    sbx_str_set (&sbx_msg_vm_failed (failed)->reason, "QEMU exited with status 1");
    brk_testkit_worker_send (vmd, &failed);
    for (int tries = 0; tries < 100; tries++) {
        reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one, ALICE);
        bool error = s_sandbox (reply)->state == SBX_SANDBOX_STATE_ERROR;
        sbx_msg_destroy (&reply);
        if (error)
            break;
        zclock_sleep (20);
    }
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one, ALICE);
    assert (streq (s_sandbox (reply)->reason, "QEMU exited with status 1"));
    sbx_msg_destroy (&reply);

    //  The log tells the whole story of sandbox one, in order.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
    sbx_str_set (&sbx_msg_events_replay (request)->prefix, "sandbox.");
    reply = brk_testkit_call (client, request, ++s_rid);
    sbx_events_replay_ok_t *log = sbx_msg_events_replay_ok (reply);
    sbx_sandbox_state_t story[] = {
        SBX_SANDBOX_STATE_CREATING, SBX_SANDBOX_STATE_READY,    SBX_SANDBOX_STATE_STOPPING,
        SBX_SANDBOX_STATE_STOPPED,  SBX_SANDBOX_STATE_RESUMING, SBX_SANDBOX_STATE_READY,
        SBX_SANDBOX_STATE_STOPPING, SBX_SANDBOX_STATE_STOPPED,  SBX_SANDBOX_STATE_RESUMING,
        SBX_SANDBOX_STATE_READY,    SBX_SANDBOX_STATE_ERROR};
    size_t seen = 0;
    for (size_t i = 0; i < log->events.count; i++) {
        sbx_event_t *event = &log->events.items[i];
        if (!streq (event->subject, one) || !streq (event->type, "sandbox.changed"))
            continue;
        sbx_err_t err;
        sbx_msg_t *changed = sbx_msg_decode (event->payload.data, event->payload.size, &err);
        assert (changed && changed->type == SBX_MSG_SANDBOX_CHANGED);
        assert (seen < 11 && sbx_msg_sandbox_changed (changed)->to == story[seen]);
        assert (streq (event->account, alice));
        seen++;
        sbx_msg_destroy (&changed);
    }
    assert (seen == 11);
    sbx_msg_destroy (&reply);

    //  vmd gone: its sandboxes can't move now, and new ones have nowhere to go.
    zactor_destroy (&vmd);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) > 0)
        zclock_sleep (20);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_DELETE, one, ALICE);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE &&
            strstr (sbx_msg_error (reply)->message, "host-a"));
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, one, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_ERROR); //  unchanged
    sbx_msg_destroy (&reply);

    //  A vmd that never answers: the create times out, the sandbox is in error.
    __atomic_store_n (&s_vmd_mode, 2, __ATOMIC_SEQ_CST);
    vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-slow", 4, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    reply = s_test_create (client, ALICE, "slow", 1500);
    assert (brk_testkit_code (reply) == SBX_E_TIMEOUT);
    sbx_msg_destroy (&reply);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_LIST, NULL, ALICE);
    sbx_sandbox_info_list_t *all = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
    assert (all->count == 2 && all->items[0].state == SBX_SANDBOX_STATE_ERROR);
    assert (streq (all->items[0].name, "slow"));
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);

    //  A vmd that goes away with a stop in flight (a restart): what it did is not known, so
    //  the sandbox stays stopping, not error; back, the vmd says it has the guest stopped
    //  and brk_reconcile settles the record so.
    size_t vmds = brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid);
    zactor_t *leaving =
        brk_testkit_worker (config, SBX_ROLE_VMD, "host-gone", 64, s_test_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < vmds + 1)
        zclock_sleep (20);
    reply = s_test_create (client, ALICE, "leaving", 0);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK &&
            streq (s_sandbox (reply)->vmd, "host-gone"));
    snprintf (s_vmd_guest, sizeof s_vmd_guest, "%s", s_sandbox (reply)->id);
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 2, __ATOMIC_SEQ_CST);
    sbx_msg_t *stop = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
    stop->caller = ALICE;
    stop->rid = ++s_rid;
    sbx_msg_set_subject (stop, s_vmd_guest);
    brk_testkit_send (client, &stop);
    zclock_sleep (300); //  the stop reaches the vmd, which does not answer
    zactor_destroy (&leaving);
    while ((reply = brk_testkit_recv (client, 60000)) && reply->rid != s_rid)
        sbx_msg_destroy (&reply);
    assert (reply && brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    assert (
        strstr (sbx_msg_error (reply)->message, "went away during the stop; it stays stopping"));
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);
    reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, s_vmd_guest, ALICE);
    assert (s_sandbox (reply)->state == SBX_SANDBOX_STATE_STOPPING);
    sbx_msg_destroy (&reply);
    s_vmd_guest_state = SBX_SANDBOX_STATE_STOPPED;
    leaving = brk_testkit_worker (config, SBX_ROLE_VMD, "host-gone", 64, s_test_vmd, NULL);
    sbx_sandbox_state_t settled = SBX_SANDBOX_STATE_STOPPING;
    for (int i = 0; i < 200 && settled == SBX_SANDBOX_STATE_STOPPING; i++) {
        zclock_sleep (50);
        reply = s_test_ask (client, SBX_MSG_SANDBOX_GET, s_vmd_guest, ALICE);
        settled = s_sandbox (reply)->state;
        sbx_msg_destroy (&reply);
    }
    assert (settled == SBX_SANDBOX_STATE_STOPPED);
    zactor_destroy (&leaving);
    *s_vmd_guest = 0;

    zactor_destroy (&vmd);
    free (one);
    free (two);
    free (alice);
    free (bob);
    zsock_destroy (&client);
    zactor_destroy (&server);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
