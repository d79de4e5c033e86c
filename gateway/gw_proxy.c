/*  gw_proxy - see gw_proxy.h

    One s_conn_t per proxied request. Its phases: resolve (broker) → auth (private
    ports) → connect (non-blocking) → send the request and read the response head →
    stream the body, or, after a 101, pipe raw bytes both ways. Every fd is a zloop
    poller whose events follow what the connection can do now (s_update), so a full
    buffer stops reading its source: that is the backpressure.

    A stopped sandbox with autoResume on is woken (sandbox.wake) and the request waits
    (resolving again every 250 ms while it stops or resumes) until the guest serves it; a
    guest just woken may refuse for a second, then it is asked again.

    A connection is freed only from a poller or peer callback, or from a timer while it
    has no poller (waiting for a wake, or to connect again): zloop stops its pass over the
    pollers after one of them changes the poller set, and runs timers before pollers, so
    no handler is called for a freed connection.
*/
#include "gw_proxy.h"
#include "sbx_dqproxy.h"
#include "sbx_secret.h"
#include "gw_auth.h"
#include "gw_box.h"
#include "sbx_urls.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define S_CACHE_MS    2000         //  how long a resolve answer is reused
#define S_RESOLVE_MS  5000         //  the broker's deadline
#define S_MAX_HEAD    (64 * 1024)  //  a response head larger than this is refused
#define S_BUF_LIMIT   (256 * 1024) //  per direction: stop reading the source above this
#define S_READ_SIZE   (64 * 1024)
#define S_CACHE_LIMIT 10000
//  Auto-resume: how long a request waits for its stopped sandbox (a resume under TCG takes
//  seconds; a stop in progress ends first), how often it looks again meanwhile, and how
//  long after the wake the guest's server may still refuse (then it is asked again).
#define S_WAKE_HOLD_MS  120000
#define S_WAKE_POLL_MS  250
#define S_SERVE_MS      1000
#define S_SERVE_POLL_MS 100

typedef struct {
    char *sandbox_id;
    char *account;
    char *host;
    int host_port;
    char *relay; //  its vmd's relay (HOST:PORT), for a gateway on another host
    sbx_sandbox_state_t state;
    bool public;
    bool auto_resume;
    int64_t expires; //  zclock_mono
} s_target_t;

struct gw_proxy_t {
    sbx_config_t *config;
    zloop_t *loop;
    sbx_peer_t *peer;
    gw_auth_t *auth;  //  the gateway's (ctx)
    gw_box_t *box;    //  the page at <label>.<box_domain> unless port 80 is public
    char *box_domain; //  lower case: "box.<domain>", or the box_domain setting
    zhashx_t *cache;  //  "label:port" → s_target_t
    zlistx_t *conns;
    sbx_dqproxy_t *relay; //  to vmds' relays (with the ports key), made at first use
};

typedef struct {
    byte *data;
    size_t size, cap;
} s_buf_t;

typedef enum { F_NONE, F_LENGTH, F_CHUNKED, F_EOF } s_framing_t;
typedef enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE } s_chunk_state_t;

typedef enum {
    P_RESOLVE,
    P_AUTH,
    P_CONNECT,
    P_HEAD,    //  request going out, response head coming in
    P_BODY,    //  streaming the response body
    P_UPGRADE, //  101 sent, waiting for the client socket
    P_PIPE,    //  WebSocket: bytes both ways
} s_phase_t;

typedef struct {
    gw_proxy_t *proxy;
    gw_request_t *req; //  NULL once released or gone
    void *handle;      //  in proxy->conns
    s_phase_t phase;
    char label[64];
    int port;
    s_target_t target;
    bool from_cache, retried, websocket;
    bool bare;        //  <label>.<box_domain>: port 80 when public, else gw_box's page
    uint64_t rid;     //  the resolve request in flight
    bool in_request;  //  inside sbx_peer_request
    sbx_msg_t *early; //  its answer, given before it returned
    bool auth_pending, dead;
    bool authed;           //  the owner's credentials were checked (a private port)
    int64_t hold_until;    //  waiting for a wake until then (zclock_mono); 0: not waiting
    int64_t serve_until;   //  woken: the guest's server may refuse until then
    int timer;             //  the wait's zloop timer, 0 for none
    bool connect_on_timer; //  the timer connects again (else it resolves again)
    int up, up_events;
    int client, client_events; //  the upgraded socket (P_PIPE)
    s_buf_t to_up, from_up, pending;
    bool up_eof, client_eof;
    //  Response body framing.
    s_framing_t framing;
    uint64_t remaining;
    s_chunk_state_t chunk;
    bool paused; //  the stream buffer is full: wait for the drain callback
} s_conn_t;

static void s_update (s_conn_t *c);
static void s_free (s_conn_t *c);
static void s_resolve (s_conn_t *c);
static void s_start_connect (s_conn_t *c);

//  --------------------------------------------------------------------------
//  Small helpers

static int s_buf_add (s_buf_t *b, const void *data, size_t size)
{
    if (b->size + size > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->size + size)
            cap *= 2;
        byte *grown = realloc (b->data, cap);
        if (!grown)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    if (size)
        memcpy (b->data + b->size, data, size);
    b->size += size;
    return 0;
}

static void s_buf_eat (s_buf_t *b, size_t size)
{
    if (size >= b->size)
        b->size = 0;
    else {
        memmove (b->data, b->data + size, b->size - size);
        b->size -= size;
    }
}

static int s_buf_printf (s_buf_t *b, const char *format, ...)
    __attribute__ ((format (printf, 2, 3)));
static int s_buf_printf (s_buf_t *b, const char *format, ...)
{
    char *text = NULL;
    va_list args;
    va_start (args, format);
    int size = vasprintf (&text, format, args);
    va_end (args);
    int rc = size < 0 ? -1 : s_buf_add (b, text, (size_t) size);
    free (text);
    return rc;
}

static void s_target_clear (s_target_t *t)
{
    free (t->sandbox_id);
    free (t->account);
    free (t->host);
    free (t->relay);
    memset (t, 0, sizeof *t);
}

static void s_target_copy (s_target_t *to, const s_target_t *from)
{
    *to = *from;
    to->sandbox_id = from->sandbox_id ? strdup (from->sandbox_id) : NULL;
    to->account = from->account ? strdup (from->account) : NULL;
    to->host = from->host ? strdup (from->host) : NULL;
    to->relay = from->relay ? strdup (from->relay) : NULL;
}

static void s_cache_destructor (void **item)
{
    s_target_t *t = *item;
    if (t) {
        s_target_clear (t);
        free (t);
    }
    *item = NULL;
}

