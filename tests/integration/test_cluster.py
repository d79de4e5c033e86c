#!/usr/bin/env python3
"""sbx across hosts, proven in network namespaces on one machine (issue 16, item 4).

The test builds the topology itself: a bridge, and a network namespace per host, each
with a veth on the bridge, its own data directory and its own `sbx up`:

    c1 c2 c3   control nodes (broker + its dqlite node, billing; hookd on c1)
    g1 g2      gateways, behind a real HAProxy (TCP, round robin) in the test's namespace
    v1 v2      vmd hosts, real guests, each with its snapshotd (the catalog is the
               cluster's; user snapshots are copied to the other host)

It forms the cluster the documented way (sbx cluster init on c1, a token per host,
sbx up --join on each), then runs a workload through MCP (creates, execs, stops,
resumes) while it
    - kills the leading control node's broker with SIGKILL, again and again, and
    - cuts the leading node off the bridge (a partition) and brings it back,
then, the workload done,
    - cuts vmd host v1 off the bridge until its sandboxes are `error`, host lost, and
      brings it back: they return as they were, and answer;
    - drains v1: a stopped sandbox moves to v2 with its memory; a user snapshot of it
      saved on v2 gets its second copy on v1;
    - kills vmd host v2 whole (every process of its namespace, guests too, SIGKILL):
      its sandboxes go to `error`, host lost, and one is deleted at once; a sandbox made
      from the snapshot comes up on v1 from v1's copy, with the file it was saved with,
      and a port it publishes is served through both gateways (v1's relay);
and reports: each failover's time (until an exec through a gateway succeeds again),
requests that got no answer (must be 0), billed time lost or doubled against the event
log, a lost sandbox's up to its host's last heartbeat (must be 0), sandboxes lost (only
the killed host's). With SBX_CLUSTER_FIGURES=PATH the figures are written there as JSON
(bench/ renders them into docs/benchmarks.md).
"""
import calendar
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sbxtest import binary, free_port, listening_ports, main, wait_for  # noqa: E402

FAILOVERS = int(os.environ.get("SBX_CLUSTER_FAILOVERS", "10"))
LOST_AFTER_MS = 5000
SHIP_PORT = 7300
RELAY_PORT = 7400
CONTROL_PORT = 7000  # each control node: dqlite at 7000, broker 7001, tap 7002
GATEWAY_PORT = 8080


def run(argv, check=True, timeout=60, **kw):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n"
                             f"{res.stderr}")
    return res


