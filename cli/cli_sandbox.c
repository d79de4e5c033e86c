/*  cli_sandbox - `sbx sandbox`: an operator's hands on sandboxes, through the broker.

    The operations REST and the MCP tools offer (schemas/operations.json), for operators
    and tests: create, list, get, extend, stop, resume, delete, and agent requests (exec,
    status, kill, ps, write, read) relayed to the guest. Each command's options become the
    operation's arguments and are checked with REST's limits (cli_op); --json prints
    REST's JSON (docs/openapi.json), with what only an operator sees added (account, vmd).
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_op.h"
#include "sbx_args.h"
#include "sbx_xfer.h"

#include <getopt.h>
#include <jansson.h>
#include <unistd.h>

static void s_usage (FILE *out)
{
    fprintf (
        out,
        "usage: sbx sandbox create --account ACCOUNT [--name N] [--type small|medium|large]\n"
        "                          [--ttl DURATION] [--no-network] [--label K=V]...\n"
        "                          [--snapshot SNAPSHOT_ID]\n"
        "       sbx sandbox list\n"
        "       sbx sandbox get|stop|resume|delete ID\n"
        "       sbx sandbox extend ID --ttl DURATION\n"
        "       sbx sandbox exec ID [--detach] [--timeout DURATION] [--cwd DIR] [--env K=V]...\n"
        "                        -- COMMAND...\n"
        "       sbx sandbox status ID PID [--stdout-offset N] [--stderr-offset N]\n"
        "       sbx sandbox kill ID PID [--signal SIGNAL]\n"
        "       sbx sandbox ps ID\n"
        "       sbx sandbox write ID PATH [--mode OCTAL] < FILE\n"
        "       sbx sandbox read ID PATH > FILE\n"
        "every subcommand takes --data-dir DIR and --json.\n\n"
        "Acts as an operator: sees every account's sandboxes. These are the REST API's\n"
        "operations (docs/openapi.json) with its limits: a TTL of 60 s to 30 days\n"
        "(ttlSeconds), an exec timeout of 1 to 600 s, files up to 16 MiB. DURATION is 90,\n"
        "90s, 15m, 2h or 7d. --json prints REST's JSON (camelCase: expiresAt, processId,\n"
        "exitCode, stdoutNextOffset...), one line; a sandbox also has account and vmd.\n"
        "exec runs COMMAND with /bin/sh -c in the guest and exits with its exit code\n"
        "(without --json, its stdout and stderr are passed through); --detach returns the\n"
        "processId at once, and `status` polls it (pass the offsets it printed to get only\n"
        "new output). kill sends SIGTERM unless --signal names another (KILL, INT, 9...).\n"
        "ps lists the processes exec started (running, then the finished ones the guest\n"
        "keeps), oldest first.\n"
        "create --snapshot starts from one of the account's snapshots (sbx snapshot list).\n");
}

typedef struct {
    const char *data_dir;
    bool json;
    const char *account, *name, *type, *ttl, *cwd, *timeout, *mode, *snapshot, *signal;
    const char *stdout_offset, *stderr_offset;
    bool no_network, detach;
    zlist_t *labels; //  "K=V"
    zlist_t *env;    //  "K=V"
} s_opts_t;

//  The options as the operation's arguments, named as REST names them; those the
//  operation lacks are refused by cli_op_check, naming the option.
static int s_set_options (cli_op_t *op, s_opts_t *o)
{
    int rc = 0;
    cli_op_option (op, "ttlSeconds", "--ttl"); //  extend's is required
    if (o->name)
        rc |= cli_op_set_text (op, "name", o->name, "--name");
    if (o->type)
        rc |= cli_op_set_text (op, "type", o->type, "--type");
    if (o->ttl)
        rc |= cli_op_set_duration (op, "ttlSeconds", o->ttl, "--ttl");
    if (o->snapshot)
        rc |= cli_op_set_text (op, "snapshotId", o->snapshot, "--snapshot");
    if (zlist_size (o->labels))
        rc |= cli_op_set_pairs (op, "labels", o->labels, "--label");
    if (o->no_network)
        rc |= cli_op_set_text (op, "network", "false", "--no-network");
    if (o->detach)
        rc |= cli_op_set_text (op, "detached", "true", "--detach");
    if (o->timeout)
        rc |= cli_op_set_duration (op, "timeout", o->timeout, "--timeout");
    if (o->cwd)
        rc |= cli_op_set_text (op, "cwd", o->cwd, "--cwd");
    if (zlist_size (o->env))
        rc |= cli_op_set_pairs (op, "env", o->env, "--env");
    if (o->stdout_offset)
        rc |= cli_op_set_text (op, "stdoutOffset", o->stdout_offset, "--stdout-offset");
    if (o->stderr_offset)
        rc |= cli_op_set_text (op, "stderrOffset", o->stderr_offset, "--stderr-offset");
    if (o->signal)
        rc |= cli_op_set_text (op, "signal", o->signal, "--signal");
    if (o->mode)
        rc |= cli_op_set_text (op, "mode", o->mode, "--mode");
    return rc ? -1 : 0;
}

//  What an operator sees beside REST's sandbox: whose it is and which vmd runs it.
static void s_add_operator (json_t *sandbox, const sbx_sandbox_info_t *s)
{
    if (!sandbox || !s)
        return;
    if (s->account)
        json_object_set_new (sandbox, "account", json_string (s->account));
    if (s->vmd)
        json_object_set_new (sandbox, "vmd", json_string (s->vmd));
}

static void s_print_sandbox (const sbx_sandbox_info_t *s)
{
    printf ("%s  %-9s %-6s %-28s %s%s%s\n", s->id, sbx_sandbox_state_name (s->state),
            sbx_sandbox_type_name (s->type), s->label ? s->label : "-", s->name ? s->name : "",
            s->reason ? "  " : "", s->reason ? s->reason : "");
}

//  create, list, get, extend, stop, resume, delete: a sandbox (or all) in the answer.
static int s_sandboxes (sbx_config_t *config, sbx_api_t *api, cli_op_t *op, s_opts_t *o)
{
    sbx_msg_t *request = cli_op_request (op);
    if (!request)
        return 2;
    //  No --ttl: the broker's default for the account's plan (1 h, bounded by the plan's
    //  maximum) rather than REST's 3600, which a plan with a shorter maximum refuses.
    if (request->type == SBX_MSG_SANDBOX_CREATE && !o->ttl)
        sbx_msg_sandbox_create (request)->ttl_s = 0;
    sbx_err_t err;
    sbx_msg_t *reply = cli_op_call (op, config, o->account, &request, &err);
    if (!reply)
        return cli_fail (&err);
    int rc = 0;
    if (reply->type == SBX_MSG_SANDBOX_LIST_OK) {
        sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
        if (o->json) {
            json_t *answer = cli_op_answer (op, api, reply);
            json_t *all = json_object_get (answer, "sandboxes");
            //  sbx_api_answer keeps the broker's order, one for one.
            for (size_t i = 0; i < list->count && i < json_array_size (all); i++)
                s_add_operator (json_array_get (all, i), &list->items[i]);
            if (answer)
                cli_print_json (answer);
            else
                rc = 1;
        } else
            for (size_t i = 0; i < list->count; i++)
                s_print_sandbox (&list->items[i]);
    } else {
        sbx_sandbox_info_t *info = sbx_api_sandbox_info (reply);
        if (o->json) {
            json_t *answer = cli_op_answer (op, api, reply);
            s_add_operator (answer, info);
            if (answer)
                cli_print_json (answer);
            else
                rc = 1;
        } else if (info)
            s_print_sandbox (info);
    }
    sbx_msg_destroy (&reply);
    return rc;
}

//  The words are joined with spaces for /bin/sh -c, as ssh does: "COMMAND" (fresh).
static char *s_command (int argc, char **argv)
{
    size_t len = 0;
    for (int i = 0; i < argc; i++)
        len += strlen (argv[i]) + 1;
    char *command = calloc (1, len + 1);
    for (int i = 0; command && i < argc; i++) {
        if (i)
            strcat (command, " ");
        strcat (command, argv[i]);
    }
    return command;
}

static int s_exec (sbx_config_t *config, sbx_api_t *api, cli_op_t *op, s_opts_t *o)
{
    sbx_msg_t *request = cli_op_request (op);
    if (!request)
        return 2;
    sbx_err_t err;
    sbx_msg_t *reply = cli_op_call (op, config, NULL, &request, &err);
    if (!reply)
        return cli_fail (&err);
    int code = 0;
    if (o->json) {
        json_t *answer = cli_op_answer (op, api, reply);
        if (answer)
            cli_print_json (answer);
        else
            code = 1;
    } else if (reply->type == SBX_MSG_AGENT_EXEC_OK) {
        sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
        if (ok->running)
            printf ("started process %llu\n", (unsigned long long) ok->pid);
        else {
            fwrite (ok->stdout.data ? ok->stdout.data : (uint8_t *) "", 1, ok->stdout.size, stdout);
            fwrite (ok->stderr.data ? ok->stderr.data : (uint8_t *) "", 1, ok->stderr.size, stderr);
            if (ok->timed_out)
                fprintf (stderr, "sbx: the command timed out and was killed\n");
            code = (int) (ok->exit_code & 0xff);
        }
    } else {
        fprintf (stderr, "sbx sandbox exec: unexpected answer %s\n",
                 sbx_msg_type_name (reply->type));
        code = 1;
    }
    sbx_msg_destroy (&reply);
    return code;
}

//  ps without --json: a line per process.
static void s_print_ps (json_t *answer)
{
    printf ("%-8s %-10s %-10s %s\n", "PID", "STATE", "KIND", "COMMAND");
    size_t i;
    json_t *p;
    json_array_foreach (json_object_get (answer, "processes"), i, p)
    {
        char state[24] = "running";
        if (!json_is_true (json_object_get (p, "running")))
            snprintf (state, sizeof state, "exit %lld",
                      (long long) json_integer_value (json_object_get (p, "exitCode")));
        const char *command = json_string_value (json_object_get (p, "command"));
        size_t line = command ? strcspn (command, "\n") : 0;
        size_t shown = line > 100 ? 100 : line;
        printf ("%-8lld %-10s %-10s %.*s%s\n",
                (long long) json_integer_value (json_object_get (p, "processId")), state,
                json_is_true (json_object_get (p, "detached")) ? "detached" : "foreground",
                (int) shown, command ? command : "", command && command[shown] ? "…" : "");
    }
}

//  status, kill and ps: REST's answer; kill and ps say it in words without --json.
static int s_process (sbx_config_t *config, sbx_api_t *api, cli_op_t *op, s_opts_t *o,
                      const char *verb)
{
    sbx_msg_t *request = cli_op_request (op);
    if (!request)
        return 2;
    sbx_err_t err;
    sbx_msg_t *reply = cli_op_call (op, config, NULL, &request, &err);
    if (!reply)
        return cli_fail (&err);
    json_t *answer = cli_op_answer (op, api, reply);
    sbx_msg_destroy (&reply);
    if (!answer)
        return 1;
    if (streq (verb, "kill") && !o->json) {
        printf ("signal %lld sent to process %lld\n",
                (long long) json_integer_value (json_object_get (answer, "signal")),
                (long long) json_integer_value (json_object_get (answer, "processId")));
        json_decref (answer);
    } else if (streq (verb, "ps") && !o->json) {
        s_print_ps (answer);
        json_decref (answer);
    } else
        cli_print_json (answer); //  status: the same JSON with or without --json
    return 0;
}

//  write: stdin (at most write_file's 16 MiB) to the guest, chunk by chunk (sbx_xfer).
static int s_write (sbx_config_t *config, cli_op_t *op, s_opts_t *o, const char *path)
{
    const char *mode = sbx_args_string (SBX_OP_WRITE_FILE, cli_op_args (op), "mode");
    uint64_t bits = mode ? strtoull (mode, NULL, 8) : 0; //  checked: 1 to 4 octal digits
    //  One byte past the limit tells a file over it from one at it.
    uint8_t *data = malloc (SBX_XFER_MAX + 1);
    if (!data)
        return 1;
    size_t size = 0, got;
    while (size <= SBX_XFER_MAX &&
           (got = fread (data + size, 1, SBX_XFER_MAX + 1 - size, stdin)) > 0)
        size += got;
    if (size > SBX_XFER_MAX) {
        free (data);
        fprintf (stderr, "sbx: the file is over write_file's limit of %d MiB (too_large)\n",
                 SBX_XFER_MAX / (1024 * 1024));
        return 1;
    }
    sbx_xfer_t *xfer = sbx_xfer_new_write (path, data, size, bits);
    free (data);
    if (!xfer)
        return 1;
    const char *sandbox_id = sbx_api_sandbox_id (cli_op_args (op));
    int rc = 0;
    sbx_msg_t *inner;
    while (rc == 0 && (inner = sbx_xfer_next (xfer))) {
        sbx_err_t err;
        sbx_msg_t *reply = cli_op_agent (config, sandbox_id, &inner,
                                         (int) sbx_ops[SBX_OP_WRITE_FILE].deadline_ms, &err);
        if (!reply || sbx_xfer_take (xfer, reply, &err.code, err.message, sizeof err.message))
            rc = cli_fail (&err);
        sbx_msg_destroy (&reply);
    }
    if (rc == 0) {
        if (o->json)
            cli_print_json (json_pack ("{s:s, s:I}", "path", path, "size", (json_int_t) size));
        else
            printf ("wrote %zu bytes to %s\n", size, path);
    }
    sbx_xfer_destroy (&xfer);
    return rc;
}

//  read: the guest's file (at most read_file's 16 MiB) to stdout, as REST sends it raw.
static int s_read (sbx_config_t *config, cli_op_t *op, const char *path)
{
    sbx_xfer_t *xfer = sbx_xfer_new_read (path);
    if (!xfer)
        return 1;
    const char *sandbox_id = sbx_api_sandbox_id (cli_op_args (op));
    int rc = 0;
    sbx_msg_t *inner;
    while (rc == 0 && (inner = sbx_xfer_next (xfer))) {
        sbx_err_t err;
        sbx_msg_t *reply = cli_op_agent (config, sandbox_id, &inner,
                                         (int) sbx_ops[SBX_OP_READ_FILE].deadline_ms, &err);
        if (!reply || sbx_xfer_take (xfer, reply, &err.code, err.message, sizeof err.message))
            rc = cli_fail (&err);
        sbx_msg_destroy (&reply);
    }
    if (rc == 0) {
        fwrite (sbx_xfer_data (xfer), 1, sbx_xfer_size (xfer), stdout);
        fflush (stdout);
    }
    sbx_xfer_destroy (&xfer);
    return rc;
}

static const struct {
    const char *verb;
    sbx_op_t op;
    int npos; //  positional arguments: ID, then PID or PATH
} s_verbs[] = {{"create", SBX_OP_CREATE_SANDBOX, 0}, {"list", SBX_OP_LIST_SANDBOXES, 0},
               {"get", SBX_OP_GET_SANDBOX, 1},       {"extend", SBX_OP_EXTEND_SANDBOX, 1},
               {"stop", SBX_OP_STOP_SANDBOX, 1},     {"resume", SBX_OP_RESUME_SANDBOX, 1},
               {"delete", SBX_OP_DELETE_SANDBOX, 1}, {"exec", SBX_OP_EXEC, 1},
               {"status", SBX_OP_COMMAND_STATUS, 2}, {"kill", SBX_OP_KILL_COMMAND, 2},
               {"ps", SBX_OP_LIST_COMMANDS, 1},      {"write", SBX_OP_WRITE_FILE, 2},
               {"read", SBX_OP_READ_FILE, 2},        {NULL, 0, 0}};

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
            o.stdout_offset = optarg;
            break;
        case 'E':
            o.stderr_offset = optarg;
            break;
        case 's':
            o.signal = optarg;
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
    int v = 0;
    while (s_verbs[v].verb && !streq (s_verbs[v].verb, verb))
        v++;
    if (rc < 0 && (!s_verbs[v].verb || npos != s_verbs[v].npos)) {
        fprintf (stderr, "sbx sandbox: '%s' with %d argument%s is not a command (see --help)\n",
                 verb, npos, npos == 1 ? "" : "s");
        rc = 2;
    }
    //  The broker lets an operator create on an account's behalf; REST has no such field.
    if (rc < 0 && !o.account != !streq (verb, "create")) {
        fprintf (stderr, "sbx sandbox %s: %s\n", verb,
                 o.account ? "--account goes with create" : "--account is required");
        rc = 2;
    }
    char name[64];
    snprintf (name, sizeof name, "sbx sandbox %s", verb);
    cli_op_t *op = rc < 0 ? cli_op_new (name, s_verbs[v].op) : NULL;
    if (rc < 0 && !op)
        rc = 1;
    if (rc < 0 && npos > 0 && cli_op_set_text (op, "sandboxId", pos[0], "ID"))
        rc = 2;
    //  The second positional argument: write's and read's PATH, status's and kill's PID.
    bool file = streq (verb, "write") || streq (verb, "read");
    if (rc < 0 && npos > 1 &&
        cli_op_set_text (op, file ? "path" : "processId", pos[1], file ? "PATH" : "PID"))
        rc = 2;
    if (rc < 0 && is_exec) {
        if (ncommand == 0) {
            fprintf (stderr, "sbx sandbox exec: give the command after --\n");
            rc = 2;
        } else {
            char *line = s_command (ncommand, command);
            if (!line || cli_op_set_text (op, "command", line, "COMMAND"))
                rc = 2;
            free (line);
        }
    }
    if (rc < 0 && s_set_options (op, &o))
        rc = 2;
    //  REST's limits, before the configuration is read or the broker asked.
    if (rc < 0 && cli_op_check (op))
        rc = 2;
    sbx_config_t *config = rc < 0 ? sbx_config_new (o.data_dir) : NULL;
    sbx_api_t *api = config ? sbx_api_new (config) : NULL;
    if (rc < 0 && !api)
        rc = 1;
    if (rc >= 0)
        ;
    else if (is_exec)
        rc = s_exec (config, api, op, &o);
    else if (streq (verb, "status") || streq (verb, "kill") || streq (verb, "ps"))
        rc = s_process (config, api, op, &o, verb);
    else if (streq (verb, "write"))
        rc = s_write (config, op, &o, pos[1]);
    else if (streq (verb, "read"))
        rc = s_read (config, op, pos[1]);
    else
        rc = s_sandboxes (config, api, op, &o);
    sbx_api_destroy (&api);
    sbx_config_destroy (&config);
    cli_op_destroy (&op);
    zlist_destroy (&o.labels);
    zlist_destroy (&o.env);
    return rc;
}
