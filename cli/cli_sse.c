/*  cli_sse - Server-Sent Events, parsed as they arrive (see cli_sse.h). */
#include "cli_sse.h"
#include "sbx_common.h"

struct cli_sse_t {
    cli_sse_event_fn *on_event;
    void *arg;
    char *line; //  the line being read
    size_t line_size, line_capacity;
    char *data; //  the event's data so far
    size_t data_size, data_capacity;
    bool has_data;
    char event[64]; //  the event's name ("" until an event: line)
};

static int s_append (char **buf, size_t *size, size_t *capacity, const char *data, size_t n)
{
    if (*size + n + 1 > *capacity) {
        size_t c = *capacity ? *capacity : 256;
        while (c < *size + n + 1)
            c *= 2;
        char *grown = realloc (*buf, c);
        if (!grown)
            return -1;
        *buf = grown;
        *capacity = c;
    }
    memcpy (*buf + *size, data, n);
    *size += n;
    (*buf)[*size] = 0;
    return 0;
}

cli_sse_t *cli_sse_new (cli_sse_event_fn *on_event, void *arg)
{
    cli_sse_t *self = calloc (1, sizeof *self);
    if (self)
        self->on_event = on_event, self->arg = arg;
    return self;
}

void cli_sse_destroy (cli_sse_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free ((*self_p)->line);
    free ((*self_p)->data);
    free (*self_p);
    *self_p = NULL;
}

static void s_dispatch (cli_sse_t *self)
{
    if (self->has_data)
        self->on_event (self->arg, *self->event ? self->event : "message",
                        self->data ? self->data : "");
    self->data_size = 0;
    self->has_data = false;
    self->event[0] = 0;
}

static int s_line (cli_sse_t *self, const char *line, size_t n)
{
    if (n == 0) {
        s_dispatch (self);
        return 0;
    }
    if (n >= 5 && memcmp (line, "data:", 5) == 0) {
        line += 5, n -= 5;
        if (n && *line == ' ')
            line++, n--;
        if (self->has_data &&
            s_append (&self->data, &self->data_size, &self->data_capacity, "\n", 1))
            return -1;
        self->has_data = true;
        return s_append (&self->data, &self->data_size, &self->data_capacity, line, n);
    }
    if (n >= 6 && memcmp (line, "event:", 6) == 0) {
        line += 6, n -= 6;
        if (n && *line == ' ')
            line++, n--;
        snprintf (self->event, sizeof self->event, "%.*s", (int) n, line);
        return 0;
    }
    return 0; //  id:, retry: and ":" comments mean nothing here
}

int cli_sse_feed (cli_sse_t *self, const char *data, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        if (data[i] == '\n') {
            size_t n = self->line_size;
            if (n && self->line[n - 1] == '\r')
                n--;
            if (s_line (self, self->line, n))
                return -1;
            self->line_size = 0;
        } else if (s_append (&self->line, &self->line_size, &self->line_capacity, data + i, 1))
            return -1;
    }
    return 0;
}

void cli_sse_end (cli_sse_t *self)
{
    if (self->line_size) {
        s_line (self, self->line, self->line_size);
        self->line_size = 0;
    }
    s_dispatch (self);
}

static void s_collect (void *arg, const char *event, const char *data)
{
    char *both = zsys_sprintf ("%s=%s", event, data);
    zlist_append ((zlist_t *) arg, both); //  autofree: the list copies it
    free (both);
}

void cli_sse_test (bool verbose)
{
    (void) verbose;
    zlist_t *events = zlist_new ();
    zlist_autofree (events);
    cli_sse_t *sse = cli_sse_new (s_collect, events);
    const char *stream = ": comment\nevent: message\ndata: {\"a\":1}\n\n"
                         "event: message\r\ndata:{\"b\":\r\ndata: 2}\r\n\r\n"
                         "id: 3\n\nevent: stdout\ndata: last";
    //  One byte at a time: pieces may split anything.
    for (const char *p = stream; *p; p++)
        assert (cli_sse_feed (sse, p, 1) == 0);
    assert (zlist_size (events) == 2);
    cli_sse_end (sse);
    assert (zlist_size (events) == 3);
    assert (streq (zlist_first (events), "message={\"a\":1}"));
    assert (streq (zlist_next (events), "message={\"b\":\n2}"));
    assert (streq (zlist_next (events), "stdout=last"));
    cli_sse_destroy (&sse);
    zlist_destroy (&events);
}
