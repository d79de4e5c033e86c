/*  sbx_msg - the codec engine.

    One table-driven walker: the tables (sbx_msg_gen.c, see sbx_msg_meta.h) describe every
    struct as (name, kind, offset, required, max, reference) per field, and each
    operation here - free, dup, eq, encode, decode, random fill - is one switch over the
    field kinds. No code here knows any particular message except `error`, which
    sbx_msg_new_error fills.

    Decode treats its input as hostile. msgpack-c sizes an array's or map's storage from
    its header before it reads a single element, so a five-byte frame can ask for 96 GB.
    We therefore walk the raw bytes first (s_prevalidate): every length must fit in what
    is left of the frame and every container needs at least one byte per element, so what
    msgpack-c allocates afterwards is bounded by a small multiple of the frame size.
*/
#include "sbx_msg.h"
#include "sbx_msg_meta.h"

#include <msgpack.h>

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef streq
#define streq(a, b) (strcmp ((a), (b)) == 0)
#endif

//  route and instance name roles and hosts: anything longer is a bug or an attack.
#define S_ENVELOPE_STRING_MAX 256

//  Values (keys included) in one frame. msgpack-c spends 24 bytes per value, so this
//  bounds what one frame can make it allocate to about 24 MiB, where one byte per value
//  alone would allow 24 times the frame size. A replay of 10000 events is ~150k values.
#define S_MAX_VALUES (1u << 20)

//  How many steps of the path to the field at fault ("peers[2].role") are kept.
#define S_WHERE_STEPS 16

typedef struct {
    sbx_err_t *err;
    const char *what; //  message type name, for error messages
    //  Where in the message: kept as steps and written out only for an error (every
    //  field of every message passes through here; formatting each was a quarter of
    //  the broker's time on lists).
    struct {
        const char *name; //  a field name (static: from the schema), or NULL: index
        size_t index;
    } steps[S_WHERE_STEPS];
    size_t depth; //  may pass S_WHERE_STEPS: the deeper steps are not kept
} s_where_t;

int sbx_err_set (sbx_err_t *err, sbx_code_t code, const char *format, ...)
{
    if (err) {
        err->code = code;
        va_list args;
        va_start (args, format);
        vsnprintf (err->message, sizeof err->message, format, args);
        va_end (args);
    }
    return -1;
}

static void s_err_reset (sbx_err_t *err)
{
    if (err) {
        err->code = SBX_OK;
        err->rid = 0;
        err->message[0] = 0;
    }
}

//  Enters field `name` (static) or list item `index`; returns what s_pop restores.
static size_t s_push (s_where_t *w, const char *name)
{
    if (w->depth < S_WHERE_STEPS) {
        w->steps[w->depth].name = name;
        w->steps[w->depth].index = 0;
    }
    return w->depth++;
}

static size_t s_push_index (s_where_t *w, size_t index)
{
    if (w->depth < S_WHERE_STEPS) {
        w->steps[w->depth].name = NULL;
        w->steps[w->depth].index = index;
    }
    return w->depth++;
}

static void s_pop (s_where_t *w, size_t saved)
{
    w->depth = saved;
}

//  The path as people read it: "sandbox.ports[2].port".
static void s_path (const s_where_t *w, char *out, size_t size)
{
    size_t len = 0;
    out[0] = 0;
    for (size_t i = 0; i < w->depth && i < S_WHERE_STEPS && len < size; i++) {
        int n = w->steps[i].name
                    ? snprintf (out + len, size - len, "%s%s", i ? "." : "", w->steps[i].name)
                    : snprintf (out + len, size - len, "[%zu]", w->steps[i].index);
        len = n < 0 ? len : len + (size_t) n;
    }
    if (w->depth > S_WHERE_STEPS && len < size)
        snprintf (out + len, size - len, "...");
}

//  Sets err to "<type>: field '<path>' <detail>" and returns -1.
static int s_fail (s_where_t *w, sbx_code_t code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

static int s_fail (s_where_t *w, sbx_code_t code, const char *format, ...)
{
    char detail[256];
    va_list args;
    va_start (args, format);
    vsnprintf (detail, sizeof detail, format, args);
    va_end (args);
    if (w->depth) {
        char path[160];
        s_path (w, path, sizeof path);
        return sbx_err_set (w->err, code, "%s: field '%s' %s", w->what, path, detail);
    }
    return sbx_err_set (w->err, code, "%s: body %s", w->what, detail);
}

//  Copies untrusted text into an error message: printable ASCII only, at most 40 bytes.
static const char *s_quote (char *buffer, size_t size, const char *text, size_t len)
{
    size_t out = 0;
    for (size_t i = 0; i < len && out + 4 < size; i++) {
        if (out == 40) {
            memcpy (buffer + out, "...", 3);
            out += 3;
            break;
        }
        unsigned char c = (unsigned char) text[i];
        buffer[out++] = c >= 0x20 && c < 0x7f ? (char) c : '?';
    }
    buffer[out] = 0;
    return buffer;
}

//  --------------------------------------------------------------------------------------
//  Names

const char *sbx_meta_enum_name (const sbx_meta_enum_t *meta, int value)
{
    return value > 0 && (size_t) value < meta->count ? meta->values[value] : NULL;
}

static int s_enum_lookup (const sbx_meta_enum_t *meta, const char *name, size_t len)
{
    for (size_t i = 1; i < meta->count; i++)
        if (strlen (meta->values[i]) == len && memcmp (meta->values[i], name, len) == 0)
            return (int) i;
    return -1;
}

int sbx_meta_enum_from_name (const sbx_meta_enum_t *meta, const char *name, int *value_p)
{
    int value = name ? s_enum_lookup (meta, name, strlen (name)) : -1;
    if (value < 0)
        return -1;
    *value_p = value;
    return 0;
}

const char *sbx_msg_type_name (sbx_msg_type_t type)
{
    return type > SBX_MSG__UNKNOWN && type < SBX_MSG__COUNT ? sbx_meta_msgs[type].name : NULL;
}

static int s_type_lookup (const char *name, size_t len)
{
    for (int i = 1; i < SBX_MSG__COUNT; i++)
        if (strlen (sbx_meta_msgs[i].name) == len && memcmp (sbx_meta_msgs[i].name, name, len) == 0)
            return i;
    return -1;
}

int sbx_msg_type_from_name (const char *name, sbx_msg_type_t *type_p)
{
    int type = name ? s_type_lookup (name, strlen (name)) : -1;
    if (type < 0)
        return -1;
    if (type_p)
        *type_p = (sbx_msg_type_t) type;
    return 0;
}

bool sbx_msg_type_is_reply (sbx_msg_type_t type)
{
    if (type == SBX_MSG_ERROR)
        return true;
    for (int i = 1; i < SBX_MSG__COUNT; i++)
        if (sbx_meta_msgs[i].reply == type && type != SBX_MSG__UNKNOWN)
            return true;
    return false;
}

sbx_msg_type_t sbx_msg_type_reply (sbx_msg_type_t type)
{
    return type > SBX_MSG__UNKNOWN && type < SBX_MSG__COUNT ? sbx_meta_msgs[type].reply
                                                            : SBX_MSG__UNKNOWN;
}

const char *sbx_code_name (sbx_code_t code)
{
    //  SBX_OK has a name too, unlike the unset value of ordinary enums.
    return code >= SBX_OK && code < SBX_CODE__COUNT ? sbx_meta_code.values[code] : NULL;
}

int sbx_code_from_name (const char *name, sbx_code_t *code_p)
{
    int code;
    if (name && strcmp (name, "ok") == 0)
        code = SBX_OK;
    else if (sbx_meta_enum_from_name (&sbx_meta_code, name, &code))
        return -1;
    if (code_p)
        *code_p = (sbx_code_t) code;
    return 0;
}

int sbx_code_http_status (sbx_code_t code)
{
    return code >= SBX_OK && code < SBX_CODE__COUNT ? sbx_meta_code_http[code] : 500;
}

//  --------------------------------------------------------------------------------------
//  Field access. Struct pointers, lists and enums are reached through memcpy, since their
//  C types differ per field while the engine sees one layout for each.

typedef struct {
    void *items;
    size_t count;
} s_list_t;

static void *s_addr (const void *body, const sbx_meta_field_t *f)
{
    return (char *) body + f->offset;
}

static void *s_get_ptr (const void *body, const sbx_meta_field_t *f)
{
    void *ptr;
    memcpy (&ptr, s_addr (body, f), sizeof ptr);
    return ptr;
}

static void s_set_ptr (void *body, const sbx_meta_field_t *f, void *ptr)
{
    memcpy (s_addr (body, f), &ptr, sizeof ptr);
}

static s_list_t s_get_list (const void *body, const sbx_meta_field_t *f)
{
    s_list_t list;
    memcpy (&list, s_addr (body, f), sizeof list);
    return list;
}

static void s_set_list (void *body, const sbx_meta_field_t *f, s_list_t list)
{
    memcpy (s_addr (body, f), &list, sizeof list);
}

static int s_get_enum (const void *body, const sbx_meta_field_t *f)
{
    int value;
    memcpy (&value, s_addr (body, f), sizeof value);
    return value;
}

static void s_set_enum (void *body, const sbx_meta_field_t *f, int value)
{
    memcpy (s_addr (body, f), &value, sizeof value);
}

size_t sbx_meta_field_max (const sbx_meta_field_t *f)
{
    if (f->max)
        return f->max;
    switch (f->kind) {
    case SBX_META_STRING:
        return SBX_MSG_MAX_STRING;
    case SBX_META_BYTES:
        return SBX_MSG_MAX_BYTES;
    default:
        return SBX_MSG_MAX_ITEMS;
    }
}

bool sbx_meta_field_present (const sbx_meta_field_t *f, const void *body)
{
    const void *p = s_addr (body, f);
    switch (f->kind) {
    case SBX_META_STRING:
    case SBX_META_STRUCT:
        return s_get_ptr (body, f) != NULL;
    case SBX_META_BYTES:
        return ((const sbx_bytes_t *) p)->data != NULL;
    case SBX_META_BOOL:
        return f->required || *(const bool *) p;
    case SBX_META_INT:
        return f->required || *(const int64_t *) p != 0;
    case SBX_META_UINT:
        return f->required || *(const uint64_t *) p != 0;
    case SBX_META_ENUM:
        return s_get_enum (body, f) != 0;
    case SBX_META_STRLIST:
        return f->required || ((const sbx_strlist_t *) p)->count > 0;
    case SBX_META_STRMAP:
        return f->required || ((const sbx_strmap_t *) p)->count > 0;
    case SBX_META_LIST:
        return f->required || s_get_list (body, f).count > 0;
    }
    return false;
}

bool sbx_meta_utf8_valid (const char *text, size_t size)
{
    const unsigned char *s = (const unsigned char *) text;
    size_t i = 0;
    while (i < size) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf)
            n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            n = 3, cp = c & 0x07;
        else
            return false;
        if (size - i - 1 < n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += n + 1;
    }
    return true;
}

