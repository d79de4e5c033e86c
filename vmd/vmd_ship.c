/*  vmd_ship - see vmd_ship.h */
#include "vmd_ship.h"
#include "sbx_curve.h"
#include "sbx_files.h"
#include "sbx_ship.h"
#include "vmd_guest.h"
#include "vmd_qemu.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_OFFER_TTL_MS (10 * 60 * 1000) //  the taker starts at once; this bounds a stray one
#define S_TICK_MS      100

typedef enum { S_OFFER, S_TAKE } s_kind_t;

typedef struct _vmd_ship_t vmd_ship_t;

typedef struct {
    vmd_ship_t *ship;
    s_kind_t kind;
    bool snapshot; //  a snapshot's files (snapshots/<id>), not a guest's
    char *id;
    sbx_msg_t *request; //  a copy, for the answer's rid and what it asked
    pid_t pid;          //  an offer's qemu-img, until it exits
    sbx_ship_fetch_t *fetch;
    uint64_t started_mono;
    uint64_t bytes;
    vmd_ship_guest_t guest; //  an offer's: strings owned
    char *ticket;           //  an offer's, once offered
} s_job_t;

struct _vmd_ship_t {
    sbx_config_t *config;
    zloop_t *loop;
    char *data_dir; //  the ship server's root: offers name vms/… and ship/… below it
    char *vms_dir;
    //  The images this host's guests boot, per sandbox type (borrowed: the owner's): a
    //  guest taken lands on the image its type boots here.
    const vmd_guest_env_t *images;
    char *address;
    sbx_ship_server_t *server; //  NULL without vmd.ship
    char *public_key;
    zlistx_t *jobs;
    zhashx_t *offers;  //  sandbox or snapshot id → the ticket its files are offered to
    zhashx_t *expires; //  snapshot id → when its offer ends (mono ms, as a string)
    int timer;
    vmd_ship_done_fn *done;
    void *arg;
};

static void s_job_destroy (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (!job)
        return;
    if (job->pid > 0) {
        kill (job->pid, SIGKILL);
        waitpid (job->pid, NULL, 0);
    }
    sbx_ship_fetch_destroy (&job->fetch);
    sbx_msg_destroy (&job->request);
    free (job->id);
    free ((char *) job->guest.image_dir);
    free ((char *) job->guest.hostname);
    if (job->ticket)
        sbx_secret_wipe (job->ticket);
    free (job->ticket);
    free (job);
    *job_p = NULL;
}

static char *s_dir (vmd_ship_t *self, const char *id, const char *below)
{
    return below ? zsys_sprintf ("%s/%s/%s", self->vms_dir, id, below)
                 : zsys_sprintf ("%s/%s", self->vms_dir, id);
}

//  A snapshot's staging for an offer, or an incoming copy: <data>/ship/<id>[suffix].
static char *s_staging (vmd_ship_t *self, const char *id, const char *suffix)
{
    return zsys_sprintf ("%s/ship/%s%s", self->data_dir, id, suffix ? suffix : "");
}

//  The job is over: its answer goes to the owner, the job away.
static void s_finish (vmd_ship_t *self, s_job_t *job, sbx_msg_t **reply_p, bool took)
{
    void *handle = zlistx_find (self->jobs, job);
    if (handle)
        zlistx_detach (self->jobs, handle);
    if (job->fetch)
        zloop_reader_end (self->loop, sbx_ship_fetch_sock (job->fetch));
    self->done (job->request, reply_p, took, self->arg);
    sbx_msg_destroy (reply_p);
    s_job_destroy (&job);
}

