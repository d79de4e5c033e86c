/*  sbx_args - see sbx_args.h */
#include "sbx_args.h"
#include "sbx_common.h"

#include <assert.h>
#include <errno.h>
#include <regex.h>
#include <stdarg.h>

static int s_fail (char *why, size_t why_size, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));
static int s_fail (char *why, size_t why_size, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    if (why && why_size)
        vsnprintf (why, why_size, format, args);
    va_end (args);
    return -1;
}

const sbx_op_arg_t *sbx_args_find (sbx_op_t op, const char *name)
{
    if ((unsigned) op >= SBX_OP__COUNT || !name)
        return NULL;
    for (unsigned i = 0; i < sbx_ops[op].arg_count; i++)
        if (streq (sbx_ops[op].args[i].name, name))
            return &sbx_ops[op].args[i];
    return NULL;
}

//  The type words of a mask, "a string or an integer".
static void s_types (unsigned types, char *out, size_t size)
{
    static const struct {
        unsigned bit;
        const char *word;
    } words[] = {{SBX_ARG_STRING, "a string"},
                 {SBX_ARG_INTEGER, "an integer"},
                 {SBX_ARG_BOOLEAN, "true or false"},
                 {SBX_ARG_OBJECT, "an object"},
                 {SBX_ARG_NULL, "null"},
                 {SBX_ARG_ARRAY, "an array"}};
    out[0] = 0;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (types & words[i].bit) {
            size_t used = strlen (out);
            snprintf (out + used, size - used, "%s%s", used ? " or " : "", words[i].word);
        }
}

//  An integer, or a real with an integral value (some clients send 3.0).
static bool s_integer (json_t *v, json_int_t *n)
{
    if (json_is_integer (v)) {
        *n = json_integer_value (v);
        return true;
    }
    if (json_is_real (v)) {
        double real = json_real_value (v);
        if (real >= -9.2e18 && real <= 9.2e18 && real == (double) (json_int_t) real) {
            *n = (json_int_t) real;
            return true;
        }
    }
    return false;
}

static size_t s_chars (const char *text)
{
    size_t n = 0;
    for (; *text; text++)
        n += ((unsigned char) *text & 0xC0) != 0x80;
    return n;
}

static unsigned s_type_of (json_t *v)
{
    json_int_t n;
    return json_is_string (v)    ? SBX_ARG_STRING
           : s_integer (v, &n)   ? SBX_ARG_INTEGER
           : json_is_boolean (v) ? SBX_ARG_BOOLEAN
           : json_is_object (v)  ? SBX_ARG_OBJECT
           : json_is_null (v)    ? SBX_ARG_NULL
           : json_is_array (v)   ? SBX_ARG_ARRAY
                                 : 0;
}

static int s_value (const sbx_op_arg_t *a, json_t *v, char *why, size_t why_size)
{
    char words[80];
    unsigned type = s_type_of (v);
    if (!(type & a->types)) {
        s_types (a->types, words, sizeof words);
        return s_fail (why, why_size, "%s must be %s", a->name, words);
    }
    if (type == SBX_ARG_INTEGER) {
        json_int_t n = 0;
        s_integer (v, &n);
        if (a->has_min && a->has_max && (n < a->min || n > a->max))
            return s_fail (why, why_size, "%s must be between %lld and %lld", a->name,
                           (long long) a->min, (long long) a->max);
        if (a->has_min && n < a->min)
            return s_fail (why, why_size, "%s must be at least %lld", a->name, (long long) a->min);
        if (a->has_max && n > a->max)
            return s_fail (why, why_size, "%s must be at most %lld", a->name, (long long) a->max);
    }
    if (type == SBX_ARG_STRING) {
        const char *text = json_string_value (v);
        if (strlen (text) != json_string_length (v))
            return s_fail (why, why_size, "%s must not contain NUL characters", a->name);
        //  Counted only when bounded: write_file's content may be 16 MiB.
        size_t chars = a->min_length > 0 || a->max_length >= 0 ? s_chars (text) : 0;
        if (chars < (size_t) a->min_length)
            return s_fail (why, why_size, "%s must be at least %lld characters", a->name,
                           (long long) a->min_length);
        if (a->max_length >= 0 && chars > (size_t) a->max_length)
            return s_fail (why, why_size, "%s is at most %lld characters", a->name,
                           (long long) a->max_length);
        if (a->choices) {
            bool ok = false;
            char list[200] = "";
            for (int i = 0; a->choices[i]; i++) {
                ok = ok || streq (a->choices[i], text);
                size_t used = strlen (list);
                snprintf (list + used, sizeof list - used, "%s%s", i ? ", " : "", a->choices[i]);
            }
            if (!ok)
                return s_fail (why, why_size, "%s is one of %s", a->name, list);
        }
        if (a->pattern) {
            regex_t re;
            if (regcomp (&re, a->pattern, REG_EXTENDED | REG_NOSUB))
                return s_fail (why, why_size, "%s cannot be checked (pattern %s)", a->name,
                               a->pattern);
            int rc = regexec (&re, text, 0, NULL, 0);
            regfree (&re);
            if (rc) {
                if (streq (a->pattern, "^/"))
                    return s_fail (why, why_size, "%s must be an absolute path such as /root/x",
                                   a->name);
                return s_fail (why, why_size, "%s must match %s", a->name, a->pattern);
            }
        }
    }
    if (type == SBX_ARG_ARRAY && a->values) {
        size_t i;
        json_t *item;
        s_types (a->values, words, sizeof words);
        json_array_foreach (v, i, item)
        {
            if (!(s_type_of (item) & a->values) ||
                (json_is_string (item) &&
                 strlen (json_string_value (item)) != json_string_length (item)))
                return s_fail (why, why_size, "%s is a list of %s values", a->name, words);
        }
    }
    if (type == SBX_ARG_OBJECT && a->values) {
        const char *key;
        json_t *item;
        s_types (a->values, words, sizeof words);
        json_object_foreach (v, key, item)
        {
            if (!*key || !(s_type_of (item) & a->values) ||
                (json_is_string (item) &&
                 strlen (json_string_value (item)) != json_string_length (item)))
                return s_fail (why, why_size, "%s maps names to %s values", a->name, words);
        }
    }
    return 0;
}

