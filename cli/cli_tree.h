/*  cli_tree - the file copies sbx backup and sbx restore share (cli_backup, cli_restore). */
#ifndef CLI_TREE_H_INCLUDED
#define CLI_TREE_H_INCLUDED

#include <jansson.h>
#include <sys/stat.h>

//  The manifest's name in a backup, its format and the one version this sbx reads.
#define CLI_TREE_MANIFEST "backup.json"
#define CLI_TREE_FORMAT   "sbx-backup"
#define CLI_TREE_VERSION  1

//  Copies what fd holds into a new file at path (0600, it must not exist), holes kept,
//  and makes it reach the disk. 0, or -1 with errno.
int cli_tree_copy_fd (int in, const char *path);
//  The SHA-256 (hex) of the file at path. 0, or -1 with errno.
int cli_tree_hash (const char *path, char out[65]);
//  Removes path and what is under it, links not followed.
void cli_tree_remove (const char *path);
//  {"mode", "user", "group"} of st, names as this machine has them.
json_t *cli_tree_owner (const struct stat *st);

#endif
