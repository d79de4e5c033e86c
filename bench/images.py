#!/usr/bin/env python3
"""What an image costs against another, in the same run: create time and idle memory.

bench/images.py --build DIR --image IMAGE [--baseline IMAGE] [--type small] [-n 3]
                [--idle 10] [--templates]

Two `sbx up`s side by side (bench.py's Sbx: capacity 12, no plan limits), the baseline's
`image_dir` the baseline image (default DIR/image), the other's `image_dir.TYPE` IMAGE;
vmd.templates off unless --templates (then each makes its TYPE template first, and the
creates restore it). n creates of TYPE through MCP, taken in turn (baseline, image,
baseline, ...) so that the load of the moment weighs on both; then, with all 2n idle
together, 5 s later, per QEMU what bench.py's density part takes: PSS and RSS
(smaps_rollup), the guest's own used memory (MemTotal - MemAvailable, exec'd `cat
/proc/meminfo`), the guest RAM mapping's PSS, and idle CPU over --idle s. Prints medians
and each figure's ratio to the baseline's; writes nothing. Run it under the integration
lock (flock /tmp/sbx-integration.lock): its vmds load the host's nftables table.
"""
import argparse
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (its helpers: Sbx, Mcp, proc_mem, guest_ram, cpu_ticks)


def measure(sbx, mcp, ids):
    out = []
    for sb in ids:
        with open(os.path.join(sbx.dir, "vms", sb, "qemu.pid")) as f:
            pid = int(f.read().strip())
        r = mcp.call("exec", {"sandboxId": sb, "command": "cat /proc/meminfo"})
        mi = {l.split(":")[0]: int(l.split()[1])
              for l in r["structuredContent"].get("stdout", "").splitlines() if ":" in l}
        out.append(dict(pid=pid, guest_used_mib=(mi["MemTotal"] - mi["MemAvailable"]) / 1024,
                        guest_ram_pss_mib=bench.guest_ram(pid)["Pss"], **bench.proc_mem(pid)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="a built tree (its bin/ and image/)")
    ap.add_argument("--image", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--type", default="small", choices=["small", "medium", "large"])
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10)
    ap.add_argument("--templates", action="store_true")
    args = ap.parse_args()
    bdir = os.path.abspath(args.build)
    base_img = os.path.realpath(args.baseline or os.path.join(bdir, "image"))
    img = os.path.realpath(args.image)
    tpl = {"vmd.templates": args.type if args.templates else ""}
    sides = {"baseline": {"image_dir": base_img, **tpl},
             "image": {"image_dir": base_img, f"image_dir.{args.type}": img, **tpl}}
    print(f"images: baseline {base_img}, image {img} (type {args.type}, n {args.n}, "
          f"templates {'on' if args.templates else 'off'}, load {bench.loadavg()})", flush=True)
    up, mcp, ids, create_s = {}, {}, {}, {}
    try:
        for name, settings in sides.items():
            up[name] = bench.Sbx(bdir, settings=settings)
            mcp[name] = bench.Mcp(up[name].port, up[name].key, up[name].st.get("ca_cert"))
            ids[name], create_s[name] = [], []
        if args.templates:
            for name in sides:
                deadline = time.monotonic() + 600
                while not glob.glob(os.path.join(up[name].dir, "templates", "*",
                                                 f"*-{args.type}-*", "qemu.version")):
                    if time.monotonic() > deadline:
                        sys.exit(f"{name}: no {args.type} template after 600 s")
                    time.sleep(0.5)
        for i in range(args.n):
            for name in sides:
                t0 = time.monotonic()
                r = mcp[name].call("create_sandbox", {"name": f"{name}{i}", "type": args.type})
                create_s[name].append(time.monotonic() - t0)
                ids[name].append(r["structuredContent"]["id"])
                print(f"{name}: create {i + 1}/{args.n} {create_s[name][-1]:.2f} s", flush=True)
        time.sleep(5)  # let boots settle, as bench.py's density part does
        per = {name: measure(up[name], mcp[name], ids[name]) for name in sides}
        ticks = {p["pid"]: bench.cpu_ticks(p["pid"]) for name in sides for p in per[name]}
        time.sleep(args.idle)
        hz = os.sysconf("SC_CLK_TCK")
        for name in sides:
            for p in per[name]:
                p["idle_cpu_pct"] = 100 * (bench.cpu_ticks(p["pid"]) - ticks[p["pid"]]) / hz / args.idle
    finally:
        for sbx in up.values():
            sbx.close()
    rows = [("create (s)", lambda n: create_s[n]),
            ("QEMU PSS (MiB)", lambda n: [p["pss_mib"] for p in per[n]]),
            ("QEMU RSS (MiB)", lambda n: [p["rss_mib"] for p in per[n]]),
            ("guest RAM PSS (MiB)", lambda n: [p["guest_ram_pss_mib"] for p in per[n]]),
            ("guest used (MiB)", lambda n: [p["guest_used_mib"] for p in per[n]]),
            ("idle CPU (%)", lambda n: [p["idle_cpu_pct"] for p in per[n]])]
    print(f"\n| figure (median of {args.n}) | baseline | image | ratio |\n|---|---|---|---|")
    for label, get in rows:
        b, v = statistics.median(get("baseline")), statistics.median(get("image"))
        ratio = f"{v / b:.2f}x" if b else "-"
        print(f"| {label} | {b:.2f} | {v:.2f} | {ratio} |")
    print(f"\nload {bench.loadavg()}")


if __name__ == "__main__":
    main()
