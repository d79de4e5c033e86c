/*  gw_tls - see gw_tls.h */
#include "gw_tls.h"
#include "sbx_log.h"

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <gnutls/x509.h>

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GW_TLS_DAY         (24 * 60 * 60)
#define GW_TLS_CA_DAYS     3650
#define GW_TLS_SERVER_DAYS 825 //  the most browsers accept for a server certificate
#define GW_TLS_RENEW_DAYS  30
#define GW_TLS_MAX_SANS    8
#define GW_TLS_CA_NAME     "sbx local CA"

//  One subjectAltName: a DNS name or the raw bytes of an IP address.
typedef struct {
    int type; //  GNUTLS_SAN_DNSNAME or GNUTLS_SAN_IPADDRESS
    char value[300];
    size_t size;
} san_t;

typedef struct {
    san_t san[GW_TLS_MAX_SANS];
    size_t count;
} san_set_t;

static char *s_path (const char *dir, const char *name)
{
    size_t size = strlen (dir) + strlen (name) + 2;
    char *path = malloc (size);
    if (path)
        snprintf (path, size, "%s/%s", dir, name);
    return path;
}

//  Hostnames come from configuration: a DNS name or an IP literal, nothing that could
//  smuggle text into a certificate or a path.
static bool s_hostname_valid (const char *hostname)
{
    size_t len = strlen (hostname);
    if (len == 0 || len > 253)
        return false;
    unsigned char ip[16];
    if (inet_pton (AF_INET, hostname, ip) == 1 || inet_pton (AF_INET6, hostname, ip) == 1)
        return true;
    for (const char *p = hostname; *p; p++)
        if (!isalnum ((unsigned char) *p) && *p != '-' && *p != '.')
            return false;
    return hostname[0] != '.' && hostname[0] != '-';
}

static void s_sans_add (san_set_t *set, int type, const void *value, size_t size)
{
    for (size_t i = 0; i < set->count; i++)
        if (set->san[i].type == type && set->san[i].size == size &&
            memcmp (set->san[i].value, value, size) == 0)
            return; //  "localhost" as the hostname is listed once
    assert (set->count < GW_TLS_MAX_SANS && size < sizeof set->san[0].value);
    san_t *san = &set->san[set->count++];
    san->type = type;
    memcpy (san->value, value, size);
    san->size = size;
}

static void s_sans_add_host (san_set_t *set, const char *host)
{
    unsigned char ip[16];
    if (inet_pton (AF_INET, host, ip) == 1)
        s_sans_add (set, GNUTLS_SAN_IPADDRESS, ip, 4);
    else if (inet_pton (AF_INET6, host, ip) == 1)
        s_sans_add (set, GNUTLS_SAN_IPADDRESS, ip, 16);
    else {
        char lower[254];
        size_t len = strlen (host);
        for (size_t i = 0; i <= len; i++)
            lower[i] = (char) tolower ((unsigned char) host[i]);
        s_sans_add (set, GNUTLS_SAN_DNSNAME, lower, len);
    }
}

//  box_domain NULL: box.<hostname>, for a DNS name (an IP address has no sandbox hosts).
static void s_sans_wanted (san_set_t *set, const char *hostname, const char *box_domain)
{
    memset (set, 0, sizeof *set);
    s_sans_add_host (set, hostname);
    unsigned char ip[16];
    bool named = inet_pton (AF_INET, hostname, ip) != 1 && inet_pton (AF_INET6, hostname, ip) != 1;
    if (box_domain || named) {
        //  The port proxy serves <name>-<port>.<box domain>: one label, one wildcard.
        char wildcard[600];
        int n = snprintf (wildcard, sizeof wildcard, box_domain ? "*.%s" : "*.box.%s",
                          box_domain ? box_domain : hostname);
        for (int i = 0; i < n; i++)
            wildcard[i] = (char) tolower ((unsigned char) wildcard[i]);
        s_sans_add (set, GNUTLS_SAN_DNSNAME, wildcard, (size_t) n);
    }
    s_sans_add (set, GNUTLS_SAN_DNSNAME, "localhost", 9);
    s_sans_add_host (set, "127.0.0.1");
    s_sans_add_host (set, "::1");
}

