/*  cli_down - `sbx down`: stop everything of one data directory, guests included.

    Guests outlive their vmd by design (a vmd restart re-adopts them), so stopping the
    daemons, by SIGTERM to `sbx up` or `systemctl stop sbx-vmd`, leaves them running.
    This is the full stop:

    1. every running sandbox is stopped through the broker, as `sbx sandbox stop` does:
       its memory is kept and it resumes after the next start. Sandboxes on their way
       (creating, resuming, stopping) are waited for, all within --timeout;
    2. unless --guests, `sbx up` gets SIGTERM and is waited for, with its daemons;
    3. a QEMU of this data directory still running then (a guest that did not stop in
       time, whose stop failed, or everything with --now) is killed. Its vmd records
       that: at once when it runs, else when it starts again ("its QEMU exited while
       vmd was not running"), and the broker moves the sandbox to error.

    Under systemd, sbx-guests.service runs `sbx down --guests` when sbx.target stops,
    before vmd and the broker stop (packaging/systemd/).
*/
#include "cli_call.h"
#include "cli_commands.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#define S_DAEMON_WAIT_MS 70000 //  sbx up stops 5 daemons, each with a 10 s grace
#define S_POLL_MS        100

typedef struct {
    sbx_config_t *config;
    uint64_t deadline; //  monotonic ms by which the guests must have stopped
    int stopped;       //  sandboxes stopped here, memory kept
    int failed;        //  stops refused or failed (their QEMU is killed below)
    bool broker;       //  the broker answered
} s_down_t;

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx down [--data-dir DIR] [--guests] [--timeout SECONDS] [--now]\n\n"
             "Stops everything of this data directory: every running sandbox first (its\n"
             "memory kept, as `sbx sandbox stop` does: it resumes after the next sbx up),\n"
             "then `sbx up` and its daemons, waiting until they are gone. A guest still\n"
             "running after that (its stop failed or took longer than --timeout) is killed;\n"
             "such a sandbox is in state error after the next start (only delete works).\n\n"
             "  --data-dir DIR     data directory (default %s)\n"
             "  --guests           stop the guests only and leave the daemons running (what\n"
             "                     sbx-guests.service does when sbx.target stops)\n"
             "  --timeout SECONDS  how long the guests have to stop (default 60)\n"
             "  --now              do not stop the guests one by one: kill every QEMU once\n"
             "                     the daemons are gone (their sandboxes end in error)\n\n"
             "Exit status: 0 when everything stopped (with --now: was ended), 1 when a guest\n"
             "had to be killed or a process would not end, 2 for a bad option.\n",
             sbx_config_default_data_dir ());
}

static uint64_t s_left_ms (const s_down_t *self)
{
    uint64_t now = sbx_clock_mono_ms ();
    return self->deadline > now ? self->deadline - now : 0;
}

//  Whether pid runs: not gone, and not a zombie its parent has yet to reap.
static bool s_running (pid_t pid)
{
    if (pid <= 0 || (kill (pid, 0) == -1 && errno != EPERM))
        return false;
    char path[64], stat[512];
    snprintf (path, sizeof path, "/proc/%d/stat", (int) pid);
    FILE *file = fopen (path, "r");
    if (!file)
        return false;
    size_t n = fread (stat, 1, sizeof stat - 1, file);
    fclose (file);
    stat[n] = 0;
    const char *paren = strrchr (stat, ')'); //  after "pid (comm)" comes the state
    return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

//  One pass over the broker's sandboxes: stops each ready one (waiting for its answer)
//  and counts those still on their way. Returns that count, or -1 when the broker
//  cannot be asked.
static int s_stop_pass (s_down_t *self, zhashx_t *tried)
{
    sbx_err_t err = {0};
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    sbx_msg_t *reply = cli_call (self->config, &request, 5000, &err);
    if (!reply) {
        fprintf (stderr,
                 "sbx down: cannot list the sandboxes: %s (%s); running guests are killed "
                 "instead of stopped\n",
                 err.message, sbx_code_name (err.code));
        return -1;
    }
    self->broker = true;
    int moving = 0;
    sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
    for (size_t i = 0; i < list->count; i++) {
        const sbx_sandbox_info_t *box = &list->items[i];
        if (box->state == SBX_SANDBOX_STATE_CREATING || box->state == SBX_SANDBOX_STATE_RESUMING ||
            box->state == SBX_SANDBOX_STATE_STOPPING)
            moving++;
        if (box->state != SBX_SANDBOX_STATE_READY || zhashx_lookup (tried, box->id))
            continue;
        zhashx_insert (tried, box->id, (void *) 1);
        uint64_t left = s_left_ms (self);
        if (left == 0) {
            moving++;
            continue;
        }
        request = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, box->id);
        sbx_msg_t *stopped = cli_call (self->config, &request, (int) left, &err);
        if (stopped) {
            printf ("stopped %s (%s): memory kept, resumes after the next start\n", box->id,
                    box->label ? box->label : "");
            self->stopped++;
        } else {
            fprintf (stderr, "sbx down: cannot stop %s: %s (%s)\n", box->id, err.message,
                     sbx_code_name (err.code));
            self->failed++;
        }
        sbx_msg_destroy (&stopped);
    }
    sbx_msg_destroy (&reply);
    return moving;
}

