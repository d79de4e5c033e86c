/*  sbx_idmap - see sbx_idmap.h */
#include "sbx_idmap.h"

#include <assert.h>

//  Ids are mostly consecutive: mix the bits so they spread over the buckets.
static size_t s_hash (const void *key)
{
    uint64_t k = (uint64_t) (uintptr_t) key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t) k;
}

static int s_compare (const void *a, const void *b)
{
    return a == b ? 0 : (a < b ? -1 : 1);
}

zhashx_t *sbx_idmap_new (void)
{
    zhashx_t *map = zhashx_new ();
    if (!map)
        return NULL;
    zhashx_set_key_hasher (map, s_hash);
    zhashx_set_key_comparator (map, s_compare);
    zhashx_set_key_duplicator (map, NULL);
    zhashx_set_key_destructor (map, NULL);
    return map;
}

void sbx_idmap_test (bool verbose)
{
    (void) verbose;
    zhashx_t *map = sbx_idmap_new ();
    assert (map);
    static int values[1000];
    for (uint64_t id = 1; id <= 1000; id++)
        assert (zhashx_insert (map, SBX_ID (id), &values[id - 1]) == 0);
    assert (zhashx_insert (map, SBX_ID (7), &values[0]) == -1); //  one value per id
    assert (zhashx_size (map) == 1000);
    assert (zhashx_lookup (map, SBX_ID (7)) == &values[6]);
    assert (zhashx_lookup (map, SBX_ID (UINT64_MAX)) == NULL);
    zhashx_delete (map, SBX_ID (7));
    assert (zhashx_lookup (map, SBX_ID (7)) == NULL && zhashx_size (map) == 999);
    //  Keys come back as the ids they were.
    uint64_t sum = 0;
    for (void *v = zhashx_first (map); v; v = zhashx_next (map))
        sum += (uint64_t) (uintptr_t) zhashx_cursor (map);
    assert (sum == 1000 * 1001 / 2 - 7);
    zhashx_destroy (&map);
}
