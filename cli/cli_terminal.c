/*  cli_terminal - see cli_terminal.h */
#include "cli_terminal.h"
#include "cli_call.h"
#include "cli_http.h"
#include "sbx_ws.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#define S_LOCAL_WAIT_MS 50          //  on the host: how long one output poll may wait
#define S_HANDSHAKE_S   30          //  for the 101
#define S_KEYS_MAX      (64 * 1024) //  keystrokes read at once

static volatile sig_atomic_t s_resized;
static volatile sig_atomic_t s_stop; //  the signal that asks us to end, or 0

static void s_on_winch (int sig)
{
    (void) sig;
    s_resized = 1;
}

static void s_on_stop (int sig)
{
    s_stop = sig;
}

//  Our terminal while the guest's runs: raw, and the signals that matter caught.
typedef struct {
    bool raw;
    struct termios saved;
    struct sigaction old_winch, old_int, old_term, old_hup;
} s_local_t;

static void s_local_enter (s_local_t *l)
{
    zsys_handler_set (NULL); //  ours, not czmq's
    struct sigaction action = {0};
    sigemptyset (&action.sa_mask);
    action.sa_handler = s_on_winch;
    sigaction (SIGWINCH, &action, &l->old_winch);
    action.sa_handler = s_on_stop;
    sigaction (SIGINT, &action, &l->old_int); //  only when stdin is no terminal
    sigaction (SIGTERM, &action, &l->old_term);
    sigaction (SIGHUP, &action, &l->old_hup);
    s_resized = 0;
    s_stop = 0;
    if (isatty (STDIN_FILENO) && tcgetattr (STDIN_FILENO, &l->saved) == 0) {
        struct termios raw = l->saved;
        cfmakeraw (&raw);
        l->raw = tcsetattr (STDIN_FILENO, TCSANOW, &raw) == 0;
    }
}

static void s_local_leave (s_local_t *l)
{
    if (l->raw)
        tcsetattr (STDIN_FILENO, TCSANOW, &l->saved);
    l->raw = false;
    sigaction (SIGWINCH, &l->old_winch, NULL);
    sigaction (SIGINT, &l->old_int, NULL);
    sigaction (SIGTERM, &l->old_term, NULL);
    sigaction (SIGHUP, &l->old_hup, NULL);
}