void sbx_utf8_sanitize (char *text)
{
    size_t size = strlen (text);
    size_t i = 0;
    while (i < size) {
        size_t n = 1;
        while (n <= 4 && i + n <= size && !sbx_meta_utf8_valid (text + i, n))
            n++;
        if (n > 4 || i + n > size) {
            text[i++] = '?';
            continue;
        }
        i += n;
    }
}

//  --------------------------------------------------------------------------------------
//  Setters

int sbx_str_set (char **field, const char *value)
{
    char *copy = NULL;
    if (value && !(copy = strdup (value)))
        return -1;
    free (*field);
    *field = copy;
    return 0;
}

int sbx_bytes_set (sbx_bytes_t *field, const void *data, size_t size)
{
    if (!data && size)
        return -1;
    uint8_t *copy = NULL;
    if (data) {
        //  Present and empty still needs a non-NULL pointer: NULL means absent.
        copy = malloc (size ? size : 1);
        if (!copy)
            return -1;
        memcpy (copy, data, size);
    }
    free (field->data);
    field->data = copy;
    field->size = data ? size : 0;
    return 0;
}

void sbx_bytes_take (sbx_bytes_t *field, uint8_t **data_p, size_t size)
{
    assert (field && data_p && *data_p);
    free (field->data);
    field->data = *data_p;
    field->size = size;
    *data_p = NULL;
}

void *sbx_meta_list_append (void **items_p, size_t *count_p, size_t item_size)
{
    if (*count_p >= SIZE_MAX / item_size - 1)
        return NULL;
    char *items = realloc (*items_p, (*count_p + 1) * item_size);
    if (!items)
        return NULL;
    *items_p = items;
    char *item = items + *count_p * item_size;
    memset (item, 0, item_size);
    (*count_p)++;
    return item;
}

int sbx_strlist_append (sbx_strlist_t *list, const char *value)
{
    if (!value)
        return -1;
    char *copy = strdup (value);
    if (!copy)
        return -1;
    char **slot = sbx_meta_list_append ((void **) &list->items, &list->count, sizeof (char *));
    if (!slot) {
        free (copy);
        return -1;
    }
    *slot = copy;
    return 0;
}

void sbx_strlist_clear (sbx_strlist_t *list)
{
    for (size_t i = 0; i < list->count; i++)
        free (list->items[i]);
    free (list->items);
    list->items = NULL;
    list->count = 0;
}

//  A NULL value removes the key.
int sbx_strmap_set (sbx_strmap_t *map, const char *key, const char *value)
{
    if (!key)
        return -1;
    for (size_t i = 0; i < map->count; i++) {
        if (strcmp (map->keys[i], key) != 0)
            continue;
        if (value)
            return sbx_str_set (&map->values[i], value);
        free (map->keys[i]);
        free (map->values[i]);
        memmove (map->keys + i, map->keys + i + 1, (map->count - i - 1) * sizeof (char *));
        memmove (map->values + i, map->values + i + 1, (map->count - i - 1) * sizeof (char *));
        map->count--;
        return 0;
    }
    if (!value)
        return 0;
    char *key_copy = strdup (key);
    char *value_copy = strdup (value);
    char **keys =
        key_copy && value_copy ? realloc (map->keys, (map->count + 1) * sizeof (char *)) : NULL;
    if (keys)
        map->keys = keys;
    char **values = keys ? realloc (map->values, (map->count + 1) * sizeof (char *)) : NULL;
    if (!values) {
        free (key_copy);
        free (value_copy);
        return -1;
    }
    map->values = values;
    map->keys[map->count] = key_copy;
    map->values[map->count] = value_copy;
    map->count++;
    return 0;
}

const char *sbx_strmap_get (const sbx_strmap_t *map, const char *key)
{
    for (size_t i = 0; key && i < map->count; i++)
        if (strcmp (map->keys[i], key) == 0)
            return map->values[i];
    return NULL;
}

static int s_strcmp_p (const void *a, const void *b)
{
    return strcmp (*(char *const *) a, *(char *const *) b);
}

//  Returns the index of a key that occurs twice, -1 when none does, -2 when out of memory.
static long s_strmap_duplicate (const sbx_strmap_t *map)
{
    if (map->count < 2)
        return -1;
    if (map->count <= 16) {
        for (size_t i = 1; i < map->count; i++)
            for (size_t j = 0; j < i; j++)
                if (strcmp (map->keys[i], map->keys[j]) == 0)
                    return (long) i;
        return -1;
    }
    char **sorted = malloc (map->count * sizeof (char *));
    if (!sorted)
        return -2;
    memcpy (sorted, map->keys, map->count * sizeof (char *));
    qsort (sorted, map->count, sizeof (char *), s_strcmp_p);
    long found = -1;
    for (size_t i = 1; i < map->count && found < 0; i++)
        if (strcmp (sorted[i], sorted[i - 1]) == 0)
            for (size_t j = 0; j < map->count; j++)
                if (map->keys[j] == sorted[i])
                    found = (long) j;
    free (sorted);
    return found;
}

//  --------------------------------------------------------------------------------------
//  Free, new, destroy

static void s_struct_clear (const sbx_meta_struct_t *meta, void *body);

static void s_struct_free (const sbx_meta_struct_t *meta, void *body)
{
    if (body) {
        s_struct_clear (meta, body);
        free (body);
    }
}

//  Frees what one field owns and zeroes it: absent again.
static void s_field_clear (const sbx_meta_field_t *f, void *body)
{
    void *p = s_addr (body, f);
    size_t size = 0;
    switch (f->kind) {
    case SBX_META_STRING:
        free (s_get_ptr (body, f));
        size = sizeof (char *);
        break;
    case SBX_META_BYTES:
        free (((sbx_bytes_t *) p)->data);
        size = sizeof (sbx_bytes_t);
        break;
    case SBX_META_BOOL:
        size = sizeof (bool);
        break;
    case SBX_META_INT:
    case SBX_META_UINT:
        size = sizeof (uint64_t);
        break;
    case SBX_META_ENUM:
        size = sizeof (int);
        break;
    case SBX_META_STRLIST: {
        sbx_strlist_t *list = p;
        for (size_t k = 0; k < list->count; k++)
            free (list->items[k]);
        free (list->items);
        size = sizeof (sbx_strlist_t);
        break;
    }
    case SBX_META_STRMAP: {
        sbx_strmap_t *map = p;
        for (size_t k = 0; k < map->count; k++) {
            free (map->keys[k]);
            free (map->values[k]);
        }
        free (map->keys);
        free (map->values);
        size = sizeof (sbx_strmap_t);
        break;
    }
    case SBX_META_LIST: {
        s_list_t list = s_get_list (body, f);
        for (size_t k = 0; k < list.count; k++)
            s_struct_clear (f->struct_meta, (char *) list.items + k * f->struct_meta->size);
        free (list.items);
        size = sizeof (s_list_t);
        break;
    }
    case SBX_META_STRUCT:
        s_struct_free (f->struct_meta, s_get_ptr (body, f));
        size = sizeof (void *);
        break;
    }
    memset (p, 0, size);
}

//  Frees everything the struct owns, not the struct itself.
static void s_struct_clear (const sbx_meta_struct_t *meta, void *body)
{
    for (size_t i = 0; i < meta->field_count; i++)
        s_field_clear (&meta->fields[i], body);
}

sbx_msg_t *sbx_msg_new (sbx_msg_type_t type)
{
    if (type <= SBX_MSG__UNKNOWN || type >= SBX_MSG__COUNT)
        return NULL;
    sbx_msg_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->type = type;
    self->body = calloc (1, sbx_meta_msgs[type].body->size);
    if (!self->body) {
        free (self);
        return NULL;
    }
    return self;
}

void sbx_msg_destroy (sbx_msg_t **self_p)
{
    assert (self_p);
    sbx_msg_t *self = *self_p;
    if (self) {
        s_struct_free (sbx_meta_caller, self->caller);
        free (self->route);
        free (self->instance);
        if (self->type > SBX_MSG__UNKNOWN && self->type < SBX_MSG__COUNT)
            s_struct_free (sbx_meta_msgs[self->type].body, self->body);
        free (self);
        *self_p = NULL;
    }
}

//  --------------------------------------------------------------------------------------
//  Dup

static int s_struct_copy (const sbx_meta_struct_t *meta, void *dst, const void *src);

static void *s_struct_dup (const sbx_meta_struct_t *meta, const void *src)
{
    void *dst = calloc (1, meta->size);
    if (dst && s_struct_copy (meta, dst, src)) {
        s_struct_free (meta, dst);
        dst = NULL;
    }
    return dst;
}

//  Deep copy into a zeroed dst; on failure dst holds what was copied, for the caller to free.
static int s_struct_copy (const sbx_meta_struct_t *meta, void *dst, const void *src)
{
    for (size_t i = 0; i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        const void *sp = s_addr (src, f);
        void *dp = s_addr (dst, f);
        switch (f->kind) {
        case SBX_META_STRING: {
            const char *s = s_get_ptr (src, f);
            char *copy = NULL;
            if (s && !(copy = strdup (s)))
                return -1;
            s_set_ptr (dst, f, copy);
            break;
        }
        case SBX_META_BYTES: {
            const sbx_bytes_t *b = sp;
            if (sbx_bytes_set (dp, b->data, b->data ? b->size : 0))
                return -1;
            break;
        }
        case SBX_META_BOOL:
            *(bool *) dp = *(const bool *) sp;
            break;
        case SBX_META_INT:
            *(int64_t *) dp = *(const int64_t *) sp;
            break;
        case SBX_META_UINT:
            *(uint64_t *) dp = *(const uint64_t *) sp;
            break;
        case SBX_META_ENUM:
            s_set_enum (dst, f, s_get_enum (src, f));
            break;
        case SBX_META_STRLIST: {
            const sbx_strlist_t *list = sp;
            for (size_t k = 0; k < list->count; k++)
                if (sbx_strlist_append (dp, list->items[k]))
                    return -1;
            break;
        }
        case SBX_META_STRMAP: {
            const sbx_strmap_t *map = sp;
            sbx_strmap_t *out = dp;
            if (map->count) {
                out->keys = calloc (map->count, sizeof (char *));
                out->values = calloc (map->count, sizeof (char *));
                if (!out->keys || !out->values)
                    return -1;
            }
            for (size_t k = 0; k < map->count; k++) {
                out->keys[k] = strdup (map->keys[k]);
                out->values[k] = strdup (map->values[k]);
                out->count++;
                if (!out->keys[k] || !out->values[k])
                    return -1;
            }
            break;
        }
        case SBX_META_LIST: {
            s_list_t list = s_get_list (src, f);
            s_list_t copy = {NULL, 0};
            size_t size = f->struct_meta->size;
            if (list.count && !(copy.items = calloc (list.count, size)))
                return -1;
            copy.count = list.count;
            s_set_list (dst, f, copy);
            for (size_t k = 0; k < list.count; k++)
                if (s_struct_copy (f->struct_meta, (char *) copy.items + k * size,
                                   (const char *) list.items + k * size))
                    return -1;
            break;
        }
        case SBX_META_STRUCT: {
            const void *s = s_get_ptr (src, f);
            void *copy = NULL;
            if (s && !(copy = s_struct_dup (f->struct_meta, s)))
                return -1;
            s_set_ptr (dst, f, copy);
            break;
        }
        }
    }
    return 0;
}

