/*  brk_snapshot - see brk_snapshot.h */
#include "brk_snapshot.h"
#include "brk_limits.h"
#include "brk_sandbox.h"
#include "sbx_secret.h"

//  snapshotd answers from its catalog at once; vmd's capture takes a memory save and a
//  disk copy (seconds under TCG, more for a large disk).
#define S_SNAPSHOTD_MS 10000u
#define S_CAPTURE_MS   300000u

static void s_on_event (const sbx_event_t *event, void *arg)
{
    brk_ctx_t *ctx = arg;
    if (!event->type || !streq (event->type, "sandbox.changed"))
        return;
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (event->payload.data, event->payload.size, &err);
    sbx_sandbox_changed_t *changed = sbx_msg_sandbox_changed (msg);
    if (changed && changed->to == SBX_SANDBOX_STATE_STOPPED) {
        brk_sandbox_t record;
        if (brk_store_sandbox_find (ctx->store, changed->sandbox_id, &record) == 0) {
            brk_snapshot_automatic (ctx, &record);
            brk_sandbox_clear (&record);
        }
    } else if (changed && changed->to == SBX_SANDBOX_STATE_DELETED)
        brk_snapshot_release (ctx, changed->sandbox_id);
    sbx_msg_destroy (&msg);
}

int brk_snapshot_start (brk_ctx_t *ctx)
{
    return brk_events_listen (ctx->events, s_on_event, ctx);
}

//  --------------------------------------------------------------------------
//  A sandbox made from a snapshot: snap.use, then brk_sandbox_create_from

//  A create from a snapshot waiting for snapshotd.
typedef struct {
    zframe_t *client;
    sbx_msg_t *request;
    brk_origin_t *origin;
} s_from_snapshot_t;

static void s_from_snapshot_destroy (s_from_snapshot_t **wait_p)
{
    s_from_snapshot_t *wait = *wait_p;
    if (!wait)
        return;
    zframe_destroy (&wait->client);
    sbx_msg_destroy (&wait->request);
    brk_origin_destroy (&wait->origin);
    free (wait);
    *wait_p = NULL;
}

//  Which vmd a sandbox made from the snapshot goes to: a host that keeps a copy, with
//  its vmd connected (the one of the sandbox it was saved from first); when none is (a
//  catalog from before hosts, other names on one machine, or the copies' hosts away),
//  the sandbox's vmd, which wrote the files. NULL when none. Fresh.
static char *s_copy_host (brk_ctx_t *ctx, const sbx_strlist_t *hosts, const char *saved_vmd)
{
    const char *pick = NULL;
    for (size_t i = 0; i < hosts->count; i++)
        if (brk_registry_find (ctx->registry, SBX_ROLE_VMD, hosts->items[i]) &&
            (!pick || (saved_vmd && streq (hosts->items[i], saved_vmd))))
            pick = hosts->items[i];
    if (!pick)
        pick = saved_vmd;
    return pick ? strdup (pick) : NULL;
}

const char *brk_snapshot_store_of (brk_ctx_t *ctx, const char *vmd)
{
    return vmd && brk_registry_find (ctx->registry, SBX_ROLE_SNAPSHOTD, vmd) ? vmd : NULL;
}

