/*  sbx-broker - the control plane: accounts, keys, sandboxes, routing, event log, tap. */
#include "brk_control.h"
#include "brk_server.h"
#include "sbx_daemon.h"
#include "sbx_ready.h"

//  The actor only speaks on its pipe if it fails: then the daemon stops too.
static int s_on_actor (zloop_t *loop, zsock_t *pipe, void *arg)
{
    (void) loop;
    (void) arg;
    char *message = zstr_recv (pipe);
    zstr_free (&message);
    return -1;
}

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-broker",
        "The sbx control plane. Every other process connects to it (ROUTER at\n"
        "broker.endpoint); it owns control.db (accounts, keys, sandboxes, the event log)\n"
        "and publishes every committed event on the tap (PUB at tap.endpoint).",
        &code);
    if (!daemon)
        return code;
    //  A control node of a cluster runs its dqlite node and serves while it leads.
    sbx_config_t *config = sbx_daemon_config (daemon);
    zactor_t *server =
        zactor_new (brk_control_enabled (config) ? brk_control_actor : brk_server_actor, config);
    char *status = server ? zstr_recv (server) : NULL;
    code = status && streq (status, "READY") ? 0 : 1;
    zstr_free (&status);
    if (code == 0) {
        sbx_ready_notify ();
        zloop_reader (sbx_daemon_loop (daemon), zactor_sock (server), s_on_actor, NULL);
        code = sbx_daemon_run (daemon);
    }
    zactor_destroy (&server);
    sbx_daemon_destroy (&daemon);
    return code;
}
