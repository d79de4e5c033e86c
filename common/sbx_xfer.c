/*  sbx_xfer - see sbx_xfer.h */
#include "sbx_xfer.h"

#include <assert.h>
#include <stdarg.h>
#include <sys/mman.h>

struct sbx_xfer_t {
    bool write;
    char *path;
    uint8_t *data; //  read: gathered so far (+1 NUL); write: all of it
    size_t size;   //  read: the file's end once done, bytes reached before; write: all
    size_t cap;    //  read: data's allocation
    uint64_t mode;
    size_t planned;                   //  the offset of the next chunk to ask for
    uint64_t flight[SBX_XFER_WINDOW]; //  the offsets in flight
    int in_flight;                    //  how many
    bool first_sent, first_done;      //  the first chunk goes alone
    uint32_t acked;                   //  write: bit i, chunk i answered
    size_t target;                    //  read: the file's size as last said
    size_t end;                       //  read: where it ends (SIZE_MAX: not known yet)
    uint32_t got;                     //  read: bit i, the chunk at i MiB taken
    bool fixed;                       //  read: ends at the size first said (sbx_xfer_fix)
    bool done, failed;
};

static sbx_xfer_t *s_new (const char *path, bool write)
{
    sbx_xfer_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->write = write;
    self->end = SIZE_MAX;
    self->path = strdup (path ? path : "");
    if (!self->path)
        sbx_xfer_destroy (&self);
    return self;
}

void sbx_xfer_advise_huge (void *data, size_t size)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = 2 * 1024 * 1024;
    uintptr_t from = ((uintptr_t) data + huge - 1) & ~(huge - 1);
    uintptr_t to = ((uintptr_t) data + size) & ~(huge - 1);
    if (data && to > from)
        (void) madvise ((void *) from, to - from, MADV_HUGEPAGE); //  a hint: failure is fine
#else
    (void) data;
    (void) size;
#endif
}

sbx_xfer_t *sbx_xfer_new_read (const char *path)
{
    return s_new (path, false);
}

sbx_xfer_t *sbx_xfer_new_write (const char *path, const void *data, size_t size, uint64_t mode)
{
    if (size > SBX_XFER_MAX || (!data && size))
        return NULL;
    uint8_t *copy = malloc (size + 1);
    if (!copy)
        return NULL;
    sbx_xfer_advise_huge (copy, size + 1);
    if (size)
        memcpy (copy, data, size);
    sbx_xfer_t *self = sbx_xfer_new_write_take (path, &copy, size, mode);
    free (copy);
    return self;
}

sbx_xfer_t *sbx_xfer_new_write_take (const char *path, uint8_t **data_p, size_t size, uint64_t mode)
{
    if (!data_p || size > SBX_XFER_MAX || (!*data_p && size))
        return NULL;
    sbx_xfer_t *self = s_new (path, true);
    if (!self)
        return NULL;
    if (*data_p) {
        self->data = *data_p;
        *data_p = NULL;
    } else if (!(self->data = malloc (1))) {
        sbx_xfer_destroy (&self);
        return NULL;
    }
    self->size = size;
    self->mode = mode;
    return self;
}

void sbx_xfer_destroy (sbx_xfer_t **self_p)
{
    assert (self_p);
    sbx_xfer_t *self = *self_p;
    if (self) {
        free (self->path);
        free (self->data);
        free (self);
        *self_p = NULL;
    }
}

//  A write's chunk at offset: how long it is, and its number (the bit in acked). The
//  first is short (SBX_XFER_FIRST), so that the round trip the others wait for is.
static size_t s_write_len (sbx_xfer_t *self, size_t offset)
{
    size_t n = offset == 0 ? SBX_XFER_FIRST : SBX_XFER_CHUNK;
    return n < self->size - offset ? n : self->size - offset;
}

static uint32_t s_write_bit (size_t offset)
{
    return 1u << (offset == 0 ? 0 : 1 + (offset - SBX_XFER_FIRST) / SBX_XFER_CHUNK);
}

