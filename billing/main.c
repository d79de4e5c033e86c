/*  sbx-billing - the per-second meter (issue 6 fills it in; now it registers and heartbeats). */
#include "sbx_daemon.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-billing",
        "The per-second meter: reads the broker's tap, keeps running intervals, wallets\nand a "
        "ledger in billing.db, and replays missed events after a restart.",
        &code);
    if (!daemon)
        return code;
    if (!sbx_daemon_connect (daemon, SBX_ROLE_BILLING, 0, NULL, NULL)) {
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    sbx_daemon_destroy (&daemon);
    return code;
}
