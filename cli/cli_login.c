/*  cli_login - `sbx login URL` and `sbx logout`: the profile the CLI (and `sbx mcp`) use
    away from the sbx host (cli_profile). login checks the key against the service
    before it saves anything. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_profile.h"
#include "cli_rest.h"

#include <getopt.h>
#include <termios.h>
#include <unistd.h>

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx login URL [--api-key KEY] [--ca-cert FILE]\n"
             "       sbx logout\n\n"
             "login saves a profile for using a remote sbx from this machine: the service's\n"
             "URL (https://sbx.example.com), an API key of your account there (made with\n"
             "`sbx key create --account EMAIL` on its host, or on its /account page), and the\n"
             "CA to trust when its certificate is not a public one (the ca_cert that `sbx\n"
             "status` prints on the host; the file is copied). The key comes from --api-key,\n"
             "else $SBX_API_KEY, else a line on stdin (asked for without echo on a terminal).\n"
             "It is checked with the service first; then the profile is written, readable by\n"
             "you alone, to %s/profile.json.\n"
             "From then on sbx sandbox, sbx snapshot, sbx usage, sbx key list|revoke and\n"
             "sbx mcp use it; SBX_URL, SBX_API_KEY and SBX_CA_CERT override it, and\n"
             "--data-dir works on a local installation instead. logout removes it.\n",
             "$SBX_CONFIG_DIR, $XDG_CONFIG_HOME/sbx or ~/.config/sbx");
}

//  A line from stdin, without echo when it is a terminal (fresh, or NULL).
static char *s_read_key (const char *url)
{
    bool tty = isatty (STDIN_FILENO);
    struct termios saved, quiet;
    if (tty) {
        fprintf (stderr, "API key for %s: ", url);
        tcgetattr (STDIN_FILENO, &saved);
        quiet = saved;
        quiet.c_lflag &= (tcflag_t) ~ECHO;
        tcsetattr (STDIN_FILENO, TCSAFLUSH, &quiet);
    }
    char line[1024];
    char *got = fgets (line, sizeof line, stdin);
    if (tty) {
        tcsetattr (STDIN_FILENO, TCSAFLUSH, &saved);
        fputc ('\n', stderr);
    }
    if (!got)
        return NULL;
    line[strcspn (line, "\r\n")] = 0;
    char *key = strdup (line);
    memset (line, 0, sizeof line);
    return key;
}

int cli_login_main (int argc, char **argv)
{
    static struct option options[] = {{"api-key", required_argument, 0, 'k'},
                                      {"ca-cert", required_argument, 0, 'c'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *key_arg = NULL, *ca = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'k':
            key_arg = optarg;
            break;
        case 'c':
            ca = optarg;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf (stderr, "sbx login: give the service's URL, e.g. sbx login "
                         "https://sbx.example.com (see --help)\n");
        return 2;
    }
    char why[1200];
    char *url = cli_profile_url (argv[optind], "the URL", why, sizeof why);
    if (!url) {
        fprintf (stderr, "sbx login: %s\n", why);
        return 2;
    }
    if (ca && access (ca, R_OK) != 0) {
        fprintf (stderr, "sbx login: --ca-cert %s cannot be read: %s\n", ca, strerror (errno));
        free (url);
        return 2;
    }
    const char *env_key = getenv ("SBX_API_KEY");
    char *key = key_arg               ? strdup (key_arg)
                : env_key && *env_key ? strdup (env_key)
                                      : s_read_key (url);
    if (cli_profile_key_check (key, "the API key", why, sizeof why)) {
        fprintf (stderr, "sbx login: %s\n", why);
        free (key);
        free (url);
        return 2;
    }
    //  The key and the certificate must work before anything is saved.
    cli_profile_t profile = {.url = url, .api_key = key, .ca_cert = (char *) ca};
    cli_rest_t *rest = cli_rest_new (&profile);
    json_t *usage = NULL;
    sbx_err_t err;
    int rc = -1;
    if (!rest)
        sbx_err_set (&err, SBX_E_INTERNAL, "out of memory");
    else
        rc = cli_rest_call (rest, SBX_OP_GET_USAGE, NULL, NULL, 0, &usage, NULL, NULL, &err);
    cli_rest_destroy (&rest);
    if (rc)
        rc = cli_fail (&err);
    else if (cli_profile_save (url, key, ca, why, sizeof why)) {
        fprintf (stderr, "sbx login: %s\n", why);
        rc = 1;
    } else {
        char *dir = cli_profile_dir ();
        printf ("logged in to %s as account %s; the profile is %s/profile.json\n", url,
                json_string_value (json_object_get (usage, "accountId")), dir);
        free (dir);
    }
    json_decref (usage);
    memset (key, 0, strlen (key));
    free (key);
    free (url);
    return rc;
}

int cli_logout_main (int argc, char **argv)
{
    if (argc > 1 && (streq (argv[1], "--help") || streq (argv[1], "-h"))) {
        s_usage (stdout);
        return 0;
    }
    if (argc > 1) {
        fprintf (stderr, "sbx logout: takes no arguments\n");
        return 2;
    }
    char why[1200];
    if (cli_profile_remove (why, sizeof why)) {
        fprintf (stderr, "sbx logout: %s\n", why);
        return 1;
    }
    printf ("logged out: no saved profile\n");
    return 0;
}