//  Hop-by-hop headers (RFC 9110 7.6.1) and what the proxy sets itself.
static bool s_hop (const char *name)
{
    static const char *names[] = {"connection",
                                  "keep-alive",
                                  "proxy-authenticate",
                                  "proxy-authorization",
                                  "proxy-connection",
                                  "te",
                                  "trailer",
                                  "transfer-encoding",
                                  "upgrade",
                                  "content-length",
                                  "host",
                                  "x-forwarded-for",
                                  "x-forwarded-proto",
                                  "x-forwarded-host",
                                  "expect",
                                  NULL};
    for (const char **n = names; *n; n++)
        if (strcasecmp (name, *n) == 0)
            return true;
    return false;
}

//  Does a comma-separated header value list `token` (case-insensitively)?
static bool s_has_token (const char *value, const char *token)
{
    size_t size = strlen (token);
    for (const char *p = value; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *last = end;
        while (last > p && (last[-1] == ' ' || last[-1] == '\t'))
            last--;
        if ((size_t) (last - p) == size && strncasecmp (p, token, size) == 0)
            return true;
        p = end;
    }
    return false;
}

//  Is name one of the gateway's own cookies (sign-in session, CSRF), today's or the
//  older unprefixed ones? A guest never sees them.
static bool s_gateway_cookie (const char *name, size_t size)
{
    static const char *names[] = {"__Host-sbx_session", "__Host-sbx_csrf", "sbx_session",
                                  "sbx_csrf", NULL};
    for (const char **n = names; *n; n++)
        if (strlen (*n) == size && memcmp (name, *n, size) == 0)
            return true;
    return false;
}

//  A Cookie header's value without the gateway's cookies, fresh ("" when none is left),
//  or NULL out of memory.
static char *s_cookie_for_guest (const char *value)
{
    char *out = malloc (strlen (value) + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = value; *p;) {
        while (*p == ' ' || *p == ';')
            p++;
        size_t len = strcspn (p, ";");
        size_t name = strcspn (p, "=;");
        while (name && p[name - 1] == ' ')
            name--;
        if (len && !s_gateway_cookie (p, name)) {
            if (o != out) {
                memcpy (o, "; ", 2);
                o += 2;
            }
            memcpy (o, p, len);
            o += len;
        }
        p += len;
    }
    *o = 0;
    return out;
}

//  A guest's Set-Cookie value without its Domain attribute, fresh, or NULL out of
//  memory: the cookie stays on the guest's own host, so no sandbox can set a cookie for
//  the gateway or for another sandbox, whatever their domains.
static char *s_set_cookie_host_only (const char *value)
{
    char *out = malloc (strlen (value) + 1), *o = out;
    if (!out)
        return NULL;
    size_t first = strcspn (value, ";"); //  name=value
    memcpy (o, value, first);
    o += first;
    for (const char *p = value + first; *p == ';';) {
        const char *attr = p + 1;
        size_t len = strcspn (attr, ";");
        const char *name = attr;
        while (*name == ' ' || *name == '\t')
            name++;
        size_t name_len = strcspn (name, "=; \t");
        if (!(name_len == 6 && strncasecmp (name, "domain", 6) == 0)) {
            memcpy (o, p, len + 1);
            o += len + 1;
        }
        p = attr + len;
    }
    *o = 0;
    return out;
}

//  --------------------------------------------------------------------------
//  Answers

static void s_error (s_conn_t *c, int status, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 4, 5)));
static void s_error (s_conn_t *c, int status, sbx_code_t code, const char *format, ...)
{
    if (!c->req)
        return;
    char message[600];
    va_list args;
    va_start (args, format);
    vsnprintf (message, sizeof message, format, args);
    va_end (args);
    json_t *body =
        json_pack ("{s:{s:s, s:s}}", "error", "code", sbx_code_name (code), "message", message);
    char *text = body ? json_dumps (body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref (body);
    gw_request_add_header (c->req, "Cache-Control", "no-store");
    if (status == 401)
        gw_request_add_header (c->req, "WWW-Authenticate", "Bearer realm=\"sbx\"");
    if (c->phase < P_BODY)
        gw_request_respond (c->req, status, "application/json", text, text ? strlen (text) : 0);
    else if (c->phase == P_BODY)
        gw_request_stream_end (c->req); //  too late for a status: cut the body short
    c->req = NULL;
    free (text);
    sbx_debug ("proxy %s-%d: %d %s", c->label, c->port, status, message);
}

//  --------------------------------------------------------------------------
//  Pollers

static int s_on_up (zloop_t *loop, zmq_pollitem_t *item, void *arg);
static int s_on_client (zloop_t *loop, zmq_pollitem_t *item, void *arg);

static void s_watch (s_conn_t *c, int fd, int *current, int want, zloop_fn *fn)
{
    if (fd < 0 || *current == want)
        return;
    zmq_pollitem_t item = {NULL, fd, 0, 0};
    if (*current)
        zloop_poller_end (c->proxy->loop, &item);
    *current = 0;
    if (want) {
        item.events = (short) want;
        if (zloop_poller (c->proxy->loop, &item, fn, c) == 0) {
            zloop_poller_set_tolerant (c->proxy->loop, &item);
            *current = want;
        }
    }
}

static void s_free (s_conn_t *c)
{
    s_watch (c, c->up, &c->up_events, 0, s_on_up);
    s_watch (c, c->client, &c->client_events, 0, s_on_client);
    if (c->up >= 0)
        close (c->up);
    if (c->rid)
        sbx_peer_cancel (c->proxy->peer, c->rid);
    if (c->timer)
        zloop_timer_end (c->proxy->loop, c->timer);
    sbx_msg_destroy (&c->early);
    if (c->req) {
        //  Still held: release it (the closed callback is not called for this).
        gw_request_set_closed_fn (c->req, NULL, NULL);
        gw_request_set_drain_fn (c->req, NULL, NULL);
        if (c->phase == P_PIPE || c->phase == P_UPGRADE)
            gw_request_upgrade_close (c->req);
        else if (c->phase == P_BODY)
            gw_request_stream_end (c->req);
        else
            gw_request_respond (c->req, 502, NULL, NULL, 0);
    }
    if (c->handle)
        zlistx_delete (c->proxy->conns, c->handle);
    s_target_clear (&c->target);
    free (c->to_up.data);
    free (c->from_up.data);
    free (c->pending.data);
    free (c);
}

//  Ends the connection now, or (auth in flight) when its callback comes.
static void s_end (s_conn_t *c)
{
    if (c->auth_pending) {
        c->dead = true;
        return;
    }
    s_free (c);
}

static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    s_conn_t *c = arg;
    c->req = NULL; //  freed when this returns
    s_end (c);
}

//  Writes what is pending of the body into the client's stream, as room allows.
//  Returns true when everything pending went.
static bool s_flush_stream (s_conn_t *c)
{
    while (c->req && c->pending.size) {
        size_t room = gw_request_stream_space (c->req);
        size_t size = c->pending.size < room ? c->pending.size : room;
        if (size == 0 || gw_request_stream_write (c->req, c->pending.data, size) != 0) {
            c->paused = true;
            return false;
        }
        s_buf_eat (&c->pending, size);
    }
    c->paused = false;
    return c->pending.size == 0;
}