static void s_fail (vmd_ship_t *self, s_job_t *job, sbx_code_t code, const char *fmt, ...)
{
    char why[800];
    va_list args;
    va_start (args, fmt);
    vsnprintf (why, sizeof why, fmt, args);
    va_end (args);
    sbx_warn ("%s=%s %s failed: %s", job->snapshot ? "snapshot" : "sandbox", job->id,
              job->kind == S_OFFER ? "ship offer" : "take", why);
    if (job->kind == S_TAKE) {
        char *incoming = job->snapshot ? s_staging (self, job->id, ".incoming")
                                       : zsys_sprintf ("%s/%s.incoming", self->vms_dir, job->id);
        if (job->fetch) {
            zloop_reader_end (self->loop, sbx_ship_fetch_sock (job->fetch));
            sbx_ship_fetch_destroy (&job->fetch);
        }
        if (incoming)
            sbx_files_remove_tree (incoming);
        free (incoming);
    } else {
        char *ship =
            job->snapshot ? s_staging (self, job->id, NULL) : s_dir (self, job->id, "ship");
        if (ship)
            sbx_files_remove_tree (ship);
        free (ship);
    }
    sbx_msg_t *reply = sbx_msg_new_error (job->request->rid, code, "%s", why);
    s_finish (self, job, &reply, false);
}

//  --------------------------------------------------------------------------
//  Offers

static void s_offered (vmd_ship_t *self, s_job_t *job)
{
    char *overlay = job->snapshot ? zsys_sprintf ("ship/%s/disk.qcow2", job->id)
                                  : zsys_sprintf ("vms/%s/ship/overlay.qcow2", job->id);
    char *memory = job->snapshot ? zsys_sprintf ("ship/%s/memory.state", job->id)
                                 : zsys_sprintf ("vms/%s/ship/memory.state", job->id);
    const char *paths[] = {overlay, memory};
    const sbx_vm_ship_offer_t *args = sbx_msg_vm_ship_offer (job->request);
    uint64_t bytes = 0;
    for (int i = 0; i < 2; i++) {
        char *full = paths[i] ? zsys_sprintf ("%s/%s", self->data_dir, paths[i]) : NULL;
        struct stat st;
        if (full && stat (full, &st) == 0)
            bytes += (uint64_t) st.st_size;
        free (full);
    }
    if (!overlay || !memory || !(job->ticket = strdup (args->ticket)) ||
        sbx_ship_server_offer (self->server, job->ticket, paths, 2, S_OFFER_TTL_MS)) {
        free (overlay);
        free (memory);
        s_fail (self, job, SBX_E_INTERNAL, "cannot offer the files of sandbox %s", job->id);
        return;
    }
    sbx_msg_t *reply = sbx_msg_new_reply (job->request, SBX_MSG_VM_SHIP_OFFER_OK);
    sbx_vm_ship_offer_ok_t *ok = sbx_msg_vm_ship_offer_ok (reply);
    sbx_ship_offer_t *offer = calloc (1, sizeof *offer);
    ok->offer = offer;
    char endpoint[300];
    snprintf (endpoint, sizeof endpoint, "tcp://%s", self->address);
    const char *image = strrchr (job->guest.image_dir, '/');
    if (!offer || sbx_str_set (&ok->sandbox_id, args->sandbox_id) ||
        sbx_str_set (&offer->endpoint, endpoint) ||
        sbx_str_set (&offer->public_key, self->public_key) ||
        sbx_strlist_append (&offer->files, overlay) || sbx_strlist_append (&offer->files, memory) ||
        sbx_str_set (&offer->image, image ? image + 1 : job->guest.image_dir) ||
        sbx_str_set (&offer->hostname, job->guest.hostname)) {
        sbx_msg_destroy (&reply);
        free (overlay);
        free (memory);
        s_fail (self, job, SBX_E_INTERNAL, "out of memory");
        return;
    }
    offer->type = job->guest.type;
    offer->no_network = job->guest.no_network;
    offer->bytes = bytes;
    free (overlay);
    free (memory);
    sbx_info ("%s=%s offered %s: %llu bytes, disk flattened in %llu ms",
              job->snapshot ? "snapshot" : "sandbox", job->id,
              job->snapshot ? "for a copy on another host" : "for a move",
              (unsigned long long) bytes,
              (unsigned long long) (sbx_clock_mono_ms () - job->started_mono));
    //  A snapshot's offer ends on its own (nothing is deleted here when it landed).
    if (job->snapshot) {
        char *until =
            zsys_sprintf ("%llu", (unsigned long long) (sbx_clock_mono_ms () + S_OFFER_TTL_MS));
        if (until)
            zhashx_update (self->expires, job->id, until);
        free (until);
    }
    //  The job ends; its ticket stays offered until vmd_ship_forget or the TTL.
    char *previous = zhashx_lookup (self->offers, job->id);
    if (previous)
        sbx_ship_server_withdraw (self->server, previous);
    zhashx_update (self->offers, job->id, job->ticket);
    job->ticket = NULL;
    s_finish (self, job, &reply, false);
}

