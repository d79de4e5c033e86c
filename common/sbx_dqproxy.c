/*  sbx_dqproxy - see sbx_dqproxy.h */
#include "sbx_dqproxy.h"
#include "sbx_log.h"
#include "sbx_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define S_IDENTITY "sbx-cluster"
//  TLS 1.3 only, the PSK with an ECDHE key share: the key proves membership, the key
//  share gives each connection its own secret.
#define S_PRIORITY     "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK"
#define S_BUFFER       (256 * 1024) //  per direction of a link
#define S_HANDSHAKE_MS 5000         //  an accepted connection proves the key within this
#define S_MAX_LINKS    1024         //  connections relayed at once

//  An accepted link: HANDSHAKE, (a routed listener's: PREAMBLE,) CONNECTING or OPEN. A
//  link dialed in the background: DIALING, CLIENT_HANDSHAKE, OPEN.
typedef enum {
    S_HANDSHAKE,
    S_PREAMBLE,
    S_CONNECTING,
    S_OPEN,
    S_DIALING,
    S_CLIENT_HANDSHAKE
} s_state_t;

#define S_PREAMBLE_MAX 128 //  a routed link's first line, '\n' included

typedef struct s_link_t {
    struct s_link_t *next;
    s_state_t state;
    int net;   //  the TCP connection, TLS on it
    int local; //  the plain side: the node's socket, or a socket pair's end
    gnutls_session_t tls;
    char *target;                //  accepted links: where to relay once the key is proven
    sbx_dqproxy_route_fn *route; //  or, a routed listener's: what its first line names
    void *route_arg;
    int64_t deadline;
    //  Bytes on their way: decrypted for the local side; plain for TLS.
    char *to_local;
    size_t to_local_len;
    char *to_net;
    size_t to_net_len;
    size_t sending; //  a record send that said EAGAIN: the same bytes go again
    //  A side that closed: what it sent still goes to the other before the link ends
    //  (an HTTP server answers, then closes).
    bool net_eof, local_eof;
} s_link_t;

typedef struct s_listener_t {
    struct s_listener_t *next;
    int fd;
    char *target;
    sbx_dqproxy_route_fn *route;
    void *route_arg;
} s_listener_t;

struct _sbx_dqproxy_t {
    pthread_t thread;
    bool running;
    int wake; //  eventfd: new links or listeners, or stop
    pthread_mutex_t lock;
    s_link_t *incoming;      //  dialed links, handed over under the lock
    s_listener_t *listeners; //  under the lock too (added from other threads)
    bool stop;
    s_link_t *links; //  the thread's
    size_t count;
    gnutls_datum_t key;
    gnutls_psk_server_credentials_t server_cred;
    gnutls_psk_client_credentials_t client_cred;
    gnutls_priority_t priority;
};

static int64_t s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void s_nonblock (int fd)
{
    int flags = fcntl (fd, F_GETFL);
    if (flags >= 0)
        fcntl (fd, F_SETFL, flags | O_NONBLOCK);
}

//  --------------------------------------------------------------------------
//  Sockets

//  HOST:PORT into host (buffer) and port; 0 or -1.
static int s_split (const char *address, char *host, size_t size, const char **port)
{
    const char *colon = address ? strrchr (address, ':') : NULL;
    if (!colon || colon == address || (size_t) (colon - address) >= size)
        return -1;
    const char *start = address, *end = colon;
    if (*start == '[' && end[-1] == ']')
        start++, end--;
    memcpy (host, start, (size_t) (end - start));
    host[end - start] = 0;
    *port = colon + 1;
    return 0;
}

