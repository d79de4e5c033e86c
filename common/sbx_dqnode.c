/*  sbx_dqnode - see sbx_dqnode.h */
#include "sbx_dqnode.h"
#include "sbx_log.h"

#include <dqlite.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct _sbx_dqnode_t {
    dqlite_node *node;
    uint64_t id;
    char *address;
    char *dir;
    bool started;
    bool bound;
    sbx_dqnode_dial_fn *dial;
    void *dial_arg;
};

//  dqlite's connect callback: its arg is the node.
static int s_connect (void *arg, const char *address, int *fd)
{
    sbx_dqnode_t *self = arg;
    int socket = self->dial (address, self->dial_arg);
    if (socket < 0)
        return DQLITE_ERROR;
    *fd = socket;
    return 0;
}

sbx_dqnode_t *sbx_dqnode_new (uint64_t id, const char *address, const char *dir)
{
    if (id == 0 || !address || !*address || !dir || !*dir)
        return NULL;
    if (mkdir (dir, 0700) != 0 && errno != EEXIST) {
        sbx_error ("dqlite node %llu: cannot make %s: %s", (unsigned long long) id, dir,
                   strerror (errno));
        return NULL;
    }
    sbx_dqnode_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->id = id;
    self->address = strdup (address);
    self->dir = strdup (dir);
    if (!self->address || !self->dir) {
        sbx_dqnode_destroy (&self);
        return NULL;
    }
    int rc = dqlite_node_create (id, address, dir, &self->node);
    if (rc != 0) {
        sbx_error ("dqlite node %llu at %s: %s", (unsigned long long) id, address,
                   self->node ? dqlite_node_errmsg (self->node) : "cannot create");
        sbx_dqnode_destroy (&self);
        return NULL;
    }
    return self;
}

void sbx_dqnode_destroy (sbx_dqnode_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sbx_dqnode_t *self = *self_p;
    if (self->node) {
        if (self->started)
            dqlite_node_stop (self->node);
        dqlite_node_destroy (self->node);
    }
    free (self->address);
    free (self->dir);
    free (self);
    *self_p = NULL;
}

int sbx_dqnode_set_bind (sbx_dqnode_t *self, const char *bind)
{
    if (dqlite_node_set_bind_address (self->node, bind) != 0) {
        sbx_error ("dqlite node %llu: cannot listen on %s: %s", (unsigned long long) self->id, bind,
                   dqlite_node_errmsg (self->node));
        return -1;
    }
    self->bound = true;
    return 0;
}

int sbx_dqnode_set_dial (sbx_dqnode_t *self, sbx_dqnode_dial_fn *dial, void *arg)
{
    self->dial = dial;
    self->dial_arg = arg;
    return dqlite_node_set_connect_func (self->node, s_connect, self) == 0 ? 0 : -1;
}

int sbx_dqnode_set_latency_ms (sbx_dqnode_t *self, unsigned ms)
{
    return dqlite_node_set_network_latency_ms (self->node, ms) == 0 ? 0 : -1;
}

int sbx_dqnode_start (sbx_dqnode_t *self)
{
    //  dqlite listens only where it is told to.
    if (!self->bound && sbx_dqnode_set_bind (self, self->address))
        return -1;
    if (dqlite_node_start (self->node) != 0) {
        sbx_error ("dqlite node %llu at %s: cannot start: %s", (unsigned long long) self->id,
                   self->address, dqlite_node_errmsg (self->node));
        return -1;
    }
    self->started = true;
    return 0;
}

uint64_t sbx_dqnode_id (sbx_dqnode_t *self)
{
    return self->id;
}

const char *sbx_dqnode_address (sbx_dqnode_t *self)
{
    return self->address;
}

const char *sbx_dqnode_bind_address (sbx_dqnode_t *self)
{
    const char *bind = self->started ? dqlite_node_get_bind_address (self->node) : NULL;
    return bind ? bind : self->address;
}

uint64_t sbx_dqnode_new_id (const char *address)
{
    uint64_t id = dqlite_generate_node_id (address);
    return id <= 1 ? id + 2 : id;
}
