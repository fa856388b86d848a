"""A small client for the sidecar's HTTP API (the CLI's commands, tests and benchmarks use it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..common import config
from ..common.verdicts import FINAL

if TYPE_CHECKING:
    import urllib.request


class SidecarError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        # "HTTP 400 (steps): must be between 1 and 1000, got 0": the parameter at fault, when the sidecar names one.
        message = str(body.get("message") or body)
        param = body.get("param") if isinstance(body, dict) else None
        named = f" ({param})" if param and not message.startswith(f"{param}:") else ""
        super().__init__(f"HTTP {status}{named}: {message}")
        self.status = status
        self.body = body


class JobTimeout(TimeoutError):
    """A job (capture, scan) the sidecar answered for did not reach a final state in the time waited."""


def direct_opener() -> urllib.request.OpenerDirector:
    """A urllib opener that ignores HTTP(S)_PROXY: for a sidecar on this host, which a proxy of the
    environment has no business seeing (it would read the token) and cannot reach anyway."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """How to reach ``url``: directly when its host is this machine (``config.reaches_this_machine``), else as
    the environment says (its proxies and NO_PROXY, read now: ``urllib.request.urlopen`` keeps those
    of its first call for the life of the process)."""
    import urllib.parse
    import urllib.request

    if config.reaches_this_machine(urllib.parse.urlsplit(url).hostname or ""):
        return direct_opener()
    return urllib.request.build_opener()


class SidecarClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or config.endpoint()).rstrip("/")
        self.token = token if token is not None else os.environ.get(config.ENV_TOKEN) or None
        self.timeout = timeout
        self._opener = opener_for(self.url)  # the bearer token never goes through a proxy to this host

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A call whose answer is JSON, decoded."""
        return json.loads(self.call(method, path, params) or b"{}")

    def get_bytes(self, path: str, params: dict[str, Any] | None = None) -> bytes:
        """A GET whose body is returned as it is (text, or JSON to be written to a file)."""
        return self.call("GET", path, params)

    def call(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> bytes:
        """The body of the answer; an HTTP error is ``SidecarError`` with the sidecar's JSON body.
        ``body``: sent as JSON."""
        import urllib.error  # imported here: every `sidecar` sub-command loads this module to register
        import urllib.parse
        import urllib.request

        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path + query, method=method, data=data)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read() or b"{}")
            except ValueError:
                body = {"message": exc.reason}
            raise SidecarError(exc.code, body) from None

    def start(self, steps: int, **params: Any) -> dict[str, Any]:
        clean = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items() if v is not None}
        return self.request("POST", "/profile/start", {"steps": steps, **clean})

    def status(self, capture_id: str) -> dict[str, Any]:
        return self.request("GET", f"/profile/{capture_id}")

    def wait(self, capture_id: str, timeout: float = 300.0, poll: float = 0.25,
             on_poll: Callable[[dict[str, Any]], None] | None = None, path: str = "/profile/") -> dict[str, Any]:
        """Poll ``path + id`` (a capture; ``/sync/`` for a scan) until it is final; ``on_poll`` sees each
        answer. ``JobTimeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.request("GET", f"{path}{capture_id}")
            if on_poll is not None:
                on_poll(status)
            if status["state"] in FINAL:
                return status
            if time.monotonic() > deadline:
                kind = {"/sync": "scan", "/modules": "module timing"}.get(path.rstrip("/"), "capture")
                raise JobTimeout(f"{kind} {capture_id} still {status['state']} after {timeout:.0f} s of waiting")
            time.sleep(poll)

    def start_modules(self, steps: int, **params: Any) -> dict[str, Any]:
        """Start a module-timing job (``/modules/start``); wait for it with ``wait(id, path="/modules/")``."""
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("POST", "/modules/start", {"steps": steps, **clean})

    def modules(self, job_id: str) -> dict[str, Any]:
        """A module timing's state and, once it ended, its tables (``/modules/{id}``)."""
        return self.request("GET", f"/modules/{job_id}")

    def summary(self, capture_id: str) -> dict[str, Any]:
        return self.request("GET", f"/profile/{capture_id}/summary")

    def download(self, path: str, dest: Path) -> Path:
        import urllib.request

        req = urllib.request.Request(self.url + path)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with self._opener.open(req, timeout=self.timeout) as resp, open(dest, "wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
        return dest


def describe(status: dict[str, Any]) -> str:
    """Human lines for a finished capture: state, processes, steps, files."""
    lines = [f"capture {status['id']}: {status['state']}" + (f" ({status['reason']})" if status.get("reason") else "")]
    for p in status["processes"]:
        detail = p["error"] or (f"{p['steps_recorded']} steps" if p["role"] != "api_server" else "capture window")
        size = f", {p['bytes'] / 1024:.1f} KiB" if p.get("bytes") else ""
        stacks = f", {p['stacks']} stacks" if p.get("stacks") not in (None, "none") else ""
        lines.append(f"  {p['label']:<34} {p['state']:<9} {detail}{size}{stacks}  {p.get('file') or ''}")
    if status.get("trace"):
        lines.append(f"  merged trace: {status['trace']} ({status['trace_bytes'] / 1024:.1f} KiB)")
    if status.get("headline"):
        lines.append(f"  {status['headline']}")
    if status.get("backend") == "nsys" and status.get("nsys"):
        lines.append(f"  nsys report: {status['nsys'].get('report')}")
    return "\n".join(lines)
