/*  sbx_secret - see sbx_secret.h */
#include "sbx_secret.h"
#include "sbx_xfer.h"

#include <assert.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

static const char s_base36[] = "0123456789abcdefghijklmnopqrstuvwxyz";
static const char s_base62[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

//  sodium_init takes a lock on every call; remember success to keep hot paths lock-free.
static atomic_bool s_ready;

int sbx_secret_init (void)
{
    if (atomic_load (&s_ready))
        return 0;
    if (sodium_init () < 0)
        return -1;
    atomic_store (&s_ready, true);
    return 0;
}

//  prefix + nchars characters drawn uniformly from alphabet (randombytes_uniform
//  rejects the biased tail, so every character is equally likely).
static char *s_random_string (const char *prefix, size_t nchars, const char *alphabet,
                              uint32_t alphabet_size)
{
    if (!prefix || nchars == 0 || nchars > SBX_SECRET_TOKEN_MAX || sbx_secret_init ())
        return NULL;
    size_t prefix_len = strlen (prefix);
    if (prefix_len > SIZE_MAX - nchars - 1)
        return NULL;
    char *text = malloc (prefix_len + nchars + 1);
    if (!text)
        return NULL;
    memcpy (text, prefix, prefix_len);
    for (size_t i = 0; i < nchars; i++)
        text[prefix_len + i] = alphabet[randombytes_uniform (alphabet_size)];
    text[prefix_len + nchars] = 0;
    return text;
}

char *sbx_secret_id (const char *prefix)
{
    return s_random_string (prefix, SBX_SECRET_ID_CHARS, s_base36, 36);
}

char *sbx_secret_token (const char *prefix, size_t nchars)
{
    return s_random_string (prefix, nchars, s_base62, 62);
}

void sbx_secret_hash (const char *secret, char out[65])
{
    assert (out);
    out[0] = 0;
    if (!secret)
        return;
    uint8_t digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256 (digest, (const uint8_t *) secret, strlen (secret));
    sodium_bin2hex (out, 65, digest, sizeof digest);
}

int sbx_secret_hash_fd (int fd, char out[65])
{
    assert (out);
    out[0] = 0;
    crypto_hash_sha256_state state;
    crypto_hash_sha256_init (&state);
    uint8_t buf[1 << 16];
    while (true) {
        ssize_t got = read (fd, buf, sizeof buf);
        if (got == -1 && errno == EINTR)
            continue;
        if (got == -1)
            return -1;
        if (got == 0)
            break;
        crypto_hash_sha256_update (&state, buf, (unsigned long long) got);
    }
    uint8_t digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final (&state, digest);
    sodium_bin2hex (out, 65, digest, sizeof digest);
    return 0;
}

struct sbx_secret_sha256_t {
    crypto_hash_sha256_state state;
};

sbx_secret_sha256_t *sbx_secret_sha256_new (void)
{
    sbx_secret_sha256_t *self = sbx_secret_init () ? NULL : malloc (sizeof *self);
    if (self)
        crypto_hash_sha256_init (&self->state);
    return self;
}

void sbx_secret_sha256_destroy (sbx_secret_sha256_t **self_p)
{
    assert (self_p);
    free (*self_p);
    *self_p = NULL;
}

void sbx_secret_sha256_update (sbx_secret_sha256_t *self, const void *data, size_t size)
{
    assert (self);
    crypto_hash_sha256_update (&self->state, data, (unsigned long long) size);
}

void sbx_secret_sha256_final (sbx_secret_sha256_t *self, char out[65])
{
    assert (self && out);
    uint8_t digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final (&self->state, digest);
    sodium_bin2hex (out, 65, digest, sizeof digest);
    crypto_hash_sha256_init (&self->state);
}

char *sbx_secret_password_hash (const char *password)
{
    if (!password || sbx_secret_init ())
        return NULL;
    char *hash = malloc (crypto_pwhash_STRBYTES);
    if (!hash)
        return NULL;
    if (crypto_pwhash_str_alg (hash, password, strlen (password),
                               crypto_pwhash_OPSLIMIT_INTERACTIVE,
                               crypto_pwhash_MEMLIMIT_INTERACTIVE, crypto_pwhash_ALG_ARGON2ID13)) {
        free (hash);
        return NULL;
    }
    return hash;
}

bool sbx_secret_password_verify (const char *hash, const char *password)
{
    if (!hash || !password || sbx_secret_init ())
        return false;
    //  libsodium reads the hash as a string of at most STRBYTES: refuse anything longer.
    if (strnlen (hash, crypto_pwhash_STRBYTES) >= crypto_pwhash_STRBYTES)
        return false;
    return crypto_pwhash_str_verify (hash, password, strlen (password)) == 0;
}

void sbx_secret_s256 (const char *verifier, char out[44])
{
    assert (out);
    out[0] = 0;
    if (!verifier || sbx_secret_init ())
        return;
    uint8_t digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256 (digest, (const uint8_t *) verifier, strlen (verifier));
    sodium_bin2base64 (out, 44, digest, sizeof digest, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

void sbx_secret_mac (const char *key, const char *message, char out[44])
{
    assert (out);
    out[0] = 0;
    if (!key || !message || sbx_secret_init ())
        return;
    uint8_t k[crypto_auth_KEYBYTES];
    crypto_hash_sha256 (k, (const uint8_t *) key, strlen (key));
    uint8_t mac[crypto_auth_BYTES];
    crypto_auth (mac, (const uint8_t *) message, strlen (message), k);
    sodium_memzero (k, sizeof k);
    sodium_bin2base64 (out, 44, mac, sizeof mac, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

bool sbx_secret_mac_verify (const char *key, const char *message, const char *mac)
{
    if (!mac)
        return false;
    char expected[44];
    sbx_secret_mac (key, message, expected);
    return expected[0] && sbx_secret_equal (expected, mac);
}

void sbx_secret_hmac_sha256_hex (const char *key, const void *data, size_t size, char out[65])
{
    assert (key && out);
    out[0] = 0;
    if (sbx_secret_init ())
        return;
    crypto_auth_hmacsha256_state state;
    uint8_t mac[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_init (&state, (const uint8_t *) key, strlen (key));
    crypto_auth_hmacsha256_update (&state, data, size);
    crypto_auth_hmacsha256_final (&state, mac);
    sodium_bin2hex (out, 65, mac, sizeof mac);
}

bool sbx_secret_equal (const char *a, const char *b)
{
    if (!a || !b)
        return false;
    size_t len = strlen (a);
    if (strlen (b) != len)
        return false;
    return sodium_memcmp (a, b, len) == 0;
}

//  data as base64 in libsodium's variant: a fresh string, or NULL.
static char *s_encode (const uint8_t *data, size_t size, int variant)
{
    if ((!data && size > 0) || sbx_secret_init ())
        return NULL;
    //  ENCODED_LEN overflows past SIZE_MAX / 4 * 3; nothing that large is ever encoded.
    if (size > SIZE_MAX / 4 * 3 - 4)
        return NULL;
    size_t len = sodium_base64_ENCODED_LEN (size, variant);
    char *text = malloc (len);
    if (!text)
        return NULL;
    //  libsodium wants a non-NULL pointer even for zero bytes.
    static const uint8_t s_empty[1] = {0};
    sodium_bin2base64 (text, len, data ? data : s_empty, size, variant);
    return text;
}

char *sbx_secret_base64url (const uint8_t *data, size_t size)
{
    return s_encode (data, size, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

size_t sbx_secret_base64_into (const uint8_t *data, size_t size, char *text)
{
    //  Encoded here, three bytes at a time, not by libsodium's constant-time encoder
    //  (a tenth of the gateway's CPU for a 10 MiB read_file; this variant carries file
    //  contents and output, not secrets): the same text, padded.
    static const char s_alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t whole = size / 3 * 3, at = 0;
    for (size_t i = 0; i < whole; i += 3) {
        uint32_t v = (uint32_t) data[i] << 16 | (uint32_t) data[i + 1] << 8 | data[i + 2];
        text[at++] = s_alphabet[v >> 18];
        text[at++] = s_alphabet[(v >> 12) & 63];
        text[at++] = s_alphabet[(v >> 6) & 63];
        text[at++] = s_alphabet[v & 63];
    }
    if (size - whole) {
        uint32_t v = (uint32_t) data[whole] << 16;
        if (size - whole == 2)
            v |= (uint32_t) data[whole + 1] << 8;
        text[at++] = s_alphabet[v >> 18];
        text[at++] = s_alphabet[(v >> 12) & 63];
        text[at++] = size - whole == 2 ? s_alphabet[(v >> 6) & 63] : '=';
        text[at++] = '=';
    }
    return at;
}

char *sbx_secret_base64 (const uint8_t *data, size_t size)
{
    if ((!data && size > 0) || size > SIZE_MAX / 4 * 3 - 4)
        return NULL;
    char *text = malloc ((size + 2) / 3 * 4 + 1);
    if (!text)
        return NULL;
    sbx_xfer_advise_huge (text, (size + 2) / 3 * 4 + 1); //  a read_file's: megabytes
    text[sbx_secret_base64_into (data, size, text)] = 0;
    return text;
}

//  text as base64 in libsodium's variant, exactly (the alphabet, padding only where the
//  variant has it, zero trailing bits): the bytes, NUL-terminated, or NULL.
static uint8_t *s_decode (const char *text, size_t *size_p, int variant)
{
    if (!text || !size_p || sbx_secret_init ())
        return NULL;
    bool padded = variant == sodium_base64_VARIANT_ORIGINAL;
    size_t text_len = strlen (text);
    //  Padded base64 is whole groups of four characters; unpadded, a last group of one
    //  character would encode no byte.
    if (padded ? text_len % 4 : text_len % 4 == 1)
        return NULL;
    //  Check the alphabet ourselves: libsodium 1.0.18 maps some bytes >= 0x80 to
    //  valid values (signed char arithmetic) and would decode them.
    const char *alphabet = padded
                               ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                               : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t body = strspn (text, alphabet);
    if (padded ? strspn (text + body, "=") != text_len - body || text_len - body > 2
               : body != text_len)
        return NULL;
    size_t max = (text_len + 3) / 4 * 3;
    uint8_t *data = malloc (max + 1);
    if (!data)
        return NULL;
    sbx_xfer_advise_huge (data, max + 1); //  a write_file's content: megabytes
    //  Decoded here, a group of four at a time, not by libsodium's constant-time
    //  decoder (a tenth of the gateway's CPU for a 10 MiB write_file; these are file
    //  contents and stdin, not secrets). As libsodium with b64_end NULL: whole groups,
    //  correct padding and zero trailing bits, so that each value has one encoding.
    static const uint8_t s_value[256] = {
        ['A'] = 0,  ['B'] = 1,  ['C'] = 2,  ['D'] = 3,  ['E'] = 4,  ['F'] = 5,  ['G'] = 6,
        ['H'] = 7,  ['I'] = 8,  ['J'] = 9,  ['K'] = 10, ['L'] = 11, ['M'] = 12, ['N'] = 13,
        ['O'] = 14, ['P'] = 15, ['Q'] = 16, ['R'] = 17, ['S'] = 18, ['T'] = 19, ['U'] = 20,
        ['V'] = 21, ['W'] = 22, ['X'] = 23, ['Y'] = 24, ['Z'] = 25, ['a'] = 26, ['b'] = 27,
        ['c'] = 28, ['d'] = 29, ['e'] = 30, ['f'] = 31, ['g'] = 32, ['h'] = 33, ['i'] = 34,
        ['j'] = 35, ['k'] = 36, ['l'] = 37, ['m'] = 38, ['n'] = 39, ['o'] = 40, ['p'] = 41,
        ['q'] = 42, ['r'] = 43, ['s'] = 44, ['t'] = 45, ['u'] = 46, ['v'] = 47, ['w'] = 48,
        ['x'] = 49, ['y'] = 50, ['z'] = 51, ['0'] = 52, ['1'] = 53, ['2'] = 54, ['3'] = 55,
        ['4'] = 56, ['5'] = 57, ['6'] = 58, ['7'] = 59, ['8'] = 60, ['9'] = 61, ['+'] = 62,
        ['/'] = 63, ['-'] = 62, ['_'] = 63}; //  both variants: the alphabet was checked
    const unsigned char *in = (const unsigned char *) text;
    size_t whole = body / 4 * 4, size = 0;
    for (size_t i = 0; i < whole; i += 4) {
        uint32_t v = (uint32_t) s_value[in[i]] << 18 | (uint32_t) s_value[in[i + 1]] << 12 |
                     (uint32_t) s_value[in[i + 2]] << 6 | s_value[in[i + 3]];
        data[size++] = (uint8_t) (v >> 16);
        data[size++] = (uint8_t) (v >> 8);
        data[size++] = (uint8_t) v;
    }
    //  The last group's 2 or 3 characters (body % 4 is 0, 2 or 3: the length, and the
    //  padding where the variant has it, were checked above), whose bits past the bytes
    //  must be zero.
    size_t left = body - whole;
    if (left) {
        uint32_t v = (uint32_t) s_value[in[whole]] << 18 | (uint32_t) s_value[in[whole + 1]] << 12;
        if (left == 3)
            v |= (uint32_t) s_value[in[whole + 2]] << 6;
        if ((left == 2 && (v & 0xffff)) || (left == 3 && (v & 0xff))) {
            free (data);
            return NULL;
        }
        data[size++] = (uint8_t) (v >> 16);
        if (left == 3)
            data[size++] = (uint8_t) (v >> 8);
    }
    data[size] = 0;
    *size_p = size;
    return data;
}

uint8_t *sbx_secret_base64_decode (const char *text, size_t *size_p)
{
    return s_decode (text, size_p, sodium_base64_VARIANT_ORIGINAL);
}

uint8_t *sbx_secret_base64url_decode (const char *text, size_t *size_p)
{
    return s_decode (text, size_p, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

int sbx_secret_random (void *buf, size_t size)
{
    if (sbx_secret_init ())
        return -1;
    randombytes_buf (buf, size);
    return 0;
}

void sbx_secret_wipe (char *secret)
{
    if (secret)
        sodium_memzero (secret, strlen (secret));
}

void sbx_secret_wipe_bytes (void *data, size_t size)
{
    if (data)
        sodium_memzero (data, size);
}

//  --------------------------------------------------------------------------
//  Self-test

static int s_compare_strings (const void *a, const void *b)
{
    return strcmp (*(char *const *) a, *(char *const *) b);
}

//  Asserts that none of the n strings repeats, then frees them.
static void s_assert_distinct (char **list, size_t n)
{
    qsort (list, n, sizeof (char *), s_compare_strings);
    for (size_t i = 1; i < n; i++)
        assert (strcmp (list[i - 1], list[i]) != 0);
    for (size_t i = 0; i < n; i++)
        free (list[i]);
}

static void s_assert_encodes (const char *plain, const char *expected)
{
    char *padded = sbx_secret_base64 ((const uint8_t *) "hello", 5);
    assert (padded && strcmp (padded, "aGVsbG8=") == 0);
    free (padded);
    //  The standard variant's own encoder writes what libsodium writes, every length
    //  and every byte value.
    uint8_t bytes[300];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (uint8_t) (i * 151 + 7);
    for (size_t n = 0; n <= sizeof bytes; n++) {
        char *ours = sbx_secret_base64 (bytes, n);
        char *theirs = s_encode (bytes, n, sodium_base64_VARIANT_ORIGINAL);
        assert (ours && theirs && strcmp (ours, theirs) == 0);
        free (ours);
        free (theirs);
    }
    assert (!sbx_secret_base64 (NULL, 1));
    char *text = sbx_secret_base64url ((const uint8_t *) plain, strlen (plain));
    assert (text);
    assert (strcmp (text, expected) == 0);
    free (text);
}

static void s_assert_decodes (const char *text, const char *expected)
{
    size_t size = 99;
    uint8_t *data = sbx_secret_base64_decode (text, &size);
    assert (data);
    assert (size == strlen (expected));
    assert (memcmp (data, expected, size) == 0);
    assert (data[size] == 0);
    free (data);
}

static void s_assert_rejects (const char *text)
{
    size_t size = 99;
    assert (sbx_secret_base64_decode (text, &size) == NULL);
    assert (size == 99);
}

uint32_t sbx_secret_uniform (uint32_t upper)
{
    sbx_secret_init ();
    return upper ? randombytes_uniform (upper) : 0;
}

void sbx_secret_test (bool verbose)
{
    {
        //  RFC 4231, test case 2.
        char hex[65];
        sbx_secret_hmac_sha256_hex ("Jefe", "what do ya want for nothing?", 28, hex);
        assert (strcmp (hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843") ==
                0);
    }
    assert (sbx_secret_init () == 0);
    assert (sbx_secret_init () == 0);

    //  PKCE S256: RFC 7636 appendix B's example.
    char s256[44];
    sbx_secret_s256 ("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk", s256);
    assert (strcmp (s256, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM") == 0);
    //  MACs: stable, key- and message-bound, verified in constant time.
    char mac[44], mac2[44];
    sbx_secret_mac ("key", "message", mac);
    sbx_secret_mac ("key", "message", mac2);
    assert (strlen (mac) == 43 && strcmp (mac, mac2) == 0);
    assert (sbx_secret_mac_verify ("key", "message", mac));
    assert (!sbx_secret_mac_verify ("key2", "message", mac));
    assert (!sbx_secret_mac_verify ("key", "messagf", mac));
    assert (!sbx_secret_mac_verify ("key", "message", NULL));

    //  Ids: prefix + 10 base36, no repeats over 10,000 draws.
    const size_t draws = 10000;
    char **list = calloc (draws, sizeof (char *));
    assert (list);
    for (size_t i = 0; i < draws; i++) {
        char *id = sbx_secret_id ("sb_");
        assert (id);
        assert (strlen (id) == 3 + SBX_SECRET_ID_CHARS);
        assert (strncmp (id, "sb_", 3) == 0);
        assert (strspn (id + 3, s_base36) == SBX_SECRET_ID_CHARS);
        list[i] = id;
    }
    if (verbose)
        printf ("\n   id: %s", list[0]);
    s_assert_distinct (list, draws);

    //  Tokens: prefix + n base62; all 62 symbols turn up (the alphabet is used whole).
    bool seen[256] = {false};
    for (size_t i = 0; i < draws; i++) {
        char *token = sbx_secret_token ("sbx_", 43);
        assert (token);
        assert (strlen (token) == 4 + 43);
        assert (strncmp (token, "sbx_", 4) == 0);
        assert (strspn (token + 4, s_base62) == 43);
        for (const char *c = token + 4; *c; c++)
            seen[(uint8_t) *c] = true;
        list[i] = token;
    }
    if (verbose)
        printf ("\n   token: %s", list[0]);
    s_assert_distinct (list, draws);
    free (list);
    for (const char *c = s_base62; *c; c++)
        assert (seen[(uint8_t) *c]);

    char *text = sbx_secret_id ("");
    assert (text && strlen (text) == SBX_SECRET_ID_CHARS);
    free (text);
    assert (sbx_secret_id (NULL) == NULL);
    assert (sbx_secret_token (NULL, 10) == NULL);
    assert (sbx_secret_token ("x", 0) == NULL);
    assert (sbx_secret_token ("x", SBX_SECRET_TOKEN_MAX + 1) == NULL);

    //  SHA-256 vectors (FIPS 180-2).
    char hex[65];
    sbx_secret_hash ("abc", hex);
    assert (strcmp (hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    sbx_secret_hash ("", hex);
    assert (strcmp (hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
    sbx_secret_hash (NULL, hex);
    assert (hex[0] == 0);
    //  A file's, read in pieces: "abc" then 100000 bytes equal the whole's.
    FILE *file = tmpfile ();
    assert (file);
    char *big = calloc (1, 100004);
    assert (big);
    memcpy (big, "abc", 3);
    memset (big + 3, 'q', 100000);
    assert (fwrite (big, 1, 100003, file) == 100003 && fflush (file) == 0);
    char whole[65];
    sbx_secret_hash (big, whole);
    assert (lseek (fileno (file), 0, SEEK_SET) == 0);
    assert (sbx_secret_hash_fd (fileno (file), hex) == 0 && strcmp (hex, whole) == 0);
    assert (sbx_secret_hash_fd (-1, hex) == -1 && hex[0] == 0);
    //  Piece by piece: the same digest as the whole at once, then empty again.
    sbx_secret_sha256_t *sha = sbx_secret_sha256_new ();
    assert (sha);
    sbx_secret_sha256_update (sha, "back", 4);
    sbx_secret_sha256_update (sha, "", 0);
    sbx_secret_sha256_update (sha, "up", 2);
    sbx_secret_sha256_final (sha, hex);
    char whole_once[65];
    sbx_secret_hash ("backup", whole_once);
    assert (strcmp (hex, whole_once) == 0);
    sbx_secret_sha256_final (sha, hex);
    assert (strcmp (hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
    sbx_secret_sha256_destroy (&sha);
    sbx_secret_sha256_destroy (&sha);
    fclose (file);
    free (big);

    //  Passwords.
    char *hash = sbx_secret_password_hash ("correct horse battery staple");
    assert (hash);
    assert (strncmp (hash, "$argon2id$", 10) == 0);
    if (verbose)
        printf ("\n   password hash: %s", hash);
    assert (sbx_secret_password_verify (hash, "correct horse battery staple"));
    assert (!sbx_secret_password_verify (hash, "correct horse battery stapl"));
    assert (!sbx_secret_password_verify (hash, ""));
    assert (!sbx_secret_password_verify (hash, NULL));
    assert (!sbx_secret_password_verify (NULL, "x"));
    assert (!sbx_secret_password_verify ("not a hash", "x"));
    assert (!sbx_secret_password_verify ("", ""));
    //  The same password hashes differently each time (random salt).
    char *again = sbx_secret_password_hash ("correct horse battery staple");
    assert (again && strcmp (again, hash) != 0);
    free (again);
    free (hash);
    assert (sbx_secret_password_hash (NULL) == NULL);
    //  An over-long "hash" is refused before libsodium reads it.
    char long_hash[300];
    memset (long_hash, 'a', sizeof long_hash - 1);
    long_hash[sizeof long_hash - 1] = 0;
    assert (!sbx_secret_password_verify (long_hash, "x"));

    char wiped[] = "sbx_secret";
    sbx_secret_wipe (wiped);
    for (size_t i = 0; i < sizeof wiped; i++)
        assert (wiped[i] == 0);
    sbx_secret_wipe (NULL);

    //  Constant-time equality.
    assert (sbx_secret_equal ("abc", "abc"));
    assert (sbx_secret_equal ("", ""));
    assert (!sbx_secret_equal ("abc", "abd"));
    assert (!sbx_secret_equal ("abc", "abcd"));
    assert (!sbx_secret_equal (NULL, "abc"));
    assert (!sbx_secret_equal (NULL, NULL));

    //  RFC 4648 section 10 vectors; base64url differs from base64 only in - and _.
    s_assert_encodes ("", "");
    s_assert_encodes ("f", "Zg");
    s_assert_encodes ("fo", "Zm8");
    s_assert_encodes ("foo", "Zm9v");
    s_assert_encodes ("foob", "Zm9vYg");
    s_assert_encodes ("fooba", "Zm9vYmE");
    s_assert_encodes ("foobar", "Zm9vYmFy");
    const uint8_t binary[] = {0xfb, 0xff, 0xbf};
    text = sbx_secret_base64url (binary, sizeof binary);
    assert (text && strcmp (text, "-_-_") == 0);
    free (text);
    text = sbx_secret_base64url (NULL, 0);
    assert (text && strcmp (text, "") == 0);
    free (text);
    assert (sbx_secret_base64url (NULL, 1) == NULL);

    s_assert_decodes ("", "");
    s_assert_decodes ("Zg==", "f");
    s_assert_decodes ("Zm8=", "fo");
    s_assert_decodes ("Zm9v", "foo");
    s_assert_decodes ("Zm9vYg==", "foob");
    s_assert_decodes ("Zm9vYmE=", "fooba");
    s_assert_decodes ("Zm9vYmFy", "foobar");
    s_assert_decodes ("dXNlcjpwYXNz", "user:pass");
    size_t size = 0;
    uint8_t *data = sbx_secret_base64_decode ("+/+/", &size);
    assert (data && size == 3 && data[0] == 0xfb && data[1] == 0xff && data[2] == 0xbf);
    free (data);

    //  Garbage, url-safe characters, missing or extra padding, whitespace,
    //  non-zero trailing bits, bytes past a NUL-free but invalid tail.
    //  Every length of a group's remainder, round trip through libsodium's encoder.
    uint8_t bytes[300];
    for (size_t n = 0; n < sizeof bytes; n++) {
        randombytes_buf (bytes, n);
        char *text = sbx_secret_base64 (bytes, n);
        size_t size = 0;
        uint8_t *back = sbx_secret_base64_decode (text, &size);
        assert (back && size == n && memcmp (back, bytes, n) == 0 && back[n] == 0);
        free (back);
        free (text);
    }
    s_assert_rejects ("Zm9=");
    s_assert_rejects ("Zg");
    s_assert_rejects ("Zg=");
    s_assert_rejects ("Zg===");
    s_assert_rejects ("Zm9v====");
    s_assert_rejects ("Zh==");
    s_assert_rejects ("-_-_");
    s_assert_rejects ("Zm9v YmFy");
    s_assert_rejects ("Zm9v\n");
    s_assert_rejects ("====");
    s_assert_rejects ("Zg==Zg==");
    s_assert_rejects ("!!!!");
    s_assert_rejects ("\xff\xfe\xfd\xfc");
    s_assert_rejects ("Zm9v\xc3\xa9==");
    //  base64url without padding: the same vectors, - and _, nothing else.
    const char *url[][2] = {
        {"", ""},           {"Zg", "f"},          {"Zm8", "fo"},          {"Zm9v", "foo"},
        {"Zm9vYg", "foob"}, {"Zm9vYmE", "fooba"}, {"Zm9vYmFy", "foobar"}, {"-_8", "\xfb\xff"}};
    for (size_t i = 0; i < sizeof url / sizeof url[0]; i++) {
        size_t size = 0;
        uint8_t *data = sbx_secret_base64url_decode (url[i][0], &size);
        assert (data && size == strlen (url[i][1]) && memcmp (data, url[i][1], size) == 0);
        free (data);
    }
    const char *bad_url[] = {"Zg==", "Z", "Zm9vY", "Zh", "+/8", "Zm9v YmFy", "Zm9v\n", "\xff\xfe"};
    for (size_t i = 0; i < sizeof bad_url / sizeof bad_url[0]; i++) {
        size_t size = 99;
        assert (sbx_secret_base64url_decode (bad_url[i], &size) == NULL && size == 99);
    }
    assert (sbx_secret_base64url_decode (NULL, &(size_t){0}) == NULL);
    assert (sbx_secret_base64_decode (NULL, &size) == NULL);
    assert (sbx_secret_base64_decode ("Zg==", NULL) == NULL);
    //  Random bytes never crash the decoder.
    for (int i = 0; i < 2000; i++) {
        char junk[17];
        randombytes_buf (junk, 16);
        for (int j = 0; j < 16; j++)
            if (junk[j] == 0)
                junk[j] = 'A';
        junk[16] = 0;
        data = sbx_secret_base64_decode (junk, &size);
        free (data);
    }
    if (verbose)
        printf ("\n");
}