sbx_msg_t *sbx_msg_dup (const sbx_msg_t *self)
{
    if (!self)
        return NULL;
    sbx_msg_t *copy = sbx_msg_new (self->type);
    if (!copy)
        return NULL;
    copy->rid = self->rid;
    copy->timeout_ms = self->timeout_ms;
    if ((self->caller && !(copy->caller = s_struct_dup (sbx_meta_caller, self->caller))) ||
        sbx_str_set (&copy->route, self->route) || sbx_str_set (&copy->instance, self->instance) ||
        s_struct_copy (sbx_meta_msgs[self->type].body, copy->body, self->body))
        sbx_msg_destroy (&copy);
    return copy;
}

//  --------------------------------------------------------------------------------------
//  Eq

static bool s_str_eq (const char *a, const char *b)
{
    return a == b || (a && b && strcmp (a, b) == 0);
}

static bool s_strmap_eq (const sbx_strmap_t *a, const sbx_strmap_t *b)
{
    if (a->count != b->count)
        return false;
    //  Same order is the common case (a decoded copy); else compare as sets of keys.
    size_t i = 0;
    while (i < a->count && s_str_eq (a->keys[i], b->keys[i]) &&
           s_str_eq (a->values[i], b->values[i]))
        i++;
    for (; i < a->count; i++)
        if (!s_str_eq (a->values[i], sbx_strmap_get (b, a->keys[i])))
            return false;
    return true;
}

static bool s_struct_eq (const sbx_meta_struct_t *meta, const void *a, const void *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        const void *pa = s_addr (a, f);
        const void *pb = s_addr (b, f);
        bool eq = true;
        switch (f->kind) {
        case SBX_META_STRING:
            eq = s_str_eq (s_get_ptr (a, f), s_get_ptr (b, f));
            break;
        case SBX_META_BYTES: {
            const sbx_bytes_t *x = pa, *y = pb;
            eq = (!x->data && !y->data) || (x->data && y->data && x->size == y->size &&
                                            memcmp (x->data, y->data, x->size) == 0);
            break;
        }
        case SBX_META_BOOL:
            eq = *(const bool *) pa == *(const bool *) pb;
            break;
        case SBX_META_INT:
            eq = *(const int64_t *) pa == *(const int64_t *) pb;
            break;
        case SBX_META_UINT:
            eq = *(const uint64_t *) pa == *(const uint64_t *) pb;
            break;
        case SBX_META_ENUM:
            eq = s_get_enum (a, f) == s_get_enum (b, f);
            break;
        case SBX_META_STRLIST: {
            const sbx_strlist_t *x = pa, *y = pb;
            eq = x->count == y->count;
            for (size_t k = 0; eq && k < x->count; k++)
                eq = s_str_eq (x->items[k], y->items[k]);
            break;
        }
        case SBX_META_STRMAP:
            eq = s_strmap_eq (pa, pb);
            break;
        case SBX_META_LIST: {
            s_list_t x = s_get_list (a, f), y = s_get_list (b, f);
            size_t size = f->struct_meta->size;
            eq = x.count == y.count;
            for (size_t k = 0; eq && k < x.count; k++)
                eq = s_struct_eq (f->struct_meta, (const char *) x.items + k * size,
                                  (const char *) y.items + k * size);
            break;
        }
        case SBX_META_STRUCT:
            eq = s_struct_eq (f->struct_meta, s_get_ptr (a, f), s_get_ptr (b, f));
            break;
        }
        if (!eq)
            return false;
    }
    return true;
}

bool sbx_msg_eq (const sbx_msg_t *a, const sbx_msg_t *b)
{
    if (!a || !b)
        return a == b;
    return a->type == b->type && a->type > SBX_MSG__UNKNOWN && a->type < SBX_MSG__COUNT &&
           a->rid == b->rid && a->timeout_ms == b->timeout_ms && s_str_eq (a->route, b->route) &&
           s_str_eq (a->instance, b->instance) &&
           s_struct_eq (sbx_meta_caller, a->caller, b->caller) &&
           s_struct_eq (sbx_meta_msgs[a->type].body, a->body, b->body);
}

//  --------------------------------------------------------------------------------------
//  Encode: validates while it packs, so nothing the peer would refuse leaves this process.

typedef struct {
    msgpack_packer pk;
    s_where_t where;
    unsigned depth; //  of the container being written; the envelope map is 1
} s_enc_t;

static int s_prevalidate (const uint8_t *data, size_t size, sbx_err_t *err);

static int s_oom (s_where_t *w)
{
    return sbx_err_set (w->err, SBX_E_INTERNAL, "%s: out of memory", w->what);
}

static int s_enc_raw_str (s_enc_t *e, const char *text, size_t len)
{
    if (msgpack_pack_str (&e->pk, len) || msgpack_pack_str_body (&e->pk, text, len))
        return s_oom (&e->where);
    return 0;
}

//  Checks then packs one string of a field (or a list item) against a byte limit.
static int s_enc_str (s_enc_t *e, const char *text, size_t max)
{
    if (!text)
        return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "holds a NULL string");
    size_t len = strlen (text);
    if (len > max)
        return s_fail (&e->where, SBX_E_TOO_LARGE, "is longer than %zu bytes", max);
    if (!sbx_meta_utf8_valid (text, len))
        return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "is not valid UTF-8");
    return s_enc_raw_str (e, text, len);
}

static int s_enc_enter (s_enc_t *e)
{
    if (++e->depth > SBX_MSG_MAX_DEPTH)
        return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "nests deeper than %u levels",
                       SBX_MSG_MAX_DEPTH);
    return 0;
}

static size_t s_struct_count (const sbx_meta_struct_t *meta, const void *body)
{
    size_t count = 0;
    for (size_t i = 0; i < meta->field_count; i++)
        count += sbx_meta_field_present (&meta->fields[i], body);
    return count;
}

static int s_enc_struct (s_enc_t *e, const sbx_meta_struct_t *meta, const void *body);

static int s_enc_field (s_enc_t *e, const sbx_meta_field_t *f, const void *body)
{
    const void *p = s_addr (body, f);
    size_t max = sbx_meta_field_max (f);
    switch (f->kind) {
    case SBX_META_STRING:
        return s_enc_str (e, s_get_ptr (body, f), max);
    case SBX_META_BYTES: {
        const sbx_bytes_t *b = p;
        if (b->size > max)
            return s_fail (&e->where, SBX_E_TOO_LARGE, "is longer than %zu bytes", max);
        if (msgpack_pack_bin (&e->pk, b->size) || msgpack_pack_bin_body (&e->pk, b->data, b->size))
            return s_oom (&e->where);
        return 0;
    }
    case SBX_META_BOOL:
        return (*(const bool *) p ? msgpack_pack_true (&e->pk) : msgpack_pack_false (&e->pk))
                   ? s_oom (&e->where)
                   : 0;
    case SBX_META_INT:
        return msgpack_pack_int64 (&e->pk, *(const int64_t *) p) ? s_oom (&e->where) : 0;
    case SBX_META_UINT:
        return msgpack_pack_uint64 (&e->pk, *(const uint64_t *) p) ? s_oom (&e->where) : 0;
    case SBX_META_ENUM: {
        const char *name = sbx_meta_enum_name (f->enum_meta, s_get_enum (body, f));
        if (!name)
            return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "holds %d, not a %s",
                           s_get_enum (body, f), f->enum_meta->name);
        return s_enc_raw_str (e, name, strlen (name));
    }
    case SBX_META_STRLIST: {
        const sbx_strlist_t *list = p;
        if (list->count > max)
            return s_fail (&e->where, SBX_E_TOO_LARGE, "has more than %zu items", max);
        if (s_enc_enter (e))
            return -1;
        if (msgpack_pack_array (&e->pk, list->count))
            return s_oom (&e->where);
        for (size_t k = 0; k < list->count; k++) {
            size_t saved = s_push_index (&e->where, k);
            if (s_enc_str (e, list->items[k], SBX_MSG_MAX_STRING))
                return -1;
            s_pop (&e->where, saved);
        }
        e->depth--;
        return 0;
    }
    case SBX_META_STRMAP: {
        const sbx_strmap_t *map = p;
        if (map->count > max)
            return s_fail (&e->where, SBX_E_TOO_LARGE, "has more than %zu items", max);
        long dup = s_strmap_duplicate (map);
        if (dup == -2)
            return s_oom (&e->where);
        if (dup >= 0)
            return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "has key [%ld] twice", dup);
        if (s_enc_enter (e))
            return -1;
        if (msgpack_pack_map (&e->pk, map->count))
            return s_oom (&e->where);
        for (size_t k = 0; k < map->count; k++) {
            size_t saved = s_push_index (&e->where, k);
            if (s_enc_str (e, map->keys[k], SBX_MSG_MAX_STRING) ||
                s_enc_str (e, map->values[k], SBX_MSG_MAX_STRING))
                return -1;
            s_pop (&e->where, saved);
        }
        e->depth--;
        return 0;
    }
    case SBX_META_LIST: {
        s_list_t list = s_get_list (body, f);
        if (list.count > max)
            return s_fail (&e->where, SBX_E_TOO_LARGE, "has more than %zu items", max);
        if (s_enc_enter (e))
            return -1;
        if (msgpack_pack_array (&e->pk, list.count))
            return s_oom (&e->where);
        for (size_t k = 0; k < list.count; k++) {
            size_t saved = s_push_index (&e->where, k);
            if (s_enc_struct (e, f->struct_meta,
                              (const char *) list.items + k * f->struct_meta->size))
                return -1;
            s_pop (&e->where, saved);
        }
        e->depth--;
        return 0;
    }
    case SBX_META_STRUCT:
        return s_enc_struct (e, f->struct_meta, s_get_ptr (body, f));
    }
    return s_fail (&e->where, SBX_E_INTERNAL, "has unknown kind %d", (int) f->kind);
}

static int s_enc_struct (s_enc_t *e, const sbx_meta_struct_t *meta, const void *body)
{
    if (s_enc_enter (e))
        return -1;
    if (msgpack_pack_map (&e->pk, s_struct_count (meta, body)))
        return s_oom (&e->where);
    for (size_t i = 0; i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        size_t saved = s_push (&e->where, f->name);
        if (!sbx_meta_field_present (f, body)) {
            if (f->required)
                return s_fail (&e->where, SBX_E_INVALID_ARGUMENT, "is required");
        } else if (s_enc_raw_str (e, f->name, strlen (f->name)) || s_enc_field (e, f, body))
            return -1;
        s_pop (&e->where, saved);
    }
    e->depth--;
    return 0;
}

static int s_enc_envelope_str (s_enc_t *e, const char *key, const char *value)
{
    size_t len = strlen (value);
    if (len > S_ENVELOPE_STRING_MAX)
        return sbx_err_set (e->where.err, SBX_E_TOO_LARGE, "%s: '%s' is longer than %d bytes",
                            e->where.what, key, S_ENVELOPE_STRING_MAX);
    if (!sbx_meta_utf8_valid (value, len))
        return sbx_err_set (e->where.err, SBX_E_INVALID_ARGUMENT, "%s: '%s' is not valid UTF-8",
                            e->where.what, key);
    return s_enc_raw_str (e, key, strlen (key)) || s_enc_raw_str (e, value, len) ? -1 : 0;
}

