/*  fuzz_agent_frame - libFuzzer harness for the agent channel's frame parser.

    vmd reads the guest agent's virtio-serial stream into agent_frame (vmd_agentlink
    calls agent_frame_read, then agent_frame_next until it answers 0); the guest is not
    trusted. The input is that stream, after one byte that says how it arrives: in
    pieces of 1..255 bytes (0: all at once), since a frame split anywhere must parse as
    the same frames. Properties: next never loops without consuming input, every
    message it returns re-encodes, and every refusal says why. Seeds: streams of real agent frames
    (fuzz_seeds writes them) and a few broken ones.
*/
#include "agent_frame.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_NAME "fuzz_agent_frame"
#include "fuzz_check.h"

//  Takes every frame now buffered; returns how many calls answered.
static size_t s_drain (agent_frame_t *frame, size_t budget)
{
    size_t calls = 0;
    while (true) {
        sbx_msg_t *msg = NULL;
        sbx_err_t err = {0};
        int rc = agent_frame_next (frame, &msg, &err);
        CHECK (rc >= -1 && rc <= 1, "next answered out of range");
        if (rc == 0) {
            CHECK (msg == NULL, "a message with no frame");
            break;
        }
        //  Each answer consumes at least the 4 header bytes, or one byte while resyncing.
        CHECK (++calls <= budget, "next answers more often than there are bytes");
        if (rc == 1) {
            CHECK (msg, "a frame without a message");
            uint8_t *again = NULL;
            size_t again_size = 0;
            CHECK (sbx_msg_encode (msg, &again, &again_size, &err) == 0,
                   "a received message does not encode");
            free (again);
            sbx_msg_destroy (&msg);
        } else {
            CHECK (msg == NULL, "a bad frame with a message");
            CHECK (err.code != SBX_OK && err.message[0], "a bad frame without a reason");
        }
    }
    return calls;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = data[0] ? data[0] : size;
    data++, size--;
    agent_frame_t *frame = agent_frame_new (-1);
    CHECK (frame, "out of memory");
    size_t calls = 0;
    for (size_t at = 0; at < size; at += piece) {
        size_t n = size - at < piece ? size - at : piece;
        CHECK (agent_frame_feed (frame, data + at, n) == 0, "out of memory");
        calls += s_drain (frame, size + 1 - calls);
    }
    calls += s_drain (frame, size + 1 - calls);
    agent_frame_destroy (&frame);
    return 0;
}
