/*  fuzz_check - what every harness shares: the libFuzzer entry points' prototypes and
    CHECK, which aborts on a broken property (not only a crash) naming the harness and
    the check, so libFuzzer keeps the input as a finding. Define FUZZ_NAME first. */
#ifndef FUZZ_CHECK_H_INCLUDED
#define FUZZ_CHECK_H_INCLUDED

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf (stderr, "%s: %s: %s\n", FUZZ_NAME, #cond, what);                              \
            abort ();                                                                              \
        }                                                                                          \
    } while (0)

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

#endif
