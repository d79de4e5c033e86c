/*  cli_cp - see cli_cp.h */
#include "cli_cp.h"
#include "cli_call.h"
#include "cli_files.h"
#include "cli_shell.h"
#include "cli_tar.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <sys/stat.h>
#include <unistd.h>

//  A waited exec of command in the sandbox: 0 with its exit code and stdout (fresh), or
//  the exit code of a failure said.
static int s_run (cli_where_t *w, const char *sandbox_id, const char *command, int *code,
                  char **out)
{
    cli_op_t *op = cli_op_new ("sbx sandbox cp", SBX_OP_EXEC);
    cli_op_set (op, "sandboxId", json_string (sandbox_id));
    cli_op_set (op, "command", json_string (command));
    cli_op_set (op, "timeout", json_integer (300));
    json_t *answer = NULL;
    int rc =
        cli_op_check (op) ? 2 : cli_where_call (w, op, SBX_OP_EXEC, NULL, false, &answer, NULL);
    if (rc == 0) {
        *code = (int) json_integer_value (json_object_get (answer, "exitCode"));
        *out = strdup (cli_json_str (answer, "stdout", ""));
        if (*code)
            fprintf (stderr, "sbx sandbox cp: in the sandbox: %s",
                     cli_json_str (answer, "stderr", ""));
    }
    json_decref (answer);
    cli_op_destroy (&op);
    return rc;
}

//  "sb_0123456789:/path" → the id (fresh) and *path; NULL when it names no sandbox.
static char *s_remote_path (const char *arg, const char **path)
{
    const char *colon = strchr (arg, ':');
    if (!colon || strncmp (arg, "sb_", 3) != 0 || colon - arg > 64 || colon[1] != '/')
        return NULL;
    *path = colon + 1;
    return strndup (arg, (size_t) (colon - arg));
}

static const char *s_basename (const char *path)
{
    const char *slash = strrchr (path, '/');
    return slash && slash[1] ? slash + 1 : path;
}

static int s_cp_up (cli_where_t *w, const char *local, const char *sandbox_id, const char *path)
{
    struct stat st;
    if (stat (local, &st) != 0) {
        fprintf (stderr, "sbx sandbox cp: %s: %s\n", local, strerror (errno));
        return 1;
    }
    char *target = path[strlen (path) - 1] == '/' ? zsys_sprintf ("%s%s", path, s_basename (local))
                                                  : strdup (path);
    int rc = 0;
    if (S_ISREG (st.st_mode)) {
        FILE *f = fopen (local, "rb");
        uint8_t *data = NULL;
        size_t size = 0;
        if (!f || cli_where_slurp (f, SBX_XFER_MAX, &data, &size)) {
            fprintf (stderr, "sbx sandbox cp: %s: %s\n", local,
                     f ? "over the limit of 16 MiB (too_large)" : strerror (errno));
            rc = 1;
        } else if ((rc = cli_where_put (w, sandbox_id, target, data, size, st.st_mode & 0777)) == 0)
            printf ("copied %s (%zu bytes) to %s:%s\n", local, size, sandbox_id, target);
        if (f)
            fclose (f);
        free (data);
        free (target);
        return rc;
    }
    if (!S_ISDIR (st.st_mode)) {
        fprintf (stderr, "sbx sandbox cp: %s is not a file or a directory\n", local);
        free (target);
        return 1;
    }
    char why[600];
    zlist_t *names = cli_files_all (local, why, sizeof why);
    zlist_t *dirs = names ? cli_files_dirs (local, why, sizeof why) : NULL;
    cli_tar_t *tar = dirs ? cli_tar_new () : NULL;
    size_t files = 0, bytes = 0;
    //  The directories first, with their modes: empty ones are made too.
    for (char *name = dirs ? zlist_first (dirs) : NULL; rc == 0 && name; name = zlist_next (dirs)) {
        char full[PATH_MAX * 2];
        snprintf (full, sizeof full, "%s/%s", local, name);
        struct stat ds;
        if (lstat (full, &ds) == 0)
            rc = cli_tar_add_dir (tar, name, ds.st_mode & 07777, ds.st_mtime, why, sizeof why);
    }
    zlist_destroy (&dirs);
    for (char *name = names ? zlist_first (names) : NULL; rc == 0 && name;
         name = zlist_next (names)) {
        char full[PATH_MAX * 2];
        snprintf (full, sizeof full, "%s/%s", local, name);
        struct stat fs;
        char link[PATH_MAX];
        ssize_t n;
        if (lstat (full, &fs) == 0 && S_ISLNK (fs.st_mode) &&
            (n = readlink (full, link, sizeof link - 1)) >= 0) {
            link[n] = 0;
            rc = cli_tar_add_symlink (tar, name, link, fs.st_mtime, why, sizeof why);
        } else if (S_ISREG (fs.st_mode)) {
            FILE *f = fopen (full, "rb");
            uint8_t *data = NULL;
            size_t size = 0;
            if (!f || cli_where_slurp (f, SBX_XFER_MAX - bytes, &data, &size)) {
                snprintf (why, sizeof why, "%.400s: %s", full,
                          f ? "the files are over the limit of 16 MiB (too_large)"
                            : strerror (errno));
                rc = -1;
            } else
                rc = cli_tar_add_file (tar, name, fs.st_mode & 0777, fs.st_mtime, data, size, why,
                                       sizeof why);
            bytes += size;
            files++;
            if (f)
                fclose (f);
            free (data);
        }
    }
    size_t size = 0;
    const uint8_t *archive = tar && rc == 0 ? cli_tar_finish (tar, &size) : NULL;
    if (!tar || rc || size > SBX_XFER_MAX) {
        fprintf (stderr, "sbx sandbox cp: %s\n",
                 size > SBX_XFER_MAX ? "the archive is over the limit of 16 MiB (too_large)" : why);
        rc = 1;
    } else {
        char tmp[64];
        snprintf (tmp, sizeof tmp, "/tmp/.sbx-cp-%u.tar", sbx_secret_uniform (UINT32_MAX));
        char *quoted = cli_shell_quote (target);
        char *command = zsys_sprintf (
            "mkdir -p %s && tar -xf %s -C %s --no-same-owner; rc=$?; rm -f %s; exit $rc", quoted,
            tmp, quoted, tmp);
        int code = 0;
        char *out = NULL;
        rc = cli_where_put (w, sandbox_id, tmp, archive, size, 0600);
        if (rc == 0)
            rc = s_run (w, sandbox_id, command, &code, &out);
        if (rc == 0 && code)
            rc = 1;
        if (rc == 0)
            printf ("copied %s (%zu files, %zu bytes) to %s:%s\n", local, files, bytes, sandbox_id,
                    target);
        free (out);
        free (command);
        free (quoted);
    }
    cli_tar_destroy (&tar);
    zlist_destroy (&names);
    free (target);
    return rc;
}

