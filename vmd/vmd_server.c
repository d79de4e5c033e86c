/*  vmd_server - see vmd_server.h */
#include "vmd_server.h"
#include "sbx_metrics.h"
#include "vmd_egress.h"
#include "vmd_firewall.h"
#include "sbx_clock.h"
#include "sbx_log.h"
#include "vmd_guest.h"
#include "vmd_qemu.h"
#include "vmd_sampler.h"
#include "vmd_relay.h"
#include "vmd_ship.h"
#include "sbx_files.h"
#include "vmd_template.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define S_SWEEP_MS      100
#define S_AGENT_DEFAULT 600000 //  an exec may run that long

struct _vmd_server_t {
    sbx_config_t *config;
    zloop_t *loop;
    sbx_peer_t *peer;
    char *vms_dir;
    char *image_dir;
    char *type_image[VMD_GUEST_TYPES]; //  image_dir.TYPE's, kept as images/<hash>; NULL: image_dir
    uint64_t capacity;
    zhashx_t *guests;        //  sandbox id -> vmd_guest_t
    zhashx_t *failed_unsent; //  sandbox id -> reason, vm.failed waiting for the broker
    zhashx_t *ops;           //  rid -> s_op_t: the vm.*.ok its request waits for
    vmd_guest_env_t env;
    vmd_template_t *templates; //  vmd.templates: restored instead of cold boots
    zlistx_t *cold;            //  rids of template creates that failed: boot them cold
    int sweep;
    int wake_fd;              //  eventfd: guests have something to collect
    vmd_firewall_t *firewall; //  the guests' egress policy, kept current (NULL: open)
    vmd_egress_t *egress;     //  each guest's own egress rules, on top of that policy
    vmd_sampler_t *sampler;   //  the guests' resource samples (vm.metrics)
    vmd_ship_t *ship;         //  moves to and from other hosts (vm.ship.*)
    vmd_relay_t *relay;       //  published ports for gateways on other hosts (vmd.relay)
};

//  --------------------------------------------------------------------------
//  The image: <data-dir>/images/<input_hash>/, linked once from the build's image.

static int s_link_or_copy (const char *from, const char *to)
{
    if (link (from, to) == 0 || errno == EEXIST)
        return 0;
    //  Another file system: copy (once per image, at start).
    int in = open (from, O_RDONLY | O_CLOEXEC);
    int out = in >= 0 ? open (to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644) : -1;
    int rc = out >= 0 ? 0 : -1;
    char buf[1 << 16];
    ssize_t got;
    while (rc == 0 && (got = read (in, buf, sizeof buf)) != 0)
        if (got < 0 || write (out, buf, (size_t) got) != got)
            rc = -1;
    if (out >= 0 && (fsync (out) || close (out)))
        rc = -1;
    if (in >= 0)
        close (in);
    return rc;
}

//  The image at source (named by `key` in messages) as images/<hash>/, or source itself
//  when its manifest has no input hash; NULL when it can't be kept.
static char *s_image_keep (sbx_config_t *config, const char *key, const char *source)
{
    char real[PATH_MAX];
    if (!source || !realpath (source, real)) {
        sbx_error ("no guest image at %s: set %s", source ? source : "(unknown)", key);
        return NULL;
    }
    char *manifest = zsys_sprintf ("%s/manifest.json", real);
    json_t *root = manifest ? json_load_file (manifest, 0, NULL) : NULL;
    free (manifest);
    const char *hash = json_string_value (json_object_get (root, "input_hash"));
    bool valid = hash && strlen (hash) >= 8 && strlen (hash) <= 128;
    for (const char *c = hash; valid && *c; c++)
        valid = isxdigit ((unsigned char) *c);
    if (!valid) {
        sbx_warn ("image %s has no manifest input_hash: guests name it directly", real);
        json_decref (root);
        return strdup (real);
    }
    char *images = sbx_config_path (config, "images");
    char *target = zsys_sprintf ("%s/%s", images, hash);
    char *tmp = zsys_sprintf ("%s/%s.tmp", images, hash);
    json_decref (root);
    struct stat st;
    if (target && stat (target, &st) == 0) {
        free (images);
        free (tmp);
        return target;
    }
    mkdir (images, 0755);
    mkdir (tmp, 0755);
    const char *files[] = {"vmlinux", "initrd.img", "rootfs.ext4", "manifest.json", NULL};
    int rc = 0;
    for (const char **file = files; rc == 0 && *file; file++) {
        char *from = zsys_sprintf ("%s/%s", real, *file), *to = zsys_sprintf ("%s/%s", tmp, *file);
        rc = s_link_or_copy (from, to);
        if (rc)
            sbx_error ("cannot bring %s into %s (%s): %s", from, tmp, key, strerror (errno));
        free (from);
        free (to);
    }
    if (rc == 0 && rename (tmp, target) == -1)
        rc = -1;
    if (rc == 0)
        sbx_info ("guest image %s kept as %s", real, target);
    free (images);
    free (tmp);
    if (rc) {
        free (target);
        return NULL;
    }
    return target;
}

//  The default image: image_dir, else the build's (or install's) beside the executable.
static char *s_image_setup (sbx_config_t *config)
{
    const char *source = sbx_config_get (config, "image_dir", NULL);
    char exe[PATH_MAX] = "", dflt[PATH_MAX + 16];
    if (!source) {
        ssize_t size = readlink ("/proc/self/exe", exe, sizeof exe - 1);
        if (size > 0) {
            exe[size] = 0;
            //  build/bin/sbx-vmd → build/image (an install: bin/ → image/ beside it).
            snprintf (dflt, sizeof dflt, "%s/../image", dirname (exe));
            source = dflt;
        }
    }
    return s_image_keep (config, "image_dir", source);
}

