"""Accounts, the operator's way (issue 18 item 5): `sbx account list|get|passwd|disable|
enable|delete` against the real service under `sbx up`, signing in over HTTPS on /account
as a browser would, one real guest (TCG here: slow, so only one).

The admin's first-run password from sbx up's banner signs in; two accounts are made and
listed; a new password replaces the old one on the sign-in page; a disabled account's key
gets 401 on REST and MCP (the MCP body says why), its sign-in is refused saying so, its
running sandbox is stopped by the broker and nothing of it starts, and enabling brings the
key back; `--account` filters every listing that takes it; deleting that account takes
its (stopped) sandbox, its snapshots and its key, leaves billing's ledger, and
frees its email; the last admin account is not deleted."""
import json
import os
import re
import unittest

from sbxtest import BIN, Sbx, main, mcp_post, MCP_INIT, wait_for
from test_oauth import Browser, Forms

ANN_PASSWORD = "ann's first password"
BOB_PASSWORD = "bob's first password"


def sign_in(s, email, password):
    """Signs in on /account: (status, page) of the POST's answer, and the browser."""
    b = Browser(s)
    status, _, page = b.request("GET", "/account")
    assert status == 200, page
    form = Forms(page).forms[0]
    fields = dict(form["fields"], email=email, password=password, action="signin")
    status, hdrs, page = b.request("POST", "/account", form=fields)
    return status, page, b


