/*  cli_handoff - the local tool handoff_session (see cli_handoff.h). */
#include "cli_handoff.h"
#include "cli_files.h"
#include "cli_tar.h"
#include "sbx_common.h"

#include <sys/stat.h>

#define S_DEFAULT_PATH "/root/work"
//  Raw bytes per write_file: 4 MiB is 5.6 MiB of base64, well inside the service's
//  16 MiB request body.
#define S_PART_MAX (4 * 1024 * 1024)

json_t *cli_handoff_tool (void)
{
    return json_pack (
        "{s:s, s:s, s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:s}}, s:b}, "
        "s:{s:s, s:{s:{s:s}, s:{s:s}, s:{s:s}, s:{s:s}}, s:[s,s,s,s]}, s:{s:b, s:b}}",
        "name", CLI_HANDOFF_NAME, "title", "Hand off the working directory", "description",
        "Copy the local working directory (where this MCP server runs) into a sandbox, so work "
        "can go on there. In a git work tree the files git keeps are copied (tracked and "
        "untracked, .gitignore followed); elsewhere every file. At most 16 MiB in all. "
        "Without sandboxId a new sandbox is created.",
        "inputSchema", "type", "object", "properties", "sandboxId", "type", "string", "description",
        "The sandbox to copy into (default: a new one).", "path", "type", "string", "description",
        "The directory in the guest to copy into, made if missing (default /root/work).",
        "additionalProperties", 0, "outputSchema", "type", "object", "properties", "sandboxId",
        "type", "string", "path", "type", "string", "files", "type", "integer", "bytes", "type",
        "integer", "required", "sandboxId", "path", "files", "bytes", "annotations", "readOnlyHint",
        0, "destructiveHint", 0);
}

int cli_handoff_check (json_t *args, char *why, size_t why_size)
{
    if (!json_is_object (args)) {
        snprintf (why, why_size, "arguments must be an object (invalid_argument)");
        return -1;
    }
    const char *key;
    json_t *value;
    json_object_foreach (args, key, value)
    {
        if (!streq (key, "sandboxId") && !streq (key, "path")) {
            snprintf (why, why_size,
                      "unknown argument \"%s\" (handoff_session takes: sandboxId, path) "
                      "(invalid_argument)",
                      key);
            return -1;
        }
        if (!json_is_string (value)) {
            snprintf (why, why_size, "%s must be a string (invalid_argument)", key);
            return -1;
        }
    }
    const char *sandbox = json_string_value (json_object_get (args, "sandboxId"));
    if (sandbox &&
        (strlen (sandbox) == 0 || strlen (sandbox) > 64 ||
         strspn (sandbox, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen (sandbox))) {
        snprintf (why, why_size,
                  "sandboxId must be a sandbox id such as sb_0123456789 "
                  "(invalid_argument)");
        return -1;
    }
    const char *path = json_string_value (json_object_get (args, "path"));
    if (path) {
        size_t n = strlen (path);
        bool printable = true;
        for (const char *p = path; *p; p++)
            printable = printable && (unsigned char) *p >= 0x20 && *p != 0x7f;
        if (n == 0 || n > 1024 || path[0] != '/' || !printable) {
            snprintf (why, why_size,
                      "path must be an absolute directory in the guest, at most "
                      "1024 characters without control characters, such as "
                      "/root/work (invalid_argument)");
            return -1;
        }
    }
    return 0;
}

//  A word of shell: 'text' with each ' as '\''.
static char *s_quote (const char *text)
{
    size_t n = 3;
    for (const char *p = text; *p; p++)
        n += *p == '\'' ? 4 : 1;
    char *out = malloc (n);
    char *at = out;
    *at++ = '\'';
    for (const char *p = text; *p; p++) {
        if (*p == '\'')
            memcpy (at, "'\\''", 4), at += 4;
        else
            *at++ = *p;
    }
    *at++ = '\'';
    *at = 0;
    return out;
}

//  RFC 4648 base64, as write_file's encoding "base64" takes it (caller frees).
static char *s_base64 (const uint8_t *in, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc ((n + 2) / 3 * 4 + 1);
    char *o = out;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        *o++ = abc[in[i] >> 2];
        *o++ = abc[((in[i] & 3) << 4) | (in[i + 1] >> 4)];
        *o++ = abc[((in[i + 1] & 15) << 2) | (in[i + 2] >> 6)];
        *o++ = abc[in[i + 2] & 63];
    }
    if (i < n) {
        *o++ = abc[in[i] >> 2];
        if (i + 1 < n) {
            *o++ = abc[((in[i] & 3) << 4) | (in[i + 1] >> 4)];
            *o++ = abc[(in[i + 1] & 15) << 2];
        } else {
            *o++ = abc[(in[i] & 3) << 4];
            *o++ = '=';
        }
        *o++ = '=';
    }
    *o = 0;
    return out;
}

