/*  sbx_ws - see sbx_ws.h */
#include "sbx_ws.h"
#include "sbx_msg_meta.h"
#include "sbx_secret.h"

#include <assert.h>
#include <gnutls/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" //  RFC 6455 section 1.3

struct sbx_ws_t {
    bool server;
    size_t max_message;
    uint8_t *in; //  bytes fed, from in_start
    size_t in_start, in_size, in_cap;
    uint8_t *msg; //  a fragmented message being joined
    size_t msg_size, msg_cap;
    sbx_ws_op_t msg_op; //  its opcode; CONTINUATION when none is open
    uint8_t *out;       //  the last message handed out (unmasked)
    bool spent;
};

void sbx_ws_key_new (char key[SBX_WS_KEY_SIZE])
{
    uint8_t raw[16];
    sbx_secret_random (raw, sizeof raw);
    char *text = sbx_secret_base64 (raw, sizeof raw);
    snprintf (key, SBX_WS_KEY_SIZE, "%s", text ? text : "");
    free (text);
}

int sbx_ws_accept (const char *key, char accept[SBX_WS_ACCEPT_SIZE])
{
    size_t size = 0;
    uint8_t *raw = key ? sbx_secret_base64_decode (key, &size) : NULL;
    free (raw);
    if (!raw || size != 16)
        return -1;
    char joined[64];
    int n = snprintf (joined, sizeof joined, "%s%s", key, S_GUID);
    uint8_t digest[20];
    if (gnutls_hash_fast (GNUTLS_DIG_SHA1, joined, (size_t) n, digest) != 0)
        return -1;
    char *text = sbx_secret_base64 (digest, sizeof digest);
    if (!text)
        return -1;
    snprintf (accept, SBX_WS_ACCEPT_SIZE, "%s", text);
    free (text);
    return 0;
}

uint8_t *sbx_ws_frame (sbx_ws_op_t op, const void *data, size_t size, bool mask, size_t *size_p)
{
    if (op >= SBX_WS_CLOSE && size > 125)
        return NULL;
    size_t header = 2 + (size > 65535 ? 8 : size > 125 ? 2 : 0) + (mask ? 4 : 0);
    uint8_t *frame = malloc (header + size + 1);
    if (!frame)
        return NULL;
    frame[0] = (uint8_t) (0x80 | op);
    size_t at = 2;
    if (size > 65535) {
        frame[1] = 127;
        for (int i = 0; i < 8; i++)
            frame[at++] = (uint8_t) ((uint64_t) size >> (56 - 8 * i));
    } else if (size > 125) {
        frame[1] = 126;
        frame[at++] = (uint8_t) (size >> 8);
        frame[at++] = (uint8_t) size;
    } else
        frame[1] = (uint8_t) size;
    uint8_t key[4] = {0};
    if (mask) {
        frame[1] |= 0x80;
        sbx_secret_random (key, sizeof key);
        memcpy (frame + at, key, 4);
        at += 4;
    }
    if (size)
        memcpy (frame + at, data, size);
    if (mask)
        for (size_t i = 0; i < size; i++)
            frame[at + i] ^= key[i % 4];
    *size_p = header + size;
    return frame;
}

uint8_t *sbx_ws_close_frame (uint16_t code, const char *reason, bool mask, size_t *size_p)
{
    uint8_t payload[125];
    payload[0] = (uint8_t) (code >> 8);
    payload[1] = (uint8_t) code;
    size_t len = reason ? strlen (reason) : 0;
    if (len > sizeof payload - 2)
        len = sizeof payload - 2;
    //  Never cut a UTF-8 sequence in two: the peer would refuse the reason.
    while (len && !sbx_meta_utf8_valid (reason, len))
        len--;
    if (len)
        memcpy (payload + 2, reason, len);
    return sbx_ws_frame (SBX_WS_CLOSE, payload, 2 + len, mask, size_p);
}

