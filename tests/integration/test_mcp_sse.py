"""MCP's legacy HTTP+SSE transport (2024-11-05) beside /mcp (issue 15): GET /sse opens the
event stream whose `endpoint` event names where to POST; answers come back as `message`
events. The same credentials (401 with the same WWW-Authenticate), tools and texts as
/mcp; both reference scenarios through the official SDK's SSEClientTransport."""
import http.client
import json
import os
import ssl
import unittest

from sbxtest import (BIN, Sbx, free_port, listening_ports, main, reference_scenarios, run_sdk,
                     wait_for)


class McpSseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "mcpsse", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key_a = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]
        cls.key_b = cls.s.cli_json("account", "create", "--email", "bob@example.com")["api_key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def connect(self):
        ctx = ssl.create_default_context(cafile=self.s.status()["ca_cert"])
        return http.client.HTTPSConnection("localhost", self.s.listen_port(), context=ctx,
                                           timeout=60)

    def events(self, res):
        """(event, data) pairs from an open SSE answer, as they arrive."""
        kind, data = None, []
        while True:
            line = res.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line == "":
                if kind or data:
                    yield kind, "\n".join(data)
                kind, data = None, []
            elif line.startswith(":"):
                continue  # a keepalive comment
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))

    def post(self, path, body, key, port=None):
        status, _, raw = self.s.https("POST", path, body=body if isinstance(body, str)
                                      else json.dumps(body),
                                      headers={"Content-Type": "application/json",
                                               "Authorization": f"Bearer {key}"}, port=port)
        return status, raw

    def test_the_transport(self):
        # Without a key: 401, and the same way to OAuth as /mcp.
        status, hdrs, _ = self.s.https("GET", "/sse")
        self.assertEqual(status, 401)
        www = {k.lower(): v for k, v in hdrs.items()}["www-authenticate"]
        self.assertIn("resource_metadata=", www)
        status, _, _ = self.s.https("PUT", "/sse", headers={"Authorization": f"Bearer {self.key_a}"})
        self.assertEqual(status, 405)
        conn = self.connect()
        conn.request("GET", "/sse", headers={"Accept": "text/event-stream",
                                             "Authorization": f"Bearer {self.key_a}"})
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        self.assertTrue(res.getheader("Content-Type").startswith("text/event-stream"))
        events = self.events(res)
        kind, endpoint = next(events)
        self.assertEqual(kind, "endpoint")
        self.assertRegex(endpoint, r"^/messages\?sessionId=sse_[0-9A-Za-z_-]+$")
        # Messages go in by POST (202 at once), answers come out on the stream.
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        self.assertEqual(self.post(endpoint, init, self.key_a)[0], 202)
        kind, data = next(events)
        answer = json.loads(data)
        self.assertEqual((kind, answer["id"]), ("message", 1))
        self.assertEqual(answer["result"]["protocolVersion"], "2024-11-05")
        self.assertEqual(answer["result"]["serverInfo"]["name"], "sbx")
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0",
                                              "method": "notifications/initialized"},
                                   self.key_a)[0], 202)
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                   self.key_a)[0], 202)
        kind, data = next(events)
        self.assertEqual(len(json.loads(data)["result"]["tools"]), 22)
        # The tools are /mcp's: a refusal reads the same.
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                              "params": {"name": "delete_sandbox",
                                                         "arguments": {}}}, self.key_a)[0], 202)
        kind, data = next(events)
        self.assertEqual(json.loads(data)["result"]["content"][0]["text"],
                         "sandboxId is required: the exact id (sb_…) of one sandbox; "
                         "delete_sandbox has no default")
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 4, "method": "nope"},
                                   self.key_a)[0], 202)
        kind, data = next(events)
        self.assertEqual(json.loads(data)["error"]["code"], -32601)
        # Not JSON-RPC: 400; another account's stream, or none: 404.
        self.assertEqual(self.post(endpoint, "{not json", self.key_a)[0], 400)
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 5, "method": "ping"},
                                   self.key_b)[0], 404)
        self.assertEqual(self.post("/messages?sessionId=sse_nope", {"jsonrpc": "2.0", "id": 6,
                                                                     "method": "ping"},
                                   self.key_a)[0], 404)
        conn.close()

    def test_posts_through_another_gateway(self):
        # Behind a balancer a stream's POSTs may reach a gateway that does not hold it: that
        # one sends them on through the broker (sse.message), and the answers come out on
        # the stream as ever. Another account's stream, or none: 404 there too.
        two = free_port()
        self.s.start("sbx-gateway", "--instance", "gw-two", "--set", f"listen=127.0.0.1:{two}")
        wait_for(lambda: two in listening_ports() and [
            p["role"] for p in self.s.status()["peers"]].count("gateway") == 2, 30,
            "a second gateway, gw-two, listening and known to the broker")
        conn = self.connect()
        conn.request("GET", "/sse", headers={"Accept": "text/event-stream",
                                             "Authorization": f"Bearer {self.key_a}"})
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        events = self.events(res)
        kind, endpoint = next(events)
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        self.assertEqual(self.post(endpoint, init, self.key_a, port=two)[0], 202)
        kind, data = next(events)
        self.assertEqual((kind, json.loads(data)["id"]), ("message", 1))
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                              "params": {"name": "delete_sandbox",
                                                         "arguments": {}}},
                                   self.key_a, port=two)[0], 202)
        kind, data = next(events)
        answer = json.loads(data)
        self.assertEqual(answer["id"], 2)
        self.assertIn("sandboxId is required", answer["result"]["content"][0]["text"])
        self.assertEqual(self.post(endpoint, "{not json", self.key_a, port=two)[0], 400)
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 3, "method": "ping"},
                                   self.key_b, port=two)[0], 404)
        status, raw = self.post("/messages?sessionId=sse_nope", {"jsonrpc": "2.0", "id": 4,
                                                                  "method": "ping"},
                                self.key_a, port=two)
        self.assertEqual((status, raw), (404, b"no such stream: open one with GET /sse"))
        # An id longer than any stream's (64) is nobody's, said at once (no gateway asked).
        status, raw = self.post("/messages?sessionId=sse_" + "x" * 70, {"jsonrpc": "2.0", "id": 4,
                                                                          "method": "ping"},
                                self.key_a, port=two)
        self.assertEqual((status, raw), (404, b"no such stream: open one with GET /sse"))
        # The stream still answers what comes to its own gateway.
        self.assertEqual(self.post(endpoint, {"jsonrpc": "2.0", "id": 5, "method": "ping"},
                                   self.key_a)[0], 202)
        kind, data = next(events)
        self.assertEqual(json.loads(data), {"jsonrpc": "2.0", "id": 5, "result": {}})
        conn.close()

    def test_sdk_sse_client(self):
        def run(*calls):
            return run_sdk(self, self.s, self.key_a, *calls, sdk="v1-sse")
        steps_a, _ = reference_scenarios(self, run)
        connect = [x for x in steps_a if x["step"] == "connect"][0]
        self.assertEqual(connect["transport"], "sse")


if __name__ == "__main__":
    main()
