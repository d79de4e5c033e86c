/*  gw_selftest - the gateway modules' self-tests (see sbx_testrun.h). */
#include "gw_account.h"
#include "gw_auth.h"
#include "gw_box.h"
#include "gw_broker.h"
#include "gw_cache.h"
#include "gw_chart.h"
#include "gw_console.h"
#include "gw_fetch.h"
#include "gw_http.h"
#include "gw_jsonload.h"
#include "gw_mcp.h"
#include "gw_mcp_era.h"
#include "gw_mcp_sse.h"
#include "gw_mcp_sessions.h"
#include "gw_metrics.h"
#include "gw_oauth.h"
#include "gw_ops.h"
#include "gw_others.h"
#include "gw_pages.h"
#include "gw_proxy.h"
#include "gw_ratelimit.h"
#include "gw_rates.h"
#include "gw_exec_stream.h"
#include "gw_rest.h"
#include "gw_builds.h"
#include "gw_b64_stream.h"
#include "gw_router.h"
#include "gw_session.h"
#include "gw_signin.h"
#include "gw_terminal.h"
#include "gw_tls.h"
#include "gw_text.h"
#include "gw_tools.h"
#include "gw_verify.h"
#include "gw_worker.h"
#include "sbx_testrun.h"

//  A table, three a row.
// clang-format off
static const sbx_test_t s_tests[] = {
    {"gw_tls", gw_tls_test},       {"gw_http", gw_http_test},       {"gw_auth", gw_auth_test},
    {"gw_cache", gw_cache_test},   {"gw_tools", gw_tools_test},     {"gw_mcp", gw_mcp_test},
    {"gw_broker", gw_broker_test}, {"gw_ops", gw_ops_test}, {"gw_mcp_era", gw_mcp_era_test}, {"gw_jsonload", gw_jsonload_test}, {"gw_mcp_sse", gw_mcp_sse_test}, {"gw_text", gw_text_test}, {"gw_rest", gw_rest_test}, {"gw_exec_stream", gw_exec_stream_test},       {"gw_proxy", gw_proxy_test},
    {"gw_worker", gw_worker_test}, {"gw_verify", gw_verify_test},   {"gw_fetch", gw_fetch_test},
    {"gw_pages", gw_pages_test},   {"gw_session", gw_session_test}, {"gw_signin", gw_signin_test},
    {"gw_oauth", gw_oauth_test},   {"gw_account", gw_account_test}, {"gw_ratelimit", gw_ratelimit_test},
    {"gw_mcp_sessions", gw_mcp_sessions_test}, {"gw_rates", gw_rates_test},
    {"gw_router", gw_router_test}, {"gw_terminal", gw_terminal_test}, {"gw_builds", gw_builds_test}, {"gw_others", gw_others_test}, {"gw_others_peers", gw_others_peers_test},
    {"gw_metrics", gw_metrics_test}, {"gw_b64_stream", gw_b64_stream_test},
    {"gw_chart", gw_chart_test},   {"gw_console", gw_console_test}, {"gw_box", gw_box_test},
    {NULL, NULL}};
// clang-format on

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
