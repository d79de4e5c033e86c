"""Webhooks end to end (issue 20, item 4): the real daemons under `sbx up`, one real
guest, and a real HTTP receiver in this test. A webhook gets the sandbox's created,
ready, stopped, resumed and deleted events, and a snapshot's saved and deleted, as signed
POSTs (the HMAC checked here); a
receiver that answers 500 gets retries with backoff, logged; sbx-hookd killed with
SIGKILL in the middle loses and doubles nothing; private addresses are refused at create
and at delivery without webhooks.allow_private."""
import hashlib
import hmac
import http.client
import http.server
import json
import os
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import unittest

from sbxtest import BIN, Sbx, binary, main, wait_for


class Receiver(http.server.ThreadingHTTPServer):
    """Records every POST: (time, path, headers, body). Paths in fail_before answer 500 to
    attempts (Sbx-Attempt) before that one; /down always does."""

    def __init__(self):
        self.lock = threading.Lock()
        self.got = []
        self.fail_before = {"/flaky": 3}
        super().__init__(("127.0.0.1", 0), Handler)

    def posts(self, path):
        with self.lock:
            return [g for g in self.got if g[1] == path]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        srv = self.server
        with srv.lock:
            srv.got.append((time.time(), self.path, dict(self.headers), body))
        attempt = int(self.headers.get("Sbx-Attempt", "0"))
        left = attempt < srv.fail_before.get(self.path, 0)
        status = 500 if left or self.path == "/down" else 200
        try:
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sender died before it read the answer (the test kills sbx-hookd)

    def log_message(self, *args):
        pass


def verify(secret, headers, body):
    """What a receiver does: the signature over "<t>.<body>", recent t."""
    parts = dict(p.split("=", 1) for p in headers["Sbx-Signature"].split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + body,
                        hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - int(parts["t"])) < 300


