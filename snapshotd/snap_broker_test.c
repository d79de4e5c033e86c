/*  snap_broker_test - snapshots through the real broker (brk_snapshot, brk_sandbox) and
    the real snapshotd handlers (snap_server) in a worker thread, with a vmd played at
    the protocol level that writes the files vm.snapshot asks for. Here, not in
    snap_server.c: it links the broker, which sbx-snapshotd must not.

    snap_fork_test: fork_sandbox the same way (brk_fork, brk_limits): one capture (live)
    and the copies made from its files on the source's vmd; the capture of kind fork
    hidden from its account and gone with the last copy; every refusal with its code
    (count, another account's, a read-only key, a stopped source, the plan's running and
    starts-per-day limits, the vmd's room) leaving nothing behind; a capture that fails;
    a copy that fails (the others are deleted, the error names them). */
#include "brk_server.h"
#include "brk_testkit.h"
#include "snap_server.h"

#include <stdarg.h>
#include <sys/stat.h>

static uint64_t s_rid = 7000;
static int s_vmd_mode;          //  0: captures work; 1: vm.snapshot fails
static char s_last_origin[512]; //  snapshot_dir of the last vm.create
static int s_live;              //  the last vm.snapshot had live set
static int s_creates;           //  vm.create from a snapshot so far
static int s_fail_create_at;    //  the Nth of those fails (0: none)
static int s_deletes;           //  vm.delete so far

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
        __atomic_store_n (&s_live, args->live, __ATOMIC_SEQ_CST);
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
            ok->paused_ms = 42;
            sbx_str_set (&ok->qemu_version, "QEMU test");
        }
    } else {
        if (request->type == SBX_MSG_VM_CREATE) {
            const char *dir = sbx_msg_vm_create (request)->snapshot_dir;
            __atomic_store_n (&s_last_origin[0], 0, __ATOMIC_SEQ_CST);
            if (dir)
                snprintf (s_last_origin, sizeof s_last_origin, "%s", dir);
            if (dir && __atomic_add_fetch (&s_creates, 1, __ATOMIC_SEQ_CST) ==
                           __atomic_load_n (&s_fail_create_at, __ATOMIC_SEQ_CST))
                reply = sbx_msg_new_error (request->rid, SBX_E_TIMEOUT,
                                           "the restore did not end within 30 s");
        } else if (request->type == SBX_MSG_VM_DELETE)
            __atomic_add_fetch (&s_deletes, 1, __ATOMIC_SEQ_CST);
        if (!reply)
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
    case SBX_MSG_SANDBOX_GET:
        sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, id);
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

//  A broker on a data directory of its own (dir, made here: a mkdtemp template), with
//  the settings given (key, value, ..., NULL), and a client of it.
static zactor_t *s_broker_start (char *dir, sbx_config_t **config_p, zsock_t **client_p, ...)
{
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    sbx_config_set (config, "heartbeat_ms", "100");
    va_list args;
    va_start (args, client_p);
    for (const char *key; (key = va_arg (args, const char *));)
        sbx_config_set (config, key, va_arg (args, const char *));
    va_end (args);
    zactor_t *broker = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (broker);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    *client_p = brk_testkit_dealer (config);
    *config_p = config;
    return broker;
}

//  snapshotd's handlers (*store_p, on the config's data directory) in a worker, connected.
static zactor_t *s_snapshotd_start (sbx_config_t *config, zsock_t *client, snap_server_t **store_p)
{
    *store_p = snap_server_new (config);
    assert (*store_p);
    zactor_t *snapshotd =
        brk_testkit_worker (config, SBX_ROLE_SNAPSHOTD, "snap-1", 0, s_snapshotd, *store_p);
    while (brk_testkit_peer_count (client, SBX_ROLE_SNAPSHOTD, ++s_rid) < 1)
        zclock_sleep (20);
    return snapshotd;
}