//  Which chunk goes next, if one may go now: its offset, or -1.
static int64_t s_plan (sbx_xfer_t *self)
{
    if (self->done || self->failed || self->in_flight >= SBX_XFER_WINDOW)
        return -1;
    if (!self->write && !self->first_done)
        //  A read sends its first window before the size is known: reading changes
        //  nothing, and a chunk past the end comes back empty.
        return self->planned < SBX_XFER_WINDOW * SBX_XFER_CHUNK ? (int64_t) self->planned : -1;
    if (!self->first_sent)
        return 0;
    if (!self->first_done)
        return -1;
    if (self->write)
        return self->planned < self->size ? (int64_t) self->planned : -1;
    if (self->fixed)
        return self->planned < self->end ? (int64_t) self->planned : -1;
    if (self->end != SIZE_MAX)
        return -1;
    //  Up to the size the agent said; past it one chunk at a time (a file that grows, a
    //  pipe), until a short answer says where it ends.
    if (self->planned < self->target || self->in_flight == 0)
        return (int64_t) self->planned;
    return -1;
}

sbx_msg_t *sbx_xfer_next (sbx_xfer_t *self, uint64_t *offset_p)
{
    assert (self);
    int64_t at = s_plan (self);
    if (at < 0)
        return NULL;
    size_t offset = (size_t) at;
    sbx_msg_t *msg;
    size_t n = SBX_XFER_CHUNK;
    if (!self->write) {
        msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
        sbx_agent_file_read_t *m = sbx_msg_agent_file_read (msg);
        sbx_str_set (&m->path, self->path);
        m->offset = offset;
        m->length = SBX_XFER_CHUNK;
    } else {
        //  An empty file is one write too: it truncates (or creates) the file.
        n = s_write_len (self, offset);
        msg = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
        sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
        sbx_str_set (&m->path, self->path);
        sbx_bytes_set (&m->data, self->data + offset, n);
        m->offset = offset;
        m->truncate = offset == 0;
        m->mode = offset == 0 ? self->mode : 0;
    }
    if (!msg)
        return NULL;
    self->first_sent = true;
    self->planned = offset + n;
    self->flight[self->in_flight++] = offset;
    if (offset_p)
        *offset_p = offset;
    return msg;
}

static int s_fail (sbx_xfer_t *self, sbx_code_t *code, sbx_code_t value, char *why, size_t why_size,
                   const char *format, ...)
{
    self->failed = true;
    *code = value;
    va_list args;
    va_start (args, format);
    vsnprintf (why, why_size, format, args);
    va_end (args);
    return -1;
}

//  Takes a read chunk's bytes at offset.
static int s_take_read (sbx_xfer_t *self, uint64_t offset, const sbx_agent_file_read_ok_t *ok,
                        sbx_code_t *code, char *why, size_t why_size)
{
    size_t n = ok->data.size;
    if (self->fixed) //  nothing past the size fixed: a file that grew is read as it was
        n = offset >= self->end ? 0 : (n < self->end - offset ? n : self->end - offset);
    size_t reach = (size_t) offset + n;
    if (!self->fixed && (ok->size > SBX_XFER_MAX || reach > SBX_XFER_MAX))
        return s_fail (self, code, SBX_E_TOO_LARGE, why, why_size,
                       "%.200s is %llu bytes; read_file returns at most %d MiB (use exec with "
                       "head, tail or split for larger files)",
                       self->path,
                       (unsigned long long) (ok->size > reach ? ok->size : (uint64_t) reach),
                       SBX_XFER_MAX / (1024 * 1024));
    if (ok->size > self->target && !self->fixed)
        self->target = (size_t) ok->size;
    size_t want = (reach > self->target ? reach : self->target) + 1;
    if (want > self->cap) {
        uint8_t *grown = realloc (self->data, want);
        if (!grown)
            return s_fail (self, code, SBX_E_INTERNAL, why, why_size, "out of memory");
        self->data = grown;
        self->cap = want;
        sbx_xfer_advise_huge (grown, want);
    }
    if (n)
        memcpy (self->data + offset, ok->data.data, n);
    if (reach > self->size)
        self->size = reach;
    if (self->fixed) {
        //  Short of the size fixed: the file shrank, and ends here.
        size_t due = offset >= self->end ? 0 : self->end - offset;
        if (n < (due < SBX_XFER_CHUNK ? due : SBX_XFER_CHUNK) && reach < self->end)
            self->end = reach;
    } else if ((ok->eof || ok->data.size < SBX_XFER_CHUNK) && reach < self->end)
        self->end = reach;
    if (offset / SBX_XFER_CHUNK < 32 && offset % SBX_XFER_CHUNK == 0)
        self->got |= 1u << (offset / SBX_XFER_CHUNK);
    return 0;
}

