"""Issue 12 end to end: examples/continuous_batching_server.py, a hand-written serving loop instrumented
with ``sidecar.instrument``, as a real process beside the real sidecar (its CLI process), under load.

One test, one server, in order: a 4-step capture (done, ProfilerStep events, the single process's
shape), a sync scan that finds the example's planted ``.item()`` (``--plant-sync``,
SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1: no GPU here) and classes its allowlisted token readback as
expected, the flight recorder's steps and finished requests (``/recorder``), the TTFT histogram on
the sidecar's ``/metrics`` counting every request (fed by the signed metric push), and every request's
span tree, exported by the server's real OTLP/HTTP exporter to a small OTLP receiver in this test.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from otlp_receiver import OtlpReceiver
from sidecar.cli.client import SidecarClient
from sidecar.devtools.stack import Stack
from sidecar.common.verdicts import FINAL

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "continuous_batching_server.py"
STEPS = 4
MODEL = "tiny-example"


class ExampleStack(Stack):
    engine_label = "the example server"
    log_name = "example-server.log"
    health_path = "/health"
    processes = 1

    def server_command(self) -> list[str]:
        return [sys.executable, str(EXAMPLE), "--model", str(self.model_dir), "--served-name", self.served_name,
                "--port", str(self.server_port), "--max-batch", "4", *self.server_args]


class Load:
    """Streaming clients in threads until stopped; each request's id, tokens and client TTFT kept."""

    def __init__(self, url: str, clients: int = 3, max_tokens: int = 8) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.done: dict[str, dict] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def one(self, prompt: str) -> None:
        body = json.dumps({"prompt": prompt, "max_tokens": self.max_tokens}).encode()
        start = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/generate", data=body), timeout=60) as resp:
            rid, ttft, chunks = resp.headers["X-Request-Id"], None, 0
            while chunk := resp.read1(4096):
                ttft = ttft if ttft is not None else time.monotonic() - start
                chunks += 1
        self.done[rid] = {"ttft_s": ttft, "chunks": chunks}

    def _client(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.one(f"the model server token request {i} {n} " * (1 + n % 3))
            except Exception as exc:  # noqa: BLE001 (reported by the test)
                self.errors.append(repr(exc))
            n += 1

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


@pytest.fixture
def example(tiny_model, tmp_path):
    receiver = OtlpReceiver()
    stack = ExampleStack(model_dir=tiny_model, work_dir=tmp_path, served_name=MODEL, server_args=("--plant-sync",),
                         env={"SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1", "OMP_NUM_THREADS": "1",
                              "SIDECAR_METRICS_PUSH_INTERVAL_MS": "300",
                              "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
                              "OTEL_METRICS_EXPORTER": "none"})
    try:
        stack.start(server_timeout=120)
        yield stack, receiver
    finally:
        stack.close()
        receiver.close()


def _wait(client: SidecarClient, path: str, timeout: float = 40) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.request("GET", path)
        if body["state"] in FINAL or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def _ttft_count(stack: Stack) -> float:
    with urllib.request.urlopen(f"{stack.sidecar_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"gen_ai_server_time_to_first_token_seconds_count\{(.*)\} (\S+)", line)
        if match and f'gen_ai_request_model="{MODEL}"' in match.group(1):
            total += float(match.group(2))
    return total


def test_the_example_server_is_captured_scanned_recorded_and_traced(example):
    stack, receiver = example
    client = SidecarClient(stack.sidecar_url, token="")
    [process] = stack.wait_for_processes(1)
    assert process["role"] == "scheduler" and process["engine"] == "example-cb"
    assert process["label"] == f"scheduler (pid {process['pid']})"

    with Load(stack.server_url) as load:
        # A capture of the one step-driven process: STEPS engine steps, torch's ProfilerStep events.
        started = client.request("POST", "/profile/start", {"steps": STEPS})
        capture = _wait(client, f"/profile/{started['id']}")
        assert capture["state"] == "done", capture
        [proc] = capture["processes"]
        assert proc["role"] == "scheduler" and proc["steps_recorded"] == STEPS and proc["state"] == "done"
        events = json.loads(gzip.decompress(client.get_bytes(capture["trace"])))["traceEvents"]
        assert len({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}) == STEPS
        assert any(e.get("cat") == "cpu_op" for e in events), "no torch ops in the trace"

        # A sync scan: the planted .item() is the one hidden sync of the example's own code.
        started = client.request("POST", "/sync/start", {"steps": 3})
        scan = _wait(client, f"/sync/{started['id']}")
        assert scan["state"] == "done", scan
        ours = [s for s in scan["sites"] if s["file"] == str(EXAMPLE)]
        hidden = [s for s in ours if s["classification"] == "hidden"]
        planted = next(i for i, line in enumerate(EXAMPLE.read_text().splitlines(), 1) if "# PLANTED SYNC" in line)
        assert [(s["line"], s["function"], s["op"]) for s in hidden] == [(planted, "forward", "item")], ours
        assert hidden[0]["count"] == 3 and hidden[0]["phase"] == "forward"
        assert [(s["function"], s["op"], s["phase"]) for s in ours if s["classification"] == "expected"] == [
            ("sample", "tolist", "sampling")]
    assert not load.errors, load.errors[:3]
    sent = load.done
    assert len(sent) >= 3 and all(r["chunks"] > 0 for r in sent.values())

    # The flight recorder: the process's steps with their counts, and every finished request.
    recorder = client.request("GET", "/recorder", {"seconds": 300})
    [rec] = recorder["processes"]
    working = [s for s in rec["steps"] if s["working"]]
    assert working and all(s["batch"] >= 1 and s["tokens"] >= s["batch"] for s in working)
    assert set(sent) <= {r["id"] for r in rec["requests"]}
    assert all(r["outcome"] == "finished" and r["ttft_ms"] is not None for r in rec["requests"])

    # The TTFT histogram on the sidecar's /metrics counts every request (pushed every 0.3 s).
    deadline = time.monotonic() + 10
    while _ttft_count(stack) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ttft_count(stack) == len(sent)

    # Each request's span tree, as the server's OTLP exporter sent it.
    deadline = time.monotonic() + 10
    while True:
        spans = receiver.snapshot()
        roots = {s["attributes"].get("gen_ai.response.id"): s for s in spans if s["name"] == f"text_completion {MODEL}"}
        if set(sent) <= set(roots) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(roots) == set(sent)
    for rid, root in roots.items():
        attrs = root["attributes"]
        [reason], output = attrs["gen_ai.response.finish_reasons"], attrs["gen_ai.usage.output_tokens"]
        assert attrs["gen_ai.request.model"] == MODEL and attrs["gen_ai.usage.input_tokens"] > 0
        assert (reason, output) == ("length", 8) or (reason == "stop" and 1 <= output <= 8), attrs
        assert 0 < attrs["gen_ai.response.time_to_first_chunk"] <= sent[rid]["ttft_s"] + 0.002
        children = {s["name"]: s for s in spans if s["parent_id"] == root["span_id"]}
        assert set(children) == {"queue", "prefill", "decode"} - (set() if output > 1 else {"decode"}), children
        for child in children.values():
            assert root["start_ns"] <= child["start_ns"] <= child["end_ns"] <= root["end_ns"]