//  The broker and its client gone, then its data directory.
static void s_broker_end (zactor_t **broker_p, zsock_t **client_p, sbx_config_t **config_p,
                          const char *dir)
{
    zsock_destroy (client_p);
    zactor_destroy (broker_p);
    sbx_config_destroy (config_p);
    zdir_t *tree = zdir_new (dir, NULL);
    zdir_remove (tree, true);
    zdir_destroy (&tree);
}

void snap_broker_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/snap_broker_test.XXXXXX";
    sbx_config_t *config;
    zsock_t *client;
    zactor_t *broker = s_broker_start (dir, &config, &client, "plan.free.snapshots", "2",
                                       "plan.free.template_bytes", "1000", NULL);
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

    snap_server_t *store = NULL;
    zactor_t *snapshotd = s_snapshotd_start (config, client, &store);

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

    //  Templates: a save labelled sbx.template or sbx.template.cache is refused once the
    //  account's such snapshots hold plan.free.template_bytes (1000 here; each is 1000
    //  bytes); a create names a template and gets its newest snapshot.
    const char *template_labels[] = {"sbx.template", "sbx.template.cache"};
    char *web = NULL;
    for (int i = 0; i < 2; i++) {
        sbx_msg_t *save = sbx_msg_new (SBX_MSG_SNAPSHOT_SAVE);
        save->caller = brk_testkit_caller (alice, "key_a", SBX_KEY_PRESET_FULL);
        sbx_str_set (&sbx_msg_snapshot_save (save)->sandbox_id, one);
        sbx_strmap_set (&sbx_msg_snapshot_save (save)->labels, template_labels[i], "web");
        reply = brk_testkit_call (client, save, ++s_rid);
        if (i == 0) {
            assert (reply->type == SBX_MSG_SNAPSHOT_SAVE_OK);
            web = strdup (sbx_msg_snapshot_save_ok (reply)->snapshot->id);
        } else {
            assert (
                brk_testkit_code (reply) == SBX_E_LIMIT_EXCEEDED &&
                strstr (sbx_msg_error (reply)->message,
                        "the free plan keeps 1000 bytes of templates and cached build steps per "
                        "account, and this account's hold 1000 bytes"));
        }
        sbx_msg_destroy (&reply);
    }
    const char *names[] = {"web", "nosuch"};
    for (int i = 0; i < 2; i++) {
        sbx_msg_t *create = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
        create->caller = brk_testkit_caller (alice, "key_a", SBX_KEY_PRESET_FULL);
        sbx_str_set (&sbx_msg_sandbox_create (create)->template, names[i]);
        reply = brk_testkit_call (client, create, ++s_rid);
        if (i == 1) {
            assert (brk_testkit_code (reply) == SBX_E_NOT_FOUND &&
                    strstr (sbx_msg_error (reply)->message, "no template named 'nosuch'"));
            sbx_msg_destroy (&reply);
            break;
        }
        assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
        char *made = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
        sbx_msg_destroy (&reply);
        snprintf (path, sizeof path, "%s/snapshots/%s", dir, web);
        assert (streq (s_last_origin, path));
        reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, made, alice);
        assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
        sbx_msg_destroy (&reply);
        free (made);
    }
    for (int tries = 0; tries < 250 && s_users (client, web, alice) != 0; tries++)
        zclock_sleep (20);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_DELETE, web, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (web);

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
    s_broker_end (&broker, &client, &config, dir);
    free (one);
    free (saved);
    free (clone);
    free (alice);
    free (bob);
}

//  --------------------------------------------------------------------------
//  Fork

static char *s_account (zsock_t *client, const char *email, const char *plan)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, email);
    sbx_str_set (&sbx_msg_account_create (request)->plan, plan);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    char *id = strdup (sbx_msg_account_create_ok (reply)->account_id);
    sbx_msg_destroy (&reply);
    return id;
}

static sbx_msg_t *s_create_labelled (zsock_t *client, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    sbx_msg_sandbox_create (request)->ttl_s = 600;
    sbx_strmap_set (&sbx_msg_sandbox_create (request)->labels, "team", "web");
    return brk_testkit_call (client, request, ++s_rid);
}

