/*  sbx_egress - see sbx_egress.h */
#include "sbx_egress.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int s_fail (char *why, size_t size, const char *text)
{
    if (why && size)
        snprintf (why, size, "%s", text);
    return -1;
}

//  "a.b.c.d" or "x::y", optionally "/n": the network with its host bits cleared.
static int s_parse_cidr (const char *text, sbx_egress_entry_t *entry, char *why, size_t size)
{
    char addr[SBX_EGRESS_TEXT];
    const char *slash = strchr (text, '/');
    size_t n = slash ? (size_t) (slash - text) : strlen (text);
    if (n == 0 || n >= sizeof addr)
        return s_fail (why, size, "not an address or CIDR");
    memcpy (addr, text, n);
    addr[n] = 0;
    if (inet_pton (AF_INET, addr, entry->addr) == 1)
        entry->family = AF_INET;
    else if (inet_pton (AF_INET6, addr, entry->addr) == 1)
        entry->family = AF_INET6;
    else
        return s_fail (why, size, "not an IPv4 or IPv6 address");
    int bits = entry->family == AF_INET ? 32 : 128;
    entry->len = bits;
    if (slash) {
        const char *p = slash + 1;
        if (!*p || strlen (p) > 3)
            return s_fail (why, size, "the prefix length after / must be a number");
        int len = 0;
        for (; *p; p++) {
            if (!isdigit ((unsigned char) *p))
                return s_fail (why, size, "the prefix length after / must be a number");
            len = len * 10 + (*p - '0');
        }
        if (len > bits)
            return s_fail (why, size,
                           entry->family == AF_INET ? "an IPv4 prefix is at most /32"
                                                    : "an IPv6 prefix is at most /128");
        entry->len = len;
    }
    for (int i = entry->len; i < bits; i++)
        entry->addr[i / 8] &= (uint8_t) ~(0x80u >> (i % 8));
    char out[INET6_ADDRSTRLEN];
    inet_ntop (entry->family, entry->addr, out, sizeof out);
    snprintf (entry->text, sizeof entry->text, "%s/%d", out, entry->len);
    return 0;
}

//  Letters, digits and hyphens, labels of 1..63 not starting or ending with a hyphen,
//  253 in all, and a last label that is not all digits (that would be an address).
static int s_parse_domain (const char *text, sbx_egress_entry_t *entry, char *why, size_t size)
{
    if (strncmp (text, "*.", 2) == 0)
        text += 2;
    size_t n = strlen (text);
    if (n && text[n - 1] == '.')
        n--;
    if (n == 0)
        return s_fail (why, size, "empty");
    if (n > 253)
        return s_fail (why, size, "a domain name is at most 253 characters");
    size_t label = 0;
    bool digits_only = true;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? text[i] : '.';
        if (c == '.') {
            if (label == 0)
                return s_fail (why, size, "a domain name has no empty label");
            if (text[i - 1] == '-')
                return s_fail (why, size, "a label does not end with a hyphen");
            if (i < n) {
                label = 0;
                digits_only = true;
            }
            continue;
        }
        if (!isalnum ((unsigned char) c) && c != '-')
            return s_fail (why, size,
                           "not a CIDR, an address or a domain name (letters, "
                           "digits, hyphens and dots)");
        if (c == '-' && label == 0)
            return s_fail (why, size, "a label does not start with a hyphen");
        if (++label > 63)
            return s_fail (why, size, "a label of a domain name is at most 63 characters");
        if (!isdigit ((unsigned char) c))
            digits_only = false;
    }
    if (digits_only)
        return s_fail (why, size, "not an address (the last label of a name is not all digits)");
    entry->domain = true;
    for (size_t i = 0; i < n; i++)
        entry->text[i] = (char) tolower ((unsigned char) text[i]);
    entry->text[n] = 0;
    return 0;
}

int sbx_egress_parse (const char *text, sbx_egress_entry_t *entry, char *why, size_t why_size)
{
    memset (entry, 0, sizeof *entry);
    if (!text || !*text)
        return s_fail (why, why_size, "empty");
    if (strlen (text) >= SBX_EGRESS_TEXT)
        return s_fail (why, why_size, "longer than 255 characters");
    //  A colon or a slash, or digits and dots only: meant as an address.
    bool addressy = strchr (text, ':') || strchr (text, '/');
    if (!addressy) {
        addressy = true;
        for (const char *p = text; *p && addressy; p++)
            addressy = isdigit ((unsigned char) *p) || *p == '.';
    }
    return addressy ? s_parse_cidr (text, entry, why, why_size)
                    : s_parse_domain (text, entry, why, why_size);
}

