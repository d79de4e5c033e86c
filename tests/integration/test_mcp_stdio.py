"""`sbx mcp`, the stdio MCP server, end to end: the official TypeScript SDK's
StdioClientTransport launches the real `sbx mcp` as a local client does (command, args,
env: SBX_URL, SBX_API_KEY, SBX_CA_CERT), which forwards to the real gateway of `sbx up`
over HTTPS with the local CA, with real guests behind it."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

from npmwork import place
from sbxtest import BIN, HERE, Sbx, binary, free_port, install_sdk, main, mcp_post

NAMES = ["create_sandbox", "list_sandboxes", "get_sandbox", "get_sandbox_metrics", "exec",
         "command_status", "kill_command", "list_commands", "read_file", "write_file", "host_port",
         "stop_sandbox",
         "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox",
         "delete_sandbox", "save_snapshot", "list_snapshots", "delete_snapshot",
         "set_sandbox_egress", "fork_sandbox"]


class McpStdioTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "mcpstdio", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]
        st = cls.s.status()
        cls.mcp_url, cls.ca = st["mcp_url"], st["ca_cert"]
        cls.base_url = cls.mcp_url[:-len("/mcp")]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="sbxtest-stdio-work-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def client(self, cwd, *calls, url=None, key=None):
        """Runs mcp_stdio_client.mjs in cwd, launching `sbx mcp` as a client's config says:
        {"command": ".../sbx", "args": ["mcp"], "env": {SBX_URL, SBX_API_KEY, SBX_CA_CERT}}.
        Returns its steps by name (calls as a list)."""
        work = install_sdk(self)
        place(os.path.join(HERE, "mcp_stdio_client.mjs"), work)
        env = dict(os.environ, SBX_URL=url or self.base_url, SBX_API_KEY=key or self.key,
                   SBX_CA_CERT=self.ca, SBX_TEST_CALLS=json.dumps(list(calls)))
        res = subprocess.run([shutil.which("node"), os.path.join(work, "mcp_stdio_client.mjs"),
                              cwd, binary("sbx"), "mcp"], capture_output=True, text=True,
                             timeout=600, env=env)
        print("\nstdio client:\n" + res.stdout[-6000:] + res.stderr[-3000:])
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        steps = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        self.assertEqual(steps[-1]["step"], "done")
        out = {"calls": []}
        for step in steps:
            if step["step"] == "call":
                out["calls"].append(step)
            else:
                out[step["step"]] = step
        # The server's stderr: its log, and never a sanitizer's report.
        self.assertNotIn("Sanitizer", out["stderr"]["text"])
        self.assertNotIn("runtime error", out["stderr"]["text"])
        return out

    @staticmethod
    def text(call):
        return call["result"]["content"][0]["text"]

    def test_tools_exec_handoff_and_shutdown(self):
        work = self.tmpdir()
        os.makedirs(os.path.join(work, "src"))
        files = {"README.md": "# project\n", "src/main.py": "print('hello from the handoff')\n",
                 ".gitignore": "*.log\nbuild/\n", "notes.txt": "untracked but kept\n",
                 "debug.log": "ignored\n", "build/out.bin": "ignored too\n"}
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(work, name)), exist_ok=True)
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        os.chmod(os.path.join(work, "src/main.py"), 0o755)
        # Over the 4 MiB of one write_file part: the archive goes in two.
        blob = os.urandom(5 * 1024 * 1024)
        with open(os.path.join(work, "blob.bin"), "wb") as f:
            f.write(blob)
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        subprocess.run(["git", "init", "-q"], cwd=work, check=True)
        subprocess.run(["git", "add", "README.md", "src/main.py", ".gitignore", "blob.bin"],
                       cwd=work, check=True)
        subprocess.run(git + ["commit", "-qm", "init"], cwd=work, check=True)
        kept = ["README.md", "src/main.py", ".gitignore", "notes.txt"]
        size = sum(len(files[n]) for n in kept) + len(blob)

        out = self.client(
            work,
            ["create_sandbox", {"name": "stdio"}],
            ["exec", {"command": "echo hi from $(hostname)"}],
            ["handoff_session", {"sandboxId": "$SB", "path": "/root/proj"}],
            ["exec", {"sandboxId": "$SB", "command":
                      "cd /root/proj && find . -type f | LC_ALL=C sort && test -x src/main.py && "
                      f"echo {hashlib.sha256(blob).hexdigest()} blob.bin | sha256sum -c - && "
                      "python3 src/main.py && test ! -e debug.log && test ! -e build"}],
            ["handoff_session", {}],
            ["exec", {"sandboxId": "$SB", "command": "cat /root/work/README.md"}],
            ["exec", {"sandboxId": "$SB", "command": "sleep 3; echo slept"}],
            ["delete_sandbox", {"sandboxId": "$SB"}])
        self.assertEqual(out["connect"]["server"]["name"], "sbx-mcp")
        self.assertIn("tools", out["connect"]["capabilities"])
        self.assertEqual(out["list"]["names"], NAMES + ["handoff_session"])
        tool = out["list"]["handoff"]
        self.assertEqual(tool["annotations"], {"readOnlyHint": False, "destructiveHint": False})
        self.assertEqual(sorted(tool["inputSchema"]["properties"]), ["path", "sandboxId"])
        self.assertEqual(sorted(tool["outputSchema"]["required"]),
                         ["bytes", "files", "path", "sandboxId"])

        create, hello, handoff, check, handoff2, cat, slow, delete = out["calls"]
        sb = create["result"]["structuredContent"]["id"]
        self.assertFalse(create["result"].get("isError"), self.text(create))
        self.assertIn("hi from", self.text(hello))  # the session's default sandbox
        self.assertFalse(handoff["result"].get("isError"), self.text(handoff))
        self.assertEqual(handoff["result"]["structuredContent"],
                         {"sandboxId": sb, "path": "/root/proj", "files": 5, "bytes": size})
        self.assertIn(f"to /root/proj in {sb}", self.text(handoff))
        self.assertIn(f"Copied 5 files ({size} bytes)", self.text(handoff))
        listing = check["result"]["structuredContent"]
        self.assertEqual(listing["exitCode"], 0, listing)
        self.assertEqual(listing["stdout"].split(),
                         ["./.gitignore", "./README.md", "./blob.bin", "./notes.txt",
                          "./src/main.py", "blob.bin:", "OK", "hello", "from", "the", "handoff"])
        # Without sandboxId: a new sandbox, the default path.
        sc2 = handoff2["result"]["structuredContent"]
        self.assertNotEqual(sc2["sandboxId"], sb)
        self.assertEqual(sc2["path"], "/root/work")
        self.assertEqual(cat["result"]["structuredContent"]["stdout"], "# project\n")
        # A call the service answered as an SSE stream: its progress reached the client.
        self.assertEqual(slow["result"]["structuredContent"]["stdout"], "slept\n")
        self.assertTrue(slow["progress"], slow)
        self.assertIn("still running", slow["progress"][0]["message"])
        self.assertFalse(delete["result"].get("isError"), self.text(delete))
        self.s.cli("sandbox", "delete", sb)

        # Shutdown: stdin closed, the remote session was deleted.
        log = out["stderr"]["text"]
        self.assertIn("stdin closed", log)
        sid = log.split("remote session ", 1)[1].split()[0]
        self.assertIn(f"remote session {sid} ended (HTTP 200)", log)
        status, _, _ = mcp_post(self.s, self.key, {"jsonrpc": "2.0", "id": 1,
                                                   "method": "tools/list"}, sid)
        self.assertEqual(status, 404)

    def test_sigterm_ends_the_session(self):
        # A client that stops the server with SIGTERM (as the SDK does when stdin's end is
        # not enough) still has its remote session deleted.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        proc = subprocess.Popen([binary("sbx"), "mcp"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(env, SBX_URL=self.mcp_url, SBX_API_KEY=self.key,
                                         SBX_CA_CERT=self.ca))
        try:
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) +
                             "\n")
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline())
            self.assertEqual(len(answer["result"]["tools"]), 23)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 0, err)
        self.assertIn("stopping on a signal", err)
        sid = err.split("remote session ", 1)[1].split()[0]
        self.assertIn(f"remote session {sid} ended (HTTP 200)", err)
        status, _, _ = mcp_post(self.s, self.key, {"jsonrpc": "2.0", "id": 1,
                                                   "method": "tools/list"}, sid)
        self.assertEqual(status, 404)

    def test_over_limit_refused(self):
        work = self.tmpdir()
        with open(os.path.join(work, "data.bin"), "wb") as f:
            f.write(os.urandom(17 * 1024 * 1024))
        with open(os.path.join(work, "small.txt"), "w") as f:
            f.write("x\n")
        def ids():
            listed = json.dumps(self.s.cli_json("sandbox", "list"))
            return set(re.findall(r"sb_[a-z0-9]+", listed))
        before = ids()
        out = self.client(work, ["handoff_session", {}], url=self.mcp_url)
        (call,) = out["calls"]
        self.assertTrue(call["result"]["isError"])
        self.assertEqual(self.text(call),
                         f"{os.path.realpath(work)} has 17.0 MiB in 2 files (17825794 bytes), "
                         "over handoff_session's limit of 16 MiB (16777216 bytes); run it from "
                         "a smaller directory, or make it a git work tree with a .gitignore")
        # Refused before anything was made: no new sandbox.
        self.assertEqual(ids(), before)

    def test_wrong_key(self):
        out = self.client(self.tmpdir(), ["list_sandboxes", {}], key="sbx_not_a_real_key")
        self.assertIn("refused the API key (401 Unauthorized): check SBX_API_KEY",
                      out["list"]["error"])
        self.assertIn("refused the API key", out["calls"][0]["error"])

    def test_network_errors(self):
        # Nothing listens: curl's reason and SBX_URL. The local CA not trusted: SBX_CA_CERT.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        port = free_port()
        request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) + "\n"
        for url, expected in ((f"https://127.0.0.1:{port}", [
                f"cannot reach https://127.0.0.1:{port}/mcp: ", "; check SBX_URL"]),
                (self.base_url, ["cannot reach", "check SBX_URL and SBX_CA_CERT"])):
            res = subprocess.run([binary("sbx"), "mcp"], input=request, capture_output=True,
                                 text=True, timeout=60,
                                 env=dict(env, SBX_URL=url, SBX_API_KEY=self.key))
            self.assertEqual(res.returncode, 0, res.stderr)
            answer = json.loads(res.stdout)
            print(f"  {url}: {answer['error']['message']}")
            self.assertEqual(answer["id"], 1)
            for part in expected:
                self.assertIn(part, answer["error"]["message"])

    def test_configuration_errors(self):
        sbx = binary("sbx")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        res = subprocess.run([sbx, "mcp"], capture_output=True, text=True, timeout=30,
                             env=dict(env, SBX_URL=self.base_url), stdin=subprocess.DEVNULL)
        self.assertEqual(res.returncode, 2)
        self.assertIn("SBX_API_KEY is not set", res.stderr)
        self.assertEqual(res.stdout, "")
        # On the sbx host itself, the installation is the default; a key is still needed.
        res = subprocess.run([sbx, "mcp", "--data-dir", self.s.dir], capture_output=True,
                             text=True, timeout=30, env=env, stdin=subprocess.DEVNULL)
        self.assertEqual(res.returncode, 2)
        self.assertIn("SBX_API_KEY is not set", res.stderr)
        self.assertIn(self.mcp_url, res.stderr)
        res = subprocess.run([sbx, "mcp", "--data-dir", self.tmpdir()], capture_output=True,
                             text=True, timeout=30, env=dict(env, SBX_API_KEY=self.key),
                             stdin=subprocess.DEVNULL)
        self.assertEqual(res.returncode, 2)
        self.assertIn("SBX_URL is not set", res.stderr)
        res = subprocess.run([sbx, "mcp"], capture_output=True, text=True, timeout=30,
                             env=dict(env, SBX_URL="sbx.example.com", SBX_API_KEY=self.key),
                             stdin=subprocess.DEVNULL)
        self.assertIn("SBX_URL must be", res.stderr)
        res = subprocess.run([sbx, "mcp", "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(res.returncode, 0)
        for part in ("SBX_URL", "SBX_API_KEY", "SBX_CA_CERT", "claude_desktop_config.json",
                     "claude mcp add sbx -e SBX_URL=", "-- sbx mcp", "Cursor"):
            self.assertIn(part, res.stdout)

    def test_local_default_with_a_raw_line(self):
        # On the host, with only a key: the local URL and CA; a raw session over a pipe.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "raw", "version": "0"}}},
                 {"jsonrpc": "2.0", "method": "notifications/initialized"},
                 {"jsonrpc": "2.0", "id": 2, "method": "ping"},
                 {"jsonrpc": "2.0", "id": 3, "method": "prompts/list"},
                 {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}]
        res = subprocess.run([binary("sbx"), "mcp", "--data-dir", self.s.dir],
                             input="".join(json.dumps(m) + "\n" for m in lines) + "{oops\n",
                             capture_output=True, text=True, timeout=60,
                             env=dict(env, SBX_API_KEY=self.key))
        self.assertEqual(res.returncode, 0, res.stderr)
        answers = [json.loads(line) for line in res.stdout.splitlines()]
        self.assertEqual([a.get("id") for a in answers], [1, 2, 3, 4, None])
        self.assertEqual(answers[0]["result"]["protocolVersion"], "2025-11-25")
        self.assertEqual(answers[1]["result"], {})
        self.assertEqual(answers[2]["error"]["code"], -32601)
        self.assertEqual(len(answers[3]["result"]["tools"]), 23)
        self.assertEqual(answers[4]["error"]["code"], -32700)
        self.assertIn("using the local installation", res.stderr)


if __name__ == "__main__":
    main()
