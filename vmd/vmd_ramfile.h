/*  vmd_ramfile - a template's guest RAM in a sealed memfd, which clones map copy-on-write.

    A template's hidden guest runs with its RAM in a memfd (QEMU memory-backend-file,
    share=on), so that the template's memory state leaves the RAM out (x-ignore-shared)
    and the RAM stays in the memfd when that QEMU quits. The memfd is then sealed
    (F_SEAL_WRITE, SHRINK, GROW, SEAL): every clone maps it share=off, private and
    copy-on-write, and no QEMU can write, truncate or punch holes in it, so no clone sees
    another's writes, and a guest's balloon cannot zero the template under the others
    (QEMU 7.2 discards file-backed RAM by fallocate on the file, share=off or not; the
    seal makes that fail). Kept on disk, sparse, as the template's memory.ram, so that a
    restarted vmd makes the memfd again.
*/
#ifndef VMD_RAMFILE_H_INCLUDED
#define VMD_RAMFILE_H_INCLUDED

#include <stdbool.h>
#include <stdint.h>

//  A new memfd of bytes (all holes), close-on-exec, sealable; or -1.
int vmd_ramfile_new (uint64_t bytes);

//  Seals fd for good: no write through any mapping or fd, no size change. 0 or -1.
int vmd_ramfile_seal (int fd);

//  Whether fd is a memfd sealed by vmd_ramfile_seal.
bool vmd_ramfile_sealed (int fd);

//  Writes fd's contents to path, holes kept as holes, through path.tmp, fsync and
//  rename. 0 or -1 (nothing left at path.tmp).
int vmd_ramfile_save (int fd, const char *path);

//  A sealed memfd with path's contents, which must be bytes long; or -1.
int vmd_ramfile_load (const char *path, uint64_t bytes);

void vmd_ramfile_test (bool verbose);

#endif
