/*  cli_call - see cli_call.h */
#include "cli_call.h"

#include <errno.h>
#include <unistd.h>

//  Checks a same-host socket before waiting on it: one that is not there, or not this
//  user's to use, is said at once, not after the whole wait. 0, or -1 with err set.
static int s_check_ipc (sbx_config_t *config, const char *endpoint, sbx_err_t *err)
{
    if (!endpoint || strncmp (endpoint, "ipc://", 6) != 0)
        return 0;
    const char *path = endpoint + 6;
    if (access (path, F_OK) != 0 && errno == ENOENT)
        return sbx_err_set (err, SBX_E_UNAVAILABLE,
                            "no broker at %s: `sbx up` is not running with the data directory %s "
                            "(away from the sbx host, `sbx login URL` once instead)",
                            path, sbx_config_data_dir (config));
    if (access (path, R_OK | W_OK) != 0)
        return sbx_err_set (err, SBX_E_PERMISSION_DENIED,
                            "cannot use the broker's socket %s: %s. Here the CLI acts as the "
                            "operator, as root (or the user sbx up runs as); any user can use a "
                            "service through its API after `sbx login URL`",
                            path, strerror (errno));
    return 0;
}

//  A DEALER to endpoint (CURVE on tcp://). NULL with err set.
static zsock_t *s_connect (sbx_config_t *config, const char *endpoint, sbx_err_t *err)
{
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    if (!sock) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot create a socket");
        return NULL;
    }
    zsock_set_linger (sock, 0);
    if (sbx_curve_needed (endpoint) && sbx_curve_client (config, sock)) {
        sbx_err_set (err, SBX_E_UNAVAILABLE, "no CURVE keys to reach the broker at %s", endpoint);
        zsock_destroy (&sock);
    } else if (zsock_connect (sock, "%s", endpoint)) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "bad broker endpoint '%s'", endpoint);
        zsock_destroy (&sock);
    }
    return sock;
}

static int s_send (zsock_t *sock, sbx_msg_t *msg, sbx_err_t *err)
{
    uint8_t *data = NULL;
    size_t size = 0;
    if (sbx_msg_encode (msg, &data, &size, err))
        return -1;
    zframe_t *frame = zframe_new (data, size);
    free (data);
    return zframe_send (&frame, sock, 0);
}

//  The message with rid from sock before deadline (monotonic ms), skipping others; NULL
//  at the deadline. With ping_ms, a client that hears nothing for that long asks the
//  broker whether it is there (a heartbeat: any answer will do) and gives up, setting
//  *silent, after twice as long without a word.
static sbx_msg_t *s_wait (zsock_t *sock, uint64_t rid, uint64_t deadline, uint64_t ping_ms,
                          bool *silent, bool *interrupted)
{
    zpoller_t *poller = zpoller_new (sock, NULL);
    uint64_t heard = sbx_clock_mono_ms ();
    sbx_msg_t *reply = NULL;
    while (!reply) {
        uint64_t now = sbx_clock_mono_ms ();
        if (now >= deadline)
            break;
        if (ping_ms && now - heard > 2 * ping_ms) {
            *silent = true;
            break;
        }
        uint64_t wait = deadline - now;
        if (ping_ms && wait > ping_ms / 2)
            wait = ping_ms / 2;
        if (!zpoller_wait (poller, (int) wait)) {
            if (zpoller_terminated (poller)) {
                *interrupted = true;
                break;
            }
            if (ping_ms && sbx_clock_mono_ms () - heard > ping_ms) {
                sbx_msg_t *ping = sbx_msg_new (SBX_MSG_PEER_HEARTBEAT);
                sbx_err_t ignored;
                s_send (sock, ping, &ignored);
                sbx_msg_destroy (&ping);
            }
            continue;
        }
        heard = sbx_clock_mono_ms ();
        zframe_t *frame = zframe_recv (sock);
        sbx_err_t err;
        sbx_msg_t *msg =
            frame ? sbx_msg_decode (zframe_data (frame), zframe_size (frame), &err) : NULL;
        zframe_destroy (&frame);
        if (msg && msg->rid == rid)
            reply = msg;
        else
            sbx_msg_destroy (&msg);
    }
    zpoller_destroy (&poller);
    return reply;
}

