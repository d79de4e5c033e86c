/*  brk_egress - a sandbox's egress rules on the broker's side.

    The broker checks the lists (sbx_egress says what an entry is: a gateway checks them
    too, but the CLI talks to the broker directly), keeps them in the sandbox's record
    (an entry a line), and hands them to vmd in every vm.create and vm.resume, so a guest
    never starts under rules older than its record. A change to a running guest goes to
    its vmd first (vm.egress); the record follows vmd's answer (brk_sandbox_update).
*/
#ifndef BRK_EGRESS_H_INCLUDED
#define BRK_EGRESS_H_INCLUDED

#include "sbx_msg.h"

//  NULL when both lists are well formed, else an invalid_argument reply to request that
//  names the entry and what is wrong with it.
sbx_msg_t *brk_egress_check (const sbx_msg_t *request, const sbx_strlist_t *allow,
                             const sbx_strlist_t *deny);

//  A list as the store keeps it: its entries a line each; NULL for an empty list (or
//  when out of memory: the caller checks list->count). The caller frees.
char *brk_egress_join (const sbx_strlist_t *list);

//  Appends the entries of a stored list (NULL: none) to list. 0, or -1 out of memory.
int brk_egress_split (const char *text, sbx_strlist_t *list);

//  Appends copies of from's entries to to. 0, or -1 out of memory.
int brk_egress_copy (const sbx_strlist_t *from, sbx_strlist_t *to);

void brk_egress_test (bool verbose);

#endif
