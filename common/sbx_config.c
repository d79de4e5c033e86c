/*  sbx_config - see sbx_config.h */
#include "sbx_config.h"
#include "sbx_log.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

//  Every key a process may read, with its default. "%D" stands for the data directory.
//  An unknown key in sbx.conf is a warning (a newer config on an older binary), an
//  unknown key on the command line an error (a typo the operator should see).
//  Each value is checked by its kind (sbx_config_check): a number where the default is
//  one, or the kind given. Files are checked only where the operator brings them (a path
//  that sbx up itself makes, such as its own CA for gateway.oauth_fetch_ca, may not exist
//  yet when it checks).
typedef enum {
    K_ANY,
    K_ONOFF,
    K_TRUEFALSE,
    K_TEXTJSON,
    K_HOSTPORT,
    K_HOSTPORT_OFF,
    K_FILE,
    K_DIR,
    K_IMAGE, //  a directory with a guest image's vmlinux, initrd.img and rootfs.ext4
    K_IDENT  //  a name nft (or a shell) takes as it is: a letter, then letters, digits, _
} s_kind_t;

typedef struct {
    const char *key;
    const char *dflt;
    s_kind_t kind;
} s_known_t;

static const s_known_t s_known[] = {
    {"broker.endpoint", "ipc://%D/run/broker.sock", K_ANY},
    {"broker.bind", NULL, K_ANY}, //  = broker.endpoint
    {"tap.endpoint", "ipc://%D/run/tap.sock", K_ANY},
    {"tap.bind", NULL, K_ANY}, //  = tap.endpoint
    {"broker.public_key", NULL, K_ANY},
    //  A control node of a cluster (broker/brk_control.h, docs/operations.md "Several
    //  hosts"): this node's address; nodes to join through the first time (unset: the
    //  first node of a new cluster); every control node's address, for the processes
    //  that reach the cluster's databases; Raft's one-way latency, whence its timeouts.
    {"control.address", NULL, K_ANY},
    {"control.join", NULL, K_ANY},
    {"control.nodes", NULL, K_ANY},
    {"control.latency_ms", "20", K_ANY},
    //  What sbx up runs on this host (docs/operations.md, "Several hosts").
    {"roles", "control,gateway,vmd,snapshotd,billing,hooks", K_ANY},
    {"instance", NULL, K_ANY}, //  = host name
    {"heartbeat_ms", "1000", K_ANY},
    {"events.segment_size", "100000", K_ANY}, //  the broker's sealed log segments (0: none)
    {"request_timeout_ms", "30000", K_ANY},
    {"listen", "127.0.0.1:8443", K_HOSTPORT},
    {"domain", "localhost", K_ANY},
    {"public_url", NULL,
     K_ANY}, //  the origin clients see, when a balancer stands in front (sbx_urls)
    {"box_domain", NULL,
     K_ANY}, //  = box.<domain>; its own registrable domain in public (sbx_site.h)
    {"tls", "on", K_ONOFF},
    {"tls.cert", NULL, K_FILE},
    {"tls.key", NULL, K_FILE},
    {"image_dir", NULL, K_DIR},
    //  The image sandboxes of one type boot instead of image_dir's (e.g. the docker
    //  variant, vmd/image/README.md); unset or empty: image_dir.
    {"image_dir.small", NULL, K_IMAGE},
    {"image_dir.medium", NULL, K_IMAGE},
    {"image_dir.large", NULL, K_IMAGE},
    {"vmd.capacity", "8", K_ANY},
    {"vmd.lost_after_ms", "30000", K_ANY}, //  broker: a vmd away this long is a host lost
    {"vmd.ship", NULL, K_HOSTPORT},        //  where other vmd hosts fetch moving sandboxes
    {"vmd.relay", NULL, K_HOSTPORT},       //  where gateways on other hosts reach published ports
    {"vmd.tcg_tb_mib", "64", K_ANY},       //  TCG's translation cache per guest, MiB (vmd_qemu.h)
    {"vmd.network", "isolated", K_ANY},
    {"vmd.qemu_user", NULL, K_ANY},
    {"vmd.templates", "small", K_ANY}, //  types restored from a booted template (docs/snapshots.md)
    {"vmd.restore_timeout_ms", "30000", K_ANY},     //  a restore's deadline (docs/vmd.md)
    {"vmd.agent_frame_timeout_ms", "10000", K_ANY}, //  an agent frame's deadline (docs/vmd.md)
    {"vmd.metrics_interval_ms", "5000", K_ANY},     //  guests' samples; 0 = off (docs/metrics.md)
    {"vmd.guest_uid_first", "1879048192", K_ANY},   //  each guest's own QEMU uid (docs/vmd.md)
    {"vmd.guest_uid_count", "65536", K_ANY},        //  0: every QEMU runs as vmd.qemu_user
    {"vmd.egress_resolver", NULL, K_ANY},           //  domain rules' DNS upstream (docs/vmd.md)
    //  The nftables tables a vmd loads: two vmds on one host need their own (docs/vmd.md).
    {"vmd.firewall_table", "sbx_guests", K_IDENT},
    {"vmd.egress_table", "sbx_egress", K_IDENT},
    {"rate.small", "10", K_ANY}, //  µ$ per second of running time: $0.036 an hour
    {"rate.medium", "20", K_ANY},
    {"rate.large", "40", K_ANY},
    {"wallet.initial", "0", K_ANY},
    {"mcp.origins", NULL, K_ANY},
    //  OAuth (docs/oauth.md): token lifetimes, and what the gateway may fetch client ID
    //  metadata documents from (private addresses: tests only) and which extra CA it trusts.
    {"oauth.access_ttl_s", "3600", K_ANY},
    {"oauth.refresh_ttl_s", "2592000", K_ANY},
    {"gateway.oauth_allow_private_fetch", "false", K_TRUEFALSE},
    {"gateway.oauth_fetch_ca", NULL, K_ANY},
    //  sbx-hookd (docs/webhooks.md): private delivery addresses (tests only), an extra CA.
    {"webhooks.allow_private", "false", K_TRUEFALSE},
    {"webhooks.ca_file", NULL, K_ANY},
    //  The gateway's tap-fed copy of sandboxes (gateway/gw_cache.h).
    {"gateway.read_cache", "on", K_ONOFF},
    {"gateway.usage_cache_ms", "1000", K_ANY},
    {"gateway.auth_cache_ms", "5000",
     K_ANY}, //  how long a good API key is trusted unasked (gw_auth)
    {"gateway.rate_report_ms", "250",
     K_ANY}, //  how often key rates are shared with the broker (gw_auth)
    //  The edge against slow and guessing clients (docs/operations.md, gateway/gw_http.h):
    //  deadlines for a request's headers and its body's progress, the sign-in pool, and
    //  dynamic client registrations per client address per minute.
    {"gateway.header_timeout_ms", "30000", K_ANY},
    {"gateway.body_timeout_ms", "30000", K_ANY},
    {"gateway.signin_threads", "2", K_ANY},
    {"gateway.register_per_minute", "10", K_ANY},
    //  Where the gateway serves Prometheus /metrics, apart from `listen` (docs/metrics.md).
    {"metrics.listen", "off", K_HOSTPORT_OFF},
    //  Plan limits (docs/limits.md): plan.P.* for any plan P; unset fields of another plan
    //  take the free plan's values; 0 means no limit.
    {"plan.free.starts_per_day", "100", K_ANY},
    {"plan.free.running", "5", K_ANY},
    {"plan.free.ttl_max_s", "86400", K_ANY},
    {"plan.free.ttl_default_s", "3600", K_ANY},
    {"plan.free.requests_per_second", "20", K_ANY},
    {"plan.free.snapshots", "0", K_ANY},      //  user snapshots kept per account
    {"plan.free.template_bytes", "0", K_ANY}, //  templates and cached build steps, bytes
    //  Logs (docs/operations.md, "Logs"): every daemon's line format; the size at which
    //  sbx up rotates a log (0: never, for an external logrotate) and how many it keeps.
    {"log.format", "text", K_TEXTJSON},
    {"log.max_bytes", "16777216", K_ANY},
    {"log.keep", "5", K_ANY},
    {NULL, NULL, K_ANY}};

