/*  sbx_msg_meta - private to the codec: the schema as data.

    schemas/gen.py writes these tables into sbx_msg_gen.c; the engine in sbx_msg.c walks
    them for encode, decode, free, dup and eq, sbx_msg_json.c for JSON, and the tests for
    random messages. Nothing outside common/ and tests/ should include this header.
*/
#ifndef SBX_MSG_META_H_INCLUDED
#define SBX_MSG_META_H_INCLUDED

#include "sbx_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

//  Field kinds, one per schema type.
typedef enum {
    SBX_META_STRING = 1, //  char *
    SBX_META_BYTES,      //  sbx_bytes_t
    SBX_META_BOOL,       //  bool
    SBX_META_INT,        //  int64_t
    SBX_META_UINT,       //  uint64_t
    SBX_META_STRLIST,    //  sbx_strlist_t
    SBX_META_STRMAP,     //  sbx_strmap_t
    SBX_META_ENUM,       //  a generated enum (int-sized)
    SBX_META_LIST,       //  sbx_<struct>_list_t: { items, count }
    SBX_META_STRUCT      //  sbx_<struct>_t *
} sbx_meta_kind_t;

typedef struct {
    const char *name;          //  "role", or "error_code" for the catalogue
    const char *const *values; //  values[value]; values[0] is the unset slot
    size_t count;              //  entries in values, the unset slot included
} sbx_meta_enum_t;

typedef struct sbx_meta_struct_s sbx_meta_struct_t;

typedef struct {
    const char *name;
    sbx_meta_kind_t kind;
    size_t offset; //  offsetof in the generated struct
    bool required;
    size_t max;                           //  0: the SBX_MSG_MAX_* default for the kind
    const sbx_meta_enum_t *enum_meta;     //  SBX_META_ENUM
    const sbx_meta_struct_t *struct_meta; //  SBX_META_LIST (the item) and SBX_META_STRUCT
} sbx_meta_field_t;

struct sbx_meta_struct_s {
    const char *name; //  "peer.hello", "caller"
    size_t size;
    const sbx_meta_field_t *fields;
    size_t field_count;
};

typedef struct {
    const char *name;
    const sbx_meta_struct_t *body;
    const char *const *from;
    size_t from_count;
    const char *const *to;
    size_t to_count;
    sbx_msg_type_t reply; //  SBX_MSG__UNKNOWN when the message has none
    bool event;
} sbx_meta_msg_t;

//  Generated tables (sbx_msg_gen.c). sbx_meta_msgs[0] is the unknown type: all NULL.
extern const sbx_meta_msg_t sbx_meta_msgs[SBX_MSG__COUNT];
extern const sbx_meta_enum_t sbx_meta_code;
extern const int sbx_meta_code_http[SBX_CODE__COUNT];
extern const sbx_meta_struct_t *const sbx_meta_caller;

//  Engine helpers the generated code calls (sbx_msg.c).
const char *sbx_meta_enum_name (const sbx_meta_enum_t *meta, int value);
int sbx_meta_enum_from_name (const sbx_meta_enum_t *meta, const char *name, int *value_p);
void *sbx_meta_list_append (void **items_p, size_t *count_p, size_t item_size);

//  The effective limit of a field: its max, or the default for its kind.
size_t sbx_meta_field_max (const sbx_meta_field_t *field);

//  True when encode writes this field: set, or required.
bool sbx_meta_field_present (const sbx_meta_field_t *field, const void *body);

//  True when the text is valid UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool sbx_meta_utf8_valid (const char *text, size_t size);

//  Test support: a deterministic generator (splitmix64) and random messages that encode.
//  full fills every field, optional ones included; otherwise optional fields are left
//  absent at random. Returns NULL only when out of memory.
uint64_t sbx_meta_rand (uint64_t *state);
sbx_msg_t *sbx_meta_random_msg (sbx_msg_type_t type, bool full, uint64_t *state);

//  The codec's self-test without JSON (sbx_msg_test in sbx_msg_json.c runs it, then
//  checks sbx_msg_body_to_json: the codec library itself must not need jansson).
void sbx_meta_codec_test (bool verbose);

#ifdef __cplusplus
}
#endif

#endif
