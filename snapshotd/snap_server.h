/*  snap_server - sbx-snapshotd's work: the snapshot store under DIR/snapshots/<id>/ and
    its catalog (snap_store), answering what the broker routes to snapshotd.

    Requests: snapshot.list, snapshot.get, snapshot.delete (clients', through the broker,
    with their caller), and the broker's own snap.begin (a saving record and an empty
    directory for vmd to write into), snap.finish (ready once the files are there with
    the sizes vmd reported, else failed and the files removed) and snap.use (a sandbox
    made from a snapshot). Every answer is immediate: the slow part of a save (vmd's
    capture) happens elsewhere, and removing a snapshot is a few unlinks.

    At start, a saving record belongs to a save that died with the previous process: it
    becomes failed and its files are removed; directories the catalog does not know
    (a crash between record and directory) are removed too.
*/
#ifndef SNAP_SERVER_H_INCLUDED
#define SNAP_SERVER_H_INCLUDED

#include "sbx_common.h"

typedef struct _snap_server_t snap_server_t;

//  Opens DIR/snapshotd/snapshots.db and DIR/snapshots/ (config borrowed). NULL on
//  failure (logged).
snap_server_t *snap_server_new (sbx_config_t *config);
void snap_server_destroy (snap_server_t **self_p);

//  Starts the timer that removes the files of copies deleted on other hosts. 0, or -1.
int snap_server_start (snap_server_t *self, zloop_t *loop);

//  The request handler to give the peer (arg: the server).
void snap_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

//  Answers one request (for the handler and the self-test). Takes nothing.
sbx_msg_t *snap_server_handle (snap_server_t *self, sbx_msg_t *request);

void snap_server_test (bool verbose);

#endif
