/*  cli_backup - `sbx backup DEST` and `sbx restore SRC`: a data directory copied whole
    (settings, keys, certificates, the three stores, images, templates, snapshots and
    stopped sandboxes) beside a manifest of modes, owners and checksums, and put back
    into a fresh directory where every path that named the old one names the new one
    (disk images' backing files, vmd's guest.json, the stores' text columns, sbx.conf).
    What a backup holds and what it does not: docs/upgrading.md. */
#include "cli_call.h"
#include "cli_commands.h"
#include "sbx_db.h"
#include "sbx_secret.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MANIFEST "backup.json"
#define FORMAT   "sbx-backup"
#define VERSION  1

//  Never copied: sockets and locks (run/), the supervisor's logs, a template being
//  built (vmd starts it again), SQLite's side files (the copy is whole without them).
static bool s_skipped (const char *rel, const char *name)
{
    static const char *dirs[] = {"run", "logs", "templates/vm/work"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (streq (rel, dirs[i]))
            return true;
    static const char *suffixes[] = {"-wal", "-shm", "-journal", ".tmp"};
    size_t n = strlen (name);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t s = strlen (suffixes[i]);
        if (n > s && streq (name + n - s, suffixes[i]))
            return true;
    }
    return false;
}

static bool s_is_sqlite (int fd)
{
    char head[16];
    return pread (fd, head, sizeof head, 0) == (ssize_t) sizeof head &&
           memcmp (head, "SQLite format 3", 16) == 0;
}

//  Copies what fd holds into a new file at path, holes kept (the guest image is sparse),
//  and makes it reach the disk. 0, or -1 with errno.
static int s_copy_fd (int in, const char *path)
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

static int s_hash_path (const char *path, char out[65])
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

static void s_remove_tree (const char *path)
{
    nftw (path, s_remove_one, 32, FTW_DEPTH | FTW_PHYS);
}

static json_t *s_owner (const struct stat *st)
{
    struct passwd *pw = getpwuid (st->st_uid);
    struct group *gr = getgrgid (st->st_gid);
    return json_pack ("{s:i, s:s, s:s}", "mode", (int) (st->st_mode & 07777), "user",
                      pw ? pw->pw_name : "", "group", gr ? gr->gr_name : "");
}

//  ------------------------------------------------------------------------------------
//  sbx backup

typedef struct {
    const char *from; //  the data directory
    char *to;         //  DEST.partial/data
    json_t *entries;  //  the manifest's, in walk order (a directory before its content)
    json_t *stores;   //  path -> schema version
    json_t *links;    //  "dev:ino" -> the first path of a file with several links
    uint64_t bytes;
    size_t files;
} s_backup_t;

