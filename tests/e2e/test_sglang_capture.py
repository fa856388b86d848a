"""Issue 12 end to end: the real multi-process SGLang server (CPU, from .venv/sglang/) with the plugin
loaded through SGLang's own ``sglang.srt.plugins`` entry point, and the sidecar beside it. One server
for this file (one to two minutes to start on 2 cores), ended with it, started in the background before
(``sglang_stack``: tests/e2e/conftest.py, tests/parallel_server.py) with ``--sleep-on-idle``, since its
scheduler polls its sockets without sleeping while idle otherwise: a whole core taken from the tests
that run meanwhile. `make test` runs these last, `make test-sglang` alone."""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from collections import Counter

import pytest

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.sglang


def test_three_step_capture_records_scheduler_and_http_server_with_their_phases(sglang_stack, background_load,
                                                                               tmp_path):
    client = SidecarClient(sglang_stack.sidecar_url)
    procs = {p["role"]: p for p in client.request("GET", "/processes")["processes"]}
    assert set(procs) == {"api_server", "scheduler"}, procs
    assert procs["scheduler"]["engine"].startswith("sglang"), procs["scheduler"]

    with background_load(sglang_stack, concurrency=2, duration_s=60, max_tokens=32) as load:
        time.sleep(1.5)
        started = client.start(3)
        status = client.wait(started["id"], timeout=120)
        load.stop()
    result = load.join()
    assert result.results and not result.failures, [r.error for r in result.failures][:3]
    assert status["state"] == "done", status
    roles = Counter(p["role"] for p in status["processes"])
    assert roles == {"api_server": 1, "scheduler": 1}, status["processes"]
    by_role = {p["role"]: p for p in status["processes"]}
    scheduler, server = by_role["scheduler"], by_role["api_server"]
    assert scheduler["steps_recorded"] == 3 and scheduler["first_step"] == status["start_step"], status

    trace = json.load(gzip.open(client.download(status["trace"], tmp_path / "trace.json.gz")))
    events = trace["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("pid") == scheduler["pid"] and e.get("name", "").startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{i}" for i in range(3)], steps
    # The scheduler process runs the model: its ops are in the trace.
    assert any(e.get("cat") == "cpu_op" and e.get("pid") == scheduler["pid"] for e in events)
    # The HTTP server recorded the capture's window, on its event loop.
    assert any(e.get("pid") == server["pid"] and e.get("ph") == "X" for e in events), "no events from the HTTP server"
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert "scheduler" in names[scheduler["pid"]]

    # Step anatomy: the scheduler's phases are SGLang's own stage ranges, entered only under a
    # profiler; the HTTP server's the plugin's, switched on for the capture.
    table = trace["inference_sidecar"]["phase_ranges"]
    assert table == {"scheduler.get_next_batch_to_run": "schedule", "scheduler.run_batch": "forward",
                     "scheduler.process_batch_result": "update", "sidecar: process inputs": "input",
                     "sidecar: process outputs": "output"}, table
    anatomy = client.summary(status["id"])["anatomy"]
    assert anatomy is not None
    rows = {p["pid"]: p for p in anatomy["processes"]}
    sched = rows[scheduler["pid"]]
    assert len(sched["steps"]) == 3 and sched["complete_steps"] >= 2, sched
    for step in (s for s in sched["steps"] if not s["partial"]):
        assert step["phases_us"]["schedule"] > 0 and step["phases_us"]["forward"] > 0, step
    assert sched["total_us"]["update"] > 0, sched
    assert anatomy["largest"] is not None and f"largest phase {anatomy['largest']['label']}" in status["headline"]
    (between,) = [b for b in anatomy["between_forwards"] if b["pid"] == scheduler["pid"]]
    assert between["mean_host_us"] > 0