typedef struct {
    char *key;
    char *value;
    bool from_file;
} s_entry_t;

struct sbx_config_t {
    char *data_dir;
    s_entry_t *entries;
    size_t count;
    char **expanded; //  defaults with %D expanded, parallel to s_known
    char hostname[256];
    //  A cluster's endpoints made from control.nodes and control.address (s_derive),
    //  kept until a setting changes: callers hold what get returned.
    char *derived[4];
};

//  The keys whose defaults a cluster derives: a control node at HOST:PORT serves the
//  broker at tcp://HOST:PORT+1 and the tap at tcp://HOST:PORT+2.
static const char *s_derived_keys[4] = {"broker.endpoint", "tap.endpoint", "broker.bind",
                                        "tap.bind"};

//  plan.<name>.<field> is known for every plan name (plans are the operator's to name).
static const s_known_t s_plan_key = {"plan.*", "0", K_ANY}; //  numbers, as the default
static const char *s_plan_fields[] = {"starts_per_day", "running",   "ttl_max_s",
                                      "ttl_default_s",  "snapshots", "requests_per_second",
                                      "template_bytes", NULL};

static const s_known_t *s_lookup_known (const char *key)
{
    for (const s_known_t *k = s_known; k->key; k++)
        if (strcmp (k->key, key) == 0)
            return k;
    const char *field = strrchr (key, '.');
    if (strncmp (key, "plan.", 5) == 0 && field && field > key + 5)
        for (const char **f = s_plan_fields; *f; f++)
            if (strcmp (field + 1, *f) == 0)
                return &s_plan_key;
    return NULL;
}

