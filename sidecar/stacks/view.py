"""The engine processes' thread stacks as ``GET /stacks`` shows them, in the sidecar.

Each probe answers a stacks query from a thread of its own (sidecar/stacks/threads.py): a
``snapshot()`` of every thread now, or a ``ThreadSampler`` run's folded samples. Here, in the
sidecar, those answers become one view across processes: ``merge_snapshots`` (JSON),
``to_text`` (a plain-text dump like ``py-spy dump``'s, for a terminal next to a hung engine); a
sampling as folded stacks (``samples_to_folded``: ``a;b;c count`` lines, what flamegraph.pl and
speedscope read) or as a speedscope file (``to_speedscope``: https://www.speedscope.app, format
https://www.speedscope.app/file-format-schema.json).

An answer is ``(process, data, error)``: the process as ``ProbeConnection.to_json`` gives it
(``label``, ``pid``, ``role``, ``rank``...), the probe's data or None, and why there is none (a
probe that answered an error, or none in time) or None. Nothing here trusts the data's shape beyond
``check_snapshot`` / ``check_samples``: a malformed answer becomes that process's error, never a
failed request. The order of the answers is kept: the caller gives them in its process order.
"""

from __future__ import annotations

from typing import Any, Optional

from .samples_file import frame_name

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
EXPORTER = "inference-sidecar"
NO_ANSWER = "no answer"

Answer = tuple[dict, Optional[dict], Optional[str]]


# -- shape checks ------------------------------------------------------------------------------------
def _check_frame(frame: Any) -> Optional[str]:
    if not isinstance(frame, dict):
        return "a frame is not an object"
    if not isinstance(frame.get("function"), str) or not isinstance(frame.get("file"), str):
        return "a frame's function or file is not a string"
    if not isinstance(frame.get("line"), int):
        return "a frame's line is not an integer"
    return None


def check_snapshot(snapshot: Any) -> Optional[str]:
    """What is wrong with a ``snapshot()`` answer that the views rely on, or None."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("threads"), list):
        return "malformed snapshot: no thread list"
    for thread in snapshot["threads"]:
        if not isinstance(thread, dict) or not isinstance(thread.get("frames"), list):
            return "malformed snapshot: a thread without a frame list"
        for frame in thread["frames"]:
            problem = _check_frame(frame)
            if problem:
                return f"malformed snapshot: {problem}"
    return None


def check_samples(samples: Any) -> Optional[str]:
    """What is wrong with a ``ThreadSampler.run()`` answer that the views rely on, or None."""
    if not isinstance(samples, dict) or not isinstance(samples.get("frames"), list) \
            or not isinstance(samples.get("stacks"), list):
        return "malformed samples: no frame table or stack list"
    for frame in samples["frames"]:
        problem = _check_frame(frame)
        if problem:
            return f"malformed samples: {problem}"
    nframes = len(samples["frames"])
    for stack in samples["stacks"]:
        if not isinstance(stack, dict) or not isinstance(stack.get("frames"), list):
            return "malformed samples: a stack without a frame list"
        if not all(isinstance(i, int) and 0 <= i < nframes for i in stack["frames"]):
            return "malformed samples: a stack names a frame outside the frame table"
        count = stack.get("count")
        if not isinstance(count, int) or count < 1:
            return "malformed samples: a stack's count is not a positive integer"
    return None


# -- snapshots -----------------------------------------------------------------------------------------
def merge_snapshots(answers: list[Answer]) -> dict:
    """Every process's snapshot in one document: ``{"taken_ns", "processes": [{"process", "error",
    "taken_ns", "truncated", "threads"}]}``. ``taken_ns`` (top level): the earliest snapshot's, null
    when no process answered one. A process without a snapshot has its error (``NO_ANSWER`` when
    none was given) and no threads; a malformed snapshot is an error too."""
    processes = []
    for process, snapshot, error in answers:
        threads: list = []
        taken_ns = None
        truncated = False
        if snapshot is not None and error is None:
            error = check_snapshot(snapshot)
            if error is None:
                threads = snapshot["threads"]
                taken_ns = snapshot.get("taken_ns")
                truncated = bool(snapshot.get("truncated"))
        elif snapshot is None and error is None:
            error = NO_ANSWER
        processes.append({"process": process, "error": error, "taken_ns": taken_ns,
                          "truncated": truncated, "threads": threads})
    taken = [p["taken_ns"] for p in processes if isinstance(p["taken_ns"], int)]
    return {"taken_ns": min(taken) if taken else None, "processes": processes}


def to_text(merged: dict) -> str:
    """``merge_snapshots``'s document as plain text, like ``py-spy dump``: per process a line
    ``Process <pid>: <label>``, per thread ``Thread <id> (<name>)[ step thread]`` and its frames
    innermost first, ``    function (file:line)``, the executing line; a process's error in place
    of its threads."""
    out: list[str] = []
    for entry in merged.get("processes", []):
        process = entry.get("process") or {}
        label = process.get("label") or process.get("role") or "process"
        out.append(f"Process {process.get('pid', '?')}: {label}")
        if entry.get("error"):
            out.append(f"    error: {entry['error']}")
        for thread in entry.get("threads", []):
            name = thread.get("name")
            step = " step thread" if thread.get("step_thread") else ""
            out.append(f"Thread {thread.get('id', '?')} ({name if name is not None else '?'}){step}")
            for frame in reversed(thread.get("frames", [])):
                out.append(f"    {frame['function']} ({frame['file']}:{frame['line']})")
            if thread.get("truncated"):
                out.append("    ... (outer frames not shown)")
        out.append("")
    return "\n".join(out)


# -- samplings as folded stacks ------------------------------------------------------------------------------
def _folded_name(name: str) -> str:
    """A name as one folded-stack element: ``;`` separates elements and a line ends a stack."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def samples_to_folded(answers_of_samples: list[Answer]) -> str:
    """Every process's sampling as folded stacks, one line per stack, ``<process label>;<thread
    name>;<outermost frame>;...;<innermost frame> <count>`` (Brendan Gregg's format: flamegraph.pl,
    speedscope and inferno read it), frames named as in ``to_speedscope``; a stack cut at the
    sampler's depth starts under ``[stack cut at N frames]``. Processes with an error, no data or
    malformed data give no line (the format has no place for them)."""
    out: list[str] = []
    for process, samples, error in answers_of_samples:
        if error is not None or samples is None or check_samples(samples) is not None:
            continue
        label = _folded_name(process.get("label") or process.get("role") or "process")
        names = [_folded_name(frame_name(f["function"], f["file"], f["line"])) for f in samples["frames"]]
        cut = f"[stack cut at {samples.get('max_depth', '?')} frames]"
        for stack in samples["stacks"]:
            thread = stack.get("thread")
            parts = [label, _folded_name(thread if thread is not None else f"thread {stack.get('thread_id', '?')}")]
            if stack.get("truncated"):
                parts.append(cut)
            parts += [names[i] for i in stack["frames"]]
            out.append(f"{';'.join(parts)} {stack['count']}")
    return "\n".join(out) + ("\n" if out else "")


