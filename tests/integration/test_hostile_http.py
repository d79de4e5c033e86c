"""Hostile HTTP against the real gateway (house rule 3: bad input gets a clear error and
loses nothing). Thousands of mutated requests reach every surface a client can touch —
/mcp (JSON-RPC and tool arguments), REST /v1, the OAuth endpoints and forms, the account
page, the port proxy's host names — plus malformed HTTP on raw TLS sockets. Afterwards:
no daemon restarted, no answer was a 500 or malformed, /healthz and a real MCP call
still work, and the sanitizer build's logs hold no AddressSanitizer or UBSan report.
The mutations come from a seeded generator (the seed is printed), so a failure replays."""
import http.client
import json
import os
import random
import socket
import ssl
import time
import unittest
import urllib.parse

from sbxtest import BIN, Sbx, main, mcp_call, mcp_session

SEED = int(os.environ.get("SBX_FUZZ_SEED", str(int(time.time()))))
ROUNDS = int(os.environ.get("SBX_FUZZ_ROUNDS", "2500"))
PASSWORD = "correct horse battery"

# Values that break naive parsers: wrong types, extremes, odd text.
NASTY = [None, True, False, 0, -1, 1 << 53, -(1 << 63), 1 << 64, 1.5e308, -0.0, "", " ",
         "\u0000", "\ud7ff\ue000", "é" * 3, "A" * 70000, "../../etc/passwd", "/", "//x",
         "sb_", "sb_0000000000", "snap_x", "%00", "${jndi:x}", "<script>", "\r\nX: y",
         [], [[[[]]]], {}, {"": None}, ["a"] * 300, {"k" * 300: "v"}, "0x10", "1e400",
         "SIGKILL", "SIG", "-9", "4294967296"]
TOOLS = ["create_sandbox", "list_sandboxes", "get_sandbox", "get_sandbox_metrics", "exec",
         "command_status", "kill_command", "list_commands", "read_file", "write_file", "host_port",
         "stop_sandbox",
         "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox",
         "delete_sandbox", "save_snapshot", "list_snapshots", "delete_snapshot",
         "set_sandbox_egress", "fork_sandbox", "nope"]
ARG_NAMES = ["sandboxId", "name", "type", "ttlSeconds", "snapshotId", "template", "env", "labels",
             "network", "command", "detached", "timeout", "cwd", "processId", "stdoutOffset",
             "stderrOffset", "signal", "path", "content", "encoding", "mode", "port", "public",
             "label", "egress", "allow", "deny", "count", "extra"]
REST = [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/v1/sandboxes/{id}"),
        ("PATCH", "/v1/sandboxes/{id}"), ("DELETE", "/v1/sandboxes/{id}"),
        ("POST", "/v1/sandboxes/{id}/stop"), ("POST", "/v1/sandboxes/{id}/resume"),
        ("POST", "/v1/sandboxes/{id}/extend"), ("POST", "/v1/sandboxes/{id}/exec"),
        ("GET", "/v1/sandboxes/{id}/processes/{pid}"), ("GET", "/v1/sandboxes/{id}/terminal"),
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/kill"),
        ("GET", "/v1/sandboxes/{id}/files"), ("PUT", "/v1/sandboxes/{id}/files"),
        ("GET", "/v1/usage"), ("GET", "/v1/keys"), ("DELETE", "/v1/keys/{id}"),
        ("TRACE", "/v1/sandboxes"), ("GET", "/v1/../../etc/passwd")]
OAUTH = [("GET", "/.well-known/oauth-protected-resource/mcp"),
         ("GET", "/.well-known/oauth-authorization-server"), ("POST", "/oauth/register"),
         ("GET", "/oauth/authorize"), ("POST", "/oauth/authorize"), ("POST", "/oauth/token"),
         ("POST", "/oauth/revoke"), ("GET", "/account"), ("POST", "/account"),
         ("OPTIONS", "/oauth/token")]


class HostileHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One start a day: the first create boots a real guest, the rest are refused after
        # every layer has parsed them.
        cls.s = Sbx(cls, "hostile", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "plan.free.starts_per_day": 1, "plan.free.requests_per_second": 0})
        cls.s.up()
        acct = cls.s.cli_json("account", "create", "--email", "fuzz@example.com",
                              "--password-stdin", input=PASSWORD + "\n")
        cls.key = acct["api_key"]
        cls.port = cls.s.listen_port()
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])
        cls.pids = {d["name"]: d["pid"] for d in cls.s.status()["daemons"]}

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- the generator ---------------------------------------------------------
    def value(self, rng, depth=0):
        r = rng.random()
        if r < 0.45 or depth > 3:
            return rng.choice(NASTY)
        if r < 0.6:
            return rng.randint(-10, 70000)
        if r < 0.75:
            return "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(0, 40)))
        if r < 0.88:
            return [self.value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice(ARG_NAMES): self.value(rng, depth + 1) for _ in range(rng.randint(0, 4))}

    def args(self, rng):
        return {rng.choice(ARG_NAMES): self.value(rng) for _ in range(rng.randint(0, 6))}

    def mangle(self, rng, data):
        """Byte-level damage to an encoded body: flips, cuts, splices, bad UTF-8, nesting."""
        data = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.3 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op < 0.5 and data:
                del data[rng.randrange(len(data)):]
            elif op < 0.65:
                at = rng.randrange(len(data) + 1)
                data[at:at] = rng.choice([b"\xff\xfe", b"\xc0\x80", b"\\u0000", b"[" * 5000,
                                          b"{\"a\":" * 3000, b"\x00", b"\"", b",,", b"1e99999"])
            elif op < 0.8 and data:
                a = rng.randrange(len(data))
                data[a:a] = data[a:a + rng.randint(1, 64)] * rng.randint(1, 50)
        return bytes(data)

    def mcp_body(self, rng, session):
        method = rng.choice(["tools/call"] * 6 + ["tools/list", "initialize", "ping",
                                                  "notifications/initialized", "resources/list",
                                                  "nope", ""])
        params = ({"name": rng.choice(TOOLS), "arguments": self.args(rng)}
                  if method == "tools/call" else self.value(rng))
        if method == "initialize":
            params = {"protocolVersion": self.value(rng), "capabilities": self.value(rng),
                      "clientInfo": self.value(rng)}
        msg = {"jsonrpc": rng.choice(["2.0", "2.0", "1.0", None]), "method": method,
               "params": params}
        if rng.random() < 0.9:
            msg["id"] = self.value(rng)
        if rng.random() < 0.1:
            msg = [msg, msg]
        data = json.dumps(msg).encode()
        return self.mangle(rng, data) if rng.random() < 0.3 else data

    def request(self, rng, session):
        """One (method, path, headers, body)."""
        kind = rng.random()
        auth = rng.choice([f"Bearer {self.key}"] * 6 + ["Bearer sbx_at_" + "x" * 43,
                                                        "Bearer", "Basic Zm9vOmJhcg==", ""])
        headers = {"Authorization": auth}
        if kind < 0.45:
            headers.update({"Content-Type": rng.choice(["application/json"] * 5 +
                                                       ["text/plain", ""]),
                            "Accept": rng.choice(["application/json, text/event-stream",
                                                  "application/json", "text/event-stream", "*/*"]),
                            "MCP-Protocol-Version": rng.choice(["2025-06-18", "2025-06-18",
                                                                "1999-01-01", "x" * 300])})
            if rng.random() < 0.8:
                headers["Mcp-Session-Id"] = rng.choice([session, session, "nope", "x" * 500])
            if rng.random() < 0.1:
                headers["Origin"] = rng.choice(["https://evil.example", "null", "http://localhost"])
            return rng.choice(["POST"] * 8 + ["GET", "DELETE"]), "/mcp", headers, \
                self.mcp_body(rng, session)
        if kind < 0.75:
            method, path = rng.choice(REST)
            path = path.replace("{id}", urllib.parse.quote(str(self.value(rng)), safe="")[:300])
            path = path.replace("{pid}", urllib.parse.quote(str(self.value(rng)), safe="")[:50])
            if rng.random() < 0.4:
                path += "?" + urllib.parse.urlencode({rng.choice(["path", "mode", "sandboxId",
                                                                  "stdoutOffset", "x"]):
                                                      str(self.value(rng))[:2000]})
            body = json.dumps(self.args(rng)).encode()
            if rng.random() < 0.3:
                body = self.mangle(rng, body)
            headers["Content-Type"] = rng.choice(["application/json", "application/octet-stream"])
            return method, path, headers, body
        if kind < 0.95:
            method, path = rng.choice(OAUTH)
            fields = {rng.choice(["client_id", "redirect_uri", "response_type", "state",
                                  "code_challenge", "code_challenge_method", "resource", "scope",
                                  "grant_type", "code", "code_verifier", "refresh_token", "token",
                                  "email", "password", "csrf", "action", "key_id", "name",
                                  "preset", "client_name", "redirect_uris"]):
                      str(self.value(rng))[:3000] for _ in range(rng.randint(0, 8))}
            if path == "/oauth/register":
                body = json.dumps({"client_name": self.value(rng),
                                   "redirect_uris": self.value(rng)}).encode()
                headers["Content-Type"] = "application/json"
            else:
                body = urllib.parse.urlencode(fields).encode()
                headers["Content-Type"] = rng.choice(["application/x-www-form-urlencoded"] * 3 +
                                                     ["multipart/form-data", "application/json"])
            if method == "GET":
                path += "?" + body.decode()
                body = None
            if rng.random() < 0.3:
                headers["Cookie"] = rng.choice(["__Host-sbx_session=" + "A" * 600,
                                                "__Host-sbx_session=;;;",
                                                "a=b; __Host-sbx_session=%00%ff"])
            return method, path, headers, body
        # The port proxy: odd host names.
        host = rng.choice(["x-8000.box.localhost", "-.box.localhost", "a-99999999.box.localhost",
                           "a-0.box.localhost", "..box.localhost", "x" * 300 + ".box.localhost",
                           "a-8000.box.localhost:1"])
        headers["Host"] = host
        return rng.choice(["GET", "POST", "CONNECT"]), "/" + "a" * rng.randint(0, 3000), headers, None

    # -- the run ---------------------------------------------------------------
    def connect(self):
        return http.client.HTTPSConnection("localhost", self.port, context=self.ctx, timeout=60)

    def raw_garbage(self, rng):
        """Malformed HTTP straight on a TLS socket: bad request lines, headers, lengths."""
        payloads = [b"GET\r\n\r\n", b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
                    b"99999999999999999999\r\n\r\n{}", b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\n", b"\x16\x03\x01" * 100,
                    b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n",
                    b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 100000 + b"\r\n\r\n",
                    b"GET / HTTP/9.9\r\nHost: localhost\r\n\r\n",
                    bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000)))]
        data = rng.choice(payloads)
        try:
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            sock = self.ctx.wrap_socket(raw, server_hostname="localhost")
            sock.sendall(data)
            sock.settimeout(5)
            try:
                sock.recv(4096)
            except (socket.timeout, OSError):
                pass
            sock.close()
        except (ssl.SSLError, OSError):
            pass

    def test_hostile_requests(self):
        print(f"\nseed {SEED} (SBX_FUZZ_SEED={SEED} replays), {ROUNDS} requests")
        rng = random.Random(SEED)
        session = mcp_session(self.s, self.key)
        statuses, broken = {}, []
        conn = self.connect()
        for i in range(ROUNDS):
            method, path, headers, body = self.request(rng, session)
            try:
                conn.request(method, path, body=body, headers=headers)
                res = conn.getresponse()
                data = res.read()
                statuses[res.status] = statuses.get(res.status, 0) + 1
                ctype = res.getheader("Content-Type", "")
                if res.status >= 500 and res.status not in (502, 503, 504):
                    broken.append((res.status, method, path[:120], data[:300]))
                elif "json" in ctype and data:
                    json.loads(data)  # every JSON answer parses
                if res.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = self.connect()
            except (http.client.HTTPException, OSError, ValueError) as e:
                # The gateway may close a connection on garbage; it must answer the next.
                statuses[type(e).__name__] = statuses.get(type(e).__name__, 0) + 1
                conn.close()
                conn = self.connect()
            if i % 50 == 0:
                self.raw_garbage(rng)
        conn.close()
        print("answers:", json.dumps(statuses, sort_keys=True, default=str))
        self.assertEqual(broken, [], "internal errors (replay with the seed above)")
        # Everyone is still the same process, and still works.
        now = {d["name"]: d["pid"] for d in self.s.status()["daemons"]}
        self.assertEqual(now, self.pids, "a daemon restarted under hostile input")
        status, _, body = self.s.https("GET", "/healthz")
        self.assertEqual(status, 200, body)
        r, text = mcp_call(self, self.s, self.key, mcp_session(self.s, self.key),
                           "list_sandboxes")
        self.assertIn("sandboxes", r["structuredContent"])
        for name in ("sbx-gateway", "sbx-broker", "sbx-billing"):
            log = self.s.log(name)
            for marker in ("AddressSanitizer", "runtime error:", "LeakSanitizer"):
                self.assertNotIn(marker, log, f"{name}: sanitizer report (seed {SEED})")


if __name__ == "__main__":
    main()
