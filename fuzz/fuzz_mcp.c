/*  fuzz_mcp - libFuzzer harness for HTTP request → JSON-RPC → tool arguments (/mcp).

    What a client sends to /mcp goes through the gateway's HTTP module (libmicrohttpd
    behind gw_http), then gw_mcp (headers, the JSON-RPC message, sessions, SSE), then
    gw_tools (each tool's arguments into broker messages). The harness runs all three,
    real, on a real loopback socket and a real zloop, as sbx-gateway does, with the
    caller already named (gw_mcp_handle is gw_mcp_admit, gw_auth, gw_mcp_serve: the
    harness calls the first and the last, with what gw_auth answers for a valid API
    key) and no broker, so every broker request fails at once
    with `unavailable` after its arguments were checked and its message built.

    The input is up to 4 requests, separated by a line "---". Each is a method line, a
    header line per header, an empty line and the body:
        POST
        Accept: application/json, text/event-stream
        Mcp-Session-Id: $session
        <empty line>
        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"exec",...}}
    "$session" stands for the Mcp-Session-Id the previous initialize answered, so a
    session's state (its default sandbox) is reachable. The harness adds Host and
    Content-Length itself, and keeps the connection open between requests as clients
    do. Properties: every request is
    answered, within 5 s; what gw_mcp answers as JSON is one JSON-RPC 2.0 response
    (result or error, never both) and every SSE event carries one JSON-RPC message;
    a tool result has content; nothing leaks (ASan).
*/
#include "gw_http.h"
#include "gw_mcp.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_mcp"
#include "fuzz_check.h"

#define S_MAX_REQUESTS 4

static struct {
    zloop_t *loop;
    gw_http_t *http;
    gw_ctx_t *ctx; //  no peer: every broker request fails unavailable
    gw_mcp_t *mcp;
    size_t inputs;
    int port;
    int fd; //  the connection to the server, kept alive between requests; -1: none
    //  This request's.
    zchunk_t *in;
    bool head, hung, closed, done;
    char session[128];
} s;

static sbx_caller_t s_caller = {.kind = SBX_CALLER_KIND_API_KEY,
                                .account_id = "acc_fuzz",
                                .key_id = "key_fuzz",
                                .preset = SBX_KEY_PRESET_FULL};

//  What sbx-gateway's router does for /mcp: gw_mcp_handle, with gw_auth's answer for a
//  valid key in place of the broker's.
static void s_handler (gw_request_t *req, void *arg)
{
    (void) arg;
    if (gw_mcp_admit (s.mcp, req))
        gw_mcp_serve (s.mcp, req, &s_caller);
}

//  True once s.in holds a whole response: its header, then Content-Length bytes or the
//  last chunk (none after HEAD, 1xx, 204 and 304).
static bool s_complete (void)
{
    const char *data = (const char *) zchunk_data (s.in);
    size_t size = zchunk_size (s.in);
    const char *end = memmem (data, size, "\r\n\r\n", 4);
    if (!end)
        return false;
    size_t head = (size_t) (end - data) + 4;
    char header[8192];
    snprintf (header, sizeof header, "%.*s", (int) (head < sizeof header ? head - 2 : 0), data);
    int status = size > 12 ? atoi (data + 9) : 0;
    if (s.head || status < 200 || status == 204 || status == 304)
        return true;
    if (strcasestr (header, "\r\nTransfer-Encoding: chunked\r\n"))
        return size >= head + 5 && memcmp (data + size - 5, "0\r\n\r\n", 5) == 0;
    const char *length = strcasestr (header, "\r\nContent-Length: ");
    return length && size >= head + strtoul (length + 18, NULL, 10);
}

static int s_on_client (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop, (void) arg;
    char buf[16384];
    while (true) {
        ssize_t n = recv (item->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
            zchunk_extend (s.in, buf, (size_t) n);
        else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            s.done = s_complete ();
            return s.done ? -1 : 0;
        } else {
            s.closed = s.done = true; //  the server closed: the answer is complete
            return -1;
        }
    }
}

static int s_on_stuck (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id, (void) arg;
    s.hung = true;
    return -1;
}

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_mcp", SBX_LOG_ERROR);
    zsys_init ();
    zsys_handler_set (NULL); //  libFuzzer handles the signals
    s.loop = zloop_new ();
    gw_http_options_t options = {.listen = "127.0.0.1:0", .plain = true};
    s.http = gw_http_new (s.loop, &options, s_handler, NULL);
    CHECK (s.loop && s.http, "the HTTP server");
    s.port = gw_http_port (s.http);
    s.in = zchunk_new (NULL, 0);
    s.fd = -1;
    return 0;
}

