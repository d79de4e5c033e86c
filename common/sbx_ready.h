/*  sbx_ready - a daemon tells its supervisor it is ready to serve (the s6 model).

    The supervisor (cli_supervisor, behind `sbx up`) starts each daemon with a pipe's
    write end as a descriptor and SBX_READY_FD=<n> in its environment, and starts the
    next daemon only once this one has written "ready\n" there. A daemon calls
    sbx_ready_notify once, after it has bound its sockets and opened its stores:

        sbx_broker_t *broker = sbx_broker_new (config);
        if (!broker)
            return 1;
        sbx_ready_notify ();
        zloop_start (loop);
        sbx_ready_stopping ();

    Under systemd (Type=notify) the service manager sets NOTIFY_SOCKET instead: the same
    call then sends "READY=1" as one datagram to that AF_UNIX socket (a path, or an
    abstract name written "@name"), and sbx_ready_stopping sends "STOPPING=1". The
    protocol is that small (sd_notify(3)), so it is spoken here, without libsystemd.
*/
#ifndef SBX_READY_H_INCLUDED
#define SBX_READY_H_INCLUDED

#include <stdbool.h>

//  The variable the supervisor sets to the descriptor number.
#define SBX_READY_ENV "SBX_READY_FD"

//  The variable systemd sets to its notification socket.
#define SBX_READY_NOTIFY_ENV "NOTIFY_SOCKET"

//  Takes NOTIFY_SOCKET out of the environment (keeping its value here), so that the
//  processes a daemon starts (QEMU, nft) never see it. Call first in main; sbx_daemon_new
//  does. Calling it again takes a newly set value.
void sbx_ready_init (void);

//  If SBX_READY_FD names a descriptor, writes "ready\n" to it, closes it and unsets the
//  variable, so that processes this daemon starts later do not inherit either. Returns
//  0 when done and also when the variable is not set (a daemon run by hand); -1 when
//  the variable is malformed, names something that is not a pipe or socket, or the
//  write fails (the supervisor is gone). Never raises SIGPIPE. With NOTIFY_SOCKET (taken
//  by sbx_ready_init, or still in the environment) it also sends "READY=1" there; -1 when
//  that fails too (no such socket, or a value that is neither /path nor @name).
int sbx_ready_notify (void);

//  Tells systemd the daemon is stopping ("STOPPING=1"), when it runs under it. 0, or -1
//  when the datagram could not be sent.
int sbx_ready_stopping (void);

void sbx_ready_test (bool verbose);

#endif
