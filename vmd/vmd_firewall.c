/*  vmd_firewall - see vmd_firewall.h */
#include "vmd_firewall.h"

#include "sbx_log.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_SETTLE_MS 100 //  after a netlink message: let a burst of them end first

//  Where a guest must never go: every block of the IANA IPv4 and IPv6 Special-Purpose
//  Address Registries (iana-ipv4-special-registry, iana-ipv6-special-registry), plus
//  multicast and site-local from the address-space registries. Blocks inside another
//  one are listed for completeness (and checked by the self-test); the rules carry only
//  the outermost. A few blocks the registry calls globally reachable are refused too,
//  as marked: anycast services and translators no sandbox needs, or that would carry a
//  guest on to addresses refused here.
typedef struct {
    const char *prefix;
    const char *name; //  the registry's name, and why when it is not obvious
} s_special_t;

static const s_special_t s_special[] = {
    //  IPv4 (RFC 6890 and its updates)
    {"0.0.0.0/8", "\"this network\" (RFC 791)"},
    {"0.0.0.0/32", "\"this host on this network\" (RFC 1122)"},
    {"10.0.0.0/8", "private-use (RFC 1918)"},
    {"100.64.0.0/10", "shared address space, carrier-grade NAT (RFC 6598)"},
    {"127.0.0.0/8", "loopback (RFC 1122)"},
    {"169.254.0.0/16", "link-local, cloud metadata services (RFC 3927)"},
    {"172.16.0.0/12", "private-use (RFC 1918)"},
    {"192.0.0.0/24", "IETF protocol assignments (RFC 6890), all of it: the PCP and TURN "
                     "anycast addresses in it are global but no use to a guest"},
    {"192.0.0.0/29", "IPv4 service continuity prefix, DS-Lite (RFC 7335)"},
    {"192.0.0.8/32", "IPv4 dummy address (RFC 7600)"},
    {"192.0.0.9/32", "port control protocol anycast (RFC 7723; global)"},
    {"192.0.0.10/32", "traversal using relays around NAT anycast (RFC 8155; global)"},
    {"192.0.0.170/32", "NAT64/DNS64 discovery (RFC 8880)"},
    {"192.0.0.171/32", "NAT64/DNS64 discovery (RFC 8880)"},
    {"192.0.2.0/24", "documentation, TEST-NET-1 (RFC 5737)"},
    {"192.31.196.0/24", "AS112-v4 (RFC 7535; global: sinks for reverse lookups of private "
                        "addresses, nothing a guest needs)"},
    {"192.52.193.0/24", "automatic multicast tunneling (RFC 7450; global, unneeded)"},
    {"192.88.99.0/24", "deprecated 6to4 relay anycast (RFC 7526)"},
    {"192.168.0.0/16", "private-use (RFC 1918)"},
    {"192.175.48.0/24", "direct delegation AS112 service (RFC 7534; global, unneeded)"},
    {"198.18.0.0/15", "benchmarking (RFC 2544)"},
    {"198.51.100.0/24", "documentation, TEST-NET-2 (RFC 5737)"},
    {"203.0.113.0/24", "documentation, TEST-NET-3 (RFC 5737)"},
    {"224.0.0.0/4", "multicast (RFC 5771)"},
    {"240.0.0.0/4", "reserved (RFC 1112)"},
    {"255.255.255.255/32", "limited broadcast (RFC 919)"},
    //  IPv6 (RFC 6890 and its updates)
    {"::1/128", "loopback (RFC 4291)"},
    {"::/128", "unspecified (RFC 4291)"},
    {"::ffff:0:0/96", "IPv4-mapped: would reach the IPv4 host (RFC 4291)"},
    {"64:ff9b::/96", "IPv4/IPv6 translation (RFC 6052; global, but a NAT64 on the host's "
                     "network would carry a guest to any IPv4 address: 64:ff9b::a00:1 is "
                     "10.0.0.1)"},
    {"64:ff9b:1::/48", "IPv4/IPv6 translation, local use (RFC 8215)"},
    {"100::/64", "discard-only (RFC 6666)"},
    {"100:0:0:1::/64", "dummy IPv6 prefix (RFC 9780)"},
    {"2001::/23", "IETF protocol assignments (RFC 2928), all of it: the anycast, AMT, "
                  "AS112 and ORCHID blocks in it are no use to a guest"},
    {"2001::/32", "TEREDO: tunnels to an IPv4 address (RFC 4380)"},
    {"2001:1::1/128", "port control protocol anycast (RFC 7723; global)"},
    {"2001:1::2/128", "TURN anycast (RFC 8155; global)"},
    {"2001:1::3/128", "DNS-SD service registration protocol anycast (RFC 9665; global)"},
    {"2001:2::/48", "benchmarking (RFC 5180)"},
    {"2001:3::/32", "automatic multicast tunneling (RFC 7450; global)"},
    {"2001:4:112::/48", "AS112-v6 (RFC 7535; global)"},
    {"2001:10::/28", "deprecated ORCHID (RFC 4843)"},
    {"2001:20::/28", "ORCHIDv2 (RFC 7343; global)"},
    {"2001:30::/28", "drone remote ID protocol entity tags (RFC 9374; global)"},
    {"2001:db8::/32", "documentation (RFC 3849)"},
    //  6to4 is refused whole: a relay delivers 2002:AABB:CCDD:: to the IPv4 address
    //  AA.BB.CC.DD, so 2002:7f00:1:: is 127.0.0.1 and 2002:c0a8::/32 is 192.168/16;
    //  filtering the embedded address would copy the IPv4 list for a mechanism RFC 7526
    //  deprecated, which no guest needs.
    {"2002::/16", "6to4 (RFC 3056; deprecated, RFC 7526)"},
    {"2620:4f:8000::/48", "direct delegation AS112 service (RFC 7534; global, unneeded)"},
    {"3fff::/20", "documentation (RFC 9637)"},
    {"5f00::/16", "segment routing SIDs (RFC 9602)"},
    {"fc00::/7", "unique-local (RFC 4193)"},
    {"fe80::/10", "link-local unicast (RFC 4291)"},
    {"fec0::/10", "deprecated site-local (RFC 3879); slirp's own guest prefix"},
    {"ff00::/8", "multicast (RFC 4291)"},
};
#define S_SPECIALS (sizeof s_special / sizeof s_special[0])

