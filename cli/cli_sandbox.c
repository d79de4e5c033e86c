/*  cli_sandbox - `sbx sandbox`: an operator's hands on sandboxes, through the broker.

    The same operations MCP clients get from the gateway, for operators and tests:
    create, list, get, stop, resume, delete, and agent requests (exec, status, kill,
    write, read) relayed to the guest.
*/
#include "cli_call.h"
#include "cli_commands.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <unistd.h>

#define S_CHUNK (1024 * 1024) //  the agent's per-request file limit

static void s_usage (FILE *out)
{
    fprintf (
        out,
        "usage: sbx sandbox create --account ACCOUNT [--name N] [--type small|medium|large]\n"
        "                          [--ttl DURATION] [--no-network] [--label K=V]...\n"
        "                          [--snapshot SNAPSHOT_ID]\n"
        "       sbx sandbox list\n"
        "       sbx sandbox get|stop|resume|delete ID\n"
        "       sbx sandbox exec ID [--detach] [--timeout DURATION] [--cwd DIR] [--env K=V]...\n"
        "                        -- COMMAND...\n"
        "       sbx sandbox status ID PID [--stdout-offset N] [--stderr-offset N]\n"
        "       sbx sandbox kill ID PID [--signal N]\n"
        "       sbx sandbox write ID PATH [--mode OCTAL] < FILE\n"
        "       sbx sandbox read ID PATH > FILE\n"
        "every subcommand takes --data-dir DIR and --json.\n\n"
        "Acts as an operator: sees every account's sandboxes. exec runs COMMAND with\n"
        "/bin/sh -c in the guest and exits with its exit code (without --json, its\n"
        "stdout and stderr are passed through); --detach returns the pid at once, and\n"
        "`status` polls it (pass the offsets it printed to get only new output).\n"
        "create --snapshot starts from one of the account's snapshots (sbx snapshot list).\n");
}

typedef struct {
    const char *data_dir;
    bool json;
    const char *account, *name, *type, *ttl, *cwd, *timeout, *mode, *snapshot;
    bool no_network, detach;
    zlist_t *labels; //  "K=V"
    zlist_t *env;    //  "K=V"
    uint64_t stdout_offset, stderr_offset;
    int signal;
} s_opts_t;

static json_t *s_sandbox_json (const sbx_sandbox_info_t *s)
{
    json_t *labels = json_object ();
    for (size_t i = 0; i < s->labels.count; i++)
        json_object_set_new (labels, s->labels.keys[i], json_string (s->labels.values[i]));
    return json_pack ("{s:s, s:s?, s:s?, s:s, s:s, s:s?, s:s?, s:b, s:o, s:o, s:o, s:o, s:s?}",
                      "id", s->id, "name", s->name, "label", s->label, "state",
                      sbx_sandbox_state_name (s->state), "type", sbx_sandbox_type_name (s->type),
                      "account", s->account, "vmd", s->vmd, "no_network", s->no_network, "labels",
                      labels, "created_at", cli_json_time (s->created_ms), "expires_at",
                      cli_json_time (s->expires_ms), "changed_at", cli_json_time (s->changed_ms),
                      "reason", s->reason);
}

static void s_print_sandbox (const sbx_sandbox_info_t *s, bool json)
{
    if (json)
        cli_print_json (s_sandbox_json (s));
    else
        printf ("%s  %-9s %-6s %-28s %s%s%s\n", s->id, sbx_sandbox_state_name (s->state),
                sbx_sandbox_type_name (s->type), s->label ? s->label : "-", s->name ? s->name : "",
                s->reason ? "  " : "", s->reason ? s->reason : "");
}

//  Bytes as a JSON string when they are text, else as base64 under `<key>_base64`.
static void s_set_bytes (json_t *obj, const char *key, const sbx_bytes_t *bytes)
{
    json_t *text =
        json_stringn ((const char *) (bytes->data ? bytes->data : (uint8_t *) ""), bytes->size);
    if (text)
        json_object_set_new (obj, key, text);
    else {
        char name[64];
        snprintf (name, sizeof name, "%s_base64", key);
        char *b64 = sbx_secret_base64url (bytes->data, bytes->size);
        json_object_set_new (obj, name, json_string (b64 ? b64 : ""));
        free (b64);
    }
}

