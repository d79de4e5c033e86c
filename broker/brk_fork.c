/*  brk_fork - see brk_fork.h */
#include "brk_fork.h"
#include "brk_egress.h"
#include "brk_limits.h"
#include "brk_sandbox.h"
#include "brk_snapshot.h"
#include "sbx_metrics.h"
#include "sbx_secret.h"

#include <assert.h>

//  snapshotd answers from its catalog at once; the capture is a memory copy and a disk
//  copy (seconds under TCG, more for a large disk).
#define S_SNAPSHOTD_MS 10000u
#define S_CAPTURE_MS   300000u

//  A fork on its way: asked, captured, its copies created.
typedef struct s_fork_s {
    zframe_t *client;
    uint64_t rid;
    sbx_msg_t *request; //  the client's sandbox.fork (its caller makes the copies)
    char *source_id;
    char *vmd;
    char *store; //  the snapshotd of the vmd's host (NULL: any, one machine)
    uint32_t timeout_ms;
    size_t count;
    char *ids[BRK_FORK_MAX];       //  the copies', chosen before the capture
    sbx_msg_t *made[BRK_FORK_MAX]; //  each copy's answer (sandbox.create.ok or the error)
    size_t answered;
    char *snapshot_id;
    char *dir;
    sbx_msg_t *finished; //  snap.finish.ok: the capture's record, what the copies restore
    uint64_t asked_mono;
    uint64_t paused_ms;
    uint64_t capture_ms;
    sbx_code_t code; //  the first failure, SBX_OK while none
    char message[1024];
    struct s_copy_s {
        struct s_fork_s *fork;
        size_t index;
    } copies[BRK_FORK_MAX]; //  each copy's create's argument: which one it is
} s_fork_t;

static void s_fork_destroy (s_fork_t **fork_p)
{
    s_fork_t *fork = *fork_p;
    if (!fork)
        return;
    zframe_destroy (&fork->client);
    sbx_msg_destroy (&fork->request);
    free (fork->source_id);
    free (fork->vmd);
    free (fork->store);
    for (size_t i = 0; i < BRK_FORK_MAX; i++) {
        free (fork->ids[i]);
        sbx_msg_destroy (&fork->made[i]);
    }
    free (fork->snapshot_id);
    free (fork->dir);
    sbx_msg_destroy (&fork->finished);
    free (fork);
    *fork_p = NULL;
}