//  A header line the harness passes on: "Name: value", a token name that is not one
//  of the harness's own.
static bool s_header_ok (const char *line, size_t len)
{
    static const char *own[] = {
        "host", "content-length", "transfer-encoding", "connection", "expect", "upgrade", NULL};
    const char *colon = memchr (line, ':', len);
    if (!colon || colon == line)
        return false;
    for (const char *c = line; c < colon; c++)
        if (!isalnum ((unsigned char) *c) && *c != '-' && *c != '_')
            return false;
    for (const char *c = colon; c < line + len; c++)
        if (*c == '\r' || *c == 0)
            return false;
    for (int i = 0; own[i]; i++)
        if ((size_t) (colon - line) == strlen (own[i]) &&
            strncasecmp (line, own[i], strlen (own[i])) == 0)
            return false;
    return true;
}

//  The HTTP request for one part of the input (fresh).
static zchunk_t *s_request (const char *part, size_t size)
{
    const char *end = part + size;
    const char *nl = memchr (part, '\n', size);
    const char *line_end = nl ? nl : end;
    char method[16] = "POST";
    size_t mlen = (size_t) (line_end - part);
    bool token = mlen > 0 && mlen < sizeof method;
    for (size_t i = 0; token && i < mlen; i++)
        token = isupper ((unsigned char) part[i]);
    if (token) {
        memcpy (method, part, mlen);
        method[mlen] = 0;
    }
    s.head = streq (method, "HEAD");
    zchunk_t *headers = zchunk_new (NULL, 0);
    const char *p = nl ? nl + 1 : end;
    const char *body = end;
    while (p < end) {
        const char *eol = memchr (p, '\n', (size_t) (end - p));
        size_t len = (size_t) ((eol ? eol : end) - p);
        if (len > 0 && p[len - 1] == '\r')
            len--;
        if (len == 0) {
            body = eol ? eol + 1 : end;
            break;
        }
        if (s_header_ok (p, len)) {
            const char *value = memchr (p, ':', len) + 1;
            while (value < p + len && *value == ' ')
                value++;
            if ((size_t) (p + len - value) == 8 && memcmp (value, "$session", 8) == 0) {
                zchunk_extend (headers, p, (size_t) (value - p));
                zchunk_extend (headers, s.session, strlen (s.session));
            } else
                zchunk_extend (headers, p, len);
            zchunk_extend (headers, "\r\n", 2);
        }
        p = eol ? eol + 1 : end;
    }
    size_t body_size = (size_t) (end - body);
    char head[200];
    snprintf (head, sizeof head, "%s /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: %zu\r\n",
              method, body_size);
    zchunk_t *request = zchunk_new (head, strlen (head));
    zchunk_extend (request, zchunk_data (headers), zchunk_size (headers));
    zchunk_extend (request, "\r\n", 2);
    zchunk_extend (request, body, body_size);
    zchunk_destroy (&headers);
    return request;
}

//  One JSON-RPC message as gw_mcp writes it.
static void s_check_message (const char *text, size_t size)
{
    json_error_t error;
    json_t *msg = json_loadb (text, size, 0, &error);
    CHECK (json_is_object (msg), "an answer that is no JSON object");
    CHECK (json_is_string (json_object_get (msg, "jsonrpc")) &&
               streq (json_string_value (json_object_get (msg, "jsonrpc")), "2.0"),
           "an answer that is not JSON-RPC 2.0");
    json_t *result = json_object_get (msg, "result");
    json_t *err = json_object_get (msg, "error");
    json_t *method = json_object_get (msg, "method");
    if (method)
        CHECK (json_is_string (method) && !result && !err, "a notification with more");
    else {
        CHECK ((result != NULL) != (err != NULL), "a response needs a result or an error");
        CHECK (json_object_get (msg, "id"), "a response without its id");
        if (err)
            CHECK (json_is_integer (json_object_get (err, "code")) &&
                       json_is_string (json_object_get (err, "message")),
                   "an error without code and message");
        json_t *content = json_object_get (result, "content");
        if (content)
            CHECK (json_is_array (content) && json_array_size (content) > 0,
                   "a tool result without content");
    }
    json_decref (msg);
}

//  The body of a chunked response, de-chunked in place; false when malformed.
static bool s_dechunk (char *body, size_t *size_p)
{
    size_t in = 0, out = 0, size = *size_p;
    while (in < size) {
        char *eol = memmem (body + in, size - in, "\r\n", 2);
        if (!eol)
            return false;
        size_t n = strtoul (body + in, NULL, 16);
        in = (size_t) (eol - body) + 2;
        if (n == 0)
            break;
        if (in + n + 2 > size)
            return false;
        memmove (body + out, body + in, n);
        out += n;
        in += n + 2;
    }
    *size_p = out;
    return true;
}

//  The last response said Connection: close.
static bool s_close_after;

