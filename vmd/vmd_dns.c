/*  vmd_dns - see vmd_dns.h

    Queries that are responses (QR=1) are dropped, so that two relays can never answer
    each other in a loop; other opcodes than QUERY get NOTIMP. An answer upstream whose
    question does not parse is dropped like a spoof; one to a LEARN query whose answer
    section does not parse gets SERVFAIL (nothing could be learned from it); PASS answers
    go on as they are past their question. The counts are of answers sent: REFUSED ones,
    relayed PASS ones, relayed LEARN ones (after learn said 0). The policy and learn
    callbacks run inside the loop's handlers and must not destroy the relay.
*/
#include "vmd_dns.h"
#include "sbx_log.h"
#include "sbx_secret.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEADER         12
#define MAX_JUMPS      32
#define MAX_NAME       253
#define BATCH          64    //  datagrams read per wakeup, so one socket can't starve the loop
#define LOG_EVERY_MS   60000 //  refusals are logged at most this often
#define RCODE_FORMERR  1
#define RCODE_SERVFAIL 2
#define RCODE_NOTIMP   4
#define RCODE_REFUSED  5
#define TYPE_A         1
#define TYPE_AAAA      28
#define CLASS_IN       1

//  A query forwarded upstream, waiting for its answer.
typedef struct {
    bool used;
    bool learn;
    uint16_t id;       //  the id upstream sees
    uint16_t guest_id; //  the guest's own, restored in the answer
    struct sockaddr_in guest;
    char name[MAX_NAME + 3];
    uint16_t qtype, qclass;
    int64_t deadline;
} s_pending_t;

struct _vmd_dns_t {
    zloop_t *loop;
    int guest_fd;    //  127.0.0.1:port, what the guest's queries reach
    int upstream_fd; //  our own, to the resolver
    struct sockaddr_in upstream;
    uint16_t port;
    vmd_dns_policy_fn *policy;
    vmd_dns_learn_fn *learn;
    void *arg;
    int timeout_ms; //  VMD_DNS_TIMEOUT_MS; the test shortens it
    s_pending_t pending[VMD_DNS_PENDING];
    size_t in_flight;
    uint64_t refused, passed, learned;
    int64_t refusal_logged; //  when a refusal was last logged
    uint64_t refusals_unlogged;
    uint8_t buf[65536]; //  one datagram at a time
    uint8_t out[65536];
};

static uint16_t s_get16 (const uint8_t *p)
{
    return (uint16_t) (p[0] << 8 | p[1]);
}

static void s_put16 (uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t) (v >> 8);
    p[1] = (uint8_t) v;
}

//  --------------------------------------------------------------------------
//  Parsing