class AccountsTest(unittest.TestCase):
    def refused(self, res, code, text):
        self.assertNotEqual(res.returncode, 0, res.stdout)
        self.assertIn(f"({code})", res.stderr)
        self.assertIn(text, res.stderr)

    def rest(self, s, key, path="/v1/sandboxes"):
        status, _, body = s.https("GET", path, headers={"Authorization": f"Bearer {key}"})
        return status, json.loads(body) if body else None

    def test_accounts(self):
        s = Sbx(self, "accounts", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image"))})
        s.up()
        # The admin's password, made at the first run and shown once beside its key.
        banner = wait_for(lambda: "admin password:" in s.output() and s.output(), 30,
                          "sbx up's banner")
        found = re.search(r"admin password:\s+(\S+)\s+\(shown only now\)", banner)
        self.assertTrue(found, banner)
        admin_password = found.group(1)
        self.assertIn("sbx account passwd admin@localhost", banner)
        status, page, _ = sign_in(s, "admin@localhost", admin_password)
        self.assertEqual(status, 303, page)

        # Two accounts, listed (oldest first) and read one by one.
        ann = s.cli_json("account", "create", "--email", "ann@example.com", "--password-stdin",
                         input=ANN_PASSWORD + "\n")
        bob = s.cli_json("account", "create", "--email", "bob@example.com", "--no-key",
                         "--password-stdin", input=BOB_PASSWORD + "\n")
        accounts = s.cli_json("account", "list")["accounts"]
        self.assertEqual([a["email"] for a in accounts],
                         ["admin@localhost", "ann@example.com", "bob@example.com"])
        self.assertEqual([a["admin"] for a in accounts], [True, False, False])
        self.assertEqual({a["state"] for a in accounts}, {"active"})
        listed = s.cli("account", "list").stdout
        self.assertIn("ann@example.com", listed)
        self.assertIn("SANDBOXES", listed)
        got = s.cli_json("account", "get", "ann@example.com")
        self.assertEqual((got["account_id"], got["keys"], got["sandboxes"], got["password"]),
                         (ann["account_id"], 1, 0, True))
        self.assertEqual(s.cli_json("account", "get", bob["account_id"])["keys"], 0)
        res = s.cli("account", "get", "nobody@example.com", check=False)
        self.refused(res, "not_found", "no account 'nobody@example.com'")
        self.assertEqual(s.cli("account", "get", check=False).returncode, 2)

        # A new password for bob: the old one is wrong from now on, the new one signs in.
        res = s.cli("account", "passwd", "bob@example.com", "--password-stdin", input="short\n",
                    check=False)
        self.assertEqual(res.returncode, 2)
        self.assertIn("at least 8 characters", res.stderr)
        s.cli("account", "passwd", "bob@example.com", "--password-stdin",
              input="bob's second password\n")
        status, page, _ = sign_in(s, "bob@example.com", BOB_PASSWORD)
        self.assertIn("Wrong email or password", page)
        status, page, _ = sign_in(s, "bob@example.com", "bob's second password")
        self.assertEqual(status, 303, page)

        # Ann's sandbox, and her key on REST and MCP.
        sb = s.cli_json("sandbox", "create", "--account", "ann@example.com", timeout=300)
        self.assertEqual(sb["state"], "ready")
        key = ann["api_key"]
        self.assertEqual(self.rest(s, key)[0], 200)
        self.assertEqual(mcp_post(s, key, MCP_INIT)[0], 200)
        # --account filters every listing that takes it.
        def ids(who):
            return [x["id"] for x in s.cli_json("sandbox", "list", "--account", who)["sandboxes"]]
        self.assertEqual(ids("ann@example.com"), [sb["id"]])
        self.assertEqual(ids("bob@example.com"), [])
        self.assertEqual(len(s.cli_json("key", "list", "--account", "ann@example.com")["keys"]),
                         1)
        self.assertEqual(s.cli_json("key", "list", "--account", "bob@example.com")["keys"], [])
        self.assertEqual(s.cli_json("usage", "--account", "bob@example.com")["sandboxes"], [])
        self.assertEqual(s.cli_json("snapshot", "list", "--account", "bob@example.com"),
                         {"snapshots": []})

        # Disabled: the key is refused at once on both, MCP's 401 saying why; her sign-in
        # is refused saying so; the broker stops her sandbox (memory kept); nothing starts.
        out = s.cli("account", "disable", "ann@example.com").stdout
        self.assertIn("is disabled", out)
        self.assertIn("sbx account enable ann@example.com", out)
        status, body = self.rest(s, key)
        self.assertEqual((status, body["error"]["code"]), (401, "unauthenticated"))
        status, _, body = mcp_post(s, key, MCP_INIT)
        self.assertEqual(status, 401)
        self.assertIn("account disabled: ", body["error"]["message"])
        self.assertIn("ann@example.com", body["error"]["message"])
        status, page, _ = sign_in(s, "ann@example.com", ANN_PASSWORD)
        self.assertEqual(status, 403)
        self.assertIn("This account is disabled", page)
        status, page, _ = sign_in(s, "ann@example.com", "not her password")
        self.assertIn("Wrong email or password", page)  # no hint without the password
        self.assertEqual(s.cli_json("account", "get", "ann@example.com")["state"], "disabled")

        def stopped():
            got = s.cli_json("sandbox", "get", sb["id"])
            return got if got["state"] == "stopped" else None
        got = wait_for(stopped, 180, "the disabled account's sandbox stopped")
        self.assertEqual(got["reason"], "account disabled")
        res = s.cli("sandbox", "resume", sb["id"], check=False, timeout=300)
        self.refused(res, "failed_precondition", "ann@example.com is disabled")
        res = s.cli("sandbox", "create", "--account", "ann@example.com", check=False,
                    timeout=300)
        self.refused(res, "failed_precondition", "sbx account enable ann@example.com")

        # Enabled: the key works again (the sandbox stays stopped).
        self.assertEqual(s.cli_json("account", "enable", "ann@example.com")["state"], "active")
        self.assertEqual(self.rest(s, key)[0], 200)
        self.assertEqual(mcp_post(s, key, MCP_INIT)[0], 200)
        snapshots = wait_for(lambda: s.cli_json("snapshot", "list", "--account",
                                                "ann@example.com")["snapshots"], 120,
                             "the stop's automatic snapshot")
        self.assertEqual({x["kind"] for x in snapshots}, {"automatic"})
        kept = s.cli_json("snapshot", "save", sb["id"], "--name", "kept", timeout=300)
        self.assertEqual(kept["state"], "ready")

        # The last admin account is not deleted, and nothing of it was touched.
        res = s.cli("account", "delete", "admin@localhost", check=False)
        self.refused(res, "conflict", "is the only admin account")
        self.assertEqual(s.cli_json("account", "get", "admin@localhost")["state"], "active")

        # Deleted: her sandbox, snapshot and key go (progress on stderr), the ledger stays,
        # her email is free again.
        res = s.cli("account", "delete", "ann@example.com", "--json", timeout=600)
        print(res.stderr)
        gone = json.loads(res.stdout)
        self.assertEqual((gone["account_id"], gone["email"], gone["sandboxes"]),
                         (ann["account_id"], "ann@example.com", 1))
        # The user's snapshot at least (the broker may release the automatic one first).
        self.assertGreaterEqual(gone["snapshots"], 1)
        self.assertEqual(gone["keys_revoked"], 1)
        self.assertIn(f"deleting sandbox {sb['id']}", res.stderr)
        self.assertIn(f"deleting snapshot {kept['id']}", res.stderr)
        self.assertNotIn(sb["id"], [x["id"] for x in s.cli_json("sandbox", "list")["sandboxes"]])
        self.assertEqual(self.rest(s, key)[0], 401)
        self.assertNotIn(ann["account_id"],
                         [x.get("account") for x in s.cli_json("snapshot", "list")["snapshots"]])
        res = s.cli("account", "get", ann["account_id"], check=False)
        self.refused(res, "not_found", "no account")
        res = s.cli("key", "list", "--account", "ann@example.com", check=False)
        self.refused(res, "not_found", "no account")
        usage = s.cli_json("usage", "--account", ann["account_id"])
        self.assertEqual([x["sandbox_id"] for x in usage["sandboxes"]], [sb["id"]])
        self.assertGreater(usage["sandboxes"][0]["running_ms"], 0)
        events = s.cli("tap", "--since", "0", "--once", timeout=30).stdout
        for kind in ("account.disabled", "account.enabled", "account.password_changed",
                     "account.deleted"):
            self.assertIn(f'"{kind}"', events)
        self.assertEqual([a["email"] for a in s.cli_json("account", "list")["accounts"]],
                         ["admin@localhost", "bob@example.com"])
        again = s.cli_json("account", "create", "--email", "ann@example.com", "--no-key")
        self.assertNotEqual(again["account_id"], ann["account_id"])
        # Deleting an account without sandboxes needs no guest.
        res = s.cli("account", "delete", "bob@example.com")
        self.assertIn("is deleted: 0 sandboxes, 0 snapshots", res.stdout)


if __name__ == "__main__":
    main()
