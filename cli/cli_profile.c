/*  cli_profile - see cli_profile.h */
#include "cli_profile.h"
#include "sbx_common.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_CA (1024 * 1024) //  a CA bundle larger than this is not one

char *cli_profile_dir (void)
{
    const char *dir = getenv ("SBX_CONFIG_DIR");
    if (dir && *dir)
        return strdup (dir);
    const char *xdg = getenv ("XDG_CONFIG_HOME");
    if (xdg && *xdg == '/')
        return zsys_sprintf ("%s/sbx", xdg);
    const char *home = getenv ("HOME");
    if (home && *home == '/')
        return zsys_sprintf ("%s/.config/sbx", home);
    return NULL;
}

char *cli_profile_url (const char *text, const char *what, char *why, size_t why_size)
{
    size_t n = text ? strlen (text) : 0;
    while (n && text[n - 1] == '/')
        n--;
    if (n >= 4 && strncmp (text + n - 4, "/mcp", 4) == 0)
        n -= 4; //  the /mcp URL a client was given works too
    while (n && text[n - 1] == '/')
        n--;
    const char *host = !text                                ? NULL
                       : strncmp (text, "https://", 8) == 0 ? text + 8
                       : strncmp (text, "http://", 7) == 0  ? text + 7
                                                            : NULL;
    bool clean = true;
    for (size_t i = 0; i < n; i++)
        clean = clean && (unsigned char) text[i] > 0x20 && text[i] != 0x7f;
    if (!host || !clean || host >= text + n || *host == '/' || n > 2048) {
        snprintf (why, why_size,
                  "%s must be the sbx service's URL, https://HOST[:PORT] or "
                  "https://HOST[:PORT]/mcp (got \"%.200s\")",
                  what, text ? text : "");
        return NULL;
    }
    return strndup (text, n);
}

int cli_profile_key_check (const char *key, const char *what, char *why, size_t why_size)
{
    if (!key || !*key) {
        snprintf (why, why_size,
                  "%s is not set: give an API key of your account on the service (sbx_…; "
                  "`sbx key create --account EMAIL` on its host makes one)",
                  what);
        return -1;
    }
    bool clean = strlen (key) <= 512;
    for (const char *p = key; *p; p++)
        clean = clean && (unsigned char) *p > 0x20 && *p != 0x7f;
    if (strncmp (key, "sbx_", 4) != 0 || !clean) {
        //  The key itself is not repeated: stderr may end up in a client's logs.
        snprintf (why, why_size,
                  "%s must be an sbx API key: sbx_… as `sbx key create` printed it, "
                  "without quotes, spaces or \"Bearer\"",
                  what);
        return -1;
    }
    return 0;
}

void cli_profile_destroy (cli_profile_t **self_p)
{
    cli_profile_t *self = *self_p;
    if (self) {
        free (self->url);
        if (self->api_key)
            memset (self->api_key, 0, strlen (self->api_key));
        free (self->api_key);
        free (self->ca_cert);
        free (self->from);
        free (self);
        *self_p = NULL;
    }
}

static const char *s_env (const char *name)
{
    const char *value = getenv (name);
    return value && *value ? value : NULL;
}

cli_profile_t *cli_profile_load (char *why, size_t why_size)
{
    *why = 0;
    const char *env_url = s_env ("SBX_URL"), *env_key = s_env ("SBX_API_KEY");
    const char *env_ca = s_env ("SBX_CA_CERT");
    char *dir = cli_profile_dir ();
    char *path = dir ? zsys_sprintf ("%s/profile.json", dir) : NULL;
    free (dir);
    json_t *saved = NULL;
    if (path && access (path, F_OK) == 0) {
        json_error_t error;
        saved = json_load_file (path, 0, &error);
        if (!json_is_object (saved)) {
            snprintf (why, why_size,
                      "the profile %s cannot be read (%s): run `sbx login URL` again", path,
                      error.text);
            json_decref (saved);
            free (path);
            return NULL;
        }
    }
    if (!env_url && !saved) {
        free (path); //  no service named: the local installation
        return NULL;
    }
    const char *url_text = env_url ? env_url : json_string_value (json_object_get (saved, "url"));
    const char *key = env_key ? env_key : json_string_value (json_object_get (saved, "apiKey"));
    const char *ca = env_ca ? env_ca : json_string_value (json_object_get (saved, "caCert"));
    cli_profile_t *self = calloc (1, sizeof *self);
    self->from = strdup (env_url ? "SBX_URL" : path);
    self->url =
        cli_profile_url (url_text, env_url ? "SBX_URL" : "the profile's url", why, why_size);
    if (self->url &&
        cli_profile_key_check (key, env_key || !saved ? "SBX_API_KEY" : "the profile's apiKey", why,
                               why_size) == 0) {
        self->api_key = strdup (key);
        if (ca && access (ca, R_OK) != 0)
            snprintf (why, why_size, "%s names %s, which cannot be read: %s",
                      env_ca ? "SBX_CA_CERT" : "the profile's caCert", ca, strerror (errno));
        else if (ca)
            self->ca_cert = strdup (ca);
    }
    json_decref (saved);
    free (path);
    if (*why)
        cli_profile_destroy (&self);
    return self;
}

