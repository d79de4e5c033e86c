/*  snap_store - snapshotd's catalog (DIR/snapshotd/snapshots.db): one row per snapshot,
    its labels, and which sandboxes were made from which snapshot.

    The only snapshotd module that includes sqlite3.h. WAL, synchronous=FULL, numbered
    migrations, statements prepared once. A row is inserted as `saving` before any file
    is written, and becomes `ready` only once the files are complete and durable
    (snap_server checks them); a `saving` row found at start belongs to a save that
    died with the previous process and is marked failed (snap_store_fail_saving).
*/
#ifndef SNAP_STORE_H_INCLUDED
#define SNAP_STORE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_dqlite.h"

typedef struct _snap_store_t snap_store_t;

//  A snapshot. Strings are copies freed by snap_record_clear when filled by the store;
//  the caller's own for insert.
typedef struct {
    char *id;
    char *account;
    char *name;
    char *sandbox_id;
    char *type;  //  small, medium, large
    char *state; //  saving, ready, failed
    char *kind;  //  user, automatic, fork
    char *image; //  the image directory its disk stands on
    char *qemu_version;
    char *parent; //  the snapshot its disk stands on, or NULL
    char *reason; //  why it failed
    uint64_t disk_bytes, memory_bytes, created_ms;
    bool sandbox_deleted; //  the sandbox it was saved from is deleted
    char *key_id;         //  the API key that created that sandbox, or NULL
    char *host;           //  the host that saved it (read only: the store's own on insert)
} snap_record_t;

void snap_record_clear (snap_record_t *record);

//  Opens (creating it 0600) and migrates the catalog; host names this snapshotd's host
//  (its instance: the vmd's beside it), whose saves and copies it records. NULL on
//  failure (logged).
snap_store_t *snap_store_new (const char *path, const char *host);
//  The cluster's catalog (database "snapshots"), shared by the snapshotd of every host.
snap_store_t *snap_store_new_cluster (const sbx_dqlite_cluster_t *cluster, const char *host);
void snap_store_destroy (snap_store_t **self_p);
bool snap_store_is_cluster (snap_store_t *self);
const char *snap_store_host (snap_store_t *self);

//  Records of no host (a catalog from before hosts) become this host's, and the ready
//  ones its copies. How many, or -1.
int snap_store_adopt (snap_store_t *self);
//  The first node of a cluster made from one machine: the file's catalog copied in once
//  (its rows this host's). 1 copied, 0 nothing to do (done, or the cluster has one),
//  -1 with err.
int snap_store_import (snap_store_t *self, const char *path, char *err, size_t err_size);

//  A new `saving` record with its labels (keys[i] → values[i]), in one transaction.
int snap_store_insert (snap_store_t *self, const snap_record_t *record, char **keys, char **values,
                       size_t labels);
//  0 and the record, 1 when there is none, -1 on error.
int snap_store_find (snap_store_t *self, const char *id, snap_record_t *record);
//  A saving record becomes ready (reason NULL: with its sizes, image and QEMU version;
//  its files this host's first copy) or failed (with the reason). 0, 1 when it is not saving (any
//  more), -1 on error.
int snap_store_finish (snap_store_t *self, const char *id, const char *reason, uint64_t disk_bytes,
                       uint64_t memory_bytes, const char *image, const char *qemu_version);
//  Removes the record, its labels, uses and copies, queueing the removal of the copies'
//  files on the other hosts (snap_store_removals there). 0, or -1.
int snap_store_delete (snap_store_t *self, const char *id);

//  Another host keeps a whole copy now. 0, 1 when the snapshot is gone or not ready,
//  -1 on error.
int snap_store_copy_add (snap_store_t *self, const char *id, const char *host, uint64_t at_ms);
//  Does host (this one when NULL) keep a copy? 1, 0, or -1.
int snap_store_has_copy (snap_store_t *self, const char *id, const char *host);

typedef void (snap_store_record_fn) (const snap_record_t *record, void *arg);
typedef void (snap_store_pair_fn) (const char *a, const char *b, void *arg);
typedef void (snap_store_id_fn) (const char *id, void *arg);

//  The account's snapshots (every account's when NULL), newest first. 0, or -1.
int snap_store_list (snap_store_t *self, const char *account, snap_store_record_fn *fn, void *arg);
//  A snapshot's labels as (key, value). 0, or -1.
int snap_store_labels (snap_store_t *self, const char *id, snap_store_pair_fn *fn, void *arg);

//  A sandbox made from a snapshot: remembered for the dependency check, and as the
//  parent of snapshots saved from that sandbox. 0, or -1.
int snap_store_use_add (snap_store_t *self, const char *snapshot_id, const char *sandbox_id);
//  A deleted sandbox stands on nothing any more. 0, or -1.
int snap_store_use_drop (snap_store_t *self, const char *sandbox_id);
//  The sandbox is deleted: its snapshots say so (an automatic one then goes once
//  nothing stands on it). 0, or -1.
int snap_store_sandbox_deleted (snap_store_t *self, const char *sandbox_id);
//  The sandboxes made from a snapshot. 0, or -1.
int snap_store_users (snap_store_t *self, const char *snapshot_id, snap_store_id_fn *fn, void *arg);
//  The snapshot a sandbox was made from, or NULL (caller frees).
char *snap_store_origin (snap_store_t *self, const char *sandbox_id);
//  A snapshot (not failed) whose disk stands on this one, or NULL (caller frees).
char *snap_store_child (snap_store_t *self, const char *snapshot_id);

//  A sandbox's automatic snapshots that are not being saved, newest first. 0, or -1.
int snap_store_automatic (snap_store_t *self, const char *sandbox_id, snap_store_id_fn *fn,
                          void *arg);

//  The ready captures of forks (kind fork), any account's. 0, or -1.
int snap_store_forks (snap_store_t *self, snap_store_id_fn *fn, void *arg);

//  The hosts that keep a copy of the snapshot, the first first. 0, or -1.
int snap_store_copies (snap_store_t *self, const char *id, snap_store_id_fn *fn, void *arg);
//  The snapshots with a copy on host, at most 64. 0, or -1.
int snap_store_copies_on (snap_store_t *self, const char *host, snap_store_id_fn *fn, void *arg);
//  The snapshots whose files this host is to remove (deleted elsewhere), at most 64. 0, or -1.
int snap_store_removals (snap_store_t *self, snap_store_id_fn *fn, void *arg);
int snap_store_removal_done (snap_store_t *self, const char *id);
//  Ready user snapshots with fewer than two copies, oldest first, at most 64. 0, or -1.
int snap_store_wanting (snap_store_t *self, snap_store_id_fn *fn, void *arg);

//  Marks every saving record of this host failed with reason; fn gets each id (to remove its
//  files). Returns how many, or -1.
int snap_store_fail_saving (snap_store_t *self, const char *reason, snap_store_id_fn *fn,
                            void *arg);

void snap_store_test (bool verbose);

#endif
