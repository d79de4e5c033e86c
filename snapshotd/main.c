/*  sbx-snapshotd - the snapshot store: disk and memory images of saved sandboxes under
    DIR/snapshots/<id>/ and their catalog (DIR/snapshotd/snapshots.db). See
    docs/snapshots.md. */
#include "snap_server.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-snapshotd",
        "The snapshot store: disk and memory images of saved sandboxes and their catalog.", &code);
    if (!daemon)
        return code;
    snap_server_t *server = snap_server_new (sbx_daemon_config (daemon));
    if (!server || snap_server_start (server, sbx_daemon_loop (daemon)) ||
        !sbx_daemon_connect (daemon, SBX_ROLE_SNAPSHOTD, 0, snap_server_on_request, server)) {
        snap_server_destroy (&server);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    snap_server_destroy (&server);
    sbx_daemon_destroy (&daemon);
    return code;
}