static void s_on_snapshot_use (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_from_snapshot_t *wait = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *request = wait->request;
    sbx_msg_t *reply = NULL;
    if (answer->type == SBX_MSG_ERROR)
        reply = sbx_msg_new_error (request->rid, sbx_msg_error (answer)->code, "%s",
                                   sbx_msg_error (answer)->message);
    else {
        sbx_snap_use_ok_t *use = sbx_msg_snap_use_ok (answer);
        sbx_sandbox_create_t *args = sbx_msg_sandbox_create (request);
        brk_origin_t *origin = wait->origin;
        origin->dir = strdup (use->dir);
        if (use->snapshot->qemu_version)
            origin->qemu_version = strdup (use->snapshot->qemu_version);
        if (use->snapshot->image)
            origin->image = strdup (use->snapshot->image);
        origin->snapshot_id = strdup (use->snapshot->id);
        origin->type = use->snapshot->type ? use->snapshot->type : SBX_SANDBOX_TYPE_SMALL;
        //  A host that keeps a whole copy, with its vmd connected: the one the sandbox it
        //  was saved from is on first. Without hosts in the catalog's answer (names that
        //  no vmd has: one machine), that sandbox's vmd, which wrote the files.
        brk_sandbox_t saved_from;
        char *saved_vmd = NULL;
        if (use->snapshot->sandbox_id &&
            brk_store_sandbox_find (ctx->store, use->snapshot->sandbox_id, &saved_from) == 0) {
            if (saved_from.vmd)
                saved_vmd = strdup (saved_from.vmd);
            brk_sandbox_clear (&saved_from);
        }
        origin->vmd = s_copy_host (ctx, &use->snapshot->hosts, saved_vmd);
        free (saved_vmd);
        if (args->type && args->type != origin->type)
            reply = sbx_msg_new_error (
                request->rid, SBX_E_INVALID_ARGUMENT,
                "snapshot %s was saved from a %s sandbox: create it as %s (or give no type)",
                use->snapshot->id, sbx_sandbox_type_name (origin->type),
                sbx_sandbox_type_name (origin->type));
        else if (!origin->dir || !origin->snapshot_id)
            reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
        else
            reply = brk_sandbox_create_from (ctx, wait->client, request, origin);
        //  Refused before vmd was asked: the new sandbox does not stand on the snapshot.
        if (reply && reply->type == SBX_MSG_ERROR)
            brk_snapshot_release (ctx, origin->sandbox_id);
    }
    if (reply && wait->client)
        ctx->send (ctx, wait->client, &reply);
    sbx_msg_destroy (&reply);
    s_from_snapshot_destroy (&wait);
}

static void s_add_admin (const brk_account_t *account, void *arg)
{
    sbx_strlist_t *admins = arg;
    if (account->admin && admins->count < 64)
        sbx_strlist_append (admins, account->id);
}

sbx_msg_t *brk_snapshot_create (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_sandbox_create_t *args = sbx_msg_sandbox_create (request);
    //  From a snapshot: snapshotd checks that it is the account's and ready, and records
    //  the new sandbox as standing on it, before anything else happens.
    const sbx_caller_t *caller = request->caller;
    if (!caller || !caller->account_id)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "sandbox.create carries no caller account");
    if (caller->preset == SBX_KEY_PRESET_READ_ONLY)
        return brk_sandbox_refuse_create (request);
    //  snapshotd knows accounts by id; an operator may have named it by email.
    brk_account_t owner;
    sbx_msg_t *refused = brk_sandbox_owner (ctx, request, &owner);
    if (refused)
        return refused;
    s_from_snapshot_t *wait = calloc (1, sizeof *wait);
    sbx_msg_t *use = sbx_msg_new (SBX_MSG_SNAP_USE);
    if (wait) {
        wait->origin = calloc (1, sizeof (brk_origin_t));
        wait->client = client ? zframe_dup (client) : NULL;
        wait->request = sbx_msg_dup (request);
        if (wait->origin)
            wait->origin->sandbox_id = sbx_secret_id ("sb_");
    }
    if (!wait || !wait->origin || !wait->request || !wait->origin->sandbox_id || !use) {
        s_from_snapshot_destroy (&wait);
        sbx_msg_destroy (&use);
        brk_account_clear (&owner);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, args->snapshot_id);
    sbx_str_set (&sbx_msg_snap_use (use)->template, args->snapshot_id ? NULL : args->template);
    //  The operator's published templates: those of the admin accounts (snapshotd takes
    //  one only when the account has no template of that name, and only if it is
    //  labelled sbx.template.public=true).
    if (!args->snapshot_id && args->template)
        brk_store_account_list (ctx->store, s_add_admin, &sbx_msg_snap_use (use)->public_accounts);
    sbx_str_set (&sbx_msg_snap_use (use)->account, owner.id);
    brk_account_clear (&owner);
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, wait->origin->sandbox_id);
    //  A ci key copies only snapshots of sandboxes it created, as it sees only those.
    if (caller->preset == SBX_KEY_PRESET_CI && caller->kind != SBX_CALLER_KIND_ADMIN &&
        caller->kind != SBX_CALLER_KIND_SYSTEM)
        sbx_str_set (&sbx_msg_snap_use (use)->key_id, caller->key_id ? caller->key_id : "");
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &use, 10000, s_on_snapshot_use, wait) == 0)
        return NULL;
    s_from_snapshot_destroy (&wait);
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "no snapshotd is connected to the broker; snapshots are unavailable");
}

