/*  sbx_testrun - the body of every self-test runner (czmq style: one test per module).

    usage: <runner> [-v] [MODULE]: runs MODULE's test, or all of them. Tests provoke
    errors on purpose, so the log shows only errors unless -v is given. */
#ifndef SBX_TESTRUN_H_INCLUDED
#define SBX_TESTRUN_H_INCLUDED

#include <stdbool.h>

typedef struct {
    const char *name;
    void (*fn) (bool verbose);
} sbx_test_t;

//  Runs the tests named on the command line from `tests` (ended by a NULL name).
//  Returns the process exit code: 0, 1 for an unknown module; a failing test aborts.
int sbx_testrun (int argc, char **argv, const sbx_test_t *tests);

#endif
