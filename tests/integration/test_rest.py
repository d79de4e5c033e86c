"""The /v1 REST API end to end (issue 4, item 6): the real gateway, broker, vmd and a real
guest under `sbx up`, over HTTPS with the local CA. Plain http.client, no SDK: what a
program in any language would send."""
import http.client
import json
import os
import signal
import ssl
import subprocess
import time
import unittest

from sbxtest import BIN, Sbx, main, mcp_call, mcp_post, mcp_session, wait_for

ROUTES = {
    "/v1/openapi.json": {"get"},
    "/v1/sandboxes": {"get", "post"},
    "/v1/sandboxes/{sandboxId}": {"get", "patch", "delete"},
    "/v1/sandboxes/{sandboxId}/metrics": {"get"},
    "/v1/sandboxes/{sandboxId}/stop": {"post"},
    "/v1/sandboxes/{sandboxId}/resume": {"post"},
    "/v1/sandboxes/{sandboxId}/extend": {"post"},
    "/v1/sandboxes/{sandboxId}/fork": {"post"},
    "/v1/sandboxes/{sandboxId}/exec": {"post"},
    "/v1/sandboxes/{sandboxId}/processes": {"get"},
    "/v1/sandboxes/{sandboxId}/terminal": {"get"},
    "/v1/sandboxes/{sandboxId}/processes/{processId}": {"get"},
    "/v1/sandboxes/{sandboxId}/processes/{processId}/kill": {"post"},
    "/v1/sandboxes/{sandboxId}/files": {"get", "put"},
    "/v1/usage": {"get"},
    "/v1/keys": {"get"},
    "/v1/keys/{keyId}": {"delete"},
    "/v1/webhooks": {"get", "post"},
    "/v1/webhooks/{webhookId}": {"get", "delete"},
    "/v1/webhooks/{webhookId}/deliveries": {"get"},
    "/v1/sandboxes/{sandboxId}/snapshots": {"post"},
    "/v1/snapshots": {"get"},
    "/v1/snapshots/{snapshotId}": {"get", "delete"},
    "/v1/sandboxes/{sandboxId}/ports": {"post"},
    "/v1/sandboxes/{sandboxId}/ports/{port}": {"delete"},
    "/v1/templates": {"get", "post"},
    "/v1/templates/builds/{buildId}": {"get"},
}


class RestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Guests sampled every second (5 s by default): test_metrics waits for a few.
        cls.s = Sbx(cls, "rest", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image")), "vmd.metrics_interval_ms": 1000})
        cls.s.up()
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        b = cls.s.cli_json("account", "create", "--email", "bob@example.com")
        cls.key_a, cls.key_b = a["api_key"], b["api_key"]
        cls.key_ro = cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                    "--preset", "read-only")["key"]
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def req(self, method, path, body=None, key="a", headers=None, raw=False):
        """One request; body is JSON unless bytes. Returns status, headers, parsed body."""
        h = dict(headers or {})
        key = {"a": self.key_a, "b": self.key_b, "ro": self.key_ro}.get(key, key)
        if key:
            h["Authorization"] = f"Bearer {key}"
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=self.ctx,
                                           timeout=300)
        try:
            conn.request(method, path, body=body, headers=h)
            res = conn.getresponse()
            data = res.read()
            hdrs = {k.lower(): v for k, v in res.getheaders()}
        finally:
            conn.close()
        # The plan allows 20 requests a second and this test makes them back to back: like
        # any client, wait as told and try again (test_rates covers the limit itself).
        if res.status == 429 and "retry-after" in hdrs:
            time.sleep(float(hdrs["retry-after"]))
            return self.req(method, path, body, key, headers, raw)
        if raw:
            return res.status, hdrs, data
        return res.status, hdrs, json.loads(data) if data else None

    def assertError(self, answer, status, code, message=None):
        self.assertEqual(answer[0], status, answer)
        self.assertEqual(answer[1]["content-type"], "application/json")
        self.assertEqual(answer[2]["error"]["code"], code, answer)
        if message is not None:
            self.assertEqual(answer[2]["error"]["message"], message)

    # -- no sandbox needed -----------------------------------------------------
    def test_openapi(self):
        status, hdrs, doc = self.req("GET", "/v1/openapi.json", key=None)
        self.assertEqual(status, 200)
        self.assertEqual(hdrs["content-type"], "application/json")
        self.assertTrue(doc["openapi"].startswith("3.1"))
        served = {p: {m for m in item if m != "parameters"} for p, item in doc["paths"].items()}
        self.assertEqual(served, ROUTES)
        # Served verbatim: the document in the repository, byte for byte.
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "openapi.json"),
                  "rb") as f:
            self.assertEqual(self.req("GET", "/v1/openapi.json", key=None, raw=True)[2], f.read())

    def test_auth_and_routing(self):
        for key in (None, "sbx_" + "x" * 43, "not-a-key"):
            answer = self.req("GET", "/v1/sandboxes", key=key)
            self.assertError(answer, 401, "unauthenticated")
            self.assertTrue(answer[1]["www-authenticate"].startswith("Bearer"))
        self.assertError(self.req("GET", "/v1/nothing"), 404, "not_found")
        self.assertError(self.req("GET", "/v1/sandboxes/sb_0000000000/nothing"), 404, "not_found")
        answer = self.req("DELETE", "/v1/sandboxes")
        self.assertEqual(answer[0], 405)
        self.assertEqual(answer[1]["allow"], "GET, POST")
        self.assertEqual(answer[2]["error"]["code"], "method_not_allowed")
        self.assertEqual(self.req("GET", "/v1/sandboxes/sb_x/exec")[1]["allow"], "POST")
        # Bad bodies name what is wrong.
        answer = self.req("POST", "/v1/sandboxes", b"{not json",
                          headers={"Content-Type": "application/json"})
        self.assertError(answer, 400, "invalid_argument")
        self.assertIn("not valid JSON", answer[2]["error"]["message"])
        self.assertError(self.req("POST", "/v1/sandboxes", {"ttl": 60}), 400, "invalid_argument",
                         'unknown field "ttl" (this operation takes: name, type, ttlSeconds, '
                         'snapshotId, template, labels, network, autoResume, egress)')
        self.assertError(self.req("POST", "/v1/sandboxes", {"ttlSeconds": "x"}), 400,
                         "invalid_argument", "ttlSeconds must be an integer")
        self.assertError(self.req("POST", "/v1/sandboxes", [1]), 400, "invalid_argument",
                         "the body must be a JSON object")
        # Unknown sandboxes are 404 with the broker's message; a read-only key may not POST.
        self.assertError(self.req("GET", "/v1/sandboxes/sb_0000000000"), 404, "not_found",
                         "Sandbox not found")
        self.assertError(self.req("POST", "/v1/sandboxes", {}, key="ro"), 403,
                         "permission_denied",
                         "this key is read-only: it cannot use POST /v1/sandboxes")
        status, _, body = self.req("GET", "/v1/sandboxes", key="ro")
        self.assertEqual(status, 200)
        self.assertIsInstance(body["sandboxes"], list)

    def test_keys(self):
        """The account's own keys: listed by any of its keys, revoked by a full one only."""
        made = self.s.cli_json("key", "create", "--account", "alice@example.com",
                               "--preset", "full", "--name", "spare")
        status, _, body = self.req("GET", "/v1/keys", key="ro")
        self.assertEqual(status, 200, body)
        mine = {k["id"]: k for k in body["keys"]}
        self.assertEqual(mine[made["key_id"]]["name"], "spare")
        self.assertEqual(mine[made["key_id"]]["kind"], "api_key")
        self.assertEqual(mine[made["key_id"]]["preset"], "full")
        self.assertFalse(mine[made["key_id"]]["revoked"])
        self.assertRegex(mine[made["key_id"]]["createdAt"], r"^\d{4}-\d\d-\d\dT")
        self.assertNotIn(made["key"], json.dumps(body))  # secrets never come back
        # Another account's keys are not listed, and can't be revoked (not found).
        status, _, theirs = self.req("GET", "/v1/keys", key="b")
        self.assertFalse(set(mine) & {k["id"] for k in theirs["keys"]})
        self.assertError(self.req("DELETE", f"/v1/keys/{made['key_id']}", key="b"), 404,
                         "not_found")
        self.assertError(self.req("DELETE", f"/v1/keys/{made['key_id']}", key="ro"), 403,
                         "permission_denied",
                         "only a full key can revoke keys; this key's preset is narrower")
        status, _, body = self.req("DELETE", f"/v1/keys/{made['key_id']}")
        self.assertEqual((status, body), (200, {"id": made["key_id"], "revoked": True}))
        wait_for(lambda: self.req("GET", "/v1/sandboxes", key=made["key"])[0] == 401, 10,
                 "the revoked key refused")
        status, _, body = self.req("GET", "/v1/keys")
        self.assertTrue({k["id"]: k for k in body["keys"]}[made["key_id"]]["revoked"])

    # -- one real sandbox, start to end ----------------------------------------
    def test_reads_from_the_gateways_copy(self):
        """GET of a sandbox is answered from the gateway's copy (gw_cache), which every
        change drops: the gateway's own writes read back at once, changes made elsewhere
        (the CLI talks to the broker directly; vmd reports a dead guest) show up."""
        status, _, sb = self.req("POST", "/v1/sandboxes", {"name": "copy"})
        self.assertEqual(status, 201, sb)
        sid, path = sb["id"], f"/v1/sandboxes/{sb['id']}"

        def cache():
            return self.req("GET", "/healthz", key=None)[2]["read_cache"]

        def state():
            status, _, got = self.req("GET", path)
            self.assertEqual(status, 200, got)
            return got["state"]

        self.assertTrue(cache()["enabled"])
        before = cache()["hits"]
        self.assertEqual([state() for _ in range(4)], ["ready"] * 4)
        self.assertGreaterEqual(cache()["hits"] - before, 3)
        # Another account's key never reads it from the copy.
        self.assertError(self.req("GET", path, key="b"), 404, "not_found")

        # Its own writes: the next read shows them, no waiting.
        status, _, stopped = self.req("POST", f"{path}/stop")
        self.assertEqual(status, 200, stopped)
        self.assertEqual(state(), stopped["state"])
        self.assertEqual(state(), "stopped")

        # A change that does not pass through this gateway reaches the copy by the tap.
        self.s.cli_json("sandbox", "resume", sid, timeout=300)
        wait_for(lambda: state() == "ready", 10, "the resume seen through the gateway")
        self.assertEqual(self.req("PATCH", path, {"name": "renamed"})[0], 200)
        self.assertEqual(self.req("GET", path)[2]["name"], "renamed")

        # vmd reports a dead guest: the copy's "ready" goes.
        self.assertEqual(state(), "ready")
        pids = subprocess.run(["pgrep", "-f", f"qemu-system.*{os.path.realpath(self.s.dir)}"
                                              f"/vms/{sid}/"],
                              capture_output=True, text=True).stdout.split()
        self.assertEqual(len(pids), 1)
        os.kill(int(pids[0]), signal.SIGKILL)
        wait_for(lambda: state() == "error", 30, "the dead guest seen through the gateway")
        self.assertEqual(self.req("DELETE", path)[0], 200)
        self.assertError(self.req("GET", path), 404, "not_found")

    def test_sandbox(self):
        # A bad egress entry is refused before anything is made, naming it.
        self.assertError(self.req("POST", "/v1/sandboxes", {"egress": {"allow": ["ok.com", "a..b"]}}),
                         400, "invalid_argument",
                         'egress.allow[1] ("a..b"): a domain name has no empty label')
        self.assertError(self.req("POST", "/v1/sandboxes", {"egress": {"drop": []}}), 400,
                         "invalid_argument", 'unknown field "egress.drop" (egress takes: allow, deny)')
        status, hdrs, sb = self.req("POST", "/v1/sandboxes",
                                    {"name": "rest-demo", "labels": {"team": "a"},
                                     "egress": {"deny": ["2001:DB8::1/32", "198.51.100.7"]}})
        self.assertEqual(status, 201, sb)
        # Egress rules as they read: canonical, both lists there.
        self.assertEqual(sb["egress"], {"allow": [], "deny": ["2001:db8::/32", "198.51.100.7/32"]})
        sid = sb["id"]
        self.assertRegex(sid, r"^sb_[0-9a-z]{10}$")
        self.assertEqual(hdrs["location"], f"/v1/sandboxes/{sid}")
        self.assertEqual(sb["state"], "ready")
        self.assertEqual(sb["name"], "rest-demo")
        self.assertEqual(sb["labels"], {"team": "a"})
        self.assertTrue(sb["network"])
        self.assertTrue(sb["url"].startswith(f"https://{sb['label']}.box."))
        for field in ("type", "createdAt", "expiresAt"):
            self.assertIn(field, sb)
        base = f"/v1/sandboxes/{sid}"
        self.assertEqual(self.req("GET", base)[2]["egress"], sb["egress"])

        # Usage from billing: the new sandbox runs and costs, per the key's account.
        import time
        time.sleep(1.2)
        status, _, usage = self.req("GET", f"/v1/usage?sandboxId={sid}")
        self.assertEqual(status, 200, usage)
        self.assertRegex(usage["accountId"], r"^acc_")
        self.assertEqual([u["id"] for u in usage["sandboxes"]], [sid])
        self.assertTrue(usage["sandboxes"][0]["running"])
        self.assertGreaterEqual(usage["sandboxes"][0]["runningSeconds"], 1)
        self.assertEqual(usage["costMicroUsd"], usage["sandboxes"][0]["costMicroUsd"])
        self.assertEqual([(w["name"], w["active"]) for w in usage["wallets"]], [("main", True)])
        self.assertEqual(usage["wallets"][0]["balanceMicroUsd"], usage["balanceMicroUsd"])

        # Listed and got, by its owner only: another account is told it does not exist.
        ids = [x["id"] for x in self.req("GET", "/v1/sandboxes")[2]["sandboxes"]]
        self.assertIn(sid, ids)
        self.assertEqual(self.req("GET", base)[2]["id"], sid)
        self.assertError(self.req("GET", base, key="b"), 404, "not_found")
        self.assertError(self.req("POST", base + "/exec", {"command": "true"}, key="b"), 404,
                         "not_found")
        self.assertNotIn(sid, [x["id"] for x in self.req("GET", "/v1/sandboxes",
                                                         key="b")[2]["sandboxes"]])
        # A read-only key of the owner reads but can't run anything.
        self.assertEqual(self.req("GET", base, key="ro")[0], 200)
        self.assertError(self.req("POST", base + "/exec", {"command": "true"}, key="ro"), 403,
                         "permission_denied")
        self.assertError(self.req("DELETE", base, key="ro"), 403, "permission_denied")

        # exec in the foreground.
        status, _, out = self.req("POST", base + "/exec",
                                  {"command": "python3 -c 'print(2**100)'"})
        self.assertEqual(status, 200, out)
        self.assertEqual(out["exitCode"], 0)
        self.assertEqual(out["stdout"], "1267650600228229401496703205376\n")
        self.assertEqual(out["stderr"], "")
        self.assertFalse(out["timedOut"])
        self.assertEqual(out["stdoutNextOffset"], 32)
        self.assertIn("stderrNextOffset", out)
        status, _, out = self.req("POST", base + "/exec",
                                  {"command": "echo $GREETING; pwd; exit 3", "cwd": "/tmp",
                                   "env": {"GREETING": "hi"}})
        self.assertEqual((out["exitCode"], out["stdout"]), (3, "hi\n/tmp\n"))
        self.assertError(self.req("POST", base + "/exec", {}), 400, "invalid_argument",
                         "command is required")

        # Its output as Server-Sent Events: start, the pieces in order, then the exit;
        # stdin given as base64.
        status, hdrs, raw = self.req("POST", base + "/exec",
                                     {"command": "cat; echo err >&2; printf 'a\\nb'; exit 4",
                                      "stdin": "aW4K", "stdinEncoding": "base64"},
                                     headers={"Accept": "text/event-stream"}, raw=True)
        self.assertEqual((status, hdrs["content-type"]), (200, "text/event-stream"))
        events = []
        for block in raw.decode().strip().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            events.append((fields["event"], json.loads(fields["data"])))
        self.assertEqual(events[0][0], "start")
        pid = events[0][1]["processId"]
        self.assertEqual("".join(e[1]["text"] for e in events if e[0] == "stdout"), "in\na\nb")
        self.assertEqual("".join(e[1]["text"] for e in events if e[0] == "stderr"), "err\n")
        self.assertEqual(events[-1][0], "exit")
        self.assertEqual((events[-1][1]["processId"], events[-1][1]["exitCode"],
                          events[-1][1]["running"]), (pid, 4, False))
        # A refused one is a plain JSON error, as ever.
        self.assertError(self.req("POST", base + "/exec", {"command": "true", "timeout": 0},
                                  headers={"Accept": "text/event-stream"}), 400,
                         "invalid_argument")

        # Detached, then its status with offsets: only new output each time.
        status, _, started = self.req("POST", base + "/exec",
                                      {"command": "echo one; sleep 2; echo two", "detached": True})
        self.assertEqual(status, 202, started)
        pid = started["processId"]
        self.assertIsInstance(pid, int)
        status, _, st = self.req("GET", f"{base}/processes/{pid}")
        self.assertEqual(status, 200, st)
        seen, offset, err_offset = "", 0, 0
        for _ in range(100):
            st = self.req("GET", f"{base}/processes/{pid}?stdoutOffset={offset}"
                                 f"&stderrOffset={err_offset}")[2]
            seen += st["stdout"]
            offset, err_offset = st["stdoutNextOffset"], st["stderrNextOffset"]
            if not st["running"]:
                break
            self.assertIsNone(st["exitCode"])
            time.sleep(0.1)
        self.assertFalse(st["running"])
        self.assertEqual(st["exitCode"], 0)
        self.assertEqual(seen, "one\ntwo\n")
        last = self.req("GET", f"{base}/processes/{pid}?stdoutOffset={offset}")[2]
        self.assertEqual(last["stdout"], "")
        self.assertError(self.req("GET", f"{base}/processes/{pid}?stdoutOffset=-1"), 400,
                         "invalid_argument")
        # waitSeconds: held until there is output past the offset (or the end), not
        # answered empty at once; over 25 refused.
        pid = self.req("POST", base + "/exec", {"command": "sleep 1; echo late",
                                                "detached": True})[2]["processId"]
        st = self.req("GET", f"{base}/processes/{pid}?waitSeconds=20")[2]
        if st["stdout"] == "" and st["running"]:
            self.fail(f"waitSeconds answered with nothing new while the process ran: {st}")
        self.assertError(self.req("GET", f"{base}/processes/{pid}?waitSeconds=26"), 400,
                         "invalid_argument")
        # kill.
        pid = self.req("POST", base + "/exec", {"command": "sleep 300", "detached": True})[2][
            "processId"]
        status, _, killed = self.req("POST", f"{base}/processes/{pid}/kill", {"signal": "KILL"})
        self.assertEqual((status, killed), (200, {"processId": pid, "signal": 9}))
        for _ in range(50):
            st = self.req("GET", f"{base}/processes/{pid}")[2]
            if not st["running"]:
                break
            time.sleep(0.1)
        self.assertEqual(st["exitCode"], 137)
        # Every process, oldest first: the foreground ones, the detached one, the killed one.
        status, _, listed = self.req("GET", f"{base}/processes")
        self.assertEqual(status, 200, listed)
        last = listed["processes"][-1]
        self.assertEqual({k: last[k] for k in ("processId", "command", "running", "detached",
                                                "exitCode", "signal", "timedOut")},
                         {"processId": pid, "command": "sleep 300", "running": False,
                          "detached": True, "exitCode": 137, "signal": 9, "timedOut": False})
        self.assertRegex(last["startedAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertIn("echo one; sleep 2; echo two", [p["command"] for p in listed["processes"]])

        # Files: 1 MiB + a bit of random bytes up and back, byte for byte.
        blob = os.urandom(1024 * 1024 + 12345)
        status, _, put = self.req("PUT", base + "/files?path=/root/dir/blob.bin&mode=0600", blob,
                                  headers={"Content-Type": "application/octet-stream"})
        self.assertEqual((status, put), (200, {"path": "/root/dir/blob.bin", "size": len(blob)}))
        status, hdrs, back = self.req("GET", base + "/files?path=/root/dir/blob.bin", raw=True)
        self.assertEqual(status, 200)
        self.assertEqual(hdrs["content-type"], "application/octet-stream")
        # Over 1 MiB: streamed as the chunks come, its length said first (not chunked).
        self.assertEqual(hdrs.get("content-length"), str(len(blob)))
        self.assertNotIn("transfer-encoding", hdrs)
        self.assertEqual(len(back), len(blob))
        self.assertTrue(back == blob)
        out = self.req("POST", base + "/exec",
                       {"command": "stat -c %a /root/dir/blob.bin; sha256sum /root/dir/blob.bin"})
        import hashlib
        self.assertEqual(out[2]["stdout"].split()[0:2],
                         ["600", hashlib.sha256(blob).hexdigest()])
        # 12 MiB and a bit: more chunks than sbx_xfer keeps in flight (8), answered in
        # whatever order they come; the same bytes back.
        big = os.urandom(12 * 1024 * 1024 + 345)
        status, _, put = self.req("PUT", base + "/files?path=/root/big.bin", big,
                                  headers={"Content-Type": "application/octet-stream"})
        self.assertEqual((status, put), (200, {"path": "/root/big.bin", "size": len(big)}))
        status, _, back = self.req("GET", base + "/files?path=/root/big.bin", raw=True)
        self.assertEqual((status, len(back)), (200, len(big)))
        self.assertTrue(back == big)
        # A client that leaves a streamed download after its first bytes: the read is
        # dropped, and the gateway serves the same file whole next time.
        import socket
        with socket.create_connection(("localhost", self.s.listen_port()), timeout=30) as raw:
            with self.ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(f"GET {base}/files?path=/root/big.bin HTTP/1.1\r\n"
                            f"Host: localhost\r\nAuthorization: Bearer {self.key_a}\r\n\r\n"
                            .encode())
                head = tls.recv(4096)
                self.assertTrue(head.startswith(b"HTTP/1.1 200"), head[:200])
        status, _, back = self.req("GET", base + "/files?path=/root/big.bin", raw=True)
        self.assertEqual((status, len(back)), (200, len(big)))
        self.assertTrue(back == big)
        # A file whose size the guest does not know (/proc): sent whole, as read.
        status, hdrs, back = self.req("GET", base + "/files?path=/proc/self/mounts", raw=True)
        self.assertEqual(status, 200)
        self.assertIn(b" / ", back)
        out = self.req("POST", base + "/exec", {"command": "sha256sum /root/big.bin"})
        self.assertEqual(out[2]["stdout"].split()[0], hashlib.sha256(big).hexdigest())
        # A chunk that fails mid-transfer (a 3 MiB tmpfs fills up while later chunks are
        # in flight): a catalogued error that says why, and what stays is a prefix of the
        # file, never a file of its full size with a hole.
        out = self.req("POST", base + "/exec", {
            "command": "mkdir -p /mnt/small && mount -t tmpfs -o size=3m tmpfs /mnt/small"})
        self.assertEqual(out[2]["exitCode"], 0, out)
        answer = self.req("PUT", base + "/files?path=/mnt/small/f.bin", big[:8 * 1024 * 1024],
                          headers={"Content-Type": "application/octet-stream"})
        self.assertError(answer, 413, "too_large")
        self.assertIn("/mnt/small/f.bin", answer[2]["error"]["message"])
        self.assertIn("No space left", answer[2]["error"]["message"])
        out = self.req("POST", base + "/exec",
                       {"command": "stat -c %s /mnt/small/f.bin; sha256sum /mnt/small/f.bin"})
        size, digest = out[2]["stdout"].split()[0:2]
        self.assertLessEqual(int(size), 3 * 1024 * 1024)
        self.assertEqual(digest, hashlib.sha256(big[:int(size)]).hexdigest())
        self.assertEqual(self.req("PUT", base + "/files?path=/root/empty", b"")[2]["size"], 0)
        self.assertEqual(self.req("GET", base + "/files?path=/root/empty", raw=True)[2], b"")
        self.assertError(self.req("GET", base + "/files?path=/no/such/file"), 404, "not_found")
        self.assertError(self.req("GET", base + "/files"), 400, "invalid_argument")
        self.assertError(self.req("PUT", base + "/files?path=/root/x", b"x", key="ro"), 403,
                         "permission_denied")
        # Over the body limit: refused from the headers, before the body is sent.
        import socket
        with socket.create_connection(("localhost", self.s.listen_port()), timeout=30) as raw:
            with self.ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(f"PUT {base}/files?path=/root/big HTTP/1.1\r\nHost: localhost\r\n"
                            f"Authorization: Bearer {self.key_a}\r\n"
                            f"Content-Length: {16 * 1024 * 1024 + 1}\r\n\r\n".encode())
                head = b""
                while b"}}" not in head:
                    chunk = tls.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                head = head.decode(errors="replace")
        self.assertTrue(head.startswith("HTTP/1.1 413"), head)
        self.assertIn('"too_large"', head)

        # PATCH: rename, set and remove labels.
        status, _, sb = self.req("PATCH", base, {"name": "renamed", "labels": {"env": "ci"}})
        self.assertEqual(status, 200, sb)
        self.assertEqual((sb["name"], sb["labels"]), ("renamed", {"team": "a", "env": "ci"}))
        sb = self.req("PATCH", base, {"labels": {"team": None}})[2]
        self.assertEqual(sb["labels"], {"env": "ci"})
        self.assertError(self.req("PATCH", base, {}), 400, "invalid_argument")

        # extend.
        status, _, sb = self.req("POST", base + "/extend", {"ttlSeconds": 7200})
        self.assertEqual(status, 200, sb)
        self.assertGreater(sb["expiresAt"], self.req("GET", base)[2]["createdAt"])
        self.assertError(self.req("POST", base + "/extend", {"ttlSeconds": 1}), 400,
                         "invalid_argument")

        # stop: exec is then refused with 409; resume brings it back.
        status, _, sb = self.req("POST", base + "/stop")
        self.assertEqual((status, sb["state"]), (200, "stopped"), sb)
        self.assertError(self.req("POST", base + "/exec", {"command": "true"}), 409,
                         "failed_precondition")
        # Egress rules of a stopped sandbox: PATCH replaces both lists (one left out is
        # empty), a bad entry changes nothing, empty lists clear them.
        status, _, sb = self.req("PATCH", base, {"egress": {"allow": ["192.0.2.1", "203.0.113.0/24"]}})
        self.assertEqual(status, 200, sb)
        self.assertEqual(sb["egress"], {"allow": ["192.0.2.1/32", "203.0.113.0/24"], "deny": []})
        answer = self.req("PATCH", base, {"egress": {"deny": ["10.0.0.0/33"]}})
        self.assertError(answer, 400, "invalid_argument")
        self.assertTrue(answer[2]["error"]["message"].startswith('egress.deny[0] ("10.0.0.0/33"): '),
                        answer)
        self.assertError(self.req("PATCH", base, {"egress": {"allow": ["x.com"] * 65}}), 400,
                         "invalid_argument", "egress.allow has 65 entries; at most 64")
        self.assertEqual(self.req("GET", base)[2]["egress"]["allow"], ["192.0.2.1/32", "203.0.113.0/24"])
        listed = self.req("GET", "/v1/sandboxes")[2]["sandboxes"]
        self.assertEqual([x["egress"] for x in listed if x["id"] == sid], [sb["egress"]])
        # Domain names are kept in canonical form (lower case, no trailing dot).
        status, _, sb = self.req("PATCH", base, {"egress": {"deny": ["Ads.Example.COM."]}})
        self.assertEqual((status, sb["egress"]), (200, {"allow": [], "deny": ["ads.example.com"]}), sb)
        status, _, sb = self.req("PATCH", base, {"egress": {"allow": [], "deny": []}})
        self.assertEqual((status, sb.get("egress")), (200, {"allow": [], "deny": []}), sb)
        status, _, sb = self.req("POST", base + "/resume")
        self.assertEqual((status, sb.get("state")), (200, "ready"), sb)
        self.assertEqual(self.req("POST", base + "/exec", {"command": "echo back"})[2]["stdout"],
                         "back\n")

        # Another account can't delete it; the owner can, then it is gone.
        self.assertError(self.req("DELETE", base, key="b"), 404, "not_found")
        status, _, sb = self.req("DELETE", base)
        self.assertEqual(status, 200, sb)
        self.assertEqual(sb["id"], sid)
        self.assertIn(sb["state"], ("deleted", "deleting"))
        self.assertError(self.req("GET", base), 404, "not_found", "Sandbox not found")


    def test_pages(self):
        """GET /v1/sandboxes a page at a time (bob's, whom no other test gives sandboxes to
        keep): limit, cursor = nextCursor; what is created or deleted between pages neither
        repeats nor skips a sandbox there throughout; a bad cursor or limit is a 400."""
        made = []
        for i in range(3):
            status, _, sb = self.req("POST", "/v1/sandboxes", {"name": f"page-{i}"}, key="b")
            self.assertEqual(status, 201, sb)
            made.append(sb["id"])
        try:
            newest_first = made[::-1]
            status, _, page = self.req("GET", "/v1/sandboxes?limit=2", key="b")
            self.assertEqual(status, 200, page)
            self.assertEqual([x["id"] for x in page["sandboxes"]], newest_first[:2])
            cursor = page["nextCursor"]
            self.assertRegex(cursor, r"^[A-Za-z0-9_-]+$")  # opaque, URL-safe as it is
            # Between pages: the newest, already given, deleted; a newer one made.
            self.assertEqual(self.req("DELETE", f"/v1/sandboxes/{made[2]}", key="b")[0], 200)
            wait_for(lambda: self.req("GET", f"/v1/sandboxes/{made[2]}", key="b")[0] == 404, 60,
                     "the deleted sandbox gone from the list", interval=0.5)
            status, _, sb = self.req("POST", "/v1/sandboxes", {"name": "page-3"}, key="b")
            self.assertEqual(status, 201, sb)
            made.append(sb["id"])
            status, _, page = self.req("GET", f"/v1/sandboxes?limit=2&cursor={cursor}", key="b")
            self.assertEqual(status, 200, page)
            self.assertEqual([x["id"] for x in page["sandboxes"]], [made[0]])
            self.assertNotIn("nextCursor", page)
            # A fresh start sees the new one first; one a page, each once.
            seen, cursor = [], None
            while True:
                query = "limit=1" + (f"&cursor={cursor}" if cursor else "")
                page = self.req("GET", f"/v1/sandboxes?{query}", key="b")[2]
                seen += [x["id"] for x in page["sandboxes"]]
                cursor = page.get("nextCursor")
                if not cursor:
                    break
            self.assertEqual(seen, [made[3], made[1], made[0]])
            self.assertEqual([x["id"] for x in self.req("GET", "/v1/sandboxes", key="b")[2]
                              ["sandboxes"]], seen)  # limit's default, 100, holds them all
            # The CLI (the operator's, naming the account): every page by default, one
            # page with --limit, the next with --cursor; the command for it on stderr.
            bob = ("--account", "bob@example.com")
            self.assertEqual([x["id"] for x in self.s.cli_json("sandbox", "list", *bob)
                              ["sandboxes"]], seen)
            one = self.s.cli_json("sandbox", "list", *bob, "--limit", "2")
            self.assertEqual([x["id"] for x in one["sandboxes"]], seen[:2])
            rest = self.s.cli_json("sandbox", "list", *bob, "--limit", "2", "--cursor",
                                   one["nextCursor"])
            self.assertEqual(([x["id"] for x in rest["sandboxes"]], rest.get("nextCursor")),
                             (seen[2:], None))
            res = self.s.cli("sandbox", "list", *bob, "--limit", "1")
            self.assertEqual(len(res.stdout.splitlines()), 1, res.stdout)
            self.assertRegex(res.stderr, r"^more: sbx sandbox list --account bob@example.com "
                             r"--limit 1 --cursor [A-Za-z0-9_-]+\n$")
            res = self.s.cli("sandbox", "list", *bob, "--cursor", "nope", check=False)
            self.assertEqual(res.returncode, 1)
            self.assertIn("(invalid_argument)", res.stderr)
            # Refusals, catalogued, with what to do.
            bad = self.req("GET", "/v1/sandboxes?cursor=" + made[0], key="b")
            self.assertError(bad, 400, "invalid_argument")
            self.assertIn("pass an answer's nextCursor as it came", bad[2]["error"]["message"])
            self.assertError(self.req("GET", "/v1/sandboxes?cursor=" + "A" * 129, key="b"), 400,
                             "invalid_argument")
            for limit in ("0", "1001", "x", "-1"):
                self.assertError(self.req("GET", f"/v1/sandboxes?limit={limit}", key="b"), 400,
                                 "invalid_argument")
            # An empty cursor is none: the first page.
            page = self.req("GET", "/v1/sandboxes?limit=1&cursor=", key="b")[2]
            self.assertEqual([x["id"] for x in page["sandboxes"]], [made[3]])
        finally:
            for sid in made:
                self.req("DELETE", f"/v1/sandboxes/{sid}", key="b")

    def test_metrics(self):
        """get_sandbox_metrics on a real guest: CPU rises while it burns, the disk grows by
        a file written, memory is a guest's; REST, MCP (annotations, structuredContent,
        text) and `sbx sandbox top`; a stopped sandbox keeps its samples."""
        status, _, sb = self.req("POST", "/v1/sandboxes", {"name": "metrics"})
        self.assertEqual(status, 201, sb)
        sid = sb["id"]
        path = f"/v1/sandboxes/{sid}/metrics"

        def metrics(query="", key="a"):
            status, _, m = self.req("GET", path + query, key=key)
            self.assertEqual(status, 200, m)
            return m

        def samples_after(ms, count):
            m = metrics()
            return m if len([x for x in m["samples"] if x["timeMs"] > ms]) >= count else None

        idle = wait_for(lambda: samples_after(0, 2), 90, "two samples of the new guest")
        self.assertEqual((idle["sandboxId"], idle["state"], idle["vcpus"]), (sid, "ready", 1))
        self.assertEqual((idle["sampling"], idle["intervalSeconds"]), (True, 1))
        disk_before = idle["diskUsedBytes"]
        idle_cpu = max(x["cpuPercent"] for x in idle["samples"])

        # 64 MiB on the root disk, then a busy loop for 10 s in the background.
        r = self.req("POST", f"/v1/sandboxes/{sid}/exec",
                     {"command": "dd if=/dev/zero of=/root/big.bin bs=1M count=64 conv=fsync "
                                 "2>/dev/null && timeout 10 sh -c 'while :; do :; done'",
                      "detached": True})
        self.assertEqual(r[0], 202, r)
        started = idle["samples"][-1]["timeMs"]

        def busy():
            m = metrics()
            later = [x for x in m["samples"] if x["timeMs"] > started]
            grown = m["diskUsedBytes"] >= disk_before + 60 * 2**20
            hot = any(x["cpuPercent"] > idle_cpu and x["cpuPercent"] >= 50 for x in later)
            return m if grown and hot else None
        m = wait_for(busy, 120, "CPU to rise and the disk to grow by 64 MiB")
        print(f"\nidle CPU at most {idle_cpu}%, busy {max(x['cpuPercent'] for x in m['samples'])}"
              f"%; disk {disk_before} → {m['diskUsedBytes']}")
        # The figures are a guest's: 512 MiB small sandbox, a root disk, network counters.
        self.assertTrue(0 < m["memoryUsedBytes"] < m["memoryTotalBytes"] <= 512 * 2**20, m)
        self.assertGreater(m["memoryTotalBytes"], 256 * 2**20)
        self.assertTrue(0 < m["diskUsedBytes"] <= m["diskTotalBytes"], m)
        self.assertGreaterEqual(m["networkInBytes"], 0)
        times = [x["timeMs"] for x in m["samples"]]
        self.assertEqual(times, sorted(set(times)))
        self.assertTrue(all(0 <= x["cpuPercent"] <= 100 for x in m["samples"]))
        last = m["samples"][-1]
        self.assertEqual(m["sampledAt"], last["time"])
        for k in ("cpuPercent", "memoryUsedBytes", "diskUsedBytes", "networkOutBytes"):
            self.assertEqual(m[k], last[k])
        self.assertEqual(m["spanSeconds"], (times[-1] - times[0]) // 1000)
        # sinceMs and limit; a read-only key reads, another account is told it does not exist.
        self.assertTrue(all(x["timeMs"] > times[-2]
                            for x in metrics(f"?sinceMs={times[-2]}")["samples"]))
        self.assertEqual(len(metrics("?limit=1")["samples"]), 1)
        self.assertEqual(metrics(key="ro")["sandboxId"], sid)
        self.assertError(self.req("GET", path, key="b"), 404, "not_found")
        self.assertError(self.req("GET", path + "?limit=0"), 400, "invalid_argument")

        # MCP: the tool's annotations, its structuredContent (REST's shape) and its text.
        msid = mcp_session(self.s, self.key_a)
        _, _, listed = mcp_post(self.s, self.key_a, {"jsonrpc": "2.0", "id": 2,
                                                     "method": "tools/list"}, msid)
        tool = [x for x in listed["result"]["tools"] if x["name"] == "get_sandbox_metrics"][0]
        self.assertEqual(tool["annotations"], {"title": "Sandbox metrics", "readOnlyHint": True})
        r, text = mcp_call(self, self.s, self.key_a, msid, "get_sandbox_metrics",
                           {"sandboxId": sid})
        sc = r["structuredContent"]
        for k in ("cpuPercent", "memoryUsedBytes", "memoryTotalBytes", "diskUsedBytes",
                  "diskTotalBytes", "samples"):
            self.assertIn(k, sc)
        self.assertEqual(sc["sandboxId"], sid)
        self.assertRegex(text, rf"^Sandbox {sid} is ready\. CPU [0-9.]+%, memory [0-9.]+ MiB of "
                               r"[0-9.]+ MiB, disk [0-9.]+ [MG]iB of [0-9.]+ [MG]iB, network in "
                               r"[0-9.]+ [KMG]?i?B out [0-9.]+ [KMG]?i?B; \d+ samples over \d+ s, "
                               r"the latest at \d{4}-")

        # The CLI on the host: sbx sandbox top, as JSON and as lines.
        top = self.s.cli_json("sandbox", "top", sid, "--once")
        self.assertEqual(top["sandboxId"], sid)
        self.assertGreaterEqual(len(top["samples"]), 2)
        lines = self.s.cli("sandbox", "top", "--once").stdout
        self.assertRegex(lines, rf"{sid}  ready +CPU +[0-9.]+%  mem ")

        # A clean vmd restart keeps them (the guest's metrics.bin), and sampling goes on.
        before = metrics()["samples"]
        vmd = self.s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGTERM)
        wait_for(lambda: self.s.daemon_pid("sbx-vmd") not in (None, vmd) and
                 all(d["ready"] for d in self.s.status()["daemons"]), 60, "vmd restarted")

        def more():
            status, _, m = self.req("GET", path)
            return m if status == 200 and len(m["samples"]) > len(before) else None
        after = wait_for(more, 60, "samples after the vmd restart")
        self.assertEqual(after["samples"][:len(before)], before)

        # Stopped: not sampled, its samples kept; deleted: gone.
        kept = len(metrics()["samples"])
        status, _, sb = self.req("POST", f"/v1/sandboxes/{sid}/stop")
        self.assertEqual((status, sb["state"]), (200, "stopped"), sb)
        m = metrics()
        self.assertEqual(m["state"], "stopped")
        self.assertGreaterEqual(len(m["samples"]), kept)
        self.assertEqual(self.req("DELETE", f"/v1/sandboxes/{sid}")[0], 200)
        self.assertError(self.req("GET", path), 404, "not_found")


if __name__ == "__main__":
    main()
