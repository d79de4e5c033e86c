/*  sbx_xfer - a file to or from a guest, chunk by chunk.

    The guest agent takes and gives at most 1 MiB per request; a file of up to 16 MiB
    goes as a series of agent.file.read or agent.file.write requests, one after the
    other. sbx_xfer plans them and gathers the answers, for every door that moves files
    (REST, MCP, the CLI), which only sends what sbx_xfer_next gives.
*/
#ifndef SBX_XFER_H_INCLUDED
#define SBX_XFER_H_INCLUDED

#include "sbx_common.h"

#define SBX_XFER_CHUNK (1024 * 1024)      //  the agent's per-request limit
#define SBX_XFER_MAX   (16 * 1024 * 1024) //  read_file's and write_file's limit

typedef struct sbx_xfer_t sbx_xfer_t;

//  Reading path (an absolute path in the guest), at most SBX_XFER_MAX bytes.
sbx_xfer_t *sbx_xfer_new_read (const char *path);

//  Writing size bytes of data (copied) to path, replacing the file; mode: permission
//  bits, or 0 for the agent's default (0644 for a new file). NULL when size is over
//  SBX_XFER_MAX.
sbx_xfer_t *sbx_xfer_new_write (const char *path, const void *data, size_t size, uint64_t mode);

void sbx_xfer_destroy (sbx_xfer_t **self_p);

//  The next agent request to send (the caller owns it), or NULL when the transfer is
//  complete.
sbx_msg_t *sbx_xfer_next (sbx_xfer_t *self);

//  Takes the answer to the last request: 0, then call sbx_xfer_next; -1 with a code
//  and a message a person can act on (too_large for a file over the limit, internal
//  for an answer of another type).
int sbx_xfer_take (sbx_xfer_t *self, const sbx_msg_t *reply, sbx_code_t *code, char *why,
                   size_t why_size);

//  What was read (or is being written): the bytes, their count, the path.
const uint8_t *sbx_xfer_data (sbx_xfer_t *self);
size_t sbx_xfer_size (sbx_xfer_t *self);
const char *sbx_xfer_path (sbx_xfer_t *self);
//  Takes the bytes read (malloc'd, one byte past them NUL), leaving none; *size_p their
//  count.
uint8_t *sbx_xfer_take_data (sbx_xfer_t *self, size_t *size_p);

void sbx_xfer_test (bool verbose);

#endif
