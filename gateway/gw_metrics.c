/*  gw_metrics - see gw_metrics.h */
#include "gw_metrics.h"
#include "sbx_metrics.h"

#include <assert.h>

#define S_BROKER_MS 5000 //  a scrape's wait for sys.metrics (Prometheus waits 10 s)

struct gw_metrics_t {
    sbx_config_t *config;
    sbx_peer_t *peer;  //  borrowed; NULL in self-tests
    gw_http_t *public; //  borrowed: its requests in flight are counted
    gw_http_t *http;   //  the metrics listener
    zlistx_t *scrapes; //  s_scrape_t waiting on the broker
    char *broker;      //  the broker's instance, from its last answer
};

//  A scrape waiting for the broker's answer.
typedef struct {
    gw_metrics_t *self;
    gw_request_t *req;
    uint64_t rid;
    void *handle; //  in self->scrapes
} s_scrape_t;

static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    gw_metrics_t *self = arg;
    sbx_metrics_set (metrics, SBX_METRIC_HTTP_REQUESTS_IN_FLIGHT,
                     (double) gw_http_requests (self->public));
}

//  Remembers the broker's instance from its sbx_up line, to say sbx_up 0 for it later.
static void s_learn_broker (gw_metrics_t *self, const char *samples)
{
    const char *prefix = "sbx_up{daemon=\"broker\",instance=\"";
    const char *at = strstr (samples, prefix);
    if (!at)
        return;
    at += strlen (prefix);
    const char *end = strstr (at, "\"}");
    if (!end || end - at > 128)
        return;
    free (self->broker);
    self->broker = strndup (at, (size_t) (end - at));
}

//  Answers with the gateway's own figures and `others` (the broker's answer), or, when
//  the broker did not answer, with sbx_up 0 for it and 1 for this gateway.
static void s_answer (gw_metrics_t *self, gw_request_t *req, const char *others)
{
    char *own = sbx_metrics_samples (sbx_metrics_here ());
    char *up = NULL;
    if (!others) {
        const char *instance = sbx_config_get (self->config, "instance", "local");
        char *broker =
            sbx_metrics_line (SBX_METRIC_UP, "broker", self->broker ? self->broker : instance, 0);
        char *mine = sbx_metrics_line (SBX_METRIC_UP, "gateway", instance, 1);
        up = broker && mine ? zsys_sprintf ("%s%s", broker, mine) : NULL;
        free (broker);
        free (mine);
    }
    char *all = own ? zsys_sprintf ("%s%s", others ? others : up ? up : "", own) : NULL;
    char *text = all ? sbx_metrics_expose (all) : NULL;
    gw_request_add_header (req, "Cache-Control", "no-store");
    if (text)
        gw_request_respond (req, 200, SBX_METRICS_CONTENT_TYPE, text, strlen (text));
    else {
        const char *oom = "out of memory for the metrics (internal)\n";
        gw_request_respond (req, 500, "text/plain; charset=utf-8", oom, strlen (oom));
    }
    free (text);
    zstr_free (&all);
    zstr_free (&up);
    free (own);
}

static void s_scrape_free (gw_metrics_t *self, s_scrape_t **scrape_p)
{
    s_scrape_t *scrape = *scrape_p;
    zlistx_detach (self->scrapes, scrape->handle);
    free (scrape);
    *scrape_p = NULL;
}

//  The client left before the broker answered: forget the request.
static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_scrape_t *scrape = arg;
    if (scrape->self->peer)
        sbx_peer_cancel (scrape->self->peer, scrape->rid);
    s_scrape_free (scrape->self, &scrape);
}

static void s_on_reply (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_scrape_t *scrape = arg;
    gw_metrics_t *self = scrape->self;
    sbx_msg_t *reply = *reply_p;
    const char *samples = NULL;
    if (reply->type == SBX_MSG_SYS_METRICS_OK)
        samples = sbx_msg_sys_metrics_ok (reply)->samples;
    else
        sbx_warn ("metrics: the broker did not answer sys.metrics (%s: %s); serving this "
                  "gateway's own",
                  sbx_code_name (sbx_msg_error (reply)->code), sbx_msg_error (reply)->message);
    if (samples)
        s_learn_broker (self, samples);
    gw_request_t *req = scrape->req;
    gw_request_set_closed_fn (req, NULL, NULL);
    s_scrape_free (self, &scrape);
    s_answer (self, req, samples ? samples : NULL);
}

static void s_text (gw_request_t *req, int status, const char *text)
{
    gw_request_respond (req, status, "text/plain; charset=utf-8", text, strlen (text));
}

static void s_on_request (gw_request_t *req, void *arg)
{
    gw_metrics_t *self = arg;
    const char *method = gw_request_method (req);
    if (!streq (gw_request_path (req), "/metrics")) {
        s_text (req, 404, "not found: this listener serves GET /metrics only (not_found)\n");
        return;
    }
    if (!streq (method, "GET") && !streq (method, "HEAD")) {
        gw_request_add_header (req, "Allow", "GET, HEAD");
        s_text (req, 405, "use GET /metrics (invalid_argument)\n");
        return;
    }
    if (!self->peer || !sbx_peer_welcomed (self->peer)) {
        s_answer (self, req, NULL);
        return;
    }
    s_scrape_t *scrape = calloc (1, sizeof *scrape);
    if (!scrape) {
        s_text (req, 500, "out of memory (internal)\n");
        return;
    }
    scrape->self = self;
    scrape->req = req;
    scrape->handle = zlistx_add_end (self->scrapes, scrape);
    gw_request_set_closed_fn (req, s_on_closed, scrape);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SYS_METRICS);
    //  The reply (or the peer's timeout or unavailable error) comes back from the loop.
    scrape->rid = sbx_peer_request (self->peer, &request, S_BROKER_MS, s_on_reply, scrape);
}

gw_metrics_t *gw_metrics_new (sbx_config_t *config, zloop_t *loop, sbx_peer_t *peer,
                              gw_http_t *http)
{
    assert (config && loop);
    const char *listen = sbx_config_get (config, "metrics.listen", "off");
    assert (!streq (listen, "off"));
    gw_metrics_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->peer = peer;
    self->public = http;
    self->scrapes = zlistx_new ();
    gw_http_options_t options = {.listen = listen, .plain = true, .max_body = 4096};
    self->http = self->scrapes ? gw_http_new (loop, &options, s_on_request, self) : NULL;
    if (!self->http) {
        sbx_error ("metrics.listen = %s: cannot serve /metrics there (see above); set another "
                   "address, or off",
                   listen);
        gw_metrics_destroy (&self);
        return NULL;
    }
    sbx_metrics_on_collect (sbx_metrics_here (), s_collect, self);
    sbx_info ("serving Prometheus metrics on http://%s/metrics (port %d)", listen,
              gw_http_port (self->http));
    return self;
}

void gw_metrics_destroy (gw_metrics_t **self_p)
{
    assert (self_p);
    gw_metrics_t *self = *self_p;
    if (!self)
        return;
    sbx_metrics_off_collect (sbx_metrics_here (), s_collect, self);
    //  The server's held requests get their closed callback: their broker requests go.
    gw_http_destroy (&self->http);
    zlistx_destroy (&self->scrapes);
    free (self->broker);
    free (self);
    *self_p = NULL;
}

int gw_metrics_port (gw_metrics_t *self)
{
    return self ? gw_http_port (self->http) : -1;
}