//  --------------------------------------------------------------------------
//  Save: snap.begin → vm.snapshot → snap.finish

typedef struct {
    zframe_t *client; //  NULL: an automatic snapshot, nobody waits
    bool automatic;
    uint64_t rid;
    uint32_t timeout_ms;
    char *sandbox_id;
    char *vmd;
    char *store; //  the snapshotd of the vmd's host (NULL: any, one machine)
    char *snapshot_id;
    sbx_code_t code; //  the failure the user hears about, SBX_OK while none
    char message[1024];
} s_save_t;

static void s_save_destroy (s_save_t **op_p)
{
    s_save_t *op = *op_p;
    if (!op)
        return;
    zframe_destroy (&op->client);
    free (op->sandbox_id);
    free (op->vmd);
    free (op->store);
    free (op->snapshot_id);
    free (op);
    *op_p = NULL;
}

static void s_answer (brk_ctx_t *ctx, s_save_t *op, sbx_msg_t **reply_p)
{
    if (op->client && *reply_p)
        ctx->send (ctx, op->client, reply_p);
    sbx_msg_destroy (reply_p);
}

//  snapshot.saved or snapshot.deleted in the event log, for the tap's readers (webhooks):
//  snapshotd's catalog changed already, so a failure here is logged, not undone.
static void s_record (brk_ctx_t *ctx, const sbx_snapshot_info_t *info, bool saved)
{
    if (!info || !info->id || !info->account)
        return;
    sbx_msg_t *event = sbx_msg_new (saved ? SBX_MSG_SNAPSHOT_SAVED : SBX_MSG_SNAPSHOT_DELETED);
    if (saved) {
        sbx_snapshot_saved_t *e = sbx_msg_snapshot_saved (event);
        sbx_str_set (&e->snapshot_id, info->id);
        sbx_str_set (&e->sandbox_id, info->sandbox_id);
        sbx_str_set (&e->name, info->name);
        e->disk_bytes = info->disk_bytes;
        e->memory_bytes = info->memory_bytes;
    } else {
        sbx_str_set (&sbx_msg_snapshot_deleted (event)->snapshot_id, info->id);
        sbx_str_set (&sbx_msg_snapshot_deleted (event)->sandbox_id, info->sandbox_id);
    }
    if (brk_events_begin (ctx->events) ||
        brk_events_add (ctx->events, &event, info->account, info->id) ||
        brk_events_commit (ctx->events)) {
        brk_events_rollback (ctx->events);
        sbx_msg_destroy (&event);
        sbx_error ("snapshot=%s cannot record that it was %s", info->id,
                   saved ? "saved" : "deleted");
    }
}

static void s_on_released (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    (void) ctx;
    (void) arg;
    if ((*answer_p)->type == SBX_MSG_ERROR)
        sbx_warn ("cannot remove automatic snapshots: %s", sbx_msg_error (*answer_p)->message);
}

static void s_on_finish (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_save_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *reply = NULL;
    if (op->code != SBX_OK)
        reply = sbx_msg_new_error (op->rid, op->code, "cannot save sandbox %s: %s", op->sandbox_id,
                                   op->message);
    else if (answer->type == SBX_MSG_ERROR)
        reply =
            sbx_msg_new_error (op->rid, sbx_msg_error (answer)->code, "cannot save sandbox %s: %s",
                               op->sandbox_id, sbx_msg_error (answer)->message);
    else {
        reply = sbx_msg_new (SBX_MSG_SNAPSHOT_SAVE_OK);
        if (reply) {
            reply->rid = op->rid;
            //  The snapshot moves from snapshotd's answer into ours.
            sbx_msg_snapshot_save_ok (reply)->snapshot = sbx_msg_snap_finish_ok (answer)->snapshot;
            sbx_msg_snap_finish_ok (answer)->snapshot = NULL;
            if (!op->automatic)
                s_record (ctx, sbx_msg_snapshot_save_ok (reply)->snapshot, true);
        }
        sbx_info ("rid=%llu snapshot=%s of sandbox %s saved%s", (unsigned long long) op->rid,
                  op->snapshot_id, op->sandbox_id, op->automatic ? " (automatic)" : "");
        //  One automatic snapshot per sandbox: the newest.
        if (op->automatic) {
            sbx_msg_t *release = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
            sbx_str_set (&sbx_msg_snap_release (release)->sandbox_id, op->sandbox_id);
            sbx_str_set (&sbx_msg_snap_release (release)->keep, op->snapshot_id);
            ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &release, S_SNAPSHOTD_MS, s_on_released,
                       NULL);
        }
    }
    if (op->automatic && reply && reply->type == SBX_MSG_ERROR)
        sbx_warn ("automatic snapshot of sandbox %s failed: %s", op->sandbox_id,
                  sbx_msg_error (reply)->message);
    s_answer (ctx, op, &reply);
    s_save_destroy (&op);
}

