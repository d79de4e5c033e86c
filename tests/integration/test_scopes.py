"""Scopes hold for every object (issue 13, item 3): one table, every key preset against
every MCP tool and every REST route, on sandboxes and snapshots of its own, of another key
of the same account and of another account. The real daemons under `sbx up` and real
guests; the expectation is computed from the rules of docs/rest.md, never recorded:

- another account's objects are not there (not_found), for every preset;
- a ci key sees only what it created: another key's objects are not there either;
- read-only may only read (permission_denied otherwise); no-delete may not delete;
- everything else is allowed, and is seen to work.

The table must name every route of the OpenAPI document and every tool of tools/list,
so a new one cannot slip past it."""
import json
import os
import ssl
import http.client
import unittest

from sbxtest import BIN, Sbx, main

PRESETS = ["full", "ci", "read-only", "no-delete"]
OWNERS = ["own", "other_key", "other_account"]

# op → (kind, object, REST route, MCP tool). kind: read, list, write, delete, create.
# Objects: sandbox, snapshot or none. The route and tool are what the op exercises.
OPS = {
    "get_sandbox":      ("read", "sandbox", "GET /v1/sandboxes/{sandboxId}", "get_sandbox"),
    "get_sandbox_metrics": ("read", "sandbox", "GET /v1/sandboxes/{sandboxId}/metrics",
                            "get_sandbox_metrics"),
    "list_sandboxes":   ("list", "sandbox", "GET /v1/sandboxes", "list_sandboxes"),
    "exec":             ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/exec", "exec"),
    "command_status":   ("read", "sandbox", "GET /v1/sandboxes/{sandboxId}/processes/{processId}",
                         "command_status"),
    "kill_command":     ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/processes/{processId}/kill",
                         "kill_command"),
    "list_commands":    ("read", "sandbox", "GET /v1/sandboxes/{sandboxId}/processes",
                         "list_commands"),
    "open_terminal":    ("write", "sandbox", "GET /v1/sandboxes/{sandboxId}/terminal", None),
    "read_file":        ("read", "sandbox", "GET /v1/sandboxes/{sandboxId}/files", "read_file"),
    "write_file":       ("write", "sandbox", "PUT /v1/sandboxes/{sandboxId}/files", "write_file"),
    "host_port":        ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/ports", "host_port"),
    "unpublish_port":   ("write", "sandbox", "DELETE /v1/sandboxes/{sandboxId}/ports/{port}", None),
    "extend_sandbox":   ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/extend", "extend_sandbox"),
    "rename_sandbox":   ("write", "sandbox", "PATCH /v1/sandboxes/{sandboxId}", "rename_sandbox"),
    "label_sandbox":    ("write", "sandbox", "PATCH /v1/sandboxes/{sandboxId}", "label_sandbox"),
    "set_sandbox_egress": ("write", "sandbox", "PATCH /v1/sandboxes/{sandboxId}", "set_sandbox_egress"),
    "stop_sandbox":     ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/stop", "stop_sandbox"),
    "resume_sandbox":   ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/resume", "resume_sandbox"),
    "save_snapshot":    ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/snapshots", "save_snapshot"),
    "fork_sandbox":     ("write", "sandbox", "POST /v1/sandboxes/{sandboxId}/fork", "fork_sandbox"),
    "delete_sandbox":   ("delete", "sandbox", "DELETE /v1/sandboxes/{sandboxId}", "delete_sandbox"),
    "get_snapshot":     ("read", "snapshot", "GET /v1/snapshots/{snapshotId}", None),
    "list_snapshots":   ("list", "snapshot", "GET /v1/snapshots", "list_snapshots"),
    "copy_snapshot":    ("write", "snapshot", "POST /v1/sandboxes", "create_sandbox"),
    "delete_snapshot":  ("delete", "snapshot", "DELETE /v1/snapshots/{snapshotId}", "delete_snapshot"),
    "create_sandbox":   ("create", None, "POST /v1/sandboxes", "create_sandbox"),
    "usage":            ("account", None, "GET /v1/usage", None),
    "list_keys":        ("account", None, "GET /v1/keys", None),
    "revoke_key":       ("keys", None, "DELETE /v1/keys/{keyId}", None),
    "list_webhooks":    ("account", None, "GET /v1/webhooks", None),
    "get_webhook":      ("account", None, "GET /v1/webhooks/{webhookId}", None),
    "list_webhook_deliveries": ("account", None, "GET /v1/webhooks/{webhookId}/deliveries", None),
    "create_webhook":   ("keys", None, "POST /v1/webhooks", None),
    "delete_webhook":   ("keys", None, "DELETE /v1/webhooks/{webhookId}", None),
    "openapi":          ("public", None, "GET /v1/openapi.json", None),
    "list_templates":   ("account", None, "GET /v1/templates", None),
    # An empty body: refused for what it is, once the key may build at all (a real build
    # runs in integration.templates).
    "build_template":   ("build", None, "POST /v1/templates", None),
    # Nobody's build: not found whoever asks (another account's: integration.templates).
    "get_template_build": ("nobuild", None, "GET /v1/templates/builds/{buildId}", None),
}
# Sandbox ops in the order they run on one object: reads and harmless writes first, the
# stop and resume pair, then the save; deletes run on objects made for them.
SANDBOX_ORDER = ["get_sandbox", "get_sandbox_metrics", "list_sandboxes", "exec", "command_status", "kill_command",
                 "list_commands", "open_terminal",
                 "read_file", "write_file", "host_port", "unpublish_port", "extend_sandbox",
                 "rename_sandbox", "label_sandbox", "fork_sandbox", "stop_sandbox",
                 "set_sandbox_egress",
                 "resume_sandbox",
                 "save_snapshot"]
