"""Logs, the operator's way (issue 18 item 3): `log.format = json` under `sbx up`, every
daemon's log rotated by size (`log.max_bytes`, `log.keep`), and SIGHUP after an outside
rename (what logrotate does) making each daemon write to a new file. No guest.

Requests that log with a request id (the gateway at debug level logs each one, with a
marker in its path), refused API keys and an account creation grow the logs past a small
cap; then every line of every file of every daemon must be one JSON object with the
fixed fields, each marker must be in exactly one line of one file (none lost, repeated
or split across a rotation), and no file may have grown far past the cap.
Also: a daemon started alone refuses a bad setting naming its key (issue 18 item 4)."""
import glob
import http.client
import json
import os
import signal
import ssl
import subprocess
import tempfile
import time
import unittest

from sbxtest import Sbx, binary, main, wait_for

DAEMONS = ["sbx-broker", "sbx-vmd", "sbx-snapshotd", "sbx-billing", "sbx-gateway"]
MAX_BYTES = 16384
KEEP = 50  # enough that nothing this test writes is dropped
FIELDS = {"ts", "level", "daemon", "pid", "msg"}


def log_files(s, name):
    """A daemon's log and its rotations, oldest first."""
    base = os.path.join(s.dir, "logs", f"{name}.log")
    rotated = sorted(glob.glob(base + ".[0-9]*"), key=lambda p: -int(p.rsplit(".", 1)[1]))
    return rotated + ([base] if os.path.exists(base) else [])


def records(path):
    """Every line of path, each parsed as JSON (the test fails on one that is not)."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    if data:
        assert data.endswith(b"\n"), f"{path} ends inside a line: {data[-200:]!r}"
    for raw in data.split(b"\n")[:-1]:
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            raise AssertionError(f"{path}: not a JSON line ({exc}): {raw[:300]!r}") from None
        assert isinstance(rec, dict) and FIELDS <= rec.keys(), f"{path}: {rec}"
        out.append(rec)
    return out


class LogsTest(unittest.TestCase):
    def test_json_rotation_and_sighup(self):
        # No template guest either (vmd.templates): nothing here needs one.
        s = Sbx(self, "logs", settings={"log.format": "json", "log.max_bytes": MAX_BYTES,
                                        "log.keep": KEEP, "vmd.templates": ""})
        s.up("--log-level", "debug")
        banner = wait_for(lambda: "admin API key:" in s.output() and s.output(), 30, "banner")
        key = banner.split("admin API key:")[1].split()[0]
        ca = s.status()["ca_cert"]
        conn = http.client.HTTPSConnection("localhost", s.listen_port(), timeout=30,
                                           context=ssl.create_default_context(cafile=ca))

        def get(path, token):
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            res = conn.getresponse()
            res.read()
            return res.status

        # Each request's line carries its marker; paced so that a second's worth (what
        # may be written between two checks of the sizes) stays under the cap.
        markers = []
        for batch in range(12):
            for i in range(20):
                m = f"mk{batch:02d}x{i:02d}"
                markers.append(m)
                self.assertEqual(get(f"/v1/sandboxes?marker={m}", key), 200)
            # A refused key, and an account: lines of the broker with rid and account.
            self.assertEqual(get("/v1/sandboxes", "sbx_not_a_key"), 401)
            s.cli("account", "create", "--email", f"logs{batch}@example.com")
            time.sleep(0.3)
        conn.close()

        wait_for(lambda: len(log_files(s, "sbx-gateway")) >= 3, 10,
                 "the gateway's log rotated twice")

        # External rotation: rename every log, SIGHUP sbx up; each daemon (and sbx up)
        # writes to a new file from then on, the renamed one gets nothing more.
        for name in DAEMONS + ["sbx-up"]:
            path = os.path.join(s.dir, "logs", f"{name}.log")
            os.rename(path, path + ".renamed")
        s.up_proc.send_signal(signal.SIGHUP)
        for name in DAEMONS:
            wait_for(lambda: "log file" in "".join(r["msg"] for r in records(
                os.path.join(s.dir, "logs", f"{name}.log"))), 10, f"{name} reopened its log")
        wait_for(lambda: os.path.exists(os.path.join(s.dir, "logs", "sbx-up.log")), 10,
                 "sbx up reopened its own log")
        renamed_size = os.path.getsize(os.path.join(s.dir, "logs", "sbx-broker.log.renamed"))
        s.cli("account", "create", "--email", "after-hup@example.com")
        broker_now = records(os.path.join(s.dir, "logs", "sbx-broker.log"))
        self.assertTrue([r for r in broker_now if "after-hup@example.com" in r["msg"]],
                        broker_now)
        self.assertEqual(os.path.getsize(os.path.join(s.dir, "logs", "sbx-broker.log.renamed")),
                         renamed_size)
        self.assertEqual(s.stop(), 0)

        # Every line of every file, JSON with the fixed fields and its daemon's name.
        every = {}
        for name in DAEMONS + ["sbx-up"]:
            paths = log_files(s, name) + [os.path.join(s.dir, "logs", f"{name}.log.renamed")]
            self.assertLessEqual(len(paths), KEEP + 2, paths)
            every[name] = []
            for path in paths:
                recs = records(path)
                self.assertTrue(all(r["daemon"] == name for r in recs), path)
                self.assertTrue(all(r["level"] in ("debug", "info", "warn", "error")
                                    for r in recs), path)
                every[name] += recs
                if path.rsplit(".", 1)[1].isdigit():
                    # Rotated once over the cap, which is checked every second.
                    self.assertLess(os.path.getsize(path), 4 * MAX_BYTES, path)

        # Each marker in exactly one line, with its request id pulled out as a number.
        seen = {}
        for r in every["sbx-gateway"]:
            for m in markers:
                if f"marker={m} " in r["msg"]:
                    seen[m] = seen.get(m, 0) + 1
                    self.assertIsInstance(r.get("request_id"), int, r)
                    self.assertTrue(r["msg"].startswith("http: GET /v1/sandboxes?marker="), r)
        self.assertEqual({m for m in markers if seen.get(m) != 1}, set(), seen)
        self.assertTrue([r for r in every["sbx-gateway"] if " 401 " in r["msg"]])
        created = [r for r in every["sbx-broker"] if r.get("account") and "created" in r["msg"]]
        self.assertGreaterEqual(len(created), 13, created)  # admin, 12, after-hup: with rid
        self.assertTrue(all(isinstance(r.get("request_id"), int) for r in created), created)
        self.assertTrue([r for r in every["sbx-up"] if r["msg"].startswith("rotated ")])

    def test_daemon_refuses_a_bad_setting(self):
        # Started alone (systemd, by hand), a daemon checks every setting as sbx up does:
        # refused, naming the key, exit 2, before anything starts.
        d = tempfile.mkdtemp(prefix="sbxtest-daemonconf-")
        try:
            for name, setting, want in [
                    ("sbx-broker", "heartbeat_ms=10s", "heartbeat_ms = '10s' will not do: it "
                     "must be a whole number"),
                    ("sbx-gateway", "log.format=xml", "log.format = 'xml' will not do: it must "
                     "be text or json")]:
                res = subprocess.run([binary(name), "--data-dir", d, "--set", setting],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(res.returncode, 2, res.stderr)
                self.assertIn(want, res.stderr)
                self.assertIn("invalid_argument", res.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "broker", "control.db")))
        finally:
            subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    main()
