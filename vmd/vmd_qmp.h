/*  vmd_qmp - one persistent QMP connection to one QEMU, driven from a zloop.

    The only module in sbx that speaks or parses QMP. QEMU serves one QMP client at a
    time, so vmd keeps exactly one connection per guest and matches replies by id while
    events interleave. Everything is non-blocking: connect (retried while QEMU has not
    created its socket yet), reads (partial lines buffered, over-long lines reset the
    connection) and writes (queued). Anything QEMU sends that is not what QMP promises
    is logged and survived.

        vmd_qmp_t *qmp = vmd_qmp_new (loop, "vms/x/qmp.sock");
        vmd_qmp_set_handlers (qmp, on_ready, on_event, on_closed, ctx);
        ...in on_ready: vmd_qmp_stop (qmp, on_stopped, ctx);

    Callbacks run from the loop, never from inside a vmd_qmp_* call. A callback must not
    destroy the vmd_qmp_t that called it; schedule that (e.g. a zero-delay zloop timer).
*/
#ifndef VMD_QMP_H_INCLUDED
#define VMD_QMP_H_INCLUDED

#include <czmq.h>
#include <jansson.h>
#include <stdbool.h>

typedef struct _vmd_qmp_t vmd_qmp_t;

//  A command's answer. On success error is NULL and result is QMP's "return" value
//  (borrowed: json_incref it to keep it). On failure result is NULL and error says
//  why: "<class>: <desc>" from QEMU, "timeout", or "connection closed: <reason>".
typedef void (vmd_qmp_reply_fn) (vmd_qmp_t *self, json_t *result, const char *error, void *arg);
//  An asynchronous event (STOP, RESUME, SHUTDOWN, MIGRATION...); data is borrowed and
//  may be NULL.
typedef void (vmd_qmp_event_fn) (vmd_qmp_t *self, const char *event, json_t *data, void *arg);
//  Ready: the greeting was read and capabilities negotiated; commands now go out.
typedef void (vmd_qmp_ready_fn) (vmd_qmp_t *self, void *arg);
//  Closed: the connection is gone for good (QEMU exited or misbehaved, or it never
//  came up within the connect timeout). Pending commands were failed first.
typedef void (vmd_qmp_closed_fn) (vmd_qmp_t *self, const char *reason, void *arg);

//  Starts connecting to socket_path from loop; retries ENOENT/ECONNREFUSED for up to
//  10 s (vmd_qmp_set_connect_timeout). NULL only on bad arguments or no memory.
vmd_qmp_t *vmd_qmp_new (zloop_t *loop, const char *socket_path);
//  Closes the connection without calling any callback for it or its commands.
void vmd_qmp_destroy (vmd_qmp_t **self_p);

void vmd_qmp_set_handlers (vmd_qmp_t *self, vmd_qmp_ready_fn *ready, vmd_qmp_event_fn *event,
                           vmd_qmp_closed_fn *closed, void *arg);
void vmd_qmp_set_connect_timeout (vmd_qmp_t *self, int msecs);
//  Per-command reply timeout (default 10 s); applies to commands executed afterwards.
void vmd_qmp_set_timeout (vmd_qmp_t *self, int msecs);
//  Longest line accepted from QEMU (default 1 MiB); a longer one resets the connection.
void vmd_qmp_set_max_line (vmd_qmp_t *self, size_t bytes);

bool vmd_qmp_ready (vmd_qmp_t *self);
bool vmd_qmp_closed (vmd_qmp_t *self);

//  Sends command with arguments (stolen, may be NULL). fn (may be NULL) gets exactly
//  one answer. Commands issued before ready are queued. Returns 0, or -1 if the
//  connection is closed (arguments are freed; fn is not called).
int vmd_qmp_execute (vmd_qmp_t *self, const char *command, json_t *arguments, vmd_qmp_reply_fn *fn,
                     void *arg);
//  Same, with fd (dup'ed; the caller keeps its own) passed along with the command over
//  SCM_RIGHTS, as getfd/add-fd want.
int vmd_qmp_execute_fd (vmd_qmp_t *self, const char *command, json_t *arguments, int fd,
                        vmd_qmp_reply_fn *fn, void *arg);

//  Helpers for what vmd needs. Each returns like vmd_qmp_execute.
int vmd_qmp_query_status (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_stop (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_cont (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_migrate_cancel (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_quit (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);
//  HMP command line; result is its output text (HMP commands differ in how they fail).
int vmd_qmp_hmp (vmd_qmp_t *self, const char *command_line, vmd_qmp_reply_fn *fn, void *arg);
//  hostfwd_add/remove NETDEV tcp:HOST_ADDR:HOST_PORT-:GUEST_PORT (7.2 has no QMP
//  command), their HMP output turned into success or an error. -1 on bad arguments.
int vmd_qmp_hostfwd_add (vmd_qmp_t *self, const char *netdev, const char *host_addr, int host_port,
                         int guest_port, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_hostfwd_remove (vmd_qmp_t *self, const char *netdev, const char *host_addr,
                            int host_port, vmd_qmp_reply_fn *fn, void *arg);
//  migrate-set-parameters max-bandwidth (bytes/s).
int vmd_qmp_set_max_bandwidth (vmd_qmp_t *self, int64_t bytes_per_sec, vmd_qmp_reply_fn *fn,
                               void *arg);
//  migrate-set-capabilities for one capability, e.g. "x-ignore-shared": a memory state
//  without the RAM that lives in a shared memory backend (templates' clones).
int vmd_qmp_set_capability (vmd_qmp_t *self, const char *capability, bool state,
                            vmd_qmp_reply_fn *fn, void *arg);
//  Outgoing migration into fd (a file or pipe; dup'ed, the caller keeps its own):
//  getfd then migrate "fd:NAME". fn answers the migrate command (it only starts the
//  migration); poll vmd_qmp_query_migrate until "status" is "completed" or "failed".
int vmd_qmp_migrate_to_fd (vmd_qmp_t *self, int fd, vmd_qmp_reply_fn *fn, void *arg);
//  Incoming migration from fd into a QEMU started with -incoming defer.
int vmd_qmp_migrate_incoming_fd (vmd_qmp_t *self, int fd, vmd_qmp_reply_fn *fn, void *arg);
int vmd_qmp_query_migrate (vmd_qmp_t *self, vmd_qmp_reply_fn *fn, void *arg);

void vmd_qmp_test (bool verbose);

#endif
