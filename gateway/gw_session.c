/*  gw_session - see gw_session.h */
#include "gw_session.h"
#include "sbx_clock.h"
#include "sbx_secret.h"
#include "sbx_urls.h"

#include <assert.h>
#include <fcntl.h>
#include <sys/stat.h>

#define S_SESSION_MS (12ULL * 3600 * 1000)

//  __Host- cookies: the browser keeps them only when set Secure, Path=/ and without
//  Domain, so no other host (a sandbox's port URL on our domain least of all) can set,
//  replace or shadow them.
#define S_SESSION_COOKIE "__Host-sbx_session"
#define S_CSRF_COOKIE    "__Host-sbx_csrf"

struct gw_session_t {
    char *secret;
    char *origin;     //  ours, as browsers send it: "https://DOMAIN[:PORT]"
    char *tls_origin; //  with tls = off: "https://DOMAIN" too (a TLS proxy in front)
};

//  Reads DIR/gateway/secret, or makes it (O_EXCL: two gateways starting together agree
//  on the first one's).
static char *s_load_secret (sbx_config_t *config)
{
    char *dir = config ? sbx_config_path (config, "gateway") : NULL;
    if (!dir)
        return sbx_secret_token ("", 43); //  self-tests: a secret for this process only
    mkdir (dir, 0700);
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/secret", dir);
    free (dir);
    char *secret = sbx_secret_token ("", 43);
    int fd = secret ? open (path, O_WRONLY | O_CREAT | O_EXCL, 0600) : -1;
    if (fd >= 0) {
        bool ok = write (fd, secret, 43) == 43;
        close (fd);
        if (ok)
            return secret;
        unlink (path);
    }
    free (secret);
    secret = NULL;
    FILE *file = fopen (path, "r");
    char text[128] = "";
    if (file) {
        if (fgets (text, sizeof text, file))
            text[strcspn (text, "\r\n")] = 0;
        fclose (file);
    }
    if (strlen (text) >= 32)
        secret = strdup (text);
    else
        sbx_error ("cannot read or make the session secret %s", path);
    return secret;
}

gw_session_t *gw_session_new (sbx_config_t *config)
{
    gw_session_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->secret = s_load_secret (config);
    self->origin = config ? sbx_urls_base (config) : strdup ("https://localhost:8443");
    if (config && !sbx_urls_tls (config) && !sbx_config_get (config, "public_url", NULL) &&
        asprintf (&self->tls_origin, "https://%s", sbx_config_get (config, "domain", "localhost")) <
            0)
        self->tls_origin = NULL;
    if (!self->secret || !self->origin)
        gw_session_destroy (&self);
    return self;
}

void gw_session_destroy (gw_session_t **self_p)
{
    assert (self_p);
    gw_session_t *self = *self_p;
    if (!self)
        return;
    if (self->secret)
        sbx_secret_wipe (self->secret);
    free (self->secret);
    free (self->origin);
    free (self->tls_origin);
    free (self);
    *self_p = NULL;
}

