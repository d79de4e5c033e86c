/*  cli_mcp - `sbx mcp`: a stdio MCP server for local clients (Claude Desktop, Claude Code,
    Cursor) that forwards to a remote sbx's /mcp over HTTPS.

    Configured by the environment, as those clients pass it: SBX_URL, SBX_API_KEY and
    SBX_CA_CERT. Without SBX_URL, on the sbx host itself, the local installation's URL
    and CA (as `sbx status` shows them) are used; a key is needed either way. stdout
    carries only protocol messages; logs go to stderr.
*/
#include "cli_commands.h"
#include "cli_lines.h"
#include "cli_mcp_server.h"
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
        "  SBX_URL      the service's base URL (https://sbx.example.com) or its /mcp URL.\n"
        "               Unset on the sbx host itself: the local installation's (see\n"
        "               `sbx status`; --data-dir or $SBX_DATA_DIR picks it).\n"
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

//  The /mcp URL from SBX_URL's text (a base URL or the /mcp URL itself); NULL with why.
char *cli_mcp_url (const char *text, char *why, size_t why_size);
char *cli_mcp_url (const char *text, char *why, size_t why_size)
{
    size_t n = strlen (text);
    while (n && text[n - 1] == '/')
        n--;
    const char *host = strncmp (text, "https://", 8) == 0  ? text + 8
                       : strncmp (text, "http://", 7) == 0 ? text + 7
                                                           : NULL;
    bool clean = true;
    for (size_t i = 0; i < n; i++)
        clean = clean && (unsigned char) text[i] > 0x20 && text[i] != 0x7f;
    if (!host || !clean || host >= text + n || *host == '/' || n > 2048) {
        snprintf (why, why_size,
                  "SBX_URL must be the sbx service's URL, https://HOST[:PORT] or "
                  "https://HOST[:PORT]/mcp (got \"%.200s\")",
                  text);
        return NULL;
    }
    if (n >= 4 && strncmp (text + n - 4, "/mcp", 4) == 0)
        return strndup (text, n);
    return zsys_sprintf ("%.*s/mcp", (int) n, text);
}

//  The key from SBX_API_KEY's text; NULL with why.
int cli_mcp_key_check (const char *key, char *why, size_t why_size);
int cli_mcp_key_check (const char *key, char *why, size_t why_size)
{
    if (!key || !*key) {
        snprintf (why, why_size,
                  "SBX_API_KEY is not set: give sbx mcp an API key of your account on the "
                  "service (sbx_…; `sbx key create --account EMAIL` on its host makes one)");
        return -1;
    }
    bool clean = strlen (key) <= 512;
    for (const char *p = key; *p; p++)
        clean = clean && (unsigned char) *p > 0x20 && *p != 0x7f;
    if (strncmp (key, "sbx_", 4) != 0 || !clean) {
        //  The key itself is not repeated: stderr ends up in the client's logs.
        snprintf (why, why_size,
                  "SBX_API_KEY must be an sbx API key: sbx_… as `sbx key create` printed it, "
                  "without quotes, spaces or \"Bearer\"");
        return -1;
    }
    return 0;
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
    const char *url_text = getenv ("SBX_URL");
    const char *key = getenv ("SBX_API_KEY");
    const char *ca_text = getenv ("SBX_CA_CERT");
    char *url = NULL, *ca = NULL;
    if (url_text && *url_text) {
        url = cli_mcp_url (url_text, why, sizeof why);
        if (!url) {
            fprintf (stderr, "sbx mcp: %s\n", why);
            return 2;
        }
    } else {
        const char *dir = data_dir ? data_dir : sbx_config_default_data_dir ();
        if (!s_installed (dir)) {
            fprintf (stderr,
                     "sbx mcp: SBX_URL is not set: give the sbx service's URL "
                     "(SBX_URL=https://sbx.example.com); there is no local installation in %s "
                     "to default to\n",
                     dir);
            return 2;
        }
        sbx_config_t *config = sbx_config_new (dir);
        if (!config)
            return 2;
        char *base = cli_base_url (config);
        url = zsys_sprintf ("%s/mcp", base);
        free (base);
        if (!ca_text || !*ca_text)
            ca = cli_ca_cert (config);
        sbx_config_destroy (&config);
        sbx_info ("SBX_URL is not set: using the local installation's %s", url);
    }
    if (cli_mcp_key_check (key, why, sizeof why)) {
        fprintf (stderr, "sbx mcp: %s (service %s)\n", why, url);
        free (url);
        free (ca);
        return 2;
    }
    if (ca_text && *ca_text) {
        if (access (ca_text, R_OK)) {
            fprintf (stderr, "sbx mcp: SBX_CA_CERT names %s, which cannot be read: %s\n", ca_text,
                     strerror (errno));
            free (url);
            return 2;
        }
        ca = strdup (ca_text);
    }
    char cwd[PATH_MAX];
    if (!getcwd (cwd, sizeof cwd)) {
        fprintf (stderr, "sbx mcp: cannot tell the working directory: %s\n", strerror (errno));
        free (url);
        free (ca);
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
    if (s_null_fd >= 0)
        close (s_null_fd);
    return 0;
}

void cli_mcp_test (bool verbose);
void cli_mcp_test (bool verbose)
{
    (void) verbose;
    char why[1024];
    const char *cases[][2] = {
        {"https://sbx.example.com", "https://sbx.example.com/mcp"},
        {"https://sbx.example.com/", "https://sbx.example.com/mcp"},
        {"https://sbx.example.com:8443/mcp", "https://sbx.example.com:8443/mcp"},
        {"http://127.0.0.1:9/mcp/", "http://127.0.0.1:9/mcp"},
        {"https://h/base", "https://h/base/mcp"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *url = cli_mcp_url (cases[i][0], why, sizeof why);
        assert (url && streq (url, cases[i][1]));
        free (url);
    }
    const char *bad[] = {"sbx.example.com", "ftp://x",     "https://",
                         "https:///mcp",    "https://a b", "https://x\r\nHost: y"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert (cli_mcp_url (bad[i], why, sizeof why) == NULL);
        assert (strstr (why, "SBX_URL must be"));
    }
    assert (cli_mcp_key_check ("sbx_abc", why, sizeof why) == 0);
    assert (cli_mcp_key_check (NULL, why, sizeof why) == -1 &&
            strstr (why, "SBX_API_KEY is not set"));
    assert (cli_mcp_key_check ("", why, sizeof why) == -1);
    assert (cli_mcp_key_check ("Bearer sbx_x", why, sizeof why) == -1 &&
            strstr (why, "must be an sbx API key"));
    assert (cli_mcp_key_check ("sbx_a\nb", why, sizeof why) == -1);
}
