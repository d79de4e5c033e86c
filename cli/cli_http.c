/*  cli_http - HTTP(S) requests with libcurl (see cli_http.h). */
#include "cli_http.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct cli_http_t {
    CURL *curl;
    char *ca_cert;
    volatile sig_atomic_t *abort_flag;
};

typedef struct {
    cli_http_t *self;
    cli_http_answer_t *answer;
    cli_http_sink_fn *sink;
    void *sink_arg;
    size_t capacity;
} s_transfer_t;

cli_http_t *cli_http_new (const char *ca_cert)
{
    //  Once per process; the CLI has no other threads that could race it.
    static bool initialised = false;
    if (!initialised) {
        if (curl_global_init (CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return NULL;
        initialised = true;
    }
    cli_http_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->curl = curl_easy_init ();
    self->ca_cert = ca_cert ? strdup (ca_cert) : NULL;
    if (!self->curl || (ca_cert && !self->ca_cert)) {
        cli_http_destroy (&self);
        return NULL;
    }
    return self;
}

void cli_http_destroy (cli_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    cli_http_t *self = *self_p;
    if (self->curl)
        curl_easy_cleanup (self->curl);
    free (self->ca_cert);
    free (self);
    *self_p = NULL;
}

void cli_http_set_abort (cli_http_t *self, volatile sig_atomic_t *flag)
{
    self->abort_flag = flag;
}

static size_t s_on_body (char *data, size_t size, size_t count, void *arg)
{
    s_transfer_t *t = arg;
    size_t n = size * count;
    cli_http_answer_t *a = t->answer;
    if (a->size + n + 1 > t->capacity) {
        size_t capacity = t->capacity ? t->capacity : 4096;
        while (capacity < a->size + n + 1)
            capacity *= 2;
        char *grown = realloc (a->body, capacity);
        if (!grown)
            return 0; //  curl then fails the transfer (CURLE_WRITE_ERROR)
        a->body = grown;
        t->capacity = capacity;
    }
    memcpy (a->body + a->size, data, n);
    a->size += n;
    a->body[a->size] = 0;
    if (t->sink) {
        char *type = NULL;
        curl_easy_getinfo (t->self->curl, CURLINFO_CONTENT_TYPE, &type);
        t->sink (t->sink_arg, type ? type : "", data, n);
    }
    return n;
}

static size_t s_on_header (char *data, size_t size, size_t count, void *arg)
{
    s_transfer_t *t = arg;
    size_t n = size * count;
    static const char name[] = "mcp-session-id:";
    if (n > sizeof name - 1 && strncasecmp (data, name, sizeof name - 1) == 0) {
        const char *value = data + sizeof name - 1;
        size_t length = n - (sizeof name - 1);
        while (length && (*value == ' ' || *value == '\t'))
            value++, length--;
        while (length &&
               (value[length - 1] == '\r' || value[length - 1] == '\n' || value[length - 1] == ' '))
            length--;
        free (t->answer->session_id);
        t->answer->session_id = strndup (value, length);
    }
    return n;
}

static int s_on_progress (void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void) a, (void) b, (void) c, (void) d;
    s_transfer_t *t = arg;
    return t->self->abort_flag && *t->self->abort_flag ? 1 : 0;
}

int cli_http_request (cli_http_t *self, const char *method, const char *url,
                      const char *const *headers, const char *body, size_t body_size,
                      long timeout_s, cli_http_sink_fn *sink, void *sink_arg,
                      cli_http_answer_t *answer, char *why, size_t why_size)
{
    memset (answer, 0, sizeof *answer);
    s_transfer_t t = {self, answer, sink, sink_arg, 0};
    CURL *curl = self->curl;
    curl_easy_reset (curl);
    struct curl_slist *list = NULL;
    for (size_t i = 0; headers && headers[i]; i++)
        list = curl_slist_append (list, headers[i]);
    //  curl would add "Expect: 100-continue" to a large POST: one round trip more.
    list = curl_slist_append (list, "Expect:");
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt (curl, CURLOPT_URL, url);
    curl_easy_setopt (curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt (curl, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt (curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt (curl, CURLOPT_CONNECTTIMEOUT, 15L);
    curl_easy_setopt (curl, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt (curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_on_body);
    curl_easy_setopt (curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt (curl, CURLOPT_HEADERFUNCTION, s_on_header);
    curl_easy_setopt (curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt (curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt (curl, CURLOPT_XFERINFOFUNCTION, s_on_progress);
    curl_easy_setopt (curl, CURLOPT_XFERINFODATA, &t);
    if (body) {
        curl_easy_setopt (curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) body_size);
    }
    if (self->ca_cert)
        curl_easy_setopt (curl, CURLOPT_CAINFO, self->ca_cert);
    CURLcode rc = curl_easy_perform (curl);
    curl_slist_free_all (list);
    if (rc != CURLE_OK) {
        snprintf (why, why_size, "cannot reach %s: %s", url,
                  rc == CURLE_ABORTED_BY_CALLBACK ? "interrupted"
                  : *error                        ? error
                                                  : curl_easy_strerror (rc));
        cli_http_answer_free (answer);
        return -1;
    }
    curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &answer->status);
    char *type = NULL;
    curl_easy_getinfo (curl, CURLINFO_CONTENT_TYPE, &type);
    answer->content_type = type ? strdup (type) : NULL;
    if (!answer->body)
        answer->body = strdup ("");
    return 0;
}

void cli_http_answer_free (cli_http_answer_t *answer)
{
    free (answer->content_type);
    free (answer->session_id);
    free (answer->body);
    memset (answer, 0, sizeof *answer);
}

//  --------------------------------------------------------------------------
//  Bare connections

struct cli_http_conn_t {
    CURL *curl;
    int fd;
};

cli_http_conn_t *cli_http_connect (const char *url, const char *ca_cert, long timeout_s, char *why,
                                   size_t why_size)
{
    cli_http_t *init = cli_http_new (NULL); //  curl_global_init, once
    cli_http_destroy (&init);
    cli_http_conn_t *self = calloc (1, sizeof *self);
    if (!self || !(self->curl = curl_easy_init ())) {
        free (self);
        snprintf (why, why_size, "out of memory");
        return NULL;
    }
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt (self->curl, CURLOPT_URL, url);
    curl_easy_setopt (self->curl, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt (self->curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt (self->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt (self->curl, CURLOPT_CONNECTTIMEOUT, timeout_s);
    curl_easy_setopt (self->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    if (ca_cert)
        curl_easy_setopt (self->curl, CURLOPT_CAINFO, ca_cert);
    CURLcode rc = curl_easy_perform (self->curl);
    curl_socket_t fd = CURL_SOCKET_BAD;
    if (rc == CURLE_OK)
        rc = curl_easy_getinfo (self->curl, CURLINFO_ACTIVESOCKET, &fd);
    if (rc != CURLE_OK || fd == CURL_SOCKET_BAD) {
        snprintf (why, why_size, "cannot reach %s: %s", url,
                  *error ? error : curl_easy_strerror (rc));
        cli_http_conn_destroy (&self);
        return NULL;
    }
    self->fd = (int) fd;
    return self;
}

void cli_http_conn_destroy (cli_http_conn_t **self_p)
{
    cli_http_conn_t *self = *self_p;
    if (!self)
        return;
    if (self->curl)
        curl_easy_cleanup (self->curl);
    free (self);
    *self_p = NULL;
}

int cli_http_conn_fd (cli_http_conn_t *self)
{
    return self->fd;
}

long cli_http_conn_send (cli_http_conn_t *self, const void *data, size_t size)
{
    size_t sent = 0;
    CURLcode rc = curl_easy_send (self->curl, data, size, &sent);
    if (rc == CURLE_AGAIN)
        return 0;
    return rc == CURLE_OK ? (long) sent : -1;
}

long cli_http_conn_recv (cli_http_conn_t *self, void *buf, size_t size)
{
    size_t got = 0;
    CURLcode rc = curl_easy_recv (self->curl, buf, size, &got);
    if (rc == CURLE_AGAIN)
        return 0;
    return rc == CURLE_OK && got > 0 ? (long) got : -1;
}