//  Starts an offer's qemu-img: the disk's copy, rebased onto the image alone (what its
//  template's, snapshot's or parent's layers held is written into it: those are this
//  host's files, not the other's). A child, watched by the timer: it reads the whole disk.
static pid_t s_flatten (const char *disk, const char *copy, const char *base, const char *log)
{
    char *argv[] = {"sh",
                    "-c",
                    "cp --reflink=auto -- \"$1\" \"$2\" && exec qemu-img rebase -q -f qcow2 "
                    "-b \"$3\" -F raw \"$2\"",
                    "sh",
                    (char *) disk,
                    (char *) copy,
                    (char *) base,
                    NULL};
    return vmd_qemu_helper_spawn (argv, log);
}

static bool s_busy (vmd_ship_t *self, const char *id)
{
    for (void *h = zlistx_first (self->jobs); h; h = zlistx_next (self->jobs))
        if (streq (((s_job_t *) h)->id, id))
            return true;
    return false;
}

static s_job_t *s_job_add (vmd_ship_t *self, s_job_t *job, s_kind_t kind, bool snapshot,
                           const char *id, const sbx_msg_t *request)
{
    job->ship = self;
    job->kind = kind;
    job->snapshot = snapshot;
    job->id = strdup (id);
    job->request = sbx_msg_dup ((sbx_msg_t *) request);
    job->started_mono = sbx_clock_mono_ms ();
    zlistx_add_end (self->jobs, job);
    return job;
}

//  An offer's staging: ship/ made anew, the memory state linked into it (from → to),
//  the disk's flattened copy started (job->pid). 0, or -1 and err (what names it).
static int s_stage (s_job_t *job, const char *ship, const char *from, const char *to,
                    const char *disk, const char *copy, const char *base, const char *log,
                    const char *what, sbx_err_t *err)
{
    if (sbx_files_remove_tree (ship) || mkdir (ship, 0700) == -1)
        return sbx_err_set (err, SBX_E_INTERNAL, "cannot make %s: %s", ship, strerror (errno));
    if (link (from, to) == -1)
        return sbx_err_set (err, SBX_E_INTERNAL, "the memory state of %s: %s", what,
                            strerror (errno));
    if ((job->pid = s_flatten (disk, copy, base, log)) < 0)
        return sbx_err_set (err, SBX_E_INTERNAL, "cannot start qemu-img");
    return 0;
}