class WebhooksTest(unittest.TestCase):
    def setUp(self):
        self.rx = Receiver()
        threading.Thread(target=self.rx.serve_forever, daemon=True).start()
        self.addCleanup(self.rx.shutdown)
        self.base = f"http://127.0.0.1:{self.rx.server_address[1]}"
        self.s = Sbx(self, "webhooks", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "webhooks.allow_private": "true"})
        self.s.up()
        acc = self.s.cli_json("account", "create", "--email", "hooks@example.com")
        self.account, self.key = acc["account_id"], acc["api_key"]

    def req(self, method, path, body=None):
        ctx = ssl.create_default_context(cafile=self.s.status()["ca_cert"])
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=ctx,
                                           timeout=120)
        h = {"Authorization": f"Bearer {self.key}"}
        if body is not None:
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=h)
            res = conn.getresponse()
            data = res.read()
        finally:
            conn.close()
        return res.status, json.loads(data) if data else None

    def deliveries(self, hook):
        status, answer = self.req("GET", f"/v1/webhooks/{hook}/deliveries")
        self.assertEqual(status, 200, answer)
        return answer["deliveries"]

    def test_webhooks(self):
        # -- create, over REST and the CLI ------------------------------------
        status, w1 = self.req("POST", "/v1/webhooks", {"url": self.base + "/ok"})
        self.assertEqual(status, 201, w1)
        self.assertTrue(w1["id"].startswith("wh_") and w1["secret"].startswith("whsec_"), w1)
        self.assertEqual((w1["events"], w1["delivered"], w1["pending"]), ([], 0, 0))
        status, w2 = self.req("POST", "/v1/webhooks", {"url": self.base + "/flaky",
                                                       "events": ["sandbox.ready"]})
        self.assertEqual(status, 201, w2)
        w3 = self.s.cli_json("webhook", "create", self.base + "/down", "--events",
                             "sandbox.deleted", "--account", self.account)
        self.assertIn("secret", w3)
        status, answer = self.req("POST", "/v1/webhooks", {"url": self.base, "events": ["nope"]})
        self.assertEqual((status, answer["error"]["code"]), (400, "invalid_argument"), answer)
        status, listed = self.req("GET", "/v1/webhooks")
        self.assertEqual([h["id"] for h in listed["webhooks"]], [w1["id"], w2["id"], w3["id"]])
        self.assertNotIn("secret", json.dumps(listed))

        # -- a sandbox's life; sbx-hookd killed on the way ---------------------
        status, sb = self.req("POST", "/v1/sandboxes", {})
        self.assertEqual(status, 201, sb)
        ok = lambda: [json.loads(p[3])["type"] for p in self.rx.posts("/ok")]
        wait_for(lambda: ok() == ["sandbox.created", "sandbox.ready"], 10, "created and ready")
        wait_for(lambda: self.deliveries(w1["id"])[0]["state"] == "delivered", 10, "recorded")
        # hookd dies right after /flaky's first attempt reached the receiver: after it read
        # the 500 (the retry is due in 1 s), or before (that attempt is made again, under
        # the same number, when hookd is back).
        wait_for(lambda: self.rx.posts("/flaky"), 10, "the first attempt to /flaky")
        pid = self.s.daemon_pid("sbx-hookd")
        os.kill(pid, signal.SIGKILL)
        # Events committed while it is down are replayed from its saved place.
        self.assertEqual(self.req("POST", f"/v1/sandboxes/{sb['id']}/stop")[0], 200)
        wait_for(lambda: self.s.daemon_pid("sbx-hookd") not in (None, pid), 20, "a new sbx-hookd")
        self.assertEqual(self.req("POST", f"/v1/sandboxes/{sb['id']}/resume")[0], 200)
        status, snap = self.req("POST", f"/v1/sandboxes/{sb['id']}/snapshots", {"name": "hooked"})
        self.assertEqual(status, 201, snap)
        self.assertEqual(self.req("DELETE", f"/v1/snapshots/{snap['id']}")[0], 200)
        self.assertEqual(self.req("DELETE", f"/v1/sandboxes/{sb['id']}")[0], 200)
        want = ["sandbox.created", "sandbox.ready", "sandbox.stopped", "sandbox.resumed",
                "snapshot.saved", "snapshot.deleted", "sandbox.deleted"]
        # In the log's order: /ok never fails, so its deliveries go one at a time, even
        # the ones that were due together after the restart (stopped, then resumed).
        wait_for(lambda: ok() == want, 30, lambda: f"all seven events in order (got {ok()})")

        # Every delivery signed with W1's secret, its event id that of the body, no
        # event twice (a restart doubles nothing), in the log's order.
        posts = self.rx.posts("/ok")
        ids = [p[2]["Sbx-Event-Id"] for p in posts]
        self.assertEqual(len(set(ids)), 7, ids)
        seqs = [int(i.split("_")[1]) for i in ids]
        self.assertEqual(seqs, sorted(seqs))
        for _, _, headers, body in posts:
            self.assertTrue(verify(w1["secret"], headers, body), headers)
            self.assertFalse(verify(w2["secret"], headers, body))
            event = json.loads(body)
            self.assertEqual(event["id"], headers["Sbx-Event-Id"])
            self.assertEqual(headers["Content-Type"], "application/json")
            self.assertEqual((event["accountId"], event["data"]["sandboxId"]),
                             (self.account, sb["id"]))
        self.assertEqual(json.loads(posts[3][3])["data"]["previousState"], "resuming")
        saved = json.loads(posts[4][3])["data"]
        self.assertEqual((saved["snapshotId"], saved["name"]), (snap["id"], "hooked"))
        self.assertEqual(json.loads(posts[5][3])["data"]["snapshotId"], snap["id"])

        # /flaky: two 500s, then 200, retried 1 s then 2 s later, all one event.
        wait_for(lambda: self.deliveries(w2["id"])[0]["state"] == "delivered", 15, "the retry")
        flaky = self.rx.posts("/flaky")
        self.assertEqual({p[2]["Sbx-Event-Id"] for p in flaky}, {ids[1]})
        first = {}  # attempt → when it first arrived
        for when, _, headers, _ in flaky:
            first.setdefault(int(headers["Sbx-Attempt"]), when)
        self.assertEqual(sorted(first), [1, 2, 3], [p[2]["Sbx-Attempt"] for p in flaky])
        self.assertGreaterEqual(first[2] - first[1], 0.9)
        self.assertGreaterEqual(first[3] - first[2], 1.9)
        log = self.deliveries(w2["id"])
        self.assertEqual(len(log), 1, log)
        self.assertEqual((log[0]["eventId"], log[0]["eventType"], log[0]["statusCode"]),
                         (ids[1], "sandbox.ready", 200))
        self.assertEqual(log[0]["attempts"], 3)
        for p in flaky:
            self.assertTrue(verify(w2["secret"], p[2], p[3]))
        status, got = self.req("GET", f"/v1/webhooks/{w1['id']}")
        self.assertEqual((got["delivered"], got["failed"], got["pending"]), (7, 0, 0), got)
        # The operator's view of the same log, and the API key's through the REST API.
        cli_log = self.s.cli_json("webhook", "deliveries", w2["id"])
        self.assertEqual(cli_log["deliveries"], log)
        st = self.s.status()
        home = tempfile.mkdtemp(prefix="sbxtest-hooks-home-")
        self.addCleanup(subprocess.run, ["rm", "-rf", home])
        env = {"HOME": home, "PATH": os.environ["PATH"], "SBX_URL": st["mcp_url"][:-len("/mcp")],
               "SBX_API_KEY": self.key, "SBX_CA_CERT": st["ca_cert"]}
        remote = lambda *a: subprocess.run([binary("sbx"), "webhook", *a], env=env,
                                           capture_output=True, text=True, timeout=60)
        res = remote("deliveries", w2["id"], "--json")
        self.assertEqual((res.returncode, json.loads(res.stdout or "{}")), (0, {"deliveries": log}),
                         res.stderr)
        res = remote("create", "https://hooks.example/cli", "--events", "sandbox.error", "--json")
        made = json.loads(res.stdout)
        self.assertEqual((made["url"], made["events"]), ("https://hooks.example/cli", ["sandbox.error"]))
        res = remote("list")
        self.assertIn(made["id"], res.stdout)
        self.assertIn("https://hooks.example/cli", res.stdout)
        self.assertEqual(remote("delete", made["id"]).stdout, f"webhook {made['id']} deleted\n")
        res = remote("create", "https://hooks.example/x", "--events", "sandbox.nope")
        self.assertEqual(res.returncode, 1)
        self.assertIn("unknown event type 'sandbox.nope'", res.stderr)

        # -- private addresses without webhooks.allow_private -------------------
        # /down failed its first attempt of the delete event; its next one comes after the
        # restart, with the setting off: refused at connect.
        wait_for(lambda: self.rx.posts("/down"), 10, "the first attempt to /down")
        self.s.stop()
        conf = os.path.join(self.s.dir, "sbx.conf")
        with open(conf) as f:
            text = f.read().replace("webhooks.allow_private = true", "webhooks.allow_private = false")
        with open(conf, "w") as f:
            f.write(text)
        downs = len(self.rx.posts("/down"))
        self.s.up()
        status, answer = self.req("POST", "/v1/webhooks", {"url": self.base + "/x"})
        self.assertEqual((status, answer["error"]["code"]), (400, "invalid_argument"), answer)
        self.assertIn("private or loopback", answer["error"]["message"])
        self.assertIn("webhooks.allow_private", answer["error"]["message"])
        for url in ("http://localhost:1/", "http://[::1]/", "http://169.254.169.254/", "ftp://x.example/"):
            self.assertEqual(self.req("POST", "/v1/webhooks", {"url": url})[0], 400, url)
        wait_for(lambda: "private or loopback" in (self.deliveries(w3["id"])[0]["lastError"] or ""),
                 20, "the refused attempt")
        self.assertEqual(len(self.rx.posts("/down")), downs)
        # Deleting ends it; another account sees none of it.
        self.assertEqual(self.req("DELETE", f"/v1/webhooks/{w3['id']}"), (200, {"id": w3["id"],
                                                                             "deleted": True}))
        self.assertEqual(self.req("GET", f"/v1/webhooks/{w3['id']}")[0], 404)
        self.key = self.s.cli_json("account", "create", "--email", "other@example.com")["api_key"]
        self.assertEqual(self.req("GET", f"/v1/webhooks/{w1['id']}")[0], 404)
        self.assertEqual(self.req("GET", "/v1/webhooks"), (200, {"webhooks": []}))
        # A deleted account's webhooks go with it.
        self.s.cli_json("account", "delete", "hooks@example.com")
        wait_for(lambda: self.s.cli_json("webhook", "list", "--account", self.account)["webhooks"]
                 == [], 10, "the account's webhooks deleted")


if __name__ == "__main__":
    main()