//  Decodes the name at off. Each compression pointer must point into the message body
//  and strictly before the start of the piece of name being read, so targets decrease
//  and no loop is possible (MAX_JUMPS bounds it besides). With out, the name is written
//  (lower case, dotted) and must be printable ASCII without dots inside labels; without,
//  only its structure is checked (records' owner names). *next: the offset after it.
static int s_name (const uint8_t *msg, size_t len, size_t off, char *out, size_t size, size_t *next)
{
    size_t pos = off, piece = off, text = 0;
    int jumps = 0;
    bool jumped = false;
    while (true) {
        if (pos >= len)
            return -1;
        uint8_t b = msg[pos];
        if ((b & 0xc0) == 0xc0) {
            if (pos + 1 >= len)
                return -1;
            size_t target = (size_t) (b & 0x3f) << 8 | msg[pos + 1];
            if (target < HEADER || target >= piece || ++jumps > MAX_JUMPS)
                return -1;
            if (!jumped)
                *next = pos + 2;
            jumped = true;
            pos = piece = target;
            continue;
        }
        if (b & 0xc0) //  0x40 and 0x80: labels over 63, or obsolete label types
            return -1;
        if (b == 0)
            break;
        if (pos + 1 + b > len)
            return -1;
        size_t add = b + (text ? 1 : 0);
        if (text + add > MAX_NAME)
            return -1;
        if (out) {
            if (text + add >= size)
                return -1;
            if (text)
                out[text] = '.';
            char *w = out + text + (text ? 1 : 0);
            for (size_t i = 0; i < b; i++) {
                uint8_t c = msg[pos + 1 + i];
                if (c < 0x21 || c > 0x7e || c == '.')
                    return -1;
                w[i] = (char) (c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
            }
        }
        text += add;
        pos += 1 + b;
    }
    if (!jumped)
        *next = pos + 1;
    if (out) {
        if (size == 0)
            return -1;
        out[text] = 0;
    }
    return 0;
}

int vmd_dns_question (const uint8_t *msg, size_t len, char *name, size_t size, uint16_t *qtype,
                      uint16_t *qclass, size_t *end)
{
    if (!msg || !name || len < HEADER || s_get16 (msg + 4) != 1)
        return -1;
    size_t pos;
    if (s_name (msg, len, HEADER, name, size, &pos) == -1 || pos + 4 > len)
        return -1;
    if (qtype)
        *qtype = s_get16 (msg + pos);
    if (qclass)
        *qclass = s_get16 (msg + pos + 2);
    if (end)
        *end = pos + 4;
    return 0;
}

int vmd_dns_addresses (const uint8_t *msg, size_t len, vmd_dns_addr_t *addrs, size_t max)
{
    if (!msg || len < HEADER || (max && !addrs))
        return -1;
    size_t pos = HEADER, count = 0;
    for (uint16_t i = 0, n = s_get16 (msg + 4); i < n; i++) {
        if (s_name (msg, len, pos, NULL, 0, &pos) == -1 || pos + 4 > len)
            return -1;
        pos += 4;
    }
    for (uint16_t i = 0, n = s_get16 (msg + 6); i < n; i++) {
        if (s_name (msg, len, pos, NULL, 0, &pos) == -1 || pos + 10 > len)
            return -1;
        uint16_t type = s_get16 (msg + pos), klass = s_get16 (msg + pos + 2);
        uint32_t ttl = (uint32_t) s_get16 (msg + pos + 4) << 16 | s_get16 (msg + pos + 6);
        size_t rdlength = s_get16 (msg + pos + 8);
        pos += 10;
        if (pos + rdlength > len)
            return -1;
        if (klass == CLASS_IN && (type == TYPE_A || type == TYPE_AAAA)) {
            size_t want = type == TYPE_A ? 4 : 16;
            if (rdlength != want)
                return -1;
            if (count < max) {
                vmd_dns_addr_t *a = &addrs[count++];
                memset (a, 0, sizeof *a);
                a->family = type == TYPE_A ? AF_INET : AF_INET6;
                memcpy (a->addr, msg + pos, want);
                a->ttl = ttl;
            }
        }
        pos += rdlength;
    }
    return (int) count;
}

//  --------------------------------------------------------------------------
//  The relay

//  An answer made here from msg's header and its question (msg[12..qend), raw: a
//  question name never holds a pointer, pointers into the header are refused), with id
//  and rcode, to the guest. RD is copied; RA is set (we are the guest's recursive
//  resolver).
static void s_reply (vmd_dns_t *self, const uint8_t *msg, size_t qend, uint16_t id, int rcode,
                     const struct sockaddr_in *to)
{
    uint8_t *out = self->out;
    memset (out, 0, HEADER);
    s_put16 (out, id);
    out[2] = (uint8_t) (0x80 | (msg[2] & 0x78) | (msg[2] & 0x01)); //  QR, opcode, RD
    out[3] = (uint8_t) (0x80 | rcode);                             //  RA
    if (qend > HEADER) {
        s_put16 (out + 4, 1);
        memcpy (out + HEADER, msg + HEADER, qend - HEADER);
    }
    size_t len = qend > HEADER ? qend : HEADER;
    if (sendto (self->guest_fd, out, len, MSG_DONTWAIT, (const struct sockaddr *) to, sizeof *to) <
        0)
        sbx_debug ("dns port=%u reply not sent: %s", self->port, strerror (errno));
}

static void s_log_refusal (vmd_dns_t *self, const char *name)
{
    int64_t now = zclock_mono ();
    if (self->refusal_logged && now - self->refusal_logged < LOG_EVERY_MS) {
        self->refusals_unlogged++;
        return;
    }
    if (self->refusals_unlogged)
        sbx_info ("dns port=%u refused %s (and %llu more since the last line)", self->port,
                  *name ? name : ".", (unsigned long long) self->refusals_unlogged);
    else
        sbx_info ("dns port=%u refused %s", self->port, *name ? name : ".");
    self->refusal_logged = now;
    self->refusals_unlogged = 0;
}

static void s_pending_free (vmd_dns_t *self, s_pending_t *p)
{
    p->used = false;
    self->in_flight--;
}

//  A free slot with a fresh random upstream id no other pending query has, or NULL.
static s_pending_t *s_pending_new (vmd_dns_t *self)
{
    if (self->in_flight >= VMD_DNS_PENDING)
        return NULL;
    s_pending_t *slot = NULL;
    for (size_t i = 0; i < VMD_DNS_PENDING && !slot; i++)
        if (!self->pending[i].used)
            slot = &self->pending[i];
    for (int tries = 0; slot && tries < 16; tries++) {
        uint16_t id;
        if (sbx_secret_random (&id, sizeof id) == -1)
            return NULL;
        bool taken = false;
        for (size_t i = 0; i < VMD_DNS_PENDING && !taken; i++)
            taken = self->pending[i].used && self->pending[i].id == id;
        if (!taken) {
            memset (slot, 0, sizeof *slot);
            slot->used = true;
            slot->id = id;
            self->in_flight++;
            return slot;
        }
    }
    return NULL;
}

static void s_query (vmd_dns_t *self, uint8_t *msg, size_t len, const struct sockaddr_in *from)
{
    if (len < HEADER || (msg[2] & 0x80))
        return;
    uint16_t id = s_get16 (msg);
    if ((msg[2] >> 3 & 0x0f) != 0) {
        s_reply (self, msg, HEADER, id, RCODE_NOTIMP, from);
        return;
    }
    char name[MAX_NAME + 3];
    uint16_t qtype, qclass;
    size_t qend;
    if (vmd_dns_question (msg, len, name, sizeof name, &qtype, &qclass, &qend) == -1) {
        s_reply (self, msg, HEADER, id, RCODE_FORMERR, from);
        return;
    }
    vmd_dns_verdict_t verdict = self->policy (name, self->arg);
    if (verdict != VMD_DNS_PASS && verdict != VMD_DNS_LEARN) {
        self->refused++;
        s_reply (self, msg, qend, id, RCODE_REFUSED, from);
        s_log_refusal (self, name);
        return;
    }
    s_pending_t *p = s_pending_new (self);
    if (!p) {
        s_reply (self, msg, qend, id, RCODE_SERVFAIL, from);
        return;
    }
    p->learn = verdict == VMD_DNS_LEARN;
    p->guest_id = id;
    p->guest = *from;
    memcpy (p->name, name, sizeof name);
    p->qtype = qtype;
    p->qclass = qclass;
    p->deadline = zclock_mono () + self->timeout_ms;
    s_put16 (msg, p->id);
    if (sendto (self->upstream_fd, msg, len, MSG_DONTWAIT, (struct sockaddr *) &self->upstream,
                sizeof self->upstream) < 0) {
        sbx_debug ("dns port=%u query not sent: %s", self->port, strerror (errno));
        s_put16 (msg, id);
        s_reply (self, msg, qend, id, RCODE_SERVFAIL, from);
        s_pending_free (self, p);
    }
}

static void s_answer (vmd_dns_t *self, uint8_t *msg, size_t len, const struct sockaddr_in *from)
{
    if (from->sin_addr.s_addr != self->upstream.sin_addr.s_addr ||
        from->sin_port != self->upstream.sin_port || len < HEADER || !(msg[2] & 0x80))
        return;
    uint16_t id = s_get16 (msg);
    s_pending_t *p = NULL;
    for (size_t i = 0; i < VMD_DNS_PENDING && !p; i++)
        if (self->pending[i].used && self->pending[i].id == id)
            p = &self->pending[i];
    char name[MAX_NAME + 3];
    uint16_t qtype, qclass;
    size_t qend;
    //  Not ours, or not the question asked: dropped, and the real answer may still come.
    if (!p || vmd_dns_question (msg, len, name, sizeof name, &qtype, &qclass, &qend) == -1 ||
        qtype != p->qtype || qclass != p->qclass || strcmp (name, p->name) != 0)
        return;
    if (zclock_mono () > p->deadline) {
        s_pending_free (self, p);
        return;
    }
    if (p->learn) {
        vmd_dns_addr_t addrs[VMD_DNS_ADDRS];
        int count = vmd_dns_addresses (msg, len, addrs, VMD_DNS_ADDRS);
        int rc = -1;
        if (count >= 0 && self->learn)
            rc = self->learn (p->name, addrs, (size_t) count, self->arg);
        if (rc != 0) {
            s_reply (self, msg, qend, p->guest_id, RCODE_SERVFAIL, &p->guest);
            s_pending_free (self, p);
            return;
        }
        self->learned++;
    } else
        self->passed++;
    s_put16 (msg, p->guest_id);
    if (sendto (self->guest_fd, msg, len, MSG_DONTWAIT, (struct sockaddr *) &p->guest,
                sizeof p->guest) < 0)
        sbx_debug ("dns port=%u answer not sent: %s", self->port, strerror (errno));
    s_pending_free (self, p);
}

//  Drops the queries whose answer did not come in time. Done as datagrams arrive, not
//  from a timer: a zloop timer ended inside the loop still fires in that pass, after
//  its relay is gone.
static void s_expire (vmd_dns_t *self)
{
    int64_t now = zclock_mono ();
    for (size_t i = 0; i < VMD_DNS_PENDING && self->in_flight; i++)
        if (self->pending[i].used && now > self->pending[i].deadline)
            s_pending_free (self, &self->pending[i]);
}

static int s_on_socket (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop;
    vmd_dns_t *self = arg;
    if (item->fd < 0 || (item->fd != self->guest_fd && item->fd != self->upstream_fd))
        return 0; //  closed (vmd_dns_close) in this pass of the loop
    s_expire (self);
    bool guest = item->fd == self->guest_fd;
    for (int i = 0; i < BATCH; i++) {
        struct sockaddr_in from;
        socklen_t fromlen = sizeof from;
        ssize_t n = recvfrom (item->fd, self->buf, sizeof self->buf, MSG_DONTWAIT,
                              (struct sockaddr *) &from, &fromlen);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            continue; //  a pending error (ICMP) is cleared by reading it
        }
        if (fromlen != sizeof from || from.sin_family != AF_INET)
            continue;
        if (guest)
            s_query (self, self->buf, (size_t) n, &from);
        else
            s_answer (self, self->buf, (size_t) n, &from);
    }
    return 0;
}

