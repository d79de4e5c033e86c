/*  sbx-hookd - webhooks: keeps the URLs accounts registered for their events
    (hooks/hooks.db), follows the broker's event log from the last event it applied, and
    POSTs each event a webhook takes, signed, retried with backoff, with a delivery log.
    See docs/webhooks.md. */
#include "hook_server.h"

#include "sbx_daemon.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-hookd",
        "Webhooks: reads the broker's tap from where it stopped, and delivers each event an\n"
        "account's webhooks take as a signed POST (Sbx-Signature, Sbx-Event-Id), retried\n"
        "with backoff, logged in hooks/hooks.db.",
        &code);
    if (!daemon)
        return code;
    hook_server_t *server = hook_server_new (sbx_daemon_config (daemon));
    sbx_peer_t *peer =
        server ? sbx_daemon_connect (daemon, SBX_ROLE_HOOKS, 0, hook_server_on_request, server)
               : NULL;
    if (!peer || hook_server_start (server, peer, sbx_daemon_loop (daemon))) {
        hook_server_destroy (&server);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    code = sbx_daemon_run (daemon);
    //  A store failure stopped the reader: exit non-zero to be restarted.
    if (hook_server_failed (server))
        code = 1;
    hook_server_destroy (&server);
    sbx_daemon_destroy (&daemon);
    return code;
}
