/*  sbx_testcluster - a dqlite cluster of this process for tests: N nodes on loopback
    ports of their own, in a temporary directory, node 0 the first (id 1), the others
    added by it and made voters. Nodes stop and start again with their data, as a host's
    broker would. Tests only: built into the test runners.
*/
#ifndef SBX_TESTCLUSTER_H_INCLUDED
#define SBX_TESTCLUSTER_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#define SBX_TESTCLUSTER_MAX 5

typedef struct _sbx_testcluster_t sbx_testcluster_t;

//  Starts count (1..SBX_TESTCLUSTER_MAX) nodes and waits until all are voters. NULL
//  on failure.
sbx_testcluster_t *sbx_testcluster_new (int count);
void sbx_testcluster_destroy (sbx_testcluster_t **self_p);

//  The nodes' addresses (stopped ones too), in node order; their count.
size_t sbx_testcluster_addresses (sbx_testcluster_t *self, const char **addresses);
const char *sbx_testcluster_address (sbx_testcluster_t *self, int node);
uint64_t sbx_testcluster_id (sbx_testcluster_t *self, int node);
const char *sbx_testcluster_dir (sbx_testcluster_t *self, int node);

//  The node that leads, as the running nodes say (waits up to 10 s for one), or -1.
int sbx_testcluster_leader (sbx_testcluster_t *self);
//  A running node that does not lead, or -1.
int sbx_testcluster_follower (sbx_testcluster_t *self);

//  Stops node (its threads; its data stays), or starts it again.
void sbx_testcluster_stop (sbx_testcluster_t *self, int node);
int sbx_testcluster_start (sbx_testcluster_t *self, int node);

//  A free TCP port on 127.0.0.1 (bound and released: free a moment ago).
int sbx_testcluster_free_port (void);

#endif
