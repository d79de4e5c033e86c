"""systemd (issue 18 item 1): the units of packaging/systemd/ as scripts/install-systemd.sh
installs them, checked by systemd-analyze verify; sd_notify readiness from the real
daemons over a real datagram socket (this test plays systemd's part); and `sbx down`
against a real `sbx up` with one running guest: afterwards nothing of that data directory
runs, and after the next `sbx up` the sandbox resumes with its memory. Then `sbx down
--now` ends a running guest outright, and the next start records it as error.

(Machines whose PID 1 is systemd can run the units themselves; docs/operations.md says
what to run. This test needs only systemd-analyze.)"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from sbxtest import BIN, Sbx, binary, main, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INSTALL = os.path.join(REPO, "scripts", "install-systemd.sh")
DAEMONS = ["sbx-broker", "sbx-vmd", "sbx-snapshotd", "sbx-billing", "sbx-hookd", "sbx-gateway"]
ADMIN = "admin@localhost"


def read_unit(path):
    """A unit file as {section: [(key, value), ...]} (keys repeat: Wants=, ...)."""
    sections, current = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), [])
            else:
                key, value = line.split("=", 1)
                current.append((key, value))
    return sections


def values(unit, section, key):
    return [v for k, v in unit.get(section, []) if k == key]


def words(unit, section, key):
    return [w for v in values(unit, section, key) for w in v.split()]


def processes_of(directory):
    """Every process whose command line names the data directory (daemons, QEMU)."""
    res = subprocess.run(["pgrep", "-a", "-f", f"{directory}(/| |$)"], capture_output=True,
                         text=True)
    me = os.getpid()
    return [line for line in res.stdout.splitlines()
            if int(line.split()[0]) != me and "pgrep" not in line]


class SystemdTest(unittest.TestCase):
    def install(self, *args):
        return subprocess.run([INSTALL, *args], capture_output=True, text=True, timeout=60)

    def test_units(self):
        work = tempfile.mkdtemp(prefix="sbxtest-units-")
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        units, data = os.path.join(work, "units"), os.path.join(work, "data")
        res = self.install("--bin-dir", os.path.realpath(BIN), "--data-dir", data,
                           "--unit-dir", units, "--no-reload")
        self.assertEqual(res.returncode, 0, res.stderr)
        names = sorted(os.listdir(units))
        self.assertEqual(names, sorted([f"{d}.service" for d in DAEMONS] +
                                       ["sbx-guests.service", "sbx.target"]))
        paths = [os.path.join(units, n) for n in names]

        # systemd's own check, every warning counted: unknown keys, bad values, missing
        # executables, ordering cycles.
        verify = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths],
                                capture_output=True, text=True, timeout=60)
        print(f"\nsystemd-analyze verify: rc {verify.returncode}, "
              f"output {verify.stdout + verify.stderr!r}")
        self.assertEqual(verify.returncode, 0, verify.stderr)
        self.assertEqual(verify.stdout + verify.stderr, "")
        # ... and it does catch a fault: one unknown key is reported.
        broken = os.path.join(work, "broken")
        os.mkdir(broken)
        shutil.copy(os.path.join(units, "sbx-vmd.service"), broken)
        with open(os.path.join(broken, "sbx-vmd.service"), "a") as f:
            f.write("KilMode=process\n")
        res = subprocess.run(["systemd-analyze", "verify", "--man=no",
                              os.path.join(broken, "sbx-vmd.service")],
                             capture_output=True, text=True, timeout=60)
        self.assertIn("Unknown key 'KilMode'", res.stdout + res.stderr)

        unit = {n: read_unit(os.path.join(units, n)) for n in names}
        for d in DAEMONS:
            u = unit[f"{d}.service"]
            self.assertEqual(values(u, "Service", "Type"), ["notify"], d)
            self.assertEqual(values(u, "Service", "Restart"), ["on-failure"], d)
            self.assertEqual(values(u, "Unit", "PartOf"), ["sbx.target"], d)
            self.assertEqual(values(u, "Service", "NoNewPrivileges"), ["yes"], d)
            self.assertEqual(values(u, "Service", "ProtectSystem"), ["strict"], d)
            self.assertEqual(values(u, "Service", "ReadWritePaths"), [data], d)
            self.assertEqual(values(u, "Service", "ExecStart"),
                             [f"{os.path.realpath(BIN)}/{d} --data-dir {data}"], d)
            self.assertTrue(values(u, "Unit", "StartLimitBurst"), d)
            if d != "sbx-broker":
                self.assertIn("sbx-broker.service", words(u, "Unit", "After"), d)
                # Wants, not Requires: a broker restart must not restart the workers.
                self.assertEqual(values(u, "Unit", "Requires"), [], d)
        # Guests outlive vmd, template builds their gateway: only the main process is
        # stopped; the others keep systemd's default (the whole control group).
        for d in DAEMONS:
            self.assertEqual(values(unit[f"{d}.service"], "Service", "KillMode"),
                             ["process"] if d in ("sbx-vmd", "sbx-gateway") else [], d)
        # QEMU runs in vmd's namespaces: nothing that would break it.
        vmd = unit["sbx-vmd.service"]
        self.assertEqual(values(vmd, "Service", "PrivateTmp"), [])
        self.assertEqual(values(vmd, "Service", "MemoryDenyWriteExecute"), [])
        self.assertIn("/dev/kvm rw", values(vmd, "Service", "DeviceAllow"))
        # The full stop: sbx.target pulls in every unit; the guests' unit stops them
        # between the gateway's stop and vmd's, and only Wants vmd (a restart of vmd
        # leaves it, and so the guests, alone).
        target = unit["sbx.target"]
        self.assertEqual(sorted(w for w in words(target, "Unit", "Wants") if w.startswith("sbx")),
                         sorted(f"{d}.service" for d in DAEMONS + ["sbx-guests"]))
        self.assertEqual(values(target, "Install", "WantedBy"), ["multi-user.target"])
        guests = unit["sbx-guests.service"]
        self.assertEqual(values(guests, "Service", "Type"), ["oneshot"])
        self.assertEqual(values(guests, "Service", "RemainAfterExit"), ["yes"])
        self.assertEqual(values(guests, "Service", "ExecStop"),
                         [f"{os.path.realpath(BIN)}/sbx down --guests --data-dir {data} "
                          "--timeout 90"])
        self.assertEqual(values(guests, "Unit", "Requires"), [])
        self.assertIn("sbx-vmd.service", words(guests, "Unit", "After"))
        self.assertIn("sbx-gateway.service", words(guests, "Unit", "Before"))
        self.assertEqual(values(guests, "Unit", "PartOf"), ["sbx.target"])

        # The install command refuses what systemd could not take, and says so.
        res = self.install("--data-dir", "var/lib/sbx", "--unit-dir", units, "--no-reload")
        self.assertEqual(res.returncode, 2)
        self.assertIn("--data-dir must be an absolute path", res.stderr)
        res = self.install("--bin-dir", work, "--unit-dir", units, "--no-reload")
        self.assertEqual(res.returncode, 1)
        self.assertIn(f"{work}/sbx is missing", res.stderr)

    def notify_socket(self, directory):
        path = os.path.join(directory, "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(30)
        self.addCleanup(sock.close)
        return sock, path

    def test_notify(self):
        """The daemons as systemd's Type=notify starts them: NOTIFY_SOCKET, no sbx up."""
        s = Sbx(self, "notify")
        os.makedirs(os.path.join(s.dir, "logs"))
        sock, path = self.notify_socket(s.dir)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        env.pop("SBX_READY_FD", None)
        procs = []
        for name in ("sbx-broker", "sbx-billing"):
            log = open(os.path.join(s.dir, "logs", f"{name}.log"), "ab")
            proc = subprocess.Popen([binary(name), "--data-dir", s.dir], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            s.extra.append(proc)
            procs.append(proc)
            t0 = time.monotonic()
            message, _ = sock.recvfrom(4096)
            print(f"\n{name}: {message!r} after {time.monotonic() - t0:.2f}s")
            self.assertEqual(message, b"READY=1", s.log(name))
            # Ready means serving: the broker answers the CLI now.
            if name == "sbx-broker":
                res = s.cli("account", "list", "--json")
                self.assertEqual(res.returncode, 0, res.stderr)
        # A stop says STOPPING=1, then the daemon exits 0 (billing first, as systemd
        # stops them in reverse order).
        for proc, name in reversed(list(zip(procs, ("sbx-broker", "sbx-billing")))):
            proc.send_signal(signal.SIGTERM)
            message, _ = sock.recvfrom(4096)
            self.assertEqual(message, b"STOPPING=1", name)
            self.assertEqual(proc.wait(30), 0, s.log(name))

    def test_down(self):
        s = Sbx(self, "down", settings={"vmd.templates": ""})
        directory = os.path.realpath(s.dir)
        s.up()
        sb = s.cli_json("sandbox", "create", "--account", ADMIN, "--name", "kept", timeout=300)
        sid = sb["id"]
        res = s.cli("sandbox", "exec", sid, "--json", "--detach", "--", "sleep 100000")
        sleeper = json.loads(res.stdout)["processId"]
        self.assertTrue(any("qemu-system" in p for p in processes_of(directory)))

        t0 = time.monotonic()
        res = s.cli("down", timeout=180, check=False)
        print(f"\nsbx down: rc {res.returncode} in {time.monotonic() - t0:.1f}s\n"
              f"{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn(f"stopped {sid} ({sb['label']}): memory kept", res.stdout)
        self.assertIn("sbx is down: 1 sandbox(es) stopped with their memory, 0 QEMU killed",
                      res.stdout)
        # sbx up ended (exit 0, as on Ctrl-C) and nothing of this data directory runs.
        self.assertEqual(s.up_proc.wait(5), 0, s.output())
        s.up_proc = None
        self.assertEqual(processes_of(directory), [])
        self.assertFalse(s.status()["running"])
        # Again: nothing to do, said so, still success.
        res = s.cli("down", timeout=60, check=False)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("no sbx up runs for", res.stdout)

        # The next start finds the sandbox stopped; it resumes with its memory.
        s.up()
        self.assertEqual(s.cli_json("sandbox", "get", sid)["state"], "stopped")
        self.assertEqual(s.cli_json("sandbox", "resume", sid, timeout=300)["state"], "ready")
        st = s.cli_json("sandbox", "status", sid, str(sleeper))
        self.assertTrue(st["running"], st)

        # --now: no stop one by one; the daemons end, then the running QEMU is killed.
        res = s.cli("down", "--now", timeout=180, check=False)
        print(f"sbx down --now: rc {res.returncode}\n{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertRegex(res.stdout, r"killed QEMU pid \d+")
        s.up_proc.wait(5)
        s.up_proc = None
        self.assertEqual(processes_of(directory), [])
        # vmd finds the guest gone and says so; the broker records the sandbox as error.
        s.up()
        box = wait_for(lambda: (lambda b: b if b["state"] == "error" else None)(
            s.cli_json("sandbox", "get", sid)), 30, "the killed sandbox in error")
        print(f"after --now: {box['state']}")
        res = s.cli("down", "--guests", timeout=60, check=False)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("guests stopped: 0 sandbox(es)", res.stdout)
        self.assertTrue(s.status()["running"])  # --guests leaves the daemons running

    def test_down_usage(self):
        res = subprocess.run([binary("sbx"), "down", "--timeout", "soon"], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(res.returncode, 2)
        self.assertIn("--timeout takes whole seconds", res.stderr)
        self.assertIn("invalid_argument", res.stderr)
        res = subprocess.run([binary("sbx"), "down", "--help"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(res.returncode, 0)
        self.assertIn("usage: sbx down", res.stdout)


if __name__ == "__main__":
    main()
