/*  sbx_ship_test - files shipped over real CURVE sockets on 127.0.0.1, into real
    directories: a 24 MiB random file and a sparse 64 MiB one arrive equal (the sparse
    one still sparse); refusals (unknown, expired and withdrawn tickets, paths not offered,
    symbolic links, a FIFO, a missing file) leave nothing; a server destroyed in the
    middle fails the fetch within its deadline; a hostile server scripted here (wrong
    offsets, oversized chunks, garbage, a wrong digest) fails it with nothing written;
    a hostile client does not stop the server from serving a good one; two fetches at
    once. Test runner only.
*/
#include "sbx_ship.h"
#include "sbx_secret.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MIB (1024 * 1024)

static char s_top[64]; //  the test's directory

//  What a fetch said.
typedef struct {
    int progress;         //  PROGRESS messages
    uint64_t done, total; //  the last one's
    bool backwards;       //  a PROGRESS whose done went down
    int result;           //  -1 until SBX_SHIP_DONE or SBX_SHIP_FAILED
    char *reason;
} s_outcome_t;

static void s_outcome_init (s_outcome_t *out)
{
    memset (out, 0, sizeof *out);
    out->result = -1;
}

static void s_take (sbx_ship_fetch_t *fetch, s_outcome_t *out)
{
    uint64_t done, total;
    char *reason = NULL;
    int event;
    while ((event = sbx_ship_fetch_recv (fetch, &done, &total, &reason)) >= 0) {
        assert (out->result < 0); //  nothing after the end
        if (event == SBX_SHIP_PROGRESS) {
            out->backwards |= out->progress && done < out->done;
            out->progress++;
            out->done = done;
            out->total = total;
        } else {
            out->result = event;
            out->reason = reason;
        }
    }
}

//  Until the fetch ends, or ms pass, or (until_done) it reports more than 0 bytes.
static void s_wait (sbx_ship_fetch_t *fetch, s_outcome_t *out, int ms, bool until_done)
{
    zpoller_t *poller = zpoller_new (sbx_ship_fetch_sock (fetch), NULL);
    int64_t deadline = zclock_mono () + ms;
    while (out->result < 0 && !(until_done && out->done > 0) && zclock_mono () < deadline)
        if (zpoller_wait (poller, (int) (deadline - zclock_mono ())))
            s_take (fetch, out);
    zpoller_destroy (&poller);
}

//  Fetches paths, waits for the end; the outcome's reason is the caller's to free.
static s_outcome_t s_fetch (const char *endpoint, const char *key, const char *ticket,
                            const char *const *paths, size_t count, const char *dest)
{
    sbx_ship_fetch_t *fetch = sbx_ship_fetch_new (endpoint, key, NULL, ticket, paths, count, dest);
    assert (fetch);
    s_outcome_t out;
    s_outcome_init (&out);
    s_wait (fetch, &out, 15000, false);
    assert (out.result >= 0);
    sbx_ship_fetch_destroy (&fetch);
    return out;
}

static void s_expect_failed (s_outcome_t *out, const char *words, bool verbose)
{
    if (verbose || out->result != SBX_SHIP_FAILED || !strstr (out->reason, words))
        printf ("\n   FAILED? %s (expected \"%s\")", out->reason ? out->reason : "-", words);
    assert (out->result == SBX_SHIP_FAILED);
    assert (strstr (out->reason, words));
    //  Fit for a log line.
    for (const char *c = out->reason; *c; c++)
        assert (*c >= 0x20 && *c < 0x7f);
    zstr_free (&out->reason);
}

static char *s_path (const char *a, const char *b)
{
    char *path = zsys_sprintf ("%s/%s", a, b);
    assert (path);
    return path;
}

static char *s_mkdir (const char *name)
{
    char *dir = s_path (s_top, name);
    assert (mkdir (dir, 0700) == 0);
    return dir;
}

