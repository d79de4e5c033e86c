/*  vmd_ship_test - two vmds' ship sides in one process, each with its own data directory
    and a copy of one image (the same content hash): a stopped guest's overlay, three
    layers deep (image, a template's disk, its own), and its memory state are offered by
    one and taken by the other over CurveZMQ on 127.0.0.1, with real qemu-img. The disk
    that lands reads the same as the one that left (qemu-img compare), stands on the
    taker's image only, and the memory state is the same bytes; a wrong ticket and another
    image are refused, and leave nothing; an offer without vmd.ship says how to set it.
    A snapshot's files (snapshots/<id>/, on a template's disk) go the same way into the
    other host's store.
*/
#include "vmd_guest.h"
#include "vmd_ship.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static sbx_msg_t *s_reply;
static bool s_took;

static void s_done (const sbx_msg_t *request, sbx_msg_t **reply_p, bool took, void *arg)
{
    (void) request;
    (void) arg;
    s_reply = *reply_p;
    *reply_p = NULL;
    s_took = took;
}

static int s_check (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return s_reply ? -1 : 0;
}

//  Runs the loop until an answer came (60 s at most); returns it.
static sbx_msg_t *s_wait (zloop_t *loop)
{
    s_reply = NULL;
    int timer = zloop_timer (loop, 20, 3000, s_check, NULL);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (s_reply);
    sbx_msg_t *reply = s_reply;
    s_reply = NULL;
    return reply;
}

static void s_sh (const char *fmt, ...)
{
    char command[2048];
    va_list args;
    va_start (args, fmt);
    vsnprintf (command, sizeof command, fmt, args);
    va_end (args);
    assert (system (command) == 0);
}

