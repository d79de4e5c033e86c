/*  sbx_files - see sbx_files.h */
#include "sbx_files.h"

#include <czmq.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

int sbx_files_remove_tree (const char *path)
{
    DIR *dir = opendir (path);
    if (!dir)
        return errno == ENOENT ? 0 : -1;
    struct dirent *entry;
    int rc = 0;
    while ((entry = readdir (dir))) {
        if (streq (entry->d_name, ".") || streq (entry->d_name, ".."))
            continue;
        char *child = zsys_sprintf ("%s/%s", path, entry->d_name);
        struct stat st;
        if (!child || lstat (child, &st) == -1)
            rc = -1;
        else if (S_ISDIR (st.st_mode))
            rc |= sbx_files_remove_tree (child);
        else if (unlink (child) == -1)
            rc = -1;
        free (child);
    }
    closedir (dir);
    if (rmdir (path) == -1)
        rc = -1;
    return rc;
}
