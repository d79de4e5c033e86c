"""The one place the SDK speaks HTTP: the standard library's urllib with the service's
CA, JSON in and out, raw bytes for files, Server-Sent Events for exec's output, and
retries of what the service answered `unavailable` (nothing else is retried)."""
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from .errors import SbxError, error_for

RETRIES = 3        # attempts for an answer of `unavailable`
RETRY_DELAY = 0.5  # seconds, doubled each time


class Client:
    def __init__(self, url=None, api_key=None, ca_cert=None, timeout=60.0):
        url = url or os.environ.get("SBX_URL")
        api_key = api_key or os.environ.get("SBX_API_KEY")
        ca_cert = ca_cert or os.environ.get("SBX_CA_CERT") or None
        if not url:
            raise error_for("invalid_argument", "no service URL: pass url= or set SBX_URL "
                            "(https://sbx.example.com)")
        if not api_key:
            raise error_for("invalid_argument", "no API key: pass api_key= or set SBX_API_KEY "
                            "(sbx_…, from `sbx key create` or the account page)")
        url = url.rstrip("/")
        if url.endswith("/mcp"):
            url = url[:-4]
        self.url = url
        self.timeout = timeout
        self._key = api_key
        self._ssl = ssl.create_default_context(cafile=ca_cert) if url.startswith("https") else None

    def _open(self, method, path, query=None, body=None, raw=False, accept="application/json",
              timeout=None, content_type="application/octet-stream"):
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Authorization": f"Bearer {self._key}", "Accept": accept}
        data = None
        if raw:
            data = body if isinstance(body, bytes) else body.encode()
            headers["Content-Type"] = content_type
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        delay = RETRY_DELAY
        for attempt in range(RETRIES):
            request = urllib.request.Request(target, data=data, method=method, headers=headers)
            try:
                return urllib.request.urlopen(request, timeout=timeout or self.timeout,
                                              context=self._ssl)
            except urllib.error.HTTPError as e:
                error = _error_of(e)
                if error.code != "unavailable" or attempt == RETRIES - 1:
                    raise error from None
            except urllib.error.URLError as e:
                raise error_for("unavailable", f"cannot reach {target}: {e.reason}") from None
            time.sleep(delay)
            delay *= 2

    def request(self, method, path, query=None, body=None, timeout=None):
        """REST's JSON answer to one request."""
        with self._open(method, path, query, body, timeout=timeout) as res:
            text = res.read()
        return json.loads(text) if text else None

    def get_bytes(self, path, query=None):
        with self._open("GET", path, query, accept="application/octet-stream") as res:
            return res.read()

    def post_tar(self, path, query, data):
        """POST of a tar archive; REST's JSON answer."""
        with self._open("POST", path, query, body=data, raw=True,
                        content_type="application/x-tar") as res:
            return json.loads(res.read())

    def put_bytes(self, path, query, data):
        with self._open("PUT", path, query, body=data, raw=True) as res:
            return json.loads(res.read())

    def events(self, method, path, body, timeout=None):
        """The (event, data) pairs of a Server-Sent Events answer, as they arrive."""
        res = self._open(method, path, body=body, accept="text/event-stream", timeout=timeout)
        with res:
            if not res.headers.get("Content-Type", "").startswith("text/event-stream"):
                yield "answer", json.loads(res.read())
                return
            event, data = "message", []
            for line in res:
                line = line.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, json.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


def _error_of(e):
    try:
        body = json.loads(e.read())
        error = body["error"]
        return error_for(error["code"], error["message"], e.code)
    except (ValueError, KeyError, TypeError):
        return SbxError(f"HTTP {e.code} {e.reason}", code="internal", status=e.code)
