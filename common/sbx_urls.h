/*  sbx_urls - where clients reach this installation, from the listen, domain and tls
    settings, or the public_url setting when a balancer or TLS proxy stands in front:
    one rule for the CLI, the 401's resource metadata, OAuth audiences and sandbox URLs,
    so every gateway names the same origin. The port is left out when it is the
    scheme's default (443, or 80 without TLS). */
#ifndef SBX_URLS_H_INCLUDED
#define SBX_URLS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include "sbx_config.h"

//  True unless tls = off.
bool sbx_urls_tls (sbx_config_t *config);

//  0 when public_url is unset or an origin (http(s)://HOST[:PORT], no path); -1 with a
//  reason a person can act on in why.
int sbx_urls_check (sbx_config_t *config, char *why, size_t why_size);

//  Whether clients reach this installation over https: public_url's scheme, else tls.
bool sbx_urls_https (sbx_config_t *config);

//  public_url's origin, or "https://DOMAIN[:PORT]" from domain, tls and listen. NULL when
//  public_url is set but not an origin (sbx_urls_check says why). Caller frees.
char *sbx_urls_base (sbx_config_t *config);

//  Where sandboxes' URLs live, lower case, no port: the box_domain setting, or by
//  default "box.DOMAIN" (DOMAIN: public_url's host when that is set). Caller frees.
char *sbx_urls_box_domain (sbx_config_t *config);

//  ".BOX_DOMAIN[:PORT]": what follows a sandbox's label (or label-port) in its URLs.
//  Caller frees.
char *sbx_urls_box_suffix (sbx_config_t *config);

//  Whether uri may be an OAuth redirect URI: an absolute https URL, or http on a
//  loopback host (localhost, 127.0.0.1, [::1]) for native clients; at most 2000
//  characters, printable ASCII, without a fragment, with a host name (letters, digits,
//  "-._~") or a bracketed IPv6 address and a numeric port if any. Returns 0, or -1
//  with a reason a person can act on in why.
int sbx_urls_redirect_check (const char *uri, char *why, size_t why_size);

void sbx_urls_test (bool verbose);

#endif
