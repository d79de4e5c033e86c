/*  sbx_urls - see sbx_urls.h */
#include "sbx_urls.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sbx_urls_tls (sbx_config_t *config)
{
    return strcmp (sbx_config_get (config, "tls", "on"), "off") != 0;
}

//  The public_url setting taken apart: scheme, lower-case host and ":PORT" ("" for the
//  scheme's default). 0, 1 when it is not set, -1 (with why) when it is not an origin.
typedef struct {
    bool https;
    char host[256];
    char port[8];
} s_public_t;

static int s_public (sbx_config_t *config, s_public_t *out, char *why, size_t why_size)
{
    const char *url = sbx_config_get (config, "public_url", NULL);
    if (!url || !*url)
        return 1;
    memset (out, 0, sizeof *out);
    out->https = strncmp (url, "https://", 8) == 0;
    const char *host = url + (out->https ? 8 : strncmp (url, "http://", 7) == 0 ? 7 : 0);
    size_t len = strcspn (host, ":/");
    const char *rest = host + len;
    bool ok = host != url && len > 0 && len < sizeof out->host;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum ((unsigned char) host[i]) || host[i] == '-' || host[i] == '.';
    unsigned long port = 0;
    if (ok && *rest == ':') {
        char *end;
        port = strtoul (rest + 1, &end, 10);
        ok = end > rest + 1 && end - rest <= 6 && port >= 1 && port <= 65535;
        rest = end;
    }
    ok = ok && (!*rest || strcmp (rest, "/") == 0);
    if (!ok) {
        snprintf (why, why_size,
                  "public_url '%.200s' is not an origin: give https://HOST or https://HOST:PORT "
                  "(no path), as browsers and clients reach this installation",
                  url);
        return -1;
    }
    for (size_t i = 0; i < len; i++)
        out->host[i] = (char) tolower ((unsigned char) host[i]);
    if (port && port != (out->https ? 443u : 80u))
        snprintf (out->port, sizeof out->port, ":%u",
                  (unsigned) (uint16_t) port); //  checked ≤ 65535 above
    return 0;
}

int sbx_urls_check (sbx_config_t *config, char *why, size_t why_size)
{
    s_public_t pub;
    return s_public (config, &pub, why, why_size) < 0 ? -1 : 0;
}

bool sbx_urls_https (sbx_config_t *config)
{
    s_public_t pub;
    char why[300];
    int rc = s_public (config, &pub, why, sizeof why);
    return rc == 0 ? pub.https : sbx_urls_tls (config);
}

//  ":PORT", or "" when the listen port is the scheme's default.
static const char *s_port (sbx_config_t *config, char *buf, size_t size)
{
    s_public_t pub;
    char why[300];
    if (s_public (config, &pub, why, sizeof why) == 0) {
        snprintf (buf, size, "%s", pub.port);
        return buf;
    }
    bool tls = sbx_urls_tls (config);
    const char *listen = sbx_config_get (config, "listen", "127.0.0.1:8443");
    const char *colon = strrchr (listen, ':');
    const char *port = colon ? colon + 1 : "";
    if (!*port || strcmp (port, tls ? "443" : "80") == 0)
        return "";
    snprintf (buf, size, ":%s", port);
    return buf;
}

char *sbx_urls_base (sbx_config_t *config)
{
    char port[16], *url;
    s_public_t pub;
    char why[300];
    int rc = s_public (config, &pub, why, sizeof why);
    if (rc < 0)
        return NULL;
    if (asprintf (&url, "%s://%s%s", sbx_urls_https (config) ? "https" : "http",
                  rc == 0 ? pub.host : sbx_config_get (config, "domain", "localhost"),
                  s_port (config, port, sizeof port)) < 0)
        return NULL;
    return url;
}

char *sbx_urls_box_domain (sbx_config_t *config)
{
    const char *box = sbx_config_get (config, "box_domain", NULL);
    char *domain;
    s_public_t pub;
    char why[300];
    bool public = s_public (config, &pub, why, sizeof why) == 0;
    if (box && *box)
        domain = strdup (box);
    else if (asprintf (&domain, "box.%s",
                       public ? pub.host : sbx_config_get (config, "domain", "localhost")) < 0)
        domain = NULL;
    for (char *p = domain; p && *p; p++)
        *p = (char) tolower ((unsigned char) *p);
    return domain;
}

char *sbx_urls_box_suffix (sbx_config_t *config)
{
    char port[16], *suffix;
    char *domain = sbx_urls_box_domain (config);
    if (!domain || asprintf (&suffix, ".%s%s", domain, s_port (config, port, sizeof port)) < 0)
        suffix = NULL;
    free (domain);
    return suffix;
}

