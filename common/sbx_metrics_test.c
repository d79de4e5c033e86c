/*  sbx_metrics self-test: what a registry renders, and how expose joins processes. */
#include "sbx_metrics.h"

#include <assert.h>
#include <czmq.h>

static void s_collect (sbx_metrics_t *metrics, void *arg)
{
    int *calls = arg;
    (*calls)++;
    sbx_metrics_clear (metrics, SBX_METRIC_SANDBOXES);
    sbx_metrics_set (metrics, SBX_METRIC_SANDBOXES, *calls, "ready", "small");
}

static bool s_has (const char *text, const char *part)
{
    return strstr (text, part) != NULL;
}

//  text has the line `format` makes with the series' identity labels.
static void s_want (const char *text, const char *format, const char *id)
{
    char want[512];
    snprintf (want, sizeof want, format, id);
    if (!s_has (text, want)) {
        fprintf (stderr, "missing: %s\n", want);
        assert (false);
    }
}

void sbx_metrics_test (bool verbose)
{
    sbx_metrics_t *m = sbx_metrics_new ();
    assert (m);
    char *text = sbx_metrics_samples (m);
    assert (text && streq (text, "")); //  nothing touched, nothing said
    free (text);
    sbx_metrics_set_identity (m, "broker", "host \"a\"\\b\n");

    //  Counters by label; a value read back.
    sbx_metrics_add (m, SBX_METRIC_SANDBOX_OPS_TOTAL, 1, "create", "ok");
    sbx_metrics_add (m, SBX_METRIC_SANDBOX_OPS_TOTAL, 2, "create", "ok");
    sbx_metrics_add (m, SBX_METRIC_SANDBOX_OPS_TOTAL, 1, "stop", "unavailable");
    assert (sbx_metrics_value (m, SBX_METRIC_SANDBOX_OPS_TOTAL, "create", "ok") == 3);
    assert (sbx_metrics_value (m, SBX_METRIC_SANDBOX_OPS_TOTAL, "resume", "ok") == 0);
    //  (reading made no series)
    //  Gauges: set, add, fractions.
    sbx_metrics_set (m, SBX_METRIC_BILLING_LAG_SECONDS, 0.25);
    sbx_metrics_set (m, SBX_METRIC_REQUESTS_PENDING, 5);
    sbx_metrics_add (m, SBX_METRIC_REQUESTS_PENDING, -2);
    //  A histogram: 0.003 and 0.005 fall in le=0.005 (bounds are inclusive), 200 in +Inf.
    sbx_metrics_observe (m, SBX_METRIC_SANDBOX_OP_SECONDS, 0.003, "create");
    sbx_metrics_observe (m, SBX_METRIC_SANDBOX_OP_SECONDS, 0.005, "create");
    sbx_metrics_observe (m, SBX_METRIC_SANDBOX_OP_SECONDS, 3, "create");
    sbx_metrics_observe (m, SBX_METRIC_SANDBOX_OP_SECONDS, 200, "create");
    assert (sbx_metrics_value (m, SBX_METRIC_SANDBOX_OP_SECONDS, "create") == 4);
    //  Label values are escaped: quote, backslash, newline.
    sbx_metrics_add (m, SBX_METRIC_ERRORS_TOTAL, 1, "we\"ird\\\n");
    int calls = 0;
    assert (sbx_metrics_on_collect (m, s_collect, &calls) == 0);

    text = sbx_metrics_samples (m);
    if (verbose)
        printf ("\n%s", text);
    assert (calls == 1);
    const char *id = "daemon=\"broker\",instance=\"host \\\"a\\\"\\\\b\\n\"";
    //  Each series once, with the identity labels first (%s).
    const char *wanted[] = {
        "sbx_sandbox_ops_total{%s,op=\"create\",result=\"ok\"} 3\n",
        "sbx_sandbox_ops_total{%s,op=\"stop\",result=\"unavailable\"} 1\n",
        "sbx_billing_lag_seconds{%s} 0.25\n",
        "sbx_requests_pending{%s} 3\n",
        "sbx_sandbox_op_seconds_bucket{%s,op=\"create\",le=\"0.005\"} 2\n",
        "sbx_sandbox_op_seconds_bucket{%s,op=\"create\",le=\"2.5\"} 2\n",
        "sbx_sandbox_op_seconds_bucket{%s,op=\"create\",le=\"5\"} 3\n",
        "sbx_sandbox_op_seconds_bucket{%s,op=\"create\",le=\"120\"} 3\n",
        "sbx_sandbox_op_seconds_bucket{%s,op=\"create\",le=\"+Inf\"} 4\n",
        "sbx_sandbox_op_seconds_sum{%s,op=\"create\"} 203.00",
        "sbx_sandbox_op_seconds_count{%s,op=\"create\"} 4\n",
        "sbx_errors_total{%s,code=\"we\\\"ird\\\\\\n\"} 1\n",
        "sbx_sandboxes{%s,state=\"ready\",type=\"small\"} 1\n",
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
        s_want (text, wanted[i], id);
    assert (!s_has (text, "# ")); //  samples only
    assert (!s_has (text, "op=\"resume\""));
    //  In definition order, series sorted: create before stop.
    assert (strstr (text, "sbx_sandboxes{") < strstr (text, "sbx_sandbox_ops_total{"));
    assert (strstr (text, "op=\"create\",result") < strstr (text, "op=\"stop\",result"));
    free (text);

    //  A collect function clears and sets afresh; once removed it runs no more.
    text = sbx_metrics_samples (m);
    assert (calls == 2 && s_has (text, "state=\"ready\",type=\"small\"} 2\n"));
    free (text);
    sbx_metrics_off_collect (m, s_collect, &calls);
    sbx_metrics_clear (m, SBX_METRIC_SANDBOXES);
    text = sbx_metrics_samples (m);
    assert (calls == 2 && !s_has (text, "sbx_sandboxes{"));

    //  Exposition: two processes' lines, interleaved, an sbx_up line per process and a
    //  name no definition has; HELP and TYPE once per family, families together.
    sbx_metrics_t *other = sbx_metrics_new ();
    sbx_metrics_set_identity (other, "gateway", "gw1");
    sbx_metrics_add (other, SBX_METRIC_ERRORS_TOTAL, 4, "not_found");
    sbx_metrics_observe (other, SBX_METRIC_OPERATION_SECONDS, 0.02, "exec");
    char *mine = sbx_metrics_samples (other);
    char *up1 = sbx_metrics_line (SBX_METRIC_UP, "broker", "b", 1);
    char *up2 = sbx_metrics_line (SBX_METRIC_UP, "vmd", "v\"1", 0);
    assert (streq (up2, "sbx_up{daemon=\"vmd\",instance=\"v\\\"1\"} 0\n"));
    char *all = zsys_sprintf ("%s%s\n# a comment\nsbx_newer_thing{daemon=\"x\"} 7\n%s%s", up1, text,
                              mine, up2);
    char *exposed = sbx_metrics_expose (all);
    if (verbose)
        printf ("%s", exposed);
    assert (exposed);
    assert (s_has (exposed, "# HELP sbx_up 1 for the broker"));
    assert (s_has (exposed, "# TYPE sbx_up gauge\nsbx_up{daemon=\"broker\",instance=\"b\"} 1\n"
                            "sbx_up{daemon=\"vmd\",instance=\"v\\\"1\"} 0\n"));
    assert (s_has (exposed, "# TYPE sbx_errors_total counter\n"));
    assert (s_has (exposed, "# TYPE sbx_sandbox_op_seconds histogram\n"
                            "sbx_sandbox_op_seconds_bucket{"));
    assert (s_has (exposed, "# TYPE sbx_operation_seconds histogram\n"));
    assert (s_has (exposed,
                   "sbx_errors_total{daemon=\"gateway\",instance=\"gw1\",code=\"not_found\"} 4\n"));
    const char *family = strstr (exposed, "# TYPE sbx_errors_total");
    const char *broker_line = strstr (exposed, "sbx_errors_total{daemon=\"broker\"");
    const char *gateway_line = strstr (exposed, "sbx_errors_total{daemon=\"gateway\"");
    const char *next_family = strstr (family + 1, "# HELP");
    assert (family < broker_line && family < gateway_line);
    assert (!next_family || (broker_line < next_family && gateway_line < next_family));
    //  Each family's HELP and TYPE once.
    assert (strstr (strstr (exposed, "# TYPE sbx_errors_total") + 1, "# TYPE sbx_errors_total") ==
            NULL);
    assert (s_has (
        exposed,
        "a newer peer's).\n# TYPE sbx_newer_thing untyped\nsbx_newer_thing{daemon=\"x\"} 7\n"));
    assert (!s_has (exposed, "# a comment"));
    char *empty = sbx_metrics_expose ("");
    assert (empty && streq (empty, ""));
    free (empty);

    free (exposed);
    free (all);
    free (up1);
    free (up2);
    free (mine);
    free (text);
    sbx_metrics_destroy (&other);
    sbx_metrics_destroy (&m);
    sbx_metrics_destroy (&m); //  twice is fine
    assert (sbx_metrics_here () && sbx_metrics_here () == sbx_metrics_here ());
}