//  With several brokers (a cluster's control nodes): the one that leads, found by asking
//  each in turn how it is (one that stands by says so; one that is gone says nothing for
//  a second). NULL with err set when none leads before the deadline.
//  Whether the broker on sock leads: asks it how it is (a second at most).
static bool s_probe (zsock_t *sock, uint64_t rid, uint64_t deadline)
{
    sbx_msg_t *status = sbx_msg_new (SBX_MSG_SYS_STATUS);
    status->rid = rid;
    status->caller = calloc (1, sizeof *status->caller);
    status->caller->kind = SBX_CALLER_KIND_ADMIN;
    sbx_err_t err;
    s_send (sock, status, &err);
    sbx_msg_destroy (&status);
    uint64_t until = sbx_clock_mono_ms () + 1000;
    bool silent = false, interrupted = false;
    sbx_msg_t *reply =
        s_wait (sock, rid, until < deadline ? until : deadline, 0, &silent, &interrupted);
    bool leads = reply && reply->type == SBX_MSG_SYS_STATUS_OK &&
                 (!sbx_msg_sys_status_ok (reply)->control ||
                  streq (sbx_msg_sys_status_ok (reply)->control, "leader"));
    sbx_msg_destroy (&reply);
    return leads;
}

static zsock_t *s_leader (sbx_config_t *config, char **endpoints, size_t count, size_t *at,
                          uint64_t deadline, sbx_err_t *err)
{
    uint64_t rid = (uint64_t) getpid () << 16 | 0x8000;
    char hinted[300] = "";
    while (sbx_clock_mono_ms () < deadline) {
        for (size_t n = 0; n < count; n++) {
            size_t i = (*at + n) % count;
            zsock_t *sock = s_connect (config, endpoints[i], err);
            if (!sock)
                return NULL;
            sbx_msg_t *status = sbx_msg_new (SBX_MSG_SYS_STATUS);
            status->rid = ++rid;
            status->caller = calloc (1, sizeof *status->caller);
            status->caller->kind = SBX_CALLER_KIND_ADMIN;
            s_send (sock, status, err);
            sbx_msg_destroy (&status);
            uint64_t until = sbx_clock_mono_ms () + 1000;
            bool silent = false, interrupted = false;
            sbx_msg_t *reply =
                s_wait (sock, rid, until < deadline ? until : deadline, 0, &silent, &interrupted);
            bool leads = reply && reply->type == SBX_MSG_SYS_STATUS_OK &&
                         (!sbx_msg_sys_status_ok (reply)->control ||
                          streq (sbx_msg_sys_status_ok (reply)->control, "leader"));
            //  A standby names the leader: its broker (at PORT+1) is asked next, in the
            //  settings or not (this host's control.nodes may be older than the cluster).
            const char *leader = reply && reply->type == SBX_MSG_SYS_STATUS_OK && !leads
                                     ? sbx_msg_sys_status_ok (reply)->leader
                                     : NULL;
            const char *colon = leader ? strrchr (leader, ':') : NULL;
            if (colon && colon != leader && !*hinted) {
                snprintf (hinted, 300, "tcp://%.*s:%ld", (int) (colon - leader), leader,
                          strtol (colon + 1, NULL, 10) + 1);
                bool known = false;
                for (size_t k = 0; k < count; k++)
                    known |= streq (endpoints[k], hinted);
                if (!known) {
                    sbx_msg_destroy (&reply);
                    zsock_destroy (&sock);
                    zsock_t *there = s_connect (config, hinted, err);
                    if (there && s_probe (there, ++rid, deadline)) {
                        *at = 0;
                        return there;
                    }
                    zsock_destroy (&there);
                    continue;
                }
            }
            sbx_msg_destroy (&reply);
            if (interrupted) {
                zsock_destroy (&sock);
                sbx_err_set (err, SBX_E_UNAVAILABLE, "interrupted");
                return NULL;
            }
            if (leads) {
                *at = i;
                return sock;
            }
            zsock_destroy (&sock);
        }
        zclock_sleep (200); //  an election: a leader comes within a second or so
    }
    sbx_err_set (err, SBX_E_UNAVAILABLE,
                 "no broker of %s leads the control plane (each stands by or does not answer); "
                 "`sbx status` on a control node says more",
                 sbx_config_get (config, "broker.endpoint", ""));
    return NULL;
}

