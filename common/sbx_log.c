/*  sbx_log - see sbx_log.h */
#include "sbx_log.h"
#include "sbx_clock.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

static char s_process[64] = "sbx";
static sbx_log_level_t s_level = SBX_LOG_INFO;
static bool s_json = false;
static char s_file[PATH_MAX]; //  sbx_log_set_file's path, "" when none
static bool s_own_stderr;     //  the file is stderr; else a copy goes to s_file_fd
static int s_file_fd = -1;

static const char *s_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
static const char *s_json_names[] = {"debug", "info", "warn", "error"};

//  The longest message kept, and the longest line (every byte of a message may
//  become a six-byte JSON escape).
#define S_MSG_MAX  4096
#define S_LINE_MAX (S_MSG_MAX * 6 + 1024)

void sbx_log_init (const char *process, sbx_log_level_t level)
{
    snprintf (s_process, sizeof s_process, "%s", process ? process : "sbx");
    s_level = level;
    const char *env = getenv ("SBX_LOG_LEVEL");
    if (env) {
        if (strcasecmp (env, "debug") == 0)
            s_level = SBX_LOG_DEBUG;
        else if (strcasecmp (env, "info") == 0)
            s_level = SBX_LOG_INFO;
        else if (strcasecmp (env, "warn") == 0)
            s_level = SBX_LOG_WARN;
        else if (strcasecmp (env, "error") == 0)
            s_level = SBX_LOG_ERROR;
    }
    s_json = false;
    env = getenv ("SBX_LOG_FORMAT");
    if (env)
        sbx_log_set_format (env);
}

int sbx_log_set_format (const char *format)
{
    if (format && strcmp (format, "text") == 0)
        s_json = false;
    else if (format && strcmp (format, "json") == 0)
        s_json = true;
    else
        return -1;
    return 0;
}

//  --------------------------------------------------------------------------
//  Files

//  Puts a freshly opened fd where lines go: onto stdout and stderr, or in place of the
//  copy's descriptor. dup2 swaps atomically, so a thread writing meanwhile writes its
//  line whole to the old file or to the new one.
static int s_install (int fd)
{
    int rc = 0;
    if (s_own_stderr) {
        if (dup2 (fd, STDOUT_FILENO) == -1 || dup2 (fd, STDERR_FILENO) == -1)
            rc = -1;
        close (fd);
    } else if (s_file_fd >= 0) {
        if (dup3 (fd, s_file_fd, O_CLOEXEC) == -1)
            rc = -1;
        close (fd);
    } else
        s_file_fd = fd;
    return rc;
}

int sbx_log_set_file (const char *path, bool own_stderr)
{
    if (!path) {
        if (s_file_fd >= 0)
            close (s_file_fd);
        s_file_fd = -1;
        s_file[0] = 0;
        return 0;
    }
    if (strlen (path) >= sizeof s_file) {
        sbx_error ("log file path too long: %.100s...", path);
        return -1;
    }
    int fd = open (path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd == -1) {
        sbx_error ("cannot open the log file %s: %s", path, strerror (errno));
        return -1;
    }
    if (s_file_fd >= 0 && own_stderr) {
        close (s_file_fd);
        s_file_fd = -1;
    }
    s_own_stderr = own_stderr;
    snprintf (s_file, sizeof s_file, "%s", path);
    return s_install (fd);
}

int sbx_log_reopen (void)
{
    if (!*s_file)
        return -1;
    int fd = open (s_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd == -1) {
        sbx_error ("cannot reopen the log file %s: %s", s_file, strerror (errno));
        return -1;
    }
    return s_install (fd);
}

const char *sbx_log_file (void)
{
    return *s_file ? s_file : NULL;
}

//  --------------------------------------------------------------------------
//  Rendering

typedef struct {
    char *data;
    size_t len, cap; //  cap keeps room for the line's end
    bool full;
} s_buf_t;

static void s_put (s_buf_t *buf, const char *text, size_t len)
{
    if (buf->full || buf->len + len > buf->cap) {
        buf->full = true;
        return;
    }
    memcpy (buf->data + buf->len, text, len);
    buf->len += len;
}

