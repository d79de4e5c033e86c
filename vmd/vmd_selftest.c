/*  vmd_selftest - the vmd modules' self-tests (see sbx_testrun.h). */
#include "sbx_testrun.h"
#include "vmd_agentlink.h"
#include "vmd_dns.h"
#include "vmd_egress.h"
#include "vmd_firewall.h"
#include "vmd_lifecycle.h"
#include "vmd_qemu.h"
#include "vmd_qmp.h"
#include "vmd_ramfile.h"
#include "vmd_relay.h"
#include "vmd_samples.h"
#include "vmd_server.h"
#include "vmd_ship.h"

static const sbx_test_t s_tests[] = {{"vmd_qmp", vmd_qmp_test},
                                     {"vmd_ramfile", vmd_ramfile_test},
                                     {"vmd_qemu", vmd_qemu_test},
                                     {"vmd_firewall", vmd_firewall_test},
                                     {"vmd_egress", vmd_egress_test},
                                     {"vmd_dns", vmd_dns_test},
                                     {"vmd_lifecycle", vmd_lifecycle_test},
                                     {"vmd_agentlink", vmd_agentlink_test},
                                     {"vmd_samples", vmd_samples_test},
                                     {"vmd_server", vmd_server_test},
                                     {"vmd_ship", vmd_ship_test},
                                     {"vmd_relay", vmd_relay_test},
                                     {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
