/*  fuzz_dns - libFuzzer harness for vmd_dns's parser (vmd_dns_question, vmd_dns_addresses).

    Both run on untrusted messages: the guest's queries and the upstream resolver's
    answers. The input is one DNS message. Properties: a question's name is lower case,
    printable ASCII without spaces, at most 253 characters, no empty labels, no trailing
    dot; its end lies within the message; the name, encoded again without compression,
    parses back the same; addresses are at most max, each AF_INET or AF_INET6, and a
    smaller max gives the same first ones. Seeds: a query, an answer with a CNAME and
    compressed A records, an AAAA answer, a compression loop.
*/
#include "vmd_dns.h"
#include "sbx_common.h"

#include <string.h>
#include <sys/socket.h>

#define FUZZ_NAME "fuzz_dns"
#include "fuzz_check.h"

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc, (void) argv;
    sbx_log_init ("fuzz_dns", SBX_LOG_ERROR);
    return 0;
}

//  The name as an uncompressed question; its length.
static size_t s_encode (const char *name, uint8_t *buf)
{
    memset (buf, 0, 12);
    buf[5] = 1;
    size_t pos = 12;
    for (const char *p = name; *p;) {
        const char *dot = strchr (p, '.');
        size_t n = dot ? (size_t) (dot - p) : strlen (p);
        CHECK (n >= 1 && n <= 63, "a label of the name is empty or too long");
        buf[pos++] = (uint8_t) n;
        memcpy (buf + pos, p, n);
        pos += n;
        p += n + (dot ? 1 : 0);
    }
    buf[pos++] = 0;
    memset (buf + pos, 0, 4);
    return pos + 4;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    char name[256];
    uint16_t qtype, qclass;
    size_t end;
    if (vmd_dns_question (data, size, name, sizeof name, &qtype, &qclass, &end) == 0) {
        size_t len = strlen (name);
        CHECK (len <= 253, "name too long");
        CHECK (end > 12 && end <= size, "the question ends outside the message");
        CHECK (len == 0 || (name[0] != '.' && name[len - 1] != '.' && !strstr (name, "..")),
               "an empty label");
        for (size_t i = 0; i < len; i++)
            CHECK (name[i] > 0x20 && name[i] < 0x7f && !(name[i] >= 'A' && name[i] <= 'Z'),
                   "a character unsafe in logs, or upper case");
        uint8_t again[300];
        char name2[256];
        size_t len2 = s_encode (name, again);
        CHECK (vmd_dns_question (again, len2, name2, sizeof name2, NULL, NULL, &end) == 0 &&
                   end == len2 && strcmp (name, name2) == 0,
               "the name encoded again parses differently");
    }
    vmd_dns_addr_t addrs[VMD_DNS_ADDRS], few[2];
    int count = vmd_dns_addresses (data, size, addrs, VMD_DNS_ADDRS);
    CHECK (count >= -1 && count <= VMD_DNS_ADDRS, "more addresses than room");
    for (int i = 0; i < count; i++)
        CHECK (addrs[i].family == AF_INET || addrs[i].family == AF_INET6, "a family");
    int some = vmd_dns_addresses (data, size, few, 2);
    CHECK (count == -1 ? some == -1 : some == (count < 2 ? count : 2), "max changes the result");
    for (int i = 0; i < some; i++)
        CHECK (memcmp (&few[i], &addrs[i], sizeof few[i]) == 0, "max changes the addresses");
    return 0;
}