static void s_fail (s_fork_t *fork, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

static void s_fail (s_fork_t *fork, sbx_code_t code, const char *format, ...)
{
    if (fork->code != SBX_OK)
        return;
    fork->code = code;
    va_list args;
    va_start (args, format);
    vsnprintf (fork->message, sizeof fork->message, format, args);
    va_end (args);
}

//  Answers the client (taking the reply), counts the fork, and ends it.
static void s_end (brk_ctx_t *ctx, s_fork_t *fork, sbx_msg_t **reply_p)
{
    sbx_msg_t *reply = *reply_p;
    sbx_metrics_add (
        sbx_metrics_here (), SBX_METRIC_SANDBOX_OPS_TOTAL, 1, "fork",
        reply && reply->type == SBX_MSG_ERROR ? sbx_code_name (sbx_msg_error (reply)->code) : "ok");
    if (reply && fork->client)
        ctx->send (ctx, fork->client, reply_p);
    sbx_msg_destroy (reply_p);
    s_fork_destroy (&fork);
}

//  The copies from `from` on were never created: they stand on the fork snapshot only
//  in snapshotd's catalog, which forgets them (and the snapshot with the last).
static void s_release (brk_ctx_t *ctx, s_fork_t *fork, size_t from)
{
    for (size_t i = from; i < fork->count; i++)
        brk_snapshot_release (ctx, fork->ids[i]);
}

//  The fork failed before any copy was created: says why.
static void s_fail_early (brk_ctx_t *ctx, s_fork_t *fork)
{
    sbx_info ("rid=%llu fork of sandbox %s failed: %s (%s)", (unsigned long long) fork->rid,
              fork->source_id, fork->message, sbx_code_name (fork->code));
    sbx_msg_t *reply = sbx_msg_new_error (fork->rid, fork->code, "cannot fork sandbox %s: %s",
                                          fork->source_id, fork->message);
    s_end (ctx, fork, &reply);
}

//  May count more sandboxes start for the source's account, on the source's vmd? NULL,
//  or the refusal.
static sbx_msg_t *s_check (brk_ctx_t *ctx, const brk_sandbox_t *source, size_t count, uint64_t rid)
{
    brk_account_t owner;
    int found = brk_store_account_find (ctx->store, source->account_id, &owner);
    if (found != 0)
        return sbx_msg_new_error (rid, SBX_E_INTERNAL, "sandbox %s has no account", source->id);
    //  The account's plan, whoever asks: an operator forking for it included.
    sbx_msg_t *refused = brk_limits_check_starts (ctx, &owner, rid, count);
    brk_account_clear (&owner);
    if (refused)
        return refused;
    uint64_t room = 0;
    if (brk_sandbox_room (ctx, source->vmd, &room))
        return sbx_msg_new_error (rid, SBX_E_UNAVAILABLE,
                                  "sandbox %s is on vmd %s, which is not connected; retry when it "
                                  "is back",
                                  source->id, source->vmd ? source->vmd : "(none)");
    //  The copies stand on the capture's files, on the source's host: they run there.
    if (room < count)
        return sbx_msg_new_error (
            rid, SBX_E_UNAVAILABLE,
            "the copies of sandbox %s run on its host (vmd %s), which has room for %llu more; "
            "ask for fewer, or stop or delete sandboxes there",
            source->id, source->vmd, (unsigned long long) room);
    return NULL;
}

//  Every copy answered: the fork's answer, or (one failed) its error and the others go.
static void s_finish (brk_ctx_t *ctx, s_fork_t *fork)
{
    size_t failed = fork->count;
    for (size_t i = 0; i < fork->count && failed == fork->count; i++)
        if (!fork->made[i] || fork->made[i]->type != SBX_MSG_SANDBOX_CREATE_OK)
            failed = i;
    sbx_msg_t *reply = NULL;
    if (failed < fork->count) {
        sbx_msg_t *why = fork->made[failed];
        //  All or nothing: the copies made go, and those in error (as a create's would,
        //  a failed copy stays in error until it is deleted: here it is).
        char made[BRK_FORK_MAX * 16 + 1] = "";
        size_t ok = 0;
        for (size_t i = 0; i < fork->count; i++) {
            bool good = fork->made[i] && fork->made[i]->type == SBX_MSG_SANDBOX_CREATE_OK;
            if (good) {
                snprintf (made + strlen (made), sizeof made - strlen (made), "%s%s", ok ? ", " : "",
                          fork->ids[i]);
                ok++;
            }
            brk_sandbox_discard (ctx, fork->ids[i], "its fork failed");
        }
        char also[sizeof made + 64] = "";
        if (ok)
            snprintf (also, sizeof also, "; the %s made (%s) %s being deleted",
                      ok == 1 ? "copy" : "copies", made, ok == 1 ? "is" : "are");
        reply = sbx_msg_new_error (fork->rid, why ? sbx_msg_error (why)->code : SBX_E_INTERNAL,
                                   "cannot fork sandbox %s: copy %zu of %zu failed: %s%s",
                                   fork->source_id, failed + 1, fork->count,
                                   why ? sbx_msg_error (why)->message : "no answer", also);
        sbx_info ("rid=%llu fork of sandbox %s failed: copy %s: %s", (unsigned long long) fork->rid,
                  fork->source_id, fork->ids[failed],
                  why ? sbx_msg_error (why)->message : "no answer");
        s_end (ctx, fork, &reply);
        return;
    }
    reply = sbx_msg_new (SBX_MSG_SANDBOX_FORK_OK);
    brk_sandbox_t source;
    if (reply && brk_store_sandbox_find (ctx->store, fork->source_id, &source) == 0) {
        sbx_sandbox_fork_ok_t *ok = sbx_msg_sandbox_fork_ok (reply);
        reply->rid = fork->rid;
        ok->sandbox = brk_sandbox_info (ctx, &source);
        brk_sandbox_clear (&source);
        //  The copies move from their create answers into ours.
        for (size_t i = 0; i < fork->count; i++) {
            sbx_sandbox_info_t *copy = sbx_sandbox_info_list_append (&ok->sandboxes);
            sbx_sandbox_info_t **made = sbx_msg_sandbox_slot (fork->made[i]);
            if (copy && made && *made) {
                *copy = **made;
                free (*made);
                *made = NULL;
            }
        }
        sbx_str_set (&ok->snapshot_id, fork->snapshot_id);
        ok->paused_ms = fork->paused_ms;
        ok->capture_ms = fork->capture_ms;
        sbx_info ("rid=%llu sandbox=%s forked into %zu copies in %llu ms (paused %llu ms)",
                  (unsigned long long) fork->rid, fork->source_id, fork->count,
                  (unsigned long long) (sbx_clock_mono_ms () - fork->asked_mono),
                  (unsigned long long) fork->paused_ms);
    }
    if (!reply || !sbx_msg_sandbox_fork_ok (reply)->sandbox) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (fork->rid, SBX_E_INTERNAL,
                                   "sandbox %s vanished from the store during its fork",
                                   fork->source_id);
    }
    s_end (ctx, fork, &reply);
}

