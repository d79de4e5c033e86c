/*  cli_backup - `sbx backup DEST`: a data directory copied whole (settings, keys,
    certificates, the four stores, images, templates, snapshots and stopped sandboxes)
    beside a manifest of modes, owners and checksums, for cli_restore to put back.
    What a backup holds and what it does not: docs/upgrading.md. */
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_tree.h"
#include "sbx_db.h"
#include "sbx_dqproxy.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <unistd.h>

//  Never copied: sockets and locks (run/), the supervisor's logs, a template being
//  built (vmd starts it again), SQLite's side files (the copy is whole without them), an
//  event segment being written (the broker writes it again).
static bool s_skipped (const char *rel, const char *name)
{
    //  control/: a cluster node's Raft log and identity, this node's alone; a cluster's
    //  databases are dumped instead (s_backup_cluster).
    static const char *dirs[] = {"run", "logs", "templates/vm/work", "control"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (streq (rel, dirs[i]))
            return true;
    static const char *suffixes[] = {"-wal", "-shm", "-journal", ".tmp", ".part"};
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

static int s_backup_file_from (s_backup_t *b, const char *rel, const char *from,
                               const struct stat *st);

static int s_backup_file (s_backup_t *b, const char *rel, const struct stat *st)
{
    char *src = zsys_sprintf ("%s/%s", b->from, rel);
    int rc = s_backup_file_from (b, rel, src, st);
    free (src);
    return rc;
}

//  rel in the backup, read from the file at from (rel under the data directory, or a
//  dump of a cluster's database).
static int s_backup_file_from (s_backup_t *b, const char *rel, const char *from,
                               const struct stat *st)
{
    char *src = strdup (from), *dst = zsys_sprintf ("%s/%s", b->to, rel);
    char key[64], err[512] = "";
    snprintf (key, sizeof key, "%llu:%llu", (unsigned long long) st->st_dev,
              (unsigned long long) st->st_ino);
    json_t *entry = cli_tree_owner (st);
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
        else if (cli_tree_copy_fd (fd, dst))
            snprintf (err, sizeof err, "cannot copy %s to %s: %s", src, dst, strerror (errno)),
                rc = -1;
        if (fd != -1)
            close (fd);
        char hash[65];
        struct stat copied;
        if (rc == 0 && (cli_tree_hash (dst, hash) || stat (dst, &copied)))
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
            json_t *entry = cli_tree_owner (&st);
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
                json_t *entry = cli_tree_owner (&st);
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

//  A cluster's control node: its databases (control, billing and the snapshot catalog,
//  replicated, on no disk as files) dumped from the leader into the backup as the
//  one-machine files they are copied from at `sbx cluster init`: restored, they start a
//  new cluster (cli_restore).
static int s_backup_cluster (s_backup_t *b, sbx_config_t *config)
{
    char **nodes = NULL;
    sbx_dqproxy_t *proxy = NULL;
    sbx_dqlite_cluster_t where;
    int rc = sbx_dqproxy_cluster (config, &nodes, &proxy, &where);
    if (rc)
        fprintf (stderr, "sbx backup: this cluster node has no control.nodes or cluster key\n");
    //  The snapshot catalog exists once a snapshotd of the cluster started.
    const char *stores[][3] = {{"control", "broker/control.db", "broker"},
                               {"billing", "billing/billing.db", "billing"},
                               {"snapshots", "snapshotd/snapshots.db", "snapshotd"}};
    for (size_t i = 0; rc == 0 && i < 3; i++) {
        const char *dir = stores[i][2];
        bool optional = i == 2;
        char *copy_dir = zsys_sprintf ("%s/%s", b->to, dir);
        struct stat st;
        if (stat (copy_dir, &st) != 0) {
            //  A directory this node never had (a joined node's broker/): made, 0700.
            if (mkdir (copy_dir, 0700) || stat (copy_dir, &st))
                rc = -1;
            else {
                json_t *entry = cli_tree_owner (&st);
                json_object_set_new (entry, "path", json_string (dir));
                json_object_set_new (entry, "type", json_string ("dir"));
                json_array_append_new (b->entries, entry);
            }
        }
        free (copy_dir);
        char *dump = zsys_sprintf ("%s/%s.dump", b->to, dir);
        char err[512] = "";
        if (rc == 0 && sbx_db_dump (&where, stores[i][0], dump, err, sizeof err)) {
            if (optional) {
                printf ("  %-22s not in the cluster (no snapshotd has started): %s\n", stores[i][1],
                        err);
                unlink (dump);
                free (dump);
                continue;
            }
            fprintf (stderr, "sbx backup: the cluster's %s database: %s\n", stores[i][0], err);
            rc = -1;
        }
        if (rc == 0 && stat (dump, &st) == 0) {
            //  The dump copied in as any store is, then gone: its entry is the store's.
            rc = s_backup_file_from (b, stores[i][1], dump, &st);
            unlink (dump);
        }
        free (dump);
        if (rc == 0)
            printf ("  %-12s dumped from the cluster\n", stores[i][1]);
    }
    sbx_dqproxy_destroy (&proxy);
    sbx_config_list_free (&nodes);
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
    fprintf (out, "usage: sbx backup DEST [--data-dir DIR] [--stop-running]\n\n"
                  "Copies the data directory into DEST, a new directory: sbx.conf, keys, TLS\n"
                  "certificates, the broker's, billing's, snapshotd's and hookd's stores (each\n"
                  "copied at one instant, while sbx runs or not), guest images, templates,\n"
                  "snapshots and stopped sandboxes (disk and memory), with DEST/" CLI_TREE_MANIFEST
                  " listing every file's mode,\n"
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
    char *node = zsys_sprintf ("%s/control/node", where);
    bool cluster = stat (node, &st) == 0;
    bool ours = cluster || stat (store, &st) == 0;
    free (store);
    free (node);
    if (!ours) {
        fprintf (stderr,
                 "sbx backup: %s is not an sbx data directory (it has no broker/control.db, nor "
                 "is it a cluster's control node); "
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
        if (rc == 0 && cluster)
            rc = s_backup_cluster (&b, config);
    }
    char host[256] = "";
    gethostname (host, sizeof host - 1);
    json_t *manifest = json_pack (
        "{s:s, s:i, s:s, s:o, s:s, s:s, s:O, s:I, s:I, s:O}", "format", CLI_TREE_FORMAT, "version",
        CLI_TREE_VERSION, "sbx_version", SBX_VERSION, "created", cli_json_time (zclock_time ()),
        "data_dir", from, "host", host, "stores", b.stores, "files", (json_int_t) b.files, "bytes",
        (json_int_t) b.bytes, "entries", b.entries);
    char *manifest_path = zsys_sprintf ("%s/" CLI_TREE_MANIFEST, partial);
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
        cli_tree_remove (partial);
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
