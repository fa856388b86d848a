"""``sidecar recorder`` on a terminal (sidecar/cli/recorder_screen.py): one screen told from the
``GET /recorder`` answer, the data kept for pipes, files and ``--json``."""

from __future__ import annotations

import argparse
import json

import pytest

from sidecar.cli import incidents as incident_cli
from sidecar.cli import recorder_screen
from sidecar.cli.client import SidecarClient

T0 = 1_795_000_000_000_000_000  # a Unix-ns instant: 2026-11-18


def _step(n: int, ms: float, **row) -> dict:
    start = T0 + n * 50_000_000
    base = {"step": n, "start_ns": start, "end_ns": start + int(ms * 1e6), "duration_ms": ms, "working": True,
            "batch": 4, "tokens": 4, "prefill_tokens": 0, "decode_tokens": 4, "running": 4, "waiting": 0, "gc_ms": None}
    return {**base, **row}


def _answer() -> dict:
    worker_steps = [_step(n, 10.0 + n % 7) for n in range(100)]
    worker_steps[42] = _step(42, 480.0, batch=9, tokens=512, prefill_tokens=500, decode_tokens=12, running=9,
                             waiting=3, gc_ms=120.5)
    worker_steps.append(_step(100, 0.2, working=False))  # an idle step: not in the percentiles
    requests = [{"id": f"cmpl-{i}", "arrived_ns": T0, "first_token_ns": T0, "finished_ns": T0, "outcome": "finished",
                 "prompt_tokens": 8, "output_tokens": 16, "ttft_ms": float(i + 1), "e2e_ms": float(10 * (i + 1))}
                for i in range(20)]
    requests[3]["outcome"] = "aborted"
    return {
        "clock": "unix_ns", "since_ns": T0, "until_ns": T0 + 60_000_000_000,
        "processes": [
            {"process": {"label": "worker rank 0 (pid 30)", "role": "worker"}, "error": None, "capacity": 8192,
             "steps": worker_steps, "open_step": {"since_ns": T0 + 5_000_000_000, "age_ms": 12_345.0},
             "gc": [{"start_ns": T0 + 42 * 50_000_000, "duration_ms": 120.5, "generation": 2, "collected": 1000,
                     "step_thread": True},
                    {"start_ns": T0, "duration_ms": 1.0, "generation": 0, "collected": 3, "step_thread": False}],
             "requests": [], "in_flight": []},
            {"process": {"label": "API server (pid 10)", "role": "api_server"}, "error": None, "capacity": None,
             "steps": [], "gc": [], "requests": requests,
             "in_flight": [{"id": "cmpl-young", "arrived_ns": T0, "phase": "decode", "prompt_tokens": 5,
                            "output_tokens": 2, "age_ms": 500.0},
                           {"id": "cmpl-hung", "arrived_ns": T0, "phase": "prefill", "prompt_tokens": 9,
                            "output_tokens": 0, "age_ms": 31_000.0}]},
            {"process": {"label": "engine core (pid 20)", "role": "engine_core"}, "error": "no answer within 2 s"},
        ],
        "summary": {"steps": 101, "requests_finished": 20, "requests_in_flight": 2},
    }