//  One block of addresses, v4 or v6, with the host bits cleared.
typedef struct {
    int family;
    uint8_t addr[16];
    unsigned len; //  prefix length in bits
} s_prefix_t;

static unsigned s_bits (int family)
{
    return family == AF_INET ? 32 : 128;
}

static void s_mask (s_prefix_t *p)
{
    for (unsigned bit = p->len; bit < s_bits (p->family); bit++)
        p->addr[bit / 8] &= (uint8_t) ~(0x80u >> (bit % 8));
}

//  "addr/len" or "addr" (a single address). Returns 0, or -1 when it is neither.
static int s_prefix_parse (const char *text, s_prefix_t *p)
{
    char addr[INET6_ADDRSTRLEN + 8];
    snprintf (addr, sizeof addr, "%s", text);
    char *slash = strchr (addr, '/');
    if (slash)
        *slash = 0;
    memset (p, 0, sizeof *p);
    p->family = strchr (addr, ':') ? AF_INET6 : AF_INET;
    if (inet_pton (p->family, addr, p->addr) != 1)
        return -1;
    char *end = NULL;
    long len = slash ? strtol (slash + 1, &end, 10) : (long) s_bits (p->family);
    if ((slash && (end == slash + 1 || *end)) || len < 0 || len > (long) s_bits (p->family))
        return -1;
    p->len = (unsigned) len;
    s_mask (p);
    return 0;
}

static void s_prefix_format (const s_prefix_t *p, char *out, size_t size)
{
    char addr[INET6_ADDRSTRLEN];
    inet_ntop (p->family, p->addr, addr, sizeof addr);
    if (p->len == s_bits (p->family))
        snprintf (out, size, "%s", addr);
    else
        snprintf (out, size, "%s/%u", addr, p->len);
}

//  Whether outer holds every address of inner.
static bool s_prefix_contains (const s_prefix_t *outer, const s_prefix_t *inner)
{
    if (outer->family != inner->family || outer->len > inner->len)
        return false;
    s_prefix_t cut = *inner;
    cut.len = outer->len;
    s_mask (&cut);
    return memcmp (cut.addr, outer->addr, sizeof cut.addr) == 0;
}

static int s_prefix_cmp (const void *a, const void *b)
{
    const s_prefix_t *x = a, *y = b;
    if (x->family != y->family)
        return x->family < y->family ? -1 : 1;
    int rc = memcmp (x->addr, y->addr, sizeof x->addr);
    return rc ? rc : (x->len < y->len ? -1 : x->len > y->len);
}

//  A growable list of prefixes.
typedef struct {
    s_prefix_t *items;
    size_t size, alloc;
} s_prefixes_t;

static int s_prefixes_add (s_prefixes_t *list, const s_prefix_t *p)
{
    if (list->size == list->alloc) {
        size_t alloc = list->alloc ? list->alloc * 2 : 32;
        s_prefix_t *items = realloc (list->items, alloc * sizeof *items);
        if (!items)
            return -1;
        list->items = items;
        list->alloc = alloc;
    }
    list->items[list->size++] = *p;
    return 0;
}

