/*  sbx_heap - a daemon's malloc policy: large buffers reused while work flows, and
    given back once the process is quiet.

    A 10 MiB file crosses the gateway, the broker and vmd as 1 MiB chunks, each copied a
    few times (decoded, encoded, framed) into buffers of a megabyte or more. glibc's
    defaults hand such buffers back to the kernel as they are freed (an mmap each, or
    the heap's top trimmed past twice the last large free), so every transfer faulted
    its memory in again a page at a time: half of the gateway's CPU for a 10 MiB
    write_file and two thirds of the broker's (perf, bench/notes.md).

    So buffers under SBX_HEAP_MMAP come from the heap, and up to SBX_HEAP_KEEP of freed
    memory stays there for the next transfer. What is kept goes back to the kernel
    (malloc_trim) at the first tick of the loop's timer that finds the process idle (it
    used under SBX_HEAP_IDLE_CPU of CPU since the tick before) with more than
    SBX_HEAP_SLACK free. Idle is judged by CPU, not by the heap: the heap between two
    requests looks the same whether they come every second or once a day. An idle
    daemon's footprint is what it was with the defaults.
*/
#ifndef SBX_HEAP_H_INCLUDED
#define SBX_HEAP_H_INCLUDED

#include "sbx_common.h"

#include <czmq.h>

#define SBX_HEAP_MMAP     (32 * 1024 * 1024) //  larger allocations are mmap'd
#define SBX_HEAP_KEEP     (64 * 1024 * 1024) //  freed memory the heap's top may keep
#define SBX_HEAP_SLACK    (4 * 1024 * 1024)  //  free memory worth giving back
#define SBX_HEAP_TICK_MS  2000
#define SBX_HEAP_IDLE_CPU 20 //  ms of CPU in a tick under which the process is idle

typedef struct sbx_heap_t sbx_heap_t;

//  Sets the policy for this process (mallopt) and, with a loop, watches it from a
//  timer there. Under a sanitizer, which brings its own allocator, it sets nothing and
//  watches nothing. NULL when out of memory.
sbx_heap_t *sbx_heap_new (zloop_t *loop);
void sbx_heap_destroy (sbx_heap_t **self_p);

//  One tick: given the process's CPU time so far (ms) and the bytes free in the heap,
//  whether to give the free ones back now (the timer then calls malloc_trim).
bool sbx_heap_step (sbx_heap_t *self, uint64_t cpu_ms, size_t free_bytes);

//  Times memory was given back.
uint64_t sbx_heap_trims (sbx_heap_t *self);

void sbx_heap_test (bool verbose);

#endif
