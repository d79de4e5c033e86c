/*  snap_server - see snap_server.h */
#include "snap_server.h"
#include "sbx_api.h"
#include "snap_store.h"
#include "sbx_dqproxy.h"
#include "sbx_secret.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_LABELS 64

struct _snap_server_t {
    snap_store_t *store;
    char *root; //  DIR/snapshots
    //  A cluster's snapshotd (control.nodes set): the catalog is the cluster's, shared by
    //  the snapshotd of every host; each removes the files of its own host.
    sbx_dqproxy_t *proxy;
    char **nodes;
    zloop_t *loop; //  borrowed, from start
    int timer;
};

//  How often a host looks for removals queued by a delete on another host.
#define S_REMOVALS_MS   2000
#define S_STORE_WAIT_MS 15000

//  --------------------------------------------------------------------------
//  Files

static char *s_dir (snap_server_t *self, const char *id)
{
    return zsys_sprintf ("%s/%s", self->root, id);
}

//  Removes a snapshot's directory and what is in it (files only: vmd writes no
//  subdirectories). Missing is fine.
static void s_remove_files (snap_server_t *self, const char *id)
{
    char *dir = s_dir (self, id);
    DIR *handle = dir ? opendir (dir) : NULL;
    if (handle) {
        struct dirent *entry;
        while ((entry = readdir (handle)))
            if (!streq (entry->d_name, ".") && !streq (entry->d_name, "..")) {
                char *path = zsys_sprintf ("%s/%s", dir, entry->d_name);
                if (path && unlink (path) == -1)
                    sbx_warn ("snapshot=%s cannot remove %s: %s", id, path, strerror (errno));
                free (path);
            }
        closedir (handle);
    }
    if (dir && rmdir (dir) == -1 && errno != ENOENT)
        sbx_warn ("snapshot=%s cannot remove %s: %s", id, dir, strerror (errno));
    free (dir);
}

static void s_sweep_orphans (snap_server_t *self, const char *id, sbx_strlist_t *removed);
static void s_sweep_forks (snap_server_t *self);

static void s_on_failed_at_start (const char *id, void *arg)
{
    sbx_warn ("snapshot=%s was being saved when snapshotd stopped: failed", id);
    s_remove_files ((snap_server_t *) arg, id);
}

//  Directories the catalog does not know as this host's (a copy, or a save of this host
//  in progress): leftovers of a crash, of a copy that did not finish, or of a delete on
//  another host while this one was away.
static bool s_keep_dir (snap_server_t *self, const char *id)
{
    if (snap_store_has_copy (self->store, id, NULL) != 0)
        return true; //  a copy, or the catalog did not answer: kept
    snap_record_t record;
    int rc = snap_store_find (self->store, id, &record);
    bool saving = rc == 0 && streq (record.state, "saving") &&
                  streq (record.host ? record.host : "", snap_store_host (self->store));
    if (rc == 0)
        snap_record_clear (&record);
    return rc < 0 || saving;
}

static void s_sweep (snap_server_t *self)
{
    DIR *handle = opendir (self->root);
    if (!handle)
        return;
    zlist_t *gone = zlist_new ();
    zlist_autofree (gone);
    struct dirent *entry;
    while ((entry = readdir (handle))) {
        if (strncmp (entry->d_name, "snap_", 5) != 0)
            continue;
        if (!s_keep_dir (self, entry->d_name))
            zlist_append (gone, entry->d_name); //  autofree: copied
    }
    closedir (handle);
    for (char *id = zlist_first (gone); id; id = zlist_next (gone)) {
        sbx_info ("snapshot=%s leftover files removed", id);
        s_remove_files (self, id);
    }
    zlist_destroy (&gone);
}

//  A cluster's catalog, through the cluster key's TLS to control.nodes. NULL (logged).
static snap_store_t *s_cluster_store (snap_server_t *self, sbx_config_t *config, const char *host)
{
    sbx_dqlite_cluster_t where;
    if (sbx_dqproxy_cluster (config, &self->nodes, &self->proxy, &where))
        return NULL;
    //  At a cluster's first start its nodes may still be electing a leader: wait a while
    //  rather than fail (and be restarted) at once.
    snap_store_t *store = NULL;
    uint64_t until = sbx_clock_mono_ms () + S_STORE_WAIT_MS;
    while (!(store = snap_store_new_cluster (&where, host)) && sbx_clock_mono_ms () < until &&
           !zsys_interrupted)
        zclock_sleep (500);
    if (store)
        sbx_info ("snapshot catalog on the cluster's database (control.nodes %s), host %s",
                  sbx_config_get (config, "control.nodes", ""), host);
    //  The first node of a cluster made from one machine: its catalog is copied in once.
    char *file = sbx_config_path (config, "snapshotd/snapshots.db");
    char err[512] = "";
    int copied = store && file && access (file, F_OK) == 0
                     ? snap_store_import (store, file, err, sizeof err)
                     : 0;
    if (copied < 0) {
        sbx_error ("cannot copy this machine's snapshot catalog into the cluster: %s", err);
        snap_store_destroy (&store);
    } else if (copied > 0) {
        const char *suffixes[] = {"", "-wal", "-shm"};
        for (size_t i = 0; i < 3; i++) {
            char from[PATH_MAX], aside[PATH_MAX];
            snprintf (from, sizeof from, "%s%s", file, suffixes[i]);
            snprintf (aside, sizeof aside, "%s.imported%s", file, suffixes[i]);
            rename (from, aside);
        }
        sbx_info ("this machine's snapshot catalog is in the cluster now: %s set aside as "
                  "%s.imported",
                  file, file);
    }
    free (file);
    return store;
}

snap_server_t *snap_server_new (sbx_config_t *config)
{
    snap_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    const char *data = sbx_config_data_dir (config);
    const char *host = sbx_config_get (config, "instance", "local");
    const char *nodes = sbx_config_get (config, "control.nodes", NULL);
    char *own = zsys_sprintf ("%s/snapshotd", data);
    char *db = zsys_sprintf ("%s/snapshotd/snapshots.db", data);
    self->root = zsys_sprintf ("%s/snapshots", data);
    //  snapshots/ and each snapshot's directory are 0711: QEMU (its own user) opens a
    //  snapshot's disk as the backing file of a new sandbox, but lists nothing.
    if (own && mkdir (own, 0700) == -1 && errno != EEXIST)
        sbx_error ("cannot make %s: %s", own, strerror (errno));
    else if (self->root && mkdir (self->root, 0711) == -1 && errno != EEXIST)
        sbx_error ("cannot make %s: %s", self->root, strerror (errno));
    else if (nodes && *nodes)
        self->store = s_cluster_store (self, config, host);
    else if (db)
        self->store = snap_store_new (db, host);
    free (own);
    free (db);
    if (!self->store || !self->root) {
        snap_server_destroy (&self);
        return NULL;
    }
    chmod (self->root, 0711);
    int adopted = snap_store_adopt (self->store);
    if (adopted > 0)
        sbx_info ("%d snapshot(s) of the catalog from before hosts are this host's (%s)", adopted,
                  host);
    int failed =
        snap_store_fail_saving (self->store, "snapshotd stopped during the save; save it again",
                                s_on_failed_at_start, self);
    if (failed > 0)
        sbx_warn ("%d snapshot save(s) interrupted by the last stop are marked failed", failed);
    s_sweep (self);
    s_sweep_forks (self);
    return self;
}

void snap_server_destroy (snap_server_t **self_p)
{
    snap_server_t *self = *self_p;
    if (!self)
        return;
    if (self->loop && self->timer > 0)
        zloop_timer_end (self->loop, self->timer);
    snap_store_destroy (&self->store);
    sbx_dqproxy_destroy (&self->proxy);
    sbx_config_list_free (&self->nodes);
    free (self->root);
    free (self);
    *self_p = NULL;
}

//  Removals queued for this host by deletes elsewhere: their files go.
static void s_collect_removal (const char *id, void *arg)
{
    zlist_append ((zlist_t *) arg, (void *) id); //  autofree: copied
}

static void s_removals (snap_server_t *self)
{
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    snap_store_removals (self->store, s_collect_removal, ids);
    for (char *id = zlist_first (ids); id; id = zlist_next (ids)) {
        //  Ids are never reused: what the queue names is gone from the catalog.
        s_remove_files (self, id);
        if (snap_store_removal_done (self->store, id) == 0)
            sbx_info ("snapshot=%s this host's copy removed (deleted on another host)", id);
    }
    zlist_destroy (&ids);
}

static int s_on_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_removals ((snap_server_t *) arg);
    return 0;
}

