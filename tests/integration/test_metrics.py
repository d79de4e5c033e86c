"""Prometheus metrics (issue 18 item 2): `sbx up` with metrics.listen set, one sandbox made
and one command run over REST (one guest); then Debian's promtool checks the scraped text
and a real Debian prometheus scrapes the gateway's /metrics and answers, through its
HTTP API, with values that match what the test did. The public listener serves none."""
import http.client
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import unittest
import urllib.parse
import urllib.request

from sbxtest import BIN, Sbx, free_port, main, wait_for


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as res:
        return res.status, res.headers.get("Content-Type"), res.read().decode()


def sample(text, name, **labels):
    """The value of the one series of `name` whose labels include `labels`, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def sample_instance(text, daemon):
    """The instance label of a daemon's sbx_up line."""
    for line in text.splitlines():
        if line.startswith(f'sbx_up{{daemon="{daemon}",instance="'):
            return line.split('instance="', 1)[1].split('"', 1)[0]
    return None


class MetricsTest(unittest.TestCase):
    def test_metrics(self):
        port = free_port()
        s = Sbx(self, "metrics", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "metrics.listen": f"127.0.0.1:{port}"})
        s.up()
        url = f"http://127.0.0.1:{port}/metrics"
        self.assertEqual(s.status()["metrics_url"], url)

        # One sandbox and one command, through the REST API (the gateway and the broker
        # both see them).
        key = s.cli_json("account", "create", "--email", "ops@example.com")["api_key"]
        ctx = ssl.create_default_context(cafile=s.status()["ca_cert"])

        def rest(method, path, body=None):
            conn = http.client.HTTPSConnection("localhost", s.listen_port(), context=ctx,
                                               timeout=120)
            try:
                conn.request(method, path, body=json.dumps(body) if body is not None else None,
                             headers={"Authorization": f"Bearer {key}",
                                      "Content-Type": "application/json"})
                res = conn.getresponse()
                return res.status, json.loads(res.read() or b"null")
            finally:
                conn.close()
        status, sb = rest("POST", "/v1/sandboxes", {"name": "metered"})
        self.assertEqual(status, 201, sb)
        status, out = rest("POST", f"/v1/sandboxes/{sb['id']}/exec", {"command": "echo metered"})
        self.assertEqual(status, 200, out)
        self.assertIn("metered", json.dumps(out))
        # A stop and a resume (its memory kept), and an error the broker answers.
        status, out = rest("POST", f"/v1/sandboxes/{sb['id']}/stop")
        self.assertEqual((status, out["state"]), (200, "stopped"), out)
        status, out = rest("POST", f"/v1/sandboxes/{sb['id']}/resume")
        self.assertEqual((status, out["state"]), (200, "ready"), out)
        status, out = rest("GET", "/v1/sandboxes/sb_nosuchthing")
        self.assertEqual((status, out["error"]["code"]), (404, "not_found"), out)

        # The public listener refuses: metrics are the operator's, on their own address.
        status, _, body = s.https("GET", "/metrics")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(body)["error"]["code"], "not_found")
        self.assertIn("metrics.listen", json.loads(body)["error"]["message"])

        # The scrape: every daemon, the numbers of what was done (vmd's arrive with its
        # next heartbeat).
        def scraped():
            _, _, text = scrape(url)
            return (sample(text, "sbx_vm_resume_seconds_count", daemon="vmd") == 1 and
                    sample(text, "sbx_operation_seconds_count", op="exec") == 1 and text)
        text = wait_for(scraped, 15, "the resumed guest and the exec in the metrics")
        status, ctype, _ = scrape(url)
        self.assertEqual((status, ctype), (200, "text/plain; version=0.0.4; charset=utf-8"))
        for daemon in ("broker", "gateway", "vmd", "snapshotd", "billing"):
            self.assertEqual(sample(text, "sbx_up", daemon=daemon), 1, daemon)
        self.assertEqual(sample(text, "sbx_sandboxes", state="ready", type="small"), 1)
        self.assertEqual(sample(text, "sbx_sandboxes", state="stopped", type="small"), 0)
        self.assertEqual(sample(text, "sbx_sandbox_ops_total", op="create", result="ok"), 1)
        self.assertEqual(sample(text, "sbx_sandbox_op_seconds_count", op="create"), 1)
        for op in ("stop", "resume"):
            self.assertEqual(sample(text, "sbx_sandbox_ops_total", op=op, result="ok"), 1, op)
            self.assertEqual(sample(text, "sbx_sandbox_op_seconds_count", op=op), 1, op)
        self.assertEqual(sample(text, "sbx_vms", daemon="vmd"), 1)
        self.assertGreaterEqual(sample(text, "sbx_errors_total", daemon="broker",
                                       code="not_found"), 1)
        self.assertEqual(sample(text, "sbx_operations_total", op="get_sandbox", code="not_found"),
                         1)
        self.assertGreaterEqual(sample(text, "sbx_agent_seconds_count", request="exec"), 1)
        self.assertEqual(sample(text, "sbx_operations_total", op="exec", code="ok"), 1)
        self.assertEqual(sample(text, "sbx_operations_total", op="create_sandbox", code="ok"), 1)
        self.assertGreaterEqual(sample(text, "sbx_vm_boot_seconds_count", daemon="vmd"), 1)
        self.assertEqual(sample(text, "sbx_peers_connected", role="vmd"), 1)
        self.assertEqual(sample(text, "sbx_tap_lag_events", daemon="billing"), 0)
        self.assertIsNotNone(sample(text, "sbx_http_responses_total", status="201"))
        self.assertEqual(text.count("# TYPE sbx_up gauge"), 1)  # each family once

        # promtool: the format and Prometheus's naming rules.
        res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertEqual(res.stdout + res.stderr, "")

        # A real Prometheus scrapes it (the binary, not Debian's service).
        tmp = tempfile.mkdtemp(prefix="sbxtest-prom-")
        self.addCleanup(shutil.rmtree, tmp, True)
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: sbx\n    honor_labels: true\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        prom_port = free_port()
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def stop_prom():
            prom.terminate()
            try:
                prom.wait(10)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        self.addCleanup(stop_prom)

        def query(q):
            api = (f"http://127.0.0.1:{prom_port}/api/v1/query?" +
                   urllib.parse.urlencode({"query": q}))
            with urllib.request.urlopen(api, timeout=5) as res:
                answer = json.load(res)
            self.assertEqual(answer["status"], "success", answer)
            return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

        def value(q):
            found = query(q)
            return found[0][1] if len(found) == 1 else None

        def prom_log():
            with open(os.path.join(tmp, "prometheus.log")) as f:
                return f.read()[-3000:]
        try:
            wait_for(lambda: value('up{job="sbx"}') == 1, 30, "Prometheus to scrape sbx")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{prom_log()}") from None
        targets = json.load(urllib.request.urlopen(
            f"http://127.0.0.1:{prom_port}/api/v1/targets", timeout=5))["data"]["activeTargets"]
        self.assertEqual([(t["health"], t["lastError"]) for t in targets], [("up", "")])
        self.assertEqual(value('sbx_sandbox_ops_total{op="create",result="ok"}'), 1)
        self.assertEqual(value('sbx_sandboxes{state="ready",type="small"}'), 1)
        self.assertGreaterEqual(value('sbx_agent_seconds_count{request="exec"}'), 1)
        self.assertEqual(value('sbx_operation_seconds_count{op="exec"}'), 1)
        self.assertEqual(value('count(sbx_up == 1)'), 6)
        # honor_labels keeps sbx's instance label (the daemon's name, not the target's).
        broker = query('sbx_up{daemon="broker"}')
        self.assertEqual([(m["instance"], v) for m, v in broker],
                         [(sample_instance(text, "broker"), 1)])
        # A histogram Prometheus can compute with: the create's latency has a quantile.
        self.assertIsNotNone(value(
            'histogram_quantile(0.5, sbx_sandbox_op_seconds_bucket{op="create"})'))


if __name__ == "__main__":
    main()