static void s_on_copy (brk_ctx_t *ctx, sbx_msg_t **reply_p, void *arg)
{
    struct s_copy_s *copy = arg;
    s_fork_t *fork = copy->fork;
    assert (!fork->made[copy->index]);
    fork->made[copy->index] = *reply_p;
    *reply_p = NULL;
    if (++fork->answered == fork->count)
        s_finish (ctx, fork);
}

static void s_add_label (const char *key, const char *value, void *arg)
{
    sbx_strmap_set ((sbx_strmap_t *) arg, key, value);
}

//  The create of one copy, as the asker (whose key may then see it), with the source's
//  settings: type, TTL, network, autoResume, egress rules and labels. Its name is its
//  own label (the default).
static sbx_msg_t *s_copy_request (brk_ctx_t *ctx, s_fork_t *fork, const brk_sandbox_t *source)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    sbx_msg_t *asked = sbx_msg_dup (fork->request);
    if (!request || !asked) {
        sbx_msg_destroy (&request);
        sbx_msg_destroy (&asked);
        return NULL;
    }
    request->rid = fork->rid;
    request->caller = asked->caller; //  moves
    asked->caller = NULL;
    sbx_msg_destroy (&asked);
    //  The copies are the source's account's, an operator's fork's too (who names none).
    if (request->caller->kind == SBX_CALLER_KIND_ADMIN ||
        request->caller->kind == SBX_CALLER_KIND_SYSTEM)
        sbx_str_set (&request->caller->account_id, source->account_id);
    sbx_sandbox_create_t *create = sbx_msg_sandbox_create (request);
    sbx_sandbox_type_from_name (source->type, &create->type);
    create->ttl_s = source->ttl_s;
    create->no_network = source->no_network;
    create->no_auto_resume = source->no_auto_resume;
    brk_egress_split (source->egress_allow, &create->egress_allow);
    brk_egress_split (source->egress_deny, &create->egress_deny);
    brk_store_sandbox_labels (ctx->store, source->id, s_add_label, &create->labels);
    return request;
}

//  The capture is ready: checked once more (in the turn that creates them, so nothing
//  starts in between), the copies are created from it, each answering s_on_copy.
static void s_create_copies (brk_ctx_t *ctx, s_fork_t *fork)
{
    brk_sandbox_t source;
    if (brk_store_sandbox_find (ctx->store, fork->source_id, &source) != 0) {
        s_fail (fork, SBX_E_NOT_FOUND, "it is gone");
        s_release (ctx, fork, 0);
        s_fail_early (ctx, fork);
        return;
    }
    sbx_msg_t *refused = s_check (ctx, &source, fork->count, fork->rid);
    sbx_msg_t *request = refused ? NULL : s_copy_request (ctx, fork, &source);
    brk_sandbox_clear (&source);
    if (refused || !request) {
        if (refused)
            s_fail (fork, sbx_msg_error (refused)->code, "%s", sbx_msg_error (refused)->message);
        else
            s_fail (fork, SBX_E_INTERNAL, "out of memory");
        sbx_msg_destroy (&refused);
        s_release (ctx, fork, 0);
        s_fail_early (ctx, fork);
        return;
    }
    const sbx_snapshot_info_t *capture = sbx_msg_snap_finish_ok (fork->finished)->snapshot;
    brk_origin_t origin = {.dir = fork->dir,
                           .qemu_version = capture->qemu_version,
                           .image = capture->image,
                           .snapshot_id = fork->snapshot_id,
                           .vmd = fork->vmd,
                           .type = capture->type ? capture->type : SBX_SANDBOX_TYPE_SMALL};
    //  The last copy's refusal would end the fork (s_finish) while this loop runs:
    //  count it as answered only after the loop.
    size_t refused_now = 0;
    for (size_t i = 0; i < fork->count; i++) {
        origin.sandbox_id = fork->ids[i];
        sbx_msg_t *copy = sbx_msg_dup (request);
        sbx_msg_t *reply =
            copy ? brk_sandbox_create_copy (ctx, copy, &origin, s_on_copy, &fork->copies[i])
                 : sbx_msg_new_error (fork->rid, SBX_E_INTERNAL, "out of memory");
        sbx_msg_destroy (&copy);
        if (reply) {
            //  Refused before vmd was asked: it does not stand on the capture.
            brk_snapshot_release (ctx, fork->ids[i]);
            fork->made[i] = reply;
            refused_now++;
        }
    }
    sbx_msg_destroy (&request);
    fork->answered += refused_now;
    if (fork->answered == fork->count)
        s_finish (ctx, fork);
}