int snap_server_start (snap_server_t *self, zloop_t *loop)
{
    self->loop = loop;
    s_removals (self);
    self->timer = zloop_timer (loop, S_REMOVALS_MS, 0, s_on_timer, self);
    return self->timer > 0 ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  Requests

static bool s_operator (const sbx_caller_t *caller)
{
    return caller->kind == SBX_CALLER_KIND_ADMIN || caller->kind == SBX_CALLER_KIND_SYSTEM;
}

static void s_add_label (const char *key, const char *value, void *arg)
{
    sbx_strmap_set ((sbx_strmap_t *) arg, key, value);
}

static void s_add_user (const char *id, void *arg)
{
    sbx_strlist_append ((sbx_strlist_t *) arg, id);
}

static void s_info (snap_server_t *self, const snap_record_t *record, sbx_snapshot_info_t *info,
                    bool users)
{
    sbx_str_set (&info->id, record->id);
    sbx_str_set (&info->name, record->name);
    sbx_str_set (&info->account, record->account);
    sbx_str_set (&info->sandbox_id, record->sandbox_id);
    sbx_sandbox_type_from_name (record->type, &info->type);
    sbx_snapshot_state_from_name (record->state, &info->state);
    sbx_snapshot_kind_from_name (record->kind, &info->kind);
    info->disk_bytes = record->disk_bytes;
    info->memory_bytes = record->memory_bytes;
    sbx_str_set (&info->image, record->image);
    sbx_str_set (&info->qemu_version, record->qemu_version);
    sbx_str_set (&info->parent, record->parent);
    info->created_ms = record->created_ms;
    sbx_str_set (&info->reason, record->reason);
    snap_store_labels (self->store, record->id, s_add_label, &info->labels);
    snap_store_copies (self->store, record->id, s_add_user, &info->hosts);
    if (users)
        snap_store_users (self->store, record->id, s_add_user, &info->users);
}

static sbx_snapshot_info_t *s_info_new (snap_server_t *self, const snap_record_t *record,
                                        bool users)
{
    sbx_snapshot_info_t *info = calloc (1, sizeof *info);
    if (info)
        s_info (self, record, info, users);
    return info;
}

//  Who may see a snapshot: an operator every one; anyone else the account's, and a ci
//  key (only_key set) only those of sandboxes it created, as for sandboxes.
typedef struct {
    const char *account;
    bool operator;
    const char *only_key;
} s_who_t;

static s_who_t s_who (const sbx_caller_t *caller)
{
    s_who_t who = {.account = caller->account_id, .operator= s_operator (caller)};
    if (!who.operator&& caller->preset == SBX_KEY_PRESET_CI)
        who.only_key = caller->key_id ? caller->key_id : ""; //  no key id: nothing of its own
    return who;
}

static bool s_may_see (const s_who_t *who, const snap_record_t *record)
{
    if (who->operator)
        return true;
    if (!who->account || !streq (who->account, record->account))
        return false;
    return !who->only_key || (record->key_id && streq (who->only_key, record->key_id));
}

//  Finds a snapshot `who` may see; else *error (not_found: another's is not there).
static int s_find (snap_server_t *self, const sbx_msg_t *request, const char *id,
                   const s_who_t *who, snap_record_t *record, sbx_msg_t **error)
{
    int rc = id ? snap_store_find (self->store, id, record) : 1;
    if (rc == 0 && s_may_see (who, record))
        return 0;
    if (rc == 0)
        snap_record_clear (record);
    *error = rc < 0 ? sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "snapshot lookup failed")
                    : sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                         "Snapshot %s not found; list_snapshots shows yours",
                                         id ? id : "");
    return -1;
}

typedef struct {
    snap_server_t *self;
    sbx_snapshot_info_list_t *list;
    s_who_t who;
} s_list_t;

static void s_list_one (const snap_record_t *record, void *arg)
{
    s_list_t *list = arg;
    if (!s_may_see (&list->who, record))
        return; //  a ci key's list: its own sandboxes' snapshots only
    //  A fork's capture is nothing for its user to manage (it goes with its last copy):
    //  operators see it, get finds it by id.
    if (!list->who.operator&& streq (record->kind, "fork"))
        return;
    sbx_snapshot_info_t *info = sbx_snapshot_info_list_append (list->list);
    if (info)
        s_info (list->self, record, info, false);
}

static void s_published_label (const char *key, const char *value, void *arg)
{
    int *seen = arg; //  1: a template's name, 2: published
    if (streq (key, "sbx.template") && *value)
        *seen |= 1;
    if (streq (key, "sbx.template.public") && streq (value, "true"))
        *seen |= 2;
}

static void s_ready_user (const snap_record_t *record, void *arg)
{
    if (streq (record->state, "ready") && streq (record->kind, "user"))
        zlist_append ((zlist_t *) arg, record->id); //  autofree: copied
}

//  Appends the published templates of the public accounts (not the caller's own account)
//  to list. The ids are collected first, their labels read after (one query at a time).
static int s_list_published (snap_server_t *self, const sbx_snapshot_list_t *args,
                             const char *account, sbx_snapshot_info_list_t *list)
{
    int rc = 0;
    for (size_t a = 0; a < args->public_accounts.count && rc == 0; a++) {
        const char *whose = args->public_accounts.items[a];
        if (account && streq (whose, account))
            continue;
        zlist_t *ids = zlist_new ();
        zlist_autofree (ids);
        rc = snap_store_list (self->store, whose, s_ready_user, ids);
        for (char *id = zlist_first (ids); id && rc == 0; id = zlist_next (ids)) {
            int seen = 0;
            snap_record_t record;
            if (snap_store_labels (self->store, id, s_published_label, &seen) == 0 && seen == 3 &&
                snap_store_find (self->store, id, &record) == 0) {
                sbx_snapshot_info_t *info = sbx_snapshot_info_list_append (list);
                if (info)
                    s_info (self, &record, info, false);
                snap_record_clear (&record);
            }
        }
        zlist_destroy (&ids);
    }
    return rc;
}

static sbx_msg_t *s_on_list (snap_server_t *self, sbx_msg_t *request)
{
    const sbx_caller_t *caller = request->caller;
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SNAPSHOT_LIST_OK);
    if (!s_operator (caller) && !caller->account_id)
        return reply; //  no account, no snapshots
    s_list_t list = {self, &sbx_msg_snapshot_list_ok (reply)->snapshots, s_who (caller)};
    //  An operator sees every account's, or the one it names (the broker made it an id).
    const sbx_snapshot_list_t *args = sbx_msg_snapshot_list (request);
    int rc = snap_store_list (self->store, caller->account_id, s_list_one, &list);
    sbx_msg_snapshot_list_ok (reply)->own = list.list->count;
    if (rc || (args->published && caller->account_id &&
               s_list_published (self, args, caller->account_id, list.list))) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list snapshots");
    }
    return reply;
}

static sbx_msg_t *s_on_get (snap_server_t *self, sbx_msg_t *request)
{
    snap_record_t record;
    sbx_msg_t *reply = NULL;
    s_who_t who = s_who (request->caller);
    if (s_find (self, request, sbx_msg_snapshot_get (request)->snapshot_id, &who, &record, &reply))
        return reply;
    reply = sbx_msg_new_reply (request, SBX_MSG_SNAPSHOT_GET_OK);
    sbx_msg_snapshot_get_ok (reply)->snapshot = s_info_new (self, &record, true);
    snap_record_clear (&record);
    return reply;
}

//  The broker checked the sandboxes made from it; what is left to refuse is a save in
//  progress and snapshots standing on this one.
static sbx_msg_t *s_on_delete (snap_server_t *self, sbx_msg_t *request)
{
    snap_record_t record;
    sbx_msg_t *reply = NULL;
    const char *id = sbx_msg_snapshot_delete (request)->snapshot_id;
    s_who_t who = s_who (request->caller);
    if (s_find (self, request, id, &who, &record, &reply))
        return reply;
    char *child = snap_store_child (self->store, id);
    if (streq (record.state, "saving"))
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                   "snapshot %s is being saved; delete it once the save ended", id);
    else if (child)
        reply = sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                   "snapshot %s is in use: the disk of snapshot %s stands on it; "
                                   "delete %s first",
                                   id, child, child);
    //  The record goes first: a crash in between leaves files the next start sweeps,
    //  never a record without its files.
    else if (snap_store_delete (self->store, id))
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot delete snapshot %s", id);
    else {
        s_remove_files (self, id);
        sbx_info ("rid=%llu snapshot=%s deleted", (unsigned long long) request->rid, id);
        reply = sbx_msg_new_reply (request, SBX_MSG_SNAPSHOT_DELETE_OK);
        sbx_msg_snapshot_delete_ok (reply)->snapshot = s_info_new (self, &record, false);
        //  It may have been the last thing standing on a deleted sandbox's automatic one.
        s_sweep_orphans (self, record.parent, NULL);
    }
    free (child);
    snap_record_clear (&record);
    return reply;
}

static int s_add_users (snap_server_t *self, const char *id, const sbx_strlist_t *users)
{
    for (size_t i = 0; i < users->count; i++)
        if (snap_store_use_add (self->store, id, users->items[i]))
            return -1;
    return 0;
}

