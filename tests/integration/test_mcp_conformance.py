"""The official MCP conformance suite (@modelcontextprotocol/conformance) in server mode
against sbx's /mcp under `sbx up`: 0.2.0-alpha.12 at the 2026-07-28 wire and 0.1.16 at
the 2025 wire, each scenario's checks read from its checks.json.

Every check must pass (SUCCESS; INFO is the suite's own "nothing to judge" and counts as
neither) except those in BASELINE below: checks that cannot apply to a server that has
tools only and none of the suite's fixture tools, each with its reason. A baselined check
must still be there, with the status and message the baseline names, or the test fails:
the list stays honest (a check that starts passing must leave it).

The suite has no option for a bearer token (modelcontextprotocol/conformance#453), so a
loopback proxy in this file (plain HTTP on 127.0.0.1, a thread) forwards each request to
the gateway over HTTPS with the installation's CA and adds `Authorization: Bearer <key>`,
every other header as sent (Host and Origin included), the answer streamed back as it
comes. The suite needs Node 22 or newer: npm's `node` package brings one into the work
directory (<build>/mcp-conformance), with both suite versions (tests/integration/
conformance/package.json); nothing is installed globally."""
import http.client
import http.server
import json
import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import unittest

from npmwork import npm_install, place
from sbxtest import BIN, HERE, Sbx, free_port, main

NEW = "0.2.0-alpha.12"
OLD = "0.1.16"
# (suite version, its package in package.json, extra arguments, scenarios). `list
# --server` of each version gives the names. --spec-version picks the 2026 wire for the
# scenarios that exist on both (tools-list, server-sse-multiple-streams,
# dns-rebinding-protection); 0.1.16 knows only the 2025 wire.
RUNS = [
    (NEW, "conformance-2", ["--spec-version", "2026-07-28"],
     ["server-stateless", "caching", "http-header-validation", "tools-list",
      "server-sse-multiple-streams", "dns-rebinding-protection"]),
    (OLD, "conformance-1", [],
     ["server-initialize", "ping", "tools-list", "server-sse-multiple-streams",
      "dns-rebinding-protection"]),
]

NOT_TESTABLE = r"^Not testable: server does not list the diagnostic tool"
NO_LISTEN = "advertises no subscription-delivered capability; subscriptions/listen is not"
# (version, scenario, check id) -> (status every occurrence of that check must have, a
# regular expression its errorMessage and details (as JSON) must match, why).
BASELINE = {
    # server-stateless drives the suite's fixture tools (everything-server.ts). sbx's
    # tools are sandboxes, not fixtures: without the named tool the suite reports
    # FAILURE "Not testable" (src/scenarios/untestable.ts), never SKIPPED.
    (NEW, "server-stateless", "sep-2575-server-rejects-undeclared-capability"):
        ("FAILURE", NOT_TESTABLE + " 'test_missing_capability'",
         "needs the fixture tool test_missing_capability (a tool that asks the client "
         "for sampling); no sbx tool needs a client capability"),
    (NEW, "server-stateless", "sep-2575-missing-capability-http-400"):
        ("FAILURE", NOT_TESTABLE + " 'test_missing_capability'",
         "same fixture tool, its HTTP status"),
    (NEW, "server-stateless", "sep-2575-http-server-no-independent-requests-on-stream"):
        ("FAILURE", NOT_TESTABLE + " 'test_streaming_elicitation'",
         "needs the fixture tool test_streaming_elicitation; sbx never sends a request "
         "to the client"),
    (NEW, "server-stateless", "sep-2575-server-no-log-without-loglevel"):
        ("FAILURE", NOT_TESTABLE + " 'test_logging_tool'",
         "needs the fixture tool test_logging_tool; sbx sends no log notifications"),
    # The listen checks (subscriptions/listen) run only for a server whose discover
    # advertises listChanged or subscribe; sbx's tool list is fixed and it has no
    # resources, so it advertises neither and the suite skips them.
    (NEW, "server-stateless", "sep-2575-server-sends-subscription-ack"):
        ("SKIPPED", NO_LISTEN, "no listChanged/subscribe advertised: nothing to listen to"),
    (NEW, "server-stateless", "sep-2575-server-tags-subscription-id"):
        ("SKIPPED", NO_LISTEN, "no listChanged/subscribe advertised: nothing to listen to"),
    (NEW, "server-stateless", "sep-2575-server-honors-notification-filter"):
        ("SKIPPED", NO_LISTEN, "no listChanged/subscribe advertised: nothing to listen to"),
    (NEW, "server-stateless", "sep-2575-server-sends-prompts-list-changed-on-subscription"):
        ("SKIPPED", r"did not declare prompts\.listChanged",
         "no prompts, so no prompts.listChanged: nothing to listen to"),
    (NEW, "server-stateless", "sep-2575-server-sends-tools-list-changed-on-subscription"):
        ("SKIPPED", r"did not declare tools\.listChanged",
         "the tool list never changes, so no tools.listChanged"),
    # caching asks for prompts/list, resources/list and resources/templates/list too
    # and counts their JSON-RPC error as FAILURE. sbx has tools only and does not
    # advertise prompts or resources, so it answers -32601 (404 at 2026-07-28), as the
    # spec wants of a method a server does not offer.
    (NEW, "caching", "sep-2549-prompts-list-caching-hints"):
        ("FAILURE", r"^prompts/list returned JSON-RPC error -32601",
         "sbx has no prompts (capability not advertised): -32601 is the right answer"),
    (NEW, "caching", "sep-2549-resources-list-caching-hints"):
        ("FAILURE", r"^resources/list returned JSON-RPC error -32601",
         "sbx has no resources (capability not advertised): -32601 is the right answer"),
    (NEW, "caching", "sep-2549-resources-templates-list-caching-hints"):
        ("FAILURE", r"^resources/templates/list returned JSON-RPC error -32601",
         "sbx has no resources (capability not advertised): -32601 is the right answer"),
    (NEW, "caching", "sep-2549-resources-read-caching-hints"):
        ("SKIPPED", r"^resources/read was not exercised",
         "no resources to read (follows from resources/list)"),
}

