/*  cli_sandbox - `sbx sandbox`: sandboxes from the command line, on the sbx host through
    the broker (as an operator) or from anywhere through a service's REST API (cli_rest,
    after `sbx login`).

    The operations REST and the MCP tools offer (schemas/operations.json): create, list,
    get, extend, stop, resume, delete, port, and agent requests (exec, status, kill, ps,
    write, read) relayed to the guest. Each command's options become the operation's
    arguments and are checked with REST's limits (cli_op); --json prints REST's JSON
    (docs/openapi.json), on the host with what only an operator sees added (account, vmd).
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_cp.h"
#include "cli_op.h"
#include "cli_shell.h"
#include "cli_terminal.h"
#include "cli_where.h"
#include "sbx_args.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_STDIN_MAX (12 * 1024 * 1024) //  exec's stdin, before base64

static void s_usage (FILE *out)
{
    fprintf (
        out,
        "usage: sbx sandbox create [--account ACCOUNT] [--name N] [--type small|medium|large]\n"
        "                          [--ttl DURATION] [--no-network] [--label K=V]...\n"
        "                          [--snapshot SNAPSHOT_ID | --template NAME]\n"
        "                          [--auto-resume on|off]\n"
        "                          [--allow-out ENTRY]... [--deny-out ENTRY]...\n"
        "       sbx sandbox list [--account ACCOUNT] [--limit N] [--cursor C]\n"
        "       sbx sandbox get|stop|resume|delete ID\n"
        "       sbx sandbox fork ID [--count N]\n"
        "       sbx sandbox extend ID --ttl DURATION\n"
        "       sbx sandbox update ID [--name N] [--label K=V]... [--auto-resume on|off]\n"
        "                          [--allow-out ENTRY]... [--deny-out ENTRY]... | [--no-egress]\n"
        "       sbx sandbox exec ID [--detach] [--timeout DURATION] [--cwd DIR] [--env K=V]...\n"
        "                        [--no-stdin] -- COMMAND [ARG]...\n"
        "       sbx sandbox status ID PID [--stdout-offset N] [--stderr-offset N]\n"
        "       sbx sandbox kill ID PID [--signal SIGNAL]\n"
        "       sbx sandbox ps ID\n"
        "       sbx sandbox port ID PORT [--public] [--remove]\n"
        "       sbx sandbox write ID PATH [--mode OCTAL] < FILE\n"
        "       sbx sandbox read ID PATH > FILE\n"
        "       sbx sandbox cp LOCAL ID:/PATH | ID:/PATH LOCAL\n"
        "       sbx sandbox shell ID [--cwd DIR] [-- COMMAND [ARG]...]\n"
        "       sbx sandbox top [ID] [--interval SECONDS] [--once]\n"
        "every subcommand takes --data-dir DIR and --json.\n\n"
        "Where: after `sbx login URL` (or with SBX_URL and SBX_API_KEY set) the commands go\n"
        "to that service's REST API as the key's account, from any machine and user. On the\n"
        "sbx host without a profile, or with --data-dir, they go to the local broker as an\n"
        "operator, who sees every account's sandboxes (one account's with list --account)\n"
        "and creates with --account.\n\n"
        "These are the REST API's operations (docs/openapi.json) with its limits: a TTL of\n"
        "60 s to 30 days (ttlSeconds), an exec timeout of 1 to 600 s, files up to 16 MiB.\n"
        "DURATION is 90, 90s, 15m, 2h or 7d. --json prints REST's JSON (camelCase:\n"
        "expiresAt, processId, exitCode, stdoutNextOffset...), one line; on the host a\n"
        "sandbox also has account and vmd.\n"
        "exec runs the command in the guest and exits with its exit code (without --json,\n"
        "its stdout and stderr are passed through). One word after -- is a shell command\n"
        "line for /bin/sh -c (\"make -j2 && ls\"); several words are an argv, passed exactly\n"
        "(-- sh -c 'echo \"$0\"'). A pipe or file on stdin is the command's stdin (up to\n"
        "12 MiB; --no-stdin: none). --detach returns the processId at once, and `status`\n"
        "polls it (pass the offsets it printed to get only new output). kill sends SIGTERM\n"
        "unless --signal names another (KILL, INT, 9...). ps lists the processes exec\n"
        "started (running, then the finished ones the guest keeps), oldest first.\n"
        "port publishes guest port PORT at https://LABEL-PORT.BOX_DOMAIN (private: the\n"
        "key is needed; --public: anyone), --remove unpublishes it.\n"
        "cp copies a file or a directory (its files, directories, links and modes) into\n"
        "the sandbox or out of it, 16 MiB at most; a PATH\n"
        "ending in / takes the source's name.\n"
        "shell opens an interactive terminal in the guest (a login shell, or COMMAND) and\n"
        "exits with its exit code: every key goes to the guest, Ctrl-C and Ctrl-D too, and\n"
        "the window's size follows ours. Leave it as the shell is left (exit, Ctrl-D).\n"
        "top shows CPU (a percent of the sandbox's vCPUs), memory, disk and network of\n"
        "one sandbox, or of every ready one, from the samples its host takes every 5 s,\n"
        "refreshed every --interval seconds (default 5) until Ctrl-C; --once prints them\n"
        "once. On a terminal it redraws the screen; otherwise (or with --json: REST's\n"
        "get_sandbox_metrics answer, one line per sandbox) it prints lines.\n"
        "create --snapshot starts from one of the account's snapshots (sbx snapshot list).\n"
        "fork makes N (1 to 10, default 1) running copies of a ready sandbox with its memory:\n"
        "each runs its processes and has its files, with its own id, hostname, MAC and\n"
        "random state, and bills on its own; the source is paused a moment and runs on. All\n"
        "or nothing (the account's plan must take N more). It prints the copies, as list\n"
        "does; --json: REST's answer {sourceId, sandboxes, pausedMs, captureMs, snapshotId}.\n"
        "--auto-resume (default on): a request to a published port of the stopped sandbox\n"
        "resumes it and is answered once the guest serves it (a private port: only with\n"
        "the owner's key); off, the request gets 503 until it is resumed. update renames,\n"
        "relabels or switches it.\n"
        "--allow-out and --deny-out (each repeatable, at most 64) are its egress rules: a\n"
        "CIDR (203.0.113.0/24), an address or a domain name (example.com: itself and its\n"
        "subdomains; *.example.com is the same). Deny is checked first; with any\n"
        "--allow-out only those destinations (and DNS) are reachable. Host, private and\n"
        "special-purpose addresses never are, whatever the rules. update replaces both\n"
        "lists (a list not given becomes empty); --no-egress clears them. get and list\n"
        "show them (--json: egress {allow, deny}).\n"
        "list prints every sandbox, newest first, fetching a page (100) at a time; --limit N\n"
        "prints one page of N (1 to 1000) and, when there are more, the command for the next\n"
        "on stderr (nextCursor with --json); --cursor C prints the page after C as it came.\n");
}

typedef struct {
    const char *data_dir;
    bool json;
    const char *account, *name, *type, *ttl, *cwd, *timeout, *mode, *snapshot, *signal;
    const char *template_name; //  --template: the account's template (sbx template build)
    const char *stdout_offset, *stderr_offset, *limit, *cursor, *auto_resume, *interval, *count;
    bool no_network, detach, public, remove, no_stdin, once, no_egress;
    zlist_t *labels;    //  "K=V"
    zlist_t *env;       //  "K=V"
    zlist_t *allow_out; //  egress entries, as typed (the gateway or broker checks them)
    zlist_t *deny_out;  //  the same
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
    if (o->template_name)
        rc |= cli_op_set_text (op, "template", o->template_name, "--template");
    if (zlist_size (o->labels))
        rc |= cli_op_set_pairs (op, "labels", o->labels, "--label");
    if (o->no_network)
        rc |= cli_op_set_text (op, "network", "false", "--no-network");
    if (o->auto_resume && !streq (o->auto_resume, "on") && !streq (o->auto_resume, "off")) {
        fprintf (stderr, "--auto-resume is on or off, not '%s'\n", o->auto_resume);
        rc = -1;
    } else if (o->auto_resume)
        rc |= cli_op_set_text (op, "autoResume", streq (o->auto_resume, "on") ? "true" : "false",
                               "--auto-resume");
    if (o->no_egress && (zlist_size (o->allow_out) || zlist_size (o->deny_out))) {
        fprintf (stderr, "--no-egress clears the rules: it does not go with --allow-out or "
                         "--deny-out\n");
        rc = -1;
    } else if (o->no_egress || zlist_size (o->allow_out) || zlist_size (o->deny_out)) {
        //  Both lists, always: an update replaces the two together.
        json_t *allow = json_array (), *deny = json_array ();
        for (char *e = zlist_first (o->allow_out); e; e = zlist_next (o->allow_out))
            json_array_append_new (allow, json_string (e));
        for (char *e = zlist_first (o->deny_out); e; e = zlist_next (o->deny_out))
            json_array_append_new (deny, json_string (e));
        cli_op_option (op, "egress",
                       o->no_egress                ? "--no-egress"
                       : zlist_size (o->allow_out) ? "--allow-out"
                                                   : "--deny-out");
        cli_op_set (op, "egress", json_pack ("{s:o, s:o}", "allow", allow, "deny", deny));
    }
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
    if (o->public)
        rc |= cli_op_set_text (op, "public", "true", "--public");
    if (o->remove)
        rc |= cli_op_set_text (op, "remove", "true", "--remove");
    if (o->limit)
        rc |= cli_op_set_text (op, "limit", o->limit, "--limit");
    if (o->cursor)
        rc |= cli_op_set_text (op, "cursor", o->cursor, "--cursor");
    if (o->count)
        rc |= cli_op_set_text (op, "count", o->count, "--count");
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

//  "  allow-out a,b" for an egress list that is not empty.
static void s_print_egress (json_t *egress, const char *list, const char *word)
{
    json_t *items = json_object_get (egress, list);
    size_t i;
    json_t *item;
    json_array_foreach (items, i, item)
        printf ("%s%s", i ? "," : word, json_string_value (item) ? json_string_value (item) : "?");
}

static void s_print_sandbox (json_t *s)
{
    const char *reason = cli_json_str (s, "reason", NULL);
    printf ("%s  %-9s %-6s %-28s %s%s%s", cli_json_str (s, "id", "?"),
            cli_json_str (s, "state", "?"), cli_json_str (s, "type", "?"),
            cli_json_str (s, "label", "-"), cli_json_str (s, "name", ""), reason ? "  " : "",
            reason ? reason : "");
    json_t *egress = json_object_get (s, "egress");
    s_print_egress (egress, "allow", "  allow-out ");
    s_print_egress (egress, "deny", "  deny-out ");
    printf ("\n");
}

//  create, list, get, extend, stop, resume, delete: a sandbox (or all) in the answer.
static int s_sandboxes (cli_where_t *w, cli_op_t *op, sbx_op_t id, s_opts_t *o)
{
    json_t *answer = NULL;
    //  list: every page, unless one was asked for (--limit, --cursor).
    bool every_page = id == SBX_OP_LIST_SANDBOXES && !o->limit && !o->cursor;
    json_t *pages = every_page ? json_array () : NULL;
    while (true) {
        sbx_msg_t *reply = NULL;
        int rc = cli_where_call (w, op, id, o->account, !o->ttl, &answer, &reply);
        if (rc) {
            json_decref (pages);
            return rc;
        }
        json_t *page = json_object_get (answer, "sandboxes");
        if (reply && reply->type == SBX_MSG_SANDBOX_LIST_OK) {
            sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
            //  sbx_api_answer keeps the broker's order, one for one.
            for (size_t i = 0; i < list->count && i < json_array_size (page); i++)
                s_add_operator (json_array_get (page, i), &list->items[i]);
        } else if (reply)
            s_add_operator (answer, sbx_api_sandbox_info (reply));
        sbx_msg_destroy (&reply);
        const char *next = json_string_value (json_object_get (answer, "nextCursor"));
        if (!every_page)
            break;
        json_array_extend (pages, page);
        if (!next) {
            json_decref (answer);
            answer = json_pack ("{s:o}", "sandboxes", pages);
            break;
        }
        cli_op_set (op, "cursor", json_string (next));
        json_decref (answer);
    }
    json_t *all = json_object_get (answer, "sandboxes");
    const char *next = json_string_value (json_object_get (answer, "nextCursor"));
    //  The command that prints the next page, as this one was asked for.
    if (next && !o->json)
        fprintf (stderr, "more: sbx sandbox list%s%s%s%s --cursor %s\n",
                 o->account ? " --account " : "", o->account ? o->account : "",
                 o->limit ? " --limit " : "", o->limit ? o->limit : "", next);
    if (o->json)
        cli_print_json (answer);
    else {
        size_t i;
        json_t *one;
        if (all)
            json_array_foreach (all, i, one) s_print_sandbox (one);
        else
            s_print_sandbox (answer);
        json_decref (answer);
    }
    return 0;
}

//  fork: the copies, as list prints them (on the host with whose they are and where).
static int s_fork (cli_where_t *w, cli_op_t *op, s_opts_t *o)
{
    json_t *answer = NULL;
    sbx_msg_t *reply = NULL;
    int rc = cli_where_call (w, op, SBX_OP_FORK_SANDBOX, NULL, false, &answer, &reply);
    if (rc)
        return rc;
    json_t *copies = json_object_get (answer, "sandboxes");
    if (reply && reply->type == SBX_MSG_SANDBOX_FORK_OK) {
        sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_fork_ok (reply)->sandboxes;
        for (size_t i = 0; i < list->count && i < json_array_size (copies); i++)
            s_add_operator (json_array_get (copies, i), &list->items[i]);
    }
    sbx_msg_destroy (&reply);
    if (o->json) {
        cli_print_json (answer);
        return 0;
    }
    fprintf (stderr, "forked %s into %zu (paused %lld ms)\n",
             cli_json_str (answer, "sourceId", "?"), json_array_size (copies),
             (long long) json_integer_value (json_object_get (answer, "pausedMs")));
    size_t i;
    json_t *one;
    json_array_foreach (copies, i, one) s_print_sandbox (one);
    json_decref (answer);
    return 0;
}

//  exec's stdin: what a pipe or a file on ours holds (a terminal, /dev/null or nothing
//  is none), as base64 bytes. 0, or -1 said on stderr.
static int s_set_stdin (cli_op_t *op)
{
    struct stat st;
    if (fstat (STDIN_FILENO, &st) != 0 || !(S_ISFIFO (st.st_mode) || S_ISREG (st.st_mode)))
        return 0;
    //  Base64 of this much is about the 16 MiB a request body may be.
    size_t max = S_STDIN_MAX, size = 0, got;
    uint8_t *data = malloc (max + 1);
    if (!data)
        return -1;
    while (size <= max && (got = fread (data + size, 1, max + 1 - size, stdin)) > 0)
        size += got;
    if (size > max) {
        fprintf (stderr,
                 "sbx sandbox exec: stdin is over %d MiB; copy large input with "
                 "sbx sandbox write, then read it from the file (too_large)\n",
                 S_STDIN_MAX / (1024 * 1024));
        free (data);
        return -1;
    }
    if (size) {
        char *b64 = sbx_secret_base64 (data, size);
        cli_op_set (op, "stdin", json_string (b64 ? b64 : ""));
        cli_op_set (op, "stdinEncoding", json_string ("base64"));
        free (b64);
    }
    free (data);
    return 0;
}

//  A streamed exec's end: its exit code, or an error said; the output was written.
typedef struct {
    int code;
    bool ended;
} s_streamed_t;

static void s_text_to (FILE *out, const char *data)
{
    json_t *event = json_loads (data, 0, NULL);
    const char *text = json_string_value (json_object_get (event, "text"));
    if (text) {
        fwrite (text, 1, json_string_length (json_object_get (event, "text")), out);
        fflush (out);
    }
    json_decref (event);
}

static void s_on_exec_event (void *arg, const char *event, const char *data)
{
    s_streamed_t *st = arg;
    if (streq (event, "stdout"))
        s_text_to (stdout, data);
    else if (streq (event, "stderr"))
        s_text_to (stderr, data);
    else if (streq (event, "exit")) {
        json_t *end = json_loads (data, 0, NULL);
        if (json_is_true (json_object_get (end, "timedOut")))
            fprintf (stderr, "sbx: the command timed out and was killed\n");
        st->code = (int) (json_integer_value (json_object_get (end, "exitCode")) & 0xff);
        st->ended = true;
        json_decref (end);
    } else if (streq (event, "error")) {
        json_t *body = json_loads (data, 0, NULL);
        json_t *error = json_object_get (body, "error");
        fprintf (stderr, "sbx: %s (%s)\n", cli_json_str (error, "message", "?"),
                 cli_json_str (error, "code", "internal"));
        st->code = 1;
        st->ended = true;
        json_decref (body);
    }
}

static volatile sig_atomic_t s_interrupted;
static void s_on_interrupt (int signal)
{
    (void) signal;
    s_interrupted = 1;
}

//  A waited exec whose output is written as it comes: through the service's event
//  stream, or on the host by reading the guest's output by offset while it runs. Ctrl-C
//  ends the command (the stream's end kills it; on the host, SIGKILL to its group).
static int s_exec_streamed (cli_where_t *w, cli_op_t *op)
{
    //  Ours, not czmq's: its handler would only make the next request fail.
    zsys_handler_set (NULL);
    struct sigaction action = {0}, old_int, old_term;
    action.sa_handler = s_on_interrupt;
    sigemptyset (&action.sa_mask);
    sigaction (SIGINT, &action, &old_int);
    sigaction (SIGTERM, &action, &old_term);
    s_streamed_t st = {0};
    sbx_err_t err;
    int rc = 0;
    if (w->rest) {
        cli_rest_set_abort (w->rest, &s_interrupted);
        if (cli_rest_stream (w->rest, SBX_OP_EXEC, cli_op_args (op), s_on_exec_event, &st, &err))
            rc = s_interrupted ? 130 : cli_fail (&err);
        else if (!st.ended)
            rc = s_interrupted ? 130 : 1;
        else
            rc = st.code;
        if (rc == 1 && !st.ended && !s_interrupted)
            fprintf (stderr, "sbx: the stream ended before the command did\n");
    } else {
        const char *sandbox_id = sbx_api_sandbox_id (cli_op_args (op));
        sbx_msg_t *request = cli_op_request (op);
        if (!request)
            return 2;
        //  Detached, to be read while it runs, with exec's timeout still.
        sbx_msg_agent_exec (request)->detached = true;
        sbx_msg_agent_exec (request)->timeout_ms =
            (uint64_t) sbx_args_int (SBX_OP_EXEC, cli_op_args (op), "timeout") * 1000;
        sbx_msg_t *reply = cli_op_call (op, w->config, NULL, &request, &err);
        if (!reply)
            return cli_fail (&err);
        uint64_t pid = sbx_msg_agent_exec_ok (reply)->pid, out = 0, errs = 0;
        sbx_msg_destroy (&reply);
        while (!s_interrupted) {
            sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
            sbx_agent_status_t *m = sbx_msg_agent_status (status);
            m->pid = pid;
            m->stdout_offset = out;
            m->stderr_offset = errs;
            m->max_bytes = 64 * 1024;
            reply = cli_op_agent (w->config, sandbox_id, &status, 30000, &err);
            if (!reply) {
                rc = s_interrupted ? 130 : cli_fail (&err);
                break;
            }
            sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
            fwrite (ok->stdout.data ? ok->stdout.data : (uint8_t *) "", 1, ok->stdout.size, stdout);
            fwrite (ok->stderr.data ? ok->stderr.data : (uint8_t *) "", 1, ok->stderr.size, stderr);
            fflush (stdout);
            fflush (stderr);
            out = ok->stdout_next_offset;
            errs = ok->stderr_next_offset;
            bool more = ok->stdout_more || ok->stderr_more;
            bool quiet = !ok->stdout.size && !ok->stderr.size;
            if (!ok->running && !more) {
                if (ok->timed_out)
                    fprintf (stderr, "sbx: the command timed out and was killed\n");
                rc = (int) (ok->exit_code & 0xff);
                sbx_msg_destroy (&reply);
                break;
            }
            sbx_msg_destroy (&reply);
            if (quiet)
                usleep (200 * 1000);
        }
        if (s_interrupted) {
            sbx_msg_t *kill = sbx_msg_new (SBX_MSG_AGENT_KILL);
            sbx_msg_agent_kill (kill)->pid = pid;
            sbx_msg_agent_kill (kill)->signal = SIGKILL;
            sbx_msg_t *killed = cli_op_agent (w->config, sandbox_id, &kill, 10000, &err);
            sbx_msg_destroy (&killed);
            rc = 130;
        }
    }
    sigaction (SIGINT, &old_int, NULL);
    sigaction (SIGTERM, &old_term, NULL);
    return rc;
}

static int s_exec (cli_where_t *w, cli_op_t *op, s_opts_t *o)
{
    if (!o->json && !o->detach)
        return s_exec_streamed (w, op);
    json_t *answer = NULL;
    int rc = cli_where_call (w, op, SBX_OP_EXEC, o->account, !o->ttl, &answer, NULL);
    if (rc)
        return rc;
    if (o->json) {
        cli_print_json (answer);
        return 0;
    }
    int code = 0;
    if (json_is_true (json_object_get (answer, "running")))
        printf ("started process %lld\n",
                (long long) json_integer_value (json_object_get (answer, "processId")));
    else {
        const char *out = cli_json_str (answer, "stdout", ""),
                   *err = cli_json_str (answer, "stderr", "");
        fwrite (out, 1, strlen (out), stdout);
        fwrite (err, 1, strlen (err), stderr);
        if (json_is_true (json_object_get (answer, "timedOut")))
            fprintf (stderr, "sbx: the command timed out and was killed\n");
        code = (int) (json_integer_value (json_object_get (answer, "exitCode")) & 0xff);
    }
    json_decref (answer);
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
        const char *command = cli_json_str (p, "command", "");
        size_t line = strcspn (command, "\n");
        size_t shown = line > 100 ? 100 : line;
        printf ("%-8lld %-10s %-10s %.*s%s\n",
                (long long) json_integer_value (json_object_get (p, "processId")), state,
                json_is_true (json_object_get (p, "detached")) ? "detached" : "foreground",
                (int) shown, command, command[shown] ? "…" : "");
    }
}

//  status, kill, ps and port: REST's answer; kill, ps and port say it in words without
//  --json.
static int s_process (cli_where_t *w, cli_op_t *op, sbx_op_t id, s_opts_t *o, const char *verb)
{
    json_t *answer = NULL;
    int rc = cli_where_call (w, op, id, o->account, !o->ttl, &answer, NULL);
    if (rc)
        return rc;
    if (streq (verb, "kill") && !o->json) {
        printf ("signal %lld sent to process %lld\n",
                (long long) json_integer_value (json_object_get (answer, "signal")),
                (long long) json_integer_value (json_object_get (answer, "processId")));
        json_decref (answer);
    } else if (streq (verb, "ps") && !o->json) {
        s_print_ps (answer);
        json_decref (answer);
    } else if (streq (verb, "port") && !o->json) {
        if (json_is_true (json_object_get (answer, "removed")))
            printf ("port %lld is no longer published\n",
                    (long long) json_integer_value (json_object_get (answer, "port")));
        else
            printf ("%s  (%s)\n", cli_json_str (answer, "url", "?"),
                    json_is_true (json_object_get (answer, "public")) ? "public"
                                                                      : "private: the key needed");
        json_decref (answer);
    } else
        cli_print_json (answer); //  status: the same JSON with or without --json
    return 0;
}

//  The last samples' CPU as a sparkline (▁ idle … █ every vCPU busy).
static void s_spark (json_t *samples, char *out, size_t size)
{
    static const char *bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    size_t n = json_array_size (samples), from = n > 30 ? n - 30 : 0, at = 0;
    out[0] = 0;
    for (size_t i = from; i < n && at + 4 < size; i++) {
        double cpu =
            json_number_value (json_object_get (json_array_get (samples, i), "cpuPercent"));
        int bar = cpu <= 0 ? 0 : cpu >= 100 ? 7 : (int) (cpu / 12.5);
        at += (size_t) snprintf (out + at, size - at, "%s", bars[bar]);
    }
}

//  top without --json: one line per sandbox.
static void s_print_top (json_t *m)
{
    char mem[2][24], disk[2][24], net[2][24], spark[160];
    const char *names[] = {"memoryUsedBytes", "memoryTotalBytes", "diskUsedBytes",
                           "diskTotalBytes",  "networkInBytes",   "networkOutBytes"};
    char (*into[])[24] = {&mem[0], &mem[1], &disk[0], &disk[1], &net[0], &net[1]};
    for (size_t i = 0; i < 6; i++)
        sbx_api_bytes ((uint64_t) json_integer_value (json_object_get (m, names[i])), *into[i],
                       sizeof mem[0]);
    json_t *samples = json_object_get (m, "samples");
    s_spark (samples, spark, sizeof spark);
    if (!json_array_size (samples))
        printf ("%s  %-8s no samples yet%s\n", cli_json_str (m, "sandboxId", "?"),
                cli_json_str (m, "state", "?"),
                json_is_true (json_object_get (m, "sampling")) ? "" : " (sampling is off)");
    else
        printf ("%s  %-8s CPU %5.1f%%  mem %s / %s  disk %s / %s  net in %s out %s  %s\n",
                cli_json_str (m, "sandboxId", "?"), cli_json_str (m, "state", "?"),
                json_number_value (json_object_get (m, "cpuPercent")), mem[0], mem[1], disk[0],
                disk[1], net[0], net[1], spark);
}

//  The ids top shows: the one given, or every ready sandbox (the first 100).
static json_t *s_top_ids (cli_where_t *w, s_opts_t *o, const char *id)
{
    json_t *ids = json_array ();
    if (id) {
        json_array_append_new (ids, json_string (id));
        return ids;
    }
    cli_op_t *list = cli_op_new ("sbx sandbox top", SBX_OP_LIST_SANDBOXES);
    json_t *answer = NULL;
    int rc = list
                 ? cli_where_call (w, list, SBX_OP_LIST_SANDBOXES, o->account, false, &answer, NULL)
                 : 1;
    cli_op_destroy (&list);
    size_t i;
    json_t *s;
    json_array_foreach (json_object_get (answer, "sandboxes"), i, s)
    {
        if (streq (cli_json_str (s, "state", ""), "ready"))
            json_array_append (ids, json_object_get (s, "id"));
    }
    json_decref (answer);
    if (rc) {
        json_decref (ids);
        return NULL;
    }
    return ids;
}

//  top: get_sandbox_metrics of each, every interval (once with --once).
static int s_top (cli_where_t *w, s_opts_t *o, const char *id)
{
    double interval = o->interval ? strtod (o->interval, NULL) : 5;
    if (!(interval >= 0.5 && interval <= 3600)) {
        fprintf (stderr, "sbx sandbox top: --interval is seconds, 0.5 to 3600\n");
        return 2;
    }
    bool screen = !o->json && !o->once && isatty (STDOUT_FILENO);
    while (true) {
        json_t *ids = s_top_ids (w, o, id);
        if (!ids)
            return 1;
        if (screen)
            printf ("\033[H\033[2J");
        if (!o->json && !json_array_size (ids))
            printf ("no ready sandboxes\n");
        size_t i;
        json_t *one;
        json_array_foreach (ids, i, one)
        {
            cli_op_t *op = cli_op_new ("sbx sandbox top", SBX_OP_GET_SANDBOX_METRICS);
            json_t *answer = NULL;
            int rc =
                op && !cli_op_set_text (op, "sandboxId", json_string_value (one), "ID") &&
                        (o->json || !cli_op_set_text (op, "limit", "30", "--limit"))
                    ? cli_where_call (w, op, SBX_OP_GET_SANDBOX_METRICS, NULL, false, &answer, NULL)
                    : 2;
            cli_op_destroy (&op);
            if (rc && id) {
                json_decref (ids);
                return rc;
            }
            if (rc == 0 && o->json)
                cli_print_json (answer); //  (takes it)
            else if (rc == 0) {
                s_print_top (answer);
                json_decref (answer);
            }
        }
        json_decref (ids);
        fflush (stdout);
        if (o->once)
            return 0;
        usleep ((useconds_t) (interval * 1e6));
    }
}

//  write: stdin (at most write_file's 16 MiB) to the guest.
static int s_write (cli_where_t *w, cli_op_t *op, s_opts_t *o, const char *path)
{
    const char *mode = sbx_args_string (SBX_OP_WRITE_FILE, cli_op_args (op), "mode");
    unsigned bits = mode ? (unsigned) strtoul (mode, NULL, 8) : 0; //  checked: octal digits
    uint8_t *data;
    size_t size;
    if (cli_where_slurp (stdin, SBX_XFER_MAX, &data, &size)) {
        fprintf (stderr, "sbx: the file is over write_file's limit of %d MiB (too_large)\n",
                 SBX_XFER_MAX / (1024 * 1024));
        return 1;
    }
    int rc = cli_where_put (w, sbx_api_sandbox_id (cli_op_args (op)), path, data, size, bits);
    free (data);
    if (rc == 0) {
        if (o->json)
            cli_print_json (json_pack ("{s:s, s:I}", "path", path, "size", (json_int_t) size));
        else
            printf ("wrote %zu bytes to %s\n", size, path);
    }
    return rc;
}

//  read: the guest's file (at most read_file's 16 MiB) to stdout, as REST sends it raw.
static int s_read (cli_where_t *w, cli_op_t *op, const char *path)
{
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = cli_where_get (w, sbx_api_sandbox_id (cli_op_args (op)), path, &data, &size);
    if (rc == 0) {
        fwrite (data, 1, size, stdout);
        fflush (stdout);
    }
    free (data);
    return rc;
}

static const struct {
    const char *verb;
    sbx_op_t op;
    int npos; //  positional arguments: ID, then PID or PATH
} s_verbs[] = {{"create", SBX_OP_CREATE_SANDBOX, 0},
               {"list", SBX_OP_LIST_SANDBOXES, 0},
               {"get", SBX_OP_GET_SANDBOX, 1},
               {"extend", SBX_OP_EXTEND_SANDBOX, 1},
               {"update", SBX_OP_UPDATE_SANDBOX, 1},
               {"stop", SBX_OP_STOP_SANDBOX, 1},
               {"resume", SBX_OP_RESUME_SANDBOX, 1},
               {"delete", SBX_OP_DELETE_SANDBOX, 1},
               {"fork", SBX_OP_FORK_SANDBOX, 1},
               {"exec", SBX_OP_EXEC, 1},
               {"status", SBX_OP_COMMAND_STATUS, 2},
               {"kill", SBX_OP_KILL_COMMAND, 2},
               {"ps", SBX_OP_LIST_COMMANDS, 1},
               {"write", SBX_OP_WRITE_FILE, 2},
               {"read", SBX_OP_READ_FILE, 2},
               {"port", SBX_OP_HOST_PORT, 2},
               {"cp", SBX_OP__COUNT, 2},
               {"shell", SBX_OP_OPEN_TERMINAL, 1},
               {"top", SBX_OP_GET_SANDBOX_METRICS, 1},
               {NULL, 0, 0}};

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
                                      {"auto-resume", required_argument, 0, 'A'},
                                      {"allow-out", required_argument, 0, 'W'},
                                      {"deny-out", required_argument, 0, 'X'},
                                      {"no-egress", no_argument, 0, 'Z'},
                                      {"label", required_argument, 0, 'l'},
                                      {"detach", no_argument, 0, 'D'},
                                      {"timeout", required_argument, 0, 'o'},
                                      {"cwd", required_argument, 0, 'c'},
                                      {"env", required_argument, 0, 'e'},
                                      {"stdout-offset", required_argument, 0, 'O'},
                                      {"stderr-offset", required_argument, 0, 'E'},
                                      {"limit", required_argument, 0, 'L'},
                                      {"cursor", required_argument, 0, 'K'},
                                      {"signal", required_argument, 0, 's'},
                                      {"mode", required_argument, 0, 'm'},
                                      {"snapshot", required_argument, 0, 'S'},
                                      {"template", required_argument, 0, 'M'},
                                      {"public", no_argument, 0, 'P'},
                                      {"remove", no_argument, 0, 'R'},
                                      {"no-stdin", no_argument, 0, 'I'},
                                      {"interval", required_argument, 0, 'i'},
                                      {"once", no_argument, 0, '1'},
                                      {"count", required_argument, 0, 'C'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    s_opts_t o = {.labels = zlist_new (),
                  .env = zlist_new (),
                  .allow_out = zlist_new (),
                  .deny_out = zlist_new ()};
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
        case 'A':
            o.auto_resume = optarg;
            break;
        case 'W':
            zlist_append (o.allow_out, optarg);
            break;
        case 'X':
            zlist_append (o.deny_out, optarg);
            break;
        case 'Z':
            o.no_egress = true;
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
        case 'M':
            o.template_name = optarg;
            break;
        case 'O':
            o.stdout_offset = optarg;
            break;
        case 'E':
            o.stderr_offset = optarg;
            break;
        case 'L':
            o.limit = optarg;
            break;
        case 'K':
            o.cursor = optarg;
            break;
        case 's':
            o.signal = optarg;
            break;
        case 'P':
            o.public = true;
            break;
        case 'R':
            o.remove = true;
            break;
        case 'I':
            o.no_stdin = true;
            break;
        case 'i':
            o.interval = optarg;
            break;
        case '1':
            o.once = true;
            break;
        case 'C':
            o.count = optarg;
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
    bool is_shell = streq (verb, "shell"); //  its command after -- is optional
    int npos = is_exec || is_shell ? (nrest > 0 ? 1 : 0) : nrest;
    char **pos = rest;
    char **command = is_exec || is_shell ? rest + npos : NULL;
    int ncommand = is_exec || is_shell ? nrest - npos : 0;
    int v = 0;
    while (s_verbs[v].verb && !streq (s_verbs[v].verb, verb))
        v++;
    bool is_top = streq (verb, "top"); //  its ID is optional
    if (rc < 0 && (!s_verbs[v].verb || (npos != s_verbs[v].npos && !(is_top && npos == 0)))) {
        fprintf (stderr, "sbx sandbox: '%s' with %d argument%s is not a command (see --help)\n",
                 verb, npos, npos == 1 ? "" : "s");
        rc = 2;
    }
    char name[64];
    snprintf (name, sizeof name, "sbx sandbox %s", verb);
    cli_where_t where = {0};
    if (rc < 0 && cli_rest_for (name, o.data_dir, &where.rest))
        rc = 2;
    //  The broker lets an operator create on an account's behalf; REST has no such field:
    //  remotely, the sandbox is the key's account's.
    if (rc < 0 && where.rest && o.account) {
        fprintf (stderr,
                 "%s: --account is the operator's, on the sbx host; through %s the "
                 "sandbox is the API key's account's\n",
                 name, cli_rest_url (where.rest));
        rc = 2;
    } else if (rc < 0 && !where.rest &&
               (streq (verb, "create") ? !o.account : o.account && !streq (verb, "list"))) {
        fprintf (stderr, "%s: %s\n", name,
                 o.account ? "--account goes with create and list" : "--account is required");
        rc = 2;
    }
    if (rc < 0 && is_top) {
        //  Several operations (list, then each one's metrics), on one side.
        if (!where.rest) {
            where.config = sbx_config_new (o.data_dir);
            where.api = where.config ? sbx_api_new (where.config) : NULL;
        }
        rc = where.rest || where.api ? s_top (&where, &o, npos ? pos[0] : NULL) : 1;
        cli_where_close (&where);
        zlist_destroy (&o.labels);
        zlist_destroy (&o.env);
        zlist_destroy (&o.allow_out);
        zlist_destroy (&o.deny_out);
        return rc;
    }
    if (rc < 0 && streq (verb, "cp")) {
        //  Not one operation: several (cp's own), on the same side as the others.
        if (!where.rest) {
            where.config = sbx_config_new (o.data_dir);
            where.api = where.config ? sbx_api_new (where.config) : NULL;
        }
        rc = where.rest || where.api ? cli_cp (&where, pos[0], pos[1]) : 1;
        cli_where_close (&where);
        zlist_destroy (&o.labels);
        zlist_destroy (&o.env);
        zlist_destroy (&o.allow_out);
        zlist_destroy (&o.deny_out);
        return rc;
    }
    cli_op_t *op = rc < 0 ? cli_op_new (name, s_verbs[v].op) : NULL;
    if (rc < 0 && !op)
        rc = 1;
    if (rc < 0 && npos > 0 && cli_op_set_text (op, "sandboxId", pos[0], "ID"))
        rc = 2;
    //  The second positional argument: write's and read's PATH, status's and kill's PID,
    //  port's PORT.
    bool file = streq (verb, "write") || streq (verb, "read");
    bool port = streq (verb, "port");
    if (rc < 0 && npos > 1 &&
        cli_op_set_text (op,
                         file   ? "path"
                         : port ? "port"
                                : "processId",
                         pos[1],
                         file   ? "PATH"
                         : port ? "PORT"
                                : "PID"))
        rc = 2;
    if (rc < 0 && is_exec) {
        if (ncommand == 0) {
            fprintf (stderr, "sbx sandbox exec: give the command after --\n");
            rc = 2;
        } else {
            char *line = cli_shell_command (ncommand, command);
            if (!line || cli_op_set_text (op, "command", line, "COMMAND"))
                rc = 2;
            free (line);
        }
    }
    if (rc < 0 && is_shell && ncommand > 0) {
        char *line = cli_shell_command (ncommand, command);
        if (!line || cli_op_set_text (op, "command", line, "COMMAND"))
            rc = 2;
        free (line);
    }
    if (rc < 0 && s_set_options (op, &o))
        rc = 2;
    if (rc < 0 && is_exec && !o.no_stdin && s_set_stdin (op))
        rc = 1;
    //  REST's limits, before the configuration is read or the broker asked.
    if (rc < 0 && cli_op_check (op))
        rc = 2;
    if (rc < 0 && !where.rest) {
        where.config = sbx_config_new (o.data_dir);
        where.api = where.config ? sbx_api_new (where.config) : NULL;
        if (!where.api)
            rc = 1;
    }
    if (rc >= 0)
        ;
    else if (is_exec)
        rc = s_exec (&where, op, &o);
    else if (is_shell)
        rc = cli_terminal_run (&where, op);
    else if (streq (verb, "status") || streq (verb, "kill") || streq (verb, "ps") || port)
        rc = s_process (&where, op, s_verbs[v].op, &o, verb);
    else if (streq (verb, "write"))
        rc = s_write (&where, op, &o, pos[1]);
    else if (streq (verb, "read"))
        rc = s_read (&where, op, pos[1]);
    else if (streq (verb, "fork"))
        rc = s_fork (&where, op, &o);
    else
        rc = s_sandboxes (&where, op, s_verbs[v].op, &o);
    cli_where_close (&where);
    cli_op_destroy (&op);
    zlist_destroy (&o.labels);
    zlist_destroy (&o.env);
    zlist_destroy (&o.allow_out);
    zlist_destroy (&o.deny_out);
    return rc;
}
