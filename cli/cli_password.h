/*  cli_password - sign-in passwords the operator gives: typed at the terminal (twice,
    without echo) or the first line of standard input (--password-stdin), checked and
    hashed here with sbx_secret_password_hash (argon2id), so only the hash travels and
    the broker's loop never spends the hashing time. Also the password `sbx up` makes
    for the admin account at its first run. */
#ifndef CLI_PASSWORD_H_INCLUDED
#define CLI_PASSWORD_H_INCLUDED

#include "sbx_common.h"

//  The shortest password accepted, and the longest line read.
#define CLI_PASSWORD_MIN 8
#define CLI_PASSWORD_MAX 1024

//  One line of file without its newline (a fresh string), NULL at end of file. Longer
//  than CLI_PASSWORD_MAX: NULL with *too_long set.
char *cli_password_read_line (FILE *file, bool *too_long);

//  Why password will not do (a sentence for "COMMAND: ..."), or NULL when it will.
const char *cli_password_refusal (const char *password);

//  A new password's argon2id hash (the caller frees), read from the first line of stdin
//  when from_stdin, else from the terminal, asked twice. NULL when there is none: the
//  reason is said on stderr after "command: ", and *rc is the exit code (2: no good
//  password; 1: it could not be hashed).
char *cli_password_hash_new (const char *command, bool from_stdin, int *rc);

//  A password for a person to copy: 20 base62 characters (about 119 bits). Caller frees
//  (sbx_secret_wipe first). NULL when out of memory.
char *cli_password_generate (void);

void cli_password_test (bool verbose);

#endif
