/*  vmd_server_test - vmd_server's self-test, kept apart so that sbx-vmd does not carry
    the broker the test runs: a real broker in a thread, the real sbx-vmd as a child
    process, real guests. */
#include "sbx_secret.h"
#include "vmd_server.h"
#include "vmd_egress.h"

#include <assert.h>
#include <libgen.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

//  --------------------------------------------------------------------------
//  Self test: a real broker (in a thread), the real sbx-vmd (a child process, so that
//  kill -9 is a real crash), real guests under TCG. Everything through the broker.

#include "brk_server.h"
#include "brk_store_priv.h"
#include "brk_testkit.h"

#include <signal.h>
#include <sys/wait.h>

static uint64_t s_test_rid = 1000;
static volatile pid_t s_test_vmd_pid = -1;

//  A failed assertion must not leave the vmd child running.
static void s_test_on_abort (int sig)
{
    (void) sig;
    if (s_test_vmd_pid > 0)
        kill (s_test_vmd_pid, SIGKILL);
}

static pid_t s_test_vmd (const char *dir)
{
    char exe[PATH_MAX] = "";
    ssize_t size = readlink ("/proc/self/exe", exe, sizeof exe - 1);
    assert (size > 0);
    exe[size] = 0;
    char *bin = zsys_sprintf ("%s/sbx-vmd", dirname (exe));
    const char *image = getenv ("SBX_IMAGE_DIR");
    char *image_set = zsys_sprintf ("image_dir=%s", image ? image : "");
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        char *argv[] = {bin,     "--data-dir", (char *) dir, "--instance",       "vmd-test",
                        "--set", image_set,    "--set",      "heartbeat_ms=250", NULL};
        execv (bin, argv);
        _exit (127);
    }
    free (bin);
    free (image_set);
    s_test_vmd_pid = pid;
    signal (SIGABRT, s_test_on_abort);
    return pid;
}

static void s_test_wait_vmd (zsock_t *client, size_t want)
{
    for (int i = 0; i < 300; i++) {
        if (brk_testkit_peer_count (client, SBX_ROLE_VMD, ++s_test_rid) == want)
            return;
        zclock_sleep (50);
    }
    assert (!"vmd did not (dis)appear");
}

static sbx_msg_t *s_test_sandbox (zsock_t *client, sbx_msg_type_t type, const char *id,
                                  sbx_caller_t *caller)
{
    sbx_msg_t *request = sbx_msg_new (type);
    request->caller = caller;
    switch (type) {
    case SBX_MSG_SANDBOX_CREATE:
        break;
    case SBX_MSG_SANDBOX_GET:
        sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, id);
        break;
    case SBX_MSG_SANDBOX_STOP:
        sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, id);
        break;
    case SBX_MSG_SANDBOX_RESUME:
        sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, id);
        break;
    default:
        sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, id);
        break;
    }
    return brk_testkit_call (client, request, ++s_test_rid);
}

//  One agent request through sandbox.agent; returns the agent's decoded answer.
static sbx_msg_t *s_test_agent (zsock_t *client, const char *id, sbx_caller_t *caller,
                                sbx_msg_t **inner_p)
{
    sbx_msg_t *inner = *inner_p;
    inner->rid = 77;
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    assert (sbx_msg_encode (inner, &data, &size, &err) == 0);
    sbx_msg_destroy (inner_p);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    request->caller = caller;
    sbx_str_set (&sbx_msg_sandbox_agent (request)->sandbox_id, id);
    sbx_bytes_set (&sbx_msg_sandbox_agent (request)->request, data, size);
    free (data);
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_test_rid);
    if (reply->type != SBX_MSG_SANDBOX_AGENT_OK) {
        //  The error, for the caller to look at (and for a reader of a failed run: some
        //  are expected).
        if (reply->type == SBX_MSG_ERROR)
            fprintf (stderr, "\n    (sandbox %s: %s: %s)", id,
                     sbx_code_name (sbx_msg_error (reply)->code), sbx_msg_error (reply)->message);
        return reply;
    }
    sbx_bytes_t *bytes = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *answer = sbx_msg_decode (bytes->data, bytes->size, &err);
    assert (answer && answer->rid == 77);
    sbx_msg_destroy (&reply);
    if (answer->type == SBX_MSG_ERROR)
        fprintf (stderr, "\n    (agent of %s: %s: %s)", id,
                 sbx_code_name (sbx_msg_error (answer)->code), sbx_msg_error (answer)->message);
    return answer;
}

