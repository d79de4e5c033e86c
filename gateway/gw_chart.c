/*  gw_chart - see gw_chart.h */
#include "gw_chart.h"
#include "gw_pages.h"

#include <assert.h>
#include <time.h>

#define S_WIDTH  600
#define S_HEIGHT 150
#define S_TOP    16 //  room for the largest figure
#define S_BOTTOM 20 //  room for the dates

//  "2026-11-30" as seconds since the epoch (UTC midnight), or -1.
static int64_t s_day_start (const char *day)
{
    struct tm tm = {0};
    const char *end = day ? strptime (day, "%Y-%m-%d", &tm) : NULL;
    if (!end || *end)
        return -1;
    return (int64_t) timegm (&tm);
}

static void s_day_name (int64_t start, char out[16])
{
    time_t t = (time_t) start;
    struct tm tm;
    gmtime_r (&t, &tm);
    strftime (out, 16, "%Y-%m-%d", &tm);
}

//  "3 h 05 min", "12 min 3 s", "41 s": what a person reads at a glance.
static void s_duration (uint64_t seconds, char *out, size_t size)
{
    if (seconds >= 3600)
        snprintf (out, size, "%llu h %02llu min", (unsigned long long) (seconds / 3600),
                  (unsigned long long) (seconds % 3600 / 60));
    else if (seconds >= 60)
        snprintf (out, size, "%llu min %llu s", (unsigned long long) (seconds / 60),
                  (unsigned long long) (seconds % 60));
    else
        snprintf (out, size, "%llu s", (unsigned long long) seconds);
}

int gw_chart_write (FILE *out, const char *id, const char *title, const gw_chart_day_t *days,
                    size_t count, const char *today, int span)
{
    int64_t last = s_day_start (today);
    if (last < 0 || span < 1 || span > 366)
        return -1;
    //  The span's figures, oldest first.
    uint64_t seconds[366] = {0};
    const char *costs[366] = {0};
    uint64_t max = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t start = s_day_start (days[i].day);
        int64_t back = start < 0 ? -1 : (last - start) / 86400;
        if (start < 0 || start > last || back >= span)
            continue;
        int slot = span - 1 - (int) back;
        seconds[slot] += days[i].seconds;
        costs[slot] = days[i].cost;
        if (seconds[slot] > max)
            max = seconds[slot];
    }
    char total_text[48], max_text[48];
    uint64_t total = 0;
    for (int i = 0; i < span; i++)
        total += seconds[i];
    s_duration (total, total_text, sizeof total_text);
    s_duration (max, max_text, sizeof max_text);
    fputs ("<figure class=\"chart\" id=\"", out);
    gw_pages_put (out, id);
    fputs ("\"><figcaption>", out);
    gw_pages_put (out, title);
    fprintf (out, ": %s in all</figcaption>\n", total_text);
    fprintf (out,
             "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" role=\"img\" "
             "aria-label=\"",
             S_WIDTH, S_HEIGHT);
    gw_pages_put (out, title);
    fprintf (out, ": running time per day, %d days, %s in all\" data-span=\"%d\">\n", span,
             total_text, span);
    int plot = S_HEIGHT - S_TOP - S_BOTTOM;
    double step = (double) S_WIDTH / span;
    double width = step > 4 ? step * 0.8 : step;
    fprintf (out,
             "<line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\" stroke-width=\"1\"/>\n",
             S_TOP + plot, S_WIDTH, S_TOP + plot);
    if (max)
        fprintf (out,
                 "<text x=\"2\" y=\"11\" font-size=\"11\" fill=\"#666\">%s (highest day)</text>\n",
                 max_text);
    for (int i = 0; i < span; i++) {
        char day[16], text[48];
        s_day_name (last - (int64_t) (span - 1 - i) * 86400, day);
        s_duration (seconds[i], text, sizeof text);
        int height = max ? (int) ((double) seconds[i] * plot / (double) max + 0.5) : 0;
        if (seconds[i] && height < 1)
            height = 1; //  a day that ran shows
        fprintf (out,
                 "<rect class=\"bar\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
                 "fill=\"#3b7dd8\" data-day=\"%s\" data-seconds=\"%llu\"><title>%s: %s, ",
                 step * i + (step - width) / 2, S_TOP + plot - height, width, height, day,
                 (unsigned long long) seconds[i], day, text);
        gw_pages_put (out, costs[i] ? costs[i] : "$0.000000");
        fputs ("</title></rect>\n", out);
        //  The first, middle and last dates under the axis.
        if (i == 0 || i == span - 1 || i == span / 2)
            fprintf (out,
                     "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" fill=\"#666\" "
                     "text-anchor=\"%s\">%s</text>\n",
                     i == 0          ? 0.0
                     : i == span - 1 ? (double) S_WIDTH
                                     : step * i + step / 2,
                     S_HEIGHT - 5,
                     i == 0          ? "start"
                     : i == span - 1 ? "end"
                                     : "middle",
                     day + 5);
    }
    fputs ("</svg>\n<details><summary>As a table</summary><table><tr><th>Day (UTC)</th>"
           "<th>Running time</th><th>Cost</th></tr>\n",
           out);
    bool any = false;
    for (int i = span - 1; i >= 0; i--) { //  the newest first
        if (!seconds[i])
            continue;
        char day[16], text[48];
        s_day_name (last - (int64_t) (span - 1 - i) * 86400, day);
        s_duration (seconds[i], text, sizeof text);
        fprintf (out, "<tr><td>%s</td><td>%s</td><td>", day, text);
        gw_pages_put (out, costs[i]);
        fputs ("</td></tr>\n", out);
        any = true;
    }
    if (!any)
        fputs ("<tr><td colspan=\"3\">No running time in these days.</td></tr>\n", out);
    fputs ("</table></details></figure>\n", out);
    return 0;
}

