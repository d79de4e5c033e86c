"""Several hosts (issue 16 item 4), a part of bench/run (--only cluster).

The figures come from tests/integration/test_cluster.py, run as it runs in the suite
(network namespaces: three control nodes, two gateways behind HAProxy, two vmd hosts,
an MCP workload; the leading broker killed with SIGKILL ten times and once cut off the
bridge), which writes them to SBX_CLUSTER_FIGURES. The baseline, from the same run: one
machine's `sbx up` with a sandbox, its broker killed with SIGKILL three times, a minute
apart (sbx up's restart backoff is back to 0.25 s by then), each time until an exec
through the gateway answers again (sbx up restarts it).
Needs root (ip netns) and haproxy, as the test does.
"""
import http.client
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

import bench as B

KILLS = 10
BASELINE_KILLS = 3  # a minute each


def _exec_ok(port, key, sb):
    ctx = ssl._create_unverified_context()
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30)
    try:
        conn.request("POST", f"/v1/sandboxes/{sb}/exec", body=json.dumps({"command": "true"}),
                     headers={"Authorization": f"Bearer {key}",
                              "Content-Type": "application/json"})
        res = conn.getresponse()
        body = res.read()
        return res.status == 200 and json.loads(body).get("exitCode") == 0
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()


def _wait(what, pred, timeout=90, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise RuntimeError(f"cluster bench: {what} not within {timeout} s")


def baseline(bdir, kills):
    """One machine: a broker killed with SIGKILL, until an exec answers again."""
    sbx = B.Sbx(bdir)
    try:
        mcp = B.Mcp(sbx.port, sbx.key, sbx.st.get("ca_cert"))
        sb = mcp.call("create_sandbox", {"name": "failover"})["structuredContent"]["id"]
        _wait("the first exec", lambda: _exec_ok(sbx.port, sbx.key, sb), 120)
        times = []
        for i in range(kills):
            # sbx up restarts a daemon at once only after a minute of readiness (its
            # backoff doubles from 0.25 s to 30 s while it keeps failing): one kill a
            # minute is the restart an operator sees.
            time.sleep(61)
            pid = next(d["pid"] for d in sbx.status()["daemons"] if d["name"] == "sbx-broker")
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            _wait("an exec after the broker's kill", lambda: _exec_ok(sbx.port, sbx.key, sb))
            times.append(time.monotonic() - t0)
            B.log(f"one machine: broker killed, exec answered after {times[-1]:.2f} s")
            _wait("every daemon ready", lambda: all(d["ready"] for d in sbx.status()["daemons"]),
                  interval=0.2)
        return times
    finally:
        sbx.close()


def part_cluster(bdir, quick, res):
    kills = 3 if quick else KILLS
    base = baseline(bdir, 1 if quick else BASELINE_KILLS)
    fd, figures = tempfile.mkstemp(prefix="sbxbench-cluster-", suffix=".json")
    os.close(fd)
    os.unlink(figures)
    test = os.path.join(B.ROOT, "tests", "integration", "test_cluster.py")
    env = dict(os.environ, SBX_BIN=os.path.join(bdir, "bin"), SBX_CLUSTER_FIGURES=figures,
               SBX_CLUSTER_FAILOVERS=str(kills), PYTHONDONTWRITEBYTECODE="1")
    B.log("integration.cluster with figures (about 2 minutes)")
    r = subprocess.run([sys.executable, test], env=env, capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0 or not os.path.exists(figures):
        raise RuntimeError("test_cluster.py failed or wrote no figures:\n" + r.stdout[-3000:] +
                           r.stderr[-3000:])
    with open(figures) as f:
        fig = json.load(f)
    os.unlink(figures)
    res["cluster"] = {"figures": fig, "baseline_s": [round(t, 3) for t in base]}


def cluster_rows(cl):
    f, base = cl["figures"], cl["baseline_s"]
    bmed, bmax = statistics.median(base), max(base)
    n = f["failovers"]
    bl = f"one machine: broker SIGKILLed, sbx up restarts it (N={len(base)})"
    ratio = lambda a, b: f"{a / b:.2f}×" if b else "—"
    zero = lambda v: "met" if v == 0 else "**MISSED**"
    return [
        ("cluster failover: leading broker SIGKILLed → exec through HAProxy and a gateway answers "
         "(3 control nodes; median)", n, B.fmt(f["failover_median_s"], " s"),
         f"{bmed:.3f} s {bl}", ratio(f["failover_median_s"], bmed), "—", "—"),
        ("cluster failover: the same, max", n, B.fmt(f["failover_max_s"], " s"),
         f"{bmax:.3f} s max, one machine", ratio(f["failover_max_s"], bmax), "—", "—"),
        ("cluster partition: leading node cut off the bridge → exec answers", 1,
         B.fmt(f["partition_s"], " s"), f"{bmed:.3f} s one machine's broker restart (median)",
         ratio(f["partition_s"], bmed), "—", "—"),
        (f"cluster: requests through the failovers without an answer (of {f['requests']}: "
         + ", ".join(f"{k} {v}" for k, v in sorted(f["requests_by_answer"].items())) + ")",
         f["requests"], f["requests_unanswered"], "—", "—", "0", zero(f["requests_unanswered"])),
        ("cluster: billed ms lost or doubled (billing's total against the event log)",
         f["sandboxes"], f["billed_ms_lost_or_doubled"], "—", "—", "0",
         zero(f["billed_ms_lost_or_doubled"])),
        ("cluster: sandboxes lost beyond the killed vmd host's (each of its reported host lost)",
         f["sandboxes"], f["sandboxes_lost_beyond"], "—", "—", "0",
         zero(f["sandboxes_lost_beyond"])),
        ("vmd host killed whole → its sandboxes in error, host lost", 1,
         B.fmt(f["host_lost_after_s"], " s"), f"vmd.lost_after_ms = {f['lost_after_ms'] / 1000:.1f} s",
         ratio(f["host_lost_after_s"], f["lost_after_ms"] / 1000), "—", "—"),
        ("vmd host back on the network → its lost sandboxes as they were", 1,
         B.fmt(f["host_back_after_s"], " s"), f"{bmed:.3f} s one machine's broker restart (median)",
         ratio(f["host_back_after_s"], bmed), "—", "—"),
    ] + ([
        ("drain: a stopped small sandbox moved to the other vmd host (memory and disk)", 1,
         B.fmt(f["move_s"], " s"), "—", "—", "—", "—"),
    ] if "move_s" in f else []) + ([
        ("user snapshot saved on one vmd host → its second copy on the other, recorded", 1,
         B.fmt(f["snapshot_copy_s"], " s"), "—", "—", "—", "—"),
    ] if "snapshot_copy_s" in f else [])
