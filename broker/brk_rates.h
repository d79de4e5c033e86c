/*  brk_rates - each gateway's share of a key's plan rate, from every gateway's demand.

    Gateways hold a key to its plan's requests per second in their own memory, so N of
    them behind a balancer would allow N times the plan. Each one reports a few times a
    second how many requests it saw per key (rate.report) and refills its bucket for the
    key at the share this answers (rate.report.ok):

        share_i = 0.9 * d_i / M  +  (1 - 0.9 * D / M) / N,    M = max (D, rate)

    d_i is the reporting gateway's demand per second (requests attempted, refused ones
    included), D the sum over the N gateways whose figure for the key is recent (1 s, or
    four of their report windows when those are longer). Over the plan (D >= rate) this
    is 0.9 * d_i / D + 0.1 / N: shares follow demand, and a tenth is split evenly so a
    gateway whose clients just arrived is never starved. Under the plan the unused part
    of the rate is split evenly as well, so a gateway whose traffic grows is not held to
    what it saw a moment ago. The shares of the N gateways sum to 1000; a gateway alone
    gets 1000.

    In memory only: after a broker restart the shares rebuild from the next reports
    (until then each gateway keeps the shares it holds). A gateway's figures go when they
    are old or the gateway leaves (brk_rates_forget).
*/
#ifndef BRK_RATES_H_INCLUDED
#define BRK_RATES_H_INCLUDED

#include "brk_registry.h"
#include "sbx_common.h"

typedef struct brk_rates_t brk_rates_t;

//  registry is borrowed: the answer counts the gateways registered in it.
brk_rates_t *brk_rates_new (brk_registry_t *registry);
void brk_rates_destroy (brk_rates_t **self_p);

//  Handles a rate.report from peer: records its demand and returns rate.report.ok with
//  its shares, or an error (permission_denied when peer is no registered gateway).
sbx_msg_t *brk_rates_report (brk_rates_t *self, brk_peer_t *peer, sbx_msg_t *request);

//  Forgets the figures of the gateway behind routing_id (it left or was replaced), so
//  the others' shares grow back at their next report.
void brk_rates_forget (brk_rates_t *self, const char *routing_id);

void brk_rates_test (bool verbose);

#endif