static char *s_create_labelled_id (zsock_t *client, const char *account)
{
    sbx_msg_t *reply = s_create_labelled (client, account);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    char *id = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    sbx_msg_destroy (&reply);
    return id;
}

static sbx_msg_t *s_fork (zsock_t *client, const char *account, sbx_key_preset_t preset,
                          const char *id, uint64_t count)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_FORK);
    request->caller = brk_testkit_caller (account, "key_a", preset);
    sbx_str_set (&sbx_msg_sandbox_fork (request)->sandbox_id, id);
    sbx_msg_sandbox_fork (request)->count = count;
    request->timeout_ms = 60000;
    return brk_testkit_call (client, request, ++s_rid);
}

//  The fork captures in the store, as an operator lists them (users never see them).
static size_t s_forks (zsock_t *client, const char *account, bool as_operator)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    if (as_operator)
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SNAPSHOT_LIST_OK);
    sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
    size_t count = 0;
    for (size_t i = 0; i < list->count; i++)
        count += list->items[i].kind == SBX_SNAPSHOT_KIND_FORK;
    sbx_msg_destroy (&reply);
    return count;
}

//  Sandboxes of the account that are not deleted (or being deleted).
static size_t s_live_sandboxes (zsock_t *client, const char *account)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
    request->caller = brk_testkit_caller (account, "key_a", SBX_KEY_PRESET_FULL);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_LIST_OK);
    sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
    size_t count = 0;
    for (size_t i = 0; i < list->count; i++)
        count += list->items[i].state != SBX_SANDBOX_STATE_DELETING;
    sbx_msg_destroy (&reply);
    return count;
}

static void s_expect (sbx_msg_t **reply_p, sbx_code_t code, const char *text)
{
    sbx_msg_t *reply = *reply_p;
    if (brk_testkit_code (reply) != code ||
        (text && !strstr (sbx_msg_error (reply)->message, text)))
        fprintf (stderr, "got %s: %s\n", sbx_code_name (brk_testkit_code (reply)),
                 reply->type == SBX_MSG_ERROR ? sbx_msg_error (reply)->message : "(ok)");
    assert (brk_testkit_code (reply) == code);
    assert (!text || strstr (sbx_msg_error (reply)->message, text));
    sbx_msg_destroy (reply_p);
}

static void s_wait_forks (zsock_t *client, const char *account, size_t want)
{
    for (int tries = 0; tries < 250 && s_forks (client, account, true) != want; tries++)
        zclock_sleep (20);
    assert (s_forks (client, account, true) == want);
}

