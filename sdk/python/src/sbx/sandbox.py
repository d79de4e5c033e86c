"""Sandboxes: create, connect, list; commands, files and ports of one; stop, resume,
extend, snapshot, fork and kill. Every call is one or a few REST requests (docs/rest.md) made
by _http.Client; failures raise the SbxError subclass of the service's code."""
import base64
import io
import json
import os
import posixpath
import shlex
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from ._http import Client
from .errors import SbxError, error_for

LIMIT = 16 * 1024 * 1024  # write_file's and read_file's bytes, and so a directory's archive


@dataclass
class SandboxPage:
    """One page of Sandbox.list_page: its sandboxes, and the cursor of the next page
    (None on the last)."""
    sandboxes: list
    next_cursor: Optional[str] = None


@dataclass
class CommandResult:
    """A finished command: exit_code, stdout, stderr (and whether its timeout killed it)."""
    exit_code: int
    stdout: str
    stderr: str
    pid: int = 0
    timed_out: bool = False


class CommandHandle:
    """A command started in the background: poll it, wait for it, kill it."""

    def __init__(self, sandbox, pid):
        self.sandbox = sandbox
        self.pid = pid
        self._out, self._err = 0, 0
        self.stdout, self.stderr = "", ""

    def poll(self):
        """New output since the last poll (added to .stdout/.stderr); None while it runs,
        else its CommandResult."""
        st = self.sandbox._client.request(
            "GET", f"/v1/sandboxes/{self.sandbox.id}/processes/{self.pid}",
            {"stdoutOffset": self._out, "stderrOffset": self._err})
        self.stdout += st["stdout"]
        self.stderr += st["stderr"]
        self._out, self._err = st["stdoutNextOffset"], st["stderrNextOffset"]
        if st["running"] or st["stdoutTruncated"] or st["stderrTruncated"]:
            return None if st["running"] else self.poll()
        return CommandResult(st["exitCode"], self.stdout, self.stderr, self.pid, st["timedOut"])

    def wait(self, timeout=None, interval=1.0):
        """Polls until it ends (SbxTimeoutError after timeout seconds): its CommandResult."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            result = self.poll()
            if result is not None:
                return result
            if deadline is not None and time.monotonic() > deadline:
                raise error_for("timeout", f"process {self.pid} still runs after {timeout} s")
            time.sleep(interval)

    def kill(self, signal="SIGKILL"):
        self.sandbox.commands.kill(self.pid, signal)


class Commands:
    def __init__(self, sandbox):
        self.sandbox = sandbox

    def run(self, cmd, background=False, timeout=120, cwd=None, envs=None, stdin=None,
            on_stdout=None, on_stderr=None):
        """Runs cmd with /bin/sh -c. Foreground: waits (at most timeout seconds) and returns
        a CommandResult; with on_stdout/on_stderr, each piece of output goes to them as it
        comes. background=True: a CommandHandle at once. stdin: str or bytes."""
        body = {"command": cmd, "timeout": int(timeout)}
        if background:
            body["detached"] = True
        if cwd:
            body["cwd"] = cwd
        if envs:
            body["env"] = dict(envs)
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
            body["stdin"] = base64.b64encode(data).decode()
            body["stdinEncoding"] = "base64"
        path = f"/v1/sandboxes/{self.sandbox.id}/exec"
        client = self.sandbox._client
        wait = timeout + 60
        if background:
            return CommandHandle(self.sandbox, client.request("POST", path, body=body)["processId"])
        if not (on_stdout or on_stderr):
            out = client.request("POST", path, body=body, timeout=wait)
            return CommandResult(out["exitCode"], out["stdout"], out["stderr"], out["processId"],
                                 out["timedOut"])
        stdout, stderr, pid = [], [], 0
        for event, data in client.events("POST", path, body, timeout=wait):
            if event == "start":
                pid = data["processId"]
            elif event == "stdout":
                stdout.append(data["text"])
                if on_stdout:
                    on_stdout(data["text"])
            elif event == "stderr":
                stderr.append(data["text"])
                if on_stderr:
                    on_stderr(data["text"])
            elif event == "error":
                raise error_for(data["error"]["code"], data["error"]["message"])
            elif event in ("exit", "answer"):
                return CommandResult(data["exitCode"], "".join(stdout) + data.get("stdout", ""),
                                     "".join(stderr) + data.get("stderr", ""),
                                     data.get("processId", pid), data["timedOut"])
        raise error_for("unavailable", "the output stream ended before the command did")

    def list(self):
        """The processes exec started that the guest keeps: dicts as REST's."""
        return self.sandbox._client.request(
            "GET", f"/v1/sandboxes/{self.sandbox.id}/processes")["processes"]

    def kill(self, pid, signal="SIGKILL"):
        return self.sandbox._client.request(
            "POST", f"/v1/sandboxes/{self.sandbox.id}/processes/{pid}/kill",
            body={"signal": signal})


