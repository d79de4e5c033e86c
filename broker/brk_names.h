/*  brk_names - readable sandbox labels: adjective-adjective-animal ("quiet-brisk-jay").

    A label is the guest's hostname and the first part of its URLs
    (https://<label>.box.<domain>), so it is lower case, DNS-safe and short. 64 x 64 x
    64 = 262,144 labels; the caller retries on the rare collision. */
#ifndef BRK_NAMES_H_INCLUDED
#define BRK_NAMES_H_INCLUDED

#include <stdbool.h>

//  A new random label. Caller frees.
char *brk_names_label (void);

//  True for text that could be a label or sandbox name in a hostname: 1-63 characters
//  of a-z, 0-9 and '-', not starting or ending with '-'.
bool brk_names_dns_safe (const char *text);

void brk_names_test (bool verbose);

#endif
