/*  sbx_ws - WebSocket (RFC 6455) frames and handshake keys, without any I/O.

    Both ends of sbx's terminals use it: the gateway's terminal route (gw_terminal,
    server: unmasked frames out, masked ones in) and the CLI's `sbx sandbox shell`
    (cli_terminal, client: the other way round), so the framing is written once. The
    parser takes bytes as they arrive and hands out whole messages (fragments joined;
    control frames between fragments handed out at once) and refuses what the RFC
    refuses (reserved bits, unknown opcodes, unmasked client frames or masked server
    frames, control frames over 125 bytes or fragmented, text that is not UTF-8), and
    messages over its limit, saying which close code to answer with.
    The accept key's SHA-1 is GnuTLS's.
*/
#ifndef SBX_WS_H_INCLUDED
#define SBX_WS_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    SBX_WS_CONTINUATION = 0,
    SBX_WS_TEXT = 1,
    SBX_WS_BINARY = 2,
    SBX_WS_CLOSE = 8,
    SBX_WS_PING = 9,
    SBX_WS_PONG = 10
} sbx_ws_op_t;

//  Close codes (RFC 6455 section 7.4.1).
#define SBX_WS_CLOSE_NORMAL     1000
#define SBX_WS_CLOSE_GOING_AWAY 1001
#define SBX_WS_CLOSE_PROTOCOL   1002
#define SBX_WS_CLOSE_BAD_DATA   1007
#define SBX_WS_CLOSE_POLICY     1008
#define SBX_WS_CLOSE_TOO_BIG    1009
#define SBX_WS_CLOSE_INTERNAL   1011

#define SBX_WS_KEY_SIZE    25 //  Sec-WebSocket-Key: base64 of 16 random bytes, NUL
#define SBX_WS_ACCEPT_SIZE 29 //  Sec-WebSocket-Accept: base64 of a SHA-1, NUL

//  A fresh random Sec-WebSocket-Key (client).
void sbx_ws_key_new (char key[SBX_WS_KEY_SIZE]);

//  The Sec-WebSocket-Accept for a client's key. -1 when the key is not the base64 of
//  16 bytes (the server answers 400).
int sbx_ws_accept (const char *key, char accept[SBX_WS_ACCEPT_SIZE]);

//  One whole frame (FIN set) in a new buffer of *size_p bytes; masked with a random
//  key when mask (clients must). NULL when out of memory, or for a control frame over
//  125 bytes.
uint8_t *sbx_ws_frame (sbx_ws_op_t op, const void *data, size_t size, bool mask, size_t *size_p);

//  A close frame with a code and a reason (cut to fit 125 bytes).
uint8_t *sbx_ws_close_frame (uint16_t code, const char *reason, bool mask, size_t *size_p);

//  The code of a close message's payload: 1005 (none given) when it has none.
uint16_t sbx_ws_close_code (const uint8_t *data, size_t size);

typedef struct sbx_ws_t sbx_ws_t;

//  A parser for frames sent to a server (masked ones required) or to a client (masked
//  ones refused). Messages over max_message bytes are refused (1009).
sbx_ws_t *sbx_ws_new (bool server, size_t max_message);
void sbx_ws_destroy (sbx_ws_t **self_p);

//  Takes bytes read from the connection (copied). -1 when out of memory.
int sbx_ws_feed (sbx_ws_t *self, const void *data, size_t size);

//  The next whole message: 1 with *op (TEXT, BINARY, CLOSE, PING or PONG) and its
//  payload in *data, *size (unmasked, valid until the next call); 0 when more bytes
//  are needed; -1 when the peer broke the protocol: *close_code says what to close
//  with and why what it did. After -1 the parser is spent.
int sbx_ws_next (sbx_ws_t *self, sbx_ws_op_t *op, const uint8_t **data, size_t *size,
                 uint16_t *close_code, char *why, size_t why_size);

//  Bytes fed and not yet taken as messages.
size_t sbx_ws_held (const sbx_ws_t *self);

void sbx_ws_test (bool verbose);

#endif
