/*  sbx-gateway - the HTTP(S) edge: today TLS with the local CA and /healthz; the MCP
    endpoint, OAuth and the REST API build on it (issues 4, 5). */
#include "gw_gateway.h"
#include "gw_jsonload.h"

#include <signal.h>

int main (int argc, char **argv)
{
    int code;
    gw_jsonload_init ();
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-gateway",
        "The HTTP(S) edge: /mcp (MCP Streamable HTTP), OAuth, the REST API /v1 and the\n"
        "port proxy. Stateless; run as many as you like behind one broker.",
        &code);
    if (!daemon)
        return code;
    signal (SIGPIPE, SIG_IGN); //  a client gone mid-write must not kill the gateway
    //  Requests routed here (another gateway's build.get) find the gateway once it is made.
    gw_gateway_t *gateway = NULL;
    sbx_peer_t *peer =
        sbx_daemon_connect (daemon, SBX_ROLE_GATEWAY, 0, gw_gateway_on_request, &gateway);
    gateway =
        peer ? gw_gateway_new (sbx_daemon_config (daemon), sbx_daemon_loop (daemon), peer) : NULL;
    code = gateway ? sbx_daemon_run (daemon) : 1;
    gw_gateway_destroy (&gateway);
    sbx_daemon_destroy (&daemon);
    return code;
}