static sbx_msg_t *s_test_exec (zsock_t *client, const char *id, sbx_caller_t *caller,
                               const char *command, bool detached)
{
    sbx_msg_t *exec = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_str_set (&sbx_msg_agent_exec (exec)->command, command);
    sbx_msg_agent_exec (exec)->detached = detached;
    return s_test_agent (client, id, caller, &exec);
}

static sbx_msg_t *s_test_status (zsock_t *client, const char *id, sbx_caller_t *caller,
                                 uint64_t pid, uint64_t offset)
{
    sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
    sbx_msg_agent_status (status)->pid = pid;
    sbx_msg_agent_status (status)->stdout_offset = offset;
    return s_test_agent (client, id, caller, &status);
}

//  sandbox.update replacing a sandbox's egress rules with one denied address.
static sbx_msg_t *s_test_egress (zsock_t *client, const char *id, sbx_caller_t *caller,
                                 const char *deny)
{
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    request->caller = caller;
    sbx_sandbox_update_t *args = sbx_msg_sandbox_update (request);
    sbx_str_set (&args->sandbox_id, id);
    args->egress_set = true;
    if (deny)
        sbx_strlist_append (&args->egress_deny, deny);
    return brk_testkit_call (client, request, ++s_test_rid);
}

//  True when the loaded egress table sends uid to a chain of its own.
static bool s_test_egress_loaded (uid_t uid)
{
    char cmd[128], line[512], want[64];
    snprintf (cmd, sizeof cmd, "nft list table inet %s 2>/dev/null", VMD_EGRESS_TABLE);
    snprintf (want, sizeof want, "meta skuid %u jump g_%u", (unsigned) uid, (unsigned) uid);
    FILE *p = popen (cmd, "r");
    bool found = false;
    while (p && fgets (line, sizeof line, p))
        found = found || strstr (line, want);
    if (p)
        pclose (p);
    return found;
}

static pid_t s_test_qemu_pid (const char *dir, const char *id)
{
    char *path = zsys_sprintf ("%s/vms/%s/qemu.pid", dir, id);
    FILE *file = fopen (path, "r");
    free (path);
    int pid = -1;
    if (file) {
        if (fscanf (file, "%d", &pid) != 1)
            pid = -1;
        fclose (file);
    }
    return pid;
}

static bool s_test_exists (const char *dir, const char *id)
{
    char *path = zsys_sprintf ("%s/vms/%s", dir, id);
    struct stat st;
    bool exists = stat (path, &st) == 0;
    free (path);
    return exists;
}

static double s_secs (int64_t since_us)
{
    return (zclock_usecs () - since_us) / 1e6;
}

void vmd_server_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/vmd_server_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    //  Short, so a stopped vmd is missed soon; not so short that a loaded host (ASan,
    //  guests of other tests) makes a busy peer look silent (3 beats) and fails a create.
    sbx_config_set (config, "heartbeat_ms", "250");
    zactor_t *broker = zactor_new (brk_server_actor, config);
    char *status = zstr_recv (broker);
    assert (status && streq (status, "READY"));
    zstr_free (&status);
    zsock_t *client = brk_testkit_dealer (config);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_ACCOUNT_CREATE);
    sbx_str_set (&sbx_msg_account_create (request)->email, "vmd@example.com");
    sbx_msg_t *reply = brk_testkit_call (client, request, ++s_test_rid);
    assert (reply->type == SBX_MSG_ACCOUNT_CREATE_OK);
    char *account = strdup (sbx_msg_account_create_ok (reply)->account_id);
    sbx_msg_destroy (&reply);
