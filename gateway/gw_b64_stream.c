/*  gw_b64_stream - see gw_b64_stream.h */
#include "gw_b64_stream.h"
#include "sbx_log.h"
#include "sbx_secret.h"

#include <assert.h>

//  File bytes encoded per write: 256 KiB of base64, a quarter of the stream buffer.
#define S_PIECE (192 * 1024)

struct gw_b64_stream_t {
    gw_request_t *req; //  NULL once the client left
    const uint8_t *data;
    size_t ready;   //  bytes of data in
    uint8_t *owned; //  all of them, once taken
    uint64_t length;
    uint64_t sent; //  bytes whose base64 is queued
    char *tail;
    size_t tail_size;
    bool tail_sent;
    bool released; //  the owner let go: the stream ends (and frees) itself
    char *left;    //  then, what to log if the client leaves before the end
    gw_b64_stream_closed_fn *closed;
    void *arg;
    char piece[S_PIECE / 3 * 4];
};

uint64_t gw_b64_stream_size (size_t head_size, uint64_t length, size_t tail_size)
{
    return head_size + (length + 2) / 3 * 4 + tail_size;
}

static void s_free (gw_b64_stream_t *self)
{
    free (self->owned);
    free (self->tail);
    free (self->left);
    free (self);
}

//  Bytes of the file whose base64 may go now, from sent: whole groups of 3 until the
//  last piece, and no more than room characters.
static size_t s_next_piece (uint64_t sent, size_t ready, uint64_t length, size_t room)
{
    size_t left = ready - sent;
    if (ready < length)
        left = left / 3 * 3;
    size_t fits = room / 4 * 3;
    if (fits > S_PIECE)
        fits = S_PIECE;
    if (left > fits)
        left = fits; //  a multiple of 3: the end is not in it
    return left;
}

//  Queues what is in and fits; the drain callback calls again. Once the owner let go
//  and everything is out, the answer ends and the stream is freed.
static void s_pump (gw_b64_stream_t *self)
{
    while (self->req && self->sent < self->ready) {
        size_t room = gw_request_stream_space (self->req);
        size_t n = s_next_piece (self->sent, self->ready, self->length, room);
        if (n == 0) {
            if (room >= 4)
                break; //  only part of a group is in: the next feed brings the rest
            //  No room: a write that cannot fit asks for the drain callback.
            gw_request_stream_write (self->req, self->piece, room + 1);
            return;
        }
        size_t encoded = sbx_secret_base64_into (self->data + self->sent, n, self->piece);
        if (gw_request_stream_write (self->req, self->piece, encoded) != 0)
            return; //  the client is gone: the closed callback follows
        self->sent += n;
    }
    if (!self->req || !self->released || self->sent < self->length)
        return;
    if (!self->tail_sent) {
        if (gw_request_stream_write (self->req, self->tail, self->tail_size) != 0)
            return; //  no room yet (the drain callback), or gone
        self->tail_sent = true;
    }
    gw_request_set_closed_fn (self->req, NULL, NULL);
    gw_request_set_drain_fn (self->req, NULL, NULL);
    gw_request_stream_end (self->req);
    s_free (self);
}

static void s_on_drain (gw_request_t *req, void *arg)
{
    (void) req;
    s_pump (arg);
}

static void s_on_closed (gw_request_t *req, void *arg)
{
    (void) req;
    gw_b64_stream_t *self = arg;
    self->req = NULL;
    if (self->released) {
        if (self->left)
            sbx_info ("%s", self->left);
        s_free (self);
    } else if (self->closed)
        self->closed (self->arg);
}