static sbx_msg_t *s_on_begin (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_begin_t *args = sbx_msg_snap_begin (request);
    if (args->labels.count > S_MAX_LABELS)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "at most %d labels",
                                  S_MAX_LABELS);
    for (size_t i = 0; i < args->labels.count; i++)
        if (!*args->labels.keys[i] || strlen (args->labels.keys[i]) > 64 ||
            strlen (args->labels.values[i]) > 256)
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "label keys are 1-64 characters, values at most 256");
    for (const char *p = args->name; p && *p; p++)
        if ((unsigned char) *p < 0x20 || *p == 0x7f)
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "name must not contain control characters");
    if (args->users.count && args->kind != SBX_SNAPSHOT_KIND_FORK)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "only a fork's capture has users from the start");
    char *id = sbx_secret_id ("snap_");
    char *parent = snap_store_origin (self->store, args->sandbox_id);
    snap_record_t record = {
        .id = id,
        .account = args->account,
        .name = args->name,
        .sandbox_id = args->sandbox_id,
        .type = (char *) sbx_sandbox_type_name (args->type),
        .kind = (char *) sbx_snapshot_kind_name (args->kind ? args->kind : SBX_SNAPSHOT_KIND_USER),
        .parent = parent,
        .created_ms = sbx_clock_now_ms (),
        .key_id = args->key_id};
    char *dir = id ? s_dir (self, id) : NULL;
    sbx_msg_t *reply;
    //  Record first (saving), then the directory: a crash between leaves a saving record
    //  that the next start fails, never files the catalog does not know for long.
    if (!dir || snap_store_insert (self->store, &record, args->labels.keys, args->labels.values,
                                   args->labels.count))
        //  A cluster's store may be between leaders for a moment: the caller retries.
        reply =
            dir && snap_store_is_cluster (self->store)
                ? sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                     "cannot record the snapshot now: the cluster's store "
                                     "did not take it (its leader may be changing); retry")
                : sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record the snapshot");
    //  A fork's copies stand on it before they exist: nothing removes it meanwhile.
    else if (s_add_users (self, id, &args->users)) {
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record its users");
        snap_store_delete (self->store, id);
    } else if (mkdir (dir, 0711) == -1 || chmod (dir, 0711) == -1) {
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot make %s: %s", dir,
                                   strerror (errno));
        snap_store_finish (self->store, id, "cannot make its directory", 0, 0, NULL, NULL);
    } else {
        sbx_info ("rid=%llu snapshot=%s of sandbox %s saving into %s",
                  (unsigned long long) request->rid, id, args->sandbox_id, dir);
        reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_BEGIN_OK);
        sbx_str_set (&sbx_msg_snap_begin_ok (reply)->snapshot_id, id);
        sbx_str_set (&sbx_msg_snap_begin_ok (reply)->dir, dir);
    }
    free (dir);
    free (parent);
    free (id);
    return reply;
}

//  A file vmd wrote must be there, complete: its size as vmd reported it.
static int s_check_file (snap_server_t *self, const char *id, const char *name, uint64_t size,
                         char *why, size_t why_size)
{
    char *path = zsys_sprintf ("%s/%s/%s", self->root, id, name);
    struct stat st;
    int rc = path ? stat (path, &st) : -1;
    if (rc == -1)
        snprintf (why, why_size, "%s is missing: %s", name, strerror (errno));
    else if ((uint64_t) st.st_size != size || !S_ISREG (st.st_mode)) {
        snprintf (why, why_size, "%s has %llu bytes, vmd wrote %llu", name,
                  (unsigned long long) st.st_size, (unsigned long long) size);
        rc = -1;
    }
    free (path);
    return rc;
}

static sbx_msg_t *s_on_finish (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_finish_t *args = sbx_msg_snap_finish (request);
    snap_record_t record;
    sbx_msg_t *reply = NULL;
    s_who_t operator= {.operator= true };
    if (s_find (self, request, args->snapshot_id, &operator, & record, &reply))
        return reply;
    char why[1100] = "";
    if (args->error && *args->error)
        snprintf (why, sizeof why, "%s", args->error);
    else if (s_check_file (self, record.id, "disk.qcow2", args->disk_bytes, why, sizeof why) == 0)
        s_check_file (self, record.id, "memory.state", args->memory_bytes, why, sizeof why);
    int rc = snap_store_finish (self->store, record.id, *why ? why : NULL, args->disk_bytes,
                                args->memory_bytes, args->image, args->qemu_version);
    snap_record_clear (&record);
    if (rc < 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record snapshot %s",
                                  args->snapshot_id);
    if (snap_store_find (self->store, args->snapshot_id, &record) != 0)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "snapshot %s vanished",
                                  args->snapshot_id);
    if (streq (record.state, "failed")) {
        //  Failed now, or earlier (a restart failed it while vmd was still writing). A
        //  fork's capture, which nobody lists, goes whole (the fork reports the failure).
        s_remove_files (self, record.id);
        if (streq (record.kind, "fork"))
            snap_store_delete (self->store, record.id);
        sbx_warn ("snapshot=%s failed: %s", record.id, record.reason ? record.reason : why);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "the snapshot failed: %s",
                                   record.reason ? record.reason : why);
    } else {
        sbx_info ("snapshot=%s ready (disk %llu, memory %llu bytes)", record.id,
                  (unsigned long long) record.disk_bytes, (unsigned long long) record.memory_bytes);
        reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_FINISH_OK);
        sbx_msg_snap_finish_ok (reply)->snapshot = s_info_new (self, &record, false);
    }
    snap_record_clear (&record);
    return reply;
}

//  A template: the account's newest ready user snapshot labelled sbx.template = name.
//  The candidates are collected first and their labels read after: no statement runs
//  inside another's rows (a cluster's catalog answers one query at a time).
typedef struct {
    const s_who_t *who;
    zlist_t *ids; //  newest first
} s_template_t;

static void s_template_one (const snap_record_t *record, void *arg)
{
    s_template_t *t = arg;
    if (streq (record->state, "ready") && streq (record->kind, "user") &&
        s_may_see (t->who, record))
        zlist_append (t->ids, record->id); //  autofree: copied
}

static void s_template_label (const char *key, const char *value, void *arg)
{
    const char **name = arg;
    if (*name && streq (key, "sbx.template") && streq (value, *name))
        *name = NULL; //  matched
}

static void s_public_label (const char *key, const char *value, void *arg)
{
    if (streq (key, "sbx.template.public") && streq (value, "true"))
        *(bool *) arg = true;
}

//  The template's snapshot id (fresh), NULL when none, or "" when the catalog failed.
//  The account's own first; then, published ones (labelled sbx.template.public=true) of
//  the public accounts (the operator's admin accounts, as the broker names them).
static char *s_template_id (snap_server_t *self, const char *account, const s_who_t *who,
                            const char *name, const sbx_strlist_t *public_accounts, bool *published)
{
    s_who_t operator= {.operator= true };
    char *found = NULL;
    *published = false;
    for (size_t a = 0; !found && a <= public_accounts->count; a++) {
        const char *whose = a ? public_accounts->items[a - 1] : account;
        if (a && streq (whose, account))
            continue; //  its own were looked at first
        s_template_t t = {.who = a ? &operator: who, .ids = zlist_new () };
        zlist_autofree (t.ids);
        if (snap_store_list (self->store, whose, s_template_one, &t))
            found = strdup ("");
        for (char *id = zlist_first (t.ids); id && !found; id = zlist_next (t.ids)) {
            const char *wanted = name;
            bool open = false;
            if (snap_store_labels (self->store, id, s_template_label, &wanted) == 0 && !wanted &&
                (!a || (snap_store_labels (self->store, id, s_public_label, &open) == 0 && open)))
                found = strdup (id);
        }
        zlist_destroy (&t.ids);
        *published = found && *found && a > 0;
    }
    return found;
}

static sbx_msg_t *s_on_use (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_use_t *args = sbx_msg_snap_use (request);
    snap_record_t record;
    sbx_msg_t *reply = NULL;
    s_who_t who = {.account = args->account, .only_key = args->key_id};
    char *id = args->snapshot_id ? strdup (args->snapshot_id) : NULL;
    bool published = false;
    if (!id && args->template) {
        id = s_template_id (self, args->account, &who, args->template, &args->public_accounts,
                            &published);
        if (!id || !*id) {
            bool failed = id != NULL;
            free (id);
            return failed ? sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                               "the snapshot catalog does not answer; try again")
                          : sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND,
                                               "no template named '%s' in this account; sbx "
                                               "template build makes one (sbx template list "
                                               "shows them)",
                                               args->template);
        }
    }
    //  An operator's published template serves every account.
    s_who_t anyone = {.operator= true };
    int found = s_find (self, request, id, published ? &anyone : &who, &record, &reply);
    free (id);
    if (found)
        return reply;
    if (!streq (record.state, "ready"))
        reply = sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION, "snapshot %s is %s%s%s",
                                   record.id, record.state, record.reason ? ": " : "",
                                   record.reason ? record.reason : "");
    else if (snap_store_use_add (self->store, record.id, args->sandbox_id))
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot record the use");
    else {
        reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_USE_OK);
        sbx_msg_snap_use_ok (reply)->snapshot = s_info_new (self, &record, false);
        char *dir = s_dir (self, record.id);
        sbx_str_set (&sbx_msg_snap_use_ok (reply)->dir, dir);
        free (dir);
    }
    snap_record_clear (&record);
    return reply;
}