static int s_backup_file (s_backup_t *b, const char *rel, const struct stat *st)
{
    char *src = zsys_sprintf ("%s/%s", b->from, rel), *dst = zsys_sprintf ("%s/%s", b->to, rel);
    char key[64], err[512] = "";
    snprintf (key, sizeof key, "%llu:%llu", (unsigned long long) st->st_dev,
              (unsigned long long) st->st_ino);
    json_t *entry = s_owner (st);
    json_object_set_new (entry, "path", json_string (rel));
    const char *first = json_string_value (json_object_get (b->links, key));
    int rc = 0;
    if (first) {
        //  memory.state is one file in vms/ and snapshots/: kept one file here too.
        char *target = zsys_sprintf ("%s/%s", b->to, first);
        rc = link (target, dst);
        if (rc)
            snprintf (err, sizeof err, "cannot link %s: %s", dst, strerror (errno));
        free (target);
        json_object_set_new (entry, "type", json_string ("hardlink"));
        json_object_set_new (entry, "target", json_string (first));
    } else {
        int fd = open (src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        bool store = fd != -1 && s_is_sqlite (fd);
        int version = 0;
        if (fd == -1 && errno == ENOENT) {
            //  Deleted while the backup ran (a sandbox or snapshot gone): not in it.
            sbx_warn ("%s went away during the backup; it is not in it", src);
            json_decref (entry);
            free (src);
            free (dst);
            return 0;
        }
        if (fd == -1)
            snprintf (err, sizeof err, "cannot read %s: %s", src, strerror (errno)), rc = -1;
        else if (store)
            rc = sbx_db_copy (src, dst, &version, err, sizeof err);
        else if (s_copy_fd (fd, dst))
            snprintf (err, sizeof err, "cannot copy %s to %s: %s", src, dst, strerror (errno)),
                rc = -1;
        if (fd != -1)
            close (fd);
        char hash[65];
        struct stat copied;
        if (rc == 0 && (s_hash_path (dst, hash) || stat (dst, &copied)))
            snprintf (err, sizeof err, "cannot read back %s: %s", dst, strerror (errno)), rc = -1;
        if (rc == 0) {
            json_object_set_new (entry, "type", json_string (store ? "store" : "file"));
            json_object_set_new (entry, "size", json_integer ((json_int_t) copied.st_size));
            json_object_set_new (entry, "sha256", json_string (hash));
            if (store)
                json_object_set_new (b->stores, rel, json_integer (version));
            if (st->st_nlink > 1)
                json_object_set_new (b->links, key, json_string (rel));
            b->bytes += (uint64_t) copied.st_size;
            b->files++;
        }
    }
    if (rc == 0)
        json_array_append (b->entries, entry);
    else
        fprintf (stderr, "sbx backup: %s\n", err);
    json_decref (entry);
    free (src);
    free (dst);
    return rc;
}

static int s_backup_walk (s_backup_t *b, const char *rel)
{
    char *dir = *rel ? zsys_sprintf ("%s/%s", b->from, rel) : strdup (b->from);
    struct dirent **names = NULL;
    int n = scandir (dir, &names, NULL, alphasort);
    if (n < 0) {
        fprintf (stderr, "sbx backup: cannot read %s: %s\n", dir, strerror (errno));
        free (dir);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        if (rc || streq (name, ".") || streq (name, "..")) {
            free (names[i]);
            continue;
        }
        char *child = *rel ? zsys_sprintf ("%s/%s", rel, name) : strdup (name);
        char *path = zsys_sprintf ("%s/%s", b->from, child);
        struct stat st;
        bool dir_done = false;
        if (s_skipped (child, name) || lstat (path, &st))
            ; //  skipped, or gone meanwhile
        else if (S_ISDIR (st.st_mode)) {
            dir_done = true;
            char *copy = zsys_sprintf ("%s/%s", b->to, child);
            json_t *entry = s_owner (&st);
            json_object_set_new (entry, "path", json_string (child));
            json_object_set_new (entry, "type", json_string ("dir"));
            json_array_append_new (b->entries, entry);
            if (mkdir (copy, 0700)) {
                fprintf (stderr, "sbx backup: cannot create %s: %s\n", copy, strerror (errno));
                rc = -1;
            } else
                rc = s_backup_walk (b, child);
            free (copy);
        } else if (S_ISREG (st.st_mode))
            rc = s_backup_file (b, child, &st);
        else if (S_ISLNK (st.st_mode)) {
            char target[PATH_MAX];
            ssize_t len = readlink (path, target, sizeof target - 1);
            if (len >= 0) {
                target[len] = 0;
                json_t *entry = s_owner (&st);
                json_object_set_new (entry, "path", json_string (child));
                json_object_set_new (entry, "type", json_string ("symlink"));
                json_object_set_new (entry, "target", json_string (target));
                json_array_append_new (b->entries, entry);
            }
        } //  sockets and pipes: nothing to keep
        if (!*rel && rc == 0 && dir_done)
            printf ("  %-12s done (%zu files, %llu MiB so far)\n", name, b->files,
                    (unsigned long long) (b->bytes >> 20));
        free (path);
        free (child);
        free (names[i]);
    }
    free (names);
    free (dir);
    return rc;
}

//  The sandboxes whose guest is not at rest (vmd's guest.json says so): their disks and
//  memory change while they run, so a copy of them would be of no instant.
static json_t *s_active_guests (const char *data_dir)
{
    json_t *active = json_array ();
    char *vms = zsys_sprintf ("%s/vms", data_dir);
    DIR *dir = opendir (vms);
    struct dirent *e;
    while (dir && (e = readdir (dir))) {
        if (e->d_name[0] == '.')
            continue;
        char *path = zsys_sprintf ("%s/%s/guest.json", vms, e->d_name);
        json_t *guest = json_load_file (path, 0, NULL);
        const char *state = json_string_value (json_object_get (guest, "state"));
        if (!state || (!streq (state, "stopped") && !streq (state, "error")))
            json_array_append_new (active, json_string (e->d_name));
        json_decref (guest);
        free (path);
    }
    if (dir)
        closedir (dir);
    free (vms);
    return active;
}

static int s_stop_all (sbx_config_t *config, json_t *ids)
{
    size_t i;
    json_t *id;
    json_array_foreach (ids, i, id)
    {
        printf ("stopping %s (its memory is kept)\n", json_string_value (id));
        fflush (stdout);
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, json_string_value (id));
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, 300000, &err);
        if (!reply) {
            fprintf (stderr, "sbx backup: cannot stop %s: %s (%s); nothing was written\n",
                     json_string_value (id), err.message, sbx_code_name (err.code));
            return -1;
        }
        sbx_msg_destroy (&reply);
    }
    return 0;
}