static int s_encode (s_enc_t *e, const sbx_msg_t *self)
{
    const sbx_meta_msg_t *meta = &sbx_meta_msgs[self->type];
    size_t body_count = s_struct_count (meta->body, self->body);
    //  A body with nothing to say is left out, unless a required field is missing
    //  (s_enc_struct then says which).
    bool body = body_count > 0;
    for (size_t i = 0; !body && i < meta->body->field_count; i++)
        body = meta->body->fields[i].required;
    size_t count = 1 + (self->rid != 0) + (self->caller != NULL) + (self->route != NULL) +
                   (self->instance != NULL) + (self->timeout_ms != 0) + body;
    e->depth = 1;
    if (msgpack_pack_map (&e->pk, count) || s_enc_raw_str (e, "type", 4) ||
        s_enc_raw_str (e, meta->name, strlen (meta->name)))
        return s_oom (&e->where);
    if (self->rid && (s_enc_raw_str (e, "rid", 3) || msgpack_pack_uint64 (&e->pk, self->rid)))
        return s_oom (&e->where);
    if (self->caller) {
        size_t saved = s_push (&e->where, "caller");
        if (s_enc_raw_str (e, "caller", 6) || s_enc_struct (e, sbx_meta_caller, self->caller))
            return -1;
        s_pop (&e->where, saved);
    }
    if (self->route && s_enc_envelope_str (e, "route", self->route))
        return -1;
    if (self->instance && s_enc_envelope_str (e, "instance", self->instance))
        return -1;
    if (self->timeout_ms &&
        (s_enc_raw_str (e, "timeout_ms", 10) || msgpack_pack_uint32 (&e->pk, self->timeout_ms)))
        return s_oom (&e->where);
    if (body && (s_enc_raw_str (e, "body", 4) || s_enc_struct (e, meta->body, self->body)))
        return -1;
    return 0;
}

//  What an encoding of body takes beyond its small fields: its byte fields' sizes, and
//  the sbuffer's first growth for the rest.
static size_t s_bytes_room (const sbx_meta_struct_t *meta, const void *body)
{
    size_t room = 0;
    for (size_t i = 0; meta && body && i < meta->field_count; i++)
        if (meta->fields[i].kind == SBX_META_BYTES) {
            size_t size = ((const sbx_bytes_t *) s_addr (body, &meta->fields[i]))->size;
            room += size <= sbx_meta_field_max (&meta->fields[i]) ? size : 0; //  else refused
        }
    return room ? room + MSGPACK_SBUFFER_INIT_SIZE : 0;
}

int sbx_msg_encode (const sbx_msg_t *self, uint8_t **data_p, size_t *size_p, sbx_err_t *err)
{
    assert (data_p && size_p);
    s_err_reset (err);
    *data_p = NULL;
    *size_p = 0;
    if (!self || self->type <= SBX_MSG__UNKNOWN || self->type >= SBX_MSG__COUNT)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "cannot encode a message of type %d",
                            self ? (int) self->type : -1);
    if (err)
        err->rid = self->rid;
    msgpack_sbuffer buffer;
    msgpack_sbuffer_init (&buffer);
    //  Room for the body's byte fields up front (a file chunk, output: a megabyte), so
    //  that the buffer is not grown by doubling, each step a copy, to hold them.
    size_t room = s_bytes_room (sbx_meta_msgs[self->type].body, self->body);
    if (room > MSGPACK_SBUFFER_INIT_SIZE) {
        buffer.data = malloc (room);
        buffer.alloc = buffer.data ? room : 0;
    }
    s_enc_t e = {.where = {.err = err, .what = sbx_meta_msgs[self->type].name}};
    msgpack_packer_init (&e.pk, &buffer, msgpack_sbuffer_write);
    if (s_encode (&e, self)) {
        msgpack_sbuffer_destroy (&buffer);
        return -1;
    }
    //  Frame size, value count: what a peer's decode checks first, checked the same way.
    if (s_prevalidate ((const uint8_t *) buffer.data, buffer.size, err)) {
        msgpack_sbuffer_destroy (&buffer);
        return -1;
    }
    *size_p = buffer.size;
    *data_p = (uint8_t *) msgpack_sbuffer_release (&buffer);
    return 0;
}

//  --------------------------------------------------------------------------------------
//  Decode, step 1: the raw bytes. Walks one object at *pos; every declared length must fit
//  in what is left, every container element needs at least one byte.

//  The formats with a type byte in 0xc0..0xdf: bytes of the big-endian length that
//  follows the type byte, bytes of fixed payload (ext's type byte counts as payload), and
//  elements per count (1 array, 2 map). 0xc1 is never used.
typedef struct {
    bool valid;
    uint8_t header;
    uint8_t payload;
    uint8_t container;
} s_format_t;

static const s_format_t s_formats[32] = {
    [0x00] = {true, 0, 0, 0},  //  nil
    [0x02] = {true, 0, 0, 0},  //  false
    [0x03] = {true, 0, 0, 0},  //  true
    [0x04] = {true, 1, 0, 0},  //  bin8
    [0x05] = {true, 2, 0, 0},  //  bin16
    [0x06] = {true, 4, 0, 0},  //  bin32
    [0x07] = {true, 1, 1, 0},  //  ext8
    [0x08] = {true, 2, 1, 0},  //  ext16
    [0x09] = {true, 4, 1, 0},  //  ext32
    [0x0a] = {true, 0, 4, 0},  //  float32
    [0x0b] = {true, 0, 8, 0},  //  float64
    [0x0c] = {true, 0, 1, 0},  //  uint8
    [0x0d] = {true, 0, 2, 0},  //  uint16
    [0x0e] = {true, 0, 4, 0},  //  uint32
    [0x0f] = {true, 0, 8, 0},  //  uint64
    [0x10] = {true, 0, 1, 0},  //  int8
    [0x11] = {true, 0, 2, 0},  //  int16
    [0x12] = {true, 0, 4, 0},  //  int32
    [0x13] = {true, 0, 8, 0},  //  int64
    [0x14] = {true, 0, 2, 0},  //  fixext1
    [0x15] = {true, 0, 3, 0},  //  fixext2
    [0x16] = {true, 0, 5, 0},  //  fixext4
    [0x17] = {true, 0, 9, 0},  //  fixext8
    [0x18] = {true, 0, 17, 0}, //  fixext16
    [0x19] = {true, 1, 0, 0},  //  str8
    [0x1a] = {true, 2, 0, 0},  //  str16
    [0x1b] = {true, 4, 0, 0},  //  str32
    [0x1c] = {true, 2, 0, 1},  //  array16
    [0x1d] = {true, 4, 0, 1},  //  array32
    [0x1e] = {true, 2, 0, 2},  //  map16
    [0x1f] = {true, 4, 0, 2},  //  map32
};

static int s_check (const uint8_t *data, size_t size, size_t *pos, unsigned depth, size_t *values,
                    sbx_err_t *err)
{
    size_t at = *pos;
    if (at >= size)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame truncated at byte %zu", at);
    if (++*values > S_MAX_VALUES)
        return sbx_err_set (err, SBX_E_TOO_LARGE, "frame holds more than %u values", S_MAX_VALUES);
    uint8_t b = data[at];
    size_t header = 0;
    size_t payload = 0;
    size_t count = 0;
    size_t container = 0;
    //  Anything else is a fixint: the type byte is all there is.
    if (b >= 0x80 && b <= 0x8f)
        container = 2, count = b & 0x0f;
    else if (b >= 0x90 && b <= 0x9f)
        container = 1, count = b & 0x0f;
    else if (b >= 0xa0 && b <= 0xbf)
        payload = b & 0x1f;
    else if (b >= 0xc0 && b <= 0xdf) {
        s_format_t format = s_formats[b - 0xc0];
        if (!format.valid)
            return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                                "frame has the invalid byte 0x%02x at byte %zu", b, at);
        header = format.header;
        payload = format.payload;
        container = format.container;
        if (size - at - 1 < header)
            return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame truncated at byte %zu", at);
        size_t length = 0;
        for (size_t k = 0; k < header; k++)
            length = (length << 8) | data[at + 1 + k];
        if (container)
            count = length;
        else
            payload += length;
    }
    at += 1 + header;
    size_t left = size - at;
    if (!container) {
        if (payload > left)
            return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                                "frame truncated at byte %zu: %zu bytes declared, %zu left", *pos,
                                payload, left);
        *pos = at + payload;
        return 0;
    }
    if (depth + 1 > SBX_MSG_MAX_DEPTH)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                            "frame nests deeper than %u levels at byte %zu", SBX_MSG_MAX_DEPTH,
                            *pos);
    if (count > left / container)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                            "frame truncated at byte %zu: %zu %s declared, %zu bytes left", *pos,
                            count, container == 2 ? "map entries" : "array items", left);
    *pos = at;
    for (size_t k = 0; k < count * container; k++)
        if (s_check (data, size, pos, depth + 1, values, err))
            return -1;
    return 0;
}

static int s_prevalidate (const uint8_t *data, size_t size, sbx_err_t *err)
{
    if (size == 0)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "empty frame");
    if (size > SBX_MSG_MAX_FRAME)
        return sbx_err_set (err, SBX_E_TOO_LARGE, "frame of %zu bytes exceeds %u", size,
                            SBX_MSG_MAX_FRAME);
    if (!((data[0] >= 0x80 && data[0] <= 0x8f) || data[0] == 0xde || data[0] == 0xdf))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame is not a msgpack map");
    size_t pos = 0;
    size_t values = 0;
    if (s_check (data, size, &pos, 0, &values, err))
        return -1;
    if (pos != size)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                            "frame has %zu trailing bytes after the message", size - pos);
    return 0;
}

//  Decode, step 2: the msgpack objects against the tables.

static bool s_key_is (const msgpack_object *key, const char *name)
{
    size_t len = strlen (name);
    return key->via.str.size == len && memcmp (key->via.str.ptr, name, len) == 0;
}

//  Copies a msgpack string into a new C string after checking length, NUL and UTF-8.
static int s_dec_str (s_where_t *w, const msgpack_object *o, size_t max, char **out_p)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be a string");
    size_t len = o->via.str.size;
    if (len > max)
        return s_fail (w, SBX_E_TOO_LARGE, "is longer than %zu bytes", max);
    if (memchr (o->via.str.ptr, 0, len))
        return s_fail (w, SBX_E_INVALID_ARGUMENT, "contains a NUL byte");
    if (!sbx_meta_utf8_valid (o->via.str.ptr, len))
        return s_fail (w, SBX_E_INVALID_ARGUMENT, "is not valid UTF-8");
    char *copy = malloc (len + 1);
    if (!copy)
        return s_oom (w);
    memcpy (copy, o->via.str.ptr, len);
    copy[len] = 0;
    *out_p = copy;
    return 0;
}