//  The images of image_dir.TYPE (e.g. the docker variant for one type): kept like the
//  default one. 0, or -1 when one is set and can't be kept (vmd does not start: a type
//  silently booting another image than the operator chose would be worse).
static int s_type_images_setup (vmd_server_t *self)
{
    for (int type = 1; type < VMD_GUEST_TYPES; type++) {
        char key[64];
        snprintf (key, sizeof key, "image_dir.%s",
                  sbx_sandbox_type_name ((sbx_sandbox_type_t) type));
        const char *source = sbx_config_get (self->config, key, NULL);
        if (!source || !*source)
            continue;
        self->type_image[type] = s_image_keep (self->config, key, source);
        if (!self->type_image[type])
            return -1;
        sbx_info ("%s sandboxes boot image %s (%s)",
                  sbx_sandbox_type_name ((sbx_sandbox_type_t) type), self->type_image[type], key);
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Guests' news

static void s_update_use (vmd_server_t *self)
{
    uint64_t used = 0;
    for (vmd_guest_t *g = zhashx_first (self->guests); g; g = zhashx_next (self->guests))
        if (vmd_guest_state (g) != SBX_SANDBOX_STATE_STOPPED)
            used++;
    if (self->peer)
        sbx_peer_set_capacity (self->peer, self->capacity, used);
    sbx_metrics_set (sbx_metrics_here (), SBX_METRIC_VMS, (double) used);
}

static void s_send_failed (vmd_server_t *self)
{
    if (!self->peer || !sbx_peer_welcomed (self->peer))
        return;
    const char *reason;
    while ((reason = zhashx_first (self->failed_unsent))) {
        const char *id = zhashx_cursor (self->failed_unsent);
        sbx_msg_t *failed = sbx_msg_new (SBX_MSG_VM_FAILED);
        sbx_str_set (&sbx_msg_vm_failed (failed)->sandbox_id, id);
        sbx_str_set (&sbx_msg_vm_failed (failed)->reason, reason);
        if (sbx_peer_send (self->peer, &failed))
            return; //  the next sweep tries again
        sbx_info ("sandbox=%s vm.failed sent: %s", id, reason);
        zhashx_delete (self->failed_unsent, id);
    }
}

static void s_on_failed (vmd_guest_t *guest, const char *reason, void *arg)
{
    vmd_server_t *self = arg;
    char text[1024];
    snprintf (text, sizeof text, "%s", reason);
    zhashx_update (self->failed_unsent, vmd_guest_id (guest), text);
    s_send_failed (self);
}

//  A request in progress: the vm.*.ok type it waits for, and a note for the user (a
//  create from a snapshot that could not restore its memory here).
typedef struct {
    sbx_msg_type_t type;
    char note[512];
    //  A create restoring a template: what booting it cold instead takes.
    bool template;
    char id[72], hostname[72];
    sbx_sandbox_type_t sandbox_type;
    bool no_network;
    uint32_t timeout_ms;
    uint64_t started; //  mono ms
} s_op_t;

static void s_wake (void *arg);

//  The reply an operation's request waits for.
static void s_reply (vmd_server_t *self, uint64_t rid, const char *id, sbx_code_t code,
                     const char *message)
{
    char key[32];
    snprintf (key, sizeof key, "%llu", (unsigned long long) rid);
    s_op_t *op = zhashx_lookup (self->ops, key);
    sbx_msg_t *reply;
    if (code != SBX_OK)
        reply = sbx_msg_new_error (rid, code, "sandbox %s: %s", id,
                                   message && *message ? message : "failed");
    else {
        reply = sbx_msg_new (op ? op->type : SBX_MSG_VM_CREATE_OK);
        reply->rid = rid;
        //  Every vm.*.ok names its sandbox; create's says more.
        sbx_msg_set_subject (reply, id);
        if (reply->type == SBX_MSG_VM_CREATE_OK && op && *op->note) {
            sbx_msg_vm_create_ok (reply)->cold_boot = true;
            sbx_str_set (&sbx_msg_vm_create_ok (reply)->note, op->note);
        }
    }
    zhashx_delete (self->ops, key);
    if (self->peer && sbx_peer_send (self->peer, &reply))
        sbx_warn ("rid=%llu sandbox=%s reply could not go out (broker gone)",
                  (unsigned long long) rid, id);
    sbx_msg_destroy (&reply);
    s_update_use (self);
}

//  An operation's end. A create from a template that failed (its restore passed its
//  deadline, QEMU died) is not the user's failure: the guest is gone (deleted), so the
//  collector boots the same sandbox cold, once.
static void s_on_done (vmd_guest_t *guest, uint64_t rid, sbx_code_t code, const char *message,
                       void *arg)
{
    vmd_server_t *self = arg;
    char key[32];
    snprintf (key, sizeof key, "%llu", (unsigned long long) rid);
    s_op_t *op = zhashx_lookup (self->ops, key);
    //  (Not when the request's own deadline is what ended it: nobody waits any more.)
    bool time_left =
        op && (!op->timeout_ms || sbx_clock_mono_ms () - op->started + 2000 < op->timeout_ms);
    if (code == SBX_OK && op && op->template)
        vmd_template_restored (self->templates, op->sandbox_type, true);
    if (code != SBX_OK && op && op->template && time_left &&
        vmd_guest_state (guest) == SBX_SANDBOX_STATE_DELETED) {
        op->template = false;
        vmd_template_restored (self->templates, op->sandbox_type, false);
        sbx_warn ("sandbox=%s restoring the %s template failed (%s): booting it cold instead",
                  vmd_guest_id (guest), sbx_sandbox_type_name (op->sandbox_type),
                  message && *message ? message : "failed");
        zlistx_add_end (self->cold, key);
        s_wake (self);
        return;
    }
    //  A deleted guest's rules are gone when the delete answers (the collector would
    //  drop them a moment later).
    if (code == SBX_OK && op && op->type == SBX_MSG_VM_DELETE_OK)
        vmd_egress_forget (self->egress, vmd_guest_id (guest));
    s_reply (self, rid, vmd_guest_id (guest), code, message);
}

static void s_assign_uid (vmd_server_t *self, vmd_guest_t *guest);

//  From the collector, once the failed template create's guest is dropped.
static void s_boot_cold (vmd_server_t *self, const char *key)
{
    s_op_t *op = zhashx_lookup (self->ops, key);
    uint64_t rid = strtoull (key, NULL, 10);
    if (!op)
        return;
    sbx_err_t err = {0};
    uint64_t spent = sbx_clock_mono_ms () - op->started;
    uint32_t left = !op->timeout_ms                 ? 0 //  the default
                    : spent + 1000 < op->timeout_ms ? (uint32_t) (op->timeout_ms - spent)
                                                    : 1000;
    vmd_guest_t *guest =
        zhashx_lookup (self->guests, op->id)
            ? NULL
            : vmd_guest_new (&self->env, op->id, op->hostname, op->sandbox_type, op->no_network);
    s_assign_uid (self, guest);
    if (!guest)
        sbx_err_set (&err, SBX_E_CONFLICT, "sandbox %s exists on this vmd", op->id);
    else if (vmd_egress_move (self->egress, op->id, vmd_guest_uid (guest), &err) == 0 &&
             vmd_guest_create (guest, rid, left, &err) == 0) {
        zhashx_insert (self->guests, op->id, guest);
        return;
    }
    if (guest)
        vmd_egress_forget (self->egress, op->id);
    vmd_guest_destroy (&guest);
    char id[72];
    snprintf (id, sizeof id, "%s", op->id);
    s_reply (self, rid, id, err.code, err.message);
}

static void s_wake (void *arg)
{
    vmd_server_t *self = arg;
    uint64_t one = 1;
    if (write (self->wake_fd, &one, sizeof one) == -1 && errno != EAGAIN)
        sbx_error ("cannot wake the collector: %s", strerror (errno));
}

//  From a poller, after this turn's timers ran: dropping guests and channels here
//  never leaves a timer of theirs to fire (see vmd_guest_collect).
static int s_on_wake (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    (void) item;
    vmd_server_t *self = arg;
    uint64_t count;
    if (read (self->wake_fd, &count, sizeof count) == -1 && errno != EAGAIN)
        sbx_error ("cannot read the collector's eventfd: %s", strerror (errno));
    zlistx_t *gone = zlistx_new ();
    for (vmd_guest_t *g = zhashx_first (self->guests); g; g = zhashx_next (self->guests)) {
        vmd_guest_collect (g);
        if (vmd_guest_state (g) == SBX_SANDBOX_STATE_DELETED)
            zlistx_add_end (gone, (void *) zhashx_cursor (self->guests));
    }
    for (const char *id = zlistx_first (gone); id; id = zlistx_next (gone)) {
        vmd_sampler_forget (self->sampler, id); //  (its pending asks go with its link)
        vmd_egress_forget (self->egress, id);
        zhashx_delete (self->guests, id);
    }
    zlistx_destroy (&gone);
    char *key;
    while ((key = zlistx_detach (self->cold, NULL))) {
        s_boot_cold (self, key);
        free (key);
    }
    vmd_template_collect (self->templates);
    s_update_use (self);
    return 0;
}

static int s_on_sweep (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_server_t *self = arg;
    s_update_use (self);
    s_send_failed (self);
    vmd_relay_tick (self->relay, self->peer ? sbx_peer_ports_key (self->peer) : NULL, self->guests);
    return 0;
}

//  --------------------------------------------------------------------------
//  Requests: one handler per message type

static sbx_msg_t *s_error (const sbx_msg_t *request, const sbx_err_t *err)
{
    return sbx_msg_new_error (request->rid, err->code, "%s", err->message);
}

static vmd_guest_t *s_find (vmd_server_t *self, const char *id)
{
    return id ? zhashx_lookup (self->guests, id) : NULL;
}

static s_op_t *s_op_remember (vmd_server_t *self, uint64_t rid, sbx_msg_type_t ok_type)
{
    char key[32];
    snprintf (key, sizeof key, "%llu", (unsigned long long) rid);
    s_op_t *value = calloc (1, sizeof *value);
    if (!value)
        return NULL;
    value->type = ok_type;
    zhashx_update (self->ops, key, value);
    return value;
}

//  A path given by the broker must lie under DIR/<below>/ (no way out of it).
static bool s_under (vmd_server_t *self, const char *path, const char *below)
{
    char prefix[PATH_MAX];
    snprintf (prefix, sizeof prefix, "%s/%s/", sbx_config_data_dir (self->config), below);
    return path && strncmp (path, prefix, strlen (prefix)) == 0 && !strstr (path, "..") &&
           strlen (path) > strlen (prefix) && strlen (path) < 200;
}

//  path (…/below/NAME, from any host) as this host's <data>/below/NAME. 0, or -1 when it
//  is not of that form or NAME is not a plain name.
static int s_here (vmd_server_t *self, const char *path, const char *below, char *out, size_t size)
{
    const char *name = path ? strrchr (path, '/') : NULL;
    if (!name || name == path || strlen (path) >= 1024)
        return -1;
    size_t below_len = strlen (below);
    if ((size_t) (name - path) < below_len || strncmp (name - below_len, below, below_len) ||
        (name - below_len > path && name[-(ptrdiff_t) below_len - 1] != '/'))
        return -1;
    name++;
    if (!*name || strlen (name) > 128 || streq (name, ".") || streq (name, ".."))
        return -1;
    for (const char *p = name; *p; p++)
        if (!isalnum ((unsigned char) *p) && *p != '_' && *p != '-' && *p != '.')
            return -1;
    int n = snprintf (out, size, "%s/%s/%s", sbx_config_data_dir (self->config), below, name);
    return n > 0 && (size_t) n < size && s_under (self, out, below) ? 0 : -1;
}

//  A uid of its own for a new guest's QEMU: the lowest of the range no guest here has
//  (stopped ones keep theirs: their directory is owned by it). None when the range is
//  off or full (then it runs as the QEMU user, confined all the same).
static void s_assign_uid (vmd_server_t *self, vmd_guest_t *guest)
{
    uint32_t count = self->env.uid_count;
    if (!count || !guest)
        return;
    size_t words = (count + 63) / 64;
    uint64_t *used = calloc (words, sizeof *used);
    if (!used)
        return;
    for (vmd_guest_t *g = zhashx_first (self->guests); g; g = zhashx_next (self->guests)) {
        uid_t uid = vmd_guest_uid (g);
        if (uid >= self->env.uid_first && uid - self->env.uid_first < count)
            used[(uid - self->env.uid_first) / 64] |= 1ull << ((uid - self->env.uid_first) % 64);
    }
    for (uint32_t i = 0; i < count; i++)
        if (!(used[i / 64] & (1ull << (i % 64)))) {
            vmd_guest_set_uid (guest, self->env.uid_first + i);
            break;
        }
    free (used);
}

static sbx_msg_t *s_on_create (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_create_t *args = sbx_msg_vm_create (request);
    sbx_err_t err = {0};
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (guest)
        return sbx_msg_new_error (request->rid, SBX_E_CONFLICT,
                                  "sandbox %s exists on this vmd (%s)", args->sandbox_id,
                                  sbx_sandbox_state_name (vmd_guest_state (guest)));
    guest =
        vmd_guest_new (&self->env, args->sandbox_id, args->hostname, args->type, args->no_network);
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "sandbox id '%s' or hostname '%s' is not usable (ids: "
                                  "[A-Za-z0-9_-]{1,64}, hostnames: [a-z0-9-]{1,63})",
                                  args->sandbox_id, args->hostname);
    s_op_t *op = s_op_remember (self, request->rid, SBX_MSG_VM_CREATE_OK);
    char snapshot_dir[1200], image[1200];
    //  The snapshot's and image's directories of this host: another host's snapshotd
    //  or record named them under its own data directory (a copy there, a copy here).
    bool here_ok =
        args->snapshot_dir &&
        s_here (self, args->snapshot_dir, "snapshots", snapshot_dir, sizeof snapshot_dir) == 0 &&
        (!args->image || s_here (self, args->image, "images", image, sizeof image) == 0);
    if (args->snapshot_dir) {
        //  Memory is restored only by the QEMU that saved it; else its disk, cold.
        bool same = vmd_qemu_state_restorable (args->snapshot_qemu);
        char memory[1300];
        snprintf (memory, sizeof memory, "%s/memory.state", here_ok ? snapshot_dir : "");
        bool restore = same && access (memory, R_OK) == 0;
        if (!restore && op)
            snprintf (op->note, sizeof op->note,
                      "started from the snapshot's disk with a fresh boot: %s; running processes "
                      "and memory were not kept",
                      !same ? "it was saved by another QEMU version or accelerator (KVM or "
                              "TCG) than this host runs"
                            : "it has no memory state");
        if (!here_ok ||
            vmd_guest_set_origin (guest, snapshot_dir, args->image ? image : NULL, restore)) {
            char key[32];
            snprintf (key, sizeof key, "%llu", (unsigned long long) request->rid);
            zhashx_delete (self->ops, key);
            vmd_guest_destroy (&guest);
            return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                      "snapshot directory %s or image %s is not usable here",
                                      args->snapshot_dir, args->image ? args->image : "(none)");
        }
    } else {
        //  A booted template of this type restores faster than a boot (else: cold).
        const char *template = vmd_template_dir (self->templates, args->type,
                                                 vmd_guest_env_image (&self->env, args->type));
        if (template && op && vmd_guest_set_origin (guest, template, NULL, true) == 0) {
            sbx_info ("sandbox=%s from the %s template", args->sandbox_id,
                      sbx_sandbox_type_name (args->type));
            vmd_guest_set_ram (guest, vmd_template_ram (self->templates, args->type), false);
            op->template = true;
            snprintf (op->id, sizeof op->id, "%s", args->sandbox_id);
            snprintf (op->hostname, sizeof op->hostname, "%s", args->hostname);
            op->sandbox_type = args->type;
            op->no_network = args->no_network;
            op->timeout_ms = request->timeout_ms;
            op->started = sbx_clock_mono_ms ();
        }
    }
    s_assign_uid (self, guest);
    //  Its rules are in the kernel before its QEMU can open a socket.
    int rc = vmd_egress_set (self->egress, args->sandbox_id, vmd_guest_uid (guest),
                             &args->egress_allow, &args->egress_deny, &err);
    bool ruled = rc == 0;
    if (rc == 0)
        rc = vmd_guest_create (guest, request->rid, request->timeout_ms, &err);
    if (rc && ruled && op && op->template) {
        //  The template can't be used now (its files gone?): boot cold, as without one.
        sbx_warn ("sandbox=%s cannot restore the %s template (%s): booting it cold instead",
                  args->sandbox_id, sbx_sandbox_type_name (args->type), err.message);
        op->template = false;
        vmd_template_restored (self->templates, args->type, false);
        vmd_guest_destroy (&guest);
        err = (sbx_err_t){0};
        guest = vmd_guest_new (&self->env, args->sandbox_id, args->hostname, args->type,
                               args->no_network);
        s_assign_uid (self, guest);
        rc = !guest ? sbx_err_set (&err, SBX_E_INTERNAL, "out of memory")
             : vmd_egress_move (self->egress, args->sandbox_id, vmd_guest_uid (guest), &err)
                 ? -1
                 : vmd_guest_create (guest, request->rid, request->timeout_ms, &err);
    }
    if (rc) {
        if (ruled)
            vmd_egress_forget (self->egress, args->sandbox_id);
        char key[32];
        snprintf (key, sizeof key, "%llu", (unsigned long long) request->rid);
        zhashx_delete (self->ops, key);
        vmd_guest_destroy (&guest);
        return s_error (request, &err);
    }
    zhashx_insert (self->guests, args->sandbox_id, guest);
    s_update_use (self);
    return NULL;
}

