/*  cli_mcp - `sbx mcp`: a stdio MCP server for local clients (Claude Desktop, Claude Code,
    Cursor) that forwards to a remote sbx's /mcp over HTTPS.

    Configured by the environment, as those clients pass it: SBX_URL, SBX_API_KEY and
    SBX_CA_CERT, over what `sbx login` saved (cli_profile). With neither, on the sbx host
    itself, the local installation's URL and CA (as `sbx status` shows them) are used;
    a key is needed either way. stdout
    carries only protocol messages; logs go to stderr.
*/
#include "cli_commands.h"
#include "cli_lines.h"
#include "cli_mcp_server.h"
#include "cli_profile.h"
#include "cli_remote.h"
#include "sbx_common.h"

#include <getopt.h>
#include <signal.h>
#include <sys/stat.h>

//  One message's limit: write_file's 16 MiB in base64 fits, with room for the envelope.
#define S_LINE_MAX (32 * 1024 * 1024)

static volatile sig_atomic_t s_stop = 0;
static int s_null_fd = -1;

//  A read of stdin in progress ends with EINTR; one about to start would block, so stdin
//  becomes /dev/null (dup2 is async-signal-safe) and that read sees the end at once.
static void s_on_signal (int signal)
{
    (void) signal;
    s_stop = 1;
    if (s_null_fd >= 0)
        dup2 (s_null_fd, 0);
}

static void s_usage (FILE *out)
{
    fprintf (
        out,
        "usage: sbx mcp [--data-dir DIR] [--verbose]\n\n"
        "A stdio MCP server for local clients, forwarding to a remote sbx service's /mcp.\n"
        "The client starts it and speaks JSON-RPC on its stdin and stdout (one message per\n"
        "line); logs go to stderr. It serves the service's tools and one of its own,\n"
        "handoff_session, which copies the working directory into a sandbox (git's files\n"
        "in a work tree, .gitignore followed; at most 16 MiB).\n\n"
        "Environment:\n"
        "  SBX_URL      the service's base URL (https://sbx.example.com) or its /mcp URL;\n"
        "               these three override what `sbx login` saved. Without either, on\n"
        "               the sbx host itself: the local installation's (see `sbx status`;\n"
        "               --data-dir or $SBX_DATA_DIR picks it).\n"
        "  SBX_API_KEY  an API key of your account there (sbx_…), required:\n"
        "               sbx key create --account EMAIL on the service's host.\n"
        "  SBX_CA_CERT  a PEM file of the CA to trust for the service's certificate\n"
        "               (the local CA's ca_cert of `sbx status`), when it is not a public one.\n\n"
        "Claude Desktop (claude_desktop_config.json):\n"
        "  {\"mcpServers\": {\"sbx\": {\"command\": \"sbx\", \"args\": [\"mcp\"],\n"
        "    \"env\": {\"SBX_URL\": \"https://sbx.example.com\", \"SBX_API_KEY\": \"sbx_…\",\n"
        "            \"SBX_CA_CERT\": \"/path/to/ca.crt\"}}}}\n\n"
        "Claude Code (the name sbx first: -e takes what follows it up to --):\n"
        "  claude mcp add sbx -e SBX_URL=https://sbx.example.com -e SBX_API_KEY=sbx_… \\\n"
        "    -e SBX_CA_CERT=/path/to/ca.crt -- sbx mcp\n\n"
        "Cursor (~/.cursor/mcp.json or .cursor/mcp.json):\n"
        "  {\"mcpServers\": {\"sbx\": {\"command\": \"sbx\", \"args\": [\"mcp\"],\n"
        "    \"env\": {\"SBX_URL\": \"https://sbx.example.com\", \"SBX_API_KEY\": \"sbx_…\"}}}}\n\n"
        "More in docs/clients.md.\n");
}

//  Whether dir holds an sbx installation (sbx up ran there): then it may be the default.
static bool s_installed (const char *dir)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf (path, sizeof path, "%s/sbx.conf", dir);
    if (stat (path, &st) == 0)
        return true;
    snprintf (path, sizeof path, "%s/run/up.json", dir);
    return stat (path, &st) == 0;
}

