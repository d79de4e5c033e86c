/*  cli_template_service - see cli_template_service.h */
#include "cli_template_service.h"
#include "cli_call.h"
#include "cli_rest.h"
#include "cli_tar.h"
#include "cli_template_context.h"
#include "sbx_dockerfile.h"
#include "sbx_xfer.h"

#include <ftw.h>
#include <limits.h>
#include <sys/stat.h>

#define S_CMD "sbx template"

static int s_unlink_one (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void) st, (void) flag, (void) ftw;
    remove (path);
    return 0;
}

void cli_template_service_remove (const char *dir)
{
    nftw (dir, s_unlink_one, 16, FTW_DEPTH | FTW_PHYS);
}

int cli_template_service_unpack (const char *tar, const char *dir)
{
    FILE *f = fopen (tar, "rb");
    uint8_t *data = NULL;
    size_t size = 0, files = 0;
    char why[400] = "";
    int rc = 0;
    if (!f || cli_where_slurp (f, SBX_XFER_MAX, &data, &size)) {
        snprintf (why, sizeof why, "%s", f ? "larger than 16 MiB" : strerror (errno));
        rc = 2;
    } else if (mkdir (dir, 0700) != 0) {
        snprintf (why, sizeof why, "%s: %s", dir, strerror (errno));
        rc = 2;
    } else if (cli_tar_extract (data, size, dir, &files, why, sizeof why) != 0)
        rc = 2;
    else if (files == 0) {
        snprintf (why, sizeof why,
                  "no files in it (send an uncompressed tar archive holding the "
                  "Dockerfile: tar -cf - -C DIR .)");
        rc = 2;
    }
    if (f)
        fclose (f);
    free (data);
    if (rc)
        fprintf (stderr, "%s build: the build context (a tar archive): %s\n", S_CMD, why);
    return rc;
}

void cli_template_service_result (const char *path, json_t *out)
{
    char tmp[PATH_MAX + 8];
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file (out, tmp, JSON_COMPACT) == 0)
        rename (tmp, path);
    json_decref (out);
}

int cli_template_service_build (cli_where_t *w, const char *name, const char *dir,
                                const cli_template_service_opts_t *o)
{
    char real[PATH_MAX];
    if (!realpath (dir, real)) {
        fprintf (stderr, "%s build: %s: %s\n", S_CMD, dir, strerror (errno));
        return 2;
    }
    cli_template_context_t *c = cli_template_context_new ();
    int rc = c ? cli_template_context_add_dir (c, real, ".") : -1;
    const char *dockerfile = NULL;
    char inside[PATH_MAX];
    if (rc == 0 && o->dockerfile) {
        //  A Dockerfile inside the context is named by its path there; one outside it
        //  travels beside it.
        char file[PATH_MAX];
        size_t n = strlen (real);
        if (realpath (o->dockerfile, file) && strncmp (file, real, n) == 0 && file[n] == '/') {
            snprintf (inside, sizeof inside, "%s", file + n + 1);
            dockerfile = inside;
        } else {
            FILE *f = fopen (o->dockerfile, "rb");
            uint8_t *text = NULL;
            size_t size = 0;
            rc = !f || cli_where_slurp (f, SBX_DOCKERFILE_MAX_BYTES, &text, &size) ||
                 cli_template_context_add_data (c, ".sbx-Dockerfile", text, size);
            if (rc && !*cli_template_context_why (c)) {
                char why[PATH_MAX + 64];
                snprintf (why, sizeof why, "%s: %s", o->dockerfile,
                          f ? "larger than 1 MiB" : strerror (errno));
                cli_template_context_set_why (c, why);
            }
            if (f)
                fclose (f);
            free (text);
            dockerfile = ".sbx-Dockerfile";
        }
    }
    size_t size = 0;
    const uint8_t *archive = rc == 0 ? cli_template_context_archive (c, &size) : NULL;
    if (!archive || size > SBX_XFER_MAX) {
        fprintf (stderr, "%s build: %s\n", S_CMD,
                 archive ? "the build context is over 16 MiB as a tar archive"
                 : c     ? cli_template_context_why (c)
                         : "out of memory");
        rc = 2;
    }
    json_t *answer = NULL;
    sbx_err_t err;
    if (rc == 0) {
        json_t *args = json_pack ("{s:s, s:s?, s:b, s:b}", "name", name, "dockerfile", dockerfile,
                                  "noCache", o->no_cache, "public", o->public);
        if (cli_rest_call (w->rest, SBX_OP_BUILD_TEMPLATE, args, archive, size, &answer, NULL, NULL,
                           &err))
            rc = cli_fail (&err);
        json_decref (args);
    }
    cli_template_context_destroy (&c);
    if (rc)
        return rc;
    char id[64];
    snprintf (id, sizeof id, "%s", cli_json_str (answer, "id", ""));
    json_decref (answer);
    fprintf (stderr, "Build %s runs on the service (%zu bytes of context sent).\n", id, size);
    //  Its log as it grows, until it ends.
    json_int_t offset = 0;
    for (;;) {
        json_t *args = json_pack ("{s:s, s:I}", "buildId", id, "logOffset", offset);
        int failed = cli_rest_call (w->rest, SBX_OP_GET_TEMPLATE_BUILD, args, NULL, 0, &answer,
                                    NULL, NULL, &err);
        json_decref (args);
        if (failed)
            return cli_fail (&err);
        fputs (cli_json_str (answer, "log", ""), stdout);
        fflush (stdout);
        offset = json_integer_value (json_object_get (answer, "logOffset"));
        const char *state = cli_json_str (answer, "state", "");
        if (!streq (state, "running")) {
            json_t *code = json_object_get (answer, "exitCode");
            rc = json_is_integer (code) ? (int) json_integer_value (code) : 1;
            if (o->json && rc == 0)
                cli_print_json (json_incref (answer));
            json_decref (answer);
            return rc;
        }
        json_decref (answer);
        zclock_sleep (500);
    }
}
