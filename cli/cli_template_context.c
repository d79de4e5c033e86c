/*  cli_template_context - see cli_template_context.h */
#include "cli_template_context.h"
#include "cli_files.h"
#include "cli_tar.h"
#include "cli_where.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <assert.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

//  --------------------------------------------------------------------------
//  COPY and ADD: the sources as one tar archive of paths under /, as Docker places them.

struct cli_template_context_t {
    cli_tar_t *tar;
    sbx_secret_sha256_t *digest; //  names, modes, link targets and contents: not mtimes
    size_t bytes;
    char why[600];
};

static void s_digest (cli_template_context_t *c, const char *kind, const char *name,
                      const void *data, size_t size)
{
    char head[64];
    int n = snprintf (head, sizeof head, "%s %zu %zu:", kind, strlen (name), size);
    sbx_secret_sha256_update (c->digest, head, (size_t) n);
    sbx_secret_sha256_update (c->digest, name, strlen (name));
    sbx_secret_sha256_update (c->digest, data, size);
}

//  One file of the context, as name in the archive.
static int s_add_file (cli_template_context_t *c, const char *full, const char *name,
                       const struct stat *st)
{
    char link[PATH_MAX];
    ssize_t n;
    if (S_ISLNK (st->st_mode) && (n = readlink (full, link, sizeof link - 1)) >= 0) {
        link[n] = 0;
        s_digest (c, "link", name, link, (size_t) n);
        return cli_tar_add_symlink (c->tar, name, link, st->st_mtime, c->why, sizeof c->why);
    }
    if (!S_ISREG (st->st_mode))
        return 0; //  devices, sockets, fifos: not copied, as Docker does not
    FILE *f = fopen (full, "rb");
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = 0;
    if (!f || cli_where_slurp (f, SBX_XFER_MAX - c->bytes, &data, &size)) {
        snprintf (c->why, sizeof c->why, "%.400s: %s", full,
                  f ? "COPY and ADD take at most 16 MiB per step (too_large)" : strerror (errno));
        rc = -1;
    } else {
        char mode[8];
        snprintf (mode, sizeof mode, "%o", (unsigned) (st->st_mode & 07777));
        s_digest (c, mode, name, data, size);
        rc = cli_tar_add_file (c->tar, name, st->st_mode & 07777, st->st_mtime, data, size, c->why,
                               sizeof c->why);
        c->bytes += size;
    }
    if (f)
        fclose (f);
    free (data);
    return rc;
}

int cli_template_context_add_dir (cli_template_context_t *c, const char *full, const char *target)
{
    *c->why = 0;
    zlist_t *names = cli_files_all (full, c->why, sizeof c->why);
    zlist_t *dirs = names ? cli_files_dirs (full, c->why, sizeof c->why) : NULL;
    int rc = dirs ? 0 : -1;
    for (char *name = dirs ? zlist_first (dirs) : NULL; rc == 0 && name; name = zlist_next (dirs)) {
        char path[PATH_MAX * 2], entry[PATH_MAX * 2];
        snprintf (path, sizeof path, "%s/%s", full, name);
        snprintf (entry, sizeof entry, "%s/%s", target, name);
        struct stat st;
        if (lstat (path, &st) == 0) {
            s_digest (c, "dir", entry, "", 0);
            rc = cli_tar_add_dir (c->tar, entry, st.st_mode & 07777, st.st_mtime, c->why,
                                  sizeof c->why);
        }
    }
    for (char *name = names ? zlist_first (names) : NULL; rc == 0 && name;
         name = zlist_next (names)) {
        char path[PATH_MAX * 2], entry[PATH_MAX * 2];
        snprintf (path, sizeof path, "%s/%s", full, name);
        snprintf (entry, sizeof entry, "%s/%s", target, name);
        struct stat st;
        if (lstat (path, &st) == 0)
            rc = s_add_file (c, path, entry, &st);
    }
    zlist_destroy (&names);
    zlist_destroy (&dirs);
    return rc;
}

//  Appends text to an autofree list (which copies it) and frees text.
static void s_append (zlist_t *list, char *text)
{
    zlist_append (list, text);
    free (text);
}

static bool s_archive_name (const char *path)
{
    const char *ends[] = {".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", NULL};
    for (const char **e = ends; *e; e++)
        if (strlen (path) > strlen (*e) && streq (path + strlen (path) - strlen (*e), *e))
            return true;
    return false;
}

