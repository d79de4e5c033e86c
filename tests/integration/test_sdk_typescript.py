"""The TypeScript SDK (sdk/typescript), built and installed as its README says (`npm
install` in the package builds it with tsc; `npm install ./sdk/typescript` in a project),
against a real `sbx up` with real guests: the reference prompts and the rest of its
surface (sdk_typescript_client.mjs), on Node's own https and nothing else at run time."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from sbxtest import BIN, HERE, Sbx, main

ROOT = os.path.realpath(os.path.join(HERE, "..", ".."))


class SdkTypescriptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "sdkts", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def npm(self, cwd, *args):
        res = subprocess.run(["npm", *args, "--no-audit", "--no-fund"], cwd=cwd,
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(res.returncode, 0, res.stdout[-2000:] + res.stderr[-2000:])

    def test_reference_prompts_and_surface(self):
        work = tempfile.mkdtemp(prefix="sbxtest-sdkts-")
        self.addCleanup(shutil.rmtree, work, True)
        package = os.path.join(work, "sdk-typescript")
        shutil.copytree(os.path.join(ROOT, "sdk", "typescript"), package,
                        ignore=shutil.ignore_patterns("node_modules", "dist"))
        self.npm(package, "install")  # its devDependencies, then tsc (prepare)
        self.assertTrue(os.path.exists(os.path.join(package, "dist", "index.d.ts")))
        project = os.path.join(work, "project")
        os.mkdir(project)
        with open(os.path.join(project, "package.json"), "w") as f:
            json.dump({"name": "uses-sbx", "private": True, "type": "module"}, f)
        self.npm(project, "install", package)
        shutil.copy(os.path.join(HERE, "sdk_typescript_client.mjs"), project)
        st = self.s.status()
        env = dict(os.environ, SBX_URL=st["mcp_url"][:-len("/mcp")], SBX_API_KEY=self.key,
                   SBX_CA_CERT=st["ca_cert"])
        env.pop("NODE_EXTRA_CA_CERTS", None)  # the SDK's own CA option is what works
        res = subprocess.run(["node", "sdk_typescript_client.mjs"], cwd=project,
                             capture_output=True, text=True, timeout=900, env=env)
        print(res.stdout[-6000:] + res.stderr[-3000:])
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        steps = {}
        for line in res.stdout.splitlines():
            step = json.loads(line)
            steps[step.pop("step")] = step
        self.assertEqual(steps["create"]["state"], "ready")
        self.assertEqual(steps["create"]["egress"], {"allow": [], "deny": ["198.51.100.7/32"]})
        self.assertEqual(steps["metrics"], {"sandboxId": steps["create"]["id"], "vcpus": 1,
                                            "sampling": True, "atMost": True, "newer": 0})
        self.assertEqual(steps["egress"], {
            "set": {"allow": ["2001:db8::/32", "203.0.113.7/32"], "deny": []},
            "got": {"allow": ["2001:db8::/32", "203.0.113.7/32"], "deny": []},
            "cleared": {"allow": [], "deny": []}})
        self.assertEqual(steps["python"], {"exitCode": 0,
                                           "stdout": "1267650600228229401496703205376\n"})
        self.assertIsNone(steps["detached"]["first"])
        self.assertEqual(steps["waited"], {"exitCode": 0, "stdout": "done\n"})
        self.assertEqual(steps["streamed"], {"exitCode": 4, "stdout": "ready\nafter\n",
                                             "stderr": "oops\n", "first": "ready\n"})
        self.assertEqual(steps["stdin"]["stdout"], "3\n")
        self.assertEqual(steps["file"], {"text": "#!/bin/sh\necho hello\n", "run": "hello\n",
                                         "listed": [["hello.sh", "file", "755"]]})
        self.assertEqual(steps["dirs"], {"files": 1, "same": True, "link": "sub/data.bin",
                                         "guest": "2560\n"})
        self.assertTrue(steps["port"]["listing"], steps["port"])
        self.assertGreaterEqual(steps["processes"]["count"], 8)
        self.assertEqual((steps["refused"]["isSbx"], steps["refused"]["code"],
                          steps["refused"]["status"]), (True, "invalid_argument", 400))
        self.assertIn("timeout must be between 1 and 600", steps["refused"]["message"])
        self.assertIn(steps["create"]["id"], steps["listed"]["ids"])
        self.assertEqual(steps["stop"]["state"], "stopped")
        self.assertEqual(steps["resume"], {"state": "ready", "still": "kept\n"})
        self.assertEqual(steps["fork"], {"state": "ready", "other": True, "still": "kept\n",
                                         "hostname": True})
        paged = steps["paged"]
        self.assertEqual(paged["all"], [paged["copy"], steps["create"]["id"]])  # newest first
        self.assertEqual(paged["byOne"], paged["all"])
        self.assertEqual((paged["first"], paged["cursor"]), ([paged["copy"]], True))
        self.assertEqual((paged["second"], paged["end"]), ([steps["create"]["id"]], None))
        self.assertEqual((paged["bad"]["isSbx"], paged["bad"]["code"], paged["bad"]["status"]),
                         (True, "invalid_argument", 400))
        self.assertIn("nextCursor", paged["bad"]["message"])
        self.assertEqual(steps["template"], {
            "state": "succeeded", "exitCode": 0, "snapshot": True, "steps": True,
            "listed": [["ts-tpl", True]], "note": "from the context\nbuilt\n"})
        self.assertEqual(steps["after"], {"found": False, "code": "not_found"})


if __name__ == "__main__":
    main()
