/*  sbx - the operator's command line: run the service, manage accounts and keys,
    watch the event log. */
#include "cli_cluster.h"
#include "cli_commands.h"
#include "cli_template.h"
#include "sbx_common.h"

typedef struct {
    const char *name;
    int (*main) (int argc, char **argv);
    const char *summary;
} s_command_t;

static const s_command_t s_commands[] = {
    {"up", cli_up_main, "run the whole service on this machine, supervised"},
    {"down", cli_down_main, "stop everything: every guest (memory kept), then sbx up"},
    {"status", cli_status_main, "show what runs and where clients connect"},
    {"account", cli_account_main, "accounts: create, list, get, passwd, disable, enable, delete"},
    {"key", cli_key_main, "create, list and revoke API keys"},
    {"tap", cli_tap_main, "print the event log as JSON lines, live"},
    {"wallet", cli_wallet_main, "add funds to an account's wallet (sbx wallet add)"},
    {"audit", cli_audit_main, "check the event log: sbx audit ttl lists every TTL expiry"},
    {"sandbox", cli_sandbox_main, "create, run commands in, stop, resume and delete sandboxes"},
    {"snapshot", cli_snapshot_main, "list, save, inspect and delete snapshots"},
    {"template", cli_template_main, "build templates from a Dockerfile; list and delete them"},
    {"backup", cli_backup_main, "copy the data directory, stores and sandboxes, into a backup"},
    {"restore", cli_restore_main, "put a backup into a new data directory"},
    {"cluster", cli_cluster_main, "several hosts: init a cluster, make join tokens, its nodes"},
    {"host", cli_host_main, "the hosts admitted to a cluster: list, remove"},
    {"usage", cli_usage_main, "running time, cost and wallet balance of an account"},
    {"webhook", cli_webhook_main, "signed webhooks for an account's events, and their deliveries"},
    {"mcp", cli_mcp_main, "a stdio MCP server for local clients, forwarding to a remote sbx"},
    {"login", cli_login_main, "save a remote sbx's URL and your API key for this CLI"},
    {"logout", cli_logout_main, "forget what sbx login saved"},
    {NULL, NULL, NULL}};

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx COMMAND [OPTIONS]   (sbx COMMAND --help for each)\n\ncommands:\n");
    for (const s_command_t *c = s_commands; c->name; c++)
        fprintf (out, "  %-9s %s\n", c->name, c->summary);
    fprintf (
        out,
        "\nOn the sbx host every command takes --data-dir DIR (default %s, or\n"
        "$SBX_DATA_DIR) and works as an operator. Elsewhere, after `sbx login URL`\n"
        "(or with SBX_URL and SBX_API_KEY), sandbox, snapshot, template, usage, webhook and key\n"
        "list|revoke work through the service's REST API. Commands that print data take --json.\n",
        sbx_config_default_data_dir ());
}

int main (int argc, char **argv)
{
    sbx_log_init ("sbx", SBX_LOG_WARN);
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h") || streq (argv[1], "help")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (streq (argv[1], "--version")) {
        printf ("sbx %s\n", SBX_VERSION);
        return 0;
    }
    for (const s_command_t *c = s_commands; c->name; c++)
        if (streq (argv[1], c->name))
            return c->main (argc - 1, argv + 1);
    fprintf (stderr, "sbx: unknown command '%s'\n\n", argv[1]);
    s_usage (stderr);
    return 2;
}
