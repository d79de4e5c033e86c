/*  vmd_egress - see vmd_egress.h */
#include "vmd_egress.h"
#include "sbx_egress.h"
#include "sbx_log.h"
#include "vmd_firewall.h"
#include "vmd_guest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

//  One guest's rules: its entries as given (canonical text), kept in order.
typedef struct {
    uid_t uid;
    sbx_strlist_t allow;
    sbx_strlist_t deny;
} s_rules_t;

struct _vmd_egress_t {
    char *dir;
    char *table; //  VMD_EGRESS_TABLE, or a test's own
    char *nft_path;
    zhashx_t *rules; //  sandbox id -> s_rules_t
    char *loaded;    //  the table in the kernel now (NULL: not loaded by us)
};

static void s_rules_destroy (void **item)
{
    s_rules_t *r = *item;
    if (r) {
        sbx_strlist_clear (&r->allow);
        sbx_strlist_clear (&r->deny);
        free (r);
    }
    *item = NULL;
}

//  Checks list's entries (named "allow"/"deny") and copies their canonical forms into out.
static int s_parse_list (const char *name, const sbx_strlist_t *list, sbx_strlist_t *out,
                         sbx_err_t *err)
{
    char why[512];
    size_t count = list ? list->count : 0;
    if (sbx_egress_check (name, count ? list->items : NULL, count, why, sizeof why) == -1)
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "%s", why);
    for (size_t i = 0; i < count; i++) {
        sbx_egress_entry_t e;
        sbx_egress_parse (list->items[i], &e, why, sizeof why);
        if (e.domain)
            return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                                "egress.%s[%zu] (\"%s\") is a domain name: this vmd enforces "
                                "CIDRs and addresses only, so name the addresses instead",
                                name, i, list->items[i]);
        if (sbx_strlist_append (out, e.text) == -1)
            return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    }
    return 0;
}

//  --------------------------------------------------------------------------
//  The table

//  True when b lies inside a (same family, a's prefix no longer, a's bits match).
static bool s_contains (const sbx_egress_entry_t *a, const sbx_egress_entry_t *b)
{
    if (a->family != b->family || a->len > b->len)
        return false;
    for (int bit = 0; bit < a->len; bit++) {
        int byte = bit / 8, mask = 0x80 >> (bit % 8);
        if ((a->addr[byte] & mask) != (b->addr[byte] & mask))
            return false;
    }
    return true;
}

//  The list's networks of family as an nft set body ("a, b/n"), each one that another
//  covers left out (nft refuses overlapping intervals). "" when there are none.
static char *s_set (const sbx_strlist_t *list, int family)
{
    size_t n = list->count;
    sbx_egress_entry_t *e = calloc (n ? n : 1, sizeof *e);
    char *out = calloc (1, n * (SBX_EGRESS_TEXT + 2) + 1);
    if (!e || !out) {
        free (e);
        free (out);
        return NULL;
    }
    char why[256];
    for (size_t i = 0; i < n; i++)
        if (sbx_egress_parse (list->items[i], &e[i], why, sizeof why) == -1 || e[i].domain)
            e[i].family = 0; //  (checked when set: never here)
    for (size_t i = 0; i < n; i++) {
        if (e[i].family != family)
            continue;
        bool covered = false;
        for (size_t j = 0; j < n && !covered; j++)
            covered = j != i && s_contains (&e[j], &e[i]) &&
                      (!s_contains (&e[i], &e[j]) || j < i); //  equal ones: the first stays
        if (covered)
            continue;
        if (*out)
            strcat (out, ", ");
        strcat (out, e[i].text);
    }
    free (e);
    return out;
}

//  "\t\tip[6] daddr { set } verdict\n", or "" for an empty set (nft refuses those).
static char *s_match (int family, const char *set, const char *verdict)
{
    return *set ? zsys_sprintf ("\t\t%s daddr { %s } %s\n", family == AF_INET ? "ip" : "ip6", set,
                                verdict)
                : strdup ("");
}

