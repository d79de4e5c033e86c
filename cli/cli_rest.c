/*  cli_rest - see cli_rest.h */
#include "cli_rest.h"
#include "cli_http.h"
#include "cli_sse.h"
#include "sbx_args.h"
#include "sbx_config.h"

#include <unistd.h>

struct cli_rest_t {
    cli_http_t *http;
    char *url;
    char *auth; //  "Authorization: Bearer sbx_…"
    char *ca_cert;
};

cli_rest_t *cli_rest_new (const cli_profile_t *profile)
{
    cli_rest_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = cli_http_new (profile->ca_cert);
    self->url = strdup (profile->url);
    self->auth = zsys_sprintf ("Authorization: Bearer %s", profile->api_key);
    self->ca_cert = profile->ca_cert ? strdup (profile->ca_cert) : NULL;
    if (!self->http || !self->url || !self->auth)
        cli_rest_destroy (&self);
    return self;
}

void cli_rest_destroy (cli_rest_t **self_p)
{
    cli_rest_t *self = *self_p;
    if (self) {
        cli_http_destroy (&self->http);
        free (self->url);
        if (self->auth)
            memset (self->auth, 0, strlen (self->auth));
        free (self->auth);
        free (self->ca_cert);
        free (self);
        *self_p = NULL;
    }
}

int cli_rest_for (const char *command, const char *data_dir, cli_rest_t **rest_p)
{
    *rest_p = NULL;
    if (data_dir)
        return 0; //  an installation named: the operator's way, as ever
    char why[1200];
    cli_profile_t *profile = cli_profile_load (why, sizeof why);
    if (!profile && *why) {
        fprintf (stderr, "%s: %s\n", command, why);
        return 2;
    }
    if (profile) {
        *rest_p = cli_rest_new (profile);
        cli_profile_destroy (&profile);
        if (!*rest_p)
            return 2;
    }
    return 0;
}

int cli_rest_local_only (const char *command, const char *data_dir)
{
    if (data_dir)
        return 0;
    char why[1200];
    cli_profile_t *profile = cli_profile_load (why, sizeof why);
    if (!profile)
        return 0;
    //  The host's operator may have a profile too: the local installation still wins.
    char *run = zsys_sprintf ("%s/run", sbx_config_default_data_dir ());
    bool local = access (run, R_OK | W_OK | X_OK) == 0;
    free (run);
    if (!local)
        fprintf (stderr,
                 "%s is an operator's command: it works on the sbx host (as root, or with "
                 "--data-dir), not through %s (%s). From here: sbx sandbox, sbx snapshot, "
                 "sbx usage and sbx key list|revoke.\n",
                 command, profile->url, profile->from);
    cli_profile_destroy (&profile);
    return local ? 0 : 2;
}

const char *cli_rest_url (cli_rest_t *self)
{
    return self->url;
}

const char *cli_rest_auth (cli_rest_t *self)
{
    return self->auth;
}

const char *cli_rest_ca_cert (cli_rest_t *self)
{
    return self->ca_cert;
}

//  An argument's value as URL text, percent-encoded (all but RFC 3986's unreserved).
static void s_escaped (zchunk_t *out, json_t *value)
{
    char number[32];
    const char *text = number;
    if (json_is_integer (value))
        snprintf (number, sizeof number, "%lld", (long long) json_integer_value (value));
    else if (json_is_boolean (value))
        text = json_is_true (value) ? "true" : "false";
    else
        text = json_string_value (value) ? json_string_value (value) : "";
    for (const unsigned char *p = (const unsigned char *) text; *p; p++) {
        if (isalnum (*p) || strchr ("-._~", *p))
            zchunk_extend (out, p, 1);
        else {
            char hex[4];
            snprintf (hex, sizeof hex, "%%%02X", *p);
            zchunk_extend (out, hex, 3);
        }
    }
}

char *cli_rest_target (sbx_op_t op, json_t *args)
{
    const sbx_op_info_t *info = &sbx_ops[op];
    if (!info->method)
        return NULL;
    zchunk_t *out = zchunk_new (NULL, 0);
    zchunk_extend (out, info->method, strlen (info->method));
    zchunk_extend (out, " ", 1);
    bool missing = false;
    for (const char *p = info->path; *p;) {
        const char *open = strchr (p, '{');
        if (!open) {
            zchunk_extend (out, p, strlen (p));
            break;
        }
        zchunk_extend (out, p, (size_t) (open - p));
        const char *close = strchr (open, '}');
        char *name = strndup (open + 1, (size_t) (close - open - 1));
        json_t *value = json_object_get (args, name);
        missing |= !value;
        s_escaped (out, value);
        free (name);
        p = close + 1;
    }
    char sep = '?';
    for (unsigned i = 0; i < info->arg_count; i++) {
        const sbx_op_arg_t *arg = &info->args[i];
        json_t *value = json_object_get (args, arg->name);
        if (arg->in != SBX_ARG_IN_QUERY || !value || json_is_null (value))
            continue;
        zchunk_extend (out, &sep, 1);
        zchunk_extend (out, arg->name, strlen (arg->name));
        zchunk_extend (out, "=", 1);
        s_escaped (out, value);
        sep = '&';
    }
    char *target = missing ? NULL : strndup ((char *) zchunk_data (out), zchunk_size (out));
    zchunk_destroy (&out);
    return target;
}