//  The length of the well-formed UTF-8 sequence at s (1 to 4), or 0: overlong forms,
//  surrogates and code points past U+10FFFF are not well-formed (RFC 3629).
static size_t s_utf8_len (const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t need = c >= 0xC2 && c < 0xE0   ? 2
                  : c >= 0xE0 && c < 0xF0 ? 3
                  : c >= 0xF0 && c < 0xF5 ? 4
                                          : 0;
    if (need == 0 || n < need)
        return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return need;
}

//  Text: a control character would start a forged line or move the cursor, so each is
//  written as an escape; everything else as it is.
static void s_put_text (s_buf_t *buf, const char *text, size_t len)
{
    for (size_t i = 0; i < len && !buf->full; i++) {
        unsigned char c = (unsigned char) text[i];
        char esc[8];
        if (c == '\n')
            s_put (buf, "\\n", 2);
        else if (c == '\r')
            s_put (buf, "\\r", 2);
        else if ((c < 0x20 && c != '\t') || c == 0x7f) {
            snprintf (esc, sizeof esc, "\\x%02x", c);
            s_put (buf, esc, 4);
        } else
            s_put (buf, (const char *) &text[i], 1);
    }
}

//  A JSON string, quoted; invalid UTF-8 becomes U+FFFD, byte by byte. Cut short, it
//  stops before a whole character or escape, never inside one.
static void s_put_json (s_buf_t *buf, const char *text, size_t len)
{
    s_put (buf, "\"", 1);
    const unsigned char *s = (const unsigned char *) text;
    size_t cap = buf->cap;
    buf->cap = cap - 1; //  the closing quote always fits
    for (size_t i = 0; i < len && !buf->full;) {
        unsigned char c = s[i];
        char esc[8];
        size_t n = s_utf8_len (s + i, len - i);
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char) c;
            s_put (buf, esc, 2);
        } else if (c == '\n')
            s_put (buf, "\\n", 2);
        else if (c == '\r')
            s_put (buf, "\\r", 2);
        else if (c == '\t')
            s_put (buf, "\\t", 2);
        else if (c < 0x20 || c == 0x7f) {
            snprintf (esc, sizeof esc, "\\u%04x", c);
            s_put (buf, esc, 6);
        } else if (n == 0) {
            s_put (buf, "\xEF\xBF\xBD", 3);
            n = 1;
        } else
            s_put (buf, text + i, n);
        i += n ? n : 1;
    }
    buf->cap = cap;
    buf->full = false;
    s_put (buf, "\"", 1);
}

//  Fields the JSON line has of its own: a context word with one of these names stays
//  in the message.
static bool s_reserved (const char *name, size_t len)
{
    static const char *fields[] = {"ts", "level", "daemon", "pid", "msg", NULL};
    for (const char **f = fields; *f; f++)
        if (strlen (*f) == len && memcmp (*f, name, len) == 0)
            return true;
    return false;
}

#define S_CONTEXT_MAX 8

typedef struct {
    const char *key, *value;
    size_t key_len, value_len;
    bool number;
} s_context_t;

//  The "key=value" word at p, up to the next space: 0 when it is not one. A key is
//  lower case, digits and _, from a letter.
static size_t s_context_word (const char *p, s_context_t *ctx)
{
    size_t k = 0;
    if (!(p[0] >= 'a' && p[0] <= 'z'))
        return 0;
    while ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9') || p[k] == '_')
        k++;
    if (p[k] != '=' || k > 32)
        return 0;
    size_t v = strcspn (p + k + 1, " ");
    if (v == 0)
        return 0;
    ctx->key = p;
    ctx->key_len = k;
    ctx->value = p + k + 1;
    ctx->value_len = v;
    ctx->number = false;
    if (k == 3 && memcmp (p, "rid", 3) == 0) {
        //  rid is a number (a JSON one: no leading zero; within int64 for every
        //  parser); one that is not stays in the message.
        if (v > 18 || strspn (ctx->value, "0123456789") < v || (v > 1 && ctx->value[0] == '0'))
            return 0;
        ctx->key = "request_id";
        ctx->key_len = 10;
        ctx->number = true;
    }
    if (s_reserved (ctx->key, ctx->key_len))
        return 0;
    return k + 1 + v;
}

