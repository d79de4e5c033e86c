/*  vmd_template - see vmd_template.h */
#include "vmd_template.h"
#include "sbx_log.h"
#include "vmd_qemu.h"
#include "vmd_ramfile.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_TYPES      VMD_GUEST_TYPES
#define S_BOOT_MS    180000
#define S_CAPTURE_MS 120000

typedef enum { S_IDLE, S_BOOTING, S_STOPPING, S_CAPTURING, S_DELETING } s_phase_t;

//  A captured template's RAM going to disk (memory.ram, then qemu.version): hundreds of
//  megabytes and two fsyncs, seconds on a busy disk, in a thread of its own. vmd's loop
//  must not stand still that long: the broker takes a vmd silent for three heartbeats
//  for gone, failing what it had in flight.
typedef struct {
    zactor_t *actor;
    sbx_sandbox_type_t type;
    int ram;   //  the sealed memfd (kept by the template once saved)
    char *dir; //  the template's directory
    char *path;
} s_save_t;

struct _vmd_template_t {
    char *root;           //  <data-dir>/templates/<instance>: this vmd's alone
    char *work;           //  <root>/work: the hidden guest's vms directory
    char *image[S_TYPES]; //  the image directory each type's template is made of
    char *hash[S_TYPES];  //  its name (the image's input hash)
    char tag[9];          //  this host's QEMU version, hashed: a template is tied to it
    vmd_guest_env_t env;
    bool want[S_TYPES];
    bool gave_up[S_TYPES];
    char *ready[S_TYPES];  //  the directory, once complete
    int failures[S_TYPES]; //  restores of it that failed in a row
    int ram[S_TYPES];      //  its RAM, a sealed memfd (vmd_ramfile), or -1
    int building_ram;      //  the hidden guest's RAM, shared with it until it stops
    vmd_guest_t *guest;    //  the hidden guest being made into a template
    sbx_sandbox_type_t building;
    s_phase_t phase;
    s_save_t *saving; //  a RAM file being written (the next template waits for it)
    void (*wake) (void *arg);
    void *wake_arg;
};

static char *s_dir (vmd_template_t *self, sbx_sandbox_type_t type)
{
    return zsys_sprintf ("%s/%s-%s-%s", self->root, self->hash[type], sbx_sandbox_type_name (type),
                         self->tag);
}

//  Removes the files of a directory (templates and their work dirs have no subdirectories
//  but the work dir's guests, which vmd_guest removes itself) and the directory.
static void s_remove (const char *path)
{
    DIR *dir = opendir (path);
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir (dir))) {
        if (streq (entry->d_name, ".") || streq (entry->d_name, ".."))
            continue;
        char *child = zsys_sprintf ("%s/%s", path, entry->d_name);
        struct stat st;
        if (child && lstat (child, &st) == 0 && S_ISDIR (st.st_mode)) {
            //  A hidden guest a previous vmd left: its QEMU goes first.
            pid_t pid = vmd_qemu_adopt (child);
            if (pid > 0)
                kill (pid, SIGKILL);
            s_remove (child);
        } else if (child)
            unlink (child);
        free (child);
    }
    closedir (dir);
    rmdir (path);
}

//  A template is complete once qemu.version is there, naming this host's QEMU and
//  accelerator (vmd_qemu_state_key).
static bool s_complete (const char *dir)
{
    char *path = zsys_sprintf ("%s/qemu.version", dir);
    char text[200] = "";
    FILE *file = path ? fopen (path, "r") : NULL;
    free (path);
    if (file) {
        if (!fgets (text, sizeof text, file))
            text[0] = 0;
        fclose (file);
    }
    text[strcspn (text, "\n")] = 0;
    return *text && streq (text, vmd_qemu_state_key ());
}

