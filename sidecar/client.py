"""A small client for the sidecar's HTTP API, and the ``sidecar capture`` command built on it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import config
from .verdicts import FINAL


class SidecarError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('message') or body}")
        self.status = status
        self.body = body


class SidecarClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or config.endpoint()).rstrip("/")
        self.token = token if token is not None else os.environ.get(config.ENV_TOKEN) or None
        self.timeout = timeout

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
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
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

    def wait(self, capture_id: str, timeout: float = 300.0, poll: float = 0.25) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(capture_id)
            if status["state"] in FINAL:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"capture {capture_id} still {status['state']} after {timeout:.0f} s")
            time.sleep(poll)

    def summary(self, capture_id: str) -> dict[str, Any]:
        return self.request("GET", f"/profile/{capture_id}/summary")

    def download(self, path: str, dest: Path) -> Path:
        import urllib.request

        req = urllib.request.Request(self.url + path)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp, open(dest, "wb") as out:
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
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("capture", help="record N steps of a running engine through the sidecar and wait for the result")
    p.add_argument("--url", default=None, help=f"sidecar URL (default ${config.ENV_ENDPOINT} or {config.DEFAULT_ENDPOINT})")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--delay", type=int, default=None)
    p.add_argument("--activities", default=None, help="cpu,cuda (default: what the host has)")
    p.add_argument("--processes", default=None, help="e.g. worker, worker:0,engine_core")
    p.add_argument("--stacks", choices=("none", "sampled", "traced"), default=None,
                   help="Python stacks: sampled on a thread of the probe's own (cheap), or torch's traced stacks "
                        "where the engine allows them (see docs/api.md, Python stacks)")
    p.add_argument("--stack-hz", type=float, default=None, help="sampling rate of sampled stacks (default 1000)")
    p.add_argument("--with-stack", action="store_true", help="the same as --stacks sampled")
    p.add_argument("--record-shapes", action="store_true")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait for the steps")
    p.add_argument("--output", type=Path, default=None, help="also download the merged trace here")
    p.add_argument("--json", action="store_true", help="print the capture's status JSON")
    p.set_defaults(handler=_capture)


def _capture(args: argparse.Namespace) -> int:
    client = SidecarClient(args.url)
    try:
        started = client.start(
            args.steps, delay=args.delay, activities=args.activities, processes=args.processes,
            with_stack=args.with_stack or None, stacks=args.stacks, stack_hz=args.stack_hz,
            record_shapes=args.record_shapes or None, timeout_s=args.timeout,
        )
        status = client.wait(started["id"], timeout=(args.timeout or config.DEFAULT_CAPTURE_TIMEOUT_S) + 60)
        if args.output and status.get("trace"):
            client.download(status["trace"], args.output)
    except SidecarError as exc:
        print(f"sidecar capture: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as exc:
        print(f"sidecar capture: cannot reach the sidecar at {client.url}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=1) if args.json else describe(status))
    return 0 if status["state"] == "done" else 1
