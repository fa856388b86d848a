"""``/stacks?mode=native``: native and Python frames of every engine process, through py-spy.

py-spy reads another process's memory (ptrace), so it needs the same user and a kernel that allows
it: ``kernel.yama.ptrace_scope`` 0 or 1 with the sidecar's user owning the engine, and in a container
the ``SYS_PTRACE`` capability (docs/incidents.md says how). Without py-spy on the PATH or without the
permission, the answer says which, and the Python-only mode (the probes' own) still works. Processes
are dumped in parallel, each within ``TIMEOUT_S``; only processes on this host can be read.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 10.0
PY_SPY = "py-spy"


@dataclass
class NativeStacks:
    unavailable: str | None = None  # why no process could be read at all
    merged: dict[str, Any] = field(default_factory=dict)
    text: str = ""


async def _dump(exe: str, pid: int) -> tuple[Any, str | None]:
    proc = await asyncio.create_subprocess_exec(exe, "dump", "--native", "--json", "--pid", str(pid),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"py-spy gave no dump within {TIMEOUT_S:g} s"
    if proc.returncode != 0:
        message = err.decode(errors="replace").strip().splitlines()
        return None, f"py-spy failed: {message[-1] if message else 'exit ' + str(proc.returncode)}"
    try:
        return json.loads(out), None
    except ValueError as exc:
        return None, f"py-spy's output is not JSON: {exc}"


async def native_stacks(processes: list[dict[str, Any]]) -> NativeStacks:
    exe = shutil.which(PY_SPY)
    if exe is None:
        return NativeStacks(unavailable="py-spy is not installed on the sidecar's host (pip install py-spy); "
                                        "mode=python needs nothing")
    here = socket.gethostname()
    local = [p for p in processes if not p.get("host") or p.get("host") == here]
    if not local:
        return NativeStacks(unavailable="no engine process runs on the sidecar's host: py-spy reads local processes only")
    dumps = await asyncio.gather(*(_dump(exe, p["pid"]) for p in local))
    merged = {"processes": []}
    lines = []
    for process, (threads, error) in zip(local, dumps):
        merged["processes"].append({"process": process, "error": error, "threads": threads or []})
        lines.append(f"{process.get('label')}" + (f": {error}" if error else ""))
        for thread in threads or []:
            lines.append(f"  Thread {thread.get('thread_id')} ({thread.get('thread_name') or 'unnamed'})")
            for frame in thread.get("frames", []):
                lines.append(f"    {frame.get('name')} ({frame.get('filename')}:{frame.get('line')})")
    if all(error for _, error in dumps):
        return NativeStacks(unavailable="py-spy could not read any engine process; "
                                        f"the first: {dumps[0][1]} (ptrace allowed? docs/incidents.md)")
    return NativeStacks(merged=merged, text="\n".join(lines) + "\n")
