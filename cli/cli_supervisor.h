/*  cli_supervisor - runs the sbx daemons as child processes and keeps them up (`sbx up`).

    Modelled on s6-supervise. A child says it is ready by writing "ready\n" to fd 3,
    which SBX_READY_FD names (see sbx_ready.h). Child exits and the supervisor's own
    SIGINT, SIGTERM and SIGHUP arrive through a signalfd in the caller's zloop, and each
    child's lifecycle is one state x event table in cli_supervisor.c.

    - Children start in the order added, each once the one before has been ready (the
      broker binds the sockets the others connect to). One that is not ready within
      the start timeout (60 s) is killed and restarted.
    - A child that exits is restarted after a backoff (0.25 s, doubling up to 30 s, back
      to 0.25 s once it has been ready for 60 s); the others are not touched. One that
      exits before it is ready several times in a row (set_give_up) stops them all.
    - SIGINT or SIGTERM stops the children one at a time in reverse order (SIGTERM, then
      SIGKILL after a 10 s grace), then ends the loop. A second one kills at once.
    - Each child's stdout and stderr are appended to <log_dir>/<name>.log, whose path
      it also finds in SBX_LOG_FILE (an sbx daemon opens it itself, see sbx_log.h, so
      that it can reopen it: cli_supervisor_set_logs). After every
      change the state is written atomically, as JSON, to status_path:
      {"supervisor_pid", "started_ms", "stopping", "daemons": [{"name", "pid" (null when
      not running), "ready", "state", "restarts", "started_ms", "log"}]}.

    Signals: cli_supervisor_start blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP in the
    calling thread. Threads inherit their creator's mask, so start the supervisor before
    anything creates threads (the first zsock or zactor starts libzmq's), or a signal may
    be delivered to a thread that does not block it. cli_supervisor_new calls
    zsys_handler_set (NULL) so that czmq installs no SIGINT/SIGTERM handlers of its own
    (they would set zsys_interrupted and end every zloop); a caller that creates czmq
    objects before the supervisor must call it first itself.

    Destroy the supervisor before the loop it was started on.
*/
#ifndef CLI_SUPERVISOR_H_INCLUDED
#define CLI_SUPERVISOR_H_INCLUDED

#include <czmq.h>

typedef struct _cli_supervisor_t cli_supervisor_t;

//  What cli_supervisor_set_event_fn reports after each change of a child's state.
typedef struct {
    const char *name;
    const char *state; //  "starting", "ready", "backoff", "stopping" or "stopped"
    int pid;           //  the process the change is about (the one that exited, for
                       //  "backoff" and "stopped"); 0 when there is none
    int wait_status;   //  its waitpid status when it has just exited, else -1
    unsigned restarts;
} cli_supervisor_event_t;

//  Called once, when every child has been ready at least once. It may call
//  cli_supervisor_stop.
typedef void (cli_supervisor_ready_fn) (cli_supervisor_t *self, void *arg);

//  Called after each change of a child's state. It must not call into the
//  supervisor; schedule work on the loop instead.
typedef void (cli_supervisor_event_fn) (const cli_supervisor_event_t *event, void *arg);

//  Creates a supervisor that logs children to <log_dir>/<name>.log (creating log_dir)
//  and writes its status to status_path (none when NULL). Returns NULL on failure.
cli_supervisor_t *cli_supervisor_new (const char *log_dir, const char *status_path);

//  Stops the children that still run (SIGTERM, SIGKILL after the grace period; this
//  blocks), writes the final status, restores the signal mask. Nullifies *self_p.
void cli_supervisor_destroy (cli_supervisor_t **self_p);

//  Adds a child before start. argv is copied; argv[0] is the path of an executable,
//  run with execve, no shell. Returns -1 if the name is not a plain file name
//  ([A-Za-z0-9._-]) or is taken, argv[0] is not executable, or the supervisor started.
int cli_supervisor_add (cli_supervisor_t *self, const char *name, char *const argv[]);

//  How long a child has to report ready before it is killed and restarted (60000).
void cli_supervisor_set_start_timeout (cli_supervisor_t *self, unsigned msecs);

//  How long a stopping child has between SIGTERM and SIGKILL (10000).
void cli_supervisor_set_stop_grace (cli_supervisor_t *self, unsigned msecs);

//  The restart delay starts at min_msecs and doubles up to max_msecs; it falls back to
//  min_msecs once a child has been ready for reset_msecs (250, 30000, 60000).
void cli_supervisor_set_backoff (cli_supervisor_t *self, unsigned min_msecs, unsigned max_msecs,
                                 unsigned reset_msecs);

void cli_supervisor_set_ready_fn (cli_supervisor_t *self, cli_supervisor_ready_fn *fn, void *arg);

//  A child that exits failed_starts times in a row before it is ready stops everything
//  (0, the default: never). cli_supervisor_failure then says which and why.
void cli_supervisor_set_give_up (cli_supervisor_t *self, unsigned failed_starts);

//  Says the children reopen their log on SIGHUP (sbx daemons do): from then on SIGHUP
//  to the supervisor reopens its own log (sbx_log_file) and is passed on to them, and
//  with max_bytes > 0 a log (theirs and its own) found that big by a check every
//  second is rotated: <log> to <log>.1, .1 to .2, ..., keeping keep of them, and its
//  child told by SIGHUP. A child that is starting is told once ready and its log
//  rotated only then: until then its last error is looked for in the file it started
//  with. Call before start.
void cli_supervisor_set_logs (cli_supervisor_t *self, uint64_t max_bytes, unsigned keep);

//  Why the supervisor gave up ("sbx-gateway exited with status 1 5 times in a row before
//  it was ready: <its last error line>"), or NULL.
const char *cli_supervisor_failure (cli_supervisor_t *self);

void cli_supervisor_set_event_fn (cli_supervisor_t *self, cli_supervisor_event_fn *fn, void *arg);

//  Blocks the signals, registers their signalfd with loop and spawns the first child.
//  Returns 0, or -1 if there are no children, it already started, or the signalfd
//  could not be set up. The loop ends (zloop_start returns -1) once a stop completes.
int cli_supervisor_start (cli_supervisor_t *self, zloop_t *loop);

//  Starts the same clean stop as SIGTERM, from code (e.g. when `sbx up` cannot finish
//  its setup). Safe to call more than once; does not block.
void cli_supervisor_stop (cli_supervisor_t *self);

void cli_supervisor_test (bool verbose);

#endif
