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
*/
#ifndef SBX_READY_H_INCLUDED
#define SBX_READY_H_INCLUDED

#include <stdbool.h>

//  The variable the supervisor sets to the descriptor number.
#define SBX_READY_ENV "SBX_READY_FD"

//  If SBX_READY_FD names a descriptor, writes "ready\n" to it, closes it and unsets the
//  variable, so that processes this daemon starts later do not inherit either. Returns
//  0 when done and also when the variable is not set (a daemon run by hand); -1 when
//  the variable is malformed, names something that is not a pipe or socket, or the
//  write fails (the supervisor is gone). Never raises SIGPIPE.
int sbx_ready_notify (void);

void sbx_ready_test (bool verbose);

#endif
