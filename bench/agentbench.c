/*  agentbench - the benchmark's raw baseline tools, linked with vmd_lib and the codec.

    agentbench argv IMAGE_DIR DIR HOSTNAME
        Prints vmd_qemu_argv () for the small type, one argument a line: the exact
        command line vmd would spawn for a guest in DIR.
    agentbench overlay IMAGE_DIR DIR
        Creates DIR/overlay.qcow2 on IMAGE_DIR/rootfs.ext4 (vmd_qemu_overlay_create).
    agentbench client SOCK [--exec N] [--bigout] [--files] [--cmd COMMAND]...
        Connects to a guest agent's virtio-serial socket (retrying while QEMU has not
        made it), waits for agent.hello, does one agent.ping round trip, then the asked
        measurements. Prints one JSON object a line; times are CLOCK_MONOTONIC seconds
        (the same clock as Python's time.monotonic ()). Each --cmd runs COMMAND in the
        foreground, in order, after the rest: {"sent", "answered", "exit", "stdout"}.
*/
#include "agent_frame.h"
#include "sbx_msg.h"
#include "vmd_qemu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static int s_config (vmd_qemu_config_t *config, char **argv)
{
    vmd_qemu_config_init (config);
    config->image_dir = argv[0];
    config->dir = argv[1];
    config->hostname = argv[2];
    return 0;
}

static agent_frame_t *s_frame;
static uint64_t s_rid = 100;

static sbx_msg_t *s_call (sbx_msg_t *msg, int timeout_ms)
{
    sbx_err_t err;
    msg->rid = ++s_rid;
    if (agent_frame_send (s_frame, msg, &err) || agent_frame_flush_wait (s_frame, timeout_ms)) {
        fprintf (stderr, "agentbench: send: %s\n", err.message);
        exit (2);
    }
    sbx_msg_destroy (&msg);
    for (;;) {
        sbx_msg_t *reply = agent_frame_recv (s_frame, timeout_ms, &err);
        if (!reply) {
            fprintf (stderr, "agentbench: recv: %s (%s)\n", err.message, strerror (errno));
            exit (2);
        }
        if (reply->rid == s_rid)
            return reply;
        sbx_msg_destroy (&reply); //  a hello or something stale
    }
}

static sbx_msg_t *s_exec (const char *command, bool detached)
{
    sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_EXEC);
    sbx_str_set (&sbx_msg_agent_exec (msg)->command, command);
    sbx_msg_agent_exec (msg)->detached = detached;
    sbx_msg_agent_exec (msg)->max_bytes = 8 * 1024 * 1024;
    sbx_msg_t *reply = s_call (msg, 120000);
    if (reply->type != SBX_MSG_AGENT_EXEC_OK) {
        fprintf (stderr, "agentbench: exec %s: not ok\n", command);
        exit (2);
    }
    return reply;
}

//  bytes as a JSON string (the guest's output: any bytes; others escaped).
static void s_json_bytes (const uint8_t *data, size_t size)
{
    putchar ('"');
    for (size_t i = 0; i < size; i++) {
        uint8_t c = data[i];
        if (c == '"' || c == '\\')
            printf ("\\%c", c);
        else if (c == '\n')
            printf ("\\n");
        else if (c < 0x20 || c >= 0x7f)
            printf ("\\u%04x", c);
        else
            putchar (c);
    }
    putchar ('"');
}

