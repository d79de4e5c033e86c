/*  vmd_egress - see vmd_egress.h */
#include "vmd_egress.h"
#include "sbx_clock.h"
#include "sbx_egress.h"
#include "sbx_log.h"
#include "vmd_dns.h"
#include "vmd_firewall.h"
#include "vmd_guest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_LEARN_MIN_MS (300 * 1000)
#define S_LEARN_MAX_MS (86400 * 1000)
#define S_SWEEP_MS     (30 * 1000)

//  An address an allowed name resolved to, allowed until then (wall clock, ms).
typedef struct {
    int family;
    uint8_t addr[16];
    uint64_t until_ms;
} s_learned_t;

//  One guest's rules: its entries as given (canonical text), kept in order, and the
//  addresses its allowed names resolved to.
typedef struct {
    uid_t uid;
    sbx_strlist_t allow;
    sbx_strlist_t deny;
    s_learned_t *learned;
    size_t learned_count;
} s_rules_t;

//  A guest with domain rules: its DNS relay, which asks the rules of id at each query.
typedef struct {
    vmd_egress_t *owner;
    char id[80];
    vmd_dns_t *dns;
    int64_t retired_ms; //  when it left the relays table (monotonic)
} s_relay_t;

struct _vmd_egress_t {
    char *dir;
    char *table; //  VMD_EGRESS_TABLE, or a test's own
    char *nft_path;
    zhashx_t *rules;   //  sandbox id -> s_rules_t
    zhashx_t *relays;  //  sandbox id -> s_relay_t, for the guests with domain rules
    zlistx_t *retired; //  relays closed, to free once the loop is past them
    char *loaded;      //  the table in the kernel now (NULL: not loaded by us)
    zloop_t *loop;     //  NULL until vmd_egress_set_dns: domain rules are refused
    char *upstream;    //  the relays' resolver (NULL: resolv.conf's, when a relay starts)
    uint16_t upstream_port;
    int sweep; //  the timer that forgets expired learned addresses
};

static void s_rules_destroy (void **item)
{
    s_rules_t *r = *item;
    if (r) {
        sbx_strlist_clear (&r->allow);
        sbx_strlist_clear (&r->deny);
        free (r->learned);
        free (r);
    }
    *item = NULL;
}

static void s_relay_free (s_relay_t **relay_p)
{
    if (*relay_p) {
        vmd_dns_destroy (&(*relay_p)->dns);
        free (*relay_p);
        *relay_p = NULL;
    }
}

//  The relays table's destructor: a relay leaving it is closed at once and freed a
//  while later (s_on_sweep), since the loop may still call one of its pollers in the
//  pass that removed it.
static void s_relay_retire (void **item)
{
    s_relay_t *relay = *item;
    if (relay) {
        vmd_dns_close (relay->dns);
        relay->retired_ms = zclock_mono ();
        if (!relay->owner->retired || !zlistx_add_end (relay->owner->retired, relay))
            s_relay_free (&relay); //  (no loop runs then: tests, or out of memory)
    }
    *item = NULL;
}

//  True when list has a domain name (entries are canonical: a name has no '/').
static bool s_has_domain (const sbx_strlist_t *list)
{
    for (size_t i = 0; i < list->count; i++)
        if (!strchr (list->items[i], '/'))
            return true;
    return false;
}

static bool s_lists_equal (const sbx_strlist_t *a, const sbx_strlist_t *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++)
        if (!streq (a->items[i], b->items[i]))
            return false;
    return true;
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

//  The learned addresses of family, as an nft elements list ("a, b"; "" for none).
static char *s_learned_set (const s_rules_t *r, int family)
{
    char *out = calloc (1, r->learned_count * (INET6_ADDRSTRLEN + 2) + 1);
    for (size_t i = 0; out && i < r->learned_count; i++) {
        if (r->learned[i].family != family)
            continue;
        char text[INET6_ADDRSTRLEN];
        inet_ntop (family, r->learned[i].addr, text, sizeof text);
        if (*out)
            strcat (out, ", ");
        strcat (out, text);
    }
    return out;
}

