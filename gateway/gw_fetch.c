/*  gw_fetch - see gw_fetch.h */
#include "gw_fetch.h"
#include "gw_worker.h"
#include "sbx_netaddr.h"

#include <arpa/inet.h>
#include <assert.h>
#include <curl/curl.h>
#include <sys/socket.h>

#define S_TIMEOUT_MS    5000
#define S_MAX_REDIRECTS 3

//  A fetch's context, carried through the worker (gw_worker copies it).
typedef struct {
    gw_fetch_fn *fn;
    void *arg;
} s_pending_t;

struct gw_fetch_t {
    gw_worker_t *worker;
};

typedef struct {
    bool allow_private;
    char *ca_file;
} s_worker_args_t;

typedef struct {
    zchunk_t *body;
    bool too_large;
    bool refused;
    char refused_ip[64];
    bool allow_private;
} s_transfer_t;

static size_t s_on_data (char *data, size_t size, size_t count, void *arg)
{
    s_transfer_t *t = arg;
    size_t n = size * count;
    if (zchunk_size (t->body) + n > GW_FETCH_MAX_SIZE) {
        t->too_large = true;
        return 0; //  aborts the transfer
    }
    zchunk_extend (t->body, data, n);
    return n;
}

//  Called for every socket curl opens, with the resolved address, before connecting (at
//  every hop): the place to refuse addresses nothing should be asked from.
static curl_socket_t s_open_socket (void *arg, curlsocktype purpose, struct curl_sockaddr *address)
{
    (void) purpose;
    s_transfer_t *t = arg;
    char ip[SBX_NETADDR_TEXT] = "?";
    if (!sbx_netaddr_socket_public (&address->addr, ip) && !t->allow_private) {
        t->refused = true;
        snprintf (t->refused_ip, sizeof t->refused_ip, "%s", ip);
        return CURL_SOCKET_BAD;
    }
    return socket (address->family, address->socktype, address->protocol);
}

//  In the worker: [url] in, [status, error, body] out.
static zmsg_t *s_transfer (zmsg_t *request, void *state)
{
    const s_worker_args_t *args = state;
    char *url = zmsg_popstr (request);
    s_transfer_t t = {.body = zchunk_new (NULL, 0), .allow_private = args->allow_private};
    char error[CURL_ERROR_SIZE] = "";
    char message[400] = "";
    long status = 0;
    CURL *curl = curl_easy_init ();
    if (!curl || !t.body || !url)
        snprintf (message, sizeof message, "out of memory");
    else {
        curl_easy_setopt (curl, CURLOPT_URL, url);
        curl_easy_setopt (curl, CURLOPT_PROTOCOLS_STR, "https");
        curl_easy_setopt (curl, CURLOPT_REDIR_PROTOCOLS_STR, "https");
        curl_easy_setopt (curl, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt (curl, CURLOPT_MAXREDIRS, (long) S_MAX_REDIRECTS);
        curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, (long) S_TIMEOUT_MS);
        curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt (curl, CURLOPT_MAXFILESIZE, (long) GW_FETCH_MAX_SIZE);
        curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_on_data);
        curl_easy_setopt (curl, CURLOPT_WRITEDATA, &t);
        curl_easy_setopt (curl, CURLOPT_OPENSOCKETFUNCTION, s_open_socket);
        curl_easy_setopt (curl, CURLOPT_OPENSOCKETDATA, &t);
        curl_easy_setopt (curl, CURLOPT_ERRORBUFFER, error);
        curl_easy_setopt (curl, CURLOPT_USERAGENT, "sbx-gateway/" SBX_VERSION);
        if (args->ca_file)
            curl_easy_setopt (curl, CURLOPT_CAINFO, args->ca_file);
        struct curl_slist *headers = curl_slist_append (NULL, "Accept: application/json");
        curl_easy_setopt (curl, CURLOPT_HTTPHEADER, headers);
        CURLcode rc = curl_easy_perform (curl);
        curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &status);
        if (t.refused)
            snprintf (message, sizeof message,
                      "it resolves to %s, a private or loopback address, which this server "
                      "does not fetch from",
                      t.refused_ip);
        else if (t.too_large || rc == CURLE_FILESIZE_EXCEEDED)
            snprintf (message, sizeof message, "it is larger than %d bytes", GW_FETCH_MAX_SIZE);
        else if (rc == CURLE_TOO_MANY_REDIRECTS)
            snprintf (message, sizeof message, "it redirects more than %d times", S_MAX_REDIRECTS);
        else if (rc == CURLE_OPERATION_TIMEDOUT)
            snprintf (message, sizeof message, "it did not answer within %d s",
                      S_TIMEOUT_MS / 1000);
        else if (rc == CURLE_UNSUPPORTED_PROTOCOL)
            snprintf (message, sizeof message, "it is not https (redirects too must be https)");
        else if (rc != CURLE_OK)
            snprintf (message, sizeof message, "%s", *error ? error : curl_easy_strerror (rc));
        curl_slist_free_all (headers);
        curl_easy_cleanup (curl);
    }
    char status_text[16];
    snprintf (status_text, sizeof status_text, "%ld", status);
    zmsg_t *out = zmsg_new ();
    zmsg_addstr (out, status_text);
    zmsg_addstr (out, message);
    zmsg_addmem (out, t.body ? zchunk_data (t.body) : NULL, t.body ? zchunk_size (t.body) : 0);
    zchunk_destroy (&t.body);
    zstr_free (&url);
    return out;
}

