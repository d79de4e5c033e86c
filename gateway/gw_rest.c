/*  gw_rest - see gw_rest.h */
#include "gw_rest.h"
#include "sbx_idmap.h"
#include "gw_auth.h"
#include "gw_broker.h"
#include "sbx_ops_gen.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>

#define S_CHUNK        (1024 * 1024)      //  the agent's per-request file limit
#define S_FILE_MAX     (16 * 1024 * 1024) //  the gateway's body limit, both ways
#define S_OUTPUT_MAX   (1024 * 1024)      //  output bytes of each stream in one answer
#define S_TTL_DEFAULT  3600
#define S_TTL_MAX      (30LL * 86400)
#define S_EXEC_DEFAULT 120
#define S_EXEC_MAX     600
#define S_MARGIN_MS    30000 //  broker, vmd and agent time on top of an exec's own wait
#define S_SIMPLE_MS    30000 //  most operations' deadline in schemas/operations.json (self-test)
#define S_PARAM_MAX    128

//  docs/openapi.json, embedded by the build (gateway/CMakeLists.txt).
extern const char gw_rest_openapi[];
extern const size_t gw_rest_openapi_size;

//  The routes and their operations are schemas/operations.json's (sbx_ops_gen): paths
//  as in the OpenAPI document, {id} and {pid} match one segment.
typedef sbx_ops_route_t s_route_t;

//  What a request brings, apart from the connection: filled from gw_request_t, or by
//  the self-test.
typedef struct {
    sbx_op_t op;
    char params[2][S_PARAM_MAX]; //  {id}, {pid}
    const char *body;
    size_t body_size;
    const char *q_path, *q_mode, *q_stdout, *q_stderr, *q_sandbox;
} s_input_t;

//  One request from route to answer.
typedef struct {
    gw_rest_t *rest;
    uint64_t serial;
    uint64_t handle; //  the broker request in flight, for cancel
    uint64_t req_id;
    s_input_t in;
    char *token;
    sbx_caller_t *caller;
    //  Built from the input: the broker (or, when agent, the agent) request.
    sbx_msg_t *request;
    bool agent;
    uint32_t timeout_ms;
    char *sandbox_id;
    uint64_t pid;
    int signal;
    //  Files.
    char *path;
    uint8_t *data;
    size_t size, done_bytes;
    uint64_t mode;
} s_job_t;

struct gw_rest_t {
    gw_http_t *http;
    gw_auth_t *auth; //  the gateway's (ctx)
    gw_broker_t *broker;
    zhashx_t *jobs; //  serial → s_job_t
    uint64_t next_serial;
};

static void s_job_free (s_job_t **job_p)
{
    s_job_t *job = *job_p;
    if (job) {
        free (job->token);
        gw_auth_caller_destroy (&job->caller);
        sbx_msg_destroy (&job->request);
        free (job->sandbox_id);
        free (job->path);
        free (job->data);
        free (job);
    }
    *job_p = NULL;
}

static void s_on_route (gw_request_t *req, void *arg)
{
    gw_rest_handle ((gw_rest_t *) arg, req);
}

