"""What the sidecar and the probes say to each other over the probe channel (JSON over a websocket).

Kept in one place so both ends agree; every message is a dict with a ``type``.

probe → sidecar
  hello      {role, rank, pid, host, cuda, step_driven, engine, torch}
  heartbeat  {steps}                      total forward steps so far
  capture    {capture_id, state, steps_recorded, steps_seen, first_step, file, bytes, error}
sidecar → probe
  arm        {capture: CaptureSpec}       probes answer state=armed with steps_seen (their step count)
  begin      {capture_id, start_step}     record from this working step on, the same in every process
  stop       {capture_id, reason}         end early, keeping what was recorded
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
PROBE_WS_PATH = "/probe/ws"

# Process roles. Step-driven roles count forward steps; the API server records for the time window
# in which the step-driven processes record.
ROLE_API_SERVER = "api_server"
ROLE_ENGINE_CORE = "engine_core"
ROLE_WORKER = "worker"
ROLES = (ROLE_API_SERVER, ROLE_ENGINE_CORE, ROLE_WORKER)

# Per-process capture states reported by a probe.
P_ARMED = "armed"
P_CAPTURING = "capturing"
P_EXPORTING = "exporting"
P_DONE = "done"
P_FAILED = "failed"


@dataclass(frozen=True)
class CaptureSpec:
    id: str
    steps: int
    out_dir: str
    delay: int = 0
    activities: tuple[str, ...] = ()  # empty: what the host has
    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    with_flops: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["activities"] = list(self.activities)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CaptureSpec":
        return cls(
            id=str(d["id"]),
            steps=int(d["steps"]),
            out_dir=str(d["out_dir"]),
            delay=int(d.get("delay", 0)),
            activities=tuple(d.get("activities") or ()),
            record_shapes=bool(d.get("record_shapes", False)),
            with_stack=bool(d.get("with_stack", False)),
            profile_memory=bool(d.get("profile_memory", False)),
            with_flops=bool(d.get("with_flops", False)),
        )


@dataclass(frozen=True)
class ProcessIdentity:
    role: str
    pid: int
    rank: int | None = None
    host: str = ""
    cuda: bool = False
    engine: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def step_driven(self) -> bool:
        return self.role != ROLE_API_SERVER

    @property
    def label(self) -> str:
        names = {ROLE_API_SERVER: "API server", ROLE_ENGINE_CORE: "engine core", ROLE_WORKER: "worker"}
        name = names.get(self.role, self.role)
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"{name}{rank} (pid {self.pid})"

    @property
    def file_stem(self) -> str:
        rank = f"-rank{self.rank}" if self.rank is not None else ""
        return f"{self.role}{rank}-pid{self.pid}"

    def to_hello(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "role": self.role,
            "pid": self.pid,
            "rank": self.rank,
            "host": self.host,
            "cuda": self.cuda,
            "engine": self.engine,
            **self.extra,
        }

    @classmethod
    def from_hello(cls, msg: dict[str, Any]) -> "ProcessIdentity":
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        rank = msg.get("rank")
        return cls(
            role=role,
            pid=int(msg["pid"]),
            rank=None if rank is None else int(rank),
            host=str(msg.get("host", "")),
            cuda=bool(msg.get("cuda", False)),
            engine=str(msg.get("engine", "")),
        )
