/*  gw_metrics self-test: /metrics on its own listener, without a broker (the gateway's
    own figures and sbx_up 0 for the broker); other paths and methods refused. The
    integration test (tests/integration/test_metrics.py) scrapes a whole service. */
#include "gw_metrics.h"
#include "sbx_metrics.h"

#include <arpa/inet.h>
#include <assert.h>
#include <netinet/in.h>
#include <sys/socket.h>

//  One HTTP/1.0 request to 127.0.0.1:port, from a thread of its own (the loop serves it);
//  the whole answer comes back on the pipe.
static void s_client (zsock_t *pipe, void *args)
{
    char *request = args;
    zsock_signal (pipe, 0);
    int port = atoi (request);
    const char *text = strchr (request, ' ') + 1;
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons ((uint16_t) port)};
    addr.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
    zchunk_t *answer = zchunk_new (NULL, 0);
    if (connect (fd, (struct sockaddr *) &addr, sizeof addr) == 0 &&
        write (fd, text, strlen (text)) == (ssize_t) strlen (text)) {
        char buf[4096];
        ssize_t n;
        while ((n = read (fd, buf, sizeof buf)) > 0)
            zchunk_extend (answer, buf, (size_t) n);
    }
    close (fd);
    zchunk_extend (answer, "", 1);
    zstr_send (pipe, (char *) zchunk_data (answer));
    zchunk_destroy (&answer);
    free (request);
}

static int s_on_answer (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    char **answer = arg;
    *answer = zstr_recv (pipe);
    return -1;
}

static char *s_ask (zloop_t *loop, int port, const char *request)
{
    char *answer = NULL;
    zactor_t *client = zactor_new (s_client, zsys_sprintf ("%d %s", port, request));
    zloop_reader (loop, zactor_sock (client), s_on_answer, &answer);
    zloop_start (loop);
    zloop_reader_end (loop, zactor_sock (client));
    zactor_destroy (&client);
    assert (answer);
    return answer;
}

void gw_metrics_test (bool verbose)
{
    char dir[] = "/tmp/gw_metrics_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    assert (sbx_config_set (config, "metrics.listen", "127.0.0.1:0") == 0);
    assert (sbx_config_set (config, "instance", "gw-test") == 0);
    zloop_t *loop = zloop_new ();
    sbx_metrics_set_identity (sbx_metrics_here (), "gateway", "gw-test");
    sbx_metrics_add (sbx_metrics_here (), SBX_METRIC_RATE_LIMITED_TOTAL, 2, "key");
    gw_metrics_t *metrics = gw_metrics_new (config, loop, NULL, NULL);
    assert (metrics);
    int port = gw_metrics_port (metrics);
    assert (port > 0);

    char *answer = s_ask (loop, port, "GET /metrics HTTP/1.0\r\n\r\n");
    if (verbose)
        printf ("%s\n", answer);
    assert (strstr (answer, "HTTP/1.0 200") == answer || strstr (answer, "HTTP/1.1 200") == answer);
    assert (strstr (answer, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert (strstr (answer,
                    "# TYPE sbx_up gauge\nsbx_up{daemon=\"broker\",instance=\"gw-test\"} 0\n"
                    "sbx_up{daemon=\"gateway\",instance=\"gw-test\"} 1\n"));
    assert (strstr (answer, "# TYPE sbx_rate_limited_total counter\n"
                            "sbx_rate_limited_total{daemon=\"gateway\",instance=\"gw-test\","
                            "limit=\"key\"} 2\n"));
    assert (strstr (answer,
                    "sbx_http_requests_in_flight{daemon=\"gateway\",instance=\"gw-test\"} 0\n"));
    zstr_free (&answer);

    answer = s_ask (loop, port, "GET /v1/sandboxes HTTP/1.0\r\n\r\n");
    assert (strstr (answer, " 404 ") && strstr (answer, "serves GET /metrics only"));
    zstr_free (&answer);
    answer = s_ask (loop, port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    assert (strstr (answer, " 405 ") && strstr (answer, "Allow: GET, HEAD"));
    zstr_free (&answer);

    //  A second listener on the same address cannot be: NULL, and why is logged.
    char taken[64];
    snprintf (taken, sizeof taken, "127.0.0.1:%d", port);
    sbx_config_set (config, "metrics.listen", taken);
    assert (gw_metrics_new (config, loop, NULL, NULL) == NULL);

    gw_metrics_destroy (&metrics);
    gw_metrics_destroy (&metrics);
    zloop_destroy (&loop);
    sbx_config_destroy (&config);
    zdir_t *made = zdir_new (dir, NULL);
    zdir_remove (made, true);
    zdir_destroy (&made);
}
