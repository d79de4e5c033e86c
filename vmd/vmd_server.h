/*  vmd_server - sbx-vmd proper: the vm.* requests the broker sends, this host's guests.

    Owns <data-dir>/vms/ (one vmd_guest per sandbox) and <data-dir>/images/<input_hash>/
    (hard links to, or copies of, the base image the guests' overlays name, so that a
    rebuilt image never changes under a guest). At start it re-adopts the guests it
    finds there. Answers vm.create, vm.stop, vm.resume, vm.delete, vm.agent, vm.port,
    vm.list and vm.metrics (the guests' samples, vmd_sampler);
    tells the broker vm.failed when a guest dies on its own.

    Config keys: image_dir (default <exe dir>/../image), image_dir.TYPE (the image
    sandboxes of that type boot instead, e.g. the docker variant), vmd.capacity (8),
    vmd.qemu_user (whom QEMU runs as when vmd is root; default sbx-qemu, else nobody),
    vmd.metrics_interval_ms (5000; 0: no samples), vmd.egress_resolver (where the DNS
    relays of guests with domain rules ask; default: resolv.conf's first IPv4 resolver).
*/
#ifndef VMD_SERVER_H_INCLUDED
#define VMD_SERVER_H_INCLUDED

//  Guests' own QEMU uids start here (vmd.guest_uid_first), far above any account.
#define VMD_SERVER_GUEST_UID_FIRST 1879048192u

#include <czmq.h>
#include <stdbool.h>

#include "sbx_config.h"
#include "sbx_peer.h"

typedef struct _vmd_server_t vmd_server_t;

//  Prepares the data and image directories and loads the guests found there. NULL
//  (logged) when the image or the directories are unusable.
vmd_server_t *vmd_server_new (sbx_config_t *config, zloop_t *loop);
//  Forgets the guests; their QEMUs keep running for the next vmd to adopt.
void vmd_server_destroy (vmd_server_t **self_p);

//  The broker connection: capacity and use go into its hello and heartbeats.
void vmd_server_attach (vmd_server_t *self, sbx_peer_t *peer);
uint64_t vmd_server_capacity (vmd_server_t *self);

//  The sbx_peer request handler (arg is the server).
void vmd_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

void vmd_server_test (bool verbose);

#endif
