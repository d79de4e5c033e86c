"""The web console and the sandbox URL page (issue 18, items 6 and 7), in a real browser.

Under `sbx up` with one real guest (created through REST first, a public and a private
port published), headless Chromium (Debian's chromium, driven by playwright-core, as in
test_edge_site) signs in on /account with a wrong password (the form comes back with the
email kept) and then the right one; sees the sandbox (state, type, URL, running time,
cost, ports); stops and resumes it from the page while this test checks its state
through REST after each (and deletes it at the end, answering its question); creates a key, copies it with the Copy button and reads it back
from the clipboard, and this test uses it on REST; reads the 14- and 30-day SVG charts
(a bar per day, matching billing's figures from REST) and the Connect snippets (this
service's real URL). Then the sandbox's own URL https://<label>.box.<domain>/: its
owner, through the console's link, sees its ports (and the sandbox's host never gets
the session cookie); anyone else a short page with nothing of the sandbox; a forged
owner link is refused; the owner's API key works as on private ports. Screenshots of
each step are saved under build/test-output/console/ and their paths printed."""
import datetime
import json
import os
import shutil
import subprocess
import unittest

from browsertest import browser_script
from sbxtest import BIN, Sbx, main, wait_for

DOMAIN = "sbx.test"
PASSWORD = "correct horse battery"


