/*  gw_metrics - Prometheus /metrics, on a listener of its own (metrics.listen).

    The gateway is where the whole service is scraped: GET /metrics answers the
    gateway's own metrics and those of the broker and every worker connected to it,
    which the broker hands over in one sys.metrics reply from what it keeps (each
    worker's latest, sent with its heartbeat), so a scrape waits on no worker. Each
    series is labelled with its daemon and instance; sbx_up says which daemons are
    connected (a broker the gateway cannot reach: sbx_up 0 for it, and the gateway's own
    figures still). Text format 0.0.4 (sbx_metrics.h); docs/metrics.md lists the metrics.

    Access is the listener's: plain HTTP on an address of its own, off by default, for
    the operator to put on loopback or a private network (the public `listen` serves no
    /metrics). Nothing here blocks: a scrape is answered from the loop when the broker's
    reply comes, or after its deadline with what the gateway has.
*/
#ifndef GW_METRICS_H_INCLUDED
#define GW_METRICS_H_INCLUDED

#include "gw_http.h"
#include "sbx_common.h"

typedef struct gw_metrics_t gw_metrics_t;

//  Serves /metrics on metrics.listen with the peer (borrowed: the broker connection);
//  counts `http`'s requests in flight (borrowed, the public server; may be NULL).
//  NULL when the address can't be bound (logged). Not to be called with metrics.listen
//  = off.
gw_metrics_t *gw_metrics_new (sbx_config_t *config, zloop_t *loop, sbx_peer_t *peer,
                              gw_http_t *http);
void gw_metrics_destroy (gw_metrics_t **self_p);

//  The port it listens on (the chosen one for port 0).
int gw_metrics_port (gw_metrics_t *self);

void gw_metrics_test (bool verbose);

#endif
