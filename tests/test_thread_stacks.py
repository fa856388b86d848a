"""sidecar/stacks/threads.py: every thread's Python stack read from another thread (a snapshot, and a
short sampling folded into counts), bounded in depth and in bytes, as a hung engine's probe answers.

Threads here are parked in known functions, so the tests know the function, file and line each
must be found at."""

from __future__ import annotations

import _thread as low_level_threads
import json
import sys
import threading
import time

import msgspec
import pytest

from sidecar.stacks import threads as thread_stacks
from sidecar.stacks.threads import (
    MAX_DEPTH,
    MAX_HZ,
    MAX_SECONDS,
    STOPPED,
    THREAD_EXITED,
    ThreadSampler,
    estimated_bytes,
    snapshot,
)

pytestmark = pytest.mark.timeout(60)


# -- planted threads: known functions, known lines ------------------------------------------------------
def _blocked_in_known_function(event: threading.Event) -> None:
    event.wait()  # BLOCKED_LINE


def _spinning_in_known_function(flag: list) -> None:
    while not flag[0]: pass  # noqa: E701 - one line: every sample sees the same executing line


def _recurse_then_block(depth: int, event: threading.Event) -> None:
    if depth > 0:
        _recurse_then_block(depth - 1, event)
    else:
        _blocked_in_known_function(event)


def _line_of(function, marker: str) -> int:
    """The line of ``function``'s source that carries ``marker`` (a comment), so no test hard-codes one."""
    import inspect

    lines, first = inspect.getsourcelines(function)
    return first + next(k for k, text in enumerate(lines) if marker in text)


BLOCKED_LINE = _line_of(_blocked_in_known_function, "BLOCKED_LINE")
SPIN_LINE = _line_of(_spinning_in_known_function, "noqa: E701")


class Parked:
    """Threads parked in a known function until the context ends."""

    def __init__(self, count: int = 1, target=_blocked_in_known_function, args=(), names=None) -> None:
        self.release = threading.Event()
        self.threads = [
            threading.Thread(target=target, args=args or (self.release,), daemon=True,
                             name=(names[k] if names else f"parked-{k}"))
            for k in range(count)
        ]

    def __enter__(self) -> "Parked":
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 5
        while not all(_innermost_is_waiting(t.ident) for t in self.threads):  # each one is parked
            assert time.monotonic() < deadline, "planted threads never parked"
            time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(5)


def _innermost_is_planted(ident) -> bool:
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_name in ("_blocked_in_known_function", "_spinning_in_known_function"):
            return True
        frame = frame.f_back
    return False


def _thread(snap: dict, ident: int) -> dict:
    matches = [t for t in snap["threads"] if t["id"] == ident]
    assert len(matches) == 1, f"thread {ident} listed {len(matches)} times"
    return matches[0]


# -- snapshot ----------------------------------------------------------------------------------------------
def test_snapshot_finds_a_blocked_thread_in_its_function_at_its_line():
    with Parked() as parked:
        t = parked.threads[0]
        snap = snapshot()
    assert abs(snap["taken_ns"] - time.time_ns()) < 60 * 10**9
    thread = _thread(snap, t.ident)
    assert thread["name"] == "parked-0"
    assert thread["native_id"] == t.native_id
    assert thread["daemon"] is True
    assert thread["step_thread"] is False and thread["truncated"] is False
    functions = [f["function"] for f in thread["frames"]]
    k = functions.index("_blocked_in_known_function")
    # innermost-ish: only Event.wait and Condition.wait (the stdlib's) lie inside it
    assert len(functions) - 1 - k <= 3, functions
    assert functions[k + 1:] and all(f.endswith("wait") for f in functions[k + 1:]), functions
    assert thread["frames"][k]["file"] == __file__
    assert thread["frames"][k]["line"] == BLOCKED_LINE
    assert functions[0] == "Thread._bootstrap"  # outermost first


def test_the_step_thread_is_flagged_and_listed_first_then_threads_by_name():
    names = ["zeta", "alpha", "mid"]
    with Parked(3, names=names) as parked:
        step = parked.threads[0]  # "zeta": last by name
        snap = snapshot(step_thread_id=step.ident)
    assert snap["threads"][0]["id"] == step.ident
    assert snap["threads"][0]["step_thread"] is True
    assert [t["id"] for t in snap["threads"] if t["step_thread"]] == [step.ident]
    rest = [t["name"] for t in snap["threads"][1:] if t["name"] is not None]
    assert rest == sorted(rest)
    assert {"alpha", "mid"} <= set(rest)


