/*  vmd_firewall - what guests may reach: nftables rules on the QEMU user's sockets.

    Guests use QEMU's user networking, so every connection a guest makes is a socket of
    its QEMU process on the host, owned by the QEMU user (vmd_qemu) or by the guest's
    own uid from vmd's range (vmd_guest_set_uid). One nftables table matching those uids
    on the output hook is the whole egress policy. New connections are
    rejected to:
      - the host itself, any of its addresses (loopback included: the daemons, the
        gateway, other guests' forwards), and the host's own networks (each interface's
        prefix, v4 and v6, read with getifaddrs and kept current);
      - every block of the IANA IPv4 and IPv6 special-purpose address registries (and
        multicast, and IPv6 outside global unicast 2000::/3), defined once below as data;
      - port 53 (udp and tcp) of any address but the resolver QEMU's slirp forwards the
        guest's DNS (10.0.2.3) to: the first nameserver of each family in the host's
        /etc/resolv.conf, or loopback when there is none (libslirp's get_dns_addr and
        sotranslate_out).
    DNS to that resolver passes (even when it is private or on loopback); everything
    public passes. Replies to connections made to QEMU (the gateway reaching a forward)
    are established traffic and pass.

    Nothing here depends on which sandboxes run: the table is loaded at vmd's start,
    atomically replaced, and left in place when vmd stops (the guests it protects
    outlive vmd). vmd_firewall_new keeps it current from vmd's loop: a netlink route
    socket says when an address is added or removed (the new prefix is in the table
    within about 100 ms), and a re-read every 2 s catches a changed resolv.conf (slirp
    re-reads it at most once a second) and anything netlink missed. The table is
    reloaded only when the rules it would have differ from those loaded.

        vmd_firewall_t *fw = vmd_firewall_new (loop, NULL, uid, first, count, NULL, NULL);
        ...
        vmd_firewall_destroy (&fw);     //  the table stays
*/
#ifndef VMD_FIREWALL_H_INCLUDED
#define VMD_FIREWALL_H_INCLUDED

#include <czmq.h>
#include <ifaddrs.h>
#include <stdbool.h>
#include <sys/types.h>

#define VMD_FIREWALL_TABLE      "sbx_guests"
#define VMD_FIREWALL_REFRESH_MS 2000 //  the periodic re-read

typedef struct _vmd_firewall_t vmd_firewall_t;

//  The ruleset (`nft -f` syntax) for QEMU's uid, the resolver of resolv_conf (a path;
//  NULL: /etc/resolv.conf, the file slirp reads) and the host's networks as getifaddrs
//  reports them now. Caller frees; NULL when out of memory or getifaddrs fails.
char *vmd_firewall_ruleset (uid_t uid, const char *resolv_conf);

//  The same for the interfaces in ifaddrs (a getifaddrs list, or one a test made).
char *vmd_firewall_ruleset_for (uid_t uid, const char *resolv_conf, const struct ifaddrs *ifaddrs);

//  The same, with every uid of first..first+count-1 (each guest's own QEMU uid) confined
//  like uid, in the table so named (NULL: VMD_FIREWALL_TABLE).
char *vmd_firewall_ruleset_range (const char *table, uid_t uid, uid_t first, uint32_t count,
                                  const char *resolv_conf, const struct ifaddrs *ifaddrs);

//  The resolver slirp relays a guest's DNS to, for family (AF_INET, AF_INET6), as text:
//  the first nameserver of that family in resolv_conf (NULL: /etc/resolv.conf), else
//  loopback.
void vmd_firewall_resolver (const char *resolv_conf, int family, char *out, size_t size);

//  Loads vmd_firewall_ruleset with nft (nft_path NULL: "nft" on PATH, then
//  /usr/sbin/nft). Waits for nft. Returns 0, or -1 with the reason (nft's message) logged.
int vmd_firewall_apply (uid_t uid, const char *resolv_conf, const char *nft_path);

//  Runs nft on rules (`nft -f -`, or `nft -cf -` to check only), waiting for it. 0, or -1
//  with nft's message (or the reason nft could not run) in out.
int vmd_firewall_nft (const char *nft_path, const char *rules, bool check, char *out, size_t size);

//  Loads the table now (NULL, with the reason logged, when that fails: vmd must not run
//  guests unconfined) and keeps it current from loop, as described above.
//  uid_first..uid_first+uid_count-1 are confined like uid (none when uid_count is 0).
//  table: the nftables table's name (NULL: VMD_FIREWALL_TABLE; vmd.firewall_table), so
//  that two vmds on one host, each with its own uid range, keep their own tables.
vmd_firewall_t *vmd_firewall_new (zloop_t *loop, const char *table, uid_t uid, uid_t uid_first,
                                  uint32_t uid_count, const char *resolv_conf,
                                  const char *nft_path);
//  Stops watching; the table stays loaded.
void vmd_firewall_destroy (vmd_firewall_t **self_p);

//  Times the table was loaded (the first load included).
size_t vmd_firewall_loads (vmd_firewall_t *self);

void vmd_firewall_test (bool verbose);

#endif