static int s_socket (const struct sockaddr_in *bind_to)
{
    int fd = socket (AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && bind (fd, (const struct sockaddr *) bind_to, sizeof *bind_to) == -1) {
        close (fd);
        fd = -1;
    }
    return fd;
}

static int s_watch (vmd_dns_t *self, int fd)
{
    zmq_pollitem_t item = {NULL, fd, ZMQ_POLLIN, 0};
    if (zloop_poller (self->loop, &item, s_on_socket, self) == -1)
        return -1;
    //  An ICMP error is not a reason to stop listening.
    zloop_poller_set_tolerant (self->loop, &item);
    return 0;
}

vmd_dns_t *vmd_dns_new (zloop_t *loop, const char *upstream, uint16_t upstream_port,
                        vmd_dns_policy_fn *policy, vmd_dns_learn_fn *learn, void *arg)
{
    if (!loop || !upstream || !policy)
        return NULL;
    vmd_dns_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->loop = loop;
    self->policy = policy;
    self->learn = learn;
    self->arg = arg;
    self->timeout_ms = VMD_DNS_TIMEOUT_MS;
    self->guest_fd = self->upstream_fd = -1;
    self->upstream.sin_family = AF_INET;
    self->upstream.sin_port = htons (upstream_port ? upstream_port : 53);
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    struct sockaddr_in any = {.sin_family = AF_INET};
    if (inet_pton (AF_INET, upstream, &self->upstream.sin_addr) != 1) {
        sbx_error ("dns upstream=%s: not an IPv4 address", upstream);
        vmd_dns_destroy (&self);
        return NULL;
    }
    self->guest_fd = s_socket (&local);
    //  Loopback upstream (tests, a local resolver): our socket must be on loopback too.
    bool loopback = (ntohl (self->upstream.sin_addr.s_addr) >> 24) == 127;
    self->upstream_fd = s_socket (loopback ? &local : &any);
    socklen_t locallen = sizeof local;
    if (self->guest_fd == -1 || self->upstream_fd == -1 ||
        getsockname (self->guest_fd, (struct sockaddr *) &local, &locallen) == -1)
        goto fail;
    self->port = ntohs (local.sin_port);
    if (s_watch (self, self->guest_fd) == -1 || s_watch (self, self->upstream_fd) == -1)
        goto fail;
    return self;
fail:
    sbx_error ("dns upstream=%s: the relay can't start: %s", upstream, strerror (errno));
    vmd_dns_destroy (&self);
    return NULL;
}