//  Moves decoded body bytes from from_up into pending. Returns -1 on bad chunking.
static int s_decode (s_conn_t *c)
{
    s_buf_t *in = &c->from_up;
    while (in->size && c->pending.size < S_BUF_LIMIT) {
        if (c->framing == F_EOF) {
            s_buf_add (&c->pending, in->data, in->size);
            in->size = 0;
        } else if (c->framing == F_LENGTH || (c->framing == F_CHUNKED && c->chunk == CH_DATA)) {
            size_t size = in->size < c->remaining ? in->size : (size_t) c->remaining;
            s_buf_add (&c->pending, in->data, size);
            s_buf_eat (in, size);
            c->remaining -= size;
            if (c->framing == F_CHUNKED && c->remaining == 0)
                c->chunk = CH_DATA_END;
            if (c->framing == F_LENGTH && c->remaining == 0) {
                in->size = 0; //  anything after the body is not ours
                return 0;
            }
        } else if (c->framing == F_CHUNKED) {
            byte *eol = memmem (in->data, in->size, "\r\n", 2);
            if (!eol)
                return in->size > 4096 ? -1 : 0;
            size_t line = (size_t) (eol - in->data);
            if (c->chunk == CH_SIZE) {
                char text[32];
                size_t n = line < sizeof text - 1 ? line : sizeof text - 1;
                memcpy (text, in->data, n);
                text[n] = 0;
                char *end;
                errno = 0;
                unsigned long long size = strtoull (text, &end, 16);
                if (end == text || errno)
                    return -1;
                c->remaining = size;
                c->chunk = size ? CH_DATA : CH_TRAILER;
            } else if (c->chunk == CH_DATA_END) {
                if (line != 0)
                    return -1;
                c->chunk = CH_SIZE;
            } else if (c->chunk == CH_TRAILER) {
                if (line == 0)
                    c->chunk = CH_DONE;
            } else
                in->size = 0;
            s_buf_eat (in, line + 2);
            if (c->chunk == CH_DONE) {
                in->size = 0;
                return 0;
            }
        } else
            in->size = 0;
    }
    return 0;
}

static bool s_body_complete (s_conn_t *c)
{
    return (c->framing == F_LENGTH && c->remaining == 0) ||
           (c->framing == F_CHUNKED && c->chunk == CH_DONE) || c->framing == F_NONE || c->up_eof;
}

//  Body bytes arrived or room came free: pass what can go; end when all went.
static void s_pump_body (s_conn_t *c)
{
    if (s_decode (c)) {
        sbx_warn ("proxy %s-%d: the guest's chunked body is malformed; cut", c->label, c->port);
        c->up_eof = true;
        c->from_up.size = 0;
    }
    bool flushed = s_flush_stream (c);
    if (flushed && c->from_up.size == 0 && s_body_complete (c)) {
        if (c->req) {
            gw_request_set_closed_fn (c->req, NULL, NULL);
            gw_request_set_drain_fn (c->req, NULL, NULL);
            gw_request_stream_end (c->req);
            c->req = NULL;
        }
        s_end (c);
        return;
    }
    s_update (c);
}

static void s_on_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_pump_body (arg);
}

static void s_on_upgraded (gw_request_t *req, int fd, const void *extra, size_t extra_size,
                           void *arg)
{
    (void) req;
    s_conn_t *c = arg;
    c->client = fd;
    c->phase = P_PIPE;
    s_buf_add (&c->to_up, extra, extra_size);
    s_update (c);
}

typedef struct {
    char *content_type;
    bool chunked;
    int64_t length; //  -1: none
} s_head_t;