def test_skipped_threads_are_left_out_and_the_caller_is_listed_unless_skipped():
    with Parked(2) as parked:
        skipped, kept = parked.threads
        snap = snapshot(skip_thread_ids=[skipped.ident])
        mine = snapshot(skip_thread_ids={threading.get_ident()})
    ids = {t["id"] for t in snap["threads"]}
    assert skipped.ident not in ids
    assert kept.ident in ids
    me = _thread(snap, threading.get_ident())
    assert me["frames"][-1]["function"] == "snapshot"  # the caller's own stack ends in the call
    assert threading.get_ident() not in {t["id"] for t in mine["threads"]}


def test_a_deep_stack_keeps_its_innermost_frames_and_says_it_was_cut():
    release = threading.Event()
    deep = threading.Thread(target=_recurse_then_block, args=(300, release), daemon=True, name="deep")
    with Parked() as parked:
        deep.start()
        deadline = time.monotonic() + 5
        while not _innermost_is_waiting(deep.ident):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        try:
            snap = snapshot()
        finally:
            release.set()
            deep.join(5)
        shallow = _thread(snap, parked.threads[0].ident)
    thread = _thread(snap, deep.ident)
    assert thread["truncated"] is True
    assert len(thread["frames"]) == MAX_DEPTH == snap["max_depth"]
    functions = [f["function"] for f in thread["frames"]]
    assert "_blocked_in_known_function" in functions[-4:]  # the inner end is kept...
    assert functions[0] == "_recurse_then_block"  # ...the outer end (Thread._bootstrap) is not
    assert shallow["truncated"] is False and snap["truncated"] is False


def test_a_thread_unknown_to_threading_is_listed_without_a_name_last():
    release = threading.Event()
    started = threading.Event()
    ended = threading.Event()

    def raw_thread() -> None:  # started with _thread: never registered in threading
        started.set()
        _blocked_in_known_function(release)
        ended.set()

    ident = low_level_threads.start_new_thread(raw_thread, ())
    try:
        assert started.wait(5)
        deadline = time.monotonic() + 5
        while not _innermost_is_waiting(ident):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with Parked():
            snap = snapshot()
    finally:
        release.set()
        assert ended.wait(5)
    thread = _thread(snap, ident)
    assert thread["name"] is None and thread["native_id"] is None and thread["daemon"] is None
    assert snap["threads"][-1]["id"] == ident
    assert "_blocked_in_known_function" in [f["function"] for f in thread["frames"]]


def test_a_walk_of_a_thread_that_returned_meanwhile_ends_normally():
    """The frame object read while the thread was parked outlives the thread's return: the walk
    still ends at the thread's root, without raising (CPython links the popped frame objects)."""
    with Parked() as parked:
        frame = sys._current_frames()[parked.threads[0].ident]
    parked.threads[0].join(5)
    assert not parked.threads[0].is_alive()
    walked, cut = thread_stacks._walk(frame, MAX_DEPTH)
    assert not cut
    assert [f.f_code.co_name for f in walked][-1] == "_bootstrap"


def test_the_sampler_s_line_of_an_instruction_is_the_frame_s_line():
    """The sampler keeps (code, offset) and works the line out later: it must agree with f_lineno."""
    frames = [sys._getframe(1)]  # the callers' frames stand still while this test runs
    release = threading.Event()
    with Parked(2, target=_recurse_then_block, args=(5, release)) as parked:
        frames += [sys._current_frames()[t.ident] for t in parked.threads]
        pairs = []
        for top in frames:
            walked, _cut = thread_stacks._walk(top, MAX_DEPTH)
            pairs += [(thread_stacks._line_at(f.f_code, f.f_lasti), f.f_lineno or 0) for f in walked]
        release.set()
    assert len(pairs) > 30
    assert all(mine == theirs for mine, theirs in pairs), pairs


def test_snapshots_while_threads_start_and_exit_never_raise():
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            short = [threading.Thread(target=time.sleep, args=(0.0005,)) for _ in range(4)]
            for t in short:
                t.start()
            for t in short:
                t.join()

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        for _ in range(200):
            snap = snapshot()
            assert all(isinstance(t["frames"], list) for t in snap["threads"])
    finally:
        stop.set()
        churner.join(5)


def test_the_byte_bound_cuts_every_thread_to_a_common_depth_keeping_the_inner_end(monkeypatch):
    with Parked(4) as parked:
        whole = snapshot()
        limit = estimated_bytes(whole) // 2
        monkeypatch.setattr(thread_stacks, "MAX_ANSWER_BYTES", limit)
        snap = snapshot()
    assert whole["truncated"] is False and snap["truncated"] is True
    assert snap["max_depth"] < MAX_DEPTH
    assert estimated_bytes(snap) <= limit
    assert all(len(t["frames"]) <= snap["max_depth"] for t in snap["threads"])
    cut = [t for t in snap["threads"] if t["truncated"]]
    assert cut and all(len(t["frames"]) == snap["max_depth"] for t in cut)  # this test's own, deep stack
    for t in parked.threads:  # threads that stood still: exactly their innermost frames
        before, after = _thread(whole, t.ident), _thread(snap, t.ident)
        assert after["frames"] == before["frames"][-len(after["frames"]):]
        assert after["truncated"] is (len(before["frames"]) > snap["max_depth"])