//  Writes data to path through a temporary file and a rename, with mode. 0 or -1 (why).
static int s_write_file (const char *path, const char *data, size_t size, mode_t mode, char *why,
                         size_t why_size)
{
    char *tmp = zsys_sprintf ("%s.tmp", path);
    int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    bool ok = fd >= 0 && write (fd, data, size) == (ssize_t) size && fsync (fd) == 0;
    if (fd >= 0)
        close (fd);
    ok = ok && chmod (tmp, mode) == 0 && rename (tmp, path) == 0;
    if (!ok) {
        snprintf (why, why_size, "cannot write %s: %s", path, strerror (errno));
        unlink (tmp);
    }
    free (tmp);
    return ok ? 0 : -1;
}

int cli_profile_save (const char *url_text, const char *api_key, const char *ca_cert, char *why,
                      size_t why_size)
{
    char *url = cli_profile_url (url_text, "the URL", why, why_size);
    if (!url || cli_profile_key_check (api_key, "the API key", why, why_size)) {
        free (url);
        return -1;
    }
    char *dir = cli_profile_dir ();
    if (!dir) {
        snprintf (why, why_size, "no config directory: set HOME (or SBX_CONFIG_DIR)");
        free (url);
        return -1;
    }
    int rc = -1;
    char *ca_copy = NULL, *path = zsys_sprintf ("%s/profile.json", dir);
    char *pem = NULL;
    if (zsys_dir_create ("%s", dir) != 0 || chmod (dir, 0700) != 0) {
        snprintf (why, why_size, "cannot make %s: %s", dir, strerror (errno));
        goto done;
    }
    if (ca_cert) {
        //  A copy: the profile must not depend on where the file was when login ran.
        FILE *in = fopen (ca_cert, "rb");
        pem = in ? calloc (1, S_MAX_CA + 1) : NULL;
        size_t n = pem ? fread (pem, 1, S_MAX_CA + 1, in) : 0;
        if (in)
            fclose (in);
        if (!pem || n == 0 || n > S_MAX_CA || !strstr (pem, "-----BEGIN CERTIFICATE-----")) {
            snprintf (why, why_size, "%s is not a PEM certificate file%s%s", ca_cert,
                      in ? "" : ": ", in ? "" : strerror (errno));
            goto done;
        }
        ca_copy = zsys_sprintf ("%s/ca.crt", dir);
        if (s_write_file (ca_copy, pem, n, 0644, why, why_size))
            goto done;
    }
    json_t *profile =
        json_pack ("{s:s, s:s, s:s?}", "url", url, "apiKey", api_key, "caCert", ca_copy);
    char *text = json_dumps (profile, JSON_INDENT (2) | JSON_PRESERVE_ORDER);
    json_decref (profile);
    rc = text ? s_write_file (path, text, strlen (text), 0600, why, why_size) : -1;
    if (text)
        memset (text, 0, strlen (text));
    free (text);
    if (rc == 0 && !ca_cert)
        unlink (ca_copy = zsys_sprintf ("%s/ca.crt", dir)); //  an old one no longer applies
done:
    free (pem);
    free (ca_copy);
    free (path);
    free (dir);
    free (url);
    return rc;
}

int cli_profile_remove (char *why, size_t why_size)
{
    char *dir = cli_profile_dir ();
    if (!dir)
        return 0;
    int rc = 0;
    const char *names[] = {"profile.json", "ca.crt"};
    for (size_t i = 0; i < 2; i++) {
        char *path = zsys_sprintf ("%s/%s", dir, names[i]);
        if (unlink (path) != 0 && errno != ENOENT) {
            snprintf (why, why_size, "cannot remove %s: %s", path, strerror (errno));
            rc = -1;
        }
        free (path);
    }
    free (dir);
    return rc;
}

