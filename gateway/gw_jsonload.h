/*  gw_jsonload - json_loadb, fast for long strings.

    jansson parses a string a code point at a time into a buffer it grows: for a
    write_file with 13 MiB of base64 content, half of the gateway's CPU (perf,
    docs/benchmarks.md). gw_jsonload finds the long string values that have no escapes,
    checks them as jansson would (UTF-8, no control characters), has jansson parse the
    body with each replaced by a short marker, and puts the strings back whole. What it
    returns is what json_loadb returns, errors included: on any doubt it does not lift,
    and a body that does not parse lifted is parsed again as it is, for jansson's own
    error.
*/
#ifndef GW_JSONLOAD_H_INCLUDED
#define GW_JSONLOAD_H_INCLUDED

#include "sbx_common.h"

#include <jansson.h>

//  json_loadb (body, size, 0, error): error may be NULL.
json_t *gw_jsonload (const char *body, size_t size, json_error_t *error);

//  Once, at the start: jansson's large allocations ask for huge pages (the same malloc
//  and free underneath, so it may come after jansson was used).
void gw_jsonload_init (void);

void gw_jsonload_test (bool verbose);

#endif
