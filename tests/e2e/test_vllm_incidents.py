"""Issue 11 on real vLLM with the slow-token fixture model (tests/fixtures/slow_token_model): the flight
recorder holds a slow step after the fact; while the engine hangs inside a forward, /stacks names the
sleeping frame in the worker within 2 s, /requests shows the request in flight, and the watchdog
reports the step stuck on /healthz and /metrics; then the engine serves again."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from completions import complete

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm


def _get(stack, path: str):
    """A sidecar view: JSON decoded, /metrics as text."""
    client = SidecarClient(stack.sidecar_url, timeout=30)
    return client.get_bytes(path).decode() if path.startswith("/metrics") else client.request("GET", path)


def _complete(stack, prompt: list[int], max_tokens: int = 4) -> dict:
    return complete(stack, prompt, max_tokens)[1]


def _processes(body: dict, role: str) -> list[dict]:
    return [p for p in body["processes"] if p["process"]["role"] == role]


def test_the_recorder_holds_a_slow_step_after_the_fact(slow_token_stack):
    from slow_token_model import SLOW_SECONDS, SLOW_TOKEN_ID, prompt_ids

    stack = slow_token_stack
    _complete(stack, [11, 12, 13, 14])  # a normal request first
    before = time.time_ns()
    _complete(stack, prompt_ids(SLOW_TOKEN_ID, salt=20))
    time.sleep(2.5)  # the page arrives after the spike: the recorder still has it
    body = _get(stack, "/recorder?seconds=60")
    (worker,) = _processes(body, "worker")
    slow = [s for s in worker["steps"] if s["start_ns"] >= before and s["duration_ms"] >= SLOW_SECONDS * 1000 * 0.9]
    assert len(slow) == 1, [s["duration_ms"] for s in worker["steps"] if s["start_ns"] >= before]
    step = slow[0]
    assert step["working"] and step["prefill_tokens"] >= 1 and step["batch"] >= 1
    (core,) = _processes(body, "engine_core")
    core_slow = [s for s in core["steps"] if s["duration_ms"] >= SLOW_SECONDS * 1000 * 0.9 and s["start_ns"] >= before]
    assert len(core_slow) == 1 and core_slow[0]["running"] >= 1  # the engine core's step wraps the worker's
    assert core_slow[0]["start_ns"] <= step["start_ns"] and step["end_ns"] <= core_slow[0]["end_ns"]
    # The API server's ring has the request, its end-to-end time over the slow step.
    (api,) = _processes(body, "api_server")
    mine = [r for r in api["requests"] if r["arrived_ns"] >= before]
    assert len(mine) == 1 and mine[0]["outcome"] == "finished" and mine[0]["e2e_ms"] >= SLOW_SECONDS * 1000, mine
    # The same as a Perfetto trace: the slow step is a slice of the worker's track.
    trace = _get(stack, "/recorder?seconds=60&format=trace")
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == f"step {step['step']}"]
    assert any(e["dur"] >= SLOW_SECONDS * 1e6 * 0.9 for e in slices)
    # On a terminal `sidecar recorder` tells the same in one screen: the slow step first among the
    # worker's slowest, with its row, and the request's end-to-end time among the percentiles.
    screen = subprocess.run([sys.executable, "-m", "sidecar.cli", "recorder", "--summary", "--seconds", "60",
                             "--url", stack.sidecar_url], capture_output=True, text=True, timeout=120)
    assert screen.returncode == 0, screen.stderr
    lines = screen.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith(worker["process"]["label"] + ":"))
    assert lines[header + 2] == "  slowest steps"
    slowest = lines[header + 3]
    assert slowest.startswith(f"    step {step['step']}  ") and f"prefill {step['prefill_tokens']}" in slowest, slowest
    assert float(slowest.split()[2].replace(",", "")) >= SLOW_SECONDS * 1000 * 0.9
    e2e_max = float(next(line for line in lines if line.startswith("  end-to-end ms")).split()[-1].replace(",", ""))
    assert e2e_max >= SLOW_SECONDS * 1000


@contextmanager
def released_hang(stack):
    """The file that ends the fixture's hang (``SIDECAR_FIXTURE_HANG_RELEASE``), absent on entry; on exit,
    whatever happened, it is created (the shared server never stays hung), the engine shown serving
    again, and the file removed for the next hang."""
    from slow_token_model import ENV_HANG_RELEASE

    release = Path(stack.env[ENV_HANG_RELEASE])
    release.unlink(missing_ok=True)
    try:
        yield release
    finally:
        release.touch()
        _complete(stack, [11, 12, 13, 14])
        release.unlink()


def test_a_hung_engine_can_be_examined_while_it_hangs(slow_token_stack):
    from slow_token_model import HANG_FUNCTION, HANG_SECONDS, HANG_TOKEN_ID, prompt_ids

    stack = slow_token_stack
    with released_hang(stack) as release:
        result: dict = {}
        hung = threading.Thread(target=lambda: result.update(_complete(stack, prompt_ids(HANG_TOKEN_ID, salt=21), 2)),
                                daemon=True)
        hung.start()
        time.sleep(2.0)  # the request reaches the worker's forward and sleeps there
        _examine(stack, HANG_FUNCTION)

        # Hung all along (the fixture holds it up to HANG_SECONDS): the request is still unanswered
        # after all that, and answered within seconds of the release.
        assert hung.is_alive() and not result, result
        release.touch()
        released = time.monotonic()
        hung.join(timeout=HANG_SECONDS + 60)
        assert result.get("choices"), result  # the hung request was served in the end
        assert time.monotonic() - released < 5, "the engine stayed hung after the release"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _get(stack, "/healthz")["stuck"]:
        time.sleep(0.5)
    assert _get(stack, "/healthz")["stuck"] == []
    _complete(stack, [11, 12, 13, 14])  # and serves normally after


def _examine(stack, hang_function: str) -> None:
    """What the sidecar shows of the engine while it hangs in ``hang_function``."""
    t0 = time.monotonic()
    stacks = _get(stack, "/stacks")
    took = time.monotonic() - t0
    assert took < 2.0, took
    (worker,) = _processes(stacks, "worker")
    assert worker["error"] is None
    step_thread = next(t for t in worker["threads"] if t["step_thread"])
    assert any(f["function"].endswith(hang_function) and f["file"].endswith("slow_token_model/model.py") for f in step_thread["frames"]), \
        [f["function"] for f in step_thread["frames"]]

    requests = _get(stack, "/requests")
    assert requests["count"] >= 1 and requests["oldest_age_s"] >= 1.0
    assert any(r["phase"] == "prefill" for r in requests["requests"]), requests

    # The watchdog (SIDECAR_WATCHDOG_S=3) reports the worker's step at a heartbeat (every 2 s).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        health = _get(stack, "/healthz")
        if any("worker" in s["process"] for s in health["stuck"]):
            break
        time.sleep(0.5)
    assert any("worker" in s["process"] and s["age_s"] >= 3 for s in health["stuck"]), health
    metrics = _get(stack, "/metrics")
    stuck = [l for l in metrics.splitlines() if l.startswith("sidecar_engine_step_stuck{") and 'role="worker"' in l]
    assert stuck and stuck[0].endswith(" 1.0"), stuck
    in_flight = next(l for l in metrics.splitlines() if l.startswith("sidecar_requests_in_flight "))
    assert float(in_flight.split()[1]) >= 1

    # A flame graph of the hang: the step thread sampled for 1 s.
    speedscope = _get(stack, "/stacks?seconds=1&hz=50&format=speedscope&threads=step&processes=worker")
    names = [f["name"] for f in speedscope["shared"]["frames"]]
    assert any(n.startswith(hang_function) for n in names), names
