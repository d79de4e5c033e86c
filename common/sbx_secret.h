/*  sbx_secret - random ids and tokens, token and password hashing, base64.

    The only module that includes libsodium. Every function initialises libsodium
    itself on first use, so sbx_secret_init is only needed to fail early at startup.

    Secrets are stored only as hashes: API keys and OAuth tokens as sbx_secret_hash
    (SHA-256 hex, looked up by equality), passwords as sbx_secret_password_hash
    (argon2id, checked with sbx_secret_password_verify).
*/
#ifndef SBX_SECRET_H_INCLUDED
#define SBX_SECRET_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

//  Random characters in an id; with 36 symbols, 10 give about 51.7 bits.
#define SBX_SECRET_ID_CHARS 10

//  Longest token sbx_secret_token makes; longer requests are refused.
#define SBX_SECRET_TOKEN_MAX 1024

//  Initialises libsodium. Idempotent and thread-safe. Returns 0, or -1 when the
//  library cannot start (no entropy source): nothing here works then.
int sbx_secret_init (void);

//  Returns prefix + SBX_SECRET_ID_CHARS random lowercase base36 characters, e.g.
//  "sb_x0n1a2hf96". Ids are names, not secrets. NULL if prefix is NULL or on failure.
char *sbx_secret_id (const char *prefix);

//  Returns prefix + nchars random base62 characters: "sbx_" + 43 gives ~256 bits.
//  NULL if prefix is NULL, nchars is 0 or above SBX_SECRET_TOKEN_MAX, or on failure.
char *sbx_secret_token (const char *prefix, size_t nchars);

//  Writes the lowercase hex SHA-256 of secret into out (64 characters + NUL). For
//  high-entropy tokens only (never passwords): guessing a 256-bit token is hopeless
//  however fast the hash, so a fast hash that can be looked up by equality is right.
//  A NULL secret yields an empty string, which matches no stored hash.
void sbx_secret_hash (const char *secret, char out[65]);
//  The same of what the open file fd holds from its current offset to its end (a
//  backup's checksums). 0, or -1 with errno set when a read fails.
int sbx_secret_hash_fd (int fd, char out[65]);

//  The same, computed piece by piece as bytes go by (a file shipped chunk by chunk,
//  sbx_ship). NULL when out of memory.
typedef struct sbx_secret_sha256_t sbx_secret_sha256_t;
sbx_secret_sha256_t *sbx_secret_sha256_new (void);
void sbx_secret_sha256_destroy (sbx_secret_sha256_t **self_p);
void sbx_secret_sha256_update (sbx_secret_sha256_t *self, const void *data, size_t size);
//  The lowercase hex digest of every byte given so far (64 characters + NUL); the
//  state then starts over, empty.
void sbx_secret_sha256_final (sbx_secret_sha256_t *self, char out[65]);

//  Returns an argon2id hash string ("$argon2id$v=19$...") of password, with the
//  interactive limits (~64 MiB, a few tens of ms). NULL if password is NULL or on
//  failure (out of memory).
char *sbx_secret_password_hash (const char *password);

//  True when password matches hash (as made by sbx_secret_password_hash). False for
//  a wrong password, a NULL argument or a malformed hash.
bool sbx_secret_password_verify (const char *hash, const char *password);

//  True when a and b are the same string. Runs in constant time for strings of
//  equal length (the length itself is not secret). False if either is NULL.
bool sbx_secret_equal (const char *a, const char *b);

//  Returns base64url (RFC 4648 section 5) of data, without padding: for PKCE
//  challenges and tokens in URLs. size 0 gives "". NULL if data is NULL and size > 0.
char *sbx_secret_base64url (const uint8_t *data, size_t size);

//  Returns standard base64 (RFC 4648 section 4) of data, with padding: files over MCP.
//  Caller frees; NULL on error.
char *sbx_secret_base64 (const uint8_t *data, size_t size);

//  The same into text, which has room for (size + 2) / 3 * 4 bytes: writes that many, no
//  NUL, and returns the count. Pieces of a file whose sizes are multiples of 3 encode
//  to pieces of its base64 (a read_file answer streamed as the chunks come).
size_t sbx_secret_base64_into (const uint8_t *data, size_t size, char *text);

//  Decodes standard base64 (RFC 4648 section 4) with padding, no whitespace: for
//  HTTP Basic credentials. Returns the bytes (NUL-terminated for convenience, not
//  counted in *size_p), or NULL if text is not exactly such base64.
uint8_t *sbx_secret_base64_decode (const char *text, size_t *size_p);
//  The same for base64url without padding, the form sbx_secret_base64url makes: for
//  opaque tokens that come back (list cursors).
uint8_t *sbx_secret_base64url_decode (const char *text, size_t *size_p);

//  PKCE S256 (RFC 7636): base64url (no padding) of the SHA-256 of verifier, into out
//  (43 characters + NUL). A NULL verifier yields "".
void sbx_secret_s256 (const char *verifier, char out[44]);

//  A message authentication code (HMAC-SHA-512-256, libsodium crypto_auth) of message
//  under key (any text; its SHA-256 is the MAC key), as base64url into out (43 + NUL):
//  for signed cookies and CSRF tokens. sbx_secret_mac_verify compares in constant time.
void sbx_secret_mac (const char *key, const char *message, char out[44]);
//  Standard HMAC-SHA256 (RFC 2104) of size bytes of data under key, as 64 lower-case hex
//  digits: what any language's hmac module computes (webhook signatures, docs/webhooks.md).
void sbx_secret_hmac_sha256_hex (const char *key, const void *data, size_t size, char out[65]);
bool sbx_secret_mac_verify (const char *key, const char *message, const char *mac);

//  Fills buf with size random bytes (WebSocket masks and keys). -1 when libsodium
//  cannot start.
int sbx_secret_random (void *buf, size_t size);

//  Overwrites a secret string with zeros in place (a write the compiler cannot drop),
//  before freeing it. NULL is fine.
void sbx_secret_wipe (char *secret);
//  The same for size bytes of key material.
void sbx_secret_wipe_bytes (void *data, size_t size);

//  A uniformly random number in [0, upper), upper > 0 (for labels, jitter).
uint32_t sbx_secret_uniform (uint32_t upper);

void sbx_secret_test (bool verbose);

#endif