//  A guest's sets of learned addresses (its allow list has names), appended to sets.
static int s_sets (zchunk_t *sets, uid_t uid, const s_rules_t *r)
{
    char *l4 = s_learned_set (r, AF_INET), *l6 = s_learned_set (r, AF_INET6);
    char *text = l4 && l6 ? zsys_sprintf ("\tset l4_%u {\n\t\ttype ipv4_addr\n%s%s%s\t}\n"
                                          "\tset l6_%u {\n\t\ttype ipv6_addr\n%s%s%s\t}\n",
                                          (unsigned) uid, *l4 ? "\t\telements = { " : "", l4,
                                          *l4 ? " }\n" : "", (unsigned) uid,
                                          *l6 ? "\t\telements = { " : "", l6, *l6 ? " }\n" : "")
                          : NULL;
    if (text)
        zchunk_extend (sets, text, strlen (text));
    int rc = text ? 0 : -1;
    zstr_free (&text);
    free (l4);
    free (l6);
    return rc;
}

//  One guest's chain, appended to chains. A guest with domain rules has its UDP DNS
//  redirected to its relay (port; 0 while it has none, and then its DNS is refused) and
//  any other DNS refused, so that no name is resolved past its rules.
static int s_chain (zchunk_t *chains, uid_t uid, const s_rules_t *r, bool names)
{
    char *d4 = s_set (&r->deny, AF_INET), *d6 = s_set (&r->deny, AF_INET6);
    char *a4 = s_set (&r->allow, AF_INET), *a6 = s_set (&r->allow, AF_INET6);
    char *lines[6] = {NULL};
    int rc = d4 && d6 && a4 && a6 ? 0 : -1;
    bool learned = s_has_domain (&r->allow);
    if (rc == 0) {
        lines[0] = names ? zsys_sprintf ("\t\tmeta l4proto udp ip daddr 127.0.0.1 ct status dnat "
                                         "ct original proto-dst 53 accept comment \"dns, "
                                         "answered by its relay\"\n"
                                         "\t\tmeta l4proto { tcp, udp } th dport 53 jump refuse "
                                         "comment \"dns its relay does not answer (tcp, "
                                         "ipv6)\"\n")
                         : strdup ("\t\tmeta l4proto { tcp, udp } th dport 53 accept comment "
                                   "\"dns (the fixed policy keeps it to the resolver)\"\n");
        lines[1] = s_match (AF_INET, d4, "jump refuse comment \"deny\"");
        lines[2] = s_match (AF_INET6, d6, "jump refuse comment \"deny\"");
        lines[3] = s_match (AF_INET, a4, "accept comment \"allow\"");
        lines[4] = s_match (AF_INET6, a6, "accept comment \"allow\"");
        lines[5] = learned
                       ? zsys_sprintf ("\t\tip daddr @l4_%u accept comment \"allowed names\"\n"
                                       "\t\tip6 daddr @l6_%u accept comment \"allowed names\"\n",
                                       (unsigned) uid, (unsigned) uid)
                       : strdup ("");
    }
    for (int i = 0; i < 6; i++)
        if (!lines[i])
            rc = -1;
    char *text = rc == 0 ? zsys_sprintf ("\tchain g_%u {\n"
                                         "\t\tct state established,related accept\n"
                                         "%s%s%s%s%s%s%s"
                                         "\t}\n",
                                         (unsigned) uid, lines[0], lines[1], lines[2], lines[3],
                                         lines[4], lines[5],
                                         r->allow.count ? "\t\tjump refuse comment \"not in the "
                                                          "allow list\"\n"
                                                        : "")
                         : NULL;
    if (text)
        zchunk_extend (chains, text, strlen (text)); //  (czmq asserts on no memory)
    rc = text ? 0 : -1;
    zstr_free (&text);
    for (int i = 0; i < 6; i++)
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
    zchunk_t *sets = zchunk_new (NULL, 0), *redirects = zchunk_new (NULL, 0);
    int rc = jumps && chains && sets && redirects ? 0 : -1;
    //  Sorted by id, so the same rules make the same text (and no reload).
    zlistx_t *ids = zhashx_keys (self->rules);
    if (ids) {
        zlistx_set_comparator (ids, (zlistx_comparator_fn *) strcmp);
        zlistx_sort (ids);
    }
    for (const char *id = ids ? zlistx_first (ids) : NULL; id && rc == 0; id = zlistx_next (ids)) {
        s_rules_t *r = zhashx_lookup (self->rules, id);
        char line[200];
        snprintf (line, sizeof line, "\t\tmeta skuid %u jump g_%u comment \"%.64s\"\n",
                  (unsigned) r->uid, (unsigned) r->uid, id);
        zchunk_extend (jumps, line, strlen (line));
        bool names = s_has_domain (&r->allow) || s_has_domain (&r->deny);
        s_relay_t *relay = names ? zhashx_lookup (self->relays, id) : NULL;
        if (relay) {
            snprintf (line, sizeof line,
                      "\t\tmeta skuid %u meta nfproto ipv4 udp dport 53 redirect to :%u comment "
                      "\"%.64s\"\n",
                      (unsigned) r->uid, (unsigned) vmd_dns_port (relay->dns), id);
            zchunk_extend (redirects, line, strlen (line));
        }
        if (s_has_domain (&r->allow))
            rc = s_sets (sets, r->uid, r);
        if (rc == 0)
            rc = s_chain (chains, r->uid, r, names);
    }
    zlistx_destroy (&ids);
    //  Redirected DNS goes to 127.0.0.1: vmd_firewall's fixed policy lets that pass
    //  (ct status dnat, originally to port 53), and so does the guest's chain.
    char *dns = rc == 0 && zchunk_size (redirects)
                    ? zsys_sprintf ("\tchain dns {\n"
                                    "\t\ttype nat hook output priority -100; policy accept;\n"
                                    "%.*s"
                                    "\t}\n",
                                    (int) zchunk_size (redirects), (char *) zchunk_data (redirects))
                    : strdup ("");
    char *rules = rc == 0 && dns
                      ? zsys_sprintf ("table inet %s\n"
                                      "delete table inet %s\n"
                                      "table inet %s {\n"
                                      "%.*s"
                                      "\tchain output {\n"
                                      "\t\ttype filter hook output priority filter + 10; "
                                      "policy accept;\n"
                                      "%.*s"
                                      "\t}\n"
                                      "%s"
                                      "\tchain refuse {\n"
                                      "\t\tmeta l4proto tcp reject with tcp reset\n"
                                      "\t\treject\n"
                                      "\t}\n"
                                      "%.*s"
                                      "}\n",
                                      self->table, self->table, self->table,
                                      (int) zchunk_size (sets), (char *) zchunk_data (sets),
                                      (int) zchunk_size (jumps), (char *) zchunk_data (jumps), dns,
                                      (int) zchunk_size (chains), (char *) zchunk_data (chains))
                      : NULL;
    zstr_free (&dns);
    zchunk_destroy (&jumps);
    zchunk_destroy (&chains);
    zchunk_destroy (&sets);
    zchunk_destroy (&redirects);
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
    json_t *root = json_pack ("{s:I, s:[], s:[], s:[]}", "uid", (json_int_t) r->uid, "allow",
                              "deny", "learned");
    for (size_t i = 0; root && i < r->allow.count; i++)
        json_array_append_new (json_object_get (root, "allow"), json_string (r->allow.items[i]));
    for (size_t i = 0; root && i < r->deny.count; i++)
        json_array_append_new (json_object_get (root, "deny"), json_string (r->deny.items[i]));
    //  Learned addresses too, so that a restarted vmd does not refuse a guest the
    //  addresses it resolved before.
    for (size_t i = 0; root && i < r->learned_count; i++) {
        char text[INET6_ADDRSTRLEN];
        inet_ntop (r->learned[i].family, r->learned[i].addr, text, sizeof text);
        json_array_append_new (json_object_get (root, "learned"),
                               json_pack ("{s:s, s:I}", "address", text, "until_ms",
                                          (json_int_t) r->learned[i].until_ms));
    }
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
    //  Learned addresses (optional): those still current, and only for allowed names.
    json_t *learned = root ? json_object_get (root, "learned") : NULL;
    uint64_t now = sbx_clock_now_ms ();
    if (ok && json_is_array (learned) && s_has_domain (&r->allow)) {
        size_t n = json_array_size (learned);
        r->learned = calloc (n ? n : 1, sizeof *r->learned);
        ok = r->learned != NULL;
        for (size_t i = 0; ok && i < n && r->learned_count < VMD_EGRESS_LEARNED; i++) {
            const char *text = NULL;
            json_int_t until = 0;
            s_learned_t *l = &r->learned[r->learned_count];
            if (json_unpack (json_array_get (learned, i), "{s:s, s:I}", "address", &text,
                             "until_ms", &until) == -1 ||
                until <= (json_int_t) now || until > (json_int_t) (now + S_LEARN_MAX_MS))
                continue;
            l->family = strchr (text, ':') ? AF_INET6 : AF_INET;
            if (inet_pton (l->family, text, l->addr) != 1)
                continue;
            l->until_ms = (uint64_t) until;
            r->learned_count++;
        }
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
    self->relays = zhashx_new ();
    self->retired = zlistx_new ();
    if (!self->dir || !self->table || (nft_path && !self->nft_path) || !self->rules ||
        !self->relays || !self->retired) {
        vmd_egress_destroy (&self);
        return NULL;
    }
    zhashx_set_destructor (self->rules, s_rules_destroy);
    zhashx_set_destructor (self->relays, s_relay_retire);
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
    if (self->sweep > 0)
        zloop_timer_end (self->loop, self->sweep);
    zhashx_destroy (&self->relays); //  (their sockets leave the loop)
    for (s_relay_t *relay = self->retired ? zlistx_first (self->retired) : NULL; relay;
         relay = zlistx_next (self->retired))
        s_relay_free (&relay);
    zlistx_destroy (&self->retired);
    zhashx_destroy (&self->rules);
    free (self->upstream);
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
    if (ok && from->learned_count) {
        r->learned = malloc (from->learned_count * sizeof *r->learned);
        ok = r->learned != NULL;
        if (ok) {
            memcpy (r->learned, from->learned, from->learned_count * sizeof *r->learned);
            r->learned_count = from->learned_count;
        }
    }
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

//  --------------------------------------------------------------------------
//  Domain rules: each such guest's DNS relay asks its rules at every query

//  A denied name is refused. With names in the allow list, an allowed name's addresses
//  are learned and every other name is refused, so that DNS can't carry data out past
//  an allow list.
static vmd_dns_verdict_t s_policy (const char *name, void *arg)
{
    s_relay_t *relay = arg;
    s_rules_t *r = zhashx_lookup (relay->owner->rules, relay->id);
    if (!r)
        return VMD_DNS_REFUSE;
    for (size_t i = 0; i < r->deny.count; i++)
        if (!strchr (r->deny.items[i], '/') && sbx_egress_domain_matches (r->deny.items[i], name))
            return VMD_DNS_REFUSE;
    bool names = false;
    for (size_t i = 0; i < r->allow.count; i++)
        if (!strchr (r->allow.items[i], '/')) {
            names = true;
            if (sbx_egress_domain_matches (r->allow.items[i], name))
                return VMD_DNS_LEARN;
        }
    return names ? VMD_DNS_REFUSE : VMD_DNS_PASS;
}

//  Drops r's learned addresses that expired by now; true when there were any.
static bool s_expire (s_rules_t *r, uint64_t now)
{
    size_t kept = 0;
    for (size_t i = 0; i < r->learned_count; i++)
        if (r->learned[i].until_ms > now)
            r->learned[kept++] = r->learned[i];
    bool dropped = kept != r->learned_count;
    r->learned_count = kept;
    return dropped;
}

//  An allowed name's answer: its addresses join the guest's sets before the guest sees
//  the answer, kept for the answer's TTL within S_LEARN_MIN_MS..S_LEARN_MAX_MS (programs
//  keep answers a while beyond a short TTL). -1 (the guest gets SERVFAIL) when they
//  can't be added.
static int s_learn (const char *name, const vmd_dns_addr_t *addrs, size_t count, void *arg)
{
    s_relay_t *relay = arg;
    vmd_egress_t *self = relay->owner;
    s_rules_t *r = zhashx_lookup (self->rules, relay->id);
    if (!r)
        return -1;
    uint64_t now = sbx_clock_now_ms (); //  (expired ones go at the sweep, with a reload)
    s_learned_t *grown = realloc (r->learned, (r->learned_count + count + 1) * sizeof *grown);
    if (!grown)
        return -1;
    r->learned = grown;
    size_t before = r->learned_count;
    char add4[VMD_DNS_ADDRS * (INET6_ADDRSTRLEN + 2) + 1] = "",
                                                       add6[VMD_DNS_ADDRS * (INET6_ADDRSTRLEN + 2) +
                                                            1] = "";
    for (size_t i = 0; i < count && i < VMD_DNS_ADDRS; i++) {
        const vmd_dns_addr_t *a = &addrs[i];
        if (a->family != AF_INET && a->family != AF_INET6)
            continue;
        uint64_t life = (uint64_t) a->ttl * 1000;
        life = life < S_LEARN_MIN_MS   ? S_LEARN_MIN_MS
               : life > S_LEARN_MAX_MS ? S_LEARN_MAX_MS
                                       : life;
        size_t size = a->family == AF_INET ? 4 : 16, j;
        for (j = 0; j < r->learned_count; j++)
            if (r->learned[j].family == a->family && !memcmp (r->learned[j].addr, a->addr, size))
                break;
        if (j < r->learned_count) { //  known: it lives on
            if (r->learned[j].until_ms < now + life)
                r->learned[j].until_ms = now + life;
            continue;
        }
        if (r->learned_count >= VMD_EGRESS_LEARNED) {
            sbx_warn ("sandbox=%s has learned %d addresses of its allowed names: %s is refused",
                      relay->id, VMD_EGRESS_LEARNED, name);
            r->learned_count = before;
            return -1;
        }
        s_learned_t *l = &r->learned[r->learned_count++];
        *l = (s_learned_t){.family = a->family, .until_ms = now + life};
        memcpy (l->addr, a->addr, size);
        char text[INET6_ADDRSTRLEN];
        inet_ntop (a->family, a->addr, text, sizeof text);
        char *to = a->family == AF_INET ? add4 : add6;
        if (*to)
            strcat (to, ", ");
        strcat (to, text);
    }
    if (r->learned_count == before) {
        s_save (self, relay->id, r); //  (later expiries; losing them costs a lookup)
        return 0;
    }
    //  Only the new elements: a whole reload per answer would cost every guest's rules.
    char *text4 = *add4 ? zsys_sprintf ("add element inet %s l4_%u { %s }\n", self->table,
                                        (unsigned) r->uid, add4)
                        : strdup ("");
    char *text6 = *add6 ? zsys_sprintf ("add element inet %s l6_%u { %s }\n", self->table,
                                        (unsigned) r->uid, add6)
                        : strdup ("");
    char *text = text4 && text6 ? zsys_sprintf ("%s%s", text4, text6) : NULL;
    char out[1024] = "";
    int rc = text ? vmd_firewall_nft (self->nft_path, text, false, out, sizeof out) : -1;
    if (rc == -1) {
        sbx_error ("sandbox=%s: cannot allow the addresses of %s: %s", relay->id, name,
                   *out ? out : "out of memory");
        r->learned_count = before;
    } else {
        zstr_free (&self->loaded); //  the kernel's table has more than the text now
        s_save (self, relay->id, r);
    }
    zstr_free (&text4);
    zstr_free (&text6);
    zstr_free (&text);
    return rc;
}

//  The relay of guest id, started when it has none. NULL, with err, when it can't be.
static s_relay_t *s_relay_ensure (vmd_egress_t *self, const char *id, bool *made, sbx_err_t *err)
{
    *made = false;
    s_relay_t *relay = zhashx_lookup (self->relays, id);
    if (relay)
        return relay;
    if (!self->loop) {
        sbx_err_set (err, SBX_E_FAILED_PRECONDITION,
                     "this vmd does not enforce domain names in egress rules (no DNS relay): "
                     "name the addresses instead");
        return NULL;
    }
    char resolver[INET6_ADDRSTRLEN];
    if (self->upstream)
        snprintf (resolver, sizeof resolver, "%s", self->upstream);
    else
        vmd_firewall_resolver (NULL, AF_INET, resolver, sizeof resolver);
    relay = calloc (1, sizeof *relay);
    if (relay) {
        relay->owner = self;
        snprintf (relay->id, sizeof relay->id, "%s", id);
        relay->dns =
            vmd_dns_new (self->loop, resolver, self->upstream_port, s_policy, s_learn, relay);
    }
    if (!relay || !relay->dns) {
        s_relay_free (&relay);
        sbx_err_set (err, SBX_E_INTERNAL,
                     "cannot start the DNS relay for the domain names of the egress rules "
                     "(resolver %s): the rules in force are unchanged",
                     resolver);
        return NULL;
    }
    zhashx_update (self->relays, id, relay);
    *made = true;
    sbx_info ("sandbox=%s: its DNS goes through a relay on 127.0.0.1:%u to %s (domain rules)", id,
              (unsigned) vmd_dns_port (relay->dns), resolver);
    return relay;
}

static int s_on_sweep (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    vmd_egress_t *self = arg;
    //  Relays retired a while ago: the loop is long past their last poll.
    s_relay_t *relay = zlistx_first (self->retired);
    while (relay && zclock_mono () - relay->retired_ms > 1000) {
        zlistx_detach_cur (self->retired);
        s_relay_free (&relay);
        relay = zlistx_first (self->retired);
    }
    uint64_t now = sbx_clock_now_ms ();
    bool dropped = false;
    for (s_rules_t *r = zhashx_first (self->rules); r; r = zhashx_next (self->rules))
        if (s_expire (r, now)) {
            s_save (self, zhashx_cursor (self->rules), r);
            dropped = true;
        }
    sbx_err_t err = {0};
    if (dropped && s_load (self, &err) == -1)
        sbx_warn ("expired learned addresses stay allowed until the next reload: %s", err.message);
    return 0;
}

int vmd_egress_set_dns (vmd_egress_t *self, zloop_t *loop, const char *upstream)
{
    char addr[INET_ADDRSTRLEN] = "";
    unsigned port = 53;
    if (upstream && *upstream) {
        const char *colon = strchr (upstream, ':');
        size_t n = colon ? (size_t) (colon - upstream) : strlen (upstream);
        struct in_addr bin;
        char *end = NULL;
        if (colon)
            port = (unsigned) strtoul (colon + 1, &end, 10);
        if (n >= sizeof addr ||
            (colon && (end == colon + 1 || *end || port == 0 || port > 65535))) {
            sbx_error ("vmd.egress_resolver is \"%s\": use an IPv4 address, with :port or not",
                       upstream);
            return -1;
        }
        memcpy (addr, upstream, n);
        addr[n] = 0;
        if (inet_pton (AF_INET, addr, &bin) != 1) {
            sbx_error ("vmd.egress_resolver is \"%s\": use an IPv4 address, with :port or not",
                       upstream);
            return -1;
        }
    }
    zstr_free (&self->upstream);
    self->upstream = *addr ? strdup (addr) : NULL;
    self->upstream_port = (uint16_t) port;
    self->loop = loop;
    if (self->sweep <= 0)
        self->sweep = zloop_timer (loop, S_SWEEP_MS, 0, s_on_sweep, self);
    //  The guests whose rules came from disk get their relays now.
    int rc = 0;
    for (s_rules_t *r = zhashx_first (self->rules); r; r = zhashx_next (self->rules)) {
        const char *id = zhashx_cursor (self->rules);
        bool made;
        sbx_err_t err = {0};
        if ((s_has_domain (&r->allow) || s_has_domain (&r->deny)) &&
            !s_relay_ensure (self, id, &made, &err)) {
            sbx_error ("sandbox=%s: %s", id, err.message);
            rc = -1;
        }
    }
    sbx_err_t err = {0};
    return rc == 0 ? s_load (self, &err) : -1;
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
    bool names = r && (s_has_domain (&r->allow) || s_has_domain (&r->deny)), made = false;
    if (names && !s_relay_ensure (self, id, &made, err)) {
        void *item = r;
        s_rules_destroy (&item);
        item = old;
        s_rules_destroy (&item);
        return -1;
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
        if (!names)
            zhashx_delete (self->relays, id); //  (its redirect is gone from the table)
        return 0;
    }
    if (made)
        zhashx_delete (self->relays, id);
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
    //  The same rules again (a resume): what the guest learned stays allowed.
    s_rules_t *current = r ? zhashx_lookup (self->rules, id) : NULL;
    if (current && current->uid == uid && s_lists_equal (&current->allow, &r->allow) &&
        s_lists_equal (&current->deny, &r->deny) && current->learned_count) {
        r->learned = malloc (current->learned_count * sizeof *r->learned);
        if (r->learned) {
            memcpy (r->learned, current->learned, current->learned_count * sizeof *r->learned);
            r->learned_count = current->learned_count;
        }
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

    //  Bad entries, and domains before vmd_egress_set_dns, are refused before anything
    //  changes.
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
    assert (err.code == SBX_E_FAILED_PRECONDITION && strstr (err.message, "domain names"));
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

    //  Domain names: refused until there is a loop for relays; then a relay, a redirect
    //  and sets, names judged by the rules, learned addresses in the kernel and on disk.
    vmd_egress_t *named = vmd_egress_new (dir, table, NULL);
    assert (named);
    sbx_strlist_clear (&allow);
    sbx_strlist_clear (&deny);
    sbx_strlist_append (&allow, "Example.com");
    sbx_strlist_append (&allow, "198.51.100.0/24");
    sbx_strlist_append (&deny, "ads.example.com");
    const uid_t named_uid = uid + 3;
    err = (sbx_err_t){0};
    assert (vmd_egress_set (named, "sb-3", named_uid, &allow, &deny, &err) == -1);
    assert (err.code == SBX_E_FAILED_PRECONDITION && !vmd_egress_has (named, "sb-3"));
    zloop_t *loop = zloop_new ();
    assert (loop);
    assert (vmd_egress_set_dns (named, loop, "resolver.example") == -1);
    assert (vmd_egress_set_dns (named, loop, "127.0.0.1:99999") == -1);
    assert (vmd_egress_set_dns (named, loop, "127.0.0.1:9") == 0);
    assert (vmd_egress_set (named, "sb-3", named_uid, &allow, &deny, &err) == 0);
    s_relay_t *relay = zhashx_lookup (named->relays, "sb-3");
    assert (relay && vmd_dns_port (relay->dns) > 0);
    rules = vmd_egress_ruleset (named);
    if (verbose)
        printf ("\n%s", rules);
    char want[160];
    snprintf (want, sizeof want,
              "meta skuid 4000000004 meta nfproto ipv4 udp dport 53 redirect to :%u comment "
              "\"sb-3\"",
              (unsigned) vmd_dns_port (relay->dns));
    assert (strstr (rules, want));
    assert (strstr (rules, "type nat hook output priority -100;"));
    assert (strstr (rules, "set l4_4000000004 {"));
    assert (strstr (rules, "ip daddr @l4_4000000004 accept"));
    assert (strstr (rules, "ip daddr 127.0.0.1 ct status dnat ct original proto-dst 53 accept"));
    assert (strstr (rules, "th dport 53 jump refuse"));
    zstr_free (&rules);
    listed = s_test_list (table);
    assert (strstr (listed, "redirect to :"));
    free (listed);
    assert (s_policy ("ads.example.com", relay) == VMD_DNS_REFUSE);
    assert (s_policy ("x.ads.example.com", relay) == VMD_DNS_REFUSE);
    assert (s_policy ("www.example.com", relay) == VMD_DNS_LEARN);
    assert (s_policy ("example.com", relay) == VMD_DNS_LEARN);
    assert (s_policy ("example.org", relay) == VMD_DNS_REFUSE); //  outside the allow list
    vmd_dns_addr_t addrs[3] = {{.family = AF_INET, .addr = {203, 0, 113, 9}, .ttl = 10},
                               {.family = AF_INET, .addr = {203, 0, 113, 9}, .ttl = 900},
                               {.family = AF_INET6, .addr = {0x20, 0x01, 0x0d, 0xb8, [15] = 9}}};
    uint64_t before = sbx_clock_now_ms ();
    assert (s_learn ("www.example.com", addrs, 3, relay) == 0);
    s_rules_t *r3 = zhashx_lookup (named->rules, "sb-3");
    assert (r3->learned_count == 2);
    assert (r3->learned[0].until_ms >= before + 900 * 1000); //  the longer TTL of the two
    assert (r3->learned[1].until_ms >= before + S_LEARN_MIN_MS);
    listed = s_test_list (table);
    assert (strstr (listed, "203.0.113.9") && strstr (listed, "2001:db8::9"));
    free (listed);
    //  A restarted vmd has them again; the same rules again (a resume) keep them.
    again = vmd_egress_new (dir, table, NULL);
    assert (again);
    rules = vmd_egress_ruleset (again);
    assert (strstr (rules, "elements = { 203.0.113.9 }"));
    zstr_free (&rules);
    vmd_egress_destroy (&again);
    assert (vmd_egress_set (named, "sb-3", named_uid, &allow, &deny, &err) == 0);
    r3 = zhashx_lookup (named->rules, "sb-3");
    assert (r3->learned_count == 2);
    //  Expired ones go at the sweep.
    r3->learned[0].until_ms = 1;
    s_on_sweep (loop, 0, named);
    listed = s_test_list (table);
    assert (!strstr (listed, "203.0.113.9") && strstr (listed, "2001:db8::9"));
    free (listed);
    //  Names in the deny list alone: other names pass, nothing is learned.
    sbx_strlist_clear (&allow);
    assert (vmd_egress_set (named, "sb-3", named_uid, &allow, &deny, &err) == 0);
    relay = zhashx_lookup (named->relays, "sb-3");
    assert (relay && s_policy ("example.org", relay) == VMD_DNS_PASS);
    assert (s_policy ("ads.example.com", relay) == VMD_DNS_REFUSE);
    r3 = zhashx_lookup (named->rules, "sb-3");
    assert (r3->learned_count == 0); //  other rules: learned anew
    rules = vmd_egress_ruleset (named);
    assert (strstr (rules, "redirect to :") && !strstr (rules, "set l4_"));
    zstr_free (&rules);
    //  CIDRs alone: no relay, the plain DNS rule.
    sbx_strlist_clear (&deny);
    sbx_strlist_append (&deny, "203.0.113.0/24");
    assert (vmd_egress_set (named, "sb-3", named_uid, &allow, &deny, &err) == 0);
    assert (zhashx_size (named->relays) == 0);
    rules = vmd_egress_ruleset (named);
    assert (!strstr (rules, "redirect") && strstr (rules, "th dport 53 accept"));
    zstr_free (&rules);
    vmd_egress_forget (named, "sb-3");
    vmd_egress_destroy (&named);
    zloop_destroy (&loop);
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
