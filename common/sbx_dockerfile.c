/*  sbx_dockerfile - the Dockerfile subset of templates: steps and cache keys. */
#include "sbx_dockerfile.h"
#include "sbx_secret.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define streq(a, b) (strcmp ((a), (b)) == 0)

struct sbx_dockerfile_t {
    sbx_df_step_t *steps;
    size_t count;
    char *start;
};

//  What is being built while parsing: the steps, and the state in force.
typedef struct {
    sbx_dockerfile_t *df;
    char **env; //  "K=V"
    size_t env_count;
    char *workdir;
    char *user;
    char **cmd; //  the last CMD (words: exec form) or NULL
    size_t cmd_count;
    bool cmd_shell;
    char **entry;
    size_t entry_count;
    bool entry_shell;
    char *why;
    size_t why_size;
    int line;
} s_parser_t;

static const char *s_kind_names[] = {"FROM",    "RUN",  "COPY",   "ADD", "ENV",
                                     "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT"};

static int s_fail (s_parser_t *p, const char *format, ...)
{
    int n = snprintf (p->why, p->why_size, "line %d: ", p->line);
    va_list args;
    va_start (args, format);
    if (n >= 0 && (size_t) n < p->why_size)
        vsnprintf (p->why + n, p->why_size - (size_t) n, format, args);
    va_end (args);
    return -1;
}

static void s_strings_free (char **items, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free (items[i]);
    free (items);
}

static char **s_strings_copy (char **items, size_t count)
{
    char **copy = calloc (count ? count : 1, sizeof *copy);
    for (size_t i = 0; copy && i < count; i++)
        copy[i] = strdup (items[i]);
    return copy;
}

static int s_strings_add (char ***items, size_t *count, char *item)
{
    char **grown = item ? realloc (*items, (*count + 1) * sizeof *grown) : NULL;
    if (!grown) {
        free (item);
        return -1;
    }
    grown[(*count)++] = item;
    *items = grown;
    return 0;
}

//  --------------------------------------------------------------------------
//  A growing string.

typedef struct {
    char *data;
    size_t size, room;
} s_buf_t;

static void s_put (s_buf_t *b, const char *data, size_t size)
{
    if (b->size + size + 1 > b->room) {
        size_t room = (b->size + size + 1) * 2;
        char *grown = realloc (b->data, room);
        assert (grown); //  a Dockerfile is at most 1 MiB
        b->data = grown;
        b->room = room;
    }
    memcpy (b->data + b->size, data, size);
    b->size += size;
    b->data[b->size] = 0;
}

static void s_putc (s_buf_t *b, char c)
{
    s_put (b, &c, 1);
}

static char *s_take (s_buf_t *b)
{
    if (!b->data)
        return strdup ("");
    return b->data;
}

//  --------------------------------------------------------------------------
//  $VAR substitution from the ENV in force.

static const char *s_env_get (s_parser_t *p, const char *name, size_t length)
{
    for (size_t i = p->env_count; i-- > 0;)
        if (strncmp (p->env[i], name, length) == 0 && p->env[i][length] == '=')
            return p->env[i] + length + 1;
    return NULL;
}

static bool s_name_char (char c, bool first)
{
    return isalpha ((unsigned char) c) || c == '_' || (!first && isdigit ((unsigned char) c));
}

//  Substitutes one $ reference at *at (which points at '$') into out; advances *at.
static int s_dollar (s_parser_t *p, const char **at, s_buf_t *out)
{
    const char *s = *at + 1;
    if (*s == '{') {
        const char *name = s + 1;
        const char *end = name;
        while (s_name_char (*end, end == name))
            end++;
        if (end == name)
            return s_fail (p, "'${' must be followed by a variable's name, as in ${HOME}");
        const char *value = s_env_get (p, name, (size_t) (end - name));
        if (*end == '}') {
            if (value)
                s_put (out, value, strlen (value));
            *at = end + 1;
            return 0;
        }
        if (end[0] == ':' && (end[1] == '-' || end[1] == '+')) {
            const char *word = end + 2;
            const char *close = strchr (word, '}');
            if (!close)
                return s_fail (p, "'${%.*s' has no closing '}'", (int) (end - name), name);
            bool set = value && *value;
            if (end[1] == '-')
                s_put (out, set ? value : word, set ? strlen (value) : (size_t) (close - word));
            else if (set)
                s_put (out, word, (size_t) (close - word));
            *at = close + 1;
            return 0;
        }
        if (!strchr (end, '}'))
            return s_fail (p, "'${%.*s' has no closing '}'", (int) (end - name), name);
        return s_fail (p, "only ${VAR}, ${VAR:-default} and ${VAR:+alternative} are taken");
    }
    if (s_name_char (*s, true)) {
        const char *end = s;
        while (s_name_char (*end, end == s))
            end++;
        const char *value = s_env_get (p, s, (size_t) (end - s));
        if (value)
            s_put (out, value, strlen (value));
        *at = end;
        return 0;
    }
    s_putc (out, '$'); //  a lone $ stays
    *at = s;
    return 0;
}