int sbx_xfer_take (sbx_xfer_t *self, uint64_t offset, const sbx_msg_t *reply, sbx_code_t *code,
                   char *why, size_t why_size)
{
    assert (self && code);
    if (self->failed)
        return s_fail (self, code, SBX_E_INTERNAL, why, why_size, "the transfer failed before");
    int slot = 0;
    while (slot < self->in_flight && self->flight[slot] != offset)
        slot++;
    if (slot == self->in_flight)
        return s_fail (self, code, SBX_E_INTERNAL, why, why_size,
                       "an answer for offset %llu, which no chunk in flight has",
                       (unsigned long long) offset);
    self->flight[slot] = self->flight[--self->in_flight];
    sbx_msg_type_t want = self->write ? SBX_MSG_AGENT_FILE_WRITE_OK : SBX_MSG_AGENT_FILE_READ_OK;
    if (!reply || reply->type != want)
        return s_fail (self, code, SBX_E_INTERNAL, why, why_size,
                       "unexpected answer %s to a file chunk",
                       reply ? sbx_msg_type_name (reply->type) : "(none)");
    if (self->write)
        self->acked |= s_write_bit (offset);
    else if (s_take_read (self, offset, sbx_msg_agent_file_read_ok ((sbx_msg_t *) reply), code, why,
                          why_size))
        return -1;
    self->first_done = true;
    if (self->in_flight == 0) {
        if (self->write)
            self->done = self->planned >= self->size;
        else if (self->end != SIZE_MAX && (!self->fixed || self->planned >= self->end)) {
            self->done = true;
            self->size = self->end;
            if (!self->data)
                self->data = calloc (1, 1);
            if (self->data)
                self->data[self->size] = 0;
        }
    }
    return 0;
}

bool sbx_xfer_done (sbx_xfer_t *self)
{
    assert (self);
    return self->done;
}

sbx_msg_t *sbx_xfer_cut (sbx_xfer_t *self)
{
    assert (self);
    if (!self->write || !self->first_done || self->done)
        return NULL;
    size_t prefix = 0;
    while (prefix < self->size && (self->acked & s_write_bit (prefix)))
        prefix += s_write_len (self, prefix);
    if (self->planned <= prefix + s_write_len (self, prefix))
        return NULL; //  nothing was sent past the first chunk missing
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
    if (msg) {
        sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
        sbx_str_set (&m->path, self->path);
        m->offset = prefix;
        m->truncate = true;
    }
    return msg;
}

int64_t sbx_xfer_fix (sbx_xfer_t *self)
{
    assert (self);
    if (self->write || !self->first_done || self->failed || self->target > SBX_XFER_MAX)
        return -1;
    if (!self->fixed) {
        self->fixed = true;
        if (self->end == SIZE_MAX || self->end > self->target)
            self->end = self->target;
        //  Bytes past it, taken from chunks answered before, are not part of the file.
        if (self->size > self->end)
            self->size = self->end;
    }
    return (int64_t) self->end;
}

size_t sbx_xfer_expected (sbx_xfer_t *self)
{
    assert (self);
    return self->write ? 0 : self->target;
}

size_t sbx_xfer_ready (sbx_xfer_t *self)
{
    assert (self);
    if (self->write)
        return 0;
    size_t chunks = 0;
    while (chunks < 32 && (self->got & (1u << chunks)))
        chunks++;
    size_t ready = chunks * SBX_XFER_CHUNK;
    if (self->end != SIZE_MAX && ready > self->end)
        ready = self->end;
    return ready < self->size ? ready : self->size;
}

const uint8_t *sbx_xfer_data (sbx_xfer_t *self)
{
    assert (self);
    return self->data ? self->data : (const uint8_t *) "";
}