static int s_cp_down (cli_where_t *w, const char *sandbox_id, const char *path, const char *local)
{
    char tmp[64];
    snprintf (tmp, sizeof tmp, "/tmp/.sbx-cp-%u.tar", sbx_secret_uniform (UINT32_MAX));
    char *quoted = cli_shell_quote (path);
    //  A directory becomes one archive there; a file comes as it is.
    char *command = zsys_sprintf ("if [ -d %s ]; then tar -cf %s -C %s . && echo dir; "
                                  "elif [ -f %s ]; then echo file; "
                                  "else echo no file or directory %s >&2; exit 2; fi",
                                  quoted, tmp, quoted, quoted, quoted);
    free (quoted);
    int code = 0;
    char *kind = NULL;
    int rc = s_run (w, sandbox_id, command, &code, &kind);
    free (command);
    if (rc || code) {
        free (kind);
        return rc ? rc : 1;
    }
    bool dir = strncmp (kind, "dir", 3) == 0;
    free (kind);
    uint8_t *data = NULL;
    size_t size = 0;
    rc = cli_where_get (w, sandbox_id, dir ? tmp : path, &data, &size);
    if (dir) {
        char *rm = zsys_sprintf ("rm -f %s", tmp);
        char *ignored = NULL;
        s_run (w, sandbox_id, rm, &code, &ignored);
        free (ignored);
        free (rm);
    }
    struct stat st;
    char *target = !dir && stat (local, &st) == 0 && S_ISDIR (st.st_mode)
                       ? zsys_sprintf ("%s/%s", local, s_basename (path))
                       : strdup (local);
    char why[600];
    size_t files = 0;
    if (rc == 0 && dir) {
        if (zsys_dir_create ("%s", target) != 0 ||
            cli_tar_extract (data, size, target, &files, why, sizeof why)) {
            fprintf (stderr, "sbx sandbox cp: %s\n", errno && !files ? strerror (errno) : why);
            rc = 1;
        } else
            printf ("copied %s:%s (%zu files) to %s\n", sandbox_id, path, files, target);
    } else if (rc == 0) {
        FILE *f = fopen (target, "wb");
        if (!f || fwrite (data, 1, size, f) != size) {
            fprintf (stderr, "sbx sandbox cp: %s: %s\n", target, strerror (errno));
            rc = 1;
        } else
            printf ("copied %s:%s (%zu bytes) to %s\n", sandbox_id, path, size, target);
        if (f)
            fclose (f);
    }
    free (target);
    free (data);
    return rc;
}

int cli_cp (cli_where_t *w, const char *src, const char *dst)
{
    const char *src_path = NULL, *dst_path = NULL;
    char *src_id = s_remote_path (src, &src_path), *dst_id = s_remote_path (dst, &dst_path);
    int rc;
    if (!src_id == !dst_id) {
        fprintf (stderr, "sbx sandbox cp: one side is the sandbox's, as ID:/PATH "
                         "(sbx sandbox cp ./dir sb_0123456789:/root/dir, or the other way)\n");
        rc = 2;
    } else if (src_id)
        rc = s_cp_down (w, src_id, src_path, dst);
    else
        rc = s_cp_up (w, src, dst_id, dst_path);
    free (src_id);
    free (dst_id);
    return rc;
}
