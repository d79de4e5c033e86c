"""The CLI from anywhere (issue 17): as another user (nobody) with no access to the sbx
host's data directory, `sbx login URL` saves a profile, then sandbox, snapshot, usage and
key commands go through the real gateway's REST API over HTTPS with the local CA, against
real guests: the reference prompts (python, a detached sleep polled to its end, a web
server whose public URL is fetched, the delete), argv passed exactly, stdin forwarded,
exit codes kept, files both ways, ports, an interactive terminal (a real pty on this
side: raw keys, Ctrl-C, window resizes, exit codes); operator commands say they are the
host's."""
import fcntl
import json
import os
import pty
import select
import struct
import termios
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import unittest

from sbxtest import BIN, Sbx, binary, main, wait_for

USER = "nobody"


class RemoteCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "remotecli", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]
        st = cls.s.status()
        cls.url = st["mcp_url"][:-len("/mcp")]
        # Another user's world: its own home, a copy of the binary and of the CA it can read.
        cls.home = tempfile.mkdtemp(prefix="sbxtest-remote-")
        cls.addClassCleanup(shutil.rmtree, cls.home, True)
        os.chmod(cls.home, 0o755)
        cls.sbx = os.path.join(cls.home, "sbx")
        shutil.copy(binary("sbx"), cls.sbx)
        cls.ca = os.path.join(cls.home, "ca.crt")
        shutil.copy(st["ca_cert"], cls.ca)
        os.chmod(cls.ca, 0o644)
        cls.user_home = os.path.join(cls.home, "home")
        os.mkdir(cls.user_home)
        shutil.chown(cls.user_home, USER, "nogroup")

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def run_as(self, *args, input=None, env=None, timeout=300):
        """`sbx ARGS` as the other user, in its home, as a shell of its would run it."""
        e = {"HOME": self.user_home, "PATH": "/usr/bin:/bin",
             "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", ""),
             "UBSAN_OPTIONS": os.environ.get("UBSAN_OPTIONS", "")}
        e.update(env or {})
        res = subprocess.run(["setpriv", "--reuid", USER, "--regid", "nogroup",
                              "--clear-groups", "--", self.sbx, *args],
                             cwd=self.user_home, env=e, capture_output=True, text=True,
                             timeout=timeout, input=input,
                             **({"stdin": subprocess.DEVNULL} if input is None else {}))
        print(f"$ sbx {' '.join(args)}\n{res.stdout[-1500:]}{res.stderr[-1500:]}")
        self.assertNotIn("Sanitizer", res.stderr)
        return res

    def spawn_tty(self, argv, env, rows=30, cols=100):
        """argv on a new pseudo-terminal of ours, of rows x cols: (pid, master fd)."""
        pid, fd = pty.fork()
        if pid == 0:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            os.execvpe(argv[0], argv, env)
        self.addCleanup(self.reap_tty, pid, fd)
        return pid, fd

    @staticmethod
    def reap_tty(pid, fd):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        try:
            os.close(fd)
        except OSError:
            pass

    @staticmethod
    def expect(fd, seen, pattern, timeout=60):
        """Reads the terminal until pattern shows in what came since seen[0]."""
        end = time.monotonic() + timeout
        while pattern not in seen[0]:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} not seen; the terminal showed {seen[0][-800:]!r}")
            if select.select([fd], [], [], left)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    raise AssertionError(f"{pattern!r} not seen before the end: {seen[0][-800:]!r}")
                seen[0] += data.decode("utf-8", "replace")
        at = seen[0].index(pattern) + len(pattern)
        seen[0] = seen[0][at:]

    @staticmethod
    def wait_exit(pid, fd, timeout=60):
        """The exit code, reading (and dropping) what the terminal still shows."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
        raise AssertionError("the shell did not end")

    def check_shell(self, sid):
        """sbx sandbox shell on a real terminal of ours, as the other user, remotely."""
        env = {"HOME": self.user_home, "PATH": "/usr/bin:/bin", "TERM": "xterm",
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", ""),
               "UBSAN_OPTIONS": os.environ.get("UBSAN_OPTIONS", "")}
        user = ["setpriv", "--reuid", USER, "--regid", "nogroup", "--clear-groups", "--", self.sbx]
        pid, fd = self.spawn_tty(user + ["sandbox", "shell", sid], env)
        seen = [""]
        # Its size is ours; a guest tty, a login shell.
        os.write(fd, b"tty; stty size; echo $((40+2))M\r")
        self.expect(fd, seen, "/dev/pts/")
        self.expect(fd, seen, "30 100")
        self.expect(fd, seen, "42M")
        # Our window grows: the guest's follows (SIGWINCH here, resize there).
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        for attempt in range(20):
            os.write(fd, b"stty size | sed s/^/SZ/\r")
            try:
                self.expect(fd, seen, "SZ40 120", timeout=3)
                break
            except AssertionError:
                if attempt == 19:
                    raise
        # Raw keys: Ctrl-C reaches the guest's foreground job (SIGINT), not us.
        os.write(fd, b"sleep 100; echo NOT$((1+1))\r")
        time.sleep(2)
        os.write(fd, b"\x03")
        os.write(fd, b"echo rc=$?X\r")
        self.expect(fd, seen, "rc=130X", timeout=30)
        self.assertNotIn("NOT2", seen[0])
        # The guest's exit code is ours.
        os.write(fd, b"exit 3\r")
        self.assertEqual(self.wait_exit(pid, fd), 3)
        # Not a terminal here: piped keys, output, the code.
        res = subprocess.run(user + ["sandbox", "shell", sid], input="echo piped$((6*7))\nexit 5\n",
                             env=env, cwd=self.user_home, capture_output=True, text=True,
                             timeout=120)
        print(res.stdout[-500:], res.stderr[-500:])
        self.assertIn("piped42", res.stdout)
        self.assertEqual(res.returncode, 5, res.stderr)
        # A command instead of the shell; a client killed outright takes its process along.
        pid, fd = self.spawn_tty(user + ["sandbox", "shell", sid, "--", "sleep", "321"], env)

        def running():
            ps = json.loads(self.ok("sandbox", "ps", sid, "--json"))["processes"]
            p = [x for x in ps if "sleep" in x["command"] and "321" in x["command"]]
            return p[-1] if p and p[-1]["running"] else time.sleep(0.5)
        wait_for(running, 60, "the terminal's command to run")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

        def ended():
            ps = json.loads(self.ok("sandbox", "ps", sid, "--json"))["processes"]
            p = [x for x in ps if "sleep" in x["command"] and "321" in x["command"]][-1]
            return p if not p["running"] else time.sleep(0.5)
        self.assertEqual(wait_for(ended, 60, "the abandoned terminal's command killed")["signal"], 9)
        # On the sbx host, as its operator, through the broker: the same terminal.
        pid, fd = self.spawn_tty([binary("sbx"), "sandbox", "shell", sid, "--data-dir", self.s.dir,
                                  "--", "sh", "-c", "read x; echo got:$x; stty size; exit 4"],
                                 dict(os.environ, TERM="xterm"), rows=20, cols=70)
        seen = [""]
        os.write(fd, b"hello\r")
        self.expect(fd, seen, "got:hello")
        self.expect(fd, seen, "20 70")
        self.assertEqual(self.wait_exit(pid, fd), 4)
        # A plain GET is told what the route is.
        res = subprocess.run(["curl", "-s", "--cacert", self.ca, "-H", f"Authorization: Bearer {self.key}",
                              f"{self.url}/v1/sandboxes/{sid}/terminal"],
                             capture_output=True, text=True, timeout=60)
        self.assertIn("this route is a WebSocket", res.stdout)

    def ok(self, *args, **kw):
        res = self.run_as(*args, **kw)
        self.assertEqual(res.returncode, 0, res.stderr)
        return res.stdout

    def test_remote_cli(self):
        # Before login: no profile, and the host's data directory is not this user's.
        res = self.run_as("sandbox", "list", "--data-dir", self.s.dir, timeout=20)
        self.assertNotEqual(res.returncode, 0)
        self.assertRegex(res.stderr, r"cannot use the broker's socket|cannot read|Permission")
        # login: the key on stdin, checked before anything is saved; the profile is 0600.
        res = self.run_as("login", self.url, input=self.key + "\n")
        self.assertEqual(res.returncode, 3)  # the local CA is not one the system trusts
        self.assertIn("certificate", res.stderr)
        res = self.run_as("login", self.url, "--ca-cert", self.ca, input="sbx_wrong\n")
        self.assertEqual(res.returncode, 1)
        self.assertIn("refused the API key", res.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.user_home, ".config")))
        out = self.ok("login", self.url, "--ca-cert", self.ca, input=self.key + "\n")
        self.assertIn(f"logged in to {self.url} as account acc_", out)
        profile = os.path.join(self.user_home, ".config", "sbx", "profile.json")
        st = os.stat(profile)
        self.assertEqual((stat.S_IMODE(st.st_mode), st.st_uid), (0o600, 65534))
        with open(profile) as f:
            self.assertEqual(json.load(f)["url"], self.url)

        # The reference prompts, through the profile alone.
        sb = json.loads(self.ok("sandbox", "create", "--name", "remote", "--json"))
        self.assertEqual((sb["name"], sb["state"]), ("remote", "ready"))
        self.assertNotIn("account", sb)  # what only the host's operator sees
        sid = sb["id"]
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "python3 -c 'print(2**100)'"),
                         "1267650600228229401496703205376\n")
        out = self.ok("sandbox", "exec", sid, "--detach", "--", "sleep 30; echo done")
        pid = int(out.split()[-1])

        def ended():
            st = json.loads(self.ok("sandbox", "status", sid, str(pid)))
            return st if not st["running"] else time.sleep(2)
        st = wait_for(ended, 120, "the detached sleep to end")
        self.assertEqual((st["exitCode"], st["stdout"]), (0, "done\n"))
        self.ok("sandbox", "exec", sid, "--detach", "--", "cd /tmp && python3 -m http.server 8000")
        self.ok("sandbox", "exec", sid, "--", "for i in $(seq 120); do curl -s -o /dev/null "
                "localhost:8000 && exit 0; sleep 0.5; done; exit 1")
        out = self.ok("sandbox", "port", sid, "8000", "--public")
        url = out.split()[0]
        self.assertTrue(url.startswith("https://") and "-8000." in url, out)
        host = url.split("//")[1].split(":")[0]
        page = subprocess.run(["curl", "-s", "--cacert", self.ca, "--resolve",
                               f"{host}:{self.s.listen_port()}:127.0.0.1", url],
                              capture_output=True, text=True, timeout=60)
        self.assertIn("Directory listing", page.stdout, page.stderr)

        # argv exactly, stdin, exit codes.
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "sh", "-c", 'echo "$0 $HOME"'),
                         "sh /root\n")
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "python3", "-c",
                                 "import sys; print(sys.argv[1:])", "a b", "c'd", "$HOME"),
                         "['a b', \"c'd\", '$HOME']\n")
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "wc", "-l", input="x\ny\n"),
                         "2\n")
        res = self.run_as("sandbox", "exec", sid, "--", "echo oops >&2; exit 7")
        self.assertEqual((res.returncode, res.stderr), (7, "oops\n"))
        # Output streams while the command runs: it waits for a file that only exists once
        # its first line has reached this side, so it ends only if that line came first.
        proc = subprocess.Popen(
            ["setpriv", "--reuid", USER, "--regid", "nogroup", "--clear-groups", "--", self.sbx,
             "sandbox", "exec", sid, "--", "echo ready; while [ ! -e /tmp/go ]; do sleep 0.2; "
             "done; echo after >&2; exit 5"],
            cwd=self.user_home, env={"HOME": self.user_home, "PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(proc.stdout.readline(), "ready\n")
            self.ok("sandbox", "exec", sid, "--", "touch /tmp/go")
            self.assertEqual(proc.wait(timeout=60), 5)
            self.assertEqual(proc.stderr.read(), "after\n")
        finally:
            proc.kill()
            proc.wait()
        # Ctrl-C ends the command in the guest too.
        proc = subprocess.Popen(
            ["setpriv", "--reuid", USER, "--regid", "nogroup", "--clear-groups", "--", self.sbx,
             "sandbox", "exec", sid, "--", "echo started; sleep 600"],
            cwd=self.user_home, env={"HOME": self.user_home, "PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(proc.stdout.readline(), "started\n")
        proc.send_signal(signal.SIGINT)
        self.assertEqual(proc.wait(timeout=60), 130)

        def killed():
            ps = json.loads(self.ok("sandbox", "ps", sid, "--json"))["processes"]
            p = [x for x in ps if x["command"] == "echo started; sleep 600"][-1]
            return p if not p["running"] else time.sleep(0.5)
        self.assertEqual(wait_for(killed, 60, "the interrupted command killed")["signal"], 9)
        # Files both ways, and the processes.
        blob = "".join(chr(0x41 + i % 26) for i in range(300000)) + "\n"
        self.assertIn("wrote 300001 bytes", self.ok("sandbox", "write", sid, "/root/b.txt",
                                                    input=blob))
        self.assertEqual(self.ok("sandbox", "read", sid, "/root/b.txt"), blob)
        # cp: a directory (a nested file, a mode, a link) up and back, and one file.
        src = os.path.join(self.user_home, "proj")
        os.makedirs(os.path.join(src, "sub"))
        with open(os.path.join(src, "run.sh"), "w") as f:
            f.write("#!/bin/sh\necho run\n")
        os.chmod(os.path.join(src, "run.sh"), 0o750)
        with open(os.path.join(src, "sub", "data.bin"), "wb") as f:
            f.write(bytes(range(256)) * 100)
        os.symlink("run.sh", os.path.join(src, "start"))
        os.makedirs(os.path.join(src, "empty", "deeper"))
        os.chmod(os.path.join(src, "empty"), 0o700)
        subprocess.run(["chown", "-R", f"{USER}:nogroup", src], check=True)
        self.assertIn("(2 files, 25619 bytes)",
                      self.ok("sandbox", "cp", "proj", f"{sid}:/root/proj"))
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "cd /root/proj && ./start && "
                                 "stat -c %a run.sh && readlink start && wc -c < sub/data.bin && "
                                 "stat -c %a empty && test -d empty/deeper && echo dirs"),
                         "run\n750\nrun.sh\n25600\n700\ndirs\n")
        self.assertIn("(2 files)", self.ok("sandbox", "cp", f"{sid}:/root/proj", "back"))
        back = os.path.join(self.user_home, "back")
        self.assertEqual(os.readlink(os.path.join(back, "start")), "run.sh")
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(back, "run.sh")).st_mode), 0o750)
        with open(os.path.join(back, "sub", "data.bin"), "rb") as f:
            self.assertEqual(f.read(), bytes(range(256)) * 100)
        self.ok("sandbox", "cp", "proj/run.sh", f"{sid}:/tmp/")
        self.assertEqual(self.ok("sandbox", "exec", sid, "--", "sh /tmp/run.sh"), "run\n")
        res = self.run_as("sandbox", "cp", f"{sid}:/nonexistent", "x")
        self.assertEqual(res.returncode, 1)
        self.assertIn("no file or directory /nonexistent", res.stderr)
        ps = json.loads(self.ok("sandbox", "ps", sid, "--json"))["processes"]
        self.assertIn("sleep 30; echo done", [p["command"] for p in ps])
        self.check_shell(sid)
        # Snapshots, usage and keys are the key's account's.
        self.assertEqual(json.loads(self.ok("snapshot", "list", "--json")), {"snapshots": []})
        usage = json.loads(self.ok("usage", "--json"))
        self.assertTrue(usage["accountId"].startswith("acc_"))
        self.assertIn(sid, [x["id"] for x in usage["sandboxes"]])
        keys = json.loads(self.ok("key", "list", "--json"))["keys"]
        self.assertEqual(len(keys), 1)
        # Operator commands are the host's, and say so at once.
        for args in (("account", "create", "--email", "x@example.com"),
                     ("key", "create", "--account", "x", "--preset", "full"),
                     ("sandbox", "list", "--account", "x")):
            res = self.run_as(*args, timeout=20)
            self.assertEqual(res.returncode, 2, args)
            self.assertRegex(res.stderr, "operator's")
        # The environment overrides the profile.
        res = self.run_as("sandbox", "list", env={"SBX_API_KEY": "sbx_nope"})
        self.assertEqual(res.returncode, 1)
        self.assertIn("refused the API key", res.stderr)
        # sbx mcp uses the profile too.
        lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "0"}}},
                 {"jsonrpc": "2.0", "method": "notifications/initialized"},
                 {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                  "params": {"name": "get_sandbox", "arguments": {"sandboxId": sid}}}]
        out = self.ok("mcp", input="".join(json.dumps(x) + "\n" for x in lines))
        answers = [json.loads(x) for x in out.splitlines()]
        self.assertEqual(answers[-1]["result"]["structuredContent"]["id"], sid)
        # The delete, then not_found; logout forgets the profile.
        self.assertEqual(json.loads(self.ok("sandbox", "delete", sid, "--json"))["state"],
                         "deleted")
        res = self.run_as("sandbox", "get", sid)
        self.assertEqual(res.returncode, 1)
        self.assertIn("not_found", res.stderr)
        self.ok("logout")
        self.assertFalse(os.path.exists(profile))


if __name__ == "__main__":
    main()
