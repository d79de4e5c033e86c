/*  vmd_relay - published ports reached from gateways on other hosts.

    A guest's published port is a QEMU forward on this host's loopback (vmd_guest): a
    gateway on this host connects to it, one on another host cannot. With vmd.relay set
    (HOST:PORT, an address the gateways reach), vmd listens there for TLS 1.3
    connections that prove the ports key (sbx_dqproxy's routed listener; the key is made
    from the cluster key and handed to gateways and vmds by the broker, in their
    welcome), reads the forward's host port as the connection's first line, and relays
    the connection to 127.0.0.1:that port, only when it is one of this host's forwards
    now. The broker tells gateways the relay with each port it resolves.

    The listener starts once the key is known (a cluster's broker welcomed this vmd); on
    one machine, without a cluster, there is none (the gateway is beside the forwards).
*/
#ifndef VMD_RELAY_H_INCLUDED
#define VMD_RELAY_H_INCLUDED

#include "sbx_common.h"

typedef struct _vmd_relay_t vmd_relay_t;

//  With vmd.relay unset, an idle relay (nothing listens). NULL on error.
vmd_relay_t *vmd_relay_new (sbx_config_t *config);
void vmd_relay_destroy (vmd_relay_t **self_p);

//  From the loop, often (and as soon as a forward is added, before its answer goes out):
//  starts listening once key (hex, or NULL) is known, and makes the guests' forwards
//  (id → vmd_guest_t) the ports the relay admits.
void vmd_relay_tick (vmd_relay_t *self, const char *key, zhashx_t *guests);

//  Does the relay admit this host port now? (For the self-test.)
bool vmd_relay_admits (vmd_relay_t *self, int host_port);

void vmd_relay_test (bool verbose);

#endif
