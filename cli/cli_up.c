/*  cli_up - `sbx up`: the whole service on one machine, supervised.

    Starts sbx-broker, then sbx-vmd, sbx-snapshotd, sbx-billing, sbx-hookd and sbx-gateway (from
    the directory this executable is in), each once the one before reported ready,
    restarts any that crash, and stops them all on SIGINT/SIGTERM. At the first run it
    creates the admin account and prints its API key and sign-in password (made here,
    or read from stdin with --password-stdin), each shown only then.
*/
#include "cli_call.h"
#include "cli_cluster.h"
#include "cli_commands.h"
#include "cli_password.h"
#include "cli_supervisor.h"
#include "sbx_site.h"
#include "sbx_urls.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <sys/file.h>
#include <unistd.h>

//  The roles a host can have, each the daemon that plays it, in the order they start:
//  the broker first (it binds what the others connect to), the gateway last.
static const struct {
    const char *role;
    const char *daemon;
} s_roles[] = {{"control", "sbx-broker"},
               {"vmd", "sbx-vmd"},
               {"snapshotd", "sbx-snapshotd"},
               {"billing", "sbx-billing"},
               {"hooks", "sbx-hookd"},
               {"gateway", "sbx-gateway"},
               {NULL, NULL}};

//  Whether list (roles's comma-separated value) names role. -1 when it names one that
//  is not a role, with it in *unknown.
static int s_roles_check (sbx_config_t *config, const char **unknown)
{
    char **list = sbx_config_list (config, "roles", NULL);
    static char bad[64];
    int rc = list ? 0 : -1;
    snprintf (bad, sizeof bad, "%s", list ? "" : "(none)");
    for (char **item = list; item && *item && rc == 0; item++) {
        bool known = false;
        for (int i = 0; s_roles[i].role; i++)
            known |= streq (*item, s_roles[i].role);
        if (!known) {
            snprintf (bad, sizeof bad, "%s", *item);
            rc = -1;
        }
    }
    sbx_config_list_free (&list);
    *unknown = bad;
    return rc;
}

static bool s_has_role (sbx_config_t *config, const char *role)
{
    char **list = sbx_config_list (config, "roles", NULL);
    bool found = false;
    for (char **item = list; item && *item; item++)
        found |= streq (*item, role);
    sbx_config_list_free (&list);
    return found;
}

typedef struct {
    sbx_config_t *config;
    zloop_t *loop;
    cli_supervisor_t *supervisor;
    sbx_peer_t *peer;
    char *admin_email;
    char *admin_password; //  made here (shown once in the banner), or NULL when given
    char *admin_hash;     //  its argon2id hash, for the admin account if it is new
} s_up_t;

static void s_banner (s_up_t *self, const char *key_line)
{
    char *base = cli_base_url (self->config);
    char *ca = cli_ca_cert (self->config);
    printf ("sbx is up (data dir %s)\n"
            "  MCP endpoint:    %s/mcp\n"
            "  REST API:        %s/v1\n"
            "  CA certificate:  %s\n"
            "%s"
            "  logs:            %s/logs/\n"
            "  status:          sbx status --data-dir %s --json\n"
            "  stop:            Ctrl-C (or SIGTERM to pid %d)\n",
            sbx_config_data_dir (self->config), base, base, ca ? ca : "(none: plain HTTP)",
            key_line, sbx_config_data_dir (self->config), sbx_config_data_dir (self->config),
            (int) getpid ());
    fflush (stdout);
    free (base);
    free (ca);
}

static void s_on_admin (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_up_t *self = arg;
    sbx_msg_t *reply = *reply_p;
    char line[1024];
    if (reply->type == SBX_MSG_ACCOUNT_CREATE_OK) {
        sbx_account_create_ok_t *ok = sbx_msg_account_create_ok (reply);
        char password[160];
        if (self->admin_password)
            snprintf (password, sizeof password, "%s   (shown only now)", self->admin_password);
        else
            snprintf (password, sizeof password, "the one given on standard input");
        snprintf (line, sizeof line,
                  "  admin account:   %s (%s)\n"
                  "  admin API key:   %s   (shown only now)\n"
                  "  admin password:  %s\n"
                  "                   signs in on /account and /oauth/authorize; change it with\n"
                  "                   sbx account passwd %s\n",
                  ok->email, ok->account_id, ok->api_key, password, ok->email);
    } else if (sbx_msg_error (reply)->code == SBX_E_CONFLICT)
        snprintf (line, sizeof line,
                  "  admin account:   %s (a new key: sbx key create --account %s --preset full;\n"
                  "                   a new password: sbx account passwd %s)\n",
                  self->admin_email, self->admin_email, self->admin_email);
    else
        snprintf (line, sizeof line, "  admin account:   not created: %s\n",
                  sbx_msg_error (reply)->message);
    s_banner (self, line);
    //  Shown once: not kept in memory longer than needed.
    if (self->admin_password)
        sbx_secret_wipe (self->admin_password);
}