static void s_on_finished (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_fork_t *fork = arg;
    sbx_msg_t *answer = *answer_p;
    if (fork->code == SBX_OK && answer->type == SBX_MSG_ERROR)
        s_fail (fork, sbx_msg_error (answer)->code, "the capture failed: %s",
                sbx_msg_error (answer)->message);
    if (fork->code != SBX_OK) {
        s_release (ctx, fork, 0);
        s_fail_early (ctx, fork);
        return;
    }
    fork->finished = answer; //  taken
    *answer_p = NULL;
    s_create_copies (ctx, fork);
}

//  The capture ended (or failed): snapshotd checks its files and marks the record ready,
//  or failed (and removes them).
static void s_snap_finish (brk_ctx_t *ctx, s_fork_t *fork, const sbx_vm_snapshot_ok_t *done)
{
    sbx_msg_t *finish = sbx_msg_new (SBX_MSG_SNAP_FINISH);
    sbx_snap_finish_t *body = sbx_msg_snap_finish (finish);
    sbx_str_set (&body->snapshot_id, fork->snapshot_id);
    if (fork->code != SBX_OK)
        sbx_str_set (&body->error, fork->message);
    else if (done) {
        body->disk_bytes = done->disk_bytes;
        body->memory_bytes = done->memory_bytes;
        sbx_str_set (&body->image, done->image);
        sbx_str_set (&body->qemu_version, done->qemu_version);
    }
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, fork->store, &finish, S_SNAPSHOTD_MS, s_on_finished,
                   fork) == 0)
        return;
    //  snapshotd went away during the capture: when it comes back it fails the record.
    s_fail (fork, SBX_E_UNAVAILABLE, "snapshotd went away during the capture");
    s_release (ctx, fork, 0);
    s_fail_early (ctx, fork);
}

static void s_on_captured (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_fork_t *fork = arg;
    sbx_msg_t *answer = *answer_p;
    fork->capture_ms = sbx_clock_mono_ms () - fork->asked_mono;
    if (answer->type == SBX_MSG_ERROR)
        s_fail (fork, sbx_msg_error (answer)->code, "the capture failed: %s",
                sbx_msg_error (answer)->message);
    else
        fork->paused_ms = sbx_msg_vm_snapshot_ok (answer)->paused_ms;
    s_snap_finish (ctx, fork,
                   answer->type == SBX_MSG_VM_SNAPSHOT_OK ? sbx_msg_vm_snapshot_ok (answer) : NULL);
}

