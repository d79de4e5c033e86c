/*  sbx_idmap - a czmq zhashx keyed by 64-bit ids (request ids, serials, handles).

    Every loop correlates answers by id; this is the one table they all use. The id is
    the key itself (no copy, nothing to free): store with SBX_ID (id). Values are the
    caller's, with whatever destructor it sets. */
#ifndef SBX_IDMAP_H_INCLUDED
#define SBX_IDMAP_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

//  An id as a zhashx key.
#define SBX_ID(id) ((void *) (uintptr_t) (id))

//  A new, empty table keyed by ids; NULL when out of memory. Destroy with zhashx_destroy.
zhashx_t *sbx_idmap_new (void);

void sbx_idmap_test (bool verbose);

#endif