//  Ends a save with snapshotd: ready, or failed with op's reason.
static void s_finish (brk_ctx_t *ctx, s_save_t *op, const sbx_vm_snapshot_ok_t *done)
{
    sbx_msg_t *finish = sbx_msg_new (SBX_MSG_SNAP_FINISH);
    sbx_snap_finish_t *body = sbx_msg_snap_finish (finish);
    sbx_str_set (&body->snapshot_id, op->snapshot_id);
    if (op->code != SBX_OK)
        sbx_str_set (&body->error, op->message);
    else if (done) {
        body->disk_bytes = done->disk_bytes;
        body->memory_bytes = done->memory_bytes;
        sbx_str_set (&body->image, done->image);
        sbx_str_set (&body->qemu_version, done->qemu_version);
    }
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, op->store, &finish, S_SNAPSHOTD_MS, s_on_finish, op) ==
        0)
        return;
    //  snapshotd went away during the capture: when it comes back it fails the record.
    sbx_msg_t *reply = sbx_msg_new_error (
        op->rid, SBX_E_UNAVAILABLE,
        "cannot save sandbox %s: snapshotd went away during the save%s%s", op->sandbox_id,
        op->code != SBX_OK ? " and " : "", op->code != SBX_OK ? op->message : "");
    sbx_warn ("snapshot=%s of sandbox %s: snapshotd gone before the save ended", op->snapshot_id,
              op->sandbox_id);
    s_answer (ctx, op, &reply);
    s_save_destroy (&op);
}

static void s_fail (s_save_t *op, sbx_code_t code, const char *message)
{
    if (op->code == SBX_OK) {
        op->code = code;
        snprintf (op->message, sizeof op->message, "%s", message);
    }
}

static void s_on_captured (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_save_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type == SBX_MSG_ERROR)
        s_fail (op, sbx_msg_error (answer)->code, sbx_msg_error (answer)->message);
    s_finish (ctx, op,
              answer->type == SBX_MSG_VM_SNAPSHOT_OK ? sbx_msg_vm_snapshot_ok (answer) : NULL);
}

static void s_on_begun (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_save_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type == SBX_MSG_ERROR) {
        sbx_msg_t *reply =
            sbx_msg_new_error (op->rid, sbx_msg_error (answer)->code, "cannot save sandbox %s: %s",
                               op->sandbox_id, sbx_msg_error (answer)->message);
        s_answer (ctx, op, &reply);
        s_save_destroy (&op);
        return;
    }
    sbx_snap_begin_ok_t *begun = sbx_msg_snap_begin_ok (answer);
    op->snapshot_id = strdup (begun->snapshot_id);
    sbx_msg_t *capture = sbx_msg_new (SBX_MSG_VM_SNAPSHOT);
    sbx_str_set (&sbx_msg_vm_snapshot (capture)->sandbox_id, op->sandbox_id);
    sbx_str_set (&sbx_msg_vm_snapshot (capture)->dir, begun->dir);
    if (!op->snapshot_id) {
        sbx_msg_destroy (&capture);
        s_fail (op, SBX_E_INTERNAL, "out of memory");
    } else if (ctx->call (ctx, SBX_ROLE_VMD, op->vmd, &capture, op->timeout_ms, s_on_captured,
                          op) == 0)
        return;
    else {
        char message[300];
        snprintf (message, sizeof message, "its vmd %s is not connected; retry when it is back",
                  op->vmd);
        s_fail (op, SBX_E_UNAVAILABLE, message);
    }
    s_finish (ctx, op, NULL);
}

