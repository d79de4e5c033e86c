/*  gw_jsonload - see gw_jsonload.h */
#include "gw_jsonload.h"
#include "sbx_xfer.h"
#include "sbx_msg_meta.h"
#include "sbx_secret.h"

#include <assert.h>

#define S_LONG  (64 * 1024) //  strings at least this long are lifted
#define S_LIFTS 64          //  at most this many in one body (more: parsed as it is)

static size_t s_lifted_total; //  strings lifted and put back, for the self test

typedef struct {
    size_t at; //  the string's first byte in the body (past its quote)
    size_t size;
} s_lift_t;

typedef struct {
    const char *body;
    s_lift_t lifts[S_LIFTS];
    int count;
    char marker[40]; //  "sbx-lifted-<random>-", then the lift's index
    size_t marker_len;
    int restored;
} s_job_t;

//  Where the string that starts past body[at] (its opening quote) ends: the index of its
//  closing quote, or size when it does not end. *plain: no escapes and no control
//  characters (jansson refuses those unescaped).
static size_t s_string_end (const char *body, size_t size, size_t at, bool *plain)
{
    *plain = true;
    for (size_t i = at; i < size; i++) {
        unsigned char c = (unsigned char) body[i];
        if (c == '"')
            return i;
        if (c == '\\') {
            *plain = false;
            i++;
        } else if (c < 0x20)
            *plain = false;
    }
    return size;
}

//  Finds the long plain string values (not keys: a key is followed by ':'). false when
//  there are none or too many.
static bool s_find (s_job_t *job, size_t size)
{
    const char *body = job->body;
    size_t i = 0;
    while (i < size) {
        const char *quote = memchr (body + i, '"', size - i);
        if (!quote)
            break;
        size_t at = (size_t) (quote - body) + 1;
        bool plain;
        size_t end = s_string_end (body, size, at, &plain);
        if (end == size)
            return false; //  unterminated: jansson says so
        i = end + 1;
        if (!plain || end - at < S_LONG)
            continue;
        size_t next = i;
        while (next < size && body[next] && strchr (" \t\r\n", body[next]))
            next++;
        if (next < size && body[next] == ':')
            continue;
        if (!sbx_meta_utf8_valid (body + at, end - at))
            continue;
        if (job->count == S_LIFTS)
            return false;
        job->lifts[job->count++] = (s_lift_t){at, end - at};
    }
    return job->count > 0;
}

//  The lift a string value names, or -1.
static int s_lifted (s_job_t *job, json_t *value)
{
    const char *text = json_string_value (value);
    if (!text || strncmp (text, job->marker, job->marker_len) != 0)
        return -1;
    char *end;
    long n = strtol (text + job->marker_len, &end, 10);
    return *end || n < 0 || n >= job->count ? -1 : (int) n;
}

//  jansson's allocations, huge pages asked for under the large ones: a lifted string is
//  put back as jansson's own copy (it has no way to take a buffer), and a 13.3 MiB copy
//  into fresh memory faulted in a page at a time was a quarter of the gateway's CPU for
//  a 10 MiB write_file (perf, bench/notes.md).
static void *s_json_malloc (size_t size)
{
    void *data = malloc (size);
    if (data && size >= 4 * 1024 * 1024)
        sbx_xfer_advise_huge (data, size);
    return data;
}

void gw_jsonload_init (void)
{
    json_set_alloc_funcs (s_json_malloc, free);
}

static json_t *s_original (s_job_t *job, int n)
{
    job->restored++;
    return json_stringn_nocheck (job->body + job->lifts[n].at, job->lifts[n].size);
}

//  Puts the lifted strings back in value's tree; -1 when out of memory.
static int s_restore (s_job_t *job, json_t *value)
{
    int rc = 0;
    if (json_is_object (value)) {
        const char *key;
        json_t *member;
        json_object_foreach (value, key, member)
        {
            int n = s_lifted (job, member);
            if (n >= 0)
                rc |= json_object_set_new (value, key, s_original (job, n));
            else
                rc |= s_restore (job, member);
        }
    } else if (json_is_array (value))
        for (size_t i = 0; i < json_array_size (value); i++) {
            json_t *item = json_array_get (value, i);
            int n = s_lifted (job, item);
            if (n >= 0)
                rc |= json_array_set_new (value, i, s_original (job, n));
            else
                rc |= s_restore (job, item);
        }
    return rc ? -1 : 0;
}

//  The body with each lift replaced by its marker (malloc'd), *size_p its length.
static char *s_lifted_body (s_job_t *job, size_t size, size_t *size_p)
{
    size_t room = size + (size_t) job->count * (job->marker_len + 4);
    char *out = malloc (room);
    if (!out)
        return NULL;
    size_t used = 0, from = 0;
    for (int n = 0; n < job->count; n++) {
        memcpy (out + used, job->body + from, job->lifts[n].at - from);
        used += job->lifts[n].at - from;
        used += (size_t) snprintf (out + used, room - used, "%s%d", job->marker, n);
        from = job->lifts[n].at + job->lifts[n].size;
    }
    memcpy (out + used, job->body + from, size - from);
    *size_p = used + size - from;
    return out;
}