//  Parses the response head in from_up[0..size) and answers the client's head.
//  Returns 0, or -1 when it is not HTTP.
static int s_on_head (s_conn_t *c, size_t size)
{
    char *head = strndup ((const char *) c->from_up.data, size);
    if (!head)
        return -1;
    char *save = NULL;
    char *line = strtok_r (head, "\r\n", &save);
    int status = 0;
    if (!line || sscanf (line, "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 999) {
        free (head);
        return -1;
    }
    s_head_t h = {NULL, false, -1};
    //  Connection may name more hop-by-hop headers: find it first.
    char *connection = NULL;
    char *copy = strndup ((const char *) c->from_up.data, size);
    char *scan = NULL;
    for (char *l = copy ? strtok_r (copy, "\r\n", &scan) : NULL; l && !connection;
         l = strtok_r (NULL, "\r\n", &scan))
        if (strncasecmp (l, "connection:", 11) == 0)
            connection = strdup (l + 11);
    free (copy);
    bool upgraded = status == 101 && c->websocket;
    while ((line = strtok_r (NULL, "\r\n", &save))) {
        char *colon = strchr (line, ':');
        if (!colon)
            continue;
        *colon = 0;
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t')
            value++;
        size_t vlen = strlen (value);
        while (vlen && (value[vlen - 1] == ' ' || value[vlen - 1] == '\t'))
            value[--vlen] = 0;
        if (strcasecmp (line, "transfer-encoding") == 0)
            h.chunked = s_has_token (value, "chunked");
        else if (strcasecmp (line, "content-length") == 0)
            h.length = strtoll (value, NULL, 10);
        else if (strcasecmp (line, "content-type") == 0) {
            free (h.content_type);
            h.content_type = strdup (value);
        } else if (s_hop (line) || (connection && s_has_token (connection, line)))
            ;
        else if (c->req && strcasecmp (line, "set-cookie") == 0) {
            char *host_only = s_set_cookie_host_only (value);
            if (host_only)
                gw_request_add_header (c->req, "Set-Cookie", host_only);
            free (host_only);
        } else if (c->req)
            gw_request_add_header (c->req, line, value); //  refused values are dropped
    }
    free (connection);
    free (head);
    s_buf_eat (&c->from_up, size);
    if (!c->req) {
        free (h.content_type);
        return 0;
    }
    if (upgraded) {
        if (h.content_type)
            gw_request_add_header (c->req, "Content-Type", h.content_type);
        free (h.content_type);
        c->phase = P_UPGRADE;
        gw_request_set_drain_fn (c->req, NULL, NULL);
        if (gw_request_upgrade (c->req, "websocket", s_on_upgraded, c) != 0) {
            c->phase = P_HEAD;
            s_error (c, 502, SBX_E_UNAVAILABLE, "the WebSocket upgrade failed");
            return 0;
        }
        //  What the guest sent after its 101 goes to the client once it is connected.
        return 0;
    }
    const char *method = gw_request_method (c->req);
    bool no_body = streq (method, "HEAD") || status < 200 || status == 204 || status == 304;
    if (no_body) {
        gw_request_respond (c->req, status, h.content_type, NULL, 0);
        c->req = NULL;
        free (h.content_type);
        c->up_eof = true;
        return 0;
    }
    c->framing = h.chunked ? F_CHUNKED : h.length >= 0 ? F_LENGTH : F_EOF;
    c->remaining = h.length > 0 ? (uint64_t) h.length : 0;
    c->chunk = CH_SIZE;
    c->phase = P_BODY;
    gw_request_set_drain_fn (c->req, s_on_drain, c);
    if (gw_request_stream_start (c->req, status, h.content_type) != 0)
        sbx_debug ("proxy %s-%d: the client left before the answer", c->label, c->port);
    free (h.content_type);
    return 0;
}

//  Which events each fd wants now.
static void s_update (s_conn_t *c)
{
    int up = 0, client = 0;
    switch (c->phase) {
    case P_CONNECT:
        up = ZMQ_POLLOUT;
        break;
    case P_HEAD:
        up = ZMQ_POLLIN | (c->to_up.size ? ZMQ_POLLOUT : 0);
        break;
    case P_BODY:
        up = c->paused || c->up_eof || c->pending.size >= S_BUF_LIMIT ? 0 : ZMQ_POLLIN;
        break;
    case P_UPGRADE:
        up = 0;
        break;
    case P_PIPE:
        up = (!c->up_eof && c->from_up.size < S_BUF_LIMIT ? ZMQ_POLLIN : 0) |
             (c->to_up.size ? ZMQ_POLLOUT : 0);
        client = (!c->client_eof && c->to_up.size < S_BUF_LIMIT ? ZMQ_POLLIN : 0) |
                 (c->from_up.size ? ZMQ_POLLOUT : 0);
        break;
    default:
        break;
    }
    s_watch (c, c->up, &c->up_events, up, s_on_up);
    s_watch (c, c->client, &c->client_events, client, s_on_client);
}

//  Sends what it can of buf to fd. -1 on a broken connection.
static int s_send_buf (int fd, s_buf_t *buf)
{
    while (buf->size) {
        ssize_t sent = send (fd, buf->data, buf->size, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        s_buf_eat (buf, (size_t) sent);
    }
    return 0;
}

//  Reads what there is from fd into buf (up to S_READ_SIZE). 1 on EOF, -1 on error.
static int s_recv_buf (int fd, s_buf_t *buf)
{
    byte data[S_READ_SIZE];
    ssize_t got = recv (fd, data, sizeof data, MSG_DONTWAIT);
    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (got == 0)
        return 1;
    return s_buf_add (buf, data, (size_t) got);
}

//  --------------------------------------------------------------------------
//  Waiting: for a sandbox that is waking, or for a woken guest's server

static int s_on_timer (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_conn_t *c = arg;
    c->timer = 0;
    if (c->connect_on_timer)
        s_start_connect (c);
    else
        s_resolve (c);
    return 0;
}

//  Connects (connect) or resolves again in `ms`. A waiting connection has no socket to
//  the guest, so none of its pollers is registered: the timer may end it.
static void s_later (s_conn_t *c, int ms, bool connect)
{
    assert (c->up < 0 && c->client < 0 && !c->timer);
    c->phase = P_RESOLVE;
    c->connect_on_timer = connect;
    int timer = zloop_timer (c->proxy->loop, (size_t) ms, 1, s_on_timer, c);
    if (timer < 0) {
        s_error (c, 503, SBX_E_UNAVAILABLE, "cannot wait for sandbox %s: out of timers",
                 c->target.sandbox_id);
        s_end (c);
        return;
    }
    c->timer = timer;
}

//  Just woken, its server may still refuse (or the forward close at once): try again
//  for a moment. The request had not reached a server that answered.
static bool s_retry_woken (s_conn_t *c)
{
    if (!c->serve_until || zclock_mono () >= c->serve_until)
        return false;
    s_watch (c, c->up, &c->up_events, 0, s_on_up);
    if (c->up >= 0)
        close (c->up);
    c->up = -1;
    c->up_eof = false;
    c->from_up.size = 0;
    s_later (c, S_SERVE_POLL_MS, true);
    return true;
}

//  The guest's forward refused or closed at once: a cached answer may be stale (the port
//  moved, the sandbox stopped), or the sandbox began to stop after the broker answered
//  (an autoResume one then waits for its wake): ask the broker once more. The request
//  had not reached a server that answered.
static bool s_resolve_again (s_conn_t *c)
{
    if (c->retried || !(c->from_cache || c->target.auto_resume))
        return false;
    c->retried = true;
    s_watch (c, c->up, &c->up_events, 0, s_on_up);
    if (c->up >= 0)
        close (c->up);
    c->up = -1;
    c->up_eof = false;
    c->from_up.size = 0;
    char key[96];
    snprintf (key, sizeof key, "%s:%d", c->label, c->port);
    zhashx_delete (c->proxy->cache, key);
    s_resolve (c);
    return true;
}

//  Connecting failed: a cached answer may be stale (the port moved, the sandbox
//  stopped): ask the broker once more; else tell the client.
static void s_connect_failed (s_conn_t *c, int error)
{
    close (c->up);
    c->up_events = 0;
    c->up = -1;
    if (s_retry_woken (c) || s_resolve_again (c))
        return;
    s_error (c, 502, SBX_E_UNAVAILABLE,
             "port %d of sandbox %s is not answering (%s): is a server listening on it in the "
             "guest? If the sandbox was resumed on a new host port, call host_port again",
             c->port, c->target.sandbox_id, strerror (error));
    s_end (c);
}

static int s_on_up (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    s_conn_t *c = arg;
    if (c->phase == P_CONNECT) {
        int error = 0;
        socklen_t size = sizeof error;
        if (getsockopt (c->up, SOL_SOCKET, SO_ERROR, &error, &size) || error) {
            s_watch (c, c->up, &c->up_events, 0, s_on_up);
            s_connect_failed (c, error ? error : errno);
            return 0;
        }
        c->phase = P_HEAD;
    }
    if ((item->revents & ZMQ_POLLOUT) || c->to_up.size) {
        if (s_send_buf (c->up, &c->to_up)) {
            if (c->phase == P_HEAD && c->from_up.size == 0 &&
                (s_retry_woken (c) || s_resolve_again (c)))
                return 0;
            if (c->phase == P_HEAD)
                s_error (c, 502, SBX_E_UNAVAILABLE, "the connection to port %d of sandbox %s broke",
                         c->port, c->target.sandbox_id);
            s_end (c);
            return 0;
        }
    }
    if (item->revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        s_buf_t *into = &c->from_up;
        int rc = c->up_eof ? 1 : s_recv_buf (c->up, into);
        if (rc < 0 && c->phase == P_HEAD && c->from_up.size == 0 &&
            (s_retry_woken (c) || s_resolve_again (c)))
            return 0;
        if (rc < 0 && c->phase != P_BODY && c->phase != P_PIPE) {
            s_error (c, 502, SBX_E_UNAVAILABLE, "the connection to port %d of sandbox %s broke",
                     c->port, c->target.sandbox_id);
            s_end (c);
            return 0;
        }
        if (rc != 0)
            c->up_eof = true;
        if (c->phase == P_HEAD) {
            byte *end =
                c->from_up.size ? memmem (c->from_up.data, c->from_up.size, "\r\n\r\n", 4) : NULL;
            if (!end && c->up_eof && c->from_up.size == 0 &&
                (s_retry_woken (c) || s_resolve_again (c)))
                return 0;
            if (!end && (c->up_eof || c->from_up.size > S_MAX_HEAD)) {
                s_error (c, 502, SBX_E_UNAVAILABLE, "port %d of sandbox %s %s", c->port,
                         c->target.sandbox_id,
                         c->up_eof ? "closed the connection without an HTTP answer"
                                   : "sent an HTTP head larger than 64 KiB");
                s_end (c);
                return 0;
            }
            if (end && s_on_head (c, (size_t) (end - c->from_up.data) + 4) != 0) {
                s_error (c, 502, SBX_E_UNAVAILABLE, "port %d of sandbox %s does not speak HTTP",
                         c->port, c->target.sandbox_id);
                s_end (c);
                return 0;
            }
            if (end && !c->req && c->phase != P_UPGRADE) { //  answered (no body) or gone
                s_end (c);
                return 0;
            }
        }
        if (c->phase == P_BODY) {
            s_pump_body (c);
            return 0;
        }
        if (c->phase == P_PIPE && c->client >= 0 && s_send_buf (c->client, &c->from_up) < 0) {
            s_end (c);
            return 0;
        }
        if (c->phase == P_PIPE && c->up_eof && c->from_up.size == 0) {
            s_end (c); //  the guest closed: so does the client
            return 0;
        }
    }
    s_update (c);
    return 0;
}

static int s_on_client (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    s_conn_t *c = arg;
    if ((item->revents & ZMQ_POLLOUT) && s_send_buf (c->client, &c->from_up) < 0) {
        s_end (c);
        return 0;
    }
    if (item->revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        int rc = s_recv_buf (c->client, &c->to_up);
        if (rc != 0)
            c->client_eof = true;
        if (s_send_buf (c->up, &c->to_up) < 0 || (c->client_eof && c->to_up.size == 0)) {
            s_end (c); //  the client left: so does the guest's connection
            return 0;
        }
    }
    if (c->up_eof && c->from_up.size == 0) {
        s_end (c);
        return 0;
    }
    s_update (c);
    return 0;
}

//  --------------------------------------------------------------------------
//  The request to the guest

//  Every header but the hop-by-hop ones, the caller's credentials (Authorization: the
//  API key that opened a private port, or anything a browser sends a public one) and
//  the gateway's cookies: a guest is not trusted with what proves who its visitor is.
static void s_copy_header (const char *name, const char *value, void *arg)
{
    s_buf_t *out = arg;
    if (s_hop (name) || strcasecmp (name, "authorization") == 0)
        return;
    if (strcasecmp (name, "cookie") == 0) {
        char *cookie = s_cookie_for_guest (value);
        if (cookie && *cookie)
            s_buf_printf (out, "Cookie: %s\r\n", cookie);
        free (cookie);
        return;
    }
    s_buf_printf (out, "%s: %s\r\n", name, value);
}

//  The relay to vmds on other hosts, once the broker gave the ports key (a cluster); NULL
//  on one machine, where the forwards are on this host.
static sbx_dqproxy_t *s_relay (gw_proxy_t *self)
{
    const char *key = self->peer ? sbx_peer_ports_key (self->peer) : NULL;
    unsigned char bytes[SBX_DQPROXY_KEY_SIZE];
    if (!self->relay && key && sbx_dqproxy_key_hex (key, bytes) == 0)
        self->relay = sbx_dqproxy_new (bytes, sizeof bytes);
    sbx_secret_wipe_bytes (bytes, sizeof bytes);
    return self->relay;
}

static void s_start_connect (s_conn_t *c)
{
    gw_request_t *req = c->req;
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons ((uint16_t) c->target.host_port)};
    if (!c->target.relay &&
        (!c->target.host || inet_pton (AF_INET, c->target.host, &addr.sin_addr) != 1)) {
        s_error (c, 502, SBX_E_INTERNAL, "port %d of sandbox %s has no usable endpoint", c->port,
                 c->target.sandbox_id);
        s_end (c);
        return;
    }
    //  The request, complete (its body is already here).
    c->to_up.size = 0;
    const char *host = gw_request_header (req, "Host");
    const char *forwarded = gw_request_header (req, "X-Forwarded-For");
    s_buf_printf (&c->to_up, "%s %s HTTP/1.1\r\nHost: %s\r\n", gw_request_method (req),
                  gw_request_target (req), host ? host : "localhost");
    gw_request_headers (req, s_copy_header, &c->to_up);
    s_buf_printf (&c->to_up, "X-Forwarded-For: %s%s%s\r\nX-Forwarded-Proto: %s\r\n",
                  forwarded ? forwarded : "", forwarded ? ", " : "", gw_request_peer (req),
                  gw_request_tls (req) ? "https" : "http");
    if (host)
        s_buf_printf (&c->to_up, "X-Forwarded-Host: %s\r\n", host);
    if (c->websocket)
        s_buf_printf (&c->to_up, "Connection: Upgrade\r\nUpgrade: %s\r\n",
                      gw_request_header (req, "Upgrade"));
    else
        s_buf_printf (&c->to_up, "Connection: close\r\n");
    size_t body = gw_request_body_size (req);
    const char *method = gw_request_method (req);
    if (body || streq (method, "POST") || streq (method, "PUT") || streq (method, "PATCH"))
        s_buf_printf (&c->to_up, "Content-Length: %zu\r\n", body);
    s_buf_add (&c->to_up, "\r\n", 2);
    s_buf_add (&c->to_up, gw_request_body (req), body);

    //  Through the vmd's relay: a socket at once, the connect and TLS in the relay's
    //  thread; a refusal or failure closes it (502: no HTTP answer).
    sbx_dqproxy_t *relay = c->target.relay ? s_relay (c->proxy) : NULL;
    if (relay) {
        char line[16];
        snprintf (line, sizeof line, "%d", c->target.host_port);
        c->up = sbx_dqproxy_dial_routed (relay, c->target.relay, line);
        int flags = c->up >= 0 ? fcntl (c->up, F_GETFL) : -1;
        if (flags < 0 || fcntl (c->up, F_SETFL, flags | O_NONBLOCK) < 0) {
            if (c->up >= 0)
                close (c->up);
            c->up = -1;
            s_error (c, 502, SBX_E_UNAVAILABLE,
                     "port %d of sandbox %s: its host's relay %s is not usable", c->port,
                     c->target.sandbox_id, c->target.relay);
            s_end (c);
            return;
        }
        c->phase = P_HEAD;
        s_update (c);
        return;
    }
    c->up = socket (AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->up < 0) {
        s_error (c, 503, SBX_E_UNAVAILABLE, "cannot open a socket: %s", strerror (errno));
        s_end (c);
        return;
    }
    c->phase = P_CONNECT;
    if (connect (c->up, (struct sockaddr *) &addr, sizeof addr) == 0)
        c->phase = P_HEAD;
    else if (errno != EINPROGRESS) {
        s_connect_failed (c, errno);
        return;
    }
    s_update (c);
}

//  --------------------------------------------------------------------------
//  Resolve and check

//  A sandbox's own URL with no public port 80: gw_box's page answers instead.
static void s_to_box (s_conn_t *c)
{
    gw_request_t *req = c->req;
    if (req) {
        gw_request_set_closed_fn (req, NULL, NULL);
        c->req = NULL;
        gw_box_serve (c->proxy->box, req, c->label);
    }
    s_end (c);
}

static void s_proceed (s_conn_t *c);

static void s_on_auth (const sbx_caller_t *caller, sbx_code_t code, const char *message, void *arg)
{
    s_conn_t *c = arg;
    c->auth_pending = false;
    if (c->dead) {
        s_free (c);
        return;
    }
    if (!caller) {
        s_error (c, code == SBX_E_UNAUTHENTICATED ? 401 : sbx_code_http_status (code),
                 code == SBX_E_UNAUTHENTICATED ? SBX_E_UNAUTHENTICATED : code,
                 "port %d of sandbox %s is private: %s", c->port, c->target.sandbox_id,
                 message ? message : "the API key was refused");
        s_end (c);
        return;
    }
    bool operator= caller->kind == SBX_CALLER_KIND_ADMIN || caller->kind == SBX_CALLER_KIND_SYSTEM;
    if (!operator&& (!caller->account_id || !c->target.account ||
                     !streq (caller->account_id, c->target.account))) {
        s_error (c, 403, SBX_E_PERMISSION_DENIED,
                 "port %d of sandbox %s is private: only its owner's API keys may use it", c->port,
                 c->target.sandbox_id);
        s_end (c);
        return;
    }
    c->authed = true;
    s_proceed (c);
}

static void s_on_woken (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg);

//  An answer given inside sbx_peer_request (s_ask) is kept for after the call: true.
//  Else the request is answered: false.
static bool s_keep_early (s_conn_t *c, sbx_msg_t **reply_p)
{
    if (c->in_request) {
        c->early = *reply_p;
        *reply_p = NULL;
        return true;
    }
    c->rid = 0;
    return false;
}

//  Sends request to the broker; reply_fn gets its answer, even one given at once (a
//  request that cannot go out is answered inside sbx_peer_request: that answer is kept
//  for after the call, which must not see the connection freed).
static void s_ask (s_conn_t *c, sbx_msg_t **request_p, uint32_t deadline_ms, sbx_peer_reply_fn *fn)
{
    c->in_request = true;
    uint64_t rid = sbx_peer_request (c->proxy->peer, request_p, deadline_ms, fn, c);
    c->in_request = false;
    if (!c->early) {
        c->rid = rid;
        return;
    }
    sbx_msg_t *early = c->early;
    c->early = NULL;
    fn (c->proxy->peer, &early, c);
    sbx_msg_destroy (&early);
}

//  A stopped sandbox with autoResume on (a private port's owner asking): hold the
//  request, wake the sandbox (a stop in progress ends first), then serve it.
static void s_hold (s_conn_t *c)
{
    int64_t now = zclock_mono ();
    const char *state = sbx_sandbox_state_name (c->target.state);
    if (!c->hold_until) {
        c->hold_until = now + S_WAKE_HOLD_MS;
        sbx_info ("proxy %s-%d: sandbox=%s is %s: the request waits for it to wake", c->label,
                  c->port, c->target.sandbox_id, state);
    }
    if (now >= c->hold_until) {
        s_error (c, 504, SBX_E_TIMEOUT,
                 "sandbox %s did not wake within %d s of this request (it is %s); try again, or "
                 "resume it (resume_sandbox)",
                 c->target.sandbox_id, S_WAKE_HOLD_MS / 1000, state);
        s_end (c);
        return;
    }
    if (c->target.state != SBX_SANDBOX_STATE_STOPPED) {
        s_later (c, S_WAKE_POLL_MS, false); //  stopping or resuming: look again soon
        return;
    }
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_WAKE);
    sbx_str_set (&sbx_msg_sandbox_wake (request)->sandbox_id, c->target.sandbox_id);
    sbx_msg_sandbox_wake (request)->port = (uint64_t) c->port;
    sbx_msg_set_subject (request, c->target.sandbox_id);
    c->phase = P_RESOLVE;
    int64_t left = c->hold_until - now;
    s_ask (c, &request, (uint32_t) (left > 1000 ? left : 1000), s_on_woken);
}

