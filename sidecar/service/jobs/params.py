"""Validation of the parameters of ``/profile/start``, ``/sync/start`` and the incident views
(``/recorder``, ``/stacks``, ``/requests``): every bad value becomes a ``ParamError`` naming it. Values are converted from text here, once; the rest of the sidecar gets
typed requests."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from ...common import config
from ...engine import STANDARD_ROLES
from ...common.protocol import DEFAULT_STACK_HZ, MAX_QUERY_SECONDS, MAX_SAMPLE_SECONDS, MAX_STACK_HZ
from ...common.protocol import DEFAULT_MEMORY_ENTRIES, MAX_MEMORY_ENTRIES
from .model import SCAN
from ..store.layout import FLEET_ID

ACTIVITIES = ("cpu", "cuda")
BOOLEAN_OPTIONS = ("record_shapes", "profile_memory", "with_flops", "with_modules")
STACK_MODES = ("none", "sampled", "traced")
BACKENDS = ("torch", "nsys")  # what records a capture: torch.profiler, or an nsys that runs the engine
MIN_STACK_HZ = 1.0
KNOWN = {"steps", "activities", "delay", "processes", "instance", "timeout_s", "with_stack", "stacks", "stack_hz",
         "fleet", "backend", *BOOLEAN_OPTIONS}
SCAN_KNOWN = {"steps", "delay", "processes", "instance", "timeout_s", "baseline"}
MODULES_KNOWN = {"steps", "delay", "processes", "instance", "timeout_s"}
MEMORY_KNOWN = {"steps", "delay", "processes", "instance", "timeout_s", "max_entries"}
# A memory snapshot's history holds every alloc and free with its Python stack (a few KB each): a
# few steps show what a step allocates; more only fill the ring of max_entries.
MAX_MEMORY_STEPS = 20
# A module-timing job keeps one record per module call until it ends (two timing events each on a
# GPU): a few steps answer "which layer is slow"; hundreds only cost memory.
MAX_MODULE_STEPS = 100
MAX_INSTANCE = 128

# A number in a parameter is ASCII digits, nothing else: int() and float() also take other scripts'
# digits ("\u0665", Arabic-Indic five) and "_" separators ("1_0"), and float() takes "inf" and "nan".
INTEGER = re.compile(r"[+-]?[0-9]+")
DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
RANK = re.compile(r"[0-9]+")


class ParamError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message

    def to_json(self) -> dict:
        return {"error": "bad_parameter", "param": self.param, "message": self.message}


@dataclass(frozen=True)
class ProcessSelector:
    """``processes=worker:0,engine_core``: roles, optionally with a rank after a colon."""

    role: str
    rank: int | None = None

    def matches(self, role: str, rank: int | None) -> bool:
        return role == self.role and (self.rank is None or self.rank == rank)


@dataclass(frozen=True)
class JobRequest:
    """What every job kind is asked: N working steps after ``delay``, in the selected processes."""

    steps: int
    delay: int = 0
    processes: tuple[ProcessSelector, ...] = ()  # empty: every process
    timeout_s: float = config.DEFAULT_CAPTURE_TIMEOUT_S
    # ``instance=``: the processes of one engine instance (its own, or "<it>/dp<k>": a server's
    # data-parallel engine cores); None: every instance.
    instance: str | None = None

    def selects(self, role: str, rank: int | None, instance: str = "") -> bool:
        if self.instance is not None and instance != self.instance and not instance.startswith(self.instance + "/"):
            return False
        return not self.processes or any(s.matches(role, rank) for s in self.processes)


@dataclass(frozen=True)
class CaptureRequest(JobRequest):
    activities: tuple[str, ...] = ()  # empty: what each host has
    record_shapes: bool = False
    stacks: str = "none"  # one of STACK_MODES; with_stack=true asks for "sampled"
    stack_hz: float = DEFAULT_STACK_HZ
    profile_memory: bool = False
    with_flops: bool = False
    with_modules: bool = False  # torch.profiler's module hierarchy (recorded where the model runs)
    # ``fleet=``: the fleet capture this one belongs to; in the object store under fleets/<fleet>/ (store/layout.py).
    fleet: str | None = None
    backend: str = "torch"  # one of BACKENDS

    @property
    def with_stack(self) -> bool:
        return self.stacks != "none"


@dataclass(frozen=True)
class ScanRequest(JobRequest):
    baseline: str | None = None  # id of an earlier scan: report only sites it did not have


def _int(params: Mapping[str, str], name: str, lo: int, hi: int, default: int | None = None) -> int:
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise ParamError(name, "is required")
        return default
    value = _parse_int(raw, INTEGER)
    if value is None:
        raise ParamError(name, f"must be an integer, got {raw!r}")
    if not lo <= value <= hi:
        raise ParamError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _parse_int(raw: str, pattern: re.Pattern[str]) -> int | None:
    text = raw.strip()
    if not pattern.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return None


def _parse_float(raw: str) -> float | None:
    """A finite decimal number in ASCII digits (1e999 overflows to inf: refused too), else None."""
    text = raw.strip()
    value = float(text) if DECIMAL.fullmatch(text) else math.nan
    return value if math.isfinite(value) else None


def _bool(params: Mapping[str, str], name: str) -> bool:
    raw = params.get(name)
    if raw is None:
        return False
    try:
        return config.parse_bool(raw, name)
    except ValueError:
        raise ParamError(name, f"must be true or false, got {raw!r}") from None


def _stacks(params: Mapping[str, str]) -> tuple[str, float]:
    """``stacks=`` and its older spelling ``with_stack=`` (true: "sampled"), and ``stack_hz=``."""
    raw = params.get("stacks")
    mode = None
    if raw is not None:
        mode = raw.strip().lower()
        if mode not in STACK_MODES:
            raise ParamError("stacks", f"must be one of {', '.join(STACK_MODES)}, got {raw!r}")
    if "with_stack" in params:
        wanted = _bool(params, "with_stack")
        if mode is None:
            mode = "sampled" if wanted else "none"
        elif wanted != (mode != "none"):
            raise ParamError("with_stack", f"contradicts stacks={mode}; give stacks alone")
    mode = mode or "none"
    hz = DEFAULT_STACK_HZ
    if "stack_hz" in params:
        if mode == "none":
            raise ParamError("stack_hz", "needs stacks=sampled or stacks=traced")
        hz = _number(params["stack_hz"], "stack_hz", MIN_STACK_HZ, MAX_STACK_HZ)
    return mode, hz


def _number(raw: str, name: str, lo: float, hi: float) -> float:
    value = _parse_float(raw)
    if value is None:
        raise ParamError(name, f"must be a number, got {raw!r}")
    if not lo <= value <= hi:
        raise ParamError(name, f"must be between {lo:g} and {hi:g}, got {raw!r}")
    return value


def _activities(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = tuple(dict.fromkeys(a.strip().lower() for a in raw.split(",") if a.strip()))
    if not items:
        raise ParamError("activities", f"must list some of {', '.join(ACTIVITIES)}")
    unknown = [a for a in items if a not in ACTIVITIES]
    if unknown:
        raise ParamError("activities", f"unknown value {unknown[0]!r}; use {', '.join(ACTIVITIES)}")
    return items


def known_roles(connected: Iterable[str] = ()) -> tuple[str, ...]:
    """Roles a ``processes=`` filter may name: the standard ones, and whatever roles the connected
    engine processes declare (an engine's own, e.g. a scheduler that also runs the model)."""
    return tuple(dict.fromkeys([*(r.name for r in STANDARD_ROLES), *connected]))


def _processes(raw: str | None, roles: tuple[str, ...]) -> tuple[ProcessSelector, ...]:
    if raw is None:
        return ()
    selectors = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        role, colon, rank = item.partition(":")
        role = role.strip().lower().replace("-", "_")
        if role not in roles:
            raise ParamError("processes", f"unknown role {role!r}; use {', '.join(roles)} (optionally role:rank)")
        if not colon:
            selectors.append(ProcessSelector(role))
            continue
        # "worker:" is a mistake (a rank left out), not "every worker": refuse it rather than guess.
        number = _parse_int(rank, RANK)
        if number is None:
            raise ParamError("processes", f"rank must be a non-negative integer after ':' in {item!r}")
        selectors.append(ProcessSelector(role, number))
    if not selectors:
        raise ParamError("processes", "is empty")
    return tuple(selectors)


def _timeout(raw: str | None) -> float:
    if raw is None:
        return config.DEFAULT_CAPTURE_TIMEOUT_S
    value = _parse_float(raw)
    if value is None:
        raise ParamError("timeout_s", f"must be a number of seconds, got {raw!r}")
    if not 0 < value <= config.MAX_CAPTURE_TIMEOUT_S:
        raise ParamError("timeout_s", f"must be in (0, {config.MAX_CAPTURE_TIMEOUT_S:g}], got {raw!r}")
    return value


def _instance(raw: str | None) -> str | None:
    """An engine instance as ``/processes`` names it; whether one is connected is the start's check."""
    if raw is None:
        return None
    if not raw or len(raw) > MAX_INSTANCE or not raw.isprintable():
        raise ParamError("instance", f"must be an engine instance as /processes lists it, got {raw[:MAX_INSTANCE]!r}")
    return raw


def _reject_unknown(params: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(set(params) - known)
    if unknown:
        raise ParamError(unknown[0], f"unknown parameter; known: {', '.join(sorted(known))}")


def parse_capture_request(params: Mapping[str, str], max_steps: int,
                          connected_roles: Iterable[str] = ()) -> CaptureRequest:
    _reject_unknown(params, KNOWN)
    # Checked in this order, so that of several bad values the same one is named as always.
    return CaptureRequest(
        steps=_int(params, "steps", 1, max_steps),
        delay=_int(params, "delay", 0, max_steps, default=0),
        activities=_activities(params.get("activities")),
        processes=_processes(params.get("processes"), known_roles(connected_roles)),
        instance=_instance(params.get("instance")),
        timeout_s=_timeout(params.get("timeout_s")),
        **{name: _bool(params, name) for name in BOOLEAN_OPTIONS},
        **dict(zip(("stacks", "stack_hz"), _stacks(params))),
        fleet=_fleet(params.get("fleet")),
        backend=_backend(params),
    )


def _backend(params: Mapping[str, str]) -> str:
    """``backend=``: torch (default) or nsys. nsys records no torch.profiler trace, so every option
    that only says what such a trace holds is refused beside it (rather than silently ignored)."""
    backend = _choice(params, "backend", BACKENDS)
    if backend == "nsys":
        for name in ("activities", "stacks", "with_stack", "stack_hz", *BOOLEAN_OPTIONS):
            given = params.get(name)
            off = given is None or (name == "stacks" and given.strip().lower() == "none") or (
                name in BOOLEAN_OPTIONS + ("with_stack",) and not _bool(params, name))
            if not off:
                raise ParamError(name, "is an option of a torch.profiler trace; backend=nsys records none "
                                       "(nsys's own options say what it records)")
    return backend


def _fleet(raw: str | None) -> str | None:
    """``fleet=``: a short id (letters, digits, ``_``, ``-``; at most 64), one segment of a store key."""
    if raw is None:
        return None
    if not FLEET_ID.fullmatch(raw):
        raise ParamError("fleet", f"must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-', got {raw[:80]!r}")
    return raw


def parse_module_request(params: Mapping[str, str], max_steps: int,
                         connected_roles: Iterable[str] = ()) -> JobRequest:
    """``/modules/start``: steps (at most ``MAX_MODULE_STEPS``), delay, processes, instance, timeout_s."""
    _reject_unknown(params, MODULES_KNOWN)
    return JobRequest(**_job_fields(params, max_steps, MAX_MODULE_STEPS, connected_roles))


def _job_fields(params: Mapping[str, str], max_steps: int, kind_max_steps: int,
                connected_roles: Iterable[str]) -> dict:
    """The fields every job kind reads alike (``JobRequest``'s), checked in this order so that of
    several bad values the same one is named as always; ``steps`` at most the smaller of the
    sidecar's ``max_steps`` and the kind's own bound."""
    return dict(
        steps=_int(params, "steps", 1, min(max_steps, kind_max_steps)),
        delay=_int(params, "delay", 0, max_steps, default=0),
        processes=_processes(params.get("processes"), known_roles(connected_roles)),
        instance=_instance(params.get("instance")),
        timeout_s=_timeout(params.get("timeout_s")),
    )


@dataclass(frozen=True)
class MemoryRequest(JobRequest):
    max_entries: int = DEFAULT_MEMORY_ENTRIES  # the allocator's history ring (torch's max_entries)


def parse_memory_request(params: Mapping[str, str], max_steps: int,
                         connected_roles: Iterable[str] = ()) -> MemoryRequest:
    """``/memory/start``: steps (at most ``MAX_MEMORY_STEPS``), max_entries, delay, processes, instance, timeout_s."""
    _reject_unknown(params, MEMORY_KNOWN)
    return MemoryRequest(
        **_job_fields(params, max_steps, MAX_MEMORY_STEPS, connected_roles),
        max_entries=_int(params, "max_entries", 1, MAX_MEMORY_ENTRIES, default=DEFAULT_MEMORY_ENTRIES),
    )


def parse_scan_request(params: Mapping[str, str], max_steps: int,
                       connected_roles: Iterable[str] = ()) -> ScanRequest:
    _reject_unknown(params, SCAN_KNOWN)
    baseline = params.get("baseline")
    if baseline is not None and not SCAN.is_id(baseline):
        raise ParamError("baseline", f"must be the id of an earlier scan (see /syncs), got {baseline!r}")
    return ScanRequest(**_job_fields(params, max_steps, max_steps, connected_roles), baseline=baseline)


# -- the incident views -----------------------------------------------------------------------------
DEFAULT_RECORDER_SECONDS = 120.0
RECORDER_FORMATS = ("json", "trace")
STACKS_FORMATS = ("json", "text", "speedscope")
STACKS_MODES = ("python", "native")
STACKS_THREADS = ("all", "step")
MAX_STACKS_HZ = 1000.0
DEFAULT_STACKS_HZ = 100.0


@dataclass(frozen=True)
class RecorderRequest:
    seconds: float = DEFAULT_RECORDER_SECONDS
    format: str = "json"
    processes: tuple[ProcessSelector, ...] = ()
    # A time range instead of the last ``seconds`` (unix ns, start and end): a link from a span in a trace
    # backend to the steps beside it. ``seconds`` then reaches back to its start.
    window_ns: tuple[int, int] | None = None

    def selects(self, role: str, rank: int | None) -> bool:
        return not self.processes or any(s.matches(role, rank) for s in self.processes)


@dataclass(frozen=True)
class StacksRequest:
    seconds: float = 0.0  # 0: one snapshot of every thread; more: a sampling that long
    hz: float = DEFAULT_STACKS_HZ
    format: str = "json"
    mode: str = "python"
    threads: str = "all"
    processes: tuple[ProcessSelector, ...] = ()

    def selects(self, role: str, rank: int | None) -> bool:
        return not self.processes or any(s.matches(role, rank) for s in self.processes)


def _choice(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = params.get(name)
    if raw is None:
        return choices[0]
    value = raw.strip().lower()
    if value not in choices:
        raise ParamError(name, f"must be one of {', '.join(choices)}, got {raw!r}")
    return value


def parse_recorder_request(params: Mapping[str, str], connected_roles: Iterable[str] = (), *,
                           now_ns: int | None = None) -> RecorderRequest:
    now_ns = time.time_ns() if now_ns is None else now_ns
    _reject_unknown(params, {"seconds", "format", "processes", "start_ms", "duration_ms"})
    seconds = DEFAULT_RECORDER_SECONDS
    if "seconds" in params:
        seconds = _number(params["seconds"], "seconds", 0.001, MAX_QUERY_SECONDS)
    window_ns = _recorder_window(params, now_ns) if "start_ms" in params or "duration_ms" in params else None
    if window_ns is not None:
        if "seconds" in params:
            raise ParamError("seconds", "give either seconds or start_ms (with duration_ms), not both")
        seconds = max((now_ns - window_ns[0]) / 1e9, 0.001)
    return RecorderRequest(seconds=seconds, format=_choice(params, "format", RECORDER_FORMATS),
                           processes=_processes(params.get("processes"), known_roles(connected_roles)),
                           window_ns=window_ns)


# A span's start from another host's clock may be this far ahead of the sidecar's and still be taken.
WINDOW_CLOCK_SLACK_S = 60.0


def _recorder_window(params: Mapping[str, str], now_ns: int) -> tuple[int, int]:
    """``start_ms`` (unix ms, as Grafana's trace view gives a span's start) and ``duration_ms`` (0 to
    MAX_QUERY_SECONDS) → (start, end) in unix ns. The start must lie within the rings' reach (the last
    MAX_QUERY_SECONDS) and not in the future: a range the recorder cannot hold is a 400, not an empty answer."""
    if "start_ms" not in params:
        raise ParamError("start_ms", "duration_ms needs start_ms (unix ms)")
    start_ms = _parse_float(params["start_ms"])
    if start_ms is None:
        raise ParamError("start_ms", f"must be a number (unix ms), got {params['start_ms']!r}")
    start_ns = int(start_ms * 1e6)
    if start_ns > now_ns + int(WINDOW_CLOCK_SLACK_S * 1e9):
        raise ParamError("start_ms", f"is {(start_ns - now_ns) / 1e9:.1f} s in the future of this sidecar's clock")
    if start_ns < now_ns - int(MAX_QUERY_SECONDS * 1e9):
        raise ParamError("start_ms", f"is {(now_ns - start_ns) / 1e9:.0f} s ago: the flight recorder reaches back "
                                     f"{MAX_QUERY_SECONDS:g} s at most")
    duration_ms = _number(params["duration_ms"], "duration_ms", 0, MAX_QUERY_SECONDS * 1000) \
        if "duration_ms" in params else 0.0
    start_ns = min(start_ns, now_ns)  # another host's clock a little ahead: the range starts now
    return start_ns, min(start_ns + int(duration_ms * 1e6), now_ns)


def parse_stacks_request(params: Mapping[str, str], connected_roles: Iterable[str] = ()) -> StacksRequest:
    _reject_unknown(params, {"seconds", "hz", "format", "mode", "threads", "processes"})
    seconds = _number(params["seconds"], "seconds", 0, MAX_SAMPLE_SECONDS) if "seconds" in params else 0.0
    hz = DEFAULT_STACKS_HZ
    if "hz" in params:
        if seconds <= 0:
            raise ParamError("hz", "needs seconds > 0 (a sampling); without seconds one snapshot is taken")
        hz = _number(params["hz"], "hz", 1, MAX_STACKS_HZ)
    fmt = _choice(params, "format", STACKS_FORMATS)
    if fmt == "speedscope" and seconds <= 0:
        raise ParamError("format", "speedscope needs seconds > 0 (a sampling to draw)")
    return StacksRequest(seconds=seconds, hz=hz, format=fmt, mode=_choice(params, "mode", STACKS_MODES),
                         threads=_choice(params, "threads", STACKS_THREADS),
                         processes=_processes(params.get("processes"), known_roles(connected_roles)))
