/*  gw_chart - the console's usage chart: running time per UTC day as an inline SVG bar
    chart, drawn on the server from billing's figures (no script, no image request: the
    pages' CSP allows neither), with the same figures as a table beside it for screen
    readers and text browsers.

    One bar per day of the span ending today, oldest on the left; a day without running
    time is a bar of height 0. Each bar carries its figures (data-day, data-seconds and a
    <title> tooltip), so a reader, a test or a person hovering sees the number behind it. */
#ifndef GW_CHART_H_INCLUDED
#define GW_CHART_H_INCLUDED

#include "sbx_common.h"

typedef struct {
    const char *day; //  "2026-11-30" (UTC)
    uint64_t seconds;
    const char *cost; //  "$0.000120"
} gw_chart_day_t;

//  Writes the chart of the span days ending with today ("YYYY-MM-DD", UTC) to out: a
//  <figure id="id"> with the title as caption, the SVG, and a table of the days that
//  ran. days (any order) gives the figures; days outside the span are left out.
//  0, or -1 when today is not a date or span is not 1 to 366.
int gw_chart_write (FILE *out, const char *id, const char *title, const gw_chart_day_t *days,
                    size_t count, const char *today, int span);

//  A sparkline: values (oldest first, each 0..max) as a small inline SVG polyline of class
//  "spark <kind>" (kind: "cpu", "memory"), the newest value as its text (label: "CPU
//  3.5%") in a <title> and beside it. Nothing is written for no values. 0, or -1.
int gw_chart_spark (FILE *out, const char *kind, const char *label, const double *values,
                    size_t count, double max);

void gw_chart_test (bool verbose);

#endif