static void s_on_woken (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_conn_t *c = arg;
    if (s_keep_early (c, reply_p))
        return;
    sbx_msg_t *reply = *reply_p;
    if (reply->type == SBX_MSG_ERROR) {
        sbx_code_t code = sbx_msg_error (reply)->code;
        //  It moved meanwhile (a stop not yet ended, someone resumed it, autoResume
        //  switched off), or its vmd is away for a moment: what it is now decides.
        if (code == SBX_E_FAILED_PRECONDITION || code == SBX_E_UNAVAILABLE) {
            s_later (c, S_WAKE_POLL_MS, false);
            return;
        }
        s_error (c, sbx_code_http_status (code), code,
                 "port %d of sandbox %s: the sandbox is stopped and could not be resumed: %s",
                 c->port, c->target.sandbox_id, sbx_msg_error (reply)->message);
        s_end (c);
        return;
    }
    sbx_info ("proxy %s-%d: sandbox=%s woke", c->label, c->port, c->target.sandbox_id);
    s_resolve (c); //  its forward may listen on a new host port now
}

//  The target is known: check it, then connect.
static void s_proceed (s_conn_t *c)
{
    if (c->bare && !c->target.public) {
        s_to_box (c);
        return;
    }
    //  A private port's owner is known before its state is told or it is woken.
    if (!c->target.public && !c->authed) {
        const char *token = gw_auth_bearer (gw_request_header (c->req, "Authorization"));
        if (!token) {
            s_error (c, 401, SBX_E_UNAUTHENTICATED,
                     "port %d of sandbox %s is private: send Authorization: Bearer <API key of "
                     "its owner>, or publish it with host_port public: true",
                     c->port, c->target.sandbox_id);
            s_end (c);
            return;
        }
        c->auth_pending = true;
        gw_auth_check (c->proxy->auth, token, s_on_auth, c);
        return;
    }
    sbx_sandbox_state_t state = c->target.state;
    if (state == SBX_SANDBOX_STATE_READY) {
        if (c->hold_until && !c->serve_until)
            c->serve_until = zclock_mono () + S_SERVE_MS;
        s_start_connect (c);
        return;
    }
    if (c->target.auto_resume &&
        (state == SBX_SANDBOX_STATE_STOPPED || state == SBX_SANDBOX_STATE_STOPPING ||
         state == SBX_SANDBOX_STATE_RESUMING)) {
        s_hold (c);
        return;
    }
    if (state == SBX_SANDBOX_STATE_STOPPED)
        s_error (c, 503, SBX_E_UNAVAILABLE,
                 "sandbox %s is stopped and its autoResume is off; resume it (resume_sandbox) to "
                 "reach port %d",
                 c->target.sandbox_id, c->port);
    else
        s_error (c, 503, SBX_E_UNAVAILABLE, "sandbox %s is %s; port %d answers once it is ready",
                 c->target.sandbox_id, sbx_sandbox_state_name (state), c->port);
    s_end (c);
}

