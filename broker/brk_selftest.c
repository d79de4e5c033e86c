/*  brk_selftest - runs the self-test of one broker module, or all of them.
    Usage: brk_selftest [-v] [MODULE]   (ctest registers one test per module) */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sbx_log.h"
#include "brk_pending.h"
#include "brk_registry.h"
#include "brk_server.h"
#include "brk_store.h"

typedef struct {
    const char *name;
    void (*fn)(bool verbose);
} test_item_t;

static test_item_t s_tests[] = {{"brk_store", brk_store_test},
                                 {"brk_registry", brk_registry_test},
                                 {"brk_pending", brk_pending_test},
                                 {"brk_server", brk_server_test},
                                 {NULL, NULL}};

int main(int argc, char **argv)
{
    bool verbose = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0)
            verbose = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [-v] [MODULE]\nmodules:", argv[0]);
            for (test_item_t *t = s_tests; t->name; t++)
                printf(" %s", t->name);
            printf("\n");
            return 0;
        } else
            only = argv[i];
    }
    //  Tests provoke errors on purpose; show the log only when asked.
    sbx_log_init("brk_selftest", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    int ran = 0;
    for (test_item_t *t = s_tests; t->name; t++) {
        if (only && strcmp(only, t->name) != 0) continue;
        printf(" * %s: ", t->name);
        fflush(stdout);
        t->fn(verbose);
        printf("OK\n");
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "brk_selftest: no module named '%s'\n", only ? only : "");
        return 1;
    }
    return 0;
}
