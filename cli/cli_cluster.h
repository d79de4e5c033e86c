/*  cli_cluster - several hosts: `sbx cluster init|token|nodes`, `sbx host list|remove`,
    and what `sbx up --join TOKEN` does to a data directory before it starts.

    A join token is "sbxjoin1:" and the base64 of a JSON object: the new host's name and
    roles, the control nodes' addresses, the brokers' public key, the host's own
    CurveZMQ key pair (made and admitted by the broker: cluster.token), and what only
    some roles need: the cluster key (control, billing: the TLS of the dqlite cluster)
    and the brokers' secret key (control). It is a secret: whoever holds it can join.
*/
#ifndef CLI_CLUSTER_H_INCLUDED
#define CLI_CLUSTER_H_INCLUDED

#include "sbx_common.h"

int cli_cluster_main (int argc, char **argv);
int cli_host_main (int argc, char **argv);

//  The ports a joining guest host's vmd.ship and vmd.relay get on its --address.
#define CLI_CLUSTER_SHIP_PORT  7300
#define CLI_CLUSTER_RELAY_PORT 7400

//  Makes the data directory of config a member of the token's cluster: writes the keys
//  the token carries and the settings (instance, roles, control.nodes; for a control
//  node control.address = address and control.join; for a guest host with an address,
//  vmd.ship and vmd.relay on its host part unless sbx.conf has them) into sbx.conf.
//  roles NULL: the token's; else a subset of them. 0, or -1 with a message in why.
int cli_cluster_join (sbx_config_t *config, const char *token, const char *address,
                      const char *roles, char *why, size_t why_size);

void cli_cluster_test (bool verbose);

#endif
