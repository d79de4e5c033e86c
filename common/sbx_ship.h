/*  sbx_ship - files shipped from one host to another.

    A stopped sandbox's files (its qcow2 overlay, a memory state of several GiB) move to
    another vmd host, and snapshot files are copied between hosts. The control plane only
    arranges a transfer; the bytes go host to host. The sending process runs a server,
    the receiving process a fetch, both actors with a thread and a socket of their own:

        //  Sender: files under root, the host's key pair.
        sbx_ship_server_t *server = sbx_ship_server_new ("tcp://0.0.0.0:7300", root, cert);
        const char *paths[] = {"sb_x/overlay.qcow2", "sb_x/memory.state"};
        sbx_ship_server_offer (server, ticket, paths, 2, 600000);
        //  Receiver: the sender's endpoint and public key, the same ticket.
        sbx_ship_fetch_t *fetch =
            sbx_ship_fetch_new (endpoint, public_key, cert, ticket, paths, 2, dest_dir);
        zloop_reader (loop, sbx_ship_fetch_sock (fetch), s_on_fetch, fetch);
        //  s_on_fetch: sbx_ship_fetch_recv says PROGRESS, then DONE or FAILED.

    Authorization is the ticket. The server is a CURVE server (the traffic is encrypted
    and the server proves its public key) that admits any client key, since the sender
    need not know the receiving host; a client reads only the paths offered under a
    ticket it presents: 32 or more random characters the caller (the broker) makes and
    hands to both ends. The server runs in a ZeroMQ context of its own with its own ZAP
    handler: ZAP is one per context, and czmq's zauth told to admit any key would admit
    any key on every CURVE socket of the process (the broker's too), while the one the
    process may already run admits only known hosts, which would refuse receivers.

    The server serves files under root only: paths are relative, without "." or ".."
    components or empty ones (sbx_ship_path_valid), and are opened one component at a
    time without following any symbolic link (a link under root is refused, wherever it
    points), regular files only.

    The wire: ZeroMQ multipart messages, the fetch's DEALER to the server's ROUTER.
    Integers are 8-byte big-endian frames; text frames hold no NUL. Every request starts
    with the frame "SHIP1" (protocol and version):

        request                         answer
        SHIP1 STAT ticket path          SIZE size          the file's size now
        SHIP1 OPEN ticket path          OPENED size        opened for this connection
        SHIP1 READ offset length        DATA offset bytes  length bytes, fewer at the end
                                        ZERO offset length the same, all zeros (not sent)
        SHIP1 CLOSE                     CLOSED sha256      the file's digest (64 hex)
        anything else or refused        ERROR reason       text a person can act on

    A connection has one file open at a time (OPEN closes the one before). READ asks for
    at most SBX_SHIP_CHUNK bytes. The server hashes what it reads as it sends it, and
    CLOSE answers the digest only when the file was read whole and in order, and did not
    change while it was sent (size, modification and change times as at OPEN). The
    digest is streamed, not computed at OPEN: that would read a multi-GiB file twice and
    stall the server's one thread, every other transfer with it, before the first byte.
    What it checks is that the fetch put together exactly the bytes the server read
    (offsets, skipped zeros, order); the bytes in transit are already authenticated by
    CURVE. An open file no request touches for a minute is closed.

    The fetch asks STAT for every path first (so a missing file fails before a byte
    moves, and the total is known), then fetches the files one after the other: OPEN,
    READs with up to SBX_SHIP_CREDIT of them in flight, CLOSE. Each file is written to
    dest_dir/<path>.part (mode 0600; missing directories are made, 0700), chunks of
    zeros skipped so that sparse files stay sparse, checked against the size and the
    digest, and fsynced. Once every file is, each .part is renamed to dest_dir/<path>
    (replacing a file there) and the directories are fsynced. On failure or cancel the
    .part files and the directories the fetch made are removed: no file of a fetch
    lands unless all do. Every answer is checked before use (the frames, the offset
    that comes next, the length asked, the size at most SBX_SHIP_FILE_MAX); what is
    written is named by the caller's paths only, never by the server.

    The fetch's pipe, read with sbx_ship_fetch_recv (or as text frames):
        PROGRESS done total     bytes received of all the files, and their total; at
                                most every 100 ms, once when the sizes are known (done 0)
                                and once complete, just before DONE
        DONE                    every file is in place
        FAILED reason           nothing of the fetch is left; the reason names the file
                                and what went wrong (the server's refusal, its silence,
                                a bad answer, a checksum mismatch, the disk)
    After DONE or FAILED the fetch says nothing more; destroy it. Destroying it before
    cancels the transfer and removes its files.
*/
#ifndef SBX_SHIP_H_INCLUDED
#define SBX_SHIP_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_SHIP_CHUNK      (256 * 1024) //  bytes a READ asks for
#define SBX_SHIP_CREDIT     8            //  requests a fetch has in flight at most
#define SBX_SHIP_PATHS_MAX  64           //  paths per ticket, and per fetch
#define SBX_SHIP_PATH_MAX   1024         //  bytes in a path
#define SBX_SHIP_TICKET_MIN 32           //  characters in a ticket (printable ASCII)
#define SBX_SHIP_TICKET_MAX 256          //
#define SBX_SHIP_FILE_MAX   (1ULL << 40) //  a fetch refuses a larger file (1 TiB)
#define SBX_SHIP_TIMEOUT_MS 10000        //  a fetch's default patience, see set_timeout