void vmd_dns_close (vmd_dns_t *self)
{
    int *fds[] = {&self->guest_fd, &self->upstream_fd};
    for (size_t i = 0; i < 2; i++)
        if (*fds[i] >= 0) {
            zmq_pollitem_t item = {NULL, *fds[i], ZMQ_POLLIN, 0};
            zloop_poller_end (self->loop, &item);
            close (*fds[i]);
            *fds[i] = -1;
        }
}

void vmd_dns_destroy (vmd_dns_t **self_p)
{
    vmd_dns_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    vmd_dns_close (self);
    free (self);
    *self_p = NULL;
}

uint16_t vmd_dns_port (vmd_dns_t *self)
{
    return self ? self->port : 0;
}

void vmd_dns_counts (vmd_dns_t *self, uint64_t *refused, uint64_t *passed, uint64_t *learned)
{
    if (refused)
        *refused = self ? self->refused : 0;
    if (passed)
        *passed = self ? self->passed : 0;
    if (learned)
        *learned = self ? self->learned : 0;
}

//  --------------------------------------------------------------------------
//  Self-test

typedef enum {
    T_ANSWER,     //  answers as a resolver would
    T_WRONG_ID,   //  answers with another id
    T_WRONG_Q,    //  answers another question
    T_OTHER_PORT, //  answers from another socket
    T_MALFORMED,  //  answers with a truncated record
    T_SILENT      //  does not answer
} s_test_mode_t;

static struct {
    s_test_mode_t mode;
    int fd, other_fd;
    int queries; //  seen by the upstream
    char policy_name[MAX_NAME + 3];
    int learn_calls;
    vmd_dns_addr_t learned[VMD_DNS_ADDRS];
    size_t learned_count;
    bool answer_was_early; //  the client had its answer before learn was called
    int client_fd;
} s_t;

//  A query for name, type qtype, with id; its length.
static size_t s_test_query (uint8_t *buf, uint16_t id, const char *name, uint16_t qtype)
{
    memset (buf, 0, HEADER);
    s_put16 (buf, id);
    buf[2] = 0x01; //  RD
    s_put16 (buf + 4, 1);
    size_t pos = HEADER;
    for (const char *p = name; *p;) {
        const char *dot = strchr (p, '.');
        size_t n = dot ? (size_t) (dot - p) : strlen (p);
        buf[pos++] = (uint8_t) n;
        memcpy (buf + pos, p, n);
        pos += n;
        p += n + (dot ? 1 : 0);
    }
    buf[pos++] = 0;
    s_put16 (buf + pos, qtype);
    s_put16 (buf + pos + 2, CLASS_IN);
    return pos + 4;
}