static size_t s_entries (const char *dir)
{
    DIR *listing = opendir (dir);
    assert (listing);
    size_t count = 0;
    struct dirent *entry;
    while ((entry = readdir (listing)))
        count += strcmp (entry->d_name, ".") && strcmp (entry->d_name, "..");
    closedir (listing);
    return count;
}

static void s_write_at (const char *path, const void *data, size_t size, off_t offset)
{
    int fd = open (path, O_WRONLY | O_CREAT, 0644);
    assert (fd >= 0);
    assert (pwrite (fd, data, size, offset) == (ssize_t) size);
    close (fd);
}

static void s_random_file (const char *path, size_t size)
{
    uint8_t *data = malloc (S_MIB);
    assert (data);
    for (size_t at = 0; at < size; at += S_MIB) {
        assert (sbx_secret_random (data, S_MIB) == 0);
        s_write_at (path, data, size - at < S_MIB ? size - at : S_MIB, (off_t) at);
    }
    free (data);
}

static bool s_same (const char *a, const char *b)
{
    FILE *fa = fopen (a, "rb"), *fb = fopen (b, "rb");
    assert (fa && fb);
    char *ba = malloc (S_MIB), *bb = malloc (S_MIB);
    assert (ba && bb);
    bool same = true;
    while (same) {
        size_t na = fread (ba, 1, S_MIB, fa), nb = fread (bb, 1, S_MIB, fb);
        same = na == nb && memcmp (ba, bb, na) == 0;
        if (na == 0)
            break;
    }
    free (ba);
    free (bb);
    fclose (fa);
    fclose (fb);
    return same;
}

static char *s_ticket (void)
{
    char *ticket = sbx_secret_token ("shp_", 43);
    assert (ticket);
    return ticket;
}

//  --------------------------------------------------------------------------
//  A hostile server: a ROUTER that answers as told.

typedef enum {
    S_BAD_OFFSET,  //  the chunk after the one asked for
    S_OVERSIZED,   //  a byte more than asked
    S_HUGE_FRAME,  //  a frame over the fetch's limit: the connection drops
    S_GARBAGE,     //  random frames for a SIZE
    S_HUGE_SIZE,   //  a file of 2^62 bytes
    S_BAD_DIGEST,  //  every byte right, the digest wrong
    S_NASTY_ERROR, //  an ERROR of 10 KB with control characters
    S_UNASKED,     //  answers nobody asked for
} s_mode_t;

#define S_HOSTILE_SIZE 1000

static void s_hostile_answer (zsock_t *router, s_mode_t mode, zmsg_t *request)
{
    zframe_t *id = zmsg_pop (request);
    char *proto = zmsg_popstr (request), *command = zmsg_popstr (request);
    assert (id && proto && command && streq (proto, "SHIP1"));
    zmsg_t *answer = zmsg_new ();
    uint8_t size_be[8] = {0}, offset_be[8];
    size_be[6] = S_HOSTILE_SIZE >> 8, size_be[7] = S_HOSTILE_SIZE & 255;
    if (mode == S_HUGE_SIZE)
        size_be[0] = 0x40;
    static uint8_t content[S_HOSTILE_SIZE + 1];
    if (mode == S_NASTY_ERROR) {
        char *text = malloc (10000);
        assert (text);
        memset (text, 'x', 9999);
        text[9999] = 0;
        memcpy (text, "line\none\r\x1b[31m", 14);
        zmsg_addstr (answer, "ERROR");
        zmsg_addstr (answer, text);
        free (text);
    } else if (streq (command, "STAT") && mode == S_GARBAGE) {
        for (int i = 0; i < 5; i++) {
            uint8_t junk[13];
            sbx_secret_random (junk, sizeof junk);
            zmsg_addmem (answer, junk, sizeof junk);
        }
    } else if (streq (command, "STAT") || streq (command, "OPEN")) {
        zmsg_addstr (answer, streq (command, "STAT") ? "SIZE" : "OPENED");
        zmsg_addmem (answer, size_be, 8);
        if (mode == S_UNASKED) {
            //  Three more answers right away: the fetch asked for one.
            for (int i = 0; i < 3; i++) {
                zmsg_t *more = zmsg_dup (answer);
                zframe_t *to = zframe_dup (id);
                zmsg_prepend (more, &to);
                zmsg_send (&more, router);
            }
        }
    } else if (streq (command, "READ")) {
        zframe_t *offset = zmsg_pop (request);
        assert (offset && zframe_size (offset) == 8);
        memcpy (offset_be, zframe_data (offset), 8);
        zframe_destroy (&offset);
        if (mode == S_BAD_OFFSET)
            offset_be[5] += 4; //  a chunk later
        zmsg_addstr (answer, "DATA");
        zmsg_addmem (answer, offset_be, 8);
        if (mode == S_HUGE_FRAME) {
            uint8_t *huge = calloc (1, 4 * S_MIB);
            assert (huge);
            zmsg_addmem (answer, huge, 4 * S_MIB);
            free (huge);
        } else
            zmsg_addmem (answer, content, S_HOSTILE_SIZE + (mode == S_OVERSIZED));
    } else if (streq (command, "CLOSE")) {
        zmsg_addstr (answer, "CLOSED");
        char digest[65];
        sbx_secret_hash ("not the content", digest);
        zmsg_addstr (answer, digest);
    }
    zmsg_prepend (answer, &id);
    zmsg_send (&answer, router);
    free (proto);
    free (command);
}

