"""The control plane at 10,000 sandboxes (issue 21 item 2), a part of bench/run (--only scale).

The real broker, billing, gateway, hookd and snapshotd (sbx up), a real vmd holding the
guests this machine can boot, and for the rest bench/vmdsim: a protocol-level vmd load
generator that registers with the broker as a vmd and answers vm.* at once, without
guests (it lives in bench/ only; no test uses it). bench/ctlload drives the broker on its
own socket with many requests in flight, as the gateway does for an authenticated caller;
wrk drives the gateway's REST routes over HTTPS.

Every figure at 10,000 records is printed beside the same figure at 10, from the same run:
create, get and list throughput and p99 (broker and REST), the daemons' memory and idle
CPU, then with the event log grown past a million events: the event rate under load, the
tap's replay rate, and billing's catch-up after a restart (behind by a stretch of the log)
and from an empty billing.db (the whole log).
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import bench as B

ACCOUNTS = 100
RECORDS = 10000
EVENTS = {False: 1_000_000, True: 100_000}  # by --quick
BEHIND = {False: 50_000, True: 10_000}
# BENCH_SCALE_EVENTS=0: the figures at 12 and 10,000 records only, without the million
# events (an hour of fsyncs when the disk is shared and busy); with --keep, the rows of
# the events come from the kept run, labelled with its date (bench.py, keep_rows).
WITH_EVENTS = os.environ.get("BENCH_SCALE_EVENTS", "1") != "0"


def ctlload(bdir, ep, op, count, inflight, infile, outfile=None, limit=None):
    cmd = [os.path.join(bdir, "bench", "ctlload"), ep, op, str(count), str(inflight), infile]
    if outfile:
        cmd.append(outfile)
    env = dict(os.environ, CTLLOAD_LIMIT=str(limit or 100))
    r = json.loads(B.run(cmd, capture_output=True, text=True, timeout=3600, env=env).stdout)
    if r["errors"]:
        raise RuntimeError(f"ctlload {op}: {r['errors']} of {r['n']} failed, first: {r['error']}")
    B.log(f"ctlload {op} ×{r['n']} ({inflight} in flight): {r['per_s']:.0f}/s p50 "
          f"{r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms")
    return r


def wrk_get(port, key, path, conns, seconds):
    env = dict(os.environ, BENCH_KEY=key)
    out = B.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s", "-s",
                 os.path.join(B.HERE, "get.lua"), f"https://localhost:{port}{path}"],
                capture_output=True, text=True, env=env, timeout=seconds + 60).stdout
    m = re.search(r"BENCHJSON (\{.*\})", out)
    if not m:
        raise RuntimeError("wrk: " + out)
    r = json.loads(m.group(1))
    if r["errors"] or r["non2xx"]:
        raise RuntimeError(f"wrk GET {path}: {r['errors']} errors ({r['non2xx']} non-2xx)")
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["p99_ms"] = r["p99_us"] / 1000
    B.log(f"wrk GET {path} c={conns}: {r['rps']:.0f}/s p99 {r['p99_us']} us")
    return r


def smaps_groups(pid):
    """A daemon's PSS (MiB) by kind of mapping, from /proc/PID/smaps: [heap] (malloc's
    main arena: the main thread's), other anonymous memory (the other threads' malloc
    arenas, where the broker's loop, a zactor thread, keeps SQLite's page cache and its
    messages; stacks; large mallocs), the SQLite WAL indexes (*-shm), the program and its
    libraries (shared: their PSS moves with who else maps them), other files."""
    groups, name = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if not parts[0].endswith(":") or "-" in parts[0]:
                path = parts[5] if len(parts) > 5 else ""
                if path == "[heap]":
                    name = "heap"
                elif path.endswith("-shm"):
                    name = "WAL index (-shm)"
                elif path.startswith("/") and (".so" in path or os.access(path, os.X_OK)):
                    name = "program and libraries"
                elif path.startswith("/"):
                    name = "other files"
                else:
                    name = "other anonymous"
            elif parts[0] == "Pss:" and name:
                groups[name] = groups.get(name, 0) + int(parts[1]) / 1024
    return groups


class Scale:
    def __init__(self, bdir, quick):
        self.bdir, self.quick = bdir, quick
        self.sbx = B.Sbx(bdir, capacity=2, settings={"vmd.templates": ""})
        self.ep = f"ipc://{self.sbx.dir}/run/broker.sock"
        self.work = os.path.join(self.sbx.dir, "scale")
        os.makedirs(self.work)
        self.sim = None

    def path(self, name):
        return os.path.join(self.work, name)

    def status(self):
        # (sbx status exits 1 while a daemon is not ready: billing while it restarts.)
        out = B.run([os.path.join(self.sbx.bin, "sbx"), "status", "--json", "--data-dir",
                     self.sbx.dir], capture_output=True, text=True, check=False).stdout
        return json.loads(out)

    def pids(self):
        st = self.status()
        p = {d["name"]: d["pid"] for d in st["daemons"] if d.get("pid")}
        if self.sim:
            p["vmdsim"] = self.sim.pid
        return p

    def last_seq(self):
        return self.status()["last_seq"]

    def billing_seq(self):
        db = os.path.join(self.sbx.dir, "billing", "billing.db")
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            try:
                row = con.execute("SELECT value FROM meta WHERE key = 'last_seq'").fetchone()
            finally:
                con.close()
            return int(row[0]) if row else 0
        except sqlite3.Error:
            return -1

    def wait_billing(self, target, timeout=3600):
        deadline = time.monotonic() + timeout
        while self.billing_seq() < target:
            if time.monotonic() > deadline:
                raise RuntimeError(f"billing not at seq {target} after {timeout} s")
            time.sleep(0.1)

    def memory(self):
        return {name: B.proc_mem(pid) for name, pid in self.pids().items()}

    def idle_cpu(self, seconds):
        """% of a core each daemon used while nothing was asked of it."""
        pids = self.pids()
        t0 = {n: B.cpu_ticks(p) for n, p in pids.items()}
        time.sleep(seconds)
        hz = os.sysconf("SC_CLK_TCK")
        return {n: (B.cpu_ticks(p) - t0[n]) / hz / seconds * 100 for n, p in pids.items()}

    def setup(self):
        mcp = B.Mcp(self.sbx.port, self.sbx.key, self.sbx.st.get("ca_cert"))
        # The guests this machine can hold, on the real vmd (its capacity: 2), first: the
        # broker places on the vmd with the most room, and vmdsim's is far larger.
        self.real = []
        for i in range(2):
            t0 = time.monotonic()
            r = mcp.call("create_sandbox", {"name": f"real{i}", "ttlSeconds": 7200})
            self.real.append(r["structuredContent"]["id"])
            B.log(f"real guest {i + 1}/2 ready in {time.monotonic() - t0:.1f} s")
        self.accounts = []
        t0 = time.monotonic()
        for i in range(ACCOUNTS):
            a = self.sbx.cli_json("account", "create", "--email", f"scale{i}@bench.example")
            self.accounts.append((a["account_id"], a["api_key"]))
        B.log(f"{ACCOUNTS} accounts in {time.monotonic() - t0:.1f} s")
        with open(self.path("accounts"), "w") as f:
            f.write("".join(f"{a}\n" for a, _ in self.accounts))
        # The account whose list is measured: all the first records, then its 1/100th.
        with open(self.path("account0"), "w") as f:
            f.write(self.accounts[0][0] + "\n")
        log = open(self.path("vmdsim.log"), "ab")
        self.sim = subprocess.Popen([os.path.join(self.bdir, "bench", "vmdsim"), "--data-dir",
                                     self.sbx.dir, "--instance", "vmdsim"],
                                    stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while not any(p.get("instance") == "vmdsim" for p in self.status().get("peers", [])):
            if time.monotonic() > deadline or self.sim.poll() is not None:
                raise RuntimeError("vmdsim did not join: " + open(self.path("vmdsim.log")).read())
            time.sleep(0.2)

    def records(self):
        return len(open(self.path("ids")).read().splitlines()) + len(self.real)

    def grow(self, to, accounts="accounts"):
        """Sandboxes on vmdsim until the broker holds `to` records, round robin over the
        accounts (a file of ids)."""
        n = to - (self.records() if os.path.exists(self.path("ids")) else len(self.real))
        if n <= 0:
            return None
        r = ctlload(self.bdir, self.ep, "create", n, 32, self.path(accounts), self.path("new"))
        with open(self.path("new")) as f, open(self.path("ids"), "a") as out:
            out.write(f.read())
        return r

    def settle(self):
        """Billing caught up and a moment's quiet, so that a figure measures the one
        thing asked, not the tail of what came before."""
        t0 = time.monotonic()
        self.wait_billing(self.last_seq())
        time.sleep(2)
        return time.monotonic() - t0 - 2

    def median_of(self, runs, key):
        """The run with the median `key` of three (in turn with the other figures, so a
        burst of outside load weighs on one run, not on the figure)."""
        runs = sorted(runs, key=lambda r: r[key])
        m = dict(runs[len(runs) // 2])
        m["runs"] = runs
        return m

    def measure_begin(self):
        with open(self.path("ids")) as f:
            account, sb = f.readline().split()
        self.m = {"records": self.records(), "settle_s": self.settle(), "account": account,
                  "sandbox": sb, "runs": {k: [] for k in ("get", "list", "create", "rest_get",
                                                          "rest_list")}}

    def measure_round(self, n_get, n_list, n_create, wrk_s):
        """One run of each figure at the current record count (creates add n_create
        records). The list is account 0's first page of 10: at 12 records it holds those
        10, at 10,000 its hundredth."""
        runs, key = self.m["runs"], dict(self.accounts)[self.m["account"]]
        self.settle()
        runs["get"].append(ctlload(self.bdir, self.ep, "get", n_get, 16, self.path("ids")))
        runs["list"].append(ctlload(self.bdir, self.ep, "list", n_list, 16,
                                    self.path("account0"), limit=10))
        runs["create"].append(ctlload(self.bdir, self.ep, "create", n_create, 16,
                                      self.path("accounts"), self.path("new")))
        with open(self.path("new")) as f, open(self.path("ids"), "a") as out:
            out.write(f.read())
        self.settle()
        sb = self.m["sandbox"]
        runs["rest_get"].append(wrk_get(self.sbx.port, key, f"/v1/sandboxes/{sb}", 8, wrk_s))
        runs["rest_list"].append(wrk_get(self.sbx.port, key, "/v1/sandboxes?limit=10", 8,
                                         wrk_s))

    def measure_end(self, label):
        m = {"records": self.m["records"], "settle_s": self.m["settle_s"]}
        for k, rs in self.m["runs"].items():
            m[k] = self.median_of(rs, "rps" if k.startswith("rest") else "per_s")
        m["records_after"] = self.records()
        # Memory after the idle window: a daemon keeps large buffers while work flows and
        # gives them back once idle (common/sbx_heap.h); this is what it holds at rest.
        m["idle_cpu"] = self.idle_cpu(10 if self.quick else 20)
        m["memory"] = self.memory()
        m["broker_maps"] = smaps_groups(self.pids()["sbx-broker"])
        m["last_seq"] = self.last_seq()
        B.log(f"at {label}: {m['records']} records, {m['last_seq']} events, memory "
              + ", ".join(f"{n} {v['pss_mib']:.1f}" for n, v in m["memory"].items()) + " MiB PSS")
        return m

    def cycles(self, events):
        """Stop/resume cycles (4 events each) until the log holds `events`."""
        n = max(0, (events - self.last_seq() + 3) // 4)
        if not n:
            return None
        t0, s0 = time.monotonic(), self.last_seq()
        r = ctlload(self.bdir, self.ep, "cycle", n, 32, self.path("ids"))
        r["events"] = self.last_seq() - s0
        r["events_per_s"] = r["events"] / (time.monotonic() - t0)
        return r

    def run(self, res, base):
        """base: a second sbx up (its own data directory), kept at 12 records: each
        figure's runs at 10,000 alternate with the same runs at 12, so that the load of
        the moment on this shared machine weighs on both alike."""
        q = self.quick
        for s in (base, self):
            s.setup()
            s.grow(12, "account0")
        out = {"accounts": ACCOUNTS, "real_guests": len(self.real)}
        out["fill"] = self.grow(RECORDS)
        base.measure_begin()
        self.measure_begin()
        for _ in range(3):
            for s in (base, self):
                s.measure_round(30000, 20000, 150, 3)
        out["at10"] = base.measure_end("12")
        out["at10k"] = self.measure_end("10,000")
        # base stays up (idle) to the end: a daemon's PSS counts its share of the pages it
        # maps with others (libraries), so the figures after the events are taken with the
        # same processes around as those at 12.
        if not WITH_EVENTS:
            out["events_skipped"] = True
            res["scale"] = out
            return
        events = EVENTS[q]
        out["load"] = self.cycles(events)
        out["billing_lag_s"] = self.settle()
        # The tap's replay: every event from seq 0, as a new consumer reads it.
        t0 = time.monotonic()
        tap = self.sbx.cli("tap", "--since", "0", "--once", timeout=3600)
        lines = tap.stdout.count("\n")
        out["tap"] = {"events": lines, "seconds": time.monotonic() - t0}
        out["tap"]["per_s"] = lines / out["tap"]["seconds"]
        B.log(f"tap replay: {lines} events in {out['tap']['seconds']:.1f} s")
        # Billing after a restart, behind by a stretch of the log.
        behind = BEHIND[q]
        pid = self.pids()["sbx-billing"]
        applied = self.billing_seq()
        os.kill(pid, signal.SIGSTOP)
        try:
            self.cycles(self.last_seq() + behind)
        finally:
            applied = self.billing_seq()
            os.kill(pid, signal.SIGKILL)
        target = self.last_seq()
        t0 = time.monotonic()
        self.wait_billing(target)
        out["billing_restart"] = {"behind": target - applied, "seconds": time.monotonic() - t0,
                                  "log_events": target}
        B.log(f"billing restarted {target - applied} events behind: caught up in "
              f"{out['billing_restart']['seconds']:.1f} s")
        # Billing from nothing: its database gone, it replays the whole log.
        pid = self.pids()["sbx-billing"]
        os.kill(pid, signal.SIGSTOP)
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(os.path.join(self.sbx.dir, "billing", "billing.db" + suffix))
            except FileNotFoundError:
                pass
        os.kill(pid, signal.SIGKILL)
        target = self.last_seq()
        t0 = time.monotonic()
        self.wait_billing(target)
        out["billing_replay"] = {"events": target, "seconds": time.monotonic() - t0}
        out["billing_replay"]["per_s"] = target / out["billing_replay"]["seconds"]
        B.log(f"billing from an empty database: {target} events in "
              f"{out['billing_replay']['seconds']:.1f} s")
        idle = self.idle_cpu(10 if q else 20)  # first: memory at rest, as in measure_end
        out["after"] = {"records": self.records(), "last_seq": self.last_seq(),
                        "memory": self.memory(), "idle_cpu": idle,
                        "broker_maps": smaps_groups(self.pids()["sbx-broker"])}
        out["files_mib"] = {n: os.path.getsize(os.path.join(self.sbx.dir, d, n)) / B.MiB
                            for d, n in (("broker", "control.db"), ("billing", "billing.db"))}
        segdir = os.path.join(self.sbx.dir, "broker", "events")
        segs = [n for n in os.listdir(segdir) if n.endswith(".db")] if os.path.isdir(segdir) else []
        out["files_mib"][f"{len(segs)} event segments"] = sum(
            os.path.getsize(os.path.join(segdir, n)) for n in segs) / B.MiB
        res["scale"] = out

    def close(self):
        if self.sim and self.sim.poll() is None:
            self.sim.terminate()
            self.sim.wait()
        self.sbx.close()


def part_scale(bdir, quick, res):
    s = base = None
    try:
        base = Scale(bdir, quick)
        s = Scale(bdir, quick)
        s.run(res, base)
    finally:
        for x in (base, s):
            if x:
                x.close()
