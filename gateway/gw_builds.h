/*  gw_builds - template builds run by the service (POST /v1/templates, issue 19).

    A build is `sbx template build NAME --from-tar … --account ACCOUNT` run on the
    gateway's host as the operator for the key's account: the same builder as the CLI's,
    through the same public operations, in a build sandbox of that account (limited and
    billed as any). The gateway only starts it and reads its files: it never waits on it.

    Each build is a directory DIR/gateway/builds/bld_…: meta.json (who, what, when),
    context.tar (the request's body, until the builder has unpacked it), log (the
    builder's stdout and stderr), result.json (written last: exit code, snapshot), and
    lock, which the builder holds (flock) while it runs. A build whose lock is free and
    that left no result stopped early (the host or gateway went down): failed. So a
    gateway restarted mid-build still answers for it from the files; builds run apart
    from the gateway's process (their own session), and are kept for 7 days.
*/
#ifndef GW_BUILDS_H_INCLUDED
#define GW_BUILDS_H_INCLUDED

#include "sbx_common.h"
#include "sbx_config.h"

#include <jansson.h>

typedef struct gw_builds_t gw_builds_t;

//  Builds under config's data directory (NULL config: none can start). NULL on failure.
gw_builds_t *gw_builds_new (sbx_config_t *config);
void gw_builds_destroy (gw_builds_t **self_p);

//  POST /v1/templates for account with args (checked: name, dockerfile, noCache,
//  public) and body (the context tar): starts the build. SBX_OK with *answer (the
//  build), or the refusal's code with why.
sbx_code_t gw_builds_start (gw_builds_t *self, const char *account, json_t *args, const void *body,
                            size_t size, json_t **answer, char *why, size_t why_size);

//  GET /v1/templates/builds/{buildId} (args: buildId, logOffset): SBX_OK with *answer
//  (the build and its log from logOffset on), or not_found when this gateway holds no
//  such build of account's (gw_others then asks the other gateways).
sbx_code_t gw_builds_get (gw_builds_t *self, const char *account, json_t *args, json_t **answer,
                          char *why, size_t why_size);

//  build.get routed here from another gateway (schemas/gateways.json): the reply (build.get.ok,
//  or an error echoing the request's rid) for the request's caller. Never NULL.
sbx_msg_t *gw_builds_serve (gw_builds_t *self, const sbx_msg_t *request);

void gw_builds_test (bool verbose);

#endif