static size_t s_test_rr (uint8_t *buf, size_t pos, uint16_t owner, uint16_t type, uint32_t ttl,
                         const void *rdata, uint16_t rdlength)
{
    s_put16 (buf + pos, (uint16_t) (0xc000 | owner));
    s_put16 (buf + pos + 2, type);
    s_put16 (buf + pos + 4, CLASS_IN);
    s_put16 (buf + pos + 6, (uint16_t) (ttl >> 16));
    s_put16 (buf + pos + 8, (uint16_t) ttl);
    s_put16 (buf + pos + 10, rdlength);
    memcpy (buf + pos + 12, rdata, rdlength);
    return pos + 12 + rdlength;
}

//  The upstream resolver: A for names under allowed.test (a CNAME to real.allowed.test,
//  two A records of that), AAAA for v6.allowed.test, A for plain.test and blocked.test.
static void s_test_resolve (int upstream_fd, const uint8_t *q, size_t n,
                            const struct sockaddr_in *from);

static int s_test_on_upstream (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop, (void) arg;
    uint8_t q[512];
    struct sockaddr_in from;
    socklen_t fromlen = sizeof from;
    ssize_t n;
    while ((n = recvfrom (item->fd, q, sizeof q, 0, (struct sockaddr *) &from, &fromlen)) > 0)
        s_test_resolve (item->fd, q, (size_t) n, &from);
    return 0;
}

static void s_test_resolve (int upstream_fd, const uint8_t *q, size_t n,
                            const struct sockaddr_in *from)
{
    uint8_t a[1024];
    s_t.queries++;
    char name[256];
    uint16_t qtype, qclass;
    size_t qend;
    assert (vmd_dns_question (q, n, name, sizeof name, &qtype, &qclass, &qend) == 0);
    if (s_t.mode == T_SILENT)
        return;
    size_t len = qend;
    if (s_t.mode == T_WRONG_Q)
        len = s_test_query (a, s_get16 (q), "other.test", qtype);
    else
        memcpy (a, q, qend);
    a[2] = 0x81, a[3] = 0x80;
    size_t pos = len;
    uint16_t an = 0;
    size_t suffix = strlen (name) >= 12 ? strlen (name) - 12 : 0;
    if (qtype == TYPE_A && streq (name + suffix, "allowed.test")) {
        //  real.allowed.test as "real" + a pointer to "allowed.test" in the question
        uint8_t cname[7] = {4, 'r', 'e', 'a', 'l', 0xc0, (uint8_t) (HEADER + suffix)};
        pos = s_test_rr (a, pos, HEADER, 5, 3600, cname, sizeof cname);
        uint16_t target = (uint16_t) (pos - sizeof cname);
        pos = s_test_rr (a, pos, target, TYPE_A, 300, (uint8_t[]){192, 0, 2, 1}, 4);
        pos = s_test_rr (a, pos, target, TYPE_A, 60, (uint8_t[]){192, 0, 2, 2}, 4);
        an = 3;
    } else if (qtype == TYPE_AAAA && streq (name, "v6.allowed.test")) {
        uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8, [15] = 1};
        pos = s_test_rr (a, pos, HEADER, TYPE_AAAA, 120, v6, 16);
        an = 1;
    } else if (qtype == TYPE_A && (streq (name, "plain.test") || streq (name, "blocked.test"))) {
        pos = s_test_rr (a, pos, HEADER, TYPE_A, 30, (uint8_t[]){192, 0, 2, 66}, 4);
        an = 1;
    } else
        a[3] = 0x83; //  NXDOMAIN
    s_put16 (a + 6, an);
    if (s_t.mode == T_WRONG_ID)
        s_put16 (a, (uint16_t) (s_get16 (a) + 1));
    if (s_t.mode == T_MALFORMED)
        pos -= 2;
    int fd = s_t.mode == T_OTHER_PORT ? s_t.other_fd : upstream_fd;
    assert (sendto (fd, a, pos, 0, (const struct sockaddr *) from, sizeof *from) == (ssize_t) pos);
}

static vmd_dns_verdict_t s_test_policy (const char *name, void *arg)
{
    (void) arg;
    snprintf (s_t.policy_name, sizeof s_t.policy_name, "%s", name);
    size_t len = strlen (name);
    if (streq (name, "blocked.test"))
        return VMD_DNS_REFUSE;
    if (len >= 12 && streq (name + len - 12, "allowed.test"))
        return VMD_DNS_LEARN;
    return VMD_DNS_PASS;
}