//  One agent request through the broker: returns the agent's reply (an agent.*.ok), or
//  NULL with err set (the broker's, vmd's or the agent's error).
static sbx_msg_t *s_agent (sbx_config_t *config, const char *sandbox_id, sbx_msg_t **inner_p,
                           int timeout_ms, sbx_err_t *err)
{
    uint8_t *data = NULL;
    size_t size = 0;
    if (sbx_msg_encode (*inner_p, &data, &size, err)) {
        sbx_msg_destroy (inner_p);
        return NULL;
    }
    sbx_msg_destroy (inner_p);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    sbx_str_set (&sbx_msg_sandbox_agent (request)->sandbox_id, sandbox_id);
    sbx_msg_sandbox_agent (request)->request.data = data;
    sbx_msg_sandbox_agent (request)->request.size = size;
    sbx_msg_t *reply = cli_call (config, &request, timeout_ms, err);
    if (!reply)
        return NULL;
    sbx_bytes_t *bytes = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *inner = sbx_msg_decode (bytes->data, bytes->size, err);
    sbx_msg_destroy (&reply);
    if (inner && inner->type == SBX_MSG_ERROR) {
        sbx_err_set (err, sbx_msg_error (inner)->code, "%s", sbx_msg_error (inner)->message);
        sbx_msg_destroy (&inner);
    }
    return inner;
}

static int s_parse_kv (zlist_t *list, sbx_strmap_t *map, const char *what)
{
    for (char *kv = zlist_first (list); kv; kv = zlist_next (list)) {
        char *eq = strchr (kv, '=');
        if (!eq || eq == kv) {
            fprintf (stderr, "sbx sandbox: %s '%s' is not KEY=VALUE\n", what, kv);
            return -1;
        }
        *eq = 0;
        sbx_strmap_set (map, kv, eq + 1);
        *eq = '=';
    }
    return 0;
}

static int s_uint (const char *text, uint64_t *value)
{
    char *end;
    errno = 0;
    *value = strtoull (text, &end, 10);
    return errno || end == text || *end || text[0] == '-' ? -1 : 0;
}