//  The SANs a certificate holds; -1 if it has more than we would ever write.
static int s_sans_of (gnutls_x509_crt_t crt, san_set_t *set)
{
    memset (set, 0, sizeof *set);
    for (unsigned i = 0;; i++) {
        char value[300];
        size_t size = sizeof value;
        unsigned type;
        int rc = gnutls_x509_crt_get_subject_alt_name2 (crt, i, value, &size, &type, NULL);
        if (rc == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE)
            return 0;
        if (rc < 0 || set->count == GW_TLS_MAX_SANS || size >= sizeof value)
            return -1;
        s_sans_add (set, (int) type, value, size);
    }
}

static bool s_sans_equal (const san_set_t *a, const san_set_t *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++) {
        bool found = false;
        for (size_t j = 0; j < b->count && !found; j++)
            found = a->san[i].type == b->san[j].type && a->san[i].size == b->san[j].size &&
                    memcmp (a->san[i].value, b->san[j].value, a->san[i].size) == 0;
        if (!found)
            return false;
    }
    return true;
}

//  Writes a whole file under a temporary name, syncs it and renames it into place, then
//  syncs the directory: readers see the old file or the new one, never a partial one.
static int s_write_atomic (const char *dir, const char *path, const gnutls_datum_t *data,
                           mode_t mode)
{
    char tmp[4096];
    snprintf (tmp, sizeof tmp, "%s.tmp.%d", path, (int) getpid ());
    int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd == -1) {
        sbx_error ("tls: cannot create %s: %s", tmp, strerror (errno));
        return -1;
    }
    //  The umask must not loosen or tighten what clients and the CA key need.
    int rc = fchmod (fd, mode);
    size_t done = 0;
    while (rc == 0 && done < data->size) {
        ssize_t n = write (fd, data->data + done, data->size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = -1;
        else
            done += (size_t) n;
    }
    if (rc == 0)
        rc = fsync (fd);
    if (close (fd) != 0)
        rc = -1;
    if (rc == 0)
        rc = rename (tmp, path);
    if (rc != 0) {
        sbx_error ("tls: cannot write %s: %s", path, strerror (errno));
        unlink (tmp);
        return -1;
    }
    int dfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd != -1) {
        (void) fsync (dfd);
        close (dfd);
    }
    return 0;
}

static gnutls_x509_crt_t s_crt_load (const char *path)
{
    gnutls_datum_t data = {NULL, 0};
    if (gnutls_load_file (path, &data) < 0)
        return NULL;
    gnutls_x509_crt_t crt = NULL;
    if (gnutls_x509_crt_init (&crt) < 0 ||
        gnutls_x509_crt_import (crt, &data, GNUTLS_X509_FMT_PEM) < 0) {
        if (crt)
            gnutls_x509_crt_deinit (crt);
        crt = NULL;
    }
    gnutls_free (data.data);
    return crt;
}

static gnutls_x509_privkey_t s_key_load (const char *path)
{
    gnutls_datum_t data = {NULL, 0};
    if (gnutls_load_file (path, &data) < 0)
        return NULL;
    gnutls_x509_privkey_t key = NULL;
    if (gnutls_x509_privkey_init (&key) < 0 ||
        gnutls_x509_privkey_import2 (key, &data, GNUTLS_X509_FMT_PEM, NULL, 0) < 0) {
        if (key)
            gnutls_x509_privkey_deinit (key);
        key = NULL;
    }
    gnutls_free (data.data);
    return key;
}

//  True when the key is the one the certificate was made for.
static bool s_key_matches (gnutls_x509_crt_t crt, gnutls_x509_privkey_t key)
{
    unsigned char a[64], b[64];
    size_t asize = sizeof a, bsize = sizeof b;
    if (gnutls_x509_crt_get_key_id (crt, GNUTLS_KEYID_USE_SHA256, a, &asize) < 0 ||
        gnutls_x509_privkey_get_key_id (key, GNUTLS_KEYID_USE_SHA256, b, &bsize) < 0)
        return false;
    return asize == bsize && memcmp (a, b, asize) == 0;
}