static void s_worker_args_free (void *state)
{
    s_worker_args_t *args = state;
    free (args->ca_file);
    free (args);
}

static void s_on_answer (zmsg_t *answer, void *context)
{
    s_pending_t *p = context;
    char *status = zmsg_popstr (answer);
    char *error = zmsg_popstr (answer);
    zframe_t *body = zmsg_pop (answer);
    //  NUL-terminated for JSON parsers; the size does not count it.
    size_t size = body ? zframe_size (body) : 0;
    char *text = status && error && body ? malloc (size + 1) : NULL;
    if (text) {
        memcpy (text, zframe_data (body), size);
        text[size] = 0;
    }
    p->fn (status ? atoi (status) : 0, text ? text : "", text ? size : 0,
           error && *error ? error : (text ? NULL : "out of memory"), p->arg);
    free (text);
    zstr_free (&status);
    zstr_free (&error);
    zframe_destroy (&body);
}

gw_fetch_t *gw_fetch_new (zloop_t *loop, const gw_fetch_options_t *options)
{
    static bool s_curl_ready;
    if (!s_curl_ready) {
        //  Once, from the main thread, before any worker exists.
        if (curl_global_init (CURL_GLOBAL_DEFAULT) != 0)
            return NULL;
        s_curl_ready = true;
    }
    gw_fetch_t *self = calloc (1, sizeof *self);
    s_worker_args_t *args = calloc (1, sizeof *args);
    if (!self || !args) {
        free (self);
        free (args);
        return NULL;
    }
    args->allow_private = options && options->allow_private;
    args->ca_file = options && options->ca_file ? strdup (options->ca_file) : NULL;
    //  The worker owns args from here.
    self->worker = gw_worker_new (loop, 1, s_transfer, args, s_worker_args_free);
    if (!self->worker) {
        gw_fetch_destroy (&self);
        return NULL;
    }
    return self;
}

void gw_fetch_destroy (gw_fetch_t **self_p)
{
    assert (self_p);
    gw_fetch_t *self = *self_p;
    if (!self)
        return;
    gw_worker_destroy (&self->worker);
    free (self);
    *self_p = NULL;
}

uint64_t gw_fetch_get (gw_fetch_t *self, const char *url, gw_fetch_fn *fn, void *arg)
{
    zmsg_t *request = url ? zmsg_new () : NULL;
    if (!request) {
        fn (0, "", 0, "out of memory", arg);
        return 0;
    }
    zmsg_addstr (request, url);
    s_pending_t pending = {fn, arg};
    uint64_t handle =
        gw_worker_start (self->worker, &request, s_on_answer, &pending, sizeof pending);
    if (!handle)
        fn (0, "", 0, "cannot start the fetch", arg);
    return handle;
}

void gw_fetch_cancel (gw_fetch_t *self, uint64_t handle)
{
    if (self)
        gw_worker_cancel (self->worker, handle);
}

//  --------------------------------------------------------------------------
//  Self test: address classes, and refusals that need no network (the integration
//  test fetches a real document over HTTPS).

typedef struct {
    int answers;
    char error[400];
} s_probe_t;

static void s_probe (int status, const char *body, size_t size, const char *error, void *arg)
{
    (void) status;
    (void) body;
    (void) size;
    s_probe_t *probe = arg;
    probe->answers++;
    snprintf (probe->error, sizeof probe->error, "%s", error ? error : "");
}

static int s_stop_when_done (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    return ((s_probe_t *) arg)->answers ? -1 : 0;
}

static int s_give_up (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    (void) arg;
    return -1;
}

static void s_test_one (gw_fetch_t *fetch, zloop_t *loop, const char *url, const char *expect)
{
    s_probe_t probe = {0};
    gw_fetch_get (fetch, url, s_probe, &probe);
    int t1 = zloop_timer (loop, 10, 0, s_stop_when_done, &probe);
    int t2 = zloop_timer (loop, 10000, 1, s_give_up, NULL);
    zloop_start (loop);
    zloop_timer_end (loop, t1);
    zloop_timer_end (loop, t2);
    assert (probe.answers == 1);
    if (!strstr (probe.error, expect)) {
        fprintf (stderr, "fetch %s: '%s' lacks '%s'\n", url, probe.error, expect);
        assert (false);
    }
}

void gw_fetch_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    gw_fetch_options_t options = {0};
    gw_fetch_t *fetch = gw_fetch_new (loop, &options);
    assert (fetch);
    //  Loopback is refused before connecting; plain http outright.
    s_test_one (fetch, loop, "https://127.0.0.1:1/client.json", "private or loopback");
    s_test_one (fetch, loop, "https://localhost:1/client.json", "private or loopback");
    s_test_one (fetch, loop, "http://127.0.0.1:1/client.json", "not https");
    gw_fetch_destroy (&fetch);
    zloop_destroy (&loop);
}
