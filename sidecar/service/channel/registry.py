"""Engine processes currently connected to the sidecar over the probe channel.

The registry also holds the step alarm (issue 30): the lowest threshold of the single-event step
rules (sidecar/service/incidents/step_alarm.py), which each probe that asked for it (``hello.step_alarm``) is
sent after its handshake and again whenever it changes, so that its link thread reports a step over
it as soon as the step ends (sidecar/probe/heartbeat.py) rather than at the next 2 s heartbeat.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ...common.protocol import FromSidecar, Heartbeat, InFlight, ProcessIdentity, StepAlarm
from ...common.protocol_codec import encode
from .clock_sync import ClockEstimate
from .watch_reports import watch_report_problem

log = logging.getLogger(__name__)

# Two counts closer than this give no rate: the heartbeat comes every 2 s, and a shorter interval
# measured on the sidecar's side is mostly the jitter of delivery.
MIN_RATE_INTERVAL_S = 0.5

# A process whose link dropped is remembered this long unless it reconnects, so that a job started
# meanwhile names it rather than ending without it and without a word; at most this many, whatever the churn.
RECENTLY_LOST_S = 30.0
MAX_RECENTLY_LOST = 256
# A job waits this long at most after a loss for the process to reconnect (sidecar/service/jobs/manager.py): above the
# probe's reconnect backoff (2 s at most, probe/link.py), so that a link the sidecar dropped (a missed
# websocket heartbeat on a starved host) is back, and in the job, before the job picks its processes.
RETURN_WAIT_S = 3.0


class ProbeSocket(Protocol):
    """What the registry needs of a probe's websocket (aiohttp's ``WebSocketResponse``, in routes/probe_channel.py)."""

    async def send_str(self, data: str) -> None: ...


@dataclass(frozen=True)
class LostProcess:
    identity: ProcessIdentity
    lost_at: float  # time.monotonic()

    def key(self) -> tuple:
        return _process_key(self.identity)


def _process_key(identity: ProcessIdentity) -> tuple:
    """One process across its connections: a reconnect says the same."""
    return identity.host, identity.pid, identity.role, identity.rank


@dataclass(eq=False)
class ProbeConnection:
    id: int
    identity: ProcessIdentity
    ws: ProbeSocket
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    steps: int = 0  # the latest working-step count the probe sent
    # Working steps per second between two counts received on this connection; None until then.
    step_rate: float | None = None
    # The longest a "begin" took to reach it, learned when it started a job late (sidecar/service/jobs/arming.py): the
    # lead of its later jobs covers it.
    begin_took_s: float = 0.0
    sync_watch: dict[str, Any] | None = None  # the probe's latest always-on sync watch report
    watch_report_refused: bool = False  # one of its reports was malformed (warned once)
    open_step_ms: float | None = None  # how long its running step had run at the last heartbeat
    stuck: dict[str, Any] | None = None  # its watchdog's report while a step runs over the threshold
    in_flight: InFlight | None = None  # the requests it knows in flight (the engine core)
    # The slowest step that ended between its last two heartbeats (ms, step number); None: none ended.
    slowest_step_ms: float | None = None
    slowest_step: int | None = None
    # Its clock against the sidecar's (clock_sync.py): how its trace is put on the sidecar's clock.
    clock: ClockEstimate = field(default_factory=ClockEstimate)
    # The sidecar sees its marker file: it reads the files the probe names; else it fetches them
    # over the channel (file_fetch.py), whose chunks wait here by (file, offset).
    shares_files: bool = True
    # Its hello said it acts on the step alarm, and the threshold it was last sent (None: none, as a
    # probe starts each connection).
    step_alarm: bool = False
    step_alarm_sent: float | None = None
    chunk_waiters: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)
    # (count, when received): what the next rate is measured from.
    _baseline: tuple[int, float] | None = field(default=None, init=False, repr=False)

    def observe_steps(self, steps: int, now: float) -> None:
        """A working-step count the probe sent (a heartbeat, an "armed" report). A count is the
        process's total since the engine started, so the first on a connection is only a baseline:
        after a sidecar restart it may hold days of steps, which are no rate."""
        if self._baseline is None:
            self._baseline = (steps, now)
        else:
            base_steps, base_at = self._baseline
            elapsed = now - base_at
            if elapsed >= MIN_RATE_INTERVAL_S:  # a closer count keeps the older baseline
                if steps >= base_steps:
                    self.step_rate = (steps - base_steps) / elapsed
                self._baseline = (steps, now)
        self.steps, self.last_seen = steps, now

    def observe_heartbeat(self, beat: Heartbeat, now: float) -> None:
        self.observe_steps(beat.steps, now)
        if beat.sync_watch is not None:
            problem = watch_report_problem(beat.sync_watch)
            if problem is None:
                self.sync_watch = beat.sync_watch
            elif not self.watch_report_refused:  # its readers would fail on it (watch_reports.py): the last good one stays
                self.watch_report_refused = True  # warned once: the probe sends one every heartbeat
                log.warning("probe %s: sync watch report dropped (and any more like it): %s", self.identity.label, problem)
        self.open_step_ms, self.stuck, self.in_flight = beat.open_step_ms, beat.stuck, beat.in_flight
        self.slowest_step_ms, self.slowest_step = beat.slowest_step_ms, beat.slowest_step

    def stuck_json(self) -> dict[str, Any] | None:
        """The watchdog's report without its frames (``/healthz``, ``/processes``); None when not stuck."""
        if self.stuck is None:
            return None
        return {"process": self.identity.label, "step": self.stuck.get("step"), "age_s": self.stuck.get("age_s"),
                "since_ns": self.stuck.get("since_ns"), "threshold_s": self.stuck.get("threshold_s")}

    async def send(self, msg: FromSidecar) -> bool:
        """Send one typed message; False when the probe cannot be reached (the caller marks it lost)."""
        try:
            await self.ws.send_str(encode(msg))
            return True
        except (ConnectionError, RuntimeError) as exc:
            log.info("probe %s unreachable: %s", self.identity.label, exc)
            return False

    def to_json(self) -> dict[str, Any]:
        ident = self.identity
        return {
            "role": ident.role,
            "pid": ident.pid,
            "rank": ident.rank,
            "label": ident.label,
            "host": ident.host,
            "cuda": ident.cuda,
            "engine": ident.engine,
            "instance": ident.instance,
            "last_step": self.steps,
            "step_rate": round(self.step_rate, 1) if self.step_rate is not None else None,
            "connected_at": self.connected_at,
            "last_seen": self.last_seen,
            "open_step_ms": round(self.open_step_ms, 1) if self.open_step_ms is not None else None,
            "stuck": self.stuck_json(),
            "clock": self.clock.to_json(),
            "files_shared": self.shares_files,
        }