//  Pulls the leading context words out of msg (after an optional bare word such as
//  "mcp"): fills ctx, returns their count, and in lead/rest the message without them.
static size_t s_context (const char *msg, s_context_t *ctx, const char **lead, size_t *lead_len,
                         const char **rest)
{
    *lead = NULL;
    *lead_len = 0;
    *rest = msg;
    const char *p = msg;
    size_t bare = 0;
    while (p[bare] >= 'a' && p[bare] <= 'z')
        bare++;
    s_context_t probe;
    if (bare > 0 && p[bare] == ' ' && s_context_word (p + bare + 1, &probe)) {
        *lead = p;
        *lead_len = bare;
        p += bare + 1;
    }
    size_t count = 0;
    while (count < S_CONTEXT_MAX) {
        size_t n = s_context_word (p, &ctx[count]);
        bool repeated = false;
        for (size_t i = 0; n && i < count; i++)
            repeated |= ctx[i].key_len == ctx[count].key_len &&
                        memcmp (ctx[i].key, ctx[count].key, ctx[i].key_len) == 0;
        if (!n || repeated)
            break;
        count++;
        p += n;
        while (*p == ' ')
            p++;
    }
    if (count == 0) {
        *lead = NULL;
        *lead_len = 0;
        return 0;
    }
    *rest = p;
    return count;
}

//  One line for the event, with its newline, in out (S_LINE_MAX bytes): its length.
static size_t s_render (bool json, sbx_log_level_t level, const char *ts, int pid, const char *msg,
                        char *out, size_t size)
{
    s_buf_t buf = {out, 0, size - 1, false};
    char head[160];
    if (!json) {
        int n = snprintf (head, sizeof head, "%s %s %s[%d] ", ts, s_names[level], s_process, pid);
        s_put (&buf, head, (size_t) n);
        s_put_text (&buf, msg, strlen (msg));
    } else {
        s_put (&buf, "{\"ts\":", 6);
        s_put_json (&buf, ts, strlen (ts));
        int n = snprintf (head, sizeof head, ",\"level\":\"%s\",\"daemon\":", s_json_names[level]);
        s_put (&buf, head, (size_t) n);
        s_put_json (&buf, s_process, strlen (s_process));
        n = snprintf (head, sizeof head, ",\"pid\":%d", pid);
        s_put (&buf, head, (size_t) n);
        s_context_t ctx[S_CONTEXT_MAX];
        const char *lead, *rest;
        size_t lead_len;
        size_t count = s_context (msg, ctx, &lead, &lead_len, &rest);
        for (size_t i = 0; i < count; i++) {
            s_put (&buf, ",", 1);
            s_put_json (&buf, ctx[i].key, ctx[i].key_len);
            s_put (&buf, ":", 1);
            if (ctx[i].number)
                s_put (&buf, ctx[i].value, ctx[i].value_len);
            else
                s_put_json (&buf, ctx[i].value, ctx[i].value_len);
        }
        s_put (&buf, ",\"msg\":", 7);
        //  The bare word and the rest make one message: "mcp" + " " + "tools/call ...".
        char joined[S_MSG_MAX + 64];
        snprintf (joined, sizeof joined, "%.*s%s%s", (int) lead_len, lead ? lead : "",
                  lead ? " " : "", rest);
        buf.cap = size - 3; //  the message may be cut, the object is always closed
        s_put_json (&buf, joined, strlen (joined));
        buf.cap = size - 1;
        buf.full = false;
        s_put (&buf, "}", 1);
    }
    out[buf.len++] = '\n';
    return buf.len;
}

void sbx_log (sbx_log_level_t level, const char *format, ...)
{
    if (level < s_level || level > SBX_LOG_ERROR)
        return;
    char ts[32];
    sbx_clock_iso8601 (sbx_clock_now_ms (), ts, sizeof ts);
    char msg[S_MSG_MAX];
    va_list args;
    va_start (args, format);
    vsnprintf (msg, sizeof msg, format, args);
    va_end (args);
    //  Build the whole line first: one write() keeps lines from interleaving.
    char line[S_LINE_MAX];
    size_t len = s_render (s_json, level, ts, (int) getpid (), msg, line, sizeof line);
    ssize_t rc = write (STDERR_FILENO, line, len);
    if (s_file_fd >= 0)
        rc = write (s_file_fd, line, len);
    (void) rc;
}

//  --------------------------------------------------------------------------
//  Self-test

static bool s_test_eq (const char *a, const char *b)
{
    return a && b && strcmp (a, b) == 0;
}