uint16_t sbx_ws_close_code (const uint8_t *data, size_t size)
{
    return size >= 2 ? (uint16_t) (data[0] << 8 | data[1]) : 1005;
}

sbx_ws_t *sbx_ws_new (bool server, size_t max_message)
{
    sbx_ws_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->server = server;
    self->max_message = max_message;
    self->msg_op = SBX_WS_CONTINUATION;
    return self;
}

void sbx_ws_destroy (sbx_ws_t **self_p)
{
    sbx_ws_t *self = *self_p;
    if (!self)
        return;
    free (self->in);
    free (self->msg);
    free (self->out);
    free (self);
    *self_p = NULL;
}

int sbx_ws_feed (sbx_ws_t *self, const void *data, size_t size)
{
    if (self->in_start) {
        //  Keep what is left at the front, so the buffer only grows for a large frame.
        memmove (self->in, self->in + self->in_start, self->in_size - self->in_start);
        self->in_size -= self->in_start;
        self->in_start = 0;
    }
    if (self->in_size + size > self->in_cap) {
        size_t cap = self->in_cap ? self->in_cap : 4096;
        while (cap < self->in_size + size)
            cap *= 2;
        uint8_t *in = realloc (self->in, cap);
        if (!in)
            return -1;
        self->in = in;
        self->in_cap = cap;
    }
    memcpy (self->in + self->in_size, data, size);
    self->in_size += size;
    return 0;
}

size_t sbx_ws_held (const sbx_ws_t *self)
{
    return self->in_size - self->in_start + self->msg_size;
}

static int s_refuse (sbx_ws_t *self, uint16_t code, uint16_t *close_code, char *why,
                     size_t why_size, const char *text)
{
    self->spent = true;
    *close_code = code;
    snprintf (why, why_size, "%s", text);
    return -1;
}

