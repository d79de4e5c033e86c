/*  sbx-vmd - the QEMU microvm guests of one host (issue 3 fills it in; now it registers). */
#include "sbx_daemon.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (argc, argv, "sbx-vmd",
                                           "Runs the QEMU microvm guests of this host: disks, memory state, QMP, the guest\nagent channel and port forwards. One per host.", &code);
    if (!daemon)
        return code;
    if (!sbx_daemon_connect (
            daemon, SBX_ROLE_VMD,
            sbx_config_get_uint (sbx_daemon_config (daemon), "vmd.capacity", 8), NULL, NULL)) {
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    sbx_daemon_destroy (&daemon);
    return code;
}
