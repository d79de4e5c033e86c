/*  cli_tar - a ustar archive in memory (see cli_tar.h). */
#include "cli_tar.h"
#include "sbx_common.h"

#define S_BLOCK 512

struct cli_tar_t {
    uint8_t *buf;
    size_t size, capacity;
    bool finished;
};

cli_tar_t *cli_tar_new (void)
{
    return calloc (1, sizeof (cli_tar_t));
}

void cli_tar_destroy (cli_tar_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free ((*self_p)->buf);
    free (*self_p);
    *self_p = NULL;
}

//  Room for n more bytes, zeroed (headers and padding rely on it).
static uint8_t *s_grow (cli_tar_t *self, size_t n)
{
    if (self->size + n > self->capacity) {
        size_t c = self->capacity ? self->capacity : 65536;
        while (c < self->size + n)
            c *= 2;
        uint8_t *grown = realloc (self->buf, c);
        if (!grown)
            return NULL;
        self->buf = grown;
        self->capacity = c;
    }
    uint8_t *at = self->buf + self->size;
    memset (at, 0, n);
    self->size += n;
    return at;
}

//  An octal field of width bytes: digits, then NUL.
static void s_octal (uint8_t *field, size_t width, uint64_t value)
{
    field[width - 1] = 0;
    for (size_t i = width - 1; i-- > 0; value >>= 3)
        field[i] = (uint8_t) ('0' + (value & 7));
}

static int s_header (cli_tar_t *self, const char *name, char type, unsigned mode, uint64_t size,
                     time_t mtime, const char *link, char *why, size_t why_size)
{
    if (self->finished) {
        snprintf (why, why_size, "the archive is already finished");
        return -1;
    }
    size_t length = strlen (name);
    const char *prefix = "";
    size_t prefix_length = 0;
    if (length == 0 || name[0] == '/') {
        snprintf (why, why_size, "\"%s\" is not a relative file name", name);
        return -1;
    }
    if (length > 100) {
        //  Split at the last "/" that leaves at most 155 bytes before and 100 after.
        const char *cut = NULL;
        for (const char *p = name; *p; p++)
            if (*p == '/' && (size_t) (p - name) <= 155 && length - (p - name) - 1 <= 100 && p[1])
                cut = p;
        if (!cut) {
            snprintf (why, why_size, "a file name too long for a tar archive (%zu bytes): %.200s",
                      length, name);
            return -1;
        }
        prefix = name, prefix_length = cut - name;
        name = cut + 1, length = strlen (name);
    }
    if (link && strlen (link) > 100) {
        snprintf (why, why_size, "the link %s points to a target too long for a tar archive", name);
        return -1;
    }
    uint8_t *h = s_grow (self, S_BLOCK);
    if (!h) {
        snprintf (why, why_size, "out of memory");
        return -1;
    }
    memcpy (h, name, length);
    s_octal (h + 100, 8, mode & 07777);
    s_octal (h + 108, 8, 0);
    s_octal (h + 116, 8, 0);
    s_octal (h + 124, 12, size);
    s_octal (h + 136, 12, mtime < 0 ? 0 : (uint64_t) mtime);
    memset (h + 148, ' ', 8); //  the checksum counts its own field as spaces
    h[156] = (uint8_t) type;
    if (link)
        memcpy (h + 157, link, strlen (link));
    memcpy (h + 257, "ustar", 6); //  magic "ustar\0", version "00"
    memcpy (h + 263, "00", 2);
    memcpy (h + 265, "root", 4);
    memcpy (h + 297, "root", 4);
    memcpy (h + 345, prefix, prefix_length);
    unsigned sum = 0;
    for (int i = 0; i < S_BLOCK; i++)
        sum += h[i];
    snprintf ((char *) h + 148, 8, "%06o", sum); //  six digits, NUL, and the space kept
    return 0;
}

int cli_tar_add_file (cli_tar_t *self, const char *name, unsigned mode, time_t mtime,
                      const void *data, size_t size, char *why, size_t why_size)
{
    if (s_header (self, name, '0', mode, size, mtime, NULL, why, why_size))
        return -1;
    size_t padded = (size + S_BLOCK - 1) / S_BLOCK * S_BLOCK;
    uint8_t *at = s_grow (self, padded);
    if (!at) {
        snprintf (why, why_size, "out of memory");
        return -1;
    }
    if (size)
        memcpy (at, data, size);
    return 0;
}

int cli_tar_add_symlink (cli_tar_t *self, const char *name, const char *target, time_t mtime,
                         char *why, size_t why_size)
{
    return s_header (self, name, '2', 0777, 0, mtime, target, why, why_size);
}

const uint8_t *cli_tar_finish (cli_tar_t *self, size_t *size)
{
    if (!self->finished && s_grow (self, 2 * S_BLOCK))
        self->finished = true;
    *size = self->size;
    return self->buf;
}

void cli_tar_test (bool verbose)
{
    (void) verbose;
    char why[256];
    cli_tar_t *tar = cli_tar_new ();
    assert (cli_tar_add_file (tar, "hello.txt", 0644, 1700000000, "hello\n", 6, why, sizeof why) ==
            0);
    assert (cli_tar_add_file (tar, "bin/run.sh", 0755, 1700000000, "#!/bin/sh\n", 10, why,
                              sizeof why) == 0);
    assert (cli_tar_add_file (tar, "empty", 0600, 0, NULL, 0, why, sizeof why) == 0);
    assert (cli_tar_add_symlink (tar, "link", "hello.txt", 1700000000, why, sizeof why) == 0);
    //  A 150-byte name splits into prefix and name.
    char deep[200];
    snprintf (deep, sizeof deep, "%s/%s",
              "d123456789d123456789d123456789d123456789d123456789"
              "d123456789d123456789d123456789",
              "f123456789f123456789f123456789f123456789f123456789f123456789f12345.txt");
    assert (strlen (deep) > 100);
    assert (cli_tar_add_file (tar, deep, 0644, 0, "x", 1, why, sizeof why) == 0);
    //  Refusals name the file.
    char too_long[300];
    memset (too_long, 'a', 299);
    too_long[299] = 0;
    assert (cli_tar_add_file (tar, too_long, 0644, 0, "", 0, why, sizeof why) == -1);
    assert (strstr (why, "too long for a tar archive"));
    assert (cli_tar_add_file (tar, "/abs", 0644, 0, "", 0, why, sizeof why) == -1);
    size_t size;
    const uint8_t *data = cli_tar_finish (tar, &size);
    assert (size % 512 == 0 && size == 512 * (2 + 2 + 1 + 1 + 2 + 2));
    //  The checksum of the first header, recomputed.
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += (i >= 148 && i < 156) ? ' ' : data[i];
    assert (strtoul ((const char *) data + 148, NULL, 8) == sum);

    //  GNU tar reads it back: names, modes, link and contents.
    char dir[] = "/tmp/cli_tar_test_XXXXXX";
    assert (mkdtemp (dir));
    char path[512];
    snprintf (path, sizeof path, "%s/a.tar", dir);
    FILE *f = fopen (path, "wb");
    assert (f && fwrite (data, 1, size, f) == size);
    fclose (f);
    char command[1024];
    snprintf (command, sizeof command,
              "tar -xf %s -C %s && test -x %s/bin/run.sh && "
              "test \"$(cat %s/link)\" = hello && test -f %s/%s && test -f %s/empty",
              path, dir, dir, dir, dir, deep, dir);
    assert (system (command) == 0);
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
    cli_tar_destroy (&tar);
}