//  text with $ references substituted (\$ is a literal $). Caller frees; NULL on error.
static char *s_subst (s_parser_t *p, const char *text)
{
    s_buf_t out = {0};
    for (const char *at = text; *at;) {
        if (at[0] == '\\' && at[1] == '$') {
            s_putc (&out, '$');
            at += 2;
        } else if (*at == '$') {
            if (s_dollar (p, &at, &out)) {
                free (out.data);
                return NULL;
            }
        } else
            s_putc (&out, *at++);
    }
    return s_take (&out);
}

//  --------------------------------------------------------------------------
//  Words.

//  Whitespace-separated words of text, each substituted (subst) or not. NULL on error.
static char **s_split (s_parser_t *p, const char *text, bool subst, size_t *count)
{
    char **words = NULL;
    *count = 0;
    const char *at = text;
    while (*at) {
        while (isspace ((unsigned char) *at))
            at++;
        if (!*at)
            break;
        const char *end = at;
        while (*end && !isspace ((unsigned char) *end))
            end++;
        char *word = strndup (at, (size_t) (end - at));
        char *done = word && subst ? s_subst (p, word) : word;
        if (subst)
            free (word);
        if (!done || s_strings_add (&words, count, done)) {
            s_strings_free (words, *count);
            return NULL;
        }
        at = end;
    }
    if (!words)
        words = calloc (1, sizeof *words);
    return words;
}

//  The exec form: a JSON array of strings. NULL (no error) when text is not one: then it
//  is the shell form, as Docker reads it.
static char **s_exec_form (const char *text, size_t *count)
{
    if (*text != '[')
        return NULL;
    json_t *array = json_loads (text, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_array (array) || json_array_size (array) == 0) {
        json_decref (array);
        return NULL;
    }
    char **words = NULL;
    *count = 0;
    size_t i;
    json_t *word;
    json_array_foreach (array, i, word)
    {
        if (!json_is_string (word) ||
            s_strings_add (&words, count, strdup (json_string_value (word)))) {
            s_strings_free (words, *count);
            json_decref (array);
            return NULL;
        }
    }
    json_decref (array);
    return words;
}

char *sbx_dockerfile_shell_join (char **words, size_t count)
{
    s_buf_t out = {0};
    for (size_t i = 0; i < count; i++) {
        const char *w = words[i];
        if (i)
            s_putc (&out, ' ');
        bool safe = *w != 0;
        for (const char *c = w; *c && safe; c++)
            safe = isalnum ((unsigned char) *c) || strchr ("_@%+=:,./-", *c);
        if (safe) {
            s_put (&out, w, strlen (w));
            continue;
        }
        s_putc (&out, '\'');
        for (const char *c = w; *c; c++)
            if (*c == '\'')
                s_put (&out, "'\\''", 4);
            else
                s_putc (&out, *c);
        s_putc (&out, '\'');
    }
    return s_take (&out);
}

//  ENV's words, shell-style: "..." (with \" \\ \$ escapes and $ substituted), '...' (as
//  written), \X outside quotes, $ substituted; unquoted whitespace separates. NULL on error.
static char **s_env_words (s_parser_t *p, const char *text, size_t *count)
{
    char **words = NULL;
    *count = 0;
    const char *at = text;
    while (true) {
        while (isspace ((unsigned char) *at))
            at++;
        if (!*at)
            break;
        s_buf_t word = {0};
        s_putc (&word, 0); //  an empty quoted word is still a word
        word.size = 0;
        while (*at && !isspace ((unsigned char) *at)) {
            if (*at == '\'') {
                const char *close = strchr (at + 1, '\'');
                if (!close) {
                    free (word.data);
                    s_strings_free (words, *count);
                    s_fail (p, "a ' is not closed");
                    return NULL;
                }
                s_put (&word, at + 1, (size_t) (close - at - 1));
                at = close + 1;
            } else if (*at == '"') {
                at++;
                while (*at && *at != '"') {
                    if (at[0] == '\\' && at[1] && strchr ("\"\\$", at[1])) {
                        s_putc (&word, at[1]);
                        at += 2;
                    } else if (*at == '$') {
                        if (s_dollar (p, &at, &word))
                            break;
                    } else
                        s_putc (&word, *at++);
                }
                if (*at != '"') {
                    free (word.data);
                    s_strings_free (words, *count);
                    if (!*p->why)
                        s_fail (p, "a \" is not closed");
                    return NULL;
                }
                at++;
            } else if (at[0] == '\\' && at[1]) {
                s_putc (&word, at[1]);
                at += 2;
            } else if (*at == '$') {
                if (s_dollar (p, &at, &word)) {
                    free (word.data);
                    s_strings_free (words, *count);
                    return NULL;
                }
            } else
                s_putc (&word, *at++);
        }
        if (s_strings_add (&words, count, s_take (&word))) {
            s_strings_free (words, *count);
            return NULL;
        }
    }
    if (!words)
        words = calloc (1, sizeof *words);
    return words;
}

//  --------------------------------------------------------------------------
//  Instructions.

static char *s_join_path (const char *dir, const char *path)
{
    if (*path == '/')
        return strdup (path);
    s_buf_t out = {0};
    s_put (&out, dir, strlen (dir));
    if (out.size == 0 || out.data[out.size - 1] != '/')
        s_putc (&out, '/');
    s_put (&out, path, strlen (path));
    return s_take (&out);
}

