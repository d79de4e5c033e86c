/*  cli_call - see cli_call.h */
#include "cli_call.h"

#include <errno.h>
#include <unistd.h>

sbx_msg_t *cli_call (sbx_config_t *config, sbx_msg_t **request_p, int timeout_ms, sbx_err_t *err)
{
    sbx_msg_t *request = *request_p;
    *request_p = NULL;
    const char *endpoint = sbx_config_get (config, "broker.endpoint", NULL);
    zsock_t *sock = zsock_new (ZMQ_DEALER);
    sbx_msg_t *reply = NULL;
    if (!sock) {
        sbx_err_set (err, SBX_E_INTERNAL, "cannot create a socket");
        sbx_msg_destroy (&request);
        return NULL;
    }
    zsock_set_linger (sock, 0);
    //  A socket that is not there, or not this user's to use: said at once, not after
    //  the whole wait.
    if (endpoint && strncmp (endpoint, "ipc://", 6) == 0) {
        const char *path = endpoint + 6;
        if (access (path, F_OK) != 0 && errno == ENOENT) {
            sbx_err_set (err, SBX_E_UNAVAILABLE,
                         "no broker at %s: `sbx up` is not running with the data directory %s "
                         "(away from the sbx host, `sbx login URL` once instead)",
                         path, sbx_config_data_dir (config));
            goto done;
        }
        if (access (path, R_OK | W_OK) != 0) {
            sbx_err_set (err, SBX_E_PERMISSION_DENIED,
                         "cannot use the broker's socket %s: %s. Here the CLI acts as the "
                         "operator, as root (or the user sbx up runs as); any user can use a "
                         "service through its API after `sbx login URL`",
                         path, strerror (errno));
            goto done;
        }
    }
    if (sbx_curve_needed (endpoint) && sbx_curve_client (config, sock)) {
        sbx_err_set (err, SBX_E_UNAVAILABLE, "no CURVE keys to reach the broker at %s", endpoint);
        goto done;
    }
    if (zsock_connect (sock, "%s", endpoint)) {
        sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "bad broker endpoint '%s'", endpoint);
        goto done;
    }
    if (!request->caller) {
        request->caller = calloc (1, sizeof *request->caller);
        request->caller->kind = SBX_CALLER_KIND_ADMIN;
    }
    request->rid = (uint64_t) getpid () << 16 | 1;
    request->timeout_ms = (uint32_t) timeout_ms;
    uint8_t *data = NULL;
    size_t size = 0;
    if (sbx_msg_encode (request, &data, &size, err))
        goto done;
    zframe_t *frame = zframe_new (data, size);
    free (data);
    zframe_send (&frame, sock, 0);
    zpoller_t *poller = zpoller_new (sock, NULL);
    uint64_t deadline = sbx_clock_mono_ms () + (uint64_t) timeout_ms;
    while (!reply) {
        uint64_t now = sbx_clock_mono_ms ();
        if (now >= deadline || !zpoller_wait (poller, (int) (deadline - now))) {
            if (zpoller_terminated (poller))
                sbx_err_set (err, SBX_E_UNAVAILABLE, "interrupted");
            else
                sbx_err_set (err, SBX_E_UNAVAILABLE,
                             "the broker did not answer within %d ms at %s; is `sbx up` running "
                             "with this data directory (%s)?",
                             timeout_ms, endpoint, sbx_config_data_dir (config));
            break;
        }
        frame = zframe_recv (sock);
        sbx_msg_t *msg =
            frame ? sbx_msg_decode (zframe_data (frame), zframe_size (frame), err) : NULL;
        zframe_destroy (&frame);
        if (!msg || msg->rid != request->rid) {
            sbx_msg_destroy (&msg);
            continue;
        }
        if (msg->type == SBX_MSG_ERROR) {
            sbx_error_t *error = sbx_msg_error (msg);
            sbx_err_set (err, error->code, "%s", error->message);
            sbx_msg_destroy (&msg);
            break;
        }
        reply = msg;
    }
    zpoller_destroy (&poller);
done:
    sbx_msg_destroy (&request);
    zsock_destroy (&sock);
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
