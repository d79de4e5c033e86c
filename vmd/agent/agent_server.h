/*  agent_server - the guest agent's event loop and its request handlers.

    One thread, one poll(): the port (virtio-serial, or a descriptor in tests), a
    signalfd for SIGCHLD and termination signals, and every captured pipe. Requests are
    answered by rid in whatever order they finish; a foreground exec is answered when its
    process ends, so nothing a request does makes the loop wait on a child.
*/
#ifndef AGENT_SERVER_H_INCLUDED
#define AGENT_SERVER_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *port;     //  device path (default /dev/virtio-ports/agent)
    int port_fd;          //  >= 0: use this descriptor instead (tests); its EOF ends the agent
    const char *netdev;   //  interface agent.setup brings up or down (default eth0)
    bool no_clock;        //  agent.setup checks time_ms but leaves the clock alone (tests)
    size_t buf_limit;     //  bytes kept per output stream (default 8 MiB)
    size_t max_finished;  //  finished processes kept (default 1000)
    size_t budget;        //  output bytes kept across finished processes (default 64 MiB)
    size_t max_file_size; //  agent.file.write limit (default 1 GiB)
    bool verbose;         //  log requests on stderr
    int64_t pty_idle_ms;  //  an untouched terminal hangs up after (AGENT_PTY_IDLE_MS; 0 never)
    //  Where agent.setup rewrites hostname and hosts when the hostname changes (a guest
    //  restored from a snapshot or template gets a new one); NULL: never (tests).
    const char *etc_dir;
} agent_config_t;

//  Sets the defaults above.
void agent_config_init (agent_config_t *config);

//  Serves until the port descriptor (port_fd mode) reaches end of stream, or a SIGTERM
//  or SIGINT when not PID 1. Returns the exit status for main.
int agent_server_run (const agent_config_t *config);

#endif