#define CALLER brk_testkit_caller (account, "key_vmd", SBX_KEY_PRESET_FULL)

    pid_t vmd = s_test_vmd (dir);
    s_test_wait_vmd (client, 1);

    //  Create: ready only when the agent answers.
    int64_t t0 = zclock_usecs ();
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_CREATE, NULL, CALLER);
    if (reply->type == SBX_MSG_ERROR)
        fprintf (stderr, "create: %s\n", sbx_msg_error (reply)->message);
    assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
    double create_s = s_secs (t0);
    char *one = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
    assert (sbx_msg_sandbox_create_ok (reply)->sandbox->state == SBX_SANDBOX_STATE_READY);
    sbx_msg_destroy (&reply);

    //  python3 in the guest.
    sbx_msg_t *answer = s_test_exec (client, one, CALLER, "python3 -c 'print(2**100)'", false);
    assert (answer->type == SBX_MSG_AGENT_EXEC_OK);
    sbx_agent_exec_ok_t *exec = sbx_msg_agent_exec_ok (answer);
    assert (exec->exit_code == 0 && exec->stdout.size == 32);
    assert (memcmp (exec->stdout.data, "1267650600228229401496703205376\n", 32) == 0);
    sbx_msg_destroy (&answer);

    //  Detached: running, then done with exit 0; offsets give only new output.
    answer = s_test_exec (client, one, CALLER, "sleep 3; echo done", true);
    assert (answer->type == SBX_MSG_AGENT_EXEC_OK && sbx_msg_agent_exec_ok (answer)->running);
    uint64_t bg = sbx_msg_agent_exec_ok (answer)->pid;
    sbx_msg_destroy (&answer);
    answer = s_test_status (client, one, CALLER, bg, 0);
    assert (answer->type == SBX_MSG_AGENT_STATUS_OK && sbx_msg_agent_status_ok (answer)->running);
    sbx_msg_destroy (&answer);
    uint64_t next = 0;
    for (int i = 0; i < 100; i++) {
        answer = s_test_status (client, one, CALLER, bg, 0);
        sbx_agent_status_ok_t *st = sbx_msg_agent_status_ok (answer);
        assert (st);
        if (!st->running) {
            assert (st->exit_code == 0 && st->stdout.size == 5);
            assert (memcmp (st->stdout.data, "done\n", 5) == 0);
            next = st->stdout_next_offset;
            sbx_msg_destroy (&answer);
            break;
        }
        sbx_msg_destroy (&answer);
        zclock_sleep (250);
    }
    assert (next == 5);
    answer = s_test_status (client, one, CALLER, bg, next);
    assert (sbx_msg_agent_status_ok (answer)->stdout.size == 0);
    sbx_msg_destroy (&answer);

    //  A mebibyte of random bytes, in chunks, back byte for byte.
    size_t total = 1 << 20, chunk = 256 * 1024;
    uint8_t *random = malloc (total);
    //  Random bytes: the secret module's generator, 32 at a time.
    for (size_t i = 0; i < total; i += 32) {
        char *token = sbx_secret_token ("", 32);
        memcpy (random + i, token, 32);
        free (token);
        for (size_t j = i; j < i + 32; j++)
            random[j] ^= (uint8_t) sbx_secret_uniform (256);
    }
    for (size_t at = 0; at < total; at += chunk) {
        sbx_msg_t *write = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
        sbx_agent_file_write_t *w = sbx_msg_agent_file_write (write);
        sbx_str_set (&w->path, "/root/data/random.bin");
        sbx_bytes_set (&w->data, random + at, chunk);
        w->offset = at;
        w->truncate = at == 0;
        answer = s_test_agent (client, one, CALLER, &write);
        assert (answer->type == SBX_MSG_AGENT_FILE_WRITE_OK);
        sbx_msg_destroy (&answer);
    }
    for (int pass = 0; pass < 2; pass++) {
        //  Read back before the stop, and again after the resume.
        for (size_t at = 0; at < total; at += 512 * 1024) {
            sbx_msg_t *read = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
            sbx_str_set (&sbx_msg_agent_file_read (read)->path, "/root/data/random.bin");
            sbx_msg_agent_file_read (read)->offset = at;
            sbx_msg_agent_file_read (read)->length = 512 * 1024;
            answer = s_test_agent (client, one, CALLER, &read);
            sbx_agent_file_read_ok_t *r = sbx_msg_agent_file_read_ok (answer);
            assert (r && r->size == total && r->data.size == 512 * 1024);
            assert (memcmp (r->data.data, random + at, 512 * 1024) == 0);
            sbx_msg_destroy (&answer);
        }
        if (pass == 1)
            break;

        //  Stop with a process running; resume; it still runs, the clock is right.
        answer = s_test_exec (client, one, CALLER, "sleep 1000", true);
        bg = sbx_msg_agent_exec_ok (answer)->pid;
        sbx_msg_destroy (&answer);
        pid_t qemu = s_test_qemu_pid (dir, one);
        assert (qemu > 0 && kill (qemu, 0) == 0);
        t0 = zclock_usecs ();
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_STOP, one, CALLER);
        if (reply->type == SBX_MSG_ERROR)
            fprintf (stderr, "stop: %s\n", sbx_msg_error (reply)->message);
        assert (reply->type == SBX_MSG_SANDBOX_STOP_OK);
        printf ("\n    stop %.2f s", s_secs (t0));
        sbx_msg_destroy (&reply);
        assert (kill (qemu, 0) == -1); //  nothing of it runs
        char *state = zsys_sprintf ("%s/vms/%s/memory.state", dir, one);
        struct stat st;
        assert (stat (state, &st) == 0 && st.st_size > (1 << 20));
        printf (" (memory state %.1f MiB)", st.st_size / 1048576.0);
        answer = s_test_exec (client, one, CALLER, "true", false);
        assert (answer->type == SBX_MSG_ERROR);
        sbx_msg_destroy (&answer);
        zclock_sleep (3000); //  the guest's clock stands still meanwhile
        t0 = zclock_usecs ();
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_RESUME, one, CALLER);
        if (reply->type == SBX_MSG_ERROR)
            fprintf (stderr, "resume: %s\n", sbx_msg_error (reply)->message);
        assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
        printf (", resume %.2f s", s_secs (t0));
        sbx_msg_destroy (&reply);
        //  A record behind its guest, as a broker killed between its ask and its record
        //  could leave one: the resume asked again of the running guest is done at once,
        //  not refused (which put the sandbox in error).
        char *file = sbx_config_path (config, "broker/control.db");
        brk_store_t *store = brk_store_new (file);
        free (file);
        char *lag = zsys_sprintf ("UPDATE sandboxes SET state = 'stopped' WHERE id = '%s'", one);
        assert (store && sbx_db_exec (store->db, lag, "test") == 0);
        zstr_free (&lag);
        brk_store_destroy (&store);
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_RESUME, one, CALLER);
        if (reply->type == SBX_MSG_ERROR)
            fprintf (stderr, "resume again: %s\n", sbx_msg_error (reply)->message);
        assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
        assert (sbx_msg_sandbox_resume_ok (reply)->sandbox->state == SBX_SANDBOX_STATE_READY);
        sbx_msg_destroy (&reply);
        assert (stat (state, &st) == -1); //  kept only while stopped
        free (state);
        answer = s_test_status (client, one, CALLER, bg, 0);
        assert (answer->type == SBX_MSG_AGENT_STATUS_OK);
        assert (sbx_msg_agent_status_ok (answer)->running);
        sbx_msg_destroy (&answer);
        answer = s_test_exec (client, one, CALLER, "date +%s%3N", false);
        assert (answer->type == SBX_MSG_AGENT_EXEC_OK);
        long long guest_ms = atoll ((char *) sbx_msg_agent_exec_ok (answer)->stdout.data);
        long long skew = guest_ms - (long long) sbx_clock_now_ms ();
        printf (", guest clock %+lld ms", skew);
        assert (llabs (skew) < 3000);
        sbx_msg_destroy (&answer);
    }
    free (random);

    //  QEMU killed under a ready guest: the broker shows it in error, with why.
    pid_t qemu = s_test_qemu_pid (dir, one);
    assert (qemu > 0 && kill (qemu, SIGKILL) == 0);
    const char *reason = NULL;
    for (int i = 0; i < 100 && !reason; i++) {
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_GET, one, CALLER);
        sbx_sandbox_info_t *info = sbx_msg_sandbox_get_ok (reply)->sandbox;
        if (info->state == SBX_SANDBOX_STATE_ERROR) {
            assert (info->reason && strstr (info->reason, "QEMU"));
            printf ("\n    killed QEMU: %.120s", info->reason);
            reason = "seen";
        }
        sbx_msg_destroy (&reply);
        if (!reason)
            zclock_sleep (50);
    }
    assert (reason);
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_DELETE, one, CALLER);
    assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
    sbx_msg_destroy (&reply);
    assert (!s_test_exists (dir, one));

    //  vmd crashes with a guest running, one stopped, and one whose QEMU then dies: the
    //  next vmd adopts the first, keeps the second stopped, reports the third.
    char *ids[3];
    uid_t egress_uid = 0, egress_uid_stopped = 0;
    for (int i = 0; i < 3; i++) {
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_CREATE, NULL, CALLER);
        assert (reply->type == SBX_MSG_SANDBOX_CREATE_OK);
        ids[i] = strdup (sbx_msg_sandbox_create_ok (reply)->sandbox->id);
        sbx_msg_destroy (&reply);
    }
    //  As root, each guest's QEMU runs as a uid of its own from the range, which owns its
    //  directory: no guest's QEMU can open another's disk or sockets.
    if (geteuid () == 0) {
        uid_t uids[3];
        for (int i = 0; i < 3; i++) {
            char path[PATH_MAX], line[256];
            snprintf (path, sizeof path, "/proc/%d/status", (int) s_test_qemu_pid (dir, ids[i]));
            FILE *status = fopen (path, "r");
            assert (status);
            unsigned real = 0, effective = 0;
            while (fgets (line, sizeof line, status))
                sscanf (line, "Uid: %u %u", &real, &effective);
            fclose (status);
            snprintf (path, sizeof path, "%s/vms/%s", dir, ids[i]);
            struct stat st;
            assert (stat (path, &st) == 0 && st.st_uid == real && real == effective);
            assert (real >= VMD_SERVER_GUEST_UID_FIRST &&
                    real < VMD_SERVER_GUEST_UID_FIRST + 65536);
            uids[i] = real;
        }
        assert (uids[0] != uids[1] && uids[1] != uids[2] && uids[0] != uids[2]);
        //  Egress rules for a running guest are in the kernel when the update answers;
        //  those of the one about to stop come back at its resume (from the broker).
        for (int i = 0; i < 2; i++) {
            reply = s_test_egress (client, ids[i], CALLER, "198.51.100.9");
            assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK);
            sbx_msg_destroy (&reply);
            assert (s_test_egress_loaded (uids[i]));
        }
        assert (!s_test_egress_loaded (uids[2]));
        egress_uid = uids[0];
        egress_uid_stopped = uids[1];
    }
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_STOP, ids[1], CALLER);
    assert (reply->type == SBX_MSG_SANDBOX_STOP_OK);
    sbx_msg_destroy (&reply);
    //  Stopped, its rules are kept; with new ones (the record only) it resumes under them.
    assert (!egress_uid_stopped || s_test_egress_loaded (egress_uid_stopped));
    kill (vmd, SIGKILL);
    assert (waitpid (vmd, NULL, 0) == vmd);
    qemu = s_test_qemu_pid (dir, ids[2]);
    assert (qemu > 0 && kill (qemu, SIGKILL) == 0);
    s_test_wait_vmd (client, 0);
    vmd = s_test_vmd (dir);
    s_test_wait_vmd (client, 1);
    t0 = zclock_usecs ();
    for (int i = 0; i < 100; i++) {
        answer = s_test_exec (client, ids[0], CALLER, "echo adopted", false);
        if (answer->type == SBX_MSG_AGENT_EXEC_OK)
            break;
        sbx_msg_destroy (&answer);
        zclock_sleep (100);
    }
    assert (answer && answer->type == SBX_MSG_AGENT_EXEC_OK);
    assert (memcmp (sbx_msg_agent_exec_ok (answer)->stdout.data, "adopted\n", 8) == 0);
    sbx_msg_destroy (&answer);
    printf ("\n    re-adopted after a vmd kill -9: agent answered %.2f s after the new vmd",
            s_secs (t0));
    reason = NULL;
    for (int i = 0; i < 100 && !reason; i++) {
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_GET, ids[2], CALLER);
        sbx_sandbox_info_t *info = sbx_msg_sandbox_get_ok (reply)->sandbox;
        if (info->state == SBX_SANDBOX_STATE_ERROR) {
            assert (info->reason && strstr (info->reason, "while vmd was not running"));
            reason = "seen";
        }
        sbx_msg_destroy (&reply);
        if (!reason)
            zclock_sleep (50);
    }
    assert (reason);
    //  The new vmd loaded the rules it kept before the first guest could connect anew.
    assert (!egress_uid || s_test_egress_loaded (egress_uid));
    if (egress_uid_stopped) {
        reply = s_test_egress (client, ids[1], CALLER, NULL); //  stopped: cleared in the record
        assert (reply->type == SBX_MSG_SANDBOX_UPDATE_OK);
        sbx_msg_destroy (&reply);
        assert (s_test_egress_loaded (egress_uid_stopped)); //  vmd hears at the resume
    }
    reply = s_test_sandbox (client, SBX_MSG_SANDBOX_RESUME, ids[1], CALLER);
    assert (reply->type == SBX_MSG_SANDBOX_RESUME_OK);
    sbx_msg_destroy (&reply);
    assert (!egress_uid_stopped || !s_test_egress_loaded (egress_uid_stopped));
    answer = s_test_exec (client, ids[1], CALLER, "echo resumed", false);
    assert (answer->type == SBX_MSG_AGENT_EXEC_OK);
    sbx_msg_destroy (&answer);
    for (int i = 0; i < 3; i++) {
        reply = s_test_sandbox (client, SBX_MSG_SANDBOX_DELETE, ids[i], CALLER);
        assert (reply->type == SBX_MSG_SANDBOX_DELETE_OK);
        sbx_msg_destroy (&reply);
        assert (!s_test_exists (dir, ids[i]));
        free (ids[i]);
    }
    //  Deleted, their rules are gone from the table and the disk.
    assert (!egress_uid || !s_test_egress_loaded (egress_uid));
    char *egress = zsys_sprintf ("%s/egress", dir);
    DIR *egress_dir = opendir (egress);
    assert (egress_dir);
    struct dirent *rules;
    while ((rules = readdir (egress_dir)))
        assert (rules->d_name[0] == '.');
    closedir (egress_dir);
    free (egress);
    //  Nothing of any sandbox is left: vms/ is empty.
    char *vms = zsys_sprintf ("%s/vms", dir);
    DIR *vms_dir = opendir (vms);
    assert (vms_dir);
    struct dirent *entry;
    while ((entry = readdir (vms_dir)))
        assert (entry->d_name[0] == '.');
    closedir (vms_dir);
    free (vms);
    printf ("\n    create->ready %.2f s\n    ", create_s);

    //  A clean exit (and, sanitized, no leaks).
    kill (vmd, SIGTERM);
    int wstatus;
    assert (waitpid (vmd, &wstatus, 0) == vmd);
    assert (WIFEXITED (wstatus) && WEXITSTATUS (wstatus) == 0);
    free (one);
    free (account);
    zsock_destroy (&client);
    zactor_destroy (&broker);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