//  Renders msg as JSON and parses it back with jansson: every line must be a valid
//  object with the fixed fields.
static json_t *s_test_json (const char *msg)
{
    static char line[S_LINE_MAX];
    size_t len =
        s_render (true, SBX_LOG_WARN, "2026-11-30T01:23:45.123Z", 4242, msg, line, sizeof line);
    assert (len > 0 && line[len - 1] == '\n');
    assert (memchr (line, '\n', len - 1) == NULL);
    json_error_t error;
    json_t *root = json_loadb (line, len, 0, &error);
    if (!root)
        fprintf (stderr, "sbx_log_test: %s in %.*s\n", error.text, (int) len, line);
    assert (root && json_is_object (root));
    assert (
        s_test_eq (json_string_value (json_object_get (root, "ts")), "2026-11-30T01:23:45.123Z"));
    assert (s_test_eq (json_string_value (json_object_get (root, "level")), "warn"));
    assert (s_test_eq (json_string_value (json_object_get (root, "daemon")), "sbx_log_test"));
    assert (json_integer_value (json_object_get (root, "pid")) == 4242);
    assert (json_is_string (json_object_get (root, "msg")));
    return root;
}

static const char *s_test_field (json_t *root, const char *key)
{
    return json_string_value (json_object_get (root, key));
}

static char *s_test_slurp (const char *path)
{
    FILE *file = fopen (path, "r");
    assert (file);
    static char text[4096];
    size_t size = fread (text, 1, sizeof text - 1, file);
    text[size] = 0;
    fclose (file);
    return text;
}

