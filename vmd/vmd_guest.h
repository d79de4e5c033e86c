/*  vmd_guest - one sandbox's guest on this host: its lifecycle, QEMU, QMP, agent link
    and files.

    A guest lives in <data-dir>/vms/<sandbox_id>/ (0700): overlay.qcow2, memory.state
    while stopped, qmp.sock, agent.sock, console.sock/console.log, qemu.log, qemu.pid and
    guest.json (id, hostname, type, no_network, state, reason, base image directory,
    port forwards),
    rewritten atomically at every state change so that a restarted vmd finds it again.

    The lifecycle is decided by vmd_lifecycle (state x event tables made from
    schemas/lifecycle.json: docs/lifecycle.md) and performed here. Requests (create,
    stop, resume, delete, snapshot) that it takes start an operation whose outcome comes
    later through the done callback, with the request's rid; those it does not take are
    refused at once (failed_precondition). A guest that dies on its own calls failed.
    Both run from the loop; neither may destroy the guest (the server sweeps guests
    whose state is deleted).
*/
#ifndef VMD_GUEST_H_INCLUDED
#define VMD_GUEST_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx_msg.h"
#include "vmd_agentlink.h"

typedef struct _vmd_guest_t vmd_guest_t;

//  The default restore deadline: a restore takes ≈ 0.5 s under TCG; one that has not
//  ended by then never will (a QEMU left paused in -incoming spins on a core).
#define VMD_GUEST_RESTORE_MS 30000

//  An operation ended: code SBX_OK, or an error with a message for a person.
typedef void (vmd_guest_done_fn) (vmd_guest_t *guest, uint64_t rid, sbx_code_t code,
                                  const char *message, void *arg);
//  The guest failed on its own (QEMU died, the agent vanished for good).
typedef void (vmd_guest_failed_fn) (vmd_guest_t *guest, const char *reason, void *arg);

//  Sandbox types index these arrays (SBX_SANDBOX_TYPE_SMALL..LARGE; 0 unset).
#define VMD_GUEST_TYPES (SBX_SANDBOX_TYPE_LARGE + 1)

//  What every guest of one vmd shares (owned by the server, outlives its guests).
typedef struct {
    zloop_t *loop;
    const char *vms_dir;   //  <data-dir>/vms
    const char *image_dir; //  base image for new guests (vmlinux, initrd.img, rootfs.ext4)
    //  A type's own image (image_dir.TYPE, e.g. the docker variant), NULL: image_dir.
    const char *type_image[VMD_GUEST_TYPES];
    const char *qemu_user; //  whom QEMU runs as when vmd is root (NULL: vmd_qemu's default)
    //  A uid of its own for each guest's QEMU (vmd_guest_set_uid), from this range, with
    //  the QEMU user's group: the host's firewall tells guests apart by it (egress rules)
    //  and no guest's QEMU can touch another's files. uid_count 0: all run as qemu_user.
    uid_t uid_first;
    uint32_t uid_count;
    gid_t gid; //  the QEMU user's group
    //  A restore (QEMU started with -incoming: from a snapshot, a template, or a resume)
    //  must end with the agent's answer within this, else QEMU is killed and the
    //  operation fails (0: VMD_GUEST_RESTORE_MS).
    uint32_t restore_ms;
    //  A frame from the guest's agent must arrive whole within this, else the channel is
    //  reset (0: VMD_AGENTLINK_FRAME_TIMEOUT; vmd_agentlink).
    uint32_t frame_timeout_ms;
    vmd_guest_done_fn *done;
    vmd_guest_failed_fn *failed;
    //  Asks the owner to call vmd_guest_collect soon, from a poller (not a timer).
    void (*wake) (void *arg);
    void *arg;
} vmd_guest_env_t;

//  The image new guests of type boot: its own, else env's image_dir.
const char *vmd_guest_env_image (const vmd_guest_env_t *env, sbx_sandbox_type_t type);

//  A new guest (state creating, nothing on disk yet) on its type's image, or NULL for an
//  id that can't be a directory name ([A-Za-z0-9_-], 1-64) or a hostname vmd_qemu refuses.
vmd_guest_t *vmd_guest_new (const vmd_guest_env_t *env, const char *id, const char *hostname,
                            sbx_sandbox_type_t type, bool no_network);
//  The guest described by vms_dir/id/guest.json after a vmd restart: running guests are
//  re-adopted (QMP and agent reconnect), stopped ones stay stopped, guests whose QEMU is
//  gone are in error. NULL when there is nothing usable there.
vmd_guest_t *vmd_guest_load (const vmd_guest_env_t *env, const char *id);
//  Forgets the guest: closes QMP and the agent link, leaves QEMU and files alone.
void vmd_guest_destroy (vmd_guest_t **self_p);

//  Destroys the QMP connection and agent link the guest has let go of. zloop runs a
//  timer cancelled by an earlier timer of the same turn, so objects with timers of
//  their own are only destroyed from a poller handler, after the turn's timers ran.
void vmd_guest_collect (vmd_guest_t *self);

//  Before vmd_guest_create: the guest is made from the snapshot in dir (snapshotd's):
//  its overlay stands on dir/disk.qcow2, and with restore its memory comes from
//  dir/memory.state (else a cold boot from that disk). image_dir (NULL: vmd's) is the
//  image the snapshot's disk stands on, whose kernel the guest keeps. 0, or -1.
int vmd_guest_set_origin (vmd_guest_t *self, const char *dir, const char *image_dir, bool restore);

