/*  cli_shell - see cli_shell.h */
#include "cli_shell.h"
#include "sbx_common.h"

char *cli_shell_quote (const char *text)
{
    zchunk_t *out = zchunk_new ("'", 1);
    for (const char *p = text; *p; p++) {
        if (*p == '\'')
            zchunk_extend (out, "'\\''", 4); //  close, an escaped quote, reopen
        else
            zchunk_extend (out, p, 1);
    }
    zchunk_extend (out, "'", 1);
    char *quoted = strndup ((char *) zchunk_data (out), zchunk_size (out));
    zchunk_destroy (&out);
    return quoted;
}

char *cli_shell_command (int argc, char **argv)
{
    if (argc == 1)
        return strdup (argv[0]);
    zchunk_t *out = zchunk_new (NULL, 0);
    for (int i = 0; i < argc; i++) {
        char *word = cli_shell_quote (argv[i]);
        if (i)
            zchunk_extend (out, " ", 1);
        zchunk_extend (out, word, strlen (word));
        free (word);
    }
    char *command = strndup ((char *) zchunk_data (out), zchunk_size (out));
    zchunk_destroy (&out);
    return command;
}

void cli_shell_test (bool verbose)
{
    (void) verbose;
    char *q = cli_shell_quote ("it's $HOME");
    assert (streq (q, "'it'\\''s $HOME'"));
    free (q);
    char *argv[] = {"sh", "-c", "echo \"$0\""};
    char *line = cli_shell_command (3, argv);
    assert (streq (line, "'sh' '-c' 'echo \"$0\"'"));
    free (line);
    char *one[] = {"make -j2 && ls"};
    line = cli_shell_command (1, one);
    assert (streq (line, "make -j2 && ls")); //  one word: a command line as it is
    free (line);
    //  What the shell makes of it: the words as given.
    char *words[] = {"printf", "%s|", "a b", "c'd", "$HOME", ""};
    line = cli_shell_command (6, words);
    char *quoted = cli_shell_quote (line);
    char *command = zsys_sprintf ("test \"$(/bin/sh -c %s)\" = 'a b|c'\\''d|$HOME||'", quoted);
    assert (system (command) == 0);
    free (quoted);
    free (command);
    free (line);
}
