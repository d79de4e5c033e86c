/*  gw_tls - the local certificate authority that lets a fresh install serve HTTPS.

    On first run it creates "sbx local CA" (ECDSA P-256, 10 years, CA:TRUE,
    keyCertSign) and a server certificate it signs for the gateway's hostname,
    *.<box domain> (the port proxy's hosts: box.<hostname>, or the box_domain setting),
    localhost, 127.0.0.1 and ::1. Users
    trust ca.crt once (curl --cacert, the OS store); an operator with a public
    certificate points the gateway at that instead.

    <dir>/ca.crt     0644   the CA certificate, the file clients trust
    <dir>/ca.key     0600   the CA key, only ever read here
    <dir>/server.crt 0644   the server certificate, 825 days, serverAuth
    <dir>/server.key 0600

    Later runs reuse what is there. The server certificate is made again when the
    hostname (and so the SANs) changed, when it expires within 30 days, or when it was
    not signed by the CA on disk; the CA is kept unless unusable. Every file is written
    to a temporary name, synced and renamed, so a crash never leaves half a key.
*/
#ifndef GW_TLS_H_INCLUDED
#define GW_TLS_H_INCLUDED

#include <stdbool.h>

//  Makes sure <dir> holds a CA and a server certificate for hostname (a DNS name or
//  an IP address), creating the directory (0700) if needed. On success returns 0 and
//  the paths of the server certificate, its key and the CA certificate, each freed
//  by the caller (pass NULL for paths not wanted). Returns -1 and logs why on error.
int gw_tls_ensure_ca (const char *dir, const char *hostname, char **cert_path, char **key_path,
                      char **ca_path);

//  The same, with the sandboxes' hosts under box_domain (a DNS name) instead of
//  box.<hostname>; NULL is gw_tls_ensure_ca.
int gw_tls_ensure_ca_box (const char *dir, const char *hostname, const char *box_domain,
                          char **cert_path, char **key_path, char **ca_path);

void gw_tls_test (bool verbose);

#endif
