"""The edge's promises of issue 13 (items 4 and 5): the real broker and two real gateways
under `sbx up`, over HTTPS.

Revocation at once: a key revoked through one gateway is refused by that gateway from the
very next request, and by a second gateway as soon as the tap tells it, however long the
gateways would otherwise trust a good key (gateway.auth_cache_ms is ten minutes here, so
only the tap can explain a refusal within seconds).

The caller's fault is the caller's error: input that cannot be encoded or is out of
bounds answers 400 invalid_argument naming the field, never `unavailable`, and leaves no
ERROR line in the gateway's log."""
import json
import os
import socket
import ssl
import time
import unittest

from sbxtest import Sbx, free_port, main, wait_for

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "edge-test", "version": "0"}}}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "list_sandboxes", "arguments": {}}}


class EdgeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Ten minutes: a refusal within seconds can only come from the revocation itself.
        cls.s = Sbx(cls, "edge", settings={"gateway.auth_cache_ms": 600000})
        cls.s.up()
        cls.port_one = cls.s.listen_port()
        cls.port_two = free_port()
        # As behind a balancer: the second gateway names the first one's origin.
        cls.s.start("sbx-gateway", "--instance", "gw-two", "--set",
                    f"listen=127.0.0.1:{cls.port_two}", "--set",
                    f"public_url=https://localhost:{cls.port_one}")
        wait_for(lambda: [p["role"] for p in cls.s.status()["peers"]].count("gateway") == 2,
                 30, "the second gateway connected")
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])
        cls.account = cls.s.cli_json("account", "create", "--email", "erin@example.com")
        cls.admin_key = cls.account["api_key"]  # a full key of erin's

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- helpers ---------------------------------------------------------------
    def raw(self, port, request: bytes, timeout=15):
        """Sends bytes exactly as given over TLS; returns (status, headers, body text)."""
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as tcp:
            with self.ctx.wrap_socket(tcp, server_hostname="localhost") as tls:
                tls.sendall(request)
                data = b""
                while True:
                    try:
                        chunk = tls.recv(65536)
                    except (ssl.SSLError, ConnectionResetError):
                        break
                    if not chunk:
                        break
                    data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and lines[0] else 0
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            out, rest = b"", body
            while rest:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0] or b"0", 16)
                if size == 0:
                    break
                out, rest = out + rest[:size], rest[size + 2:]
            body = out
        return status, headers, body.decode(errors="replace")

    def request(self, port, method, path, key=None, body=None, headers=None):
        """One HTTP/1.1 request (path and header values as bytes or text, sent verbatim)."""
        path = path if isinstance(path, bytes) else path.encode()
        lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: localhost",
                 b"Connection: close"]
        if key is not None:
            lines.append(b"Authorization: Bearer " + (key if isinstance(key, bytes) else key.encode()))
        payload = b""
        if body is not None:
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            lines += [b"Content-Type: application/json",
                      b"Content-Length: " + str(len(payload)).encode()]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}".encode())
        return self.raw(port, b"\r\n".join(lines) + b"\r\n\r\n" + payload)

    def rest(self, port, key):
        return self.request(port, "GET", "/v1/sandboxes", key)[0]

    def mcp(self, port, key):
        h = {"Accept": "application/json, text/event-stream"}
        status, _, _ = self.request(port, "POST", "/mcp", key, INIT, h)
        if status != 200:
            return status
        return self.request(port, "POST", "/mcp", key, LIST, h)[0]

    def new_key(self, preset="full"):
        return self.s.cli_json("key", "create", "--account", "erin@example.com", "--preset",
                               preset)

    def error_lines(self, log):
        return [l for l in self.s.log(log).splitlines() if " ERROR " in l]

    # -- revocation ------------------------------------------------------------
    def test_revoked_through_one_gateway(self):
        made = self.new_key()
        key, key_id = made["key"], made["key_id"]
        # Both gateways have seen the key (and would trust it for ten minutes).
        for port in (self.port_one, self.port_two):
            self.assertEqual(self.rest(port, key), 200)
            self.assertEqual(self.mcp(port, key), 200)
        status, _, body = self.request(self.port_one, "DELETE", f"/v1/keys/{key_id}",
                                       self.admin_key)
        self.assertEqual(status, 200, body)
        revoked_at = time.monotonic()
        # The gateway that revoked: refused from the very next request, REST and MCP.
        self.assertEqual(self.rest(self.port_one, key), 401)
        self.assertEqual(self.mcp(self.port_one, key), 401)
        # The other gateway: as soon as the tap carries key.revoked.
        wait_for(lambda: self.rest(self.port_two, key) == 401, 10,
                 "the second gateway refusing the revoked key")
        print(f"second gateway refused the key {time.monotonic() - revoked_at:.3f} s after "
              "the revoke was answered")
        self.assertEqual(self.mcp(self.port_two, key), 401)

    def test_revoked_by_the_cli(self):
        """`sbx key revoke` goes to the broker, not to a gateway: the tap alone tells both."""
        made = self.new_key("ci")
        key = made["key"]
        for port in (self.port_one, self.port_two):
            self.assertEqual(self.mcp(port, key), 200)
        self.s.cli("key", "revoke", made["key_id"])
        revoked_at = time.monotonic()
        for port in (self.port_one, self.port_two):
            wait_for(lambda: self.mcp(port, key) == 401, 10, f"gateway on {port} refusing it")
        print(f"both gateways refused the key {time.monotonic() - revoked_at:.3f} s after "
              "`sbx key revoke` returned")
        # The tap carried it, for audit too.
        tap = self.s.cli("tap", "--since", "0", "--once", "key.revoked").stdout
        self.assertIn(made["key_id"], tap)

    def test_a_good_key_stays_good(self):
        """The ten-minute trust is real: revoking one key does not disturb another."""
        keep = self.new_key()["key"]
        other = self.new_key()
        for port in (self.port_one, self.port_two):
            self.assertEqual(self.rest(port, keep), 200)
        self.s.cli("key", "revoke", other["key_id"])
        for port in (self.port_one, self.port_two):
            self.assertEqual(self.rest(port, keep), 200)
            self.assertEqual(self.mcp(port, keep), 200)

    # -- one origin ------------------------------------------------------------
    def test_every_gateway_names_the_public_origin(self):
        """public_url: the 401's resource metadata (and with it the OAuth audience) names
        the origin clients see, whichever gateway answers."""
        answers = [self.request(port, "POST", "/mcp", None, INIT,
                                {"Accept": "application/json, text/event-stream"})
                   for port in (self.port_one, self.port_two)]
        for status, headers, _ in answers:
            self.assertEqual(status, 401)
            self.assertIn(f'resource_metadata="https://localhost:{self.port_one}/.well-known/',
                          headers["www-authenticate"])
        self.assertEqual(answers[0][1]["www-authenticate"], answers[1][1]["www-authenticate"])
        status, _, body = self.request(self.port_two, "GET",
                                       "/.well-known/oauth-protected-resource/mcp")
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["resource"], f"https://localhost:{self.port_one}/mcp")
        # A public_url that is no origin: the gateway refuses to start, and says why.
        proc = self.s.start("sbx-gateway", "--instance", "gw-bad", "--set",
                            f"listen=127.0.0.1:{free_port()}", "--set",
                            "public_url=https://sbx.example.com/mcp")
        self.assertNotEqual(proc.wait(30), 0)
        logs = "".join(self.s.log(f[:-4]) for f in os.listdir(os.path.join(self.s.dir, "logs"))
                       if f.startswith("sbx-gateway-extra"))
        self.assertIn("is not an origin", logs)

    # -- one name per worker ---------------------------------------------------
    def test_a_second_gateway_by_the_same_name_is_refused(self):
        """A gateway started with the name of a live one (gw-two) is no restart: the one
        that had the name keeps it and serves on, the newcomer exits at once saying what
        to do, and the broker's log says so."""
        gw_two = [p for p in self.s.status()["peers"] if p["instance"] == "gw-two"]
        self.assertEqual(len(gw_two), 1, gw_two)
        first_pid = gw_two[0]["pid"]
        started = time.monotonic()
        proc = self.s.start("sbx-gateway", "--instance", "gw-two", "--set",
                            f"listen=127.0.0.1:{free_port()}")
        log_name = f"sbx-gateway-extra-{len(self.s.extra) - 1}"
        self.assertEqual(proc.wait(15), 1, self.s.log(log_name))
        print(f"the second gw-two exited {time.monotonic() - started:.3f} s after its start")
        log = self.s.log(log_name)
        self.assertIn(f"instance name 'gw-two' of role gateway is in use by pid {first_pid}", log)
        self.assertIn("--instance", log)
        self.assertIn(" ERROR ", log)
        self.assertNotIn("Sanitizer", log)  # its exit is clean: no leak, no error
        # The first gw-two is registered as before and serves.
        gateways = [p for p in self.s.status()["peers"] if p["role"] == "gateway"]
        self.assertEqual(len(gateways), 2, gateways)
        self.assertEqual([p["pid"] for p in gateways if p["instance"] == "gw-two"], [first_pid])
        status, _, body = self.request(self.port_two, "GET", "/healthz")
        self.assertEqual(status, 200, body)
        self.assertTrue(json.loads(body)["broker"], body)
        self.assertEqual(self.rest(self.port_two, self.admin_key), 200)
        # The broker says so, naming both (twice at worst: a hello the newcomer had queued
        # before its refusal reached it takes the name once more, until the next heartbeat),
        # and the refused one's stay is in the log.
        warned = [l for l in self.s.log("sbx-broker").splitlines()
                  if " WARN " in l and f"pid {proc.pid} took the name of pid {first_pid}" in l]
        self.assertIn(len(warned), (1, 2), self.s.log("sbx-broker")[-2000:])
        left = self.s.cli("tap", "--since", "0", "--once", "peer.left").stdout
        self.assertIn('"conflict"', left)

    # -- the caller's errors ---------------------------------------------------
    def assert_invalid(self, answer, field=None):
        status, _, body = answer
        self.assertEqual(status, 400, body)
        error = json.loads(body)["error"]
        self.assertEqual(error["code"], "invalid_argument", body)
        if field:
            self.assertIn(field, error["message"])
        return error["message"]

    def test_bad_input_is_the_callers_error(self):
        errors_before = len(self.error_lines("sbx-gateway"))
        key = self.admin_key
        one = self.port_one
        # Names and labels out of bounds: 400 naming the field, nothing created.
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key, {"name": "n" * 200}),
                            "name")
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key,
                                         {"name": "n" * 10000}), "name")
        labels = {f"k{i}": "v" for i in range(65)}
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key, {"labels": labels}),
                            "labels")
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key,
                                         {"labels": {"k" * 65: "v"}}), "label")
        for bad in ({"te\nam": "red"}, {"team": "r\x1bed"}):
            message = self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key,
                                                       {"labels": bad}))
            self.assertIn("label", message)
        # A NUL never gets past the JSON parser (it would cut a C string short).
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key,
                                         {"labels": {"team": "\x00"}}), "JSON")
        self.assert_invalid(self.request(one, "POST", "/v1/sandboxes", key, {"name": "a\tb"}),
                            "name")
        # Invalid UTF-8 in a path, raw and percent-encoded.
        # (named as the API names them: the gateway refuses them before the broker would)
        self.assert_invalid(self.request(one, "GET", b"/v1/sandboxes/sb_\xff\xfe", key),
                            "sandboxId")
        self.assert_invalid(self.request(one, "GET", "/v1/sandboxes/sb_%FF%FE", key),
                            "sandboxId")
        self.assert_invalid(self.request(one, "DELETE", "/v1/snapshots/snap_%C3%28", key),
                            "snapshotId")
        # Invalid UTF-8 or control bytes in Authorization: a malformed request, on every door.
        for token in (b"sbx_\xff\xfe\xfd", b"sbx_abc\x01def"):
            self.assert_invalid(self.request(one, "GET", "/v1/sandboxes", token))
            status, _, body = self.request(one, "POST", "/mcp", token, INIT,
                                           {"Accept": "application/json, text/event-stream"})
            self.assertEqual(status, 400, body)
            self.assertNotIn("unavailable", body)
        # MCP: the same limits as a tool error with the code, not a transport failure.
        h = {"Accept": "application/json, text/event-stream"}
        status, _, body = self.request(one, "POST", "/mcp", key, INIT, h)
        self.assertEqual(status, 200, body)
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "create_sandbox", "arguments": {"name": "n" * 200}}}
        status, _, body = self.request(one, "POST", "/mcp", key, call, h)
        self.assertEqual(status, 200, body)
        result = json.loads(body)["result"]
        self.assertTrue(result["isError"], result)
        self.assertIn("invalid_argument", result["content"][0]["text"])
        self.assertNotIn("unavailable", result["content"][0]["text"])
        # Nothing was created, nothing broke, and no request cost an ERROR line.
        status, _, body = self.request(one, "GET", "/v1/sandboxes", key)
        self.assertEqual((status, json.loads(body)["sandboxes"]), (200, []))
        self.assertEqual(self.error_lines("sbx-gateway")[errors_before:], [])
        self.assertEqual(self.error_lines("sbx-broker"), [])


if __name__ == "__main__":
    main()