//  "unknown field "x" (this operation takes: ...)": names what it takes, so a typo can
//  be fixed at once. REST names its body fields; MCP the tool's arguments.
static int s_unknown (sbx_op_t op, unsigned surface, const char *key, char *why, size_t why_size)
{
    const sbx_op_info_t *info = &sbx_ops[op];
    char list[300] = "";
    for (unsigned i = 0; i < info->arg_count; i++) {
        const sbx_op_arg_t *x = &info->args[i];
        if (!(x->surfaces & surface) || (surface == SBX_OPS_REST && x->in != SBX_ARG_IN_BODY))
            continue;
        size_t used = strlen (list);
        snprintf (list + used, sizeof list - used, "%s%s", used ? ", " : "", x->name);
    }
    if (surface == SBX_OPS_REST)
        return s_fail (why, why_size, "unknown field \"%.60s\" (this operation takes: %s)", key,
                       *list ? list : "no fields");
    return s_fail (why, why_size, "unknown argument \"%.60s\" (%s takes: %s)", key, info->name,
                   *list ? list : "no arguments");
}

int sbx_args_check_body (sbx_op_t op, json_t *body, char *why, size_t why_size)
{
    if ((unsigned) op >= SBX_OP__COUNT || !json_is_object (body))
        return s_fail (why, why_size, "the body must be a JSON object");
    const char *key;
    json_t *value;
    json_object_foreach (body, key, value)
    {
        const sbx_op_arg_t *a = sbx_args_find (op, key);
        if (!a || !(a->surfaces & SBX_OPS_REST) || a->in != SBX_ARG_IN_BODY)
            return s_unknown (op, SBX_OPS_REST, key, why, why_size);
    }
    return 0;
}

int sbx_args_check (sbx_op_t op, unsigned surface, json_t *args, char *why, size_t why_size)
{
    if ((unsigned) op >= SBX_OP__COUNT)
        return s_fail (why, why_size, "no such operation");
    if (args && !json_is_object (args))
        return s_fail (why, why_size, "the arguments must be a JSON object");
    const sbx_op_info_t *info = &sbx_ops[op];
    const char *key;
    json_t *value;
    json_object_foreach (args, key, value)
    {
        const sbx_op_arg_t *a = sbx_args_find (op, key);
        if (!a || !(a->surfaces & surface))
            return s_unknown (op, surface, key, why, why_size);
    }
    for (unsigned i = 0; i < info->arg_count; i++) {
        const sbx_op_arg_t *a = &info->args[i];
        if (!(a->surfaces & surface))
            continue;
        json_t *v = args ? json_object_get (args, a->name) : NULL;
        if (!v || (json_is_null (v) && !(a->types & SBX_ARG_NULL))) {
            bool needed = a->required && !(surface == SBX_OPS_MCP && a->mcp_optional);
            if (needed)
                return s_fail (why, why_size, "%s is required", a->name);
            continue;
        }
        if (s_value (a, v, why, why_size))
            return -1;
    }
    return 0;
}

