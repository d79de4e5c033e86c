/*  sbx_msg_json - a message body as JSON text, for `sbx tap` and logs.

    Kept apart from sbx_msg.c so that the codec library (sbx_codec) needs msgpack only:
    the static guest agent links it without jansson. For the same reason sbx_msg_test
    lives here: it runs the codec's own test, then checks the JSON walker, and only
    programs that link sbx_common (and so jansson) run it.

    The JSON object has the keys the msgpack body would have (absent fields are left out,
    as on the wire). Enums appear as their names, bytes as base64 strings, uint values
    above INT64_MAX as decimal strings (jansson integers are signed 64-bit), and bytes
    that are not UTF-8 - possible only in a message built in memory - as U+FFFD.
*/
#include "sbx_msg.h"
#include "sbx_msg_meta.h"

#include <jansson.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *s_base64 (const uint8_t *data, size_t size)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc ((size + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < size; i += 3) {
        uint32_t v = (uint32_t) data[i] << 16;
        if (i + 1 < size)
            v |= (uint32_t) data[i + 1] << 8;
        if (i + 2 < size)
            v |= data[i + 2];
        out[o++] = alphabet[(v >> 18) & 63];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < size ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < size ? alphabet[v & 63] : '=';
    }
    out[o] = 0;
    return out;
}