//  Every daemon is ready: make sure the admin account exists.
static void s_on_ready (cli_supervisor_t *supervisor, void *arg)
{
    (void) supervisor;
    s_up_t *self = arg;
    //  In a cluster, the first node makes the admin account; the others find it there.
    const char *nodes = sbx_config_get (self->config, "control.nodes", NULL);
    const char *join = sbx_config_get (self->config, "control.join", NULL);
    if (nodes && *nodes && ((join && *join) || !s_has_role (self->config, "control"))) {
        s_banner (self, "  admin account:   the cluster's (sbx account list on any host)\n");
        return;
    }
    self->peer = sbx_peer_new (self->config, SBX_ROLE_CLI, "up");
    if (!self->peer || sbx_peer_start (self->peer, self->loop)) {
        s_banner (self, "  admin account:   cannot reach the broker\n");
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_account_create_t *args = sbx_msg_account_create (request);
    sbx_str_set (&args->email, self->admin_email);
    sbx_str_set (&args->password_hash, self->admin_hash);
    args->admin = true;
    args->with_key = true;
    sbx_peer_request (self->peer, &request, 10000, s_on_admin, self);
}

#define S_GIVE_UP  5           //  failed starts in a row of one daemon that stop sbx up
#define S_NODES_MS (30 * 1000) //  how often a cluster's host refreshes control.nodes

//  A cluster's host: control.nodes in sbx.conf follows the cluster's members, so that the
//  daemons' next starts and the CLI here reach every control node, added ones too (the
//  running daemons learn them from their welcomes).
static int s_on_nodes (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_up_t *self = arg;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_CLUSTER_NODES);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (self->config, &request, 2000, &err);
    if (!reply)
        return 0;
    sbx_cluster_nodes_ok_t *ok = sbx_msg_cluster_nodes_ok (reply);
    char list[2048] = "";
    for (size_t i = 0; i < ok->nodes.count; i++)
        snprintf (list + strlen (list), sizeof list - strlen (list), "%s%s", *list ? "," : "",
                  ok->nodes.items[i].address);
    const char *now = sbx_config_get (self->config, "control.nodes", "");
    if (*list && !streq (list, now)) {
        sbx_info ("control nodes now %s (were %s): saved in sbx.conf", list, now);
        sbx_config_set (self->config, "control.nodes", list);
        if (sbx_config_save (self->config))
            sbx_warn ("cannot save %s/sbx.conf", sbx_config_data_dir (self->config));
    }
    sbx_msg_destroy (&reply);
    return 0;
}

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx up [--data-dir DIR] [--listen HOST:PORT] [--domain DOMAIN]\n"
             "              [--box-domain DOMAIN] [--admin-email EMAIL] [--password-stdin]\n"
             "              [--plain-http] [--roles LIST] [--log-level L]\n"
             "              [--join TOKEN [--address HOST:PORT]]\n\n"
             "Runs the whole service on this machine: sbx-broker, sbx-vmd, sbx-snapshotd,\n"
             "sbx-billing, sbx-hookd and sbx-gateway, each started once the one before is\n"
             "ready, restarted with backoff when it crashes, all stopped cleanly on\n"
             "Ctrl-C/SIGTERM.\n"
             "The first run creates the admin account (admin@DOMAIN) and prints its API key\n"
             "and a sign-in password made for it (sbx account passwd changes it).\n"
             "--listen, --domain and --box-domain are saved in DIR/sbx.conf for the next runs.\n\n"
             "  --data-dir DIR     data directory (default %s)\n"
             "  --listen HOST:PORT where the gateway listens (default 127.0.0.1:8443)\n"
             "  --domain DOMAIN    public name: URLs are https://DOMAIN, sandboxes get\n"
             "                     https://<label>.box.DOMAIN (default localhost)\n"
             "  --box-domain BOX   sandboxes at https://<label>.BOX instead: in public, a\n"
             "                     registrable domain other than DOMAIN's (docs/operations.md)\n"
             "  --admin-email E    the first account's email (default admin@DOMAIN)\n"
             "  --password-stdin   the admin account's password: the first line of standard\n"
             "                     input (at least 8 characters) instead of a made one; used\n"
             "                     at the first run only\n"
             "  --plain-http       serve HTTP instead of HTTPS (tests, or behind a proxy)\n"
             "  --roles LIST       what this host runs, comma-separated: control (the\n"
             "                     broker), gateway, vmd, snapshotd, billing, hooks (default\n"
             "                     all; saved in sbx.conf). Several hosts: docs/operations.md\n"
             "  --join TOKEN       join the cluster a member's `sbx cluster token` admitted\n"
             "                     this host to (its keys and settings are saved first);\n"
             "                     --address HOST:PORT for a control node: where the others\n"
             "                     reach it (its broker at PORT+1, its tap at PORT+2); a\n"
             "                     guest host's HOST also sets vmd.ship (HOST:7300) and\n"
             "                     vmd.relay (HOST:7400) unless sbx.conf has them\n"
             "  --log-level L      debug, info, warn or error, for every daemon\n\n"
             "Logs: DIR/logs/<daemon>.log and sbx-up.log, in log.format (text or json),\n"
             "rotated at log.max_bytes keeping log.keep; SIGHUP reopens them all (for an\n"
             "outside logrotate). See docs/operations.md, \"Logs\".\n",
             sbx_config_default_data_dir ());
}

