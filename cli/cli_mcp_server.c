/*  cli_mcp_server - the MCP server on stdio (see cli_mcp_server.h). */
#include "cli_mcp_server.h"
#include "cli_handoff.h"
#include "sbx_common.h"

struct cli_mcp_server_t {
    cli_remote_t *remote;
    char *dir;
    FILE *out;
    bool broken; //  out failed: the client is gone
};

//  As the gateway (gw_mcp.c): these are echoed, anything else gets the first.
static const char *s_versions[] = {"2025-06-18", "2025-03-26", "2025-11-25", NULL};

cli_mcp_server_t *cli_mcp_server_new (cli_remote_t *remote, const char *dir, FILE *out)
{
    cli_mcp_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->remote = remote;
    self->dir = strdup (dir);
    self->out = out;
    return self;
}

void cli_mcp_server_destroy (cli_mcp_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free ((*self_p)->dir);
    free (*self_p);
    *self_p = NULL;
}

//  Writes message (taken) as one line. jansson escapes newlines inside strings, so the
//  compact form never spans lines.
static int s_send (cli_mcp_server_t *self, json_t *message)
{
    char *text = json_dumps (message, JSON_COMPACT);
    json_decref (message);
    if (!text || fprintf (self->out, "%s\n", text) < 0 || fflush (self->out) != 0)
        self->broken = true;
    free (text);
    return self->broken ? -1 : 0;
}

