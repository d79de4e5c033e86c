/*  vmd_samples - see vmd_samples.h */
#include "vmd_samples.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAGIC   "sbxsmp1\n" //  the file's first 8 bytes: format version 1
#define S_FIELDS  8           //  uint64s per sample on disk, in the struct's order
#define S_MAX_CAP 100000

struct _vmd_samples_t {
    sbx_metrics_sample_t *ring;
    size_t capacity;
    size_t first; //  index of the oldest
    size_t count;
};

vmd_samples_t *vmd_samples_new (size_t capacity)
{
    if (capacity < 1 || capacity > S_MAX_CAP)
        return NULL;
    vmd_samples_t *self = calloc (1, sizeof *self);
    if (self && !(self->ring = calloc (capacity, sizeof *self->ring)))
        vmd_samples_destroy (&self);
    if (self)
        self->capacity = capacity;
    return self;
}

void vmd_samples_destroy (vmd_samples_t **self_p)
{
    vmd_samples_t *self = *self_p;
    if (!self)
        return;
    free (self->ring);
    free (self);
    *self_p = NULL;
}

const sbx_metrics_sample_t *vmd_samples_at (vmd_samples_t *self, size_t index)
{
    return index < self->count ? &self->ring[(self->first + index) % self->capacity] : NULL;
}

size_t vmd_samples_size (vmd_samples_t *self)
{
    return self->count;
}

int vmd_samples_add (vmd_samples_t *self, const sbx_metrics_sample_t *sample)
{
    if (self->count && sample->time_ms < vmd_samples_at (self, self->count - 1)->time_ms)
        return -1;
    if (self->count == self->capacity) {
        self->ring[self->first] = *sample;
        self->first = (self->first + 1) % self->capacity;
    } else
        self->ring[(self->first + self->count++) % self->capacity] = *sample;
    return 0;
}

int vmd_samples_copy (vmd_samples_t *self, uint64_t since_ms, size_t limit,
                      sbx_metrics_sample_list_t *list)
{
    size_t from = self->count;
    while (from > 0 && vmd_samples_at (self, from - 1)->time_ms > since_ms &&
           (!limit || self->count - from < limit))
        from--;
    for (size_t i = from; i < self->count; i++) {
        sbx_metrics_sample_t *item = sbx_metrics_sample_list_append (list);
        if (!item)
            return -1;
        *item = *vmd_samples_at (self, i);
    }
    return 0;
}

//  A sample as the file has it: its fields in order, host byte order (the file stays
//  on the host that wrote it).
static void s_fields (const sbx_metrics_sample_t *s, uint64_t out[S_FIELDS])
{
    uint64_t v[S_FIELDS] = {
        s->time_ms,         s->cpu_permille,     s->memory_used_bytes, s->memory_total_bytes,
        s->disk_used_bytes, s->disk_total_bytes, s->net_rx_bytes,      s->net_tx_bytes};
    memcpy (out, v, sizeof v);
}

int vmd_samples_save (vmd_samples_t *self, const char *path)
{
    char tmp[4096];
    if (snprintf (tmp, sizeof tmp, "%s.tmp", path) >= (int) sizeof tmp)
        return -1;
    //  The guest's directory belongs to QEMU's user: never follow what it may have put
    //  there (a link to a file of root's), never write into a file it made.
    unlink (tmp);
    int fd = open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *file = fd >= 0 ? fdopen (fd, "w") : NULL;
    if (!file) {
        if (fd >= 0)
            close (fd);
        return -1;
    }
    uint64_t count = self->count;
    bool ok = fwrite (S_MAGIC, 8, 1, file) == 1 && fwrite (&count, sizeof count, 1, file) == 1;
    for (size_t i = 0; ok && i < self->count; i++) {
        uint64_t v[S_FIELDS];
        s_fields (vmd_samples_at (self, i), v);
        ok = fwrite (v, sizeof v, 1, file) == 1;
    }
    ok = fclose (file) == 0 && ok;
    if (ok && rename (tmp, path) == 0)
        return 0;
    unlink (tmp);
    return -1;
}

