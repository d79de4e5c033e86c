/*  sbx_api - see sbx_api.h */
#include "sbx_api.h"
#include "sbx_args.h"
#include "sbx_egress.h"
#include "sbx_secret.h"
#include "sbx_urls.h"

#include <assert.h>
#include <signal.h>
#include <strings.h>

struct sbx_api_t {
    char *box_suffix; //  ".box.DOMAIN[:PORT]"
    bool tls;
};

sbx_api_t *sbx_api_new (sbx_config_t *config)
{
    sbx_api_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->tls = !config || sbx_urls_https (config);
    self->box_suffix = config ? sbx_urls_box_suffix (config) : strdup (".box.localhost");
    if (!self->box_suffix)
        sbx_api_destroy (&self);
    return self;
}

void sbx_api_destroy (sbx_api_t **self_p)
{
    assert (self_p);
    if (*self_p) {
        free ((*self_p)->box_suffix);
        free (*self_p);
        *self_p = NULL;
    }
}

//  --------------------------------------------------------------------------
//  The shapes' parts

sbx_sandbox_info_t *sbx_api_sandbox_info (sbx_msg_t *reply)
{
    sbx_sandbox_info_t **slot = sbx_msg_sandbox_slot (reply);
    return slot ? *slot : NULL;
}

static void s_snapshot_labels (json_t *labels, const sbx_strmap_t *map)
{
    for (size_t i = 0; i < map->count; i++)
        json_object_set_new (labels, map->keys[i], json_string (map->values[i]));
}

json_t *sbx_api_snapshot (const sbx_snapshot_info_t *info)
{
    json_t *labels = json_object ();
    s_snapshot_labels (labels, &info->labels);
    json_t *snapshot = json_pack (
        "{s:s, s:s?, s:s, s:s, s:s?, s:s, s:I, s:I, s:I, s:o, s:o}", "id", info->id, "name",
        info->name, "state", sbx_snapshot_state_name (info->state), "kind",
        info->kind ? sbx_snapshot_kind_name (info->kind) : "user", "sandboxId", info->sandbox_id,
        "type", info->type ? sbx_sandbox_type_name (info->type) : "small", "sizeBytes",
        (json_int_t) (info->disk_bytes + info->memory_bytes), "diskBytes",
        (json_int_t) info->disk_bytes, "memoryBytes", (json_int_t) info->memory_bytes, "createdAt",
        sbx_api_time (info->created_ms), "labels", labels);
    if (snapshot && info->reason)
        json_object_set_new (snapshot, "reason", json_string (info->reason));
    if (snapshot && info->parent)
        json_object_set_new (snapshot, "parentId", json_string (info->parent));
    if (snapshot && info->hosts.count)
        json_object_set_new (snapshot, "copies", json_integer ((json_int_t) info->hosts.count));
    return snapshot;
}

//  A snapshot's label (borrowed), or NULL.
static const char *s_label (const sbx_snapshot_info_t *info, const char *key)
{
    return sbx_strmap_get (&info->labels, key);
}

json_t *sbx_api_templates (const sbx_snapshot_list_ok_t *list)
{
    //  The newest ready snapshot of each name: the account's own first (they shadow the
    //  operator's published ones, as create_sandbox {template} picks).
    json_t *out = json_array ();
    zhashx_t *seen = zhashx_new ();
    for (size_t i = 0; out && seen && i < list->snapshots.count; i++) {
        const sbx_snapshot_info_t *info = &list->snapshots.items[i];
        const char *name = s_label (info, "sbx.template");
        if (!name || !*name || info->state != SBX_SNAPSHOT_STATE_READY ||
            zhashx_lookup (seen, name))
            continue;
        zhashx_insert (seen, name, (void *) name);
        const char *open = s_label (info, "sbx.template.public");
        json_array_append_new (
            out,
            json_pack ("{s:s, s:s, s:s, s:I, s:o, s:b, s:b}", "name", name, "snapshotId", info->id,
                       "type", info->type ? sbx_sandbox_type_name (info->type) : "small",
                       "sizeBytes", (json_int_t) (info->disk_bytes + info->memory_bytes),
                       "createdAt", sbx_api_time (info->created_ms), "published",
                       open && streq (open, "true"), "own", i < list->own));
    }
    zhashx_destroy (&seen);
    return json_pack ("{s:o}", "templates", out);
}

json_t *sbx_api_webhook (const sbx_webhook_info_t *info)
{
    if (!info)
        return NULL;
    json_t *events = json_array ();
    for (size_t i = 0; i < info->events.count; i++)
        json_array_append_new (events, json_string (info->events.items[i]));
    return json_pack ("{s:s, s:s, s:o, s:o, s:I, s:I, s:I}", "id", info->webhook_id, "url",
                      info->url, "events", events, "createdAt", sbx_api_time (info->created_ms),
                      "delivered", (json_int_t) info->delivered, "failed",
                      (json_int_t) info->failed, "pending", (json_int_t) info->pending);
}

const char *sbx_api_bytes (uint64_t bytes, char *buf, size_t size)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double) bytes;
    size_t unit = 0;
    while (value >= 1024 && unit < 4) {
        value /= 1024;
        unit++;
    }
    snprintf (buf, size, unit && value < 10 ? "%.1f %s" : "%.0f %s", value, units[unit]);
    return buf;
}

json_t *sbx_api_time (uint64_t ms)
{
    if (!ms)
        return json_null ();
    char buf[32];
    sbx_clock_iso8601 (ms, buf, sizeof buf);
    //  Seconds are enough for people: "2026-10-27T02:26:10Z".
    char *dot = strchr (buf, '.');
    if (dot)
        strcpy (dot, "Z");
    return json_string (buf);
}

