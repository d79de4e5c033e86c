/*  agent_buf - bounded capture of one output stream, addressed by absolute offsets.

    Bytes appended get consecutive offsets from 0. The buffer keeps at most `limit` of
    the newest bytes; older ones are dropped, and a read from an offset that was dropped
    says where the kept data starts instead, so truncation is never silent. Memory grows
    with what is written, up to the limit.
*/
#ifndef AGENT_BUF_H_INCLUDED
#define AGENT_BUF_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct agent_buf_s agent_buf_t;

//  Creates an empty buffer keeping at most limit bytes (> 0). NULL when out of memory.
agent_buf_t *agent_buf_new (size_t limit);

//  Destroys the buffer; nullifies *self_p.
void agent_buf_destroy (agent_buf_t **self_p);

//  Appends size bytes. Returns 0, or -1 when out of memory (the bytes are then counted
//  as dropped, so offsets stay right).
int agent_buf_append (agent_buf_t *self, const void *data, size_t size);

//  Offset of the oldest byte kept, and of the next byte to be written.
uint64_t agent_buf_start (const agent_buf_t *self);
uint64_t agent_buf_end (const agent_buf_t *self);

//  Bytes held now (end - start).
size_t agent_buf_size (const agent_buf_t *self);

//  Copies at most max bytes from offset into dest (which has room for max). An offset
//  older than start reads from start; one past the end reads nothing. Sets *from_p to
//  the offset the copy starts at. Returns the number of bytes copied.
size_t agent_buf_read (const agent_buf_t *self, uint64_t offset, void *dest, size_t max,
                       uint64_t *from_p);

//  Frees the memory and counts everything as dropped (used to shed old processes).
void agent_buf_drop (agent_buf_t *self);

void agent_buf_test (bool verbose);

#endif
