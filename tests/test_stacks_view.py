"""sidecar/stacks/view.py: the probes' stacks answers as ``GET /stacks`` shows them — merged across
processes (an error in place of a process's threads), as py-spy-dump-like text, and a sampling as a
speedscope file that follows the format's schema."""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import pytest

from sidecar.stacks.samples_file import frame_name
from sidecar.stacks.view import (
    EXPORTER,
    NO_ANSWER,
    SPEEDSCOPE_SCHEMA,
    check_samples,
    check_snapshot,
    merge_snapshots,
    samples_to_folded,
    to_speedscope,
    to_text,
)
from sidecar.stacks.threads import ThreadSampler, snapshot

pytestmark = pytest.mark.timeout(60)

ENGINE = {"role": "engine_core", "pid": 101, "rank": None, "label": "engine core (pid 101)"}
WORKER = {"role": "worker", "pid": 202, "rank": 0, "label": "worker 0 (pid 202)"}
SERVER = {"role": "api_server", "pid": 303, "rank": None, "label": "API server (pid 303)"}

# speedscope's file format (src/lib/file-format-spec.ts, the source of file-format-schema.json),
# the parts this project writes, as a JSON Schema: a file speedscope imports.
SPEEDSCOPE_FILE = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {
            "type": "object", "required": ["frames"],
            "properties": {"frames": {"type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "file": {"type": "string"},
                               "line": {"type": "number"}, "col": {"type": "number"}}}}},
        },
        "profiles": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"const": "sampled"}, "name": {"type": "string"},
                "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"]},
                "startValue": {"type": "number"}, "endValue": {"type": "number"},
                "samples": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
                "weights": {"type": "array", "items": {"type": "number"}},
            }}},
        "name": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "exporter": {"type": "string"},
    },
    "additionalProperties": False,
}


def _validate_speedscope(document: dict) -> None:
    """The schema, and what it cannot say: every index in range, one weight per sample,
    ``endValue`` the profile's total weight."""
    jsonschema.validate(document, SPEEDSCOPE_FILE)
    nframes = len(document["shared"]["frames"])
    for profile in document["profiles"]:
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(0 <= i < nframes for stack in profile["samples"] for i in stack)
        assert all(stack for stack in profile["samples"])
        assert profile["startValue"] == 0 and profile["endValue"] == sum(profile["weights"])
    json.dumps(document)  # plain JSON


def _blocked_in_known_function(event: threading.Event) -> None:
    event.wait()


def _spinning_in_known_function(flag: list) -> None:
    while not flag[0]: pass  # noqa: E701


BLOCKED_LINE = _blocked_in_known_function.__code__.co_firstlineno + 1
SPIN_LINE = _spinning_in_known_function.__code__.co_firstlineno + 1


def _frame(function: str, file: str, line: int) -> dict:
    return {"function": function, "file": file, "line": line}


def _snapshot_of(*threads: dict, taken_ns: int = 1_000) -> dict:
    return {"taken_ns": taken_ns, "max_depth": 128, "truncated": False, "threads": list(threads)}


STEP = {"id": 11, "native_id": 1011, "name": "MainThread", "daemon": False, "step_thread": True,
        "truncated": False, "frames": [_frame("run", "/e/core.py", 10), _frame("step", "/e/core.py", 20),
                                       _frame("forward", "/e/model.py", 88)]}
OTHER = {"id": 12, "native_id": 1012, "name": "link", "daemon": True, "step_thread": False,
         "truncated": True, "frames": [_frame("loop", "/p/link.py", 5)]}


# -- merge_snapshots ------------------------------------------------------------------------------------------
def test_merge_keeps_each_process_in_order_with_its_error_in_place_of_threads():
    merged = merge_snapshots([
        (ENGINE, _snapshot_of(STEP, OTHER, taken_ns=2_000), None),
        (WORKER, None, "no answer within 2 s"),
        (SERVER, None, None),
        ({**SERVER, "pid": 304}, {"threads": [{"frames": [{"function": 1}]}]}, None),
        ({**SERVER, "pid": 305}, _snapshot_of(OTHER, taken_ns=1_500), None),
    ])
    assert merged["taken_ns"] == 1_500  # the earliest snapshot's
    engine, worker, server, malformed, last = merged["processes"]
    assert engine == {"process": ENGINE, "error": None, "taken_ns": 2_000, "truncated": False,
                      "threads": [STEP, OTHER]}
    assert worker["error"] == "no answer within 2 s" and worker["threads"] == []
    assert server["error"] == NO_ANSWER and server["threads"] == []
    assert malformed["error"].startswith("malformed snapshot") and malformed["threads"] == []
    assert last["process"]["pid"] == 305 and last["threads"] == [OTHER]
    json.dumps(merged)