int sbx_ws_next (sbx_ws_t *self, sbx_ws_op_t *op, const uint8_t **data, size_t *size,
                 uint16_t *close_code, char *why, size_t why_size)
{
    free (self->out);
    self->out = NULL;
    while (!self->spent) {
        const uint8_t *p = self->in + self->in_start;
        size_t avail = self->in_size - self->in_start;
        if (avail < 2)
            return 0;
        bool fin = p[0] & 0x80;
        int opcode = p[0] & 0x0f;
        bool masked = p[1] & 0x80;
        uint64_t len = p[1] & 0x7f;
        size_t header = 2;
        if (p[0] & 0x70)
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a frame has reserved bits set (no extension was agreed)");
        bool control = opcode >= SBX_WS_CLOSE;
        if (!(opcode <= SBX_WS_BINARY || (control && opcode <= SBX_WS_PONG)))
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a frame has an unknown opcode");
        if (masked != self->server)
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             self->server ? "a client frame is not masked"
                                          : "a server frame is masked");
        if (control && (!fin || len > 125))
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a control frame is fragmented or longer than 125 bytes");
        if (len == 126) {
            if (avail < 4)
                return 0;
            len = (uint64_t) p[2] << 8 | p[3];
            header = 4;
        } else if (len == 127) {
            if (avail < 10)
                return 0;
            len = 0;
            for (int i = 0; i < 8; i++)
                len = len << 8 | p[2 + i];
            header = 10;
        }
        if (len >> 63)
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a frame's 64-bit length has its top bit set");
        //  len first: a huge one must not wrap the sum around.
        if (!control && (len > self->max_message || len + self->msg_size > self->max_message)) {
            char text[120];
            snprintf (text, sizeof text, "a message is larger than %zu bytes", self->max_message);
            return s_refuse (self, SBX_WS_CLOSE_TOO_BIG, close_code, why, why_size, text);
        }
        if (masked)
            header += 4;
        if (avail < header + len)
            return 0;
        const uint8_t *key = masked ? p + header - 4 : NULL;
        uint8_t *payload = malloc (len + 1);
        if (!payload)
            return s_refuse (self, SBX_WS_CLOSE_INTERNAL, close_code, why, why_size,
                             "out of memory");
        for (uint64_t i = 0; i < len; i++)
            payload[i] = key ? p[header + i] ^ key[i % 4] : p[header + i];
        payload[len] = 0;
        self->in_start += header + len;
        if (control) {
            if (opcode == SBX_WS_CLOSE &&
                (len == 1 || (len > 2 && !sbx_meta_utf8_valid ((char *) payload + 2, len - 2)))) {
                free (payload);
                return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                                 "a close frame's payload is malformed");
            }
            self->out = payload;
            *op = (sbx_ws_op_t) opcode;
            *data = payload;
            *size = len;
            return 1;
        }
        if (opcode == SBX_WS_CONTINUATION && self->msg_op == SBX_WS_CONTINUATION) {
            free (payload);
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a continuation frame with no message to continue");
        }
        if (opcode != SBX_WS_CONTINUATION && self->msg_op != SBX_WS_CONTINUATION) {
            free (payload);
            return s_refuse (self, SBX_WS_CLOSE_PROTOCOL, close_code, why, why_size,
                             "a new message began before the last one ended");
        }
        if (opcode != SBX_WS_CONTINUATION && fin) {
            //  A whole message in one frame, the usual case: no joining.
            if (opcode == SBX_WS_TEXT && !sbx_meta_utf8_valid ((char *) payload, len)) {
                free (payload);
                return s_refuse (self, SBX_WS_CLOSE_BAD_DATA, close_code, why, why_size,
                                 "a text message is not UTF-8");
            }
            self->out = payload;
            *op = (sbx_ws_op_t) opcode;
            *data = payload;
            *size = len;
            return 1;
        }
        if (opcode != SBX_WS_CONTINUATION)
            self->msg_op = (sbx_ws_op_t) opcode;
        if (self->msg_size + len + 1 > self->msg_cap) {
            size_t cap = self->msg_cap ? self->msg_cap : 4096;
            while (cap < self->msg_size + len + 1)
                cap *= 2;
            uint8_t *msg = realloc (self->msg, cap);
            if (!msg) {
                free (payload);
                return s_refuse (self, SBX_WS_CLOSE_INTERNAL, close_code, why, why_size,
                                 "out of memory");
            }
            self->msg = msg;
            self->msg_cap = cap;
        }
        memcpy (self->msg + self->msg_size, payload, len);
        self->msg_size += len;
        free (payload);
        if (fin) {
            sbx_ws_op_t whole = self->msg_op;
            if (whole == SBX_WS_TEXT && !sbx_meta_utf8_valid ((char *) self->msg, self->msg_size))
                return s_refuse (self, SBX_WS_CLOSE_BAD_DATA, close_code, why, why_size,
                                 "a text message is not UTF-8");
            self->msg[self->msg_size] = 0;
            self->out = self->msg;
            *op = whole;
            *data = self->msg;
            *size = self->msg_size;
            self->msg = NULL;
            self->msg_size = self->msg_cap = 0;
            self->msg_op = SBX_WS_CONTINUATION;
            return 1;
        }
    }
    *close_code = SBX_WS_CLOSE_PROTOCOL;
    snprintf (why, why_size, "the connection broke the protocol earlier");
    return -1;
}

//  --------------------------------------------------------------------------
//  Self-test

static int s_next (sbx_ws_t *ws, sbx_ws_op_t *op, const uint8_t **data, size_t *size,
                   uint16_t *code)
{
    char why[200];
    return sbx_ws_next (ws, op, data, size, code, why, sizeof why);
}

