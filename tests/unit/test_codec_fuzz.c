/*  test_codec_fuzz - hostile frames against sbx_msg_decode.

    Usage: test_codec_fuzz [SEED]   (deterministic; the seed is printed so a failure can
    be replayed)

    Every frame must come back either as a message that re-encodes and round-trips equal,
    or as NULL with a catalogued code and a message. Frames:
      a. random bytes, 0..512 long;
      b. encodings of random messages, then mutated: bit flips, byte replacements,
         truncation at every length, insertions, trailing garbage, container and string
         headers swapped for huge ones, nesting 1000 deep;
      c. frames written here by hand, field by field from the schema tables, with one
         field of the wrong type, over its limit, missing or duplicated: these must be
         refused, and must name the field.
    The test links sbx_codec only, which also proves the codec needs no jansson or czmq.
*/
#include "sbx_msg.h"
#include "sbx_msg_meta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf (stderr, "test_codec_fuzz:%d: %s: ", __LINE__, #cond);                         \
            fprintf (stderr, __VA_ARGS__);                                                         \
            fprintf (stderr, "\n");                                                                \
            abort ();                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t s_rng;
static size_t s_valid;
static size_t s_rejected;

static size_t s_below (size_t n)
{
    return n ? (size_t) (sbx_meta_rand (&s_rng) % n) : 0;
}

//  The one property: valid and stable, or refused with a reason.
static sbx_msg_t *s_try (const uint8_t *data, size_t size, const char *what)
{
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (data, size, &err);
    if (!msg) {
        CHECK (err.code != SBX_OK && err.message[0], "%s: refused without a reason", what);
        s_rejected++;
        return NULL;
    }
    CHECK (err.code == SBX_OK, "%s: accepted with code %d", what, (int) err.code);
    uint8_t *again;
    size_t again_size;
    CHECK (sbx_msg_encode (msg, &again, &again_size, &err) == 0,
           "%s: accepted %s but cannot re-encode it: %s", what, sbx_msg_type_name (msg->type),
           err.message);
    sbx_msg_t *copy = sbx_msg_decode (again, again_size, &err);
    CHECK (copy, "%s: re-encoded frame refused: %s", what, err.message);
    CHECK (sbx_msg_eq (msg, copy), "%s: round trip differs", what);
    sbx_msg_destroy (&copy);
    free (again);
    s_valid++;
    return msg;
}

static void s_try_drop (const uint8_t *data, size_t size, const char *what)
{
    sbx_msg_t *msg = s_try (data, size, what);
    sbx_msg_destroy (&msg);
}

static void s_expect_refused (const uint8_t *data, size_t size, const char *what,
                              const char *needle, sbx_code_t code)
{
    sbx_err_t err;
    sbx_msg_t *msg = sbx_msg_decode (data, size, &err);
    CHECK (msg == NULL, "%s: accepted", what);
    CHECK (err.code == code, "%s: code %s, wanted %s (%s)", what, sbx_code_name (err.code),
           sbx_code_name (code), err.message);
    CHECK (strstr (err.message, needle), "%s: message '%s' does not name '%s'", what, err.message,
           needle);
    CHECK (err.rid == 77, "%s: rid %llu not kept", what, (unsigned long long) err.rid);
    s_rejected++;
}

//  --------------------------------------------------------------------------------------
//  A small msgpack writer, independent of the codec's (and of msgpack-c).

typedef struct {
    uint8_t *data;
    size_t size;
    size_t cap;
} buf_t;

static void b_put (buf_t *b, const void *data, size_t size)
{
    if (b->size + size > b->cap) {
        b->cap = (b->size + size) * 2 + 64;
        b->data = realloc (b->data, b->cap);
        CHECK (b->data, "out of memory");
    }
    if (size)
        memcpy (b->data + b->size, data, size);
    b->size += size;
}

static void b_byte (buf_t *b, uint8_t byte)
{
    b_put (b, &byte, 1);
}