gw_rest_t *gw_rest_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_rest_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->http = ctx->http;
    self->next_serial = 1;
    self->auth = ctx->auth;
    self->broker = ctx->broker;
    self->jobs = sbx_idmap_new ();
    if (!self->jobs || gw_router_add (ctx->router, "/v1", true, s_on_route, self)) {
        gw_rest_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_rest_destroy (gw_rest_t **self_p)
{
    assert (self_p);
    gw_rest_t *self = *self_p;
    if (!self)
        return;
    //  Requests in flight are cancelled first (the broker client is the gateway's).
    if (self->jobs) {
        for (s_job_t *job = zhashx_first (self->jobs); job; job = zhashx_next (self->jobs)) {
            gw_broker_cancel (self->broker, job->handle);
            s_job_free (&job);
        }
        zhashx_destroy (&self->jobs);
    }
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Answers

static void s_send_json (gw_request_t *req, int status, json_t *body)
{
    char *text = json_dumps (body, JSON_COMPACT);
    json_decref (body);
    gw_request_add_header (req, "Cache-Control", "no-store");
    gw_request_respond (req, status, "application/json", text, text ? strlen (text) : 0);
    free (text);
}

static void s_send_error (gw_request_t *req, sbx_code_t code, const char *message)
{
    if (code == SBX_E_UNAUTHENTICATED)
        gw_request_add_header (req, "WWW-Authenticate", "Bearer realm=\"sbx\"");
    s_send_json (
        req, sbx_code_http_status (code),
        json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message", message));
}

//  --------------------------------------------------------------------------
//  Routing

//  True when path matches pattern segment by segment; {x} takes one non-empty segment
//  into params (in order).
static bool s_match (const char *pattern, const char *path, char params[2][S_PARAM_MAX])
{
    int n = 0;
    while (*pattern && *path) {
        if (*pattern != '/' || *path != '/')
            return false;
        pattern++;
        path++;
        size_t plen = strcspn (pattern, "/");
        size_t len = strcspn (path, "/");
        if (*pattern == '{') {
            if (len == 0 || len >= S_PARAM_MAX || n >= 2)
                return false;
            memcpy (params[n], path, len);
            params[n++][len] = 0;
        } else if (plen != len || memcmp (pattern, path, len) != 0)
            return false;
        pattern += plen;
        path += len;
    }
    return !*pattern && !*path;
}

//  The route of method and path: 0 and *route when one serves it; 404 when no route
//  has that path; 405 when some do with other methods (listed in allow).
static int s_route (const char *method, const char *path, const s_route_t **route,
                    char params[2][S_PARAM_MAX], char *allow, size_t allow_size)
{
    *route = NULL;
    *allow = 0;
    bool path_known = false;
    for (const s_route_t *r = sbx_ops_routes; r->method; r++) {
        char scratch[2][S_PARAM_MAX];
        if (!s_match (r->path, path, scratch))
            continue;
        path_known = true;
        if (streq (r->method, method)) {
            *route = r;
            memcpy (params, scratch, sizeof scratch);
            return 0;
        }
        size_t used = strlen (allow);
        snprintf (allow + used, allow_size - used, "%s%s", used ? ", " : "", r->method);
    }
    return path_known ? 405 : 404;
}

//  --------------------------------------------------------------------------
//  Building the request: each check returns 0, or -1 with a message in error.

typedef struct {
    char text[400];
} s_error_t;

static int s_fail (s_error_t *error, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));
static int s_fail (s_error_t *error, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (error->text, sizeof error->text, format, args);
    va_end (args);
    return -1;
}

//  The body as a JSON object: {} when empty and optional. known lists the fields the
//  operation takes (NULL-terminated): anything else is refused, so a typo is not
//  silently ignored.
static int s_body (const s_input_t *in, bool required, const char **known, json_t **body,
                   s_error_t *error)
{
    *body = NULL;
    size_t size = in->body_size;
    const char *text = in->body ? in->body : "";
    size_t blank = 0;
    while (blank < size && strchr (" \t\r\n", text[blank]))
        blank++;
    if (blank == size) {
        if (required)
            return s_fail (error, "a JSON object body is required");
        *body = json_object ();
        return 0;
    }
    json_error_t jerr;
    *body = json_loadb (text, size, 0, &jerr);
    if (!*body)
        return s_fail (error, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                       jerr.line, jerr.column);
    if (!json_is_object (*body)) {
        json_decref (*body);
        *body = NULL;
        return s_fail (error, "the body must be a JSON object");
    }
    const char *key;
    json_t *value;
    json_object_foreach (*body, key, value)
    {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = streq (known[i], key);
        if (!ok) {
            char list[200] = "";
            for (int i = 0; known[i]; i++) {
                size_t used = strlen (list);
                snprintf (list + used, sizeof list - used, "%s%s", i ? ", " : "", known[i]);
            }
            s_fail (error, "unknown field \"%.60s\" (this operation takes: %s)", key,
                    *list ? list : "no fields");
            json_decref (*body);
            *body = NULL;
            return -1;
        }
    }
    return 0;
}

static int s_string (json_t *body, const char *key, const char **value, bool required,
                     s_error_t *error)
{
    json_t *v = json_object_get (body, key);
    *value = NULL;
    if (!v || json_is_null (v))
        return required ? s_fail (error, "%s is required", key) : 0;
    if (!json_is_string (v))
        return s_fail (error, "%s must be a string", key);
    *value = json_string_value (v);
    return 0;
}

static int s_int (json_t *body, const char *key, json_int_t *value, json_int_t dflt, json_int_t min,
                  json_int_t max, bool required, s_error_t *error)
{
    json_t *v = json_object_get (body, key);
    *value = dflt;
    if (!v || json_is_null (v))
        return required ? s_fail (error, "%s is required", key) : 0;
    double real = json_is_real (v) ? json_real_value (v) : 0;
    if (json_is_real (v) && real == (double) (json_int_t) real)
        *value = (json_int_t) real; //  some clients send 3.0
    else if (json_is_integer (v))
        *value = json_integer_value (v);
    else
        return s_fail (error, "%s must be an integer", key);
    if (*value < min || *value > max)
        return s_fail (error, "%s must be between %lld and %lld", key, (long long) min,
                       (long long) max);
    return 0;
}

static int s_bool (json_t *body, const char *key, bool *value, bool dflt, s_error_t *error)
{
    json_t *v = json_object_get (body, key);
    *value = dflt;
    if (!v || json_is_null (v))
        return 0;
    if (!json_is_boolean (v))
        return s_fail (error, "%s must be true or false", key);
    *value = json_is_true (v);
    return 0;
}

//  An object of strings into map; with remove, null values go there instead.
static int s_map (json_t *body, const char *key, sbx_strmap_t *map, sbx_strlist_t *remove,
                  s_error_t *error)
{
    json_t *v = json_object_get (body, key);
    if (!v || json_is_null (v))
        return 0;
    const char *k;
    json_t *item;
    if (!json_is_object (v))
        goto bad;
    json_object_foreach (v, k, item)
    {
        if (!*k)
            goto bad;
        if (remove && json_is_null (item))
            sbx_strlist_append (remove, k);
        else if (json_is_string (item))
            sbx_strmap_set (map, k, json_string_value (item));
        else
            goto bad;
    }
    return 0;
bad:
    return s_fail (error, "%s must be an object of string values%s", key,
                   remove ? " (null removes one)" : "");
}

//  A query parameter that is a non-negative integer (absent: 0).
static int s_query_offset (const char *text, const char *name, uint64_t *value, s_error_t *error)
{
    *value = 0;
    if (!text)
        return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull (text, &end, 10);
    if (!*text || *end || errno || *text == '-')
        return s_fail (error, "%s must be a non-negative integer", name);
    *value = n;
    return 0;
}

static const char *s_create_fields[] = {"name",    "type",       "ttlSeconds", "labels",
                                        "network", "snapshotId", NULL};
static const char *s_update_fields[] = {"name", "labels", NULL};
static const char *s_extend_fields[] = {"ttlSeconds", NULL};
static const char *s_exec_fields[] = {"command", "detached", "timeout", "cwd", "env", NULL};
static const char *s_kill_fields[] = {"signal", NULL};
static const char *s_snapshot_fields[] = {"name", "labels", NULL};
static const char *s_port_fields[] = {"port", "public", NULL};

//  Builds job->request (and what the answer needs) from job->in. Returns 0, or the
//  code of the refusal with its message in error.
static sbx_code_t s_build (s_job_t *job, s_error_t *error)
{
    s_input_t *in = &job->in;
    json_t *body = NULL;
    sbx_code_t code = SBX_E_INVALID_ARGUMENT;
    //  Every route under /v1/sandboxes/{id} acts on that sandbox.
    static const char sandbox_path[] = "/v1/sandboxes/{id}";
    const char *path = sbx_ops[in->op].path;
    if (path && strncmp (path, sandbox_path, sizeof sandbox_path - 1) == 0)
        job->sandbox_id = strdup (in->params[0]);
    job->timeout_ms = sbx_ops[in->op].deadline_ms;
    switch (in->op) {
    case SBX_OP_GET_OPENAPI:
    case SBX_OP_RENAME_SANDBOX: //  MCP only: no route
    case SBX_OP_LABEL_SANDBOX:
        break;
    case SBX_OP_LIST_SANDBOXES:
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        break;
    case SBX_OP_GET_USAGE: {
        //  The caller's own account, from billing (the broker routes usage.get there).
        job->request = sbx_msg_new (SBX_MSG_USAGE_GET);
        sbx_usage_get_t *args = sbx_msg_usage_get (job->request);
        sbx_str_set (&args->account, job->caller ? job->caller->account_id : NULL);
        sbx_str_set (&args->sandbox_id, in->q_sandbox);
        break;
    }
    case SBX_OP_LIST_KEYS:
        //  The caller's own account: its API keys and OAuth connections.
        job->request = sbx_msg_new (SBX_MSG_KEY_LIST);
        sbx_str_set (&sbx_msg_key_list (job->request)->account,
                     job->caller ? job->caller->account_id : NULL);
        break;
    case SBX_OP_REVOKE_KEY:
        job->request = sbx_msg_new (SBX_MSG_KEY_REVOKE);
        sbx_str_set (&sbx_msg_key_revoke (job->request)->key_id, in->params[0]);
        break;
    case SBX_OP_CREATE_SANDBOX: {
        const char *name, *type, *snapshot;
        json_int_t ttl;
        bool network;
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
        sbx_sandbox_create_t *args = sbx_msg_sandbox_create (job->request);
        if (s_body (in, false, s_create_fields, &body, error) ||
            s_string (body, "name", &name, false, error) ||
            s_string (body, "type", &type, false, error) ||
            s_string (body, "snapshotId", &snapshot, false, error) ||
            s_int (body, "ttlSeconds", &ttl, S_TTL_DEFAULT, 60, S_TTL_MAX, false, error) ||
            s_bool (body, "network", &network, true, error) ||
            s_map (body, "labels", &args->labels, NULL, error))
            goto fail;
        if (name && strlen (name) > 128) {
            s_fail (error, "name is at most 128 characters");
            goto fail;
        }
        if (type && sbx_sandbox_type_from_name (type, &args->type)) {
            s_fail (error, "type is small, medium or large");
            goto fail;
        }
        sbx_str_set (&args->snapshot_id, snapshot && *snapshot ? snapshot : NULL);
        sbx_str_set (&args->name, name);
        args->ttl_s = (uint64_t) ttl;
        args->no_network = !network;
        break;
    }
    case SBX_OP_LIST_SNAPSHOTS:
        job->request = sbx_msg_new (SBX_MSG_SNAPSHOT_LIST);
        break;
    case SBX_OP_GET_SNAPSHOT:
        job->request = sbx_msg_new (SBX_MSG_SNAPSHOT_GET);
        sbx_str_set (&sbx_msg_snapshot_get (job->request)->snapshot_id, in->params[0]);
        break;
    case SBX_OP_DELETE_SNAPSHOT:
        job->request = sbx_msg_new (SBX_MSG_SNAPSHOT_DELETE);
        sbx_str_set (&sbx_msg_snapshot_delete (job->request)->snapshot_id, in->params[0]);
        break;
    case SBX_OP_SAVE_SNAPSHOT: {
        const char *name;
        job->request = sbx_msg_new (SBX_MSG_SNAPSHOT_SAVE);
        sbx_snapshot_save_t *args = sbx_msg_snapshot_save (job->request);
        if (s_body (in, false, s_snapshot_fields, &body, error) ||
            s_string (body, "name", &name, false, error) ||
            s_map (body, "labels", &args->labels, NULL, error))
            goto fail;
        if (name && strlen (name) > 128) {
            s_fail (error, "name is at most 128 characters");
            goto fail;
        }
        sbx_str_set (&args->name, name);
        sbx_str_set (&args->sandbox_id, job->sandbox_id);
        break;
    }
    case SBX_OP_GET_SANDBOX:
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_GET);
        sbx_str_set (&sbx_msg_sandbox_get (job->request)->sandbox_id, job->sandbox_id);
        break;
    case SBX_OP_DELETE_SANDBOX:
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_DELETE);
        sbx_str_set (&sbx_msg_sandbox_delete (job->request)->sandbox_id, job->sandbox_id);
        break;
    case SBX_OP_STOP_SANDBOX:
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
        sbx_str_set (&sbx_msg_sandbox_stop (job->request)->sandbox_id, job->sandbox_id);
        break;
    case SBX_OP_RESUME_SANDBOX:
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_RESUME);
        sbx_str_set (&sbx_msg_sandbox_resume (job->request)->sandbox_id, job->sandbox_id);
        break;
    case SBX_OP_HOST_PORT:
    case SBX_OP_UNPUBLISH_PORT: {
        //  MCP's host_port, as REST: publish (or unpublish) a guest port at its URL.
        json_int_t port = 0;
        bool public = false;
        if (in->op == SBX_OP_HOST_PORT) {
            if (s_body (in, true, s_port_fields, &body, error) ||
                s_int (body, "port", &port, 0, 1, 65535, true, error) ||
                s_bool (body, "public", &public, false, error))
                goto fail;
        } else {
            char *end;
            errno = 0;
            unsigned long long n = strtoull (in->params[1], &end, 10);
            if (*end || errno || n < 1 || n > 65535 || in->params[1][0] == '-') {
                s_fail (error, "the port in the path must be 1 to 65535");
                goto fail;
            }
            port = (json_int_t) n;
        }
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_PORT);
        sbx_sandbox_port_t *args = sbx_msg_sandbox_port (job->request);
        sbx_str_set (&args->sandbox_id, job->sandbox_id);
        args->port = (uint64_t) port;
        args->public = public;
        args->remove = in->op == SBX_OP_UNPUBLISH_PORT;
        break;
    }
    case SBX_OP_EXTEND_SANDBOX: {
        json_int_t ttl;
        if (s_body (in, true, s_extend_fields, &body, error) ||
            s_int (body, "ttlSeconds", &ttl, 0, 60, S_TTL_MAX, true, error))
            goto fail;
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_EXTEND);
        sbx_str_set (&sbx_msg_sandbox_extend (job->request)->sandbox_id, job->sandbox_id);
        sbx_msg_sandbox_extend (job->request)->ttl_s = (uint64_t) ttl;
        break;
    }
    case SBX_OP_UPDATE_SANDBOX: {
        const char *name;
        job->request = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
        sbx_sandbox_update_t *args = sbx_msg_sandbox_update (job->request);
        if (s_body (in, true, s_update_fields, &body, error) ||
            s_string (body, "name", &name, false, error) ||
            s_map (body, "labels", &args->labels, &args->remove_labels, error))
            goto fail;
        if (!name && !json_object_get (body, "labels")) {
            s_fail (error, "give name, labels or both");
            goto fail;
        }
        if (name && (!*name || strlen (name) > 128)) {
            s_fail (error, "name is 1 to 128 characters");
            goto fail;
        }
        sbx_str_set (&args->sandbox_id, job->sandbox_id);
        sbx_str_set (&args->name, name);
        break;
    }
    case SBX_OP_EXEC: {
        const char *command, *cwd;
        json_int_t timeout;
        bool detached;
        job->request = sbx_msg_new (SBX_MSG_AGENT_EXEC);
        sbx_agent_exec_t *args = sbx_msg_agent_exec (job->request);
        if (s_body (in, true, s_exec_fields, &body, error) ||
            s_string (body, "command", &command, true, error) ||
            s_string (body, "cwd", &cwd, false, error) ||
            s_bool (body, "detached", &detached, false, error) ||
            s_int (body, "timeout", &timeout, S_EXEC_DEFAULT, 1, S_EXEC_MAX, false, error) ||
            s_map (body, "env", &args->env, NULL, error))
            goto fail;
        sbx_str_set (&args->command, command);
        sbx_str_set (&args->cwd, cwd);
        args->detached = detached;
        args->timeout_ms = detached ? 0 : (uint64_t) timeout * 1000;
        args->max_bytes = S_OUTPUT_MAX;
        job->agent = true;
        if (!detached)
            job->timeout_ms = (uint32_t) timeout * 1000 + S_MARGIN_MS;
        break;
    }
    case SBX_OP_COMMAND_STATUS:
    case SBX_OP_KILL_COMMAND: {
        char *end;
        errno = 0;
        unsigned long long pid = strtoull (in->params[1], &end, 10);
        if (*end || errno || pid < 1 || pid > INT32_MAX || in->params[1][0] == '-') {
            s_fail (error, "the process id in the path must be a positive integer");
            goto fail;
        }
        job->pid = pid;
        job->agent = true;
        if (in->op == SBX_OP_COMMAND_STATUS) {
            uint64_t out, err;
            if (s_query_offset (in->q_stdout, "stdoutOffset", &out, error) ||
                s_query_offset (in->q_stderr, "stderrOffset", &err, error))
                goto fail;
            job->request = sbx_msg_new (SBX_MSG_AGENT_STATUS);
            sbx_agent_status_t *args = sbx_msg_agent_status (job->request);
            args->pid = pid;
            args->stdout_offset = out;
            args->stderr_offset = err;
            args->max_bytes = S_OUTPUT_MAX;
        } else {
            if (s_body (in, false, s_kill_fields, &body, error))
                goto fail;
            job->signal = gw_broker_signal_number (json_object_get (body, "signal"));
            if (job->signal < 0) {
                s_fail (error,
                        "signal is a name such as SIGTERM or SIGKILL, or a number from 1 to 64");
                goto fail;
            }
            job->request = sbx_msg_new (SBX_MSG_AGENT_KILL);
            sbx_msg_agent_kill (job->request)->pid = pid;
            sbx_msg_agent_kill (job->request)->signal = job->signal;
        }
        break;
    }
    case SBX_OP_READ_FILE:
    case SBX_OP_WRITE_FILE: {
        if (!in->q_path || in->q_path[0] != '/') {
            s_fail (error, "the query parameter path is required: an absolute path such as "
                           "?path=/root/data.bin");
            goto fail;
        }
        job->path = strdup (in->q_path);
        job->agent = true;
        if (in->op == SBX_OP_READ_FILE)
            break; //  requests are made chunk by chunk
        if (in->q_mode) {
            char *end;
            errno = 0;
            job->mode = strtoull (in->q_mode, &end, 8);
            if (!*in->q_mode || *end || errno || job->mode > 07777) {
                s_fail (error, "mode is octal text such as 0644");
                goto fail;
            }
        }
        job->size = in->body_size;
        job->data = malloc (job->size + 1);
        if (!job->data) {
            code = SBX_E_INTERNAL;
            s_fail (error, "out of memory");
            goto fail;
        }
        if (job->size)
            memcpy (job->data, in->body, job->size);
        break;
    }
    }
    json_decref (body);
    return SBX_OK;
