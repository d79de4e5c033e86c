"""Consent CSRF from a sandbox's public port (issue 13, items 1 and 2), in a real browser.

An attacker owns a sandbox and an OAuth client. The sandbox's public port serves a page
that plants the attacker's own CSRF cookie (Set-Cookie with Domain=<gateway domain>, and
document.cookie) and auto-submits Allow for the attacker's client with the attacker's
token. The victim, signed in at the gateway in headless Chromium (Debian's chromium,
driven by playwright-core), visits that page. The attacker's redirect URI must never get
a code, and no connection may appear on the victim's account. Run twice under `sbx up`:
with the default box domain (box.<domain>: the same site as the gateway, so the
defences in depth must hold alone) and with a box_domain of its own. The gateway's name
is sbx.test, which browsers treat like any public domain; Chromium maps every name to
127.0.0.1, and nothing else is ever reached.

The same run checks the proxy's side: a guest never sees the caller's Authorization or
the gateway's cookies, and a guest's Domain cookie stays on the guest's host."""
import html as htmllib
import http.client
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading
import unittest
import urllib.parse

from browsertest import browser_script
from sbxtest import BIN, Sbx, main, mcp_call, mcp_session, wait_for
from test_oauth import Browser, Forms, pkce

DOMAIN = "sbx.test"
PASSWORD = "correct horse battery"

# The guest's web server: / is the attack page (with its Set-Cookie headers), /echo
# answers the request's headers as JSON (what the proxy passed on).
SERVER_PY = r'''
import http.server, json
PAGE = open("/root/attack.html", "rb").read()
COOKIES = json.load(open("/root/cookies.json"))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/echo"):
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            ctype = "application/json"
        else:
            body, ctype = PAGE, "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for c in COOKIES:
            self.send_header("Set-Cookie", c)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
'''


class Callback:
    """The redirect URIs' server on 127.0.0.1: records every request it gets."""

    def __init__(self, test):
        self.paths = []
        paths = self.paths

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"callback\n")

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        test.addCleanup(self.server.server_close)
        test.addCleanup(self.server.shutdown)

    def got(self, prefix):
        return [p for p in self.paths if p.startswith(prefix)]