static sbx_msg_t *s_on_change (vmd_server_t *self, sbx_msg_t *request, const char *id)
{
    vmd_guest_t *guest = s_find (self, id);
    sbx_err_t err = {0};
    if (!guest && request->type == SBX_MSG_VM_DELETE) {
        //  Idempotent: the broker may retry a delete that already happened.
        sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_DELETE_OK);
        sbx_str_set (&sbx_msg_vm_delete_ok (reply)->sandbox_id, id);
        return reply;
    }
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  id);
    //  Resumed or deleted here: an offer of its files for a move ends.
    if (request->type != SBX_MSG_VM_STOP)
        vmd_ship_forget (self->ship, id);
    int rc;
    switch (request->type) {
    case SBX_MSG_VM_STOP:
        s_op_remember (self, request->rid, SBX_MSG_VM_STOP_OK);
        rc = vmd_guest_stop (guest, request->rid, request->timeout_ms, &err);
        break;
    case SBX_MSG_VM_RESUME: {
        //  The rules may have changed while it was stopped: in force before it runs.
        sbx_vm_resume_t *args = sbx_msg_vm_resume (request);
        s_op_remember (self, request->rid, SBX_MSG_VM_RESUME_OK);
        rc = vmd_egress_set (self->egress, id, vmd_guest_uid (guest), &args->egress_allow,
                             &args->egress_deny, &err);
        if (rc == 0)
            rc = vmd_guest_resume (guest, request->rid, request->timeout_ms, &err);
        break;
    }
    default:
        s_op_remember (self, request->rid, SBX_MSG_VM_DELETE_OK);
        rc = vmd_guest_delete (guest, request->rid, request->timeout_ms, &err);
        break;
    }
    if (rc == 0)
        return NULL;
    char key[32];
    snprintf (key, sizeof key, "%llu", (unsigned long long) request->rid);
    zhashx_delete (self->ops, key);
    return s_error (request, &err);
}

