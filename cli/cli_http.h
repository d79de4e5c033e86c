/*  cli_http - HTTP(S) requests for the CLI, the one place libcurl is used.

    One cli_http_t keeps one curl handle, so its connection (and TLS session) to the
    service is reused from request to request. Every failure is said in why as a person
    can act on it ("cannot reach URL: <curl's words>").
*/
#ifndef CLI_HTTP_H_INCLUDED
#define CLI_HTTP_H_INCLUDED

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct cli_http_t cli_http_t;

//  Called with each piece of the body as it arrives, with the answer's Content-Type (""
//  when none): an SSE answer's events can be handled before the stream ends.
typedef void (cli_http_sink_fn) (void *arg, const char *content_type, const char *data,
                                 size_t size);

typedef struct {
    long status;        //  the HTTP status
    char *content_type; //  or NULL
    char *session_id;   //  the Mcp-Session-Id header, or NULL
    char *body;         //  the whole body, NUL-terminated (also when a sink saw it)
    size_t size;
} cli_http_answer_t;

//  ca_cert: a PEM file to trust instead of the system's CAs, or NULL.
cli_http_t *cli_http_new (const char *ca_cert);
void cli_http_destroy (cli_http_t **self_p);

//  When *flag becomes nonzero, a transfer in progress is abandoned (a signal came).
void cli_http_set_abort (cli_http_t *self, volatile sig_atomic_t *flag);

//  One request. headers: NULL-terminated "Name: value" lines, or NULL. body: NULL for
//  none. timeout_s: the whole request's limit. sink: NULL, or called as the body arrives.
//  Returns 0 with *answer filled (any status), or -1 with why when no answer came.
int cli_http_request (cli_http_t *self, const char *method, const char *url,
                      const char *const *headers, const char *body, size_t body_size,
                      long timeout_s, cli_http_sink_fn *sink, void *sink_arg,
                      cli_http_answer_t *answer, char *why, size_t why_size);

//  Frees what an answer holds (the struct itself is the caller's).
void cli_http_answer_free (cli_http_answer_t *answer);

//  --- A bare connection, for a protocol that follows an HTTP Upgrade (WebSocket):
//  libcurl connects (TLS for https, verified as for requests) and the caller speaks.
typedef struct cli_http_conn_t cli_http_conn_t;

//  Connects to url's host and port. NULL with why when it cannot.
cli_http_conn_t *cli_http_connect (const char *url, const char *ca_cert, long timeout_s, char *why,
                                   size_t why_size);
void cli_http_conn_destroy (cli_http_conn_t **self_p);

//  The socket, to poll for input (the bytes may also wait in TLS's buffer: read until
//  cli_http_conn_recv says 0).
int cli_http_conn_fd (cli_http_conn_t *self);

//  Bytes sent (>0), 0 when the socket takes none now, -1 when it failed.
long cli_http_conn_send (cli_http_conn_t *self, const void *data, size_t size);

//  Bytes read (>0), 0 when none are there now, -1 at the end or when it failed.
long cli_http_conn_recv (cli_http_conn_t *self, void *buf, size_t size);

#endif
