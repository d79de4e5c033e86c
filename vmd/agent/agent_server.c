/*  agent_server - the guest agent's event loop and handlers. See agent_server.h. */
#include "agent_server.h"
#include "agent_frame.h"
#include "agent_ptab.h"
#include "agent_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef SBX_VERSION
#define SBX_VERSION "0.0.0"
#endif

#define MIB                (1024u * 1024)
#define IO_MAX             MIB        //  largest file chunk per request
#define STATUS_MAX         (8u * MIB) //  largest output slice per stream per reply
#define RECONNECT_CHECK_MS 250        //  how often a detached port is looked at
#define MAX_POLLFDS        4096
#define WAIT_MAX_MS        60000 //  longest agent.status wait_ms
#define HELD_MAX           1024  //  status requests held at once
#define PTY_SIZE_MAX       1000  //  rows and cols of a terminal

//  An agent.status waiting for output, the process's end, or its deadline.
typedef struct {
    uint64_t rid;
    pid_t pid;
    uint64_t stdout_offset;
    uint64_t stderr_offset;
    uint64_t max_bytes;
    int64_t deadline; //  monotonic ms
} held_t;

typedef struct {
    const agent_config_t *config;
    agent_frame_t *frame;
    agent_ptab_t *ptab;
    int port_fd;
    bool connected;   //  a host is attached to the port
    sbx_strmap_t env; //  default environment from agent.setup
    bool stop;
    size_t bad_frames; //  since the host attached; only the first few are logged
    held_t *held;      //  agent.status requests held (wait_ms), in no order
    size_t held_count;
} server_t;

static void s_log (server_t *self, const char *format, ...) __attribute__ ((format (printf, 2, 3)));
static void s_log (server_t *self, const char *format, ...)
{
    (void) self;
    va_list args;
    va_start (args, format);
    fprintf (stderr, "sbx-agent: ");
    vfprintf (stderr, format, args);
    fprintf (stderr, "\n");
    va_end (args);
}

void agent_config_init (agent_config_t *config)
{
    memset (config, 0, sizeof *config);
    config->port = "/dev/virtio-ports/agent";
    config->port_fd = -1;
    config->netdev = "eth0";
    config->buf_limit = 8 * MIB;
    config->max_finished = 1000;
    config->budget = 64 * MIB;
    config->max_file_size = 1024 * MIB;
    config->pty_idle_ms = AGENT_PTY_IDLE_MS;
}

//  Queues msg for the host and takes ownership of it. A reply that cannot be encoded
//  (a value above its schema limit) becomes an internal error reply instead.
static void s_send (server_t *self, sbx_msg_t **msg_p)
{
    sbx_msg_t *msg = *msg_p;
    *msg_p = NULL;
    if (!msg)
        return;
    if (self->connected) {
        sbx_err_t err = {0};
        if (agent_frame_send (self->frame, msg, &err) != 0) {
            s_log (self, "cannot send %s: %s", sbx_msg_type_name (msg->type), err.message);
            sbx_msg_t *fail = sbx_msg_new_error (msg->rid, SBX_E_INTERNAL,
                                                 "agent could not encode its %s reply: %s",
                                                 sbx_msg_type_name (msg->type), err.message);
            if (fail)
                agent_frame_send (self->frame, fail, &err);
            sbx_msg_destroy (&fail);
        }
    }
    sbx_msg_destroy (&msg);
}

static void s_send_error (server_t *self, uint64_t rid, sbx_code_t code, const char *message)
{
    sbx_msg_t *reply = sbx_msg_new_error (rid, code ? code : SBX_E_INTERNAL, "%s", message);
    s_send (self, &reply);
}

static void s_read_file_line (const char *path, char *buf, size_t size)
{
    buf[0] = 0;
    FILE *f = fopen (path, "re");
    if (f) {
        if (fgets (buf, (int) size, f))
            buf[strcspn (buf, "\n")] = 0;
        fclose (f);
    }
}

static uint64_t s_uptime_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_BOOTTIME, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static void s_send_hello (server_t *self)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_HELLO);
    if (!msg)
        return;
    sbx_agent_hello_t *hello = sbx_msg_agent_hello (msg);
    char buf[256];
    sbx_str_set (&hello->version, SBX_VERSION);
    s_read_file_line ("/proc/sys/kernel/random/boot_id", buf, sizeof buf);
    if (*buf)
        sbx_str_set (&hello->boot_id, buf);
    hello->pid = (uint64_t) getpid ();
    hello->uptime_ms = s_uptime_ms ();
    if (gethostname (buf, sizeof buf) == 0) {
        buf[64] = 0;
        sbx_str_set (&hello->hostname, buf);
    }
    hello->processes = agent_ptab_size (self->ptab);
    s_send (self, &msg);
}

//  --- environment

static bool s_env_key_ok (const char *key)
{
    return key && *key && !strchr (key, '=');
}

