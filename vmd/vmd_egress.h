/*  vmd_egress - each guest's own egress rules (create_sandbox's `egress`), as nftables
    rules on its QEMU's uid.

    A guest's connections are sockets of its QEMU, which runs as a uid of its own
    (vmd_guest_set_uid), so one table can hold every guest's rules, each in a chain the
    uid jumps to. That table (inet sbx_egress) hooks output after vmd_firewall's fixed
    policy (priority filter + 10): a verdict there is final for what it refuses, so host,
    private and special-purpose addresses stay refused whatever a guest's allow list
    says, and this table only narrows what the fixed policy lets through. Per guest:
      - established and related traffic passes (a rule change applies to new
        connections);
      - DNS passes (the fixed policy already limits it to the resolver slirp relays to);
      - the deny list's CIDRs are refused;
      - with an allow list: its CIDRs pass, and the addresses its names resolved to,
        and everything else is refused.
    Domain names are enforced through DNS (vmd_dns): a guest with names in its rules has
    its UDP DNS redirected (a nat output rule on its uid) to a relay of its own, which
    answers REFUSED for a denied name and, when the allow list has names, for any name
    outside it; an allowed name's A and AAAA answers join the guest's sets (l4_<uid>,
    l6_<uid>) before the guest sees them, for the answer's TTL (5 minutes at least). Its
    DNS over TCP or IPv6 is refused (the relay answers UDP over IPv4). What this can't
    see: a connection to an address the guest knows without asking (a denied name's
    address still passes a deny list), and names resolved over another channel (DoH),
    which an allow list refuses anyway as it refuses every address it did not learn.

    The rules of each guest are kept, root's only, in <dir>/<sandbox id>.json, so a
    restarted vmd loads them again before any guest of the range can make a new
    connection it should not; the table itself outlives vmd (the guests do). Each change
    replaces the whole table in one nft transaction.

        vmd_egress_t *eg = vmd_egress_new ("/var/lib/sbx/egress", NULL, NULL);
        vmd_egress_set (eg, "sb-1", 1879048192, &allow, &deny, &err);
        vmd_egress_forget (eg, "sb-1");
        vmd_egress_destroy (&eg);       //  the table stays
*/
#ifndef VMD_EGRESS_H_INCLUDED
#define VMD_EGRESS_H_INCLUDED

#include "sbx_msg.h"

#include <czmq.h>
#include <stdbool.h>
#include <sys/types.h>

#define VMD_EGRESS_TABLE   "sbx_egress"
#define VMD_EGRESS_LEARNED 1024 //  addresses of allowed names kept per guest at most

typedef struct _vmd_egress_t vmd_egress_t;

//  Rules kept in dir (made root-only when missing), loaded as nftables table inet
//  <table> (NULL: VMD_EGRESS_TABLE; tests name their own); nft_path NULL: "nft" on PATH, then
//  /usr/sbin/nft. Loads the saved rules into the table when there are any, or when vmd
//  is root (so that a table an earlier vmd left never confines a uid with stale rules).
//  NULL when dir can't be made or the table can't be loaded: vmd must not run guests
//  with rules it did not load.
vmd_egress_t *vmd_egress_new (const char *dir, const char *table, const char *nft_path);
//  Enforces domain names from now on: each guest with names gets a DNS relay on loop to
//  upstream ("a.b.c.d" or "a.b.c.d:port"; NULL or "": the first IPv4 nameserver of
//  /etc/resolv.conf when the relay starts, which is where slirp sends the guest's DNS).
//  Until then names are refused (failed_precondition), and guests whose kept rules have
//  names can't resolve any. 0, or -1 (logged) when upstream is not usable or a relay
//  can't start.
int vmd_egress_set_dns (vmd_egress_t *self, zloop_t *loop, const char *upstream);
//  Stops keeping the rules and the relays; the table stays loaded.
void vmd_egress_destroy (vmd_egress_t **self_p);

//  Replaces the rules of guest id, whose QEMU runs as uid (0 or a uid it shares: rules
//  can't be told apart, refused unless both lists are empty). Both empty: the guest has
//  none. The file is written and the table loaded before it returns. 0, or -1 with err
//  (invalid_argument: a bad entry; failed_precondition: a domain before
//  vmd_egress_set_dns, or no uid of its own;
//  internal: nft or the disk failed, the rules in force unchanged).
int vmd_egress_set (vmd_egress_t *self, const char *id, uid_t uid, const sbx_strlist_t *allow,
                    const sbx_strlist_t *deny, sbx_err_t *err);
//  The guest's QEMU runs as another uid now (a cold boot after a failed template
//  restore): its rules follow it. 0, or -1 with err.
int vmd_egress_move (vmd_egress_t *self, const char *id, uid_t uid, sbx_err_t *err);
//  Drops the guest's rules (it is deleted). Logged when the table can't be reloaded.
void vmd_egress_forget (vmd_egress_t *self, const char *id);
//  Drops the rules of every guest for which keep (a lookup in the caller's guest table)
//  says false: those deleted while vmd was down.
void vmd_egress_prune (vmd_egress_t *self, bool (*keep) (const char *id, void *arg), void *arg);
//  True when the guest has rules.
bool vmd_egress_has (vmd_egress_t *self, const char *id);

//  The table for the rules kept now (`nft -f` syntax); caller frees.
char *vmd_egress_ruleset (vmd_egress_t *self);

void vmd_egress_test (bool verbose);

#endif