fail:
    json_decref (body);
    sbx_msg_destroy (&job->request);
    return code;
}

//  --------------------------------------------------------------------------
//  Talking to the broker

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg);

//  Sends request (taken) for the job; the answer comes to s_on_answer.
static void s_send (s_job_t *job, sbx_msg_t **request_p)
{
    gw_rest_t *self = job->rest;
    if (job->agent)
        GW_KEEP (job->handle, gw_broker_send_agent (self->broker, job->caller, job->sandbox_id,
                                                    request_p, job->timeout_ms, s_on_answer, job));
    else
        GW_KEEP (job->handle, gw_broker_send (self->broker, job->caller, request_p, job->timeout_ms,
                                              s_on_answer, job));
}

static void s_read_next (s_job_t *job)
{
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
    sbx_str_set (&sbx_msg_agent_file_read (inner)->path, job->path);
    sbx_msg_agent_file_read (inner)->offset = job->size;
    sbx_msg_agent_file_read (inner)->length = S_CHUNK;
    s_send (job, &inner);
}

static void s_write_next (s_job_t *job)
{
    size_t n = job->size - job->done_bytes;
    if (n > S_CHUNK)
        n = S_CHUNK;
    sbx_msg_t *inner = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
    sbx_agent_file_write_t *args = sbx_msg_agent_file_write (inner);
    sbx_str_set (&args->path, job->path);
    sbx_bytes_set (&args->data, job->data + job->done_bytes, n);
    args->offset = job->done_bytes;
    args->truncate = job->done_bytes == 0;
    args->mode = job->done_bytes == 0 ? job->mode : 0;
    job->done_bytes += n;
    s_send (job, &inner);
}

