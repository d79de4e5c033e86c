/*  vmd_template - template snapshots for fast creates: per sandbox type, a snapshot of a
    freshly booted, idle guest of the image that type boots, which a new sandbox restores
    (as from a user's snapshot, with its own identity) instead of booting.

    Kept per vmd instance (several vmds may share a data directory) under
    <data-dir>/templates/<instance>/<image hash>-<type>-<QEMU version hash>/: disk.qcow2,
    memory.state (devices only), memory.ram (the guest's RAM, sparse) and qemu.version
    written last (a template without it is incomplete and made again). Each is made once
    per image, type and QEMU version, in the background: a hidden guest boots under
    templates/<instance>/work/ (never vms/, so re-adoption does not see it) with its RAM
    in a memfd (vmd_ramfile), is stopped as soon as its agent answers, its files are
    copied, and it is deleted. The memfd, sealed, stays open for the sandboxes made from
    the template: they map it copy-on-write and share every page none of them wrote.
    Sandboxes restored from a template stand on its disk, so complete templates are
    never removed (like images/; another QEMU's stay too). Until one is ready, creates
    boot cold; a restore that fails or passes its deadline boots cold (vmd_server).
*/
#ifndef VMD_TEMPLATE_H_INCLUDED
#define VMD_TEMPLATE_H_INCLUDED

#include "vmd_guest.h"

typedef struct _vmd_template_t vmd_template_t;

//  Makes (in the background, from `loop`) the templates of `types` (a space or comma
//  separated list of type names, e.g. "small"), each of the image its type boots
//  (vmd_guest_env_image of `images`: image_dir, or the type's own), in the directory of
//  vmd's instance name. NULL when types is empty or names no type, or the
//  instance name cannot be a directory name. wake is called when the hidden guest has
//  something for vmd_template_collect (see vmd_guest_collect).
vmd_template_t *vmd_template_new (zloop_t *loop, const char *data_dir, const char *instance,
                                  const vmd_guest_env_t *images, const char *qemu_user,
                                  const char *types, void (*wake) (void *arg), void *arg);
void vmd_template_destroy (vmd_template_t **self_p);

//  The directory of the ready template of `type` for image_dir (the image that type
//  boots), or NULL.
const char *vmd_template_dir (vmd_template_t *self, sbx_sandbox_type_t type, const char *image_dir);

//  The ready template's RAM for vmd_guest_set_ram (a sealed memfd, the template's), or
//  -1 when it has none (its memory.state then holds the RAM).
int vmd_template_ram (vmd_template_t *self, sbx_sandbox_type_t type);

//  A create restored the template of `type` (ok), or could not (it booted cold). After
//  VMD_TEMPLATE_FAILURES failures in a row the template is set aside: creates of that
//  type boot cold at once until vmd restarts (its files stay: sandboxes stand on them).
#define VMD_TEMPLATE_FAILURES 3
void vmd_template_restored (vmd_template_t *self, sbx_sandbox_type_t type, bool ok);

//  From a poller: drops the hidden guest once it is deleted, starts the next template.
void vmd_template_collect (vmd_template_t *self);

#endif