//  Whether name is a DNS name sbx can put sandbox hosts under: letters, digits, - and .
static bool s_dns_name (const char *name)
{
    size_t len = strlen (name);
    if (len == 0 || len > 200 || name[0] == '.' || name[0] == '-' || name[len - 1] == '.' ||
        strstr (name, ".."))
        return false;
    for (const char *p = name; *p; p++)
        if (!isalnum ((unsigned char) *p) && *p != '-' && *p != '.')
            return false;
    return true;
}

//  Guest pages on the gateway's own site share its SameSite cookies and can plant cookies
//  for its domain: every public deployment should give sandboxes a registrable domain of
//  their own. localhost is not public (browsers also count box.localhost as a site of
//  its own).
static void s_check_box_domain (sbx_config_t *config)
{
    const char *domain = sbx_config_get (config, "domain", "localhost");
    char *box = sbx_urls_box_domain (config);
    if (box && !sbx_site_local (domain) && sbx_site_same (domain, box))
        sbx_warn ("sandboxes' port URLs (*.%s) are the same site as the gateway (%s): any "
                  "public port's page shares the site of the sign-in and consent pages. Set "
                  "box_domain (sbx up --box-domain) to a registrable domain of its own, e.g. "
                  "sbx-box.example.net (docs/operations.md, \"Sandboxes on their own site\")",
                  box, domain);
    free (box);
}

