"""Several gateways behind one balancer (issue 14): the real broker, vmd and guests under
`sbx up`, two real gateways (then three) and a real HAProxy in front of them, in TCP mode
(TLS goes through to the gateways), round robin, no stickiness. Every client here opens a
new connection for each request, so one client's requests land on every gateway in turn;
every gateway names the balancer's origin (public_url).

What must hold whichever gateway answers:
  - the two reference scenarios through the official MCP SDK, exactly as test_mcp.py
    asserts them with one gateway (the same code: sbxtest.reference_scenarios);
  - an MCP session: made on one gateway, usable on all; ended on one, gone on all; never
    another account's;
  - a session's default sandbox (create_sandbox, then exec without sandboxId);
  - a key's rate: a free-plan key gets its plan's requests per second in all, not that
    much from each gateway.
The balancer's log says which gateway served each connection: the figures are printed."""
import http.client
import json
import os
import re
import signal
import ssl
import threading
import time
import unittest

from sbxtest import (BIN, MCP_INIT, Sbx, free_port, listening_ports, main, reference_scenarios,
                     run_sdk, wait_for)

LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
LIST_SANDBOXES = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                  "params": {"name": "list_sandboxes", "arguments": {}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
PLAN_RATE = 20  # plan.free.requests_per_second's default (common/sbx_config.c)


class EdgeBalanceTest(unittest.TestCase):
    maxDiff = None  # a failure lists every answer that went wrong, and where
    @classmethod
    def setUpClass(cls):
        cls.lb_port = free_port()
        origin = f"https://localhost:{cls.lb_port}"
        # The first gateway is sbx up's: it reads public_url from sbx.conf.
        cls.s = Sbx(cls, "balance", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "public_url": origin})
        cls.gateways = [free_port()]  # listen ports, in the order started
        cls.gateway_logs = {cls.gateways[0]: "sbx-gateway"}
        cls.s.haproxy(cls.gateways, port=cls.lb_port)
        cls.s.up("--listen", f"127.0.0.1:{cls.gateways[0]}")
        cls.add_gateway("gw-two")
        cls.st = cls.s.status()
        cls.ctx = ssl.create_default_context(cafile=cls.st["ca_cert"])

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    @classmethod
    def add_gateway(cls, instance):
        """Starts one more gateway naming the balancer's origin, waits until the broker
        knows it and it listens, then restarts the balancer with every gateway."""
        port = free_port()
        cls.gateway_logs[port] = f"sbx-gateway-extra-{len(cls.s.extra)}"
        cls.s.start("sbx-gateway", "--instance", instance, "--set", f"listen=127.0.0.1:{port}",
                    "--set", f"public_url=https://localhost:{cls.lb_port}")
        cls.gateways.append(port)
        wait_for(lambda: [p["role"] for p in cls.s.status()["peers"]].count("gateway")
                 == len(cls.gateways), 30, f"gateway {instance} registered with the broker")
        wait_for(lambda: port in listening_ports(), 30, f"gateway {instance} listening")
        cls.s.haproxy(cls.gateways)
        print(f"\nbalancer 127.0.0.1:{cls.lb_port} → gateways {cls.gateways}")

    # -- helpers ---------------------------------------------------------------
    def account(self, email):
        return self.s.cli_json("account", "create", "--email", email)

    def lb(self, method, body=None, key=None, sid=None, timeout=200):
        """One request to /mcp through the balancer on a connection of its own: (status,
        lower-cased headers, parsed body, the client's local port: the balancer's log names
        the gateway that served it)."""
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Connection": "close"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        if sid:
            h["Mcp-Session-Id"] = sid
        conn = http.client.HTTPSConnection("localhost", self.lb_port, context=self.ctx,
                                           timeout=timeout)
        try:
            conn.connect()
            local_port = conn.sock.getsockname()[1]
            conn.request(method, "/mcp", body=None if body is None else json.dumps(body),
                         headers=h)
            res = conn.getresponse()
            raw = res.read()
            hdrs = {k.lower(): v for k, v in res.getheaders()}
        finally:
            conn.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return res.status, hdrs, parsed, local_port

    def served_by(self, local_ports, since=0, timeout=10):
        """Which gateway (listen port) served each connection, from the balancer's log
        (its connections from the since-th on: client ports are reused in time)."""
        def all_logged():
            seen = {c["client_port"]: c["server"]
                    for c in self.s.haproxy_connections()[since:]}
            return seen if all(p in seen for p in local_ports) else None
        seen = wait_for(all_logged, timeout, "the balancer logging every connection")
        return [seen[p] for p in local_ports]

    def settled_connections(self, since):
        """The balancer's connections from the since-th on, once its log stopped growing
        (it logs a connection when it ends, just after the client saw its answer)."""
        def settled():
            before = len(self.s.haproxy_connections())
            time.sleep(0.5)
            conns = self.s.haproxy_connections()
            return conns[since:] if len(conns) == before else None
        return wait_for(settled, 10, "the balancer's log settling")

    def gateway_name(self, port):
        return f"gateway {self.gateways.index(port) + 1} (:{port})" if port else "no gateway"

    def tool_calls_logged(self, account_id):
        """Per gateway, the tools/call lines its log has for account_id (calls that are not
        read-only are logged at info: `mcp rid=N ACCOUNT tools/call TOOL`)."""
        pattern = re.compile(rf"mcp rid=\d+ {re.escape(account_id)} tools/call ")
        return {port: len(pattern.findall(self.s.log(name)))
                for port, name in self.gateway_logs.items()}

    def new_session(self, key):
        status, hdrs, body, port = self.lb("POST", MCP_INIT, key)
        self.assertEqual(status, 200, body)
        sid = hdrs.get("mcp-session-id")
        self.assertRegex(sid or "", r"^mcps_[A-Za-z0-9]{32}$", hdrs)
        return sid, port

    @staticmethod
    def text(body):
        try:
            return body["result"]["content"][0]["text"]
        except (KeyError, IndexError, TypeError):
            return None

    # -- (a) the reference scenarios through the SDK ----------------------------
    def test_1_reference_scenarios_through_the_balancer(self):
        self.assertEqual(self.st["mcp_url"], f"https://localhost:{self.lb_port}/mcp")
        acct = self.account("ref@example.com")
        before = len(self.s.haproxy_connections())
        try:
            steps_a, steps_b = reference_scenarios(
                self, lambda *calls: run_sdk(self, self.s, acct["api_key"], *calls,
                                             fresh_connections=True))
        finally:
            conns = self.settled_connections(before)
            per_server = {p: sum(1 for c in conns if c["server"] == p) for p in self.gateways}
            logged = self.tool_calls_logged(acct["account_id"])
            print("reference scenarios: connections per gateway (balancer's log): " +
                  ", ".join(f"{self.gateway_name(p)} {n}" for p, n in per_server.items()))
            print("reference scenarios: tools/call lines per gateway (gateways' logs): " +
                  ", ".join(f"{self.gateway_name(p)} {n}" for p, n in logged.items()))
        # The sandbox's published URL names the balancer's origin, and @fetch went there.
        fetched = [x for x in steps_b if x["step"] == "fetch"][0]
        self.assertTrue(fetched["url"].endswith(f".box.localhost:{self.lb_port}"), fetched)
        self.assertEqual(fetched["via"], f"127.0.0.1:{self.lb_port}")
        # The balancing happened: both gateways served the SDK's requests.
        for port in self.gateways:
            self.assertGreater(per_server[port], 0, per_server)
            self.assertGreater(logged[port], 0, logged)

    # -- (b) one session, every gateway ----------------------------------------
    def test_2_a_session_on_every_gateway(self):
        key = self.account("sess@example.com")["api_key"]
        other = self.account("other@example.com")["api_key"]
        since = len(self.s.haproxy_connections())
        sid, init_port = self.new_session(key)
        answers = []  # (what, status, body, local port)

        def send(what, method, body, k=key):
            status, _, parsed, port = self.lb(method, body, k, sid)
            answers.append((what, status, parsed, port))
            return status, parsed

        send("notifications/initialized", "POST", INITIALIZED)
        for i in range(6):
            send(f"tools/list #{i + 1}", "POST", LIST_TOOLS)
            send(f"tools/call list_sandboxes #{i + 1}", "POST", LIST_SANDBOXES)
        used = len(answers)
        for i in range(4):
            send(f"another account's ping #{i + 1}", "POST",
                 {"jsonrpc": "2.0", "id": 4, "method": "ping"}, other)
        deleted = len(answers)
        send("DELETE", "DELETE", None)
        for i in range(6):
            send(f"tools/list after DELETE #{i + 1}", "POST", LIST_TOOLS)
        send("DELETE again", "DELETE", None)

        servers = self.served_by([init_port] + [a[3] for a in answers], since)
        print(f"session {sid[:12]}… made on {self.gateway_name(servers[0])}")
        for (what, status, body, _), server in zip(answers, servers[1:]):
            print(f"  {what:34} → {status} on {self.gateway_name(server)}"
                  + ("" if status in (200, 202) else f": {json.dumps(body)[:120]}"))
        hit = {p: servers.count(p) for p in self.gateways}
        print("  requests per gateway: " + ", ".join(f"{self.gateway_name(p)} {n}"
                                                     for p, n in hit.items()))
        for port in self.gateways:
            self.assertGreaterEqual(hit[port], 5, "round robin must reach every gateway")

        def failures(lo, hi, expected):
            """The answers lo..hi-1 that are not `expected`, saying where and what."""
            return [f"{what} → {status} on {self.gateway_name(server)}: "
                    f"{json.dumps(body)[:100]}"
                    for (what, status, body, _), server in zip(answers[lo:hi],
                                                               servers[1 + lo:1 + hi])
                    if status != expected]
        # Made on one gateway, the session serves on all of them.
        bad = failures(0, 1, 202) + failures(1, used, 200)
        for what, status, body, _ in answers[1:used]:
            if status == 200 and "tools/list" in what:
                self.assertEqual(len(body["result"]["tools"]), 22, body)
            if status == 200 and "list_sandboxes" in what:
                self.assertFalse(body["result"].get("isError"), body)
        self.assertEqual(bad, [], "the session must serve on every gateway")
        # Another account: 404 everywhere, as if there were no such session.
        self.assertEqual(failures(used, deleted, 404), [])
        # Ended through one gateway: 200, then gone on every gateway.
        self.assertEqual(failures(deleted, deleted + 1, 200), [],
                         "DELETE ends the session whichever gateway gets it")
        self.assertEqual(failures(deleted + 1, len(answers), 404), [],
                         "an ended session is gone on every gateway")

    # -- (c) a session's default sandbox ---------------------------------------
    def test_3_the_default_sandbox_on_every_gateway(self):
        key = self.account("default@example.com")["api_key"]
        since = len(self.s.haproxy_connections())
        sid, init_port = self.new_session(key)
        # notifications/initialized is checked after the execs, so that a failure says
        # first what they got.
        initialized, _, initialized_body, p1 = self.lb("POST", INITIALIZED, key, sid)
        status, _, body, p2 = self.lb("POST", {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                               "params": {"name": "create_sandbox",
                                                          "arguments": {"name": "default"}}},
                                      key, sid)
        if status != 200:
            where = self.served_by([init_port, p2], since)
            self.fail(f"create_sandbox on {self.gateway_name(where[1])} with a session made on "
                      f"{self.gateway_name(where[0])}: {status} {body}")
        self.assertFalse(body["result"].get("isError"), self.text(body))
        sb = body["result"]["structuredContent"]["id"]
        self.addCleanup(lambda: self.s.cli("sandbox", "delete", sb, check=False, timeout=300))
        url = body["result"]["structuredContent"]["url"]
        label = url.split("//", 1)[1].split(".", 1)[0]  # the guest's hostname
        print(f"  create_sandbox → {self.text(body)!r}")
        answers = []
        for i in range(6):
            status, _, body, port = self.lb("POST", {
                "jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                "params": {"name": "exec", "arguments": {"command": "hostname"}}}, key, sid)
            answers.append((status, body, port))
        status, _, deleted, p_del = self.lb("POST", {
            "jsonrpc": "2.0", "id": 20, "method": "tools/call",
            "params": {"name": "delete_sandbox", "arguments": {"sandboxId": sb}}}, key, sid)
        servers = self.served_by([init_port, p1, p2] + [a[2] for a in answers] + [p_del],
                                 since)
        print(f"session made on {self.gateway_name(servers[0])}, sandbox {sb} created on "
              f"{self.gateway_name(servers[2])}")
        got = []
        for (st, b, _), server in zip(answers, servers[3:]):
            t = self.text(b) if st == 200 else json.dumps(b)[:120]
            got.append((st, t, b["result"].get("structuredContent", {}).get("exitCode")
                        if st == 200 and "result" in b else None))
            print(f"  exec hostname (no sandboxId) → {st} on {self.gateway_name(server)}: {t!r}")
        print(f"  delete_sandbox → {status} on {self.gateway_name(servers[-1])}: "
              f"{self.text(deleted) if status == 200 else deleted!r}")
        hit = {p: servers[3:-1].count(p) for p in self.gateways}
        for port in self.gateways:
            self.assertGreater(hit[port], 0, "round robin must reach every gateway")
        self.assertEqual(got, [(200, f"Exit code 0.\nstdout:\n{label}", 0)] * len(answers),
                         f"exec without sandboxId runs in the session's sandbox {sb}, "
                         "whichever gateway answers")
        self.assertEqual((initialized, initialized_body), (202, None),
                         f"notifications/initialized on {self.gateway_name(servers[1])}")
        self.assertEqual((status, self.text(deleted)),
                         (200, f"Deleting {sb}: its disk, memory and automatic snapshots are "
                               "removed."))

    # -- a session and its default outlive the broker and a gateway (kill -9) --
    def test_5_a_session_outlives_the_broker_and_its_gateway(self):
        key = self.account("restart@example.com")["api_key"]
        sid, _ = self.new_session(key)
        status, _, body, _ = self.lb("POST", {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                              "params": {"name": "create_sandbox",
                                                         "arguments": {"name": "outlives"}}},
                                     key, sid)
        self.assertEqual(status, 200, body)
        self.assertFalse(body["result"].get("isError"), self.text(body))
        sb = body["result"]["structuredContent"]["id"]
        self.addCleanup(lambda: self.s.cli("sandbox", "delete", sb, check=False, timeout=300))
        label = body["result"]["structuredContent"]["url"].split("//", 1)[1].split(".", 1)[0]
        broker = self.s.daemon_pid("sbx-broker")
        os.kill(broker, signal.SIGKILL)
        wait_for(lambda: self.s.daemon_pid("sbx-broker") not in (None, broker), 60,
                 "the supervisor restarting the broker")

        # Until every gateway has the broker back an answer may be 503 (retry); never 404.
        def exec_once():
            st, _, b, port = self.lb("POST", {
                "jsonrpc": "2.0", "id": 6, "method": "tools/call",
                "params": {"name": "exec", "arguments": {"command": "hostname"}}}, key, sid)
            self.assertNotEqual(st, 404, f"the session was lost with the broker: {b}")
            return (st, self.text(b) if st == 200 else None, port)
        def check(after):
            answers = []
            deadline = time.monotonic() + 90
            while len(answers) < 2 * len(self.gateways) and time.monotonic() < deadline:
                st, text, port = exec_once()
                if st == 200 and text and not text.endswith(("(unavailable)", "(timeout)")):
                    answers.append((text, port))
                else:
                    time.sleep(0.5)
            print(f"  after {after}: {len(answers)} execs without sandboxId answered")
            self.assertEqual([t for t, _ in answers], [f"Exit code 0.\nstdout:\n{label}"] *
                             (2 * len(self.gateways)),
                             f"the session's default sandbox, on every gateway, after {after}")
        check("the broker's restart")
        # The gateway that opened it, killed too: the session was never its alone.
        gateway = self.s.daemon_pid("sbx-gateway")
        os.kill(gateway, signal.SIGKILL)
        wait_for(lambda: self.s.daemon_pid("sbx-gateway") not in (None, gateway), 60,
                 "the supervisor restarting the gateway")
        check("a gateway's restart")

    # -- (d) a key's rate, all gateways together -------------------------------
    def rate(self, email, rate=3 * PLAN_RATE, seconds=3.0, threads=6):
        """Sends tools/call list_sandboxes for a new free-plan key at about rate per
        second for seconds, each on a connection of its own, and checks that about the
        plan's rate got through in all: PLAN_RATE * (elapsed + 1) (a token bucket one
        second deep per key). No session: this part is about the rate alone."""
        key = self.account(email)["api_key"]
        since = len(self.s.haproxy_connections())
        total = int(rate * seconds)
        results = [None] * total
        nxt = [0]
        lock = threading.Lock()
        t0 = time.monotonic() + 0.2

        def worker():
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= total:
                    return
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent = time.monotonic()
                try:
                    status, _, body, port = self.lb("POST", LIST_SANDBOXES, key, timeout=30)
                    text = self.text(body) or ""
                    if status == 200 and not body["result"].get("isError"):
                        kind = "accepted"
                    elif status == 200 and "(rate_limited)" in text:
                        kind = "rate_limited"
                    else:
                        kind = f"other: {status} {json.dumps(body)[:150]}"
                except Exception as exc:  # noqa: BLE001 - counted and reported below
                    port, kind = None, f"other: {exc!r}"
                results[i] = (sent, time.monotonic(), kind, port)

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        first = min(r[0] for r in results)
        elapsed = max(r[1] for r in results) - first
        accepted = sum(1 for r in results if r[2] == "accepted")
        limited = sum(1 for r in results if r[2] == "rate_limited")
        others = [r[2] for r in results if r[2].startswith("other")]
        expected = PLAN_RATE * (elapsed + 1)
        servers = self.served_by([r[3] for r in results if r[3] is not None], since)
        by_port = dict(zip([r[3] for r in results if r[3] is not None], servers))
        print(f"\nrate, {len(self.gateways)} gateways: {total} requests in {elapsed:.2f} s "
              f"({total / elapsed:.0f}/s offered, plan {PLAN_RATE}/s): accepted {accepted}, "
              f"rate_limited {limited}, other {len(others)}; expected accepted "
              f"{PLAN_RATE} * ({elapsed:.2f} + 1) = {expected:.0f} ± 20%")
        for port in self.gateways:
            mine = [r for r in results if r[3] is not None and by_port[r[3]] == port]
            print(f"  {self.gateway_name(port)}: {len(mine)} requests, "
                  f"{sum(1 for r in mine if r[2] == 'accepted')} accepted, "
                  f"{sum(1 for r in mine if r[2] == 'rate_limited')} rate_limited")
        self.assertEqual(others, [], "every answer is a result or the rate_limited error")
        self.assertTrue(0.8 * expected <= accepted <= 1.2 * expected,
                        f"{len(self.gateways)} gateways let {accepted} of {total} requests of "
                        f"one free-plan key through in {elapsed:.2f} s; the plan allows about "
                        f"{expected:.0f} ({PLAN_RATE}/s with one second's burst) in all")

    def test_4_a_keys_rate_across_gateways(self):
        with self.subTest(gateways=2):
            self.rate("rate2@example.com")
        self.add_gateway("gw-three")
        with self.subTest(gateways=3):
            self.rate("rate3@example.com")


if __name__ == "__main__":
    main()
