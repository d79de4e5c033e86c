/*  sbx_testrun - see sbx_testrun.h */
#include "sbx_testrun.h"
#include "sbx_log.h"

#include <stdio.h>
#include <string.h>

int sbx_testrun (int argc, char **argv, const sbx_test_t *tests)
{
    bool verbose = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp (argv[i], "-v") == 0)
            verbose = true;
        else if (strcmp (argv[i], "-h") == 0 || strcmp (argv[i], "--help") == 0) {
            printf ("usage: %s [-v] [MODULE]\nmodules:", argv[0]);
            for (const sbx_test_t *t = tests; t->name; t++)
                printf (" %s", t->name);
            printf ("\n");
            return 0;
        } else
            only = argv[i];
    }
    sbx_log_init (argv[0], verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    int ran = 0;
    for (const sbx_test_t *t = tests; t->name; t++) {
        if (only && strcmp (only, t->name) != 0)
            continue;
        printf (" * %s: ", t->name);
        fflush (stdout);
        t->fn (verbose);
        printf ("OK\n");
        fflush (stdout);
        ran++;
    }
    if (ran == 0) {
        fprintf (stderr, "%s: no module named '%s'\n", argv[0], only ? only : "");
        return 1;
    }
    return 0;
}
