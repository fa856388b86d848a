"""Issue 11: the slow-token fixture model (tests/fixtures/slow_token_model) on the real multi-process
vLLM server: a prompt holding SLOW_TOKEN_ID makes one slow step, which every request in flight feels;
HANG_TOKEN_ID holds the engine for SIDECAR_FIXTURE_HANG_S (tests/e2e/test_vllm_incidents.py examines
that hang); the model never emits either id."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request

import pytest

from completions import complete
from sidecar.cli.client import SidecarClient
from sidecar_vllm.devtools import VllmStack


pytestmark = pytest.mark.vllm
GAP_JITTER_S = 0.1


@pytest.fixture
def slow_stack(slow_token_stack):
    """The fixture-model server (conftest.py), shared with test_vllm_incidents.py and others."""
    return slow_token_stack


class Stream(threading.Thread):
    """A streaming completion in a thread, recording when each chunk arrives (wall clock, seconds: the
    clock of the flight recorder's steps)."""

    def __init__(self, stack: VllmStack, prompt: list[int], max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.body = {"model": stack.served_name, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                     "temperature": 0.0, "ignore_eos": True}
        self.url = f"{stack.server_url}/v1/completions"
        self.arrivals: list[float] = []
        self.first = threading.Event()
        self.done = False

    def run(self) -> None:
        req = urllib.request.Request(self.url, data=json.dumps(self.body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                line = raw.strip()
                if line == b"data: [DONE]":
                    self.done = True
                elif line.startswith(b"data:"):
                    self.arrivals.append(time.time())
                    self.first.set()

    def gaps(self) -> list[tuple[float, float]]:
        """(arrival of the later chunk, gap before it)."""
        return [(b, b - a) for a, b in zip(self.arrivals, self.arrivals[1:])]


def test_the_model_never_emits_a_trigger(slow_stack):
    from slow_token_model import HANG_TOKEN_ID, SLOW_TOKEN_ID, SLOW_SECONDS, prompt_ids

    # Even pushed by logit_bias (applied after the model's -inf mask) it stays out: had it been
    # sampled, the next decode step would feed it and sleep.
    bias = {str(SLOW_TOKEN_ID): 100.0, str(HANG_TOKEN_ID): 100.0}
    elapsed, out = complete(slow_stack, prompt_ids(salt=1), max_tokens=32, logit_bias=bias, temperature=1.0)
    tokens = out["choices"][0]["token_ids"]
    assert len(tokens) == 32 and not {SLOW_TOKEN_ID, HANG_TOKEN_ID} & set(tokens), tokens
    assert elapsed < SLOW_SECONDS


def test_a_prompt_with_the_slow_token_takes_one_slow_step(slow_stack):
    from slow_token_model import SLOW_SECONDS, SLOW_TOKEN_ID, prompt_ids

    # The fastest of three: noise only ever adds time, so the difference is at least the sleep.
    normal = min(complete(slow_stack, prompt_ids(salt=s))[0] for s in (2, 3, 8))
    slow, out = complete(slow_stack, prompt_ids(SLOW_TOKEN_ID, salt=4))
    assert out["choices"][0]["prompt_token_ids"][-1] == SLOW_TOKEN_ID
    print(f"normal {normal:.3f} s, with SLOW_TOKEN_ID {slow:.3f} s")
    # The sleep is inside the slow request; its other steps may be a few ms quicker than the normal
    # requests' were (seen in CI: 1.4975 s more, not 1.5): the jitter allowance.
    assert slow >= SLOW_SECONDS and slow - normal >= SLOW_SECONDS - GAP_JITTER_S
    assert slow < 2 * SLOW_SECONDS, "only the prompt's forward sleeps, not each of the 8 decode steps"


def test_a_concurrent_stream_sees_the_slow_step(slow_stack):
    from slow_token_model import SLOW_SECONDS, SLOW_TOKEN_ID, prompt_ids

    began_ns = time.time_ns()
    stream = Stream(slow_stack, prompt_ids(salt=5), max_tokens=480)
    stream.start()
    assert stream.first.wait(30), "the stream produced no token"
    sent_ns = time.time_ns()
    sent = sent_ns / 1e9
    slow, _ = complete(slow_stack, prompt_ids(SLOW_TOKEN_ID, salt=6))
    answered_ns = time.time_ns()
    stream.join(60)
    assert stream.done and len(stream.arrivals) > 100
    long_gaps = [(t, g) for t, g in stream.gaps() if g >= SLOW_SECONDS / 2]
    # The engine's side, from the flight recorder: exactly one slow worker step while the stream ran.
    recorder = SidecarClient(slow_stack.sidecar_url, timeout=30).request("GET", "/recorder?seconds=120")
    (worker,) = [p for p in recorder["processes"] if p["process"]["role"] == "worker"]
    long_steps = [s for s in worker["steps"]
                  if s["start_ns"] >= began_ns and s["duration_ms"] >= SLOW_SECONDS * 1000 * 0.9]
    # Every step of the slow request (its prefill, which sleeps, and its decodes, which must not) runs
    # while it is in flight. A long step outside that span is the host's (a loaded 2-core runner once
    # starved the worker for 1.9 s after the request had been answered): printed, not counted.
    slow_steps = [s["duration_ms"] for s in long_steps if sent_ns <= s["start_ns"] <= answered_ns]
    host_stalls = [s["duration_ms"] for s in long_steps if not sent_ns <= s["start_ns"] <= answered_ns]
    print(f"slow request {slow:.3f} s; stream: {len(stream.arrivals)} chunks, long gaps "
          f"{[(round(t - sent, 3), round(g, 3)) for t, g in long_gaps]} (s after sending, length), median gap "
          f"{statistics.median(g for _, g in stream.gaps()) * 1e3:.2f} ms; slow worker steps {slow_steps}; "
          f"long steps outside the slow request (the host's) {host_stalls}; "
          f"pauses: {_pauses(recorder, began_ns)}")
    assert len(slow_steps) == 1, "exactly one engine step of the slow request was slow"
    # At the client, the stream feels that step: no chunk arrives while it runs, so one gap of the
    # stream spans it, as long as the sleep. Other long gaps, where the engine had no slow step, are
    # the host's (a busy 2-core runner held the API server or this thread 0.9 s a second after the
    # slow step once; the print above names the recorder's GC pauses), not the step felt again.
    (step,) = [s for s in long_steps if sent_ns <= s["start_ns"] <= answered_ns]
    step_middle = (step["start_ns"] + step["duration_ms"] * 1e6 / 2) / 1e9
    felt = [(t, g) for t, g in stream.gaps() if t - g <= step_middle <= t]
    assert len(felt) == 1, "the stream had a chunk while the slow step ran: it did not feel it"
    at, gap = felt[0]
    # The gap is the sleep plus one step (a few ms) at the engine; at the client the chunk before it
    # can arrive late by the API server's own jitter (a busy 2-core host), hence the allowance.
    assert gap >= SLOW_SECONDS - GAP_JITTER_S


def _pauses(recorder: dict, since_ns: int) -> dict[str, list[float]]:
    """GC pauses the recorder saw since ``since_ns``, by process role (for the failure's print)."""
    return {p["process"]["role"]: [round(g.get("duration_ms", 0.0), 1) for g in p.get("gc", [])
                                   if g.get("start_ns", 0) >= since_ns] for p in recorder["processes"]}
