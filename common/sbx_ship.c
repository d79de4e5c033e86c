/*  sbx_ship - see sbx_ship.h */
#include "sbx_ship.h"
#include "sbx_log.h"
#include "sbx_secret.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_PROTO         "SHIP1"
#define S_ZAP_ENDPOINT  "inproc://zeromq.zap.01" //  the ZAP handler's, fixed by RFC 27
#define S_REQUEST_BYTES (SBX_SHIP_TICKET_MAX + SBX_SHIP_PATH_MAX) //  a request's frames
//  ZMQ_MAXMSGSIZE measures a frame as it travels: with CURVE, inside a MESSAGE command
//  (its name, nonce and MAC: 33 bytes in libzmq 4.3), which this leaves room for.
#define S_WIRE_SLACK     256
#define S_REQUEST_FRAMES 5     //  routing id, SHIP1, command, two arguments
#define S_ANSWER_FRAMES  3     //  command, two arguments
#define S_TRANSFERS_MAX  256   //  files open on a server at once, over all connections
#define S_TICKETS_MAX    4096  //  tickets offered at once
#define S_IDLE_MS        60000 //  an open file no request touches for this long is closed
#define S_SWEEP_MS       1000
#define S_PROGRESS_MS    100
#define S_REASON_MAX     200 //  of a server's ERROR text, as the fetch repeats it

//  Zeros to hash for a ZERO answer.
static const uint8_t s_zeros[SBX_SHIP_CHUNK];

//  --------------------------------------------------------------------------
//  Both ends

bool sbx_ship_path_valid (const char *path)
{
    if (!path || !*path || *path == '/' ||
        strnlen (path, SBX_SHIP_PATH_MAX + 1) > SBX_SHIP_PATH_MAX)
        return false;
    const char *part = path;
    while (true) {
        size_t len = strcspn (part, "/");
        if (len == 0 || (len == 1 && part[0] == '.') ||
            (len == 2 && part[0] == '.' && part[1] == '.'))
            return false;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char) part[i] < 0x20 || part[i] == 0x7f)
                return false;
        if (!part[len])
            return true;
        part += len + 1;
    }
}

static bool s_ticket_valid (const char *ticket)
{
    size_t len = ticket ? strnlen (ticket, SBX_SHIP_TICKET_MAX + 1) : 0;
    if (len < SBX_SHIP_TICKET_MIN || len > SBX_SHIP_TICKET_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (ticket[i] < 0x21 || ticket[i] > 0x7e)
            return false;
    return true;
}

static void s_add_u64 (zmsg_t *msg, uint64_t value)
{
    byte data[8];
    for (int i = 0; i < 8; i++)
        data[i] = (byte) (value >> (56 - 8 * i));
    zmsg_addmem (msg, data, 8);
}

static int s_u64 (zframe_t *frame, uint64_t *value)
{
    if (!frame || zframe_size (frame) != 8)
        return -1;
    const byte *data = zframe_data (frame);
    *value = 0;
    for (int i = 0; i < 8; i++)
        *value = *value << 8 | data[i];
    return 0;
}

//  A frame's text, or NULL when it is empty, longer than max or holds a NUL (what
//  strdup would cut short). The caller frees it.
static char *s_text (zframe_t *frame, size_t max)
{
    size_t size = frame ? zframe_size (frame) : 0;
    if (size == 0 || size > max || memchr (zframe_data (frame), 0, size))
        return NULL;
    return zframe_strdup (frame);
}

//  One message off a libzmq socket (the server's are in a context of their own, so
//  they are plain handles, not zsock_t), frame by frame, keeping at most max frames
//  (each is bounded by ZMQ_MAXMSGSIZE): a peer's message of a million frames costs no
//  memory. *over says some were dropped. NULL when the receive failed.
static zmsg_t *s_recv (void *handle, size_t max, bool *over)
{
    zmsg_t *msg = zmsg_new ();
    *over = false;
    bool more = true;
    while (msg && more) {
        zmq_msg_t part;
        zmq_msg_init (&part);
        int rc = zmq_msg_recv (&part, handle, 0);
        if (rc < 0 && zmq_errno () == EINTR) {
            zmq_msg_close (&part);
            continue;
        }
        more = rc >= 0 && zmq_msg_more (&part);
        if (rc < 0)
            zmsg_destroy (&msg);
        else if (zmsg_size (msg) < max) {
            if (zmsg_addmem (msg, zmq_msg_data (&part), zmq_msg_size (&part)))
                zmsg_destroy (&msg);
        } else
            *over = true;
        zmq_msg_close (&part);
    }
    if (!msg)
        while (more) { //  the rest of a message we cannot keep
            zmq_msg_t part;
            zmq_msg_init (&part);
            more = zmq_msg_recv (&part, handle, 0) >= 0 && zmq_msg_more (&part);
            zmq_msg_close (&part);
        }
    return msg;
}

//  Sends msg (destroyed) on a libzmq socket without waiting. 0, or -1 when it could
//  not go now (a DEALER's queue full or no connection).
static int s_send (void *handle, zmsg_t **msg_p)
{
    int rc = 0;
    size_t left = zmsg_size (*msg_p);
    for (zframe_t *frame = zmsg_first (*msg_p); frame && rc == 0; frame = zmsg_next (*msg_p)) {
        int flags = ZMQ_DONTWAIT | (--left ? ZMQ_SNDMORE : 0);
        rc = zmq_send (handle, zframe_data (frame), zframe_size (frame), flags) < 0 ? -1 : 0;
    }
    zmsg_destroy (msg_p);
    return rc;
}

static bool s_is_zero (const byte *data, size_t size)
{
    return size == 0 || (data[0] == 0 && memcmp (data, data + 1, size - 1) == 0);
}

//  --------------------------------------------------------------------------
//  The server

typedef struct {
    int64_t expires; //  zclock_mono
    size_t count;
    char **paths;
} s_ticket_t;

//  A file a connection has open.
typedef struct {
    char key[65]; //  its ticket's SHA-256
    char *path;
    int fd;             //  -1 once its ticket was withdrawn
    struct stat opened; //  as at OPEN: a file that changed while sent gets no digest
    uint64_t hashed;    //  bytes hashed so far, from the start and in order
    bool in_order;      //  every READ came at `hashed`: the digest is the file's
    sbx_secret_sha256_t *sha;
    int64_t used; //  last request, zclock_mono
} s_transfer_t;

typedef struct {
    zsock_t *pipe;
    void *ctx;    //  a context of our own, for a ZAP handler of our own
    void *zap;    //  REP: the handshakes' questions
    void *router; //  the clients
    int root;
    zhashx_t *tickets;   //  SHA-256 of the ticket -> s_ticket_t
    zhashx_t *transfers; //  routing id (hex) -> s_transfer_t
    char endpoint[256];
    bool terminated;
} s_server_t;

typedef struct {
    const char *bind;
    const char *root;
    zcert_t *cert;
} s_server_args_t;

struct sbx_ship_server_t {
    zactor_t *actor;
    char *endpoint;
};

static void s_ticket_free (void **item)
{
    s_ticket_t *ticket = *item;
    if (ticket) {
        for (size_t i = 0; i < ticket->count; i++)
            free (ticket->paths[i]);
        free (ticket->paths);
        free (ticket);
        *item = NULL;
    }
}

static void s_transfer_free (void **item)
{
    s_transfer_t *transfer = *item;
    if (transfer) {
        if (transfer->fd >= 0)
            close (transfer->fd);
        sbx_secret_sha256_destroy (&transfer->sha);
        free (transfer->path);
        free (transfer);
        *item = NULL;
    }
}

static void s_server_destroy (s_server_t **self_p)
{
    s_server_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->transfers);
    zhashx_destroy (&self->tickets);
    if (self->router)
        zmq_close (self->router);
    if (self->zap)
        zmq_close (self->zap);
    if (self->ctx)
        zmq_ctx_term (self->ctx);
    if (self->root >= 0)
        close (self->root);
    free (self);
    *self_p = NULL;
}

