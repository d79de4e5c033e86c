/*  sbx_curve - see sbx_curve.h */
#include "sbx_curve.h"
#include "sbx_log.h"

#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool sbx_curve_needed (const char *endpoint)
{
    return endpoint && strncmp (endpoint, "tcp://", 6) == 0;
}

//  Loads DIR/keys/<name>.cert (+ _secret) or creates and saves a new pair.
static zcert_t *s_cert_load_or_create (sbx_config_t *config, const char *name)
{
    char rel[300];
    snprintf (rel, sizeof rel, "keys/%s.cert", name);
    char *path = sbx_config_path (config, rel);
    if (!path)
        return NULL;
    zcert_t *cert = zcert_load (path);
    if (!cert) {
        cert = zcert_new ();
        if (cert) {
            zcert_set_meta (cert, "name", "%s", name);
            if (zcert_save (cert, path)) {
                sbx_error ("cannot save key pair %s", path);
                zcert_destroy (&cert);
            } else
                sbx_info ("created CURVE key pair %s", path);
        }
    }
    free (path);
    return cert;
}

//  Writes public_txt into DIR/keys/allowed/<name>.cert (see sbx_curve.h). The file is
//  left alone when it already holds the key, and is otherwise written under a hidden
//  name and renamed. Rewriting it in place let the broker's zauth reread the directory
//  while the file was empty, then miss the finished file (same count, size and
//  second), and refuse every local worker that connected afterwards.
int sbx_curve_allow (sbx_config_t *config, const char *public_txt, const char *name)
{
    if (!public_txt || strlen (public_txt) != 40 || !name || !*name || strchr (name, '/'))
        return -1;
    char *dir = sbx_config_path (config, "keys/allowed");
    if (!dir)
        return -1;
    mkdir (dir, 0700);
    char path[600], temp[640];
    snprintf (path, sizeof path, "%s/%s.cert", dir, name);
    snprintf (temp, sizeof temp, "%s/.%s.cert.%d", dir, name, (int) getpid ());
    zcert_t *present = zcert_load (path);
    bool same = present && streq (zcert_public_txt (present), public_txt);
    zcert_destroy (&present);
    if (same) {
        free (dir);
        return 0;
    }
    //  The same key under another name (an operator's copy, a joined host's record):
    //  czmq's certificate store aborts the process on a key it holds twice.
    zdir_t *listing = zdir_new (dir, NULL);
    free (dir);
    bool elsewhere = false;
    zfile_t **files = listing ? zdir_flatten (listing) : NULL;
    for (size_t i = 0; files && files[i] && !elsewhere; i++) {
        const char *name_i = zfile_filename (files[i], NULL);
        if (!strstr (name_i, ".cert") || strstr (name_i, "_secret"))
            continue;
        zcert_t *other = zcert_load (name_i);
        elsewhere = other && streq (zcert_public_txt (other), public_txt);
        zcert_destroy (&other);
    }
    if (files)
        zdir_flatten_free (&files);
    zdir_destroy (&listing);
    if (elsewhere)
        return 0;
    //  A public certificate: the secret half is not ours to have.
    byte public_key[32], none[32] = {0};
    zcert_t *cert =
        zmq_z85_decode (public_key, public_txt) ? zcert_new_from (public_key, none) : NULL;
    if (!cert || zcert_save_public (cert, temp) || rename (temp, path)) {
        sbx_error ("cannot allow the key in %s: %s", path, strerror (errno));
        unlink (temp);
        zcert_destroy (&cert);
        return -1;
    }
    zcert_destroy (&cert);
    return 0;
}

int sbx_curve_disallow (sbx_config_t *config, const char *name)
{
    if (!name || !*name || strchr (name, '/'))
        return -1;
    char relative[200];
    snprintf (relative, sizeof relative, "keys/allowed/%s.cert", name);
    char *path = sbx_config_path (config, relative);
    int rc = path && unlink (path) != 0 && errno != ENOENT ? -1 : 0;
    free (path);
    return rc;
}

static int s_allow (sbx_config_t *config, zcert_t *cert, const char *name)
{
    return sbx_curve_allow (config, zcert_public_txt (cert), name);
}

zactor_t *sbx_curve_auth_new (sbx_config_t *config)
{
    char *allowed = sbx_config_path (config, "keys/allowed");
    zactor_t *auth = allowed ? zactor_new (zauth, NULL) : NULL;
    if (auth) {
        mkdir (allowed, 0700);
        //  zauth rereads the directory when it changes, so a key copied in later counts.
        zstr_sendx (auth, "CURVE", allowed, NULL);
        zsock_wait (auth);
    }
    free (allowed);
    return auth;
}

