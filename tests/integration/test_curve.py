"""tcp:// endpoints between hosts use CurveZMQ: the broker's key pair is made at first run,
and only clients whose public key is in keys/allowed/ get an answer (issue 2, point 5)."""
import os
import re
import shutil
import unittest

from sbxtest import Sbx, free_port, main, wait_for


class CurveTest(unittest.TestCase):
    def test_tcp_endpoints_need_an_allowed_key(self):
        endpoints = {"broker.endpoint": f"tcp://127.0.0.1:{free_port()}",
                     "tap.endpoint": f"tcp://127.0.0.1:{free_port()}"}
        s = Sbx(self, "curve", settings=endpoints)
        s.up()
        st = s.status()
        self.assertEqual(len(st["peers"]), 5)  # every worker came in over CURVE
        s.cli_json("account", "create", "--email", "remote@example.com")
        with open(os.path.join(s.dir, "keys", "broker.cert")) as f:
            public = re.search(r'public-key = "(.{40})"', f.read()).group(1)
        self.assertTrue(os.path.exists(os.path.join(s.dir, "keys", "broker.cert_secret")))

        # Another host: its own data directory and key pair, the broker's public key.
        other = Sbx(self, "stranger", settings=dict(endpoints, **{"broker.public_key": public}))
        res = other.cli("key", "list", "--account", "remote@example.com", check=False)
        self.assertEqual(res.returncode, 3, res.stderr)  # never answered: not allowed
        # The operator allows its public key (copied in whole, then renamed, so the broker
        # never reads half a file): now it gets through.
        allowed = os.path.join(s.dir, "keys", "allowed")
        shutil.copy(os.path.join(other.dir, "keys", "client.cert"), allowed + "/.other-host.tmp")
        os.rename(allowed + "/.other-host.tmp", allowed + "/other-host.cert")
        keys = wait_for(lambda: other.cli_json("key", "list", "--account", "remote@example.com",
                                               timeout=30)["keys"], 60, "the allowed host's answer")
        self.assertEqual(len(keys), 1)
        # The tap over tcp is encrypted too, and works for an allowed reader.
        res = other.cli("tap", "--since", "0", "--once")
        self.assertIn("account.created", res.stdout)


if __name__ == "__main__":
    main()
