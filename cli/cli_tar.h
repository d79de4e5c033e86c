/*  cli_tar - a ustar archive in memory (POSIX.1-1988), enough for GNU tar to unpack;
    and the unpacking of one that GNU tar made, onto this machine, trusting nothing in it.

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

//  Adds a directory (an empty one is made too). mode: permission bits. 0, or -1 with why.
int cli_tar_add_dir (cli_tar_t *self, const char *name, unsigned mode, time_t mtime, char *why,
                     size_t why_size);

//  Ends the archive (two zero blocks) and returns it (borrowed), its size in *size.
const uint8_t *cli_tar_finish (cli_tar_t *self, size_t *size);

//  Unpacks an archive (GNU tar's ustar or gnu format, as `tar -c` makes it in a guest)
//  under dir, which must exist: directories and regular files, with their permission
//  bits (no set-id bits) and modification times. Every name is checked first: an
//  absolute one, one with a ".." component, or one a link made earlier would lead
//  elsewhere is refused, as is anything but a file, a directory or a link; symbolic
//  links are made last, so nothing is ever written through one. Files that exist are
//  replaced. *files: how many files were written. 0, or -1 with why.
int cli_tar_extract (const uint8_t *data, size_t size, const char *dir, size_t *files, char *why,
                     size_t why_size);

void cli_tar_test (bool verbose);

#endif