static void s_check_response (void)
{
    size_t size = zchunk_size (s.in);
    zchunk_extend (s.in, "", 1);
    char *text = (char *) zchunk_data (s.in);
    CHECK (size > 12 && strncmp (text, "HTTP/1.1 ", 9) == 0, "no HTTP response");
    int status = atoi (text + 9);
    CHECK (status >= 100 && status < 600, "no status");
    char *end = strstr (text, "\r\n\r\n");
    CHECK (end, "the header does not end");
    *end = 0;
    char *body = end + 4;
    size_t body_size = size - (size_t) (body - text);
    const char *type = strcasestr (text, "\r\nContent-Type: ");
    bool json = type && strncmp (type + 16, "application/json", 16) == 0;
    bool sse = type && strncmp (type + 16, "text/event-stream", 17) == 0;
    s_close_after = strcasestr (text, "\r\nConnection: close") != NULL;
    const char *session = strcasestr (text, "\r\nMcp-Session-Id: ");
    if (session) {
        session += 18;
        size_t len = strcspn (session, "\r");
        CHECK (len < sizeof s.session, "a long session id");
        memcpy (s.session, session, len);
        s.session[len] = 0;
    }
    if (s.head)
        return; //  the answer to HEAD has no body, whatever its headers say
    if (status == 202)
        CHECK (body_size == 0, "202 with a body");
    if (json && !(status == 500 && body_size == 2))
        s_check_message (body, body_size);
    if (sse) {
        CHECK (strcasestr (text, "\r\nTransfer-Encoding: chunked") && s_dechunk (body, &body_size),
               "an SSE stream that is not well chunked");
        body[body_size] = 0;
        size_t events = 0;
        for (char *event = body; *event;) {
            char *next = strstr (event, "\n\n");
            CHECK (next, "an SSE event that does not end");
            *next = 0;
            CHECK (strncmp (event, "event: message\ndata: ", 21) == 0,
                   "an SSE event of another shape");
            s_check_message (event + 21, strlen (event + 21));
            events++;
            event = next + 2;
        }
        CHECK (events > 0, "an SSE stream without the response");
    }
}

static void s_connect (void)
{
    s.fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int buffer = 1 << 20;
    setsockopt (s.fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons ((uint16_t) s.port)};
    addr.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
    CHECK (s.fd >= 0 && connect (s.fd, (struct sockaddr *) &addr, sizeof addr) == 0, "connect");
}

static void s_disconnect (void)
{
    close (s.fd);
    s.fd = -1;
}

static void s_exchange (const char *part, size_t size)
{
    //  One connection for many requests, as clients keep it: a new one costs twice the
    //  time of the request (TCP, and libmicrohttpd's memory pool for it).
    char byte;
    if (s.fd >= 0) {
        ssize_t n = recv (s.fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
        CHECK (n <= 0, "bytes from the server that no request asked for");
        if (n == 0)
            s_disconnect (); //  closed by the server since
    }
    if (s.fd < 0)
        s_connect ();
    zchunk_t *request = s_request (part, size);
    //  The whole request fits the socket's buffers; the server reads it from the loop.
    for (size_t sent = 0; sent < zchunk_size (request);) {
        ssize_t n =
            send (s.fd, zchunk_data (request) + sent, zchunk_size (request) - sent, MSG_NOSIGNAL);
        CHECK (n > 0, "send");
        sent += (size_t) n;
    }
    zchunk_destroy (&request);
    zchunk_resize (s.in, 0);
    s.hung = s.closed = s.done = false;
    zmq_pollitem_t poll = {NULL, s.fd, ZMQ_POLLIN, 0};
    CHECK (zloop_poller (s.loop, &poll, s_on_client, NULL) == 0, "poller");
    //  The hang-up (POLLHUP, an error to zloop) must reach the handler.
    zloop_poller_set_tolerant (s.loop, &poll);
    int stuck = zloop_timer (s.loop, 5000, 1, s_on_stuck, NULL);
    //  zloop_start also returns when a signal interrupts its poll (libFuzzer's timer).
    while (!s.done && !s.hung)
        zloop_start (s.loop);
    CHECK (!s.hung, "a request was not answered within 5 s");
    zloop_timer_end (s.loop, stuck);
    zloop_poller_end (s.loop, &poll);
    s_check_response ();
    if (s.closed || s_close_after)
        s_disconnect ();
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    //  Sessions of one input never meet the next's: their ids are random. A fresh gw_mcp
    //  now and then keeps them from piling up (one per input would cost a third of the
    //  time: the tool definitions are parsed in gw_tools_new).
    if (s.mcp && ++s.inputs % 1000 == 0) {
        gw_mcp_destroy (&s.mcp);
        gw_ctx_destroy (&s.ctx);
    }
    if (!s.mcp) {
        s.ctx = gw_ctx_new (NULL, s.loop, s.http, NULL);
        s.mcp = s.ctx ? gw_mcp_new (s.ctx) : NULL;
    }
    CHECK (s.mcp, "gw_mcp_new");
    snprintf (s.session, sizeof s.session, "mcps_none");
    const char *text = (const char *) data;
    const char *end = text + size;
    for (int i = 0; i < S_MAX_REQUESTS && text <= end; i++) {
        const char *sep = memmem (text, (size_t) (end - text), "\n---\n", 5);
        const char *part_end = sep && i < S_MAX_REQUESTS - 1 ? sep : end;
        s_exchange (text, (size_t) (part_end - text));
        if (part_end == end)
            break;
        text = part_end + 5;
    }
    return 0;
}
