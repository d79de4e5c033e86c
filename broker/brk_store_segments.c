/*  brk_store_segments - the event log's sealed segments (see brk_store.h).

    A segment is dir/events-<first>-<last>.db: one table, events, with the live table's
    columns, written once by attaching it to the broker's connection and copying rows
    into it, a chunk per step; it is named .part until every row is there and synced,
    then renamed. Only after that are its rows deleted from the live table, a chunk per
    transaction. Reads attach it for a batch and detach it before handing rows out, so
    the callback runs with nothing attached, as for the live table.

    A crash at any point loses nothing: a .part file is dropped at open and made again;
    a segment whose rows are still (partly) in the live table is read from the segment
    (its range wins) while open finishes deleting them.
*/
#include "brk_store_priv.h"
#include "sbx_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

//  Events handed out per attach, and rows looked at per attach (a type prefix skips some).
#define S_READ_BATCH 1000
#define S_READ_STEP  4000

static void s_seg_path (brk_store_t *self, uint64_t first, uint64_t last, bool part, char *out,
                        size_t size)
{
    snprintf (out, size, "%s/events-%020" PRIu64 "-%020" PRIu64 ".db%s", self->seg_dir, first, last,
              part ? ".part" : "");
}

//  Runs SQL made with sqlite3_vmprintf (%Q quotes a path; so no printf format check).
static int s_exec (brk_store_t *self, const char *what, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    char *sql = sqlite3_vmprintf (format, args);
    va_end (args);
    int rc = sql ? sbx_db_exec (self->db, sql, what) : -1;
    sqlite3_free (sql);
    return rc;
}

static int s_attach (brk_store_t *self, const char *path, const char *as)
{
    if (sbx_db_in_transaction (self->db)) {
        sbx_warn ("store %s: an event segment cannot be read inside a transaction",
                  sbx_db_path (self->db));
        return -1;
    }
    return s_exec (self, "attach segment", "ATTACH %Q AS %s", path, as);
}

static void s_detach (brk_store_t *self, const char *as)
{
    s_exec (self, "detach segment", "DETACH %s", as);
}

static int s_add (brk_store_t *self, uint64_t first, uint64_t last)
{
    if (self->seg_count == self->seg_max) {
        size_t max = self->seg_max ? self->seg_max * 2 : 16;
        brk_segment_t *segs = realloc (self->segs, max * sizeof *segs);
        if (!segs)
            return -1;
        self->segs = segs;
        self->seg_max = max;
    }
    self->segs[self->seg_count++] = (brk_segment_t){first, last};
    return 0;
}