static void s_backup_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx backup DEST [--data-dir DIR] [--stop-running]\n\n"
             "Copies the data directory into DEST, a new directory: sbx.conf, keys, TLS\n"
             "certificates, the broker's, billing's and snapshotd's stores (each copied at one\n"
             "instant, while sbx runs or not), guest images, templates, snapshots and stopped\n"
             "sandboxes (disk and memory), with DEST/" MANIFEST " listing every file's mode,\n"
             "owner and SHA-256. Not copied: logs and run/.\n"
             "A running sandbox's disk and memory change while they are read, so a backup is\n"
             "refused while any runs, naming them; --stop-running first stops each (memory\n"
             "kept: it resumes where it was, here or after sbx restore). Restore with\n"
             "`sbx restore DEST --data-dir NEWDIR`. See docs/upgrading.md.\n");
}

int cli_backup_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"stop-running", no_argument, 0, 's'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL;
    bool stop = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        if (c == 'd')
            data_dir = optarg;
        else if (c == 's')
            stop = true;
        else if (c == 'h') {
            s_backup_usage (stdout);
            return 0;
        } else {
            s_backup_usage (stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        s_backup_usage (stderr);
        return 2;
    }
    const char *dest = argv[optind];
    struct stat st;
    if (lstat (dest, &st) == 0) {
        fprintf (stderr, "sbx backup: %s exists; give a new directory (nothing was written)\n",
                 dest);
        return 1;
    }
    //  A mistyped --data-dir must not become a new, empty one that is backed up.
    const char *where = data_dir ? data_dir : sbx_config_default_data_dir ();
    char *store = zsys_sprintf ("%s/broker/control.db", where);
    bool ours = stat (store, &st) == 0;
    free (store);
    if (!ours) {
        fprintf (stderr,
                 "sbx backup: %s is not an sbx data directory (it has no broker/control.db); "
                 "give it with --data-dir\n",
                 where);
        return 1;
    }
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    const char *from = sbx_config_data_dir (config);
    json_t *active = s_active_guests (from);
    if (json_array_size (active) && stop && s_stop_all (config, active)) {
        json_decref (active);
        sbx_config_destroy (&config);
        return 1;
    }
    if (stop) {
        json_decref (active);
        active = s_active_guests (from);
    }
    if (json_array_size (active)) {
        char *list = json_dumps (active, JSON_COMPACT);
        fprintf (stderr,
                 "sbx backup: %zu sandbox%s running (%s): a running guest's disk changes while "
                 "it is read. Stop %s (sbx sandbox stop ID), or pass --stop-running to stop "
                 "each with its memory kept first (failed_precondition); nothing was written\n",
                 json_array_size (active), json_array_size (active) == 1 ? " is" : "es are", list,
                 json_array_size (active) == 1 ? "it" : "them");
        free (list);
        json_decref (active);
        sbx_config_destroy (&config);
        return 1;
    }
    json_decref (active);

    //  Written beside DEST and renamed at the end: a DEST that exists is whole.
    char *partial = zsys_sprintf ("%s.partial", dest);
    s_backup_t b = {.from = from,
                    .to = zsys_sprintf ("%s/data", partial),
                    .entries = json_array (),
                    .stores = json_object (),
                    .links = json_object ()};
    int rc = 0;
    if (lstat (partial, &st) == 0) {
        fprintf (stderr, "sbx backup: %s is left from a backup that did not finish; remove it\n",
                 partial);
        rc = -1;
    } else if (mkdir (partial, 0700) || mkdir (b.to, 0700)) {
        fprintf (stderr, "sbx backup: cannot create %s: %s\n", partial, strerror (errno));
        rc = -1;
    }
    uint64_t started = zclock_mono ();
    if (rc == 0) {
        printf ("backing up %s into %s\n", from, dest);
        fflush (stdout);
        rc = s_backup_walk (&b, "");
    }
    char host[256] = "";
    gethostname (host, sizeof host - 1);
    json_t *manifest = json_pack ("{s:s, s:i, s:s, s:o, s:s, s:s, s:O, s:I, s:I, s:O}", "format",
                                  FORMAT, "version", VERSION, "sbx_version", SBX_VERSION, "created",
                                  cli_json_time (zclock_time ()), "data_dir", from, "host", host,
                                  "stores", b.stores, "files", (json_int_t) b.files, "bytes",
                                  (json_int_t) b.bytes, "entries", b.entries);
    char *manifest_path = zsys_sprintf ("%s/" MANIFEST, partial);
    if (rc == 0 && json_dump_file (manifest, manifest_path, JSON_INDENT (1))) {
        fprintf (stderr, "sbx backup: cannot write %s\n", manifest_path);
        rc = -1;
    }
    if (rc == 0) {
        int fd = open (partial, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd == -1 || syncfs (fd) || rename (partial, dest)) {
            fprintf (stderr, "sbx backup: cannot finish %s: %s\n", dest, strerror (errno));
            rc = -1;
        }
        if (fd != -1)
            close (fd);
    }
    if (rc == 0)
        printf ("backup done: %s (%zu files, %llu MiB, %.1f s); restore it with\n"
                "  sbx restore %s --data-dir NEWDIR\n",
                dest, b.files, (unsigned long long) (b.bytes >> 20),
                (double) (zclock_mono () - started) / 1000.0, dest);
    else if (lstat (partial, &st) == 0 && S_ISDIR (st.st_mode) && !strstr (partial, "/../")) {
        s_remove_tree (partial);
        fprintf (stderr, "sbx backup: nothing was written\n");
    }
    json_decref (manifest);
    json_decref (b.entries);
    json_decref (b.stores);
    json_decref (b.links);
    free (manifest_path);
    free (b.to);
    free (partial);
    sbx_config_destroy (&config);
    return rc == 0 ? 0 : 1;
}

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
    struct passwd *pw = user && *user ? getpwnam (user) : NULL;
    struct group *gr = group && *group ? getgrnam (group) : NULL;
    if (!pw || !gr) {
        snprintf (err, err_size,
                  "%s belongs to %s:%s, and this machine has no such %s (sbx-qemu comes with "
                  "scripts/install-deps.sh)",
                  json_string_value (json_object_get (entry, "path")), user ? user : "?",
                  group ? group : "?", pw ? "group" : "user");
        return -1;
    }
    *uid = pw->pw_uid;
    *gid = gr->gr_gid;
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
        if (fd == -1 || s_copy_fd (fd, dst))
            snprintf (err, err_size, "cannot copy %s: %s", src, strerror (errno)), rc = -1;
        else if (s_hash_path (dst, hash) || !want || !streq (hash, want))
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
    char *manifest_path = zsys_sprintf ("%s/" MANIFEST, source);
    json_error_t jerr;
    json_t *manifest = json_load_file (manifest_path, 0, &jerr);
    json_t *entries = json_object_get (manifest, "entries");
    const char *from = json_string_value (json_object_get (manifest, "data_dir"));
    const char *format = json_string_value (json_object_get (manifest, "format"));
    json_int_t version = json_integer_value (json_object_get (manifest, "version"));
    free (manifest_path);
    if (!manifest || !format || !streq (format, FORMAT) || !json_is_array (entries) || !from ||
        from[0] != '/') {
        fprintf (stderr, "sbx restore: %s is not an sbx backup (%s/" MANIFEST ": %s)\n", source,
                 source, manifest ? "not a backup manifest" : jerr.text);
        json_decref (manifest);
        return 1;
    }
    if (version != VERSION) {
        fprintf (stderr,
                 "sbx restore: %s is a backup of format %lld, and this sbx (%s) reads format "
                 "%d: use the sbx that made it (%s)\n",
                 source, (long long) version, SBX_VERSION, VERSION,
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
    if (rc == 0)
        printf ("restored %lld files (%lld MiB) into %s in %.1f s; start it with\n"
                "  sbx up --data-dir %s\n",
                (long long) json_integer_value (json_object_get (manifest, "files")),
                (long long) (json_integer_value (json_object_get (manifest, "bytes")) >> 20), to,
                (double) (zclock_mono () - started) / 1000.0, to);
    else {
        if (staged)
            s_remove_tree (r.stage);
        fprintf (stderr, "sbx restore: %s; nothing was changed\n", err);
    }
    free (r.stage);
    free (src);
    free (to);
    free (parent);
    json_decref (manifest);
    return rc == 0 ? 0 : 1;
}