//  One guest's chain, appended to chains.
static int s_chain (zchunk_t *chains, uid_t uid, const s_rules_t *r)
{
    char *d4 = s_set (&r->deny, AF_INET), *d6 = s_set (&r->deny, AF_INET6);
    char *a4 = s_set (&r->allow, AF_INET), *a6 = s_set (&r->allow, AF_INET6);
    char *lines[4] = {NULL};
    int rc = d4 && d6 && a4 && a6 ? 0 : -1;
    if (rc == 0) {
        lines[0] = s_match (AF_INET, d4, "jump refuse comment \"deny\"");
        lines[1] = s_match (AF_INET6, d6, "jump refuse comment \"deny\"");
        lines[2] = s_match (AF_INET, a4, "accept comment \"allow\"");
        lines[3] = s_match (AF_INET6, a6, "accept comment \"allow\"");
    }
    char *text = rc == 0 && lines[0] && lines[1] && lines[2] && lines[3]
                     ? zsys_sprintf ("\tchain g_%u {\n"
                                     "\t\tct state established,related accept\n"
                                     "\t\tmeta l4proto { tcp, udp } th dport 53 accept comment "
                                     "\"dns (the fixed policy keeps it to the resolver)\"\n"
                                     "%s%s%s%s%s"
                                     "\t}\n",
                                     (unsigned) uid, lines[0], lines[1], lines[2], lines[3],
                                     r->allow.count ? "\t\tjump refuse comment \"not in the "
                                                      "allow list\"\n"
                                                    : "")
                     : NULL;
    if (text)
        zchunk_extend (chains, text, strlen (text)); //  (czmq asserts on no memory)
    rc = text ? 0 : -1;
    zstr_free (&text);
    for (int i = 0; i < 4; i++)
        free (lines[i]);
    free (d4);
    free (d6);
    free (a4);
    free (a6);
    return rc;
}

char *vmd_egress_ruleset (vmd_egress_t *self)
{
    zchunk_t *jumps = zchunk_new (NULL, 0), *chains = zchunk_new (NULL, 0);
    int rc = jumps && chains ? 0 : -1;
    //  Sorted by id, so the same rules make the same text (and no reload).
    zlistx_t *ids = zhashx_keys (self->rules);
    if (ids) {
        zlistx_set_comparator (ids, (zlistx_comparator_fn *) strcmp);
        zlistx_sort (ids);
    }
    for (const char *id = ids ? zlistx_first (ids) : NULL; id && rc == 0; id = zlistx_next (ids)) {
        s_rules_t *r = zhashx_lookup (self->rules, id);
        char line[160];
        snprintf (line, sizeof line, "\t\tmeta skuid %u jump g_%u comment \"%.64s\"\n",
                  (unsigned) r->uid, (unsigned) r->uid, id);
        zchunk_extend (jumps, line, strlen (line));
        rc = s_chain (chains, r->uid, r);
    }
    zlistx_destroy (&ids);
    char *rules = rc == 0 ? zsys_sprintf ("table inet %s\n"
                                          "delete table inet %s\n"
                                          "table inet %s {\n"
                                          "\tchain output {\n"
                                          "\t\ttype filter hook output priority filter + 10; "
                                          "policy accept;\n"
                                          "%.*s"
                                          "\t}\n"
                                          "\tchain refuse {\n"
                                          "\t\tmeta l4proto tcp reject with tcp reset\n"
                                          "\t\treject\n"
                                          "\t}\n"
                                          "%.*s"
                                          "}\n",
                                          self->table, self->table, self->table,
                                          (int) zchunk_size (jumps), (char *) zchunk_data (jumps),
                                          (int) zchunk_size (chains), (char *) zchunk_data (chains))
                          : NULL;
    zchunk_destroy (&jumps);
    zchunk_destroy (&chains);
    return rules;
}

//  Loads the table for the rules kept now, unless it is loaded already.
static int s_load (vmd_egress_t *self, sbx_err_t *err)
{
    char *rules = vmd_egress_ruleset (self);
    if (!rules)
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    if (self->loaded && streq (self->loaded, rules)) {
        zstr_free (&rules);
        return 0;
    }
    char out[2048];
    if (vmd_firewall_nft (self->nft_path, rules, false, out, sizeof out) == -1) {
        for (char *c = out; *c; c++)
            if (*c == '\n' || *c == '\t')
                *c = ' ';
        sbx_error ("vmd_egress: cannot load nftables table inet %s: %s", self->table,
                   *out ? out : strerror (errno));
        zstr_free (&rules);
        return sbx_err_set (err, SBX_E_INTERNAL,
                            "the host's firewall refused the egress rules (%s); the rules in "
                            "force are unchanged",
                            *out ? out : "nft failed");
    }
    zstr_free (&self->loaded);
    self->loaded = rules;
    return 0;
}

//  --------------------------------------------------------------------------
//  The files

static char *s_path (vmd_egress_t *self, const char *id, const char *suffix)
{
    return zsys_sprintf ("%s/%s.json%s", self->dir, id, suffix);
}