static int s_write_version (const char *dir)
{
    char *tmp = zsys_sprintf ("%s/qemu.version.tmp", dir),
         *path = zsys_sprintf ("%s/qemu.version", dir);
    int fd = tmp ? open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    const char *version = vmd_qemu_state_key ();
    bool ok = fd >= 0 && write (fd, version, strlen (version)) == (ssize_t) strlen (version) &&
              write (fd, "\n", 1) == 1 && fsync (fd) == 0;
    if (fd >= 0)
        ok = close (fd) == 0 && ok;
    ok = ok && path && rename (tmp, path) == 0;
    int handle = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (handle >= 0) {
        fsync (handle);
        close (handle);
    }
    free (tmp);
    free (path);
    return ok ? 0 : -1;
}

//  The RAM size of type in bytes.
static uint64_t s_ram_bytes (sbx_sandbox_type_t type)
{
    const vmd_qemu_type_t *qtype = vmd_qemu_type (sbx_sandbox_type_name (type));
    return qtype ? (uint64_t) qtype->memory_mib << 20 : 0;
}

static void s_give_up (vmd_template_t *self, const char *why)
{
    if (self->building_ram >= 0)
        close (self->building_ram);
    self->building_ram = -1;
    sbx_warn ("template %s: %s; %s sandboxes boot cold", sbx_sandbox_type_name (self->building),
              why, sbx_sandbox_type_name (self->building));
    self->gave_up[self->building] = true;
    char *dir = s_dir (self, self->building);
    if (dir)
        s_remove (dir);
    free (dir);
}

static void s_delete_guest (vmd_template_t *self)
{
    sbx_err_t err = {0};
    self->phase = S_DELETING;
    if (vmd_guest_delete (self->guest, 2, 10000, &err))
        sbx_warn ("template guest: %s", err.message);
}

static void s_next (vmd_template_t *self);

static void s_save_actor (zsock_t *pipe, void *arg)
{
    s_save_t *save = arg;
    zsock_signal (pipe, 0);
    int rc =
        vmd_ramfile_save (save->ram, save->path) == 0 && s_write_version (save->dir) == 0 ? 0 : -1;
    zsock_send (pipe, "i", rc);
    //  Then $TERM (zactor_destroy).
    zmsg_t *term = zmsg_recv (pipe);
    zmsg_destroy (&term);
}

static void s_save_destroy (s_save_t **save_p)
{
    s_save_t *save = *save_p;
    if (!save)
        return;
    zactor_destroy (&save->actor); //  waits for a save under way to end
    if (save->ram >= 0)
        close (save->ram);
    free (save->dir);
    free (save->path);
    free (save);
    *save_p = NULL;
}

//  The RAM file is written (or could not be): the template is ready, or given up.
static int s_on_saved (zloop_t *loop, zsock_t *reader, void *arg)
{
    vmd_template_t *self = arg;
    s_save_t *save = self->saving;
    int rc = -1;
    if (zsock_recv (reader, "i", &rc) == -1)
        rc = -1;
    zloop_reader_end (loop, reader);
    self->saving = NULL;
    if (rc == 0) {
        sbx_info ("template %s ready in %s (RAM %llu MiB that its sandboxes map copy-on-write)",
                  sbx_sandbox_type_name (save->type), save->dir,
                  (unsigned long long) (s_ram_bytes (save->type) >> 20));
        self->ready[save->type] = save->dir;
        self->ram[save->type] = save->ram;
        save->dir = NULL;
        save->ram = -1;
    } else {
        sbx_sandbox_type_t building = self->building;
        self->building = save->type;
        s_give_up (self, "cannot keep its RAM file");
        self->building = building;
    }
    s_save_destroy (&save);
    s_next (self);
    return 0;
}

//  Starts writing the sealed RAM of the template just captured; takes ram and dir.
static int s_save_start (vmd_template_t *self, int ram, char *dir)
{
    s_save_t *save = calloc (1, sizeof *save);
    if (!save) {
        close (ram);
        free (dir);
        return -1;
    }
    save->type = self->building;
    save->ram = ram;
    save->dir = dir;
    save->path = zsys_sprintf ("%s/memory.ram", dir);
    save->actor = save->path ? zactor_new (s_save_actor, save) : NULL;
    if (!save->actor ||
        zloop_reader (self->env.loop, zactor_sock (save->actor), s_on_saved, self) == -1) {
        s_save_destroy (&save);
        return -1;
    }
    self->saving = save;
    return 0;
}