PASSED = ("SUCCESS",)
NEUTRAL = ("INFO",)  # the suite's own note; it counts it as neither pass nor failure


# -- the loopback proxy that adds the bearer token ---------------------------------------
class BearerProxy:
    """Plain HTTP on 127.0.0.1:port → the gateway over HTTPS (the installation's CA), with
    `Authorization: Bearer <key>` added. Every other request header goes on as sent, in
    its order and case (Host and Origin too); only the body's framing is redone (a
    chunked request body is sent with its Content-Length). The answer's status and
    headers come back as they are and its body is streamed as it arrives (re-chunked when
    it has no Content-Length, so SSE events flow one by one). A client that leaves
    mid-stream closes the upstream connection."""

    HOP = ("transfer-encoding", "connection", "keep-alive")

    def __init__(self, port, gw_port, cafile, key):
        self.log = []  # (method, path, status), for a failure's message
        ctx = ssl.create_default_context(cafile=cafile)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.forward()
            do_POST = do_DELETE = do_PUT = do_HEAD = do_OPTIONS = do_PATCH = do_GET

            def read_body(self):
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(parts), True
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return (self.rfile.read(n) if n else None), False

            def forward(self):
                body, rechunk = self.read_body()
                up = http.client.HTTPSConnection("localhost", gw_port, context=ctx,
                                                 timeout=600)
                try:
                    up.putrequest(self.command, self.path, skip_host=True,
                                  skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        lk = k.lower()
                        if lk in ("authorization", "transfer-encoding") or \
                                (rechunk and lk == "content-length"):
                            continue
                        up.putheader(k, v)
                    if rechunk:
                        up.putheader("Content-Length", str(len(body)))
                    up.putheader("Authorization", f"Bearer {key}")
                    up.endheaders(body)
                    res = up.getresponse()
                except OSError as exc:
                    proxy.log.append((self.command, self.path, f"502 {exc}"))
                    msg = f"proxy: {exc}".encode()
                    self.send_response_only(502)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    up.close()
                    return
                proxy.log.append((self.command, self.path, res.status))
                try:
                    self.relay(up, res)
                except OSError:
                    self.close_connection = True  # the client left
                finally:
                    up.close()

            def relay(self, up, res):
                self.send_response_only(res.status, res.reason)
                for k, v in res.getheaders():
                    if k.lower() not in BearerProxy.HOP:
                        self.send_header(k, v)
                bodiless = self.command == "HEAD" or res.status in (204, 304) or \
                    res.status < 200
                if bodiless or res.getheader("Content-Length") is not None:
                    self.end_headers()
                    if not bodiless:
                        self.wfile.write(res.read())
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                done = threading.Event()
                watcher = threading.Thread(target=self.watch, args=(up, done), daemon=True)
                watcher.start()
                try:
                    while True:
                        data = res.read1(65536)
                        if not data:
                            break
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                finally:
                    done.set()

            def watch(self, up, done):
                """While a stream is relayed: the client closing its side ends it."""
                while not done.is_set():
                    r, _, _ = select.select([self.connection], [], [], 0.2)
                    if r and not done.is_set():
                        try:
                            gone = self.connection.recv(1, socket.MSG_PEEK) == b""
                        except OSError:
                            gone = True
                        if gone:
                            try:
                                up.sock.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass
                            return
                        time.sleep(0.2)  # a next request already sent: wait for the end

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client left
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def install(test):
    """The suite (both versions) and Node 22 in <build>/mcp-conformance, from npm."""
    npm = shutil.which("npm")
    test.assertTrue(npm, "npm is needed to install the MCP conformance suite")
    work = os.path.realpath(os.path.join(BIN, "..", "mcp-conformance"))
    os.makedirs(work, exist_ok=True)
    src = os.path.join(HERE, "conformance", "package.json")
    place(src, work)
    with open(src) as f:
        wanted = json.load(f)["dependencies"]

    def installed():
        for name, spec in wanted.items():
            try:
                with open(os.path.join(work, "node_modules", name, "package.json")) as f:
                    have = json.load(f)["version"]
            except (OSError, ValueError, KeyError):
                return False
            if have != spec.rsplit("@", 1)[-1]:
                return False
        return os.access(os.path.join(work, "node_modules", ".bin", "node"), os.X_OK)
    npm_install(work, installed, timeout=600)
    test.assertTrue(installed(), f"npm install in {work} left it incomplete")
    node = os.path.join(work, "node_modules", ".bin", "node")
    res = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    test.assertTrue(res.stdout.startswith("v22."), res.stdout)
    return work, node


class McpConformanceTest(unittest.TestCase):
    def test_conformance(self):
        t0 = time.monotonic()
        work, node = install(self)
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        # The proxy's origin is where this server is reached from: it is allowed as any
        # deployment's own front would be (mcp.origins). Any other Origin stays refused,
        # which is what dns-rebinding-protection sends.
        s = Sbx(self, "mcpconf", settings={
            "image_dir": os.path.realpath(os.path.join(BIN, "..", "image")),
            "mcp.origins": f"http://127.0.0.1:{port}"})
        s.up()
        key = s.cli_json("account", "create", "--email", "conf@example.com")["api_key"]
        proxy = BearerProxy(port, s.listen_port(), s.status()["ca_cert"], key)
        self.addCleanup(proxy.close)

        results = {}  # (version, scenario) -> its checks
        for version, package, extra, scenarios in RUNS:
            index = os.path.join(work, "node_modules", package, "dist", "index.js")
            for scenario in scenarios:
                out = os.path.join(s.dir, "conformance", version, scenario)
                os.makedirs(out)
                cmd = [node, index, "server", "--url", url, "--scenario", scenario,
                       "-o", out, *extra]
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                     cwd=work)
                found = [os.path.join(d, "checks.json") for d, _, files in os.walk(out)
                         if "checks.json" in files]
                self.assertEqual(len(found), 1, f"{version} {scenario}: no checks.json "
                                 f"(exit {res.returncode}):\n{res.stdout[-3000:]}"
                                 f"\n{res.stderr[-3000:]}")
                with open(found[0]) as f:
                    checks = json.load(f)
                self.assertTrue(checks, f"{version} {scenario}: no checks at all")
                results[(version, scenario)] = checks
        elapsed = time.monotonic() - t0

        problems, rows = judge(results)
        print_table(rows)
        print("\nbaselined (see BASELINE):")
        for (version, scenario, cid), (status, _, why) in BASELINE.items():
            print(f"  {version} {scenario} {cid} {status}: {why}")
        print(f"\n{len(proxy.log)} requests through the proxy; {elapsed:.0f} s in all")
        if problems:
            self.fail(f"{len(problems)} conformance problems:\n" + "\n".join(problems) +
                      f"\nlast requests through the proxy: {proxy.log[-20:]!r}")