static int s_test_learn (const char *name, const vmd_dns_addr_t *addrs, size_t count, void *arg)
{
    (void) arg;
    s_t.learn_calls++;
    memcpy (s_t.learned, addrs, count * sizeof *addrs);
    s_t.learned_count = count;
    uint8_t peek;
    s_t.answer_was_early = recv (s_t.client_fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
    return strncmp (name, "fail.", 5) == 0 ? -1 : 0;
}

static int s_test_stop (zloop_t *loop, zmq_pollitem_t *item, void *arg)
{
    (void) loop, (void) item, (void) arg;
    return -1;
}

static int s_test_expire (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop, (void) timer_id, (void) arg;
    return -1;
}

//  Runs the loop until the client has a datagram or msecs pass; the datagram's length
//  (into buf), or -1 when none came.
static ssize_t s_test_wait (zloop_t *loop, int client, uint8_t *buf, size_t size, size_t msecs)
{
    zmq_pollitem_t item = {NULL, client, ZMQ_POLLIN, 0};
    assert (zloop_poller (loop, &item, s_test_stop, NULL) == 0);
    int timer = zloop_timer (loop, msecs, 1, s_test_expire, NULL);
    zloop_start (loop);
    zloop_poller_end (loop, &item);
    zloop_timer_end (loop, timer);
    return recv (client, buf, size, MSG_DONTWAIT);
}

//  Sends the query to the relay and waits for its answer.
static ssize_t s_test_ask (zloop_t *loop, vmd_dns_t *dns, const uint8_t *q, size_t qlen,
                           uint8_t *buf, size_t size, size_t msecs)
{
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons (vmd_dns_port (dns)),
                             .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    assert (sendto (s_t.client_fd, q, qlen, 0, (struct sockaddr *) &to, sizeof to) ==
            (ssize_t) qlen);
    return s_test_wait (loop, s_t.client_fd, buf, size, msecs);
}

static int s_test_parse (const void *msg, size_t len, char *name)
{
    return vmd_dns_question (msg, len, name, 256, NULL, NULL, NULL);
}

static void s_test_parsing (void)
{
    char name[256];
    uint16_t qtype, qclass;
    size_t end;
    uint8_t m[600];
    //  Upper case is lowered; the root is "".
    size_t len = s_test_query (m, 7, "WWW.Example.COM", TYPE_AAAA);
    assert (vmd_dns_question (m, len, name, sizeof name, &qtype, &qclass, &end) == 0);
    assert (streq (name, "www.example.com") && qtype == TYPE_AAAA && qclass == CLASS_IN);
    assert (end == len);
    len = s_test_query (m, 7, "", TYPE_A);
    assert (vmd_dns_question (m, len, name, sizeof name, &qtype, &qclass, &end) == 0);
    assert (streq (name, "") && end == HEADER + 5);
    //  Truncated anywhere: refused.
    len = s_test_query (m, 7, "a.example", TYPE_A);
    for (size_t cut = 0; cut < len; cut++)
        assert (s_test_parse (m, cut, name) == -1);
    //  Not exactly one question.
    s_put16 (m + 4, 2);
    assert (s_test_parse (m, len, name) == -1);
    s_put16 (m + 4, 0);
    assert (s_test_parse (m, len, name) == -1);
    s_put16 (m + 4, 1);
    //  A label of 64 (0x40: no such label type), bytes unsafe in logs, a dot in a label.
    uint8_t bad[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'x', 0, 0, 1, 0, 1};
    bad[13] = ' ';
    assert (s_test_parse (bad, sizeof bad, name) == -1);
    bad[13] = '.';
    assert (s_test_parse (bad, sizeof bad, name) == -1);
    bad[13] = 0x7f;
    assert (s_test_parse (bad, sizeof bad, name) == -1);
    bad[13] = '_';
    assert (s_test_parse (bad, sizeof bad, name) == 0 && streq (name, "_"));
    memset (m, 0, sizeof m);
    m[5] = 1;
    m[HEADER] = 64;
    memset (m + HEADER + 1, 'a', 64);
    assert (s_test_parse (m, HEADER + 1 + 64 + 5, name) == -1);
    m[HEADER] = 63; //  63 is fine
    m[HEADER + 64] = 0;
    assert (s_test_parse (m, HEADER + 64 + 5, name) == 0 && strlen (name) == 63);
    //  Names of 253 characters pass, 254 do not (3 labels of 63 and one of 61 or 62).
    size_t pos = HEADER;
    for (int i = 0; i < 3; i++) {
        m[pos] = 63;
        memset (m + pos + 1, 'b', 63);
        pos += 64;
    }
    m[pos] = 61;
    memset (m + pos + 1, 'c', 62);
    m[pos + 62] = 0;
    assert (s_test_parse (m, pos + 67, name) == 0 && strlen (name) == 253);
    m[pos] = 62;
    m[pos + 63] = 0;
    assert (s_test_parse (m, pos + 68, name) == -1);
    //  Pointers: into the header, to itself, forwards, in a loop: refused.
    uint8_t self_ptr[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1};
    assert (s_test_parse (self_ptr, sizeof self_ptr, name) == -1);
    self_ptr[13] = 2;
    assert (s_test_parse (self_ptr, sizeof self_ptr, name) == -1);
    self_ptr[13] = 14;
    assert (s_test_parse (self_ptr, sizeof self_ptr, name) == -1);
    //  "a" + a pointer back to the "a": a loop through an earlier label.
    uint8_t loop_ptr[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0xc0, 12, 0, 1, 0, 1};
    assert (s_test_parse (loop_ptr, sizeof loop_ptr, name) == -1);
    //  Two pointers to each other in the answer section.
    uint8_t loop2[] = {0,  0,    0x81, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0xc0,
                       19, 0xc0, 17,   0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4};
    assert (vmd_dns_addresses (loop2, sizeof loop2, NULL, 0) == -1);

    //  Addresses: the answer of the test's upstream, then damaged.
    uint8_t a[512];
    size_t qlen = s_test_query (a, 1, "x.allowed.test", TYPE_A);
    size_t alen = s_test_rr (a, qlen, HEADER, 5, 3600, (uint8_t[]){1, 'r', 0xc0, 14}, 4);
    alen = s_test_rr (a, alen, (uint16_t) qlen + 12, TYPE_A, 300, (uint8_t[]){192, 0, 2, 1}, 4);
    uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8, [15] = 1};
    alen = s_test_rr (a, alen, HEADER, TYPE_AAAA, 0xfffffff0u, v6, 16);
    s_put16 (a + 6, 3);
    vmd_dns_addr_t addrs[4];
    assert (vmd_dns_addresses (a, alen, addrs, 4) == 2);
    assert (addrs[0].family == AF_INET && addrs[0].ttl == 300 && addrs[0].addr[3] == 1);
    assert (addrs[1].family == AF_INET6 && addrs[1].ttl == 0xfffffff0u);
    assert (memcmp (addrs[1].addr, v6, 16) == 0);
    assert (vmd_dns_addresses (a, alen, addrs, 1) == 1);
    for (size_t cut = 0; cut < alen; cut++)
        assert (vmd_dns_addresses (a, cut, addrs, 4) == -1);
    s_put16 (a + 6, 4); //  a record more than there is
    assert (vmd_dns_addresses (a, alen, addrs, 4) == -1);
    s_put16 (a + 6, 3);
    a[alen - 16 - 1] = 15; //  AAAA's rdlength 15
    assert (vmd_dns_addresses (a, alen - 1, addrs, 4) == -1);
}