static json_t *s_output (bool running, int64_t exit_code, bool timed_out, const sbx_bytes_t *out,
                         const sbx_bytes_t *err, uint64_t out_next, uint64_t err_next, bool out_cut,
                         bool err_cut, uint64_t pid)
{
    return json_pack (
        "{s:I, s:o, s:o, s:o, s:I, s:I, s:b, s:b, s:b}", "processId", (json_int_t) pid, "exitCode",
        running ? json_null () : json_integer (exit_code), "stdout",
        gw_broker_lossy_json (out->data, out->size), "stderr",
        gw_broker_lossy_json (err->data, err->size), "stdoutNextOffset", (json_int_t) out_next,
        "stderrNextOffset", (json_int_t) err_next, "stdoutTruncated", out_cut, "stderrTruncated",
        err_cut, "timedOut", timed_out);
}

static void s_job_end (s_job_t *job)
{
    zhashx_delete (job->rest->jobs, (void *) (uintptr_t) job->serial);
    s_job_free (&job);
}

static void s_on_answer (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_rest_t *self = job->rest;
    //  Revoked: refused here from the next request on, whether or not the client waits.
    if (reply && reply->type == SBX_MSG_KEY_REVOKE_OK)
        gw_auth_forget_key (self->auth, sbx_msg_key_revoke_ok (reply)->key_id);
    gw_request_t *req = gw_http_request (self->http, job->req_id);
    if (!req) {
        //  The client left: nothing more to do for it (a file stops mid-way).
        sbx_info ("rest rid=%llu answered after the client left; dropped",
                  (unsigned long long) job->req_id);
        s_job_end (job);
        return;
    }
    if (!reply) {
        s_send_error (req, code, message ? message : sbx_code_name (code));
        s_job_end (job);
        return;
    }
    int status = 200;
    json_t *body = NULL;
    switch (job->in.op) {
    case SBX_OP_GET_USAGE: {
        sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok (reply);
        json_t *sandboxes = json_array ();
        for (size_t i = 0; i < ok->sandboxes.count; i++) {
            sbx_usage_sandbox_t *u = &ok->sandboxes.items[i];
            json_array_append_new (
                sandboxes, json_pack ("{s:s, s:s, s:I, s:I, s:b}", "id", u->sandbox_id, "type",
                                      u->type ? sbx_sandbox_type_name (u->type) : "small",
                                      "runningSeconds", (json_int_t) u->seconds, "costMicroUsd",
                                      (json_int_t) u->micro_usd, "running", u->running));
        }
        json_t *days = json_array ();
        for (size_t i = 0; i < ok->days.count; i++)
            json_array_append_new (
                days, json_pack ("{s:s, s:I, s:I}", "day", ok->days.items[i].day, "runningSeconds",
                                 (json_int_t) ok->days.items[i].seconds, "costMicroUsd",
                                 (json_int_t) ok->days.items[i].micro_usd));
        json_t *wallets = json_array ();
        for (size_t i = 0; i < ok->wallets.count; i++)
            json_array_append_new (wallets,
                                   json_pack ("{s:s, s:I, s:b}", "name", ok->wallets.items[i].name,
                                              "balanceMicroUsd",
                                              (json_int_t) ok->wallets.items[i].balance_micro_usd,
                                              "active", ok->wallets.items[i].active));
        body = json_pack ("{s:s, s:I, s:I, s:I, s:o, s:o, s:o}", "accountId", ok->account_id,
                          "runningSeconds", (json_int_t) (ok->running_ms / 1000), "costMicroUsd",
                          (json_int_t) ok->micro_usd, "balanceMicroUsd",
                          (json_int_t) ok->balance_micro_usd, "wallets", wallets, "sandboxes",
                          sandboxes, "days", days);
        break;
    }
    case SBX_OP_LIST_SNAPSHOTS: {
        sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (all, gw_broker_snapshot_json (&list->items[i]));
        body = json_pack ("{s:o}", "snapshots", all);
        break;
    }
    case SBX_OP_SAVE_SNAPSHOT:
    case SBX_OP_GET_SNAPSHOT:
    case SBX_OP_DELETE_SNAPSHOT: {
        sbx_snapshot_info_t *info =
            reply->type == SBX_MSG_SNAPSHOT_SAVE_OK  ? sbx_msg_snapshot_save_ok (reply)->snapshot
            : reply->type == SBX_MSG_SNAPSHOT_GET_OK ? sbx_msg_snapshot_get_ok (reply)->snapshot
            : reply->type == SBX_MSG_SNAPSHOT_DELETE_OK
                ? sbx_msg_snapshot_delete_ok (reply)->snapshot
                : NULL;
        if (!info) {
            s_send_error (req, SBX_E_INTERNAL, "unexpected answer");
            s_job_end (job);
            return;
        }
        body = gw_broker_snapshot_json (info);
        if (job->in.op == SBX_OP_SAVE_SNAPSHOT) {
            char location[200];
            snprintf (location, sizeof location, "/v1/snapshots/%s", info->id);
            gw_request_add_header (req, "Location", location);
            status = 201;
        }
        break;
    }
    case SBX_OP_LIST_KEYS: {
        sbx_key_info_list_t *list = &sbx_msg_key_list_ok (reply)->keys;
        json_t *keys = json_array ();
        for (size_t i = 0; i < list->count; i++) {
            sbx_key_info_t *k = &list->items[i];
            json_t *key = json_pack (
                "{s:s, s:s, s:s?, s:s?, s:s?, s:b}", "id", k->key_id, "kind",
                sbx_key_kind_name (k->kind), "name", k->name, "preset",
                k->kind == SBX_KEY_KIND_CONNECTION ? NULL : sbx_key_preset_name (k->preset),
                "prefix", k->prefix, "revoked", k->revoked);
            //  Absent rather than null: a connection has no preset, a key may have no name.
            const char *optional[] = {"name", "preset", "prefix"};
            for (size_t o = 0; o < 3; o++)
                if (json_is_null (json_object_get (key, optional[o])))
                    json_object_del (key, optional[o]);
            const uint64_t times[] = {k->created_ms, k->last_used_ms, k->expires_ms};
            const char *names[] = {"createdAt", "lastUsedAt", "expiresAt"};
            for (size_t t = 0; t < 3; t++) {
                char iso[40];
                sbx_clock_iso8601 (times[t], iso, sizeof iso);
                json_object_set_new (key, names[t], times[t] ? json_string (iso) : json_null ());
            }
            json_array_append_new (keys, key);
        }
        body = json_pack ("{s:o}", "keys", keys);
        break;
    }
    case SBX_OP_REVOKE_KEY:
        body = json_pack ("{s:s, s:b}", "id", job->in.params[0], "revoked", true);
        break;
    case SBX_OP_HOST_PORT:
    case SBX_OP_UNPUBLISH_PORT: {
        sbx_sandbox_port_ok_t *ok = sbx_msg_sandbox_port_ok (reply);
        if (!ok) {
            s_send_error (req, SBX_E_INTERNAL, "unexpected answer to sandbox.port");
            s_job_end (job);
            return;
        }
        char host[96];
        snprintf (host, sizeof host, "%s-%llu",
                  ok->sandbox && ok->sandbox->label ? ok->sandbox->label : "-",
                  (unsigned long long) ok->port);
        char *url = gw_broker_sandbox_url (self->broker, host);
        body = json_pack ("{s:I, s:s, s:b}", "port", (json_int_t) ok->port, "url", url ? url : "",
                          "public", ok->public);
        if (ok->removed)
            json_object_set_new (body, "removed", json_true ());
        free (url);
        break;
    }
    case SBX_OP_LIST_SANDBOXES: {
        sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (all, gw_broker_sandbox_json (self->broker, &list->items[i]));
        body = json_pack ("{s:o}", "sandboxes", all);
        break;
    }
    case SBX_OP_CREATE_SANDBOX:
    case SBX_OP_GET_SANDBOX:
    case SBX_OP_UPDATE_SANDBOX:
    case SBX_OP_DELETE_SANDBOX:
    case SBX_OP_STOP_SANDBOX:
    case SBX_OP_RESUME_SANDBOX:
    case SBX_OP_EXTEND_SANDBOX: {
        sbx_sandbox_info_t *info = gw_broker_sandbox_info (reply);
        if (!info) {
            char text[200];
            snprintf (text, sizeof text, "unexpected answer %s", sbx_msg_type_name (reply->type));
            s_send_error (req, SBX_E_INTERNAL, text);
            s_job_end (job);
            return;
        }
        body = gw_broker_sandbox_json (self->broker, info);
        const char *note = reply->type == SBX_MSG_SANDBOX_CREATE_OK
                               ? sbx_msg_sandbox_create_ok (reply)->note
                               : NULL;
        if (note && *note) //  from a snapshot's disk only: say so
            json_object_set_new (body, "note", json_string (note));
        if (job->in.op == SBX_OP_CREATE_SANDBOX) {
            char location[200];
            snprintf (location, sizeof location, "/v1/sandboxes/%s", info->id);
            gw_request_add_header (req, "Location", location);
            status = 201;
        }
        break;
    }
    case SBX_OP_EXEC: {
        sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
        if (ok->running) {
            status = 202;
            body = json_pack ("{s:I}", "processId", (json_int_t) ok->pid);
        } else
            body = s_output (false, ok->exit_code, ok->timed_out, &ok->stdout, &ok->stderr,
                             ok->stdout_next_offset, ok->stderr_next_offset, ok->stdout_truncated,
                             ok->stderr_truncated, ok->pid);
        break;
    }
    case SBX_OP_COMMAND_STATUS: {
        sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
        body = s_output (ok->running, ok->exit_code, ok->timed_out, &ok->stdout, &ok->stderr,
                         ok->stdout_next_offset, ok->stderr_next_offset,
                         ok->stdout_truncated || ok->stdout_more,
                         ok->stderr_truncated || ok->stderr_more, job->pid);
        json_object_set_new (body, "running", json_boolean (ok->running));
        break;
    }
    case SBX_OP_KILL_COMMAND:
        body = json_pack ("{s:I, s:i}", "processId", (json_int_t) job->pid, "signal", job->signal);
        break;
    case SBX_OP_WRITE_FILE:
        if (job->done_bytes < job->size) {
            s_write_next (job);
            return;
        }
        body = json_pack ("{s:s, s:I}", "path", job->path, "size", (json_int_t) job->size);
        break;
    case SBX_OP_READ_FILE: {
        sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok (reply);
        if (ok->size > S_FILE_MAX || job->size + ok->data.size > S_FILE_MAX) {
            char text[300];
            snprintf (text, sizeof text,
                      "%.200s is %llu bytes; at most %d MiB can be downloaded at once", job->path,
                      (unsigned long long) ok->size, S_FILE_MAX / (1024 * 1024));
            s_send_error (req, SBX_E_TOO_LARGE, text);
            s_job_end (job);
            return;
        }
        if (ok->data.size) {
            uint8_t *grown = realloc (job->data, job->size + ok->data.size);
            if (!grown) {
                s_send_error (req, SBX_E_INTERNAL, "out of memory");
                s_job_end (job);
                return;
            }
            job->data = grown;
            memcpy (job->data + job->size, ok->data.data, ok->data.size);
            job->size += ok->data.size;
        }
        if (!ok->eof && ok->data.size > 0) {
            s_read_next (job);
            return;
        }
        gw_request_add_header (req, "Cache-Control", "no-store");
        gw_request_respond (req, 200, "application/octet-stream",
                            job->data ? (const void *) job->data : "", job->size);
        s_job_end (job);
        return;
    }
    case SBX_OP_GET_OPENAPI:
    case SBX_OP_RENAME_SANDBOX: //  MCP only: no route
    case SBX_OP_LABEL_SANDBOX:
        break;
    }
    s_send_json (req, status, body ? body : json_object ());
    s_job_end (job);
}

