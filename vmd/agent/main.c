/*  sbx-agent - the guest agent: PID 1 of every sbx guest, serving vmd over virtio-serial.

    Usage: sbx-agent [options]; see s_usage and vmd/agent/README.md.
*/
#include "agent_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void s_usage (FILE *out)
{
    fprintf (out, "usage: sbx-agent [options]\n"
                  "  --port PATH          virtio-serial port (default /dev/virtio-ports/agent)\n"
                  "  --port-fd N          serve on descriptor N instead, e.g. one end of a\n"
                  "                       socketpair (tests); its end of stream stops the agent\n"
                  "  --netdev NAME        interface agent.setup brings up or down (default eth0)\n"
                  "  --no-clock           agent.setup checks time_ms but does not set the clock\n"
                  "  --buffer-size BYTES  output kept per stream of a process (default 8 MiB)\n"
                  "  --max-finished N     finished processes kept (default 1000)\n"
                  "  --max-file-size B    largest file agent.file.write makes (default 1 GiB)\n"
                  "  --pty-idle-ms MS     a terminal nobody asks after for MS hangs up (SIGHUP\n"
                  "                       to its processes; default 120000, 0 never)\n"
                  "  --verbose            log every request on stderr\n"
                  "  --version, --help\n");
}

//  Parses a positive number; returns -1 when arg is not one.
static long long s_number (const char *arg)
{
    if (!arg)
        return -1;
    char *end;
    errno = 0;
    long long value = strtoll (arg, &end, 10);
    return errno || end == arg || *end || value < 0 ? -1 : value;
}

int main (int argc, char *argv[])
{
    agent_config_t config;
    agent_config_init (&config);
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *arg = i + 1 < argc ? argv[i + 1] : NULL;
        long long value = 0;
        if (!strcmp (opt, "--help") || !strcmp (opt, "-h")) {
            s_usage (stdout);
            return 0;
        }
        if (!strcmp (opt, "--version")) {
            printf ("sbx-agent %s\n", SBX_VERSION);
            return 0;
        }
        if (!strcmp (opt, "--no-clock"))
            config.no_clock = true;
        else if (!strcmp (opt, "--verbose"))
            config.verbose = true;
        else if (!strcmp (opt, "--port") && arg)
            config.port = argv[++i];
        else if (!strcmp (opt, "--netdev") && arg)
            config.netdev = argv[++i];
        else if (!strcmp (opt, "--port-fd") && (value = s_number (arg)) >= 0 && value < 65536) {
            config.port_fd = (int) value;
            i++;
        } else if (!strcmp (opt, "--buffer-size") && (value = s_number (arg)) > 0) {
            config.buf_limit = (size_t) value;
            i++;
        } else if (!strcmp (opt, "--max-finished") && (value = s_number (arg)) >= 0) {
            config.max_finished = (size_t) value;
            i++;
        } else if (!strcmp (opt, "--pty-idle-ms") && (value = s_number (arg)) >= 0) {
            config.pty_idle_ms = value;
            i++;
        } else if (!strcmp (opt, "--max-file-size") && (value = s_number (arg)) >= 0) {
            config.max_file_size = (size_t) value;
            i++;
        } else {
            fprintf (stderr, "sbx-agent: bad argument '%s'\n", opt);
            s_usage (stderr);
            return 2;
        }
    }
    //  In the guest (the virtio port, not a test's descriptor): keep /etc in step with
    //  the hostname vmd gives.
    if (config.port_fd < 0)
        config.etc_dir = "/etc";
    int rc = agent_server_run (&config);
    if (getpid () == 1) {
        //  PID 1 must not exit (the kernel panics): start afresh instead. Children keep
        //  running and are adopted again as orphans.
        fprintf (stderr, "sbx-agent: restarting\n");
        sleep (1);
        execv ("/proc/self/exe", argv);
        for (;;)
            pause ();
    }
    return rc;
}