//  vm.ship.offer of a snapshot: snapshots/<id>/ flattened into ship/<id>/.
static int s_offer_snapshot (vmd_ship_t *self, const sbx_msg_t *request, sbx_err_t *err)
{
    const sbx_vm_ship_offer_t *args = sbx_msg_vm_ship_offer ((sbx_msg_t *) request);
    const char *id = args->snapshot_id;
    if (!vmd_guest_id_valid (id) || strncmp (id, "snap_", 5) != 0)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "not a snapshot id");
    if (s_busy (self, id))
        return sbx_err_set (err, SBX_E_CONFLICT, "snapshot %s is being shipped already", id);
    char *dir = zsys_sprintf ("%s/snapshots/%s", self->data_dir, id);
    char *ship = s_staging (self, id, NULL);
    char *disk = dir ? zsys_sprintf ("%s/disk.qcow2", dir) : NULL;
    char *from = dir ? zsys_sprintf ("%s/memory.state", dir) : NULL;
    char *copy = ship ? zsys_sprintf ("%s/disk.qcow2", ship) : NULL;
    char *to = ship ? zsys_sprintf ("%s/memory.state", ship) : NULL;
    char *log = ship ? zsys_sprintf ("%s/qemu-img.log", ship) : NULL;
    //  The image its type boots here: what the disk stands on, at the bottom.
    sbx_sandbox_type_t type = args->type ? args->type : SBX_SANDBOX_TYPE_SMALL;
    const char *image_dir = vmd_guest_env_image (self->images, type);
    char *base = zsys_sprintf ("%s/rootfs.ext4", image_dir);
    s_job_t *job = calloc (1, sizeof *job);
    struct stat st;
    int rc = -1;
    if (!dir || !ship || !disk || !from || !copy || !to || !log || !base || !job)
        sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    else if (stat (disk, &st) == -1 || stat (from, &st) == -1)
        sbx_err_set (err, SBX_E_NOT_FOUND, "snapshot %s has no whole copy on this host", id);
    else
        rc = s_stage (job, ship, from, to, disk, copy, base, log, id, err);
    if (rc == 0) {
        s_job_add (self, job, S_OFFER, true, id, request);
        //  What the offer answers with: the image it stands on now, a snapshot's name.
        job->guest.id = job->id;
        job->guest.image_dir = strdup (image_dir);
        job->guest.hostname = strdup (id);
        job->guest.type = type;
        job = NULL;
    } else if (ship)
        sbx_files_remove_tree (ship);
    s_job_destroy (&job);
    free (dir);
    free (ship);
    free (disk);
    free (from);
    free (copy);
    free (to);
    free (log);
    free (base);
    return rc;
}

int vmd_ship_offer (vmd_ship_t *self, const sbx_msg_t *request, const vmd_ship_guest_t *guest,
                    sbx_err_t *err)
{
    const sbx_vm_ship_offer_t *args = sbx_msg_vm_ship_offer ((sbx_msg_t *) request);
    if (!self->server)
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "vmd.ship is not set on this host: set it to HOST:PORT, an address "
                            "the other vmd hosts reach, to move sandboxes off it");
    if (!args->ticket || strlen (args->ticket) < SBX_SHIP_TICKET_MIN)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "the ticket is too short");
    if (args->snapshot_id)
        return s_offer_snapshot (self, request, err);
    if (s_busy (self, guest->id))
        return sbx_err_set (err, SBX_E_CONFLICT, "sandbox %s is being shipped already", guest->id);
    char *dir = s_dir (self, guest->id, NULL), *ship = s_dir (self, guest->id, "ship");
    char *from = s_dir (self, guest->id, "memory.state"),
         *to = s_dir (self, guest->id, "ship/memory.state");
    char *overlay = s_dir (self, guest->id, "overlay.qcow2"),
         *copy = s_dir (self, guest->id, "ship/overlay.qcow2");
    char *base = zsys_sprintf ("%s/rootfs.ext4", guest->image_dir);
    char *log = s_dir (self, guest->id, "ship/qemu-img.log");
    s_job_t *job = calloc (1, sizeof *job);
    int rc = -1;
    if (!dir || !ship || !from || !to || !overlay || !copy || !base || !log || !job)
        sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    else
        rc = s_stage (job, ship, from, to, overlay, copy, base, log, guest->id, err);
    if (rc == 0) {
        s_job_add (self, job, S_OFFER, false, guest->id, request);
        job->guest = *guest;
        job->guest.id = job->id;
        job->guest.image_dir = strdup (guest->image_dir);
        job->guest.hostname = strdup (guest->hostname ? guest->hostname : guest->id);
        job = NULL;
    } else if (ship)
        sbx_files_remove_tree (ship);
    s_job_destroy (&job);
    free (dir);
    free (ship);
    free (from);
    free (to);
    free (overlay);
    free (copy);
    free (base);
    free (log);
    return rc;
}

