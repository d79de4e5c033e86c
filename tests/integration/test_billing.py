"""Per-second billing from the event log (issue 6, points 1-3): real daemons under `sbx up`,
real guests. Sandboxes run, stop, resume and are deleted while sbx-billing is killed
with SIGKILL (twice), the broker once and vmd once (its guests re-adopted, running on);
afterwards `sbx usage --json` must equal, to the millisecond and the micro-dollar, the
ready intervals in `sbx tap --since 0 --once sandbox.`, and billing must have applied
the log up to its last event."""
import datetime
import json
import os
import signal
import time
import unittest

from sbxtest import BIN, Sbx, main, wait_for

ADMIN = "admin@localhost"
RATE = {"small": 10, "medium": 20, "large": 40}  # µ$ per second, the documented defaults
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def ts_ms(text):
    """ms since the epoch of an ISO 8601 time from `sbx tap`, in integers only."""
    dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (dt - EPOCH) // datetime.timedelta(milliseconds=1)


def ready_ms(log):
    """Per sandbox: ms in ready, from sandbox.changed events alone."""
    since, total = {}, {}
    for e in log:
        if e["type"] != "sandbox.changed":
            continue
        sid = e["sandbox_id"]
        if e["to"] == "ready" and sid not in since:
            since[sid] = ts_ms(e["ts"])
        elif e["to"] != "ready" and sid in since:
            total[sid] = total.get(sid, 0) + ts_ms(e["ts"]) - since.pop(sid)
    return total, since


class BillingTest(unittest.TestCase):
    def settings(self):
        # The guest image the build made, when vmd's own default doesn't find it.
        image = os.path.realpath(os.path.join(BIN, "..", "image"))
        return {"image_dir": image} if os.path.isdir(image) else None

    def kill(self, s, name):
        pid = s.daemon_pid(name)
        self.assertIsNotNone(pid, f"{name} is not running")
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_back(self, s, name, old):
        wait_for(lambda: s.daemon_pid(name) not in (None, old) and
                 all(d["ready"] for d in s.status()["daemons"]), 60, f"{name} restarted")

    def test_usage_equals_the_log_through_restarts(self):
        s = Sbx(self, "billing", settings=self.settings())
        s.up()
        a = s.cli_json("sandbox", "create", "--account", ADMIN, timeout=300)["id"]
        b = s.cli_json("sandbox", "create", "--account", ADMIN, timeout=300)["id"]
        time.sleep(2)
        s.cli_json("sandbox", "stop", a, timeout=300)

        # Billing dies with b's interval open and misses a's resume.
        old = self.kill(s, "sbx-billing")
        s.cli_json("sandbox", "resume", a, timeout=300)
        self.wait_back(s, "sbx-billing", old)

        # The broker dies while both run.
        old = self.kill(s, "sbx-broker")
        self.wait_back(s, "sbx-broker", old)
        wait_for(lambda: len(s.status()["peers"]) == 5, 30, "all five workers back")
        time.sleep(1)

        # vmd dies while both run: the guests keep running and the new vmd re-adopts them.
        # Nothing changes state, so the log (and billing) loses and doubles no second.
        before = len(s.cli("tap", "--since", "0", "--once").stdout.splitlines())
        old = self.kill(s, "sbx-vmd")
        self.wait_back(s, "sbx-vmd", old)
        wait_for(lambda: len(s.status()["peers"]) == 5, 30, "all five workers back")
        for sid in (a, b):
            self.assertEqual(s.cli_json("sandbox", "get", sid)["state"], "ready", sid)
        s.cli("sandbox", "exec", a, "--", "true", timeout=120)  # re-adopted, answering
        during = [json.loads(l) for l in
                  s.cli("tap", "--since", "0", "--once").stdout.splitlines()][before:]
        self.assertEqual([e for e in during if e["type"] == "sandbox.changed"], [])

        # Billing dies again, between the two stops.
        s.cli_json("sandbox", "stop", b, timeout=300)
        old = self.kill(s, "sbx-billing")
        s.cli_json("sandbox", "delete", a, timeout=300)
        self.wait_back(s, "sbx-billing", old)

        log = [json.loads(l) for l in s.cli("tap", "--since", "0", "--once").stdout.splitlines()]
        self.assertEqual([e["seq"] for e in log], list(range(1, len(log) + 1)))
        last_seq = log[-1]["seq"]
        expect, still = ready_ms([e for e in log if e["type"].startswith("sandbox.")])
        self.assertEqual(still, {})  # nothing left running
        self.assertGreaterEqual(expect[a], 3000)
        self.assertGreaterEqual(expect[b], 3000)

        usage = wait_for(lambda: (lambda u: u["last_seq"] >= last_seq and u)(
            s.cli_json("usage", "--account", ADMIN)), 30, f"billing at seq {last_seq}")
        # Only peer events can follow the last sandbox event.
        self.assertEqual(usage["last_seq"],
                         json.loads(s.cli("tap", "--since", "0", "--once").stdout.splitlines()[-1])["seq"])
        got = {x["sandbox_id"]: x for x in usage["sandboxes"]}
        self.assertEqual(set(got), {a, b})
        total_micro = 0
        for sid, ms in expect.items():
            self.assertEqual(got[sid]["running_ms"], ms, sid)
            micro = ms * RATE[got[sid]["type"]] // 1000
            self.assertEqual(got[sid]["micro_usd"], micro, sid)
            self.assertFalse(got[sid]["running"])
            total_micro += micro
        self.assertEqual(usage["running_ms"], sum(expect.values()))
        self.assertEqual(usage["micro_usd"], total_micro)
        self.assertEqual(sum(d["micro_usd"] for d in usage["days"]), total_micro)
        self.assertEqual(sum(d["running_ms"] for d in usage["days"]), usage["running_ms"])
        self.assertEqual(usage["balance_micro_usd"], -total_micro)
        self.assertEqual(got[a]["state"], "deleted")
        self.assertEqual(got[b]["state"], "stopped")
        print(f"\nlog: {expect} ms; billed {usage['micro_usd']} µ$ (${usage['usd']})")

        # A running sandbox counts up to the request, without being stored.
        s.cli_json("sandbox", "resume", b, timeout=300)
        time.sleep(1)
        now = {x["sandbox_id"]: x for x in s.cli_json("usage", "--account", ADMIN)["sandboxes"]}
        self.assertTrue(now[b]["running"])
        self.assertGreater(now[b]["running_ms"], expect[b])
        s.cli_json("sandbox", "delete", b, timeout=300)

        # Unknown accounts are refused plainly; the text form prints.
        res = s.cli("usage", "--account", "nobody@example.com", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("not_found", res.stderr)
        self.assertIn("total", s.cli("usage", "--account", ADMIN).stdout)


if __name__ == "__main__":
    main()
