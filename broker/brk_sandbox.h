/*  brk_sandbox - sandboxes: records, the state machine, and scheduling onto vmds.

    A sandbox moves through creating, ready, stopping, stopped, resuming, deleting,
    deleted and error. Users ask for stop, resume and delete; vmd answers (vm.*.ok or an
    error) or reports a guest that died (vm.failed). The transitions are one table in
    brk_sandbox.c; every one is written with its sandbox.changed event in one
    transaction. A request that needs vmd is answered when vmd has answered: the
    handler returns NULL and the reply goes out later through ctx->send.

    Creating picks the connected vmd with the most room (capacity from its hello,
    occupancy from the store); with none, the answer is `unavailable`. Sandboxes of
    other accounts are `not_found`; operators (admin callers) see all.
*/
#ifndef BRK_SANDBOX_H_INCLUDED
#define BRK_SANDBOX_H_INCLUDED

#include "brk_ctx.h"

//  sandbox.create without a snapshot (brk_snapshot_create has those): returns the error
//  reply at once, or NULL (answered when vmd is done).
sbx_msg_t *brk_sandbox_create (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  A sandbox made from a snapshot: what snapshotd said of it (snap.use.ok).
typedef struct {
    char *sandbox_id; //  chosen before asking snapshotd, which records it
    char *dir;        //  the snapshot's files
    char *qemu_version;
    char *image;
    char *snapshot_id;
    char *vmd; //  the vmd that saved it: its host has the files (NULL: unknown)
    sbx_sandbox_type_t type;
} brk_origin_t;
void brk_origin_destroy (brk_origin_t **origin_p);

//  The create of request from origin's files, placed on the vmd that saved them.
sbx_msg_t *brk_sandbox_create_from (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request,
                                    const brk_origin_t *origin);
//  Takes the answer to a create (sandbox.create.ok, or the error) that no client waits
//  for: a fork's copies (brk_fork).
typedef void (brk_sandbox_done_fn) (brk_ctx_t *ctx, sbx_msg_t **reply_p, void *arg);

//  A fork's copy: the create of request (a sandbox.create with the copy's settings and
//  the caller) from origin's files, origin->sandbox_id its id; `done` gets the answer once
//  vmd gave it. The error reply when refused at once (done is not called), else NULL.
sbx_msg_t *brk_sandbox_create_copy (brk_ctx_t *ctx, sbx_msg_t *request, const brk_origin_t *origin,
                                    brk_sandbox_done_fn *done, void *arg);

//  How many more sandboxes the vmd instance `vmd` takes now (its capacity less those it
//  runs): 0, or -1 when that vmd is not connected.
int brk_sandbox_room (brk_ctx_t *ctx, const char *vmd, uint64_t *room);

//  Deletes a sandbox on the broker's own account, with `reason` (a fork's copies when
//  one of them failed): vm.delete is asked, nobody waits for it. 0, or -1 when the
//  sandbox can't be deleted now (logged).
int brk_sandbox_discard (brk_ctx_t *ctx, const char *id, const char *reason);

//  The account a create is for (an operator may name one by email): NULL and *owner, or
//  the error reply.
sbx_msg_t *brk_sandbox_owner (brk_ctx_t *ctx, const sbx_msg_t *request, brk_account_t *owner);
//  The refusal of a create the caller's key may not make, or NULL.
sbx_msg_t *brk_sandbox_refuse_create (const sbx_msg_t *request);

//  sandbox.get and sandbox.list: always answered at once.
sbx_msg_t *brk_sandbox_get (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_sandbox_list (brk_ctx_t *ctx, sbx_msg_t *request);

//  sandbox.stop, sandbox.resume, sandbox.delete: the reply, or NULL when it waits on vmd.
sbx_msg_t *brk_sandbox_change (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  sandbox.extend (a new TTL from now) and sandbox.update (name, labels, autoResume,
//  egress rules): at once, but new egress rules for a ready guest wait on its vmd
//  (vm.egress; NULL then, and the answer follows). Other states but stopped refuse them.
sbx_msg_t *brk_sandbox_extend (brk_ctx_t *ctx, sbx_msg_t *request);
sbx_msg_t *brk_sandbox_update (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  sandbox.wake from a gateway's port proxy (trusted: the peer is a gateway): resumes a
//  stopped sandbox whose autoResume is on, for a published port, as its owner (plan and
//  wallet checked); answered once it is ready, at once when it already is. NULL when
//  the answer comes later.
sbx_msg_t *brk_sandbox_wake (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request, bool trusted);

//  Stops every ready sandbox whose TTL deadline has passed (ttl.expired events), whose
//  account's wallet is empty, or whose account is disabled. The broker calls it four
//  times a second.
void brk_sandbox_tick (brk_ctx_t *ctx);

//  sandbox.agent: an agent request for a ready sandbox, relayed to its vmd; answered
//  when the agent has answered (returns NULL), or refused at once.
sbx_msg_t *brk_sandbox_agent (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  The sandbox `id` as the caller of `request` may see it (not deleted, their account,
//  their key for a ci key): 0 and the record, or -1 and *error (not_found, ...).
int brk_sandbox_find (brk_ctx_t *ctx, const sbx_msg_t *request, const char *id,
                      brk_sandbox_t *record, sbx_msg_t **error);

//  The wire form of a sandbox (labels and published ports included), fresh, or NULL.
sbx_sandbox_info_t *brk_sandbox_info (brk_ctx_t *ctx, const brk_sandbox_t *record);

//  vm.failed from the vmd instance `vmd`: its guest died; the sandbox goes to error.
void brk_sandbox_vm_failed (brk_ctx_t *ctx, const char *vmd, sbx_msg_t *msg);

//  A host lost (broker/brk_hostloss.h). Its sandboxes' reason starts with this.
#define BRK_HOST_LOST "host lost"
//  Whether a record is in error because its host was lost.
bool brk_sandbox_is_lost (const brk_sandbox_t *record);
//  Its vmd silent since at_ms (wall clock): a ready or stopped sandbox of vmd goes to
//  error with reason (which starts with BRK_HOST_LOST), its event saying at_ms (billing
//  ends there). Nothing when it is elsewhere, moving, or in another state. 0 or -1.
int brk_sandbox_host_lost (brk_ctx_t *ctx, const char *id, const char *vmd, uint64_t at_ms,
                           const char *reason);
//  Its vmd back: a lost sandbox follows what vmd has (vm.list: found, guest): ready when
//  the guest runs, stopped when it is stopped; else it stays in error, saying why, no
//  longer lost. 0 or -1.
int brk_sandbox_host_back (brk_ctx_t *ctx, const char *id, const char *vmd, bool found,
                           sbx_sandbox_state_t guest);

void brk_sandbox_test (bool verbose);

//  True while a vm.* request of this broker about sandbox id waits on its vmd.
bool brk_sandbox_in_flight (brk_ctx_t *ctx, const char *id);

//  A sandbox left on its way (creating, stopping, resuming, deleting) by a broker before
//  this one, its request cut, settled by what its vmd says of its guest (found, guest,
//  guest_reason: vm.list): the state the request would have led to when the guest is
//  there; the request again when vmd never got it (nobody waits for that answer); error
//  when the guest is gone (a delete: deleted). Nothing when this broker's own request is
//  in flight or the record moved on. 0, 1 when vmd is at it still (ask again later), -1.
int brk_sandbox_settle (brk_ctx_t *ctx, const char *id, const char *vmd, bool found,
                        sbx_sandbox_state_t guest, const char *guest_reason);

#endif
