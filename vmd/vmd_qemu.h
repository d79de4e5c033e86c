/*  vmd_qemu - one QEMU microvm process per sandbox: its command line, its disk, its spawn.

    Builds the argv from measured facts (notes/microvm-facts.md), creates the qcow2
    overlay on the shared base image, and forks/execs QEMU (no shell) in its own session
    so that guests outlive vmd and can be re-adopted. vmd's loop owns SIGCHLD: it reaps
    the pids returned here with waitpid () itself; nothing in this module waits for QEMU.

    Files in the sandbox directory (DIR):
        overlay.qcow2   the guest's disk, qcow2 on the shared rootfs.ext4
        qmp.sock        QMP (vmd_qmp), agent.sock the guest agent's virtio-serial port
        console.sock    the guest's ttyS0, interactive (one client at a time)
        console.log     everything the guest wrote on ttyS0, appended across resumes
        qemu.log        QEMU's own stdout/stderr, qemu.pid its pid
    The guest's memory state file is vmd's to name; it reaches QEMU as an fd.
*/
#ifndef VMD_QEMU_H_INCLUDED
#define VMD_QEMU_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

//  Sandbox types:
//      small   1 vCPU  512 MiB
//      medium  2 vCPU    1 GiB
//      large   2 vCPU    2 GiB
typedef struct {
    const char *name;
    int vcpus;
    int memory_mib;
} vmd_qemu_type_t;

//  The type called name, or NULL.
const vmd_qemu_type_t *vmd_qemu_type (const char *name);

typedef struct {
    const char *image_dir; //  vmlinux, initrd.img, rootfs.ext4
    const char *dir;       //  the sandbox directory, absolute
    const char *hostname;  //  [a-z0-9-], 1-63 characters
    const char *mac;       //  eth0's MAC address (vmd_qemu_mac); NULL: QEMU's default
    const vmd_qemu_type_t *type;
    bool no_network;  //  user networking with restrict=on: host forwards only
    bool debug_shell; //  sbx.shell: a shell on ttyS0 even when the image has the agent
    //  Resume: QEMU starts paused (-S) and loads the memory state from incoming_fd,
    //  which vmd_qemu_spawn hands to it as fd 3; or, when incoming_defer, waits for
    //  vmd_qmp_migrate_incoming_fd.
    int incoming_fd; //  -1 for none
    bool incoming_defer;
    //  Guest RAM in a memfd (vmd_ramfile), handed to QEMU as fd 4 and named by the
    //  backend id microvm's own RAM has (microvm.ram), so that states saved with and
    //  without it load into each other. mem_shared: the template's own guest writes into
    //  the memfd; else a clone maps the sealed memfd private and copy-on-write.
    int mem_fd; //  -1 for none: anonymous RAM
    bool mem_shared;
    const char *qemu; //  binary; NULL: $SBX_QEMU or qemu-system-x86_64
    //  The overlay's base: a qcow2 (a snapshot's disk) instead of IMAGE_DIR/rootfs.ext4.
    const char *backing;
    //  Whom QEMU runs as when vmd is root: uid (and gid, default uid) when non-zero,
    //  best one per sandbox so that guests' QEMUs can't touch each other; else user by
    //  name; NULL: sbx-qemu, else nobody. "" never drops.
    uid_t uid;
    gid_t gid;
    const char *user;
} vmd_qemu_config_t;

//  The MAC address of a sandbox's eth0, made from its id ("52:54:00:" and 24 bits of a
//  hash): its own, so that two sandboxes (a fork's copies, clones of a snapshot) never
//  show one, and the same at every start. Writes "aa:bb:cc:dd:ee:ff" into mac (18 bytes).
void vmd_qemu_mac (const char *sandbox_id, char mac[18]);

//  A config with incoming_fd and mem_fd -1 and the small type.
void vmd_qemu_config_init (vmd_qemu_config_t *config);

//  The NULL-terminated argv for config, or NULL if config is invalid. Destroy with
//  vmd_qemu_argv_destroy.
char **vmd_qemu_argv (const vmd_qemu_config_t *config);
void vmd_qemu_argv_destroy (char ***argv_p);

