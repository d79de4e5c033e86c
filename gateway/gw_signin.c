/*  gw_signin - see gw_signin.h */
#include "gw_signin.h"
#include "sbx_idmap.h"
#include "gw_verify.h"
#include "sbx_secret.h"

#include <assert.h>

#define S_BROKER_MS 10000
#define S_WRONG     "Wrong email or password."
#define S_DISABLED  "This account is disabled: ask the operator of this service to enable it again."

//  One attempt, waiting for the broker, then for the verifier.
typedef struct {
    gw_signin_t *signin;
    uint64_t handle;
    gw_signin_fn *fn;
    void *arg;
    char *password; //  wiped when freed
    char *account_id;
    char *email;   //  as the broker knows it, or as typed when it knows none
    bool disabled; //  the account is disabled: refused once the password is right
    uint64_t broker_handle;
    uint64_t verify_handle;
} s_attempt_t;

struct gw_signin_t {
    gw_broker_t *broker;
    gw_verify_t *verify;
    bool own_verify; //  made here (no shared one was set)
    char *who;
    zhashx_t *attempts; //  handle → s_attempt_t, freed by hand (see s_answer)
    uint64_t next_handle;
};

static void s_attempt_free (s_attempt_t **attempt_p)
{
    s_attempt_t *attempt = *attempt_p;
    if (!attempt)
        return;
    gw_broker_cancel (attempt->signin->broker, attempt->broker_handle);
    gw_verify_cancel (attempt->signin->verify, attempt->verify_handle);
    if (attempt->password)
        sbx_secret_wipe (attempt->password);
    free (attempt->password);
    free (attempt->account_id);
    free (attempt->email);
    free (attempt);
    *attempt_p = NULL;
}

//  Forgets the attempt, then answers: the callback may end what holds the handle.
static void s_answer (s_attempt_t *attempt, int status, const char *error)
{
    zhashx_delete (attempt->signin->attempts, (void *) (uintptr_t) attempt->handle);
    bool match = !error;
    attempt->fn (match ? attempt->account_id : NULL, match ? attempt->email : NULL, status, error,
                 attempt->arg);
    s_attempt_free (&attempt);
}

static void s_on_verified (gw_verify_result_t result, void *arg)
{
    s_attempt_t *attempt = arg;
    attempt->verify_handle = 0;
    const char *who = attempt->signin->who;
    if (result == GW_VERIFY_THROTTLED) {
        sbx_warn ("%s sign-in for %.100s throttled (too many wrong passwords)", who,
                  attempt->email);
        s_answer (attempt, 429,
                  "Too many wrong passwords for this email: try again in 15 minutes.");
    } else if (result == GW_VERIFY_WRONG) {
        sbx_info ("%s sign-in refused for %.100s (wrong password)", who, attempt->email);
        s_answer (attempt, 200, S_WRONG);
    } else if (attempt->disabled) {
        //  Said only to who knows the password: no hint to anyone else.
        sbx_info ("%s sign-in refused for %.100s (account disabled)", who, attempt->email);
        s_answer (attempt, 403, S_DISABLED);
    } else
        s_answer (attempt, 200, NULL);
}

static void s_on_password (sbx_msg_t *reply, sbx_code_t code, const char *message, void *arg)
{
    s_attempt_t *attempt = arg;
    attempt->broker_handle = 0;
    if (!reply && code == SBX_E_NOT_FOUND) {
        //  Unknown emails look like wrong passwords, and take as long: a dummy check.
        uint64_t handle = gw_verify_start (attempt->signin->verify, attempt->email, NULL,
                                           attempt->password, s_on_verified, attempt);
        if (handle)
            attempt->verify_handle = handle;
    } else if (!reply) {
        char text[600];
        snprintf (text, sizeof text, "Signing in is not possible right now: %s (%s).",
                  message ? message : "", sbx_code_name (code));
        s_answer (attempt, 503, text);
    } else {
        sbx_oauth_password_ok_t *ok = sbx_msg_oauth_password_ok (reply);
        attempt->account_id = strdup (ok->account_id);
        free (attempt->email);
        attempt->email = strdup (ok->email);
        attempt->disabled = ok->disabled;
        if (!attempt->account_id || !attempt->email) {
            s_answer (attempt, 503, "Signing in is not possible right now: out of memory.");
            return;
        }
        //  0: answered at once, and the attempt is gone.
        uint64_t handle = gw_verify_start (attempt->signin->verify, ok->email, ok->password_hash,
                                           attempt->password, s_on_verified, attempt);
        if (handle)
            attempt->verify_handle = handle;
    }
}