//  Starts a save of `record` (snap.begin); takes op. 0, or -1 when no snapshotd is
//  connected (op destroyed).
static int s_begin (brk_ctx_t *ctx, s_save_t *op, const brk_sandbox_t *record, const char *name,
                    const sbx_strmap_t *labels)
{
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    op->sandbox_id = strdup (record->id);
    op->vmd = record->vmd ? strdup (record->vmd) : NULL;
    const char *store = brk_snapshot_store_of (ctx, op->vmd);
    op->store = store ? strdup (store) : NULL;
    sbx_snap_begin_t *body = sbx_msg_snap_begin (begin);
    sbx_str_set (&body->account, record->account_id);
    sbx_str_set (&body->sandbox_id, record->id);
    //  A ci key later sees the snapshot when it created the sandbox (snapshotd checks).
    sbx_str_set (&body->key_id, record->key_id);
    sbx_sandbox_type_from_name (record->type, &body->type);
    body->kind = op->automatic ? SBX_SNAPSHOT_KIND_AUTOMATIC : SBX_SNAPSHOT_KIND_USER;
    sbx_str_set (&body->name, name);
    for (size_t i = 0; labels && i < labels->count; i++)
        sbx_strmap_set (&body->labels, labels->keys[i], labels->values[i]);
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, op->store, &begin, S_SNAPSHOTD_MS, s_on_begun, op) == 0)
        return 0;
    s_save_destroy (&op);
    return -1;
}

void brk_snapshot_automatic (brk_ctx_t *ctx, const brk_sandbox_t *sandbox)
{
    s_save_t *op = calloc (1, sizeof *op);
    if (!op)
        return;
    op->automatic = true;
    op->timeout_ms = S_CAPTURE_MS;
    if (s_begin (ctx, op, sandbox, "automatic at stop", NULL))
        sbx_debug ("sandbox=%s no automatic snapshot: no snapshotd", sandbox->id);
}

void brk_snapshot_release (brk_ctx_t *ctx, const char *sandbox_id)
{
    sbx_msg_t *release = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
    sbx_str_set (&sbx_msg_snap_release (release)->sandbox_id, sandbox_id);
    sbx_msg_snap_release (release)->deleted = true;
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &release, S_SNAPSHOTD_MS, s_on_released, NULL))
        sbx_warn ("sandbox=%s deleted; its automatic snapshots stay (no snapshotd)", sandbox_id);
}

//  A user's save waiting for snapshotd's list of the account's snapshots (the plan's
//  `snapshots` limit, and for a template's save its `template_bytes`) before it begins.
typedef struct {
    s_save_t *op;
    sbx_msg_t *request; //  the client's snapshot.save
    uint64_t limit;     //  snapshots kept; 0: none
    uint64_t bytes;     //  bytes of templates and cached steps; 0: none
    char plan[64];
} s_quota_t;

//  bytes for people: "N bytes" under a MiB, else "N.N MiB".
static void s_size (uint64_t bytes, char *out, size_t size)
{
    if (bytes < (1u << 20))
        snprintf (out, size, "%llu bytes", (unsigned long long) bytes);
    else
        snprintf (out, size, "%.1f MiB", (double) bytes / (1024.0 * 1024.0));
}

//  A template's snapshot, or a cached step of a build (sbx template build's labels).
static bool s_template_labels (const sbx_strmap_t *labels)
{
    return sbx_strmap_get (labels, "sbx.template") || sbx_strmap_get (labels, "sbx.template.cache");
}

static void s_quota_destroy (s_quota_t **quota_p)
{
    s_quota_t *quota = *quota_p;
    if (!quota)
        return;
    s_save_destroy (&quota->op);
    sbx_msg_destroy (&quota->request);
    free (quota);
    *quota_p = NULL;
}