static bool s_expires_soon (gnutls_x509_crt_t crt)
{
    time_t expires = gnutls_x509_crt_get_expiration_time (crt);
    return expires == (time_t) -1 || expires < time (NULL) + GW_TLS_RENEW_DAYS * GW_TLS_DAY;
}

//  Fills in what a CA and a server certificate share: version, serial, validity,
//  subject, key and subject key id.
static int s_crt_prepare (gnutls_x509_crt_t crt, gnutls_x509_privkey_t key, const char *cn,
                          unsigned days)
{
    unsigned char serial[16];
    if (gnutls_rnd (GNUTLS_RND_NONCE, serial, sizeof serial) < 0)
        return -1;
    serial[0] = (serial[0] & 0x7f) | 0x40; //  positive and full length, as RFC 5280 wants
    time_t now = time (NULL);
    unsigned char keyid[64];
    size_t keyid_size = sizeof keyid;
    if (gnutls_x509_crt_set_version (crt, 3) < 0 ||
        gnutls_x509_crt_set_serial (crt, serial, sizeof serial) < 0
        //  An hour back, so a client whose clock is a little behind still accepts it.
        || gnutls_x509_crt_set_activation_time (crt, now - 3600) < 0 ||
        gnutls_x509_crt_set_expiration_time (crt, now + (time_t) days * GW_TLS_DAY) < 0 ||
        gnutls_x509_crt_set_dn_by_oid (crt, GNUTLS_OID_X520_COMMON_NAME, 0, cn,
                                       (unsigned) strlen (cn)) < 0 ||
        gnutls_x509_crt_set_key (crt, key) < 0 ||
        gnutls_x509_crt_get_key_id (crt, GNUTLS_KEYID_USE_SHA1, keyid, &keyid_size) < 0 ||
        gnutls_x509_crt_set_subject_key_id (crt, keyid, keyid_size) < 0)
        return -1;
    return 0;
}

static gnutls_x509_privkey_t s_key_new (void)
{
    gnutls_x509_privkey_t key = NULL;
    if (gnutls_x509_privkey_init (&key) < 0)
        return NULL;
    if (gnutls_x509_privkey_generate (key, GNUTLS_PK_ECDSA,
                                      GNUTLS_CURVE_TO_BITS (GNUTLS_ECC_CURVE_SECP256R1), 0) < 0) {
        gnutls_x509_privkey_deinit (key);
        return NULL;
    }
    return key;
}

//  Exports and writes a certificate and its key: the key first, so a crash between the
//  two leaves a pair that s_key_matches rejects, never a new key's certificate missing.
static int s_save (const char *dir, const char *crt_path, gnutls_x509_crt_t crt,
                   const char *key_path, gnutls_x509_privkey_t key)
{
    gnutls_datum_t crt_pem = {NULL, 0}, key_pem = {NULL, 0};
    int rc = -1;
    if (gnutls_x509_crt_export2 (crt, GNUTLS_X509_FMT_PEM, &crt_pem) >= 0 &&
        gnutls_x509_privkey_export2_pkcs8 (key, GNUTLS_X509_FMT_PEM, NULL, GNUTLS_PKCS_PLAIN,
                                           &key_pem) >= 0 &&
        s_write_atomic (dir, key_path, &key_pem, 0600) == 0 &&
        s_write_atomic (dir, crt_path, &crt_pem, 0644) == 0)
        rc = 0;
    gnutls_free (crt_pem.data);
    if (key_pem.data) {
        gnutls_memset (key_pem.data, 0, key_pem.size);
        gnutls_free (key_pem.data);
    }
    return rc;
}

