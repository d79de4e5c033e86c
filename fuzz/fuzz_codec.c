/*  fuzz_codec - libFuzzer harness for the codec's decoder (sbx_msg_decode).

    Every frame off a socket goes through sbx_msg_decode first. The property, as in
    tests/unit/test_codec_fuzz.c: a frame is either refused with a catalogued code and
    a message, or accepted as a message that re-encodes, decodes again and compares
    equal (and renders as JSON, as `sbx tap` does). Seeds: real frames, one per message
    type (fuzz_seeds writes them).
*/
#include "sbx_msg.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_NAME "fuzz_codec"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (data, size, &err);
    if (!msg) {
        CHECK (err.code != SBX_OK && err.message[0], "refused without a reason");
        return 0;
    }
    CHECK (err.code == SBX_OK, "accepted with an error code");
    uint8_t *again = NULL;
    size_t again_size = 0;
    CHECK (sbx_msg_encode (msg, &again, &again_size, &err) == 0, "accepted but cannot re-encode");
    sbx_msg_t *copy = sbx_msg_decode (again, again_size, &err);
    CHECK (copy, "its re-encoding is refused");
    CHECK (sbx_msg_eq (msg, copy), "the round trip differs");
    sbx_msg_t *dup = sbx_msg_dup (msg);
    CHECK (dup && sbx_msg_eq (msg, dup), "the copy differs");
    char *json = sbx_msg_body_to_json (msg);
    CHECK (json, "no JSON for an accepted message");
    free (json);
    sbx_msg_destroy (&dup);
    sbx_msg_destroy (&copy);
    sbx_msg_destroy (&msg);
    free (again);
    return 0;
}
