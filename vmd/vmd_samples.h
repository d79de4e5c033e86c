/*  vmd_samples - one guest's resource samples: a ring of the newest (720 by default: an
    hour at vmd.metrics_interval_ms = 5000), kept in vmd's memory and in the guest's
    directory across a vmd restart.

    vmd_server takes a sample of every ready guest each interval: CPU from its QEMU's
    /proc/<pid>/stat (vmd_samples_stat_ticks; the share of the sandbox's vCPUs over the
    interval, vmd_samples_cpu_permille), the rest from the guest's agent (agent.stats,
    checked by vmd_samples_check: the guest is not trusted).

        vmd_samples_t *ring = vmd_samples_new (720);
        vmd_samples_add (ring, &sample);
        vmd_samples_copy (ring, since_ms, limit, &reply->samples);
        vmd_samples_save (ring, "vms/sb_x/metrics.bin");

    Samples go in time order: one older than the newest is refused (a clock stepped back
    starts no second history). The file is written whole under a .tmp name and renamed;
    one that does not read back (truncated, another version, samples out of order) is
    ignored.
*/
#ifndef VMD_SAMPLES_H_INCLUDED
#define VMD_SAMPLES_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_msg.h"

#define VMD_SAMPLES_KEPT 720 //  an hour at 5 s

typedef struct _vmd_samples_t vmd_samples_t;

//  An empty ring of capacity samples (1..100000), or NULL.
vmd_samples_t *vmd_samples_new (size_t capacity);
void vmd_samples_destroy (vmd_samples_t **self_p);

//  Adds a copy of sample, dropping the oldest when full. 0, or -1 when it is older than
//  the newest kept.
int vmd_samples_add (vmd_samples_t *self, const sbx_metrics_sample_t *sample);
size_t vmd_samples_size (vmd_samples_t *self);
//  The index-th kept, 0 the oldest; NULL past the end.
const sbx_metrics_sample_t *vmd_samples_at (vmd_samples_t *self, size_t index);
//  Appends to list the samples newer than since_ms (0: all), at most limit of the newest
//  (0: all), oldest first. 0, or -1 when out of memory.
int vmd_samples_copy (vmd_samples_t *self, uint64_t since_ms, size_t limit,
                      sbx_metrics_sample_list_t *list);

//  Writes the ring to path (atomically). 0, or -1.
int vmd_samples_save (vmd_samples_t *self, const char *path);
//  Reads what vmd_samples_save wrote into an empty ring (the newest capacity of them).
//  0, or -1 when there is no usable file (the ring stays empty).
int vmd_samples_load (vmd_samples_t *self, const char *path);

//  /proc/<pid>/stat's text: utime + stime (clock ticks). 0, or -1.
int vmd_samples_stat_ticks (const char *text, uint64_t *ticks);
//  CPU used between two readings as thousandths of vcpus over wall_ms (0..1000).
uint64_t vmd_samples_cpu_permille (uint64_t ticks_delta, long ticks_per_s, uint64_t wall_ms,
                                   int vcpus);
//  The guest's figures (agent.stats.ok) made sane: 0 and copied into sample, or -1 when
//  they cannot be a guest's (used over total, totals over what memory_limit allows).
int vmd_samples_check (const sbx_agent_stats_ok_t *stats, uint64_t memory_limit,
                       sbx_metrics_sample_t *sample);

void vmd_samples_test (bool verbose);

#endif
