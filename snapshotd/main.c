/*  sbx-snapshotd - the snapshot store (issue 7 fills it in; now it registers and heartbeats). */
#include "sbx_daemon.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-snapshotd",
        "The snapshot store: disk and memory images of saved sandboxes and their catalog.", &code);
    if (!daemon)
        return code;
    if (!sbx_daemon_connect (daemon, SBX_ROLE_SNAPSHOTD, 0, NULL, NULL)) {
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    sbx_daemon_destroy (&daemon);
    return code;
}
