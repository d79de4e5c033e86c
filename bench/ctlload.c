/*  ctlload - drives the real broker with sandbox requests, many in flight, and times them
    (bench/scale.py, issue 21).

    It speaks the broker's own protocol on its socket (a DEALER, the generated codec), as
    the gateway does for an authenticated caller: each request names the account it acts
    for. K requests stay in flight; each one's latency is kept and the summary is one
    JSON line on stdout:
        {"op", "n", "errors", "seconds", "per_s", "p50_ms", "p99_ms", "max_ms", "error"}

    usage: ctlload ENDPOINT OP COUNT INFLIGHT FILE [OUT]
      create  FILE: account ids, one per line (round robin); OUT gets "account id" lines
      get     FILE: "account id" lines (round robin)
      list    FILE: account ids (round robin); the first page (CTLLOAD_LIMIT, default 100)
      cycle   FILE: "account id" lines; each of COUNT is a stop then a resume
*/
#include "sbx_common.h"

#include <time.h>

typedef struct {
    char *account;
    char *id;
} s_row_t;

typedef struct {
    uint64_t rid;
    double started;
    size_t row;
    int step; //  cycle: 0 stop, 1 resume
} s_slot_t;

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static size_t s_load (const char *path, s_row_t **rows_p)
{
    FILE *f = fopen (path, "r");
    if (!f)
        return 0;
    size_t n = 0, max = 0;
    s_row_t *rows = NULL;
    char line[256];
    while (fgets (line, sizeof line, f)) {
        line[strcspn (line, "\r\n")] = 0;
        if (!*line)
            continue;
        if (n == max) {
            max = max ? max * 2 : 1024;
            rows = realloc (rows, max * sizeof *rows);
        }
        char *space = strchr (line, ' ');
        if (space)
            *space = 0;
        rows[n].account = strdup (line);
        rows[n].id = space ? strdup (space + 1) : NULL;
        n++;
    }
    fclose (f);
    *rows_p = rows;
    return n;
}

static uint64_t s_limit = 100;

static sbx_msg_t *s_request (const char *op, s_row_t *row, int step)
{
    sbx_msg_t *msg;
    if (streq (op, "create")) {
        msg = sbx_msg_new (SBX_MSG_SANDBOX_CREATE);
        sbx_msg_sandbox_create (msg)->ttl_s = 86400;
    } else if (streq (op, "get")) {
        msg = sbx_msg_new (SBX_MSG_SANDBOX_GET);
        sbx_str_set (&sbx_msg_sandbox_get (msg)->sandbox_id, row->id);
    } else if (streq (op, "list")) {
        msg = sbx_msg_new (SBX_MSG_SANDBOX_LIST);
        sbx_msg_sandbox_list (msg)->limit = s_limit;
    } else if (step == 0) {
        msg = sbx_msg_new (SBX_MSG_SANDBOX_STOP);
        sbx_str_set (&sbx_msg_sandbox_stop (msg)->sandbox_id, row->id);
    } else {
        msg = sbx_msg_new (SBX_MSG_SANDBOX_RESUME);
        sbx_str_set (&sbx_msg_sandbox_resume (msg)->sandbox_id, row->id);
    }
    msg->caller = calloc (1, sizeof *msg->caller);
    msg->caller->kind = SBX_CALLER_KIND_API_KEY;
    sbx_str_set (&msg->caller->account_id, row->account);
    sbx_str_set (&msg->caller->key_id, "key_bench");
    msg->timeout_ms = 60000;
    return msg;
}

//  Sends slot `index`'s next request (its row, its step) and remembers its rid.
//  Returns 0, or -1 when it could not be encoded.
static int s_send (zsock_t *sock, zhashx_t *pending, const char *op, s_row_t *rows, s_slot_t *slots,
                   size_t index, uint64_t rid)
{
    s_slot_t *slot = &slots[index];
    slot->rid = rid;
    slot->started = s_now ();
    sbx_msg_t *msg = s_request (op, &rows[slot->row], slot->step);
    msg->rid = rid;
    uint8_t *data;
    size_t size;
    sbx_err_t err;
    int rc = sbx_msg_encode (msg, &data, &size, &err);
    sbx_msg_destroy (&msg);
    if (rc)
        return -1;
    zframe_t *frame = zframe_new (data, size);
    free (data);
    zframe_send (&frame, sock, 0);
    char key[24];
    snprintf (key, sizeof key, "%llu", (unsigned long long) rid);
    zhashx_insert (pending, key, (void *) (uintptr_t) (index + 1));
    return 0;
}

