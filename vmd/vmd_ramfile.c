/*  vmd_ramfile - a template's guest RAM in a sealed memfd. See vmd_ramfile.h. */
#include "vmd_ramfile.h"

#include "sbx_log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

int vmd_ramfile_new (uint64_t bytes)
{
    if (bytes == 0 || bytes > (64ULL << 30))
        return -1;
    int fd = memfd_create ("sbx-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd == -1) {
        sbx_error ("vmd_ramfile: memfd_create: %s", strerror (errno));
        return -1;
    }
    if (ftruncate (fd, (off_t) bytes) == -1) {
        sbx_error ("vmd_ramfile: ftruncate: %s", strerror (errno));
        close (fd);
        return -1;
    }
    return fd;
}

int vmd_ramfile_seal (int fd)
{
    if (fcntl (fd, F_ADD_SEALS, S_SEALS) == -1) {
        sbx_error ("vmd_ramfile: cannot seal: %s", strerror (errno));
        return -1;
    }
    return 0;
}

bool vmd_ramfile_sealed (int fd)
{
    int seals = fcntl (fd, F_GET_SEALS);
    return seals != -1 && (seals & S_SEALS) == S_SEALS;
}

//  The data extents of from (a memfd or a sparse file) into to at the same offsets;
//  holes are skipped, so that they stay holes in to (which has the size already).
static int s_copy_extents (int from, int to, off_t size)
{
    enum { S_CHUNK = 1 << 20 };
    char *buffer = malloc (S_CHUNK);
    if (!buffer)
        return -1;
    int rc = 0;
    off_t at = 0;
    while (rc == 0 && at < size) {
        off_t data = lseek (from, at, SEEK_DATA);
        if (data == -1) {
            if (errno != ENXIO) //  ENXIO: no data after at
                rc = -1;
            break;
        }
        off_t hole = lseek (from, data, SEEK_HOLE);
        if (hole == -1 || hole > size)
            hole = size;
        for (off_t off = data; rc == 0 && off < hole;) {
            size_t want = (size_t) (hole - off < S_CHUNK ? hole - off : S_CHUNK);
            ssize_t got = pread (from, buffer, want, off);
            if (got <= 0 || pwrite (to, buffer, (size_t) got, off) != got)
                rc = -1;
            else
                off += got;
        }
        at = hole;
    }
    free (buffer);
    return rc;
}

int vmd_ramfile_save (int fd, const char *path)
{
    struct stat st;
    if (!path || fstat (fd, &st) == -1 || strlen (path) > 4000)
        return -1;
    char tmp[4100];
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    int out = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out == -1) {
        sbx_error ("vmd_ramfile: cannot create %s: %s", tmp, strerror (errno));
        return -1;
    }
    int rc = ftruncate (out, st.st_size) == 0 && s_copy_extents (fd, out, st.st_size) == 0 &&
                     fsync (out) == 0
                 ? 0
                 : -1;
    if (close (out) == -1)
        rc = -1;
    if (rc == 0 && rename (tmp, path) == -1)
        rc = -1;
    if (rc == -1) {
        sbx_error ("vmd_ramfile: cannot save %s: %s", path, strerror (errno));
        unlink (tmp);
    }
    return rc;
}

int vmd_ramfile_load (const char *path, uint64_t bytes)
{
    int in = path ? open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    if (in == -1)
        return -1;
    struct stat st;
    int fd = -1;
    if (fstat (in, &st) == 0 && S_ISREG (st.st_mode) && (uint64_t) st.st_size == bytes)
        fd = vmd_ramfile_new (bytes);
    else
        sbx_error ("vmd_ramfile: %s is not a RAM file of %llu bytes", path,
                   (unsigned long long) bytes);
    if (fd >= 0 && (s_copy_extents (in, fd, st.st_size) == -1 || vmd_ramfile_seal (fd) == -1)) {
        sbx_error ("vmd_ramfile: cannot load %s: %s", path, strerror (errno));
        close (fd);
        fd = -1;
    }
    close (in);
    return fd;
}

//  --------------------------------------------------------------------------
//  Self-test

void vmd_ramfile_test (bool verbose)
{
    (void) verbose;
    assert (vmd_ramfile_new (0) == -1);
    uint64_t size = 8 << 20;
    int fd = vmd_ramfile_new (size);
    assert (fd >= 0 && !vmd_ramfile_sealed (fd));
    //  Two pages written (as a guest would, through a shared map), the rest holes.
    char *map = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert (map != MAP_FAILED);
    memcpy (map + 4096, "first", 5);
    memcpy (map + (5 << 20), "second", 6);
    munmap (map, size);
    assert (vmd_ramfile_seal (fd) == 0 && vmd_ramfile_sealed (fd));
    //  Sealed: no write, no resize, no shared writable map, no hole punched.
    assert (pwrite (fd, "x", 1, 0) == -1 && errno == EPERM);
    assert (ftruncate (fd, 4096) == -1);
    assert (mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
    assert (fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096) == -1);
    //  A private map is copy-on-write: its writes never reach the memfd.
    map = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    assert (map != MAP_FAILED);
    assert (memcmp (map + 4096, "first", 5) == 0);
    memcpy (map + 4096, "clone", 5);
    munmap (map, size);
    char back[8] = "";
    assert (pread (fd, back, 5, 4096) == 5 && memcmp (back, "first", 5) == 0);

    //  Saved sparse and loaded back, sealed.
    char dir[] = "/tmp/vmd_ramfile_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[256];
    snprintf (path, sizeof path, "%s/memory.ram", dir);
    assert (vmd_ramfile_save (fd, path) == 0);
    struct stat st;
    assert (stat (path, &st) == 0 && (uint64_t) st.st_size == size);
    assert (st.st_blocks * 512 < (1 << 20)); //  two pages of data, not 8 MiB
    int again = vmd_ramfile_load (path, size);
    assert (again >= 0 && vmd_ramfile_sealed (again));
    memset (back, 0, sizeof back);
    assert (pread (again, back, 6, 5 << 20) == 6 && memcmp (back, "second", 6) == 0);
    assert (pread (again, back, 1, 0) == 1 && back[0] == 0);
    close (again);
    //  The wrong size, a missing file or a link is refused.
    assert (vmd_ramfile_load (path, size * 2) == -1);
    char link[256], missing[256];
    snprintf (link, sizeof link, "%s/link.ram", dir);
    snprintf (missing, sizeof missing, "%s/none.ram", dir);
    assert (symlink (path, link) == 0);
    assert (vmd_ramfile_load (link, size) == -1);
    assert (vmd_ramfile_load (missing, size) == -1);
    //  A directory that is not there: nothing saved, nothing left.
    snprintf (missing, sizeof missing, "%s/no/memory.ram", dir);
    assert (vmd_ramfile_save (fd, missing) == -1);
    close (fd);
    unlink (link);
    unlink (path);
    rmdir (dir);
}