static void b_be (buf_t *b, uint64_t value, int bytes)
{
    for (int k = bytes - 1; k >= 0; k--)
        b_byte (b, (uint8_t) (value >> (8 * k)));
}

static void w_head (buf_t *b, size_t n, uint8_t fix, size_t fix_max, uint8_t op8, uint8_t op16,
                    uint8_t op32)
{
    if (n <= fix_max)
        b_byte (b, (uint8_t) (fix | n));
    else if (op8 && n <= 0xff)
        b_byte (b, op8), b_be (b, n, 1);
    else if (n <= 0xffff)
        b_byte (b, op16), b_be (b, n, 2);
    else
        b_byte (b, op32), b_be (b, n, 4);
}

static void w_map (buf_t *b, size_t n)
{
    w_head (b, n, 0x80, 15, 0, 0xde, 0xdf);
}

static void w_array (buf_t *b, size_t n)
{
    w_head (b, n, 0x90, 15, 0, 0xdc, 0xdd);
}

static void w_str (buf_t *b, const char *text, size_t len)
{
    w_head (b, len, 0xa0, 31, 0xd9, 0xda, 0xdb);
    b_put (b, text, len);
}

static void w_cstr (buf_t *b, const char *text)
{
    w_str (b, text, strlen (text));
}

static void w_bin (buf_t *b, const void *data, size_t len)
{
    if (len <= 0xff)
        b_byte (b, 0xc4), b_be (b, len, 1);
    else if (len <= 0xffff)
        b_byte (b, 0xc5), b_be (b, len, 2);
    else
        b_byte (b, 0xc6), b_be (b, len, 4);
    b_put (b, data, len);
}

static void w_uint (buf_t *b, uint64_t value)
{
    if (value < 0x80)
        b_byte (b, (uint8_t) value);
    else
        b_byte (b, 0xcf), b_be (b, value, 8);
}

static void w_int (buf_t *b, int64_t value)
{
    if (value >= 0)
        w_uint (b, (uint64_t) value);
    else
        b_byte (b, 0xd3), b_be (b, (uint64_t) value, 8);
}

static void w_float (buf_t *b, double value)
{
    uint64_t bits;
    memcpy (&bits, &value, sizeof bits);
    b_byte (b, 0xcb), b_be (b, bits, 8);
}

//  Wrong values: each is the wrong type for some kinds.
typedef enum {
    BAD_TRUE,
    BAD_UINT,
    BAD_NEGATIVE,
    BAD_HUGE_UINT,
    BAD_FLOAT,
    BAD_STRING,
    BAD_BIN,
    BAD_ARRAY,
    BAD_MAP,
    BAD_EXT,
    BAD_NUL_STRING,
    BAD_UTF8,
    BAD_OVER_MAX,
    BAD_ARRAY_OF_INT,
    BAD__COUNT
} bad_t;

static const char *s_bad_names[] = {"true", "1",  "-1",  "2^64-1", "1.5",   "string",   "bin",
                                    "[]",   "{}", "ext", "a\\0b",  "\\xff", "over max", "[1]"};

//  True when writing `bad` into a field of this kind must be refused.
static bool s_bad_applies (const sbx_meta_field_t *f, bad_t bad)
{
    switch (bad) {
    case BAD_TRUE:
        return f->kind != SBX_META_BOOL;
    case BAD_UINT:
        return f->kind != SBX_META_INT && f->kind != SBX_META_UINT;
    case BAD_NEGATIVE:
        return f->kind != SBX_META_INT;
    case BAD_HUGE_UINT:
        return f->kind != SBX_META_UINT;
    case BAD_FLOAT:
    case BAD_EXT:
        return true;
    case BAD_STRING:
        return f->kind != SBX_META_STRING; //  "string" is no enum's value
    case BAD_BIN:
        return f->kind != SBX_META_BYTES;
    case BAD_ARRAY:
        return f->kind != SBX_META_STRLIST && f->kind != SBX_META_LIST;
    case BAD_MAP:
        return f->kind != SBX_META_STRMAP && f->kind != SBX_META_STRUCT;
    case BAD_NUL_STRING:
    case BAD_UTF8:
        return f->kind == SBX_META_STRING || f->kind == SBX_META_ENUM;
    case BAD_OVER_MAX:
        return f->kind == SBX_META_STRING || f->kind == SBX_META_BYTES ||
               f->kind == SBX_META_STRLIST || f->kind == SBX_META_STRMAP ||
               f->kind == SBX_META_LIST;
    case BAD_ARRAY_OF_INT:
        return true;
    case BAD__COUNT:
        break;
    }
    return false;
}