const char *sbx_config_default_data_dir (void)
{
    static char path[PATH_MAX];
    const char *env = getenv ("SBX_DATA_DIR");
    if (env && *env)
        return env;
    if (geteuid () == 0)
        return "/var/lib/sbx";
    const char *home = getenv ("HOME");
    snprintf (path, sizeof path, "%s/.sbx", home && *home ? home : "/tmp");
    return path;
}

static int s_mkdir (const char *path, mode_t mode)
{
    if (mkdir (path, mode) == 0 || errno == EEXIST)
        return 0;
    sbx_error ("cannot create %s: %s", path, strerror (errno));
    return -1;
}

static char *s_trim (char *s)
{
    while (isspace ((unsigned char) *s))
        s++;
    char *end = s + strlen (s);
    while (end > s && isspace ((unsigned char) end[-1]))
        *--end = 0;
    return s;
}

static int s_put (sbx_config_t *self, const char *key, const char *value, bool from_file)
{
    for (size_t i = 0; i < self->count; i++)
        if (strcmp (self->entries[i].key, key) == 0) {
            char *copy = strdup (value);
            if (!copy)
                return -1;
            free (self->entries[i].value);
            self->entries[i].value = copy;
            self->entries[i].from_file = from_file;
            return 0;
        }
    s_entry_t *grown = realloc (self->entries, (self->count + 1) * sizeof *grown);
    if (!grown)
        return -1;
    self->entries = grown;
    s_entry_t *e = &self->entries[self->count];
    e->key = strdup (key);
    e->value = strdup (value);
    e->from_file = from_file;
    if (!e->key || !e->value) {
        free (e->key);
        free (e->value);
        return -1;
    }
    self->count++;
    return 0;
}

static int s_load (sbx_config_t *self, const char *path)
{
    FILE *file = fopen (path, "r");
    if (!file)
        return errno == ENOENT ? 0 : -1;
    char line[4096];
    int lineno = 0;
    int rc = 0;
    while (fgets (line, sizeof line, file)) {
        lineno++;
        //  Only whole-line comments: values may contain '#' (z85 keys do).
        char *text = s_trim (line);
        if (!*text || *text == '#')
            continue;
        char *eq = strchr (text, '=');
        if (!eq) {
            sbx_error ("%s:%d: expected `key = value`, got '%s'", path, lineno, text);
            rc = -1;
            break;
        }
        *eq = 0;
        char *key = s_trim (text);
        char *value = s_trim (eq + 1);
        if (!s_lookup_known (key))
            sbx_warn ("%s:%d: unknown key '%s' ignored", path, lineno, key);
        else if (s_put (self, key, value, true)) {
            rc = -1;
            break;
        }
    }
    fclose (file);
    return rc;
}