//  Before vmd_guest_create: the guest's RAM is the memfd fd (vmd_ramfile; borrowed, used
//  by the create's spawn only). shared: a template's own guest, whose memory states
//  then leave the RAM out; else a clone of the template whose origin (set_origin) has
//  that state: it maps the sealed memfd copy-on-write. -1: anonymous RAM (the default).
void vmd_guest_set_ram (vmd_guest_t *self, int fd, bool shared);

//  Operations. Each returns 0 when started (done follows), or -1 with err set when the
//  guest's state does not allow it or it could not start (nothing is left behind).
int vmd_guest_create (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err);
int vmd_guest_stop (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err);
int vmd_guest_resume (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err);
int vmd_guest_delete (vmd_guest_t *self, uint64_t rid, uint32_t timeout_ms, sbx_err_t *err);

//  Passes an agent request (taken) to a ready guest's agent; fn gets its answer with
//  the request's rid. -1 with err when the guest is not ready (the request is freed).
int vmd_guest_agent (vmd_guest_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                     vmd_agentlink_reply_fn *fn, void *arg, sbx_err_t *err);

//  Port forwards: 127.0.0.1:<host port> on this host → the guest's TCP port, through
//  QEMU's user network (QMP hostfwd). vmd picks a free host port; forwards are kept in
//  guest.json, re-added when the guest resumes and when a restarted vmd re-adopts it,
//  and go with QEMU at a stop (to come back at the resume) and with the guest at delete.
#define VMD_GUEST_FWD_HOST "127.0.0.1"
#define VMD_GUEST_MAX_FWD  64

//  A forward's outcome: code SBX_OK and the host port (0 after a removal), or an error.
typedef void (vmd_guest_port_fn) (vmd_guest_t *guest, sbx_code_t code, const char *message,
                                  int host_port, void *arg);

//  Adds (guest ready) or removes (any state) the forward of guest_port. Returns 1 when
//  answered at once (the port was forwarded already: *host_port says where; or removing
//  one that is not there: *host_port is 0), 0 when started (fn follows), -1 with err.
//  The host ports of its forwards (at most max into host_ports); how many it has.
size_t vmd_guest_forwards (vmd_guest_t *self, int *host_ports, size_t max);

int vmd_guest_port (vmd_guest_t *self, int guest_port, bool remove, int *host_port,
                    vmd_guest_port_fn *fn, void *arg, sbx_err_t *err);

//  A snapshot's end: code SBX_OK and the sizes of disk.qcow2 and memory.state, or an
//  error (the files are removed).
typedef void (vmd_guest_snapshot_fn) (vmd_guest_t *guest, sbx_code_t code, const char *message,
                                      uint64_t disk_bytes, uint64_t memory_bytes, void *arg);

//  Captures the guest into dir (absolute, existing): disk.qcow2 (a copy of its overlay,
//  standing on the same base) and memory.state. A ready guest is paused (QMP stop),
//  its memory migrated into the file while QEMU stays, its overlay copied by a child
//  process, then continued; a stopped guest's files are copied. Written under .tmp
//  names, fsynced (by the child), renamed. Live (a fork's capture of a ready guest): the
//  memory is migrated while the guest runs (QEMU pauses it for the last pages), the
//  overlay copied without an fsync, and the files synced by a child after the guest
//  runs again, the answer not waiting for it. 0 when started (fn follows, from the
//  loop, or before this returns when the capture cannot even begin), -1 with err when
//  the state does not allow it. Stop and resume wait for its end; delete ends it with
//  an error.
int vmd_guest_snapshot (vmd_guest_t *self, const char *dir, bool live, uint32_t timeout_ms,
                        vmd_guest_snapshot_fn *fn, void *arg, sbx_err_t *err);

//  How long the last capture kept the guest paused (QEMU's STOP to its RESUME), ms: in
//  fn, the one that ends. 0 for a stopped guest's.
uint64_t vmd_guest_paused_ms (vmd_guest_t *self);

//  True when id is usable as a sandbox id here ([A-Za-z0-9_-]{1,64}: it names files).
bool vmd_guest_id_valid (const char *id);

//  Before vmd_guest_create: the uid its QEMU runs as (from env's range; 0: qemu_user).
//  A loaded guest has the uid that owns its directory when that is in the range.
void vmd_guest_set_uid (vmd_guest_t *self, uid_t uid);
uid_t vmd_guest_uid (vmd_guest_t *self);

//  The image directory its disk stands on (recorded with a snapshot of it).
const char *vmd_guest_image (vmd_guest_t *self);

const char *vmd_guest_id (vmd_guest_t *self);
const char *vmd_guest_hostname (vmd_guest_t *self);
bool vmd_guest_no_network (vmd_guest_t *self);

//  A guest whose files came from another host (vmd_ship): vms/<id> holds its overlay and
//  memory state; it is stopped, and its guest.json says so. 0 or -1.
int vmd_guest_taken (vmd_guest_t *self);
sbx_sandbox_state_t vmd_guest_state (vmd_guest_t *self);
sbx_sandbox_type_t vmd_guest_type (vmd_guest_t *self);
//  QEMU's pid while it runs, else 0.
pid_t vmd_guest_pid (vmd_guest_t *self);
//  Why it is in error, or NULL.
const char *vmd_guest_reason (vmd_guest_t *self);

#endif
