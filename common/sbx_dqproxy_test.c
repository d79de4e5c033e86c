/*  sbx_dqproxy_test - the proxy with real sockets: 8 MiB each way through TLS, byte for
    byte, on several connections at once; a peer with another key, and one that speaks
    no TLS at all, never reach the target; a routed listener and a dial that does not
    block; closed connections are let go; the key file.
    Test runner only.
*/
#include "sbx_dqproxy.h"
#include "sbx_testcluster.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define S_BYTES (8 * 1024 * 1024)

//  An echo server on an abstract socket: each connection in a thread of its own.
typedef struct {
    int listener;
    int accepted;
    pthread_mutex_t lock;
} s_echo_t;

static void *s_echo_one (void *arg)
{
    int fd = (int) (intptr_t) arg;
    char buffer[65536];
    ssize_t n;
    while ((n = read (fd, buffer, sizeof buffer)) > 0) {
        ssize_t off = 0;
        while (off < n) {
            ssize_t w = write (fd, buffer + off, (size_t) (n - off));
            if (w <= 0)
                break;
            off += w;
        }
    }
    close (fd);
    return NULL;
}

static void *s_echo_run (void *arg)
{
    s_echo_t *echo = arg;
    while (true) {
        int fd = accept (echo->listener, NULL, NULL);
        if (fd < 0)
            return NULL;
        pthread_mutex_lock (&echo->lock);
        echo->accepted++;
        pthread_mutex_unlock (&echo->lock);
        pthread_t thread;
        pthread_create (&thread, NULL, s_echo_one, (void *) (intptr_t) fd);
        pthread_detach (thread);
    }
}

static int s_echo_accepted (s_echo_t *echo)
{
    pthread_mutex_lock (&echo->lock);
    int n = echo->accepted;
    pthread_mutex_unlock (&echo->lock);
    return n;
}

typedef struct {
    int fd;
    const unsigned char *data;
} s_writer_t;

static void *s_write_all (void *arg)
{
    s_writer_t *w = arg;
    size_t off = 0;
    while (off < S_BYTES) {
        ssize_t n = write (w->fd, w->data + off, S_BYTES - off > 100000 ? 100000 : S_BYTES - off);
        assert (n > 0);
        off += (size_t) n;
    }
    return NULL;
}

//  Sends S_BYTES through fd and reads them back; true when they match.
static bool s_round_trip (int fd, const unsigned char *data)
{
    s_writer_t writer = {fd, data};
    pthread_t thread;
    pthread_create (&thread, NULL, s_write_all, &writer);
    unsigned char *back = malloc (S_BYTES);
    size_t got = 0;
    while (got < S_BYTES) {
        ssize_t n = read (fd, back + got, S_BYTES - got);
        if (n <= 0)
            break;
        got += (size_t) n;
    }
    pthread_join (thread, NULL);
    bool same = got == S_BYTES && memcmp (back, data, S_BYTES) == 0;
    free (back);
    return same;
}

typedef struct {
    sbx_dqproxy_t *proxy;
    const char *address;
    const unsigned char *data;
    bool ok;
} s_client_t;

static void *s_client (void *arg)
{
    s_client_t *c = arg;
    int fd = sbx_dqproxy_dial (c->address, 3000, c->proxy);
    c->ok = fd >= 0 && s_round_trip (fd, c->data);
    if (fd >= 0)
        close (fd);
    return NULL;
}

//  A server that answers and closes at once, as HTTP/1.0 does: 1 MiB, then the close.
#define S_ANSWER (1024 * 1024)

static void *s_answer_once (void *arg)
{
    int listener = (int) (intptr_t) arg;
    int fd = accept (listener, NULL, NULL);
    if (fd < 0)
        return NULL;
    char *answer = malloc (S_ANSWER);
    memset (answer, 'a', S_ANSWER);
    size_t off = 0;
    while (off < S_ANSWER) {
        ssize_t w = write (fd, answer + off, S_ANSWER - off);
        if (w <= 0)
            break;
        off += (size_t) w;
    }
    free (answer);
    close (fd);
    return NULL;
}

static char s_answer_name[64];

