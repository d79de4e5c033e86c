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
  - a bad entry is refused with its code and nothing changes;
  - with the table deleted by hand, a kill -9'd vmd loads the rules again from its disk;
  - deleted sandboxes leave no rules behind.
Domain names (test_domains): vmd.egress_resolver points the guests' DNS relays at a DNS
server of this test (Zone, on the host's loopback) that stands in for the internet's
names: allowed.test and its subdomains are 1.2.3.4, denied.test 1.2.3.5, other.test
5.6.7.8. From inside guests:
  - C, `allow: [allowed.test], deny: [ads.allowed.test]`, reaches www.allowed.test (its
    answer's address was learned) and nothing else: ads.allowed.test and other.test do
    not resolve (the denied name never reaches the resolver), 1.2.3.5 and 5.6.7.8 by
    address are refused, and DNS over TCP is refused;
  - D, `deny: [denied.test]`, can't resolve denied.test but reaches its address
    directly (the documented limit) and everything else;
  - set_sandbox_egress changes D's names at run time;
  - a kill -9'd vmd comes back with C's learned address and a relay that answers.
The loaded table (`nft list table inet sbx_egress`) is read back along the way."""
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import unittest

from sbxtest import BIN, EGRESS_TABLE, Sbx, free_port, main, mcp_call, mcp_session, pid_alive, wait_for
from test_isolation import PROBE_PY, reachable, serve

TABLE = EGRESS_TABLE  # this slot's (sbxtest)
PUBLIC = ["1.2.3.4", "1.2.3.5", "5.6.7.8"]


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def table():
    r = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


class Zone:
    """A DNS server over UDP on 127.0.0.1 for a few names (A records only; other types of
    a known name get an empty answer, unknown names NXDOMAIN). It counts the queries
    for each name."""

    NAMES = {"allowed.test": "1.2.3.4", "denied.test": "1.2.3.5", "other.test": "5.6.7.8"}

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.asked = {}
        threading.Thread(target=self.serve, daemon=True).start()

    def address(self, name):
        for zone, addr in self.NAMES.items():
            if name == zone or name.endswith("." + zone):
                return addr
        return None

    def serve(self):
        while True:
            try:
                query, peer = self.sock.recvfrom(4096)
                self.sock.sendto(self.answer(query), peer)
            except OSError:
                return
            except Exception as e:  # a query this server does not parse: no answer
                print("  zone: %r" % e)

    def answer(self, query):
        qid, _, qdcount = struct.unpack("!HHH", query[:6])
        labels, at = [], 12
        while query[at]:
            labels.append(query[at + 1:at + 1 + query[at]].decode().lower())
            at += 1 + query[at]
        qtype, _ = struct.unpack("!HH", query[at + 1:at + 5])
        question = query[12:at + 5]
        name = ".".join(labels)
        self.asked[name] = self.asked.get(name, 0) + 1
        addr = self.address(name)
        records = b""
        if addr and qtype == 1:
            records = struct.pack("!HHHIH", 0xC00C, 1, 1, 30, 4) + socket.inet_aton(addr)
        rcode = 0 if addr else 3
        return struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, 1 if records else 0, 0, 0) + question + records


def rules(sandbox):
    """A Sandbox's egress rules, both lists (absent ones empty)."""
    e = sandbox.get("egress") or {}
    return {"allow": e.get("allow", []), "deny": e.get("deny", [])}


class EgressTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.zone = Zone()
        cls.addClassCleanup(cls.zone.sock.close)
        cls.s = Sbx(cls, "egress", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "vmd.egress_resolver": f"127.0.0.1:{cls.zone.port}"})
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

    def kill_vmd(self):
        """kill -9 of vmd; returns once the supervisor's new one has joined."""
        s = self.s
        vmd = s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGKILL)
        wait_for(lambda: not pid_alive(vmd), 10, "vmd gone")
        wait_for(lambda: s.daemon_pid("sbx-vmd") not in (None, vmd), 60, "vmd back")
        s.wait_ready()

    def names(self, sid, sandbox, targets, reached):
        """Like expect, for targets named by DNS too: a name that must not resolve fails
        in getaddrinfo (socket.gaierror)."""
        got = self.probe(sid, sandbox, targets)
        why = lambda: f"(the zone was asked {self.zone.asked}; the table:\n{table()})"
        for name, host, _ in targets:
            if name in reached:
                self.assertEqual(got[name], "connected", f"{sandbox} should reach {name} {why()}")
            else:
                self.assertNotEqual(got[name], "connected", f"{sandbox} reached {name} {why()}")
                if not host[0].isdigit():
                    self.assertIn("gaierror", got[name], f"{name} resolved in {sandbox} {why()}")
        return got

    def test_domains(self):
        s, zone = self.s, self.zone
        sid = mcp_session(s, self.key)
        wait_for(lambda: all(reachable(a, 80, timeout=1) for a in PUBLIC), 30,
                 "the namespace's listeners")
        c = self.call(sid, "create_sandbox", {"name": "eg-c", "egress": {
            "allow": ["Allowed.TEST"], "deny": ["ads.allowed.test"]}})
        self.assertEqual(rules(c), {"allow": ["allowed.test"], "deny": ["ads.allowed.test"]}, c)
        c = c["id"]
        d = self.call(sid, "create_sandbox", {"name": "eg-d", "egress": {
            "deny": ["denied.test"]}})["id"]
        for sb in (c, d):
            self.call(sid, "write_file", {"sandboxId": sb, "path": "/root/probe.py",
                                          "content": PROBE_PY})
        loaded = table()
        print(loaded)
        self.assertEqual(loaded.count("redirect to :"), 2, loaded)

        www, ads, other = (["www.allowed.test", "www.allowed.test", 80],
                           ["ads.allowed.test", "ads.allowed.test", 80],
                           ["other.test", "other.test", 80])
        by_addr = [["1.2.3.5", "1.2.3.5", 80], ["5.6.7.8", "5.6.7.8", 80]]
        tcp_dns = ["tcp_dns", "10.0.2.3", 53]
        got = self.names(sid, c, [www, ads, other, tcp_dns] + by_addr, {"www.allowed.test"})
        for a in ("1.2.3.5", "5.6.7.8"):
            self.assertIn("ConnectionRefusedError", got[a])
        self.assertGreater(zone.asked.get("www.allowed.test", 0), 0)
        self.assertNotIn("ads.allowed.test", zone.asked, "a denied name reached the resolver")
        self.assertNotIn("other.test", zone.asked, "a name outside the allow list was asked")
        self.assertIn("1.2.3.4", table())  # learned: in C's set
        # Deny by name: the name does not resolve, its address is reached directly.
        denied = ["denied.test", "denied.test", 80]
        self.names(sid, d, [denied, other, www, ["1.2.3.5", "1.2.3.5", 80]],
                   {"other.test", "www.allowed.test", "1.2.3.5"})
        self.assertNotIn("denied.test", zone.asked)
        # At run time: D allows other.test only.
        r = self.call(sid, "set_sandbox_egress", {"sandboxId": d, "egress": {"allow": ["other.test"]}})
        self.assertEqual(rules(r), {"allow": ["other.test"], "deny": []}, r)
        self.names(sid, d, [other, www, ["1.2.3.4", "1.2.3.4", 80]], {"other.test"})

        # A restarted vmd: C's learned address is kept, and its new relay answers.
        self.kill_vmd()
        wait_for(lambda: (table() or "").count("redirect to :") == 2, 30, "the relays back")
        self.assertIn("1.2.3.4", table())
        self.names(sid, c, [www, other], {"www.allowed.test"})
        for sb in (c, d):
            self.call(sid, "delete_sandbox", {"sandboxId": sb})
        self.assertEqual((table() or "").count("jump g_"), 0, table())

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
        self.kill_vmd()
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
