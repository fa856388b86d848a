"""What an engine integration tells the engine-agnostic core about its engine: ``EngineProfile``.

The core names no engine. Everything engine-specific that the core needs — the engine's processes
and which of them count forward steps, how a Python stack maps to a step phase, which of its
GPU→CPU transfers are deliberate, which packages are the integration's own, the OpenTelemetry
names — is data in one ``EngineProfile``, which a plugin builds and hands to ``sidecar.probe.Probe``
and to ``sidecar.telemetry``. A plugin also registers its profile under the entry-point group
``inference_sidecar.engines`` so that tools outside the engine (``sidecar.analysis.sync_sites.scan_trace`` over a trace file)
can use its phase rules and allowlist.

Adding an engine is: a profile, the step hooks that call ``Probe.step_begin``/``step_end`` (with
``sidecar.integration``'s patching and attach helpers), and the entry points. See
docs/engine-api.md, "Adding an engine".
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .common.phases import PhaseRange
from .common.protocol import ROLE_PATTERN, ProcessIdentity
from .syncs.allowlist import AllowEntry, Allowlist, from_environment
from .syncs.sites import PhaseRule, SiteLocator, default_skip_dirs

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "inference_sidecar.engines"
ROLE_NAME = re.compile(ROLE_PATTERN)


@dataclass(frozen=True)
class Role:
    """One kind of engine process.

    ``step_driven`` processes count forward steps and record exactly N of them; the others (an API
    server) record the time window in which the step-driven ones record.

    ``traced_stacks``: torch.profiler's tracer-based ``with_stack`` is affordable here (a model
    runner, whose time is in ops) and ``stacks=traced`` may use it. It is never applied elsewhere: in
    a process whose time is Python (a scheduler, an API server) it records every Python call and
    processes them all in ``stop()`` on the step thread (13.4 s on vLLM's engine core, issue 15);
    such processes get sampled stacks instead (sidecar/stacks/sampler.py).
    """

    name: str  # on the wire, in ``processes=`` and in file names: ``engine_core``
    label: str  # for people: "engine core"
    step_driven: bool
    traced_stacks: bool = False

    def __post_init__(self) -> None:
        if not ROLE_NAME.match(self.name):
            raise ValueError(f"role name must match {ROLE_NAME.pattern}, got {self.name!r}")


# Generic process kinds most engines have. A profile may use these or define its own (an engine
# whose scheduler process also runs the model has one step-driven role, e.g. "scheduler").
API_SERVER = Role("api_server", "API server", step_driven=False)
ENGINE_CORE = Role("engine_core", "engine core", step_driven=True)
WORKER = Role("worker", "worker", step_driven=True, traced_stacks=True)
STANDARD_ROLES: tuple[Role, ...] = (API_SERVER, ENGINE_CORE, WORKER)
# The one process of a single-process engine: it schedules, runs the model and serves the requests
# (a hand-written serving loop, ``sidecar.instrument``). Step-driven; its stacks are sampled, as its
# time is Python as much as ops.
SCHEDULER = Role("scheduler", "scheduler", step_driven=True)


def _no_version() -> str:
    return ""


@dataclass(frozen=True)
class EngineProfile:
    name: str  # the integration's short name ("vllm"); the hello carries describe()
    roles: tuple[Role, ...] = STANDARD_ROLES
    # Innermost matching frame decides a sync site's phase (sidecar.syncs.sites); none: "other".
    phase_rules: tuple[PhaseRule, ...] = ()
    # The engine's deliberate per-step transfers: classified "expected", not "hidden".
    allow_entries: tuple[AllowEntry, ...] = ()
    # Import names of packages whose frames are never a sync site (the integration's own code).
    skip_packages: tuple[str, ...] = ()
    # OpenTelemetry: the default ``service.name`` and the GenAI ``gen_ai.provider.name``.
    service_name: str = "inference-engine"
    provider: str = ""
    # The engine's version string for the hello ("vllm 0.32.0"); called once per probe.
    version: Callable[[], str] = field(default=_no_version, compare=False)
    # The ranges its processes record for their step phases while a capture records (the analysis's
    # step anatomy maps range names to phases through these).
    phase_ranges: tuple[PhaseRange, ...] = ()

    def __post_init__(self) -> None:
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError(f"engine profile {self.name!r}: duplicate role names {names}")
        if not any(r.step_driven for r in self.roles):
            raise ValueError(f"engine profile {self.name!r}: no step-driven role")
        for phase_range in self.phase_ranges:
            if phase_range.role not in names:
                raise ValueError(f"engine profile {self.name!r}: phase range {phase_range.name!r} of unknown role {phase_range.role!r}")

    def phase_table(self, role: str | None = None) -> dict[str, str]:
        """Range name → phase of the ranges a process of ``role`` records (None: every role), as a
        capture writes it into its trace (sidecar/common/phases.py)."""
        return {r.name: r.phase for r in self.phase_ranges if role is None or r.role == role}

    def role(self, name: str) -> Role:
        for role in self.roles:
            if role.name == name:
                return role
        raise ValueError(
            f"engine profile {self.name!r} has no role {name!r}; roles: {', '.join(r.name for r in self.roles)}")

    def describe(self) -> str:
        """The engine and its version for the probe's hello (``ProcessIdentity.engine``)."""
        try:
            return self.version() or self.name
        except Exception:  # a version lookup must never stop a probe
            return self.name

    @property
    def window_roles(self) -> frozenset[str]:
        """Names of the roles that record a time window rather than steps (an API server)."""
        return frozenset(r.name for r in self.roles if not r.step_driven)

    def identity(self, role: str, rank: int | None = None, *, pid: int | None = None, host: str | None = None,
                 cuda: bool = False, engine: str | None = None, instance: str = "") -> ProcessIdentity:
        """This process's identity on the probe channel, as role ``role`` of this engine (``instance``:
        the engine instance it belongs to, where several share one sidecar)."""
        r = self.role(role)
        return ProcessIdentity(
            role=r.name, role_label=r.label, step_driven=r.step_driven,
            pid=os.getpid() if pid is None else pid, rank=rank,
            host=socket.gethostname() if host is None else host, cuda=cuda,
            engine=self.describe() if engine is None else engine, instance=instance)

    # -- the hidden-sync detector's view of the engine ----------------------------------------------
    def skip_dirs(self) -> tuple[str, ...]:
        """Folders never holding a sync site: torch's, the core's, ``skip_packages``'."""
        return default_skip_dirs(self.skip_packages)

    def site_locator(self) -> SiteLocator:
        """A ``SiteLocator`` with this engine's skipped packages and phase rules."""
        return SiteLocator(self.skip_dirs(), self.phase_rules)

    def sync_allowlist(self) -> Allowlist:
        """This engine's allowlist entries plus the user's (``SIDECAR_SYNC_ALLOWLIST``)."""
        return from_environment(self.allow_entries)


# An engine with no profile of its own (tests, a hand-instrumented loop): the standard roles, no
# phase rules, no allowlist entries.
GENERIC = EngineProfile(name="generic")


def installed_profiles() -> list[EngineProfile]:
    """The profiles registered under ``inference_sidecar.engines``, in entry-point name order, one per
    profile name; one that fails to load (its package or engine missing) is logged and skipped."""
    from importlib.metadata import entry_points

    profiles: dict[str, EngineProfile] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            profile = ep.load()
        except Exception as exc:
            log.warning("inference-sidecar: engine profile %s not loaded: %s", ep.name, exc)
            continue
        if isinstance(profile, EngineProfile):
            profiles.setdefault(profile.name, profile)
        else:
            log.warning("inference-sidecar: entry point %s is not an EngineProfile", ep.name)
    return list(profiles.values())


def combined(profiles: Iterable[EngineProfile]) -> EngineProfile:
    """One profile with every given profile's phase rules and allowlist entries, for reading a trace
    whose engine is not known (``scan_trace`` on a file)."""
    profiles = list(profiles)
    if not profiles:
        return GENERIC
    if len(profiles) == 1:
        return profiles[0]
    return EngineProfile(
        name="+".join(p.name for p in profiles),
        phase_rules=tuple(r for p in profiles for r in p.phase_rules),
        allow_entries=tuple(e for p in profiles for e in p.allow_entries),
        skip_packages=tuple(dict.fromkeys(s for p in profiles for s in p.skip_packages)),
    )
