/*  agent_frame - codec frames over a byte stream. See agent_frame.h. */
#include "agent_frame.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK (1024u * 1024)

typedef struct {
    uint8_t *data;
    size_t size; //  bytes held from data + pos
    size_t pos;  //  bytes already consumed at the front
    size_t alloc;
    size_t max_alloc; //  never grow beyond this (0: no bound)
} s_queue_t;

struct agent_frame_s {
    int fd;
    s_queue_t in;
    s_queue_t out;
    bool resync;      //  lost our place: skipping to a plausible header
    uint32_t limit;   //  the largest frame taken in (agent_frame_set_limit)
    int64_t front_ms; //  when the frame at the front of the input began to arrive
};

static int64_t s_now_ms (void);

static int s_queue_reserve (s_queue_t *q, size_t more)
{
    if (q->pos && q->pos + q->size + more > q->alloc) {
        memmove (q->data, q->data + q->pos, q->size);
        q->pos = 0;
    }
    if (q->size + more <= q->alloc)
        return 0;
    size_t alloc = q->alloc ? q->alloc : 64 * 1024;
    while (alloc < q->size + more)
        alloc *= 2;
    //  Doubling would overshoot the bound: take exactly what it allows.
    if (q->max_alloc && alloc > q->max_alloc && q->size + more <= q->max_alloc)
        alloc = q->max_alloc;
    uint8_t *data = realloc (q->data, alloc);
    if (!data)
        return -1;
    q->data = data;
    q->alloc = alloc;
    return 0;
}

static int s_queue_put (s_queue_t *q, const void *data, size_t size)
{
    if (s_queue_reserve (q, size) != 0)
        return -1;
    memcpy (q->data + q->pos + q->size, data, size);
    q->size += size;
    return 0;
}

static void s_queue_take (s_queue_t *q, size_t size)
{
    q->pos += size;
    q->size -= size;
    if (q->size == 0)
        q->pos = 0;
    //  Give back a big buffer once it drained (a large file read went out).
    if (q->size == 0 && q->alloc > 4 * READ_CHUNK) {
        free (q->data);
        q->data = NULL;
        q->alloc = 0;
    }
}

static void s_queue_clear (s_queue_t *q)
{
    size_t max_alloc = q->max_alloc;
    free (q->data);
    memset (q, 0, sizeof *q);
    q->max_alloc = max_alloc;
}

//  The input never holds more than one incomplete frame of the limit plus one read.
static size_t s_in_bound (const agent_frame_t *self)
{
    return AGENT_FRAME_HEADER + (size_t) self->limit + READ_CHUNK;
}

agent_frame_t *agent_frame_new (int fd)
{
    agent_frame_t *self = calloc (1, sizeof *self);
    if (self) {
        self->fd = fd;
        self->limit = SBX_MSG_MAX_FRAME;
        self->in.max_alloc = s_in_bound (self);
    }
    return self;
}

void agent_frame_destroy (agent_frame_t **self_p)
{
    if (self_p && *self_p) {
        s_queue_clear (&(*self_p)->in);
        s_queue_clear (&(*self_p)->out);
        free (*self_p);
        *self_p = NULL;
    }
}

void agent_frame_reset (agent_frame_t *self, int fd)
{
    s_queue_clear (&self->in);
    s_queue_clear (&self->out);
    self->resync = false;
    self->front_ms = 0;
    self->fd = fd;
}

int agent_frame_fd (const agent_frame_t *self)
{
    return self->fd;
}

void agent_frame_set_limit (agent_frame_t *self, uint32_t max_frame)
{
    self->limit = max_frame && max_frame < SBX_MSG_MAX_FRAME ? max_frame : SBX_MSG_MAX_FRAME;
    self->in.max_alloc = s_in_bound (self);
}

size_t agent_frame_held (const agent_frame_t *self)
{
    return self->in.size;
}

int64_t agent_frame_waiting_ms (const agent_frame_t *self)
{
    return self->in.size ? s_now_ms () - self->front_ms : 0;
}

ssize_t agent_frame_read (agent_frame_t *self)
{
    //  Never beyond the bound: a caller that stops taking frames gets ENOBUFS, not an
    //  ever larger buffer.
    size_t bound = s_in_bound (self);
    size_t room = self->in.size < bound ? bound - self->in.size : 0;
    size_t want = room < READ_CHUNK ? room : READ_CHUNK;
    if (want == 0) {
        errno = ENOBUFS;
        return -1;
    }
    if (s_queue_reserve (&self->in, want) != 0) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n;
    do
        n = read (self->fd, self->in.data + self->in.pos + self->in.size, want);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        if (self->in.size == 0)
            self->front_ms = s_now_ms ();
        self->in.size += (size_t) n;
        return n;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n == 0)
        errno = 0;
    return -1;
}