//  Sorted, and without a block that another one in the list holds: nft's sets then
//  hold exactly what the list says, in an order that only changes when the list does.
static void s_prefixes_outermost (s_prefixes_t *list)
{
    if (list->size)
        qsort (list->items, list->size, sizeof *list->items, s_prefix_cmp);
    size_t kept = 0;
    for (size_t i = 0; i < list->size; i++) {
        bool inside = false;
        for (size_t j = 0; j < list->size && !inside; j++)
            inside = j != i && s_prefix_contains (&list->items[j], &list->items[i]) &&
                     (list->items[j].len < list->items[i].len || j < i);
        if (!inside)
            list->items[kept++] = list->items[i];
    }
    list->size = kept;
}

//  "a, b, c" of one family's prefixes into a string the caller frees ("" when none).
static char *s_prefixes_join (const s_prefixes_t *list, int family)
{
    size_t size = 1;
    for (size_t i = 0; i < list->size; i++)
        size += INET6_ADDRSTRLEN + 8;
    char *out = malloc (size), *at = out;
    if (!out)
        return NULL;
    *out = 0;
    for (size_t i = 0; i < list->size; i++) {
        if (list->items[i].family != family)
            continue;
        char one[INET6_ADDRSTRLEN + 8];
        s_prefix_format (&list->items[i], one, sizeof one);
        at += sprintf (at, "%s%s", at == out ? "" : ", ", one);
    }
    return out;
}

//  The host's own networks: each interface address's prefix (down interfaces too: they
//  may come up between two reads).
static int s_host_networks (const struct ifaddrs *ifaddrs, s_prefixes_t *list)
{
    for (const struct ifaddrs *ifa = ifaddrs; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || !ifa->ifa_netmask)
            continue;
        int family = ifa->ifa_addr->sa_family;
        if (family != AF_INET && family != AF_INET6)
            continue;
        s_prefix_t p = {.family = family};
        const uint8_t *mask;
        if (family == AF_INET) {
            memcpy (p.addr, &((const struct sockaddr_in *) ifa->ifa_addr)->sin_addr, 4);
            mask = (const uint8_t *) &((const struct sockaddr_in *) ifa->ifa_netmask)->sin_addr;
        } else {
            memcpy (p.addr, &((const struct sockaddr_in6 *) ifa->ifa_addr)->sin6_addr, 16);
            mask = (const uint8_t *) &((const struct sockaddr_in6 *) ifa->ifa_netmask)->sin6_addr;
        }
        //  The mask's leading ones (a netmask is contiguous).
        while (p.len < s_bits (family) && (mask[p.len / 8] & (0x80u >> (p.len % 8))))
            p.len++;
        s_mask (&p);
        if (s_prefixes_add (list, &p) != 0)
            return -1;
    }
    s_prefixes_outermost (list);
    return 0;
}

//  The resolver slirp relays the guest's DNS (10.0.2.3, fec0::3) to, as libslirp 4.7
//  finds it: the first "nameserver" line of the family in resolv.conf (the word at the
//  start of the line, then blanks, then the address; a %zone is dropped), else loopback.
//  Only inet_pton's output reaches the rules.
void vmd_firewall_resolver (const char *resolv_conf, int family, char *out, size_t size)
{
    const char *path = resolv_conf ? resolv_conf : "/etc/resolv.conf";
    snprintf (out, size, "%s", family == AF_INET ? "127.0.0.1" : "::1");
    FILE *file = fopen (path, "r");
    if (!file)
        return;
    char line[512], addr[257];
    while (fgets (line, sizeof line, file)) {
        if (sscanf (line, "nameserver%*[ \t]%256s", addr) != 1)
            continue;
        char *zone = strchr (addr, '%');
        if (zone)
            *zone = 0;
        unsigned char bin[sizeof (struct in6_addr)];
        if (inet_pton (family, addr, bin) == 1) {
            inet_ntop (family, bin, out, (socklen_t) size);
            break;
        }
    }
    fclose (file);
}

char *vmd_firewall_ruleset_for (uid_t uid, const char *resolv_conf, const struct ifaddrs *ifaddrs)
{
    return vmd_firewall_ruleset_range (NULL, uid, 0, 0, resolv_conf, ifaddrs);
}

