"""Templates (docs/templates.md): list the ones this account can use, and build one in the
service from a Dockerfile and its context directory (POST /v1/templates)."""
import io
import os
import tarfile
import time

from ._http import Client


class Template:
    @staticmethod
    def list(url=None, api_key=None, ca_cert=None):
        """The templates this account can create sandboxes from (Sandbox.create(template=)):
        its own, the newest of each name, then the operator's published ones it has none of.
        Each a dict: name, snapshotId, type, sizeBytes, createdAt, published, own."""
        return Client(url, api_key, ca_cert).request("GET", "/v1/templates")["templates"]

    @staticmethod
    def build(name, context=".", dockerfile=None, no_cache=False, public=False, on_log=None,
              url=None, api_key=None, ca_cert=None, timeout=3600.0, poll=0.5):
        """Builds template name in the service from the context directory (sent as a tar
        archive, 16 MiB at most) and its Dockerfile (dockerfile: a path inside context,
        default Dockerfile). on_log(text) gets the build's log as it grows. Returns the
        ended build: a dict with state ("succeeded" or "failed"), exitCode (0 built, 1 a
        step failed, 2 refused), snapshotId and id. timeout: seconds to follow it."""
        client = Client(url, api_key, ca_cert)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            tar.add(context, arcname=".", filter=_plain)
        query = {"name": name, "dockerfile": dockerfile,
                 "noCache": "true" if no_cache else None, "public": "true" if public else None}
        build = client.post_tar("/v1/templates", query, buf.getvalue())
        offset, deadline = 0, time.monotonic() + timeout
        while True:
            build = client.request("GET", f"/v1/templates/builds/{build['id']}",
                                   {"logOffset": offset})
            if build["log"] and on_log:
                on_log(build["log"])
            offset = build["logOffset"]
            if build["state"] != "running" or time.monotonic() > deadline:
                return build
            time.sleep(poll)


def _plain(info):
    """Files, directories and links only, owned by nobody in particular."""
    if not (info.isfile() or info.isdir() or info.issym()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
