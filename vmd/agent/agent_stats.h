/*  agent_stats - the guest's resource figures for agent.stats: memory (/proc/meminfo),
    the root filesystem (statvfs), and one interface's bytes (/proc/net/dev).

    The parsers take the files' text, so the self-test feeds them real samples; collect
    reads the files. Plain C: the agent links no more than the codec.

        agent_stats_t stats;
        if (agent_stats_collect ("/proc", "/", "eth0", &stats) == 0)
            ... stats.memory_used_bytes ...
*/
#ifndef AGENT_STATS_H_INCLUDED
#define AGENT_STATS_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint64_t memory_total_bytes; //  MemTotal
    uint64_t memory_used_bytes;  //  MemTotal - MemAvailable
    uint64_t disk_total_bytes;   //  f_blocks x f_frsize of the filesystem at root
    uint64_t disk_used_bytes;    //  (f_blocks - f_bfree) x f_frsize
    uint64_t net_rx_bytes;       //  the interface's received bytes
    uint64_t net_tx_bytes;       //  and sent bytes
} agent_stats_t;

//  /proc/meminfo's text: MemTotal and MemAvailable (kB) in bytes. 0, or -1 when either
//  is missing or MemAvailable exceeds MemTotal.
int agent_stats_meminfo (const char *text, uint64_t *total, uint64_t *available);

//  /proc/net/dev's text: the receive and transmit bytes of iface. 0, or -1 when the
//  interface is not there.
int agent_stats_netdev (const char *text, const char *iface, uint64_t *rx, uint64_t *tx);

//  Reads proc_dir/meminfo and proc_dir/net/dev, and statvfs(root). Each figure it cannot
//  read stays 0 (an interface that is not there: no network). 0, or -1 when memory could
//  not be read (nothing useful then).
int agent_stats_collect (const char *proc_dir, const char *root, const char *iface,
                         agent_stats_t *stats);

void agent_stats_test (bool verbose);

#endif
