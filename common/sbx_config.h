/*  sbx_config - where things are and how processes find each other.

    Every process takes --data-dir DIR (default: $SBX_DATA_DIR, else /var/lib/sbx for
    root and ~/.sbx for others) and reads DIR/sbx.conf if it exists: one `key = value`
    per line, `#` comments. Command-line options override the file. Every endpoint has a
    same-host default under DIR/run (ipc://, reachable only through the file system and
    so never from a guest's user-mode network); tcp:// endpoints use CurveZMQ.

    Keys (see docs/operations.md for the full list):
      broker.endpoint   where clients connect       ipc://DIR/run/broker.sock
      broker.bind       where the broker binds      = broker.endpoint
      tap.endpoint      where subscribers connect   ipc://DIR/run/tap.sock
      tap.bind          where the broker publishes  = tap.endpoint
      broker.public_key broker's CURVE public key (z85), for tcp:// clients on other hosts
      instance          this process's instance name (default: the host name)
      heartbeat_ms      peer heartbeat period       1000
      request_timeout_ms  default request deadline  30000
      listen, domain    the gateway's HTTP(S) address and public domain
*/
#ifndef SBX_CONFIG_H_INCLUDED
#define SBX_CONFIG_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sbx_config_t sbx_config_t;

//  Picks the data directory (data_dir, or the default when NULL), creates it and its
//  run/ (0700), logs/ and keys/ subdirectories, and reads sbx.conf. Returns NULL (and
//  logs why) when the directory can't be made or the file has a syntax error.
sbx_config_t *sbx_config_new (const char *data_dir);
void sbx_config_destroy (sbx_config_t **self_p);

//  The default data directory as described above. Returns a static string.
const char *sbx_config_default_data_dir (void);

const char *sbx_config_data_dir (sbx_config_t *self);

//  Value of key: the override, else the file's, else the built-in default, else dflt.
const char *sbx_config_get (sbx_config_t *self, const char *key, const char *dflt);
uint64_t sbx_config_get_uint (sbx_config_t *self, const char *key, uint64_t dflt);
//  A comma-separated value as a list (blanks around items dropped, empty items skipped):
//  a NULL-terminated array for sbx_config_list_free, NULL when unset, empty or out of
//  memory; *count (may be NULL) gets the number of items. broker.endpoint and
//  tap.endpoint name every control node's broker so, control.join some nodes.
char **sbx_config_list (sbx_config_t *self, const char *key, size_t *count);
void sbx_config_list_free (char ***list_p);
//  A number within min..max; dflt (with a warning) when it is not one or is outside, and
//  when self is NULL (self-tests) or the key is unset.
uint64_t sbx_config_get_range (sbx_config_t *self, const char *key, uint64_t dflt, uint64_t min,
                               uint64_t max);

//  Checks every value set (in sbx.conf or overridden) against its key's kind: a number
//  where the default is one, on/off, true/false, HOST:PORT, a file or directory that
//  exists. 0, or -1 with why naming the first key that will not do and what it must be.
int sbx_config_check (sbx_config_t *self, char *why, size_t why_size);

//  Overrides key (from the command line). Returns 0, or -1 for an unknown key.
int sbx_config_set (sbx_config_t *self, const char *key, const char *value);

//  Returns DIR/relative in a string the caller frees.
char *sbx_config_path (sbx_config_t *self, const char *relative);

//  Writes the effective settings that differ from the defaults to DIR/sbx.conf.
int sbx_config_save (sbx_config_t *self);

void sbx_config_test (bool verbose);

#endif