static void w_bad (buf_t *b, const sbx_meta_field_t *f, bad_t bad)
{
    size_t max = sbx_meta_field_max (f);
    switch (bad) {
    case BAD_TRUE:
        b_byte (b, 0xc3);
        break;
    case BAD_UINT:
        w_uint (b, 1);
        break;
    case BAD_NEGATIVE:
        w_int (b, -1);
        break;
    case BAD_HUGE_UINT:
        w_uint (b, UINT64_MAX);
        break;
    case BAD_FLOAT:
        w_float (b, 1.5);
        break;
    case BAD_STRING:
        w_cstr (b, "string");
        break;
    case BAD_BIN:
        w_bin (b, "x", 1);
        break;
    case BAD_ARRAY:
        w_array (b, 0);
        break;
    case BAD_MAP:
        w_map (b, 0);
        break;
    case BAD_EXT:
        b_byte (b, 0xd4), b_byte (b, 1), b_byte (b, 0);
        break;
    case BAD_NUL_STRING:
        w_str (b, "a\0b", 3);
        break;
    case BAD_UTF8:
        w_str (b, "\xff\xfe", 2);
        break;
    case BAD_OVER_MAX:
        if (f->kind == SBX_META_STRING || f->kind == SBX_META_BYTES) {
            char *text = malloc (max + 1);
            CHECK (text, "out of memory");
            memset (text, 'x', max + 1);
            if (f->kind == SBX_META_STRING)
                w_str (b, text, max + 1);
            else
                w_bin (b, text, max + 1);
            free (text);
        } else if (f->kind == SBX_META_STRMAP) {
            w_map (b, max + 1);
            for (size_t k = 0; k <= max; k++)
                w_cstr (b, ""), w_cstr (b, "");
        } else {
            w_array (b, max + 1);
            for (size_t k = 0; k <= max; k++)
                b_byte (b, 0xc0);
        }
        break;
    case BAD_ARRAY_OF_INT:
        w_array (b, 1);
        w_uint (b, 1);
        break;
    case BAD__COUNT:
        break;
    }
}

static void w_struct (buf_t *b, const sbx_meta_struct_t *meta, unsigned depth);

//  A value the codec must accept.
static void w_good (buf_t *b, const sbx_meta_field_t *f, unsigned depth)
{
    switch (f->kind) {
    case SBX_META_STRING:
        w_cstr (b, "x");
        break;
    case SBX_META_BYTES:
        w_bin (b, "y", 1);
        break;
    case SBX_META_BOOL:
        b_byte (b, 0xc3);
        break;
    case SBX_META_INT:
        w_int (b, -5);
        break;
    case SBX_META_UINT:
        w_uint (b, 5);
        break;
    case SBX_META_ENUM:
        w_cstr (b, f->enum_meta->values[f->enum_meta->count - 1]);
        break;
    case SBX_META_STRLIST:
        w_array (b, 1);
        w_cstr (b, "item");
        break;
    case SBX_META_STRMAP:
        w_map (b, 1);
        w_cstr (b, "k");
        w_cstr (b, "v");
        break;
    case SBX_META_LIST:
        if (depth + 2 <= 8) {
            w_array (b, 1);
            w_struct (b, f->struct_meta, depth + 2);
        } else
            w_array (b, 0);
        break;
    case SBX_META_STRUCT:
        w_struct (b, f->struct_meta, depth + 1);
        break;
    }
}

