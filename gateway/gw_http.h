/*  gw_http - the gateway's HTTP(S) server, driven from a zloop.

    The only module that includes microhttpd.h: handlers (MCP, OAuth, REST, the port
    proxy) see gw_request_t and nothing of the library. One thread, no thread per
    request: libmicrohttpd runs in external-epoll mode, its epoll fd is a zloop poller
    and its next timeout a timerfd (a zloop poller too).

    A request reaches the handler once, with headers and the whole body. The handler
    answers now (gw_request_respond) or later: if it returns without answering, the
    connection is suspended and nothing blocks; the answer is sent when respond is
    called from the loop, e.g. when the broker's reply arrives.

    Ownership of a gw_request_t:
      - The handler is given the request; from then on the owner holds it until it
        calls gw_request_respond, gw_request_stream_end or gw_request_upgrade_close
        (success or failure: after that call the pointer is no longer the owner's),
        or until the closed callback has been called (client gone, connection error,
        server destroyed): the request is freed when that callback returns.
      - So an owner that defers keeps either the pointer and clears it in its closed
        callback, or keeps gw_request_id and finds the request again with
        gw_http_request, which returns NULL once the request is gone. A late broker
        reply for a vanished client then finds nothing, never a freed request.
      - A suspended request never times out in libmicrohttpd: its owner must answer
        by its own deadline (e.g. 504). A client that disconnects is noticed at once.
    All calls are made from the loop's thread.
*/
#ifndef GW_HTTP_H_INCLUDED
#define GW_HTTP_H_INCLUDED

#include <czmq.h>

typedef struct gw_http_t gw_http_t;
typedef struct gw_request_t gw_request_t;

typedef struct {
    //  "HOST:PORT": "0.0.0.0:443", "127.0.0.1:0" (0 = any free port, see gw_http_port),
    //  "[::1]:8443", "[::]:443" (IPv6 only), "localhost:8080" (means 127.0.0.1).
    const char *listen;
    //  TLS certificate (chain) and private key, PEM files. Both NULL serves plain HTTP,
    //  which must also be asked for with `plain`, so a config slip can't drop TLS.
    const char *cert_file;
    const char *key_file;
    bool plain;
    //  Limits; 0 takes the default.
    size_t max_body;          //  16 MiB; larger bodies get 413 and never reach the handler
    unsigned timeout_s;       //  60: idle or stalled connections are closed
    unsigned max_connections; //  1024
    size_t memory_limit;      //  64 KiB per connection (request line + headers must fit)
    size_t stream_buffer;     //  1 MiB per streaming response, see gw_request_stream_write
    //  Deadlines against slow clients (slowloris), which the idle timeout above cannot
    //  catch: it starts again with every byte. 0 takes the default.
    //  The request line and headers must be complete within header_timeout_ms of the
    //  connection's accept, or of the end of the previous response on it (so it also
    //  bounds how long a kept-alive connection may idle): 30 s.
    unsigned header_timeout_ms;
    //  A body must grow by at least 1 KiB (or end) in every body_timeout_ms; a body over
    //  max_body is read and dropped, so its 413 can be sent, for at most this long: 30 s.
    unsigned body_timeout_ms;
    //  Count this server's responses in sbx_http_responses_total (the metrics listener's
    //  own are not counted).
    bool count_responses;
} gw_http_options_t;

//  Before the handler, the server answers by itself: 413 too_large for a body over
//  max_body (declared, or found out while a chunked one arrives: read to its end and
//  dropped), 501 not_implemented for a Transfer-Encoding other than chunked, 400
//  invalid_argument for Transfer-Encoding with Content-Length (a smuggling shape); a
//  client too slow for the deadlines above is disconnected.

//  Called once per request, from the loop, with the complete request.
typedef void (gw_http_handler_fn) (gw_request_t *req, void *arg);

//  Called when a request ends while its owner still holds it. The request is freed
//  when this returns; the owner must drop every reference to it.
typedef void (gw_request_closed_fn) (gw_request_t *req, void *arg);

//  Called when a streaming response's buffer is half empty again after a write was
//  refused: the owner may write again (backpressure for the port proxy).
typedef void (gw_request_drain_fn) (gw_request_t *req, void *arg);

//  Called once the 101 response is sent: fd is the connection's socket, non-blocking
//  (for HTTPS, one end of a socketpair that the server encrypts and forwards). extra
//  holds bytes the client sent after its request, already read from the socket. The
//  owner reads and writes fd from its own loop poller (send with MSG_NOSIGNAL) and
//  never closes it: it calls gw_request_upgrade_close when done, e.g. on EOF, which it
//  reads when the client leaves (over HTTPS too).
typedef void (gw_http_upgrade_fn) (gw_request_t *req, int fd, const void *extra, size_t extra_size,
                                   void *arg);

//  Starts serving on the loop: binds, listens, adds two fd pollers to the loop
//  (libmicrohttpd's epoll fd; ours, holding a timerfd and the hang-up watch).
//  Returns NULL (and logs why) if the address, the TLS files or the options are bad.
gw_http_t *gw_http_new (zloop_t *loop, const gw_http_options_t *options,
                        gw_http_handler_fn *handler, void *arg);

//  Stops serving: open requests still held get their closed callback, connections are
//  closed, the pollers leave the loop. Not from inside one of this module's callbacks.
void gw_http_destroy (gw_http_t **self_p);

//  The port listened on (the chosen one when the options said port 0).
int gw_http_port (gw_http_t *self);

