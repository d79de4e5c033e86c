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

//  INET6_ADDRSTRLEN: room for any address as text.
#define SBX_NETADDR_TEXT 46
struct sockaddr;
//  The same for a socket address about to be connected to (what libcurl's open-socket
//  callback is given, after resolution, at every connect): writes it as text into ip
//  ("?" for a family other than IPv4 and IPv6, which is not public).
bool sbx_netaddr_socket_public (const struct sockaddr *address, char ip[SBX_NETADDR_TEXT]);

void sbx_netaddr_test (bool verbose);

#endif