//  vm.snapshot: answered when the guest's capture ended (vmd_guest_snapshot).
typedef struct {
    vmd_server_t *server;
    uint64_t rid;
} s_snapshot_call_t;

static void s_on_snapshot_done (vmd_guest_t *guest, sbx_code_t code, const char *message,
                                uint64_t disk_bytes, uint64_t memory_bytes, void *arg)
{
    s_snapshot_call_t *call = arg;
    sbx_msg_t *reply;
    if (code != SBX_OK)
        reply = sbx_msg_new_error (call->rid, code, "sandbox %s: %s", vmd_guest_id (guest),
                                   message && *message ? message : "snapshot failed");
    else {
        reply = sbx_msg_new (SBX_MSG_VM_SNAPSHOT_OK);
        reply->rid = call->rid;
        sbx_vm_snapshot_ok_t *ok = sbx_msg_vm_snapshot_ok (reply);
        sbx_str_set (&ok->sandbox_id, vmd_guest_id (guest));
        ok->disk_bytes = disk_bytes;
        ok->memory_bytes = memory_bytes;
        sbx_str_set (&ok->image, vmd_guest_image (guest));
        sbx_str_set (&ok->qemu_version, vmd_qemu_state_key ());
        ok->paused_ms = vmd_guest_paused_ms (guest);
    }
    if (!call->server->peer || sbx_peer_send (call->server->peer, &reply))
        sbx_warn ("rid=%llu snapshot reply could not go out (broker gone)",
                  (unsigned long long) call->rid);
    sbx_msg_destroy (&reply);
    free (call);
}