#define S_SPARK_W 120
#define S_SPARK_H 24

int gw_chart_spark (FILE *out, const char *kind, const char *label, const double *values,
                    size_t count, double max)
{
    if (!count)
        return 0;
    if (max <= 0)
        return -1;
    fputs ("<span class=\"spark ", out);
    gw_pages_put (out, kind);
    fprintf (out, "\"><svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\">",
             S_SPARK_W, S_SPARK_H, S_SPARK_W, S_SPARK_H);
    fputs ("<title>", out);
    gw_pages_put (out, label);
    fputs ("</title><polyline fill=\"none\" stroke=\"currentColor\" points=\"", out);
    for (size_t i = 0; i < count; i++) {
        double v = values[i] < 0 ? 0 : values[i] > max ? max : values[i];
        double x = count > 1 ? (double) i * S_SPARK_W / (double) (count - 1) : S_SPARK_W;
        fprintf (out, "%s%.1f,%.1f", i ? " " : "", x, S_SPARK_H - 1 - v * (S_SPARK_H - 2) / max);
    }
    fputs ("\"/></svg> ", out);
    gw_pages_put (out, label);
    fputs ("</span>", out);
    return 0;
}

void gw_chart_test (bool verbose)
{
    (void) verbose;
    char text[48];
    s_duration (41, text, sizeof text);
    assert (streq (text, "41 s"));
    s_duration (723, text, sizeof text);
    assert (streq (text, "12 min 3 s"));
    s_duration (11100, text, sizeof text);
    assert (streq (text, "3 h 05 min"));
    assert (s_day_start ("1970-01-02") == 86400);
    assert (s_day_start ("2026-13-01") == -1 && s_day_start ("x") == -1);

    gw_chart_day_t days[] = {{"2026-11-20", 100, "$0.001000"},
                             {"2026-11-30", 50, "$0.000500"},
                             {"2026-11-16", 7, "$0.000070"}, //  outside 14 days
                             {"2026-12-01", 9, "$0.000090"}, //  after today
                             {"bad", 9, "<x>"}};
    char *html = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&html, &size);
    assert (gw_chart_write (out, "c14", "Last <14> days", days, 5, "2026-11-30", 14) == 0);
    fclose (out);
    size_t bars = 0;
    for (const char *p = html; (p = strstr (p, "class=\"bar\"")); p++)
        bars++;
    assert (bars == 14);
    assert (strstr (html, "data-day=\"2026-11-17\" data-seconds=\"0\""));
    assert (strstr (html, "data-day=\"2026-11-20\" data-seconds=\"100\""));
    assert (strstr (html, "height=\"114\" fill=\"#3b7dd8\" data-day=\"2026-11-20\""));
    assert (strstr (html, "height=\"57\" fill=\"#3b7dd8\" data-day=\"2026-11-30\""));
    assert (!strstr (html, "2026-11-16") && !strstr (html, "2026-12-01"));
    assert (strstr (html, "Last &lt;14&gt; days: 2 min 30 s in all"));
    assert (strstr (html, "<tr><td>2026-11-30</td><td>50 s</td><td>$0.000500</td></tr>") <
            strstr (html, "<tr><td>2026-11-20</td>"));
    assert (!strstr (html, "<x>"));
    free (html);
    out = open_memstream (&html, &size);
    assert (gw_chart_write (out, "c", "t", NULL, 0, "2026-11-30", 30) == 0);
    assert (gw_chart_write (out, "c", "t", NULL, 0, "today", 30) == -1);
    assert (gw_chart_write (out, "c", "t", NULL, 0, "2026-11-30", 0) == -1);
    fclose (out);
    assert (strstr (html, "No running time in these days."));
    free (html);

    //  A sparkline: the points span the width, 0 at the bottom, max at the top.
    double cpu[] = {0, 50, 100, 250};
    out = open_memstream (&html, &size);
    assert (gw_chart_spark (out, "cpu", "CPU <100>%", cpu, 4, 100) == 0);
    assert (gw_chart_spark (out, "memory", "none", NULL, 0, 100) == 0);
    assert (gw_chart_spark (out, "memory", "bad", cpu, 4, 0) == -1);
    fclose (out);
    assert (strstr (html, "<span class=\"spark cpu\"><svg "));
    assert (strstr (html, "points=\"0.0,23.0 40.0,12.0 80.0,1.0 120.0,1.0\""));
    assert (strstr (html, "<title>CPU &lt;100&gt;%</title>") && !strstr (html, ">none"));
    free (html);
}
