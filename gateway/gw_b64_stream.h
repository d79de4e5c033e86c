/*  gw_b64_stream - an HTTP answer made of a head, the base64 of a file that is still
    being read, and a tail: an MCP read_file of a large file (gw_mcp), sent as the
    file's chunks come instead of after the last one, as GET /files is (gw_rest).

    The file's length is fixed when the first chunk comes (sbx_xfer_fix), and base64 of
    n bytes is 4 * ceil (n / 3) characters, so the answer has its Content-Length before
    its first byte: the client reads one plain JSON body. Pieces of the file a multiple
    of 3 bytes long encode to pieces of the whole file's base64; only the last piece
    carries padding. A read that fails after the head went out ends the body short
    (the connection closes): a client sees a broken answer, never a wrong one.
*/
#ifndef GW_B64_STREAM_H_INCLUDED
#define GW_B64_STREAM_H_INCLUDED

#include "gw_http.h"

typedef struct gw_b64_stream_t gw_b64_stream_t;

//  The client left while the owner held the stream: the owner ends it (ok false).
typedef void (gw_b64_stream_closed_fn) (void *arg);

//  Starts req's answer: 200, content_type, a body of head, the base64 of length bytes,
//  then tail (both copied), and queues the head. NULL when the answer cannot start
//  (the request was answered, or the client is gone): req is then left as it was.
gw_b64_stream_t *gw_b64_stream_new (gw_request_t *req, const char *content_type, const char *head,
                                    size_t head_size, uint64_t length, const char *tail,
                                    size_t tail_size, gw_b64_stream_closed_fn *closed, void *arg);

//  The file's first ready bytes are in data (borrowed: valid until the next feed, take
//  or end): queues the base64 of what is whole and fits; the drain callback sends more.
void gw_b64_stream_feed (gw_b64_stream_t *self, const uint8_t *data, size_t ready);

//  All length bytes (taken: malloc'd, *data_p set to NULL; held until sent).
void gw_b64_stream_take (gw_b64_stream_t *self, uint8_t **data_p);

//  The owner lets go. ok, with every byte taken: the rest and the tail go out, then the
//  answer ends and the stream frees itself; a client that leaves before the end is logged
//  with left (copied; NULL: not logged), since no owner hears of it any more. Otherwise
//  the body is cut short now.
void gw_b64_stream_end (gw_b64_stream_t **self_p, bool ok, const char *left);

//  Content-Length of such an answer.
uint64_t gw_b64_stream_size (size_t head_size, uint64_t length, size_t tail_size);

void gw_b64_stream_test (bool verbose);

#endif