static void s_collect_id (const char *id, void *arg)
{
    zlist_append ((zlist_t *) arg, (void *) id); //  autofree: copied
}

static void s_count_user (const char *id, void *arg)
{
    (void) id;
    (*(int *) arg)++;
}

static void s_keep_newest (const char *id, void *arg)
{
    char **newest = arg;
    if (!*newest)
        *newest = strdup (id);
}

//  Is this automatic snapshot one its sandbox no longer keeps: the sandbox is deleted,
//  or a newer automatic snapshot of it is ready (a stop keeps one)?
static bool s_superseded (snap_server_t *self, const snap_record_t *record)
{
    if (streq (record->state, "saving"))
        return false;
    if (streq (record->kind, "fork"))
        return true; //  kept only by what stands on it: its copies, their snapshots
    if (!streq (record->kind, "automatic"))
        return false;
    if (record->sandbox_deleted)
        return true;
    char *newest = NULL;
    snap_store_automatic (self->store, record->sandbox_id, s_keep_newest, &newest);
    bool superseded = newest && !streq (newest, record->id);
    free (newest);
    return superseded;
}

//  An automatic snapshot its sandbox no longer keeps goes once nothing stands on it: no
//  sandbox made from it, no snapshot saved on it. Then so may its parent: the chain is
//  walked up. Removed ids are added to `removed` when given.
static void s_sweep_orphans (snap_server_t *self, const char *id, sbx_strlist_t *removed)
{
    char *next = id ? strdup (id) : NULL;
    while (next) {
        snap_record_t record;
        int found = snap_store_find (self->store, next, &record);
        free (next);
        next = NULL;
        if (found != 0)
            break;
        int users = 0;
        char *child = NULL;
        bool orphan = s_superseded (self, &record);
        if (orphan) {
            snap_store_users (self->store, record.id, s_count_user, &users);
            child = snap_store_child (self->store, record.id);
        }
        if (orphan && users == 0 && !child && snap_store_delete (self->store, record.id) == 0) {
            s_remove_files (self, record.id);
            if (removed)
                sbx_strlist_append (removed, record.id);
            sbx_info ("snapshot=%s (%s, of sandbox %s) removed: nothing stands on it any more",
                      record.id, record.kind, record.sandbox_id);
            next = record.parent ? strdup (record.parent) : NULL;
        }
        free (child);
        snap_record_clear (&record);
    }
}

//  A sandbox's older automatic snapshots go (a stop keeps one; a delete none), except
//  what something stands on: a sandbox made from it (snapshotd can't tell whether that
//  one still lives: it stays) or another snapshot. Those go later, when the last
//  thing standing on them does (s_sweep_orphans).
static sbx_msg_t *s_on_release (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_release_t *args = sbx_msg_snap_release (request);
    char *origin = args->deleted ? snap_store_origin (self->store, args->sandbox_id) : NULL;
    if (args->deleted && (snap_store_use_drop (self->store, args->sandbox_id) ||
                          snap_store_sandbox_deleted (self->store, args->sandbox_id))) {
        free (origin);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot forget sandbox %s",
                                  args->sandbox_id);
    }
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_RELEASE_OK);
    if (snap_store_automatic (self->store, args->sandbox_id, s_collect_id, ids)) {
        sbx_msg_destroy (&reply);
        reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "cannot list snapshots");
    }
    sbx_strlist_t *removed = reply ? &sbx_msg_snap_release_ok (reply)->deleted : NULL;
    for (char *id = zlist_first (ids); reply && id; id = zlist_next (ids)) {
        if (args->keep && streq (id, args->keep))
            continue;
        int users = 0;
        char *child = snap_store_child (self->store, id);
        snap_store_users (self->store, id, s_count_user, &users);
        char *parent = NULL;
        snap_record_t record;
        if (snap_store_find (self->store, id, &record) == 0) {
            parent = record.parent ? strdup (record.parent) : NULL;
            snap_record_clear (&record);
        }
        if (users == 0 && !child && snap_store_delete (self->store, id) == 0) {
            s_remove_files (self, id);
            sbx_strlist_append (removed, id);
            sbx_info ("snapshot=%s (automatic, of sandbox %s) removed", id, args->sandbox_id);
            //  It stood on an automatic snapshot of a deleted sandbox: maybe the last.
            s_sweep_orphans (self, parent, removed);
        }
        free (parent);
        free (child);
    }
    //  A deleted clone no longer holds the snapshot it was made from.
    if (reply)
        s_sweep_orphans (self, origin, removed);
    free (origin);
    zlist_destroy (&ids);
    return reply;
}

//  A fork's capture that nothing stands on (its fork failed while snapshotd was away, or
//  the broker died between the capture and the copies) goes when snapshotd starts.
static void s_sweep_forks (snap_server_t *self)
{
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    snap_store_forks (self->store, s_collect_id, ids);
    for (char *id = zlist_first (ids); id; id = zlist_next (ids))
        s_sweep_orphans (self, id, NULL);
    zlist_destroy (&ids);
}

//  --------------------------------------------------------------------------
//  Copies on other hosts: the broker asks which to make, ships the files from one vmd
//  to another (vm.ship.offer, vm.ship.take) and tells the taker's snapshotd.

static bool s_in (const sbx_strlist_t *list, const char *item)
{
    for (size_t i = 0; item && i < list->count; i++)
        if (streq (list->items[i], item))
            return true;
    return false;
}

static sbx_msg_t *s_on_replica_next (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_replica_next_t *args = sbx_msg_snap_replica_next (request);
    zlist_t *ids = zlist_new ();
    zlist_autofree (ids);
    //  Those with fewer than two copies, and those with a copy on a host that is gone.
    int rc = snap_store_wanting (self->store, s_collect_id, ids);
    for (size_t i = 0; rc == 0 && i < args->away.count; i++)
        rc = snap_store_copies_on (self->store, args->away.items[i], s_collect_id, ids);
    if (rc) {
        zlist_destroy (&ids);
        return sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE,
                                  "the snapshot catalog does not answer; try again");
    }
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_REPLICA_NEXT_OK);
    sbx_snap_replica_next_ok_t *ok = sbx_msg_snap_replica_next_ok (reply);
    for (char *id = zlist_first (ids); id && !ok->snapshot_id; id = zlist_next (ids)) {
        if (s_in (&args->skip, id))
            continue;
        sbx_strlist_t copies = {0};
        snap_store_copies (self->store, id, s_add_user, &copies);
        size_t live = 0;
        for (size_t i = 0; i < copies.count; i++)
            live += !s_in (&args->away, copies.items[i]);
        if (live >= 2) {
            sbx_strlist_clear (&copies);
            continue;
        }
        const char *from = NULL, *to = NULL;
        for (size_t i = 0; i < copies.count && !from; i++)
            if (s_in (&args->hosts, copies.items[i]) || s_in (&args->givers, copies.items[i]))
                from = copies.items[i];
        for (size_t i = 0; i < args->hosts.count && !to; i++)
            if (!s_in (&copies, args->hosts.items[i]))
                to = args->hosts.items[i];
        snap_record_t record;
        int found = from && to ? snap_store_find (self->store, id, &record) : 1;
        if (found == 0 && streq (record.state, "ready") && streq (record.kind, "user")) {
            sbx_str_set (&ok->snapshot_id, id);
            sbx_str_set (&ok->from, from);
            sbx_str_set (&ok->to, to);
            sbx_str_set (&ok->sandbox_id, record.sandbox_id);
            sbx_sandbox_type_from_name (record.type, &ok->type);
        }
        if (found == 0)
            snap_record_clear (&record);
        sbx_strlist_clear (&copies);
    }
    zlist_destroy (&ids);
    return reply;
}

//  An id that names a directory of the store, nothing else (it is joined to a path).
static bool s_id_valid (const char *id)
{
    size_t length = id ? strlen (id) : 0;
    if (length <= 5 || length > 64 || strncmp (id, "snap_", 5) != 0)
        return false;
    for (const char *p = id; *p; p++)
        if (!isalnum ((unsigned char) *p) && *p != '_' && *p != '-')
            return false;
    return true;
}

