/*  cli_commands - the subcommands of `sbx`, one file each. Each takes the arguments
    after the subcommand name (argv[0] is the subcommand) and returns the exit code. */
#ifndef CLI_COMMANDS_H_INCLUDED
#define CLI_COMMANDS_H_INCLUDED

int cli_up_main (int argc, char **argv);
int cli_down_main (int argc, char **argv);
int cli_status_main (int argc, char **argv);
int cli_account_main (int argc, char **argv);
int cli_key_main (int argc, char **argv);
int cli_webhook_main (int argc, char **argv);
int cli_tap_main (int argc, char **argv);
int cli_sandbox_main (int argc, char **argv);
int cli_audit_main (int argc, char **argv);
int cli_wallet_main (int argc, char **argv);
int cli_usage_main (int argc, char **argv);
int cli_snapshot_main (int argc, char **argv);
int cli_mcp_main (int argc, char **argv);
int cli_login_main (int argc, char **argv);
int cli_logout_main (int argc, char **argv);
int cli_backup_main (int argc, char **argv);
int cli_restore_main (int argc, char **argv);

#include "sbx_config.h"

//  Where clients reach this installation: https://DOMAIN[:PORT] from the listen and
//  domain settings (the port is left out when it is the scheme's default). Caller frees.
char *cli_base_url (sbx_config_t *config);

//  The CA certificate clients should trust (DIR/tls/ca.crt), or NULL for plain HTTP or
//  an operator's own certificate. Caller frees.
char *cli_ca_cert (sbx_config_t *config);

#endif
