/*  vmd_firewall - see vmd_firewall.h */
#include "vmd_firewall.h"

#include "sbx_log.h"

#include <arpa/inet.h>
#include <assert.h>
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

//  Never reachable from a guest. TEST-NET ranges are left out on purpose: some networks
//  (this project's CI among them) map public registries into them.
#define S_BLOCKED_V4                                                                               \
    "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, "           \
    "192.0.0.0/24, 192.168.0.0/16, 224.0.0.0/3"

//  Appends the nameservers of one family found in path to set ("a, b"), validated by
//  inet_pton so nothing else from the file reaches nft.
static void s_nameservers (const char *path, int family, char *set, size_t size)
{
    set[0] = 0;
    FILE *file = fopen (path, "r");
    if (!file)
        return;
    char line[512];
    while (fgets (line, sizeof line, file)) {
        char word[16], addr[INET6_ADDRSTRLEN + 1];
        unsigned char bin[sizeof (struct in6_addr)];
        if (sscanf (line, " %15s %46s", word, addr) != 2 || strcmp (word, "nameserver") != 0)
            continue;
        char *zone = strchr (addr, '%'); //  fe80::1%eth0: the zone is not nft's
        if (zone)
            *zone = 0;
        if (inet_pton (family, addr, bin) != 1)
            continue;
        size_t used = strlen (set);
        if (used + strlen (addr) + 3 < size)
            snprintf (set + used, size - used, "%s%s", used ? ", " : "", addr);
    }
    fclose (file);
}

char *vmd_firewall_ruleset (uid_t uid, const char *resolv_conf)
{
    const char *path = resolv_conf ? resolv_conf : "/etc/resolv.conf";
    char v4[1024], v6[2048], dns4[1200] = "", dns6[2200] = "";
    s_nameservers (path, AF_INET, v4, sizeof v4);
    s_nameservers (path, AF_INET6, v6, sizeof v6);
    if (*v4)
        snprintf (dns4, sizeof dns4,
                  "\t\tmeta l4proto { tcp, udp } th dport 53 ip daddr { %s } accept\n", v4);
    if (*v6)
        snprintf (dns6, sizeof dns6,
                  "\t\tmeta l4proto { tcp, udp } th dport 53 ip6 daddr { %s } accept\n", v6);
    //  The first two lines make the load idempotent and atomic: one nft transaction
    //  replaces whatever an earlier vmd left.
    return zsys_sprintf ("table inet " VMD_FIREWALL_TABLE "\n"
                         "delete table inet " VMD_FIREWALL_TABLE "\n"
                         "table inet " VMD_FIREWALL_TABLE " {\n"
                         "\tchain output {\n"
                         "\t\ttype filter hook output priority filter; policy accept;\n"
                         "\t\tmeta skuid %u jump guest\n"
                         "\t}\n"
                         "\tchain guest {\n"
                         "\t\tct state established,related accept\n"
                         "%s%s"
                         "\t\tfib daddr type { local, broadcast, anycast, multicast } reject\n"
                         "\t\tip daddr { " S_BLOCKED_V4 " } reject\n"
                         "\t\tmeta nfproto ipv6 ip6 daddr != 2000::/3 reject\n"
                         "\t}\n"
                         "}\n",
                         (unsigned) uid, dns4, dns6);
}

//  Runs nft -f - with rules on its stdin; its output (errors) lands in out.
static int s_nft (const char *nft_path, const char *rules, char *out, size_t size)
{
    int in[2], back[2];
    out[0] = 0;
    size_t length = strlen (rules);
    //  A pipe holds 64 KiB: the rules (a few hundred bytes) go in before nft starts.
    if (length > 60000 || pipe2 (in, O_CLOEXEC) == -1)
        return -1;
    if (pipe2 (back, O_CLOEXEC) == -1) {
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
        if (nft_path)
            execv (nft_path, (char *[]){(char *) nft_path, "-f", "-", NULL});
        else {
            execvp ("nft", (char *[]){"nft", "-f", "-", NULL});
            execv ("/usr/sbin/nft", (char *[]){"/usr/sbin/nft", "-f", "-", NULL});
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

int vmd_firewall_apply (uid_t uid, const char *resolv_conf, const char *nft_path)
{
    char *rules = vmd_firewall_ruleset (uid, resolv_conf);
    char out[2048];
    int rc = rules ? s_nft (nft_path, rules, out, sizeof out) : -1;
    free (rules);
    if (rc == -1) {
        //  One line for the log: nft's message spans several.
        for (char *c = out; *c; c++)
            if (*c == '\n' || *c == '\t')
                *c = ' ';
        sbx_error ("vmd_firewall: cannot load the guest network policy (nftables table inet "
                   "%s): %s",
                   VMD_FIREWALL_TABLE, *out ? out : strerror (errno));
        return -1;
    }
    sbx_info ("guest network policy loaded: nftables table inet %s, QEMU uid %u "
              "(public internet only; host, private and link-local addresses rejected)",
              VMD_FIREWALL_TABLE, (unsigned) uid);
    return 0;
}

void vmd_firewall_test (bool verbose)
{
    if (verbose)
        printf (" * vmd_firewall: ");
    //  resolv.conf is read from disk: only valid addresses reach the rules.
    char path[] = "/tmp/vmd_firewall_test_XXXXXX";
    int fd = mkstemp (path);
    assert (fd >= 0);
    const char *resolv = "# comment\nnameserver 10.255.255.53\nsearch example.com\n"
                         "nameserver 127.0.0.53\nnameserver fe80::1%eth0\n"
                         "nameserver 1.2.3.4; } accept; chain x {\nnameserver 2001:db8::53\n"
                         "nameserver\nnameserver not-an-address\noptions edns0\n";
    assert (write (fd, resolv, strlen (resolv)) == (ssize_t) strlen (resolv));
    close (fd);
    char *rules = vmd_firewall_ruleset (999, path);
    assert (rules);
    assert (strstr (rules, "meta skuid 999 jump guest\n"));
    assert (strstr (rules, "th dport 53 ip daddr { 10.255.255.53, 127.0.0.53 } accept\n"));
    assert (strstr (rules, "th dport 53 ip6 daddr { fe80::1, 2001:db8::53 } accept\n"));
    assert (!strstr (rules, "1.2.3.4"));
    assert (!strstr (rules, "chain x"));
    assert (strstr (rules, "fib daddr type { local, broadcast, anycast, multicast } reject\n"));
    assert (strstr (rules, "127.0.0.0/8"));
    //  The DNS exception comes before the rules that would reject a loopback resolver.
    assert (strstr (rules, "th dport 53") < strstr (rules, "fib daddr"));
    free (rules);
    //  No resolv.conf: no DNS rule, the rest unchanged.
    unlink (path);
    rules = vmd_firewall_ruleset (1000, path);
    assert (rules && !strstr (rules, "dport 53") && strstr (rules, "meta skuid 1000 jump"));
    free (rules);
    //  A missing nft is a clear error, not a crash.
    assert (vmd_firewall_apply (1000, path, "/nonexistent/nft") == -1);
    //  Loading for real needs root and nftables; the integration tests prove what the
    //  rules do from inside guests (tests/integration/test_isolation.py).
    if (verbose)
        printf ("OK\n");
}