//  --------------------------------------------------------------------------
//  Takes

static int s_on_fetch (zloop_t *loop, zsock_t *sock, void *arg);

//  A snapshot's copy gets the modes of one saved here (vmd_guest's capture): the files
//  0640 and the QEMU group's, read by the clones' QEMUs as a backing file; the directory
//  0711. 0, or -1 with why.
static int s_store_modes (vmd_ship_t *self, const char *ship, char *why, size_t size)
{
    gid_t gid;
    bool share = vmd_qemu_group (sbx_config_get (self->config, "vmd.qemu_user", NULL), &gid) == 0;
    const char *names[] = {"disk.qcow2", "memory.state"};
    for (int i = 0; i < 2; i++) {
        char *path = zsys_sprintf ("%s/%s", ship, names[i]);
        bool ok = path && chmod (path, 0640) == 0 && (!share || chown (path, 0, gid) == 0);
        free (path);
        if (!ok) {
            snprintf (why, size, "cannot give %s its modes: %s", names[i], strerror (errno));
            return -1;
        }
    }
    if (chmod (ship, 0711) == -1) {
        snprintf (why, size, "cannot give %s its modes: %s", ship, strerror (errno));
        return -1;
    }
    return 0;
}

//  The files are here: the overlay stands on this host's image, the directory is the
//  guest's. 0, or -1 with why.
static int s_land (vmd_ship_t *self, s_job_t *job, char *why, size_t size)
{
    char *incoming = job->snapshot ? s_staging (self, job->id, ".incoming")
                                   : zsys_sprintf ("%s/%s.incoming", self->vms_dir, job->id);
    char *ship = !incoming       ? NULL
                 : job->snapshot ? zsys_sprintf ("%s/ship/%s", incoming, job->id)
                                 : zsys_sprintf ("%s/vms/%s/ship", incoming, job->id);
    char *overlay =
        ship ? zsys_sprintf ("%s/%s", ship, job->snapshot ? "disk.qcow2" : "overlay.qcow2") : NULL;
    //  The image its type boots here (the offer's image: vmd_ship_take checked).
    char *base = zsys_sprintf (
        "%s/rootfs.ext4",
        vmd_guest_env_image (self->images, sbx_msg_vm_ship_take (job->request)->offer->type));
    char *dir = job->snapshot ? zsys_sprintf ("%s/snapshots/%s", self->data_dir, job->id)
                              : s_dir (self, job->id, NULL);
    char *log = ship ? zsys_sprintf ("%s/qemu-img.log", ship) : NULL;
    int rc = -1;
    if (!incoming || !ship || !overlay || !base || !dir || !log)
        snprintf (why, size, "out of memory");
    else {
        //  Metadata only (≈ 20 ms): the contents are the image's on both hosts.
        char *argv[] = {"qemu-img", "rebase", "-q", "-u",  "-f",    "qcow2",
                        "-b",       base,     "-F", "raw", overlay, NULL};
        pid_t pid = vmd_qemu_helper_spawn (argv, log);
        int status = -1;
        while (pid > 0 && waitpid (pid, &status, 0) == -1 && errno == EINTR)
            ;
        if (pid < 0 || !WIFEXITED (status) || WEXITSTATUS (status) != 0)
            snprintf (why, size, "qemu-img rebase of the fetched disk failed (see %s)", log);
        else if (unlink (log), job->snapshot && s_store_modes (self, ship, why, size))
            ; //  why says
        else if (rename (ship, dir) == -1)
            snprintf (why, size, "cannot make %s: %s", dir, strerror (errno));
        else
            rc = 0;
    }
    if (incoming)
        sbx_files_remove_tree (incoming);
    free (incoming);
    free (ship);
    free (overlay);
    free (base);
    free (dir);
    free (log);
    return rc;
}

