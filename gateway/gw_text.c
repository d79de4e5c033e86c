/*  gw_text - see gw_text.h */
#include "gw_text.h"
#include "sbx_api.h"
#include "sbx_args.h"

#include <assert.h>

struct gw_text_t {
    json_t *words;
};

gw_text_t *gw_text_new (void)
{
    gw_text_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->words = json_loads (sbx_ops_words_json, 0, NULL);
    if (!json_is_object (self->words))
        gw_text_destroy (&self);
    return self;
}

void gw_text_destroy (gw_text_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        json_decref ((*self_p)->words);
        free (*self_p);
        *self_p = NULL;
    }
}

//  One {…} token: its kind (0, '#', '?', '^', '/', '@'), name and format.
typedef struct {
    char kind;
    char name[64];
    char fmt[128];
    size_t length; //  of the whole token, braces included
} s_token_t;

static bool s_token (const char *at, s_token_t *token)
{
    if (*at != '{')
        return false;
    const char *end = strchr (at, '}');
    if (!end)
        return false;
    const char *p = at + 1;
    token->kind = strchr ("#?^/@", *p) && *p ? *p++ : 0;
    size_t n = strcspn (p, ":}");
    if (n == 0 || n >= sizeof token->name || p + n > end)
        return false;
    memcpy (token->name, p, n);
    token->name[n] = 0;
    token->fmt[0] = 0;
    if (p[n] == ':') {
        size_t f = (size_t) (end - (p + n + 1));
        if (f >= sizeof token->fmt)
            return false;
        memcpy (token->fmt, p + n + 1, f);
        token->fmt[f] = 0;
    }
    token->length = (size_t) (end - at) + 1;
    return true;
}

static bool s_set (json_t *v)
{
    return v && !json_is_null (v) && !json_is_false (v) &&
           !(json_is_string (v) && json_string_length (v) == 0) &&
           !(json_is_array (v) && json_array_size (v) == 0);
}

//  A value as text; an array of strings as "a, b" (a sandbox's egress lists).
static void s_plain (zchunk_t *out, json_t *v)
{
    char buf[64];
    int n = 0;
    if (json_is_array (v)) {
        size_t i;
        json_t *item;
        json_array_foreach (v, i, item)
        {
            if (i)
                zchunk_extend (out, ", ", 2);
            s_plain (out, item);
        }
    } else if (json_is_string (v))
        zchunk_extend (out, json_string_value (v), json_string_length (v));
    else if (json_is_integer (v))
        n = snprintf (buf, sizeof buf, "%lld", (long long) json_integer_value (v));
    else if (json_is_real (v))
        n = snprintf (buf, sizeof buf, "%g", json_real_value (v));
    else if (json_is_boolean (v))
        n = snprintf (buf, sizeof buf, "%s", json_is_true (v) ? "true" : "false");
    if (n > 0)
        zchunk_extend (out, buf, (size_t) n);
}

static const char *s_word (gw_text_t *self, const char *table, const char *key)
{
    for (int hops = 0; hops < 4; hops++) {
        json_t *words = json_object_get (self->words, table);
        const char *word = json_string_value (json_object_get (words, key ? key : "*"));
        if (!word)
            word = json_string_value (json_object_get (words, "*"));
        if (!word || word[0] != '@')
            return word ? word : "";
        table = word + 1; //  "@other": that table's word
    }
    return "";
}

