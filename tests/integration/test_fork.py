"""fork_sandbox (issue 19, item 3) with real daemons and real guests under `sbx up`.

A sandbox runs a process (a counter it rewrites five times a second, and an HTTP server)
and has a file written; two copies through MCP, one through REST and one through the
CLI. In each copy the process runs on, the file is there, and it has its own hostname
(its label, in /etc/hostname too), its own MAC address (and its HTTP server answers
through the port proxy at that address), its own random state; the source runs on,
unchanged, paused for a moment only; the copies bill on their own (the account's usage
lists them, running). The capture they stand on is nobody's to manage: not listed, and
gone with the last copy. Refusals with their codes, nothing left behind: count 0 and 11,
a stopped, a deleted and another account's sandbox, a read-only key, and a plan whose
running limit cannot take count more."""
import json
import os
import time

from sbxtest import BIN, TICK_SH, SandboxTest, Sbx, main, mcp_session, wait_for


class ForkTest(SandboxTest):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "fork", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "plan.tight.running": "2"})
        cls.s.up()
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        b = cls.s.cli_json("account", "create", "--email", "bob@example.com")
        t = cls.s.cli_json("account", "create", "--email", "tight@example.com",
                           "--plan", "tight")
        cls.key, cls.key_b, cls.key_tight = a["api_key"], b["api_key"], t["api_key"]
        cls.account = a["account_id"]
        cls.key_ro = cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                    "--preset", "read-only")["key"]

    def rest(self, method, path, body=None, key=None):
        status, _, raw = self.s.https(method, path, body=json.dumps(body) if body is not None
                                      else None, timeout=400,
                                      headers={"Authorization": f"Bearer {key or self.key}",
                                               "Content-Type": "application/json"})
        return status, json.loads(raw) if raw else None

    def port_answers(self, sid, sandbox, label):
        """Its HTTP server (started in the source, before the fork) answers through the
        port proxy: the host reaches the guest at its MAC address."""
        self.call(sid, "host_port", {"sandboxId": sandbox, "port": 8000, "public": True})
        host = f"{label}-8000.box.localhost"

        def answers():
            try:
                status, _, body = self.s.https("GET", "/hello.txt", headers={"Host": host},
                                               timeout=30)
                return status == 200 and body == b"served by the source\n"
            except OSError:
                return False
        wait_for(answers, 60, f"{host} to answer")

    def identity(self, sid, sandbox):
        return {"hostname": self.sh(sid, sandbox, "hostname"),
                "etc": self.sh(sid, sandbox, "cat /etc/hostname"),
                "mac": self.sh(sid, sandbox, "cat /sys/class/net/eth0/address"),
                "uuid": self.sh(sid, sandbox, "cat /proc/sys/kernel/random/uuid"),
                "random": self.sh(sid, sandbox, "head -c16 /dev/urandom | od -An -tx1")}

    def fork_snapshots(self):
        """The captures in the store: what snapshotd keeps of forks (kind fork)."""
        listed = self.s.cli_json("snapshot", "list")["snapshots"]
        return {x["id"] for x in listed if x.get("kind") == "fork"}

    def test_fork(self):
        sid = mcp_session(self.s, self.key)
        r, _ = self.call(sid, "create_sandbox", {"name": "source", "labels": {"team": "web"}})
        src = r["structuredContent"]
        a = src["id"]
        self.call(sid, "write_file", {"sandboxId": a, "path": "/root/tick.sh",
                                      "content": TICK_SH})
        self.call(sid, "write_file", {"sandboxId": a, "path": "/root/data.txt",
                                      "content": "written before the fork\n"})
        self.call(sid, "write_file", {"sandboxId": a, "path": "/root/www/hello.txt",
                                      "content": "served by the source\n"})
        self.call(sid, "exec", {"sandboxId": a, "command": "sh /root/tick.sh",
                                "detached": True})
        self.call(sid, "exec", {"sandboxId": a, "detached": True,
                                "command": "cd /root/www && exec python3 -m http.server 8000"})
        # Listening (port 8000 is 1F40 in /proc/net/tcp; guest Python starts slowly).
        wait_for(lambda: ":1F40 " in self.sh(sid, a, "cat /proc/net/tcp"), 120,
                 "the server to listen")
        self.counter_moves(sid, a)
        before = self.identity(sid, a)
        procs = self.sh(sid, a, "pgrep -f 'tick[.]sh' | wc -l")
        self.assertNotEqual(procs, "0")

        # Two copies through MCP: the answer lists them, ready; the source was paused
        # for a moment only.
        started = time.monotonic()
        r, text = self.call(sid, "fork_sandbox", {"sandboxId": a, "count": 2})
        took = time.monotonic() - started
        fork = r["structuredContent"]
        print(f"  fork of 2: {took:.2f} s, source paused {fork['pausedMs']} ms, capture "
              f"{fork['captureMs']} ms")
        self.assertRegex(text, rf"^Made 2 copies of {a} with its memory")
        self.assertIn(f"the default sandbox is still {a}", text)
        self.assertEqual(fork["sourceId"], a)
        copies = fork["sandboxes"]
        self.assertEqual(len(copies), 2)
        self.assertLess(fork["pausedMs"], 5000)
        self.assertLessEqual(fork["pausedMs"], fork["captureMs"])
        for c in copies:
            self.assertEqual(c["state"], "ready")
            self.assertNotEqual(c["id"], a)
            self.assertEqual(c["labels"], {"team": "web"})
            self.assertEqual(c["name"], c["label"])
            self.assertIn(f"{c['id']}  {c['label']}  {c['url']}", text)
        self.assertNotEqual(copies[0]["id"], copies[1]["id"])

        # Each copy: the process runs on, the file is there, an identity of its own.
        seen = [before]
        for c in copies:
            cid = c["id"]
            self.assertEqual(self.sh(sid, cid, "cat /root/data.txt"), "written before the fork")
            self.assertEqual(self.sh(sid, cid, "pgrep -f 'tick[.]sh' | wc -l"), procs)
            self.counter_moves(sid, cid)
            me = self.identity(sid, cid)
            self.assertEqual(me["hostname"], c["label"])
            self.assertEqual(me["etc"], c["label"])
            self.assertRegex(me["mac"], r"^52:54:00:[0-9a-f]{2}:[0-9a-f]{2}:[0-9a-f]{2}$")
            for other in seen:
                for what in ("hostname", "mac", "uuid", "random"):
                    self.assertNotEqual(me[what], other[what], f"{cid} shares its {what}")
            seen.append(me)
            self.port_answers(sid, cid, c["label"])
        # The source runs on, as it was.
        self.counter_moves(sid, a)
        now = self.identity(sid, a)
        for what in ("hostname", "etc", "mac"):
            self.assertEqual(now[what], before[what])
        self.assertEqual(self.sh(sid, a, "cat /root/data.txt"), "written before the fork")
        # The session's default is still the source.
        r, _ = self.call(sid, "exec", {"command": "hostname"})
        self.assertEqual(r["structuredContent"]["stdout"].strip(), before["hostname"])

        # The copies bill on their own: the account's usage lists them, running.
        def billed():
            status, usage = self.rest("GET", "/v1/usage")
            self.assertEqual(status, 200, usage)
            got = {x["id"]: x for x in usage["sandboxes"]}
            return all(c["id"] in got and got[c["id"]]["running"] for c in copies) and got
        got = wait_for(billed, 30, "billing to meter the copies")
        self.assertIn(a, got)
        r, text = self.call(sid, "get_sandbox", {"sandboxId": copies[0]["id"]})
        self.assertIn("runningSeconds", r["structuredContent"])

        # The capture they stand on: not the user's to list, kept while they live.
        capture = fork["snapshotId"]
        r, _ = self.call(sid, "list_snapshots")
        self.assertNotIn(capture, [x["id"] for x in r["structuredContent"]["snapshots"]])
        self.assertIn(capture, self.fork_snapshots())
        self.assertTrue(os.path.isdir(os.path.join(self.s.dir, "snapshots", capture)))

        # One copy through REST, one through the CLI (an operator, on the host).
        status, body = self.rest("POST", f"/v1/sandboxes/{a}/fork", {"count": 1})
        self.assertEqual(status, 201, body)
        self.assertEqual(body["sourceId"], a)
        self.assertEqual([c["state"] for c in body["sandboxes"]], ["ready"])
        rest_copy = body["sandboxes"][0]["id"]
        self.assertEqual(self.sh(sid, rest_copy, "cat /root/data.txt"), "written before the fork")
        cli = self.s.cli_json("sandbox", "fork", a, "--count", "1", timeout=400)
        self.assertEqual(cli["sourceId"], a)
        cli_copy = cli["sandboxes"][0]
        self.assertEqual(cli_copy["account"], self.account)
        self.assertEqual(self.sh(sid, cli_copy["id"], "cat /root/data.txt"),
                         "written before the fork")
        self.counter_moves(sid, cli_copy["id"])

        # Deleting the copies takes their captures along; the source lives on.
        captures = self.fork_snapshots()
        self.assertEqual(len(captures), 3)
        for c in copies + [{"id": rest_copy}, cli_copy]:
            self.call(sid, "delete_sandbox", {"sandboxId": c["id"]})
        wait_for(lambda: not self.fork_snapshots(), 60, "the captures to go")
        for c in captures:
            self.assertFalse(os.path.exists(os.path.join(self.s.dir, "snapshots", c)))
        self.counter_moves(sid, a)
        self.call(sid, "delete_sandbox", {"sandboxId": a})

    def test_refusals(self):
        sid = mcp_session(self.s, self.key)
        r, _ = self.call(sid, "create_sandbox", {"name": "refused"})
        a = r["structuredContent"]["id"]
        captures = self.fork_snapshots()
        listed = len(self.call(sid, "list_sandboxes")[0]["structuredContent"]["sandboxes"])

        for count in (0, 11):
            r, text = self.call(sid, "fork_sandbox", {"sandboxId": a, "count": count}, ok=False)
            self.assertTrue(r.get("isError"))
            self.assertIn("count must be between 1 and 10 (invalid_argument)", text)
            status, body = self.rest("POST", f"/v1/sandboxes/{a}/fork", {"count": count})
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["code"], "invalid_argument")
        # Another account's is not there; a read-only key may not make sandboxes.
        sid_b = mcp_session(self.s, self.key_b)
        r, text = self.call(sid_b, "fork_sandbox", {"sandboxId": a}, ok=False, key=self.key_b)
        self.assertIn("(not_found)", text)
        status, body = self.rest("POST", f"/v1/sandboxes/{a}/fork", {}, key=self.key_b)
        self.assertEqual((status, body["error"]["code"]), (404, "not_found"))
        status, body = self.rest("POST", f"/v1/sandboxes/{a}/fork", {}, key=self.key_ro)
        self.assertEqual((status, body["error"]["code"]), (403, "permission_denied"))
        # A stopped one: failed_precondition, saying how to go on.
        self.call(sid, "stop_sandbox", {"sandboxId": a})
        r, text = self.call(sid, "fork_sandbox", {"sandboxId": a}, ok=False)
        self.assertIn("it is stopped", text)
        self.assertIn("resume it first", text)
        self.assertIn("(failed_precondition)", text)
        status, body = self.rest("POST", f"/v1/sandboxes/{a}/fork", {"count": 1})
        self.assertEqual((status, body["error"]["code"]), (409, "failed_precondition"))
        # A deleted one is not there.
        self.call(sid, "delete_sandbox", {"sandboxId": a})
        r, text = self.call(sid, "fork_sandbox", {"sandboxId": a}, ok=False)
        self.assertIn("(not_found)", text)
        # The plan's running limit must take every copy: refused up front, all or nothing.
        sid_t = mcp_session(self.s, self.key_tight)
        r, _ = self.call(sid_t, "create_sandbox", {}, key=self.key_tight)
        t = r["structuredContent"]["id"]
        r, text = self.call(sid_t, "fork_sandbox", {"count": 2}, ok=False, key=self.key_tight)
        self.assertIn("the tight plan allows 2 running sandboxes at once and 1 is running, "
                      "so 2 more do not fit", text)
        self.assertIn("(limit_exceeded)", text)
        status, body = self.rest("POST", f"/v1/sandboxes/{t}/fork", {"count": 2},
                                 key=self.key_tight)
        self.assertEqual((status, body["error"]["code"]), (429, "limit_exceeded"))
        r, _ = self.call(sid_t, "list_sandboxes", key=self.key_tight)
        self.assertEqual([x["id"] for x in r["structuredContent"]["sandboxes"]], [t])
        # Nothing was left behind by any of it.
        self.assertEqual(self.fork_snapshots(), captures)
        r, _ = self.call(sid, "list_sandboxes")
        self.assertEqual(len(r["structuredContent"]["sandboxes"]), listed - 1)
        self.call(sid_t, "delete_sandbox", {"sandboxId": t}, key=self.key_tight)


if __name__ == "__main__":
    main()
