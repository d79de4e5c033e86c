"""A key's plan rate holds across gateways: the real broker and three real gateways
(`sbx up`'s, gw-two and gw-three) over HTTPS, as behind a round-robin balancer.

Each gateway enforces the rate in its own memory at its share of the plan, and the
broker hands out the shares from every gateway's demand a few times a second
(docs/operations.md, "Rate limits across gateways"). Requests at about three times the
free plan (20/s), going round two of the gateways or all three for about three seconds,
must be accepted within 20% of 20 x (seconds + 1): the plan and its one-second burst,
not two or three times that. And a client that sticks to one gateway is not cut to a
third: it gets the whole plan there, within 20% too."""
import http.client
import json
import ssl
import threading
import time
import unittest

from sbxtest import Sbx, free_port, main, wait_for

PLAN = 20        # the free plan's requests_per_second (the default)
OFFERED = 3      # times the plan
SECONDS = 3.0
THREADS = 6


class RatesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "rates")
        cls.s.up()
        cls.port_one = cls.s.listen_port()
        cls.port_two, cls.port_three = free_port(), free_port()
        cls.ports = (cls.port_one, cls.port_two, cls.port_three)
        # As behind a balancer: the other gateways name the first one's origin.
        for name, port in (("gw-two", cls.port_two), ("gw-three", cls.port_three)):
            cls.s.start("sbx-gateway", "--instance", name, "--set", f"listen=127.0.0.1:{port}",
                        "--set", f"public_url=https://localhost:{cls.port_one}")
        wait_for(lambda: [p["role"] for p in cls.s.status()["peers"]].count("gateway") == 3,
                 30, "the other gateways connected")
        cls.ctx = ssl.create_default_context(cafile=cls.s.status()["ca_cert"])
        cls.s.cli_json("account", "create", "--email", "rae@example.com")
        # Idle gateways learn how many they are (an empty rate.report once a second), so
        # a key that arrives starts at a third of the plan on each.
        wait_for(lambda: all(cls.healthz(p)["rates"]["gateways"] == 3 for p in cls.ports), 10,
                 "every gateway counting three gateways")

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    @classmethod
    def healthz(cls, port):
        conn = http.client.HTTPSConnection("localhost", port, context=cls.ctx, timeout=10)
        try:
            conn.request("GET", "/healthz")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def new_key(self):
        return self.s.cli_json("key", "create", "--account", "rae@example.com",
                               "--preset", "full")["key"]

    def flood(self, key, ports):
        """OFFERED x PLAN requests per second for SECONDS, request i to ports[i % len], from
        THREADS threads on kept-alive connections. Returns (accepted, refused, other,
        elapsed seconds)."""
        counts = {"ok": 0, "limited": 0, "other": []}
        lock = threading.Lock()
        interval = 1.0 / (OFFERED * PLAN)
        total = int(OFFERED * PLAN * SECONDS)
        start = time.monotonic() + 0.2  # every thread ready before the first request
        headers = {"Authorization": f"Bearer {key}"}

        def worker(tid):
            conns = {}
            for i in range(tid, total, THREADS):
                port = ports[i % len(ports)]
                delay = start + i * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the load, not waiting for a state
                for attempt in range(2):  # a kept-alive connection the server closed
                    conn = conns.get(port) or http.client.HTTPSConnection(
                        "localhost", port, context=self.ctx, timeout=30)
                    conns[port] = conn
                    try:
                        conn.request("GET", "/v1/sandboxes", headers=headers)
                        res = conn.getresponse()
                        body = res.read()
                        break
                    except (http.client.HTTPException, OSError):
                        conn.close()
                        conns.pop(port)
                        if attempt:
                            raise
                with lock:
                    if res.status == 200:
                        counts["ok"] += 1
                    elif res.status == 429 and json.loads(body)["error"]["code"] == "rate_limited":
                        counts["limited"] += 1
                    else:
                        counts["other"].append((res.status, body[:200]))
            for conn in conns.values():
                conn.close()

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        return counts["ok"], counts["limited"], counts["other"], elapsed

    def check(self, what, key, ports):
        ok, limited, other, elapsed = self.flood(key, ports)
        expected = PLAN * (elapsed + 1)
        offered = ok + limited
        print(f"{what}: {ok} accepted, {limited} refused of {offered} in {elapsed:.2f} s "
              f"({offered / elapsed:.1f}/s offered); expected {expected:.1f} "
              f"({PLAN}/s x (seconds + 1)): {100 * (ok - expected) / expected:+.0f}%")
        self.assertEqual(other, [])
        # The load must have been over the plan, or the test shows nothing.
        self.assertGreater(offered / elapsed, 2 * PLAN)
        self.assertGreaterEqual(ok, 0.8 * expected)
        self.assertLessEqual(ok, 1.2 * expected)

    def test_two_gateways_hold_the_plan(self):
        """Round robin over two gateways (the third one idle)."""
        self.check("two of three gateways, round robin", self.new_key(),
                   (self.port_one, self.port_two))
        # Both held the key to less than the plan, and say so; the idle one holds none.
        for port, shared in ((self.port_one, 1), (self.port_two, 1), (self.port_three, 0)):
            rates = self.healthz(port)["rates"]
            print(f"  /healthz on {port}: {rates}")
            self.assertEqual(rates["gateways"], 3)
            self.assertEqual(rates["shared"], shared)

    def test_three_gateways_hold_the_plan(self):
        self.check("three gateways, round robin", self.new_key(), self.ports)

    def test_one_gateway_alone_gets_the_plan(self):
        """A fresh key whose every request goes to one gateway (a sticky balancer)."""
        self.check("one of three gateways, sticky", self.new_key(), (self.port_one,))


if __name__ == "__main__":
    main()
