/*  fuzz_form - libFuzzer harness for the form parser (gw_session_form).

    /oauth/authorize takes its parameters from the query string or the POST body,
    /oauth/token and /oauth/revoke from the body, and the sign-in and account pages their
    forms, all through gw_session_form; the text is the client's. The input is that text
    (up to a NUL byte, as the body reaches the parser). Properties: every name is
    non-empty, every value a string, and the parse is faithful: the pairs written back
    in form encoding parse to the same pairs.
*/
#include "gw_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_form"
#include "fuzz_check.h"

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_form", SBX_LOG_ERROR);
    return 0;
}

//  Form encoding, every byte but [A-Za-z0-9] escaped.
static void s_encode (zchunk_t *out, const char *text)
{
    for (const unsigned char *c = (const unsigned char *) text; *c; c++) {
        char hex[4];
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))
            zchunk_extend (out, c, 1);
        else {
            snprintf (hex, sizeof hex, "%%%02X", *c);
            zchunk_extend (out, hex, 3);
        }
    }
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    char *text = strndup ((const char *) data, size);
    CHECK (text, "out of memory");
    zhashx_t *form = gw_session_form (text);
    free (text);
    if (!form)
        return 0;
    zchunk_t *again = zchunk_new (NULL, 0);
    for (const char *value = zhashx_first (form); value; value = zhashx_next (form)) {
        const char *name = zhashx_cursor (form);
        CHECK (name && *name, "an empty name");
        if (zchunk_size (again))
            zchunk_extend (again, "&", 1);
        s_encode (again, name);
        zchunk_extend (again, "=", 1);
        s_encode (again, value);
    }
    zchunk_extend (again, "", 1);
    zhashx_t *copy = gw_session_form ((const char *) zchunk_data (again));
    CHECK (copy, "its own encoding is refused");
    CHECK (zhashx_size (copy) == zhashx_size (form), "a pair lost or added");
    for (const char *value = zhashx_first (form); value; value = zhashx_next (form)) {
        const char *other = zhashx_lookup (copy, zhashx_cursor (form));
        CHECK (other && strcmp (other, value) == 0, "a value changed");
    }
    zhashx_destroy (&copy);
    zhashx_destroy (&form);
    zchunk_destroy (&again);
    return 0;
}
