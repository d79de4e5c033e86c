/*  agent_ptab - the processes the agent started: spawn, capture, reap, time out, keep.

    Each process runs /bin/sh -c COMMAND in its own session (so its pid is also its
    process group id, and a kill reaches everything it started), with stdout and stderr
    on non-blocking pipes captured into bounded agent_buf_t buffers; or, with a pty, on a
    new pseudo-terminal (its controlling terminal) whose master is read like stdout and
    written to by agent_ptab_input. Finished processes
    stay, with their output, until more than max_finished are kept or their buffers
    together exceed the output budget; then the oldest finished ones go first.
    The table does no polling itself: the server asks it for descriptors and timeouts.
*/
#ifndef AGENT_PTAB_H_INCLUDED
#define AGENT_PTAB_H_INCLUDED

#include "agent_buf.h"
#include "sbx_msg.h"

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    char *command;
    char *tag; //  the caller's name for it (agent.exec's tag), or NULL
    bool detached;
    bool running;
    bool timed_out;
    int exit_code;         //  exit status; 128+signal when signalled
    int signal;            //  terminating signal, or 0
    int64_t started_ms;    //  wall clock
    int64_t ended_ms;      //  wall clock, 0 while running
    int64_t started_mono;  //  monotonic ms, for durations
    int64_t ended_mono;    //  monotonic ms, 0 while running
    int64_t deadline_mono; //  monotonic ms when the timeout kills it; 0 for none
    int64_t hangup_mono;   //  a pty's: monotonic ms when, untouched, its terminal hangs up
    bool hung_up;          //  its group got SIGHUP: nobody asked after its terminal
    int out_fd;            //  read ends, -1 once closed (a pty's: a duplicate of pty_fd)
    int err_fd;            //  -1 for a pty: the terminal carries both streams
    bool pty;              //  started on a pseudo-terminal
    int pty_fd;            //  its master, for input and resize; closed once it is reaped
    agent_buf_t *out;
    agent_buf_t *err;
    bool waiter;         //  a foreground exec waits for the end
    uint64_t waiter_rid; //  its request id
    uint64_t waiter_max; //  its max_bytes
} agent_proc_t;

typedef struct agent_ptab_s agent_ptab_t;

//  Called for each process the table saw end (after its pipes were drained).
typedef void (agent_ptab_exit_fn) (agent_proc_t *proc, void *arg);

//  Creates a table: buf_limit bytes kept per stream, at most max_finished finished
//  processes, and at most budget bytes of output across finished processes.
agent_ptab_t *agent_ptab_new (size_t buf_limit, size_t max_finished, size_t budget);

//  Destroys the table; with kill_running, SIGKILLs the groups still running first.
void agent_ptab_destroy (agent_ptab_t **self_p, bool kill_running);

//  Starts `command`. envp is a NULL-terminated "K=V" array; cwd must exist; stdin_data
//  NULL means /dev/null. timeout_ms 0 means none. pty non-NULL: on a new terminal of
//  that size instead (stdin_data is then ignored). Returns the process, or NULL with
//  err set (not_found for a missing cwd, internal for fork/pipe/terminal failures).
agent_proc_t *agent_ptab_spawn (agent_ptab_t *self, const char *command, char *const envp[],
                                const char *cwd, const sbx_bytes_t *stdin_data, uint64_t timeout_ms,
                                bool detached, const struct winsize *pty, sbx_err_t *err);

//  Writes to a running pty process's terminal without blocking. Returns the bytes the
//  terminal took (0 when its buffer is full), or -1 with err set: failed_precondition
//  when it has no terminal or has ended.
ssize_t agent_ptab_input (agent_ptab_t *self, agent_proc_t *proc, const void *data, size_t size,
                          sbx_err_t *err);

//  Sets the window size of a running pty process's terminal (its foreground group gets
//  SIGWINCH). Returns 0, or -1 with err set as agent_ptab_input does.
int agent_ptab_resize (agent_ptab_t *self, agent_proc_t *proc, const struct winsize *size,
                       sbx_err_t *err);

//  The process with that pid, or NULL.
agent_proc_t *agent_ptab_find (agent_ptab_t *self, pid_t pid);

//  The running process with that tag (agent.exec's), or NULL.
agent_proc_t *agent_ptab_find_tag (agent_ptab_t *self, const char *tag);

//  Processes, in start order.
size_t agent_ptab_size (const agent_ptab_t *self);
agent_proc_t *agent_ptab_at (agent_ptab_t *self, size_t index);

//  Fills fds with the open pipes (at most max) and owners with their processes.
//  Returns how many were filled.
size_t agent_ptab_pollfds (agent_ptab_t *self, struct pollfd *fds, agent_proc_t **owners,
                           size_t max);

//  Reads what a process's pipe has (fd is its out_fd or err_fd); closes it at EOF.
void agent_ptab_read (agent_ptab_t *self, agent_proc_t *proc, int fd);

//  Reads everything both pipes of proc hold now, without waiting.
void agent_ptab_drain (agent_ptab_t *self, agent_proc_t *proc);

//  Reaps every child that ended (ours and orphans), marks ours finished, calls fn for
//  each, then sheds old finished processes. Call when SIGCHLD arrives.
void agent_ptab_reap (agent_ptab_t *self, agent_ptab_exit_fn *fn, void *arg);

//  A pty process's terminal hangs up (SIGHUP to its group, as when a terminal's line
//  drops) once nobody has touched it for idle_ms: its client went away without a word
//  (a gateway killed, a laptop gone). 0: never. Default AGENT_PTY_IDLE_MS.
#define AGENT_PTY_IDLE_MS 120000
void agent_ptab_set_pty_idle (agent_ptab_t *self, int64_t idle_ms);
//  A client asked after proc (status, input, resize): its terminal is in use.
void agent_ptab_touch (agent_ptab_t *self, agent_proc_t *proc);

//  Kills the process groups whose timeout passed and hangs up idle terminals. Returns
//  ms until the next deadline, or -1 when none.
int agent_ptab_expire (agent_ptab_t *self);

//  Clocks, in ms.
int64_t agent_now_ms (void);  //  wall clock
int64_t agent_mono_ms (void); //  monotonic

#endif