//  "K=V" strings: a base set, then the setup defaults, then (for a terminal) its TERM,
//  then the request's own; a later key replaces an earlier one. Returns a
//  NULL-terminated array to free with s_env_free.
static char **s_env_build (server_t *self, const sbx_strmap_t *extra, bool pty)
{
    static const char *base[][2] = {
        {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        {"HOME", "/root"},
        {"USER", "root"},
        {"LOGNAME", "root"},
        {"SHELL", "/bin/sh"},
        {"LANG", "C.UTF-8"},
        {"TERM", "xterm-256color"},
    };
    //  A real terminal is one, whatever the default says for captured output.
    static const char *terminal[][2] = {{"TERM", "xterm-256color"}};
    size_t nbase = sizeof base / sizeof base[0];
    size_t max = nbase + self->env.count + 1 + (extra ? extra->count : 0) + 1;
    char **envp = calloc (max, sizeof *envp);
    if (!envp)
        return NULL;
    size_t n = 0;
    for (size_t layer = 0; layer < 4; layer++) {
        size_t count = layer == 0   ? nbase
                       : layer == 1 ? self->env.count
                       : layer == 2 ? (pty ? 1 : 0)
                       : extra      ? extra->count
                                    : 0;
        for (size_t i = 0; i < count; i++) {
            const char *key = layer == 0   ? base[i][0]
                              : layer == 1 ? self->env.keys[i]
                              : layer == 2 ? terminal[i][0]
                                           : extra->keys[i];
            const char *value = layer == 0   ? base[i][1]
                                : layer == 1 ? self->env.values[i]
                                : layer == 2 ? terminal[i][1]
                                             : extra->values[i];
            char *entry = NULL;
            if (asprintf (&entry, "%s=%s", key, value ? value : "") < 0)
                continue;
            size_t klen = strlen (key);
            size_t j;
            for (j = 0; j < n; j++)
                if (strncmp (envp[j], key, klen) == 0 && envp[j][klen] == '=')
                    break;
            if (j < n)
                free (envp[j]);
            else
                n++;
            envp[j] = entry;
        }
    }
    return envp;
}

static void s_env_free (char **envp)
{
    for (size_t i = 0; envp && envp[i]; i++)
        free (envp[i]);
    free (envp);
}

static const char *s_env_check (const sbx_strmap_t *env)
{
    for (size_t i = 0; i < env->count; i++)
        if (!s_env_key_ok (env->keys[i]))
            return env->keys[i] ? env->keys[i] : "";
    return NULL;
}

//  --- handlers: one per message type

static void s_handle_ping (server_t *self, sbx_msg_t *req)
{
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_PING_OK);
    if (!reply)
        return;
    sbx_agent_ping_ok_t *ok = sbx_msg_agent_ping_ok (reply);
    char buf[128];
    sbx_str_set (&ok->version, SBX_VERSION);
    s_read_file_line ("/proc/sys/kernel/random/boot_id", buf, sizeof buf);
    if (*buf)
        sbx_str_set (&ok->boot_id, buf);
    ok->uptime_ms = s_uptime_ms ();
    ok->time_ms = (uint64_t) agent_now_ms ();
    s_send (self, &reply);
}