static void s_value (gw_text_t *self, zchunk_t *out, json_t *v, const char *fmt)
{
    char buf[96];
    if (!*fmt) {
        s_plain (out, v);
    } else if (streq (fmt, "chomp")) {
        size_t size = json_string_length (v);
        const char *text = json_string_value (v);
        if (size && text[size - 1] == '\n')
            size--;
        if (text)
            zchunk_extend (out, text, size);
    } else if (streq (fmt, "mib")) {
        int n =
            snprintf (buf, sizeof buf, "%.1f", (double) json_integer_value (v) / (1024.0 * 1024.0));
        zchunk_extend (out, buf, (size_t) n);
    } else if (streq (fmt, "bytes")) {
        //  As people read sizes: 512 B, 12 KiB, 120 MiB, 1.1 GiB.
        sbx_api_bytes ((uint64_t) json_integer_value (v), buf, sizeof buf);
        zchunk_extend (out, buf, strlen (buf));
    } else if (streq (fmt, "signal")) {
        int number = (int) json_integer_value (v);
        const char *name = sbx_api_signal_name (number);
        int n = name ? snprintf (buf, sizeof buf, "SIG%s", name)
                     : snprintf (buf, sizeof buf, "signal %d", number);
        zchunk_extend (out, buf, (size_t) n);
    } else if (strncmp (fmt, "words.", 6) == 0) {
        const char *key = json_is_string (v)  ? json_string_value (v)
                          : json_is_true (v)  ? "true"
                          : json_is_false (v) ? "false"
                                              : NULL;
        const char *word = s_word (self, fmt + 6, key);
        zchunk_extend (out, word, strlen (word));
    } else if (strncmp (fmt, "plural.", 7) == 0) {
        long long count = json_is_array (v) ? (long long) json_array_size (v)
                                            : (long long) json_integer_value (v);
        const char *one = fmt + 7;
        const char *dot = strchr (one, '.');
        if (!dot)
            return;
        int n = count == 1 ? snprintf (buf, sizeof buf, "1 %.*s", (int) (dot - one), one)
                           : snprintf (buf, sizeof buf, "%lld %s", count, dot + 1);
        zchunk_extend (out, buf, (size_t) n < sizeof buf ? (size_t) n : sizeof buf - 1);
    } else if (strncmp (fmt, "cut.", 4) == 0) {
        //  A line of a list: the first line, at most N bytes, never half a character.
        const char *text = json_string_value (v);
        size_t size = json_string_length (v), max = strtoul (fmt + 4, NULL, 10), n = 0;
        while (text && n < size && n < max && text[n] != '\n')
            n++;
        while (n < size && n > 0 && ((unsigned char) text[n] & 0xC0) == 0x80)
            n--; //  text[n] continues a character: cut before the character starts
        if (text)
            zchunk_extend (out, text, n);
        if (n < size)
            zchunk_extend (out, "…", strlen ("…"));
    } else if (strncmp (fmt, "or.", 3) == 0) {
        if (s_set (v))
            s_plain (out, v);
        else
            zchunk_extend (out, fmt + 3, strlen (fmt + 3));
    }
}

//  Where the section opened at *at (just after its token) ends: the position of its
//  closing token, whose length goes into *close_length. NULL when it never closes.
static const char *s_close (const char *at, const char *name, size_t *close_length)
{
    int depth = 0;
    s_token_t token;
    for (const char *p = at; *p; p++) {
        if (*p != '{' || !s_token (p, &token))
            continue;
        if (token.kind == '#' || token.kind == '?' || token.kind == '^')
            depth++;
        else if (token.kind == '/') {
            if (depth == 0 && streq (token.name, name)) {
                *close_length = token.length;
                return p;
            }
            depth--;
        }
        p += token.length - 1;
    }
    return NULL;
}

typedef struct {
    gw_text_t *self;
    sbx_op_t op;
    json_t *args;
    zchunk_t *out;
} s_render_t;

static void s_render (s_render_t *r, const char *from, const char *to, json_t *scope)
{
    const char *p = from;
    while (p < to) {
        s_token_t token;
        if (*p != '{' || !s_token (p, &token) || p + token.length > to) {
            const char *next = memchr (p + 1, '{', (size_t) (to - p - 1));
            if (!next)
                next = to;
            zchunk_extend (r->out, p, (size_t) (next - p));
            p = next;
            continue;
        }
        p += token.length;
        if (token.kind == '@') {
            json_t *v = json_object_get (r->args, token.name);
            json_t *dflt = NULL;
            if (!v) {
                //  Not given: the argument's default (timeout 120).
                const sbx_op_arg_t *arg = sbx_args_find (r->op, token.name);
                if (arg && arg->dflt)
                    v = dflt = json_loads (arg->dflt, JSON_DECODE_ANY, NULL);
            }
            s_value (r->self, r->out, v, token.fmt);
            json_decref (dflt);
        } else if (token.kind == 0)
            s_value (r->self, r->out, json_object_get (scope, token.name), token.fmt);
        else if (token.kind == '/')
            continue; //  a stray close: the generator refuses those
        else {
            size_t close_length = 0;
            const char *end = s_close (p, token.name, &close_length);
            if (!end || end > to)
                return;
            json_t *v = json_object_get (scope, token.name);
            if (token.kind == '^') {
                if (!s_set (v))
                    s_render (r, p, end, scope);
            } else if (token.kind == '#' && json_is_array (v)) {
                size_t i;
                json_t *item;
                json_array_foreach (v, i, item) s_render (r, p, end, item);
            } else if (token.kind == '#' && json_is_object (v))
                s_render (r, p, end, v); //  once, its fields in scope
            else if (s_set (v))
                s_render (r, p, end, scope);
            p = end + close_length;
        }
    }
}