class ConsoleTest(unittest.TestCase):
    def rest(self, s, key, method, path, body=None):
        status, _, raw = s.https(method, path, body=json.dumps(body) if body is not None else None,
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"}, timeout=300)
        return status, json.loads(raw) if raw else None

    def test_console(self):
        s = Sbx(self, "console", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")), "domain": DOMAIN,
            "vmd.metrics_interval_ms": 1000})  # samples for the sparklines, soon
        s.up()
        base = f"https://{DOMAIN}:{s.listen_port()}"
        email = "carol@example.com"
        key = s.cli_json("account", "create", "--email", email, "--password-stdin",
                         input=PASSWORD + "\n")["api_key"]
        status, sb = self.rest(s, key, "POST", "/v1/sandboxes", {"name": "console <demo>"})
        self.assertEqual(status, 201, sb)
        sid = sb["id"]
        for port, public in ((8000, True), (9000, False)):
            status, body = self.rest(s, key, "POST", f"/v1/sandboxes/{sid}/ports",
                                     {"port": port, "public": public})
            self.assertEqual(status, 200, body)
        # Samples for its sparklines before the page is seen.
        wait_for(lambda: self.rest(s, key, "GET", f"/v1/sandboxes/{sid}/metrics")[1]["samples"],
                 60, "the sandbox's first samples")
        shots = os.path.realpath(os.path.join(os.environ.get("SBX_BIN", os.getcwd()), "..",
                                              "test-output", "console"))
        shutil.rmtree(shots, ignore_errors=True)
        os.makedirs(shots)

        node, script = browser_script(self, "console_browser.mjs", "console-browser")
        cfg = {"gateway": base, "email": email, "password": PASSWORD, "sandboxId": sid,
               "key": key, "shots": shots}
        proc = subprocess.Popen([node, script, json.dumps(cfg)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        steps, log = {}, []

        def state():
            status, body = self.rest(s, key, "GET", f"/v1/sandboxes/{sid}")
            self.assertEqual(status, 200, body)
            return body["state"]

        # What the test checks between the browser's steps, through REST.
        def on_stopped(step):
            self.assertEqual(step["sandbox"]["state"], "stopped", step)
            self.assertEqual(state(), "stopped")

        def on_resumed(step):
            self.assertEqual(step["sandbox"]["state"], "ready", step)
            self.assertEqual(state(), "ready")

        def on_key(step):
            self.assertTrue(step["shown"].startswith("sbx_"), step)
            self.assertEqual(step["copied"], step["shown"])
            status, body = self.rest(s, step["copied"], "GET", "/v1/sandboxes")
            self.assertEqual(status, 200, body)
            self.assertEqual([x["id"] for x in body["sandboxes"]], [sid])
            # read-only, as chosen on the page: it may not stop the sandbox.
            status, body = self.rest(s, step["copied"], "POST", f"/v1/sandboxes/{sid}/stop")
            self.assertEqual(status, 403, body)

        def on_deleted(step):
            self.assertFalse(step["row"], step)
            self.assertEqual(len(step["dialogs"]), 1, step)
            self.assertIn("Delete this sandbox?", step["dialogs"][0])
            status, body = self.rest(s, key, "GET", f"/v1/sandboxes/{sid}")
            self.assertEqual(status, 404, body)

        checks = {"stopped": on_stopped, "resumed": on_resumed, "key": on_key,
                  "deleted": on_deleted}
        try:
            for line in proc.stdout:
                log.append(line)
                if not line.startswith("{"):
                    continue
                step = json.loads(line)
                steps[step["step"]] = step
                if step["step"] == "screenshot":
                    print(f"screenshot: {step['path']}")
                if step["step"] in checks:
                    checks[step["step"]](step)
                    proc.stdin.write("ok\n")
                    proc.stdin.flush()
            proc.wait(60)
        finally:
            print("".join(log)[-6000:])
            errors = proc.stderr.read()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        self.assertEqual(proc.returncode, 0, errors[-3000:])
        self.assertEqual(steps["done"]["errors"], [])

        # A wrong password: the form again, saying so, with the email kept.
        self.assertEqual(steps["wrong"]["email"], email)
        self.assertIn("Wrong email or password", steps["wrong"]["alert"])
        # The console: the sandbox as it is.
        console = steps["console"]
        self.assertEqual(console["signedIn"], email)
        shown = console["sandbox"]
        self.assertEqual((shown["state"], shown["type"], shown["url"]),
                         ("ready", sb["type"], sb["url"]))
        self.assertTrue(shown["href"].startswith(sb["url"] + "/?sbx_owner="), shown)
        self.assertGreaterEqual(int(shown["running"]), 0)
        self.assertTrue(shown["cost"].startswith("$0."), shown)
        self.assertEqual(len(shown["ports"]), 2, shown)
        # CPU and memory sparklines of its last samples, the newest figures beside them.
        self.assertEqual([x["kind"] for x in shown["sparks"]], ["spark cpu", "spark memory"],
                         shown)
        self.assertRegex(shown["sparks"][0]["text"], r"^CPU [0-9.]+%$")
        self.assertRegex(shown["sparks"][1]["text"], r"^memory [0-9.]+ MiB of [0-9.]+ MiB$")
        self.assertIn("(public)", shown["ports"][0])
        self.assertIn("(private)", shown["ports"][1])

        # The charts: a bar a day, ending today, matching billing's days (REST).
        page = steps["page"]
        status, usage = self.rest(s, key, "GET", "/v1/usage")
        self.assertEqual(status, 200, usage)
        billed = {d["day"]: d["runningSeconds"] for d in usage["days"]}
        today = datetime.datetime.now(datetime.timezone.utc).date()
        for name, span in (("chart14", 14), ("chart30", 30)):
            bars = page[name]
            self.assertEqual([b["day"] for b in bars],
                             [str(today - datetime.timedelta(days=span - 1 - i))
                              for i in range(span)])
            for b in bars[:-1]:
                self.assertEqual(b["seconds"], billed.get(b["day"], 0), b)
            # Today's still grows while the sandbox runs: at most what REST says now.
            self.assertGreater(bars[-1]["seconds"], 0, bars[-1])
            self.assertLessEqual(bars[-1]["seconds"], billed[str(today)])
            self.assertEqual(bars[-1]["height"], max(b["height"] for b in bars))
            self.assertTrue(all(b["height"] == 0 for b in bars if not b["seconds"]))
        self.assertGreaterEqual(page["tables"], 4)  # the charts' table fallbacks
        self.assertFalse(page["newKeyAgain"])  # shown once
        self.assertTrue(any("from the console" in k for k in page["keys"]), page["keys"])
        snippets = page["snippets"]
        self.assertEqual(snippets["snippet-mcp-url"], f"{base}/mcp")
        self.assertEqual(snippets["snippet-claude"], f"{base}/mcp")
        self.assertEqual(snippets["snippet-chatgpt"], f"{base}/mcp")
        self.assertEqual(snippets["snippet-claude-code"],
                         f"claude mcp add --transport http sbx {base}/mcp")
        cursor = json.loads(snippets["snippet-cursor"])
        self.assertEqual(cursor["mcpServers"]["sbx"]["url"], f"{base}/mcp")
        for name in ("snippet-python", "snippet-typescript"):
            self.assertIn(f"SBX_URL={base} ", snippets[name])

        # The sandbox URL: its owner sees the ports; the session cookie never went there.
        owner = steps["owner"]
        self.assertEqual(owner["status"], 200, owner)
        self.assertIn("Only you see this page", owner["text"])
        self.assertIn(sid, owner["text"])
        self.assertEqual(len(owner["ports"]), 2, owner)
        self.assertIn(sb["url"].replace(".box.", "-8000.box.", 1), owner["ports"][0])
        self.assertIn("anyone (public)", owner["ports"][0])
        self.assertIn("private", owner["ports"][1])
        self.assertTrue(owner["cookies"], owner)
        self.assertTrue(all(not c or "sbx_session" not in c for c in owner["cookies"]), owner)
        # Anyone else: what this is, nothing of the sandbox; a forged link: refused.
        anonymous = steps["anonymous"]
        self.assertEqual(anonymous["status"], 200, anonymous)
        self.assertIn("Nothing is published publicly there now", anonymous["text"])
        for secret in (sid, "8000", "9000", "console"):
            self.assertNotIn(secret, anonymous["text"].replace(sb["url"], ""))
        self.assertEqual(steps["forged"]["status"], 403, steps["forged"])
        self.assertIn("owner link has expired", steps["forged"]["text"])
        self.assertNotIn(sid, steps["forged"]["text"])
        # The owner's API key, as private ports take it.
        self.assertEqual(steps["bykey"]["status"], 200, steps["bykey"])
        self.assertIn(sid, steps["bykey"]["text"])
        self.assertIn("deleted", steps)
        # Never a bare 404, even through curl-like clients (the sandbox is gone now).
        status, _, raw = s.https("GET", "/", headers={"Host": sb["url"].split("//")[1]})
        self.assertEqual(status, 200, raw)
        self.assertIn(b"An sbx sandbox", raw)


if __name__ == "__main__":
    main()