sbx_config_t *sbx_config_new (const char *data_dir)
{
    sbx_config_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    const char *dir = data_dir && *data_dir ? data_dir : sbx_config_default_data_dir ();
    //  Absolute, so that ipc:// paths and the pid files mean the same from every cwd.
    if (s_mkdir (dir, 0755) == 0)
        self->data_dir = realpath (dir, NULL);
    if (!self->data_dir) {
        sbx_config_destroy (&self);
        return NULL;
    }
    size_t nknown = sizeof s_known / sizeof s_known[0];
    self->expanded = calloc (nknown, sizeof (char *));
    if (gethostname (self->hostname, sizeof self->hostname - 1) != 0)
        strcpy (self->hostname, "localhost");
    char *run = sbx_config_path (self, "run");
    char *logs = sbx_config_path (self, "logs");
    char *keys = sbx_config_path (self, "keys");
    char *file = sbx_config_path (self, "sbx.conf");
    int rc = (!self->expanded || !run || !logs || !keys || !file) ? -1 : 0;
    if (rc == 0)
        rc = s_mkdir (run, 0700) || s_mkdir (logs, 0750) || s_mkdir (keys, 0700);
    if (rc == 0)
        rc = s_load (self, file);
    free (run);
    free (logs);
    free (keys);
    free (file);
    if (rc)
        sbx_config_destroy (&self);
    return self;
}

void sbx_config_destroy (sbx_config_t **self_p)
{
    assert (self_p);
    sbx_config_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->count; i++) {
        free (self->entries[i].key);
        free (self->entries[i].value);
    }
    free (self->entries);
    if (self->expanded)
        for (size_t i = 0; s_known[i].key; i++)
            free (self->expanded[i]);
    free (self->expanded);
    for (int i = 0; i < 4; i++)
        free (self->derived[i]);
    free (self->data_dir);
    free (self);
    *self_p = NULL;
}

const char *sbx_config_data_dir (sbx_config_t *self)
{
    return self->data_dir;
}

static const char *s_default (sbx_config_t *self, const char *key)
{
    for (size_t i = 0; s_known[i].key; i++) {
        if (strcmp (s_known[i].key, key))
            continue;
        if (!s_known[i].dflt)
            return NULL;
        if (!self->expanded[i]) {
            const char *d = s_known[i].dflt;
            const char *mark = strstr (d, "%D");
            if (!mark)
                self->expanded[i] = strdup (d);
            else if (asprintf (&self->expanded[i], "%.*s%s%s", (int) (mark - d), d, self->data_dir,
                               mark + 2) < 0)
                self->expanded[i] = NULL;
        }
        return self->expanded[i];
    }
    return NULL;
}

//  "tcp://HOST:PORT+offset" for a control node's address (out: NULL when it is not
//  HOST:PORT with room above the port).
static char *s_node_endpoint (const char *address, int offset)
{
    const char *colon = strrchr (address, ':');
    char *end = NULL;
    long port = colon ? strtol (colon + 1, &end, 10) : 0;
    if (!colon || colon == address || !end || *end || port < 1 || port + offset > 65535)
        return NULL;
    char *out = NULL;
    if (asprintf (&out, "tcp://%.*s:%ld", (int) (colon - address), address, port + offset) < 0)
        return NULL;
    return out;
}