char *gw_text_render_template (gw_text_t *self, const char *template, sbx_op_t op, json_t *answer,
                               json_t *args)
{
    assert (self);
    zchunk_t *out = zchunk_new (NULL, 0);
    if (template) {
        s_render_t r = {self, op, args, out};
        s_render (&r, template, template + strlen (template), answer);
    }
    zchunk_extend (out, "", 1);
    char *text = strdup ((char *) zchunk_data (out));
    zchunk_destroy (&out);
    //  Fields are UTF-8 and so are the words; a cut never splits one here. Still, JSON
    //  needs UTF-8: keep it so.
    if (text)
        sbx_utf8_sanitize (text);
    return text;
}

char *gw_text_render (gw_text_t *self, sbx_op_t op, json_t *answer, json_t *args)
{
    const char *template = (unsigned) op < SBX_OP__COUNT ? sbx_ops[op].text : NULL;
    return gw_text_render_template (self, template, op, answer, args);
}

//  --------------------------------------------------------------------------
//  Self test

static void s_expect (gw_text_t *text, sbx_op_t op, const char *answer_json, const char *args_json,
                      const char *expected)
{
    json_t *answer = json_loads (answer_json, 0, NULL);
    json_t *args = json_loads (args_json ? args_json : "{}", 0, NULL);
    assert (answer && args);
    char *got = gw_text_render (text, op, answer, args);
    if (!streq (got, expected))
        fprintf (stderr, "gw_text %s: got %s, expected %s\n", sbx_ops[op].name, got, expected);
    assert (streq (got, expected));
    free (got);
    json_decref (answer);
    json_decref (args);
}

