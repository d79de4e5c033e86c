/*  vmd_qemu - see vmd_qemu.h

    Decisions, measured on QEMU 7.2 (Debian 12):
    - Seccomp: -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,
      resourcecontrol=deny, the strictest set. spawn=deny rules out migrating to
      "exec:cat > state", so the memory state goes through an fd vmd opened (getfd +
      migrate fd:NAME; resume with -incoming fd:3): QEMU never forks and never opens
      the state file itself.
    - Unprivileged user: -runas does setgid/initgroups/setuid after the seccomp filter
      is installed, and elevateprivileges=deny (or =children) kills QEMU with SIGSYS
      then. So vmd drops privileges in the child before exec instead; QEMU then opens
      its files as that user, which is why the sandbox directory and overlay are
      chowned to it. With KVM, the user needs /dev/kvm through the "kvm" group.
    - Console: ttyS0 goes to a socket chardev with a logfile, so console.log always
      has the output and console.sock gives an interactive console when one is needed
      (tests, debugging a guest without an agent).
    - New session (setsid), no -daemonize: QEMU survives vmd's death (vmd re-adopts it
      through qemu.pid and the sockets), and vmd still learns of its exit as its parent.
*/
#include "vmd_qemu.h"

#include <czmq.h>

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/kvm.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __x86_64__
#include <x86intrin.h>
#endif

#include "sbx_log.h"

//  TCG's translation cache in MiB (vmd.tcg_tb_mib): QEMU's default (1 GiB on 64-bit
//  hosts) would be the bulk of each guest's memory. A boot alone translates ≈ 70 MiB of
//  code, so the cache is always full: its size is its RSS. Measured (bench/notes.md):
//  32 saves ≈ 36 MiB of PSS a guest and costs nothing at boot or in exec `true`, but
//  code-heavy work (python's start) takes 30-60 % longer, and under TCG the CPU runs
//  out long before memory; 16 slows every exec.
static int s_tcg_tb_mib = VMD_QEMU_TCG_TB_MIB;

static const vmd_qemu_type_t s_types[] = {
    {"small", 1, 512}, {"medium", 2, 1024}, {"large", 2, 2048}, {NULL, 0, 0}};

const vmd_qemu_type_t *vmd_qemu_type (const char *name)
{
    for (const vmd_qemu_type_t *type = s_types; name && type->name; type++)
        if (strcmp (type->name, name) == 0)
            return type;
    return NULL;
}

void vmd_qemu_mac (const char *sandbox_id, char mac[18])
{
    //  FNV-1a: stable across builds and hosts (a stopped sandbox resumes with its MAC).
    uint32_t hash = 2166136261u;
    for (const char *c = sandbox_id ? sandbox_id : ""; *c; c++)
        hash = (hash ^ (uint8_t) *c) * 16777619u;
    //  Never QEMU's default 52:54:00:12:34:56, which every guest had before.
    if ((hash & 0xffffff) == 0x123456)
        hash ^= 1;
    snprintf (mac, 18, "52:54:00:%02x:%02x:%02x", (hash >> 16) & 0xff, (hash >> 8) & 0xff,
              hash & 0xff);
}

void vmd_qemu_config_init (vmd_qemu_config_t *config)
{
    memset (config, 0, sizeof *config);
    config->type = &s_types[0];
    config->incoming_fd = -1;
    config->mem_fd = -1;
}

//  --------------------------------------------------------------------------
//  Host facts

static int s_kvm_probe (void);

static int s_tsc_from_klog (void)
{
    int size = klogctl (10, NULL, 0); //  SYSLOG_ACTION_SIZE_BUFFER
    if (size <= 0)
        return 0;
    char *buf = (char *) malloc ((size_t) size + 1);
    int len = klogctl (3, buf, size); //  SYSLOG_ACTION_READ_ALL
    int khz = 0;
    if (len > 0) {
        buf[len] = 0;
        //  The refined calibration is the better one; the first estimate otherwise.
        const char *patterns[] = {"tsc: Refined TSC clocksource calibration: ", "tsc: Detected "};
        for (int p = 0; p < 2 && !khz; p++) {
            const char *at = buf, *found = NULL;
            while ((at = strstr (at, patterns[p]))) {
                found = at;
                at++;
            }
            unsigned mhz, frac;
            if (found && sscanf (found + strlen (patterns[p]), "%u.%3u MHz", &mhz, &frac) == 2)
                khz = (int) (mhz * 1000 + frac);
        }
    }
    free (buf);
    return khz;
}

static int s_tsc_measured (void)
{
#ifdef __x86_64__
    struct timespec t0, t1;
    clock_gettime (CLOCK_MONOTONIC_RAW, &t0);
    unsigned long long c0 = __rdtsc ();
    struct timespec nap = {0, 100 * 1000 * 1000};
    nanosleep (&nap, NULL);
    clock_gettime (CLOCK_MONOTONIC_RAW, &t1);
    unsigned long long c1 = __rdtsc ();
    long long ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    return ns > 0 ? (int) ((c1 - c0) * 1000000ULL / (unsigned long long) ns) : 0;
#else
    return 0;
#endif
}

static int s_tsc_from_cpuinfo (void)
{
    FILE *file = fopen ("/proc/cpuinfo", "r");
    if (!file)
        return 0;
    char line[512];
    double mhz = 0;
    while (fgets (line, sizeof line, file))
        if (sscanf (line, "cpu MHz : %lf", &mhz) == 1)
            break;
    fclose (file);
    return (int) (mhz * 1000);
}

int vmd_qemu_host_tsc_khz (void)
{
    static int cached = 0;
    if (cached)
        return cached;
    const char *env = getenv ("SBX_TSC_KHZ");
    int khz = env ? atoi (env) : 0;
    if (khz <= 100000) {
        FILE *file = fopen ("/sys/devices/system/cpu/cpu0/tsc_freq_khz", "r");
        if (file) {
            if (fscanf (file, "%d", &khz) != 1)
                khz = 0;
            fclose (file);
        }
    }
    if (khz <= 100000)
        khz = s_tsc_from_klog ();
    if (khz <= 100000)
        khz = s_tsc_measured ();
    if (khz <= 100000)
        khz = s_tsc_from_cpuinfo ();
    cached = khz > 100000 ? khz : 0;
    return cached;
}

bool vmd_qemu_kvm_usable (void)
{
    const char *env = getenv ("SBX_ACCEL");
    if (env && (strcmp (env, "kvm") == 0 || strcmp (env, "tcg") == 0))
        return strcmp (env, "kvm") == 0;
    static int cached = -1;
    if (cached == -1)
        cached = s_kvm_probe ();
    return cached == 1;
}