static int s_result (cli_mcp_server_t *self, json_t *id, json_t *result)
{
    return s_send (self,
                   json_pack ("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static int s_error (cli_mcp_server_t *self, json_t *id, int code, const char *message)
{
    return s_send (self,
                   json_pack ("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                              id ? id : json_null (), "error", "code", code, "message", message));
}

static int s_remote_error (cli_mcp_server_t *self, json_t *id, json_t *error)
{
    return s_send (self, json_pack ("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "error", error));
}

static void s_notify (void *arg, json_t *notification)
{
    s_send ((cli_mcp_server_t *) arg, json_incref (notification));
}

static int s_initialize (cli_mcp_server_t *self, json_t *id, json_t *params)
{
    const char *asked = json_string_value (json_object_get (params, "protocolVersion"));
    const char *version = s_versions[0];
    for (int i = 0; asked && s_versions[i]; i++)
        if (streq (asked, s_versions[i]))
            version = s_versions[i];
    if (self->remote)
        cli_remote_set_protocol (self->remote, version);
    json_t *result = json_pack (
        "{s:s, s:{s:{}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", version, "capabilities",
        "tools", "serverInfo", "name", "sbx-mcp", "title", "sbx sandboxes", "version", SBX_VERSION,
        "instructions",
        "Linux sandboxes on a remote sbx service: create_sandbox, then exec, read_file and "
        "write_file in it. handoff_session copies this machine's working directory into a "
        "sandbox.");
    return s_result (self, id, result);
}

static int s_tools_list (cli_mcp_server_t *self, json_t *id, json_t *params)
{
    json_t *error;
    json_t *result = cli_remote_request (self->remote, "tools/list", params, NULL, NULL, &error);
    if (!result)
        return s_remote_error (self, id, error);
    //  The local tool goes at the end of the last page.
    json_t *tools = json_object_get (result, "tools");
    if (json_is_array (tools) && !json_object_get (result, "nextCursor"))
        json_array_append_new (tools, cli_handoff_tool ());
    return s_result (self, id, result);
}

static int s_tools_call (cli_mcp_server_t *self, json_t *id, json_t *params)
{
    if (!json_is_object (params) || !json_is_string (json_object_get (params, "name")))
        return s_error (self, id, -32602, "tools/call needs params {name, arguments}");
    const char *name = json_string_value (json_object_get (params, "name"));
    if (streq (name, CLI_HANDOFF_NAME)) {
        json_t *args = json_object_get (params, "arguments");
        json_t *empty = args ? NULL : json_object ();
        json_t *result =
            cli_handoff_run (self->remote, self->dir, args ? args : empty, CLI_HANDOFF_MAX);
        json_decref (empty);
        return s_result (self, id, result);
    }
    json_t *error;
    json_t *result =
        cli_remote_request (self->remote, "tools/call", params, s_notify, self, &error);
    if (!result)
        return s_remote_error (self, id, error);
    return s_result (self, id, result);
}

int cli_mcp_server_handle (cli_mcp_server_t *self, const char *line)
{
    json_error_t parse;
    json_t *message = json_loads (line, JSON_REJECT_DUPLICATES, &parse);
    if (!message) {
        char text[300];
        snprintf (text, sizeof text, "Parse error: %s (one JSON-RPC message per line)", parse.text);
        return s_error (self, NULL, -32700, text);
    }
    int rc = 0;
    json_t *id = json_object_get (message, "id");
    const char *method = json_string_value (json_object_get (message, "method"));
    if (json_is_array (message))
        rc = s_error (self, NULL, -32600, "Invalid Request: batches are not supported");
    else if (!json_is_object (message) ||
             !streq (json_string_value (json_object_get (message, "jsonrpc")) ?: "", "2.0"))
        rc = s_error (self, NULL, -32600, "Invalid Request: not a JSON-RPC 2.0 message");
    else if (id && !json_is_string (id) && !json_is_integer (id))
        rc = s_error (self, NULL, -32600, "Invalid Request: id must be a string or an integer");
    else if (!method) {
        //  A client's answer to a request of ours: we send none, so nothing to do.
        if (!id || !(json_object_get (message, "result") || json_object_get (message, "error")))
            rc = s_error (self, id, -32600, "Invalid Request: no method");
    } else if (!id)
        sbx_debug ("notification %s", method); //  initialized, cancelled: nothing to answer
    else {
        json_t *params = json_object_get (message, "params");
        if (params && !json_is_object (params))
            rc = s_error (self, id, -32602, "params must be an object");
        else if (streq (method, "initialize"))
            rc = s_initialize (self, id, params);
        else if (streq (method, "ping"))
            rc = s_result (self, id, json_object ());
        else if (streq (method, "tools/list"))
            rc = s_tools_list (self, id, params);
        else if (streq (method, "tools/call"))
            rc = s_tools_call (self, id, params);
        else {
            char text[300];
            snprintf (text, sizeof text, "Method not found: %.200s", method);
            rc = s_error (self, id, -32601, text);
        }
    }
    json_decref (message);
    return rc;
}

int cli_mcp_server_too_long (cli_mcp_server_t *self, size_t max)
{
    char text[200];
    snprintf (text, sizeof text, "Parse error: a message longer than %zu bytes was dropped", max);
    return s_error (self, NULL, -32700, text);
}

//  Handles line and returns the one answer written (new reference), or NULL for none.
static json_t *s_answer (cli_mcp_server_t *self, FILE *out, const char *line)
{
    long before = ftell (out);
    assert (cli_mcp_server_handle (self, line) == 0);
    long after = ftell (out);
    if (after == before)
        return NULL;
    char *text = calloc (1, after - before + 1);
    fseek (out, before, SEEK_SET);
    assert (fread (text, 1, after - before, out) == (size_t) (after - before));
    fseek (out, after, SEEK_SET);
    assert (text[after - before - 1] == '\n' && !strchr (text, '\n')[1]);
    json_t *answer = json_loads (text, 0, NULL);
    free (text);
    assert (answer);
    return answer;
}

static int s_code (json_t *answer)
{
    return (int) json_integer_value (json_object_get (json_object_get (answer, "error"), "code"));
}

void cli_mcp_server_test (bool verbose)
{
    (void) verbose;
    FILE *out = tmpfile ();
    //  Nothing listens on port 1: what needs the service says it can't be reached.
    cli_remote_t *remote = cli_remote_new ("http://127.0.0.1:1/mcp", "sbx_test", NULL);
    cli_mcp_server_t *server = cli_mcp_server_new (remote, "/tmp", out);

    json_t *a = s_answer (server, out,
                          "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{"
                          "\"protocolVersion\":\"2025-03-26\",\"capabilities\":{}}}");
    json_t *result = json_object_get (a, "result");
    assert (streq (json_string_value (json_object_get (result, "protocolVersion")), "2025-03-26"));
    assert (json_object_get (json_object_get (result, "capabilities"), "tools"));
    assert (json_integer_value (json_object_get (a, "id")) == 1);
    json_decref (a);
    a = s_answer (server, out,
                  "{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"initialize\",\"params\":{"
                  "\"protocolVersion\":\"1999-01-01\"}}");
    assert (streq (
        json_string_value (json_object_get (json_object_get (a, "result"), "protocolVersion")),
        "2025-06-18"));
    assert (streq (json_string_value (json_object_get (a, "id")), "x"));
    json_decref (a);

    assert (s_answer (server, out,
                      "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}") == NULL);
    assert (s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}") == NULL);
    a = s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}");
    assert (json_is_object (json_object_get (a, "result")));
    json_decref (a);
    a = s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"resources/list\"}");
    assert (s_code (a) == -32601);
    json_decref (a);
    a = s_answer (server, out, "{not json");
    assert (s_code (a) == -32700 && json_is_null (json_object_get (a, "id")));
    json_decref (a);
    a = s_answer (server, out, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]");
    assert (s_code (a) == -32600);
    json_decref (a);
    a = s_answer (server, out, "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}");
    assert (s_code (a) == -32600);
    json_decref (a);
    a = s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}");
    assert (s_code (a) == -32600);
    json_decref (a);
    a = s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\"}");
    assert (s_code (a) == -32602);
    json_decref (a);

    //  A real connection refused: the error names the URL and SBX_URL.
    a = s_answer (server, out, "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/list\"}");
    const char *message =
        json_string_value (json_object_get (json_object_get (a, "error"), "message"));
    assert (message && strstr (message, "cannot reach http://127.0.0.1:1/mcp") &&
            strstr (message, "check SBX_URL"));
    assert (json_integer_value (json_object_get (a, "id")) == 6);
    json_decref (a);
    //  handoff_session's argument checks need no service.
    a = s_answer (server, out,
                  "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":"
                  "\"handoff_session\",\"arguments\":{\"path\":\"rel\"}}}");
    result = json_object_get (a, "result");
    assert (json_is_true (json_object_get (result, "isError")));
    json_decref (a);
    a = s_answer (server, out, "");
    assert (s_code (a) == -32700);
    json_decref (a);
    assert (cli_mcp_server_too_long (server, 10) == 0);

    cli_mcp_server_destroy (&server);
    cli_remote_destroy (&remote);
    fclose (out);
}