//  Every field of the struct, good values; optional ones only near the top.
static void w_struct (buf_t *b, const sbx_meta_struct_t *meta, unsigned depth)
{
    size_t count = 0;
    for (size_t i = 0; i < meta->field_count; i++)
        count += meta->fields[i].required || depth < 6;
    w_map (b, count);
    for (size_t i = 0; i < meta->field_count; i++)
        if (meta->fields[i].required || depth < 6) {
            w_cstr (b, meta->fields[i].name);
            w_good (b, &meta->fields[i], depth);
        }
}

//  {type, rid: 77, body: {...}} with field `target` written by `how`.
typedef enum { HOW_BAD, HOW_MISSING, HOW_TWICE, HOW_NIL, HOW_EXTRA } how_t;

static void w_frame (buf_t *b, int type, size_t target, how_t how, bad_t bad)
{
    const sbx_meta_struct_t *meta = sbx_meta_msgs[type].body;
    b->size = 0;
    w_map (b, 3);
    w_cstr (b, "type");
    w_cstr (b, sbx_meta_msgs[type].name);
    w_cstr (b, "rid");
    w_uint (b, 77);
    w_cstr (b, "body");
    size_t count =
        meta->field_count + (how == HOW_TWICE || how == HOW_EXTRA) - (how == HOW_MISSING);
    w_map (b, count);
    for (size_t i = 0; i < meta->field_count; i++) {
        const sbx_meta_field_t *f = &meta->fields[i];
        if (i == target && how == HOW_MISSING)
            continue;
        w_cstr (b, f->name);
        if (i == target && how == HOW_BAD)
            w_bad (b, f, bad);
        else if (i == target && how == HOW_NIL)
            b_byte (b, 0xc0);
        else
            w_good (b, f, 2);
        if (i == target && how == HOW_TWICE) {
            w_cstr (b, f->name);
            w_good (b, f, 2);
        }
    }
    if (how == HOW_EXTRA) {
        w_cstr (b, "zz_from_the_future");
        w_map (b, 2);
        w_uint (b, 1); //  a non-string key, where nobody reads
        w_float (b, 2.5);
        w_cstr (b, "x");
        w_array (b, 2);
        b_byte (b, 0xc0);
        b_byte (b, 0xd4), b_byte (b, 1), b_byte (b, 0);
    }
}

//  --------------------------------------------------------------------------------------

static const uint8_t s_huge[][6] = {
    {0xdd, 0xff, 0xff, 0xff, 0xff}, //  array32 of 2^32-1
    {0xdf, 0xff, 0xff, 0xff, 0xff}, //  map32
    {0xdb, 0xff, 0xff, 0xff, 0xff}, //  str32
    {0xc6, 0xff, 0xff, 0xff, 0xff}, //  bin32
    {0xc9, 0xff, 0xff, 0xff, 0xff}, //  ext32
    {0xdc, 0xff, 0xff, 0x00, 0x00}, //  array16
    {0xde, 0xff, 0xff, 0x00, 0x00}, //  map16
    {0xdd, 0x00, 0x01, 0x00, 0x00}, //  array32 of 65536
};

static const uint8_t s_interesting[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0,
                                        0xc1, 0xc2, 0xc3, 0xc4, 0xca, 0xcb, 0xcf, 0xd3, 0xd4,
                                        0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};