static sbx_msg_t *s_on_snapshot (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_snapshot_t *args = sbx_msg_vm_snapshot (request);
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    if (!s_under (self, args->dir, "snapshots"))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "snapshot directory %s is not in this host's snapshot store",
                                  args->dir);
    s_snapshot_call_t *call = calloc (1, sizeof *call);
    if (!call)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    *call = (s_snapshot_call_t){self, request->rid};
    sbx_err_t err = {0};
    if (vmd_guest_snapshot (guest, args->dir, args->live, request->timeout_ms, s_on_snapshot_done,
                            call, &err) == 0)
        return NULL;
    free (call);
    return s_error (request, &err);
}

typedef struct {
    vmd_server_t *server;
    uint64_t rid; //  the broker's
    char *id;
} s_agent_call_t;

static void s_on_agent_reply (vmd_agentlink_t *link, sbx_msg_t **reply_p, void *arg)
{
    (void) link;
    s_agent_call_t *call = arg;
    sbx_msg_t *answer = *reply_p;
    sbx_msg_t *reply = NULL;
    //  The link's own failures (timeout, connection lost) are vmd's errors; what the
    //  agent said, error or not, goes back as it said it.
    bool from_link =
        answer->type == SBX_MSG_ERROR && (sbx_msg_error (answer)->code == SBX_E_TIMEOUT ||
                                          sbx_msg_error (answer)->code == SBX_E_UNAVAILABLE);
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err = {0};
    if (from_link)
        reply = sbx_msg_new_error (call->rid, sbx_msg_error (answer)->code, "sandbox %s: %s",
                                   call->id, sbx_msg_error (answer)->message);
    else if (sbx_msg_encode (answer, &data, &size, &err))
        reply = sbx_msg_new_error (call->rid, SBX_E_INTERNAL,
                                   "sandbox %s: the agent's answer does not encode: %s", call->id,
                                   err.message);
    else {
        reply = sbx_msg_new (SBX_MSG_VM_AGENT_OK);
        reply->rid = call->rid;
        sbx_vm_agent_ok_t *ok = sbx_msg_vm_agent_ok (reply);
        ok->reply.data = data; //  taken
        ok->reply.size = size;
        data = NULL;
    }
    free (data);
    sbx_debug ("rid=%llu sandbox=%s vm.agent answered %s", (unsigned long long) call->rid, call->id,
               sbx_msg_type_name (answer->type));
    if (call->server->peer)
        sbx_peer_send (call->server->peer, &reply);
    sbx_msg_destroy (&reply);
    free (call->id);
    free (call);
}

static sbx_msg_t *s_on_agent (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_agent_t *args = sbx_msg_vm_agent (request);
    sbx_err_t err = {0};
    sbx_msg_t *inner = sbx_msg_decode (args->request.data, args->request.size, &err);
    if (!inner)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "the agent request does not decode: %s", err.message);
    switch (inner->type) {
    case SBX_MSG_AGENT_EXEC:
    case SBX_MSG_AGENT_STATUS:
    case SBX_MSG_AGENT_KILL:
    case SBX_MSG_AGENT_INPUT:
    case SBX_MSG_AGENT_RESIZE:
    case SBX_MSG_AGENT_PS:
    case SBX_MSG_AGENT_FILE_WRITE:
    case SBX_MSG_AGENT_FILE_READ:
        break;
    default: {
        sbx_msg_t *reply =
            sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                               "%s cannot be sent to a sandbox's agent (only agent.exec, "
                               "agent.status, agent.kill, agent.input, agent.resize, agent.ps, "
                               "agent.file.write, agent.file.read)",
                               sbx_msg_type_name (inner->type));
        sbx_msg_destroy (&inner);
        return reply;
    }
    }
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (!guest) {
        sbx_msg_destroy (&inner);
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    }
    s_agent_call_t *call = calloc (1, sizeof *call);
    if (!call || !(call->id = strdup (args->sandbox_id))) {
        free (call);
        sbx_msg_destroy (&inner);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    call->server = self;
    call->rid = request->rid;
    sbx_debug ("rid=%llu sandbox=%s vm.agent %s", (unsigned long long) request->rid,
               args->sandbox_id, sbx_msg_type_name (inner->type));
    uint32_t timeout = request->timeout_ms ? request->timeout_ms : S_AGENT_DEFAULT;
    if (vmd_guest_agent (guest, &inner, timeout, s_on_agent_reply, call, &err)) {
        free (call->id);
        free (call);
        return s_error (request, &err);
    }
    return NULL;
}

typedef struct {
    vmd_server_t *server;
    uint64_t rid;
} s_port_call_t;

static sbx_msg_t *s_port_ok (uint64_t rid, const char *id, int host_port)
{
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_VM_PORT_OK);
    reply->rid = rid;
    sbx_vm_port_ok_t *ok = sbx_msg_vm_port_ok (reply);
    sbx_str_set (&ok->sandbox_id, id);
    if (host_port) {
        sbx_str_set (&ok->host, VMD_GUEST_FWD_HOST);
        ok->host_port = (uint64_t) host_port;
    }
    return reply;
}

