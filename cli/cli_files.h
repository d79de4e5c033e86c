/*  cli_files - the files of a working directory that a handoff copies.

    In a git work tree, what git would keep: tracked files and untracked ones that are
    not ignored (`git ls-files --cached --others --exclude-standard -z`, so .gitignore,
    .git/info/exclude and the global excludes are followed, and .git itself is left
    out). Elsewhere, every file under the directory. Either way only regular files and
    symbolic links are kept (a tracked file deleted since, a submodule's directory, a
    socket are skipped), each named relative to the directory.
*/
#ifndef CLI_FILES_H_INCLUDED
#define CLI_FILES_H_INCLUDED

#include "sbx_common.h"

//  The relative names, sorted, as a list of strings the list frees; NULL with why when
//  the directory cannot be read or git fails. *git: whether git chose them.
zlist_t *cli_files_list (const char *dir, bool *git, char *why, size_t why_size);

//  Every regular file and symbolic link under dir, git or not (relative names, sorted),
//  as a list of strings the list frees; NULL with why when it cannot be read.
zlist_t *cli_files_all (const char *dir, char *why, size_t why_size);

//  Every directory under dir (relative names, sorted: parents first), so that empty
//  ones travel too; NULL with why when it cannot be read.
zlist_t *cli_files_dirs (const char *dir, char *why, size_t why_size);

//  Names from NUL-separated output (git's -z): empty ones dropped, duplicates once (an
//  unmerged file is listed per stage). Added to names (an autofree list).
void cli_files_parse_z (zlist_t *names, const char *data, size_t size);

void cli_files_test (bool verbose);

#endif