def test_merge_of_no_snapshot_at_all_has_no_time():
    merged = merge_snapshots([(ENGINE, None, "probe lost")])
    assert merged["taken_ns"] is None
    assert merged["processes"][0]["error"] == "probe lost"


def test_an_error_wins_over_data_sent_with_it():
    merged = merge_snapshots([(ENGINE, _snapshot_of(STEP), "sampler failed")])
    assert merged["processes"][0]["error"] == "sampler failed"
    assert merged["processes"][0]["threads"] == []


@pytest.mark.parametrize("bad", [None, [], {"threads": None}, {"threads": [1]}, {"threads": [{"frames": 3}]},
                                 {"threads": [{"frames": [_frame("f", "x.py", "7")]}]}])
def test_check_snapshot_names_what_is_malformed(bad):
    assert check_snapshot(bad).startswith("malformed snapshot")
    assert check_snapshot(_snapshot_of(STEP)) is None


# -- to_text ----------------------------------------------------------------------------------------------
def test_text_lists_each_process_and_thread_with_frames_innermost_first():
    text = to_text(merge_snapshots([(ENGINE, _snapshot_of(STEP, OTHER), None), (WORKER, None, "timed out")]))
    lines = text.splitlines()
    assert lines[0] == "Process 101: engine core (pid 101)"
    assert lines[1] == "Thread 11 (MainThread) step thread"
    assert lines[2:5] == ["    forward (/e/model.py:88)", "    step (/e/core.py:20)", "    run (/e/core.py:10)"]
    assert lines[5] == "Thread 12 (link)"  # not the step thread: no flag
    assert lines[6] == "    loop (/p/link.py:5)"
    assert lines[7].startswith("    ...")  # a truncated thread says so
    assert "Process 202: worker 0 (pid 202)" in lines
    assert lines[lines.index("Process 202: worker 0 (pid 202)") + 1] == "    error: timed out"


def test_text_of_a_real_snapshot_shows_the_blocked_function_at_its_line():
    release = threading.Event()
    t = threading.Thread(target=_blocked_in_known_function, args=(release,), daemon=True, name="stuck")
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not any(f["function"] == "Event.wait" for th in snapshot()["threads"] if th["id"] == t.ident
                      for f in th["frames"]):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        snap = snapshot(step_thread_id=t.ident, skip_thread_ids=[threading.get_ident()])
    finally:
        release.set()
        t.join(5)
    text = to_text(merge_snapshots([(ENGINE, snap, None)]))
    assert f"Thread {t.ident} (stuck) step thread" in text
    assert f"    _blocked_in_known_function ({__file__}:{BLOCKED_LINE})" in text
    lines = text.splitlines()
    mine = lines.index(f"    _blocked_in_known_function ({__file__}:{BLOCKED_LINE})")
    assert lines[mine - 1].startswith("    Event.wait (")  # what it called: above it (inner)
    assert lines[mine + 1].startswith("    Thread.run (")  # what called it: below it (outer)


# -- to_speedscope ------------------------------------------------------------------------------------------
def _samples(stacks: list[dict], frames: list[dict], samples: int) -> dict:
    return {"seconds": 1.0, "hz": 100.0, "samples": samples, "max_depth": 128, "frames": frames,
            "stacks": stacks, "truncated": False, "dropped": 0, "missed": 0, "stop_reason": None}


FRAMES = [_frame("run", "/e/core.py", 10), _frame("step", "/e/core.py", 20), _frame("forward", "/e/model.py", 88),
          _frame("loop", "/p/link.py", 5)]
SAMPLED = _samples([
    {"thread": "link", "thread_id": 12, "step_thread": False, "frames": [3], "count": 100},
    {"thread": "MainThread", "thread_id": 11, "step_thread": True, "frames": [0, 1, 2], "count": 70},
    {"thread": "MainThread", "thread_id": 11, "step_thread": True, "frames": [0, 1], "count": 30},
    {"thread": "MainThread", "thread_id": 11, "step_thread": True, "frames": [2], "count": 5, "truncated": True},
], FRAMES, samples=105)