static void s_on_port_done (vmd_guest_t *guest, sbx_code_t code, const char *message, int host_port,
                            void *arg)
{
    s_port_call_t *call = arg;
    vmd_server_t *self = call->server;
    //  The relay admits the new forward before anyone hears of it.
    vmd_relay_tick (self->relay, self->peer ? sbx_peer_ports_key (self->peer) : NULL, self->guests);
    sbx_msg_t *reply =
        code == SBX_OK ? s_port_ok (call->rid, vmd_guest_id (guest), host_port)
                       : sbx_msg_new_error (call->rid, code, "%s", message ? message : "failed");
    if (call->server->peer)
        sbx_peer_send (call->server->peer, &reply);
    sbx_msg_destroy (&reply);
    free (call);
}

static sbx_msg_t *s_on_port (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_port_t *args = sbx_msg_vm_port (request);
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    if (args->port < 1 || args->port > 65535)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "port must be between 1 and 65535");
    s_port_call_t *call = calloc (1, sizeof *call);
    if (!call)
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    *call = (s_port_call_t){self, request->rid};
    sbx_err_t err = {0};
    int host_port = 0;
    int rc = vmd_guest_port (guest, (int) args->port, args->remove, &host_port, s_on_port_done,
                             call, &err);
    if (rc == 0)
        return NULL;
    free (call);
    vmd_relay_tick (self->relay, self->peer ? sbx_peer_ports_key (self->peer) : NULL, self->guests);
    return rc < 0 ? s_error (request, &err) : s_port_ok (request->rid, args->sandbox_id, host_port);
}

//  vm.egress: a guest's new rules, in the kernel before the answer (new connections
//  follow them; established ones keep going).
static sbx_msg_t *s_on_egress (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_egress_t *args = sbx_msg_vm_egress (request);
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    sbx_err_t err = {0};
    if (vmd_egress_set (self->egress, args->sandbox_id, vmd_guest_uid (guest), &args->egress_allow,
                        &args->egress_deny, &err) == -1)
        return s_error (request, &err);
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_EGRESS_OK);
    sbx_str_set (&sbx_msg_vm_egress_ok (reply)->sandbox_id, args->sandbox_id);
    return reply;
}

//  vm.ship.offer: a stopped guest's files, for a move to another host, or a snapshot's,
//  for a copy there (vmd_ship).
static sbx_msg_t *s_on_ship_offer (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_ship_offer_t *args = sbx_msg_vm_ship_offer (request);
    sbx_err_t err = {0};
    //  A snapshot's copy: its files are the store's, whatever became of its sandbox.
    if (args->snapshot_id)
        return vmd_ship_offer (self->ship, request, NULL, &err) ? s_error (request, &err) : NULL;
    vmd_guest_t *guest = s_find (self, args->sandbox_id);
    if (!guest)
        return sbx_msg_new_error (request->rid, SBX_E_NOT_FOUND, "sandbox %s is not on this vmd",
                                  args->sandbox_id);
    if (vmd_guest_state (guest) != SBX_SANDBOX_STATE_STOPPED)
        return sbx_msg_new_error (request->rid, SBX_E_FAILED_PRECONDITION,
                                  "sandbox %s is %s here: only a stopped one moves",
                                  args->sandbox_id,
                                  sbx_sandbox_state_name (vmd_guest_state (guest)));
    vmd_ship_guest_t what = {.id = vmd_guest_id (guest),
                             .image_dir = vmd_guest_image (guest),
                             .hostname = vmd_guest_hostname (guest),
                             .type = vmd_guest_type (guest),
                             .no_network = vmd_guest_no_network (guest)};
    return vmd_ship_offer (self->ship, request, &what, &err) ? s_error (request, &err) : NULL;
}

//  vm.ship.take: a stopped guest from another host, here (or a snapshot's copy).
static sbx_msg_t *s_on_ship_take (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take (request);
    if (!args->snapshot_id && s_find (self, args->sandbox_id))
        return sbx_msg_new_error (request->rid, SBX_E_CONFLICT, "sandbox %s is on this vmd already",
                                  args->sandbox_id);
    sbx_err_t err = {0};
    return vmd_ship_take (self->ship, request, &err) ? s_error (request, &err) : NULL;
}

//  A move's step ended: its answer goes out; a guest taken over is made here first.
static void s_on_shipped (const sbx_msg_t *request, sbx_msg_t **reply_p, bool took, void *arg)
{
    vmd_server_t *self = arg;
    if (took) {
        sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take ((sbx_msg_t *) request);
        vmd_guest_t *guest = vmd_guest_new (&self->env, args->sandbox_id, args->offer->hostname,
                                            args->offer->type, args->offer->no_network);
        if (!guest || vmd_guest_taken (guest)) {
            vmd_guest_destroy (&guest);
            char *dir = zsys_sprintf ("%s/%s", self->vms_dir, args->sandbox_id);
            if (dir)
                sbx_files_remove_tree (dir);
            free (dir);
            sbx_msg_destroy (reply_p);
            *reply_p =
                sbx_msg_new_error (request->rid, SBX_E_INTERNAL,
                                   "sandbox %s arrived, but cannot be made here", args->sandbox_id);
        } else {
            //  A uid of its own, as a create gives: its QEMU takes the files at resume.
            s_assign_uid (self, guest);
            char *dir = zsys_sprintf ("%s/%s", self->vms_dir, args->sandbox_id);
            if (dir && vmd_guest_uid (guest) && chown (dir, vmd_guest_uid (guest), self->env.gid))
                sbx_warn ("sandbox=%s cannot hand %s to its uid: %s", args->sandbox_id, dir,
                          strerror (errno));
            free (dir);
            zhashx_insert (self->guests, args->sandbox_id, guest);
            s_update_use (self);
        }
    }
    if (self->peer)
        sbx_peer_send (self->peer, reply_p);
    sbx_msg_destroy (reply_p);
}

static sbx_msg_t *s_on_list (vmd_server_t *self, sbx_msg_t *request)
{
    sbx_msg_t *reply = sbx_msg_new_reply (request, SBX_MSG_VM_LIST_OK);
    sbx_vm_info_list_t *vms = &sbx_msg_vm_list_ok (reply)->vms;
    for (vmd_guest_t *g = zhashx_first (self->guests); g; g = zhashx_next (self->guests)) {
        sbx_vm_info_t *info = sbx_vm_info_list_append (vms);
        if (!info)
            break;
        sbx_str_set (&info->sandbox_id, vmd_guest_id (g));
        info->state = vmd_guest_state (g);
        info->pid = (uint64_t) vmd_guest_pid (g);
        sbx_str_set (&info->reason, vmd_guest_reason (g));
    }
    return reply;
}