static json_t *s_failed (const char *format, ...)
{
    va_list args;
    va_start (args, format);
    char text[2048];
    vsnprintf (text, sizeof text, format, args);
    va_end (args);
    return json_pack ("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", text, "isError",
                      1);
}

static double s_mib (size_t bytes)
{
    return bytes / (1024.0 * 1024.0);
}

//  The archive of dir's files; NULL with why. *files, *bytes: what it holds.
static cli_tar_t *s_pack (const char *dir, size_t max, size_t *files, size_t *bytes, char *why,
                          size_t why_size)
{
    bool git;
    zlist_t *names = cli_files_list (dir, &git, why, why_size);
    if (!names)
        return NULL;
    //  The total first, so an over-limit directory is refused before anything is read.
    *files = zlist_size (names);
    *bytes = 0;
    for (char *name = zlist_first (names); name; name = zlist_next (names)) {
        char *full = zsys_sprintf ("%s/%s", dir, name);
        struct stat st;
        if (lstat (full, &st) == 0 && S_ISREG (st.st_mode))
            *bytes += (size_t) st.st_size;
        zstr_free (&full);
    }
    if (*bytes > max) {
        snprintf (why, why_size,
                  "%s has %.1f MiB in %zu files (%zu bytes), over handoff_session's limit of "
                  "%.0f MiB (%zu bytes); %s",
                  dir, s_mib (*bytes), *files, *bytes, s_mib (max), max,
                  git ? "add what need not go (build outputs, data) to .gitignore"
                      : "run it from a smaller directory, or make it a git work tree with a "
                        ".gitignore");
        zlist_destroy (&names);
        return NULL;
    }
    cli_tar_t *tar = cli_tar_new ();
    int rc = 0;
    *bytes = 0;
    for (char *name = zlist_first (names); name && rc == 0; name = zlist_next (names)) {
        char *full = zsys_sprintf ("%s/%s", dir, name);
        struct stat st;
        if (lstat (full, &st)) {
            zstr_free (&full);
            continue; //  gone since it was listed
        }
        if (S_ISLNK (st.st_mode)) {
            char target[PATH_MAX];
            ssize_t n = readlink (full, target, sizeof target - 1);
            if (n >= 0) {
                target[n] = 0;
                rc = cli_tar_add_symlink (tar, name, target, st.st_mtime, why, why_size);
            }
        } else {
            zchunk_t *chunk = NULL;
            zfile_t *file = zfile_new (NULL, full);
            if (file && zfile_input (file) == 0) {
                chunk = zfile_read (file, (size_t) st.st_size, 0);
                zfile_close (file);
            }
            zfile_destroy (&file);
            if (!chunk && st.st_size > 0) {
                snprintf (why, why_size, "cannot read %s: %s", full, strerror (errno));
                rc = -1;
            } else {
                size_t size = chunk ? zchunk_size (chunk) : 0;
                *bytes += size;
                if (*bytes > max) {
                    snprintf (why, why_size,
                              "%s grew over handoff_session's limit of %.0f MiB "
                              "while it was read",
                              dir, s_mib (max));
                    rc = -1;
                } else
                    rc = cli_tar_add_file (tar, name, st.st_mode & 07777, st.st_mtime,
                                           chunk ? zchunk_data (chunk) : NULL, size, why, why_size);
            }
            zchunk_destroy (&chunk);
        }
        zstr_free (&full);
    }
    zlist_destroy (&names);
    if (rc)
        cli_tar_destroy (&tar);
    return tar;
}

