/*  brk_events - see brk_events.h */
#include "brk_events.h"

#include <assert.h>

#define S_LISTENERS_MAX 8

struct brk_events_t {
    brk_store_t *store;
    zsock_t *tap;
    zlistx_t *queued;  //  event messages committed with the open transaction
    zlistx_t *deliver; //  published, not yet shown to the listeners
    bool delivering;   //  a listener's own commit leaves its events to the loop below
    struct {
        brk_events_fn *fn;
        void *arg;
    } listeners[S_LISTENERS_MAX];
    size_t listener_count;
};

static void s_msg_free (void **item)
{
    sbx_msg_destroy ((sbx_msg_t **) item);
}

brk_events_t *brk_events_new (brk_store_t *store, zsock_t *tap)
{
    brk_events_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->store = store;
    self->tap = tap;
    self->queued = zlistx_new ();
    self->deliver = zlistx_new ();
    if (!self->queued || !self->deliver) {
        zlistx_destroy (&self->queued);
        zlistx_destroy (&self->deliver);
        free (self);
        return NULL;
    }
    zlistx_set_destructor (self->queued, s_msg_free);
    zlistx_set_destructor (self->deliver, s_msg_free);
    return self;
}

void brk_events_destroy (brk_events_t **self_p)
{
    assert (self_p);
    brk_events_t *self = *self_p;
    if (!self)
        return;
    zlistx_destroy (&self->queued);
    zlistx_destroy (&self->deliver);
    free (self);
    *self_p = NULL;
}

int brk_events_begin (brk_events_t *self)
{
    zlistx_purge (self->queued);
    return brk_store_begin (self->store);
}

int brk_events_add (brk_events_t *self, sbx_msg_t **payload_p, const char *account,
                    const char *subject)
{
    sbx_msg_t *payload = *payload_p;
    *payload_p = NULL;
    uint8_t *data = NULL;
    size_t size = 0;
    sbx_err_t err;
    if (sbx_msg_encode (payload, &data, &size, &err)) {
        sbx_error ("event %s not encodable: %s", sbx_msg_type_name (payload->type), err.message);
        sbx_msg_destroy (&payload);
        return -1;
    }
    const char *type = sbx_msg_type_name (payload->type);
    uint64_t ts = sbx_clock_now_ms ();
    uint64_t seq = 0;
    int rc = brk_store_event_append (self->store, type, account, subject, data, size, ts, &seq);
    if (rc == 0) {
        sbx_msg_t *event = sbx_msg_new (SBX_MSG_EVENT);
        sbx_event_t *body = sbx_msg_event (event);
        body->seq = seq;
        body->ts_ms = ts;
        sbx_str_set (&body->type, type);
        sbx_str_set (&body->account, account);
        sbx_str_set (&body->subject, subject);
        //  Keep the encoded payload: that is what the log holds, byte for byte.
        body->payload.data = data;
        body->payload.size = size;
        data = NULL;
        zlistx_add_end (self->queued, event);
    }
    free (data);
    sbx_msg_destroy (&payload);
    return rc;
}

int brk_events_commit (brk_events_t *self)
{
    if (brk_store_commit (self->store)) {
        brk_store_rollback (self->store);
        zlistx_purge (self->queued);
        return -1;
    }
    sbx_msg_t *event;
    while ((event = zlistx_detach (self->queued, NULL))) {
        uint8_t *data = NULL;
        size_t size = 0;
        sbx_err_t err;
        if (sbx_msg_encode (event, &data, &size, &err) == 0) {
            //  PUB never blocks: a subscriber too slow to keep up loses live events and
            //  finds them again by replay.
            zsock_send (self->tap, "sb", sbx_msg_event (event)->type, data, size);
        }
        free (data);
        if (self->listener_count)
            zlistx_add_end (self->deliver, event);
        else
            sbx_msg_destroy (&event);
    }
    if (self->delivering)
        return 0;
    self->delivering = true;
    while ((event = zlistx_detach (self->deliver, NULL))) {
        for (size_t i = 0; i < self->listener_count; i++)
            self->listeners[i].fn (sbx_msg_event (event), self->listeners[i].arg);
        sbx_msg_destroy (&event);
    }
    self->delivering = false;
    return 0;
}

int brk_events_listen (brk_events_t *self, brk_events_fn *fn, void *arg)
{
    if (!self || !fn || self->listener_count == S_LISTENERS_MAX)
        return -1;
    self->listeners[self->listener_count].fn = fn;
    self->listeners[self->listener_count].arg = arg;
    self->listener_count++;
    return 0;
}

void brk_events_rollback (brk_events_t *self)
{
    brk_store_rollback (self->store);
    zlistx_purge (self->queued);
}

sbx_msg_t *brk_events_row_to_msg (const brk_event_row_t *row)
{
    sbx_msg_t *event = sbx_msg_new (SBX_MSG_EVENT);
    if (!event)
        return NULL;
    sbx_event_t *body = sbx_msg_event (event);
    body->seq = row->seq;
    body->ts_ms = row->ts_ms;
    if (sbx_str_set (&body->type, row->type) || sbx_str_set (&body->account, row->account) ||
        sbx_str_set (&body->subject, row->subject) ||
        (row->payload && sbx_bytes_set (&body->payload, row->payload, row->payload_size)))
        sbx_msg_destroy (&event);
    return event;
}