int cli_mcp_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"verbose", no_argument, 0, 'v'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL;
    bool verbose = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "v", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'v':
            verbose = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr,
                 "sbx mcp: unexpected argument '%s' (it is configured by SBX_URL, "
                 "SBX_API_KEY and SBX_CA_CERT; see sbx mcp --help)\n",
                 argv[optind]);
        return 2;
    }
    sbx_log_init ("sbx mcp", verbose ? SBX_LOG_DEBUG : SBX_LOG_INFO);

    char why[1024];
    //  --data-dir names the local installation: a saved profile does not apply then.
    const char *env_url = getenv ("SBX_URL");
    cli_profile_t *profile =
        data_dir && !(env_url && *env_url) ? NULL : cli_profile_load (why, sizeof why);
    if (data_dir && !(env_url && *env_url))
        *why = 0;
    if (!profile && *why) {
        fprintf (stderr, "sbx mcp: %s\n", why);
        return 2;
    }
    char *url = NULL, *ca = NULL, *key = NULL;
    if (profile) {
        url = zsys_sprintf ("%s/mcp", profile->url);
        ca = profile->ca_cert ? strdup (profile->ca_cert) : NULL;
        key = strdup (profile->api_key);
        cli_profile_destroy (&profile);
    } else {
        //  No service named (SBX_URL, or `sbx login`): the local installation, if any.
        const char *dir = data_dir ? data_dir : sbx_config_default_data_dir ();
        if (!s_installed (dir)) {
            fprintf (stderr,
                     "sbx mcp: SBX_URL is not set: give the sbx service's URL "
                     "(SBX_URL=https://sbx.example.com, or `sbx login URL` once); there is no "
                     "local installation in %s to default to\n",
                     dir);
            return 2;
        }
        sbx_config_t *config = sbx_config_new (dir);
        if (!config)
            return 2;
        char *base = cli_base_url (config);
        url = zsys_sprintf ("%s/mcp", base);
        free (base);
        ca = cli_ca_cert (config);
        sbx_config_destroy (&config);
        if (cli_profile_key_check (getenv ("SBX_API_KEY"), "SBX_API_KEY", why, sizeof why)) {
            fprintf (stderr, "sbx mcp: %s (service %s)\n", why, url);
            free (url);
            free (ca);
            return 2;
        }
        key = strdup (getenv ("SBX_API_KEY"));
        sbx_info ("SBX_URL is not set: using the local installation's %s", url);
    }
    char cwd[PATH_MAX];
    if (!getcwd (cwd, sizeof cwd)) {
        fprintf (stderr, "sbx mcp: cannot tell the working directory: %s\n", strerror (errno));
        free (url);
        free (ca);
        free (key);
        return 2;
    }

    //  Without SA_RESTART, a signal ends the read of stdin; transfers stop through the
    //  flag. A client gone mid-answer must end the loop, not the process (SIGPIPE).
    s_null_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
    struct sigaction action = {0};
    action.sa_handler = s_on_signal;
    sigemptyset (&action.sa_mask);
    sigaction (SIGTERM, &action, NULL);
    sigaction (SIGINT, &action, NULL);
    sigaction (SIGHUP, &action, NULL);
    signal (SIGPIPE, SIG_IGN);

    cli_remote_t *remote = cli_remote_new (url, key, ca);
    if (!remote) {
        fprintf (stderr, "sbx mcp: out of memory\n");
        free (url);
        free (ca);
        free (key);
        return 1;
    }
    cli_remote_set_abort (remote, &s_stop);
    cli_mcp_server_t *server = cli_mcp_server_new (remote, cwd, stdout);
    cli_lines_t *lines = cli_lines_new (0, S_LINE_MAX);
    sbx_info ("serving MCP on stdio for %s (handoff from %s)", url, cwd);
    const char *line;
    bool too_long;
    while (!s_stop && (line = cli_lines_next (lines, &too_long))) {
        int rc = too_long ? cli_mcp_server_too_long (server, S_LINE_MAX)
                          : cli_mcp_server_handle (server, line);
        if (rc)
            break;
    }
    sbx_info (s_stop ? "stopping on a signal" : "stdin closed: stopping");
    cli_lines_destroy (&lines);
    cli_mcp_server_destroy (&server);
    cli_remote_destroy (&remote); //  ends the remote session
    free (url);
    free (ca);
    free (key);
    if (s_null_fd >= 0)
        close (s_null_fd);
    return 0;
}