static int s_save (vmd_egress_t *self, const char *id, const s_rules_t *r)
{
    json_t *root = json_pack ("{s:I, s:[], s:[]}", "uid", (json_int_t) r->uid, "allow", "deny");
    for (size_t i = 0; root && i < r->allow.count; i++)
        json_array_append_new (json_object_get (root, "allow"), json_string (r->allow.items[i]));
    for (size_t i = 0; root && i < r->deny.count; i++)
        json_array_append_new (json_object_get (root, "deny"), json_string (r->deny.items[i]));
    char *text = root ? json_dumps (root, JSON_INDENT (2)) : NULL;
    json_decref (root);
    char *tmp = s_path (self, id, ".tmp"), *path = s_path (self, id, "");
    unlink (tmp ? tmp : "");
    int fd = text && tmp && path
                 ? open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)
                 : -1;
    size_t len = text ? strlen (text) : 0;
    bool ok = fd >= 0 && write (fd, text, len) == (ssize_t) len && fsync (fd) == 0;
    if (fd >= 0)
        ok = close (fd) == 0 && ok;
    ok = ok && rename (tmp, path) == 0;
    if (!ok && tmp)
        unlink (tmp);
    free (text);
    zstr_free (&tmp);
    zstr_free (&path);
    return ok ? 0 : -1;
}