int sbx_curve_server (sbx_config_t *config, zsock_t *sock)
{
    zcert_t *cert = s_cert_load_or_create (config, "broker");
    if (!cert)
        return -1;
    zcert_apply (cert, sock);
    zsock_set_curve_server (sock, 1);
    zsock_set_zap_domain (sock, "sbx");
    zcert_destroy (&cert);
    return 0;
}

zcert_t *sbx_curve_host_cert (sbx_config_t *config)
{
    return s_cert_load_or_create (config, "client");
}

int sbx_curve_client (sbx_config_t *config, zsock_t *sock)
{
    zcert_t *cert = s_cert_load_or_create (config, "client");
    if (!cert)
        return -1;
    const char *server_key = sbx_config_get (config, "broker.public_key", NULL);
    zcert_t *broker = NULL;
    if (!server_key) {
        char *path = sbx_config_path (config, "keys/broker.cert");
        broker = path ? zcert_load (path) : NULL;
        free (path);
        if (broker)
            server_key = zcert_public_txt (broker);
    }
    int rc = -1;
    if (!server_key)
        sbx_error ("no broker public key: set broker.public_key in sbx.conf");
    else if (strlen (server_key) != 40)
        sbx_error ("broker.public_key must be 40 z85 characters");
    else {
        //  When the broker's own key pair is here, this is the broker's host: allow it.
        if (broker)
            s_allow (config, cert, "local-client");
        zcert_apply (cert, sock);
        zsock_set_curve_serverkey (sock, server_key);
        rc = 0;
    }
    zcert_destroy (&broker);
    zcert_destroy (&cert);
    return rc;
}

void sbx_curve_test (bool verbose)
{
    (void) verbose;
    char dir[] = "/tmp/sbx_curve_test.XXXXXX";
    assert (mkdtemp (dir));
    sbx_config_t *config = sbx_config_new (dir);
    assert (config);
    assert (sbx_curve_needed ("tcp://127.0.0.1:1"));
    assert (!sbx_curve_needed ("ipc:///tmp/x"));

    zactor_t *auth = sbx_curve_auth_new (config);
    assert (auth);
    zsock_t *server = zsock_new (ZMQ_ROUTER);
    assert (sbx_curve_server (config, server) == 0);
    int port = zsock_bind (server, "tcp://127.0.0.1:*");
    assert (port > 0);
    char endpoint[64];
    snprintf (endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);

    //  A client with a registered key gets through.
    zsock_t *good = zsock_new (ZMQ_DEALER);
    assert (sbx_curve_client (config, good) == 0);
    assert (zsock_connect (good, "%s", endpoint) == 0);
    zstr_send (good, "hello");
    zsock_set_rcvtimeo (server, 5000);
    zmsg_t *msg = zmsg_recv (server);
    assert (msg && zmsg_size (msg) == 2);
    zmsg_destroy (&msg);

    //  Another local client leaves the allowed key as it is (no rewrite zauth could
    //  read half of).
    char *allowed_key = sbx_config_path (config, "keys/allowed/local-client.cert");
    struct stat before, after;
    assert (allowed_key && stat (allowed_key, &before) == 0);
    zsock_t *again = zsock_new (ZMQ_DEALER);
    assert (sbx_curve_client (config, again) == 0);
    assert (stat (allowed_key, &after) == 0 && after.st_ino == before.st_ino &&
            after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
    zsock_destroy (&again);
    free (allowed_key);

    //  A client whose key is not in allowed/ is never heard.
    zcert_t *stranger = zcert_new ();
    zsock_t *bad = zsock_new (ZMQ_DEALER);
    zcert_apply (stranger, bad);
    char *path = sbx_config_path (config, "keys/broker.cert");
    zcert_t *broker = zcert_load (path);
    free (path);
    zsock_set_curve_serverkey (bad, zcert_public_txt (broker));
    assert (zsock_connect (bad, "%s", endpoint) == 0);
    zstr_send (bad, "intruder");
    zsock_set_rcvtimeo (server, 500);
    msg = zmsg_recv (server);
    assert (msg == NULL);

    //  Nor is a plain (non-CURVE) client.
    zsock_t *plain = zsock_new (ZMQ_DEALER);
    assert (zsock_connect (plain, "%s", endpoint) == 0);
    zstr_send (plain, "plain");
    msg = zmsg_recv (server);
    assert (msg == NULL);

    zsock_destroy (&plain);
    zsock_destroy (&bad);
    zsock_destroy (&good);
    zcert_destroy (&broker);
    zcert_destroy (&stranger);
    zsock_destroy (&server);
    zactor_destroy (&auth);
    sbx_config_destroy (&config);
    char cmd[128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert (system (cmd) == 0);
}