static void s_on_begun (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_fork_t *fork = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type == SBX_MSG_ERROR) {
        s_fail (fork, sbx_msg_error (answer)->code, "%s", sbx_msg_error (answer)->message);
        s_release (ctx, fork, 0);
        s_fail_early (ctx, fork);
        return;
    }
    sbx_snap_begin_ok_t *begun = sbx_msg_snap_begin_ok (answer);
    fork->snapshot_id = strdup (begun->snapshot_id);
    fork->dir = strdup (begun->dir);
    sbx_msg_t *capture = sbx_msg_new (SBX_MSG_VM_SNAPSHOT);
    sbx_str_set (&sbx_msg_vm_snapshot (capture)->sandbox_id, fork->source_id);
    sbx_str_set (&sbx_msg_vm_snapshot (capture)->dir, begun->dir);
    sbx_msg_vm_snapshot (capture)->live = true;
    if (!fork->snapshot_id || !fork->dir) {
        sbx_msg_destroy (&capture);
        s_fail (fork, SBX_E_INTERNAL, "out of memory");
    } else if (ctx->call (ctx, SBX_ROLE_VMD, fork->vmd, &capture, fork->timeout_ms, s_on_captured,
                          fork) == 0)
        return;
    else
        s_fail (fork, SBX_E_UNAVAILABLE, "its vmd %s is not connected; retry when it is back",
                fork->vmd);
    s_snap_finish (ctx, fork, NULL);
}

sbx_msg_t *brk_fork (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_fork_t *args = sbx_msg_sandbox_fork (request);
    size_t count = args->count ? (size_t) args->count : 1;
    if (args->count > BRK_FORK_MAX)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "count must be between 1 and %d", BRK_FORK_MAX);
    brk_sandbox_t source;
    sbx_msg_t *reply = NULL;
    if (brk_sandbox_find (ctx, request, args->sandbox_id, &source, &reply))
        return reply;
    //  Copies are new sandboxes: a key that may not create may not fork.
    if (request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot fork sandboxes");
    else if (!streq (source.state, "ready"))
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                   "cannot fork sandbox %s: it is %s (only a ready sandbox is "
                                   "forked%s)",
                                   source.id, source.state,
                                   streq (source.state, "stopped") ? "; resume it first" : "");
    else
        reply = s_check (ctx, &source, count, request->rid);
    s_fork_t *fork = reply ? NULL : calloc (1, sizeof *fork);
    if (!reply && !fork)
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    if (reply) {
        brk_sandbox_clear (&source);
        return reply;
    }
    fork->client = client ? zframe_dup (client) : NULL;
    fork->rid = request->rid;
    fork->request = sbx_msg_dup (request);
    fork->source_id = strdup (source.id);
    fork->vmd = source.vmd ? strdup (source.vmd) : NULL;
    fork->timeout_ms = request->timeout_ms > 1000 ? request->timeout_ms - 500 : S_CAPTURE_MS;
    fork->count = count;
    fork->asked_mono = sbx_clock_mono_ms ();
    bool ok = fork->request && fork->source_id && fork->vmd;
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_snap_begin_t *body = begin ? sbx_msg_snap_begin (begin) : NULL;
    for (size_t i = 0; ok && i < count; i++) {
        fork->copies[i].fork = fork;
        fork->copies[i].index = i;
        fork->ids[i] = sbx_secret_id ("sb_");
        ok = fork->ids[i] && body;
        if (ok)
            sbx_strlist_append (&body->users, fork->ids[i]);
    }
    if (!ok || !body) {
        sbx_msg_destroy (&begin);
        brk_sandbox_clear (&source);
        s_fork_destroy (&fork);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    //  The copies stand on the capture from the start (snapshotd records them as users):
    //  nothing removes it before they are made, and it goes with the last of them.
    sbx_str_set (&body->account, source.account_id);
    sbx_str_set (&body->sandbox_id, source.id);
    sbx_str_set (&body->key_id, source.key_id);
    sbx_sandbox_type_from_name (source.type, &body->type);
    body->kind = SBX_SNAPSHOT_KIND_FORK;
    char name[160];
    snprintf (name, sizeof name, "fork of %s", source.label ? source.label : source.id);
    sbx_str_set (&body->name, name);
    sbx_info ("rid=%llu sandbox=%s account=%s forking into %zu copies",
              (unsigned long long) request->rid, source.id, source.account_id, count);
    brk_sandbox_clear (&source);
    const char *store = brk_snapshot_store_of (ctx, fork->vmd);
    fork->store = store ? strdup (store) : NULL;
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, fork->store, &begin, S_SNAPSHOTD_MS, s_on_begun,
                   fork) == 0)
        return NULL;
    s_fork_destroy (&fork);
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "no snapshotd is connected to the broker; forks need it (their "
                              "copies stand on a capture it keeps)");
}