static void s_hostile (zsock_t *router, const char *endpoint, const char *key, s_mode_t mode,
                       const char *words, bool verbose)
{
    char name[32];
    snprintf (name, sizeof name, "hostile%d", (int) mode);
    char *dest = s_mkdir (name);
    const char *paths[] = {"sub/file.bin"};
    sbx_ship_fetch_t *fetch = sbx_ship_fetch_new (
        endpoint, key, NULL, "hostile-ticket-hostile-ticket-hostile", paths, 1, dest);
    assert (fetch);
    sbx_ship_fetch_set_timeout (fetch, 1000);
    s_outcome_t out;
    s_outcome_init (&out);
    zpoller_t *poller = zpoller_new (router, sbx_ship_fetch_sock (fetch), NULL);
    int64_t deadline = zclock_mono () + 5000;
    while (out.result < 0 && zclock_mono () < deadline) {
        void *which = zpoller_wait (poller, (int) (deadline - zclock_mono ()));
        if (which == router) {
            zmsg_t *request = zmsg_recv (router);
            assert (request);
            s_hostile_answer (router, mode, request);
            zmsg_destroy (&request);
        } else if (which)
            s_take (fetch, &out);
    }
    zpoller_destroy (&poller);
    s_expect_failed (&out, words, verbose);
    //  Nothing in dest (no .part, no sub/), nothing beside it.
    assert (s_entries (dest) == 0);
    sbx_ship_fetch_destroy (&fetch);
    //  Late answers to the fetch's last requests, if any, go nowhere.
    zsock_set_rcvtimeo (router, 0);
    zmsg_t *late;
    while ((late = zmsg_recv (router)))
        zmsg_destroy (&late);
    zsock_set_rcvtimeo (router, -1);
    free (dest);
}

//  --------------------------------------------------------------------------
//  A hostile client: each request gets an ERROR, and the server goes on.

static void s_expect_error (zsock_t *client)
{
    zmsg_t *answer = zmsg_recv (client);
    assert (answer);
    char *command = zmsg_popstr (answer);
    assert (command && streq (command, "ERROR"));
    free (command);
    zmsg_destroy (&answer);
}

