/*  gw_builds - see gw_builds.h */
#include "gw_builds.h"
#include "sbx_api.h"
#include "sbx_args.h"
#include "sbx_secret.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_PER_ACCOUNT 2                        //  builds running at once per account
#define S_PER_GATEWAY 8                        //  and on this gateway
#define S_KEEP_MS     (7LL * 24 * 3600 * 1000) //  how long an ended build is kept
#define S_LOG_CHUNK   (256 * 1024)             //  the most log one answer carries
#define S_ID_CHARS    "0123456789abcdefghijklmnopqrstuvwxyz"

struct gw_builds_t {
    char *dir; //  DIR/gateway/builds; NULL: no data directory (self-tests)
    char *data_dir;
    char *sbx; //  the CLI beside this gateway's binary
};

gw_builds_t *gw_builds_new (sbx_config_t *config)
{
    gw_builds_t *self = calloc (1, sizeof *self);
    if (!self || !config)
        return self;
    self->data_dir = strdup (sbx_config_data_dir (config));
    self->dir = zsys_sprintf ("%s/gateway/builds", self->data_dir);
    char exe[PATH_MAX];
    ssize_t n = readlink ("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr (exe, '/');
        *slash = 0;
        self->sbx = zsys_sprintf ("%s/sbx", exe);
    }
    if (!self->dir || !self->sbx || zsys_dir_create ("%s", self->dir) != 0) {
        sbx_warn ("gateway: cannot use %s for template builds", self->dir ? self->dir : "?");
        free (self->dir);
        self->dir = NULL; //  builds are refused (unavailable); the rest works
    }
    return self;
}