//  How many requests the server holds now (received and not yet completed).
size_t gw_http_requests (gw_http_t *self);

//  The live request with this id still held by its owner, or NULL once answered or gone.
gw_request_t *gw_http_request (gw_http_t *self, uint64_t id);

//  --- The request, as the handler sees it. Strings are borrowed and valid as long as
//  --- the request is.

//  Unique within the process, for logs ("rid=%llu") and gw_http_request.
uint64_t gw_request_id (gw_request_t *req);

//  "GET", "POST"...
const char *gw_request_method (gw_request_t *req);

//  The path, percent-decoded, without the query: "/v1/sandboxes".
const char *gw_request_path (gw_request_t *req);

//  The request target exactly as sent, path and query: "/a%2Fb?x=1" (for proxying).
const char *gw_request_target (gw_request_t *req);

//  The query string as sent, without '?', or "" when there is none.
const char *gw_request_query_string (gw_request_t *req);

//  The decoded value of the first query parameter with that (case-sensitive) name,
//  "" for "?flag", or NULL when absent.
const char *gw_request_query (gw_request_t *req, const char *name);

//  The value of a request header, name matched case-insensitively, or NULL.
const char *gw_request_header (gw_request_t *req, const char *name);

//  Calls fn for every request header, in the order received (for proxying).
typedef void (gw_request_header_fn) (const char *name, const char *value, void *arg);
void gw_request_headers (gw_request_t *req, gw_request_header_fn *fn, void *arg);

//  The Host header in lower case, without the port and IPv6 brackets, or "" if none.
const char *gw_request_host (gw_request_t *req);

//  The body, fully received before the handler is called. Always followed by a NUL
//  byte not counted in the size, so text parsers can take it as a string.
const byte *gw_request_body (gw_request_t *req);
size_t gw_request_body_size (gw_request_t *req);

//  Takes the body (malloc'd, NUL after it; NULL when there was none): the request's is
//  empty from then on. A 10 MiB PUT goes to its transfer without another copy.
byte *gw_request_body_take (gw_request_t *req, size_t *size_p);

//  The client's address: "203.0.113.7" or "2001:db8::1".
const char *gw_request_peer (gw_request_t *req);

//  True when the request came over HTTPS.
bool gw_request_tls (gw_request_t *req);

//  --- Answering.

//  Sets the callback told when the request ends while still held (see above).
void gw_request_set_closed_fn (gw_request_t *req, gw_request_closed_fn *fn, void *arg);

//  Adds a response header, sent by the next respond, stream_start or upgrade.
//  Content-Length and Transfer-Encoding are the server's own and are refused, as are
//  empty values (libmicrohttpd drops them) and names or values that could split the
//  header. Returns 0 or -1.
int gw_request_add_header (gw_request_t *req, const char *name, const char *value);

//  Answers the request with a complete body (copied; content_type may be NULL) and
//  releases it. Returns -1 when the request was already answered or is gone.
int gw_request_respond (gw_request_t *req, int status, const char *content_type, const void *body,
                        size_t size);

//  The same with a body it takes (malloc'd; *body_p set to NULL, freed by the server once
//  sent or on failure): a large body (a file, a 10 MiB tool result) is not copied again.
int gw_request_respond_take (gw_request_t *req, int status, const char *content_type, void **body_p,
                             size_t size);

//  Starts a response whose body follows in pieces (chunked), e.g. Server-Sent Events.
//  The owner keeps the request until gw_request_stream_end, even when this fails
//  (-1: already answered, or the client is gone and the closed callback follows).
int gw_request_stream_start (gw_request_t *req, int status, const char *content_type);

//  The same with the body's length said (Content-Length, not chunked): the owner writes
//  exactly size bytes, or ends with gw_request_stream_fail.
int gw_request_stream_start_sized (gw_request_t *req, int status, const char *content_type,
                                   uint64_t size);

//  Queues a piece of the body (copied). Returns -1 and queues nothing when it does not
//  fit in the buffer (see gw_request_stream_space; wait for the drain callback) or the
//  client is gone (the closed callback follows). Returns 0 when queued.
int gw_request_stream_write (gw_request_t *req, const void *data, size_t size);

//  Free room in the stream buffer, in bytes (0 when not streaming or gone).
size_t gw_request_stream_space (gw_request_t *req);

//  Sets the callback told when a refused write may be retried.
void gw_request_set_drain_fn (gw_request_t *req, gw_request_drain_fn *fn, void *arg);

//  Ends a started body that cannot be completed (what was to follow failed): the
//  connection is closed, so the client sees the body cut short, never a complete one;
//  releases the request as gw_request_stream_end does.
int gw_request_stream_fail (gw_request_t *req);

//  Ends the body once the buffer is sent, and releases the request. Returns -1 if the
//  stream was not started or was already cut.
int gw_request_stream_end (gw_request_t *req);

//  Switches protocols (WebSocket and the like): answers 101 with "Connection: Upgrade",
//  "Upgrade: <protocol>" and the headers added before, then hands the socket to fn.
//  The owner keeps the request until gw_request_upgrade_close. Returns 0 or -1 (e.g.
//  an HTTP/1.0 client).
int gw_request_upgrade (gw_request_t *req, const char *protocol, gw_http_upgrade_fn *fn, void *arg);

//  The owner is done with the upgraded socket: the server closes it and releases the
//  request. Returns -1 if the request was not upgraded (yet).
int gw_request_upgrade_close (gw_request_t *req);

void gw_http_test (bool verbose);

#endif