static int s_kvm_probe (void)
{
    //  /dev/kvm can open and still be useless: nested hosts without vmx/svm in the
    //  guest CPU run only real mode, and QEMU aborts or the guest hangs.
    FILE *file = fopen ("/proc/cpuinfo", "r");
    bool virt = false;
    if (file) {
        char line[4096];
        while (!virt && fgets (line, sizeof line, file))
            if (strncmp (line, "flags", 5) == 0)
                virt = strstr (line, " vmx") || strstr (line, " svm");
        fclose (file);
    }
    if (!virt)
        return 0;
    int fd = open ("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (fd == -1)
        return 0;
    bool usable = ioctl (fd, KVM_GET_API_VERSION, 0) == KVM_API_VERSION;
    if (usable) {
        int vm = ioctl (fd, KVM_CREATE_VM, 0);
        usable = vm >= 0;
        if (vm >= 0)
            close (vm);
    }
    close (fd);
    return usable ? 1 : 0;
}

int vmd_qemu_set_tcg_tb_mib (uint64_t mib)
{
    if (mib < 8 || mib > 1024)
        return -1;
    s_tcg_tb_mib = (int) mib;
    return 0;
}

int vmd_qemu_tcg_tb_mib (void)
{
    return s_tcg_tb_mib;
}

//  --------------------------------------------------------------------------
//  Command line

static bool s_hostname_valid (const char *name)
{
    size_t len = name ? strlen (name) : 0;
    if (len < 1 || len > 63 || name[0] == '-')
        return false;
    for (const char *c = name; *c; c++)
        if (!(islower ((unsigned char) *c) || isdigit ((unsigned char) *c) || *c == '-'))
            return false;
    return true;
}

//  Paths go inside QEMU's comma-separated option values: refuse what would need escaping.
static bool s_path_valid (const char *path)
{
    return path && path[0] == '/' && strlen (path) < 200 && !strchr (path, ',') &&
           !strchr (path, ' ') && !strchr (path, '\n');
}

static const char *s_qemu_binary (const vmd_qemu_config_t *config)
{
    if (config->qemu)
        return config->qemu;
    const char *env = getenv ("SBX_QEMU");
    return env && *env ? env : "qemu-system-x86_64";
}

char **vmd_qemu_argv (const vmd_qemu_config_t *config)
{
    if (!config || !config->type || !s_hostname_valid (config->hostname) ||
        !s_path_valid (config->image_dir) || !s_path_valid (config->dir))
        return NULL;
    int tsc_khz = vmd_qemu_host_tsc_khz ();
    bool kvm = vmd_qemu_kvm_usable ();
    if (!tsc_khz && !kvm)
        return NULL; //  a TCG guest without tsc_early_khz hangs on most boots

    zlist_t *args = zlist_new ();
    zlist_autofree (args);
#define ARG(...)                                                                                   \
    do {                                                                                           \
        char *s_arg = zsys_sprintf (__VA_ARGS__);                                                  \
        zlist_append (args, s_arg);                                                                \
        zstr_free (&s_arg);                                                                        \
    } while (0)
    const char *dir = config->dir, *img = config->image_dir;
    ARG ("%s", s_qemu_binary (config));
    if (config->mem_fd >= 0) {
        ARG ("-object");
        ARG ("memory-backend-file,id=microvm.ram,size=%dM,mem-path=/proc/self/fd/4,share=%s",
             config->type->memory_mib, config->mem_shared ? "on" : "off");
    }
    ARG ("-M");
    ARG ("microvm,x-option-roms=off,pit=off,pic=off,isa-serial=on,rtc=on%s",
         config->mem_fd >= 0 ? ",memory-backend=microvm.ram" : "");
    ARG ("-nodefaults");
    ARG ("-no-user-config");
    ARG ("-display");
    ARG ("none");
    ARG ("-no-reboot");
    ARG ("-cpu");
    ARG ("max");
    ARG ("-smp");
    ARG ("%d", config->type->vcpus);
    ARG ("-m");
    ARG ("%dM", config->type->memory_mib);
    ARG ("-accel");
    if (kvm)
        ARG ("kvm");
    else
        ARG ("tcg,tb-size=%d", s_tcg_tb_mib);
    ARG ("-kernel");
    ARG ("%s/vmlinux", img);
    ARG ("-initrd");
    ARG ("%s/initrd.img", img);
    ARG ("-append");
    //  panic=-1: a guest that panics ends its QEMU instead of hanging there.
    //  tsc_early_khz: without it TSC calibration hangs a share of TCG boots.
    char tsc[48] = "";
    if (tsc_khz)
        snprintf (tsc, sizeof tsc, "tsc_early_khz=%d ", tsc_khz);
    ARG ("console=ttyS0 quiet tsc=reliable no_timer_check cryptomgr.notests panic=-1 "
         "%sroot=/dev/vda rw sbx.hostname=%s%s",
         tsc, config->hostname, config->debug_shell ? " sbx.shell" : "");
    ARG ("-drive");
    ARG ("id=d0,file=%s/overlay.qcow2,format=qcow2,if=none", dir);
    ARG ("-device");
    ARG ("virtio-blk-device,drive=d0");
    ARG ("-netdev");
    ARG ("user,id=n0%s", config->no_network ? ",restrict=on" : "");
    ARG ("-device");
    if (config->mac)
        ARG ("virtio-net-device,netdev=n0,mac=%s", config->mac);
    else
        ARG ("virtio-net-device,netdev=n0");
    ARG ("-device");
    ARG ("virtio-rng-device");
    ARG ("-device");
    ARG ("virtio-serial-device");
    ARG ("-chardev");
    ARG ("socket,id=c0,path=%s/agent.sock,server=on,wait=off", dir);
    ARG ("-device");
    ARG ("virtserialport,chardev=c0,name=agent");
    //  Free page reporting: the guest hands back the 2 MiB blocks it frees (≈ 2 s after)
    //  and QEMU drops them from its RSS, so a sandbox that ran something big shrinks
    //  back when idle. QEMU 7.2 discards file-backed RAM by punching holes in the file,
    //  share=on or not: in a clone (mem_fd, share=off) that fails on the sealed memfd
    //  (vmd_ramfile), so the template stays whole and a clone gives nothing back; only
    //  ever hand QEMU a RAM file that is sealed or the guest's own. The last device,
    //  so that the others keep their virtio-mmio slots and states saved without it
    //  still load.
    ARG ("-device");
    ARG ("virtio-balloon-device,free-page-reporting=on");
    ARG ("-chardev");
    ARG ("socket,id=con,path=%s/console.sock,server=on,wait=off,logfile=%s/console.log,"
         "logappend=on",
         dir, dir);
    ARG ("-serial");
    ARG ("chardev:con");
    ARG ("-qmp");
    ARG ("unix:%s/qmp.sock,server=on,wait=off", dir);
    ARG ("-pidfile");
    ARG ("%s/qemu.pid", dir);
    ARG ("-sandbox");
    ARG ("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
    if (config->incoming_fd >= 0 || config->incoming_defer) {
        ARG ("-S");
        ARG ("-incoming");
        ARG ("%s", config->incoming_fd >= 0 ? "fd:3" : "defer");
    }
#undef ARG
    char **argv = (char **) zmalloc ((zlist_size (args) + 1) * sizeof (char *));
    size_t n = 0;
    for (char *arg = (char *) zlist_first (args); arg; arg = (char *) zlist_next (args))
        argv[n++] = strdup (arg);
    zlist_destroy (&args);
    return argv;
}

void vmd_qemu_argv_destroy (char ***argv_p)
{
    if (argv_p && *argv_p) {
        for (char **arg = *argv_p; *arg; arg++)
            free (*arg);
        free (*argv_p);
        *argv_p = NULL;
    }
}

//  --------------------------------------------------------------------------
//  Spawning

//  The fds a child gets: stdin, stdout, stderr, a memory state, guest RAM.
#define S_FDS 5

typedef struct {
    bool drop;
    uid_t uid;
    gid_t gids[2];
    int ngids;
} s_user_t;

//  Whom QEMU runs as: only root can drop, and only to a user that exists.
static int s_user_find (const vmd_qemu_config_t *config, s_user_t *user)
{
    memset (user, 0, sizeof *user);
    if (geteuid () != 0 || (config->user && !*config->user))
        return 0;
    if (config->uid > 0) {
        user->drop = true;
        user->uid = config->uid;
        user->gids[user->ngids++] = config->gid > 0 ? config->gid : (gid_t) config->uid;
        struct group *kvm = getgrnam ("kvm");
        if (kvm)
            user->gids[user->ngids++] = kvm->gr_gid;
        return 0;
    }
    struct passwd *pw = config->user ? getpwnam (config->user) : getpwnam ("sbx-qemu");
    if (!pw && !config->user)
        pw = getpwnam ("nobody");
    if (!pw) {
        sbx_error ("vmd_qemu: user %s does not exist", config->user);
        return -1;
    }
    user->drop = true;
    user->uid = pw->pw_uid;
    user->gids[user->ngids++] = pw->pw_gid;
    struct group *kvm = getgrnam ("kvm");
    if (kvm)
        user->gids[user->ngids++] = kvm->gr_gid;
    return 0;
}

//  The child's side of fork: fds[0..4] become fds 0-4 (-1: /dev/null for 0-2, nothing
//  for 3 and 4), nothing else stays open. Only async-signal-safe calls until exec.
static void s_child (char **argv, const int fds[S_FDS], bool new_session, const s_user_t *user)
{
    if (new_session)
        setsid ();
    //  Out of the way of 0-4 first: one may sit where another must go.
    int moved[S_FDS];
    for (int i = 0; i < S_FDS; i++)
        if ((moved[i] = fds[i] >= 0 ? fcntl (fds[i], F_DUPFD, 10) : -1) == -1 && fds[i] >= 0)
            _exit (126);
    int null_fd = open ("/dev/null", O_RDWR);
    if (null_fd == -1)
        _exit (126);
    for (int i = 0; i < 3; i++)
        if (dup2 (moved[i] >= 0 ? moved[i] : null_fd, i) == -1)
            _exit (126);
    for (int i = 3; i < S_FDS; i++)
        if (moved[i] >= 0 && dup2 (moved[i], i) == -1) //  dup2 clears FD_CLOEXEC
            _exit (126);
    //  Nothing above the last fd handed on; a gap below it (fd 3 without a state) is
    //  closed too.
    int last = S_FDS - 1;
    while (last >= 3 && moved[last] < 0)
        last--;
    for (int i = 3; i < last; i++)
        if (moved[i] < 0)
            close (i);
    close_range ((unsigned) last + 1, ~0U, 0);
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal (sig, SIG_DFL);
    if (user->drop && (setgroups ((size_t) user->ngids, user->gids) == -1 ||
                       setgid (user->gids[0]) == -1 || setuid (user->uid) == -1))
        _exit (126);
    execvp (argv[0], argv);
    _exit (127);
}

static pid_t s_fork (char **argv, const int fds[S_FDS], bool new_session, const s_user_t *user)
{
    pid_t pid = fork ();
    if (pid == 0)
        s_child (argv, fds, new_session, user);
    if (pid == -1)
        sbx_error ("vmd_qemu: fork: %s", strerror (errno));
    return pid;
}

//  argv with stdout and stderr appended to log_path, incoming_fd as fd 3 and mem_fd
//  as fd 4.
static pid_t s_spawn (char **argv, const char *log_path, int incoming_fd, int mem_fd,
                      const s_user_t *user)
{
    int log_fd = open (log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (log_fd == -1) {
        sbx_error ("vmd_qemu: cannot open %s: %s", log_path, strerror (errno));
        return -1;
    }
    int fds[S_FDS] = {-1, log_fd, log_fd, incoming_fd, mem_fd};
    pid_t pid = s_fork (argv, fds, true, user);
    close (log_fd);
    return pid;
}

pid_t vmd_qemu_zstd_spawn (bool compress, int in_fd, int out_fd)
{
    if (in_fd < 0 || out_fd < 0)
        return -1;
    char *compress_argv[] = {"zstd", "-1", "-q", "-c", NULL};
    char *decompress_argv[] = {"zstd", "-d", "-q", "-c", NULL};
    //  It needs no file of its own: unprivileged whenever vmd is root.
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    s_user_t user;
    if (s_user_find (&config, &user) == -1)
        return -1;
    int fds[S_FDS] = {in_fd, out_fd, -1, -1, -1};
    return s_fork (compress ? compress_argv : decompress_argv, fds, false, &user);
}

int vmd_qemu_user (const char *user, uid_t *uid)
{
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.user = user;
    s_user_t found;
    if (s_user_find (&config, &found) == -1)
        return -1;
    *uid = found.drop ? found.uid : geteuid ();
    return found.drop ? 1 : 0;
}

pid_t vmd_qemu_spawn (const vmd_qemu_config_t *config)
{
    char **argv = vmd_qemu_argv (config);
    if (!argv) {
        sbx_error ("vmd_qemu: invalid configuration for %s",
                   config && config->dir ? config->dir : "?");
        return -1;
    }
    s_user_t user;
    pid_t pid = -1;
    if (s_user_find (config, &user) == 0) {
        //  QEMU creates its sockets, pidfile and console.log here as the user, and
        //  opens the overlay read-write.
        char path[256], log[256];
        snprintf (path, sizeof path, "%s/overlay.qcow2", config->dir);
        snprintf (log, sizeof log, "%s/console.log", config->dir);
        if (user.drop && (chown (config->dir, user.uid, user.gids[0]) == -1 ||
                          chown (path, user.uid, user.gids[0]) == -1 ||
                          (chown (log, user.uid, user.gids[0]) == -1 && errno != ENOENT)))
            sbx_error ("vmd_qemu: cannot hand %s to uid %d: %s", config->dir, (int) user.uid,
                       strerror (errno));
        else {
            snprintf (path, sizeof path, "%s/qemu.log", config->dir);
            pid = s_spawn (argv, path, config->incoming_fd, config->mem_fd, &user);
        }
    }
    vmd_qemu_argv_destroy (&argv);
    return pid;
}

pid_t vmd_qemu_adopt (const char *dir)
{
    if (!s_path_valid (dir))
        return -1;
    char path[256];
    snprintf (path, sizeof path, "%s/qemu.pid", dir);
    FILE *file = fopen (path, "r");
    int pid = -1;
    if (file) {
        if (fscanf (file, "%d", &pid) != 1)
            pid = -1;
        fclose (file);
    }
    if (pid <= 1)
        return -1;
    //  A stale pidfile may name a recycled pid: the command line must be ours.
    char want[256];
    snprintf (want, sizeof want, "unix:%s/qmp.sock,server=on,wait=off", dir);
    snprintf (path, sizeof path, "/proc/%d/cmdline", pid);
    //  /proc files have no size: zfile can't read them.
    bool ours = false;
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        static char data[128 * 1024];
        ssize_t size = read (fd, data, sizeof data - 1);
        close (fd);
        for (ssize_t at = 0; size > 0 && at < size && !ours;
             at += (ssize_t) strnlen (data + at, (size_t) (size - at)) + 1) {
            data[size] = 0;
            ours = strcmp (data + at, want) == 0;
        }
    }
    return ours ? (pid_t) pid : -1;
}

pid_t vmd_qemu_overlay_spawn (const vmd_qemu_config_t *config)
{
    if (!config || !s_path_valid (config->image_dir) || !s_path_valid (config->dir))
        return -1;
    if (config->backing && !s_path_valid (config->backing))
        return -1;
    char base[256], overlay[256], log[256];
    snprintf (base, sizeof base, "%s/rootfs.ext4", config->image_dir);
    if (config->backing)
        snprintf (base, sizeof base, "%s", config->backing);
    snprintf (overlay, sizeof overlay, "%s/overlay.qcow2", config->dir);
    snprintf (log, sizeof log, "%s/qemu.log", config->dir);
    char *argv[] = {"qemu-img", "create", "-q",
                    "-f",       "qcow2",  "-b",
                    base,       "-F",     config->backing ? "qcow2" : "raw",
                    overlay,    NULL};
    s_user_t user = {.drop = false};
    return s_spawn (argv, log, -1, -1, &user);
}

pid_t vmd_qemu_helper_spawn (char **argv, const char *log_path)
{
    s_user_t user = {.drop = false};
    return argv && argv[0] && log_path ? s_spawn (argv, log_path, -1, -1, &user) : -1;
}

const char *vmd_qemu_version (void)
{
    static char version[128];
    static bool found = false;
    if (found)
        return version;
    found = true;
    const char *qemu = getenv ("SBX_QEMU");
    char command[300];
    snprintf (command, sizeof command, "'%s' --version 2>/dev/null",
              qemu && *qemu && !strchr (qemu, '\'') ? qemu : "qemu-system-x86_64");
    FILE *pipe = popen (command, "r");
    if (pipe) {
        if (!fgets (version, sizeof version, pipe))
            version[0] = 0;
        pclose (pipe);
    }
    version[strcspn (version, "\r\n")] = 0;
    return version;
}

const char *vmd_qemu_state_key (void)
{
    static char key[160];
    const char *version = vmd_qemu_version ();
    if (!*version)
        return "";
    //  Not cached: $SBX_ACCEL may change between tests of one process.
    snprintf (key, sizeof key, "%.110s accel=%s", version, vmd_qemu_kvm_usable () ? "kvm" : "tcg");
    return key;
}

bool vmd_qemu_state_restorable (const char *saved)
{
    const char *version = vmd_qemu_version ();
    if (!saved || !*saved || !*version)
        return false;
    return strstr (saved, " accel=") ? streq (saved, vmd_qemu_state_key ())
                                     : streq (saved, version);
}

int vmd_qemu_group (const char *user, gid_t *gid)
{
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.user = user;
    s_user_t found;
    if (s_user_find (&config, &found) == -1 || !found.drop)
        return -1;
    *gid = found.gids[0];
    return 0;
}

int vmd_qemu_overlay_create (const vmd_qemu_config_t *config)
{
    pid_t pid = vmd_qemu_overlay_spawn (config);
    if (pid == -1)
        return -1;
    int status;
    while (waitpid (pid, &status, 0) == -1)
        if (errno != EINTR)
            return -1;
    return WIFEXITED (status) && WEXITSTATUS (status) == 0 ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  Self-test: a real guest under QEMU (TCG when there is no KVM), driven through
//  vmd_qmp from a zloop: boot, hostfwd, stop with memory, resume, memory kept.

#include "vmd_qmp.h"
#include "vmd_ramfile.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>

typedef struct {
    zloop_t *loop;
    vmd_qmp_t *qmp;
    bool verbose;
    const char *dir;
    pid_t pid;
    bool exited;
    int status;
    bool qmp_ready, qmp_closed;
    int stops, resumes, shutdowns;
    //  The last reply
    bool replied;
    char error[512];
    json_t *result;
    //  The interactive console
    int con_fd;
    char *con;
    size_t con_len;
    int64_t deadline; //  the whole test's bound
} s_ctx_t;

typedef bool (s_done_fn) (s_ctx_t *ctx, const void *arg);

static void s_console_read (s_ctx_t *ctx)
{
    if (ctx->con_fd < 0)
        return;
    char buf[4096];
    ssize_t n;
    while ((n = recv (ctx->con_fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
        ctx->con = (char *) realloc (ctx->con, ctx->con_len + (size_t) n + 1);
        memcpy (ctx->con + ctx->con_len, buf, (size_t) n);
        ctx->con_len += (size_t) n;
        ctx->con[ctx->con_len] = 0;
        if (ctx->verbose)
            fwrite (buf, 1, (size_t) n, stderr);
    }
}

typedef struct {
    s_ctx_t *ctx;
    s_done_fn *done;
    const void *arg;
    int64_t until;
    bool result;
} s_wait_t;

static int s_wait_check (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id;
    s_wait_t *wait = (s_wait_t *) arg;
    s_ctx_t *ctx = wait->ctx;
    if (!ctx->exited && ctx->pid > 0 && waitpid (ctx->pid, &ctx->status, WNOHANG) == ctx->pid)
        ctx->exited = true;
    s_console_read (ctx);
    wait->result = wait->done (ctx, wait->arg);
    return wait->result || zclock_mono () > wait->until ? -1 : 0;
}

//  Runs the loop until done says so or msecs pass (capped by the test's bound).
static bool s_wait (s_ctx_t *ctx, s_done_fn *done, const void *arg, int msecs)
{
    int64_t until = zclock_mono () + msecs;
    s_wait_t wait = {ctx, done, arg, until < ctx->deadline ? until : ctx->deadline, false};
    if (done (ctx, arg))
        return true;
    int timer = zloop_timer (ctx->loop, 10, 0, s_wait_check, &wait);
    zloop_start (ctx->loop);
    zloop_timer_end (ctx->loop, timer);
    return wait.result;
}

static bool s_done_replied (s_ctx_t *ctx, const void *arg)
{
    (void) arg;
    return ctx->replied;
}

static bool s_done_qmp_ready (s_ctx_t *ctx, const void *arg)
{
    (void) arg;
    return ctx->qmp_ready || ctx->qmp_closed;
}

static bool s_done_never (s_ctx_t *ctx, const void *arg)
{
    (void) ctx, (void) arg;
    return false;
}

static bool s_done_exited (s_ctx_t *ctx, const void *arg)
{
    (void) arg;
    return ctx->exited;
}

static bool s_done_console (s_ctx_t *ctx, const void *arg)
{
    return ctx->con && strstr (ctx->con, (const char *) arg);
}

static bool s_done_log (s_ctx_t *ctx, const void *arg)
{
    char path[256];
    snprintf (path, sizeof path, "%s/console.log", ctx->dir);
    char *text = NULL;
    zfile_t *file = zfile_new (NULL, path);
    if (file && zfile_input (file) == 0) {
        zchunk_t *chunk = zfile_read (file, 1 << 20, 0);
        if (chunk) {
            text = zchunk_strdup (chunk);
            zchunk_destroy (&chunk);
        }
    }
    zfile_destroy (&file);
    bool found = text && strstr (text, (const char *) arg);
    zstr_free (&text);
    return found;
}

static void s_on_reply (vmd_qmp_t *qmp, json_t *result, const char *error, void *arg)
{
    (void) qmp;
    s_ctx_t *ctx = (s_ctx_t *) arg;
    ctx->replied = true;
    snprintf (ctx->error, sizeof ctx->error, "%s", error ? error : "");
    json_decref (ctx->result);
    ctx->result = json_incref (result);
}

static void s_on_event (vmd_qmp_t *qmp, const char *event, json_t *data, void *arg)
{
    (void) qmp, (void) data;
    s_ctx_t *ctx = (s_ctx_t *) arg;
    if (ctx->verbose)
        fprintf (stderr, "[qmp event %s]\n", event);
    ctx->stops += streq (event, "STOP");
    ctx->resumes += streq (event, "RESUME");
    ctx->shutdowns += streq (event, "SHUTDOWN");
}

static void s_on_ready (vmd_qmp_t *qmp, void *arg)
{
    (void) qmp;
    ((s_ctx_t *) arg)->qmp_ready = true;
}

static void s_on_closed (vmd_qmp_t *qmp, const char *reason, void *arg)
{
    (void) qmp, (void) reason;
    ((s_ctx_t *) arg)->qmp_closed = true;
}

//  Issues a command (expr uses s_on_reply, ctx) and waits for its answer; true on success.
#define S_CALL(ctx, expr)                                                                          \
    ((ctx)->replied = false, assert ((expr) == 0),                                                 \
     s_wait ((ctx), s_done_replied, NULL, 30000) && (ctx)->error[0] == 0)

static const char *s_status (s_ctx_t *ctx)
{
    bool ok = S_CALL (ctx, vmd_qmp_query_status (ctx->qmp, s_on_reply, ctx));
    const char *status = ok ? json_string_value (json_object_get (ctx->result, "status")) : NULL;
    return status ? status : "?";
}

static void s_qmp_open (s_ctx_t *ctx)
{
    char path[256];
    snprintf (path, sizeof path, "%s/qmp.sock", ctx->dir);
    ctx->qmp_ready = ctx->qmp_closed = false;
    ctx->qmp = vmd_qmp_new (ctx->loop, path);
    assert (ctx->qmp);
    vmd_qmp_set_handlers (ctx->qmp, s_on_ready, s_on_event, s_on_closed, ctx);
    assert (s_wait (ctx, s_done_qmp_ready, NULL, 15000));
    assert (ctx->qmp_ready);
}

static void s_console_open (s_ctx_t *ctx)
{
    if (ctx->con_fd >= 0)
        close (ctx->con_fd);
    free (ctx->con);
    ctx->con = NULL;
    ctx->con_len = 0;
    ctx->con_fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s/console.sock", ctx->dir);
    int rc = connect (ctx->con_fd, (struct sockaddr *) &addr, sizeof addr);
    assert (rc == 0);
    //  Until the shell answers: it may still be starting.
    for (int i = 0; i < 60; i++) {
        const char *probe = "echo @@S$((6*7))\n";
        assert (send (ctx->con_fd, probe, strlen (probe), MSG_NOSIGNAL) > 0);
        if (s_wait (ctx, s_done_console, "@@S42", 500))
            return;
    }
    assert (!"no shell on the guest's console");
}

//  Runs cmd in the guest's shell and returns its output (caller frees), or NULL. The
//  markers are printed by arithmetic expansion so the echoed input never matches.
static char *s_console_run (s_ctx_t *ctx, const char *cmd)
{
    static int seq = 100;
    seq++;
    char line[1024], begin[32], end[32];
    snprintf (line, sizeof line, "echo @@B$((%d+1)); %s; echo @@E$((%d+1))\n", seq - 1, cmd,
              seq - 1);
    snprintf (begin, sizeof begin, "@@B%d", seq);
    snprintf (end, sizeof end, "@@E%d", seq);
    size_t mark = ctx->con_len;
    assert (send (ctx->con_fd, line, strlen (line), MSG_NOSIGNAL) > 0);
    if (!s_wait (ctx, s_done_console, end, 20000))
        return NULL;
    const char *from = strstr (ctx->con + mark, begin);
    const char *to = strstr (ctx->con + mark, end);
    if (!from || !to || to < from)
        return NULL;
    from += strlen (begin);
    return strndup (from, (size_t) (to - from));
}

static const char *s_image_dir (char *buf, size_t size)
{
    const char *env = getenv ("SBX_IMAGE_DIR");
    if (env && *env)
        return env;
    //  <build>/bin/vmd_selftest -> <build>/image, where the build puts the image.
    char exe[256];
    ssize_t n = readlink ("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr (exe, '/');
        if (slash) {
            *slash = 0;
            snprintf (buf, size, "%s/../image", exe);
            char real[PATH_MAX];
            if (realpath (buf, real) && strlen (real) < size) {
                snprintf (buf, size, "%s", real);
                return buf;
            }
        }
    }
    return NULL;
}

static int s_free_port (void)
{
    int fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int rc = bind (fd, (struct sockaddr *) &addr, len);
    assert (rc == 0);
    getsockname (fd, (struct sockaddr *) &addr, &len);
    close (fd);
    return ntohs (addr.sin_port);
}

static bool s_can_connect (int port)
{
    int fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl (INADDR_LOOPBACK),
                               .sin_port = htons ((uint16_t) port)};
    bool ok = connect (fd, (struct sockaddr *) &addr, sizeof addr) == 0;
    close (fd);
    return ok;
}

static void s_assert_user (s_ctx_t *ctx, uid_t want)
{
    if (geteuid () != 0)
        return;
    struct passwd *pw = getpwnam ("sbx-qemu");
    if (!pw)
        pw = getpwnam ("nobody");
    if (!pw)
        return;
    if (want == 0)
        want = pw->pw_uid;
    char path[64], line[256];
    snprintf (path, sizeof path, "/proc/%d/status", (int) ctx->pid);
    FILE *file = fopen (path, "r");
    assert (file);
    int uid = -1;
    while (fgets (line, sizeof line, file))
        if (sscanf (line, "Uid: %*d %d", &uid) == 1)
            break;
    fclose (file);
    assert (uid == (int) want);
    assert (getsid (ctx->pid) == ctx->pid);
}

//  Rss in MiB of QEMU's mapping of size_mib: the guest's RAM. -1 when not found.
static int s_ram_rss_mib (pid_t pid, int size_mib)
{
    char path[64], line[512];
    snprintf (path, sizeof path, "/proc/%d/smaps", (int) pid);
    FILE *file = fopen (path, "r");
    assert (file);
    int rss = -1;
    bool ram = false;
    while (rss == -1 && fgets (line, sizeof line, file)) {
        unsigned long long from, to, kib;
        if (sscanf (line, "%llx-%llx ", &from, &to) == 2) //  a mapping; fields are "Name:"
            ram = (to - from) >> 20 == (unsigned long long) size_mib;
        else if (ram && sscanf (line, "Rss: %llu kB", &kib) == 1)
            rss = (int) (kib >> 10);
    }
    fclose (file);
    return rss;
}

//  A failed assert must not leave a guest running.
static volatile pid_t s_test_pid = -1;

static void s_on_abort (int sig)
{
    (void) sig;
    if (s_test_pid > 0)
        kill (s_test_pid, SIGKILL);
}

static double s_secs (int64_t from)
{
    return (double) (zclock_usecs () - from) / 1e6;
}

typedef struct {
    pid_t pid;
    int status;
    bool done;
} s_reap_t;

static bool s_done_reaped (s_ctx_t *ctx, const void *arg)
{
    (void) ctx;
    s_reap_t *reap = (s_reap_t *) arg;
    if (!reap->done && waitpid (reap->pid, &reap->status, WNOHANG) == reap->pid)
        reap->done = true;
    return reap->done;
}

//  Stop with memory into fd: max-bandwidth, stop, migrate, poll, quit. Returns the
//  seconds until QEMU was gone, *save_s those until the migration completed.
static double s_stop_to_fd (s_ctx_t *ctx, int fd, double *save_s)
{
    int64_t t_stop = zclock_usecs ();
    int stops = ctx->stops, shutdowns = ctx->shutdowns;
    assert (S_CALL (ctx, vmd_qmp_set_max_bandwidth (ctx->qmp, 8LL << 30, s_on_reply, ctx)));
    assert (S_CALL (ctx, vmd_qmp_stop (ctx->qmp, s_on_reply, ctx)));
    assert (S_CALL (ctx, vmd_qmp_migrate_to_fd (ctx->qmp, fd, s_on_reply, ctx)));
    const char *status = "?";
    for (int i = 0; i < 1000; i++) {
        assert (S_CALL (ctx, vmd_qmp_query_migrate (ctx->qmp, s_on_reply, ctx)));
        status = json_string_value (json_object_get (ctx->result, "status"));
        if (status && (streq (status, "completed") || streq (status, "failed")))
            break;
        s_wait (ctx, s_done_never, NULL, 20); //  the poll interval, loop running
    }
    assert (status && streq (status, "completed"));
    *save_s = s_secs (t_stop);
    assert (vmd_qemu_adopt (ctx->dir) == ctx->pid);
    assert (vmd_qemu_adopt ("/nonexistent") == -1);
    assert (S_CALL (ctx, vmd_qmp_quit (ctx->qmp, s_on_reply, ctx)));
    assert (s_wait (ctx, s_done_exited, NULL, 10000));
    assert (vmd_qemu_adopt (ctx->dir) == -1);
    double stop_s = s_secs (t_stop);
    assert (WIFEXITED (ctx->status) && WEXITSTATUS (ctx->status) == 0);
    assert (s_wait (ctx, s_done_qmp_ready, NULL, 1000) && ctx->qmp_closed);
    assert (ctx->stops > stops && ctx->shutdowns == shutdowns + 1);
    vmd_qmp_destroy (&ctx->qmp);
    return stop_s;
}

//  Resume from fd: spawn with -incoming fd:3, or with -incoming defer and then
//  migrate-incoming; wait for paused, cont. Returns seconds.
static double s_resume_from_fd (s_ctx_t *ctx, vmd_qemu_config_t *config, int fd, bool defer)
{
    int64_t t_resume = zclock_usecs ();
    assert (fd >= 0);
    config->incoming_fd = defer ? -1 : fd;
    config->incoming_defer = defer;
    ctx->exited = false;
    ctx->pid = vmd_qemu_spawn (config);
    s_test_pid = ctx->pid;
    config->incoming_fd = -1;
    config->incoming_defer = false;
    assert (ctx->pid > 0);
    s_qmp_open (ctx);
    s_assert_user (ctx, config->uid);
    //  A clone: the state leaves out the RAM (in the memfd) only with x-ignore-shared
    //  on, and that must be off again before the clone's own state is saved (which
    //  carries its RAM, loadable without the memfd).
    bool clone = config->mem_fd >= 0 && !config->mem_shared;
    assert (defer || !clone);
    if (clone)
        assert (S_CALL (
            ctx, vmd_qmp_set_capability (ctx->qmp, "x-ignore-shared", true, s_on_reply, ctx)));
    if (defer)
        assert (S_CALL (ctx, vmd_qmp_migrate_incoming_fd (ctx->qmp, fd, s_on_reply, ctx)));
    const char *status = "?";
    for (int i = 0; i < 1000; i++) {
        status = s_status (ctx);
        if (!streq (status, "inmigrate"))
            break;
        s_wait (ctx, s_done_never, NULL, 10);
    }
    assert (streq (status, "paused"));
    if (clone)
        assert (S_CALL (
            ctx, vmd_qmp_set_capability (ctx->qmp, "x-ignore-shared", false, s_on_reply, ctx)));
    assert (S_CALL (ctx, vmd_qmp_cont (ctx->qmp, s_on_reply, ctx)));
    assert (streq (s_status (ctx), "running"));
    return s_secs (t_resume);
}

//  The same shell, the same memory: what was set before the stop is still there.
static void s_check_memory (s_ctx_t *ctx);

static void s_copy_file (const char *from, const char *to)
{
    int in = open (from, O_RDONLY | O_CLOEXEC), out = open (to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert (in >= 0 && out >= 0);
    char buffer[65536];
    ssize_t n;
    while ((n = read (in, buffer, sizeof buffer)) > 0)
        assert (write (out, buffer, (size_t) n) == n);
    assert (n == 0);
    close (in);
    close (out);
}

//  FNV-1a of fd's whole contents: whether a memfd changed.
static uint64_t s_digest (int fd)
{
    uint64_t hash = 1469598103934665603ULL;
    static char buffer[1 << 20];
    ssize_t n;
    for (off_t at = 0; (n = pread (fd, buffer, sizeof buffer, at)) > 0; at += n)
        for (ssize_t i = 0; i < n; i++)
            hash = (hash ^ (unsigned char) buffer[i]) * 1099511628211ULL;
    return hash;
}

//  Quits QEMU and waits for it to be gone.
static void s_quit (s_ctx_t *ctx)
{
    assert (S_CALL (ctx, vmd_qmp_quit (ctx->qmp, s_on_reply, ctx)));
    assert (s_wait (ctx, s_done_exited, NULL, 10000));
    vmd_qmp_destroy (&ctx->qmp);
}

//  A template and its clones (vmd_ramfile): the template guest's RAM in a memfd
//  (share=on), its state saved without that RAM (x-ignore-shared); each clone maps the
//  sealed memfd copy-on-write (share=off) and sees the template's memory, never
//  another clone's writes, and cannot change the memfd (not even by its balloon's
//  discards). A clone's own state carries its RAM and loads without the memfd.
static void s_test_clones (s_ctx_t *ctx, vmd_qemu_config_t *config, const char *dir)
{
    char tdir[256], c1[256], c2[256], path[512], to[512];
    snprintf (tdir, sizeof tdir, "%s/template", dir);
    snprintf (c1, sizeof c1, "%s/clone1", dir);
    snprintf (c2, sizeof c2, "%s/clone2", dir);
    //  The test's directory belongs to the last guest's uid: others pass through it.
    assert (chmod (dir, 0711) == 0);
    assert (mkdir (tdir, 0755) == 0 && mkdir (c1, 0755) == 0 && mkdir (c2, 0755) == 0);
    config->uid = 0;
    config->dir = ctx->dir = tdir;
    assert (vmd_qemu_overlay_create (config) == 0);
    int mem = vmd_ramfile_new ((uint64_t) config->type->memory_mib << 20);
    assert (mem >= 0);
    config->mem_fd = mem;
    config->mem_shared = true;
    char **argv = vmd_qemu_argv (config);
    char want[160];
    snprintf (want, sizeof want,
              "memory-backend-file,id=microvm.ram,size=%dM,mem-path=/proc/self/fd/4,share=on",
              config->type->memory_mib);
    bool backend = false, machine = false;
    for (char **arg = argv; *arg; arg++) {
        backend = backend || streq (*arg, want);
        machine =
            machine || (strstr (*arg, "microvm,") && strstr (*arg, ",memory-backend=microvm.ram"));
    }
    assert (backend && machine);
    vmd_qemu_argv_destroy (&argv);

    ctx->exited = false;
    ctx->pid = vmd_qemu_spawn (config);
    s_test_pid = ctx->pid;
    assert (ctx->pid > 0);
    s_qmp_open (ctx);
    assert (s_wait (ctx, s_done_log, "sbx-init: ready", 60000));
    s_console_open (ctx);
    char *out = s_console_run (ctx, "MARK=m$((1000+234)); echo f$((2000+345)) >/dev/shm/marker; "
                                    "sleep 1000 & SLEEPER=$!; echo started");
    assert (out && strstr (out, "started"));
    free (out);
    //  The template's state: device state only.
    assert (
        S_CALL (ctx, vmd_qmp_set_capability (ctx->qmp, "x-ignore-shared", true, s_on_reply, ctx)));
    snprintf (path, sizeof path, "%s/memory.state", tdir);
    int state_fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    double save_s, stop_s = s_stop_to_fd (ctx, state_fd, &save_s);
    (void) stop_s;
    close (state_fd);
    struct stat st;
    assert (stat (path, &st) == 0 && st.st_size > 1024 && st.st_size < (1 << 20));
    double template_kib = (double) st.st_size / 1024;
    assert (vmd_ramfile_seal (mem) == 0);
    uint64_t digest = s_digest (mem);
    char overlay[512];
    snprintf (overlay, sizeof overlay, "%s/overlay.qcow2", tdir);
    snprintf (to, sizeof to, "%s/overlay.qcow2", c1);
    s_copy_file (overlay, to);
    snprintf (to, sizeof to, "%s/overlay.qcow2", c2);
    s_copy_file (overlay, to);

    //  Clone 1: the template's memory; it writes and frees 64 MiB (its balloon reports
    //  them) and changes the marker: the memfd stays as it was.
    config->mem_shared = false;
    config->dir = ctx->dir = c1;
    state_fd = open (path, O_RDONLY | O_CLOEXEC);
    double clone_s = s_resume_from_fd (ctx, config, state_fd, true);
    close (state_fd);
    s_check_memory (ctx);
    int clone_rss = s_ram_rss_mib (ctx->pid, config->type->memory_mib);
    out = s_console_run (ctx, "echo c$((9000+876)) >/dev/shm/marker; head -c 67108864 /dev/urandom "
                              ">/dev/shm/big; rm /dev/shm/big; echo W$((40+2))");
    assert (out && strstr (out, "W42"));
    free (out);
    s_wait (ctx, s_done_never, NULL, 4000); //  free page reporting's delay is ≈ 2 s
    assert (s_digest (mem) == digest && vmd_ramfile_sealed (mem));
    //  Its own state has its RAM (x-ignore-shared is off again).
    char saved[512];
    snprintf (saved, sizeof saved, "%s/memory.state", c1);
    state_fd = open (saved, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    s_stop_to_fd (ctx, state_fd, &save_s);
    close (state_fd);
    assert (stat (saved, &st) == 0 && st.st_size > (16 << 20));

    //  Clone 2: the template's memory still, not clone 1's.
    config->dir = ctx->dir = c2;
    state_fd = open (path, O_RDONLY | O_CLOEXEC);
    s_resume_from_fd (ctx, config, state_fd, true);
    close (state_fd);
    s_check_memory (ctx);
    s_quit (ctx);

    //  Clone 1 resumed from its own state into anonymous RAM: its marker.
    config->mem_fd = -1;
    config->dir = ctx->dir = c1;
    state_fd = open (saved, O_RDONLY | O_CLOEXEC);
    s_resume_from_fd (ctx, config, state_fd, false);
    close (state_fd);
    s_console_open (ctx);
    out = s_console_run (ctx, "cat /dev/shm/marker; kill -0 $SLEEPER && echo ALIVE");
    assert (out && strstr (out, "c9876") && strstr (out, "ALIVE"));
    free (out);
    s_quit (ctx);
    close (mem);
    printf ("\n    template state %.0f KiB (RAM in the memfd); clone spawn->running %.2f s, "
            "its RAM's RSS %d MiB of %d",
            template_kib, clone_s, clone_rss, config->type->memory_mib);
}

static void s_check_memory (s_ctx_t *ctx)
{
    s_console_open (ctx);
    char *out =
        s_console_run (ctx, "echo M=$MARK; cat /dev/shm/marker; kill -0 $SLEEPER && echo ALIVE");
    assert (out);
    if (ctx->verbose)
        printf ("after resume: %s\n", out);
    assert (strstr (out, "M=m1234"));
    assert (strstr (out, "f2345"));
    assert (strstr (out, "ALIVE"));
    free (out);
}

void vmd_qemu_test (bool verbose)
{
    //  Pure functions first.
    assert (vmd_qemu_type ("small")->vcpus == 1 && vmd_qemu_type ("small")->memory_mib == 512);
    assert (vmd_qemu_type ("medium")->vcpus == 2 && vmd_qemu_type ("medium")->memory_mib == 1024);
    assert (vmd_qemu_type ("large")->vcpus == 2 && vmd_qemu_type ("large")->memory_mib == 2048);
    assert (vmd_qemu_type ("huge") == NULL && vmd_qemu_type (NULL) == NULL);
    int tsc = vmd_qemu_host_tsc_khz ();
    assert (tsc > 100000);
    //  Memory states: tagged with the accelerator; a tag without one (an older vmd's)
    //  is the version alone.
    if (*vmd_qemu_version ()) {
        const char *was = getenv ("SBX_ACCEL");
        char *saved = was ? strdup (was) : NULL;
        setenv ("SBX_ACCEL", "tcg", 1);
        char tcg[200];
        snprintf (tcg, sizeof tcg, "%s", vmd_qemu_state_key ());
        assert (strstr (tcg, vmd_qemu_version ()) == tcg && strstr (tcg, " accel=tcg"));
        assert (vmd_qemu_state_restorable (tcg));
        assert (vmd_qemu_state_restorable (vmd_qemu_version ()));
        assert (!vmd_qemu_state_restorable ("QEMU emulator version 0.0.1"));
        assert (!vmd_qemu_state_restorable (NULL) && !vmd_qemu_state_restorable (""));
        setenv ("SBX_ACCEL", "kvm", 1);
        assert (strstr (vmd_qemu_state_key (), " accel=kvm"));
        assert (!vmd_qemu_state_restorable (tcg)); //  saved under TCG: not under KVM
        assert (vmd_qemu_state_restorable (vmd_qemu_version ()));
        if (saved)
            setenv ("SBX_ACCEL", saved, 1);
        else
            unsetenv ("SBX_ACCEL");
        free (saved);
    }
    vmd_qemu_config_t config;
    vmd_qemu_config_init (&config);
    config.image_dir = "/img";
    config.dir = "/vms/x";
    config.hostname = "bad name";
    assert (vmd_qemu_argv (&config) == NULL);
    config.hostname = "box-1";
    config.dir = "/vms/a,b";
    assert (vmd_qemu_argv (&config) == NULL);
    config.dir = "/vms/x";
    config.no_network = true;
    config.incoming_fd = 7;
    //  A MAC of its own per sandbox id: stable, unicast, never QEMU's default.
    char mac[18], other[18];
    vmd_qemu_mac ("sb_0123456789", mac);
    vmd_qemu_mac ("sb_0123456780", other);
    assert (strlen (mac) == 17 && strncmp (mac, "52:54:00:", 9) == 0);
    assert (!streq (mac, other) && !streq (mac, "52:54:00:12:34:56"));
    vmd_qemu_mac ("sb_0123456789", other);
    assert (streq (mac, other));
    config.mac = mac;
    char **argv = vmd_qemu_argv (&config);
    assert (argv);
    char *joined = NULL;
    for (char **arg = argv; *arg; arg++) {
        char *next = zsys_sprintf ("%s%s%s", joined ? joined : "", joined ? " " : "", *arg);
        zstr_free (&joined);
        joined = next;
    }
    assert (strstr (joined, " -smp 1 -m 512M "));
    assert (strstr (joined, " -netdev user,id=n0,restrict=on "));
    assert (strstr (joined, " -device virtio-net-device,netdev=n0,mac=52:54:00:"));
    assert (strstr (joined, " -S -incoming fd:3"));
    assert (strstr (joined, "sbx.hostname=box-1"));
    assert (strstr (joined, vmd_qemu_kvm_usable () ? " -accel kvm " : " -accel tcg,tb-size=64 "));
    //  Reporting discards freed guest RAM: never with RAM in a file (see the argv).
    assert (strstr (joined, " -device virtio-balloon-device,free-page-reporting=on "));
    assert (!strstr (joined, "memory-backend"));
    if (verbose)
        printf ("\n%s\n", joined);
    zstr_free (&joined);
    vmd_qemu_argv_destroy (&argv);
    vmd_qemu_argv_destroy (&argv);
    assert (vmd_qemu_tcg_tb_mib () == VMD_QEMU_TCG_TB_MIB);
    assert (vmd_qemu_set_tcg_tb_mib (4) == -1 && vmd_qemu_set_tcg_tb_mib (4096) == -1);
    assert (vmd_qemu_set_tcg_tb_mib (32) == 0);
    argv = vmd_qemu_argv (&config);
    bool tcg32 = false;
    for (char **arg = argv; *arg; arg++)
        tcg32 = tcg32 || streq (*arg, "tcg,tb-size=32");
    assert (tcg32 || vmd_qemu_kvm_usable ());
    vmd_qemu_argv_destroy (&argv);
    assert (vmd_qemu_set_tcg_tb_mib (VMD_QEMU_TCG_TB_MIB) == 0);

    //  A real guest.
    char image_buf[512];
    const char *image = s_image_dir (image_buf, sizeof image_buf);
    if (!image) {
        fprintf (stderr, "vmd_qemu_test: no guest image: set SBX_IMAGE_DIR to a directory with "
                         "vmlinux, initrd.img and rootfs.ext4 (vmd/image/build-image.sh)\n");
        assert (!"no guest image");
    }
    s_ctx_t ctx = {.verbose = verbose, .con_fd = -1};
    ctx.deadline = zclock_mono () + 90000;
    ctx.loop = zloop_new ();
    char dir[] = "/tmp/vmd_qemu_test.XXXXXX";
    assert (mkdtemp (dir));
    ctx.dir = dir;
    vmd_qemu_config_init (&config);
    config.image_dir = image;
    config.dir = dir;
    config.hostname = "testbox";
    config.debug_shell = true; //  the test talks to the guest through ttyS0
    assert (vmd_qemu_overlay_create (&config) == 0);

    int64_t t0 = zclock_usecs ();
    signal (SIGABRT, s_on_abort);
    ctx.pid = vmd_qemu_spawn (&config);
    s_test_pid = ctx.pid;
    assert (ctx.pid > 0);
    s_qmp_open (&ctx);
    double qmp_ready_s = s_secs (t0);
    s_assert_user (&ctx, 0);
    bool booted = s_wait (&ctx, s_done_log, "sbx-init: ready", 60000);
    if (!booted)
        fprintf (stderr, "vmd_qemu_test: guest not ready; see %s/console.log, qemu.log\n", dir);
    assert (booted);
    double boot_s = s_secs (t0);
    assert (streq (s_status (&ctx), "running"));

    //  Something in memory only: a shell variable, a tmpfs file and a process.
    s_console_open (&ctx);
    char *out = s_console_run (&ctx, "MARK=m$((1000+234)); echo f$((2000+345)) >/dev/shm/marker; "
                                     "sleep 1000 & SLEEPER=$!; echo started");
    assert (out && strstr (out, "started"));
    free (out);

    //  Free page reporting: 128 MiB written to tmpfs and removed go back to the host
    //  (≈ 2 s after the free; bounded at 30 s for a loaded host).
    out = s_console_run (&ctx, "ls /sys/bus/virtio/drivers/virtio_balloon | grep -q virtio && "
                               "echo BALLOON$((40+2))");
    assert (out && strstr (out, "BALLOON42"));
    free (out);
    int rss_before = s_ram_rss_mib (ctx.pid, config.type->memory_mib);
    assert (rss_before > 0);
    out = s_console_run (&ctx, "head -c 134217728 /dev/zero >/dev/shm/big; rm /dev/shm/big; "
                               "echo FREED$((40+2))");
    assert (out && strstr (out, "FREED42"));
    free (out);
    int rss_after = -1;
    for (int i = 0; i < 300; i++) {
        rss_after = s_ram_rss_mib (ctx.pid, config.type->memory_mib);
        if (rss_after < rss_before + 64)
            break;
        s_wait (&ctx, s_done_never, NULL, 100);
    }
    if (verbose)
        printf ("guest RAM RSS %d MiB, %d MiB after 128 MiB freed\n", rss_before, rss_after);
    assert (rss_after < rss_before + 64);

    //  A forward added and removed at runtime.
    int port = s_free_port ();
    assert (!s_can_connect (port));
    assert (S_CALL (
        &ctx, vmd_qmp_hostfwd_add (ctx.qmp, "n0", "127.0.0.1", port, 8000, s_on_reply, &ctx)));
    assert (s_can_connect (port));
    //  The same port twice: HMP's text becomes an error.
    assert (!S_CALL (
        &ctx, vmd_qmp_hostfwd_add (ctx.qmp, "n0", "127.0.0.1", port, 8000, s_on_reply, &ctx)));
    assert (
        S_CALL (&ctx, vmd_qmp_hostfwd_remove (ctx.qmp, "n0", "127.0.0.1", port, s_on_reply, &ctx)));
    assert (!s_can_connect (port));

    //  Stop with memory: state into a file vmd opened, QEMU gone.
    char state[256];
    snprintf (state, sizeof state, "%s/memory.state", dir);
    int state_fd = open (state, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert (state_fd >= 0);
    double save_s, stop_s = s_stop_to_fd (&ctx, state_fd, &save_s);
    close (state_fd);
    struct stat st;
    assert (stat (state, &st) == 0 && st.st_size > 1024 * 1024);
    double state_mib = (double) st.st_size / (1 << 20);

    //  Resume: same command line, paused, loading the state from fd 3; this time
    //  under a uid of its own, as vmd should give each sandbox.
    config.uid = 61234;
    state_fd = open (state, O_RDONLY | O_CLOEXEC);
    double resume_s = s_resume_from_fd (&ctx, &config, state_fd, false);
    close (state_fd);
    s_check_memory (&ctx);

    //  Again through zstd: QEMU writes into a pipe, zstd into the file; and back through
    //  a QEMU started with -incoming defer.
    char packed[256];
    snprintf (packed, sizeof packed, "%s/memory.state.zst", dir);
    int pipe_fds[2];
    assert (pipe2 (pipe_fds, O_CLOEXEC) == 0);
    state_fd = open (packed, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    s_reap_t zstd = {vmd_qemu_zstd_spawn (true, pipe_fds[0], state_fd), 0, false};
    assert (zstd.pid > 0);
    close (pipe_fds[0]);
    close (state_fd);
    int64_t t_zstop = zclock_usecs ();
    double zsave_s;
    s_stop_to_fd (&ctx, pipe_fds[1], &zsave_s);
    close (pipe_fds[1]);
    assert (s_wait (&ctx, s_done_reaped, &zstd, 10000));
    double zstop_s = s_secs (t_zstop); //  QEMU gone and zstd done
    assert (WIFEXITED (zstd.status) && WEXITSTATUS (zstd.status) == 0);
    assert (stat (packed, &st) == 0 && st.st_size > 1024);
    double packed_mib = (double) st.st_size / (1 << 20);

    assert (pipe2 (pipe_fds, O_CLOEXEC) == 0);
    state_fd = open (packed, O_RDONLY | O_CLOEXEC);
    int64_t t_unpack = zclock_usecs ();
    zstd = (s_reap_t){vmd_qemu_zstd_spawn (false, state_fd, pipe_fds[1]), 0, false};
    assert (zstd.pid > 0);
    close (pipe_fds[1]);
    close (state_fd);
    s_resume_from_fd (&ctx, &config, pipe_fds[0], true); //  the pre-started QEMU's path
    double zresume_s = s_secs (t_unpack);
    close (pipe_fds[0]);
    assert (s_wait (&ctx, s_done_reaped, &zstd, 10000));
    assert (WIFEXITED (zstd.status) && WEXITSTATUS (zstd.status) == 0);
    s_check_memory (&ctx);

    assert (S_CALL (&ctx, vmd_qmp_quit (ctx.qmp, s_on_reply, &ctx)));
    assert (s_wait (&ctx, s_done_exited, NULL, 10000));
    vmd_qmp_destroy (&ctx.qmp);
    const char *files[] = {"overlay.qcow2", "console.log", "qemu.log", "memory.state", NULL};
    for (const char **file = files; *file; file++) {
        char path[256];
        snprintf (path, sizeof path, "%s/%s", dir, *file);
        assert (stat (path, &st) == 0);
    }
    s_test_clones (&ctx, &config, dir);
    printf ("\n    spawn->QMP ready %.2f s, spawn->sbx-init ready %.2f s"
            "\n    stop: save %.2f s, QEMU gone %.2f s, state %.1f MiB; resume (spawn->running) "
            "%.2f s"
            "\n    zstd -1: save %.2f s, QEMU gone and zstd done %.2f s, state %.1f MiB; resume "
            "%.2f s\n    ",
            qmp_ready_s, boot_s, save_s, stop_s, state_mib, resume_s, zsave_s, zstop_s, packed_mib,
            zresume_s);
    s_test_pid = -1;
    signal (SIGABRT, SIG_DFL);
    close (ctx.con_fd);
    free (ctx.con);
    json_decref (ctx.result);
    zloop_destroy (&ctx.loop);
    zdir_t *tree = zdir_new (dir, NULL);
    if (tree) {
        zdir_remove (tree, true);
        zdir_destroy (&tree);
    }
}