static void s_env_set (s_parser_t *p, const char *pair)
{
    size_t key = strcspn (pair, "=");
    for (size_t i = 0; i < p->env_count; i++)
        if (strncmp (p->env[i], pair, key) == 0 && p->env[i][key] == '=') {
            free (p->env[i]);
            p->env[i] = strdup (pair);
            return;
        }
    s_strings_add (&p->env, &p->env_count, strdup (pair));
}

static bool s_valid_name (const char *name, bool first_alpha)
{
    if (!*name || strlen (name) > 128 || (first_alpha && !s_name_char (*name, true)))
        return false;
    for (const char *c = name; *c; c++)
        if (!s_name_char (*c, false))
            return false;
    return true;
}

static int s_from (s_parser_t *p, sbx_df_step_t *step, const char *rest)
{
    size_t count;
    char **words = s_split (p, rest, false, &count);
    if (!words)
        return -1;
    int rc = 0;
    if (count == 0)
        rc = s_fail (p, "FROM needs a base: sbx, sbx:TYPE, or a template's name");
    else if (words[0][0] == '-')
        rc = s_fail (p, "FROM takes no options (%s)", words[0]);
    else if (count == 3 && strcasecmp (words[1], "AS") == 0)
        rc = s_fail (p,
                     "multi-stage builds (FROM ... AS %s) are not supported: one FROM per "
                     "Dockerfile",
                     words[2]);
    else if (count != 1)
        rc = s_fail (p, "FROM takes one base: sbx, sbx:TYPE, or a template's name");
    if (rc == 0) {
        char *tag = strchr (words[0], ':');
        if (tag)
            *tag++ = 0;
        bool ok = *words[0] && strlen (words[0]) <= 64 && (!tag || (*tag && strlen (tag) <= 64));
        for (const char *c = words[0]; ok && *c; c++)
            ok = islower ((unsigned char) *c) || isdigit ((unsigned char) *c) || strchr ("._-", *c);
        for (const char *c = tag; ok && c && *c; c++)
            ok = isalnum ((unsigned char) *c) || strchr ("._-", *c);
        if (!ok)
            rc = s_fail (p, "FROM's base must be sbx, sbx:TYPE or a template's name (lower-case "
                            "letters, digits, '.', '_', '-'; at most 64)");
        else {
            step->from = strdup (words[0]);
            step->from_tag = tag ? strdup (tag) : NULL;
        }
    }
    s_strings_free (words, count);
    return rc;
}

//  RUN, CMD, ENTRYPOINT: the shell command (and for CMD and ENTRYPOINT, the words).
static int s_command (s_parser_t *p, sbx_df_step_t *step, const char *rest, char ***words_p,
                      size_t *count_p, bool *shell_p)
{
    size_t count = 0;
    char **words = s_exec_form (rest, &count);
    if (!*rest)
        return s_fail (p, "%s needs a command", s_kind_names[step->kind]);
    step->command = words ? sbx_dockerfile_shell_join (words, count) : strdup (rest);
    if (words_p) {
        s_strings_free (*words_p, *count_p);
        *shell_p = words == NULL;
        if (!words) {
            words = calloc (1, sizeof *words);
            count = 0;
            s_strings_add (&words, &count, strdup (rest));
        }
        *words_p = words;
        *count_p = count;
    } else
        s_strings_free (words, count);
    return 0;
}

static int s_copy (s_parser_t *p, sbx_df_step_t *step, const char *rest)
{
    //  Options first: --chown only.
    while (strncmp (rest, "--", 2) == 0) {
        const char *end = rest;
        while (*end && !isspace ((unsigned char) *end))
            end++;
        if (strncmp (rest, "--chown=", 8) == 0 && end > rest + 8) {
            char *value = strndup (rest + 8, (size_t) (end - rest - 8));
            free (step->chown);
            step->chown = value ? s_subst (p, value) : NULL;
            free (value);
            if (!step->chown)
                return -1;
            for (const char *c = step->chown; *c; c++)
                if (!isalnum ((unsigned char) *c) && !strchr ("_.-:", *c))
                    return s_fail (p, "--chown takes USER[:GROUP] (names or ids)");
        } else
            return s_fail (p, "%s takes --chown=USER[:GROUP] only, not %.*s",
                           s_kind_names[step->kind], (int) (end - rest), rest);
        rest = end;
        while (isspace ((unsigned char) *rest))
            rest++;
    }
    size_t count = 0;
    char **words = s_exec_form (rest, &count);
    if (words) {
        for (size_t i = 0; i < count; i++) {
            char *done = s_subst (p, words[i]);
            if (!done) {
                s_strings_free (words, count);
                return -1;
            }
            free (words[i]);
            words[i] = done;
        }
    } else if (!(words = s_split (p, rest, true, &count)))
        return -1;
    int rc = 0;
    if (count < 2)
        rc = s_fail (p, "%s needs SRC... DEST", s_kind_names[step->kind]);
    for (size_t i = 0; rc == 0 && i + 1 < count; i++) {
        const char *src = words[i];
        if (strstr (src, "://"))
            rc = s_fail (p,
                         "ADD of a URL (%s) is not supported: RUN curl -fsSLo DEST URL does "
                         "the same",
                         src);
        else if (!*src || strlen (src) > 4096)
            rc = s_fail (p, "an empty or overlong source path");
    }
    if (rc == 0) {
        step->dest = s_join_path (p->workdir, words[count - 1]);
        step->sources = words;
        step->source_count = count - 1;
        free (words[count - 1]);
        return 0;
    }
    s_strings_free (words, count);
    return rc;
}