void vmd_server_on_request (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    vmd_server_t *self = arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    switch (request->type) {
    case SBX_MSG_VM_CREATE:
        reply = s_on_create (self, request);
        break;
    case SBX_MSG_VM_STOP:
        reply = s_on_change (self, request, sbx_msg_vm_stop (request)->sandbox_id);
        break;
    case SBX_MSG_VM_RESUME:
        reply = s_on_change (self, request, sbx_msg_vm_resume (request)->sandbox_id);
        break;
    case SBX_MSG_VM_DELETE:
        reply = s_on_change (self, request, sbx_msg_vm_delete (request)->sandbox_id);
        break;
    case SBX_MSG_VM_AGENT:
        reply = s_on_agent (self, request);
        break;
    case SBX_MSG_VM_LIST:
        reply = s_on_list (self, request);
        break;
    case SBX_MSG_VM_PORT:
        reply = s_on_port (self, request);
        break;
    case SBX_MSG_VM_SNAPSHOT:
        reply = s_on_snapshot (self, request);
        break;
    case SBX_MSG_VM_METRICS:
        reply = vmd_sampler_answer (self->sampler, request);
        break;
    case SBX_MSG_VM_EGRESS:
        reply = s_on_egress (self, request);
        break;
    case SBX_MSG_VM_SHIP_OFFER:
        reply = s_on_ship_offer (self, request);
        break;
    case SBX_MSG_VM_SHIP_TAKE:
        reply = s_on_ship_take (self, request);
        break;
    default:
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "vmd does not serve %s",
                                   sbx_msg_type_name (request->type));
        break;
    }
    if (reply)
        sbx_peer_send (peer, &reply);
    sbx_msg_destroy (&reply);
}

//  --------------------------------------------------------------------------
//  Construction

static void s_guest_destructor (void **item)
{
    vmd_guest_destroy ((vmd_guest_t **) item);
}

static void s_free_destructor (void **item)
{
    free (*item);
    *item = NULL;
}

static void *s_strdup (const void *item)
{
    return strdup ((const char *) item);
}

//  Guests reach the public internet only (vmd_firewall), or, when the operator sets
//  vmd.network = open, whatever the host reaches. The policy keys on the QEMU user's
//  uid, so it needs a user of QEMU's own: vmd refuses to start rather than run guests
//  unconfined. The policy follows the host's networks and resolver from the loop.
static int s_network_setup (vmd_server_t *self)
{
    sbx_config_t *config = self->config;
    const char *network = sbx_config_get (config, "vmd.network", "isolated");
    if (streq (network, "open")) {
        sbx_warn ("vmd.network = open: guests reach the host's services and private networks");
        return 0;
    }
    if (!streq (network, "isolated")) {
        sbx_error ("vmd.network is \"%s\": use isolated (the default) or open", network);
        return -1;
    }
    uid_t uid = 0;
    int drops = vmd_qemu_user (sbx_config_get (config, "vmd.qemu_user", NULL), &uid);
    struct passwd *pw = drops == 1 ? getpwuid (uid) : NULL;
    if (drops != 1 || uid == 0 || !pw || streq (pw->pw_name, "nobody")) {
        sbx_error ("vmd.network = isolated needs vmd to run as root and QEMU to run as a user "
                   "of its own: create it (useradd --system --no-create-home sbx-qemu, as "
                   "scripts/install-deps.sh does) or name one with vmd.qemu_user; or set "
                   "vmd.network = open to run guests without network isolation");
        return -1;
    }
    self->firewall =
        vmd_firewall_new (self->loop, sbx_config_get (config, "vmd.firewall_table", NULL), uid,
                          self->env.uid_first, self->env.uid_count, NULL, NULL);
    return self->firewall ? 0 : -1;
}

static bool s_has_guest (const char *id, void *arg)
{
    vmd_server_t *self = arg;
    return zhashx_lookup (self->guests, id) != NULL;
}