char *vmd_firewall_ruleset_range (const char *table, uid_t uid, uid_t first, uint32_t count,
                                  const char *resolv_conf, const struct ifaddrs *ifaddrs)
{
    if (!table)
        table = VMD_FIREWALL_TABLE;
    const char *path = resolv_conf ? resolv_conf : "/etc/resolv.conf";
    char dns4[INET6_ADDRSTRLEN], dns6[INET6_ADDRSTRLEN];
    vmd_firewall_resolver (path, AF_INET, dns4, sizeof dns4);
    vmd_firewall_resolver (path, AF_INET6, dns6, sizeof dns6);
    s_prefixes_t special = {0}, host = {0};
    int rc = 0;
    for (size_t i = 0; i < S_SPECIALS && rc == 0; i++) {
        s_prefix_t p;
        rc = s_prefix_parse (s_special[i].prefix, &p);
        assert (rc == 0); //  the table above is ours
        rc = s_prefixes_add (&special, &p);
    }
    s_prefixes_outermost (&special);
    if (rc == 0)
        rc = s_host_networks (ifaddrs, &host);
    char *special4 = s_prefixes_join (&special, AF_INET);
    char *special6 = s_prefixes_join (&special, AF_INET6);
    char *host4 = s_prefixes_join (&host, AF_INET);
    char *host6 = s_prefixes_join (&host, AF_INET6);
    char *rules = NULL;
    if (rc == 0 && special4 && special6 && host4 && host6) {
        //  nft refuses an empty set: a family without host networks has no rule.
        char *host4_rule = *host4 ? zsys_sprintf ("\t\tip daddr { %s } reject comment "
                                                  "\"host networks\"\n",
                                                  host4)
                                  : strdup ("");
        char *host6_rule = *host6 ? zsys_sprintf ("\t\tip6 daddr { %s } reject comment "
                                                  "\"host networks\"\n",
                                                  host6)
                                  : strdup ("");
        //  The first two lines make the load idempotent and atomic: one nft transaction
        //  replaces whatever an earlier vmd left. Order matters: the resolver's DNS
        //  passes before the rules that would refuse a loopback or private resolver.
        //  Each guest's own uid (vmd_guest_set_uid) goes through the same chain.
        char *range_rule = count ? zsys_sprintf ("\t\tmeta skuid %u-%u jump guest\n",
                                                 (unsigned) first, (unsigned) (first + count - 1))
                                 : strdup ("");
        if (host4_rule && host6_rule && range_rule)
            rules = zsys_sprintf (
                "table inet %s\n"
                "delete table inet %s\n"
                "table inet %s {\n"
                "\tchain output {\n"
                "\t\ttype filter hook output priority filter; policy accept;\n"
                "\t\tmeta skuid %u jump guest\n"
                "%s"
                "\t}\n"
                "\tchain guest {\n"
                "\t\tct state established,related accept\n"
                "\t\tmeta l4proto udp ip daddr 127.0.0.1 ct status dnat ct original proto-dst 53 "
                "accept comment \"dns redirected to the guest's relay (vmd_egress)\"\n"
                "\t\tmeta l4proto { tcp, udp } th dport 53 ip daddr %s accept comment "
                "\"dns: the resolver slirp relays 10.0.2.3 to\"\n"
                "\t\tmeta l4proto { tcp, udp } th dport 53 ip6 daddr %s accept comment "
                "\"dns: the resolver slirp relays fec0::3 to\"\n"
                "\t\tmeta l4proto { tcp, udp } th dport 53 reject comment "
                "\"dns: any other server\"\n"
                "\t\tfib daddr type { local, broadcast, anycast, multicast } reject\n"
                "%s%s"
                "\t\tip daddr { %s } reject comment \"special-purpose\"\n"
                "\t\tip6 daddr { %s } reject comment \"special-purpose\"\n"
                "\t\tmeta nfproto ipv6 ip6 daddr != 2000::/3 reject comment "
                "\"not global unicast\"\n"
                "\t}\n"
                "}\n",
                table, table, table, (unsigned) uid, range_rule, dns4, dns6, host4_rule, host6_rule,
                special4, special6);
        free (range_rule);
        free (host4_rule);
        free (host6_rule);
    }
    free (special4);
    free (special6);
    free (host4);
    free (host6);
    free (special.items);
    free (host.items);
    return rules;
}

static char *s_ruleset_now (const char *table, uid_t uid, uid_t first, uint32_t count,
                            const char *resolv_conf);

char *vmd_firewall_ruleset (uid_t uid, const char *resolv_conf)
{
    return s_ruleset_now (NULL, uid, 0, 0, resolv_conf);
}

static char *s_ruleset_now (const char *table, uid_t uid, uid_t first, uint32_t count,
                            const char *resolv_conf)
{
    struct ifaddrs *ifaddrs = NULL;
    if (getifaddrs (&ifaddrs) == -1)
        return NULL;
    char *rules = vmd_firewall_ruleset_range (table, uid, first, count, resolv_conf, ifaddrs);
    freeifaddrs (ifaddrs);
    return rules;
}

