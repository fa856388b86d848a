"""What a recorder dump costs the engine's process: JSON columns against packed rows (``Query.packed``).

A probe answers a recorder query on a thread of the engine's process; whatever that thread does while
it holds the GIL, the step thread waits for. This fills full rings (65,536 steps, 16,384 finished
requests, 4,096 GC pauses), then, in turns, side by side in one run, has a dump thread do what the
probe does for one query (``sidecar/probe/queries.py``: the dump, then its file written) while a
stand-in step thread runs short steps (a little Python and a 0.2 ms sleep) and records how late each
one came back. Two reads: the whole rings (a page's first read, ``GET /recorder``) and a tail of
3 s since a given time (the page's refreshes). Printed per mode: the dump thread's time (median over
``--rounds``) and the step thread's worst and p99 lateness during the dumps; then the ratios of packed
to JSON. Afterwards the sidecar's work for a packed dump (decode, columns, cut), in its own process.

python benchmarks/bench_recorder_dump.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sidecar.common import packed_rows  # noqa: E402
from sidecar.probe.flight_ring import GcPauses, RequestRing, StepRing  # noqa: E402

STEP_NS = 9_000_000  # 9 ms steps: a full ring is about 10 minutes
TAIL_S = 3.0


def full_rings() -> tuple[StepRing, RequestRing, GcPauses]:
    steps, requests, gc = StepRing(), RequestRing(), GcPauses()
    t0 = time.time_ns() - steps.capacity * STEP_NS
    for i in range(steps.capacity):
        steps.begin(t0 + i * STEP_NS)
        steps.end(i, True, 8, 512, 0, 8, 8, 0, now_ns=t0 + i * STEP_NS + 8_000_000)
    for i in range(requests.capacity):
        finished = t0 + i * 4 * STEP_NS
        requests.add(f"cmpl-{i:032x}", finished - 900_000_000, finished - 800_000_000, finished, "finished", 200, 64)
    return steps, requests, gc


def dump_once(rings, since_ns: int, packed: bool, path: str) -> None:
    """What the probe does for one recorder query (Probe.recorder_dump, then QueryAnswerer's write)."""
    steps, requests, gc = rings
    dump = {"gc": gc.dump(since_ns, packed=packed), "steps": steps.dump(since_ns, tail=since_ns > 0, packed=packed),
            "requests": requests.dump(since_ns, packed=packed)}
    if packed:
        dump["packed"] = packed_rows.PACKED_FORMAT
        with open(path, "wb") as f:
            f.write(msgspec.msgpack.encode(dump))
    else:
        with open(path, "w") as f:
            json.dump(dump, f, separators=(",", ":"))


class StepThread:
    """Short steps in a loop; each step's lateness beyond its own sleep, while ``recording``."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self.recording = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            begin = time.perf_counter()
            sum(range(200))  # a little Python: it needs the GIL
            time.sleep(0.0002)
            took = time.perf_counter() - begin
            if self.recording:
                self.late_ms.append(max(0.0, took - 0.0002) * 1e3)

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="dumps of each kind (default %(default)s)")
    args = parser.parse_args(argv)
    rings = full_rings()
    tail_since = time.time_ns() - int(TAIL_S * 1e9) - 8_000_000
    step = StepThread()
    results: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-recorder-dump-") as tmp:
        path = os.path.join(tmp, "dump")
        time.sleep(0.2)
        for _ in range(args.rounds):  # in turns, so that a noisy moment touches every mode alike
            for read, since in (("whole", 0), ("tail 3 s", tail_since)):
                for mode in ("json", "packed"):
                    row = results.setdefault((read, mode), {"ms": [], "late": []})
                    step.late_ms = []
                    step.recording = True
                    begin = time.perf_counter()
                    dump_once(rings, since, mode == "packed", path)
                    row["ms"].append((time.perf_counter() - begin) * 1e3)
                    step.recording = False
                    row["late"].extend(step.late_ms or [0.0])
        step.close()
        dump_once(rings, 0, True, path)
        raw = Path(path).read_bytes()
    print(f"{'read':<9} {'mode':<7} {'dump thread':>12} {'step late max':>14} {'step late p99':>14}")
    for (read, mode), row in results.items():
        late = sorted(row["late"])
        row["median_ms"], row["late_max"] = statistics.median(row["ms"]), late[-1]
        row["late_p99"] = late[min(len(late) - 1, int(0.99 * (len(late) - 1) + 0.5))]
        print(f"{read:<9} {mode:<7} {row['median_ms']:>9.2f} ms {row['late_max']:>11.2f} ms {row['late_p99']:>11.2f} ms")
    for read in ("whole", "tail 3 s"):
        j, p = results[(read, "json")], results[(read, "packed")]
        print(f"ratio packed/json, {read}: dump thread x{p['median_ms'] / j['median_ms']:.3f}, "
              f"step late max x{p['late_max'] / max(j['late_max'], 1e-9):.3f}")
    begin = time.perf_counter()
    made = packed_rows.unpack_dump(msgspec.msgpack.decode(raw))
    print(f"the sidecar's side of a whole packed dump ({len(raw) / 2**20:.1f} MiB, "
          f"{len(made['steps']['steps']['end_ns'])} steps): {(time.perf_counter() - begin) * 1e3:.1f} ms, in its own process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