static int s_env (s_parser_t *p, sbx_df_step_t *step, const char *rest)
{
    size_t count;
    const char *space = rest + strcspn (rest, " \t");
    const char *eq = strchr (rest, '=');
    if (!*rest)
        return s_fail (p, "ENV needs KEY=VALUE");
    if (!eq || eq > space) {
        //  The old form: ENV KEY VALUE (the rest of the line, substituted).
        char *key = strndup (rest, (size_t) (space - rest));
        while (isspace ((unsigned char) *space))
            space++;
        char *value = s_subst (p, space);
        int rc = !key || !value ? -1
                 : !s_valid_name (key, true)
                     ? s_fail (p, "ENV's name '%.64s' must be letters, digits and _", key)
                     : 0;
        if (rc == 0) {
            char *pair = malloc (strlen (key) + strlen (value) + 2);
            sprintf (pair, "%s=%s", key, value);
            s_strings_add (&step->env, &step->env_count, pair);
            s_env_set (p, pair);
        }
        free (key);
        free (value);
        return rc;
    }
    char **words = s_env_words (p, rest, &count);
    if (!words)
        return *p->why ? -1 : s_fail (p, "ENV cannot be read");
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        char *eq_at = strchr (words[i], '=');
        if (!eq_at)
            rc = s_fail (p, "ENV takes KEY=VALUE pairs ('%.64s' has no '=')", words[i]);
        else {
            *eq_at = 0;
            if (!s_valid_name (words[i], true))
                rc = s_fail (p, "ENV's name '%.64s' must be letters, digits and _", words[i]);
            *eq_at = '=';
        }
        if (rc == 0) {
            s_strings_add (&step->env, &step->env_count, strdup (words[i]));
            s_env_set (p, words[i]);
        }
    }
    s_strings_free (words, count);
    return rc;
}

static int s_expose (s_parser_t *p, sbx_df_step_t *step, const char *rest)
{
    size_t count;
    char **words = s_split (p, rest, true, &count);
    if (!words)
        return -1;
    int rc = count ? 0 : s_fail (p, "EXPOSE needs a port");
    step->ports = calloc (count ? count : 1, sizeof *step->ports);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        char *proto = strchr (words[i], '/');
        if (proto && strcasecmp (proto, "/tcp") != 0)
            rc = s_fail (p, "EXPOSE %s: sbx publishes TCP ports only", words[i]);
        if (proto)
            *proto = 0;
        char *end = NULL;
        long port = strtol (words[i], &end, 10);
        if (rc == 0 && (end == words[i] || *end || port < 1 || port > 65535))
            rc = s_fail (p, "EXPOSE takes ports from 1 to 65535 ('%.32s')", words[i]);
        else if (rc == 0)
            step->ports[step->port_count++] = (uint16_t) port;
    }
    s_strings_free (words, count);
    return rc;
}

static int s_instruction (s_parser_t *p, const char *line, int first_line)
{
    p->line = first_line;
    const char *end = line;
    while (*end && !isspace ((unsigned char) *end))
        end++;
    size_t length = (size_t) (end - line);
    const char *rest = end;
    while (isspace ((unsigned char) *rest))
        rest++;
    int kind = -1;
    for (size_t k = 0; k < sizeof s_kind_names / sizeof s_kind_names[0]; k++)
        if (strlen (s_kind_names[k]) == length && strncasecmp (line, s_kind_names[k], length) == 0)
            kind = (int) k;
    if (kind == -1)
        return s_fail (p,
                       "%.*s is not supported: sbx builds from FROM, RUN, COPY, ADD, ENV, "
                       "WORKDIR, USER, EXPOSE, CMD and ENTRYPOINT",
                       (int) (length > 32 ? 32 : length), line);
    sbx_dockerfile_t *df = p->df;
    if (df->count == 0 && kind != SBX_DF_FROM)
        return s_fail (p, "the first instruction must be FROM (sbx, sbx:TYPE or a template)");
    if (df->count > 0 && kind == SBX_DF_FROM)
        return s_fail (p, "one FROM per Dockerfile (multi-stage builds are not supported)");
    if (df->count == SBX_DOCKERFILE_MAX_STEPS)
        return s_fail (p, "more than %d instructions", SBX_DOCKERFILE_MAX_STEPS);
    sbx_df_step_t *grown = realloc (df->steps, (df->count + 1) * sizeof *grown);
    if (!grown)
        return s_fail (p, "out of memory");
    df->steps = grown;
    sbx_df_step_t *step = &df->steps[df->count++];
    memset (step, 0, sizeof *step);
    step->kind = (sbx_df_kind_t) kind;
    step->line = first_line;
    step->text = strdup (line);
    int rc = 0;
    switch (step->kind) {
    case SBX_DF_FROM:
        rc = s_from (p, step, rest);
        break;
    case SBX_DF_RUN:
        rc = s_command (p, step, rest, NULL, NULL, NULL);
        break;
    case SBX_DF_CMD:
        rc = s_command (p, step, rest, &p->cmd, &p->cmd_count, &p->cmd_shell);
        break;
    case SBX_DF_ENTRYPOINT:
        rc = s_command (p, step, rest, &p->entry, &p->entry_count, &p->entry_shell);
        break;
    case SBX_DF_COPY:
    case SBX_DF_ADD:
        rc = s_copy (p, step, rest);
        break;
    case SBX_DF_ENV:
        rc = s_env (p, step, rest);
        break;
    case SBX_DF_WORKDIR: {
        char *dir = *rest ? s_subst (p, rest) : NULL;
        rc = !*rest ? s_fail (p, "WORKDIR needs a directory") : !dir ? -1 : 0;
        if (rc == 0) {
            char *joined = s_join_path (p->workdir, dir);
            free (p->workdir);
            p->workdir = joined;
        }
        free (dir);
        break;
    }
    case SBX_DF_USER: {
        char *user = *rest ? s_subst (p, rest) : NULL;
        rc = !*rest ? s_fail (p, "USER needs a user") : !user ? -1 : 0;
        for (const char *c = user; rc == 0 && *c; c++)
            if (!isalnum ((unsigned char) *c) && !strchr ("_.-:", *c))
                rc = s_fail (p, "USER takes NAME[:GROUP] (names or ids)");
        if (rc == 0 && !*user)
            rc = s_fail (p, "USER needs a user");
        if (rc == 0) {
            free (p->user);
            p->user = user;
        } else
            free (user);
        break;
    }
    case SBX_DF_EXPOSE:
        rc = s_expose (p, step, rest);
        break;
    }
    step->workdir = strdup (p->workdir);
    step->user = p->user ? strdup (p->user) : NULL;
    step->state_env = s_strings_copy (p->env, p->env_count);
    step->state_env_count = p->env_count;
    return rc;
}