//  A TCP connection to address, nonblocking, within deadline. -1 on failure.
static int s_connect_tcp (const char *address, int64_t deadline)
{
    char host[256];
    const char *port;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    if (s_split (address, host, sizeof host, &port) || getaddrinfo (host, port, &hints, &found))
        return -1;
    int fd = -1;
    for (struct addrinfo *ai = found; ai && fd < 0; ai = ai->ai_next) {
        fd = socket (ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        int rc = connect (fd, ai->ai_addr, ai->ai_addrlen);
        if (rc && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - s_now_ms ();
            if (left > 0 && poll (&p, 1, (int) left) == 1) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt (fd, SOL_SOCKET, SO_ERROR, &err, &len);
                rc = err ? -1 : 0;
            }
        }
        if (rc) {
            close (fd);
            fd = -1;
        }
    }
    freeaddrinfo (found);
    if (fd >= 0) {
        int one = 1;
        setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        //  A peer host that vanishes is noticed by the kernel too, not only by Raft.
        setsockopt (fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    }
    return fd;
}

//  The local side of an accepted link: "@name" (abstract, this process) or HOST:PORT.
//  Nonblocking; *pending when the connect is still under way.
static int s_connect_target (const char *target, bool *pending)
{
    *pending = false;
    if (target[0] != '@') {
        int fd = s_connect_tcp (target, s_now_ms () + 2000);
        return fd;
    }
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t len = strlen (target);
    if (len < 2 || len > sizeof sun.sun_path)
        return -1;
    memcpy (sun.sun_path + 1, target + 1, len - 1);
    int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    socklen_t size = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + len);
    if (connect (fd, (struct sockaddr *) &sun, size) == 0)
        return fd;
    if (errno == EINPROGRESS || errno == EAGAIN) {
        *pending = true;
        return fd;
    }
    close (fd);
    return -1;
}

static int s_listen_tcp (const char *address)
{
    char host[256];
    const char *port;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *found = NULL;
    if (s_split (address, host, sizeof host, &port) || getaddrinfo (host, port, &hints, &found))
        return -1;
    int fd = -1;
    for (struct addrinfo *ai = found; ai && fd < 0; ai = ai->ai_next) {
        fd = socket (ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        int one = 1;
        if (fd >= 0)
            setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd >= 0 && (bind (fd, ai->ai_addr, ai->ai_addrlen) || listen (fd, 128))) {
            close (fd);
            fd = -1;
        }
    }
    freeaddrinfo (found);
    return fd;
}

//  --------------------------------------------------------------------------
//  TLS

static int s_server_key (gnutls_session_t session, const char *username, gnutls_datum_t *key)
{
    sbx_dqproxy_t *self = gnutls_session_get_ptr (session);
    if (strcmp (username, S_IDENTITY) != 0)
        return -1;
    key->data = gnutls_malloc (self->key.size);
    if (!key->data)
        return -1;
    memcpy (key->data, self->key.data, self->key.size);
    key->size = self->key.size;
    return 0;
}

static int s_session (sbx_dqproxy_t *self, gnutls_session_t *session, bool server, int fd)
{
    if (gnutls_init (session, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NONBLOCK) != 0)
        return -1;
    gnutls_session_set_ptr (*session, self);
    if (gnutls_priority_set (*session, self->priority) != 0 ||
        gnutls_credentials_set (*session, GNUTLS_CRD_PSK,
                                server ? (void *) self->server_cred : (void *) self->client_cred)) {
        gnutls_deinit (*session);
        return -1;
    }
    gnutls_transport_set_int (*session, fd);
    gnutls_handshake_set_timeout (*session, 0);
    return 0;
}

//  --------------------------------------------------------------------------
//  Links

static void s_link_free (s_link_t *link)
{
    if (link->tls) {
        if (link->state == S_OPEN)
            gnutls_bye (link->tls, GNUTLS_SHUT_WR); //  nonblocking: best effort
        gnutls_deinit (link->tls);
    }
    if (link->net >= 0)
        close (link->net);
    if (link->local >= 0)
        close (link->local);
    free (link->target);
    free (link->to_local);
    free (link->to_net);
    free (link);
}

