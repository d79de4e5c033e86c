/*  brk_ports - published guest ports: sandbox.port (host_port) and sandbox.resolve (the
    gateway's port proxy asking where <label>-<port>.box.<domain> goes).

    sandbox.port checks the caller like every sandbox request (another account's sandbox
    is not_found, read-only keys can't), asks the sandbox's vmd for vm.port, and records
    the forward in control.db (sandbox_ports) with a sandbox.port_changed event once vmd
    has answered. A port is published only on a ready sandbox; removing works in any
    live state. The forward's host address and port are vmd's to choose and stay the
    broker's secret: clients see the URL, the gateway sees the endpoint.
*/
#ifndef BRK_PORTS_H_INCLUDED
#define BRK_PORTS_H_INCLUDED

#include "brk_ctx.h"

//  sandbox.port: the reply (an error) at once, or NULL when it waits on vmd.
sbx_msg_t *brk_ports_port (brk_ctx_t *ctx, zframe_t *client, sbx_msg_t *request);

//  sandbox.resolve: answered at once. `trusted` says the sender is a gateway (or the
//  caller an operator): nobody else learns where forwards listen.
sbx_msg_t *brk_ports_resolve (brk_ctx_t *ctx, sbx_msg_t *request, bool trusted);

void brk_ports_test (bool verbose);

#endif