uint64_t gw_signin_start (gw_signin_t *self, const char *email, const char *password,
                          gw_signin_fn *fn, void *arg)
{
    if (!email || !*email || !password || !*password || strlen (email) > 254) {
        fn (NULL, NULL, 200, "Type your email and password.", arg);
        return 0;
    }
    s_attempt_t *attempt = calloc (1, sizeof *attempt);
    char *copy = strdup (password);
    char *typed = strdup (email);
    if (!attempt || !copy || !typed) {
        free (attempt);
        free (copy);
        free (typed);
        fn (NULL, NULL, 503, "Signing in is not possible right now: out of memory.", arg);
        return 0;
    }
    *attempt = (s_attempt_t){.signin = self,
                             .handle = self->next_handle++,
                             .fn = fn,
                             .arg = arg,
                             .password = copy,
                             .email = typed};
    uint64_t handle = attempt->handle;
    zhashx_insert (self->attempts, (void *) (uintptr_t) handle, attempt);
    sbx_msg_t *request = sbx_msg_new (SBX_MSG_OAUTH_PASSWORD);
    sbx_str_set (&sbx_msg_oauth_password (request)->email, email);
    uint64_t sent =
        gw_broker_send (self->broker, NULL, &request, S_BROKER_MS, s_on_password, attempt);
    if (!zhashx_lookup (self->attempts, (void *) (uintptr_t) handle))
        return 0; //  answered at once
    attempt->broker_handle = sent;
    return handle;
}

void gw_signin_set_verify (gw_signin_t *self, gw_verify_t *verify)
{
    assert (self && verify);
    assert (zhashx_size (self->attempts) == 0);
    if (self->own_verify)
        gw_verify_destroy (&self->verify);
    self->verify = verify;
    self->own_verify = false;
}

void gw_signin_cancel (gw_signin_t *self, uint64_t handle)
{
    s_attempt_t *attempt =
        self && handle ? zhashx_lookup (self->attempts, (void *) (uintptr_t) handle) : NULL;
    if (attempt) {
        zhashx_delete (self->attempts, (void *) (uintptr_t) handle);
        s_attempt_free (&attempt);
    }
}

gw_signin_t *gw_signin_new (zloop_t *loop, gw_broker_t *broker, const char *who)
{
    gw_signin_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    self->broker = broker;
    self->verify = gw_verify_new (loop, 1);
    self->own_verify = true;
    self->who = strdup (who ? who : "");
    self->attempts = sbx_idmap_new ();
    if (!self->verify || !self->who || !self->attempts) {
        gw_signin_destroy (&self);
        return NULL;
    }
    self->next_handle = 1;
    return self;
}

void gw_signin_destroy (gw_signin_t **self_p)
{
    assert (self_p);
    gw_signin_t *self = *self_p;
    if (!self)
        return;
    if (self->attempts) {
        for (s_attempt_t *attempt = zhashx_first (self->attempts); attempt;
             attempt = zhashx_next (self->attempts))
            s_attempt_free (&attempt);
        zhashx_destroy (&self->attempts);
    }
    if (self->own_verify)
        gw_verify_destroy (&self->verify);
    free (self->who);
    free (self);
    *self_p = NULL;
}

//  --------------------------------------------------------------------------
//  Self test: answers that need no broker (tests/integration/test_oauth.py signs in on
//  both pages for real), and a password checked through the verifier.

typedef struct {
    int answers;
    int ticks;
    int status;
    char error[200];
    char account_id[64];
} s_probe_t;

static void s_probe (const char *account_id, const char *email, int status, const char *error,
                     void *arg)
{
    s_probe_t *probe = arg;
    probe->answers++;
    probe->status = status;
    snprintf (probe->error, sizeof probe->error, "%s", error ? error : "");
    snprintf (probe->account_id, sizeof probe->account_id, "%s", account_id ? account_id : "");
    assert (!account_id == !email);
}

//  Ends the loop once the probe is answered, or after 10 s (a bound, not a wait).
static int s_tick (zloop_t *loop, int timer_id, void *arg)
{
    (void) loop;
    (void) timer_id;
    s_probe_t *probe = arg;
    return probe->answers || ++probe->ticks > 2000 ? -1 : 0;
}