void gw_text_test (bool verbose)
{
    (void) verbose;
    gw_text_t *text = gw_text_new ();
    assert (text);
    //  Every MCP operation has its words, and renders with an empty answer.
    for (int op = 0; op < SBX_OP__COUNT; op++) {
        assert (!sbx_ops[op].tool || sbx_ops[op].text);
        json_t *empty = json_object ();
        char *s = gw_text_render (text, (sbx_op_t) op, empty, empty);
        assert (s);
        free (s);
        json_decref (empty);
    }
    s_expect (text, SBX_OP_CREATE_SANDBOX,
              "{\"id\":\"sb_1\",\"state\":\"ready\",\"url\":\"https://a.box.localhost\","
              "\"expiresAt\":\"2026-12-02T03:00:00Z\"}",
              NULL,
              "Sandbox sb_1 is ready. URL: https://a.box.localhost. Stops automatically at "
              "2026-12-02T03:00:00Z.");
    s_expect (text, SBX_OP_STOP_SANDBOX,
              "{\"id\":\"sb_1\",\"state\":\"stopped\",\"url\":\"u\",\"expiresAt\":null}", NULL,
              "Sandbox sb_1 is stopped with its memory kept; it bills no running time until "
              "resume_sandbox. URL: u.");
    //  A table's default from another table.
    s_expect (text, SBX_OP_STOP_SANDBOX,
              "{\"id\":\"sb_1\",\"state\":\"error\",\"url\":\"u\",\"reason\":\"vmd lost\"}", NULL,
              "Sandbox sb_1 is in error. URL: u. Reason: vmd lost.");
    s_expect (text, SBX_OP_GET_SANDBOX,
              "{\"id\":\"sb_1\",\"state\":\"ready\",\"url\":\"u\",\"runningSeconds\":0,"
              "\"costUsd\":\"0.000000\"}",
              NULL, "Sandbox sb_1 is ready. URL: u. Running time so far: 0 s, $0.000000.");
    s_expect (text, SBX_OP_LIST_SANDBOXES, "{\"sandboxes\":[]}", NULL, "No sandboxes.");
    //  Sizes as people read them.
    s_expect (text, SBX_OP_GET_SANDBOX_METRICS,
              "{\"sandboxId\":\"sb_1\",\"state\":\"ready\",\"sampling\":true,"
              "\"intervalSeconds\":5,\"cpuPercent\":3.5,\"memoryUsedBytes\":125829120,"
              "\"memoryTotalBytes\":503316480,\"diskUsedBytes\":1181116006,"
              "\"diskTotalBytes\":2147483648,\"networkInBytes\":12288,\"networkOutBytes\":700,"
              "\"spanSeconds\":205,\"sampledAt\":\"2026-12-02T03:00:00Z\",\"samples\":[{},{}]}",
              NULL,
              "Sandbox sb_1 is ready. CPU 3.5%, memory 120 MiB of 480 MiB, disk 1.1 GiB of 2.0 "
              "GiB, network in 12 KiB out 700 B; 2 samples over 205 s, the latest at "
              "2026-12-02T03:00:00Z.");
    s_expect (text, SBX_OP_GET_SANDBOX_METRICS,
              "{\"sandboxId\":\"sb_1\",\"sampling\":true,\"intervalSeconds\":5,\"samples\":[]}",
              NULL, "No samples of sb_1 yet. Its host samples it every 5 s while it runs.");
    s_expect (text, SBX_OP_GET_SANDBOX_METRICS,
              "{\"sandboxId\":\"sb_1\",\"sampling\":false,\"intervalSeconds\":0,\"samples\":[]}",
              NULL, "No samples of sb_1 yet. Sampling is off on its host.");
    s_expect (text, SBX_OP_LIST_SANDBOXES,
              "{\"sandboxes\":[{\"id\":\"sb_1\",\"state\":\"ready\",\"name\":\"n\",\"type\":"
              "\"small\",\"url\":\"u\",\"expiresAt\":\"t\"}]}",
              NULL, "1 sandbox:\nsb_1  ready  n  small  u  stops at t");
    s_expect (text, SBX_OP_LIST_SANDBOXES,
              "{\"sandboxes\":[{\"id\":\"sb_1\",\"state\":\"ready\",\"name\":\"n\",\"type\":"
              "\"small\",\"url\":\"u\"}],\"nextCursor\":\"p1.5.2\"}",
              NULL, "1 sandbox:\nsb_1  ready  n  small  u\nMore: list again with cursor p1.5.2.");
    //  Output: streams without one trailing newline, the timeout from the default.
    s_expect (text, SBX_OP_EXEC,
              "{\"processId\":4,\"exitCode\":3,\"stdout\":\"hello\\n\",\"stderr\":\"oops\\n\","
              "\"running\":false,\"timedOut\":true}",
              "{\"sandboxId\":\"sb_1\"}",
              "Exit code 3. The command ran longer than 120 s and was killed; use detached: "
              "true for long commands.\nstdout:\nhello\nstderr:\noops");
    s_expect (text, SBX_OP_EXEC, "{\"processId\":4,\"running\":true,\"exitCode\":null}",
              "{\"sandboxId\":\"sb_1\"}",
              "Started process 4 in sb_1. Call command_status with processId 4 for its output "
              "and exit code.");
    s_expect (text, SBX_OP_COMMAND_STATUS,
              "{\"processId\":4,\"running\":false,\"exitCode\":0,\"stdout\":\"x\","
              "\"stderrTruncated\":true,\"stdoutNextOffset\":1,\"stderrNextOffset\":9}",
              NULL,
              "Process 4 exited with code 0.\nstdout:\nx\n(Output was cut: call command_status "
              "with processId 4, stdoutOffset 1 and stderrOffset 9 for more.)");
    s_expect (text, SBX_OP_KILL_COMMAND, "{\"processId\":4,\"signal\":9}", "{\"sandboxId\":\"s\"}",
              "Sent SIGKILL to process 4 in s. Call command_status for its exit code.");
    s_expect (text, SBX_OP_KILL_COMMAND, "{\"processId\":4,\"signal\":40}", "{\"sandboxId\":\"s\"}",
              "Sent signal 40 to process 4 in s. Call command_status for its exit code.");
    s_expect (text, SBX_OP_LIST_COMMANDS, "{\"processes\":[]}", "{\"sandboxId\":\"s\"}",
              "No processes in s.");
    s_expect (
        text, SBX_OP_LIST_COMMANDS,
        "{\"processes\":[{\"processId\":7,\"command\":\"sleep 9\",\"running\":true,"
        "\"detached\":false},{\"processId\":8,\"command\":\"printf \\u00e9\\u00e9\\nexit 3\","
        "\"running\":false,\"detached\":true,\"exitCode\":137,\"signal\":9}]}",
        "{\"sandboxId\":\"s\"}",
        "2 processes in s, oldest first:\n7  running  foreground  sleep 9\n8  exit 137 (SIGKILL)  "
        "detached  printf \u00e9\u00e9…");
    s_expect (text, SBX_OP_HOST_PORT, "{\"port\":8000,\"url\":\"u\",\"public\":false}",
              "{\"sandboxId\":\"s\"}", "Port 8000 of s is at u (private).");
    s_expect (text, SBX_OP_HOST_PORT,
              "{\"port\":8000,\"url\":\"u\",\"public\":true,\"removed\":true}",
              "{\"sandboxId\":\"s\"}", "Port 8000 of s is no longer published.");
    s_expect (text, SBX_OP_SAVE_SNAPSHOT,
              "{\"id\":\"snap_1\",\"sandboxId\":null,\"sizeBytes\":1572864}", NULL,
              "Saved snapshot snap_1 of the sandbox (1.5 MiB). Start new sandboxes from it with "
              "create_sandbox and snapshotId snap_1.");
    s_expect (text, SBX_OP_LIST_SNAPSHOTS,
              "{\"snapshots\":[{\"id\":\"a\",\"state\":\"ready\",\"sizeBytes\":0},{\"id\":\"b\","
              "\"state\":\"failed\",\"name\":\"n\",\"sandboxId\":\"s\",\"sizeBytes\":0,"
              "\"createdAt\":\"t\",\"reason\":\"disk full\"}]}",
              NULL,
              "2 snapshots:\na  ready  -  from -  0.0 MiB  \nb  failed  n  from s  0.0 MiB  t  "
              "disk full");
    //  Egress: the object's fields in scope, its lists joined.
    s_expect (text, SBX_OP_SET_SANDBOX_EGRESS,
              "{\"id\":\"sb_1\",\"url\":\"u\",\"egress\":{\"allow\":[\"pypi.org\","
              "\"1.1.1.1/32\"],\"deny\":[\"evil.com\"]}}",
              NULL,
              "Sandbox sb_1 egress rules: deny evil.com; only pypi.org, 1.1.1.1/32 (and DNS) "
              "reachable; the fixed policy (no host, private or special-purpose addresses) "
              "always applies. URL: u.");
    s_expect (text, SBX_OP_SET_SANDBOX_EGRESS,
              "{\"id\":\"sb_1\",\"url\":\"u\",\"egress\":{\"allow\":[],\"deny\":[]}}", NULL,
              "Sandbox sb_1 egress rules: none of its own; the fixed policy (no host, private or "
              "special-purpose addresses) always applies. URL: u.");
    //  Templates of one's own: nested sections, a stray brace as text.
    json_t *answer = json_pack ("{s:[{s:b},{s:b}]}", "xs", "on", 1, "on", 0);
    char *s =
        gw_text_render_template (text, "{#xs}[{?on}on{/on}{^on}off{/on}]{/xs} {a", 0, answer, NULL);
    assert (streq (s, "[on][off] {a"));
    free (s);
    json_decref (answer);
    gw_text_destroy (&text);
    assert (!text);
}
