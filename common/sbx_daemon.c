/*  sbx_daemon - see sbx_daemon.h */
#include "sbx_daemon.h"
#include "sbx_clock.h"
#include "sbx_heap.h"
#include "sbx_log.h"
#include "sbx_metrics.h"
#include "sbx_ready.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

struct sbx_daemon_t {
    char *name;
    sbx_config_t *config;
    zloop_t *loop;
    sbx_heap_t *heap; //  large buffers kept while work flows (sbx_heap.h)
    sbx_peer_t *peer;
    sbx_peer_request_fn *request_fn;
    void *request_arg;
    uint64_t started_ms;
    int hup_fd; //  signalfd for SIGHUP: reopen the log file
};

static void s_usage (FILE *out, const char *name, const char *summary)
{
    fprintf (out,
             "usage: %s [--data-dir DIR] [--instance NAME] [--set KEY=VALUE]... [--log-level L]\n"
             "\n%s\n\n"
             "options:\n"
             "  --data-dir DIR    data directory (default %s; env SBX_DATA_DIR)\n"
             "  --instance NAME   instance name, unique per role (default: host name)\n"
             "  --set KEY=VALUE   override a setting of DIR/sbx.conf (repeatable; see\n"
             "                    docs/operations.md for the keys)\n"
             "  --log-level L     debug, info, warn or error (default info)\n"
             "  --help            this text\n"
             "  --version         print the version\n"
             "\nNormally started by `sbx up`, which supervises it. Logs go to stderr, or to\n"
             "the file SBX_LOG_FILE names (reopened on SIGHUP); log.format = text|json.\n",
             name, summary, sbx_config_default_data_dir ());
}

//  SIGHUP: a rotation renamed our log file (sbx up's, or logrotate's): open it again.
static int s_on_hup (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    sbx_daemon_t *self = arg;
    struct signalfd_siginfo info;
    bool hup = false;
    while (read (self->hup_fd, &info, sizeof info) == (ssize_t) sizeof info)
        hup = true;
    if (hup && sbx_log_file () && sbx_log_reopen () == 0)
        sbx_info ("SIGHUP: log file %s reopened", sbx_log_file ());
    else if (hup && !sbx_log_file ())
        sbx_info ("SIGHUP: logs go to stderr; nothing to reopen");
    return 0;
}

sbx_daemon_t *sbx_daemon_new (int argc, char **argv, const char *name, const char *summary,
                              int *exit_code)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"instance", required_argument, 0, 'i'},
                                      {"set", required_argument, 0, 's'},
                                      {"log-level", required_argument, 0, 'l'},
                                      {"help", no_argument, 0, 'h'},
                                      {"version", no_argument, 0, 'V'},
                                      {0, 0, 0, 0}};
    //  Before anything can start a child process that would inherit NOTIFY_SOCKET.
    sbx_ready_init ();
    const char *data_dir = NULL, *instance = NULL, *level = NULL;
    zlist_t *sets = zlist_new ();
    *exit_code = 2;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'i':
            instance = optarg;
            break;
        case 's':
            zlist_append (sets, optarg);
            break;
        case 'l':
            level = optarg;
            break;
        case 'h':
            s_usage (stdout, name, summary);
            *exit_code = 0;
            zlist_destroy (&sets);
            return NULL;
        case 'V':
            printf ("%s %s\n", name, SBX_VERSION);
            *exit_code = 0;
            zlist_destroy (&sets);
            return NULL;
        default:
            s_usage (stderr, name, summary);
            zlist_destroy (&sets);
            return NULL;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "%s: unexpected argument '%s' (see --help)\n", name, argv[optind]);
        zlist_destroy (&sets);
        return NULL;
    }
    if (level)
        setenv ("SBX_LOG_LEVEL", level, 1);
    sbx_log_init (name, SBX_LOG_INFO);
    //  SIGHUP (reopen the log) is read from a signalfd in the loop. Blocked here, before
    //  the first zsock starts libzmq's threads, so every thread inherits the mask: an
    //  unblocked thread would take it with the default action, which ends the process.
    sigset_t hup;
    sigemptyset (&hup);
    sigaddset (&hup, SIGHUP);
    pthread_sigmask (SIG_BLOCK, &hup, NULL);
    sbx_daemon_t *self = calloc (1, sizeof *self);
    self->hup_fd = -1;
    self->name = strdup (name);
    self->started_ms = sbx_clock_now_ms ();
    self->config = sbx_config_new (data_dir);
    if (!self->config) {
        fprintf (stderr, "%s: cannot use data directory %s\n", name,
                 data_dir ? data_dir : sbx_config_default_data_dir ());
        sbx_daemon_destroy (&self);
        zlist_destroy (&sets);
        return NULL;
    }
    if (instance)
        sbx_config_set (self->config, "instance", instance);
    for (char *set = zlist_first (sets); set; set = zlist_next (sets)) {
        char *eq = strchr (set, '=');
        if (eq)
            *eq = 0;
        if (!eq || sbx_config_set (self->config, set, eq + 1)) {
            fprintf (stderr, "%s: --set %s: expected a known KEY=VALUE\n", name, set);
            sbx_daemon_destroy (&self);
            zlist_destroy (&sets);
            return NULL;
        }
    }
    zlist_destroy (&sets);
    //  Every value by its kind, as sbx up checks them, whoever started us (systemd, a
    //  person): a bad one is refused naming its key rather than half-used. An ERROR
    //  line, so that sbx up, should sbx.conf change under it, gives it as the reason.
    char why[600];
    if (sbx_config_check (self->config, why, sizeof why)) {
        sbx_error ("%s (invalid_argument; from --set or %s/sbx.conf)", why,
                   sbx_config_data_dir (self->config));
        sbx_daemon_destroy (&self);
        return NULL;
    }
    sbx_log_set_format (sbx_config_get (self->config, "log.format", "text"));
    //  Under sbx up: the log file is ours to open, so we can open it again after a
    //  rotation. Not passed on to what we run (QEMU, nft).
    const char *log_file = getenv ("SBX_LOG_FILE");
    if (log_file && *log_file)
        sbx_log_set_file (log_file, true);
    unsetenv ("SBX_LOG_FILE");
    //  Every series says which daemon and which of them: "sbx-vmd" counts as vmd.
    sbx_metrics_set_identity (sbx_metrics_here (), strncmp (name, "sbx-", 4) == 0 ? name + 4 : name,
                              sbx_config_get (self->config, "instance", "local"));
    self->loop = zloop_new ();
    self->heap = sbx_heap_new (self->loop);
    self->hup_fd = signalfd (-1, &hup, SFD_NONBLOCK | SFD_CLOEXEC);
    zmq_pollitem_t item = {NULL, self->hup_fd, ZMQ_POLLIN, 0};
    if (self->hup_fd == -1 || zloop_poller (self->loop, &item, s_on_hup, self))
        sbx_warn ("cannot watch for SIGHUP (%s): the log file will not be reopened",
                  strerror (errno));
    *exit_code = 0;
    return self;
}