//  The JSON body of op: the body arguments given.
static json_t *s_body (sbx_op_t op, json_t *args)
{
    json_t *body = json_object ();
    for (unsigned i = 0; i < sbx_ops[op].arg_count; i++) {
        const sbx_op_arg_t *arg = &sbx_ops[op].args[i];
        json_t *value = json_object_get (args, arg->name);
        if (arg->in == SBX_ARG_IN_BODY && value)
            json_object_set (body, arg->name, value);
    }
    return body;
}

//  How long to wait: the operation's own wait, a waited exec's timeout, and a margin.
static long s_timeout_s (sbx_op_t op, json_t *args)
{
    long wait = (long) sbx_ops[op].deadline_ms / 1000 + 30;
    if (op == SBX_OP_EXEC && !json_is_true (json_object_get (args, "detached"))) {
        json_t *timeout = json_object_get (args, "timeout");
        wait += json_is_integer (timeout) ? (long) json_integer_value (timeout) : 120;
    }
    return wait;
}

//  The service's error answer (or what its status says) as err.
static void s_error (cli_rest_t *self, const char *target, const char *url,
                     const cli_http_answer_t *got, sbx_err_t *err)
{
    json_t *parsed = json_loadb (got->body ? got->body : "", got->size, 0, NULL);
    json_t *error = json_object_get (parsed, "error");
    const char *code_name = json_string_value (json_object_get (error, "code"));
    const char *message = json_string_value (json_object_get (error, "message"));
    sbx_code_t code = SBX_E_INTERNAL;
    if (!code_name || sbx_code_from_name (code_name, &code))
        code = got->status == 401 ? SBX_E_UNAUTHENTICATED : SBX_E_INTERNAL;
    if (code == SBX_E_UNAUTHENTICATED)
        sbx_err_set (err, code,
                     "%s refused the API key: run `sbx login %s` with a valid key, or set "
                     "SBX_API_KEY",
                     self->url, self->url);
    else if (message)
        sbx_err_set (err, code, "%s", message);
    else
        sbx_err_set (err, code, "%s %s answered HTTP %ld", target, url, got->status);
    json_decref (parsed);
}

//  Makes op's request and sends it (accept: the Accept header; sink: the body as it
//  comes). 0 with *got, *target and *url (the caller frees them), or -1 with err.
static int s_request (cli_rest_t *self, sbx_op_t op, json_t *args, const void *data, size_t size,
                      const char *accept, cli_http_sink_fn *sink, void *sink_arg,
                      cli_http_answer_t *got, char **target_p, char **url_p, sbx_err_t *err)
{
    char *target = cli_rest_target (op, args);
    if (!target) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "%s has no REST route for these arguments",
                     sbx_ops[op].name);
        return -1;
    }
    char *space = strchr (target, ' ');
    *space = 0;
    char *url = zsys_sprintf ("%s%s", self->url, space + 1);
    char *body = NULL;
    size_t body_size = 0;
    const char *type = "Content-Type: application/json";
    if (sbx_ops[op].rest_body == SBX_OPS_BODY_RAW) {
        type = "Content-Type: application/octet-stream";
        body = malloc (size + 1);
        memcpy (body, data ? data : "", size);
        body_size = size;
    } else if (sbx_ops[op].rest_body != SBX_OPS_BODY_NONE) {
        json_t *object = s_body (op, args);
        body = json_dumps (object, JSON_COMPACT);
        body_size = body ? strlen (body) : 0;
        json_decref (object);
    }
    const char *headers[] = {self->auth, type, accept, NULL};
    char why[1200];
    int rc = cli_http_request (self->http, target, url, headers, body, body_size,
                               s_timeout_s (op, args), sink, sink_arg, got, why, sizeof why);
    free (body);
    if (rc) {
        sbx_err_set (err, SBX_E_UNAVAILABLE, "%s%s", why,
                     strstr (why, "certificate") ? " (is SBX_CA_CERT, or login's --ca-cert, the "
                                                   "service's CA?)"
                                                 : "");
        free (url);
        free (target);
        return -1;
    }
    *target_p = target;
    *url_p = url;
    return 0;
}

