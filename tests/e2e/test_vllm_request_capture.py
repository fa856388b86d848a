"""Issue 11, request-scoped capture, on real vLLM: a completion with ``X-Sidecar-Profile: 1`` is
captured from its prefill step to its last decode step in the engine core and the worker, the capture
names the request, and a second profiled request meanwhile is served uncaptured and counted skipped.

The session's server exports no spans (no OTLP endpoint in its environment), so the request span's
``sidecar.capture.id`` is checked on vLLM's real OutputProcessor instead
(tests/telemetry/test_request_capture_spans.py)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request

import pytest

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm

PROMPT = [11, 12, 13, 14, 15]
MAX_TOKENS = 8  # one prefill step, seven decode steps


def _complete(stack, headers: dict[str, str], max_tokens: int = MAX_TOKENS) -> dict:
    body = {"model": stack.served_name, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    req = urllib.request.Request(f"{stack.server_url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _get(stack, path: str, **params) -> dict:
    return SidecarClient(stack.sidecar_url, timeout=30).request("GET", path, params or None)


def _skipped_busy(stack) -> float:
    with urllib.request.urlopen(f"{stack.sidecar_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(r'^sidecar_request_captures_total\{outcome="skipped",reason="busy"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _idle(stack) -> None:
    """Every engine process connected (an earlier test may have restarted the sidecar), and no job of
    an earlier test still running (one at a time)."""
    stack.wait_for_processes(3, timeout=30)
    deadline = time.monotonic() + 60
    while _get(stack, "/healthz")["active_capture"] is not None:
        assert time.monotonic() < deadline, "a capture of an earlier test is still running"
        time.sleep(0.2)


def _captures_of(stack, request_ids: set[str]) -> list[dict]:
    return [c for c in _get(stack, "/profiles")["captures"] if (c.get("request") or {}).get("id") in request_ids]


def _final(stack, capture_id: str) -> dict:
    return SidecarClient(stack.sidecar_url, timeout=30).wait(capture_id, timeout=60, poll=0.1)


def test_a_profiled_request_is_captured_from_its_prefill_to_its_last_step(vllm_stack):
    stack = vllm_stack
    _idle(stack)
    started = time.time()
    body = _complete(stack, {"X-Sidecar-Profile": "1"})
    request_id = body["id"] + "-0"  # vLLM's completions run prompt i of cmpl-X as engine request cmpl-X-i
    (listed,) = _captures_of(stack, {request_id})
    capture = _final(stack, listed["id"])
    assert capture["state"] == "done", capture
    assert capture["request"]["id"] == request_id and capture["request"]["max_steps"] == 32, capture["request"]
    assert capture["request"]["asked_by"].startswith("API server")
    by_role = {p["role"]: p for p in capture["processes"]}
    assert set(by_role) == {"api_server", "engine_core", "worker"}, capture
    core, worker = by_role["engine_core"], by_role["worker"]
    # The server was idle: every process began at the request's first step and ended with its last.
    assert worker["first_step"] == core["first_step"] == capture["start_step"], capture
    assert worker["steps_recorded"] == core["steps_recorded"] == capture["steps"] == MAX_TOKENS, capture
    assert capture["notes"] == [] and capture["reason"] is None, capture

    # Which steps were the request's, from the flight recorder: the worker's steps while it ran.
    recorder = _get(stack, "/recorder", seconds=time.time() - started + 5, processes="worker")
    (rows,) = [p["steps"] for p in recorder["processes"]]
    (finished,) = [r for p in _get(stack, "/recorder", seconds=time.time() - started + 5,
                                   processes="api_server")["processes"] for r in p["requests"] if r["id"] == request_id]
    mine = [s for s in rows if s["working"] and s["start_ns"] >= finished["arrived_ns"]
            and s["end_ns"] <= finished["finished_ns"]]
    prefill = [s for s in mine if s["prefill_tokens"]]
    decode = [s for s in mine if s["decode_tokens"]]
    assert prefill and prefill[0]["prefill_tokens"] == len(PROMPT), mine
    assert len(decode) == MAX_TOKENS - 1, mine
    # A recorder row's ``step`` is the count of working steps once it ended; a capture numbers a step
    # by the count before it.
    first_request_step, last_request_step = prefill[0]["step"] - 1, decode[-1]["step"] - 1
    for process in (core, worker):
        assert process["first_step"] <= first_request_step, (process, prefill[0])
        assert process["first_step"] + process["steps_recorded"] - 1 >= last_request_step, (process, decode[-1])

    summary = SidecarClient(stack.sidecar_url).summary(capture["id"])
    assert len([s for s in summary["steps"] if "worker" in str(s["process"])]) == MAX_TOKENS


def test_a_second_profiled_request_meanwhile_is_served_uncaptured_and_counted(vllm_stack):
    stack = vllm_stack
    _idle(stack)
    busy_before = _skipped_busy(stack)
    first: list[dict] = []
    # Longer than the cap: its capture ends after 32 steps while the request goes on.
    thread = threading.Thread(target=lambda: first.append(_complete(stack, {"X-Sidecar-Profile": "1"}, max_tokens=64)))
    thread.start()
    deadline = time.monotonic() + 30
    while (active := _get(stack, "/healthz")["active_capture"]) is None:
        assert time.monotonic() < deadline and thread.is_alive(), "the first request's capture never ran"
        time.sleep(0.005)
    second = _complete(stack, {"X-Sidecar-Profile": "true"}, max_tokens=4)  # while that capture runs
    thread.join(timeout=120)
    assert len(second["choices"][0]["text"]) > 0 and len(first) == 1
    capture = _final(stack, active)
    assert capture["request"]["id"] == first[0]["id"] + "-0", capture["request"]
    assert capture["state"] == "done" and capture["steps"] == 32, capture  # capped
    assert not _captures_of(stack, {second["id"] + "-0"})
    assert _skipped_busy(stack) == busy_before + 1


def test_a_header_that_is_no_boolean_is_ignored(vllm_stack):
    stack = vllm_stack
    _idle(stack)
    before = {c["id"] for c in _get(stack, "/profiles")["captures"]}
    for headers in ({"X-Sidecar-Profile": "banana"}, {"baggage": "sidecar.profile=maybe"}, {"X-Sidecar-Profile": "0"}):
        body = _complete(stack, headers, max_tokens=2)
        assert body["choices"][0]["finish_reason"] == "length"
    assert {c["id"] for c in _get(stack, "/profiles")["captures"]} == before
    # Baggage asks too.
    body = _complete(stack, {"baggage": "userid=7, sidecar.profile=1"}, max_tokens=2)
    (listed,) = _captures_of(stack, {body["id"] + "-0"})
    assert _final(stack, listed["id"])["state"] == "done"
