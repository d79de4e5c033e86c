"""Helpers for sbx integration tests: real daemons, real sockets, real files.

Each test runs `sbx up` (or single daemons) in a fresh data directory under /tmp,
talks to it with the real `sbx` CLI, and cleans up even when it fails. Nothing here
fakes a process: a helper only starts, waits for, reads or kills real ones.
"""
import json
import os
import socket
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from npmwork import npm_install, place

BIN = os.environ.get("SBX_BIN") or os.path.join(os.getcwd(), "bin")


def _slot():
    """Integration tests run two at a time (ctest -j2). What a vmd holds host-wide, its
    nftables tables and its guests' uid range, comes from the slot this process locks:
    slot 0 keeps vmd's defaults, slot N its own tables and range (docs/vmd.md, "Two vmds
    on one host"). The lock lasts as long as the process."""
    import fcntl
    for n in range(8):
        fd = os.open(f"/tmp/sbx-integration-slot-{n}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return n, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError("more than 8 integration tests at once: no slot left")


SLOT, _SLOT_FD = _slot()
# The settings of this slot, which every Sbx writes into its sbx.conf.
SLOT_SETTINGS = {} if SLOT == 0 else {
    "vmd.firewall_table": f"sbx_guests_{SLOT}", "vmd.egress_table": f"sbx_egress_{SLOT}",
    "vmd.guest_uid_first": str(1879048192 + SLOT * 65536)}
FIREWALL_TABLE = SLOT_SETTINGS.get("vmd.firewall_table", "sbx_guests")
EGRESS_TABLE = SLOT_SETTINGS.get("vmd.egress_table", "sbx_egress")


def binary(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not built (set SBX_BIN to the build's bin directory)")
    return path


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_GIVEN_PORTS = set()


def free_port():
    """A port nothing listens on, for a listener a test starts (and may restart). Taken
    below the kernel's ephemeral range, from this slot's own band: a port the kernel hands
    out may be any client connection's local port the moment a listener lets it go, and
    the listener's restart then fails with "Address already in use"."""
    band = 1500
    first = 20000 + SLOT * band
    if first + band > _ephemeral_low():  # a host with a wide ephemeral range: the old way
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    import random
    for port in random.sample(range(first, first + band), band):
        if port in _GIVEN_PORTS:
            continue
        try:
            with socket.socket() as sock:
                sock.bind(("0.0.0.0", port))
        except OSError:
            continue
        _GIVEN_PORTS.add(port)
        return port
    raise RuntimeError(f"no free port in {first}..{first + band - 1}")


def wait_for(predicate, timeout, what, interval=0.1):
    """Polls predicate until it returns a truthy value; fails the test with `what` (a
    callable is called then, to say what was seen at the end rather than at the start)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # the thing may not be up yet
            last = exc
        time.sleep(interval)
    if callable(what):
        what = what()
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def listening_ports():
    """The TCP ports something listens on (IPv4 and IPv6), from /proc/net: no connection is
    made, so a balancer being waited for forwards nothing to a gateway."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            pass
    return ports


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Sbx:
    """One sbx installation in a temporary data directory."""

    def __init__(self, test, name="sbx", settings=None, empty=False):
        """empty: leave the data directory empty, without even the slot's settings (a
        restore's target; the backup brings its sbx.conf)."""
        self.test = test
        self.dir = tempfile.mkdtemp(prefix=f"sbxtest-{name}-")
        self.up_proc = None
        self.up_out = os.path.join(self.dir, "up.out")
        self.extra = []  # other processes started by the test
        self.haproxy_proc = None  # the balancer, when the test runs one (haproxy())
        self.haproxy_port = None
        settings = {} if empty else {**SLOT_SETTINGS, **(settings or {})}
        if settings:
            with open(os.path.join(self.dir, "sbx.conf"), "w") as f:
                for k, v in settings.items():
                    f.write(f"{k} = {v}\n")
        test.addCleanup(self.cleanup)

    # -- the CLI ---------------------------------------------------------------
    def cli(self, *args, check=True, input=None, timeout=60):
        args = list(args)
        # Options go before `--`: what follows it is a command for the guest.
        at = args.index("--") if "--" in args else len(args)
        cmd = [binary("sbx")] + args[:at] + ["--data-dir", self.dir] + args[at:]
        # No input: /dev/null, never the test runner's stdin (exec would take a pipe's).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            # A CLI that hangs is a bug to find: its threads' stacks go in the failure.
            stacks = subprocess.run(["gdb", "-p", str(proc.pid), "-batch", "-ex",
                                     "thread apply all bt"], capture_output=True, text=True,
                                    timeout=60).stdout if shutil.which("gdb") else "(no gdb)"
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(cmd)} still running after {timeout} s:\n{err}\n"
                                 f"its stacks:\n{stacks}")
        res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
        return res

    def cli_json(self, *args, **kw):
        res = self.cli(*args, "--json", **kw)
        return json.loads(res.stdout)

    def status(self):
        res = self.cli("status", "--json", check=False)
        return json.loads(res.stdout)

    # -- sbx up ----------------------------------------------------------------
    def up(self, *args, wait=True):
        # Each test on its own free port, unless it chose one (first run only: sbx up
        # saves --listen in sbx.conf).
        if "--listen" not in args and not self.listen_port():
            args = args + ("--listen", f"127.0.0.1:{free_port()}")
        out = open(self.up_out, "ab")
        self.up_proc = subprocess.Popen(
            [binary("sbx"), "up", "--data-dir", self.dir, *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        if wait:
            self.wait_ready()
        return self.up_proc

    def listen_port(self):
        try:
            with open(os.path.join(self.dir, "sbx.conf")) as f:
                for line in f:
                    if line.strip().startswith("listen"):
                        return int(line.split("=")[1].strip().rsplit(":", 1)[1])
        except FileNotFoundError:
            pass
        return None

    def https(self, method, path, body=None, headers=None, timeout=30, port=None):
        """One request to the gateway (sbx up's, or the one listening on port) over HTTPS,
        trusting the local CA."""
        import http.client
        import ssl
        ctx = ssl.create_default_context(cafile=self.status()["ca_cert"])
        conn = http.client.HTTPSConnection("localhost", port or self.listen_port(), context=ctx,
                                           timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            res = conn.getresponse()
            return res.status, dict(res.getheaders()), res.read()
        finally:
            conn.close()

    def wait_ready(self, timeout=60):
        def ready():
            if self.up_proc and self.up_proc.poll() is not None:
                raise AssertionError(f"sbx up exited ({self.up_proc.returncode}):\n{self.output()}")
            st = self.status()
            return st if st["running"] and st["daemons"] and all(d["ready"] for d in st["daemons"]) else None
        try:
            return wait_for(ready, timeout, "every daemon ready")
        except AssertionError as exc:
            # What CI shows must say which daemon and why.
            try:
                status = self.status()
            except Exception as err:  # sbx status itself may be what fails
                status = err
            raise AssertionError(f"{exc}\nstatus: {status}\n{self.logs_tail()}") from None

    def logs_tail(self, lines=15):
        """sbx up's output and the end of each daemon's log, for a failure message."""
        parts = ["--- sbx up:\n" + "".join(self.output().splitlines(True)[-lines:])]
        logs = os.path.join(self.dir, "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                parts.append(f"--- {name}:\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(parts)

    def output(self):
        try:
            with open(self.up_out, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def daemon_pid(self, name):
        for d in self.status()["daemons"]:
            if d["name"] == name:
                return d["pid"]
        return None

    def log(self, name):
        try:
            with open(os.path.join(self.dir, "logs", f"{name}.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def start(self, name, *args):
        """Starts one daemon by hand (a second instance, say) against this data dir."""
        log = open(os.path.join(self.dir, "logs", f"{name}-extra-{len(self.extra)}.log"), "ab")
        proc = subprocess.Popen([binary(name), "--data-dir", self.dir, *args],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.extra.append(proc)
        return proc

    # -- a balancer in front of the gateways -------------------------------------
    def haproxy(self, backend_ports, port=None):
        """Runs a real HAProxy on 127.0.0.1:port (a free one the first time, the same one
        after) in front of the gateways listening on backend_ports, and returns its port.
        Called again, it stops the running one and starts one with the new list.

        TCP mode: TLS passes through to the gateways, which hold the certificate. Round
        robin, no stickiness: each new connection goes to the next gateway. Timeouts long
        enough for a 10-minute SSE answer. Every connection is logged, one line each, to
        haproxy.log in the data directory (haproxy_connections() reads it back)."""
        port = port or self.haproxy_port or free_port()
        self.stop_haproxy()
        servers = "".join(f"    server gw_{p} 127.0.0.1:{p}\n" for p in backend_ports)
        cfg = os.path.join(self.dir, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write("global\n"
                    "    log stdout format raw local0 info\n"
                    "    maxconn 2000\n"
                    "defaults\n"
                    "    mode tcp\n"
                    "    log global\n"
                    '    log-format "conn client_port=%cp server=%s bytes_in=%U bytes_out=%B '
                    'time_ms=%Tt term=%ts"\n'
                    "    balance roundrobin\n"
                    "    timeout connect 5s\n"
                    "    timeout client 600s\n"
                    "    timeout server 600s\n"
                    "listen sbx\n"
                    f"    bind 127.0.0.1:{port}\n" + servers)
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not os.access(haproxy, os.X_OK):
            raise AssertionError("haproxy is needed (scripts/install-deps.sh installs it)")
        log = open(os.path.join(self.dir, "haproxy.log"), "ab")
        self.haproxy_proc = subprocess.Popen([haproxy, "-f", cfg, "-db"], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.haproxy_port = port

        def listening():
            if self.haproxy_proc.poll() is not None:
                raise AssertionError(f"haproxy exited ({self.haproxy_proc.returncode}):\n"
                                     f"{self.haproxy_log()[-2000:]}")
            return port in listening_ports()
        wait_for(listening, 15, f"haproxy listening on {port}")
        return port

    def stop_haproxy(self):
        if self.haproxy_proc and self.haproxy_proc.poll() is None:
            self.haproxy_proc.terminate()
            try:
                self.haproxy_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy_proc.kill()
                self.haproxy_proc.wait()
        self.haproxy_proc = None

    def haproxy_log(self):
        try:
            with open(os.path.join(self.dir, "haproxy.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def haproxy_connections(self):
        """Every connection the balancer logged (it logs one when it ends), in order:
        dicts with client_port, server (the gateway's port, None when none was reached),
        bytes_in, bytes_out, term (HAProxy's termination state, "--" for a normal end)."""
        out = []
        for line in self.haproxy_log().splitlines():
            if not line.startswith("conn "):
                continue
            f = dict(kv.split("=", 1) for kv in line.split()[1:])
            server = f["server"]
            out.append({"client_port": int(f["client_port"]),
                        "server": int(server[3:]) if server.startswith("gw_") else None,
                        "bytes_in": int(f["bytes_in"]), "bytes_out": int(f["bytes_out"]),
                        "term": f["term"]})
        return out

    def stop(self, timeout=30):
        """SIGTERM to sbx up; returns its exit code once everything stopped."""
        if not self.up_proc:
            return None
        self.up_proc.send_signal(signal.SIGTERM)
        try:
            return self.up_proc.wait(timeout)
        finally:
            self.up_proc = None

    def cleanup(self):
        self.stop_haproxy()
        for proc in self.extra:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.up_proc and self.up_proc.poll() is None:
            self.up_proc.send_signal(signal.SIGTERM)
            try:
                self.up_proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.up_proc.pid, signal.SIGKILL)
                self.up_proc.wait()
        # Guests outlive vmd by design (the next vmd adopts them): a test's guests must be
        # ended with it, or they keep running (and using CPU) through the later tests.
        subprocess.run(["pkill", "-KILL", "-f", "--", f"qemu-system.* {self.dir}/"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Daemons of a killed supervisor must not outlive the test.
        subprocess.run(["pkill", "-KILL", "-f", "--", f"--data-dir {self.dir}"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.environ.get("SBX_KEEP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


MCP_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}


def mcp_post(s, key, body, sid=None, timeout=30):
    """One JSON-RPC message to /mcp with an API key: (status, lower-cased headers, body)."""
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "Authorization": f"Bearer {key}"}
    if sid:
        h["Mcp-Session-Id"] = sid
    status, hdrs, raw = s.https("POST", "/mcp", body=json.dumps(body), headers=h, timeout=timeout)
    return status, {k.lower(): v for k, v in hdrs.items()}, json.loads(raw) if raw else None


def mcp_session(s, key):
    """initialize + notifications/initialized: the new session's id."""
    _, hdrs, _ = mcp_post(s, key, MCP_INIT)
    sid = hdrs["mcp-session-id"]
    mcp_post(s, key, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    return sid


def mcp_call(test, s, key, sid, tool, args=None, ok=True, timeout=200):
    """tools/call, printed; (result, its text). ok: the result must not be an error."""
    status, _, body = mcp_post(s, key, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                        "params": {"name": tool, "arguments": args or {}}},
                               sid, timeout=timeout)
    test.assertEqual(status, 200, body)
    r = body["result"]
    text = r["content"][0]["text"]
    print(f"  {tool} {json.dumps(args or {})[:100]} → {text[:200]!r}")
    if ok:
        test.assertFalse(r.get("isError"), text)
    return r, text


# A process that keeps running in a guest: a counter it rewrites five times a second.
TICK_SH = "i=0; while true; do i=$((i+1)); echo $i > /tmp/tick.count; sleep 0.2; done\n"


class SandboxTest(unittest.TestCase):
    """Tests of one installation (cls.s, an Sbx) through one account's key (cls.key), over
    MCP: tools called (printed), commands run in guests, TICK_SH watched."""

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def call(self, sid, tool, args=None, ok=True, key=None):
        return mcp_call(self, self.s, key or self.key, sid, tool, args, ok, timeout=400)

    def sh(self, sid, sandbox, command, timeout=None):
        """The command's stdout (stripped); it must exit 0. timeout: exec's, in seconds."""
        args = {"sandboxId": sandbox, "command": command}
        if timeout:
            args["timeout"] = timeout
        r, text = self.call(sid, "exec", args)
        self.assertEqual(r["structuredContent"]["exitCode"], 0, text)
        return r["structuredContent"]["stdout"].strip()

    def counter_moves(self, sid, sandbox):
        """TICK_SH runs in this sandbox: its counter goes up."""
        # TICK_SH's echo truncates the file before it writes: a read in between is empty.
        first = wait_for(lambda: int(self.sh(sid, sandbox, "cat /tmp/tick.count")), 30,
                         f"a count in {sandbox}'s /tmp/tick.count")
        wait_for(lambda: int(self.sh(sid, sandbox, "cat /tmp/tick.count")) > first, 60,
                 f"the counter to move in {sandbox}")


HERE = os.path.dirname(os.path.abspath(__file__))


# -- the official MCP TypeScript SDK as a client ----------------------------------------
def install_sdk(test):
    """The official SDKs installed under the build tree (<build>/mcp-client, once): the
    directory to run client scripts from."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    test.assertTrue(node and npm, "node and npm are needed for the MCP SDK client")
    work = os.path.join(os.environ.get("SBX_BIN", os.getcwd()), "..", "mcp-client")
    os.makedirs(work, exist_ok=True)
    place(os.path.join(HERE, "mcp", "package.json"), work)
    npm_install(work, lambda: all(
        os.path.isdir(os.path.join(work, "node_modules", "@modelcontextprotocol", p))
        for p in ("sdk", "client")))
    return work


def run_sdk(test, s, key, *calls, url=None, fresh_connections=False, sdk="v1"):
    """Runs mcp_client.mjs (the official SDK) with TOOL ARGS pairs against url (by default
    the installation's mcp_url) and returns its steps. fresh_connections: one TCP and TLS
    connection per request (SBX_TEST_FRESH_CONNECTIONS=1), as a balancer in TCP mode must
    see them to spread one client's requests over several gateways. sdk: "v1" (the 2025
    era), or the SDK v2 client: "v2-legacy", "v2-auto" or "v2-2026" (mcp_client.mjs)."""
    node = shutil.which("node")
    work = install_sdk(test)
    place(os.path.join(HERE, "mcp_client.mjs"), work)
    st = s.status()
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=st["ca_cert"])
    env.pop("SBX_TEST_FRESH_CONNECTIONS", None)
    env["SBX_TEST_MCP_SDK"] = sdk
    if fresh_connections:
        env["SBX_TEST_FRESH_CONNECTIONS"] = "1"
    args = []
    for tool, arguments in calls:
        args += [tool, json.dumps(arguments)]
    res = subprocess.run([node, os.path.join(work, "mcp_client.mjs"), url or st["mcp_url"],
                          key, *args], capture_output=True, text=True, timeout=600, env=env)
    print("\nMCP SDK client:\n" + res.stdout[:6000] + res.stderr)
    test.assertEqual(res.returncode, 0, res.stdout[-2000:])
    steps = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    test.assertTrue(steps, "the SDK client exited without a step: " + res.stderr[-2000:])
    test.assertEqual(steps[-1]["step"], "done")
    return steps


def reference_scenarios(test, run):
    """Both scenarios of the reference documents, driven by the SDK client alone: run is
    run_sdk with the installation, key and connection choice bound. Used as they are by
    test_mcp.py (one gateway) and test_edge_balance.py (several, behind a balancer).
    Returns both runs' steps."""
    def text(step):
        return step["result"]["content"][0]["text"]
    # (a) create "demo", python, a detached sleep + echo polled until done, delete.
    steps_a = run(("create_sandbox", {"name": "demo"}),
                  ("exec", {"command": "python3 -c 'print(2**100)'"}),
                  ("exec", {"command": "sleep 2; echo done", "detached": True}),
                  ("@poll", {"max": 120}),
                  ("delete_sandbox", {"sandboxId": "$SB"}),
                  ("get_sandbox", {"sandboxId": "$SB"}))
    calls = [x for x in steps_a if x["step"] == "call"]
    sb = calls[0]["result"]["structuredContent"]["id"]
    test.assertTrue(text(calls[0]).startswith(f"Sandbox {sb} is ready. URL: https://"))
    test.assertEqual(text(calls[1]), "Exit code 0.\nstdout:\n1267650600228229401496703205376")
    pid = calls[2]["result"]["structuredContent"]["processId"]
    test.assertEqual(text(calls[2]), f"Started process {pid} in {sb}. Call command_status "
                                     f"with processId {pid} for its output and exit code.")
    done = calls[3]["result"]["structuredContent"]
    test.assertEqual((done["running"], done["exitCode"], done["stdout"]), (False, 0, "done\n"))
    test.assertEqual(text(calls[4]), f"Deleting {sb}: its disk, memory and automatic "
                                     "snapshots are removed.")
    test.assertTrue(calls[5]["result"]["isError"])
    test.assertEqual(text(calls[5]), "Sandbox not found (not_found)")

    # (b) uname, a web server published on 8000 and fetched through the gateway,
    # delete without an id refused, delete with it, then not_found.
    steps_b = run(("create_sandbox", {"name": "web"}),
                  ("exec", {"command": "uname -a"}),
                  ("exec", {"command": "cd /tmp && python3 -m http.server 8000",
                            "detached": True}),
                  ("exec", {"command": "for i in $(seq 120); do curl -s -o /dev/null "
                                       "localhost:8000 && exit 0; sleep 0.5; done; "
                                       "exit 1"}),
                  ("host_port", {"port": 8000, "public": True}),
                  ("@fetch", {}),
                  ("delete_sandbox", {}),
                  ("delete_sandbox", {"sandboxId": "$SB"}),
                  ("get_sandbox", {"sandboxId": "$SB"}))
    calls = [x for x in steps_b if x["step"] == "call"]
    sb = calls[0]["result"]["structuredContent"]["id"]
    test.assertTrue(text(calls[1]).startswith("Exit code 0.\nstdout:\nLinux "))
    test.assertEqual(text(calls[3]), "Exit code 0.")
    url = calls[4]["result"]["structuredContent"]["url"]
    test.assertEqual(text(calls[4]), f"Port 8000 of {sb} is at {url} (public).")
    fetched = [x for x in steps_b if x["step"] == "fetch"][0]
    test.assertEqual((fetched["url"], fetched["status"]), (url, 200))
    test.assertIn("Directory listing", fetched["body"])
    test.assertTrue(calls[5]["result"]["isError"])
    test.assertEqual(text(calls[5]), "sandboxId is required: the exact id (sb_…) of one "
                                     "sandbox; delete_sandbox has no default")
    test.assertFalse(calls[6]["result"].get("isError"), text(calls[6]))
    test.assertEqual(text(calls[7]), "Sandbox not found (not_found)")
    return steps_a, steps_b


def main():
    # ctest runs each file; unittest prints "Ran N tests" and OK/FAILED.
    unittest.main(verbosity=2)