//  The daemons live beside this executable (build/bin, or the install's bin directory).
static char *s_daemon_path (const char *name)
{
    char self[PATH_MAX];
    ssize_t n = readlink ("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return NULL;
    self[n] = 0;
    char *path;
    if (asprintf (&path, "%s/%s", dirname (self), name) < 0)
        return NULL;
    return path;
}

int cli_up_main (int argc, char **argv)
{
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"listen", required_argument, 0, 'l'},
                                      {"domain", required_argument, 0, 'D'},
                                      {"admin-email", required_argument, 0, 'a'},
                                      {"plain-http", no_argument, 0, 'p'},
                                      {"log-level", required_argument, 0, 'L'},
                                      {"box-domain", required_argument, 0, 'B'},
                                      {"password-stdin", no_argument, 0, 'P'},
                                      {"roles", required_argument, 0, 'R'},
                                      {"join", required_argument, 0, 'J'},
                                      {"address", required_argument, 0, 'A'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL, *listen = NULL, *domain = NULL, *admin = NULL, *level = NULL;
    const char *box_domain = NULL, *roles = NULL, *join = NULL, *address = NULL;
    bool plain = false, password_stdin = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'l':
            listen = optarg;
            break;
        case 'D':
            domain = optarg;
            break;
        case 'B':
            box_domain = optarg;
            break;
        case 'a':
            admin = optarg;
            break;
        case 'p':
            plain = true;
            break;
        case 'L':
            level = optarg;
            break;
        case 'P':
            password_stdin = true;
            break;
        case 'R':
            roles = optarg;
            break;
        case 'J':
            join = optarg;
            break;
        case 'A':
            address = optarg;
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
        fprintf (stderr, "sbx up: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (listen && !strrchr (listen, ':')) {
        fprintf (stderr, "sbx up: --listen takes HOST:PORT, e.g. 0.0.0.0:443\n");
        return 2;
    }
    sbx_log_init ("sbx-up", SBX_LOG_INFO);
    s_up_t up = {0};
    up.config = sbx_config_new (data_dir);
    if (!up.config)
        return 1;
    if (listen)
        sbx_config_set (up.config, "listen", listen);
    if (domain)
        sbx_config_set (up.config, "domain", domain);
    if (box_domain)
        sbx_config_set (up.config, "box_domain", box_domain);
    if (plain)
        sbx_config_set (up.config, "tls", "off");
    if (address && !join) {
        fprintf (stderr, "sbx up: --address goes with --join (sbx cluster init sets the first "
                         "node's)\n");
        sbx_config_destroy (&up.config);
        return 2;
    }
    if (join) {
        //  A new member: its keys and settings from the token, saved, then a normal start.
        char why[600];
        if (cli_cluster_join (up.config, join, address, roles, why, sizeof why)) {
            fprintf (stderr, "sbx up: --join: %s. Nothing was started.\n", why);
            sbx_config_destroy (&up.config);
            return 2;
        }
        printf ("joined: %s is host %s of the cluster (%s), roles %s\n",
                sbx_config_data_dir (up.config), sbx_config_get (up.config, "instance", ""),
                sbx_config_get (up.config, "control.nodes", ""),
                sbx_config_get (up.config, "roles", ""));
        roles = NULL;
        //  Every control node admits this host's key within seconds of the token: its
        //  daemons start once the cluster answers it.
        sbx_err_t err = {0};
        for (int tries = 0; tries < 30; tries++) {
            err.code = SBX_OK;
            sbx_msg_t *status = sbx_msg_new (SBX_MSG_SYS_STATUS);
            sbx_msg_t *reply = cli_call (up.config, &status, 1000, &err);
            bool answered = reply != NULL;
            sbx_msg_destroy (&reply);
            if (answered)
                break;
            zclock_sleep (500);
        }
        if (err.code)
            fprintf (stderr,
                     "sbx up: the cluster does not answer this host yet (%s); starting "
                     "anyway, its daemons will keep trying\n",
                     err.message);
    }
    if (roles)
        sbx_config_set (up.config, "roles", roles);
    const char *unknown = NULL;
    if (s_roles_check (up.config, &unknown)) {
        fprintf (stderr,
                 "sbx up: roles: '%s' is not a role (invalid_argument): give any of control, "
                 "gateway, vmd, snapshotd, billing, hooks, comma-separated\n",
                 unknown);
        sbx_config_destroy (&up.config);
        return 2;
    }
    //  Every setting by its kind, before anything starts or is written.
    char why[600];
    if (sbx_config_check (up.config, why, sizeof why)) {
        fprintf (stderr,
                 "sbx up: %s (invalid_argument; from the options or %s/sbx.conf). Nothing was "
                 "started or changed.\n",
                 why, sbx_config_data_dir (up.config));
        sbx_config_destroy (&up.config);
        return 2;
    }
    const char *box = sbx_config_get (up.config, "box_domain", NULL);
    if (box && *box && !s_dns_name (box)) {
        fprintf (stderr,
                 "sbx up: box_domain '%s' is not a DNS name (invalid_argument): use letters, "
                 "digits, - and ., e.g. sbx-box.example.net\n",
                 box);
        sbx_config_destroy (&up.config);
        return 2;
    }
    s_check_box_domain (up.config);

    //  One `sbx up` per data directory; a refused one changes nothing (not sbx.conf: its
    //  --listen would otherwise be the running one's at its next start).
    char *lock_path = sbx_config_path (up.config, "run/up.lock");
    int lock = open (lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    free (lock_path);
    if (lock < 0 || flock (lock, LOCK_EX | LOCK_NB)) {
        fprintf (stderr,
                 "sbx up: another sbx up is running for %s (sbx status --data-dir %s); "
                 "nothing was changed\n",
                 sbx_config_data_dir (up.config), sbx_config_data_dir (up.config));
        if (lock >= 0)
            close (lock);
        sbx_config_destroy (&up.config);
        return 1;
    }
    //  Our own lines in log.format too, on the terminal and in logs/sbx-up.log; the
    //  daemons' first lines, before they read sbx.conf, as well (SBX_LOG_FORMAT).
    const char *log_format = sbx_config_get (up.config, "log.format", "text");
    sbx_log_set_format (log_format);
    setenv ("SBX_LOG_FORMAT", log_format, 1);
    char *own_log = sbx_config_path (up.config, "logs/sbx-up.log");
    if (own_log)
        sbx_log_set_file (own_log, false);
    free (own_log);
    if ((listen || domain || box_domain || plain || roles) && sbx_config_save (up.config))
        sbx_warn ("cannot save %s/sbx.conf: %s", sbx_config_data_dir (up.config), strerror (errno));
    if (asprintf (&up.admin_email, "%s%s", admin ? "" : "admin@",
                  admin ? admin : sbx_config_get (up.config, "domain", "localhost")) < 0)
        return 1;
    //  The admin account's password, for its first run: given, or made and shown once.
    //  Hashed before anything starts (argon2id takes a moment, and stdin is read once).
    int rc_password = 1;
    if (password_stdin)
        up.admin_hash = cli_password_hash_new ("sbx up", true, &rc_password);
    else if ((up.admin_password = cli_password_generate ()))
        up.admin_hash = sbx_secret_password_hash (up.admin_password);
    if (!up.admin_hash) {
        if (!password_stdin)
            fprintf (stderr, "sbx up: cannot make the admin password (out of memory?)\n");
        else
            fprintf (stderr, "sbx up: nothing was started\n");
        free (up.admin_password);
        free (up.admin_email);
        sbx_config_destroy (&up.config);
        close (lock);
        return rc_password;
    }

    char *log_dir = sbx_config_path (up.config, "logs");
    char *status = sbx_config_path (up.config, "run/up.json");
    up.supervisor = cli_supervisor_new (log_dir, status);
    free (log_dir);
    free (status);
    int rc = up.supervisor ? 0 : 1;
    for (int i = 0; rc == 0 && s_roles[i].role; i++) {
        if (!s_has_role (up.config, s_roles[i].role))
            continue;
        const char *const *name = &s_roles[i].daemon;
        char *path = s_daemon_path (*name);
        char *args[] = {path,
                        "--data-dir",
                        (char *) sbx_config_data_dir (up.config),
                        level ? "--log-level" : NULL,
                        (char *) level,
                        NULL};
        if (!path || cli_supervisor_add (up.supervisor, *name, args)) {
            fprintf (stderr, "sbx up: cannot run %s (is sbx built? expected beside %s)\n", *name,
                     path ? path : "sbx");
            rc = 1;
        }
        free (path);
    }
    if (rc == 0) {
        up.loop = zloop_new ();
        cli_supervisor_set_ready_fn (up.supervisor, s_on_ready, &up);
        //  A daemon that cannot start (port in use, bad setting, missing image) fails the
        //  same way each time: after five in a row sbx up stops and says why.
        cli_supervisor_set_give_up (up.supervisor, S_GIVE_UP);
        //  Each daemon reopens its log on SIGHUP; sbx up rotates them by size.
        cli_supervisor_set_logs (
            up.supervisor,
            sbx_config_get_range (up.config, "log.max_bytes", 16u << 20, 0, UINT64_MAX),
            (unsigned) sbx_config_get_range (up.config, "log.keep", 5, 1, 1000));
        const char *nodes = sbx_config_get (up.config, "control.nodes", NULL);
        if (nodes && *nodes) {
            zloop_timer (up.loop, 5000, 1, s_on_nodes, &up); //  soon after a join, then often
            zloop_timer (up.loop, S_NODES_MS, 0, s_on_nodes, &up);
        }
        if (cli_supervisor_start (up.supervisor, up.loop))
            rc = 1;
        else {
            sbx_info ("starting sbx in %s", sbx_config_data_dir (up.config));
            zloop_start (up.loop);
        }
    }
    const char *failure = up.supervisor ? cli_supervisor_failure (up.supervisor) : NULL;
    if (failure) {
        fprintf (stderr,
                 "sbx up: %s. Stopped: fix that and run sbx up again (the daemon's "
                 "log is in %s/logs).\n",
                 failure, sbx_config_data_dir (up.config));
        rc = 1;
    }
    sbx_peer_destroy (&up.peer);
    cli_supervisor_destroy (&up.supervisor);
    zloop_destroy (&up.loop);
    sbx_config_destroy (&up.config);
    free (up.admin_email);
    if (up.admin_password)
        sbx_secret_wipe (up.admin_password);
    free (up.admin_password);
    free (up.admin_hash);
    close (lock);
    return rc;
}
