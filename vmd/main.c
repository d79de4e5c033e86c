/*  sbx-vmd - the QEMU microvm guests of one host (vmd_server does the work). */
#include "sbx_daemon.h"
#include "sbx_log.h"
#include "vmd_qemu.h"
#include "vmd_server.h"

int main (int argc, char **argv)
{
    int code;
    sbx_daemon_t *daemon = sbx_daemon_new (
        argc, argv, "sbx-vmd",
        "Runs the QEMU microvm guests of this host: disks, memory state, QMP, the guest\n"
        "agent channel and port forwards. One per host; re-adopts running guests after a\n"
        "restart. See docs/vmd.md.\n"
        "\n"
        "Images: image_dir is the guest image sandboxes boot (default: <exe dir>/../image,\n"
        "the build's build/image); image_dir.small, image_dir.medium and image_dir.large\n"
        "give one type an image of its own, e.g. the docker variant (build/image-docker,\n"
        "cmake --build build --target sbx-image-docker): --set image_dir.medium=DIR.\n"
        "Each must be a directory with vmlinux, initrd.img and rootfs.ext4, or vmd does\n"
        "not start (vmd/image/README.md, Variants).",
        &code);
    if (!daemon)
        return code;
    //  Host-wide, so set before the server spawns its first guest.
    sbx_config_t *config = sbx_daemon_config (daemon);
    uint64_t tb_mib = sbx_config_get_uint (config, "vmd.tcg_tb_mib", VMD_QEMU_TCG_TB_MIB);
    if (vmd_qemu_set_tcg_tb_mib (tb_mib)) {
        sbx_error ("vmd.tcg_tb_mib = %llu: must be 8 to 1024 (MiB)", (unsigned long long) tb_mib);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    vmd_server_t *server = vmd_server_new (config, sbx_daemon_loop (daemon));
    sbx_peer_t *peer = server
                           ? sbx_daemon_connect (daemon, SBX_ROLE_VMD, vmd_server_capacity (server),
                                                 vmd_server_on_request, server)
                           : NULL;
    if (!peer) {
        vmd_server_destroy (&server);
        sbx_daemon_destroy (&daemon);
        return 1;
    }
    vmd_server_attach (server, peer);
    code = sbx_daemon_run (daemon);
    //  The guests keep running: the next vmd adopts them.
    vmd_server_destroy (&server);
    sbx_daemon_destroy (&daemon);
    return code;
}
