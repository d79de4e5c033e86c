/*  vmd_agentlink - the host end of one guest's agent channel, driven from a zloop.

    QEMU serves the guest's virtio-serial port `agent` on a unix socket (agent.sock),
    one client at a time. The link connects without blocking (retrying while QEMU has
    not made the socket yet), frames messages with agent_frame, gives each request a
    rid of its own and hands the answer back with the caller's rid restored, fails
    requests whose deadline passed, and reconnects when the stream breaks. The agent
    says agent.hello each time the host attaches (boot, resume, vmd restart): that is
    the caller's sign that the guest is there.

        vmd_agentlink_t *link = vmd_agentlink_new (loop, "vms/sb_x/agent.sock");
        vmd_agentlink_set_handlers (link, on_hello, on_lost, ctx);
        vmd_agentlink_request (link, &exec, 600000, on_reply, ctx);

    Callbacks run from the loop, never from inside a vmd_agentlink_* call, and must not
    destroy the link that called them (schedule it).

    What waits for a guest that does not read is bounded (4 MiB encoded, 64 requests
    queued), and so is what the guest sends: a frame longer than SBX_MSG_MAX_FRAME is
    refused at its header (the link reconnects), so the link holds at most one frame
    plus one read (agent_frame); and a frame that has not arrived whole within the
    frame timeout (a header announcing more than comes) is dropped: the link logs it
    with the sandbox's name and reconnects, failing what was sent on the old stream.
*/
#ifndef VMD_AGENTLINK_H_INCLUDED
#define VMD_AGENTLINK_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#include "sbx_msg.h"

//  A frame from the agent must arrive whole within this (ms) of its first byte: the
//  largest reply (an exec's 2 x 8 MiB of output) takes about 1.5 s at the channel's
//  11 MiB/s under TCG.
#define VMD_AGENTLINK_FRAME_TIMEOUT 10000

typedef struct _vmd_agentlink_t vmd_agentlink_t;

//  The agent said hello (hello is borrowed).
typedef void (vmd_agentlink_hello_fn) (vmd_agentlink_t *self, sbx_agent_hello_t *hello, void *arg);
//  The link gave up: the socket could not be reached for the connect timeout.
typedef void (vmd_agentlink_lost_fn) (vmd_agentlink_t *self, const char *reason, void *arg);
//  A request's answer: the agent's reply, or an error message (type error) the link
//  made: timeout, or unavailable when the connection broke before the answer. Its rid
//  is the request's original rid. The callee may take *reply_p.
typedef void (vmd_agentlink_reply_fn) (vmd_agentlink_t *self, sbx_msg_t **reply_p, void *arg);

//  Starts connecting to socket_path. `name` (the sandbox id) goes into log lines.
vmd_agentlink_t *vmd_agentlink_new (zloop_t *loop, const char *socket_path, const char *name);
//  Closes the connection; pending requests are dropped without their callbacks.
void vmd_agentlink_destroy (vmd_agentlink_t **self_p);

void vmd_agentlink_set_handlers (vmd_agentlink_t *self, vmd_agentlink_hello_fn *hello,
                                 vmd_agentlink_lost_fn *lost, void *arg);
//  How long to keep trying to reach the socket before `lost` (default 30 s).
void vmd_agentlink_set_connect_timeout (vmd_agentlink_t *self, int msecs);
//  How long a frame may take to arrive whole (0: VMD_AGENTLINK_FRAME_TIMEOUT).
void vmd_agentlink_set_frame_timeout (vmd_agentlink_t *self, uint32_t msecs);
//  Times the link dropped an incomplete frame and reset the channel.
size_t vmd_agentlink_frames_dropped (vmd_agentlink_t *self);

//  Sends an agent request (takes it) under a rid of the link's own; fn gets exactly one
//  answer within timeout_ms (0: 60 s). Requests made while disconnected, or while 4 MiB
//  of output wait for a guest that does not read, are queued (their deadlines run).
//  Returns the link's rid (for cancel), or 0 when the request does not encode (fn is
//  then called from the loop with invalid_argument) or 64 requests are queued already
//  (fn gets unavailable from the loop).
uint64_t vmd_agentlink_request (vmd_agentlink_t *self, sbx_msg_t **request_p, uint32_t timeout_ms,
                                vmd_agentlink_reply_fn *fn, void *arg);
//  Forgets a request: its callback will not be called.
void vmd_agentlink_cancel (vmd_agentlink_t *self, uint64_t rid);
//  Fails every pending request with unavailable and `why`: their callbacks run before
//  this returns (the one exception to the rule above; callers use it while tearing
//  down, from the loop).
void vmd_agentlink_fail_all (vmd_agentlink_t *self, const char *why);

bool vmd_agentlink_connected (vmd_agentlink_t *self);
//  Times the agent said hello on this link.
size_t vmd_agentlink_hellos (vmd_agentlink_t *self);

void vmd_agentlink_test (bool verbose);

#endif
