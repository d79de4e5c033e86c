"""Plan limits and wallets with real guests (issue 6, item 5): a tiny free plan in
sbx.conf hit through `sbx sandbox create/resume` (the CLI creates as an operator for an
account: the account's plan applies all the same), and a small wallet.initial running
out while a sandbox runs."""
import datetime
import unittest

from sbxtest import Sbx, main, wait_for


def refused(test, res, code, text):
    test.assertNotEqual(res.returncode, 0, res.stdout)
    test.assertIn(f"({code})", res.stderr)
    test.assertIn(text, res.stderr)


def when(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LimitsTest(unittest.TestCase):
    def test_plan_limits(self):
        s = Sbx(self, "limits", settings={"plan.free.running": 1,
                                          "plan.free.starts_per_day": 2,
                                          "plan.free.ttl_max_s": 600})
        s.up()
        s.cli_json("account", "create", "--email", "ann@example.com", "--no-key")
        acct = ["--account", "ann@example.com"]
        # TTL over the plan's maximum, named; none asked gets the default (1 h, bounded).
        res = s.cli("sandbox", "create", *acct, "--ttl", "20m", check=False)
        refused(self, res, "invalid_argument", "over the free plan's maximum of 600 seconds")
        sb = s.cli_json("sandbox", "create", *acct, timeout=300)
        self.assertEqual(sb["state"], "ready")
        # The free default (1 h) is bounded by this plan's maximum: 600 s from creation.
        self.assertEqual(when(sb["expiresAt"]) - when(sb["createdAt"]), 600)
        # One running at once.
        res = s.cli("sandbox", "create", *acct, check=False, timeout=300)
        refused(self, res, "limit_exceeded", "the free plan allows 1 running sandboxes at once")
        # The resume is the second start of the day; after it, no more.
        s.cli_json("sandbox", "stop", sb["id"], timeout=300)
        self.assertEqual(s.cli_json("sandbox", "resume", sb["id"], timeout=300)["state"],
                         "ready")
        s.cli_json("sandbox", "stop", sb["id"], timeout=300)
        res = s.cli("sandbox", "create", *acct, check=False, timeout=300)
        refused(self, res, "daily_limit_reached",
                "the free plan allows 2 starts per day; the count resets at 00:00 UTC")
        res = s.cli("sandbox", "resume", sb["id"], check=False, timeout=300)
        refused(self, res, "daily_limit_reached", "2 starts per day")
        s.cli_json("sandbox", "delete", sb["id"], timeout=300)

    def test_request_rate_per_key(self):
        import json
        s = Sbx(self, "rate", settings={"plan.free.requests_per_second": 2})
        s.up()
        key = s.cli_json("account", "create", "--email", "rita@example.com")["api_key"]
        auth = {"Authorization": f"Bearer {key}"}
        # REST: a burst past 2 per second gets 429 with the IETF RateLimit fields.
        # Sent together, so a slow (loaded, sanitized) gateway still sees them within the
        # second the budget is for.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: s.https("GET", "/v1/sandboxes", headers=auth),
                                    range(8)))
        codes, limited = [a[0] for a in answers], None
        for status, headers, body in answers:
            if status == 429 and limited is None:
                limited = (headers, json.loads(body))
        self.assertIn(200, codes)
        self.assertIn(429, codes)
        headers, body = limited
        headers = {k.lower(): v for k, v in headers.items()}
        self.assertEqual(body["error"]["code"], "rate_limited")
        self.assertEqual(headers["ratelimit-limit"], "2")
        self.assertEqual(headers["ratelimit-remaining"], "0")
        self.assertGreaterEqual(int(headers["retry-after"]), 1)
        self.assertEqual(headers["retry-after"], headers["ratelimit-reset"])
        # MCP: the same budget, answered as a tool error with the same code.
        import time
        time.sleep(1.5)
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        mcp_headers = dict(auth, **{"Content-Type": "application/json",
                                    "Accept": "application/json, text/event-stream"})
        status, headers, _ = s.https("POST", "/mcp", json.dumps(init), mcp_headers)
        self.assertEqual(status, 200)
        def call(i):
            message = {"jsonrpc": "2.0", "id": 2 + i, "method": "tools/call",
                       "params": {"name": "list_sandboxes", "arguments": {}}}
            return s.https("POST", "/mcp", json.dumps(message), mcp_headers)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(8)))
        texts = []
        for status, _, body in answers:
            self.assertEqual(status, 200)
            texts.append(json.loads(body)["result"]["content"][0]["text"])
        self.assertTrue(any(t.endswith("(rate_limited)") for t in texts), texts)
        self.assertTrue(any(t == "No sandboxes." for t in texts), texts)

    def test_wallet_runs_out(self):
        # 20 µ$ at small's 10 µ$/s: two seconds of running time.
        s = Sbx(self, "wallet", settings={"wallet.initial": 20})
        s.up()
        s.cli_json("account", "create", "--email", "bea@example.com", "--no-key")
        acct = ["--account", "bea@example.com"]
        sb = s.cli_json("sandbox", "create", *acct, timeout=300)
        self.assertEqual(sb["state"], "ready")

        def stopped():
            got = s.cli_json("sandbox", "get", sb["id"])
            return got if got["state"] == "stopped" else None
        got = wait_for(stopped, 60, "the sandbox stopped for want of funds")
        self.assertEqual(got["reason"], "wallet empty")
        res = s.cli("sandbox", "create", *acct, check=False, timeout=300)
        refused(self, res, "insufficient_funds", "the account's wallet is empty; add funds")
        res = s.cli("sandbox", "resume", sb["id"], check=False, timeout=300)
        refused(self, res, "insufficient_funds", "add funds")
        # The broker's log says so once.
        events = s.cli("tap", "--since", "0", "--once", "--json", timeout=30)
        self.assertEqual(events.stdout.count('"account.funds_exhausted"'), 1)
        usage = s.cli_json("usage", "--account", "bea@example.com")
        self.assertLessEqual(usage["balance_micro_usd"], 0)
        before = usage["balance_micro_usd"]
        # An operator funds a second wallet: nothing changes while "main" is the active
        # one. Made active, its funds count: the broker hears they are back, and the
        # sandbox resumes. Each step is an event in the log that billing applies.
        res = s.cli("wallet", "add", *acct, "--usd", "abc", check=False)
        self.assertEqual(res.returncode, 2)
        credit = s.cli_json("wallet", "add", *acct, "--usd", "0.5", "--wallet", "team",
                            "--note", "test top-up")
        self.assertEqual((credit["micro_usd"], credit["wallet"]), (500000, "team"))

        def wallets():
            return {w["name"]: w for w in s.cli_json("wallet", "list", *acct)["wallets"]}
        wait_for(lambda: wallets().get("team", {}).get("balance_micro_usd") == 500000, 30,
                 "billing applying the credit")
        self.assertTrue(wallets()["main"]["active"])
        res = s.cli("sandbox", "resume", sb["id"], check=False, timeout=300)
        refused(self, res, "insufficient_funds", "add funds")
        res = s.cli("wallet", "use", *acct, "--wallet", "Team!", check=False)
        refused(self, res, "invalid_argument", "a wallet's name is 1 to 32 of a-z, 0-9, - and _")
        used = s.cli_json("wallet", "use", *acct, "--wallet", "team")
        self.assertEqual(used["wallet"], "team")
        wait_for(lambda: (lambda r: r.returncode == 0 and r)(
            s.cli("sandbox", "resume", sb["id"], check=False, timeout=300)), 30,
            "a resume accepted once the funds are back")
        self.assertIn('"state":"ready"', s.cli("sandbox", "get", sb["id"], "--json").stdout)
        now = wallets()
        self.assertTrue(now["team"]["active"])
        self.assertFalse(now["main"]["active"])
        self.assertLessEqual(now["main"]["balance_micro_usd"], 0)
        self.assertIn("team", s.cli("wallet", "list", *acct).stdout)
        events = s.cli("tap", "--since", "0", "--once", timeout=30).stdout
        self.assertEqual(events.count('"wallet.credited"'), 1)
        self.assertEqual(events.count('"wallet.activated"'), 1)
        self.assertEqual(events.count('"account.funds_restored"'), 1)

if __name__ == "__main__":
    main()
