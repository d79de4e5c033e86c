"""The reference prompts and the rest of the Python SDK's surface, run by
test_sdk_python.py with the SDK as `pip install ./sdk/python` put it in a venv (SBX_URL,
SBX_API_KEY and SBX_CA_CERT in the environment). Prints one JSON line per step."""
import json
import os
import subprocess
import sys
import tempfile
import time

import sbx
from sbx import NotFoundError, Sandbox, SbxError


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


with Sandbox.create(name="sdk-py", ttl=1800, egress={"deny": ["198.51.100.7"]}) as sb:
    say("create", id=sb.id, state=sb.state, url=sb.url, egress=sb.egress)
    r = sb.commands.run("python3 -c 'print(2**100)'")
    say("python", exit_code=r.exit_code, stdout=r.stdout)
    handle = sb.commands.run("sleep 30; echo done", background=True)
    say("detached", pid=handle.pid, first=handle.poll())
    r = handle.wait(timeout=120)
    say("waited", exit_code=r.exit_code, stdout=r.stdout)
    # Streaming: the command goes on only once its first line has reached the callback.
    seen = []

    def on_stdout(text):
        seen.append(text)
        if text.startswith("ready"):
            sb.commands.run("touch /tmp/go")
    r = sb.commands.run("echo ready; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after; "
                        "echo oops >&2; exit 4", on_stdout=on_stdout, on_stderr=seen.append)
    say("streamed", exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr, seen=seen)
    say("stdin", stdout=sb.commands.run("wc -c", stdin=b"\x00\x01\x02").stdout)
    # Files, one and a directory both ways.
    sb.files.write("/root/hello.sh", "#!/bin/sh\necho hello\n", mode=0o755)
    say("file", text=sb.files.read("/root/hello.sh"),
        run=sb.commands.run("/root/hello.sh").stdout,
        listed=[(e["name"], e["type"], oct(e["mode"])) for e in sb.files.list("/root")
                if e["name"] == "hello.sh"])
    src = tempfile.mkdtemp()
    os.makedirs(os.path.join(src, "sub"))
    with open(os.path.join(src, "sub", "data.bin"), "wb") as f:
        f.write(bytes(range(256)) * 10)
    os.symlink("sub/data.bin", os.path.join(src, "link"))
    sb.files.upload_dir(src, "/root/proj")
    back = tempfile.mkdtemp()
    sb.files.download_dir("/root/proj", back)
    with open(os.path.join(back, "sub", "data.bin"), "rb") as f:
        same = f.read() == bytes(range(256)) * 10
    say("dirs", same=same, link=os.readlink(os.path.join(back, "link")),
        guest=sb.commands.run("wc -c < /root/proj/link").stdout)
    # A web server whose public URL is fetched.
    sb.commands.run("cd /tmp && python3 -m http.server 8000", background=True)
    sb.commands.run("for i in $(seq 120); do curl -s -o /dev/null localhost:8000 && exit 0; "
                    "sleep 0.5; done; exit 1")
    url = sb.ports.expose(8000, public=True)
    host, port = url.split("//")[1].split(":")
    page = subprocess.run(["curl", "-s", "--cacert", os.environ["SBX_CA_CERT"], "--resolve",
                           f"{host}:{port}:127.0.0.1", url], capture_output=True, text=True)
    say("port", url=url, listing="Directory listing" in page.stdout)
    say("processes", count=len(sb.commands.list()))
    m = sb.metrics(limit=2)
    say("metrics", sandbox_id=m["sandboxId"], vcpus=m["vcpus"], sampling=m["sampling"],
        at_most=len(m["samples"]) <= 2,
        newer=len(sb.metrics(since_ms=int(time.time() * 1000) + 3600_000)["samples"]))
    # Typed errors that carry the catalogued codes.
    try:
        sb.commands.run("true", timeout=0)
    except SbxError as e:
        say("refused", cls=type(e).__name__, code=e.code, status=e.status, message=e.message)
    say("listed", ids=[s.id for s in Sandbox.list()])
    sid = sb.id
    sb.extend(3600)
    say("stop", state=sb.stop().state)
    # Egress rules of the stopped sandbox: both lists replaced, then cleared.
    egress_set = sb.set_egress(allow=["2001:DB8::1/32", "203.0.113.7"]).egress
    say("egress", set=egress_set, got=sb.refresh().egress, cleared=sb.set_egress().egress)
    say("resume", state=sb.resume().state, still=sb.commands.run("cat /tmp/go && echo kept").stdout)
    # A running copy with its memory: the file is there, its own id and hostname.
    (copy,) = sb.fork(count=1)
    say("fork", state=copy.state, other=copy.id != sb.id,
        still=copy.commands.run("cat /tmp/go && echo kept").stdout,
        hostname=copy.commands.run("hostname").stdout == copy.info["label"] + "\n")
    # Two sandboxes now: a page at a time, one each, the same as all at once.
    first = Sandbox.list_page(limit=1)
    second = Sandbox.list_page(limit=1, cursor=first.next_cursor)
    try:
        Sandbox.list_page(cursor="not-a-cursor")
        bad = None
    except SbxError as e:
        bad = {"cls": type(e).__name__, "code": e.code, "status": e.status, "message": e.message}
    say("paged", all=[s.id for s in Sandbox.list()], by_one=[s.id for s in Sandbox.list(page_size=1)],
        first=[s.id for s in first.sandboxes], cursor=bool(first.next_cursor),
        second=[s.id for s in second.sandboxes], end=second.next_cursor, copy=copy.id, bad=bad)
    copy.kill()
try:
    Sandbox.connect(sid)
    say("after", found=True)
except NotFoundError as e:
    say("after", found=False, code=e.code)
# A template built in the service from a context directory, listed, and created from.
ctx = tempfile.mkdtemp()
with open(os.path.join(ctx, "Dockerfile"), "w") as f:
    f.write("FROM sbx\nCOPY note.txt /opt/note.txt\nRUN echo built >> /opt/note.txt\n")
with open(os.path.join(ctx, "note.txt"), "w") as f:
    f.write("from the context\n")
logs = []
build = sbx.Template.build("sdk-tpl", ctx, on_log=logs.append)
listed = [(t["name"], t["own"]) for t in sbx.Template.list()]
with Sandbox.create(template="sdk-tpl") as made:
    note = made.commands.run("cat /opt/note.txt").stdout
say("template", state=build["state"], exit_code=build["exitCode"],
    snapshot=build["snapshotId"].startswith("snap_"), steps="Step 3/3" in "".join(logs),
    listed=listed, note=note)
say("done", version=sbx.__version__, python=sys.version.split()[0])
