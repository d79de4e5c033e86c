#!/usr/bin/env python3
"""sbx benchmarks (issue 8): every figure a ratio against a baseline measured in the same run.

bench/run [--quick] [--build DIR] [--only PART,...] [--keep JSON]

--only files (or scale, or files,scale) --keep bench/results/<full run>.json reruns those
rows alone and writes the doc from the earlier full run with them replaced (its header
says which rows are from when); --render JSON [--keep JSON] rewrites the doc from results.
The scale part (bench/scale.py) is the control plane at 10,000 sandboxes (with
BENCH_SCALE_EVENTS=0 and --keep: without the million events, whose rows stay the kept
run's, labelled with its date); the cluster
part (bench/cluster.py) is failover across hosts in network namespaces (root, haproxy).
The kvm part puts boot to guest init and the VMM's memory beside Firecracker's published
figures, under KVM where vmd would use it (else under TCG, labelled, with the reason).

Builds the project (unless --build names a built tree), the bench's own programs
(bench/agentbench.c, bench/mhd_bare.c, bench/vmdsim.c, bench/ctlload.c) and the TypeScript
SDK server (npm, into
bench/node_modules), runs everything, writes bench/results/<timestamp>.json and rewrites
docs/benchmarks.md. It prints; it never fails on a figure (exit 0 unless it could not run).
Before anything it checks the tools it runs and says which are missing and how to install
them (scripts/install-deps.sh installs them all), exit 2.
"""
import argparse
import base64
import datetime
import glob
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIGOUT_CMD = "head -c 10485760 /dev/zero | base64 -w0 | head -c 10485760"
MiB = 1024 * 1024
SOURCE = {}


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    kw.setdefault("check", True)
    return subprocess.run(cmd, **kw)


def pct(values, p):
    v = sorted(values)
    if not v:
        return None
    k = max(0, min(len(v) - 1, int(round(p / 100 * (len(v) - 1)))))
    return v[k]


def med(values):
    return statistics.median(values) if values else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# -- prerequisites ----------------------------------------------------------------------
# What bench/run runs: (command, Debian package, the parts that need it; None: all).
TOOLS = [("cmake", "cmake", None), ("gcc", "build-essential", None),
         ("pkg-config", "pkg-config", None), ("git", "git", None),
         ("qemu-system-x86_64", "qemu-system-x86", None), ("npm", "npm", None),
         ("node", "nodejs", {"gateway"}), ("wrk", "wrk", {"gateway"}),
         ("haproxy", "haproxy", {"cluster"}), ("ip", "iproute2", {"cluster"})]
# The libraries bench/agentbench and bench/mhd_bare link: (pkg-config name, package).
LIBS = [("libczmq", "libczmq-dev"), ("libzmq", "libzmq3-dev"), ("jansson", "libjansson-dev"),
        ("libsodium", "libsodium-dev"), ("msgpack", "libmsgpack-dev"),
        ("libmicrohttpd", "libmicrohttpd-dev"), ("sqlite3", "libsqlite3-dev"),
        ("gnutls", "libgnutls28-dev"), ("libpsl", "libpsl-dev")]


def prerequisites(args, parts):
    """Exits (2) saying what is missing and how to install it, before anything runs."""
    missing = []
    for cmd, pkg, need in TOOLS:
        if cmd == "cmake" and args.build:
            continue  # a built tree was given
        if cmd == "npm" and os.path.isdir(os.path.join(HERE, "node_modules", "@modelcontextprotocol")):
            continue  # installed already
        if (need is None or parts & need) and not shutil.which(cmd):
            why = f" (for {', '.join(sorted(need))})" if need else ""
            missing.append((f"{cmd}{why}", pkg))
    if shutil.which("pkg-config"):
        for lib, pkg in LIBS:
            if subprocess.run(["pkg-config", "--exists", lib]).returncode:
                missing.append((f"the {lib} library (pkg-config {lib})", pkg))
    if not missing:
        return
    pkgs = " ".join(dict.fromkeys(pkg for _, pkg in missing))
    print("bench: missing on this machine: " + ", ".join(what for what, _ in missing) +
          ".\nInstall everything sbx and bench/run need (Debian 12, as root): "
          f"scripts/install-deps.sh\nor just these: apt-get install {pkgs}", file=sys.stderr)
    sys.exit(2)


# -- building -------------------------------------------------------------------------
def build(args):
    bdir = os.path.abspath(args.build or os.path.join(ROOT, "build-bench"))
    if args.build and not os.path.isfile(os.path.join(args.build, "CMakeCache.txt")):
        print(f"bench: --build {args.build} is not a built tree (no CMakeCache.txt)",
              file=sys.stderr)
        sys.exit(2)
    if not args.build:
        # -Wno-error=restrict: vmd/vmd_qmp.c:801 trips GCC 12's -Werror=restrict at -O2
        # (RelWithDebInfo) in its test fake; the Debug build does not see it.
        run(["cmake", "-S", ROOT, "-B", bdir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
             "-DCMAKE_C_FLAGS=-Wno-error=restrict"], stdout=subprocess.DEVNULL)
        if run(["cmake", "--build", bdir, "-j2"], stdout=subprocess.DEVNULL, check=False).returncode:
            sys.exit("bench: the project build failed (see above); fix it, or point --build at "
                     "a built tree (e.g. one of `git archive HEAD`)")
    # The headers of the tree that was built (a --build DIR may come from another checkout).
    src = ROOT
    try:
        with open(os.path.join(bdir, "CMakeCache.txt")) as f:
            src = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", f.read(), re.M).group(1)
    except (OSError, AttributeError):
        pass
    out = os.path.join(bdir, "bench")
    os.makedirs(out, exist_ok=True)
    git = run(["git", "-C", src, "describe", "--always", "--dirty"], capture_output=True,
              text=True, check=False)
    SOURCE["source"] = git.stdout.strip() if git.returncode == 0 else f"{src} (not a git checkout)"
    pc = lambda *p: run(["pkg-config", *p], capture_output=True, text=True).stdout.split()
    run(["gcc", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", f"-I{src}/vmd", f"-I{src}/vmd/agent",
         f"-I{src}/common", os.path.join(HERE, "agentbench.c"), "-o", f"{out}/agentbench",
         f"{bdir}/vmd/libvmd_lib.a", f"{bdir}/common/libsbx_common.a",
         f"{bdir}/common/libsbx_codec.a",
         *pc("--libs", "libczmq", "libzmq", "jansson", "libsodium", "msgpack")])
    # The control-plane bench's vmd load generator and broker driver (bench/scale.py).
    for prog in ("vmdsim", "ctlload"):
        run(["gcc", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
             f"-I{src}/common", f"-I{bdir}/common", os.path.join(HERE, prog + ".c"), "-o",
             f"{out}/{prog}", f"{bdir}/common/libsbx_common.a", f"{bdir}/common/libsbx_codec.a",
             *pc("--libs", "libczmq", "libzmq", "jansson", "libsodium", "msgpack"), "-lm"])
    # Billing's wallet check at a growing history (bench/wallet.py), on billing's library.
    run(["gcc", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
         f"-I{src}/common", f"-I{bdir}/common", f"-I{src}/billing",
         os.path.join(HERE, "walletbench.c"), "-o", f"{out}/walletbench",
         f"{bdir}/billing/libbill_lib.a", f"{bdir}/common/libsbx_common.a",
         f"{bdir}/common/libsbx_codec.a",
         *pc("--libs", "libczmq", "libzmq", "jansson", "libsodium", "msgpack", "sqlite3",
             "gnutls", "libpsl"), "-lm"])
    run(["gcc", "-O2", "-std=c11", "-D_GNU_SOURCE", os.path.join(HERE, "mhd_bare.c"), "-o",
         f"{out}/mhd_bare", *pc("--cflags", "--libs", "libmicrohttpd")])
    if not os.path.isdir(os.path.join(HERE, "node_modules", "@modelcontextprotocol")):
        run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=HERE, timeout=600)
    return bdir


KVM_GET_API_VERSION, KVM_CREATE_VM, KVM_API_VERSION = 0xAE00, 0xAE01, 12  # <linux/kvm.h>


def kvm_probe():
    """Whether KVM can run guests here, decided as vmd decides (vmd/vmd_qemu.c,
    vmd_qemu_kvm_usable): $SBX_ACCEL=kvm|tcg first; else vmx or svm among the CPU flags
    (a nested host without them opens /dev/kvm and still cannot boot a guest), /dev/kvm
    opens read-write, KVM_GET_API_VERSION answers 12 and KVM_CREATE_VM makes a VM.
    Every check is run and kept, so that `why` names all that failed."""
    import fcntl

    env = os.environ.get("SBX_ACCEL")
    if env in ("kvm", "tcg"):
        return {"usable": env == "kvm", "why": f"$SBX_ACCEL={env}", "checks": {}}
    checks = {}
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    checks["vmx_svm"] = "vmx" in flags or "svm" in flags
    checks["hypervisor"] = "hypervisor" in flags  # this host is itself a guest
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        checks["open"] = "ok"
    except OSError as e:
        fd, checks["open"] = None, "missing" if e.errno == 2 else e.strerror.lower()
    if fd is not None:
        try:
            checks["api_version"] = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
            vm = fcntl.ioctl(fd, KVM_CREATE_VM, 0)
            os.close(vm)
            checks["create_vm"] = "ok"
        except OSError as e:
            checks.setdefault("api_version", None)
            checks["create_vm"] = e.strerror.lower()
        finally:
            os.close(fd)
    failed = []
    if not checks["vmx_svm"]:
        failed.append("no vmx/svm in the CPU flags" +
                      (" (a VM without nested virtualisation)" if checks["hypervisor"] else ""))
    if checks["open"] != "ok":
        failed.append("no /dev/kvm" if checks["open"] == "missing" else
                      f"/dev/kvm does not open ({checks['open']})")
    else:
        if checks.get("api_version") != KVM_API_VERSION:
            failed.append(f"KVM_GET_API_VERSION answered {checks.get('api_version')}")
        if checks.get("create_vm") != "ok":
            failed.append(f"KVM_CREATE_VM: {checks.get('create_vm')}")
        elif failed:  # the CPU flags alone rule it out
            failed.append("/dev/kvm opens and KVM_CREATE_VM works, but guests do not boot "
                          "there without vmx/svm (vmd/image/README.md, KVM)")
    usable = not failed
    return {"usable": usable, "why": "; ".join(failed) or "vmx/svm, /dev/kvm and KVM_CREATE_VM "
            "all work", "checks": checks}


