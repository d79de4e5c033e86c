/*  sbx_metrics - see sbx_metrics.h */
#include "sbx_metrics.h"

#include <assert.h>
#include <czmq.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>

#define S_MAX_COLLECT 16

typedef struct {
    char **values; //  the metric's own label values, label_count of them
    double value;  //  counters, gauges
    double sum;    //  histograms
    uint64_t count;
    uint64_t *in_bucket; //  per bucket, not cumulative; [bucket_count] is +Inf's
} s_series_t;

typedef struct {
    sbx_metrics_collect_fn *fn;
    void *arg;
    pthread_t thread; //  the one that registered it, and the only one that runs it
} s_collect_t;

struct sbx_metrics_t {
    pthread_mutex_t lock;
    char *daemon;
    char *instance;
    zhashx_t *series[SBX_METRIC__COUNT]; //  joined label values → s_series_t
    s_collect_t collect[S_MAX_COLLECT];
    size_t collect_count;
};

//  A growing string; on failure to grow it keeps what it had and remembers the failure.
typedef struct {
    char *data;
    size_t size, cap;
    bool failed;
} s_buf_t;

static void s_buf_put (s_buf_t *b, const char *text, size_t len)
{
    if (b->failed)
        return;
    if (b->size + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->size + len + 1)
            cap *= 2;
        char *data = realloc (b->data, cap);
        if (!data) {
            b->failed = true;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy (b->data + b->size, text, len);
    b->size += len;
    b->data[b->size] = 0;
}

static void s_buf_puts (s_buf_t *b, const char *text)
{
    s_buf_put (b, text, strlen (text));
}

static void s_buf_printf (s_buf_t *b, const char *format, ...)
{
    char small[256];
    va_list args;
    va_start (args, format);
    int n = vsnprintf (small, sizeof small, format, args);
    va_end (args);
    if (n < 0)
        return;
    if ((size_t) n < sizeof small) {
        s_buf_put (b, small, (size_t) n);
        return;
    }
    char *big = malloc ((size_t) n + 1);
    if (!big) {
        b->failed = true;
        return;
    }
    va_start (args, format);
    vsnprintf (big, (size_t) n + 1, format, args);
    va_end (args);
    s_buf_put (b, big, (size_t) n);
    free (big);
}

//  The string, or NULL (and nothing kept) when it could not be built.
static char *s_buf_take (s_buf_t *b)
{
    if (b->failed || !b->data) {
        free (b->data);
        return b->failed ? NULL : strdup ("");
    }
    return b->data;
}

//  Label values and HELP text escape backslash and newline; label values the quote too.
static void s_buf_escaped (s_buf_t *b, const char *text, bool quote)
{
    for (const char *p = text; *p; p++) {
        if (*p == '\\')
            s_buf_puts (b, "\\\\");
        else if (*p == '\n')
            s_buf_puts (b, "\\n");
        else if (*p == '"' && quote)
            s_buf_puts (b, "\\\"");
        else
            s_buf_put (b, p, 1);
    }
}

//  Integers as integers (counters read better), the rest with full precision.
static void s_buf_value (s_buf_t *b, double v)
{
    if (isnan (v))
        s_buf_puts (b, "NaN");
    else if (isinf (v))
        s_buf_puts (b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor (v) && fabs (v) < 9007199254740992.0)
        s_buf_printf (b, "%.0f", v);
    else
        s_buf_printf (b, "%.17g", v);
}

static void s_series_free (void **item)
{
    s_series_t *s = *item;
    if (!s)
        return;
    for (char **v = s->values; v && *v; v++)
        free (*v);
    free (s->values);
    free (s->in_bucket);
    free (s);
    *item = NULL;
}

sbx_metrics_t *sbx_metrics_new (void)
{
    sbx_metrics_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    pthread_mutex_init (&self->lock, NULL);
    self->daemon = strdup ("unknown");
    self->instance = strdup ("unknown");
    bool ok = self->daemon && self->instance;
    for (int i = 0; ok && i < SBX_METRIC__COUNT; i++) {
        self->series[i] = zhashx_new ();
        ok = self->series[i] != NULL;
        if (ok)
            zhashx_set_destructor (self->series[i], s_series_free);
    }
    if (!ok)
        sbx_metrics_destroy (&self);
    return self;
}

void sbx_metrics_destroy (sbx_metrics_t **self_p)
{
    assert (self_p);
    sbx_metrics_t *self = *self_p;
    if (!self)
        return;
    for (int i = 0; i < SBX_METRIC__COUNT; i++)
        zhashx_destroy (&self->series[i]);
    pthread_mutex_destroy (&self->lock);
    free (self->daemon);
    free (self->instance);
    free (self);
    *self_p = NULL;
}

static sbx_metrics_t *s_here;
static pthread_once_t s_here_once = PTHREAD_ONCE_INIT;

static void s_here_make (void)
{
    s_here = sbx_metrics_new ();
}

sbx_metrics_t *sbx_metrics_here (void)
{
    pthread_once (&s_here_once, s_here_make);
    return s_here;
}

void sbx_metrics_set_identity (sbx_metrics_t *self, const char *daemon, const char *instance)
{
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    char *d = strdup (daemon ? daemon : "unknown"), *i = strdup (instance ? instance : "unknown");
    if (d && i) {
        free (self->daemon);
        free (self->instance);
        self->daemon = d, self->instance = i;
    } else
        free (d), free (i);
    pthread_mutex_unlock (&self->lock);
}

//  The series of id for the label values in args, made when new if `make`; NULL when
//  out of memory (or not there). Under the lock.
static s_series_t *s_series (sbx_metrics_t *self, sbx_metric_t id, va_list args, bool make)
{
    const sbx_metric_def_t *def = &sbx_metric_defs[id];
    const char *values[8] = {0};
    assert (def->label_count <= 8);
    s_buf_t key = {0};
    for (size_t i = 0; i < def->label_count; i++) {
        values[i] = va_arg (args, const char *);
        if (!values[i])
            values[i] = "";
        if (i)
            s_buf_put (&key, "\x1f", 1);
        s_buf_puts (&key, values[i]);
    }
    char *name = s_buf_take (&key);
    if (!name)
        return NULL;
    s_series_t *s = zhashx_lookup (self->series[id], name);
    if (!s && make && (s = calloc (1, sizeof *s))) {
        s->values = calloc (def->label_count + 1, sizeof (char *));
        bool ok = s->values != NULL;
        for (size_t i = 0; ok && i < def->label_count; i++)
            ok = (s->values[i] = strdup (values[i])) != NULL;
        if (ok && def->type == SBX_METRIC_HISTOGRAM)
            ok = (s->in_bucket = calloc (def->bucket_count + 1, sizeof (uint64_t))) != NULL;
        if (ok)
            zhashx_insert (self->series[id], name, s);
        else {
            void *item = s;
            s_series_free (&item);
            s = NULL;
        }
    }
    free (name);
    return s;
}

typedef enum { S_ADD, S_SET, S_OBSERVE } s_verb_t;

static void s_update (sbx_metrics_t *self, sbx_metric_t id, s_verb_t verb, double value,
                      va_list args)
{
    assert (id >= 0 && id < SBX_METRIC__COUNT);
    const sbx_metric_def_t *def = &sbx_metric_defs[id];
    assert (verb == S_OBSERVE ? def->type == SBX_METRIC_HISTOGRAM
            : verb == S_SET   ? def->type == SBX_METRIC_GAUGE
                              : def->type != SBX_METRIC_HISTOGRAM);
    assert (!(def->type == SBX_METRIC_COUNTER && value < 0));
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    s_series_t *s = s_series (self, id, args, true);
    if (s && verb == S_ADD)
        s->value += value;
    else if (s && verb == S_SET)
        s->value = value;
    else if (s) {
        size_t b = 0;
        while (b < def->bucket_count && value > def->buckets[b])
            b++;
        s->in_bucket[b]++;
        s->count++;
        s->sum += value;
    }
    pthread_mutex_unlock (&self->lock);
}

void sbx_metrics_add (sbx_metrics_t *self, sbx_metric_t id, double value, ...)
{
    va_list args;
    va_start (args, value);
    s_update (self, id, S_ADD, value, args);
    va_end (args);
}

void sbx_metrics_set (sbx_metrics_t *self, sbx_metric_t id, double value, ...)
{
    va_list args;
    va_start (args, value);
    s_update (self, id, S_SET, value, args);
    va_end (args);
}

void sbx_metrics_observe (sbx_metrics_t *self, sbx_metric_t id, double value, ...)
{
    va_list args;
    va_start (args, value);
    s_update (self, id, S_OBSERVE, value, args);
    va_end (args);
}

void sbx_metrics_clear (sbx_metrics_t *self, sbx_metric_t id)
{
    assert (id >= 0 && id < SBX_METRIC__COUNT);
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    zhashx_purge (self->series[id]);
    pthread_mutex_unlock (&self->lock);
}

double sbx_metrics_value (sbx_metrics_t *self, sbx_metric_t id, ...)
{
    assert (id >= 0 && id < SBX_METRIC__COUNT);
    if (!self)
        return 0;
    va_list args;
    va_start (args, id);
    pthread_mutex_lock (&self->lock);
    s_series_t *s = s_series (self, id, args, false);
    double value = !s                                                 ? 0
                   : sbx_metric_defs[id].type == SBX_METRIC_HISTOGRAM ? (double) s->count
                                                                      : s->value;
    pthread_mutex_unlock (&self->lock);
    va_end (args);
    return value;
}

int sbx_metrics_on_collect (sbx_metrics_t *self, sbx_metrics_collect_fn *fn, void *arg)
{
    if (!self)
        return -1;
    pthread_mutex_lock (&self->lock);
    int rc = -1;
    if (self->collect_count < S_MAX_COLLECT) {
        self->collect[self->collect_count++] = (s_collect_t){fn, arg, pthread_self ()};
        rc = 0;
    }
    pthread_mutex_unlock (&self->lock);
    return rc;
}

void sbx_metrics_off_collect (sbx_metrics_t *self, sbx_metrics_collect_fn *fn, void *arg)
{
    if (!self)
        return;
    pthread_mutex_lock (&self->lock);
    for (size_t i = 0; i < self->collect_count; i++)
        if (self->collect[i].fn == fn && self->collect[i].arg == arg) {
            memmove (&self->collect[i], &self->collect[i + 1],
                     (self->collect_count - i - 1) * sizeof self->collect[0]);
            self->collect_count--;
            break;
        }
    pthread_mutex_unlock (&self->lock);
}

//  name{daemon="..",instance="..",label="value"...[,le=".."]} — the value follows.
static void s_buf_series (s_buf_t *b, const char *name, const char *suffix, const char *daemon,
                          const char *instance, const sbx_metric_def_t *def, char **values,
                          const char *le)
{
    s_buf_printf (b, "%s%s{daemon=\"", name, suffix);
    s_buf_escaped (b, daemon, true);
    s_buf_puts (b, "\",instance=\"");
    s_buf_escaped (b, instance, true);
    s_buf_puts (b, "\"");
    for (size_t i = 0; def && i < def->label_count; i++) {
        s_buf_printf (b, ",%s=\"", def->labels[i]);
        s_buf_escaped (b, values[i], true);
        s_buf_puts (b, "\"");
    }
    if (le)
        s_buf_printf (b, ",le=\"%s\"", le);
    s_buf_puts (b, "} ");
}

static void s_render_series (s_buf_t *b, sbx_metrics_t *self, const sbx_metric_def_t *def,
                             s_series_t *s)
{
    if (def->type != SBX_METRIC_HISTOGRAM) {
        s_buf_series (b, def->name, "", self->daemon, self->instance, def, s->values, NULL);
        s_buf_value (b, s->value);
        s_buf_puts (b, "\n");
        return;
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= def->bucket_count; i++) {
        char le[64];
        if (i < def->bucket_count)
            snprintf (le, sizeof le, "%g", def->buckets[i]);
        else
            snprintf (le, sizeof le, "+Inf");
        cumulative += s->in_bucket[i];
        s_buf_series (b, def->name, "_bucket", self->daemon, self->instance, def, s->values, le);
        s_buf_printf (b, "%llu\n", (unsigned long long) cumulative);
    }
    s_buf_series (b, def->name, "_sum", self->daemon, self->instance, def, s->values, NULL);
    s_buf_value (b, s->sum);
    s_buf_puts (b, "\n");
    s_buf_series (b, def->name, "_count", self->daemon, self->instance, def, s->values, NULL);
    s_buf_printf (b, "%llu\n", (unsigned long long) s->count);
}

char *sbx_metrics_samples (sbx_metrics_t *self)
{
    if (!self)
        return NULL;
    //  Each collect function reads its owner's state: only its own thread may run it
    //  (self-tests run a broker and its workers in one process).
    s_collect_t mine[S_MAX_COLLECT];
    size_t count = 0;
    pthread_mutex_lock (&self->lock);
    for (size_t i = 0; i < self->collect_count; i++)
        if (pthread_equal (self->collect[i].thread, pthread_self ()))
            mine[count++] = self->collect[i];
    pthread_mutex_unlock (&self->lock);
    for (size_t i = 0; i < count; i++)
        mine[i].fn (self, mine[i].arg);
    s_buf_t b = {0};
    pthread_mutex_lock (&self->lock);
    for (int id = 0; id < SBX_METRIC__COUNT; id++) {
        //  Sorted by label values: a stable order reads and diffs better.
        zlistx_t *keys = zhashx_keys (self->series[id]);
        if (!keys) {
            b.failed = true;
            break;
        }
        zlistx_set_comparator (keys, (zlistx_comparator_fn *) strcmp);
        zlistx_sort (keys);
        for (const char *key = zlistx_first (keys); key; key = zlistx_next (keys))
            s_render_series (&b, self, &sbx_metric_defs[id], zhashx_lookup (self->series[id], key));
        zlistx_destroy (&keys);
    }
    pthread_mutex_unlock (&self->lock);
    return s_buf_take (&b);
}

char *sbx_metrics_line (sbx_metric_t id, const char *daemon, const char *instance, double value)
{
    assert (id >= 0 && id < SBX_METRIC__COUNT);
    const sbx_metric_def_t *def = &sbx_metric_defs[id];
    assert (def->type != SBX_METRIC_HISTOGRAM && def->label_count == 0);
    s_buf_t b = {0};
    s_buf_series (&b, def->name, "", daemon ? daemon : "", instance ? instance : "", NULL, NULL,
                  NULL);
    s_buf_value (&b, value);
    s_buf_puts (&b, "\n");
    return s_buf_take (&b);
}

//  The definition a sample's metric name belongs to (a histogram's _bucket, _sum and
//  _count lines to the histogram), or -1.
static int s_family_of (const char *name, size_t len)
{
    static const char *suffixes[] = {"_bucket", "_sum", "_count"};
    for (int id = 0; id < SBX_METRIC__COUNT; id++) {
        const sbx_metric_def_t *def = &sbx_metric_defs[id];
        size_t n = strlen (def->name);
        if (len < n || memcmp (name, def->name, n))
            continue;
        if (len == n && def->type != SBX_METRIC_HISTOGRAM)
            return id;
        for (size_t s = 0; def->type == SBX_METRIC_HISTOGRAM && s < 3; s++)
            if (len == n + strlen (suffixes[s]) && !memcmp (name + n, suffixes[s], len - n))
                return id;
    }
    return -1;
}

static void s_buf_free (void **item)
{
    s_buf_t *b = *item;
    if (b)
        free (b->data);
    free (b);
    *item = NULL;
}

char *sbx_metrics_expose (const char *samples)
{
    s_buf_t family[SBX_METRIC__COUNT] = {{0}};
    //  Names no definition knows, in the order first seen: name → s_buf_t.
    zhashx_t *unknown = zhashx_new ();
    zlistx_t *unknown_order = zlistx_new ();
    if (!unknown || !unknown_order) {
        zhashx_destroy (&unknown);
        zlistx_destroy (&unknown_order);
        return NULL;
    }
    zhashx_set_destructor (unknown, s_buf_free);
    zlistx_set_duplicator (unknown_order, (zlistx_duplicator_fn *) strdup);
    zlistx_set_destructor (unknown_order, (zlistx_destructor_fn *) zstr_free);
    bool failed = false;
    const char *line = samples ? samples : "";
    while (*line) {
        const char *end = strchr (line, '\n');
        size_t len = end ? (size_t) (end - line) : strlen (line);
        size_t name_len = strspn (line, "abcdefghijklmnopqrstuvwxyz"
                                        "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
        if (len && line[0] != '#' && name_len && name_len <= len &&
            !(line[0] >= '0' && line[0] <= '9')) {
            int id = s_family_of (line, name_len);
            s_buf_t *b = id >= 0 ? &family[id] : NULL;
            if (!b) {
                char name[256];
                snprintf (name, sizeof name, "%.*s", (int) (name_len < 255 ? name_len : 255), line);
                b = zhashx_lookup (unknown, name);
                if (!b && (b = calloc (1, sizeof *b))) {
                    zhashx_insert (unknown, name, b);
                    zlistx_add_end (unknown_order, name);
                }
            }
            if (b) {
                s_buf_put (b, line, len);
                s_buf_put (b, "\n", 1);
                failed |= b->failed;
            } else
                failed = true;
        }
        line += len + (end ? 1 : 0);
    }
    s_buf_t out = {0};
    for (int id = 0; id < SBX_METRIC__COUNT; id++) {
        const sbx_metric_def_t *def = &sbx_metric_defs[id];
        if (!family[id].data)
            continue;
        s_buf_printf (&out, "# HELP %s ", def->name);
        s_buf_escaped (&out, def->help, false);
        s_buf_printf (&out, "\n# TYPE %s %s\n", def->name,
                      def->type == SBX_METRIC_COUNTER ? "counter"
                      : def->type == SBX_METRIC_GAUGE ? "gauge"
                                                      : "histogram");
        s_buf_puts (&out, family[id].data);
        free (family[id].data);
    }
    for (const char *name = zlistx_first (unknown_order); name;
         name = zlistx_next (unknown_order)) {
        s_buf_t *b = zhashx_lookup (unknown, name);
        s_buf_printf (&out,
                      "# HELP %s Not defined in this sbx version's metrics (a newer peer's).\n"
                      "# TYPE %s untyped\n",
                      name, name);
        s_buf_puts (&out, b->data);
    }
    zhashx_destroy (&unknown);
    zlistx_destroy (&unknown_order);
    if (failed)
        out.failed = true;
    return s_buf_take (&out);
}