void gw_builds_destroy (gw_builds_t **self_p)
{
    gw_builds_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    free (self->dir);
    free (self->data_dir);
    free (self->sbx);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  A build's files

static char *s_path (gw_builds_t *self, const char *id, const char *file)
{
    return zsys_sprintf ("%s/%s%s%s", self->dir, id, file ? "/" : "", file ? file : "");
}

static json_t *s_load (gw_builds_t *self, const char *id, const char *file)
{
    char *path = s_path (self, id, file);
    json_t *value = path ? json_load_file (path, 0, NULL) : NULL;
    free (path);
    return value;
}

//  Whether the builder still holds the build's lock.
static bool s_running (gw_builds_t *self, const char *id)
{
    char *path = s_path (self, id, "lock");
    int fd = path ? open (path, O_RDWR | O_CLOEXEC) : -1;
    free (path);
    if (fd < 0)
        return false;
    bool held = flock (fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close (fd); //  a lock taken here goes with it
    return held;
}

static int s_remove_one (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void) st, (void) flag, (void) ftw;
    remove (path);
    return 0;
}

//  How long ago the build's directory changed (ms).
static int64_t s_age_ms (gw_builds_t *self, const char *id, int64_t now)
{
    char *path = s_path (self, id, NULL);
    struct stat st;
    int64_t age = path && stat (path, &st) == 0 ? now - (int64_t) st.st_mtime * 1000 : 0;
    free (path);
    return age;
}

//  Counts the builds running (for account, and all), and removes ended ones past their
//  keeping.
static void s_survey (gw_builds_t *self, const char *account, size_t *mine, size_t *all)
{
    *mine = *all = 0;
    DIR *dir = opendir (self->dir);
    struct dirent *entry;
    int64_t now = zclock_time ();
    while (dir && (entry = readdir (dir))) {
        if (strncmp (entry->d_name, "bld_", 4) != 0)
            continue;
        json_t *meta = s_load (self, entry->d_name, "meta.json");
        const char *whose = json_string_value (json_object_get (meta, "account"));
        int64_t made = json_integer_value (json_object_get (meta, "createdMs"));
        if (s_running (self, entry->d_name)) {
            (*all)++;
            *mine += whose && streq (whose, account);
        } else if ((!meta && s_age_ms (self, entry->d_name, now) > 60000) ||
                   (meta && now - made > S_KEEP_MS)) {
            //  (One without meta.json for a minute: a start that failed half-way, not one
            //  another gateway sharing this directory is writing now.)
            char *path = s_path (self, entry->d_name, NULL);
            nftw (path, s_remove_one, 8, FTW_DEPTH | FTW_PHYS);
            free (path);
        }
        json_decref (meta);
    }
    if (dir)
        closedir (dir);
}

static int s_write (const char *path, const void *data, size_t size)
{
    int fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    size_t done = 0;
    while (fd >= 0 && done < size) {
        ssize_t n = write (fd, (const char *) data + done, size - done);
        if (n <= 0)
            break;
        done += (size_t) n;
    }
    int rc = fd >= 0 && done == size ? 0 : -1;
    if (fd >= 0 && close (fd) != 0)
        rc = -1;
    return rc;
}

//  --------------------------------------------------------------------------
//  Starting one

//  The builder, apart from this process: a child in a session of its own takes the lock,
//  then its own child (the builder, reparented away from the gateway, which so never
//  reaps it) runs with the lock inherited. Answers once the lock is taken. 0 or -1.
static int s_spawn (gw_builds_t *self, const char *id, char **argv)
{
    char *lock = s_path (self, id, "lock"), *log = s_path (self, id, "log");
    pid_t child = lock && log ? fork () : -1;
    if (child == 0) {
        setsid ();
        int lock_fd = open (lock, O_RDWR | O_CREAT, 0600);
        int log_fd = open (log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        int null_fd = open ("/dev/null", O_RDONLY);
        if (lock_fd < 0 || log_fd < 0 || null_fd < 0 || flock (lock_fd, LOCK_EX) != 0)
            _exit (1);
        pid_t builder = fork ();
        if (builder == 0) {
            dup2 (null_fd, 0);
            dup2 (log_fd, 1);
            dup2 (log_fd, 2);
            //  Nothing of the gateway's (sockets, TLS keys) goes along but the lock.
            for (int fd = 3; fd < 65536; fd++)
                if (fd != lock_fd)
                    close (fd);
            execv (self->sbx, argv);
            //  (Only async-signal-safe calls after a fork of a threaded process.)
            static const char said[] = "cannot run the template builder (sbx, beside "
                                       "sbx-gateway)\n";
            if (write (2, said, sizeof said - 1) < 0)
                _exit (1);
            _exit (1);
        }
        _exit (builder > 0 ? 0 : 1);
    }
    int status = 0;
    int rc = child > 0 && waitpid (child, &status, 0) == child && WIFEXITED (status) &&
                     WEXITSTATUS (status) == 0
                 ? 0
                 : -1;
    free (lock);
    free (log);
    return rc;
}

//  The build's answer: meta's, state and log from offset on.
static json_t *s_answer (gw_builds_t *self, const char *id, json_t *meta, uint64_t offset)
{
    json_t *result = s_load (self, id, "result.json");
    bool running = !result && s_running (self, id);
    json_t *code = json_object_get (result, "exitCode");
    const char *state = running                                    ? "running"
                        : json_integer_value (code) == 0 && result ? "succeeded"
                                                                   : "failed";
    //  The log from offset, at most S_LOG_CHUNK of it.
    char *path = s_path (self, id, "log");
    FILE *f = path ? fopen (path, "rb") : NULL;
    free (path);
    uint8_t *text = malloc (S_LOG_CHUNK);
    size_t got = 0;
    if (f && text) {
        fseek (f, 0, SEEK_END);
        long size = ftell (f);
        if (size >= 0 && offset > (uint64_t) size)
            offset = (uint64_t) size;
        fseek (f, (long) offset, SEEK_SET);
        got = fread (text, 1, S_LOG_CHUNK, f);
    }
    if (f)
        fclose (f);
    json_t *log = sbx_api_text (text ? text : (const uint8_t *) "", got);
    if (!running && !result) {
        //  The builder stopped without a word: the host or its gateway went down.
        json_decref (log);
        size_t n = got;
        const char *note = "\n(the build stopped before it finished: its gateway or host went "
                           "down; build again)\n";
        uint8_t *both = malloc (n + strlen (note));
        memcpy (both, text ? text : (const uint8_t *) "", n);
        memcpy (both + n, note, strlen (note));
        log = sbx_api_text (both, n + strlen (note));
        free (both);
    }
    free (text);
    json_t *answer = json_pack (
        "{s:s, s:O, s:s, s:o, s:o, s:o, s:O, s:o, s:I}", "id", id, "name",
        json_object_get (meta, "name"), "state", state, "createdAt",
        sbx_api_time ((uint64_t) json_integer_value (json_object_get (meta, "createdMs"))),
        "endedAt",
        result ? sbx_api_time ((uint64_t) json_integer_value (json_object_get (result, "endedMs")))
               : json_null (),
        "exitCode",
        result && json_is_integer (code) ? json_integer (json_integer_value (code)) : json_null (),
        "snapshotId",
        json_object_get (result, "snapshotId") ? json_object_get (result, "snapshotId")
                                               : json_null (),
        "log", log, "logOffset", (json_int_t) (offset + got));
    json_decref (result);
    return answer;
}

sbx_code_t gw_builds_start (gw_builds_t *self, const char *account, json_t *args, const void *body,
                            size_t size, json_t **answer, char *why, size_t why_size)
{
    *answer = NULL;
    if (!self->dir) {
        snprintf (why, why_size, "this gateway cannot run template builds (no builds directory)");
        return SBX_E_UNAVAILABLE;
    }
    const char *name = sbx_args_string (SBX_OP_BUILD_TEMPLATE, args, "name");
    const char *dockerfile = sbx_args_string (SBX_OP_BUILD_TEMPLATE, args, "dockerfile");
    if (!name || streq (name, "sbx")) {
        snprintf (why, why_size,
                  "name: a template's name is 1 to 64 lower-case letters, digits, "
                  "'.', '_' and '-', and not sbx");
        return SBX_E_INVALID_ARGUMENT;
    }
    if (dockerfile && (dockerfile[0] == '/' || strstr (dockerfile, ".."))) {
        snprintf (why, why_size,
                  "dockerfile is a path inside the build context (no leading / "
                  "and no ..)");
        return SBX_E_INVALID_ARGUMENT;
    }
    if (size == 0) {
        snprintf (why, why_size,
                  "the body is the build context: a tar archive holding the Dockerfile "
                  "(tar -cf - -C DIR .)");
        return SBX_E_INVALID_ARGUMENT;
    }
    size_t mine, all;
    s_survey (self, account, &mine, &all);
    if (mine >= S_PER_ACCOUNT || all >= S_PER_GATEWAY) {
        snprintf (why, why_size,
                  mine >= S_PER_ACCOUNT
                      ? "this account has %d template builds running; wait for one to end"
                      : "this gateway runs %d template builds already; try again shortly",
                  mine >= S_PER_ACCOUNT ? S_PER_ACCOUNT : S_PER_GATEWAY);
        return SBX_E_LIMIT_EXCEEDED;
    }
    char id[16] = "bld_";
    for (int i = 0; i < 10; i++)
        id[4 + i] = S_ID_CHARS[sbx_secret_uniform (36)];
    id[14] = 0;
    char *dir = s_path (self, id, NULL), *tar = s_path (self, id, "context.tar"),
         *result = s_path (self, id, "result.json"), *meta_path = s_path (self, id, "meta.json");
    json_t *meta = json_pack ("{s:s, s:s, s:s, s:I, s:s, s:b, s:b}", "id", id, "name", name,
                              "account", account, "createdMs", (json_int_t) zclock_time (),
                              "dockerfile", dockerfile ? dockerfile : "Dockerfile", "noCache",
                              sbx_args_bool (SBX_OP_BUILD_TEMPLATE, args, "noCache"), "public",
                              sbx_args_bool (SBX_OP_BUILD_TEMPLATE, args, "public"));
    char *meta_text = meta ? json_dumps (meta, JSON_COMPACT) : NULL;
    sbx_code_t code = SBX_OK;
    if (!dir || !meta_text || mkdir (dir, 0700) != 0 ||
        s_write (meta_path, meta_text, strlen (meta_text)) != 0 || s_write (tar, body, size) != 0)
        code = SBX_E_INTERNAL;
    else {
        char *argv[20];
        int n = 0;
        argv[n++] = "sbx";
        argv[n++] = "template";
        argv[n++] = "build";
        argv[n++] = (char *) name;
        argv[n++] = "--from-tar";
        argv[n++] = tar;
        argv[n++] = "--result";
        argv[n++] = result;
        argv[n++] = "--account";
        argv[n++] = (char *) account;
        argv[n++] = "--data-dir";
        argv[n++] = self->data_dir;
        if (dockerfile) {
            argv[n++] = "-f";
            argv[n++] = (char *) dockerfile;
        }
        if (sbx_args_bool (SBX_OP_BUILD_TEMPLATE, args, "noCache"))
            argv[n++] = "--no-cache";
        if (sbx_args_bool (SBX_OP_BUILD_TEMPLATE, args, "public"))
            argv[n++] = "--public";
        argv[n] = NULL;
        if (s_spawn (self, id, argv) != 0)
            code = SBX_E_INTERNAL;
    }
    if (code != SBX_OK)
        snprintf (why, why_size, "cannot start the build: %s", strerror (errno));
    else {
        sbx_info ("gateway: template build %s of %s for %s started", id, name, account);
        *answer = s_answer (self, id, meta, 0);
    }
    free (meta_text);
    json_decref (meta);
    free (dir);
    free (tar);
    free (result);
    free (meta_path);
    return code;
}

//  The build id of account, or not_found (another account's reads the same as none).
static sbx_code_t s_get (gw_builds_t *self, const char *account, const char *id, uint64_t offset,
                         json_t **answer, char *why, size_t why_size)
{
    *answer = NULL;
    //  The id's pattern was checked (bld_ and ten of [0-9a-z]): it names a directory.
    json_t *meta = self->dir && id ? s_load (self, id, "meta.json") : NULL;
    const char *whose = json_string_value (json_object_get (meta, "account"));
    if (!whose || !account || !streq (whose, account)) {
        json_decref (meta);
        snprintf (why, why_size,
                  "no template build %s: no gateway of this service holds it (a build is "
                  "kept 7 days after it ends)",
                  id ? id : "");
        return SBX_E_NOT_FOUND;
    }
    *answer = s_answer (self, id, meta, offset);
    json_decref (meta);
    return SBX_OK;
}

sbx_code_t gw_builds_get (gw_builds_t *self, const char *account, json_t *args, json_t **answer,
                          char *why, size_t why_size)
{
    const char *id = sbx_args_string (SBX_OP_GET_TEMPLATE_BUILD, args, "buildId");
    int64_t offset = sbx_args_int (SBX_OP_GET_TEMPLATE_BUILD, args, "logOffset");
    return s_get (self, account, id, offset > 0 ? (uint64_t) offset : 0, answer, why, why_size);
}

sbx_msg_t *gw_builds_serve (gw_builds_t *self, const sbx_msg_t *request)
{
    assert (request->type == SBX_MSG_BUILD_GET);
    const sbx_build_get_t *args = sbx_msg_build_get ((sbx_msg_t *) request);
    const char *id = args->build_id;
    //  The asking gateway checked the id; a peer is untrusted all the same.
    bool valid = id && strlen (id) == 14 && strncmp (id, "bld_", 4) == 0 &&
                 strspn (id + 4, S_ID_CHARS) == 10;
    const char *account = request->caller ? request->caller->account_id : NULL;
    if (!valid)
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT,
                                  "build_id must be bld_ and ten of [0-9a-z]");
    json_t *answer = NULL;
    char why[300];
    sbx_code_t code = s_get (self, account, id, args->log_offset, &answer, why, sizeof why);
    if (code != SBX_OK)
        return sbx_msg_new_error (request->rid, code, "%s", why);
    char *text = json_dumps (answer, JSON_COMPACT);
    json_decref (answer);
    sbx_msg_t *reply = text ? sbx_msg_new_reply (request, SBX_MSG_BUILD_GET_OK) : NULL;
    if (!reply) {
        free (text);
        return sbx_msg_new_error (request->rid, SBX_E_INTERNAL, "out of memory");
    }
    sbx_msg_build_get_ok (reply)->build = text;
    return reply;
}

//  --------------------------------------------------------------------------
//  Self test: refusals without a builder; a build's files read back.

void gw_builds_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/gw_builds_test_XXXXXX";
    assert (mkdtemp (dir));
    gw_builds_t *self = gw_builds_new (NULL);
    assert (self && !self->dir);
    json_t *answer = NULL;
    char why[300];
    json_t *args = json_pack ("{s:s}", "name", "web");
    assert (gw_builds_start (self, "acc_a", args, "x", 1, &answer, why, sizeof why) ==
            SBX_E_UNAVAILABLE);
    self->dir = zsys_sprintf ("%s", dir);
    self->data_dir = strdup (dir);
    self->sbx = strdup ("/nonexistent/sbx");
    assert (gw_builds_start (self, "acc_a", args, "", 0, &answer, why, sizeof why) ==
            SBX_E_INVALID_ARGUMENT);
    assert (strstr (why, "tar archive"));
    json_object_set_new (args, "dockerfile", json_string ("../x"));
    assert (gw_builds_start (self, "acc_a", args, "x", 1, &answer, why, sizeof why) ==
            SBX_E_INVALID_ARGUMENT);
    json_decref (args);

    //  A build's files as a builder leaves them: running while the lock is held, then
    //  its result; another account's is not found.
    const char *id = "bld_0123456789";
    char *path = s_path (self, id, NULL);
    assert (mkdir (path, 0700) == 0);
    free (path);
    path = s_path (self, id, "meta.json");
    const char *meta = "{\"id\":\"bld_0123456789\",\"name\":\"web\",\"account\":\"acc_a\","
                       "\"createdMs\":1700000000000}";
    assert (s_write (path, meta, strlen (meta)) == 0);
    free (path);
    path = s_path (self, id, "log");
    assert (s_write (path, "Step 1/2 : FROM sbx\n", 20) == 0);
    free (path);
    path = s_path (self, id, "lock");
    int fd = open (path, O_RDWR | O_CREAT, 0600);
    free (path);
    assert (fd >= 0 && flock (fd, LOCK_EX) == 0);
    //  (flock's locks are per open file: s_running's own open sees this one held.)
    args = json_pack ("{s:s, s:i}", "buildId", id, "logOffset", 7);
    assert (gw_builds_get (self, "acc_a", args, &answer, why, sizeof why) == SBX_OK);
    assert (streq (json_string_value (json_object_get (answer, "state")), "running"));
    assert (streq (json_string_value (json_object_get (answer, "log")), "2 : FROM sbx\n"));
    assert (json_integer_value (json_object_get (answer, "logOffset")) == 20);
    assert (json_is_null (json_object_get (answer, "exitCode")));
    json_decref (answer);
    assert (gw_builds_get (self, "acc_b", args, &answer, why, sizeof why) == SBX_E_NOT_FOUND);
    close (fd); //  the builder is gone, with no result: failed
    assert (gw_builds_get (self, "acc_a", args, &answer, why, sizeof why) == SBX_OK);
    assert (streq (json_string_value (json_object_get (answer, "state")), "failed"));
    assert (strstr (json_string_value (json_object_get (answer, "log")), "stopped before"));
    json_decref (answer);
    path = s_path (self, id, "result.json");
    const char *result = "{\"exitCode\":0,\"snapshotId\":\"snap_x\",\"endedMs\":1800000001000}";
    assert (s_write (path, result, strlen (result)) == 0);
    free (path);
    assert (gw_builds_get (self, "acc_a", args, &answer, why, sizeof why) == SBX_OK);
    assert (streq (json_string_value (json_object_get (answer, "state")), "succeeded"));
    assert (streq (json_string_value (json_object_get (answer, "snapshotId")), "snap_x"));
    assert (json_integer_value (json_object_get (answer, "exitCode")) == 0);
    json_decref (answer);
    json_decref (args);

    //  The same build asked for by another gateway (build.get): its account's only.
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_BUILD_GET);
    request->rid = 9;
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_API_KEY;
    sbx_str_set (&request->caller->account_id, "acc_a");
    sbx_str_set (&sbx_msg_build_get (request)->build_id, id);
    sbx_msg_build_get (request)->log_offset = 5;
    sbx_msg_t *reply = gw_builds_serve (self, request);
    assert (reply->type == SBX_MSG_BUILD_GET_OK && reply->rid == 9);
    answer = json_loads (sbx_msg_build_get_ok (reply)->build, 0, NULL);
    assert (streq (json_string_value (json_object_get (answer, "state")), "succeeded"));
    assert (streq (json_string_value (json_object_get (answer, "log")), "1/2 : FROM sbx\n"));
    json_decref (answer);
    sbx_msg_destroy (&reply);
    sbx_str_set (&request->caller->account_id, "acc_b");
    reply = gw_builds_serve (self, request);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_NOT_FOUND);
    sbx_msg_destroy (&reply);
    sbx_str_set (&sbx_msg_build_get (request)->build_id, "bld_../../etc");
    reply = gw_builds_serve (self, request);
    assert (reply->type == SBX_MSG_ERROR && sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);

    //  Ended builds past their keeping go at the next start's survey.
    size_t mine, all;
    s_survey (self, "acc_a", &mine, &all);
    assert (mine == 0 && all == 0);
    path = s_path (self, id, NULL);
    struct stat st;
    assert (stat (path, &st) != 0); //  made in 2023, ended: removed
    free (path);
    gw_builds_destroy (&self);
    nftw (dir, s_remove_one, 8, FTW_DEPTH | FTW_PHYS);
}