static int s_dec_struct (s_where_t *w, const sbx_meta_struct_t *meta, const msgpack_object *o,
                         void *body);

static int s_dec_field (s_where_t *w, const sbx_meta_field_t *f, const msgpack_object *o,
                        void *body)
{
    void *p = s_addr (body, f);
    size_t max = sbx_meta_field_max (f);
    switch (f->kind) {
    case SBX_META_STRING: {
        char *text;
        if (s_dec_str (w, o, max, &text))
            return -1;
        s_set_ptr (body, f, text);
        return 0;
    }
    case SBX_META_BYTES: {
        if (o->type != MSGPACK_OBJECT_BIN)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be binary (msgpack bin)");
        if (o->via.bin.size > max)
            return s_fail (w, SBX_E_TOO_LARGE, "is longer than %zu bytes", max);
        sbx_bytes_t *b = p;
        if (!(b->data = malloc (o->via.bin.size ? o->via.bin.size : 1)))
            return s_oom (w);
        b->size = o->via.bin.size;
        if (b->size)
            memcpy (b->data, o->via.bin.ptr, b->size);
        return 0;
    }
    case SBX_META_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be true or false");
        *(bool *) p = o->via.boolean;
        return 0;
    case SBX_META_INT:
        if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            *(int64_t *) p = o->via.i64;
        else if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be an integer");
        else if (o->via.u64 > INT64_MAX)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "is out of range for a signed integer");
        else
            *(int64_t *) p = (int64_t) o->via.u64;
        return 0;
    case SBX_META_UINT:
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be an unsigned integer");
        *(uint64_t *) p = o->via.u64;
        return 0;
    case SBX_META_ENUM: {
        if (o->type != MSGPACK_OBJECT_STR)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be a %s name", f->enum_meta->name);
        int value = s_enum_lookup (f->enum_meta, o->via.str.ptr, o->via.str.size);
        if (value < 0) {
            char quoted[48];
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "has '%s', not a %s",
                           s_quote (quoted, sizeof quoted, o->via.str.ptr, o->via.str.size),
                           f->enum_meta->name);
        }
        s_set_enum (body, f, value);
        return 0;
    }
    case SBX_META_STRLIST: {
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be an array of strings");
        if (o->via.array.size > max)
            return s_fail (w, SBX_E_TOO_LARGE, "has more than %zu items", max);
        sbx_strlist_t *list = p;
        if (o->via.array.size && !(list->items = calloc (o->via.array.size, sizeof (char *))))
            return s_oom (w);
        for (uint32_t k = 0; k < o->via.array.size; k++) {
            size_t saved = s_push_index (w, k);
            if (s_dec_str (w, &o->via.array.ptr[k], SBX_MSG_MAX_STRING, &list->items[k]))
                return -1;
            list->count++;
            s_pop (w, saved);
        }
        return 0;
    }
    case SBX_META_STRMAP: {
        if (o->type != MSGPACK_OBJECT_MAP)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be a map of strings");
        if (o->via.map.size > max)
            return s_fail (w, SBX_E_TOO_LARGE, "has more than %zu items", max);
        sbx_strmap_t *map = p;
        if (o->via.map.size) {
            map->keys = calloc (o->via.map.size, sizeof (char *));
            map->values = calloc (o->via.map.size, sizeof (char *));
            if (!map->keys || !map->values)
                return s_oom (w);
        }
        for (uint32_t k = 0; k < o->via.map.size; k++) {
            size_t saved = s_push_index (w, k);
            const msgpack_object_kv *kv = &o->via.map.ptr[k];
            int rc = s_dec_str (w, &kv->key, SBX_MSG_MAX_STRING, &map->keys[k]);
            if (rc == 0)
                rc = s_dec_str (w, &kv->val, SBX_MSG_MAX_STRING, &map->values[k]);
            //  count covers a half-filled entry so that destroy frees it
            map->count++;
            if (rc)
                return -1;
            s_pop (w, saved);
        }
        long dup = s_strmap_duplicate (map);
        if (dup == -2)
            return s_oom (w);
        if (dup >= 0) {
            char quoted[48];
            return s_fail (
                w, SBX_E_INVALID_ARGUMENT, "has the key '%s' twice",
                s_quote (quoted, sizeof quoted, map->keys[dup], strlen (map->keys[dup])));
        }
        return 0;
    }
    case SBX_META_LIST: {
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be an array");
        if (o->via.array.size > max)
            return s_fail (w, SBX_E_TOO_LARGE, "has more than %zu items", max);
        size_t size = f->struct_meta->size;
        s_list_t list = {NULL, o->via.array.size};
        if (list.count && !(list.items = calloc (list.count, size)))
            return s_oom (w);
        s_set_list (body, f, list);
        for (uint32_t k = 0; k < o->via.array.size; k++) {
            size_t saved = s_push_index (w, k);
            if (s_dec_struct (w, f->struct_meta, &o->via.array.ptr[k],
                              (char *) list.items + k * size))
                return -1;
            s_pop (w, saved);
        }
        return 0;
    }
    case SBX_META_STRUCT: {
        void *child = calloc (1, f->struct_meta->size);
        if (!child)
            return s_oom (w);
        s_set_ptr (body, f, child);
        return s_dec_struct (w, f->struct_meta, o, child);
    }
    }
    return s_fail (w, SBX_E_INTERNAL, "has unknown kind %d", (int) f->kind);
}

//  Fills a zeroed struct from a msgpack map. On failure the struct holds what was decoded
//  so far, for the caller to free with the rest of the message.
static int s_dec_struct (s_where_t *w, const sbx_meta_struct_t *meta, const msgpack_object *o,
                         void *body)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return s_fail (w, SBX_E_INVALID_ARGUMENT, "must be a map");
    //  Per field: 0 not seen, 1 seen as nil (absent), 2 holds a value.
    uint8_t seen_small[32];
    uint8_t *seen = seen_small;
    if (meta->field_count > sizeof seen_small && !(seen = calloc (meta->field_count, 1)))
        return s_oom (w);
    if (seen == seen_small)
        memset (seen_small, 0, sizeof seen_small);
    int rc = 0;
    for (uint32_t k = 0; rc == 0 && k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR) {
            rc = s_fail (w, SBX_E_INVALID_ARGUMENT, "has a key that is not a string");
            break;
        }
        size_t i = 0;
        while (i < meta->field_count && !s_key_is (&kv->key, meta->fields[i].name))
            i++;
        if (i == meta->field_count)
            continue; //  a newer peer's field: ignored
        size_t saved = s_push (w, meta->fields[i].name);
        if (seen[i])
            rc = s_fail (w, SBX_E_INVALID_ARGUMENT, "appears twice");
        else if (kv->val.type == MSGPACK_OBJECT_NIL)
            seen[i] = 1;
        else {
            seen[i] = 2;
            rc = s_dec_field (w, &meta->fields[i], &kv->val, body);
        }
        if (rc == 0)
            s_pop (w, saved);
    }
    for (size_t i = 0; rc == 0 && i < meta->field_count; i++)
        if (meta->fields[i].required && seen[i] != 2) {
            s_push (w, meta->fields[i].name);
            rc = s_fail (w, SBX_E_INVALID_ARGUMENT, "is required");
        }
    if (seen != seen_small)
        free (seen);
    return rc;
}

static int s_dec_envelope_str (s_where_t *w, const char *key, const msgpack_object *o, char **out_p)
{
    size_t saved = s_push (w, key);
    if (s_dec_str (w, o, S_ENVELOPE_STRING_MAX, out_p))
        return -1;
    s_pop (w, saved);
    return 0;
}

static sbx_msg_t *s_dec_envelope (const msgpack_object *o, sbx_err_t *err)
{
    if (o->type != MSGPACK_OBJECT_MAP) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame is not a msgpack map");
        return NULL;
    }
    //  First the type and rid, so that every later error can name both.
    static const char *const keys[] = {"type",     "rid",        "caller", "route",
                                       "instance", "timeout_ms", "body"};
    const msgpack_object *values[7] = {NULL};
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR) {
            sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame has a key that is not a string");
            return NULL;
        }
        for (size_t i = 0; i < 7; i++) {
            if (!s_key_is (&kv->key, keys[i]))
                continue;
            if (values[i]) {
                sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame has '%s' twice", keys[i]);
                return NULL;
            }
            values[i] = &kv->val;
        }
    }
    const msgpack_object *rid = values[1];
    if (rid && rid->type != MSGPACK_OBJECT_NIL) {
        if (rid->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame: 'rid' must be an unsigned integer");
            return NULL;
        }
        if (err)
            err->rid = rid->via.u64;
    }
    const msgpack_object *type = values[0];
    if (!type || type->type != MSGPACK_OBJECT_STR) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame has no 'type' string");
        return NULL;
    }
    int type_id = s_type_lookup (type->via.str.ptr, type->via.str.size);
    if (type_id < 0) {
        char quoted[48];
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "unknown message type '%s'",
                     s_quote (quoted, sizeof quoted, type->via.str.ptr, type->via.str.size));
        return NULL;
    }
    const sbx_meta_msg_t *meta = &sbx_meta_msgs[type_id];
    s_where_t w = {.err = err, .what = meta->name};
    sbx_msg_t *self = sbx_msg_new ((sbx_msg_type_t) type_id);
    if (!self) {
        s_oom (&w);
        return NULL;
    }
    if (rid && rid->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        self->rid = rid->via.u64;
    int rc = 0;
    const msgpack_object *caller = values[2];
    if (caller && caller->type != MSGPACK_OBJECT_NIL) {
        size_t saved = s_push (&w, "caller");
        if (!(self->caller = calloc (1, sbx_meta_caller->size)))
            rc = s_oom (&w);
        else
            rc = s_dec_struct (&w, sbx_meta_caller, caller, self->caller);
        if (rc == 0)
            s_pop (&w, saved);
    }
    if (rc == 0 && values[3] && values[3]->type != MSGPACK_OBJECT_NIL)
        rc = s_dec_envelope_str (&w, "route", values[3], &self->route);
    if (rc == 0 && values[4] && values[4]->type != MSGPACK_OBJECT_NIL)
        rc = s_dec_envelope_str (&w, "instance", values[4], &self->instance);
    const msgpack_object *timeout = values[5];
    if (rc == 0 && timeout && timeout->type != MSGPACK_OBJECT_NIL) {
        if (timeout->type != MSGPACK_OBJECT_POSITIVE_INTEGER || timeout->via.u64 > UINT32_MAX)
            rc = sbx_err_set (err, SBX_E_INVALID_ARGUMENT,
                              "%s: 'timeout_ms' must be an unsigned 32-bit integer", meta->name);
        else
            self->timeout_ms = (uint32_t) timeout->via.u64;
    }
    //  No body reads as an empty one: fine unless a field is required.
    msgpack_object empty = {.type = MSGPACK_OBJECT_MAP};
    const msgpack_object *body = values[6];
    if (!body || body->type == MSGPACK_OBJECT_NIL)
        body = &empty;
    if (rc == 0)
        rc = s_dec_struct (&w, meta->body, body, self->body);
    if (rc)
        sbx_msg_destroy (&self);
    return self;
}

