/*  hook_server - sbx-hookd's work: answers webhook.* requests (routed by the broker),
    follows the broker's event log from the last event it applied (sbx_tapreader), turns
    each event a webhook takes into a pending delivery (hook_store, in the same
    transaction as the seq), and sends the due ones (hook_sender), retrying failures
    with exponential backoff: 1 s, 2 s, 4 s … at most 1 h apart, HOOK_SERVER_ATTEMPTS
    attempts in all, then the delivery is failed.

    Each delivery is POSTed with Sbx-Event-Id: evt_<seq> (the event's place in the log,
    the same in every attempt and after any restart: receivers deduplicate by it) and
    Sbx-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 under the webhook's secret of
    "<t>.<body>">. See docs/webhooks.md.
*/
#ifndef HOOK_SERVER_H_INCLUDED
#define HOOK_SERVER_H_INCLUDED

#include "sbx_common.h"
#include "sbx_config.h"
#include "sbx_peer.h"

#define HOOK_SERVER_ATTEMPTS 16

typedef struct _hook_server_t hook_server_t;

hook_server_t *hook_server_new (sbx_config_t *config);
void hook_server_destroy (hook_server_t **self_p);

//  The peer's request handler (webhook.create, .list, .get, .delete, .deliveries).
void hook_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

//  Starts the tap reader, the sender and the delivery timer on loop. 0 or -1.
int hook_server_start (hook_server_t *self, sbx_peer_t *peer, zloop_t *loop);

//  True when the store failed and the daemon should exit to be restarted.
bool hook_server_failed (hook_server_t *self);

void hook_server_test (bool verbose);

#endif
