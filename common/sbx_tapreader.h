/*  sbx_tapreader - follows the broker's event log: replay, then live, with no gap and
    no duplicate.

    It subscribes to the tap first, then replays from the sequence number it was given
    (events.replay through an sbx_peer), then applies live events. A live event that is
    not the next one (the reader was slow, the broker restarted between commit and
    publish, or the reader was away) triggers a replay from the last event applied; live
    events that arrive meanwhile are held and then applied or dropped as duplicates. A
    poll every second catches events published while the tap connection was down.
    The callback therefore sees every event of the log exactly once, in order.
*/
#ifndef SBX_TAPREADER_H_INCLUDED
#define SBX_TAPREADER_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>

#include "sbx_config.h"
#include "sbx_msg.h"
#include "sbx_peer.h"

//  Start at the end of the log: only events committed from now on.
#define SBX_TAPREADER_NOW UINT64_MAX

typedef struct sbx_tapreader_t sbx_tapreader_t;

//  Called once per event, in seq order. Return 0 to go on, -1 to stop delivering and end
//  the loop, 1 to stop delivering and leave the loop running (the owner will destroy
//  the reader, and perhaps start another one from where it is sure to be).
typedef int (sbx_tapreader_fn) (const sbx_event_t *event, void *arg);

//  after_seq: deliver events with seq > after_seq (SBX_TAPREADER_NOW for live only).
//  The peer (borrowed) carries the replay requests.
sbx_tapreader_t *sbx_tapreader_new (sbx_config_t *config, sbx_peer_t *peer, uint64_t after_seq,
                                    sbx_tapreader_fn *fn, void *arg);
void sbx_tapreader_destroy (sbx_tapreader_t **self_p);

int sbx_tapreader_start (sbx_tapreader_t *self, zloop_t *loop);

//  The seq of the last event delivered.
uint64_t sbx_tapreader_last_seq (sbx_tapreader_t *self);

//  True once the reader has replayed up to the end of the log at least once and has no
//  replay in flight: everything committed before that point has been delivered.
bool sbx_tapreader_caught_up (sbx_tapreader_t *self);

//  Events between the newest the reader heard of (a replay's last_seq, a live event)
//  and the last it delivered; 0 while it does not know yet where the log ends.
uint64_t sbx_tapreader_lag (sbx_tapreader_t *self);

//  How long it has been behind (lag > 0), in ms; 0 while it is level.
uint64_t sbx_tapreader_behind_ms (sbx_tapreader_t *self);

//  True when the callback asked to stop.
bool sbx_tapreader_stopped (sbx_tapreader_t *self);

#endif
