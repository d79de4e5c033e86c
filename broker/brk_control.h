/*  brk_control - the broker of a control node: this host's dqlite node, and the broker
    that serves while that node leads the cluster and stands by while it does not.

    With control.address set (HOST:PORT, this node's address in the cluster) sbx-broker
    runs this actor instead of brk_server's directly. It

    - keeps the data directory's lock (one broker per directory, as brk_server does);
    - starts the dqlite node (sbx_dqnode) with its data in DIR/control/dqlite: the first
      time, either as the first node of a new cluster (control.join unset: node id 1) or
      as a new node that asks a node of control.join to add it as a voter;
    - while its node does not lead, binds broker.bind itself and answers every message
      with peer.standby (and sys.status with control "standby"), doing nothing else;
    - once its node leads, hands broker.bind to a brk_server (brk_server_cluster_actor)
      whose store is the cluster's database on this node; and stops that server at once
      when the node no longer leads (a write it tried then would fail anyway: its store
      does not follow a new leader), back to standing by. Leadership is read from the
      node every 100 ms.
    - When told to stop while it leads, hands leadership to another voter first, so a
      planned restart costs the others no election timeout.

    DIR/control/node.json keeps the node's id and address, and whether it has joined:
    the node must come back with the same ones every time.
*/
#ifndef BRK_CONTROL_H_INCLUDED
#define BRK_CONTROL_H_INCLUDED

#include "sbx_common.h"

//  args is the sbx_config_t (borrowed). As brk_server_actor: sends "READY" on the pipe
//  once the node runs and broker.bind is served (standing by or leading), or "FAILED";
//  "$TERM" stops it.
void brk_control_actor (zsock_t *pipe, void *args);

//  True when the configuration makes this broker a control node (control.address set).
bool brk_control_enabled (sbx_config_t *config);

void brk_control_test (bool verbose);

#endif
