/*  gw_mcp_era - see gw_mcp_era.h */
#include "gw_mcp_era.h"
#include "sbx_secret.h"

#include <assert.h>
#include <stdarg.h>
#include <strings.h>

static json_t *s_meta (json_t *msg)
{
    json_t *params = json_is_object (msg) ? json_object_get (msg, "params") : NULL;
    json_t *meta = json_is_object (params) ? json_object_get (params, "_meta") : NULL;
    return json_is_object (meta) ? meta : NULL;
}

//  A version at or after the stateless era's: dates compare as text.
static bool s_modern_version (const char *version)
{
    return version && strlen (version) == 10 && version[4] == '-' && version[7] == '-' &&
           strcmp (version, GW_MCP_MODERN) >= 0;
}

bool gw_mcp_era_modern (json_t *msg, gw_mcp_era_header_fn *header, void *source)
{
    if (json_object_get (s_meta (msg), GW_MCP_META_VERSION))
        return true;
    char *version = gw_mcp_era_header_value (header (source, "MCP-Protocol-Version"));
    bool modern = s_modern_version (version);
    free (version);
    return modern;
}

char *gw_mcp_era_header_value (const char *raw)
{
    if (!raw)
        return NULL;
    while (*raw == ' ' || *raw == '\t')
        raw++;
    size_t n = strlen (raw);
    while (n && (raw[n - 1] == ' ' || raw[n - 1] == '\t'))
        n--;
    static const char open[] = "=?base64?", close[] = "?=";
    if (n >= sizeof open - 1 + sizeof close - 1 && strncmp (raw, open, sizeof open - 1) == 0 &&
        strncmp (raw + n - 2, close, 2) == 0) {
        char *inner = strndup (raw + sizeof open - 1, n - (sizeof open - 1) - 2);
        size_t size = 0;
        uint8_t *bytes = inner ? sbx_secret_base64_decode (inner, &size) : NULL;
        free (inner);
        if (!bytes)
            return NULL;
        char *text = strndup ((char *) bytes, size);
        bool clean = text && strlen (text) == size;
        free (bytes);
        if (!clean) {
            free (text);
            return NULL;
        }
        return text;
    }
    return strndup (raw, n);
}

static int s_refuse (gw_mcp_era_refusal_t *why, int status, int code, json_t *data,
                     const char *format, ...) __attribute__ ((format (printf, 5, 6)));
static int s_refuse (gw_mcp_era_refusal_t *why, int status, int code, json_t *data,
                     const char *format, ...)
{
    why->status = status;
    why->code = code;
    why->data = data;
    va_list args;
    va_start (args, format);
    vsnprintf (why->message, sizeof why->message, format, args);
    va_end (args);
    sbx_utf8_sanitize (why->message);
    return -1;
}

int gw_mcp_era_check (json_t *msg, gw_mcp_era_header_fn *header, void *source,
                      gw_mcp_era_refusal_t *why)
{
    assert (why);
    *why = (gw_mcp_era_refusal_t){0};
    json_t *meta = s_meta (msg);
    const char *claimed = json_string_value (json_object_get (meta, GW_MCP_META_VERSION));
    if (!meta || !claimed || !json_is_object (json_object_get (meta, GW_MCP_META_CAPABILITIES)))
        return s_refuse (why, 400, -32602, NULL,
                         "Invalid params: a %s request carries params._meta with %s (a "
                         "string) and %s (an object)",
                         GW_MCP_MODERN, GW_MCP_META_VERSION, GW_MCP_META_CAPABILITIES);
    char *version = gw_mcp_era_header_value (header (source, "MCP-Protocol-Version"));
    int rc = 0;
    if (!version || !streq (version, claimed))
        rc = s_refuse (why, 400, -32020, NULL,
                       "Header mismatch: MCP-Protocol-Version %.40s%s does not match the "
                       "body's %.40s",
                       version ? version : "(missing)", "", claimed);
    free (version);
    if (rc)
        return rc;
    if (!streq (claimed, GW_MCP_MODERN))
        return s_refuse (
            why, 400, -32022,
            json_pack ("{s:[s], s:s}", "supported", GW_MCP_MODERN, "requested", claimed),
            "Unsupported protocol version %.40s (this server speaks %s; 2025 "
            "clients initialize)",
            claimed, GW_MCP_MODERN);
    const char *method = json_string_value (json_object_get (msg, "method"));
    char *said = gw_mcp_era_header_value (header (source, "Mcp-Method"));
    if (!said || !method || !streq (said, method))
        rc = s_refuse (why, 400, -32020, NULL,
                       "Header mismatch: Mcp-Method %.60s does not match the body's method "
                       "%.60s",
                       said ? said : "(missing)", method ? method : "(none)");
    free (said);
    if (rc || !method || !streq (method, "tools/call"))
        return rc;
    const char *name =
        json_string_value (json_object_get (json_object_get (msg, "params"), "name"));
    char *named = gw_mcp_era_header_value (header (source, "Mcp-Name"));
    if (!named || !name || !streq (named, name))
        rc = s_refuse (why, 400, -32020, NULL,
                       "Header mismatch: Mcp-Name %.60s does not match the body's params.name "
                       "%.60s",
                       named ? named : "(missing)", name ? name : "(none)");
    free (named);
    return rc;
}