int cli_rest_call (cli_rest_t *self, sbx_op_t op, json_t *args, const void *data, size_t size,
                   json_t **answer, char **bytes, size_t *bytes_size, sbx_err_t *err)
{
    if (answer)
        *answer = NULL;
    cli_http_answer_t got;
    char *target, *url;
    if (s_request (self, op, args, data, size, "Accept: application/json", NULL, NULL, &got,
                   &target, &url, err))
        return -1;
    int rc = 0;
    json_t *parsed = NULL;
    if (got.status >= 300) {
        s_error (self, target, url, &got, err);
        rc = -1;
    } else if (op == SBX_OP_READ_FILE) {
        *bytes = got.body; //  the file itself
        *bytes_size = got.size;
        got.body = NULL;
    } else if (!(parsed = json_loadb (got.body, got.size, 0, NULL))) {
        sbx_err_set (err, SBX_E_INTERNAL, "%s answered something that is not JSON", url);
        rc = -1;
    } else if (answer)
        *answer = parsed;
    else
        json_decref (parsed);
    cli_http_answer_free (&got);
    free (url);
    free (target);
    return rc;
}

typedef struct {
    cli_sse_t *sse;
} s_stream_t;

static void s_on_stream_body (void *arg, const char *content_type, const char *data, size_t size)
{
    s_stream_t *s = arg;
    if (s->sse && content_type && strncasecmp (content_type, "text/event-stream", 17) == 0)
        cli_sse_feed (s->sse, data, size);
}

int cli_rest_stream (cli_rest_t *self, sbx_op_t op, json_t *args, cli_rest_event_fn *on_event,
                     void *arg, sbx_err_t *err)
{
    s_stream_t stream = {cli_sse_new (on_event, arg)};
    cli_http_answer_t got;
    char *target, *url;
    int rc = s_request (self, op, args, NULL, 0, "Accept: text/event-stream", s_on_stream_body,
                        &stream, &got, &target, &url, err);
    if (rc == 0) {
        if (got.status >= 300) {
            s_error (self, target, url, &got, err);
            rc = -1;
        } else
            cli_sse_end (stream.sse);
        cli_http_answer_free (&got);
        free (url);
        free (target);
    }
    cli_sse_destroy (&stream.sse);
    return rc;
}

void cli_rest_set_abort (cli_rest_t *self, volatile sig_atomic_t *flag)
{
    cli_http_set_abort (self->http, flag);
}

//  --------------------------------------------------------------------------
//  Self test: requests made from the definitions; no service.

void cli_rest_test (bool verbose)
{
    (void) verbose;
    json_t *args =
        json_pack ("{s:s, s:i, s:i}", "sandboxId", "sb_x", "processId", 7, "stdoutOffset", 2);
    char *t = cli_rest_target (SBX_OP_COMMAND_STATUS, args);
    assert (t && streq (t, "GET /v1/sandboxes/sb_x/processes/7?stdoutOffset=2"));
    free (t);
    json_object_set_new (args, "path", json_string ("/root/a b&c.txt"));
    t = cli_rest_target (SBX_OP_READ_FILE, args);
    assert (t && streq (t, "GET /v1/sandboxes/sb_x/files?path=%2Froot%2Fa%20b%26c.txt"));
    free (t);
    assert (cli_rest_target (SBX_OP_GET_SNAPSHOT, args) == NULL); //  no snapshotId
    json_decref (args);
    args = json_pack ("{s:s, s:b, s:i}", "command", "echo hi", "detached", 0, "timeout", 5);
    json_t *body = s_body (SBX_OP_EXEC, args);
    assert (json_equal (body, args)); //  every exec argument but the id is the body's
    assert (s_timeout_s (SBX_OP_EXEC, args) > 5 + 30);
    json_decref (body);
    json_decref (args);
    //  Nothing listening: unavailable, said with the URL.
    cli_profile_t profile = {.url = "http://127.0.0.1:9", .api_key = "sbx_k"};
    cli_rest_t *rest = cli_rest_new (&profile);
    assert (rest && streq (cli_rest_url (rest), "http://127.0.0.1:9"));
    sbx_err_t err;
    json_t *answer;
    assert (cli_rest_call (rest, SBX_OP_LIST_SANDBOXES, NULL, NULL, 0, &answer, NULL, NULL, &err) ==
            -1);
    assert (err.code == SBX_E_UNAVAILABLE &&
            strstr (err.message, "http://127.0.0.1:9/v1/sandboxes"));
    cli_rest_destroy (&rest);
    assert (!rest);
}
