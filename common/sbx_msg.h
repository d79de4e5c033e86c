/*  sbx_msg - the one codec: typed messages defined in schemas/, encoded as msgpack.

    Every message that crosses a socket between sbx processes (and between vmd and the
    guest agent) is an sbx_msg_t: an envelope (type, request id, caller, route, timeout)
    plus a body whose C struct is generated from schemas/ by schemas/gen.py into
    sbx_msg_gen.h / sbx_msg_gen.c. This module is the only code that includes msgpack.h.

    Wire form: one msgpack map per frame
        { "type": "peer.hello", "rid": 7, "caller": {...}, "route": "vmd",
          "instance": "host-a", "timeout_ms": 30000, "body": { ...fields... } }
    Only "type" is required in the envelope. Unknown keys are ignored at every level so
    that a newer peer can talk to an older one. Everything that comes off a socket is
    untrusted: decode never crashes, and answers NULL with a catalogued code and a
    message naming the message type and field at fault.
*/
#ifndef SBX_MSG_H_INCLUDED
#define SBX_MSG_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx_msg_gen.h"

#ifdef __cplusplus
extern "C" {
#endif

//  Hard limits applied while decoding, before any allocation is sized from the input.
#define SBX_MSG_MAX_FRAME  (32u * 1024 * 1024) //  a frame larger than this is refused
#define SBX_MSG_MAX_STRING (64u * 1024)        //  default for string fields without "max"
#define SBX_MSG_MAX_BYTES  (16u * 1024 * 1024) //  default for bytes fields without "max"
#define SBX_MSG_MAX_ITEMS  10000u              //  default for lists and maps
#define SBX_MSG_MAX_DEPTH  16u                 //  nesting of maps/arrays in one frame

//  An error: a catalogued code (generated from schemas/errors.json) and a message.
typedef struct {
    sbx_code_t code;   //  SBX_OK (0) when there is no error
    uint64_t rid;      //  request id of the frame at fault, when it could be read
    char message[512]; //  for a person: what is wrong, and where
} sbx_err_t;

//  Sets err (when not NULL) and returns -1, so callers can `return sbx_err_set (...)`.
int sbx_err_set (sbx_err_t *err, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

//  The envelope. body points to the generated struct for `type` (owned by the message);
//  use the generated accessors, e.g. sbx_msg_peer_hello (msg), to reach it typed.
typedef struct sbx_msg_s {
    sbx_msg_type_t type;
    uint64_t rid;         //  request id, chosen by the requester; replies echo it
    sbx_caller_t *caller; //  who asks (requests only); NULL when absent
    char *route;          //  role that must handle it, when the type allows several
    char *instance;       //  that role's instance, when one particular worker must
    uint32_t timeout_ms;  //  the requester's deadline budget; 0 = the broker's default
    void *body;
} sbx_msg_t;

//  Creates a message of that type with a zeroed body. Returns NULL for an unknown type.
sbx_msg_t *sbx_msg_new (sbx_msg_type_t type);

//  Destroys the message, its body and everything the body owns; nullifies *self_p.
void sbx_msg_destroy (sbx_msg_t **self_p);

//  Deep copy. Returns NULL on allocation failure.
sbx_msg_t *sbx_msg_dup (const sbx_msg_t *self);

//  True when both messages have the same envelope and bodies, field by field.
bool sbx_msg_eq (const sbx_msg_t *a, const sbx_msg_t *b);

//  Encodes into a newly allocated buffer the caller frees with free(). Returns -1 and
//  sets err (invalid_argument) when a required field is missing, an enum is unset or a
//  value exceeds its schema limit: we never send what the peer would refuse.
int sbx_msg_encode (const sbx_msg_t *self, uint8_t **data_p, size_t *size_p, sbx_err_t *err);

//  Decodes one frame. Returns NULL and sets err on anything malformed: truncated or
//  oversized frames, wrong types, unknown message types or enum values, missing required
//  fields, limits exceeded. err->rid is set when the envelope's rid could be read, so a
//  server can still answer the request it could not understand.
sbx_msg_t *sbx_msg_decode (const uint8_t *data, size_t size, sbx_err_t *err);

//  The type of a frame, without decoding its body (nothing is copied: a relay that
//  only needs the type, such as the broker checking an agent request it passes on,
//  need not copy a 1 MiB file chunk for it). 0, or -1 with err as sbx_msg_decode
//  would set it for a frame that is malformed or has no known type; the body is not
//  checked (whoever decodes the message checks it).
int sbx_msg_peek_type (const uint8_t *data, size_t size, sbx_msg_type_t *type_p, sbx_err_t *err);

//  Creates the error reply to a request: type error, same rid, code and message.
sbx_msg_t *sbx_msg_new_error (uint64_t rid, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

//  Creates an empty reply of `type` to `request`: same rid.
sbx_msg_t *sbx_msg_new_reply (const sbx_msg_t *request, sbx_msg_type_t type);

//  Message type names as in schemas/ ("peer.hello"), and back. from_name returns -1
//  for an unknown name.
const char *sbx_msg_type_name (sbx_msg_type_t type);
int sbx_msg_type_from_name (const char *name, sbx_msg_type_t *type_p);

//  True for types that answer a request: error, and every type a schema names as some
//  message's "reply" (peer.welcome, sys.status.ok...).
bool sbx_msg_type_is_reply (sbx_msg_type_t type);
//  The type that answers a request of type (its schema's "reply"), or SBX_MSG__UNKNOWN.
sbx_msg_type_t sbx_msg_type_reply (sbx_msg_type_t type);

//  Error code names ("not_found"), back, and the HTTP status the gateway answers with.
const char *sbx_code_name (sbx_code_t code);
int sbx_code_from_name (const char *name, sbx_code_t *code_p);
int sbx_code_http_status (sbx_code_t code);

//  Setters for owned fields: each frees the old value and copies the new one.
//  Return 0, or -1 on allocation failure.
int sbx_str_set (char **field, const char *value); //  NULL clears
int sbx_bytes_set (sbx_bytes_t *field, const void *data, size_t size);
//  The same without the copy: takes *data_p (malloc'd, not NULL: present even when size
//  is 0) and sets it to NULL. For megabytes read into a buffer of their own.
void sbx_bytes_take (sbx_bytes_t *field, uint8_t **data_p, size_t size);
int sbx_strlist_append (sbx_strlist_t *list, const char *value);
void sbx_strlist_clear (sbx_strlist_t *list); //  frees the items; an empty list after
int sbx_strmap_set (sbx_strmap_t *map, const char *key, const char *value); //  NULL removes
const char *sbx_strmap_get (const sbx_strmap_t *map, const char *key);

//  Replaces every byte of text that is not part of valid UTF-8 with '?', in place: for
//  messages that quote what a peer or a client sent (JSON and msgpack strings must be
//  UTF-8; a quote cut at a length limit can end mid-character too).
void sbx_utf8_sanitize (char *text);

//  Converts the body to a JSON object text (keys as in schemas/, enums as their names,
//  bytes as base64 strings, lists and structs nested). Returns a string the caller
//  frees, or NULL. Used by `sbx tap` and logs; the gateway builds its own JSON.
char *sbx_msg_body_to_json (const sbx_msg_t *self);

//  Self test.
void sbx_msg_test (bool verbose);

#ifdef __cplusplus
}
#endif

#endif
