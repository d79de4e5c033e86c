/*  gw_selftest - the gateway modules' self-tests (see sbx_testrun.h). */
#include "gw_http.h"
#include "gw_tls.h"
#include "sbx_testrun.h"

static const sbx_test_t s_tests[] = {
    {"gw_tls", gw_tls_test}, {"gw_http", gw_http_test}, {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
