"""Pieces of the end-to-end telemetry tests against real vLLM (test_vllm_live.py).

- ``Phoenix``: starts Arize Phoenix (a real OTLP trace backend) on 127.0.0.1 and reads spans back.
- ``Prometheus``: starts a real Prometheus scraping given targets on 127.0.0.1 and queries it (its
  targets' health, and exemplars when started with ``exemplar-storage``).
- ``send_request``: one completion, streaming or not, optionally with a W3C traceparent; the id the
  server answered with and the time to first token the client saw.
- ``check_request_span_trees``: N requests → N span trees with the right names, links and attributes,
  and TTFT within ``tolerance_s`` of what the client measured.
- ``check_request_histograms``: Prometheus histogram counts equal the number of requests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import aiohttp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flatten(attrs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_s: float
    end_s: float
    attributes: dict[str, Any]


ROOT = Path(__file__).resolve().parents[2]
# Phoenix needs a newer FastAPI than vLLM allows, so it lives in its own virtual environment
# (scripts/install-test-backends.sh); $PHOENIX_PYTHON names another interpreter that has it.
PHOENIX_VENV_PYTHON = ROOT / ".venv" / "phoenix" / "bin" / "python"


def phoenix_python() -> str:
    python = os.environ.get("PHOENIX_PYTHON") or str(PHOENIX_VENV_PYTHON)
    assert Path(python).exists(), f"{python} missing: run scripts/install-test-backends.sh"
    return python


class Phoenix:
    """Arize Phoenix on loopback ports (HTTP and gRPC), its data in ``work_dir``; stop() ends it."""

    def __init__(self, work_dir: Path) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(self.http_port),
               "PHOENIX_GRPC_HOST": "127.0.0.1", "PHOENIX_GRPC_PORT": str(self.grpc_port),
               "PHOENIX_WORKING_DIR": str(work_dir), "PHOENIX_TELEMETRY_ENABLED": "false"}
        self._log = open(work_dir / "phoenix.log", "wb")
        self._proc = subprocess.Popen([phoenix_python(), "-m", "phoenix.server.main", "serve"], env=env,
                                      stdout=self._log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.otlp_http_endpoint = self.base  # OTEL_EXPORTER_OTLP_ENDPOINT (the SDK appends /v1/traces)
        self.otlp_grpc_endpoint = f"http://127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout_s: float = 60.0) -> "Phoenix":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"phoenix exited with {self._proc.returncode}; see phoenix.log")
            try:
                with urllib.request.urlopen(f"{self.base}/healthz", timeout=2):
                    return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError("phoenix did not become ready")

    def raw_spans(self, project: str = "default") -> list[dict]:
        """The span objects as Phoenix's REST API returns them (it leaves span links out)."""
        out, cursor = [], None
        while True:
            url = f"{self.base}/v1/projects/{project}/spans?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
            out.extend(body.get("data", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    def spans(self, project: str = "default") -> list[Span]:
        return [Span(name=s["name"], trace_id=s["context"]["trace_id"], span_id=s["context"]["span_id"],
                     parent_id=s.get("parent_id") or None,
                     start_s=_iso_seconds(s["start_time"]), end_s=_iso_seconds(s["end_time"]),
                     attributes=_flatten(s.get("attributes") or {}))
                for s in self.raw_spans(project)]

    def wait_for_spans(self, count: int, timeout_s: float = 60.0) -> list[Span]:
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


def _iso_seconds(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def check_request_span_trees(spans: list[Span], *, n: int, model: str, operation: str = "chat",
                             client_ttft_s: Mapping[str, float] | None = None, tolerance_s: float = 0.01,
                             callers: Mapping[str, tuple[str, str]] | None = None,
                             request_ids: set[str] | None = None) -> dict[str, Span]:
    """Assert ``n`` request trees; returns the request spans by gen_ai.response.id.

    ``client_ttft_s``: request id → TTFT the client measured (streaming): no server TTFT may exceed
    its client's, and the median difference must be within ``tolerance_s`` (pass a few ms plus one
    engine step). ``callers``: request id → (trace id, span id) of the
    ``traceparent`` the client sent; that request's span must be its child.
    """
    roots = [s for s in spans if s.name == f"{operation} {model}"]
    assert len(roots) == n, f"{len(roots)} request spans for {n} requests"
    by_id = {}
    for root in roots:
        attrs = root.attributes
        for key in ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.usage.input_tokens",
                    "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons", "gen_ai.response.id"):
            assert key in attrs, f"{root.name} lacks {key}"
        assert attrs["gen_ai.operation.name"] == operation and attrs["gen_ai.request.model"] == model
        children = {s.name: s for s in spans if s.parent_id == root.span_id}
        assert {"queue", "prefill"} <= set(children), f"children: {sorted(children)}"
        if attrs["gen_ai.usage.output_tokens"] > 1:
            assert "decode" in children
        for child in children.values():
            assert child.trace_id == root.trace_id
            assert root.start_s - 1e-6 <= child.start_s <= child.end_s <= root.end_s + 1e-6
        by_id[attrs["gen_ai.response.id"]] = root
    assert len(by_id) == n, "request ids are not unique"
    # The server's TTFT runs from receiving the request to sending the first chunk, inside the
    # client's: it may never be longer (2 ms for clock reads). How close it comes is judged on the
    # closest request: what the server misses is in every request's difference, while a busy host
    # only ever adds to the client's side (a fresh-clone CI run read 131, 34 and 5 ms: the median of
    # three was one hiccup away from failing).
    diffs = []
    for request_id, ttft in (client_ttft_s or {}).items():
        server = by_id[request_id].attributes["gen_ai.response.time_to_first_chunk"]
        assert server <= ttft + 0.002, f"{request_id}: server TTFT {server:.4f}s exceeds the client's {ttft:.4f}s"
        diffs.append(ttft - server)
    if diffs:
        closest = min(diffs)
        assert closest <= tolerance_s, f"client TTFT exceeds the server's by {closest:.4f}s (closest request), over {tolerance_s:.4f}s"
    for request_id, (trace_id, span_id) in (callers or {}).items():
        root = by_id[request_id]
        assert root.trace_id == trace_id and root.parent_id == span_id, f"{request_id} is not the caller's child"
    return by_id


REQUEST_COUNTS = ("sum(gen_ai_server_request_duration_seconds_count)",
                  "sum(gen_ai_server_time_to_first_token_seconds_count)", "sum(sidecar_requests_total)")


def prometheus_value(prometheus_base: str, expr: str) -> float:
    url = f"{prometheus_base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def check_request_histograms(prometheus_base: str, n: int, successful: int | None = None,
                             baseline: Mapping[str, float] | None = None) -> None:
    """Histogram counts on a Prometheus that scraped the sidecar equal the requests sent (plus
    ``baseline``, the values of REQUEST_COUNTS before them)."""
    base = baseline or {}
    duration, ttft, requests = REQUEST_COUNTS
    got = {expr: prometheus_value(prometheus_base, expr) for expr in REQUEST_COUNTS}
    want = {duration: base.get(duration, 0) + n, ttft: base.get(ttft, 0) + (n if successful is None else successful),
            requests: base.get(requests, 0) + n}
    assert got == want, f"got {got}, want {want} (baseline {dict(base)})"


class Prometheus:
    """A real Prometheus on a loopback port scraping ``targets`` every ``interval_s``; ``bearer_token``:
    the sidecar's HTTP token, when it has one; ``features``: ``--enable-feature`` values
    (``exemplar-storage``)."""

    def __init__(self, work_dir: Path, targets: list[str], interval_s: float = 1.0, *,
                 bearer_token: str | None = None, features: tuple[str, ...] = ()) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus not installed: run scripts/install-test-backends.sh"
        port = _free_port()
        config = work_dir / "prometheus.yml"
        auth = f"    authorization:\n      credentials: {json.dumps(bearer_token)}\n" if bearer_token else ""
        config.write_text(f"global:\n  scrape_interval: {round(interval_s * 1000)}ms\nscrape_configs:\n  - job_name: sidecar\n"
                          f"{auth}    static_configs:\n      - targets: {json.dumps(targets)}\n")
        self._log = open(work_dir / "prometheus.log", "wb")
        self._proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={work_dir / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}",
                                       *(f"--enable-feature={f}" for f in features)], stdout=self._log,
                                      stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"

    def _get(self, path: str, **params: str) -> Any:
        assert self._proc.poll() is None, f"prometheus exited with {self._proc.returncode}; see prometheus.log"
        url = f"{self.base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def targets(self) -> list[dict]:
        """The active scrape targets: ``health`` (``up`` once scraped), ``lastError`` (a refused scrape's reason)."""
        return self._get("/api/v1/targets")["activeTargets"]

    def wait_scraped(self, timeout_s: float = 30.0) -> dict:
        """Wait for a successful scrape of the (one) target; a failing one fails with Prometheus's reason."""
        deadline = time.monotonic() + timeout_s
        target: dict = {}
        while time.monotonic() < deadline:
            try:
                targets = self.targets()  # none until Prometheus has read its configuration
            except OSError:
                targets = []
            if targets:
                [target] = targets
                if target["health"] == "up":
                    return target
                assert target["health"] != "down", f"the scrape failed: {target.get('lastError')}"
            time.sleep(0.3)
        raise AssertionError(f"no successful scrape within {timeout_s} s: {target}")

    def exemplars(self, query: str, start: float, end: float | None = None) -> list[dict]:
        """``/api/v1/query_exemplars`` (needs ``features=("exemplar-storage",)``): per series, its
        ``seriesLabels`` and ``exemplars`` (``labels``, ``value``, ``timestamp``)."""
        return self._get("/api/v1/query_exemplars", query=query, start=f"{start:.3f}",
                         end=f"{time.time() + 1 if end is None else end:.3f}")

    def query(self, expr: str) -> list:
        assert self._proc.poll() is None, f"prometheus exited with {self._proc.returncode}; see prometheus.log"
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float:
        return prometheus_value(self.base, expr)

    def wait_for(self, expr: str, value: float, timeout_s: float = 60.0, *, at_least: bool = False) -> None:
        """Wait until ``expr`` is ``value`` (or, with ``at_least``, no less): each process pushes its
        metrics on its own clock, so one process's series can settle a push later than another's."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.value(expr)
                if last == value or (at_least and last >= value):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{expr} is {last}, expected {'at least ' if at_least else ''}{value}")

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


@dataclass
class ClientRequest:
    request_id: str
    stream: bool
    ttft_s: float | None  # streaming only: request sent → first chunk with text
    tokens: int


async def send_request(session: aiohttp.ClientSession, url: str, model: str, prompt: str, *, max_tokens: int,
                       stream: bool, headers: Mapping[str, str] | None = None) -> ClientRequest:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "temperature": 0.0,
            "ignore_eos": True}
    if stream:
        # The tokens are counted from the server's usage chunk: a chunk may carry several tokens when
        # the client reads behind the engine (seen on a loaded CI runner: 14 chunks for 16 tokens).
        body["stream_options"] = {"include_usage": True}
    start = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body, headers=dict(headers or {})) as response:
        assert response.status == 200, await response.text()
        if not stream:
            data = await response.json()
            return ClientRequest(data["id"], False, None, data["usage"]["completion_tokens"])
        request_id, ttft, tokens = None, None, None
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            request_id = chunk["id"]
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        assert request_id is not None and tokens is not None, "no usage chunk in the stream"
        return ClientRequest(request_id, True, ttft, tokens)