static s_link_t *s_link_new (int net, int local, gnutls_session_t tls, s_state_t state)
{
    s_link_t *link = calloc (1, sizeof *link);
    if (!link)
        return NULL;
    link->net = net;
    link->local = local;
    link->tls = tls;
    link->state = state;
    link->to_local = malloc (S_BUFFER);
    link->to_net = malloc (S_BUFFER);
    if (!link->to_local || !link->to_net) {
        link->tls = NULL;
        link->net = link->local = -1;
        s_link_free (link);
        return NULL;
    }
    return link;
}

//  Moves what can move now on an open link. -1 when the link is over: either side
//  failed, or closed and what it sent before has gone to the other.
static int s_pump (s_link_t *link)
{
    //  TLS to local: records, while there is room; gnutls may hold decrypted bytes
    //  already read off the socket, so this loops until it says AGAIN.
    while (!link->net_eof && link->to_local_len < S_BUFFER) {
        ssize_t n = gnutls_record_recv (link->tls, link->to_local + link->to_local_len,
                                        S_BUFFER - link->to_local_len);
        if (n > 0)
            link->to_local_len += (size_t) n;
        else if (n == 0)
            link->net_eof = true;
        else if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            break;
        else if (n == GNUTLS_E_PREMATURE_TERMINATION)
            link->net_eof = true; //  closed without a close_notify: a TCP close
        else
            return -1;
    }
    while (link->to_local_len > 0) {
        ssize_t n = send (link->local, link->to_local, link->to_local_len, MSG_NOSIGNAL);
        if (n > 0) {
            memmove (link->to_local, link->to_local + n, link->to_local_len - (size_t) n);
            link->to_local_len -= (size_t) n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        else
            return -1;
    }
    //  Local to TLS.
    while (!link->local_eof && link->to_net_len < S_BUFFER) {
        ssize_t n =
            recv (link->local, link->to_net + link->to_net_len, S_BUFFER - link->to_net_len, 0);
        if (n > 0)
            link->to_net_len += (size_t) n;
        else if (n == 0)
            link->local_eof = true;
        else if (errno == EAGAIN || errno == EINTR)
            break;
        else
            return -1;
    }
    while (link->to_net_len > 0) {
        size_t size = link->sending ? link->sending : link->to_net_len;
        ssize_t n = gnutls_record_send (link->tls, link->to_net, size);
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            link->sending = size;
            break;
        }
        if (n < 0)
            return -1;
        link->sending = 0;
        memmove (link->to_net, link->to_net + n, link->to_net_len - (size_t) n);
        link->to_net_len -= (size_t) n;
    }
    if ((link->local_eof && link->to_net_len == 0) || (link->net_eof && link->to_local_len == 0))
        return -1;
    return 0;
}

//  A routed link's first line, read from TLS into to_local: once whole, the route names
//  the target (what followed the line stays in to_local, for the target). 0 while it
//  comes, 1 when the target is set, -1 when the link is over.
static int s_preamble (s_link_t *link)
{
    while (link->to_local_len < S_PREAMBLE_MAX) {
        ssize_t n = gnutls_record_recv (link->tls, link->to_local + link->to_local_len,
                                        S_PREAMBLE_MAX - link->to_local_len);
        if (n > 0)
            link->to_local_len += (size_t) n;
        else if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            break;
        else
            return -1;
    }
    char *end = memchr (link->to_local, '\n', link->to_local_len);
    if (!end)
        return link->to_local_len >= S_PREAMBLE_MAX ? -1 : 0;
    *end = 0;
    char *target = link->route (link->to_local, link->route_arg);
    if (!target) {
        sbx_debug ("dqproxy: a proven peer asked for '%.64s': refused", link->to_local);
        return -1;
    }
    size_t line = (size_t) (end - link->to_local) + 1;
    memmove (link->to_local, link->to_local + line, link->to_local_len - line);
    link->to_local_len -= line;
    link->target = target;
    return 1;
}