def machine(bdir):
    info = {}
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        info["cpu"] = m.group(1).strip() if m else platform.processor()
    info["cores"] = os.cpu_count()
    with open("/proc/meminfo") as f:
        info["memory_gib"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    info["kernel"] = platform.release()
    q = run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    info["qemu"] = q.splitlines()[0] if q else "?"
    probe = kvm_probe()
    info["accel"] = "KVM" if probe["usable"] else "TCG"
    info["accel_why"] = probe["why"]
    info["os"] = ""
    try:
        with open("/etc/os-release") as f:
            info["os"] = re.search(r'PRETTY_NAME="(.*)"', f.read()).group(1)
    except Exception:
        pass
    return info


# -- raw QEMU (the baselines) -----------------------------------------------------------
class RawGuest:
    """A QEMU started with vmd's exact argv (agentbench argv), its agent spoken to directly."""

    def __init__(self, bdir, name="rawbench", accel=None):
        """accel: None for what vmd would choose here, or "kvm"/"tcg" ($SBX_ACCEL, which
        vmd_qemu_kvm_usable honours)."""
        self.bdir = bdir
        self.dir = tempfile.mkdtemp(prefix="sbxbench-raw-")
        self.image = os.path.join(bdir, "image")
        self.ab = os.path.join(bdir, "bench", "agentbench")
        run([self.ab, "overlay", self.image, self.dir])
        env = dict(os.environ, **({"SBX_ACCEL": accel} if accel else {}))
        self.argv = run([self.ab, "argv", self.image, self.dir, name], capture_output=True,
                        text=True, env=env).stdout.splitlines()
        self.accel = self.argv[self.argv.index("-accel") + 1] if "-accel" in self.argv else "?"
        self.proc = None

    def boot(self, extra=()):
        """Spawn → agent.hello → agent.ping; returns (seconds to ping, client's other lines)."""
        log_fd = open(os.path.join(self.dir, "qemu.log"), "ab")
        t0 = self.t_spawn = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log_fd,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log_fd.close()
        res = run([self.ab, "client", os.path.join(self.dir, "agent.sock"), *extra],
                  capture_output=True, text=True, timeout=600)
        lines = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
        return lines[0]["ping"] - t0, lines[0]["hello"] - t0, lines[1:]

    def client(self, *extra):
        # The raw side's client keeps its buffers as the bench's own process does.
        res = run([self.ab, "client", os.path.join(self.dir, "agent.sock"), *extra],
                  capture_output=True, text=True, timeout=600,
                  env=dict(os.environ, GLIBC_TUNABLES=CLIENT_MALLOC))
        return [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")][1:]

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- sbx up -----------------------------------------------------------------------------
class Sbx:
    def __init__(self, bdir, capacity=12, settings=None):
        self.bin = os.path.join(bdir, "bin")
        self.dir = tempfile.mkdtemp(prefix="sbxbench-up-")
        self.port = free_port()
        with open(os.path.join(self.dir, "sbx.conf"), "w") as f:
            f.write(f"image_dir = {os.path.join(bdir, 'image')}\nvmd.capacity = {capacity}\n")
            # The bench measures sbx, not its plan limits: no request rate (a refusal
            # answers faster than any real call), no cap on running sandboxes or starts.
            f.write("plan.free.requests_per_second = 0\nplan.free.running = 0\n"
                    "plan.free.starts_per_day = 0\n")
            for k, v in (settings or {}).items():
                f.write(f"{k} = {v}\n")
        out = open(os.path.join(self.dir, "up.out"), "ab")
        self.proc = subprocess.Popen([os.path.join(self.bin, "sbx"), "up", "--data-dir", self.dir,
                                      "--listen", f"127.0.0.1:{self.port}"],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("sbx up exited:\n" + open(os.path.join(self.dir, "up.out")).read())
            try:
                st = self.status()
                if st["running"] and st["daemons"] and all(d["ready"] for d in st["daemons"]):
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sbx up not ready after 90 s")
            time.sleep(0.2)
        self.st = self.status()
        self.email = "bench@example.com"
        self.key = self.cli_json("account", "create", "--email", self.email)["api_key"]

    def cli(self, *args, timeout=120):
        args = list(args)
        at = args.index("--") if "--" in args else len(args)
        return run([os.path.join(self.bin, "sbx"), *args[:at], "--data-dir", self.dir, *args[at:]],
                   capture_output=True, text=True, timeout=timeout)

    def cli_json(self, *args):
        return json.loads(self.cli(*args, "--json").stdout)

    def status(self):
        return json.loads(self.cli("status", "--json").stdout)

    def files(self):
        """The gateway's certificate and key (for the baselines' identical TLS setup)."""
        cert = key = None
        for root, _, names in os.walk(self.dir):
            for n in names:
                p = os.path.join(root, n)
                if n.endswith((".crt", ".pem", ".key")):
                    with open(p, errors="replace") as f:
                        head = f.read(200)
                    if "PRIVATE KEY" in head and "ca" not in n.lower():
                        key = key or p
                    elif "CERTIFICATE" in head and "ca" not in n.lower():
                        cert = cert or p
        return cert, key

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Guests outlive vmd on purpose: end the QEMUs of this data directory, by pid.
        vms = os.path.join(self.dir, "vms")
        for d in os.listdir(vms) if os.path.isdir(vms) else []:
            try:
                with open(os.path.join(vms, d, "qemu.pid")) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class Mcp:
    """One kept-alive HTTPS connection speaking MCP (one JSON-RPC message per POST)."""

    def __init__(self, port, key, cafile=None, host="localhost"):
        ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl._create_unverified_context()
        self.conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=900)
        self.key = key
        self.sid = None
        self.rid = 0
        r, h = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "bench", "version": "0"}}})
        self.sid = h.get("mcp-session-id")
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg):
        """msg: a JSON-RPC message, or its serialised bytes (see call_body)."""
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Authorization": f"Bearer {self.key}", "MCP-Protocol-Version": "2025-06-18"}
        if self.sid:
            h["Mcp-Session-Id"] = self.sid
        body = msg if isinstance(msg, bytes) else json.dumps(msg)
        try:
            self.conn.request("POST", "/mcp", body=body, headers=h)
            res = self.conn.getresponse()
        except (OSError, http.client.HTTPException):
            # The server closed the kept-alive connection (idle timeout while wrk ran):
            # once more on a new one.
            self.conn.close()
            self.reconnects = getattr(self, "reconnects", 0) + 1
            self.conn.request("POST", "/mcp", body=body, headers=h)
            res = self.conn.getresponse()
        raw = res.read()
        hdrs = {k.lower(): v for k, v in res.getheaders()}
        return (json.loads(raw) if raw else None), hdrs

    def call_body(self, tool, args=None):
        """A tools/call serialised ahead, for call: a file's request is made before the
        clock starts, as its base64 is (Python's json.dumps of 13.3 MiB of base64 takes
        90-150 ms here, more than the gateway's whole work on it; bench/notes.md)."""
        self.rid += 1
        return json.dumps({"jsonrpc": "2.0", "id": self.rid, "method": "tools/call",
                           "params": {"name": tool, "arguments": args or {}}}).encode()

    def call(self, tool, args=None):
        if isinstance(tool, bytes):
            body, _ = self.post(tool)
        else:
            self.rid += 1
            body, _ = self.post({"jsonrpc": "2.0", "id": self.rid, "method": "tools/call",
                                 "params": {"name": tool, "arguments": args or {}}})
        r = body["result"]
        if r.get("isError"):
            raise RuntimeError(f"{tool if isinstance(tool, str) else 'tools/call'}: "
                               f"{r['content'][0]['text']}")
        return r


# -- the parts --------------------------------------------------------------------------
def part_raw_exec(bdir, res):
    """A raw guest for the exec baselines; it stays up so that the
    `true` round trips can be measured in batches interleaved with the MCP ones."""
    g = RawGuest(bdir)
    try:
        g.boot()
        time.sleep(3)
    except BaseException:
        g.close()
        raise
    return g


def proc_mem(pid):
    m = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                m[parts[0][:-1].lower() + "_mib"] = int(parts[1]) / 1024
    return m


def guest_ram(pid):
    """Rss and Pss (MiB) of the largest mapping of the QEMU: the guest's RAM."""
    best, cur = None, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                cur = {}
            elif parts[0] in ("Size:", "Rss:", "Pss:") and cur is not None:
                cur[parts[0][:-1]] = int(parts[1]) / 1024
                if parts[0] == "Pss:" and (best is None or cur["Size"] > best["Size"]):
                    best = cur
    return best


def tcg_cache(pid):
    """Pss (MiB) of TCG's translation cache: the QEMU's anonymous rwx mapping (none
    under KVM: 0)."""
    pss, cur = 0.0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ \d+\s*(\S*)", line)
            if m:
                cur = m.group(1) == "rwxp" and not m.group(2)
            elif cur and line.startswith("Pss:"):
                pss += int(line.split()[1]) / 1024
    return pss


def template_memfd_mib(sbx):
    """What vmd's sealed memfds of template RAM hold (MiB): shared by its clones, counted
    once on top of their PSS for the host's total."""
    with open(os.path.join(sbx.dir, "run", "up.json")) as f:
        pid = [d["pid"] for d in json.load(f)["daemons"] if d["name"] == "sbx-vmd"][0]
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:sbx-template-ram"):
                total += os.stat(path).st_blocks * 512
        except OSError:
            pass
    return total / (1 << 20)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def raw_boot(bdir, i, n, res, idle=False):
    g = RawGuest(bdir)
    try:
        t, th, _ = g.boot()
        res.setdefault("raw_boot_s", []).append(t)
        res.setdefault("raw_hello_s", []).append(th)
        log(f"raw boot {i + 1}/{n}: {t:.3f} s to agent.ping (hello {th:.3f} s)")
        if idle:
            time.sleep(3)
            res["raw_idle"] = proc_mem(g.proc.pid)
    finally:
        g.close()


def part_lifecycle(sbx, bdir, n, res):
    """Raw QEMU boot and create_sandbox in turn (raw, create, raw, create...), so that
    the load of the moment weighs on both alike; each sandbox but the last deleted."""
    mcp = Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
    cold, delete, gone = [], [], []
    for i in range(n):
        raw_boot(bdir, i, n, res, idle=(i == n - 1))
        t0 = time.monotonic()
        r = mcp.call("create_sandbox", {"name": f"cold{i}", "ttlSeconds": 3600})
        cold.append(time.monotonic() - t0)
        sb = r["structuredContent"]["id"]
        log(f"create_sandbox {i + 1}/{n}: {cold[-1]:.3f} s")
        if i < n - 1:
            t0 = time.monotonic()
            mcp.call("delete_sandbox", {"sandboxId": sb})
            delete.append(time.monotonic() - t0)
            wait_gone(sbx, sb)
            gone.append(time.monotonic() - t0)
    res["cold_s"], res["delete_s"], res["delete_gone_s"] = cold, delete, gone
    return mcp, sb


def part_template(bdir, n, res, density=0, idle_s=10, more=0):
    """create_sandbox restoring vmd's booted template of the small type (vmd.templates =
    small, docs/snapshots.md) instead of booting: its own sbx, after the template is made.
    Each create must say so in vmd's log, or the figure is not taken."""
    sbx = Sbx(bdir, capacity=max(12, more + 2), settings={"vmd.templates": "small"})
    try:
        # DIR/templates/<vmd instance>/<image>-small-<qemu>/qemu.version, written last.
        deadline = time.monotonic() + 300
        while not glob.glob(os.path.join(sbx.dir, "templates", "*", "*-small-*", "qemu.version")):
            if time.monotonic() > deadline:
                raise RuntimeError("vmd made no small template in 300 s")
            time.sleep(0.5)
        mcp = Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
        times = []
        for i in range(n):
            t0 = time.monotonic()
            r = mcp.call("create_sandbox", {"name": f"tmpl{i}", "ttlSeconds": 3600})
            times.append(time.monotonic() - t0)
            sb = r["structuredContent"]["id"]
            with open(os.path.join(sbx.dir, "logs", "sbx-vmd.log")) as f:
                if f"sandbox={sb} from the small template" not in f.read():
                    raise RuntimeError(f"{sb} was not made from the template")
            log(f"create_sandbox from the template {i + 1}/{n}: {times[-1]:.3f} s")
            mcp.call("delete_sandbox", {"sandboxId": sb})
            wait_gone(sbx, sb)
        res["template_s"] = times
        if density:
            # Clones of the template map its RAM copy-on-write (docs/snapshots.md).
            part_density(sbx, mcp, density, idle_s, res, key="density_clones", more=more)
    finally:
        sbx.close()


DOCKERFILE = """FROM sbx
RUN mkdir -p /srv/site && echo '<h1>bench</h1>' > /srv/site/index.html
ENV GREETING=hello
WORKDIR /srv/site
RUN python3 -c "import json; print(json.dumps({'built': True}))" > built.json
CMD ["python3", "-m", "http.server", "8000"]
"""


