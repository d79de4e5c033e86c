/*  sbx_netaddr - the one judge of which addresses sbx may fetch from or deliver to on
    someone's behalf: the gateway's client ID metadata documents (gw_fetch) and
    sbx-hookd's webhook deliveries refuse every address this calls not public, at every
    connect (after resolution), unless an operator setting allows private ones for tests.
*/
#ifndef SBX_NETADDR_H_INCLUDED
#define SBX_NETADDR_H_INCLUDED

#include <stdbool.h>

//  True when a textual IP address (v4 or v6) is public: not loopback, private, link-local,
//  shared, multicast, unspecified or reserved.
bool sbx_netaddr_public (const char *ip);

void sbx_netaddr_test (bool verbose);

#endif