//  The routed listener's choice: "echo" goes to the echo server (arg), "answer" to the
//  one that answers and closes, nothing else.
static char *s_route (const char *line, void *arg)
{
    if (strcmp (line, "answer") == 0)
        return strdup (s_answer_name);
    return strcmp (line, "echo") == 0 ? strdup ((const char *) arg) : NULL;
}

void sbx_dqproxy_test (bool verbose)
{
    (void) verbose;
    //  The target: an echo server on an abstract socket.
    char name[64];
    snprintf (name, sizeof name, "@sbx-dqproxy-test-%d", getpid ());
    s_echo_t echo = {.listener = socket (AF_UNIX, SOCK_STREAM, 0)};
    pthread_mutex_init (&echo.lock, NULL);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    memcpy (sun.sun_path + 1, name + 1, strlen (name) - 1);
    socklen_t len = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + strlen (name));
    assert (bind (echo.listener, (struct sockaddr *) &sun, len) == 0);
    assert (listen (echo.listener, 16) == 0);
    pthread_t echo_thread;
    pthread_create (&echo_thread, NULL, s_echo_run, &echo);

    unsigned char key[SBX_DQPROXY_KEY_SIZE], other[SBX_DQPROXY_KEY_SIZE];
    for (size_t i = 0; i < sizeof key; i++) {
        key[i] = (unsigned char) (i * 13 + 1);
        other[i] = (unsigned char) (i * 13 + 2);
    }
    assert (sbx_dqproxy_new (key, 16) == NULL);
    sbx_dqproxy_t *server = sbx_dqproxy_new (key, sizeof key);
    sbx_dqproxy_t *client = sbx_dqproxy_new (key, sizeof key);
    sbx_dqproxy_t *stranger = sbx_dqproxy_new (other, sizeof other);
    assert (server && client && stranger);
    char address[64];
    snprintf (address, sizeof address, "127.0.0.1:%d", sbx_testcluster_free_port ());
    assert (sbx_dqproxy_listen (server, address, name) == 0);
    assert (sbx_dqproxy_listen (server, address, name) == -1); //  taken

    unsigned char *data = malloc (S_BYTES);
    for (size_t i = 0; i < S_BYTES; i++)
        data[i] = (unsigned char) ((i * 2654435761u) >> 13);

    //  Four connections at once, 8 MiB each way each.
    s_client_t clients[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        clients[i] = (s_client_t){client, address, data, false};
        pthread_create (&threads[i], NULL, s_client, &clients[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join (threads[i], NULL);
        assert (clients[i].ok);
    }
    assert (s_echo_accepted (&echo) == 4);

    //  Another key: the handshake fails, the target never sees a connection.
    assert (sbx_dqproxy_dial (address, 2000, stranger) == -1);
    //  Not TLS at all: bytes that are no handshake; dropped, nothing reaches the target.
    int raw = socket (AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons ((uint16_t) atoi (strchr (address, ':') + 1)),
                              .sin_addr.s_addr = htonl (INADDR_LOOPBACK)};
    assert (connect (raw, (struct sockaddr *) &sin, sizeof sin) == 0);
    const char junk[] = "\x00\x00\x00\x01\x00\x00\x00\x00 plain dqlite words, no TLS";
    assert (write (raw, junk, sizeof junk) == (ssize_t) sizeof junk);
    char byte;
    assert (read (raw, &byte, 1) <= 0); //  closed on us
    close (raw);
    //  Nothing listens there: dial fails at once.
    char nowhere[64];
    snprintf (nowhere, sizeof nowhere, "127.0.0.1:%d", sbx_testcluster_free_port ());
    assert (sbx_dqproxy_dial (nowhere, 1000, client) == -1);
    assert (s_echo_accepted (&echo) == 4);

    //  A routed listener: the first line picks the target ("echo" is the echo server,
    //  anything else is refused); a dial never blocks its caller, what it writes at once
    //  comes back after the line; a refused line, another key, nobody listening: the
    //  socket closes, and the target sees nothing of them.
    //  (A port free a moment ago may be a closing connection's by now: another one.)
    char routed[64];
    int listening = -1;
    for (int tries = 0; tries < 20 && listening; tries++) {
        snprintf (routed, sizeof routed, "127.0.0.1:%d", sbx_testcluster_free_port ());
        listening = sbx_dqproxy_listen_routed (server, routed, s_route, name);
    }
    assert (listening == 0);
    int fd = sbx_dqproxy_dial_routed (client, routed, "echo");
    assert (fd >= 0);
    assert (s_round_trip (fd, data));
    close (fd);
    assert (s_echo_accepted (&echo) == 5);
    //  A target that answers and closes: all it said arrives before the close.
    snprintf (s_answer_name, sizeof s_answer_name, "@sbx-dqproxy-answer-%d", getpid ());
    int answerer = socket (AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un at = {.sun_family = AF_UNIX};
    memcpy (at.sun_path + 1, s_answer_name + 1, strlen (s_answer_name) - 1);
    assert (bind (answerer, (struct sockaddr *) &at,
                  (socklen_t) (offsetof (struct sockaddr_un, sun_path) + strlen (s_answer_name))) ==
            0);
    assert (listen (answerer, 4) == 0);
    pthread_t answer_thread;
    pthread_create (&answer_thread, NULL, s_answer_once, (void *) (intptr_t) answerer);
    fd = sbx_dqproxy_dial_routed (client, routed, "answer");
    assert (fd >= 0);
    size_t got_bytes = 0;
    char chunk[65536];
    ssize_t got_now;
    while ((got_now = read (fd, chunk, sizeof chunk)) > 0)
        got_bytes += (size_t) got_now;
    assert (got_bytes == S_ANSWER);
    close (fd);
    pthread_join (answer_thread, NULL);
    close (answerer);
    const char *refused[][2] = {{"nope", "client"}, {"echo", "stranger"}, {"echo", "nowhere"}};
    for (int i = 0; i < 3; i++) {
        bool stranger_dials = strcmp (refused[i][1], "stranger") == 0;
        fd = sbx_dqproxy_dial_routed (stranger_dials ? stranger : client,
                                      strcmp (refused[i][1], "nowhere") == 0 ? nowhere : routed,
                                      refused[i][0]);
        assert (fd >= 0);
        ssize_t w = send (fd, "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL); //  may be closed
        (void) w;
        char got;
        assert (read (fd, &got, 1) <= 0); //  closed
        close (fd);
    }
    assert (s_echo_accepted (&echo) == 5);
    //  Not a numeric address, a line with a newline: refused at once.
    assert (sbx_dqproxy_dial_routed (client, "localhost:1", "echo") == -1);
    assert (sbx_dqproxy_dial_routed (client, routed, "two\nlines") == -1);

    //  Every connection closed: the proxies let them all go.
    for (int tries = 0;
         tries < 100 && (sbx_dqproxy_connections (server) || sbx_dqproxy_connections (client));
         tries++)
        usleep (20 * 1000);
    assert (sbx_dqproxy_connections (server) == 0 && sbx_dqproxy_connections (client) == 0);

    //  The key file: made once (0600), read back the same; a damaged one refused.
    char dir[] = "/tmp/sbx_dqproxy_test.XXXXXX";
    assert (mkdtemp (dir));
    char path[128];
    snprintf (path, sizeof path, "%s/cluster.key", dir);
    unsigned char made[SBX_DQPROXY_KEY_SIZE], read_back[SBX_DQPROXY_KEY_SIZE];
    assert (sbx_dqproxy_key_load (path, false, made) == -1); //  none yet
    assert (sbx_dqproxy_key_load (path, true, made) == 0);
    struct stat st;
    assert (stat (path, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 65);
    assert (sbx_dqproxy_key_load (path, true, read_back) == 0);
    assert (memcmp (made, read_back, sizeof made) == 0);
    FILE *file = fopen (path, "w");
    fputs ("not hex at all, and not long enough either\n", file);
    fclose (file);
    assert (sbx_dqproxy_key_load (path, false, read_back) == -1);
    unlink (path);
    rmdir (dir);

    sbx_dqproxy_destroy (&server);
    sbx_dqproxy_destroy (&client);
    sbx_dqproxy_destroy (&stranger);
    assert (server == NULL);
    sbx_dqproxy_destroy (&server);
    shutdown (echo.listener, SHUT_RDWR);
    close (echo.listener);
    pthread_join (echo_thread, NULL);
    free (data);
}