//  An accepted link's handshake (and a routed one's first line), then its connect to the
//  target; a dialed link's connect and handshake. -1 when it is over.
static int s_progress (s_link_t *link)
{
    if (link->state == S_DIALING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt (link->net, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
            sbx_debug ("dqproxy: cannot connect: %s", strerror (err ? err : errno));
            return -1;
        }
        link->state = S_CLIENT_HANDSHAKE;
    }
    if (link->state == S_CLIENT_HANDSHAKE || link->state == S_HANDSHAKE) {
        int rc = gnutls_handshake (link->tls);
        if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED)
            return 0;
        if (rc < 0) {
            sbx_debug ("dqproxy: a handshake failed: %s", gnutls_strerror (rc));
            return -1;
        }
        if (link->state == S_CLIENT_HANDSHAKE) {
            link->state = S_OPEN;
            return s_pump (link);
        }
        if (link->route)
            link->state = S_PREAMBLE;
    }
    if (link->state == S_PREAMBLE) {
        int rc = s_preamble (link);
        if (rc <= 0)
            return rc;
    }
    if (link->state == S_HANDSHAKE || link->state == S_PREAMBLE) {
        bool pending = false;
        link->local = s_connect_target (link->target, &pending);
        if (link->local < 0) {
            sbx_warn ("dqproxy: cannot reach %s for a proven peer", link->target);
            return -1;
        }
        link->state = pending ? S_CONNECTING : S_OPEN;
        if (!pending)
            return s_pump (link);
        return 0;
    }
    if (link->state == S_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt (link->local, SOL_SOCKET, SO_ERROR, &err, &len) || err)
            return -1;
        link->state = S_OPEN;
    }
    return s_pump (link);
}

//  --------------------------------------------------------------------------
//  The thread

