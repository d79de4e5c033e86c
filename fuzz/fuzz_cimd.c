/*  fuzz_cimd - libFuzzer harness for client ID metadata documents.

    A client_id that is an https URL is fetched, and the document that comes back
    (anyone's: the URL is the client's choice) is checked by gw_oauth_client_parse
    before its redirect URIs are trusted and its name is shown on the consent page.
    The input is the URL on the first line and the document after it; when the first
    line is not a client_id URL, all of it is the document of
    https://app.example/client.json. Properties: a refusal says why; an accepted
    client has a one-line name of 1 to 100 characters (or its URL's host), and every
    redirect URI it lists passes sbx_urls_redirect_check.
*/
#include "gw_oauth.h"
#include "sbx_urls.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_cimd"
#include "fuzz_check.h"

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_cimd", SBX_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    const char *text = (const char *) data;
    const char *nl = memchr (text, '\n', size);
    char *url = nl ? strndup (text, (size_t) (nl - text)) : NULL;
    const char *body = text;
    size_t body_size = size;
    if (url && gw_oauth_client_url_ok (url)) {
        body = nl + 1;
        body_size = size - (size_t) (nl + 1 - text);
    } else {
        free (url);
        url = strdup ("https://app.example/client.json");
    }
    CHECK (url, "out of memory");
    char why[400] = "";
    gw_oauth_client_t *client = gw_oauth_client_parse (url, body, body_size, why, sizeof why);
    if (!client)
        CHECK (why[0], "refused without a reason");
    else {
        const char *name = gw_oauth_client_name (client);
        CHECK (name && *name, "a client without a name");
        CHECK (!strpbrk (name, "\r\n\t"), "a name of more than one line");
        //  What it accepted is what it read: the same document, through jansson again.
        json_t *doc = json_loadb (body, body_size, 0, NULL);
        CHECK (json_is_object (doc), "accepted something else than an object");
        json_t *given = json_object_get (doc, "client_name");
        if (given)
            CHECK (strcmp (json_string_value (given), name) == 0 && strlen (name) <= 100,
                   "a name other than the document's");
        json_t *uris = json_object_get (doc, "redirect_uris");
        size_t i;
        json_t *uri;
        json_array_foreach (uris, i, uri)
        {
            CHECK (sbx_urls_redirect_check (json_string_value (uri), why, sizeof why) == 0,
                   "accepted a redirect URI that the check refuses");
        }
        json_decref (doc);
        gw_oauth_client_destroy (&client);
    }
    free (url);
    return 0;
}
