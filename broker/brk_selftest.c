/*  brk_selftest - the broker modules' self-tests (see sbx_testrun.h). */
#include "brk_admin.h"
#include "brk_control.h"
#include "brk_egress.h"
#include "brk_hostloss.h"
#include "brk_limits.h"
#include "brk_metrics.h"
#include "brk_move.h"
#include "brk_names.h"
#include "brk_oauth.h"
#include "brk_pending.h"
#include "brk_ports.h"
#include "brk_rates.h"
#include "brk_registry.h"
#include "brk_sandbox.h"
#include "brk_server.h"
#include "brk_sessions.h"
#include "brk_store.h"
#include "sbx_testrun.h"

static const sbx_test_t s_tests[] = {
    {"brk_store", brk_store_test},         {"brk_egress", brk_egress_test},
    {"brk_registry", brk_registry_test},   {"brk_pending", brk_pending_test},
    {"brk_names", brk_names_test},         {"brk_server", brk_server_test},
    {"brk_sandbox", brk_sandbox_test},     {"brk_ports", brk_ports_test},
    {"brk_metrics", brk_metrics_test},     {"brk_limits", brk_limits_test},
    {"brk_oauth", brk_oauth_test},         {"brk_store_oauth", brk_store_oauth_test},
    {"brk_store_mcp", brk_store_mcp_test}, {"brk_sessions", brk_sessions_test},
    {"brk_rates", brk_rates_test},         {"brk_admin", brk_admin_test},
    {"brk_control", brk_control_test},     {"brk_hostloss", brk_hostloss_test},
    {"brk_move", brk_move_test},           {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