//  Our window's size, or 80x24 when there is no terminal to ask.
static void s_window (unsigned *cols, unsigned *rows)
{
    struct winsize ws = {0};
    if ((ioctl (STDIN_FILENO, TIOCGWINSZ, &ws) == 0 ||
         ioctl (STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) &&
        ws.ws_col && ws.ws_row) {
        *cols = ws.ws_col > 1000 ? 1000 : ws.ws_col;
        *rows = ws.ws_row > 1000 ? 1000 : ws.ws_row;
    } else {
        *cols = 80;
        *rows = 24;
    }
}

static void s_write_all (int fd, const void *data, size_t size)
{
    const uint8_t *p = data;
    while (size) {
        ssize_t n = write (fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        p += n;
        size -= (size_t) n;
    }
}

//  A message for the person, on a terminal in raw mode too.
static void s_say (s_local_t *l, const char *text)
{
    char line[1200];
    snprintf (line, sizeof line, "%ssbx: %s%s", l->raw ? "\r\n" : "", text, l->raw ? "\r\n" : "\n");
    s_write_all (STDERR_FILENO, line, strlen (line));
}

//  --------------------------------------------------------------------------
//  Remote: the service's WebSocket

char *cli_terminal_handshake (const char *url, const char *target, const char *auth,
                              const char *key)
{
    const char *host = strncmp (url, "https://", 8) == 0  ? url + 8
                       : strncmp (url, "http://", 7) == 0 ? url + 7
                                                          : NULL;
    if (!host)
        return NULL;
    size_t host_len = strcspn (host, "/");
    return zsys_sprintf ("GET %s HTTP/1.1\r\nHost: %.*s\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                         "Sec-WebSocket-Version: 13\r\n%s\r\nUser-Agent: sbx-cli\r\n\r\n",
                         target, (int) host_len, host, key, auth);
}

typedef struct {
    cli_http_conn_t *conn;
    zchunk_t *out; //  frames for the service not yet sent
    sbx_ws_t *ws;
    bool sent_close;
    bool got_close;
    bool exited;
    int code;
} s_remote_t;

//  size is read after frame was made (an argument's order of evaluation is not fixed).
static void s_remote_queue (s_remote_t *r, uint8_t *frame, const size_t *size)
{
    if (frame)
        zchunk_extend (r->out, frame, *size);
    free (frame);
}

//  Sends what the socket takes now. -1 when the connection failed.
static int s_remote_flush (s_remote_t *r)
{
    size_t size = zchunk_size (r->out), sent = 0;
    while (sent < size) {
        long n = cli_http_conn_send (r->conn, zchunk_data (r->out) + sent, size - sent);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        sent += (size_t) n;
    }
    if (sent) {
        zchunk_t *rest = zchunk_new (zchunk_data (r->out) + sent, size - sent);
        zchunk_destroy (&r->out);
        r->out = rest;
    }
    return 0;
}

//  Sends all of it, waiting for the socket (the handshake). -1 when it failed.
static int s_remote_send_all (s_remote_t *r, int timeout_ms)
{
    int64_t deadline = zclock_mono () + timeout_ms;
    while (zchunk_size (r->out)) {
        if (s_remote_flush (r))
            return -1;
        if (!zchunk_size (r->out))
            break;
        struct pollfd p = {cli_http_conn_fd (r->conn), POLLOUT, 0};
        int left = (int) (deadline - zclock_mono ());
        if (left <= 0 || poll (&p, 1, left) < 0)
            return -1;
    }
    return 0;
}

//  The 101, or what the service said instead. 0 with the bytes after the headers fed to
//  the parser; else the exit code, said.
static int s_remote_upgrade (s_remote_t *r, s_local_t *l, const char *key)
{
    char accept[SBX_WS_ACCEPT_SIZE];
    sbx_ws_accept (key, accept);
    //  The answer so far, NUL-terminated for searching.
    size_t len = 0, cap = 8192;
    char *text = malloc (cap + 1);
    if (!text)
        return 1;
    text[0] = 0;
    int64_t deadline = zclock_mono () + S_HANDSHAKE_S * 1000;
    char *end = NULL;
    bool eof = false;
    //  Headers first; for an error answer, its body too (Content-Length).
    while (!eof) {
        if (len == cap) {
            char *grown = cap < (1 << 20) ? realloc (text, cap * 2 + 1) : NULL;
            if (!grown)
                break;
            text = grown;
            cap *= 2;
        }
        long n = cli_http_conn_recv (r->conn, text + len, cap - len);
        if (n > 0) {
            len += (size_t) n;
            text[len] = 0;
        } else if (n < 0)
            eof = true;
        end = strstr (text, "\r\n\r\n");
        if (end) {
            size_t head = (size_t) (end + 4 - text);
            if (strncmp (text, "HTTP/1.1 101", 12) == 0)
                break;
            const char *cl = strcasestr (text, "\r\ncontent-length:");
            size_t want = cl && cl < end ? (size_t) strtoul (cl + 17, NULL, 10) : 0;
            if (len >= head + want)
                break;
        }
        if (n == 0) {
            struct pollfd p = {cli_http_conn_fd (r->conn), POLLIN, 0};
            int left = (int) (deadline - zclock_mono ());
            if (left <= 0) {
                s_say (l, "the service did not answer the terminal's handshake in time "
                          "(unavailable)");
                free (text);
                return 3;
            }
            poll (&p, 1, left);
        }
    }
    if (!end) {
        s_say (l, "the service closed the connection before answering (unavailable)");
        free (text);
        return 3;
    }
    *end = 0;
    size_t head = (size_t) (end + 4 - text);
    int rc = 0;
    if (strncmp (text, "HTTP/1.1 101", 12) != 0) {
        //  A JSON error, as every REST error: its code and message.
        json_t *body = json_loadb (text + head, len - head, 0, NULL);
        json_t *error = json_object_get (body, "error");
        sbx_err_t err = {.code = SBX_E_INTERNAL};
        const char *code = json_string_value (json_object_get (error, "code"));
        if (!code || sbx_code_from_name (code, &err.code))
            err.code = SBX_E_INTERNAL;
        const char *message = json_string_value (json_object_get (error, "message"));
        if (message)
            snprintf (err.message, sizeof err.message, "%s", message);
        else
            snprintf (err.message, sizeof err.message, "the service answered %d, not 101",
                      len > 12 ? atoi (text + 9) : 0);
        json_decref (body);
        free (text);
        s_local_leave (l);
        return cli_fail (&err);
    }
    const char *got = strcasestr (text, "\r\nsec-websocket-accept:");
    if (got) {
        got += 23;
        got += strspn (got, " \t");
    }
    if (!got || strncmp (got, accept, strlen (accept)) != 0) {
        s_say (l, "the service's WebSocket answer has a wrong Sec-WebSocket-Accept (internal)");
        rc = 1;
    } else if (len > head)
        sbx_ws_feed (r->ws, text + head, len - head);
    free (text);
    return rc;
}

static void s_remote_resize (s_remote_t *r)
{
    unsigned cols, rows;
    s_window (&cols, &rows);
    char text[80];
    snprintf (text, sizeof text, "{\"type\":\"resize\",\"cols\":%u,\"rows\":%u}", cols, rows);
    size_t fsize = 0;
    s_remote_queue (r, sbx_ws_frame (SBX_WS_TEXT, text, strlen (text), true, &fsize), &fsize);
}

static void s_remote_close (s_remote_t *r, uint16_t code)
{
    if (r->sent_close)
        return;
    size_t fsize = 0;
    s_remote_queue (r, sbx_ws_close_frame (code, NULL, true, &fsize), &fsize);
    r->sent_close = true;
}

//  The service's messages the parser holds. -1 when it broke the protocol.
static int s_remote_messages (s_remote_t *r, s_local_t *l)
{
    sbx_ws_op_t op;
    const uint8_t *data;
    size_t size;
    uint16_t code;
    char why[200];
    int rc;
    while ((rc = sbx_ws_next (r->ws, &op, &data, &size, &code, why, sizeof why)) != 0) {
        if (rc < 0) {
            char text[300];
            snprintf (text, sizeof text, "the service broke the WebSocket protocol: %s", why);
            s_say (l, text);
            s_remote_close (r, code);
            return -1;
        }
        if (op == SBX_WS_BINARY)
            s_write_all (STDOUT_FILENO, data, size);
        else if (op == SBX_WS_TEXT) {
            json_t *m = json_loadb ((const char *) data, size, 0, NULL);
            const char *type = json_string_value (json_object_get (m, "type"));
            if (type && streq (type, "exit")) {
                r->exited = true;
                r->code = (int) (json_integer_value (json_object_get (m, "exitCode")) & 0xff);
            } else if (type && streq (type, "error")) {
                json_t *error = json_object_get (m, "error");
                char text[1100];
                snprintf (text, sizeof text, "%s (%s)",
                          json_string_value (json_object_get (error, "message"))
                              ? json_string_value (json_object_get (error, "message"))
                              : "?",
                          json_string_value (json_object_get (error, "code"))
                              ? json_string_value (json_object_get (error, "code"))
                              : "internal");
                s_say (l, text);
            }
            json_decref (m);
        } else if (op == SBX_WS_PING) {
            size_t fsize = 0;
            s_remote_queue (r, sbx_ws_frame (SBX_WS_PONG, data, size, true, &fsize), &fsize);
        } else if (op == SBX_WS_CLOSE) {
            r->got_close = true;
            s_remote_close (r, SBX_WS_CLOSE_NORMAL);
            return 0;
        }
    }
    return 0;
}

static int s_remote (cli_where_t *w, cli_op_t *op, s_local_t *l)
{
    char *target = cli_rest_target (SBX_OP_OPEN_TERMINAL, cli_op_args (op));
    char key[SBX_WS_KEY_SIZE];
    sbx_ws_key_new (key);
    //  cli_rest_target says "GET /v1/…": the URL is the service's and the path.
    const char *path = target ? strchr (target, ' ') : NULL;
    char *url = path ? zsys_sprintf ("%s%s", cli_rest_url (w->rest), path + 1) : NULL;
    char *hello = path ? cli_terminal_handshake (cli_rest_url (w->rest), path + 1,
                                                 cli_rest_auth (w->rest), key)
                       : NULL;
    char why[1200];
    s_remote_t r = {0};
    r.out = zchunk_new (NULL, 0);
    r.ws = sbx_ws_new (false, 16 << 20);
    int rc = -1;
    if (!hello) {
        s_say (l, "the service's URL is not http(s)");
        rc = 2;
    } else if (!(r.conn =
                     cli_http_connect (url, cli_rest_ca_cert (w->rest), 15, why, sizeof why))) {
        s_say (l, why);
        rc = 3;
    } else {
        zchunk_extend (r.out, hello, strlen (hello));
        if (s_remote_send_all (&r, S_HANDSHAKE_S * 1000)) {
            s_say (l, "the connection failed while sending the handshake (unavailable)");
            rc = 3;
        } else
            rc = s_remote_upgrade (&r, l, key);
    }
    free (target);
    free (url);
    if (hello) {
        memset (hello, 0, strlen (hello)); //  it holds the key
        free (hello);
    }
    if (rc) {
        s_local_leave (l);
        cli_http_conn_destroy (&r.conn);
        zchunk_destroy (&r.out);
        sbx_ws_destroy (&r.ws);
        return rc;
    }
    //  Open: keys and sizes out, the terminal's bytes in, until the close.
    bool stdin_open = true, broken = false;
    s_remote_messages (&r, l);
    while (!r.got_close && !broken) {
        if (s_resized) {
            s_resized = 0;
            s_remote_resize (&r);
        }
        if (s_stop) {
            s_remote_close (&r, SBX_WS_CLOSE_GOING_AWAY);
            s_stop = 0;
        }
        if (s_remote_flush (&r)) {
            broken = true;
            break;
        }
        struct pollfd p[2] = {{cli_http_conn_fd (r.conn), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
        if (zchunk_size (r.out))
            p[0].events |= POLLOUT;
        bool keys = stdin_open && !r.sent_close && zchunk_size (r.out) < (1 << 20);
        int n = poll (p, keys ? 2 : 1, 1000);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 && (p[0].revents & (POLLIN | POLLERR | POLLHUP))) {
            char buf[16384];
            long got;
            //  Until none is left, TLS's own buffer included.
            while ((got = cli_http_conn_recv (r.conn, buf, sizeof buf)) > 0) {
                sbx_ws_feed (r.ws, buf, (size_t) got);
                if (s_remote_messages (&r, l) < 0)
                    break;
            }
            if (got < 0)
                broken = true;
        }
        if (keys && n > 0 && (p[1].revents & (POLLIN | POLLHUP))) {
            uint8_t buf[S_KEYS_MAX];
            ssize_t got = read (STDIN_FILENO, buf, sizeof buf);
            if (got > 0) {
                size_t fsize = 0;
                s_remote_queue (&r, sbx_ws_frame (SBX_WS_BINARY, buf, (size_t) got, true, &fsize),
                                &fsize);
            } else if (got == 0 || errno != EINTR)
                stdin_open = false; //  a pipe that ended: the command goes on
        }
    }
    s_remote_flush (&r);
    s_local_leave (l);
    if (r.exited)
        rc = r.code;
    else if (s_stop || r.sent_close)
        rc = 130;
    else {
        fprintf (stderr, "sbx: the connection closed before the command ended (unavailable)\n");
        rc = 3;
    }
    cli_http_conn_destroy (&r.conn);
    zchunk_destroy (&r.out);
    sbx_ws_destroy (&r.ws);
    return rc;
}

//  --------------------------------------------------------------------------
//  Local: the broker's agent requests, polled

static int s_local (cli_where_t *w, cli_op_t *op, s_local_t *l)
{
    const char *sandbox_id = sbx_api_sandbox_id (cli_op_args (op));
    sbx_err_t err;
    sbx_msg_t *request = cli_op_request (op);
    if (!request) {
        s_local_leave (l);
        return 2;
    }
    sbx_msg_t *reply = cli_op_call (op, w->config, NULL, &request, &err);
    if (!reply) {
        s_local_leave (l);
        return cli_fail (&err);
    }
    uint64_t pid = sbx_msg_agent_exec_ok (reply)->pid, offset = 0;
    sbx_msg_destroy (&reply);
    zchunk_t *keys = zchunk_new (NULL, 0);
    bool stdin_open = true;
    int rc = -1;
    while (rc < 0 && !s_stop) {
        if (s_resized) {
            s_resized = 0;
            unsigned cols, rows;
            s_window (&cols, &rows);
            sbx_msg_t *resize = sbx_msg_new (SBX_MSG_AGENT_RESIZE);
            sbx_msg_agent_resize (resize)->pid = pid;
            sbx_msg_agent_resize (resize)->cols = cols;
            sbx_msg_agent_resize (resize)->rows = rows;
            reply = cli_op_agent (w->config, sandbox_id, &resize, 10000, &err);
            sbx_msg_destroy (&reply);
        }
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        if (stdin_open && zchunk_size (keys) < (1 << 20) && poll (&p, 1, 0) > 0) {
            uint8_t buf[S_KEYS_MAX];
            ssize_t got = read (STDIN_FILENO, buf, sizeof buf);
            if (got > 0)
                zchunk_extend (keys, buf, (size_t) got);
            else if (got == 0 || errno != EINTR)
                stdin_open = false;
        }
        if (zchunk_size (keys)) {
            sbx_msg_t *input = sbx_msg_new (SBX_MSG_AGENT_INPUT);
            size_t size = zchunk_size (keys) < S_KEYS_MAX ? zchunk_size (keys) : S_KEYS_MAX;
            sbx_msg_agent_input (input)->pid = pid;
            sbx_bytes_set (&sbx_msg_agent_input (input)->data, zchunk_data (keys), size);
            reply = cli_op_agent (w->config, sandbox_id, &input, 10000, &err);
            //  Refused (the process ended): the exit comes with the output next.
            size_t taken = reply ? (size_t) sbx_msg_agent_input_ok (reply)->written : size;
            sbx_msg_destroy (&reply);
            zchunk_t *rest = zchunk_new (zchunk_data (keys) + taken, zchunk_size (keys) - taken);
            zchunk_destroy (&keys);
            keys = rest;
        }
        sbx_msg_t *status = sbx_msg_new (SBX_MSG_AGENT_STATUS);
        sbx_agent_status_t *m = sbx_msg_agent_status (status);
        m->pid = pid;
        m->stdout_offset = offset;
        m->max_bytes = 64 * 1024;
        m->wait_ms = zchunk_size (keys) ? 0 : S_LOCAL_WAIT_MS;
        reply = cli_op_agent (w->config, sandbox_id, &status, 30000, &err);
        if (!reply) {
            s_local_leave (l);
            rc = cli_fail (&err);
            break;
        }
        sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
        if (ok->stdout.size)
            s_write_all (STDOUT_FILENO, ok->stdout.data, ok->stdout.size);
        offset = ok->stdout_next_offset;
        if (!ok->running && !ok->stdout_more)
            rc = (int) (ok->exit_code & 0xff);
        sbx_msg_destroy (&reply);
    }
    if (rc < 0) {
        //  Asked to stop: the guest's command goes, as with a hangup.
        sbx_msg_t *kill = sbx_msg_new (SBX_MSG_AGENT_KILL);
        sbx_msg_agent_kill (kill)->pid = pid;
        sbx_msg_agent_kill (kill)->signal = SIGKILL;
        reply = cli_op_agent (w->config, sandbox_id, &kill, 10000, &err);
        sbx_msg_destroy (&reply);
        rc = 128 + (s_stop ? (int) s_stop : SIGTERM);
    }
    zchunk_destroy (&keys);
    s_local_leave (l);
    return rc;
}

int cli_terminal_run (cli_where_t *w, cli_op_t *op)
{
    unsigned cols, rows;
    s_window (&cols, &rows);
    cli_op_set (op, "cols", json_integer (cols));
    cli_op_set (op, "rows", json_integer (rows));
    s_local_t l = {0};
    s_local_enter (&l);
    return w->rest ? s_remote (w, op, &l) : s_local (w, op, &l);
}

void cli_terminal_test (bool verbose)
{
    (void) verbose;
    char *hello =
        cli_terminal_handshake ("https://sbx.example:8443", "/v1/sandboxes/sb_1/terminal?cols=80",
                                "Authorization: Bearer sbx_k", "dGhlIHNhbXBsZSBub25jZQ==");
    assert (hello);
    assert (strncmp (hello, "GET /v1/sandboxes/sb_1/terminal?cols=80 HTTP/1.1\r\n", 50) == 0);
    assert (strstr (hello, "\r\nHost: sbx.example:8443\r\n"));
    assert (strstr (hello, "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"));
    assert (strstr (hello, "\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"));
    assert (strstr (hello, "\r\nAuthorization: Bearer sbx_k\r\n"));
    assert (strlen (hello) > 4 && streq (hello + strlen (hello) - 4, "\r\n\r\n"));
    free (hello);
    hello = cli_terminal_handshake ("http://127.0.0.1:9/", "/x", "Authorization: Bearer k", "k");
    assert (hello && strstr (hello, "\r\nHost: 127.0.0.1:9\r\n"));
    free (hello);
    assert (!cli_terminal_handshake ("ftp://x", "/x", "A: b", "k"));
    unsigned cols = 0, rows = 0;
    s_window (&cols, &rows);
    assert (cols >= 1 && cols <= 1000 && rows >= 1 && rows <= 1000);
}
