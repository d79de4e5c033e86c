/*  cli_selftest - runs the self-test of one cli module, or all of them.
    Usage: cli_selftest [-v] [MODULE]   (ctest registers one test per module) */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <czmq.h>

#include "cli_supervisor.h"

typedef struct {
    const char *name;
    void (*fn) (bool verbose);
} test_item_t;

static test_item_t s_tests[] = {{"cli_supervisor", cli_supervisor_test}, {NULL, NULL}};

int main (int argc, char **argv)
{
    bool verbose = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (streq (argv[i], "-v"))
            verbose = true;
        else if (streq (argv[i], "-h") || streq (argv[i], "--help")) {
            printf ("usage: %s [-v] [MODULE]\nmodules:", argv[0]);
            for (test_item_t *t = s_tests; t->name; t++)
                printf (" %s", t->name);
            printf ("\n");
            return 0;
        } else
            only = argv[i];
    }
    int ran = 0;
    for (test_item_t *t = s_tests; t->name; t++) {
        if (only && !streq (only, t->name))
            continue;
        printf (" * %s: ", t->name);
        fflush (stdout);
        t->fn (verbose);
        printf ("OK\n");
        ran++;
    }
    if (ran == 0) {
        fprintf (stderr, "cli_selftest: no module named '%s'\n", only ? only : "");
        return 1;
    }
    return 0;
}