int agent_frame_feed (agent_frame_t *self, const void *data, size_t size)
{
    if (self->in.size == 0 && size)
        self->front_ms = s_now_ms ();
    return s_queue_put (&self->in, data, size);
}

//  Takes size bytes from the front of the input; what remains is the start of the next
//  frame, whose wait starts now (it came with the last read: at most a read ago).
static void s_in_take (agent_frame_t *self, size_t size)
{
    s_queue_take (&self->in, size);
    if (self->in.size)
        self->front_ms = s_now_ms ();
}

static uint32_t s_get_be32 (const uint8_t *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

//  A header that can start a frame: a length within the limit, then a msgpack map
//  (fixmap, map16 or map32), which every sbx_msg frame begins with.
static bool s_plausible (const uint8_t *p, size_t avail, uint32_t limit)
{
    uint32_t len = s_get_be32 (p);
    if (len == 0 || len > limit)
        return false;
    if (avail < AGENT_FRAME_HEADER + 1)
        return true; //  can't tell yet
    uint8_t b = p[AGENT_FRAME_HEADER];
    return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
}

int agent_frame_next (agent_frame_t *self, sbx_msg_t **msg_p, sbx_err_t *err)
{
    *msg_p = NULL;
    s_queue_t *in = &self->in;
    if (self->resync) {
        //  Skip a byte at a time; the header needs its first payload byte to be judged.
        while (in->size >= AGENT_FRAME_HEADER + 1 &&
               !s_plausible (in->data + in->pos, in->size, self->limit))
            s_in_take (self, 1);
        if (in->size < AGENT_FRAME_HEADER + 1)
            return 0;
        self->resync = false;
    }
    if (in->size < AGENT_FRAME_HEADER)
        return 0;
    uint32_t len = s_get_be32 (in->data + in->pos);
    //  Refused at its header: a frame above the limit is never buffered.
    if (len == 0 || len > self->limit) {
        s_in_take (self, 1);
        self->resync = true;
        if (err)
            memset (err, 0, sizeof *err);
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                            "frame length %u is %s (limit %u bytes): skipping to the next "
                            "frame; a host should reconnect",
                            len, len ? "too large" : "zero", self->limit);
    }
    if (in->size < AGENT_FRAME_HEADER + (size_t) len)
        return 0;
    sbx_err_t local;
    sbx_err_t *e = err ? err : &local;
    memset (e, 0, sizeof *e);
    sbx_msg_t *msg = sbx_msg_decode (in->data + in->pos + AGENT_FRAME_HEADER, len, e);
    s_in_take (self, AGENT_FRAME_HEADER + (size_t) len);
    if (!msg)
        return -1;
    *msg_p = msg;
    return 1;
}

int agent_frame_send (agent_frame_t *self, const sbx_msg_t *msg, sbx_err_t *err)
{
    uint8_t *data = NULL;
    size_t size = 0;
    if (sbx_msg_encode (msg, &data, &size, err) != 0)
        return -1;
    if (size > SBX_MSG_MAX_FRAME) {
        free (data);
        return sbx_err_set (err, SBX_E_TOO_LARGE, "frame of %zu bytes exceeds the limit of %u",
                            size, SBX_MSG_MAX_FRAME);
    }
    uint8_t head[AGENT_FRAME_HEADER] = {(uint8_t) (size >> 24), (uint8_t) (size >> 16),
                                        (uint8_t) (size >> 8), (uint8_t) size};
    int rc = s_queue_reserve (&self->out, sizeof head + size);
    if (rc == 0) {
        s_queue_put (&self->out, head, sizeof head);
        s_queue_put (&self->out, data, size);
    }
    free (data);
    if (rc != 0)
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory queueing a %zu-byte frame", size);
    return 0;
}

int agent_frame_send_raw (agent_frame_t *self, const void *data, size_t size)
{
    return s_queue_put (&self->out, data, size);
}

