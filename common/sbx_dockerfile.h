/*  sbx_dockerfile - the Dockerfile subset sbx builds templates from (issue 19), parsed
    into steps, and each step's cache key.

    Instructions: FROM (once, first: `sbx` or `sbx:TYPE` for a type's guest image, or an
    existing template's name), RUN, COPY, ADD, ENV, WORKDIR, USER, EXPOSE, and CMD or
    ENTRYPOINT (the template's start command; the last one counts). Keywords are case-
    insensitive; `\` at a line's end continues it; `#` at a line's start is a comment
    (parser directives too). RUN, CMD and ENTRYPOINT take the shell form or the exec
    form (a JSON array, joined into one shell command with each word quoted). COPY and
    ADD take `SRC... DEST` or the JSON form, and `--chown=USER[:GROUP]`. ENV takes
    `K=V...` (values quoted or escaped as a shell would) or the old `K V`. $VAR, ${VAR},
    ${VAR:-default} and ${VAR:+alt} in ENV, WORKDIR, USER, EXPOSE, COPY and ADD are the
    values ENV set before (RUN's are the guest shell's to expand). Anything else (ARG,
    LABEL, multi-stage `FROM … AS`, ADD of a URL, ...) is refused with its line and what
    sbx takes instead: a build never half-understands a file.

    The cache key of a step is SHA-256 over the previous step's key, the step as parsed
    (the ENV, WORKDIR and USER in force included) and the digest of its inputs (COPY and
    ADD: the files, which the caller hashes): the same file over the same base gives the
    same keys, and a change anywhere gives new keys from that step on.

        char why[256];
        sbx_dockerfile_t *df = sbx_dockerfile_parse (text, why, sizeof why);
        for (size_t i = 0; df && i < sbx_dockerfile_size (df); i++)
            const sbx_df_step_t *step = sbx_dockerfile_step (df, i);
*/
#ifndef SBX_DOCKERFILE_H_INCLUDED
#define SBX_DOCKERFILE_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_DOCKERFILE_MAX_BYTES (1 << 20) //  the largest Dockerfile taken
#define SBX_DOCKERFILE_MAX_STEPS 256

typedef enum {
    SBX_DF_FROM,
    SBX_DF_RUN,
    SBX_DF_COPY,
    SBX_DF_ADD,
    SBX_DF_ENV,
    SBX_DF_WORKDIR,
    SBX_DF_USER,
    SBX_DF_EXPOSE,
    SBX_DF_CMD,
    SBX_DF_ENTRYPOINT
} sbx_df_kind_t;

typedef struct {
    sbx_df_kind_t kind;
    int line;      //  where it starts in the file, from 1
    char *text;    //  as written, continuations joined: for progress lines
    char *command; //  RUN, CMD, ENTRYPOINT: one shell command
    char *from;    //  FROM: the base's name (sbx, or a template); its tag in from_tag
    char *from_tag;
    char **sources; //  COPY, ADD: paths in the build context, substituted
    size_t source_count;
    char *dest;  //  COPY, ADD: where in the guest (absolute, from WORKDIR when relative)
    char *chown; //  COPY, ADD: --chown's USER[:GROUP], or NULL
    char **env;  //  ENV: "K=V" each, substituted
    size_t env_count;
    uint16_t *ports; //  EXPOSE
    size_t port_count;
    //  In force when the step runs (after it, for ENV, WORKDIR and USER).
    char *workdir;    //  absolute; "/" at first
    char *user;       //  NULL: root
    char **state_env; //  every ENV so far, "K=V", in the order first set
    size_t state_env_count;
} sbx_df_step_t;

typedef struct sbx_dockerfile_t sbx_dockerfile_t;

//  Parses text (NUL-terminated). NULL with why ("line 7: ...") when it is not the subset
//  or is malformed.
sbx_dockerfile_t *sbx_dockerfile_parse (const char *text, char *why, size_t why_size);

//  What a base template leaves in force for the steps built over it (as Docker's image
//  config does): its ENV ("K=V" each), WORKDIR (absolute) and USER (NULL: root).
typedef struct {
    const char *const *env;
    size_t env_count;
    const char *workdir;
    const char *user;
} sbx_df_base_t;

//  As sbx_dockerfile_parse, starting from base's state (NULL: none). A malformed base
//  (an entry without '=' or a bad name, a relative WORKDIR) is refused with why.
sbx_dockerfile_t *sbx_dockerfile_parse_over (const char *text, const sbx_df_base_t *base, char *why,
                                             size_t why_size);
void sbx_dockerfile_destroy (sbx_dockerfile_t **self_p);

size_t sbx_dockerfile_size (sbx_dockerfile_t *self);
//  Step i (borrowed); step 0 is FROM.
const sbx_df_step_t *sbx_dockerfile_step (sbx_dockerfile_t *self, size_t i);

//  The start command: the last CMD or ENTRYPOINT (ENTRYPOINT's with CMD's words after it,
//  as Docker runs them), or NULL. Borrowed.
const char *sbx_dockerfile_start (sbx_dockerfile_t *self);

//  Whether the step changes the guest's files (RUN, COPY, ADD, and WORKDIR, which makes
//  its directory): a layer to build and cache. The others are only recorded.
bool sbx_dockerfile_makes_layer (const sbx_df_step_t *step);

//  The step's cache key (64 hex digits and a NUL) from the previous key (step 0: the
//  base's identity, e.g. an image hash or a template's snapshot id) and inputs (COPY,
//  ADD: a digest of the files; else NULL).
void sbx_dockerfile_key (const char *previous, const sbx_df_step_t *step, const char *inputs,
                         char out[65]);

//  words as one shell command: each quoted unless it is made only of safe characters.
//  Caller frees.
char *sbx_dockerfile_shell_join (char **words, size_t count);

void sbx_dockerfile_test (bool verbose);

#endif
