"""MCP 2026-07-28 on /mcp beside the 2025 era (issue 15): the stateless requests the spec
asks for (server/discover, _meta and header checks with its codes and statuses,
resultType, cache hints, 404 + -32601 for what is not a 2026 method), the default sandbox
of a credential instead of a session's, and both reference scenarios through the official
SDK v2 client, in auto mode and pinned to 2026-07-28, on a real gateway and real guests."""
import base64
import json
import os
import signal
import time
import unittest

from sbxtest import BIN, Sbx, main, reference_scenarios, run_sdk, wait_for

V = "2026-07-28"
NAMES = ["create_sandbox", "list_sandboxes", "get_sandbox", "get_sandbox_metrics", "exec",
         "command_status", "kill_command", "list_commands", "read_file", "write_file", "host_port",
         "stop_sandbox",
         "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox",
         "delete_sandbox", "save_snapshot", "list_snapshots", "delete_snapshot",
         "set_sandbox_egress", "fork_sandbox"]


def meta(version=V, caps=True, info=True):
    m = {"io.modelcontextprotocol/protocolVersion": version}
    if caps:
        m["io.modelcontextprotocol/clientCapabilities"] = {}
    if info:
        m["io.modelcontextprotocol/clientInfo"] = {"name": "test", "version": "0"}
    return m


