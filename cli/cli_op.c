/*  cli_op - see cli_op.h */
#include "cli_op.h"
#include "cli_call.h"
#include "sbx_args.h"

#include <assert.h>

struct cli_op_t {
    char *command;   //  "sbx sandbox create"
    sbx_op_t op;     //
    json_t *args;    //  named as REST names them
    json_t *options; //  argument name → what was typed for it ("--ttl 10s")
    bool agent;      //  after cli_op_request: an agent request
    uint32_t deadline_ms;
    bool quiet; //  self-test: refusals kept in why only
    char why[400];
};

cli_op_t *cli_op_new (const char *command, sbx_op_t op)
{
    assert ((unsigned) op < SBX_OP__COUNT);
    cli_op_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->command = strdup (command ? command : "sbx");
    self->op = op;
    self->args = json_object ();
    self->options = json_object ();
    self->deadline_ms = sbx_ops[op].deadline_ms;
    if (!self->command || !self->args || !self->options)
        cli_op_destroy (&self);
    return self;
}

void cli_op_destroy (cli_op_t **self_p)
{
    assert (self_p);
    cli_op_t *self = *self_p;
    if (self) {
        free (self->command);
        json_decref (self->args);
        json_decref (self->options);
        free (self);
        *self_p = NULL;
    }
}

static int s_refuse (cli_op_t *self, const char *why, const char *option)
{
    if (option && *option)
        snprintf (self->why, sizeof self->why, "%s (%s)", why, option);
    else
        snprintf (self->why, sizeof self->why, "%s", why);
    if (!self->quiet)
        fprintf (stderr, "%s: %s\n", self->command, self->why);
    return -1;
}

//  Remembers what was typed for the argument, to name it if REST's check refuses it.
static void s_typed (cli_op_t *self, const char *name, const char *option, const char *text)
{
    char typed[200];
    if (text)
        snprintf (typed, sizeof typed, "%s %s", option, text);
    else
        snprintf (typed, sizeof typed, "%s", option);
    json_object_set_new (self->options, name, json_string (typed));
}

void cli_op_option (cli_op_t *self, const char *name, const char *option)
{
    assert (self && name && option);
    if (!json_object_get (self->options, name))
        s_typed (self, name, option, NULL);
}

void cli_op_set (cli_op_t *self, const char *name, json_t *value)
{
    assert (self && name);
    json_object_set_new (self->args, name, value);
}

int cli_op_set_text (cli_op_t *self, const char *name, const char *text, const char *option)
{
    assert (self && name);
    const sbx_op_arg_t *arg = sbx_args_find (self->op, name);
    s_typed (self, name, option ? option : name, text);
    //  An argument the operation lacks is left for sbx_args_check to name.
    json_t *value = arg ? sbx_args_from_text (arg, text, self->why, sizeof self->why)
                        : json_string (text ? text : "");
    if (!value) {
        char why[sizeof self->why];
        snprintf (why, sizeof why, "%s", self->why);
        return s_refuse (self, why, json_string_value (json_object_get (self->options, name)));
    }
    cli_op_set (self, name, value);
    return 0;
}

int cli_op_set_duration (cli_op_t *self, const char *name, const char *text, const char *option)
{
    assert (self && name);
    s_typed (self, name, option ? option : name, text);
    int64_t seconds = sbx_clock_parse_duration (text);
    if (seconds < 0) {
        char why[200];
        snprintf (why, sizeof why, "'%.60s' is not a duration (90, 90s, 15m, 2h or 7d)",
                  text ? text : "");
        return s_refuse (self, why, option);
    }
    cli_op_set (self, name, json_integer ((json_int_t) seconds));
    return 0;
}

int cli_op_set_pairs (cli_op_t *self, const char *name, zlist_t *pairs, const char *option)
{
    assert (self && name && pairs);
    if (zlist_size (pairs) == 0)
        return 0;
    s_typed (self, name, option ? option : name, NULL);
    json_t *object = json_object ();
    for (char *kv = zlist_first (pairs); kv; kv = zlist_next (pairs)) {
        const char *eq = strchr (kv, '=');
        if (!eq || eq == kv) {
            char why[200];
            snprintf (why, sizeof why, "'%.80s' is not KEY=VALUE", kv);
            json_decref (object);
            return s_refuse (self, why, option);
        }
        char *key = strndup (kv, (size_t) (eq - kv));
        json_t *value = json_string (eq + 1);
        if (!key || !value) {
            free (key);
            json_decref (value);
            json_decref (object);
            return s_refuse (self, "a label or variable is not UTF-8 text", option);
        }
        json_object_set_new (object, key, value);
        free (key);
    }
    cli_op_set (self, name, object);
    return 0;
}