sbx_msg_t *cli_call (sbx_config_t *config, sbx_msg_t **request_p, int timeout_ms, sbx_err_t *err)
{
    sbx_msg_t *request = *request_p;
    *request_p = NULL;
    size_t count = 0;
    char **endpoints = sbx_config_list (config, "broker.endpoint", &count);
    zsock_t *sock = NULL;
    sbx_msg_t *reply = NULL;
    uint64_t deadline = sbx_clock_mono_ms () + (uint64_t) timeout_ms;
    size_t at = 0;
    if (!endpoints) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "no broker.endpoint");
        goto done;
    }
    if (count == 1 && s_check_ipc (config, endpoints[0], err))
        goto done;
    if (!request->caller) {
        request->caller = calloc (1, sizeof *request->caller);
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
    }
    request->rid = (uint64_t) getpid () << 16 | 1;
    request->timeout_ms = (uint32_t) timeout_ms;
    while (!reply) {
        sock = count == 1 ? s_connect (config, endpoints[0], err)
                          : s_leader (config, endpoints, count, &at, deadline, err);
        if (!sock || s_send (sock, request, err))
            break;
        bool silent = false, interrupted = false;
        reply = s_wait (sock, request->rid, deadline, count > 1 ? 1000 : 0, &silent, &interrupted);
        zsock_destroy (&sock);
        if (interrupted)
            sbx_err_set (err, SBX_E_UNAVAILABLE, "interrupted");
        else if (silent)
            sbx_err_set (err, SBX_E_UNAVAILABLE,
                         "the control plane's leader at %s stopped answering while this was in "
                         "flight: it may or may not have been done; check, then retry",
                         endpoints[at]);
        else if (!reply)
            sbx_err_set (err, SBX_E_UNAVAILABLE,
                         "the broker did not answer within %d ms at %s; is `sbx up` running "
                         "with this data directory (%s)?",
                         timeout_ms, endpoints[at], sbx_config_data_dir (config));
        if (!reply)
            break;
        //  Leadership moved between the question and the request: nothing was done.
        if (reply->type == SBX_MSG_PEER_STANDBY && count > 1) {
            sbx_msg_destroy (&reply);
            at = (at + 1) % count;
            continue;
        }
        if (reply->type == SBX_MSG_PEER_STANDBY) {
            sbx_peer_standby_t *standby = sbx_msg_peer_standby (reply);
            sbx_err_set (err, SBX_E_UNAVAILABLE,
                         "the broker at %s stands by (control node %s of a cluster, which does "
                         "not lead): give every control node's broker endpoint in "
                         "broker.endpoint",
                         endpoints[0], standby->node);
            sbx_msg_destroy (&reply);
            break;
        }
        if (reply->type == SBX_MSG_ERROR) {
            sbx_error_t *error = sbx_msg_error (reply);
            sbx_err_set (err, error->code, "%s", error->message);
            sbx_msg_destroy (&reply);
            break;
        }
    }
done:
    zsock_destroy (&sock);
    sbx_config_list_free (&endpoints);
    sbx_msg_destroy (&request);
    return reply;
}

int cli_fail (const sbx_err_t *err)
{
    fprintf (stderr, "sbx: %s (%s)\n", err->message, sbx_code_name (err->code));
    return err->code == SBX_E_UNAVAILABLE || err->code == SBX_E_TIMEOUT ? 3 : 1;
}

void cli_print_json (json_t *json)
{
    char *text = json_dumps (json, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text)
        printf ("%s\n", text);
    free (text);
    json_decref (json);
}

const char *cli_json_str (json_t *object, const char *key, const char *none)
{
    const char *value = json_string_value (json_object_get (object, key));
    return value ? value : none;
}

json_t *cli_json_time (uint64_t ms)
{
    char buf[32];
    return ms ? json_string (sbx_clock_iso8601 (ms, buf, sizeof buf)) : json_null ();
}
