/*  cli_shell - words for /bin/sh -c, as a guest's shell will read them. */
#ifndef CLI_SHELL_H_INCLUDED
#define CLI_SHELL_H_INCLUDED

#include <stdbool.h>

//  text quoted for /bin/sh: '...', a quote inside as '\'' (fresh).
char *cli_shell_quote (const char *text);

//  The command a CLI's words after -- make: one word is a shell command line as it is
//  (`-- "make -j2 && ls"`); several are an argv, each word quoted so that it arrives
//  exactly as given (`-- sh -c 'echo "$0"'`). Fresh.
char *cli_shell_command (int argc, char **argv);

void cli_shell_test (bool verbose);

#endif