class Mcp2026Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "mcp2026", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        cls.key_a = a["api_key"]
        cls.key_a2 = cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                    "--preset", "full")["key"]
        cls.key_b = cls.s.cli_json("account", "create", "--email", "bob@example.com")["api_key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def rpc(self, method, params=None, key=None, rid=1, headers=None, version=V, name=None):
        """One 2026-07-28 request: the spec's headers unless headers replace them."""
        body = {"jsonrpc": "2.0", "method": method,
                "params": {"_meta": meta(version)} if params is None else params}
        if rid is not None:
            body["id"] = rid
        h = {"Content-Type": "application/json",
             "Accept": "application/json, text/event-stream",
             "MCP-Protocol-Version": version, "Mcp-Method": method}
        if method == "tools/call":
            h["Mcp-Name"] = name if name is not None else body["params"].get("name", "")
        if key is not False:
            h["Authorization"] = f"Bearer {key or self.key_a}"
        for k, v in (headers or {}).items():
            if v is None:
                h.pop(k, None)
            else:
                h[k] = v
        status, hdrs, raw = self.s.https("POST", "/mcp", body=json.dumps(body), headers=h)
        return status, {k.lower(): v for k, v in hdrs.items()}, json.loads(raw) if raw else None

    def call(self, tool, args, key=None):
        status, _, body = self.rpc("tools/call", {"name": tool, "arguments": args,
                                                  "_meta": meta()}, key=key)
        self.assertEqual(status, 200, body)
        result = body["result"]
        self.assertEqual(result["resultType"], "complete")
        text = result["content"][0]["text"]
        print(f"  {tool} {json.dumps(args)[:100]} → {text[:160]!r}")
        return result, text

    def initialize_2025(self, key):
        """A 2025-06-18 session of key on the same /mcp: its Mcp-Session-Id."""
        status, hdrs, _ = self.s.https("POST", "/mcp", body=json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"}}}),
            headers={"Content-Type": "application/json",
                     "Accept": "application/json, text/event-stream",
                     "Authorization": f"Bearer {key}"})
        self.assertEqual(status, 200)
        return {k.lower(): v for k, v in hdrs.items()}.get("mcp-session-id")

    def assertRpcError(self, answer, status, code, rid=1):
        self.assertEqual(answer[0], status, answer[2])
        self.assertEqual(answer[2]["error"]["code"], code, answer[2])
        self.assertEqual(answer[2]["id"], rid)  # every error names the request it answers
        return answer[2]["error"]

    # -- the protocol ----------------------------------------------------------
    def test_discover_and_list(self):
        status, hdrs, body = self.rpc("server/discover")
        self.assertEqual(status, 200, body)
        self.assertNotIn("mcp-session-id", hdrs)  # no sessions in this era
        d = body["result"]
        self.assertEqual(d["resultType"], "complete")
        self.assertEqual(d["supportedVersions"], [V])
        self.assertIn("tools", d["capabilities"])
        self.assertNotIn("listChanged", d["capabilities"]["tools"])
        self.assertIsInstance(d["ttlMs"], int)
        self.assertIn(d["cacheScope"], ("public", "private"))
        self.assertEqual(d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "sbx")
        self.assertIn("API key", d["instructions"])
        status, _, body = self.rpc("tools/list")
        self.assertEqual(status, 200, body)
        listed = body["result"]
        self.assertEqual(listed["resultType"], "complete")
        self.assertGreaterEqual(listed["ttlMs"], 0)
        self.assertIn(listed["cacheScope"], ("public", "private"))
        self.assertEqual([t["name"] for t in listed["tools"]], NAMES)
        # clientInfo is optional.
        status, _, body = self.rpc("tools/list", {"_meta": meta(info=False)})
        self.assertEqual(status, 200, body)

    def test_what_the_spec_refuses(self):
        # A malformed envelope: 400, -32602.
        self.assertRpcError(self.rpc("server/discover", {}), 400, -32602)
        self.assertRpcError(self.rpc("server/discover", {"_meta": meta(caps=False)}), 400, -32602)
        no_version = {"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}
        self.assertRpcError(self.rpc("server/discover", no_version), 400, -32602)
        # The header disagrees with the body: -32020, before the version is judged.
        self.assertRpcError(self.rpc("tools/list", {"_meta": meta("v999.0.0")},
                                     headers={"MCP-Protocol-Version": V}), 400, -32020)
        self.assertRpcError(self.rpc("tools/list", headers={"MCP-Protocol-Version": None}),
                            400, -32020)
        # An unsupported version: -32022 naming what is supported and what was asked.
        error = self.assertRpcError(self.rpc("tools/list", version="v999.0.0"), 400, -32022)
        self.assertEqual(error["data"], {"supported": [V], "requested": "v999.0.0"})
        # Mcp-Method must say the body's method, exactly (its name in any case).
        self.assertRpcError(self.rpc("tools/list", headers={"Mcp-Method": "prompts/list"}),
                            400, -32020)
        self.assertRpcError(self.rpc("tools/list", headers={"Mcp-Method": "TOOLS/LIST"}),
                            400, -32020)
        self.assertRpcError(self.rpc("tools/list", headers={"Mcp-Method": None}), 400, -32020)
        status, _, _ = self.rpc("tools/list", headers={"Mcp-Method": None,
                                                       "mcp-method": "tools/list"})
        self.assertEqual(status, 200)
        # Mcp-Name must name the tool; spaces around it are allowed.
        args = {"name": "list_sandboxes", "arguments": {}, "_meta": meta()}
        self.assertRpcError(self.rpc("tools/call", args, name="wrong_tool_name"), 400, -32020)
        self.assertRpcError(self.rpc("tools/call", args, headers={"Mcp-Name": None}),
                            400, -32020)
        status, _, body = self.rpc("tools/call", args, name="  list_sandboxes  ")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["result"]["resultType"], "complete")
        # What is not a method of this revision: 404, -32601.
        for method in ("initialize", "ping", "logging/setLevel", "resources/subscribe",
                       "prompts/list", "unknown/method"):
            self.assertRpcError(self.rpc(method), 404, -32601)
        # A notification is accepted with nothing to answer; no key is 401 as ever.
        status, _, _ = self.rpc("notifications/cancelled", rid=None)
        self.assertEqual(status, 202)
        status, hdrs, _ = self.rpc("server/discover", key=False)
        self.assertEqual(status, 401)
        self.assertIn("resource_metadata=", hdrs["www-authenticate"])
        # An unknown tool is a JSON-RPC error of the call, on 200.
        status, _, body = self.rpc("tools/call", {"name": "nope", "arguments": {},
                                                  "_meta": meta()})
        self.assertEqual((status, body["error"]["code"]), (200, -32602))
        # The 2025 era is untouched on the same endpoint.
        self.assertTrue(self.initialize_2025(self.key_a))

    # -- the default sandbox is the credential's ---------------------------------
    def test_default_sandbox_of_a_credential(self):
        r, text = self.call("get_sandbox", {}, key=self.key_b)
        self.assertTrue(r["isError"])
        self.assertIn("create_sandbox first", text)
        r, text = self.call("create_sandbox", {"name": "stateless", "env": {"GREETING": "hi"}})
        self.assertFalse(r.get("isError"), text)
        sb = r["structuredContent"]["id"]
        self.assertTrue(text.startswith(f"Sandbox {sb} is ready. URL: https://"))
        # The next requests name no sandbox and no session: the key's default, and the env
        # its create gave.
        r, text = self.call("exec", {"command": "echo $GREETING; hostname"})
        self.assertTrue(text.startswith("Exit code 0.\nstdout:\nhi\n"), text)
        r, text = self.call("get_sandbox", {})
        self.assertEqual(r["structuredContent"]["id"], sb)
        # A file over 1 MiB is answered as it is read (gw_b64_stream), resultType first.
        blob = bytes(range(256)) * 6000
        r, text = self.call("write_file", {"path": "/root/b.bin", "encoding": "base64",
                                           "content": base64.b64encode(blob).decode()})
        self.assertFalse(r.get("isError"), text)
        r, text = self.call("read_file", {"path": "/root/b.bin", "encoding": "base64"})
        self.assertEqual(base64.b64decode(r["structuredContent"]["content"]), blob)
        self.assertEqual(r["structuredContent"]["size"], len(blob))
        # Another key of the account has a default of its own (none yet); another
        # account cannot see the sandbox.
        r, text = self.call("get_sandbox", {}, key=self.key_a2)
        self.assertIn("create_sandbox first", text)
        r, text = self.call("get_sandbox", {"sandboxId": sb}, key=self.key_a2)
        self.assertFalse(r.get("isError"), text)
        r, text = self.call("get_sandbox", {"sandboxId": sb}, key=self.key_b)
        self.assertEqual(text, "Sandbox not found (not_found)")
        # delete_sandbox still needs the id; once deleted, the default is gone.
        r, text = self.call("delete_sandbox", {})
        self.assertEqual(text, "sandboxId is required: the exact id (sb_…) of one sandbox; "
                               "delete_sandbox has no default")
        r, text = self.call("delete_sandbox", {"sandboxId": sb})
        self.assertFalse(r.get("isError"), text)
        r, text = self.call("exec", {"command": "true"})
        self.assertIn("create_sandbox first", text)
        # The default outlives a restart of the gateway: it is the broker's.
        r, _ = self.call("create_sandbox", {"name": "again"})
        sb = r["structuredContent"]["id"]
        gateway = self.s.daemon_pid("sbx-gateway")
        os.kill(gateway, signal.SIGKILL)
        wait_for(lambda: self.s.daemon_pid("sbx-gateway") not in (None, gateway), 60,
                 "the supervisor restarting the gateway")

        def answered():
            try:
                return self.call("get_sandbox", {})
            except (OSError, AssertionError, ValueError):
                time.sleep(0.5)  # not listening yet, or the broker not yet back to it
                return None
        r, text = wait_for(answered, 60, "the restarted gateway")
        self.assertEqual(r["structuredContent"]["id"], sb, text)
        self.call("delete_sandbox", {"sandboxId": sb})

    # -- a foreground exec whose client gives up -----------------------------------
    def process(self, sb, command):
        """list_commands' entry for command in sb (the last one so named), or None."""
        r, text = self.call("list_commands", {"sandboxId": sb}, key=self.key_a2)
        self.assertFalse(r.get("isError"), text)
        found = [p for p in r["structuredContent"]["processes"] if p["command"] == command]
        return found[-1] if found else None

    def test_cancelled_and_cut_off_exec(self):
        r, _ = self.call("create_sandbox", {"name": "cancel"}, key=self.key_a2)
        sb = r["structuredContent"]["id"]
        # Cancelled, as each SDK does it: SDK v2 pinned to 2026-07-28 closes the request's
        # stream (a JSON answer's connection, or an SSE answer when progress was asked
        # for); SDK v1 (2025) sends notifications/cancelled. Either way the process goes.
        for sdk, progress, command in (("v2-2026", False, "sleep 301"),
                                       ("v2-2026", True, "sleep 302"),
                                       ("v1", False, "sleep 303"), ("v1", True, "sleep 304")):
            with self.subTest(sdk=sdk, progress=progress):
                steps = run_sdk(self, self.s, self.key_a2, ("@abort", {
                    "ms": 4000, "tool": "exec", "progress": progress,
                    "arguments": {"sandboxId": sb, "command": command}}), sdk=sdk)
                abort = [x for x in steps if x["step"] == "abort"][0]
                self.assertIn("error", abort, abort)

                def killed():
                    p = self.process(sb, command)
                    return p if p and not p["running"] else time.sleep(0.5)
                p = wait_for(killed, 30, f"{command} killed once cancelled")
                self.assertEqual((p["exitCode"], p["signal"], p["detached"], p["timedOut"]),
                                 (137, 9, False, False), p)
        # A 2025 request whose connection drops, without notifications/cancelled: not a
        # cancellation (the 2025 spec's words). The exec runs on; list_commands finds it
        # and command_status gives its end.
        session = self.initialize_2025(self.key_a2)
        command = "sleep 6; echo kept"
        with self.assertRaises(TimeoutError):
            self.s.https("POST", "/mcp", body=json.dumps(
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "exec", "arguments": {"sandboxId": sb, "command": command}}}),
                headers={"Content-Type": "application/json",
                         "Accept": "application/json, text/event-stream",
                         "Authorization": f"Bearer {self.key_a2}", "Mcp-Session-Id": session,
                         "MCP-Protocol-Version": "2025-06-18"}, timeout=2)
        p = self.process(sb, command)
        self.assertTrue(p and p["running"], p)

        def ended():
            r, _ = self.call("command_status", {"sandboxId": sb, "processId": p["processId"]},
                             key=self.key_a2)
            return r if not r["structuredContent"]["running"] else time.sleep(0.5)
        r = wait_for(ended, 60, "the cut-off exec ending by itself")
        self.assertEqual((r["structuredContent"]["exitCode"], r["structuredContent"]["stdout"]),
                         (0, "kept\n"))
        r, text = self.call("list_commands", {"sandboxId": sb}, key=self.key_a2)
        self.assertIn(f"\n{p['processId']}  exit 0  foreground  sleep 6; echo kept", text)
        self.call("delete_sandbox", {"sandboxId": sb}, key=self.key_a2)

    # -- the official SDK v2 client ----------------------------------------------
    def test_sdk_v2_auto_and_pinned(self):
        for mode in ("v2-2026", "v2-auto"):
            with self.subTest(mode=mode):
                def run(*calls):
                    return run_sdk(self, self.s, self.key_a, *calls, sdk=mode)
                steps_a, steps_b = reference_scenarios(self, run)
                connect = [x for x in steps_a if x["step"] == "connect"][0]
                self.assertEqual((connect["era"], connect["protocolVersion"]),
                                 ("modern", V), connect)
                self.assertIsNone(connect["sessionId"])
                listed = [x for x in steps_a if x["step"] == "list"][0]
                self.assertEqual([t["name"] for t in listed["tools"]], NAMES)
        # And in its default (legacy) mode the same client speaks the 2025 era.
        steps = run_sdk(self, self.s, self.key_a, ("list_sandboxes", {}), sdk="v2-legacy")
        connect = [x for x in steps if x["step"] == "connect"][0]
        self.assertTrue(connect["sessionId"], connect)


if __name__ == "__main__":
    main()