vmd_server_t *vmd_server_new (sbx_config_t *config, zloop_t *loop)
{
    vmd_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->loop = loop;
    self->capacity = sbx_config_get_uint (config, "vmd.capacity", 8);
    self->wake_fd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->guests = zhashx_new ();
    self->failed_unsent = zhashx_new ();
    self->ops = zhashx_new ();
    self->cold = zlistx_new ();
    self->vms_dir = sbx_config_path (config, "vms");
    self->image_dir = s_image_setup (config);
    if (self->wake_fd < 0 || !self->guests || !self->failed_unsent || !self->ops || !self->cold ||
        !self->vms_dir || !self->image_dir || s_type_images_setup (self)) {
        vmd_server_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->guests, s_guest_destructor);
    zhashx_set_destructor (self->failed_unsent, s_free_destructor);
    zhashx_set_duplicator (self->failed_unsent, s_strdup);
    zhashx_set_destructor (self->ops, s_free_destructor);
    zlistx_set_duplicator (self->cold, s_strdup);
    zlistx_set_destructor (self->cold, s_free_destructor);
    //  QEMU may run as another user (vmd_qemu): it must reach its sandbox directory
    //  and the base image through ours (search only: nobody lists them).
    if (mkdir (self->vms_dir, 0711) == -1 && errno != EEXIST) {
        sbx_error ("cannot make %s: %s", self->vms_dir, strerror (errno));
        vmd_server_destroy (&self);
        return NULL;
    }
    if (geteuid () == 0) {
        struct stat st;
        const char *data = sbx_config_data_dir (config);
        if (stat (data, &st) == 0 && !(st.st_mode & S_IXOTH))
            chmod (data, (st.st_mode & 07777) | 0011);
        chmod (self->vms_dir, 0711);
    }
    //  Found once now (a short popen), not in the loop later: snapshots record it.
    sbx_info ("QEMU here: %s", *vmd_qemu_version () ? vmd_qemu_version () : "unknown");
    //  Each guest's QEMU a uid of its own (with the QEMU user's group), when vmd is root
    //  and drops to a user: guests can't reach each other's files, and the firewall can
    //  tell them apart.
    gid_t gid = 0;
    uid_t qemu_uid = 0;
    const char *qemu_user = sbx_config_get (config, "vmd.qemu_user", NULL);
    if (geteuid () == 0 && vmd_qemu_user (qemu_user, &qemu_uid) == 1 &&
        vmd_qemu_group (qemu_user, &gid) == 0) {
        self->env.uid_first =
            (uid_t) sbx_config_get_uint (config, "vmd.guest_uid_first", VMD_SERVER_GUEST_UID_FIRST);
        self->env.uid_count = (uint32_t) sbx_config_get_uint (config, "vmd.guest_uid_count", 65536);
        self->env.gid = gid;
        if (self->env.uid_count &&
            (self->env.uid_first < 65536 ||
             (uint64_t) self->env.uid_first + self->env.uid_count > 0xFFFFFFFEull)) {
            sbx_error ("vmd.guest_uid_first %u with vmd.guest_uid_count %u: the range must lie "
                       "above 65535 and below 4294967294 (or set the count to 0)",
                       (unsigned) self->env.uid_first, (unsigned) self->env.uid_count);
            vmd_server_destroy (&self);
            return NULL;
        }
    }
    if (s_network_setup (self) == -1) {
        vmd_server_destroy (&self);
        return NULL;
    }
    uid_t uid_first = self->env.uid_first;
    uint32_t uid_count = self->env.uid_count;
    self->env = (vmd_guest_env_t){
        .uid_first = uid_first,
        .uid_count = uid_count,
        .gid = gid,
        .loop = loop,
        .vms_dir = self->vms_dir,
        .image_dir = self->image_dir,
        .qemu_user = sbx_config_get (config, "vmd.qemu_user", NULL),
        .restore_ms =
            (uint32_t) sbx_config_get_uint (config, "vmd.restore_timeout_ms", VMD_GUEST_RESTORE_MS),
        .frame_timeout_ms = (uint32_t) sbx_config_get_uint (config, "vmd.agent_frame_timeout_ms",
                                                            VMD_AGENTLINK_FRAME_TIMEOUT),
        .done = s_on_done,
        .failed = s_on_failed,
        .wake = s_wake,
        .arg = self};
    for (int type = 1; type < VMD_GUEST_TYPES; type++)
        self->env.type_image[type] = self->type_image[type];
    //  The guests a previous vmd left: re-adopt, or report.
    DIR *dir = opendir (self->vms_dir);
    struct dirent *entry;
    while (dir && (entry = readdir (dir))) {
        if (entry->d_name[0] == '.')
            continue;
        const char *dot = strrchr (entry->d_name, '.');
        if (dot && streq (dot, ".incoming")) {
            //  A take cut by the end of the vmd before: its broker asks again.
            char *stale = zsys_sprintf ("%s/%s", self->vms_dir, entry->d_name);
            if (stale)
                sbx_files_remove_tree (stale);
            free (stale);
            continue;
        }
        vmd_guest_t *guest = vmd_guest_load (&self->env, entry->d_name);
        if (!guest)
            continue;
        if (vmd_guest_state (guest) == SBX_SANDBOX_STATE_ERROR)
            zhashx_update (
                self->failed_unsent, entry->d_name,
                (void *) (vmd_guest_reason (guest) ? vmd_guest_reason (guest) : "in error"));
        zhashx_insert (self->guests, entry->d_name, guest);
    }
    if (dir)
        closedir (dir);
    sbx_info ("%zu guests found in %s; image %s", zhashx_size (self->guests), self->vms_dir,
              self->image_dir);
    //  Kept apart from the guests' directories, which their QEMU's uid owns.
    char *egress_dir = sbx_config_path (config, "egress");
    self->egress =
        egress_dir
            ? vmd_egress_new (egress_dir, sbx_config_get (config, "vmd.egress_table", NULL), NULL)
            : NULL;
    free (egress_dir);
    if (!self->egress) {
        sbx_error ("cannot keep the guests' egress rules (see above): vmd does not start");
        vmd_server_destroy (&self);
        return NULL;
    }
    vmd_egress_prune (self->egress, s_has_guest, self);
    if (vmd_egress_set_dns (self->egress, loop,
                            sbx_config_get (config, "vmd.egress_resolver", NULL)) == -1) {
        sbx_error ("cannot enforce the domain names of the guests' egress rules (see above): vmd "
                   "does not start");
        vmd_server_destroy (&self);
        return NULL;
    }
    self->sampler =
        vmd_sampler_new (loop, self->guests, self->vms_dir,
                         (uint32_t) sbx_config_get_uint (config, "vmd.metrics_interval_ms", 5000));
    if (!self->sampler) {
        vmd_server_destroy (&self);
        return NULL;
    }
    self->ship = vmd_ship_new (config, loop, self->vms_dir, &self->env, s_on_shipped, self);
    self->relay = vmd_relay_new (config);
    if (!self->ship || !self->relay) {
        vmd_server_destroy (&self);
        return NULL;
    }
    self->sweep = zloop_timer (loop, S_SWEEP_MS, 0, s_on_sweep, self);
    zmq_pollitem_t item = {NULL, self->wake_fd, ZMQ_POLLIN, 0};
    zloop_poller (loop, &item, s_on_wake, self);
    //  Templates are made in the background; creates boot cold until they are ready.
    self->templates = vmd_template_new (
        loop, sbx_config_data_dir (config), sbx_config_get (config, "instance", NULL), &self->env,
        self->env.qemu_user, sbx_config_get (config, "vmd.templates", "small"), s_wake, self);
    return self;
}

void vmd_server_destroy (vmd_server_t **self_p)
{
    vmd_server_t *self = *self_p;
    if (!self)
        return;
    if (self->sweep > 0)
        zloop_timer_end (self->loop, self->sweep);
    vmd_ship_destroy (&self->ship);
    vmd_relay_destroy (&self->relay);
    vmd_template_destroy (&self->templates);
    vmd_firewall_destroy (&self->firewall);
    vmd_egress_destroy (&self->egress);
    zhashx_destroy (&self->guests);
    vmd_sampler_destroy (&self->sampler); //  after the guests: their asks point into it
    if (self->wake_fd >= 0) {
        zmq_pollitem_t item = {NULL, self->wake_fd, ZMQ_POLLIN, 0};
        zloop_poller_end (self->loop, &item);
        close (self->wake_fd);
    }
    zhashx_destroy (&self->failed_unsent);
    zhashx_destroy (&self->ops);
    zlistx_destroy (&self->cold);
    free (self->vms_dir);
    free (self->image_dir);
    for (int type = 0; type < VMD_GUEST_TYPES; type++)
        free (self->type_image[type]);
    free (self);
    *self_p = NULL;
}

void vmd_server_attach (vmd_server_t *self, sbx_peer_t *peer)
{
    self->peer = peer;
    s_update_use (self);
}

uint64_t vmd_server_capacity (vmd_server_t *self)
{
    return self->capacity;
}