def part_dockerfile(bdir, n, res):
    """A template built from a Dockerfile (`sbx template build`, docs/cli.md): the build
    from nothing, the same build again (every step from the cache), and then n creates
    of create_sandbox {template} taken in turn with n cold creates (vmd.templates off:
    each boots), on one sbx. Each template create must answer its start command's HTTP
    at once (checked once), or the figure is not taken."""
    sbx = Sbx(bdir, settings={"vmd.templates": ""})
    ctx = tempfile.mkdtemp(prefix="sbxbench-ctx-")
    try:
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write(DOCKERFILE)
        for key in ("dockerfile_build_s", "dockerfile_cached_s"):
            t0 = time.monotonic()
            out = sbx.cli("template", "build", "web", ctx, "--account", sbx.email, "--json",
                          timeout=900)
            if out.returncode:
                raise RuntimeError(f"sbx template build failed:\n{out.stdout}{out.stderr}")
            res[key] = [time.monotonic() - t0]
            built = json.loads(out.stdout.splitlines()[-1])
            log(f"template build ({key}): {res[key][0]:.3f} s, {built['cached']} of "
                f"{built['steps']} steps cached")
        if built["run"] != 0:
            raise RuntimeError(f"the second build ran steps again: {built}")
        mcp = Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
        res["dockerfile_create_s"], res["dockerfile_cold_s"] = [], []
        for i in range(n):
            for key, args in (("dockerfile_cold_s", {}), ("dockerfile_create_s",
                                                         {"template": "web"})):
                t0 = time.monotonic()
                r = mcp.call("create_sandbox", {"ttlSeconds": 3600, **args})
                res[key].append(time.monotonic() - t0)
                sb = r["structuredContent"]["id"]
                if i == 0 and args:
                    got = mcp.call("exec", {"sandboxId": sb, "command":
                                            "curl -s http://127.0.0.1:8000/index.html"})
                    if "<h1>bench</h1>" not in got["structuredContent"].get("stdout", ""):
                        raise RuntimeError(f"{sb}: the template's server does not answer: {got}")
                log(f"create_sandbox {args or '(cold)'} {i + 1}/{n}: {res[key][-1]:.3f} s")
                mcp.call("delete_sandbox", {"sandboxId": sb})
                wait_gone(sbx, sb)
    finally:
        sbx.close()
        shutil.rmtree(ctx, ignore_errors=True)


def template_ready(sbx):
    """Waits for vmd's small template (its qemu.version is written last)."""
    deadline = time.monotonic() + 300
    while not glob.glob(os.path.join(sbx.dir, "templates", "*", "*-small-*", "qemu.version")):
        if time.monotonic() > deadline:
            raise RuntimeError("vmd made no small template in 300 s")
        time.sleep(0.5)


def vmd_paused_ms(sbx, snapshot_id):
    """How long vmd says the capture into snapshot_id paused its guest (its log line)."""
    with open(os.path.join(sbx.dir, "logs", "sbx-vmd.log")) as f:
        found = re.findall(rf"snapshot into \S*/{snapshot_id} done \(paused (\d+) ms\)", f.read())
    return int(found[-1]) if found else None


def part_fork(bdir, n, res):
    """fork_sandbox (docs/snapshots.md, "Fork") on its own sbx with templates on (the
    default), against what it replaces, in the same run, round after round: a create
    from the template (the fastest new sandbox there is, without the source's state);
    save_snapshot then create_sandbox from it once per copy (the way to copies before
    fork, in one MCP connection as a model calls tools). The source runs a process that
    writes a file five times a second. Pauses: fork's pausedMs (vmd: QEMU's STOP to its
    RESUME) and, as vmd logs it, save_snapshot's (a capture that stops the guest first).
    The first fork of a fresh sandbox is its own row: its first capture reads all of its
    RAM once (a template clone maps it from the template)."""
    sbx = Sbx(bdir, settings={"vmd.templates": "small"})
    try:
        template_ready(sbx)
        mcp = Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
        r = mcp.call("create_sandbox", {"name": "fork-source", "ttlSeconds": 3600})
        src = r["structuredContent"]["id"]
        mcp.call("exec", {"sandboxId": src, "detached": True, "command":
                          "i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.2; done"})
        mcp.call("write_file", {"sandboxId": src, "path": "/root/state.txt",
                                "content": "x" * 4096})
        time.sleep(2)

        def fork(count):
            t0 = time.monotonic()
            sc = mcp.call("fork_sandbox", {"sandboxId": src, "count": count})["structuredContent"]
            took = time.monotonic() - t0
            for c in sc["sandboxes"]:
                mcp.call("delete_sandbox", {"sandboxId": c["id"]})
            for c in sc["sandboxes"]:
                wait_gone(sbx, c["id"])
            return took, sc["pausedMs"], sc["captureMs"]

        took, paused, capture = fork(1)
        res["fork_first_s"], res["fork_first_paused_ms"] = took, paused
        log(f"first fork of a fresh sandbox (1 copy): {took:.3f} s, paused {paused} ms, "
            f"capture {capture} ms")
        keys = ("fork2_s", "fork4_s", "fork_paused_ms", "fork_capture_ms", "fork_template_s",
                "fork_save_s", "fork_save_paused_ms", "fork_save_create2_s")
        for k in keys:
            res[k] = []
        for i in range(n):
            for count in (2, 4):
                took, paused, capture = fork(count)
                res[f"fork{count}_s"].append(took)
                res["fork_paused_ms"].append(paused)
                res["fork_capture_ms"].append(capture)
                log(f"fork of {count} {i + 1}/{n}: {took:.3f} s (paused {paused} ms, capture "
                    f"{capture} ms)")
            t0 = time.monotonic()
            sb = mcp.call("create_sandbox", {"ttlSeconds": 3600})["structuredContent"]["id"]
            res["fork_template_s"].append(time.monotonic() - t0)
            mcp.call("delete_sandbox", {"sandboxId": sb})
            wait_gone(sbx, sb)
            # The way before fork: a snapshot, then a create from it per copy.
            t0 = time.monotonic()
            snap = mcp.call("save_snapshot", {"sandboxId": src})["structuredContent"]["id"]
            res["fork_save_s"].append(time.monotonic() - t0)
            res["fork_save_paused_ms"].append(vmd_paused_ms(sbx, snap))
            made = [mcp.call("create_sandbox", {"snapshotId": snap, "ttlSeconds": 3600})
                    ["structuredContent"]["id"] for _ in range(2)]
            res["fork_save_create2_s"].append(time.monotonic() - t0)
            log(f"template create {res['fork_template_s'][-1]:.3f} s; save_snapshot + 2 creates "
                f"{res['fork_save_create2_s'][-1]:.3f} s (paused {res['fork_save_paused_ms'][-1]} ms)")
            for c in made:
                mcp.call("delete_sandbox", {"sandboxId": c})
            for c in made:
                wait_gone(sbx, c)
            mcp.call("delete_snapshot", {"snapshotId": snap})
    finally:
        sbx.close()


def smaps_groups(pid):
    """A QEMU's memory by kind (MiB of Rss, Pss and Private_*): guest RAM (its largest
    mapping), TCG's translation cache (the anonymous rwx mapping; none under KVM), the
    guest kernel and initrd files QEMU keeps mapped, QEMU's binary and libraries, and
    heap and other anonymous memory (TCG's bookkeeping included under TCG)."""
    maps, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$", line)
            if m:
                cur = {"perms": m.group(3), "path": m.group(4).strip(), "Size": 0.0, "Rss": 0.0,
                       "Pss": 0.0, "Private": 0.0}
                maps.append(cur)
                continue
            parts = line.split()
            if cur is not None and parts[0] in ("Size:", "Rss:", "Pss:"):
                cur[parts[0][:-1]] = int(parts[1]) / 1024
            elif cur is not None and parts[0] in ("Private_Clean:", "Private_Dirty:"):
                cur["Private"] += int(parts[1]) / 1024
    ram = max(maps, key=lambda m: m["Size"])
    groups = {}
    for m in maps:
        path = m["path"]
        if m is ram:
            g = "guest_ram"
        elif m["perms"] == "rwxp" and not path:
            g = "tcg_cache"
        elif path.endswith("/vmlinux"):
            g = "vmlinux"
        elif path.endswith("/initrd.img"):
            g = "initrd"
        elif path.startswith("/") and "qemu-system" in os.path.basename(path):
            g = "qemu_binary"
        elif path.startswith("/"):
            g = "libraries"
        else:
            g = "heap_anon"  # [heap], [stack], anonymous
        t = groups.setdefault(g, {"rss": 0.0, "pss": 0.0, "private": 0.0})
        t["rss"] += m["Rss"]
        t["pss"] += m["Pss"]
        t["private"] += m["Private"]
    groups.setdefault("tcg_cache", {"rss": 0.0, "pss": 0.0, "private": 0.0})
    groups["guest_ram"]["size"] = ram["Size"]
    total = {k: sum(g[k] for g in groups.values()) for k in ("rss", "pss", "private")}
    vmm = {k: total[k] - groups["guest_ram"][k] - groups["tcg_cache"][k] for k in total}
    return {"groups": groups, "total": total, "vmm": vmm}


GUEST_INIT = re.compile(r"^\[\s*(\d+\.\d+)\] Run (\S+) as init process", re.M)
MARK = re.compile(r"^\[\s*(\d+\.\d+)\] sbxbench-mark", re.M)


def kvm_boot(bdir, accel, idle_s):
    """One raw guest with vmd's argv under accel: the boot's phases on the host's clock
    and, idle_s after ready, its QEMU's memory by kind (smaps_groups).

    Guest init is where Firecracker's figure ends: the guest kernel starting its first
    user-space process (/init of the initramfs; the kernel's "Run /init as init process",
    kept in its log even with `quiet`). The log's clock is the guest kernel's, which starts
    early in its setup; it is put on the host's clock through a mark the harness has the
    agent write into the same log (`echo sbxbench-mark >/dev/kmsg`), taken to have been
    written halfway through that exec's round trip (the window is kept: ± half of it)."""
    g = RawGuest(bdir, accel=accel)
    try:
        if g.accel.split(",")[0] != accel:
            raise RuntimeError(f"vmd's argv says -accel {g.accel}, asked for {accel}")
        ping, hello, lines = g.boot(["--cmd", "echo sbxbench-mark >/dev/kmsg", "--cmd", "dmesg"])
        t0 = g.t_spawn
        mark, dmesg = lines[0], lines[1]["stdout"]
        m_init, m_mark = GUEST_INIT.search(dmesg), MARK.search(dmesg)
        if not (m_init and m_mark):
            raise RuntimeError("the guest's log has no init or mark line:\n" + dmesg[-2000:])
        clock0 = (mark["sent"] + mark["answered"]) / 2 - float(m_mark.group(1))  # host time
        out = {"accel": g.accel, "init": m_init.group(2),
               "kernel_clock0_s": clock0 - t0,
               "init_s": clock0 + float(m_init.group(1)) - t0,
               "init_guest_clock_s": float(m_init.group(1)),
               "hello_s": hello, "ping_s": ping,
               "mark_window_s": mark["answered"] - mark["sent"]}
        time.sleep(idle_s)
        out["memory"] = smaps_groups(g.proc.pid)
        return out
    finally:
        g.close()


def part_kvm(bdir, n, idle_s, res):
    """Firecracker's published figures beside sbx's guests (issue 21 item 4): QEMU spawn →
    guest init and the VMM's memory beyond the guest's RAM, with vmd's exact argv (raw
    guests, as the boot baseline). Under KVM when KVM is usable here (decided as vmd
    decides, kvm_probe), then also under TCG for comparison ($SBX_ACCEL=tcg), the two in
    turn; where it is not, under TCG alone, labelled so, with the reason found."""
    probe = kvm_probe()
    accels = ["kvm", "tcg"] if probe["usable"] else ["tcg"]
    runs = []
    for i in range(n):
        for accel in accels:
            r = kvm_boot(bdir, accel, idle_s)
            runs.append(r)
            log(f"kvm part {i + 1}/{n} {r['accel']}: init {r['init_s']:.3f} s (kernel clock 0 "
                f"at {r['kernel_clock0_s']:.3f} s, ±{r['mark_window_s'] / 2 * 1000:.0f} ms), "
                f"hello {r['hello_s']:.3f} s; VMM PSS {r['memory']['vmm']['pss']:.1f} MiB, "
                f"RSS {r['memory']['vmm']['rss']:.1f} MiB")
    res["kvm"] = {**probe, "runs": runs, "idle_s": idle_s}


def wait_gone(sbx, sb, timeout=30):
    d = os.path.join(sbx.dir, "vms", sb)
    deadline = time.monotonic() + timeout
    while os.path.exists(d) and time.monotonic() < deadline:
        time.sleep(0.05)