//  --------------------------------------------------------------------------
//  Serving

static void s_serve (s_job_t *job, gw_request_t *req)
{
    const sbx_caller_t *caller = job->caller;
    const sbx_op_info_t *op = &sbx_ops[job->in.op];
    //  Keys only: OAuth tokens are for /mcp, and a leaked one must not reach the API.
    if (caller->kind != SBX_CALLER_KIND_API_KEY) {
        s_send_error (req, SBX_E_UNAUTHENTICATED, "the REST API takes API keys only");
        s_job_end (job);
        return;
    }
    //  Keys are the account's own business: only a full key may revoke one (the broker
    //  holds to that too).
    if (job->in.op == SBX_OP_REVOKE_KEY && caller->preset != SBX_KEY_PRESET_FULL) {
        s_send_error (req, SBX_E_PERMISSION_DENIED,
                      "only a full key can revoke keys; this key's preset is narrower");
        s_job_end (job);
        return;
    }
    //  The broker decides too; refusing here spares it the request and says why plainly.
    if (caller->preset == SBX_KEY_PRESET_READ_ONLY && !op->read_only) {
        char text[300];
        snprintf (text, sizeof text, "this key is read-only: it cannot use %s %s", op->method,
                  op->path);
        s_send_error (req, SBX_E_PERMISSION_DENIED, text);
        s_job_end (job);
        return;
    }
    s_error_t error = {{0}};
    sbx_code_t code = s_build (job, &error);
    if (code != SBX_OK) {
        s_send_error (req, code, error.text);
        s_job_end (job);
        return;
    }
    if (!op->read_only)
        sbx_info ("rest rid=%llu %s %s %s%s%s", (unsigned long long) job->req_id,
                  caller->account_id ? caller->account_id : "?", op->method, op->path,
                  job->sandbox_id ? " " : "", job->sandbox_id ? job->sandbox_id : "");
    if (job->in.op == SBX_OP_READ_FILE)
        s_read_next (job);
    else if (job->in.op == SBX_OP_WRITE_FILE)
        s_write_next (job);
    else {
        sbx_msg_t *request = job->request;
        job->request = NULL;
        s_send (job, &request);
    }
}