static void s_accept (sbx_dqproxy_t *self, s_listener_t *listener)
{
    for (int i = 0; i < 64; i++) {
        int fd = accept4 (listener->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        if (self->count >= S_MAX_LINKS) {
            sbx_warn ("dqproxy: %zu connections already: one refused", self->count);
            close (fd);
            continue;
        }
        int one = 1;
        setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt (fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        gnutls_session_t tls;
        s_link_t *link = NULL;
        if (s_session (self, &tls, true, fd) == 0) {
            link = s_link_new (fd, -1, tls, S_HANDSHAKE);
            if (!link)
                gnutls_deinit (tls);
        }
        if (link && listener->route) {
            link->route = listener->route;
            link->route_arg = listener->route_arg;
        }
        if (!link || (!listener->route && !(link->target = strdup (listener->target)))) {
            if (link)
                s_link_free (link);
            else
                close (fd);
            continue;
        }
        link->deadline = s_now_ms () + S_HANDSHAKE_MS;
        link->next = self->links;
        self->links = link;
        self->count++;
        s_progress (link);
    }
}

static void *s_run (void *arg)
{
    sbx_dqproxy_t *self = arg;
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    s_listener_t **polled = NULL; //  the listeners of this round, in fds order
    size_t polled_cap = 0;
    while (true) {
        pthread_mutex_lock (&self->lock);
        bool stop = self->stop;
        while (self->incoming) {
            s_link_t *link = self->incoming;
            self->incoming = link->next;
            link->next = self->links;
            self->links = link;
            self->count++;
        }
        size_t listeners = 0;
        for (s_listener_t *l = self->listeners; l; l = l->next)
            listeners++;
        pthread_mutex_unlock (&self->lock);
        if (stop)
            break;
        //  One poll slot for the wake-up, one per listener, two per link.
        size_t need = 1 + listeners + 2 * self->count;
        if (need > fds_cap || listeners > polled_cap) {
            struct pollfd *grown = realloc (fds, need * sizeof *fds);
            if (grown)
                fds = grown, fds_cap = need;
            s_listener_t **more = realloc (polled, (listeners + 1) * sizeof *polled);
            if (more)
                polled = more, polled_cap = listeners + 1;
            if (!grown || !more) {
                usleep (10000);
                continue;
            }
        }
        size_t n = 0;
        fds[n++] = (struct pollfd){.fd = self->wake, .events = POLLIN};
        pthread_mutex_lock (&self->lock);
        size_t taken = 0;
        for (s_listener_t *l = self->listeners; l && taken < listeners; l = l->next) {
            polled[taken++] = l;
            fds[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        }
        pthread_mutex_unlock (&self->lock);
        int64_t now = s_now_ms ();
        int timeout = -1;
        for (s_link_t *link = self->links; link; link = link->next) {
            short net = 0, local = 0;
            if (link->state == S_HANDSHAKE || link->state == S_CLIENT_HANDSHAKE ||
                link->state == S_DIALING || link->state == S_PREAMBLE) {
                net = link->state == S_DIALING                  ? POLLOUT
                      : link->state == S_PREAMBLE               ? POLLIN
                      : gnutls_record_get_direction (link->tls) ? POLLOUT
                                                                : POLLIN;
                int left = (int) (link->deadline - now);
                timeout = timeout < 0 || left < timeout ? (left > 0 ? left : 0) : timeout;
                if (link->state == S_PREAMBLE && gnutls_record_check_pending (link->tls) > 0)
                    timeout = 0;
            } else {
                if (!link->net_eof && link->to_local_len < S_BUFFER)
                    net |= POLLIN;
                if (link->to_net_len > 0)
                    net |= POLLOUT;
                if (link->state == S_CONNECTING || link->to_local_len > 0)
                    local |= POLLOUT;
                if (link->state == S_OPEN && !link->local_eof && link->to_net_len < S_BUFFER)
                    local |= POLLIN;
                //  Decrypted bytes gnutls holds do not wake poll: come back at once.
                if (gnutls_record_check_pending (link->tls) > 0 && link->to_local_len < S_BUFFER)
                    timeout = 0;
            }
            fds[n++] = (struct pollfd){.fd = link->net, .events = net};
            fds[n++] = (struct pollfd){.fd = link->local, .events = local};
        }
        if (poll (fds, n, timeout) < 0 && errno != EINTR)
            usleep (1000);
        if (fds[0].revents & POLLIN) {
            uint64_t value;
            ssize_t r = read (self->wake, &value, sizeof value);
            (void) r;
        }
        //  Listeners are only added (at the head), never removed while the thread runs:
        //  the ones polled are still there.
        for (size_t i = 0; i < taken; i++)
            if (fds[1 + i].revents & POLLIN)
                s_accept (self, polled[i]);
        //  Every link gets a turn; those that are over go.
        now = s_now_ms ();
        s_link_t **prev = &self->links;
        while (*prev) {
            s_link_t *link = *prev;
            int rc = 0;
            bool early = link->state == S_HANDSHAKE || link->state == S_PREAMBLE ||
                         link->state == S_DIALING || link->state == S_CLIENT_HANDSHAKE;
            if (early && now >= link->deadline) {
                sbx_debug ("dqproxy: a peer did not prove the key in time");
                rc = -1;
            } else
                rc = link->state == S_OPEN ? s_pump (link) : s_progress (link);
            if (rc) {
                *prev = link->next;
                s_link_free (link);
                self->count--;
            } else
                prev = &link->next;
        }
    }
    free (fds);
    free (polled);
    return NULL;
}

static void s_wake (sbx_dqproxy_t *self)
{
    uint64_t one = 1;
    ssize_t r = write (self->wake, &one, sizeof one);
    (void) r;
}

//  --------------------------------------------------------------------------
//  The class

sbx_dqproxy_t *sbx_dqproxy_new (const unsigned char *key, size_t size)
{
    if (!key || size != SBX_DQPROXY_KEY_SIZE)
        return NULL;
    sbx_dqproxy_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    pthread_mutex_init (&self->lock, NULL);
    self->wake = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
    self->key.data = malloc (size);
    self->key.size = (unsigned) size;
    const char *error = NULL;
    if (self->wake < 0 || !self->key.data ||
        gnutls_psk_allocate_server_credentials (&self->server_cred) ||
        gnutls_psk_allocate_client_credentials (&self->client_cred) ||
        gnutls_priority_init (&self->priority, S_PRIORITY, &error)) {
        sbx_error ("dqproxy: cannot set TLS up%s%s", error ? " at " : "", error ? error : "");
        sbx_dqproxy_destroy (&self);
        return NULL;
    }
    memcpy (self->key.data, key, size);
    gnutls_psk_set_server_credentials_function (self->server_cred, s_server_key);
    if (gnutls_psk_set_client_credentials (self->client_cred, S_IDENTITY, &self->key,
                                           GNUTLS_PSK_KEY_RAW) ||
        pthread_create (&self->thread, NULL, s_run, self)) {
        sbx_dqproxy_destroy (&self);
        return NULL;
    }
    self->running = true;
    return self;
}

void sbx_dqproxy_destroy (sbx_dqproxy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sbx_dqproxy_t *self = *self_p;
    if (self->running) {
        pthread_mutex_lock (&self->lock);
        self->stop = true;
        pthread_mutex_unlock (&self->lock);
        s_wake (self);
        pthread_join (self->thread, NULL);
    }
    while (self->links) {
        s_link_t *link = self->links;
        self->links = link->next;
        s_link_free (link);
    }
    while (self->incoming) {
        s_link_t *link = self->incoming;
        self->incoming = link->next;
        s_link_free (link);
    }
    while (self->listeners) {
        s_listener_t *l = self->listeners;
        self->listeners = l->next;
        close (l->fd);
        free (l->target);
        free (l);
    }
    if (self->priority)
        gnutls_priority_deinit (self->priority);
    if (self->server_cred)
        gnutls_psk_free_server_credentials (self->server_cred);
    if (self->client_cred)
        gnutls_psk_free_client_credentials (self->client_cred);
    if (self->key.data)
        sbx_secret_wipe_bytes (self->key.data, self->key.size);
    free (self->key.data);
    if (self->wake >= 0)
        close (self->wake);
    pthread_mutex_destroy (&self->lock);
    free (self);
    *self_p = NULL;
}

//  A listener on address relaying to target, or routing with route. 0, or -1 (logged).
static int s_listener_add (sbx_dqproxy_t *self, const char *address, const char *target,
                           sbx_dqproxy_route_fn *route, void *arg)
{
    int fd = s_listen_tcp (address);
    if (fd < 0) {
        sbx_error ("dqproxy: cannot listen on %s: %s", address, strerror (errno));
        return -1;
    }
    s_listener_t *l = calloc (1, sizeof *l);
    if (!l || (target && !(l->target = strdup (target)))) {
        free (l);
        close (fd);
        return -1;
    }
    l->fd = fd;
    l->route = route;
    l->route_arg = arg;
    pthread_mutex_lock (&self->lock);
    l->next = self->listeners;
    self->listeners = l;
    pthread_mutex_unlock (&self->lock);
    s_wake (self);
    return 0;
}

int sbx_dqproxy_listen (sbx_dqproxy_t *self, const char *address, const char *target)
{
    return s_listener_add (self, address, target, NULL, NULL);
}

int sbx_dqproxy_listen_routed (sbx_dqproxy_t *self, const char *address,
                               sbx_dqproxy_route_fn *route, void *arg)
{
    return s_listener_add (self, address, NULL, route, arg);
}

//  A link dialed here goes to the relay thread.
static void s_hand_over (sbx_dqproxy_t *self, s_link_t *link)
{
    pthread_mutex_lock (&self->lock);
    link->next = self->incoming;
    self->incoming = link;
    pthread_mutex_unlock (&self->lock);
    s_wake (self);
}

int sbx_dqproxy_dial_routed (sbx_dqproxy_t *self, const char *address, const char *line)
{
    char host[256];
    const char *port;
    size_t length = line ? strlen (line) : 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *found = NULL;
    //  Numeric only: the caller's loop must not wait for a resolver.
    if (!line || length + 1 >= S_PREAMBLE_MAX || strchr (line, '\n') ||
        s_split (address, host, sizeof host, &port) || getaddrinfo (host, port, &hints, &found))
        return -1;
    int net = socket (found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = net >= 0 ? connect (net, found->ai_addr, found->ai_addrlen) : -1;
    freeaddrinfo (found);
    if (net < 0 || (rc && errno != EINPROGRESS)) {
        if (net >= 0)
            close (net);
        return -1;
    }
    int one = 1;
    setsockopt (net, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    gnutls_session_t tls;
    if (s_session (self, &tls, false, net)) {
        close (net);
        return -1;
    }
    int pair[2] = {-1, -1};
    s_link_t *link = NULL;
    if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        s_nonblock (pair[1]);
        link = s_link_new (net, pair[1], tls, S_DIALING);
    }
    if (!link) {
        gnutls_deinit (tls);
        close (net);
        if (pair[0] >= 0)
            close (pair[0]), close (pair[1]);
        return -1;
    }
    //  The line goes first, as soon as the handshake is done.
    memcpy (link->to_net, line, length);
    link->to_net[length] = '\n';
    link->to_net_len = length + 1;
    link->deadline = s_now_ms () + S_HANDSHAKE_MS;
    s_hand_over (self, link);
    return pair[0];
}

int sbx_dqproxy_dial (const char *address, int timeout_ms, void *arg)
{
    sbx_dqproxy_t *self = arg;
    int64_t deadline = s_now_ms () + (timeout_ms > 0 ? timeout_ms : 5000);
    int net = s_connect_tcp (address, deadline);
    if (net < 0)
        return -1;
    gnutls_session_t tls;
    if (s_session (self, &tls, false, net)) {
        close (net);
        return -1;
    }
    int rc;
    while ((rc = gnutls_handshake (tls)) == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
        int64_t left = deadline - s_now_ms ();
        struct pollfd p = {.fd = net,
                           .events = gnutls_record_get_direction (tls) ? POLLOUT : POLLIN};
        if (left <= 0 || poll (&p, 1, (int) left) == 0) {
            rc = GNUTLS_E_TIMEDOUT;
            break;
        }
    }
    int pair[2] = {-1, -1};
    s_link_t *link = NULL;
    if (rc == 0 && socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        s_nonblock (pair[1]);
        link = s_link_new (net, pair[1], tls, S_OPEN);
    }
    if (!link) {
        if (rc)
            sbx_debug ("dqproxy: %s: %s", address, gnutls_strerror (rc));
        gnutls_deinit (tls);
        close (net);
        if (pair[0] >= 0)
            close (pair[0]), close (pair[1]);
        return -1;
    }
    s_hand_over (self, link);
    return pair[0];
}

int sbx_dqproxy_node_dial (const char *address, void *arg)
{
    return sbx_dqproxy_dial (address, 5000, arg);
}

size_t sbx_dqproxy_connections (sbx_dqproxy_t *self)
{
    //  Read from another thread: a count for tests and metrics, not a lock-step value.
    pthread_mutex_lock (&self->lock);
    size_t count = self->count;
    for (s_link_t *link = self->incoming; link; link = link->next)
        count++;
    pthread_mutex_unlock (&self->lock);
    return count;
}

//  --------------------------------------------------------------------------
//  The key file

static int s_hex (char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int sbx_dqproxy_key_load (const char *path, bool create, unsigned char *key)
{
    char text[2 * SBX_DQPROXY_KEY_SIZE + 2];
    int fd = open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT && create) {
        if (sbx_secret_random (key, SBX_DQPROXY_KEY_SIZE))
            return -1;
        for (size_t i = 0; i < SBX_DQPROXY_KEY_SIZE; i++)
            snprintf (text + 2 * i, 3, "%02x", key[i]);
        text[2 * SBX_DQPROXY_KEY_SIZE] = '\n';
        fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        ssize_t size = (ssize_t) (2 * SBX_DQPROXY_KEY_SIZE + 1);
        int rc = fd >= 0 && write (fd, text, (size_t) size) == size && fsync (fd) == 0 ? 0 : -1;
        if (fd >= 0)
            close (fd);
        if (rc)
            sbx_error ("cannot write the cluster key %s: %s", path, strerror (errno));
        else
            sbx_info ("made the cluster key %s", path);
        return rc;
    }
    if (fd < 0) {
        sbx_error ("no cluster key at %s: %s (a node joins with `sbx up --join TOKEN`, which "
                   "brings it)",
                   path, strerror (errno));
        return -1;
    }
    struct stat st;
    ssize_t n = fstat (fd, &st) == 0 ? read (fd, text, sizeof text) : -1;
    close (fd);
    if (st.st_mode & 077)
        sbx_warn ("the cluster key %s is readable by others: chmod 600 it", path);
    bool ok = n >= 2 * SBX_DQPROXY_KEY_SIZE;
    for (size_t i = 0; ok && i < SBX_DQPROXY_KEY_SIZE; i++) {
        int hi = s_hex (text[2 * i]), lo = s_hex (text[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        key[i] = (unsigned char) (hi << 4 | lo);
    }
    if (!ok)
        sbx_error ("the cluster key %s is not 64 hex digits", path);
    return ok ? 0 : -1;
}

int sbx_dqproxy_cluster (sbx_config_t *config, char ***nodes, sbx_dqproxy_t **proxy,
                         sbx_dqlite_cluster_t *where)
{
    size_t count = 0;
    *nodes = sbx_config_list (config, "control.nodes", &count);
    *proxy = NULL;
    unsigned char key[SBX_DQPROXY_KEY_SIZE];
    char *path = sbx_config_path (config, "keys/cluster.key");
    if (*nodes && path && sbx_dqproxy_key_load (path, false, key) == 0)
        *proxy = sbx_dqproxy_new (key, sizeof key);
    sbx_secret_wipe_bytes (key, sizeof key);
    free (path);
    if (!*nodes || !*proxy) {
        sbx_config_list_free (nodes);
        sbx_dqproxy_destroy (proxy);
        return -1;
    }
    *where = (sbx_dqlite_cluster_t){
        (const char *const *) *nodes, count, sbx_dqproxy_dial, *proxy, 5000, true};
    return 0;
}

int sbx_dqproxy_derive (const unsigned char *key, const char *label,
                        unsigned char out[SBX_DQPROXY_KEY_SIZE])
{
    return gnutls_hmac_fast (GNUTLS_MAC_SHA256, key, SBX_DQPROXY_KEY_SIZE, label, strlen (label),
                             out) == 0
               ? 0
               : -1;
}

int sbx_dqproxy_key_hex (const char *hex, unsigned char out[SBX_DQPROXY_KEY_SIZE])
{
    if (!hex || strlen (hex) != 2 * SBX_DQPROXY_KEY_SIZE)
        return -1;
    for (size_t i = 0; i < SBX_DQPROXY_KEY_SIZE; i++) {
        int high = s_hex (hex[2 * i]), low = s_hex (hex[2 * i + 1]);
        if (high < 0 || low < 0)
            return -1;
        out[i] = (unsigned char) (high * 16 + low);
    }
    return 0;
}
