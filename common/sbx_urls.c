/*  sbx_urls - see sbx_urls.h */
#include "sbx_urls.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sbx_urls_tls (sbx_config_t *config)
{
    return strcmp (sbx_config_get (config, "tls", "on"), "off") != 0;
}

//  ":PORT", or "" when the listen port is the scheme's default.
static const char *s_port (sbx_config_t *config, char *buf, size_t size)
{
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
    if (asprintf (&url, "%s://%s%s", sbx_urls_tls (config) ? "https" : "http",
                  sbx_config_get (config, "domain", "localhost"),
                  s_port (config, port, sizeof port)) < 0)
        return NULL;
    return url;
}

char *sbx_urls_box_suffix (sbx_config_t *config)
{
    char port[16], *suffix;
    if (asprintf (&suffix, ".box.%s%s", sbx_config_get (config, "domain", "localhost"),
                  s_port (config, port, sizeof port)) < 0)
        return NULL;
    return suffix;
}

void sbx_urls_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/sbx_urls_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    char *url = sbx_urls_base (config);
    assert (strcmp (url, "https://localhost:8443") == 0);
    free (url);
    sbx_config_set (config, "listen", "0.0.0.0:443");
    sbx_config_set (config, "domain", "sbx.example.com");
    url = sbx_urls_base (config);
    assert (strcmp (url, "https://sbx.example.com") == 0);
    free (url);
    url = sbx_urls_box_suffix (config);
    assert (strcmp (url, ".box.sbx.example.com") == 0);
    free (url);
    sbx_config_set (config, "tls", "off");
    url = sbx_urls_base (config); //  443 is not plain HTTP's default
    assert (strcmp (url, "http://sbx.example.com:443") == 0);
    free (url);
    sbx_config_set (config, "listen", "[::]:80");
    url = sbx_urls_box_suffix (config);
    assert (strcmp (url, ".box.sbx.example.com") == 0);
    free (url);
    sbx_config_destroy (&config);
    char cmd[64];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
