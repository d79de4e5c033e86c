/*  agent_stats - see agent_stats.h */
#include "agent_stats.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

//  The kB value of "Name:   123 kB" at the start of a line, or -1.
static int s_meminfo_field (const char *text, const char *name, uint64_t *bytes)
{
    size_t length = strlen (name);
    for (const char *line = text; line && *line;
         line = strchr (line, '\n') ? strchr (line, '\n') + 1 : NULL) {
        if (strncmp (line, name, length) != 0 || line[length] != ':')
            continue;
        char *end;
        unsigned long long kb = strtoull (line + length + 1, &end, 10);
        if (end == line + length + 1 || kb > (1ull << 40))
            return -1;
        *bytes = (uint64_t) kb * 1024;
        return 0;
    }
    return -1;
}

int agent_stats_meminfo (const char *text, uint64_t *total, uint64_t *available)
{
    if (s_meminfo_field (text, "MemTotal", total) ||
        s_meminfo_field (text, "MemAvailable", available) || *available > *total)
        return -1;
    return 0;
}

int agent_stats_netdev (const char *text, const char *iface, uint64_t *rx, uint64_t *tx)
{
    size_t length = strlen (iface);
    for (const char *line = text; line && *line;
         line = strchr (line, '\n') ? strchr (line, '\n') + 1 : NULL) {
        const char *name = line + strspn (line, " ");
        if (strncmp (name, iface, length) != 0 || name[length] != ':')
            continue;
        //  rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes …
        unsigned long long v[9];
        if (sscanf (name + length + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                    &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) != 9)
            return -1;
        *rx = v[0];
        *tx = v[8];
        return 0;
    }
    return -1;
}

//  A /proc file whole (they are small): the caller frees it. NULL when unreadable.
static char *s_slurp (const char *path)
{
    FILE *file = fopen (path, "re");
    if (!file)
        return NULL;
    size_t size = 0, limit = 64 * 1024;
    char *text = malloc (limit + 1);
    if (text)
        size = fread (text, 1, limit, file);
    fclose (file);
    if (text)
        text[size] = 0;
    return text;
}

int agent_stats_collect (const char *proc_dir, const char *root, const char *iface,
                         agent_stats_t *stats)
{
    memset (stats, 0, sizeof *stats);
    char path[512];
    snprintf (path, sizeof path, "%s/meminfo", proc_dir);
    char *text = s_slurp (path);
    uint64_t total = 0, available = 0;
    int rc = text && agent_stats_meminfo (text, &total, &available) == 0 ? 0 : -1;
    free (text);
    if (rc == 0) {
        stats->memory_total_bytes = total;
        stats->memory_used_bytes = total - available;
    }
    struct statvfs fs;
    if (statvfs (root, &fs) == 0 && fs.f_bfree <= fs.f_blocks) {
        stats->disk_total_bytes = (uint64_t) fs.f_blocks * fs.f_frsize;
        stats->disk_used_bytes = (uint64_t) (fs.f_blocks - fs.f_bfree) * fs.f_frsize;
    }
    snprintf (path, sizeof path, "%s/net/dev", proc_dir);
    text = s_slurp (path);
    if (text && iface &&
        agent_stats_netdev (text, iface, &stats->net_rx_bytes, &stats->net_tx_bytes))
        stats->net_rx_bytes = stats->net_tx_bytes = 0;
    free (text);
    return rc;
}

//  --------------------------------------------------------------------------
//  Self-test, on text from a guest (Debian 12's cloud kernel, 512 MiB) and this host.

void agent_stats_test (bool verbose)
{
    (void) verbose;
    static const char *meminfo = "MemTotal:         492344 kB\n"
                                 "MemFree:          402564 kB\n"
                                 "MemAvailable:     431708 kB\n"
                                 "Buffers:            2920 kB\n"
                                 "Cached:            44088 kB\n"
                                 "SwapCached:            0 kB\n";
    uint64_t total = 0, available = 0;
    assert (agent_stats_meminfo (meminfo, &total, &available) == 0);
    assert (total == 492344ull * 1024 && available == 431708ull * 1024);
    //  A field missing, or figures that cannot be: refused.
    assert (agent_stats_meminfo ("MemTotal: 1000 kB\nMemFree: 10 kB\n", &total, &available) == -1);
    assert (agent_stats_meminfo ("MemTotal: 1000 kB\nMemAvailable: 2000 kB\n", &total,
                                 &available) == -1);
    assert (agent_stats_meminfo ("MemTotal: kB\nMemAvailable: 20 kB\n", &total, &available) == -1);
    assert (agent_stats_meminfo ("", &total, &available) == -1);

    static const char *netdev =
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
        "drop fifo colls carrier compressed\n"
        "    lo:    1200      12    0    0    0     0          0         0     1200      12    0 "
        "   0    0     0       0          0\n"
        "  eth0: 1845678    1432    0    0    0     0          0         0    98765     801    0 "
        "   0    0     0       0          0\n";
    uint64_t rx = 0, tx = 0;
    assert (agent_stats_netdev (netdev, "eth0", &rx, &tx) == 0 && rx == 1845678 && tx == 98765);
    assert (agent_stats_netdev (netdev, "lo", &rx, &tx) == 0 && rx == 1200 && tx == 1200);
    assert (agent_stats_netdev (netdev, "eth", &rx, &tx) == -1);  //  a prefix is not a name
    assert (agent_stats_netdev (netdev, "eth1", &rx, &tx) == -1); //  not there: no network
    assert (agent_stats_netdev ("  eth0: 12 13\n", "eth0", &rx, &tx) == -1);

    //  This host's own files: figures a machine can have.
    agent_stats_t stats;
    assert (agent_stats_collect ("/proc", "/", "lo", &stats) == 0);
    assert (stats.memory_total_bytes > 0 && stats.memory_used_bytes <= stats.memory_total_bytes);
    assert (stats.disk_total_bytes > 0 && stats.disk_used_bytes <= stats.disk_total_bytes);
    assert (agent_stats_collect ("/nonexistent", "/", "lo", &stats) == -1);
}
