"""OAuth 2.1 end to end (issue 5): the real gateway and broker under `sbx up`, over HTTPS.

The browser's part (sign-in and consent forms, cookies, CSRF) is driven headlessly by
parsing the HTML forms. The client's part is raw HTTP here for the negative matrix, and a
real OAuth client library from npm (oauth4webapi) plus the MCP TypeScript SDK's OAuth
client provider in oauth_client.mjs. A client ID metadata document is served by the test
over HTTPS (the gateway is told to trust the test's CA and allow loopback fetches)."""
import base64
import hashlib
import http.client
import http.server
import json
import os
import secrets
import shutil
import ssl
import subprocess
import threading
import time
import unittest
import urllib.parse
from html.parser import HTMLParser

from npmwork import npm_install, place
from sbxtest import BIN, Sbx, main, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PASSWORD = "correct horse battery"
REDIRECT = "http://127.0.0.1:9/callback"
ACCESS_TTL_S = 10  # short, so the expiry test need not wait an hour
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}}


def pkce():
    verifier = secrets.token_urlsafe(48)[:64]
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Forms(HTMLParser):
    """The forms of a page: [{action, method, fields: {name: value}, buttons: [(name, value)]}]."""

    def __init__(self, html):
        super().__init__()
        self.forms = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"action": a.get("action"), "method": a.get("method"),
                               "fields": {}, "buttons": []})
        elif tag == "input" and self.forms and a.get("name"):
            if a.get("type") == "hidden":
                self.forms[-1]["fields"][a["name"]] = a.get("value", "")
            else:
                self.forms[-1]["fields"].setdefault(a["name"], "")
        elif tag == "button" and self.forms and a.get("name"):
            self.forms[-1]["buttons"].append((a["name"], a.get("value", "")))


