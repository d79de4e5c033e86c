/*  snap_selftest - snapshotd's self-tests (see sbx_testrun.h). snap_broker's and
    snap_fork's tests live in snap_broker_test.c: they run a real broker, which
    sbx-snapshotd must not link. */
#include "snap_server.h"
#include "snap_store.h"
#include "sbx_testrun.h"

void snap_broker_test (bool verbose);
void snap_fork_test (bool verbose);

static const sbx_test_t s_tests[] = {{"snap_store", snap_store_test},
                                     {"snap_server", snap_server_test},
                                     {"snap_broker", snap_broker_test},
                                     {"snap_fork", snap_fork_test},
                                     {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