static void s_mutate (const uint8_t *frame, size_t size, buf_t *out)
{
    out->size = 0;
    b_put (out, frame, size);
    size_t kind = s_below (7);
    if (kind == 0) { //  bit flips
        for (size_t k = 0, n = 1 + s_below (4); k < n; k++)
            out->data[s_below (out->size)] ^= (uint8_t) (1u << s_below (8));
    } else if (kind == 1) { //  byte replacements
        for (size_t k = 0, n = 1 + s_below (3); k < n; k++)
            out->data[s_below (out->size)] = s_below (2)
                                                 ? (uint8_t) sbx_meta_rand (&s_rng)
                                                 : s_interesting[s_below (sizeof s_interesting)];
    } else if (kind == 2) { //  truncation
        out->size = s_below (size);
    } else if (kind == 3) { //  insertion
        size_t at = s_below (size + 1), n = 1 + s_below (8);
        out->size = at;
        for (size_t k = 0; k < n; k++)
            b_byte (out, (uint8_t) sbx_meta_rand (&s_rng));
        b_put (out, frame + at, size - at);
    } else if (kind == 4) { //  trailing garbage
        for (size_t k = 0, n = 1 + s_below (16); k < n; k++)
            b_byte (out, (uint8_t) sbx_meta_rand (&s_rng));
    } else { //  a huge header, written over or inserted
        const uint8_t *huge = s_huge[s_below (sizeof s_huge / sizeof s_huge[0])];
        size_t at = s_below (size);
        if (kind == 5 && at + 5 <= size)
            memcpy (out->data + at, huge, 5);
        else {
            out->size = at;
            b_put (out, huge, 5);
            b_put (out, frame + at, size - at);
        }
    }
}