HeartbeatListener = Callable[[ProbeConnection, float], None]


class ProbeRegistry:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._probes: dict[int, ProbeConnection] = {}
        self._listeners: list[HeartbeatListener] = []
        self._lost: OrderedDict[tuple, LostProcess] = OrderedDict()  # oldest first
        self._returned = asyncio.Event()
        self._step_alarm_ms: float | None = None
        self._alarm_sender: asyncio.Task | None = None

    def on_heartbeat(self, listener: HeartbeatListener) -> None:
        """Call ``listener(conn, arrived)`` after each heartbeat is taken (``arrived``: ``time.monotonic()``
        when it was), on the event loop: how the triggers see a slow step the moment it is reported."""
        self._listeners.append(listener)

    def observe_heartbeat(self, conn: ProbeConnection, beat: Heartbeat, now: float) -> None:
        arrived = time.monotonic()
        conn.observe_heartbeat(beat, now)
        for listener in self._listeners:
            try:
                listener(conn, arrived)
            except Exception:  # a listener's fault must not cut the probe's connection
                log.exception("heartbeat listener failed")

    def add(self, identity: ProcessIdentity, ws: ProbeSocket, shares_files: bool = True,
            step_alarm: bool = False) -> ProbeConnection:
        """A probe that proved it knows the token. ``step_alarm``: its hello says it acts on the step
        alarm, which it is sent now if one is set."""
        conn = ProbeConnection(next(self._ids), identity, ws, shares_files=shares_files, step_alarm=step_alarm)
        self._probes[conn.id] = conn
        if self._lost.pop(_process_key(identity), None) is not None:
            self._returned.set()
        self._send_step_alarms()
        return conn

    # -- the step alarm ----------------------------------------------------------------------------
    @property
    def step_alarm_ms(self) -> float | None:
        return self._step_alarm_ms

    def set_step_alarm(self, threshold_ms: float | None) -> None:
        """The lowest threshold of the single-event step rules (None: none). Every connected probe
        that acts on it is sent the new value (from a task: this is called from the trigger routes,
        synchronously); a probe that connects later is sent it after its handshake. Sends only what
        changed: a probe is never sent the value it has."""
        self._step_alarm_ms = threshold_ms
        self._send_step_alarms()

    def _behind(self) -> list[ProbeConnection]:
        return [c for c in self._probes.values() if c.step_alarm and c.step_alarm_sent != self._step_alarm_ms]

    def _send_step_alarms(self) -> None:
        if self._alarm_sender is not None and not self._alarm_sender.done():
            return  # the running sender goes on until every probe has the latest value
        if not self._behind():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (an app being built): no probe is connected yet either
            return
        self._alarm_sender = loop.create_task(self._alarm_sends())

    async def _alarm_sends(self) -> None:
        """Until every probe has the current value: one task at a time, so that the last value set is
        the last sent to each probe, however quickly rules come and go."""
        while behind := self._behind():
            value = self._step_alarm_ms
            for conn in behind:
                conn.step_alarm_sent = value
            # All at once: a probe slow to take a frame does not hold up the others.
            await asyncio.gather(*(conn.send(StepAlarm(threshold_ms=value)) for conn in behind),
                                 return_exceptions=True)

    def remove(self, conn: ProbeConnection) -> None:
        if self._probes.pop(conn.id, None) is None:
            return
        key = _process_key(conn.identity)
        if not any(_process_key(c.identity) == key for c in self._probes.values()):
            self._lost.pop(key, None)
            self._lost[key] = LostProcess(conn.identity, time.monotonic())
            while len(self._lost) > MAX_RECENTLY_LOST:
                self._lost.popitem(last=False)

    def recently_lost(self, now: float | None = None) -> list[LostProcess]:
        """The processes whose link dropped in the last ``RECENTLY_LOST_S`` before ``now``
        (``time.monotonic()``) and that have not reconnected, oldest loss first."""
        now = time.monotonic() if now is None else now
        while self._lost and now - next(iter(self._lost.values())).lost_at > RECENTLY_LOST_S:
            self._lost.popitem(last=False)
        return list(self._lost.values())

    async def wait_for_returns(self, within_s: float | None = None) -> None:
        """Until every process lost in the last ``within_s`` (default ``RETURN_WAIT_S``) has
        reconnected, or ``within_s`` has passed since its loss: ``within_s`` at most."""
        within_s = RETURN_WAIT_S if within_s is None else within_s
        while True:
            now = time.monotonic()
            left = [lost.lost_at + within_s - now for lost in self.recently_lost() if now - lost.lost_at < within_s]
            if not left:
                return
            self._returned.clear()
            try:
                await asyncio.wait_for(self._returned.wait(), max(left))
            except asyncio.TimeoutError:
                return

    def all(self) -> list[ProbeConnection]:
        """Connected processes in listing order (``ProcessIdentity.sort_key``: window processes,
        then unranked step-driven ones, then by rank), the connection order breaking ties."""
        return sorted(self._probes.values(), key=lambda c: (c.identity.sort_key, c.id))

    def roles(self) -> list[str]:
        """The roles of the connected processes, each once, in listing order."""
        return list(dict.fromkeys(c.identity.role for c in self.all()))

    def __len__(self) -> int:
        return len(self._probes)
