/*  hook_sender - webhook POSTs with libcurl's multi interface inside the daemon's zloop:
    curl's sockets become zloop pollers and its timeout a zloop timer, so no transfer
    ever blocks the loop (the resolver is curl's threaded one).

    Every connect, redirects included (none are followed), goes through sbx_netaddr's
    check of the resolved address: private, loopback and link-local addresses are refused
    unless allow_private (webhooks.allow_private, for tests).
*/
#ifndef HOOK_SENDER_H_INCLUDED
#define HOOK_SENDER_H_INCLUDED

#include "sbx_common.h"

typedef struct _hook_sender_t hook_sender_t;

//  A POST ended: status is the HTTP status (0 when none came), error why it failed
//  ("" when an answer came, whatever its status).
typedef void (hook_sender_fn) (int64_t tag, long status, const char *error, void *arg);

hook_sender_t *hook_sender_new (zloop_t *loop, bool allow_private, const char *ca_file,
                                hook_sender_fn *fn, void *arg);
void hook_sender_destroy (hook_sender_t **self_p);

//  Starts a POST of body (JSON) to url with extra header lines; fn gets tag at its end.
//  0, or -1 when it could not start (fn is not called).
int hook_sender_post (hook_sender_t *self, int64_t tag, const char *url, const char *body,
                      const char *const *headers);

//  Transfers under way.
size_t hook_sender_active (hook_sender_t *self);

#endif