def _deep_with_long_file(depth: int, event: threading.Event):
    """A recursion whose frames name a 3000-character file: 128 of them are ~400 KB of JSON."""
    namespace: dict = {}
    source = "def long_file_frame(d, event):\n    return long_file_frame(d - 1, event) if d else event.wait()\n"
    exec(compile(source, "/" + "x" * 3000 + ".py", "exec"), namespace)
    return namespace["long_file_frame"](depth, event)


def test_a_snapshot_too_large_for_one_websocket_frame_is_cut_under_it():
    release = threading.Event()
    threads = [threading.Thread(target=_deep_with_long_file, args=(200, release), daemon=True, name=f"long-{k}")
               for k in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 5
        while not all(_innermost_is_waiting(t.ident) for t in threads):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        snap = snapshot(step_thread_id=threads[0].ident)
    finally:
        release.set()
        for t in threads:
            t.join(5)
    encoded = msgspec.json.encode(snap)
    assert snap["truncated"] is True and snap["max_depth"] < MAX_DEPTH
    assert len(encoded) <= estimated_bytes(snap) <= thread_stacks.MAX_ANSWER_BYTES < 1 << 20
    ids = {t["id"] for t in snap["threads"]}
    assert {t.ident for t in threads} | {threading.get_ident()} <= ids  # every thread kept, fewer frames each
    step = snap["threads"][0]
    assert step["id"] == threads[0].ident and step["step_thread"] and step["truncated"]
    assert len(step["frames"]) == snap["max_depth"]
    assert step["frames"][-1]["function"] == "Condition.wait"  # the inner end: where it is stuck


def _innermost_is_waiting(ident) -> bool:
    frame = sys._current_frames().get(ident)
    return frame is not None and frame.f_code.co_name == "wait"


# -- estimated size -------------------------------------------------------------------------------------
def test_the_estimate_is_an_upper_bound_of_the_utf8_json_size_non_ascii_included():
    ns: dict = {}
    exec(compile("def réveil_ü(event):\n    event.wait()\n", "/tmp/dößier \"q\" \\ x.py", "exec"), ns)
    with Parked(2, target=ns["réveil_ü"], names=["nämé \"1\"", "\tcontrol"]) as parked:
        snap = snapshot()
        sampled = ThreadSampler(0.05, hz=200).run()
    assert "réveil_ü" in [f["function"] for f in _thread(snap, parked.threads[0].ident)["frames"]]
    for answer in (snap, sampled):
        estimate = estimated_bytes(answer)
        assert len(msgspec.json.encode(answer)) <= estimate
        assert len(json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()) <= estimate


# -- ThreadSampler ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("only", [False, True], ids=["every-thread", "only-the-step-thread"])
def test_a_spinning_thread_s_function_is_the_top_of_its_most_frequent_stack(only):
    flag = [False]
    spinner = threading.Thread(target=_spinning_in_known_function, args=(flag,), daemon=True, name="spinner")
    spinner.start()
    try:
        while not _innermost_is_planted(spinner.ident):
            time.sleep(0.001)
        # ~120 samples asked; a host whose CPUs are busy elsewhere schedules the sampler less:
        # sample again (a few times at most) until there are enough for a share to mean something.
        for _attempt in range(5):
            sampler = ThreadSampler(0.6, hz=200, only_thread_id=spinner.ident if only else None,
                                    step_thread_id=spinner.ident)
            result = sampler.run()
            if result["samples"] >= 20:
                break
    finally:
        flag[0] = True
        spinner.join(5)
    assert result["samples"] >= 5
    assert 0.5 <= result["seconds"] <= 5
    mine = [s for s in result["stacks"] if s["thread_id"] == spinner.ident]
    assert all(s["thread"] == "spinner" and s["step_thread"] for s in mine)
    assert sum(s["count"] for s in mine) == result["samples"]  # read once per tick
    top = max(mine, key=lambda s: s["count"])
    innermost = result["frames"][top["frames"][-1]]
    assert innermost == {"function": "_spinning_in_known_function", "file": __file__, "line": SPIN_LINE}
    assert result["frames"][top["frames"][0]]["function"] == "Thread._bootstrap"
    assert top["count"] >= 0.8 * result["samples"]
    assert threading.get_ident() not in {s["thread_id"] for s in result["stacks"]}  # its own thread
    if only:
        assert {s["thread_id"] for s in result["stacks"]} == {spinner.ident}
    assert result["truncated"] is False and result["dropped"] == 0 and result["stop_reason"] is None


def test_every_thread_mode_reads_each_parked_thread_and_skips_the_skipped():
    with Parked(3) as parked:
        skipped = parked.threads[2]
        result = ThreadSampler(0.2, hz=100, skip_thread_ids=[skipped.ident]).run()
    seen = {s["thread_id"] for s in result["stacks"]}
    assert {parked.threads[0].ident, parked.threads[1].ident} <= seen
    assert skipped.ident not in seen
    for t in parked.threads[:2]:
        stacks = [s for s in result["stacks"] if s["thread_id"] == t.ident]
        assert sum(s["count"] for s in stacks) == result["samples"]
        assert any(result["frames"][s["frames"][-3]]["function"] == "_blocked_in_known_function" for s in stacks)
    assert all(0 <= i < len(result["frames"]) for s in result["stacks"] for i in s["frames"])


@pytest.mark.parametrize("kwargs, bound", [
    ({"seconds": 0}, "seconds must be in (0, 60]"),
    ({"seconds": MAX_SECONDS + 1}, "seconds must be in (0, 60]"),
    ({"seconds": 1, "hz": 0.5}, "hz must be in [1, 1000]"),
    ({"seconds": 1, "hz": MAX_HZ + 1}, "hz must be in [1, 1000]"),
    ({"seconds": 1, "max_stacks": 0}, "max_stacks must be at least 1"),
])
def test_bounds_raise_value_error_naming_the_bound(kwargs, bound):
    with pytest.raises(ValueError) as info:
        ThreadSampler(**kwargs)
    assert bound in str(info.value)


def test_max_stacks_keeps_the_first_stacks_and_counts_the_rest_dropped():
    with Parked(5):
        result = ThreadSampler(0.1, hz=100, max_stacks=2).run()
    assert len(result["stacks"]) == 2
    assert result["truncated"] is True
    assert result["dropped"] >= result["samples"] * 3  # at least 3 more parked threads, every tick


def test_the_byte_bound_drops_the_rarest_stacks(monkeypatch):
    flag = [False]
    spinner = threading.Thread(target=_spinning_in_known_function, args=(flag,), daemon=True, name="spinner")
    release = threading.Event()
    # Threads that come and go: their stacks are rarer than the parked and spinning threads'.
    stop_churn = threading.Event()

    def churn() -> None:
        while not stop_churn.is_set():
            t = threading.Thread(target=time.sleep, args=(0.003,))
            t.start()
            t.join()

    with Parked(6):
        spinner.start()
        churner = threading.Thread(target=churn, daemon=True)
        churner.start()
        try:
            whole = ThreadSampler(0.3, hz=200).run()
            monkeypatch.setattr(thread_stacks, "MAX_ANSWER_BYTES", estimated_bytes(whole) // 2)
            cut = ThreadSampler(0.3, hz=200).run()
        finally:
            flag[0] = True
            stop_churn.set()
            release.set()
            spinner.join(5)
            churner.join(5)
    assert whole["truncated"] is False
    assert cut["truncated"] is True and cut["dropped"] > 0
    assert estimated_bytes(cut) <= thread_stacks.MAX_ANSWER_BYTES
    assert len(msgspec.json.encode(cut)) <= estimated_bytes(cut)
    counts = [s["count"] for s in cut["stacks"]]
    assert counts == sorted(counts, reverse=True)
    used = {i for s in cut["stacks"] for i in s["frames"]}
    assert used == set(range(len(cut["frames"])))  # the frame table holds only the frames kept stacks use
    assert sum(counts) + cut["dropped"] >= cut["samples"] * 7  # 6 parked + the spinner, every tick


def test_stop_ends_a_running_sampling_early():
    sampler = ThreadSampler(MAX_SECONDS, hz=50)
    box: dict = {}
    runner = threading.Thread(target=lambda: box.setdefault("result", sampler.run()), daemon=True)
    runner.start()
    time.sleep(0.2)
    sampler.stop()
    runner.join(5)
    assert not runner.is_alive()
    assert box["result"]["stop_reason"] == STOPPED
    assert box["result"]["seconds"] < 5 and box["result"]["samples"] >= 1


def test_sampling_only_a_thread_that_exits_ends_with_it():
    release = threading.Event()
    target = threading.Thread(target=_blocked_in_known_function, args=(release,), daemon=True)
    target.start()
    threading.Timer(0.15, release.set).start()
    started = time.monotonic()
    result = ThreadSampler(MAX_SECONDS, hz=100, only_thread_id=target.ident).run()
    assert time.monotonic() - started < 10
    assert result["stop_reason"] == THREAD_EXITED
    assert result["samples"] >= 1
    assert all(s["step_thread"] for s in result["stacks"])  # only_thread_id is the step thread by default