//  Starts a user's save of `record` (snap.begin); takes op. The error reply, or NULL.
static sbx_msg_t *s_begin_user (brk_ctx_t *ctx, s_save_t *op, const brk_sandbox_t *record,
                                sbx_msg_t *request)
{
    sbx_snapshot_save_t *args = sbx_msg_snapshot_save (request);
    if (s_begin (ctx, op, record, args->name, &args->labels) == 0)
        return NULL;
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "no snapshotd is connected to the broker; snapshots are unavailable");
}

static void s_on_counted (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_quota_t *quota = arg;
    sbx_msg_t *answer = *answer_p;
    sbx_msg_t *request = quota->request;
    sbx_msg_t *reply = NULL;
    uint64_t kept = 0, held = 0;
    if (answer->type == SBX_MSG_ERROR)
        reply = sbx_msg_new_error (request->rid, sbx_msg_error (answer)->code,
                                   "cannot count the account's snapshots: %s",
                                   sbx_msg_error (answer)->message);
    else {
        sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (answer)->snapshots;
        for (size_t i = 0; i < list->count; i++)
            //  Only the user's own count: a stop's and a fork's are not theirs to keep.
            if (list->items[i].kind != SBX_SNAPSHOT_KIND_AUTOMATIC &&
                list->items[i].kind != SBX_SNAPSHOT_KIND_FORK &&
                list->items[i].state != SBX_SNAPSHOT_STATE_FAILED) {
                kept++;
                if (s_template_labels (&list->items[i].labels))
                    held += list->items[i].disk_bytes + list->items[i].memory_bytes;
            }
    }
    brk_sandbox_t record;
    if (reply)
        ;
    else if (quota->bytes && held >= quota->bytes) {
        char limit[32], holds[32];
        s_size (quota->bytes, limit, sizeof limit);
        s_size (held, holds, sizeof holds);
        reply = sbx_msg_new_error (
            request->rid, SBX_E_LIMIT_EXCEEDED,
            "the %s plan keeps %s of templates and cached build steps per account, and this "
            "account's hold %s; delete a template (sbx template delete) or cached steps "
            "(snapshots labelled sbx.template.cache) first",
            quota->plan, limit, holds);
    } else if (quota->limit && kept >= quota->limit)
        reply = sbx_msg_new_error (request->rid, SBX_E_LIMIT_EXCEEDED,
                                   "the %s plan keeps %llu snapshot%s per account; delete one "
                                   "first (list_snapshots shows them)",
                                   quota->plan, (unsigned long long) quota->limit,
                                   quota->limit == 1 ? "" : "s");
    //  The sandbox may have moved meanwhile: it must still be there to save.
    else if (brk_store_sandbox_find (ctx->store, sbx_msg_snapshot_save (request)->sandbox_id,
                                     &record) != 0)
        reply = sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is gone",
                                   sbx_msg_snapshot_save (request)->sandbox_id);
    else {
        s_save_t *op = quota->op;
        quota->op = NULL;
        zframe_t *client = op->client ? zframe_dup (op->client) : NULL;
        reply = s_begin_user (ctx, op, &record, request); //  takes op
        brk_sandbox_clear (&record);
        if (reply && client)
            ctx->send (ctx, client, &reply);
        sbx_msg_destroy (&reply);
        zframe_destroy (&client);
    }
    if (reply)
        s_answer (ctx, quota->op, &reply);
    s_quota_destroy (&quota);
}

