/*  sbx_dqnode - one dqlite node in this process: libdqlite behind one module.

    A node holds its share of the replicated databases (Raft log, snapshots) in its
    directory and serves dqlite's wire protocol (sbx_dqlite) on its bind address, to
    clients and to the other nodes. Its threads are libdqlite's own; this process talks to
    it as any client does, through the protocol.

        sbx_dqnode_t *node = sbx_dqnode_new (1, "10.0.0.1:9001", "/var/lib/sbx/control/dqlite");
        sbx_dqnode_start (node);        //  node 1 of a new cluster makes it, alone
        ...
        sbx_dqnode_destroy (&node);     //  stops it: the others elect a leader without it

    Node 1 bootstraps a new cluster the first time it starts (its directory empty); any
    other node starts empty and waits for the leader to add it (sbx_dqlite_add and
    sbx_dqlite_assign, through a client of the leader). A node started again with the
    same id, address and directory takes its place back.
*/
#ifndef SBX_DQNODE_H_INCLUDED
#define SBX_DQNODE_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

typedef struct _sbx_dqnode_t sbx_dqnode_t;

//  How a node reaches another node's address: a connected stream socket, or -1. NULL
//  dials TCP "host:port" itself.
typedef int (sbx_dqnode_dial_fn) (const char *address, void *arg);

//  Creates node id whose cluster address is address (what clients and the other nodes
//  dial), keeping its data in dir (made 0700 if missing). NULL (logged) on failure.
sbx_dqnode_t *sbx_dqnode_new (uint64_t id, const char *address, const char *dir);
void sbx_dqnode_destroy (sbx_dqnode_t **self_p);

//  Before start: where it listens when that is not address ("@" for an abstract socket
//  of this process, named by dqlite: sbx_dqnode_bind_address then tells it); how it
//  dials the others; the network's one-way latency, from which Raft's heartbeat and
//  election timeouts follow (default 20 ms: elections after about 0.6 s of silence).
int sbx_dqnode_set_bind (sbx_dqnode_t *self, const char *bind);
int sbx_dqnode_set_dial (sbx_dqnode_t *self, sbx_dqnode_dial_fn *dial, void *arg);
int sbx_dqnode_set_latency_ms (sbx_dqnode_t *self, unsigned ms);

//  Starts the node's threads. 0, or -1 (logged).
int sbx_dqnode_start (sbx_dqnode_t *self);

uint64_t sbx_dqnode_id (sbx_dqnode_t *self);
const char *sbx_dqnode_address (sbx_dqnode_t *self);
//  Where it listens, once started.
const char *sbx_dqnode_bind_address (sbx_dqnode_t *self);

//  A fresh id for a node that joins at address: random, never 0 or 1 (the first node's).
//  The node keeps it: it must start with the same id every time.
uint64_t sbx_dqnode_new_id (const char *address);

#endif