class EdgeSiteTest(unittest.TestCase):
    def browser_deps(self):
        return browser_script(self, "edge_site_browser.mjs", "edge-browser")

    def register(self, s, name, uri):
        status, _, raw = s.https("POST", "/oauth/register", body=json.dumps(
            {"client_name": name, "redirect_uris": [uri]}),
            headers={"Content-Type": "application/json"})
        self.assertEqual(status, 201, raw)
        return json.loads(raw)["client_id"]

    def authorize_path(self, base, client_id, uri, challenge):
        return "/oauth/authorize?" + urllib.parse.urlencode({
            "response_type": "code", "client_id": client_id, "redirect_uri": uri,
            "code_challenge": challenge, "code_challenge_method": "S256", "state": "st",
            "scope": "sbx", "resource": base + "/mcp"})

    def box_fetch(self, s, host, path, headers):
        """GET through the port proxy, as a browser reaches host (SNI, the local CA)."""
        ctx = ssl.create_default_context(cafile=s.status()["ca_cert"])
        raw = socket.create_connection(("127.0.0.1", s.listen_port()), timeout=60)
        conn = http.client.HTTPConnection(host, s.listen_port(), timeout=60)
        conn.sock = ctx.wrap_socket(raw, server_hostname=host)
        conn.request("GET", path, headers=headers)
        res = conn.getresponse()
        body = res.read()
        set_cookies = [v for k, v in res.getheaders() if k.lower() == "set-cookie"]
        conn.close()
        return res.status, body, set_cookies

    def run_attack(self, box_domain):
        settings = {"image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
                    "domain": DOMAIN}
        if box_domain:
            settings["box_domain"] = box_domain
        s = Sbx(self, "edge", settings=settings)
        s.up()
        # Same-site sandboxes are worth a warning at start; a box_domain of its own is not.
        warned = "same site as the gateway" in s.output()
        self.assertEqual(warned, not box_domain, s.output()[-2000:])
        port = s.listen_port()
        base = f"https://{DOMAIN}:{port}"
        s.cli("account", "create", "--email", "alice@example.com", "--password-stdin",
              input=PASSWORD + "\n")
        mallory = s.cli_json("account", "create", "--email", "mallory@example.com",
                             "--password-stdin", input=PASSWORD + "\n")
        cb = Callback(self)
        evil_uri = f"http://127.0.0.1:{cb.port}/cb"
        legit_uri = f"http://127.0.0.1:{cb.port}/legit"
        evil = self.register(s, "Attacker App", evil_uri)
        legit = self.register(s, "Legit App", legit_uri)

        # The attacker's own consent form: a cookie and token pair of their own session.
        _, challenge = pkce()
        evil_path = self.authorize_path(base, evil, evil_uri, challenge)
        b = Browser(s)
        _, _, page = b.request("GET", evil_path)
        form = Forms(page).forms[0]
        _, _, page = b.request("POST", "/oauth/authorize", form=dict(
            form["fields"], email="mallory@example.com", password=PASSWORD, action="signin"))
        consent = Forms(page).forms[0]
        self.assertIn(("action", "allow"), consent["buttons"], page)
        pair_cookie = b.cookies.get("__Host-sbx_csrf") or b.cookies.get("sbx_csrf")
        self.assertTrue(pair_cookie, b.cookies)

        # The attacker's sandbox, its page, its public port.
        key = mallory["api_key"]
        sid = mcp_session(s, key)
        mcp_call(self, s, key, sid, "create_sandbox", {"name": "edge", "ttlSeconds": 1800})
        fields = "".join(
            f'<input type="hidden" name="{htmllib.escape(k)}" value="{htmllib.escape(v)}">'
            for k, v in dict(consent["fields"], action="allow").items())
        planted = [f"sbx_csrf={pair_cookie}; path=/oauth/authorize",
                   f"__Host-sbx_csrf={pair_cookie}; path=/; secure",
                   "planted_by_js=1; path=/"]
        script = "".join(f"document.cookie = {json.dumps(c + '; domain=' + DOMAIN)};\n"
                         for c in planted)
        html = (f"<!doctype html><title>cute cats</title><script>{script}</script>"
                f'<form id="f" method="post" action="{base}/oauth/authorize">{fields}</form>'
                "<script>document.getElementById('f').submit()</script>")
        cookies = [f"sbx_csrf={pair_cookie}; Domain={DOMAIN}; Path=/oauth/authorize",
                   f"__Host-sbx_csrf={pair_cookie}; Domain={DOMAIN}; Path=/; Secure",
                   f"planted_by_header=1; Domain={DOMAIN}; Path=/"]
        mcp_call(self, s, key, sid, "write_file", {"path": "/root/attack.html", "content": html})
        mcp_call(self, s, key, sid, "write_file", {"path": "/root/cookies.json",
                                                   "content": json.dumps(cookies)})
        mcp_call(self, s, key, sid, "write_file", {"path": "/root/srv.py", "content": SERVER_PY})
        mcp_call(self, s, key, sid, "exec", {"command": "python3 /root/srv.py", "detached": True})
        r, _ = mcp_call(self, s, key, sid, "exec", {
            "command": "for i in $(seq 240); do curl -s -o /dev/null localhost:8000 && exit 0; "
                       "sleep 0.5; done; exit 1"})
        self.assertEqual(r["structuredContent"]["exitCode"], 0, "the guest's server never listened")
        r, _ = mcp_call(self, s, key, sid, "host_port", {"port": 8000, "public": True})
        box_url = r["structuredContent"]["url"]
        box_host = urllib.parse.urlparse(box_url).hostname
        self.assertTrue(box_host.endswith("." + (box_domain or f"box.{DOMAIN}")), box_url)

        # The proxy: no caller credentials or gateway cookies in, no Domain cookie out.
        status, body, set_cookies = self.box_fetch(s, box_host, "/echo", {
            "Authorization": f"Bearer {key}",
            "Cookie": "__Host-sbx_session=victim; app=1; __Host-sbx_csrf=c; sbx_session=old"})
        self.assertEqual(status, 200, body)
        seen = json.loads(body)
        self.assertNotIn("authorization", seen)
        self.assertEqual(seen.get("cookie"), "app=1")
        self.assertEqual(len(set_cookies), 3, set_cookies)
        for c in set_cookies:
            self.assertNotIn("domain", c.lower(), set_cookies)
        # Private, opened with the owner's key: that key is not passed on either.
        mcp_call(self, s, key, sid, "host_port", {"port": 8000, "public": False})
        wait_for(lambda: self.box_fetch(s, box_host, "/echo", {})[0] == 401, 30,
                 "the port turning private")
        status, body, _ = self.box_fetch(s, box_host, "/echo", {"Authorization": f"Bearer {key}"})
        self.assertEqual(status, 200, body)
        self.assertNotIn("authorization", json.loads(body))
        mcp_call(self, s, key, sid, "host_port", {"port": 8000, "public": True})
        wait_for(lambda: self.box_fetch(s, box_host, "/echo", {})[0] == 200, 30,
                 "the port public again")

        # The forms' Origin rule, header by header (what a browser would send).
        for path in ("/oauth/authorize", "/account"):
            for headers, refused in (({"Origin": "null"}, True),
                                     ({"Origin": f"https://{box_host}:{port}"}, True),
                                     ({"Origin": f"https://{DOMAIN}.evil.example:{port}"}, True),
                                     ({"Sec-Fetch-Site": "same-site"}, True),
                                     ({"Sec-Fetch-Site": "cross-site"}, True),
                                     ({"Origin": base}, False),
                                     ({"Sec-Fetch-Site": "same-origin"}, False),
                                     ({}, False)):
                status, _, page = Browser(s).request("POST", path, form={
                    "client_id": evil, "action": "signin"}, headers=headers)
                self.assertEqual("sent from another site" in page, refused, (path, headers, page))
                if refused:
                    self.assertEqual(status, 403, (path, headers))

        # The victim, in Chromium: signs in, allows a legitimate app, visits the page.
        node, script_path = self.browser_deps()
        _, legit_challenge = pkce()
        cfg = {"gateway": base, "email": "alice@example.com", "password": PASSWORD,
               "legit": self.authorize_path(base, legit, legit_uri, legit_challenge),
               "box": box_url + "/"}
        res = subprocess.run([node, script_path, json.dumps(cfg)], capture_output=True,
                             text=True, timeout=300)
        print(f"\nbrowser ({box_domain or 'box.' + DOMAIN}):\n{res.stdout[-4000:]}"
              f"{res.stderr[-3000:]}")
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        steps = {j["step"]: j for j in (json.loads(line) for line in res.stdout.splitlines()
                                        if line.startswith("{"))}
        self.assertIn("done", steps)
        self.assertTrue(steps["signed_in"]["signedIn"], steps["signed_in"])
        self.assertEqual(len(cb.got("/legit?code=")), 1, cb.paths)

        attack = steps["attack"]
        # No code for the attacker, now or late, and no connection on the victim's account.
        self.assertEqual(cb.got("/cb"), [], attack)
        self.assertFalse(any("code=" in (p["location"] or "") for p in attack["posts"]), attack)
        connections = [k["name"] for k in s.cli_json("key", "list", "--account",
                                                     "alice@example.com")["keys"]
                       if k["kind"] == "connection"]
        self.assertTrue(any("Legit App" in n for n in connections), connections)
        self.assertFalse(any("Attacker App" in n for n in connections), connections)
        # What stopped it: the POST was answered 403 (Origin is the sandbox's host).
        self.assertTrue(attack["posts"], attack)
        self.assertEqual([p["status"] for p in attack["posts"]], [403], attack)
        self.assertIn("sent from another site", attack["text"])
        self.assertEqual(attack["posts"][0]["origin"], f"https://{box_host}:{port}")
        # The cookies the gateway's host got: none from the guest's headers, no __Host-
        # cookie of the attacker's; the script's plain ones only where same-site allows.
        jar = {c["name"]: c for c in attack["cookies"]}
        self.assertNotIn("planted_by_header", jar)
        self.assertNotEqual(jar.get("__Host-sbx_csrf", {}).get("value"), pair_cookie)
        self.assertEqual("planted_by_js" in jar, not box_domain, jar)

    def test_default_box_domain_same_site(self):
        """box.sbx.test: the same site as the gateway; the form defences hold alone."""
        self.run_attack(None)

    def test_box_domain_of_its_own(self):
        """box_domain = sbx-box.test: another site."""
        self.run_attack("sbx-box.test")


if __name__ == "__main__":
    main()