int agent_frame_flush (agent_frame_t *self)
{
    s_queue_t *out = &self->out;
    while (out->size) {
        //  send() with MSG_NOSIGNAL on sockets so a gone peer is EPIPE, not SIGPIPE;
        //  write() on anything else (the virtio port is a character device).
        ssize_t n = send (self->fd, out->data + out->pos, out->size, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK)
            n = write (self->fd, out->data + out->pos, out->size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        s_queue_take (out, (size_t) n);
    }
    return 0;
}

size_t agent_frame_pending (const agent_frame_t *self)
{
    return self->out.size;
}

static int64_t s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int agent_frame_flush_wait (agent_frame_t *self, int timeout_ms)
{
    int64_t deadline = s_now_ms () + timeout_ms;
    while (true) {
        if (agent_frame_flush (self) != 0)
            return -1;
        if (!agent_frame_pending (self))
            return 0;
        int64_t left = deadline - s_now_ms ();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {.fd = self->fd, .events = POLLOUT};
        if (poll (&pfd, 1, (int) left) < 0 && errno != EINTR)
            return -1;
    }
}

sbx_msg_t *agent_frame_recv (agent_frame_t *self, int timeout_ms, sbx_err_t *err)
{
    int64_t deadline = s_now_ms () + timeout_ms;
    while (true) {
        sbx_msg_t *msg = NULL;
        int rc = agent_frame_next (self, &msg, err);
        if (rc != 0)
            return msg;
        int64_t left = deadline - s_now_ms ();
        struct pollfd pfd = {.fd = self->fd, .events = POLLIN};
        if (agent_frame_pending (self))
            pfd.events |= POLLOUT;
        //  Polls at least once, so a timeout of 0 still takes what has arrived.
        rc = poll (&pfd, 1, left > 0 ? (int) left : 0);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return NULL;
        if (rc == 0) {
            errno = ETIMEDOUT;
            return NULL;
        }
        if ((pfd.revents & POLLOUT) && agent_frame_flush (self) != 0)
            return NULL;
        if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) && agent_frame_read (self) < 0)
            return NULL;
    }
}