json_t *cli_handoff_run (cli_remote_t *remote, const char *dir, json_t *args, size_t max)
{
    char why[2048];
    if (cli_handoff_check (args, why, sizeof why))
        return s_failed ("%s", why);
    if (streq (dir, "/"))
        return s_failed ("the working directory of sbx mcp is /: start it in the directory to "
                         "hand off (Claude Code does; elsewhere set the client's cwd)");
    const char *path = json_string_value (json_object_get (args, "path"));
    if (!path)
        path = S_DEFAULT_PATH;
    size_t files, bytes;
    cli_tar_t *tar = s_pack (dir, max, &files, &bytes, why, sizeof why);
    if (!tar)
        return s_failed ("%s", why);
    size_t size;
    const uint8_t *data = cli_tar_finish (tar, &size);

    json_t *result = NULL;
    char *sandbox = NULL;
    const char *given = json_string_value (json_object_get (args, "sandboxId"));
    if (given)
        sandbox = strdup (given);
    else {
        json_t *create = json_object ();
        json_t *created = cli_remote_tool (remote, "create_sandbox", create, why, sizeof why);
        json_decref (create);
        if (created)
            sandbox = strdup (json_string_value (json_object_get (created, "id")) ?: "");
        json_decref (created);
        if (!sandbox || !*sandbox) {
            result = s_failed ("could not create a sandbox for the handoff: %s", why);
            goto done;
        }
    }

    //  The parts, named so two handoffs at once don't mix, then unpacked in order.
    char stem[64];
    snprintf (stem, sizeof stem, "/tmp/sbx-handoff-%d-%08x", (int) getpid (),
              (unsigned) randof (0x7fffffff));
    size_t parts = size / S_PART_MAX + (size % S_PART_MAX ? 1 : 0);
    char *list = strdup ("");
    for (size_t part = 0; part < parts; part++) {
        size_t at = part * S_PART_MAX;
        size_t n = size - at < S_PART_MAX ? size - at : S_PART_MAX;
        char *b64 = s_base64 (data + at, n);
        char name[96];
        snprintf (name, sizeof name, "%s.%zu", stem, part);
        json_t *write = json_pack ("{s:s, s:s, s:s, s:s}", "path", name, "content", b64, "encoding",
                                   "base64", "sandboxId", sandbox);
        free (b64);
        json_t *written = cli_remote_tool (remote, "write_file", write, why, sizeof why);
        json_decref (write);
        if (!written) {
            free (list);
            result = s_failed ("could not copy the files into %s: %s", sandbox, why);
            goto done;
        }
        json_decref (written);
        char *longer = zsys_sprintf ("%s %s", list, name);
        free (list);
        list = longer;
    }
    char *quoted = s_quote (path);
    char *command = zsys_sprintf ("mkdir -p %s && cat%s | tar -xf - -C %s; rc=$?; rm -f%s; "
                                  "exit $rc",
                                  quoted, list, quoted, list);
    free (quoted);
    free (list);
    json_t *exec =
        json_pack ("{s:s, s:s, s:i}", "command", command, "sandboxId", sandbox, "timeout", 120);
    zstr_free (&command);
    json_t *ran = cli_remote_tool (remote, "exec", exec, why, sizeof why);
    json_decref (exec);
    if (!ran) {
        result = s_failed ("could not unpack the files in %s: %s", sandbox, why);
        goto done;
    }
    json_int_t exit_code = json_integer_value (json_object_get (ran, "exitCode"));
    if (!json_is_integer (json_object_get (ran, "exitCode")) || exit_code != 0) {
        result = s_failed ("unpacking the files into %s in %s failed (exit code %lld): %.500s",
                           path, sandbox, (long long) exit_code,
                           json_string_value (json_object_get (ran, "stderr")) ?: "");
        json_decref (ran);
        goto done;
    }
    json_decref (ran);
    char text[2048];
    snprintf (text, sizeof text,
              "Copied %zu files (%zu bytes) from %s to %s in %s. Run commands there with exec "
              "and cwd %s.",
              files, bytes, dir, path, sandbox, path);
    result = json_pack ("{s:[{s:s, s:s}], s:{s:s, s:s, s:I, s:I}}", "content", "type", "text",
                        "text", text, "structuredContent", "sandboxId", sandbox, "path", path,
                        "files", (json_int_t) files, "bytes", (json_int_t) bytes);
done:
    free (sandbox);
    cli_tar_destroy (&tar);
    return result;
}