static int s_on_fetch (zloop_t *loop, zsock_t *sock, void *arg)
{
    (void) loop;
    (void) sock;
    s_job_t *job = arg;
    vmd_ship_t *self = job->ship;
    uint64_t done = 0, total = 0;
    char *reason = NULL;
    int event = sbx_ship_fetch_recv (job->fetch, &done, &total, &reason);
    if (event < 0)
        ; //  nothing yet
    else if (event == SBX_SHIP_PROGRESS)
        job->bytes = total;
    else if (event == SBX_SHIP_DONE) {
        char why[600];
        if (s_land (self, job, why, sizeof why))
            s_fail (self, job, SBX_E_INTERNAL, "%s", why);
        else {
            uint64_t ms = sbx_clock_mono_ms () - job->started_mono;
            const sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take (job->request);
            sbx_info ("%s=%s taken from %s: %llu bytes in %llu ms",
                      job->snapshot ? "snapshot" : "sandbox", job->id, args->from,
                      (unsigned long long) job->bytes, (unsigned long long) ms);
            sbx_msg_t *reply = sbx_msg_new_reply (job->request, SBX_MSG_VM_SHIP_TAKE_OK);
            sbx_str_set (&sbx_msg_vm_ship_take_ok (reply)->sandbox_id, args->sandbox_id);
            if (job->snapshot)
                sbx_str_set (&sbx_msg_vm_ship_take_ok (reply)->snapshot_id, job->id);
            sbx_msg_vm_ship_take_ok (reply)->bytes = job->bytes;
            sbx_msg_vm_ship_take_ok (reply)->ms = ms;
            s_finish (self, job, &reply, !job->snapshot);
        }
    } else
        s_fail (self, job, SBX_E_UNAVAILABLE, "fetching its files from vmd %s failed: %s",
                sbx_msg_vm_ship_take (job->request)->from, reason ? reason : "?");
    free (reason);
    return 0;
}