//  Makes a new self-signed CA. Returns 0 with crt and key set, or -1.
static int s_ca_new (gnutls_x509_crt_t *crt_p, gnutls_x509_privkey_t *key_p)
{
    gnutls_x509_privkey_t key = s_key_new ();
    gnutls_x509_crt_t crt = NULL;
    if (!key || gnutls_x509_crt_init (&crt) < 0 ||
        s_crt_prepare (crt, key, GW_TLS_CA_NAME, GW_TLS_CA_DAYS) != 0
        //  CA:TRUE without a path length: it signs server certificates only.
        || gnutls_x509_crt_set_basic_constraints (crt, 1, -1) < 0 ||
        gnutls_x509_crt_set_key_usage (crt, GNUTLS_KEY_KEY_CERT_SIGN | GNUTLS_KEY_CRL_SIGN |
                                                GNUTLS_KEY_DIGITAL_SIGNATURE) < 0 ||
        gnutls_x509_crt_sign2 (crt, crt, key, GNUTLS_DIG_SHA256, 0) < 0) {
        if (crt)
            gnutls_x509_crt_deinit (crt);
        if (key)
            gnutls_x509_privkey_deinit (key);
        return -1;
    }
    *crt_p = crt;
    *key_p = key;
    return 0;
}

//  Issues a server certificate for the wanted SANs, valid `days`. Returns 0 or -1.
static int s_server_new (gnutls_x509_crt_t ca, gnutls_x509_privkey_t ca_key, const char *hostname,
                         const san_set_t *sans, unsigned days, gnutls_x509_crt_t *crt_p,
                         gnutls_x509_privkey_t *key_p)
{
    gnutls_x509_privkey_t key = s_key_new ();
    gnutls_x509_crt_t crt = NULL;
    unsigned char ca_keyid[64];
    size_t ca_keyid_size = sizeof ca_keyid;
    unsigned critical;
    int rc = -1;
    if (key && gnutls_x509_crt_init (&crt) >= 0 && s_crt_prepare (crt, key, hostname, days) == 0 &&
        gnutls_x509_crt_set_basic_constraints (crt, 0, -1) >= 0 &&
        gnutls_x509_crt_set_key_usage (crt, GNUTLS_KEY_DIGITAL_SIGNATURE) >= 0 &&
        gnutls_x509_crt_set_key_purpose_oid (crt, GNUTLS_KP_TLS_WWW_SERVER, 0) >= 0 &&
        gnutls_x509_crt_get_subject_key_id (ca, ca_keyid, &ca_keyid_size, &critical) >= 0 &&
        gnutls_x509_crt_set_authority_key_id (crt, ca_keyid, ca_keyid_size) >= 0) {
        rc = 0;
        for (size_t i = 0; i < sans->count && rc == 0; i++)
            if (gnutls_x509_crt_set_subject_alt_name (crt, sans->san[i].type, sans->san[i].value,
                                                      (unsigned) sans->san[i].size,
                                                      GNUTLS_FSAN_APPEND) < 0)
                rc = -1;
        if (rc == 0 && gnutls_x509_crt_sign2 (crt, ca, ca_key, GNUTLS_DIG_SHA256, 0) < 0)
            rc = -1;
    }
    if (rc != 0) {
        if (crt)
            gnutls_x509_crt_deinit (crt);
        if (key)
            gnutls_x509_privkey_deinit (key);
        return -1;
    }
    *crt_p = crt;
    *key_p = key;
    return 0;
}

//  True when the server certificate on disk can be kept: its key is there, the CA on
//  disk signed it, it names exactly the wanted hosts and it has more than 30 days left.
static bool s_server_reusable (const char *crt_path, const char *key_path, gnutls_x509_crt_t ca,
                               const san_set_t *wanted)
{
    gnutls_x509_crt_t crt = s_crt_load (crt_path);
    gnutls_x509_privkey_t key = crt ? s_key_load (key_path) : NULL;
    bool ok = false;
    if (crt && key && s_key_matches (crt, key) && !s_expires_soon (crt)) {
        unsigned status = 1;
        san_set_t sans;
        ok = gnutls_x509_crt_verify (crt, &ca, 1, 0, &status) >= 0 && status == 0 &&
             s_sans_of (crt, &sans) == 0 && s_sans_equal (&sans, wanted);
    }
    if (crt)
        gnutls_x509_crt_deinit (crt);
    if (key)
        gnutls_x509_privkey_deinit (key);
    return ok;
}

