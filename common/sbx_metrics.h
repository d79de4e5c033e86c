/*  sbx_metrics - a process's metrics, in the Prometheus text exposition format 0.0.4.

    Every metric is defined once, in schemas/metrics.json (name, type, labels, buckets,
    help; docs/metrics.md lists them), and named here by its generated id
    (SBX_METRIC_..., sbx_metrics_gen.h). A registry keeps the series a process has
    touched: counters, gauges and histograms with the definition's fixed buckets, each
    series labelled with the process's daemon and instance and the metric's own labels.

    The registry renders sample lines only (no HELP or TYPE): those travel from the
    workers to the broker with their heartbeats and from the broker to the gateway
    (sys.metrics), and sbx_metrics_expose turns the lines of any number of processes into
    one exposition, a family per definition with its HELP and TYPE once.

    Updates lock a mutex, so a worker thread may count too; collect functions, which
    refresh gauges that are cheaper to read than to track (queue sizes, counts from a
    store), run from sbx_metrics_samples before rendering, and only when the thread
    that registered them renders (they read their owner's state, which only that
    thread touches).
*/
#ifndef SBX_METRICS_H_INCLUDED
#define SBX_METRICS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

#include "sbx_metrics_gen.h"

typedef struct sbx_metrics_t sbx_metrics_t;

//  A registry of its own (self-tests); processes use sbx_metrics_here ().
sbx_metrics_t *sbx_metrics_new (void);
void sbx_metrics_destroy (sbx_metrics_t **self_p);

//  The process's registry, made on first use (daemon and instance "unknown" until
//  sbx_metrics_set_identity; sbx_daemon sets them). Never NULL but out of memory.
sbx_metrics_t *sbx_metrics_here (void);

//  The daemon ("broker", "vmd"...) and instance every series is labelled with.
void sbx_metrics_set_identity (sbx_metrics_t *self, const char *daemon, const char *instance);

//  The updates: after the value come exactly the metric's label values, as strings, in
//  its definition's order (NULL reads as ""). A wrong kind of update for the metric's
//  type is a programmer's error (assert).
//  Counters and gauges: adds value (a counter only grows: value >= 0).
void sbx_metrics_add (sbx_metrics_t *self, sbx_metric_t id, double value, ...);
//  Gauges: sets the value.
void sbx_metrics_set (sbx_metrics_t *self, sbx_metric_t id, double value, ...);
//  Histograms: counts one observation (seconds, say) in its bucket, sum and count.
void sbx_metrics_observe (sbx_metrics_t *self, sbx_metric_t id, double value, ...);
//  Forgets every series of a metric: a collect function clears a gauge by labels
//  (sandboxes by state) before setting what is there now, so a state emptied goes.
void sbx_metrics_clear (sbx_metrics_t *self, sbx_metric_t id);

//  The value of one series (counters, gauges; histograms: its count), 0 if untouched.
double sbx_metrics_value (sbx_metrics_t *self, sbx_metric_t id, ...);

//  Collect functions run before each render by the thread that registered them (not
//  when another thread renders). Remove before arg is freed. -1 when 16 are set.
typedef void (sbx_metrics_collect_fn) (sbx_metrics_t *metrics, void *arg);
int sbx_metrics_on_collect (sbx_metrics_t *self, sbx_metrics_collect_fn *fn, void *arg);
void sbx_metrics_off_collect (sbx_metrics_t *self, sbx_metrics_collect_fn *fn, void *arg);

//  Runs the collect functions and renders every series as sample lines, newline
//  terminated, in definition order. Caller frees. NULL when out of memory.
char *sbx_metrics_samples (sbx_metrics_t *self);

//  One sample line for a metric without labels of its own about another process
//  (the broker's sbx_up for each worker): "name{daemon="..",instance=".."} value\n".
//  Caller frees.
char *sbx_metrics_line (sbx_metric_t id, const char *daemon, const char *instance, double value);

//  The exposition of sample lines from any number of processes: for each metric family
//  its HELP and TYPE lines, then its samples, families in definition order. Lines of
//  names that are not defined here (a newer peer's) come last, as untyped. Blank and
//  '#' lines are dropped. Caller frees; NULL when out of memory.
char *sbx_metrics_expose (const char *samples);

//  The content type of sbx_metrics_expose's text.
#define SBX_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

void sbx_metrics_test (bool verbose);

#endif