static void s_hostile_client (const char *endpoint, const char *key, const char *ticket)
{
    zcert_t *cert = zcert_new ();
    zsock_t *client = zsock_new (ZMQ_DEALER);
    assert (cert && client);
    zcert_apply (cert, client);
    zsock_set_curve_serverkey (client, key);
    zsock_set_rcvtimeo (client, 5000);
    assert (zsock_connect (client, "%s", endpoint) == 0);
    uint8_t junk[300];
    sbx_secret_random (junk, sizeof junk);
    uint8_t huge_offset[8] = {0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    uint8_t chunk_length[8] = {0, 0, 0, 0, 0, 0x04, 0, 0}; //  256 KiB
    uint8_t too_long[8] = {0, 0, 0, 0, 0, 0x04, 0, 1};
    uint8_t zero[8] = {0};

    zmsg_t *msg = zmsg_new ();
    zmsg_addmem (msg, junk, sizeof junk);
    zmsg_send (&msg, client);
    s_expect_error (client);
    zstr_sendx (client, "SHIP1", "READ", "x", "y", NULL);
    s_expect_error (client); //  no file open
    zstr_sendx (client, "SHIP1", "OPEN", "unknown-ticket-unknown-ticket-unknown", "vm/random.bin",
                NULL);
    s_expect_error (client);
    zstr_sendx (client, "SHIP1", "OPEN", ticket, "../outside.txt", NULL);
    s_expect_error (client);
    zstr_sendx (client, "SHIP1", "STAT", ticket, "/etc/passwd", NULL);
    s_expect_error (client);
    msg = zmsg_new ();
    zmsg_addstr (msg, "SHIP1");
    zmsg_addstr (msg, "STAT");
    zmsg_addstr (msg, ticket);
    zmsg_addmem (msg, "vm/random.bin\0/../../x", 22); //  a NUL inside
    zmsg_send (&msg, client);
    s_expect_error (client);
    msg = zmsg_new ();
    for (int i = 0; i < 1000; i++)
        zmsg_addstr (msg, "SHIP1");
    zmsg_send (&msg, client);
    s_expect_error (client);
    zstr_sendx (client, "SHIP1", "FROB", NULL);
    s_expect_error (client);
    //  A file opened properly, then read wrongly.
    zstr_sendx (client, "SHIP1", "OPEN", ticket, "vm/random.bin", NULL);
    msg = zmsg_recv (client);
    char *command = msg ? zmsg_popstr (msg) : NULL;
    assert (command && streq (command, "OPENED"));
    free (command);
    zmsg_destroy (&msg);
    uint8_t *pairs[][2] = {{huge_offset, chunk_length}, {zero, zero}, {zero, too_long}};
    for (size_t i = 0; i < 3; i++) {
        msg = zmsg_new ();
        zmsg_addstr (msg, "SHIP1");
        zmsg_addstr (msg, "READ");
        zmsg_addmem (msg, pairs[i][0], 8);
        zmsg_addmem (msg, pairs[i][1], 3 + 5 * (i != 1)); //  the second: a 3-byte frame
        zmsg_send (&msg, client);
        s_expect_error (client);
    }
    zstr_sendx (client, "SHIP1", "CLOSE", NULL);
    s_expect_error (client); //  not read whole
    //  Many clients at once, each refused.
    zsock_t *many[40];
    for (size_t i = 0; i < 40; i++) {
        many[i] = zsock_new (ZMQ_DEALER);
        assert (many[i]);
        zcert_apply (cert, many[i]);
        zsock_set_curve_serverkey (many[i], key);
        zsock_set_rcvtimeo (many[i], 5000);
        assert (zsock_connect (many[i], "%s", endpoint) == 0);
        zstr_sendx (many[i], "SHIP1", "OPEN", "unknown-ticket-unknown-ticket-unknown", "x", NULL);
    }
    for (size_t i = 0; i < 40; i++) {
        s_expect_error (many[i]);
        zsock_destroy (&many[i]);
    }
    //  Last, a frame over the server's limit: libzmq drops the connection.
    char *huge = calloc (1, S_MIB);
    assert (huge);
    msg = zmsg_new ();
    zmsg_addstr (msg, "SHIP1");
    zmsg_addmem (msg, huge, S_MIB);
    zmsg_send (&msg, client);
    free (huge);
    zsock_destroy (&client);
    zcert_destroy (&cert);
}

//  --------------------------------------------------------------------------

void sbx_ship_test (bool verbose)
{
    snprintf (s_top, sizeof s_top, "/tmp/sbx_ship_test.XXXXXX");
    assert (mkdtemp (s_top));
    char *root = s_mkdir ("src");
    char *vm = s_path (root, "vm");
    assert (mkdir (vm, 0700) == 0);
    char *random_bin = s_path (vm, "random.bin");
    char *sparse_img = s_path (vm, "sparse.img");
    s_random_file (random_bin, 24 * S_MIB);
    //  64 MiB with 1 MiB of data at 10 MiB, a few bytes at 40 MiB, a hole at the end.
    {
        int fd = open (sparse_img, O_WRONLY | O_CREAT, 0644);
        assert (fd >= 0 && ftruncate (fd, 64 * S_MIB) == 0);
        close (fd);
        uint8_t *data = malloc (S_MIB);
        assert (data && sbx_secret_random (data, S_MIB) == 0);
        s_write_at (sparse_img, data, S_MIB, 10 * S_MIB);
        s_write_at (sparse_img, data, 300, 40 * S_MIB + 123);
        free (data);
    }
    char *empty = s_path (root, "empty");
    s_write_at (empty, "", 0, 0);
    //  2 GiB of nothing, deep: a transfer that lasts long enough to be interrupted.
    char *deep = s_path (root, "deep");
    assert (mkdir (deep, 0700) == 0);
    char *deeper = s_path (deep, "er");
    assert (mkdir (deeper, 0700) == 0);
    char *big = s_path (deeper, "big.sparse");
    {
        int fd = open (big, O_WRONLY | O_CREAT, 0644);
        assert (fd >= 0 && ftruncate (fd, 2048LL * S_MIB) == 0);
        close (fd);
    }
    //  Outside root, and the ways toward it that must not work.
    char *outside = s_path (s_top, "outside.txt");
    s_write_at (outside, "secret", 6, 0);
    char *link = s_path (root, "link");
    assert (symlink (outside, link) == 0);
    char *linkdir = s_path (root, "linkdir");
    assert (symlink (s_top, linkdir) == 0);
    char *fifo = s_path (root, "fifo");
    assert (mkfifo (fifo, 0600) == 0);

    //  The shared context's ZAP handler admits no one: the server has its own.
    char *nobody = s_mkdir ("nobody");
    zactor_t *auth = zactor_new (zauth, NULL);
    assert (auth);
    zstr_sendx (auth, "CURVE", nobody, NULL);
    zsock_wait (auth);

    //  Arguments.
    assert (sbx_ship_path_valid ("a") && sbx_ship_path_valid ("vm/a.b") &&
            sbx_ship_path_valid ("..a/b.."));
    const char *bad_paths[] = {"", "/a", "..", "a/..", "a/../b", "a//b", "a/", "./a", "a\nb"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof *bad_paths; i++)
        assert (!sbx_ship_path_valid (bad_paths[i]));
    assert (!sbx_ship_path_valid (NULL));
    zcert_t *cert = zcert_new ();
    assert (cert);
    assert (!sbx_ship_server_new ("tcp://127.0.0.1:*", "/nonexistent/sbx", cert));
    assert (!sbx_ship_server_new ("nonsense://x", root, cert));
    sbx_ship_server_t *server = sbx_ship_server_new ("tcp://127.0.0.1:*", root, cert);
    assert (server);
    const char *endpoint = sbx_ship_server_endpoint (server);
    assert (strncmp (endpoint, "tcp://127.0.0.1:", 16) == 0 && atoi (endpoint + 16) > 0);
    const char *key = zcert_public_txt (cert);

    char *ticket = s_ticket ();
    const char *offered[] = {"vm/random.bin",       "vm/sparse.img", "empty",  "link",
                             "linkdir/outside.txt", "fifo",          "missing"};
    const char *dotdot[] = {"vm/random.bin", "../outside.txt"};
    const char *absolute[] = {"/etc/passwd"};
    assert (sbx_ship_server_offer (server, ticket, dotdot, 2, 60000) == -1);
    assert (sbx_ship_server_offer (server, ticket, absolute, 1, 60000) == -1);
    assert (sbx_ship_server_offer (server, "too-short", offered, 1, 60000) == -1);
    assert (sbx_ship_server_offer (server, ticket, offered, 0, 60000) == -1);
    assert (sbx_ship_server_offer (server, ticket, offered, 1, 0) == -1);
    assert (sbx_ship_server_offer (server, ticket, offered, 7, 60000) == 0);
    assert (sbx_ship_server_offer (server, ticket, offered, 7, 60000) == -1); //  twice
    char *dest = s_mkdir ("dest");
    assert (!sbx_ship_fetch_new (endpoint, key, NULL, ticket, dotdot, 2, dest));
    assert (!sbx_ship_fetch_new (endpoint, key, NULL, ticket, absolute, 1, dest));
    assert (!sbx_ship_fetch_new (endpoint, "short", NULL, ticket, offered, 1, dest));
    assert (!sbx_ship_fetch_new (endpoint, key, NULL, "too-short", offered, 1, dest));
    assert (!sbx_ship_fetch_new (endpoint, key, NULL, ticket, offered, 0, dest));

    //  24 MiB of random bytes, timed.
    int64_t start = zclock_mono ();
    s_outcome_t out = s_fetch (endpoint, key, ticket, offered, 1, dest);
    int64_t took = zclock_mono () - start;
    if (out.result != SBX_SHIP_DONE)
        fprintf (stderr, "\n   %s\n", out.reason);
    assert (out.result == SBX_SHIP_DONE);
    printf ("24 MiB in %" PRId64 " ms (%.0f MiB/s), ", took,
            24.0 * 1000 / (double) (took ? took : 1));
    fflush (stdout);
    assert (out.progress >= 2 && !out.backwards);
    assert (out.done == 24 * S_MIB && out.total == 24 * S_MIB);
    char *got_random = s_path (dest, "vm/random.bin");
    assert (s_same (random_bin, got_random));
    struct stat st;
    assert (stat (got_random, &st) == 0 && (st.st_mode & 0777) == 0600);
    //  The sparse file (and an empty one): equal, and still sparse.
    out = s_fetch (endpoint, key, ticket, offered + 1, 2, dest);
    assert (out.result == SBX_SHIP_DONE && out.done == 64 * S_MIB && out.total == 64 * S_MIB);
    char *got_sparse = s_path (dest, "vm/sparse.img");
    assert (s_same (sparse_img, got_sparse));
    assert (stat (got_sparse, &st) == 0 && st.st_size == 64 * S_MIB);
    if (verbose)
        printf ("\n   sparse: %lld bytes allocated", (long long) st.st_blocks * 512);
    assert (st.st_blocks * 512 < 8 * S_MIB);
    char *got_empty = s_path (dest, "empty");
    assert (stat (got_empty, &st) == 0 && st.st_size == 0);
    char *got_vm = s_path (dest, "vm");
    assert (s_entries (dest) == 2 && s_entries (got_vm) == 2); //  no .part left

    //  Refusals leave nothing.
    char *refused = s_mkdir ("refused");
    char *unknown = s_ticket ();
    out = s_fetch (endpoint, key, unknown, offered, 1, refused);
    s_expect_failed (&out, "ticket unknown, expired or withdrawn", verbose);
    char *expiring = s_ticket ();
    assert (sbx_ship_server_offer (server, expiring, offered, 1, 1) == 0);
    zclock_sleep (20); //  let its 1 ms pass
    out = s_fetch (endpoint, key, expiring, offered, 1, refused);
    s_expect_failed (&out, "ticket unknown, expired or withdrawn", verbose);
    const char *not_offered[] = {"vm/random.bin", "deep/er/big.sparse"};
    out = s_fetch (endpoint, key, ticket, not_offered, 2, refused);
    s_expect_failed (&out, "deep/er/big.sparse is not offered", verbose);
    out = s_fetch (endpoint, key, ticket, offered + 3, 1, refused);
    s_expect_failed (&out, "symbolic link", verbose);
    out = s_fetch (endpoint, key, ticket, offered + 4, 1, refused);
    s_expect_failed (&out, "symbolic link", verbose);
    out = s_fetch (endpoint, key, ticket, offered + 5, 1, refused);
    s_expect_failed (&out, "not a regular file", verbose);
    out = s_fetch (endpoint, key, ticket, offered + 6, 1, refused);
    s_expect_failed (&out, "No such file", verbose);
    char *nowhere = s_path (s_top, "nowhere");
    out = s_fetch (endpoint, key, ticket, offered, 1, nowhere);
    s_expect_failed (&out, "cannot open", verbose);
    out = s_fetch ("nonsense", key, ticket, offered, 1, refused);
    s_expect_failed (&out, "cannot connect to nonsense", verbose);
    //  Writes that fail, as on a full disk: past 1 MiB, EFBIG.
    struct rlimit limit;
    assert (getrlimit (RLIMIT_FSIZE, &limit) == 0);
    rlim_t soft = limit.rlim_cur;
    limit.rlim_cur = S_MIB;
    signal (SIGXFSZ, SIG_IGN);
    assert (setrlimit (RLIMIT_FSIZE, &limit) == 0);
    out = s_fetch (endpoint, key, ticket, offered, 1, refused);
    limit.rlim_cur = soft;
    assert (setrlimit (RLIMIT_FSIZE, &limit) == 0);
    signal (SIGXFSZ, SIG_DFL);
    s_expect_failed (&out, "cannot write", verbose);
    assert (s_entries (refused) == 0);

    //  A ticket withdrawn in the middle: the fetch fails, its files and directories go.
    char *withdrawn = s_ticket ();
    const char *deep_path[] = {"deep/er/big.sparse"};
    assert (sbx_ship_server_offer (server, withdrawn, deep_path, 1, 60000) == 0);
    sbx_ship_fetch_t *fetch =
        sbx_ship_fetch_new (endpoint, key, NULL, withdrawn, deep_path, 1, refused);
    assert (fetch);
    s_outcome_init (&out);
    s_wait (fetch, &out, 10000, true);
    assert (out.result < 0 && out.done > 0 && out.done < out.total);
    assert (sbx_ship_server_withdraw (server, withdrawn) == 0);
    assert (sbx_ship_server_withdraw (server, withdrawn) == -1);
    s_wait (fetch, &out, 5000, false);
    s_expect_failed (&out, "withdrawn", verbose);
    sbx_ship_fetch_destroy (&fetch);
    assert (s_entries (refused) == 0);

    //  Destroyed in the middle, cancels: nothing left either.
    assert (sbx_ship_server_offer (server, withdrawn, deep_path, 1, 60000) == 0);
    fetch = sbx_ship_fetch_new (endpoint, key, NULL, withdrawn, deep_path, 1, refused);
    s_outcome_init (&out);
    s_wait (fetch, &out, 10000, true);
    assert (out.result < 0 && out.done > 0);
    sbx_ship_fetch_destroy (&fetch);
    assert (s_entries (refused) == 0);

    //  A hostile client, then a good one is served.
    s_hostile_client (endpoint, key, ticket);
    char *after = s_mkdir ("after");
    out = s_fetch (endpoint, key, ticket, offered, 1, after);
    assert (out.result == SBX_SHIP_DONE);

    //  Two at once.
    char *one = s_mkdir ("one"), *two = s_mkdir ("two");
    sbx_ship_fetch_t *first = sbx_ship_fetch_new (endpoint, key, NULL, ticket, offered, 1, one);
    sbx_ship_fetch_t *second =
        sbx_ship_fetch_new (endpoint, key, NULL, ticket, offered + 1, 1, two);
    assert (first && second);
    s_outcome_t out1, out2;
    s_outcome_init (&out1);
    s_outcome_init (&out2);
    zpoller_t *poller =
        zpoller_new (sbx_ship_fetch_sock (first), sbx_ship_fetch_sock (second), NULL);
    int64_t deadline = zclock_mono () + 15000;
    while ((out1.result < 0 || out2.result < 0) && zclock_mono () < deadline) {
        void *which = zpoller_wait (poller, (int) (deadline - zclock_mono ()));
        if (which == sbx_ship_fetch_sock (first))
            s_take (first, &out1);
        else if (which)
            s_take (second, &out2);
    }
    zpoller_destroy (&poller);
    assert (out1.result == SBX_SHIP_DONE && out2.result == SBX_SHIP_DONE);
    sbx_ship_fetch_destroy (&first);
    sbx_ship_fetch_destroy (&second);
    char *one_random = s_path (one, "vm/random.bin"), *two_sparse = s_path (two, "vm/sparse.img");
    assert (s_same (random_bin, one_random) && s_same (sparse_img, two_sparse));

    //  The server destroyed in the middle: FAILED within the fetch's deadline.
    fetch = sbx_ship_fetch_new (endpoint, key, NULL, withdrawn, deep_path, 1, refused);
    sbx_ship_fetch_set_timeout (fetch, 1000);
    s_outcome_init (&out);
    s_wait (fetch, &out, 10000, true);
    assert (out.result < 0 && out.done > 0);
    sbx_ship_server_destroy (&server);
    sbx_ship_server_destroy (&server);
    int64_t gone = zclock_mono ();
    s_wait (fetch, &out, 5000, false);
    if (verbose)
        printf ("\n   failed %" PRId64 " ms after the server went", zclock_mono () - gone);
    assert (zclock_mono () - gone < 3000);
    s_expect_failed (&out, "no answer from", verbose);
    sbx_ship_fetch_destroy (&fetch);
    assert (s_entries (refused) == 0);

    //  A hostile server; the shared context's ZAP handler admits it now.
    zstr_sendx (auth, "CURVE", CURVE_ALLOW_ANY, NULL);
    zsock_wait (auth);
    zcert_t *hostile_cert = zcert_new ();
    zsock_t *router = zsock_new (ZMQ_ROUTER);
    assert (hostile_cert && router);
    zcert_apply (hostile_cert, router);
    zsock_set_curve_server (router, 1);
    zsock_set_zap_domain (router, "test");
    int port = zsock_bind (router, "tcp://127.0.0.1:*");
    assert (port > 0);
    char hostile_endpoint[64];
    snprintf (hostile_endpoint, sizeof hostile_endpoint, "tcp://127.0.0.1:%d", port);
    const char *hostile_key = zcert_public_txt (hostile_cert);
    s_hostile (router, hostile_endpoint, hostile_key, S_BAD_OFFSET, "where 1000 were due at 0",
               verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_OVERSIZED, "sent 1001 bytes", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_HUGE_FRAME, "no answer from", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_GARBAGE, "malformed", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_HUGE_SIZE, "more than", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_BAD_DIGEST, "checksum mismatch", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_NASTY_ERROR,
               "refused sub/file.bin: line?one?", verbose);
    s_hostile (router, hostile_endpoint, hostile_key, S_UNASKED, "unexpected answer", verbose);
    //  Nothing landed beside the destinations.
    assert (s_entries (s_top) == 16);
    zsock_destroy (&router);
    zcert_destroy (&hostile_cert);
    zactor_destroy (&auth);
    zcert_destroy (&cert);

    char *cleanup = zsys_sprintf ("rm -rf '%s'", s_top);
    assert (cleanup && system (cleanup) == 0);
    zstr_free (&cleanup);
    char *names[] = {root,   vm,      random_bin, sparse_img, empty,      deep,
                     deeper, big,     outside,    link,       linkdir,    fifo,
                     nobody, ticket,  dest,       got_random, got_sparse, got_empty,
                     got_vm, refused, unknown,    expiring,   nowhere,    withdrawn,
                     after,  one,     two,        one_random, two_sparse};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        free (names[i]);
}
