/*  cli_tar - a ustar archive in memory (see cli_tar.h). */
#include "cli_tar.h"
#include "sbx_common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

int cli_tar_add_dir (cli_tar_t *self, const char *name, unsigned mode, time_t mtime, char *why,
                     size_t why_size)
{
    char *slashed = zsys_sprintf ("%s/", name); //  as tar writes a directory's name
    int rc = slashed ? s_header (self, slashed, '5', mode, 0, mtime, NULL, why, why_size) : -1;
    free (slashed);
    return rc;
}

const uint8_t *cli_tar_finish (cli_tar_t *self, size_t *size)
{
    if (!self->finished && s_grow (self, 2 * S_BLOCK))
        self->finished = true;
    *size = self->size;
    return self->buf;
}

//  --------------------------------------------------------------------------
//  Unpacking

static uint64_t s_parse_octal (const uint8_t *field, size_t width)
{
    uint64_t value = 0;
    size_t i = 0;
    while (i < width && field[i] == ' ')
        i++;
    for (; i < width && field[i] >= '0' && field[i] <= '7'; i++)
        value = value * 8 + (uint64_t) (field[i] - '0');
    return value;
}

//  A member name as it may land under dir: relative, no "..", no empty components after
//  "./" is dropped. Fresh, or NULL when refused.
static char *s_safe_name (const char *name)
{
    while (name[0] == '.' && name[1] == '/')
        name += 2;
    if (!*name || streq (name, ".") || name[0] == '/')
        return NULL;
    char *copy = strdup (name);
    size_t n = strlen (copy);
    while (n && copy[n - 1] == '/')
        copy[--n] = 0; //  a directory's trailing slash
    for (char *part = copy; part && *part;) {
        char *slash = strchr (part, '/');
        size_t len = slash ? (size_t) (slash - part) : strlen (part);
        if (len == 0 || (len == 2 && part[0] == '.' && part[1] == '.')) {
            free (copy);
            return NULL;
        }
        part = slash ? slash + 1 : NULL;
    }
    return copy;
}

//  Whether a path under dir passes through a symbolic link (an archive's own, or one
//  there before): then writing to it would land elsewhere.
static bool s_through_link (const char *dir, const char *name)
{
    char path[PATH_MAX];
    size_t base = (size_t) snprintf (path, sizeof path, "%s/", dir);
    for (const char *p = name; *p; p++) {
        if (*p == '/') {
            snprintf (path + base, sizeof path - base, "%.*s", (int) (p - name), name);
            struct stat st;
            if (lstat (path, &st) == 0 && S_ISLNK (st.st_mode))
                return true;
        }
    }
    return false;
}