void agent_frame_test (bool verbose)
{
    if (verbose)
        printf (" * agent_frame: ");
    int sv[2];
    int rc = socketpair (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv);
    assert (rc == 0);
    agent_frame_t *a = agent_frame_new (sv[0]);
    agent_frame_t *b = agent_frame_new (sv[1]);
    assert (a && b);
    sbx_err_t err;

    //  A message round trip, with a body bigger than one socket buffer.
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ_OK);
    msg->rid = 42;
    uint8_t *blob = malloc (1024 * 1024);
    for (size_t i = 0; i < 1024 * 1024; i++)
        blob[i] = (uint8_t) (i * 7);
    sbx_bytes_set (&sbx_msg_agent_file_read_ok (msg)->data, blob, 1024 * 1024);
    sbx_msg_agent_file_read_ok (msg)->size = 5;
    assert (agent_frame_send (a, msg, &err) == 0);
    assert (agent_frame_pending (a) > 1024 * 1024);
    sbx_msg_t *got = NULL;
    //  Neither side blocks: flush a bit, read a bit, until the frame is whole.
    while (agent_frame_pending (a)) {
        agent_frame_flush (a);
        got = agent_frame_recv (b, 10, &err);
        if (got)
            break;
    }
    if (!got)
        got = agent_frame_recv (b, 2000, &err);
    assert (got && sbx_msg_eq (msg, got));
    sbx_msg_destroy (&got);
    sbx_msg_destroy (&msg);
    free (blob);

    //  Bad input through feed: random bytes in a right-sized frame, a huge length, a
    //  truncated frame; each gives -1 once and the next good frame still comes through.
    msg = sbx_msg_new (SBX_MSG_AGENT_PING);
    msg->rid = 7;
    uint8_t *enc;
    size_t enc_size;
    assert (sbx_msg_encode (msg, &enc, &enc_size, &err) == 0);
    uint8_t head[4] = {0, 0, 0, (uint8_t) enc_size};
    uint8_t junk[9] = {0, 0, 0, 5, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1};
    agent_frame_feed (b, junk, sizeof junk);
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0x33, 0x44, 0x55, 0x66};
    agent_frame_feed (b, huge, sizeof huge);
    agent_frame_feed (b, head, 4);
    agent_frame_feed (b, enc, enc_size);
    uint8_t cut[4] = {0, 0, 0, (uint8_t) (enc_size - 3)};
    agent_frame_feed (b, cut, 4);
    agent_frame_feed (b, enc, enc_size - 3);
    agent_frame_feed (b, head, 4);
    agent_frame_feed (b, enc, enc_size);
    assert (agent_frame_next (b, &got, &err) == -1 && err.code == SBX_E_INVALID_ARGUMENT);
    assert (agent_frame_next (b, &got, &err) == -1 && err.code == SBX_E_INVALID_ARGUMENT);
    assert (agent_frame_next (b, &got, &err) == 1 && got->type == SBX_MSG_AGENT_PING);
    assert (got->rid == 7);
    sbx_msg_destroy (&got);
    assert (agent_frame_next (b, &got, &err) == -1);
    assert (agent_frame_next (b, &got, &err) == 1 && got->rid == 7);
    sbx_msg_destroy (&got);
    assert (agent_frame_next (b, &got, &err) == 0 && got == NULL);
    //  A frame that arrives a byte at a time.
    for (size_t i = 0; i < 4; i++) {
        assert (agent_frame_next (b, &got, &err) == 0);
        agent_frame_feed (b, head + i, 1);
    }
    for (size_t i = 0; i < enc_size; i++) {
        assert (agent_frame_next (b, &got, &err) == 0);
        agent_frame_feed (b, enc + i, 1);
    }
    assert (agent_frame_next (b, &got, &err) == 1 && got->rid == 7);
    sbx_msg_destroy (&got);

    //  The bound: a header above the limit is refused before its body arrives, the
    //  skipped bytes are not kept, and the next good frame still comes through.
    agent_frame_set_limit (b, 1000);
    uint8_t big[4] = {0, 0, 0x13, 0x88}; //  5000 bytes announced
    assert (agent_frame_send_raw (a, big, 4) == 0);
    uint8_t *filler = calloc (1, 3 * READ_CHUNK);
    assert (filler && agent_frame_send_raw (a, filler, 3 * READ_CHUNK) == 0);
    assert (agent_frame_send_raw (a, head, 4) == 0 && agent_frame_send_raw (a, enc, enc_size) == 0);
    size_t most = 0;
    int refused = 0;
    got = NULL;
    for (int turns = 0; !got && turns < 10000; turns++) {
        agent_frame_flush (a);
        struct pollfd pfd = {.fd = sv[1], .events = POLLIN};
        if (poll (&pfd, 1, 100) == 1)
            assert (agent_frame_read (b) >= 0);
        if (agent_frame_held (b) > most)
            most = agent_frame_held (b);
        int rc;
        while ((rc = agent_frame_next (b, &got, &err)) == -1)
            refused++;
        if (rc == 1)
            assert (got->rid == 7);
    }
    assert (got && refused == 1);
    sbx_msg_destroy (&got);
    assert (most <= AGENT_FRAME_HEADER + 1000 + READ_CHUNK);
    //  A caller that stops taking frames meets the bound instead of a growing buffer.
    assert (agent_frame_feed (b, filler, AGENT_FRAME_HEADER + 1000 + READ_CHUNK) == 0);
    assert (agent_frame_read (b) == -1 && errno == ENOBUFS);
    agent_frame_reset (b, sv[1]);
    free (filler);
    agent_frame_set_limit (b, 0);

    //  A partial frame waits; waiting_ms tells the caller for how long, reset drops it.
    assert (agent_frame_held (b) == 0 && agent_frame_waiting_ms (b) == 0);
    agent_frame_feed (b, head, 4);
    agent_frame_feed (b, enc, enc_size - 1);
    assert (agent_frame_next (b, &got, &err) == 0 && agent_frame_held (b) == 4 + enc_size - 1);
    poll (NULL, 0, 30);
    assert (agent_frame_waiting_ms (b) >= 30);
    agent_frame_reset (b, sv[1]);
    assert (agent_frame_held (b) == 0 && agent_frame_waiting_ms (b) == 0);
    //  A whole frame followed by the start of another: the wait is the new frame's own.
    agent_frame_feed (b, head, 4);
    poll (NULL, 0, 30);
    agent_frame_feed (b, enc, enc_size);
    agent_frame_feed (b, head, 2);
    assert (agent_frame_next (b, &got, &err) == 1);
    sbx_msg_destroy (&got);
    assert (agent_frame_next (b, &got, &err) == 0 && agent_frame_held (b) == 2);
    assert (agent_frame_waiting_ms (b) < 30);
    agent_frame_reset (b, sv[1]);
    free (enc);
    sbx_msg_destroy (&msg);

    //  End of stream.
    close (sv[0]);
    errno = 0;
    assert (agent_frame_read (b) == -1 && errno == 0);
    agent_frame_destroy (&a);
    agent_frame_destroy (&b);
    agent_frame_destroy (&b);
    assert (b == NULL);
    close (sv[1]);
    if (verbose)
        printf ("OK\n");
}