sbx_msg_t *sbx_msg_decode (const uint8_t *data, size_t size, sbx_err_t *err)
{
    s_err_reset (err);
    if (!data && size) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "no frame");
        return NULL;
    }
    if (s_prevalidate (data, size, err))
        return NULL;
    msgpack_zone zone;
    if (!msgpack_zone_init (&zone, 2048)) {
        sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
        return NULL;
    }
    msgpack_object object;
    size_t offset = 0;
    msgpack_unpack_return rc = msgpack_unpack ((const char *) data, size, &offset, &zone, &object);
    sbx_msg_t *self = NULL;
    if (rc == MSGPACK_UNPACK_SUCCESS)
        self = s_dec_envelope (&object, err);
    else if (rc == MSGPACK_UNPACK_NOMEM_ERROR)
        sbx_err_set (err, SBX_E_INTERNAL, "out of memory decoding a frame of %zu bytes", size);
    else
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame is not valid msgpack");
    msgpack_zone_destroy (&zone);
    return self;
}

int sbx_msg_peek_type (const uint8_t *data, size_t size, sbx_msg_type_t *type_p, sbx_err_t *err)
{
    assert (type_p);
    s_err_reset (err);
    if (!data && size)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "no frame");
    if (s_prevalidate (data, size, err))
        return -1;
    msgpack_zone zone;
    if (!msgpack_zone_init (&zone, 2048))
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    //  msgpack_unpack refers to the frame's strings and bins in place.
    msgpack_object object;
    size_t offset = 0;
    msgpack_unpack_return rc = msgpack_unpack ((const char *) data, size, &offset, &zone, &object);
    int type = -1;
    if (rc == MSGPACK_UNPACK_SUCCESS && object.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t k = 0; k < object.via.map.size; k++) {
            const msgpack_object_kv *kv = &object.via.map.ptr[k];
            if (kv->key.type == MSGPACK_OBJECT_STR && s_key_is (&kv->key, "type") &&
                kv->val.type == MSGPACK_OBJECT_STR) {
                type = s_type_lookup (kv->val.via.str.ptr, kv->val.via.str.size);
                break;
            }
        }
        if (type < 0)
            sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "frame has no known 'type'");
    } else
        sbx_err_set (
            err, rc == MSGPACK_UNPACK_NOMEM_ERROR ? SBX_E_INTERNAL : SBX_E_INVALID_ARGUMENT,
            rc == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "frame is not a msgpack map");
    msgpack_zone_destroy (&zone);
    if (type < 0)
        return -1;
    *type_p = (sbx_msg_type_t) type;
    return 0;
}

//  --------------------------------------------------------------------------------------
//  Replies

sbx_msg_t *sbx_msg_new_error (uint64_t rid, sbx_code_t code, const char *format, ...)
{
    sbx_msg_t *self = sbx_msg_new (SBX_MSG_ERROR);
    if (!self)
        return NULL;
    self->rid = rid;
    sbx_error_t *error = self->body;
    //  An error path must not fail on a bad code: it becomes internal.
    error->code = code > SBX_OK && code < SBX_CODE__COUNT ? code : SBX_E_INTERNAL;
    va_list args;
    va_start (args, format);
    int len = vsnprintf (NULL, 0, format, args);
    va_end (args);
    error->message = malloc (len < 0 ? 1 : (size_t) len + 1);
    if (!error->message) {
        sbx_msg_destroy (&self);
        return NULL;
    }
    error->message[0] = 0;
    if (len > 0) {
        va_start (args, format);
        vsnprintf (error->message, (size_t) len + 1, format, args);
        va_end (args);
    }
    //  Make it encodable whatever went into it: valid UTF-8, within the schema's max.
    sbx_utf8_sanitize (error->message);
    const sbx_meta_struct_t *meta = sbx_meta_msgs[SBX_MSG_ERROR].body;
    for (size_t i = 0; i < meta->field_count; i++)
        if (strcmp (meta->fields[i].name, "message") == 0) {
            size_t max = sbx_meta_field_max (&meta->fields[i]);
            if (strlen (error->message) > max) {
                while (max > 0 && ((unsigned char) error->message[max] & 0xc0) == 0x80)
                    max--;
                error->message[max] = 0;
            }
        }
    return self;
}

sbx_msg_t *sbx_msg_new_reply (const sbx_msg_t *request, sbx_msg_type_t type)
{
    sbx_msg_t *self = sbx_msg_new (type);
    if (self && request)
        self->rid = request->rid;
    return self;
}

//  --------------------------------------------------------------------------------------
//  Random messages, for tests. Depth 2 is the body map; optional nesting stops early so
//  that recursive schemas stay small.

#define S_RANDOM_NEST_MAX 8

uint64_t sbx_meta_rand (uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t s_below (uint64_t *st, size_t n)
{
    return n ? (size_t) (sbx_meta_rand (st) % n) : 0;
}

//  Lengths: empty, exactly the limit, or short; limits above 64 KiB are not worth filling.
static size_t s_rand_length (uint64_t *st, size_t max)
{
    size_t r = s_below (st, 8);
    if (r == 0)
        return 0;
    if (r == 1 && max <= 65536)
        return max;
    return s_below (st, (max < 24 ? max : 24) + 1);
}

static char *s_rand_string (uint64_t *st, size_t max)
{
    size_t target = s_rand_length (st, max);
    char *text = malloc (target + 1);
    if (!text)
        return NULL;
    size_t len = 0;
    while (len < target) {
        size_t room = target - len;
        uint32_t cp;
        size_t r = s_below (st, 10);
        if (r == 6 && room >= 2)
            cp = 0x80 + (uint32_t) s_below (st, 0x800 - 0x80);
        else if (r == 7 && room >= 3) {
            cp = 0x800 + (uint32_t) s_below (st, 0x10000 - 0x800);
            if (cp >= 0xd800 && cp <= 0xdfff)
                cp = 0x4e2d; //  not a surrogate: 中
        } else if (r == 8 && room >= 4)
            cp = 0x10000 + (uint32_t) s_below (st, 0x110000 - 0x10000);
        else if (r == 9)
            cp = 1 + (uint32_t) s_below (st, 0x7f); //  controls too, never NUL
        else
            cp = 0x20 + (uint32_t) s_below (st, 0x5f);
        unsigned char *out = (unsigned char *) text + len;
        if (cp < 0x80)
            out[0] = (unsigned char) cp, len += 1;
        else if (cp < 0x800)
            out[0] = (unsigned char) (0xc0 | (cp >> 6)),
            out[1] = (unsigned char) (0x80 | (cp & 0x3f)), len += 2;
        else if (cp < 0x10000)
            out[0] = (unsigned char) (0xe0 | (cp >> 12)),
            out[1] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f)),
            out[2] = (unsigned char) (0x80 | (cp & 0x3f)), len += 3;
        else
            out[0] = (unsigned char) (0xf0 | (cp >> 18)),
            out[1] = (unsigned char) (0x80 | ((cp >> 12) & 0x3f)),
            out[2] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f)),
            out[3] = (unsigned char) (0x80 | (cp & 0x3f)), len += 4;
    }
    text[len] = 0;
    return text;
}

static uint64_t s_rand_number (uint64_t *st)
{
    static const uint64_t edges[] = {0,          1,
                                     31,         32,
                                     127,        128,
                                     255,        256,
                                     65535,      65536,
                                     UINT32_MAX, (uint64_t) UINT32_MAX + 1,
                                     INT64_MAX,  (uint64_t) INT64_MAX + 1,
                                     UINT64_MAX};
    size_t r = s_below (st, 4);
    if (r == 0)
        return edges[s_below (st, sizeof edges / sizeof edges[0])];
    if (r == 1)
        return sbx_meta_rand (st);
    return sbx_meta_rand (st) >> s_below (st, 64);
}

static int s_rand_struct (uint64_t *st, const sbx_meta_struct_t *meta, void *body, bool full,
                          unsigned depth);

static int s_rand_field (uint64_t *st, const sbx_meta_field_t *f, void *body, bool full,
                         unsigned depth)
{
    void *p = s_addr (body, f);
    size_t max = sbx_meta_field_max (f);
    size_t nest = depth < S_RANDOM_NEST_MAX ? SBX_MSG_MAX_DEPTH : 0;
    switch (f->kind) {
    case SBX_META_STRING: {
        char *text = s_rand_string (st, max);
        if (!text)
            return -1;
        s_set_ptr (body, f, text);
        return 0;
    }
    case SBX_META_BYTES: {
        sbx_bytes_t *b = p;
        b->size = s_rand_length (st, max);
        if (!(b->data = malloc (b->size ? b->size : 1)))
            return -1;
        for (size_t k = 0; k < b->size; k++)
            b->data[k] = (uint8_t) sbx_meta_rand (st);
        return 0;
    }
    case SBX_META_BOOL:
        *(bool *) p = sbx_meta_rand (st) & 1;
        return 0;
    case SBX_META_INT: {
        uint64_t n = s_rand_number (st);
        int64_t value;
        memcpy (&value, &n, sizeof value); //  every bit pattern, negatives included
        *(int64_t *) p = value;
        return 0;
    }
    case SBX_META_UINT:
        *(uint64_t *) p = s_rand_number (st);
        return 0;
    case SBX_META_ENUM:
        s_set_enum (body, f, 1 + (int) s_below (st, f->enum_meta->count - 1));
        return 0;
    case SBX_META_STRLIST: {
        size_t count = depth + 1 <= nest ? s_below (st, (max < 3 ? max : 3) + 1) : 0;
        for (size_t k = 0; k < count; k++) {
            char *text = s_rand_string (st, SBX_MSG_MAX_STRING);
            int rc = text ? sbx_strlist_append (p, text) : -1;
            free (text);
            if (rc)
                return -1;
        }
        return 0;
    }
    case SBX_META_STRMAP: {
        size_t count = depth + 1 <= nest ? s_below (st, (max < 3 ? max : 3) + 1) : 0;
        for (size_t k = 0; k < count; k++) {
            char *key = s_rand_string (st, 32);
            char *value = s_rand_string (st, SBX_MSG_MAX_STRING);
            int rc = key && value ? sbx_strmap_set (p, key, value) : -1;
            free (key);
            free (value);
            if (rc)
                return -1;
        }
        return 0;
    }
    case SBX_META_LIST: {
        size_t count = depth + 2 <= nest ? s_below (st, (max < 3 ? max : 3) + 1) : 0;
        s_list_t list = s_get_list (body, f);
        for (size_t k = 0; k < count; k++) {
            void *item = sbx_meta_list_append (&list.items, &list.count, f->struct_meta->size);
            s_set_list (body, f, list);
            if (!item || s_rand_struct (st, f->struct_meta, item, full, depth + 2))
                return -1;
        }
        return 0;
    }
    case SBX_META_STRUCT: {
        if (depth + 1 > nest && !f->required)
            return 0;
        void *child = calloc (1, f->struct_meta->size);
        if (!child)
            return -1;
        s_set_ptr (body, f, child);
        return s_rand_struct (st, f->struct_meta, child, full, depth + 1);
    }
    }
    return -1;
}

