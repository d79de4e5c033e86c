/*  gw_fetch - fetches small documents over HTTPS off the loop: OAuth client ID metadata
    documents (a client_id that is an https URL).

    The only module that includes curl/curl.h outside the HTTP module's self-test. A
    worker thread (gw_worker) runs one transfer at a time with hard limits: https only
    (redirects too), at most 3 redirects, 64 KiB, 5 s. Addresses that are private,
    loopback, link-local or otherwise not public are refused after name resolution,
    before connecting, at every hop, unless the operator allows them
   (gateway.oauth_allow_private_fetch, for tests): a client_id must not make the gateway probe the
   operator's own network. gateway.oauth_fetch_ca names an extra CA file to trust (tests serve with
   their own). */
#ifndef GW_FETCH_H_INCLUDED
#define GW_FETCH_H_INCLUDED

#include "sbx_common.h"

typedef struct gw_fetch_t gw_fetch_t;

#define GW_FETCH_MAX_SIZE 65536

//  Called once from the loop: status is the HTTP status of the last response (0 when
//  none came), body and size what it carried (borrowed for the call), error NULL or a
//  sentence saying what went wrong (limits, refused address, TLS, timeout).
typedef void (gw_fetch_fn) (int status, const char *body, size_t size, const char *error,
                            void *arg);

typedef struct {
    bool allow_private;  //  loopback and private addresses allowed (tests)
    const char *ca_file; //  extra CA bundle, or NULL for the system's
} gw_fetch_options_t;

gw_fetch_t *gw_fetch_new (zloop_t *loop, const gw_fetch_options_t *options);

//  Stops the worker (waits for a transfer in flight, at most its 5 s); pending callbacks
//  are not called.
void gw_fetch_destroy (gw_fetch_t **self_p);

//  GETs url with Accept: application/json. Returns a handle, or 0 when fn was already
//  called (with an error).
uint64_t gw_fetch_get (gw_fetch_t *self, const char *url, gw_fetch_fn *fn, void *arg);

//  Forgets a pending fetch: its callback is not called.
void gw_fetch_cancel (gw_fetch_t *self, uint64_t handle);


void gw_fetch_test (bool verbose);

#endif