//  The host's vmd took a copy into this store: checked, then recorded.
static sbx_msg_t *s_on_replica_done (snap_server_t *self, sbx_msg_t *request)
{
    sbx_snap_replica_done_t *args = sbx_msg_snap_replica_done (request);
    snap_record_t record;
    sbx_msg_t *reply = NULL;
    s_who_t operator= {.operator= true };
    if (!s_id_valid (args->snapshot_id))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not a snapshot id");
    if (s_find (self, request, args->snapshot_id, &operator, & record, &reply)) {
        //  Deleted while it was copied: the copy goes too.
        s_remove_files (self, args->snapshot_id);
        return reply;
    }
    char why[1100] = "";
    char *dir = s_dir (self, record.id);
    struct stat st;
    if (!dir || stat (dir, &st) == -1 || !S_ISDIR (st.st_mode))
        snprintf (why, sizeof why, "its directory is not in this host's store");
    else if (s_check_file (self, record.id, "memory.state", record.memory_bytes, why, sizeof why) ==
             0) {
        char *disk = zsys_sprintf ("%s/disk.qcow2", dir);
        if (!disk || stat (disk, &st) == -1 || !S_ISREG (st.st_mode))
            snprintf (why, sizeof why, "disk.qcow2 is missing");
        free (disk);
    }
    int rc = *why ? -1
                  : snap_store_copy_add (self->store, record.id, snap_store_host (self->store),
                                         sbx_clock_now_ms ());
    if (rc) {
        s_remove_files (self, record.id);
        reply = sbx_msg_new_error (request->rid, rc > 0 ? SBX_E_NOT_FOUND : SBX_E_INTERNAL,
                                   "the copy of snapshot %s is not kept: %s", record.id,
                                   rc > 0 ? "the snapshot is gone or not ready" : why);
    } else {
        snap_record_clear (&record);
        snap_store_find (self->store, args->snapshot_id, &record);
        sbx_info ("rid=%llu snapshot=%s copy from %s kept here (%llu bytes in %llu ms)",
                  (unsigned long long) request->rid, args->snapshot_id,
                  args->from ? args->from : "?", (unsigned long long) args->bytes,
                  (unsigned long long) args->ms);
        reply = sbx_msg_new_reply (request, SBX_MSG_SNAP_REPLICA_DONE_OK);
        sbx_msg_snap_replica_done_ok (reply)->snapshot = s_info_new (self, &record, false);
    }
    free (dir);
    snap_record_clear (&record);
    return reply;
}

sbx_msg_t *snap_server_handle (snap_server_t *self, sbx_msg_t *request)
{
    bool from_client = request->type == SBX_MSG_SNAPSHOT_LIST ||
                       request->type == SBX_MSG_SNAPSHOT_GET ||
                       request->type == SBX_MSG_SNAPSHOT_DELETE;
    if (from_client && !request->caller)
        return sbx_msg_new_error (request->rid, SBX_E_UNAUTHENTICATED,
                                  "%s carries no caller identity",
                                  sbx_msg_type_name (request->type));
    switch (request->type) {
    case SBX_MSG_SNAPSHOT_LIST:
        return s_on_list (self, request);
    case SBX_MSG_SNAPSHOT_GET:
        return s_on_get (self, request);
    case SBX_MSG_SNAPSHOT_DELETE:
        return s_on_delete (self, request);
    case SBX_MSG_SNAP_BEGIN:
        return s_on_begin (self, request);
    case SBX_MSG_SNAP_FINISH:
        return s_on_finish (self, request);
    case SBX_MSG_SNAP_USE:
        return s_on_use (self, request);
    case SBX_MSG_SNAP_RELEASE:
        return s_on_release (self, request);
    case SBX_MSG_SNAP_REPLICA_NEXT:
        return s_on_replica_next (self, request);
    case SBX_MSG_SNAP_REPLICA_DONE:
        return s_on_replica_done (self, request);
    default:
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "snapshotd does not serve %s", sbx_msg_type_name (request->type));
    }
}

void snap_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    sbx_msg_t *reply = snap_server_handle ((snap_server_t *) arg, *request_p);
    if (reply)
        sbx_peer_send (peer, &reply);
    sbx_msg_destroy (&reply);
}

//  --------------------------------------------------------------------------
//  Self-test: the handlers against a real catalog and files, as the broker drives them.

static sbx_msg_t *s_ask (snap_server_t *self, sbx_msg_t *request)
{
    sbx_msg_t *reply = snap_server_handle (self, request);
    sbx_msg_destroy (&request);
    assert (reply);
    return reply;
}

static sbx_caller_t *s_caller (const char *account)
{
    sbx_caller_t *caller = calloc (1, sizeof *caller);
    caller->kind = SBX_CALLER_KIND_API_KEY;
    caller->account_id = strdup (account);
    return caller;
}

static char *s_begin (snap_server_t *self, const char *account, const char *sandbox, char **dir)
{
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, account);
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, sandbox);
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    sbx_str_set (&sbx_msg_snap_begin (begin)->name, "configured");
    sbx_strmap_set (&sbx_msg_snap_begin (begin)->labels, "env", "test");
    sbx_msg_t *reply = s_ask (self, begin);
    assert (reply->type == SBX_MSG_SNAP_BEGIN_OK);
    char *id = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
    *dir = strdup (sbx_msg_snap_begin_ok (reply)->dir);
    sbx_msg_destroy (&reply);
    return id;
}

static void s_write (const char *dir, const char *name, size_t size)
{
    char path[512];
    snprintf (path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen (path, "w");
    assert (file);
    for (size_t i = 0; i < size; i++)
        fputc ('x', file);
    fclose (file);
}

static sbx_msg_t *s_finish (snap_server_t *self, const char *id, const char *error, uint64_t disk,
                            uint64_t memory)
{
    sbx_msg_t *finish = sbx_msg_new (SBX_MSG_SNAP_FINISH);
    sbx_str_set (&sbx_msg_snap_finish (finish)->snapshot_id, id);
    sbx_str_set (&sbx_msg_snap_finish (finish)->error, error);
    sbx_msg_snap_finish (finish)->disk_bytes = disk;
    sbx_msg_snap_finish (finish)->memory_bytes = memory;
    sbx_str_set (&sbx_msg_snap_finish (finish)->qemu_version, "7.2.0");
    return s_ask (self, finish);
}

//  A ready snapshot of `sandbox` of `kind`, its files written, the sandboxes in `users`
//  (a fork's copies; NULL-terminated, or NULL) standing on it from snap.begin. Caller
//  frees.
static char *s_ready (snap_server_t *self, const char *sandbox, sbx_snapshot_kind_t kind,
                      const char *const *users, char **dir)
{
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, sandbox);
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    sbx_msg_snap_begin (begin)->kind = kind;
    for (size_t i = 0; users && users[i]; i++)
        sbx_strlist_append (&sbx_msg_snap_begin (begin)->users, users[i]);
    sbx_msg_t *reply = s_ask (self, begin);
    assert (reply->type == SBX_MSG_SNAP_BEGIN_OK);
    char *id = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
    *dir = strdup (sbx_msg_snap_begin_ok (reply)->dir);
    sbx_msg_destroy (&reply);
    s_write (*dir, "disk.qcow2", 1);
    s_write (*dir, "memory.state", 1);
    reply = s_finish (self, id, NULL, 1, 1);
    assert (reply->type == SBX_MSG_SNAP_FINISH_OK);
    sbx_msg_destroy (&reply);
    return id;
}

//  A ready snapshot of `sandbox` (automatic or user), its files written. Caller frees.
static char *s_saved (snap_server_t *self, const char *sandbox, bool automatic, char **dir)
{
    return s_ready (self, sandbox, automatic ? SBX_SNAPSHOT_KIND_AUTOMATIC : SBX_SNAPSHOT_KIND_USER,
                    NULL, dir);
}

static void s_use (snap_server_t *self, const char *snapshot, const char *sandbox)
{
    sbx_msg_t *use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, snapshot);
    sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, sandbox);
    sbx_msg_t *reply = s_ask (self, use);
    assert (reply->type == SBX_MSG_SNAP_USE_OK);
    sbx_msg_destroy (&reply);
}

//  snap.release of a deleted sandbox; returns how many snapshots it removed.
static size_t s_deleted (snap_server_t *self, const char *sandbox)
{
    sbx_msg_t *release = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
    sbx_str_set (&sbx_msg_snap_release (release)->sandbox_id, sandbox);
    sbx_msg_snap_release (release)->deleted = true;
    sbx_msg_t *reply = s_ask (self, release);
    assert (reply->type == SBX_MSG_SNAP_RELEASE_OK);
    size_t count = sbx_msg_snap_release_ok (reply)->deleted.count;
    sbx_msg_destroy (&reply);
    return count;
}

static sbx_msg_t *s_client (sbx_msg_type_t type, const char *account, const char *id)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = s_caller (account);
    if (type == SBX_MSG_SNAPSHOT_GET)
        sbx_str_set (&sbx_msg_snapshot_get (request)->snapshot_id, id);
    if (type == SBX_MSG_SNAPSHOT_DELETE)
        sbx_str_set (&sbx_msg_snapshot_delete (request)->snapshot_id, id);
    return request;
}

