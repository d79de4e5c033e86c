/*  sbx_dqlite - see sbx_dqlite.h

    The protocol (dqlite 1.x, version 1): after the client's first word (the version),
    each message is an 8-byte header (body size in 8-byte words, little endian u32; type
    u8; schema u8; two unused bytes) and a body of fields, each padded to 8 bytes: u64,
    pairs of u32, NUL-terminated text padded with zeros, blobs as a u64 length and the
    padded bytes. Parameters travel as a tuple: a count byte and a type byte each,
    padded to a word, then the values; row values as a tuple whose types are 4 bits
    each. A query's rows come in one or more ROWS messages, each with the column count
    and names, then rows, then a word that says whether more messages follow.
*/
#include "sbx_dqlite.h"
#include "sbx_log.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 1

enum {
    REQ_LEADER = 0,
    REQ_CLIENT = 1,
    REQ_OPEN = 3,
    REQ_PREPARE = 4,
    REQ_EXEC = 5,
    REQ_QUERY = 6,
    REQ_FINALIZE = 7,
    REQ_EXEC_SQL = 8,
    REQ_QUERY_SQL = 9,
    REQ_ADD = 12,
    REQ_ASSIGN = 13,
    REQ_REMOVE = 14,
    REQ_DUMP = 15,
    REQ_CLUSTER = 16,
    REQ_TRANSFER = 17,
};

enum {
    RES_FAILURE = 0,
    RES_SERVER = 1,
    RES_WELCOME = 2,
    RES_SERVERS = 3,
    RES_DB = 4,
    RES_STMT = 5,
    RES_RESULT = 6,
    RES_ROWS = 7,
    RES_EMPTY = 8,
    RES_FILES = 9,
};

#define ROWS_PART 0xeeeeeeeeeeeeeeeeULL
#define ROWS_DONE 0xffffffffffffffffULL

//  An answer bigger than this is refused: the node pages rows (a memory page a message),
//  and a dump of the control plane's databases stays far below it.
#define MAX_BODY           (256u * 1024 * 1024)
#define DEFAULT_TIMEOUT_MS 5000
#define SQLITE_NOMEM_CODE  7

struct _sbx_dqlite_t {
    int fd;
    char *address;
    int timeout_ms;
    bool usable;
    int errcode;
    char errmsg[256];
    //  The message being written, and the last one read.
    uint8_t *out;
    size_t out_size, out_cap;
    uint8_t *in;
    size_t in_size, in_cap;
    int in_type;
};

//  --------------------------------------------------------------------------
//  Errors

static int s_fail (sbx_dqlite_t *self, int code, const char *format, ...)
    __attribute__ ((format (printf, 3, 4)));

static int s_fail (sbx_dqlite_t *self, int code, const char *format, ...)
{
    self->errcode = code;
    va_list args;
    va_start (args, format);
    vsnprintf (self->errmsg, sizeof self->errmsg, format, args);
    va_end (args);
    if (code == SBX_DQ_EIO || code == SBX_DQ_EPROTO)
        self->usable = false;
    return -1;
}

static void s_ok (sbx_dqlite_t *self)
{
    self->errcode = 0;
    self->errmsg[0] = 0;
}

//  --------------------------------------------------------------------------
//  Socket with deadlines

static int64_t s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

//  Waits until fd is ready for events or the deadline passes: 1, 0 (deadline), -1.
static int s_wait (int fd, short events, int64_t deadline)
{
    while (true) {
        int64_t left = deadline - s_now_ms ();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll (&p, 1, (int) (left > 60000 ? 60000 : left));
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

static int s_dial_unix (const char *address, int timeout_ms)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t len = strlen (address);
    if (len < 2 || len > sizeof sun.sun_path)
        return -1;
    //  "@name": the abstract namespace, a leading NUL and no terminator.
    memcpy (sun.sun_path + 1, address + 1, len - 1);
    int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    socklen_t size = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + len);
    if (connect (fd, (struct sockaddr *) &sun, size) == 0)
        return fd;
    if (errno == EINPROGRESS || errno == EAGAIN) {
        if (s_wait (fd, POLLOUT, s_now_ms () + timeout_ms) == 1)
            return fd;
    }
    close (fd);
    return -1;
}