json_t *cli_op_args (cli_op_t *self)
{
    assert (self);
    return self->args;
}

int cli_op_check (cli_op_t *self)
{
    assert (self);
    //  An option that maps to no argument of this operation is the person's slip, not
    //  an unknown JSON field: name the option.
    const char *name;
    json_t *value, *typed;
    json_object_foreach (self->args, name, value)
    {
        const sbx_op_arg_t *arg = sbx_args_find (self->op, name);
        typed = json_object_get (self->options, name);
        if ((!arg || !(arg->surfaces & SBX_OPS_REST)) && typed) {
            const char *text = json_string_value (typed);
            char why[300];
            snprintf (why, sizeof why, "%.*s does not go with this command (see --help)",
                      (int) strcspn (text, " "), text);
            return s_refuse (self, why, NULL);
        }
    }
    char why[300];
    if (sbx_args_check (self->op, SBX_OPS_REST, self->args, why, sizeof why) == 0)
        return 0;
    //  The message names the argument first ("ttlSeconds must be ..."): add the option.
    json_object_foreach (self->options, name, typed)
    {
        size_t len = strlen (name);
        if (strncmp (why, name, len) == 0 && why[len] == ' ')
            return s_refuse (self, why, json_string_value (typed));
    }
    return s_refuse (self, why, NULL);
}

sbx_msg_t *cli_op_request (cli_op_t *self)
{
    assert (self);
    char why[300];
    sbx_msg_t *msg = sbx_api_request (self->op, self->args, NULL, &self->agent, &self->deadline_ms,
                                      why, sizeof why);
    if (!msg)
        s_refuse (self, why, NULL);
    return msg;
}

sbx_msg_t *cli_op_agent (sbx_config_t *config, const char *sandbox_id, sbx_msg_t **inner_p,
                         int timeout_ms, sbx_err_t *err)
{
    uint8_t *data = NULL;
    size_t size = 0;
    if (sbx_msg_encode (*inner_p, &data, &size, err)) {
        sbx_msg_destroy (inner_p);
        return NULL;
    }
    sbx_msg_destroy (inner_p);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_AGENT);
    sbx_str_set (&sbx_msg_sandbox_agent (request)->sandbox_id, sandbox_id);
    sbx_msg_sandbox_agent (request)->request.data = data;
    sbx_msg_sandbox_agent (request)->request.size = size;
    sbx_msg_t *reply = cli_call (config, &request, timeout_ms, err);
    if (!reply)
        return NULL;
    sbx_bytes_t *bytes = &sbx_msg_sandbox_agent_ok (reply)->reply;
    sbx_msg_t *inner = sbx_msg_decode (bytes->data, bytes->size, err);
    sbx_msg_destroy (&reply);
    if (inner && inner->type == SBX_MSG_ERROR) {
        sbx_err_set (err, sbx_msg_error (inner)->code, "%s", sbx_msg_error (inner)->message);
        sbx_msg_destroy (&inner);
    }
    return inner;
}

sbx_msg_t *cli_op_call (cli_op_t *self, sbx_config_t *config, const char *account,
                        sbx_msg_t **request_p, sbx_err_t *err)
{
    assert (self && request_p && *request_p);
    if (self->agent)
        return cli_op_agent (config, sbx_api_sandbox_id (self->args), request_p,
                             (int) self->deadline_ms, err);
    if (account) {
        sbx_msg_t *request = *request_p;
        request->caller = calloc (1, sizeof (sbx_caller_t));
        if (request->caller) {
            request->caller->kind = SBX_CALLER_KIND_ADMIN;
            sbx_str_set (&request->caller->account_id, account);
        }
    }
    return cli_call (config, request_p, (int) self->deadline_ms, err);
}

json_t *cli_op_answer (cli_op_t *self, sbx_api_t *api, sbx_msg_t *reply)
{
    assert (self && api);
    char why[300];
    json_t *answer = sbx_api_answer (api, self->op, self->args, reply, why, sizeof why);
    if (!answer)
        s_refuse (self, why, NULL);
    return answer;
}

