"""Templates from a Dockerfile (issue 19 item 1, the CLI's part): `sbx template build` runs
the steps in a real build sandbox (RUN as USER with ENV and WORKDIR, COPY of files and
directories, ADD of a tar archive, the start command running before the last save),
caches each step as a snapshot (a rebuild runs nothing; a changed file runs from its COPY
on), says which step failed with its output, and builds FROM another template.
create_sandbox {template} starts from it with the start command already serving: MCP's
tool, REST's POST /v1/sandboxes, `sbx sandbox create --template` on the host as an
operator and from elsewhere through REST (SBX_URL, SBX_API_KEY); snapshotd resolves the
name to the account's newest template of that name, or else to one the operator
published (an admin account's, built with --public)."""
import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
import unittest

from sbxtest import (BIN, Sbx, binary, free_port, listening_ports, main, mcp_call, mcp_session,
                     wait_for)

DOCKERFILE = """# a web app
FROM sbx
ENV APP=/srv/app GREETING="hello from the template"
WORKDIR $APP
COPY site/ ./
COPY notes.txt /etc/notes.txt
ADD extra.tar.gz /opt/extra/
RUN echo "$GREETING" > built.txt && \\
    python3 -c "print(2 + 3)" > math.txt
RUN useradd -m web && chown -R web /srv/app
USER web
RUN whoami > /srv/app/who.txt && pwd > /srv/app/pwd.txt
EXPOSE 8000
CMD ["python3", "-m", "http.server", "8000"]
"""


class TemplatesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Sbx(cls, "templates", settings={"image_dir": os.path.realpath(
            os.path.join(BIN, "..", "image"))})
        cls.s.up()
        cls.key = cls.s.cli_json("account", "create", "--email", "alice@example.com")["api_key"]
        cls.ctx = tempfile.mkdtemp(prefix="sbxtest-ctx-")
        cls.addClassCleanup(subprocess.run, ["rm", "-rf", cls.ctx])
        os.makedirs(os.path.join(cls.ctx, "site", "sub"))
        cls.write("site/index.html", "<h1>made by sbx template build</h1>\n")
        cls.write("site/sub/deep.txt", "deep\n")
        cls.write("notes.txt", "first notes\n")
        with tarfile.open(os.path.join(cls.ctx, "extra.tar.gz"), "w:gz") as t:
            data = b"from an archive\n"
            info = tarfile.TarInfo("inside.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        cls.write("Dockerfile", DOCKERFILE)

    @classmethod
    def addCleanup(cls, fn, *args):  # Sbx registers its cleanup on the class
        cls.addClassCleanup(fn, *args)

    @classmethod
    def write(cls, name, text):
        with open(os.path.join(cls.ctx, name), "w") as f:
            f.write(text)

    def build(self, name, dockerfile=None, *extra, ok=True):
        args = ["template", "build", name, self.ctx, "--account", "alice@example.com", *extra]
        if dockerfile:
            args += ["-f", dockerfile]
        res = self.s.cli(*args, check=False, timeout=900)
        print(f"$ sbx {' '.join(args)}\n{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode == 0, ok, res.stderr)
        return res

    def sh(self, sid, command):
        r = json.loads(self.s.cli("sandbox", "exec", sid, "--no-stdin", "--json", "--",
                                  command).stdout)
        self.assertEqual(r["exitCode"], 0, r)
        return r["stdout"].strip()

    def test_build_cache_create_and_layers(self):
        # The first build runs every step, a line each, and saves each layer.
        res = self.build("web", None, "--json")
        out = json.loads(res.stdout.splitlines()[-1])
        self.assertEqual((out["name"], out["steps"], out["cached"]), ("web", 12, 0))
        self.assertEqual(out["run"], 7)  # WORKDIR, COPY, COPY, ADD, RUN, RUN, RUN
        self.assertEqual(out["start"], "python3 -m http.server 8000")
        for n in range(1, 13):
            self.assertIn(f"Step {n}/12 : ", res.stdout)
        self.assertIn("Step 7/12 : RUN echo \"$GREETING\" > built.txt && python3", res.stdout)
        first = out["snapshotId"]

        # Again, unchanged: every step from the cache.
        res = self.build("web", None, "--json")
        again = json.loads(res.stdout.splitlines()[-1])
        self.assertEqual((again["cached"], again["run"]), (9, 0), res.stdout)
        self.assertIn("Step 10/12 : RUN whoami > /srv/app/who.txt && pwd > /srv/app/pwd.txt "
                      "(cached)", res.stdout)

        # A changed input: the steps from its COPY on run again, those before do not.
        self.write("notes.txt", "second notes\n")
        self.addCleanup(self.write, "notes.txt", "first notes\n")
        res = self.build("web", None, "--json")
        changed = json.loads(res.stdout.splitlines()[-1])
        self.assertEqual((changed["cached"], changed["run"]), (3, 5), res.stdout)
        self.assertIn("Step 4/12 : COPY site/ ./ (cached)", res.stdout)
        self.assertNotIn("Step 5/12 : COPY notes.txt /etc/notes.txt (cached)", res.stdout)
        self.assertNotEqual(changed["snapshotId"], first)

        listed = self.s.cli_json("template", "list", "--account", "alice@example.com")
        self.assertEqual([(t["name"], t["snapshotId"]) for t in listed["templates"]],
                         [("web", changed["snapshotId"])])

        # A sandbox from it: the files, the user, the environment's effects, and the start
        # command serving already.
        made = self.s.cli_json("sandbox", "create", "--account", "alice@example.com",
                               "--template", "web")
        sid = made["id"]
        self.assertEqual(self.sh(sid, "cat /srv/app/built.txt"), "hello from the template")
        self.assertEqual(self.sh(sid, "cat /srv/app/math.txt"), "5")
        self.assertEqual(self.sh(sid, "cat /srv/app/who.txt /srv/app/pwd.txt"), "web\n/srv/app")
        self.assertEqual(self.sh(sid, "cat /etc/notes.txt"), "second notes")
        self.assertEqual(self.sh(sid, "cat /srv/app/sub/deep.txt"), "deep")
        self.assertEqual(self.sh(sid, "cat /opt/extra/inside.txt"), "from an archive")
        self.assertEqual(self.sh(sid, "stat -c %U /etc/notes.txt /srv/app/index.html"),
                         "root\nweb")
        self.assertIn("made by sbx template build",
                      self.sh(sid, "curl -s http://127.0.0.1:8000/index.html"))
        self.assertEqual(self.sh(sid, "hostname"), made["label"])

        # FROM a template: its files and its running server come along.
        self.write("Dockerfile.layer", "FROM web\nRUN echo layered > /srv/app/layer.txt\n")
        res = self.build("web-layer", os.path.join(self.ctx, "Dockerfile.layer"), "--json")
        layered = json.loads(res.stdout.splitlines()[-1])
        self.assertEqual((layered["steps"], layered["run"]), (2, 1))
        two = self.s.cli_json("sandbox", "create", "--account", "alice@example.com",
                              "--template", "web-layer")["id"]
        self.assertEqual(self.sh(two, "cat /srv/app/layer.txt /srv/app/built.txt"),
                         "layered\nhello from the template")
        r = json.loads(self.s.cli("sandbox", "exec", two, "--no-stdin", "--json", "--",
                                  "curl -s http://127.0.0.1:8000/ || ps -eo pid,user,stat,args")
                       .stdout)
        self.assertIn("made by sbx template build", r["stdout"], r)

        # From elsewhere, through REST as the key's account: list and create.
        st = self.s.status()
        env = dict(os.environ, SBX_URL=st["mcp_url"][:-len("/mcp")], SBX_API_KEY=self.key,
                   SBX_CA_CERT=st["ca_cert"], SBX_CONFIG_DIR=tempfile.mkdtemp())
        res = subprocess.run([binary("sbx"), "template", "list", "--json"], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(sorted(t["name"] for t in json.loads(res.stdout)["templates"]),
                         ["web", "web-layer"])
        res = subprocess.run([binary("sbx"), "sandbox", "create", "--template", "web", "--json"],
                             env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        remote = json.loads(res.stdout)["id"]
        self.assertEqual(self.sh(remote, "cat /srv/app/built.txt"), "hello from the template")

        # An agent's create: MCP's create_sandbox and REST's POST /v1/sandboxes take it.
        session = mcp_session(self.s, self.key)
        r, text = mcp_call(self, self.s, self.key, session, "create_sandbox",
                           {"template": "web", "name": "by-mcp"})
        by_mcp = r["structuredContent"]["id"]
        self.assertEqual(self.sh(by_mcp, "cat /srv/app/math.txt"), "5")
        r, text = mcp_call(self, self.s, self.key, session, "create_sandbox",
                           {"template": "nosuch"}, ok=False)
        self.assertIn("no template named 'nosuch'", text)
        status, _, body = self.s.https("POST", "/v1/sandboxes", json.dumps(
            {"template": "web-layer"}), {"Authorization": f"Bearer {self.key}",
                                         "Content-Type": "application/json"}, timeout=300)
        self.assertEqual(status, 201, body)
        by_rest = json.loads(body)["id"]
        self.assertEqual(self.sh(by_rest, "cat /srv/app/layer.txt"), "layered")
        status, _, body = self.s.https("POST", "/v1/sandboxes", json.dumps(
            {"template": "web", "snapshotId": layered["snapshotId"]}),
            {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        self.assertEqual(status, 400, body)
        self.assertIn(b"not both", body)
        for sb in (by_mcp, by_rest):
            self.s.cli("sandbox", "delete", sb)

        # Delete: refused while a sandbox stands on it, then done.
        res = self.s.cli("template", "delete", "web-layer", "--account", "alice@example.com",
                         check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("in use", res.stderr)
        self.s.cli("sandbox", "delete", two)
        res = self.s.cli("template", "delete", "web-layer", "--account", "alice@example.com")
        self.assertIn("Deleted template web-layer", res.stdout)
        for sb in (sid, remote):
            self.s.cli("sandbox", "delete", sb)

    def remote_env(self, key):
        st = self.s.status()
        return dict(os.environ, SBX_URL=st["mcp_url"][:-len("/mcp")], SBX_API_KEY=key,
                    SBX_CA_CERT=st["ca_cert"], SBX_CONFIG_DIR=tempfile.mkdtemp())

    def rest(self, key, method, path, body=None, content_type="application/json", timeout=60,
             port=None):
        status, headers, data = self.s.https(method, path, body, {
            "Authorization": f"Bearer {key}", "Content-Type": content_type}, timeout=timeout,
            port=port)
        return status, headers, json.loads(data) if data else None

    def test_published_by_the_operator(self):
        # An admin account's template built with --public serves every account that has
        # none of that name; a user's --public publishes nothing. Its ENV, WORKDIR and USER
        # are in force for builds FROM it; GET /v1/templates lists it for everyone; and a
        # user builds FROM it in the service (POST /v1/templates, sbx template build
        # --server), following the build's log.
        self.write("Dockerfile.shared",
                   "FROM sbx\nRUN echo shared > /opt/shared.txt && useradd -m sharer && "
                   "mkdir -p /opt/work && chown sharer /opt/work\n"
                   "ENV SHARED_VAR=inherited\nWORKDIR /opt/work\nUSER sharer\n")
        admin = [a for a in self.s.cli_json("account", "list")["accounts"] if a["admin"]][0]
        res = self.s.cli("template", "build", "shared", self.ctx, "-f",
                         os.path.join(self.ctx, "Dockerfile.shared"), "--account", admin["email"],
                         "--public", timeout=900)
        self.assertIn("Template shared is snap_", res.stdout)
        bob = self.s.cli_json("account", "create", "--email", "bob@example.com")["api_key"]
        for key in (self.key, bob):
            session = mcp_session(self.s, key)
            r, _ = mcp_call(self, self.s, key, session, "create_sandbox", {"template": "shared"})
            sb = r["structuredContent"]["id"]
            self.assertEqual(self.sh(sb, "cat /opt/shared.txt"), "shared")
            self.s.cli("sandbox", "delete", sb)
        self.write("Dockerfile.mine", "FROM sbx\nRUN echo mine > /opt/mine.txt\n")
        self.s.cli("template", "build", "alices", self.ctx, "-f",
                   os.path.join(self.ctx, "Dockerfile.mine"), "--account", "alice@example.com",
                   "--public", timeout=900)
        session = mcp_session(self.s, bob)
        r, text = mcp_call(self, self.s, bob, session, "create_sandbox", {"template": "alices"},
                           ok=False)
        self.assertIn("no template named 'alices'", text)

        # The list: bob sees the operator's published template, not alice's.
        status, _, body = self.rest(bob, "GET", "/v1/templates")
        self.assertEqual(status, 200, body)
        self.assertEqual([(t["name"], t["own"], t["published"]) for t in body["templates"]],
                         [("shared", False, True)])
        status, _, body = self.rest(self.key, "GET", "/v1/templates")
        self.assertEqual(sorted((t["name"], t["own"]) for t in body["templates"]
                                if t["name"] in ("shared", "alices")),
                         [("alices", True), ("shared", False)])

        # Bob builds FROM it in the service: the CLI sends the context and shows the log.
        self.write("Dockerfile.bob", "FROM shared\n"
                   "RUN echo \"$SHARED_VAR $(whoami) $(pwd)\" > seen.txt\n"
                   "ENV MORE=yes\n")
        env = self.remote_env(bob)
        res = subprocess.run([binary("sbx"), "template", "show", "shared", "--json"], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout)["own"], False)
        res = subprocess.run([binary("sbx"), "template", "build", "bobs", self.ctx, "-f",
                              os.path.join(self.ctx, "Dockerfile.bob"), "--server"], env=env,
                             capture_output=True, text=True, timeout=900)
        print(f"$ sbx template build bobs --server\n{res.stdout}{res.stderr}")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("runs on the service", res.stderr)
        self.assertIn("Step 2/3 : RUN echo", res.stdout)
        self.assertIn("Template bobs is snap_", res.stdout)
        status, _, body = self.rest(bob, "POST", "/v1/sandboxes", json.dumps(
            {"template": "bobs"}), timeout=300)
        self.assertEqual(status, 201, body)
        self.assertEqual(self.sh(body["id"], "cat /opt/work/seen.txt"),
                         "inherited sharer /opt/work")
        config = json.loads(self.sh(body["id"], "cat /etc/sbx/template.json"))
        self.assertEqual((config["name"], config["workdir"], config["user"]),
                         ("bobs", "/opt/work", "sharer"))
        self.assertEqual(config["env"], ["SHARED_VAR=inherited", "MORE=yes"])
        self.s.cli("sandbox", "delete", body["id"])

        # The REST route itself: a failed build's log and exit code, kept for its account
        # only; refusals.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = b"FROM sbx\nRUN echo about to fail; exit 4\n"
            info = tarfile.TarInfo("sub/Dockerfile")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        status, headers, body = self.rest(bob, "POST", "/v1/templates?name=failing&dockerfile="
                                          "sub/Dockerfile", buf.getvalue(), "application/x-tar")
        self.assertEqual(status, 202, body)
        self.assertEqual(headers["Location"], f"/v1/templates/builds/{body['id']}")
        self.assertEqual(body["state"], "running")
        build = body["id"]
        for _ in range(600):
            status, _, body = self.rest(bob, "GET", f"/v1/templates/builds/{build}")
            if body["state"] != "running":
                break
            time.sleep(0.5)
        self.assertEqual((body["state"], body["exitCode"]), ("failed", 1), body)
        self.assertIn("Step 2/2 failed (line 2)", body["log"])
        self.assertIn("about to fail", body["log"])
        self.assertEqual(body["logOffset"], len(body["log"].encode()))
        status, _, more = self.rest(bob, "GET", f"/v1/templates/builds/{build}?logOffset="
                                    f"{body['logOffset']}")
        self.assertEqual((status, more["log"]), (200, ""))
        status, _, other = self.rest(self.key, "GET", f"/v1/templates/builds/{build}")
        self.assertEqual(status, 404, other)

        # Behind a balancer a build's GETs may reach any gateway: one that does not hold
        # the build asks the others through the broker (build.get). A second gateway
        # answers as the first does, for the build's account only.
        two = free_port()
        self.s.start("sbx-gateway", "--instance", "gw-two", "--set", f"listen=127.0.0.1:{two}")
        wait_for(lambda: two in listening_ports() and [
            p["role"] for p in self.s.status()["peers"]].count("gateway") == 2, 30,
            "a second gateway, gw-two, listening and known to the broker")
        status, _, there = self.rest(bob, "GET", f"/v1/templates/builds/{build}", port=two)
        self.assertEqual((status, there), (200, body))
        status, _, there = self.rest(bob, "GET", f"/v1/templates/builds/{build}?logOffset=4",
                                     port=two)
        self.assertEqual((status, there["log"]), (200, body["log"][4:]))
        for key, which in ((self.key, build), (bob, "bld_zzzzzzzzzz")):
            status, _, there = self.rest(key, "GET", f"/v1/templates/builds/{which}", port=two)
            self.assertEqual(status, 404, there)
            self.assertIn(f"no template build {which}: no gateway of this service holds it",
                          there["error"]["message"])
        for path, data, expect in (
                ("/v1/templates?name=x", b"", "tar archive"),
                ("/v1/templates?name=Bad", b"x", "name must match"),
                ("/v1/templates?name=x&dockerfile=../D", b"x", "inside the build context"),
                ("/v1/templates/builds/bld_nope", None, "buildId must match")):
            status, _, body = self.rest(bob, "GET" if data is None else "POST", path, data,
                                        "application/x-tar")
            self.assertEqual(status, 400, body)
            self.assertIn(expect, body["error"]["message"])
        status, _, body = self.rest(bob, "POST", "/v1/templates?name=bad", b"not a tar archive",
                                    "application/x-tar")
        self.assertEqual(status, 202, body)
        for _ in range(120):
            status, _, body = self.rest(bob, "GET", f"/v1/templates/builds/{body['id']}")
            if body["state"] != "running":
                break
            time.sleep(0.5)
        self.assertEqual(body["exitCode"], 2, body)
        self.assertIn("the build context (a tar archive)", body["log"])

    def test_refusals(self):
        # A failed step: which, its output and exit code; no build sandbox left behind.
        self.write("Dockerfile.fail", "FROM sbx\nRUN echo fine\nRUN echo oops >&2; exit 3\n")
        res = self.build("broken", os.path.join(self.ctx, "Dockerfile.fail"), ok=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("Step 3/3 failed (line 3): RUN echo oops >&2; exit 3", res.stderr)
        self.assertIn("--- stderr\noops\n", res.stderr)
        self.assertIn("exit code 3", res.stderr)
        left = self.s.cli_json("sandbox", "list", "--account", "alice@example.com")
        self.assertEqual([x["id"] for x in left["sandboxes"] if x.get("name") == "template build"
                          and x["state"] not in ("deleting", "deleted")], [])
        # Not the subset, a missing file, a missing base: before anything starts.
        for text, expect in (("FROM sbx\nARG X=1\n", "line 2: ARG is not supported"),
                             ("FROM sbx\nCOPY nothere /x\n", "nothere: no such file in the"),
                             ("FROM sbx\nCOPY ../../etc/passwd /x\n", "outside the build"),
                             ("FROM nosuch\n", "FROM nosuch: no template of that name")):
            self.write("Dockerfile.bad", text)
            res = self.build("bad", os.path.join(self.ctx, "Dockerfile.bad"), ok=False)
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn(expect, res.stderr)
        res = self.s.cli("template", "build", "Bad Name", self.ctx, "--account", "a@b.c",
                         check=False)
        self.assertEqual(res.returncode, 2)
        self.assertIn("a template's name is", res.stderr)
        res = self.s.cli("sandbox", "create", "--account", "alice@example.com", "--template",
                         "nosuch", check=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("no template named 'nosuch'", res.stderr)


if __name__ == "__main__":
    main()