static void s_on_resolved (sbx_peer_t *peer, sbx_msg_t **reply_p, void *arg)
{
    (void) peer;
    s_conn_t *c = arg;
    if (s_keep_early (c, reply_p))
        return;
    sbx_msg_t *reply = *reply_p;
    if (reply->type == SBX_MSG_ERROR) {
        sbx_code_t code = sbx_msg_error (reply)->code;
        if (code == SBX_E_NOT_FOUND && c->bare) {
            s_to_box (c); //  no port 80 (or no such sandbox: the page does not say)
            return;
        }
        if (code == SBX_E_NOT_FOUND)
            s_error (c, 404, code,
                     "nothing is published at %s-%d: no sandbox has that label, or "
                     "port %d is not published (host_port)",
                     c->label, c->port, c->port);
        else
            s_error (c, sbx_code_http_status (code), code, "cannot resolve %s-%d: %s", c->label,
                     c->port, sbx_msg_error (reply)->message);
        s_end (c);
        return;
    }
    sbx_sandbox_resolve_ok_t *ok = sbx_msg_sandbox_resolve_ok (reply);
    s_target_t *t = calloc (1, sizeof *t);
    if (t) {
        t->sandbox_id = strdup (ok->sandbox_id);
        t->account = strdup (ok->account);
        t->host = ok->host ? strdup (ok->host) : NULL;
        t->host_port = (int) ok->host_port;
        t->relay = ok->relay ? strdup (ok->relay) : NULL;
        t->state = ok->state;
        t->public = ok->public;
        t->auto_resume = ok->auto_resume;
        t->expires = zclock_mono () + S_CACHE_MS;
        char key[96];
        snprintf (key, sizeof key, "%s:%d", c->label, c->port);
        if (zhashx_size (c->proxy->cache) > S_CACHE_LIMIT)
            zhashx_purge (c->proxy->cache);
        zhashx_update (c->proxy->cache, key, t);
        s_target_clear (&c->target);
        s_target_copy (&c->target, t);
    }
    c->from_cache = false;
    s_proceed (c);
}

