/*  cli_sse - Server-Sent Events, parsed as they arrive (an MCP answer as a stream).

    Each event's name (its "event:" line; "message" without one) and data (its "data:"
    lines joined with "\n") go to the callback when the blank line that ends it arrives;
    other fields and comments are ignored.
*/
#ifndef CLI_SSE_H_INCLUDED
#define CLI_SSE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_sse_t cli_sse_t;
typedef void (cli_sse_event_fn) (void *arg, const char *event, const char *data);

cli_sse_t *cli_sse_new (cli_sse_event_fn *on_event, void *arg);
void cli_sse_destroy (cli_sse_t **self_p);

//  Feeds the next piece of the stream. 0, or -1 when out of memory.
int cli_sse_feed (cli_sse_t *self, const char *data, size_t size);

//  Ends the stream: an event not ended by a blank line is delivered too.
void cli_sse_end (cli_sse_t *self);

void cli_sse_test (bool verbose);

#endif
