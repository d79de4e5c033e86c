/*  sbx_site - see sbx_site.h */
#include "sbx_site.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <libpsl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static psl_ctx_t *s_psl;

//  The newest list on the system (Debian's publicsuffix), else the built-in one. Loaded
//  once and kept for the process: a few hundred KiB, read on every check otherwise.
static void s_load (void)
{
    s_psl = psl_latest (NULL);
    if (!s_psl)
        s_psl = (psl_ctx_t *) psl_builtin ();
}

//  A lower-case copy of a DNS name, or NULL when host is not one (or is an address).
static char *s_dns_name (const char *host)
{
    if (!host || !*host || strlen (host) > 253)
        return NULL;
    unsigned char ip[16];
    if (inet_pton (AF_INET, host, ip) == 1 || inet_pton (AF_INET6, host, ip) == 1)
        return NULL;
    char *name = strdup (host);
    if (!name)
        return NULL;
    for (char *p = name; *p; p++) {
        if (!isalnum ((unsigned char) *p) && *p != '-' && *p != '.') {
            free (name);
            return NULL;
        }
        *p = (char) tolower ((unsigned char) *p);
    }
    if (name[0] == '.' || strstr (name, "..")) {
        free (name);
        return NULL;
    }
    return name;
}

char *sbx_site_registrable (const char *host)
{
    char *name = s_dns_name (host);
    if (!name)
        return NULL;
    size_t len = strlen (name);
    if (name[len - 1] == '.')
        name[len - 1] = 0; //  "example.com." is example.com
    pthread_once (&s_once, s_load);
    const char *domain = s_psl ? psl_registrable_domain (s_psl, name) : NULL;
    char *site = domain ? strdup (domain) : NULL;
    free (name);
    return site;
}

bool sbx_site_same (const char *a, const char *b)
{
    char *site_a = sbx_site_registrable (a), *site_b = sbx_site_registrable (b);
    bool same;
    if (site_a && site_b)
        same = strcmp (site_a, site_b) == 0;
    else if (!site_a && !site_b)
        same = a && b && strcasecmp (a, b) == 0;
    else
        same = false;
    free (site_a);
    free (site_b);
    return same;
}

bool sbx_site_local (const char *host)
{
    if (!host)
        return false;
    size_t len = strlen (host);
    if (strcasecmp (host, "localhost") == 0 ||
        (len > 10 && strcasecmp (host + len - 10, ".localhost") == 0))
        return true;
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton (AF_INET, host, &v4) == 1)
        return (ntohl (v4.s_addr) >> 24) == 127;
    return inet_pton (AF_INET6, host, &v6) == 1 && memcmp (&v6, &in6addr_loopback, 16) == 0;
}

void sbx_site_test (bool verbose)
{
    (void) verbose;
    char *site = sbx_site_registrable ("calm-otter-8000.box.SBX.Example.com");
    assert (site && strcmp (site, "example.com") == 0);
    free (site);
    site = sbx_site_registrable ("a.b.example.co.uk");
    assert (site && strcmp (site, "example.co.uk") == 0);
    free (site);
    site = sbx_site_registrable ("someone.github.io"); //  a private suffix: its own site
    assert (site && strcmp (site, "someone.github.io") == 0);
    free (site);
    assert (!sbx_site_registrable ("com"));
    assert (!sbx_site_registrable ("github.io"));
    assert (!sbx_site_registrable ("127.0.0.1"));
    assert (!sbx_site_registrable ("::1"));
    assert (!sbx_site_registrable ("bad host"));
    assert (!sbx_site_registrable (""));
    assert (!sbx_site_registrable (NULL));

    //  The deployments of docs/operations.md.
    assert (sbx_site_same ("sbx.example.com", "box.sbx.example.com"));
    assert (sbx_site_same ("sbx.example.com", "sbx-box.example.com"));
    assert (!sbx_site_same ("sbx.example.com", "sbx-box.example.net"));
    assert (!sbx_site_same ("alice.github.io", "bob.github.io"));
    assert (sbx_site_same ("sbx.test", "box.sbx.test")); //  unlisted TLDs: the "*" rule
    assert (!sbx_site_same ("sbx.test", "sbx-box.test"));
    assert (sbx_site_same ("localhost", "LOCALHOST"));
    assert (!sbx_site_same ("localhost", "box.localhost"));

    assert (sbx_site_local ("localhost") && sbx_site_local ("box.LocalHost"));
    assert (sbx_site_local ("127.0.0.1") && sbx_site_local ("127.1.2.3") && sbx_site_local ("::1"));
    assert (!sbx_site_local ("notlocalhost") && !sbx_site_local ("localhost.example.com"));
    assert (!sbx_site_local ("192.0.2.1") && !sbx_site_local ("sbx.example.com"));
    assert (!sbx_site_local (NULL));
}
