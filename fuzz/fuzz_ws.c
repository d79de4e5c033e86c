/*  fuzz_ws - libFuzzer harness for the WebSocket framing (sbx_ws), which reads what a
    terminal's client sends the gateway and what the gateway sends `sbx sandbox shell`.

    The first byte picks the side (server: masked frames expected) and how the rest is
    cut into reads; the rest is the connection's bytes. Besides never crashing: every
    message handed out is a known opcode, a control message fits 125 bytes, text is
    UTF-8, nothing is larger than the limit, a spent parser stays spent, and each message
    re-encoded by sbx_ws_frame (masked the way its side needs) parses back the same.
*/
#define FUZZ_NAME "fuzz_ws"
#include "fuzz_check.h"
#include "sbx_common.h"
#include "sbx_msg_meta.h"
#include "sbx_ws.h"

#include <string.h>

#define S_LIMIT 4096

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_ws", SBX_LOG_ERROR);
    return 0;
}

//  The same message again, through a fresh parser of the same side.
static void s_round_trip (bool server, sbx_ws_op_t op, const uint8_t *data, size_t size)
{
    size_t fsize = 0;
    uint8_t *frame = sbx_ws_frame (op, data, size, server, &fsize);
    CHECK (frame, "a message handed out can be framed again");
    sbx_ws_t *ws = sbx_ws_new (server, S_LIMIT);
    sbx_ws_feed (ws, frame, fsize);
    free (frame);
    sbx_ws_op_t op2;
    const uint8_t *data2;
    size_t size2;
    uint16_t code;
    char why[200];
    CHECK (sbx_ws_next (ws, &op2, &data2, &size2, &code, why, sizeof why) == 1,
           "a re-framed message parses");
    CHECK (op2 == op && size2 == size && (!size || memcmp (data2, data, size) == 0),
           "a re-framed message is the same");
    sbx_ws_destroy (&ws);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool server = data[0] & 1;
    size_t step = 1 + (data[0] >> 1); //  bytes per read: 1 to 128
    data++, size--;
    sbx_ws_t *ws = sbx_ws_new (server, S_LIMIT);
    bool spent = false;
    for (size_t at = 0; at < size && !spent; at += step) {
        size_t n = size - at < step ? size - at : step;
        CHECK (sbx_ws_feed (ws, data + at, n) == 0, "feeding works");
        sbx_ws_op_t op;
        const uint8_t *msg;
        size_t msg_size;
        uint16_t code;
        char why[200];
        int rc;
        while ((rc = sbx_ws_next (ws, &op, &msg, &msg_size, &code, why, sizeof why)) == 1) {
            CHECK (op == SBX_WS_TEXT || op == SBX_WS_BINARY || op == SBX_WS_CLOSE ||
                       op == SBX_WS_PING || op == SBX_WS_PONG,
                   "a message's opcode is a known one");
            CHECK (msg_size <= S_LIMIT, "no message is over the limit");
            if (op >= SBX_WS_CLOSE)
                CHECK (msg_size <= 125, "a control message fits 125 bytes");
            if (op == SBX_WS_TEXT)
                CHECK (sbx_meta_utf8_valid ((const char *) msg, msg_size), "text is UTF-8");
            s_round_trip (server, op, msg, msg_size);
        }
        if (rc < 0) {
            CHECK (code >= 1000 && code <= 1011, "a refusal names a close code");
            CHECK (*why, "a refusal says why");
            CHECK (sbx_ws_next (ws, &op, &msg, &msg_size, &code, why, sizeof why) == -1,
                   "a spent parser stays spent");
            spent = true;
        }
    }
    sbx_ws_destroy (&ws);
    return 0;
}