//  Stops every running sandbox through the broker, within the deadline.
static void s_stop_guests (s_down_t *self)
{
    const char *endpoint = sbx_config_get (self->config, "broker.endpoint", NULL);
    bool local = endpoint && strncmp (endpoint, "ipc://", 6) == 0;
    bool absent = local && access (endpoint + 6, F_OK) != 0;
    if (absent)
        return; //  no broker here: whatever QEMU is left is killed below
    zhashx_t *tried = zhashx_new ();
    int moving;
    while ((moving = s_stop_pass (self, tried)) > 0 && s_left_ms (self) > 0)
        zclock_sleep (S_POLL_MS * 2); //  a CLI may wait; nothing else runs here
    if (moving > 0)
        fprintf (stderr, "sbx down: %d sandbox(es) still on their way after the timeout\n", moving);
    zhashx_destroy (&tried);
}

//  The pids up.json names: the supervisor's first, then each daemon's.
static int s_up_pids (s_down_t *self, pid_t *pids, int max)
{
    char *path = sbx_config_path (self->config, "run/up.json");
    json_t *status = json_load_file (path, 0, NULL);
    free (path);
    int count = 0;
    pids[count++] = (pid_t) json_integer_value (json_object_get (status, "supervisor_pid"));
    json_t *entry;
    size_t i;
    json_array_foreach (json_object_get (status, "daemons"), i, entry)
    {
        if (count < max)
            pids[count++] = (pid_t) json_integer_value (json_object_get (entry, "pid"));
    }
    json_decref (status);
    return count;
}

//  Whether an `sbx up` holds this data directory's lock.
static bool s_up_running (s_down_t *self)
{
    char *path = sbx_config_path (self->config, "run/up.lock");
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    free (path);
    if (fd < 0)
        return false;
    bool held = flock (fd, LOCK_EX | LOCK_NB) == -1 && errno == EWOULDBLOCK;
    close (fd);
    return held;
}

//  SIGTERM to `sbx up`, then waits until it and its daemons are gone (SIGKILL to what
//  is left after S_DAEMON_WAIT_MS). Returns 0, or -1 when something had to be killed.
static int s_end_up (s_down_t *self)
{
    if (!s_up_running (self)) {
        printf ("no sbx up runs for %s (under systemd: systemctl stop sbx.target)\n",
                sbx_config_data_dir (self->config));
        return 0;
    }
    pid_t pids[16];
    int count = s_up_pids (self, pids, 16);
    if (pids[0] <= 0 || kill (pids[0], SIGTERM)) {
        fprintf (stderr,
                 "sbx down: sbx up holds %s/run/up.lock but run/up.json names no pid "
                 "to stop (failed_precondition): stop it with Ctrl-C or kill\n",
                 sbx_config_data_dir (self->config));
        return -1;
    }
    printf ("stopping sbx up (pid %d) and its daemons\n", (int) pids[0]);
    fflush (stdout);
    uint64_t until = sbx_clock_mono_ms () + S_DAEMON_WAIT_MS;
    bool left = true;
    while (left && sbx_clock_mono_ms () < until) {
        left = s_up_running (self);
        for (int i = 0; i < count && !left; i++)
            left = s_running (pids[i]);
        if (left)
            zclock_sleep (S_POLL_MS);
    }
    if (!left)
        return 0;
    for (int i = 0; i < count; i++)
        if (s_running (pids[i])) {
            fprintf (stderr, "sbx down: pid %d did not end within %d s: killed\n", (int) pids[i],
                     S_DAEMON_WAIT_MS / 1000);
            kill (pids[i], SIGKILL);
        }
    return -1;
}