static int s_create (sbx_config_t *config, s_opts_t *o)
{
    if (!o->account) {
        fprintf (stderr, "sbx sandbox create: --account is required\n");
        return 2;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
    sbx_sandbox_create_t *args = sbx_msg_sandbox_create (request);
    if (o->type && sbx_sandbox_type_from_name (o->type, &args->type)) {
        fprintf (stderr, "sbx sandbox create: --type is small, medium or large\n");
        sbx_msg_destroy (&request);
        return 2;
    }
    int64_t ttl = o->ttl ? sbx_clock_parse_duration (o->ttl) : 0;
    if (ttl < 0 || s_parse_kv (o->labels, &args->labels, "label")) {
        if (ttl < 0)
            fprintf (stderr, "sbx sandbox create: --ttl '%s' is not a duration\n", o->ttl);
        sbx_msg_destroy (&request);
        return 2;
    }
    args->ttl_s = (uint64_t) ttl;
    sbx_str_set (&args->name, o->name);
    sbx_str_set (&args->snapshot_id, o->snapshot);
    args->no_network = o->no_network;
    request->caller = calloc (1, sizeof (sbx_caller_t));
    request->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_str_set (&request->caller->account_id, o->account);
    sbx_err_t err;
    sbx_msg_t *reply = cli_call (config, &request, 180000, &err);
    if (!reply)
        return cli_fail (&err);
    s_print_sandbox (sbx_msg_sandbox_create_ok (reply)->sandbox, o->json);
    sbx_msg_destroy (&reply);
    return 0;
}

static int s_exec (sbx_config_t *config, s_opts_t *o, const char *id, int argc, char **argv)
{
    if (argc == 0) {
        fprintf (stderr, "sbx sandbox exec: give the command after --\n");
        return 2;
    }
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_agent_exec_t *args = sbx_msg_agent_exec (inner);
    //  The words are joined with spaces for /bin/sh -c, as ssh does.
    size_t len = 0;
    for (int i = 0; i < argc; i++)
        len += strlen (argv[i]) + 1;
    args->command = calloc (1, len + 1);
    for (int i = 0; i < argc; i++) {
        if (i)
            strcat (args->command, " ");
        strcat (args->command, argv[i]);
    }
    int64_t timeout = o->timeout ? sbx_clock_parse_duration (o->timeout) : 120;
    if (timeout < 0 || s_parse_kv (o->env, &args->env, "env")) {
        if (timeout < 0)
            fprintf (stderr, "sbx sandbox exec: --timeout '%s' is not a duration\n", o->timeout);
        sbx_msg_destroy (&inner);
        return 2;
    }
    args->timeout_ms = (uint64_t) timeout * 1000;
    args->detached = o->detach;
    sbx_str_set (&args->cwd, o->cwd);
    sbx_err_t err;
    sbx_msg_t *reply = s_agent (config, id, &inner, (int) (timeout * 1000) + 30000, &err);
    if (!reply)
        return cli_fail (&err);
    sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
    int code = ok->running ? 0 : (int) (ok->exit_code & 0xff);
    if (o->json) {
        json_t *out = json_pack (
            "{s:I, s:b, s:I, s:I, s:b, s:I, s:I, s:b, s:b, s:I}", "pid", (json_int_t) ok->pid,
            "running", ok->running, "exit_code", (json_int_t) ok->exit_code, "signal",
            (json_int_t) ok->signal, "timed_out", ok->timed_out, "stdout_next_offset",
            (json_int_t) ok->stdout_next_offset, "stderr_next_offset",
            (json_int_t) ok->stderr_next_offset, "stdout_truncated", ok->stdout_truncated,
            "stderr_truncated", ok->stderr_truncated, "duration_ms", (json_int_t) ok->duration_ms);
        s_set_bytes (out, "stdout", &ok->stdout);
        s_set_bytes (out, "stderr", &ok->stderr);
        cli_print_json (out);
        code = 0;
    } else if (ok->running)
        printf ("started process %llu\n", (unsigned long long) ok->pid);
    else {
        fwrite (ok->stdout.data ? ok->stdout.data : (uint8_t *) "", 1, ok->stdout.size, stdout);
        fwrite (ok->stderr.data ? ok->stderr.data : (uint8_t *) "", 1, ok->stderr.size, stderr);
        if (ok->timed_out)
            fprintf (stderr, "sbx: the command timed out and was killed\n");
    }
    sbx_msg_destroy (&reply);
    return code;
}

static int s_status (sbx_config_t *config, s_opts_t *o, const char *id, const char *pid_text,
                     bool kill)
{
    uint64_t pid;
    if (s_uint (pid_text, &pid)) {
        fprintf (stderr, "sbx sandbox: '%s' is not a process id\n", pid_text);
        return 2;
    }
    sbx_msg_t *inner;
    if (kill) {
        inner = sbx_msg_new (SBX_MSG_AGENT_KILL);
        sbx_msg_agent_kill (inner)->pid = pid;
        sbx_msg_agent_kill (inner)->signal = o->signal ? o->signal : 15;
    } else {
        inner = sbx_msg_new (SBX_MSG_AGENT_STATUS);
        sbx_msg_agent_status (inner)->pid = pid;
        sbx_msg_agent_status (inner)->stdout_offset = o->stdout_offset;
        sbx_msg_agent_status (inner)->stderr_offset = o->stderr_offset;
    }
    sbx_err_t err;
    sbx_msg_t *reply = s_agent (config, id, &inner, 60000, &err);
    if (!reply)
        return cli_fail (&err);
    if (kill) {
        if (o->json)
            cli_print_json (json_pack ("{s:I, s:b}", "pid", (json_int_t) pid, "killed", 1));
        else
            printf ("signal sent to process %llu\n", (unsigned long long) pid);
    } else {
        sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
        json_t *out = json_pack (
            "{s:I, s:b, s:I, s:I, s:b, s:I, s:I, s:b, s:b}", "pid", (json_int_t) ok->pid, "running",
            ok->running, "exit_code", (json_int_t) ok->exit_code, "signal", (json_int_t) ok->signal,
            "timed_out", ok->timed_out, "stdout_next_offset", (json_int_t) ok->stdout_next_offset,
            "stderr_next_offset", (json_int_t) ok->stderr_next_offset, "stdout_truncated",
            ok->stdout_truncated, "stderr_truncated", ok->stderr_truncated);
        s_set_bytes (out, "stdout", &ok->stdout);
        s_set_bytes (out, "stderr", &ok->stderr);
        cli_print_json (out);
    }
    sbx_msg_destroy (&reply);
    return 0;
}

static int s_write (sbx_config_t *config, s_opts_t *o, const char *id, const char *path)
{
    uint64_t mode = 0644;
    if (o->mode) {
        char *end;
        mode = strtoull (o->mode, &end, 8);
        if (*end || mode > 07777) {
            fprintf (stderr, "sbx sandbox write: --mode is octal, e.g. 0755\n");
            return 2;
        }
    }
    uint8_t *chunk = malloc (S_CHUNK);
    uint64_t offset = 0;
    int rc = 0;
    bool first = true;
    while (rc == 0) {
        size_t got = fread (chunk, 1, S_CHUNK, stdin);
        if (got == 0 && !first)
            break;
        sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
        sbx_agent_file_write_t *args = sbx_msg_agent_file_write (inner);
        sbx_str_set (&args->path, path);
        sbx_bytes_set (&args->data, chunk, got);
        args->offset = offset;
        args->mode = mode;
        args->truncate = first;
        sbx_err_t err;
        sbx_msg_t *reply = s_agent (config, id, &inner, 60000, &err);
        if (!reply)
            rc = cli_fail (&err);
        sbx_msg_destroy (&reply);
        offset += got;
        first = false;
        if (got < S_CHUNK)
            break;
    }
    free (chunk);
    if (rc == 0) {
        if (o->json)
            cli_print_json (json_pack ("{s:s, s:I}", "path", path, "size", (json_int_t) offset));
        else
            printf ("wrote %llu bytes to %s\n", (unsigned long long) offset, path);
    }
    return rc;
}

static int s_read (sbx_config_t *config, const char *id, const char *path)
{
    uint64_t offset = 0;
    while (true) {
        sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
        sbx_str_set (&sbx_msg_agent_file_read (inner)->path, path);
        sbx_msg_agent_file_read (inner)->offset = offset;
        sbx_msg_agent_file_read (inner)->length = S_CHUNK;
        sbx_err_t err;
        sbx_msg_t *reply = s_agent (config, id, &inner, 60000, &err);
        if (!reply)
            return cli_fail (&err);
        sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok (reply);
        if (ok->data.size)
            fwrite (ok->data.data, 1, ok->data.size, stdout);
        offset += ok->data.size;
        bool done = ok->eof || ok->data.size == 0;
        sbx_msg_destroy (&reply);
        if (done)
            break;
    }
    fflush (stdout);
    return 0;
}

int cli_sandbox_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"account", required_argument, 0, 'a'},
                                      {"name", required_argument, 0, 'n'},
                                      {"type", required_argument, 0, 't'},
                                      {"ttl", required_argument, 0, 'T'},
                                      {"no-network", no_argument, 0, 'N'},
                                      {"label", required_argument, 0, 'l'},
                                      {"detach", no_argument, 0, 'D'},
                                      {"timeout", required_argument, 0, 'o'},
                                      {"cwd", required_argument, 0, 'c'},
                                      {"env", required_argument, 0, 'e'},
                                      {"stdout-offset", required_argument, 0, 'O'},
                                      {"stderr-offset", required_argument, 0, 'E'},
                                      {"signal", required_argument, 0, 's'},
                                      {"mode", required_argument, 0, 'm'},
                                      {"snapshot", required_argument, 0, 'S'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    s_opts_t o = {.labels = zlist_new (), .env = zlist_new ()};
    int c, rc = -1;
    uint64_t number;
    optind = 1;
    //  Options may come before or after the positional arguments; everything after `--`
    //  is exec's command, left alone.
    while (rc < 0 && (c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            o.data_dir = optarg;
            break;
        case 'j':
            o.json = true;
            break;
        case 'a':
            o.account = optarg;
            break;
        case 'n':
            o.name = optarg;
            break;
        case 't':
            o.type = optarg;
            break;
        case 'T':
            o.ttl = optarg;
            break;
        case 'N':
            o.no_network = true;
            break;
        case 'l':
            zlist_append (o.labels, optarg);
            break;
        case 'D':
            o.detach = true;
            break;
        case 'o':
            o.timeout = optarg;
            break;
        case 'c':
            o.cwd = optarg;
            break;
        case 'e':
            zlist_append (o.env, optarg);
            break;
        case 'm':
            o.mode = optarg;
            break;
        case 'S':
            o.snapshot = optarg;
            break;
        case 'O':
        case 'E':
        case 's':
            if (s_uint (optarg, &number)) {
                fprintf (stderr, "sbx sandbox: '%s' is not a number\n", optarg);
                rc = 2;
            } else if (c == 'O')
                o.stdout_offset = number;
            else if (c == 'E')
                o.stderr_offset = number;
            else
                o.signal = (int) number;
            break;
        case 'h':
            s_usage (stdout);
            rc = 0;
            break;
        default:
            s_usage (stderr);
            rc = 2;
            break;
        }
    }
    //  What getopt left: the positional arguments, then (exec) the command after --.
    char **rest = argv + 1 + optind;
    int nrest = argc - 1 - optind;
    bool is_exec = streq (verb, "exec");
    int npos = is_exec ? (nrest > 0 ? 1 : 0) : nrest;
    char **pos = rest;
    char **command = is_exec ? rest + npos : NULL;
    int ncommand = is_exec ? nrest - npos : 0;
    if (rc < 0 && npos > 2) {
        fprintf (stderr, "sbx sandbox %s: too many arguments\n", verb);
        rc = 2;
    }
    sbx_config_t *config = rc < 0 ? sbx_config_new (o.data_dir) : NULL;
    if (rc < 0 && !config)
        rc = 1;
    sbx_msg_type_t simple = streq (verb, "get")      ? SBX_MSG_SANDBOX_GET
                            : streq (verb, "stop")   ? SBX_MSG_SANDBOX_STOP
                            : streq (verb, "resume") ? SBX_MSG_SANDBOX_RESUME
                            : streq (verb, "delete") ? SBX_MSG_SANDBOX_DELETE
                                                     : SBX_MSG__UNKNOWN;
    if (rc >= 0)
        ;
    else if (streq (verb, "create"))
        rc = npos ? 2 : s_create (config, &o);
    else if (streq (verb, "list") && npos == 0) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, 30000, &err);
        if (!reply)
            rc = cli_fail (&err);
        else {
            sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
            if (o.json) {
                json_t *all = json_array ();
                for (size_t i = 0; i < list->count; i++)
                    json_array_append_new (all, s_sandbox_json (&list->items[i]));
                cli_print_json (json_pack ("{s:o}", "sandboxes", all));
            } else
                for (size_t i = 0; i < list->count; i++)
                    s_print_sandbox (&list->items[i], false);
            sbx_msg_destroy (&reply);
            rc = 0;
        }
    } else if (simple != SBX_MSG__UNKNOWN && npos == 1) {
        sbx_msg_t *request = sbx_msg_new (simple);
        //  Each of these is { sandbox_id } (schemas/sandbox.json).
        if (simple == SBX_MSG_SANDBOX_GET)
            sbx_str_set (&sbx_msg_sandbox_get (request)->sandbox_id, pos[0]);
        else if (simple == SBX_MSG_SANDBOX_STOP)
            sbx_str_set (&sbx_msg_sandbox_stop (request)->sandbox_id, pos[0]);
        else if (simple == SBX_MSG_SANDBOX_RESUME)
            sbx_str_set (&sbx_msg_sandbox_resume (request)->sandbox_id, pos[0]);
        else
            sbx_str_set (&sbx_msg_sandbox_delete (request)->sandbox_id, pos[0]);
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, 180000, &err);
        if (!reply)
            rc = cli_fail (&err);
        else {
            sbx_sandbox_info_t *info =
                reply->type == SBX_MSG_SANDBOX_GET_OK    ? sbx_msg_sandbox_get_ok (reply)->sandbox
                : reply->type == SBX_MSG_SANDBOX_STOP_OK ? sbx_msg_sandbox_stop_ok (reply)->sandbox
                : reply->type == SBX_MSG_SANDBOX_RESUME_OK
                    ? sbx_msg_sandbox_resume_ok (reply)->sandbox
                    : sbx_msg_sandbox_delete_ok (reply)->sandbox;
            s_print_sandbox (info, o.json);
            sbx_msg_destroy (&reply);
            rc = 0;
        }
    } else if (streq (verb, "exec") && npos == 1)
        rc = s_exec (config, &o, pos[0], ncommand, command);
    else if ((streq (verb, "status") || streq (verb, "kill")) && npos == 2)
        rc = s_status (config, &o, pos[0], pos[1], streq (verb, "kill"));
    else if (streq (verb, "write") && npos == 2)
        rc = s_write (config, &o, pos[0], pos[1]);
    else if (streq (verb, "read") && npos == 2)
        rc = s_read (config, pos[0], pos[1]);
    else {
        fprintf (stderr, "sbx sandbox: '%s' with %d argument%s is not a command (see --help)\n",
                 verb, npos, npos == 1 ? "" : "s");
        rc = 2;
    }
    sbx_config_destroy (&config);
    zlist_destroy (&o.labels);
    zlist_destroy (&o.env);
    return rc;
}
