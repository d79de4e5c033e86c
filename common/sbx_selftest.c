/*  sbx_selftest - the common modules' self-tests (see sbx_testrun.h). */
#include "sbx_common.h"
#include "sbx_testrun.h"
#include "sbx_db.h"
#include "sbx_dqlite.h"
#include "sbx_dqproxy.h"
#include "sbx_idmap.h"
#include "sbx_site.h"
#include "sbx_urls.h"
#include "sbx_args.h"
#include "sbx_api.h"
#include "sbx_xfer.h"
#include "sbx_heap.h"
#include "sbx_ws.h"
#include "sbx_metrics.h"
#include "sbx_egress.h"
#include "sbx_stall.h"
#include "sbx_netaddr.h"
#include "sbx_ship.h"
#include "sbx_dockerfile.h"

static const sbx_test_t s_tests[] = {{"sbx_msg", sbx_msg_test},
                                     {"sbx_secret", sbx_secret_test},
                                     {"sbx_ready", sbx_ready_test},
                                     {"sbx_log", sbx_log_test},
                                     {"sbx_clock", sbx_clock_test},
                                     {"sbx_config", sbx_config_test},
                                     {"sbx_curve", sbx_curve_test},
                                     {"sbx_urls", sbx_urls_test},
                                     {"sbx_site", sbx_site_test},
                                     {"sbx_idmap", sbx_idmap_test},
                                     {"sbx_db", sbx_db_test},
                                     {"sbx_peer", sbx_peer_test},
                                     {"sbx_args", sbx_args_test},
                                     {"sbx_api", sbx_api_test},
                                     {"sbx_xfer", sbx_xfer_test},
                                     {"sbx_heap", sbx_heap_test},
                                     {"sbx_ws", sbx_ws_test},
                                     {"sbx_metrics", sbx_metrics_test},
                                     {"sbx_netaddr", sbx_netaddr_test},
                                     {"sbx_egress", sbx_egress_test},
                                     {"sbx_stall", sbx_stall_test},
                                     {"sbx_dqlite", sbx_dqlite_test},
                                     {"sbx_dqproxy", sbx_dqproxy_test},
                                     {"sbx_db_cluster", sbx_db_cluster_test},
                                     {"sbx_ship", sbx_ship_test},
                                     {"sbx_dockerfile", sbx_dockerfile_test},
                                     {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