//  Runs nft -f - (check: nft -c -f -, which validates in the kernel and commits
//  nothing) with rules on its stdin; its output (errors) lands in out.
int vmd_firewall_nft (const char *nft_path, const char *rules, bool check, char *out, size_t size)
{
    int in[2], back[2];
    out[0] = 0;
    size_t length = strlen (rules);
    if (pipe2 (in, O_CLOEXEC) == -1)
        return -1;
    //  The rules (a few KiB; more on a host with many networks) go into the pipe before
    //  nft starts, so it must hold them all: 64 KiB by default, 1 MiB when allowed.
    int room = fcntl (in[1], F_SETPIPE_SZ, 1 << 20);
    if (room < 65536)
        room = 65536;
    if (length >= (size_t) room)
        snprintf (out, size, "the rules (%zu bytes) do not fit in a pipe of %d", length, room);
    if (length >= (size_t) room || pipe2 (back, O_CLOEXEC) == -1) {
        close (in[0]);
        close (in[1]);
        return -1;
    }
    ssize_t written = write (in[1], rules, length);
    close (in[1]);
    pid_t pid = written == (ssize_t) length ? fork () : -1;
    if (pid == 0) {
        if (dup2 (in[0], 0) == -1 || dup2 (back[1], 1) == -1 || dup2 (back[1], 2) == -1)
            _exit (126);
        const char *mode = check ? "-cf" : "-f";
        if (nft_path)
            execv (nft_path, (char *[]){(char *) nft_path, (char *) mode, "-", NULL});
        else {
            execvp ("nft", (char *[]){"nft", (char *) mode, "-", NULL});
            execv ("/usr/sbin/nft", (char *[]){"/usr/sbin/nft", (char *) mode, "-", NULL});
        }
        _exit (127);
    }
    close (in[0]);
    close (back[1]);
    size_t got = 0;
    ssize_t n;
    while (pid > 0 && (n = read (back[0], out + got, size - 1 - got)) != 0) {
        if (n > 0 && (got += (size_t) n) == size - 1)
            break;
        if (n < 0 && errno != EINTR)
            break;
    }
    out[got] = 0;
    close (back[0]);
    int status = 0;
    if (pid > 0)
        while (waitpid (pid, &status, 0) == -1 && errno == EINTR)
            ;
    if (pid > 0 && WIFEXITED (status) && WEXITSTATUS (status) == 127)
        snprintf (out, size, "nft was not found (install Debian's nftables package)");
    return pid > 0 && WIFEXITED (status) && WEXITSTATUS (status) == 0 ? 0 : -1;
}

static int s_nft (const char *nft_path, const char *rules, char *out, size_t size)
{
    return vmd_firewall_nft (nft_path, rules, false, out, size);
}

//  Loads rules; on failure logs why (nft's message, on one line) and returns -1.
static int s_load (const char *table, const char *rules, const char *nft_path)
{
    char out[2048] = "";
    int rc = rules ? s_nft (nft_path, rules, out, sizeof out) : -1;
    if (rc == -1) {
        for (char *c = out; *c; c++)
            if (*c == '\n' || *c == '\t')
                *c = ' ';
        sbx_error ("vmd_firewall: cannot load the guest network policy (nftables table inet "
                   "%s): %s",
                   table,
                   *out ? out : (rules ? strerror (errno) : "cannot read the host's networks"));
    }
    return rc;
}

int vmd_firewall_apply (uid_t uid, const char *resolv_conf, const char *nft_path)
{
    char *rules = vmd_firewall_ruleset (uid, resolv_conf);
    int rc = s_load (VMD_FIREWALL_TABLE, rules, nft_path);
    free (rules);
    if (rc == 0)
        sbx_info ("guest network policy loaded: nftables table inet %s, QEMU uid %u",
                  VMD_FIREWALL_TABLE, (unsigned) uid);
    return rc;
}

//  --------------------------------------------------------------------------
//  Keeping the table current from vmd's loop.

struct _vmd_firewall_t {
    zloop_t *loop;
    uid_t uid;
    uid_t uid_first; //  each guest's own uids (vmd_guest_set_uid): uid_count of them
    uint32_t uid_count;
    char *table;       //  the nftables table's name (inet family)
    char *resolv_conf; //  NULL: /etc/resolv.conf
    char *nft_path;    //  NULL: found on PATH
    char *loaded;      //  the rules in the kernel now
    size_t loads;
    int netlink; //  route socket on address changes, -1 when none
    int refresh; //  the periodic timer
    int settle;  //  one-shot after netlink spoke, -1 when none
};

//  Reloads when the rules would differ from those loaded. A failed reload keeps the old
//  table (still in force) and is tried again at the next refresh.
static void s_refresh (vmd_firewall_t *self)
{
    char *rules =
        s_ruleset_now (self->table, self->uid, self->uid_first, self->uid_count, self->resolv_conf);
    if (!rules)
        sbx_error ("vmd_firewall: cannot read the host's networks (getifaddrs: %s)%s",
                   strerror (errno), self->loaded ? "; the loaded policy stays" : "");
    if (!rules || (self->loaded && streq (rules, self->loaded))) {
        free (rules);
        return;
    }
    //  A reload runs nft (a few ms), and only when the host's networks or resolver
    //  changed: rare enough to do here rather than in a thread.
    if (s_load (self->table, rules, self->nft_path) == -1) {
        free (rules);
        return;
    }
    sbx_info ("guest network policy %s: nftables table inet %s, QEMU uid %u (host networks "
              "and resolver as they are now)",
              self->loaded ? "reloaded" : "loaded", self->table, (unsigned) self->uid);
    free (self->loaded);
    self->loaded = rules;
    self->loads++;
}