int main (int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull (argv[1], NULL, 0) : 0x5bc0dec5eedull;
    printf ("test_codec_fuzz: seed 0x%llx\n", (unsigned long long) seed);
    s_rng = seed;
    clock_t started = clock ();
    buf_t frame = {NULL, 0, 0};
    buf_t mutant = {NULL, 0, 0};
    char what[128];

    //  a. Random bytes; half of them start like a map so the walk goes deeper.
    for (int i = 0; i < 4000; i++) {
        frame.size = 0;
        size_t size = s_below (513);
        for (size_t k = 0; k < size; k++)
            b_byte (&frame, (uint8_t) sbx_meta_rand (&s_rng));
        if (size && i % 2)
            frame.data[0] = (uint8_t) (0x80 | s_below (16));
        snprintf (what, sizeof what, "random frame %d", i);
        s_try_drop (frame.data, frame.size, what);
    }

    //  b. Encodings of random messages, mutated.
    size_t sweeps = 0;
    for (int i = 0; i < 1500; i++) {
        sbx_msg_type_t type = (sbx_msg_type_t) (1 + s_below (SBX_MSG__COUNT - 1));
        sbx_msg_t *msg = sbx_meta_random_msg (type, i % 3 == 0, &s_rng);
        CHECK (msg, "out of memory");
        uint8_t *data;
        size_t size;
        sbx_err_t err;
        CHECK (sbx_msg_encode (msg, &data, &size, &err) == 0, "encode %s: %s",
               sbx_msg_type_name (type), err.message);
        snprintf (what, sizeof what, "message %d (%s)", i, sbx_msg_type_name (type));
        sbx_msg_t *back = s_try (data, size, what);
        CHECK (back && sbx_msg_eq (back, msg), "%s: good frame refused", what);
        sbx_msg_destroy (&back);
        for (int m = 0; m < 4; m++) {
            s_mutate (data, size, &mutant);
            snprintf (what, sizeof what, "message %d (%s) mutant %d", i, sbx_msg_type_name (type),
                      m);
            s_try_drop (mutant.data, mutant.size, what);
        }
        //  For some small frames: every truncation, and a huge header at every offset.
        if (size <= 400 && sweeps < 40) {
            sweeps++;
            for (size_t cut = 0; cut < size; cut++) {
                snprintf (what, sizeof what, "message %d cut at %zu", i, cut);
                CHECK (s_try (data, cut, what) == NULL, "%s: accepted", what);
            }
            for (size_t at = 0; at < size; at++) {
                mutant.size = 0;
                b_put (&mutant, data, at);
                b_put (&mutant, s_huge[at % 3], 5);
                b_put (&mutant, data + at, size - at);
                snprintf (what, sizeof what, "message %d huge header at %zu", i, at);
                s_try_drop (mutant.data, mutant.size, what);
            }
        }
        free (data);
        sbx_msg_destroy (&msg);
    }

    //  Deep nesting, at the top and inside a body.
    frame.size = 0;
    for (int k = 0; k < 1000; k++)
        b_byte (&frame, 0x91);
    b_byte (&frame, 0xc0);
    CHECK (s_try (frame.data, frame.size, "1000 arrays") == NULL, "deep frame accepted");
    frame.size = 0;
    w_map (&frame, 2);
    w_cstr (&frame, "type");
    w_cstr (&frame, "key.list.ok");
    w_cstr (&frame, "body");
    for (int k = 0; k < 1000; k++)
        b_byte (&frame, 0x81), w_cstr (&frame, "keys");
    b_byte (&frame, 0xc0);
    CHECK (s_try (frame.data, frame.size, "1000 maps") == NULL, "deep frame accepted");

    //  c. Hand-written frames, one field at fault.
    size_t targeted = 0;
    for (int t = 1; t < SBX_MSG__COUNT; t++) {
        const sbx_meta_struct_t *meta = sbx_meta_msgs[t].body;
        const char *name = sbx_meta_msgs[t].name;
        w_frame (&frame, t, SIZE_MAX, HOW_EXTRA, BAD__COUNT);
        snprintf (what, sizeof what, "%s with every field and a future one", name);
        sbx_msg_t *msg = s_try (frame.data, frame.size, what);
        CHECK (msg, "%s: refused", what);
        sbx_msg_destroy (&msg);
        for (size_t i = 0; i < meta->field_count; i++) {
            const sbx_meta_field_t *f = &meta->fields[i];
            for (int bad = 0; bad < BAD__COUNT; bad++) {
                if (!s_bad_applies (f, (bad_t) bad))
                    continue;
                w_frame (&frame, t, i, HOW_BAD, (bad_t) bad);
                snprintf (what, sizeof what, "%s.%s = %s", name, f->name, s_bad_names[bad]);
                s_expect_refused (frame.data, frame.size, what, f->name,
                                  bad == BAD_OVER_MAX ? SBX_E_TOO_LARGE : SBX_E_INVALID_ARGUMENT);
                targeted++;
            }
            w_frame (&frame, t, i, HOW_TWICE, BAD__COUNT);
            snprintf (what, sizeof what, "%s.%s twice", name, f->name);
            s_expect_refused (frame.data, frame.size, what, "twice", SBX_E_INVALID_ARGUMENT);
            static const how_t absent[] = {HOW_MISSING, HOW_NIL};
            for (size_t k = 0; k < 2; k++) {
                how_t how = absent[k];
                w_frame (&frame, t, i, how, BAD__COUNT);
                snprintf (what, sizeof what, "%s.%s %s", name, f->name,
                          how == HOW_NIL ? "nil" : "missing");
                if (f->required)
                    s_expect_refused (frame.data, frame.size, what, "is required",
                                      SBX_E_INVALID_ARGUMENT);
                else {
                    msg = s_try (frame.data, frame.size, what);
                    CHECK (msg, "%s: refused", what);
                    sbx_msg_destroy (&msg);
                }
                targeted++;
            }
        }
    }

    double seconds = (double) (clock () - started) / CLOCKS_PER_SEC;
    printf ("test_codec_fuzz: %zu frames: %zu valid, %zu rejected (%zu targeted), %.2f s\n",
            s_valid + s_rejected, s_valid, s_rejected, targeted, seconds);
    CHECK (s_valid + s_rejected >= 10000, "too few frames");
    free (frame.data);
    free (mutant.data);
    return 0;
}