void sbx_ws_test (bool verbose)
{
    (void) verbose;
    //  RFC 6455 section 1.3's example handshake.
    char accept[SBX_WS_ACCEPT_SIZE];
    assert (sbx_ws_accept ("dGhlIHNhbXBsZSBub25jZQ==", accept) == 0);
    assert (strcmp (accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") == 0);
    assert (sbx_ws_accept ("short", accept) == -1);
    assert (sbx_ws_accept ("aGVsbG8=", accept) == -1); //  5 bytes, not 16
    assert (sbx_ws_accept (NULL, accept) == -1);
    char key[SBX_WS_KEY_SIZE], other[SBX_WS_KEY_SIZE];
    sbx_ws_key_new (key);
    sbx_ws_key_new (other);
    assert (strlen (key) == 24 && strcmp (key, other) != 0);
    assert (sbx_ws_accept (key, accept) == 0);

    //  RFC 6455 section 5.7: a masked "Hello" from a client, an unmasked one from a server.
    static const uint8_t masked_hello[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d,
                                           0x7f, 0x9f, 0x4d, 0x51, 0x58};
    sbx_ws_t *server = sbx_ws_new (true, 1 << 20);
    sbx_ws_op_t op;
    const uint8_t *data;
    size_t size;
    uint16_t code = 0;
    //  Byte by byte: nothing until the whole frame is there.
    for (size_t i = 0; i < sizeof masked_hello - 1; i++) {
        assert (sbx_ws_feed (server, masked_hello + i, 1) == 0);
        assert (s_next (server, &op, &data, &size, &code) == 0);
    }
    assert (sbx_ws_feed (server, masked_hello + sizeof masked_hello - 1, 1) == 0);
    assert (s_next (server, &op, &data, &size, &code) == 1);
    assert (op == SBX_WS_TEXT && size == 5 && memcmp (data, "Hello", 5) == 0);
    assert (s_next (server, &op, &data, &size, &code) == 0);
    assert (sbx_ws_held (server) == 0);

    //  Fragments ("Hel" + "lo") with a ping between them, fed at once, from our encoder.
    sbx_ws_t *client = sbx_ws_new (false, 1 << 20);
    static const uint8_t frag[] = {0x01, 0x03, 'H',  'e',  'l', 0x89,
                                   0x01, 'x',  0x80, 0x02, 'l', 'o'};
    assert (sbx_ws_feed (client, frag, sizeof frag) == 0);
    assert (s_next (client, &op, &data, &size, &code) == 1);
    assert (op == SBX_WS_PING && size == 1 && data[0] == 'x');
    assert (s_next (client, &op, &data, &size, &code) == 1);
    assert (op == SBX_WS_TEXT && size == 5 && memcmp (data, "Hello", 5) == 0);

    //  Every length encoding, both directions, masked and not.
    size_t sizes[] = {0, 1, 125, 126, 65535, 65536, 300000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *body = malloc (sizes[i] + 1);
        for (size_t j = 0; j < sizes[i]; j++)
            body[j] = (uint8_t) (j * 7);
        size_t fsize;
        uint8_t *frame = sbx_ws_frame (SBX_WS_BINARY, body, sizes[i], true, &fsize);
        assert (frame && sbx_ws_feed (server, frame, fsize) == 0);
        free (frame);
        assert (s_next (server, &op, &data, &size, &code) == 1);
        assert (op == SBX_WS_BINARY && size == sizes[i] && memcmp (data, body, size) == 0);
        frame = sbx_ws_frame (SBX_WS_BINARY, body, sizes[i], false, &fsize);
        assert (frame && sbx_ws_feed (client, frame, fsize) == 0);
        free (frame);
        assert (s_next (client, &op, &data, &size, &code) == 1);
        assert (op == SBX_WS_BINARY && size == sizes[i] && memcmp (data, body, size) == 0);
        free (body);
    }
    //  Close frames: code and reason; a reason cut at 123 bytes without splitting UTF-8.
    size_t fsize;
    uint8_t *frame = sbx_ws_close_frame (SBX_WS_CLOSE_NORMAL, "bye", false, &fsize);
    assert (sbx_ws_feed (client, frame, fsize) == 0);
    free (frame);
    assert (s_next (client, &op, &data, &size, &code) == 1);
    assert (op == SBX_WS_CLOSE && sbx_ws_close_code (data, size) == 1000);
    assert (size == 5 && memcmp (data + 2, "bye", 3) == 0);
    assert (sbx_ws_close_code (NULL, 0) == 1005);
    char long_reason[300] = "";
    while (strlen (long_reason) < 250)
        strcat (long_reason, "é");
    frame = sbx_ws_close_frame (SBX_WS_CLOSE_POLICY, long_reason, true, &fsize);
    assert (frame && sbx_ws_feed (server, frame, fsize) == 0);
    free (frame);
    assert (s_next (server, &op, &data, &size, &code) == 1);
    assert (op == SBX_WS_CLOSE && size <= 125 && sbx_ws_close_code (data, size) == 1008);
    assert (sbx_meta_utf8_valid ((const char *) data + 2, size - 2));
    assert (!sbx_ws_frame (SBX_WS_PING, long_reason, 200, false, &fsize));
    sbx_ws_destroy (&client);
    sbx_ws_destroy (&server);

    //  What the RFC refuses, each with its close code.
    struct {
        bool server;
        uint8_t bytes[16];
        size_t size;
        uint16_t code;
    } bad[] = {
        {true, {0x81, 0x01, 'x'}, 3, SBX_WS_CLOSE_PROTOCOL},                        //  unmasked
        {false, {0x81, 0x81, 1, 2, 3, 4, 'x'}, 7, SBX_WS_CLOSE_PROTOCOL},           //  masked
        {false, {0xc1, 0x01, 'x'}, 3, SBX_WS_CLOSE_PROTOCOL},                       //  RSV1
        {false, {0x83, 0x00}, 2, SBX_WS_CLOSE_PROTOCOL},                            //  opcode 3
        {false, {0x09, 0x00}, 2, SBX_WS_CLOSE_PROTOCOL},                            //  split ping
        {false, {0x89, 0x7e, 0x00, 0x80}, 4, SBX_WS_CLOSE_PROTOCOL},                //  long ping
        {false, {0x80, 0x01, 'x'}, 3, SBX_WS_CLOSE_PROTOCOL},                       //  lone cont.
        {false, {0x01, 0x01, 'x', 0x81, 0x01, 'y'}, 6, SBX_WS_CLOSE_PROTOCOL},      //  interleaved
        {false, {0x81, 0x02, 0xc3, 0x28}, 4, SBX_WS_CLOSE_BAD_DATA},                //  not UTF-8
        {false, {0x88, 0x01, 0x03}, 3, SBX_WS_CLOSE_PROTOCOL},                      //  1-byte close
        {false, {0x82, 0x7f, 0, 0, 0, 0, 0, 0x10, 0, 0}, 10, SBX_WS_CLOSE_TOO_BIG}, //  1 MiB
        {false,
         {0x82, 0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
         10,
         SBX_WS_CLOSE_TOO_BIG}, //  2^63 - 1: no wrap around past the limit
        {false,
         {0x82, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
         10,
         SBX_WS_CLOSE_PROTOCOL}, //  the top bit
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sbx_ws_t *ws = sbx_ws_new (bad[i].server, 1000);
        assert (sbx_ws_feed (ws, bad[i].bytes, bad[i].size) == 0);
        int rc = s_next (ws, &op, &data, &size, &code);
        if (rc == 1 && i == 7)
            rc = s_next (ws, &op, &data, &size, &code); //  never: "x" alone is unfinished
        assert (rc == -1 && code == bad[i].code);
        assert (s_next (ws, &op, &data, &size, &code) == -1); //  spent
        sbx_ws_destroy (&ws);
    }
    sbx_ws_destroy (&server);
}