//  Output that is not text must never break the answer.
json_t *sbx_api_text (const uint8_t *data, size_t size)
{
    if (!data || !size)
        return json_string ("");
    json_t *text = json_stringn ((const char *) data, size);
    if (text)
        return text;
    char *out = malloc (size * 3 + 1);
    if (!out)
        return json_string ("");
    size_t o = 0;
    for (size_t i = 0; i < size;) {
        uint8_t c = data[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= size && (n != 1 || c != 0);
        for (size_t k = 1; ok && k < n; k++)
            ok = (data[i + k] & 0xc0) == 0x80;
        if (ok && n > 1) {
            //  Overlong forms, surrogates: let jansson judge.
            json_t *probe = json_stringn ((const char *) data + i, n);
            ok = probe != NULL;
            json_decref (probe);
        }
        if (ok) {
            memcpy (out + o, data + i, n);
            o += n;
            i += n;
        } else {
            memcpy (out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    text = json_stringn (out, o);
    free (out);
    return text ? text : json_string ("");
}

char *sbx_api_url (sbx_api_t *self, const char *label)
{
    char *url;
    if (asprintf (&url, "%s://%s%s", self->tls ? "https" : "http", label ? label : "-",
                  self->box_suffix) < 0)
        return NULL;
    return url;
}

json_t *sbx_api_sandbox (sbx_api_t *self, const sbx_sandbox_info_t *s)
{
    json_t *labels = json_object ();
    for (size_t i = 0; i < s->labels.count; i++)
        json_object_set_new (labels, s->labels.keys[i], json_string (s->labels.values[i]));
    char *url = sbx_api_url (self, s->label);
    json_t *json =
        json_pack ("{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:b, s:o, s:o, s:o}", "id", s->id, "name",
                   s->name ? s->name : (s->label ? s->label : s->id), "label",
                   s->label ? s->label : "", "state", sbx_sandbox_state_name (s->state), "type",
                   sbx_sandbox_type_name (s->type), "url", url ? url : "", "network",
                   !s->no_network, "autoResume", !s->no_auto_resume, "labels", labels, "createdAt",
                   sbx_api_time (s->created_ms), "expiresAt", sbx_api_time (s->expires_ms));
    if (json) {
        //  Always there (both lists empty: no rules of its own), so a client reads it
        //  without looking first.
        json_t *allow = json_array (), *deny = json_array ();
        for (size_t i = 0; i < s->egress_allow.count; i++)
            json_array_append_new (allow, json_string (s->egress_allow.items[i]));
        for (size_t i = 0; i < s->egress_deny.count; i++)
            json_array_append_new (deny, json_string (s->egress_deny.items[i]));
        json_object_set_new (json, "egress",
                             json_pack ("{s:o, s:o}", "allow", allow, "deny", deny));
    }
    if (json && s->reason)
        json_object_set_new (json, "reason", json_string (s->reason));
    //  Published ports, each with its URL (https://<label>-<port>.box.<domain>).
    if (json && s->ports.count) {
        json_t *ports = json_array ();
        for (size_t i = 0; i < s->ports.count; i++) {
            char host[96];
            snprintf (host, sizeof host, "%s-%llu", s->label ? s->label : "-",
                      (unsigned long long) s->ports.items[i].port);
            char *port_url = sbx_api_url (self, host);
            json_array_append_new (ports, json_pack ("{s:I, s:s, s:b}", "port",
                                                     (json_int_t) s->ports.items[i].port, "url",
                                                     port_url ? port_url : "", "public",
                                                     s->ports.items[i].public));
            free (port_url);
        }
        json_object_set_new (json, "ports", ports);
    }
    free (url);
    return json;
}

static const struct {
    const char *name;
    int number;
} s_signals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                 {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"STOP", SIGSTOP},
                 {"CONT", SIGCONT}, {"ABRT", SIGABRT}, {"ALRM", SIGALRM}, {NULL, 0}};

int sbx_api_signal_number (json_t *value)
{
    if (!value || json_is_null (value))
        return SIGTERM;
    if (json_is_integer (value)) {
        json_int_t n = json_integer_value (value);
        return n >= 1 && n <= 64 ? (int) n : -1;
    }
    if (!json_is_string (value))
        return -1;
    const char *text = json_string_value (value);
    char *end;
    long n = strtol (text, &end, 10);
    if (*text && !*end)
        return n >= 1 && n <= 64 ? (int) n : -1;
    if (strncasecmp (text, "SIG", 3) == 0)
        text += 3;
    for (int i = 0; s_signals[i].name; i++)
        if (strcasecmp (text, s_signals[i].name) == 0)
            return s_signals[i].number;
    return -1;
}

const char *sbx_api_signal_name (int number)
{
    for (int i = 0; s_signals[i].name; i++)
        if (s_signals[i].number == number)
            return s_signals[i].name;
    return NULL;
}

//  --------------------------------------------------------------------------
//  Requests: an operation's checked arguments → its message

const char *sbx_api_sandbox_id (json_t *args)
{
    json_t *v = args ? json_object_get (args, "sandboxId") : NULL;
    return json_is_string (v) && *json_string_value (v) ? json_string_value (v) : NULL;
}

static void s_strmap (sbx_strmap_t *map, sbx_strlist_t *remove, json_t *object)
{
    const char *key;
    json_t *value;
    json_object_foreach (object, key, value)
    {
        if (json_is_string (value))
            sbx_strmap_set (map, key, json_string_value (value));
        else if (remove && json_is_null (value))
            sbx_strlist_append (remove, key);
    }
}

static int s_refuse (char *why, size_t why_size, const char *text)
{
    snprintf (why, why_size, "%s", text);
    return -1;
}

//  The egress argument ({allow, deny}) into the message's two lists, each entry checked
//  as the broker and vmd will read it (sbx_egress), so a bad one is refused here with
//  its place and reason, and written in its canonical form. The operation table checks
//  only that it is an object. A list left out is empty. 0, or -1 with why.
static int s_egress (json_t *egress, sbx_strlist_t *allow, sbx_strlist_t *deny, char *why,
                     size_t why_size)
{
    const char *key;
    json_t *value;
    json_object_foreach (egress, key, value)
    {
        if (!streq (key, "allow") && !streq (key, "deny")) {
            snprintf (why, why_size, "unknown field \"egress.%.60s\" (egress takes: allow, deny)",
                      key);
            return -1;
        }
        if (!json_is_array (value)) {
            snprintf (why, why_size, "egress.%s must be an array of strings", key);
            return -1;
        }
        if (json_array_size (value) > SBX_EGRESS_MAX) {
            snprintf (why, why_size, "egress.%s has %zu entries; at most %d", key,
                      json_array_size (value), SBX_EGRESS_MAX);
            return -1;
        }
        sbx_strlist_t *list = streq (key, "allow") ? allow : deny;
        size_t i;
        json_t *item;
        json_array_foreach (value, i, item)
        {
            if (!json_is_string (item) ||
                strlen (json_string_value (item)) != json_string_length (item)) {
                snprintf (why, why_size, "egress.%s[%zu] must be a string", key, i);
                return -1;
            }
            if (sbx_strlist_append (list, json_string_value (item)))
                return s_refuse (why, why_size, "out of memory");
        }
        if (sbx_egress_check (key, list->items, list->count, why, why_size))
            return -1;
        //  Kept and answered as the rules read ("*.PyPI.org" is pypi.org, an address a /32).
        for (size_t k = 0; k < list->count; k++) {
            sbx_egress_entry_t entry;
            if (sbx_egress_parse (list->items[k], &entry, NULL, 0) == 0)
                sbx_str_set (&list->items[k], entry.text);
        }
    }
    return 0;
}

sbx_msg_t *sbx_api_request (sbx_op_t op, json_t *args, const char *account, bool *agent,
                            uint32_t *deadline_ms, char *why, size_t why_size)
{
    assert ((unsigned) op < SBX_OP__COUNT && agent && deadline_ms);
    *agent = false;
    *deadline_ms = sbx_ops[op].deadline_ms;
    if (sbx_ops[op].message == SBX_MSG__UNKNOWN || op == SBX_OP_READ_FILE ||
        op == SBX_OP_WRITE_FILE) {
        s_refuse (why, why_size, "this operation has no single request");
        return NULL;
    }
    sbx_msg_t *msg = sbx_msg_new (sbx_ops[op].message);
    if (!msg) {
        s_refuse (why, why_size, "out of memory");
        return NULL;
    }
    const char *sandbox_id = sbx_api_sandbox_id (args);
    //  Every message about one sandbox carries it as its subject (sbx_msg_gen).
    if (sandbox_id && op != SBX_OP_LIST_SNAPSHOTS && op != SBX_OP_GET_USAGE)
        sbx_msg_set_subject (msg, sandbox_id);
    switch (op) {
    case SBX_OP_CREATE_SANDBOX: {
        sbx_sandbox_create_t *m = sbx_msg_sandbox_create (msg);
        const char *snapshot = sbx_args_string (op, args, "snapshotId");
        sbx_str_set (&m->name, sbx_args_string (op, args, "name"));
        sbx_sandbox_type_from_name (sbx_args_string (op, args, "type"), &m->type);
        m->ttl_s = (uint64_t) sbx_args_int (op, args, "ttlSeconds");
        m->no_network = !sbx_args_bool (op, args, "network");
        m->no_auto_resume = !sbx_args_bool (op, args, "autoResume");
        sbx_str_set (&m->snapshot_id, snapshot && *snapshot ? snapshot : NULL);
        const char *template = sbx_args_string (op, args, "template");
        if (template && *template && m->snapshot_id) {
            s_refuse (why, why_size,
                      "give snapshotId or template, not both: a template is a snapshot too");
            sbx_msg_destroy (&msg);
            return NULL;
        }
        sbx_str_set (&m->template, template && *template ? template : NULL);
        s_strmap (&m->labels, NULL, sbx_args_object (args, "labels"));
        json_t *egress = sbx_args_object (args, "egress");
        if (egress && s_egress (egress, &m->egress_allow, &m->egress_deny, why, why_size)) {
            sbx_msg_destroy (&msg);
            return NULL;
        }
        break;
    }
    case SBX_OP_EXEC: {
        sbx_agent_exec_t *m = sbx_msg_agent_exec (msg);
        bool detached = sbx_args_bool (op, args, "detached");
        int64_t timeout = sbx_args_int (op, args, "timeout");
        sbx_str_set (&m->command, sbx_args_string (op, args, "command"));
        sbx_str_set (&m->cwd, sbx_args_string (op, args, "cwd"));
        s_strmap (&m->env, NULL, sbx_args_object (args, "env"));
        const char *in = sbx_args_string (op, args, "stdin");
        const char *in_encoding = sbx_args_string (op, args, "stdinEncoding");
        if (in && in_encoding && streq (in_encoding, "base64")) {
            size_t size = 0;
            uint8_t *bytes = *in ? sbx_secret_base64_decode (in, &size) : calloc (1, 1);
            if (!bytes) {
                s_refuse (why, why_size, "stdin is not valid base64 (stdinEncoding base64)");
                sbx_msg_destroy (&msg);
                return NULL;
            }
            sbx_bytes_set (&m->stdin, bytes, size);
            free (bytes);
        } else if (in)
            sbx_bytes_set (&m->stdin, in, json_string_length (json_object_get (args, "stdin")));
        m->detached = detached;
        m->timeout_ms = detached ? 0 : (uint64_t) timeout * 1000;
        m->max_bytes = SBX_API_OUTPUT_MAX;
        if (!detached)
            *deadline_ms = (uint32_t) timeout * 1000 + SBX_API_EXEC_MARGIN_MS;
        *agent = true;
        break;
    }
    case SBX_OP_OPEN_TERMINAL: {
        //  A login shell unless told otherwise: bash where the template has it.
        sbx_agent_exec_t *m = sbx_msg_agent_exec (msg);
        const char *command = sbx_args_string (op, args, "command");
        sbx_str_set (&m->command, command && *command ? command
                                                      : "command -v bash >/dev/null && exec bash "
                                                        "-l; exec sh -l");
        sbx_str_set (&m->cwd, sbx_args_string (op, args, "cwd"));
        m->pty = true;
        m->detached = true;
        m->cols = (uint64_t) sbx_args_int (op, args, "cols");
        m->rows = (uint64_t) sbx_args_int (op, args, "rows");
        *agent = true;
        break;
    }
    case SBX_OP_COMMAND_STATUS: {
        sbx_agent_status_t *m = sbx_msg_agent_status (msg);
        m->pid = (uint64_t) sbx_args_int (op, args, "processId");
        m->stdout_offset = (uint64_t) sbx_args_int (op, args, "stdoutOffset");
        m->stderr_offset = (uint64_t) sbx_args_int (op, args, "stderrOffset");
        m->max_bytes = SBX_API_OUTPUT_MAX;
        //  Held by the agent until output comes (within the operation's 30 s deadline).
        m->wait_ms = (uint64_t) sbx_args_int (op, args, "waitSeconds") * 1000;
        *agent = true;
        break;
    }
    case SBX_OP_KILL_COMMAND: {
        int signal = sbx_api_signal_number (json_object_get (args, "signal"));
        if (signal < 0) {
            s_refuse (why, why_size,
                      "signal is a name such as SIGTERM or SIGKILL, or a number from 1 to 64");
            sbx_msg_destroy (&msg);
            return NULL;
        }
        sbx_msg_agent_kill (msg)->pid = (uint64_t) sbx_args_int (op, args, "processId");
        sbx_msg_agent_kill (msg)->signal = signal;
        *agent = true;
        break;
    }
    case SBX_OP_LIST_COMMANDS:
        *agent = true;
        break;
    case SBX_OP_HOST_PORT:
    case SBX_OP_UNPUBLISH_PORT: {
        sbx_sandbox_port_t *m = sbx_msg_sandbox_port (msg);
        m->port = (uint64_t) sbx_args_int (op, args, "port");
        m->public = op == SBX_OP_HOST_PORT && sbx_args_bool (op, args, "public");
        m->remove = op == SBX_OP_UNPUBLISH_PORT || sbx_args_bool (op, args, "remove");
        break;
    }
    case SBX_OP_GET_SANDBOX_METRICS: {
        sbx_sandbox_metrics_t *m = sbx_msg_sandbox_metrics (msg);
        m->since_ms = (uint64_t) sbx_args_int (op, args, "sinceMs");
        m->limit = (uint64_t) sbx_args_int (op, args, "limit");
        break;
    }
    case SBX_OP_EXTEND_SANDBOX:
        sbx_msg_sandbox_extend (msg)->ttl_s = (uint64_t) sbx_args_int (op, args, "ttlSeconds");
        break;
    case SBX_OP_RENAME_SANDBOX:
    case SBX_OP_LABEL_SANDBOX:
    case SBX_OP_UPDATE_SANDBOX:
    case SBX_OP_SET_SANDBOX_EGRESS: {
        sbx_sandbox_update_t *m = sbx_msg_sandbox_update (msg);
        const char *name = sbx_args_string (op, args, "name");
        json_t *labels = sbx_args_object (args, "labels");
        json_t *wake = op == SBX_OP_UPDATE_SANDBOX ? json_object_get (args, "autoResume") : NULL;
        json_t *egress = sbx_args_object (args, "egress");
        if (!name && !labels && !json_is_boolean (wake) && !egress) {
            s_refuse (why, why_size,
                      op == SBX_OP_UPDATE_SANDBOX
                          ? "give name, labels, autoResume, egress or several"
                      : op == SBX_OP_SET_SANDBOX_EGRESS ? "egress is required"
                                                        : "give name, labels or both");
            sbx_msg_destroy (&msg);
            return NULL;
        }
        //  egress replaces both lists: {"allow": [], "deny": []} clears them.
        m->egress_set = egress != NULL;
        if (egress && s_egress (egress, &m->egress_allow, &m->egress_deny, why, why_size)) {
            sbx_msg_destroy (&msg);
            return NULL;
        }
        if (json_is_boolean (wake))
            m->auto_resume = json_is_true (wake) ? SBX_TOGGLE_ON : SBX_TOGGLE_OFF;
        sbx_str_set (&m->name, name);
        s_strmap (&m->labels, &m->remove_labels, labels);
        break;
    }
    case SBX_OP_FORK_SANDBOX:
        sbx_msg_sandbox_fork (msg)->count = (uint64_t) sbx_args_int (op, args, "count");
        break;
    case SBX_OP_SAVE_SNAPSHOT: {
        sbx_snapshot_save_t *m = sbx_msg_snapshot_save (msg);
        sbx_str_set (&m->name, sbx_args_string (op, args, "name"));
        s_strmap (&m->labels, NULL, sbx_args_object (args, "labels"));
        break;
    }
    case SBX_OP_GET_SNAPSHOT:
        sbx_str_set (&sbx_msg_snapshot_get (msg)->snapshot_id,
                     sbx_args_string (op, args, "snapshotId"));
        break;
    case SBX_OP_DELETE_SNAPSHOT:
        sbx_str_set (&sbx_msg_snapshot_delete (msg)->snapshot_id,
                     sbx_args_string (op, args, "snapshotId"));
        break;
    case SBX_OP_GET_USAGE:
        sbx_str_set (&sbx_msg_usage_get (msg)->account, account);
        sbx_str_set (&sbx_msg_usage_get (msg)->sandbox_id, sandbox_id);
        break;
    case SBX_OP_LIST_KEYS:
        sbx_str_set (&sbx_msg_key_list (msg)->account, account);
        break;
    case SBX_OP_REVOKE_KEY:
        sbx_str_set (&sbx_msg_key_revoke (msg)->key_id, sbx_args_string (op, args, "keyId"));
        break;
    case SBX_OP_CREATE_WEBHOOK: {
        sbx_webhook_create_t *m = sbx_msg_webhook_create (msg);
        sbx_str_set (&m->url, sbx_args_string (op, args, "url"));
        json_t *events = json_object_get (args, "events");
        size_t i;
        json_t *item;
        json_array_foreach (events, i, item)
        {
            sbx_strlist_append (&m->events, json_string_value (item));
        }
        break;
    }
    case SBX_OP_GET_WEBHOOK:
        sbx_str_set (&sbx_msg_webhook_get (msg)->webhook_id,
                     sbx_args_string (op, args, "webhookId"));
        break;
    case SBX_OP_DELETE_WEBHOOK:
        sbx_str_set (&sbx_msg_webhook_delete (msg)->webhook_id,
                     sbx_args_string (op, args, "webhookId"));
        break;
    case SBX_OP_LIST_WEBHOOK_DELIVERIES:
        sbx_str_set (&sbx_msg_webhook_deliveries (msg)->webhook_id,
                     sbx_args_string (op, args, "webhookId"));
        sbx_msg_webhook_deliveries (msg)->limit = (uint64_t) sbx_args_int (op, args, "limit");
        break;
    case SBX_OP_LIST_SANDBOXES:
        sbx_msg_sandbox_list (msg)->limit = (uint64_t) sbx_args_int (op, args, "limit");
        sbx_str_set (&sbx_msg_sandbox_list (msg)->cursor, sbx_args_string (op, args, "cursor"));
        break;
    case SBX_OP_LIST_WEBHOOKS:
    case SBX_OP_GET_SANDBOX:
    case SBX_OP_STOP_SANDBOX:
    case SBX_OP_RESUME_SANDBOX:
    case SBX_OP_DELETE_SANDBOX:
    case SBX_OP_LIST_SNAPSHOTS:
        break; //  the subject, or nothing, is all they carry
    case SBX_OP_LIST_TEMPLATES:
        sbx_msg_snapshot_list (msg)->published = true;
        break;
    case SBX_OP_READ_FILE:
    case SBX_OP_WRITE_FILE:
    case SBX_OP_GET_OPENAPI:
    case SBX_OP_BUILD_TEMPLATE: //  the gateway's (gw_builds)
    case SBX_OP_GET_TEMPLATE_BUILD:
        break; //  refused above
    }
    return msg;
}

//  --------------------------------------------------------------------------
//  Answers: a reply → the operation's output shape

static json_t *s_output (uint64_t pid, bool running, int64_t exit_code, bool timed_out,
                         const sbx_bytes_t *out, const sbx_bytes_t *err, uint64_t out_next,
                         uint64_t err_next, bool out_cut, bool err_cut)
{
    return json_pack (
        "{s:I, s:o, s:o, s:o, s:I, s:I, s:b, s:b, s:b, s:b}", "processId", (json_int_t) pid,
        "exitCode", running ? json_null () : json_integer (exit_code), "stdout",
        sbx_api_text (out->data, out->size), "stderr", sbx_api_text (err->data, err->size),
        "stdoutNextOffset", (json_int_t) out_next, "stderrNextOffset", (json_int_t) err_next,
        "stdoutTruncated", out_cut, "stderrTruncated", err_cut, "timedOut", timed_out, "running",
        running);
}

static json_t *s_usage (const sbx_usage_get_ok_t *ok)
{
    json_t *sandboxes = json_array ();
    for (size_t i = 0; i < ok->sandboxes.count; i++) {
        sbx_usage_sandbox_t *u = &ok->sandboxes.items[i];
        json_array_append_new (sandboxes,
                               json_pack ("{s:s, s:s, s:I, s:I, s:b}", "id", u->sandbox_id, "type",
                                          u->type ? sbx_sandbox_type_name (u->type) : "small",
                                          "runningSeconds", (json_int_t) u->seconds, "costMicroUsd",
                                          (json_int_t) u->micro_usd, "running", u->running));
    }
    json_t *days = json_array ();
    for (size_t i = 0; i < ok->days.count; i++)
        json_array_append_new (
            days, json_pack ("{s:s, s:I, s:I}", "day", ok->days.items[i].day, "runningSeconds",
                             (json_int_t) ok->days.items[i].seconds, "costMicroUsd",
                             (json_int_t) ok->days.items[i].micro_usd));
    json_t *wallets = json_array ();
    for (size_t i = 0; i < ok->wallets.count; i++)
        json_array_append_new (wallets,
                               json_pack ("{s:s, s:I, s:b}", "name", ok->wallets.items[i].name,
                                          "balanceMicroUsd",
                                          (json_int_t) ok->wallets.items[i].balance_micro_usd,
                                          "active", ok->wallets.items[i].active));
    return json_pack (
        "{s:s, s:I, s:I, s:I, s:o, s:o, s:o}", "accountId", ok->account_id ? ok->account_id : "",
        "runningSeconds", (json_int_t) (ok->running_ms / 1000), "costMicroUsd",
        (json_int_t) ok->micro_usd, "balanceMicroUsd", (json_int_t) ok->balance_micro_usd,
        "wallets", wallets, "sandboxes", sandboxes, "days", days);
}

//  A sample's figures, under the names every sample and the answer's latest share.
static void s_figures (json_t *into, const sbx_metrics_sample_t *s)
{
    json_object_set_new (into, "cpuPercent", json_real ((double) s->cpu_permille / 10.0));
    json_object_set_new (into, "memoryUsedBytes", json_integer ((json_int_t) s->memory_used_bytes));
    json_object_set_new (into, "memoryTotalBytes",
                         json_integer ((json_int_t) s->memory_total_bytes));
    json_object_set_new (into, "diskUsedBytes", json_integer ((json_int_t) s->disk_used_bytes));
    json_object_set_new (into, "diskTotalBytes", json_integer ((json_int_t) s->disk_total_bytes));
    json_object_set_new (into, "networkInBytes", json_integer ((json_int_t) s->net_rx_bytes));
    json_object_set_new (into, "networkOutBytes", json_integer ((json_int_t) s->net_tx_bytes));
}

//  get_sandbox_metrics: the latest sample's figures at the top (zeros before the first),
//  and the series, oldest first.
static json_t *s_metrics (const sbx_sandbox_metrics_ok_t *ok)
{
    static const sbx_metrics_sample_t none = {0};
    const sbx_metrics_sample_list_t *list = &ok->samples;
    const sbx_metrics_sample_t *last = list->count ? &list->items[list->count - 1] : &none;
    json_t *samples = json_array ();
    for (size_t i = 0; i < list->count; i++) {
        json_t *sample = json_pack ("{s:o, s:I}", "time", sbx_api_time (list->items[i].time_ms),
                                    "timeMs", (json_int_t) list->items[i].time_ms);
        s_figures (sample, &list->items[i]);
        json_array_append_new (samples, sample);
    }
    uint64_t span = list->count ? (last->time_ms - list->items[0].time_ms) / 1000 : 0;
    json_t *answer =
        json_pack ("{s:s, s:s, s:I, s:b, s:f, s:o, s:I, s:o}", "sandboxId",
                   ok->sandbox_id ? ok->sandbox_id : "", "state",
                   ok->state ? sbx_sandbox_state_name (ok->state) : "ready", "vcpus",
                   (json_int_t) ok->vcpus, "sampling", ok->interval_ms > 0, "intervalSeconds",
                   (double) ok->interval_ms / 1000.0, "sampledAt", sbx_api_time (last->time_ms),
                   "spanSeconds", (json_int_t) span, "samples", samples);
    if (answer)
        s_figures (answer, last);
    return answer;
}

json_t *sbx_api_key (const sbx_key_info_t *k)
{
    json_t *key = json_pack ("{s:s, s:s}", "id", k->key_id ? k->key_id : "", "kind",
                             sbx_key_kind_name (k->kind));
    //  Absent rather than null: a connection has no preset, a key may have no name.
    if (k->name)
        json_object_set_new (key, "name", json_string (k->name));
    if (k->kind != SBX_KEY_KIND_CONNECTION)
        json_object_set_new (key, "preset", json_string (sbx_key_preset_name (k->preset)));
    if (k->prefix)
        json_object_set_new (key, "prefix", json_string (k->prefix));
    json_object_set_new (key, "revoked", json_boolean (k->revoked));
    const uint64_t times[] = {k->created_ms, k->last_used_ms, k->expires_ms};
    const char *names[] = {"createdAt", "lastUsedAt", "expiresAt"};
    for (size_t t = 0; t < 3; t++) {
        char iso[40];
        sbx_clock_iso8601 (times[t], iso, sizeof iso);
        json_object_set_new (key, names[t], times[t] ? json_string (iso) : json_null ());
    }
    return key;
}

json_t *sbx_api_answer (sbx_api_t *self, sbx_op_t op, json_t *args, sbx_msg_t *reply, char *why,
                        size_t why_size)
{
    assert (self);
    sbx_msg_type_t want =
        (unsigned) op < SBX_OP__COUNT ? sbx_msg_type_reply (sbx_ops[op].message) : SBX_MSG__UNKNOWN;
    if (!reply || want == SBX_MSG__UNKNOWN || reply->type != want) {
        snprintf (why, why_size, "unexpected answer %s to %s",
                  reply ? sbx_msg_type_name (reply->type) : "(none)",
                  (unsigned) op < SBX_OP__COUNT ? sbx_ops[op].name : "?");
        return NULL;
    }
    switch (op) {
    case SBX_OP_CREATE_SANDBOX:
    case SBX_OP_GET_SANDBOX:
    case SBX_OP_STOP_SANDBOX:
    case SBX_OP_RESUME_SANDBOX:
    case SBX_OP_EXTEND_SANDBOX:
    case SBX_OP_RENAME_SANDBOX:
    case SBX_OP_LABEL_SANDBOX:
    case SBX_OP_UPDATE_SANDBOX:
    case SBX_OP_SET_SANDBOX_EGRESS:
    case SBX_OP_DELETE_SANDBOX: {
        sbx_sandbox_info_t *info = sbx_api_sandbox_info (reply);
        if (!info)
            break;
        json_t *sandbox = sbx_api_sandbox (self, info);
        const char *note =
            op == SBX_OP_CREATE_SANDBOX ? sbx_msg_sandbox_create_ok (reply)->note : NULL;
        if (note && *note) //  from a snapshot's disk only: say so
            json_object_set_new (sandbox, "note", json_string (note));
        return sandbox;
    }
    case SBX_OP_LIST_SANDBOXES: {
        sbx_sandbox_info_list_t *list = &sbx_msg_sandbox_list_ok (reply)->sandboxes;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (all, sbx_api_sandbox (self, &list->items[i]));
        const char *next = sbx_msg_sandbox_list_ok (reply)->next_cursor;
        return next && *next ? json_pack ("{s:o, s:s}", "sandboxes", all, "nextCursor", next)
                             : json_pack ("{s:o}", "sandboxes", all);
    }
    case SBX_OP_EXEC: {
        sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
        return s_output (ok->pid, ok->running, ok->exit_code, ok->timed_out, &ok->stdout,
                         &ok->stderr, ok->stdout_next_offset, ok->stderr_next_offset,
                         ok->stdout_truncated, ok->stderr_truncated);
    }
    case SBX_OP_COMMAND_STATUS: {
        sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (reply);
        return s_output (
            (uint64_t) sbx_args_int (op, args, "processId"), ok->running, ok->exit_code,
            ok->timed_out, &ok->stdout, &ok->stderr, ok->stdout_next_offset, ok->stderr_next_offset,
            ok->stdout_truncated || ok->stdout_more, ok->stderr_truncated || ok->stderr_more);
    }
    case SBX_OP_LIST_COMMANDS: {
        sbx_agent_proc_list_t *list = &sbx_msg_agent_ps_ok (reply)->processes;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++) {
            sbx_agent_proc_t *p = &list->items[i];
            //  The guest's words: valid UTF-8 or it could not be JSON.
            const char *command = p->command ? p->command : "";
            json_t *process = json_pack (
                "{s:I, s:o, s:b, s:b, s:o, s:o, s:b, s:o, s:o}", "processId", (json_int_t) p->pid,
                "command", sbx_api_text ((const uint8_t *) command, strlen (command)), "running",
                p->running, "detached", p->detached, "exitCode",
                p->running ? json_null () : json_integer (p->exit_code), "signal",
                p->running || !p->signal ? json_null () : json_integer (p->signal), "timedOut",
                p->timed_out, "startedAt", sbx_api_time (p->started_ms), "endedAt",
                p->running ? json_null () : sbx_api_time (p->ended_ms));
            json_array_append_new (all, process);
        }
        return json_pack ("{s:o}", "processes", all);
    }
    case SBX_OP_GET_SANDBOX_METRICS:
        return s_metrics (sbx_msg_sandbox_metrics_ok (reply));
    case SBX_OP_KILL_COMMAND:
        return json_pack ("{s:I, s:i}", "processId",
                          (json_int_t) sbx_args_int (op, args, "processId"), "signal",
                          sbx_api_signal_number (json_object_get (args, "signal")));
    case SBX_OP_HOST_PORT:
    case SBX_OP_UNPUBLISH_PORT: {
        sbx_sandbox_port_ok_t *ok = sbx_msg_sandbox_port_ok (reply);
        char host[96];
        snprintf (host, sizeof host, "%s-%llu",
                  ok->sandbox && ok->sandbox->label ? ok->sandbox->label : "-",
                  (unsigned long long) ok->port);
        char *url = sbx_api_url (self, host);
        json_t *port = json_pack ("{s:I, s:s, s:b}", "port", (json_int_t) ok->port, "url",
                                  url ? url : "", "public", ok->public);
        if (ok->removed)
            json_object_set_new (port, "removed", json_true ());
        free (url);
        return port;
    }
    case SBX_OP_FORK_SANDBOX: {
        sbx_sandbox_fork_ok_t *ok = sbx_msg_sandbox_fork_ok (reply);
        json_t *copies = json_array ();
        for (size_t i = 0; i < ok->sandboxes.count; i++)
            json_array_append_new (copies, sbx_api_sandbox (self, &ok->sandboxes.items[i]));
        json_t *fork = json_pack ("{s:s, s:o, s:I, s:I}", "sourceId", ok->sandbox->id, "sandboxes",
                                  copies, "pausedMs", (json_int_t) ok->paused_ms, "captureMs",
                                  (json_int_t) ok->capture_ms);
        if (fork && ok->snapshot_id)
            json_object_set_new (fork, "snapshotId", json_string (ok->snapshot_id));
        return fork;
    }
    case SBX_OP_SAVE_SNAPSHOT:
        return sbx_api_snapshot (sbx_msg_snapshot_save_ok (reply)->snapshot);
    case SBX_OP_GET_SNAPSHOT:
        return sbx_api_snapshot (sbx_msg_snapshot_get_ok (reply)->snapshot);
    case SBX_OP_DELETE_SNAPSHOT:
        return sbx_api_snapshot (sbx_msg_snapshot_delete_ok (reply)->snapshot);
    case SBX_OP_LIST_SNAPSHOTS: {
        sbx_snapshot_info_list_t *list = &sbx_msg_snapshot_list_ok (reply)->snapshots;
        const char *from = sbx_api_sandbox_id (args);
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            if (!from || (list->items[i].sandbox_id && streq (list->items[i].sandbox_id, from)))
                json_array_append_new (all, sbx_api_snapshot (&list->items[i]));
        return json_pack ("{s:o}", "snapshots", all);
    }
    case SBX_OP_GET_USAGE:
        return s_usage (sbx_msg_usage_get_ok (reply));
    case SBX_OP_LIST_KEYS: {
        sbx_key_info_list_t *list = &sbx_msg_key_list_ok (reply)->keys;
        json_t *keys = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (keys, sbx_api_key (&list->items[i]));
        return json_pack ("{s:o}", "keys", keys);
    }
    case SBX_OP_REVOKE_KEY:
        return json_pack ("{s:s, s:b}", "id", sbx_args_string (op, args, "keyId"), "revoked", true);
    case SBX_OP_CREATE_WEBHOOK: {
        sbx_webhook_create_ok_t *ok = sbx_msg_webhook_create_ok (reply);
        json_t *hook = sbx_api_webhook (ok->webhook);
        json_object_set_new (hook, "secret", json_string (ok->secret));
        return hook;
    }
    case SBX_OP_GET_WEBHOOK:
        return sbx_api_webhook (sbx_msg_webhook_get_ok (reply)->webhook);
    case SBX_OP_LIST_WEBHOOKS: {
        sbx_webhook_info_list_t *list = &sbx_msg_webhook_list_ok (reply)->webhooks;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++)
            json_array_append_new (all, sbx_api_webhook (&list->items[i]));
        return json_pack ("{s:o}", "webhooks", all);
    }
    case SBX_OP_DELETE_WEBHOOK:
        return json_pack ("{s:s, s:b}", "id", sbx_msg_webhook_delete_ok (reply)->webhook_id,
                          "deleted", true);
    case SBX_OP_LIST_WEBHOOK_DELIVERIES: {
        sbx_webhook_delivery_list_t *list = &sbx_msg_webhook_deliveries_ok (reply)->deliveries;
        json_t *all = json_array ();
        for (size_t i = 0; i < list->count; i++) {
            sbx_webhook_delivery_t *d = &list->items[i];
            json_array_append_new (
                all, json_pack (
                         "{s:s, s:s, s:s, s:I, s:o, s:o, s:o, s:o, s:o}", "eventId", d->event_id,
                         "eventType", d->event_type, "state", d->state, "attempts",
                         (json_int_t) d->attempts, "statusCode",
                         d->status_code ? json_integer ((json_int_t) d->status_code) : json_null (),
                         "lastError", d->last_error ? json_string (d->last_error) : json_null (),
                         "createdAt", sbx_api_time (d->created_ms), "nextAttemptAt",
                         sbx_api_time (streq (d->state, "pending") ? d->next_ms : 0), "doneAt",
                         sbx_api_time (d->done_ms)));
        }
        return json_pack ("{s:o}", "deliveries", all);
    }
    case SBX_OP_LIST_TEMPLATES:
        return sbx_api_templates (sbx_msg_snapshot_list_ok (reply));
    case SBX_OP_READ_FILE:
    case SBX_OP_WRITE_FILE:
    case SBX_OP_GET_OPENAPI:
    case SBX_OP_BUILD_TEMPLATE:
    case SBX_OP_GET_TEMPLATE_BUILD:
    case SBX_OP_OPEN_TERMINAL: //  a socket, not an answer (gw_terminal)
        break;
    }
    snprintf (why, why_size, "unexpected answer %s to %s", sbx_msg_type_name (reply->type),
              sbx_ops[op].name);
    return NULL;
}

bool sbx_api_wants_usage (sbx_op_t op)
{
    return op == SBX_OP_GET_SANDBOX || op == SBX_OP_LIST_SANDBOXES;
}

void sbx_api_add_usage (json_t *answer, const sbx_msg_t *usage)
{
    if (!answer || !usage || usage->type != SBX_MSG_USAGE_GET_OK)
        return;
    json_t *sandboxes = json_object_get (answer, "sandboxes");
    const sbx_usage_get_ok_t *ok = sbx_msg_usage_get_ok ((sbx_msg_t *) usage);
    for (size_t i = 0; i < ok->sandboxes.count; i++) {
        const sbx_usage_sandbox_t *u = &ok->sandboxes.items[i];
        json_t *target = NULL;
        if (!sandboxes) {
            if (streq (json_string_value (json_object_get (answer, "id")), u->sandbox_id))
                target = answer;
        } else {
            //  Billing answers a page in its order: the same place first.
            json_t *item = json_array_get (sandboxes, i);
            if (item && streq (json_string_value (json_object_get (item, "id")), u->sandbox_id))
                target = item;
            size_t j;
            json_array_foreach (sandboxes, j, item)
            {
                if (target)
                    break;
                if (streq (json_string_value (json_object_get (item, "id")), u->sandbox_id))
                    target = item;
            }
        }
        if (!target)
            continue;
        char usd[32];
        snprintf (usd, sizeof usd, "%llu.%06llu", (unsigned long long) (u->micro_usd / 1000000),
                  (unsigned long long) (u->micro_usd % 1000000));
        json_object_set_new (target, "runningSeconds", json_integer ((json_int_t) u->seconds));
        json_object_set_new (target, "costMicroUsd", json_integer ((json_int_t) u->micro_usd));
        json_object_set_new (target, "costUsd", json_string (usd));
    }
}

//  --------------------------------------------------------------------------
//  Self test

static json_t *s_args (const char *text)
{
    json_t *args = json_loads (text, 0, NULL);
    assert (args);
    return args;
}

void sbx_api_test (bool verbose)
{
    (void) verbose;
    assert (sbx_api_signal_number (NULL) == SIGTERM);
    json_t *v = json_string ("SIGKILL");
    assert (sbx_api_signal_number (v) == SIGKILL);
    json_decref (v);
    v = json_string ("int");
    assert (sbx_api_signal_number (v) == SIGINT);
    json_decref (v);
    v = json_string ("9");
    assert (sbx_api_signal_number (v) == 9);
    json_decref (v);
    v = json_integer (65);
    assert (sbx_api_signal_number (v) == -1);
    json_decref (v);
    assert (streq (sbx_api_signal_name (SIGTERM), "TERM"));
    assert (sbx_api_signal_name (63) == NULL);
    json_t *lossy = sbx_api_text ((const uint8_t *) "a\xff"
                                                    "b",
                                  3);
    assert (streq (json_string_value (lossy), "a\xef\xbf\xbd"
                                              "b"));
    json_decref (lossy);
    json_t *t = sbx_api_time (1790000000123ULL);
    assert (streq (json_string_value (t), "2026-09-21T14:13:20Z"));
    json_decref (t);
    t = sbx_api_time (0);
    assert (json_is_null (t));
    json_decref (t);

    sbx_api_t *api = sbx_api_new (NULL);
    assert (api);
    char *url = sbx_api_url (api, "calm-brave-otter");
    assert (streq (url, "https://calm-brave-otter.box.localhost"));
    free (url);
    sbx_sandbox_info_t info = {.id = "sb_0123456789",
                               .label = "calm-brave-otter",
                               .state = SBX_SANDBOX_STATE_READY,
                               .type = SBX_SANDBOX_TYPE_SMALL,
                               .created_ms = 1790000000123ULL};
    json_t *json = sbx_api_sandbox (api, &info);
    assert (streq (json_string_value (json_object_get (json, "name")), "calm-brave-otter"));
    assert (streq (json_string_value (json_object_get (json, "state")), "ready"));
    assert (json_is_true (json_object_get (json, "network")));
    assert (json_is_null (json_object_get (json, "expiresAt")));
    assert (!json_object_get (json, "reason"));
    //  egress is always there; empty lists: no rules of its own.
    json_t *egress = json_object_get (json, "egress");
    assert (json_array_size (json_object_get (egress, "allow")) == 0);
    assert (json_array_size (json_object_get (egress, "deny")) == 0);
    json_decref (json);
    char *allow_items[] = {"pypi.org", "203.0.113.0/24"};
    info.egress_allow = (sbx_strlist_t){.items = allow_items, .count = 2};
    json = sbx_api_sandbox (api, &info);
    egress = json_object_get (json, "egress");
    assert (streq (json_string_value (json_array_get (json_object_get (egress, "allow"), 1)),
                   "203.0.113.0/24"));
    json_decref (json);
    info.egress_allow = (sbx_strlist_t){0};
    //  Requests from arguments, with the table's defaults.
    char why[300];
    bool agent;
    uint32_t deadline;
    json_t *args = s_args ("{\"name\": \"demo\", \"labels\": {\"team\": \"web\"}}");
    sbx_msg_t *msg =
        sbx_api_request (SBX_OP_CREATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && !agent && deadline == sbx_ops[SBX_OP_CREATE_SANDBOX].deadline_ms);
    sbx_sandbox_create_t *create = sbx_msg_sandbox_create (msg);
    assert (streq (create->name, "demo") && create->ttl_s == 3600 && !create->no_network);
    assert (create->type == SBX_SANDBOX_TYPE_SMALL && create->labels.count == 1);
    assert (!create->no_auto_resume); //  autoResume's default: on
    sbx_msg_destroy (&msg);
    json_decref (args);
    //  autoResume alone is an update; absent, it is left as it is.
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"autoResume\": false}");
    msg = sbx_api_request (SBX_OP_UPDATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_sandbox_update (msg)->auto_resume == SBX_TOGGLE_OFF);
    sbx_msg_destroy (&msg);
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"name\": \"n\"}");
    msg = sbx_api_request (SBX_OP_UPDATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_sandbox_update (msg)->auto_resume == SBX_TOGGLE__UNSET);
    assert (!sbx_msg_sandbox_update (msg)->egress_set); //  absent: egress unchanged
    sbx_msg_destroy (&msg);
    json_decref (args);
    //  egress: at create, and as an update that replaces both lists (a list left out is
    //  empty); every entry checked here, its place and reason in the refusal.
    args = s_args ("{\"egress\": {\"allow\": [\"*.PyPI.org\", \"1.1.1.1\"], \"deny\": []}}");
    msg = sbx_api_request (SBX_OP_CREATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why);
    create = sbx_msg_sandbox_create (msg);
    assert (msg && create->egress_allow.count == 2 && create->egress_deny.count == 0);
    assert (streq (create->egress_allow.items[0], "pypi.org"));
    assert (streq (create->egress_allow.items[1], "1.1.1.1/32"));
    sbx_msg_destroy (&msg);
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"egress\": {\"deny\": [\"x.com\"]}}");
    for (int tool = 0; tool < 2; tool++) {
        sbx_op_t op = tool ? SBX_OP_SET_SANDBOX_EGRESS : SBX_OP_UPDATE_SANDBOX;
        msg = sbx_api_request (op, args, NULL, &agent, &deadline, why, sizeof why);
        sbx_sandbox_update_t *update = sbx_msg_sandbox_update (msg);
        assert (msg && update->egress_set && update->egress_allow.count == 0);
        assert (update->egress_deny.count == 1 && !update->name && !update->labels.count);
        sbx_msg_destroy (&msg);
    }
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"egress\": {}}");
    msg =
        sbx_api_request (SBX_OP_SET_SANDBOX_EGRESS, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_sandbox_update (msg)->egress_set); //  clears both
    sbx_msg_destroy (&msg);
    json_decref (args);
    const struct {
        const char *egress, *why;
    } bad[] = {
        {"{\"allow\": [\"ok.com\", \"1.1.1.1\", \"a..b\"]}",
         "egress.allow[2] (\"a..b\"): a domain name has no empty label"},
        {"{\"deny\": [\"10.0.0.0/33\"]}", "egress.deny[0] (\"10.0.0.0/33\")"},
        {"{\"allow\": \"x.com\"}", "egress.allow must be an array of strings"},
        {"{\"allow\": [7]}", "egress.allow[0] must be a string"},
        {"{\"block\": []}", "unknown field \"egress.block\" (egress takes: allow, deny)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        for (int op = 0; op < 2; op++) {
            char text[200];
            snprintf (text, sizeof text, "{\"sandboxId\": \"sb_0123456789\", \"egress\": %s}",
                      bad[i].egress);
            args = s_args (text);
            why[0] = 0;
            assert (!sbx_api_request (op ? SBX_OP_CREATE_SANDBOX : SBX_OP_UPDATE_SANDBOX, args,
                                      NULL, &agent, &deadline, why, sizeof why));
            if (!strstr (why, bad[i].why))
                fprintf (stderr, "sbx_api: egress %s: got %s\n", bad[i].egress, why);
            assert (strstr (why, bad[i].why));
            json_decref (args);
        }
    }
    args = json_pack ("{s:s, s:{s:[]}}", "sandboxId", "sb_0123456789", "egress", "allow");
    for (int i = 0; i <= SBX_EGRESS_MAX; i++)
        json_array_append_new (json_object_get (json_object_get (args, "egress"), "allow"),
                               json_string ("x.com"));
    assert (
        !sbx_api_request (SBX_OP_UPDATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why));
    assert (streq (why, "egress.allow has 65 entries; at most 64"));
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"command\": \"true\", \"timeout\": 5}");
    msg = sbx_api_request (SBX_OP_EXEC, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && agent && deadline == 5000 + SBX_API_EXEC_MARGIN_MS);
    assert (sbx_msg_agent_exec (msg)->timeout_ms == 5000);
    assert (sbx_msg_agent_exec (msg)->stdin.size == 0); //  none: /dev/null
    sbx_msg_destroy (&msg);
    json_decref (args);
    //  command_status: waitSeconds held by the agent (wait_ms), within the deadline.
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"processId\": 7, \"stdoutOffset\": 3, "
                   "\"waitSeconds\": 5}");
    msg = sbx_api_request (SBX_OP_COMMAND_STATUS, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && agent && deadline > 25000);
    assert (sbx_msg_agent_status (msg)->wait_ms == 5000);
    assert (sbx_msg_agent_status (msg)->stdout_offset == 3);
    sbx_msg_destroy (&msg);
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\", \"processId\": 7}");
    msg = sbx_api_request (SBX_OP_COMMAND_STATUS, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_agent_status (msg)->wait_ms == 0); //  at once by default
    sbx_msg_destroy (&msg);
    json_decref (args);
    //  stdin as text, and as base64 bytes; bad base64 refused.
    args =
        s_args ("{\"sandboxId\": \"sb_0123456789\", \"command\": \"cat\", \"stdin\": \"hi\\n\"}");
    msg = sbx_api_request (SBX_OP_EXEC, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_agent_exec (msg)->stdin.size == 3);
    assert (memcmp (sbx_msg_agent_exec (msg)->stdin.data, "hi\n", 3) == 0);
    sbx_msg_destroy (&msg);
    json_object_set_new (args, "stdin", json_string ("AP8A"));
    json_object_set_new (args, "stdinEncoding", json_string ("base64"));
    msg = sbx_api_request (SBX_OP_EXEC, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && sbx_msg_agent_exec (msg)->stdin.size == 3);
    assert (memcmp (sbx_msg_agent_exec (msg)->stdin.data, "\x00\xff\x00", 3) == 0);
    sbx_msg_destroy (&msg);
    json_object_set_new (args, "stdin", json_string ("!!"));
    assert (!sbx_api_request (SBX_OP_EXEC, args, NULL, &agent, &deadline, why, sizeof why));
    assert (strstr (why, "stdin is not valid base64"));
    json_decref (args);
    args = s_args ("{\"sandboxId\": \"sb_0123456789\"}");
    msg = sbx_api_request (SBX_OP_STOP_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why);
    assert (msg && streq (sbx_msg_subject (msg), "sb_0123456789"));
    sbx_msg_destroy (&msg);
    assert (
        !sbx_api_request (SBX_OP_UPDATE_SANDBOX, args, NULL, &agent, &deadline, why, sizeof why));
    assert (streq (why, "give name, labels, autoResume, egress or several"));
    json_decref (args);
    args = s_args ("{\"processId\": 7, \"signal\": \"SIGNOPE\"}");
    assert (!sbx_api_request (SBX_OP_KILL_COMMAND, args, NULL, &agent, &deadline, why, sizeof why));
    assert (strstr (why, "signal is a name"));
    json_decref (args);
    //  Answers: the reply shaped as the output; a reply of another type is refused.
    sbx_msg_t *reply = sbx_msg_new (SBX_MSG_SANDBOX_GET_OK);
    sbx_msg_sandbox_get_ok (reply)->sandbox = calloc (1, sizeof (sbx_sandbox_info_t));
    sbx_str_set (&sbx_msg_sandbox_get_ok (reply)->sandbox->id, "sb_0123456789");
    sbx_str_set (&sbx_msg_sandbox_get_ok (reply)->sandbox->label, "calm-brave-otter");
    sbx_msg_sandbox_get_ok (reply)->sandbox->state = SBX_SANDBOX_STATE_READY;
    sbx_msg_sandbox_get_ok (reply)->sandbox->type = SBX_SANDBOX_TYPE_SMALL;
    args = s_args ("{}");
    json = sbx_api_answer (api, SBX_OP_GET_SANDBOX, args, reply, why, sizeof why);
    assert (json && streq (json_string_value (json_object_get (json, "url")),
                           "https://calm-brave-otter.box.localhost"));
    assert (!sbx_api_answer (api, SBX_OP_STOP_SANDBOX, args, reply, why, sizeof why));
    assert (strstr (why, "unexpected answer sandbox.get.ok to stop_sandbox"));
    sbx_msg_t *usage = sbx_msg_new (SBX_MSG_USAGE_GET_OK);
    sbx_usage_get_ok_t *u = sbx_msg_usage_get_ok (usage);
    u->sandboxes.items = calloc (1, sizeof (sbx_usage_sandbox_t));
    u->sandboxes.count = 1;
    sbx_str_set (&u->sandboxes.items[0].sandbox_id, "sb_0123456789");
    u->sandboxes.items[0].seconds = 12;
    u->sandboxes.items[0].micro_usd = 1234567;
    sbx_api_add_usage (json, usage);
    assert (json_integer_value (json_object_get (json, "runningSeconds")) == 12);
    assert (streq (json_string_value (json_object_get (json, "costUsd")), "1.234567"));
    sbx_msg_destroy (&usage);
    json_decref (json);
    sbx_msg_destroy (&reply);
    reply = sbx_msg_new (SBX_MSG_AGENT_EXEC_OK);
    sbx_msg_agent_exec_ok (reply)->pid = 9;
    sbx_msg_agent_exec_ok (reply)->running = true;
    json = sbx_api_answer (api, SBX_OP_EXEC, args, reply, why, sizeof why);
    assert (json_is_null (json_object_get (json, "exitCode")));
    assert (json_is_true (json_object_get (json, "running")));
    assert (json_integer_value (json_object_get (json, "processId")) == 9);
    json_decref (json);
    sbx_msg_destroy (&reply);
    //  list_commands: running and finished, and a command that is not UTF-8.
    reply = sbx_msg_new (SBX_MSG_AGENT_PS_OK);
    sbx_agent_proc_list_t *procs = &sbx_msg_agent_ps_ok (reply)->processes;
    sbx_agent_proc_t *p = sbx_agent_proc_list_append (procs);
    p->pid = 7;
    sbx_str_set (&p->command, "sleep 9");
    p->running = true;
    p->started_ms = 1700000000000;
    p = sbx_agent_proc_list_append (procs);
    p->pid = 8;
    sbx_str_set (&p->command, "echo \xff");
    p->exit_code = 137;
    p->signal = 9;
    p->detached = true;
    p->started_ms = 1700000000000;
    p->ended_ms = 1700000001000;
    json = sbx_api_answer (api, SBX_OP_LIST_COMMANDS, args, reply, why, sizeof why);
    json_t *list = json_object_get (json, "processes");
    assert (json_array_size (list) == 2);
    json_t *first = json_array_get (list, 0), *second = json_array_get (list, 1);
    assert (json_is_true (json_object_get (first, "running")));
    assert (json_is_null (json_object_get (first, "exitCode")));
    assert (json_is_null (json_object_get (first, "signal")));
    assert (json_is_null (json_object_get (first, "endedAt")));
    assert (
        streq (json_string_value (json_object_get (first, "startedAt")), "2023-11-14T22:13:20Z"));
    assert (json_integer_value (json_object_get (second, "exitCode")) == 137);
    assert (json_integer_value (json_object_get (second, "signal")) == 9);
    assert (json_is_true (json_object_get (second, "detached")));
    assert (json_is_string (json_object_get (second, "command")));
    json_decref (json);
    sbx_msg_destroy (&reply);
    json_decref (args);
    sbx_api_destroy (&api);
    assert (!api);
}
