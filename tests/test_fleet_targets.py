"""The fleet's engine-free parts: targets from a list or a file, the tokens file, the fan-out's bounds,
the outlier rule, Prometheus' answer read; and ``sidecar fleet`` refusing bad arguments with one line
and exit status 2, never a traceback, never a token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from sidecar.fleet.compare import capture_row, outlier, p99, recorder_row, ttft_p99_ms
from sidecar.fleet.fanout import run_all, wait_all
from sidecar.fleet.targets import MAX_TARGETS, Target, TargetError, Tokens, base_url, from_file, from_list, read_tokens


def test_a_url_is_written_one_way_whoever_gave_it():
    assert base_url("10.0.0.7:8787") == "http://10.0.0.7:8787"
    assert base_url("http://10.0.0.7:8787/metrics?x=1") == "http://10.0.0.7:8787"
    assert base_url("https://sidecar.example") == "https://sidecar.example:443"
    assert base_url("sidecar.example", default_port=9000) == "http://sidecar.example:9000"
    assert base_url("http://[fd00::7]:8787/") == "http://[fd00::7]:8787"
    assert base_url("http://user:pw@host:1") == "http://host:1"  # user info never travels on as a target
    for bad in ("ftp://host:1", "http://", "http://host:notaport", "http://host:99999"):
        with pytest.raises(TargetError):
            base_url(bad)


def test_the_list_and_file_forms(tmp_path):
    assert [t.url for t in from_list("a:1, http://b:2/, a:1", 8787)] == ["http://a:1", "http://b:2"]
    assert [t.url for t in from_list("c", 8787)] == ["http://c:8787"]
    with pytest.raises(TargetError, match="no URL"):
        from_list(" , ")
    listed = tmp_path / "targets"
    listed.write_text("# the fleet\nhttp://a:1\n\n  b:2   # the second\n")
    assert [t.url for t in from_file(listed)] == ["http://a:1", "http://b:2"]
    listed.write_text("http://a:1\nftp://b\n")
    with pytest.raises(TargetError, match=r"targets:2: "):
        from_file(listed)
    with pytest.raises(TargetError, match="cannot read"):
        from_file(tmp_path / "absent")
    with pytest.raises(TargetError, match=f"more than {MAX_TARGETS}"):
        from_list(",".join(f"h{i}:1" for i in range(MAX_TARGETS + 1)))


def test_the_most_specific_token_wins_and_none_is_ever_in_a_message(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"http://10.0.0.7:8787/": "by-url", "10.0.0.8:8787": "by-host-port",
                                "10.0.0.9": "by-host", "*": "any-other"}))
    path.chmod(0o600)
    tokens, warning = read_tokens(path, default="from-env")
    assert warning is None
    assert tokens.for_target(Target("http://10.0.0.7:8787")) == "by-url"
    assert tokens.for_target(Target("http://10.0.0.8:8787")) == "by-host-port"
    assert tokens.for_target(Target("http://10.0.0.9:1234")) == "by-host"
    assert tokens.for_target(Target("http://10.0.0.10:8787")) == "any-other"
    assert Tokens((), "from-env").for_target(Target("http://x:1")) == "from-env"
    path.chmod(0o644)
    assert "other users" in read_tokens(path)[1]
    path.write_text('{"http://a:1": "secret-value-1", "b": 7}')
    with pytest.raises(TargetError, match="'b' must be a non-empty string") as refused:
        read_tokens(path)
    path.write_text('{"http://a:1": "secret-value-2" "b"}')
    with pytest.raises(TargetError, match="not JSON") as broken:
        read_tokens(path)
    assert "secret-value" not in str(refused.value) + str(broken.value)


def test_the_fan_out_is_bounded_and_every_failure_is_one_line():
    targets = [Target(f"http://h{i}:1") for i in range(40)]
    running, peak, lock = [0], [0], threading.Lock()

    def call(t: Target) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        if t.url.endswith("h7:1"):
            raise ConnectionRefusedError("refused")
        return int(t.url[8:-2])

    progress = []
    outcomes = run_all(targets, call, lambda exc: f"no: {exc}", concurrency=5,
                       on_progress=lambda d, f, n: progress.append((d, f, n)))
    assert peak[0] <= 5
    assert [o.target for o in outcomes] == targets
    assert [o.result for o in outcomes if o.ok] == [i for i in range(40) if i != 7]
    assert [(o.target.url, o.error) for o in outcomes if not o.ok] == [("http://h7:1", "no: refused")]
    assert progress[-1] == (40, 1, 40)

    polls: dict[str, int] = {}

    def poll(t: Target) -> tuple[bool, str]:
        polls[t.url] = polls.get(t.url, 0) + 1
        return (polls[t.url] >= 3 or t.url == "http://h0:1"), "final"

    ended = wait_all(targets[:3] + [Target("http://never:1")], lambda t: (False, None) if "never" in t.url else poll(t),
                     str, deadline_s=0.3, interval_s=0.05)
    assert [o.ok for o in ended] == [True, True, True, False]
    assert "not final after" in ended[-1].error


def _summary(step_us: list[float], kernels: bool = False) -> dict:
    return {"steps": [{"process": "worker", "pid": 1, "wall_us": w, "partial": False} for w in step_us],
            "gpu": {"kernel_count": 3 if kernels else 0, "busy_fraction": 0.5,
                    "top_kernels": [{"name": "gemm"}] if kernels else []},
            "cpu": {"top_ops": [{"name": "aten::mm"}]},
            "syncs": [{"count": 2, "total_us": 1500.0}, {"count": 1, "total_us": 500.0}]}


def test_the_rows_and_the_outlier():
    row = capture_row({"id": "c1", "state": "done"}, _summary([1000.0, 3000.0]))
    assert (row["steps"], row["step_ms"], row["top"], row["top_kind"], row["gpu_busy"]) == (2, 2.0, "aten::mm", "op", None)
    assert (row["syncs"], row["sync_blocked_ms"]) == (3, 2.0)
    gpu = capture_row({"id": "c2", "state": "done"}, _summary([1000.0], kernels=True))
    assert (gpu["top"], gpu["top_kind"], gpu["gpu_busy"]) == ("gemm", "kernel", 0.5)
    assert capture_row({"id": "c3", "state": "failed"}, None)["step_ms"] is None

    replicas = [{"target": t, "step_ms": v} for t, v in (("a", 10.0), ("b", 11.0), ("c", 10.5), ("d", 14.0))]
    found = outlier(replicas)
    assert (found["target"], found["median"], found["direction"]) == ("d", 10.75, "slower")
    assert found["ratio"] == round(14.0 / 10.75, 3)
    assert outlier(replicas[:3]) is None  # all within 1.25x of the median
    assert outlier([{"target": "a", "step_ms": 10.0}, {"target": "b", "step_ms": None}]) is None
    fast = outlier([{"target": t, "step_ms": v} for t, v in (("a", 10.0), ("b", 10.0), ("c", 4.0))])
    assert (fast["target"], fast["direction"]) == ("c", "faster")

    assert p99(range(1, 101)) == 99 and p99([5.0]) == 5.0 and p99([]) is None
    recorder = {"processes": [
        {"process": {"label": "api"}, "requests": [{"ttft_ms": float(v)} for v in range(1, 201)] + [{"ttft_ms": None}],
         "steps": []},
        {"process": {"label": "worker"}, "gc_totals": {"step_thread_pause_ms": 1.5},
         "steps": [{"working": True, "duration_ms": 2.0}, {"working": False, "duration_ms": 50.0},
                   {"working": True, "duration_ms": 4.0}]}],
        "summary": {"slowest_step_ms": 4.0, "requests_finished": 200, "requests_in_flight": 0}}
    assert ttft_p99_ms(recorder) == (198.0, 200)
    row = recorder_row(recorder)
    assert (row["steps"], row["step_ms"], row["gc_step_thread_ms"], row["requests_finished"]) == (2, 3.0, 1.5, 200)


def _fleet(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "fleet", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,message", [
    ((), "required: COMMAND"),
    (("status",), "one of the arguments --prometheus --k8s-selector --targets --targets-file is required"),
    (("status", "--targets", "a:1", "--targets-file", "f"), "not allowed with argument"),
    (("status", "--prometheus", "http://127.0.0.1:9"), "--prometheus needs --job"),
    (("status", "--targets", "a:1", "--job", "x"), "--job goes with --prometheus"),
    (("status", "--targets", "a:1", "--namespace", "x"), "--namespace goes with --k8s-selector"),
    (("status", "--targets", "ftp://a"), "not an http(s) URL"),
    (("status", "--targets", "a:1", "--concurrency", "0"), "--concurrency: must be between 1 and 256"),
    (("status", "--targets", "a:1", "--timeout", "x"), "--timeout: not a number"),
    (("capture", "--targets", "a:1", "--steps", "0"), "--steps: must be between 1 and 1000"),
    (("capture", "--targets", "a:1", "--outlier-ratio", "0.5"), "--outlier-ratio: must be between 1 and 100"),
    (("status", "--targets-file", "/nonexistent/targets"), "cannot read the targets file"),
    (("status", "--targets", "a:1", "--tokens-file", "/nonexistent/tokens"), "cannot read the tokens file"),
    (("status", "--prometheus", "http://127.0.0.1:9", "--job", "x", "--timeout", "2"), "cannot reach Prometheus"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, message):
    got = _fleet(*args)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert message in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and got.stdout == ""


def test_a_tokens_file_that_is_no_object_is_refused_without_its_content(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text('["a-secret-token-in-a-list"]')
    got = _fleet("status", "--targets", "a:1", "--tokens-file", str(path))
    assert got.returncode == 2 and "must hold one JSON object" in got.stderr
    assert "a-secret-token" not in got.stderr + got.stdout


class _Terminal:
    """A stream that says it is a terminal, and keeps what was written."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.written = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.written.append(text)

    def flush(self) -> None:
        pass


def test_the_progress_line_is_for_a_terminal_only():
    from sidecar.cli.fleet_common import Progress

    on = _Terminal(True)
    progress = Progress("capture", stream=on)
    progress(3, 1, 10, "ended")
    progress.close()
    assert on.written[0].startswith("\r\033[Ksidecar fleet capture: 3/10 ended, 1 failed (")
    assert on.written[-1] == "\r\033[K"  # the line is cleared before the answer is printed
    off = _Terminal(False)
    progress = Progress("capture", stream=off)
    progress(3, 1, 10)
    progress.close()
    assert off.written == []
