"""Guest network isolation (issue 3, item 4), proven from inside real guests under `sbx up`.

A probe in guest A tries the host's loopback services (through QEMU's 10.0.2.2), the
gateway, a service on the host's own non-loopback address, guest B's forwarded port,
the link-local metadata address and a private address: every one is refused, while the
host itself reaches each of them (so each target is really there). The public internet
(the Debian mirror, through the guest's DNS) is reached whenever the host reaches it. A
sandbox created with network off reaches nothing. Then the policy is taken away by hand:
the same probe now reaches the host's loopback service (the probe can see a hole), and a
restarted vmd puts the policy back and re-adopts the guests."""
import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
import unittest

from sbxtest import BIN, Sbx, free_port, main, mcp_call, mcp_session, pid_alive, wait_for

TABLE = "sbx_guests"

# Runs in the guest: tries each target, prints {name: "connected" | the error}.
PROBE_PY = r'''
import json, socket, sys, threading, time, urllib.request
out = {}
def one(name, host, port):
    t = time.time()
    try:
        if name == "public":
            with urllib.request.urlopen("http://%s:%d/debian/" % (host, port), timeout=15) as r:
                out[name] = "connected %d" % r.status
            return
        socket.create_connection((host, port), timeout=5).close()
        out[name] = "connected"
    except Exception as e:
        out[name] = "%s: %s (%.1f s)" % (type(e).__name__, e, time.time() - t)
threads = [threading.Thread(target=one, args=t) for t in json.loads(sys.argv[1])]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
'''


class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"host service\n")

    def log_message(self, *a):
        pass


def serve(addr, port):
    srv = http.server.ThreadingHTTPServer((addr, port), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def host_address():
    """The host's own non-loopback IPv4 address (its route to the outside)."""
    out = subprocess.run(["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True,
                         text=True).stdout.split()
    return out[out.index("src") + 1] if "src" in out else None


def reachable(host, port, timeout=5):
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


class IsolationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "isolation", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "iso@example.com")["api_key"]
        cls.port = cls.s.listen_port()

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def call(self, sid, tool, args=None):
        return mcp_call(self, self.s, self.key, sid, tool, args)[0]["structuredContent"]

    def session(self):
        return mcp_session(self.s, self.key)

    def probe(self, sid, sandbox, targets):
        r = self.call(sid, "exec", {"sandboxId": sandbox, "timeout": 120,
                                    "command": "python3 /root/probe.py '%s'" % json.dumps(targets)})
        self.assertEqual(r["exitCode"], 0, r)
        result = json.loads(r["stdout"])
        print("  probe from %s: %s" % (sandbox, json.dumps(result, indent=1)))
        return result

    def forward_host_port(self, sandbox, port):
        with open(os.path.join(self.s.dir, "vms", sandbox, "guest.json")) as f:
            for fwd in json.load(f).get("forwards", []):
                if fwd["port"] == port:
                    return fwd["host_port"]
        return None

    def test_isolation(self):
        s = self.s
        sid = self.session()
        a = self.call(sid, "create_sandbox", {"name": "iso-a"})["id"]
        b = self.call(sid, "create_sandbox", {"name": "iso-b"})["id"]
        c = self.call(sid, "create_sandbox", {"name": "iso-c", "network": False})["id"]
        for sb in (a, c):
            self.call(sid, "write_file", {"sandboxId": sb, "path": "/root/probe.py",
                                          "content": PROBE_PY})

        # B serves a port and publishes it: the gateway reaches it, A must not.
        self.call(sid, "exec", {"sandboxId": b, "detached": True,
                                "command": "cd /tmp && python3 -m http.server 8000"})
        self.call(sid, "exec", {"sandboxId": b, "command": "for i in $(seq 120); do curl -s "
                                "-o /dev/null localhost:8000 && exit 0; sleep 0.5; done; exit 1"})
        url = self.call(sid, "host_port", {"sandboxId": b, "port": 8000, "public": True})["url"]
        fwd = self.forward_host_port(b, 8000)
        self.assertIsNotNone(fwd, "vmd recorded no forward for port 8000")

        # The host's own services: one on loopback, one on the host's outside address.
        loop_port, out_port = free_port(), free_port()
        servers = [serve("127.0.0.1", loop_port)]
        me = host_address()
        if me:
            servers.append(serve("0.0.0.0", out_port))
        self.addCleanup(lambda: [(srv.shutdown(), srv.server_close()) for srv in servers])

        # Every target is really there, seen from the host.
        self.assertTrue(reachable("127.0.0.1", loop_port))
        self.assertTrue(reachable("127.0.0.1", self.port), "the gateway")
        self.assertTrue(reachable("127.0.0.1", fwd), "B's forward")
        if me:
            self.assertTrue(reachable(me, out_port))
        public = reachable("deb.debian.org", 80, timeout=10)

        targets = [["host_loopback", "10.0.2.2", loop_port],
                   ["gateway", "10.0.2.2", self.port],
                   ["other_guest_forward", "10.0.2.2", fwd],
                   ["metadata", "169.254.169.254", 80],
                   ["private", "192.168.1.1", 80]]
        if me:
            targets.append(["host_address", me, out_port])
        if public:
            targets.append(["public", "deb.debian.org", 80])
        else:
            print("  NOTE: this host does not reach deb.debian.org:80 itself; the public "
                  "egress check is left out of this run (every refusal is still checked)")
        got = self.probe(sid, a, targets)
        for name, _, _ in targets:
            if name == "public":
                self.assertEqual(got[name], "connected 200", "a guest reaches the internet")
            else:
                self.assertNotEqual(got[name], "connected", f"guest A reached {name}")
                self.assertIn("Error", got[name])

        # The gateway still reaches B's forward (established traffic passes the policy).
        ca = s.status()["ca_cert"]
        import http.client
        import ssl
        host = url.split("//", 1)[1].rsplit(":", 1)[0]
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30,
                                           context=ssl.create_default_context(cafile=ca))
        conn.sock = ssl.create_default_context(cafile=ca).wrap_socket(
            socket.create_connection(("127.0.0.1", self.port)), server_hostname=host)
        conn.request("GET", "/", headers={"Host": host})
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        self.assertIn(b"Directory listing", res.read())
        conn.close()

        # Network off: not even the public internet, nor the host.
        off = [["host_loopback", "10.0.2.2", loop_port], ["dns_public", "deb.debian.org", 80]]
        got = self.probe(sid, c, off)
        for name, _, _ in off:
            self.assertNotEqual(got[name], "connected", f"network-off guest reached {name}")

        # The probe can see a hole: without the policy, A reaches the host's loopback.
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)
        got = self.probe(sid, a, targets[:1])
        self.assertEqual(got["host_loopback"], "connected",
                         "without the policy the guest should reach 10.0.2.2 (probe broken?)")

        # A restarted vmd loads the policy again and re-adopts the guests.
        vmd = s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGKILL)
        wait_for(lambda: not pid_alive(vmd), 10, "vmd gone")
        wait_for(lambda: s.daemon_pid("sbx-vmd") not in (None, vmd), 60, "vmd back")
        s.wait_ready()
        wait_for(lambda: subprocess.run(["nft", "list", "table", "inet", TABLE],
                                        capture_output=True).returncode == 0, 30, "policy back")
        got = self.probe(sid, a, targets[:2])
        for name in ("host_loopback", "gateway"):
            self.assertNotEqual(got[name], "connected", f"after vmd's restart A reached {name}")
        for sb in (a, b, c):
            self.call(sid, "delete_sandbox", {"sandboxId": sb})


if __name__ == "__main__":
    main()
