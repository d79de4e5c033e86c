/*  snap_broker_test - snapshots through the real broker (brk_snapshot, brk_sandbox) and
    the real snapshotd handlers (snap_server) in a worker thread, with a vmd played at
    the protocol level that writes the files vm.snapshot asks for. Here, not in
    snap_server.c: it links the broker, which sbx-snapshotd must not. */
#include "brk_server.h"
#include "brk_testkit.h"
#include "snap_server.h"

#include <sys/stat.h>

static uint64_t s_rid = 7000;
static int s_vmd_mode;          //  0: captures work; 1: vm.snapshot fails
static char s_last_origin[512]; //  snapshot_dir of the last vm.create

static void s_write (const char *dir, const char *name, size_t size)
{
    char path[600];
    snprintf (path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen (path, "w");
    assert (file);
    for (size_t i = 0; i < size; i++)
        fputc ('s', file);
    fclose (file);
}

static void s_fake_vmd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    (void) arg;
    sbx_msg_t *request = *request_p;
    sbx_msg_t *reply = NULL;
    if (request->type == SBX_MSG_VM_SNAPSHOT) {
        sbx_vm_snapshot_t *args = sbx_msg_vm_snapshot (request);
        if (__atomic_load_n (&s_vmd_mode, __ATOMIC_SEQ_CST) == 1)
            reply = sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "QEMU would not pause");
        else {
            s_write (args->dir, "disk.qcow2", 300);
            s_write (args->dir, "memory.state", 700);
            reply = sbx_msg_new_reply (request, SBX_MSG_VM_SNAPSHOT_OK);
            sbx_vm_snapshot_ok_t *ok = sbx_msg_vm_snapshot_ok (reply);
            sbx_str_set (&ok->sandbox_id, args->sandbox_id);
            ok->disk_bytes = 300;
            ok->memory_bytes = 700;
            sbx_str_set (&ok->qemu_version, "QEMU test");
        }
    } else {
        if (request->type == SBX_MSG_VM_CREATE) {
            const char *dir = sbx_msg_vm_create (request)->snapshot_dir;
            __atomic_store_n (&s_last_origin[0], 0, __ATOMIC_SEQ_CST);
            if (dir)
                snprintf (s_last_origin, sizeof s_last_origin, "%s", dir);
        }
        reply = brk_testkit_vm_ok (request);
    }
    if (!reply)
        reply = sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "not a vm request");
    sbx_peer_send (peer, &reply);
}

static void s_snapshotd (sbx_peer_t *peer, sbx_msg_t **request_p, void *arg)
{
    snap_server_on_request (peer, request_p, arg);
}

static sbx_msg_t *s_ask (zsock_t *client, sbx_msg_type_t type, const char *id, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    switch (type) {
    case SBX_MSG_SNAPSHOT_SAVE:
        sbx_str_set (&sbx_msg_snapshot_save (request)->sandbox_id, id);
        sbx_str_set (&sbx_msg_snapshot_save (request)->name, "saved");
        break;
    case SBX_MSG_SNAPSHOT_DELETE:
        sbx_str_set (&sbx_msg_snapshot_delete (request)->snapshot_id, id);
        break;
    case SBX_MSG_SNAPSHOT_GET:
        sbx_str_set (&sbx_msg_snapshot_get (request)->snapshot_id, id);
        break;
    case SBX_MSG_SANDBOX_CREATE:
        sbx_str_set (&sbx_msg_sandbox_create (request)->snapshot_id, id);
        break;
    case SBX_MSG_SANDBOX_STOP:
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, id);
        break;
    case SBX_MSG_SANDBOX_DELETE:
        sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, id);
        break;
    default:
        break;
    }
    return brk_testkit_call (client, request, ++s_rid);
}

//  How many of the account's snapshots are in `state` (kind automatic only when asked).
static size_t s_count (zsock_t *client, const char *account, sbx_snapshot_state_t state,
                       bool automatic)
{
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SNAPSHOT_LIST, NULL, account);
    assert (reply->type == SBX_MSG_SNAPSHOT_LIST_OK);
    sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
    size_t count = 0;
    for (size_t i = 0; i < list->count; i++)
        if (list->items[i].state == state &&
            (!automatic || list->items[i].kind == SBX_SNAPSHOT_KIND_AUTOMATIC))
            count++;
    sbx_msg_destroy (&reply);
    return count;
}