//  Brings the interface up or down. Returns 0, or -1 with errno.
static int s_netdev_set (const char *name, bool up)
{
    int fd = socket (AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct ifreq ifr;
    memset (&ifr, 0, sizeof ifr);
    snprintf (ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    int rc = ioctl (fd, SIOCGIFFLAGS, &ifr);
    if (rc == 0 && (bool) (ifr.ifr_flags & IFF_UP) != up) {
        if (up)
            ifr.ifr_flags |= IFF_UP;
        else
            ifr.ifr_flags &= ~IFF_UP;
        rc = ioctl (fd, SIOCSIFFLAGS, &ifr);
    }
    int saved = errno;
    close (fd);
    errno = saved;
    return rc;
}

//  "aa:bb:cc:dd:ee:ff", a unicast address, into mac. 0, or -1.
static int s_mac_parse (const char *text, unsigned char mac[6])
{
    unsigned int b[6];
    char more;
    if (!text || strlen (text) != 17 ||
        sscanf (text, "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
                &more) != 6)
        return -1;
    for (int i = 0; i < 6; i++)
        mac[i] = (unsigned char) b[i];
    return mac[0] & 1 ? -1 : 0;
}

//  The interface's MAC as text into out (18 bytes): 0, or -1 with errno.
static int s_netdev_mac_get (int fd, const char *name, char *out)
{
    struct ifreq ifr;
    memset (&ifr, 0, sizeof ifr);
    snprintf (ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    if (ioctl (fd, SIOCGIFHWADDR, &ifr) != 0)
        return -1;
    const unsigned char *b = (const unsigned char *) ifr.ifr_hwaddr.sa_data;
    snprintf (out, 18, "%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5]);
    return 0;
}

//  Gives the interface the sandbox's own MAC when it has another (a guest restored from
//  another's memory has that one's), and says in now (18 bytes) the one it has after.
//  The kernel announces a new one with a gratuitous ARP (arp_notify, set here), so QEMU's
//  user network sends to it from its next frame. 0, or -1 with errno.
static int s_netdev_mac (const char *name, const unsigned char mac[6], char *now)
{
    int fd = socket (AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    char want[18];
    snprintf (want, sizeof want, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
              mac[4], mac[5]);
    int rc = s_netdev_mac_get (fd, name, now);
    if (rc == 0 && strcmp (now, want) != 0) {
        char path[128];
        snprintf (path, sizeof path, "/proc/sys/net/ipv4/conf/%s/arp_notify", name);
        int notify = open (path, O_WRONLY | O_CLOEXEC);
        if (notify >= 0) {
            if (write (notify, "1", 1) != 1)
                fprintf (stderr, "sbx-agent: cannot set %s: %s\n", path, strerror (errno));
            close (notify);
        }
        struct ifreq ifr;
        memset (&ifr, 0, sizeof ifr);
        snprintf (ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
        ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
        memcpy (ifr.ifr_hwaddr.sa_data, mac, 6);
        rc = ioctl (fd, SIOCSIFHWADDR, &ifr);
        int saved = errno;
        s_netdev_mac_get (fd, name, now);
        errno = saved;
    }
    int saved = errno;
    close (fd);
    errno = saved;
    return rc;
}

//  Mixes the host's random bytes into the kernel's pool, credited, and reseeds the
//  CRNG at once: a guest restored from a snapshot would otherwise go on producing what
//  its siblings produce until the next scheduled reseed. 0, or -1 with errno.
static int s_entropy_add (const sbx_bytes_t *entropy)
{
    if (entropy->size == 0)
        return 0;
    struct {
        struct rand_pool_info info;
        uint8_t data[4096];
    } pool;
    size_t size = entropy->size < sizeof pool.data ? entropy->size : sizeof pool.data;
    pool.info.entropy_count = (int) (size * 8);
    pool.info.buf_size = (int) size;
    memcpy (pool.data, entropy->data, size);
    int fd = open ("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = ioctl (fd, RNDADDENTROPY, &pool.info);
    int saved = errno;
    //  Older kernels lack RNDRESEEDCRNG; the credited entropy then reseeds soon enough.
    if (rc == 0 && ioctl (fd, RNDRESEEDCRNG) != 0 && errno != EINVAL && errno != ENOTTY)
        rc = -1, saved = errno;
    close (fd);
    errno = saved;
    return rc;
}

//  /etc/hostname and /etc/hosts as sbx-init writes them at boot, for a new hostname.
//  Best effort: the kernel's hostname is what counts; each file is replaced whole.
static void s_etc_hostname (const char *etc, const char *hostname)
{
    char path[300], tmp[310], text[600];
    const char *names[] = {"hostname", "hosts"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf (text, sizeof text, "%s\n", hostname);
        else
            snprintf (text, sizeof text,
                      "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost "
                      "ip6-loopback\n",
                      hostname);
        snprintf (path, sizeof path, "%s/%s", etc, names[i]);
        snprintf (tmp, sizeof tmp, "%s.sbx-tmp", path);
        int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        bool ok = fd >= 0 && write (fd, text, strlen (text)) == (ssize_t) strlen (text);
        if (fd >= 0)
            ok = close (fd) == 0 && ok;
        if (!ok || rename (tmp, path) != 0) {
            fprintf (stderr, "sbx-agent: cannot rewrite %s: %s\n", path, strerror (errno));
            unlink (tmp);
        }
    }
}

static void s_handle_setup (server_t *self, sbx_msg_t *req)
{
    sbx_agent_setup_t *setup = sbx_msg_agent_setup (req);
    char message[512];
    //  Check everything first, so a bad request changes nothing.
    if (setup->hostname && (!*setup->hostname || strlen (setup->hostname) > 64)) {
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT,
                      "hostname must be 1 to 64 characters");
        return;
    }
    const char *bad = s_env_check (&setup->env);
    if (bad) {
        snprintf (message, sizeof message, "env: bad variable name '%.64s'", bad);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    if (setup->time_ms > (uint64_t) INT64_MAX / 1000000) {
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, "time_ms is out of range");
        return;
    }
    unsigned char mac[6];
    if (setup->mac && s_mac_parse (setup->mac, mac)) {
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT,
                      "mac must be a unicast address written aa:bb:cc:dd:ee:ff");
        return;
    }
    char before[256] = "";
    if (gethostname (before, sizeof before) != 0)
        before[0] = 0;
    if (setup->hostname && sethostname (setup->hostname, strlen (setup->hostname)) != 0) {
        snprintf (message, sizeof message, "sethostname %s: %s", setup->hostname, strerror (errno));
        s_send_error (self, req->rid, errno == EPERM ? SBX_E_PERMISSION_DENIED : SBX_E_INTERNAL,
                      message);
        return;
    }
    if (setup->hostname && self->config->etc_dir && strcmp (before, setup->hostname) != 0)
        s_etc_hostname (self->config->etc_dir, setup->hostname);
    if (s_entropy_add (&setup->entropy) != 0) {
        snprintf (message, sizeof message, "cannot add entropy to the kernel: %s",
                  strerror (errno));
        s_send_error (self, req->rid, errno == EPERM ? SBX_E_PERMISSION_DENIED : SBX_E_INTERNAL,
                      message);
        return;
    }
    int64_t adjust = 0;
    if (setup->time_ms) {
        adjust = (int64_t) setup->time_ms - agent_now_ms ();
        struct timespec ts = {.tv_sec = (time_t) (setup->time_ms / 1000),
                              .tv_nsec = (long) (setup->time_ms % 1000) * 1000000};
        if (!self->config->no_clock && clock_settime (CLOCK_REALTIME, &ts) != 0) {
            snprintf (message, sizeof message, "cannot set the clock: %s", strerror (errno));
            s_send_error (self, req->rid, SBX_E_INTERNAL, message);
            return;
        }
    }
    //  The default environment is replaced as a whole, so the host can also remove.
    for (size_t i = 0; i < self->env.count; i++) {
        free (self->env.keys[i]);
        free (self->env.values[i]);
    }
    free (self->env.keys);
    free (self->env.values);
    memset (&self->env, 0, sizeof self->env);
    for (size_t i = 0; i < setup->env.count; i++)
        sbx_strmap_set (&self->env, setup->env.keys[i], setup->env.values[i]);

    //  Best effort: a guest that keeps another's MAC works (each has a network of its own);
    //  the answer says which it has, and vmd warns.
    char mac_now[18] = "";
    if (setup->mac && s_netdev_mac (self->config->netdev, mac, mac_now) != 0 && errno != ENODEV)
        fprintf (stderr, "sbx-agent: cannot set %s's MAC to %s: %s\n", self->config->netdev,
                 setup->mac, strerror (errno));
    if (s_netdev_set (self->config->netdev, !setup->no_network) != 0 &&
        !(errno == ENODEV && setup->no_network)) {
        snprintf (message, sizeof message, "cannot bring %s %s: %s", self->config->netdev,
                  setup->no_network ? "down" : "up", strerror (errno));
        s_send_error (self, req->rid,
                      errno == ENODEV  ? SBX_E_NOT_FOUND
                      : errno == EPERM ? SBX_E_PERMISSION_DENIED
                                       : SBX_E_INTERNAL,
                      message);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_SETUP_OK);
    if (!reply)
        return;
    char name[256];
    if (gethostname (name, sizeof name) == 0) {
        name[64] = 0;
        sbx_str_set (&sbx_msg_agent_setup_ok (reply)->hostname, name);
    }
    sbx_msg_agent_setup_ok (reply)->clock_adjust_ms = adjust;
    if (*mac_now)
        sbx_str_set (&sbx_msg_agent_setup_ok (reply)->mac, mac_now);
    s_send (self, &reply);
}

//  Fills one stream of a reply from offset, at most max bytes. Returns -1 when out of
//  memory. *truncated_p: bytes before the returned ones were dropped; *more_p: max cut it.
static int s_slice (agent_buf_t *buf, uint64_t offset, size_t max, sbx_bytes_t *bytes,
                    uint64_t *from_p, uint64_t *next_p, bool *truncated_p, bool *more_p)
{
    uint64_t end = agent_buf_end (buf);
    uint64_t first = offset < agent_buf_start (buf) ? agent_buf_start (buf) : offset;
    size_t want = first < end ? (size_t) (end - first) : 0;
    if (want > max)
        want = max;
    uint8_t *data = malloc (want ? want : 1);
    if (!data)
        return -1;
    uint64_t from = 0;
    size_t n = agent_buf_read (buf, offset, data, want, &from);
    //  The slice goes as it is read (megabytes of output: a copy costs the guest dearly
    //  under TCG).
    sbx_bytes_take (bytes, &data, n);
    *from_p = from;
    *next_p = from + n;
    *truncated_p = from > offset;
    *more_p = from + n < end;
    return 0;
}

static sbx_msg_t *s_exec_reply (agent_proc_t *proc, uint64_t rid, uint64_t max)
{
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_AGENT_EXEC_OK);
    if (!reply)
        return NULL;
    reply->rid = rid;
    sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
    ok->pid = (uint64_t) proc->pid;
    ok->running = proc->running;
    if (!proc->running) {
        size_t cap = max && max < STATUS_MAX ? (size_t) max : STATUS_MAX;
        bool t1, m1, t2, m2;
        if (s_slice (proc->out, 0, cap, &ok->stdout, &ok->stdout_offset, &ok->stdout_next_offset,
                     &t1, &m1) != 0 ||
            s_slice (proc->err, 0, cap, &ok->stderr, &ok->stderr_offset, &ok->stderr_next_offset,
                     &t2, &m2) != 0) {
            sbx_msg_destroy (&reply);
            return sbx_msg_new_error (rid, SBX_E_INTERNAL, "out of memory");
        }
        ok->stdout_truncated = t1 || m1;
        ok->stderr_truncated = t2 || m2;
        ok->exit_code = proc->exit_code;
        ok->signal = proc->signal;
        ok->timed_out = proc->timed_out;
        ok->duration_ms = (uint64_t) (proc->ended_mono - proc->started_mono);
    }
    return reply;
}

//  agent.status.ok for proc, output from the offsets (at most max bytes per stream, 0:
//  1 MiB); or an error reply when out of memory.
static sbx_msg_t *s_status_reply (server_t *self, agent_proc_t *proc, uint64_t rid,
                                  uint64_t stdout_offset, uint64_t stderr_offset,
                                  uint64_t max_bytes)
{
    //  Whatever the pipes hold now belongs in this answer.
    agent_ptab_drain (self->ptab, proc);
    size_t max = max_bytes ? (size_t) max_bytes : MIB;
    if (max > STATUS_MAX)
        max = STATUS_MAX;
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_AGENT_STATUS_OK);
    if (!reply)
        return NULL;
    reply->rid = rid;
    sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
    ok->pid = (uint64_t) proc->pid;
    ok->running = proc->running;
    ok->exit_code = proc->exit_code;
    ok->signal = proc->signal;
    ok->timed_out = proc->timed_out;
    ok->started_ms = (uint64_t) proc->started_ms;
    ok->ended_ms = (uint64_t) proc->ended_ms;
    if (s_slice (proc->out, stdout_offset, max, &ok->stdout, &ok->stdout_offset,
                 &ok->stdout_next_offset, &ok->stdout_truncated, &ok->stdout_more) != 0 ||
        s_slice (proc->err, stderr_offset, max, &ok->stderr, &ok->stderr_offset,
                 &ok->stderr_next_offset, &ok->stderr_truncated, &ok->stderr_more) != 0) {
        sbx_msg_destroy (&reply);
        return sbx_msg_new_error (rid, SBX_E_INTERNAL, "out of memory");
    }
    return reply;
}

//  There is something to say from those offsets: new output, or the end.
static bool s_status_news (agent_proc_t *proc, uint64_t stdout_offset, uint64_t stderr_offset)
{
    return !proc->running || agent_buf_end (proc->out) > stdout_offset ||
           agent_buf_end (proc->err) > stderr_offset;
}

//  Answers held[index] from proc (NULL: it is gone) and forgets it.
static void s_held_answer (server_t *self, size_t index, agent_proc_t *proc)
{
    held_t held = self->held[index];
    self->held[index] = self->held[--self->held_count];
    if (proc)
        agent_ptab_touch (self->ptab, proc); //  its client waited all along
    sbx_msg_t *reply =
        proc ? s_status_reply (self, proc, held.rid, held.stdout_offset, held.stderr_offset,
                               held.max_bytes)
             : sbx_msg_new_error (held.rid, SBX_E_NOT_FOUND,
                                  "process %d is no longer kept (agent.ps lists the processes "
                                  "the agent keeps)",
                                  (int) held.pid);
    s_send (self, &reply);
}

//  Answers the held requests that have news or whose wait is over. Returns ms until the
//  next deadline, or -1 when none is held. Called once per turn of the loop, so output
//  read anywhere (poll, a drain in a handler) is answered before the loop sleeps.
static int s_held_check (server_t *self)
{
    int64_t now = agent_mono_ms ();
    int64_t next = -1;
    size_t i = 0;
    while (i < self->held_count) {
        held_t *held = &self->held[i];
        agent_proc_t *proc = agent_ptab_find (self->ptab, held->pid);
        if (!proc || held->deadline <= now ||
            s_status_news (proc, held->stdout_offset, held->stderr_offset)) {
            s_held_answer (self, i, proc); //  the last one moved into i
            continue;
        }
        if (next < 0 || held->deadline - now < next)
            next = held->deadline - now;
        i++;
    }
    return (int) next;
}

//  proc ended: its waiters hear it now, before the table may shed it.
static void s_held_on_exit (server_t *self, agent_proc_t *proc)
{
    size_t i = 0;
    while (i < self->held_count)
        if (self->held[i].pid == proc->pid)
            s_held_answer (self, i, proc);
        else
            i++;
}

//  The host detached: their answers could not reach it, the new connection re-asks.
static void s_held_drop (server_t *self)
{
    self->held_count = 0;
}

static void s_on_exit (agent_proc_t *proc, void *arg)
{
    server_t *self = arg;
    if (self->config->verbose)
        s_log (self, "process %d ended: exit %d signal %d%s", (int) proc->pid, proc->exit_code,
               proc->signal, proc->timed_out ? " (timed out)" : "");
    if (proc->waiter) {
        sbx_msg_t *reply = s_exec_reply (proc, proc->waiter_rid, proc->waiter_max);
        s_send (self, &reply);
    }
    s_held_on_exit (self, proc);
}

//  A terminal size field: 0 is the default, else 1 to PTY_SIZE_MAX. Returns false (and
//  answers) when out of range.
static bool s_pty_size_ok (server_t *self, sbx_msg_t *req, const char *name, uint64_t value,
                           bool required)
{
    if ((value || !required) && value <= PTY_SIZE_MAX)
        return true;
    char message[128];
    snprintf (message, sizeof message, "%s must be 1 to %d (got %llu)", name, PTY_SIZE_MAX,
              (unsigned long long) value);
    s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
    return false;
}

static void s_handle_exec (server_t *self, sbx_msg_t *req)
{
    sbx_agent_exec_t *exec = sbx_msg_agent_exec (req);
    char message[512];
    if (!*exec->command) {
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, "command is empty");
        return;
    }
    const char *bad = s_env_check (&exec->env);
    if (bad) {
        snprintf (message, sizeof message, "env: bad variable name '%.64s'", bad);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    if (exec->pty && (!s_pty_size_ok (self, req, "rows", exec->rows, false) ||
                      !s_pty_size_ok (self, req, "cols", exec->cols, false)))
        return;
    if (exec->pty && exec->stdin.data) {
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT,
                      "stdin cannot be given with pty: send it with agent.input");
        return;
    }
    const char *cwd = exec->cwd && *exec->cwd ? exec->cwd : NULL;
    struct stat st;
    if (!cwd)
        cwd = stat ("/root", &st) == 0 && S_ISDIR (st.st_mode) ? "/root" : "/";
    char **envp = s_env_build (self, &exec->env, exec->pty);
    if (!envp) {
        s_send_error (self, req->rid, SBX_E_INTERNAL, "out of memory");
        return;
    }
    //  A terminal's process is there to be talked to: it never holds its request.
    bool detached = exec->detached || exec->pty;
    struct winsize size = {.ws_row = (unsigned short) (exec->rows ? exec->rows : 24),
                           .ws_col = (unsigned short) (exec->cols ? exec->cols : 80)};
    sbx_err_t err = {0};
    agent_proc_t *proc =
        agent_ptab_spawn (self->ptab, exec->command, envp, cwd, &exec->stdin, exec->timeout_ms,
                          detached, exec->pty ? &size : NULL, &err);
    s_env_free (envp);
    if (!proc) {
        s_send_error (self, req->rid, err.code, err.message);
        return;
    }
    if (exec->tag && *exec->tag)
        proc->tag = strdup (exec->tag); //  lost only to out of memory: then kill by pid
    if (self->config->verbose)
        s_log (self, "process %d started%s%s: %.200s", (int) proc->pid,
               detached ? " (detached)" : "", exec->pty ? " (pty)" : "", exec->command);
    if (detached) {
        sbx_msg_t *reply = s_exec_reply (proc, req->rid, 0);
        s_send (self, &reply);
    } else {
        proc->waiter = true;
        proc->waiter_rid = req->rid;
        proc->waiter_max = exec->max_bytes;
    }
}

static agent_proc_t *s_find (server_t *self, sbx_msg_t *req, uint64_t pid)
{
    agent_proc_t *proc = pid <= INT_MAX ? agent_ptab_find (self->ptab, (pid_t) pid) : NULL;
    if (!proc) {
        char message[128];
        snprintf (message, sizeof message,
                  "process %llu not found (agent.ps lists the processes the agent keeps)",
                  (unsigned long long) pid);
        s_send_error (self, req->rid, SBX_E_NOT_FOUND, message);
    }
    return proc;
}

static void s_handle_status (server_t *self, sbx_msg_t *req)
{
    sbx_agent_status_t *status = sbx_msg_agent_status (req);
    if (status->wait_ms > WAIT_MAX_MS) {
        char message[128];
        snprintf (message, sizeof message, "wait_ms %llu is above the limit of %d",
                  (unsigned long long) status->wait_ms, WAIT_MAX_MS);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    agent_proc_t *proc = s_find (self, req, status->pid);
    if (!proc)
        return;
    agent_ptab_touch (self->ptab, proc);
    agent_ptab_drain (self->ptab, proc);
    if (status->wait_ms && !s_status_news (proc, status->stdout_offset, status->stderr_offset)) {
        if (self->held_count == HELD_MAX) {
            s_send_error (self, req->rid, SBX_E_LIMIT_EXCEEDED,
                          "too many agent.status requests wait already; ask again "
                          "without wait_ms or when one is answered");
            return;
        }
        //  Answered by s_held_check or s_held_on_exit; the loop goes on serving.
        self->held[self->held_count++] = (held_t){
            .rid = req->rid,
            .pid = proc->pid,
            .stdout_offset = status->stdout_offset,
            .stderr_offset = status->stderr_offset,
            .max_bytes = status->max_bytes,
            .deadline = agent_mono_ms () + (int64_t) status->wait_ms,
        };
        return;
    }
    sbx_msg_t *reply = s_status_reply (self, proc, req->rid, status->stdout_offset,
                                       status->stderr_offset, status->max_bytes);
    s_send (self, &reply);
}

static void s_handle_input (server_t *self, sbx_msg_t *req)
{
    sbx_agent_input_t *input = sbx_msg_agent_input (req);
    agent_proc_t *proc = s_find (self, req, input->pid);
    if (!proc)
        return;
    agent_ptab_touch (self->ptab, proc);
    sbx_err_t err = {0};
    ssize_t written = agent_ptab_input (self->ptab, proc, input->data.data, input->data.size, &err);
    if (written < 0) {
        s_send_error (self, req->rid, err.code, err.message);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_INPUT_OK);
    if (reply) {
        sbx_msg_agent_input_ok (reply)->pid = (uint64_t) proc->pid;
        sbx_msg_agent_input_ok (reply)->written = (uint64_t) written;
    }
    s_send (self, &reply);
}

static void s_handle_resize (server_t *self, sbx_msg_t *req)
{
    sbx_agent_resize_t *resize = sbx_msg_agent_resize (req);
    if (!s_pty_size_ok (self, req, "rows", resize->rows, true) ||
        !s_pty_size_ok (self, req, "cols", resize->cols, true))
        return;
    agent_proc_t *proc = s_find (self, req, resize->pid);
    if (!proc)
        return;
    agent_ptab_touch (self->ptab, proc);
    struct winsize size = {.ws_row = (unsigned short) resize->rows,
                           .ws_col = (unsigned short) resize->cols};
    sbx_err_t err = {0};
    if (agent_ptab_resize (self->ptab, proc, &size, &err) != 0) {
        s_send_error (self, req->rid, err.code, err.message);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_RESIZE_OK);
    if (reply)
        sbx_msg_agent_resize_ok (reply)->pid = (uint64_t) proc->pid;
    s_send (self, &reply);
}

static void s_handle_kill (server_t *self, sbx_msg_t *req)
{
    sbx_agent_kill_t *k = sbx_msg_agent_kill (req);
    char message[160];
    if (k->signal < 1 || k->signal >= NSIG) {
        snprintf (message, sizeof message, "signal %lld is not a signal number (1 to %d)",
                  (long long) k->signal, NSIG - 1);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    agent_proc_t *proc;
    if (k->pid == 0 && k->tag && *k->tag) {
        //  A foreground exec its waiter gave up on (the gateway's client left, or
        //  cancelled): by the tag it was started with, as its pid was not sent yet.
        if (!(proc = agent_ptab_find_tag (self->ptab, k->tag))) {
            snprintf (message, sizeof message, "no running process has the tag %.64s", k->tag);
            s_send_error (self, req->rid, SBX_E_NOT_FOUND, message);
            return;
        }
    } else if (!(proc = s_find (self, req, k->pid)))
        return;
    //  The whole group: what the shell started goes too. A finished leader's group may
    //  still have members (background jobs).
    if (kill (-proc->pid, (int) k->signal) != 0) {
        if (errno == ESRCH && !proc->running) {
            snprintf (message, sizeof message,
                      "process %d has already exited (exit code %d) and left nothing running",
                      (int) proc->pid, proc->exit_code);
            s_send_error (self, req->rid, SBX_E_FAILED_PRECONDITION, message);
            return;
        }
        if (errno != ESRCH || kill (proc->pid, (int) k->signal) != 0) {
            snprintf (message, sizeof message, "kill %d: %s", (int) proc->pid, strerror (errno));
            s_send_error (self, req->rid, SBX_E_INTERNAL, message);
            return;
        }
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_KILL_OK);
    if (reply)
        sbx_msg_agent_kill_ok (reply)->pid = (uint64_t) proc->pid;
    s_send (self, &reply);
}

static void s_handle_ps (server_t *self, sbx_msg_t *req)
{
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_PS_OK);
    if (!reply)
        return;
    sbx_agent_ps_ok_t *ok = sbx_msg_agent_ps_ok (reply);
    for (size_t i = 0; i < agent_ptab_size (self->ptab); i++) {
        agent_proc_t *proc = agent_ptab_at (self->ptab, i);
        sbx_agent_proc_t *item = sbx_agent_proc_list_append (&ok->processes);
        if (!item)
            break;
        item->pid = (uint64_t) proc->pid;
        sbx_str_set (&item->command, proc->command);
        sbx_str_set (&item->tag, proc->tag);
        item->running = proc->running;
        item->detached = proc->detached;
        item->exit_code = proc->exit_code;
        item->signal = proc->signal;
        item->timed_out = proc->timed_out;
        item->started_ms = (uint64_t) proc->started_ms;
        item->ended_ms = (uint64_t) proc->ended_ms;
    }
    s_send (self, &reply);
}

//  The guest's figures for vmd's samples: read from /proc each time (a few small files).
static void s_handle_stats (server_t *self, sbx_msg_t *req)
{
    agent_stats_t stats;
    if (agent_stats_collect ("/proc", "/", self->config->netdev, &stats)) {
        s_send_error (self, req->rid, SBX_E_INTERNAL, "cannot read /proc/meminfo");
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_STATS_OK);
    if (!reply)
        return;
    sbx_agent_stats_ok_t *ok = sbx_msg_agent_stats_ok (reply);
    ok->memory_total_bytes = stats.memory_total_bytes;
    ok->memory_used_bytes = stats.memory_used_bytes;
    ok->disk_total_bytes = stats.disk_total_bytes;
    ok->disk_used_bytes = stats.disk_used_bytes;
    ok->net_rx_bytes = stats.net_rx_bytes;
    ok->net_tx_bytes = stats.net_tx_bytes;
    s_send (self, &reply);
}

static sbx_code_t s_errno_code (int e)
{
    switch (e) {
    case ENOENT:
        return SBX_E_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS:
        return SBX_E_PERMISSION_DENIED;
    case EISDIR:
    case ENOTDIR:
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
        return SBX_E_INVALID_ARGUMENT;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return SBX_E_TOO_LARGE;
    default:
        return SBX_E_INTERNAL;
    }
}

static void s_file_error (server_t *self, sbx_msg_t *req, const char *what, const char *path, int e)
{
    char message[640];
    if (e == ENOENT)
        snprintf (message, sizeof message, "no such file: %.500s", path);
    else
        snprintf (message, sizeof message, "%s %.500s: %s", what, path, strerror (e));
    s_send_error (self, req->rid, s_errno_code (e), message);
}

//  mkdir -p of the directories above path. Returns 0, or -1 with errno.
static int s_make_parents (const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen (path);
    if (len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy (buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir (buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return 0;
}

static bool s_path_ok (server_t *self, sbx_msg_t *req, const char *path)
{
    if (path[0] != '/') {
        char message[640];
        snprintf (message, sizeof message, "path must be absolute: %.500s", path);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return false;
    }
    return true;
}

static void s_handle_file_write (server_t *self, sbx_msg_t *req)
{
    sbx_agent_file_write_t *w = sbx_msg_agent_file_write (req);
    char message[700];
    if (!s_path_ok (self, req, w->path))
        return;
    if (w->mode > 07777) {
        snprintf (message, sizeof message, "mode %llo is not a permission mode (at most 07777)",
                  (unsigned long long) w->mode);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    uint64_t limit = self->config->max_file_size;
    if (!w->append && (w->offset > limit || w->data.size > limit - w->offset)) {
        snprintf (message, sizeof message,
                  "%.500s would grow to %llu bytes; files written by the agent are limited to "
                  "%llu bytes",
                  w->path, (unsigned long long) w->offset + w->data.size,
                  (unsigned long long) limit);
        s_send_error (self, req->rid, SBX_E_TOO_LARGE, message);
        return;
    }
    if (s_make_parents (w->path) != 0) {
        s_file_error (self, req, "cannot create the directories of", w->path, errno);
        return;
    }
    mode_t mode = w->mode ? (mode_t) w->mode : 0644;
    int fd = open (w->path, O_WRONLY | O_CREAT | O_CLOEXEC, mode);
    if (fd < 0) {
        s_file_error (self, req, "cannot open", w->path, errno);
        return;
    }
    struct stat st;
    if (fstat (fd, &st) != 0 || !S_ISREG (st.st_mode)) {
        close (fd);
        s_file_error (self, req, "cannot write", w->path, S_ISDIR (st.st_mode) ? EISDIR : EINVAL);
        return;
    }
    uint64_t offset = w->append ? (uint64_t) st.st_size : w->offset;
    if (w->append && (offset > limit || w->data.size > limit - offset)) {
        close (fd);
        snprintf (message, sizeof message,
                  "%.500s would grow to %llu bytes; files written by the agent are limited to "
                  "%llu bytes",
                  w->path, (unsigned long long) offset + w->data.size, (unsigned long long) limit);
        s_send_error (self, req->rid, SBX_E_TOO_LARGE, message);
        return;
    }
    int rc = 0;
    if (w->truncate && ftruncate (fd, (off_t) offset) != 0)
        rc = -1;
    if (rc == 0 && w->mode && fchmod (fd, (mode_t) w->mode) != 0)
        rc = -1;
    size_t done = 0;
    while (rc == 0 && done < w->data.size) {
        ssize_t n = pwrite (fd, w->data.data + done, w->data.size - done, (off_t) (offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            rc = -1;
            break;
        }
        done += (size_t) n;
    }
    if (rc == 0 && fstat (fd, &st) != 0)
        rc = -1;
    int saved = errno;
    close (fd);
    if (rc != 0) {
        s_file_error (self, req, "cannot write", w->path, saved);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_FILE_WRITE_OK);
    if (reply)
        sbx_msg_agent_file_write_ok (reply)->size = (uint64_t) st.st_size;
    s_send (self, &reply);
}

static void s_handle_file_read (server_t *self, sbx_msg_t *req)
{
    sbx_agent_file_read_t *r = sbx_msg_agent_file_read (req);
    if (!s_path_ok (self, req, r->path))
        return;
    if (r->length > IO_MAX) {
        char message[128];
        snprintf (message, sizeof message, "length %llu is above the limit of %u bytes per read",
                  (unsigned long long) r->length, IO_MAX);
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
        return;
    }
    size_t length = r->length ? (size_t) r->length : IO_MAX;
    int fd = open (r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        s_file_error (self, req, "cannot open", r->path, errno);
        return;
    }
    struct stat st;
    if (fstat (fd, &st) != 0 || S_ISDIR (st.st_mode)) {
        int e = S_ISDIR (st.st_mode) ? EISDIR : errno;
        close (fd);
        s_file_error (self, req, "cannot read", r->path, e);
        return;
    }
    uint8_t *data = malloc (length);
    if (!data) {
        close (fd);
        s_send_error (self, req->rid, SBX_E_INTERNAL, "out of memory");
        return;
    }
    size_t done = 0;
    int rc = 0;
    while (done < length) {
        ssize_t n = pread (fd, data + done, length - done, (off_t) (r->offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -1;
            break;
        }
        if (n == 0)
            break;
        done += (size_t) n;
        if (!S_ISREG (st.st_mode))
            break; //  a pipe or device: what it has now
    }
    int saved = errno;
    close (fd);
    if (rc != 0) {
        free (data);
        s_file_error (self, req, "cannot read", r->path, saved);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (req, SBX_MSG_AGENT_FILE_READ_OK);
    if (reply) {
        sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok (reply);
        //  The bytes read go as they are: a copy of a megabyte costs the guest dearly
        //  under TCG.
        sbx_bytes_take (&ok->data, &data, done);
        ok->size = (uint64_t) st.st_size;
        ok->eof = S_ISREG (st.st_mode) ? r->offset + done >= (uint64_t) st.st_size : done < length;
    }
    free (data);
    s_send (self, &reply);
}

static void s_dispatch (server_t *self, sbx_msg_t *req)
{
    if (self->config->verbose)
        s_log (self, "request %s rid %llu", sbx_msg_type_name (req->type),
               (unsigned long long) req->rid);
    switch (req->type) {
    case SBX_MSG_AGENT_PING:
        s_handle_ping (self, req);
        break;
    case SBX_MSG_AGENT_SETUP:
        s_handle_setup (self, req);
        break;
    case SBX_MSG_AGENT_EXEC:
        s_handle_exec (self, req);
        break;
    case SBX_MSG_AGENT_STATUS:
        s_handle_status (self, req);
        break;
    case SBX_MSG_AGENT_KILL:
        s_handle_kill (self, req);
        break;
    case SBX_MSG_AGENT_INPUT:
        s_handle_input (self, req);
        break;
    case SBX_MSG_AGENT_RESIZE:
        s_handle_resize (self, req);
        break;
    case SBX_MSG_AGENT_PS:
        s_handle_ps (self, req);
        break;
    case SBX_MSG_AGENT_STATS:
        s_handle_stats (self, req);
        break;
    case SBX_MSG_AGENT_FILE_WRITE:
        s_handle_file_write (self, req);
        break;
    case SBX_MSG_AGENT_FILE_READ:
        s_handle_file_read (self, req);
        break;
    case SBX_MSG_ERROR:
        break; //  never answer an error with an error: that could ping-pong forever
    default: {
        char message[160];
        snprintf (message, sizeof message,
                  "the agent does not handle %s messages (it serves agent.* requests)",
                  sbx_msg_type_name (req->type));
        s_send_error (self, req->rid, SBX_E_INVALID_ARGUMENT, message);
    }
    }
}

//  Handles every whole frame buffered.
static void s_process_input (server_t *self)
{
    while (true) {
        sbx_msg_t *msg = NULL;
        sbx_err_t err = {0};
        int rc = agent_frame_next (self->frame, &msg, &err);
        if (rc == 0)
            break;
        if (rc < 0) {
            //  The console is slow (a serial port under TCG): a host sending junk
            //  must not flood it.
            if (self->config->verbose || ++self->bad_frames <= 10)
                s_log (self, "bad frame: %s", err.message);
            s_send_error (self, err.rid, SBX_E_INVALID_ARGUMENT, err.message);
            continue;
        }
        s_dispatch (self, msg);
        sbx_msg_destroy (&msg);
    }
}

//  The virtio port reports POLLHUP while no host is attached.
static bool s_port_attached (int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    return poll (&pfd, 1, 0) >= 0 && !(pfd.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static void s_port_check (server_t *self)
{
    if (self->port_fd < 0) {
        self->port_fd = open (self->config->port, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (self->port_fd < 0)
            return;
        s_log (self, "opened %s", self->config->port);
    }
    if (!self->connected && s_port_attached (self->port_fd)) {
        self->connected = true;
        self->bad_frames = 0;
        agent_frame_reset (self->frame, self->port_fd);
        s_log (self, "host attached");
        s_send_hello (self);
    }
}

static void s_port_detached (server_t *self)
{
    if (self->config->port_fd >= 0) {
        self->stop = true; //  tests: the harness hung up
        return;
    }
    if (self->connected)
        s_log (self, "host detached; waiting for it");
    self->connected = false;
    s_held_drop (self);
    agent_frame_reset (self->frame, self->port_fd);
}

static int s_signalfd (void)
{
    sigset_t set;
    sigemptyset (&set);
    sigaddset (&set, SIGCHLD);
    sigaddset (&set, SIGTERM);
    sigaddset (&set, SIGINT);
    sigaddset (&set, SIGHUP);
    if (sigprocmask (SIG_BLOCK, &set, NULL) != 0)
        return -1;
    return signalfd (-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

static void s_handle_signals (server_t *self, int sfd)
{
    struct signalfd_siginfo info;
    while (read (sfd, &info, sizeof info) == (ssize_t) sizeof info) {
        if (info.ssi_signo != SIGCHLD && info.ssi_signo != SIGHUP && getpid () != 1) {
            s_log (self, "signal %u: exiting", info.ssi_signo);
            self->stop = true;
        }
    }
    //  One SIGCHLD may stand for many children: reap all that ended.
    agent_ptab_reap (self->ptab, s_on_exit, self);
}

int agent_server_run (const agent_config_t *config)
{
    server_t server = {.config = config, .port_fd = -1};
    server_t *self = &server;
    signal (SIGPIPE, SIG_IGN);
    if (getpid () != 1)
        prctl (PR_SET_CHILD_SUBREAPER, 1); //  orphans come to us, as they would to PID 1
    int sfd = s_signalfd ();
    self->frame = agent_frame_new (-1);
    self->ptab = agent_ptab_new (config->buf_limit, config->max_finished, config->budget);
    if (self->ptab)
        agent_ptab_set_pty_idle (self->ptab, config->pty_idle_ms);
    struct pollfd *fds = calloc (MAX_POLLFDS, sizeof *fds);
    agent_proc_t **owners = calloc (MAX_POLLFDS, sizeof *owners);
    self->held = calloc (HELD_MAX, sizeof *self->held);
    if (sfd < 0 || !self->frame || !self->ptab || !fds || !owners || !self->held) {
        s_log (self, "cannot start: %s", strerror (errno));
        return 1;
    }
    if (config->port_fd >= 0) {
        self->port_fd = config->port_fd;
        fcntl (self->port_fd, F_SETFL, fcntl (self->port_fd, F_GETFL) | O_NONBLOCK);
        fcntl (self->port_fd, F_SETFD, FD_CLOEXEC);
        self->connected = true;
        agent_frame_reset (self->frame, self->port_fd);
        s_send_hello (self);
    } else {
        s_port_check (self);
        if (self->port_fd < 0)
            s_log (self, "cannot open %s (%s); retrying", config->port, strerror (errno));
    }
    while (!self->stop) {
        //  First, so that its answers are queued before the port's events are chosen.
        int held = s_held_check (self);
        size_t n = 0;
        fds[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        //  A detached port is left out: it would report POLLHUP without end.
        fds[n++] = (struct pollfd){
            .fd = self->connected ? self->port_fd : -1,
            .events = (short) (POLLIN | (agent_frame_pending (self->frame) ? POLLOUT : 0))};
        size_t first_pipe = n;
        n += agent_ptab_pollfds (self->ptab, fds + n, owners + n, MAX_POLLFDS - n);
        int timeout = agent_ptab_expire (self->ptab);
        if (held >= 0 && (timeout < 0 || held < timeout))
            timeout = held;
        if (!self->connected && (timeout < 0 || timeout > RECONNECT_CHECK_MS))
            timeout = RECONNECT_CHECK_MS;
        int rc = poll (fds, (nfds_t) n, timeout);
        if (rc < 0 && errno != EINTR) {
            s_log (self, "poll: %s", strerror (errno));
            break;
        }
        if (rc < 0)
            continue;
        for (size_t i = first_pipe; i < n; i++)
            if (fds[i].revents)
                agent_ptab_read (self->ptab, owners[i], fds[i].fd);
        if (fds[0].revents & POLLIN)
            s_handle_signals (self, sfd);
        short port = fds[1].revents;
        if (self->connected && (port & POLLIN)) {
            //  A bounded number of reads, so a flooding host cannot starve the pipes.
            ssize_t got = 0;
            for (int reads = 0; reads < 16 && (got = agent_frame_read (self->frame)) > 0; reads++)
                s_process_input (self);
            if (got < 0 && errno != 0)
                s_log (self, "port read: %s", strerror (errno));
            if (got < 0)
                s_port_detached (self);
        } else if (self->connected && (port & (POLLHUP | POLLERR | POLLNVAL))) {
            s_port_detached (self);
        }
        if (!self->connected && config->port_fd < 0)
            s_port_check (self);
        if (self->connected && agent_frame_pending (self->frame) &&
            agent_frame_flush (self->frame) != 0) {
            s_log (self, "port write: %s", strerror (errno));
            s_port_detached (self);
        }
    }
    agent_ptab_destroy (&self->ptab, true);
    agent_frame_destroy (&self->frame);
    sbx_strmap_t *env = &self->env;
    for (size_t i = 0; i < env->count; i++) {
        free (env->keys[i]);
        free (env->values[i]);
    }
    free (env->keys);
    free (env->values);
    free (fds);
    free (owners);
    free (self->held);
    close (sfd);
    return 0;
}