class Files:
    def __init__(self, sandbox):
        self.sandbox = sandbox

    def read(self, path, format="text"):
        """The file's contents: str (format "text") or bytes ("bytes")."""
        data = self.sandbox._client.get_bytes(f"/v1/sandboxes/{self.sandbox.id}/files",
                                              {"path": path})
        return data.decode() if format == "text" else data

    def write(self, path, data, mode=None):
        """Writes str or bytes (at most 16 MiB); mode: permission bits, e.g. 0o755."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        query = {"path": path}
        if mode is not None:
            query["mode"] = format(mode, "o")
        return self.sandbox._client.put_bytes(f"/v1/sandboxes/{self.sandbox.id}/files", query,
                                              raw)

    def list(self, path):
        """The entries of a directory: dicts with name, path, type (file, dir, link,
        other), size and mode."""
        r = self.sandbox.commands.run(
            f"find {shlex.quote(path)} -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%m\\t%p\\n'")
        if r.exit_code:
            raise error_for("not_found", r.stderr.strip() or f"{path}: not a directory")
        kinds = {"f": "file", "d": "dir", "l": "link"}
        entries = []
        for line in r.stdout.splitlines():
            kind, size, mode, full = line.split("\t", 3)
            entries.append({"name": posixpath.basename(full), "path": full,
                            "type": kinds.get(kind, "other"), "size": int(size),
                            "mode": int(mode, 8)})
        return sorted(entries, key=lambda e: e["name"])

    def upload_dir(self, local, path):
        """Copies a local directory (files, links, modes) to path in the sandbox, as one
        tar archive (16 MiB at most)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(local, arcname=".")
        if buf.tell() > LIMIT:
            raise error_for("too_large", f"{local} is {buf.tell()} bytes as an archive; "
                            f"at most {LIMIT}")
        tmp = f"/tmp/.sbx-up-{uuid.uuid4().hex}.tar"
        self.write(tmp, buf.getvalue(), 0o600)
        q = shlex.quote(path)
        r = self.sandbox.commands.run(f"mkdir -p {q} && tar -xf {tmp} -C {q} --no-same-owner; "
                                      f"rc=$?; rm -f {tmp}; exit $rc")
        if r.exit_code:
            raise error_for("internal", f"unpacking in the sandbox failed: {r.stderr.strip()}")

    def download_dir(self, path, local):
        """Copies a directory of the sandbox to local (made if missing). Nothing in the
        archive is trusted: absolute names, "..", devices and links out are refused."""
        tmp = f"/tmp/.sbx-down-{uuid.uuid4().hex}.tar"
        r = self.sandbox.commands.run(f"tar -cf {tmp} -C {shlex.quote(path)} .")
        if r.exit_code:
            raise error_for("not_found", r.stderr.strip() or f"{path}: not a directory")
        try:
            data = self.read(tmp, format="bytes")
        finally:
            self.sandbox.commands.run(f"rm -f {tmp}")
        os.makedirs(local, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = [_checked(m) for m in tar.getmembers()]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(local, members=members, filter="data")
            else:  # before Python 3.11.4: the checks above are what stands
                tar.extractall(local, members=members)


def _checked(member):
    name = member.name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise error_for("invalid_argument", f"refused: the archive names {name}")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise error_for("invalid_argument", f"refused: {name} is not a file, directory or link")
    if member.issym() and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
        raise error_for("invalid_argument", f"refused: the link {name} points out")
    return member


class Ports:
    def __init__(self, sandbox):
        self.sandbox = sandbox

    def expose(self, port, public=False):
        """Publishes the guest's port at https://LABEL-PORT.BOX_DOMAIN: its URL. A private
        one needs the API key (Authorization: Bearer) from whoever opens it."""
        return self.sandbox._client.request(
            "POST", f"/v1/sandboxes/{self.sandbox.id}/ports",
            body={"port": int(port), "public": bool(public)})["url"]

    def unexpose(self, port):
        return self.sandbox._client.request(
            "DELETE", f"/v1/sandboxes/{self.sandbox.id}/ports/{int(port)}")


class Sandbox:
    """One sandbox. Sandbox.create(...) makes one (ready when it returns),
    Sandbox.connect(id) finds one; `with Sandbox.create() as sb:` deletes it at the end."""

    def __init__(self, client, info):
        self._client = client
        self.info = info
        self.commands = Commands(self)
        self.files = Files(self)
        self.ports = Ports(self)

    # -- the sandbox -------------------------------------------------------------
    @property
    def id(self):
        return self.info["id"]

    @property
    def url(self):
        return self.info["url"]

    @property
    def state(self):
        return self.info["state"]

    @classmethod
    def create(cls, name=None, type=None, ttl=None, network=True, labels=None, snapshot_id=None,
               url=None, api_key=None, ca_cert=None, timeout=300.0, auto_resume=True,
               egress=None, template=None):
        """A new sandbox, ready. ttl: seconds before it stops by itself (the plan's default
        when None). template: a template's name (Template.list(); not with snapshot_id):
        its files and start command, restored. auto_resume: a request to one of its port
        URLs resumes it when stopped.
        egress: its egress rules, {"allow": [...], "deny": [...]} (see set_egress).
        url, api_key, ca_cert: else SBX_URL, SBX_API_KEY, SBX_CA_CERT."""
        client = Client(url, api_key, ca_cert)
        body = {"network": bool(network), "autoResume": bool(auto_resume)}
        if egress is not None:
            body["egress"] = {"allow": list(egress.get("allow", ())),
                              "deny": list(egress.get("deny", ()))}
        for key, value in (("name", name), ("type", type), ("ttlSeconds", ttl),
                           ("labels", labels), ("snapshotId", snapshot_id),
                           ("template", template)):
            if value is not None:
                body[key] = value
        return cls(client, client.request("POST", "/v1/sandboxes", body=body, timeout=timeout))

    @classmethod
    def connect(cls, sandbox_id, url=None, api_key=None, ca_cert=None):
        client = Client(url, api_key, ca_cert)
        return cls(client, client.request("GET", f"/v1/sandboxes/{sandbox_id}"))

    @classmethod
    def list(cls, url=None, api_key=None, ca_cert=None, page_size=100):
        """The account's sandboxes (those this key may see), newest first, as Sandbox
        objects: every page of them (page_size a request, 1 to 1000)."""
        found, cursor = [], None
        while True:
            page = cls.list_page(limit=page_size, cursor=cursor, url=url, api_key=api_key,
                                 ca_cert=ca_cert)
            found.extend(page.sandboxes)
            cursor = page.next_cursor
            if not cursor:
                return found

    @classmethod
    def list_page(cls, limit=100, cursor=None, url=None, api_key=None, ca_cert=None):
        """One page of the account's sandboxes, newest first: a SandboxPage whose
        sandboxes are at most limit (1 to 1000) Sandbox objects and whose next_cursor,
        while there may be more, is the cursor of the page after (None at the end).
        The order holds while sandboxes come and go: no page repeats or skips one that
        was there throughout. A cursor not given by this service raises
        InvalidArgumentError."""
        client = Client(url, api_key, ca_cert)
        query = {"limit": limit}
        if cursor:
            query["cursor"] = cursor
        page = client.request("GET", "/v1/sandboxes", query=query)
        return SandboxPage([cls(client, info) for info in page["sandboxes"]],
                           page.get("nextCursor"))

    def refresh(self):
        self.info = self._client.request("GET", f"/v1/sandboxes/{self.id}")
        return self

    def stop(self):
        """Stops it with its memory kept (no running time billed until resume)."""
        self.info = self._client.request("POST", f"/v1/sandboxes/{self.id}/stop", timeout=300)
        return self

    def resume(self):
        self.info = self._client.request("POST", f"/v1/sandboxes/{self.id}/resume", timeout=300)
        return self

    def extend(self, ttl):
        """It now stops ttl seconds from now."""
        self.info = self._client.request("POST", f"/v1/sandboxes/{self.id}/extend",
                                         body={"ttlSeconds": int(ttl)})
        return self

    def set_auto_resume(self, on):
        """Switches autoResume: whether a request to one of its port URLs resumes it."""
        self.info = self._client.request("PATCH", f"/v1/sandboxes/{self.id}",
                                         body={"autoResume": bool(on)})
        return self

    def set_egress(self, allow=(), deny=()):
        """Replaces its egress rules, both lists (set_egress() clears them). Entries are
        CIDRs, addresses and domain names (a domain matches its subdomains too); deny is
        checked first; a non-empty allow means only those (and DNS) are reachable; host,
        private and special-purpose addresses never are. A ready sandbox's firewall
        changes before the answer, a stopped one's when it resumes."""
        self.info = self._client.request(
            "PATCH", f"/v1/sandboxes/{self.id}",
            body={"egress": {"allow": list(allow), "deny": list(deny)}})
        return self

    @property
    def egress(self):
        """Its egress rules as last answered: {"allow": [...], "deny": [...]}."""
        return self.info.get("egress", {"allow": [], "deny": []})

    def metrics(self, since_ms=None, limit=None):
        """CPU, memory, disk and network: the latest figures and its host's samples, oldest
        first (get_sandbox_metrics). since_ms: only samples after it (a sample's timeMs);
        limit: the newest that many."""
        query = {k: v for k, v in (("sinceMs", since_ms), ("limit", limit)) if v is not None}
        return self._client.request("GET", f"/v1/sandboxes/{self.id}/metrics", query=query)

    def fork(self, count=1, timeout=300.0):
        """count (1 to 10) running copies of it with its memory, each a Sandbox of its own
        (own id, hostname, MAC address and random state, billed on its own), ready: its
        processes run on in each, its files are there. It is paused for a moment and runs
        on. All or nothing: the plan's limits must take count more."""
        answer = self._client.request("POST", f"/v1/sandboxes/{self.id}/fork",
                                      body={"count": int(count)}, timeout=timeout)
        return [Sandbox(self._client, info) for info in answer["sandboxes"]]

    def kill(self):
        """Deletes it: its disk, memory and automatic snapshots go."""
        try:
            self.info = self._client.request("DELETE", f"/v1/sandboxes/{self.id}", timeout=300)
        except SbxError as e:
            if e.code != "not_found":
                raise

    # -- snapshots ---------------------------------------------------------------
    def snapshot(self, name=None, labels=None):
        """Saves its disk and memory: the snapshot (new sandboxes: create(snapshot_id=...))."""
        body = {k: v for k, v in (("name", name), ("labels", labels)) if v is not None}
        return self._client.request("POST", f"/v1/sandboxes/{self.id}/snapshots", body=body,
                                    timeout=600)

    def snapshots(self):
        return self._client.request("GET", "/v1/snapshots",
                                    {"sandboxId": self.id})["snapshots"]

    def delete_snapshot(self, snapshot_id):
        return self._client.request("DELETE", f"/v1/snapshots/{snapshot_id}")

    # -- context manager ---------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False

    def __repr__(self):
        return f"Sandbox({self.id!r}, state={self.state!r})"