def judge(results):
    """Every check against BASELINE: (problems, table rows)."""
    problems, rows, seen = [], [], set()
    for (version, scenario), checks in results.items():
        counts = dict(passed=0, info=0, baselined=0, failed=0)
        for c in checks:
            cid, status = c["id"], c["status"]
            message = c.get("errorMessage") or ""
            evidence = message + " " + json.dumps(c.get("details"))
            entry = BASELINE.get((version, scenario, cid))
            if entry:
                seen.add((version, scenario, cid))
                want, pattern, why = entry
                if status == want and re.search(pattern, evidence):
                    counts["baselined"] += 1
                    continue
                counts["failed"] += 1
                problems.append(f"{version} {scenario} {cid}: baselined as {want} "
                                f"({why}) but {status}: {evidence[:600]!r} — "
                                + ("it passes now: take it out of BASELINE"
                                   if status in PASSED else "not the baselined reason"))
                continue
            if status in PASSED:
                counts["passed"] += 1
            elif status in NEUTRAL:
                counts["info"] += 1
            else:
                counts["failed"] += 1
                problems.append(f"{version} {scenario} {cid}: {status}: {message} "
                                f"{json.dumps(c.get('details'))[:1500]}")
        rows.append((version, scenario, len(checks), counts))
    for entry in BASELINE:
        if entry not in seen and (entry[0], entry[1]) in results:
            problems.append(f"{entry[0]} {entry[1]} {entry[2]}: baselined but the suite "
                            "no longer reports it: take it out of BASELINE")
        elif (entry[0], entry[1]) not in results:
            problems.append(f"{entry[0]} {entry[1]}: baselined scenario was not run")
    return problems, rows


def print_table(rows):
    print(f"\n{'suite':15} {'scenario':30} {'checks':>6} {'passed':>6} {'info':>4} "
          f"{'baselined':>9} {'failed':>6}")
    for version, scenario, n, c in rows:
        print(f"{version:15} {scenario:30} {n:6} {c['passed']:6} {c['info']:4} "
              f"{c['baselined']:9} {c['failed']:6}")


if __name__ == "__main__":
    main()
