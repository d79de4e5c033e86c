/*  cli_files - the files of a working directory that a handoff copies (see cli_files.h). */
#include "cli_files.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

void cli_files_parse_z (zlist_t *names, const char *data, size_t size)
{
    zhashx_t *seen = zhashx_new ();
    for (char *name = zlist_first (names); name; name = zlist_next (names))
        zhashx_insert (seen, name, (void *) 1);
    size_t at = 0;
    while (at < size) {
        const char *end = memchr (data + at, 0, size - at);
        size_t n = end ? (size_t) (end - (data + at)) : size - at;
        if (n) {
            char *name = strndup (data + at, n);
            if (zhashx_insert (seen, name, (void *) 1) == 0)
                zlist_append (names, name); //  autofree: the list keeps a copy
            free (name);
        }
        at += n + 1;
    }
    zhashx_destroy (&seen);
}

//  Runs git with args in dir; its stdout into *out (caller frees). The exit status, or -1.
static int s_git (const char *dir, const char *const *args, char **out, size_t *out_size)
{
    int fds[2];
    if (pipe (fds))
        return -1;
    pid_t pid = fork ();
    if (pid < 0) {
        close (fds[0]), close (fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2 (fds[1], 1);
        close (fds[0]), close (fds[1]);
        int null = open ("/dev/null", O_RDWR);
        dup2 (null, 0), dup2 (null, 2);
        if (chdir (dir) == 0)
            execvp ("git", (char *const *) args);
        _exit (127);
    }
    close (fds[1]);
    size_t size = 0, capacity = 65536;
    char *buf = malloc (capacity);
    ssize_t n;
    while (buf && (n = read (fds[0], buf + size, capacity - size)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        size += (size_t) n;
        if (size == capacity) {
            char *grown = realloc (buf, capacity *= 2);
            if (!grown)
                free (buf);
            buf = grown;
        }
    }
    close (fds[0]);
    int status;
    while (waitpid (pid, &status, 0) < 0 && errno == EINTR)
        ;
    *out = buf;
    *out_size = size;
    return buf && WIFEXITED (status) ? WEXITSTATUS (status) : -1;
}

//  Adds the files and links under root/relative to names, and the directories to dirs
//  (when given).
static int s_walk (const char *root, const char *relative, zlist_t *names, zlist_t *dirs, char *why,
                   size_t why_size)
{
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s%s%s", root, *relative ? "/" : "", relative);
    DIR *d = opendir (path);
    if (!d) {
        snprintf (why, why_size, "cannot read the directory %s: %s", path, strerror (errno));
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir (d))) {
        if (streq (e->d_name, ".") || streq (e->d_name, ".."))
            continue;
        char name[PATH_MAX];
        if (snprintf (name, sizeof name, "%s%s%s", relative, *relative ? "/" : "", e->d_name) >=
            (int) sizeof name)
            continue;
        char full[PATH_MAX * 2];
        snprintf (full, sizeof full, "%s/%s", root, name);
        struct stat st;
        if (lstat (full, &st))
            continue;
        if (S_ISDIR (st.st_mode)) {
            if (dirs)
                zlist_append (dirs, name);
            rc = s_walk (root, name, names, dirs, why, why_size);
        } else if (S_ISREG (st.st_mode) || S_ISLNK (st.st_mode))
            zlist_append (names, name);
    }
    closedir (d);
    return rc;
}

static int s_compare (void *a, void *b)
{
    return strcmp (a, b);
}

zlist_t *cli_files_all (const char *dir, char *why, size_t why_size)
{
    zlist_t *names = zlist_new ();
    zlist_autofree (names);
    if (s_walk (dir, "", names, NULL, why, why_size)) {
        zlist_destroy (&names);
        return NULL;
    }
    zlist_sort (names, s_compare);
    return names;
}

zlist_t *cli_files_dirs (const char *dir, char *why, size_t why_size)
{
    zlist_t *names = zlist_new (), *dirs = zlist_new ();
    zlist_autofree (names);
    zlist_autofree (dirs);
    int rc = s_walk (dir, "", names, dirs, why, why_size);
    zlist_destroy (&names);
    if (rc) {
        zlist_destroy (&dirs);
        return NULL;
    }
    zlist_sort (dirs, s_compare); //  a parent sorts before what it holds
    return dirs;
}

zlist_t *cli_files_list (const char *dir, bool *git, char *why, size_t why_size)
{
    zlist_t *names = zlist_new ();
    zlist_autofree (names);
    char *out = NULL;
    size_t size = 0;
    const char *probe[] = {"git", "rev-parse", "--is-inside-work-tree", NULL};
    *git = s_git (dir, probe, &out, &size) == 0 && size >= 4 && memcmp (out, "true", 4) == 0;
    free (out);
    if (*git) {
        const char *list[] = {"git", "ls-files", "--cached", "--others", "--exclude-standard",
                              "-z",  NULL};
        if (s_git (dir, list, &out, &size) != 0) {
            free (out);
            snprintf (why, why_size, "git ls-files failed in %s", dir);
            zlist_destroy (&names);
            return NULL;
        }
        cli_files_parse_z (names, out, size);
        free (out);
        //  Keep what is there now and is a file or a link.
        zlist_t *kept = zlist_new ();
        zlist_autofree (kept);
        for (char *name = zlist_first (names); name; name = zlist_next (names)) {
            char full[PATH_MAX * 2];
            snprintf (full, sizeof full, "%s/%s", dir, name);
            struct stat st;
            if (lstat (full, &st) == 0 && (S_ISREG (st.st_mode) || S_ISLNK (st.st_mode)))
                zlist_append (kept, name);
        }
        zlist_destroy (&names);
        names = kept;
    } else if (s_walk (dir, "", names, NULL, why, why_size)) {
        zlist_destroy (&names);
        return NULL;
    }
    zlist_sort (names, s_compare);
    return names;
}

static void s_write (const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf (path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen (path, "w");
    assert (f);
    fputs (text, f);
    fclose (f);
}

void cli_files_test (bool verbose)
{
    (void) verbose;
    zlist_t *names = zlist_new ();
    zlist_autofree (names);
    cli_files_parse_z (names, "a\0b/c\0\0a\0d", 10);
    assert (zlist_size (names) == 3);
    assert (streq (zlist_first (names), "a") && streq (zlist_next (names), "b/c") &&
            streq (zlist_next (names), "d"));
    zlist_destroy (&names);

    //  A real directory, first without git, then as a work tree with a .gitignore.
    char dir[] = "/tmp/cli_files_test_XXXXXX";
    assert (mkdtemp (dir));
    char sub[1100];
    snprintf (sub, sizeof sub, "%s/src", dir);
    assert (mkdir (sub, 0755) == 0);
    s_write (dir, "README", "hi\n");
    s_write (dir, "src/main.c", "int main(void){return 0;}\n");
    s_write (dir, "secret.log", "ignored\n");
    s_write (dir, ".gitignore", "*.log\n");
    char why[256];
    bool git;
    names = cli_files_list (dir, &git, why, sizeof why);
    assert (names && !git && zlist_size (names) == 4);
    assert (streq (zlist_first (names), ".gitignore"));
    zlist_destroy (&names);

    char command[2048];
    snprintf (command, sizeof command,
              "cd %s && git init -q && git add README .gitignore && "
              "git -c user.email=t@example.com -c user.name=t commit -qm init && "
              "echo new > untracked.txt && rm README",
              dir);
    if (system (command) == 0) {
        names = cli_files_list (dir, &git, why, sizeof why);
        assert (names && git);
        //  README was deleted, secret.log is ignored, .git is git's own.
        assert (zlist_size (names) == 3);
        assert (streq (zlist_first (names), ".gitignore"));
        assert (streq (zlist_next (names), "src/main.c"));
        assert (streq (zlist_next (names), "untracked.txt"));
        zlist_destroy (&names);
    } else
        printf ("cli_files: git is not here, the work tree case is left out\n");
    names = cli_files_list ("/nonexistent-cli-files", &git, why, sizeof why);
    assert (!names && strstr (why, "cannot read the directory"));
    snprintf (command, sizeof command, "rm -rf %s", dir);
    assert (system (command) == 0);
}
