/*  mhd_bare - the gateway-throughput baseline: libmicrohttpd over TLS (GnuTLS, the same
    library and TLS setup as sbx-gateway: HTTPS with a certificate from the local CA),
    answering every request with a fixed JSON body after reading the POST body. No
    auth, no JSON parsing, no broker: the floor under any server built on this library.

    mhd_bare PORT CERT KEY BODY_FILE
*/
#include <microhttpd.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *s_body;
static size_t s_body_size;

static char *s_slurp (const char *path, size_t *size)
{
    FILE *file = fopen (path, "rb");
    if (!file)
        return NULL;
    fseek (file, 0, SEEK_END);
    long n = ftell (file);
    fseek (file, 0, SEEK_SET);
    char *data = malloc ((size_t) n + 1);
    if (fread (data, 1, (size_t) n, file) != (size_t) n) {
        fclose (file);
        free (data);
        return NULL;
    }
    data[n] = 0;
    fclose (file);
    if (size)
        *size = (size_t) n;
    return data;
}

static enum MHD_Result s_handler (void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void) cls, (void) url, (void) method, (void) version, (void) upload_data;
    if (!*con_cls) {
        *con_cls = (void *) 1;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0; //  consume the body
        return MHD_YES;
    }
    struct MHD_Response *response = MHD_create_response_from_buffer (
        s_body_size, s_body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header (response, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response (connection, MHD_HTTP_OK, response);
    MHD_destroy_response (response);
    return ret;
}

int main (int argc, char **argv)
{
    if (argc != 5) {
        fprintf (stderr, "usage: mhd_bare PORT CERT KEY BODY_FILE\n");
        return 1;
    }
    char *cert = s_slurp (argv[2], NULL), *key = s_slurp (argv[3], NULL);
    s_body = s_slurp (argv[4], &s_body_size);
    if (!cert || !key || !s_body) {
        fprintf (stderr, "mhd_bare: cannot read cert, key or body\n");
        return 1;
    }
    //  One thread with epoll, like an event-loop server.
    struct MHD_Daemon *daemon = MHD_start_daemon (
        MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, (uint16_t) atoi (argv[1]),
        NULL, NULL, s_handler, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY,
        key, MHD_OPTION_CONNECTION_LIMIT, 1000, MHD_OPTION_CONNECTION_TIMEOUT, 60,
        MHD_OPTION_END);
    if (!daemon) {
        fprintf (stderr, "mhd_bare: cannot start on port %s\n", argv[1]);
        return 1;
    }
    printf ("ready\n");
    fflush (stdout);
    sigset_t set;
    sigemptyset (&set);
    sigaddset (&set, SIGTERM);
    sigaddset (&set, SIGINT);
    sigprocmask (SIG_BLOCK, &set, NULL);
    int sig;
    sigwait (&set, &sig);
    MHD_stop_daemon (daemon);
    return 0;
}