# -- samplings as a speedscope file ----------------------------------------------------------------------------
def to_speedscope(answers_of_samples: list[Answer], name: str = "inference-sidecar stacks") -> dict:
    """A speedscope file of every process's sampling: one ``sampled`` profile per (process, thread),
    named ``<process label> — <thread name>``, the step thread first in each process; frames shared
    across processes (one per (function, file, line), named like the capture's flame chart,
    ``function (file.py:line)``, here with the executing line); each stack a sample, outermost frame
    first, weighted by its count (unit "none": samples, not time); a stack cut at the sampler's depth
    under a synthetic root ``[stack cut at N frames]``.

    Answers with an error, no data or malformed data give no profile (the caller reports their
    errors beside the file); with no profile at all, the file is valid but speedscope shows nothing.
    """
    frames: list[dict] = []
    index: dict[tuple, int] = {}

    def shared(key: tuple, frame: dict) -> int:
        fid = index.get(key)
        if fid is None:
            fid = index[key] = len(frames)
            frames.append(frame)
        return fid

    profiles: list[dict] = []
    for process, samples, error in answers_of_samples:
        if error is not None or samples is None or check_samples(samples) is not None:
            continue
        label = process.get("label") or process.get("role") or "process"
        local = [shared((f["function"], f["file"], f["line"]),
                        {"name": frame_name(f["function"], f["file"], f["line"]), "file": f["file"],
                         "line": f["line"]})
                 for f in samples["frames"]]
        cut_name = f"[stack cut at {samples.get('max_depth', '?')} frames]"
        threads: dict[Any, dict] = {}  # thread id (its name when the answer has none) -> profile
        for stack in samples["stacks"]:
            thread_name = stack.get("thread")
            key = stack.get("thread_id", thread_name)
            profile = threads.get(key)
            if profile is None:
                shown = thread_name if thread_name is not None else f"thread {key}"
                profile = threads[key] = {
                    "type": "sampled", "name": f"{label} — {shown}", "unit": "none",
                    "startValue": 0, "endValue": 0, "samples": [], "weights": [],
                    "_order": (not stack.get("step_thread"), thread_name is None, thread_name or "", str(key)),
                }
            stack_ids = [local[i] for i in stack["frames"]]
            if stack.get("truncated"):
                stack_ids.insert(0, shared((cut_name,), {"name": cut_name}))  # a 1-tuple: no real frame's key
            profile["samples"].append(stack_ids)
            profile["weights"].append(stack["count"])
            profile["endValue"] += stack["count"]
        for profile in sorted(threads.values(), key=lambda p: p["_order"]):
            del profile["_order"]
            profiles.append(profile)
    document: dict[str, Any] = {"$schema": SPEEDSCOPE_SCHEMA, "shared": {"frames": frames},
                                "profiles": profiles, "name": name, "exporter": EXPORTER}
    if profiles:
        document["activeProfileIndex"] = 0
    return document