int main (int argc, char **argv)
{
    if (argc < 6 || streq (argv[1], "--help")) {
        fprintf (stderr, "usage: ctlload ENDPOINT create|get|list|cycle COUNT INFLIGHT FILE [OUT]\n"
                         "(bench/scale.py; see the comment at the top of bench/ctlload.c)\n");
        return 2;
    }
    const char *endpoint = argv[1], *op = argv[2];
    if (getenv ("CTLLOAD_LIMIT"))
        s_limit = strtoull (getenv ("CTLLOAD_LIMIT"), NULL, 10);
    size_t count = strtoul (argv[3], NULL, 10), inflight = strtoul (argv[4], NULL, 10);
    s_row_t *rows = NULL;
    size_t nrows = s_load (argv[5], &rows);
    FILE *out = argc > 6 ? fopen (argv[6], "w") : NULL;
    if (!nrows || !inflight || (argc > 6 && !out)) {
        fprintf (stderr, "ctlload: nothing in %s (or bad INFLIGHT, or OUT not writable)\n",
                 argv[5]);
        return 2;
    }
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    zsock_set_sndhwm (sock, 0);
    zsock_set_rcvhwm (sock, 0);
    if (zsock_connect (sock, "%s", endpoint)) {
        fprintf (stderr, "ctlload: bad endpoint %s\n", endpoint);
        return 2;
    }
    bool cycle = streq (op, "cycle");
    size_t total = cycle ? count * 2 : count;
    double *lat = calloc (total ? total : 1, sizeof *lat);
    s_slot_t *slots = calloc (inflight, sizeof *slots);
    zhashx_t *pending = zhashx_new (); //  rid → slot index + 1
    size_t sent = 0, done = 0, next_row = 0, errors = 0;
    uint64_t rid = 1;
    char first_error[512] = "";
    double t0 = s_now ();
    //  Each slot carries one row from start to end (a cycle's stop then its resume).
    for (size_t s = 0; s < inflight && sent < count; s++, sent++) {
        slots[s] = (s_slot_t){.row = next_row++ % nrows};
        if (s_send (sock, pending, op, rows, slots, s, rid++))
            return 1;
    }
    size_t lats = 0;
    while (done < total) {
        zframe_t *frame = zframe_recv (sock);
        if (!frame)
            break;
        sbx_err_t err;
        sbx_msg_t *reply = sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err);
        zframe_destroy (&frame);
        if (!reply)
            continue;
        char key[24];
        snprintf (key, sizeof key, "%llu", (unsigned long long) reply->rid);
        uintptr_t at = (uintptr_t) zhashx_lookup (pending, key);
        if (!at) {
            sbx_msg_destroy (&reply);
            continue;
        }
        zhashx_delete (pending, key);
        s_slot_t *slot = &slots[at - 1];
        double now = s_now ();
        lat[lats++] = (now - slot->started) * 1000;
        done++;
        if (reply->type == SBX_MSG_ERROR) {
            if (!errors++)
                snprintf (first_error, sizeof first_error, "%s: %s",
                          sbx_code_name (sbx_msg_error (reply)->code),
                          sbx_msg_error (reply)->message);
        } else if (out && reply->type == SBX_MSG_SANDBOX_CREATE_OK)
            fprintf (out, "%s %s\n", rows[slot->row].account,
                     sbx_msg_sandbox_create_ok (reply)->sandbox->id);
        sbx_msg_destroy (&reply);
        //  What this slot does next: a cycle's resume, or the next row.
        bool more = cycle && slot->step == 0;
        if (!more && sent < count) {
            slot->row = next_row++ % nrows;
            slot->step = 0;
            sent++;
            more = true;
        } else if (more)
            slot->step = 1;
        if (!more)
            continue;
        if (s_send (sock, pending, op, rows, slots, at - 1, rid++))
            return 1;
    }
    double seconds = s_now () - t0;
    qsort (lat, lats, sizeof *lat, s_cmp);
    double p50 = lats ? lat[lats / 2] : 0, p99 = lats ? lat[(size_t) ((lats - 1) * 0.99)] : 0;
    printf ("{\"op\": \"%s\", \"n\": %zu, \"errors\": %zu, \"seconds\": %.3f, \"per_s\": %.1f, "
            "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, \"inflight\": %zu, "
            "\"error\": \"",
            op, done, errors, seconds, seconds > 0 ? done / seconds : 0, p50, p99,
            lats ? lat[lats - 1] : 0, inflight);
    for (char *c = first_error; *c; c++)
        if (*c == '"' || *c == '\\')
            printf ("\\%c", *c);
        else if ((unsigned char) *c >= 0x20)
            putchar (*c);
    printf ("\"}\n");
    if (out)
        fclose (out);
    zhashx_destroy (&pending);
    zsock_destroy (&sock);
    return 0;
}