int vmd_ship_take (vmd_ship_t *self, const sbx_msg_t *request, sbx_err_t *err)
{
    sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take ((sbx_msg_t *) request);
    const sbx_ship_offer_t *offer = args->offer;
    bool snapshot = args->snapshot_id != NULL;
    const char *id = snapshot ? args->snapshot_id : args->sandbox_id;
    if (!vmd_guest_id_valid (args->sandbox_id))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "not a sandbox id");
    if (snapshot && (!vmd_guest_id_valid (id) || strncmp (id, "snap_", 5) != 0))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "not a snapshot id");
    //  Its type's image here (image_dir, or image_dir.TYPE), by the hash that names it.
    const char *image_dir = vmd_guest_env_image (self->images, offer->type);
    const char *image = strrchr (image_dir, '/') ? strrchr (image_dir, '/') + 1 : image_dir;
    if (!offer->image || !streq (offer->image, image))
        return sbx_err_set (
            err, SBX_E_FAILED_PRECONDITION,
            "%s %s stands on image %s; its type (%s) boots image %s on this host "
            "(the same build of each type's guest image on every vmd host)",
            snapshot ? "snapshot" : "sandbox", id, offer->image ? offer->image : "?",
            sbx_sandbox_type_name (offer->type) ? sbx_sandbox_type_name (offer->type) : "none",
            image);
    //  Exactly its two files, under its own ship directory: nothing else lands here.
    char prefix[128];
    snprintf (prefix, sizeof prefix, snapshot ? "ship/%s/" : "vms/%s/ship/", id);
    const char *disk = snapshot ? "disk.qcow2" : "overlay.qcow2";
    bool files = offer->files.count == 2;
    for (size_t i = 0; files && i < offer->files.count; i++) {
        const char *path = offer->files.items[i];
        files = sbx_ship_path_valid (path) && strncmp (path, prefix, strlen (prefix)) == 0 &&
                (streq (path + strlen (prefix), disk) ||
                 streq (path + strlen (prefix), "memory.state"));
    }
    if (!files)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                            "the offer must name %s%s and %smemory.state", prefix, disk, prefix);
    if (s_busy (self, id))
        return sbx_err_set (err, SBX_E_CONFLICT, "%s %s is being shipped already",
                            snapshot ? "snapshot" : "sandbox", id);
    char *dir =
        snapshot ? zsys_sprintf ("%s/snapshots/%s", self->data_dir, id) : s_dir (self, id, NULL);
    char *incoming = snapshot ? s_staging (self, id, ".incoming")
                              : zsys_sprintf ("%s/%s.incoming", self->vms_dir, id);
    struct stat st;
    int rc = -1;
    s_job_t *job = calloc (1, sizeof *job);
    if (!dir || !incoming || !job)
        sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    else if (lstat (dir, &st) == 0)
        sbx_err_set (err, SBX_E_CONFLICT, "%s %s has a directory here already",
                     snapshot ? "snapshot" : "sandbox", id);
    else if (sbx_files_remove_tree (incoming) || mkdir (incoming, 0700) == -1)
        sbx_err_set (err, SBX_E_INTERNAL, "cannot make %s: %s", incoming, strerror (errno));
    else {
        const char *paths[] = {offer->files.items[0], offer->files.items[1]};
        job->fetch = sbx_ship_fetch_new (offer->endpoint, offer->public_key, NULL, args->ticket,
                                         paths, 2, incoming);
        if (!job->fetch) {
            sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                         "cannot fetch from %s (an endpoint, a public key and a ticket)",
                         offer->endpoint);
            sbx_files_remove_tree (incoming);
        } else
            rc = 0;
    }
    if (rc == 0) {
        s_job_add (self, job, S_TAKE, snapshot, id, request);
        zloop_reader (self->loop, sbx_ship_fetch_sock (job->fetch), s_on_fetch, job);
        sbx_info ("%s=%s taking it from vmd %s (%llu bytes)", snapshot ? "snapshot" : "sandbox",
                  job->id, args->from, (unsigned long long) offer->bytes);
        job = NULL;
    }
    s_job_destroy (&job);
    free (dir);
    free (incoming);
    return rc;
}

void vmd_ship_forget (vmd_ship_t *self, const char *id)
{
    char *ticket = zhashx_lookup (self->offers, id);
    if (!ticket)
        return;
    if (self->server)
        sbx_ship_server_withdraw (self->server, ticket);
    zhashx_delete (self->offers, id);
    bool snapshot = zhashx_lookup (self->expires, id) != NULL;
    zhashx_delete (self->expires, id);
    char *ship = snapshot ? s_staging (self, id, NULL) : s_dir (self, id, "ship");
    if (ship)
        sbx_files_remove_tree (ship);
    free (ship);
}