//  Whether the process's command line names dir/ (QEMU's names its sandbox's files).
static bool s_qemu_of (pid_t pid, const char *prefix)
{
    char path[64], line[8192];
    snprintf (path, sizeof path, "/proc/%d/cmdline", (int) pid);
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read (fd, line, sizeof line - 1);
    close (fd);
    if (n <= 0)
        return false;
    line[n] = 0;
    const char *base = strrchr (line, '/');
    if (strncmp (base ? base + 1 : line, "qemu-system", 11) != 0)
        return false;
    //  The path starts an argument or follows '=', ':' or ',' (path=DIR/vms/..., unix:...),
    //  so that /srv/x/var/lib/sbx/vms/ is not taken for /var/lib/sbx's.
    for (ssize_t i = 0; i < n; i += (ssize_t) strlen (line + i) + 1)
        for (const char *at = strstr (line + i, prefix); at; at = strstr (at + 1, prefix))
            if (at == line + i || strchr ("=:,", at[-1]))
                return true;
    return false;
}

//  Kills every QEMU whose command line names this data directory's vms/ or templates/,
//  and waits (5 s at most) until they are gone. Returns how many it killed.
static int s_kill_qemus (s_down_t *self)
{
    const char *dir = sbx_config_data_dir (self->config);
    char vms[PATH_MAX + 8], templates[PATH_MAX + 16];
    snprintf (vms, sizeof vms, "%s/vms/", dir);
    snprintf (templates, sizeof templates, "%s/templates/", dir);
    pid_t killed[256];
    int count = 0;
    DIR *proc = opendir ("/proc");
    struct dirent *entry;
    while (proc && (entry = readdir (proc)) && count < 256) {
        pid_t pid = (pid_t) atoi (entry->d_name);
        if (pid > 0 && s_running (pid) && (s_qemu_of (pid, vms) || s_qemu_of (pid, templates)) &&
            kill (pid, SIGKILL) == 0) {
            printf ("killed QEMU pid %d\n", (int) pid);
            killed[count++] = pid;
        }
    }
    if (proc)
        closedir (proc);
    uint64_t until = sbx_clock_mono_ms () + 5000;
    for (int i = 0; i < count; i++)
        while (s_running (killed[i]) && sbx_clock_mono_ms () < until)
            zclock_sleep (S_POLL_MS / 4);
    return count;
}

int cli_down_main (int argc, char **argv)
{
    static struct option options[] = {
        {"data-dir", required_argument, 0, 'd'}, {"guests", no_argument, 0, 'g'},
        {"timeout", required_argument, 0, 't'},  {"now", no_argument, 0, 'n'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *data_dir = NULL;
    bool guests_only = false, now = false;
    long timeout_s = 60;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'g':
            guests_only = true;
            break;
        case 't': {
            char *end;
            errno = 0;
            timeout_s = strtol (optarg, &end, 10);
            if (errno || end == optarg || *end || timeout_s < 0 || timeout_s > 3600) {
                fprintf (stderr,
                         "sbx down: --timeout takes whole seconds from 0 to 3600, not "
                         "'%s' (invalid_argument)\n",
                         optarg);
                return 2;
            }
            break;
        }
        case 'n':
            now = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "sbx down: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    s_down_t down = {.deadline = sbx_clock_mono_ms () + (uint64_t) timeout_s * 1000};
    down.config = sbx_config_new (data_dir);
    if (!down.config) {
        fprintf (stderr, "sbx down: cannot use the data directory %s (not_found)\n",
                 data_dir ? data_dir : sbx_config_default_data_dir ());
        return 1;
    }
    if (!now)
        s_stop_guests (&down);
    int rc = 0;
    if (!guests_only && s_end_up (&down))
        rc = 1;
    int killed = s_kill_qemus (&down);
    if (killed && !now) {
        fprintf (stderr,
                 "sbx down: %d guest(s) did not stop in time and were killed: their sandboxes "
                 "are in state error after the next start (only delete works)\n",
                 killed);
        rc = 1;
    }
    printf ("%s: %d sandbox(es) stopped with their memory, %d QEMU killed%s\n",
            guests_only ? "guests stopped" : "sbx is down", down.stopped, killed,
            down.failed ? ", some stops failed (see above)" : "");
    sbx_config_destroy (&down.config);
    return rc;
}