int vmd_samples_load (vmd_samples_t *self, const char *path)
{
    //  A plain file only: not a link (to a file of root's), not a FIFO that blocks vmd.
    int fd = open (path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    FILE *file = fd >= 0 && fstat (fd, &st) == 0 && S_ISREG (st.st_mode) ? fdopen (fd, "r") : NULL;
    if (!file) {
        if (fd >= 0)
            close (fd);
        return -1;
    }
    char magic[8];
    uint64_t count = 0;
    bool ok = fread (magic, 8, 1, file) == 1 && memcmp (magic, S_MAGIC, 8) == 0 &&
              fread (&count, sizeof count, 1, file) == 1 && count <= S_MAX_CAP;
    //  Only the newest capacity of them.
    if (ok && count > self->capacity)
        ok = fseek (file, (long) ((count - self->capacity) * S_FIELDS * sizeof (uint64_t)),
                    SEEK_CUR) == 0;
    size_t keep = ok ? (size_t) (count > self->capacity ? self->capacity : count) : 0;
    for (size_t i = 0; ok && i < keep; i++) {
        uint64_t v[S_FIELDS];
        ok = fread (v, sizeof v, 1, file) == 1;
        sbx_metrics_sample_t s = {.time_ms = v[0],
                                  .cpu_permille = v[1],
                                  .memory_used_bytes = v[2],
                                  .memory_total_bytes = v[3],
                                  .disk_used_bytes = v[4],
                                  .disk_total_bytes = v[5],
                                  .net_rx_bytes = v[6],
                                  .net_tx_bytes = v[7]};
        ok = ok && s.cpu_permille <= 1000 && s.memory_used_bytes <= s.memory_total_bytes &&
             s.disk_used_bytes <= s.disk_total_bytes && vmd_samples_add (self, &s) == 0;
    }
    ok = ok && fgetc (file) == EOF;
    fclose (file);
    if (!ok)
        self->count = self->first = 0;
    return ok ? 0 : -1;
}

int vmd_samples_stat_ticks (const char *text, uint64_t *ticks)
{
    //  "pid (comm) state ppid …": comm may hold spaces and parentheses; the last ')'
    //  ends it. utime and stime are the 14th and 15th fields, the 12th and 13th after it.
    const char *p = text ? strrchr (text, ')') : NULL;
    if (!p)
        return -1;
    p++;
    unsigned long long utime, stime;
    if (sscanf (p, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return -1;
    *ticks = (uint64_t) (utime + stime);
    return 0;
}

uint64_t vmd_samples_cpu_permille (uint64_t ticks_delta, long ticks_per_s, uint64_t wall_ms,
                                   int vcpus)
{
    if (ticks_per_s <= 0 || wall_ms == 0 || vcpus < 1)
        return 0;
    double busy_ms = (double) ticks_delta * 1000.0 / (double) ticks_per_s;
    double permille = busy_ms * 1000.0 / ((double) wall_ms * vcpus);
    //  QEMU's own threads (I/O, TCG's translation) can take more than the vCPUs: capped.
    return permille >= 1000 ? 1000 : (uint64_t) (permille + 0.5);
}

int vmd_samples_check (const sbx_agent_stats_ok_t *stats, uint64_t memory_limit,
                       sbx_metrics_sample_t *sample)
{
    const uint64_t disk_limit = 1ull << 44; //  16 TiB: more than any guest disk here
    if (stats->memory_used_bytes > stats->memory_total_bytes ||
        stats->memory_total_bytes > memory_limit ||
        stats->disk_used_bytes > stats->disk_total_bytes || stats->disk_total_bytes > disk_limit ||
        stats->net_rx_bytes > (1ull << 62) || stats->net_tx_bytes > (1ull << 62))
        return -1;
    sample->memory_used_bytes = stats->memory_used_bytes;
    sample->memory_total_bytes = stats->memory_total_bytes;
    sample->disk_used_bytes = stats->disk_used_bytes;
    sample->disk_total_bytes = stats->disk_total_bytes;
    sample->net_rx_bytes = stats->net_rx_bytes;
    sample->net_tx_bytes = stats->net_tx_bytes;
    return 0;
}

//  --------------------------------------------------------------------------
//  Self-test

void vmd_samples_test (bool verbose)
{
    (void) verbose;
    assert (!vmd_samples_new (0));
    vmd_samples_t *ring = vmd_samples_new (4);
    assert (ring && vmd_samples_size (ring) == 0 && !vmd_samples_at (ring, 0));
    //  Six samples into four places: the newest four stay, oldest first.
    for (uint64_t t = 1; t <= 6; t++) {
        sbx_metrics_sample_t s = {.time_ms = t * 5000, .cpu_permille = t * 10};
        assert (vmd_samples_add (ring, &s) == 0);
    }
    assert (vmd_samples_size (ring) == 4);
    assert (vmd_samples_at (ring, 0)->time_ms == 15000 &&
            vmd_samples_at (ring, 3)->time_ms == 30000);
    //  Time goes forward only.
    sbx_metrics_sample_t old = {.time_ms = 29999};
    assert (vmd_samples_add (ring, &old) == -1 && vmd_samples_size (ring) == 4);
    //  since_ms and limit.
    sbx_metrics_sample_list_t list = {0};
    assert (vmd_samples_copy (ring, 0, 0, &list) == 0 && list.count == 4);
    assert (list.items[0].time_ms == 15000 && list.items[3].cpu_permille == 60);
    free (list.items);
    list = (sbx_metrics_sample_list_t){0};
    assert (vmd_samples_copy (ring, 20000, 0, &list) == 0 && list.count == 2);
    assert (list.items[0].time_ms == 25000);
    free (list.items);
    list = (sbx_metrics_sample_list_t){0};
    assert (vmd_samples_copy (ring, 0, 3, &list) == 0 && list.count == 3);
    assert (list.items[0].time_ms == 20000 && list.items[2].time_ms == 30000);
    free (list.items);
    list = (sbx_metrics_sample_list_t){0};
    assert (vmd_samples_copy (ring, 30000, 0, &list) == 0 && list.count == 0);

    //  Saved and read back, into a ring as large and into a smaller one (the newest).
    char dir[] = "/tmp/vmd_samples_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/metrics.bin", dir);
    assert (vmd_samples_save (ring, path) == 0);
    vmd_samples_t *back = vmd_samples_new (4);
    assert (vmd_samples_load (back, path) == 0 && vmd_samples_size (back) == 4);
    for (size_t i = 0; i < 4; i++)
        assert (memcmp (vmd_samples_at (back, i), vmd_samples_at (ring, i),
                        sizeof (sbx_metrics_sample_t)) == 0);
    vmd_samples_destroy (&back);
    back = vmd_samples_new (2);
    assert (vmd_samples_load (back, path) == 0 && vmd_samples_size (back) == 2);
    assert (vmd_samples_at (back, 0)->time_ms == 25000);
    vmd_samples_destroy (&back);
    //  A cut file, or another one, reads as nothing.
    assert (truncate (path, 8 + 8 + 64 * 3 + 10) == 0);
    back = vmd_samples_new (4);
    assert (vmd_samples_load (back, path) == -1 && vmd_samples_size (back) == 0);
    FILE *other = fopen (path, "w");
    assert (other && fputs ("not a metrics file at all, no\n", other) >= 0 && fclose (other) == 0);
    assert (vmd_samples_load (back, path) == -1 && vmd_samples_size (back) == 0);
    assert (vmd_samples_load (back, "/nonexistent/metrics.bin") == -1);
    //  What QEMU's user could leave in the guest's directory: a link is not followed
    //  (neither read nor written through), a FIFO is not waited on.
    char target[160], tmp[160];
    snprintf (target, sizeof target, "%s/root-only", dir);
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    unlink (path);
    assert (symlink (target, path) == 0);
    assert (vmd_samples_save (ring, target) == 0); //  a real ring file the link points to
    assert (vmd_samples_load (back, path) == -1 && vmd_samples_size (back) == 0);
    unlink (path);
    assert (symlink (target, tmp) == 0);
    assert (vmd_samples_save (ring, path) == 0);
    struct stat st;
    assert (lstat (tmp, &st) == -1 && lstat (path, &st) == 0 && S_ISREG (st.st_mode));
    unlink (path);
    assert (mkfifo (path, 0600) == 0);
    assert (vmd_samples_load (back, path) == -1);
    unlink (target);
    vmd_samples_destroy (&back);
    unlink (path);
    rmdir (dir);
    vmd_samples_destroy (&ring);
    vmd_samples_destroy (&ring);

    //  /proc/<pid>/stat of a QEMU (comm with a space and a parenthesis, as comm may be).
    static const char *stat =
        "48211 (qemu-system-x86) S 48190 48211 48190 0 -1 4194560 31571 0 3 0 1834 263 0 0 20 "
        "0 3 0 1210338 1339854848 73406 18446744073709551615 1 1 0 0 0 0 268444224 4096 17987 0 "
        "0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
    uint64_t ticks = 0;
    assert (vmd_samples_stat_ticks (stat, &ticks) == 0 && ticks == 1834 + 263);
    assert (vmd_samples_stat_ticks ("7 (a) b) c) S 1 7 7 0 -1 0 0 0 0 0 50 25 0", &ticks) == 0 &&
            ticks == 75);
    assert (vmd_samples_stat_ticks ("48211 (qemu", &ticks) == -1);
    assert (vmd_samples_stat_ticks ("1 (x) S 1 2", &ticks) == -1);
    //  250 ticks of 100 per s over 5 s on 1 vCPU: half of it; on 2, a quarter; capped.
    assert (vmd_samples_cpu_permille (250, 100, 5000, 1) == 500);
    assert (vmd_samples_cpu_permille (250, 100, 5000, 2) == 250);
    assert (vmd_samples_cpu_permille (900, 100, 5000, 1) == 1000);
    assert (vmd_samples_cpu_permille (1, 100, 0, 1) == 0);

    //  The guest's figures: kept when they can be, refused when not.
    sbx_agent_stats_ok_t stats = {.memory_total_bytes = 480u << 20,
                                  .memory_used_bytes = 120u << 20,
                                  .disk_total_bytes = 2ull << 30,
                                  .disk_used_bytes = 1ull << 30,
                                  .net_rx_bytes = 12345,
                                  .net_tx_bytes = 678};
    sbx_metrics_sample_t s = {0};
    assert (vmd_samples_check (&stats, 512u << 20, &s) == 0);
    assert (s.memory_used_bytes == 120u << 20 && s.disk_total_bytes == 2ull << 30 &&
            s.net_tx_bytes == 678);
    stats.memory_used_bytes = stats.memory_total_bytes + 1;
    assert (vmd_samples_check (&stats, 512u << 20, &s) == -1);
    stats.memory_used_bytes = 0;
    assert (vmd_samples_check (&stats, 256u << 20, &s) == -1); //  more than the sandbox has
    stats.disk_used_bytes = UINT64_MAX;
    assert (vmd_samples_check (&stats, 512u << 20, &s) == -1);
}