static void s_step_free (sbx_df_step_t *step)
{
    free (step->text);
    free (step->command);
    free (step->from);
    free (step->from_tag);
    s_strings_free (step->sources, step->source_count);
    free (step->dest);
    free (step->chown);
    s_strings_free (step->env, step->env_count);
    free (step->ports);
    free (step->workdir);
    free (step->user);
    s_strings_free (step->state_env, step->state_env_count);
}

void sbx_dockerfile_destroy (sbx_dockerfile_t **self_p)
{
    sbx_dockerfile_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    for (size_t i = 0; i < self->count; i++)
        s_step_free (&self->steps[i]);
    free (self->steps);
    free (self->start);
    free (self);
    *self_p = NULL;
}

sbx_dockerfile_t *sbx_dockerfile_parse (const char *text, char *why, size_t why_size)
{
    return sbx_dockerfile_parse_over (text, NULL, why, why_size);
}

//  The base's state into p (the base comes from a guest's file: checked as ENV would be).
static int s_base (s_parser_t *p, const sbx_df_base_t *base)
{
    p->line = 1;
    for (size_t i = 0; i < base->env_count; i++) {
        const char *pair = base->env[i];
        const char *eq = pair ? strchr (pair, '=') : NULL;
        char name[256];
        if (!eq || eq == pair || (size_t) (eq - pair) >= sizeof name)
            return s_fail (p, "the base template's ENV entry %zu is not NAME=VALUE", i + 1);
        snprintf (name, sizeof name, "%.*s", (int) (eq - pair), pair);
        if (!s_valid_name (name, true))
            return s_fail (p, "the base template's ENV name '%s' is not a variable name", name);
        s_env_set (p, pair);
    }
    if (base->workdir) {
        if (base->workdir[0] != '/')
            return s_fail (p, "the base template's WORKDIR '%s' is not absolute", base->workdir);
        free (p->workdir);
        p->workdir = strdup (base->workdir);
    }
    if (base->user && *base->user)
        p->user = strdup (base->user);
    return p->workdir ? 0 : s_fail (p, "out of memory");
}