static void s_resolve (s_conn_t *c)
{
    c->phase = P_RESOLVE;
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_RESOLVE);
    sbx_str_set (&sbx_msg_sandbox_resolve (request)->label, c->label);
    sbx_msg_sandbox_resolve (request)->port = (uint64_t) c->port;
    s_ask (c, &request, S_RESOLVE_MS, s_on_resolved);
}

bool gw_proxy_handle (gw_proxy_t *self, gw_request_t *req)
{
    char label[64];
    int port = 80;
    bool bare = false;
    if (!self)
        return false;
    if (gw_proxy_parse_host (gw_request_host (req), self->box_domain, label, sizeof label, &port) !=
        0) {
        //  The sandbox's own URL: its port 80 when that is public, else gw_box's page
        //  (at once for an owner link, whose token must not reach the guest).
        if (gw_box_parse_host (gw_request_host (req), self->box_domain, label, sizeof label))
            return false;
        if (gw_box_wants_owner (req)) {
            gw_box_serve (self->box, req, label);
            return true;
        }
        bare = true;
    }
    s_conn_t *c = calloc (1, sizeof *c);
    if (!c) {
        gw_request_respond (req, 503, NULL, NULL, 0);
        return true;
    }
    c->proxy = self;
    c->req = req;
    c->up = c->client = -1;
    snprintf (c->label, sizeof c->label, "%s", label);
    c->port = port;
    c->bare = bare;
    const char *upgrade = gw_request_header (req, "Upgrade");
    const char *connection = gw_request_header (req, "Connection");
    c->websocket = upgrade && strcasecmp (upgrade, "websocket") == 0 && connection &&
                   s_has_token (connection, "upgrade");
    c->handle = zlistx_add_end (self->conns, c);
    gw_request_set_closed_fn (req, s_on_closed, c);
    char key[96];
    snprintf (key, sizeof key, "%s:%d", label, port);
    s_target_t *cached = zhashx_lookup (self->cache, key);
    if (cached && cached->expires > zclock_mono ()) {
        s_target_copy (&c->target, cached);
        c->from_cache = true;
        s_proceed (c);
    } else
        s_resolve (c);
    return true;
}

int gw_proxy_parse_host (const char *host, const char *box_domain, char *label, size_t label_size,
                         int *port)
{
    if (!host || !box_domain || !*box_domain)
        return -1;
    char suffix[300];
    snprintf (suffix, sizeof suffix, ".%s", box_domain);
    for (char *s = suffix; *s; s++)
        *s = (char) tolower ((unsigned char) *s);
    size_t size = strlen (host), suffix_size = strlen (suffix);
    if (size <= suffix_size || strcmp (host + size - suffix_size, suffix) != 0)
        return -1;
    size_t first = size - suffix_size; //  "<label>-<port>"
    const char *dash = NULL;
    for (size_t i = 0; i < first; i++) {
        char ch = host[i];
        if (ch == '-')
            dash = host + i;
        else if (!islower ((unsigned char) ch) && !isdigit ((unsigned char) ch))
            return -1; //  one DNS label of [a-z0-9-]
    }
    if (!dash || dash == host || (size_t) (dash - host) >= label_size)
        return -1;
    const char *digits = dash + 1, *end = host + first;
    if (digits == end || end - digits > 5 || *digits == '0')
        return -1;
    int value = 0;
    for (const char *d = digits; d < end; d++) {
        if (!isdigit ((unsigned char) *d))
            return -1;
        value = value * 10 + (*d - '0');
    }
    if (value < 1 || value > 65535)
        return -1;
    memcpy (label, host, (size_t) (dash - host));
    label[dash - host] = 0;
    *port = value;
    return 0;
}

//  --------------------------------------------------------------------------
//  Construction

static bool s_claim (gw_request_t *req, void *arg)
{
    return gw_proxy_handle ((gw_proxy_t *) arg, req);
}