static void s_on_captured (vmd_guest_t *guest, sbx_code_t code, const char *message,
                           uint64_t disk_bytes, uint64_t memory_bytes, void *arg)
{
    (void) guest;
    vmd_template_t *self = arg;
    char *dir = s_dir (self, self->building);
    //  Its QEMU is gone: nothing maps the RAM shared any more, it can be sealed. Saved
    //  before qemu.version, which says the template is complete, in a thread.
    if (code == SBX_OK && dir && vmd_ramfile_seal (self->building_ram) == 0) {
        sbx_info ("template %s captured in %s (disk %llu, memory state %llu bytes): writing "
                  "its RAM file",
                  sbx_sandbox_type_name (self->building), dir, (unsigned long long) disk_bytes,
                  (unsigned long long) memory_bytes);
        int ram = self->building_ram;
        self->building_ram = -1;
        if (s_save_start (self, ram, dir))
            s_give_up (self, "cannot start writing its RAM file");
    } else {
        s_give_up (self, message ? message : "cannot keep its files");
        free (dir);
    }
    s_delete_guest (self);
}

//  The hidden guest's create (or delete) ended.
static void s_on_done (vmd_guest_t *guest, uint64_t rid, sbx_code_t code, const char *message,
                       void *arg)
{
    (void) rid;
    vmd_template_t *self = arg;
    if (self->phase != S_BOOTING && self->phase != S_STOPPING)
        return; //  the delete: collect drops the guest
    if (code != SBX_OK && self->phase == S_BOOTING) {
        s_give_up (self, message ? message : "its guest did not boot");
        self->phase = S_DELETING; //  a failed create deletes itself
        return;
    }
    if (code != SBX_OK) {
        s_give_up (self, message ? message : "its guest did not stop");
        s_delete_guest (self);
        return;
    }
    sbx_err_t err = {0};
    if (self->phase == S_BOOTING) {
        //  Booted and its agent answered: stopped now, idle, its RAM left in the memfd
        //  (a capture that went on running would change it under the saved state).
        self->phase = S_STOPPING;
        if (vmd_guest_stop (guest, 2, S_CAPTURE_MS, &err)) {
            s_give_up (self, err.message);
            s_delete_guest (self);
        }
        return;
    }
    //  Stopped: its disk and device state into the template's directory.
    char *dir = s_dir (self, self->building);
    self->phase = S_CAPTURING;
    if (!dir || (mkdir (dir, 0711) == -1 && errno != EEXIST) ||
        vmd_guest_snapshot (guest, dir, false, S_CAPTURE_MS, s_on_captured, self, &err)) {
        s_give_up (self, *err.message ? err.message : "cannot make its directory");
        s_delete_guest (self);
    }
    free (dir);
}

static void s_on_failed (vmd_guest_t *guest, const char *reason, void *arg)
{
    (void) guest;
    vmd_template_t *self = arg;
    if (self->phase == S_DELETING)
        return;
    s_give_up (self, reason);
    s_delete_guest (self);
}

static void s_wake (void *arg)
{
    vmd_template_t *self = arg;
    if (self->wake)
        self->wake (self->wake_arg);
}

//  Starts the next template nobody made yet.
static void s_next (vmd_template_t *self)
{
    if (self->guest || self->saving)
        return;
    for (int type = 1; type < S_TYPES; type++) {
        if (!self->want[type] || self->ready[type] || self->gave_up[type])
            continue;
        char id[32];
        snprintf (id, sizeof id, "tpl-%s", sbx_sandbox_type_name ((sbx_sandbox_type_t) type));
        self->building = (sbx_sandbox_type_t) type;
        self->guest = vmd_guest_new (&self->env, id, "sbx-template", self->building, false);
        self->building_ram = vmd_ramfile_new (s_ram_bytes (self->building));
        if (self->guest)
            vmd_guest_set_ram (self->guest, self->building_ram, true);
        sbx_err_t err = {0};
        self->phase = S_BOOTING;
        if (!self->guest || self->building_ram < 0 ||
            vmd_guest_create (self->guest, 1, S_BOOT_MS, &err)) {
            vmd_guest_destroy (&self->guest);
            self->phase = S_IDLE;
            s_give_up (self, *err.message ? err.message : "cannot start its guest");
            continue;
        }
        sbx_info ("template %s: booting a guest to capture",
                  sbx_sandbox_type_name (self->building));
        return;
    }
}

