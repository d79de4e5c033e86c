/*  vmd_ship - a vmd's side of moving a stopped sandbox to another host (broker/brk_move.h).

    Offer (vm.ship.offer, on the host that has it): a child qemu-img writes the guest's
    disk as one overlay on the image alone (its template's or snapshot's disk is this
    host's, not the other's) into vms/<id>/ship/, beside a link to its memory state; both
    are offered to the broker's ticket on the ship server (common/sbx_ship), bound where
    vmd.ship (HOST:PORT) says, with this host's CurveZMQ key pair. The answer says where,
    with what key, which files, and what image the other host must have.

    Take (vm.ship.take, on the other): the files are fetched into vms/<id>.incoming/, the
    overlay is pointed at this host's copy of the same image (the one its type boots here) (qemu-img
   rebase -u: the contents are the same), and the directory becomes vms/<id>; the owner (vmd_server)
    then makes the guest, stopped. A failure leaves nothing here.

    Snapshots (snapshot_id in the request): the same for snapshots/<id>/ of this host's
    store, staged in ship/<id>/ and landing in snapshots/<id>/ on the other, where its
    snapshotd records the copy (snap.replica.done): user snapshots are kept on two hosts.
    Files are offered below the data directory (vms/<id>/ship/…, ship/<id>/…).

    Both run beside the loop: qemu-img in a child watched by a timer, the fetch in its
    own thread whose pipe the loop reads.
*/
#ifndef VMD_SHIP_H_INCLUDED
#define VMD_SHIP_H_INCLUDED

#include "sbx_common.h"
#include "vmd_guest.h"

typedef struct _vmd_ship_t vmd_ship_t;

//  The answer to request (vm.ship.offer or vm.ship.take), to send (taken by the callee).
//  For a take that succeeded (took), the guest's files are in vms/<id>: the owner makes
//  the guest first.
typedef void (vmd_ship_done_fn) (const sbx_msg_t *request, sbx_msg_t **reply_p, bool took,
                                 void *arg);

//  vms_dir: <data-dir>/vms; images: the images this vmd's guests boot, per type
//  (vmd_guest_env_image; each directory's last component is its content hash), borrowed:
//  they outlive this. The ship server starts when vmd.ship is set. NULL on error.
vmd_ship_t *vmd_ship_new (sbx_config_t *config, zloop_t *loop, const char *vms_dir,
                          const vmd_guest_env_t *images, vmd_ship_done_fn *done, void *arg);
void vmd_ship_destroy (vmd_ship_t **self_p);

//  What an offer needs to know of the guest (stopped: vmd_server checks).
typedef struct {
    const char *id;
    const char *image_dir; //  the image its disk stands on
    const char *hostname;
    sbx_sandbox_type_t type;
    bool no_network;
} vmd_ship_guest_t;

//  vm.ship.offer: 0 (done is called with the answer later), or -1 and err. With the
//  request's snapshot_id, guest is NULL: snapshots/<id>/ is flattened into ship/<id>/.
int vmd_ship_offer (vmd_ship_t *self, const sbx_msg_t *request, const vmd_ship_guest_t *guest,
                    sbx_err_t *err);

//  vm.ship.take: 0 (done is called later), or -1 and err. A snapshot's copy lands in
//  snapshots/<id>/ (its files 0640, the QEMU group's, as a capture's) and done's took is
//  false: there is no guest to make.
int vmd_ship_take (vmd_ship_t *self, const sbx_msg_t *request, sbx_err_t *err);

//  The guest id resumes or goes here: an offer of its files ends (ticket withdrawn, its
//  ship/ directory removed).
void vmd_ship_forget (vmd_ship_t *self, const char *id);

void vmd_ship_test (bool verbose);

#endif