//  A create from `snapshot` as an operator (the CLI's way) naming the account by email.
static sbx_msg_t *s_create_as_operator (zsock_t *client, const char *snapshot, const char *email)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&request->caller->account_id, email);
    sbx_str_set (&sbx_msg_sandbox_create (request)->snapshot_id, snapshot);
    return brk_testkit_call (client, request, ++s_rid);
}

//  How many sandboxes snapshotd records as made from `snapshot`.
static size_t s_users (zsock_t *client, const char *snapshot, const char *account)
{
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SNAPSHOT_GET, snapshot, account);
    assert (reply->type == SBX_MSG_SNAPSHOT_GET_OK);
    size_t count = sbx_msg_snapshot_get_ok (reply)->snapshot->users.count;
    sbx_msg_destroy (&reply);
    return count;
}

void snap_broker_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/snap_broker_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    sbx_config_set (config, "plan.free.snapshots", "2");
    zactor_t *broker = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (broker);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    char *alice = brk_testkit_account (client, "alice@example.com", ++s_rid);
    char *bob = brk_testkit_account (client, "bob@example.com", ++s_rid);

    //  No snapshotd yet: saves are unavailable, and say why.
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 8, s_fake_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    sbx_msg_t *reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, NULL, alice);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *one = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, alice);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE &&
            strstr (sbx_msg_error (reply)->message, "snapshotd"));
    sbx_msg_destroy (&reply);

    snap_server_t *store = snap_server_new (config);
    assert (store);
    zactor_t *snapshotd =
        brk_testkit_worker (config, SBX_ROLE_SNAPSHOTD, "snap-1", 0, s_snapshotd, store);
    while (brk_testkit_peer_count (client, SBX_ROLE_SNAPSHOTD, ++s_rid) < 1)
        zclock_sleep (20);

    //  Save: ready, its files in the store; bob can't save or see alice's.
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_SAVE_OK);
    sbx_snapshot_info_t *snap = sbx_msg_snapshot_save_ok (reply)->snapshot;
    assert (snap->state == SBX_SNAPSHOT_STATE_READY && snap->memory_bytes == 700);
    assert (streq (snap->sandbox_id, one) && streq (snap->qemu_version, "QEMU test"));
    char *saved = strdup (snap->id);
    sbx_msg_destroy (&reply);
    char path[600];
    snprintf (path, sizeof path, "%s/snapshots/%s/disk.qcow2", dir, saved);
    struct stat st;
    assert (stat (path, &st) == 0 && st.st_size == 300);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, bob);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    assert (s_count (client, bob, SBX_SNAPSHOT_STATE_READY, false) == 0);
    assert (s_count (client, alice, SBX_SNAPSHOT_STATE_READY, false) == 1);

    //  An operator lists one account's, named by email (sbx snapshot list --account).
    const char *named[] = {"alice@example.com", "nobody@example.com"};
    for (int i = 0; i < 2; i++) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
        request->caller = calloc (1, sizeof (sbx_caller_t));
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
        sbx_str_set (&request->caller->account_id, named[i]);
        reply = brk_testkit_call (client, request, ++s_rid);
        if (i == 0)
            assert (reply->type == SBX_MSG_SNAPSHOT_LIST_OK &&
                    sbx_msg_snapshot_list_ok (reply)->snapshots.count == 1 &&
                    streq (sbx_msg_snapshot_list_ok (reply)->snapshots.items[0].account, alice));
        else
            assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
        sbx_msg_destroy (&reply);
    }

    //  vmd fails the capture: the user hears why; the record is failed, no files.
    __atomic_store_n (&s_vmd_mode, 1, __ATOMIC_SEQ_CST);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, alice);
    assert (brk_testkit_code (reply) == SBX_E_INTERNAL &&
            strstr (sbx_msg_error (reply)->message, "QEMU would not pause"));
    sbx_msg_destroy (&reply);
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);
    assert (s_count (client, alice, SBX_SNAPSHOT_STATE_FAILED, false) == 1);

    //  host-b joins with far more room: new sandboxes go there, but not those made from
    //  the snapshot, whose files are on host-a's host.
    zactor_t *vmd_b = brk_testkit_worker (config, SBX_ROLE_VMD, "host-b", 100, s_fake_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 2)
        zclock_sleep (20);
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, NULL, alice);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    assert (streq (sbx_msg_sandbox_create_ok (reply)->sandbox->vmd, "host-b"));
    char *plain = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    //  An operator names the account by email (the CLI's way): it is alice's snapshot.
    reply = s_create_as_operator (client, saved, "alice@example.com");
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    assert (streq (sbx_msg_sandbox_create_ok (reply)->sandbox->vmd, "host-a"));
    assert (streq (sbx_msg_sandbox_create_ok (reply)->sandbox->account, alice));
    char *by_operator = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    reply = s_create_as_operator (client, saved, "bob@example.com");
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    assert (s_users (client, saved, alice) == 1);
    //  host-a goes away: a create from the snapshot is refused, naming it, and leaves no
    //  use behind; host-b is not a stand-in.
    zactor_destroy (&vmd);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) > 1)
        zclock_sleep (20);
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, saved, alice);
    assert (brk_testkit_code (reply) == SBX_E_UNAVAILABLE);
    assert (strstr (sbx_msg_error (reply)->message, "host-a") &&
            strstr (sbx_msg_error (reply)->message, saved));
    sbx_msg_destroy (&reply);
    for (int tries = 0; tries < 250 && s_users (client, saved, alice) != 1; tries++)
        zclock_sleep (20);
    assert (s_users (client, saved, alice) == 1);
    vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 8, s_fake_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 2)
        zclock_sleep (20);
    const char *done[] = {plain, by_operator};
    for (int i = 0; i < 2; i++) {
        reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, done[i], alice);
        assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
        sbx_msg_destroy (&reply);
    }
    free (plain);
    free (by_operator);

    //  A sandbox from it: vmd is told where the files are; bob can't use it.
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, saved, bob);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, "snap_nothing", alice);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_CREATE, saved, alice);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *clone = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    snprintf (path, sizeof path, "%s/snapshots/%s", dir, saved);
    assert (streq (s_last_origin, path));

    //  The free plan keeps 2 user snapshots here: failed and automatic ones don't count.
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_SAVE_OK);
    char *second = strdup (sbx_msg_snapshot_save_ok (reply)->snapshot->id);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_SAVE, one, alice);
    assert (brk_testkit_code (reply) == SBX_E_LIMIT_EXCEEDED &&
            strstr (sbx_msg_error (reply)->message, "the free plan keeps 2 snapshots"));
    sbx_msg_destroy (&reply);
    assert (s_count (client, alice, SBX_SNAPSHOT_STATE_SAVING, false) == 0);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_DELETE, second, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (second);

    //  Delete: refused while the clone stands on it, naming it; then done.
    reply = s_ask (client, SBX_MSG_SNAPSHOT_DELETE, saved, alice);
    assert (brk_testkit_code (reply) == SBX_E_CONFLICT &&
            strstr (sbx_msg_error (reply)->message, clone));
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_DELETE, saved, bob);
    assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, clone, alice);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_DELETE, saved, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    assert (stat (path, &st) == -1);

    //  A stop keeps an automatic snapshot; the delete of the sandbox takes it along.
    reply = s_ask (client, SBX_MSG_SANDBOX_STOP, one, alice);
    assert (reply->type == SBX_MSG_SANDBOX_STOP_OK);
    sbx_msg_destroy (&reply);
    for (int tries = 0; tries < 250 && !s_count (client, alice, SBX_SNAPSHOT_STATE_READY, true);
         tries++)
        zclock_sleep (20);
    assert (s_count (client, alice, SBX_SNAPSHOT_STATE_READY, true) == 1);
    reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, one, alice);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    for (int tries = 0; tries < 250 && s_count (client, alice, SBX_SNAPSHOT_STATE_READY, true);
         tries++)
        zclock_sleep (20);
    assert (s_count (client, alice, SBX_SNAPSHOT_STATE_READY, true) == 0);

    zactor_destroy (&snapshotd);
    snap_server_destroy (&store);
    zactor_destroy (&vmd);
    zactor_destroy (&vmd_b);
    zsock_destroy (&client);
    zactor_destroy (&broker);
    free (one);
    free (saved);
    free (clone);
    free (alice);
    free (bob);
    sbx_config_destroy (&config);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}
