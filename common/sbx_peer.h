/*  sbx_peer - a process's connection to the broker, driven from its zloop.

    Workers (gateway, vmd, snapshotd, billing) say hello with their role, instance and
    capacity, heartbeat, say hello again when the broker answers peer.unknown or falls
    silent (it restarted), and receive requests routed to them; one whose instance name
    another live worker of its role holds is refused (error `conflict`) and stops. Every
    process, the CLI included, sends requests through it: each gets a fresh request id,
    and the reply (or a timeout/unavailable error) comes back to the callback given with
    the request, from the loop. Nothing here ever blocks: a send that can't go out now is
    dropped and the request fails with `unavailable`, so a slow or absent broker never
    stalls a loop.
*/
#ifndef SBX_PEER_H_INCLUDED
#define SBX_PEER_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>

#include "sbx_config.h"
#include "sbx_msg.h"

typedef struct sbx_peer_t sbx_peer_t;

//  A request routed to this worker. The handler owns *request_p (set it to NULL or let
//  the peer destroy what is left) and must answer once with sbx_peer_send, now or later,
//  echoing the request's rid (sbx_msg_new_reply / sbx_msg_new_error do that).
typedef void (sbx_peer_request_fn) (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

//  The answer to one of our requests: a reply, or an error message (type error) that the
//  broker sent or that the peer made up for a timeout or a lost broker. `reply` is
//  borrowed for the call; take it with *reply_p = NULL ownership semantics if needed.
typedef void (sbx_peer_reply_fn) (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg);

//  Called after every welcome (the first one means the process is connected; later ones
//  follow a broker restart).
typedef void (sbx_peer_welcome_fn) (sbx_peer_t *peer, bool first, void *arg);

//  Creates a peer of `role` (SBX_ROLE_CLI for clients that don't register). instance
//  NULL means the config's instance. Returns NULL when the socket can't be set up.
sbx_peer_t *sbx_peer_new (sbx_config_t *config, sbx_role_t role, const char *instance);
void sbx_peer_destroy (sbx_peer_t **self_p);

void sbx_peer_set_request_fn (sbx_peer_t *self, sbx_peer_request_fn *fn, void *arg);
void sbx_peer_set_welcome_fn (sbx_peer_t *self, sbx_peer_welcome_fn *fn, void *arg);

//  Capacity and use announced in hello and heartbeats.
void sbx_peer_set_capacity (sbx_peer_t *self, uint64_t capacity, uint64_t used);

//  Connects, says hello (workers) and registers the socket and timers with the loop.
int sbx_peer_start (sbx_peer_t *self, zloop_t *loop);

//  Sends a message (a reply, a heartbeat, a bye). Takes ownership. Returns 0, or -1 when
//  it could not go out now (no broker connection).
int sbx_peer_send (sbx_peer_t *self, sbx_msg_t **msg_p);

//  Sends a request with a new rid and calls fn with the reply, or with an error of code
//  timeout after timeout_ms (0 = request_timeout_ms), or unavailable when it could not
//  be sent or the broker went away. Takes ownership of the request. Returns the rid.
uint64_t sbx_peer_request (sbx_peer_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                           sbx_peer_reply_fn *fn, void *arg);

//  Forgets a pending request: its callback will not be called.
void sbx_peer_cancel (sbx_peer_t *self, uint64_t rid);

//  Tells the broker we leave (workers), best effort.
void sbx_peer_bye (sbx_peer_t *self, const char *reason);

bool sbx_peer_welcomed (sbx_peer_t *self);

//  True once the broker refused this worker for good: another live worker of its role
//  has its instance name (the broker's error, logged, says which). The peer then ended
//  the loop (zloop_start returns) and says no hello and no heartbeat any more; the
//  process should exit non-zero rather than take the name back and forth.
bool sbx_peer_refused (sbx_peer_t *self);

//  A cluster's control nodes (HOST:PORT) as the last welcome named them, NULL-terminated;
//  NULL before one did, and on one machine. Borrowed: valid until the next welcome.
const char *const *sbx_peer_nodes (sbx_peer_t *self);

//  The key of the relay for published ports between hosts (64 hex digits), as a cluster
//  broker's welcome gave it to a gateway or vmd; NULL before, and on one machine.
const char *sbx_peer_ports_key (sbx_peer_t *self);

sbx_role_t sbx_peer_role (sbx_peer_t *self);
const char *sbx_peer_instance (sbx_peer_t *self);

void sbx_peer_test (bool verbose);

#endif
