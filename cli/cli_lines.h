/*  cli_lines - newline-delimited messages from a file descriptor (MCP's stdio framing).

    Each message is one line ended by "\n" (a "\r" before it is dropped); empty lines
    are skipped. Lines may arrive in any pieces. A line longer than the limit is
    reported once as too long and skipped to its end, so one bad message does not end the
    conversation.
*/
#ifndef CLI_LINES_H_INCLUDED
#define CLI_LINES_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_lines_t cli_lines_t;

cli_lines_t *cli_lines_new (int fd, size_t max_line);
void cli_lines_destroy (cli_lines_t **self_p);

//  The next line (borrowed until the next call, NUL-terminated), or NULL at end of input
//  or on a read error (a signal included). *too_long is set when a line over the limit
//  was skipped: then the line returned is "" and the caller answers with an error.
const char *cli_lines_next (cli_lines_t *self, bool *too_long);

void cli_lines_test (bool verbose);

#endif
