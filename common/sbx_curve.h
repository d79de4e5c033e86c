/*  sbx_curve - CurveZMQ for tcp:// endpoints between hosts.

    The broker's key pair is generated at first run in DIR/keys/broker.cert (public) and
    DIR/keys/broker.cert_secret. Every client process of a host (workers, CLI) uses that
    host's one client pair, DIR/keys/client.cert (+ _secret), made at first use. The
    public certificates of the hosts allowed to connect live in DIR/keys/allowed/ (one
    file each, zcert format): the operator copies a remote host's keys/client.cert
    there. A host that shares the broker's data directory registers itself.
    ipc:// endpoints need none of this: the run/ directory is 0700.
*/
#ifndef SBX_CURVE_H_INCLUDED
#define SBX_CURVE_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>

#include "sbx_config.h"

//  True when the endpoint goes over the network and so must be encrypted.
bool sbx_curve_needed (const char *endpoint);

//  Starts the authenticator that admits only the public keys in DIR/keys/allowed/ on
//  every CURVE server socket of this process (one per process: ZAP is per context).
//  Returns the actor (destroy it after the sockets), or NULL on error.
zactor_t *sbx_curve_auth_new (sbx_config_t *config);

//  Makes `sock` a CURVE server with the broker's key pair, created at first run.
//  Returns 0 or -1.
int sbx_curve_server (sbx_config_t *config, zsock_t *sock);

//  Makes `sock` a CURVE client with this host's client key pair, trusting the broker's
//  public key from broker.public_key, else from DIR/keys/broker.cert. Returns 0 or -1.
int sbx_curve_client (sbx_config_t *config, zsock_t *sock);

//  This host's client key pair (DIR/keys/client.cert, made at first use), for a server of
//  its own (vmd's ship server: the receiver checks it by its public key). NULL on error.
zcert_t *sbx_curve_host_cert (sbx_config_t *config);

//  Admits public_txt (z85, 40 characters) as DIR/keys/allowed/<name>.cert, unless some
//  file there holds that key already (czmq aborts on a key it holds twice). 0 or -1.
int sbx_curve_allow (sbx_config_t *config, const char *public_txt, const char *name);
//  Removes DIR/keys/allowed/<name>.cert (none there is fine). 0 or -1.
int sbx_curve_disallow (sbx_config_t *config, const char *name);

void sbx_curve_test (bool verbose);

#endif
