/*  cli_selftest - the CLI modules' self-tests (see sbx_testrun.h). */
#include "cli_files.h"
#include "cli_handoff.h"
#include "cli_lines.h"
#include "cli_mcp_server.h"
#include "cli_op.h"
#include "cli_cluster.h"
#include "cli_template_context.h"
#include "cli_password.h"
#include "cli_profile.h"
#include "cli_rest.h"
#include "cli_shell.h"
#include "cli_terminal.h"
#include "cli_sse.h"
#include "cli_supervisor.h"
#include "cli_tar.h"
#include "sbx_testrun.h"

static const sbx_test_t s_tests[] = {{"cli_op", cli_op_test},
                                     {"cli_supervisor", cli_supervisor_test},
                                     {"cli_lines", cli_lines_test},
                                     {"cli_sse", cli_sse_test},
                                     {"cli_tar", cli_tar_test},
                                     {"cli_files", cli_files_test},
                                     {"cli_handoff", cli_handoff_test},
                                     {"cli_mcp_server", cli_mcp_server_test},
                                     {"cli_profile", cli_profile_test},
                                     {"cli_rest", cli_rest_test},
                                     {"cli_shell", cli_shell_test},
                                     {"cli_terminal", cli_terminal_test},
                                     {"cli_password", cli_password_test},
                                     {"cli_cluster", cli_cluster_test},
                                     {"cli_template_context", cli_template_context_test},
                                     {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