//  A kept file: its rules, each entry checked again (the disk is not trusted). NULL,
//  logged, when it is not such a file.
static s_rules_t *s_read (vmd_egress_t *self, const char *id)
{
    char *path = s_path (self, id, "");
    int fd = path ? open (path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    json_error_t jerr = {0};
    json_t *root = fd >= 0 ? json_loadfd (fd, 0, &jerr) : NULL;
    if (fd >= 0)
        close (fd);
    s_rules_t *r = calloc (1, sizeof *r);
    json_int_t uid = 0;
    json_t *allow = NULL, *deny = NULL;
    bool ok =
        r && root &&
        json_unpack (root, "{s:I, s:o, s:o}", "uid", &uid, "allow", &allow, "deny", &deny) == 0 &&
        uid > 0 && uid < 0xFFFFFFFE && json_is_array (allow) && json_is_array (deny);
    sbx_strlist_t lists[2] = {{0}};
    json_t *arrays[2] = {allow, deny};
    for (int l = 0; l < 2 && ok; l++)
        for (size_t i = 0; i < json_array_size (arrays[l]) && ok; i++) {
            const char *v = json_string_value (json_array_get (arrays[l], i));
            ok = v && sbx_strlist_append (&lists[l], v) == 0;
        }
    sbx_err_t err = {0};
    if (ok) {
        r->uid = (uid_t) uid;
        ok = s_parse_list ("allow", &lists[0], &r->allow, &err) == 0 &&
             s_parse_list ("deny", &lists[1], &r->deny, &err) == 0;
    }
    if (!ok) {
        sbx_error ("vmd_egress: %s is not a usable rules file (%s): sandbox=%s keeps no egress "
                   "rules",
                   path,
                   !root          ? jerr.text
                   : *err.message ? err.message
                                  : "wrong fields",
                   id);
        void *item = r;
        s_rules_destroy (&item);
        r = NULL;
    }
    sbx_strlist_clear (&lists[0]);
    sbx_strlist_clear (&lists[1]);
    json_decref (root);
    zstr_free (&path);
    return r;
}

//  --------------------------------------------------------------------------

vmd_egress_t *vmd_egress_new (const char *dir, const char *table, const char *nft_path)
{
    vmd_egress_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->dir = strdup (dir);
    self->table = strdup (table ? table : VMD_EGRESS_TABLE);
    self->nft_path = nft_path ? strdup (nft_path) : NULL;
    self->rules = zhashx_new ();
    if (!self->dir || !self->table || (nft_path && !self->nft_path) || !self->rules) {
        vmd_egress_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->rules, s_rules_destroy);
    if (mkdir (dir, 0700) == -1 && errno != EEXIST) {
        sbx_error ("vmd_egress: cannot make %s: %s", dir, strerror (errno));
        vmd_egress_destroy (&self);
        return NULL;
    }
    DIR *d = opendir (dir);
    struct dirent *entry;
    while (d && (entry = readdir (d))) {
        char id[80];
        size_t n = strlen (entry->d_name);
        if (n <= 5 || n - 5 >= sizeof id || !streq (entry->d_name + n - 5, ".json"))
            continue;
        snprintf (id, sizeof id, "%.*s", (int) (n - 5), entry->d_name);
        s_rules_t *r = vmd_guest_id_valid (id) ? s_read (self, id) : NULL;
        if (r)
            zhashx_update (self->rules, id, r);
    }
    if (d)
        closedir (d);
    sbx_err_t err = {0};
    if ((zhashx_size (self->rules) || geteuid () == 0) && s_load (self, &err) == -1) {
        vmd_egress_destroy (&self);
        return NULL;
    }
    if (zhashx_size (self->rules))
        sbx_info ("egress rules of %zu guests loaded from %s", zhashx_size (self->rules), dir);
    return self;
}

void vmd_egress_destroy (vmd_egress_t **self_p)
{
    vmd_egress_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy (&self->rules);
    free (self->dir);
    free (self->table);
    free (self->nft_path);
    zstr_free (&self->loaded);
    free (self);
    *self_p = NULL;
}

static s_rules_t *s_rules_copy (const s_rules_t *from)
{
    s_rules_t *r = calloc (1, sizeof *r);
    bool ok = r != NULL;
    for (size_t i = 0; ok && i < from->allow.count; i++)
        ok = sbx_strlist_append (&r->allow, from->allow.items[i]) == 0;
    for (size_t i = 0; ok && i < from->deny.count; i++)
        ok = sbx_strlist_append (&r->deny, from->deny.items[i]) == 0;
    if (r)
        r->uid = from->uid;
    if (!ok) {
        void *item = r;
        s_rules_destroy (&item);
    }
    return ok ? r : NULL;
}

//  Makes r (taken; NULL: none) the rules of id on disk and in the table, or changes
//  nothing and returns -1.
static int s_replace (vmd_egress_t *self, const char *id, s_rules_t *r, sbx_err_t *err)
{
    s_rules_t *current = zhashx_lookup (self->rules, id);
    s_rules_t *old = current ? s_rules_copy (current) : NULL;
    if (current && !old) {
        void *item = r;
        s_rules_destroy (&item);
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    }
    if (r)
        zhashx_update (self->rules, id, r); //  (frees current)
    else
        zhashx_delete (self->rules, id);
    int rc = 0;
    if (r && s_save (self, id, r) == -1)
        rc = sbx_err_set (err, SBX_E_INTERNAL, "cannot write the egress rules to %s: %s", self->dir,
                          strerror (errno));
    if (rc == 0 && s_load (self, err) == 0) {
        char *path = r ? NULL : s_path (self, id, "");
        if (path && unlink (path) == -1 && errno != ENOENT)
            sbx_warn ("vmd_egress: cannot remove %s: %s", path, strerror (errno));
        zstr_free (&path);
        void *item = old;
        s_rules_destroy (&item);
        return 0;
    }
    //  Back to the rules in force, on disk too.
    if (old) {
        zhashx_update (self->rules, id, old);
        s_save (self, id, old);
    } else {
        zhashx_delete (self->rules, id);
        char *path = s_path (self, id, "");
        if (path)
            unlink (path);
        zstr_free (&path);
    }
    return -1;
}

int vmd_egress_set (vmd_egress_t *self, const char *id, uid_t uid, const sbx_strlist_t *allow,
                    const sbx_strlist_t *deny, sbx_err_t *err)
{
    if (!vmd_guest_id_valid (id))
        return sbx_err_set (err, SBX_E_INVALID_ARGUMENT, "sandbox id '%s' is not usable", id);
    s_rules_t *r = calloc (1, sizeof *r);
    if (!r)
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    r->uid = uid;
    void *item = r;
    if (s_parse_list ("allow", allow, &r->allow, err) == -1 ||
        s_parse_list ("deny", deny, &r->deny, err) == -1) {
        s_rules_destroy (&item);
        return -1;
    }
    bool none = !r->allow.count && !r->deny.count;
    if (!none && (uid == 0 || uid == (uid_t) -1)) {
        s_rules_destroy (&item);
        return sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                            "egress rules need each guest's QEMU to run as a uid of its own: "
                            "run vmd as root with vmd.guest_uid_count above 0 (the default)");
    }
    if (none) {
        s_rules_destroy (&item);
        if (!zhashx_lookup (self->rules, id))
            return 0;
        r = NULL;
    }
    size_t allowed = r ? r->allow.count : 0, denied = r ? r->deny.count : 0;
    int rc = s_replace (self, id, r, err);
    if (rc == 0)
        sbx_info ("sandbox=%s egress rules: %zu allowed, %zu denied (uid %u)", id, allowed, denied,
                  (unsigned) uid);
    return rc;
}

