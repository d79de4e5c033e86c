/*  brk_events - the event log's write side and the tap.

    A state change and the event(s) describing it are written in one SQLite transaction:
    begin, change rows, brk_events_add (...) for each event, brk_events_commit. Only after
    the commit succeeds are the events published on the tap PUB socket, as
    [topic = event type][msgpack of an `event` message], in sequence order. A rollback
    forgets them. So the tap never shows an event that the log doesn't have, and a
    subscriber that misses some (it was down, or the broker crashed between commit and
    publish) finds them in the log by seq with events.replay.
    Parts of the broker that follow a change (snapshots follow their sandboxes) listen
    here rather than being called by the code that made it: each listener sees every
    committed event once, in order, after it is published and outside any transaction,
    so it may make changes of its own (their events reach it after the current ones).
*/
#ifndef BRK_EVENTS_H_INCLUDED
#define BRK_EVENTS_H_INCLUDED

#include "brk_store.h"
#include "sbx_common.h"

typedef struct brk_events_t brk_events_t;

//  Both arguments are borrowed and must outlive the events object.
brk_events_t *brk_events_new (brk_store_t *store, zsock_t *tap);
void brk_events_destroy (brk_events_t **self_p);

//  Starts a transaction. Returns 0 or -1.
int brk_events_begin (brk_events_t *self);

//  Appends the event `payload` (a message of an event type, e.g. account.created) to
//  the log inside the open transaction. Takes ownership of the payload. Returns 0 or -1.
int brk_events_add (brk_events_t *self, sbx_msg_t **payload_p, const char *account,
                    const char *subject);

//  Commits, then publishes what was added. Returns 0, or -1 (rolled back, nothing
//  published) when the commit failed.
int brk_events_commit (brk_events_t *self);
void brk_events_rollback (brk_events_t *self);

//  Calls fn (event borrowed for the call) for every event committed from now on.
typedef void (brk_events_fn) (const sbx_event_t *event, void *arg);
int brk_events_listen (brk_events_t *self, brk_events_fn *fn, void *arg);

//  Converts a stored row into an `event` message (for replay and the tap).
sbx_msg_t *brk_events_row_to_msg (const brk_event_row_t *row);

#endif