SNAPSHOT_ORDER = ["get_snapshot", "list_snapshots", "copy_snapshot"]


def visible(preset, owner):
    return owner == "own" or (owner == "other_key" and preset != "ci")


def expected(preset, owner, op):
    """The outcomes the rules allow: a set of 'ok', 'listed', 'absent' or error codes."""
    kind = OPS[op][0]
    if kind == "public":
        return {"ok"}
    if kind == "account":
        return {"ok"}
    if kind == "keys":
        return {"ok"} if preset == "full" else {"permission_denied"}
    if kind == "create":
        return {"permission_denied"} if preset == "read-only" else {"ok"}
    if kind == "build":
        return {"permission_denied"} if preset == "read-only" else {"invalid_argument"}
    if kind == "nobuild":
        return {"not_found"}
    if kind == "list":
        return {"listed"} if visible(preset, owner) else {"absent"}
    forbidden = (preset == "read-only" and kind != "read") or \
                (preset == "no-delete" and kind == "delete")
    if visible(preset, owner):
        return {"permission_denied"} if forbidden else {"ok"}
    # Not there: a gateway may refuse a read-only key's write before it asks anyone.
    return {"not_found", "permission_denied"} if forbidden else {"not_found"}


class ScopesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "scopes", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            # Limits are not what this test is about: many guests and many requests.
            "plan.free.running": 0, "plan.free.starts_per_day": 0,
            "plan.free.requests_per_second": 0, "vmd.capacity": 16})
        cls.s.up()
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])
        a = cls.s.cli_json("account", "create", "--email", "alice@example.com")
        b = cls.s.cli_json("account", "create", "--email", "bob@example.com")
        cls.admin_a, cls.key_b = a["api_key"], b["api_key"]
        cls.account_a = a["account_id"]
        # A webhook the account-wide reads look at (.example never resolves: its
        # deliveries fail at once and stay out of the way).
        cls.webhook = cls.s.cli_json("webhook", "create", "https://hooks.example/scopes",
                                     "--events", "sandbox.error", "--account", cls.account_a)["id"]
        cls.keys = {p: cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                      "--preset", p)["key"] for p in PRESETS}
        cls.other_key = cls.s.cli_json("key", "create", "--account", "alice@example.com",
                                       "--preset", "full")["key"]
        cls.sessions = {}

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- the two doors ---------------------------------------------------------
    def http(self, method, path, key, body=None, raw=False, headers=None, timeout=300):
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=self.ctx,
                                           timeout=timeout)
        h = dict(headers or {})
        if key:
            h["Authorization"] = f"Bearer {key}"
        if body is not None and not raw:
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=h)
            res = conn.getresponse()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
        finally:
            conn.close()

    def rest(self, method, path, key, body=None, raw=False):
        """(outcome, parsed body): outcome 'ok' for 2xx, else the error code."""
        status, _, data = self.http(method, path, key, body, raw)
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data
        if 200 <= status < 300:
            return "ok", parsed
        return parsed["error"]["code"], parsed

    def mcp_post(self, key, message):
        h = {"Accept": "application/json, text/event-stream"}
        if key in self.sessions:
            h["Mcp-Session-Id"] = self.sessions[key]
        status, headers, data = self.http("POST", "/mcp", key, message, headers=h)
        self.assertIn(status, (200, 202), data)
        if "mcp-session-id" in headers:
            self.sessions[key] = headers["mcp-session-id"]
        return json.loads(data) if data else None

    def mcp(self, key, tool, args):
        """(outcome, structuredContent or text): 'ok', or the code a tool error names."""
        if key not in self.sessions:
            self.mcp_post(key, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "scopes", "version": "0"}}})
        answer = self.mcp_post(key, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                     "params": {"name": tool, "arguments": args}})
        result = answer["result"]
        text = result["content"][0]["text"]
        if result.get("isError"):
            code = text.rsplit("(", 1)[-1].rstrip(")") if text.endswith(")") else text
            return code, text
        return "ok", result.get("structuredContent", text)

    # -- fixtures --------------------------------------------------------------
    def create(self, key, **body):
        outcome, sb = self.rest("POST", "/v1/sandboxes", key, body)
        self.assertEqual(outcome, "ok", sb)
        return sb["id"]

    def save(self, key, sid):
        outcome, snap = self.rest("POST", f"/v1/sandboxes/{sid}/snapshots", key, {})
        self.assertEqual(outcome, "ok", snap)
        return snap["id"]

    def sleeper(self, key, sid):
        outcome, proc = self.rest("POST", f"/v1/sandboxes/{sid}/exec", key,
                                  {"command": "sleep 3600", "detached": True})
        self.assertEqual(outcome, "ok", proc)
        return proc["processId"]

    def owner_key(self, preset, owner):
        return {"own": self.keys[preset], "other_key": self.other_key,
                "other_account": self.key_b}[owner]

    def cleanup_sandbox(self, sid):
        """Deleted by an operator, whatever the test did to it."""
        self.s.cli("sandbox", "delete", sid, check=False, timeout=120)

    # -- one op through one door ----------------------------------------------
    def run_op(self, door, op, key, sid=None, pid=None, snap=None):
        """Runs op through door ('rest' or 'mcp'); returns the outcome."""
        kind, _, route, tool = OPS[op]
        if door == "rest":
            method, path = route.split(" ")
            path = path.replace("{snapshotId}", snap or "").replace("{sandboxId}", sid or "")
            path = path.replace("{processId}", str(pid)).replace("{port}", "8000")
            body, raw = None, False
            if op == "exec":
                body = {"command": "true"}
            elif op == "kill_command":
                body = {"signal": "SIGCONT"}  # harmless: the sleeper lives on
            elif op == "read_file":
                path += "?path=/etc/hostname"
            elif op == "write_file":
                path += "?path=/tmp/scopes.txt"
                body, raw = b"scoped", True
            elif op == "host_port":
                body = {"port": 8000}
            elif op == "extend_sandbox":
                body = {"ttlSeconds": 3600}
            elif op == "rename_sandbox":
                body = {"name": "renamed"}
            elif op == "label_sandbox":
                body = {"labels": {"scope": "yes"}}
            elif op == "set_sandbox_egress":
                body = {"egress": {"deny": ["198.51.100.7"]}}
            elif op in ("save_snapshot", "create_sandbox"):
                body = {}
            elif op == "fork_sandbox":
                body = {"count": 1}
            elif op == "copy_snapshot":
                body = {"snapshotId": snap}
            elif op == "revoke_key":
                victim = self.s.cli_json("key", "create", "--account", "alice@example.com",
                                         "--preset", "full")
                path = route.split(" ")[1].replace("{keyId}", victim["key_id"])
            elif op == "create_webhook":
                body = {"url": "https://hooks.example/scoped", "events": ["sandbox.error"]}
            elif op == "delete_webhook":
                victim = self.s.cli_json("webhook", "create", "https://hooks.example/victim",
                                         "--events", "sandbox.error", "--account", self.account_a)
                path = path.replace("{webhookId}", victim["id"])
            path = path.replace("{webhookId}", self.webhook)
            path = path.replace("{buildId}", "bld_0000000000")
            if op == "build_template":
                path += "?name=scoped"
                body, raw = b"", True
            if op == "open_terminal":
                # The WebSocket handshake: 101 is the terminal opened (closing it ends it).
                status, _, data = self.http(method, path + "?command=true", key, headers={
                    "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
                return "ok" if status == 101 else json.loads(data)["error"]["code"]
            outcome, answer = self.rest(method, path, key if kind != "public" else None, body, raw)
        else:
            # Only the tools that act on one sandbox take one (unknown arguments are
            # refused, as on REST).
            args = {"sandboxId": sid} if OPS[op][1] == "sandbox" and kind != "list" else {}
            args.update({
                "exec": {"command": "true"},
                "command_status": {"processId": pid},
                "kill_command": {"processId": pid, "signal": "SIGCONT"},
                "read_file": {"path": "/etc/hostname"},
                "write_file": {"path": "/tmp/scopes.txt", "content": "scoped"},
                "host_port": {"port": 8000},
                "extend_sandbox": {"ttlSeconds": 3600},
                "rename_sandbox": {"name": "renamed"},
                "label_sandbox": {"labels": {"scope": "yes"}},
                "set_sandbox_egress": {"egress": {"deny": ["198.51.100.7"]}},
                "save_snapshot": {"name": "scoped"},
                "fork_sandbox": {"count": 1},
                "copy_snapshot": {"snapshotId": snap},
                "delete_snapshot": {"snapshotId": snap},
            }.get(op, {}))
            outcome, answer = self.mcp(key, tool, args)
        if kind == "list" and outcome == "ok":
            items = answer["sandboxes" if OPS[op][1] == "sandbox" else "snapshots"]
            wanted = sid if OPS[op][1] == "sandbox" else snap
            outcome = "listed" if any(i["id"] == wanted for i in items) else "absent"
        # What an allowed op made is cleaned up by an operator (a copy, a snapshot).
        if outcome == "ok" and op in ("copy_snapshot", "create_sandbox"):
            self.cleanup_sandbox(answer["id"])
        if outcome == "ok" and op == "fork_sandbox":
            for copy in answer["sandboxes"]:
                self.cleanup_sandbox(copy["id"])
        return outcome

    # -- the table -------------------------------------------------------------
    def test_every_preset_every_door_every_owner(self):
        results = []  # (preset, owner, op, door, outcome, expected)

        def check(preset, owner, op, door, outcome):
            want = expected(preset, owner, op)
            results.append((preset, owner, op, door, outcome, want))

        # Objects of another key and of another account, shared by every preset's rows
        # (nothing run on them can delete them unless the rules are broken).
        shared = {}
        for owner in ("other_key", "other_account"):
            key = self.owner_key("full", owner)
            sid = self.create(key, name=f"{owner}-box")
            shared[owner] = (sid, self.sleeper(key, sid), self.save(key, sid))
        for preset in PRESETS:
            own = None
            if preset != "read-only":  # a read-only key cannot make anything of its own
                key = self.keys[preset]
                sid = self.create(key, name=f"{preset}-box")
                own = (sid, self.sleeper(key, sid), self.save(key, sid))
            for owner in OWNERS:
                objects = own if owner == "own" else shared[owner]
                if objects is None:
                    continue
                sid, pid, snap = objects
                for door in ("rest", "mcp"):
                    for op in SANDBOX_ORDER + SNAPSHOT_ORDER:
                        if (door == "rest" and OPS[op][2] is None) or \
                                (door == "mcp" and OPS[op][3] is None):
                            continue
                        check(preset, owner, op, door, self.run_op(
                            door, op, self.keys[preset], sid=sid, pid=pid, snap=snap))
                # Deletes last: a delete the rules allow gets objects made for it by their
                # owner; one they refuse is tried on the objects above, which it must leave.
                for door in ("rest", "mcp"):
                    victim, victim_snap = sid, snap
                    if expected(preset, owner, "delete_sandbox") == {"ok"}:
                        owner_key = self.owner_key(preset, owner)
                        victim = self.create(owner_key, name="to-delete")
                        victim_snap = self.save(owner_key, victim)
                    outcome = self.run_op(door, "delete_snapshot", self.keys[preset],
                                          snap=victim_snap)
                    check(preset, owner, "delete_snapshot", door, outcome)
                    outcome = self.run_op(door, "delete_sandbox", self.keys[preset], sid=victim)
                    check(preset, owner, "delete_sandbox", door, outcome)
                    if outcome != "ok" and victim != sid:
                        self.cleanup_sandbox(victim)
            # Account-wide routes and tools.
            for op in ("create_sandbox", "usage", "list_keys", "revoke_key", "openapi",
                       "list_webhooks", "get_webhook", "list_webhook_deliveries",
                       "create_webhook", "delete_webhook", "list_templates", "build_template",
                       "get_template_build"):
                for door in ("rest", "mcp"):
                    if (door == "rest" and OPS[op][2] is None) or \
                            (door == "mcp" and OPS[op][3] is None):
                        continue
                    check(preset, "-", op, door, self.run_op(door, op, self.keys[preset]))
            if own:
                self.cleanup_sandbox(own[0])

        # The whole table, then the verdict: every row as the rules say.
        wrong = [r for r in results if r[4] not in r[5]]
        for r in results:
            print(f"{r[0]:10} {r[1]:14} {r[2]:16} {r[3]:5} {r[4]:18}"
                  f"{'' if r[4] in r[5] else '  WRONG, expected ' + '/'.join(sorted(r[5]))}")
        print(f"{len(results)} rows, {len(wrong)} wrong")
        self.assertEqual(wrong, [])
        # The rows cover every preset, every owner, and both doors of each op.
        covered = {(r[0], r[1], r[2], r[3]) for r in results}
        for preset in PRESETS:
            for op, (kind, obj, route, tool) in OPS.items():
                owners = OWNERS if obj else ["-"]
                for owner in owners:
                    if preset == "read-only" and owner == "own":
                        continue
                    for door, present in (("rest", route), ("mcp", tool)):
                        if present:
                            self.assertIn((preset, owner, op, door), covered)

    def test_table_names_every_route_and_tool(self):
        """A route or tool added later must get a row here."""
        status, _, data = self.http("GET", "/v1/openapi.json", None)
        self.assertEqual(status, 200)
        spec = json.loads(data)
        routes = {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item
                  if m in ("get", "post", "put", "patch", "delete")}
        self.assertEqual(routes - {OPS[op][2] for op in OPS}, set())
        answer = self.mcp_post(self.admin_a, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                              "params": {"protocolVersion": "2025-06-18",
                                                         "capabilities": {}, "clientInfo": {
                                                             "name": "scopes", "version": "0"}}})
        self.assertIn("result", answer)
        tools = self.mcp_post(self.admin_a, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        names = {t["name"] for t in tools["result"]["tools"]}
        self.assertEqual(names - {OPS[op][3] for op in OPS}, set())


if __name__ == "__main__":
    main()
