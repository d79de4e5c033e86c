/*  sbx_heap - see sbx_heap.h */
#include "sbx_heap.h"

#include <malloc.h>
#include <sys/resource.h>

//  ASan and the like replace malloc: glibc's knobs and figures would be another heap's.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define S_GLIBC 0
#else
#define S_GLIBC 1
#endif

struct sbx_heap_t {
    zloop_t *loop;
    int timer;
    uint64_t last_cpu_ms;
    bool seen;
    uint64_t trims;
};

#if S_GLIBC
static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    sbx_heap_t *self = arg;
    struct rusage usage;
    getrusage (RUSAGE_SELF, &usage);
    uint64_t cpu_ms = (uint64_t) (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000 +
                      (uint64_t) (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
    struct mallinfo2 info = mallinfo2 ();
    if (sbx_heap_step (self, cpu_ms, info.fordblks)) {
        malloc_trim (0);
        sbx_debug ("heap: gave back up to %zu KiB kept free", info.fordblks / 1024);
    }
    return 0;
}
#endif

sbx_heap_t *sbx_heap_new (zloop_t *loop)
{
    sbx_heap_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
#if S_GLIBC
    //  Fixed values also turn off glibc's sliding threshold, which would move them.
    mallopt (M_MMAP_THRESHOLD, SBX_HEAP_MMAP);
    mallopt (M_TRIM_THRESHOLD, SBX_HEAP_KEEP);
    //  One arena for every thread: malloc_trim gives back the top of the main heap only,
    //  and a thread's arena (ZeroMQ's I/O thread allocates each message it receives)
    //  would otherwise keep up to SBX_HEAP_KEEP there for good.
    mallopt (M_ARENA_MAX, 1);
    if (loop) {
        self->loop = loop;
        self->timer = zloop_timer (loop, SBX_HEAP_TICK_MS, 0, s_on_tick, self);
    }
#else
    (void) loop;
#endif
    return self;
}

void sbx_heap_destroy (sbx_heap_t **self_p)
{
    assert (self_p);
    sbx_heap_t *self = *self_p;
    if (!self)
        return;
    if (self->loop && self->timer > 0)
        zloop_timer_end (self->loop, self->timer);
    free (self);
    *self_p = NULL;
}

bool sbx_heap_step (sbx_heap_t *self, uint64_t cpu_ms, size_t free_bytes)
{
    assert (self);
    bool idle = self->seen && cpu_ms - self->last_cpu_ms < SBX_HEAP_IDLE_CPU;
    self->last_cpu_ms = cpu_ms;
    self->seen = true;
    if (!idle || free_bytes <= SBX_HEAP_SLACK)
        return false;
    self->trims++;
    return true;
}

uint64_t sbx_heap_trims (sbx_heap_t *self)
{
    assert (self);
    return self->trims;
}

//  --------------------------------------------------------------------------
//  Self test

void sbx_heap_test (bool verbose)
{
    if (verbose)
        printf (" * sbx_heap: ");
    //  The decision: a first tick only learns; an idle tick with little free keeps it;
    //  a busy tick keeps it whatever is free; an idle one with much free gives it back.
    sbx_heap_t *heap = sbx_heap_new (NULL);
    assert (heap);
    const size_t mib = 1024 * 1024;
    assert (!sbx_heap_step (heap, 1000, 40 * mib));
    assert (!sbx_heap_step (heap, 1005, SBX_HEAP_SLACK));
    assert (!sbx_heap_step (heap, 1005 + SBX_HEAP_IDLE_CPU, 40 * mib));
    assert (sbx_heap_step (heap, 1030, 40 * mib));
    assert (!sbx_heap_step (heap, 1200, 40 * mib));
    assert (sbx_heap_step (heap, 1200, SBX_HEAP_SLACK + 1));
    assert (sbx_heap_trims (heap) == 2);
#if S_GLIBC
    //  The policy took: 2 MiB buffers come from the heap, and once freed the heap keeps
    //  them (glibc's defaults map each and unmap it on free); an idle tick gives them
    //  back.
    zloop_t *loop = zloop_new ();
    sbx_heap_t *live = sbx_heap_new (loop);
    assert (live);
    void *bufs[8];
    for (int i = 0; i < 8; i++) {
        bufs[i] = malloc (2 * mib);
        assert (bufs[i]);
        memset (bufs[i], i + 1, 2 * mib);
    }
    struct mallinfo2 held = mallinfo2 ();
    for (int i = 7; i >= 0; i--)
        free (bufs[i]);
    struct mallinfo2 freed = mallinfo2 ();
    assert (held.hblkhd == freed.hblkhd);                //  none was mmap'd
    assert (freed.fordblks >= held.fordblks + 16 * mib); //  all kept
    assert (freed.arena == held.arena);
    s_on_tick (loop, 0, live); //  learns
    s_on_tick (loop, 0, live); //  idle since (no CPU to speak of), 16 MiB free: gives back
    assert (sbx_heap_trims (live) == 1);
    assert (mallinfo2 ().arena < freed.arena); //  the heap's top went back to the kernel
    sbx_heap_destroy (&live);
    zloop_destroy (&loop);
#endif
    sbx_heap_destroy (&heap);
    assert (!heap);
    sbx_heap_destroy (&heap);
    if (verbose)
        printf ("OK\n");
}
