"""Billing's wallet check at a growing history (issue 21 item 2), a part of bench/run
(--only wallet).

bench/walletbench (linked with billing's own library) makes a billing.db through the
meter that the daemon runs, 100 accounts with funds and one running sandbox each, and
INTERVALS closed intervals spread over them, then times one check pass over every account
(CPU time) with the three algorithms the tree has had, on the same store: `whole` (each
account's whole usage, before cdb7a45), `rows` (each account's rows from the store,
cdb7a45 to aca0ddc) and `memory` (bill_funds: a tick visits the accounts running
sandboxes or changed; every tenth tick all of them). Each size is its own store, built in
the same run; walletbench checks that the algorithms agree to the micro-dollar.
"""
import json
import os
import shutil
import tempfile

import bench as B

ACCOUNTS = 100
NAMES = {"whole": "whole history (before cdb7a45)", "rows": "rows per account (to aca0ddc)",
         "memory_tick": "in memory, a tick (bill_funds)",
         "memory_all": "in memory, every tenth tick (all accounts)"}


def part_wallet(bdir, quick, res):
    sizes = [10, 10000] if quick else [10, 100000]
    out = {"accounts": ACCOUNTS, "runs": []}
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the build is fsyncs
    for n in sizes:
        d = tempfile.mkdtemp(prefix="walletbench.", dir=where)
        try:
            r = B.run([os.path.join(bdir, "bench", "walletbench"), d, str(ACCOUNTS), str(n),
                       "20"], capture_output=True, text=True, timeout=3600)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        run = json.loads(r.stdout)
        B.log(f"wallet check at {n} intervals: " + ", ".join(
            f"{k} {run[k]['median_ms']:.4f} ms" for k in NAMES) + f"; agree {run['agree']}")
        out["runs"].append(run)
    res["wallet"] = out


def wallet_rows(w):
    out = []
    small, big = w["runs"][0], w["runs"][-1]
    for key, name in NAMES.items():
        a, b = big[key], small[key]
        out.append((f"wallet check, one pass over {w['accounts']} accounts ({big['running']} "
                    f"running), {name}: CPU at {big['intervals']:,} intervals", a["n"],
                    B.fmt(a["median_ms"], " ms", 4),
                    f"{B.fmt(b['median_ms'], ' ms', 4)} at {small['intervals']:,} intervals; "
                    f"spread {a['min_ms']:.4f}–{a['max_ms']:.4f} ms",
                    B.fmt(a["median_ms"] / b["median_ms"] if b["median_ms"] else None, "×", 2),
                    "—", "—" if big["agree"] else "**figures differ**"))
    a, b = big["memory_tick"], big["rows"]
    out.append((f"wallet check at {big['intervals']:,} intervals: a tick in memory vs rows per "
                f"account", a["n"], B.fmt(a["median_ms"], " ms", 4),
                f"{B.fmt(b['median_ms'], ' ms', 4)} rows per account; whole history "
                f"{B.fmt(big['whole']['median_ms'], ' ms', 1)}",
                B.fmt(a["median_ms"] / b["median_ms"], "×", 4), "—", "—"))
    return out
