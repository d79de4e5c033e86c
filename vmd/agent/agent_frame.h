/*  agent_frame - codec frames over a byte stream (the guest agent's virtio-serial port).

    A frame on the stream is a 4-byte big-endian length followed by that many bytes: one
    sbx_msg encoding. Both ends use this class: the agent in the guest, and vmd on the
    QEMU chardev socket. It owns two buffers, not the descriptor, and knows nothing of
    processes, czmq or event loops: the caller polls the fd and calls read/flush.

    Bad input never stops the stream. A frame whose length is right but whose bytes do
    not decode is skipped whole (next answers -1 with the decoder's error and rid). A
    length above SBX_MSG_MAX_FRAME (or 0) means the stream lost its place: next answers
    -1 once, then skips bytes until a plausible header (a length within the limit followed
    by a msgpack map) starts the next frame. The host end resets the stream instead by
    reconnecting; then both sides call agent_frame_reset.

    The input is bounded: a frame longer than the limit (agent_frame_set_limit, at most
    SBX_MSG_MAX_FRAME) is refused at its header and never buffered, and read never holds
    more than one incomplete frame plus one read (header + limit + 1 MiB). A peer that
    announces a frame and sends less would hold the stream forever: waiting_ms says how
    long the frame at the front has waited for its rest, so the caller can give up on it
    (vmd resets the channel after vmd.agent_frame_timeout_ms).
*/
#ifndef AGENT_FRAME_H_INCLUDED
#define AGENT_FRAME_H_INCLUDED

#include "sbx_msg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define AGENT_FRAME_HEADER 4u

typedef struct agent_frame_s agent_frame_t;

//  Creates a framer on fd (not owned; should be O_NONBLOCK; -1 for none yet).
agent_frame_t *agent_frame_new (int fd);

//  Destroys the framer (not the fd); nullifies *self_p.
void agent_frame_destroy (agent_frame_t **self_p);

//  Uses another fd and drops both buffers: after a reconnect nothing half-read or
//  half-written belongs to the new peer.
void agent_frame_reset (agent_frame_t *self, int fd);

int agent_frame_fd (const agent_frame_t *self);

//  The largest frame taken in (0 or above SBX_MSG_MAX_FRAME: SBX_MSG_MAX_FRAME, the
//  default). A longer header is a bad frame (next answers -1) and its bytes are skipped.
void agent_frame_set_limit (agent_frame_t *self, uint32_t max_frame);

//  Input bytes held: once next has answered 0, the start of a frame still arriving.
size_t agent_frame_held (const agent_frame_t *self);

//  How long (ms) the frame at the front of the input has been arriving: since its first
//  byte came (0 when nothing is held). Take every whole frame with next first.
int64_t agent_frame_waiting_ms (const agent_frame_t *self);

//  Reads what the fd has now (up to 1 MiB). Returns the byte count (> 0), 0 when the fd
//  would block, -1 at end of stream or on an error (errno says which; 0 for EOF;
//  ENOBUFS when the input is at its bound because the caller stopped taking frames).
ssize_t agent_frame_read (agent_frame_t *self);

//  Appends bytes received some other way. Returns 0, or -1 when out of memory.
int agent_frame_feed (agent_frame_t *self, const void *data, size_t size);

//  Takes the next frame from the input. Returns 1 with a message the caller owns in
//  *msg_p; 0 when no whole frame is buffered; -1 when a frame was bad and skipped (err
//  says why, err->rid the request to answer when it could be read; call again).
int agent_frame_next (agent_frame_t *self, sbx_msg_t **msg_p, sbx_err_t *err);

//  Encodes msg and queues it for sending. Returns 0, or -1 with err set (a message that
//  does not encode) -- nothing is queued then.
int agent_frame_send (agent_frame_t *self, const sbx_msg_t *msg, sbx_err_t *err);

//  Queues raw bytes as they are (tests use it to send malformed input).
int agent_frame_send_raw (agent_frame_t *self, const void *data, size_t size);

//  Writes as much queued output as the fd takes now. Returns 0 (check pending), or -1
//  on a write error such as EPIPE.
int agent_frame_flush (agent_frame_t *self);

//  Bytes queued and not yet written: poll for POLLOUT while this is not 0.
size_t agent_frame_pending (const agent_frame_t *self);

//  Blocking helpers for simple clients and tests: flush everything, and wait for the
//  next message, each within timeout_ms. Return -1 on timeout (errno ETIMEDOUT), error
//  or end of stream. recv returns bad frames as -1 too, with err set.
int agent_frame_flush_wait (agent_frame_t *self, int timeout_ms);
sbx_msg_t *agent_frame_recv (agent_frame_t *self, int timeout_ms, sbx_err_t *err);

void agent_frame_test (bool verbose);

#endif