size_t sbx_xfer_size (sbx_xfer_t *self)
{
    assert (self);
    return self->size;
}

const char *sbx_xfer_path (sbx_xfer_t *self)
{
    assert (self);
    return self->path;
}

uint8_t *sbx_xfer_take_data (sbx_xfer_t *self, size_t *size_p)
{
    assert (self && size_p);
    uint8_t *data = self->data ? self->data : calloc (1, 1);
    *size_p = self->size;
    self->data = NULL;
    self->size = 0;
    return data;
}

//  --------------------------------------------------------------------------
//  Self test

static sbx_msg_t *s_write_ok (void)
{
    return sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE_OK);
}

//  A read answer of n bytes of pattern from offset of a file of size bytes.
static sbx_msg_t *s_read_ok (const uint8_t *file, size_t size, uint64_t offset)
{
    sbx_msg_t *ok = sbx_msg_new (SBX_MSG_AGENT_FILE_READ_OK);
    size_t n = offset >= size ? 0 : size - offset;
    if (n > SBX_XFER_CHUNK)
        n = SBX_XFER_CHUNK;
    sbx_bytes_set (&sbx_msg_agent_file_read_ok (ok)->data, file + offset, n);
    sbx_msg_agent_file_read_ok (ok)->size = size;
    sbx_msg_agent_file_read_ok (ok)->eof = offset + n >= size;
    return ok;
}