static int s_hex (char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

//  Decodes size bytes of form-encoded text (+ is a space) into a fresh string, or NULL.
static char *s_decode (const char *text, size_t size)
{
    char *out = malloc (size + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < size; i++) {
        if (text[i] == '+')
            *o++ = ' ';
        else if (text[i] == '%') {
            if (i + 2 >= size) {
                free (out);
                return NULL;
            }
            int h = s_hex (text[i + 1]), l = s_hex (text[i + 2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0)) {
                free (out);
                return NULL;
            }
            *o++ = (char) (h * 16 + l);
            i += 2;
        } else
            *o++ = text[i];
    }
    *o = 0;
    return out;
}

zhashx_t *gw_session_form (const char *text)
{
    zhashx_t *form = zhashx_new ();
    if (!form || !text)
        return form;
    zhashx_set_destructor (form, (zhashx_destructor_fn *) zstr_free);
    const char *p = text;
    while (*p) {
        size_t len = strcspn (p, "&");
        const char *eq = memchr (p, '=', len);
        size_t name_len = eq ? (size_t) (eq - p) : len;
        char *name = s_decode (p, name_len);
        char *value = eq ? s_decode (eq + 1, len - name_len - 1) : strdup ("");
        if (!name || !value) {
            free (name);
            free (value);
            zhashx_destroy (&form);
            return NULL;
        }
        if (*name && !zhashx_lookup (form, name))
            zhashx_insert (form, name, value); //  the hash owns value now
        else
            free (value);
        free (name);
        p += len;
        if (*p == '&')
            p++;
    }
    return form;
}

char *gw_session_cookie (gw_request_t *req, const char *name)
{
    const char *header = gw_request_header (req, "Cookie");
    size_t name_len = strlen (name);
    for (const char *p = header; p && *p;) {
        while (*p == ' ' || *p == ';')
            p++;
        size_t len = strcspn (p, ";");
        if (len > name_len && strncmp (p, name, name_len) == 0 && p[name_len] == '=')
            return strndup (p + name_len + 1, len - name_len - 1);
        p += len;
    }
    return NULL;
}

//  Always Secure, as __Host- requires: with tls = off the browser is in front of a TLS
//  proxy (docs/operations.md), and browsers take Secure cookies from http://localhost.
static void s_set_cookie (gw_request_t *req, const char *name, const char *value,
                          uint64_t max_age_s)
{
    char header[1024];
    snprintf (header, sizeof header, "%s=%s; Path=/; Max-Age=%llu; HttpOnly; SameSite=Lax; Secure",
              name, value, (unsigned long long) max_age_s);
    gw_request_add_header (req, "Set-Cookie", header);
}

int gw_session_account (gw_session_t *self, gw_request_t *req, char **account_id, char **email)
{
    *account_id = *email = NULL;
    char *cookie = gw_session_cookie (req, S_SESSION_COOKIE);
    if (!cookie)
        return -1;
    //  ACCOUNT.EXPIRY.EMAIL64.MAC, the MAC over "session:" and the first three parts.
    int rc = -1;
    char *mac = strrchr (cookie, '.');
    if (mac) {
        *mac++ = 0;
        char signed_part[1100];
        snprintf (signed_part, sizeof signed_part, "session:%s", cookie);
        char *expiry = strchr (cookie, '.');
        char *email64 = expiry ? strchr (expiry + 1, '.') : NULL;
        if (email64 && sbx_secret_mac_verify (self->secret, signed_part, mac)) {
            *expiry++ = 0;
            *email64++ = 0;
            //  base64url back to standard base64 with padding, for the decoder.
            char b64[400];
            size_t n = strlen (email64);
            if (n + 4 < sizeof b64 && strtoull (expiry, NULL, 10) > sbx_clock_now_ms ()) {
                for (size_t i = 0; i < n; i++)
                    b64[i] = email64[i] == '-' ? '+' : email64[i] == '_' ? '/' : email64[i];
                while (n % 4)
                    b64[n++] = '=';
                b64[n] = 0;
                size_t size;
                uint8_t *decoded = sbx_secret_base64_decode (b64, &size);
                if (decoded) {
                    *account_id = strdup (cookie);
                    *email = (char *) decoded;
                    rc = *account_id ? 0 : -1;
                }
            }
        }
    }
    free (cookie);
    if (rc) {
        free (*account_id);
        free (*email);
        *account_id = *email = NULL;
    }
    return rc;
}

void gw_session_sign_in (gw_session_t *self, gw_request_t *req, const char *account_id,
                         const char *email)
{
    if (!account_id) {
        s_set_cookie (req, S_SESSION_COOKIE, "x", 0);
        return;
    }
    char *email64 = sbx_secret_base64url ((const uint8_t *) email, strlen (email));
    char value[700], signed_part[720], mac[44];
    snprintf (value, sizeof value, "%s.%llu.%s", account_id,
              (unsigned long long) (sbx_clock_now_ms () + S_SESSION_MS), email64 ? email64 : "");
    snprintf (signed_part, sizeof signed_part, "session:%s", value);
    sbx_secret_mac (self->secret, signed_part, mac);
    char cookie[800];
    snprintf (cookie, sizeof cookie, "%s.%s", value, mac);
    s_set_cookie (req, S_SESSION_COOKIE, cookie, S_SESSION_MS / 1000);
    free (email64);
}

//  The token: MAC("csrf:" + the browser's cookie + ":" + whom the form is for), so it
//  is only good in this browser and only for this person (or for the sign-in form).
static void s_csrf_message (const char *cookie, const char *account_id, char *message, size_t size)
{
    snprintf (message, size, "csrf:%s:%s", cookie, account_id ? account_id : "-signin-");
}

char *gw_session_csrf (gw_session_t *self, gw_request_t *req, const char *account_id)
{
    char *cookie = gw_session_cookie (req, S_CSRF_COOKIE);
    if (!cookie || strlen (cookie) != 32) {
        free (cookie);
        cookie = sbx_secret_token ("", 32);
        if (!cookie)
            return NULL;
        s_set_cookie (req, S_CSRF_COOKIE, cookie, 7 * 86400);
    }
    char message[400], mac[44];
    s_csrf_message (cookie, account_id, message, sizeof message);
    sbx_secret_mac (self->secret, message, mac);
    free (cookie);
    return strdup (mac);
}

static bool s_csrf_valid (gw_session_t *self, const char *cookie, const char *account_id,
                          const char *token)
{
    if (!cookie || !token || strlen (cookie) != 32)
        return false;
    char message[400];
    s_csrf_message (cookie, account_id, message, sizeof message);
    return sbx_secret_mac_verify (self->secret, message, token);
}

bool gw_session_csrf_ok (gw_session_t *self, gw_request_t *req, const char *account_id,
                         const char *token)
{
    char *cookie = gw_session_cookie (req, S_CSRF_COOKIE);
    bool ok = s_csrf_valid (self, cookie, account_id, token);
    free (cookie);
    return ok;
}

//  Origin as the browser serialises it ("scheme://host[:port]") against one of ours:
//  scheme and host are case-insensitive.
static bool s_origin_is (const char *origin, const char *ours)
{
    return ours && strcasecmp (origin, ours) == 0;
}

static bool s_origin_check (gw_session_t *self, const char *origin, const char *site, char *why,
                            size_t why_size)
{
    if (origin) {
        if (s_origin_is (origin, self->origin) || s_origin_is (origin, self->tls_origin))
            return true;
        snprintf (why, why_size, "it was sent from %.200s, not from %s", origin, self->origin);
        return false;
    }
    //  No Origin: a browser that sends Fetch Metadata still says where it came from; a
    //  client that sends neither is no browser, and has no cookies of a victim to ride on.
    if (!site || streq (site, "same-origin") || streq (site, "none"))
        return true;
    snprintf (why, why_size, "it was sent from a %.40s page, not from %s", site, self->origin);
    return false;
}

bool gw_session_origin_ok (gw_session_t *self, gw_request_t *req, char *why, size_t why_size)
{
    return s_origin_check (self, gw_request_header (req, "Origin"),
                           gw_request_header (req, "Sec-Fetch-Site"), why, why_size);
}

#define S_OWNER_MS (3600ULL * 1000)

static void s_owner_message (const char *label, const char *account_id, uint64_t expiry,
                             char *message, size_t size)
{
    snprintf (message, size, "owner:%s:%s.%llu", label, account_id, (unsigned long long) expiry);
}

static char *s_owner_token (gw_session_t *self, const char *label, const char *account_id,
                            uint64_t expiry)
{
    if (!label || !account_id || strchr (account_id, '.') || strlen (account_id) > 64 ||
        strlen (label) > 100)
        return NULL;
    char message[300], mac[44], *token;
    s_owner_message (label, account_id, expiry, message, sizeof message);
    sbx_secret_mac (self->secret, message, mac);
    if (asprintf (&token, "%s.%llu.%s", account_id, (unsigned long long) expiry, mac) < 0)
        return NULL;
    return token;
}

char *gw_session_owner_token (gw_session_t *self, const char *label, const char *account_id)
{
    return s_owner_token (self, label, account_id, sbx_clock_now_ms () + S_OWNER_MS);
}

char *gw_session_owner_check (gw_session_t *self, const char *label, const char *token)
{
    if (!label || !token || strlen (token) > 200 || strlen (label) > 100)
        return NULL;
    char copy[201];
    snprintf (copy, sizeof copy, "%s", token);
    char *expiry = strchr (copy, '.');
    char *mac = expiry ? strchr (expiry + 1, '.') : NULL;
    if (!mac)
        return NULL;
    *expiry++ = 0;
    *mac++ = 0;
    char *end = NULL;
    unsigned long long ms = strtoull (expiry, &end, 10);
    if (!*expiry || *end || ms <= sbx_clock_now_ms ())
        return NULL;
    char message[300];
    s_owner_message (label, copy, ms, message, sizeof message);
    return sbx_secret_mac_verify (self->secret, message, mac) ? strdup (copy) : NULL;
}

void gw_session_test (bool verbose)
{
    (void) verbose;
    zhashx_t *form = gw_session_form ("a=1&b=x+y%21&a=2&flag&c=%E2%82%AC&=skip");
    assert (form);
    assert (streq (zhashx_lookup (form, "a"), "1"));
    assert (streq (zhashx_lookup (form, "b"), "x y!"));
    assert (streq (zhashx_lookup (form, "flag"), ""));
    assert (streq (zhashx_lookup (form, "c"), "\xe2\x82\xac"));
    zhashx_destroy (&form);
    assert (gw_session_form ("a=%zz") == NULL);
    assert (gw_session_form ("a=%4") == NULL);
    assert (gw_session_form ("a=%00") == NULL);
    form = gw_session_form ("");
    assert (form && zhashx_size (form) == 0);
    zhashx_destroy (&form);
    gw_session_t *session = gw_session_new (NULL);
    assert (session);

    //  A token is good for its cookie and its person only: one minted for another
    //  browser's cookie, for another account, or for the sign-in form fails.
    const char *cookie = "0123456789abcdef0123456789abcdef";
    char message[400], token[44], signin[44];
    s_csrf_message (cookie, "acc_alice", message, sizeof message);
    sbx_secret_mac (session->secret, message, token);
    s_csrf_message (cookie, NULL, message, sizeof message);
    sbx_secret_mac (session->secret, message, signin);
    assert (s_csrf_valid (session, cookie, "acc_alice", token));
    assert (!s_csrf_valid (session, cookie, "acc_mallory", token));
    assert (!s_csrf_valid (session, cookie, NULL, token));
    assert (s_csrf_valid (session, cookie, NULL, signin));
    assert (!s_csrf_valid (session, cookie, "acc_alice", signin));
    assert (!s_csrf_valid (session, "fedcba9876543210fedcba9876543210", "acc_alice", token));
    assert (!s_csrf_valid (session, "short", "acc_alice", token));
    assert (!s_csrf_valid (session, cookie, "acc_alice", NULL));
    assert (!s_csrf_valid (session, cookie, "acc_alice", ""));

    //  Origin: ours only; null and sandbox hosts are foreign; no Origin falls back to
    //  Sec-Fetch-Site; neither is a client that is not a browser.
    char why[300];
    assert (s_origin_check (session, "https://localhost:8443", NULL, why, sizeof why));
    assert (s_origin_check (session, "HTTPS://LocalHost:8443", "same-origin", why, sizeof why));
    assert (!s_origin_check (session, "null", NULL, why, sizeof why));
    assert (strstr (why, "sent from null"));
    assert (!s_origin_check (session, "https://calm-otter-8000.box.localhost:8443", "same-site",
                             why, sizeof why));
    assert (!s_origin_check (session, "https://localhost:8444", NULL, why, sizeof why));
    assert (!s_origin_check (session, "http://localhost:8443", NULL, why, sizeof why));
    assert (
        !s_origin_check (session, "https://localhost:8443.evil.example", NULL, why, sizeof why));
    assert (!s_origin_check (session, "", NULL, why, sizeof why));
    assert (s_origin_check (session, NULL, "same-origin", why, sizeof why));
    assert (s_origin_check (session, NULL, "none", why, sizeof why));
    assert (!s_origin_check (session, NULL, "same-site", why, sizeof why));
    assert (strstr (why, "same-site page"));
    assert (!s_origin_check (session, NULL, "cross-site", why, sizeof why));
    assert (s_origin_check (session, NULL, NULL, why, sizeof why));

    //  Owner links: for their label, their account, while good; nothing else passes.
    char *owner = gw_session_owner_token (session, "calm-otter", "acc_alice");
    assert (owner && strncmp (owner, "acc_alice.", 10) == 0);
    char *who = gw_session_owner_check (session, "calm-otter", owner);
    assert (who && streq (who, "acc_alice"));
    free (who);
    assert (!gw_session_owner_check (session, "brave-jay", owner));
    char forged[300];
    snprintf (forged, sizeof forged, "acc_bob%s", owner + 9);
    assert (!gw_session_owner_check (session, "calm-otter", forged));
    free (owner);
    owner = s_owner_token (session, "calm-otter", "acc_alice", sbx_clock_now_ms () - 1);
    assert (owner && !gw_session_owner_check (session, "calm-otter", owner));
    free (owner);
    assert (!gw_session_owner_check (session, "calm-otter", "acc_alice.x.y"));
    assert (!gw_session_owner_check (session, "calm-otter", "garbage"));
    assert (!gw_session_owner_token (session, "calm-otter", "acc.dot"));
    gw_session_destroy (&session);
    gw_session_destroy (&session);
}
