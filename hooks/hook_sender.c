/*  hook_sender - see hook_sender.h */
#include "hook_sender.h"
#include "sbx_netaddr.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <sys/socket.h>

#define S_TIMEOUT_MS 10000
#define S_MAX_ANSWER 65536 //  what is kept of an answer: nothing is read from it but status

struct _hook_sender_t {
    zloop_t *loop;
    CURLM *multi;
    int timer_id; //  curl's timeout; -1 when none
    bool allow_private;
    char *ca_file;
    hook_sender_fn *fn;
    void *arg;
    zlistx_t *transfers; //  s_transfer_t, each under way
};

//  One transfer.
typedef struct {
    hook_sender_t *sender;
    int64_t tag;
    void *handle; //  in sender->transfers
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    size_t answer;
    bool refused;
    char refused_ip[SBX_NETADDR_TEXT];
    char error[CURL_ERROR_SIZE];
} s_transfer_t;

static void s_check_done (hook_sender_t *self);

static size_t s_on_data (char *data, size_t size, size_t count, void *arg)
{
    (void) data;
    s_transfer_t *t = arg;
    t->answer += size * count;
    return t->answer > S_MAX_ANSWER ? 0 : size * count;
}

//  At every connect, with the resolved address: the private-address guard.
static curl_socket_t s_open_socket (void *arg, curlsocktype purpose, struct curl_sockaddr *address)
{
    (void) purpose;
    s_transfer_t *t = arg;
    char ip[SBX_NETADDR_TEXT] = "?";
    if (!sbx_netaddr_socket_public (&address->addr, ip) && !t->sender->allow_private) {
        t->refused = true;
        snprintf (t->refused_ip, sizeof t->refused_ip, "%s", ip);
        return CURL_SOCKET_BAD;
    }
    return socket (address->family, address->socktype, address->protocol);
}

static int s_on_socket_event (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    hook_sender_t *self = arg;
    int flags = 0;
    if (item->revents & ZMQ_POLLIN)
        flags |= CURL_CSELECT_IN;
    if (item->revents & ZMQ_POLLOUT)
        flags |= CURL_CSELECT_OUT;
    if (item->revents & ZMQ_POLLERR)
        flags |= CURL_CSELECT_ERR;
    int running = 0;
    curl_multi_socket_action (self->multi, item->fd, flags, &running);
    s_check_done (self);
    return 0;
}

//  curl says which sockets to watch for what.
static int s_on_curl_socket (CURL *easy, curl_socket_t fd, int what, void *arg, void *socket_arg)
{
    (void) easy;
    (void) socket_arg;
    hook_sender_t *self = arg;
    zmq_pollitem_t item = {NULL, fd, 0, 0};
    zloop_poller_end (self->loop, &item);
    if (what == CURL_POLL_REMOVE)
        return 0;
    item.events =
        (short) ((what & CURL_POLL_IN ? ZMQ_POLLIN : 0) | (what & CURL_POLL_OUT ? ZMQ_POLLOUT : 0));
    if (zloop_poller (self->loop, &item, s_on_socket_event, self))
        return -1;
    zloop_poller_set_tolerant (self->loop, &item);
    return 0;
}