void sbx_daemon_destroy (sbx_daemon_t **self_p)
{
    assert (self_p);
    sbx_daemon_t *self = *self_p;
    if (!self)
        return;
    sbx_peer_destroy (&self->peer);
    sbx_heap_destroy (&self->heap);
    zloop_destroy (&self->loop);
    if (self->hup_fd != -1)
        close (self->hup_fd);
    sbx_config_destroy (&self->config);
    free (self->name);
    free (self);
    *self_p = NULL;
}

sbx_config_t *sbx_daemon_config (sbx_daemon_t *self)
{
    return self->config;
}

zloop_t *sbx_daemon_loop (sbx_daemon_t *self)
{
    return self->loop;
}

static void s_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    sbx_daemon_t *self = arg;
    sbx_msg_t *request = *request_p;
    if (request->type == SBX_MSG_SYS_STATUS) {
        sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_SYS_STATUS_OK);
        sbx_sys_status_ok_t *status = sbx_msg_sys_status_ok (reply);
        status->role = sbx_peer_role (peer);
        sbx_str_set (&status->instance, sbx_peer_instance (peer));
        status->pid = (uint64_t) getpid ();
        status->started_ms = self->started_ms;
        sbx_str_set (&status->version, SBX_VERSION);
        sbx_peer_send (peer, &reply);
    } else if (self->request_fn)
        self->request_fn (peer, request_p, self->request_arg);
    else {
        sbx_msg_t *error =
            sbx_msg_new_error (request->rid, SBX_E_UNAVAILABLE, "%s does not serve %s yet",
                               self->name, sbx_msg_type_name (request->type));
        sbx_peer_send (peer, &error);
    }
}

static void s_on_welcome (sbx_peer_t *peer, bool first, void *arg)
{
    (void) peer;
    sbx_daemon_t *self = arg;
    if (first) {
        sbx_info ("%s ready", self->name);
        sbx_ready_notify ();
    }
}

sbx_peer_t *sbx_daemon_connect (sbx_daemon_t *self, sbx_role_t role, uint64_t capacity,
                                sbx_peer_request_fn *fn, void *arg)
{
    self->request_fn = fn;
    self->request_arg = arg;
    self->peer = sbx_peer_new (self->config, role, NULL);
    if (!self->peer)
        return NULL;
    sbx_peer_set_capacity (self->peer, capacity, 0);
    sbx_peer_set_request_fn (self->peer, s_on_request, self);
    sbx_peer_set_welcome_fn (self->peer, s_on_welcome, self);
    if (sbx_peer_start (self->peer, self->loop)) {
        sbx_peer_destroy (&self->peer);
        return NULL;
    }
    return self->peer;
}

int sbx_daemon_run (sbx_daemon_t *self)
{
    sbx_info ("%s %s starting (data dir %s)", self->name, SBX_VERSION,
              sbx_config_data_dir (self->config));
    //  zloop returns on SIGINT/SIGTERM: czmq's handler sets zsys_interrupted. It also
    //  returns when the broker refused our name (another live worker has it): a fault
    //  of the set-up that a restart would not mend, hence the exit code.
    zloop_start (self->loop);
    sbx_ready_stopping ();
    if (self->peer && sbx_peer_refused (self->peer)) {
        sbx_info ("%s stopped: refused by the broker", self->name);
        return 1;
    }
    if (self->peer)
        sbx_peer_bye (self->peer, "shutdown");
    sbx_info ("%s stopped", self->name);
    return 0;
}