//  The default of a derived key on a cluster's host, or NULL (not a cluster's host, or
//  a malformed address: the plain default stands).
static const char *s_derive (sbx_config_t *self, int which)
{
    if (self->derived[which])
        return self->derived[which];
    int offset = which % 2 == 0 ? 1 : 2;
    char *out = NULL;
    if (which >= 2) {
        //  Binds: this control node's own.
        const char *address = sbx_config_get (self, "control.address", NULL);
        out = address && *address ? s_node_endpoint (address, offset) : NULL;
    } else {
        char **nodes = sbx_config_list (self, "control.nodes", NULL);
        for (char **node = nodes; node && *node; node++) {
            char *one = s_node_endpoint (*node, offset);
            char *joined = NULL;
            if (!one || asprintf (&joined, "%s%s%s", out ? out : "", out ? "," : "", one) < 0) {
                free (one);
                free (out);
                out = NULL;
                break;
            }
            free (one);
            free (out);
            out = joined;
        }
        sbx_config_list_free (&nodes);
    }
    self->derived[which] = out;
    return out;
}

const char *sbx_config_get (sbx_config_t *self, const char *key, const char *dflt)
{
    assert (self && key);
    for (size_t i = 0; i < self->count; i++)
        if (strcmp (self->entries[i].key, key) == 0)
            return self->entries[i].value;
    //  A cluster's host: the brokers and taps of control.nodes, this node's binds.
    for (int i = 0; i < 4; i++)
        if (strcmp (key, s_derived_keys[i]) == 0) {
            const char *derived = s_derive (self, i);
            if (derived)
                return derived;
        }
    //  Keys whose default is another key's value.
    if (strcmp (key, "broker.bind") == 0)
        return sbx_config_get (self, "broker.endpoint", dflt);
    if (strcmp (key, "tap.bind") == 0)
        return sbx_config_get (self, "tap.endpoint", dflt);
    if (strcmp (key, "instance") == 0)
        return self->hostname;
    const char *value = s_default (self, key);
    return value ? value : dflt;
}

uint64_t sbx_config_get_uint (sbx_config_t *self, const char *key, uint64_t dflt)
{
    const char *text = sbx_config_get (self, key, NULL);
    if (!text)
        return dflt;
    char *end;
    errno = 0;
    unsigned long long value = strtoull (text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') {
        sbx_warn ("config: %s = '%s' is not a number; using %llu", key, text,
                  (unsigned long long) dflt);
        return dflt;
    }
    return value;
}

char **sbx_config_list (sbx_config_t *self, const char *key, size_t *count)
{
    size_t n = 0;
    if (count)
        *count = 0;
    const char *list = sbx_config_get (self, key, NULL);
    if (!list || !*list)
        return NULL;
    size_t most = 1;
    for (const char *c = list; *c; c++)
        most += *c == ',';
    char **out = calloc (most + 1, sizeof *out);
    const char *start = list;
    while (out) {
        const char *end = strchr (start, ',');
        size_t len = end ? (size_t) (end - start) : strlen (start);
        while (len && isspace ((unsigned char) *start))
            start++, len--;
        while (len && isspace ((unsigned char) start[len - 1]))
            len--;
        if (len && !(out[n++] = strndup (start, len)))
            sbx_config_list_free (&out);
        if (!end)
            break;
        start = end + 1;
    }
    if (out && n == 0)
        sbx_config_list_free (&out);
    if (out && count)
        *count = n;
    return out;
}

void sbx_config_list_free (char ***list_p)
{
    if (!list_p || !*list_p)
        return;
    for (char **item = *list_p; *item; item++)
        free (*item);
    free (*list_p);
    *list_p = NULL;
}

uint64_t sbx_config_get_range (sbx_config_t *self, const char *key, uint64_t dflt, uint64_t min,
                               uint64_t max)
{
    if (!self || !sbx_config_get (self, key, NULL))
        return dflt;
    uint64_t value = sbx_config_get_uint (self, key, dflt);
    if (value < min || value > max) {
        sbx_warn ("config: %s = %llu is not within %llu-%llu; using %llu", key,
                  (unsigned long long) value, (unsigned long long) min, (unsigned long long) max,
                  (unsigned long long) dflt);
        return dflt;
    }
    return value;
}