//  With a plan limit on snapshots, asks snapshotd for the account's first (as the
//  system naming it) and begins once under it; else begins at once. Takes op.
static sbx_msg_t *s_save_checked (brk_ctx_t *ctx, s_save_t *op, const brk_sandbox_t *record,
                                  sbx_msg_t *request)
{
    brk_account_t account;
    brk_plan_t plan = {.unlimited = true};
    char plan_name[64] = "free";
    if (brk_store_account_find (ctx->store, record->account_id, &account) == 0) {
        brk_limits_plan (ctx->config, &account, &plan);
        if (account.plan && *account.plan)
            snprintf (plan_name, sizeof plan_name, "%s", account.plan);
        brk_account_clear (&account);
    }
    bool template = s_template_labels (&sbx_msg_snapshot_save (request)->labels);
    if (plan.unlimited || (!plan.snapshots && !(template && plan.template_bytes)))
        return s_begin_user (ctx, op, record, request);
    s_quota_t *quota = calloc (1, sizeof *quota);
    sbx_msg_t *list = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
    if (list)
        list->caller = calloc (1, sizeof (sbx_caller_t));
    if (quota) {
        quota->op = op;
        quota->request = sbx_msg_dup (request);
        quota->limit = plan.snapshots;
        quota->bytes = template ? plan.template_bytes : 0;
        snprintf (quota->plan, sizeof quota->plan, "%s", plan_name);
    } else
        s_save_destroy (&op);
    if (!quota || !quota->request || !list || !list->caller) {
        s_quota_destroy (&quota);
        sbx_msg_destroy (&list);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    list->caller->kind = SBX_CALLER_KIND_SYSTEM;
    sbx_str_set (&list->caller->account_id, record->account_id);
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &list, S_SNAPSHOTD_MS, s_on_counted, quota) == 0)
        return NULL;
    s_quota_destroy (&quota);
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "no snapshotd is connected to the broker; snapshots are unavailable");
}

sbx_msg_t *brk_snapshot_save (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    sbx_snapshot_save_t *args = sbx_msg_snapshot_save (request);
    brk_sandbox_t record;
    sbx_msg_t *reply = NULL;
    if (brk_sandbox_find (ctx, request, args->sandbox_id, &record, &reply))
        return reply;
    if (request->caller->preset == SBX_KEY_PRESET_READ_ONLY)
        reply = sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                   "this key is read-only: it cannot save snapshots");
    else if (!streq (record.state, "ready") && !streq (record.state, "stopped"))
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                   "cannot save sandbox %s: it is %s (a snapshot needs a ready or "
                                   "stopped sandbox)",
                                   record.id, record.state);
    s_save_t *op = reply ? NULL : calloc (1, sizeof *op);
    if (op) {
        op->client = client ? zframe_dup (client) : NULL;
        op->rid = request->rid;
        op->timeout_ms = request->timeout_ms > 1000 ? request->timeout_ms - 500 : S_CAPTURE_MS;
        reply = s_save_checked (ctx, op, &record, request);
    } else if (!reply)
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    brk_sandbox_clear (&record);
    return reply;
}

sbx_msg_t *brk_snapshot_list_account (brk_ctx_t *ctx, sbx_msg_t *request)
{
    sbx_caller_t *caller = request->caller;
    //  list_templates: the operator's published templates come from the admin accounts.
    sbx_snapshot_list_t *args = sbx_msg_snapshot_list (request);
    sbx_strlist_clear (&args->public_accounts); //  the broker's to name, never the caller's
    if (args->published)
        brk_store_account_list (ctx->store, s_add_admin, &args->public_accounts);
    bool operator=
        caller && (caller->kind == SBX_CALLER_KIND_ADMIN || caller->kind == SBX_CALLER_KIND_SYSTEM);
    if (!operator|| !caller->account_id)
        return NULL; //  snapshotd answers for the caller's own account (or all)
    brk_account_t account;
    int found = brk_store_account_find (ctx->store, caller->account_id, &account);
    if (found != 0)
        return sbx_msg_new_error (request->rid, found < 0 ? SBX_E_INTERNAL : SBX_E_NOT_FOUND,
                                  "no account '%s'", caller->account_id);
    sbx_str_set (&caller->account_id, account.id);
    brk_account_clear (&account);
    return NULL;
}

//  --------------------------------------------------------------------------
//  Delete: snapshot.get (its users) → the broker's check → snapshot.delete

typedef struct {
    zframe_t *client;
    uint64_t rid;
    sbx_msg_t *request; //  the client's, sent on to snapshotd once allowed
} s_delete_t;

static void s_delete_destroy (s_delete_t **op_p)
{
    s_delete_t *op = *op_p;
    if (!op)
        return;
    zframe_destroy (&op->client);
    sbx_msg_destroy (&op->request);
    free (op);
    *op_p = NULL;
}

//  Hands snapshotd's answer to the client under the client's rid.
static void s_relay (brk_ctx_t *ctx, s_delete_t *op, sbx_msg_t *answer)
{
    sbx_msg_t *reply = sbx_msg_dup (answer);
    if (reply) {
        reply->rid = op->rid;
        if (op->client)
            ctx->send (ctx, op->client, &reply);
    }
    sbx_msg_destroy (&reply);
}