static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    s_job_t *job = arg;
    gw_request_t *req = gw_http_request (job->rest->http, job->req_id);
    if (!req) {
        s_job_end (job); //  the client left meanwhile
        return;
    }
    gw_auth_limit_t limit;
    if (caller && gw_auth_take (job->rest->auth, caller, &limit)) {
        //  Over the key's rate: 429 with the IETF RateLimit fields and Retry-After.
        char text[200];
        snprintf (text, sizeof text, "this key may make %llu requests per second; retry in %llu s",
                  (unsigned long long) limit.limit, (unsigned long long) limit.reset_s);
        gw_auth_rate_headers (req, &limit);
        s_send_error (req, SBX_E_RATE_LIMITED, text);
        s_job_end (job);
        return;
    }
    if (caller && caller->kind == SBX_CALLER_KIND_OAUTH) {
        //  OAuth tokens are the connectors' (bound to the /mcp resource); code uses keys.
        s_send_error (req, SBX_E_UNAUTHENTICATED,
                      "OAuth access tokens work on /mcp only; create an API key with `sbx key "
                      "create` (or on your account page) for the REST API");
        s_job_end (job);
        return;
    }
    if (caller) {
        job->caller = gw_auth_caller_dup (caller);
        s_serve (job, req);
        return;
    }
    if (code == SBX_E_UNAUTHENTICATED)
        s_send_error (req, code, "the API key is unknown, expired or revoked");
    else if (code == SBX_E_INVALID_ARGUMENT)
        s_send_error (req, code, message ? message : "malformed credentials");
    else {
        //  The broker could not say: not the client's fault, and not a 401.
        char text[600];
        snprintf (text, sizeof text, "cannot check credentials now: %s",
                  message ? message : sbx_code_name (code));
        s_send_error (req, code, text);
    }
    s_job_end (job);
}

void gw_rest_handle (gw_rest_t *self, gw_request_t *req)
{
    s_input_t in = {0};
    const s_route_t *route;
    char allow[100];
    int rc = s_route (gw_request_method (req), gw_request_path (req), &route, in.params, allow,
                      sizeof allow);
    if (rc == 405) {
        gw_request_add_header (req, "Allow", allow);
        char text[400];
        snprintf (text, sizeof text, "%.20s is not allowed on %.200s (use %s)",
                  gw_request_method (req), gw_request_path (req), allow);
        s_send_json (
            req, 405,
            json_pack ("{s:{s:s, s:s}}", "error", "code", "method_not_allowed", "message", text));
        return;
    }
    if (rc == 404) {
        char text[300];
        snprintf (text, sizeof text, "no such API route: %.200s (see /v1/openapi.json)",
                  gw_request_path (req));
        s_send_error (req, SBX_E_NOT_FOUND, text);
        return;
    }
    if (route->op == SBX_OP_GET_OPENAPI) {
        gw_request_add_header (req, "Cache-Control", "no-cache");
        gw_request_respond (req, 200, "application/json", gw_rest_openapi, gw_rest_openapi_size);
        return;
    }
    const char *token = gw_auth_bearer (gw_request_header (req, "Authorization"));
    if (!token) {
        s_send_error (req, SBX_E_UNAUTHENTICATED,
                      "an API key is required: Authorization: Bearer sbx_…");
        return;
    }
    s_job_t *job = calloc (1, sizeof *job);
    if (!job) {
        s_send_error (req, SBX_E_INTERNAL, "out of memory");
        return;
    }
    in.op = route->op;
    in.body = (const char *) gw_request_body (req);
    in.body_size = gw_request_body_size (req);
    in.q_path = gw_request_query (req, "path");
    in.q_sandbox = gw_request_query (req, "sandboxId");
    in.q_mode = gw_request_query (req, "mode");
    in.q_stdout = gw_request_query (req, "stdoutOffset");
    in.q_stderr = gw_request_query (req, "stderrOffset");
    job->rest = self;
    job->serial = self->next_serial++;
    job->req_id = gw_request_id (req);
    job->in = in; //  body and queries are borrowed: s_build copies what outlives the request
    zhashx_insert (self->jobs, (void *) (uintptr_t) job->serial, job);
    //  May answer at once (cached key); otherwise the request waits, suspended.
    gw_auth_check (self->auth, token, s_on_auth, job);
}