void sbx_log_test (bool verbose)
{
    sbx_log_init ("sbx_log_test", verbose ? SBX_LOG_DEBUG : SBX_LOG_ERROR);
    sbx_debug ("rid=%d a debug line", 1);
    //  A line longer than the buffer is cut, not overflowed.
    char big[8000];
    memset (big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sbx_debug ("%s", big);
    assert (sbx_log_set_format ("xml") == -1);
    assert (sbx_log_set_format ("json") == 0);
    sbx_debug ("%s", big);
    assert (sbx_log_set_format ("text") == 0);

    //  Text: the convention's line, and one event per line whatever the text holds.
    char line[S_LINE_MAX];
    const char *ts = "2026-11-30T01:23:45.123Z";
    size_t len =
        s_render (false, SBX_LOG_INFO, ts, 4242, "rid=17 sandbox=sb_x created", line, sizeof line);
    line[len] = 0;
    assert (s_test_eq (line, "2026-11-30T01:23:45.123Z INFO  sbx_log_test[4242] rid=17 "
                             "sandbox=sb_x created\n"));
    len = s_render (false, SBX_LOG_ERROR, ts, 1, "name 'a\nERROR forged\r\x1b[2J\x7f\tb'", line,
                    sizeof line);
    line[len] = 0;
    assert (s_test_eq (line, "2026-11-30T01:23:45.123Z ERROR sbx_log_test[1] name "
                             "'a\\nERROR forged\\r\\x1b[2J\\x7f\tb'\n"));

    //  JSON: the context words become fields, the rest is the message.
    json_t *root = s_test_json ("rid=17 sandbox=sb_x0n1a2hf96 account=ac_1 created");
    assert (json_integer_value (json_object_get (root, "request_id")) == 17);
    assert (s_test_eq (s_test_field (root, "sandbox"), "sb_x0n1a2hf96"));
    assert (s_test_eq (s_test_field (root, "account"), "ac_1"));
    assert (s_test_eq (s_test_field (root, "msg"), "created"));
    assert (json_object_get (root, "rid") == NULL);
    json_decref (root);
    //  After one bare word naming the part, which stays in the message.
    root = s_test_json ("mcp rid=5 tools/call: cancelled");
    assert (json_integer_value (json_object_get (root, "request_id")) == 5);
    assert (s_test_eq (s_test_field (root, "msg"), "mcp tools/call: cancelled"));
    json_decref (root);
    //  Not context: a word that only looks like it, a reserved name, a repeated key, a
    //  rid that is no number, an empty value; those and all after stay in the message.
    const char *kept[][2] = {{"started sbx-broker (pid 7)", NULL},
                             {"pid=7 level=error forged", NULL},
                             {"rid=abc x", NULL},
                             {"rid=007 x", NULL},
                             {"rid=1234567890123456789 x", NULL},
                             {"sandbox= x", NULL},
                             {"mcp session 1 opened", NULL},
                             {"sandbox=a sandbox=b x", "sandbox=b x"},
                             {"Key=1 x", NULL},
                             {"", NULL}};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        root = s_test_json (kept[i][0]);
        assert (s_test_eq (s_test_field (root, "msg"), kept[i][1] ? kept[i][1] : kept[i][0]));
        assert (json_object_size (root) == (kept[i][1] ? 6u : 5u));
        json_decref (root);
    }
    //  Hostile text: quotes, backslashes and control characters are escaped, valid
    //  UTF-8 passes, invalid bytes (stray, overlong, surrogate, past U+10FFFF, cut
    //  short) each become U+FFFD.
    root = s_test_json ("sandbox=a\"b\\c\x01 say \"hi\"\n{\"level\":\"error\"}\t\x7f µ$ 🙂 "
                        "\xff|\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80|\xe2\x82");
    assert (s_test_eq (s_test_field (root, "sandbox"), "a\"b\\c\x01"));
    assert (
        s_test_eq (s_test_field (root, "msg"),
                   "say \"hi\"\n{\"level\":\"error\"}\t\x7f µ$ 🙂 "
                   "\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|"
                   "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD"));
    assert (s_test_eq (s_test_field (root, "level"), "warn"));
    json_decref (root);
    //  The longest message, all escapes, still makes one valid object.
    char worst[S_MSG_MAX];
    memset (worst, 0x01, sizeof worst - 1);
    worst[sizeof worst - 1] = 0;
    root = s_test_json (worst);
    assert (strlen (s_test_field (root, "msg")) == sizeof worst - 1);
    json_decref (root);

    //  Random bytes, after context-like words or not: always one valid object per line.
    srandom (42);
    static const char *prefixes[] = {"", "rid=1 ", "mcp rid=2 sandbox=", "account=", "x=\xff "};
    for (int round = 0; round < 2000; round++) {
        char msg[600];
        int at = snprintf (msg, sizeof msg, "%s", prefixes[round % 5]);
        int len = at + (int) (random () % 500);
        for (int i = at; i < len; i++)
            msg[i] = (char) (1 + random () % 255);
        msg[len] = 0;
        json_decref (s_test_json (msg));
    }

    //  Files, as a daemon uses them, in a child (its stderr becomes the file): lines
    //  before a rename go to the renamed file, after sbx_log_reopen to a new one.
    char dir[] = "/tmp/sbx_log_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[64], rotated[80];
    snprintf (path, sizeof path, "%s/d.log", dir);
    snprintf (rotated, sizeof rotated, "%s.1", path);
    assert (sbx_log_reopen () == -1 && sbx_log_file () == NULL);
    pid_t pid = fork ();
    assert (pid >= 0);
    if (pid == 0) {
        sbx_log_init ("sbx_log_test", SBX_LOG_INFO);
        sbx_log_set_format ("json");
        int ok = sbx_log_set_file (path, true) == 0 && s_test_eq (sbx_log_file (), path);
        sbx_info ("rid=1 before");
        fprintf (stderr, "a stray write\n");
        ok &= rename (path, rotated) == 0;
        sbx_info ("rid=2 still to the renamed file");
        ok &= sbx_log_reopen () == 0;
        sbx_info ("rid=3 after");
        _exit (ok ? 0 : 1);
    }
    int status;
    assert (waitpid (pid, &status, 0) == pid && WIFEXITED (status) && WEXITSTATUS (status) == 0);
    char *text = s_test_slurp (rotated);
    assert (strstr (text, "\"request_id\":1,\"msg\":\"before\"}\na stray write\n{"));
    assert (strstr (text, "\"request_id\":2") && !strstr (text, "\"request_id\":3"));
    text = s_test_slurp (path);
    assert (strstr (text, "\"request_id\":3,\"msg\":\"after\"}\n") && !strstr (text, "before"));
    sbx_log_init ("sbx_log_test", verbose ? SBX_LOG_DEBUG : (sbx_log_level_t) (SBX_LOG_ERROR + 1));
    assert (sbx_log_set_file ("/nonexistent/dir/x.log", true) == -1);
    assert (sbx_log_file () == NULL);
    unlink (path);
    unlink (rotated);
    rmdir (dir);
    sbx_log_init ("sbx", SBX_LOG_INFO);
}
