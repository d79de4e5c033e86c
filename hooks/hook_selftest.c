/*  hook_selftest - sbx-hookd's self-tests (see sbx_testrun.h). Deliveries over real
    HTTP, restarts and the tap: tests/integration/test_webhooks.py. */
#include "hook_server.h"
#include "hook_store.h"
#include "sbx_testrun.h"

static const sbx_test_t s_tests[] = {
    {"hook_store", hook_store_test}, {"hook_server", hook_server_test}, {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
