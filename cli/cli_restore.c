/*  cli_restore - `sbx restore SRC`: a backup (cli_backup) put into a fresh data
    directory, each file checked against the manifest, and every path that named the old
    directory made to name the new one (disk images' backing files, vmd's guest.json, the
    stores' text columns, sbx.conf). docs/upgrading.md. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_tree.h"
#include "sbx_db.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

//  ------------------------------------------------------------------------------------
//  sbx restore

typedef struct {
    const char *src;  //  SRC/data
    char *stage;      //  NEW.restoring-PID/ while it is built
    const char *from; //  the backed-up data directory's path
    const char *to;   //  the new one's
    bool as_root;
} s_restore_t;

static int s_ids (json_t *entry, uid_t *uid, gid_t *gid, char *err, size_t err_size)
{
    const char *user = json_string_value (json_object_get (entry, "user"));
    const char *group = json_string_value (json_object_get (entry, "group"));
    json_t *nuid = json_object_get (entry, "uid");
    json_t *ngid = json_object_get (entry, "gid");
    struct passwd *pw = user && *user ? getpwnam (user) : NULL;
    struct group *gr = group && *group ? getgrnam (group) : NULL;
    //  A guest's QEMU runs as a uid with no passwd entry: that one is kept by number.
    bool by_uid = (!user || !*user) && json_is_integer (nuid) && json_integer_value (nuid) > 0 &&
                  json_integer_value (nuid) < (json_int_t) UINT32_MAX;
    bool by_gid = (!group || !*group) && json_is_integer (ngid) && json_integer_value (ngid) > 0 &&
                  json_integer_value (ngid) < (json_int_t) UINT32_MAX;
    if ((!pw && !by_uid) || (!gr && !by_gid)) {
        snprintf (err, err_size,
                  "%s belongs to %s:%s, and this machine has no such %s (sbx-qemu comes with "
                  "scripts/install-deps.sh)",
                  json_string_value (json_object_get (entry, "path")), user ? user : "?",
                  group ? group : "?", pw || by_uid ? "group" : "user");
        return -1;
    }
    *uid = pw ? pw->pw_uid : (uid_t) json_integer_value (nuid);
    *gid = gr ? gr->gr_gid : (gid_t) json_integer_value (ngid);
    return 0;
}

//  A path under the old data directory, moved under the new one; NULL if it is not one.
static char *s_moved (s_restore_t *r, const char *path)
{
    size_t n = strlen (r->from);
    if (strncmp (path, r->from, n) || (path[n] && path[n] != '/'))
        return NULL;
    return zsys_sprintf ("%s%s", r->to, path + n);
}

static int s_run (char *const argv[])
{
    pid_t pid = fork ();
    if (pid == 0) {
        execvp (argv[0], argv);
        _exit (127);
    }
    int status = 0;
    if (pid < 0 || waitpid (pid, &status, 0) != pid)
        return -1;
    return WIFEXITED (status) && WEXITSTATUS (status) == 0 ? 0 : -1;
}

//  A qcow2 image's backing file names the old directory: named anew with qemu-img
//  (-u: the header only, the backing file is not opened).
static int s_move_backing (s_restore_t *r, const char *rel, char *err, size_t err_size)
{
    char *path = zsys_sprintf ("%s/%s", r->stage, rel);
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    uint8_t head[20];
    char backing[PATH_MAX] = "";
    if (fd != -1 && pread (fd, head, sizeof head, 0) == (ssize_t) sizeof head &&
        memcmp (head, "QFI\xfb", 4) == 0) {
        uint64_t offset = 0;
        uint32_t size = 0;
        for (int i = 8; i < 16; i++)
            offset = offset << 8 | head[i];
        for (int i = 16; i < 20; i++)
            size = size << 8 | head[i];
        if (offset && size && size < sizeof backing &&
            pread (fd, backing, size, (off_t) offset) == (ssize_t) size)
            backing[size] = 0;
    }
    if (fd != -1)
        close (fd);
    char *moved = s_moved (r, backing);
    int rc = 0;
    if (moved) {
        //  Its format: what the backing file (restored already) starts with.
        char *staged = zsys_sprintf ("%s%s", r->stage, backing + strlen (r->from));
        int bfd = open (staged, O_RDONLY | O_CLOEXEC);
        char magic[4] = "";
        bool qcow2 =
            bfd != -1 && pread (bfd, magic, 4, 0) == 4 && memcmp (magic, "QFI\xfb", 4) == 0;
        if (bfd != -1)
            close (bfd);
        char *argv[] = {"qemu-img", "rebase", "-u", "-F", qcow2 ? "qcow2" : "raw",
                        "-b",       moved,    path, NULL};
        rc = s_run (argv);
        if (rc)
            snprintf (err, err_size, "qemu-img rebase of %s to %s failed", rel, moved);
        free (staged);
    }
    free (moved);
    free (path);
    return rc;
}

//  vmd's guest.json names its image by path: each string value under the old directory.
static int s_move_json (s_restore_t *r, const char *rel, char *err, size_t err_size)
{
    char *path = zsys_sprintf ("%s/%s", r->stage, rel);
    json_t *root = json_load_file (path, 0, NULL);
    int rc = root ? 0 : -1;
    const char *key;
    json_t *value;
    bool changed = false;
    json_object_foreach (root, key, value)
    {
        char *moved = json_is_string (value) ? s_moved (r, json_string_value (value)) : NULL;
        if (moved) {
            json_string_set (value, moved);
            changed = true;
        }
        free (moved);
    }
    if (changed && json_dump_file (root, path, JSON_INDENT (2)))
        rc = -1;
    if (rc)
        snprintf (err, err_size, "cannot rewrite the paths in %s", rel);
    json_decref (root);
    free (path);
    return rc;
}

//  sbx.conf's values that name a path under the old directory.
static int s_move_conf (s_restore_t *r, const char *rel, char *err, size_t err_size)
{
    char *path = zsys_sprintf ("%s/%s", r->stage, rel);
    FILE *in = fopen (path, "r");
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream (&text, &size);
    char *line = NULL;
    size_t cap = 0;
    while (in && out && getline (&line, &cap, in) > 0) {
        char *eq = strstr (line, " = ");
        char *value = eq ? eq + 3 : NULL;
        if (value)
            value[strcspn (value, "\n")] = 0;
        char *moved = value ? s_moved (r, value) : NULL;
        if (moved)
            fprintf (out, "%.*s = %s\n", (int) (eq - line), line, moved);
        else
            fprintf (out, "%s%s", line, value ? "\n" : "");
        free (moved);
    }
    free (line);
    int rc = in && out ? 0 : -1;
    if (in)
        fclose (in);
    if (out)
        fclose (out);
    FILE *back = rc == 0 ? fopen (path, "w") : NULL;
    if (!back || fwrite (text, 1, size, back) != size)
        rc = -1;
    if (back && fclose (back))
        rc = -1;
    if (rc)
        snprintf (err, err_size, "cannot rewrite the paths in %s", rel);
    free (text);
    free (path);
    return rc;
}

static int s_restore_entry (s_restore_t *r, json_t *entry, char *err, size_t err_size)
{
    const char *rel = json_string_value (json_object_get (entry, "path"));
    const char *type = json_string_value (json_object_get (entry, "type"));
    const char *target = json_string_value (json_object_get (entry, "target"));
    if (!rel || !type || !*rel || rel[0] == '/' || strstr (rel, "..") ||
        (target && streq (type, "hardlink") && strstr (target, ".."))) {
        snprintf (err, err_size, "the manifest has an unusable entry (%s)", rel ? rel : "no path");
        return -1;
    }
    char *dst = zsys_sprintf ("%s/%s", r->stage, rel);
    int rc = 0;
    if (streq (type, "dir")) {
        if (mkdir (dst, 0700))
            snprintf (err, err_size, "cannot create %s: %s", dst, strerror (errno)), rc = -1;
    } else if (streq (type, "hardlink") && target) {
        char *first = zsys_sprintf ("%s/%s", r->stage, target);
        if (link (first, dst))
            snprintf (err, err_size, "cannot link %s: %s", dst, strerror (errno)), rc = -1;
        free (first);
    } else if (streq (type, "symlink") && target && target[0] != '/' && !strstr (target, "..")) {
        if (symlink (target, dst))
            snprintf (err, err_size, "cannot create %s: %s", dst, strerror (errno)), rc = -1;
    } else if (streq (type, "file") || streq (type, "store")) {
        char *src = zsys_sprintf ("%s/%s", r->src, rel);
        int fd = open (src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        char hash[65];
        const char *want = json_string_value (json_object_get (entry, "sha256"));
        if (fd == -1 || cli_tree_copy_fd (fd, dst))
            snprintf (err, err_size, "cannot copy %s: %s", src, strerror (errno)), rc = -1;
        else if (cli_tree_hash (dst, hash) || !want || !streq (hash, want))
            snprintf (err, err_size,
                      "%s is damaged: its SHA-256 is not the one the manifest has; this backup "
                      "cannot be restored whole",
                      src),
                rc = -1;
        if (fd != -1)
            close (fd);
        free (src);
    } else {
        snprintf (err, err_size, "the manifest's entry %s has an unknown type '%s'", rel, type);
        rc = -1;
    }
    free (dst);
    return rc;
}

//  Modes and owners last, files before directories and deeper directories first: a
//  directory made 0711 for QEMU's user is still entered while it is filled.
static int s_restore_owners (s_restore_t *r, json_t *entries, char *err, size_t err_size)
{
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = json_array_size (entries); i-- > 0;) {
            json_t *entry = json_array_get (entries, i);
            const char *type = json_string_value (json_object_get (entry, "type"));
            if (streq (type, "symlink") || streq (type, "hardlink") ||
                streq (type, "dir") != (pass == 1))
                continue;
            char *path = zsys_sprintf ("%s/%s", r->stage,
                                       json_string_value (json_object_get (entry, "path")));
            uid_t uid = 0;
            gid_t gid = 0;
            int rc = r->as_root ? s_ids (entry, &uid, &gid, err, err_size) : 0;
            if (rc == 0 && r->as_root && chown (path, uid, gid))
                snprintf (err, err_size, "cannot chown %s: %s", path, strerror (errno)), rc = -1;
            mode_t mode = (mode_t) json_integer_value (json_object_get (entry, "mode")) & 07777;
            if (rc == 0 && chmod (path, mode))
                snprintf (err, err_size, "cannot chmod %s: %s", path, strerror (errno)), rc = -1;
            free (path);
            if (rc)
                return -1;
        }
    return 0;
}

static int s_restore_paths (s_restore_t *r, json_t *entries, char *err, size_t err_size)
{
    size_t i;
    json_t *entry;
    //  Backing files first need their targets in place: they all are by now.
    json_array_foreach (entries, i, entry)
    {
        const char *rel = json_string_value (json_object_get (entry, "path"));
        const char *type = json_string_value (json_object_get (entry, "type"));
        const char *base = strrchr (rel, '/') ? strrchr (rel, '/') + 1 : rel;
        size_t n = strlen (rel);
        int rc = 0;
        if (streq (type, "store")) {
            char *path = zsys_sprintf ("%s/%s", r->stage, rel);
            rc = sbx_db_file_move_paths (path, r->from, r->to, err, err_size) < 0 ? -1 : 0;
            free (path);
        } else if (streq (type, "file") && n > 6 && streq (rel + n - 6, ".qcow2"))
            rc = s_move_backing (r, rel, err, err_size);
        else if (streq (type, "file") && streq (base, "guest.json"))
            rc = s_move_json (r, rel, err, err_size);
        else if (streq (type, "file") && streq (rel, "sbx.conf"))
            rc = s_move_conf (r, rel, err, err_size);
        if (rc)
            return -1;
    }
    return 0;
}

static void s_restore_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx restore SRC [--data-dir DIR]\n\n"
             "Puts the backup SRC (made by sbx backup) into DIR, which must not exist or be\n"
             "empty: every file is checked against the manifest's SHA-256 first, owners and\n"
             "modes are restored, and every path that named the backed-up data directory\n"
             "(disk images' backing files, vmd's guest.json, the stores, sbx.conf) names DIR.\n"
             "It is built beside DIR and renamed into place at the end: a restore that fails\n"
             "leaves nothing. Then `sbx up --data-dir DIR`: stopped sandboxes resume with\n"
             "their memory, snapshots and keys work as before. See docs/upgrading.md.\n");
}

int cli_restore_main (int argc, char **argv)
{
    static struct option options[] = {
        {"data-dir", required_argument, 0, 'd'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *data_dir = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        if (c == 'd')
            data_dir = optarg;
        else if (c == 'h') {
            s_restore_usage (stdout);
            return 0;
        } else {
            s_restore_usage (stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        s_restore_usage (stderr);
        return 2;
    }
    const char *source = argv[optind];
    if (!data_dir)
        data_dir = sbx_config_default_data_dir ();
    char *manifest_path = zsys_sprintf ("%s/" CLI_TREE_MANIFEST, source);
    json_error_t jerr;
    json_t *manifest = json_load_file (manifest_path, 0, &jerr);
    json_t *entries = json_object_get (manifest, "entries");
    const char *from = json_string_value (json_object_get (manifest, "data_dir"));
    const char *format = json_string_value (json_object_get (manifest, "format"));
    json_int_t version = json_integer_value (json_object_get (manifest, "version"));
    free (manifest_path);
    if (!manifest || !format || !streq (format, CLI_TREE_FORMAT) || !json_is_array (entries) ||
        !from || from[0] != '/') {
        fprintf (stderr, "sbx restore: %s is not an sbx backup (%s/" CLI_TREE_MANIFEST ": %s)\n",
                 source, source, manifest ? "not a backup manifest" : jerr.text);
        json_decref (manifest);
        return 1;
    }
    if (version != CLI_TREE_VERSION) {
        fprintf (stderr,
                 "sbx restore: %s is a backup of format %lld, and this sbx (%s) reads format "
                 "%d: use the sbx that made it (%s)\n",
                 source, (long long) version, SBX_VERSION, CLI_TREE_VERSION,
                 json_string_value (json_object_get (manifest, "sbx_version")));
        json_decref (manifest);
        return 1;
    }
    //  DIR: absent, or an empty directory; its absolute path is what paths will name.
    struct stat st;
    bool exists = lstat (data_dir, &st) == 0;
    DIR *dir = exists && S_ISDIR (st.st_mode) ? opendir (data_dir) : NULL;
    struct dirent *e;
    bool empty = dir != NULL;
    while (dir && (e = readdir (dir)))
        if (!streq (e->d_name, ".") && !streq (e->d_name, ".."))
            empty = false;
    if (dir)
        closedir (dir);
    if (exists && !empty) {
        fprintf (stderr,
                 "sbx restore: %s is not an empty directory; restore into a new one (nothing "
                 "was changed)\n",
                 data_dir);
        json_decref (manifest);
        return 1;
    }
    char *copy = strdup (data_dir), *copy2 = strdup (data_dir);
    char *parent = realpath (dirname (copy), NULL);
    char *to =
        parent ? zsys_sprintf ("%s/%s", streq (parent, "/") ? "" : parent, basename (copy2)) : NULL;
    free (copy);
    free (copy2);
    if (!to) {
        fprintf (stderr, "sbx restore: the directory above %s does not exist\n", data_dir);
        free (parent);
        json_decref (manifest);
        return 1;
    }
    s_restore_t r = {.src = NULL, .from = from, .to = to, .as_root = geteuid () == 0};
    char *src = zsys_sprintf ("%s/data", source);
    r.src = src;
    r.stage = zsys_sprintf ("%s.restoring-%d", to, (int) getpid ());
    char err[1024] = "";
    int rc = 0;
    //  Every owner named must exist here before anything is written.
    size_t i;
    json_t *entry;
    json_array_foreach (entries, i, entry)
    {
        uid_t uid;
        gid_t gid;
        if (r.as_root && s_ids (entry, &uid, &gid, err, sizeof err)) {
            rc = -1;
            break;
        }
    }
    if (rc == 0 && mkdir (r.stage, 0700)) {
        snprintf (err, sizeof err, "cannot create %s: %s", r.stage, strerror (errno));
        rc = -1;
    }
    bool staged = rc == 0;
    uint64_t started = zclock_mono ();
    if (rc == 0) {
        printf ("restoring %s (sbx %s, from %s) into %s\n", source,
                json_string_value (json_object_get (manifest, "sbx_version")), from, to);
        fflush (stdout);
    }
    json_array_foreach (entries, i, entry)
    {
        if (rc == 0)
            rc = s_restore_entry (&r, entry, err, sizeof err);
    }
    if (rc == 0)
        rc = s_restore_paths (&r, entries, err, sizeof err);
    if (rc == 0)
        rc = s_restore_owners (&r, entries, err, sizeof err);
    if (rc == 0) {
        int fd = open (r.stage, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd == -1 || syncfs (fd) || (exists && rmdir (to)) || rename (r.stage, to)) {
            snprintf (err, sizeof err, "cannot move %s to %s: %s", r.stage, to, strerror (errno));
            rc = -1;
        }
        if (fd != -1)
            close (fd);
    }
    //  A cluster node's backup: its dumped databases start a new cluster here, as its
    //  first node (at its old address): it joins no one.
    sbx_config_t *restored = rc == 0 ? sbx_config_new (to) : NULL;
    const char *address = restored ? sbx_config_get (restored, "control.address", NULL) : NULL;
    if (address && *address) {
        char *own = strdup (address);
        sbx_config_set (restored, "control.join", "");
        sbx_config_set (restored, "control.nodes", own);
        if (sbx_config_save (restored)) {
            snprintf (err, sizeof err, "cannot write %s/sbx.conf", to);
            rc = -1;
        } else
            printf ("a cluster's control node: restored as the first node of a new cluster at "
                    "%s\n(its accounts, sandboxes, log and ledger are copied into it at its first "
                    "start; join the other hosts again with sbx cluster token)\n",
                    own);
        free (own);
    }
    sbx_config_destroy (&restored);
    if (rc == 0)
        printf ("restored %lld files (%lld MiB) into %s in %.1f s; start it with\n"
                "  sbx up --data-dir %s\n",
                (long long) json_integer_value (json_object_get (manifest, "files")),
                (long long) (json_integer_value (json_object_get (manifest, "bytes")) >> 20), to,
                (double) (zclock_mono () - started) / 1000.0, to);
    else {
        if (staged)
            cli_tree_remove (r.stage);
        fprintf (stderr, "sbx restore: %s; nothing was changed\n", err);
    }
    free (r.stage);
    free (src);
    free (to);
    free (parent);
    json_decref (manifest);
    return rc == 0 ? 0 : 1;
}