//  Forks and execs argv (argv[0] looked up in PATH) in a new session with stdin
//  /dev/null, stdout and stderr appended to DIR/qemu.log, no other fds but
//  config->incoming_fd as fd 3 and config->mem_fd as fd 4, default signal mask and handlers, and,
//  when root, privileges dropped to config's user (see vmd_qemu.c for why not -runas). Returns the
//  pid, or -1. Blocks only for fork.
pid_t vmd_qemu_spawn (const vmd_qemu_config_t *config);

//  Whom QEMU runs as for the user setting (as vmd_qemu_config_t.user; NULL: the
//  default choice): 1 and *uid when vmd drops to that user, 0 when QEMU runs as vmd's
//  own user (vmd is not root, or user is ""), -1 when the user does not exist.
int vmd_qemu_user (const char *user, uid_t *uid);

//  The pid of the QEMU running for DIR (after a vmd restart: it is no longer vmd's
//  child, so its exit shows only as its QMP connection closing), or -1. Checks that
//  qemu.pid names a live process whose command line has DIR's QMP socket.
pid_t vmd_qemu_adopt (const char *dir);

//  Runs qemu-img to create DIR/overlay.qcow2 on IMAGE_DIR/rootfs.ext4 and returns its
//  pid for the caller to reap (exit 0 is success), or -1.
pid_t vmd_qemu_overlay_spawn (const vmd_qemu_config_t *config);
//  The same, waiting for it (≈ 20 ms: for tools and tests, not for vmd's loop).
int vmd_qemu_overlay_create (const vmd_qemu_config_t *config);

//  Runs a host tool (argv[0] looked up in PATH) as vmd's own user, output appended to
//  log_path, in a new session. Returns the pid for the caller to reap, or -1.
pid_t vmd_qemu_helper_spawn (char **argv, const char *log_path);

//  TCG's translation cache per guest in MiB, the default of vmd.tcg_tb_mib. KVM guests
//  have none.
#define VMD_QEMU_TCG_TB_MIB 64

//  Sets the cache size of TCG guests spawned from now on (host-wide: vmd sets it once,
//  before any guest). -1 when mib is outside 8-1024 (nothing changes).
int vmd_qemu_set_tcg_tb_mib (uint64_t mib);
int vmd_qemu_tcg_tb_mib (void);

//  The QEMU this host runs, as the first line of `qemu-system-x86_64 --version`, found
//  once (≈ 20 ms, at vmd's start) and cached; "" when unknown. A memory state is only
//  restored by the same version.
const char *vmd_qemu_version (void);

//  What a memory state saved here is tagged with: the version and the accelerator,
//  "<version> accel=kvm" or "… accel=tcg" ("" when the version is unknown). Both
//  `-cpu max`, which is not the same CPU under KVM (the host's features) as under TCG
//  (what TCG emulates): a state moved across would run on features it never probed, or
//  miss ones it uses.
const char *vmd_qemu_state_key (void);

//  May a memory state tagged saved be restored here? The same key; a tag of an older
//  vmd, the version alone, is taken at its word (same version).
bool vmd_qemu_state_restorable (const char *saved);

//  The group QEMU runs in when vmd drops privileges (see vmd_qemu_user), for files it
//  must read but not own; 0 and -1 when it does not drop.
int vmd_qemu_group (const char *user, gid_t *gid);

//  zstd -1 (compress) or zstd -d between in_fd and out_fd, unprivileged when vmd is
//  root, for memory state: QEMU writes into a pipe whose other end feeds zstd, or
//  reads from one that zstd fills (-incoming fd:3). Returns the pid for the caller to
//  reap (exit 0 is success), or -1. The caller closes its copies of the fds.
pid_t vmd_qemu_zstd_spawn (bool compress, int in_fd, int out_fd);

//  The host TSC frequency in kHz (the guest needs it under TCG: tsc_early_khz), found
//  once and cached: $SBX_TSC_KHZ, sysfs, the kernel log, a 100 ms measurement, cpuinfo.
//  0 if unknown.
int vmd_qemu_host_tsc_khz (void);
//  True when /dev/kvm can run guests ($SBX_ACCEL=kvm|tcg overrides).
bool vmd_qemu_kvm_usable (void);

void vmd_qemu_test (bool verbose);

#endif