static int s_mkdirs (const char *dir, const char *name, mode_t mode)
{
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/%s", dir, name);
    for (char *p = path + strlen (dir) + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir (path, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir (path, mode) != 0 && errno != EEXIST ? -1 : 0;
}

typedef struct {
    char *name, *target;
} s_link_t;

int cli_tar_extract (const uint8_t *data, size_t size, const char *dir, size_t *files, char *why,
                     size_t why_size)
{
    *files = 0;
    zlistx_t *links = zlistx_new ();
    char *long_name = NULL, *long_link = NULL;
    int rc = 0;
    size_t at = 0;
    while (rc == 0 && at + S_BLOCK <= size) {
        const uint8_t *h = data + at;
        bool zero = true;
        for (int i = 0; i < S_BLOCK && zero; i++)
            zero = h[i] == 0;
        if (zero)
            break; //  the end
        unsigned sum = 0;
        for (int i = 0; i < S_BLOCK; i++)
            sum += (i >= 148 && i < 156) ? ' ' : h[i];
        if (s_parse_octal (h + 148, 8) != sum) {
            snprintf (why, why_size, "not a tar archive (bad header at byte %zu)", at);
            rc = -1;
            break;
        }
        uint64_t length = s_parse_octal (h + 124, 12);
        size_t blocks = (size_t) ((length + S_BLOCK - 1) / S_BLOCK);
        if (length > size || at + S_BLOCK + blocks * S_BLOCK > size) {
            snprintf (why, why_size, "the archive is cut short (at byte %zu)", at);
            rc = -1;
            break;
        }
        const uint8_t *body = h + S_BLOCK;
        char type = (char) h[156];
        at += S_BLOCK + blocks * S_BLOCK;
        if (type == 'L' || type == 'K') {
            //  GNU's long name (or link target) for the next member.
            char *text = strndup ((const char *) body, (size_t) length);
            if (type == 'L')
                free (long_name), long_name = text;
            else
                free (long_link), long_link = text;
            continue;
        }
        if (type == 'x' || type == 'g')
            continue; //  pax extended headers: GNU tar's default format needs none here
        char header_name[257] = "";
        if (memcmp (h + 257, "ustar", 5) == 0 && h[345])
            snprintf (header_name, sizeof header_name, "%.155s/%.100s", (const char *) h + 345,
                      (const char *) h);
        else
            snprintf (header_name, sizeof header_name, "%.100s", (const char *) h);
        char *name = s_safe_name (long_name ? long_name : header_name);
        char link_text[101];
        snprintf (link_text, sizeof link_text, "%.100s", (const char *) h + 157);
        const char *target = long_link ? long_link : link_text;
        unsigned mode = (unsigned) s_parse_octal (h + 100, 8) & 0777;
        time_t mtime = (time_t) s_parse_octal (h + 136, 12);
        if (!name) {
            const char *shown = long_name ? long_name : header_name;
            if (!(streq (shown, ".") || streq (shown, "./"))) { //  the top directory itself
                snprintf (why, why_size, "refused: the archive names %.200s, outside the target",
                          shown);
                rc = -1;
            }
        } else if (s_through_link (dir, name)) {
            snprintf (why, why_size, "refused: %.200s lies through a symbolic link", name);
            rc = -1;
        } else if (type == '5') {
            if (s_mkdirs (dir, name, mode | 0700)) {
                snprintf (why, why_size, "cannot make %s/%s: %s", dir, name, strerror (errno));
                rc = -1;
            }
        } else if (type == '0' || type == '\0' || type == '7') {
            char *slash = strrchr (name, '/');
            if (slash) {
                *slash = 0;
                rc = s_mkdirs (dir, name, 0755);
                *slash = '/';
            }
            char path[PATH_MAX];
            snprintf (path, sizeof path, "%s/%s", dir, name);
            unlink (path); //  replaced, never written through (it may be a link)
            int fd =
                rc ? -1 : open (path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            bool ok = fd >= 0 && write (fd, body, (size_t) length) == (ssize_t) length &&
                      fchmod (fd, mode) == 0;
            if (fd >= 0)
                close (fd);
            if (!ok) {
                snprintf (why, why_size, "cannot write %s: %s", path, strerror (errno));
                rc = -1;
            } else {
                struct timespec times[2] = {{mtime, 0}, {mtime, 0}};
                utimensat (AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW);
                (*files)++;
            }
        } else if (type == '2') {
            s_link_t *link = calloc (1, sizeof *link);
            link->name = strdup (name);
            link->target = strdup (target);
            zlistx_add_end (links, link);
        } else {
            snprintf (why, why_size,
                      "refused: %.200s is not a file, a directory or a link (type %c)", name, type);
            rc = -1;
        }
        free (name);
        free (long_name), long_name = NULL;
        free (long_link), long_link = NULL;
    }
    //  Links last: no member was written through one.
    for (s_link_t *link = zlistx_first (links); link; link = zlistx_next (links)) {
        if (rc == 0) {
            char path[PATH_MAX];
            snprintf (path, sizeof path, "%s/%s", dir, link->name);
            unlink (path);
            if (s_through_link (dir, link->name) || symlink (link->target, path) != 0) {
                snprintf (why, why_size, "cannot make the link %s: %s", path,
                          errno ? strerror (errno) : "it lies through a link");
                rc = -1;
            }
        }
        free (link->name);
        free (link->target);
        free (link);
    }
    zlistx_destroy (&links);
    free (long_name);
    free (long_link);
    return rc;
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
    assert (cli_tar_add_dir (tar, "hollow/inner", 0710, 1700000000, why, sizeof why) == 0);
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
    assert (size % 512 == 0 && size == 512 * (2 + 2 + 1 + 1 + 1 + 2 + 2));
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
              "test \"$(cat %s/link)\" = hello && test -f %s/%s && test -f %s/empty && "
              "test \"$(stat -c %%a %s/hollow/inner)\" = 710",
              path, dir, dir, dir, dir, deep, dir, dir);
    assert (system (command) == 0);
    //  And what GNU tar makes comes back out: a long name, a link, a mode, an empty dir.
    snprintf (command, sizeof command,
              "cd %s && mkdir -p src/empty && echo hi > src/a && chmod 751 src/a && "
              "ln -s a src/l && mkdir -p src/%s && echo deep > src/%s/f && "
              "tar -cf gnu.tar -C src .",
              dir, too_long + 100, too_long + 100);
    assert (system (command) == 0);
    snprintf (path, sizeof path, "%s/gnu.tar", dir);
    f = fopen (path, "rb");
    uint8_t *archive = malloc (1 << 20);
    size_t n = fread (archive, 1, 1 << 20, f);
    fclose (f);
    char out[512];
    snprintf (out, sizeof out, "%s/out", dir);
    assert (mkdir (out, 0755) == 0);
    size_t files = 0;
    assert (cli_tar_extract (archive, n, out, &files, why, sizeof why) == 0);
    assert (files == 2);
    snprintf (command, sizeof command,
              "cd %s && test \"$(cat a)\" = hi && test \"$(stat -c %%a a)\" = 751 && "
              "test \"$(readlink l)\" = a && test -d empty && test \"$(cat %s/f)\" = deep",
              out, too_long + 100);
    assert (system (command) == 0);
    //  A member that would land outside, or through a link, is refused.
    cli_tar_t *evil = cli_tar_new ();
    assert (cli_tar_add_file (evil, "x/../../escape", 0644, 0, "e", 1, why, sizeof why) == 0);
    const uint8_t *bad = cli_tar_finish (evil, &n);
    assert (cli_tar_extract (bad, n, out, &files, why, sizeof why) == -1);
    assert (strstr (why, "outside the target"));
    cli_tar_destroy (&evil);
    evil = cli_tar_new ();
    assert (cli_tar_add_symlink (evil, "up", "/tmp", 0, why, sizeof why) == 0);
    assert (cli_tar_add_file (evil, "up/planted", 0644, 0, "p", 1, why, sizeof why) == 0);
    bad = cli_tar_finish (evil, &n);
    //  The link is made last, so the file beneath its name is refused... as a plain
    //  directory, or when the link exists already, through it.
    snprintf (command, sizeof command, "ln -s /tmp %s/up", out);
    assert (system (command) == 0);
    assert (cli_tar_extract (bad, n, out, &files, why, sizeof why) == -1);
    assert (strstr (why, "lies through a symbolic link"));
    assert (access ("/tmp/planted", F_OK) != 0);
    cli_tar_destroy (&evil);
    assert (cli_tar_extract ((const uint8_t *) "junk", 4, out, &files, why, sizeof why) == 0);
    uint8_t garbage[1024];
    memset (garbage, 'g', sizeof garbage);
    assert (cli_tar_extract (garbage, sizeof garbage, out, &files, why, sizeof why) == -1);
    free (archive);
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
    cli_tar_destroy (&tar);
}