static int s_on_refresh (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_refresh ((vmd_firewall_t *) arg);
    return 0;
}

static int s_on_settled (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_firewall_t *self = arg;
    self->settle = -1;
    s_refresh (self);
    return 0;
}

//  An address came or went (or the socket overflowed: then something did). The
//  messages are not parsed: getifaddrs is read again once they stop coming.
static int s_on_netlink (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) item;
    vmd_firewall_t *self = arg;
    char buf[8192];
    while (recv (self->netlink, buf, sizeof buf, MSG_DONTWAIT) > 0 || errno == ENOBUFS ||
           errno == EINTR)
        errno = 0;
    if (self->settle == -1)
        self->settle = zloop_timer (loop, S_SETTLE_MS, 1, s_on_settled, self);
    return 0;
}

static int s_netlink_open (void)
{
    int fd = socket (AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK,
                             .nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR};
    if (fd >= 0 && bind (fd, (struct sockaddr *) &sa, sizeof sa) == 0)
        return fd;
    if (fd >= 0)
        close (fd);
    return -1;
}

vmd_firewall_t *vmd_firewall_new (zloop_t *loop, const char *table, uid_t uid, uid_t uid_first,
                                  uint32_t uid_count, const char *resolv_conf, const char *nft_path)
{
    vmd_firewall_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->table = strdup (table ? table : VMD_FIREWALL_TABLE);
    self->loop = loop;
    self->uid = uid;
    self->uid_first = uid_first;
    self->uid_count = uid_count;
    self->resolv_conf = resolv_conf ? strdup (resolv_conf) : NULL;
    self->nft_path = nft_path ? strdup (nft_path) : NULL;
    self->netlink = -1;
    self->refresh = -1;
    self->settle = -1;
    s_refresh (self);
    if (!self->loaded) {
        vmd_firewall_destroy (&self);
        return NULL;
    }
    self->netlink = s_netlink_open ();
    if (self->netlink >= 0) {
        zmq_pollitem_t item = {NULL, self->netlink, ZMQ_POLLIN, 0};
        zloop_poller (loop, &item, s_on_netlink, self);
        zloop_poller_set_tolerant (loop, &item); //  an overflow (ENOBUFS) is not the end
    } else
        sbx_warn ("vmd_firewall: no netlink route socket (%s): the host's networks are "
                  "re-read every %d ms only",
                  strerror (errno), VMD_FIREWALL_REFRESH_MS);
    self->refresh = zloop_timer (loop, VMD_FIREWALL_REFRESH_MS, 0, s_on_refresh, self);
    return self;
}

void vmd_firewall_destroy (vmd_firewall_t **self_p)
{
    vmd_firewall_t *self = *self_p;
    if (!self)
        return;
    if (self->netlink >= 0) {
        zmq_pollitem_t item = {NULL, self->netlink, ZMQ_POLLIN, 0};
        zloop_poller_end (self->loop, &item);
        close (self->netlink);
    }
    if (self->refresh != -1)
        zloop_timer_end (self->loop, self->refresh);
    if (self->settle != -1)
        zloop_timer_end (self->loop, self->settle);
    free (self->resolv_conf);
    free (self->table);
    free (self->nft_path);
    free (self->loaded);
    free (self);
    *self_p = NULL;
}

size_t vmd_firewall_loads (vmd_firewall_t *self)
{
    return self->loads;
}

//  --------------------------------------------------------------------------
//  Self test: the rules built from a resolv.conf and an interface list made here, read
//  back and checked against the registry table above; nft itself checks their syntax
//  against the kernel (nft -c: nothing is committed) when this runs as root.

//  The prefixes of the set in the rule that starts with `start` and carries `comment`.
static void s_test_set (const char *rules, const char *start, const char *comment,
                        s_prefixes_t *list)
{
    const char *line = rules;
    while ((line = strstr (line, start))) {
        const char *end = strchr (line, '\n');
        assert (end);
        char buf[16384];
        size_t len = (size_t) (end - line);
        assert (len < sizeof buf);
        memcpy (buf, line, len);
        buf[len] = 0;
        if (strstr (buf, comment)) {
            char *open = strchr (buf, '{'), *close = strchr (buf, '}');
            assert (open && close);
            *close = 0;
            for (char *word = strtok (open + 1, ", "); word; word = strtok (NULL, ", ")) {
                s_prefix_t p;
                assert (s_prefix_parse (word, &p) == 0);
                assert (s_prefixes_add (list, &p) == 0);
            }
        }
        line = end;
    }
}

static bool s_test_covered (const s_prefixes_t *list, const char *text)
{
    s_prefix_t p;
    assert (s_prefix_parse (text, &p) == 0);
    for (size_t i = 0; i < list->size; i++)
        if (s_prefix_contains (&list->items[i], &p))
            return true;
    return false;
}