int vmd_egress_move (vmd_egress_t *self, const char *id, uid_t uid, sbx_err_t *err)
{
    s_rules_t *r = zhashx_lookup (self->rules, id);
    if (!r || r->uid == uid)
        return 0;
    s_rules_t *copy = s_rules_copy (r); //  r goes when replaced
    if (!copy)
        return sbx_err_set (err, SBX_E_INTERNAL, "out of memory");
    int rc = vmd_egress_set (self, id, uid, &copy->allow, &copy->deny, err);
    void *item = copy;
    s_rules_destroy (&item);
    return rc;
}

void vmd_egress_forget (vmd_egress_t *self, const char *id)
{
    sbx_err_t err = {0};
    if (zhashx_lookup (self->rules, id) && s_replace (self, id, NULL, &err) == -1)
        sbx_error ("sandbox=%s: its egress rules stay in the table: %s", id, err.message);
}

void vmd_egress_prune (vmd_egress_t *self, bool (*keep) (const char *id, void *arg), void *arg)
{
    zlistx_t *ids = zhashx_keys (self->rules);
    for (const char *id = ids ? zlistx_first (ids) : NULL; id; id = zlistx_next (ids))
        if (!keep (id, arg)) {
            sbx_info ("sandbox=%s is gone: its egress rules are dropped", id);
            vmd_egress_forget (self, id);
        }
    zlistx_destroy (&ids);
}

bool vmd_egress_has (vmd_egress_t *self, const char *id)
{
    return zhashx_lookup (self->rules, id) != NULL;
}

//  --------------------------------------------------------------------------
//  Self-test: a table of the test's own (uids nobody has), loaded for real when root.

static char *s_test_list (const char *table)
{
    char cmd[128];
    snprintf (cmd, sizeof cmd, "nft list table inet %s 2>&1", table);
    FILE *p = popen (cmd, "r");
    assert (p);
    char *out = calloc (1, 65536);
    assert (out);
    size_t n = fread (out, 1, 65535, p);
    out[n] = 0;
    pclose (p);
    return out;
}

static bool s_test_keep_none (const char *id, void *arg)
{
    (void) id;
    (void) arg;
    return false;
}

