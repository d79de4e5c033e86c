/*  brk_pending - requests the broker routed to a worker and waits on.

    The broker gives each routed request its own rid (clients choose theirs, so two
    clients' rids may collide), remembers who asked and under which rid, and the
    deadline. The worker's reply comes back with the broker's rid, is matched here and
    forwarded with the client's rid. A request whose deadline passes is answered
    `timeout`; a worker that goes away has its requests answered `unavailable`.
*/
#ifndef BRK_PENDING_H_INCLUDED
#define BRK_PENDING_H_INCLUDED

#include "sbx_common.h"

//  The broker's own requests (to vmd, say) end in a callback instead of a client: it
//  gets the worker's reply or an error the broker made (timeout, unavailable).
typedef void (brk_pending_fn) (sbx_msg_t **reply_p, void *arg);

typedef struct {
    uint64_t rid;        //  the broker's rid, sent to the worker
    uint64_t client_rid; //  the client's rid, restored on the reply
    zframe_t *client;    //  the client's routing id (NULL for the broker's own)
    char *worker;        //  the worker's routing id (hex), to fail on its loss
    char *what;          //  "sys.status to vmd host-a", for messages and logs
    uint64_t deadline;   //  monotonic ms
    brk_pending_fn *fn;  //  the broker's own request: call this, not a client
    void *arg;
} brk_request_t;

typedef struct brk_pending_t brk_pending_t;

brk_pending_t *brk_pending_new (void);
void brk_pending_destroy (brk_pending_t **self_p);

//  Remembers a routed request; takes a copy of the client address. Returns the new
//  broker rid, or 0 on allocation failure.
uint64_t brk_pending_add (brk_pending_t *self, zframe_t *client, uint64_t client_rid,
                          const char *worker, const char *what, uint64_t deadline);

//  Remembers one of the broker's own requests: fn will get the answer.
uint64_t brk_pending_add_call (brk_pending_t *self, const char *worker, const char *what,
                               uint64_t deadline, brk_pending_fn *fn, void *arg);

//  Takes the request matching a reply from `worker` (hex routing id), or NULL when
//  there is none (late reply, or one that came from another worker than asked).
brk_request_t *brk_pending_take (brk_pending_t *self, uint64_t rid, const char *worker);

//  Takes one request whose deadline is before `now` (or, with worker set, one sent to
//  that worker), or NULL when none is left.
brk_request_t *brk_pending_take_expired (brk_pending_t *self, uint64_t now);
brk_request_t *brk_pending_take_worker (brk_pending_t *self, const char *worker);

//  Moves every deadline ms later: the broker did not run for that long, and the answers
//  may be waiting to be read (sbx_stall).
void brk_pending_postpone (brk_pending_t *self, uint64_t ms);

size_t brk_pending_size (brk_pending_t *self);

void brk_request_destroy (brk_request_t **self_p);

void brk_pending_test (bool verbose);

#endif
