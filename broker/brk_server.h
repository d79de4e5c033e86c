/*  brk_server - the broker: one ROUTER for every peer, one PUB for the tap, one loop.

    Peers connect as DEALERs. Workers say hello (role, instance, capacity) and heartbeat;
    the broker heartbeats back and drops a worker silent for three periods. Requests the
    broker serves itself (accounts, keys, replay, status) are answered from its store;
    requests for a worker role are routed to a worker of that role with their own rid
    and a deadline: the reply is forwarded to the client, or the client gets `timeout`
    when the deadline passes, or `unavailable` when no worker of that role is connected
    or the worker goes away. Nothing blocks on a peer.
*/
#ifndef BRK_SERVER_H_INCLUDED
#define BRK_SERVER_H_INCLUDED

#include "sbx_common.h"
#include "sbx_dqlite.h"

//  The broker as a czmq actor: args is the sbx_config_t (borrowed). Once started it
//  sends "READY" on the pipe when its sockets are bound and its store is open, or
//  "FAILED" when it can't start (the reason is logged); "$TERM" on the pipe stops it.
void brk_server_actor (zsock_t *pipe, void *args);

//  The same broker on a control node of a cluster (brk_control starts it while the
//  node leads): its store is the cluster's database on that node, and it takes no lock
//  of the data directory (brk_control holds it). args is a brk_server_args_t (borrowed).
typedef struct {
    sbx_config_t *config;
    const sbx_dqlite_cluster_t *cluster; //  where the database is: this node
    const char *node;                    //  this node's address, for sys.status
    const char *local;                   //  the socket its node listens on (this process)
} brk_server_args_t;
void brk_server_cluster_actor (zsock_t *pipe, void *args);

void brk_server_test (bool verbose);

#endif