json_t *sbx_args_from_text (const sbx_op_arg_t *arg, const char *text, char *why, size_t why_size)
{
    assert (arg);
    if (!text)
        text = "";
    if (arg->types & SBX_ARG_INTEGER && !(arg->types & SBX_ARG_STRING)) {
        bool negative = text[0] == '-' && arg->has_min && arg->min < 0;
        const char *digits = negative ? text + 1 : text;
        char *end;
        errno = 0;
        unsigned long long n = strtoull (digits, &end, 10);
        if (!*digits || *end || errno || digits[0] == '-' || digits[0] == '+' ||
            n > (unsigned long long) INT64_MAX) {
            s_fail (why, why_size, "%s must be an integer", arg->name);
            return NULL;
        }
        return json_integer (negative ? -(json_int_t) n : (json_int_t) n);
    }
    if (arg->types & SBX_ARG_BOOLEAN && !(arg->types & SBX_ARG_STRING)) {
        if (streq (text, "true"))
            return json_true ();
        if (streq (text, "false"))
            return json_false ();
        s_fail (why, why_size, "%s must be true or false", arg->name);
        return NULL;
    }
    json_t *value = json_string (text);
    if (!value)
        s_fail (why, why_size, "%s must be UTF-8 text", arg->name);
    return value;
}

//  The value given, else the default (parsed from its JSON text): a new reference.
static json_t *s_get (sbx_op_t op, json_t *args, const char *name)
{
    json_t *v = args ? json_object_get (args, name) : NULL;
    if (v && !json_is_null (v))
        return json_incref (v);
    const sbx_op_arg_t *a = sbx_args_find (op, name);
    if (!a || !a->dflt)
        return NULL;
    return json_loads (a->dflt, JSON_DECODE_ANY, NULL);
}

const char *sbx_args_string (sbx_op_t op, json_t *args, const char *name)
{
    json_t *v = args ? json_object_get (args, name) : NULL;
    if (json_is_string (v))
        return json_string_value (v);
    //  Defaults live in the table as text; a string default is returned from there.
    const sbx_op_arg_t *a = sbx_args_find (op, name);
    if (!v && a && a->dflt && a->dflt[0] == '"' && a->choices) {
        for (int i = 0; a->choices[i]; i++) {
            size_t n = strlen (a->choices[i]);
            if (strncmp (a->dflt + 1, a->choices[i], n) == 0 && a->dflt[n + 1] == '"')
                return a->choices[i];
        }
    }
    return NULL;
}

int64_t sbx_args_int (sbx_op_t op, json_t *args, const char *name)
{
    json_t *v = s_get (op, args, name);
    json_int_t n = 0;
    if (v)
        s_integer (v, &n);
    json_decref (v);
    return n;
}

bool sbx_args_bool (sbx_op_t op, json_t *args, const char *name)
{
    json_t *v = s_get (op, args, name);
    bool b = json_is_true (v);
    json_decref (v);
    return b;
}

json_t *sbx_args_object (json_t *args, const char *name)
{
    json_t *v = args ? json_object_get (args, name) : NULL;
    return json_is_object (v) ? v : NULL;
}

//  --------------------------------------------------------------------------
//  Self test

static int s_check (sbx_op_t op, unsigned surface, const char *json, char *why)
{
    json_t *args = json_loads (json, 0, NULL);
    assert (args);
    int rc = sbx_args_check (op, surface, args, why, 300);
    json_decref (args);
    return rc;
}