def _complete(stack, prompt: str, max_tokens: int) -> dict:
    body = {"model": stack.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    req = urllib.request.Request(f"{stack.server_url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _metric_sum(client: SidecarClient, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get_bytes("/metrics").decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _settled(client: SidecarClient, names: tuple[str, ...], push_s: float = 6.0, timeout_s: float = 60) -> dict:
    """The metrics once two reads a push interval apart agree: every earlier request is in them."""
    last = {n: _metric_sum(client, n) for n in names}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(push_s)
        now = {n: _metric_sum(client, n) for n in names}
        if now == last:
            return now
        last = now
    raise AssertionError(f"the metrics kept changing: {last}")


def test_requests_become_the_genai_metrics_and_recorder_rows(sglang_stack):
    """SGLang's own request time stats, read in its HTTP server, reach the sidecar's /metrics (TTFT,
    duration, requests) and the flight recorder's request ring, one per request."""
    client = SidecarClient(sglang_stack.sidecar_url)
    names = ("gen_ai_server_time_to_first_token_seconds_count", "gen_ai_server_request_duration_seconds_count",
             "sidecar_requests_total")
    before = _settled(client, names)  # what earlier requests left, once pushed
    since_ns = time.time_ns()
    for salt in range(3):
        _complete(sglang_stack, f"the step number {salt} of the engine", max_tokens=6)
    deadline = time.monotonic() + 30  # the HTTP server pushes its metrics every 5 s
    while time.monotonic() < deadline:
        after = {n: _metric_sum(client, n) for n in names}
        if all(after[n] - before[n] >= 3 for n in names):
            break
        time.sleep(0.5)
    assert {n: after[n] - before[n] for n in names} == {n: 3 for n in names}, (before, after)
    recorder = client.request("GET", "/recorder?seconds=60")
    (server,) = [p for p in recorder["processes"] if p["process"]["role"] == "api_server"]
    mine = [r for r in server["requests"] if r["arrived_ns"] >= since_ns]
    assert len(mine) == 3 and all(r["outcome"] == "finished" and r["ttft_ms"] > 0 and r["output_tokens"] == 6
                                  for r in mine), mine


def test_requests_in_flight_come_from_the_scheduler(sglang_stack):
    """``GET /requests`` lists a request SGLang is decoding, as its scheduler holds it (phase, tokens,
    age), once; the HTTP server answers that it does not know requests; the in-flight gauge counts it.
    Its client leaves (SGLang aborts it): it is listed no more."""
    client = SidecarClient(sglang_stack.sidecar_url)
    rid = f"sidecar-in-flight-{time.time_ns()}"
    body = {"model": sglang_stack.served_name, "prompt": "tell a long story about the engine", "max_tokens": 1500,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "rid": rid}
    req = urllib.request.Request(f"{sglang_stack.server_url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    stream = urllib.request.urlopen(req, timeout=120)
    try:
        assert stream.readline().startswith(b"data:")  # its first tokens are out: it is decoding
        seen, gauge, deadline = None, 0.0, time.monotonic() + 60
        while time.monotonic() < deadline and (seen is None or gauge < 1):
            listing = client.request("GET", "/requests")
            mine = [r for r in listing["requests"] if r["id"] == rid]
            if mine and mine[0]["phase"] == "decode" and mine[0]["output_tokens"] > 0:
                seen = seen or (mine, listing)
                gauge = _metric_sum(client, "sidecar_requests_in_flight")  # from the heartbeats (2 s)
            time.sleep(0.2)
        assert seen is not None, "the request was never listed as decoding"
        (found,), listing = seen  # listed once
        assert found["process"].startswith("scheduler") and found["prompt_tokens"] > 0, found
        assert 0 <= found["age_s"] < 60 and 0 < found["output_tokens"] < 1500, found
        knows = sorted((p["process"].split(" (")[0], p["knows_requests"]) for p in listing["processes"])
        assert knows == [("API server", False), ("scheduler rank 0", True)], listing["processes"]
        assert gauge >= 1, "the heartbeats' in-flight count never showed the request"
    finally:
        stream.close()  # the client leaves: SGLang aborts the request
    deadline = time.monotonic() + 60
    while rid in {r["id"] for r in client.request("GET", "/requests")["requests"]}:
        assert time.monotonic() < deadline, "the aborted request is still listed"
        time.sleep(0.2)