def test_speedscope_has_one_profile_per_process_and_thread_with_shared_frames():
    # the worker's frame table lists the same frames in another order: shared all the same
    worker_frames = [FRAMES[2], FRAMES[1], FRAMES[0], _frame("sample", "/e/sampler.py", 3)]
    worker = _samples([{"thread": "MainThread", "thread_id": 7, "step_thread": True, "frames": [2, 1, 0, 3],
                        "count": 9}], worker_frames, samples=9)
    document = to_speedscope([(ENGINE, SAMPLED, None), (WORKER, worker, None), (SERVER, None, "lost")],
                             name="stacks of a hung engine")
    _validate_speedscope(document)
    assert document["$schema"] == SPEEDSCOPE_SCHEMA and document["exporter"] == EXPORTER
    assert document["name"] == "stacks of a hung engine"
    names = [p["name"] for p in document["profiles"]]
    assert names == ["engine core (pid 101) — MainThread", "engine core (pid 101) — link",
                     "worker 0 (pid 202) — MainThread"]  # the step thread first; no profile for an error
    shared = document["shared"]["frames"]
    real = [f for f in shared if "file" in f]
    assert len(real) == len({(f["name"], f["file"], f["line"]) for f in real}) == 5  # deduplicated
    step, link, worker_main = document["profiles"]
    assert step["weights"] == [70, 30, 5] and step["endValue"] == 105
    assert link["weights"] == [100] and link["endValue"] == 100
    assert worker_main["endValue"] == 9
    names_of = [[shared[i]["name"] for i in stack] for stack in step["samples"]]
    assert names_of[0] == [frame_name("run", "/e/core.py", 10), frame_name("step", "/e/core.py", 20),
                           frame_name("forward", "/e/model.py", 88)]  # outermost first
    assert names_of[2] == ["[stack cut at 128 frames]", frame_name("forward", "/e/model.py", 88)]
    assert shared[step["samples"][0][2]] == {"name": "forward (model.py:88)", "file": "/e/model.py", "line": 88}
    # the same (function, file, line) in two processes is one shared frame, whatever its local index
    assert worker_main["samples"][0][:3] == step["samples"][0]


def test_speedscope_skips_malformed_samples_and_is_valid_with_no_profile():
    bad = _samples([{"thread": "t", "thread_id": 1, "step_thread": False, "frames": [9], "count": 1}],
                   FRAMES, samples=1)
    assert "outside the frame table" in check_samples(bad)
    document = to_speedscope([(ENGINE, bad, None), (WORKER, None, None)])
    _validate_speedscope(document)
    assert document["profiles"] == [] and "activeProfileIndex" not in document


def test_speedscope_of_a_real_sampling_weights_add_up_to_the_samples():
    flag = [False]
    spinner = threading.Thread(target=_spinning_in_known_function, args=(flag,), daemon=True, name="spinner")
    release = threading.Event()
    parked = threading.Thread(target=_blocked_in_known_function, args=(release,), daemon=True, name="parked")
    spinner.start()
    parked.start()
    try:
        time.sleep(0.05)
        result = ThreadSampler(0.4, hz=200, step_thread_id=spinner.ident).run()
    finally:
        flag[0] = True
        release.set()
        spinner.join(5)
        parked.join(5)
    assert check_samples(result) is None
    document = to_speedscope([(ENGINE, result, None)])
    _validate_speedscope(document)
    threads = {s["thread_id"] for s in result["stacks"]}
    assert len(document["profiles"]) == len(threads)  # one profile per thread sampled
    by_name = {p["name"]: p for p in document["profiles"]}
    step = document["profiles"][0]
    assert step["name"] == "engine core (pid 101) — spinner"
    for name in ("spinner", "parked"):
        assert by_name[f"engine core (pid 101) — {name}"]["endValue"] == result["samples"]
    shared = document["shared"]["frames"]
    heaviest = step["samples"][step["weights"].index(max(step["weights"]))]
    assert shared[heaviest[-1]] == {"name": frame_name("_spinning_in_known_function", __file__, SPIN_LINE),
                                    "file": __file__, "line": SPIN_LINE}
    assert max(step["weights"]) >= 0.8 * result["samples"]


# -- samples_to_folded ------------------------------------------------------------------------------------------
def test_folded_stacks_have_one_line_per_stack_outermost_first_with_its_count():
    odd = _samples([{"thread": "a;b", "thread_id": 3, "step_thread": False, "frames": [0], "count": 2}],
                   [_frame("f;g", "/x/y.py", 4)], samples=2)
    text = samples_to_folded([(ENGINE, SAMPLED, None), (WORKER, None, "lost"), (SERVER, odd, None)])
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == 5  # 4 stacks of the engine, 1 of the server, none of the worker
    assert lines[1] == ("engine core (pid 101);MainThread;run (core.py:10);step (core.py:20);forward (model.py:88) 70")
    assert lines[3] == "engine core (pid 101);MainThread;[stack cut at 128 frames];forward (model.py:88) 5"
    assert lines[4] == "API server (pid 303);a:b;f:g (y.py:4) 2"  # ";" would split a frame in two
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        assert int(count) >= 1 and all(stack.split(";"))
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("engine")) == 205
    assert samples_to_folded([(WORKER, None, "lost")]) == ""