sbx_dockerfile_t *sbx_dockerfile_parse_over (const char *text, const sbx_df_base_t *base, char *why,
                                             size_t why_size)
{
    s_parser_t p = {.why = why, .why_size = why_size, .workdir = strdup ("/")};
    *why = 0;
    p.df = calloc (1, sizeof *p.df);
    int rc = p.df && p.workdir ? 0 : s_fail (&p, "out of memory");
    if (rc == 0 && base)
        rc = s_base (&p, base);
    if (rc == 0 && strlen (text) > SBX_DOCKERFILE_MAX_BYTES)
        rc = s_fail (&p, "the Dockerfile is larger than %d bytes", SBX_DOCKERFILE_MAX_BYTES);
    //  Logical lines: comments dropped, a trailing \ joins the next line.
    s_buf_t logical = {0};
    int number = 0, first = 0;
    for (const char *at = text; rc == 0 && *at;) {
        const char *eol = strchr (at, '\n');
        const char *start = at, *end = eol ? eol : at + strlen (at);
        at = eol ? eol + 1 : end;
        number++;
        while (start < end && isspace ((unsigned char) *start))
            start++;
        while (end > start && isspace ((unsigned char) end[-1]))
            end--;
        if (start == end || *start == '#')
            continue; //  a blank line, a comment or a parser directive
        if (logical.size == 0)
            first = number;
        bool more = end[-1] == '\\';
        s_put (&logical, start, (size_t) (end - start) - (more ? 1 : 0));
        if (!more) {
            rc = s_instruction (&p, logical.data, first);
            logical.size = 0;
        }
    }
    if (rc == 0 && logical.size > 0)
        rc = s_instruction (&p, logical.data, first); //  a \ on the last line
    if (rc == 0 && p.df->count == 0) {
        p.line = number ? number : 1;
        rc = s_fail (&p, "no instructions: a Dockerfile starts with FROM sbx (or a template)");
    }
    if (rc == 0) {
        //  The start command, as Docker joins them: ENTRYPOINT's exec form takes CMD's
        //  words after it; a shell-form ENTRYPOINT ignores CMD.
        if (p.entry && !p.entry_shell && p.cmd) {
            char **all = s_strings_copy (p.entry, p.entry_count);
            size_t count = p.entry_count;
            for (size_t i = 0; i < p.cmd_count; i++)
                s_strings_add (&all, &count, strdup (p.cmd[i]));
            p.df->start = p.cmd_shell ? NULL : sbx_dockerfile_shell_join (all, count);
            if (p.cmd_shell) {
                //  ["prog"] then CMD shell form: Docker runs prog /bin/sh -c "cmd".
                s_strings_free (all, count);
                all = s_strings_copy (p.entry, p.entry_count);
                count = p.entry_count;
                s_strings_add (&all, &count, strdup ("/bin/sh"));
                s_strings_add (&all, &count, strdup ("-c"));
                s_strings_add (&all, &count, strdup (p.cmd[0]));
                p.df->start = sbx_dockerfile_shell_join (all, count);
            }
            s_strings_free (all, count);
        } else if (p.entry)
            p.df->start = p.entry_shell ? strdup (p.entry[0])
                                        : sbx_dockerfile_shell_join (p.entry, p.entry_count);
        else if (p.cmd)
            p.df->start =
                p.cmd_shell ? strdup (p.cmd[0]) : sbx_dockerfile_shell_join (p.cmd, p.cmd_count);
    }
    free (logical.data);
    s_strings_free (p.env, p.env_count);
    s_strings_free (p.cmd, p.cmd_count);
    s_strings_free (p.entry, p.entry_count);
    free (p.workdir);
    free (p.user);
    if (rc != 0)
        sbx_dockerfile_destroy (&p.df);
    return p.df;
}

size_t sbx_dockerfile_size (sbx_dockerfile_t *self)
{
    return self->count;
}

const sbx_df_step_t *sbx_dockerfile_step (sbx_dockerfile_t *self, size_t i)
{
    return i < self->count ? &self->steps[i] : NULL;
}

const char *sbx_dockerfile_start (sbx_dockerfile_t *self)
{
    return self->start;
}

bool sbx_dockerfile_makes_layer (const sbx_df_step_t *step)
{
    return step->kind == SBX_DF_RUN || step->kind == SBX_DF_COPY || step->kind == SBX_DF_ADD ||
           step->kind == SBX_DF_WORKDIR;
}

//  A field, length first: no two different steps hash the same bytes.
static void s_field (sbx_secret_sha256_t *h, const char *value)
{
    char size[24];
    if (!value) {
        sbx_secret_sha256_update (h, "-;", 2);
        return;
    }
    int n = snprintf (size, sizeof size, "%zu:", strlen (value));
    sbx_secret_sha256_update (h, size, (size_t) n);
    sbx_secret_sha256_update (h, value, strlen (value));
}

void sbx_dockerfile_key (const char *previous, const sbx_df_step_t *step, const char *inputs,
                         char out[65])
{
    sbx_secret_sha256_t *h = sbx_secret_sha256_new ();
    assert (h);
    s_field (h, "sbx template step 1"); //  the format of what follows
    s_field (h, previous);
    s_field (h, s_kind_names[step->kind]);
    s_field (h, step->command);
    s_field (h, step->from);
    s_field (h, step->from_tag);
    for (size_t i = 0; i < step->source_count; i++)
        s_field (h, step->sources[i]);
    s_field (h, step->dest);
    s_field (h, step->chown);
    for (size_t i = 0; i < step->env_count; i++)
        s_field (h, step->env[i]);
    for (size_t i = 0; i < step->port_count; i++) {
        char port[8];
        snprintf (port, sizeof port, "%u", step->ports[i]);
        s_field (h, port);
    }
    s_field (h, step->workdir);
    s_field (h, step->user);
    for (size_t i = 0; i < step->state_env_count; i++)
        s_field (h, step->state_env[i]);
    s_field (h, inputs);
    sbx_secret_sha256_final (h, out);
    sbx_secret_sha256_destroy (&h);
}

//  --------------------------------------------------------------------------
//  Self-test

static sbx_dockerfile_t *s_parse_ok (const char *text)
{
    char why[256];
    sbx_dockerfile_t *df = sbx_dockerfile_parse (text, why, sizeof why);
    if (!df)
        fprintf (stderr, "unexpected refusal: %s\n", why);
    assert (df);
    return df;
}