void sbx_args_test (bool verbose)
{
    (void) verbose;
    char why[300];
    //  Limits are the table's, the same through both doors.
    for (unsigned surface = SBX_OPS_MCP; surface <= SBX_OPS_REST; surface++) {
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{}", why) == 0);
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"ttlSeconds\": 59}", why) == -1);
        assert (streq (why, "ttlSeconds must be between 60 and 2592000"));
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"ttlSeconds\": 2592001}", why) == -1);
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"ttlSeconds\": 60.0}", why) == 0);
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"ttlSeconds\": \"x\"}", why) == -1);
        assert (streq (why, "ttlSeconds must be an integer"));
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"type\": \"huge\"}", why) == -1);
        assert (streq (why, "type is one of small, medium, large"));
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"labels\": {\"a\": 1}}", why) == -1);
        assert (s_check (SBX_OP_CREATE_SANDBOX, surface, "{\"ttlSeconds\": null}", why) == 0);
        assert (s_check (SBX_OP_EXEC, surface, "{\"sandboxId\": \"sb_x\"}", why) == -1);
        assert (streq (why, "command is required"));
        assert (s_check (SBX_OP_READ_FILE, surface, "{\"sandboxId\": \"s\", \"path\": \"x\"}",
                         why) == -1);
        assert (strstr (why, "absolute path"));
        assert (s_check (SBX_OP_WRITE_FILE, SBX_OPS_MCP,
                         "{\"path\": \"/x\", \"content\": \"\", \"mode\": \"0755\"}", why) == 0);
        assert (s_check (SBX_OP_WRITE_FILE, SBX_OPS_MCP,
                         "{\"path\": \"/x\", \"content\": \"\", \"mode\": \"9\"}", why) == -1);
    }
    //  Unknown names are refused on both doors, naming what the operation takes.
    assert (s_check (SBX_OP_CREATE_SANDBOX, SBX_OPS_REST, "{\"ttl\": 60}", why) == -1);
    assert (streq (why, "unknown field \"ttl\" (this operation takes: name, type, ttlSeconds, "
                        "snapshotId, template, labels, network, autoResume, egress)"));
    assert (s_check (SBX_OP_CREATE_SANDBOX, SBX_OPS_MCP, "{\"ttl\": 60}", why) == -1);
    assert (strstr (why, "unknown argument \"ttl\" (create_sandbox takes: name, type"));
    //  A REST body holds body fields only: not the path's sandboxId.
    json_t *body = json_pack ("{s:s}", "sandboxId", "sb_x");
    assert (sbx_args_check_body (SBX_OP_EXEC, body, why, sizeof why) == -1);
    assert (strstr (why, "unknown field \"sandboxId\" (this operation takes: command, detached"));
    json_decref (body);
    //  MCP-only arguments are unknown to REST.
    assert (s_check (SBX_OP_CREATE_SANDBOX, SBX_OPS_MCP, "{\"env\": {\"A\": \"1\"}}", why) == 0);
    assert (s_check (SBX_OP_CREATE_SANDBOX, SBX_OPS_REST, "{\"env\": {\"A\": \"1\"}}", why) == -1);
    //  sandboxId: MCP may leave it out (the session's default), REST may not.
    assert (s_check (SBX_OP_GET_SANDBOX, SBX_OPS_MCP, "{}", why) == 0);
    assert (s_check (SBX_OP_GET_SANDBOX, SBX_OPS_REST, "{}", why) == -1);
    assert (s_check (SBX_OP_DELETE_SANDBOX, SBX_OPS_MCP, "{}", why) == -1);
    //  Labels to change may be null (removed).
    assert (s_check (SBX_OP_LABEL_SANDBOX, SBX_OPS_MCP, "{\"labels\": {\"a\": null}}", why) == 0);
    //  Defaults come from the table.
    json_t *args = json_object ();
    assert (sbx_args_int (SBX_OP_CREATE_SANDBOX, args, "ttlSeconds") == 3600);
    assert (sbx_args_bool (SBX_OP_CREATE_SANDBOX, args, "network"));
    assert (streq (sbx_args_string (SBX_OP_CREATE_SANDBOX, args, "type"), "small"));
    assert (sbx_args_int (SBX_OP_EXEC, args, "timeout") == 120);
    assert (sbx_args_string (SBX_OP_EXEC, args, "cwd") == NULL);
    json_object_set_new (args, "ttlSeconds", json_integer (90));
    assert (sbx_args_int (SBX_OP_CREATE_SANDBOX, args, "ttlSeconds") == 90);
    json_decref (args);
    //  Text (path, query, options) becomes the argument's type.
    const sbx_op_arg_t *pid = sbx_args_find (SBX_OP_COMMAND_STATUS, "processId");
    assert (pid && pid->in == SBX_ARG_IN_PATH);
    json_t *v = sbx_args_from_text (pid, "42", why, sizeof why);
    assert (json_integer_value (v) == 42);
    json_decref (v);
    assert (sbx_args_from_text (pid, "-1", why, sizeof why) == NULL);
    assert (sbx_args_from_text (pid, "4x", why, sizeof why) == NULL);
    assert (sbx_args_from_text (pid, "", why, sizeof why) == NULL);
    v = sbx_args_from_text (sbx_args_find (SBX_OP_WRITE_FILE, "mode"), "0755", why, sizeof why);
    assert (json_is_string (v));
    json_decref (v);
}