class Browser:
    """A headless browser: HTTPS with the local CA, cookies, no redirects followed."""

    def __init__(self, s):
        self.s = s
        self.cookies = {}

    def request(self, method, path, form=None, headers=None, cookies=True):
        ctx = ssl.create_default_context(cafile=self.s.status()["ca_cert"])
        conn = http.client.HTTPSConnection("localhost", self.s.listen_port(), context=ctx,
                                           timeout=30)
        h = dict(headers or {})
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            h["Content-Type"] = "application/x-www-form-urlencoded"
        if cookies and self.cookies:
            h["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, path, body=body, headers=h)
            res = conn.getresponse()
            raw = res.read()
            hdrs = {}
            for k, v in res.getheaders():
                if k.lower() == "set-cookie":
                    name, _, rest = v.partition("=")
                    value = rest.split(";", 1)[0]
                    if "Max-Age=0" in v:
                        self.cookies.pop(name, None)
                    else:
                        self.cookies[name] = value
                hdrs[k.lower()] = v
            return res.status, hdrs, raw.decode(errors="replace")
        finally:
            conn.close()


class OAuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "oauth", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "oauth.access_ttl_s": str(ACCESS_TTL_S),
            "gateway.oauth_allow_private_fetch": "true",
            # Every test registers clients; the rate limit has its own test (test_edge_http).
            "gateway.register_per_minute": "0"})
        with open(os.path.join(cls.s.dir, "sbx.conf"), "a") as f:
            f.write(f"gateway.oauth_fetch_ca = {cls.s.dir}/tls/ca.crt\n")
        cls.s.up()
        cls.account = cls.s.cli_json("account", "create", "--email", "alice@example.com",
                                     "--password-stdin", input=PASSWORD + "\n")
        cls.api_key = cls.account["api_key"]
        st = cls.s.status()
        cls.mcp_url = st["mcp_url"]
        cls.base = cls.mcp_url[:-len("/mcp")]

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    # -- helpers ---------------------------------------------------------------
    def json_request(self, method, path, body=None, headers=None, form=None):
        """A JSON body (dict or text) or a form; returns (status, headers, parsed answer)."""
        h = dict(headers or {})
        if body is not None:
            h["Content-Type"] = "application/json"
            text = body if isinstance(body, str) else json.dumps(body)
            status, hdrs, text = self._raw(method, path, text, h)
        else:
            status, hdrs, text = Browser(self.s).request(method, path, form=form, headers=h)
        try:
            return status, hdrs, json.loads(text) if text else None
        except ValueError:
            return status, hdrs, text

    def _raw(self, method, path, body, headers):
        status, hdrs, raw = self.s.https(method, path, body=body, headers=headers)
        return status, {k.lower(): v for k, v in hdrs.items()}, raw.decode(errors="replace")

    def register(self, name="Test Client", uris=(REDIRECT,)):
        status, _, body = self.json_request("POST", "/oauth/register",
                                            {"client_name": name, "redirect_uris": list(uris)})
        self.assertEqual(status, 201, body)
        return body["client_id"]

    def authorize_url(self, client_id, challenge, state="st-123", redirect=REDIRECT, **extra):
        q = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
             "code_challenge": challenge, "code_challenge_method": "S256", "state": state,
             "scope": "sbx", "resource": self.mcp_url}
        q.update(extra)
        q = {k: v for k, v in q.items() if v is not None}
        return "/oauth/authorize?" + urllib.parse.urlencode(q)

    def sign_in_and_allow(self, browser, url, action="allow", password=PASSWORD):
        """GET the authorization URL, sign in by the form, press Allow (or Deny); returns
        the final response (status, headers, body)."""
        status, _, page = browser.request("GET", url)
        self.assertEqual(status, 200, page)
        forms = Forms(page).forms
        if "signin" in [v for _, v in forms[0]["buttons"]]:
            form = dict(forms[0]["fields"], email="alice@example.com", password=password,
                        action="signin")
            status, _, page = browser.request("POST", forms[0]["action"], form=form)
            self.assertEqual(status, 200, page)
            forms = Forms(page).forms
        self.assertIn(("action", "allow"), forms[0]["buttons"], page)
        form = dict(forms[0]["fields"], action=action)
        return browser.request("POST", forms[0]["action"], form=form)

    def code_from(self, response, state="st-123"):
        status, hdrs, body = response
        self.assertEqual(status, 302, body)
        loc = urllib.parse.urlparse(hdrs["location"])
        self.assertEqual(f"{loc.scheme}://{loc.netloc}{loc.path}", REDIRECT)
        q = dict(urllib.parse.parse_qsl(loc.query))
        self.assertEqual(q.get("state"), state)
        self.assertEqual(q.get("iss"), self.base)
        self.assertIn("code", q, q)
        return q["code"]

    def token(self, **form):
        return self.json_request("POST", "/oauth/token", form=form)

    def tokens_for(self, client_id=None):
        """A whole flow: (client_id, token response)."""
        client_id = client_id or self.register()
        verifier, challenge = pkce()
        code = self.code_from(self.sign_in_and_allow(Browser(self.s),
                                                     self.authorize_url(client_id, challenge)))
        status, _, body = self.token(grant_type="authorization_code", code=code,
                                     code_verifier=verifier, client_id=client_id,
                                     redirect_uri=REDIRECT)
        self.assertEqual(status, 200, body)
        return client_id, body

    def mcp(self, token, body=INIT):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Authorization": f"Bearer {token}"}
        status, hdrs, raw = self.s.https("POST", "/mcp", body=json.dumps(body), headers=h)
        try:
            return status, {k.lower(): v for k, v in hdrs.items()}, json.loads(raw)
        except ValueError:
            return status, hdrs, raw

    def mcp_refused(self, token):
        return self.mcp(token)[0] == 401

    # -- metadata --------------------------------------------------------------
    def test_metadata_chain_is_consistent(self):
        """401 → resource metadata → server metadata, byte for byte consistent."""
        status, hdrs, _ = self._raw("POST", "/mcp", json.dumps(INIT),
                                    {"Content-Type": "application/json"})
        self.assertEqual(status, 401)
        www = hdrs["www-authenticate"]
        rm = www.split('resource_metadata="', 1)[1].split('"', 1)[0]
        self.assertEqual(rm, f"{self.base}/.well-known/oauth-protected-resource/mcp")
        self.assertIn('scope="sbx"', www)
        for path in ("/.well-known/oauth-protected-resource/mcp",
                     "/.well-known/oauth-protected-resource"):
            status, hdrs, prm = self.json_request("GET", path)
            self.assertEqual(status, 200)
            self.assertEqual(prm["resource"], self.mcp_url)
            self.assertEqual(prm["authorization_servers"], [self.base])
            self.assertEqual(prm["bearer_methods_supported"], ["header"])
            self.assertEqual(prm["scopes_supported"], ["sbx"])
        status, hdrs, md = self.json_request("GET", "/.well-known/oauth-authorization-server")
        self.assertEqual(status, 200)
        self.assertEqual(md["issuer"], self.base)
        for k, v in (("authorization_endpoint", "/oauth/authorize"),
                     ("token_endpoint", "/oauth/token"),
                     ("registration_endpoint", "/oauth/register"),
                     ("revocation_endpoint", "/oauth/revoke")):
            self.assertEqual(md[k], self.base + v)
        self.assertEqual(md["response_types_supported"], ["code"])
        self.assertEqual(md["grant_types_supported"], ["authorization_code", "refresh_token"])
        self.assertEqual(md["code_challenge_methods_supported"], ["S256"])
        self.assertEqual(md["token_endpoint_auth_methods_supported"], ["none"])
        self.assertEqual(md["scopes_supported"], ["sbx"])
        self.assertIs(md["client_id_metadata_document_supported"], True)
        self.assertEqual(hdrs.get("cache-control"), "no-store")

    # -- registration ----------------------------------------------------------
    def test_registration_validates(self):
        cases = [
            ({"redirect_uris": [REDIRECT]}, "invalid_client_metadata", "client_name"),
            ({"client_name": "", "redirect_uris": [REDIRECT]}, "invalid_client_metadata",
             "client_name"),
            ({"client_name": "x" * 101, "redirect_uris": [REDIRECT]},
             "invalid_client_metadata", "client_name"),
            ({"client_name": "A\nB", "redirect_uris": [REDIRECT]}, "invalid_client_metadata",
             "one line"),
            ({"client_name": "A"}, "invalid_redirect_uri", "redirect_uris"),
            ({"client_name": "A", "redirect_uris": []}, "invalid_redirect_uri", "redirect_uris"),
            ({"client_name": "A", "redirect_uris": ["http://example.com/cb"]},
             "invalid_redirect_uri", "not loopback"),
            ({"client_name": "A", "redirect_uris": ["javascript:alert(1)"]},
             "invalid_redirect_uri", "https"),
            ({"client_name": "A", "redirect_uris": ["https://a.example/cb#x"]},
             "invalid_redirect_uri", "fragment"),
            ({"client_name": "A", "redirect_uris": [REDIRECT],
              "token_endpoint_auth_method": "client_secret_basic"},
             "invalid_client_metadata", "none"),
            ({"client_name": "A", "redirect_uris": [REDIRECT], "grant_types": ["password"]},
             "invalid_client_metadata", "grant_types"),
        ]
        for body, error, words in cases:
            status, _, answer = self.json_request("POST", "/oauth/register", body)
            self.assertEqual(status, 400, (body, answer))
            self.assertEqual(answer["error"], error, (body, answer))
            self.assertIn(words, answer["error_description"], (body, answer))
        status, _, answer = self.json_request("POST", "/oauth/register", "not json")
        self.assertEqual((status, answer["error"]), (400, "invalid_client_metadata"))
        status, _, answer = self.json_request(
            "POST", "/oauth/register",
            {"client_name": "Claude", "redirect_uris": ["https://claude.ai/api/mcp/auth_callback",
                                                        "http://localhost:6274/cb"]})
        self.assertEqual(status, 201, answer)
        self.assertTrue(answer["client_id"].startswith("cli_"))
        self.assertEqual(answer["token_endpoint_auth_method"], "none")
        self.assertEqual(len(answer["redirect_uris"]), 2)

    # -- the flow --------------------------------------------------------------
    def test_full_flow_then_mcp_not_rest(self):
        client_id, tokens = self.tokens_for(self.register("Flow Client"))
        self.assertEqual(tokens["token_type"], "Bearer")
        self.assertEqual(tokens["expires_in"], ACCESS_TTL_S)
        self.assertTrue(tokens["access_token"].startswith("sbx_at_"))
        self.assertTrue(tokens["refresh_token"].startswith("sbx_rt_"))
        status, hdrs, body = self.mcp(tokens["access_token"])
        self.assertEqual(status, 200, body)
        session = hdrs["mcp-session-id"]
        status, _, body = self.mcp(tokens["access_token"],
                                   {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["result"]["tools"]), 22)
        self.assertTrue(session)
        # A tool call reaches the broker as the account (the connection as the key).
        status, _, body = self.mcp(tokens["access_token"], {
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "list_sandboxes", "arguments": {}}})
        self.assertEqual(status, 200, body)
        self.assertFalse(body["result"].get("isError"), body)
        # The REST API refuses OAuth tokens, saying what to use instead.
        status, _, raw = self.s.https("GET", "/v1/sandboxes", headers={
            "Authorization": f"Bearer {tokens['access_token']}"})
        self.assertEqual(status, 401)
        answer = json.loads(raw)
        self.assertEqual(answer["error"]["code"], "unauthenticated")
        self.assertIn("OAuth access tokens work on /mcp only", answer["error"]["message"])
        self.assertIn("sbx key create", answer["error"]["message"])
        # The connection is in the key list, named after the client.
        keys = self.s.cli_json("key", "list", "--account", "alice@example.com")["keys"]
        names = [k["name"] for k in keys if k["kind"] == "connection"]
        self.assertEqual(names.count("Flow Client (MCP)"), 1, names)
        # Allowing the same client again keeps one connection for it.
        self.tokens_for(client_id)
        keys = self.s.cli_json("key", "list", "--account", "alice@example.com")["keys"]
        names = [k["name"] for k in keys if k["kind"] == "connection"]
        self.assertEqual(names.count("Flow Client (MCP)"), 1, names)

    def test_refresh_rotates_and_reuse_revokes_the_grant(self):
        client_id, first = self.tokens_for()
        status, _, second = self.token(grant_type="refresh_token", client_id=client_id,
                                       refresh_token=first["refresh_token"])
        self.assertEqual(status, 200, second)
        self.assertNotEqual(second["refresh_token"], first["refresh_token"])
        self.assertEqual(self.mcp(second["access_token"])[0], 200)
        # Another client can't use it.
        status, _, answer = self.token(grant_type="refresh_token", client_id="cli_other",
                                       refresh_token=second["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))
        # The rotated one again: refused, and the whole grant is revoked.
        status, _, answer = self.token(grant_type="refresh_token", client_id=client_id,
                                       refresh_token=first["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))
        self.assertIn("used already", answer["error_description"])
        wait_for(lambda: self.mcp_refused(second["access_token"]), 5,
                 "the grant's access token refused")
        status, _, answer = self.token(grant_type="refresh_token", client_id=client_id,
                                       refresh_token=second["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))

    def test_code_replay_revokes_its_tokens(self):
        client_id = self.register()
        verifier, challenge = pkce()
        code = self.code_from(self.sign_in_and_allow(Browser(self.s),
                                                     self.authorize_url(client_id, challenge)))
        form = dict(grant_type="authorization_code", code=code, code_verifier=verifier,
                    client_id=client_id, redirect_uri=REDIRECT)
        status, _, tokens = self.token(**form)
        self.assertEqual(status, 200, tokens)
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        status, _, answer = self.token(**form)
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))
        self.assertIn("used already", answer["error_description"])
        wait_for(lambda: self.mcp_refused(tokens["access_token"]), 5, "replay revoked the token")
        status, _, answer = self.token(grant_type="refresh_token", client_id=client_id,
                                       refresh_token=tokens["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))

    def test_revoke(self):
        client_id, tokens = self.tokens_for()
        status, _, answer = self.json_request("POST", "/oauth/revoke",
                                              form={"token": "sbx_at_unknown"})
        self.assertEqual(status, 200, answer)
        status, _, answer = self.json_request("POST", "/oauth/revoke", form={})
        self.assertEqual((status, answer["error"]), (400, "invalid_request"))
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        status, _, _ = self.json_request("POST", "/oauth/revoke",
                                         form={"token": tokens["access_token"],
                                               "token_type_hint": "access_token"})
        self.assertEqual(status, 200)
        # Refused from the very next request: the gateway that revoked forgot it (issue 13).
        self.assertTrue(self.mcp_refused(tokens["access_token"]), "revoked token still works")
        # Revoking the refresh token ends the grant's refreshes.
        status, _, _ = self.json_request("POST", "/oauth/revoke",
                                         form={"token": tokens["refresh_token"]})
        self.assertEqual(status, 200)
        status, _, answer = self.token(grant_type="refresh_token", client_id=client_id,
                                       refresh_token=tokens["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))

    def test_disconnect_stops_the_tokens(self):
        _, tokens = self.tokens_for(self.register("Disconnect Me"))
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        keys = self.s.cli_json("key", "list", "--account", "alice@example.com")["keys"]
        conn = [k for k in keys if k["name"] == "Disconnect Me (MCP)"]
        self.assertEqual(len(conn), 1, keys)
        self.assertEqual(conn[0]["kind"], "connection")
        self.s.cli("key", "revoke", conn[0]["id"])
        # The gateway trusts an access token for one second without asking again.
        wait_for(lambda: self.mcp_refused(tokens["access_token"]), 3, "disconnected token refused")
        status, _, answer = self.token(grant_type="refresh_token",
                                       client_id=self.register(), refresh_token=tokens["refresh_token"])
        self.assertEqual((status, answer["error"]), (400, "invalid_grant"))

    def test_connections_over_rest(self):
        """The REST key list shows connections; DELETE /v1/keys/{id} disconnects one."""
        _, tokens = self.tokens_for(self.register("Rest Listed"))
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        auth = {"Authorization": f"Bearer {self.api_key}"}
        status, _, body = self.s.https("GET", "/v1/keys", headers=auth)
        self.assertEqual(status, 200, body)
        conn = [k for k in json.loads(body)["keys"] if k["name"] == "Rest Listed (MCP)"]
        self.assertEqual(len(conn), 1, body)
        self.assertEqual((conn[0]["kind"], conn[0]["revoked"]), ("connection", False))
        self.assertNotIn("preset", conn[0])
        # The token itself may not manage keys: /v1 is for API keys.
        status, _, _ = self.s.https("DELETE", f"/v1/keys/{conn[0]['id']}",
                                    headers={"Authorization": f"Bearer {tokens['access_token']}"})
        self.assertEqual(status, 401)
        status, _, body = self.s.https("DELETE", f"/v1/keys/{conn[0]['id']}", headers=auth)
        self.assertEqual(status, 200, body)
        self.assertTrue(self.mcp_refused(tokens["access_token"]), "disconnected token still works")

    def test_expired_access_token(self):
        _, tokens = self.tokens_for()
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        time.sleep(ACCESS_TTL_S + 1)
        self.assertEqual(self.mcp(tokens["access_token"])[0], 401)

    # -- the negative matrix ---------------------------------------------------
    def assert_redirect_error(self, response, error, state="st-123"):
        status, hdrs, body = response
        self.assertEqual(status, 302, body)
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(hdrs["location"]).query))
        self.assertTrue(hdrs["location"].startswith(REDIRECT + "?"), hdrs["location"])
        self.assertEqual(q.get("error"), error, q)
        self.assertEqual(q.get("state"), state)
        self.assertNotIn("code", q)
        return q

    def test_authorize_refusals(self):
        client_id = self.register()
        verifier, challenge = pkce()
        b = Browser(self.s)
        # Missing PKCE, plain method: redirected errors (the redirect URI is trusted).
        self.assert_redirect_error(
            b.request("GET", self.authorize_url(client_id, None)), "invalid_request")
        self.assert_redirect_error(
            b.request("GET", self.authorize_url(client_id, verifier,
                                                code_challenge_method="plain")),
            "invalid_request")
        self.assert_redirect_error(
            b.request("GET", self.authorize_url(client_id, challenge, response_type="token")),
            "unsupported_response_type")
        # Wrong resource.
        self.assert_redirect_error(
            b.request("GET", self.authorize_url(client_id, challenge,
                                                resource="https://evil.example/mcp")),
            "invalid_target")
        # Redirect mismatch and unknown client: a page, never a redirect.
        for url in (self.authorize_url(client_id, challenge,
                                       redirect="http://127.0.0.1:9/other"),
                    self.authorize_url(client_id, challenge,
                                       redirect="https://evil.example/callback"),
                    self.authorize_url("cli_unknown0000", challenge)):
            status, hdrs, page = b.request("GET", url)
            self.assertEqual(status, 400, page)
            self.assertNotIn("location", hdrs)
            self.assertIn("text/html", hdrs["content-type"])
        status, _, page = b.request("GET", self.authorize_url("cli_unknown0000", challenge))
        self.assertIn("Unknown app", page)
        # Deny: access_denied with the state.
        self.assert_redirect_error(
            self.sign_in_and_allow(Browser(self.s), self.authorize_url(client_id, challenge),
                                   action="deny"), "access_denied")

    def test_sign_in_and_csrf(self):
        client_id = self.register("CSRF Client")
        verifier, challenge = pkce()
        url = self.authorize_url(client_id, challenge)
        b = Browser(self.s)
        status, hdrs, page = b.request("GET", url)
        self.assertEqual(status, 200)
        self.assertIn("CSRF Client", page)
        self.assertIn("frame-ancestors 'none'", hdrs["content-security-policy"])
        form = dict(Forms(page).forms[0]["fields"], email="alice@example.com",
                    password=PASSWORD, action="signin")
        self.assertTrue(form["csrf"])
        # Without the token, with a forged one, or without the cookie: refused.
        for fields, keep_cookie in ((dict(form, csrf=""), True),
                                    (dict(form, csrf="A" * 43), True),
                                    (form, False)):
            other = Browser(self.s)
            if keep_cookie:
                other.cookies = dict(b.cookies)
            status, hdrs, page = other.request("POST", "/oauth/authorize", form=fields)
            self.assertEqual(status, 403, page)
            self.assertNotIn("location", hdrs)
            self.assertNotIn("__Host-sbx_session", other.cookies)
        # A wrong password: the form again, with a message, no session.
        status, _, page = b.request("POST", "/oauth/authorize", form=dict(form, password="nope"))
        self.assertEqual(status, 200)
        self.assertIn("Wrong email or password", page)
        self.assertNotIn("__Host-sbx_session", b.cookies)
        status, _, page = b.request("POST", "/oauth/authorize",
                                    form=dict(form, email="nobody@example.com"))
        self.assertIn("Wrong email or password", page)
        # Allow without the CSRF token is refused too, even signed in.
        status, _, page = b.request("POST", "/oauth/authorize", form=form)
        self.assertEqual(status, 200)
        consent = Forms(page).forms[0]
        self.assertIn(("action", "allow"), consent["buttons"])
        status, hdrs, page = b.request("POST", "/oauth/authorize",
                                       form=dict(consent["fields"], csrf="", action="allow"))
        self.assertEqual(status, 403)
        self.assertNotIn("location", hdrs)
        # Signed in, the next authorization goes straight to consent.
        status, _, page = b.request("GET", url)
        self.assertIn(("action", "allow"), Forms(page).forms[0]["buttons"])

    def test_sign_in_is_throttled(self):
        """Ten wrong passwords for an email, and even the right one is refused for a while."""
        self.s.cli("account", "create", "--email", "bob@example.com", "--password-stdin",
                   input=PASSWORD + "\n")
        b = Browser(self.s)
        status, _, page = b.request("GET", "/account")
        form = dict(Forms(page).forms[0]["fields"], email="bob@example.com", action="signin")
        for _ in range(10):
            status, _, page = b.request("POST", "/account", form=dict(form, password="guess"))
            self.assertIn("Wrong email or password", page)
        status, _, page = b.request("POST", "/account", form=dict(form, password=PASSWORD))
        self.assertEqual(status, 429, page)
        self.assertIn("Too many wrong passwords", page)
        self.assertNotIn("__Host-sbx_session", b.cookies)
        # Another account is not affected.
        status, hdrs, _ = b.request("POST", "/account", form=dict(
            form, email="alice@example.com", password=PASSWORD))
        self.assertEqual(status, 303)

    def test_token_refusals(self):
        client_id = self.register()
        verifier, challenge = pkce()
        code = self.code_from(self.sign_in_and_allow(Browser(self.s),
                                                     self.authorize_url(client_id, challenge)))
        base = dict(grant_type="authorization_code", code=code, code_verifier=verifier,
                    client_id=client_id, redirect_uri=REDIRECT)
        cases = [
            (dict(base, code_verifier=None), 400, "invalid_request"),
            (dict(base, code_verifier=pkce()[0]), 400, "invalid_grant"),
            (dict(base, redirect_uri="http://127.0.0.1:9/other"), 400, "invalid_grant"),
            (dict(base, client_id="cli_unknown0000"), 400, "invalid_grant"),
            (dict(base, resource="https://evil.example/mcp"), 400, "invalid_target"),
            (dict(base, grant_type="password"), 400, "unsupported_grant_type"),
            (dict(base, grant_type=None), 400, "invalid_request"),
            (dict(base, code="sbx_ac_forged"), 400, "invalid_grant"),
        ]
        for form, status_want, error in cases:
            form = {k: v for k, v in form.items() if v is not None}
            status, hdrs, answer = self.token(**form)
            self.assertEqual((status, answer["error"]), (status_want, error), (form, answer))
            self.assertEqual(hdrs.get("cache-control"), "no-store")
        # None of the refusals used the code up.
        status, _, tokens = self.token(**base)
        self.assertEqual(status, 200, tokens)

    # -- client ID metadata documents -----------------------------------------
    def serve_document(self, make_doc):
        """Serves make_doc(url) as JSON over HTTPS with the installation's certificate."""
        test = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(make_doc(test.doc_url(self.path))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(self.s.dir, "tls", "server.crt"),
                            os.path.join(self.s.dir, "tls", "server.key"))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        self.doc_port = server.server_address[1]
        return server

    def doc_url(self, path):
        return f"https://localhost:{self.doc_port}{path}"

    def test_client_id_metadata_document(self):
        self.serve_document(lambda url: {
            "client_id": url if "/good" in url else "https://other.example/x",
            "client_name": "Doc Client", "redirect_uris": [REDIRECT]})
        client_id = self.doc_url("/good/client.json")
        verifier, challenge = pkce()
        b = Browser(self.s)
        status, _, page = b.request("GET", self.authorize_url(client_id, challenge))
        self.assertEqual(status, 200, page)
        self.assertIn("Doc Client", page)
        code = self.code_from(self.sign_in_and_allow(b, self.authorize_url(client_id, challenge)))
        status, _, tokens = self.token(grant_type="authorization_code", code=code,
                                       code_verifier=verifier, client_id=client_id,
                                       redirect_uri=REDIRECT)
        self.assertEqual(status, 200, tokens)
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        # Only the document's redirect URIs are accepted.
        status, hdrs, page = b.request("GET", self.authorize_url(
            client_id, challenge, redirect="http://127.0.0.1:9/elsewhere"))
        self.assertEqual(status, 400)
        self.assertNotIn("location", hdrs)
        # A document whose client_id is not its URL is refused.
        status, hdrs, page = b.request("GET", self.authorize_url(
            self.doc_url("/bad/client.json"), challenge))
        self.assertEqual(status, 400, page)
        self.assertIn("client_id is not its own URL", page)
        # Plain http client ids are not documents: unknown.
        status, _, page = b.request("GET", self.authorize_url(
            f"http://localhost:{self.doc_port}/good/client.json", challenge))
        self.assertEqual(status, 400)

    # -- the account page ------------------------------------------------------
    def test_account_page(self):
        _, tokens = self.tokens_for(self.register("Page Client"))
        b = Browser(self.s)
        status, _, page = b.request("GET", "/account")
        self.assertEqual(status, 200)
        form = Forms(page).forms[0]
        self.assertIn(("action", "signin"), form["buttons"])
        fields = dict(form["fields"], email="alice@example.com", password=PASSWORD,
                      action="signin")
        status, _, _ = b.request("POST", "/account", form=dict(fields, csrf=""))
        self.assertEqual(status, 403)
        status, _, page = b.request("POST", "/account", form=dict(fields, password="nope"))
        self.assertIn("Wrong email or password", page)
        status, hdrs, _ = b.request("POST", "/account", form=fields)
        self.assertEqual((status, hdrs.get("location")), (303, "/account"))
        status, _, page = b.request("GET", "/account")
        self.assertEqual(status, 200, page)
        self.assertIn("alice@example.com", page)
        self.assertIn("Page Client (MCP)", page)
        # Usage and wallets, as billing has them, live: a funded wallet made active shows.
        self.assertIn("<h2>Usage and wallets</h2>", page)
        self.assertRegex(page, r"Running time: \d+ s, costing \$\d+\.\d{6}")
        acct = ["--account", "alice@example.com"]
        self.s.cli_json("wallet", "add", *acct, "--usd", "1.5", "--wallet", "team")
        self.s.cli_json("wallet", "use", *acct, "--wallet", "team")
        shown = '<strong id="balance">$1.500000</strong>'
        wait_for(lambda: shown in b.request("GET", "/account")[2], 15,
                 "the account page showing the new wallet's balance")
        status, _, page = b.request("GET", "/account")
        self.assertIn("<tr><td>team</td><td>$1.500000</td><td>active: charges go here</td></tr>",
                      page)
        forms = Forms(page).forms
        # Disconnect the client: its token stops.
        disconnect = [f for f in forms if ("action", "revoke") in f["buttons"] and
                      f["fields"]["key_id"] in page.split("Page Client (MCP)", 1)[1][:200]]
        self.assertEqual(len(disconnect), 1, page)
        self.assertIn(">Disconnect<", page)
        self.assertEqual(self.mcp(tokens["access_token"])[0], 200)
        status, hdrs, _ = b.request("POST", "/account",
                                    form=dict(disconnect[0]["fields"], action="revoke"))
        self.assertEqual(status, 303)
        self.assertTrue(self.mcp_refused(tokens["access_token"]), "disconnected token still works")
        # Create a key: shown once, and it works on the REST API; then revoke it.
        create = [f for f in forms if ("action", "create") in f["buttons"]][0]
        status, _, page = b.request("POST", "/account", form=dict(
            create["fields"], name="page key", preset="read-only", action="create"))
        self.assertEqual(status, 200, page)
        key = page.split('<pre id="new-key"><code>', 1)[1].split("<", 1)[0]
        self.assertTrue(key.startswith("sbx_"), key)
        status, _, _ = self.s.https("GET", "/v1/sandboxes",
                                    headers={"Authorization": f"Bearer {key}"})
        self.assertEqual(status, 200)
        keys = self.s.cli_json("key", "list", "--account", "alice@example.com")["keys"]
        made = [k for k in keys if k["name"] == "page key"]
        self.assertEqual((len(made), made[0]["preset"]), (1, "read-only"))
        status, _, page = b.request("GET", "/account")
        revoke = [f for f in Forms(page).forms if f["fields"].get("key_id") == made[0]["id"]]
        status, _, _ = b.request("POST", "/account", form=dict(revoke[0]["fields"], action="revoke"))
        self.assertEqual(status, 303)
        # Another browser without the session cannot act, even with a good CSRF pair.
        other = Browser(self.s)
        other.cookies = {"__Host-sbx_csrf": b.cookies["__Host-sbx_csrf"]}
        status, _, page = other.request("POST", "/account", form=dict(revoke[0]["fields"],
                                                                      action="revoke"))
        self.assertIn("sign in again", page)
        # Sign out.
        status, _, page = b.request("GET", "/account")
        out = [f for f in Forms(page).forms if ("action", "signout") in f["buttons"]][0]
        status, _, _ = b.request("POST", "/account", form=dict(out["fields"], action="signout"))
        self.assertEqual(status, 303)
        status, _, page = b.request("GET", "/account")
        self.assertIn(("action", "signin"), Forms(page).forms[0]["buttons"])

    # -- real clients from npm -------------------------------------------------
    def run_node(self, mode):
        node, npm = shutil.which("node"), shutil.which("npm")
        self.assertTrue(node and npm, "node and npm are needed for the OAuth client tests")
        work = os.path.join(os.environ.get("SBX_BIN", os.getcwd()), "..", "oauth-client")
        os.makedirs(work, exist_ok=True)
        place(os.path.join(HERE, "oauth", "package.json"), work)
        place(os.path.join(HERE, "oauth_client.mjs"), work)
        npm_install(work, lambda: (
            os.path.isdir(os.path.join(work, "node_modules", "oauth4webapi")) and
            os.path.isdir(os.path.join(work, "node_modules", "@modelcontextprotocol"))))
        env = dict(os.environ, NODE_EXTRA_CA_CERTS=self.s.status()["ca_cert"])
        res = subprocess.run([node, os.path.join(work, "oauth_client.mjs"), mode, self.mcp_url,
                              "alice@example.com", PASSWORD], capture_output=True, text=True,
                             timeout=300, env=env)
        print(f"\n{mode} client:\n" + res.stdout[-4000:] + res.stderr[-4000:])
        self.assertEqual(res.returncode, 0, res.stdout[-2000:] + res.stderr[-2000:])
        steps = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        self.assertEqual(steps[-1]["step"], "done")
        return {s["step"]: s for s in steps}

    def test_oauth4webapi_client(self):
        """401 → metadata → registration → authorize (forms) → code with PKCE → tools/list →
        refresh → revoke → 401, with oauth4webapi doing the client's side."""
        steps = self.run_node("oauth4webapi")
        self.assertEqual(steps["discover"]["issuer"], self.base)
        self.assertEqual(steps["tools"]["count"], 22)
        self.assertEqual(steps["refreshed"]["tools"], 22)
        self.assertEqual(steps["revoked"]["status"], 401)

    def test_mcp_sdk_oauth_provider(self):
        """The MCP TypeScript SDK's own OAuth client provider against /mcp."""
        steps = self.run_node("sdk")
        self.assertEqual(steps["tools"]["count"], 22)


if __name__ == "__main__":
    main()