static struct ifaddrs *s_test_if (struct ifaddrs *next, const char *addr, const char *mask)
{
    struct ifaddrs *ifa = calloc (1, sizeof *ifa);
    struct sockaddr_in6 *a = calloc (2, sizeof *a), *m = a + 1;
    assert (ifa && a);
    int family = strchr (addr, ':') ? AF_INET6 : AF_INET;
    a->sin6_family = m->sin6_family = (sa_family_t) family;
    void *a_at =
        family == AF_INET ? (void *) &((struct sockaddr_in *) a)->sin_addr : (void *) &a->sin6_addr;
    void *m_at =
        family == AF_INET ? (void *) &((struct sockaddr_in *) m)->sin_addr : (void *) &m->sin6_addr;
    assert (inet_pton (family, addr, a_at) == 1 && inet_pton (family, mask, m_at) == 1);
    ifa->ifa_name = (char *) "test0";
    ifa->ifa_addr = (struct sockaddr *) a;
    ifa->ifa_netmask = (struct sockaddr *) m;
    ifa->ifa_next = next;
    return ifa;
}

static void s_test_ifs_free (struct ifaddrs *ifa)
{
    while (ifa) {
        struct ifaddrs *next = ifa->ifa_next;
        free (ifa->ifa_addr); //  the netmask shares its allocation
        free (ifa);
        ifa = next;
    }
}

