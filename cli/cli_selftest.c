/*  cli_selftest - the CLI modules' self-tests (see sbx_testrun.h). */
#include "cli_op.h"
#include "cli_supervisor.h"
#include "sbx_testrun.h"

static const sbx_test_t s_tests[] = {
    {"cli_op", cli_op_test}, {"cli_supervisor", cli_supervisor_test}, {NULL, NULL}};

int main (int argc, char **argv)
{
    return sbx_testrun (argc, argv, s_tests);
}