gw_proxy_t *gw_proxy_new (gw_ctx_t *ctx)
{
    assert (ctx);
    gw_proxy_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    sbx_config_t *config = ctx->config;
    self->config = config;
    self->loop = ctx->loop;
    self->peer = ctx->peer;
    self->auth = ctx->auth;
    self->box_domain = config ? sbx_urls_box_domain (config) : strdup ("box.localhost");
    self->box = gw_box_new (ctx);
    self->cache = zhashx_new ();
    self->conns = zlistx_new ();
    //  A guest port's host: every path belongs to the guest, so it is asked first.
    if (!self->box_domain || !self->box || !self->cache || !self->conns ||
        gw_router_claim (ctx->router, s_claim, self)) {
        gw_proxy_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->cache, s_cache_destructor);
    return self;
}

void gw_proxy_destroy (gw_proxy_t **self_p)
{
    gw_proxy_t *self = *self_p;
    if (!self)
        return;
    //  Checks in flight are the shared auth's: it is destroyed after, without calling back.
    s_conn_t *c;
    while (self->conns && (c = zlistx_first (self->conns))) {
        c->auth_pending = false;
        s_free (c);
    }
    zlistx_destroy (&self->conns);
    zhashx_destroy (&self->cache);
    gw_box_destroy (&self->box);
    sbx_dqproxy_destroy (&self->relay);
    free (self->box_domain);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Self-test: host parsing (the proxying itself is tested end to end in
//  tests/integration/test_ports.py, with real guests).

void gw_proxy_test (bool verbose)
{
    (void) verbose;
    char label[64];
    int port = 0;
    assert (gw_proxy_parse_host ("quiet-brisk-jay-8000.box.example.com", "box.example.com", label,
                                 sizeof label, &port) == 0);
    assert (streq (label, "quiet-brisk-jay") && port == 8000);
    assert (gw_proxy_parse_host ("a-1.box.localhost", "box.localhost", label, sizeof label,
                                 &port) == 0);
    assert (streq (label, "a") && port == 1);
    assert (gw_proxy_parse_host ("a-65535.box.localhost", "box.localhost", label, sizeof label,
                                 &port) == 0 &&
            port == 65535);
    const char *bad[] = {"quiet-brisk-jay.box.example.com", //  the sandbox's own URL
                         "quiet-brisk-jay-65536.box.example.com",
                         "quiet-brisk-jay-0.box.example.com",
                         "quiet-brisk-jay-080.box.example.com",
                         "-8000.box.example.com",
                         "x.quiet-jay-8000.box.example.com",
                         "quiet_jay-8000.box.example.com",
                         "quiet-jay-8000.box.example.org",
                         "quiet-jay-8000.box.example.com.evil.org",
                         "box.example.com",
                         ".box.example.com",
                         "example.com",
                         "",
                         NULL};
    for (const char **h = bad; *h; h++)
        assert (gw_proxy_parse_host (*h, "box.example.com", label, sizeof label, &port) == -1);
    char small[4];
    assert (gw_proxy_parse_host ("abcd-80.box.example.com", "box.example.com", small, sizeof small,
                                 &port) == -1);
    //  A box_domain of its own: hosts under it, not under box.<domain>.
    assert (gw_proxy_parse_host ("quiet-jay-8000.sbx-box.example.net", "sbx-box.example.net", label,
                                 sizeof label, &port) == 0);
    assert (streq (label, "quiet-jay") && port == 8000);
    assert (gw_proxy_parse_host ("quiet-jay-8000.box.example.com", "sbx-box.example.net", label,
                                 sizeof label, &port) == -1);
    assert (gw_proxy_parse_host ("quiet-jay-8000.xsbx-box.example.net", "sbx-box.example.net",
                                 label, sizeof label, &port) == -1);

    //  Guest cookies stay on the guest's host; the gateway's cookies never reach a guest.
    const char *set_cookies[][2] = {
        {"sbx_csrf=x; Domain=example.com; Path=/oauth/authorize",
         "sbx_csrf=x; Path=/oauth/authorize"},
        {"a=1;domain=.example.com;Secure", "a=1;Secure"},
        {"a=1; DOMAIN = example.com; HttpOnly; domain=x", "a=1; HttpOnly"},
        {"a=1; Path=/domain; domainx=1", "a=1; Path=/domain; domainx=1"},
        {"a=domain=1", "a=domain=1"},
        {"", ""}};
    for (size_t i = 0; i < sizeof set_cookies / sizeof set_cookies[0]; i++) {
        char *host_only = s_set_cookie_host_only (set_cookies[i][0]);
        assert (host_only && streq (host_only, set_cookies[i][1]));
        free (host_only);
    }
    const char *cookies[][2] = {
        {"__Host-sbx_session=s; app=1; __Host-sbx_csrf=c", "app=1"},
        {"sbx_session=old;sbx_csrf=old; x=y", "x=y"},
        {"__Host-sbx_session=s", ""},
        {"app=1; b=2", "app=1; b=2"},
        {"__host-sbx_session=s; sbx_sessionx=1", "__host-sbx_session=s; sbx_sessionx=1"},
        {";;", ""}};
    for (size_t i = 0; i < sizeof cookies / sizeof cookies[0]; i++) {
        char *for_guest = s_cookie_for_guest (cookies[i][0]);
        assert (for_guest && streq (for_guest, cookies[i][1]));
        free (for_guest);
    }
    s_buf_t out = {0};
    s_copy_header ("Authorization", "Bearer sbx_key", &out);
    s_copy_header ("authorization", "Bearer sbx_key", &out);
    s_copy_header ("Cookie", "__Host-sbx_session=s", &out);
    assert (out.size == 0);
    s_copy_header ("Cookie", "__Host-sbx_csrf=c; app=1", &out);
    s_copy_header ("Accept", "*/*", &out);
    assert (out.size == 28 && memcmp (out.data, "Cookie: app=1\r\nAccept: */*\r\n", 28) == 0);
    free (out.data);

    assert (s_has_token ("keep-alive, Upgrade", "upgrade"));
    assert (!s_has_token ("keep-alive, upgrades", "upgrade"));
    assert (s_hop ("Transfer-Encoding") && s_hop ("connection") && !s_hop ("content-type"));

    //  Chunked bodies decode across arbitrary splits.
    s_conn_t c = {.framing = F_CHUNKED, .chunk = CH_SIZE};
    const char *wire = "5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nX-T: 1\r\n\r\n";
    for (const char *p = wire; *p; p++) {
        s_buf_add (&c.from_up, p, 1);
        assert (s_decode (&c) == 0);
    }
    assert (c.chunk == CH_DONE && c.pending.size == 12);
    assert (memcmp (c.pending.data, "hello world!", 12) == 0);
    free (c.from_up.data);
    free (c.pending.data);
    s_conn_t bad_chunk = {.framing = F_CHUNKED, .chunk = CH_SIZE};
    s_buf_add (&bad_chunk.from_up, "zz\r\n", 4);
    assert (s_decode (&bad_chunk) == -1);
    free (bad_chunk.from_up.data);
}
