/*  cli_template_service - template builds in the service, both sides of them.
    POST /v1/templates (gw_builds) runs `sbx template build --from-tar TAR --result FILE`
    on the gateway's host: the context arrives as a tar archive to unpack, and the
    outcome goes to a result file the gateway reads. `sbx template build --server`
    sends a context there and prints the build's log as it grows.
*/
#ifndef CLI_TEMPLATE_SERVICE_H_INCLUDED
#define CLI_TEMPLATE_SERVICE_H_INCLUDED

#include "cli_where.h"

typedef struct {
    const char *dockerfile; //  -f: inside the context, or sent beside it; NULL: ./Dockerfile
    bool no_cache, public, json;
} cli_template_service_opts_t;

//  Sends dir as a build context and follows the build: its exit code (2: refused here).
int cli_template_service_build (cli_where_t *w, const char *name, const char *dir,
                                const cli_template_service_opts_t *o);

//  The context tar unpacked into dir (made): 0, or 2 with the refusal said.
int cli_template_service_unpack (const char *tar, const char *dir);

//  Removes dir and everything under it (an unpacked context).
void cli_template_service_remove (const char *dir);

//  out (taken) to path, whole or not at all.
void cli_template_service_result (const char *path, json_t *out);

#endif