//  True when the host's last label (before one trailing dot) is decimal digits or 0x and
//  hex digits: the WHATWG URL standard then parses the host as an IPv4 address.
static bool s_ends_in_number (const char *host)
{
    size_t len = strlen (host);
    if (len > 0 && host[len - 1] == '.')
        len--;
    size_t start = len;
    while (start > 0 && host[start - 1] != '.')
        start--;
    const char *label = host + start;
    size_t size = len - start;
    if (size == 0)
        return false;
    if (size >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X'))
        return strspn (label + 2, "0123456789abcdefABCDEF") >= size - 2;
    return strspn (label, "0123456789") >= size;
}

int sbx_urls_redirect_check (const char *uri, char *why, size_t why_size)
{
    if (!uri || !*uri) {
        snprintf (why, why_size, "a redirect URI is empty");
        return -1;
    }
    size_t len = strlen (uri);
    if (len > 2000) {
        snprintf (why, why_size, "a redirect URI is longer than 2000 characters");
        return -1;
    }
    for (const char *p = uri; *p; p++)
        if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f) {
            snprintf (why, why_size, "redirect URI %.200s has a space or a non-ASCII character",
                      uri);
            return -1;
        }
    if (strchr (uri, '#')) {
        snprintf (why, why_size, "redirect URI %.200s has a fragment (#...)", uri);
        return -1;
    }
    bool https = strncmp (uri, "https://", 8) == 0;
    bool http = strncmp (uri, "http://", 7) == 0;
    const char *host = uri + (https ? 8 : http ? 7 : 0);
    if (!https && !http) {
        snprintf (why, why_size, "redirect URI %.200s must use https (or http on localhost)", uri);
        return -1;
    }
    //  The authority ends at the path, query or end; userinfo is refused outright.
    size_t host_len = strcspn (host, "/?");
    if (memchr (host, '@', host_len)) {
        snprintf (why, why_size, "redirect URI %.200s has user information (user@)", uri);
        return -1;
    }
    char authority[300];
    if (host_len == 0 || host_len >= sizeof authority) {
        snprintf (why, why_size, "redirect URI %.200s has no host", uri);
        return -1;
    }
    memcpy (authority, host, host_len);
    authority[host_len] = 0;
    //  Drop the port: "[::1]:8080" → "[::1]", "127.0.0.1:80" → "127.0.0.1".
    char *port = authority[0] == '[' ? strchr (authority, ']') : authority;
    port = port ? strchr (port, ':') : NULL;
    if (port) {
        *port++ = 0;
        //  Digits only, or the rest is no port: "http://127.0.0.1:1http://x" is no URL to
        //  a URL parser (libcurl's, a browser's), whatever host we took it for.
        size_t digits = strspn (port, "0123456789");
        if (port[digits] || digits > 5 || strtoul (port, NULL, 10) > 65535) {
            snprintf (why, why_size, "redirect URI %.200s has a port that is not a number", uri);
            return -1;
        }
    }
    if (!authority[0]) {
        snprintf (why, why_size, "redirect URI %.200s has no host", uri);
        return -1;
    }
    //  A host name of letters, digits, '-', '.', '_', '~', or an IPv6 address in brackets:
    //  what URL parsers agree on, so the host we judge is the host the browser goes to.
    size_t host_size = strlen (authority);
    bool host_ok;
    if (authority[0] == '[') {
        char ip[64];
        struct in6_addr addr;
        host_ok = host_size > 2 && host_size - 2 < sizeof ip && authority[host_size - 1] == ']';
        if (host_ok) {
            memcpy (ip, authority + 1, host_size - 2);
            ip[host_size - 2] = 0;
            host_ok = inet_pton (AF_INET6, ip, &addr) == 1;
        }
    } else
        host_ok = strspn (authority,
                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~") ==
                  host_size;
    if (host_ok && authority[0] != '[' && s_ends_in_number (authority)) {
        //  A name whose last label is a number is an IPv4 address to URL parsers, in any
        //  of inet_aton's forms ("8", "0x7f.1", "2130706433" for 127.0.0.1): only the
        //  dotted-quad form is taken, so the host judged and shown is the one reached.
        struct in_addr addr;
        host_ok = inet_pton (AF_INET, authority, &addr) == 1;
    }
    if (!host_ok) {
        snprintf (why, why_size, "redirect URI %.200s has a host that is not a host name", uri);
        return -1;
    }
    if (http && strcmp (authority, "localhost") != 0 && strcmp (authority, "127.0.0.1") != 0 &&
        strcmp (authority, "[::1]") != 0) {
        snprintf (why, why_size,
                  "redirect URI %.200s uses http on a host that is not loopback: use https", uri);
        return -1;
    }
    return 0;
}

//  The self-test's check of one URL function's answer (which it frees).
static void s_expect (char *url, const char *want)
{
    assert (url && strcmp (url, want) == 0);
    free (url);
}

void sbx_urls_test (bool verbose)
{
    char why[300];
    assert (sbx_urls_redirect_check ("https://claude.ai/api/mcp/auth_callback", why, sizeof why) ==
            0);
    assert (sbx_urls_redirect_check ("http://127.0.0.1:33418/callback", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("http://localhost/cb?x=1", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("http://[::1]:9/cb", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("http://example.com/cb", why, sizeof why) == -1);
    assert (strstr (why, "not loopback"));
    assert (sbx_urls_redirect_check ("http://localhost.evil.com/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://a.example/cb#frag", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("javascript:alert(1)", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https:///nohost", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://u@a.example/", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://a.example/a b", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("", why, sizeof why) == -1);
    //  Found by fuzz/fuzz_url: hosts and ports a URL parser reads otherwise.
    assert (sbx_urls_redirect_check ("http://127.0.0.1:334http://back", why, sizeof why) == -1);
    assert (strstr (why, "port"));
    assert (sbx_urls_redirect_check ("http://127.0.0.1:8080/cb", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("https://a.example:/cb", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("https://a.example:65536/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://a%2eexample/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("http://[::1%25eth0]/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://[zz]/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://[2001:db8::1]:443/cb", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("https://8//a", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("http://2130706433/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://0x7f.1/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://203.0.113.7/cb", why, sizeof why) == 0);
    assert (sbx_urls_redirect_check ("https://a.example.0x/cb", why, sizeof why) == -1);
    assert (sbx_urls_redirect_check ("https://v2.example/cb", why, sizeof why) == 0);

    (void) verbose;
    char dir[] = "/tmp/sbx_urls_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    s_expect (sbx_urls_base (config), "https://localhost:8443");
    sbx_config_set (config, "listen", "0.0.0.0:443");
    sbx_config_set (config, "domain", "sbx.example.com");
    s_expect (sbx_urls_base (config), "https://sbx.example.com");
    s_expect (sbx_urls_box_suffix (config), ".box.sbx.example.com");
    sbx_config_set (config, "tls", "off");
    //  443 is not plain HTTP's default.
    s_expect (sbx_urls_base (config), "http://sbx.example.com:443");
    sbx_config_set (config, "listen", "[::]:80");
    s_expect (sbx_urls_box_suffix (config), ".box.sbx.example.com");
    //  A box_domain of its own replaces box.DOMAIN entirely.
    sbx_config_set (config, "box_domain", "SBX-Box.example.net");
    s_expect (sbx_urls_box_domain (config), "sbx-box.example.net");
    sbx_config_set (config, "tls", "on");
    sbx_config_set (config, "listen", "0.0.0.0:8443");
    s_expect (sbx_urls_box_suffix (config), ".sbx-box.example.net:8443");
    s_expect (sbx_urls_base (config), "https://sbx.example.com:8443");
    //  public_url: every gateway behind a balancer names the origin clients see, whatever
    //  its own listen port and TLS.
    sbx_config_set (config, "box_domain", "");
    sbx_config_set (config, "tls", "off");
    sbx_config_set (config, "public_url", "https://SBX.example.com/");
    assert (sbx_urls_check (config, why, sizeof why) == 0 && sbx_urls_https (config));
    s_expect (sbx_urls_base (config), "https://sbx.example.com");
    s_expect (sbx_urls_box_suffix (config), ".box.sbx.example.com");
    sbx_config_set (config, "public_url", "https://edge.example.com:9443");
    s_expect (sbx_urls_base (config), "https://edge.example.com:9443");
    s_expect (sbx_urls_box_suffix (config), ".box.edge.example.com:9443");
    const char *bad[] = {"edge.example.com",        "https://edge.example.com/mcp",
                         "ftp://x.example",         "https://",
                         "https://a b.example",     "https://x.example:0",
                         "https://x.example:65536", "https://x.example:443x",
                         "https://u@x.example"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sbx_config_set (config, "public_url", bad[i]);
        assert (sbx_urls_check (config, why, sizeof why) == -1);
        assert (strstr (why, "not an origin"));
        assert (sbx_urls_base (config) == NULL);
    }
    sbx_config_destroy (&config);
    char cmd[64];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