void vmd_dns_test (bool verbose)
{
    if (verbose)
        printf (" * vmd_dns: ");
    s_test_parsing ();

    zloop_t *loop = zloop_new ();
    assert (loop);
    memset (&s_t, 0, sizeof s_t);
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    s_t.fd = s_socket (&local);
    s_t.other_fd = s_socket (&local);
    s_t.client_fd = s_socket (&local);
    assert (s_t.fd >= 0 && s_t.other_fd >= 0 && s_t.client_fd >= 0);
    struct sockaddr_in up;
    socklen_t uplen = sizeof up;
    assert (getsockname (s_t.fd, (struct sockaddr *) &up, &uplen) == 0);
    zmq_pollitem_t up_item = {NULL, s_t.fd, ZMQ_POLLIN, 0};
    assert (zloop_poller (loop, &up_item, s_test_on_upstream, NULL) == 0);

    assert (!vmd_dns_new (loop, "resolver", 53, s_test_policy, s_test_learn, NULL));
    vmd_dns_t *dns =
        vmd_dns_new (loop, "127.0.0.1", ntohs (up.sin_port), s_test_policy, s_test_learn, NULL);
    assert (dns && vmd_dns_port (dns) != 0);
    uint8_t q[512], r[2048];
    char name[256];
    uint16_t qtype, qclass;
    size_t qend;

    //  Refused by the policy: the id and question echoed, nothing asked upstream.
    size_t qlen = s_test_query (q, 0x1234, "Blocked.Test", TYPE_A);
    ssize_t n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n == (ssize_t) qlen && streq (s_t.policy_name, "blocked.test"));
    assert (s_get16 (r) == 0x1234 && r[2] == 0x81 && r[3] == (0x80 | RCODE_REFUSED));
    assert (s_get16 (r + 4) == 1 && s_get16 (r + 6) == 0 &&
            memcmp (r + 12, q + 12, qlen - 12) == 0);
    assert (s_t.queries == 0);

    //  Passed: upstream's answer, with the guest's id.
    qlen = s_test_query (q, 0x2345, "plain.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n > 0 && s_t.queries == 1 && s_t.learn_calls == 0);
    assert (s_get16 (r) == 0x2345 && (r[3] & 0x0f) == 0 && s_get16 (r + 6) == 1);
    vmd_dns_addr_t addrs[4];
    assert (vmd_dns_addresses (r, (size_t) n, addrs, 4) == 1 && addrs[0].addr[3] == 66);

    //  Learned: learn has the two A records (the CNAME skipped) before the answer leaves.
    qlen = s_test_query (q, 0x3456, "WWW.allowed.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n > 0 && s_get16 (r) == 0x3456 && (r[3] & 0x0f) == 0 && s_get16 (r + 6) == 3);
    assert (s_t.learn_calls == 1 && !s_t.answer_was_early && s_t.learned_count == 2);
    assert (s_t.learned[0].family == AF_INET && s_t.learned[0].ttl == 300);
    assert (memcmp (s_t.learned[0].addr, (uint8_t[]){192, 0, 2, 1}, 4) == 0);
    assert (s_t.learned[1].ttl == 60 && s_t.learned[1].addr[3] == 2);
    qlen = s_test_query (q, 0x3457, "v6.allowed.test", TYPE_AAAA);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n > 0 && s_get16 (r) == 0x3457 && s_t.learn_calls == 2 && s_t.learned_count == 1);
    assert (s_t.learned[0].family == AF_INET6 && s_t.learned[0].ttl == 120);
    assert (s_t.learned[0].addr[0] == 0x20 && s_t.learned[0].addr[15] == 1);

    //  learn fails: SERVFAIL, with the question.
    qlen = s_test_query (q, 0x4567, "fail.allowed.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n == (ssize_t) qlen && s_get16 (r) == 0x4567 && r[3] == (0x80 | RCODE_SERVFAIL));
    assert (vmd_dns_question (r, (size_t) n, name, sizeof name, &qtype, &qclass, &qend) == 0);
    assert (streq (name, "fail.allowed.test") && qtype == TYPE_A && s_get16 (r + 6) == 0);
    uint64_t refused, passed, learned;
    vmd_dns_counts (dns, &refused, &passed, &learned);
    assert (refused == 1 && passed == 1 && learned == 2 && dns->in_flight == 0);

    //  Bad queries: FORMERR with a header, dropped without, or when an answer; NOTIMP.
    qlen = s_test_query (q, 0x5678, "plain.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen - 6, r, sizeof r, 2000);
    assert (n == HEADER && s_get16 (r) == 0x5678 && r[3] == (0x80 | RCODE_FORMERR));
    assert (s_test_ask (loop, dns, q, 11, r, sizeof r, 200) == -1);
    q[2] |= 0x80;
    assert (s_test_ask (loop, dns, q, qlen, r, sizeof r, 200) == -1);
    q[2] = 0x01 | 2 << 3; //  STATUS
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n == HEADER && r[3] == (0x80 | RCODE_NOTIMP));
    assert (s_t.queries == 4);

    //  Spoofs: a wrong id, another question, another port: never delivered, the query
    //  still waits. A malformed answer to a LEARN query: SERVFAIL.
    //  (A shorter timeout, so that the test need not wait 5 s for them to go.)
    dns->timeout_ms = 1000;
    s_test_mode_t spoofs[] = {T_WRONG_ID, T_WRONG_Q, T_OTHER_PORT};
    for (size_t i = 0; i < 3; i++) {
        s_t.mode = spoofs[i];
        qlen = s_test_query (q, 0x6000, "plain.test", TYPE_A);
        assert (s_test_ask (loop, dns, q, qlen, r, sizeof r, 100) == -1);
        assert (dns->in_flight == i + 1);
    }
    s_t.mode = T_MALFORMED;
    qlen = s_test_query (q, 0x6100, "x.allowed.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n > 0 && s_get16 (r) == 0x6100 && r[3] == (0x80 | RCODE_SERVFAIL));
    assert (s_t.learn_calls == 3); //  nothing learned from it
    assert (dns->in_flight == 3);

    //  A full table: the query past VMD_DNS_PENDING gets SERVFAIL; then all time out.
    //  Sent in bursts that the sockets' buffers hold.
    s_t.mode = T_SILENT;
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons (vmd_dns_port (dns)),
                             .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    int queries = s_t.queries;
    size_t free_slots = VMD_DNS_PENDING - dns->in_flight;
    for (size_t i = 0; i <= free_slots; i++) {
        qlen = s_test_query (q, (uint16_t) i, "plain.test", TYPE_A);
        assert (sendto (s_t.client_fd, q, qlen, 0, (struct sockaddr *) &to, sizeof to) ==
                (ssize_t) qlen);
        if (i % 32 == 31)
            assert (s_test_wait (loop, s_t.client_fd, r, sizeof r, 20) == -1);
    }
    n = s_test_wait (loop, s_t.client_fd, r, sizeof r, 2000);
    assert (n > 0 && s_get16 (r) == free_slots && r[3] == (0x80 | RCODE_SERVFAIL));
    assert (dns->in_flight == VMD_DNS_PENDING);
    assert (s_test_wait (loop, s_t.client_fd, r, sizeof r, 2500) == -1);
    assert (s_t.queries == queries + (int) free_slots);
    //  The table is free again: the next datagram finds them all expired.
    s_t.mode = T_ANSWER;
    qlen = s_test_query (q, 0x7000, "plain.test", TYPE_A);
    n = s_test_ask (loop, dns, q, qlen, r, sizeof r, 2000);
    assert (n > 0 && s_get16 (r) == 0x7000 && (r[3] & 0x0f) == 0);
    assert (dns->in_flight == 0);
    //  Closed: its sockets are off the loop and its port answers no more.
    uint16_t port = vmd_dns_port (dns);
    vmd_dns_close (dns);
    assert (dns->guest_fd == -1 && dns->upstream_fd == -1);
    to.sin_port = htons (port);
    assert (sendto (s_t.client_fd, q, qlen, 0, (struct sockaddr *) &to, sizeof to) ==
            (ssize_t) qlen);
    assert (s_test_wait (loop, s_t.client_fd, r, sizeof r, 200) == -1);

    vmd_dns_destroy (&dns);
    assert (!dns);
    vmd_dns_destroy (&dns);
    zloop_poller_end (loop, &up_item);
    zloop_destroy (&loop);
    close (s_t.fd);
    close (s_t.other_fd);
    close (s_t.client_fd);
    if (verbose)
        printf ("OK\n");
}
