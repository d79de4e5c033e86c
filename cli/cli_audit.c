/*  cli_audit - `sbx audit ttl`: every TTL expiry in the event log, checked.

    Reads the whole log (events.replay) and follows each sandbox's state and deadline
    from its sandbox.changed events. Each ttl.expired is listed with its deadline and
    the time the broker began the stop; one more than a second late is flagged. A
    sandbox that stayed ready more than a second past its deadline without a
    ttl.expired (stopped some other way later, or still running now) is listed as
    missed. Exit code 0 when everything was on time, 1 when anything was late or missed.
*/
#include "cli_call.h"
#include "cli_commands.h"
#include "cli_rest.h"

#include <getopt.h>
#include <jansson.h>

#define S_GRACE_MS 1000 //  "within one second" of the deadline

typedef struct {
    sbx_sandbox_state_t state;
    uint64_t deadline;
    bool expired; //  a ttl.expired came for this deadline
} s_track_t;

static void s_track_free (void **item)
{
    free (*item);
    *item = NULL;
}

static void s_missed (json_t *missed, const char *id, const s_track_t *t, uint64_t until)
{
    json_array_append_new (missed, json_pack ("{s:s, s:o, s:o, s:b}", "sandbox", id, "deadline",
                                              cli_json_time (t->deadline), "ran_until",
                                              cli_json_time (until), "still_running", until == 0));
}

//  Applies one event. Returns 0, or -1 when its payload doesn't decode.
static int s_apply (zhashx_t *tracks, const sbx_event_t *event, json_t *expiries, json_t *missed)
{
    sbx_err_t err;
    sbx_msg_t *payload = sbx_msg_decode (event->payload.data, event->payload.size, &err);
    if (!payload)
        return -1;
    if (payload->type == SBX_MSG_SANDBOX_CHANGED) {
        sbx_sandbox_changed_t *changed = sbx_msg_sandbox_changed (payload);
        s_track_t *t = zhashx_lookup (tracks, changed->sandbox_id);
        if (!t) {
            t = calloc (1, sizeof *t);
            zhashx_insert (tracks, changed->sandbox_id, t);
        }
        //  Leaving ready late, and not because of the TTL: the TTL was missed.
        if (t->state == SBX_SANDBOX_STATE_READY && changed->to != SBX_SANDBOX_STATE_READY &&
            t->deadline && !t->expired && event->ts_ms > t->deadline + S_GRACE_MS)
            s_missed (missed, changed->sandbox_id, t, event->ts_ms);
        if (changed->expires_ms != t->deadline)
            t->expired = false;
        t->state = changed->to;
        t->deadline = changed->expires_ms;
    } else if (payload->type == SBX_MSG_SANDBOX_UPDATED) {
        sbx_sandbox_updated_t *updated = sbx_msg_sandbox_updated (payload);
        s_track_t *t = zhashx_lookup (tracks, updated->sandbox_id);
        if (t && updated->expires_ms != t->deadline) {
            t->deadline = updated->expires_ms;
            t->expired = false;
        }
    } else if (payload->type == SBX_MSG_TTL_EXPIRED) {
        sbx_ttl_expired_t *expired = sbx_msg_ttl_expired (payload);
        s_track_t *t = zhashx_lookup (tracks, expired->sandbox_id);
        if (t)
            t->expired = true;
        uint64_t late = expired->actual_ms > expired->deadline_ms
                            ? expired->actual_ms - expired->deadline_ms
                            : 0;
        json_array_append_new (
            expiries, json_pack ("{s:s, s:o, s:o, s:I, s:b}", "sandbox", expired->sandbox_id,
                                 "deadline", cli_json_time (expired->deadline_ms), "stopped_at",
                                 cli_json_time (expired->actual_ms), "late_ms", (json_int_t) late,
                                 "late", late > S_GRACE_MS));
    }
    sbx_msg_destroy (&payload);
    return 0;
}

static void s_usage (FILE *out)
{
    fprintf (out,
             "usage: sbx audit ttl [--data-dir DIR] [--json]\n\n"
             "Lists every TTL expiry in the event log with its deadline and the time the\n"
             "sandbox was stopped, flagging any more than a second late, and every sandbox\n"
             "that ran more than a second past its deadline without being stopped for it\n"
             "(missed). Exit code 0 when all were on time, 1 otherwise.\n"
             "--json prints {\"expiries\":[{\"sandbox\",\"deadline\",\"stopped_at\",\"late_ms\",\n"
             "\"late\"}],\"missed\":[{\"sandbox\",\"deadline\",\"ran_until\",\"still_running\"}],"
             "\"ok\"}.\n");
}

