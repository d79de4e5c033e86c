/*  cli_tree - the file copies sbx backup and sbx restore share. */
#include "cli_tree.h"
#include "sbx_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <pwd.h>
#include <string.h>
#include <unistd.h>

//  Copies what fd holds into a new file at path, holes kept (the guest image is sparse),
//  and makes it reach the disk. 0, or -1 with errno.
int cli_tree_copy_fd (int in, const char *path)
{
    int out = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out == -1)
        return -1;
    struct stat st;
    int rc = fstat (in, &st);
    off_t at = 0;
    static char buf[1 << 20];
    while (rc == 0 && at < st.st_size) {
        off_t data = lseek (in, at, SEEK_DATA);
        if (data == -1 && errno == ENXIO)
            break; //  a hole to the end
        if (data == -1) {
            rc = -1;
            break;
        }
        off_t hole = lseek (in, data, SEEK_HOLE);
        if (hole == -1 || lseek (in, data, SEEK_SET) == -1 || lseek (out, data, SEEK_SET) == -1) {
            rc = -1;
            break;
        }
        for (off_t left = hole - data; rc == 0 && left > 0;) {
            ssize_t got = read (in, buf, left < (off_t) sizeof buf ? (size_t) left : sizeof buf);
            if (got <= 0) {
                rc = -1;
                if (got == 0)
                    errno = EIO; //  the file shrank while copied
                break;
            }
            for (ssize_t done = 0; rc == 0 && done < got;) {
                ssize_t put = write (out, buf + done, (size_t) (got - done));
                if (put < 0)
                    rc = -1;
                else
                    done += put;
            }
            left -= got;
        }
        at = hole;
    }
    if (rc == 0 && (ftruncate (out, st.st_size) || fdatasync (out)))
        rc = -1;
    int saved = errno;
    close (out);
    errno = saved;
    return rc;
}

int cli_tree_hash (const char *path, char out[65])
{
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    int rc = fd == -1 ? -1 : sbx_secret_hash_fd (fd, out);
    if (fd != -1)
        close (fd);
    return rc;
}

static int s_remove_one (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void) st, (void) ftw;
    return flag == FTW_DP ? rmdir (path) : unlink (path);
}

void cli_tree_remove (const char *path)
{
    nftw (path, s_remove_one, 32, FTW_DEPTH | FTW_PHYS);
}

json_t *cli_tree_owner (const struct stat *st)
{
    struct passwd *pw = getpwuid (st->st_uid);
    struct group *gr = getgrgid (st->st_gid);
    //  Names carry across machines; a guest's own uid has none, so the number goes too.
    return json_pack ("{s:i, s:s, s:s, s:I, s:I}", "mode", (int) (st->st_mode & 07777), "user",
                      pw ? pw->pw_name : "", "group", gr ? gr->gr_name : "", "uid",
                      (json_int_t) st->st_uid, "gid", (json_int_t) st->st_gid);
}
