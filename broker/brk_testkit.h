/*  brk_testkit - what the broker's self-tests share: raw DEALER clients that speak the
    codec, and sbx_peer workers in threads of their own. Real sockets, a real broker:
    the workers play vmd or gateway at the protocol level so the broker's own logic
    (routing, deadlines, the sandbox state machine) can be tested alone. */
#ifndef BRK_TESTKIT_H_INCLUDED
#define BRK_TESTKIT_H_INCLUDED

#include "sbx_common.h"

//  One frame off a DEALER, decoded (asserts it decodes); NULL after timeout_ms.
sbx_msg_t *brk_testkit_recv (zsock_t *sock, int timeout_ms);

//  Encodes and sends (asserts both work). Takes the message.
void brk_testkit_send (zsock_t *sock, sbx_msg_t **msg_p);

//  Sends a request with `rid` (as an operator when it has no caller) and returns the
//  reply with that rid, skipping anything else; asserts one comes within 10 s.
sbx_msg_t *brk_testkit_call (zsock_t *sock, sbx_msg_t *request, uint64_t rid);

//  A broker of its own, ready, in a new directory under /tmp named after the test, with
//  heartbeat_ms 100 and the settings given ("key", "value", ..., NULL), and a client.
typedef struct {
    char dir[96];
    sbx_config_t *config;
    zactor_t *server;
    zsock_t *client;
} brk_testkit_broker_t;
void brk_testkit_broker_start (brk_testkit_broker_t *self, const char *name, ...);
//  Stops it and removes its directory.
void brk_testkit_broker_stop (brk_testkit_broker_t *self);

//  A DEALER connected to the broker of `config`.
zsock_t *brk_testkit_dealer (sbx_config_t *config);

//  A worker thread: an sbx_peer of `role` named `instance` with `capacity`, which hands
//  requests to fn (in its own thread) and answers sys.status itself when fn is NULL.
zactor_t *brk_testkit_worker (sbx_config_t *config, sbx_role_t role, const char *instance,
                              uint64_t capacity, sbx_peer_request_fn *fn, void *arg);

//  Has the worker send `msg` to the broker from its own connection. Takes the message.
void brk_testkit_worker_send (zactor_t *worker, sbx_msg_t **msg_p);

//  The success reply a vmd gives to vm.create, vm.stop, vm.resume or vm.delete (same rid,
//  same sandbox_id), or NULL for any other request: the protocol-level vmd of tests.
sbx_msg_t *brk_testkit_vm_ok (const sbx_msg_t *request);

//  How many workers of `role` the broker lists now.
size_t brk_testkit_peer_count (zsock_t *client, sbx_role_t role, uint64_t rid);

//  Creates an account for email; returns its id (fresh string).
char *brk_testkit_account (zsock_t *client, const char *email, uint64_t rid);

//  The error code of a reply, or SBX_OK for any other answer.
sbx_code_t brk_testkit_code (const sbx_msg_t *reply);

//  A caller of kind api_key for `account` (key `key_id`, `preset`), for requests.
sbx_caller_t *brk_testkit_caller (const char *account, const char *key_id, sbx_key_preset_t preset);

#endif