static int s_dial_tcp (const char *address, int timeout_ms)
{
    //  host:port, the host possibly [v6].
    char host[256];
    const char *colon = strrchr (address, ':');
    if (!colon || colon == address || (size_t) (colon - address) >= sizeof host)
        return -1;
    const char *start = address, *end = colon;
    if (*start == '[' && end[-1] == ']')
        start++, end--;
    memcpy (host, start, (size_t) (end - start));
    host[end - start] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    if (getaddrinfo (host, colon + 1, &hints, &found) != 0)
        return -1;
    int fd = -1;
    int64_t deadline = s_now_ms () + timeout_ms;
    for (struct addrinfo *ai = found; ai && fd < 0; ai = ai->ai_next) {
        fd = socket (ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        int rc = connect (fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS && s_wait (fd, POLLOUT, deadline) == 1) {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt (fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err ? -1 : 0;
        }
        if (rc != 0) {
            close (fd);
            fd = -1;
        }
    }
    freeaddrinfo (found);
    if (fd >= 0) {
        int one = 1;
        setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

static int s_write_all (sbx_dqlite_t *self, const uint8_t *data, size_t size, int64_t deadline)
{
    while (size > 0) {
        ssize_t n = send (self->fd, data, size, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            size -= (size_t) n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = s_wait (self->fd, POLLOUT, deadline);
            if (rc == 1)
                continue;
            return s_fail (self, SBX_DQ_EIO, "%s: %s", self->address,
                           rc == 0 ? "timed out sending" : strerror (errno));
        }
        return s_fail (self, SBX_DQ_EIO, "%s: send: %s", self->address, strerror (errno));
    }
    return 0;
}

static int s_read_all (sbx_dqlite_t *self, uint8_t *data, size_t size, int64_t deadline)
{
    while (size > 0) {
        ssize_t n = recv (self->fd, data, size, 0);
        if (n > 0) {
            data += n;
            size -= (size_t) n;
            continue;
        }
        if (n == 0)
            return s_fail (self, SBX_DQ_EIO, "%s: the node closed the connection", self->address);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = s_wait (self->fd, POLLIN, deadline);
            if (rc == 1)
                continue;
            return s_fail (self, SBX_DQ_EIO, "%s: %s", self->address,
                           rc == 0 ? "timed out waiting for the answer" : strerror (errno));
        }
        return s_fail (self, SBX_DQ_EIO, "%s: recv: %s", self->address, strerror (errno));
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  Writing a message

static int s_reserve (sbx_dqlite_t *self, size_t more)
{
    if (self->out_size + more <= self->out_cap)
        return 0;
    size_t cap = self->out_cap ? self->out_cap : 4096;
    while (cap < self->out_size + more)
        cap *= 2;
    uint8_t *grown = realloc (self->out, cap);
    if (!grown)
        return s_fail (self, SQLITE_NOMEM_CODE, "out of memory");
    self->out = grown;
    self->out_cap = cap;
    return 0;
}
static size_t s_pad8 (size_t n)
{
    return (n + 7) & ~(size_t) 7;
}

static int s_begin (sbx_dqlite_t *self)
{
    self->out_size = 0;
    if (s_reserve (self, 8))
        return -1;
    memset (self->out, 0, 8);
    self->out_size = 8;
    return 0;
}

static int s_put_u64 (sbx_dqlite_t *self, uint64_t value)
{
    if (s_reserve (self, 8))
        return -1;
    uint64_t le = htole64 (value);
    memcpy (self->out + self->out_size, &le, 8);
    self->out_size += 8;
    return 0;
}

static int s_put_u32_pair (sbx_dqlite_t *self, uint32_t a, uint32_t b)
{
    if (s_reserve (self, 8))
        return -1;
    uint32_t le[2] = {htole32 (a), htole32 (b)};
    memcpy (self->out + self->out_size, le, 8);
    self->out_size += 8;
    return 0;
}

static int s_put_bytes_padded (sbx_dqlite_t *self, const void *data, size_t size, size_t padded)
{
    if (s_reserve (self, padded))
        return -1;
    if (size)
        memcpy (self->out + self->out_size, data, size);
    memset (self->out + self->out_size + size, 0, padded - size);
    self->out_size += padded;
    return 0;
}

static int s_put_text (sbx_dqlite_t *self, const char *text)
{
    size_t len = strlen (text);
    return s_put_bytes_padded (self, text, len, s_pad8 (len + 1));
}

//  Parameters: a count byte and a type byte each, padded to a word, then the values.
static int s_put_params (sbx_dqlite_t *self, const sbx_dqlite_value_t *params, size_t count)
{
    if (count == 0)
        return 0;
    if (count > 255)
        return s_fail (self, 25 /* SQLITE_RANGE */, "more than 255 parameters");
    size_t header = s_pad8 (1 + count);
    if (s_reserve (self, header))
        return -1;
    uint8_t *types = self->out + self->out_size;
    memset (types, 0, header);
    types[0] = (uint8_t) count;
    for (size_t i = 0; i < count; i++)
        types[1 + i] = (uint8_t) params[i].type;
    self->out_size += header;
    for (size_t i = 0; i < count; i++) {
        const sbx_dqlite_value_t *v = &params[i];
        int rc = 0;
        switch (v->type) {
        case SBX_DQ_INTEGER:
        case SBX_DQ_UNIXTIME:
            rc = s_put_u64 (self, (uint64_t) v->integer);
            break;
        case SBX_DQ_BOOLEAN:
            rc = s_put_u64 (self, v->integer ? 1 : 0);
            break;
        case SBX_DQ_FLOAT: {
            uint64_t bits;
            memcpy (&bits, &v->real, 8);
            rc = s_put_u64 (self, bits);
            break;
        }
        case SBX_DQ_NULL:
            rc = s_put_u64 (self, 0);
            break;
        case SBX_DQ_TEXT:
        case SBX_DQ_ISO8601: {
            const char *text = v->data ? v->data : "";
            //  A text is NUL-terminated on the wire: one with a NUL inside is cut there
            //  by the node; refuse it rather than store less than was given.
            if (memchr (text, 0, v->size))
                return s_fail (self, 20 /* SQLITE_MISMATCH */, "a text parameter holds a NUL");
            rc = s_put_bytes_padded (self, text, v->size, s_pad8 (v->size + 1));
            break;
        }
        case SBX_DQ_BLOB:
            rc = s_put_u64 (self, v->size);
            if (rc == 0)
                rc = s_put_bytes_padded (self, v->data, v->size, s_pad8 (v->size));
            break;
        default:
            return s_fail (self, 20 /* SQLITE_MISMATCH */, "parameter %zu: unknown type %d", i + 1,
                           v->type);
        }
        if (rc)
            return -1;
    }
    return 0;
}

//  Fills the header and sends the message.
static int s_send (sbx_dqlite_t *self, int type, int schema)
{
    if (!self->usable)
        return s_fail (self, SBX_DQ_EIO, "%s: the connection failed earlier", self->address);
    size_t words = (self->out_size - 8) / 8;
    uint32_t le = htole32 ((uint32_t) words);
    memcpy (self->out, &le, 4);
    self->out[4] = (uint8_t) type;
    self->out[5] = (uint8_t) schema;
    self->out[6] = self->out[7] = 0;
    return s_write_all (self, self->out, self->out_size, s_now_ms () + self->timeout_ms);
}

//  --------------------------------------------------------------------------
//  Reading an answer

typedef struct {
    const uint8_t *p;
    size_t left;
} s_cursor_t;

//  Reads one message into self->in. 0, or -1.
static int s_receive (sbx_dqlite_t *self)
{
    int64_t deadline = s_now_ms () + self->timeout_ms;
    uint8_t header[8];
    if (s_read_all (self, header, 8, deadline))
        return -1;
    uint32_t words;
    memcpy (&words, header, 4);
    size_t size = (size_t) le32toh (words) * 8;
    if (size > MAX_BODY)
        return s_fail (self, SBX_DQ_EPROTO, "%s: an answer of %zu bytes", self->address, size);
    if (size > self->in_cap) {
        uint8_t *grown = realloc (self->in, size);
        if (!grown)
            return s_fail (self, SBX_DQ_EIO, "out of memory for an answer of %zu bytes", size);
        self->in = grown;
        self->in_cap = size;
    }
    if (s_read_all (self, self->in, size, deadline))
        return -1;
    self->in_size = size;
    self->in_type = header[4];
    return 0;
}

static int s_get_u64 (s_cursor_t *c, uint64_t *value)
{
    if (c->left < 8)
        return -1;
    uint64_t le;
    memcpy (&le, c->p, 8);
    *value = le64toh (le);
    c->p += 8;
    c->left -= 8;
    return 0;
}

static int s_get_u32_pair (s_cursor_t *c, uint32_t *a, uint32_t *b)
{
    if (c->left < 8)
        return -1;
    uint32_t le[2];
    memcpy (le, c->p, 8);
    *a = le32toh (le[0]);
    *b = le32toh (le[1]);
    c->p += 8;
    c->left -= 8;
    return 0;
}

static int s_get_text (s_cursor_t *c, const char **text, size_t *size)
{
    const uint8_t *nul = memchr (c->p, 0, c->left);
    if (!nul)
        return -1;
    size_t len = (size_t) (nul - c->p);
    size_t padded = s_pad8 (len + 1);
    if (padded > c->left)
        return -1;
    *text = (const char *) c->p;
    if (size)
        *size = len;
    c->p += padded;
    c->left -= padded;
    return 0;
}

static int s_get_blob (s_cursor_t *c, const void **data, size_t *size)
{
    uint64_t len;
    if (s_get_u64 (c, &len) || len > c->left || s_pad8 ((size_t) len) > c->left)
        return -1;
    *data = c->p;
    *size = (size_t) len;
    c->p += s_pad8 ((size_t) len);
    c->left -= s_pad8 ((size_t) len);
    return 0;
}

//  A FAILURE answer becomes the call's error; any other type than expected breaks the
//  protocol.
static int s_expect (sbx_dqlite_t *self, int type)
{
    if (self->in_type == type)
        return 0;
    if (self->in_type == RES_FAILURE) {
        s_cursor_t c = {self->in, self->in_size};
        uint64_t code;
        const char *message;
        if (s_get_u64 (&c, &code) || s_get_text (&c, &message, NULL))
            return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed failure", self->address);
        //  A node's own codes are small (SQLite's extended codes, dqlite's 1..1005);
        //  anything else is kept as a protocol fault rather than passed on as a code.
        int value = code < 0x10000 ? (int) code : SBX_DQ_EPROTO;
        return s_fail (self, value, "%s", message);
    }
    return s_fail (self, SBX_DQ_EPROTO, "%s: answered type %d where %d was due", self->address,
                   self->in_type, type);
}

static int s_call (sbx_dqlite_t *self, int request, int schema, int answer)
{
    if (s_send (self, request, schema) || s_receive (self) || s_expect (self, answer))
        return -1;
    s_ok (self);
    return 0;
}

//  --------------------------------------------------------------------------
//  Rows

typedef struct {
    uint8_t **bodies; //  the messages the values point into
    size_t bodies_count;
    char *scratch; //  integers asked for as text
} s_rows_priv_t;

void sbx_dqlite_rows_free (sbx_dqlite_rows_t *rows)
{
    if (!rows)
        return;
    s_rows_priv_t *priv = rows->priv_;
    if (priv) {
        for (size_t i = 0; i < priv->bodies_count; i++)
            free (priv->bodies[i]);
        free (priv->bodies);
        free (priv);
    }
    free (rows->names);
    free (rows->values);
    memset (rows, 0, sizeof *rows);
}

static int s_row_value (s_cursor_t *c, int type, sbx_dqlite_value_t *v)
{
    uint64_t word;
    v->type = type;
    switch (type) {
    case SBX_DQ_INTEGER:
    case SBX_DQ_UNIXTIME:
    case SBX_DQ_BOOLEAN:
        if (s_get_u64 (c, &word))
            return -1;
        v->integer = (int64_t) word;
        return 0;
    case SBX_DQ_FLOAT:
        if (s_get_u64 (c, &word))
            return -1;
        memcpy (&v->real, &word, 8);
        return 0;
    case SBX_DQ_NULL:
        return s_get_u64 (c, &word);
    case SBX_DQ_TEXT:
    case SBX_DQ_ISO8601: {
        const char *text;
        if (s_get_text (c, &text, &v->size))
            return -1;
        v->data = text;
        return 0;
    }
    case SBX_DQ_BLOB:
        return s_get_blob (c, &v->data, &v->size);
    default:
        return -1;
    }
}

//  Takes the ROWS message in self->in (its body moves to rows): appends its rows.
//  Sets *more when another message follows. 0, or -1.
static int s_take_rows (sbx_dqlite_t *self, sbx_dqlite_rows_t *rows, bool *more)
{
    s_rows_priv_t *priv = rows->priv_;
    uint8_t **bodies = realloc (priv->bodies, (priv->bodies_count + 1) * sizeof *bodies);
    if (!bodies)
        return s_fail (self, SBX_DQ_EIO, "out of memory for rows");
    priv->bodies = bodies;
    uint8_t *body = self->in;
    priv->bodies[priv->bodies_count++] = body;
    s_cursor_t c = {body, self->in_size};
    self->in = NULL;
    self->in_cap = 0;

    uint64_t columns = 0;
    if (s_get_u64 (&c, &columns) || columns == 0 || columns > 4096)
        return s_fail (self, SBX_DQ_EPROTO, "%s: rows with %llu columns", self->address,
                       (unsigned long long) columns);
    if (rows->names && rows->columns != columns)
        return s_fail (self, SBX_DQ_EPROTO, "%s: a batch of rows changed its columns",
                       self->address);
    bool first = rows->names == NULL;
    if (first) {
        rows->columns = (size_t) columns;
        rows->names = calloc (rows->columns, sizeof *rows->names);
        if (!rows->names)
            return s_fail (self, SBX_DQ_EIO, "out of memory for rows");
    }
    for (size_t i = 0; i < rows->columns; i++) {
        const char *name;
        if (s_get_text (&c, &name, NULL))
            return s_fail (self, SBX_DQ_EPROTO, "%s: malformed column names", self->address);
        if (first)
            rows->names[i] = (char *) name;
    }
    size_t header = s_pad8 ((rows->columns + 1) / 2);
    size_t capacity = rows->rows;
    while (true) {
        if (c.left < 8)
            return s_fail (self, SBX_DQ_EPROTO, "%s: rows without their end", self->address);
        uint64_t mark;
        memcpy (&mark, c.p, 8);
        mark = le64toh (mark);
        if (mark == ROWS_DONE || mark == ROWS_PART) {
            *more = mark == ROWS_PART;
            c.p += 8;
            c.left -= 8;
            return 0;
        }
        if (c.left < header)
            return s_fail (self, SBX_DQ_EPROTO, "%s: a truncated row", self->address);
        const uint8_t *types = c.p;
        c.p += header;
        c.left -= header;
        if (rows->rows == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            sbx_dqlite_value_t *grown =
                realloc (rows->values, capacity * rows->columns * sizeof *grown);
            if (!grown)
                return s_fail (self, SBX_DQ_EIO, "out of memory for rows");
            rows->values = grown;
        }
        sbx_dqlite_value_t *row = rows->values + rows->rows * rows->columns;
        for (size_t i = 0; i < rows->columns; i++) {
            int type = (types[i / 2] >> ((i % 2) * 4)) & 0x0f;
            memset (&row[i], 0, sizeof row[i]);
            if (s_row_value (&c, type, &row[i]))
                return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed value (type %d)",
                               self->address, type);
        }
        rows->rows++;
    }
}

static int s_read_rows (sbx_dqlite_t *self, sbx_dqlite_rows_t *rows)
{
    memset (rows, 0, sizeof *rows);
    rows->priv_ = calloc (1, sizeof (s_rows_priv_t));
    if (!rows->priv_)
        return s_fail (self, SBX_DQ_EIO, "out of memory for rows");
    bool more = true;
    bool first = true;
    while (more) {
        //  The first answer came with the call; the rest follow unasked.
        if (!first && s_receive (self))
            goto failed;
        first = false;
        if (s_expect (self, RES_ROWS) || s_take_rows (self, rows, &more))
            goto failed;
    }
    s_ok (self);
    return 0;
failed:
    //  A node's FAILURE ends the query (first or midway): the connection stays in step.
    //  What else fails (a malformed batch, no memory to keep one) left batches unread
    //  and made the connection unusable (s_fail).
    sbx_dqlite_rows_free (rows);
    return -1;
}

//  --------------------------------------------------------------------------
//  Connection

int sbx_dqlite_dial (const char *address, int timeout_ms)
{
    if (!address || !*address)
        return -1;
    return address[0] == '@' ? s_dial_unix (address, timeout_ms) : s_dial_tcp (address, timeout_ms);
}

sbx_dqlite_t *sbx_dqlite_connect (const char *address, int timeout_ms, sbx_dqlite_dial_fn *dial,
                                  void *arg)
{
    if (!address || !*address)
        return NULL;
    if (timeout_ms <= 0)
        timeout_ms = DEFAULT_TIMEOUT_MS;
    int fd = dial                ? dial (address, timeout_ms, arg)
             : address[0] == '@' ? s_dial_unix (address, timeout_ms)
                                 : s_dial_tcp (address, timeout_ms);
    if (fd < 0) {
        sbx_debug ("dqlite %s: cannot connect", address);
        return NULL;
    }
    //  Deadlines are kept with poll: the socket must not block.
    int flags = fcntl (fd, F_GETFL);
    if (flags >= 0 && !(flags & O_NONBLOCK))
        fcntl (fd, F_SETFL, flags | O_NONBLOCK);
    sbx_dqlite_t *self = calloc (1, sizeof *self);
    if (!self || !(self->address = strdup (address))) {
        free (self);
        close (fd);
        return NULL;
    }
    self->fd = fd;
    self->timeout_ms = timeout_ms;
    self->usable = true;
    uint64_t version = htole64 (PROTOCOL_VERSION);
    if (s_write_all (self, (uint8_t *) &version, 8, s_now_ms () + timeout_ms) || s_begin (self) ||
        s_put_u64 (self, 0) || s_call (self, REQ_CLIENT, 0, RES_WELCOME)) {
        sbx_debug ("dqlite %s: handshake: %s", address, self->errmsg);
        sbx_dqlite_destroy (&self);
        return NULL;
    }
    return self;
}

void sbx_dqlite_destroy (sbx_dqlite_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sbx_dqlite_t *self = *self_p;
    if (self->fd >= 0)
        close (self->fd);
    free (self->address);
    free (self->out);
    free (self->in);
    free (self);
    *self_p = NULL;
}

sbx_dqlite_t *sbx_dqlite_connect_leader (const char *const *addresses, size_t count, int timeout_ms,
                                         sbx_dqlite_dial_fn *dial, void *arg)
{
    for (size_t i = 0; i < count; i++) {
        sbx_dqlite_t *probe = sbx_dqlite_connect (addresses[i], timeout_ms, dial, arg);
        if (!probe)
            continue;
        uint64_t id = 0;
        char *leader = NULL;
        if (sbx_dqlite_leader (probe, &id, &leader) || !leader) {
            sbx_dqlite_destroy (&probe);
            continue;
        }
        if (strcmp (leader, addresses[i]) == 0) {
            free (leader);
            return probe;
        }
        sbx_dqlite_destroy (&probe);
        //  The leader is named by its cluster address; a node of this process given as
        //  "@name" is the same node only when that is the address it was asked at.
        sbx_dqlite_t *self = sbx_dqlite_connect (leader, timeout_ms, dial, arg);
        free (leader);
        if (self)
            return self;
    }
    return NULL;
}

const char *sbx_dqlite_address (sbx_dqlite_t *self)
{
    return self->address;
}

bool sbx_dqlite_usable (sbx_dqlite_t *self)
{
    return self && self->usable;
}

int sbx_dqlite_errcode (sbx_dqlite_t *self)
{
    return self->errcode;
}

const char *sbx_dqlite_errmsg (sbx_dqlite_t *self)
{
    return self->errmsg;
}

bool sbx_dqlite_not_leader (sbx_dqlite_t *self)
{
    return self->errcode == SBX_DQ_NOT_LEADER;
}

//  --------------------------------------------------------------------------
//  Requests

int sbx_dqlite_leader (sbx_dqlite_t *self, uint64_t *id, char **address)
{
    *id = 0;
    *address = NULL;
    if (s_begin (self) || s_put_u64 (self, 0) || s_call (self, REQ_LEADER, 0, RES_SERVER))
        return -1;
    s_cursor_t c = {self->in, self->in_size};
    const char *text;
    if (s_get_u64 (&c, id) || s_get_text (&c, &text, NULL))
        return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed leader", self->address);
    if (*text && !(*address = strdup (text)))
        return s_fail (self, SBX_DQ_EIO, "out of memory");
    return 0;
}

int sbx_dqlite_open (sbx_dqlite_t *self, const char *name)
{
    if (s_begin (self) || s_put_text (self, name) || s_put_u64 (self, 0) || s_put_text (self, "") ||
        s_call (self, REQ_OPEN, 0, RES_DB))
        return -1;
    return 0;
}

int sbx_dqlite_prepare (sbx_dqlite_t *self, const char *sql, uint32_t *stmt_id, uint64_t *params)
{
    if (s_begin (self) || s_put_u64 (self, 0) || s_put_text (self, sql) ||
        s_call (self, REQ_PREPARE, 0, RES_STMT))
        return -1;
    s_cursor_t c = {self->in, self->in_size};
    uint32_t db, id;
    uint64_t count;
    if (s_get_u32_pair (&c, &db, &id) || s_get_u64 (&c, &count))
        return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed statement", self->address);
    *stmt_id = id;
    if (params)
        *params = count;
    return 0;
}

static int s_result (sbx_dqlite_t *self, sbx_dqlite_result_t *result)
{
    s_cursor_t c = {self->in, self->in_size};
    sbx_dqlite_result_t r;
    if (s_get_u64 (&c, &r.last_insert_id) || s_get_u64 (&c, &r.rows_affected))
        return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed result", self->address);
    if (result)
        *result = r;
    return 0;
}

int sbx_dqlite_exec (sbx_dqlite_t *self, uint32_t stmt_id, const sbx_dqlite_value_t *params,
                     size_t count, sbx_dqlite_result_t *result)
{
    if (s_begin (self) || s_put_u32_pair (self, 0, stmt_id) || s_put_params (self, params, count) ||
        s_call (self, REQ_EXEC, 0, RES_RESULT))
        return -1;
    return s_result (self, result);
}

int sbx_dqlite_query (sbx_dqlite_t *self, uint32_t stmt_id, const sbx_dqlite_value_t *params,
                      size_t count, sbx_dqlite_rows_t *rows)
{
    memset (rows, 0, sizeof *rows);
    if (s_begin (self) || s_put_u32_pair (self, 0, stmt_id) || s_put_params (self, params, count) ||
        s_send (self, REQ_QUERY, 0) || s_receive (self))
        return -1;
    return s_read_rows (self, rows);
}

int sbx_dqlite_finalize (sbx_dqlite_t *self, uint32_t stmt_id)
{
    if (s_begin (self) || s_put_u32_pair (self, 0, stmt_id) ||
        s_call (self, REQ_FINALIZE, 0, RES_EMPTY))
        return -1;
    return 0;
}

int sbx_dqlite_exec_sql (sbx_dqlite_t *self, const char *sql, sbx_dqlite_result_t *result)
{
    if (s_begin (self) || s_put_u64 (self, 0) || s_put_text (self, sql) ||
        s_call (self, REQ_EXEC_SQL, 0, RES_RESULT))
        return -1;
    return s_result (self, result);
}

int sbx_dqlite_query_sql (sbx_dqlite_t *self, const char *sql, sbx_dqlite_rows_t *rows)
{
    memset (rows, 0, sizeof *rows);
    if (s_begin (self) || s_put_u64 (self, 0) || s_put_text (self, sql) ||
        s_send (self, REQ_QUERY_SQL, 0) || s_receive (self))
        return -1;
    return s_read_rows (self, rows);
}

void sbx_dqlite_servers_free (sbx_dqlite_server_t **servers_p, size_t count)
{
    if (!servers_p || !*servers_p)
        return;
    for (size_t i = 0; i < count; i++)
        free ((*servers_p)[i].address);
    free (*servers_p);
    *servers_p = NULL;
}

int sbx_dqlite_cluster (sbx_dqlite_t *self, sbx_dqlite_server_t **servers, size_t *count)
{
    *servers = NULL;
    *count = 0;
    //  Format 1: id, address and role of each.
    if (s_begin (self) || s_put_u64 (self, 1) || s_call (self, REQ_CLUSTER, 0, RES_SERVERS))
        return -1;
    s_cursor_t c = {self->in, self->in_size};
    uint64_t n;
    if (s_get_u64 (&c, &n) || n > c.left / 24)
        return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed cluster", self->address);
    sbx_dqlite_server_t *list = calloc (n ? n : 1, sizeof *list);
    if (!list)
        return s_fail (self, SBX_DQ_EIO, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *address;
        uint64_t role;
        if (s_get_u64 (&c, &list[i].id) || s_get_text (&c, &address, NULL) ||
            s_get_u64 (&c, &role) || role > SBX_DQ_SPARE || !(list[i].address = strdup (address))) {
            sbx_dqlite_servers_free (&list, i + 1);
            return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed server", self->address);
        }
        list[i].role = (int) role;
    }
    *servers = list;
    *count = (size_t) n;
    return 0;
}

int sbx_dqlite_add (sbx_dqlite_t *self, uint64_t id, const char *address)
{
    if (s_begin (self) || s_put_u64 (self, id) || s_put_text (self, address) ||
        s_call (self, REQ_ADD, 0, RES_EMPTY))
        return -1;
    return 0;
}

int sbx_dqlite_assign (sbx_dqlite_t *self, uint64_t id, sbx_dqlite_role_t role)
{
    if (s_begin (self) || s_put_u64 (self, id) || s_put_u64 (self, (uint64_t) role) ||
        s_call (self, REQ_ASSIGN, 0, RES_EMPTY))
        return -1;
    return 0;
}

int sbx_dqlite_remove (sbx_dqlite_t *self, uint64_t id)
{
    if (s_begin (self) || s_put_u64 (self, id) || s_call (self, REQ_REMOVE, 0, RES_EMPTY))
        return -1;
    return 0;
}

int sbx_dqlite_transfer (sbx_dqlite_t *self, uint64_t id)
{
    if (s_begin (self) || s_put_u64 (self, id) || s_call (self, REQ_TRANSFER, 0, RES_EMPTY))
        return -1;
    return 0;
}

void sbx_dqlite_files_free (sbx_dqlite_file_t **files_p, size_t count)
{
    if (!files_p || !*files_p)
        return;
    for (size_t i = 0; i < count; i++) {
        free ((*files_p)[i].name);
        free ((*files_p)[i].data);
    }
    free (*files_p);
    *files_p = NULL;
}

int sbx_dqlite_dump (sbx_dqlite_t *self, const char *name, sbx_dqlite_file_t **files, size_t *count)
{
    *files = NULL;
    *count = 0;
    if (s_begin (self) || s_put_text (self, name) || s_call (self, REQ_DUMP, 0, RES_FILES))
        return -1;
    s_cursor_t c = {self->in, self->in_size};
    uint64_t n;
    if (s_get_u64 (&c, &n) || n > 16)
        return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed dump", self->address);
    sbx_dqlite_file_t *list = calloc (n ? n : 1, sizeof *list);
    if (!list)
        return s_fail (self, SBX_DQ_EIO, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *file;
        uint64_t size;
        if (s_get_text (&c, &file, NULL) || s_get_u64 (&c, &size) || size > c.left) {
            sbx_dqlite_files_free (&list, i + 1);
            return s_fail (self, SBX_DQ_EPROTO, "%s: a malformed dump", self->address);
        }
        list[i].name = strdup (file);
        list[i].data = malloc (size ? size : 1);
        if (!list[i].name || !list[i].data) {
            sbx_dqlite_files_free (&list, i + 1);
            return s_fail (self, SBX_DQ_EIO, "out of memory");
        }
        memcpy (list[i].data, c.p, size);
        list[i].size = (size_t) size;
        c.p += size;
        c.left -= size;
    }
    *files = list;
    *count = (size_t) n;
    return 0;
}
