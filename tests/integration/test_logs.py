"""Logs, the operator's way (issue 18 item 3): `log.format = json` under `sbx up`, every
daemon's log rotated by size (`log.max_bytes`, `log.keep`), and the real logrotate, with
the configuration docs/operations.md shows, renaming the logs and signalling sbx up:
each daemon (and sbx up) then writes to a new file. No guest.

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
import shutil
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
NAMES = DAEMONS + ["sbx-up"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


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
    def test_json_and_rotation(self):
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

        self.assertEqual(s.stop(), 0)

        # Every line of every file, JSON with the fixed fields and its daemon's name.
        every = {}
        for name in DAEMONS + ["sbx-up"]:
            paths = log_files(s, name)
            self.assertLessEqual(len(paths), KEEP + 1, paths)
            every[name] = []
            for path in paths:
                recs = records(path)
                self.assertTrue(all(r["daemon"] == name for r in recs), path)
                self.assertTrue(all(r["level"] in ("debug", "info", "warn", "error")
                                    for r in recs), path)
                every[name] += recs
                if not path.endswith(".log"):
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
        self.assertGreaterEqual(len(created), 13, created)  # admin and 12, with rid
        self.assertTrue(all(isinstance(r.get("request_id"), int) for r in created), created)
        self.assertTrue([r for r in every["sbx-up"] if r["msg"].startswith("rotated ")])

    def test_logrotate_and_sighup(self):
        # What docs/operations.md shows for an outside rotation, run as it is written
        # there (the data directory aside) by the real logrotate: log.max_bytes = 0, text
        # lines (the default format).
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            doc = f.read()
        start = doc.index("    /var/lib/sbx/logs/*.log {\n")
        snippet = doc[start:doc.index("\n    }\n", start) + 7]
        snippet = "".join(line[4:] + "\n" for line in snippet.splitlines())
        s = Sbx(self, "logrotate", settings={"log.max_bytes": 0, "vmd.templates": ""})
        conf = os.path.join(s.dir, "logrotate.conf")
        with open(conf, "w") as f:
            f.write(snippet.replace("/var/lib/sbx", s.dir))
        logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
        if not os.access(logrotate, os.X_OK):
            raise AssertionError("logrotate is needed (scripts/install-deps.sh installs it)")
        s.up()
        logs = os.path.join(s.dir, "logs")
        for cycle in (1, 2):
            before = {n: os.stat(os.path.join(logs, f"{n}.log")).st_ino for n in NAMES}
            res = subprocess.run([logrotate, "-f", "-s", os.path.join(s.dir, "logrotate.state"),
                                  conf], capture_output=True, text=True, timeout=30)
            self.assertEqual(res.returncode, 0, res.stderr)
            for name in NAMES:
                # The file that was written is .1 now (delaycompress: not yet compressed);
                # the daemon reopened <name>.log, saying so there.
                self.assertEqual(os.stat(os.path.join(logs, f"{name}.log.1")).st_ino,
                                 before[name])
                want = "log file" if name != "sbx-up" else "logs reopened"
                wait_for(lambda: want in read(os.path.join(logs, f"{name}.log")), 10,
                         f"{name} writing to a new {name}.log (cycle {cycle})")
            # What happens next goes to the new file only.
            rotated = os.path.getsize(os.path.join(logs, "sbx-broker.log.1"))
            s.cli("account", "create", "--email", f"after-rotate-{cycle}@example.com")
            self.assertIn(f"after-rotate-{cycle}@example.com",
                          read(os.path.join(logs, "sbx-broker.log")))
            self.assertEqual(os.path.getsize(os.path.join(logs, "sbx-broker.log.1")), rotated)
        # The second cycle compressed the first one's file.
        for name in NAMES:
            self.assertTrue(os.path.exists(os.path.join(logs, f"{name}.log.2.gz")), name)
        self.assertEqual(s.stop(), 0)

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
