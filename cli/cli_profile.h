/*  cli_profile - where the CLI reaches a remote sbx: the profile `sbx login` saved, and
    the environment (SBX_URL, SBX_API_KEY, SBX_CA_CERT) over it, field by field.

    The profile is one JSON file, profile.json, in the user's config directory
    ($SBX_CONFIG_DIR, else $XDG_CONFIG_HOME/sbx, else ~/.config/sbx): {"url", "apiKey",
    "caCert"}, mode 0600 in a 0700 directory, as it holds the key. A CA given to login
    is copied beside it (ca.crt), so the profile keeps working when the original moves.
*/
#ifndef CLI_PROFILE_H_INCLUDED
#define CLI_PROFILE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *url;     //  the service's base URL: https://HOST[:PORT], no trailing slash
    char *api_key; //  sbx_…
    char *ca_cert; //  a PEM file to trust instead of the system's CAs, or NULL
    char *from;    //  where it came from, for messages ("SBX_URL", or the file's path)
} cli_profile_t;

//  The config directory (fresh), or NULL when there is no HOME to put it in.
char *cli_profile_dir (void);

//  The profile in use: the environment over the saved file. NULL with why "" when
//  neither names a service (the CLI works on the local installation then), or NULL with
//  why saying what is wrong (an unreadable file, a bad URL, a missing key).
cli_profile_t *cli_profile_load (char *why, size_t why_size);
void cli_profile_destroy (cli_profile_t **self_p);

//  Saves url (checked: https:// or http://, its /mcp or trailing slash dropped), key and,
//  when ca_cert is given, a copy of that file. 0, or -1 with why.
int cli_profile_save (const char *url, const char *api_key, const char *ca_cert, char *why,
                      size_t why_size);

//  Removes the saved profile and its CA copy. 0 (also when there was none), or -1 with why.
int cli_profile_remove (char *why, size_t why_size);

//  The base URL from text (https://HOST[:PORT], optionally with /mcp or a trailing
//  slash), fresh; NULL with why. what names the setting in the message ("SBX_URL").
char *cli_profile_url (const char *text, const char *what, char *why, size_t why_size);

//  Checks that key looks like an sbx API key (never repeating it). 0, or -1 with why.
int cli_profile_key_check (const char *key, const char *what, char *why, size_t why_size);

void cli_profile_test (bool verbose);

#endif