static void s_refused (const char *text, const char *expect)
{
    char why[256];
    sbx_dockerfile_t *df = sbx_dockerfile_parse (text, why, sizeof why);
    if (df || !strstr (why, expect))
        fprintf (stderr, "for %s: got '%s', expected '%s'\n", text, df ? "(accepted)" : why,
                 expect);
    assert (!df && strstr (why, expect));
}

void sbx_dockerfile_test (bool verbose)
{
    if (verbose)
        printf (" * sbx_dockerfile: ");
    sbx_dockerfile_t *df = s_parse_ok ("# syntax=docker/dockerfile:1\n"
                                       "from sbx:medium\n"
                                       "\n"
                                       "ENV APP=/srv/app GREETING=\"hello world\" \\\n"
                                       "    PATHS=$APP/bin:${HOME:-/root}\n"
                                       "ENV OLD value with spaces\n"
                                       "WORKDIR $APP\n"
                                       "# a comment between\n"
                                       "RUN apt-get update && \\\n"
                                       "    # a comment inside a continuation\n"
                                       "    echo done\n"
                                       "COPY --chown=app:app src/ ./src\n"
                                       "ADD [\"a file.txt\", \"/etc/x\"]\n"
                                       "USER app\n"
                                       "EXPOSE 8000 8001/tcp\n"
                                       "RUN [\"python3\", \"-c\", \"print('hi')\"]\n"
                                       "CMD [\"--port\", \"8000\"]\n"
                                       "ENTRYPOINT [\"/srv/app/bin/serve\"]\n");
    assert (sbx_dockerfile_size (df) == 12);
    const sbx_df_step_t *s = sbx_dockerfile_step (df, 0);
    assert (s->kind == SBX_DF_FROM && streq (s->from, "sbx") && streq (s->from_tag, "medium"));
    assert (s->line == 2);
    s = sbx_dockerfile_step (df, 1);
    assert (s->kind == SBX_DF_ENV && s->env_count == 3 && s->line == 4);
    assert (strcmp (s->env[0], "APP=/srv/app") == 0);
    assert (strcmp (s->env[1], "GREETING=hello world") == 0);
    //  As in Docker, one ENV's values see what ENV set before it, not each other.
    assert (strcmp (s->env[2], "PATHS=/bin:/root") == 0);
    s = sbx_dockerfile_step (df, 2);
    assert (s->env_count == 1 && strcmp (s->env[0], "OLD=value with spaces") == 0);
    assert (s->state_env_count == 4);
    s = sbx_dockerfile_step (df, 3);
    assert (s->kind == SBX_DF_WORKDIR && strcmp (s->workdir, "/srv/app") == 0);
    assert (sbx_dockerfile_makes_layer (s));
    s = sbx_dockerfile_step (df, 4);
    assert (s->kind == SBX_DF_RUN && s->line == 9);
    assert (strcmp (s->command, "apt-get update && echo done") == 0);
    s = sbx_dockerfile_step (df, 5);
    assert (s->kind == SBX_DF_COPY && s->source_count == 1 && strcmp (s->sources[0], "src/") == 0);
    assert (strcmp (s->dest, "/srv/app/./src") == 0 && strcmp (s->chown, "app:app") == 0);
    s = sbx_dockerfile_step (df, 6);
    assert (s->kind == SBX_DF_ADD && strcmp (s->sources[0], "a file.txt") == 0);
    assert (strcmp (s->dest, "/etc/x") == 0 && !s->chown && !s->user);
    s = sbx_dockerfile_step (df, 7);
    assert (s->kind == SBX_DF_USER && strcmp (s->user, "app") == 0 &&
            !sbx_dockerfile_makes_layer (s));
    s = sbx_dockerfile_step (df, 8);
    assert (s->port_count == 2 && s->ports[0] == 8000 && s->ports[1] == 8001);
    s = sbx_dockerfile_step (df, 9);
    assert (strcmp (s->command, "python3 -c 'print('\\''hi'\\'')'") == 0);
    assert (strcmp (s->user, "app") == 0 && strcmp (s->workdir, "/srv/app") == 0);
    assert (strcmp (sbx_dockerfile_start (df), "/srv/app/bin/serve --port 8000") == 0);

    //  Keys: a chain; the same text gives the same keys, a change in a step or an input
    //  changes that step's key and every one after.
    char keys[12][65], again[65], other[65];
    for (size_t i = 0; i < 12; i++)
        sbx_dockerfile_key (i ? keys[i - 1] : "image-abc", sbx_dockerfile_step (df, i),
                            i == 5 ? "digest-1" : NULL, keys[i]);
    sbx_dockerfile_key (keys[4], sbx_dockerfile_step (df, 5), "digest-1", again);
    assert (strcmp (again, keys[5]) == 0 && strlen (again) == 64);
    sbx_dockerfile_key (keys[4], sbx_dockerfile_step (df, 5), "digest-2", other);
    assert (strcmp (other, keys[5]) != 0);
    sbx_dockerfile_key ("image-def", sbx_dockerfile_step (df, 0), NULL, other);
    assert (strcmp (other, keys[0]) != 0);
    sbx_dockerfile_destroy (&df);
    assert (!df);

    //  RUN's environment is what ENV set before it, and changes its key.
    df = s_parse_ok ("FROM base\nRUN make\n");
    sbx_dockerfile_t *df2 = s_parse_ok ("FROM base\nENV CC=clang\nRUN make\n");
    char k1[65], k2[65], k0[65];
    sbx_dockerfile_key ("x", sbx_dockerfile_step (df, 0), NULL, k0);
    sbx_dockerfile_key (k0, sbx_dockerfile_step (df, 1), NULL, k1);
    sbx_dockerfile_key (k0, sbx_dockerfile_step (df2, 2), NULL, k2); //  (same previous)
    assert (strcmp (k1, k2) != 0);
    assert (!sbx_dockerfile_start (df));
    sbx_dockerfile_destroy (&df);
    sbx_dockerfile_destroy (&df2);

    //  Shell-form CMD; a last line ending in \; \$ stays a $.
    df = s_parse_ok ("FROM sbx\nENV A=1\nCMD python3 -m http.server \\\n");
    assert (strcmp (sbx_dockerfile_start (df), "python3 -m http.server ") == 0);
    sbx_dockerfile_destroy (&df);
    df = s_parse_ok ("FROM sbx\nENV A=1\nENV B='$A' C=\"$A\" D=\\$A\nWORKDIR \\$A\n");
    s = sbx_dockerfile_step (df, 2);
    assert (streq (s->env[0], "B=$A") && streq (s->env[1], "C=1") && streq (s->env[2], "D=$A"));
    assert (streq (sbx_dockerfile_step (df, 3)->workdir, "/$A"));
    sbx_dockerfile_destroy (&df);

    //  Refusals name the line and what to do.
    s_refused ("", "no instructions");
    s_refused ("# only a comment\n", "no instructions");
    s_refused ("RUN x\n", "line 1: the first instruction must be FROM");
    s_refused ("FROM sbx\nFROM sbx\n", "line 2: one FROM per Dockerfile");
    s_refused ("FROM sbx AS build\n", "multi-stage builds");
    s_refused ("FROM --platform=linux/amd64 sbx\n", "FROM takes no options");
    s_refused ("FROM Ubuntu\n", "FROM's base must be");
    s_refused ("FROM sbx\nARG X=1\n", "line 2: ARG is not supported");
    s_refused ("FROM sbx\nLABEL a=b\n", "LABEL is not supported");
    s_refused ("FROM sbx\nADD https://example.com/x /x\n", "ADD of a URL");
    s_refused ("FROM sbx\nCOPY onlyone\n", "COPY needs SRC... DEST");
    s_refused ("FROM sbx\nCOPY --from=build /a /b\n", "--chown=USER[:GROUP] only");
    s_refused ("FROM sbx\nEXPOSE 53/udp\n", "TCP ports only");
    s_refused ("FROM sbx\nEXPOSE 70000\n", "from 1 to 65535");
    s_refused ("FROM sbx\nENV 1A=x\n", "must be letters");
    s_refused ("FROM sbx\nENV A=\"open\n", "not closed");
    s_refused ("FROM sbx\nENV A=${B\n", "no closing");
    s_refused ("FROM sbx\nUSER a;b\n", "USER takes");
    s_refused ("FROM sbx\nRUN\n", "RUN needs a command");
    s_refused ("FROM sbx\n\n\nWORKDIR\n", "line 4: WORKDIR needs");

    //  Over a base template's config: its ENV, WORKDIR and USER are in force from FROM
    //  on; an ENV of the same name replaces its value in place.
    const char *base_env[] = {"PATH=/opt/bin:/usr/bin", "HOME_APP=/srv"};
    sbx_df_base_t base = {base_env, 2, "/srv/app", "web"};
    char why[256];
    df = sbx_dockerfile_parse_over ("FROM web\nRUN make\nENV PATH=$HOME_APP/bin:$PATH\n"
                                    "WORKDIR sub\n",
                                    &base, why, sizeof why);
    assert (df && sbx_dockerfile_size (df) == 4);
    s = sbx_dockerfile_step (df, 1);
    assert (streq (s->workdir, "/srv/app") && streq (s->user, "web") && s->state_env_count == 2);
    s = sbx_dockerfile_step (df, 3);
    assert (streq (s->state_env[0], "PATH=/srv/bin:/opt/bin:/usr/bin"));
    assert (streq (s->workdir, "/srv/app/sub"));
    sbx_dockerfile_destroy (&df);
    const char *bad_env[] = {"NOEQUALS"};
    base = (sbx_df_base_t){bad_env, 1, NULL, NULL};
    assert (!sbx_dockerfile_parse_over ("FROM web\n", &base, why, sizeof why));
    assert (strstr (why, "not NAME=VALUE"));
    base = (sbx_df_base_t){NULL, 0, "relative", NULL};
    assert (!sbx_dockerfile_parse_over ("FROM web\n", &base, why, sizeof why));
    assert (strstr (why, "not absolute"));

    char *joined = sbx_dockerfile_shell_join ((char *[]){"echo", "", "a b", "it's"}, 4);
    assert (strcmp (joined, "echo '' 'a b' 'it'\\''s'") == 0);
    free (joined);
    if (verbose)
        printf ("OK\n");
}
