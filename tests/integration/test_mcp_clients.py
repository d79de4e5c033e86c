"""The client snippets of docs/clients.md, each run with the client it is for, against a
real `sbx up` with real guests: read from the document (its `<!-- snippet: NAME -->`
marks), with a real URL, key, CA and path put in place of the placeholders. Claude Code
(`claude mcp add`, then `claude mcp list`, which connects to every server it has),
mcp-remote, and the official SDK's StdioClientTransport launching each JSON config's
command, args and env as Claude Desktop and Cursor do; the TypeScript SDK snippet as a
program. A snippet that stops working, or a document that loses one, fails here."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from npmwork import npm_install, place
from sbxtest import BIN, HERE, Sbx, binary, install_sdk, main

DOC = os.path.join(HERE, "..", "..", "docs", "clients.md")
NAMES = ["create_sandbox", "list_sandboxes", "get_sandbox", "get_sandbox_metrics", "exec",
         "command_status", "kill_command", "list_commands", "read_file", "write_file", "host_port",
         "stop_sandbox",
         "resume_sandbox", "extend_sandbox", "rename_sandbox", "label_sandbox",
         "delete_sandbox", "save_snapshot", "list_snapshots", "delete_snapshot",
         "set_sandbox_egress", "fork_sandbox"]
SNIPPETS = {"claude-desktop": "json", "claude-desktop-mcp-remote": "json", "cursor": "json",
            "claude-code-stdio": "sh", "claude-code-http": "sh", "typescript-sdk": "js"}


def snippets():
    """NAME → the code of the fenced block after <!-- snippet: NAME --> in docs/clients.md."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    found = {}
    for m in re.finditer(r"<!-- snippet: ([a-z0-9-]+) -->\s*```(\w+)\n(.*?)\n\s*```", text, re.S):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def install_clients(test):
    """Claude Code and mcp-remote from npm, under the build tree (<build>/mcp-clients,
    once): the directory whose node_modules/.bin has `claude` and `mcp-remote`."""
    npm = shutil.which("npm")
    test.assertTrue(npm and shutil.which("node"), "node and npm are needed for the clients")
    work = os.path.join(os.environ.get("SBX_BIN", os.getcwd()), "..", "mcp-clients")
    os.makedirs(work, exist_ok=True)
    place(os.path.join(HERE, "clients", "package.json"), work)
    bins = os.path.join(work, "node_modules", ".bin")
    npm_install(work, lambda: all(os.path.exists(os.path.join(bins, b))
                                  for b in ("claude", "mcp-remote")), timeout=600)
    return os.path.realpath(work)


class McpClientsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "mcpclients", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]
        st = cls.s.status()
        cls.mcp_url, cls.ca = st["mcp_url"], st["ca_cert"]
        cls.base_url = cls.mcp_url[:-len("/mcp")]
        cls.snippets = snippets()

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="sbxtest-clients-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def snippet(self, name):
        """The snippet with this installation's URL, key, CA and sbx binary in it."""
        self.assertIn(name, self.snippets, f"docs/clients.md lost its {name} snippet")
        lang, code = self.snippets[name]
        self.assertEqual(lang, SNIPPETS[name])
        self.assertIn("https://sbx.example.com", code, name)
        return (code.replace("https://sbx.example.com", self.base_url)
                    .replace("sbx_…", self.key).replace("/path/to/ca.crt", self.ca)
                    .replace("/usr/local/bin/sbx", binary("sbx")))

    def test_every_snippet_is_here(self):
        self.assertEqual(sorted(self.snippets), sorted(SNIPPETS))

    # -- Claude Code --------------------------------------------------------------
    def claude(self, script, home):
        """Runs script with bash, as a user's shell would, with Claude Code and sbx on PATH
        and home as HOME (where Claude Code keeps its configuration)."""
        clients = install_clients(self)
        env = dict(os.environ, HOME=home, DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   PATH=os.pathsep.join([os.path.join(clients, "node_modules", ".bin"),
                                         os.path.dirname(binary("sbx")), os.environ["PATH"]]))
        env.pop("NODE_EXTRA_CA_CERTS", None)
        res = subprocess.run(["bash", "-euc", script], cwd=home, env=env, capture_output=True,
                             text=True, timeout=300)
        print(f"\n$ {script}\n{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode, 0, res.stderr)
        return res.stdout + res.stderr

    def test_claude_code_stdio(self):
        home = self.tmpdir()
        out = self.claude(self.snippet("claude-code-stdio"), home)
        self.assertIn("Added stdio MCP server sbx with command: sbx mcp", out)
        out = self.claude("claude mcp list", home)
        self.assertIn("sbx: sbx mcp - ✔ Connected", out)
        # `sbx mcp --help` shows the same line.
        res = subprocess.run([binary("sbx"), "mcp", "--help"], capture_output=True, text=True,
                             timeout=30)

        def words(text):
            return " ".join(text.replace("\\\n", " ").split())
        self.assertIn(words(self.snippets["claude-code-stdio"][1]), words(res.stdout))

    def test_claude_code_http(self):
        home = self.tmpdir()
        code = self.snippet("claude-code-http")
        out = self.claude(code + "\nclaude mcp list", home)
        self.assertIn(f"sbx: {self.mcp_url} (HTTP) - ✔ Connected", out)
        # Without the CA (the snippet's first line), the certificate is not trusted: that
        # line is what makes it work.
        out = self.claude("claude mcp list", home)
        self.assertIn(f"sbx: {self.mcp_url} (HTTP) - ✘ Failed to connect", out)
        self.assertIn("UNABLE_TO_VERIFY_LEAF_SIGNATURE", out)

    # -- the JSON configs of Claude Desktop and Cursor ------------------------------
    def launch(self, name, cwd):
        """Launches mcpServers.sbx of snippet name (command, args, env) with the SDK's
        StdioClientTransport, lists the tools and calls list_sandboxes."""
        server = json.loads(self.snippet(name))["mcpServers"]["sbx"]
        work = install_sdk(self)
        place(os.path.join(HERE, "mcp_stdio_client.mjs"), work)
        home = self.tmpdir()
        env = dict(os.environ, HOME=home, SBX_TEST_SERVER_ENV=json.dumps(server["env"]),
                   SBX_TEST_CALLS=json.dumps([["list_sandboxes", {}]]),
                   PATH=os.pathsep.join([os.path.dirname(binary("sbx")), os.environ["PATH"]]))
        for name_ in ("SBX_URL", "SBX_API_KEY", "SBX_CA_CERT", "NODE_EXTRA_CA_CERTS"):
            env.pop(name_, None)  # only what the config gives
        res = subprocess.run([shutil.which("node"), os.path.join(work, "mcp_stdio_client.mjs"),
                              cwd, server["command"], *server["args"]], capture_output=True,
                             text=True, timeout=300, env=env)
        print(f"\n{name}: {server['command']} {server['args']}\n{res.stdout[-3000:]}"
              f"{res.stderr[-2000:]}")
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        steps = {}
        for line in res.stdout.splitlines():
            if line.startswith("{"):
                step = json.loads(line)
                steps[step["step"]] = step
        self.assertIn("done", steps)
        self.assertFalse(steps["call"]["result"].get("isError"), steps["call"])
        return steps

    def test_claude_desktop_and_cursor(self):
        for name in ("claude-desktop", "cursor"):
            with self.subTest(name=name):
                steps = self.launch(name, self.tmpdir())
                self.assertEqual(steps["list"]["names"], NAMES + ["handoff_session"])

    def test_claude_desktop_mcp_remote(self):
        # npx finds the mcp-remote installed in the directory it runs in (no registry).
        steps = self.launch("claude-desktop-mcp-remote", install_clients(self))
        self.assertEqual(steps["list"]["names"], NAMES)

    # -- the TypeScript SDK, as a program -------------------------------------------
    def test_typescript_sdk(self):
        work = install_sdk(self)
        program = os.path.join(work, "clients_snippet.mjs")
        with open(program, "w", encoding="utf-8") as f:
            f.write(self.snippet("typescript-sdk") +
                    "\nconsole.log(JSON.stringify(r.structuredContent));\nawait client.close();\n")
        env = dict(os.environ, SBX_API_KEY=self.key, NODE_EXTRA_CA_CERTS=self.ca)
        res = subprocess.run([shutil.which("node"), program], cwd=work, capture_output=True,
                             text=True, timeout=600, env=env)
        print(f"\ntypescript-sdk:\n{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode, 0, res.stderr)
        sandbox = json.loads(res.stdout.strip().splitlines()[-1])
        self.assertEqual((sandbox["name"], sandbox["state"]), ("demo", "ready"))
        self.s.cli_json("sandbox", "delete", sandbox["id"], timeout=120)


if __name__ == "__main__":
    main()
