/*  sbx_xfer - see sbx_xfer.h */
#include "sbx_xfer.h"

#include <assert.h>

struct sbx_xfer_t {
    bool write;
    char *path;
    uint8_t *data; //  read: gathered so far (+1 NUL); write: all of it
    size_t size;   //  read: gathered; write: all
    size_t sent;   //  write: bytes sent so far
    uint64_t mode;
    bool done;
};

static sbx_xfer_t *s_new (const char *path, bool write)
{
    sbx_xfer_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->write = write;
    self->path = strdup (path ? path : "");
    if (!self->path)
        sbx_xfer_destroy (&self);
    return self;
}

sbx_xfer_t *sbx_xfer_new_read (const char *path)
{
    return s_new (path, false);
}

sbx_xfer_t *sbx_xfer_new_write (const char *path, const void *data, size_t size, uint64_t mode)
{
    if (size > SBX_XFER_MAX || (!data && size))
        return NULL;
    sbx_xfer_t *self = s_new (path, true);
    if (!self)
        return NULL;
    self->data = malloc (size + 1);
    if (!self->data) {
        sbx_xfer_destroy (&self);
        return NULL;
    }
    if (size)
        memcpy (self->data, data, size);
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

sbx_msg_t *sbx_xfer_next (sbx_xfer_t *self)
{
    assert (self);
    if (self->done)
        return NULL;
    if (!self->write) {
        sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
        sbx_agent_file_read_t *m = sbx_msg_agent_file_read (msg);
        sbx_str_set (&m->path, self->path);
        m->offset = self->size;
        m->length = SBX_XFER_CHUNK;
        return msg;
    }
    //  An empty file is one write too: it truncates (or creates) the file.
    if (self->sent == self->size && self->sent > 0)
        return NULL;
    size_t n = self->size - self->sent;
    if (n > SBX_XFER_CHUNK)
        n = SBX_XFER_CHUNK;
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
    sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
    sbx_str_set (&m->path, self->path);
    sbx_bytes_set (&m->data, self->data + self->sent, n);
    m->offset = self->sent;
    m->truncate = self->sent == 0;
    m->mode = self->sent == 0 ? self->mode : 0;
    self->sent += n;
    return msg;
}

int sbx_xfer_take (sbx_xfer_t *self, const sbx_msg_t *reply, sbx_code_t *code, char *why,
                   size_t why_size)
{
    assert (self && code);
    sbx_msg_type_t want = self->write ? SBX_MSG_AGENT_FILE_WRITE_OK : SBX_MSG_AGENT_FILE_READ_OK;
    if (!reply || reply->type != want) {
        *code = SBX_E_INTERNAL;
        snprintf (why, why_size, "unexpected answer %s to a file chunk",
                  reply ? sbx_msg_type_name (reply->type) : "(none)");
        return -1;
    }
    if (self->write) {
        self->done = self->sent >= self->size;
        return 0;
    }
    const sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok ((sbx_msg_t *) reply);
    if (ok->size > SBX_XFER_MAX || self->size + ok->data.size > SBX_XFER_MAX) {
        *code = SBX_E_TOO_LARGE;
        snprintf (why, why_size,
                  "%.200s is %llu bytes; read_file returns at most %d MiB (use exec with head, "
                  "tail or split for larger files)",
                  self->path, (unsigned long long) ok->size, SBX_XFER_MAX / (1024 * 1024));
        return -1;
    }
    uint8_t *grown = realloc (self->data, self->size + ok->data.size + 1);
    if (!grown) {
        *code = SBX_E_INTERNAL;
        snprintf (why, why_size, "out of memory");
        return -1;
    }
    self->data = grown;
    if (ok->data.size)
        memcpy (self->data + self->size, ok->data.data, ok->data.size);
    self->size += ok->data.size;
    self->data[self->size] = 0;
    self->done = ok->eof || ok->data.size == 0;
    return 0;
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

void sbx_xfer_test (bool verbose)
{
    (void) verbose;
    sbx_code_t code;
    char why[300];
    //  2.5 MiB out: three chunks, the first truncating with the mode.
    size_t size = SBX_XFER_CHUNK * 5 / 2;
    uint8_t *blob = malloc (size);
    for (size_t i = 0; i < size; i++)
        blob[i] = (uint8_t) (i * 7);
    sbx_xfer_t *xfer = sbx_xfer_new_write ("/root/x", blob, size, 0755);
    assert (xfer);
    size_t seen = 0;
    int chunks = 0;
    for (sbx_msg_t *msg; (msg = sbx_xfer_next (xfer)); chunks++) {
        sbx_agent_file_write_t *m = sbx_msg_agent_file_write (msg);
        assert (m->offset == seen && m->truncate == (seen == 0));
        assert (m->mode == (seen == 0 ? 0755u : 0u));
        assert (memcmp (m->data.data, blob + seen, m->data.size) == 0);
        seen += m->data.size;
        sbx_msg_t *ok = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE_OK);
        assert (sbx_xfer_take (xfer, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
        sbx_msg_destroy (&msg);
    }
    assert (chunks == 3 && seen == size);
    sbx_xfer_destroy (&xfer);
    //  An empty file is one write.
    xfer = sbx_xfer_new_write ("/root/empty", NULL, 0, 0);
    sbx_msg_t *msg = sbx_xfer_next (xfer);
    assert (msg && sbx_msg_agent_file_write (msg)->truncate);
    sbx_msg_destroy (&msg);
    sbx_msg_t *ok = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE_OK);
    assert (sbx_xfer_take (xfer, ok, &code, why, sizeof why) == 0);
    sbx_msg_destroy (&ok);
    assert (!sbx_xfer_next (xfer));
    sbx_xfer_destroy (&xfer);
    assert (!sbx_xfer_new_write ("/x", blob, SBX_XFER_MAX + 1, 0));
    //  In: chunks gathered until eof; a file over the limit is refused by its size.
    xfer = sbx_xfer_new_read ("/root/x");
    for (int i = 0; i < 2; i++) {
        msg = sbx_xfer_next (xfer);
        assert (msg && sbx_msg_agent_file_read (msg)->offset == (uint64_t) i * 3);
        sbx_msg_destroy (&msg);
        ok = sbx_msg_new (SBX_MSG_AGENT_FILE_READ_OK);
        sbx_bytes_set (&sbx_msg_agent_file_read_ok (ok)->data, "abc", 3);
        sbx_msg_agent_file_read_ok (ok)->size = 6;
        sbx_msg_agent_file_read_ok (ok)->eof = i == 1;
        assert (sbx_xfer_take (xfer, ok, &code, why, sizeof why) == 0);
        sbx_msg_destroy (&ok);
    }
    assert (!sbx_xfer_next (xfer));
    assert (sbx_xfer_size (xfer) == 6 && memcmp (sbx_xfer_data (xfer), "abcabc", 7) == 0);
    size_t n;
    uint8_t *data = sbx_xfer_take_data (xfer, &n);
    assert (n == 6 && streq ((char *) data, "abcabc"));
    free (data);
    sbx_xfer_destroy (&xfer);
    xfer = sbx_xfer_new_read ("/root/big");
    ok = sbx_msg_new (SBX_MSG_AGENT_FILE_READ_OK);
    sbx_msg_agent_file_read_ok (ok)->size = SBX_XFER_MAX + 1;
    assert (sbx_xfer_take (xfer, ok, &code, why, sizeof why) == -1 && code == SBX_E_TOO_LARGE);
    assert (strstr (why, "/root/big is 16777217 bytes; read_file returns at most 16 MiB"));
    sbx_msg_destroy (&ok);
    ok = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE_OK);
    assert (sbx_xfer_take (xfer, ok, &code, why, sizeof why) == -1 && code == SBX_E_INTERNAL);
    sbx_msg_destroy (&ok);
    sbx_xfer_destroy (&xfer);
    free (blob);
}
