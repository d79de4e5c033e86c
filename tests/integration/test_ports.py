"""Guest ports at https://<label>-<port>.box.<domain> (issues 3 and 4): host_port over MCP,
then real HTTP(S) through the gateway's port proxy into a real guest under `sbx up`:
a directory listing, private ports and whose keys open them, a streamed response, a
WebSocket echo, unknown hosts, auto-resume (issue 20 item 1: a request to a stopped
sandbox's port wakes it, HTTP and WebSocket, public and private, one that arrives while it
is stopping; autoResume off: 503), removal and delete."""
import base64
import hashlib
import json
import os
import signal
import socket
import ssl
import threading
import time
import unittest
import http.client

from sbxtest import BIN, MCP_INIT as INIT, Sbx, main, mcp_call, mcp_post, wait_for
from test_billing import ready_ms

# A chunked stream: one line a second, five lines.
STREAM_PY = r'''
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(5):
            line = ("line %d\n" % i).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            time.sleep(1)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8002), H).serve_forever()
'''

# A WebSocket echo server, python3 stdlib only: the handshake, then text frames back.
WS_PY = r'''
import asyncio, base64, hashlib
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
async def serve(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    key = None
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("sec-websocket-key:"):
            key = line.split(":", 1)[1].strip()
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    writer.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % accept).encode())
    await writer.drain()
    while True:
        b1, b2 = await reader.readexactly(2)
        size = b2 & 127
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        mask = await reader.readexactly(4) if b2 & 128 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await reader.readexactly(size)))
        if b1 & 15 == 8:
            writer.write(b"\x88\x00")
            await writer.drain()
            break
        reply = b"echo: " + data
        writer.write(bytes([0x81, len(reply)]) + reply)
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(serve, "0.0.0.0", 8003)
    async with server:
        await server.serve_forever()
asyncio.run(main())
'''


class PortsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "ports", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        b = cls.s.cli_json("account", "create", "--email", "bob@example.com")
        cls.key_a, cls.key_b = a["api_key"], b["api_key"]
        cls.ca = cls.s.status()["ca_cert"]
        cls.port = cls.s.listen_port()

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- MCP -------------------------------------------------------------------
    def post(self, body, sid=None):
        return mcp_post(self.s, self.key_a, body, sid)

    def call(self, sid, tool, args=None, ok=True):
        return mcp_call(self, self.s, self.key_a, sid, tool, args, ok)

    # -- the port proxy, as a browser would reach it ---------------------------
    def connect(self, host):
        """A TLS connection to the gateway for `host` (SNI and certificate check)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        return ctx.wrap_socket(raw, server_hostname=host)

    def fetch(self, host, path="/", key=None, headers=None):
        conn = http.client.HTTPConnection(host, self.port, timeout=60)
        conn.sock = self.connect(host)
        h = dict(headers or {})
        if key:
            h["Authorization"] = f"Bearer {key}"
        conn.request("GET", path, headers=h)
        res = conn.getresponse()
        body = res.read()
        conn.close()
        return res.status, body

    def fetch_until(self, host, status, timeout=30, **kw):
        last = []

        def check():
            last[:] = self.fetch(host, **kw)
            return last[0] == status
        try:
            wait_for(check, timeout, f"{host} answering {status}", interval=0.5)
        except AssertionError:
            self.fail(f"{host}: wanted {status}, last {last}")
        return last[1]

    def error_of(self, body):
        return json.loads(body)["error"]

    def ws_echo(self, name):
        """A WebSocket handshake through the proxy to WS_PY's echo, and two frames back."""
        ws = self.connect(name)
        key = base64.b64encode(os.urandom(16)).decode()
        ws.sendall((f"GET /chat HTTP/1.1\r\nHost: {name}:{self.port}\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = ws.recv(4096)
            self.assertTrue(chunk, f"closed during the handshake: {head!r}")
            head += chunk
        head, extra = head.split(b"\r\n\r\n", 1)
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
        self.assertEqual({k.lower(): v for k, v in fields.items()}["sec-websocket-accept"], accept)
        for word in (b"hello", b"again"):
            mask = os.urandom(4)
            ws.sendall(bytes([0x81, 0x80 | len(word)]) + mask +
                       bytes(c ^ mask[i % 4] for i, c in enumerate(word)))
            data = extra
            while len(data) < 2 or len(data) < 2 + data[1]:
                chunk = ws.recv(4096)
                self.assertTrue(chunk, "closed before the echo")
                data += chunk
            self.assertEqual(data[0], 0x81)
            self.assertEqual(data[2:2 + data[1]], b"echo: " + word)
            extra = data[2 + data[1]:]
        ws.close()

    def state(self, sb):
        status, _, body = self.s.https("GET", f"/v1/sandboxes/{sb}",
                                       headers={"Authorization": f"Bearer {self.key_a}"})
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def auto_resume(self, sid, sb, host):
        """A stopped sandbox wakes for a request to its port (autoResume, on by default)."""
        s = self.s
        self.assertTrue(self.state(sb)["autoResume"])
        self.call(sid, "host_port", {"port": 8000, "public": True})
        before = len(s.cli("tap", "--since", "0", "--once").stdout.splitlines())

        # Public, HTTP: the request is held while it resumes, then the same server answers
        # (it was in memory).
        self.call(sid, "stop_sandbox")
        started = time.monotonic()
        status, body = self.fetch(host(8000))
        print(f"  auto-resume: answered {time.monotonic() - started:.2f} s after the request")
        self.assertEqual(status, 200, body)
        self.assertIn(b"Directory listing", body)
        self.assertEqual(self.state(sb)["state"], "ready")
        # The tap: stopped, then resuming because of the request, then ready; billing counts
        # ready time only (sandbox.changed), so the stopped time is not billed.
        events = [json.loads(line) for line in
                  s.cli("tap", "--since", "0", "--once").stdout.splitlines()][before:]
        moves = [(e["to"], e.get("reason")) for e in events
                 if e["type"] == "sandbox.changed" and e["sandbox_id"] == sb]
        self.assertEqual(moves, [("stopping", None), ("stopped", None),
                                 ("resuming", "woken by a request to port 8000"),
                                 ("ready", None)], events)
        _, running = ready_ms([e for e in events if e["type"] == "sandbox.changed"])
        self.assertIn(sb, running)  # billed again from the resume on

        # WebSocket: the upgrade wakes it too.
        self.call(sid, "stop_sandbox")
        self.ws_echo(host(8003))
        self.assertEqual(self.state(sb)["state"], "ready")

        # Private: neither an anonymous request nor another account's key wakes it (401,
        # 403, still stopped); its owner's key does.
        self.call(sid, "host_port", {"port": 8000})
        self.call(sid, "stop_sandbox")
        status, body = self.fetch(host(8000))
        self.assertEqual(status, 401, body)
        status, body = self.fetch(host(8000), key=self.key_b)
        self.assertEqual(status, 403, body)
        self.assertEqual(self.state(sb)["state"], "stopped")
        status, body = self.fetch(host(8000), key=self.key_a)
        self.assertEqual(status, 200, body)
        self.assertEqual(self.state(sb)["state"], "ready")
        self.call(sid, "host_port", {"port": 8000, "public": True})
        self.fetch_until(host(8000), 200)  # the proxy caches answers for two seconds

        # A request that arrives while it is stopping waits for the stop to end, then wakes
        # it: the stop itself succeeds. A stop can end (a fraction of a second) before the
        # request reaches the gateway: then it wakes a stopped sandbox, which proves
        # nothing new, so it is tried again until one request met the stop (at most 8).
        waits = f"sandbox={sb} is stopping: the request waits"
        for attempt in range(8):
            seen = s.log("sbx-gateway").count(waits)
            stopped = {}
            stopper = threading.Thread(target=lambda: stopped.update(
                r=self.call(sid, "stop_sandbox")[0]["structuredContent"]))
            stopper.start()
            wait_for(lambda: self.state(sb)["state"] in ("stopping", "stopped"), 60,
                     "the stop began", interval=0.02)
            status, body = self.fetch(host(8000))
            stopper.join(300)
            self.assertEqual(status, 200, body)
            self.assertEqual(stopped["r"]["state"], "stopped")
            self.assertEqual(self.state(sb)["state"], "ready")
            if s.log("sbx-gateway").count(waits) > seen:
                break
            print(f"  the stop ended before the request arrived (try {attempt + 1}): again")
        self.assertIn(waits, s.log("sbx-gateway"), "no request ever met a stop in progress")

        # autoResume off (REST PATCH): a clear 503 until someone resumes it; the CLI
        # switches it on again.
        status, _, body = s.https("PATCH", f"/v1/sandboxes/{sb}", json.dumps({"autoResume": False}),
                                  {"Authorization": f"Bearer {self.key_a}",
                                   "Content-Type": "application/json"})
        self.assertEqual((status, json.loads(body)["autoResume"]), (200, False), body)
        self.call(sid, "stop_sandbox")
        status, body = self.fetch(host(8000))
        self.assertEqual(status, 503, body)
        self.assertEqual(self.error_of(body)["message"],
                         f"sandbox {sb} is stopped and its autoResume is off; resume it "
                         "(resume_sandbox) to reach port 8000")
        self.assertEqual(self.state(sb)["state"], "stopped")
        self.call(sid, "resume_sandbox")
        body = self.fetch_until(host(8000), 200)
        self.assertIn(b"Directory listing", body)
        self.assertTrue(s.cli_json("sandbox", "update", sb, "--auto-resume", "on")["autoResume"])

    def test_ports(self):
        s = self.s
        _, hdrs, _ = self.post(INIT)
        sid = hdrs["mcp-session-id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        r, _ = self.call(sid, "create_sandbox", {"name": "ports", "ttlSeconds": 1800})
        sb = r["structuredContent"]["id"]
        label = r["structuredContent"]["url"].split("//", 1)[1].split(".box.", 1)[0]
        host = lambda p: f"{label}-{p}.box.localhost"  # noqa: E731

        # The reference scenario: http.server on 8000, published, fetched through the proxy.
        self.call(sid, "exec", {"command": "cd /tmp && python3 -m http.server 8000 --bind "
                                           "0.0.0.0", "detached": True})
        self.call(sid, "write_file", {"path": "/root/stream.py", "content": STREAM_PY})
        self.call(sid, "write_file", {"path": "/root/ws.py", "content": WS_PY})
        self.call(sid, "exec", {"command": "python3 /root/stream.py", "detached": True})
        self.call(sid, "exec", {"command": "python3 /root/ws.py", "detached": True})
        r, _ = self.call(sid, "exec", {"command": "for i in $(seq 240); do "
                                                  "curl -s -o /dev/null localhost:8000 && "
                                                  "curl -s -o /dev/null localhost:8002 && "
                                                  "python3 -c 'import socket; socket.create_"
                                                  "connection((\"127.0.0.1\", 8003))' "
                                                  "2>/dev/null && exit 0; sleep 0.5; done; exit 1"})
        self.assertEqual(r["structuredContent"]["exitCode"], 0, "the guest's servers never listened")
        r, text = self.call(sid, "host_port", {"port": 8000, "public": True})
        url = f"https://{host(8000)}:{self.port}"
        self.assertEqual(text, f"Port 8000 of {sb} is at {url} (public).")
        self.assertEqual(r["structuredContent"], {"port": 8000, "url": url, "public": True})
        status, body = self.fetch(host(8000))
        self.assertEqual(status, 200, body)
        self.assertIn(b"Directory listing", body)

        # The same over REST: unpublish, publish again, both answer the port's JSON.
        auth = {"Authorization": f"Bearer {self.key_a}", "Content-Type": "application/json"}
        status, _, body = s.https("DELETE", f"/v1/sandboxes/{sb}/ports/8000", headers=auth)
        answer = json.loads(body)
        self.assertEqual((status, answer["port"], answer["url"], answer["removed"]),
                         (200, 8000, url, True), body)
        self.fetch_until(host(8000), 404)
        status, _, body = s.https("POST", f"/v1/sandboxes/{sb}/ports",
                                  json.dumps({"port": 8000, "public": True}), auth)
        self.assertEqual((status, json.loads(body)),
                         (200, {"port": 8000, "url": url, "public": True}), body)
        self.fetch_until(host(8000), 200)
        status, _, body = s.https("POST", f"/v1/sandboxes/{sb}/ports",
                                  json.dumps({"port": 70000}), auth)
        self.assertEqual(status, 400, body)
        self.assertEqual(json.loads(body)["error"]["code"], "invalid_argument")
        status, _, body = s.https("POST", f"/v1/sandboxes/{sb}/ports",
                                  json.dumps({"port": 8000}),
                                  dict(auth, Authorization=f"Bearer {self.key_b}"))
        self.assertEqual(status, 404, body)  # another account's sandbox does not exist for it

        # Private: nobody without a key, not another account's key; the owner's key works.
        r, text = self.call(sid, "host_port", {"port": 8000})
        self.assertEqual(text, f"Port 8000 of {sb} is at {url} (private).")
        self.fetch_until(host(8000), 401)  # the proxy caches answers for two seconds
        status, body = self.fetch(host(8000))
        self.assertEqual(status, 401, body)
        self.assertIn("is private", self.error_of(body)["message"])
        status, body = self.fetch(host(8000), key=self.key_b)
        self.assertEqual(status, 403, body)
        self.assertEqual(self.error_of(body)["code"], "permission_denied")
        status, body = self.fetch(host(8000), key="sbx_not_a_real_key")
        self.assertEqual(status, 401, body)
        status, body = self.fetch(host(8000), key=self.key_a)
        self.assertEqual(status, 200, body)
        self.assertIn(b"Directory listing", body)

        # A streamed response arrives line by line, not at the end.
        self.call(sid, "host_port", {"port": 8002, "public": True})
        conn = http.client.HTTPConnection(host(8002), self.port, timeout=60)
        conn.sock = self.connect(host(8002))
        started = time.monotonic()
        conn.request("GET", "/")
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        first = res.readline()
        first_at = time.monotonic()
        rest = res.read()
        done_at = time.monotonic()
        conn.close()
        self.assertEqual(first, b"line 0\n")
        self.assertEqual(rest, b"line 1\nline 2\nline 3\nline 4\n")
        print(f"  stream: first line after {first_at - started:.2f} s, end after "
              f"{done_at - started:.2f} s")
        self.assertGreater(done_at - first_at, 2.5, "the body was not streamed")

        # WebSocket: the upgrade goes through, frames echo both ways.
        self.call(sid, "host_port", {"port": 8003, "public": True})
        self.ws_echo(host(8003))

        # Unknown hosts and unpublished ports: 404.
        status, body = self.fetch("no-such-sandbox-8000.box.localhost")
        self.assertEqual(status, 404, body)
        self.assertEqual(self.error_of(body)["code"], "not_found")
        status, body = self.fetch(host(9999))
        self.assertEqual(status, 404, body)

        self.auto_resume(sid, sb, host)

        # kill -9 vmd: the restarted vmd re-adopts the guest with its forwards.
        vmd = s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGKILL)
        wait_for(lambda: s.daemon_pid("sbx-vmd") not in (None, vmd) and
                 all(d["ready"] for d in s.status()["daemons"]), 60, "vmd restarted")
        time.sleep(1)  # the re-adoption re-adds the forwards through QMP
        body = self.fetch_until(host(8000), 200)
        self.assertIn(b"Directory listing", body)
        self.assertEqual(self.fetch(host(8002))[0], 200)

        # Removed: 404. Deleted: 404 for the ports still published.
        r, text = self.call(sid, "host_port", {"port": 8000, "remove": True})
        self.assertEqual(text, f"Port 8000 of {sb} is no longer published.")
        self.fetch_until(host(8000), 404)
        self.assertEqual(self.fetch(host(8002))[0], 200)
        self.call(sid, "delete_sandbox", {"sandboxId": sb})
        self.fetch_until(host(8002), 404)


if __name__ == "__main__":
    main()
