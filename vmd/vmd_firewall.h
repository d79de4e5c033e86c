/*  vmd_firewall - what guests may reach: nftables rules on the QEMU user's sockets.

    Guests use QEMU's user networking, so every connection a guest makes is a socket of
    its QEMU process on the host, owned by the QEMU user (vmd_qemu). One nftables table
    matching that uid on the output hook is the whole egress policy: new connections to
    the host itself (any of its addresses, loopback included: the daemons, the gateway,
    other guests' forwards), to private, shared, link-local, multicast and reserved
    IPv4 ranges and to non-global IPv6 are rejected; DNS to the resolvers of the host's
    resolv.conf passes (QEMU forwards the guest's DNS to them); everything public
    passes. Replies to connections made to QEMU (the gateway reaching a forward) are
    established traffic and pass. Nothing here depends on which sandboxes run, so the
    table is loaded once, atomically replaced at each vmd start, and left in place when
    vmd stops: the guests it protects outlive vmd.
*/
#ifndef VMD_FIREWALL_H_INCLUDED
#define VMD_FIREWALL_H_INCLUDED

#include <stdbool.h>
#include <sys/types.h>

#define VMD_FIREWALL_TABLE "sbx_guests"

//  The ruleset (`nft -f` syntax) for QEMU's uid and the nameservers of resolv_conf (a
//  path; NULL: /etc/resolv.conf; lines that are not valid addresses are ignored).
//  Caller frees; NULL when out of memory.
char *vmd_firewall_ruleset (uid_t uid, const char *resolv_conf);

//  Loads that ruleset with nft (nft_path NULL: "nft" on PATH, then /usr/sbin/nft).
//  Waits for nft: call it at startup, before the loop runs. Returns 0, or -1 with the
//  reason (nft's own message) logged.
int vmd_firewall_apply (uid_t uid, const char *resolv_conf, const char *nft_path);

void vmd_firewall_test (bool verbose);

#endif