def part_stop_resume(sbx, mcp, cycles, res):
    """Stop/resume cycles of a fresh sandbox (also the billing check): 1 s running
    between the calls, then deleted."""
    stop, resume, wall = [], [], []  # wall: (ready answered, stop called, stop answered)
    sb = mcp.call("create_sandbox", {"name": "cycles", "ttlSeconds": 3600})["structuredContent"]["id"]
    last_ready = time.time()
    time.sleep(1)
    for i in range(cycles):
        t_stop = time.time()
        t0 = time.monotonic()
        mcp.call("stop_sandbox", {"sandboxId": sb})
        stop.append(time.monotonic() - t0)
        wall.append((last_ready, t_stop, time.time()))
        t0 = time.monotonic()
        mcp.call("resume_sandbox", {"sandboxId": sb})
        resume.append(time.monotonic() - t0)
        last_ready = time.time()
        log(f"cycle {i + 1}/{cycles}: stop {stop[-1]:.3f} s, resume {resume[-1]:.3f} s")
        time.sleep(1)
    t_stop = time.time()
    mcp.call("stop_sandbox", {"sandboxId": sb})
    wall.append((last_ready, t_stop, time.time()))
    res["stop_s"], res["resume_s"] = stop, resume
    time.sleep(2)  # let billing read the log
    usage = sbx.cli_json("usage", "--account", sbx.email)
    billed = [s for s in usage["sandboxes"] if s["sandbox_id"] == sb]
    res["billed_running_ms"] = billed[0]["running_ms"] if billed else None
    tap = sbx.cli("tap", "--since", "0", "--once", "--json", "sandbox.")
    events = [json.loads(l) for l in tap.stdout.splitlines() if l.startswith("{")]
    res["events"] = [{k: e.get(k) for k in ("seq", "ts", "from", "to")} for e in events
                     if e.get("subject") == sb]
    res["event_running_s"] = running_from_events(events, sb)
    mcp.call("delete_sandbox", {"sandboxId": sb})
    wait_gone(sbx, sb)
    # Wall clock: a span runs from the resume's (or create's) answer to the stop's
    # answer (upper bound) or the stop's call (lower bound).
    res["wall_running_lo_s"] = sum(s - r for r, s, _ in wall)
    res["wall_running_hi_s"] = sum(e - r for r, _, e in wall)
    res["billing_cycles"] = cycles


def ts_seconds(ts):
    if isinstance(ts, (int, float)):
        return ts / 1000 if ts > 1e11 else ts
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def running_from_events(events, sb):
    total, since = 0.0, None
    for e in events:
        if e.get("subject") != sb and e.get("sandbox_id") != sb:
            continue
        state = e.get("to") or e.get("state")
        t = ts_seconds(e["ts"])
        if state == "ready" and since is None:
            since = t
        elif state in ("stopped", "stopping", "deleting", "deleted", "error") and since is not None:
            total += t - since
            since = None
    return total