static int s_setopt (void *sock, int option, int value)
{
    return zmq_setsockopt (sock, option, &value, sizeof value);
}

static s_server_t *s_server_new (zsock_t *pipe, s_server_args_t *args)
{
    s_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->pipe = pipe;
    self->root = open (args->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (self->root < 0) {
        sbx_error ("ship: cannot open %s: %s", args->root, strerror (errno));
        s_server_destroy (&self);
        return NULL;
    }
    self->tickets = zhashx_new ();
    self->transfers = zhashx_new ();
    self->ctx = zmq_ctx_new ();
    self->zap = self->ctx ? zmq_socket (self->ctx, ZMQ_REP) : NULL;
    self->router = self->ctx ? zmq_socket (self->ctx, ZMQ_ROUTER) : NULL;
    if (!self->tickets || !self->transfers || !self->zap || !self->router) {
        sbx_error ("ship: out of memory or sockets");
        s_server_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->tickets, s_ticket_free);
    zhashx_set_destructor (self->transfers, s_transfer_free);
    //  Requests are small; answers wait per connection at most 2 x credit deep (more
    //  are dropped, which only a client that ignores the credit sees); a connection
    //  that goes silent is dropped.
    const char *domain = "sbx-ship";
    int rc = s_setopt (self->zap, ZMQ_LINGER, 0);
    rc |= zmq_bind (self->zap, S_ZAP_ENDPOINT);
    rc |= s_setopt (self->router, ZMQ_LINGER, 0);
    int64_t max = S_REQUEST_BYTES + S_WIRE_SLACK;
    rc |= zmq_setsockopt (self->router, ZMQ_MAXMSGSIZE, &max, sizeof max);
    rc |= s_setopt (self->router, ZMQ_SNDHWM, 2 * SBX_SHIP_CREDIT);
    rc |= s_setopt (self->router, ZMQ_RCVHWM, 2 * SBX_SHIP_CREDIT);
    rc |= s_setopt (self->router, ZMQ_HEARTBEAT_IVL, 5000);
    rc |= s_setopt (self->router, ZMQ_HEARTBEAT_TIMEOUT, 15000);
    rc |= s_setopt (self->router, ZMQ_CURVE_SERVER, 1);
    rc |= zmq_setsockopt (self->router, ZMQ_CURVE_SECRETKEY, zcert_secret_key (args->cert), 32);
    rc |= zmq_setsockopt (self->router, ZMQ_CURVE_PUBLICKEY, zcert_public_key (args->cert), 32);
    rc |= zmq_setsockopt (self->router, ZMQ_ZAP_DOMAIN, domain, strlen (domain));
    if (rc) {
        sbx_error ("ship: cannot set up the server's sockets: %s", zmq_strerror (zmq_errno ()));
        s_server_destroy (&self);
        return NULL;
    }
    size_t size = sizeof self->endpoint;
    if (zmq_bind (self->router, args->bind) ||
        zmq_getsockopt (self->router, ZMQ_LAST_ENDPOINT, self->endpoint, &size)) {
        sbx_error ("ship: cannot bind %s: %s", args->bind, zmq_strerror (zmq_errno ()));
        s_server_destroy (&self);
        return NULL;
    }
    return self;
}

//  A ZAP request (RFC 27): every CURVE client is admitted, the ticket being the
//  authorization; any other mechanism is not (the socket is a CURVE server anyway).
static void s_server_on_zap (s_server_t *self)
{
    bool over;
    zmsg_t *request = s_recv (self->zap, 8, &over);
    if (!request)
        return;
    zframe_t *version = zmsg_first (request);
    zframe_t *id = zmsg_next (request);
    zmsg_next (request); //  domain
    zmsg_next (request); //  address
    zmsg_next (request); //  routing id
    zframe_t *mechanism = zmsg_next (request);
    bool curve = mechanism && zframe_streq (mechanism, "CURVE");
    zmsg_t *reply = zmsg_new ();
    zmsg_addstr (reply, "1.0");
    zmsg_addmem (reply, id ? zframe_data (id) : NULL, id ? zframe_size (id) : 0);
    bool ok = version && zframe_streq (version, "1.0") && curve;
    zmsg_addstr (reply, ok ? "200" : "400");
    zmsg_addstr (reply, ok ? "OK" : "CURVE only");
    zmsg_addstr (reply, "");      //  user id
    zmsg_addmem (reply, NULL, 0); //  metadata
    s_send (self->zap, &reply);   //  REP: the answer always goes
    zmsg_destroy (&request);
}

//  An ERROR answer.
static zmsg_t *s_error (const char *format, ...)
{
    va_list args;
    va_start (args, format);
    char text[S_REASON_MAX + 100];
    vsnprintf (text, sizeof text, format, args);
    va_end (args);
    zmsg_t *msg = zmsg_new ();
    zmsg_addstr (msg, "ERROR");
    zmsg_addstr (msg, text);
    return msg;
}

//  The ticket offered as text, NULL when unknown or expired.
static s_ticket_t *s_ticket_find (s_server_t *self, const char *text, char key[65])
{
    sbx_secret_hash (text, key);
    s_ticket_t *ticket = zhashx_lookup (self->tickets, key);
    return ticket && ticket->expires > zclock_mono () ? ticket : NULL;
}

//  Opens path (valid) under the directory root one component at a time, never
//  following a symbolic link (O_NOFOLLOW at every step), a regular file only. O_NONBLOCK:
//  a FIFO put under root must not hang the server's thread in open. The descriptor
//  and *st, or -1 with errno.
static int s_open_beneath (int root, const char *path, struct stat *st)
{
    char copy[SBX_SHIP_PATH_MAX + 1];
    snprintf (copy, sizeof copy, "%s", path);
    int dir = root;
    char *name = copy, *slash;
    while ((slash = strchr (name, '/'))) {
        *slash = 0;
        int next = openat (dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int error = errno;
        if (dir != root)
            close (dir);
        if (next < 0) {
            errno = error;
            return -1;
        }
        dir = next;
        name = slash + 1;
    }
    int fd = openat (dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    int error = errno;
    if (dir != root)
        close (dir);
    if (fd >= 0 && (fstat (fd, st) || !S_ISREG (st->st_mode))) {
        close (fd);
        fd = -1;
        error = EINVAL;
    }
    errno = error;
    return fd;
}

static const char *s_open_error (int error)
{
    //  O_NOFOLLOW on a link says ELOOP, or ENOTDIR with O_DIRECTORY.
    if (error == ELOOP || error == ENOTDIR)
        return "a symbolic link or not a directory on the way (links are not followed)";
    if (error == EINVAL)
        return "not a regular file";
    return strerror (error);
}

//  STAT and OPEN.
static zmsg_t *s_server_open (s_server_t *self, const char *id, zframe_t *ticket_frame,
                              zframe_t *path_frame, bool open)
{
    char *text = s_text (ticket_frame, SBX_SHIP_TICKET_MAX);
    char *path = s_text (path_frame, SBX_SHIP_PATH_MAX);
    char key[65] = "";
    s_ticket_t *ticket = text ? s_ticket_find (self, text, key) : NULL;
    sbx_secret_wipe (text);
    free (text);
    zmsg_t *answer = NULL;
    bool offered = false;
    for (size_t i = 0; ticket && path && i < ticket->count && !offered; i++)
        offered = streq (ticket->paths[i], path);
    if (!ticket)
        answer = s_error ("ticket unknown, expired or withdrawn");
    else if (!path || !sbx_ship_path_valid (path))
        answer = s_error ("invalid path");
    else if (!offered)
        answer = s_error ("%s is not offered under this ticket", path);
    if (answer) {
        free (path);
        return answer;
    }
    //  A connection has one file open: OPEN closes the one before.
    if (open)
        zhashx_delete (self->transfers, id);
    if (open && zhashx_size (self->transfers) >= S_TRANSFERS_MAX) {
        free (path);
        return s_error ("busy: %d files are being sent, try again later", S_TRANSFERS_MAX);
    }
    struct stat st;
    int fd = s_open_beneath (self->root, path, &st);
    if (fd < 0) {
        answer = s_error ("%s: %s", path, s_open_error (errno));
        free (path);
        return answer;
    }
    answer = zmsg_new ();
    zmsg_addstr (answer, open ? "OPENED" : "SIZE");
    s_add_u64 (answer, (uint64_t) st.st_size);
    if (!open) {
        close (fd);
        free (path);
        return answer;
    }
    s_transfer_t *transfer = calloc (1, sizeof *transfer);
    if (transfer)
        transfer->sha = sbx_secret_sha256_new ();
    if (!transfer || !transfer->sha) {
        free (transfer);
        close (fd);
        free (path);
        zmsg_destroy (&answer);
        return s_error ("the server is out of memory");
    }
    memcpy (transfer->key, key, sizeof key);
    transfer->path = path;
    transfer->fd = fd;
    transfer->opened = st;
    transfer->in_order = true;
    transfer->used = zclock_mono ();
    zhashx_insert (self->transfers, id, transfer);
    return answer;
}

static zmsg_t *s_server_read (s_server_t *self, const char *id, zframe_t *offset_frame,
                              zframe_t *length_frame)
{
    s_transfer_t *transfer = zhashx_lookup (self->transfers, id);
    uint64_t offset, length;
    if (!transfer)
        return s_error ("no file open on this connection (did the server restart?)");
    if (transfer->fd < 0) {
        zhashx_delete (self->transfers, id);
        return s_error ("the ticket was withdrawn");
    }
    transfer->used = zclock_mono ();
    uint64_t size = (uint64_t) transfer->opened.st_size;
    if (s_u64 (offset_frame, &offset) || s_u64 (length_frame, &length))
        return s_error ("malformed READ");
    if (length == 0 || length > SBX_SHIP_CHUNK)
        return s_error ("READ asks for %" PRIu64 " bytes: 1 to %d", length, SBX_SHIP_CHUNK);
    if (offset > size)
        return s_error ("READ at %" PRIu64 ", past the end of %s (%" PRIu64 " bytes)", offset,
                        transfer->path, size);
    size_t want = (size_t) (length < size - offset ? length : size - offset);
    zframe_t *data = zframe_new (NULL, want);
    if (!data)
        return s_error ("the server is out of memory");
    size_t got = 0;
    int error = 0;
    while (got < want && !error) {
        ssize_t n =
            pread (transfer->fd, zframe_data (data) + got, want - got, (off_t) (offset + got));
        if (n < 0 && errno != EINTR)
            error = errno;
        else if (n == 0)
            break;
        else if (n > 0)
            got += (size_t) n;
    }
    if (got < want) {
        zmsg_t *answer = s_error ("%s: %s", transfer->path,
                                  error ? strerror (error) : "shrank while being sent");
        zframe_destroy (&data);
        zhashx_delete (self->transfers, id);
        return answer;
    }
    if (offset == transfer->hashed && transfer->in_order) {
        sbx_secret_sha256_update (transfer->sha, zframe_data (data), want);
        transfer->hashed += want;
    } else
        transfer->in_order = false;
    zmsg_t *answer = zmsg_new ();
    if (want > 0 && s_is_zero (zframe_data (data), want)) {
        zmsg_addstr (answer, "ZERO");
        s_add_u64 (answer, offset);
        s_add_u64 (answer, want);
        zframe_destroy (&data);
    } else {
        zmsg_addstr (answer, "DATA");
        s_add_u64 (answer, offset);
        zmsg_append (answer, &data);
    }
    return answer;
}

static bool s_same_time (struct timespec a, struct timespec b)
{
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static zmsg_t *s_server_close (s_server_t *self, const char *id)
{
    s_transfer_t *transfer = zhashx_lookup (self->transfers, id);
    if (!transfer)
        return s_error ("no file open on this connection (did the server restart?)");
    zmsg_t *answer = NULL;
    struct stat now;
    uint64_t size = (uint64_t) transfer->opened.st_size;
    if (transfer->fd < 0)
        answer = s_error ("the ticket was withdrawn");
    else if (!transfer->in_order || transfer->hashed != size)
        answer =
            s_error ("CLOSE before %s was read whole and in order: no checksum", transfer->path);
    else if (fstat (transfer->fd, &now) || now.st_size != transfer->opened.st_size ||
             !s_same_time (now.st_mtim, transfer->opened.st_mtim) ||
             !s_same_time (now.st_ctim, transfer->opened.st_ctim))
        answer = s_error ("%s changed while being sent", transfer->path);
    else {
        char digest[65];
        sbx_secret_sha256_final (transfer->sha, digest);
        answer = zmsg_new ();
        zmsg_addstr (answer, "CLOSED");
        zmsg_addstr (answer, digest);
    }
    zhashx_delete (self->transfers, id);
    return answer;
}

//  One request off the ROUTER, answered; nothing in it is trusted.
static void s_server_on_request (s_server_t *self)
{
    bool over;
    zmsg_t *msg = s_recv (self->router, S_REQUEST_FRAMES, &over);
    zframe_t *route = msg ? zmsg_pop (msg) : NULL;
    if (!route) {
        zmsg_destroy (&msg);
        return;
    }
    char *id = zframe_strhex (route);
    zframe_t *proto = zmsg_first (msg);
    zframe_t *command = zmsg_next (msg);
    zframe_t *arg1 = zmsg_next (msg);
    zframe_t *arg2 = zmsg_next (msg);
    size_t args = zmsg_size (msg) >= 2 ? zmsg_size (msg) - 2 : 0;
    zmsg_t *answer = NULL;
    if (!id)
        answer = s_error ("the server is out of memory");
    else if (over || !proto || !zframe_streq (proto, S_PROTO) || !command)
        answer = s_error ("not a " S_PROTO " request");
    else if ((zframe_streq (command, "STAT") || zframe_streq (command, "OPEN")) && args == 2)
        answer = s_server_open (self, id, arg1, arg2, zframe_streq (command, "OPEN"));
    else if (zframe_streq (command, "READ") && args == 2)
        answer = s_server_read (self, id, arg1, arg2);
    else if (zframe_streq (command, "CLOSE") && args == 0)
        answer = s_server_close (self, id);
    else
        answer = s_error ("unknown request, or the wrong number of frames");
    zmsg_prepend (answer, &route);
    //  ROUTER never blocks: an answer to a connection whose queue is full is dropped.
    s_send (self->router, &answer);
    zmsg_destroy (&msg);
    free (id);
}

//  OFFER ticket ttl path...: 0 or -1 (the arguments were checked by the caller).
static int s_server_offer (s_server_t *self, zmsg_t *msg)
{
    char *text = zmsg_popstr (msg);
    zframe_t *ttl_frame = zmsg_pop (msg);
    uint64_t ttl;
    char key[65];
    s_ticket_t *ticket = NULL;
    int rc = -1;
    if (!text || s_u64 (ttl_frame, &ttl))
        ;
    else if (s_ticket_find (self, text, key))
        sbx_error ("ship: ticket offered twice");
    else if (zhashx_size (self->tickets) >= S_TICKETS_MAX)
        sbx_error ("ship: %d tickets offered already", S_TICKETS_MAX);
    else if ((ticket = calloc (1, sizeof *ticket)) &&
             (ticket->paths = calloc (zmsg_size (msg), sizeof (char *)))) {
        size_t count = zmsg_size (msg);
        while (ticket->count < count && (ticket->paths[ticket->count] = zmsg_popstr (msg)))
            ticket->count++;
        //  Clamped so that the sum cannot overflow.
        ticket->expires = zclock_mono () + (int64_t) (ttl < INT64_MAX / 2 ? ttl : INT64_MAX / 2);
        if (ticket->count == count) {
            //  An expired ticket of the same text is replaced.
            zhashx_update (self->tickets, key, ticket);
            ticket = NULL;
            rc = 0;
        }
    }
    s_ticket_free ((void **) &ticket);
    zframe_destroy (&ttl_frame);
    sbx_secret_wipe (text);
    free (text);
    return rc;
}

static int s_server_withdraw (s_server_t *self, zmsg_t *msg)
{
    char *text = zmsg_popstr (msg);
    char key[65];
    sbx_secret_hash (text, key);
    sbx_secret_wipe (text);
    free (text);
    if (!zhashx_lookup (self->tickets, key))
        return -1;
    zhashx_delete (self->tickets, key);
    //  Files open under it close now; their next request is told why.
    for (s_transfer_t *transfer = zhashx_first (self->transfers); transfer;
         transfer = zhashx_next (self->transfers))
        if (streq (transfer->key, key) && transfer->fd >= 0) {
            close (transfer->fd);
            transfer->fd = -1;
        }
    return 0;
}

static void s_server_on_pipe (s_server_t *self)
{
    zmsg_t *msg = zmsg_recv (self->pipe);
    char *command = msg ? zmsg_popstr (msg) : NULL;
    if (!command || streq (command, "$TERM"))
        self->terminated = true;
    else if (streq (command, "OFFER"))
        zsock_signal (self->pipe, s_server_offer (self, msg) ? 1 : 0);
    else if (streq (command, "WITHDRAW"))
        zsock_signal (self->pipe, s_server_withdraw (self, msg) ? 1 : 0);
    free (command);
    zmsg_destroy (&msg);
}

//  Expired tickets and idle files go.
static void s_server_sweep (s_server_t *self)
{
    int64_t now = zclock_mono ();
    zlistx_t *gone = zlistx_new ();
    if (!gone)
        return;
    zlistx_set_destructor (gone, (zlistx_destructor_fn *) zstr_free);
    for (s_ticket_t *ticket = zhashx_first (self->tickets); ticket;
         ticket = zhashx_next (self->tickets))
        if (ticket->expires <= now)
            zlistx_add_end (gone, strdup (zhashx_cursor (self->tickets)));
    for (char *key = zlistx_first (gone); key; key = zlistx_next (gone))
        zhashx_delete (self->tickets, key);
    zlistx_purge (gone);
    for (s_transfer_t *transfer = zhashx_first (self->transfers); transfer;
         transfer = zhashx_next (self->transfers))
        if (now - transfer->used > S_IDLE_MS)
            zlistx_add_end (gone, strdup (zhashx_cursor (self->transfers)));
    for (char *id = zlistx_first (gone); id; id = zlistx_next (gone))
        zhashx_delete (self->transfers, id);
    zlistx_destroy (&gone);
}

static void s_server_actor (zsock_t *pipe, void *arg)
{
    s_server_t *self = s_server_new (pipe, arg);
    //  The arguments belong to the constructor, which waits for this signal; it then
    //  reads the endpoint, empty when the server could not start.
    zsock_signal (pipe, 0);
    zstr_send (pipe, self ? self->endpoint : "");
    if (!self) {
        char *command = NULL;
        while ((command = zstr_recv (pipe)) && !streq (command, "$TERM"))
            zstr_free (&command);
        zstr_free (&command);
        return;
    }
    int64_t sweep = zclock_mono () + S_SWEEP_MS;
    while (!self->terminated) {
        zmq_pollitem_t items[] = {{zsock_resolve (pipe), 0, ZMQ_POLLIN, 0},
                                  {self->zap, 0, ZMQ_POLLIN, 0},
                                  {self->router, 0, ZMQ_POLLIN, 0}};
        int64_t wait = sweep - zclock_mono ();
        int rc = zmq_poll (items, 3, wait > 0 ? (long) wait : 0);
        if (rc < 0 && zmq_errno () != EINTR)
            break;
        //  The owner first, then handshakes, then one request.
        if (rc > 0 && items[0].revents & ZMQ_POLLIN)
            s_server_on_pipe (self);
        else if (rc > 0 && items[1].revents & ZMQ_POLLIN)
            s_server_on_zap (self);
        else if (rc > 0 && items[2].revents & ZMQ_POLLIN)
            s_server_on_request (self);
        if (zclock_mono () >= sweep) {
            s_server_sweep (self);
            sweep = zclock_mono () + S_SWEEP_MS;
        }
    }
    s_server_destroy (&self);
}

sbx_ship_server_t *sbx_ship_server_new (const char *bind, const char *root, zcert_t *cert)
{
    if (!bind || !root || !cert)
        return NULL;
    sbx_ship_server_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    s_server_args_t args = {bind, root, cert};
    self->actor = zactor_new (s_server_actor, &args);
    self->endpoint = self->actor ? zstr_recv (self->actor) : NULL;
    if (!self->endpoint || !*self->endpoint)
        sbx_ship_server_destroy (&self);
    return self;
}

void sbx_ship_server_destroy (sbx_ship_server_t **self_p)
{
    assert (self_p);
    sbx_ship_server_t *self = *self_p;
    if (self) {
        zactor_destroy (&self->actor);
        zstr_free (&self->endpoint);
        free (self);
        *self_p = NULL;
    }
}

const char *sbx_ship_server_endpoint (sbx_ship_server_t *self)
{
    assert (self);
    return self->endpoint;
}

int sbx_ship_server_offer (sbx_ship_server_t *self, const char *ticket, const char *const *paths,
                           size_t count, uint64_t ttl_ms)
{
    assert (self);
    if (!s_ticket_valid (ticket) || !paths || count == 0 || count > SBX_SHIP_PATHS_MAX ||
        ttl_ms == 0)
        return -1;
    for (size_t i = 0; i < count; i++)
        if (!sbx_ship_path_valid (paths[i]))
            return -1;
    zmsg_t *msg = zmsg_new ();
    zmsg_addstr (msg, "OFFER");
    zmsg_addstr (msg, ticket);
    s_add_u64 (msg, ttl_ms);
    for (size_t i = 0; i < count; i++)
        zmsg_addstr (msg, paths[i]);
    if (zmsg_send (&msg, self->actor)) {
        zmsg_destroy (&msg);
        return -1;
    }
    return zsock_wait (self->actor) == 0 ? 0 : -1;
}

int sbx_ship_server_withdraw (sbx_ship_server_t *self, const char *ticket)
{
    assert (self);
    if (!s_ticket_valid (ticket) || zstr_sendx (self->actor, "WITHDRAW", ticket, NULL))
        return -1;
    return zsock_wait (self->actor) == 0 ? 0 : -1;
}

//  --------------------------------------------------------------------------
//  The fetch

typedef enum { S_STAT, S_OPEN, S_READ, S_CLOSE, S_OVER } s_phase_t;

typedef struct {
    char *path;
    uint64_t size;
    int dir;    //  the directory it goes into, open while its .part exists
    char *name; //  its last component
    char *part; //  name.part
} s_file_t;

typedef struct {
    zsock_t *pipe;
    zsock_t *dealer;
    char *endpoint;
    char *ticket;
    s_file_t *files;
    size_t count;
    int dest;        //  dest_dir, or -1 when it could not be opened
    int dest_error;  //  errno of that
    char *dest_name; //  for messages
    zlistx_t *made;  //  directories we made under dest (relative), to remove on failure
    s_phase_t phase;
    size_t index;    //  STAT: answers so far; later: the file being fetched
    size_t asked;    //  STAT: requests sent
    size_t inflight; //  requests not answered yet
    int part;        //  the current file's .part, open for writing
    uint64_t next;   //  READ: the next offset to ask for
    uint64_t got;    //  READ: the next offset to come
    sbx_secret_sha256_t *sha;
    uint64_t done, total;
    uint32_t timeout_ms;
    int64_t heard;    //  when the server last answered (zclock_mono)
    int64_t reported; //  when progress was last said
    bool terminated;
} s_fetch_t;

typedef struct {
    const char *endpoint, *server_key, *ticket, *dest_dir;
    zcert_t *cert;
    const char *const *paths;
    size_t count;
} s_fetch_args_t;

struct sbx_ship_fetch_t {
    zactor_t *actor;
};

static void s_fetch_destroy (s_fetch_t **self_p)
{
    s_fetch_t *self = *self_p;
    if (!self)
        return;
    zsock_destroy (&self->dealer);
    for (size_t i = 0; self->files && i < self->count; i++) {
        free (self->files[i].path);
        free (self->files[i].name);
        free (self->files[i].part);
        if (self->files[i].dir >= 0)
            close (self->files[i].dir);
    }
    free (self->files);
    if (self->part >= 0)
        close (self->part);
    if (self->dest >= 0)
        close (self->dest);
    zlistx_destroy (&self->made);
    sbx_secret_sha256_destroy (&self->sha);
    sbx_secret_wipe (self->ticket);
    free (self->ticket);
    free (self->endpoint);
    free (self->dest_name);
    free (self);
    *self_p = NULL;
}

//  The state, the socket and the connection; NULL when out of memory (said FAILED).
static s_fetch_t *s_fetch_new (zsock_t *pipe, s_fetch_args_t *args)
{
    s_fetch_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->pipe = pipe;
    self->part = -1;
    self->dest = open (args->dest_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    self->dest_error = errno;
    self->endpoint = strdup (args->endpoint);
    self->ticket = strdup (args->ticket);
    self->dest_name = strdup (args->dest_dir);
    self->files = calloc (args->count, sizeof (s_file_t));
    self->made = zlistx_new ();
    self->sha = sbx_secret_sha256_new ();
    self->dealer = zsock_new (ZMQ_DEALER);
    self->timeout_ms = SBX_SHIP_TIMEOUT_MS;
    self->heard = self->reported = zclock_mono ();
    bool ok = self->endpoint && self->ticket && self->dest_name && self->files && self->made &&
              self->sha && self->dealer;
    for (size_t i = 0; ok && i < args->count; i++) {
        self->files[i].dir = -1;
        self->files[i].path = strdup (args->paths[i]);
        self->count = i + 1;
        ok = self->files[i].path != NULL;
    }
    if (!ok) {
        s_fetch_destroy (&self);
        return NULL;
    }
    zlistx_set_destructor (self->made, (zlistx_destructor_fn *) zstr_free);
    zcert_t *cert = args->cert ? zcert_dup (args->cert) : zcert_new ();
    if (!cert) {
        s_fetch_destroy (&self);
        return NULL;
    }
    //  An answer is at most a chunk (a bigger one drops the connection, then the
    //  deadline fails the fetch); answers wait at most 2 x credit deep.
    zsock_set_linger (self->dealer, 0);
    zsock_set_maxmsgsize (self->dealer, SBX_SHIP_CHUNK + S_WIRE_SLACK);
    zsock_set_rcvhwm (self->dealer, 2 * SBX_SHIP_CREDIT);
    zsock_set_sndtimeo (self->dealer, 0);
    zcert_apply (cert, self->dealer);
    zcert_destroy (&cert);
    zsock_set_curve_serverkey (self->dealer, args->server_key);
    if (zsock_connect (self->dealer, "%s", self->endpoint))
        zsock_destroy (&self->dealer); //  said FAILED when the fetch starts
    return self;
}

//  Every .part removed, then the directories we made (deepest first).
static void s_fetch_clean (s_fetch_t *self)
{
    if (self->part >= 0) {
        close (self->part);
        self->part = -1;
    }
    for (size_t i = 0; i < self->count; i++) {
        s_file_t *file = &self->files[i];
        if (file->dir >= 0) {
            unlinkat (file->dir, file->part, 0);
            close (file->dir);
            file->dir = -1;
        }
    }
    for (char *made = zlistx_last (self->made); made; made = zlistx_prev (self->made))
        unlinkat (self->dest, made, AT_REMOVEDIR);
    zlistx_purge (self->made);
}

//  Text from the server fit to repeat: printable ASCII, at most S_REASON_MAX.
static void s_printable (char *text)
{
    size_t i = 0;
    for (; text[i] && i < S_REASON_MAX; i++)
        if (text[i] < 0x20 || text[i] > 0x7e)
            text[i] = '?';
    text[i] = 0;
}

static void s_fetch_fail (s_fetch_t *self, const char *format, ...)
{
    if (self->phase == S_OVER)
        return;
    va_list args;
    va_start (args, format);
    char reason[S_REASON_MAX + SBX_SHIP_PATH_MAX + 200];
    vsnprintf (reason, sizeof reason, format, args);
    va_end (args);
    s_fetch_clean (self);
    //  A server that sends nonsense is heard no more.
    zsock_destroy (&self->dealer);
    self->phase = S_OVER;
    zstr_sendx (self->pipe, "FAILED", reason, NULL);
}

static void s_fetch_progress (s_fetch_t *self, bool now)
{
    if (!now && zclock_mono () - self->reported < S_PROGRESS_MS)
        return;
    char done[24], total[24];
    snprintf (done, sizeof done, "%" PRIu64, self->done);
    snprintf (total, sizeof total, "%" PRIu64, self->total);
    zstr_sendx (self->pipe, "PROGRESS", done, total, NULL);
    self->reported = zclock_mono ();
}

//  Sends a request; false (and FAILED) when it cannot go.
static bool s_fetch_send (s_fetch_t *self, zmsg_t **msg_p)
{
    zmsg_pushstr (*msg_p, S_PROTO);
    if (s_send (zsock_resolve (self->dealer), msg_p)) {
        s_fetch_fail (self, "cannot send to %s: %s", self->endpoint, zmq_strerror (zmq_errno ()));
        return false;
    }
    self->inflight++;
    return true;
}

static void s_fetch_request (s_fetch_t *self, const char *command, const char *path)
{
    zmsg_t *msg = zmsg_new ();
    zmsg_addstr (msg, command);
    zmsg_addstr (msg, self->ticket);
    zmsg_addstr (msg, path);
    s_fetch_send (self, &msg);
}

//  READs up to the credit.
static void s_fetch_ask (s_fetch_t *self)
{
    uint64_t size = self->files[self->index].size;
    while (self->phase == S_READ && self->inflight < SBX_SHIP_CREDIT && self->next < size) {
        uint64_t length = size - self->next < SBX_SHIP_CHUNK ? size - self->next : SBX_SHIP_CHUNK;
        zmsg_t *msg = zmsg_new ();
        zmsg_addstr (msg, "READ");
        s_add_u64 (msg, self->next);
        s_add_u64 (msg, length);
        if (s_fetch_send (self, &msg))
            self->next += length;
    }
}

//  Makes dest/<path>'s directories as needed, never following a symbolic link, and
//  creates its .part. 0, or -1 with the reason said.
static int s_fetch_create (s_fetch_t *self, s_file_t *file)
{
    char copy[SBX_SHIP_PATH_MAX + 1];
    snprintf (copy, sizeof copy, "%s", file->path);
    int dir = dup (self->dest);
    char *name = copy, *slash;
    while (dir >= 0 && (slash = strchr (name, '/'))) {
        *slash = 0;
        int next = openat (dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && mkdirat (dir, name, 0700) == 0) {
            zlistx_add_end (self->made, strdup (copy));
            next = openat (dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        int error = errno;
        close (dir);
        dir = next;
        errno = error;
        *slash = '/';
        name = slash + 1;
    }
    file->name = strdup (name);
    file->part = zsys_sprintf ("%s.part", name);
    if (dir < 0 || !file->name || !file->part) {
        s_fetch_fail (self, "cannot make the directories of %s/%s: %s", self->dest_name, file->path,
                      s_open_error (errno));
        if (dir >= 0)
            close (dir);
        return -1;
    }
    file->dir = dir;
    self->part =
        openat (dir, file->part, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (self->part < 0) {
        s_fetch_fail (self, "cannot create %s/%s.part: %s", self->dest_name, file->path,
                      strerror (errno));
        return -1;
    }
    return 0;
}

//  STATs as the credit allows.
static void s_fetch_stat_more (s_fetch_t *self)
{
    while (self->phase == S_STAT && self->asked < self->count && self->inflight < SBX_SHIP_CREDIT)
        s_fetch_request (self, "STAT", self->files[self->asked++].path);
}

static void s_fetch_open_next (s_fetch_t *self)
{
    if (self->index < self->count) {
        self->phase = S_OPEN;
        s_fetch_request (self, "OPEN", self->files[self->index].path);
        return;
    }
    //  Every file checked and on disk: put them in place, then make the renames last.
    for (size_t i = 0; i < self->count; i++) {
        s_file_t *file = &self->files[i];
        if (renameat (file->dir, file->part, file->dir, file->name) || fsync (file->dir)) {
            s_fetch_fail (self, "cannot put %s/%s in place: %s", self->dest_name, file->path,
                          strerror (errno));
            return;
        }
        close (file->dir);
        file->dir = -1;
    }
    //  The directories we made are in dest's entries (or under them): fsync it too.
    if (zlistx_size (self->made) && fsync (self->dest)) {
        s_fetch_fail (self, "cannot sync %s: %s", self->dest_name, strerror (errno));
        return;
    }
    zlistx_purge (self->made);
    s_fetch_progress (self, true);
    self->phase = S_OVER;
    zstr_send (self->pipe, "DONE");
    zsock_destroy (&self->dealer);
}

//  pwrite, all of it.
static int s_write (int fd, const byte *data, size_t size, uint64_t offset)
{
    while (size > 0) {
        ssize_t n = pwrite (fd, data, size, (off_t) offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n, size -= (size_t) n, offset += (uint64_t) n;
    }
    return 0;
}

static void s_fetch_on_size (s_fetch_t *self, const char *command, zmsg_t *answer)
{
    s_file_t *file = &self->files[self->index];
    uint64_t size;
    zframe_t *frame = zmsg_next (answer);
    if (zmsg_size (answer) != 2 || s_u64 (frame, &size)) {
        s_fetch_fail (self, "malformed %s from %s for %s", command, self->endpoint, file->path);
        return;
    }
    if (size > SBX_SHIP_FILE_MAX) {
        s_fetch_fail (self, "%s is %" PRIu64 " bytes, more than the %llu a fetch takes", file->path,
                      size, SBX_SHIP_FILE_MAX);
        return;
    }
    if (self->phase == S_STAT) {
        file->size = size;
        self->total += size;
        if (++self->index < self->count) {
            s_fetch_stat_more (self);
            return;
        }
        s_fetch_progress (self, true);
        self->index = 0;
        s_fetch_open_next (self);
        return;
    }
    //  OPENED: the size now is the one that counts.
    self->total = self->total - file->size + size;
    file->size = size;
    if (s_fetch_create (self, file))
        return;
    self->next = self->got = 0;
    self->phase = S_READ;
    if (size == 0) {
        self->phase = S_CLOSE;
        zmsg_t *msg = zmsg_new ();
        zmsg_addstr (msg, "CLOSE");
        s_fetch_send (self, &msg);
    } else
        s_fetch_ask (self);
}

//  DATA offset bytes, or ZERO offset length: exactly the chunk that comes next.
static void s_fetch_on_chunk (s_fetch_t *self, bool zero, zmsg_t *answer)
{
    s_file_t *file = &self->files[self->index];
    zframe_t *offset_frame = zmsg_next (answer);
    zframe_t *data = zmsg_next (answer);
    uint64_t offset, length = data ? zframe_size (data) : 0;
    uint64_t left = file->size - self->got;
    uint64_t expect = left < SBX_SHIP_CHUNK ? left : SBX_SHIP_CHUNK;
    if (zmsg_size (answer) != 3 || s_u64 (offset_frame, &offset) ||
        (zero && s_u64 (data, &length))) {
        s_fetch_fail (self, "malformed chunk of %s from %s", file->path, self->endpoint);
        return;
    }
    if (offset != self->got || length != expect) {
        s_fetch_fail (self,
                      "%s sent %" PRIu64 " bytes at %" PRIu64 " of %s where %" PRIu64
                      " were due at %" PRIu64,
                      self->endpoint, length, offset, file->path, expect, self->got);
        return;
    }
    const byte *bytes = zero ? s_zeros : zframe_data (data);
    sbx_secret_sha256_update (self->sha, bytes, (size_t) length);
    //  Zeros are not written: the file stays sparse, its size set at the end.
    if (!zero && !s_is_zero (bytes, (size_t) length) &&
        s_write (self->part, bytes, (size_t) length, offset)) {
        s_fetch_fail (self, "cannot write %s/%s.part: %s", self->dest_name, file->path,
                      strerror (errno));
        return;
    }
    self->got += length;
    self->done += length;
    s_fetch_progress (self, false);
    if (self->got < file->size) {
        s_fetch_ask (self);
        return;
    }
    self->phase = S_CLOSE;
    zmsg_t *msg = zmsg_new ();
    zmsg_addstr (msg, "CLOSE");
    s_fetch_send (self, &msg);
}

static void s_fetch_on_closed (s_fetch_t *self, zmsg_t *answer)
{
    s_file_t *file = &self->files[self->index];
    char *digest = s_text (zmsg_next (answer), 64);
    char mine[65];
    sbx_secret_sha256_final (self->sha, mine);
    if (zmsg_size (answer) != 2 || !digest || strlen (digest) != 64)
        s_fetch_fail (self, "malformed CLOSED from %s for %s", self->endpoint, file->path);
    else if (!streq (digest, mine))
        s_fetch_fail (self, "checksum mismatch for %s: the server read %.64s, we received %s",
                      file->path, digest, mine);
    else if (ftruncate (self->part, (off_t) file->size) || fsync (self->part))
        s_fetch_fail (self, "cannot write %s/%s.part: %s", self->dest_name, file->path,
                      strerror (errno));
    else {
        close (self->part);
        self->part = -1;
        self->index++;
        s_fetch_open_next (self);
    }
    free (digest);
}

//  One answer off the DEALER: the one the phase waits for, or the fetch fails.
static void s_fetch_on_answer (s_fetch_t *self)
{
    bool over;
    zmsg_t *answer = s_recv (zsock_resolve (self->dealer), S_ANSWER_FRAMES, &over);
    if (!answer)
        return;
    self->heard = zclock_mono ();
    const char *path = self->files[self->index < self->count ? self->index : 0].path;
    zframe_t *command = zmsg_first (answer);
    if (self->phase == S_OVER)
        ; //  a late answer to a fetch that ended
    else if (over || !command)
        s_fetch_fail (self, "%s sent a malformed answer about %s", self->endpoint, path);
    else if (self->inflight == 0)
        s_fetch_fail (self, "%s sent an answer to no request", self->endpoint);
    else if (zframe_streq (command, "ERROR")) {
        char *why = s_text (zmsg_next (answer), SBX_SHIP_CHUNK);
        if (why)
            s_printable (why);
        s_fetch_fail (self, "%s refused %s: %s", self->endpoint, path, why ? why : "(no reason)");
        free (why);
    } else {
        self->inflight--;
        if (self->phase == S_STAT && zframe_streq (command, "SIZE"))
            s_fetch_on_size (self, "SIZE", answer);
        else if (self->phase == S_OPEN && zframe_streq (command, "OPENED"))
            s_fetch_on_size (self, "OPENED", answer);
        else if (self->phase == S_READ &&
                 (zframe_streq (command, "DATA") || zframe_streq (command, "ZERO")))
            s_fetch_on_chunk (self, zframe_streq (command, "ZERO"), answer);
        else if (self->phase == S_CLOSE && zframe_streq (command, "CLOSED"))
            s_fetch_on_closed (self, answer);
        else
            s_fetch_fail (self, "%s sent an unexpected answer about %s", self->endpoint, path);
    }
    zmsg_destroy (&answer);
}

static void s_fetch_on_pipe (s_fetch_t *self)
{
    zmsg_t *msg = zmsg_recv (self->pipe);
    char *command = msg ? zmsg_popstr (msg) : NULL;
    if (!command || streq (command, "$TERM"))
        self->terminated = true;
    else if (streq (command, "TIMEOUT")) {
        char *value = zmsg_popstr (msg);
        self->timeout_ms = value ? (uint32_t) strtoul (value, NULL, 10) : self->timeout_ms;
        free (value);
    }
    free (command);
    zmsg_destroy (&msg);
}

static void s_fetch_actor (zsock_t *pipe, void *arg)
{
    s_fetch_t *self = s_fetch_new (pipe, arg);
    zsock_signal (pipe, 0); //  the arguments are no longer used
    if (!self) {
        zstr_sendx (pipe, "FAILED", "out of memory", NULL);
        char *command = NULL;
        while ((command = zstr_recv (pipe)) && !streq (command, "$TERM"))
            zstr_free (&command);
        zstr_free (&command);
        return;
    }
    if (self->dest < 0)
        s_fetch_fail (self, "cannot open %s: %s", self->dest_name, strerror (self->dest_error));
    else if (!self->dealer)
        s_fetch_fail (self, "cannot connect to %s", self->endpoint);
    s_fetch_stat_more (self);
    while (!self->terminated) {
        zmq_pollitem_t items[] = {
            {zsock_resolve (pipe), 0, ZMQ_POLLIN, 0},
            {self->dealer ? zsock_resolve (self->dealer) : NULL, 0, ZMQ_POLLIN, 0}};
        //  Until the end, no longer than the deadline of the requests in flight.
        long wait = -1;
        if (self->phase != S_OVER) {
            int64_t left = self->heard + self->timeout_ms - zclock_mono ();
            wait = left > 0 ? (long) left : 0;
        }
        int rc = zmq_poll (items, self->dealer ? 2 : 1, wait);
        if (rc < 0 && zmq_errno () != EINTR)
            break;
        if (rc > 0 && items[0].revents & ZMQ_POLLIN)
            s_fetch_on_pipe (self);
        else if (rc > 0 && items[1].revents & ZMQ_POLLIN)
            s_fetch_on_answer (self);
        if (self->phase != S_OVER && zclock_mono () - self->heard >= self->timeout_ms)
            s_fetch_fail (self,
                          "no answer from %s for %u ms: the server is down or unreachable, or "
                          "its public key is not the one given",
                          self->endpoint, self->timeout_ms);
    }
    s_fetch_clean (self); //  cancelled: nothing of it stays (after DONE, nothing is left)
    s_fetch_destroy (&self);
}

sbx_ship_fetch_t *sbx_ship_fetch_new (const char *endpoint, const char *server_key, zcert_t *cert,
                                      const char *ticket, const char *const *paths, size_t count,
                                      const char *dest_dir)
{
    byte key[32];
    if (!endpoint || !server_key || strlen (server_key) != 40 ||
        !zmq_z85_decode (key, server_key) || !s_ticket_valid (ticket) || !paths || count == 0 ||
        count > SBX_SHIP_PATHS_MAX || !dest_dir)
        return NULL;
    for (size_t i = 0; i < count; i++)
        if (!sbx_ship_path_valid (paths[i]))
            return NULL;
    sbx_ship_fetch_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    s_fetch_args_t args = {endpoint, server_key, ticket, dest_dir, cert, paths, count};
    self->actor = zactor_new (s_fetch_actor, &args);
    if (!self->actor) {
        free (self);
        return NULL;
    }
    //  sbx_ship_fetch_recv never blocks.
    zsock_set_rcvtimeo (zactor_sock (self->actor), 0);
    return self;
}

void sbx_ship_fetch_destroy (sbx_ship_fetch_t **self_p)
{
    assert (self_p);
    sbx_ship_fetch_t *self = *self_p;
    if (self) {
        //  zactor_destroy waits for the actor's end on this socket.
        zsock_set_rcvtimeo (zactor_sock (self->actor), -1);
        zactor_destroy (&self->actor);
        free (self);
        *self_p = NULL;
    }
}

zsock_t *sbx_ship_fetch_sock (sbx_ship_fetch_t *self)
{
    assert (self);
    return zactor_sock (self->actor);
}

void sbx_ship_fetch_set_timeout (sbx_ship_fetch_t *self, uint32_t timeout_ms)
{
    assert (self);
    char value[16];
    snprintf (value, sizeof value, "%u", timeout_ms);
    zstr_sendx (self->actor, "TIMEOUT", value, NULL);
}

int sbx_ship_fetch_recv (sbx_ship_fetch_t *self, uint64_t *done_p, uint64_t *total_p,
                         char **reason_p)
{
    assert (self);
    zmsg_t *msg = zmsg_recv (self->actor);
    char *command = msg ? zmsg_popstr (msg) : NULL;
    int event = -1;
    if (command && streq (command, "PROGRESS")) {
        char *done = zmsg_popstr (msg), *total = zmsg_popstr (msg);
        if (done_p)
            *done_p = done ? strtoull (done, NULL, 10) : 0;
        if (total_p)
            *total_p = total ? strtoull (total, NULL, 10) : 0;
        free (done);
        free (total);
        event = SBX_SHIP_PROGRESS;
    } else if (command && streq (command, "DONE"))
        event = SBX_SHIP_DONE;
    else if (command && streq (command, "FAILED")) {
        char *reason = zmsg_popstr (msg);
        if (reason_p)
            *reason_p = reason;
        else
            free (reason);
        event = SBX_SHIP_FAILED;
    }
    free (command);
    zmsg_destroy (&msg);
    return event;
}
