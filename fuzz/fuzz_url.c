/*  fuzz_url - libFuzzer harness for the OAuth URL checks.

    A client registers redirect URIs (/oauth/register, or its client ID metadata
    document): sbx_urls_redirect_check decides which may receive authorization codes.
    A client_id that is an https URL is fetched: gw_oauth_client_url_ok decides which
    are. The input is one URL (up to a NUL byte). Besides never crashing, the checks
    must agree with a real URL parser (libcurl's, which fetches the documents): an
    accepted http redirect URI names a loopback host as libcurl reads it, an accepted
    URI parses, and an accepted client_id is https with the host it appears to have.
*/
#include "gw_oauth.h"
#include "sbx_urls.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CHECK(cond, what, url)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf (stderr, "fuzz_url: %s: %s: %s\n", #cond, what, url);                          \
            abort ();                                                                              \
        }                                                                                          \
    } while (0)

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_url", SBX_LOG_ERROR);
    return 0;
}

//  What libcurl makes of url: 0 with scheme and host (fresh), or -1.
static int s_curl_parse (const char *url, char **scheme, char **host)
{
    CURLU *h = curl_url ();
    *scheme = *host = NULL;
    int rc = h && curl_url_set (h, CURLUPART_URL, url, 0) == CURLUE_OK &&
                     curl_url_get (h, CURLUPART_SCHEME, scheme, 0) == CURLUE_OK &&
                     curl_url_get (h, CURLUPART_HOST, host, 0) == CURLUE_OK
                 ? 0
                 : -1;
    curl_url_cleanup (h);
    if (rc) {
        curl_free (*scheme);
        curl_free (*host);
        *scheme = *host = NULL;
    }
    return rc;
}

//  The same host: names case-insensitively, IPv6 addresses as addresses (libcurl
//  writes [::0] as [::]).
static bool s_same_host (const char *a, const char *b)
{
    if (a[0] != '[' || b[0] != '[')
        return strcasecmp (a, b) == 0;
    char ip_a[64], ip_b[64];
    struct in6_addr addr_a, addr_b;
    snprintf (ip_a, sizeof ip_a, "%.*s", (int) strcspn (a + 1, "]"), a + 1);
    snprintf (ip_b, sizeof ip_b, "%.*s", (int) strcspn (b + 1, "]"), b + 1);
    return inet_pton (AF_INET6, ip_a, &addr_a) == 1 && inet_pton (AF_INET6, ip_b, &addr_b) == 1 &&
           memcmp (&addr_a, &addr_b, sizeof addr_a) == 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    char *url = strndup ((const char *) data, size);
    CHECK (url, "out of memory", "");
    char why[400] = "";
    char *scheme, *host;
    if (sbx_urls_redirect_check (url, why, sizeof why) != 0)
        CHECK (why[0], "refused without a reason", url);
    else {
        CHECK (strlen (url) <= 2000 && !strchr (url, '#'), "over the limits", url);
        CHECK (s_curl_parse (url, &scheme, &host) == 0, "accepted, but it is no URL", url);
        CHECK (strcasecmp (scheme, "https") == 0 || strcasecmp (scheme, "http") == 0,
               "accepted another scheme", url);
        if (strcasecmp (scheme, "http") == 0)
            CHECK (strcasecmp (host, "localhost") == 0 || strcmp (host, "127.0.0.1") == 0 ||
                       strcmp (host, "[::1]") == 0,
                   "accepted http on a host that is not loopback", url);
        curl_free (scheme);
        curl_free (host);
    }
    if (gw_oauth_client_url_ok (url)) {
        CHECK (s_curl_parse (url, &scheme, &host) == 0, "a client_id that is no URL", url);
        CHECK (strcasecmp (scheme, "https") == 0, "a client_id that is not https", url);
        //  The consent page names a client without client_name by its URL's host.
        json_t *doc =
            json_pack ("{s:s, s:[s]}", "client_id", url, "redirect_uris", "https://app.example/cb");
        char *body = json_dumps (doc, JSON_COMPACT);
        gw_oauth_client_t *client =
            gw_oauth_client_parse (url, body, strlen (body), why, sizeof why);
        CHECK (client, why, url);
        CHECK (s_same_host (gw_oauth_client_name (client), host),
               "the consent page would name another host than the one fetched", url);
        gw_oauth_client_destroy (&client);
        free (body);
        json_decref (doc);
        curl_free (scheme);
        curl_free (host);
    }
    free (url);
    return 0;
}
