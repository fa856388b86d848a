"""Issue 11 on real vLLM with the slow-token fixture model: a step rule fires on the one 1.5 s step a
SLOW_TOKEN_ID prompt makes, within 1 s of the breaching heartbeat the capture is armed, the saved
recorder dump holds the slow step, and the capture ends done with its trigger."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from completions import complete

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm


def _call(stack, method: str, path: str, body: dict | None = None) -> dict:
    return json.loads(SidecarClient(stack.sidecar_url, timeout=30).call(method, path, body=body))


def _complete(stack, prompt: list[int], max_tokens: int = 4) -> dict:
    return complete(stack, prompt, max_tokens)[1]


def test_a_slow_step_captures_itself(slow_token_stack):
    from slow_token_model import SLOW_SECONDS, SLOW_TOKEN_ID, prompt_ids

    stack = slow_token_stack
    trigger = _call(stack, "POST", "/triggers", {"metric": "step_duration", "threshold_ms": 1000, "cooldown_s": 60,
                                                 "action": {"capture_steps": 3, "recorder_seconds": 30}})
    try:
        _complete(stack, prompt_ids(SLOW_TOKEN_ID, salt=31))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            body = _call(stack, "GET", f"/triggers/{trigger['id']}")
            fired = [f for f in body["firings"] if f["outcome"] == "fired" and (f["recorder"] or f["recorder_error"])]
            if fired:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(body)
        firing = fired[-1]
        assert firing["observed_ms"] > 1000 and firing["capture"], firing
        assert firing["arm_latency_ms"] < 1000, firing
        assert firing["recorder_error"] is None, firing
        dump = json.loads(gzip.decompress(Path(firing["recorder"]).read_bytes()))
        durations = [s["duration_ms"] for p in dump["processes"] for s in p["steps"]]
        open_ages = [p["open_step"]["age_ms"] for p in dump["processes"] if p.get("open_step")]
        errors = {p["process"]["label"]: p["error"] for p in dump["processes"]}
        if firing["step_was"] == "running":
            # Fired at a heartbeat while the slow step still ran (as for a hang): the dump, taken
            # right after, shows it still open, at least as old as the firing saw it.
            assert max(open_ages, default=0) >= firing["observed_ms"], (open_ages, errors, firing)
        else:
            assert max(durations, default=0) >= SLOW_SECONDS * 1000 * 0.9, (durations, errors, firing)
        # The capture needs steps: a few normal requests give them.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            capture = _call(stack, "GET", f"/profile/{firing['capture']}")
            if capture["state"] not in ("armed", "capturing", "exporting"):
                break
            _complete(stack, [11, 12, 13, 14], max_tokens=8)
        assert capture["state"] == "done", capture
        assert capture["trigger"]["trigger"] == trigger["id"] and capture["trigger"]["observed_ms"] > 1000
    finally:
        _call(stack, "DELETE", f"/triggers/{trigger['id']}")