//  A JSON string for any C string: invalid UTF-8 bytes become U+FFFD.
static json_t *s_string (const char *text)
{
    size_t len = strlen (text);
    if (sbx_meta_utf8_valid (text, len))
        return json_stringn (text, len);
    char *clean = malloc (len * 3 + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = 1;
        while (n <= 4 && i + n <= len && !sbx_meta_utf8_valid (text + i, n))
            n++;
        if (n > 4 || i + n > len) {
            memcpy (clean + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy (clean + o, text + i, n);
            o += n;
            i += n;
        }
    }
    json_t *json = json_stringn (clean, o);
    free (clean);
    return json;
}

static json_t *s_struct_json (const sbx_meta_struct_t *meta, const void *body);

static json_t *s_field_json (const sbx_meta_field_t *f, const void *body)
{
    const void *p = (const char *) body + f->offset;
    switch (f->kind) {
    case SBX_META_STRING: {
        const char *text;
        memcpy (&text, p, sizeof text);
        return s_string (text);
    }
    case SBX_META_BYTES: {
        const sbx_bytes_t *b = p;
        char *text = s_base64 (b->data, b->size);
        json_t *json = text ? json_string (text) : NULL;
        free (text);
        return json;
    }
    case SBX_META_BOOL:
        return json_boolean (*(const bool *) p);
    case SBX_META_INT:
        return json_integer ((json_int_t) * (const int64_t *) p);
    case SBX_META_UINT: {
        uint64_t value = *(const uint64_t *) p;
        if (value <= INT64_MAX)
            return json_integer ((json_int_t) value);
        char text[24];
        snprintf (text, sizeof text, "%llu", (unsigned long long) value);
        return json_string (text);
    }
    case SBX_META_ENUM: {
        int value;
        memcpy (&value, p, sizeof value);
        const char *name = sbx_meta_enum_name (f->enum_meta, value);
        return name ? json_string (name) : json_integer (value);
    }
    case SBX_META_STRLIST: {
        const sbx_strlist_t *list = p;
        json_t *array = json_array ();
        for (size_t k = 0; array && k < list->count; k++)
            if (json_array_append_new (array, s_string (list->items[k])))
                json_decref (array), array = NULL;
        return array;
    }
    case SBX_META_STRMAP: {
        const sbx_strmap_t *map = p;
        json_t *object = json_object ();
        for (size_t k = 0; object && k < map->count; k++) {
            json_t *key = s_string (map->keys[k]);
            if (!key ||
                json_object_set_new (object, json_string_value (key), s_string (map->values[k])))
                json_decref (object), object = NULL;
            json_decref (key);
        }
        return object;
    }
    case SBX_META_LIST: {
        struct {
            const char *items;
            size_t count;
        } list;
        memcpy (&list, p, sizeof list);
        json_t *array = json_array ();
        for (size_t k = 0; array && k < list.count; k++)
            if (json_array_append_new (
                    array, s_struct_json (f->struct_meta, list.items + k * f->struct_meta->size)))
                json_decref (array), array = NULL;
        return array;
    }
    case SBX_META_STRUCT: {
        const void *child;
        memcpy (&child, p, sizeof child);
        return s_struct_json (f->struct_meta, child);
    }
    }
    return NULL;
}

static json_t *s_struct_json (const sbx_meta_struct_t *meta, const void *body)
{
    json_t *object = json_object ();
    for (size_t i = 0; object && i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        //  set_new takes the value even when it fails, and refuses NULL.
        if (sbx_meta_field_present (f, body) &&
            json_object_set_new (object, f->name, s_field_json (f, body)))
            json_decref (object), object = NULL;
    }
    return object;
}

char *sbx_msg_body_to_json (const sbx_msg_t *self)
{
    if (!self || self->type <= SBX_MSG__UNKNOWN || self->type >= SBX_MSG__COUNT || !self->body)
        return NULL;
    json_t *json = s_struct_json (sbx_meta_msgs[self->type].body, self->body);
    char *text = json ? json_dumps (json, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref (json);
    return text;
}

//  The self-test asserts even in release builds (CMake's RelWithDebInfo sets NDEBUG):
//  <assert.h> redefines assert each time it is included.
#undef NDEBUG
#include <assert.h>

void sbx_msg_test (bool verbose)
{
    sbx_meta_codec_test (verbose);

    //  A hand-built message, checked key by key.
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_EVENT);
    assert (msg);
    sbx_event_t *event = sbx_msg_event (msg);
    event->seq = 1;
    event->ts_ms = UINT64_MAX;
    assert (sbx_str_set (&event->type, "peer.joined") == 0);
    assert (sbx_bytes_set (&event->payload, "hi!?", 4) == 0);
    char *text = sbx_msg_body_to_json (msg);
    assert (text);
    if (verbose)
        printf ("\n%s\n", text);
    assert (strcmp (text, "{\"seq\":1,\"ts_ms\":\"18446744073709551615\",\"type\":\"peer.joined\","
                          "\"payload\":\"aGkhPw==\"}") == 0);
    free (text);
    sbx_msg_destroy (&msg);

    //  Every message type: random bodies give valid JSON with one key per field sent.
    uint64_t seed = 0x15017e57ull;
    for (int t = 1; t < SBX_MSG__COUNT; t++) {
        for (int round = 0; round < 8; round++) {
            msg = sbx_meta_random_msg ((sbx_msg_type_t) t, round % 2 == 0, &seed);
            assert (msg);
            text = sbx_msg_body_to_json (msg);
            assert (text);
            json_error_t error;
            json_t *json = json_loads (text, 0, &error);
            assert (json && json_is_object (json));
            const sbx_meta_struct_t *meta = sbx_meta_msgs[t].body;
            size_t present = 0;
            for (size_t i = 0; i < meta->field_count; i++)
                present += sbx_meta_field_present (&meta->fields[i], msg->body);
            assert (json_object_size (json) == present);
            json_decref (json);
            free (text);
            sbx_msg_destroy (&msg);
        }
    }
    assert (sbx_msg_body_to_json (NULL) == NULL);

    //  The type of every message, peeked without decoding; malformed frames refused.
    seed = 0x9ee4ull;
    for (int t = 1; t < SBX_MSG__COUNT; t++) {
        msg = sbx_meta_random_msg ((sbx_msg_type_t) t, true, &seed);
        uint8_t *data;
        size_t size;
        assert (msg && sbx_msg_encode (msg, &data, &size, NULL) == 0);
        sbx_msg_type_t type = SBX_MSG__UNKNOWN;
        assert (sbx_msg_peek_type (data, size, &type, NULL) == 0 && type == (sbx_msg_type_t) t);
        sbx_err_t err;
        assert (sbx_msg_peek_type (data, size - 1, &type, &err) == -1); //  truncated
        assert (err.code == SBX_E_INVALID_ARGUMENT);
        free (data);
        sbx_msg_destroy (&msg);
    }
    sbx_msg_type_t type;
    sbx_err_t err;
    assert (sbx_msg_peek_type ((const uint8_t *) "\x81\xa4type\xa3nop", 10, &type, &err) == -1);
    assert (err.code == SBX_E_INVALID_ARGUMENT && strstr (err.message, "no known 'type'"));
    assert (sbx_msg_peek_type ((const uint8_t *) "\x01", 1, &type, &err) == -1);
}