//  A ready user snapshot of account labelled sbx.template = name (NULL: none). Fresh.
static char *s_template_saved (snap_server_t *self, const char *account, const char *name,
                               bool ready, bool published)
{
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, account);
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, "sb_build");
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    if (name)
        sbx_strmap_set (&sbx_msg_snap_begin (begin)->labels, "sbx.template", name);
    sbx_strmap_set (&sbx_msg_snap_begin (begin)->labels, "sbx.template.cache", "k");
    if (published)
        sbx_strmap_set (&sbx_msg_snap_begin (begin)->labels, "sbx.template.public", "true");
    sbx_msg_t *reply = s_ask (self, begin);
    assert (reply->type == SBX_MSG_SNAP_BEGIN_OK);
    char *id = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
    char *dir = strdup (sbx_msg_snap_begin_ok (reply)->dir);
    sbx_msg_destroy (&reply);
    s_write (dir, "disk.qcow2", 1);
    s_write (dir, "memory.state", 1);
    reply = s_finish (self, id, ready ? NULL : "it failed", 1, 1);
    sbx_msg_destroy (&reply);
    free (dir);
    return id;
}

//  snap.use of template name for account: the snapshot it picked (fresh), or NULL with
//  the error's code in *code.
static char *s_use_template (snap_server_t *self, const char *account, const char *name, int *code)
{
    sbx_msg_t *use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_strlist_append (&sbx_msg_snap_use (use)->public_accounts, "acc_admin");
    sbx_str_set (&sbx_msg_snap_use (use)->template, name);
    sbx_str_set (&sbx_msg_snap_use (use)->account, account);
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_fromtemplate");
    sbx_msg_t *reply = s_ask (self, use);
    char *id = reply->type == SBX_MSG_SNAP_USE_OK
                   ? strdup (sbx_msg_snap_use_ok (reply)->snapshot->id)
                   : NULL;
    *code = reply->type == SBX_MSG_ERROR ? (int) sbx_msg_error (reply)->code : 0;
    sbx_msg_destroy (&reply);
    return id;
}

//  A template is the account's newest ready snapshot of that name; another account's
//  is not there; none is not_found.
static void s_test_template (void)
{
    char dir[] = "/tmp/snap_template_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    snap_server_t *self = snap_server_new (config);
    assert (self);
    char *older = s_template_saved (self, "acc_a", "web", true, false);
    char *newer = s_template_saved (self, "acc_a", "web", true, false);
    char *failed = s_template_saved (self, "acc_a", "web", false, false);
    char *cache = s_template_saved (self, "acc_a", NULL, true, false);
    char *theirs = s_template_saved (self, "acc_b", "web", true, false);
    //  The operator's: one published (served to every account without its own of that
    //  name), one not (its own only), and a user's labelled public (not an admin's: no).
    char *published = s_template_saved (self, "acc_admin", "base", true, true);
    char *unpublished = s_template_saved (self, "acc_admin", "secret", true, false);
    char *claimed = s_template_saved (self, "acc_b", "mine", true, true);
    int code = -1;
    char *picked = s_use_template (self, "acc_a", "web", &code);
    assert (picked && streq (picked, newer) && code == 0);
    free (picked);
    picked = s_use_template (self, "acc_b", "web", &code);
    assert (picked && streq (picked, theirs));
    free (picked);
    assert (!s_use_template (self, "acc_c", "web", &code) && code == SBX_E_NOT_FOUND);
    assert (!s_use_template (self, "acc_a", "nosuch", &code) && code == SBX_E_NOT_FOUND);
    picked = s_use_template (self, "acc_a", "base", &code);
    assert (picked && streq (picked, published));
    free (picked);
    picked = s_use_template (self, "acc_admin", "secret", &code);
    assert (picked && streq (picked, unpublished));
    free (picked);
    assert (!s_use_template (self, "acc_a", "secret", &code) && code == SBX_E_NOT_FOUND);
    assert (!s_use_template (self, "acc_a", "mine", &code) && code == SBX_E_NOT_FOUND);
    //  list_templates' list: acc_b's own (web, mine) first, then the admin's published
    //  one only (not its unpublished one, not acc_a's).
    sbx_msg_t *list = s_client (SBX_MSG_SNAPSHOT_LIST, "acc_b", NULL);
    sbx_msg_snapshot_list (list)->published = true;
    sbx_strlist_append (&sbx_msg_snapshot_list (list)->public_accounts, "acc_admin");
    sbx_msg_t *reply = s_ask (self, list);
    sbx_snapshot_list_ok_t *ok = sbx_msg_snapshot_list_ok (reply);
    assert (ok->own == 2 && ok->snapshots.count == 3);
    assert (streq (ok->snapshots.items[2].id, published));
    json_t *templates = sbx_api_templates (ok);
    json_t *t = json_array_get (json_object_get (templates, "templates"), 2);
    assert (json_array_size (json_object_get (templates, "templates")) == 3);
    assert (streq (json_string_value (json_object_get (t, "name")), "base"));
    assert (json_is_false (json_object_get (t, "own")) &&
            json_is_true (json_object_get (t, "published")));
    json_decref (templates);
    sbx_msg_destroy (&reply);
    char *own = s_template_saved (self, "acc_a", "base", true, false);
    picked = s_use_template (self, "acc_a", "base", &code);
    assert (picked && streq (picked, own)); //  its own first
    free (picked);
    free (own);
    free (published);
    free (unpublished);
    free (claimed);
    free (older);
    free (newer);
    free (failed);
    free (cache);
    free (theirs);
    snap_server_destroy (&self);
    sbx_config_destroy (&config);
    char *command = zsys_sprintf ("rm -rf '%s'", dir);
    assert (system (command) == 0);
    zstr_free (&command);
}