static int s_rand_struct (uint64_t *st, const sbx_meta_struct_t *meta, void *body, bool full,
                          unsigned depth)
{
    for (size_t i = 0; i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        if (!f->required && !full && s_below (st, 3) == 0)
            continue;
        if (s_rand_field (st, f, body, full, depth))
            return -1;
    }
    return 0;
}

sbx_msg_t *sbx_meta_random_msg (sbx_msg_type_t type, bool full, uint64_t *st)
{
    sbx_msg_t *self = sbx_msg_new (type);
    if (!self)
        return NULL;
    self->rid = s_below (st, 4) ? sbx_meta_rand (st) >> s_below (st, 64) : 0;
    self->timeout_ms = s_below (st, 2) ? (uint32_t) sbx_meta_rand (st) : 0;
    int rc = 0;
    if (full || s_below (st, 2)) {
        self->caller = calloc (1, sbx_meta_caller->size);
        rc = self->caller ? s_rand_struct (st, sbx_meta_caller, self->caller, full, 2) : -1;
    }
    if (rc == 0 && (full || s_below (st, 2)) &&
        !(self->route = s_rand_string (st, S_ENVELOPE_STRING_MAX)))
        rc = -1;
    if (rc == 0 && (full || s_below (st, 2)) &&
        !(self->instance = s_rand_string (st, S_ENVELOPE_STRING_MAX)))
        rc = -1;
    if (rc == 0)
        rc = s_rand_struct (st, sbx_meta_msgs[type].body, self->body, full, 2);
    if (rc)
        sbx_msg_destroy (&self);
    return self;
}

//  The self-test asserts even in release builds (CMake's RelWithDebInfo sets NDEBUG):
//  <assert.h> redefines assert each time it is included.
#undef NDEBUG
#include <assert.h>

//  --------------------------------------------------------------------------------------
//  Self test (the codec part; sbx_msg_test in sbx_msg_json.c runs it, then the JSON part)

//  Encodes, decodes and compares; returns the decoded copy.
static sbx_msg_t *s_round_trip (const sbx_msg_t *msg)
{
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    int rc = sbx_msg_encode (msg, &data, &size, &err);
    if (rc)
        fprintf (stderr, "encode %s: %s\n", sbx_msg_type_name (msg->type), err.message);
    assert (rc == 0);
    sbx_msg_t *copy = sbx_msg_decode (data, size, &err);
    if (!copy)
        fprintf (stderr, "decode %s: %s\n", sbx_msg_type_name (msg->type), err.message);
    assert (copy);
    assert (err.code == SBX_OK);
    assert (sbx_msg_eq (msg, copy));
    free (data);
    return copy;
}

//  Packs a frame by hand, as another implementation would.
static sbx_msg_t *s_decode_packed (msgpack_sbuffer *buffer, sbx_err_t *err)
{
    sbx_msg_t *msg = sbx_msg_decode ((const uint8_t *) buffer->data, buffer->size, err);
    msgpack_sbuffer_clear (buffer);
    return msg;
}

static void s_pack_str (msgpack_packer *pk, const char *text)
{
    msgpack_pack_str (pk, strlen (text));
    msgpack_pack_str_body (pk, text, strlen (text));
}