//  --------------------------------------------------------------------------
//  Self test: routing, bodies and the OpenAPI document; no broker, no socket.

static sbx_code_t s_try (sbx_op_t op, const char *id, const char *pid, const char *body,
                         s_error_t *error, s_job_t *out)
{
    s_job_t job = {0};
    job.in.op = op;
    snprintf (job.in.params[0], S_PARAM_MAX, "%s", id ? id : "");
    snprintf (job.in.params[1], S_PARAM_MAX, "%s", pid ? pid : "");
    job.in.body = body;
    job.in.body_size = body ? strlen (body) : 0;
    if (out) {
        job.in.q_path = out->in.q_path;
        job.in.q_mode = out->in.q_mode;
        job.in.q_stdout = out->in.q_stdout;
        job.in.q_stderr = out->in.q_stderr;
    }
    *error = (s_error_t){{0}};
    sbx_code_t code = s_build (&job, error);
    //  The request is the message schemas/operations.json names.
    assert (code != SBX_OK || !job.request || job.request->type == sbx_ops[op].message);
    if (out)
        *out = job;
    else {
        s_job_t *p = &job;
        sbx_msg_destroy (&p->request);
        free (p->sandbox_id);
        free (p->path);
        free (p->data);
    }
    return code;
}

static void s_job_clear (s_job_t *job)
{
    sbx_msg_destroy (&job->request);
    free (job->sandbox_id);
    free (job->path);
    free (job->data);
    *job = (s_job_t){0};
}