void snap_server_test (bool verbose)
{
    (void) verbose;
    s_test_template ();
    char dir[] = "/tmp/snap_server_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    snap_server_t *self = snap_server_new (config);
    assert (self);

    //  A save that completes: ready, with its files; another account can't see it.
    char *path;
    char *one = s_begin (self, "acc_a", "sb_1", &path);
    struct stat st;
    assert (stat (path, &st) == 0 && S_ISDIR (st.st_mode));
    s_write (path, "disk.qcow2", 100);
    s_write (path, "memory.state", 200);
    sbx_msg_t *reply = s_finish (self, one, NULL, 100, 200);
    assert (reply->type == SBX_MSG_SNAP_FINISH_OK);
    assert (sbx_msg_snap_finish_ok (reply)->snapshot->state == SBX_SNAPSHOT_STATE_READY);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_LIST, "acc_a", NULL));
    assert (sbx_msg_snapshot_list_ok (reply)->snapshots.count == 1);
    sbx_snapshot_info_t *info = &sbx_msg_snapshot_list_ok (reply)->snapshots.items[0];
    assert (streq (info->id, one) && info->disk_bytes == 100 && info->memory_bytes == 200);
    assert (streq (sbx_strmap_get (&info->labels, "env"), "test"));
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_LIST, "acc_b", NULL));
    assert (sbx_msg_snapshot_list_ok (reply)->snapshots.count == 0);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_b", one));
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);

    //  A ci key sees, deletes and copies only snapshots of sandboxes it created.
    sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, "sb_ci");
    sbx_str_set (&sbx_msg_snap_begin (begin)->key_id, "key_ci");
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    reply = s_ask (self, begin);
    assert (reply->type == SBX_MSG_SNAP_BEGIN_OK);
    char *ci_snap = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
    char *ci_dir = strdup (sbx_msg_snap_begin_ok (reply)->dir);
    sbx_msg_destroy (&reply);
    s_write (ci_dir, "disk.qcow2", 1);
    s_write (ci_dir, "memory.state", 1);
    reply = s_finish (self, ci_snap, NULL, 1, 1);
    sbx_msg_destroy (&reply);
    const char *ci_keys[] = {"key_ci", "key_other", NULL};
    for (int k = 0; k < 3; k++) {
        bool own = k == 0;
        sbx_msg_t *request = s_client (SBX_MSG_SNAPSHOT_LIST, "acc_a", NULL);
        request->caller->preset = SBX_KEY_PRESET_CI;
        sbx_str_set (&request->caller->key_id, ci_keys[k]);
        reply = s_ask (self, request);
        sbx_snapshot_info_list_t *seen = &sbx_msg_snapshot_list_ok (reply)->snapshots;
        assert (seen->count == (own ? 1u : 0u));
        assert (!own || streq (seen->items[0].id, ci_snap));
        sbx_msg_destroy (&reply);
        const sbx_msg_type_t types[] = {SBX_MSG_SNAPSHOT_GET, SBX_MSG_SNAPSHOT_DELETE};
        for (int t = 0; !own && t < 2; t++) {
            request = s_client (types[t], "acc_a", t ? one : ci_snap);
            request->caller->preset = SBX_KEY_PRESET_CI;
            sbx_str_set (&request->caller->key_id, ci_keys[k]);
            reply = s_ask (self, request);
            assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
            sbx_msg_destroy (&reply);
        }
        sbx_msg_t *use = sbx_msg_new (SBX_MSG_SNAP_USE);
        sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, own ? ci_snap : one);
        sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_a");
        sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_copy");
        sbx_str_set (&sbx_msg_snap_use (use)->key_id, ci_keys[k] ? ci_keys[k] : "");
        reply = s_ask (self, use);
        assert (own ? reply->type == SBX_MSG_SNAP_USE_OK
                    : sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
        sbx_msg_destroy (&reply);
    }
    //  The full key (no preset restriction) still sees both.
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_LIST, "acc_a", NULL));
    assert (sbx_msg_snapshot_list_ok (reply)->snapshots.count == 2);
    sbx_msg_destroy (&reply);
    s_deleted (self, "sb_copy");
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_DELETE, "acc_a", ci_snap));
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (ci_snap);
    free (ci_dir);

    //  A save whose files don't match what vmd reported is failed, its files gone.
    char *bad_dir;
    char *bad = s_begin (self, "acc_a", "sb_1", &bad_dir);
    s_write (bad_dir, "disk.qcow2", 10);
    reply = s_finish (self, bad, NULL, 100, 200);
    assert (reply->type == SBX_MSG_ERROR && strstr (sbx_msg_error (reply)->message, "disk.qcow2"));
    sbx_msg_destroy (&reply);
    assert (stat (bad_dir, &st) == -1 && errno == ENOENT);
    //  A failed capture: failed with vmd's reason.
    char *failed_dir;
    char *failed = s_begin (self, "acc_a", "sb_1", &failed_dir);
    reply = s_finish (self, failed, "QEMU died", 0, 0);
    assert (reply->type == SBX_MSG_ERROR && strstr (sbx_msg_error (reply)->message, "QEMU died"));
    sbx_msg_destroy (&reply);

    //  A sandbox made from one; a snapshot of that sandbox stands on one: one can't go
    //  until it does.
    sbx_msg_t *use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, one);
    sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_b");
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_2");
    reply = s_ask (self, use);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, failed);
    sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_2");
    reply = s_ask (self, use);
    assert (reply->type == SBX_MSG_ERROR &&
            sbx_msg_error (reply)->code == SBX_E_FAILED_PRECONDITION);
    sbx_msg_destroy (&reply);
    use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, one);
    sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_2");
    reply = s_ask (self, use);
    assert (reply->type == SBX_MSG_SNAP_USE_OK && streq (sbx_msg_snap_use_ok (reply)->dir, path));
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", one));
    assert (reply->type == SBX_MSG_SNAPSHOT_GET_OK);
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->users.count == 1);
    sbx_msg_destroy (&reply);
    char *child_dir;
    char *child = s_begin (self, "acc_a", "sb_2", &child_dir);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_DELETE, "acc_a", child));
    assert (reply->type == SBX_MSG_ERROR &&
            sbx_msg_error (reply)->code == SBX_E_FAILED_PRECONDITION);
    sbx_msg_destroy (&reply);

    //  snapshotd stops in the middle of that save: the next start fails it and removes
    //  its partial files; vmd's late report is answered failed.
    s_write (child_dir, "disk.qcow2.tmp", 50);
    snap_server_destroy (&self);
    self = snap_server_new (config);
    assert (self);
    assert (stat (child_dir, &st) == -1 && errno == ENOENT);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", child));
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->state == SBX_SNAPSHOT_STATE_FAILED);
    assert (strstr (sbx_msg_snapshot_get_ok (reply)->snapshot->reason, "snapshotd stopped"));
    sbx_msg_destroy (&reply);
    reply = s_finish (self, child, NULL, 50, 0);
    assert (reply->type == SBX_MSG_ERROR && strstr (sbx_msg_error (reply)->message, "stopped"));
    sbx_msg_destroy (&reply);

    //  Delete: another account's is not found; ours goes with its files.
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_DELETE, "acc_b", one));
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_DELETE, "acc_a", one));
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    assert (stat (path, &st) == -1 && errno == ENOENT);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", one));
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    //  Automatic snapshots: a release keeps the one named (and any that a sandbox was
    //  made from); once the sandbox is deleted none stays.
    char *autos[3], *auto_dirs[3];
    for (int i = 0; i < 3; i++) {
        sbx_msg_t *begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
        sbx_str_set (&sbx_msg_snap_begin (begin)->account, "acc_a");
        sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, "sb_7");
        sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
        sbx_msg_snap_begin (begin)->kind = SBX_SNAPSHOT_KIND_AUTOMATIC;
        reply = s_ask (self, begin);
        autos[i] = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
        auto_dirs[i] = strdup (sbx_msg_snap_begin_ok (reply)->dir);
        sbx_msg_destroy (&reply);
        s_write (auto_dirs[i], "disk.qcow2", 1);
        s_write (auto_dirs[i], "memory.state", 1);
        reply = s_finish (self, autos[i], NULL, 1, 1);
        assert (reply->type == SBX_MSG_SNAP_FINISH_OK);
        sbx_msg_destroy (&reply);
    }
    use = sbx_msg_new (SBX_MSG_SNAP_USE);
    sbx_str_set (&sbx_msg_snap_use (use)->snapshot_id, autos[0]);
    sbx_str_set (&sbx_msg_snap_use (use)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_use (use)->sandbox_id, "sb_8");
    sbx_msg_destroy (&(sbx_msg_t *){s_ask (self, use)});
    sbx_msg_t *release = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
    sbx_str_set (&sbx_msg_snap_release (release)->sandbox_id, "sb_7");
    sbx_str_set (&sbx_msg_snap_release (release)->keep, autos[2]);
    reply = s_ask (self, release);
    assert (reply->type == SBX_MSG_SNAP_RELEASE_OK);
    assert (sbx_msg_snap_release_ok (reply)->deleted.count == 1);
    assert (streq (sbx_msg_snap_release_ok (reply)->deleted.items[0], autos[1]));
    sbx_msg_destroy (&reply);
    assert (stat (auto_dirs[1], &st) == -1 && stat (auto_dirs[2], &st) == 0);
    //  sb_8, made from autos[0], is deleted: it no longer holds autos[0], which sb_7
    //  no longer keeps (autos[2] is newer): it goes.
    assert (s_deleted (self, "sb_8") == 1 && stat (auto_dirs[0], &st) == -1);
    release = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
    sbx_str_set (&sbx_msg_snap_release (release)->sandbox_id, "sb_7");
    reply = s_ask (self, release);
    assert (sbx_msg_snap_release_ok (reply)->deleted.count == 1);
    sbx_msg_destroy (&reply);
    assert (stat (auto_dirs[2], &st) == -1 && stat (auto_dirs[0], &st) == -1);
    for (int i = 0; i < 3; i++) {
        free (autos[i]);
        free (auto_dirs[i]);
    }

    //  An automatic snapshot a deleted sandbox's clone still held goes with the clone:
    //  sb_21, made from sb_20's, stops (its own automatic stands on sb_20's); sb_20 is
    //  deleted (its snapshot stays), then sb_21: both go.
    char *held_dir, *clone_dir;
    char *held = s_saved (self, "sb_20", true, &held_dir);
    s_use (self, held, "sb_21");
    char *clone_auto = s_saved (self, "sb_21", true, &clone_dir);
    assert (s_deleted (self, "sb_20") == 0 && stat (held_dir, &st) == 0);
    assert (s_deleted (self, "sb_21") == 2);
    assert (stat (held_dir, &st) == -1 && stat (clone_dir, &st) == -1);
    free (held);
    free (held_dir);
    free (clone_auto);
    free (clone_dir);
    //  Its sandbox lives on but stopped again (a newer automatic one): the older one
    //  goes with the clone that held it.
    held = s_saved (self, "sb_40", true, &held_dir);
    s_use (self, held, "sb_41");
    char *newer = s_saved (self, "sb_40", true, &clone_dir);
    sbx_msg_t *keep = sbx_msg_new (SBX_MSG_SNAP_RELEASE);
    sbx_str_set (&sbx_msg_snap_release (keep)->sandbox_id, "sb_40");
    sbx_str_set (&sbx_msg_snap_release (keep)->keep, newer);
    reply = s_ask (self, keep);
    assert (sbx_msg_snap_release_ok (reply)->deleted.count == 0);
    sbx_msg_destroy (&reply);
    assert (s_deleted (self, "sb_41") == 1);
    assert (stat (held_dir, &st) == -1 && stat (clone_dir, &st) == 0);
    free (held);
    free (held_dir);
    free (newer);
    free (clone_dir);
    //  A user's snapshot of the clone holds it too, until the user deletes that one;
    //  user snapshots are never swept.
    char *mine_dir;
    held = s_saved (self, "sb_30", true, &held_dir);
    s_use (self, held, "sb_31");
    char *mine = s_saved (self, "sb_31", false, &mine_dir);
    assert (s_deleted (self, "sb_30") == 0 && s_deleted (self, "sb_31") == 0);
    assert (stat (held_dir, &st) == 0 && stat (mine_dir, &st) == 0);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_DELETE, "acc_a", mine));
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    assert (stat (held_dir, &st) == -1);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", held));
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    char *kept = s_saved (self, "sb_32", false, &clone_dir);
    assert (s_deleted (self, "sb_32") == 0 && stat (clone_dir, &st) == 0);
    free (kept);
    free (clone_dir);
    free (held);
    free (held_dir);
    free (mine);
    free (mine_dir);

    //  A fork's capture: its copies stand on it from snap.begin; nobody but an operator
    //  lists it; it goes with the last copy, and one nothing stands on goes at a start.
    char *fork_dir = NULL, *lone_dir = NULL;
    const char *copies[] = {"sb_41", "sb_42", NULL};
    char *fork = s_ready (self, "sb_40", SBX_SNAPSHOT_KIND_FORK, copies, &fork_dir);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_LIST, "acc_a", NULL));
    for (size_t i = 0; i < sbx_msg_snapshot_list_ok (reply)->snapshots.count; i++)
        assert (!streq (sbx_msg_snapshot_list_ok (reply)->snapshots.items[i].id, fork));
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", fork));
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->kind == SBX_SNAPSHOT_KIND_FORK);
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->users.count == 2);
    sbx_msg_destroy (&reply);
    size_t removed = s_deleted (self, "sb_41");
    assert (removed == 0 && stat (fork_dir, &st) == 0);
    removed = s_deleted (self, "sb_42");
    assert (removed == 1 && stat (fork_dir, &st) == -1);
    char *lone = s_ready (self, "sb_40", SBX_SNAPSHOT_KIND_FORK, NULL, &lone_dir);
    snap_server_destroy (&self);
    self = snap_server_new (config);
    assert (self && stat (lone_dir, &st) == -1);
    //  A failed capture of a fork leaves no record (the fork says why).
    begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, "sb_40");
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    sbx_msg_snap_begin (begin)->kind = SBX_SNAPSHOT_KIND_FORK;
    sbx_strlist_append (&sbx_msg_snap_begin (begin)->users, "sb_43");
    reply = s_ask (self, begin);
    char *lost = strdup (sbx_msg_snap_begin_ok (reply)->snapshot_id);
    sbx_msg_destroy (&reply);
    reply = s_finish (self, lost, "QEMU would not migrate", 0, 0);
    assert (sbx_msg_error (reply)->code == SBX_E_INTERNAL);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", lost));
    assert (sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    free (lost);
    //  Users only for a fork's capture.
    begin = sbx_msg_new (SBX_MSG_SNAP_BEGIN);
    sbx_str_set (&sbx_msg_snap_begin (begin)->account, "acc_a");
    sbx_str_set (&sbx_msg_snap_begin (begin)->sandbox_id, "sb_40");
    sbx_msg_snap_begin (begin)->type = SBX_SANDBOX_TYPE_SMALL;
    sbx_strlist_append (&sbx_msg_snap_begin (begin)->users, "sb_44");
    reply = s_ask (self, begin);
    assert (sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    free (fork);
    free (fork_dir);
    free (lone);
    free (lone_dir);

    //  Several hosts on one catalog (h2 stands for another host's snapshotd): a ready
    //  user snapshot has this host's copy; snap.replica.next offers it to h2; h2's copy
    //  recorded, nothing wants one; a delete on h2 queues the removal of this host's
    //  files, which the timer's sweep does.
    char *rep_dir;
    char *rep = s_begin (self, "acc_a", "sb_50", &rep_dir);
    s_write (rep_dir, "disk.qcow2", 10);
    s_write (rep_dir, "memory.state", 20);
    reply = s_finish (self, rep, NULL, 10, 20);
    sbx_snapshot_info_t *saved = sbx_msg_snap_finish_ok (reply)->snapshot;
    const char *here = snap_store_host (self->store);
    assert (saved->hosts.count == 1 && streq (saved->hosts.items[0], here));
    sbx_msg_destroy (&reply);
    sbx_msg_t *next = sbx_msg_new (SBX_MSG_SNAP_REPLICA_NEXT);
    sbx_strlist_append (&sbx_msg_snap_replica_next (next)->hosts, "h2");
    sbx_strlist_append (&sbx_msg_snap_replica_next (next)->givers, here);
    //  (The test's older user snapshots want a copy too: skipped.)
    zlist_t *older = zlist_new ();
    zlist_autofree (older);
    snap_store_wanting (self->store, s_collect_id, older);
    for (char *id = zlist_first (older); id; id = zlist_next (older))
        if (!streq (id, rep))
            sbx_strlist_append (&sbx_msg_snap_replica_next (next)->skip, id);
    zlist_destroy (&older);
    sbx_msg_t *again = sbx_msg_dup (next);
    sbx_msg_t *skipped = sbx_msg_dup (next);
    reply = s_ask (self, next);
    sbx_snap_replica_next_ok_t *wanted = sbx_msg_snap_replica_next_ok (reply);
    assert (streq (wanted->snapshot_id, rep) && streq (wanted->from, here));
    assert (streq (wanted->to, "h2") && streq (wanted->sandbox_id, "sb_50"));
    sbx_msg_destroy (&reply);
    sbx_strlist_append (&sbx_msg_snap_replica_next (skipped)->skip, rep);
    reply = s_ask (self, skipped);
    assert (reply->type == SBX_MSG_SNAP_REPLICA_NEXT_OK &&
            !sbx_msg_snap_replica_next_ok (reply)->snapshot_id);
    sbx_msg_destroy (&reply);
    char *catalog = zsys_sprintf ("%s/snapshotd/snapshots.db", dir);
    snap_store_t *h2 = snap_store_new (catalog, "h2");
    assert (h2 && snap_store_copy_add (h2, rep, "h2", sbx_clock_now_ms ()) == 0);
    reply = s_ask (self, again);
    assert (!sbx_msg_snap_replica_next_ok (reply)->snapshot_id);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, s_client (SBX_MSG_SNAPSHOT_GET, "acc_a", rep));
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->hosts.count == 2);
    sbx_msg_destroy (&reply);
    //  h2 gone for good (away): its copy does not count, h3 gets a new second one.
    sbx_msg_t *gone = sbx_msg_new (SBX_MSG_SNAP_REPLICA_NEXT);
    sbx_strlist_append (&sbx_msg_snap_replica_next (gone)->hosts, "h3");
    sbx_strlist_append (&sbx_msg_snap_replica_next (gone)->givers, here);
    sbx_strlist_append (&sbx_msg_snap_replica_next (gone)->away, "h2");
    older = zlist_new ();
    zlist_autofree (older);
    snap_store_wanting (self->store, s_collect_id, older);
    for (char *id = zlist_first (older); id; id = zlist_next (older))
        if (!streq (id, rep))
            sbx_strlist_append (&sbx_msg_snap_replica_next (gone)->skip, id);
    zlist_destroy (&older);
    reply = s_ask (self, gone);
    wanted = sbx_msg_snap_replica_next_ok (reply);
    assert (wanted->snapshot_id && streq (wanted->snapshot_id, rep));
    assert (streq (wanted->from, here) && streq (wanted->to, "h3"));
    sbx_msg_destroy (&reply);
    //  A copy said done for what is not a snapshot here, or not an id: refused.
    sbx_msg_t *done = sbx_msg_new (SBX_MSG_SNAP_REPLICA_DONE);
    sbx_str_set (&sbx_msg_snap_replica_done (done)->snapshot_id, "snap_notthere");
    reply = s_ask (self, done);
    assert (sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    done = sbx_msg_new (SBX_MSG_SNAP_REPLICA_DONE);
    sbx_str_set (&sbx_msg_snap_replica_done (done)->snapshot_id, "snap_../../etc");
    reply = s_ask (self, done);
    assert (sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    assert (snap_store_delete (h2, rep) == 0);
    assert (stat (rep_dir, &st) == 0); //  this host's files wait for its sweep
    s_removals (self);
    assert (stat (rep_dir, &st) == -1);
    int queued = 0;
    snap_store_removals (self->store, s_count_user, &queued);
    assert (queued == 0);
    snap_store_destroy (&h2);
    free (catalog);
    free (rep);
    free (rep_dir);

    //  No caller on a client request, and requests snapshotd does not serve.
    sbx_msg_t *anonymous = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
    reply = s_ask (self, anonymous);
    assert (sbx_msg_error (reply)->code == SBX_E_UNAUTHENTICATED);
    sbx_msg_destroy (&reply);
    reply = s_ask (self, sbx_msg_new (SBX_MSG_VM_LIST));
    assert (sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);

    free (one);
    free (path);
    free (bad);
    free (bad_dir);
    free (failed);
    free (failed_dir);
    free (child);
    free (child_dir);
    snap_server_destroy (&self);
    snap_server_destroy (&self);
    sbx_config_destroy (&config);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}