json_t *gw_jsonload (const char *body, size_t size, json_error_t *error)
{
    if (!body || size < S_LONG)
        return json_loadb (body, size, 0, error);
    s_job_t *job = calloc (1, sizeof *job);
    uint8_t nonce[8];
    json_t *value = NULL;
    if (job && sbx_secret_random (nonce, sizeof nonce) == 0) {
        job->body = body;
        int len = snprintf (job->marker, sizeof job->marker, "sbx-lifted-");
        for (size_t i = 0; i < sizeof nonce; i++)
            len +=
                snprintf (job->marker + len, sizeof job->marker - (size_t) len, "%02x", nonce[i]);
        job->marker[len++] = '-';
        job->marker_len = (size_t) len;
        size_t lifted_size;
        char *lifted = s_find (job, size) ? s_lifted_body (job, size, &lifted_size) : NULL;
        if (lifted) {
            value = json_loadb (lifted, lifted_size, 0, NULL);
            //  Each marker found once, none forged: else the body is parsed as it is.
            if (value && (s_restore (job, value) || job->restored != job->count))
                json_decref (value);
            else if (value) {
                s_lifted_total += (size_t) job->count;
                if (error)
                    memset (error, 0, sizeof *error);
            }
        }
        free (lifted);
    }
    free (job);
    return value ? value : json_loadb (body, size, 0, error);
}

//  --------------------------------------------------------------------------
//  Self test

static void s_same (const char *body, size_t size)
{
    json_error_t ours_error, theirs_error;
    json_t *ours = gw_jsonload (body, size, &ours_error);
    json_t *theirs = json_loadb (body, size, 0, &theirs_error);
    assert (!ours == !theirs);
    if (ours)
        assert (json_equal (ours, theirs));
    else
        assert (streq (ours_error.text, theirs_error.text) &&
                ours_error.position == theirs_error.position);
    json_decref (ours);
    json_decref (theirs);
}

void gw_jsonload_test (bool verbose)
{
    (void) verbose;
    size_t long_size = S_LONG + 10;
    char *text = malloc (long_size + 1);
    assert (text);
    for (size_t i = 0; i < long_size; i++)
        text[i] = "ABCxyz09+/"[i % 10];
    text[long_size] = 0;
    char *body = malloc (4 * long_size + 400);
    assert (body);
    //  Lifted: values in objects and arrays, beside short strings and a long key.
    sprintf (body,
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"params\":{\"arguments\":{\"content\":\"%s\","
             "\"list\":[\"%s\",\"x\"]},\"%s\":1}}",
             text, text, text);
    size_t before = s_lifted_total;
    s_same (body, strlen (body));
    assert (s_lifted_total == before + 2); //  the two values, not the key
    json_t *value = gw_jsonload (body, strlen (body), NULL);
    json_t *content = json_object_get (
        json_object_get (json_object_get (value, "params"), "arguments"), "content");
    assert (json_string_length (content) == long_size && streq (json_string_value (content), text));
    json_decref (value);
    //  Not lifted (escapes, a control character, bad UTF-8), or not JSON: as jansson has it,
    //  its errors included.
    text[100] = '\\';
    text[101] = 'n';
    sprintf (body, "{\"a\":\"%s\"}", text);
    s_same (body, strlen (body));
    text[100] = '\n';
    sprintf (body, "{\"a\":\"%s\"}", text);
    s_same (body, strlen (body));
    text[100] = (char) 0xff;
    sprintf (body, "{\"a\":\"%s\"}", text);
    s_same (body, strlen (body));
    text[100] = 'A';
    text[101] = 'B';
    sprintf (body, "{\"a\":\"%s\",}", text);
    s_same (body, strlen (body));
    sprintf (body, "{\"a\":\"%s", text);
    s_same (body, strlen (body));
    sprintf (body, "\"%s\"", text);
    s_same (body, strlen (body));
    //  A marker sent by the client is a string like any other.
    sprintf (body, "{\"a\":\"%s\",\"b\":\"sbx-lifted-00-0\"}", text);
    before = s_lifted_total;
    s_same (body, strlen (body));
    assert (s_lifted_total == before + 1);
    s_same ("{}", 2);
    //  Random damage anywhere (quotes, escapes, colons, bad bytes): always as jansson has it.
    const char damage[] = "\"\\:,{}[] \n\x01\x80\xc3\xff"
                          "0a";
    for (int round = 0; round < 300; round++) {
        sprintf (body, "{\"a\":[\"%s\",{\"k\":\"%s\"}],\"b\":\"x\"}", text, text);
        size_t size = strlen (body);
        uint32_t pick[4];
        sbx_secret_random (pick, sizeof pick);
        for (int k = 0; k < 1 + (int) (pick[0] % 3); k++) {
            //  Near the structure half the time, anywhere otherwise.
            size_t at = pick[1 + k] % 2 ? (pick[1 + k] >> 1) % 24 : (pick[1 + k] >> 1) % size;
            if (k == 2)
                at = size - 1 - (pick[3] >> 1) % 24;
            body[at] = damage[(pick[1 + k] >> 8) % (sizeof damage - 1)];
        }
        s_same (body, size);
    }
    free (body);
    free (text);
}