int cli_template_context_add_sources (cli_template_context_t *c, const char *context,
                                      const sbx_df_step_t *step, zlist_t *unpack)
{
    *c->why = 0;
    bool into_dir = step->source_count > 1 || step->dest[strlen (step->dest) - 1] == '/';
    for (size_t i = 0; i < step->source_count; i++) {
        char joined[PATH_MAX * 2], real[PATH_MAX];
        snprintf (joined, sizeof joined, "%s/%s", context, step->sources[i]);
        //  Inside the context, symbolic links followed: nothing outside it is sent.
        bool found = realpath (joined, real) != NULL;
        if (!found || strncmp (real, context, strlen (context)) != 0 ||
            (real[strlen (context)] != 0 && real[strlen (context)] != '/')) {
            snprintf (c->why, sizeof c->why, "%s: %s", step->sources[i],
                      found             ? "outside the build context"
                      : errno == ENOENT ? "no such file in the build context"
                                        : strerror (errno));
            return -1;
        }
        struct stat st;
        if (stat (real, &st) != 0) {
            snprintf (c->why, sizeof c->why, "%s: %s", step->sources[i], strerror (errno));
            return -1;
        }
        const char *base = strrchr (real, '/') + 1;
        const char *dest = step->dest + 1; //  the archive's names have no leading /
        char target[PATH_MAX * 2];
        if (S_ISDIR (st.st_mode)) {
            if (cli_template_context_add_dir (c, real, *dest ? dest : ".") != 0)
                return -1;
            continue;
        }
        if (step->kind == SBX_DF_ADD && s_archive_name (real)) {
            //  A local archive: sent as it is, unpacked at dest in the guest.
            snprintf (target, sizeof target, "tmp/.sbx-add-%zu-%s", i, base);
            s_append (unpack, zsys_sprintf ("/%s %s", target, step->dest));
        } else if (into_dir || S_ISDIR (st.st_mode))
            snprintf (target, sizeof target, "%s%s%s", dest,
                      *dest && dest[strlen (dest) - 1] != '/' ? "/" : "", base);
        else
            snprintf (target, sizeof target, "%s", dest);
        if (s_add_file (c, real, target, &st) != 0)
            return -1;
    }
    return 0;
}

cli_template_context_t *cli_template_context_new (void)
{
    cli_template_context_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->tar = cli_tar_new ();
    self->digest = sbx_secret_sha256_new ();
    if (!self->tar || !self->digest)
        cli_template_context_destroy (&self);
    return self;
}

void cli_template_context_destroy (cli_template_context_t **self_p)
{
    assert (self_p);
    cli_template_context_t *self = *self_p;
    if (!self)
        return;
    cli_tar_destroy (&self->tar);
    sbx_secret_sha256_destroy (&self->digest);
    free (self);
    *self_p = NULL;
}

int cli_template_context_add_data (cli_template_context_t *c, const char *name, const void *data,
                                   size_t size)
{
    *c->why = 0;
    s_digest (c, "644", name, data, size);
    return cli_tar_add_file (c->tar, name, 0644, time (NULL), data, size, c->why, sizeof c->why);
}

const uint8_t *cli_template_context_archive (cli_template_context_t *c, size_t *size_p)
{
    return cli_tar_finish (c->tar, size_p);
}

void cli_template_context_digest (cli_template_context_t *c, char out[65])
{
    sbx_secret_sha256_final (c->digest, out);
}

const char *cli_template_context_why (cli_template_context_t *c)
{
    return c->why;
}

void cli_template_context_set_why (cli_template_context_t *c, const char *why)
{
    snprintf (c->why, sizeof c->why, "%s", why ? why : "");
}

//  --------------------------------------------------------------------------
//  Self test: a context directory walked twice gives the same digest; a changed
//  byte, another; a source outside the context is refused.

static void s_write (const char *path, const char *text)
{
    FILE *f = fopen (path, "w");
    assert (f);
    fputs (text, f);
    fclose (f);
}

static void s_walk (const char *dir, char digest[65], size_t *size)
{
    cli_template_context_t *c = cli_template_context_new ();
    assert (c);
    assert (cli_template_context_add_dir (c, dir, ".") == 0);
    assert (cli_template_context_archive (c, size) && *size > 0);
    cli_template_context_digest (c, digest);
    cli_template_context_destroy (&c);
    assert (c == NULL);
}

void cli_template_context_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/cli_template_context-XXXXXX", path[PATH_MAX];
    assert (mkdtemp (dir));
    snprintf (path, sizeof path, "%s/sub", dir);
    assert (mkdir (path, 0755) == 0);
    snprintf (path, sizeof path, "%s/a.txt", dir);
    s_write (path, "one");
    snprintf (path, sizeof path, "%s/sub/b.txt", dir);
    s_write (path, "two");
    char first[65], again[65], changed[65];
    size_t size;
    s_walk (dir, first, &size);
    s_walk (dir, again, &size);
    assert (streq (first, again));
    s_write (path, "twO");
    s_walk (dir, changed, &size);
    assert (!streq (first, changed));
    //  COPY ..: outside the context.
    cli_template_context_t *c = cli_template_context_new ();
    char *sources[] = {".."};
    sbx_df_step_t step = {
        .kind = SBX_DF_COPY, .sources = sources, .source_count = 1, .dest = "/app/"};
    zlist_t *unpack = zlist_new ();
    zlist_autofree (unpack);
    assert (cli_template_context_add_sources (c, dir, &step, unpack) == -1);
    assert (strstr (cli_template_context_why (c), "outside the build context"));
    zlist_destroy (&unpack);
    cli_template_context_destroy (&c);
    char command[PATH_MAX + 16];
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
}
