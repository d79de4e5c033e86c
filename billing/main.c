/*  sbx-billing - the per-second meter: follows the broker's event log from the last event
    it applied (billing.db), charges each sandbox's time in ready at its type's rate, and
    answers usage.get. */
#include "bill_server.h"

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
    bill_server_t *server = bill_server_new (sbx_daemon_config (daemon));
    sbx_peer_t *peer =
        server ? sbx_daemon_connect (daemon, SBX_ROLE_BILLING, 0, bill_server_on_request, server)
               : NULL;
    if (!peer || bill_server_start (server, peer, sbx_daemon_loop (daemon))) {
        bill_server_destroy (&server);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    //  A store failure stopped the reader and the loop: exit non-zero to be restarted.
    if (bill_server_failed (server))
        code = 1;
    bill_server_destroy (&server);
    sbx_daemon_destroy (&daemon);
    return code;
}