def test_percentiles_are_by_nearest_rank():
    values = list(range(1, 101))
    assert [recorder_screen.percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert recorder_screen.percentile([7.0], 99) == 7.0
    assert recorder_screen.spread([]) == "none"


def test_the_screen_tells_each_process_its_slowest_steps_and_the_requests():
    screen = recorder_screen.render(_answer(), 60)
    lines = screen.splitlines()
    assert lines[0].startswith("flight recorder, the last 60 s (")
    assert "3 processes, 101 steps, 20 requests finished, 2 in flight" in lines[0]
    assert "worker rank 0 (pid 30): 100 working steps of 101" in lines
    worker = lines.index("worker rank 0 (pid 30): 100 working steps of 101")
    # 99 steps of 10..16 ms and one of 480: p50 13, p90 16, p99 16, max 480.
    assert lines[worker + 1] == "  step ms   p50 13.0  p90 16.0  p99 16.0  max 480.0"
    assert lines[worker + 2] == "  slowest steps"
    slowest = lines[worker + 3]
    assert slowest.startswith("    step 42  480.0 ms  at ")
    assert slowest.endswith("batch 9, tokens 512 (prefill 500, decode 12), running 9, waiting 3, GC 120.5 ms")
    assert "step 100 " not in screen  # the idle step is no slow step
    assert "  GC pauses of 5 ms or more: 1, 120.5 ms in all" in lines  # the 1 ms one is not listed
    assert any(line.startswith("    120.5 ms at ") and line.endswith("generation 2, on the step thread") for line in lines)
    assert any("a step has been running for 12,345.0 ms" in line for line in lines)
    assert "engine core (pid 20): nothing came back (no answer within 2 s)" in lines
    assert "API server (pid 10): takes no steps of its own (its requests are below)" in lines
    assert "requests: 20 finished (19 finished, 1 aborted), 2 in flight" in lines
    assert "  TTFT ms         p50 10.0  p90 18.0  p99 20.0  max 20.0" in lines
    assert "  end-to-end ms   p50 100.0  p90 180.0  p99 200.0  max 200.0" in lines
    flight = lines.index("  in flight, oldest first")
    assert "cmpl-hung" in lines[flight + 1] and "31.0 s" in lines[flight + 1] and "cmpl-young" in lines[flight + 2]


def test_requests_that_all_finished_are_not_told_twice():
    answer = _answer()
    for r in answer["processes"][1]["requests"]:
        r["outcome"] = "finished"
    assert "requests: 20 finished, 2 in flight" in recorder_screen.render(answer).splitlines()


def test_an_empty_window_says_so():
    screen = recorder_screen.render({"processes": [], "summary": {}}, 10)
    assert "0 processes, 0 steps" in screen
    assert "requests: none finished in the window, none in flight" in screen


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    incident_cli.register(parser.add_subparsers())
    return parser.parse_args(list(argv))


@pytest.fixture
def sidecar_answer(monkeypatch):
    asked = []
    monkeypatch.setattr(SidecarClient, "call", lambda self, method, path, params=None: asked.append(
        (path, params)) or json.dumps(_answer()).encode())
    return asked


def test_on_a_terminal_the_default_is_the_screen(monkeypatch, capsys, sidecar_answer):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    args = _parse("recorder", "--url", "http://127.0.0.1:9", "--seconds", "60")
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("flight recorder, the last 60 s") and "step 42  480.0 ms" in out
    assert sidecar_answer == [("/recorder", {"seconds": 60.0, "format": "json"})]


def test_on_a_terminal_json_prints_the_rows(monkeypatch, capsys, sidecar_answer):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    args = _parse("recorder", "--url", "http://127.0.0.1:9", "--json")
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out) == _answer()


def test_piped_the_default_stays_the_rows_and_summary_asks_for_the_screen(capsys, sidecar_answer):
    args = _parse("recorder", "--url", "http://127.0.0.1:9")
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out) == _answer()
    args = _parse("recorder", "--url", "http://127.0.0.1:9", "--summary")
    assert args.handler(args) == 0
    assert capsys.readouterr().out.startswith("flight recorder, the last 120 s")


def test_summary_with_a_file_or_a_trace_is_refused(capsys, tmp_path, sidecar_answer):
    args = _parse("recorder", "--url", "http://127.0.0.1:9", "--summary", "-o", str(tmp_path / "rec.json"))
    assert args.handler(args) == 2
    assert "--summary prints a screen" in capsys.readouterr().err
    assert sidecar_answer == []
    with pytest.raises(SystemExit):
        _parse("recorder", "--summary", "--json")
