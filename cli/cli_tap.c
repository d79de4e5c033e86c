/*  cli_tap - `sbx tap`: the event log as JSON lines, replayed then live. */
#include "cli_commands.h"
#include "cli_rest.h"
#include "sbx_common.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>

typedef struct {
    const char *prefix;
    uint64_t count; //  stop after this many printed (0: never)
    uint64_t printed;
    bool once;
    sbx_tapreader_t *reader;
} s_tap_t;

//  One line: the envelope first, then the payload's own fields.
static int s_on_event (const sbx_event_t *event, void *arg)
{
    s_tap_t *tap = arg;
    if (tap->prefix && strncmp (event->type, tap->prefix, strlen (tap->prefix)) != 0)
        return 0;
    char ts[32];
    json_t *line = json_pack ("{s:I, s:s, s:s, s:s?, s:s?}", "seq", (json_int_t) event->seq, "ts",
                              sbx_clock_iso8601 (event->ts_ms, ts, sizeof ts), "type", event->type,
                              "account", event->account, "subject", event->subject);
    if (event->payload.data) {
        sbx_err_t err;
        sbx_msg_t *payload = sbx_msg_decode (event->payload.data, event->payload.size, &err);
        char *text = payload ? sbx_msg_body_to_json (payload) : NULL;
        json_t *fields = text ? json_loads (text, 0, NULL) : NULL;
        const char *key;
        json_t *value;
        json_object_foreach (fields, key, value) if (!json_object_get (line, key))
            json_object_set (line, key, value);
        if (!payload)
            json_object_set_new (line, "payload_error", json_string (err.message));
        json_decref (fields);
        free (text);
        sbx_msg_destroy (&payload);
    }
    char *out = json_dumps (line, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref (line);
    if (out) {
        puts (out);
        free (out);
    }
    tap->printed++;
    return tap->count && tap->printed >= tap->count ? -1 : 0;
}

static int s_on_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_tap_t *tap = arg;
    if (sbx_tapreader_stopped (tap->reader))
        return -1;
    if (tap->once && sbx_tapreader_caught_up (tap->reader))
        return -1;
    return 0;
}

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx tap [--since SEQ] [--once] [--count N] [--data-dir DIR] [--json] "
                  "[PREFIX]\n\n"
                  "Prints events of the broker's log as JSON lines\n"
                  "{\"seq\",\"ts\",\"type\",\"account\",\"subject\",...fields of the event}.\n"
                  "Without --since it prints events as they are committed; with --since SEQ it\n"
                  "first replays every event after SEQ (0 for the whole log), then goes on live.\n"
                  "Every event is printed once, in order, also across broker restarts.\n"
                  "PREFIX keeps only event types starting with it (sandbox., ttl.).\n"
                  "  --once      stop once caught up with the end of the log\n"
                  "  --count N   stop after N events\n"
                  "Output is always JSON lines; --json is accepted for symmetry.\n");
}

int cli_tap_main (int argc, char **argv)
{
    static struct option options[] = {{"since", required_argument, 0, 's'},
                                      {"once", no_argument, 0, 'o'},
                                      {"count", required_argument, 0, 'c'},
                                      {"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    s_tap_t tap = {0};
    uint64_t since = SBX_TAPREADER_NOW;
    const char *data_dir = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
        char *end;
        switch (c) {
        case 's':
        case 'c':
            errno = 0;
            uint64_t value = strtoull (optarg, &end, 10);
            if (errno || *end || optarg[0] == '-' || end == optarg) {
                fprintf (stderr, "sbx tap: '%s' is not a number\n", optarg);
                return 2;
            }
            if (c == 's')
                since = value;
            else
                tap.count = value;
            break;
        case 'o':
            tap.once = true;
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (optind < argc - 1) {
        s_usage (stderr);
        return 2;
    }
    tap.prefix = optind < argc ? argv[optind] : NULL;
    setvbuf (stdout, NULL, _IOLBF, 0);
    if (cli_rest_local_only ("sbx tap", data_dir))
        return 2;
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    zloop_t *loop = zloop_new ();
    sbx_peer_t *peer = sbx_peer_new (config, SBX_ROLE_CLI, "tap");
    tap.reader = peer ? sbx_tapreader_new (config, peer, since, s_on_event, &tap) : NULL;
    int rc = 1;
    if (tap.reader && sbx_peer_start (peer, loop) == 0 &&
        sbx_tapreader_start (tap.reader, loop) == 0) {
        zloop_timer (loop, 100, 0, s_on_tick, &tap);
        zloop_start (loop);
        rc = 0;
    }
    sbx_tapreader_destroy (&tap.reader);
    sbx_peer_destroy (&peer);
    zloop_destroy (&loop);
    sbx_config_destroy (&config);
    return rc;
}