static int s_seg_cmp (const void *a, const void *b)
{
    const brk_segment_t *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

static uint64_t s_query_u64 (brk_store_t *self, const char *sql)
{
    int64_t v = sbx_db_query_int (self->db, sql, "event segments");
    return v > 0 ? (uint64_t) v : 0;
}

//  The live table's first event (0 when it has none).
static uint64_t s_live_first (brk_store_t *self)
{
    return s_query_u64 (self, "SELECT coalesce (min (seq), 0) FROM main.events");
}

int brk_store_segments_open (brk_store_t *self, const char *dir, uint64_t segment_size)
{
    if (!self || !dir)
        return -1;
    brk_store_segments_close (self);
    if (mkdir (dir, 0700) && errno != EEXIST) {
        sbx_error ("event segments: cannot make %s: %s", dir, strerror (errno));
        return -1;
    }
    DIR *d = opendir (dir);
    if (!d) {
        sbx_error ("event segments: cannot read %s: %s", dir, strerror (errno));
        return -1;
    }
    self->seg_dir = strdup (dir);
    self->seg_size = segment_size;
    struct dirent *entry;
    while ((entry = readdir (d))) {
        uint64_t first, last;
        char tail[16] = "";
        if (sscanf (entry->d_name, "events-%20" SCNu64 "-%20" SCNu64 ".db%15s", &first, &last,
                    tail) < 2)
            continue;
        if (strcmp (tail, ".part") == 0) {
            //  Half written when the broker stopped: made again from the live table.
            char path[PATH_MAX];
            snprintf (path, sizeof path, "%s/%s", dir, entry->d_name);
            unlink (path);
            continue;
        }
        if (*tail || first == 0 || last < first || s_add (self, first, last))
            continue;
    }
    closedir (d);
    if (self->seg_count)
        qsort (self->segs, self->seg_count, sizeof *self->segs, s_seg_cmp);
    for (size_t i = 1; i < self->seg_count; i++)
        if (self->segs[i].first != self->segs[i - 1].last + 1)
            sbx_warn ("event segments: events %" PRIu64 "-%" PRIu64 " are missing from %s",
                      self->segs[i - 1].last + 1, self->segs[i].first - 1, dir);
    //  A move the broker did not finish: the newest segment's rows still live.
    if (self->seg_count) {
        brk_segment_t *newest = &self->segs[self->seg_count - 1];
        uint64_t live = s_live_first (self);
        if (live && live <= newest->last) {
            self->seal_phase = 2;
            self->seal_first = newest->first;
            self->seal_last = newest->last;
            self->seal_done = live - 1;
        }
    }
    return 0;
}

void brk_store_segments_close (brk_store_t *self)
{
    free (self->seg_dir);
    self->seg_dir = NULL;
    free (self->segs);
    self->segs = NULL;
    self->seg_count = self->seg_max = 0;
    self->seal_phase = 0;
}

size_t brk_store_segments_count (brk_store_t *self, uint64_t *events_p)
{
    uint64_t events = 0;
    for (size_t i = 0; self && i < self->seg_count; i++)
        events += self->segs[i].last - self->segs[i].first + 1;
    if (events_p)
        *events_p = events;
    return self ? self->seg_count : 0;
}

//  Syncs a file's data, then its directory's entry (after a rename).
static int s_sync (const char *path, const char *dir)
{
    int rc = -1;
    int fd = open (path, O_RDONLY);
    if (fd >= 0) {
        rc = fsync (fd);
        close (fd);
    }
    fd = open (dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        if (fsync (fd))
            rc = -1;
        close (fd);
    }
    return rc;
}

//  Copies the next chunk into the .part file; at the end checks it holds the whole
//  range, syncs it and gives it its name.
static int s_copy (brk_store_t *self, size_t chunk)
{
    char part[PATH_MAX];
    s_seg_path (self, self->seal_first, self->seal_last, true, part, sizeof part);
    if (self->seal_done + 1 == self->seal_first) {
        //  Made here, empty (SQLite's empty database), private: the broker's connection
        //  opens files without creating them.
        unlink (part);
        int fd = open (part, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            sbx_error ("event segments: cannot make %s: %s", part, strerror (errno));
            return -1;
        }
        close (fd);
    }
    if (s_attach (self, part, "seal"))
        return -1;
    uint64_t to =
        self->seal_done + chunk < self->seal_last ? self->seal_done + chunk : self->seal_last;
    //  Written once and synced before it is named: no journal needed.
    int rc = s_exec (self, "copy events",
                     "PRAGMA seal.journal_mode = OFF; PRAGMA seal.synchronous = OFF;"
                     "CREATE TABLE IF NOT EXISTS seal.events (seq INTEGER PRIMARY KEY, "
                     "ts_ms INTEGER NOT NULL, type TEXT NOT NULL, account TEXT, subject TEXT, "
                     "payload BLOB);"
                     "INSERT INTO seal.events SELECT seq, ts_ms, type, account, subject, payload "
                     "FROM main.events WHERE seq > %" PRIu64 " AND seq <= %" PRIu64 ";",
                     self->seal_done, to);
    uint64_t count = 0, min = 0, max = 0;
    if (rc == 0 && to == self->seal_last) {
        count = s_query_u64 (self, "SELECT count(*) FROM seal.events");
        min = s_query_u64 (self, "SELECT coalesce (min (seq), 0) FROM seal.events");
        max = s_query_u64 (self, "SELECT coalesce (max (seq), 0) FROM seal.events");
    }
    s_detach (self, "seal");
    if (rc)
        return -1;
    self->seal_done = to;
    if (to < self->seal_last)
        return 0;
    uint64_t want = self->seal_last - self->seal_first + 1;
    if (count != want || min != self->seal_first || max != self->seal_last) {
        sbx_error ("event segments: %s holds %" PRIu64 " events (%" PRIu64 "-%" PRIu64
                   "), not %" PRIu64 ": made again",
                   part, count, min, max, want);
        return -1;
    }
    char path[PATH_MAX];
    s_seg_path (self, self->seal_first, self->seal_last, false, path, sizeof path);
    if (s_sync (part, self->seg_dir) || rename (part, path) || s_sync (path, self->seg_dir)) {
        sbx_error ("event segments: cannot seal %s: %s", path, strerror (errno));
        return -1;
    }
    if (s_add (self, self->seal_first, self->seal_last))
        return -1;
    struct stat st;
    sbx_info ("events %" PRIu64 "-%" PRIu64 " sealed into %s (%.1f MiB); deleting them from "
              "the live table",
              self->seal_first, self->seal_last, path,
              stat (path, &st) == 0 ? st.st_size / 1048576.0 : 0.0);
    self->seal_phase = 2;
    self->seal_done = self->seal_first - 1;
    return 0;
}

//  Deletes the next chunk of a sealed segment's rows from the live table.
static int s_delete (brk_store_t *self, size_t chunk)
{
    uint64_t to =
        self->seal_done + chunk < self->seal_last ? self->seal_done + chunk : self->seal_last;
    if (sbx_db_begin (self->db))
        return -1;
    if (s_exec (self, "delete sealed events",
                "DELETE FROM main.events WHERE seq > %" PRIu64 " AND seq <= %" PRIu64,
                self->seal_done, to) ||
        sbx_db_commit (self->db)) {
        if (sbx_db_in_transaction (self->db))
            sbx_db_rollback (self->db);
        return -1;
    }
    self->seal_done = to;
    if (to == self->seal_last) {
        sbx_info ("events %" PRIu64 "-%" PRIu64 " now only in their segment", self->seal_first,
                  self->seal_last);
        self->seal_phase = 0;
    }
    return 0;
}

int brk_store_segments_step (brk_store_t *self, size_t chunk)
{
    if (!self || !self->seg_dir || chunk == 0 || sbx_db_in_transaction (self->db))
        return self && self->seg_dir ? 1 : 0;
    if (self->seal_phase == 0) {
        uint64_t first = s_live_first (self);
        uint64_t last = brk_store_last_seq (self);
        if (!self->seg_size || !first || last - first + 1 < 2 * self->seg_size)
            return 0;
        self->seal_phase = 1;
        self->seal_first = first;
        self->seal_last = first + self->seg_size - 1;
        self->seal_done = first - 1;
    }
    int rc = self->seal_phase == 1 ? s_copy (self, chunk) : s_delete (self, chunk);
    if (rc && self->seal_phase == 1)
        self->seal_phase = 0; //  the next step starts the segment again
    return rc ? -1 : 1;
}

//  One event read from a segment, its strings copied (the segment is detached before
//  rows are handed out).
typedef struct {
    brk_event_row_t row;
    char *type, *account, *subject;
    void *payload;
} s_copy_row_t;

static void s_rows_free (s_copy_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free (rows[i].type);
        free (rows[i].account);
        free (rows[i].subject);
        free (rows[i].payload);
    }
}

