"""/mcp end to end (issue 4): the real gateway, broker, vmd and guests under `sbx up`, over
HTTPS with the local CA. Raw JSON-RPC for the protocol's edges (401, sessions, versions,
errors), the tools on a real sandbox, and the official MCP TypeScript SDK as a client."""
import base64
import hashlib
import json
import os
import time
import unittest

from sbxtest import BIN, Sbx, main, reference_scenarios, run_sdk

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}}
NAMES = ["create_sandbox", "list_sandboxes", "get_sandbox", "get_sandbox_metrics", "exec",
         "command_status", "kill_command", "list_commands", "read_file", "write_file", "host_port",
         "stop_sandbox",
         "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox",
         "delete_sandbox", "save_snapshot", "list_snapshots", "delete_snapshot",
         "set_sandbox_egress", "fork_sandbox"]
READ_ONLY = {"list_sandboxes", "get_sandbox", "get_sandbox_metrics", "command_status",
             "list_commands", "read_file",
             "list_snapshots"}
DESTRUCTIVE = {"exec", "kill_command", "write_file", "delete_sandbox", "delete_snapshot"}
IDEMPOTENT = {"set_sandbox_egress"}
UNAUTHORIZED = ('{"error":{"code":-32001,"message":"Unauthorized: send Authorization: Bearer '
                '<sbx API key>, or sign in with OAuth."},"id":null,"jsonrpc":"2.0"}')


class McpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The image the build made (vmd's default path is being reworked meanwhile).
        cls.s = Sbx(cls, "mcp", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        b = cls.s.cli_json("account", "create", "--email", "bob@example.com")
        cls.key_a, cls.key_b = a["api_key"], b["api_key"]
        cls.key_ro = cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                    "--preset", "read-only")["key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- raw HTTP --------------------------------------------------------------
    def post(self, body, key=None, session=None, headers=None, method="POST"):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        if session:
            h["Mcp-Session-Id"] = session
        h.update(headers or {})
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        status, hdrs, raw = self.s.https(method, "/mcp", body=data, headers=h)
        hdrs = {k.lower(): v for k, v in hdrs.items()}
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        return status, hdrs, parsed, raw

    def stream(self, body, key, session, accept="application/json, text/event-stream"):
        """POSTs and reads the answer as it arrives: (status, headers, events), events as
        (seconds since the request, parsed JSON) for SSE, or one event for JSON."""
        import http.client
        import ssl
        ctx = ssl.create_default_context(cafile=self.s.status()["ca_cert"])
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=ctx,
                                           timeout=60)
        try:
            t0 = time.monotonic()
            conn.request("POST", "/mcp", body=json.dumps(body), headers={
                "Content-Type": "application/json", "Accept": accept,
                "Authorization": f"Bearer {key}", "Mcp-Session-Id": session})
            res = conn.getresponse()
            hdrs = {k.lower(): v for k, v in res.getheaders()}
            if not hdrs.get("content-type", "").startswith("text/event-stream"):
                return res.status, hdrs, [(time.monotonic() - t0, json.loads(res.read()))]
            events, kind, data = [], None, []
            while True:
                line = res.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if line == "":
                    if data:
                        self.assertEqual(kind, "message")
                        events.append((time.monotonic() - t0, json.loads("\n".join(data))))
                    kind, data = None, []
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
            return res.status, hdrs, events
        finally:
            conn.close()

    def session(self, key=None):
        status, hdrs, body, _ = self.post(INIT, key or self.key_a)
        self.assertEqual(status, 200, body)
        sid = hdrs["mcp-session-id"]
        status, _, _, _ = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                                    key or self.key_a, sid)
        self.assertEqual(status, 202)
        return sid

    def call(self, sid, tool, args=None, key=None, rid=7):
        status, _, body, _ = self.post(
            {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
             "params": {"name": tool, "arguments": args or {}}}, key or self.key_a, sid)
        self.assertEqual(status, 200, body)
        self.assertIn("result", body, body)
        r = body["result"]
        text = r["content"][0]["text"]
        print(f"  {tool} {json.dumps(args or {})[:120]} → {text[:200]!r}")
        return r, text

    # -- the protocol ----------------------------------------------------------
    def test_401(self):
        base = self.s.status()["mcp_url"][:-len("/mcp")]
        expected = (f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource/mcp",'
                    ' scope="sbx"')
        for key in (None, "sbx_" + "x" * 43, "not-even-a-key"):
            status, hdrs, _, raw = self.post(INIT, key)
            self.assertEqual(status, 401, key)
            self.assertEqual(hdrs["www-authenticate"], expected)
            self.assertEqual(raw.decode(), UNAUTHORIZED)
        self.assertNotIn("x" * 43, self.s.log("sbx-gateway"))

    def test_initialize_and_list(self):
        status, hdrs, body, _ = self.post(INIT, self.key_a)
        self.assertEqual(status, 200)
        self.assertRegex(hdrs["mcp-session-id"], r"^mcps_[A-Za-z0-9]{32}$")
        r = body["result"]
        self.assertEqual(r["protocolVersion"], "2025-06-18")
        self.assertEqual(r["serverInfo"]["name"], "sbx")
        self.assertEqual(r["serverInfo"]["title"], "sbx")
        self.assertEqual(r["capabilities"], {"tools": {"listChanged": False}})
        self.assertIn("create_sandbox", r["instructions"])
        for asked, answered in (("2025-03-26", "2025-03-26"), ("2025-11-25", "2025-11-25"),
                                ("2024-01-01", "2025-06-18")):
            init = json.loads(json.dumps(INIT))
            init["params"]["protocolVersion"] = asked
            self.assertEqual(self.post(init, self.key_a)[2]["result"]["protocolVersion"], answered)

        sid = self.session()
        status, _, body, _ = self.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                       self.key_a, sid,
                                       {"MCP-Protocol-Version": "2025-06-18"})
        self.assertEqual(status, 200)
        tools = body["result"]["tools"]
        self.assertEqual([t["name"] for t in tools], NAMES)
        # The annotations exactly: no hint missing, none extra (issue 20 item 5).
        for t in tools:
            a = dict(t["annotations"])
            want = {"readOnlyHint": t["name"] in READ_ONLY}
            if t["name"] not in READ_ONLY:
                want["destructiveHint"] = t["name"] in DESTRUCTIVE
            if t["name"] in IDEMPOTENT:
                want["idempotentHint"] = True
            self.assertEqual(a.pop("title", None), t.get("title"), t["name"])
            self.assertEqual(a, want, t["name"])
            self.assertEqual(t["inputSchema"]["type"], "object")
            self.assertEqual(t["outputSchema"]["type"], "object")

        # ping, unknown method, parse error, bad version header, unknown tool
        self.assertEqual(self.post({"jsonrpc": "2.0", "id": 3, "method": "ping"},
                                   self.key_a, sid)[2]["result"], {})
        status, _, body, _ = self.post({"jsonrpc": "2.0", "id": 4, "method": "nope/nothing"},
                                       self.key_a, sid)
        self.assertEqual(body["error"]["code"], -32601)
        status, _, body, _ = self.post(b"{not json", self.key_a, sid)
        self.assertEqual((status, body["error"]["code"]), (400, -32700))
        status, _, body, _ = self.post({"jsonrpc": "2.0", "id": 5, "method": "ping"}, self.key_a,
                                       sid, {"MCP-Protocol-Version": "1999-01-01"})
        self.assertEqual(status, 400)
        status, _, body, _ = self.post({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                        "params": {"name": "make_coffee"}}, self.key_a, sid)
        self.assertEqual(body["error"]["code"], -32602)
        # GET has no stream: 405. A foreign Origin: 403.
        self.assertEqual(self.post(None, self.key_a, sid, method="GET")[0], 405)
        self.assertEqual(self.post({"jsonrpc": "2.0", "id": 8, "method": "ping"}, self.key_a,
                                   sid, {"Origin": "https://evil.example"})[0], 403)

        # Another account can't use the session; DELETE ends it; then 404.
        self.assertEqual(self.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}, self.key_b,
                                   sid)[0], 404)
        self.assertEqual(self.post(None, self.key_a, sid, method="DELETE")[0], 200)
        status, _, body, _ = self.post({"jsonrpc": "2.0", "id": 10, "method": "tools/list"},
                                       self.key_a, sid)
        self.assertEqual(status, 404)
        self.assertEqual(self.post(None, self.key_a, sid, method="DELETE")[0], 404)

    def test_refusals_without_a_sandbox(self):
        sid = self.session()
        r, text = self.call(sid, "delete_sandbox", {})
        self.assertTrue(r["isError"])
        self.assertEqual(text, "sandboxId is required: the exact id (sb_…) of one sandbox; "
                               "delete_sandbox has no default")
        r, text = self.call(sid, "exec", {"command": "true"})
        self.assertTrue(r["isError"])
        self.assertIn("create_sandbox", text)
        r, text = self.call(sid, "host_port", {"port": 8000, "public": True})
        self.assertTrue(r["isError"])
        self.assertIn("create_sandbox", text)  # no sandbox to publish a port of yet
        r, text = self.call(sid, "get_sandbox", {"sandboxId": "sb_0000000000"})
        self.assertEqual(text, "Sandbox not found (not_found)")
        # Unknown arguments are refused, as REST refuses unknown fields (issue 14: one
        # definition, one policy), naming what the tool takes.
        r, text = self.call(sid, "list_sandboxes", {"x": 1})
        self.assertTrue(r["isError"])
        self.assertEqual(text, 'unknown argument "x" (list_sandboxes takes: limit, cursor) '
                               '(invalid_argument)')
        # A read-only key may read but not run anything.
        ro = self.session(self.key_ro)
        r, text = self.call(ro, "exec", {"command": "true", "sandboxId": "sb_0000000000"},
                            key=self.key_ro)
        self.assertTrue(r["isError"])
        self.assertTrue(text.endswith("(permission_denied)"), text)

    # -- a real sandbox --------------------------------------------------------
    def test_sandbox(self):
        sid = self.session()
        r, text = self.call(sid, "create_sandbox", {"name": "demo", "ttlSeconds": 900,
                                                    "env": {"GREETING": "hello"}})
        # Plainly: this part needs vmd to serve vm.create (a real guest).
        self.assertFalse(r.get("isError"), f"create_sandbox failed: {text}")
        sc = r["structuredContent"]
        sb = sc["id"]
        self.assertRegex(sb, r"^sb_[a-z0-9]{10}$")
        self.assertEqual(sc["state"], "ready")
        self.assertRegex(text, rf"^Sandbox {sb} is ready\. URL: https://[a-z]+-[a-z]+-[a-z]+"
                               rf"\.box\.localhost(:\d+)?\. Stops automatically at "
                               rf"\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.$")

        r, text = self.call(sid, "exec", {"command": "python3 -c 'print(2**100)'"})
        self.assertEqual(text, "Exit code 0.\nstdout:\n1267650600228229401496703205376")
        self.assertEqual(r["structuredContent"]["exitCode"], 0)
        r, text = self.call(sid, "exec", {"command": "echo $GREETING; echo oops >&2; exit 3"})
        self.assertEqual(text, "Exit code 3.\nstdout:\nhello\nstderr:\noops")

        r, text = self.call(sid, "exec", {"command": "sleep 2; echo done", "detached": True})
        pid = r["structuredContent"]["processId"]
        self.assertEqual(text, f"Started process {pid} in {sb}. Call command_status with "
                               f"processId {pid} for its output and exit code.")
        r, text = self.call(sid, "command_status", {"processId": pid})
        self.assertEqual(text, f"Process {pid} is running.")
        import time
        time.sleep(3)
        r, text = self.call(sid, "command_status", {"processId": pid})
        self.assertEqual(text, f"Process {pid} exited with code 0.\nstdout:\ndone")
        nxt = r["structuredContent"]["stdoutNextOffset"]
        r, text = self.call(sid, "command_status", {"processId": pid, "stdoutOffset": nxt})
        self.assertEqual(text, f"Process {pid} exited with code 0.")

        blob = bytes(range(256)) * 5000  # > 1 MiB: several chunks both ways
        import base64
        r, text = self.call(sid, "write_file", {"path": "/root/blob.bin", "encoding": "base64",
                                                "content": base64.b64encode(blob).decode()})
        self.assertFalse(r.get("isError"), text)
        r, text = self.call(sid, "read_file", {"path": "/root/blob.bin", "encoding": "base64"})
        self.assertEqual(base64.b64decode(r["structuredContent"]["content"]), blob)
        # Base64 of a file over 48 KiB is not repeated in the text (docs/mcp.md).
        self.assertEqual(text, f"Read {len(blob)} bytes of /root/blob.bin. Their base64 is in "
                               "structuredContent.content (not repeated here: over 49152 bytes).")
        # A file over 1 MiB is answered as it is read (gw_b64_stream): one JSON body of
        # a length said up front, not chunked; a client that leaves mid-answer cancels
        # the read and the gateway serves on.
        self.call(sid, "exec", {"command": "head -c 3000001 /dev/urandom > /root/big.bin"})
        r, text = self.call(sid, "exec", {"command": "sha256sum /root/big.bin"})
        digest = text.split("stdout:\n")[1].split()[0]
        status, hdrs, events = self.stream(
            {"jsonrpc": "2.0", "id": 40, "method": "tools/call",
             "params": {"name": "read_file", "arguments": {"path": "/root/big.bin",
                                                           "encoding": "base64"}}},
            self.key_a, sid, accept="application/json")
        self.assertEqual(status, 200)
        self.assertNotIn("transfer-encoding", hdrs)
        self.assertEqual(hdrs["content-type"], "application/json")
        self.assertGreater(int(hdrs["content-length"]), 4000000)
        sc = events[0][1]["result"]["structuredContent"]
        self.assertEqual(sc["size"], 3000001)
        self.assertEqual(hashlib.sha256(base64.b64decode(sc["content"])).hexdigest(), digest)
        self.assertEqual(events[0][1]["result"]["content"][0]["text"],
                         "Read 3000001 bytes of /root/big.bin. Their base64 is in "
                         "structuredContent.content (not repeated here: over 49152 bytes).")
        # 12 MB: more than the stream buffer and the sockets' hold, so the client leaves
        # before the answer's end: while the guest is still read (the read is cancelled),
        # or, on a quick host, once it was all read, or once the call was done and only its
        # base64 still going out (the rest is dropped). The log says each.
        self.call(sid, "exec", {"command": "head -c 12000000 /dev/zero > /root/big.bin"})
        import http.client
        import ssl
        conn = http.client.HTTPSConnection(
            "localhost", self.s.listen_port(), timeout=30,
            context=ssl.create_default_context(cafile=self.s.status()["ca_cert"]))
        conn.request("POST", "/mcp", body=json.dumps(
            {"jsonrpc": "2.0", "id": 41, "method": "tools/call",
             "params": {"name": "read_file", "arguments": {"path": "/root/big.bin",
                                                           "encoding": "base64"}}}),
            headers={"Content-Type": "application/json", "Accept": "application/json",
                     "Authorization": f"Bearer {self.key_a}", "Mcp-Session-Id": sid})
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        self.assertTrue(res.read(1000).startswith(b'{"jsonrpc":"2.0","id":41,"result":'))
        conn.sock.shutdown(2)
        conn.close()
        deadline = time.monotonic() + 10
        left = ("the client left the file's answer", "read_file answered after the client left")
        while not any(m in self.s.log("sbx-gateway") for m in left) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertTrue(any(m in self.s.log("sbx-gateway") for m in left))
        self.call(sid, "write_file", {"path": "/tmp/a.txt", "content": "héllo\n"})
        r, text = self.call(sid, "read_file", {"path": "/tmp/a.txt"})
        self.assertEqual(text, "héllo\n")
        r, text = self.call(sid, "read_file", {"path": "/tmp/a.txt", "encoding": "base64"})
        self.assertEqual(text, base64.b64encode("héllo\n".encode()).decode())
        self.assertEqual(r["structuredContent"]["content"], text)

        # Another account sees nothing; a read-only key of the owner can't exec.
        other = self.session(self.key_b)
        r, text = self.call(other, "get_sandbox", {"sandboxId": sb}, key=self.key_b)
        self.assertEqual(text, "Sandbox not found (not_found)")
        r, text = self.call(other, "exec", {"sandboxId": sb, "command": "true"}, key=self.key_b)
        self.assertEqual(text, "Sandbox not found (not_found)")
        ro = self.session(self.key_ro)
        r, text = self.call(ro, "get_sandbox", {"sandboxId": sb}, key=self.key_ro)
        self.assertFalse(r.get("isError"), text)
        r, text = self.call(ro, "exec", {"sandboxId": sb, "command": "true"}, key=self.key_ro)
        self.assertTrue(text.endswith("(permission_denied)"), text)

        # get_sandbox carries billing's figures: running time and cost so far.
        r, text = self.call(sid, "get_sandbox", {})
        sc = r["structuredContent"]
        self.assertGreaterEqual(sc["runningSeconds"], 1, sc)
        self.assertEqual(sc["costMicroUsd"], sc["runningSeconds"] * 10 + (sc["costMicroUsd"] % 10))
        self.assertRegex(sc["costUsd"], r"^\d+\.\d{6}$")
        self.assertRegex(text, r"Running time so far: \d+ s, \$\d+\.\d{6}\.$")
        r, text = self.call(sid, "list_sandboxes", {})
        self.assertIn("runningSeconds", r["structuredContent"]["sandboxes"][0])

        # Extend, rename, label: the broker's record changes, each says so.
        r, text = self.call(sid, "extend_sandbox", {"ttlSeconds": 7200})
        self.assertFalse(r.get("isError"), text)
        self.assertIn(f"Sandbox {sb} has a new deadline", text)
        r, text = self.call(sid, "rename_sandbox", {"name": "renamed"})
        self.assertEqual(r["structuredContent"]["name"], "renamed")
        r, text = self.call(sid, "label_sandbox", {"labels": {"team": "red", "gone": None}})
        self.assertFalse(r.get("isError"), text)
        r, text = self.call(sid, "get_sandbox", {})
        self.assertEqual(r["structuredContent"]["name"], "renamed")
        r, text = self.call(sid, "label_sandbox", {"labels": "nope"})
        self.assertTrue(r["isError"])
        self.assertIn("(invalid_argument)", text)

        # Stop keeps memory and kill ends a process; resume brings it all back.
        r, text = self.call(sid, "exec", {"command": "sleep 600", "detached": True})
        sleeper = r["structuredContent"]["processId"]
        r, text = self.call(sid, "stop_sandbox", {})
        self.assertEqual(r["structuredContent"]["state"], "stopped", text)
        r, text = self.call(sid, "exec", {"command": "true"})
        self.assertTrue(r["isError"])
        self.assertIn("(failed_precondition)", text)
        # Egress rules of the stopped sandbox (its record; the resume carries them): the
        # text names the rules in force, a bad entry is refused naming it, empty lists
        # clear them.
        r, text = self.call(sid, "set_sandbox_egress",
                            {"egress": {"allow": ["2001:DB8::1/32", "203.0.113.7"], "deny": ["198.51.100.0/24"]}})
        self.assertFalse(r.get("isError"), text)
        self.assertEqual(r["structuredContent"]["egress"],
                         {"allow": ["2001:db8::/32", "203.0.113.7/32"], "deny": ["198.51.100.0/24"]})
        self.assertTrue(text.startswith(f"Sandbox {sb} egress rules: deny 198.51.100.0/24; only "
                                        "2001:db8::/32, 203.0.113.7/32 (and DNS) reachable; "
                                        "the fixed policy"),
                        text)
        r, text = self.call(sid, "set_sandbox_egress", {"egress": {"allow": ["a..b"]}})
        self.assertEqual(text, 'egress.allow[0] ("a..b"): a domain name has no empty label '
                               '(invalid_argument)')
        r, text = self.call(sid, "set_sandbox_egress", {})
        self.assertEqual(text, "egress is required (invalid_argument)")
        r, text = self.call(sid, "get_sandbox", {})
        self.assertEqual(r["structuredContent"]["egress"]["deny"], ["198.51.100.0/24"])
        r, text = self.call(sid, "set_sandbox_egress", {"egress": {"allow": [], "deny": []}})
        self.assertEqual(r["structuredContent"]["egress"], {"allow": [], "deny": []})
        self.assertIn("egress rules: none of its own;", text)
        r, text = self.call(sid, "resume_sandbox", {})
        self.assertEqual(r["structuredContent"]["state"], "ready", text)
        r, text = self.call(sid, "command_status", {"processId": sleeper})
        self.assertEqual(text, f"Process {sleeper} is running.")
        r, text = self.call(sid, "kill_command", {"processId": sleeper, "signal": "SIGKILL"})
        self.assertFalse(r.get("isError"), text)
        time.sleep(0.5)
        r, text = self.call(sid, "command_status", {"processId": sleeper})
        self.assertFalse(r["structuredContent"]["running"], text)

        self.progress(sid, sb)
        self.sdk_client(sb)

        r, text = self.call(sid, "delete_sandbox", {})
        self.assertTrue(r["isError"])
        self.assertEqual(text, "sandboxId is required: the exact id (sb_…) of one sandbox; "
                               "delete_sandbox has no default")
        r, text = self.call(sid, "delete_sandbox", {"sandboxId": sb})
        self.assertEqual(text, f"Deleting {sb}: its disk, memory and automatic snapshots are "
                               "removed.")
        r, text = self.call(sid, "get_sandbox", {"sandboxId": sb})
        self.assertEqual(text, "Sandbox not found (not_found)")
        self.assertTrue(r["isError"])

    # -- progress over SSE -----------------------------------------------------
    def progress(self, sid, sb):
        def exec_call(rid, token=None):
            params = {"name": "exec", "arguments": {"sandboxId": sb,
                                                    "command": "sleep 3; echo done"}}
            if token is not None:
                params["_meta"] = {"progressToken": token}
            return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

        # A progressToken and an Accept with text/event-stream: an SSE stream, progress
        # while the exec waits, the response last.
        for rid, token in ((31, "tok-1"), (32, 77)):
            status, hdrs, events = self.stream(exec_call(rid, token), self.key_a, sid)
            self.assertEqual(status, 200)
            self.assertTrue(hdrs["content-type"].startswith("text/event-stream"), hdrs)
            self.assertEqual(hdrs["cache-control"], "no-cache")
            print(f"  SSE ({token!r}): " + "; ".join(f"{t:.1f}s {json.dumps(m)[:100]}"
                                                    for t, m in events))
            *notes, (t_last, last) = events
            self.assertGreaterEqual(len(notes), 2, events)
            prev = 0
            for t, n in notes:
                self.assertEqual(n["method"], "notifications/progress")
                self.assertNotIn("id", n)
                p = n["params"]
                self.assertEqual(p["progressToken"], token)
                self.assertGreater(p["progress"], prev)
                self.assertEqual(p["message"], f"exec still running after {p['progress']} s")
                self.assertLess(t, t_last - 0.5, "progress must arrive while the call runs")
                prev = p["progress"]
            self.assertEqual(last["id"], rid)
            self.assertEqual(last["result"]["content"][0]["text"], "Exit code 0.\nstdout:\ndone")
            self.assertGreaterEqual(t_last, 3)

        # No token, or a client that takes JSON only: application/json as before.
        for body, accept in ((exec_call(33), "application/json, text/event-stream"),
                             (exec_call(34, "tok-2"), "application/json")):
            status, hdrs, events = self.stream(body, self.key_a, sid, accept)
            self.assertEqual(status, 200)
            self.assertTrue(hdrs["content-type"].startswith("application/json"), hdrs)
            self.assertEqual(len(events), 1)
            self.assertEqual(events[0][1]["id"], body["id"])
            self.assertEqual(events[0][1]["result"]["content"][0]["text"],
                             "Exit code 0.\nstdout:\ndone")

        # A quick call with a token streams too: just the response. An error as well.
        status, hdrs, events = self.stream(
            {"jsonrpc": "2.0", "id": 35, "method": "tools/call",
             "params": {"name": "get_sandbox", "arguments": {"sandboxId": sb},
                        "_meta": {"progressToken": "q"}}}, self.key_a, sid)
        self.assertEqual([m["id"] for _, m in events], [35])
        self.assertEqual(events[0][1]["result"]["structuredContent"]["id"], sb)
        status, hdrs, events = self.stream(
            {"jsonrpc": "2.0", "id": 36, "method": "tools/call",
             "params": {"name": "make_coffee", "_meta": {"progressToken": "q"}}},
            self.key_a, sid)
        self.assertEqual(events[0][1]["error"]["code"], -32602)

        # A result larger than the stream buffer (1 MiB) goes out as the client reads it.
        import base64
        status, hdrs, events = self.stream(
            {"jsonrpc": "2.0", "id": 38, "method": "tools/call",
             "params": {"name": "read_file", "_meta": {"progressToken": "big"},
                        "arguments": {"sandboxId": sb, "path": "/root/blob.bin",
                                      "encoding": "base64"}}}, self.key_a, sid)
        self.assertTrue(hdrs["content-type"].startswith("text/event-stream"), hdrs)
        self.assertEqual(base64.b64decode(events[-1][1]["result"]["structuredContent"]
                                          ["content"]), bytes(range(256)) * 5000)

        # A client that leaves mid-stream: the exec finishes, its answer is dropped, and
        # the gateway serves on.
        import http.client
        import ssl
        ctx = ssl.create_default_context(cafile=self.s.status()["ca_cert"])
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=ctx,
                                           timeout=30)
        conn.request("POST", "/mcp", body=json.dumps(exec_call(37, "gone")), headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.key_a}", "Mcp-Session-Id": sid})
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        while b"notifications/progress" not in res.readline():
            pass
        conn.sock.shutdown(2)
        conn.close()
        time.sleep(3.5)
        self.assertIn("exec answered after the client left; dropped",
                      self.s.log("sbx-gateway"))
        r, text = self.call(sid, "exec", {"sandboxId": sb, "command": "echo alive"})
        self.assertEqual(text, "Exit code 0.\nstdout:\nalive")

    def test_presets_ci_and_no_delete(self):
        ci = self.s.cli_json("key", "create", "--account", "alice@example.com",
                             "--preset", "ci")["key"]
        nd = self.s.cli_json("key", "create", "--account", "alice@example.com",
                             "--preset", "no-delete")["key"]
        # A sandbox the full key made: the ci key can't see it, the no-delete key can't
        # delete it.
        full = self.session()
        r, text = self.call(full, "create_sandbox", {"name": "owned-by-full"})
        self.assertFalse(r.get("isError"), text)
        theirs = r["structuredContent"]["id"]
        cis = self.session(ci)
        r, text = self.call(cis, "get_sandbox", {"sandboxId": theirs}, key=ci)
        self.assertEqual(text, "Sandbox not found (not_found)")
        nds = self.session(nd)
        r, text = self.call(nds, "delete_sandbox", {"sandboxId": theirs}, key=nd)
        self.assertTrue(r["isError"])
        self.assertTrue(text.endswith("(permission_denied)"), text)
        r, text = self.call(nds, "exec", {"sandboxId": theirs, "command": "true"}, key=nd)
        self.assertEqual(text, "Exit code 0.")
        # What the ci key creates, it uses and deletes.
        r, text = self.call(cis, "create_sandbox", {"name": "ci-made"}, key=ci)
        self.assertFalse(r.get("isError"), text)
        mine = r["structuredContent"]["id"]
        r, text = self.call(cis, "exec", {"command": "echo ok"}, key=ci)
        self.assertEqual(text, "Exit code 0.\nstdout:\nok")
        r, text = self.call(cis, "list_sandboxes", {}, key=ci)
        self.assertEqual([x["id"] for x in r["structuredContent"]["sandboxes"]], [mine])
        # Pages: the ci key's own, in the query, so one of one has no nextCursor; the
        # account's, one a page, each once, in the order of the whole list, the text saying
        # how to get the next; a cursor that is not a nextCursor is the caller's error.
        r, text = self.call(cis, "list_sandboxes", {"limit": 1}, key=ci)
        self.assertEqual([x["id"] for x in r["structuredContent"]["sandboxes"]], [mine])
        self.assertNotIn("nextCursor", r["structuredContent"])
        self.assertNotIn("More:", text)
        whole = [x["id"] for x in self.call(full, "list_sandboxes", {})[0]["structuredContent"]
                 ["sandboxes"]]
        self.assertTrue({mine, theirs} <= set(whole), whole)
        paged, cursor = [], None
        while True:
            r, text = self.call(full, "list_sandboxes",
                                {"limit": 1, **({"cursor": cursor} if cursor else {})})
            self.assertFalse(r.get("isError"), text)
            paged += [x["id"] for x in r["structuredContent"]["sandboxes"]]
            cursor = r["structuredContent"].get("nextCursor")
            if not cursor:
                self.assertNotIn("More:", text)
                break
            self.assertTrue(text.endswith(f"\nMore: list again with cursor {cursor}."), text)
            self.assertRegex(cursor, r"^[A-Za-z0-9_-]+$")  # opaque, URL-safe
        self.assertEqual(paged, whole)
        r, text = self.call(full, "list_sandboxes", {"cursor": mine})  # an id is no cursor
        self.assertTrue(r["isError"])
        self.assertIn("nextCursor", text)
        self.assertTrue(text.endswith("(invalid_argument)"), text)
        r, text = self.call(full, "list_sandboxes", {"limit": 1001})
        self.assertTrue(r["isError"])
        self.assertTrue(text.endswith("(invalid_argument)"), text)
        r, text = self.call(cis, "delete_sandbox", {"sandboxId": mine}, key=ci)
        self.assertFalse(r.get("isError"), text)
        r, text = self.call(full, "delete_sandbox", {"sandboxId": theirs})
        self.assertFalse(r.get("isError"), text)

    # -- the official TypeScript SDK -------------------------------------------
    def run_sdk(self, *calls):
        """Runs mcp_client.mjs (the official SDK) with TOOL ARGS pairs; returns its steps."""
        return run_sdk(self, self.s, self.key_a, *calls)

    def test_reference_scenarios_through_the_sdk(self):
        """Both scenarios of the reference documents, driven by the SDK client alone."""
        reference_scenarios(self, self.run_sdk)

    def sdk_client(self, sb):
        steps = self.run_sdk(("get_sandbox", {"sandboxId": sb}),
                             ("exec", {"sandboxId": sb, "command": "uname -a"}),
                             ("exec", {"sandboxId": sb, "command": "sleep 3; echo done"}))
        self.assertEqual(steps[0]["server"]["name"], "sbx")
        self.assertEqual([t["name"] for t in steps[1]["tools"]], NAMES)
        self.assertEqual(steps[2]["result"]["structuredContent"]["id"], sb)
        self.assertTrue(steps[3]["result"]["content"][0]["text"].startswith("Exit code 0.\n"
                                                                            "stdout:\nLinux "))
        # Its onprogress saw the long exec's progress, then the result.
        self.assertEqual(steps[4]["result"]["content"][0]["text"], "Exit code 0.\nstdout:\ndone")
        progress = [p["progress"] for p in steps[4]["progress"]]
        self.assertGreaterEqual(len(progress), 2, steps[4])
        self.assertEqual(progress, sorted(set(progress)))
        self.assertEqual(steps[4]["progress"][0]["message"], "exec still running after 1 s")
        self.assertEqual(steps[-1]["step"], "done")


if __name__ == "__main__":
    main()