//  A guest image's directory: the files vmd boots from are there and readable.
static bool s_image_complete (const char *dir)
{
    const char *files[] = {"vmlinux", "initrd.img", "rootfs.ext4"};
    struct stat st;
    if (stat (dir, &st) != 0 || !S_ISDIR (st.st_mode))
        return false;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[PATH_MAX];
        if (snprintf (path, sizeof path, "%s/%s", dir, files[i]) >= (int) sizeof path ||
            stat (path, &st) != 0 || !S_ISREG (st.st_mode) || access (path, R_OK) != 0)
            return false;
    }
    return true;
}

//  Why value will not do for key, in why; 0 when it does.
static int s_check_value (const s_known_t *known, const char *key, const char *value, char *why,
                          size_t why_size)
{
    const char *want = NULL;
    bool number =
        known->dflt && *known->dflt && strspn (known->dflt, "0123456789") == strlen (known->dflt);
    struct stat st;
    if (number &&
        (!*value || strspn (value, "0123456789") != strlen (value) || strlen (value) > 19))
        want = "a whole number (no sign, no unit)";
    else if (known->kind == K_ONOFF && strcmp (value, "on") && strcmp (value, "off"))
        want = "on or off";
    else if (known->kind == K_TRUEFALSE && strcmp (value, "true") && strcmp (value, "false"))
        want = "true or false";
    else if (known->kind == K_TEXTJSON && strcmp (value, "text") && strcmp (value, "json"))
        want = "text or json";
    else if (known->kind == K_HOSTPORT ||
             (known->kind == K_HOSTPORT_OFF && strcmp (value, "off"))) {
        const char *colon = strrchr (value, ':');
        char *end = NULL;
        long port = colon ? strtol (colon + 1, &end, 10) : -1;
        if (!colon || colon == value || !end || *end || colon[1] == 0 || port < 0 || port > 65535)
            want = known->kind == K_HOSTPORT_OFF
                       ? "off, or HOST:PORT with a port from 0 to 65535 (0: any free one)"
                       : "HOST:PORT with a port from 0 to 65535 (0: any free one)";
    } else if ((known->kind == K_FILE || known->kind == K_DIR) && *value &&
               (stat (value, &st) != 0 || (known->kind == K_DIR) != S_ISDIR (st.st_mode) ||
                access (value, R_OK) != 0))
        want = known->kind == K_DIR ? "a directory that exists" : "a readable file that exists";
    else if (known->kind == K_IDENT &&
             (!isalpha ((unsigned char) value[0]) || strlen (value) > 64 ||
              strspn (value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") !=
                  strlen (value)))
        want = "a name of up to 64 letters, digits and _, starting with a letter";
    else if (known->kind == K_IMAGE && *value && !s_image_complete (value))
        want = "a guest image directory with vmlinux, initrd.img and rootfs.ext4 (as "
               "vmd/image/build-image.sh makes)";
    if (!want)
        return 0;
    snprintf (why, why_size, "%s = '%.200s' will not do: it must be %s", key, value, want);
    return -1;
}

int sbx_config_check (sbx_config_t *self, char *why, size_t why_size)
{
    for (size_t i = 0; i < self->count; i++) {
        const s_known_t *known = s_lookup_known (self->entries[i].key);
        if (known &&
            s_check_value (known, self->entries[i].key, self->entries[i].value, why, why_size))
            return -1;
    }
    return 0;
}

int sbx_config_set (sbx_config_t *self, const char *key, const char *value)
{
    assert (self && key && value);
    if (!s_lookup_known (key))
        return -1;
    //  What was derived from the settings may change with them.
    if (strncmp (key, "control.", 8) == 0)
        for (int i = 0; i < 4; i++) {
            free (self->derived[i]);
            self->derived[i] = NULL;
        }
    return s_put (self, key, value, false);
}

char *sbx_config_path (sbx_config_t *self, const char *relative)
{
    char *path;
    if (asprintf (&path, "%s/%s", self->data_dir, relative) < 0)
        return NULL;
    return path;
}

int sbx_config_save (sbx_config_t *self)
{
    char *path = sbx_config_path (self, "sbx.conf");
    char *temp = sbx_config_path (self, "sbx.conf.tmp");
    FILE *file = path && temp ? fopen (temp, "w") : NULL;
    int rc = -1;
    if (file) {
        fprintf (file, "# sbx configuration: key = value; see docs/operations.md\n");
        for (size_t i = 0; i < self->count; i++)
            fprintf (file, "%s = %s\n", self->entries[i].key, self->entries[i].value);
        rc = (fflush (file) == 0 && fsync (fileno (file)) == 0) ? 0 : -1;
        fclose (file);
        if (rc == 0)
            rc = rename (temp, path);
    }
    free (path);
    free (temp);
    return rc;
}

#define streq(a, b) (strcmp ((a), (b)) == 0)

void sbx_config_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/sbx_config_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    {
        //  A cluster's host: brokers and taps from control.nodes (port + 1, + 2), a
        //  control node's binds from its own address; lists read item by item.
        sbx_config_t *host = sbx_config_new (dir);
        assert (sbx_config_set (host, "control.nodes", " 10.0.0.1:9001, [fd00::2]:9001 ,") == 0);
        assert (streq (sbx_config_get (host, "broker.endpoint", NULL),
                       "tcp://10.0.0.1:9002,tcp://[fd00::2]:9002"));
        assert (streq (sbx_config_get (host, "tap.endpoint", NULL),
                       "tcp://10.0.0.1:9003,tcp://[fd00::2]:9003"));
        //  Not a control node: binds follow the endpoints, as before (never bound there).
        assert (sbx_config_set (host, "control.address", "10.0.0.1:9001") == 0);
        assert (streq (sbx_config_get (host, "broker.bind", NULL), "tcp://10.0.0.1:9002"));
        assert (streq (sbx_config_get (host, "tap.bind", NULL), "tcp://10.0.0.1:9003"));
        size_t count = 0;
        char **list = sbx_config_list (host, "broker.endpoint", &count);
        assert (count == 2 && streq (list[1], "tcp://[fd00::2]:9002") && !list[2]);
        sbx_config_list_free (&list);
        assert (!list);
        //  Set by hand, a value wins; a port at the top has no room above it.
        assert (sbx_config_set (host, "broker.endpoint", "tcp://b:1") == 0);
        assert (streq (sbx_config_get (host, "broker.endpoint", NULL), "tcp://b:1"));
        assert (sbx_config_set (host, "control.address", "10.0.0.1:65535") == 0);
        assert (!strstr (sbx_config_get (host, "tap.bind", ""), "65537"));
        assert (sbx_config_list (host, "control.join", &count) == NULL && count == 0);
        sbx_config_destroy (&host);
    }
    {
        //  Each value is checked by its key's kind.
        char why[400];
        assert (sbx_config_check (config, why, sizeof why) == 0);
        const char *bad[][2] = {{"vmd.capacity", "lots"},     {"listen", "127.0.0.1:99999"},
                                {"listen", "nohost"},         {"tls", "maybe"},
                                {"tls.cert", "/nonexistent"}, {"image_dir", "/etc/hostname"},
                                {"plan.gold.running", "-1"},  {"gateway.read_cache", "yes"},
                                {"heartbeat_ms", "10s"},      {"log.format", "xml"},
                                {"log.max_bytes", "16M"},     {"image_dir.large", "/tmp"}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            sbx_config_t *c = sbx_config_new (dir);
            assert (sbx_config_set (c, bad[i][0], bad[i][1]) == 0);
            assert (sbx_config_check (c, why, sizeof why) == -1);
            assert (strstr (why, bad[i][0]) && strstr (why, "will not do"));
            sbx_config_destroy (&c);
        }
        sbx_config_t *c = sbx_config_new (dir);
        sbx_config_set (c, "listen", "127.0.0.1:0");
        sbx_config_set (c, "image_dir", "/tmp");
        sbx_config_set (c, "vmd.capacity", "16");
        assert (sbx_config_check (c, why, sizeof why) == 0);
        //  A type's own image: a directory with the three files vmd boots.
        char image[600];
        snprintf (image, sizeof image, "%s/img", dir);
        assert (mkdir (image, 0755) == 0);
        const char *files[] = {"vmlinux", "initrd.img", "rootfs.ext4"};
        for (size_t i = 0; i < 3; i++) {
            sbx_config_set (c, "image_dir.large", image);
            assert (sbx_config_check (c, why, sizeof why) == -1);
            assert (strstr (why, "image_dir.large") && strstr (why, "rootfs.ext4"));
            char path[700];
            snprintf (path, sizeof path, "%s/%s", image, files[i]);
            FILE *file = fopen (path, "w");
            assert (file);
            fclose (file);
        }
        assert (sbx_config_check (c, why, sizeof why) == 0);
        assert (streq (sbx_config_get (c, "image_dir.large", NULL), image));
        assert (sbx_config_get (c, "image_dir.medium", NULL) == NULL);
        assert (sbx_config_set (c, "image_dir.huge", image) == -1);
        sbx_config_destroy (&c);
    }
    assert (config);
    char expect[512];
    snprintf (expect, sizeof expect, "ipc://%s/run/broker.sock", sbx_config_data_dir (config));
    assert (strcmp (sbx_config_get (config, "broker.endpoint", NULL), expect) == 0);
    assert (strcmp (sbx_config_get (config, "broker.bind", NULL), expect) == 0);
    assert (sbx_config_get_uint (config, "heartbeat_ms", 0) == 1000);
    assert (sbx_config_get (config, "nonsense", "x")[0] == 'x');
    assert (sbx_config_set (config, "nonsense", "1") == -1);
    //  A slow client is cut within a minute by default (docs/operations.md).
    uint64_t header_ms = sbx_config_get_uint (config, "gateway.header_timeout_ms", 0);
    uint64_t body_ms = sbx_config_get_uint (config, "gateway.body_timeout_ms", 0);
    assert (header_ms > 0 && header_ms <= 60000 && body_ms > 0 && body_ms <= 60000);
    //  Every plan field is known for any plan the operator names.
    assert (sbx_config_set (config, "plan.pro.requests_per_second", "50") == 0);
    assert (sbx_config_set (config, "plan.pro.snapshots", "10") == 0);
    assert (sbx_config_set (config, "plan.pro.colour", "red") == -1);
    assert (sbx_config_set (config, "broker.endpoint", "tcp://127.0.0.1:7100") == 0);
    assert (strcmp (sbx_config_get (config, "broker.bind", NULL), "tcp://127.0.0.1:7100") == 0);
    assert (sbx_config_set (config, "heartbeat_ms", "abc") == 0);
    assert (sbx_config_get_uint (config, "heartbeat_ms", 7) == 7);
    assert (sbx_config_set (config, "heartbeat_ms", "250") == 0);
    assert (sbx_config_save (config) == 0);
    sbx_config_destroy (&config);
    assert (config == NULL);

    //  The saved file is read back; comments, blanks and unknown keys are tolerated.
    char path[512];
    snprintf (path, sizeof path, "%s/sbx.conf", dir);
    FILE *file = fopen (path, "a");
    fprintf (file, "\n# comment\n  future.key = 1  \n  # indented comment\n");
    fprintf (file, "broker.public_key = a#b=c\n");
    fclose (file);
    config = sbx_config_new (dir);
    assert (config);
    assert (sbx_config_get_uint (config, "heartbeat_ms", 0) == 250);
    assert (strcmp (sbx_config_get (config, "broker.endpoint", NULL), "tcp://127.0.0.1:7100") == 0);
    assert (strcmp (sbx_config_get (config, "broker.public_key", NULL), "a#b=c") == 0);
    sbx_config_destroy (&config);

    //  A syntax error is refused with the line named, not half-applied.
    file = fopen (path, "a");
    fprintf (file, "this line has no equals sign\n");
    fclose (file);
    sbx_log_init ("sbx_config_test",
                  verbose ? SBX_LOG_DEBUG : (sbx_log_level_t) (SBX_LOG_ERROR + 1));
    assert (sbx_config_new (dir) == NULL);
    sbx_log_init ("sbx", SBX_LOG_INFO);

    char cmd[600];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