void vmd_egress_test (bool verbose)
{
    if (verbose)
        printf (" * vmd_egress: ");
    char dir[] = "/tmp/vmd_egress_test_XXXXXX";
    assert (mkdtemp (dir));
    char table[32];
    snprintf (table, sizeof table, "sbx_egress_t%d", (int) getpid ());
    bool root = geteuid () == 0;
    vmd_egress_t *eg = vmd_egress_new (dir, table, NULL);
    assert (eg);
    const uid_t uid = 4000000001u;

    //  Bad entries and domains are refused before anything changes.
    sbx_strlist_t allow = {0}, deny = {0};
    sbx_err_t err = {0};
    sbx_strlist_append (&allow, "a..b");
    assert (vmd_egress_set (eg, "sb-1", uid, &allow, &deny, &err) == -1);
    assert (err.code == SBX_E_INVALID_ARGUMENT && strstr (err.message, "allow[0]"));
    sbx_strlist_clear (&allow);
    sbx_strlist_append (&deny, "203.0.113.7");
    sbx_strlist_append (&deny, "Example.COM");
    err = (sbx_err_t){0};
    assert (vmd_egress_set (eg, "sb-1", uid, &allow, &deny, &err) == -1);
    assert (err.code == SBX_E_FAILED_PRECONDITION && strstr (err.message, "deny[1]"));
    //  No uid of its own: rules can't be told apart.
    sbx_strlist_clear (&deny);
    sbx_strlist_append (&deny, "203.0.113.7");
    err = (sbx_err_t){0};
    assert (vmd_egress_set (eg, "sb-1", 0, &allow, &deny, &err) == -1);
    assert (err.code == SBX_E_FAILED_PRECONDITION);
    assert (!vmd_egress_has (eg, "sb-1"));
    //  Empty lists for a guest without rules: nothing to do, nft not needed.
    sbx_strlist_clear (&deny);
    assert (vmd_egress_set (eg, "sb-0", uid, &allow, &deny, &err) == 0);
    assert (!vmd_egress_has (eg, "sb-0"));

    //  The text: deny before allow, covered networks left out, the allow list closed.
    sbx_strlist_append (&deny, "198.51.100.9");
    sbx_strlist_append (&deny, "2001:db8::/32");
    sbx_strlist_append (&allow, "198.51.100.0/24");
    sbx_strlist_append (&allow, "198.51.100.128/25");
    sbx_strlist_append (&allow, "198.51.100.0/24");
    sbx_strlist_append (&allow, "8.8.8.8");
    err = (sbx_err_t){0};
    int rc = vmd_egress_set (eg, "sb-1", uid, &allow, &deny, &err);
    if (!root) {
        //  Not root: nft can't load a table, and the rules in force stay as they were.
        assert (rc == -1 && err.code == SBX_E_INTERNAL && !vmd_egress_has (eg, "sb-1"));
        vmd_egress_destroy (&eg);
        sbx_strlist_clear (&allow);
        sbx_strlist_clear (&deny);
        rmdir (dir);
        if (verbose)
            printf ("OK (not root: the table is not loaded)\n");
        return;
    }
    assert (rc == 0);
    assert (vmd_egress_has (eg, "sb-1"));
    char *rules = vmd_egress_ruleset (eg);
    if (verbose)
        printf ("\n%s", rules);
    assert (strstr (rules, "meta skuid 4000000001 jump g_4000000001 comment \"sb-1\"\n"));
    assert (strstr (rules, "ip daddr { 198.51.100.9/32 } jump refuse comment \"deny\"\n"));
    assert (strstr (rules, "ip6 daddr { 2001:db8::/32 } jump refuse comment \"deny\"\n"));
    assert (strstr (rules, "ip daddr { 198.51.100.0/24, 8.8.8.8/32 } accept comment \"allow\"\n"));
    assert (strstr (rules, "jump refuse comment \"not in the allow list\"\n"));
    assert (strstr (rules, "jump refuse comment \"deny\"") <
            strstr (rules, "accept comment \"allow\""));
    assert (strstr (rules, "meta l4proto tcp reject with tcp reset\n"));
    assert (strstr (rules, "priority filter + 10;"));
    //  Loaded in the kernel, as written.
    char *listed = s_test_list (table);
    assert (strstr (listed, "meta skuid 4000000001 jump g_4000000001"));
    assert (strstr (listed, "ip daddr 198.51.100.9 jump refuse"));
    assert (strstr (listed, "not in the allow list"));
    free (listed);

    //  A restarted vmd loads the same rules from the disk; a bad file is skipped.
    char bad[PATH_MAX];
    snprintf (bad, sizeof bad, "%s/sb-bad.json", dir);
    FILE *f = fopen (bad, "w");
    assert (f);
    fputs ("{\"uid\": 4000000002, \"allow\": [\"1.2.3.4/33\"], \"deny\": []}", f);
    fclose (f);
    vmd_egress_t *again = vmd_egress_new (dir, table, NULL);
    assert (again && vmd_egress_has (again, "sb-1") && !vmd_egress_has (again, "sb-bad"));
    char *rules2 = vmd_egress_ruleset (again);
    assert (streq (rules, rules2));
    zstr_free (&rules2);
    unlink (bad);

    //  An allow list alone, then a move to another uid, then nothing.
    sbx_strlist_clear (&deny);
    sbx_strlist_clear (&allow);
    sbx_strlist_append (&allow, "2001:db8:1::/48");
    assert (vmd_egress_set (again, "sb-2", uid + 1, &allow, &deny, &err) == 0);
    assert (vmd_egress_move (again, "sb-2", uid + 2, &err) == 0);
    rules2 = vmd_egress_ruleset (again);
    assert (strstr (rules2, "meta skuid 4000000003 jump g_4000000003 comment \"sb-2\""));
    assert (!strstr (rules2, "4000000002"));
    assert (!strstr (rules2, "ip daddr { 2001"));
    zstr_free (&rules2);
    vmd_egress_forget (again, "sb-2");
    assert (!vmd_egress_has (again, "sb-2"));
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/sb-2.json", dir);
    assert (access (path, F_OK) == -1);

    //  Pruning drops the guests the caller no longer has.
    vmd_egress_prune (again, s_test_keep_none, NULL);
    assert (!vmd_egress_has (again, "sb-1"));
    listed = s_test_list (table);
    assert (!strstr (listed, "skuid"));
    free (listed);
    zstr_free (&rules);
    vmd_egress_destroy (&again);
    vmd_egress_destroy (&eg);
    sbx_strlist_clear (&allow);
    sbx_strlist_clear (&deny);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "nft delete table inet %s", table);
    assert (system (cmd) == 0);
    rmdir (dir);
    if (verbose)
        printf ("OK\n");
}