int cli_audit_main (int argc, char **argv)
{
    if (argc < 2 || streq (argv[1], "--help") || streq (argv[1], "-h")) {
        s_usage (argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!streq (argv[1], "ttl")) {
        fprintf (stderr, "sbx audit: unknown subject '%s' (only ttl)\n", argv[1]);
        return 2;
    }
    static struct option options[] = {{"data-dir", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *data_dir = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    while ((c = getopt_long (argc - 1, argv + 1, "", options, NULL)) != -1) {
        switch (c) {
        case 'd':
            data_dir = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'h':
            s_usage (stdout);
            return 0;
        default:
            s_usage (stderr);
            return 2;
        }
    }
    if (cli_rest_local_only ("sbx audit", data_dir))
        return 2;
    sbx_config_t *config = sbx_config_new (data_dir);
    if (!config)
        return 1;
    zhashx_t *tracks = zhashx_new ();
    zhashx_set_destructor (tracks, s_track_free);
    json_t *expiries = json_array ();
    json_t *missed = json_array ();
    uint64_t after = 0;
    int rc = 0, bad = 0;
    while (rc == 0) {
        sbx_msg_t *request = sbx_msg_new (SBX_MSG_EVENTS_REPLAY);
        sbx_msg_events_replay (request)->after_seq = after;
        sbx_msg_events_replay (request)->limit = 5000;
        sbx_err_t err;
        sbx_msg_t *reply = cli_call (config, &request, 30000, &err);
        if (!reply) {
            rc = cli_fail (&err);
            break;
        }
        sbx_events_replay_ok_t *ok = sbx_msg_events_replay_ok (reply);
        for (size_t i = 0; i < ok->events.count; i++) {
            after = ok->events.items[i].seq;
            if (s_apply (tracks, &ok->events.items[i], expiries, missed))
                bad++;
        }
        bool more = ok->more && ok->events.count > 0;
        sbx_msg_destroy (&reply);
        if (!more)
            break;
    }
    //  Still running past the deadline now.
    uint64_t now = sbx_clock_now_ms ();
    for (s_track_t *t = zhashx_first (tracks); t; t = zhashx_next (tracks))
        if (t->state == SBX_SANDBOX_STATE_READY && t->deadline && !t->expired &&
            now > t->deadline + S_GRACE_MS)
            s_missed (missed, (const char *) zhashx_cursor (tracks), t, 0);
    size_t late = 0, i;
    json_t *entry;
    json_array_foreach (expiries, i, entry) late += json_is_true (json_object_get (entry, "late"));
    bool all_ok = late == 0 && json_array_size (missed) == 0;
    if (rc == 0) {
        if (as_json) {
            json_t *out = json_pack ("{s:O, s:O, s:b, s:I}", "expiries", expiries, "missed", missed,
                                     "ok", all_ok, "undecodable_events", (json_int_t) bad);
            char *text = json_dumps (out, JSON_COMPACT | JSON_PRESERVE_ORDER);
            printf ("%s\n", text);
            free (text);
            json_decref (out);
        } else {
            printf ("%-14s %-24s %-24s %s\n", "SANDBOX", "DEADLINE", "STOPPED", "LATE");
            json_array_foreach (expiries, i, entry)
                printf ("%-14s %-24s %-24s %lld ms%s\n",
                        json_string_value (json_object_get (entry, "sandbox")),
                        json_string_value (json_object_get (entry, "deadline")),
                        json_string_value (json_object_get (entry, "stopped_at")),
                        (long long) json_integer_value (json_object_get (entry, "late_ms")),
                        json_is_true (json_object_get (entry, "late")) ? "  LATE" : "");
            json_array_foreach (missed, i, entry)
                printf ("%-14s %-24s %-24s MISSED\n",
                        json_string_value (json_object_get (entry, "sandbox")),
                        json_string_value (json_object_get (entry, "deadline")),
                        json_is_true (json_object_get (entry, "still_running"))
                            ? "(still running)"
                            : json_string_value (json_object_get (entry, "ran_until")));
            printf ("%zu expiries, %zu late, %zu missed\n", json_array_size (expiries), late,
                    json_array_size (missed));
        }
        rc = all_ok ? 0 : 1;
    }
    json_decref (expiries);
    json_decref (missed);
    zhashx_destroy (&tracks);
    sbx_config_destroy (&config);
    return rc;
}
