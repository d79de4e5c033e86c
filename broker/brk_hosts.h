/*  brk_hosts - the hosts of a cluster and its control nodes, for operators: cluster.token
    (a new host's CurveZMQ key pair, recorded so that every control node admits it),
    host.list, host.remove, cluster.nodes (the dqlite cluster's members, asked of this
    node). Operators only; on one machine (no cluster) they are failed_precondition:
    `sbx cluster init` makes the first node of one.
*/
#ifndef BRK_HOSTS_H_INCLUDED
#define BRK_HOSTS_H_INCLUDED

#include "brk_ctx.h"

//  Each returns its reply (the .ok message or a catalogued error), never NULL.
sbx_msg_t *brk_hosts_token (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_hosts_list (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_hosts_remove (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_hosts_nodes (brk_ctx_t *ctx, sbx_msg_t *request);
//  host.drain: a vmd drained (brk_move moves its stopped sandboxes; nothing new is placed
//  there), or no longer. On one machine too (several vmds under one broker).
sbx_msg_t *brk_hosts_drain (brk_ctx_t *ctx, sbx_msg_t *request);
//  cluster.remove: a control node out of the dqlite cluster (the leader hands over first).
sbx_msg_t *brk_hosts_remove_node (brk_ctx_t *ctx, sbx_msg_t *request);

//  A cluster's members' addresses (HOST:PORT), appended to addresses: nothing on one
//  machine. 0, or -1 when this node does not answer.
int brk_hosts_members (brk_ctx_t *ctx, sbx_strlist_t *addresses);

//  Whether name can name a host: 1 to 64 letters, digits, - and ., not starting with
//  either of those two.
bool brk_hosts_valid_name (const char *name);

#endif
