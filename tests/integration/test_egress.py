"""Egress rules per sandbox (issue 20 item 2), proven from inside real guests under
`sbx up`, with every destination on this machine.

A network namespace stands in for the internet: a veth pair joins it to the host, and
public addresses (1.2.3.4, 1.2.3.5, 5.6.7.8: none of the host's networks, none
special-purpose, so the fixed policy lets guests reach them) sit on its loopback, routed
from the host through the pair, each with an HTTP listener. The host reaches all three
(each target is really there). Then, from inside guests (a python probe):
  - A, created with `deny: [1.2.3.4]`, is refused 1.2.3.4 and reaches the others;
  - B, created with `allow: [1.2.3.4/31, 127.0.0.0/8, <the veth's host address>]` and
    `deny: [1.2.3.5]`, reaches 1.2.3.4 only: 1.2.3.5 is denied (deny before allow),
    5.6.7.8 is not in the allow list, and the host's loopback service and the veth's
    host address stay refused although allowed (the fixed policy wins); DNS still works;
  - set_sandbox_egress on running A (deny 5.6.7.8 instead) applies to new connections at
    once; B stopped, its rules replaced by REST PATCH (allow 5.6.7.8), resumes under them;
  - a bad entry and a domain are refused with their codes and nothing changes;
  - with the table deleted by hand, a kill -9'd vmd loads the rules again from its disk;
  - deleted sandboxes leave no rules behind.
The loaded table (`nft list table inet sbx_egress`) is read back along the way."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import unittest

from sbxtest import BIN, Sbx, free_port, main, mcp_call, mcp_session, pid_alive, wait_for
from test_isolation import PROBE_PY, reachable, serve

TABLE = "sbx_egress"
PUBLIC = ["1.2.3.4", "1.2.3.5", "5.6.7.8"]


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def table():
    r = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def rules(sandbox):
    """A Sandbox's egress rules, both lists (absent ones empty)."""
    e = sandbox.get("egress") or {}
    return {"allow": e.get("allow", []), "deny": e.get("deny", [])}


class EgressTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "egress", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        n = os.getpid() % 100000
        cls.ns, cls.veth, cls.peer = f"sbxe{n}", f"sbxe{n}h", f"sbxe{n}n"
        cls.host_addr = f"10.99.{n % 250}.1"
        ns_addr = f"10.99.{n % 250}.2"
        ip("netns", "add", cls.ns)
        cls.addClassCleanup(lambda: ip("netns", "del", cls.ns, check=False))
        ip("link", "add", cls.veth, "type", "veth", "peer", "name", cls.peer)
        cls.addClassCleanup(lambda: ip("link", "del", cls.veth, check=False))
        ip("link", "set", cls.peer, "netns", cls.ns)
        ip("addr", "add", f"{cls.host_addr}/30", "dev", cls.veth)
        ip("link", "set", cls.veth, "up")
        ip("-n", cls.ns, "addr", "add", f"{ns_addr}/30", "dev", cls.peer)
        ip("-n", cls.ns, "link", "set", cls.peer, "up")
        ip("-n", cls.ns, "link", "set", "lo", "up")
        ip("-n", cls.ns, "route", "add", "default", "via", cls.host_addr)
        for a in PUBLIC:
            ip("-n", cls.ns, "addr", "add", f"{a}/32", "dev", "lo")
            ip("route", "add", f"{a}/32", "via", ns_addr)
            cls.addClassCleanup(lambda a=a: ip("route", "del", f"{a}/32", check=False))
        # An HTTP listener on port 80 of every address in the namespace.
        cls.server = subprocess.Popen(["ip", "netns", "exec", cls.ns, "python3", "-m",
                                       "http.server", "80", "--directory", tempfile.mkdtemp()],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.addClassCleanup(lambda: (cls.server.kill(), cls.server.wait()))
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "egress@example.com")["api_key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def call(self, sid, tool, args=None, ok=True):
        r, text = mcp_call(self, self.s, self.key, sid, tool, args, ok=ok)
        return r if not ok else r["structuredContent"]

    def probe(self, sid, sandbox, targets):
        r = self.call(sid, "exec", {"sandboxId": sandbox, "timeout": 120,
                                    "command": "python3 /root/probe.py '%s'" % json.dumps(targets)})
        self.assertEqual(r["exitCode"], 0, r)
        got = json.loads(r["stdout"])
        print("  probe from %s: %s" % (sandbox, json.dumps(got)))
        return got

    def expect(self, sid, sandbox, targets, reached):
        got = self.probe(sid, sandbox, targets)
        for name, _, _ in targets:
            if name in reached:
                self.assertEqual(got[name], "connected", f"{sandbox} should reach {name}")
            else:
                self.assertNotEqual(got[name], "connected", f"{sandbox} reached {name}")
                self.assertIn("Error", got[name])
                if name in PUBLIC:  # refused by its rules: a reset, at once
                    self.assertIn("ConnectionRefusedError", got[name])

    def rest(self, method, path, body=None):
        status, _, raw = self.s.https(method, path, body=json.dumps(body) if body else None,
                                      headers={"Authorization": f"Bearer {self.key}",
                                               "Content-Type": "application/json"})
        return status, json.loads(raw) if raw else None

    def test_egress(self):
        s = self.s
        sid = mcp_session(s, self.key)
        loop_port = free_port()
        srv = serve("127.0.0.1", loop_port)
        self.addCleanup(lambda: (srv.shutdown(), srv.server_close()))
        veth_port = free_port()
        srv2 = serve(self.host_addr, veth_port)
        self.addCleanup(lambda: (srv2.shutdown(), srv2.server_close()))
        public = [[a, a, 80] for a in PUBLIC]
        wait_for(lambda: all(reachable(a, 80, timeout=1) for a in PUBLIC), 30,
                 "the namespace's listeners")
        self.assertTrue(reachable("127.0.0.1", loop_port) and reachable(self.host_addr, veth_port))

        # Bad rules are refused before anything is made.
        r = self.call(sid, "create_sandbox", {"egress": {"allow": ["1.2.3.4", "a..b"]}}, ok=False)
        self.assertTrue(r.get("isError"))
        self.assertIn("egress.allow[1]", r["content"][0]["text"])
        r = self.call(sid, "create_sandbox", {"egress": {"deny": ["example.com"]}}, ok=False)
        self.assertTrue(r.get("isError"))
        self.assertIn("domain", r["content"][0]["text"])
        self.assertEqual(self.call(sid, "list_sandboxes").get("sandboxes", []), [])

        a = self.call(sid, "create_sandbox", {"name": "eg-a", "egress": {"deny": ["1.2.3.4"]}})
        self.assertEqual(rules(a), {"allow": [], "deny": ["1.2.3.4/32"]}, a)
        a = a["id"]
        b = self.call(sid, "create_sandbox", {"name": "eg-b", "egress": {
            "allow": ["1.2.3.4/31", "127.0.0.0/8", self.host_addr], "deny": ["1.2.3.5"]}})["id"]
        for sb in (a, b):
            self.call(sid, "write_file", {"sandboxId": sb, "path": "/root/probe.py",
                                          "content": PROBE_PY})
        loaded = table()
        self.assertIsNotNone(loaded, "vmd loaded no egress table")
        print(loaded)
        self.assertEqual(loaded.count("jump g_"), 2, loaded)

        # Deny: that address only.
        self.expect(sid, a, public, {"1.2.3.5", "5.6.7.8"})
        # Allow: only the list, less what is denied, and never what the fixed policy refuses.
        fixed = [["host_loopback", "10.0.2.2", loop_port], ["veth_host", self.host_addr, veth_port]]
        self.expect(sid, b, public + fixed, {"1.2.3.4"})
        # DNS passes in allow mode (when this host resolves names itself).
        try:
            socket.getaddrinfo("deb.debian.org", 80)
            r = self.call(sid, "exec", {"sandboxId": b, "timeout": 60, "command":
                                        "python3 -c 'import socket; print(socket.getaddrinfo("
                                        "\"deb.debian.org\", 80)[0][4][0])'"})
            self.assertEqual(r["exitCode"], 0, r)
        except OSError:
            print("  NOTE: this host resolves no names itself; the guest's DNS is not tried")

        # At run time: new connections follow the new rules at once.
        r = self.call(sid, "set_sandbox_egress", {"sandboxId": a, "egress": {"deny": ["5.6.7.8/32"]}})
        self.assertEqual(rules(r), {"allow": [], "deny": ["5.6.7.8/32"]}, r)
        self.expect(sid, a, public, {"1.2.3.4", "1.2.3.5"})
        r = self.call(sid, "set_sandbox_egress", {"sandboxId": a, "egress": {"deny": ["1.2.3"]}},
                      ok=False)
        self.assertTrue(r.get("isError"))
        self.assertEqual(rules(self.call(sid, "get_sandbox", {"sandboxId": a})),
                         {"allow": [], "deny": ["5.6.7.8/32"]}, "a refused change changed the rules")

        # Stopped: the record changes (REST), and the guest resumes under the new rules.
        self.call(sid, "stop_sandbox", {"sandboxId": b})
        status, body = self.rest("PATCH", f"/v1/sandboxes/{b}", {"egress": {"allow": ["5.6.7.8"]}})
        self.assertEqual(status, 200, body)
        self.assertEqual(rules(body), {"allow": ["5.6.7.8/32"], "deny": []}, body)
        self.call(sid, "resume_sandbox", {"sandboxId": b})
        self.expect(sid, b, public, {"5.6.7.8"})

        # A restarted vmd loads the rules from its disk (the table was deleted by hand).
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)
        vmd = s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGKILL)
        wait_for(lambda: not pid_alive(vmd), 10, "vmd gone")
        wait_for(lambda: s.daemon_pid("sbx-vmd") not in (None, vmd), 60, "vmd back")
        s.wait_ready()
        wait_for(lambda: (table() or "").count("jump g_") == 2, 30, "the egress rules back")
        self.expect(sid, a, public, {"1.2.3.4", "1.2.3.5"})
        self.expect(sid, b, public, {"5.6.7.8"})

        # Cleared, then deleted: nothing left.
        r = self.call(sid, "set_sandbox_egress", {"sandboxId": a, "egress": {"allow": [],
                                                                            "deny": []}})
        self.assertEqual(rules(r), {"allow": [], "deny": []}, r)
        self.expect(sid, a, public, set(PUBLIC))
        for sb in (a, b):
            self.call(sid, "delete_sandbox", {"sandboxId": sb})
        self.assertEqual((table() or "").count("jump g_"), 0, table())
        self.assertEqual(os.listdir(os.path.join(s.dir, "egress")), [])


if __name__ == "__main__":
    main()
