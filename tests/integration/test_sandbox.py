"""Real sandboxes end to end (issue 3): sbx up with the real broker and vmd, QEMU microvm
guests booted from the built image under TCG (no skipping without /dev/kvm), the guest
agent answering through virtio-serial. Everything goes through `sbx sandbox`."""
import hashlib
import json
import os
import signal
import subprocess
import time
import unittest

from sbxtest import Sbx, binary, main, wait_for

ADMIN = "admin@localhost"


def qemu_pids(s, sandbox_id):
    """QEMU processes of one sandbox: their command line names its directory. (Only QEMU:
    right after a stop, vmd's copy for the automatic snapshot names the directory too.)"""
    res = subprocess.run(["pgrep", "-f", f"qemu-system.*{os.path.realpath(s.dir)}/vms/"
                                         f"{sandbox_id}/"],
                         capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()]


class SandboxTest(unittest.TestCase):
    def exec(self, s, sid, command, *opts, check=True):
        res = s.cli("sandbox", "exec", sid, "--json", *opts, "--", command, check=check,
                    timeout=300)
        return json.loads(res.stdout) if res.returncode == 0 else res

    def status(self, s, sid, pid, out=0, err=0):
        return s.cli_json("sandbox", "status", sid, str(pid), "--stdout-offset", str(out),
                          "--stderr-offset", str(err))

    def test_lifecycle(self):
        s = Sbx(self, "sandbox")
        s.up()
        t0 = time.monotonic()
        sb = s.cli_json("sandbox", "create", "--account", ADMIN, "--name", "demo",
                        "--deny-out", "2001:DB8::1/32", "--deny-out", "198.51.100.0/24",
                        timeout=300)
        print(f"\ncreate → ready: {time.monotonic() - t0:.1f}s")
        sid = sb["id"]
        # An operator's list of one account (by email), or of every account's.
        mine = s.cli_json("sandbox", "list", "--account", ADMIN)["sandboxes"]
        self.assertEqual([x["id"] for x in mine], [sid])
        res = s.cli("sandbox", "list", "--account", "nobody@example.com", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("no account 'nobody@example.com'", res.stderr)
        self.assertRegex(sid, r"^sb_[a-z0-9]{10}$")
        self.assertEqual(sb["state"], "ready")
        self.assertEqual(sb["name"], "demo")
        self.assertEqual(sb["egress"], {"allow": [], "deny": ["2001:db8::/32", "198.51.100.0/24"]})

        # Foreground exec: the guest's python, the sandbox's hostname.
        r = self.exec(s, sid, "python3 -c 'print(2**100)'")
        self.assertEqual(r["exitCode"], 0)
        self.assertEqual(r["stdout"], "1267650600228229401496703205376\n")
        r = self.exec(s, sid, "hostname")
        self.assertEqual(r["stdout"].strip(), sb["label"])
        r = self.exec(s, sid, "echo out; echo err >&2; exit 3")
        self.assertEqual((r["exitCode"], r["stdout"], r["stderr"]), (3, "out\n", "err\n"))
        # Without --json, sbx passes the output through and exits with the command's code.
        res = s.cli("sandbox", "exec", sid, "--", "echo plain; exit 7", check=False)
        self.assertEqual((res.returncode, res.stdout), (7, "plain\n"))

        # Detached: running, then exit 0 with "done"; offsets give only new output.
        r = self.exec(s, sid, "sleep 3; echo done", "--detach")
        self.assertTrue(r["running"])
        pid = r["processId"]
        st = self.status(s, sid, pid)
        self.assertTrue(st["running"])
        st = wait_for(lambda: (lambda x: not x["running"] and x)(self.status(s, sid, pid)), 60,
                      "the detached command to end")
        self.assertEqual((st["exitCode"], st["stdout"]), (0, "done\n"))
        r = self.exec(s, sid, "for i in 1 2 3 4; do echo line$i; sleep 1; done", "--detach")
        pid, seen, offset = r["processId"], "", 0
        for _ in range(200):
            st = self.status(s, sid, pid, out=offset)
            seen += st["stdout"]
            self.assertGreaterEqual(st["stdoutNextOffset"], offset)
            offset = st["stdoutNextOffset"]
            if not st["running"]:
                break
            time.sleep(0.3)
        self.assertEqual(seen, "line1\nline2\nline3\nline4\n")  # each byte exactly once
        listed = s.cli_json("sandbox", "ps", sid)["processes"]
        self.assertEqual([(p["processId"], p["running"], p["exitCode"]) for p in listed][-1:],
                         [(pid, False, 0)])
        table = s.cli("sandbox", "ps", sid).stdout.splitlines()
        self.assertEqual(table[0].split(), ["PID", "STATE", "KIND", "COMMAND"])
        self.assertIn(f"{pid:<8} exit 0     detached   for i in 1 2 3 4; do echo line$i; sleep 1; "
                      "done", table)

        # A 1 MiB random file round-trips byte for byte.
        data = os.urandom(1024 * 1024)
        res = subprocess.run([binary("sbx"), "sandbox", "write", sid, "/root/dir/random.bin",
                              "--data-dir", s.dir], input=data, capture_output=True, timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        res = subprocess.run([binary("sbx"), "sandbox", "read", sid, "/root/dir/random.bin",
                              "--data-dir", s.dir], capture_output=True, timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(hashlib.sha256(res.stdout).hexdigest(), hashlib.sha256(data).hexdigest())
        r = self.exec(s, sid, "sha256sum /root/dir/random.bin")
        self.assertEqual(r["stdout"].split()[0], hashlib.sha256(data).hexdigest())

        # Stop keeps memory: a process started before it still runs after the resume,
        # a written file is still there, and nothing of the guest runs while stopped.
        sleeper = self.exec(s, sid, "sleep 100000", "--detach")["processId"]
        self.exec(s, sid, "echo kept > /root/keep.txt")
        t0 = time.monotonic()
        self.assertEqual(s.cli_json("sandbox", "stop", sid, timeout=300)["state"], "stopped")
        print(f"stop: {time.monotonic() - t0:.1f}s")
        self.assertEqual(qemu_pids(s, sid), [])
        res = s.cli("sandbox", "exec", sid, "--", "true", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("resume it first", res.stderr)
        # Egress rules of the stopped sandbox: update replaces both lists; get shows them;
        # a bad entry is refused naming it; --no-egress clears them.
        sb = s.cli_json("sandbox", "update", sid, "--allow-out", "192.0.2.0/24", "--allow-out",
                        "203.0.113.7")
        self.assertEqual(sb["egress"], {"allow": ["192.0.2.0/24", "203.0.113.7/32"], "deny": []})
        line = s.cli("sandbox", "get", sid).stdout
        self.assertIn("allow-out 192.0.2.0/24,203.0.113.7/32", line)
        res = s.cli("sandbox", "update", sid, "--deny-out", "a..b", check=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn('egress.deny[0] ("a..b"): a domain name has no empty label', res.stderr)
        self.assertEqual(s.cli_json("sandbox", "update", sid, "--no-egress")["egress"],
                         {"allow": [], "deny": []})
        t0 = time.monotonic()
        self.assertEqual(s.cli_json("sandbox", "resume", sid, timeout=300)["state"], "ready")
        print(f"resume: {time.monotonic() - t0:.1f}s")
        self.assertTrue(self.status(s, sid, sleeper)["running"])
        self.assertEqual(self.exec(s, sid, "cat /root/keep.txt")["stdout"], "kept\n")
        guest_now = int(self.exec(s, sid, "date +%s")["stdout"])
        self.assertLess(abs(guest_now - time.time()), 10)  # the clock was set on resume

        # kill -9 vmd: the supervisor restarts it, it re-adopts the running guest.
        vmd = s.daemon_pid("sbx-vmd")
        os.kill(vmd, signal.SIGKILL)
        wait_for(lambda: s.daemon_pid("sbx-vmd") not in (None, vmd) and
                 all(d["ready"] for d in s.status()["daemons"]), 60, "vmd restarted")
        r = wait_for(lambda: (lambda x: isinstance(x, dict) and x)(
            self.exec(s, sid, "cat /root/keep.txt", check=False)), 60, "the re-adopted guest")
        self.assertEqual(r["stdout"], "kept\n")
        self.assertTrue(self.status(s, sid, sleeper)["running"])

        # Delete: the sandbox and every file of it are gone.
        self.assertEqual(s.cli_json("sandbox", "delete", sid, timeout=120)["state"], "deleted")
        self.assertFalse(os.path.exists(os.path.join(s.dir, "vms", sid)))
        self.assertEqual(qemu_pids(s, sid), [])
        res = s.cli("sandbox", "get", sid, check=False)
        self.assertIn("Sandbox not found (not_found)", res.stderr)

    def test_ttl_expires_on_time(self):
        s = Sbx(self, "ttl")
        s.up()
        # The deadline counts from the create request: 60 s, REST's (and so the CLI's)
        # least ttlSeconds, also leaves a loaded, sanitized host time to boot the guest
        # before it (4 s did not, and the audit rightly said the stop came late).
        sb = s.cli_json("sandbox", "create", "--account", ADMIN, "--ttl", "60s", timeout=300)
        self.assertIsNotNone(sb["expiresAt"])
        stopped = wait_for(lambda: (lambda x: x["state"] == "stopped" and x)(
            s.cli_json("sandbox", "get", sb["id"])), 150, "the TTL stop")
        self.assertEqual(stopped["reason"], "TTL expired")
        self.assertEqual(qemu_pids(s, sb["id"]), [])
        res = s.cli("audit", "ttl", "--json", check=False)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        audit = json.loads(res.stdout)
        self.assertTrue(audit["ok"], audit)
        self.assertEqual([e["sandbox"] for e in audit["expiries"]], [sb["id"]])
        self.assertLess(audit["expiries"][0]["late_ms"], 1000)
        self.assertEqual(audit["missed"], [])
        # Extend gives it a new deadline from now; resume runs it again.
        s.cli_json("sandbox", "resume", sb["id"], timeout=300)
        self.assertEqual(s.cli_json("sandbox", "get", sb["id"])["state"], "ready")

    def test_guest_death_is_reported(self):
        s = Sbx(self, "death")
        s.up()
        sid = s.cli_json("sandbox", "create", "--account", ADMIN, timeout=300)["id"]
        pids = qemu_pids(s, sid)
        self.assertEqual(len(pids), 1)
        os.kill(pids[0], signal.SIGKILL)
        sb = wait_for(lambda: (lambda x: x["state"] == "error" and x)(
            s.cli_json("sandbox", "get", sid)), 30, "the sandbox in error")
        self.assertTrue(sb["reason"])
        log = [json.loads(l) for l in s.cli("tap", "--since", "0", "--once", "sandbox.").stdout.splitlines()]
        self.assertEqual([e["to"] for e in log if e["subject"] == sid][-1], "error")
        self.assertEqual(s.cli_json("sandbox", "delete", sid, timeout=120)["state"], "deleted")
        self.assertFalse(os.path.exists(os.path.join(s.dir, "vms", sid)))


if __name__ == "__main__":
    main()