void cli_handoff_test (bool verbose)
{
    (void) verbose;
    char why[512];
    json_t *tool = cli_handoff_tool ();
    assert (streq (json_string_value (json_object_get (tool, "name")), "handoff_session"));
    assert (
        json_is_false (json_object_get (json_object_get (tool, "annotations"), "readOnlyHint")));
    json_decref (tool);

    json_t *args = json_pack ("{s:s, s:s}", "sandboxId", "sb_0123456789", "path", "/root/w x");
    assert (cli_handoff_check (args, why, sizeof why) == 0);
    json_decref (args);
    args = json_pack ("{s:s}", "path", "relative");
    assert (cli_handoff_check (args, why, sizeof why) == -1 && strstr (why, "absolute"));
    json_decref (args);
    args = json_pack ("{s:i}", "path", 3);
    assert (cli_handoff_check (args, why, sizeof why) == -1 && strstr (why, "must be a string"));
    json_decref (args);
    args = json_pack ("{s:s}", "sandboxId", "sb;rm -rf");
    assert (cli_handoff_check (args, why, sizeof why) == -1 && strstr (why, "sandboxId"));
    json_decref (args);
    args = json_pack ("{s:s}", "dir", "/x");
    assert (cli_handoff_check (args, why, sizeof why) == -1 && strstr (why, "unknown argument"));
    json_decref (args);
    assert (cli_handoff_check (json_null (), why, sizeof why) == -1);

    char *b = s_base64 ((const uint8_t *) "foobar", 6);
    assert (streq (b, "Zm9vYmFy"));
    free (b);
    b = s_base64 ((const uint8_t *) "fooba", 5);
    assert (streq (b, "Zm9vYmE="));
    free (b);
    b = s_base64 ((const uint8_t *) "f", 1);
    assert (streq (b, "Zg=="));
    free (b);

    char *q = s_quote ("/root/it's");
    assert (streq (q, "'/root/it'\\''s'"));
    free (q);

    //  Over the limit: refused before anything is sent (no remote needed), naming both.
    char dir[] = "/tmp/cli_handoff_test_XXXXXX";
    assert (mkdtemp (dir));
    char *file = zsys_sprintf ("%s/big", dir);
    FILE *f = fopen (file, "w");
    for (int i = 0; i < 3000; i++)
        fputc ('x', f);
    fclose (f);
    args = json_object ();
    json_t *result = cli_handoff_run (NULL, dir, args, 2048);
    const char *text = json_string_value (
        json_object_get (json_array_get (json_object_get (result, "content"), 0), "text"));
    assert (json_is_true (json_object_get (result, "isError")));
    assert (strstr (text, "3000 bytes") && strstr (text, "(2048 bytes)"));
    json_decref (result);
    result = cli_handoff_run (NULL, "/", args, 2048);
    assert (json_is_true (json_object_get (result, "isError")));
    json_decref (result);
    json_decref (args);
    unlink (file);
    zstr_free (&file);
    rmdir (dir);
}