void vmd_firewall_test (bool verbose)
{
    if (verbose)
        printf (" * vmd_firewall: ");
    //  resolv.conf as slirp reads it: the first nameserver of each family, nothing else
    //  from the file reaching the rules.
    char path[] = "/tmp/vmd_firewall_test_XXXXXX";
    int fd = mkstemp (path);
    assert (fd >= 0);
    const char *resolv = "# comment\n nameserver 9.9.9.9\nnameserver 1.2.3.4; } accept; chain x {\n"
                         "nameserver 10.255.255.53\nsearch example.com\nnameserver 127.0.0.53\n"
                         "nameserver fe80::1%eth0\nnameserver 2001:db8::53\n"
                         "nameserver\nnameserver not-an-address\noptions edns0\n";
    assert (write (fd, resolv, strlen (resolv)) == (ssize_t) strlen (resolv));
    close (fd);
    //  A host with a private, a documentation and a public network, one inside another.
    struct ifaddrs *ifs = s_test_if (NULL, "10.1.2.3", "255.255.0.0");
    ifs = s_test_if (ifs, "10.1.9.9", "255.255.255.0");
    ifs = s_test_if (ifs, "192.0.2.2", "255.255.255.0");
    ifs = s_test_if (ifs, "8.8.4.77", "255.255.255.0");
    ifs = s_test_if (ifs, "2001:db8:1::5", "ffff:ffff:ffff:ffff::");
    ifs = s_test_if (ifs, "fe80::fc:ff:fe00:1", "ffff:ffff:ffff:ffff::");
    ifs = s_test_if (ifs, "127.0.0.1", "255.0.0.0");
    ifs = s_test_if (ifs, "::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
    char *rules = vmd_firewall_ruleset_range (NULL, 999, 1879048192, 65536, path, ifs);
    assert (rules);
    if (verbose)
        printf ("\n%s", rules);
    assert (strstr (rules, "meta skuid 999 jump guest\n"));
    assert (strstr (rules, "meta skuid 1879048192-1879113727 jump guest\n"));
    assert (strstr (rules, "th dport 53 ip daddr 10.255.255.53 accept"));
    //  A guest's DNS redirected to its relay (vmd_egress) passes before any refusal.
    assert (strstr (rules, "ip daddr 127.0.0.1 ct status dnat ct original proto-dst 53 accept"));
    assert (strstr (rules, "ct original proto-dst 53 accept") < strstr (rules, "reject"));
    assert (strstr (rules, "th dport 53 ip6 daddr fe80::1 accept"));
    assert (!strstr (rules, "127.0.0.53") && !strstr (rules, "2001:db8::53"));
    assert (!strstr (rules, "9.9.9.9") && !strstr (rules, "1.2.3.4") && !strstr (rules, "chain x"));
    //  DNS anywhere else is refused, after the resolver's exception and before the
    //  rules that would refuse a loopback or private resolver.
    const char *dns_reject = strstr (rules, "meta l4proto { tcp, udp } th dport 53 reject");
    assert (dns_reject && strstr (rules, "ip6 daddr fe80::1 accept") < dns_reject);
    assert (dns_reject < strstr (rules, "fib daddr type { local, broadcast, anycast, multicast } "
                                        "reject\n"));
    //  The host's networks: each prefix once, the ones inside another left out.
    assert (strstr (rules, "ip daddr { 8.8.4.0/24, 10.1.0.0/16, 127.0.0.0/8, 192.0.2.0/24 } "
                           "reject comment \"host networks\""));
    assert (strstr (rules, "ip6 daddr { ::1, 2001:db8:1::/64, fe80::/64 } reject comment "
                           "\"host networks\""));
    //  Every block of the registry table is refused, by a set that holds nothing else.
    s_prefixes_t refused = {0};
    s_test_set (rules, "ip daddr {", "\"special-purpose\"", &refused);
    s_test_set (rules, "ip6 daddr {", "\"special-purpose\"", &refused);
    assert (refused.size > 30);
    for (size_t i = 0; i < S_SPECIALS; i++)
        assert (s_test_covered (&refused, s_special[i].prefix));
    for (size_t i = 0; i < refused.size; i++) {
        char text[64];
        s_prefix_format (&refused.items[i], text, sizeof text);
        bool listed = false;
        for (size_t j = 0; j < S_SPECIALS && !listed; j++) {
            s_prefix_t p;
            s_prefix_parse (s_special[j].prefix, &p);
            listed = s_prefix_cmp (&p, &refused.items[i]) == 0;
        }
        assert (listed);
    }
    //  The issue's own list, spelled out, so that a table edit cannot drop one unseen.
    const char *must[] = {"0.0.0.0/8",
                          "10.0.0.0/8",
                          "100.64.0.0/10",
                          "127.0.0.0/8",
                          "169.254.169.254",
                          "172.16.0.0/12",
                          "192.0.0.0/24",
                          "192.0.2.0/24",
                          "192.31.196.0/24",
                          "192.52.193.0/24",
                          "192.88.99.0/24",
                          "192.168.0.0/16",
                          "192.175.48.0/24",
                          "198.18.0.0/15",
                          "198.51.100.0/24",
                          "203.0.113.0/24",
                          "240.0.0.0/4",
                          "255.255.255.255",
                          "224.0.0.0/4",
                          "::1",
                          "::",
                          "::ffff:0:0/96",
                          "64:ff9b:1::/48",
                          "100::/64",
                          "2001::/23",
                          "2001:db8::/32",
                          "2002::/16",
                          "fc00::/7",
                          "fe80::/10",
                          "ff00::/8",
                          "3fff::/20",
                          "5f00::/16"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        assert (s_test_covered (&refused, must[i]));
    //  The public internet is not: none of these is in a refusing set.
    s_test_set (rules, "ip daddr {", "\"host networks\"", &refused);
    s_test_set (rules, "ip6 daddr {", "\"host networks\"", &refused);
    const char *open[] = {"1.1.1.1",         "8.8.8.8",           "9.9.9.9",    "151.101.0.1",
                          "2606:4700::1111", "2a00:1450:4001::1", "2001:200::1"};
    for (size_t i = 0; i < sizeof open / sizeof open[0]; i++)
        assert (!s_test_covered (&refused, open[i]));
    assert (s_test_covered (&refused, "8.8.4.8")); //  the host's own public network is
    free (refused.items);
    //  nft reads them (validated by the kernel, committed nowhere): needs root.
    char out[2048];
    if (geteuid () == 0 && access ("/usr/sbin/nft", X_OK) == 0) {
        int rc = vmd_firewall_nft (NULL, rules, true, out, sizeof out);
        if (rc != 0)
            fprintf (stderr, "nft -c says: %s\n", out);
        assert (rc == 0);
    } else if (verbose)
        printf ("(not root or no nft: the rules' syntax was not checked by nft) ");
    free (rules);

    //  No interfaces: no host networks rule (nft refuses an empty set).
    rules = vmd_firewall_ruleset_for (1000, path, NULL);
    assert (rules && !strstr (rules, "host networks") && strstr (rules, "special-purpose"));
    free (rules);
    //  No resolv.conf: slirp relays to loopback, and so does the exception.
    unlink (path);
    rules = vmd_firewall_ruleset_for (1000, path, ifs);
    assert (rules && strstr (rules, "th dport 53 ip daddr 127.0.0.1 accept"));
    assert (strstr (rules, "th dport 53 ip6 daddr ::1 accept") &&
            strstr (rules, "skuid 1000 jump"));
    free (rules);
    s_test_ifs_free (ifs);
    //  This host's own interfaces: loopback at least.
    rules = vmd_firewall_ruleset (1000, path);
    assert (rules && strstr (rules, "127.0.0.0/8") && strstr (rules, "\"host networks\""));
    free (rules);
    //  A missing nft is a clear error, not a crash, and no firewall object without it.
    assert (vmd_firewall_apply (1000, path, "/nonexistent/nft") == -1);
    zloop_t *loop = zloop_new ();
    vmd_firewall_t *fw = vmd_firewall_new (loop, NULL, 1000, 0, 0, path, "/nonexistent/nft");
    assert (!fw);
    vmd_firewall_destroy (&fw);
    zloop_destroy (&loop);
    //  Loading for real changes the host: the integration tests prove what the loaded
    //  rules do from inside guests, and that a new interface's network is picked up
    //  (tests/integration/test_isolation.py).
    if (verbose)
        printf ("OK\n");
}