void sbx_meta_codec_test (bool verbose)
{
    (void) verbose;
    sbx_err_t err;

    //  Names
    for (int t = 1; t < SBX_MSG__COUNT; t++) {
        sbx_msg_type_t type;
        assert (sbx_msg_type_from_name (sbx_msg_type_name ((sbx_msg_type_t) t), &type) == 0);
        assert ((int) type == t);
    }
    assert (sbx_msg_type_from_name ("no.such", NULL) == -1);
    assert (sbx_msg_type_name (SBX_MSG__UNKNOWN) == NULL);
    assert (streq (sbx_msg_type_name (SBX_MSG_PEER_HELLO), "peer.hello"));
    assert (sbx_msg_type_is_reply (SBX_MSG_ERROR) && sbx_msg_type_is_reply (SBX_MSG_PEER_WELCOME));
    assert (sbx_msg_type_reply (SBX_MSG_SANDBOX_CREATE) == SBX_MSG_SANDBOX_CREATE_OK);
    assert (sbx_msg_type_reply (SBX_MSG__UNKNOWN) == SBX_MSG__UNKNOWN);
    assert (!sbx_msg_type_is_reply (SBX_MSG_PEER_HELLO) &&
            !sbx_msg_type_is_reply (SBX_MSG__UNKNOWN));
    for (int c = 0; c < SBX_CODE__COUNT; c++) {
        sbx_code_t code;
        assert (sbx_code_from_name (sbx_code_name ((sbx_code_t) c), &code) == 0);
        assert ((int) code == c);
    }
    assert (sbx_code_http_status (SBX_E_NOT_FOUND) == 404);
    assert (sbx_code_http_status (SBX_OK) == 200);
    assert (streq (sbx_code_name (SBX_E_INVALID_ARGUMENT), "invalid_argument"));
    sbx_key_preset_t preset;
    assert (sbx_key_preset_from_name ("read-only", &preset) == 0);
    assert (preset == SBX_KEY_PRESET_READ_ONLY);
    assert (sbx_key_preset_from_name ("READ-ONLY", &preset) == -1);
    assert (sbx_role_name (SBX_ROLE__UNSET) == NULL);
    assert (streq (sbx_role_name (SBX_ROLE_VMD), "vmd"));

    //  A peer.hello, as a worker sends it, and as the broker reads it.
    sbx_msg_t *hello = sbx_msg_new (SBX_MSG_PEER_HELLO);
    assert (hello);
    hello->rid = 7;
    sbx_peer_hello_t *body = sbx_msg_peer_hello (hello);
    assert (body);
    assert (sbx_msg_peer_welcome (hello) == NULL);
    body->role = SBX_ROLE_VMD;
    assert (sbx_str_set (&body->instance, "host-a") == 0);
    body->capacity = 16;
    uint8_t *data;
    size_t size;
    assert (sbx_msg_encode (hello, &data, &size, &err) == 0);
    sbx_msg_t *got = sbx_msg_decode (data, size, &err);
    assert (got);
    assert (got->type == SBX_MSG_PEER_HELLO && got->rid == 7 && got->caller == NULL);
    assert (sbx_msg_peer_hello (got)->role == SBX_ROLE_VMD);
    assert (streq (sbx_msg_peer_hello (got)->instance, "host-a"));
    assert (sbx_msg_peer_hello (got)->capacity == 16);
    assert (sbx_msg_eq (hello, got));
    sbx_msg_peer_hello (got)->used = 1;
    assert (!sbx_msg_eq (hello, got));
    sbx_msg_destroy (&got);
    assert (got == NULL);
    sbx_msg_destroy (&got); //  twice is fine

    //  Every truncation of a good frame is refused, with a message.
    for (size_t cut = 0; cut < size; cut++) {
        assert (sbx_msg_decode (data, cut, &err) == NULL);
        assert (err.code == SBX_E_INVALID_ARGUMENT && err.message[0]);
    }
    free (data);

    //  Missing required fields: encode refuses them and names the field.
    free (body->instance);
    body->instance = NULL;
    assert (sbx_msg_encode (hello, &data, &size, &err) == -1);
    assert (err.code == SBX_E_INVALID_ARGUMENT);
    assert (streq (err.message, "peer.hello: field 'instance' is required"));
    assert (sbx_str_set (&body->instance, "host-a") == 0);
    body->role = SBX_ROLE__UNSET;
    assert (sbx_msg_encode (hello, &data, &size, &err) == -1);
    assert (strstr (err.message, "'role' is required"));
    body->role = (sbx_role_t) 99;
    assert (sbx_msg_encode (hello, &data, &size, &err) == -1);
    body->role = SBX_ROLE_VMD;
    assert (sbx_str_set (&body->version, "0.1.0-\xff") == 0);
    assert (sbx_msg_encode (hello, &data, &size, &err) == -1);
    assert (strstr (err.message, "UTF-8"));
    char big[200];
    memset (big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert (sbx_str_set (&body->version, big) == 0);
    assert (sbx_msg_encode (hello, &data, &size, &err) == -1);
    assert (err.code == SBX_E_TOO_LARGE);
    assert (sbx_str_set (&body->version, NULL) == 0);
    assert (body->version == NULL);

    //  Every message type, random fields, round trip, dup.
    uint64_t seed = 0x5b5c0dec0ffeeull;
    for (int t = 1; t < SBX_MSG__COUNT; t++) {
        for (int round = 0; round < 24; round++) {
            sbx_msg_t *msg = sbx_meta_random_msg ((sbx_msg_type_t) t, round % 2 == 0, &seed);
            assert (msg);
            sbx_msg_t *copy = s_round_trip (msg);
            sbx_msg_t *dup = sbx_msg_dup (msg);
            assert (dup && sbx_msg_eq (dup, msg) && sbx_msg_eq (dup, copy));
            dup->rid++;
            assert (!sbx_msg_eq (dup, msg));
            sbx_msg_destroy (&dup);
            sbx_msg_destroy (&copy);
            sbx_msg_destroy (&msg);
        }
        //  Each required field left out fails encode (pointers, enums) or decode (numbers).
        const sbx_meta_struct_t *meta = sbx_meta_msgs[t].body;
        for (size_t i = 0; i < meta->field_count; i++) {
            const sbx_meta_field_t *f = &meta->fields[i];
            if (!f->required)
                continue;
            sbx_msg_t *msg = sbx_meta_random_msg ((sbx_msg_type_t) t, true, &seed);
            s_field_clear (f, msg->body);
            if (f->kind == SBX_META_STRING || f->kind == SBX_META_BYTES ||
                f->kind == SBX_META_ENUM || f->kind == SBX_META_STRUCT) {
                assert (sbx_msg_encode (msg, &data, &size, &err) == -1);
                assert (err.code == SBX_E_INVALID_ARGUMENT && strstr (err.message, f->name));
            } else {
                //  Always sent; a peer that leaves it out is refused.
                msgpack_sbuffer buffer;
                msgpack_sbuffer_init (&buffer);
                msgpack_packer pk;
                msgpack_packer_init (&pk, &buffer, msgpack_sbuffer_write);
                msgpack_pack_map (&pk, 3);
                s_pack_str (&pk, "type");
                s_pack_str (&pk, sbx_meta_msgs[t].name);
                s_pack_str (&pk, "rid");
                msgpack_pack_uint64 (&pk, 99);
                s_pack_str (&pk, "body");
                msgpack_pack_map (&pk, 0);
                assert (s_decode_packed (&buffer, &err) == NULL);
                assert (err.code == SBX_E_INVALID_ARGUMENT && err.rid == 99);
                assert (strstr (err.message, "is required"));
                msgpack_sbuffer_destroy (&buffer);
            }
            sbx_msg_destroy (&msg);
        }
    }

    //  Frames from a newer peer: unknown keys at every level are ignored; nil is absent.
    msgpack_sbuffer buffer;
    msgpack_sbuffer_init (&buffer);
    msgpack_packer pk;
    msgpack_packer_init (&pk, &buffer, msgpack_sbuffer_write);
    msgpack_pack_map (&pk, 5);
    s_pack_str (&pk, "future");
    msgpack_pack_array (&pk, 2);
    msgpack_pack_double (&pk, 1.5);
    msgpack_pack_map (&pk, 1);
    msgpack_pack_int (&pk, 1); //  non-string keys are fine where nobody looks
    msgpack_pack_nil (&pk);
    s_pack_str (&pk, "rid");
    msgpack_pack_uint64 (&pk, 12);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "peer.hello");
    s_pack_str (&pk, "route");
    msgpack_pack_nil (&pk);
    s_pack_str (&pk, "body");
    msgpack_pack_map (&pk, 5);
    s_pack_str (&pk, "instance");
    s_pack_str (&pk, "b");
    s_pack_str (&pk, "gpu");
    msgpack_pack_map (&pk, 1);
    s_pack_str (&pk, "count");
    msgpack_pack_int (&pk, 2);
    s_pack_str (&pk, "role");
    s_pack_str (&pk, "gateway");
    s_pack_str (&pk, "pid");
    msgpack_pack_int (&pk, 4242);
    s_pack_str (&pk, "version");
    msgpack_pack_nil (&pk);
    got = s_decode_packed (&buffer, &err);
    assert (got && got->rid == 12 && got->route == NULL);
    assert (sbx_msg_peer_hello (got)->pid == 4242);
    assert (sbx_msg_peer_hello (got)->role == SBX_ROLE_GATEWAY);
    assert (sbx_msg_peer_hello (got)->version == NULL);
    sbx_msg_destroy (&got);

    //  Wrong types are refused with the field named, and rid kept for the error reply.
    msgpack_pack_map (&pk, 3);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "peer.hello");
    s_pack_str (&pk, "body");
    msgpack_pack_map (&pk, 3);
    s_pack_str (&pk, "role");
    s_pack_str (&pk, "vmd");
    s_pack_str (&pk, "instance");
    s_pack_str (&pk, "c");
    s_pack_str (&pk, "capacity");
    msgpack_pack_int (&pk, -1);
    s_pack_str (&pk, "rid");
    msgpack_pack_uint64 (&pk, 31);
    assert (s_decode_packed (&buffer, &err) == NULL);
    assert (err.code == SBX_E_INVALID_ARGUMENT && err.rid == 31);
    assert (streq (err.message, "peer.hello: field 'capacity' must be an unsigned integer"));

    msgpack_pack_map (&pk, 2);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "broker.peers.ok");
    s_pack_str (&pk, "body");
    msgpack_pack_map (&pk, 1);
    s_pack_str (&pk, "peers");
    msgpack_pack_array (&pk, 2);
    msgpack_pack_map (&pk, 2);
    s_pack_str (&pk, "role");
    s_pack_str (&pk, "vmd");
    s_pack_str (&pk, "instance");
    s_pack_str (&pk, "a");
    msgpack_pack_map (&pk, 2);
    s_pack_str (&pk, "role");
    s_pack_str (&pk, "toaster");
    s_pack_str (&pk, "instance");
    s_pack_str (&pk, "b");
    assert (s_decode_packed (&buffer, &err) == NULL);
    assert (
        streq (err.message, "broker.peers.ok: field 'peers[1].role' has 'toaster', not a role"));

    msgpack_pack_map (&pk, 1);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "peer.teleport");
    assert (s_decode_packed (&buffer, &err) == NULL);
    assert (streq (err.message, "unknown message type 'peer.teleport'"));

    msgpack_pack_map (&pk, 2);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "peer.bye");
    s_pack_str (&pk, "body");
    msgpack_pack_map (&pk, 1);
    s_pack_str (&pk, "reason");
    msgpack_pack_str (&pk, 3);
    msgpack_pack_str_body (&pk, "a\0b", 3);
    assert (s_decode_packed (&buffer, &err) == NULL);
    assert (strstr (err.message, "NUL"));

    msgpack_pack_map (&pk, 2);
    s_pack_str (&pk, "type");
    s_pack_str (&pk, "peer.bye");
    s_pack_str (&pk, "body");
    msgpack_pack_map (&pk, 1);
    s_pack_str (&pk, "reason");
    msgpack_pack_str (&pk, 300);
    msgpack_pack_str_body (&pk, big, 150);
    msgpack_pack_str_body (&pk, big, 150);
    assert (s_decode_packed (&buffer, &err) == NULL);
    assert (err.code == SBX_E_TOO_LARGE);
    assert (streq (err.message, "peer.bye: field 'reason' is longer than 256 bytes"));
    msgpack_sbuffer_destroy (&buffer);

    //  Hostile headers are refused before anything is allocated from them.
    static const uint8_t huge_array[] = {0x81, 0xa4, 't',  'y',  'p', 'e',
                                         0xdd, 0xff, 0xff, 0xff, 0xff};
    assert (sbx_msg_decode (huge_array, sizeof huge_array, &err) == NULL);
    assert (strstr (err.message, "truncated"));
    static const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    assert (sbx_msg_decode (huge_map, sizeof huge_map, &err) == NULL);
    static const uint8_t huge_str[] = {0x81, 0xdb, 0xff, 0xff, 0xff, 0xff};
    assert (sbx_msg_decode (huge_str, sizeof huge_str, &err) == NULL);
    uint8_t deep[1002];
    deep[0] = 0x81;
    memset (deep + 1, 0x91, sizeof deep - 2);
    deep[sizeof deep - 1] = 0xc0;
    assert (sbx_msg_decode (deep, sizeof deep, &err) == NULL);
    assert (strstr (err.message, "deeper"));
    assert (sbx_msg_decode (deep, 0, &err) == NULL);
    assert (streq (err.message, "empty frame"));
    size_t many_size = 16 + (size_t) S_MAX_VALUES;
    uint8_t *many = malloc (many_size);
    assert (many);
    memcpy (many, "\x81\xa1x\xdd\x00\x10\x00\x00", 8); //  {"x": [2^20 nils]}
    memset (many + 8, 0xc0, many_size - 8);
    assert (sbx_msg_decode (many, 8 + (1u << 20), &err) == NULL);
    assert (err.code == SBX_E_TOO_LARGE && strstr (err.message, "values"));
    free (many);

    //  Error replies and replies keep the rid; the message is cut to fit and made UTF-8.
    sbx_msg_t *error = sbx_msg_new_error (hello->rid, SBX_E_NOT_FOUND, "no sandbox %s", "sb_1");
    assert (error && error->type == SBX_MSG_ERROR && error->rid == 7);
    assert (sbx_msg_error (error)->code == SBX_E_NOT_FOUND);
    assert (streq (sbx_msg_error (error)->message, "no sandbox sb_1"));
    got = s_round_trip (error);
    sbx_msg_destroy (&got);
    sbx_msg_destroy (&error);
    char *long_text = malloc (10001);
    assert (long_text);
    for (size_t k = 0; k < 10000; k += 2)
        memcpy (long_text + k, "\xc3\xa9", 2); //  é
    long_text[10000] = 0;
    error = sbx_msg_new_error (1, (sbx_code_t) 1000, "%s\xff", long_text);
    assert (error && sbx_msg_error (error)->code == SBX_E_INTERNAL);
    assert (strlen (sbx_msg_error (error)->message) == 4096);
    got = s_round_trip (error);
    sbx_msg_destroy (&got);
    sbx_msg_destroy (&error);
    free (long_text);
    sbx_msg_t *reply = sbx_msg_new_reply (hello, SBX_MSG_PEER_WELCOME);
    assert (reply && reply->rid == 7 && sbx_msg_peer_welcome (reply));
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&hello);
    assert (sbx_msg_new (SBX_MSG__UNKNOWN) == NULL && sbx_msg_new (SBX_MSG__COUNT) == NULL);

    //  The subject: one accessor for the sandbox any message is about.
    sbx_msg_t *stop = sbx_msg_new (SBX_MSG_VM_STOP);
    assert (sbx_msg_subject (stop) == NULL && sbx_msg_set_subject (stop, "sb_1") == 0);
    assert (streq (sbx_msg_vm_stop (stop)->sandbox_id, "sb_1"));
    assert (streq (sbx_msg_subject (stop), "sb_1"));
    sbx_msg_destroy (&stop);
    sbx_msg_t *ok = sbx_msg_new (SBX_MSG_SANDBOX_GET_OK);
    sbx_sandbox_info_t **slot = sbx_msg_sandbox_slot (ok);
    assert (slot && slot == &sbx_msg_sandbox_get_ok (ok)->sandbox && sbx_msg_subject (ok) == NULL);
    *slot = calloc (1, sizeof (sbx_sandbox_info_t));
    sbx_str_set (&(*slot)->id, "sb_2");
    assert (streq (sbx_msg_subject (ok), "sb_2") && sbx_msg_set_subject (ok, "sb_3") == -1);
    sbx_msg_destroy (&ok);
    sbx_msg_t *peers = sbx_msg_new (SBX_MSG_BROKER_PEERS);
    assert (!sbx_msg_subject (peers) && !sbx_msg_sandbox_slot (peers));
    assert (sbx_msg_set_subject (peers, "sb_1") == -1 && !sbx_msg_subject (NULL));
    sbx_msg_destroy (&peers);

    //  Setters
    sbx_strmap_t map = {NULL, NULL, 0};
    assert (sbx_strmap_set (&map, "a", "1") == 0 && sbx_strmap_set (&map, "b", "2") == 0);
    assert (sbx_strmap_set (&map, "a", "3") == 0 && map.count == 2);
    assert (streq (sbx_strmap_get (&map, "a"), "3") && sbx_strmap_get (&map, "c") == NULL);
    assert (sbx_strmap_set (&map, "a", NULL) == 0 && map.count == 1);
    assert (streq (map.keys[0], "b"));
    sbx_strlist_t list = {NULL, 0};
    assert (sbx_strlist_append (&list, "x") == 0 && list.count == 1);
    sbx_strlist_clear (&list);
    assert (list.count == 0 && list.items == NULL);
    assert (sbx_strlist_append (&list, "x") == 0 && list.count == 1);
    sbx_bytes_t bytes = {NULL, 0};
    assert (sbx_bytes_set (&bytes, "", 0) == 0 && bytes.data && bytes.size == 0);
    assert (sbx_bytes_set (&bytes, NULL, 0) == 0 && bytes.data == NULL);
    //  Taken, not copied: the buffer itself, present even when empty.
    uint8_t *taken = malloc (4);
    uint8_t *was = taken;
    sbx_bytes_take (&bytes, &taken, 3);
    assert (!taken && bytes.data == was && bytes.size == 3);
    taken = malloc (1);
    sbx_bytes_take (&bytes, &taken, 0);
    assert (!taken && bytes.data && bytes.size == 0);
    free (bytes.data);
    //  Freed as a message would free them.
    const sbx_meta_field_t map_field = {"map", SBX_META_STRMAP, 0, false, 0, NULL, NULL};
    const sbx_meta_field_t list_field = {"list", SBX_META_STRLIST, 0, false, 0, NULL, NULL};
    s_field_clear (&map_field, &map);
    s_field_clear (&list_field, &list);
    assert (map.count == 0 && map.keys == NULL && list.items == NULL);
}
