/*  sbx_daemon - what every sbx daemon's main() shares: options, config, logging,
    readiness, and for workers the broker connection and the sys.status answer.

    Options common to all daemons:
      --data-dir DIR    data directory (default: $SBX_DATA_DIR, /var/lib/sbx as root)
      --instance NAME   instance name (default: the host name)
      --set KEY=VALUE   override one sbx.conf setting (repeatable)
      --log-level L     debug, info, warn or error
      --help, --version
*/
#ifndef SBX_DAEMON_H_INCLUDED
#define SBX_DAEMON_H_INCLUDED

#include <czmq.h>
#include <stdbool.h>

#include "sbx_config.h"
#include "sbx_msg.h"
#include "sbx_peer.h"

typedef struct sbx_daemon_t sbx_daemon_t;

//  Parses the options, loads the config and checks every value by its key's kind (a bad
//  one: why, naming the key, and exit code 2). Logs in log.format; to the file that
//  SBX_LOG_FILE names when set (sbx up does), reopened on SIGHUP, else to stderr. SIGHUP
//  is blocked here and read in the loop: call this before anything starts threads.
//  `name` is the executable ("sbx-vmd"),
//  `summary` one paragraph for --help. On --help/--version prints and sets *exit_code
//  to 0; on a bad option prints why and sets it to 2; returns NULL in both cases.
sbx_daemon_t *sbx_daemon_new (int argc, char **argv, const char *name, const char *summary,
                              int *exit_code);
void sbx_daemon_destroy (sbx_daemon_t **self_p);

sbx_config_t *sbx_daemon_config (sbx_daemon_t *self);
zloop_t *sbx_daemon_loop (sbx_daemon_t *self);

//  For workers: connects to the broker as `role` with `capacity` units of work,
//  answers sys.status, hands other requests to fn, and reports ready to the
//  supervisor at the first welcome.
sbx_peer_t *sbx_daemon_connect (sbx_daemon_t *self, sbx_role_t role, uint64_t capacity,
                                sbx_peer_request_fn *fn, void *arg);

//  Runs the loop until SIGINT or SIGTERM; a worker then says bye. Returns the exit code:
//  0, or 1 when the broker refused the worker (its instance name is in use).
int sbx_daemon_run (sbx_daemon_t *self);

#endif