void vmd_ship_test (bool verbose)
{
    (void) verbose;
    char root[] = "/tmp/vmd_ship_test.XXXXXX";
    assert (mkdtemp (root));
    //  Two data directories, each with the image under the same hash, and vms/.
    s_sh ("mkdir -p %s/a/images/abc123 %s/b/images/abc123 %s/b/images/def456 %s/a/vms %s/b/vms "
          "%s/a/templates && head -c 8M /dev/urandom > %s/a/images/abc123/rootfs.ext4 && "
          "cp %s/a/images/abc123/rootfs.ext4 %s/b/images/abc123/ && "
          "cp %s/a/images/abc123/rootfs.ext4 %s/b/images/def456/",
          root, root, root, root, root, root, root, root, root, root, root);
    //  The guest: a template's disk on the image, its overlay on that, both written to.
    s_sh ("cd %s/a && qemu-img create -q -f qcow2 -b %s/a/images/abc123/rootfs.ext4 -F raw "
          "templates/disk.qcow2 && qemu-io -c 'write -P 0xaa 1M 64k' templates/disk.qcow2 "
          ">/dev/null && mkdir vms/sb_moving && qemu-img create -q -f qcow2 -b "
          "%s/a/templates/disk.qcow2 -F qcow2 vms/sb_moving/overlay.qcow2 && qemu-io -c "
          "'write -P 0xbb 4M 64k' -c 'write -z 6M 64k' vms/sb_moving/overlay.qcow2 >/dev/null && "
          "head -c 3M /dev/urandom > vms/sb_moving/memory.state",
          root, root, root);

    zloop_t *loop = zloop_new ();
    char path[400], vms_a[200], vms_b[200], image_a[200], image_b[200];
    snprintf (path, sizeof path, "%s/a", root);
    sbx_config_t *config_a = sbx_config_new (path);
    snprintf (path, sizeof path, "%s/b", root);
    sbx_config_t *config_b = sbx_config_new (path);
    snprintf (vms_a, sizeof vms_a, "%s/a/vms", root);
    snprintf (vms_b, sizeof vms_b, "%s/b/vms", root);
    snprintf (image_a, sizeof image_a, "%s/a/images/abc123", root);
    snprintf (image_b, sizeof image_b, "%s/b/images/abc123", root);

    //  What each vmd's guests boot: one image for every type here.
    vmd_guest_env_t env_a = {.vms_dir = vms_a, .image_dir = image_a};
    vmd_guest_env_t env_b = {.vms_dir = vms_b, .image_dir = image_b};

    //  Without vmd.ship nothing is offered, and the error says what to set.
    //  Ships made and destroyed between runs get a loop of their own: a timer ended
    //  outside a running loop fires once more at the loop's next start (czmq's zombie
    //  rule), and its arg is gone by then.
    zloop_t *quiet_loop = zloop_new ();
    vmd_ship_t *quiet = vmd_ship_new (config_a, quiet_loop, vms_a, &env_a, s_done, NULL);
    assert (quiet);
    sbx_msg_t *offer = sbx_msg_new (SBX_MSG_VM_SHIP_OFFER);
    offer->rid = 1;
    sbx_str_set (&sbx_msg_vm_ship_offer (offer)->sandbox_id, "sb_moving");
    sbx_str_set (&sbx_msg_vm_ship_offer (offer)->ticket,
                 "ticket-0123456789-0123456789-0123456789-0123456789");
    vmd_ship_guest_t guest = {.id = "sb_moving",
                              .image_dir = image_a,
                              .hostname = "moving",
                              .type = SBX_SANDBOX_TYPE_SMALL};
    sbx_err_t err = {0};
    assert (vmd_ship_offer (quiet, offer, &guest, &err) == -1);
    assert (err.code == SBX_E_FAILED_PRECONDITION && strstr (err.message, "vmd.ship"));
    vmd_ship_destroy (&quiet);

    int port = 20000 + (int) (getpid () % 20000);
    char address[64];
    snprintf (address, sizeof address, "127.0.0.1:%d", port);
    sbx_config_set (config_a, "vmd.ship", address);
    vmd_ship_t *a = vmd_ship_new (config_a, loop, vms_a, &env_a, s_done, NULL);
    vmd_ship_t *b = vmd_ship_new (config_b, loop, vms_b, &env_b, s_done, NULL);
    assert (a && b);

    //  The offer: its disk flattened onto the image, beside its memory state.
    assert (vmd_ship_offer (a, offer, &guest, &err) == 0);
    sbx_msg_t *reply = s_wait (loop);
    assert (reply->type == SBX_MSG_VM_SHIP_OFFER_OK && !s_took);
    sbx_ship_offer_t *offered = sbx_msg_vm_ship_offer_ok (reply)->offer;
    assert (streq (offered->image, "abc123") && offered->files.count == 2);
    assert (strstr (offered->endpoint, address) && strlen (offered->public_key) == 40);
    assert (streq (offered->hostname, "moving") && offered->bytes > 3 * 1024 * 1024);

    //  A take with another ticket fails, and leaves nothing.
    sbx_msg_t *take = sbx_msg_new (SBX_MSG_VM_SHIP_TAKE);
    take->rid = 2;
    sbx_vm_ship_take_t *args = sbx_msg_vm_ship_take (take);
    sbx_str_set (&args->sandbox_id, "sb_moving");
    sbx_str_set (&args->from, "host-a");
    sbx_str_set (&args->ticket, "ticket-9999999999-9999999999-9999999999-9999999999");
    args->offer = offered;
    sbx_msg_vm_ship_offer_ok (reply)->offer = NULL;
    assert (vmd_ship_take (b, take, &err) == 0);
    sbx_msg_t *answer = s_wait (loop);
    assert (answer->type == SBX_MSG_ERROR && !s_took);
    sbx_msg_destroy (&answer);
    snprintf (path, sizeof path, "%s/sb_moving", vms_b);
    struct stat st;
    assert (stat (path, &st) == -1);
    snprintf (path, sizeof path, "%s/sb_moving.incoming", vms_b);
    assert (stat (path, &st) == -1);

    //  Another image here for its type: refused before any fetch, whether the host's
    //  default image differs or only the type's own (image_dir.small) does.
    vmd_guest_env_t env_other = {.vms_dir = vms_b, .image_dir = "/nowhere/images/def456"};
    vmd_ship_t *other = vmd_ship_new (config_b, quiet_loop, vms_b, &env_other, s_done, NULL);
    assert (vmd_ship_take (other, take, &err) == -1 && err.code == SBX_E_FAILED_PRECONDITION);
    assert (strstr (err.message, "abc123") && strstr (err.message, "def456"));
    vmd_ship_destroy (&other);
    env_other.image_dir = image_b;
    env_other.type_image[SBX_SANDBOX_TYPE_SMALL] = "/nowhere/images/def456";
    other = vmd_ship_new (config_b, quiet_loop, vms_b, &env_other, s_done, NULL);
    err = (sbx_err_t){0};
    assert (vmd_ship_take (other, take, &err) == -1 && err.code == SBX_E_FAILED_PRECONDITION);
    assert (strstr (err.message, "def456") && strstr (err.message, "small"));
    vmd_ship_destroy (&other);
    zloop_destroy (&quiet_loop);

    //  The take: the files land in vms/sb_moving, the disk reads the same as the source's
    //  whole chain, on the taker's image alone; the memory state is the same bytes.
    sbx_str_set (&args->ticket, "ticket-0123456789-0123456789-0123456789-0123456789");
    assert (vmd_ship_take (b, take, &err) == 0);
    answer = s_wait (loop);
    assert (answer->type == SBX_MSG_VM_SHIP_TAKE_OK && s_took);
    assert (sbx_msg_vm_ship_take_ok (answer)->bytes == offered->bytes);
    sbx_msg_destroy (&answer);
    s_sh ("qemu-img compare -q -f qcow2 -F qcow2 %s/sb_moving/overlay.qcow2 "
          "%s/sb_moving/overlay.qcow2",
          vms_a, vms_b);
    s_sh ("qemu-img info %s/sb_moving/overlay.qcow2 | grep -q 'backing file: %s/rootfs.ext4$'",
          vms_b, image_b);
    s_sh ("cmp -s %s/sb_moving/memory.state %s/sb_moving/memory.state", vms_a, vms_b);
    snprintf (path, sizeof path, "%s/sb_moving.incoming", vms_b);
    assert (stat (path, &st) == -1);

    //  Forgotten (the sandbox resumed or went there): its ship directory goes.
    vmd_ship_forget (a, "sb_moving");
    snprintf (path, sizeof path, "%s/sb_moving/ship", vms_a);
    assert (stat (path, &st) == -1);

    //  A snapshot's copy: snapshots/<id> (its disk on the template's, as a clone's save
    //  is) lands in the other store, flattened onto its image, with a capture's modes.
    s_sh ("cd %s/a && mkdir -m 0711 -p snapshots/snap_copied && qemu-img create -q -f qcow2 -b "
          "%s/a/templates/disk.qcow2 -F qcow2 snapshots/snap_copied/disk.qcow2 && qemu-io -c "
          "'write -P 0xcc 2M 64k' snapshots/snap_copied/disk.qcow2 >/dev/null && head -c 1M "
          "/dev/urandom > snapshots/snap_copied/memory.state && mkdir -p %s/b/snapshots",
          root, root, root);
    sbx_msg_t *snap_offer = sbx_msg_new (SBX_MSG_VM_SHIP_OFFER);
    snap_offer->rid = 3;
    sbx_vm_ship_offer_t *offer_args = sbx_msg_vm_ship_offer (snap_offer);
    sbx_str_set (&offer_args->sandbox_id, "sb_gone_long_ago");
    sbx_str_set (&offer_args->snapshot_id, "snap_copied");
    sbx_str_set (&offer_args->ticket, "ticket-snap-0123456789-0123456789-0123456789");
    assert (vmd_ship_offer (a, snap_offer, NULL, &err) == 0);
    sbx_msg_destroy (&reply);
    reply = s_wait (loop);
    assert (reply->type == SBX_MSG_VM_SHIP_OFFER_OK && !s_took);
    offered = sbx_msg_vm_ship_offer_ok (reply)->offer;
    assert (offered->files.count == 2 &&
            streq (offered->files.items[0], "ship/snap_copied/disk.qcow2"));
    sbx_msg_t *snap_take = sbx_msg_new (SBX_MSG_VM_SHIP_TAKE);
    snap_take->rid = 4;
    sbx_vm_ship_take_t *take_args = sbx_msg_vm_ship_take (snap_take);
    sbx_str_set (&take_args->sandbox_id, "sb_gone_long_ago");
    sbx_str_set (&take_args->snapshot_id, "snap_copied");
    sbx_str_set (&take_args->from, "host-a");
    sbx_str_set (&take_args->ticket, "ticket-snap-0123456789-0123456789-0123456789");
    take_args->offer = offered;
    sbx_msg_vm_ship_offer_ok (reply)->offer = NULL;
    //  Only its own two files, under ship/<id>/: another path is refused.
    sbx_str_set (&offered->files.items[1], "vms/sb_moving/memory.state");
    assert (vmd_ship_take (b, snap_take, &err) == -1 && err.code == SBX_E_INVALID_ARGUMENT);
    sbx_str_set (&offered->files.items[1], "ship/snap_copied/memory.state");
    assert (vmd_ship_take (b, snap_take, &err) == 0);
    answer = s_wait (loop);
    assert (answer->type == SBX_MSG_VM_SHIP_TAKE_OK && !s_took);
    assert (streq (sbx_msg_vm_ship_take_ok (answer)->snapshot_id, "snap_copied"));
    sbx_msg_destroy (&answer);
    s_sh ("qemu-img compare -q -f qcow2 -F qcow2 %s/a/snapshots/snap_copied/disk.qcow2 "
          "%s/b/snapshots/snap_copied/disk.qcow2",
          root, root);
    s_sh ("qemu-img info %s/b/snapshots/snap_copied/disk.qcow2 | grep -q 'backing file: "
          "%s/rootfs.ext4$'",
          root, image_b);
    s_sh ("cmp -s %s/a/snapshots/snap_copied/memory.state %s/b/snapshots/snap_copied/memory.state",
          root, root);
    snprintf (path, sizeof path, "%s/b/snapshots/snap_copied/memory.state", root);
    assert (stat (path, &st) == 0 && (st.st_mode & 0777) == 0640);
    snprintf (path, sizeof path, "%s/b/snapshots/snap_copied", root);
    assert (stat (path, &st) == 0 && (st.st_mode & 0777) == 0711);
    //  There already: a second take is refused, the copy untouched.
    assert (vmd_ship_take (b, snap_take, &err) == -1 && err.code == SBX_E_CONFLICT);
    snprintf (path, sizeof path, "%s/b/ship/snap_copied.incoming", root);
    assert (stat (path, &st) == -1);
    //  The offer's staging goes when it is forgotten (or its time is up).
    vmd_ship_forget (a, "snap_copied");
    snprintf (path, sizeof path, "%s/a/ship/snap_copied", root);
    assert (stat (path, &st) == -1);
    //  Not there: said so.
    sbx_str_set (&offer_args->snapshot_id, "snap_absent");
    assert (vmd_ship_offer (a, snap_offer, NULL, &err) == -1 && err.code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&snap_take);
    sbx_msg_destroy (&snap_offer);

    sbx_msg_destroy (&take);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&offer);
    vmd_ship_destroy (&a);
    vmd_ship_destroy (&b);
    zloop_destroy (&loop);
    sbx_config_destroy (&config_a);
    sbx_config_destroy (&config_b);
    s_sh ("rm -rf %s", root);
}