static void s_on_deleted (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_delete_t *op = arg;
    if ((*answer_p)->type == SBX_MSG_SNAPSHOT_DELETE_OK)
        s_record (ctx, sbx_msg_snapshot_delete_ok (*answer_p)->snapshot, false);
    s_relay (ctx, op, *answer_p);
    s_delete_destroy (&op);
}

static void s_on_users (brk_ctx_t *ctx, sbx_msg_t **answer_p, void *arg)
{
    s_delete_t *op = arg;
    sbx_msg_t *answer = *answer_p;
    if (answer->type == SBX_MSG_ERROR) {
        s_relay (ctx, op, answer);
        s_delete_destroy (&op);
        return;
    }
    sbx_snapshot_info_t *snapshot = sbx_msg_snapshot_get_ok (answer)->snapshot;
    sbx_msg_t *reply = NULL;
    //  A sandbox made from it that is not deleted still has its disk on it.
    for (size_t i = 0; !reply && i < snapshot->users.count; i++) {
        brk_sandbox_t user;
        if (brk_store_sandbox_find (ctx->store, snapshot->users.items[i], &user) != 0)
            continue;
        if (!streq (user.state, "deleted"))
            reply = sbx_msg_new_error (
                op->rid, SBX_E_CONFLICT,
                "snapshot %s is in use: sandbox %s (%s, %s) was made from it and its disk stands "
                "on the snapshot's; delete the sandbox first",
                snapshot->id, user.id, user.label ? user.label : "", user.state);
        brk_sandbox_clear (&user);
    }
    if (reply) {
        if (op->client)
            ctx->send (ctx, op->client, &reply);
        sbx_msg_destroy (&reply);
        s_delete_destroy (&op);
        return;
    }
    sbx_msg_t *request = op->request;
    op->request = NULL;
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &request, S_SNAPSHOTD_MS, s_on_deleted, op) == 0)
        return;
    reply = sbx_msg_new_error (op->rid, SBX_E_UNAVAILABLE,
                               "no snapshotd is connected to the broker; retry in a moment");
    if (op->client)
        ctx->send (ctx, op->client, &reply);
    sbx_msg_destroy (&reply);
    s_delete_destroy (&op);
}

sbx_msg_t *brk_snapshot_delete (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request)
{
    const sbx_caller_t *caller = request->caller;
    if (!caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "snapshot.delete carries no caller identity");
    if (caller->preset == SBX_KEY_PRESET_READ_ONLY || caller->preset == SBX_KEY_PRESET_NO_DELETE)
        return sbx_msg_new_error (request->rid, SBX_E_PERMISSION_DENIED,
                                  "this key's preset is %s: it cannot delete snapshots",
                                  sbx_key_preset_name (caller->preset));
    s_delete_t *op = calloc (1, sizeof *op);
    sbx_msg_t *get = sbx_msg_new (SBX_MSG_SNAPSHOT_GET);
    if (op) {
        op->client = client ? zframe_dup (client) : NULL;
        op->rid = request->rid;
        op->request = sbx_msg_dup (request);
    }
    if (!op || !get || !op->request) {
        s_delete_destroy (&op);
        sbx_msg_destroy (&get);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    //  Asked as the client: another account's snapshot is not_found here too.
    get->caller = calloc (1, sizeof (sbx_caller_t));
    if (get->caller) {
        get->caller->kind = caller->kind;
        get->caller->preset = caller->preset;
        sbx_str_set (&get->caller->account_id, caller->account_id);
        sbx_str_set (&get->caller->key_id, caller->key_id);
    }
    sbx_str_set (&sbx_msg_snapshot_get (get)->snapshot_id,
                 sbx_msg_snapshot_delete (request)->snapshot_id);
    if (ctx->call (ctx, SBX_ROLE_SNAPSHOTD, NULL, &get, S_SNAPSHOTD_MS, s_on_users, op) == 0)
        return NULL;
    s_delete_destroy (&op);
    return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                              "no snapshotd is connected to the broker; snapshots are unavailable");
}