void gw_rest_test (bool verbose)
{
    (void) verbose;
    //  Path matching.
    char params[2][S_PARAM_MAX];
    assert (s_match ("/v1/sandboxes", "/v1/sandboxes", params));
    assert (!s_match ("/v1/sandboxes", "/v1/sandboxes/", params));
    assert (!s_match ("/v1/sandboxes", "/v1/sandbox", params));
    assert (!s_match ("/v1/sandboxes/{id}", "/v1/sandboxes", params));
    assert (!s_match ("/v1/sandboxes/{id}", "/v1/sandboxes//", params));
    assert (
        s_match ("/v1/sandboxes/{id}/processes/{pid}", "/v1/sandboxes/sb_1/processes/42", params));
    assert (streq (params[0], "sb_1") && streq (params[1], "42"));
    assert (!s_match ("/v1/sandboxes/{id}/processes/{pid}", "/v1/sandboxes/sb_1/processes/42/x",
                      params));

    //  Routing and methods.
    const s_route_t *route;
    char allow[100];
    assert (s_route ("GET", "/v1/sandboxes", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_LIST_SANDBOXES);
    assert (s_route ("POST", "/v1/sandboxes", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_CREATE_SANDBOX);
    assert (s_route ("DELETE", "/v1/sandboxes", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "GET, POST"));
    assert (s_route ("POST", "/v1/sandboxes/sb_x", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "GET, PATCH, DELETE"));
    assert (s_route ("PATCH", "/v1/sandboxes/sb_x", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_UPDATE_SANDBOX && streq (params[0], "sb_x"));
    assert (s_route ("GET", "/v1/sandboxes/sb_x/exec", &route, params, allow, sizeof allow) == 405);
    assert (streq (allow, "POST"));
    assert (s_route ("PUT", "/v1/sandboxes/sb_x/files", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_WRITE_FILE);
    assert (s_route ("GET", "/v1/nothing", &route, params, allow, sizeof allow) == 404);
    assert (s_route ("GET", "/v1", &route, params, allow, sizeof allow) == 404);
    assert (s_route ("GET", "/v1/openapi.json", &route, params, allow, sizeof allow) == 0);
    assert (route->op == SBX_OP_GET_OPENAPI);

    //  Bodies.
    s_error_t error;
    s_job_t job = {0};
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, NULL, &error, &job) == SBX_OK);
    assert (job.request->type == SBX_MSG_SANDBOX_CREATE);
    assert (sbx_msg_sandbox_create (job.request)->ttl_s == S_TTL_DEFAULT);
    assert (!sbx_msg_sandbox_create (job.request)->no_network);
    s_job_clear (&job);
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL,
                   "{\"name\":\"demo\",\"type\":\"medium\",\"ttlSeconds\":600,"
                   "\"labels\":{\"team\":\"a\"},\"network\":false}",
                   &error, &job) == SBX_OK);
    sbx_sandbox_create_t *create = sbx_msg_sandbox_create (job.request);
    assert (streq (create->name, "demo") && create->ttl_s == 600 && create->no_network);
    assert (create->type == SBX_SANDBOX_TYPE_MEDIUM && create->labels.count == 1);
    s_job_clear (&job);
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"name\":", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (strstr (error.text, "the body is not valid JSON"));
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "[1]", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "the body must be a JSON object"));
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"ttl\":60}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (strstr (error.text, "unknown field \"ttl\""));
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"ttlSeconds\":\"60\"}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "ttlSeconds must be an integer"));
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"ttlSeconds\":5}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (strstr (error.text, "ttlSeconds must be between 60 and"));
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"type\":\"huge\"}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"labels\":{\"a\":1}}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_CREATE_SANDBOX, NULL, NULL, "{\"snapshotId\":\"snap_1\"}", &error, &job) ==
            SBX_OK);
    assert (streq (sbx_msg_sandbox_create (job.request)->snapshot_id, "snap_1"));
    s_job_clear (&job);
    assert (s_try (SBX_OP_SAVE_SNAPSHOT, "sb_x", NULL, "{\"name\":\"n\",\"labels\":{\"a\":\"1\"}}",
                   &error, &job) == SBX_OK);
    assert (streq (sbx_msg_snapshot_save (job.request)->sandbox_id, "sb_x"));
    assert (streq (sbx_msg_snapshot_save (job.request)->name, "n"));
    s_job_clear (&job);
    assert (s_try (SBX_OP_SAVE_SNAPSHOT, "sb_x", NULL, "{\"nope\":1}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_EXTEND_SANDBOX, "sb_x", NULL, NULL, &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "a JSON object body is required"));
    assert (s_try (SBX_OP_EXTEND_SANDBOX, "sb_x", NULL, "{}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "ttlSeconds is required"));
    assert (s_try (SBX_OP_EXTEND_SANDBOX, "sb_x", NULL, "{\"ttlSeconds\":120}", &error, &job) ==
            SBX_OK);
    assert (sbx_msg_sandbox_extend (job.request)->ttl_s == 120);
    assert (streq (sbx_msg_sandbox_extend (job.request)->sandbox_id, "sb_x"));
    s_job_clear (&job);
    //  Ports as MCP's host_port: 1 to 65535, private unless asked, no other field.
    assert (s_try (SBX_OP_HOST_PORT, "sb_x", NULL, "{\"port\":8000,\"public\":true}", &error,
                   &job) == SBX_OK);
    assert (sbx_msg_sandbox_port (job.request)->port == 8000);
    assert (sbx_msg_sandbox_port (job.request)->public &&
            !sbx_msg_sandbox_port (job.request)->remove);
    s_job_clear (&job);
    assert (s_try (SBX_OP_HOST_PORT, "sb_x", NULL, "{\"port\":0}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_HOST_PORT, "sb_x", NULL, "{\"port\":80,\"open\":1}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_HOST_PORT, "sb_x", NULL, "{}", &error, NULL) == SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "port is required"));
    assert (s_try (SBX_OP_UNPUBLISH_PORT, "sb_x", "8000", NULL, &error, &job) == SBX_OK);
    assert (sbx_msg_sandbox_port (job.request)->remove &&
            sbx_msg_sandbox_port (job.request)->port == 8000);
    s_job_clear (&job);
    assert (s_try (SBX_OP_UNPUBLISH_PORT, "sb_x", "65536", NULL, &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "the port in the path must be 1 to 65535"));
    assert (s_try (SBX_OP_UPDATE_SANDBOX, "sb_x", NULL, "{}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "give name, labels or both"));
    assert (s_try (SBX_OP_UPDATE_SANDBOX, "sb_x", NULL, "{\"labels\":{\"a\":\"1\",\"b\":null}}",
                   &error, &job) == SBX_OK);
    sbx_sandbox_update_t *update = sbx_msg_sandbox_update (job.request);
    assert (update->labels.count == 1 && update->remove_labels.count == 1 && !update->name);
    s_job_clear (&job);
    assert (s_try (SBX_OP_EXEC, "sb_x", NULL, "{\"command\":3}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "command must be a string"));
    assert (s_try (SBX_OP_EXEC, "sb_x", NULL, "{\"command\":\"true\",\"timeout\":601}", &error,
                   NULL) == SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_EXEC, "sb_x", NULL,
                   "{\"command\":\"ls\",\"detached\":true,\"env\":{\"A\":\"b\"}}", &error,
                   &job) == SBX_OK);
    assert (job.agent && sbx_msg_agent_exec (job.request)->detached);
    assert (job.timeout_ms == S_SIMPLE_MS);
    s_job_clear (&job);
    assert (s_try (SBX_OP_EXEC, "sb_x", NULL, "{\"command\":\"ls\",\"timeout\":10}", &error, &job) ==
            SBX_OK);
    assert (job.timeout_ms == 10000 + S_MARGIN_MS);
    s_job_clear (&job);
    assert (s_try (SBX_OP_COMMAND_STATUS, "sb_x", "0", NULL, &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_COMMAND_STATUS, "sb_x", "x1", NULL, &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    job.in.q_stdout = "12";
    assert (s_try (SBX_OP_COMMAND_STATUS, "sb_x", "7", NULL, &error, &job) == SBX_OK);
    assert (job.pid == 7 && sbx_msg_agent_status (job.request)->stdout_offset == 12);
    s_job_clear (&job);
    job.in.q_stderr = "-1";
    assert (s_try (SBX_OP_COMMAND_STATUS, "sb_x", "7", NULL, &error, &job) ==
            SBX_E_INVALID_ARGUMENT);
    assert (streq (error.text, "stderrOffset must be a non-negative integer"));
    s_job_clear (&job);
    assert (s_try (SBX_OP_KILL_COMMAND, "sb_x", "7", "{\"signal\":\"KILL\"}", &error, &job) ==
            SBX_OK);
    assert (job.signal == 9);
    s_job_clear (&job);
    assert (s_try (SBX_OP_KILL_COMMAND, "sb_x", "7", "{\"signal\":\"NOPE\"}", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (s_try (SBX_OP_WRITE_FILE, "sb_x", NULL, "bytes", &error, NULL) ==
            SBX_E_INVALID_ARGUMENT);
    assert (strstr (error.text, "path is required"));
    job.in.q_path = "/root/a";
    job.in.q_mode = "0755";
    assert (s_try (SBX_OP_WRITE_FILE, "sb_x", NULL, "bytes", &error, &job) == SBX_OK);
    assert (job.size == 5 && job.mode == 0755 && streq (job.path, "/root/a"));
    s_job_clear (&job);
    job.in.q_path = "/root/a";
    job.in.q_mode = "999";
    assert (s_try (SBX_OP_WRITE_FILE, "sb_x", NULL, "", &error, &job) == SBX_E_INVALID_ARGUMENT);
    s_job_clear (&job);
    job.in.q_path = "relative";
    assert (s_try (SBX_OP_READ_FILE, "sb_x", NULL, NULL, &error, &job) == SBX_E_INVALID_ARGUMENT);
    s_job_clear (&job);

    //  The OpenAPI document parses and describes exactly the routes served.
    json_error_t jerr;
    json_t *doc = json_loadb (gw_rest_openapi, gw_rest_openapi_size, 0, &jerr);
    if (!doc)
        fprintf (stderr, "docs/openapi.json: %s at line %d\n", jerr.text, jerr.line);
    assert (doc);
    assert (strncmp (json_string_value (json_object_get (doc, "openapi")), "3.1", 3) == 0);
    json_t *paths = json_object_get (doc, "paths");
    assert (json_is_object (paths));
    for (const s_route_t *r = sbx_ops_routes; r->method; r++) {
        char method[10];
        for (size_t i = 0; i <= strlen (r->method); i++)
            method[i] = (char) tolower ((unsigned char) r->method[i]);
        json_t *operation = json_object_get (json_object_get (paths, r->path), method);
        if (!operation)
            fprintf (stderr, "docs/openapi.json lacks %s %s\n", r->method, r->path);
        assert (json_is_object (operation));
        assert (json_is_object (json_object_get (operation, "responses")));
    }
    const char *path;
    json_t *item;
    json_object_foreach (paths, path, item)
    {
        const char *method;
        json_t *operation;
        json_object_foreach (item, method, operation)
        {
            if (streq (method, "parameters") || streq (method, "summary") ||
                streq (method, "description"))
                continue;
            bool served = false;
            for (const s_route_t *r = sbx_ops_routes; r->method && !served; r++)
                served = streq (r->path, path) && strcasecmp (r->method, method) == 0;
            if (!served)
                fprintf (stderr, "docs/openapi.json lists %s %s, not served\n", method, path);
            assert (served);
        }
    }
    json_decref (doc);

    //  A request needs no broker to be refused.
    gw_ctx_t *ctx = gw_ctx_new (NULL, NULL, NULL, NULL);
    gw_rest_t *rest = ctx ? gw_rest_new (ctx) : NULL;
    assert (rest);
    gw_rest_destroy (&rest);
    gw_ctx_destroy (&ctx);
    assert (!rest);
}