gw_b64_stream_t *gw_b64_stream_new (gw_request_t *req, const char *content_type, const char *head,
                                    size_t head_size, uint64_t length, const char *tail,
                                    size_t tail_size, gw_b64_stream_closed_fn *closed, void *arg)
{
    assert (req && head && tail);
    gw_b64_stream_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->length = length;
    self->closed = closed;
    self->arg = arg;
    self->tail = malloc (tail_size + 1);
    if (!self->tail) {
        free (self);
        return NULL;
    }
    memcpy (self->tail, tail, tail_size);
    self->tail_size = tail_size;
    if (gw_request_stream_start_sized (req, 200, content_type,
                                       gw_b64_stream_size (head_size, length, tail_size)) != 0) {
        s_free (self);
        return NULL;
    }
    self->req = req;
    gw_request_set_closed_fn (req, s_on_closed, self);
    gw_request_set_drain_fn (req, s_on_drain, self);
    //  The head is short (the envelope, a sentence, the path): it fits the empty buffer.
    if (gw_request_stream_write (req, head, head_size) != 0) {
        gw_request_set_closed_fn (req, NULL, NULL);
        gw_request_stream_fail (req);
        s_free (self);
        return NULL;
    }
    return self;
}

void gw_b64_stream_feed (gw_b64_stream_t *self, const uint8_t *data, size_t ready)
{
    assert (self);
    if (self->owned)
        return;
    self->data = data;
    self->ready = ready > self->length ? (size_t) self->length : ready;
    s_pump (self);
}

void gw_b64_stream_take (gw_b64_stream_t *self, uint8_t **data_p)
{
    assert (self && data_p);
    if (self->owned || !*data_p)
        return;
    self->owned = *data_p;
    *data_p = NULL;
    self->data = self->owned;
    self->ready = (size_t) self->length;
    s_pump (self);
}

void gw_b64_stream_end (gw_b64_stream_t **self_p, bool ok, const char *left)
{
    assert (self_p);
    gw_b64_stream_t *self = *self_p;
    *self_p = NULL;
    if (!self)
        return;
    if (!self->req) {
        s_free (self); //  the client left before
        return;
    }
    if (!ok || !self->owned) {
        gw_request_set_closed_fn (self->req, NULL, NULL);
        gw_request_set_drain_fn (self->req, NULL, NULL);
        gw_request_stream_fail (self->req);
        s_free (self);
        return;
    }
    self->released = true;
    self->left = left ? strdup (left) : NULL;
    s_pump (self);
}

//  --------------------------------------------------------------------------
//  Self test: the pieces make the whole file's base64 whatever the feeds and room
//  (the HTTP side runs in integration.mcp and integration.mcp2026).

void gw_b64_stream_test (bool verbose)
{
    (void) verbose;
    assert (gw_b64_stream_size (10, 0, 4) == 14);
    assert (gw_b64_stream_size (10, 1, 4) == 18);
    assert (gw_b64_stream_size (10, 3, 4) == 18);
    assert (gw_b64_stream_size (10, 4, 4) == 22);
    assert (s_next_piece (0, 5, 10, 100) == 3);   //  whole groups before the end
    assert (s_next_piece (0, 10, 10, 100) == 10); //  the end: padded
    assert (s_next_piece (0, 10, 10, 8) == 6);    //  what fits
    assert (s_next_piece (0, 10, 10, 3) == 0);    //  not a group
    assert (s_next_piece (3, 4, 10, 100) == 0);   //  part of a group
    assert (s_next_piece (0, 1 << 20, 1 << 20, 1 << 20) == S_PIECE);
    size_t length = 100003;
    uint8_t *file = malloc (length);
    for (size_t i = 0; i < length; i++)
        file[i] = (uint8_t) (i * 131 + 17);
    char *whole = sbx_secret_base64 (file, length);
    char *out = malloc (strlen (whole) + 1);
    assert (whole && out);
    //  Feeds of odd sizes, room that varies: the pump's arithmetic, without the HTTP.
    size_t ready = 0, sent = 0, at = 0, step = 1;
    while (sent < length) {
        if (ready < length)
            ready = ready + step * 997 > length ? length : ready + step * 997;
        step = step % 7 + 1;
        size_t room = 5 + (step * 4099) % 20000;
        size_t n;
        while ((n = s_next_piece (sent, ready, length, room)) > 0) {
            at += sbx_secret_base64_into (file + sent, n, out + at);
            sent += n;
        }
    }
    out[at] = 0;
    assert (strcmp (out, whole) == 0);
    free (out);
    free (whole);
    free (file);
}