//  --------------------------------------------------------------------------
//  Self test

void cli_op_test (bool verbose)
{
    (void) verbose;
    //  REST's limits, named as REST names them, with the option they came from.
    cli_op_t *op = cli_op_new ("sbx sandbox create", SBX_OP_CREATE_SANDBOX);
    assert (op);
    op->quiet = true;
    assert (cli_op_set_duration (op, "ttlSeconds", "10s", "--ttl") == 0);
    assert (cli_op_check (op) == -1);
    assert (streq (op->why, "ttlSeconds must be between 60 and 2592000 (--ttl 10s)"));
    assert (cli_op_set_duration (op, "ttlSeconds", "1h", "--ttl") == 0);
    assert (cli_op_set_duration (op, "ttlSeconds", "soon", "--ttl") == -1);
    assert (strstr (op->why, "'soon' is not a duration"));
    assert (cli_op_set_text (op, "type", "huge", "--type") == 0);
    assert (cli_op_check (op) == -1);
    assert (streq (op->why, "type is one of small, medium, large (--type huge)"));
    cli_op_set_text (op, "type", "medium", "--type");
    zlist_t *labels = zlist_new ();
    zlist_append (labels, "team=web");
    assert (cli_op_set_pairs (op, "labels", labels, "--label") == 0);
    zlist_append (labels, "=x");
    assert (cli_op_set_pairs (op, "labels", labels, "--label") == -1);
    assert (strstr (op->why, "'=x' is not KEY=VALUE (--label)"));
    zlist_destroy (&labels);
    cli_op_set (op, "network", json_false ());
    assert (cli_op_check (op) == 0);
    sbx_msg_t *msg = cli_op_request (op);
    assert (msg && !op->agent && op->deadline_ms == sbx_ops[SBX_OP_CREATE_SANDBOX].deadline_ms);
    sbx_sandbox_create_t *create = sbx_msg_sandbox_create (msg);
    assert (create->ttl_s == 3600 && create->no_network && create->type == SBX_SANDBOX_TYPE_MEDIUM);
    assert (create->labels.count == 1);
    sbx_msg_destroy (&msg);
    cli_op_destroy (&op);
    assert (!op);

    //  Integers from text; a waited exec waits its timeout and more.
    op = cli_op_new ("sbx sandbox status", SBX_OP_COMMAND_STATUS);
    op->quiet = true;
    cli_op_set_text (op, "sandboxId", "sb_0123456789", "ID");
    assert (cli_op_set_text (op, "processId", "x7", "PID") == -1);
    assert (streq (op->why, "processId must be an integer (PID x7)"));
    assert (cli_op_set_text (op, "processId", "0", "PID") == 0);
    assert (cli_op_check (op) == -1);
    assert (strstr (op->why, "processId must be between 1 and 2147483647 (PID 0)"));
    cli_op_destroy (&op);
    op = cli_op_new ("sbx sandbox extend", SBX_OP_EXTEND_SANDBOX);
    op->quiet = true;
    cli_op_set_text (op, "sandboxId", "sb_0123456789", "ID");
    cli_op_option (op, "ttlSeconds", "--ttl");
    assert (cli_op_check (op) == -1);
    assert (streq (op->why, "ttlSeconds is required (--ttl)"));
    cli_op_destroy (&op);
    op = cli_op_new ("sbx sandbox exec", SBX_OP_EXEC);
    op->quiet = true;
    cli_op_set_text (op, "sandboxId", "sb_0123456789", "ID");
    cli_op_set (op, "command", json_string ("true"));
    cli_op_set_duration (op, "timeout", "11m", "--timeout");
    assert (cli_op_check (op) == -1);
    assert (streq (op->why, "timeout must be between 1 and 600 (--timeout 11m)"));
    cli_op_set_duration (op, "timeout", "5s", "--timeout");
    assert (cli_op_check (op) == 0);
    msg = cli_op_request (op);
    assert (msg && op->agent && op->deadline_ms == 5000 + SBX_API_EXEC_MARGIN_MS);
    sbx_msg_destroy (&msg);
    //  An option for an argument the operation lacks is named.
    cli_op_set_duration (op, "ttlSeconds", "60", "--ttl");
    assert (cli_op_check (op) == -1);
    assert (streq (op->why, "--ttl does not go with this command (see --help)"));
    cli_op_destroy (&op);
}