static int s_client (int argc, char **argv)
{
    const char *path = argv[0];
    int execs = 0;
    bool bigout = false, files = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp (argv[i], "--cmd") == 0 && i + 1 < argc)
            i++; //  run last, in order (below)
        else if (strcmp (argv[i], "--exec") == 0 && i + 1 < argc)
            execs = atoi (argv[++i]);
        else if (strcmp (argv[i], "--bigout") == 0)
            bigout = true;
        else if (strcmp (argv[i], "--files") == 0)
            files = true;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf (addr.sun_path, sizeof addr.sun_path, "%s", path);
    int fd = -1;
    double deadline = s_now () + 120;
    while (s_now () < deadline) {
        fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect (fd, (struct sockaddr *) &addr, sizeof addr) == 0)
            break;
        close (fd);
        fd = -1;
        usleep (2000);
    }
    if (fd == -1) {
        fprintf (stderr, "agentbench: cannot connect to %s\n", path);
        return 2;
    }
    double connected = s_now ();
    fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) | O_NONBLOCK);
    s_frame = agent_frame_new (fd);
    sbx_err_t err;
    sbx_msg_t *hello = NULL;
    while (!hello) {
        hello = agent_frame_recv (s_frame, 120000, &err);
        if (!hello) {
            fprintf (stderr, "agentbench: no hello: %s\n", err.message);
            return 2;
        }
        if (hello->type != SBX_MSG_AGENT_HELLO)
            sbx_msg_destroy (&hello);
    }
    double t_hello = s_now ();
    sbx_msg_destroy (&hello);
    sbx_msg_t *pong = s_call (sbx_msg_new (SBX_MSG_AGENT_PING), 30000);
    double t_ping = s_now ();
    printf ("{\"connected\":%.6f,\"hello\":%.6f,\"ping\":%.6f,\"ping_ok\":%s}\n", connected,
            t_hello, t_ping, pong->type == SBX_MSG_AGENT_PING_OK ? "true" : "false");
    sbx_msg_destroy (&pong);
    fflush (stdout);

    if (execs > 0) {
        for (int i = 0; i < 3; i++) { //  warm-up, untimed (the MCP side does one too)
            sbx_msg_t *reply = s_exec ("true", false);
            sbx_msg_destroy (&reply);
        }
        printf ("{\"exec_true_s\":[");
        for (int i = 0; i < execs; i++) {
            double t0 = s_now ();
            sbx_msg_t *reply = s_exec ("true", false);
            printf ("%s%.6f", i ? "," : "", s_now () - t0);
            sbx_msg_destroy (&reply);
        }
        printf ("]}\n");
        fflush (stdout);
    }
    if (bigout) {
        //  Detached, then agent.status from the offsets until the process ended and
        //  nothing is left: every byte the agent still holds, 8 MiB a reply at most, each
        //  held up to 5 s until there is output (wait_ms; MCP's waitSeconds the same).
        double t0 = s_now ();
        sbx_msg_t *reply =
            s_exec ("head -c 10485760 /dev/zero | base64 -w0 | head -c 10485760", true);
        uint64_t pid = sbx_msg_agent_exec_ok (reply)->pid;
        sbx_msg_destroy (&reply);
        uint64_t offset = 0, bytes = 0;
        bool truncated = false;
        for (;;) {
            sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_STATUS);
            sbx_msg_agent_status (msg)->pid = pid;
            sbx_msg_agent_status (msg)->stdout_offset = offset;
            sbx_msg_agent_status (msg)->max_bytes = 8 * 1024 * 1024;
            sbx_msg_agent_status (msg)->wait_ms = 5000;
            sbx_msg_t *st = s_call (msg, 120000);
            sbx_agent_status_ok_t *ok = sbx_msg_agent_status_ok (st);
            bytes += ok->stdout.size;
            truncated = truncated || ok->stdout_truncated;
            offset = ok->stdout_next_offset;
            bool done = !ok->running && !ok->stdout_more;
            sbx_msg_destroy (&st);
            if (done)
                break;
        }
        printf ("{\"bigout_s\":%.6f,\"bigout_bytes\":%llu,\"bigout_truncated\":%s}\n",
                s_now () - t0, (unsigned long long) bytes, truncated ? "true" : "false");
        fflush (stdout);
    }
    if (files) {
        size_t chunk = 1024 * 1024, total = 10 * chunk;
        uint8_t *data = malloc (chunk);
        for (size_t i = 0; i < chunk; i++)
            data[i] = (uint8_t) (i * 7 + 3);
        double t0 = s_now ();
        for (size_t off = 0; off < total; off += chunk) {
            sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_WRITE);
            sbx_agent_file_write_t *w = sbx_msg_agent_file_write (msg);
            sbx_str_set (&w->path, "/root/bench.bin");
            sbx_bytes_set (&w->data, data, chunk);
            w->offset = off;
            w->truncate = off == 0;
            sbx_msg_t *reply = s_call (msg, 120000);
            if (reply->type != SBX_MSG_AGENT_FILE_WRITE_OK) {
                fprintf (stderr, "agentbench: file.write failed\n");
                return 2;
            }
            sbx_msg_destroy (&reply);
        }
        double t1 = s_now ();
        uint64_t got = 0;
        for (;;) {
            sbx_msg_t *msg = sbx_msg_new (SBX_MSG_AGENT_FILE_READ);
            sbx_agent_file_read_t *r = sbx_msg_agent_file_read (msg);
            sbx_str_set (&r->path, "/root/bench.bin");
            r->offset = got;
            r->length = chunk;
            sbx_msg_t *reply = s_call (msg, 120000);
            if (reply->type != SBX_MSG_AGENT_FILE_READ_OK) {
                fprintf (stderr, "agentbench: file.read failed\n");
                return 2;
            }
            sbx_agent_file_read_ok_t *ok = sbx_msg_agent_file_read_ok (reply);
            got += ok->data.size;
            bool eof = ok->eof || ok->data.size == 0;
            sbx_msg_destroy (&reply);
            if (eof || got >= total)
                break;
        }
        printf ("{\"write_s\":%.6f,\"read_s\":%.6f,\"file_bytes\":%llu}\n", t1 - t0, s_now () - t1,
                (unsigned long long) got);
        free (data);
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp (argv[i], "--cmd") != 0 || i + 1 >= argc)
            continue;
        double t0 = s_now ();
        sbx_msg_t *reply = s_exec (argv[++i], false);
        double t1 = s_now ();
        sbx_agent_exec_ok_t *ok = sbx_msg_agent_exec_ok (reply);
        printf ("{\"sent\":%.6f,\"answered\":%.6f,\"exit\":%lld,\"stdout\":", t0, t1,
                (long long) ok->exit_code);
        s_json_bytes (ok->stdout.data, ok->stdout.size);
        printf ("}\n");
        fflush (stdout);
        sbx_msg_destroy (&reply);
    }
    agent_frame_destroy (&s_frame);
    close (fd);
    return 0;
}

int main (int argc, char **argv)
{
    if (argc >= 5 && strcmp (argv[1], "argv") == 0) {
        vmd_qemu_config_t config;
        s_config (&config, argv + 2);
        char **args = vmd_qemu_argv (&config);
        if (!args)
            return 1;
        for (char **arg = args; *arg; arg++)
            printf ("%s\n", *arg);
        vmd_qemu_argv_destroy (&args);
        return 0;
    }
    if (argc >= 4 && strcmp (argv[1], "overlay") == 0) {
        vmd_qemu_config_t config;
        char *args[3] = {argv[2], argv[3], "bench"};
        s_config (&config, args);
        return vmd_qemu_overlay_create (&config) == 0 ? 0 : 1;
    }
    if (argc >= 3 && strcmp (argv[1], "client") == 0)
        return s_client (argc - 2, argv + 2);
    fprintf (stderr, "usage: agentbench argv|overlay|client ...\n");
    return 1;
}
