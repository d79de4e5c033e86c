/*  sbx_netaddr - see sbx_netaddr.h */
#include "sbx_netaddr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <assert.h>
#include <stdint.h>
#include <string.h>

bool sbx_netaddr_public (const char *ip)
{
    if (!ip)
        return false;
    uint8_t a[16];
    if (inet_pton (AF_INET, ip, a) == 1) {
    v4:
        if (a[0] == 0 || a[0] == 10 || a[0] == 127 || a[0] >= 224)
            return false; //  this network, private, loopback, multicast and reserved
        if (a[0] == 169 && a[1] == 254)
            return false; //  link-local (cloud metadata lives here)
        if (a[0] == 172 && (a[1] & 0xf0) == 16)
            return false;
        if (a[0] == 192 && a[1] == 168)
            return false;
        if (a[0] == 100 && (a[1] & 0xc0) == 64)
            return false; //  shared address space (carrier NAT)
        if (a[0] == 192 && a[1] == 0 && (a[2] == 0 || a[2] == 2))
            return false;
        if (a[0] == 198 && (a[1] & 0xfe) == 18)
            return false; //  benchmarking
        return true;
    }
    if (inet_pton (AF_INET6, ip, a) != 1)
        return false;
    static const uint8_t s_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp (a, s_mapped, 12) == 0) {
        memmove (a, a + 12, 4);
        goto v4;
    }
    static const uint8_t s_zero[15] = {0};
    if (memcmp (a, s_zero, 15) == 0)
        return false; //  :: and ::1
    if ((a[0] & 0xfe) == 0xfc)
        return false; //  unique local
    if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
        return false; //  link-local
    if (a[0] == 0xff)
        return false; //  multicast
    if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8)
        return false; //  documentation
    return true;
}

bool sbx_netaddr_socket_public (const struct sockaddr *address, char ip[SBX_NETADDR_TEXT])
{
    strcpy (ip, "?");
    if (address->sa_family == AF_INET)
        inet_ntop (AF_INET, &((const struct sockaddr_in *) address)->sin_addr, ip,
                   SBX_NETADDR_TEXT);
    else if (address->sa_family == AF_INET6)
        inet_ntop (AF_INET6, &((const struct sockaddr_in6 *) address)->sin6_addr, ip,
                   SBX_NETADDR_TEXT);
    return sbx_netaddr_public (ip);
}

void sbx_netaddr_test (bool verbose)
{
    (void) verbose;
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    char ip[SBX_NETADDR_TEXT];
    inet_pton (AF_INET, "10.0.0.7", &v4.sin_addr);
    assert (!sbx_netaddr_socket_public ((struct sockaddr *) &v4, ip) &&
            strcmp (ip, "10.0.0.7") == 0);
    inet_pton (AF_INET, "93.184.216.34", &v4.sin_addr);
    assert (sbx_netaddr_socket_public ((struct sockaddr *) &v4, ip));
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
    inet_pton (AF_INET6, "::1", &v6.sin6_addr);
    assert (!sbx_netaddr_socket_public ((struct sockaddr *) &v6, ip) && strcmp (ip, "::1") == 0);
    assert (sbx_netaddr_public ("93.184.216.34"));
    assert (sbx_netaddr_public ("2606:4700::1111"));
    assert (!sbx_netaddr_public ("127.0.0.1"));
    assert (!sbx_netaddr_public ("10.1.2.3"));
    assert (!sbx_netaddr_public ("172.20.0.1"));
    assert (sbx_netaddr_public ("172.32.0.1"));
    assert (!sbx_netaddr_public ("192.168.1.1"));
    assert (!sbx_netaddr_public ("169.254.169.254"));
    assert (!sbx_netaddr_public ("100.64.0.1"));
    assert (!sbx_netaddr_public ("0.0.0.0"));
    assert (!sbx_netaddr_public ("::1"));
    assert (!sbx_netaddr_public ("::"));
    assert (!sbx_netaddr_public ("fd00::1"));
    assert (!sbx_netaddr_public ("fe80::1"));
    assert (!sbx_netaddr_public ("::ffff:127.0.0.1"));
    assert (!sbx_netaddr_public ("not an ip"));
}