typedef struct sbx_ship_server_t sbx_ship_server_t;
typedef struct sbx_ship_fetch_t sbx_ship_fetch_t;

//  True when path is one the server and the fetch accept: relative, at most
//  SBX_SHIP_PATH_MAX bytes, components separated by single slashes, none "." or "..",
//  no control characters.
bool sbx_ship_path_valid (const char *path);

//  --------------------------------------------------------------------------
//  The server

//  Starts a server bound at bind (a ZeroMQ endpoint, e.g. "tcp://0.0.0.0:7300", or
//  "tcp://127.0.0.1:*" for a port of the system's choosing), a CURVE server with cert's
//  key pair (borrowed: copied), serving files under the directory root. NULL (logged)
//  when root cannot be opened or bind cannot be bound.
sbx_ship_server_t *sbx_ship_server_new (const char *bind, const char *root, zcert_t *cert);
//  Stops it: its connections close, transfers under way fail at their fetch.
void sbx_ship_server_destroy (sbx_ship_server_t **self_p);

//  The endpoint actually bound, e.g. "tcp://127.0.0.1:40123" (with a wildcard address
//  as given: receivers need the host's own address there).
const char *sbx_ship_server_endpoint (sbx_ship_server_t *self);

//  Lets a client presenting ticket (SBX_SHIP_TICKET_MIN to _MAX printable ASCII
//  characters, random, the caller's) fetch these count paths (valid, relative to root;
//  at most SBX_SHIP_PATHS_MAX) for ttl_ms milliseconds: a file opened by then may be
//  read to its end. The server keeps only the ticket's SHA-256. 0, or -1 for an invalid
//  argument or a ticket offered already and not expired.
int sbx_ship_server_offer (sbx_ship_server_t *self, const char *ticket, const char *const *paths,
                           size_t count, uint64_t ttl_ms);
//  Withdraws ticket: nothing more is opened with it, and files open under it are
//  closed (their next read is refused). 0, or -1 when no such ticket is offered.
int sbx_ship_server_withdraw (sbx_ship_server_t *self, const char *ticket);

//  --------------------------------------------------------------------------
//  The fetch

//  Starts fetching count paths (valid, at most SBX_SHIP_PATHS_MAX) from the server at
//  endpoint whose public key is server_key (z85, 40 characters), presenting ticket,
//  into the existing directory dest_dir. cert: this host's key pair (borrowed: copied),
//  or NULL for a new one (the server admits any key). NULL for an invalid argument;
//  anything that goes wrong later (dest_dir missing too) ends in FAILED.
sbx_ship_fetch_t *sbx_ship_fetch_new (const char *endpoint, const char *server_key, zcert_t *cert,
                                      const char *ticket, const char *const *paths, size_t count,
                                      const char *dest_dir);
//  Cancels the fetch if it is under way (its files are removed), and frees it.
void sbx_ship_fetch_destroy (sbx_ship_fetch_t **self_p);

//  The socket to wait on (zloop_reader, zpoller): readable when the fetch has
//  something to say.
zsock_t *sbx_ship_fetch_sock (sbx_ship_fetch_t *self);

//  How long the fetch waits for an answer before it fails, the server down,
//  unreachable or not holding the key given (the default SBX_SHIP_TIMEOUT_MS).
void sbx_ship_fetch_set_timeout (sbx_ship_fetch_t *self, uint32_t timeout_ms);

typedef enum { SBX_SHIP_PROGRESS, SBX_SHIP_DONE, SBX_SHIP_FAILED } sbx_ship_event_t;

//  Reads what the fetch says, without blocking: SBX_SHIP_PROGRESS with *done_p and
//  *total_p set, SBX_SHIP_DONE, or SBX_SHIP_FAILED with *reason_p (the caller's to free)
//  set; -1 when nothing is waiting. Any of the pointers may be NULL.
int sbx_ship_fetch_recv (sbx_ship_fetch_t *self, uint64_t *done_p, uint64_t *total_p,
                         char **reason_p);

void sbx_ship_test (bool verbose);

#endif