void sbx_xfer_test (bool verbose)
{
    (void) verbose;
    sbx_code_t code;
    char why[300];
    uint64_t at;
    //  2.5 MiB out one chunk at a time (the CLI's way): three chunks, the first
    //  truncating with the mode.
    size_t size = SBX_XFER_CHUNK * 5 / 2;
    uint8_t *blob = malloc (size);
    for (size_t i = 0; i < size; i++)
        blob[i] = (uint8_t) (i * 7);
    sbx_xfer_t *xfer = sbx_xfer_new_write ("/root/x", blob, size, 0755);
    assert (xfer);
    size_t seen = 0;
    int chunks = 0;
    for (sbx_msg_t *msg; (msg = sbx_xfer_next (xfer, &at)); chunks++) {
        sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
        assert (m->offset == seen && at == seen && m->truncate == (seen == 0));
        assert (m->mode == (seen == 0 ? 0755u : 0u));
        assert (memcmp (m->data.data, blob + seen, m->data.size) == 0);
        seen += m->data.size;
        sbx_msg_t *ok = s_write_ok ();
        assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
        sbx_msg_destroy (&msg);
    }
    assert (chunks == 4 && seen == size && sbx_xfer_done (xfer)); //  64 KiB, 1, 1, the rest
    sbx_xfer_destroy (&xfer);
    //  The bytes taken, not copied: the same transfer; over the limit nothing is taken.
    uint8_t *taken = malloc (size);
    memcpy (taken, blob, size);
    uint8_t *was = taken;
    xfer = sbx_xfer_new_write_take ("/root/x", &taken, size, 0);
    assert (xfer && !taken && sbx_xfer_data (xfer) == was && sbx_xfer_size (xfer) == size);
    sbx_xfer_destroy (&xfer);
    uint8_t *empty = NULL;
    xfer = sbx_xfer_new_write_take ("/root/x", &empty, 0, 0);
    assert (xfer && sbx_xfer_size (xfer) == 0);
    sbx_xfer_destroy (&xfer);
    taken = malloc (1);
    assert (!sbx_xfer_new_write_take ("/root/x", &taken, SBX_XFER_MAX + 1, 0) && taken);
    free (taken);

    //  10 MiB pipelined: the first chunk alone, then SBX_XFER_WINDOW at once, answered
    //  in any order; each chunk sent once, all of the file covered.
    size_t big = 10 * SBX_XFER_CHUNK;
    uint8_t *file = malloc (big);
    for (size_t i = 0; i < big; i++)
        file[i] = (uint8_t) (i * 13 + i / 4099);
    xfer = sbx_xfer_new_write ("/root/big", file, big, 0);
    sbx_msg_t *msg = sbx_xfer_next (xfer, &at);
    assert (msg && at == 0 && !sbx_xfer_next (xfer, NULL)); //  the first alone
    sbx_msg_destroy (&msg);
    sbx_msg_t *ok = s_write_ok ();
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    uint32_t covered = 1;
    while (!sbx_xfer_done (xfer)) {
        uint64_t batch[SBX_XFER_WINDOW];
        int n = 0;
        while ((msg = sbx_xfer_next (xfer, &at))) {
            sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
            assert (!m->truncate && m->offset == at && (at - SBX_XFER_FIRST) % SBX_XFER_CHUNK == 0);
            assert (memcmp (m->data.data, file + at, m->data.size) == 0);
            assert (!(covered & s_write_bit (at)));
            covered |= s_write_bit (at);
            batch[n++] = at;
            sbx_msg_destroy (&msg);
        }
        assert (n > 0 && n <= SBX_XFER_WINDOW);
        for (int i = n - 1; i >= 0; i--) //  the last sent answered first
            assert (sbx_xfer_take (xfer, batch[i], ok, &code, why, sizeof why) == 0);
    }
    assert (covered == (1u << 11) - 1 && !sbx_xfer_cut (xfer)); //  64 KiB, then 10
    //  An answer for no chunk in flight is an error, not a silent success.
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == -1 && code == SBX_E_INTERNAL);
    sbx_xfer_destroy (&xfer);

    //  A chunk that fails mid-transfer while later ones were written: the cut takes the
    //  file back to the chunks written without a gap (the first two here).
    xfer = sbx_xfer_new_write ("/root/big", file, big, 0);
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    assert (!sbx_xfer_cut (xfer)); //  the first chunk not answered: nothing past it sent
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    for (int i = 0; i < SBX_XFER_WINDOW; i++) {
        msg = sbx_xfer_next (xfer, &at);
        assert (msg && at == SBX_XFER_FIRST + (uint64_t) i * SBX_XFER_CHUNK);
        sbx_msg_destroy (&msg);
    }
    assert (sbx_xfer_take (xfer, SBX_XFER_FIRST, ok, &code, why, sizeof why) == 0);
    assert (sbx_xfer_take (xfer, SBX_XFER_FIRST + 2 * SBX_XFER_CHUNK, ok, &code, why, sizeof why) ==
            0);
    //  The third failed (its answer an error: the door ends the call).
    sbx_msg_t *err = sbx_msg_new_error (1, SBX_E_UNAVAILABLE, "gone");
    assert (sbx_xfer_take (xfer, SBX_XFER_FIRST + SBX_XFER_CHUNK, err, &code, why, sizeof why) ==
            -1);
    assert (code == SBX_E_INTERNAL && !sbx_xfer_next (xfer, NULL) && !sbx_xfer_done (xfer));
    sbx_msg_destroy (&err);
    msg = sbx_xfer_cut (xfer);
    assert (msg && msg->type == SBX_MSG_AGENT_FILE_WRITE);
    assert (sbx_msg_agent_file_write (msg)->truncate);
    assert (sbx_msg_agent_file_write (msg)->offset == SBX_XFER_FIRST + SBX_XFER_CHUNK);
    assert (sbx_msg_agent_file_write (msg)->data.size == 0);
    assert (streq (sbx_msg_agent_file_write (msg)->path, "/root/big"));
    sbx_msg_destroy (&msg);
    sbx_xfer_destroy (&xfer);
    //  A failure in the last chunk sent, nothing past it: no cut needed.
    xfer = sbx_xfer_new_write ("/root/x", blob, size, 0);
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    for (int i = 0; i < 2; i++) {
        msg = sbx_xfer_next (xfer, &at);
        sbx_msg_destroy (&msg);
    }
    assert (sbx_xfer_take (xfer, SBX_XFER_FIRST, ok, &code, why, sizeof why) == 0);
    assert (!sbx_xfer_cut (xfer));
    sbx_xfer_destroy (&xfer);
    sbx_msg_destroy (&ok);

    //  An empty file is one write.
    xfer = sbx_xfer_new_write ("/root/empty", NULL, 0, 0);
    msg = sbx_xfer_next (xfer, &at);
    assert (msg && sbx_msg_agent_file_write (msg)->truncate && at == 0);
    assert (!sbx_xfer_next (xfer, NULL));
    sbx_msg_destroy (&msg);
    ok = s_write_ok ();
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    sbx_msg_destroy (&ok);
    assert (!sbx_xfer_next (xfer, NULL) && sbx_xfer_done (xfer));
    sbx_xfer_destroy (&xfer);
    assert (!sbx_xfer_new_write ("/x", blob, SBX_XFER_MAX + 1, 0));

    //  In, one at a time: chunks gathered until eof.
    xfer = sbx_xfer_new_read ("/root/x");
    for (int i = 0; i < 2; i++) {
        msg = sbx_xfer_next (xfer, &at);
        assert (msg && sbx_msg_agent_file_read (msg)->offset == at);
        sbx_msg_destroy (&msg);
        ok = s_read_ok ((const uint8_t *) "abcdefgh", 3 + (size_t) i * 3, at);
        //  a small file that grew between the reads: read on until a short answer
        if (i == 0) {
            sbx_bytes_set (&sbx_msg_agent_file_read_ok (ok)->data, "abc", 3);
            sbx_msg_agent_file_read_ok (ok)->eof = true;
        }
        int rc = sbx_xfer_take (xfer, at, ok, &code, why, sizeof why);
        assert (rc == 0);
        sbx_msg_destroy (&ok);
        if (sbx_xfer_done (xfer))
            break;
    }
    assert (!sbx_xfer_next (xfer, NULL) && sbx_xfer_done (xfer));
    assert (sbx_xfer_size (xfer) == 3 && memcmp (sbx_xfer_data (xfer), "abc", 4) == 0);
    size_t n;
    uint8_t *data = sbx_xfer_take_data (xfer, &n);
    assert (n == 3 && streq ((char *) data, "abc"));
    free (data);
    sbx_xfer_destroy (&xfer);

    //  10 MiB in, pipelined from the first window on, answered in any order: the same
    //  bytes back.
    xfer = sbx_xfer_new_read ("/root/big");
    int rounds = 0;
    while (!sbx_xfer_done (xfer)) {
        uint64_t batch[SBX_XFER_WINDOW];
        int k = 0;
        while ((msg = sbx_xfer_next (xfer, &at))) {
            batch[k++] = at;
            sbx_msg_destroy (&msg);
        }
        assert (k > 0 && k <= SBX_XFER_WINDOW && (rounds++ > 0 || k == SBX_XFER_WINDOW));
        for (int i = k - 1; i >= 0; i--) {
            ok = s_read_ok (file, big, batch[i]);
            assert (sbx_xfer_take (xfer, batch[i], ok, &code, why, sizeof why) == 0);
            sbx_msg_destroy (&ok);
        }
    }
    assert (sbx_xfer_size (xfer) == big && memcmp (sbx_xfer_data (xfer), file, big) == 0);
    sbx_xfer_destroy (&xfer);
    //  A small file read with a whole window in flight: the chunks past its end come
    //  back empty and change nothing, whatever their order.
    xfer = sbx_xfer_new_read ("/root/small");
    uint64_t batch[SBX_XFER_WINDOW];
    int k = 0;
    while ((msg = sbx_xfer_next (xfer, &at))) {
        batch[k++] = at;
        sbx_msg_destroy (&msg);
    }
    assert (k == SBX_XFER_WINDOW);
    for (int i = k - 1; i >= 0; i--) {
        ok = s_read_ok (file, 1000, batch[i]);
        assert (sbx_xfer_take (xfer, batch[i], ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
        assert (sbx_xfer_done (xfer) == (i == 0));
    }
    assert (sbx_xfer_size (xfer) == 1000 && memcmp (sbx_xfer_data (xfer), file, 1000) == 0);
    sbx_xfer_destroy (&xfer);
    //  A file that shrinks while read: it ends where the first short answer says.
    xfer = sbx_xfer_new_read ("/root/big");
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    ok = s_read_ok (file, big, 0);
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    sbx_msg_destroy (&ok);
    while (!sbx_xfer_done (xfer)) {
        msg = sbx_xfer_next (xfer, &at);
        assert (msg);
        sbx_msg_destroy (&msg);
        ok = s_read_ok (file, 2 * SBX_XFER_CHUNK + 5, at);
        assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
    }
    assert (sbx_xfer_size (xfer) == 2 * SBX_XFER_CHUNK + 5);
    assert (memcmp (sbx_xfer_data (xfer), file, 2 * SBX_XFER_CHUNK + 5) == 0);
    sbx_xfer_destroy (&xfer);

    //  Fixed at the first answer's size (REST streams it): the bytes ready from the start
    //  grow as the chunks before them come, whatever the order; a file that grows is
    //  read as it was.
    xfer = sbx_xfer_new_read ("/root/big");
    assert (sbx_xfer_fix (xfer) == -1); //  no answer yet
    k = 0;
    while ((msg = sbx_xfer_next (xfer, &at))) {
        batch[k++] = at;
        sbx_msg_destroy (&msg);
    }
    assert (k == SBX_XFER_WINDOW);
    ok = s_read_ok (file, big, 0);
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    sbx_msg_destroy (&ok);
    assert (sbx_xfer_fix (xfer) == (int64_t) big && sbx_xfer_ready (xfer) == SBX_XFER_CHUNK);
    for (int i = k - 1; i >= 1; i--) { //  the last first: nothing more ready until chunk 1
        ok = s_read_ok (file, big + 2 * SBX_XFER_CHUNK, batch[i]); //  it grew meanwhile
        assert (sbx_xfer_take (xfer, batch[i], ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
        assert (sbx_xfer_ready (xfer) == (i == 1 ? (size_t) k * SBX_XFER_CHUNK : SBX_XFER_CHUNK));
    }
    while (!sbx_xfer_done (xfer)) {
        msg = sbx_xfer_next (xfer, &at);
        assert (msg && at < big);
        sbx_msg_destroy (&msg);
        ok = s_read_ok (file, big + 2 * SBX_XFER_CHUNK, at);
        assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
    }
    assert (sbx_xfer_size (xfer) == big && sbx_xfer_ready (xfer) == big);
    assert (memcmp (sbx_xfer_data (xfer), file, big) == 0);
    sbx_xfer_destroy (&xfer);
    //  …and one that shrinks ends where the short answer says.
    xfer = sbx_xfer_new_read ("/root/big");
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    ok = s_read_ok (file, 3 * SBX_XFER_CHUNK, 0);
    assert (sbx_xfer_take (xfer, 0, ok, &code, why, sizeof why) == 0);
    sbx_msg_destroy (&ok);
    assert (sbx_xfer_fix (xfer) == 3 * SBX_XFER_CHUNK);
    while ((msg = sbx_xfer_next (xfer, &at))) {
        sbx_msg_destroy (&msg);
        ok = s_read_ok (file, 2 * SBX_XFER_CHUNK + 10, at);
        assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
    }
    assert (sbx_xfer_done (xfer) && sbx_xfer_size (xfer) == 2 * SBX_XFER_CHUNK + 10);
    assert (sbx_xfer_ready (xfer) == 2 * SBX_XFER_CHUNK + 10);
    sbx_xfer_destroy (&xfer);

    //  A file over the limit is refused by its size.
    xfer = sbx_xfer_new_read ("/root/big");
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    ok = sbx_msg_new (SBX_MSG_AGENT_FILE_READ_OK);
    sbx_msg_agent_file_read_ok (ok)->size = SBX_XFER_MAX + 1;
    assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == -1 && code == SBX_E_TOO_LARGE);
    assert (strstr (why, "/root/big is 16777217 bytes; read_file returns at most 16 MiB"));
    assert (!sbx_xfer_next (xfer, NULL) && !sbx_xfer_cut (xfer));
    sbx_msg_destroy (&ok);
    sbx_xfer_destroy (&xfer);
    //  An answer of another type.
    xfer = sbx_xfer_new_read ("/root/big");
    msg = sbx_xfer_next (xfer, &at);
    sbx_msg_destroy (&msg);
    ok = s_write_ok ();
    assert (sbx_xfer_take (xfer, at, ok, &code, why, sizeof why) == -1 && code == SBX_E_INTERNAL);
    sbx_msg_destroy (&ok);
    sbx_xfer_destroy (&xfer);
    free (file);
    free (blob);
}