//  Loads the CA if it is usable: both files, matching, a CA, not about to expire.
static int s_ca_load (const char *crt_path, const char *key_path, gnutls_x509_crt_t *crt_p,
                      gnutls_x509_privkey_t *key_p)
{
    gnutls_x509_crt_t crt = s_crt_load (crt_path);
    gnutls_x509_privkey_t key = crt ? s_key_load (key_path) : NULL;
    unsigned critical;
    if (crt && key && s_key_matches (crt, key) && !s_expires_soon (crt) &&
        gnutls_x509_crt_get_basic_constraints (crt, &critical, NULL, NULL) > 0) {
        *crt_p = crt;
        *key_p = key;
        return 0;
    }
    if (crt)
        gnutls_x509_crt_deinit (crt);
    if (key)
        gnutls_x509_privkey_deinit (key);
    return -1;
}

//  The work of gw_tls_ensure_ca with the lock held; `days` is the server validity, so
//  the self-test can plant a certificate about to expire.
static int s_ensure (const char *dir, const char *hostname, const char *box_domain, unsigned days)
{
    char *ca_crt_path = s_path (dir, "ca.crt");
    char *ca_key_path = s_path (dir, "ca.key");
    char *crt_path = s_path (dir, "server.crt");
    char *key_path = s_path (dir, "server.key");
    gnutls_x509_crt_t ca = NULL, crt = NULL;
    gnutls_x509_privkey_t ca_key = NULL, key = NULL;
    int rc = -1;
    if (!ca_crt_path || !ca_key_path || !crt_path || !key_path)
        goto done;

    if (s_ca_load (ca_crt_path, ca_key_path, &ca, &ca_key) != 0) {
        if (access (ca_crt_path, F_OK) == 0)
            sbx_warn ("tls: %s is unusable (missing key, mismatched or expiring), making a "
                      "new CA: clients must trust the new one",
                      ca_crt_path);
        if (s_ca_new (&ca, &ca_key) != 0 || s_save (dir, ca_crt_path, ca, ca_key_path, ca_key)) {
            sbx_error ("tls: cannot create a CA in %s", dir);
            goto done;
        }
        sbx_info ("tls: created %s (\"%s\"): clients trust this file", ca_crt_path, GW_TLS_CA_NAME);
    }
    san_set_t wanted;
    s_sans_wanted (&wanted, hostname, box_domain);
    if (days == GW_TLS_SERVER_DAYS && s_server_reusable (crt_path, key_path, ca, &wanted)) {
        rc = 0;
        goto done;
    }
    if (s_server_new (ca, ca_key, hostname, &wanted, days, &crt, &key) != 0 ||
        s_save (dir, crt_path, crt, key_path, key) != 0) {
        sbx_error ("tls: cannot issue a server certificate in %s", dir);
        goto done;
    }
    sbx_info ("tls: issued %s for %s (%zu names, %u days)", crt_path, hostname, wanted.count, days);
    rc = 0;
done:
    if (ca)
        gnutls_x509_crt_deinit (ca);
    if (ca_key)
        gnutls_x509_privkey_deinit (ca_key);
    if (crt)
        gnutls_x509_crt_deinit (crt);
    if (key)
        gnutls_x509_privkey_deinit (key);
    free (ca_crt_path);
    free (ca_key_path);
    free (crt_path);
    free (key_path);
    return rc;
}

