"""The Python SDK (sdk/python), installed as its README says (`pip install ./sdk/python`,
into a venv of Debian's Python, offline: --no-build-isolation with Debian's setuptools
and wheel), against a
real `sbx up` with real guests: the reference prompts and the rest of its surface
(sdk_python_client.py)."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from sbxtest import BIN, HERE, Sbx, main

ROOT = os.path.realpath(os.path.join(HERE, "..", ".."))


class SdkPythonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "sdkpy", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    def test_reference_prompts_and_surface(self):
        venv = tempfile.mkdtemp(prefix="sbxtest-venv-")
        self.addCleanup(subprocess.run, ["rm", "-rf", venv])
        # Debian's Python, whose setuptools and wheel (python3-setuptools, python3-wheel)
        # build the package without the network.
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True, timeout=300)
        # A copy: pip builds in the directory it installs from.
        package = os.path.join(venv, "sdk-python")
        shutil.copytree(os.path.join(ROOT, "sdk", "python"), package)
        pip = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-index",
                              "--no-build-isolation", package],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)
        st = self.s.status()
        env = dict(os.environ, SBX_URL=st["mcp_url"][:-len("/mcp")], SBX_API_KEY=self.key,
                   SBX_CA_CERT=st["ca_cert"])
        res = subprocess.run([os.path.join(venv, "bin", "python"),
                              os.path.join(HERE, "sdk_python_client.py")],
                             capture_output=True, text=True, timeout=900, env=env,
                             cwd=venv)  # not the tree: the installed package is what runs
        print(res.stdout[-6000:] + res.stderr[-3000:])
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        steps = {}
        for line in res.stdout.splitlines():
            step = json.loads(line)
            steps[step.pop("step")] = step
        self.assertEqual(steps["create"]["state"], "ready")
        self.assertEqual(steps["create"]["egress"], {"allow": [], "deny": ["198.51.100.7/32"]})
        self.assertEqual(steps["metrics"], {"sandbox_id": steps["create"]["id"], "vcpus": 1,
                                            "sampling": True, "at_most": True, "newer": 0})
        self.assertEqual(steps["egress"], {
            "set": {"allow": ["2001:db8::/32", "203.0.113.7/32"], "deny": []},
            "got": {"allow": ["2001:db8::/32", "203.0.113.7/32"], "deny": []},
            "cleared": {"allow": [], "deny": []}})
        self.assertEqual(steps["python"], {"exit_code": 0,
                                           "stdout": "1267650600228229401496703205376\n"})
        self.assertIsNone(steps["detached"]["first"])
        self.assertEqual(steps["waited"], {"exit_code": 0, "stdout": "done\n"})
        self.assertEqual(steps["streamed"]["exit_code"], 4)
        self.assertEqual(steps["streamed"]["stdout"], "ready\nafter\n")
        self.assertEqual(steps["streamed"]["stderr"], "oops\n")
        self.assertEqual(steps["streamed"]["seen"][0], "ready\n")
        self.assertEqual(steps["stdin"]["stdout"], "3\n")
        self.assertEqual(steps["file"], {"text": "#!/bin/sh\necho hello\n", "run": "hello\n",
                                         "listed": [["hello.sh", "file", "0o755"]]})
        self.assertEqual(steps["dirs"], {"same": True, "link": "sub/data.bin",
                                         "guest": "2560\n"})
        self.assertTrue(steps["port"]["listing"], steps["port"])
        self.assertGreaterEqual(steps["processes"]["count"], 8)
        self.assertEqual(steps["refused"]["cls"], "InvalidArgumentError")
        self.assertEqual((steps["refused"]["code"], steps["refused"]["status"]),
                         ("invalid_argument", 400))
        self.assertIn("timeout must be between 1 and 600", steps["refused"]["message"])
        self.assertIn(steps["create"]["id"], steps["listed"]["ids"])
        self.assertEqual(steps["stop"]["state"], "stopped")
        self.assertEqual(steps["resume"], {"state": "ready", "still": "kept\n"})
        self.assertEqual(steps["fork"], {"state": "ready", "other": True, "still": "kept\n",
                                         "hostname": True})
        paged = steps["paged"]
        self.assertEqual(paged["all"], [paged["copy"], steps["create"]["id"]])  # newest first
        self.assertEqual(paged["by_one"], paged["all"])
        self.assertEqual((paged["first"], paged["cursor"]), ([paged["copy"]], True))
        self.assertEqual((paged["second"], paged["end"]), ([steps["create"]["id"]], None))
        self.assertEqual((paged["bad"]["cls"], paged["bad"]["code"], paged["bad"]["status"]),
                         ("InvalidArgumentError", "invalid_argument", 400))
        self.assertIn("nextCursor", paged["bad"]["message"])
        self.assertEqual(steps["after"], {"found": False, "code": "not_found"})
        self.assertEqual(steps["template"], {
            "state": "succeeded", "exit_code": 0, "snapshot": True, "steps": True,
            "listed": [["sdk-tpl", True]], "note": "from the context\nbuilt\n"})


if __name__ == "__main__":
    main()