//  An instance name is a directory name here: letters, digits, '.', '_', '-', not
//  starting with '.' (so never "." or "..").
static bool s_instance_valid (const char *name)
{
    size_t size = name ? strlen (name) : 0;
    if (size == 0 || size > 64 || name[0] == '.')
        return false;
    for (const char *c = name; *c; c++)
        if (!isalnum ((unsigned char) *c) && *c != '.' && *c != '_' && *c != '-')
            return false;
    return true;
}

vmd_template_t *vmd_template_new (zloop_t *loop, const char *data_dir, const char *instance,
                                  const vmd_guest_env_t *images, const char *qemu_user,
                                  const char *types, void (*wake) (void *arg), void *arg)
{
    if (!types || !*types)
        return NULL;
    if (!s_instance_valid (instance)) {
        sbx_warn ("vmd.templates: instance name '%s' cannot name a directory; sandboxes boot cold",
                  instance ? instance : "");
        return NULL;
    }
    vmd_template_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->building_ram = -1;
    for (int type = 0; type < S_TYPES; type++)
        self->ram[type] = -1;
    char *list = strdup (types);
    int wanted = 0;
    for (char *save = NULL, *name = strtok_r (list, " ,", &save); name;
         name = strtok_r (NULL, " ,", &save)) {
        sbx_sandbox_type_t type;
        if (sbx_sandbox_type_from_name (name, &type) == 0 && type > 0 && type < S_TYPES)
            self->want[type] = true, wanted++;
        else
            sbx_warn ("vmd.templates: no sandbox type '%s'", name);
    }
    free (list);
    bool named = true;
    for (int type = 1; type < S_TYPES; type++) {
        //  Each type's from the image it boots (image_dir.TYPE): named by its hash.
        char *copy = strdup (vmd_guest_env_image (images, (sbx_sandbox_type_t) type));
        self->image[type] = copy ? strdup (copy) : NULL;
        self->hash[type] = copy ? strdup (basename (copy)) : NULL;
        named = named && self->image[type] && self->hash[type];
        free (copy);
    }
    //  Per instance: two vmds on one data directory never touch each other's templates
    //  or hidden guests (each cleans up only its own work/ at start).
    char *top = zsys_sprintf ("%s/templates", data_dir);
    self->root = zsys_sprintf ("%s/templates/%s", data_dir, instance);
    self->work = zsys_sprintf ("%s/templates/%s/work", data_dir, instance);
    uint32_t fnv = 2166136261u; //  FNV-1a
    for (const char *c = vmd_qemu_state_key (); *c; c++)
        fnv = (fnv ^ (uint8_t) *c) * 16777619u;
    snprintf (self->tag, sizeof self->tag, "%08x", fnv);
    if (!wanted || !top || !self->root || !self->work || !named || !*vmd_qemu_version ()) {
        free (top);
        vmd_template_destroy (&self);
        return NULL;
    }
    //  QEMU's user opens a template's disk as a backing file: search rights only.
    mkdir (top, 0711);
    chmod (top, 0711);
    free (top);
    mkdir (self->root, 0711);
    chmod (self->root, 0711);
    s_remove (self->work); //  a hidden guest of this instance's previous vmd
    mkdir (self->work, 0711);
    chmod (self->work, 0711);
    self->env = (vmd_guest_env_t){.loop = loop,
                                  .vms_dir = self->work,
                                  .image_dir = images->image_dir, //  the owner's: outlives us
                                  .qemu_user = qemu_user,
                                  .done = s_on_done,
                                  .failed = s_on_failed,
                                  .wake = s_wake,
                                  .arg = self};
    for (int type = 1; type < S_TYPES; type++)
        self->env.type_image[type] = self->image[type];
    self->wake = wake;
    self->wake_arg = arg;
    for (int type = 1; type < S_TYPES; type++) {
        if (!self->want[type])
            continue;
        char *dir = s_dir (self, (sbx_sandbox_type_t) type);
        //  Its RAM back into a sealed memfd (≈ 0.1-0.3 s of copying, once per type at
        //  start); a template without memory.ram has its RAM in memory.state.
        char *ram = dir ? zsys_sprintf ("%s/memory.ram", dir) : NULL;
        bool complete = dir && ram && s_complete (dir);
        if (complete && access (ram, F_OK) == 0) {
            self->ram[type] = vmd_ramfile_load (ram, s_ram_bytes ((sbx_sandbox_type_t) type));
            complete = self->ram[type] >= 0;
        }
        free (ram);
        if (complete) {
            self->ready[type] = dir;
            sbx_info ("template %s ready in %s", sbx_sandbox_type_name ((sbx_sandbox_type_t) type),
                      dir);
        } else {
            //  Incomplete: nobody can stand on it yet, make it anew. (Another QEMU's
            //  templates have other names and stay: sandboxes may stand on their disks.)
            if (dir)
                s_remove (dir);
            free (dir);
        }
    }
    s_next (self);
    return self;
}

