/*  agent_buf - bounded capture of one output stream. See agent_buf.h. */
#include "agent_buf.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct agent_buf_s {
    uint8_t *data;  //  ring of `alloc` bytes
    size_t alloc;   //  grows by doubling up to limit
    size_t limit;   //  most bytes kept
    size_t head;    //  ring index of the oldest byte kept
    size_t size;    //  bytes kept
    uint64_t start; //  offset of the oldest byte kept
};

agent_buf_t *agent_buf_new (size_t limit)
{
    assert (limit > 0);
    agent_buf_t *self = calloc (1, sizeof *self);
    if (self)
        self->limit = limit;
    return self;
}

void agent_buf_destroy (agent_buf_t **self_p)
{
    if (self_p && *self_p) {
        free ((*self_p)->data);
        free (*self_p);
        *self_p = NULL;
    }
}

//  Grows the ring to hold `want` bytes (capped at limit), unrolling it to index 0.
static int s_grow (agent_buf_t *self, size_t want)
{
    size_t alloc = self->alloc ? self->alloc : 4096;
    while (alloc < want && alloc < self->limit)
        alloc *= 2;
    if (alloc > self->limit)
        alloc = self->limit;
    if (alloc <= self->alloc)
        return 0;
    uint8_t *data = malloc (alloc);
    if (!data)
        return -1;
    size_t first = self->size < self->alloc - self->head ? self->size : self->alloc - self->head;
    if (self->size) {
        memcpy (data, self->data + self->head, first);
        memcpy (data + first, self->data, self->size - first);
    }
    free (self->data);
    self->data = data;
    self->alloc = alloc;
    self->head = 0;
    return 0;
}

int agent_buf_append (agent_buf_t *self, const void *data, size_t size)
{
    const uint8_t *src = data;
    if (size > self->limit) {
        //  Only the newest limit bytes can stay.
        size_t skip = size - self->limit;
        self->start += self->size + skip;
        self->head = 0;
        self->size = 0;
        src += skip;
        size = self->limit;
    }
    if (self->size + size > self->alloc && s_grow (self, self->size + size) != 0) {
        agent_buf_drop (self);
        self->start += size;
        return -1;
    }
    //  Full: drop the oldest bytes to make room.
    if (self->size + size > self->alloc) {
        size_t drop = self->size + size - self->alloc;
        self->head = (self->head + drop) % self->alloc;
        self->size -= drop;
        self->start += drop;
    }
    size_t tail = (self->head + self->size) % self->alloc;
    size_t first = size < self->alloc - tail ? size : self->alloc - tail;
    memcpy (self->data + tail, src, first);
    memcpy (self->data, src + first, size - first);
    self->size += size;
    return 0;
}

uint64_t agent_buf_start (const agent_buf_t *self)
{
    return self->start;
}

uint64_t agent_buf_end (const agent_buf_t *self)
{
    return self->start + self->size;
}

size_t agent_buf_size (const agent_buf_t *self)
{
    return self->size;
}

size_t agent_buf_read (const agent_buf_t *self, uint64_t offset, void *dest, size_t max,
                       uint64_t *from_p)
{
    uint64_t end = agent_buf_end (self);
    if (offset < self->start)
        offset = self->start;
    if (offset > end)
        offset = end;
    if (from_p)
        *from_p = offset;
    size_t n = end - offset < max ? (size_t) (end - offset) : max;
    if (n == 0)
        return 0;
    size_t pos = (self->head + (size_t) (offset - self->start)) % self->alloc;
    size_t first = n < self->alloc - pos ? n : self->alloc - pos;
    memcpy (dest, self->data + pos, first);
    memcpy ((uint8_t *) dest + first, self->data, n - first);
    return n;
}

void agent_buf_drop (agent_buf_t *self)
{
    self->start += self->size;
    free (self->data);
    self->data = NULL;
    self->alloc = 0;
    self->head = 0;
    self->size = 0;
}

void agent_buf_test (bool verbose)
{
    if (verbose)
        printf (" * agent_buf: ");
    agent_buf_t *buf = agent_buf_new (10000);
    assert (buf);
    uint8_t out[20000];
    uint64_t from;
    assert (agent_buf_read (buf, 0, out, sizeof out, &from) == 0 && from == 0);
    //  Write a counting pattern in odd-sized pieces past the limit.
    uint8_t chunk[777];
    uint64_t total = 0;
    for (int round = 0; round < 40; round++) {
        for (size_t i = 0; i < sizeof chunk; i++)
            chunk[i] = (uint8_t) ((total + i) % 251);
        assert (agent_buf_append (buf, chunk, sizeof chunk) == 0);
        total += sizeof chunk;
        assert (agent_buf_end (buf) == total);
        uint64_t start = agent_buf_start (buf);
        assert (total - start == agent_buf_size (buf) && agent_buf_size (buf) <= 10000);
        size_t n = agent_buf_read (buf, 0, out, sizeof out, &from);
        assert (from == start && n == agent_buf_size (buf));
        for (size_t i = 0; i < n; i++)
            assert (out[i] == (uint8_t) ((from + i) % 251));
        //  A read from a recent offset gets only what follows.
        n = agent_buf_read (buf, total - 5, out, 3, &from);
        assert (n == 3 && from == total - 5 && out[0] == (uint8_t) ((total - 5) % 251));
    }
    assert (agent_buf_start (buf) == total - 10000);
    //  One append bigger than the limit keeps its tail.
    uint8_t big[25000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t) ((total + i) % 251);
    assert (agent_buf_append (buf, big, sizeof big) == 0);
    total += sizeof big;
    assert (agent_buf_start (buf) == total - 10000 && agent_buf_end (buf) == total);
    size_t n = agent_buf_read (buf, 0, out, sizeof out, &from);
    assert (n == 10000 && from == total - 10000 && out[0] == (uint8_t) (from % 251));
    assert (agent_buf_read (buf, total + 50, out, 10, &from) == 0 && from == total);
    agent_buf_drop (buf);
    assert (agent_buf_size (buf) == 0 && agent_buf_start (buf) == total);
    assert (agent_buf_append (buf, "ab", 2) == 0 && agent_buf_end (buf) == total + 2);
    agent_buf_destroy (&buf);
    agent_buf_destroy (&buf);
    assert (buf == NULL);
    if (verbose)
        printf ("OK\n");
}
