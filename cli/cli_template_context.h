/*  cli_template_context - a template build's context as tar archives: the sources of a
    COPY or ADD step (paths under /, placed as Docker places them), or a whole context
    sent to the service (`sbx template build --server`), with a digest of what went in
    (names, modes, link targets and contents; not mtimes) that keys the step cache.

    Nothing outside the context directory is read: sources are resolved with their
    symbolic links followed and refused when they land outside it. At most 16 MiB of
    file content per archive.
*/
#ifndef CLI_TEMPLATE_CONTEXT_H_INCLUDED
#define CLI_TEMPLATE_CONTEXT_H_INCLUDED

#include "sbx_common.h"
#include "sbx_dockerfile.h"

typedef struct cli_template_context_t cli_template_context_t;

cli_template_context_t *cli_template_context_new (void);
void cli_template_context_destroy (cli_template_context_t **self_p);

//  A COPY or ADD step's sources from context (a real path) into the archive: 0, or -1
//  with why. A local archive that ADD unpacks goes in under /tmp, and "ARCHIVE DEST"
//  is appended to unpack (an autofree list) for the guest to unpack.
int cli_template_context_add_sources (cli_template_context_t *self, const char *context,
                                      const sbx_df_step_t *step, zlist_t *unpack);

//  Everything under full (a real path), as target/... in the archive: 0 or -1.
int cli_template_context_add_dir (cli_template_context_t *self, const char *full,
                                  const char *target);

//  A file made of data, as name: 0 or -1.
int cli_template_context_add_data (cli_template_context_t *self, const char *name, const void *data,
                                   size_t size);

//  The archive (borrowed, valid until destroy; NULL when out of memory) and its size.
const uint8_t *cli_template_context_archive (cli_template_context_t *self, size_t *size_p);

//  The digest of what went in, as 64 hex digits.
void cli_template_context_digest (cli_template_context_t *self, char out[65]);

//  Why the last call failed (a path of the context and the reason), or "".
const char *cli_template_context_why (cli_template_context_t *self);

//  Sets why, for a failure found by the caller while filling the archive.
void cli_template_context_set_why (cli_template_context_t *self, const char *why);

void cli_template_context_test (bool verbose);

#endif
