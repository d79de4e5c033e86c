/*  sbx_testcluster - see sbx_testcluster.h */
#include "sbx_testcluster.h"
#include "sbx_dqlite.h"
#include "sbx_dqnode.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    uint64_t id;
    char address[64];
    char dir[256];
    sbx_dqnode_t *node;
} s_node_t;

struct _sbx_testcluster_t {
    int count;
    char dir[128];
    s_node_t nodes[SBX_TESTCLUSTER_MAX];
};

int sbx_testcluster_free_port (void)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    int port = -1;
    if (bind (fd, (struct sockaddr *) &sin, sizeof sin) == 0 &&
        getsockname (fd, (struct sockaddr *) &sin, &len) == 0)
        port = ntohs (sin.sin_port);
    close (fd);
    return port;
}

int sbx_testcluster_start (sbx_testcluster_t *self, int node)
{
    s_node_t *n = &self->nodes[node];
    if (n->node)
        return 0;
    n->node = sbx_dqnode_new (n->id, n->address, n->dir);
    //  Fast elections for tests: a leader is missed after about 0.15 s of silence.
    if (!n->node || sbx_dqnode_set_latency_ms (n->node, 5) || sbx_dqnode_start (n->node)) {
        sbx_dqnode_destroy (&n->node);
        return -1;
    }
    return 0;
}

void sbx_testcluster_stop (sbx_testcluster_t *self, int node)
{
    sbx_dqnode_destroy (&self->nodes[node].node);
}

static sbx_dqlite_t *s_leader_connection (sbx_testcluster_t *self)
{
    const char *addresses[SBX_TESTCLUSTER_MAX];
    size_t count = 0;
    for (int i = 0; i < self->count; i++)
        if (self->nodes[i].node)
            addresses[count++] = self->nodes[i].address;
    for (int tries = 0; tries < 100; tries++) {
        sbx_dqlite_t *c = sbx_dqlite_connect_leader (addresses, count, 1000, NULL, NULL);
        if (c)
            return c;
        usleep (100 * 1000);
    }
    return NULL;
}

sbx_testcluster_t *sbx_testcluster_new (int count)
{
    if (count < 1 || count > SBX_TESTCLUSTER_MAX)
        return NULL;
    //  A node's peers may go away while it writes to them.
    signal (SIGPIPE, SIG_IGN);
    sbx_testcluster_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    snprintf (self->dir, sizeof self->dir, "/tmp/sbx_testcluster.XXXXXX");
    if (!mkdtemp (self->dir)) {
        free (self);
        return NULL;
    }
    self->count = count;
    for (int i = 0; i < count; i++) {
        s_node_t *n = &self->nodes[i];
        snprintf (n->address, sizeof n->address, "127.0.0.1:%d", sbx_testcluster_free_port ());
        snprintf (n->dir, sizeof n->dir, "%s/node%d", self->dir, i);
        n->id = i == 0 ? 1 : sbx_dqnode_new_id (n->address);
        if (sbx_testcluster_start (self, i))
            goto failed;
    }
    sbx_dqlite_t *leader = s_leader_connection (self);
    if (!leader)
        goto failed;
    for (int i = 1; i < count; i++)
        if (sbx_dqlite_add (leader, self->nodes[i].id, self->nodes[i].address) ||
            sbx_dqlite_assign (leader, self->nodes[i].id, SBX_DQ_VOTER)) {
            fprintf (stderr, "testcluster: cannot add node %d: %s\n", i,
                     sbx_dqlite_errmsg (leader));
            sbx_dqlite_destroy (&leader);
            goto failed;
        }
    sbx_dqlite_destroy (&leader);
    return self;
failed:
    sbx_testcluster_destroy (&self);
    return NULL;
}

void sbx_testcluster_destroy (sbx_testcluster_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sbx_testcluster_t *self = *self_p;
    for (int i = 0; i < self->count; i++)
        sbx_testcluster_stop (self, i);
    char command[256];
    snprintf (command, sizeof command, "rm -rf '%s'", self->dir);
    if (system (command) != 0)
        fprintf (stderr, "testcluster: cannot remove %s\n", self->dir);
    free (self);
    *self_p = NULL;
}

size_t sbx_testcluster_addresses (sbx_testcluster_t *self, const char **addresses)
{
    for (int i = 0; i < self->count; i++)
        addresses[i] = self->nodes[i].address;
    return (size_t) self->count;
}

const char *sbx_testcluster_address (sbx_testcluster_t *self, int node)
{
    return self->nodes[node].address;
}

uint64_t sbx_testcluster_id (sbx_testcluster_t *self, int node)
{
    return self->nodes[node].id;
}

const char *sbx_testcluster_dir (sbx_testcluster_t *self, int node)
{
    return self->nodes[node].dir;
}

int sbx_testcluster_leader (sbx_testcluster_t *self)
{
    sbx_dqlite_t *c = s_leader_connection (self);
    if (!c)
        return -1;
    int found = -1;
    for (int i = 0; i < self->count; i++)
        if (strcmp (self->nodes[i].address, sbx_dqlite_address (c)) == 0)
            found = i;
    sbx_dqlite_destroy (&c);
    return found;
}

int sbx_testcluster_follower (sbx_testcluster_t *self)
{
    int leader = sbx_testcluster_leader (self);
    for (int i = 0; i < self->count; i++)
        if (i != leader && self->nodes[i].node)
            return i;
    return -1;
}
