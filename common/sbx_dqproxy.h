/*  sbx_dqproxy - dqlite's connections between hosts, over TLS with the cluster's key
    (and, with another key, published guest ports between a gateway and a vmd host:
    routed listeners, below).

    dqlite 1.11 speaks plain TCP and has no authentication: anyone who can reach a node's
    port could read and write every database. So no node listens on the network. Each
    node listens on an abstract Unix socket of its own process (which accepts only that
    process's connections), and this proxy stands in front of it on the node's cluster
    address: it accepts TLS 1.3 connections whose peer proves the cluster's pre-shared
    key (PSK with ECDHE: forward secrecy), and relays their bytes to the node. The other
    way, a node dialing a peer (Raft), or a client of the cluster (billing, the CLI),
    gets one end of a socket pair whose other end the proxy relays over TLS to the peer's
    proxy. A connection that fails the handshake is closed before a byte reaches a node.

        sbx_dqproxy_t *proxy = sbx_dqproxy_new (key, 32);
        sbx_dqproxy_listen (proxy, "10.0.0.1:9001", "@sbx-node");   //  in front of a node
        int fd = sbx_dqproxy_dial ("10.0.0.2:9001", 2000, proxy);   //  to another one

    One thread relays every connection of the process (poll), with bounded buffers in
    each direction: a side that does not read slows the other down (TCP's own back
    pressure), it never grows memory without bound. When either side closes or fails,
    both are closed, as a TCP connection between them would be.

    The key: 32 random bytes, DIR/keys/cluster.key (hex, 0600), made by the first node of
    a cluster and handed to the others in the join token.
*/
#ifndef SBX_DQPROXY_H_INCLUDED
#define SBX_DQPROXY_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include "sbx_config.h"
#include "sbx_dqlite.h"

#define SBX_DQPROXY_KEY_SIZE 32

typedef struct _sbx_dqproxy_t sbx_dqproxy_t;

//  Starts the relay thread with the cluster key (exactly SBX_DQPROXY_KEY_SIZE bytes).
//  NULL (logged) on failure.
sbx_dqproxy_t *sbx_dqproxy_new (const unsigned char *key, size_t size);
//  Closes every connection and stops the thread. Safe on NULL.
void sbx_dqproxy_destroy (sbx_dqproxy_t **self_p);

//  Accepts TLS connections on address (HOST:PORT) and relays each to target: "@name"
//  (an abstract socket of this process) or HOST:PORT. 0, or -1 (logged) when address
//  cannot be bound.
int sbx_dqproxy_listen (sbx_dqproxy_t *self, const char *address, const char *target);

//  A routed listener: each proven peer's first line (up to 127 bytes, ending in '\n') is
//  given to route, which answers the target to relay it to (HOST:PORT or "@name",
//  malloc'd: the proxy frees it) or NULL to refuse it (the connection is closed). route
//  runs in the relay thread: it must be thread-safe and quick. What the peer sent after
//  the line goes to the target. 0, or -1 (logged) when address cannot be bound.
typedef char *(sbx_dqproxy_route_fn) (const char *line, void *arg);
int sbx_dqproxy_listen_routed (sbx_dqproxy_t *self, const char *address,
                               sbx_dqproxy_route_fn *route, void *arg);

//  A connection to a routed listener at address (a numeric HOST:PORT), asking for line
//  (no '\n'): a connected stream socket at once, the caller's to close and to write to
//  now; the connect and the handshake happen in the relay thread, and a failure (or a
//  refusal) closes the socket, as a refused TCP connection would. Never blocks: for an
//  event loop. -1 on a bad argument.
int sbx_dqproxy_dial_routed (sbx_dqproxy_t *self, const char *address, const char *line);

//  A connection to the node at address through its proxy: a connected stream socket of
//  this process (the caller's to close), or -1 when the peer cannot be reached or does
//  not prove the cluster's key within timeout_ms. The argument order fits
//  sbx_dqlite_dial_fn; arg is the proxy.
int sbx_dqproxy_dial (const char *address, int timeout_ms, void *arg);
//  The same for a dqlite node of this process dialing its peers (sbx_dqnode_dial_fn).
int sbx_dqproxy_node_dial (const char *address, void *arg);

//  Connections being relayed now, for tests and metrics.
size_t sbx_dqproxy_connections (sbx_dqproxy_t *self);

//  Reads the cluster key from path (64 hex digits), or makes a new one there (0600)
//  when create is true and the file does not exist. 0, or -1 (logged).
int sbx_dqproxy_key_load (const char *path, bool create, unsigned char *key);

//  A key of its own for another use of the relay, made from the cluster key:
//  HMAC-SHA256 (cluster key, label) (e.g. "sbx ports relay": every control node derives the
//  same one, and it opens nothing of dqlite). 0, or -1.
int sbx_dqproxy_derive (const unsigned char *key, const char *label,
                        unsigned char out[SBX_DQPROXY_KEY_SIZE]);
//  Reads a key given as 64 hex digits. 0, or -1.
int sbx_dqproxy_key_hex (const char *hex, unsigned char out[SBX_DQPROXY_KEY_SIZE]);

//  What a client of this host's cluster needs, from its settings: control.nodes, a proxy
//  with DIR/keys/cluster.key, and where (sbx_dqlite_cluster_t, following the leader,
//  timeout 5 s) pointing at both. 0, or -1 when either is missing (nothing to free).
//  The caller frees *nodes (sbx_config_list_free) and *proxy after the last use of where.
int sbx_dqproxy_cluster (sbx_config_t *config, char ***nodes, sbx_dqproxy_t **proxy,
                         sbx_dqlite_cluster_t *where);

void sbx_dqproxy_test (bool verbose);

#endif
