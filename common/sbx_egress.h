/*  sbx_egress - a sandbox's egress rules: lists of CIDRs and domain names that the
    broker checks (create_sandbox, updates) and vmd turns into firewall rules and DNS
    answers. One place says what an entry may be and what a domain rule matches, so the
    two daemons cannot disagree.

    An entry is a CIDR ("203.0.113.0/24", "2001:db8::/32"), a bare address (a /32 or
    /128), or a domain name ("example.com": itself and every subdomain; "*.example.com"
    means the same). At most SBX_EGRESS_MAX entries a list.
*/
#ifndef SBX_EGRESS_H_INCLUDED
#define SBX_EGRESS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_EGRESS_MAX 64
//  Room for any entry written back in its canonical form (a name of 253 and a NUL).
#define SBX_EGRESS_TEXT 256

typedef struct {
    bool domain;                //  a domain name, else a CIDR
    int family;                 //  AF_INET or AF_INET6 (CIDRs only)
    uint8_t addr[16];           //  the network, host bits cleared (CIDRs only)
    int len;                    //  prefix length (CIDRs only)
    char text[SBX_EGRESS_TEXT]; //  canonical: "a.b.c.d/n", "x::/n" or "lower.case.name"
} sbx_egress_entry_t;

//  Parses one entry; 0 and *entry filled, or -1 with a sentence for a person in why.
int sbx_egress_parse (const char *text, sbx_egress_entry_t *entry, char *why, size_t why_size);

//  Checks a list of count entries named list ("allow" or "deny"): at most
//  SBX_EGRESS_MAX, each one parses. 0, or -1 with why ("egress.allow[2]: ...").
int sbx_egress_check (const char *list, char *const *items, size_t count, char *why,
                      size_t why_size);

//  True when a DNS name (any case, a trailing dot or not) is the rule's domain or one of
//  its subdomains.
bool sbx_egress_domain_matches (const char *domain, const char *name);

void sbx_egress_test (bool verbose);

#endif