//  --------------------------------------------------------------------------
//  Self test

void cli_profile_test (bool verbose)
{
    (void) verbose;
    char why[1024];
    const char *cases[][2] = {{"https://sbx.example.com", "https://sbx.example.com"},
                              {"https://sbx.example.com/", "https://sbx.example.com"},
                              {"https://sbx.example.com:8443/mcp", "https://sbx.example.com:8443"},
                              {"http://127.0.0.1:9/mcp/", "http://127.0.0.1:9"},
                              {"https://h/base", "https://h/base"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *url = cli_profile_url (cases[i][0], "SBX_URL", why, sizeof why);
        assert (url && streq (url, cases[i][1]));
        free (url);
    }
    const char *bad[] = {
        "sbx.example.com",      "ftp://x", "https://", "https:///mcp", "https://a b",
        "https://x\r\nHost: y", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert (cli_profile_url (bad[i], "SBX_URL", why, sizeof why) == NULL);
        assert (strstr (why, "SBX_URL must be"));
    }
    assert (cli_profile_key_check ("sbx_abc", "K", why, sizeof why) == 0);
    assert (cli_profile_key_check (NULL, "SBX_API_KEY", why, sizeof why) == -1 &&
            strstr (why, "SBX_API_KEY is not set"));
    assert (cli_profile_key_check ("", "K", why, sizeof why) == -1);
    assert (cli_profile_key_check ("Bearer sbx_x", "K", why, sizeof why) == -1 &&
            strstr (why, "K must be an sbx API key"));
    assert (cli_profile_key_check ("sbx_a\nb", "K", why, sizeof why) == -1);

    //  Save, load, the environment over it field by field, remove.
    char dir[] = "/tmp/cli_profile_test.XXXXXX";
    assert (mkdtemp (dir));
    char *conf = zsys_sprintf ("%s/conf", dir), *ca = zsys_sprintf ("%s/in.crt", dir);
    FILE *f = fopen (ca, "w");
    fputs ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", f);
    fclose (f);
    setenv ("SBX_CONFIG_DIR", conf, 1);
    unsetenv ("SBX_URL");
    unsetenv ("SBX_API_KEY");
    unsetenv ("SBX_CA_CERT");
    assert (cli_profile_load (why, sizeof why) == NULL && *why == 0); //  none: local
    assert (cli_profile_save ("https://h:1/mcp", "sbx_k", ca, why, sizeof why) == 0);
    struct stat st;
    char *saved = zsys_sprintf ("%s/profile.json", conf);
    assert (stat (saved, &st) == 0 && (st.st_mode & 0777) == 0600);
    assert (stat (conf, &st) == 0 && (st.st_mode & 0777) == 0700);
    unlink (ca); //  the profile has its own copy
    cli_profile_t *p = cli_profile_load (why, sizeof why);
    assert (p && streq (p->url, "https://h:1") && streq (p->api_key, "sbx_k"));
    assert (p->ca_cert && strstr (p->ca_cert, "/conf/ca.crt") && streq (p->from, saved));
    cli_profile_destroy (&p);
    setenv ("SBX_API_KEY", "sbx_other", 1);
    p = cli_profile_load (why, sizeof why);
    assert (p && streq (p->api_key, "sbx_other") && streq (p->url, "https://h:1"));
    cli_profile_destroy (&p);
    setenv ("SBX_URL", "nope", 1);
    assert (cli_profile_load (why, sizeof why) == NULL && strstr (why, "SBX_URL must be"));
    unsetenv ("SBX_URL");
    unsetenv ("SBX_API_KEY");
    assert (cli_profile_save ("https://h", "Bearer x", NULL, why, sizeof why) == -1);
    assert (cli_profile_save ("https://h", "sbx_k", ca, why, sizeof why) == -1 &&
            strstr (why, "is not a PEM certificate file"));
    assert (cli_profile_remove (why, sizeof why) == 0);
    assert (cli_profile_load (why, sizeof why) == NULL && *why == 0);
    assert (cli_profile_remove (why, sizeof why) == 0);
    rmdir (conf);
    rmdir (dir);
    unsetenv ("SBX_CONFIG_DIR");
    free (saved);
    free (conf);
    free (ca);
}