//  Feeds the broker's answer for email to a fresh attempt (its hash, or not_found when
//  hash is NULL), and waits for the verifier.
static void s_test_password_ex (gw_signin_t *signin, zloop_t *loop, const char *hash,
                                const char *password, bool disabled, s_probe_t *probe)
{
    s_attempt_t *attempt = calloc (1, sizeof *attempt);
    assert (attempt);
    *attempt = (s_attempt_t){.signin = signin,
                             .handle = signin->next_handle++,
                             .fn = s_probe,
                             .arg = probe,
                             .password = strdup (password),
                             .email = strdup ("a@example.com")};
    zhashx_insert (signin->attempts, (void *) (uintptr_t) attempt->handle, attempt);
    *probe = (s_probe_t){0};
    if (!hash)
        s_on_password (NULL, SBX_E_NOT_FOUND, "no such account", attempt);
    sbx_msg_t *reply = hash ? sbx_msg_new (SBX_MSG_OAUTH_PASSWORD_OK) : NULL;
    if (reply) {
        sbx_oauth_password_ok_t *ok = sbx_msg_oauth_password_ok (reply);
        sbx_str_set (&ok->account_id, "acct_1");
        sbx_str_set (&ok->email, "a@example.com");
        sbx_str_set (&ok->password_hash, hash);
        ok->disabled = disabled;
        s_on_password (reply, SBX_OK, NULL, attempt);
        sbx_msg_destroy (&reply);
    }
    int timer = zloop_timer (loop, 5, 0, s_tick, probe);
    zloop_start (loop);
    zloop_timer_end (loop, timer);
    assert (probe->answers == 1);
}

static void s_test_password (gw_signin_t *signin, zloop_t *loop, const char *hash,
                             const char *password, s_probe_t *probe)
{
    s_test_password_ex (signin, loop, hash, password, false, probe);
}

void gw_signin_test (bool verbose)
{
    (void) verbose;
    zloop_t *loop = zloop_new ();
    gw_broker_t *broker = gw_broker_new (NULL); //  no peer: requests fail unavailable
    gw_signin_t *signin = gw_signin_new (loop, broker, "test");
    assert (signin);
    s_probe_t probe = {0};
    //  A form without a password, or with an email too long to be one, is answered at once.
    assert (gw_signin_start (signin, "a@example.com", "", s_probe, &probe) == 0);
    assert (probe.answers == 1 && probe.status == 200);
    assert (streq (probe.error, "Type your email and password."));
    char email[300];
    memset (email, 'a', sizeof email - 1);
    email[sizeof email - 1] = 0;
    assert (gw_signin_start (signin, email, "pw", s_probe, &probe) == 0 && probe.answers == 2);
    //  No broker: unavailable, said on the sign-in page.
    probe = (s_probe_t){0};
    assert (gw_signin_start (signin, "a@example.com", "pw", s_probe, &probe) == 0);
    assert (probe.answers == 1 && probe.status == 503);
    assert (strstr (probe.error, "Signing in is not possible right now"));
    assert (zhashx_size (signin->attempts) == 0);
    //  The broker's hash, checked off the loop.
    char *hash = sbx_secret_password_hash ("correct horse");
    s_test_password (signin, loop, hash, "correct horse", &probe);
    assert (probe.status == 200 && !*probe.error && streq (probe.account_id, "acct_1"));
    s_test_password (signin, loop, hash, "wrong horse", &probe);
    assert (probe.status == 200 && streq (probe.error, S_WRONG) && !*probe.account_id);
    //  A disabled account: refused saying so, but only with the right password.
    s_test_password_ex (signin, loop, hash, "correct horse", true, &probe);
    assert (probe.status == 403 && streq (probe.error, S_DISABLED) && !*probe.account_id);
    s_test_password_ex (signin, loop, hash, "wrong horse", true, &probe);
    assert (probe.status == 200 && streq (probe.error, S_WRONG));
    //  An email the broker does not know: the same answer, after a dummy check.
    uint64_t checked_before, checked_after;
    gw_verify_counts (signin->verify, &checked_before, NULL);
    s_test_password (signin, loop, NULL, "correct horse", &probe);
    assert (probe.status == 200 && streq (probe.error, S_WRONG) && !*probe.account_id);
    gw_verify_counts (signin->verify, &checked_after, NULL);
    assert (checked_after == checked_before + 1);
    //  A shared verifier replaces the own one, and outlives the sign-in.
    gw_verify_t *shared = gw_verify_new (loop, 2);
    assert (shared);
    gw_signin_set_verify (signin, shared);
    s_test_password (signin, loop, hash, "correct horse", &probe);
    assert (probe.status == 200 && streq (probe.account_id, "acct_1"));
    gw_verify_counts (shared, &checked_after, NULL);
    assert (checked_after == 1);
    free (hash);
    gw_signin_cancel (signin, 0);
    gw_signin_destroy (&signin);
    gw_signin_destroy (&signin);
    gw_verify_destroy (&shared);
    gw_broker_destroy (&broker);
    zloop_destroy (&loop);
}
