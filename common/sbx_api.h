/*  sbx_api - the operations of schemas/operations.json between JSON and messages, once
    for every door: REST and MCP in the gateway, and the CLI.

    sbx_api_request turns an operation's arguments (checked by sbx_args) into the message
    it becomes; sbx_api_answer turns the reply into the operation's answer, shaped as its
    output schema says (docs/openapi.json; MCP's structuredContent). Files travel in
    chunks (sbx_xfer). The shapes' parts (a sandbox, a snapshot, a port, output) are here
    too, for whoever shows one.

    An sbx_api_t knows where sandboxes' URLs point (sbx_urls: public_url, box_domain,
    tls), read once from the configuration.
*/
#ifndef SBX_API_H_INCLUDED
#define SBX_API_H_INCLUDED

#include <jansson.h>

#include "sbx_common.h"
#include "sbx_ops_gen.h"

typedef struct sbx_api_t sbx_api_t;

//  The most output bytes of each stream one answer carries (then stdoutTruncated).
#define SBX_API_OUTPUT_MAX (1024 * 1024)
//  A waited exec's deadline: its timeout plus the broker's, vmd's and the agent's time.
#define SBX_API_EXEC_MARGIN_MS 30000

//  With config NULL: https, ".box.localhost" (self-tests).
sbx_api_t *sbx_api_new (sbx_config_t *config);
void sbx_api_destroy (sbx_api_t **self_p);

//  "https://HOST.BOX_DOMAIN[:PORT]" for a label, or LABEL-PORT (fresh string).
char *sbx_api_url (sbx_api_t *self, const char *host);

//  The message op becomes from args (checked with sbx_args_check): a broker request, or
//  for the agent's operations (exec, command_status, kill_command) the request for the
//  guest, with *agent set; the caller sends it for sbx_api_sandbox_id (args). account:
//  the caller's, for those that name it (usage, keys). *deadline_ms: how long to wait
//  (a waited exec's includes its timeout). read_file and write_file go through sbx_xfer:
//  NULL here, as for an operation without a message (get_openapi). NULL with why also
//  when a value is refused beyond its schema (a signal name, an update with nothing).
sbx_msg_t *sbx_api_request (sbx_op_t op, json_t *args, const char *account, bool *agent,
                            uint32_t *deadline_ms, char *why, size_t why_size);

//  The sandbox the operation acts on: args' sandboxId (borrowed), or NULL.
const char *sbx_api_sandbox_id (json_t *args);

//  The answer to op from its reply, shaped as the operation's output; NULL with why when
//  the reply is not what op's request gets.
json_t *sbx_api_answer (sbx_api_t *self, sbx_op_t op, json_t *args, sbx_msg_t *reply, char *why,
                        size_t why_size);

//  Whether a get or list answer wants billing's figures (sbx_api_add_usage).
bool sbx_api_wants_usage (sbx_op_t op);
//  Adds runningSeconds, costMicroUsd and costUsd ("0.000120") from a usage.get.ok to the
//  sandbox (or each of {sandboxes}) of answer it has figures for.
void sbx_api_add_usage (json_t *answer, const sbx_msg_t *usage);

//  The shapes' parts.
//  The sandbox in any sandbox.*.ok answer that carries one, or NULL.
sbx_sandbox_info_t *sbx_api_sandbox_info (sbx_msg_t *reply);
//  id, name, label, state, type, url, network, labels, createdAt, expiresAt, and reason
//  and ports when there are.
json_t *sbx_api_sandbox (sbx_api_t *self, const sbx_sandbox_info_t *info);
//  id, name, state, kind, sandboxId, type, sizeBytes, diskBytes, memoryBytes, createdAt,
//  labels, and reason, parentId and copies (how many hosts keep it) when set.
json_t *sbx_api_snapshot (const sbx_snapshot_info_t *info);

//  list_templates' answer from snapshot.list's with published: the newest ready
//  snapshot of each template name, own first ({templates: [...]}).
json_t *sbx_api_templates (const sbx_snapshot_list_ok_t *list);
//  A key or OAuth connection as GET /v1/keys shows it: id, kind, name, preset (keys),
//  prefix, revoked, createdAt, lastUsedAt, expiresAt.
json_t *sbx_api_key (const sbx_key_info_t *info);
//  Milliseconds since the epoch as "2026-10-27T02:26:10Z", or null for 0.
json_t *sbx_api_time (uint64_t ms);

//  A size as people read it into buf: "512 B", "12 KiB", "120 MiB", "1.1 GiB" (one
//  decimal under 10 of a unit). Returns buf.
const char *sbx_api_bytes (uint64_t bytes, char *buf, size_t size);
//  A webhook as REST shows it (the Webhook schema, without the secret).
json_t *sbx_api_webhook (const sbx_webhook_info_t *info);
//  Bytes as a JSON string: invalid UTF-8 sequences become U+FFFD.
json_t *sbx_api_text (const uint8_t *data, size_t size);
//  "SIGTERM", "TERM", "term", "15" or 15 → 15; absent or null → SIGTERM; -1 when unknown.
int sbx_api_signal_number (json_t *value);
//  "TERM" for 15, or NULL for a signal without a name here.
const char *sbx_api_signal_name (int number);

void sbx_api_test (bool verbose);

#endif