class Net:
    """A bridge in the test's namespace and a namespace per host, one subnet."""

    def __init__(self, test):
        self.tag = f"{os.getpid() % 10000}"
        self.subnet = f"10.{77 + os.getpid() % 20}.{os.getpid() % 250}"
        self.bridge = f"sbxbr{self.tag}"
        self.hosts = {}
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        test.addCleanup(self.destroy)
        run(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])

    def add(self, name, last):
        ns, veth = f"sbx{self.tag}{name}", f"v{self.tag}{name}"
        run(["ip", "netns", "add", ns])
        self.hosts[name] = ns
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", veth, "master", self.bridge, "up"])
        for cmd in (["ip", "addr", "add", f"{self.subnet}.{last}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            run(["ip", "netns", "exec", ns] + cmd)
        return ns, veth, f"{self.subnet}.{last}"

    def destroy(self):
        for ns in self.hosts.values():
            run(["ip", "netns", "del", ns], check=False)
        run(["ip", "link", "del", self.bridge], check=False)


class Host:
    """One host: its namespace, data directory and sbx up."""

    def __init__(self, test, net, name, last):
        self.name = name
        self.ns, self.veth, self.ip = net.add(name, last)
        self.dir = tempfile.mkdtemp(prefix=f"sbxcluster-{name}-")
        self.out = os.path.join(self.dir, "up.out")
        self.proc = None
        with open(os.path.join(self.dir, "sbx.conf"), "w") as f:
            # A vmd host away this long is lost (the brokers'; 30 s by default).
            # (A guest host's vmd.ship and vmd.relay come from sbx up --join --address.)
            f.write(f"heartbeat_ms = 500\nvmd.lost_after_ms = {LOST_AFTER_MS}\n")
        test.addCleanup(self.cleanup)

    def cli(self, *args, check=True, timeout=60):
        """The CLI run on this host (in its namespace), as its operator."""
        return run(["ip", "netns", "exec", self.ns, binary("sbx"), *args, "--data-dir",
                    self.dir], check=check, timeout=timeout)

    def up(self, *args):
        out = open(self.out, "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, binary("sbx"), "up",
                                      "--data-dir", self.dir, "--plain-http", *args],
                                     stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()

    def output(self):
        with open(self.out, errors="replace") as f:
            return f.read()

    def status(self):
        try:
            with open(os.path.join(self.dir, "run", "up.json")) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def ready(self):
        st = self.status()
        return st and st["daemons"] and all(d["ready"] for d in st["daemons"])

    def pid(self, daemon):
        st = self.status() or {"daemons": []}
        for d in st["daemons"]:
            if d["name"] == daemon:
                return d["pid"]
        return None

    def kill(self):
        """The whole host dies: every process in its namespace (sbx up, its daemons, the
        guests' QEMUs), with SIGKILL."""
        pids = run(["ip", "netns", "pids", self.ns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        return len(pids)

    def cut(self):
        run(["ip", "link", "set", self.veth, "down"])

    def mend(self):
        run(["ip", "link", "set", self.veth, "up"])

    def log(self, daemon):
        try:
            with open(os.path.join(self.dir, "logs", f"{daemon}.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pattern in (f"qemu-system.* {self.dir}/", f"--data-dir {self.dir}"):
            subprocess.run(["pkill", "-KILL", "-f", "--", pattern], check=False)
        if os.environ.get("SBX_KEEP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Client:
    """MCP (and REST) through the balancer, plain HTTP: every request's outcome is kept."""

    def __init__(self, port, key):
        self.port, self.key = port, key
        self.lock = threading.Lock()
        self.outcomes = []  # (what, ok, code) for each request made

    def _request(self, method, path, body, headers, timeout):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            res = conn.getresponse()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
        finally:
            conn.close()

    def record(self, what, ok, code):
        with self.lock:
            self.outcomes.append((what, ok, code))

    def mcp(self, body, sid=None, timeout=120):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Authorization": f"Bearer {self.key}"}
        if sid:
            h["Mcp-Session-Id"] = sid
        status, hdrs, raw = self._request("POST", "/mcp", json.dumps(body), h, timeout)
        return status, hdrs, json.loads(raw) if raw else None

    def session(self):
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "test_cluster", "version": "0"}}}
        _, hdrs, _ = self.mcp(init)
        sid = hdrs["mcp-session-id"]
        self.mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        return sid

    def tool(self, sid, name, args, timeout=120):
        """One tools/call: (ok, structuredContent or None, the error code or text). A request
        that got no HTTP answer at all is recorded as unanswered (code None)."""
        try:
            status, _, body = self.mcp({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                        "params": {"name": name, "arguments": args}}, sid,
                                       timeout=timeout)
        except (OSError, http.client.HTTPException) as exc:
            self.record(name, False, None)
            return False, None, repr(exc)
        result = (body or {}).get("result") or {}
        text = (result.get("content") or [{}])[0].get("text", json.dumps(body))
        ok = status == 200 and not result.get("isError")
        code = "ok" if ok else (re.findall(r"\(([a-z_]+)\)\s*$", text) or [f"http {status}"])[0]
        self.record(name, ok, code)
        return ok, result.get("structuredContent"), text

    def rest(self, method, path, body=None, timeout=60):
        h = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        try:
            status, _, raw = self._request(method, path, json.dumps(body) if body else None, h,
                                           timeout)
            return status, json.loads(raw) if raw else None
        except (OSError, http.client.HTTPException):
            return None, None


class ClusterTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("network namespaces need root")  # never in CI: it runs as root

    def haproxy(self, backends):
        port = free_port()
        cfg = tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False)
        servers = "".join(f"    server gw{i} {ip}:{GATEWAY_PORT} check inter 500\n"
                          for i, ip in enumerate(backends))
        cfg.write("global\n    maxconn 2000\ndefaults\n    mode tcp\n    balance roundrobin\n"
                  "    timeout connect 2s\n    timeout client 600s\n    timeout server 600s\n"
                  "    retries 3\n    option redispatch\n"
                  f"listen sbx\n    bind 127.0.0.1:{port}\n" + servers)
        cfg.close()
        proc = subprocess.Popen([shutil.which("haproxy") or "/usr/sbin/haproxy", "-f", cfg.name,
                                 "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self.addCleanup(lambda: (proc.kill(), proc.wait(), os.unlink(cfg.name)))
        wait_for(lambda: port in listening_ports(), 15, f"haproxy on {port}")
        return port

    def leader(self, control):
        """The control host whose node leads, as a live control node says."""
        for host in control:
            res = host.cli("cluster", "nodes", "--json", check=False, timeout=20)
            if res.returncode == 0:
                lead = json.loads(res.stdout).get("leader")
                for h in control:
                    if lead and lead.startswith(h.ip + ":"):
                        return h
        return None

    def voters(self, host):
        res = host.cli("cluster", "nodes", "--json", check=False, timeout=20)
        if res.returncode != 0:
            return 0
        return sum(1 for n in json.loads(res.stdout)["nodes"] if n["role"] == "voter")

    def test_cluster(self):
        net = Net(self)
        hosts = {name: Host(self, net, name, last) for name, last in
                 (("c1", 11), ("c2", 12), ("c3", 13), ("g1", 21), ("g2", 22), ("v1", 31),
                  ("v2", 32))}
        c1 = hosts["c1"]
        control = [hosts["c1"], hosts["c2"], hosts["c3"]]

        # -- the cluster, formed as docs/operations.md says ------------------------------
        c1.cli("cluster", "init", "--address", f"{c1.ip}:{CONTROL_PORT}")
        c1.up("--roles", "control,billing,hooks")
        key = wait_for(lambda: (re.findall(r"admin API key:\s+(\S+)", c1.output()) or [None])[0],
                       60, lambda: f"the admin key in c1's output:\n{c1.output()}")
        roles = {"c2": "control,billing", "c3": "control,billing", "g1": "gateway",
                 "g2": "gateway", "v1": "vmd,snapshotd", "v2": "vmd,snapshotd"}
        for name, role in roles.items():
            token = json.loads(c1.cli("cluster", "token", "--name", name, "--roles", role,
                                      "--json").stdout)["token"]
            args = ["--join", token]
            if "control" in role:
                args += ["--address", f"{hosts[name].ip}:{CONTROL_PORT}"]
            elif "vmd" in role:
                args += ["--address", hosts[name].ip]  # vmd.ship and vmd.relay from it
            if "gateway" in role:
                args += ["--listen", f"{hosts[name].ip}:{GATEWAY_PORT}"]
            hosts[name].up(*args)
        for host in hosts.values():
            wait_for(host.ready, 180, lambda h=host: f"{h.name} ready:\n{h.output()[-3000:]}")
        for name in ("v1", "v2"):  # their addresses for the others, from --address
            with open(os.path.join(hosts[name].dir, "sbx.conf")) as f:
                conf = f.read()
            self.assertIn(f"vmd.ship = {hosts[name].ip}:{SHIP_PORT}\n", conf)
            self.assertIn(f"vmd.relay = {hosts[name].ip}:{RELAY_PORT}\n", conf)
        wait_for(lambda: self.voters(c1) == 3, 60, "three voters")
        # sbx status on any host: every node, the leader, every host's roles.
        def status_complete():
            view = json.loads(hosts["g1"].cli("status", "--json", check=False).stdout)["cluster"]
            states = sorted(n["state"] for n in view["nodes"])
            roles = {h["name"]: sorted(h["roles"]) for h in view["hosts"]}
            return (view["leader"] and states == ["leader", "standby", "standby"] and
                    roles.get("v1") == ["snapshotd", "vmd"] and roles.get("g2") == ["gateway"]
                    and "billing" in roles.get("c3", []))
        wait_for(status_complete, 60, lambda: hosts["g1"].cli("status", "--json",
                                                              check=False).stdout)
        port = self.haproxy([hosts["g1"].ip, hosts["g2"].ip])
        client = Client(port, key)
        wait_for(lambda: client.rest("GET", "/v1/sandboxes")[0] == 200, 60, "REST through haproxy")

        # -- a workload through MCP: sandboxes, execs, stops and resumes -----------------
        sid = client.session()
        sandboxes = []

        def vmd_of(sb):
            return json.loads(c1.cli("sandbox", "get", sb, "--json").stdout)["vmd"]
        # A sandbox on each vmd host at least (placement picks the one with most room).
        while len(sandboxes) < 2 or len({vmd_of(sb) for sb in sandboxes}) < 2:
            self.assertLess(len(sandboxes), 4, "every sandbox went to one vmd")
            ok, made, text = client.tool(sid, "create_sandbox", {"name": f"w{len(sandboxes)}"},
                                         timeout=300)
            self.assertTrue(ok, text)
            sandboxes.append(made["id"])
        stop = threading.Event()

        def workload():
            n = 0
            while not stop.is_set():
                sb = sandboxes[n % len(sandboxes)]
                ok, _, text = client.tool(sid, "exec", {"sandboxId": sb,
                                                        "command": "echo $((6*7))"})
                if n % 7 == 6 or "(failed_precondition)" in text:
                    # Now and then a stop with memory kept, and a resume; and a resume of
                    # one a failover left stopped.
                    if ok:
                        client.tool(sid, "stop_sandbox", {"sandboxId": sb})
                    client.tool(sid, "resume_sandbox", {"sandboxId": sb})
                if not ok:
                    time.sleep(0.2)  # a client backs off a little after an error
                n += 1
        worker = threading.Thread(target=workload, daemon=True)
        worker.start()

        def serving():
            """An exec through a gateway: the broker routes it to the guest's vmd."""
            status, body = client.rest("POST", f"/v1/sandboxes/{sandboxes[0]}/exec",
                                       {"command": "true"}, timeout=30)
            return status == 200 and body and body.get("exitCode") == 0

        def settle():
            """Every control node back, its broker ready; service answering."""
            wait_for(lambda: all(h.ready() for h in control), 60, "control hosts ready")
            wait_for(lambda: self.voters(c1) == 3 or self.voters(hosts["c2"]) == 3, 60,
                     "three voters again")
            wait_for(serving, 60, "an exec answered")

        settle()
        # -- failovers: the leading broker killed with SIGKILL ----------------------------
        times = []
        for i in range(FAILOVERS):
            lead = self.leader(control)
            self.assertIsNotNone(lead, "no leader")
            pid = lead.pid("sbx-broker")
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            wait_for(serving, 60, f"service after killing {lead.name}'s broker", interval=0.05)
            times.append(time.monotonic() - t0)
            print(f"  failover {i + 1}: {lead.name}'s broker killed, served again after "
                  f"{times[-1]:.2f} s", flush=True)
            settle()
        # -- a partition: the leading node cut off the bridge, then back ------------------
        lead = self.leader(control)
        t0 = time.monotonic()
        lead.cut()
        try:
            wait_for(serving, 60, f"service with {lead.name} cut off", interval=0.05)
            partition = time.monotonic() - t0
            print(f"  partition: {lead.name} cut off, served again after {partition:.2f} s",
                  flush=True)
            time.sleep(3)
        finally:
            lead.mend()
        settle()
        stop.set()
        worker.join(300)
        self.assertFalse(worker.is_alive(), "the workload did not end")

        # -- what it cost --------------------------------------------------------------
        outcomes = client.outcomes
        unanswered = [o for o in outcomes if o[2] is None]
        codes = {}
        for _, _, code in outcomes:
            codes[code or "unanswered"] = codes.get(code or "unanswered", 0) + 1
        print(f"  requests: {len(outcomes)} {codes}", flush=True)
        self.assertEqual(unanswered, [], "requests without an answer")
        self.assertGreater(codes.get("ok", 0), 0)
        # Every sandbox is still there, and answers.
        for sb in sandboxes:
            ok, got, text = client.tool(sid, "get_sandbox", {"sandboxId": sb})
            self.assertTrue(ok, text)
            why = ""
            if got["state"] not in ("ready", "stopped"):
                # What it went through, for the next person (in the failure's own report,
                # which a failed run repeats at its end): each node's log lines about it.
                for name in ("c1", "c2", "c3", "v1", "v2"):
                    for daemon in ("sbx-broker", "sbx-vmd"):
                        lines = [x for x in hosts[name].log(daemon).splitlines() if sb in x]
                        if lines:
                            why += f"\n--- {name}'s {daemon}.log about {sb}\n"
                            why += "\n".join(lines[-30:])
            self.assertIn(got["state"], ("ready", "stopped"), f"{got}{why}")
        # -- host loss: a vmd host cut off and back; then one killed whole -------------
        def view(sb):
            got = json.loads(c1.cli("sandbox", "get", sb, "--json").stdout)
            return got["state"], got.get("reason") or ""
        on = {sb: vmd_of(sb) for sb in sandboxes}
        back, dead = [sb for sb in sandboxes if on[sb] == "v1"], [sb for sb in sandboxes
                                                                  if on[sb] == "v2"]
        before = {sb: view(sb)[0] for sb in back}
        t0 = time.monotonic()
        hosts["v1"].cut()
        try:
            wait_for(lambda: all(view(sb)[0] == "error" and view(sb)[1].startswith("host lost")
                                 for sb in back), 60, "v1's sandboxes host lost")
            print(f"  v1 cut off: its {len(back)} sandbox(es) host lost after "
                  f"{time.monotonic() - t0:.2f} s", flush=True)
        finally:
            hosts["v1"].mend()
        t0 = time.monotonic()
        wait_for(lambda: all(view(sb)[0] == before[sb] for sb in back), 60,
                 lambda: f"v1's sandboxes back as they were: {[view(sb) for sb in back]}")
        came_back = time.monotonic() - t0
        print(f"  v1 back: its sandboxes {before} again after {came_back:.2f} s", flush=True)
        for sb in back:
            if before[sb] == "ready":
                ok, got, text = client.tool(sid, "exec", {"sandboxId": sb, "command": "echo back"})
                self.assertTrue(ok and "back" in text + json.dumps(got), text)
        # -- a drain: a stopped sandbox of v1 moves to v2 with its memory ---------------
        mover = back[0]
        if view(mover)[0] != "ready":
            client.tool(sid, "resume_sandbox", {"sandboxId": mover})
        mark = f"kept-{os.getpid()}-{time.monotonic_ns()}"
        ok, _, text = client.tool(sid, "exec", {"sandboxId": mover,
                                                "command": f"echo {mark} > /tmp/mark"})
        self.assertTrue(ok, text)
        ok, _, text = client.tool(sid, "stop_sandbox", {"sandboxId": mover})
        self.assertTrue(ok, text)
        t0 = time.monotonic()
        drained = json.loads(c1.cli("host", "drain", "v1", "--json").stdout)
        self.assertGreaterEqual(drained["stopped"], 1)
        self.assertIsNotNone(drained["drainingSince"])
        wait_for(lambda: vmd_of(mover) == "v2", 180,
                 lambda: f"{mover} moved to v2:\n{hosts['v1'].log('sbx-vmd')[-2000:]}"
                         f"\n{hosts['v2'].log('sbx-vmd')[-2000:]}")
        move_s = time.monotonic() - t0
        print(f"  drain of v1: {mover} moved to v2 (stopped, memory kept) in {move_s:.2f} s",
              flush=True)
        self.assertIn("draining", c1.cli("host", "list").stdout)
        ok, got, text = client.tool(sid, "resume_sandbox", {"sandboxId": mover}, timeout=300)
        self.assertTrue(ok, text)
        ok, got, text = client.tool(sid, "exec", {"sandboxId": mover, "command": "cat /tmp/mark"})
        self.assertTrue(ok and mark in text + json.dumps(got), f"{mark} after the move: {text}")
        c1.cli("host", "drain", "v1", "--undo")
        dead = [sb for sb in sandboxes if vmd_of(sb) == "v2"]
        back = [sb for sb in back if sb != mover]

        # -- a user snapshot saved on v2 gets a copy on v1 ------------------------------
        for _ in range(5):  # unavailable (the catalog's cluster store between leaders): retry
            ok, snap, text = client.tool(sid, "save_snapshot", {"sandboxId": mover,
                                                                "name": "kept-on-two"}, timeout=300)
            if ok or "(unavailable)" not in text:
                break
            time.sleep(1)
        # (Refused once in a fresh run, "cannot record the snapshot (internal)", with nothing
        # else said: v2's snapshotd log and the control nodes' about it, for the next time.)
        self.assertTrue(ok, f"{text}\n--- v2's sbx-snapshotd.log\n"
                            f"{hosts['v2'].log('sbx-snapshotd')[-3000:]}" +
                        "".join(f"\n--- {h.name}'s sbx-broker.log about {mover}\n" +
                                "\n".join([x for x in h.log("sbx-broker").splitlines()
                                           if mover in x][-15:]) for h in control))
        t0 = time.monotonic()

        def copies():
            status, body = client.rest("GET", f"/v1/snapshots/{snap['id']}")
            return status == 200 and body.get("copies", 0) >= 2
        wait_for(copies, 180, lambda: f"a second copy of {snap['id']}:\n"
                 f"{hosts['v2'].log('sbx-vmd')[-1500:]}\n{hosts['v1'].log('sbx-vmd')[-1500:]}"
                 f"\n{hosts['v1'].log('sbx-snapshotd')[-1500:]}")
        copy_s = time.monotonic() - t0
        print(f"  snapshot {snap['id']} saved on v2, copied to v1 after {copy_s:.2f} s",
              flush=True)

        t0 = time.monotonic()
        killed = hosts["v2"].kill()
        wait_for(lambda: all(view(sb)[0] == "error" and view(sb)[1].startswith("host lost")
                             for sb in dead), 60, "v2's sandboxes host lost")
        lost_s = time.monotonic() - t0
        print(f"  v2 killed ({killed} processes): its {len(dead)} sandbox(es) host lost after "
              f"{lost_s:.2f} s: {view(dead[0])[1]}", flush=True)
        # Deleted while their host is gone: at once.
        ok, got, text = client.tool(sid, "delete_sandbox", {"sandboxId": dead[0]})
        self.assertTrue(ok and got["state"] == "deleted", text)
        gone = c1.cli("sandbox", "get", dead[0], "--json", check=False)
        self.assertIn("not_found", gone.stdout + gone.stderr)
        # The snapshot saved on v2 outlives it: listed (the catalog is the cluster's), and
        # a sandbox made from it comes up on v1, from v1's copy, with its memory's file.
        ok, listed, text = client.tool(sid, "list_snapshots", {})
        self.assertTrue(ok and snap["id"] in text + json.dumps(listed), text)
        ok, made, text = client.tool(sid, "create_sandbox", {"snapshotId": snap["id"]},
                                     timeout=300)
        self.assertTrue(ok, text)
        self.assertEqual(vmd_of(made["id"]), "v1")
        ok, got, text = client.tool(sid, "exec", {"sandboxId": made["id"],
                                                  "command": "cat /tmp/mark"})
        self.assertTrue(ok and mark in text + json.dumps(got),
                        f"{mark} in the sandbox made from the copy: {text}")
        print(f"  v2 gone: sandbox {made['id']} made on v1 from its copy of {snap['id']}",
              flush=True)
        # A published port of it, served through both gateways (neither runs a vmd): each
        # reaches v1's forward through v1's relay.
        ok, _, text = client.tool(sid, "exec", {"sandboxId": made["id"], "detached": True,
                                                "command": "cd /tmp && python3 -m http.server "
                                                           "8000 --bind 0.0.0.0"})
        self.assertTrue(ok, text)
        ok, got, text = client.tool(sid, "exec", {
            "sandboxId": made["id"],
            "command": "for i in $(seq 60); do curl -s -o /dev/null localhost:8000 && exit 0; "
                       "sleep 0.5; done; exit 1"})
        self.assertTrue(ok and got["exitCode"] == 0, text)
        ok, published, text = client.tool(sid, "host_port", {"sandboxId": made["id"],
                                                             "port": 8000, "public": True})
        self.assertTrue(ok, text)
        port_host = re.sub(r"^https?://", "", published["url"]).split(":")[0].split("/")[0]
        for _ in range(4):  # HAProxy takes turns: both gateways serve it
            status, _, page = client._request("GET", "/", None, {"Host": port_host}, 30)
            self.assertEqual(status, 200, page[:300])
            self.assertIn(b"Directory listing", page)
        print(f"  port 8000 of {made['id']} on v1 served through g1 and g2 (vmd.relay)",
              flush=True)
        sandboxes.append(made["id"])
        back.append(made["id"])

        # Billing against the log: stopped, every running second is charged once (a lost
        # one's up to its host's last heartbeat, at_ms).
        for sb in back:
            client.tool(sid, "stop_sandbox", {"sandboxId": sb})
        events = [json.loads(line) for line in
                  c1.cli("tap", "--since", "0", "--once", "sandbox.", timeout=120).stdout
                  .splitlines() if line.startswith("{")]
        last_seq = max(e["seq"] for e in events)
        expected = {}
        for sb in sandboxes:
            changes = [e for e in events if e["type"] == "sandbox.changed" and
                       e.get("sandbox_id") == sb]
            ms, since = 0, None
            for e in changes:
                ts = (calendar.timegm(time.strptime(e["ts"][:19], "%Y-%m-%dT%H:%M:%S")) * 1000 +
                      int(e["ts"][20:23]))
                if e.get("to") == "ready" and since is None:
                    since = ts
                elif e.get("to") != "ready" and since is not None:
                    end = e["at_ms"] if e.get("at_ms") and e["at_ms"] < ts else ts
                    ms, since = ms + max(end - since, 0), None
            self.assertIsNone(since, f"{sb} still running")
            expected[sb] = ms

        def billed():
            usage = json.loads(c1.cli("usage", "--account", "admin@localhost", "--json").stdout)
            if usage["last_seq"] < last_seq:
                return None
            return {s["sandbox_id"]: s["running_ms"] for s in usage["sandboxes"]}
        got = wait_for(billed, 120, "billing caught up with the log")
        diff = {sb: got.get(sb, 0) - expected[sb] for sb in sandboxes}
        print(f"  billed ms {got}, from the log {expected}", flush=True)
        self.assertEqual(diff, {sb: 0 for sb in sandboxes}, "billed time lost or doubled")

        figures = {
            "failovers": len(times),
            "failover_s": [round(t, 3) for t in times],
            "failover_median_s": round(statistics.median(times), 3),
            "failover_max_s": round(max(times), 3),
            "partition_s": round(partition, 3),
            "requests": len(outcomes),
            "requests_by_answer": codes,
            "requests_unanswered": len(unanswered),
            "billed_ms_lost_or_doubled": sum(abs(d) for d in diff.values()),
            "sandboxes": len(sandboxes),
            # Only the killed host's, each reported host lost (asserted above).
            "sandboxes_lost": len(dead),
            "sandboxes_lost_beyond": 0,  # every other sandbox answered (asserted above)
            "host_lost_after_s": round(lost_s, 3),
            "host_back_after_s": round(came_back, 3),
            "lost_after_ms": LOST_AFTER_MS,
            "move_s": round(move_s, 3),
            "snapshot_copy_s": round(copy_s, 3),
        }
        print("cluster figures: " + json.dumps(figures), flush=True)
        if os.environ.get("SBX_CLUSTER_FIGURES"):
            with open(os.environ["SBX_CLUSTER_FIGURES"], "w") as f:
                json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