def part_exec(mcp, sb, n, res, raw):
    """exec `true`: 10 batches each way, alternating raw agent / MCP, so that the load of
    the moment weighs on both alike."""
    lat, base = [], []
    for _ in range(3):  # warm-up, untimed, as on the raw side
        mcp.call("exec", {"sandboxId": sb, "command": "true"})
    for _ in range(10):
        base += raw.client("--exec", str(n // 10))[0]["exec_true_s"]
        for _ in range(n // 10):
            t0 = time.monotonic()
            mcp.call("exec", {"sandboxId": sb, "command": "true"})
            lat.append(time.monotonic() - t0)
    res["mcp_exec_true_s"] = lat
    res["raw_exec_true_s"] = base


# Untimed files rounds first, as the exec part's warm-up calls: the client's heap grows
# to hold a round's buffers in them. Without, read_file faulted 13.3 MiB of fresh pages
# into this process (ru_minflt 6,827, 3,413, 3,413, then 0) on timed rounds, 45 ms each
# on this VM (bench/notes.md); a round also drops its answers before the next.
FILES_WARMUP = 3


def part_files(sbx, mcp, sb, bdir, n, res):
    """10 MiB files, FILES_WARMUP untimed rounds then N, then 10 MiB of stdout, one
    untimed round then N. Each round the raw agent first (agentbench --files, or --bigout,
    on a raw guest), then MCP (write_file and read_file with base64; command_status from
    the offsets) and REST (PUT and GET of the raw bytes), so that the load of the moment
    weighs on all alike. The files go first and apart from the stdout: the transfers
    after an MCP drain of 10 MiB of output run slower in the guest for a while, whichever
    door they come through (bench/notes.md), and with both in one round that fell on
    write_file and read_file alone. That effect has its own row: a GET right after a
    drain, N times, against the files rounds' GET."""
    raw = RawGuest(bdir)
    try:
        raw.boot()
        time.sleep(3)
        blob = bytes((i * 7 + 3) & 255 for i in range(MiB)) * 10
        b64 = base64.b64encode(blob).decode()
        rest = Rest(sbx.port, sbx.key, sbx.st.get("ca_cert"))
        path = f"/v1/sandboxes/{sb}/files?path=/root/bench.bin"
        for k in ("bigout_s", "bigout_bytes", "write_s", "read_s"):
            res.setdefault("raw_" + k, [])
        for k in ("bigout_s", "bigout_bytes", "write_s", "read_s", "rest_write_s", "rest_read_s",
                  "rest_read_drained_s"):
            res.setdefault("mcp_" + k, [])
        res["files_ok"] = True

        def raw_round(*what, into=res):
            for line in raw.client(*what):
                for k, v in line.items():
                    if "raw_" + k in into:
                        into["raw_" + k].append(v)

        for i in range(-FILES_WARMUP, n):
            # Warm-up rounds are the same round with its figures dropped.
            keep = res if i >= 0 else {k: [] for k in res if isinstance(res[k], list)}
            raw_round("--files", into=keep)
            request = mcp.call_body("write_file", {"sandboxId": sb, "path": "/root/bench.bin",
                                                   "encoding": "base64", "content": b64})
            t0 = time.monotonic()
            mcp.call(request)
            keep["mcp_write_s"].append(time.monotonic() - t0)
            request = None  # nothing of a round outlives it: the client's heap stays put
            t0 = time.monotonic()
            r = mcp.call("read_file", {"sandboxId": sb, "path": "/root/bench.bin",
                                       "encoding": "base64"})
            keep["mcp_read_s"].append(time.monotonic() - t0)
            res["files_ok"] &= base64.b64decode(r["structuredContent"]["content"]) == blob
            r = None
            t0 = time.monotonic()
            status, _ = rest.request("PUT", path, blob)
            keep["mcp_rest_write_s"].append(time.monotonic() - t0)
            res["files_ok"] &= status == 200
            t0 = time.monotonic()
            status, body = rest.request("GET", path)
            keep["mcp_rest_read_s"].append(time.monotonic() - t0)
            res["files_ok"] &= status == 200 and body == blob
            body = None
            log(f"files {f'warm-up {i + FILES_WARMUP + 1}/{FILES_WARMUP}' if i < 0 else f'{i + 1}/{n}'}: raw write "
                f"{keep['raw_write_s'][-1]:.3f} s read {keep['raw_read_s'][-1]:.3f} s; MCP "
                f"{keep['mcp_write_s'][-1]:.3f} / {keep['mcp_read_s'][-1]:.3f} s; REST "
                f"{keep['mcp_rest_write_s'][-1]:.3f} / {keep['mcp_rest_read_s'][-1]:.3f} s")
        raw.client("--bigout")  # untimed, each way, as the files' warm-up
        s_bigout(mcp, sb)
        for i in range(n):
            raw_round("--bigout")
            s, got = s_bigout(mcp, sb)
            res["mcp_bigout_s"].append(s)
            res["mcp_bigout_bytes"].append(got)
            log(f"stdout {i + 1}/{n}: raw {res['raw_bigout_s'][-1]:.3f} s, MCP {s:.3f} s")
        for i in range(n):
            s_bigout(mcp, sb)
            t0 = time.monotonic()
            status, body = rest.request("GET", path)
            res["mcp_rest_read_drained_s"].append(time.monotonic() - t0)
            res["files_ok"] &= status == 200 and body == blob
            log(f"GET right after a drain {i + 1}/{n}: {res['mcp_rest_read_drained_s'][-1]:.3f} s")
    finally:
        raw.close()


def s_bigout(mcp, sb):
    """10 MiB of stdout: detached, then command_status from the offsets (1 MiB an answer),
    waiting up to 5 s for output when none is new (waitSeconds, as the raw side's
    agent.status wait_ms)."""
    t0 = time.monotonic()
    r = mcp.call("exec", {"sandboxId": sb, "command": BIGOUT_CMD, "detached": True})
    pid = r["structuredContent"]["processId"]
    off, got = 0, 0
    while True:
        r = mcp.call("command_status", {"sandboxId": sb, "processId": pid, "stdoutOffset": off,
                                        "waitSeconds": 5})
        sc = r["structuredContent"]
        chunk = sc.get("stdout") or ""
        got += len(chunk.encode())
        nxt = sc.get("stdoutNextOffset", off)
        if not sc.get("running") and nxt == off:
            break
        off = nxt
    return time.monotonic() - t0, got


class Rest:
    """One kept-alive HTTPS connection to the REST API."""

    def __init__(self, port, key, cafile=None, host="localhost"):
        ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl._create_unverified_context()
        self.conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=900)
        self.key = key

    def request(self, method, path, body=None):
        h = {"Authorization": f"Bearer {self.key}"}
        if body is not None:
            h["Content-Type"] = "application/octet-stream"
        self.conn.request(method, path, body=body, headers=h)
        res = self.conn.getresponse()
        return res.status, res.read()


MODERN = "2026-07-28"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN,
               "io.modelcontextprotocol/clientCapabilities": {}}


def wrk(port, body, key, session, conns, seconds):
    env = dict(os.environ, BENCH_BODY=json.dumps(body), BENCH_KEY=key, BENCH_SESSION=session or "")
    if body.get("params", {}).get("_meta", {}).get("io.modelcontextprotocol/protocolVersion"):
        # The stateless era: its version and method headers, no session.
        env.update(BENCH_VERSION=MODERN, BENCH_METHOD=body["method"],
                   BENCH_NAME=body["params"].get("name", ""))
    out = run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s", "-s",
               os.path.join(HERE, "post.lua"), f"https://localhost:{port}/mcp"],
              capture_output=True, text=True, env=env, timeout=seconds + 60).stdout
    m = re.search(r"BENCHJSON (\{.*\})", out)
    if not m:
        raise RuntimeError("wrk: " + out)
    r = json.loads(m.group(1))
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def part_gateway(sbx, mcp, sb, conns_list, seconds, repeats, res):
    cert, key = sbx.files()
    res["gw_cert"] = [cert, key]
    get_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "get_sandbox", "arguments": {"sandboxId": sb}}}
    list_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    modern_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "get_sandbox", "arguments": {"sandboxId": sb},
                              "_meta": MODERN_META}}
    # The bare server answers the gateway's own get_sandbox answer, byte for byte.
    mcp.rid += 1
    answer, _ = mcp.post(dict(get_body, id=mcp.rid))
    work = tempfile.mkdtemp(prefix="sbxbench-gw-")
    with open(os.path.join(work, "body.json"), "w") as f:
        json.dump(answer, f)
    bare_port, ts_port = free_port(), free_port()
    bare = subprocess.Popen([os.path.join(sbx.bin, "..", "bench", "mhd_bare"), str(bare_port), cert,
                             key, os.path.join(work, "body.json")], stdout=subprocess.PIPE)
    bare.stdout.readline()
    token = "bench-token"
    ts = subprocess.Popen(["node", os.path.join(HERE, "ts_server.mjs"), str(ts_port), cert, key,
                           token], stdout=subprocess.PIPE, cwd=HERE)
    ts.stdout.readline()
    try:
        ts_mcp = Mcp(ts_port, token)
        ts_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "get_sandbox", "arguments": {"sandboxId": sb}}}
        ts_mcp.rid += 1
        check, _ = ts_mcp.post(dict(ts_body, id=2))
        assert "result" in check, check
        runs = {}
        # Repeats go round all servers in turn, so that a burst of outside load weighs
        # on every server alike; the run with the median rate is kept.
        for rep in range(repeats):
            for conns in conns_list:
                for label, port, body, k, sid in (
                        ("sbx get_sandbox", sbx.port, get_body, sbx.key, mcp.sid),
                        ("sbx get_sandbox 2026", sbx.port, modern_body, sbx.key, None),
                        ("sbx tools/list", sbx.port, list_body, sbx.key, mcp.sid),
                        ("sbx ping", sbx.port, {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                         sbx.key, mcp.sid),
                        ("bare mhd", bare_port, get_body, sbx.key, None),
                        ("ts get_sandbox", ts_port, ts_body, token, ts_mcp.sid),
                        ("ts tools/list", ts_port, list_body, token, ts_mcp.sid)):
                    r = wrk(port, body, k, sid, conns, seconds)
                    if r.get("error_answers"):
                        raise RuntimeError(f"{label} c={conns}: {r['error_answers']} of "
                                           f"{r['requests']} answers were errors")
                    runs.setdefault(f"{label} c{conns}", []).append(r)
                    log(f"wrk {rep + 1}/{repeats} {label} c={conns}: {r['rps']:.0f} req/s p50 "
                        f"{r['p50_us']} us p99 {r['p99_us']} us errors {r['errors']} "
                        f"({r['non2xx']} non-2xx)")
        out = {}
        for key, rs in runs.items():
            rs = sorted(rs, key=lambda r: r["rps"])
            out[key] = dict(rs[len(rs) // 2], all_rps=[r["rps"] for r in rs])
        res["gateway"] = out
    finally:
        bare.terminate()
        ts.terminate()
        bare.wait()
        ts.wait()
        shutil.rmtree(work, ignore_errors=True)


def part_density(sbx, mcp, want, idle_s, res, key="density", more=0):
    """want idle small sandboxes at once; per QEMU its PSS, RSS, guest RAM mapping, TCG
    cache and the guest's own used memory (res[key]), and what template memfds hold. With
    more: then as many more as make `more` in all, and the same of all of them
    (res[key + "_more"])."""
    ids = []
    t0 = time.monotonic()

    def grow(to):
        try:
            while len(ids) < to:
                r = mcp.call("create_sandbox", {"name": f"{key}{len(ids)}", "ttlSeconds": 3600})
                ids.append(r["structuredContent"]["id"])
                log(f"{key}: {len(ids)} running")
        except Exception as exc:
            res[key + "_stopped_because"] = str(exc)
            log(f"{key}: stopped at {len(ids)}: {exc}")

    grow(want)
    res[key + "_create_all_s"] = time.monotonic() - t0
    res[key] = density_measure(sbx, mcp, ids, idle_s)
    res[key + "_memfd_mib"] = template_memfd_mib(sbx)  # 0 without templates
    res[key + "_idle_s"] = idle_s
    if more > want:
        grow(more)
        res[key + "_more"] = density_measure(sbx, mcp, ids, idle_s)
        res[key + "_more_memfd_mib"] = template_memfd_mib(sbx)
    return ids


def density_measure(sbx, mcp, ids, idle_s):
    """5 s after the last create, per sandbox of ids: its QEMU's memory and the guest's
    own used memory, then its QEMU's CPU over idle_s."""
    time.sleep(5)  # let boots settle
    per = []
    for sb in ids:
        with open(os.path.join(sbx.dir, "vms", sb, "qemu.pid")) as f:
            pid = int(f.read().strip())
        r = mcp.call("exec", {"sandboxId": sb, "command": "cat /proc/meminfo"})
        text = r["structuredContent"].get("stdout", "")
        mi = {l.split(":")[0]: int(l.split()[1]) for l in text.splitlines() if ":" in l}
        used = (mi["MemTotal"] - mi["MemAvailable"]) / 1024
        ram = guest_ram(pid)
        per.append(dict(sandbox=sb, pid=pid, guest_used_mib=used, guest_ram_rss_mib=ram["Rss"],
                        guest_ram_pss_mib=ram["Pss"], guest_ram_size_mib=ram["Size"],
                        tcg_cache_pss_mib=tcg_cache(pid),
                        **proc_mem(pid)))
    ticks0 = {p["pid"]: cpu_ticks(p["pid"]) for p in per}
    time.sleep(idle_s)
    hz = os.sysconf("SC_CLK_TCK")
    for p in per:
        p["idle_cpu_pct"] = 100 * (cpu_ticks(p["pid"]) - ticks0[p["pid"]]) / hz / idle_s
        p["overhead_pss_mib"] = p["pss_mib"] - p["guest_used_mib"]
        p["overhead_rss_mib"] = p["rss_mib"] - p["guest_used_mib"]
        p["overhead_vs_ram_pss_mib"] = p["pss_mib"] - p["guest_ram_pss_mib"]
        p["beyond_used_and_tcg_mib"] = p["overhead_pss_mib"] - p["tcg_cache_pss_mib"]
    return per


def part_sampling(bdir, n, idle_s, res):
    """What sampling guests costs (vmd_sampler): the same N idle small sandboxes under two
    sbx ups, one with vmd.metrics_interval_ms = 0 (the baseline: no samples) and one with
    the default 5000; over idle_s, vmd's CPU (utime + stime) and RSS, and its guests'
    QEMU CPU (the agent answers agent.stats inside them)."""
    for label, interval in (("off", 0), ("on", 5000)):
        sbx = Sbx(bdir, settings={"vmd.metrics_interval_ms": interval})
        try:
            mcp = Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
            ids = [mcp.call("create_sandbox", {"name": f"idle{i}", "ttlSeconds": 3600})
                   ["structuredContent"]["id"] for i in range(n)]
            vmd = [d["pid"] for d in sbx.status()["daemons"] if d["name"] == "sbx-vmd"][0]
            qemus = []
            for sb in ids:
                with open(os.path.join(sbx.dir, "vms", sb, "qemu.pid")) as f:
                    qemus.append(int(f.read().strip()))
            time.sleep(12)  # boots settle; two samples' worth of the interval
            hz = os.sysconf("SC_CLK_TCK")
            v0, q0 = cpu_ticks(vmd), [cpu_ticks(q) for q in qemus]
            time.sleep(idle_s)
            v1, q1 = cpu_ticks(vmd), [cpu_ticks(q) for q in qemus]
            samples = None
            if interval:
                r = mcp.call("get_sandbox_metrics", {"sandboxId": ids[0]})
                samples = len(r["structuredContent"]["samples"])
            res[f"sampling_{label}"] = {
                "vmd_cpu_pct": 100 * (v1 - v0) / hz / idle_s,
                "vmd_rss_mib": proc_mem(vmd)["rss_mib"],
                "qemu_cpu_pct": med([100 * (b - a) / hz / idle_s for a, b in zip(q0, q1)]),
                "samples_of_one": samples}
            log(f"sampling {label}: {res[f'sampling_{label}']}")
        finally:
            sbx.close()
    res["sampling_n"], res["sampling_idle_s"] = n, idle_s


# -- the report -------------------------------------------------------------------------
def fmt(v, unit="", nd=3):
    if v is None:
        return "—"
    return f"{v:.{nd}f}{unit}"


def rows(res):
    """(figure, N, value, baseline, ratio, target, verdict) for the table."""
    out = []

    def row(name, n, value, base, target=None, le=True, unit=" s", nd=3, ratio=None):
        if ratio is None and value is not None and base and not isinstance(base, str):
            ratio = value / base
        verdict = ""
        if target is not None and ratio is not None:
            ok = ratio <= target if le else ratio >= target
            verdict = "met" if ok else "**MISSED**"
        out.append((name, n, fmt(value, unit, nd), base if isinstance(base, str) else fmt(base, unit, nd),
                    fmt(ratio, "×", 2), (("≤ " if le else "≥ ") + f"{target}×") if target else "—",
                    verdict or "—"))

    rb = med(res.get("raw_boot_s"))
    nb = len(res.get("raw_boot_s") or [])
    if "cold_s" in res:
        cold = med(res["cold_s"])
        row("create_sandbox → ready (cold)", len(res["cold_s"]), cold,
            f"{fmt(rb, ' s')} raw QEMU boot → agent.ping (N={nb}, in turn with the creates)",
            1.15, ratio=cold / rb if rb else None)
        if res.get("template_s"):
            t = med(res["template_s"])
            row("create from template snapshot", len(res["template_s"]), t,
                f"{fmt(cold, ' s')} cold create", 0.25, ratio=t / cold)
        else:
            out.append(("create from template snapshot", 0, "not measured", "—", "—",
                        "≤ 0.25× cold", "not run (bench/run --only without template)"))
        if res.get("resume_s"):
            r = med(res["resume_s"])
            row("resume after stop", len(res["resume_s"]), r, f"{fmt(cold, ' s')} cold create", 0.5,
                ratio=r / cold)
            s = med(res["stop_s"])
            row("stop", len(res["stop_s"]), s, f"{fmt(rb, ' s')} raw boot", None, ratio=s / rb)
        if res.get("delete_s"):
            d = med(res["delete_s"])
            row("delete (call returns)", len(res["delete_s"]), d, f"{fmt(rb, ' s')} raw boot", None,
                ratio=d / rb)
            d = med(res["delete_gone_s"])
            row("delete (until its directory is gone)", len(res["delete_gone_s"]), d,
                f"{fmt(rb, ' s')} raw boot", None, ratio=d / rb)
    if res.get("dockerfile_create_s"):
        cold = med(res["dockerfile_cold_s"])
        row("create_sandbox {template} (built from a Dockerfile, its server running)",
            len(res["dockerfile_create_s"]), med(res["dockerfile_create_s"]),
            f"{fmt(cold, ' s')} cold create (N={len(res['dockerfile_cold_s'])}, in turn)", 0.25,
            ratio=med(res["dockerfile_create_s"]) / cold)
        b = res["dockerfile_build_s"][0]
        row("sbx template build again, every step from the cache (6 steps)", 1,
            res["dockerfile_cached_s"][0], f"{fmt(b, ' s')} the first build", None,
            ratio=res["dockerfile_cached_s"][0] / b)
    if res.get("fork2_s"):
        t = med(res["fork_template_s"])
        nt = len(res["fork_template_s"])
        pauses = [p for p in res["fork_save_paused_ms"] if p is not None]
        p = med(res["fork_paused_ms"])
        row("fork: the source's pause (under TCG the capture pauses first, as a save's)", len(res["fork_paused_ms"]), p,
            f"{fmt(med(pauses), ' ms', 0)} save_snapshot's pause (stops the guest first; "
            f"N={len(pauses)})" if pauses else "—", None, unit=" ms", nd=0,
            ratio=p / med(pauses) if pauses else None)
        for count in (2, 4):
            v = res[f"fork{count}_s"]
            row(f"fork_sandbox count {count} → all ready", len(v), med(v),
                f"{fmt(t, ' s')} create from the template (N={nt}, in turn)", None,
                ratio=med(v) / t)
        s2 = med(res["fork_save_create2_s"])
        row("fork_sandbox count 2 → all ready", len(res["fork2_s"]), med(res["fork2_s"]),
            f"{fmt(s2, ' s')} save_snapshot + create_sandbox ×2 from it (N="
            f"{len(res['fork_save_create2_s'])})", None, ratio=med(res["fork2_s"]) / s2)
        row(f"first fork of a fresh sandbox, 1 copy (paused {res['fork_first_paused_ms']} ms)",
            1, res["fork_first_s"], f"{fmt(t, ' s')} create from the template", None,
            ratio=res["fork_first_s"] / t)
    if "mcp_exec_true_s" in res and "raw_exec_true_s" in res:
        m, r = res["mcp_exec_true_s"], res["raw_exec_true_s"]
        row("exec `true` p50 (MCP/HTTPS kept alive)", len(m), med(m) * 1000,
            f"{fmt(med(r) * 1000, ' ms')} agent direct p50 (N={len(r)})", 1.3, unit=" ms", nd=1,
            ratio=med(m) / med(r))
        row("exec `true` p99", len(m), pct(m, 99) * 1000,
            f"{fmt(pct(r, 99) * 1000, ' ms')} agent direct p99", None, unit=" ms", nd=1,
            ratio=pct(m, 99) / pct(r, 99))
    if res.get("mcp_bigout_s") and res.get("raw_bigout_s"):
        def rate(mib, secs):
            return [mib / s for s in secs]

        def spread(v):
            return f"{min(v):.1f}–{max(v):.1f}"

        mb, rb_ = res["mcp_bigout_bytes"], res["raw_bigout_bytes"]
        mt = [b / MiB / s for b, s in zip(mb, res["mcp_bigout_s"])]
        rt = [b / MiB / s for b, s in zip(rb_, res["raw_bigout_s"])]
        row(f"10 MiB stdout, MCP command_status ({med(mb) / MiB:.1f} MiB delivered; "
            f"{spread(mt)})", len(mt), med(mt),
            f"{med(rt):.1f} MiB/s raw channel ({spread(rt)})", 0.9, le=False, unit=" MiB/s",
            nd=1, ratio=med(mt) / med(rt))
        for k, label, base in (("write", "write_file 10 MiB (MCP, base64)", "write"),
                               ("read", "read_file 10 MiB (MCP, base64)", "read"),
                               ("rest_write", "PUT /files 10 MiB (REST, raw body)", "write"),
                               ("rest_read", "GET /files 10 MiB (REST, raw body)", "read")):
            if not res.get(f"mcp_{k}_s"):
                continue
            mt = rate(10, res[f"mcp_{k}_s"])
            rt = rate(10, res[f"raw_{base}_s"])
            row(f"{label} ({spread(mt)})", len(mt), med(mt),
                f"{med(rt):.1f} MiB/s agent.file.{base} 1 MiB chunks one at a time ({spread(rt)})",
                0.7, le=False, unit=" MiB/s", nd=1, ratio=med(mt) / med(rt))
        if res.get("mcp_rest_read_drained_s") and res.get("mcp_rest_read_s"):
            dt = rate(10, res["mcp_rest_read_drained_s"])
            gt = rate(10, res["mcp_rest_read_s"])
            row(f"(diagnostic) GET /files 10 MiB right after an MCP drain of 10 MiB of stdout "
                f"({spread(dt)})", len(dt), med(dt),
                f"{med(gt):.1f} MiB/s the GET of the files rounds ({spread(gt)})", None,
                unit=" MiB/s", nd=1, ratio=med(dt) / med(gt))
    gw = res.get("gateway", {})
    for conns in res.get("gw_conns", []):
        bare = gw.get(f"bare mhd c{conns}")
        for tool in ("get_sandbox", "tools/list"):
            s = gw.get(f"sbx {tool} c{conns}")
            t = gw.get(f"ts {tool} c{conns}")
            if not s:
                continue
            extra = f" ({s['errors']} errors)" if s["errors"] else ""
            if tool == "get_sandbox" and bare:
                row(f"{tool}, {conns} conn vs bare MHD{extra}", f"{res.get('gw_repeats', 1)}×{res['gw_seconds']} s", s["rps"],
                    f"{bare['rps']:.0f} req/s bare libmicrohttpd+TLS", 0.5, le=False,
                    unit=" req/s", nd=0, ratio=s["rps"] / bare["rps"])
            modern = gw.get(f"sbx get_sandbox 2026 c{conns}")
            if tool == "get_sandbox" and modern:
                row(f"(diagnostic) get_sandbox as MCP 2026-07-28 (stateless), {conns} conn vs "
                    "the 2025 session's", f"{res.get('gw_repeats', 1)}×{res['gw_seconds']} s",
                    modern["rps"], f"{s['rps']:.0f} req/s in a 2025-06-18 session", None,
                    unit=" req/s", nd=0, ratio=modern["rps"] / s["rps"])
            if tool == "tools/list" and bare and gw.get(f"sbx ping c{conns}"):
                p = gw[f"sbx ping c{conns}"]
                row(f"(diagnostic) MCP ping, {conns} conn vs bare MHD", f"{res.get('gw_repeats', 1)}×{res['gw_seconds']} s",
                    p["rps"], f"{bare['rps']:.0f} req/s bare libmicrohttpd+TLS", None,
                    unit=" req/s", nd=0, ratio=p["rps"] / bare["rps"])
            if t:
                row(f"{tool}, {conns} conn vs TS SDK{extra}", f"{res.get('gw_repeats', 1)}×{res['gw_seconds']} s", s["rps"],
                    f"{t['rps']:.0f} req/s TypeScript SDK", 5, le=False, unit=" req/s", nd=0,
                    ratio=s["rps"] / t["rps"])
    if res.get("density"):
        d = res["density"]
        n = len(d)
        over = med([p["overhead_pss_mib"] for p in d])
        used = med([p["guest_used_mib"] for p in d])
        out.append((f"PSS overhead per idle small sandbox, {n} running", n, fmt(over, " MiB", 1),
                    f"guest's own MemTotal−MemAvailable {fmt(used, ' MiB', 1)}",
                    fmt(med([p['pss_mib'] for p in d]) / used, "×", 2) + " (PSS/guest-used)",
                    "≤ 20 MiB", "met" if over <= 20 else "**MISSED**"))
        ov2 = med([p["overhead_vs_ram_pss_mib"] for p in d])
        out.append((f"PSS overhead minus the guest RAM mapping's own PSS", n, fmt(ov2, " MiB", 1),
                    f"guest RAM mapping: {fmt(med([p['guest_ram_pss_mib'] for p in d]), ' MiB', 1)} "
                    f"PSS of {fmt(med([p['guest_ram_size_mib'] for p in d]), ' MiB', 0)}", "—",
                    "≤ 20 MiB", "met" if ov2 <= 20 else "**MISSED**"))
        out.append((f"RSS overhead per idle small sandbox", n,
                    fmt(med([p["overhead_rss_mib"] for p in d]), " MiB", 1),
                    f"RSS {fmt(med([p['rss_mib'] for p in d]), ' MiB', 1)}, PSS "
                    f"{fmt(med([p['pss_mib'] for p in d]), ' MiB', 1)}", "—", "—", "—"))
        raw = res.get("raw_idle")
        if raw:
            out.append(("PSS of one sbx guest's QEMU vs a raw QEMU (same argv)", n,
                        fmt(med([p['pss_mib'] for p in d]), " MiB", 1),
                        f"{fmt(raw['pss_mib'], ' MiB', 1)} raw QEMU alone, idle 3 s after boot",
                        fmt(med([p['pss_mib'] for p in d]) / raw["pss_mib"], "×", 2), "—", "—"))
        out.append((f"idle CPU per sandbox over {res['density_idle_s']} s", n,
                    fmt(med([p['idle_cpu_pct'] for p in d]), " % of a core", 2),
                    f"max {fmt(max(p['idle_cpu_pct'] for p in d), ' %', 2)}", "—", "—", "—"))
    if res.get("density_clones"):
        c, d = res["density_clones"], res.get("density")
        n = len(c)
        beyond = med([p["beyond_used_and_tcg_mib"] for p in c])
        cold = med([p["beyond_used_and_tcg_mib"] for p in d]) if d else None
        out.append((f"PSS per idle clone of the template beyond guest-used and TCG cache, {n} running", n,
                    fmt(beyond, " MiB", 1),
                    (f"{fmt(cold, ' MiB', 1)} per cold-booted sandbox, {len(d)} running" if d else
                     "cold not run (--only density runs both)") +
                    f"; spread {fmt(min(p['beyond_used_and_tcg_mib'] for p in c), '', 1)}–"
                    f"{fmt(max(p['beyond_used_and_tcg_mib'] for p in c), ' MiB', 1)}",
                    fmt(beyond / cold, "×", 2) if d and cold > 0 else "—",
                    "≤ 20 MiB", "met" if beyond <= 20 else "**MISSED**"))
        out.append(("TCG translation cache PSS per clone (none under KVM)", n,
                    fmt(med([p["tcg_cache_pss_mib"] for p in c]), " MiB", 1),
                    f"guest RAM mapping PSS {fmt(med([p['guest_ram_pss_mib'] for p in c]), ' MiB', 1)}"
                    f" of {fmt(med([p['guest_ram_size_mib'] for p in c]), ' MiB', 0)}", "—", "—", "—"))
        if d:
            host_c = sum(p["pss_mib"] for p in c) + res.get("density_clones_memfd_mib", 0)
            host_d = sum(p["pss_mib"] for p in d)
            out.append((f"host memory for {n} idle clones (their PSS + the template's memfd) vs "
                        f"{len(d)} cold boots", n, fmt(host_c, " MiB", 0),
                        f"{fmt(host_d, ' MiB', 0)} cold (PSS sum); memfd "
                        f"{fmt(res.get('density_clones_memfd_mib', 0), ' MiB', 0)}",
                        fmt(host_c / host_d, "×", 2), "—", "—"))
    if res.get("density_clones_more") and res.get("density_more"):
        c, d = res["density_clones_more"], res["density_more"]
        memfd = res.get("density_clones_more_memfd_mib", 0)
        host_c = sum(p["pss_mib"] for p in c) + memfd
        host_d = sum(p["pss_mib"] for p in d)
        out.append((f"host memory for {len(c)} idle clones (their PSS + the template's memfd) vs "
                    f"{len(d)} cold boots", len(c), fmt(host_c, " MiB", 0),
                    f"{fmt(host_d, ' MiB', 0)} cold (PSS sum); memfd {fmt(memfd, ' MiB', 0)}",
                    fmt(host_c / host_d, "×", 2), "—", "—"))
        out.append((f"QEMU PSS per idle sandbox, {len(c)} clones running vs {len(d)} cold", len(c),
                    fmt(med([p["pss_mib"] for p in c]), " MiB", 1),
                    f"{fmt(med([p['pss_mib'] for p in d]), ' MiB', 1)} cold; clone beyond "
                    f"guest-used and TCG cache {fmt(med([p['beyond_used_and_tcg_mib'] for p in c]), ' MiB', 1)}",
                    fmt(med([p["pss_mib"] for p in c]) / med([p["pss_mib"] for p in d]), "×", 2),
                    "—", "—"))
    if res.get("kvm"):
        out.extend(kvm_rows(res["kvm"]))
    if res.get("sampling_on") and res.get("sampling_off"):
        on, off, n = res["sampling_on"], res["sampling_off"], res["sampling_n"]
        w = res["sampling_idle_s"]

        def over(a, b):
            return fmt(a / b, "×", 2) if b else "—"
        out.append((f"vmd CPU, {n} idle guests sampled every 5 s, over {w} s", n,
                    fmt(on["vmd_cpu_pct"], " % of a core", 3),
                    f"{fmt(off['vmd_cpu_pct'], ' %', 3)} with sampling off",
                    over(on["vmd_cpu_pct"], off["vmd_cpu_pct"]), "—",
                    f"{fmt((on['vmd_cpu_pct'] - off['vmd_cpu_pct']) / n, ' %', 4)} per guest"))
        out.append((f"vmd RSS, {n} idle guests sampled (an hour of samples: 720 × 64 B each)", n,
                    fmt(on["vmd_rss_mib"], " MiB", 2),
                    f"{fmt(off['vmd_rss_mib'], ' MiB', 2)} with sampling off",
                    over(on["vmd_rss_mib"], off["vmd_rss_mib"]), "—",
                    f"{fmt((on['vmd_rss_mib'] - off['vmd_rss_mib']) * 1024 / n, ' KiB', 0)} per guest"))
        out.append((f"QEMU CPU per idle guest, sampled (agent.stats every 5 s)", n,
                    fmt(on["qemu_cpu_pct"], " % of a core", 3),
                    f"{fmt(off['qemu_cpu_pct'], ' %', 3)} with sampling off",
                    over(on["qemu_cpu_pct"], off["qemu_cpu_pct"]), "—",
                    f"{on['samples_of_one']} samples of one guest in the run"))
    if "scale" in res:
        out.extend(scale_rows(res["scale"]))
    if "cluster" in res:
        import cluster

        out.extend(cluster.cluster_rows(res["cluster"]))
    if "wallet" in res:
        import wallet

        out.extend(wallet.wallet_rows(res["wallet"]))
    if "billed_running_ms" in res and res["billed_running_ms"] is not None:
        billed = res["billed_running_ms"] / 1000
        ev = res["event_running_s"]
        lo, hi = res["wall_running_lo_s"], res["wall_running_hi_s"]
        out.append((f"billing: |billed − events| over {res['billing_cycles']} stop/resume cycles", 1,
                    fmt(abs(billed - ev), " s", 3), f"billed {billed:.3f} s, events {ev:.3f} s",
                    fmt(abs(billed - ev) / ev if ev else None, "", 4) + " rel.", "—", "—"))
        out.append(("billing: billed vs own wall clock", 1, fmt(billed, " s", 3),
                    f"wall {lo:.3f}–{hi:.3f} s (ready answered → stop called/answered)",
                    "inside" if lo - 0.5 <= billed <= hi + 0.5 else "outside", "—", "—"))
    return out


FC_INIT_S, FC_VMM_MIB = 0.125, 5
# Firecracker's SPECIFICATION.md: bare metal, KVM, 1 vCPU, 128 MiB, its tuned guest kernel.
FC_INIT = ("Firecracker ≤ 125 ms, published: its InstanceStart call → the guest's /sbin/init "
           "(KVM, bare metal, 1 vCPU, 128 MiB)")
FC_VMM = ("Firecracker ≤ 5 MiB, published: its VMM's memory beyond guest RAM (KVM, bare metal, "
          "1 vCPU, 128 MiB)")


def kvm_rows(k):
    """part_kvm's rows: under KVM (or why not) and under TCG, beside Firecracker's
    published figures (the reference column; not measured here)."""
    out = []
    for acc in ("kvm", "tcg"):
        rs = [r for r in k["runs"] if r["accel"].split(",")[0] == acc]
        name = "KVM" if acc == "kvm" else f"TCG (`-accel {rs[0]['accel']}`)" if rs else "TCG"
        if not rs:
            if acc == "kvm":
                why = f"KVM not usable here: {k['why']}"
                out.append(("guest init under KVM: QEMU spawn → the guest kernel starts /init", 0,
                            why, FC_INIT, "—", "≤ 125 ms", "not measured (no KVM)"))
                out.append(("VMM overhead under KVM: QEMU PSS − guest RAM mapping", 0, why,
                            FC_VMM, "—", "≤ 5 MiB", "not measured (no KVM)"))
            continue
        n = len(rs)
        kvm = acc == "kvm"
        init = [r["init_s"] * 1000 for r in rs]
        v = med(init)
        out.append((f"guest init under {name}: QEMU spawn → the guest kernel starts "
                    f"{rs[0]['init']} ({min(init):.0f}–{max(init):.0f} ms)", n, fmt(v, " ms", 0),
                    FC_INIT, fmt(v / 1000 / FC_INIT_S, "×", 2), "≤ 125 ms" if kvm else "—",
                    ("met" if v <= FC_INIT_S * 1000 else "**MISSED**") if kvm else
                    "— (TCG: reference only)"))
        out.append((f"(diagnostic) boot under {name}: QEMU spawn → agent hello", n,
                    fmt(med([r["hello_s"] for r in rs]) * 1000, " ms", 0),
                    f"the guest kernel's clock starts {fmt(med([r['kernel_clock0_s'] for r in rs]) * 1000, ' ms', 0)}"
                    f" after the spawn, /init at {fmt(med([r['init_guest_clock_s'] for r in rs]) * 1000, ' ms', 0)}"
                    f" on it; placed on the host's clock ± {fmt(med([r['mark_window_s'] for r in rs]) * 500, ' ms', 0)}",
                    "—", "—", "—"))
        vmm = med([r["memory"]["vmm"]["pss"] for r in rs])
        minus = "guest RAM mapping" + ("" if kvm else " − TCG translation cache")
        out.append((f"VMM overhead under {name}: QEMU PSS − {minus}, idle {k['idle_s']} s after "
                    f"ready", n, fmt(vmm, " MiB", 1), FC_VMM, fmt(vmm / FC_VMM_MIB, "×", 1),
                    "≤ 5 MiB" if kvm else "—",
                    ("met" if vmm <= FC_VMM_MIB else "**MISSED**") if kvm else
                    "— (TCG: reference only)"))

        def g(kind, key="pss"):
            return med([r["memory"]["groups"].get(kind, {}).get(key, 0.0) for r in rs])

        out.append((f"(diagnostic) that overhead under {name} by kind (PSS)", n, fmt(vmm, " MiB", 1),
                    f"vmlinux kept mapped {fmt(g('vmlinux'), '', 1)}, initrd {fmt(g('initrd'), '', 1)}, "
                    f"QEMU binary {fmt(g('qemu_binary'), '', 1)}, libraries {fmt(g('libraries'), '', 1)}, "
                    f"heap + anonymous {fmt(g('heap_anon'), ' MiB', 1)}; as RSS "
                    f"{fmt(med([r['memory']['vmm']['rss'] for r in rs]), ' MiB', 1)}, private "
                    f"{fmt(med([r['memory']['vmm']['private'] for r in rs]), ' MiB', 1)}; left out: "
                    f"guest RAM {fmt(g('guest_ram'), ' MiB', 1)} of {fmt(g('guest_ram', 'size'), ' MiB', 0)}"
                    + ("" if kvm else f", TCG cache {fmt(g('tcg_cache'), ' MiB', 1)}"),
                    "—", "—", "—"))
    return out


def scale_rows(sc):
    """The control plane at 10,000 records beside the same figure at 10 (bench/scale.py)."""
    out = []
    a, b = sc["at10k"], sc["at10"]
    ra, rb = a["records"], b["records"]

    def pair(name, key, unit_key, label, fmt_unit, higher_better, nd=0, target=None):
        va, vb = a[key][unit_key], b[key][unit_key]
        ratio = va / vb if vb else None
        verdict = "—"
        if target is not None and ratio is not None:
            ok = ratio >= target if higher_better else ratio <= target
            verdict = "met" if ok else "**MISSED**"
        grow = (lambda m: f"{m['records']:,}→{m['records_after']:,}") if key == "create" else (
            lambda m: f"{m['records']:,}")
        runs = a[key].get("runs", [])
        spread = f"; runs at {ra:,}: {', '.join(fmt(r[unit_key], '', nd) for r in runs)}" if runs \
            else ""
        out.append((f"{name} at {grow(a)} records ({label}; the median run of {len(runs) or 1})",
                    a[key].get("n", a[key].get("requests")), fmt(va, fmt_unit, nd),
                    f"{fmt(vb, fmt_unit, nd)} at {grow(b)} records{spread}",
                    fmt(ratio, "×", 2),
                    (("≥ " if higher_better else "≤ ") + f"{target}×") if target else "—", verdict))

    for op, what in (("create", "sandbox.create"), ("get", "sandbox.get"),
                     ("list", "sandbox.list, a page of 10")):
        n = a[op]["inflight"]
        pair(f"broker {what}: throughput", op, "per_s", f"{n} in flight", " /s", True,
             target=0.8)
        pair(f"broker {what}: p99", op, "p99_ms", f"{n} in flight", " ms", False, nd=2,
             target=1.25)
    for op, what in (("rest_get", "REST GET /v1/sandboxes/ID"),
                     ("rest_list", "REST GET /v1/sandboxes?limit=10")):
        pair(f"{what}: throughput", op, "rps", "wrk, 8 connections", " /s", True, target=0.8)
        pair(f"{what}: p99", op, "p99_ms", "wrk, 8 connections", " ms", False, nd=2,
             target=1.25)
    if sc.get("events_from"):
        return out + scale_rows_kept_events(sc)
    after = sc["after"]
    for name in a["memory"]:
        if name not in after["memory"]:
            continue
        va, vb = after["memory"][name]["pss_mib"], b["memory"][name]["pss_mib"]
        vr = a["memory"].get(name, {}).get("pss_mib")
        out.append((f"{name} PSS at {after['records']:,} records and {after['last_seq']:,} "
                    f"events", 1, fmt(va, " MiB", 1),
                    f"{fmt(vb, ' MiB', 1)} at {rb} records; {fmt(vr, ' MiB', 1)} at "
                    f"{a['records_after']:,} records, {a['last_seq']:,} events",
                    fmt(va / vb if vb else None, "×", 2), "—", "—"))
    ma, mb, mr = after.get("broker_maps"), b.get("broker_maps"), a.get("broker_maps")
    if ma and mb and mr:
        by = lambda m: ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.items(), key=lambda i: -i[1]))
        out.append((f"sbx-broker PSS by mapping at {after['last_seq']:,} events (smaps)", 1,
                    by(ma) + " MiB", f"at {rb} records: {by(mb)}; at {a['records_after']:,} "
                    f"records: {by(mr)}", "—", "—", "—"))
    for name in ("sbx-broker", "sbx-billing", "sbx-gateway"):
        va, vb = after["idle_cpu"].get(name), b["idle_cpu"].get(name)
        out.append((f"{name} CPU while idle at {after['records']:,} records and "
                    f"{after['last_seq']:,} events", 1, fmt(va, " % of a core", 2),
                    f"{fmt(vb, ' %', 2)} at {rb} records", fmt(va / vb if vb else None, "×", 2),
                    "—", "—"))
    ld = sc.get("load")
    if ld:
        out.append((f"event log growth under stop/resume load ({ld['inflight']} in flight)",
                    ld["n"], fmt(ld["events_per_s"], " events/s", 0),
                    f"{ld['events']:,} events in {ld['seconds']:.0f} s", "—", "—",
                    f"billing {sc['billing_lag_s']:.1f} s behind at the end"))
    t = sc["tap"]
    out.append((f"tap replay of the whole log (sbx tap --since 0 --once)", t["events"],
                fmt(t["per_s"], " events/s", 0), f"{t['seconds']:.1f} s", "—", "—", "—"))
    br, bp = sc["billing_restart"], sc["billing_replay"]
    log = f", a log of {br['log_events']:,} events" if br.get("log_events") else ""
    out.append((f"billing catch-up after a restart, {br['behind']:,} events behind{log}", 1,
                fmt(br["seconds"], " s", 1), f"{fmt(br['behind'] / br['seconds'], ' events/s', 0)}",
                "—", "—", "—"))
    out.append((f"billing from an empty billing.db: the whole log", bp["events"],
                fmt(bp["seconds"], " s", 1), fmt(bp["per_s"], " events/s", 0), "—", "—", "—"))
    out.append(("database files at the end", 1, ", ".join(
        f"{n} {v:.0f} MiB" for n, v in sc["files_mib"].items()), "—", "—", "—", "—"))
    return out


def scale_rows_kept_events(sc):
    """Rows of a scale run without the events (BENCH_SCALE_EVENTS=0): memory and idle CPU
    at 10,000 records against 12 from this run, then the kept run's figures after the
    million events, each labelled with that run's date."""
    out = []
    a, b, e = sc["at10k"], sc["at10"], sc["events_at10"]
    after, when = sc["after"], sc["events_from"]
    ra, rb = a["records_after"], b["records"]
    for name in a["memory"]:
        va, vb = a["memory"][name]["pss_mib"], b["memory"][name]["pss_mib"]
        then = ""
        if name in after["memory"] and name in e["memory"]:
            then = (f"; run of {when}: {fmt(after['memory'][name]['pss_mib'], ' MiB', 1)} at "
                    f"{after['last_seq']:,} events, {fmt(e['memory'][name]['pss_mib'], ' MiB', 1)}"
                    f" at {e['records']} records")
        out.append((f"{name} PSS at {ra:,} records, {a['last_seq']:,} events", 1,
                    fmt(va, " MiB", 1), f"{fmt(vb, ' MiB', 1)} at {rb} records{then}",
                    fmt(va / vb if vb else None, "×", 2), "—", "—"))
    ma, mb = a.get("broker_maps"), b.get("broker_maps")
    if ma and mb:
        by = lambda m: ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.items(), key=lambda i: -i[1]))
        out.append((f"sbx-broker PSS by mapping at {ra:,} records (smaps)", 1, by(ma) + " MiB",
                    f"at {rb} records: {by(mb)}", "—", "—", "—"))
    for name in ("sbx-broker", "sbx-billing", "sbx-gateway"):
        va, vb = a["idle_cpu"].get(name), b["idle_cpu"].get(name)
        then = ""
        if after["idle_cpu"].get(name) is not None:
            then = (f"; run of {when}: {fmt(after['idle_cpu'][name], ' %', 2)} at "
                    f"{after['last_seq']:,} events, {fmt(e['idle_cpu'].get(name), ' %', 2)} at "
                    f"{e['records']} records")
        out.append((f"{name} CPU while idle at {ra:,} records", 1, fmt(va, " % of a core", 2),
                    f"{fmt(vb, ' %', 2)} at {rb} records{then}",
                    fmt(va / vb if vb else None, "×", 2), "—", "—"))
    tag = f" (run of {when}, kept: this run did not make the events)"
    ld = sc.get("load")
    if ld:
        out.append((f"event log growth under stop/resume load ({ld['inflight']} in flight){tag}",
                    ld["n"], fmt(ld["events_per_s"], " events/s", 0),
                    f"{ld['events']:,} events in {ld['seconds']:.0f} s", "—", "—",
                    f"billing {sc['billing_lag_s']:.1f} s behind at the end"))
    t = sc["tap"]
    out.append((f"tap replay of the whole log (sbx tap --since 0 --once){tag}", t["events"],
                fmt(t["per_s"], " events/s", 0), f"{t['seconds']:.1f} s", "—", "—", "—"))
    br, bp = sc["billing_restart"], sc["billing_replay"]
    log = f", a log of {br['log_events']:,} events" if br.get("log_events") else (
        f", a log of ≈ {after['last_seq']:,} events")
    out.append((f"billing catch-up after a restart, {br['behind']:,} events behind{log}{tag}", 1,
                fmt(br["seconds"], " s", 1), f"{fmt(br['behind'] / br['seconds'], ' events/s', 0)}",
                "—", "—", "—"))
    out.append((f"billing from an empty billing.db: the whole log{tag}", bp["events"],
                fmt(bp["seconds"], " s", 1), fmt(bp["per_s"], " events/s", 0), "—", "—", "—"))
    out.append((f"database files at the end{tag}", 1, ", ".join(
        f"{n} {v:.0f} MiB" for n, v in sc["files_mib"].items()), "—", "—", "—", "—"))
    return out


