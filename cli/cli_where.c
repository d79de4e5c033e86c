/*  cli_where - see cli_where.h */
#include "cli_where.h"
#include "cli_call.h"
#include "sbx_xfer.h"

int cli_where_open (cli_where_t *w, const char *command, const char *data_dir)
{
    memset (w, 0, sizeof *w);
    if (cli_rest_for (command, data_dir, &w->rest))
        return 2;
    if (!w->rest) {
        w->config = sbx_config_new (data_dir);
        w->api = w->config ? sbx_api_new (w->config) : NULL;
        if (!w->api) {
            cli_where_close (w);
            return 1;
        }
    }
    return 0;
}

void cli_where_close (cli_where_t *w)
{
    sbx_api_destroy (&w->api);
    sbx_config_destroy (&w->config);
    cli_rest_destroy (&w->rest);
}

int cli_where_call (cli_where_t *w, cli_op_t *op, sbx_op_t id, const char *account, bool plan_ttl,
                    json_t **answer, sbx_msg_t **reply_p)
{
    sbx_err_t err;
    if (w->rest) {
        json_t *args = cli_op_args (op);
        if (id == SBX_OP_CREATE_SANDBOX && plan_ttl)
            json_object_del (args, "ttlSeconds"); //  the plan's default, as on the host
        if (cli_rest_call (w->rest, id, args, NULL, 0, answer, NULL, NULL, &err))
            return cli_fail (&err);
        return 0;
    }
    sbx_msg_t *request = cli_op_request (op);
    if (!request)
        return 2;
    //  No --ttl: the broker's default for the account's plan (1 h, bounded by the plan's
    //  maximum) rather than REST's 3600, which a plan with a shorter maximum refuses.
    if (request->type == SBX_MSG_SANDBOX_CREATE && plan_ttl)
        sbx_msg_sandbox_create (request)->ttl_s = 0;
    sbx_msg_t *reply = cli_op_call (op, w->config, account, &request, &err);
    if (!reply)
        return cli_fail (&err);
    *answer = cli_op_answer (op, w->api, reply);
    if (reply_p && *answer)
        *reply_p = reply;
    else
        sbx_msg_destroy (&reply);
    return *answer ? 0 : 1;
}

//  A file transfer on the host: its chunks one after the other through the broker.
//  0, or the exit code with the failure said.
static int s_chunks (cli_where_t *w, const char *sandbox_id, sbx_op_t id, sbx_xfer_t *xfer)
{
    int rc = 0;
    sbx_msg_t *inner;
    uint64_t at;
    while (rc == 0 && (inner = sbx_xfer_next (xfer, &at))) {
        sbx_err_t err;
        sbx_msg_t *reply =
            cli_op_agent (w->config, sandbox_id, &inner, (int) sbx_ops[id].deadline_ms, &err);
        if (!reply || sbx_xfer_take (xfer, at, reply, &err.code, err.message, sizeof err.message))
            rc = cli_fail (&err);
        sbx_msg_destroy (&reply);
    }
    return rc;
}

//  data (at most 16 MiB) to the guest's path with mode bits (0: the default): chunk by
//  chunk through the broker (sbx_xfer), or in one PUT to a remote service.
int cli_where_put (cli_where_t *w, const char *sandbox_id, const char *path, const void *data,
                   size_t size, unsigned bits)
{
    if (w->rest) {
        char mode[8];
        snprintf (mode, sizeof mode, "%o", bits);
        json_t *args = json_pack ("{s:s, s:s}", "sandboxId", sandbox_id, "path", path);
        if (bits)
            json_object_set_new (args, "mode", json_string (mode));
        sbx_err_t err;
        int rc =
            cli_rest_call (w->rest, SBX_OP_WRITE_FILE, args, data, size, NULL, NULL, NULL, &err)
                ? cli_fail (&err)
                : 0;
        json_decref (args);
        return rc;
    }
    sbx_xfer_t *xfer = sbx_xfer_new_write (path, data, size, bits);
    if (!xfer)
        return 1;
    int rc = s_chunks (w, sandbox_id, SBX_OP_WRITE_FILE, xfer);
    sbx_xfer_destroy (&xfer);
    return rc;
}

int cli_where_get (cli_where_t *w, const char *sandbox_id, const char *path, uint8_t **data,
                   size_t *size)
{
    sbx_err_t err;
    if (w->rest) {
        json_t *args = json_pack ("{s:s, s:s}", "sandboxId", sandbox_id, "path", path);
        int rc = cli_rest_call (w->rest, SBX_OP_READ_FILE, args, NULL, 0, NULL, (char **) data,
                                size, &err)
                     ? cli_fail (&err)
                     : 0;
        json_decref (args);
        return rc;
    }
    sbx_xfer_t *xfer = sbx_xfer_new_read (path);
    if (!xfer)
        return 1;
    int rc = s_chunks (w, sandbox_id, SBX_OP_READ_FILE, xfer);
    if (rc == 0) {
        *size = sbx_xfer_size (xfer);
        *data = malloc (*size + 1);
        memcpy (*data, sbx_xfer_data (xfer), *size);
    }
    sbx_xfer_destroy (&xfer);
    return rc;
}

int cli_where_slurp (FILE *f, size_t limit, uint8_t **data, size_t *size)
{
    //  One byte past the limit tells a file over it from one at it.
    *data = malloc (limit + 2);
    *size = 0;
    size_t got;
    while (*data && *size <= limit && (got = fread (*data + *size, 1, limit + 1 - *size, f)) > 0)
        *size += got;
    if (!*data || *size > limit) {
        free (*data);
        *data = NULL;
        return -1;
    }
    (*data)[*size] = 0;
    return 0;
}