static char *s_dup_text (sqlite3_stmt *stmt, int col)
{
    const char *text = (const char *) sqlite3_column_text (stmt, col);
    return text ? strdup (text) : NULL;
}

//  Reads up to `want` events after `after` from one segment into rows; *scanned_p is the
//  last seq looked at (rows of another type count as looked at), 0 if none.
static int s_read (brk_store_t *self, const brk_segment_t *seg, uint64_t after, size_t want,
                   const char *prefix, s_copy_row_t *rows, size_t *n_p, uint64_t *scanned_p)
{
    char path[PATH_MAX];
    s_seg_path (self, seg->first, seg->last, false, path, sizeof path);
    *n_p = 0;
    *scanned_p = 0;
    if (s_attach (self, path, "seg"))
        return -1;
    sqlite3_stmt *stmt = NULL;
    //  Read whole rows by seq; the type is matched here so a batch ends where it read.
    int rc = sqlite3_prepare_v2 (sbx_db_handle (self->db),
                                 "SELECT seq, ts_ms, type, account, subject, payload FROM "
                                 "seg.events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                                 -1, &stmt, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64 (stmt, 1, (sqlite3_int64) after);
        sqlite3_bind_int64 (stmt, 2, S_READ_STEP);
        size_t prefix_len = prefix ? strlen (prefix) : 0;
        size_t stepped = 0;
        while (*n_p < want && (rc = sqlite3_step (stmt)) == SQLITE_ROW) {
            uint64_t seq = (uint64_t) sqlite3_column_int64 (stmt, 0);
            *scanned_p = seq;
            stepped++;
            const char *type = (const char *) sqlite3_column_text (stmt, 2);
            if (!type || (prefix_len && strncmp (type, prefix, prefix_len)))
                continue;
            s_copy_row_t *r = &rows[*n_p];
            memset (r, 0, sizeof *r);
            size_t size = (size_t) sqlite3_column_bytes (stmt, 5);
            const void *blob = sqlite3_column_blob (stmt, 5);
            r->type = strdup (type);
            r->account = s_dup_text (stmt, 3);
            r->subject = s_dup_text (stmt, 4);
            r->payload = size ? malloc (size) : NULL;
            if (!r->type || (size && !r->payload)) {
                s_rows_free (r, 1);
                rc = SQLITE_NOMEM;
                break;
            }
            if (size)
                memcpy (r->payload, blob, size);
            r->row = (brk_event_row_t){.seq = seq,
                                       .ts_ms = (uint64_t) sqlite3_column_int64 (stmt, 1),
                                       .type = r->type,
                                       .account = r->account,
                                       .subject = r->subject,
                                       .payload = r->payload,
                                       .payload_size = size};
            (*n_p)++;
        }
        //  Fewer rows than the statement's limit: the segment is read to its end.
        if (rc == SQLITE_DONE && stepped < S_READ_STEP)
            *scanned_p = seg->last;
        else if (rc == SQLITE_ROW || rc == SQLITE_DONE)
            rc = SQLITE_DONE;
    }
    if (rc != SQLITE_DONE)
        sbx_error ("event segments: cannot read %s: %s", path,
                   sqlite3_errmsg (sbx_db_handle (self->db)));
    sqlite3_finalize (stmt);
    s_detach (self, "seg");
    if (rc != SQLITE_DONE) {
        s_rows_free (rows, *n_p);
        *n_p = 0;
        return -1;
    }
    return 0;
}

int brk_store_segments_after (brk_store_t *self, uint64_t *after_seq, size_t limit,
                              const char *type_prefix, brk_store_event_fn *fn, void *arg)
{
    if (!self->seg_count || *after_seq >= self->segs[self->seg_count - 1].last)
        return 0;
    s_copy_row_t *rows = malloc (S_READ_BATCH * sizeof *rows);
    if (!rows)
        return -1;
    int count = 0;
    for (size_t i = 0; i < self->seg_count && (size_t) count < limit; i++) {
        const brk_segment_t *seg = &self->segs[i];
        while (*after_seq < seg->last && (size_t) count < limit) {
            size_t want =
                limit - (size_t) count < S_READ_BATCH ? limit - (size_t) count : S_READ_BATCH;
            size_t n;
            uint64_t scanned;
            if (s_read (self, seg, *after_seq, want, type_prefix, rows, &n, &scanned)) {
                free (rows);
                return -1;
            }
            for (size_t k = 0; k < n; k++)
                fn (&rows[k].row, arg);
            s_rows_free (rows, n);
            count += (int) n;
            //  Past what was looked at (the whole segment when it was read to its end).
            *after_seq = scanned ? scanned : seg->last;
        }
    }
    free (rows);
    return count;
}