void snap_fork_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/snap_fork_test.XXXXXX";
    sbx_config_t *config;
    zsock_t *client;
    zactor_t *broker =
        s_broker_start (dir, &config, &client, "plan.free.running", "0", "plan.free.starts_per_day",
                        "0", "plan.tight.running", "2", "plan.daily.starts_per_day", "2", NULL);
    char *alice = s_account (client, "alice@example.com", "free");
    char *bob = s_account (client, "bob@example.com", "free");
    char *tight = s_account (client, "tight@example.com", "tight");
    char *daily = s_account (client, "daily@example.com", "daily");
    zactor_t *vmd = brk_testkit_worker (config, SBX_ROLE_VMD, "host-a", 10, s_fake_vmd, NULL);
    while (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_rid) < 1)
        zclock_sleep (20);
    char *source = s_create_labelled_id (client, alice);

    //  No snapshotd: a fork is unavailable, and says why.
    sbx_msg_t *reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 1);
    s_expect (&reply, SBX_E_UNAVAILABLE, "snapshotd");
    snap_server_t *store = NULL;
    zactor_t *snapshotd = s_snapshotd_start (config, client, &store);

    //  Two copies: one live capture, then the copies from its files on the source's vmd,
    //  each a sandbox of its own with the source's settings.
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 2);
    assert (reply->type == SBX_MSG_SANDBOX_FORK_OK);
    sbx_sandbox_fork_ok_t *ok = sbx_msg_sandbox_fork_ok (reply);
    assert (__atomic_load_n (&s_live, __ATOMIC_SEQ_CST));
    assert (streq (ok->sandbox->id, source) && ok->sandbox->state == SBX_SANDBOX_STATE_READY);
    assert (ok->sandboxes.count == 2 && ok->paused_ms == 42 && ok->snapshot_id);
    char *copies[2];
    for (size_t i = 0; i < 2; i++) {
        sbx_sandbox_info_t *copy = &ok->sandboxes.items[i];
        assert (copy->state == SBX_SANDBOX_STATE_READY && streq (copy->vmd, "host-a"));
        assert (!streq (copy->id, source) && !streq (copy->label, ok->sandbox->label));
        assert (streq (copy->account, alice));
        assert (copy->labels.count == 1 && streq (sbx_strmap_get (&copy->labels, "team"), "web"));
        assert (copy->expires_ms > copy->created_ms);
        copies[i] = strdup (copy->id);
    }
    assert (!streq (copies[0], copies[1]));
    char *capture = strdup (ok->snapshot_id);
    char path[600];
    snprintf (path, sizeof path, "%s/snapshots/%s", dir, capture);
    assert (streq (s_last_origin, path));
    sbx_msg_destroy (&reply);
    //  The capture: kind fork, hidden from alice's list, standing under both copies.
    assert (s_forks (client, alice, false) == 0 && s_forks (client, alice, true) == 1);
    reply = s_ask (client, SBX_MSG_SNAPSHOT_GET, capture, alice);
    assert (reply->type == SBX_MSG_SNAPSHOT_GET_OK);
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->kind == SBX_SNAPSHOT_KIND_FORK);
    assert (sbx_msg_snapshot_get_ok (reply)->snapshot->users.count == 2);
    sbx_msg_destroy (&reply);

    //  An operator (the CLI on the host) names no account: the copy is the source's.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_FORK);
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&sbx_msg_sandbox_fork (request)->sandbox_id, source);
    reply = brk_testkit_call (client, request, ++s_rid);
    assert (reply->type == SBX_MSG_SANDBOX_FORK_OK);
    assert (streq (sbx_msg_sandbox_fork_ok (reply)->sandboxes.items[0].account, alice));
    char *by_operator = strdup (sbx_msg_sandbox_fork_ok (reply)->sandboxes.items[0].id);
    sbx_msg_destroy (&reply);
    reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, by_operator, alice);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    free (by_operator);
    s_wait_forks (client, alice, 1);

    //  Refusals, each with its code, nothing made.
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 11);
    s_expect (&reply, SBX_E_INVALID_ARGUMENT, "count must be between 1 and 10");
    reply = s_fork (client, bob, SBX_KEY_PRESET_FULL, source, 1);
    s_expect (&reply, SBX_E_NOT_FOUND, NULL);
    reply = s_fork (client, alice, SBX_KEY_PRESET_READ_ONLY, source, 1);
    s_expect (&reply, SBX_E_PERMISSION_DENIED, "read-only");
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, "sb_nothing00", 1);
    s_expect (&reply, SBX_E_NOT_FOUND, NULL);
    //  host-a takes 10: 3 run, so 10 more do not fit (the copies run where the files are).
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 10);
    s_expect (&reply, SBX_E_UNAVAILABLE, "room for 7 more");
    char *stopped = s_create_labelled_id (client, alice);
    reply = s_ask (client, SBX_MSG_SANDBOX_STOP, stopped, alice);
    assert (reply->type == SBX_MSG_SANDBOX_STOP_OK);
    sbx_msg_destroy (&reply);
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, stopped, 1);
    s_expect (&reply, SBX_E_FAILED_PRECONDITION, "resume it first");
    //  Plans: running and starts per day must take all the copies.
    char *small = s_create_labelled_id (client, tight);
    reply = s_fork (client, tight, SBX_KEY_PRESET_FULL, small, 2);
    s_expect (&reply, SBX_E_LIMIT_EXCEEDED, "and 1 is running, so 2 more do not fit");
    char *counted = s_create_labelled_id (client, daily);
    reply = s_fork (client, daily, SBX_KEY_PRESET_FULL, counted, 2);
    s_expect (&reply, SBX_E_DAILY_LIMIT_REACHED, "2 starts per day; 1 left today, 2 asked for");
    assert (s_live_sandboxes (client, tight) == 1 && s_live_sandboxes (client, daily) == 1);
    assert (s_forks (client, tight, true) == 0 && s_forks (client, daily, true) == 0);
    //  Within the plan: one copy, which then counts (a start, and running).
    reply = s_fork (client, tight, SBX_KEY_PRESET_FULL, small, 1);
    assert (reply->type == SBX_MSG_SANDBOX_FORK_OK);
    char *tight_copy = strdup (sbx_msg_sandbox_fork_ok (reply)->sandboxes.items[0].id);
    sbx_msg_destroy (&reply);
    reply = s_fork (client, tight, SBX_KEY_PRESET_FULL, small, 1);
    s_expect (&reply, SBX_E_LIMIT_EXCEEDED, "2 running sandboxes at once");

    //  The capture fails: the fork does, and leaves no record, no files, no copies.
    size_t before = s_live_sandboxes (client, alice);
    __atomic_store_n (&s_vmd_mode, 1, __ATOMIC_SEQ_CST);
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 1);
    s_expect (&reply, SBX_E_INTERNAL, "QEMU would not pause");
    __atomic_store_n (&s_vmd_mode, 0, __ATOMIC_SEQ_CST);
    assert (s_live_sandboxes (client, alice) == before && s_forks (client, alice, true) == 1);

    //  A copy fails to start: all or nothing, the made ones are deleted, the error names
    //  them, and the capture goes with them.
    int deletes = __atomic_load_n (&s_deletes, __ATOMIC_SEQ_CST);
    __atomic_store_n (&s_fail_create_at, __atomic_load_n (&s_creates, __ATOMIC_SEQ_CST) + 2,
                      __ATOMIC_SEQ_CST);
    reply = s_fork (client, alice, SBX_KEY_PRESET_FULL, source, 2);
    assert (brk_testkit_code (reply) == SBX_E_TIMEOUT);
    const char *message = sbx_msg_error (reply)->message;
    assert (strstr (message, "copy 2 of 2") && strstr (message, "the restore did not end"));
    assert (strstr (message, "the copy made (sb_") && strstr (message, ") is being deleted"));
    sbx_msg_destroy (&reply);
    for (int tries = 0; tries < 250 && __atomic_load_n (&s_deletes, __ATOMIC_SEQ_CST) < deletes + 2;
         tries++)
        zclock_sleep (20);
    assert (__atomic_load_n (&s_deletes, __ATOMIC_SEQ_CST) == deletes + 2);
    assert (s_live_sandboxes (client, alice) == before);
    s_wait_forks (client, alice, 1); //  the first fork's, still under its copies

    //  The capture goes, files and all, with its last copy; the source lives on.
    for (size_t i = 0; i < 2; i++) {
        reply = s_ask (client, SBX_MSG_SANDBOX_DELETE, copies[i], alice);
        assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
        sbx_msg_destroy (&reply);
        if (i == 0)
            assert (s_forks (client, alice, true) == 1);
    }
    s_wait_forks (client, alice, 0);
    struct stat st;
    assert (stat (path, &st) == -1);
    reply = s_ask (client, SBX_MSG_SANDBOX_GET, source, alice);
    assert (reply->type == SBX_MSG_SANDBOX_GET_OK &&
            sbx_msg_sandbox_get_ok (reply)->sandbox->state == SBX_SANDBOX_STATE_READY);
    sbx_msg_destroy (&reply);

    zactor_destroy (&snapshotd);
    snap_server_destroy (&store);
    zactor_destroy (&vmd);
    s_broker_end (&broker, &client, &config, dir);
    for (size_t i = 0; i < 2; i++)
        free (copies[i]);
    free (capture);
    free (source);
    free (stopped);
    free (small);
    free (counted);
    free (tight_copy);
    free (alice);
    free (bob);
    free (tight);
    free (daily);
}