def accel_why(res):
    """Why the runs were under TCG, as the kvm part (or the machine's probe) found it."""
    m = res["machine"]
    why = (res.get("kvm") or {}).get("why") or m.get("accel_why")
    if m["accel"] == "KVM" or not why:
        return ""
    return f" (KVM not usable here: {why})"


def write_doc(res, path, cmdline):
    m = res["machine"]
    L = []
    L.append("# Benchmarks\n")
    L.append("Written by `bench/run` (issue 8); do not edit by hand: rerun it.\n")
    L.append(f"Run {res['started']} ({'quick' if res['quick'] else 'full'} mode, "
             f"{res['elapsed_s']:.0f} s). Rerun: `{cmdline}` "
             f"(JSON in `bench/results/`).\n")
    if res.get("source"):
        L.append(f"sbx built from: {res['source']}.\n")
    for p in res.get("partial", []):
        L.append(f"Rows of `{p['parts']}` rerun {p['started']} (`{p['cmdline']}`, sbx built from "
                 f"{p['source']}, load average {p['load']['before'][0]:.2f} before, "
                 f"{p['load']['after'][0]:.2f} after, max {p['load']['max']:.2f}); the other "
                 f"rows are from the run above.\n")
    L.append(f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, "
             f"kernel {m['kernel']}, {m['qemu']}, **{m['accel']}**{accel_why(res)}.\n")
    la = res["load"]
    L.append(f"Noise: load average {la['before'][0]:.2f} before, {la['after'][0]:.2f} after "
             f"(max seen {la['max']:.2f}, 2 cores shared with other engineers' builds and "
             f"tests). Spread of the raw boots: {fmt(min(res.get('raw_boot_s') or [0]), ' s')}–"
             f"{fmt(max(res.get('raw_boot_s') or [0]), ' s')}; of the cold creates: "
             f"{fmt(min(res.get('cold_s') or [0]), ' s')}–{fmt(max(res.get('cold_s') or [0]), ' s')}.\n")
    L.append("Every figure is compared with a baseline measured in the same run; medians of N "
             "runs. The benchmark prints and never fails CI; nothing in the test suite asserts "
             "a timing.\n")
    L.append("| figure | N | value | baseline | ratio | target | verdict |")
    L.append("|---|---|---|---|---|---|---|")
    for r in rows(res):
        L.append("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    L.append("")
    L.append(open(os.path.join(HERE, "notes.md")).read() if os.path.exists(
        os.path.join(HERE, "notes.md")) else "")
    with open(path, "w") as f:
        f.write("\n".join(L).rstrip() + "\n")


# The results each part that --keep can rerun alone writes.
KEEP_PARTS = {"files": ("raw_bigout", "raw_write", "raw_read", "mcp_bigout", "mcp_write",
                        "mcp_read", "mcp_rest", "files_ok"),
              "gateway": ("gateway", "gw_cert"),
              "density": ("density",),
              "kvm": ("kvm",),
              "fork": ("fork",),
              "dockerfile": ("dockerfile",),
              "scale": ("scale",),
              "cluster": ("cluster",),
              "wallet": ("wallet",)}


SCALE_EVENT_KEYS = ("load", "billing_lag_s", "tap", "billing_restart", "billing_replay",
                    "after", "files_mib")


def keep_rows(res, kept_path, cmdline, parts):
    """The rows of a run of some parts alone over an earlier run's results (kept_path):
    the merged results and the command line for the doc's header."""
    with open(kept_path) as f:
        kept = json.load(f)
    prefixes = tuple(p for part in parts for p in KEEP_PARTS[part])
    run_keys = [k for k in res if k.startswith(prefixes)]
    only = ",".join(sorted(parts))
    cmdline += f" --only {only} --keep {os.path.relpath(kept_path, ROOT)}"
    if "scale" in parts and os.environ.get("BENCH_SCALE_EVENTS") == "0":
        cmdline = "BENCH_SCALE_EVENTS=0 " + cmdline
    old_scale = kept.get("scale")
    kept.update({k: res[k] for k in run_keys})
    new_scale = kept.get("scale")
    if new_scale is not old_scale and new_scale.get("events_skipped") and old_scale and \
            old_scale.get("tap"):
        # A scale run without the events (BENCH_SCALE_EVENTS=0): those rows stay the kept
        # run's, named as such.
        for k in SCALE_EVENT_KEYS:
            if k in old_scale:
                new_scale[k] = old_scale[k]
        new_scale["events_from"] = old_scale.get("events_from") or next(
            (p["started"] for p in reversed(kept.get("partial", [])) if "scale" in p["parts"]),
            kept.get("started"))
        new_scale["events_at10"] = {k: old_scale["at10"][k] for k in ("memory", "idle_cpu",
                                                                      "records")}
    kept.setdefault("partial", []).append(
        {"parts": only, "started": res["started"], "source": res.get("source", ""),
         "load": res["load"], "cmdline": cmdline})
    return kept, "bench/run" + (" --quick" if kept["quick"] else "")


# The bench's clients (this process, agentbench) keep large buffers in their heap, as
# sbx's daemons do (common/sbx_heap.h): with glibc's defaults, Python's json.loads of a
# 13.3 MiB read_file answer faulted fresh pages in for 85 of its 90 ms on this VM,
# where a page fault is dear (bench/notes.md), and that is the client, not sbx. The
# daemons and QEMU run with their own settings: the variable is dropped for them.
CLIENT_MALLOC = "glibc.malloc.trim_threshold=134217728:glibc.malloc.mmap_threshold=33554432"


def s_client_malloc():
    """Re-runs this process with CLIENT_MALLOC (glibc reads it at start only)."""
    if os.environ.get("SBX_BENCH_CLIENT_MALLOC") != CLIENT_MALLOC:
        os.environ.update(GLIBC_TUNABLES=CLIENT_MALLOC, SBX_BENCH_CLIENT_MALLOC=CLIENT_MALLOC)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
    os.environ.pop("GLIBC_TUNABLES", None)


def main():
    s_client_malloc()
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--build")
    ap.add_argument("--only",
                    default="lifecycle,template,fork,dockerfile,exec,files,gateway,density,kvm,"
                            "billing,sampling,scale,cluster,wallet")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--keep", metavar="JSON",
                    help="with --only: the rows of the parts not run come from JSON (an earlier "
                         "full run's results), and the doc says which rows are from when")
    ap.add_argument("--render", metavar="JSON", help="rewrite docs/benchmarks.md from a result")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            res = json.load(f)
        cmdline = "bench/run" + (" --quick" if res["quick"] else "")
        if args.keep:
            res, cmdline = keep_rows(res, args.keep, cmdline, {
                p for p, pre in KEEP_PARTS.items() if any(k.startswith(pre) for k in res)})
        write_doc(res, os.path.join(ROOT, "docs", "benchmarks.md"), cmdline)
        return
    parts = set(args.only.split(","))
    if args.keep and not parts <= set(KEEP_PARTS):
        sys.exit("--keep takes parts that can be rerun alone: --only " + ",".join(KEEP_PARTS))
    q = args.quick
    N_COLD, N_EXEC, CYCLES = (3, 50, 10) if q else (7, 200, 10)
    N_FILES = 3 if q else 9  # the rows swing with the host: medians of 9 (bench/notes.md)
    GW_S, GW_R, CONNS = 3, (1 if q else 3), [1, 8, 64]
    # Density: 10 idle sandboxes measured, then 10 more and all 20 again (issue 21 item 1:
    # 20 clones against 20 cold boots); --quick stops at 10.
    DENSITY, DENSITY_MORE, IDLE_S = 10, (0 if q else 20), (5 if q else 10)
    N_KVM = 3 if q else 5
    SAMPLED, SAMPLED_S = (4, 30) if q else (8, 60)
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    prerequisites(args, parts)
    bdir = build(args)
    res = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "quick": q, "machine": machine(bdir),
           "gw_conns": CONNS, "gw_seconds": GW_S, "gw_repeats": GW_R, **SOURCE}
    load = {"before": loadavg(), "max": loadavg()[0]}
    log("machine:", res["machine"], "load", load["before"])

    def sample():
        load["max"] = max(load["max"], loadavg()[0])

    raw = sbx = None
    try:
        if parts & {"lifecycle", "exec", "files", "gateway", "density", "billing"}:
            # Cold creates (the baseline against raw boots): templates off, explicitly,
            # since vmd.templates = small is the default.
            sbx = Sbx(bdir, capacity=max(12, DENSITY_MORE + 2) if "density" in parts else 12,
                      settings={"vmd.templates": ""})
            mcp, sb = part_lifecycle(sbx, bdir, N_COLD if "lifecycle" in parts else 1, res)
            sample()
            if "exec" in parts:
                raw = part_raw_exec(bdir, res)
                part_exec(mcp, sb, N_EXEC, res, raw)
                raw.close()
                raw = None
                sample()
            if "files" in parts:
                part_files(sbx, mcp, sb, bdir, N_FILES, res)
                sample()
            if "gateway" in parts:
                part_gateway(sbx, mcp, sb, CONNS, GW_S, GW_R, res)
                sample()
            mcp.call("delete_sandbox", {"sandboxId": sb})
            wait_gone(sbx, sb)
            if parts & {"lifecycle", "billing"}:
                part_stop_resume(sbx, mcp, CYCLES, res)
                sample()
            if "density" in parts:
                part_density(sbx, mcp, DENSITY, IDLE_S, res, more=DENSITY_MORE)
                sample()
    finally:
        if raw:
            raw.close()
        if sbx:
            sbx.close()
    if parts & {"template", "density"}:
        part_template(bdir, N_COLD if "template" in parts else 1, res,
                      DENSITY if "density" in parts else 0, IDLE_S, DENSITY_MORE)
        sample()
    if "kvm" in parts:
        part_kvm(bdir, N_KVM, 3 if q else 5, res)
        sample()
    if "fork" in parts:
        part_fork(bdir, 3 if q else 5, res)
        sample()
    if "dockerfile" in parts:
        part_dockerfile(bdir, 3 if q else 5, res)
        sample()
    if "sampling" in parts:
        part_sampling(bdir, SAMPLED, SAMPLED_S, res)
        sample()
    if "scale" in parts:
        import scale

        scale.part_scale(bdir, q, res)
        sample()
    if "cluster" in parts:
        import cluster

        cluster.part_cluster(bdir, q, res)
        sample()
    if "wallet" in parts:
        import wallet

        wallet.part_wallet(bdir, q, res)
        sample()
    load["after"] = loadavg()
    sample()
    res["load"] = load
    res["elapsed_s"] = time.monotonic() - t_start
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out = os.path.join(HERE, "results", started.strftime("%Y%m%dT%H%M%SZ") + ".json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    log("wrote", out)
    cmdline = "bench/run" + (" --quick" if q else "")
    if args.keep:
        res, cmdline = keep_rows(res, args.keep, cmdline, parts)
        # The merged results too, so that the doc can be rendered again (--render).
        merged = out[:-len(".json")] + "-merged.json"
        with open(merged, "w") as f:
            json.dump(res, f, indent=1)
        log("wrote", merged)
    for r in rows(res):
        print(" | ".join(str(x) for x in r))
    if not args.no_doc:
        write_doc(res, os.path.join(ROOT, "docs", "benchmarks.md"), cmdline)
        log("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
