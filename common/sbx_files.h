/*  sbx_files - file system chores shared by daemons. */
#ifndef SBX_FILES_H_INCLUDED
#define SBX_FILES_H_INCLUDED

//  Removes a directory tree, never following a symbolic link (a link is removed, not
//  what it names). 0 (a missing path too), or -1 when something could not go.
int sbx_files_remove_tree (const char *path);

#endif