void vmd_template_destroy (vmd_template_t **self_p)
{
    vmd_template_t *self = *self_p;
    if (!self)
        return;
    //  A capture in progress is abandoned with its QEMU: unlike a sandbox's, nothing
    //  would adopt it (the next start begins the capture again), and it must not outlive
    //  vmd (an `sbx up` that stops for good would leave it running).
    bool capturing = self->guest != NULL;
    vmd_guest_destroy (&self->guest);
    if (self->saving)
        zloop_reader_end (self->env.loop, zactor_sock (self->saving->actor));
    s_save_destroy (&self->saving);
    if (capturing && self->work)
        s_remove (self->work);
    for (int type = 0; type < S_TYPES; type++) {
        free (self->ready[type]);
        if (self->ram[type] >= 0)
            close (self->ram[type]);
        free (self->image[type]);
        free (self->hash[type]);
    }
    if (self->building_ram >= 0)
        close (self->building_ram);
    free (self->root);
    free (self->work);
    free (self);
    *self_p = NULL;
}

const char *vmd_template_dir (vmd_template_t *self, sbx_sandbox_type_t type, const char *image_dir)
{
    if (!self || type <= 0 || type >= S_TYPES || !image_dir || !self->image[type] ||
        !streq (image_dir, self->image[type]))
        return NULL;
    return self->ready[type];
}

int vmd_template_ram (vmd_template_t *self, sbx_sandbox_type_t type)
{
    return self && type > 0 && type < S_TYPES && self->ready[type] ? self->ram[type] : -1;
}

void vmd_template_restored (vmd_template_t *self, sbx_sandbox_type_t type, bool ok)
{
    if (!self || type <= 0 || type >= S_TYPES || !self->ready[type])
        return;
    self->failures[type] = ok ? 0 : self->failures[type] + 1;
    if (self->failures[type] < VMD_TEMPLATE_FAILURES)
        return;
    //  Each failed restore costs its create up to vmd.restore_timeout_ms: stop trying.
    sbx_warn ("template %s: %d restores of %s failed in a row; %s sandboxes boot cold until "
              "vmd restarts",
              sbx_sandbox_type_name (type), self->failures[type], self->ready[type],
              sbx_sandbox_type_name (type));
    zstr_free (&self->ready[type]);
    if (self->ram[type] >= 0)
        close (self->ram[type]); //  its sandboxes keep their own mappings
    self->ram[type] = -1;
    self->gave_up[type] = true;
}

void vmd_template_collect (vmd_template_t *self)
{
    if (!self || !self->guest)
        return;
    vmd_guest_collect (self->guest);
    if (vmd_guest_state (self->guest) == SBX_SANDBOX_STATE_DELETED) {
        vmd_guest_destroy (&self->guest);
        self->phase = S_IDLE;
        s_next (self);
    }
}
