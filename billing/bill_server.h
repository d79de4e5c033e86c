/*  bill_server - sbx-billing's work inside one loop: opens billing.db, follows the
    broker's event log with an sbx_tapreader from the last event billing applied, meters
    each event (bill_meter) and answers the requests the broker routes to billing
    (usage.get).

    After a kill -9 the next start resumes from the seq committed with the last charges,
    so every event is applied exactly once. When the store fails the reader stops, which
    ends the loop: the process exits non-zero and its supervisor restarts it, and the
    replay picks up where the last commit left off.
*/
#ifndef BILL_SERVER_H_INCLUDED
#define BILL_SERVER_H_INCLUDED

#include "bill_meter.h"
#include "sbx_common.h"

typedef struct _bill_server_t bill_server_t;

//  Opens DIR/billing/billing.db and reads the rates from config (borrowed).
bill_server_t *bill_server_new (sbx_config_t *config);
void bill_server_destroy (bill_server_t **self_p);

//  The request handler to give the peer (arg: the server). Takes usage.get; anything
//  else is answered invalid_argument.
void bill_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg);

//  Starts following the log through the (started) peer on loop.
int bill_server_start (bill_server_t *self, sbx_peer_t *peer, zloop_t *loop);

//  The seq of the last event applied, and whether applying one failed.
uint64_t bill_server_last_seq (bill_server_t *self);
bool bill_server_failed (bill_server_t *self);

//  billing as a czmq actor (for tests; the self-test that drives it against a real
//  broker is in bill_selftest.c, as it links the broker): args is the sbx_config_t. Sends "READY"
//  or "FAILED" once started. Commands: "SEQ" → the last applied seq as a string; "USAGE" ACCOUNT →
//  one frame, the encoded answer to usage.get from an operator;
//  "$TERM" stops it.
void bill_server_actor (zsock_t *pipe, void *args);

#endif
