/*  sbx_site - which hosts browsers count as one site: the registrable domain (the
    public suffix plus one label, "eTLD+1") from the Public Suffix List, through libpsl
    (the only module that includes it; Debian's publicsuffix package keeps the list
    current, libpsl's built-in copy is the fallback).

    Two hosts of one site share SameSite cookies and can set cookies for each other's
    parent domain, so a sandbox's port URLs must not be same-site with the gateway's
    sign-in and consent pages (docs/operations.md, box_domain). */
#ifndef SBX_SITE_H_INCLUDED
#define SBX_SITE_H_INCLUDED

#include <stdbool.h>

//  The registrable domain of host (a DNS name, any case, no port), lower case, fresh;
//  NULL when host has none: an IP address, a public suffix itself ("com", "github.io",
//  "localhost"), or not a DNS name.
char *sbx_site_registrable (const char *host);

//  Whether a and b are the same site: the same registrable domain, or, for hosts that
//  have none, the same host (case-insensitively).
bool sbx_site_same (const char *a, const char *b);

//  Whether host names this machine only: localhost, *.localhost, 127.0.0.0/8, ::1.
bool sbx_site_local (const char *host);

void sbx_site_test (bool verbose);

#endif
