/*  cli_tar - a ustar archive in memory (POSIX.1-1988), enough for GNU tar to unpack.

    Regular files and symbolic links, owned by root, with their permission bits and
    modification times. A name of up to 255 bytes fits (split into ustar's prefix and
    name at a "/"); a longer one, or a link target over 100 bytes, is refused by name,
    since ustar has no room for it and the GNU or pax extensions are not needed here.
*/
#ifndef CLI_TAR_H_INCLUDED
#define CLI_TAR_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct cli_tar_t cli_tar_t;

cli_tar_t *cli_tar_new (void);
void cli_tar_destroy (cli_tar_t **self_p);

//  Adds a regular file. mode: permission bits. 0, or -1 with why.
int cli_tar_add_file (cli_tar_t *self, const char *name, unsigned mode, time_t mtime,
                      const void *data, size_t size, char *why, size_t why_size);

//  Adds a symbolic link name -> target. 0, or -1 with why.
int cli_tar_add_symlink (cli_tar_t *self, const char *name, const char *target, time_t mtime,
                         char *why, size_t why_size);

//  Ends the archive (two zero blocks) and returns it (borrowed), its size in *size.
const uint8_t *cli_tar_finish (cli_tar_t *self, size_t *size);

void cli_tar_test (bool verbose);

#endif
