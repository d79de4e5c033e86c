/*  cli_template - `sbx template build|list|delete`: templates built from a Dockerfile
    (sbx_dockerfile's subset), on whichever side the command works (cli_where): on the
    sbx host as an operator for --account, or from anywhere after `sbx login`.

    A build runs the steps in one build sandbox, through the public operations only
    (create_sandbox, exec, write_file, save_snapshot, delete_sandbox). After each step
    that changes files (RUN, COPY, ADD, WORKDIR) the sandbox is saved as a snapshot
    labelled sbx.template.cache=<the step's key>: the next build of the same steps over
    the same base starts from the last such snapshot instead of running them again. The
    start command (CMD/ENTRYPOINT) is started before the last save, so a sandbox made from
    the template has it running already, as a snapshot keeps processes. The template is
    that last snapshot, labelled sbx.template=NAME (the newest of that name wins);
    create_sandbox {template: NAME} (MCP, REST, `sbx sandbox create --template NAME`)
    starts from it: snapshotd resolves the name (snap.use). Everything is the account's own
    snapshots: they count against its plan's snapshot quota.
    The COPY and ADD archives are cli_template_context's; the builds in the service
    (--server, and the gateway's --from-tar) are cli_template_service's.
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_shell.h"
#include "cli_template.h"
#include "cli_template_context.h"
#include "cli_template_service.h"
#include "cli_where.h"
#include "sbx_dockerfile.h"
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <getopt.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_CMD        "sbx template"
#define S_LABEL      "sbx.template"
#define S_LABEL_KEY  "sbx.template.cache"
#define S_RUN_SECS   600 //  exec's most: a step longer than this fails (timedOut)
#define S_START_WAIT 2   //  seconds the start command must live before the last save

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx template build NAME [-f DOCKERFILE] [DIR] [--account A] [--no-cache]\n"
             "                          [--keep] [--public] [--server] [--json]\n"
             "       sbx template list [--account A] [--json]\n"
             "       sbx template show NAME [--account A] [--json]\n"
             "       sbx template delete NAME [--account A]\n"
             "every subcommand takes --data-dir DIR. After `sbx login URL` (or with SBX_URL\n"
             "and SBX_API_KEY) they work on that service as the key's account; on the sbx\n"
             "host, as an operator for --account (id or email).\n\n"
             "build: runs DOCKERFILE (default DIR/Dockerfile; DIR, the build context, default\n"
             ".) in a build sandbox and saves the result as template NAME. The subset taken:\n"
             "FROM sbx (or sbx:TYPE: small, medium, large, whose image the operator chose) or\n"
             "FROM another template; RUN, COPY, ADD (a local tar archive is unpacked), ENV,\n"
             "WORKDIR, USER, EXPOSE, CMD and ENTRYPOINT (the start command: running in every\n"
             "sandbox made from the template). A line per step; a failed step prints its\n"
             "output and exit code, and the build exits 1 (--keep keeps the build sandbox to\n"
             "look into). Steps are cached as snapshots by their instruction, inputs and\n"
             "base: an unchanged step is not run again (--no-cache runs them all).\n"
             "--public publishes it (label sbx.template.public=true): an admin account's\n"
             "published template serves every account that has none of that name.\n"
             "A build FROM a template starts from its ENV, WORKDIR and USER.\n"
             "--server (after sbx login): the service runs the build (POST /v1/templates),\n"
             "from the context sent as a tar archive (16 MiB at most); its log is shown as\n"
             "it grows. (--from-tar TAR --result FILE: how the gateway runs such a build.)\n"
             "list: the templates this account can use (the newest of each name): its own,\n"
             "then the operator's published ones it has none of. show: one of them.\n"
             "delete: removes template NAME (each snapshot of that name); refused while a\n"
             "sandbox made from it is not deleted. Cached steps stay (sbx snapshot delete).\n"
             "New sandboxes: sbx sandbox create --template NAME.\n");
}

typedef struct {
    const char *data_dir, *account, *file;
    const char *from_tar; //  the gateway's build (POST /v1/templates): the context as a tar
    const char *result;   //  with from_tar: where the outcome goes (JSON)
    bool json, no_cache, keep, public, server;
} s_opts_t;

//  --------------------------------------------------------------------------
//  Operations.

//  op with args (taken) → its REST answer, 0; else the exit code, said on stderr.
static int s_call (cli_where_t *w, const s_opts_t *o, sbx_op_t id, json_t *args, json_t **answer)
{
    cli_op_t *op = cli_op_new (S_CMD, id);
    const char *key;
    json_t *value;
    json_object_foreach (args, key, value) cli_op_set (op, key, json_incref (value));
    json_decref (args);
    *answer = NULL;
    int rc = cli_op_check (op) ? 2
                               : cli_where_call (w, op, id, o->account, id == SBX_OP_CREATE_SANDBOX,
                                                 answer, NULL);
    cli_op_destroy (&op);
    return rc;
}

//  The account's snapshots (REST's list; borrowed from *answer, which the caller frees).
static json_t *s_snapshots (cli_where_t *w, const s_opts_t *o, json_t **answer)
{
    //  (On the host, for o->account: cli_where_call's account.)
    if (s_call (w, o, SBX_OP_LIST_SNAPSHOTS, json_object (), answer))
        return NULL;
    return json_object_get (*answer, "snapshots");
}

//  The templates this account may use: its own, then the operator's published ones
//  (list_templates; borrowed from *answer, which the caller frees).
static json_t *s_templates (cli_where_t *w, const s_opts_t *o, json_t **answer)
{
    if (s_call (w, o, SBX_OP_LIST_TEMPLATES, json_object (), answer))
        return NULL;
    return json_object_get (*answer, "templates");
}

//  A snapshot's label (borrowed), or NULL.
static const char *s_label (json_t *snapshot, const char *key)
{
    return json_string_value (json_object_get (json_object_get (snapshot, "labels"), key));
}

static bool s_ready (json_t *snapshot)
{
    return streq (cli_json_str (snapshot, "state", ""), "ready");
}

//  Template name in list_templates' list (borrowed), or NULL: the account's own first,
//  else the operator's published one, as create_sandbox {template} picks.
static json_t *s_find_template (json_t *templates, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach (templates, i, t)
    {
        if (streq (cli_json_str (t, "name", ""), name))
            return t;
    }
    return NULL;
}

//  A waited exec: 0 with the answer (*answer), else the exit code said.
static int s_exec (cli_where_t *w, const s_opts_t *o, const char *sandbox_id, const char *command,
                   const sbx_df_step_t *step, bool detached, json_t **answer)
{
    json_t *env = json_object ();
    for (size_t i = 0; step && i < step->state_env_count; i++) {
        const char *eq = strchr (step->state_env[i], '=');
        char *key = strndup (step->state_env[i], (size_t) (eq - step->state_env[i]));
        json_object_set_new (env, key, json_string (eq + 1));
        free (key);
    }
    //  USER: the command runs as that user (runuser, from util-linux, is in the image).
    char *as_user = NULL;
    if (step && step->user && !streq (step->user, "root") && !streq (step->user, "0")) {
        char *user = strdup (step->user);
        char *group = strchr (user, ':');
        if (group)
            *group++ = 0;
        char *quoted = cli_shell_quote (command);
        as_user = zsys_sprintf ("exec runuser -u %s%s%s -- /bin/sh -c %s", user,
                                group ? " -g " : "", group ? group : "", quoted);
        free (quoted);
        free (user);
    }
    json_t *args = json_pack ("{s:s, s:s, s:o, s:b}", "sandboxId", sandbox_id, "command",
                              as_user ? as_user : command, "env", env, "detached", detached);
    if (!detached)
        json_object_set_new (args, "timeout", json_integer (S_RUN_SECS));
    if (step)
        json_object_set_new (args, "cwd", json_string (step->workdir));
    free (as_user);
    return s_call (w, o, SBX_OP_EXEC, args, answer);
}

//  Appends text to an autofree list (which copies it) and frees text.
static void s_append (zlist_t *list, char *text)
{
    zlist_append (list, text);
    free (text);
}

//  --------------------------------------------------------------------------
//  build

typedef struct {
    cli_where_t *w;
    const s_opts_t *o;
    const char *name;
    char context[PATH_MAX];
    sbx_dockerfile_t *df;
    char sandbox[80]; //  the build sandbox
    size_t steps, layers_run, cached;
} s_build_t;

//  Prints a step's failure: the exec's output, or why.
static void s_step_failed (size_t n, size_t total, const sbx_df_step_t *step, json_t *answer,
                           const char *why)
{
    fprintf (stderr, "Step %zu/%zu failed (line %d): %s\n", n, total, step->line, step->text);
    if (answer) {
        const char *out = cli_json_str (answer, "stdout", ""),
                   *err = cli_json_str (answer, "stderr", "");
        if (*out)
            fprintf (stderr, "--- stdout\n%s%s", out, out[strlen (out) - 1] == '\n' ? "" : "\n");
        if (*err)
            fprintf (stderr, "--- stderr\n%s%s", err, err[strlen (err) - 1] == '\n' ? "" : "\n");
        if (json_is_true (json_object_get (answer, "timedOut")))
            fprintf (stderr, "it ran longer than %d s and was killed\n", S_RUN_SECS);
        else
            fprintf (stderr, "exit code %lld\n",
                     (long long) json_integer_value (json_object_get (answer, "exitCode")));
    } else if (why)
        fprintf (stderr, "%s\n", why);
}

//  Runs one step that changes files in the build sandbox. 0, or 1 with the failure said.
static int s_run_step (s_build_t *b, size_t n, const sbx_df_step_t *step)
{
    json_t *answer = NULL;
    char *command = NULL;
    int rc = 0;
    if (step->kind == SBX_DF_RUN)
        command = strdup (step->command);
    else if (step->kind == SBX_DF_WORKDIR) {
        char *quoted = cli_shell_quote (step->workdir);
        command = zsys_sprintf ("mkdir -p %s", quoted);
        free (quoted);
    } else {
        cli_template_context_t *c = cli_template_context_new ();
        zlist_t *unpack = zlist_new ();
        zlist_autofree (unpack);
        size_t size = 0;
        const uint8_t *archive = NULL;
        if (c && cli_template_context_add_sources (c, b->context, step, unpack) == 0)
            archive = cli_template_context_archive (c, &size);
        if (!archive || size > SBX_XFER_MAX) {
            s_step_failed (n, b->steps, step, NULL,
                           archive ? "COPY and ADD take at most 16 MiB per step (too_large)"
                           : c     ? cli_template_context_why (c)
                                   : "out of memory");
            rc = 1;
        }
        char tmp[64];
        snprintf (tmp, sizeof tmp, "/tmp/.sbx-build-%u.tar", sbx_secret_uniform (UINT32_MAX));
        if (rc == 0 && cli_where_put (b->w, b->sandbox, tmp, archive, size, 0600))
            rc = 1;
        if (rc == 0) {
            //  Unpacked at / as root (files root's, as Docker's COPY makes them), then
            //  --chown's owner, then the archives ADD unpacks.
            zlist_t *parts = zlist_new ();
            zlist_autofree (parts);
            s_append (parts,
                      zsys_sprintf ("tar -xf %s -C / --no-same-owner && rm -f %s", tmp, tmp));
            if (step->chown) {
                char *dest = cli_shell_quote (step->dest);
                s_append (parts, zsys_sprintf ("chown -R %s %s", step->chown, dest));
                free (dest);
            }
            for (char *u = zlist_first (unpack); u; u = zlist_next (unpack)) {
                char *space = strchr (u, ' ');
                *space = 0;
                char *dest = cli_shell_quote (space + 1);
                s_append (parts, zsys_sprintf ("mkdir -p %s && tar -xf %s -C %s && rm -f %s", dest,
                                               u, dest, u));
                free (dest);
            }
            command = strdup ("set -e");
            for (char *p = zlist_first (parts); p; p = zlist_next (parts)) {
                char *longer = zsys_sprintf ("%s; %s", command, p);
                free (command);
                command = longer;
            }
            zlist_destroy (&parts);
        }
        zlist_destroy (&unpack);
        cli_template_context_destroy (&c);
    }
    //  COPY and ADD run as root whatever USER says (Docker's rule), RUN as USER.
    sbx_df_step_t as_root = *step;
    if (step->kind != SBX_DF_RUN)
        as_root.user = NULL;
    if (step->kind == SBX_DF_WORKDIR)
        as_root.workdir = "/"; //  the directory it makes does not exist yet
    if (rc == 0 && command)
        rc = s_exec (b->w, b->o, b->sandbox, command, &as_root, false, &answer);
    if (rc == 0 && answer &&
        (json_integer_value (json_object_get (answer, "exitCode")) != 0 ||
         json_is_true (json_object_get (answer, "timedOut")))) {
        s_step_failed (n, b->steps, step, answer, NULL);
        rc = 1;
    }
    json_decref (answer);
    free (command);
    return rc;
}

//  The inputs digest of a COPY or ADD step (the same walk the upload does). 0 or -1.
static int s_inputs (s_build_t *b, const sbx_df_step_t *step, char out[65])
{
    cli_template_context_t *c = cli_template_context_new ();
    zlist_t *unpack = zlist_new ();
    zlist_autofree (unpack);
    int rc = c ? cli_template_context_add_sources (c, b->context, step, unpack) : -1;
    if (rc)
        fprintf (stderr, "%s build: line %d: %s\n", S_CMD, step->line,
                 c ? cli_template_context_why (c) : "out of memory");
    else
        cli_template_context_digest (c, out);
    zlist_destroy (&unpack);
    cli_template_context_destroy (&c);
    return rc;
}

//  Saves the build sandbox as a snapshot with labels (taken). 0 with its id in id.
static int s_save (s_build_t *b, const char *name, json_t *labels, char *id, size_t size)
{
    json_t *answer = NULL;
    int rc = s_call (
        b->w, b->o, SBX_OP_SAVE_SNAPSHOT,
        json_pack ("{s:s, s:s, s:o}", "sandboxId", b->sandbox, "name", name, "labels", labels),
        &answer);
    if (rc == 0)
        snprintf (id, size, "%s", cli_json_str (answer, "id", ""));
    json_decref (answer);
    return rc;
}

//  Creates the build sandbox from args (taken): 0 with its id in b->sandbox.
static int s_create (s_build_t *b, json_t *args)
{
    json_object_set_new (args, "name", json_string ("template build"));
    json_object_set_new (args, "labels", json_pack ("{s:s}", "sbx.template.build", b->name));
    json_t *made = NULL;
    int rc = s_call (b->w, b->o, SBX_OP_CREATE_SANDBOX, args, &made);
    if (rc == 0)
        snprintf (b->sandbox, sizeof b->sandbox, "%s", cli_json_str (made, "id", ""));
    json_decref (made);
    return rc;
}

static void s_delete_sandbox (s_build_t *b)
{
    json_t *gone = NULL;
    s_call (b->w, b->o, SBX_OP_DELETE_SANDBOX, json_pack ("{s:s}", "sandboxId", b->sandbox), &gone);
    json_decref (gone);
    *b->sandbox = 0;
}

//  What a template leaves in force for builds FROM it (Docker's image config): written
//  into the guest before the last save, read from a sandbox made from it.
#define S_CONFIG "/etc/sbx/template.json"

//  The base template's config, from the build sandbox made from it: b->df parsed again
//  over it. A template without one (built before configs were kept) leaves nothing in
//  force. 0, or 2 with the refusal said.
static int s_inherit (s_build_t *b, const char *text)
{
    json_t *answer = NULL;
    if (s_exec (b->w, b->o, b->sandbox, "cat " S_CONFIG " 2>/dev/null || true", NULL, false,
                &answer))
        return 1;
    json_t *config = json_loads (cli_json_str (answer, "stdout", ""), 0, NULL);
    json_decref (answer);
    if (!json_is_object (config)) {
        json_decref (config);
        return 0;
    }
    json_t *env = json_object_get (config, "env");
    size_t count = json_array_size (env);
    const char **pairs = calloc (count + 1, sizeof *pairs);
    for (size_t i = 0; i < count; i++)
        pairs[i] = json_string_value (json_array_get (env, i));
    sbx_df_base_t base = {.env = pairs,
                          .env_count = count,
                          .workdir = json_string_value (json_object_get (config, "workdir")),
                          .user = json_string_value (json_object_get (config, "user"))};
    char why[300];
    sbx_dockerfile_t *df = sbx_dockerfile_parse_over (text, &base, why, sizeof why);
    free (pairs);
    json_decref (config);
    if (!df) {
        fprintf (stderr, "%s build: over template %s: %s\n", S_CMD,
                 sbx_dockerfile_step (b->df, 0)->from, why);
        return 2;
    }
    sbx_dockerfile_destroy (&b->df);
    b->df = df;
    return 0;
}

//  The config of the template being made (the last step's state, and the start command).
static json_t *s_config (s_build_t *b)
{
    const sbx_df_step_t *last = sbx_dockerfile_step (b->df, b->steps - 1);
    json_t *env = json_array ();
    for (size_t i = 0; i < last->state_env_count; i++)
        json_array_append_new (env, json_string (last->state_env[i]));
    const char *start = sbx_dockerfile_start (b->df);
    return json_pack ("{s:s, s:o, s:s, s:s?, s:s?}", "name", b->name, "env", env, "workdir",
                      last->workdir, "user", last->user, "start", start);
}

//  The Dockerfile: o->file (with from_tar, a path inside the context), else
//  context/Dockerfile. Its text (malloc'd), or NULL with the failure said.
static char *s_dockerfile_text (s_build_t *b, char *file, size_t size)
{
    const s_opts_t *o = b->o;
    if (o->from_tar) {
        //  Named inside the context, and said so (not where the gateway unpacked it).
        const char *name = o->file ? o->file : "Dockerfile";
        char joined[PATH_MAX * 2], real[PATH_MAX];
        snprintf (joined, sizeof joined, "%s/%s", b->context, name);
        if (!realpath (joined, real) || strncmp (real, b->context, strlen (b->context)) != 0 ||
            real[strlen (b->context)] != '/') {
            fprintf (stderr, "%s build: %s: no such file in the build context\n", S_CMD, name);
            return NULL;
        }
        snprintf (file, size, "%s", real);
    } else if (o->file)
        snprintf (file, size, "%s", o->file);
    else
        snprintf (file, size, "%s/Dockerfile", b->context);
    FILE *f = fopen (file, "rb");
    uint8_t *text = NULL;
    size_t length = 0;
    if (!f || cli_where_slurp (f, SBX_DOCKERFILE_MAX_BYTES, &text, &length)) {
        fprintf (stderr, "%s build: %s: %s\n", S_CMD,
                 o->from_tar ? file + strlen (b->context) + 1 : file,
                 f ? "larger than 1 MiB" : strerror (errno));
        if (f)
            fclose (f);
        free (text);
        return NULL;
    }
    fclose (f);
    return (char *) text;
}

//  What a build leaves: the template's snapshot, the build sandbox kept (--keep).
typedef struct {
    char snapshot[80], kept[80];
} s_outcome_t;

static int s_build (cli_where_t *w, const s_opts_t *o, const char *name, const char *dir,
                    s_outcome_t *outcome)
{
    s_build_t b = {.w = w, .o = o, .name = name};
    int64_t started = zclock_mono ();
    if (!realpath (dir, b.context)) {
        fprintf (stderr, "%s build: %s: %s\n", S_CMD, dir, strerror (errno));
        return 2;
    }
    char file[PATH_MAX * 2];
    char *text = s_dockerfile_text (&b, file, sizeof file);
    if (!text)
        return 2;
    char why[300];
    b.df = sbx_dockerfile_parse (text, why, sizeof why);
    if (!b.df) {
        fprintf (stderr, "%s build: %s: %s\n", S_CMD,
                 o->from_tar ? file + strlen (b.context) + 1 : file, why);
        free (text);
        return 2;
    }
    json_t *list_answer = NULL, *templates_answer = NULL;
    json_t *list = s_snapshots (w, o, &list_answer);
    json_t *templates = list ? s_templates (w, o, &templates_answer) : NULL;
    if (!templates) {
        free (text);
        json_decref (list_answer);
        sbx_dockerfile_destroy (&b.df);
        return 1;
    }
    //  The base: a type's image, or a template (the account's own, else the operator's
    //  published one), whose config (ENV, WORKDIR, USER) the steps start from.
    const sbx_df_step_t *from = sbx_dockerfile_step (b.df, 0);
    const char *type = NULL, *base_snapshot = NULL;
    char base_key[160];
    int rc = 0;
    if (streq (from->from, "sbx")) {
        type = from->from_tag ? from->from_tag : "small";
        snprintf (base_key, sizeof base_key, "sbx:%s", type);
    } else {
        json_t *t = s_find_template (templates, from->from);
        if (!t || from->from_tag) {
            fprintf (stderr, "%s build: line %d: FROM %s%s%s: %s\n", S_CMD, from->line, from->from,
                     from->from_tag ? ":" : "", from->from_tag ? from->from_tag : "",
                     from->from_tag ? "a template has no tags (FROM NAME)"
                                    : "no template of that name (sbx template list shows them; "
                                      "FROM sbx or sbx:TYPE for a guest image)");
            rc = 2;
        } else {
            base_snapshot = cli_json_str (t, "snapshotId", "");
            snprintf (base_key, sizeof base_key, "template:%s", base_snapshot);
            printf ("Step 1/%zu : %s\n", sbx_dockerfile_size (b.df), from->text);
            fflush (stdout);
            rc = s_create (&b, json_pack ("{s:s}", "template", from->from));
            if (rc == 0)
                rc = s_inherit (&b, text);
        }
    }
    free (text);
    from = sbx_dockerfile_step (b.df, 0);
    b.steps = sbx_dockerfile_size (b.df);
    //  Each step's key; the last layer whose key a ready snapshot has is where to start.
    char (*keys)[65] = calloc (b.steps, sizeof *keys);
    size_t start_after = 0; //  steps 1..start_after come from the cache
    const char *start_snapshot = base_snapshot;
    for (size_t i = 0; i < b.steps && rc == 0; i++) {
        const sbx_df_step_t *step = sbx_dockerfile_step (b.df, i);
        char inputs[65] = "";
        if ((step->kind == SBX_DF_COPY || step->kind == SBX_DF_ADD) && s_inputs (&b, step, inputs))
            rc = 2;
        sbx_dockerfile_key (i ? keys[i - 1] : base_key, step, *inputs ? inputs : NULL, keys[i]);
        if (rc || o->no_cache || !sbx_dockerfile_makes_layer (step))
            continue;
        size_t j;
        json_t *s;
        json_array_foreach (list, j, s)
        {
            const char *key = s_label (s, S_LABEL_KEY);
            if (key && streq (key, keys[i]) && s_ready (s)) {
                start_after = i;
                start_snapshot = cli_json_str (s, "id", "");
                break;
            }
        }
    }
    if (rc == 0 && (start_after || !*b.sandbox)) {
        //  From the last cached step (the base's sandbox made for its config goes), or
        //  from the type's image.
        if (*b.sandbox)
            s_delete_sandbox (&b);
        else {
            printf ("Step 1/%zu : %s%s\n", b.steps, from->text, start_after ? " (cached)" : "");
            fflush (stdout);
        }
        rc = s_create (&b, start_after ? json_pack ("{s:s}", "snapshotId", start_snapshot)
                                       : json_pack ("{s:s}", "type", type));
    }
    for (size_t i = 1; i < b.steps && rc == 0; i++) {
        const sbx_df_step_t *step = sbx_dockerfile_step (b.df, i);
        bool cached = i <= start_after;
        printf ("Step %zu/%zu : %s%s\n", i + 1, b.steps, step->text, cached ? " (cached)" : "");
        fflush (stdout);
        if (cached) {
            b.cached++;
            continue;
        }
        if (!sbx_dockerfile_makes_layer (step))
            continue;
        int64_t t0 = zclock_mono ();
        rc = s_run_step (&b, i + 1, step);
        if (rc == 0) {
            char id[80], label[160];
            snprintf (label, sizeof label, "%s step %zu", name, i + 1);
            rc = s_save (&b, label, json_pack ("{s:s}", S_LABEL_KEY, keys[i]), id, sizeof id);
            if (rc == 0)
                printf (" ---> %.1f s, saved as %s\n", (double) (zclock_mono () - t0) / 1000.0, id);
            b.layers_run++;
        }
    }
    //  The start command, running before the last save.
    const char *start = rc == 0 ? sbx_dockerfile_start (b.df) : NULL;
    const sbx_df_step_t *last = sbx_dockerfile_step (b.df, b.steps - 1);
    if (start) {
        json_t *answer = NULL;
        printf ("Starting: %s\n", start);
        rc = s_exec (w, o, b.sandbox, start, last, true, &answer);
        int64_t pid = rc == 0 ? json_integer_value (json_object_get (answer, "processId")) : 0;
        json_decref (answer);
        sleep (S_START_WAIT);
        if (rc == 0) {
            rc = s_call (
                w, o, SBX_OP_COMMAND_STATUS,
                json_pack ("{s:s, s:I}", "sandboxId", b.sandbox, "processId", (json_int_t) pid),
                &answer);
            if (rc == 0 && !json_is_true (json_object_get (answer, "running"))) {
                fprintf (stderr, "The start command ended within %d s: %s\n", S_START_WAIT, start);
                s_step_failed (b.steps, b.steps, last, answer, NULL);
                rc = 1;
            }
            json_decref (answer);
        }
    }
    char template_id[80] = "";
    if (rc == 0) {
        //  The config builds FROM this template start from.
        json_t *config = s_config (&b);
        char *config_text = json_dumps (config, JSON_COMPACT);
        json_decref (config);
        rc = config_text
                 ? cli_where_put (w, b.sandbox, S_CONFIG, config_text, strlen (config_text), 0644)
                 : 1;
        free (config_text);
    }
    if (rc == 0) {
        char label[160];
        snprintf (label, sizeof label, "template %s", name);
        json_t *labels =
            json_pack ("{s:s, s:s}", S_LABEL, name, S_LABEL_KEY "s", keys[b.steps - 1]);
        if (o->public)
            json_object_set_new (labels, S_LABEL ".public", json_string ("true"));
        rc = s_save (&b, label, labels, template_id, sizeof template_id);
    }
    char kept[80];
    snprintf (kept, sizeof kept, "%s", b.sandbox);
    if (*b.sandbox && (rc == 0 || !o->keep))
        s_delete_sandbox (&b);
    else if (*b.sandbox)
        fprintf (stderr, "The build sandbox %s is kept (--keep): sbx sandbox exec %s -- ...\n",
                 b.sandbox, b.sandbox);
    int64_t ms = zclock_mono () - started;
    double secs = (double) ms / 1000.0;
    if (rc == 0 && o->json) {
        json_t *out =
            json_pack ("{s:s, s:s, s:I, s:I, s:I, s:I, s:s?}", "name", name, "snapshotId",
                       template_id, "steps", (json_int_t) b.steps, "cached", (json_int_t) b.cached,
                       "run", (json_int_t) b.layers_run, "ms", (json_int_t) ms, "start", start);
        cli_print_json (out);
    } else if (rc == 0)
        printf ("Template %s is %s: %zu steps, %zu cached, in %.1f s. New sandboxes: sbx sandbox "
                "create --template %s\n",
                name, template_id, b.steps, b.cached, secs, name);
    free (keys);
    json_decref (list_answer);
    json_decref (templates_answer);
    sbx_dockerfile_destroy (&b.df);
    snprintf (outcome->snapshot, sizeof outcome->snapshot, "%s", template_id);
    snprintf (outcome->kept, sizeof outcome->kept, "%s", *b.sandbox ? kept : "");
    return rc;
}

//  --------------------------------------------------------------------------
//  list, delete

static int s_list (cli_where_t *w, const s_opts_t *o)
{
    json_t *answer = NULL;
    json_t *list = s_templates (w, o, &answer);
    if (!list)
        return 1;
    size_t i;
    json_t *t;
    if (o->json)
        cli_print_json (json_pack ("{s:O}", "templates", list));
    else {
        json_array_foreach (list, i, t)
            printf ("%-24s %s  %-6s %8.1f MiB  %s%s\n", cli_json_str (t, "name", ""),
                    cli_json_str (t, "snapshotId", ""), cli_json_str (t, "type", ""),
                    (double) json_integer_value (json_object_get (t, "sizeBytes")) / 1048576.0,
                    cli_json_str (t, "createdAt", ""),
                    !json_is_true (json_object_get (t, "own")) ? "  (the operator's, published)"
                    : json_is_true (json_object_get (t, "published")) ? "  (published)"
                                                                      : "");
        if (json_array_size (list) == 0)
            printf ("No templates.\n");
    }
    json_decref (answer);
    return 0;
}

static int s_show (cli_where_t *w, const s_opts_t *o, const char *name)
{
    json_t *answer = NULL;
    json_t *list = s_templates (w, o, &answer);
    if (!list)
        return 1;
    json_t *t = s_find_template (list, name);
    int rc = t ? 0 : 1;
    if (!t)
        fprintf (stderr, "%s show: no template named '%s' (sbx template list shows them)\n", S_CMD,
                 name);
    else if (o->json)
        cli_print_json (json_incref (t));
    else
        printf ("name:       %s\nsnapshot:   %s\ntype:       %s\nsize:       %.1f MiB\n"
                "created:    %s\nwhose:      %s\n",
                name, cli_json_str (t, "snapshotId", ""), cli_json_str (t, "type", ""),
                (double) json_integer_value (json_object_get (t, "sizeBytes")) / 1048576.0,
                cli_json_str (t, "createdAt", ""),
                !json_is_true (json_object_get (t, "own"))        ? "the operator's, published"
                : json_is_true (json_object_get (t, "published")) ? "this account's, published"
                                                                  : "this account's");
    json_decref (answer);
    return rc;
}

static int s_delete (cli_where_t *w, const s_opts_t *o, const char *name)
{
    json_t *answer = NULL;
    json_t *list = s_snapshots (w, o, &answer);
    if (!list)
        return 1;
    size_t i, deleted = 0;
    json_t *s;
    int rc = 0;
    json_array_foreach (list, i, s)
    {
        const char *label = s_label (s, S_LABEL);
        if (!label || !streq (label, name))
            continue;
        json_t *gone = NULL;
        int one = s_call (w, o, SBX_OP_DELETE_SNAPSHOT,
                          json_pack ("{s:s}", "snapshotId", cli_json_str (s, "id", "")), &gone);
        json_decref (gone);
        if (one == 0)
            deleted++;
        rc = rc ? rc : one;
    }
    json_decref (answer);
    if (deleted == 0 && rc == 0) {
        fprintf (stderr, "%s delete: no template named '%s'\n", S_CMD, name);
        return 1;
    }
    if (rc == 0)
        printf ("Deleted template %s (%zu snapshot%s).\n", name, deleted, deleted == 1 ? "" : "s");
    return rc;
}

int cli_template_main (int argc, char **argv)
{
    s_opts_t o = {0};
    static struct option longs[] = {
        {"data-dir", required_argument, 0, 'd'}, {"account", required_argument, 0, 'a'},
        {"file", required_argument, 0, 'f'},     {"json", no_argument, 0, 'j'},
        {"no-cache", no_argument, 0, 'n'},       {"keep", no_argument, 0, 'k'},
        {"public", no_argument, 0, 'p'},         {"server", no_argument, 0, 's'},
        {"from-tar", required_argument, 0, 't'}, {"result", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "f:h", longs, NULL)) != -1) {
        switch (c) {
        case 'd':
            o.data_dir = optarg;
            break;
        case 'a':
            o.account = optarg;
            break;
        case 'f':
            o.file = optarg;
            break;
        case 'j':
            o.json = true;
            break;
        case 'n':
            o.no_cache = true;
            break;
        case 'k':
            o.keep = true;
            break;
        case 'p':
            o.public = true;
            break;
        case 's':
            o.server = true;
            break;
        case 't':
            o.from_tar = optarg;
            break;
        case 'r':
            o.result = optarg;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    int nrest = argc - optind;
    const char *verb = nrest > 0 ? argv[optind] : NULL;
    bool build = verb && streq (verb, "build"), list = verb && streq (verb, "list"),
         del = verb && streq (verb, "delete"), show = verb && streq (verb, "show");
    if (!(build && (nrest == 2 || nrest == 3)) && !(list && nrest == 1) &&
        !((del || show) && nrest == 2)) {
        s_usage (stderr);
        return 2;
    }
    const char *name = nrest > 1 ? argv[optind + 1] : NULL;
    if (name) {
        bool ok = *name && strlen (name) <= 64;
        for (const char *p = name; ok && *p; p++)
            ok = islower ((unsigned char) *p) || isdigit ((unsigned char) *p) || strchr ("._-", *p);
        if (!ok || streq (name, "sbx")) {
            fprintf (stderr,
                     "%s: a template's name is 1 to 64 lower-case letters, digits, '.', "
                     "'_' and '-', and not sbx (got '%s')\n",
                     S_CMD, name);
            return 2;
        }
    }
    cli_where_t w;
    char command[64];
    snprintf (command, sizeof command, "%s %s", S_CMD, verb);
    int rc = cli_where_open (&w, command, o.data_dir);
    if (rc)
        return rc;
    if (w.rest && o.account) {
        fprintf (stderr,
                 "%s: --account is for the sbx host's operator; a remote service works "
                 "as the key's account\n",
                 S_CMD);
        cli_where_close (&w);
        return 2;
    }
    if (!w.rest && !o.account && !list && !show) {
        fprintf (stderr, "%s %s: on the sbx host, say whose: --account ID_OR_EMAIL\n", S_CMD, verb);
        cli_where_close (&w);
        return 2;
    }
    if (build && (o.server || o.from_tar)) {
        const char *why = o.server && !w.rest      ? "--server is for a remote service (sbx login)"
                          : o.server && o.from_tar ? "--server and --from-tar go apart"
                          : o.from_tar && (w.rest || nrest == 3 || !o.result)
                              ? "--from-tar (the gateway's) takes --result and no DIR, on the host"
                              : NULL;
        if (why) {
            fprintf (stderr, "%s build: %s\n", S_CMD, why);
            cli_where_close (&w);
            return 2;
        }
    }
    if (build && o.server)
        rc = cli_template_service_build (
            &w, name, nrest == 3 ? argv[optind + 2] : ".",
            &(cli_template_service_opts_t){
                .dockerfile = o.file, .no_cache = o.no_cache, .public = o.public, .json = o.json});
    else if (build) {
        char context[PATH_MAX + 8] = "";
        if (o.from_tar) {
            snprintf (context, sizeof context, "%s.d", o.from_tar);
            setvbuf (stdout, NULL, _IOLBF, 0); //  the log file grows a line at a time
        }
        s_outcome_t outcome = {{0}, {0}};
        rc = o.from_tar ? cli_template_service_unpack (o.from_tar, context) : 0;
        if (rc == 0)
            rc = s_build (&w, &o, name,
                          o.from_tar   ? context
                          : nrest == 3 ? argv[optind + 2]
                                       : ".",
                          &outcome);
        if (o.from_tar) {
            cli_template_service_remove (context);
            remove (o.from_tar);
        }
        //  The whole log is there before the result says the build ended.
        fflush (stdout);
        fflush (stderr);
        if (o.result)
            cli_template_service_result (
                o.result, json_pack ("{s:i, s:s?, s:I, s:s?}", "exitCode", rc, "snapshotId",
                                     *outcome.snapshot ? outcome.snapshot : NULL, "endedMs",
                                     (json_int_t) zclock_time (), "keptSandbox",
                                     *outcome.kept ? outcome.kept : NULL));
    } else
        rc = list ? s_list (&w, &o) : show ? s_show (&w, &o, name) : s_delete (&w, &o, name);
    cli_where_close (&w);
    return rc;
}