int sbx_egress_check (const char *list, char *const *items, size_t count, char *why,
                      size_t why_size)
{
    if (count > SBX_EGRESS_MAX) {
        if (why && why_size)
            snprintf (why, why_size, "egress.%s has %zu entries; at most %d", list, count,
                      SBX_EGRESS_MAX);
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        sbx_egress_entry_t entry;
        char reason[160];
        if (sbx_egress_parse (items[i], &entry, reason, sizeof reason) != 0) {
            if (why && why_size)
                snprintf (why, why_size, "egress.%.8s[%zu] (\"%.64s\"): %.100s", list, i,
                          items[i] ? items[i] : "", reason);
            return -1;
        }
    }
    return 0;
}

bool sbx_egress_domain_matches (const char *domain, const char *name)
{
    size_t d = strlen (domain), n = strlen (name);
    if (n && name[n - 1] == '.')
        n--;
    if (d == 0 || n < d || strncasecmp (name + n - d, domain, d) != 0)
        return false;
    return n == d || name[n - d - 1] == '.';
}

void sbx_egress_test (bool verbose)
{
    if (verbose)
        printf (" * sbx_egress: ");
    sbx_egress_entry_t e;
    char why[160];
    assert (sbx_egress_parse ("203.0.113.7", &e, why, sizeof why) == 0 && !e.domain);
    assert (strcmp (e.text, "203.0.113.7/32") == 0 && e.len == 32);
    assert (sbx_egress_parse ("10.1.2.3/8", &e, why, sizeof why) == 0);
    assert (strcmp (e.text, "10.0.0.0/8") == 0 && e.family == AF_INET);
    assert (sbx_egress_parse ("2001:DB8::1/32", &e, why, sizeof why) == 0);
    assert (strcmp (e.text, "2001:db8::/32") == 0 && e.family == AF_INET6);
    assert (sbx_egress_parse ("0.0.0.0/0", &e, why, sizeof why) == 0 && e.len == 0);
    assert (sbx_egress_parse ("Example.COM.", &e, why, sizeof why) == 0 && e.domain);
    assert (strcmp (e.text, "example.com") == 0);
    assert (sbx_egress_parse ("*.pypi.org", &e, why, sizeof why) == 0);
    assert (strcmp (e.text, "pypi.org") == 0);
    assert (sbx_egress_parse ("localhost", &e, why, sizeof why) == 0 && e.domain);
    //  Refused, each with a reason.
    const char *bad[] = {
        "",       "1.2.3.4/33",  "::/129",  "1.2.3",   "1.2.3.4/", "1.2.3.4/x",    "a..b",
        "-a.com", "a-.com",      "a b.com", "a_b.com", "x.123",    "http://a.com", "1.2.3.4.5",
        "*.",     "fe80::1%eth0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        assert (sbx_egress_parse (bad[i], &e, why, sizeof why) == -1);
        assert (*why);
    }
    char label[70];
    memset (label, 'a', 64);
    strcpy (label + 64, ".com");
    assert (sbx_egress_parse (label, &e, why, sizeof why) == -1);
    //  Lists.
    char *items[] = {"1.1.1.1", "example.com", "bad..name"};
    assert (sbx_egress_check ("allow", items, 2, why, sizeof why) == 0);
    assert (sbx_egress_check ("deny", items, 3, why, sizeof why) == -1);
    assert (strstr (why, "egress.deny[2]") && strstr (why, "bad..name"));
    assert (sbx_egress_check ("allow", items, SBX_EGRESS_MAX + 1, why, sizeof why) == -1);
    assert (strstr (why, "at most 64"));
    //  Domain matching: itself and subdomains, not lookalikes.
    assert (sbx_egress_domain_matches ("example.com", "example.com"));
    assert (sbx_egress_domain_matches ("example.com", "WWW.Example.com."));
    assert (sbx_egress_domain_matches ("example.com", "a.b.example.com"));
    assert (!sbx_egress_domain_matches ("example.com", "badexample.com"));
    assert (!sbx_egress_domain_matches ("example.com", "example.com.evil.net"));
    assert (!sbx_egress_domain_matches ("example.com", "com"));
    if (verbose)
        printf ("OK\n");
}
