/*  sbx_xfer - a file to or from a guest, chunk by chunk.

    The guest agent takes and gives at most 1 MiB per request; a file of up to 16 MiB
    goes as a series of agent.file.read or agent.file.write requests. sbx_xfer plans them
    and gathers the answers, for every door that moves files (REST, MCP, the CLI), which
    only sends what sbx_xfer_next gives and hands back each answer with its offset.

    A write's first chunk goes alone, and short (SBX_XFER_FIRST: it truncates and sets
    the mode); a read sends a window at once (past the end a chunk comes back empty);
    then up to SBX_XFER_WINDOW chunks are in flight at once, each naming
    its offset, so that the hops between the door and the guest all work at the same
    time and the answers may come in any order. Memory stays bounded: a write holds its
    file, a read the file read so far. A caller that sends one request at a time and
    waits for its answer (the CLI) gets the chunks one after the other, as before.
*/
#ifndef SBX_XFER_H_INCLUDED
#define SBX_XFER_H_INCLUDED

#include "sbx_common.h"

#define SBX_XFER_CHUNK  (1024 * 1024)      //  the agent's per-request limit
#define SBX_XFER_MAX    (16 * 1024 * 1024) //  read_file's and write_file's limit
#define SBX_XFER_FIRST  (64 * 1024)        //  a write's first chunk, which goes alone
#define SBX_XFER_WINDOW 8                  //  chunks in flight at most

typedef struct sbx_xfer_t sbx_xfer_t;

//  Reading path (an absolute path in the guest), at most SBX_XFER_MAX bytes.
sbx_xfer_t *sbx_xfer_new_read (const char *path);

//  Writing size bytes of data (copied) to path, replacing the file; mode: permission
//  bits, or 0 for the agent's default (0644 for a new file). NULL when size is over
//  SBX_XFER_MAX.
sbx_xfer_t *sbx_xfer_new_write (const char *path, const void *data, size_t size, uint64_t mode);

//  The same with the bytes taken (malloc'd; *data_p set to NULL on success): a 10 MiB
//  body is not copied again (NULL with nothing taken when size is over SBX_XFER_MAX).
sbx_xfer_t *sbx_xfer_new_write_take (const char *path, uint8_t **data_p, size_t size,
                                     uint64_t mode);

void sbx_xfer_destroy (sbx_xfer_t **self_p);

//  The next agent request to send now (the caller owns it) and in *offset_p its offset,
//  which identifies its answer to sbx_xfer_take; NULL when none may go now: the transfer
//  is complete (sbx_xfer_done), SBX_XFER_WINDOW requests are in flight, or the first
//  chunk's answer is awaited. Call it again after each sbx_xfer_take.
sbx_msg_t *sbx_xfer_next (sbx_xfer_t *self, uint64_t *offset_p);

//  Takes the answer to the request sent for offset: 0, then call sbx_xfer_next; -1 with
//  a code and a message a person can act on (too_large for a file over the limit,
//  internal for an answer of another type or an offset not in flight). After -1 the
//  transfer is over: drop the other answers.
int sbx_xfer_take (sbx_xfer_t *self, uint64_t offset, const sbx_msg_t *reply, sbx_code_t *code,
                   char *why, size_t why_size);

//  Every chunk answered: the file is written, or all read.
bool sbx_xfer_done (sbx_xfer_t *self);

//  A write that failed after its first chunk may have later chunks written past a gap
//  (they were in flight together). The request (the caller owns it) that cuts the file
//  back to the bytes written without a gap, so that a failed write leaves what the
//  chunks one after the other left: a prefix of the file, never a file of the full size
//  with a hole. Sent after the chunks in flight, it reaches the agent after them (one
//  ordered path). NULL when there is nothing to cut (a read, or no chunk beyond a gap
//  may have been written).
sbx_msg_t *sbx_xfer_cut (sbx_xfer_t *self);

//  A read whose first answer is in: from now on it ends at the size that answer said
//  (a file that grows meanwhile is read as it was at that size; one that shrinks ends
//  where a short answer says), so that a door can promise that length before the rest
//  comes (REST's GET streams). Returns that size, or -1 (a write, no answer yet, or the
//  transfer failed).
int64_t sbx_xfer_fix (sbx_xfer_t *self);

//  A read: the file's size as the agent said it last (0 before the first answer).
size_t sbx_xfer_expected (sbx_xfer_t *self);

//  A read's bytes from the start that are all in, with no chunk missing: what may be
//  passed on before the transfer is done (sbx_xfer_data holds them; the pointer may
//  change after the next sbx_xfer_take).
size_t sbx_xfer_ready (sbx_xfer_t *self);

//  What was read (or is being written): the bytes, their count, the path.
const uint8_t *sbx_xfer_data (sbx_xfer_t *self);
size_t sbx_xfer_size (sbx_xfer_t *self);
const char *sbx_xfer_path (sbx_xfer_t *self);
//  Takes the bytes read (malloc'd, one byte past them NUL), leaving none; *size_p their
//  count.
uint8_t *sbx_xfer_take_data (sbx_xfer_t *self, size_t *size_p);

//  Asks the kernel for huge pages under the whole 2 MiB pages of a buffer of size bytes
//  (malloc'd, not written yet): a file's 10 MiB buffers fault in 5 pages instead of
//  2,560, which on a virtualised host were the largest item of the gateway's CPU
//  (bench/notes.md). Transparent huge pages are "madvise" on Debian: nothing else asks.
void sbx_xfer_advise_huge (void *data, size_t size);

void sbx_xfer_test (bool verbose);

#endif
