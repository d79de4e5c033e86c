"""sbx up, sbx status, accounts and keys, supervision: the operator contract (issue 2)."""
import glob
import json
import os
import signal
import subprocess
import unittest

from sbxtest import Sbx, binary, main, pid_alive, wait_for

DAEMONS = ["sbx-broker", "sbx-vmd", "sbx-snapshotd", "sbx-billing", "sbx-hookd", "sbx-gateway"]


class UpTest(unittest.TestCase):
    def test_help_everywhere(self):
        for name in DAEMONS + ["sbx"]:
            res = subprocess.run([binary(name), "--help"], capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, name)
            self.assertIn("usage:", res.stdout, name)
        for sub in ["up", "status", "account", "key", "tap"]:
            res = subprocess.run([binary("sbx"), sub, "--help"], capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, sub)
            self.assertIn("usage:", res.stdout, sub)
        res = subprocess.run([binary("sbx"), "frobnicate"], capture_output=True, text=True)
        self.assertEqual(res.returncode, 2)
        self.assertIn("unknown command", res.stderr)
        res = subprocess.run([binary("sbx-broker"), "--bogus"], capture_output=True, text=True)
        self.assertEqual(res.returncode, 2)

    def test_up_refuses_a_bad_setting(self):
        # Each setting is checked by its kind before anything starts or is written.
        import tempfile
        d = tempfile.mkdtemp(prefix="sbxtest-badconf-")
        try:
            res = subprocess.run([binary("sbx"), "up", "--data-dir", d, "--listen",
                                  "127.0.0.1:99999"], capture_output=True, text=True, timeout=60)
            self.assertEqual(res.returncode, 2)
            self.assertIn("listen = '127.0.0.1:99999' will not do: it must be HOST:PORT",
                          res.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "sbx.conf")))  # nothing written
            with open(os.path.join(d, "sbx.conf"), "w") as f:
                f.write("vmd.capacity = lots\n")
            res = subprocess.run([binary("sbx"), "up", "--data-dir", d], capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(res.returncode, 2)
            self.assertIn("vmd.capacity = 'lots' will not do: it must be a whole number",
                          res.stderr)
        finally:
            subprocess.run(["rm", "-rf", d])

    def test_up_gives_up_on_a_daemon_that_cannot_start(self):
        # The gateway's port is taken: it fails the same way each start, so after five in
        # a row sbx up stops everything and exits non-zero, saying which daemon and why
        # (issue 18: supervision that fails fast).
        import socket
        import tempfile
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            d = tempfile.mkdtemp(prefix="sbxtest-giveup-")
            try:
                res = subprocess.run([binary("sbx"), "up", "--data-dir", d, "--listen",
                                      f"127.0.0.1:{port}"], capture_output=True, text=True,
                                     timeout=300, stdin=subprocess.DEVNULL)
                self.assertEqual(res.returncode, 1, res.stderr[-2000:])
                self.assertIn("sbx up: sbx-gateway exited with status", res.stderr)
                self.assertIn("5 times in a row before it was ready", res.stderr)
                self.assertIn(str(port), res.stderr)  # the gateway's own words: the address
                st = subprocess.run([binary("sbx"), "status", "--json", "--data-dir", d],
                                    capture_output=True, text=True, timeout=30)
                self.assertFalse(json.loads(st.stdout)["running"])
                # Nothing of it runs on: not even the template capture vmd had begun.
                left = subprocess.run(["pgrep", "-af", d], capture_output=True, text=True)
                self.assertEqual(left.stdout, "")
            finally:
                subprocess.run(["rm", "-rf", d])

    def test_status_when_not_running(self):
        s = Sbx(self, "down")
        res = s.cli("status", "--json", check=False)
        self.assertEqual(res.returncode, 1)
        import json
        st = json.loads(res.stdout)
        self.assertFalse(st["running"])
        self.assertEqual(st["daemons"], [])
        # The CLI says where it looked when the broker isn't there, at once.
        res = s.cli("key", "list", "--account", "x@y.z", check=False)
        self.assertEqual(res.returncode, 3)
        self.assertIn(f"no broker at {s.dir}/run/broker.sock", res.stderr)
        self.assertIn("(unavailable)", res.stderr)

    def test_up_accounts_keys_supervision(self):
        s = Sbx(self, "up")
        s.up("--domain", "sbx.test", "--listen", "127.0.0.1:18443")
        st = s.status()
        self.assertEqual([d["name"] for d in st["daemons"]], DAEMONS)
        for d in st["daemons"]:
            self.assertTrue(d["ready"], d)
            self.assertTrue(pid_alive(d["pid"]), d)
        self.assertEqual(st["mcp_url"], "https://sbx.test:18443/mcp")
        self.assertEqual(st["rest_url"], "https://sbx.test:18443/v1")
        self.assertEqual(st["ca_cert"], os.path.join(os.path.realpath(s.dir), "tls", "ca.crt"))
        self.assertEqual(sorted(p["role"] for p in st["peers"]),
                         ["billing", "gateway", "hooks", "snapshotd", "vmd"])
        # The first run made the admin account and printed its key, once.
        out = wait_for(lambda: "admin API key" in s.output() and s.output(), 10, "the banner")
        self.assertIn("admin account:   admin@sbx.test", out)
        self.assertIn("MCP endpoint:    https://sbx.test:18443/mcp", out)
        self.assertRegex(out, r"admin API key:   sbx_[A-Za-z0-9]{43}")

        # The gateway serves HTTPS with a certificate from the local CA it made.
        self.assertTrue(os.path.exists(st["ca_cert"]))
        status, headers, body = s.https("GET", "/healthz")
        self.assertEqual(status, 200, body)
        import json as _json
        health = _json.loads(body)
        self.assertEqual(health["status"], "ok")
        self.assertTrue(health["broker"])
        status, _, body = s.https("GET", "/nowhere")
        self.assertEqual(status, 404)
        self.assertEqual(_json.loads(body)["error"]["code"], "not_found")

        # Accounts and keys through the CLI, as JSON.
        acc = s.cli_json("account", "create", "--email", "Carol@Example.com", "--password-stdin",
                         input="correct horse battery\n")
        self.assertRegex(acc["account_id"], r"^acc_[a-z0-9]{10}$")
        self.assertEqual(acc["email"], "carol@example.com")
        self.assertRegex(acc["api_key"], r"^sbx_[A-Za-z0-9]{43}$")
        key = s.cli_json("key", "create", "--account", "carol@example.com", "--preset", "read-only",
                         "--expires", "1h", "--name", "dashboards")
        self.assertRegex(key["key_id"], r"^key_[a-z0-9]{10}$")
        self.assertRegex(key["key"], r"^sbx_")
        self.assertEqual(key["preset"], "read-only")
        self.assertIsNotNone(key["expires_at"])
        keys = s.cli_json("key", "list", "--account", acc["account_id"])["keys"]
        self.assertEqual(len(keys), 2)
        self.assertNotIn("key", keys[0])  # never the secret again
        self.assertEqual({k["preset"] for k in keys}, {"full", "read-only"})
        revoked = s.cli_json("key", "revoke", key["key_id"])
        self.assertTrue(revoked["revoked"])
        keys = s.cli_json("key", "list", "--account", "carol@example.com")["keys"]
        # (the list is REST's Key shape: GET /v1/keys)
        self.assertEqual([k["revoked"] for k in keys if k["id"] == key["key_id"]], [True])

        # Bad input: a clear message, a non-zero exit code, nothing lost.
        res = s.cli("account", "create", "--email", "CAROL@example.com", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("exists already (conflict)", res.stderr)
        res = s.cli("account", "create", "--email", "not-an-email", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("(invalid_argument)", res.stderr)
        res = s.cli("key", "create", "--account", "nobody@example.com", "--preset", "full",
                    check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("(not_found)", res.stderr)
        res = s.cli("key", "create", "--account", "carol@example.com", "--preset", "root",
                    check=False)
        self.assertEqual(res.returncode, 2)
        self.assertIn("preset must be", res.stderr)
        res = s.cli("key", "create", "--account", "carol@example.com", "--preset", "ci",
                    "--expires", "soon", check=False)
        self.assertEqual(res.returncode, 2)
        res = s.cli("account", "create", "--email", "d@example.com", "--password-stdin",
                    input="short\n", check=False)
        self.assertEqual(res.returncode, 2)
        res = s.cli("key", "revoke", "key_doesnotexi", check=False)
        self.assertIn("(not_found)", res.stderr)

        # The log has every change, in order.
        import json
        lines = [json.loads(l) for l in s.cli("tap", "--since", "0", "--once").stdout.splitlines()]
        self.assertEqual([e["seq"] for e in lines], list(range(1, len(lines) + 1)))
        types = [e["type"] for e in lines]
        self.assertIn("account.created", types)
        self.assertEqual(types.count("key.revoked"), 1)
        carol = [e for e in lines if e["type"] == "account.created" and e["email"] == "carol@example.com"]
        self.assertEqual(carol[0]["account"], acc["account_id"])
        self.assertRegex(carol[0]["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual(len(s.cli("tap", "--since", "0", "--once", "key.").stdout.splitlines()),
                         types.count("key.created") + types.count("key.revoked"))

        # A second sbx up on the same data directory is refused, and changes nothing: not
        # the --listen that sbx.conf keeps for the next start.
        with open(os.path.join(s.dir, "sbx.conf")) as f:
            conf = f.read()
        res = subprocess.run([binary("sbx"), "up", "--data-dir", s.dir, "--listen",
                              "0.0.0.0:28444"], capture_output=True, text=True, timeout=30)
        self.assertEqual(res.returncode, 1)
        self.assertIn("another sbx up is running", res.stderr)
        self.assertIn("nothing was changed", res.stderr)
        with open(os.path.join(s.dir, "sbx.conf")) as f:
            self.assertEqual(f.read(), conf)

        # Two vmds and two gateways on one broker.
        s.start("sbx-vmd", "--instance", "vmd-two")
        s.start("sbx-gateway", "--instance", "gw-two", "--set", "listen=127.0.0.1:0")
        wait_for(lambda: sorted(p["role"] for p in s.status()["peers"]).count("vmd") == 2 and
                 sorted(p["role"] for p in s.status()["peers"]).count("gateway") == 2,
                 20, "two vmds and two gateways connected")
        # vmd.templates = small (the default): on one data directory each vmd makes its
        # template in a directory of its own instance, and neither's start-up clean-up
        # touches the other's hidden guest (both complete, neither gave up).
        def vmd_logs():
            return s.log("sbx-vmd") + "".join(s.log(f[:-4]) for f in os.listdir(
                os.path.join(s.dir, "logs")) if f.startswith("sbx-vmd-extra"))

        def instances():
            done = glob.glob(os.path.join(s.dir, "templates", "*", "*-small-*", "qemu.version"))
            return sorted({p.split(os.sep)[-3] for p in done})
        wait_for(lambda: len(instances()) == 2 or "sandboxes boot cold" in vmd_logs(), 240,
                 "both vmds' small templates")
        self.assertNotIn("sandboxes boot cold", vmd_logs())
        self.assertIn("vmd-two", instances())

        # A crashed daemon is restarted with backoff; the others keep their pids.
        before = {d["name"]: d["pid"] for d in s.status()["daemons"]}
        os.kill(before["sbx-vmd"], signal.SIGKILL)
        def restarted():
            d = {d["name"]: d for d in s.status()["daemons"]}
            v = d["sbx-vmd"]
            return v["ready"] and v["pid"] != before["sbx-vmd"] and v["restarts"] == 1 and d
        after = wait_for(restarted, 30, "sbx-vmd restarted")
        for name in DAEMONS:
            if name != "sbx-vmd":
                self.assertEqual(after[name]["pid"], before[name], name)
        self.assertIn("sbx-vmd", s.output())
        self.assertRegex(s.output(), r"sbx-vmd .*killed by signal 9.*restart")

        # SIGTERM stops everything cleanly.
        pids = [d["pid"] for d in s.status()["daemons"]]
        self.assertEqual(s.stop(), 0)
        for pid in pids:
            wait_for(lambda: not pid_alive(pid), 5, f"pid {pid} gone")
        self.assertFalse(s.status()["running"])

        # Restarting keeps the data: the accounts are still there, no second admin key.
        s.up()
        keys = s.cli_json("key", "list", "--account", "carol@example.com")["keys"]
        self.assertEqual(len(keys), 2)
        out = wait_for(lambda: s.output().count("admin account:") == 2 and s.output(), 10,
                       "second banner")
        self.assertEqual(out.count("admin API key"), 1)

        # A supervisor killed outright takes its daemons with it (no orphan holding the
        # broker's lock), and the next sbx up starts cleanly.
        pids = [d["pid"] for d in s.status()["daemons"]]
        s.up_proc.kill()
        s.up_proc.wait()
        for pid in pids:
            wait_for(lambda: not pid_alive(pid), 15, f"daemon pid {pid} gone with its supervisor")
        s.up()
        self.assertEqual(len(s.cli_json("key", "list", "--account", "carol@example.com")["keys"]), 2)


if __name__ == "__main__":
    main()