static int s_on_timeout (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    hook_sender_t *self = arg;
    self->timer_id = -1; //  a one-shot timer: zloop drops it after this call
    int running = 0;
    curl_multi_socket_action (self->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    s_check_done (self);
    return 0;
}

//  curl's one timeout: -1 none, 0 at once (the next loop turn), else in ms.
static int s_on_curl_timer (CURLM *multi, long timeout_ms, void *arg)
{
    (void) multi;
    hook_sender_t *self = arg;
    if (self->timer_id >= 0)
        zloop_timer_end (self->loop, self->timer_id);
    self->timer_id = -1;
    if (timeout_ms >= 0) {
        self->timer_id = zloop_timer (self->loop, timeout_ms > 0 ? (size_t) timeout_ms : 1, 1,
                                      s_on_timeout, self);
        if (self->timer_id < 0)
            return -1;
    }
    return 0;
}

static void s_transfer_destroy (s_transfer_t **t_p)
{
    s_transfer_t *t = *t_p;
    if (!t)
        return;
    if (t->easy) {
        curl_multi_remove_handle (t->sender->multi, t->easy);
        curl_easy_cleanup (t->easy);
    }
    if (t->handle)
        zlistx_delete (t->sender->transfers, t->handle);
    curl_slist_free_all (t->headers);
    free (t->body);
    free (t);
    *t_p = NULL;
}

static void s_check_done (hook_sender_t *self)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read (self->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        s_transfer_t *t = NULL;
        curl_easy_getinfo (msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
        CURLcode code = msg->data.result;
        long status = 0;
        curl_easy_getinfo (msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
        char why[400] = "";
        if (t->refused)
            snprintf (why, sizeof why,
                      "the URL's host resolved to %s, a private or loopback address: refused "
                      "(an operator may allow it for tests with webhooks.allow_private = true)",
                      t->refused_ip);
        else if (code != CURLE_OK && !(code == CURLE_WRITE_ERROR && status))
            snprintf (why, sizeof why, "%s", t->error[0] ? t->error : curl_easy_strerror (code));
        int64_t tag = t->tag;
        s_transfer_destroy (&t);
        self->fn (tag, why[0] ? 0 : status, why, self->arg);
    }
}

hook_sender_t *hook_sender_new (zloop_t *loop, bool allow_private, const char *ca_file,
                                hook_sender_fn *fn, void *arg)
{
    assert (loop && fn);
    if (curl_global_init (CURL_GLOBAL_DEFAULT))
        return NULL;
    hook_sender_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->timer_id = -1;
    self->allow_private = allow_private;
    self->ca_file = ca_file ? strdup (ca_file) : NULL;
    self->fn = fn;
    self->arg = arg;
    self->multi = curl_multi_init ();
    self->transfers = zlistx_new ();
    if (!self->multi || !self->transfers) {
        hook_sender_destroy (&self);
        return NULL;
    }
    curl_multi_setopt (self->multi, CURLMOPT_SOCKETFUNCTION, s_on_curl_socket);
    curl_multi_setopt (self->multi, CURLMOPT_SOCKETDATA, self);
    curl_multi_setopt (self->multi, CURLMOPT_TIMERFUNCTION, s_on_curl_timer);
    curl_multi_setopt (self->multi, CURLMOPT_TIMERDATA, self);
    return self;
}

void hook_sender_destroy (hook_sender_t **self_p)
{
    assert (self_p);
    hook_sender_t *self = *self_p;
    if (!self)
        return;
    if (self->multi) {
        //  Transfers still under way are dropped: their deliveries stay pending.
        s_transfer_t *t;
        while (self->transfers && (t = zlistx_first (self->transfers)))
            s_transfer_destroy (&t);
        curl_multi_cleanup (self->multi);
    }
    zlistx_destroy (&self->transfers);
    if (self->timer_id >= 0)
        zloop_timer_end (self->loop, self->timer_id);
    free (self->ca_file);
    free (self);
    *self_p = NULL;
}

int hook_sender_post (hook_sender_t *self, int64_t tag, const char *url, const char *body,
                      const char *const *headers)
{
    s_transfer_t *t = calloc (1, sizeof *t);
    if (!t)
        return -1;
    t->sender = self;
    t->tag = tag;
    t->body = strdup (body);
    t->easy = curl_easy_init ();
    t->headers = curl_slist_append (NULL, "Content-Type: application/json");
    for (size_t i = 0; headers && headers[i] && t->headers; i++)
        t->headers = curl_slist_append (t->headers, headers[i]);
    t->headers = t->headers ? curl_slist_append (t->headers, "Expect:") : NULL;
    if (!t->body || !t->easy || !t->headers) {
        s_transfer_destroy (&t);
        return -1;
    }
    CURL *e = t->easy;
    curl_easy_setopt (e, CURLOPT_URL, url);
    curl_easy_setopt (e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt (e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt (e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt (e, CURLOPT_TIMEOUT_MS, (long) S_TIMEOUT_MS);
    curl_easy_setopt (e, CURLOPT_POSTFIELDS, t->body);
    curl_easy_setopt (e, CURLOPT_POSTFIELDSIZE, (long) strlen (t->body));
    curl_easy_setopt (e, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt (e, CURLOPT_WRITEFUNCTION, s_on_data);
    curl_easy_setopt (e, CURLOPT_WRITEDATA, t);
    curl_easy_setopt (e, CURLOPT_OPENSOCKETFUNCTION, s_open_socket);
    curl_easy_setopt (e, CURLOPT_OPENSOCKETDATA, t);
    curl_easy_setopt (e, CURLOPT_ERRORBUFFER, t->error);
    curl_easy_setopt (e, CURLOPT_PRIVATE, t);
    curl_easy_setopt (e, CURLOPT_USERAGENT, "sbx-hookd/" SBX_VERSION);
    if (self->ca_file)
        curl_easy_setopt (e, CURLOPT_CAINFO, self->ca_file);
    t->handle = zlistx_add_end (self->transfers, t);
    if (!t->handle || curl_multi_add_handle (self->multi, e) != CURLM_OK) {
        s_transfer_destroy (&t);
        return -1;
    }
    return 0;
}

size_t hook_sender_active (hook_sender_t *self)
{
    return zlistx_size (self->transfers);
}