//  --------------------------------------------------------------------------
//  The timer: offers' children

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_ship_t *self = arg;
    //  Snapshots' offers past their time: withdrawn, their staging removed.
    uint64_t now = sbx_clock_mono_ms ();
    zlist_t *ended = NULL;
    for (char *until = zhashx_first (self->expires); until; until = zhashx_next (self->expires))
        if (strtoull (until, NULL, 10) <= now) {
            if (!ended)
                ended = zlist_new ();
            if (ended)
                zlist_append (ended, (void *) zhashx_cursor (self->expires));
        }
    for (char *id = ended ? zlist_first (ended) : NULL; id; id = zlist_next (ended)) {
        char *copy = strdup (id);
        if (copy)
            vmd_ship_forget (self, copy);
        free (copy);
    }
    zlist_destroy (&ended);
    s_job_t *job = zlistx_first (self->jobs);
    while (job) {
        s_job_t *next = zlistx_next (self->jobs);
        int status;
        if (job->kind == S_OFFER && job->pid > 0 &&
            waitpid (job->pid, &status, WNOHANG) == job->pid) {
            job->pid = 0;
            if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
                s_offered (self, job);
            else
                s_fail (self, job, SBX_E_INTERNAL, "flattening the disk of %s %s failed",
                        job->snapshot ? "snapshot" : "sandbox", job->id);
        }
        job = next;
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Construction

vmd_ship_t *vmd_ship_new (sbx_config_t *config, zloop_t *loop, const char *vms_dir,
                          const vmd_guest_env_t *images, vmd_ship_done_fn *done, void *arg)
{
    vmd_ship_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->config = config;
    self->loop = loop;
    self->done = done;
    self->arg = arg;
    self->data_dir = strdup (sbx_config_data_dir (config));
    self->vms_dir = strdup (vms_dir);
    self->images = images;
    self->jobs = zlistx_new ();
    self->offers = zhashx_new ();
    if (self->offers)
        zhashx_set_destructor (self->offers, (zhashx_destructor_fn *) zstr_free);
    self->expires = zhashx_new ();
    if (self->expires) {
        zhashx_set_destructor (self->expires, (zhashx_destructor_fn *) zstr_free);
        zhashx_set_duplicator (self->expires, (zhashx_duplicator_fn *) strdup);
    }
    char *staging = self->data_dir ? zsys_sprintf ("%s/ship", self->data_dir) : NULL;
    //  Staging and incoming copies of the last run are of no use: its offers are gone.
    if (staging)
        sbx_files_remove_tree (staging);
    bool made = staging && mkdir (staging, 0700) == 0;
    free (staging);
    if (!made || !self->data_dir || !self->vms_dir || !self->jobs || !self->offers ||
        !self->expires) {
        vmd_ship_destroy (&self);
        return NULL;
    }
    const char *address = sbx_config_get (config, "vmd.ship", NULL);
    if (address && *address) {
        const char *colon = strrchr (address, ':');
        char bind[300];
        snprintf (bind, sizeof bind, "tcp://*:%s", colon ? colon + 1 : "");
        zcert_t *cert = sbx_curve_host_cert (config);
        self->address = strdup (address);
        self->server = cert ? sbx_ship_server_new (bind, self->data_dir, cert) : NULL;
        self->public_key = cert ? strdup (zcert_public_txt (cert)) : NULL;
        zcert_destroy (&cert);
        if (!colon || !self->server || !self->public_key) {
            sbx_error ("vmd.ship = %s: cannot serve moves there (HOST:PORT, a port free here)",
                       address);
            vmd_ship_destroy (&self);
            return NULL;
        }
        sbx_info ("ships stopped sandboxes from %s (vmd.ship)", address);
    }
    self->timer = zloop_timer (loop, S_TICK_MS, 0, s_on_tick, self);
    return self;
}

void vmd_ship_destroy (vmd_ship_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    vmd_ship_t *self = *self_p;
    if (self->timer > 0)
        zloop_timer_end (self->loop, self->timer);
    for (s_job_t *job = self->jobs ? zlistx_first (self->jobs) : NULL; job;
         job = zlistx_next (self->jobs)) {
        if (job->fetch)
            zloop_reader_end (self->loop, sbx_ship_fetch_sock (job->fetch));
        s_job_destroy (&job);
    }
    zlistx_destroy (&self->jobs);
    zhashx_destroy (&self->offers);
    zhashx_destroy (&self->expires);
    sbx_ship_server_destroy (&self->server);
    free (self->data_dir);
    free (self->vms_dir);
    free (self->address);
    free (self->public_key);
    free (self);
    *self_p = NULL;
}