//  Several gateways may start together on one host: a lock file in the directory makes
//  them take turns, so two never write two different CAs.
static int s_ensure_locked (const char *dir, const char *hostname, const char *box_domain,
                            unsigned days)
{
    if (!dir || !hostname || !s_hostname_valid (hostname)) {
        sbx_error ("tls: invalid hostname '%s'", hostname ? hostname : "(null)");
        return -1;
    }
    if (box_domain && (!s_hostname_valid (box_domain) || strlen (box_domain) > 250)) {
        sbx_error ("tls: invalid box_domain '%s'", box_domain);
        return -1;
    }
    if (mkdir (dir, 0700) != 0 && errno != EEXIST) {
        sbx_error ("tls: cannot create %s: %s", dir, strerror (errno));
        return -1;
    }
    char *lock_path = s_path (dir, ".lock");
    int lock = lock_path ? open (lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
    free (lock_path);
    if (lock == -1 || flock (lock, LOCK_EX) != 0) {
        sbx_error ("tls: cannot lock %s: %s", dir, strerror (errno));
        if (lock != -1)
            close (lock);
        return -1;
    }
    int rc = s_ensure (dir, hostname, box_domain, days);
    close (lock); //  releases the lock
    return rc;
}

int gw_tls_ensure_ca (const char *dir, const char *hostname, char **cert_path, char **key_path,
                      char **ca_path)
{
    return gw_tls_ensure_ca_box (dir, hostname, NULL, cert_path, key_path, ca_path);
}

int gw_tls_ensure_ca_box (const char *dir, const char *hostname, const char *box_domain,
                          char **cert_path, char **key_path, char **ca_path)
{
    if (s_ensure_locked (dir, hostname, box_domain, GW_TLS_SERVER_DAYS) != 0)
        return -1;
    char *paths[3] = {s_path (dir, "server.crt"), s_path (dir, "server.key"),
                      s_path (dir, "ca.crt")};
    char **outs[3] = {cert_path, key_path, ca_path};
    if (!paths[0] || !paths[1] || !paths[2]) {
        for (int i = 0; i < 3; i++)
            free (paths[i]);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (outs[i])
            *outs[i] = paths[i];
        else
            free (paths[i]);
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Self-test

static gnutls_datum_t s_test_read (const char *dir, const char *name)
{
    char *path = s_path (dir, name);
    gnutls_datum_t data = {NULL, 0};
    assert (gnutls_load_file (path, &data) == 0);
    free (path);
    return data;
}

static bool s_test_same (gnutls_datum_t a, gnutls_datum_t b)
{
    return a.size == b.size && memcmp (a.data, b.data, a.size) == 0;
}

static mode_t s_test_mode (const char *dir, const char *name)
{
    char *path = s_path (dir, name);
    struct stat st;
    assert (stat (path, &st) == 0);
    free (path);
    return st.st_mode & 07777;
}

//  Loads server.crt and ca.crt, and checks the chain and the usual server attributes.
static gnutls_x509_crt_t s_test_verified (const char *dir, gnutls_x509_crt_t *ca_p)
{
    char *ca_path = s_path (dir, "ca.crt");
    char *crt_path = s_path (dir, "server.crt");
    gnutls_x509_crt_t ca = s_crt_load (ca_path);
    gnutls_x509_crt_t crt = s_crt_load (crt_path);
    assert (ca && crt);
    unsigned status = 1, critical = 0;
    assert (gnutls_x509_crt_verify (crt, &ca, 1, 0, &status) == 0);
    assert (status == 0);
    assert (gnutls_x509_crt_get_basic_constraints (ca, &critical, NULL, NULL) > 0);
    assert (gnutls_x509_crt_get_basic_constraints (crt, &critical, NULL, NULL) == 0);
    unsigned usage = 0;
    assert (gnutls_x509_crt_get_key_usage (ca, &usage, &critical) >= 0);
    assert (usage & GNUTLS_KEY_KEY_CERT_SIGN);
    char oid[128];
    size_t oid_size = sizeof oid;
    assert (gnutls_x509_crt_get_key_purpose_oid (crt, 0, oid, &oid_size, NULL) >= 0);
    assert (strcmp (oid, GNUTLS_KP_TLS_WWW_SERVER) == 0);
    time_t life = gnutls_x509_crt_get_expiration_time (ca) - time (NULL);
    assert (life > (GW_TLS_CA_DAYS - 1) * GW_TLS_DAY);
    char name[128];
    size_t name_size = sizeof name;
    assert (gnutls_x509_crt_get_dn_by_oid (ca, GNUTLS_OID_X520_COMMON_NAME, 0, 0, name,
                                           &name_size) == 0);
    assert (strcmp (name, GW_TLS_CA_NAME) == 0);
    unsigned char lo4[4] = {127, 0, 0, 1}, lo6[16] = {[15] = 1};
    assert (gnutls_x509_crt_check_hostname (crt, "localhost"));
    assert (gnutls_x509_crt_check_ip (crt, lo4, 4, 0));
    assert (gnutls_x509_crt_check_ip (crt, lo6, 16, 0));
    free (ca_path);
    free (crt_path);
    *ca_p = ca;
    return crt;
}

void gw_tls_test (bool verbose)
{
    sbx_log_init ("gw_tls_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR + 1);
    char base[] = "/tmp/gw_tls_test.XXXXXX";
    assert (mkdtemp (base));
    char *dir = s_path (base, "tls"); //  not there yet: ensure_ca creates it
    char *cert = NULL, *key = NULL, *ca_path = NULL;

    //  First run: a CA and a server certificate for sbx.test.
    assert (gw_tls_ensure_ca (dir, "sbx.test", &cert, &key, &ca_path) == 0);
    assert (cert && key && ca_path);
    assert (strstr (cert, "/tls/server.crt") && strstr (key, "/tls/server.key") &&
            strstr (ca_path, "/tls/ca.crt"));
    assert (access (cert, R_OK) == 0 && access (key, R_OK) == 0 && access (ca_path, R_OK) == 0);
    struct stat st;
    assert (stat (dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    assert (s_test_mode (dir, "ca.crt") == 0644);
    assert (s_test_mode (dir, "ca.key") == 0600);
    assert (s_test_mode (dir, "server.crt") == 0644);
    assert (s_test_mode (dir, "server.key") == 0600);
    gnutls_x509_crt_t ca, crt = s_test_verified (dir, &ca);
    assert (gnutls_x509_crt_check_hostname (crt, "sbx.test"));
    assert (gnutls_x509_crt_check_hostname (crt, "SBX.test"));
    assert (gnutls_x509_crt_check_hostname (crt, "web-8080.box.sbx.test"));
    assert (!gnutls_x509_crt_check_hostname (crt, "a.b.box.sbx.test"));
    assert (!gnutls_x509_crt_check_hostname (crt, "other.test"));
    time_t life = gnutls_x509_crt_get_expiration_time (crt) - time (NULL);
    assert (life > (GW_TLS_SERVER_DAYS - 1) * GW_TLS_DAY &&
            life <= GW_TLS_SERVER_DAYS * GW_TLS_DAY);
    san_set_t sans, wanted;
    assert (s_sans_of (crt, &sans) == 0);
    s_sans_wanted (&wanted, "sbx.test", NULL);
    assert (sans.count == 5 && s_sans_equal (&sans, &wanted));
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);
    gnutls_datum_t ca1 = s_test_read (dir, "ca.crt");
    gnutls_datum_t cakey1 = s_test_read (dir, "ca.key");
    gnutls_datum_t srv1 = s_test_read (dir, "server.crt");
    free (cert);
    free (key);
    free (ca_path);

    //  Second run: everything reused, byte for byte.
    assert (gw_tls_ensure_ca (dir, "sbx.test", NULL, NULL, NULL) == 0);
    gnutls_datum_t ca2 = s_test_read (dir, "ca.crt");
    gnutls_datum_t srv2 = s_test_read (dir, "server.crt");
    assert (s_test_same (ca1, ca2) && s_test_same (srv1, srv2));
    gnutls_free (ca2.data);
    gnutls_free (srv2.data);

    //  Another hostname: same CA, new server certificate naming it.
    assert (gw_tls_ensure_ca (dir, "other.test", NULL, NULL, NULL) == 0);
    ca2 = s_test_read (dir, "ca.crt");
    srv2 = s_test_read (dir, "server.crt");
    assert (s_test_same (ca1, ca2) && !s_test_same (srv1, srv2));
    crt = s_test_verified (dir, &ca);
    assert (gnutls_x509_crt_check_hostname (crt, "other.test"));
    assert (gnutls_x509_crt_check_hostname (crt, "x-22.box.other.test"));
    assert (!gnutls_x509_crt_check_hostname (crt, "sbx.test"));
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);
    gnutls_free (srv1.data);
    srv1 = srv2;

    //  A certificate 10 days from expiry is replaced, the CA kept.
    assert (s_ensure_locked (dir, "other.test", NULL, 10) == 0);
    srv2 = s_test_read (dir, "server.crt");
    assert (!s_test_same (srv1, srv2));
    gnutls_free (srv1.data);
    srv1 = srv2;
    assert (gw_tls_ensure_ca (dir, "other.test", NULL, NULL, NULL) == 0);
    srv2 = s_test_read (dir, "server.crt");
    assert (!s_test_same (srv1, srv2));
    crt = s_test_verified (dir, &ca);
    assert (gnutls_x509_crt_get_expiration_time (crt) - time (NULL) >
            (GW_TLS_SERVER_DAYS - 1) * GW_TLS_DAY);
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);
    gnutls_free (ca2.data);
    ca2 = s_test_read (dir, "ca.crt");
    assert (s_test_same (ca1, ca2));
    gnutls_free (ca2.data);
    gnutls_free (srv1.data);
    gnutls_free (srv2.data);

    //  An IP address as the hostname: an IP SAN, no wildcard.
    assert (gw_tls_ensure_ca (dir, "192.0.2.10", NULL, NULL, NULL) == 0);
    crt = s_test_verified (dir, &ca);
    unsigned char ip[4] = {192, 0, 2, 10};
    assert (gnutls_x509_crt_check_ip (crt, ip, 4, 0));
    assert (s_sans_of (crt, &sans) == 0 && sans.count == 4);
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);

    //  A box_domain of its own: the wildcard is for it, not for box.<hostname>.
    assert (gw_tls_ensure_ca_box (dir, "sbx.test", "SBX-Box.test", NULL, NULL, NULL) == 0);
    crt = s_test_verified (dir, &ca);
    assert (gnutls_x509_crt_check_hostname (crt, "sbx.test"));
    assert (gnutls_x509_crt_check_hostname (crt, "web-8080.sbx-box.test"));
    assert (!gnutls_x509_crt_check_hostname (crt, "web-8080.box.sbx.test"));
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);
    assert (gw_tls_ensure_ca_box (dir, "sbx.test", "bad box", NULL, NULL, NULL) == -1);

    //  Hostnames that could inject text are refused.
    assert (gw_tls_ensure_ca (dir, "bad host", NULL, NULL, NULL) == -1);
    assert (gw_tls_ensure_ca (dir, "a/b", NULL, NULL, NULL) == -1);
    assert (gw_tls_ensure_ca (dir, "", NULL, NULL, NULL) == -1);
    assert (gw_tls_ensure_ca (dir, NULL, NULL, NULL, NULL) == -1);

    //  A CA whose key is lost is replaced, and the server certificate with it.
    char *ca_key_path = s_path (dir, "ca.key");
    gnutls_datum_t junk = {(unsigned char *) "junk\n", 5};
    assert (s_write_atomic (dir, ca_key_path, &junk, 0600) == 0);
    assert (gw_tls_ensure_ca (dir, "sbx.test", NULL, NULL, NULL) == 0);
    ca2 = s_test_read (dir, "ca.crt");
    gnutls_datum_t cakey2 = s_test_read (dir, "ca.key");
    assert (!s_test_same (ca1, ca2) && !s_test_same (cakey1, cakey2));
    crt = s_test_verified (dir, &ca);
    assert (gnutls_x509_crt_check_hostname (crt, "sbx.test"));
    gnutls_x509_crt_deinit (crt);
    gnutls_x509_crt_deinit (ca);
    gnutls_free (ca1.data);
    gnutls_free (ca2.data);
    gnutls_free (cakey1.data);
    gnutls_free (cakey2.data);
    free (ca_key_path);

    //  No temporary file is left behind.
    const char *names[] = {"ca.crt", "ca.key", "server.crt", "server.key", ".lock"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *path = s_path (dir, names[i]);
        assert (unlink (path) == 0);
        free (path);
    }
    assert (rmdir (dir) == 0); //  fails if anything else is left
    assert (rmdir (base) == 0);
    free (dir);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