//  --------------------------------------------------------------------------
//  Self test

typedef struct {
    const char *names[4], *values[4];
} s_headers_t;

static const char *s_header (void *source, const char *name)
{
    s_headers_t *h = source;
    for (int i = 0; i < 4 && h->names[i]; i++)
        if (strcasecmp (h->names[i], name) == 0)
            return h->values[i];
    return NULL;
}

static int s_check (const char *body, s_headers_t *h, gw_mcp_era_refusal_t *why)
{
    json_t *msg = json_loads (body, 0, NULL);
    assert (msg);
    int rc = gw_mcp_era_check (msg, s_header, h, why);
    json_decref (msg);
    return rc;
}

#define S_META                                                                                     \
    "\"_meta\":{\"" GW_MCP_META_VERSION "\":\"2026-07-28\",\"" GW_MCP_META_CAPABILITIES "\":{}}"

void gw_mcp_era_test (bool verbose)
{
    (void) verbose;
    //  Which era.
    s_headers_t none = {{NULL}, {NULL}};
    s_headers_t modern = {{"MCP-Protocol-Version", "Mcp-Method"}, {"2026-07-28", "tools/list"}};
    s_headers_t legacy = {{"MCP-Protocol-Version"}, {"2025-06-18"}};
    json_t *msg = json_loads ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","
                              "\"params\":{\"protocolVersion\":\"2025-06-18\"}}",
                              0, NULL);
    assert (!gw_mcp_era_modern (msg, s_header, &none));
    assert (!gw_mcp_era_modern (msg, s_header, &legacy));
    assert (gw_mcp_era_modern (msg, s_header, &modern)); //  then refused: no envelope
    json_decref (msg);
    msg = json_loads ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{" S_META
                      "}}",
                      0, NULL);
    assert (gw_mcp_era_modern (msg, s_header, &none));
    json_decref (msg);

    //  The checks, in the conformance suite's order.
    gw_mcp_era_refusal_t why;
    assert (s_check ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{" S_META
                     "}}",
                     &modern, &why) == 0);
    assert (s_check ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{}}",
                     &modern, &why) == -1);
    assert (why.status == 400 && why.code == -32602);
    s_headers_t mismatch = {{"MCP-Protocol-Version", "Mcp-Method"}, {"2026-07-28", "tools/list"}};
    assert (
        s_check ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"_meta\":{"
                 "\"" GW_MCP_META_VERSION "\":\"v999.0.0\",\"" GW_MCP_META_CAPABILITIES "\":{}}}}",
                 &mismatch, &why) == -1);
    assert (why.status == 400 && why.code == -32020);
    s_headers_t v999 = {{"MCP-Protocol-Version", "Mcp-Method"}, {"v999.0.0", "tools/list"}};
    assert (
        s_check ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"_meta\":{"
                 "\"" GW_MCP_META_VERSION "\":\"v999.0.0\",\"" GW_MCP_META_CAPABILITIES "\":{}}}}",
                 &v999, &why) == -1);
    assert (why.status == 400 && why.code == -32022);
    assert (streq (json_string_value (json_object_get (why.data, "requested")), "v999.0.0"));
    assert (streq (json_string_value (json_array_get (json_object_get (why.data, "supported"), 0)),
                   "2026-07-28"));
    json_decref (why.data);
    s_headers_t upper = {{"MCP-Protocol-Version", "Mcp-Method"}, {"2026-07-28", "TOOLS/LIST"}};
    assert (s_check ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{" S_META
                     "}}",
                     &upper, &why) == -1);
    assert (why.code == -32020);
    //  tools/call names its tool in Mcp-Name: spaces around it allowed, base64 decoded.
    const char *call = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                       "\"name\":\"get_sandbox\"," S_META "}}";
    s_headers_t named = {{"MCP-Protocol-Version", "Mcp-Method", "Mcp-Name"},
                         {"2026-07-28", "tools/call", "  get_sandbox  "}};
    assert (s_check (call, &named, &why) == 0);
    named.values[2] = "=?base64?Z2V0X3NhbmRib3g=?=";
    assert (s_check (call, &named, &why) == 0);
    named.values[2] = "wrong_tool";
    assert (s_check (call, &named, &why) == -1 && why.code == -32020);
    named.names[2] = NULL;
    assert (s_check (call, &named, &why) == -1 && why.code == -32020);
    char *v = gw_mcp_era_header_value ("=?base64?not base64?=");
    assert (!v);
}
