/*  vmd_dns - a DNS relay for one guest with domain egress rules (vmd_egress).

    The guest's DNS (to 10.0.2.3, which slirp sends to the host's resolver from the
    guest's QEMU uid) is redirected by nftables to this relay's UDP port on 127.0.0.1.
    For each query the policy says: refuse it (REFUSED, for a denied name, or a name
    outside an allow list), pass it, or pass it and learn the addresses of its answer (a
    name of the allow list: its A and AAAA records are handed to the learn callback
    before the answer leaves, so the guest's first connect already passes). Queries go
    to the upstream resolver from a socket of the relay's own, each with a fresh random
    id; an answer must come from that resolver, with that id and the same question,
    within VMD_DNS_TIMEOUT_MS, else it is dropped (the guest's resolver asks again).

    Everything here is untrusted input (the guest's queries, the upstream's answers):
    messages are parsed with bounds checks, compression pointers must point backwards
    and are followed at most a bounded number of times, and anything malformed is
    dropped (a malformed query gets FORMERR when it has a header). UDP only: TCP DNS of
    such a guest is refused by its rules.

        vmd_dns_t *dns = vmd_dns_new (loop, "10.255.255.53", 0, policy, learn, arg);
        uint16_t port = vmd_dns_port (dns);   //  what nftables redirects to
        vmd_dns_destroy (&dns);
*/
#ifndef VMD_DNS_H_INCLUDED
#define VMD_DNS_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VMD_DNS_TIMEOUT_MS 5000
#define VMD_DNS_PENDING    256 //  queries in flight at once; more are answered SERVFAIL
#define VMD_DNS_ADDRS      64  //  addresses learned from one answer at most

typedef struct _vmd_dns_t vmd_dns_t;

typedef enum { VMD_DNS_REFUSE, VMD_DNS_PASS, VMD_DNS_LEARN } vmd_dns_verdict_t;

//  One A or AAAA record of an answer.
typedef struct {
    int family; //  AF_INET (4 bytes of addr used) or AF_INET6 (16)
    uint8_t addr[16];
    uint32_t ttl; //  seconds, as the answer says
} vmd_dns_addr_t;

//  What to do with a query for name (lower case, no trailing dot; "" for the root).
typedef vmd_dns_verdict_t (vmd_dns_policy_fn) (const char *name, void *arg);
//  The A and AAAA records of an answer to a LEARN query for name (count may be 0), called
//  before the answer is sent to the guest. 0, or -1: the guest gets SERVFAIL instead.
typedef int (vmd_dns_learn_fn) (const char *name, const vmd_dns_addr_t *addrs, size_t count,
                                void *arg);

//  A relay on 127.0.0.1 (a free port) to upstream (an IPv4 address) at port upstream_port
//  (0: 53). NULL when a socket can't be made or upstream is not an IPv4 address.
vmd_dns_t *vmd_dns_new (zloop_t *loop, const char *upstream, uint16_t upstream_port,
                        vmd_dns_policy_fn *policy, vmd_dns_learn_fn *learn, void *arg);
//  Closes the sockets and takes them off the loop; queries in flight are dropped. Safe
//  from any handler of the loop; the relay stays allocated until vmd_dns_destroy.
void vmd_dns_close (vmd_dns_t *self);
//  Closes and frees it. Not from a handler of the loop in the pass that may still call
//  one of the relay's (czmq calls a poller ended in that pass): close it then, destroy
//  it later (vmd_egress retires relays for a while).
void vmd_dns_destroy (vmd_dns_t **self_p);
//  The UDP port it listens on (127.0.0.1).
uint16_t vmd_dns_port (vmd_dns_t *self);
//  Queries answered so far: refused, passed, learned (for logs and tests).
void vmd_dns_counts (vmd_dns_t *self, uint64_t *refused, uint64_t *passed, uint64_t *learned);

//  Parsing, for the relay and its tests. The one question of a message: its name (lower
//  case, no trailing dot) into name (at least 256 bytes), its type and class, and the
//  offset after the question. 0, or -1 when msg is not a DNS message with exactly one
//  question.
int vmd_dns_question (const uint8_t *msg, size_t len, char *name, size_t size, uint16_t *qtype,
                      uint16_t *qclass, size_t *end);
//  The A and AAAA records (class IN) of the answer section, at most max of them, into
//  addrs. How many, or -1 when the message is malformed.
int vmd_dns_addresses (const uint8_t *msg, size_t len, vmd_dns_addr_t *addrs, size_t max);

void vmd_dns_test (bool verbose);

#endif
